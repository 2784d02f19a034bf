/* admit.h - who may connect, say Hello and hold buffer memory: the rules alone, fed the counts
 * the loop keeps (no I/O, no clock), so each is tested on its own.
 *
 * Connections that have not said Hello are counted apart from sessions and capped
 * (max_prehello); one uid holds at most max_sessions_per_uid connections; admin_sessions of
 * each cap are kept for admins (root, the daemon's user, admin_groups), so no user's idle
 * connections lock them out. Every connection takes two descriptors (its socket and the peer's
 * pidfd): new ones are refused before RLIMIT_NOFILE, keeping a reserve for kvpoold itself (half
 * of it usable by admins). Reply and input buffers of all connections stay within one budget. */
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "config.h"
#include "fail.h"

#define KVP_CONN_FDS 2		   /* a connection's socket and its peer's pidfd */
#define KVP_ATTACH_FDS_INFLIGHT 16 /* Attach replies with descriptors not yet read, per conn */
#define KVP_BUDGET_PER_SESSION (64u << 10) /* buffer_budget = 0: this per max_sessions, */
#define KVP_BUDGET_MIN (32u << 20)	   /* and at least this */

/* What the loop counts when a connection arrives or says Hello. */
struct kvp_admit_counts {
	uint32_t prehello;  /* connections not yet said Hello (the new one not included) */
	uint32_t sessions;  /* connections that said Hello */
	uint32_t uid_conns; /* of either, those of the caller's uid (the new one not included) */
	uint64_t fds_used;  /* descriptors kvpoold holds now (the new connection's included) */
	uint64_t fd_limit;  /* RLIMIT_NOFILE (soft) */
	uint64_t buf_bytes; /* reply and input buffer bytes held now */
};

/* Raises RLIMIT_NOFILE's soft limit to its hard limit. Returns the soft limit now in force. */
uint64_t kvp_admit_raise_nofile(void);
/* The descriptors kept for kvpoold itself (pool memory, reloads, metrics, the remote tier):
 * max(32, limit / 32), at most half the limit. */
uint64_t kvp_admit_fd_reserve(uint64_t fd_limit);
/* The buffer budget c configures: buffer_budget, or when 0 max_sessions *
 * KVP_BUDGET_PER_SESSION, at least KVP_BUDGET_MIN. */
uint64_t kvp_admit_buffer_budget(const struct kvp_conf *c);

/* Why a connection or Hello was refused (the counter the loop bumps). */
enum kvp_admit_refusal {
	KVP_ADMIT_OK,
	KVP_ADMIT_FDS,
	KVP_ADMIT_PREHELLO,
	KVP_ADMIT_UID,
	KVP_ADMIT_SESSIONS,
	KVP_ADMIT_REFUSAL_MAX,
};

/* A new connection of a caller (admin or not) with counts n: KVP_ADMIT_OK, or the refusal
 * with f filled (LIMIT_EXCEEDED, LimitDetail what = "fds", "pre-Hello connections",
 * "connections of uid N"). */
enum kvp_admit_refusal kvp_admit_connect(const struct kvp_conf *c, const struct kvp_admit_counts *n,
					 bool admin, uid_t uid, struct kvp_fail *f);
/* A Hello of a pre-Hello connection: KVP_ADMIT_OK, or KVP_ADMIT_SESSIONS with f filled
 * (LIMIT_EXCEEDED, what = "sessions"). */
enum kvp_admit_refusal kvp_admit_hello(const struct kvp_conf *c, const struct kvp_admit_counts *n,
				       bool admin, struct kvp_fail *f);
/* Whether more bytes of buffer fit in the budget beside n->buf_bytes. 0, or -LIMIT_EXCEEDED with
 * f filled (what = "buffer bytes", limit = the budget). */
int kvp_admit_buffer(const struct kvp_conf *c, const struct kvp_admit_counts *n, uint64_t more,
		     struct kvp_fail *f);
