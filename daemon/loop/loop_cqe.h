/* loop_cqe.h - what loop_cqe.c offers the loop's other files: the completion handlers of the
 * loop's sources (src.h), and the remote tier's run after a turn. */
#pragma once
#include "loop_server.h"

kvp_src_fn kvp_loop_cqe_recv, kvp_loop_cqe_send, kvp_loop_cqe_pidfd; /* a connection's */
kvp_src_fn kvp_loop_cqe_signal, kvp_loop_cqe_work, kvp_loop_cqe_upkeep, kvp_loop_cqe_remote;
kvp_src_fn kvp_loop_cqe_ignore; /* cancellations */
/* The remote tier's socket work, when its fd was readable this turn; its poll armed again. */
void kvp_loop_cqe_remote_run(struct server *sv);
/* The disk tier's completions, when its eventfd was readable this turn; its poll armed again. */
kvp_src_fn kvp_loop_cqe_disk;
void kvp_loop_cqe_disk_run(struct server *sv);
