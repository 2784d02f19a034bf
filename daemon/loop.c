/* loop.c - kvpoold's io_uring event loop.
 *
 * One thread owns all state. Every SQE carries a loop source (src.h): multishot accept on the
 * listening socket; per connection at most one recv (buffer-selected from a shared
 * provided-buffer ring), one send and one poll of the peer's pidfd; a read of the signalfd; a
 * timeout that ticks the deadline and watchdog checks; a read of the worker's eventfd (work.h)
 * that completes jobs such as a reload's pool creation off this thread. A connection's state,
 * budget and deadlines are conn.c's: it gets its turn budget of frames per turn and is not
 * read while its output queue is full, so a client that pipelines without reading stalls only
 * itself. When no SQE is to be had (the ring is full), the operation is retried next turn. A
 * call whose handler defers its answer (defer.h: a Reload waiting for its pools) is answered
 * by deliver_deferred when the work completes, to its session's connection if still open. */
#include "loop.h"

#include <dirent.h>
#include <errno.h>
#include <liburing.h>
#include <malloc.h>
#include <linux/sockios.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "admit.h"
#include "conn.h"
#include "dispatch.h"
#include "fault.h"
#include "frame.h"
#include "log.h"
#include "snapshot.h"
#include "metrics.h"
#include "metrics_http.h"
#include "notify.h"
#include "pressure.h"
#include "reload.h"
#include "reserve.h"
#include "src.h"
#include "work.h"
#include "kvp_config.h"
#if KVP_HAVE_REMOTE
#include "remote.h"
#include "remote_tier.h"
#endif

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif

#define RING_ENTRIES 1024
#define BUF_GROUP 7
#define NBUFS 256
#define BUFSZ (16u << 10)
#define TICK_MS 100
#define UPKEEP_MS 5		   /* sessions' page reserves are looked at this often */
#define ARENA_BYTES (64u << 10)	   /* a decoded request beyond this spills to malloc */
#define FAIL_FLUSH_MS 1000	   /* a connection closed for an error has this long to read why */
#define PIDFD_LOG_MS 60000	   /* at most one log line per interval about failed pidfds */
#define REPEAT_LOG_MS 5000	   /* at most one line per interval of each repeated event */
#define ACCEPT_BACKOFF_MS 50	   /* accept waits this long after EMFILE, doubling, */
#define ACCEPT_BACKOFF_MAX_MS 1000 /* up to this */
#define FDCOUNT_MS 1000		   /* kvpoold's own descriptors are counted again this often */
#define IN_KEEP (64u << 10)	   /* an input buffer beyond this is given back once drained */

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
	 * progress: on_short): nothing more is queued to it, close_owed closes it with this
	 * reason from the top of the loop. */
	const char *close_why;
	/* Bytes of frames queued and sent so far; notice_mark: queued_total after the last
	 * pressure notice, 0 once the peer has read it (push_notices). */
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
	bool upkeep_armed; /* the reserves' timer (on_upkeep) */
	struct __kernel_timespec upkeep_ts;
	uint64_t upkeep_from; /* the session the next walk starts at (the last ran out before it) */
	bool remote_armed;
	bool remote_ready; /* its fd was readable: run it once this turn's connections are served */
	struct kvp_src remote_src;
	bool retry; /* an operation found no SQE: retry it this turn, do not sleep */
	/* Nonzero while code up the stack uses sessions (on_short): a reply that cannot be queued
	 * marks its connection (close_why) instead of closing it; closes_owed: some is marked. */
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

/* An SQE for src, or NULL when the ring is full even after a submit (then sv->retry is set:
 * the caller leaves its operation unarmed and it is tried again next turn). */
static struct io_uring_sqe *get_sqe(struct server *sv)
{
	struct io_uring_sqe *sqe = NULL;

	if (!kvp_fault_hit(KVP_FAULT_SQE)) {
		sqe = io_uring_get_sqe(&sv->ring);
		if (!sqe) {
			io_uring_submit(&sv->ring);
			sqe = io_uring_get_sqe(&sv->ring);
		}
	}
	if (!sqe)
		sv->retry = true;
	return sqe;
}

/* The counts admission rules look at (admit.h). */
static struct kvp_admit_counts admit_counts(const struct server *sv)
{
	return (struct kvp_admit_counts){
		.prehello = sv->n_prehello,
		.sessions = sv->n_greeted,
		.fds_used = sv->fds_other + sv->conn_fds,
		.fd_limit = sv->fd_limit,
		.buf_bytes = sv->buf_bytes,
	};
}

static bool over_budget(const struct server *sv)
{
	return sv->buf_bytes >= kvp_admit_buffer_budget(&sv->d->conf);
}

/* Whether p waits on the buffer budget: past it, a connection with replies queued is neither
 * served nor read until they drain. */
static bool budget_hold(const struct server *sv, const struct peer *p)
{
	return p->c.out_bytes && over_budget(sv);
}

/* The input buffer's memory, counted again after it grew or shrank. */
static void in_account(struct server *sv, struct peer *p)
{
	sv->buf_bytes = sv->buf_bytes - p->in_acct + p->in.cap;
	p->in_acct = p->in.cap;
}

static void obuf_free(struct server *sv, struct obuf *o)
{
	sv->buf_bytes -= OBUF_BYTES(o);
	free(o);
}

static void arm_accept(struct server *sv)
{
	struct io_uring_sqe *sqe;

	if (sv->accept_armed || sv->listen_fd < 0 || sv->stopping)
		return;
	if (sv->accept_retry_ms && kvp_now_ms() < sv->accept_retry_ms)
		return; /* backing off after running out of descriptors: the tick tries again */
	sqe = get_sqe(sv);
	if (!sqe)
		return;
	io_uring_prep_multishot_accept(sqe, sv->listen_fd, NULL, NULL, SOCK_CLOEXEC);
	io_uring_sqe_set_data(sqe, &sv->accept_src);
	sv->accept_armed = true;
}

static void cancel_accept(struct server *sv)
{
	struct io_uring_sqe *sqe;

	if (!sv->accept_armed || sv->accept_cancel_sent)
		return;
	sqe = get_sqe(sv);
	if (!sqe)
		return;
	io_uring_prep_cancel64(sqe, (uint64_t)(uintptr_t)&sv->accept_src, 0);
	io_uring_sqe_set_data(sqe, &sv->ignore_src);
	sv->accept_cancel_sent = true;
}

static void arm_signal(struct server *sv)
{
	struct io_uring_sqe *sqe;

	if (sv->signal_armed)
		return;
	sqe = get_sqe(sv);
	if (!sqe)
		return;
	io_uring_prep_read(sqe, sv->sig_fd, &sv->si, sizeof(sv->si), 0);
	io_uring_sqe_set_data(sqe, &sv->signal_src);
	sv->signal_armed = true;
}

static void arm_timer(struct server *sv)
{
	struct io_uring_sqe *sqe;

	if (sv->timer_armed)
		return;
	sqe = get_sqe(sv);
	if (!sqe)
		return;
	sv->tick.tv_sec = 0;
	sv->tick.tv_nsec = TICK_MS * 1000000L;
	io_uring_prep_timeout(sqe, &sv->tick, 0, 0);
	io_uring_sqe_set_data(sqe, &sv->timer_src);
	sv->timer_armed = true;
}

/* The reserves' timer: armed while some session has a page reserve. */
static void arm_upkeep(struct server *sv)
{
	struct io_uring_sqe *sqe;

	if (sv->upkeep_armed || !sv->d->n_reserves || sv->stopping)
		return;
	sqe = get_sqe(sv);
	if (!sqe)
		return;
	sv->upkeep_ts.tv_sec = 0;
	sv->upkeep_ts.tv_nsec = UPKEEP_MS * 1000000L;
	io_uring_prep_timeout(sqe, &sv->upkeep_ts, 0, 0);
	io_uring_sqe_set_data(sqe, &sv->upkeep_src);
	sv->upkeep_armed = true;
}

/* Refills and drains of the sessions' reserves that their clients did not ask for (a client
 * that allocates from its ring makes no call): every session in turn, from where the last
 * walk stopped, while the turn's page budget lasts. A session the budget left cannot pay for
 * starts the next walk (with the whole budget, which pays for any one session). */
static void on_upkeep(void *loop, struct kvp_src *src, const struct io_uring_cqe *cqe)
{
	struct server *sv = loop;
	struct kvp_daemon *d = sv->d;
	uint32_t budget = KVP_RESERVE_TURN_PAGES;
	struct kvp_session *s, *from = d->sessions;

	(void)src;
	(void)cqe;
	sv->upkeep_armed = false;
	for (s = d->sessions; s && sv->upkeep_from; s = s->next)
		if (s->id == sv->upkeep_from) {
			from = s;
			break;
		}
	sv->upkeep_from = 0;
	for (s = from; s;) {
		if (!kvp_reserve_upkeep(d, s, &budget)) {
			sv->upkeep_from = s->id;
			break;
		}
		s = s->next ? s->next : d->sessions;
		if (s == from)
			break;
		if (!budget) {
			sv->upkeep_from = s->id;
			break;
		}
	}
	arm_upkeep(sv);
}

