/* libkvpool_transport.c - the call path over the unix socket: frames sent and read (with the
 * descriptors that come with them), the table of outstanding requests matched by id, the event
 * queue for frames nobody asked for (kvp_client_event_fd/_next, pressure notices decoded), and a
 * lost connection given up or handed to the reconnect (libkvpool_reconnect.c). */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kvp_internal.h"

void kvp__close_fds(int *fds, int n)
{
	for (int i = 0; i < n; i++)
		if (fds[i] >= 0)
			close(fds[i]);
}

static int send_all(int fd, const uint8_t *p, size_t n)
{
	while (n) {
		ssize_t w = send(fd, p, n, MSG_NOSIGNAL);

		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

/* Reads until one complete frame is buffered. Descriptors received go to c->rxfds: they
 * belong to the next frame completed (a read never joins bytes sent with descriptors to
 * earlier bytes). Returns 1 with the frame, 0 when nonblocking and nothing more waits, or
 * -errno. */
static int recv_frame(struct kvp_client *c, bool block, const uint8_t **payload, uint32_t *len)
{
	for (;;) {
		union {
			char buf[CMSG_SPACE(sizeof(int) * KVP_CLIENT_MAX_FDS)];
			size_t align;
		} cm;
		struct msghdr msg = { 0 };
		struct iovec iov;
		size_t avail;
		uint8_t *space;
		ssize_t n;
		int r = kvp_frame_next(&c->in, payload, len);

		if (r != 0)
			return r < 0 ? -EMSGSIZE : 1;
		space = kvp_frame_buf_space(&c->in, 65536, &avail);
		if (!space)
			return -ENOMEM;
		iov.iov_base = space;
		iov.iov_len = avail;
		msg.msg_iov = &iov;
		msg.msg_iovlen = 1;
		msg.msg_control = cm.buf;
		msg.msg_controllen = sizeof(cm.buf);
		n = recvmsg(c->fd, &msg, MSG_CMSG_CLOEXEC | (block ? 0 : MSG_DONTWAIT));
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && !block && (errno == EAGAIN || errno == EWOULDBLOCK))
			return 0;
		if (n < 0)
			return -errno;
		for (struct cmsghdr *h = CMSG_FIRSTHDR(&msg); h; h = CMSG_NXTHDR(&msg, h)) {
			if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS)
				continue;
			int cnt = (int)((h->cmsg_len - CMSG_LEN(0)) / sizeof(int));
			int in[KVP_CLIENT_MAX_FDS];

			memcpy(in, CMSG_DATA(h), sizeof(int) * (size_t)cnt);
			for (int i = 0; i < cnt; i++) {
				if (c->nrxfds < KVP_CLIENT_MAX_FDS)
					c->rxfds[c->nrxfds++] = in[i];
				else
					close(in[i]);
			}
		}
		if (n == 0)
			return -ECONNRESET;
		kvp_frame_buf_commit(&c->in, (size_t)n);
	}
}

static void signal_events(struct kvp_client *c)
{
	uint64_t one = 1;

	if (c->efd >= 0 && write(c->efd, &one, sizeof(one)) < 0) {
		/* the counter is already nonzero: the fd stays readable */
	}
}

static void queue_event(struct kvp_client *c, const Kvpool__Response *m, const uint8_t *payload,
			uint32_t len)
{
	struct queued_event *e;
	uint8_t *copy;

	if (c->ev_n == KVP_CLIENT_MAX_EVENTS || !(copy = malloc(len ? len : 1))) {
		c->ev_dropped++;
		return;
	}
	memcpy(copy, payload, len);
	e = &c->ev[(c->ev_head + c->ev_n++) % KVP_CLIENT_MAX_EVENTS];
	e->type = (uint32_t)m->result_case;
	e->code = m->status ? (int32_t)m->status->code : 0;
	e->id = m->id;
	e->dropped = c->ev_dropped;
	e->bytes = copy;
	e->len = len;
	c->ev_dropped = 0;
	signal_events(c);
}

static struct pending *pending_find(struct kvp_client *c, uint64_t id)
{
	for (int i = 0; id && i < KVP_CLIENT_MAX_PENDING; i++)
		if (c->pend[i].id == id)
			return &c->pend[i];
	return NULL;
}

/* Routes one frame: to the outstanding request of its id; a refusal of the connection (id 0,
 * a failed status and no result) to c->notice; a reply to a call given up (an id this client
 * used) nowhere; anything else to the event queue. Returns 0 or -EPROTO. */
