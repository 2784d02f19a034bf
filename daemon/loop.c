/* loop.c - kvpoold's io_uring event loop.
 *
 * One thread owns all state. Multishot accept on the listening socket; each connection
 * has at most one recv (buffer-selected from a shared provided-buffer ring) and one sendmsg
 * in flight; signals arrive through a signalfd read in the ring; a timeout SQE ticks the
 * keep-alive, deadline and watchdog checks. A connection gets KVP_TURN_BUDGET frames per
 * turn, and is not read while KVP_OUTQ_MAX reply bytes wait for it, so a client that pipelines
 * without reading stalls only itself. */
#include "loop.h"

#include <errno.h>
#include <liburing.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "dispatch.h"
#include "fault.h"
#include "frame.h"
#include "log.h"
#include "metrics.h"
#include "metrics_http.h"
#include "notify.h"

#define RING_ENTRIES 1024
#define BUF_GROUP 7
#define NBUFS 256
#define BUFSZ (16u << 10)
#define TICK_MS 100
#define ARENA_BYTES (64u << 10) /* a decoded request beyond this spills to malloc */

enum tag { TAG_ACCEPT = 1, TAG_RECV, TAG_SEND, TAG_SIGNAL, TAG_TIMER, TAG_PIDFD, TAG_IGNORE };

/* Queued reply bytes: one or more whole frames. Replies of a turn are packed one after another
 * into the tail buffer; one that carries descriptors gets a buffer of its own. Bytes appended
 * while a sendmsg covering the front of the buffer is in flight are sent by the next one. */
struct obuf {
	struct obuf *next;
	size_t len, off, cap;
	int fds[KVP_REPLY_MAX_FDS];
	int nfds;
	uint8_t data[];
};

#define OBUF_CAP (4u << 10) /* a turn of small replies; each connection keeps one spare */

struct conn {
	int fd;
	int pidfd;
	bool closing;	    /* session gone; waiting for in-flight ops */
	bool serving;	    /* in serve_frames: closing must not free it yet */
	bool flush_close;   /* close once the output queue is empty */
	bool recv_armed, send_armed, pid_armed;
	int inflight;
	struct kvp_frame_buf in;
	struct obuf *oq_head, *oq_tail;
	struct obuf *spare; /* a sent OBUF_CAP buffer, reused by the next reply */
	size_t out_bytes;
	struct kvp_session *sess;
	uint64_t accepted_ms, partial_since_ms, flush_deadline_ms;
	bool in_ready;
	struct conn *ready_next;
	struct conn *prev, *next;
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
	bool accept_armed;
	int sig_fd;
	struct signalfd_siginfo si;
	struct __kernel_timespec tick;
	struct io_uring_buf_ring *br;
	uint8_t *bufs;
	struct conn *conns;
	uint32_t nconns;
	struct conn *ready;
	bool stopping;
	uint64_t stop_deadline_ms;
	uint64_t watchdog_ms, last_watchdog_ms, last_status_ms, last_metrics_ms, last_summary_ms;
	struct kvp_metrics_http *http;
	struct kvp_arena arena; /* the request being served is decoded into it */
	int exit_code;
};

static void *tagged(void *p, enum tag t)
{
	return (void *)((uintptr_t)p | (uintptr_t)t);
}

static struct io_uring_sqe *get_sqe(struct server *sv)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&sv->ring);

	if (!sqe) {
		io_uring_submit(&sv->ring);
		sqe = io_uring_get_sqe(&sv->ring);
	}
	return sqe;
}

static void arm_accept(struct server *sv)
{
	struct io_uring_sqe *sqe;

	if (sv->accept_armed || sv->listen_fd < 0 || sv->stopping)
		return;
	sqe = get_sqe(sv);
	io_uring_prep_multishot_accept(sqe, sv->listen_fd, NULL, NULL, SOCK_CLOEXEC);
	io_uring_sqe_set_data(sqe, tagged(sv, TAG_ACCEPT));
	sv->accept_armed = true;
}

static void arm_signal(struct server *sv)
{
	struct io_uring_sqe *sqe = get_sqe(sv);

	io_uring_prep_read(sqe, sv->sig_fd, &sv->si, sizeof(sv->si), 0);
	io_uring_sqe_set_data(sqe, tagged(sv, TAG_SIGNAL));
}

