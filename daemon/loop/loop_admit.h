/* loop_admit.h - what loop_admit.c offers the loop's other files: accepting connections,
 * refusing calls and input past the limits, and failed pidfds. */
#pragma once
#include "kvpool.pb-c.h"
#include "loop_server.h"

/* The accept completion (src.h): admits or refuses the new connection, or backs off when
 * descriptors or memory ran out. */
kvp_src_fn kvp_loop_admit_accept;
/* Whether p waits on the buffer budget (replies queued past it): neither served nor read. */
bool kvp_loop_admit_budget_hold(const struct server *sv, const struct peer *p);
/* Whether req of p is refused before dispatch: true with f filled (*close set for a refused
 * Hello). */
bool kvp_loop_admit_call(struct server *sv, struct peer *p, const Kvpool__Request *req,
			 struct kvp_fail *f, bool *close);
/* Whether n more input bytes of p are refused for the buffer budget (counted and logged). */
bool kvp_loop_admit_input_refused(struct server *sv, struct peer *p, size_t n);
/* A pidfd of pid could not be had or polled (err): counted, logged at most once a minute. */
void kvp_loop_admit_pidfd_failed(struct server *sv, pid_t pid, int err);