static int route(struct kvp_client *c, const uint8_t *payload, uint32_t len)
{
	int fds[KVP_CLIENT_MAX_FDS], nfds = c->nrxfds;
	Kvpool__Response *m;
	struct pending *pd;

	memcpy(fds, c->rxfds, sizeof(int) * (size_t)nfds);
	c->nrxfds = 0;
	m = kvp_frame_decode_response(payload, len);
	if (!m) {
		kvp__close_fds(fds, nfds);
		return -EPROTO;
	}
	pd = pending_find(c, m->id);
	if (pd && !pd->done) {
		pd->done = true;
		pd->resp = m;
		memcpy(pd->fds, fds, sizeof(int) * (size_t)nfds);
		pd->nfds = nfds;
		return 0;
	}
	kvp__close_fds(fds, nfds);
	if (m->id == 0 && m->result_case == KVPOOL__RESPONSE__RESULT__NOT_SET &&
	    (!m->status || m->status->code != KVPOOL__CODE__OK)) {
		if (c->notice)
			kvpool__response__free_unpacked(c->notice, NULL);
		c->notice = m;
		return 0;
	}
	if (m->id == 0 || m->id > c->next_id)
		queue_event(c, m, payload, len);
	kvpool__response__free_unpacked(m, NULL);
	return 0;
}

void kvp__pending_clear(struct pending *pd)
{
	if (pd->resp)
		kvpool__response__free_unpacked(pd->resp, NULL);
	kvp__close_fds(pd->fds, pd->nfds);
	memset(pd, 0, sizeof(*pd));
}

/* The connection failed: every outstanding request is given up. Returns the transport code. */
static int lose(struct kvp_client *c, int e, struct kvp_error *err)
{
	for (int i = 0; i < KVP_CLIENT_MAX_PENDING; i++)
		kvp__pending_clear(&c->pend[i]);
	kvp__close_fds(c->rxfds, c->nrxfds);
	c->nrxfds = 0;
	if (c->fd >= 0)
		close(c->fd);
	c->fd = -1;
	c->retry = !c->reconnecting;
	signal_events(c); /* a poller learns of it from kvp_client_event_next */
	return kvp__fail(err, KVP_E_TRANSPORT, e, "connection to kvpoold lost: %s", strerror(e));
}

/* Handles what waits in the socket (all of it when !block; one frame when block). Returns 0
 * or -errno. */
static int pump(struct kvp_client *c, bool block)
{
	for (;;) {
		const uint8_t *payload;
		uint32_t len;
		int r = recv_frame(c, block, &payload, &len);

		if (r <= 0)
			return r;
		r = route(c, payload, len);
		if (r < 0 || block)
			return r;
	}
}

/* lose(), then: a restarted kvpoold that answers within reconnect_ms makes it RESTARTED. */
static int lose_call(struct kvp_client *c, int e, struct kvp_error *err)
{
	int r = lose(c, e, err);

	if (c->retry && c->instance && c->reconnect_ms != KVP_RECONNECT_NEVER &&
	    kvp__reconnect(c) == 0)
		return kvp__fail(err, KVP_E_RESTARTED, e,
				 "kvpoold restarted during the call: the session is resumed, "
				 "retry the call");
	return r;
}