static void arm_timer(struct server *sv)
{
	struct io_uring_sqe *sqe = get_sqe(sv);

	sv->tick.tv_sec = 0;
	sv->tick.tv_nsec = TICK_MS * 1000000L;
	io_uring_prep_timeout(sqe, &sv->tick, 0, 0);
	io_uring_sqe_set_data(sqe, tagged(sv, TAG_TIMER));
}

static bool paused(const struct conn *c)
{
	return c->out_bytes >= KVP_OUTQ_MAX;
}

static void arm_recv(struct server *sv, struct conn *c)
{
	struct io_uring_sqe *sqe;

	if (c->recv_armed || c->closing || c->flush_close || paused(c) || sv->stopping)
		return;
	sqe = get_sqe(sv);
	io_uring_prep_recv(sqe, c->fd, NULL, BUFSZ, 0);
	sqe->flags |= IOSQE_BUFFER_SELECT;
	sqe->buf_group = BUF_GROUP;
	io_uring_sqe_set_data(sqe, tagged(c, TAG_RECV));
	c->recv_armed = true;
	c->inflight++;
}

static void arm_pidfd(struct server *sv, struct conn *c)
{
	struct io_uring_sqe *sqe;

	if (c->pidfd < 0 || c->pid_armed)
		return;
	sqe = get_sqe(sv);
	io_uring_prep_poll_add(sqe, c->pidfd, POLLIN);
	io_uring_sqe_set_data(sqe, tagged(c, TAG_PIDFD));
	c->pid_armed = true;
	c->inflight++;
}

/* One send for as many queued replies as fit in KVP_SEND_IOV (a plain send for one buffer, else
 * sendmsg); a reply that carries descriptors goes alone, so they travel with its first byte. */
static void arm_send(struct server *sv, struct conn *c)
{
	struct obuf *o = c->oq_head;
	struct io_uring_sqe *sqe;
	size_t n = 0;

	if (c->send_armed || !o || c->closing)
		return;
	memset(&c->msg, 0, sizeof(c->msg));
	if (o->nfds && o->off == 0) {
		struct cmsghdr *cm;

		c->msg.msg_control = c->cmsg.buf;
		c->msg.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)o->nfds);
		cm = CMSG_FIRSTHDR(&c->msg);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)o->nfds);
		memcpy(CMSG_DATA(cm), o->fds, sizeof(int) * (size_t)o->nfds);
		c->iov[n].iov_base = o->data;
		c->iov[n++].iov_len = o->len;
	} else {
		for (; o && n < KVP_SEND_IOV && !(o->nfds && o->off == 0); o = o->next) {
			c->iov[n].iov_base = o->data + o->off;
			c->iov[n++].iov_len = o->len - o->off;
		}
	}
	sqe = get_sqe(sv);
	if (n == 1 && !c->msg.msg_control) { /* the common case: no msghdr for the kernel to read */
		io_uring_prep_send(sqe, c->fd, c->iov[0].iov_base, c->iov[0].iov_len, MSG_NOSIGNAL);
	} else {
		c->msg.msg_iov = c->iov;
		c->msg.msg_iovlen = n;
		io_uring_prep_sendmsg(sqe, c->fd, &c->msg, MSG_NOSIGNAL);
	}
	io_uring_sqe_set_data(sqe, tagged(c, TAG_SEND));
	c->send_armed = true;
	c->inflight++;
}

static void mark_ready(struct server *sv, struct conn *c)
{
	if (c->in_ready || c->closing)
		return;
	c->in_ready = true;
	c->ready_next = sv->ready;
	sv->ready = c;
}

static void conn_free(struct server *sv, struct conn *c)
{
	struct obuf *o, *n;

	for (o = c->oq_head; o; o = n) {
		n = o->next;
		free(o);
	}
	free(c->spare);
	kvp_frame_buf_release(&c->in);
	if (c->pidfd >= 0)
		close(c->pidfd);
	close(c->fd);
	if (c->prev)
		c->prev->next = c->next;
	else
		sv->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	sv->nconns--;
	free(c);
}

