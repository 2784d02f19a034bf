/* session.h - what session.c offers: admission by credentials, a session's lifecycle, its
 * access and quota checks, the accounting of its leases and locks, fresh lease and lock ids, and
 * the invariant check over pools and sessions. The session's state (struct kvp_session) is
 * daemon.h's. */
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "daemon.h"
#include "fail.h"

/* Session lifecycle. */
/* Checks credentials against the allowed lists. 0 or -PERMISSION_DENIED with f filled. */
int kvp_daemon_admit(struct kvp_daemon *d, pid_t pid, uid_t uid, gid_t gid, const gid_t *groups,
		     int ngroups, bool *admin, struct kvp_fail *f);
/* NULL with f filled when max_sessions is reached. */
struct kvp_session *kvp_session_new(struct kvp_daemon *d, pid_t pid, uid_t uid, gid_t gid,
				    bool admin, struct kvp_fail *f);
/* Returns every lease and lock, unlinks and frees the session. Accepts NULL. */
void kvp_session_destroy(struct kvp_daemon *d, struct kvp_session *s);
/* Keeps a copy of every supplementary group of the caller for later checks. 0 or -ENOMEM
 * (the session then has none and must be refused: group-based access would be skipped). */
int kvp_session_set_groups(struct kvp_session *s, const gid_t *groups, int ngroups);
/* Marks s for closing with reason (logged once by whoever closes it: the loop's tick). */
void kvp_session_evict(struct kvp_session *s, const char *reason);
/* Whether s may attach p (the pool's allowed_users / allowed_groups). 0 or
 * -PERMISSION_DENIED with f filled, naming the pool. */
int kvp_session_may_attach(const struct kvp_daemon *d, const struct kvp_session *s,
			   const struct kvpd_pool *p, struct kvp_fail *f);
/* Whether s may insert or match (what) in namespace ns of p: an unbound namespace is shared,
 * a bound one (namespace.N) only for its users and groups. 0 or -PERMISSION_DENIED. */
int kvp_session_may_use_ns(const struct kvp_daemon *d, const struct kvp_session *s,
			   const struct kvpd_pool *p, uint64_t ns, const char *what,
			   struct kvp_fail *f);
/* Whether s may lock npages more pages of p: the session quota (leased + locked), the session
 * lock quota and the uid quota. 0 or -QUOTA_EXCEEDED with f filled. */
int kvp_session_may_lock_pages(const struct kvp_daemon *d, const struct kvp_session *s,
			       const struct kvpd_pool *p, uint64_t npages, struct kvp_fail *f);
/* Whether p is one of d's pools now (a reload may have dropped it since it was looked up). */
bool kvp_daemon_has_pool(const struct kvp_daemon *d, const struct kvpd_pool *p);
/* A fresh lease or lock id from counter *ctr: nonzero, never UINT64_MAX, distinct for every
 * counter value, and not predictable from another session's ids. */
uint64_t kvp_daemon_new_id(struct kvp_daemon *d, uint64_t *ctr);
/* After a reload changed d->conf: re-checks every open session against the new access lists.
 * Sessions no longer admitted are evicted, sessions that lost admin are demoted, sessions
 * whose pool refuses them now are detached from it; each change is logged once. Returns the
 * number of sessions changed. */
uint32_t kvp_daemon_recheck_sessions(struct kvp_daemon *d);
/* Frees the session's leases and locks in one pool (Detach). Returns tokens freed. */
uint64_t kvp_session_detach(struct kvp_daemon *d, struct kvp_session *s, struct kvpd_pool *p);
/* Session accounting (session.c): every change to what a session holds goes through these, so
 * the quota counts, locked tokens and lease/lock tables always agree. */
/* Marks p attached by s (counted once in p->sessions). */
void kvp_session_attach(struct kvp_session *s, struct kvpd_pool *p);
/* The pool pool_id names, attached by s; NULL with f filled (NO_SUCH_POOL, NOT_FOUND). */
struct kvpd_pool *kvp_session_pool(const struct kvp_daemon *d, const struct kvp_session *s,
				   uint32_t pool_id, struct kvp_fail *f);
