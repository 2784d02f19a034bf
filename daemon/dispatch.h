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
