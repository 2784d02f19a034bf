/* rpc.h - what the RPC handlers (rpc_session.c, rpc_lease.c, rpc_cache.c, rpc_admin.c) share
 * with dispatch.c's table: the handler signature, the handlers, and small helpers. Internal to
 * the daemon's dispatch. */
#pragma once
#include "daemon.h"
#include "kvpool.pb-c.h"
#include "reply.h"
#include "session.h"

/* A handler validates everything before it changes anything. Returns 0 with r's result set,
 * a negative Code with f filled (dispatch then drops any partial result), or KVP_DEFERRED
 * when it took a ticket and answers later (defer.h). */
typedef int (*kvp_rpc_handler)(struct kvp_daemon *d, struct kvp_session *s,
			       const Kvpool__Request *q, struct kvp_reply *r, struct kvp_fail *f);

#define KVP_RPC_HANDLER(name)                                                                      \
	int name(struct kvp_daemon *d, struct kvp_session *s, const Kvpool__Request *q,            \
		 struct kvp_reply *r, struct kvp_fail *f)

/* rpc_session.c: the session's own calls. */
KVP_RPC_HANDLER(kvp_rpc_hello);
KVP_RPC_HANDLER(kvp_rpc_ping);
KVP_RPC_HANDLER(kvp_rpc_attach);
KVP_RPC_HANDLER(kvp_rpc_detach);
/* rpc_lease.c: leases. */
KVP_RPC_HANDLER(kvp_rpc_alloc);
KVP_RPC_HANDLER(kvp_rpc_extend);
KVP_RPC_HANDLER(kvp_rpc_free);
/* The session of that id, or NULL (it is gone). */
struct kvp_session *kvp_rpc_session_by_id(struct kvp_daemon *d, uint64_t id);
/* rpc_cache.c: the prefix cache. */
KVP_RPC_HANDLER(kvp_rpc_insert);
KVP_RPC_HANDLER(kvp_rpc_match);
KVP_RPC_HANDLER(kvp_rpc_release);
KVP_RPC_HANDLER(kvp_rpc_load);
/* rpc_keys.c: hash-keyed pages. */
KVP_RPC_HANDLER(kvp_rpc_insert_keys);
KVP_RPC_HANDLER(kvp_rpc_match_keys);
KVP_RPC_HANDLER(kvp_rpc_exists_keys);
/* A call's keys against the limits: 0, or a negative Code with f filled (LIMIT_EXCEEDED past
 * max_keys_per_call or max_key_bytes, INVALID_ARGUMENT for none or an empty key). */
int kvp_rpc_keys_check(const struct kvp_daemon *d, const char *call, const ProtobufCBinaryData *k,
		       size_t n, struct kvp_fail *f);
/* rpc_reserve.c: the page reserve's refill, return and binds. */
KVP_RPC_HANDLER(kvp_rpc_reserve);
/* rpc_fetch.c: Fetch from the tiers below host, and Match's count of the pages there: after a
 * local Match or MatchKeys answered m (lock taken and booked already), when pages follow the
 * local ones and p's disk tier holds the next ones, m says how many (disk_pages, and
 * remote_pages unless local_only) and is answered now; else, when the remote tier serves p,
 * one query of the next pages is asked and the reply parked: KVP_DEFERRED, and m's fields are
 * sent later with remote_pages set. Otherwise 0 (answer m now). Never fails the call: a query
 * that cannot be asked is remote_pages 0. */
KVP_RPC_HANDLER(kvp_rpc_fetch);
int kvp_rpc_match_below(struct kvp_daemon *d, struct kvp_session *s, const Kvpool__Request *q,
			struct kvpd_pool *p, Kvpool__MatchResp *m);
int kvp_rpc_match_keys_below(struct kvp_daemon *d, struct kvp_session *s, const Kvpool__Request *q,
			     struct kvpd_pool *p, Kvpool__MatchKeysResp *m);
/* rpc_admin.c: status, listings and admin calls. */
KVP_RPC_HANDLER(kvp_rpc_status);
KVP_RPC_HANDLER(kvp_rpc_evict);
KVP_RPC_HANDLER(kvp_rpc_flush);
KVP_RPC_HANDLER(kvp_rpc_drain);
KVP_RPC_HANDLER(kvp_rpc_reload);
KVP_RPC_HANDLER(kvp_rpc_sessions);
KVP_RPC_HANDLER(kvp_rpc_cache);
KVP_RPC_HANDLER(kvp_rpc_metrics);

/* dispatch.c: helpers. */
/* INTERNAL "kvpoold is out of memory". Returns its negative Code. */
int kvp_rpc_oom(struct kvp_fail *f);
/* A pool's geometry in wire terms (Dtype counts from FP16 = 1). */
void kvp_rpc_pool_geom(const struct kvpd_pool *p, struct kvp_geom *g);
/* The pool of that name, or NULL. */
struct kvpd_pool *kvp_rpc_pool_by_name(struct kvp_daemon *d, const char *name);
/* Most page ids one reply may list for pool p (every id at the varint size of p's largest page
 * id) so that the reply fits in one frame. */
uint32_t kvp_rpc_pages_per_reply(const struct kvpd_pool *p);
/* LIMIT_EXCEEDED for a reply of npages page ids over kvp_rpc_pages_per_reply. Returns its
 * negative Code. */
int kvp_rpc_reply_too_large(const struct kvpd_pool *p, const char *what, uint64_t npages,
			    struct kvp_fail *f);
/* NO_SUCH_POOL naming the pools there are. Returns its negative Code. */
int kvp_rpc_no_such_pool(const struct kvp_daemon *d, const char *name, struct kvp_fail *f);
