/* rpc_admin.c - status and listings (Status, Sessions, Cache, Metrics) and the admin calls
 * (Evict, Flush, Drain, Reload). The stats replies are generated from stats.h's tables. */
#include "rpc.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "budget.h"
#include "disk_tier.h"
#include "kvp_config.h"
#include "log.h"
#include "metrics.h"
#include "names.h"
#include "pool_cache.h"

static Kvpool__TierStats *tier_stats(struct kvp_reply *r, const struct kvpd_pool *p, int t)
{
	Kvpool__TierStats *m = KVP_REPLY_NEW(r, Kvpool__TierStats, kvpool__tier_stats__descriptor);
	struct kvp_tier_figures fig;

	if (!m)
		return NULL;
	kvp_pool_tier_figures(p, t, &fig);
	m->tier = (Kvpool__Tier)t;
	m->backend = (Kvpool__Backend)p->mem[t].backend;
#define TIER_FIELD(f, n, type, h) m->f = fig.f;
	KVP_TIER_FIGURES(TIER_FIELD)
#undef TIER_FIELD
	m->numa_node = p->mem[t].numa_node;
	return m;
}

/* Counter entries generated from an X-macro list: names are the struct fields. */
static Kvpool__Counter **counters(struct kvp_reply *r, const char *const *names,
				  const uint64_t *values, size_t n)
{
	Kvpool__Counter **v = kvp_reply_alloc(r, sizeof(*v) * n);

	for (size_t i = 0; v && i < n; i++) {
		v[i] = KVP_REPLY_NEW(r, Kvpool__Counter, kvpool__counter__descriptor);
		if (!v[i])
			return NULL;
		v[i]->name = (char *)names[i];
		v[i]->value = values[i];
	}
	return v;
}

#define COUNTER_NAME(f, n, h) #f,
#define COUNTER_VALUE(f, n, h) st->f,
static const char *const pool_counter_names[] = { KVP_POOL_COUNTERS(COUNTER_NAME) };
static const char *const daemon_counter_names[] = { KVP_DAEMON_COUNTERS(COUNTER_NAME) };
#define N_POOL_COUNTERS (sizeof(pool_counter_names) / sizeof(pool_counter_names[0]))
#define N_DAEMON_COUNTERS (sizeof(daemon_counter_names) / sizeof(daemon_counter_names[0]))
#define REMOTE_NAME(f, n, t, h) "remote_" #f,
#define REMOTE_VALUE(f, n, t, h) d->remote_st.f,
static const char *const remote_counter_names[] = { KVP_REMOTE_STATS(REMOTE_NAME) };
#define N_REMOTE_COUNTERS (sizeof(remote_counter_names) / sizeof(remote_counter_names[0]))
#define DISK_NAME(f, n, t, h) "disk_" #f,
#define DISK_VALUE(f, n, t, h) ds.f,
static const char *const disk_counter_names[] = { KVP_DISK_STATS(DISK_NAME) };
#define N_DISK_COUNTERS (sizeof(disk_counter_names) / sizeof(disk_counter_names[0]))

/* kvp_budget_room reads /proc and /sys files, and engines may ask for Status every few ms: a
 * pool's room is read again at most this often. */
#define ROOM_MAX_AGE_MS 100

/* The pool's counters, then, for a pool with a host tier, what the node still gives that
 * tier (kvp_budget_room, at most ROOM_MAX_AGE_MS old): host_room_bytes (UINT64_MAX: no limit
 * binds) and host_room_limit (the Limit that binds, LIMIT_NONE when none does). Engines name
 * the binding limit with them when a host pool does not fit the tier. A reader that fails
 * leaves the two rows out. *n: how many. */