/* The remote tier's one fd: readable when a cluster socket or its timer is (remote.h). */
static void arm_remote(struct server *sv)
{
#if KVP_HAVE_REMOTE
	struct io_uring_sqe *sqe;

	if (sv->remote_armed || !sv->d->remote)
		return;
	sqe = get_sqe(sv);
	if (!sqe)
		return;
	io_uring_prep_poll_add(sqe, kvp_remote_fd(sv->d->remote), POLLIN);
	io_uring_sqe_set_data(sqe, &sv->remote_src);
	sv->remote_armed = true;
#else
	(void)sv;
#endif
}

static void on_remote(void *loop, struct kvp_src *src, const struct io_uring_cqe *cqe)
{
	struct server *sv = loop;

	(void)src;
	sv->remote_armed = false;
	if (cqe->res < 0 && cqe->res != -ECANCELED)
		log_warn("remote tier poll: %s", strerror(-cqe->res));
	sv->remote_ready = true; /* run_remote, after the connections with input */
}

/* The remote tier's socket work of this turn, after the requests that arrived with it were
 * answered: a local call waits for no network I/O that is merely ready at the same time. */
static void run_remote(struct server *sv)
{
	if (!sv->remote_ready)
		return;
	sv->remote_ready = false;
#if KVP_HAVE_REMOTE
	if (sv->d->remote) {
		kvp_remote_on_ready(sv->d->remote);
		kvp_rt_expire(sv->d);
	}
#endif
	arm_remote(sv);
}

static void arm_work(struct server *sv)
{
	struct io_uring_sqe *sqe;

	if (sv->work_armed || !sv->work)
		return;
	sqe = get_sqe(sv);
	if (!sqe)
		return;
	io_uring_prep_read(sqe, kvp_work_fd(sv->work), &sv->work_count, sizeof(sv->work_count), 0);
	io_uring_sqe_set_data(sqe, &sv->work_src);
	sv->work_armed = true;
}

/* Puts p on the ready list: it is looked at again next turn (served, re-armed, or freed). */
static void mark_ready(struct server *sv, struct peer *p)
{
	if (conn_held(&p->c, CONN_HOLD_READY))
		return;
	conn_hold(&p->c, CONN_HOLD_READY);
	p->ready_next = sv->ready;
	sv->ready = p;
}

static void arm_recv(struct server *sv, struct peer *p)
{
	struct io_uring_sqe *sqe;

	if (!conn_may_recv(&p->c) || sv->stopping)
		return;
	/* Backpressure: while complete frames wait to be served, nothing more is read (they
	 * are served first, a turn budget at a time). */
	if (kvp_frame_ready(&p->in) || budget_hold(sv, p))
		return;
	sqe = get_sqe(sv);
	if (!sqe) {
		mark_ready(sv, p);
		return;
	}
	io_uring_prep_recv(sqe, p->fd, NULL, BUFSZ, 0);
	sqe->flags |= IOSQE_BUFFER_SELECT;
	sqe->buf_group = BUF_GROUP;
	io_uring_sqe_set_data(sqe, &p->recv_src);
	conn_hold(&p->c, CONN_HOLD_RECV);
}

static void arm_pidfd(struct server *sv, struct peer *p)
{
	struct io_uring_sqe *sqe;

	if (p->pidfd < 0 || conn_held(&p->c, CONN_HOLD_PIDFD) || conn_closing(&p->c))
		return;
	sqe = get_sqe(sv);
	if (!sqe) {
		mark_ready(sv, p);
		return;
	}
	io_uring_prep_poll_add(sqe, p->pidfd, POLLIN);
	io_uring_sqe_set_data(sqe, &p->pid_src);
	conn_hold(&p->c, CONN_HOLD_PIDFD);
}

/* One send for as many queued replies as fit in KVP_SEND_IOV (a plain send for one buffer, else
 * sendmsg); a reply that carries descriptors goes alone, so they travel with its first byte. */
static void arm_send(struct server *sv, struct peer *p)
{
	struct obuf *o = p->oq_head;
	struct io_uring_sqe *sqe;
	size_t n = 0;

	if (conn_held(&p->c, CONN_HOLD_SEND) || !o || conn_closing(&p->c))
		return;
	sqe = get_sqe(sv);
	if (!sqe) {
		mark_ready(sv, p);
		return;
	}
	memset(&p->msg, 0, sizeof(p->msg));
	if (o->nfds && o->off == 0) {
		struct cmsghdr *cm;

		p->msg.msg_control = p->cmsg.buf;
		p->msg.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)o->nfds);
		cm = CMSG_FIRSTHDR(&p->msg);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)o->nfds);
		memcpy(CMSG_DATA(cm), o->fds, sizeof(int) * (size_t)o->nfds);
		p->iov[n].iov_base = o->data;
		p->iov[n++].iov_len = o->len;
	} else {
		for (; o && n < KVP_SEND_IOV && !(o->nfds && o->off == 0); o = o->next) {
			p->iov[n].iov_base = o->data + o->off;
			p->iov[n++].iov_len = o->len - o->off;
		}
	}
	if (n == 1 && !p->msg.msg_control) { /* the common case: no msghdr for the kernel to read */
		io_uring_prep_send(sqe, p->fd, p->iov[0].iov_base, p->iov[0].iov_len, MSG_NOSIGNAL);
	} else {
		p->msg.msg_iov = p->iov;
		p->msg.msg_iovlen = n;
		io_uring_prep_sendmsg(sqe, p->fd, &p->msg, MSG_NOSIGNAL);
	}
	io_uring_sqe_set_data(sqe, &p->send_src);
	conn_hold(&p->c, CONN_HOLD_SEND);
}

static void conn_free(struct server *sv, struct peer *p)
{
	struct obuf *o, *n;

	for (o = p->oq_head; o; o = n) {
		n = o->next;
		obuf_free(sv, o);
	}
	if (p->spare)
		obuf_free(sv, p->spare);
	kvp_frame_buf_release(&p->in);
	in_account(sv, p);
	if (p->pidfd >= 0) {
		close(p->pidfd);
		sv->conn_fds--;
	}
	close(p->fd);
	sv->conn_fds--;
	if (p->prev)
		p->prev->next = p->next;
	else
		sv->conns = p->next;
	if (p->next)
		p->next->prev = p->prev;
	sv->nconns--;
	free(p);
}

/* Frees a closing connection once nothing refers to it: no operation in flight, not on the
 * ready list, not being served (a receive and a close can complete in the same batch). */
static void conn_maybe_free(struct server *sv, struct peer *p)
{
	if (conn_freeable(&p->c))
		conn_free(sv, p);
}

/* Removes the poll of p's pidfd (its completion then releases the hold); retried next turn
 * when no SQE is to be had. */
static void cancel_pidfd(struct server *sv, struct peer *p)
{
	struct io_uring_sqe *sqe;

	if (!conn_held(&p->c, CONN_HOLD_PIDFD) || p->pid_cancel_sent)
		return;
	sqe = get_sqe(sv);
	if (!sqe) {
		mark_ready(sv, p);
		return;
	}
	io_uring_prep_poll_remove(sqe, (uint64_t)(uintptr_t)&p->pid_src);
	io_uring_sqe_set_data(sqe, &sv->ignore_src);
	p->pid_cancel_sent = true;
}

/* Ends a connection: its session (leases, locks) is returned at once; the memory goes when
 * the last hold is released. */
static void conn_close(struct server *sv, struct peer *p, const char *why)
{
	if (conn_closing(&p->c))
		return;
	conn_set_state(&p->c, CONN_CLOSING);
	if (p->greeted_counted)
		sv->n_greeted--;
	else
		sv->n_prehello--;
	if (p->sess) {
		if (why)
			log_info("session %lu ('%s' pid %d): %s", (unsigned long)p->sess->id,
				 p->sess->name, (int)p->sess->pid, why);
		/* Stopping: a session that may resume after the restart stays, without its
		 * connection, until the books are written (kvp_snap_write_all). */
		if (!(sv->stopping && p->sess->hello && sv->d->conf.resume_grace_ms))
			kvp_session_destroy(sv->d, p->sess);
		p->sess = NULL;
	}
	shutdown(p->fd, SHUT_RDWR);
	cancel_pidfd(sv, p);
	conn_maybe_free(sv, p);
}

/* After the last reply is queued: nothing more is read; the connection closes once it is
 * sent (by deadline_ms when nonzero). */
static void conn_flush(struct peer *p, uint64_t deadline_ms)
{
	if (p->c.state == CONN_FLUSHING || conn_set_state(&p->c, CONN_FLUSHING) == 0)
		if (deadline_ms)
			conn_flush_deadline(&p->c, deadline_ms);
}

/* Room for a frame of len bytes at the tail of p's queue: the tail buffer when the frame fits
 * and neither carries descriptors, else a new buffer. NULL on ENOMEM. */
static struct obuf *queue_room(struct server *sv, struct peer *p, size_t len, int nfds)
{
	struct obuf *o = p->oq_tail;