int kvp__rpc(struct kvp_client *c, Kvpool__Request *req, int want, Kvpool__Response **resp,
	     int *fds, int *nfds, struct kvp_error *err)
{
	struct pending *pd = NULL;
	uint8_t *buf;
	size_t len;
	int r;

	if ((r = kvp__forked(c, err)) < 0)
		return r; /* the socket, the session and its replies are another process's */
	if (c->fd < 0 && c->retry && c->instance && c->reconnect_ms != KVP_RECONNECT_NEVER &&
	    kvp__reconnect(c) == 0)
		return kvp__fail(err, KVP_E_RESTARTED, ECONNRESET,
				 "kvpoold restarted: the session is resumed, retry the call");
	if (c->fd < 0)
		return kvp__fail(err, KVP_E_TRANSPORT, EPIPE, "the connection was closed before");
	for (int i = 0; i < KVP_CLIENT_MAX_PENDING && !pd; i++)
		if (!c->pend[i].id)
			pd = &c->pend[i];
	if (!pd)
		return kvp__fail(err, KVP_E_LIMIT_EXCEEDED, 0, "%d requests outstanding",
				 KVP_CLIENT_MAX_PENDING);
	req->id = ++c->next_id;
	r = kvp_frame_pack(&req->base, &buf, &len);
	if (r < 0)
		return kvp__fail(err, r == -EMSGSIZE ? KVP_E_INVALID_ARGUMENT : KVP_E_NOMEM, -r,
				 "request does not fit in one frame");
	pd->id = req->id;
	r = send_all(c->fd, buf, len);
	free(buf);
	/* A refusal (id 0) may already wait in the socket when the peer closed: read it first. */
	if (r < 0 && r != -EPIPE && r != -ECONNRESET)
		return lose_call(c, -r, err);
	while (!pd->done && !c->notice) {
		r = pump(c, true);
		if (r < 0)
			return lose_call(c, -r, err);
	}
	if (!pd->done) {
		Kvpool__Response *n = c->notice;

		c->notice = NULL;
		kvp__pending_clear(pd);
		r = n->status ? kvp__status_to_error(n->status, err)
			      : kvp__fail(err, KVP_E_PROTOCOL, 0, "a refusal without a status");
		kvpool__response__free_unpacked(n, NULL);
		return r;
	}
	if (!pd->resp->status || pd->resp->status->code != KVPOOL__CODE__OK) {
		r = pd->resp->status ? kvp__status_to_error(pd->resp->status, err)
				     : kvp__fail(err, KVP_E_PROTOCOL, 0, "reply without a status");
		kvp__pending_clear(pd);
		return r;
	}
	if (want && (int)pd->resp->result_case != want) {
		r = kvp__fail(err, KVP_E_PROTOCOL, 0, "call %d answered with result %d",
			      (int)req->call_case, (int)pd->resp->result_case);
		kvp__pending_clear(pd);
		return r;
	}
	if (fds) {
		memcpy(fds, pd->fds, sizeof(int) * (size_t)pd->nfds);
		*nfds = pd->nfds;
	} else {
		kvp__close_fds(pd->fds, pd->nfds);
	}
	*resp = pd->resp;
	memset(pd, 0, sizeof(*pd));
	return 0;
}

int kvp__rpc_send(struct kvp_client *c, Kvpool__Request *req, struct kvp_error *err)
{
	uint8_t *buf;
	size_t len;
	int r;

	if ((r = kvp__forked(c, err)) < 0)
		return r;
	if (c->fd < 0)
		return kvp__fail(err, KVP_E_TRANSPORT, EPIPE, "the connection was closed before");
	if ((r = pump(c, false)) < 0)
		return lose(c, -r, err);
	req->id = ++c->next_id;
	r = kvp_frame_pack(&req->base, &buf, &len);
	if (r < 0)
		return kvp__fail(err, r == -EMSGSIZE ? KVP_E_INVALID_ARGUMENT : KVP_E_NOMEM, -r,
				 "request does not fit in one frame");
	r = send_all(c->fd, buf, len);
	free(buf);
	if (r < 0 && r != -EPIPE && r != -ECONNRESET)
		return lose(c, -r, err);
	return r < 0 ? kvp__fail(err, KVP_E_TRANSPORT, -r, "send: %s", strerror(-r)) : 0;
}

int kvp__client_fd(const struct kvp_client *c)
{
	return c->fd;
}

KVP_EXPORT int kvp_client_event_fd(struct kvp_client *c)
{
	struct epoll_event ev = { .events = EPOLLIN };

	if (kvp__forked(c, NULL) < 0)
		return -KVP_E_FORKED;
	if (c->epfd >= 0)
		return c->epfd;
	if (c->fd < 0)
		return -KVP_E_TRANSPORT;
	c->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	c->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (c->efd < 0 || c->epfd < 0 || epoll_ctl(c->epfd, EPOLL_CTL_ADD, c->efd, &ev) < 0 ||
	    epoll_ctl(c->epfd, EPOLL_CTL_ADD, c->fd, &ev) < 0) {
		if (c->efd >= 0)
			close(c->efd);
		if (c->epfd >= 0)
			close(c->epfd);
		c->efd = c->epfd = -1;
		return -KVP_E_NOMEM;
	}
	if (c->ev_n || kvp_frame_pending(&c->in) || c->in.len > c->in.off)
		signal_events(c);
	return c->epfd;
}