static Kvpool__Counter **pool_counters(struct kvp_reply *r, struct kvpd_pool *p, size_t *n)
{
	static const char *const names[N_POOL_COUNTERS + 2] = {
		KVP_POOL_COUNTERS(COUNTER_NAME) "host_room_bytes", "host_room_limit"
	};
	const struct kvp_pool_stats *st = &p->st;
	uint64_t values[N_POOL_COUNTERS + 2] = { KVP_POOL_COUNTERS(COUNTER_VALUE) };
	uint64_t now = kvp_now_ms();

	*n = N_POOL_COUNTERS;
	if (!kvp_pool_has_tier(p, KVP_TIER_ID_HOST))
		return counters(r, names, values, *n);
	if (!p->room_ms || now - p->room_ms >= ROOM_MAX_AGE_MS) {
		struct kvp_budget_room room = { 0 };

		p->room_rc = kvp_budget_room(&p->conf, kvp_budget_env_system(), &room);
		p->room_bytes = room.bytes;
		p->room_limit = (uint64_t)room.limit;
		p->room_ms = now;
	}
	if (p->room_rc == 0) {
		values[N_POOL_COUNTERS] = p->room_bytes;
		values[N_POOL_COUNTERS + 1] = p->room_limit;
		*n += 2;
	}
	return counters(r, names, values, *n);
}

/* The daemon's counters, then the remote tier's when [remote] is configured, then the disk
 * tier's (all pools' together) when a pool has one; *n: how many. */
static Kvpool__Counter **daemon_counters(struct kvp_reply *r, const struct kvp_daemon *d, size_t *n)
{
	const struct kvp_daemon_stats *st = &d->st;
	struct kvp_disk_stats ds = { 0 };
	const char *names[N_DAEMON_COUNTERS + N_REMOTE_COUNTERS + N_DISK_COUNTERS];
	uint64_t values[N_DAEMON_COUNTERS + N_REMOTE_COUNTERS + N_DISK_COUNTERS] = {
		KVP_DAEMON_COUNTERS(COUNTER_VALUE) KVP_REMOTE_STATS(REMOTE_VALUE)
	};
	memcpy(names, daemon_counter_names, sizeof(daemon_counter_names));
	memcpy(names + N_DAEMON_COUNTERS, remote_counter_names, sizeof(remote_counter_names));
	*n = N_DAEMON_COUNTERS + (d->conf.remote.enabled ? N_REMOTE_COUNTERS : 0);
	if (d->dt) {
		kvp_dt_stats(d->dt, NULL, &ds);
		const uint64_t dv[] = { KVP_DISK_STATS(DISK_VALUE) };

		memcpy(values + *n, dv, sizeof(dv));
		memcpy(names + *n, disk_counter_names, sizeof(disk_counter_names));
		*n += N_DISK_COUNTERS;
	}
	return counters(r, names, values, *n);
}

static Kvpool__PoolStats *pool_stats(struct kvp_reply *r, struct kvpd_pool *p)
{
	Kvpool__PoolStats *m = KVP_REPLY_NEW(r, Kvpool__PoolStats, kvpool__pool_stats__descriptor);
	struct kvp_pool_figures fig;
	struct kvp_geom g;

	if (!m)
		return NULL;
	kvp_pool_figures(p, &fig);
	kvp_rpc_pool_geom(p, &g);
	m->name = (char *)p->conf.name;
	m->pool_id = p->id;
	m->geometry = kvp_reply_geometry(r, &g);
	m->tiers = kvp_reply_alloc(r, sizeof(*m->tiers) * KVP_TIER_ID_MAX);
	if (!m->geometry || !m->tiers)
		return NULL;
	for (int t = 0; t < KVP_TIER_ID_MAX; t++) {
		if (!kvp_pool_has_tier(p, t))
			continue;
		m->tiers[m->n_tiers] = tier_stats(r, p, t);
		if (!m->tiers[m->n_tiers])
			return NULL;
		m->n_tiers++;
	}
#define POOL_FIELD(f, n, type, h) m->f = fig.f;
	KVP_POOL_FIGURES(POOL_FIELD)
#undef POOL_FIELD
	m->allocs = p->st.allocs;
	m->frees = p->st.frees;
	m->alloc_failures = p->st.alloc_failures;
	m->eviction = (char *)kvp_eviction_name(p->conf.eviction);
	m->counters = pool_counters(r, p, &m->n_counters);
	if (!m->counters)
		return NULL;
	return m;
}