	if (o && !o->nfds && !nfds && o->cap - o->len >= len)
		return o;
	if (kvp_fault_hit(KVP_FAULT_REPLY_QUEUE))
		return NULL;
	if (p->spare && len <= OBUF_CAP) {
		o = p->spare;
		p->spare = NULL;
	} else {
		o = malloc(sizeof(*o) + (len > OBUF_CAP ? len : OBUF_CAP));
		if (!o)
			return NULL;
		sv->buf_bytes += sizeof(*o) + (len > OBUF_CAP ? len : OBUF_CAP);
	}
	o->next = NULL;
	o->len = o->off = 0;
	o->cap = len > OBUF_CAP ? len : OBUF_CAP;
	o->nfds = 0;
	if (p->oq_tail)
		p->oq_tail->next = o;
	else
		p->oq_head = o;
	p->oq_tail = o;
	return o;
}

/* Packs a reply straight into p's queue; a reply too large for one frame becomes an INTERNAL
 * status. */
static void send_reply(struct server *sv, struct peer *p, struct kvp_reply *r)
{
	struct kvp_frame_plan plan;
	size_t len = kvp_frame_plan(&plan, &r->resp.base);
	struct obuf *o;

	if (p->close_why)
		return; /* its stream already lacks a frame: it closes at the top of the loop */
	if (len > KVP_FRAME_HDR + KVP_FRAME_MAX) {
		struct kvp_fail f = { 0 };
		uint64_t id = r->resp.id;

		kvp_reply_release(r);
		kvp_reply_init(r, id);
		kvp_fail(&f, KVP_ERR_INTERNAL, "reply does not fit in one frame");
		kvp_reply_fail(r, &f);
		len = kvp_frame_plan(&plan, &r->resp.base);
	}
	if (r->resp.result_case == KVPOOL__RESPONSE__RESULT_PRESSURE &&
	    kvp_fault_hit(KVP_FAULT_NOTICE))
		o = NULL; /* tests: this notice cannot be queued */
	else
		o = queue_room(sv, p, len, r->nfds);
	if (!o && sv->hold_closes) {
		p->close_why = "out of memory queueing a reply";
		sv->closes_owed = true;
		return;
	}
	if (!o) {
		conn_close(sv, p, "out of memory queueing a reply");
		return;
	}
	o->len += kvp_frame_pack_plan(&plan, o->data + o->len);
	o->nfds = r->nfds;
	o->req_id = r->resp.id;
	memcpy(o->fds, r->fds, sizeof(int) * (size_t)r->nfds);
	conn_outq_add(&p->c, len, kvp_now_ms());
	p->queued_total += len;
	sv->d->st.frames_out++;
	if (r->close_after)
		conn_flush(p, 0);
}

/* Whether p's peer has read the last pressure notice sent to it: all of it sent, and what
 * waits unread in the socket (SIOCOUTQ: the newest bytes, counted with their buffers'
 * overhead, so never fewer than they are) fits in what was sent after it. */
static bool notice_read(struct peer *p)
{
	int unread = 0;

	if (!p->notice_mark)
		return true;
	if (p->sent_total < p->notice_mark || ioctl(p->fd, SIOCOUTQ, &unread) < 0 || unread < 0 ||
	    (uint64_t)unread > p->sent_total - p->notice_mark)
		return false;
	p->notice_mark = 0;
	return true;
}

/* Pressure notices (pressure.h) owed to sessions, pushed as Responses with id 0. A session's
 * notices go once it has read the previous ones, so one that never reads holds one batch in
 * its socket and the rest pending in kvpoold (one per pool and tier, replaced by newer
 * states); nothing else changes for it (it is neither paused nor timed out). Looked at when a
 * tier's state changed or a session subscribed, and on the tick while some are pending. */
static void push_notices(struct server *sv, bool tick)
{
	struct kvp_daemon *d = sv->d;
	bool pending = false, serving;
	uint64_t now;

	if (sv->stopping || !kvp_pressure_scan(d, tick))
		return;
	now = kvp_now_ms();
	for (struct peer *p = sv->conns, *n; p; p = n) {
		n = p->next;
		if (!p->sess || p->c.state != CONN_OPEN || p->close_why ||
		    !kvp_pressure_owed(d, p->sess))
			continue;
		if (!notice_read(p)) {
			pending = true;
			continue;
		}
		/* a reply that cannot be queued closes p, or from on_short marks it (close_why);
		 * p may be the connection being served (an allocation's notices go out before it
		 * evicts: on_short) */
		serving = conn_held(&p->c, CONN_HOLD_SERVE);
		conn_hold(&p->c, CONN_HOLD_SERVE);
		while (p->sess && !p->close_why) {
			struct kvp_reply r;
			int rc;

			kvp_reply_init(&r, 0);
			rc = kvp_pressure_next(d, p->sess, now, &r);
			if (rc > 0) {
				send_reply(sv, p, &r);
				p->notice_mark = p->queued_total;
			}
			kvp_reply_release(&r);
			if (rc <= 0)
				break;
		}
		if (p->sess && kvp_pressure_owed(d, p->sess))
			pending = true; /* its pool's rate limit: the tick tries again */
		if (serving)
			continue; /* its server sends, releases and frees it */
		arm_send(sv, p);
		conn_release(&p->c, CONN_HOLD_SERVE);
		if (conn_closing(&p->c))
			conn_maybe_free(sv, p);
	}
	kvp_pressure_walked(d, pending);
}

/* An allocation is about to take more pages than are free (pool.h): when that puts its tier
 * under pressure, the notices are queued now, ahead of the allocation's reply and of any
 * eviction or OUT_OF_CAPACITY it causes. No connection closes here: the allocation's caller
 * still uses its session (and may walk others), so one whose notice cannot be queued is
 * closed by close_owed once the loop is back at its top. */
static void on_short(void *ctx, struct kvpd_pool *p, int tier)
{
	struct server *sv = ctx;

	if (!kvp_pressure_short(sv->d, p, tier))
		return;
	sv->hold_closes++;
	push_notices(sv, false);
	sv->hold_closes--;
}

/* Closes the connections marked while they could not be (close_why). Called where nothing up
 * the stack uses a session or a connection. A close may end other sessions' work: the walk
 * starts again after each. */
static void close_owed(struct server *sv)
{
	while (sv->closes_owed) {
		const char *why;
		struct peer *p;

		sv->closes_owed = false;
		for (p = sv->conns; p && !p->close_why; p = p->next)
			;
		if (!p)
			break;
		sv->closes_owed = true;
		why = p->close_why;
		p->close_why = NULL;
		conn_close(sv, p, why); /* p may be freed now */
	}
}

static bool decode_spill_fails(void)
{
	return kvp_fault_hit(KVP_FAULT_DECODE);
}

/* A typed status with id 0 (the request could not be read, so it belongs to no call), then the
 * connection ends. p stays allocated until the caller is done with it (it checks the state). */
static void fail_close(struct server *sv, struct peer *p, int code, const char *what)
{
	struct kvp_reply r;
	struct kvp_fail f = { 0 };
	bool serving = conn_held(&p->c, CONN_HOLD_SERVE);

	conn_hold(&p->c, CONN_HOLD_SERVE);
	log_warn("connection of pid %d: %s: closing it", p->sess ? (int)p->sess->pid : -1, what);
	kvp_reply_init(&r, 0);
	kvp_fail(&f, code, "%s", what);
	kvp_reply_fail(&r, &f);
	r.close_after = true;
	send_reply(sv, p, &r);
	kvp_reply_release(&r);
	conn_flush(p, kvp_now_ms() + FAIL_FLUSH_MS);
	arm_send(sv, p);
	p->in.len = p->in.off = 0; /* nothing more is read from this stream */
	if (!serving)
		conn_release(&p->c, CONN_HOLD_SERVE);
}

static void protocol_error(struct server *sv, struct peer *p, const char *what)
{
	sv->d->st.protocol_errors++;
	fail_close(sv, p, KVP_ERR_PROTOCOL, what);
}

static uint64_t ms_of(const struct timespec *t)
{
	return (uint64_t)t->tv_sec * 1000 + (uint64_t)t->tv_nsec / 1000000;
}

static double elapsed_us(const struct timespec *a, const struct timespec *b)
{
	return (double)(b->tv_sec - a->tv_sec) * 1e6 + (double)(b->tv_nsec - a->tv_nsec) / 1e3;
}

/* Serves p's complete frames, up to its budget. Each request is decoded into the server's
 * arena, dispatched and its reply packed into p's queue; the time from the end of one to the
 * end of the next (decode, dispatch, pack: one clock read per request) is the call's
 * server-side latency. */
/* Replies with descriptors p's peer may not have read yet: those queued, and those sent while
 * its socket still holds unread bytes (every one of them then, to be safe: SIOCOUTQ counts
 * memory, not which reply). Descriptors in flight count against kvpoold's RLIMIT_NOFILE. */
static uint32_t fd_replies_in_flight(struct peer *p)
{
	uint32_t n = 0;
	int unread = 0;

	for (struct obuf *o = p->oq_head; o; o = o->next)
		n += o->nfds && o->off == 0;
	if (p->fd_replies && ioctl(p->fd, SIOCOUTQ, &unread) == 0 && unread == 0)
		p->fd_replies = 0;
	return n + p->fd_replies;
}

/* Whether req gives back what its session holds (Free, Release, Detach): never refused for the
 * buffer budget, its reply is small. */
