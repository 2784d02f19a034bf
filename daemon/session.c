/* session.c - sessions: admission by credentials, and everything a session owns returned
 * when it ends, for any reason. */
#include "daemon.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fault.h"
#include "log.h"
#include "pool_cache.h"

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

void kvp_session_attach(struct kvp_session *s, struct kvp_pool *p)
{
	if (!s->attached[p->id]) {
		s->attached[p->id] = true;
		p->sessions++;
	}
}

struct kvp_pool *kvp_session_pool(const struct kvp_daemon *d, const struct kvp_session *s,
				  uint32_t pool_id, struct kvp_fail *f)
{
	if (pool_id >= d->n_pools) {
		kvp_fail(f, KVPOOL__CODE__NO_SUCH_POOL, "pool_id %u does not exist", pool_id);
		return NULL;
	}
	if (!s->attached[pool_id]) {
		kvp_fail(f, KVPOOL__CODE__NOT_FOUND, "pool_id %u is not attached by this session",
			 pool_id);
		return NULL;
	}
	return d->pools[pool_id];
}

int kvp_session_may_lease(const struct kvp_daemon *d, const struct kvp_session *s,
			  const struct kvp_pool *p, uint32_t npages, bool new_lease,
			  struct kvp_fail *f)
{
	uint64_t pt = p->conf.page_tokens, q = p->conf.session_quota_tokens;
	uint64_t held = s->leased_pages[p->id] * pt, want = (uint64_t)npages * pt;

	if (new_lease && s->leases.count >= d->conf.max_leases_per_session)
		return kvp_fail_limit(f, "leases", d->conf.max_leases_per_session);
	if (!q || held + want <= q)
		return 0;
	f->detail = KVP_FAIL_QUOTA;
	f->quota.quota = q;
	f->quota.held = held;
	f->quota.requested = want;
	return kvp_fail(f, KVPOOL__CODE__QUOTA_EXCEEDED,
			"pool %s: session quota is %lu tokens; this session holds %lu and asked "
			"for %lu more",
			p->conf.name, (unsigned long)q, (unsigned long)held, (unsigned long)want);
}

int kvp_session_lease_add(struct kvp_session *s, struct kvp_lease *l)
{
	if (kvp_idmap_put(&s->leases, l->id, l) < 0)
		return -ENOMEM;
	s->leased_pages[l->pool->id] += l->n;
	return 0;
}

struct kvp_lease *kvp_session_lease(const struct kvp_session *s, uint64_t id, struct kvp_fail *f)
{
	struct kvp_lease *l = kvp_idmap_get(&s->leases, id);

	if (!l)
		kvp_fail(f, KVPOOL__CODE__NOT_FOUND, "lease %lu is not one of this session's",
			 (unsigned long)id);
	return l;
}

void kvp_session_lease_resized(struct kvp_session *s, const struct kvp_lease *l, uint32_t before)
{
	s->leased_pages[l->pool->id] += l->n;
	s->leased_pages[l->pool->id] -= before;
}

uint32_t kvp_session_lease_end(struct kvp_session *s, struct kvp_lease *l)
{
	uint32_t n = l->n;

	s->leased_pages[l->pool->id] -= n;
	kvp_idmap_del(&s->leases, l->id);
	kvp_lease_destroy(l);
	return n;
}

int kvp_session_may_lock(const struct kvp_daemon *d, const struct kvp_session *s,
			 struct kvp_fail *f)
{
	if (s->locks.count >= d->conf.max_locks_per_session)
		return kvp_fail_limit(f, "locks", d->conf.max_locks_per_session);
	return 0;
}

struct kvp_lock *kvp_session_lock_alloc(void)
{
	return KVP_FAULT_OR(KVP_FAULT_LOCK, calloc(1, sizeof(struct kvp_lock)));
}

int kvp_session_lock_add(struct kvp_daemon *d, struct kvp_session *s, struct kvp_lock *k)
{
	k->id = ++d->next_lock_id;
	if (kvp_idmap_put(&s->locks, k->id, k) < 0) {
		kvp_pool_unlock(k->pool, k->node);
		kvp_pool_keys_unlock(k->pool, k->keys);
		free(k);
		return -ENOMEM;
	}
	s->locked_tokens += (uint64_t)k->pages * k->pool->conf.page_tokens;
	return 0;
}

struct kvp_lock *kvp_session_lock(const struct kvp_session *s, uint64_t id, struct kvp_fail *f)
{
	struct kvp_lock *k = kvp_idmap_get(&s->locks, id);

	if (!k)
		kvp_fail(f, KVPOOL__CODE__NOT_FOUND, "lock %lu is not one of this session's",
			 (unsigned long)id);
	return k;
}

void kvp_session_lock_release(struct kvp_session *s, struct kvp_lock *k)
{
	kvp_pool_unlock(k->pool, k->node);
	kvp_pool_keys_unlock(k->pool, k->keys);
	s->locked_tokens -= (uint64_t)k->pages * k->pool->conf.page_tokens;
	kvp_idmap_del(&s->locks, k->id);
	free(k);
}

uint64_t kvp_session_leased_tokens(const struct kvp_daemon *d, const struct kvp_session *s)
{
	uint64_t leased = 0;

	for (uint32_t p = 0; p < d->n_pools; p++)
		leased += s->leased_pages[p] * d->pools[p]->conf.page_tokens;
	return leased;
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
		kvp_session_lease_end(s, l);
	}
	for (uint32_t i = 0; (i = kvp_idmap_next(&s->locks, i, &id, &v)) != 0;) {
		struct kvp_lock *k = v;

		if (p && k->pool != p)
			continue;
		kvp_session_lock_release(s, k);
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