/* Frees a closing connection once nothing refers to it: no operation in flight and not on
 * the ready list (a receive and a close can complete in the same batch). */
static void conn_maybe_free(struct server *sv, struct conn *c)
{
	if (c->closing && c->inflight == 0 && !c->in_ready && !c->serving)
		conn_free(sv, c);
}

/* Ends a connection: its session (leases, locks) is returned at once; the memory goes when
 * the last in-flight operation completes. */
static void conn_close(struct server *sv, struct conn *c, const char *why)
{
	struct io_uring_sqe *sqe;

	if (c->closing)
		return;
	c->closing = true;
	if (c->sess) {
		if (why)
			log_info("session %lu ('%s' pid %d): %s", (unsigned long)c->sess->id,
				 c->sess->name, (int)c->sess->pid, why);
		kvp_session_destroy(sv->d, c->sess);
		c->sess = NULL;
	}
	shutdown(c->fd, SHUT_RDWR);
	if (c->pid_armed) {
		sqe = get_sqe(sv);
		io_uring_prep_poll_remove(sqe, (uint64_t)(uintptr_t)tagged(c, TAG_PIDFD));
		io_uring_sqe_set_data(sqe, tagged(sv, TAG_IGNORE));
	}
	conn_maybe_free(sv, c);
}

/* Room for a frame of len bytes at the tail of c's queue: the tail buffer when the frame fits
 * and neither carries descriptors, else a new buffer. NULL on ENOMEM. */
static struct obuf *queue_room(struct conn *c, size_t len, int nfds)
{
	struct obuf *o = c->oq_tail;

	if (o && !o->nfds && !nfds && o->cap - o->len >= len)
		return o;
	if (kvp_fault_hit(KVP_FAULT_REPLY_QUEUE))
		return NULL;
	if (c->spare && len <= OBUF_CAP) {
		o = c->spare;
		c->spare = NULL;
	} else {
		o = malloc(sizeof(*o) + (len > OBUF_CAP ? len : OBUF_CAP));
		if (!o)
			return NULL;
	}
	o->next = NULL;
	o->len = o->off = 0;
	o->cap = len > OBUF_CAP ? len : OBUF_CAP;
	o->nfds = 0;
	if (c->oq_tail)
		c->oq_tail->next = o;
	else
		c->oq_head = o;
	c->oq_tail = o;
	return o;
}

/* Packs a reply straight into c's queue; a reply too large for one frame becomes an INTERNAL
 * status. */
static void send_reply(struct server *sv, struct conn *c, struct kvp_reply *r)
{
	struct kvp_frame_plan plan;
	size_t len = kvp_frame_plan(&plan, &r->resp.base);
	struct obuf *o;

	if (len > KVP_FRAME_HDR + KVP_FRAME_MAX) {
		struct kvp_fail f = { 0 };
		uint64_t id = r->resp.id;

		kvp_reply_release(r);
		kvp_reply_init(r, id);
		kvp_fail(&f, KVPOOL__CODE__INTERNAL, "reply does not fit in one frame");
		kvp_reply_fail(r, &f);
		len = kvp_frame_plan(&plan, &r->resp.base);
	}
	o = queue_room(c, len, r->nfds);
	if (!o) {
		conn_close(sv, c, "out of memory queueing a reply");
		return;
	}
	o->len += kvp_frame_pack_plan(&plan, o->data + o->len);
	o->nfds = r->nfds;
	memcpy(o->fds, r->fds, sizeof(int) * (size_t)r->nfds);
	c->out_bytes += len;
	sv->d->st.frames_out++;
	if (r->close_after)
		c->flush_close = true;
}

static bool decode_spill_fails(void)
{
	return kvp_fault_hit(KVP_FAULT_DECODE);
}

/* A typed status with id 0 (the request could not be read, so it belongs to no call), then the
 * connection ends. c stays allocated until the caller is done with it (it checks
 * c->closing). */