static bool gives_back(const Kvpool__Request *req)
{
	return req->call_case == KVPOOL__REQUEST__CALL_FREE ||
	       req->call_case == KVPOOL__REQUEST__CALL_RELEASE ||
	       req->call_case == KVPOOL__REQUEST__CALL_DETACH;
}

/* Admission of one call before it is dispatched: a Hello past max_sessions (admin slots kept),
 * an Attach past the descriptors in flight of its connection, a call of a non-admin past the
 * buffer budget (unless it gives back). Returns true with f filled (and *close set for a
 * refused Hello) when req is refused: nothing of it is done. */
static bool refuse_call(struct server *sv, struct peer *p, const Kvpool__Request *req,
			struct kvp_fail *f, bool *close)
{
	struct kvp_admit_counts n = admit_counts(sv);
	struct kvp_daemon *d = sv->d;
	uint64_t now = kvp_now_ms();

	if (!p->admin && !gives_back(req) && over_budget(sv)) {
		kvp_admit_buffer(&d->conf, &n, 1, f);
		d->st.refused_buffers++;
		kvp_log_limited(&sv->log_refuse, now, LOG_WARNING,
				"refused a call of pid %d uid %u: %s", (int)p->sess->pid,
				(unsigned)p->sess->uid, f->msg);
		return true;
	}
	if (req->call_case == KVPOOL__REQUEST__CALL_HELLO && !p->greeted_counted &&
	    kvp_admit_hello(&d->conf, &n, p->admin, f) != KVP_ADMIT_OK) {
		d->st.refused_sessions++;
		d->st.connections_refused++;
		*close = true;
		kvp_log_limited(&sv->log_refuse, now, LOG_WARNING,
				"refused the Hello of pid %d uid %u: %s", (int)p->sess->pid,
				(unsigned)p->sess->uid, f->msg);
		return true;
	}
	if (req->call_case == KVPOOL__REQUEST__CALL_ATTACH &&
	    fd_replies_in_flight(p) >= KVP_ATTACH_FDS_INFLIGHT) {
		kvp_fail_limit(f, "Attach replies in flight", KVP_ATTACH_FDS_INFLIGHT);
		kvp_fail(f, KVP_ERR_LIMIT_EXCEEDED,
			 "%u Attach replies with descriptors are not read yet: read them first",
			 KVP_ATTACH_FDS_INFLIGHT);
		d->st.refused_attach_fds++;
		kvp_log_limited(&sv->log_refuse, now, LOG_NOTICE,
				"refused an Attach of session %lu (pid %d): %s",
				(unsigned long)p->sess->id, (int)p->sess->pid, f->msg);
		return true;
	}
	return false;
}

/* After a turn: which of the client's deadlines run. While complete requests wait (kvpoold is
 * behind) neither the half-frame clock nor the keep-alive runs; the half-frame clock runs only
 * while kvpoold reads and holds part of a frame, from the last frame served (served: this turn
 * served one). A large input buffer is given back once drained. */
static void note_input(struct server *sv, struct peer *p, bool served, uint64_t now)
{
	bool waiting = kvp_frame_ready(&p->in) || budget_hold(sv, p);

	conn_backlog(&p->c, waiting);
	if (served) /* the stream moves: whatever part of a frame is held is a new one */
		conn_input_note(&p->c, false, now);
	conn_input_note(&p->c, !waiting && !conn_paused(&p->c) && kvp_frame_pending(&p->in), now);
	if (p->in.cap > IN_KEEP && kvp_frame_pending(&p->in) <= IN_KEEP / 4) {
		kvp_frame_buf_shrink(&p->in, 0);
		in_account(sv, p);
	}
}

/* Serves p's complete frames, up to its budget. Each request is decoded into the server's
 * arena, dispatched and its reply packed into p's queue; the time from the end of one to the
 * end of the next (decode, dispatch, pack: one clock read per request) is the call's
 * server-side latency. */
static void serve_frames_budget(struct server *sv, struct peer *p)
{
	struct timespec prev, now;
	bool served = false;

	clock_gettime(CLOCK_MONOTONIC, &prev);
	now = prev;
	conn_turn_begin(&p->c);
	while (conn_serving(&p->c) && !conn_paused(&p->c) && !p->close_why && !budget_hold(sv, p)) {
		const uint8_t *payload;
		Kvpool__Request *req;
		struct kvp_reply r;
		struct kvp_fail f = { 0 };
		bool refused_close = false;
		uint32_t len;
		int n, code;

		if (!conn_turn_take(&p->c)) {
			mark_ready(sv, p); /* more next turn, after everyone else */
			break;
		}
		n = kvp_frame_next(&p->in, &payload, &len);
		if (n < 0) {
			protocol_error(sv, p, "frame larger than the maximum");
			return;
		}
		if (n == 0)
			break;
		sv->d->st.frames_in++;
		req = kvp_frame_decode_request_in(&sv->arena, payload, len);
		if (!req) {
			bool oom = sv->arena.oom;

			kvp_arena_reset(&sv->arena);
			if (oom) /* the request may be fine; its id is not known */
				fail_close(sv, p, KVP_ERR_INTERNAL,
					   "out of memory decoding a request");
			else
				protocol_error(sv, p, "frame is not a valid Request");
			return;
		}
		if (!served)
			p->sess->last_ms = ms_of(&prev); /* a call is activity, from its start */
		kvp_reply_init(&r, req->id);
		if (refuse_call(sv, p, req, &f, &refused_close)) {
			kvp_reply_fail(&r, &f);
			code = (int)f.code;
			r.close_after = refused_close;
		} else {
			code = kvp_dispatch_frame(sv->d, p->sess, req, payload, len, &r);
		}
		if (p->c.state == CONN_HANDSHAKE && p->sess->hello) {
			conn_set_state(&p->c, CONN_OPEN);
			p->greeted_counted = true;
			sv->n_prehello--;
			sv->n_greeted++;
		}
		if (code != KVP_DEFERRED) /* else deliver_deferred sends it later */
			send_reply(sv, p, &r);
		kvp_reply_release(&r);
		clock_gettime(CLOCK_MONOTONIC, &now);
		if (code != KVP_DEFERRED)
			kvp_rpc_observe(&sv->d->rpc, (int)req->call_case, code,
					elapsed_us(&prev, &now));
		kvp_arena_reset(&sv->arena);
		prev = now;
		served = true;
	}
	if (served && p->sess) {
		p->sess->last_ms = ms_of(&now);
		conn_activity(&p->c, ms_of(&now));
	}
	note_input(sv, p, served, kvp_now_ms());
}

/* Serves a connection's complete frames (up to its budget), then sends the replies of the
 * turn together. A connection closed meanwhile (a reply that could not be queued) is freed
 * here, not under the code still using it. Returns false when p is closing: the caller must
 * not touch it any more. */
static bool serve_frames(struct server *sv, struct peer *p)
{
	conn_hold(&p->c, CONN_HOLD_SERVE);
	serve_frames_budget(sv, p);
	if (p->sess && !p->close_why && sv->d->n_reserves) {
		uint32_t budget = KVP_RESERVE_TURN_PAGES; /* pays for any one session */

		kvp_reserve_upkeep(sv->d, p->sess, &budget);
	}
	arm_send(sv, p);
	conn_release(&p->c, CONN_HOLD_SERVE);
	if (conn_closing(&p->c)) {
		conn_maybe_free(sv, p);
		return false;
	}
	return true;
}

/* A deferred reply (defer.h) is ready: it goes to the connection of its session, if that
 * session is still served; its latency runs from the call's arrival. */
static bool deliver_deferred(void *ctx, const struct kvp_defer *t, struct kvp_reply *r, int code)
{
	struct server *sv = ctx;
	struct timespec now;
	struct peer *p;

	for (p = sv->conns; p; p = p->next)
		if (p->sess && p->sess->id == t->session_id)
			break;
	if (!p || conn_closing(&p->c)) {
		log_info("deferred reply to request %lu of session %lu dropped: the session ended",
			 (unsigned long)t->req_id, (unsigned long)t->session_id);
		return false;
	}
	clock_gettime(CLOCK_MONOTONIC, &now);
	kvp_rpc_observe(&sv->d->rpc, t->call_case, code, elapsed_us(&t->started, &now));
	conn_hold(&p->c, CONN_HOLD_SERVE); /* a reply that cannot be queued closes p */
	send_reply(sv, p, r);
	arm_send(sv, p);
	conn_release(&p->c, CONN_HOLD_SERVE);
	if (conn_closing(&p->c))
		conn_maybe_free(sv, p);
	return true;
}

static void recycle_buffer(struct server *sv, unsigned bid)
{
	io_uring_buf_ring_add(sv->br, sv->bufs + (size_t)bid * BUFSZ, BUFSZ, (unsigned short)bid,
			      io_uring_buf_ring_mask(NBUFS), 0);
	io_uring_buf_ring_advance(sv->br, 1);
}

