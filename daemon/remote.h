/* remote.h - the remote tier's driver: one struct kvp_rc (remote_cluster.h) made into a single
 * pollable fd for the io_uring loop.
 *
 * The loop owns all remote state on its own thread: the cluster client never blocks, so
 * nothing needs a second thread, and completions (a spilled page acknowledged, a Match's
 * existence answer, a fetched page) touch pools and deferred replies directly, with no hand-off.
 * The client's sockets go into an epoll set and its next deadline into a timerfd in the same
 * set; the loop keeps one poll SQE on the epoll fd (a loop source) and calls
 * kvp_remote_on_ready() when it completes, then kvp_remote_sync() once per loop turn (and after
 * submitting operations), which re-reads the client's fds when kvp_rc_fds_gen() changed and
 * re-arms the timer when the deadline moved. Nothing here waits: epoll_wait with timeout 0. */
#pragma once
#include <stdint.h>

#include "config.h"
#include "stats.h"

struct kvp_rc;
struct kvp_remote;

/* A driver for the cluster of conf (which must be enabled), NULL with errno set (EINVAL: bad
 * seeds; ENOMEM; or the errno of epoll_create1 / timerfd_create). */
struct kvp_remote *kvp_remote_new(const struct kvp_remote_conf *conf);
/* Completes everything in flight with KVP_RC_ECLOSED and closes the fds. Accepts NULL. */
void kvp_remote_free(struct kvp_remote *r);

/* The fd to poll for POLLIN: readable when a socket of the client or its timer is. */
int kvp_remote_fd(const struct kvp_remote *r);
/* The fd was readable (or whenever): runs what is ready, then the client's tick, then
 * kvp_remote_sync(). Completion callbacks run in here. */
void kvp_remote_on_ready(struct kvp_remote *r);
/* Brings the epoll set and the timer up to date with the client. Cheap when nothing changed. */
void kvp_remote_sync(struct kvp_remote *r);
/* An extra wake-up at at_ms on kvp_rc_now_ms() (-1: none), for deadlines of the owner's own
 * (a Match waiting for its existence query): kvp_remote_on_ready() runs then. */
void kvp_remote_set_alarm(struct kvp_remote *r, int64_t at_ms);
/* The client, to submit operations on (call kvp_remote_sync() after). */
struct kvp_rc *kvp_remote_rc(struct kvp_remote *r);
const struct kvp_remote_conf *kvp_remote_conf(const struct kvp_remote *r);
/* The client's figures now. */
void kvp_remote_stats_read(const struct kvp_remote *r, struct kvp_remote_stats *out);