static void fail_close(struct server *sv, struct conn *c, int code, const char *what)
{
	struct kvp_reply r;
	struct kvp_fail f = { 0 };
	bool serving = c->serving;

	c->serving = true;
	log_warn("connection of pid %d: %s: closing it", c->sess ? (int)c->sess->pid : -1, what);
	kvp_reply_init(&r, 0);
	kvp_fail(&f, code, "%s", what);
	kvp_reply_fail(&r, &f);
	r.close_after = true;
	send_reply(sv, c, &r);
	kvp_reply_release(&r);
	arm_send(sv, c);
	c->in.len = c->in.off = 0; /* nothing more is read from this stream */
	c->flush_deadline_ms = kvp_now_ms() + 1000;
	c->serving = serving;
}

static void protocol_error(struct server *sv, struct conn *c, const char *what)
{
	sv->d->st.protocol_errors++;
	fail_close(sv, c, KVPOOL__CODE__PROTOCOL, what);
}

static uint64_t ms_of(const struct timespec *t)
{
	return (uint64_t)t->tv_sec * 1000 + (uint64_t)t->tv_nsec / 1000000;
}

static double elapsed_us(const struct timespec *a, const struct timespec *b)
{
	return (double)(b->tv_sec - a->tv_sec) * 1e6 + (double)(b->tv_nsec - a->tv_nsec) / 1e3;
}

/* Serves c's complete frames, up to its budget. Each request is decoded into the server's
 * arena, dispatched and its reply packed into c's queue; the time from the end of one to the
 * end of the next (decode, dispatch, pack: one clock read per request) is the call's
 * server-side latency. */
static void serve_frames_budget(struct server *sv, struct conn *c)
{
	int budget = KVP_TURN_BUDGET;
	struct timespec prev, now;
	bool served = false;

	clock_gettime(CLOCK_MONOTONIC, &prev);
	now = prev;
	while (!c->closing && !c->flush_close && !paused(c)) {
		const uint8_t *payload;
		Kvpool__Request *req;
		struct kvp_reply r;
		uint32_t len;
		int n, code;

		if (budget-- == 0) {
			mark_ready(sv, c); /* more next turn, after everyone else */
			break;
		}
		n = kvp_frame_next(&c->in, &payload, &len);
		if (n < 0) {
			protocol_error(sv, c, "frame larger than the maximum");
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
				fail_close(sv, c, KVPOOL__CODE__INTERNAL,
					   "out of memory decoding a request");
			else
				protocol_error(sv, c, "frame is not a valid Request");
			return;
		}
		if (!served)
			c->sess->last_ms = ms_of(&prev); /* a call is activity, from its start */
		kvp_reply_init(&r, req->id);
		code = kvp_dispatch_frame(sv->d, c->sess, req, payload, len, &r);
		send_reply(sv, c, &r);
		kvp_reply_release(&r);
		clock_gettime(CLOCK_MONOTONIC, &now);
		kvp_rpc_observe(&sv->d->rpc, (int)req->call_case, code, elapsed_us(&prev, &now));
		kvp_arena_reset(&sv->arena);
		prev = now;
		served = true;
	}
	if (served && c->sess)
		c->sess->last_ms = ms_of(&now);
	if (kvp_frame_pending(&c->in)) {
		if (!c->partial_since_ms)
			c->partial_since_ms = kvp_now_ms();
	} else {
		c->partial_since_ms = 0;
	}
}

/* Serves a connection's complete frames (up to its budget), then sends the replies of the
 * turn together. A connection closed meanwhile (a reply that could not be queued) is freed
 * here, not under the code still using it. Returns false when c is closing: the caller must
 * not touch it any more. */
