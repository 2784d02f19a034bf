/* session.c - sessions: admission by credentials, and everything a session owns returned
 * when it ends, for any reason. */
#include "session.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "fault.h"
#include "log.h"
#include "pool_cache.h"
#include "reserve.h"

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
	bool restricted =
		c->n_allowed_uids || c->n_allowed_gids || d->n_flag_uids || d->n_flag_gids;
	bool ok = !restricted || uid == 0 || in_list(uid, c->allowed_uids, c->n_allowed_uids) ||
		  in_list(uid, d->flag_uids, d->n_flag_uids) ||
		  any_group(c->allowed_gids, c->n_allowed_gids, gid, groups, ngroups) ||
		  any_group(d->flag_gids, d->n_flag_gids, gid, groups, ngroups);

	if (!ok)
		return kvp_fail(f, KVP_ERR_PERMISSION_DENIED,
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

	/* Connections are sessions from accept; Hello is where max_sessions applies (admit.h), so
	 * this bound counts the pre-Hello ones too. */
	if (d->n_sessions >= d->conf.max_sessions + d->conf.max_prehello) {
		kvp_fail_limit(f, "sessions", d->conf.max_sessions + d->conf.max_prehello);
		return NULL;
	}
	s = KVP_FAULT_OR(KVP_FAULT_SESSION, calloc(1, sizeof(*s)));
	if (!s) {
		kvp_fail(f, KVP_ERR_INTERNAL, "out of memory");
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

int kvp_session_set_groups(struct kvp_session *s, const gid_t *groups, int ngroups)
{
	gid_t *g = NULL;

	if (ngroups > 0) {
		g = KVP_FAULT_OR(KVP_FAULT_SESSION, malloc(sizeof(gid_t) * (size_t)ngroups));
		if (!g)
			return -ENOMEM;
		memcpy(g, groups, sizeof(gid_t) * (size_t)ngroups);
	}
	free(s->groups);
	s->groups = g;
	s->ngroups = ngroups > 0 ? ngroups : 0;
	return 0;
}

void kvp_session_evict(struct kvp_session *s, const char *reason)
{
	if (s->evicted)
		return;
	s->evicted = true;
	snprintf(s->evict_reason, sizeof(s->evict_reason), "%s", reason);
}

/* Root and the daemon's own user hold every page already: no list binds them. */
static bool trusted(const struct kvp_daemon *d, const struct kvp_session *s)
{
	return s->uid == 0 || s->uid == d->self_uid;
}

static bool pool_allows(const struct kvp_daemon *d, const struct kvp_session *s,
			const struct kvp_pool_conf *pc)
{
	if (!pc->n_allowed_uids && !pc->n_allowed_gids)
		return true;
	return trusted(d, s) || in_list(s->uid, pc->allowed_uids, pc->n_allowed_uids) ||
	       any_group(pc->allowed_gids, pc->n_allowed_gids, s->gid, s->groups, s->ngroups);
}

int kvp_session_may_attach(const struct kvp_daemon *d, const struct kvp_session *s,
			   const struct kvpd_pool *p, struct kvp_fail *f)
{
	if (pool_allows(d, s, &p->conf))
		return 0;
	return kvp_fail(f, KVP_ERR_PERMISSION_DENIED,
			"pool %s: uid %u is not in its allowed_users or allowed_groups",
			p->conf.name, (unsigned)s->uid);
}

int kvp_session_may_use_ns(const struct kvp_daemon *d, const struct kvp_session *s,
			   const struct kvpd_pool *p, uint64_t ns, const char *what,
			   struct kvp_fail *f)
{
	const struct kvp_ns_owner *o = kvp_pool_conf_ns_owner(&p->conf, ns);

	if (!o || trusted(d, s) || in_list(s->uid, o->uids, o->n_uids) ||
	    any_group(o->gids, o->n_gids, s->gid, s->groups, s->ngroups))
		return 0;
	return kvp_fail(f, KVP_ERR_PERMISSION_DENIED,
			"%s: namespace %lu of pool %s is bound to other users (namespace.%lu); uid "
			"%u may not use it",
			what, (unsigned long)ns, p->conf.name, (unsigned long)ns, (unsigned)s->uid);
}

static uint64_t mix(uint64_t x, const uint64_t k[2])
{
	/* Each step is invertible (xor, xorshift, odd multiply): distinct in, distinct out. */
	x ^= k[0];
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ull;
	x ^= x >> 33;
	return x ^ k[1];
}

bool kvp_daemon_has_pool(const struct kvp_daemon *d, const struct kvpd_pool *p)
{
	for (uint32_t i = 0; i < d->n_pools; i++)
		if (d->pools[i] == p)
			return true;
	return false;
}

uint64_t kvp_daemon_new_id(struct kvp_daemon *d, uint64_t *ctr)
{
	uint64_t id;

	if (!d->id_keyed) {
		if (getrandom(d->id_key, sizeof(d->id_key), GRND_NONBLOCK) != sizeof(d->id_key)) {
			struct timespec ts;

			clock_gettime(CLOCK_REALTIME, &ts);
			d->id_key[0] = ((uint64_t)ts.tv_sec << 32) ^ (uint64_t)ts.tv_nsec;
			d->id_key[1] = mix((uint64_t)getpid(), d->id_key) ^ (uint64_t)(uintptr_t)d;
		}
		d->id_keyed = true;
	}
	do
		id = mix(++*ctr, d->id_key);
	while (id == 0 || id == UINT64_MAX);
	return id;
}

void kvp_session_attach(struct kvp_session *s, struct kvpd_pool *p)
{
	if (!s->attached[p->id]) {
		s->attached[p->id] = true;
		p->sessions++;
	}
}

struct kvpd_pool *kvp_session_pool(const struct kvp_daemon *d, const struct kvp_session *s,
				   uint32_t pool_id, struct kvp_fail *f)
{
	if (pool_id >= d->n_pools) {
		kvp_fail(f, KVP_ERR_NO_SUCH_POOL, "pool_id %u does not exist", pool_id);
		return NULL;
	}
	if (!s->attached[pool_id]) {
		kvp_fail(f, KVP_ERR_NOT_FOUND, "pool_id %u is not attached by this session",
			 pool_id);
		return NULL;
	}
	return d->pools[pool_id];
}

static int quota_fail(struct kvp_fail *f, const struct kvpd_pool *p, const char *which,
		      const char *holder, uint64_t q, uint64_t held, uint64_t want)
{
	f->detail = KVP_FAIL_QUOTA;
	f->quota.quota = q;
	f->quota.held = held;
	f->quota.requested = want;
	return kvp_fail(f, KVP_ERR_QUOTA_EXCEEDED,
			"pool %s: %s is %lu tokens; %s holds %lu and asked for %lu more",
			p->conf.name, which, (unsigned long)q, holder, (unsigned long)held,
			(unsigned long)want);
}

/* Pages s holds in p for the quotas: leased (its Fetches' in flight too) and locked. */
static uint64_t held_pages(const struct kvp_session *s, const struct kvpd_pool *p)
{
	return s->leased_pages[p->id] + s->fetch_pages[p->id] + s->locked_pages[p->id];
}

/* Leased + locked tokens of every session of uid in p. */
static uint64_t uid_held(const struct kvp_daemon *d, uid_t uid, const struct kvpd_pool *p)
{
	uint64_t pages = 0;

	for (const struct kvp_session *x = d->sessions; x; x = x->next)
		if (x->uid == uid)
			pages += held_pages(x, p);
	return pages * p->conf.page_tokens;
}

/* The session and uid quotas for want more tokens held (leased or locked). */
static int check_held(const struct kvp_daemon *d, const struct kvp_session *s,
		      const struct kvpd_pool *p, uint64_t want, struct kvp_fail *f)
{
	uint64_t pt = p->conf.page_tokens, q = p->conf.session_quota_tokens;
	uint64_t held = held_pages(s, p) * pt;

	if (q && (want > q || held > q - want))
		return quota_fail(f, p, "session quota (leased and locked)", "this session", q,
				  held, want);
	q = p->conf.uid_quota_tokens;
	if (q && (held = uid_held(d, s->uid, p), want > q || held > q - want))
		return quota_fail(f, p, "uid quota (leased and locked)", "this uid", q, held, want);
	return 0;
}

uint64_t kvp_session_room(const struct kvp_daemon *d, const struct kvp_session *s,
			  const struct kvpd_pool *p)
{
	uint64_t pt = p->conf.page_tokens, room = UINT64_MAX, q;
	uint64_t held = held_pages(s, p) * pt;

	if ((q = p->conf.session_quota_tokens))
		room = held >= q ? 0 : (q - held) / pt;
	if ((q = p->conf.uid_quota_tokens)) {
		held = uid_held(d, s->uid, p);
		room = held >= q ? 0 : (q - held) / pt < room ? (q - held) / pt : room;
	}
	return room;
}

void kvp_session_fetch_held(struct kvp_session *s, uint32_t pool_id, int64_t npages)
{
	s->fetch_pages[pool_id] += (uint64_t)npages;
}

uint32_t kvp_session_reap_empty(const struct kvp_daemon *d, struct kvp_session *s)
{
	uint32_t ended = 0;
	uint64_t id;
	void *v;

	if (!s->empty_leases || s->leases.count < d->conf.max_leases_per_session)
		return 0;
	for (uint32_t i = 0; (i = kvp_idmap_next(&s->leases, i, &id, &v)) != 0;) {
		struct kvp_lease *l = v;

		if (l->n == 0) {
			kvp_session_lease_end(s, l);
			ended++;
		}
	}
	return ended;
}

int kvp_session_may_lease(const struct kvp_daemon *d, const struct kvp_session *s,
			  const struct kvpd_pool *p, uint32_t npages, bool new_lease,
			  struct kvp_fail *f)
{
	if (new_lease && s->leases.count - s->empty_leases >= d->conf.max_leases_per_session)
		return kvp_fail_limit(f, "leases", d->conf.max_leases_per_session);
	return check_held(d, s, p, (uint64_t)npages * p->conf.page_tokens, f);
}

int kvp_session_may_lock_pages(const struct kvp_daemon *d, const struct kvp_session *s,
			       const struct kvpd_pool *p, uint64_t npages, struct kvp_fail *f)
{
	uint64_t pt = p->conf.page_tokens, q = p->conf.session_lock_quota_tokens;
	uint64_t want = npages * pt, locked = s->locked_pages[p->id] * pt;

	if (q && (want > q || locked > q - want))
		return quota_fail(f, p, "session lock quota", "this session's locks", q, locked,
				  want);
	return check_held(d, s, p, want, f);
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
		kvp_fail(f, KVP_ERR_NOT_FOUND, "lease %lu is not one of this session's",
			 (unsigned long)id);
	return l;
}

void kvp_session_lease_resized(struct kvp_session *s, const struct kvp_lease *l, uint32_t before)
{
	s->empty_leases += (l->n == 0) - (before == 0);
	s->leased_pages[l->pool->id] += l->n;
	s->leased_pages[l->pool->id] -= before;
}

uint32_t kvp_session_lease_end(struct kvp_session *s, struct kvp_lease *l)
{
	uint32_t n = l->n;

	s->leased_pages[l->pool->id] -= n;
	s->empty_leases -= n == 0;
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
	k->id = kvp_daemon_new_id(d, &d->next_lock_id);
	if (kvp_idmap_put(&s->locks, k->id, k) < 0) {
		kvp_pool_unlock(k->pool, k->run);
		free(k);
		return -ENOMEM;
	}
	s->locked_tokens += (uint64_t)k->pages * k->pool->conf.page_tokens;
	s->locked_pages[k->pool->id] += k->pages;
	return 0;
}

int kvp_session_lock_restore(struct kvp_session *s, struct kvp_lock *k)
{
	int r = kvp_idmap_put(&s->locks, k->id, k);

	if (r < 0) {
		kvp_pool_unlock(k->pool, k->run);
		free(k);
		return r;
	}
	s->locked_tokens += (uint64_t)k->pages * k->pool->conf.page_tokens;
	s->locked_pages[k->pool->id] += k->pages;
	return 0;
}

struct kvp_lock *kvp_session_lock(const struct kvp_session *s, uint64_t id, struct kvp_fail *f)
{
	struct kvp_lock *k = kvp_idmap_get(&s->locks, id);

	if (!k)
		kvp_fail(f, KVP_ERR_NOT_FOUND, "lock %lu is not one of this session's",
			 (unsigned long)id);
	return k;
}

void kvp_session_lock_release(struct kvp_session *s, struct kvp_lock *k)
{
	kvp_pool_unlock(k->pool, k->run);
	s->locked_tokens -= (uint64_t)k->pages * k->pool->conf.page_tokens;
	s->locked_pages[k->pool->id] -= k->pages;
	kvp_idmap_del(&s->locks, k->id);
	free(k);
}

void kvp_session_take_over(struct kvp_daemon *d, struct kvp_session *s, struct kvp_session *from)
{
	uint64_t id;
	void *v;

	for (uint32_t i = 0; (i = kvp_idmap_next(&from->leases, i, &id, &v)) != 0;)
		if (kvp_session_lease_add(s, v) == 0) /* deleting leaves the cursor valid */
			kvp_idmap_del(&from->leases, id);
	for (uint32_t i = 0; (i = kvp_idmap_next(&from->locks, i, &id, &v)) != 0;) {
		struct kvp_lock *k = v;

		if (kvp_idmap_put(&s->locks, id, k) < 0)
			continue;
		kvp_idmap_del(&from->locks, id);
		s->locked_tokens += (uint64_t)k->pages * k->pool->conf.page_tokens;
		s->locked_pages[k->pool->id] += k->pages;
	}
	for (uint32_t i = 0; i < d->n_pools; i++) {
		if (!from->attached[i])
			continue;
		if (s->attached[i])
			continue; /* from's count is dropped by its destroy */
		s->attached[i] = true;
		from->attached[i] = false;
	}
	memcpy(s->resume_token, from->resume_token, sizeof(s->resume_token));
	from->hello = false;
	kvp_session_destroy(d, from);
}

uint64_t kvp_session_leased_tokens(const struct kvp_daemon *d, const struct kvp_session *s)
{
	uint64_t leased = 0;

	for (uint32_t p = 0; p < d->n_pools; p++)
		leased += s->leased_pages[p] * d->pools[p]->conf.page_tokens;
	return leased;
}

/* Frees leases and locks of pool p (all pools when p is NULL). Returns tokens freed. */
static uint64_t release_owned(struct kvp_session *s, struct kvpd_pool *p)
{
	uint64_t tokens = 0, id;
	void *v;

	for (uint32_t i = 0; i < KVP_MAX_POOLS; i++) {
		struct kvp_reserve *r = s->reserve[i];

		if (!r || (p && p->id != i))
			continue;
		for (int t = 0; t < KVP_TIER_ID_MAX; t++)
			tokens += (uint64_t)kvp_reserve_pages(r, t) *
				  kvp_reserve_pool(r)->conf.page_tokens;
		kvp_reserve_end(s, kvp_reserve_pool(r));
	}
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

uint64_t kvp_session_detach(struct kvp_daemon *d, struct kvp_session *s, struct kvpd_pool *p)
{
	uint64_t t = release_owned(s, p);

	(void)d;
	kvp_pressure_detach(s, p);
	if (s->attached[p->id]) {
		s->attached[p->id] = false;
		p->sessions--;
	}
	return t;
}

uint32_t kvp_daemon_recheck_sessions(struct kvp_daemon *d)
{
	uint32_t changed = 0;

	for (struct kvp_session *s = d->sessions; s; s = s->next) {
		struct kvp_fail f;
		bool admin = false, touched = false;

		if (s->evicted)
			continue;
		kvp_fail_init(&f);
		if (kvp_daemon_admit(d, s->pid, s->uid, s->gid, s->groups, s->ngroups, &admin, &f) <
		    0) {
			log_notice("reload: session %lu ('%s' pid %d uid %u) lost access to "
				   "kvpoold; closing it",
				   (unsigned long)s->id, s->name, (int)s->pid, (unsigned)s->uid);
			kvp_session_evict(s, "closed: a reload revoked its access to kvpoold");
			changed++;
			continue;
		}
		if (s->admin && !admin) {
			log_notice("reload: session %lu ('%s' pid %d uid %u) is no longer an admin",
				   (unsigned long)s->id, s->name, (int)s->pid, (unsigned)s->uid);
			touched = true;
		}
		s->admin = admin;
		for (uint32_t i = 0; i < d->n_pools; i++) {
			struct kvpd_pool *p = d->pools[i];
			uint64_t freed;

			if (!s->attached[i] || pool_allows(d, s, &p->conf))
				continue;
			freed = kvp_session_detach(d, s, p);
			log_notice(
				"reload: session %lu ('%s' pid %d uid %u) lost access to pool %s; "
				"detached (%lu tokens freed)",
				(unsigned long)s->id, s->name, (int)s->pid, (unsigned)s->uid,
				p->conf.name, (unsigned long)freed);
			touched = true;
		}
		changed += touched;
	}
	return changed;
}

void kvp_session_destroy(struct kvp_daemon *d, struct kvp_session *s)
{
	if (!s)
		return;
	release_owned(s, NULL);
	kvp_reserve_regions_free(s);
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
	free(s->groups);
	free(s);
	/* Under injected failures, every session's end proves the books still balance. */
	if (kvp_fault_armed() && kvp_daemon_check(d) < 0) {
		log_err("failure injection: pool books do not balance after a session ended");
		abort();
	}
}

int kvp_daemon_check(const struct kvp_daemon *d)
{
	uint64_t held[KVP_MAX_POOLS][KVP_TIER_ID_MAX] = { { 0 } };
	uint64_t fetching[KVP_MAX_POOLS] = { 0 };

	/* Every page a live session's lease lists is booked to that lease, and the session's
	 * quota counts them; with the per-tier totals equal, no leased page is anyone else's. */
	for (const struct kvp_session *s = d->sessions; s; s = s->next) {
		uint64_t mine[2 * KVP_MAX_POOLS] = { 0 }, id; /* leased, then locked pages */
		uint32_t empty = 0;
		void *v;

		for (uint32_t i = 0; (i = kvp_idmap_next(&s->leases, i, &id, &v)) != 0;) {
			const struct kvp_lease *l = v;

			if (l->id != id || kvp_lease_check(l) < 0)
				return -EFAULT;
			mine[l->pool->id] += l->n;
			held[l->pool->id][l->tier] += l->n;
			empty += l->n == 0;
		}
		if (empty != s->empty_leases)
			return -EFAULT;
		for (uint32_t i = 0; (i = kvp_idmap_next(&s->locks, i, &id, &v)) != 0;) {
			const struct kvp_lock *k = v;

			if (k->id != id)
				return -EFAULT;
			mine[k->pool->id + KVP_MAX_POOLS] += k->pages;
		}
		for (uint32_t p = 0; p < KVP_MAX_POOLS; p++) {
			const struct kvp_reserve *r = s->reserve[p];

			if (!r)
				continue;
			if (kvp_reserve_check(r) < 0)
				return -EFAULT;
			for (int t = 0; t < KVP_TIER_ID_MAX; t++) {
				mine[p] += kvp_reserve_pages(r, t);
				held[p][t] += kvp_reserve_pages(r, t);
			}
		}
		for (uint32_t p = 0; p < d->n_pools; p++)
			if (mine[p] != s->leased_pages[p] ||
			    mine[p + KVP_MAX_POOLS] != s->locked_pages[p])
				return -EFAULT;
		for (uint32_t p = 0; p < KVP_MAX_POOLS; p++)
			fetching[p] += s->fetch_pages[p];
	}
	for (uint32_t i = 0; i < d->n_pools; i++) {
		uint64_t fetch_leased = d->fetch_leased[i];

		if (kvp_pool_check(d->pools[i]) < 0)
			return -EFAULT;
		/* A Fetch in flight leases the host pages its values land in; those of live
		 * sessions' Fetches are booked to them (a session that ended took its count). */
		if (fetching[i] > fetch_leased)
			return -EFAULT;
		held[i][KVP_TIER_ID_HOST] += fetch_leased;
		for (int t = 0; t < KVP_TIER_ID_MAX; t++) {
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
