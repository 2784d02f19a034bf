/* daemon.h - kvpoold's state, owned by the one event-loop thread: configuration, pools,
 * sessions, counters. No locks: nothing else touches it. */
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "config.h"
#include "defer.h"
#include "fail.h"
#include "idmap.h"
#include "pool.h"
#include "stats.h"

struct kvp_session {
	uint64_t id;
	pid_t pid; /* SO_PEERCRED */
	uid_t uid;
	gid_t gid;
	bool admin;
	bool hello;
	char name[64];
	uint64_t started_ms, last_ms;
	struct kvp_idmap leases; /* lease id -> struct kvp_lease */
	struct kvp_idmap locks;	 /* lock id -> struct kvp_lock */
	bool attached[KVP_MAX_POOLS];
	uint64_t leased_pages[KVP_MAX_POOLS]; /* for the session quota */
	uint64_t locked_tokens;
	struct kvp_session *prev, *next;
};

struct kvp_lock {
	uint64_t id;
	struct kvp_pool *pool;
	struct kvp_prefix_node *node;
	uint32_t pages;
};

struct kvp_daemon {
	struct kvp_conf conf;
	const char *config_path; /* NULL: embedded default */
	struct kvp_pool *pools[KVP_MAX_POOLS];
	uint32_t n_pools;
	struct kvp_session *sessions;
	uint32_t n_sessions;
	uint64_t next_session_id, next_lease_id, next_lock_id;
	uint64_t started_ms;
	uid_t self_uid;
	bool draining, stopping;
	uint64_t drain_deadline_ms;
	struct kvp_daemon_stats st;
	struct kvp_rpc_stats rpc;
	/* Extra allowed ids from the command line, on top of the config's. */
	uint32_t flag_uids[KVP_MAX_IDS], n_flag_uids;
	uint32_t flag_gids[KVP_MAX_IDS], n_flag_gids;
	bool reload_requested;
	struct kvp_defers defers; /* deferred replies (defer.h) */
};

uint64_t kvp_now_ms(void);

/* Session lifecycle (session.c). */
/* Checks credentials against the allowed lists. 0 or -PERMISSION_DENIED with f filled. */
int kvp_daemon_admit(struct kvp_daemon *d, pid_t pid, uid_t uid, gid_t gid, const gid_t *groups,
		     int ngroups, bool *admin, struct kvp_fail *f);
/* NULL with f filled when max_sessions is reached. */
struct kvp_session *kvp_session_new(struct kvp_daemon *d, pid_t pid, uid_t uid, gid_t gid,
				    bool admin, struct kvp_fail *f);
/* Returns every lease and lock, unlinks and frees the session. Accepts NULL. */
void kvp_session_destroy(struct kvp_daemon *d, struct kvp_session *s);
/* Frees the session's leases and locks in one pool (Detach). Returns tokens freed. */
uint64_t kvp_session_detach(struct kvp_daemon *d, struct kvp_session *s, struct kvp_pool *p);
/* Session accounting (session.c): every change to what a session holds goes through these, so
 * the quota counts, locked tokens and lease/lock tables always agree. */
/* Marks p attached by s (counted once in p->sessions). */
void kvp_session_attach(struct kvp_session *s, struct kvp_pool *p);
/* The pool pool_id names, attached by s; NULL with f filled (NO_SUCH_POOL, NOT_FOUND). */
struct kvp_pool *kvp_session_pool(const struct kvp_daemon *d, const struct kvp_session *s,
				  uint32_t pool_id, struct kvp_fail *f);
/* Whether s may hold npages more pages of p (a new lease when new_lease): the lease limit and
 * the pool's session quota. 0 or a negative Code with f filled (LIMIT_EXCEEDED,
 * QUOTA_EXCEEDED and their details). */
int kvp_session_may_lease(const struct kvp_daemon *d, const struct kvp_session *s,
			  const struct kvp_pool *p, uint32_t npages, bool new_lease,
			  struct kvp_fail *f);
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
/* s's lock id; NULL with f filled (NOT_FOUND). */
struct kvp_lock *kvp_session_lock(const struct kvp_session *s, uint64_t id, struct kvp_fail *f);
/* Drops k's lock in its pool, unbooks and frees it. */
void kvp_session_lock_release(struct kvp_session *s, struct kvp_lock *k);
/* Tokens s holds leased, over every pool. */
uint64_t kvp_session_leased_tokens(const struct kvp_daemon *d, const struct kvp_session *s);

/* Invariant check over every pool and session: the pools are consistent and their leased pages
 * are exactly those of the live sessions' leases. O(pages + leases). 0 or -EFAULT. */
int kvp_daemon_check(const struct kvp_daemon *d);