static bool serve_frames(struct server *sv, struct conn *c)
{
	c->serving = true;
	serve_frames_budget(sv, c);
	arm_send(sv, c);
	c->serving = false;
	if (c->closing) {
		conn_maybe_free(sv, c);
		return false;
	}
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

static void on_accept(struct server *sv, int fd)
{
	struct ucred cred;
	socklen_t clen = sizeof(cred);
	gid_t groups[64];
	socklen_t glen = sizeof(groups);
	struct kvp_fail f = { 0 };
	struct conn *c;
	bool admin = false;
	int ngroups = 0;

	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) < 0) {
		log_warn("accept: SO_PEERCRED: %s", strerror(errno));
		close(fd);
		return;
	}
	if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &glen) == 0)
		ngroups = (int)(glen / sizeof(gid_t));
	if (sv->stopping || sv->d->draining) {
		kvp_fail(&f, KVPOOL__CODE__SHUTTING_DOWN, "kvpoold is shutting down");
		reject(sv, fd, &f);
		return;
	}
	if (kvp_daemon_admit(sv->d, cred.pid, cred.uid, cred.gid, groups, ngroups, &admin, &f) < 0) {
		log_notice("refused connection of pid %d uid %u: not allowed", (int)cred.pid,
			   (unsigned)cred.uid);
		reject(sv, fd, &f);
		return;
	}
	c = KVP_FAULT_OR(KVP_FAULT_CONN, calloc(1, sizeof(*c)));
	if (!c) {
		log_warn("refused connection of pid %d: out of memory", (int)cred.pid);
		kvp_fail(&f, KVPOOL__CODE__INTERNAL, "out of memory");
		reject(sv, fd, &f);
		return;
	}
	c->sess = kvp_session_new(sv->d, cred.pid, cred.uid, cred.gid, admin, &f);
	if (!c->sess) {
		free(c);
		log_warn("refused connection of pid %d: %s", (int)cred.pid, f.msg);
		reject(sv, fd, &f);
		return;
	}
	kvp_session_set_groups(c->sess, groups, ngroups);
	c->fd = fd;
	c->accepted_ms = kvp_now_ms();
	kvp_frame_buf_init(&c->in);
	/* The session belongs to the peer process: when it exits, even with the socket still
	 * open in a forked child, everything it held returns. */
	c->pidfd = -1;
	if (!kvp_fault_hit(KVP_FAULT_PIDFD))
		c->pidfd = (int)syscall(SYS_pidfd_open, cred.pid, 0);
	c->next = sv->conns;
	if (sv->conns)
		sv->conns->prev = c;
	sv->conns = c;
	sv->nconns++;
	arm_recv(sv, c);
	arm_pidfd(sv, c);
}

static void on_recv(struct server *sv, struct conn *c, struct io_uring_cqe *cqe)
{
	int res = cqe->res;

	c->recv_armed = false;
	c->inflight--;
	if (cqe->flags & IORING_CQE_F_BUFFER) {
		unsigned bid = cqe->flags >> IORING_CQE_BUFFER_SHIFT;

		int r = 0;

		if (res > 0 && !c->closing && !c->flush_close)
			r = kvp_fault_hit(KVP_FAULT_INPUT)
				    ? -ENOMEM
				    : kvp_frame_buf_append(&c->in, sv->bufs + (size_t)bid * BUFSZ,
							   (size_t)res);
		if (r == -EMSGSIZE)
			protocol_error(sv, c, "frame larger than the maximum");
		else if (r < 0)
			fail_close(sv, c, KVPOOL__CODE__INTERNAL,
				   "out of memory for the connection's input");
		recycle_buffer(sv, bid);
	}
	if (c->closing) {
		conn_maybe_free(sv, c);
		return;
	}
	if (res == -ENOBUFS) {
		mark_ready(sv, c); /* re-armed next turn, once buffers came back */
		return;
	}
	if (res <= 0) {
		conn_close(sv, c, res == 0 ? "client closed the connection" : "receive failed");
		return;
	}
	mark_ready(sv, c);
}

static void on_send(struct server *sv, struct conn *c, int res)
{
	size_t sent = res > 0 ? (size_t)res : 0;

	c->send_armed = false;
	c->inflight--;
	if (c->closing) {
		conn_maybe_free(sv, c);
		return;
	}
	if (res < 0) {
		conn_close(sv, c, "send failed (client gone)");
		return;
	}
	c->out_bytes -= sent;
	while (sent && c->oq_head) {
		struct obuf *o = c->oq_head;
		size_t take = o->len - o->off < sent ? o->len - o->off : sent;

		o->off += take;
		sent -= take;
		o->nfds = 0; /* descriptors went with the first byte */
		if (o->off < o->len)
			break;
		c->oq_head = o->next;
		if (!c->oq_head)
			c->oq_tail = NULL;
		if (!c->spare && o->cap == OBUF_CAP)
			c->spare = o;
		else
			free(o);
	}
	if (c->oq_head) {
		arm_send(sv, c);
	} else if (c->flush_close) {
		conn_close(sv, c, NULL);
		return;
	}
	if (!paused(c))
		mark_ready(sv, c); /* reading resumes when the queue drained below the limit */
}

