/* loop_tick.h - what loop_tick.c offers the loop's other files: the tick's handler, the
 * status line and kvpoold's descriptor count. */
#pragma once
#include "loop_server.h"

/* The tick timer's completion (src.h): deadlines, upkeep and reports, every 100 ms. */
kvp_src_fn kvp_loop_tick;
/* Sends systemd the STATUS= line: pools, sessions, pages in use, draining, reloading. */
void kvp_loop_tick_status(struct server *sv);
/* Counts kvpoold's descriptors other than its connections' (fds_other) at now. */
void kvp_loop_tick_count_fds(struct server *sv, uint64_t now);
