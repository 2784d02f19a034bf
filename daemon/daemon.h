/* daemon.h - kvpoold's state, owned by the one event-loop thread: configuration, pools,
 * sessions, counters. No locks: nothing else touches it. */
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "config.h"
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
	void *conn; /* the connection that carries it */
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
/* Invariant check over every pool and session: the pools are consistent and their leased pages
 * are exactly those of the live sessions' leases. O(pages + leases). 0 or -EFAULT. */
int kvp_daemon_check(const struct kvp_daemon *d);
