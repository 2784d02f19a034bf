/* defer.h - deferred replies: a handler that cannot answer at once (its work runs off the loop
 * thread) takes a ticket naming the session and the request id, returns KVP_DEFERRED, and the
 * answer is sent when the work completes, on the loop thread, if the session still exists. A
 * session that ended meanwhile has its ticket dropped at completion. Replies of one connection
 * may then leave out of order: the wire's request ids pair them. Tickets are bounded per session,
 * per uid (so that the sessions of one user cannot hold them all) and in all (LIMIT_EXCEEDED past
 * any). */
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "fail.h"

struct kvp_reply; /* reply.h */

/* What a handler (and kvp_dispatch) returns when the answer comes later through a ticket:
 * beyond every Code. */
#define KVP_DEFERRED 0x10000

#define KVP_DEFER_PER_SESSION 8 /* tickets one session may hold */
#define KVP_DEFER_MAX 256	/* tickets in all */
/* Tickets the sessions of one uid may hold together: a quarter of those in all, never fewer
 * than one session's. */
#define KVP_DEFER_PER_UID (KVP_DEFER_MAX / 4)

struct kvp_defer {
	uint64_t session_id;
	uint32_t uid; /* the session's */
	uint64_t req_id;
	int call_case;
	struct timespec started;
	struct kvp_defer *next;		       /* the owner's list (a waiting reload's) */
	struct kvp_defer *all_prev, *all_next; /* every live ticket */
};

/* Sends r to the session's connection when it still exists (the callee packs r, the caller
 * releases it); returns whether it went. Set by the event loop. */
typedef bool (*kvp_defer_deliver_fn)(void *ctx, const struct kvp_defer *t, struct kvp_reply *r,
				     int code);

struct kvp_defers {
	struct kvp_defer *all;
	uint32_t n;
	/* 0: the defaults; per_uid's is a quarter of max, at least per_session (so
	 * KVP_DEFER_PER_UID with the default max). */
	uint32_t max, per_session, per_uid;
	kvp_defer_deliver_fn deliver;
	void *ctx;
	uint64_t answered, dropped; /* delivered, and dropped for a session gone */
	/* Reload calls waiting for a reload that starts after them (rpc_admin.c, reload.c). */
	struct kvp_defer *reload_waiting;
};

/* A ticket for request req_id of session session_id of user uid; NULL with f filled
 * (LIMIT_EXCEEDED with the limit named: pending_replies, session_pending_replies,
 * uid_pending_replies; or INTERNAL out of memory). */
struct kvp_defer *kvp_defer_take(struct kvp_defers *ds, uint64_t session_id, uint32_t uid,
				 uint64_t req_id, int call_case, struct kvp_fail *f);
/* Tickets held for session_id. */
uint32_t kvp_defer_count(const struct kvp_defers *ds, uint64_t session_id);
/* Tickets held for the sessions of uid. */
uint32_t kvp_defer_count_uid(const struct kvp_defers *ds, uint32_t uid);
/* Sends r (initialised with t->req_id and built by the caller; a failure when code != 0) and
 * frees t. The caller releases r. */
void kvp_defer_answer(struct kvp_defers *ds, struct kvp_defer *t, struct kvp_reply *r, int code);
/* Gives t back unanswered (the call answers at once after all) and frees it. */
void kvp_defer_drop(struct kvp_defers *ds, struct kvp_defer *t);
/* Answers t with the typed failure f, and frees t. */
void kvp_defer_fail(struct kvp_defers *ds, struct kvp_defer *t, const struct kvp_fail *f);