KVP_RPC_HANDLER(kvp_rpc_status)
{
	Kvpool__StatusResp *m =
		KVP_REPLY_NEW(r, Kvpool__StatusResp, kvpool__status_resp__descriptor);
	struct kvp_daemon_figures fig;

	(void)s;
	(void)q;
	if (!m)
		return kvp_rpc_oom(f);
	kvp_daemon_figures(d, &fig);
	m->daemon_version = (char *)KVP_VERSION;
#define DAEMON_FIELD(fl, n, type, h, scale) m->fl = fig.fl;
	KVP_DAEMON_FIGURES(DAEMON_FIELD)
#undef DAEMON_FIELD
	m->draining = d->draining;
	m->pid = (int32_t)getpid();
	m->pools = kvp_reply_alloc(r, sizeof(*m->pools) * (d->n_pools + 1));
	if (!m->pools)
		return kvp_rpc_oom(f);
	for (uint32_t i = 0; i < d->n_pools; i++) {
		m->pools[i] = pool_stats(r, d->pools[i]);
		if (!m->pools[i])
			return kvp_rpc_oom(f);
	}
	m->n_pools = d->n_pools;
	m->counters = daemon_counters(r, d, &m->n_counters);
	if (!m->counters)
		return kvp_rpc_oom(f);
	r->resp.result_case = KVPOOL__RESPONSE__RESULT_STATUS_INFO;
	r->resp.status_info = m;
	return 0;
}

static int need_admin(const struct kvp_session *s, const char *what, struct kvp_fail *f)
{
	if (s->admin)
		return 0;
	return kvp_fail(f, KVP_ERR_PERMISSION_DENIED,
			"%s is an admin call: root or a member of admin_groups only", what);
}

KVP_RPC_HANDLER(kvp_rpc_evict)
{
	const Kvpool__EvictReq *a = q->evict;
	struct kvpd_pool *p;
	Kvpool__EvictResp *m;
	uint32_t pages;
	int rc;

	if ((rc = need_admin(s, "Evict", f)) < 0)
		return rc;
	p = a->pool && a->pool[0] ? kvp_rpc_pool_by_name(d, a->pool)
				  : (a->pool_id < d->n_pools ? d->pools[a->pool_id] : NULL);
	if (!p)
		return kvp_rpc_no_such_pool(d, a->pool ? a->pool : "", f);
	if ((int)a->tier < 0 || (int)a->tier >= KVP_TIER_ID_MAX ||
	    !kvp_pool_has_tier(p, (int)a->tier))
		return kvp_fail(f, KVP_ERR_INVALID_ARGUMENT, "pool %s has no tier %d", p->conf.name,
				(int)a->tier);
	if (!a->tokens)
		return kvp_fail(f, KVP_ERR_INVALID_ARGUMENT, "evict: zero tokens");
	pages = kvp_pool_pages_of(p, a->tokens);
	m = KVP_REPLY_NEW(r, Kvpool__EvictResp, kvpool__evict_resp__descriptor);
	if (!m)
		return kvp_rpc_oom(f);
	m->evicted_tokens = (uint64_t)kvp_pool_evict(p, (int)a->tier, pages) * p->conf.page_tokens;
	log_info("pool %s: admin evict of %lu tokens from the %s tier by session %lu: %lu evicted",
		 p->conf.name, (unsigned long)a->tokens, kvp_names_tier((int)a->tier),
		 (unsigned long)s->id, (unsigned long)m->evicted_tokens);
	r->resp.result_case = KVPOOL__RESPONSE__RESULT_EVICT;
	r->resp.evict = m;
	return 0;
}