static void reject(struct server *sv, int fd, const struct kvp_fail *f)
{
	struct kvp_reply r;
	uint8_t *buf;
	size_t len;

	kvp_reply_init(&r, 0);
	kvp_reply_fail(&r, f);
	/* A fresh socket's buffer is empty: this small send cannot block. */
	if (kvp_frame_pack(&r.resp.base, &buf, &len) == 0) {
		if (send(fd, buf, len, MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
			log_debug("reject: send: %s", strerror(errno));
		free(buf);
	}
	kvp_reply_release(&r);
	close(fd);
	sv->d->st.connections_refused++;
}

/* Every supplementary group of the peer (SO_PEERGROUPS, grown until they fit): *out is groups
 * when they fit in it, else malloc'ed. Returns the count, or a negative errno. */
static int peer_groups(int fd, gid_t *groups, int ngroups, gid_t **out)
{
	socklen_t len = (socklen_t)(sizeof(gid_t) * (size_t)ngroups);
	gid_t *g = groups;

	for (;;) {
		socklen_t got = len;

		if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, g, &got) == 0) {
			*out = g;
			return (int)(got / sizeof(gid_t));
		}
		if (errno != ERANGE || got <= len) {
			int e = -errno;

			if (g != groups)
				free(g);
			return e;
		}
		if (g != groups)
			free(g);
		len = got;
		g = malloc(len);
		if (!g)
			return -ENOMEM;
	}
}

/* A failed pidfd: the peer's exit is not tracked (only keep-alive reclaims its session).
 * Counted; logged at most once per PIDFD_LOG_MS. */
static void pidfd_failed(struct server *sv, pid_t pid, int err)
{
	uint64_t now = kvp_now_ms();

	sv->d->st.pidfd_failures++;
	sv->pidfd_unlogged++;
	if (sv->pidfd_log_ms && now - sv->pidfd_log_ms < PIDFD_LOG_MS)
		return;
	log_warn("no pidfd for pid %d (%s): its exit is not tracked, only keep-alive reclaims its "
		 "session (%lu peers so far without one)",
		 (int)pid, strerror(err), (unsigned long)sv->d->st.pidfd_failures);
	sv->pidfd_log_ms = now ? now : 1;
	sv->pidfd_unlogged = 0;
}

/* The peer's pidfd: SO_PEERPIDFD names the process that connected even when its pid was reused
 * since; pidfd_open of the SO_PEERCRED pid is the fallback for kernels without it. -ESRCH when
 * SO_PEERPIDFD says that process is gone already (pidfd_open could then find another process
 * under its pid); -1 when neither way gives a pidfd (counted and logged). */
static int peer_pidfd(struct server *sv, int fd, pid_t pid)
{
	int pfd = -1, err;

	if (kvp_fault_hit(KVP_FAULT_PIDFD)) {
		pidfd_failed(sv, pid, EMFILE);
		return -1;
	}
	if (!sv->no_peerpidfd) {
		socklen_t len = sizeof(pfd);

		if (kvp_fault_hit(KVP_FAULT_PEER_PIDFD))
			errno = ENOPROTOOPT;
		else if (getsockopt(fd, SOL_SOCKET, SO_PEERPIDFD, &pfd, &len) == 0 && pfd >= 0)
			return pfd;
		if (errno == ESRCH)
			return -ESRCH;
		if (errno == ENOPROTOOPT) {
			log_info("SO_PEERPIDFD not supported here: peers' pidfds come from "
				 "pidfd_open after accept");
			sv->no_peerpidfd = true;
		} else {
			log_debug("SO_PEERPIDFD of pid %d: %s: trying pidfd_open", (int)pid,
				  strerror(errno));
		}
	}
	pfd = (int)syscall(SYS_pidfd_open, pid, 0);
	if (pfd >= 0)
		return pfd;
	err = errno;
	if (err == ESRCH) /* the peer is gone already: nothing of it to serve */
		return -ESRCH;
	pidfd_failed(sv, pid, err);
	return -1;
}

static kvp_src_fn on_recv, on_send, on_pidfd;

/* The admission rules for a new connection (admit.h): descriptors, pre-Hello connections, the
 * uid's connections. 0, or -1 with f filled (counted and logged, at most a line per interval). */
static int admit_connection(struct server *sv, const struct ucred *cred, bool admin,
			    struct kvp_fail *f)
{
	struct kvp_admit_counts n = admit_counts(sv);
	struct kvp_daemon_stats *st = &sv->d->st;

	n.fds_used++; /* the accepted socket */
	for (struct peer *q = sv->conns; q; q = q->next)
		n.uid_conns += !conn_closing(&q->c) && q->sess && q->sess->uid == cred->uid;
	switch (kvp_admit_connect(&sv->d->conf, &n, admin, cred->uid, f)) {
	case KVP_ADMIT_OK: return 0;
	case KVP_ADMIT_FDS: st->refused_fds++; break;
	case KVP_ADMIT_PREHELLO: st->refused_prehello++; break;
	default: st->refused_uid++; break;
	}
	kvp_log_limited(&sv->log_refuse, kvp_now_ms(), LOG_WARNING,
			"refused connection of pid %d uid %u%s: %s", (int)cred->pid,
			(unsigned)cred->uid, admin ? " (admin)" : "", f->msg);
	return -1;
}

static void on_accept(struct server *sv, int fd)
{
	struct ucred cred;
	socklen_t clen = sizeof(cred);
	gid_t groups_buf[64], *groups = groups_buf;
	struct kvp_fail f = { 0 };
	struct peer *p;
	bool admin = false;
	int ngroups, r, pidfd;

	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) < 0) {
		log_warn("accept: SO_PEERCRED: %s", strerror(errno));
		close(fd);
		return;
	}
	ngroups = peer_groups(fd, groups_buf, 64, &groups);
	if (ngroups < 0) {
		log_warn("accept: pid %d: SO_PEERGROUPS: %s: its supplementary groups do not count",
			 (int)cred.pid, strerror(-ngroups));
		groups = groups_buf;
		ngroups = 0;
	}
	if (sv->stopping) { /* a drain refuses non-admins at Hello (kvp_rpc_hello) */
		kvp_fail(&f, KVP_ERR_SHUTTING_DOWN, "kvpoold is shutting down");
		r = -1;
	} else {
		r = kvp_daemon_admit(sv->d, cred.pid, cred.uid, cred.gid, groups, ngroups, &admin,
				     &f);
		if (r < 0)
			kvp_log_limited(&sv->log_refuse, kvp_now_ms(), LOG_NOTICE,
					"refused connection of pid %d uid %u: not allowed",
					(int)cred.pid, (unsigned)cred.uid);
	}
	if (r == 0 && admit_connection(sv, &cred, admin, &f) < 0)
		r = -1;
	if (r < 0) {
		reject(sv, fd, &f);
		goto out;
	}
	/* The session belongs to the peer process: when it exits, even with the socket still
	 * open in a forked child, everything it held returns. */
	pidfd = peer_pidfd(sv, fd, cred.pid);
	if (pidfd == -ESRCH) {
		log_info("pid %d exited before its connection was accepted", (int)cred.pid);
		close(fd);
		goto out;
	}
	p = KVP_FAULT_OR(KVP_FAULT_CONN, calloc(1, sizeof(*p)));
	if (!p) {
		log_warn("refused connection of pid %d: out of memory", (int)cred.pid);
		kvp_fail(&f, KVP_ERR_INTERNAL, "out of memory");
		goto refuse;
	}
	p->sess = kvp_session_new(sv->d, cred.pid, cred.uid, cred.gid, admin, &f);
	if (!p->sess) {
		free(p);
		kvp_log_limited(&sv->log_refuse, kvp_now_ms(), LOG_WARNING,
				"refused connection of pid %d: %s", (int)cred.pid, f.msg);
		goto refuse;
	}
	if (kvp_session_set_groups(p->sess, groups, ngroups) < 0) {
		kvp_session_destroy(sv->d, p->sess);
		free(p);
		log_warn("refused connection of pid %d: out of memory", (int)cred.pid);
		kvp_fail(&f, KVP_ERR_INTERNAL, "out of memory");
		goto refuse;
	}
	p->fd = fd;
	p->pidfd = pidfd;
	p->admin = admin;
	sv->conn_fds += 1 + (pidfd >= 0);
	sv->n_prehello++;
	conn_init(&p->c, &sv->lim, kvp_now_ms());
	conn_watch_exit(&p->c, pidfd >= 0);
	kvp_src_init(&p->recv_src, KVP_SRC_RECV, on_recv, p);
	kvp_src_init(&p->send_src, KVP_SRC_SEND, on_send, p);
	kvp_src_init(&p->pid_src, KVP_SRC_PIDFD, on_pidfd, p);
	kvp_frame_buf_init(&p->in);
	p->next = sv->conns;
	if (sv->conns)
		sv->conns->prev = p;
	sv->conns = p;
	sv->nconns++;
	arm_recv(sv, p);
	arm_pidfd(sv, p);
	goto out;
refuse:
	if (pidfd >= 0)
		close(pidfd);
	reject(sv, fd, &f);
out:
	if (groups != groups_buf)
		free(groups);
}