static void begin_stop(struct server *sv, const char *why)
{
	struct io_uring_sqe *sqe;

	if (sv->stopping)
		return;
	log_notice("stopping: %s", why);
	kvp_notify("STOPPING=1");
	sv->stopping = true;
	sv->stop_deadline_ms = kvp_now_ms() + KVP_STOP_FLUSH_MS;
	if (sv->accept_armed) {
		sqe = get_sqe(sv);
		io_uring_prep_cancel64(sqe, (uint64_t)(uintptr_t)tagged(sv, TAG_ACCEPT), 0);
		io_uring_sqe_set_data(sqe, tagged(sv, TAG_IGNORE));
	}
	/* Answer every complete request already received, then close after the flush. */
	for (struct conn *c = sv->conns, *n; c; c = n) {
		n = c->next;
		if (c->closing || !serve_frames(sv, c))
			continue;
		c->flush_close = true;
		if (!c->oq_head)
			conn_close(sv, c, "kvpoold is stopping");
	}
}

static void on_signal(struct server *sv, int res)
{
	if (res == (int)sizeof(sv->si)) {
		switch (sv->si.ssi_signo) {
		case SIGTERM:
		case SIGINT:
			begin_stop(sv, sv->si.ssi_signo == SIGTERM ? "SIGTERM" : "SIGINT");
			break;
		case SIGHUP:
			sv->d->reload_requested = true;
			break;
		default:
			break;
		}
	}
	arm_signal(sv);
}

static void status_line(struct server *sv)
{
	char buf[256];
	uint64_t total = 0, used = 0;

	for (uint32_t i = 0; i < sv->d->n_pools; i++) {
		for (int t = 0; t < KVP_TIER_MAX; t++) {
			struct kvp_tier_counts c;

			kvp_pool_counts(sv->d->pools[i], t, &c);
			total += c.total;
			used += c.leased + c.cached;
		}
	}
	snprintf(buf, sizeof(buf), "STATUS=%u pools, %u sessions, %.1f%% of pages in use%s",
		 sv->d->n_pools, sv->d->n_sessions, total ? 100.0 * (double)used / (double)total : 0.0,
		 sv->d->draining ? ", draining" : "");
	kvp_notify(buf);
}

static void on_tick(struct server *sv)
{
	struct kvp_daemon *d = sv->d;
	uint64_t now = kvp_now_ms();

	for (struct conn *c = sv->conns, *n; c; c = n) {
		n = c->next;
		if (c->closing)
			continue;
		if (c->sess && c->sess->evicted) {
			conn_close(sv, c, c->sess->evict_reason);
		} else if (c->flush_close && c->flush_deadline_ms && now > c->flush_deadline_ms) {
			conn_close(sv, c, "reply not read in time");
		} else if (c->sess && !c->sess->hello && now - c->accepted_ms > KVP_HANDSHAKE_MS) {
			conn_close(sv, c, "no Hello within the handshake deadline");
		} else if (c->partial_since_ms && now - c->partial_since_ms > KVP_PARTIAL_FRAME_MS) {
			sv->d->st.protocol_errors++;
			conn_close(sv, c, "half-sent frame not completed in time");
		} else if (c->sess && c->sess->hello && d->conf.keepalive_ms &&
			   now - c->sess->last_ms > d->conf.keepalive_ms) {
			d->st.sessions_reclaimed++;
			conn_close(sv, c, "reclaimed: no call within keepalive_ms");
		}
	}
	if (d->draining && !sv->stopping && (d->n_sessions == 0 || now >= d->drain_deadline_ms))
		begin_stop(sv, d->n_sessions ? "drain deadline reached" : "drained: no sessions left");
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
	if (now - sv->last_status_ms >= 5000) {
		status_line(sv);
		sv->last_status_ms = now;
	}
	arm_timer(sv);
}

