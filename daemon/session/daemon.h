/* daemon.h - kvpoold's state, owned by the one event-loop thread: configuration, pools,
 * sessions, counters. No locks: nothing else touches it. What session.c does with sessions is
 * declared in session.h. */
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "config.h"
#include "defer.h"
#include "fail.h"
#include "idmap.h"
#include "pool.h"
#include "pressure.h"
#include "stats.h"

struct kvp_session {
	uint64_t id;
	pid_t pid; /* SO_PEERCRED */
	uid_t uid;
	gid_t gid;
	gid_t *groups; /* every SO_PEERGROUPS group, for pool, namespace and reload checks */
	int ngroups;
	bool admin;
	bool hello;
	/* Set when a reload took this session's access away: the loop closes the connection
	 * (kvp_loop_peer_close with evict_reason) and dispatch refuses its calls until then. */
	bool evicted;
	char evict_reason[128];
	char name[64]; /* sanitised at Hello: valid UTF-8, no control characters */
	uint64_t started_ms, last_ms;
	struct kvp_idmap leases; /* lease id -> struct kvp_lease */
	uint32_t empty_leases;	 /* of them, holding no page: not counted against the limit */
	struct kvp_idmap locks;	 /* lock id -> struct kvp_lock */
	bool attached[KVP_MAX_POOLS];
	uint64_t leased_pages[KVP_MAX_POOLS]; /* for the session quota */
	uint64_t locked_pages[KVP_MAX_POOLS]; /* pages its locks pin, counted in the quotas too */
	uint64_t fetch_pages[KVP_MAX_POOLS];  /* host pages its Fetches in flight lease, likewise */
	uint64_t locked_tokens;
	uint64_t caps;			   /* the capabilities agreed in Hello (KVP_CAP_*) */
	struct kvpd_pressure_sub pressure; /* pressure notices asked for (pressure.h) */
	/* Page reserves (reserve.h), per pool; their pages count in leased_pages. */
	struct kvp_reserve *reserve[KVP_MAX_POOLS];
	struct kvp_resv_region *resv_region[KVP_MAX_POOLS]; /* their memfds, until the end */
	/* Restarts (snapshot.c): the token a later Hello presents to resume this session, and
	 * for a session of the previous kvpoold waiting for its client (no connection) the time
	 * its leases and locks are reclaimed; 0 for a live session. */
	uint8_t resume_token[16];
	uint64_t resume_until_ms;
	struct kvp_session *prev, *next;
};

struct kvp_reserve;

struct kvp_lock {
	uint64_t id;
	struct kvpd_pool *pool;
	struct kvp_index_lock *run; /* the matched run it pins (token or key call) */
	uint32_t pages;
};

struct kvp_daemon {
	struct kvp_conf conf;
	const char *config_path; /* NULL: embedded default */
	struct kvpd_pool *pools[KVP_MAX_POOLS];
	uint32_t n_pools;
	struct kvp_session *sessions;
	uint32_t n_sessions;
	uint32_t n_reserves; /* sessions' page reserves open (reserve.c), for the loop's upkeep */
	uint64_t next_session_id, next_lease_id, next_lock_id;
	/* Lease and lock ids are the counters through a keyed bijection (kvp_daemon_new_id), so
	 * one session cannot guess another's ids. Drawn at the first id. */
	uint64_t id_key[2];
	bool id_keyed;
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
	struct kvp_defers defers;	   /* deferred replies (defer.h) */
	struct kvp_remote *remote;	   /* the remote tier (remote.h); NULL without [remote] */
	struct kvp_remote_stats remote_st; /* its client's figures, as of the last loop turn */
	struct kvp_rt *rt;		   /* pages in the remote tier (remote_tier.h) */
	struct kvp_dt *dt; /* the disk tier (disk_tier.h); NULL when no pool has one */
	/* Host pages that Fetches in flight lease (rpc_fetch.c), outside every session. */
	uint64_t fetch_leased[KVP_MAX_POOLS];
	struct kvp_alloc_wait *alloc_waiting; /* Allocs waiting for demotions (rpc_lease.c) */
	struct kvpd_pressure pressure;	      /* tiers against their watermarks (pressure.h) */
};

/* The daemon's clock: CLOCK_MONOTONIC in milliseconds (defined in session.c). */
uint64_t kvp_now_ms(void);