static void on_accept_cqe(void *loop, struct kvp_src *src, const struct io_uring_cqe *cqe)
{
	struct server *sv = loop;
	int res = cqe->res;

	(void)src;
	if (!(cqe->flags & IORING_CQE_F_MORE)) {
		sv->accept_armed = false;
		sv->accept_cancel_sent = false;
	}
	if (res >= 0 && kvp_fault_hit(KVP_FAULT_ACCEPT)) {
		close(res);
		res = -EMFILE;
	}
	if (res >= 0) {
		sv->accept_backoff_ms = 0;
		on_accept(sv, res);
		return;
	}
	if (res == -ECANCELED)
		return;
	sv->d->st.accept_errors++;
	if (res == -EMFILE || res == -ENFILE || res == -ENOBUFS || res == -ENOMEM) {
		/* Out of descriptors or memory: accepting again at once would fail the same way,
		 * forever. Wait, doubling the wait, and let the tick arm it again. */
		uint64_t now = kvp_now_ms();

		sv->accept_backoff_ms =
			sv->accept_backoff_ms ? 2 * sv->accept_backoff_ms : ACCEPT_BACKOFF_MS;
		if (sv->accept_backoff_ms > ACCEPT_BACKOFF_MAX_MS)
			sv->accept_backoff_ms = ACCEPT_BACKOFF_MAX_MS;
		sv->accept_retry_ms = now + sv->accept_backoff_ms;
		if (sv->accept_armed)
			cancel_accept(sv);
		kvp_log_limited(&sv->log_accept, now, LOG_WARNING,
				"accept: %s: trying again in %lu ms", strerror(-res),
				(unsigned long)sv->accept_backoff_ms);
		return;
	}
	kvp_log_limited(&sv->log_accept, kvp_now_ms(), LOG_WARNING, "accept: %s", strerror(-res));
}

/* Whether n more input bytes would grow p's input buffer past IN_KEEP and the buffer budget
 * (admins excepted): the frame is then refused and the connection closed (its id is not known
 * yet, so no call can be answered). */
static bool input_refused(struct server *sv, struct peer *p, size_t n)
{
	size_t need = kvp_frame_pending(&p->in) + n;
	struct kvp_admit_counts c = admit_counts(sv);
	struct kvp_fail f = { 0 };

	if (p->admin || need <= IN_KEEP || need <= p->in.cap)
		return false;
	if (kvp_admit_buffer(&sv->d->conf, &c, need - p->in.cap, &f) == 0)
		return false;
	sv->d->st.refused_buffers++;
	kvp_log_limited(&sv->log_refuse, kvp_now_ms(), LOG_WARNING,
			"input of session %lu (pid %d) refused: %s", (unsigned long)p->sess->id,
			(int)p->sess->pid, f.msg);
	return true;
}

static void on_recv(void *loop, struct kvp_src *src, const struct io_uring_cqe *cqe)
{
	struct server *sv = loop;
	struct peer *p = src->owner;
	int res = cqe->res;

	conn_release(&p->c, CONN_HOLD_RECV);
	if (cqe->flags & IORING_CQE_F_BUFFER) {
		unsigned bid = cqe->flags >> IORING_CQE_BUFFER_SHIFT;
		int r = 0;

		if (res > 0 && conn_serving(&p->c) && input_refused(sv, p, (size_t)res))
			r = -ENOSPC;
		else if (res > 0 && conn_serving(&p->c))
			r = kvp_fault_hit(KVP_FAULT_INPUT)
				    ? -ENOMEM
				    : kvp_frame_buf_append(&p->in, sv->bufs + (size_t)bid * BUFSZ,
							   (size_t)res);
		in_account(sv, p);
		if (r == -EMSGSIZE)
			protocol_error(sv, p, "frame larger than the maximum");
		else if (r == -ENOSPC)
			fail_close(sv, p, KVP_ERR_LIMIT_EXCEEDED,
				   "the input does not fit in kvpoold's buffer budget");
		else if (r < 0)
			fail_close(sv, p, KVP_ERR_INTERNAL,
				   "out of memory for the connection's input");
		recycle_buffer(sv, bid);
	}
	if (conn_closing(&p->c)) {
		conn_maybe_free(sv, p);
		return;
	}
	if (res == -ENOBUFS) {
		mark_ready(sv, p); /* re-armed next turn, once buffers came back */
		return;
	}
	if (res <= 0) {
		conn_close(sv, p, res == 0 ? "client closed the connection" : "receive failed");
		return;
	}
	mark_ready(sv, p);
}

/* The reply at the head of p's queue carries descriptors the kernel would not pass
 * (ETOOMANYREFS: too many of kvpoold's descriptors are in flight; EMFILE, ENFILE): that call
 * alone fails, LIMIT_EXCEEDED in place of its reply; the connection goes on. Returns false
 * when no error reply could be made (then the connection closes). */
static bool fd_reply_refused(struct server *sv, struct peer *p)
{
	struct obuf *o = p->oq_head, *e;
	struct kvp_reply r;
	struct kvp_fail f = { 0 };
	struct kvp_frame_plan plan;
	size_t len;

	kvp_reply_init(&r, o->req_id);
	kvp_fail_limit(&f, "descriptors in flight", sv->fd_limit);
	kvp_fail(&f, KVP_ERR_LIMIT_EXCEEDED,
		 "the pool's memory descriptors cannot be passed now: too many of kvpoold's "
		 "descriptors are in flight to clients that have not read them; try again");
	kvp_reply_fail(&r, &f);
	len = kvp_frame_plan(&plan, &r.resp.base);
	e = malloc(sizeof(*e) + len);
	if (!e) {
		kvp_reply_release(&r);
		return false;
	}
	e->cap = len;
	e->len = kvp_frame_pack_plan(&plan, e->data);
	e->off = 0;
	e->nfds = 0;
	e->req_id = o->req_id;
	e->next = o->next;
	kvp_reply_release(&r);
	sv->buf_bytes += OBUF_BYTES(e);
	p->oq_head = e;
	if (p->oq_tail == o)
		p->oq_tail = e;
	conn_outq_add(&p->c, e->len, kvp_now_ms()); /* before: the queue never looks empty */
	conn_outq_sent(&p->c, o->len);
	obuf_free(sv, o);
	sv->d->st.refused_attach_fds++;
	kvp_log_limited(&sv->log_send, kvp_now_ms(), LOG_WARNING,
			"session %lu (pid %d): an Attach reply's descriptors could not be passed: "
			"answered LIMIT_EXCEEDED",
			p->sess ? (unsigned long)p->sess->id : 0UL,
			p->sess ? (int)p->sess->pid : -1);
	return true;
}

static void on_send(void *loop, struct kvp_src *src, const struct io_uring_cqe *cqe)
{
	struct server *sv = loop;
	struct peer *p = src->owner;
	int res = cqe->res;
	size_t sent = res > 0 ? (size_t)res : 0;

	conn_release(&p->c, CONN_HOLD_SEND);
	if (conn_closing(&p->c)) {
		conn_maybe_free(sv, p);
		return;
	}
	if ((res == -ETOOMANYREFS || res == -EMFILE || res == -ENFILE) && p->oq_head &&
	    p->oq_head->nfds && p->oq_head->off == 0 && fd_reply_refused(sv, p)) {
		arm_send(sv, p);
		return;
	}
	if (res < 0) {
		kvp_log_limited(&sv->log_send, kvp_now_ms(), LOG_INFO,
				"session %lu ('%s' pid %d): send failed (%s): closing it",
				p->sess ? (unsigned long)p->sess->id : 0UL,
				p->sess ? p->sess->name : "", p->sess ? (int)p->sess->pid : -1,
				strerror(-res));
		conn_close(sv, p, NULL);
		return;
	}
	conn_outq_sent(&p->c, sent);
	p->sent_total += sent;
	if (sent)
		conn_activity(&p->c, kvp_now_ms()); /* the client reads: it is not the one behind */
	while (sent && p->oq_head) {
		struct obuf *o = p->oq_head;
		size_t take = o->len - o->off < sent ? o->len - o->off : sent;

		if (o->nfds && o->off == 0)
			p->fd_replies++;
		o->off += take;
		sent -= take;
		o->nfds = 0; /* descriptors went with the first byte */
		if (o->off < o->len)
			break;
		p->oq_head = o->next;
		if (!p->oq_head)
			p->oq_tail = NULL;
		if (!p->spare && o->cap == OBUF_CAP)
			p->spare = o;
		else
			obuf_free(sv, o);
	}
	if (p->oq_head) {
		arm_send(sv, p);
	} else if (p->c.state == CONN_FLUSHING) {
		conn_close(sv, p, NULL);
		return;
	}
	if (!conn_paused(&p->c))
		mark_ready(sv, p); /* reading resumes when the queue drained below the limit */
}

static void on_pidfd(void *loop, struct kvp_src *src, const struct io_uring_cqe *cqe)
{
	struct server *sv = loop;
	struct peer *p = src->owner;

	conn_release(&p->c, CONN_HOLD_PIDFD);
	p->pid_cancel_sent = false;
	if (conn_closing(&p->c)) {
		conn_maybe_free(sv, p);
	} else if (cqe->res > 0) {
		sv->d->st.sessions_reclaimed++;
		conn_close(sv, p, "client process exited");
	} else {
		/* The poll failed: the exit is no longer watched, so the keep-alive applies. */
		conn_watch_exit(&p->c, false);
		pidfd_failed(sv, p->sess ? p->sess->pid : -1, -cqe->res);
	}
}