KVP_RPC_HANDLER(kvp_rpc_flush)
{
	struct kvpd_pool *p;
	Kvpool__FlushResp *m;
	int rc;

	if ((rc = need_admin(s, "Flush", f)) < 0)
		return rc;
	p = kvp_rpc_pool_by_name(d, q->flush->pool ? q->flush->pool : "");
	if (!p)
		return kvp_rpc_no_such_pool(d, q->flush->pool ? q->flush->pool : "", f);
	m = KVP_REPLY_NEW(r, Kvpool__FlushResp, kvpool__flush_resp__descriptor);
	if (!m)
		return kvp_rpc_oom(f);
	m->evicted_tokens = (uint64_t)kvp_pool_flush(p) * p->conf.page_tokens;
	log_info("pool %s: flushed by session %lu: %lu tokens evicted", p->conf.name,
		 (unsigned long)s->id, (unsigned long)m->evicted_tokens);
	r->resp.result_case = KVPOOL__RESPONSE__RESULT_FLUSH;
	r->resp.flush = m;
	return 0;
}

KVP_RPC_HANDLER(kvp_rpc_drain)
{
	Kvpool__DrainResp *m;
	int rc;

	if ((rc = need_admin(s, "Drain", f)) < 0)
		return rc;
	if (d->stopping)
		return kvp_fail(f, KVP_ERR_SHUTTING_DOWN, "kvpoold is stopping");
	m = KVP_REPLY_NEW(r, Kvpool__DrainResp, kvpool__drain_resp__descriptor);
	if (!m)
		return kvp_rpc_oom(f);
	if (q->drain->cancel) {
		m->was_draining = d->draining;
		m->sessions = d->n_sessions;
		if (d->draining)
			log_notice("drain cancelled by session %lu (uid %u): serving as before",
				   (unsigned long)s->id, (unsigned)s->uid);
		d->draining = false;
		r->resp.result_case = KVPOOL__RESPONSE__RESULT_DRAIN;
		r->resp.drain = m;
		return 0;
	}
	d->draining = true;
	d->drain_deadline_ms = kvp_now_ms() + q->drain->deadline_ms;
	m->sessions = d->n_sessions;
	log_notice("draining: no new leases or non-admin connections; exiting when sessions end "
		   "or in %u ms",
		   q->drain->deadline_ms);
	r->resp.result_case = KVPOOL__RESPONSE__RESULT_DRAIN;
	r->resp.drain = m;
	return 0;
}

/* Answered when a reload that starts after this call is applied or refused (reload.c answers
 * the waiting tickets); with one running, this one waits for the next. */
KVP_RPC_HANDLER(kvp_rpc_reload)
{
	struct kvp_defer *t;
	int rc;

	(void)r;
	if ((rc = need_admin(s, "Reload", f)) < 0)
		return rc;
	t = kvp_defer_take(&d->defers, s->id, s->uid, q->id, (int)q->call_case, f);
	if (!t)
		return -(int)f->code;
	t->next = d->defers.reload_waiting;
	d->defers.reload_waiting = t;
	d->reload_requested = true;
	return KVP_DEFERRED;
}

