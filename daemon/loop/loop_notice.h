/* loop_notice.h - what loop_notice.c offers the loop's other files: pushing the pressure
 * notices sessions are owed. */
#pragma once
#include "loop_server.h"

/* Queues the notices owed to sessions that read the previous ones (tick: the tick's look at
 * those still pending). */
void kvp_loop_notice_push(struct server *sv, bool tick);
/* Takes the pools' events (pool.h) and acts on them: an allocation short of free pages queues
 * the pressure notices it causes (with the figures from before it), landed demotions retry
 * the Allocs waiting for them. Called after each call served, before its reply is queued, and
 * after each completion reaped. */
void kvp_loop_pool_events(struct server *sv);