static void handle_cqe(struct server *sv, struct io_uring_cqe *cqe)
{
	void *ud = io_uring_cqe_get_data(cqe);
	enum tag t = (enum tag)((uintptr_t)ud & 7);
	void *p = (void *)((uintptr_t)ud & ~(uintptr_t)7);

	switch (t) {
	case TAG_ACCEPT:
		if (!(cqe->flags & IORING_CQE_F_MORE))
			sv->accept_armed = false;
		if (cqe->res >= 0)
			on_accept(sv, cqe->res);
		else if (cqe->res != -ECANCELED)
			log_warn("accept: %s", strerror(-cqe->res));
		break;
	case TAG_RECV:
		on_recv(sv, p, cqe);
		break;
	case TAG_SEND:
		on_send(sv, p, cqe->res);
		break;
	case TAG_PIDFD: {
		struct conn *c = p;

		c->pid_armed = false;
		c->inflight--;
		if (c->closing) {
			conn_maybe_free(sv, c);
		} else if (cqe->res > 0) {
			sv->d->st.sessions_reclaimed++;
			conn_close(sv, c, "client process exited");
		}
		break;
	}
	case TAG_SIGNAL:
		on_signal(sv, cqe->res);
		break;
	case TAG_TIMER:
		on_tick(sv);
		break;
	default:
		break;
	}
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
	/* main() blocked these before the socket was listening: one that arrived since waits. */
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

/* Reload hook: main.c provides it (config re-read). */
void kvp_daemon_reload(struct kvp_daemon *d);

int kvp_server_run(struct kvp_daemon *d, int listen_fd, const char *unlink_path)
{
	struct server sv = { 0 };
	int r;

	sv.d = d;
	sv.listen_fd = listen_fd;
	sv.unlink_path = unlink_path;
	sv.sig_fd = -1;
	r = setup(&sv);
	if (r < 0) {
		free(sv.bufs);
		free(sv.br);
		kvp_arena_release(&sv.arena);
		return 1;
	}
	sv.watchdog_ms = kvp_watchdog_ms();
	sv.last_summary_ms = kvp_now_ms();
	if (d->conf.metrics_listen[0])
		sv.http = kvp_metrics_http_start(d->conf.metrics_listen);
	arm_accept(&sv);
	arm_signal(&sv);
	arm_timer(&sv);
	kvp_notify("READY=1");
	status_line(&sv);
	log_notice("kvpoold ready: %u pools, listening", d->n_pools);

	while (!(sv.stopping && (sv.nconns == 0 || kvp_now_ms() > sv.stop_deadline_ms))) {
		struct io_uring_cqe *cqe;
		unsigned head, n = 0;
		struct conn *ready;

		/* With connections still to serve, collect what completed without waiting (with
		 * DEFER_TASKRUN a plain submit would leave completions unposted). */
		if (sv.ready)
			r = io_uring_submit_and_get_events(&sv.ring);
		else
			r = io_uring_submit_and_wait(&sv.ring, 1);
		if (r < 0 && r != -EINTR && r != -EBUSY && r != -EAGAIN) {
			log_err("io_uring_submit: %s", strerror(-r));
			sv.exit_code = 1;
			break;
		}
		io_uring_for_each_cqe(&sv.ring, head, cqe)
		{
			handle_cqe(&sv, cqe);
			n++;
		}
		io_uring_cq_advance(&sv.ring, n);
		/* Serve the connections that have input, each up to its budget. */
		ready = sv.ready;
		sv.ready = NULL;
		while (ready) {
			struct conn *c = ready;

			ready = c->ready_next;
			c->in_ready = false;
			if (c->closing) {
				conn_maybe_free(&sv, c);
				continue;
			}
			if (!sv.stopping && !serve_frames(&sv, c))
				continue;
			arm_recv(&sv, c);
		}
		if (d->reload_requested) {
			d->reload_requested = false;
			kvp_daemon_reload(d);
		}
		if (!sv.accept_armed && !sv.stopping)
			arm_accept(&sv);
	}
	/* Past the flush deadline: whatever is left goes now. Sessions first (their pages
	 * return), then the ring (cancelling what is in flight), then the connections. */
	for (struct conn *c = sv.conns; c; c = c->next) {
		if (c->sess) {
			kvp_session_destroy(d, c->sess);
			c->sess = NULL;
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
