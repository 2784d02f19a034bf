/* loop_notice.h - what loop_notice.c offers the loop's other files: pushing the pressure
 * notices sessions are owed. */
#pragma once
#include "loop_server.h"

/* Queues the notices owed to sessions that read the previous ones (tick: the tick's look at
 * those still pending). */
void kvp_loop_notice_push(struct server *sv, bool tick);
/* The pool's hook (kvp_pool_on_short, ctx the server): an allocation of tier of p is short of
 * free pages; the notices it causes are queued ahead of its reply. */
void kvp_loop_notice_short(void *ctx, struct kvpd_pool *p, int tier);
