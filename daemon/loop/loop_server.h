/* loop_server.h - the event loop's state, shared by its files (loop.c and loop_*.c): the
 * server, its connections (peers) and their queued replies, the buffer sizes they share, and
 * the stop loop.c offers the others. Internal to kvpoold's loop. */
#pragma once
#include <liburing.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/signalfd.h>
#include <sys/socket.h>

#include "conn.h"
#include "daemon.h"
#include "frame.h"
#include "log.h"
#include "loop.h"
#include "reply.h"
#include "src.h"

#define BUFSZ (16u << 10)
#define IN_KEEP (64u << 10) /* an input buffer beyond this is given back once drained */

/* Queued reply bytes: one or more whole frames. Replies of a turn are packed one after another
 * into the tail buffer; one that carries descriptors gets a buffer of its own. Bytes appended
 * while a sendmsg covering the front of the buffer is in flight are sent by the next one. */
struct obuf {
	struct obuf *next;
	size_t len, off, cap;
	int fds[KVP_REPLY_MAX_FDS];
	int nfds;
	uint64_t req_id; /* of the reply carrying fds: answered with an error if they cannot go */
	uint8_t data[];
};

#define OBUF_CAP (4u << 10) /* a turn of small replies; each connection keeps one spare */

/* A connection: its state machine (conn.h) and its I/O. */
struct peer {
	struct conn c;
	int fd;
	int pidfd;
	struct kvp_src recv_src, send_src, pid_src;
	bool pid_cancel_sent; /* the poll of pidfd is being removed */
	struct kvp_frame_buf in;
	struct obuf *oq_head, *oq_tail;
	struct obuf *spare; /* a sent OBUF_CAP buffer, reused by the next reply */
	struct kvp_session *sess;
	/* A reply could not be queued where p could not be closed (while an allocation is in
	 * progress: kvp_loop_pool_events): nothing more is queued to it, kvp_loop_peer_close_owed
	 * closes it with this reason from the top of the loop. */
	const char *close_why;
	/* Bytes of frames queued and sent so far; notice_mark: queued_total after the last
	 * pressure notice, 0 once the peer has read it (kvp_loop_notice_push). */
	uint64_t queued_total, sent_total, notice_mark;
	bool admin;
	bool greeted_counted; /* counted in n_greeted, else (not closing) in n_prehello */
	size_t in_acct;	      /* bytes of in counted in the buffer budget */
	uint32_t fd_replies;  /* replies with fds sent whose bytes the peer may not have read */
	struct peer *ready_next;
	struct peer *prev, *next;
	struct msghdr msg;
	struct iovec iov[KVP_SEND_IOV];
	union {
		char buf[CMSG_SPACE(sizeof(int) * KVP_REPLY_MAX_FDS)];
		size_t align;
	} cmsg;
};

struct server {
	struct io_uring ring;
	struct kvp_daemon *d;
	int listen_fd;
	const char *unlink_path;
	struct kvp_src accept_src, signal_src, timer_src, work_src, ignore_src, upkeep_src;
	bool accept_armed, accept_cancel_sent, signal_armed, timer_armed, work_armed;
	bool upkeep_armed; /* the reserves' timer (kvp_loop_cqe_upkeep) */
	struct __kernel_timespec upkeep_ts;
	uint64_t upkeep_from; /* the session the next walk starts at (the last ran out before it) */
	bool remote_armed;
	bool remote_ready; /* its fd was readable: run it once this turn's connections are served */
	struct kvp_src remote_src;
	bool disk_armed, disk_ready; /* the disk tier's eventfd, as the remote tier's fd */
	struct kvp_src disk_src;
	bool retry; /* an operation found no SQE: retry it this turn, do not sleep */
	/* Nonzero while code up the stack uses sessions (kvp_loop_pool_events): a reply that
	 * cannot be queued marks its connection (close_why) instead of closing it; closes_owed:
	 * some is marked. */
	unsigned hold_closes;
	bool closes_owed;
	int sig_fd;
	struct signalfd_siginfo si;
	struct __kernel_timespec tick;
	struct io_uring_buf_ring *br;
	uint8_t *bufs;
	struct peer *conns;
	uint32_t nconns;
	struct peer *ready;
	bool stopping;
	uint64_t stop_deadline_ms;
	uint64_t watchdog_ms, last_watchdog_ms, last_status_ms, last_metrics_ms, last_summary_ms;
	struct kvp_metrics_http *http;
	struct kvp_arena arena; /* the request being served is decoded into it */
	struct conn_limits lim;
	struct kvp_work *work;
	uint64_t work_count;
	bool reload_busy; /* a reload job is queued or running */
	bool no_peerpidfd;
	uint64_t pidfd_log_ms, pidfd_unlogged;
	int exit_code;
	/* Admission (admit.h): connections by state, descriptors, buffer bytes. */
	uint32_t n_prehello, n_greeted;
	uint64_t fd_limit, conn_fds, fds_other, last_fdcount_ms;
	uint64_t buf_bytes;
	uint64_t accept_retry_ms, accept_backoff_ms; /* accept waits after EMFILE until then */
	struct kvp_log_limit log_accept, log_refuse, log_send, log_hello;
};

#define OBUF_BYTES(o) (sizeof(struct obuf) + (o)->cap)

/* loop.c: stops serving (SIGTERM, SIGINT, the end of a drain; why is logged): accept is
 * cancelled, the requests already received are answered, every connection closes once its
 * replies are sent. Does nothing when already stopping. */
void kvp_loop_stop(struct server *sv, const char *why);
