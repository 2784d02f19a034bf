/* loop_peer.h - what loop_peer.c offers the loop's other files: a connection's replies,
 * flush, close and free, and its buffers' accounting. */
#pragma once
#include "loop_server.h"

/* Counts p's input buffer again in the buffer budget after it grew or shrank. */
void kvp_loop_peer_account_input(struct server *sv, struct peer *p);
/* Frees a reply buffer and uncounts it. */
void kvp_loop_peer_free_obuf(struct server *sv, struct obuf *o);
/* Frees p and everything it holds (its session already ended). */
void kvp_loop_peer_free(struct server *sv, struct peer *p);
/* Frees p when it is closing and nothing refers to it any more. */
void kvp_loop_peer_maybe_free(struct server *sv, struct peer *p);
/* Ends p (logged with why when not NULL): its session goes at once, its memory once no hold
 * is left. */
void kvp_loop_peer_close(struct server *sv, struct peer *p, const char *why);
/* Nothing more is read from p; it closes once its queue is sent (by deadline_ms if nonzero). */
void kvp_loop_peer_flush(struct peer *p, uint64_t deadline_ms);
/* Packs r into p's queue. One that cannot be queued closes p, or marks it while
 * sv->hold_closes (kvp_loop_peer_close_owed closes it). */
void kvp_loop_peer_reply(struct server *sv, struct peer *p, struct kvp_reply *r);
/* Closes the connections marked while they could not be. */
void kvp_loop_peer_close_owed(struct server *sv);
/* A status with id 0 (code, what), then p flushes and closes. */
void kvp_loop_peer_fail_close(struct server *sv, struct peer *p, int code, const char *what);
/* kvp_loop_peer_fail_close with PROTOCOL, counted in protocol_errors. */
void kvp_loop_peer_protocol_error(struct server *sv, struct peer *p, const char *what);
/* The reply at the head of p's queue could not pass its descriptors: it becomes
 * LIMIT_EXCEEDED. false when no error reply could be made. */
bool kvp_loop_peer_fd_reply_refused(struct server *sv, struct peer *p);