KVP_RPC_HANDLER(kvp_rpc_sessions)
{
	Kvpool__SessionsResp *m =
		KVP_REPLY_NEW(r, Kvpool__SessionsResp, kvpool__sessions_resp__descriptor);
	uint64_t now = kvp_now_ms();
	size_t i = 0;

	(void)q;
	if (!m || !(m->sessions = kvp_reply_alloc(r, sizeof(*m->sessions) * (d->n_sessions + 1))))
		return kvp_rpc_oom(f);
	for (struct kvp_session *x = d->sessions; x; x = x->next) {
		Kvpool__SessionInfo *e;

		/* Others' pids, names and holdings are for admins; a user sees their own. */
		if (!s->admin && x->uid != s->uid)
			continue;
		e = KVP_REPLY_NEW(r, Kvpool__SessionInfo, kvpool__session_info__descriptor);
		if (!e)
			return kvp_rpc_oom(f);
		e->session_id = x->id;
		e->pid = x->pid;
		e->uid = x->uid;
		e->gid = x->gid;
		e->name = x->name;
		e->leased_tokens = kvp_session_leased_tokens(d, x);
		e->locked_tokens = x->locked_tokens;
		e->leases = x->leases.count;
		e->locks = x->locks.count;
		e->age_ms = now - x->started_ms;
		e->idle_ms = now - x->last_ms;
		m->sessions[i++] = e;
	}
	m->n_sessions = i;
	r->resp.result_case = KVPOOL__RESPONSE__RESULT_SESSIONS;
	r->resp.sessions = m;
	return 0;
}

KVP_RPC_HANDLER(kvp_rpc_cache)
{
	const char *name = q->cache->pool ? q->cache->pool : "";
	Kvpool__CacheResp *m = KVP_REPLY_NEW(r, Kvpool__CacheResp, kvpool__cache_resp__descriptor);
	struct kvp_pool_top top[16];
	uint32_t ntop;

	if (!m || !(m->pools = kvp_reply_alloc(r, sizeof(*m->pools) * (d->n_pools + 1))))
		return kvp_rpc_oom(f);
	for (uint32_t i = 0; i < d->n_pools; i++) {
		if (name[0] && strcmp(name, d->pools[i]->conf.name))
			continue;
		if (!(m->pools[m->n_pools++] = pool_stats(r, d->pools[i])))
			return kvp_rpc_oom(f);
	}
	if (name[0] && !m->n_pools)
		return kvp_rpc_no_such_pool(d, name, f);
	/* The top pages say what others cache (namespaces, lengths, hits): admins only;
	 * everyone gets the aggregate figures. */
	if (m->n_pools && s->admin) {
		struct kvpd_pool *p = d->pools[m->pools[0]->pool_id];

		ntop = kvp_pool_top(p, top, 16);
		if (!(m->top = kvp_reply_alloc(r, sizeof(*m->top) * (ntop + 1))))
			return kvp_rpc_oom(f);
		for (uint32_t i = 0; i < ntop; i++) {
			Kvpool__TopPrefix *t =
				KVP_REPLY_NEW(r, Kvpool__TopPrefix, kvpool__top_prefix__descriptor);

			if (!t)
				return kvp_rpc_oom(f);
			t->tokens = top[i].tokens;
			t->hits = top[i].hits;
			t->namespace_ = top[i].ns;
			t->keyed = top[i].keyed;
			m->top[m->n_top++] = t;
		}
	}
	r->resp.result_case = KVPOOL__RESPONSE__RESULT_CACHE;
	r->resp.cache = m;
	return 0;
}

KVP_RPC_HANDLER(kvp_rpc_metrics)
{
	Kvpool__MetricsResp *m =
		KVP_REPLY_NEW(r, Kvpool__MetricsResp, kvpool__metrics_resp__descriptor);
	char *text;

	bool show[KVP_MAX_POOLS];

	(void)q;
	if (!m)
		return kvp_rpc_oom(f);
	/* a non-admin sees the series of the pools it may attach */
	for (uint32_t i = 0; i < d->n_pools && i < KVP_MAX_POOLS; i++) {
		struct kvp_fail no;

		show[i] = s->admin || kvp_session_may_attach(d, s, d->pools[i], &no) == 0;
	}
	text = kvp_metrics_render_pools(d, show);
	if (!text)
		return kvp_rpc_oom(f);
	if (kvp_reply_adopt(r, text) < 0)
		return kvp_rpc_oom(f);
	m->text = text;
	r->resp.result_case = KVPOOL__RESPONSE__RESULT_METRICS;
	r->resp.metrics = m;
	return 0;
}