static void begin_stop(struct server *sv, const char *why)
{
	if (sv->stopping)
		return;
	log_notice("stopping: %s", why);
	kvp_notify("STOPPING=1");
	sv->stopping = sv->d->stopping = true;
	sv->stop_deadline_ms = kvp_now_ms() + KVP_STOP_FLUSH_MS;
	cancel_accept(sv);
	/* Answer every complete request already received, then close after the flush. */
	for (struct peer *p = sv->conns, *n; p; p = n) {
		n = p->next;
		if (conn_closing(&p->c) || !serve_frames(sv, p))
			continue;
		conn_flush(p, 0);
		if (!p->oq_head)
			conn_close(sv, p, "kvpoold is stopping");
	}
}

static void on_signal(void *loop, struct kvp_src *src, const struct io_uring_cqe *cqe)
{
	struct server *sv = loop;

	(void)src;
	sv->signal_armed = false;
	if (cqe->res == (int)sizeof(sv->si)) {
		switch (sv->si.ssi_signo) {
		case SIGTERM:
		case SIGINT:
			begin_stop(sv, sv->si.ssi_signo == SIGTERM ? "SIGTERM" : "SIGINT");
			break;
		case SIGHUP: sv->d->reload_requested = true; break;
		default: break;
		}
	}
	arm_signal(sv);
}

static void status_line(struct server *sv)
{
	char buf[256];
	uint64_t total = 0, used = 0;

	for (uint32_t i = 0; i < sv->d->n_pools; i++) {
		for (int t = 0; t < KVP_TIER_ID_MAX; t++) {
			struct kvp_tier_counts c;

			kvp_pool_counts(sv->d->pools[i], t, &c);
			total += c.total;
			used += c.leased + c.cached + c.moving;
		}
	}
	snprintf(buf, sizeof(buf), "STATUS=%u pools, %u sessions, %.1f%% of pages in use%s%s",
		 sv->d->n_pools, sv->d->n_sessions,
		 total ? 100.0 * (double)used / (double)total : 0.0,
		 sv->d->draining ? ", draining" : "", sv->reload_busy ? ", reloading" : "");
	kvp_notify(buf);
}

/* kvpoold's descriptors other than its connections' (pools, the ring, reloads, metrics, the
 * remote tier), counted in /proc/self/fd. Kept as it was when they cannot be counted. */
static void count_own_fds(struct server *sv, uint64_t now)
{
	DIR *dir = opendir("/proc/self/fd");
	uint64_t n = 0;
	struct dirent *e;

	sv->last_fdcount_ms = now;
	if (!dir)
		return;
	while ((e = readdir(dir)))
		n += e->d_name[0] != '.';
	closedir(dir);
	n = n ? n - 1 : 0; /* the directory's own */
	sv->fds_other = n > sv->conn_fds ? n - sv->conn_fds : 0;
}

static void on_tick(void *loop, struct kvp_src *src, const struct io_uring_cqe *cqe)
{
	struct server *sv = loop;
	struct kvp_daemon *d = sv->d;
	uint64_t now = kvp_now_ms();

	(void)src;
	(void)cqe;
	sv->timer_armed = false;
	sv->lim.keepalive_ms = d->conf.keepalive_ms; /* a reload may change it */
	sv->lim.handshake_ms = d->conf.hello_timeout_ms;
	for (struct peer *p = sv->conns, *n; p; p = n) {
		enum conn_expiry e;

		n = p->next;
		if (p->sess && p->sess->evicted) { /* a reload took its access away */
			conn_close(sv, p, p->sess->evict_reason);
			continue;
		}
		e = conn_expiry(&p->c, now);
		if (e == CONN_LIVE) {
			/* Frames held back by the buffer budget: looked at again. */
			if (!conn_closing(&p->c) && kvp_frame_ready(&p->in))
				mark_ready(sv, p);
			continue;
		}
		if (e == CONN_EXPIRED_PARTIAL)
			d->st.protocol_errors++;
		else if (e == CONN_EXPIRED_KEEPALIVE || e == CONN_EXPIRED_UNREAD)
			d->st.sessions_reclaimed++;
		if (e == CONN_EXPIRED_HANDSHAKE) {
			d->st.hello_timeouts++;
			kvp_log_limited(&sv->log_hello, now, LOG_INFO,
					"connection of pid %d uid %u: %s: closed",
					p->sess ? (int)p->sess->pid : -1,
					p->sess ? (unsigned)p->sess->uid : 0u,
					conn_expiry_reason(e));
			conn_close(sv, p, NULL);
			continue;
		}
		conn_close(sv, p, conn_expiry_reason(e));
	}
	if (now - sv->last_fdcount_ms >= FDCOUNT_MS)
		count_own_fds(sv, now);
	kvp_log_limit_flush(&sv->log_accept, now);
	kvp_log_limit_flush(&sv->log_refuse, now);
	kvp_log_limit_flush(&sv->log_send, now);
	kvp_log_limit_flush(&sv->log_hello, now);
	d->st.log_suppressed = g_log_suppressed;
	kvp_snap_tick(d, now);
	if (d->draining && !sv->stopping && (d->n_sessions == 0 || now >= d->drain_deadline_ms))
		begin_stop(sv,
			   d->n_sessions ? "drain deadline reached" : "drained: no sessions left");
	if (sv->watchdog_ms && now - sv->last_watchdog_ms >= sv->watchdog_ms / 2) {
		kvp_notify("WATCHDOG=1");
		sv->last_watchdog_ms = now;
	}
	if (sv->http && now - sv->last_metrics_ms >= 1000) {
		char *text = kvp_metrics_render(d);

		if (text)
			kvp_metrics_http_publish(sv->http, text);
		free(text);
		sv->last_metrics_ms = now;
	}
	if (now - sv->last_summary_ms >= KVP_SUMMARY_MS) {
		for (uint32_t i = 0; i < d->n_pools; i++)
			kvp_pool_log_summary(d->pools[i], now - sv->last_summary_ms);
		sv->last_summary_ms = now;
	}
	push_notices(sv, true);
	if (now - sv->last_status_ms >= 5000) {
		status_line(sv);
		sv->last_status_ms = now;
	}
	arm_timer(sv);
}

/* The worker finished jobs: their completions run here, on the loop thread. */
static void on_work(void *loop, struct kvp_src *src, const struct io_uring_cqe *cqe)
{
	struct server *sv = loop;

	(void)src;
	sv->work_armed = false;
	if (cqe->res < 0 && cqe->res != -ECANCELED)
		log_warn("worker eventfd: %s", strerror(-cqe->res));
	kvp_work_reap(sv->work);
	arm_work(sv);
}

static void on_ignore(void *loop, struct kvp_src *src, const struct io_uring_cqe *cqe)
{
	(void)loop;
	(void)src;
	(void)cqe;
}

static void reload_finished(void *ctx)
{
	struct server *sv = ctx;

	sv->reload_busy = false;
	status_line(sv);
}

static int setup(struct server *sv)
{
	struct io_uring_params params = { 0 };
	sigset_t mask;
	int r;

	/* Only this thread touches the ring, so completions can wait until it asks for them
	 * (DEFER_TASKRUN, 6.1+): no task-work interrupts while it serves. Older kernels refuse the
	 * flags; then cooperative task work (5.19+), then none. */
	{
		static const unsigned tries[] = {
			IORING_SETUP_SUBMIT_ALL | IORING_SETUP_SINGLE_ISSUER |
				IORING_SETUP_DEFER_TASKRUN,
			IORING_SETUP_SUBMIT_ALL | IORING_SETUP_COOP_TASKRUN,
			0,
		};

		for (size_t i = 0; i < sizeof(tries) / sizeof(tries[0]); i++) {
			memset(&params, 0, sizeof(params));
			params.flags = tries[i];
			r = io_uring_queue_init_params(RING_ENTRIES, &sv->ring, &params);
			if (r != -EINVAL)
				break;
		}
	}
	if (r < 0) {
		log_err("io_uring_queue_init: %s (is io_uring disabled on this kernel?)",
			strerror(-r));
		return r;
	}
	sv->bufs = aligned_alloc(4096, (size_t)NBUFS * BUFSZ);
	if (!sv->bufs || kvp_arena_init(&sv->arena, ARENA_BYTES) < 0)
		return -ENOMEM;
	sv->arena.deny = decode_spill_fails;
	{
		struct io_uring_buf_reg reg = { 0 };
		size_t sz = sizeof(struct io_uring_buf) * NBUFS;
		void *mem = aligned_alloc(4096, (sz + 4095) / 4096 * 4096);

		if (!mem)
			return -ENOMEM;
		sv->br = mem;
		io_uring_buf_ring_init(sv->br);
		reg.ring_addr = (uint64_t)(uintptr_t)mem;
		reg.ring_entries = NBUFS;
		reg.bgid = BUF_GROUP;
		r = io_uring_register_buf_ring(&sv->ring, &reg, 0);
		if (r < 0) {
			log_err("io_uring_register_buf_ring: %s (kernel 5.19 or later needed)",
				strerror(-r));
			return r;
		}
		for (unsigned i = 0; i < NBUFS; i++)
			io_uring_buf_ring_add(sv->br, sv->bufs + (size_t)i * BUFSZ, BUFSZ,
					      (unsigned short)i, io_uring_buf_ring_mask(NBUFS),
					      (int)i);
		io_uring_buf_ring_advance(sv->br, NBUFS);
	}
	/* From here the loop owns them (main.c's handler ended start-up on SIGTERM/SIGINT and
	 * blocked SIGHUP, which waits if it came). */
	kvp_signals_block(&mask);
	sv->sig_fd = signalfd(-1, &mask, SFD_CLOEXEC);
	if (sv->sig_fd < 0)
		return -errno;
	return 0;
}

