/* loop.h - the io_uring server: accept, receive, dispatch, send, signals and timers, all on
 * one thread (sources: src.h; connection state: conn.h). Blocking work such as a reload's pool
 * creation runs on a worker thread (work.h, reload.h) and is applied back on this one. */
#pragma once
#include <signal.h>

#include "daemon.h"

/* Per-connection limits (conn.h applies them). */
#define KVP_TURN_BUDGET 32	  /* frames served per connection per loop turn */
#define KVP_SEND_IOV 64		  /* replies gathered into one sendmsg */
#define KVP_OUTQ_MAX (8u << 20)	  /* queued reply bytes before a connection stops being read */
#define KVP_PARTIAL_FRAME_MS 5000 /* a half-sent frame must complete within this */
#define KVP_STOP_FLUSH_MS 2000	  /* at shutdown, replies get this long to leave */
#define KVP_SUMMARY_MS 10000	  /* eviction summary lines, at most one per pool per interval */

/* Blocks SIGTERM, SIGINT and SIGHUP (delivered later through the loop's signalfd) and writes
 * that set to mask. Called first thing in main, so a signal sent as soon as the socket
 * accepts is not lost to its default action. */
void kvp_signals_block(sigset_t *mask);

/* Serves listen_fd until SIGTERM/SIGINT or the end of a drain. unlink_path (may be NULL) is
 * removed when listening stops. `notify` reports READY/STATUS/STOPPING/WATCHDOG.
 * Returns the process exit code. */
int kvp_server_run(struct kvp_daemon *d, int listen_fd, const char *unlink_path);