/* Whether s may hold npages more pages of p (a new lease when new_lease): the lease limit and
 * the pool's session quota. 0 or a negative Code with f filled (LIMIT_EXCEEDED,
 * QUOTA_EXCEEDED and their details). */
int kvp_session_may_lease(const struct kvp_daemon *d, const struct kvp_session *s,
			  const struct kvpd_pool *p, uint32_t npages, bool new_lease,
			  struct kvp_fail *f);
/* Books npages more (negative: fewer) host pages of pool pool_id that a Fetch of s leases
 * while it runs (remote_tier.c): the quotas count them as they count leased pages. */
void kvp_session_fetch_held(struct kvp_session *s, uint32_t pool_id, int64_t npages);
/* Pages s may still hold in p under the session and uid quotas (UINT64_MAX: no quota). */
uint64_t kvp_session_room(const struct kvp_daemon *d, const struct kvp_session *s,
			  const struct kvpd_pool *p);
/* Ends s's empty leases (those an Insert emptied, kept for their Free) once the lease limit is
 * reached, so they never count against it. Returns how many ended. */
uint32_t kvp_session_reap_empty(const struct kvp_daemon *d, struct kvp_session *s);
/* Books lease l as s's, its pages counted for the quota. 0, or -ENOMEM (nothing booked). */
int kvp_session_lease_add(struct kvp_session *s, struct kvp_lease *l);
/* s's lease id; NULL with f filled (NOT_FOUND). */
struct kvp_lease *kvp_session_lease(const struct kvp_session *s, uint64_t id, struct kvp_fail *f);
/* Recounts l's pages after it grew or shrank from `before` pages (Extend, Free, Insert). */
void kvp_session_lease_resized(struct kvp_session *s, const struct kvp_lease *l, uint32_t before);
/* Unbooks and destroys l. Returns the pages it held. */
uint32_t kvp_session_lease_end(struct kvp_session *s, struct kvp_lease *l);
/* Whether s may take one more lock. 0 or -LIMIT_EXCEEDED with f filled. */
int kvp_session_may_lock(const struct kvp_daemon *d, const struct kvp_session *s,
			 struct kvp_fail *f);
/* An empty lock record, taken before the match that fills it ("lock" fault site); NULL on
 * ENOMEM. Freed by kvp_session_lock_add's failure, kvp_session_lock_release or free(). */
struct kvp_lock *kvp_session_lock_alloc(void);
/* Books k (pool, node and pages set) as s's under a new id, its tokens counted as locked.
 * 0, or -ENOMEM: then k's lock is dropped in its pool and k freed. */
int kvp_session_lock_add(struct kvp_daemon *d, struct kvp_session *s, struct kvp_lock *k);
/* Books k (id, pool, node or keys and pages set: a lock a restart took again) as s's under
 * k->id. 0, or -ENOMEM / -EEXIST: then k's lock is dropped in its pool and k freed. */
int kvp_session_lock_restore(struct kvp_session *s, struct kvp_lock *k);
/* s's lock id; NULL with f filled (NOT_FOUND). */
struct kvp_lock *kvp_session_lock(const struct kvp_session *s, uint64_t id, struct kvp_fail *f);
/* Drops k's lock in its pool, unbooks and frees it. */
void kvp_session_lock_release(struct kvp_session *s, struct kvp_lock *k);
/* Moves every lease and lock (ids kept) and pool attachment of from (a session of the previous
 * kvpoold) to s, takes its resume token, and destroys from. */
void kvp_session_take_over(struct kvp_daemon *d, struct kvp_session *s, struct kvp_session *from);
/* Tokens s holds leased, over every pool. */
uint64_t kvp_session_leased_tokens(const struct kvp_daemon *d, const struct kvp_session *s);

/* Invariant check over every pool and session: the pools are consistent and their leased pages
 * are exactly those of the live sessions' leases. O(pages + leases). 0 or -EFAULT. */
int kvp_daemon_check(const struct kvp_daemon *d);
