/* loop_ring.h - what loop_ring.c offers the loop's other files: the ring's setup, arming and
 * cancelling the loop's operations, and the ready list. */
#pragma once
#include "loop_server.h"

/* Sets up sv's ring, its provided receive buffers, the request arena and the signalfd. 0 or a
 * negative errno (logged where the ring refuses). */
int kvp_loop_ring_setup(struct server *sv);
/* The server's own operations, armed again where a completion or a full ring left them not. */
void kvp_loop_ring_rearm(struct server *sv);
/* Puts p on the ready list: looked at again next turn. */
void kvp_loop_ring_ready(struct server *sv, struct peer *p);
/* Each arms its operation unless it is in flight or not wanted now; without an SQE, a
 * connection's goes on the ready list and the server's wait for kvp_loop_ring_rearm. */
void kvp_loop_ring_arm_signal(struct server *sv);
void kvp_loop_ring_arm_timer(struct server *sv);
void kvp_loop_ring_arm_upkeep(struct server *sv);
void kvp_loop_ring_arm_remote(struct server *sv);
void kvp_loop_ring_arm_disk(struct server *sv);
void kvp_loop_ring_arm_work(struct server *sv);
void kvp_loop_ring_arm_recv(struct server *sv, struct peer *p);
void kvp_loop_ring_arm_pidfd(struct server *sv, struct peer *p);
/* One send for as many of p's queued replies as fit (one alone when it carries descriptors). */
void kvp_loop_ring_arm_send(struct server *sv, struct peer *p);
void kvp_loop_ring_cancel_accept(struct server *sv);
void kvp_loop_ring_cancel_pidfd(struct server *sv, struct peer *p);
/* Gives receive buffer bid back to the provided-buffer ring. */
void kvp_loop_ring_recycle(struct server *sv, unsigned bid);
