/* dispatch.h - RPC dispatch: a table indexed by the Request's oneof case. */
#pragma once
#include "daemon.h"
#include "kvpool.pb-c.h"
#include "reply.h"

/* Serves one decoded request of session s into r (never fails: errors become a Status).
 * Returns the Code of the answer, or KVP_DEFERRED when the handler took a ticket (defer.h): r
 * is then not sent, the answer comes when the work completes. */
int kvp_dispatch(struct kvp_daemon *d, struct kvp_session *s, const Kvpool__Request *req,
		 struct kvp_reply *r);

/* kvp_dispatch for a request decoded from payload[0, len): a string field holding a NUL byte
 * (which the decoded C string would silently cut: "pool\0x" read as "pool") is refused
 * INVALID_ARGUMENT before any handler runs. */
int kvp_dispatch_frame(struct kvp_daemon *d, struct kvp_session *s, const Kvpool__Request *req,
		       const uint8_t *payload, size_t len, struct kvp_reply *r);

/* Allocs waiting for demotions in flight (rpc_lease.c). Retries every one: answers those that
 * get their pages or can no longer get them, drops those whose session ended. */
void kvp_rpc_alloc_retry(struct kvp_daemon *d);
