/* pressure.c - pressure notices (pressure.h): tier states against their watermarks, the
 * notices each subscribed session is owed, and the PressureNotice Responses built for it. */
#include "pressure.h"

#include <errno.h>
#include <string.h>

#include "daemon.h"
#include "kvpool_caps.h"
#include "reply.h"

uint64_t kvp_pressure_watermark(const struct kvpd_pool *p, int tier)
{
	const struct kvp_pool_conf *c = &p->conf;
	uint64_t total, wm = 0;

	if (!kvp_pool_has_tier(p, tier))
		return 0;
	total = kvp_pages_total(p->pages[tier]);
	if (c->pressure_watermark_tokens)
		wm = (c->pressure_watermark_tokens + c->page_tokens - 1) / c->page_tokens;
	else if (c->pressure_watermark_pct > 0)
		wm = (uint64_t)((double)total * c->pressure_watermark_pct / 100.0 + 0.999999);
	return wm < total ? wm : total;
}

bool kvp_pressure_attach(struct kvp_daemon *d, struct kvp_session *s, struct kvpd_pool *p,
			 bool want)
{
	struct kvpd_pressure_sub *u = &s->pressure;

	if (!want || !(s->caps & KVP_CAP_EVENTS))
		return u->on[p->id];
	if (!u->on[p->id]) {
		u->on[p->id] = true;
		u->told[p->id] = 0; /* told nothing: a tier under pressure now is owed a notice */
		memset(u->coalesced[p->id], 0, sizeof(u->coalesced[p->id]));
		u->last_ms[p->id] = 0;
		d->pressure.walk = true;
	}
	return true;
}

void kvp_pressure_detach(struct kvp_session *s, const struct kvpd_pool *p)
{
	s->pressure.on[p->id] = false;
	s->pressure.told[p->id] = 0;
}

/* Tier t of pool i changed state: every subscriber still owed the old state (not yet told it)
 * has that notice replaced by the new one. */
static void coalesce(struct kvp_daemon *d, uint32_t i, int t, uint8_t old_bits)
{
	for (struct kvp_session *s = d->sessions; s; s = s->next) {
		struct kvpd_pressure_sub *u = &s->pressure;

		if (!u->on[i] || !((u->told[i] ^ old_bits) & (1u << t)))
			continue;
		u->coalesced[i][t]++;
		d->pools[i]->st.pressure_coalesced++;
	}
}

bool kvp_pressure_scan(struct kvp_daemon *d, bool tick)
{
	struct kvpd_pressure *ps = &d->pressure;

	if (tick)
		memset(ps->short_, 0, sizeof(ps->short_));
	for (uint32_t i = 0; i < d->n_pools; i++) {
		struct kvpd_pool *p = d->pools[i];
		uint8_t bits = ps->short_[i];

		for (int t = 0; t < KVP_TIER_ID_MAX; t++) {
			uint64_t wm = kvp_pressure_watermark(p, t);

			if (wm && kvp_pages_count(p->pages[t], KVP_PAGE_FREE) < wm)
				bits |= (uint8_t)(1u << t);
		}
		if (bits == ps->under[i])
			continue;
		for (int t = 0; t < KVP_TIER_ID_MAX; t++) {
			if (!((bits ^ ps->under[i]) & (1u << t)))
				continue;
			coalesce(d, i, t, ps->under[i]);
			ps->seq[i][t]++;
			p->st.pressure_changes++;
		}
		ps->under[i] = bits;
		ps->walk = true;
	}
	return ps->walk || (tick && ps->pending);
}

bool kvp_pressure_short(struct kvp_daemon *d, const struct kvpd_pool *p, int tier,
			const struct kvp_pool_events *ev)
{
	struct kvpd_pressure *ps = &d->pressure;
	uint8_t bit = (uint8_t)(1u << tier);

	if (p->id >= KVP_MAX_POOLS || d->pools[p->id] != p || !kvp_pressure_watermark(p, tier))
		return false;
	ps->short_[p->id] |= bit;
	if (ps->under[p->id] & bit)
		return false;
	ps->figures[p->id] |= bit;
	ps->before[p->id][tier] = ev->before[tier];
	ps->before_reserved[p->id][tier] = ev->before_reserved[tier];
	return true;
}

void kvp_pressure_figures_done(struct kvp_daemon *d)
{
	memset(d->pressure.figures, 0, sizeof(d->pressure.figures));
}

bool kvp_pressure_owed(const struct kvp_daemon *d, const struct kvp_session *s)
{
	for (uint32_t i = 0; i < d->n_pools; i++)
		if (s->pressure.on[i] && (s->pressure.told[i] ^ d->pressure.under[i]))
			return true;
	return false;
}

static int build(struct kvp_daemon *d, struct kvp_session *s, uint32_t i, int t,
		 struct kvp_reply *r)
{
	struct kvpd_pool *p = d->pools[i];
	uint64_t pt = p->conf.page_tokens;
	Kvpool__PressureNotice *m =
		KVP_REPLY_NEW(r, Kvpool__PressureNotice, kvpool__pressure_notice__descriptor);
	struct kvp_tier_counts c;
	bool before = d->pressure.figures[i] & (1u << t);

	if (!m)
		return -ENOMEM;
	if (before)
		c = d->pressure.before[i][t];
	else
		kvp_pool_counts(p, t, &c);
	m->pool_id = p->id;
	m->pool = p->conf.name;
	m->tier = (Kvpool__Tier)t;
	m->free_tokens = c.free * pt;
	m->evictable_tokens = c.evictable * pt;
	/* booked to sessions' page reserves */
	m->reserved_tokens = (before ? d->pressure.before_reserved[i][t] : p->reserved[t]) * pt;
	m->watermark_tokens = kvp_pressure_watermark(p, t) * pt;
	m->recovered = !(d->pressure.under[i] & (1u << t));
	m->total_tokens = c.total * pt;
	m->coalesced = s->pressure.coalesced[i][t];
	m->seq = d->pressure.seq[i][t];
	r->resp.id = 0;
	r->resp.result_case = KVPOOL__RESPONSE__RESULT_PRESSURE;
	r->resp.pressure = m;
	return 1;
}

int kvp_pressure_next(struct kvp_daemon *d, struct kvp_session *s, uint64_t now,
		      struct kvp_reply *r)
{
	struct kvpd_pressure_sub *u = &s->pressure;

	for (uint32_t i = 0; i < d->n_pools; i++) {
		uint8_t owed = u->on[i] ? (uint8_t)(u->told[i] ^ d->pressure.under[i]) : 0;
		uint32_t gap = d->pools[i]->conf.pressure_interval_ms;

		if (!owed || (u->last_ms[i] && now - u->last_ms[i] < gap))
			continue;
		for (int t = 0; t < KVP_TIER_ID_MAX; t++) {
			int rc;

			if (!(owed & (1u << t)))
				continue;
			rc = build(d, s, i, t, r);
			if (rc < 0)
				return rc;
			u->told[i] ^= (uint8_t)(1u << t);
			u->coalesced[i][t] = 0;
			u->last_ms[i] = now ? now : 1;
			d->pools[i]->st.pressure_notices++;
			return 1;
		}
	}
	return 0;
}

void kvp_pressure_walked(struct kvp_daemon *d, bool pending)
{
	d->pressure.walk = false;
	d->pressure.pending = pending;
}