KVP_EXPORT int kvp_client_event_next(struct kvp_client *c, struct kvp_event *ev,
				     struct kvp_error *err)
{
	struct queued_event *q;
	struct kvp_event e;
	uint64_t drain;

	if (!ev || ev->struct_size < KVP_EVENT_SIZE_V02)
		return kvp__fail(err, KVP_E_INVALID_ARGUMENT, 0, "struct kvp_event too small");
	if (kvp__forked(c, err) < 0)
		return -KVP_E_FORKED; /* its events are the connecting process's */
	if (c->fd >= 0) {
		int r = pump(c, false);

		if (r < 0)
			lose(c, -r, NULL);
	}
	if (!c->ev_n) {
		if (c->efd >= 0 && read(c->efd, &drain, sizeof(drain)) < 0) {
			/* already reset */
		}
		if (c->fd < 0)
			return kvp__fail(err, KVP_E_TRANSPORT, ECONNRESET,
					 "connection to kvpoold lost");
		return kvp__fail(err, KVP_E_AGAIN, EAGAIN, "no event waits");
	}
	q = &c->ev[c->ev_head];
	c->ev_head = (c->ev_head + 1) % KVP_CLIENT_MAX_EVENTS;
	c->ev_n--;
	kvp__struct_in(&e, ev, sizeof(e));
	e.type = q->type;
	e.code = q->code;
	e.id = q->id;
	e.dropped = q->dropped;
	e.payload_len = q->len;
	if (e.payload && e.payload_cap)
		memcpy(e.payload, q->bytes, q->len < e.payload_cap ? q->len : e.payload_cap);
	free(q->bytes);
	kvp__struct_out(ev, &e, sizeof(e));
	if (!c->ev_n && c->efd >= 0 && read(c->efd, &drain, sizeof(drain)) < 0) {
		/* already reset */
	}
	return 0;
}

KVP_EXPORT int kvp_pressure_decode(const struct kvp_event *ev, struct kvp_pressure *out,
				   struct kvp_error *err)
{
	const Kvpool__PressureNotice *n;
	struct kvp_pressure o;
	Kvpool__Response *m;

	if (!ev || ev->struct_size < KVP_EVENT_SIZE_V02 || !out ||
	    out->struct_size < KVP_PRESSURE_SIZE_V03)
		return kvp__fail(err, KVP_E_INVALID_ARGUMENT, 0, "struct too small");
	if (ev->type != KVP_EVENT_PRESSURE)
		return kvp__fail(err, KVP_E_INVALID_ARGUMENT, 0,
				 "event of type %u is not a pressure notice", (unsigned)ev->type);
	if (!ev->payload || ev->payload_len > ev->payload_cap)
		return kvp__fail(err, KVP_E_BUFFER, 0, "the event's %zu bytes were not all kept",
				 ev->payload_len);
	m = kvp_frame_decode_response(ev->payload, (uint32_t)ev->payload_len);
	if (!m || m->result_case != KVPOOL__RESPONSE__RESULT_PRESSURE || !m->pressure) {
		if (m)
			kvpool__response__free_unpacked(m, NULL);
		return kvp__fail(err, KVP_E_PROTOCOL, 0, "not a valid pressure notice");
	}
	n = m->pressure;
	memset(&o, 0, sizeof(o));
	o.struct_size = out->struct_size;
	o.pool_id = n->pool_id;
	o.tier = (uint32_t)n->tier;
	o.recovered = n->recovered;
	o.coalesced = n->coalesced;
	o.free_tokens = n->free_tokens;
	o.evictable_tokens = n->evictable_tokens;
	o.reserved_tokens = n->reserved_tokens;
	o.watermark_tokens = n->watermark_tokens;
	o.total_tokens = n->total_tokens;
	o.seq = n->seq;
	snprintf(o.pool, sizeof(o.pool), "%s", n->pool ? n->pool : "");
	kvpool__response__free_unpacked(m, NULL);
	kvp__struct_out(out, &o, sizeof(o));
	return 0;
}

/* Sends req, expects result `want`, and frees the reply: for calls that return nothing. */
int kvp__rpc_void(struct kvp_client *c, Kvpool__Request *req, int want, struct kvp_error *err)
{
	Kvpool__Response *resp;
	int r = kvp__rpc(c, req, want, &resp, NULL, NULL, err);

	if (r == 0)
		kvpool__response__free_unpacked(resp, NULL);
	return r;
}