void kvp_signals_block(sigset_t *mask)
{
	sigemptyset(mask);
	sigaddset(mask, SIGTERM);
	sigaddset(mask, SIGINT);
	sigaddset(mask, SIGHUP);
	sigprocmask(SIG_BLOCK, mask, NULL);
}

/* A connection taken off the ready list: served and re-armed, or, closing, freed once nothing
 * refers to it. An operation that found no SQE last turn is tried again here. */
static void look_again(struct server *sv, struct peer *p)
{
	conn_release(&p->c, CONN_HOLD_READY);
	if (conn_closing(&p->c)) {
		cancel_pidfd(sv, p);
		conn_maybe_free(sv, p);
		return;
	}
	if (sv->stopping)
		arm_send(sv, p); /* only what was answered before the stop leaves */
	else if (!serve_frames(sv, p))
		return;
	arm_recv(sv, p);
	arm_pidfd(sv, p);
}

/* The server's own operations, re-armed when a completion or a full ring left them unarmed. */
static void rearm(struct server *sv)
{
	if (sv->stopping)
		cancel_accept(sv);
	else
		arm_accept(sv);
	arm_signal(sv);
	arm_timer(sv);
	arm_upkeep(sv);
	arm_work(sv);
	arm_remote(sv);
}

int kvp_server_run(struct kvp_daemon *d, int listen_fd, const char *unlink_path)
{
	struct server sv = { 0 };
	int r;

	sv.d = d;
	sv.listen_fd = listen_fd;
	sv.unlink_path = unlink_path;
	sv.sig_fd = -1;
	sv.lim = (struct conn_limits){
		.turn_budget = KVP_TURN_BUDGET,
		.outq_max = KVP_OUTQ_MAX,
		.handshake_ms = d->conf.hello_timeout_ms,
		.partial_ms = KVP_PARTIAL_FRAME_MS,
		.keepalive_ms = d->conf.keepalive_ms,
	};
	sv.log_accept.interval_ms = sv.log_refuse.interval_ms = REPEAT_LOG_MS;
	sv.log_send.interval_ms = sv.log_hello.interval_ms = REPEAT_LOG_MS;
	kvp_src_init(&sv.accept_src, KVP_SRC_ACCEPT, on_accept_cqe, &sv);
	kvp_src_init(&sv.signal_src, KVP_SRC_SIGNAL, on_signal, &sv);
	kvp_src_init(&sv.timer_src, KVP_SRC_TIMER, on_tick, &sv);
	kvp_src_init(&sv.upkeep_src, KVP_SRC_TIMER, on_upkeep, &sv);
	kvp_src_init(&sv.work_src, KVP_SRC_WORK, on_work, &sv);
	kvp_src_init(&sv.remote_src, KVP_SRC_REMOTE, on_remote, &sv);
	kvp_src_init(&sv.ignore_src, KVP_SRC_IGNORE, on_ignore, &sv);
	d->defers.deliver = deliver_deferred;
	d->defers.ctx = &sv;
	r = setup(&sv);
	if (r == 0) {
		sv.work = kvp_work_start();
		if (!sv.work) {
			log_err("cannot start the worker thread: %s", strerror(errno));
			r = -1;
		} else {
			kvp_pool_async(sv.work, kvp_rpc_alloc_moved,
				       d); /* demotions off the loop */
			kvp_pool_on_short(on_short, &sv);
		}
	}
	if (r < 0) {
		if (sv.sig_fd >= 0)
			close(sv.sig_fd);
		free(sv.bufs);
		free(sv.br);
		kvp_arena_release(&sv.arena);
		return 1;
	}
	sv.watchdog_ms = kvp_watchdog_ms();
	sv.last_summary_ms = kvp_now_ms();
	/* Buffers for clients above this come from mmap and go back to the system when freed
	 * (glibc would otherwise raise the threshold after the first large free and keep them). */
	mallopt(M_MMAP_THRESHOLD, 256 << 10);
	sv.fd_limit = kvp_admit_raise_nofile();
	count_own_fds(&sv, kvp_now_ms());
	log_info("descriptors: limit %lu, %lu in use, %lu kept in reserve; buffer budget %lu bytes",
		 (unsigned long)sv.fd_limit, (unsigned long)sv.fds_other,
		 (unsigned long)kvp_admit_fd_reserve(sv.fd_limit),
		 (unsigned long)kvp_admit_buffer_budget(&d->conf));
	if (d->conf.metrics_listen[0])
		sv.http = kvp_metrics_http_start(d->conf.metrics_listen);
	rearm(&sv);
	kvp_notify("READY=1");
	status_line(&sv);
	log_notice("kvpoold ready: %u pools, listening", d->n_pools);

	while (!(sv.stopping && (sv.nconns == 0 || kvp_now_ms() > sv.stop_deadline_ms))) {
		struct io_uring_cqe *cqe;
		unsigned head, n = 0;
		struct peer *ready;

		/* With connections still to serve or operations to retry, collect what completed
		 * without waiting (with DEFER_TASKRUN a plain submit would leave completions
		 * unposted). */
		if (sv.ready || sv.retry)
			r = io_uring_submit_and_get_events(&sv.ring);
		else
			r = io_uring_submit_and_wait(&sv.ring, 1);
		sv.retry = false;
		if (r < 0 && r != -EINTR && r != -EBUSY && r != -EAGAIN) {
			log_err("io_uring_submit: %s", strerror(-r));
			sv.exit_code = 1;
			break;
		}
		io_uring_for_each_cqe(&sv.ring, head, cqe)
		{
			struct kvp_src *src = io_uring_cqe_get_data(cqe);

			if (src)
				src->fn(&sv, src, cqe);
			n++;
		}
		io_uring_cq_advance(&sv.ring, n);
		close_owed(&sv);
		/* Serve the connections that have input, each up to its budget. */
		ready = sv.ready;
		sv.ready = NULL;
		while (ready) {
			struct peer *p = ready;

			ready = p->ready_next;
			look_again(&sv, p);
		}
		run_remote(&sv);
		close_owed(&sv);
		push_notices(&sv, false);
		if (d->reload_requested && !sv.reload_busy && !sv.stopping) {
			d->reload_requested = false;
			if (kvp_reload_start(d, sv.work, reload_finished, &sv) == 0) {
				sv.reload_busy = true;
				status_line(&sv);
			}
		}
#if KVP_HAVE_REMOTE
		/* What this turn submitted to the cluster: its fds and deadline, up to date. */
		if (d->remote) {
			kvp_rt_bind(d); /* pools a reload created */
			/* The turn's replies leave before the I/O thread is woken for what the
			 * turn queued (spills of its Allocs): on few cores it may run first. */
			if (kvp_remote_pending(d->remote))
				io_uring_submit(&sv.ring);
			kvp_remote_sync(d->remote);
			kvp_remote_stats_read(d->remote, &d->remote_st);
			kvp_rt_stats_read(d, &d->remote_st);
		}
#endif
		rearm(&sv);
	}
	/* Past the flush deadline: whatever is left goes now. A reload in progress ends first
	 * (its pools are dropped or join, to be destroyed with the others), then sessions (their
	 * pages return), then the ring (cancelling what is in flight), then the connections. */
	kvp_work_stop(sv.work); /* demotions in flight land (or are cancelled) first */
	kvp_pool_async(NULL, NULL, NULL);
	kvp_pool_on_short(NULL, NULL);
	kvp_rpc_alloc_retry(d); /* nothing is in flight now: every waiting Alloc ends */
	while (d->defers.reload_waiting) {
		struct kvp_defer *t = d->defers.reload_waiting;
		struct kvp_fail f;

		d->defers.reload_waiting = t->next;
		kvp_fail_init(&f);
		kvp_fail(&f, KVP_ERR_SHUTTING_DOWN, "kvpoold is stopping");
		kvp_defer_fail(&d->defers, t, &f);
	}
	if (d->defers.n) {
		log_err("at exit: %u deferred replies still held", d->defers.n);
		sv.exit_code = 70;
	}
	d->defers.deliver = NULL;
	kvp_snap_write_all(d, true); /* every session still listed may resume */
	for (struct peer *p = sv.conns; p; p = p->next) {
		if (p->sess) {
			kvp_session_destroy(d, p->sess);
			p->sess = NULL;
		}
	}
	io_uring_queue_exit(&sv.ring);
	while (sv.conns)
		conn_free(&sv, sv.conns);
	if (unlink_path)
		unlink(unlink_path);
	kvp_metrics_http_stop(sv.http);
	close(sv.sig_fd);
	free(sv.bufs);
	free(sv.br);
	kvp_arena_release(&sv.arena);
	log_notice("kvpoold stopped");
	return sv.exit_code;
}
