/* session.c - sessions: admission by credentials, and everything a session owns returned
 * when it ends, for any reason. */
#include "daemon.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fault.h"
#include "log.h"

uint64_t kvp_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static bool in_list(uint32_t v, const uint32_t *list, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		if (list[i] == v)
			return true;
	return false;
}

static bool any_group(const uint32_t *list, uint32_t n, gid_t gid, const gid_t *groups, int ng)
{
	if (in_list(gid, list, n))
		return true;
	for (int i = 0; i < ng; i++)
		if (in_list(groups[i], list, n))
			return true;
	return false;
}

int kvp_daemon_admit(struct kvp_daemon *d, pid_t pid, uid_t uid, gid_t gid, const gid_t *groups,
		     int ngroups, bool *admin, struct kvp_fail *f)
{
	const struct kvp_conf *c = &d->conf;
	bool restricted = c->n_allowed_uids || c->n_allowed_gids || d->n_flag_uids || d->n_flag_gids;
	bool ok = !restricted || uid == 0 ||
		  in_list(uid, c->allowed_uids, c->n_allowed_uids) ||
		  in_list(uid, d->flag_uids, d->n_flag_uids) ||
		  any_group(c->allowed_gids, c->n_allowed_gids, gid, groups, ngroups) ||
		  any_group(d->flag_gids, d->n_flag_gids, gid, groups, ngroups);

	if (!ok)
		return kvp_fail(f, KVPOOL__CODE__PERMISSION_DENIED,
				"uid %u (pid %d) is not allowed to use this kvpoold", (unsigned)uid,
				(int)pid);
	*admin = uid == 0 || uid == d->self_uid ||
		 any_group(c->admin_gids, c->n_admin_gids, gid, groups, ngroups);
	return 0;
}

struct kvp_session *kvp_session_new(struct kvp_daemon *d, pid_t pid, uid_t uid, gid_t gid,
				    bool admin, struct kvp_fail *f)
{
	struct kvp_session *s;

	if (d->n_sessions >= d->conf.max_sessions) {
		kvp_fail_limit(f, "sessions", d->conf.max_sessions);
		return NULL;
	}
	s = KVP_FAULT_OR(KVP_FAULT_SESSION, calloc(1, sizeof(*s)));
	if (!s) {
		kvp_fail(f, KVPOOL__CODE__INTERNAL, "out of memory");
		return NULL;
	}
	s->id = ++d->next_session_id;
	s->pid = pid;
	s->uid = uid;
	s->gid = gid;
	s->admin = admin;
	s->started_ms = s->last_ms = kvp_now_ms();
	kvp_idmap_init(&s->leases);
	kvp_idmap_init(&s->locks);
	s->next = d->sessions;
	if (d->sessions)
		d->sessions->prev = s;
	d->sessions = s;
	d->n_sessions++;
	return s;
}

/* Frees leases and locks of pool p (all pools when p is NULL). Returns tokens freed. */
static uint64_t release_owned(struct kvp_session *s, struct kvp_pool *p)
{
	uint64_t tokens = 0, id;
	void *v;

	for (uint32_t i = 0; (i = kvp_idmap_next(&s->leases, i, &id, &v)) != 0;) {
		struct kvp_lease *l = v;

		if (p && l->pool != p)
			continue;
		tokens += (uint64_t)l->n * l->pool->conf.page_tokens;
		s->leased_pages[l->pool->id] -= l->n;
		kvp_idmap_del(&s->leases, id);
		kvp_lease_destroy(l);
	}
	for (uint32_t i = 0; (i = kvp_idmap_next(&s->locks, i, &id, &v)) != 0;) {
		struct kvp_lock *k = v;

		if (p && k->pool != p)
			continue;
		kvp_prefix_unlock(k->pool->pfx, k->node);
		s->locked_tokens -= (uint64_t)k->pages * k->pool->conf.page_tokens;
		kvp_idmap_del(&s->locks, id);
		free(k);
	}
	return tokens;
}

uint64_t kvp_session_detach(struct kvp_daemon *d, struct kvp_session *s, struct kvp_pool *p)
{
	uint64_t t = release_owned(s, p);

	(void)d;
	if (s->attached[p->id]) {
		s->attached[p->id] = false;
		p->sessions--;
	}
	return t;
}

void kvp_session_destroy(struct kvp_daemon *d, struct kvp_session *s)
{
	if (!s)
		return;
	release_owned(s, NULL);
	for (uint32_t i = 0; i < d->n_pools; i++)
		if (s->attached[i])
			d->pools[i]->sessions--;
	kvp_idmap_release(&s->leases);
	kvp_idmap_release(&s->locks);
	if (s->prev)
		s->prev->next = s->next;
	else
		d->sessions = s->next;
	if (s->next)
		s->next->prev = s->prev;
	d->n_sessions--;
	if (s->hello)
		d->st.sessions_closed++;
	free(s);
	/* Under injected failures, every session's end proves the books still balance. */
	if (kvp_fault_armed() && kvp_daemon_check(d) < 0) {
		log_err("failure injection: pool books do not balance after a session ended");
		abort();
	}
}

int kvp_daemon_check(const struct kvp_daemon *d)
{
	uint64_t held[KVP_MAX_POOLS][KVP_TIER_MAX] = { { 0 } };

	/* Every page a live session's lease lists is booked to that lease, and the session's
	 * quota counts them; with the per-tier totals equal, no leased page is anyone else's. */
	for (const struct kvp_session *s = d->sessions; s; s = s->next) {
		uint64_t mine[KVP_MAX_POOLS] = { 0 }, id;
		void *v;

		for (uint32_t i = 0; (i = kvp_idmap_next(&s->leases, i, &id, &v)) != 0;) {
			const struct kvp_lease *l = v;

			if (l->id != id || kvp_lease_check(l) < 0)
				return -EFAULT;
			mine[l->pool->id] += l->n;
			held[l->pool->id][l->tier] += l->n;
		}
		for (uint32_t p = 0; p < d->n_pools; p++)
			if (mine[p] != s->leased_pages[p])
				return -EFAULT;
	}
	for (uint32_t i = 0; i < d->n_pools; i++) {
		if (kvp_pool_check(d->pools[i]) < 0)
			return -EFAULT;
		for (int t = 0; t < KVP_TIER_MAX; t++) {
			struct kvp_tier_counts c;

			if (!kvp_pool_has_tier(d->pools[i], t)) {
				if (held[i][t])
					return -EFAULT;
				continue;
			}
			kvp_pool_counts(d->pools[i], t, &c);
			if (c.leased != held[i][t])
				return -EFAULT;
		}
	}
	return 0;
}
