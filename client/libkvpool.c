/* libkvpool.c - the kvpool client library: calls over the unix socket (a table of outstanding
 * requests matched by id, an event queue for frames nobody asked for), and the reference-counted
 * tier mappings through which an engine reads and writes K/V bytes directly. */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <sys/un.h>
#include <unistd.h>

#include "kv_copy.h"
#include "kvp_config.h"
#include "kvp_internal.h"
#include "names.h"
#if KVP_HAVE_CUDA
#include "cuda_drv.h"
#endif

_Static_assert((int)KVP_E_INTERNAL == (int)KVPOOL__CODE__INTERNAL, "codes follow the wire");
_Static_assert((int)KVP_E_RESTARTED == (int)KVPOOL__CODE__RESTARTED, "codes follow the wire");
_Static_assert((int)KVP_E_UNAVAILABLE == (int)KVPOOL__CODE__UNAVAILABLE, "codes follow the wire");
_Static_assert((int)KVP_DTYPE_FP32 == (int)KVPOOL__DTYPE__FP32, "dtypes follow the wire");
_Static_assert((int)KVP_BACKEND_MEMFD == (int)KVPOOL__BACKEND__MEMFD, "backends follow the wire");
_Static_assert((int)KVP_LIMIT_HUGEPAGES_FREE == (int)KVPOOL__LIMIT__HUGEPAGES_FREE,
	       "limits follow");
_Static_assert((int)KVP_TIER_HOST == (int)KVPOOL__TIER__HOST, "tiers follow the wire");

/* One tier's memory in this process; freed with its last reference. */
struct kvp_mapping {
	int refs; /* atomic */
	int tier;
	int backend;
	int fd;
	int cuda_device;
	void *base;
	uint64_t bytes;
#if KVP_HAVE_CUDA
	struct kvp_cuda_mem cm;
#endif
};

struct kvp_tier_map {
	int present;
	uint32_t pages;
	struct kvp_mapping *m; /* the pool's reference */
};

struct kvp_pool {
	struct kvp_client *c;
	uint32_t id;
	char name[64];
	struct kvp_geometry g;
	struct kvp_copy_geom cg;
	uint64_t page_bytes;
	struct kvp_tier_map tier[KVP_TIER_MAX];
	int pressure;			    /* notices granted at attach */
	uint64_t pressure_wm[KVP_TIER_MAX]; /* tokens */
	struct kvp_resv *resv;		    /* the page reserve, NULL when none */
	struct kvp_pool *next;
};

/* A request sent and not yet answered. */
struct pending {
	uint64_t id; /* 0: the slot is free */
	bool done;
	Kvpool__Response *resp;
	int fds[KVP_CLIENT_MAX_FDS];
	int nfds;
};

struct queued_event {
	uint32_t type;
	int32_t code;
	uint64_t id;
	uint64_t dropped;
	uint8_t *bytes;
	size_t len;
};

struct kvp_client {
	int fd;
	int efd;  /* eventfd, readable while events are queued (-1 until kvp_client_event_fd) */
	int epfd; /* epoll over efd and fd: what kvp_client_event_fd hands out */
	uint64_t next_id;
	uint64_t session_id;
	uint64_t caps;
	uint64_t flags; /* KVP_CLIENT_F_* */
	char daemon_version[32];
	struct kvp_frame_buf in;
	int rxfds[KVP_CLIENT_MAX_FDS]; /* received, for the next frame completed */
	int nrxfds;
	struct pending pend[KVP_CLIENT_MAX_PENDING];
	Kvpool__Response *notice; /* a refusal of the connection (id 0, no result) */
	struct queued_event ev[KVP_CLIENT_MAX_EVENTS];
	unsigned ev_head, ev_n;
	uint64_t ev_dropped;
	struct kvp_pool *pools;
	/* Restarts: where and how to say Hello again, the session's token, the daemon's
	 * instance. */
	struct sockaddr_un sa;
	char name[64];
	uint64_t offer, required;
	uint32_t timeout_ms, reconnect_ms, grace_ms;
	uint8_t token[16];
	size_t token_len;
	uint64_t instance;
	bool reconnecting;
	bool retry;	     /* the connection was lost and no reconnect was tried since */
	pid_t pid;	     /* the process that connected: the session is its own */
	unsigned long forks; /* g_forks then */
};

/* Forks of this process's ancestors and itself since libkvpool was loaded, counted in each
 * child (pthread_atfork): what the paths without a system call compare (kvp__forked_fast). */
static unsigned long g_forks;
static pthread_once_t g_fork_once = PTHREAD_ONCE_INIT;

static void on_fork_child(void)
{
	__atomic_add_fetch(&g_forks, 1, __ATOMIC_RELAXED);
}

static void fork_watch(void)
{
	pthread_atfork(NULL, NULL, on_fork_child);
}

static int forked_fail(struct kvp_error *err, const struct kvp_client *c)
{
	return kvp__fail(err, KVP_E_FORKED, 0,
			 "this client was connected by pid %d, this is pid %d (a fork): connect a "
			 "client of its own",
			 (int)c->pid, (int)getpid());
}

int kvp__forked(const struct kvp_client *c, struct kvp_error *err)
{
	return c->pid == getpid() ? 0 : forked_fail(err, c);
}

int kvp__forked_fast(const struct kvp_client *c, struct kvp_error *err)
{
	return c->forks == __atomic_load_n(&g_forks, __ATOMIC_RELAXED) ? 0 : forked_fail(err, c);
}

static const char *const g_code_names[] = {
	"OK",
	"OUT_OF_CAPACITY",
	"HOST_BUDGET_EXCEEDED",
	"QUOTA_EXCEEDED",
	"NO_SUCH_POOL",
	"GEOMETRY_MISMATCH",
	"NOT_FOUND",
	"INVALID_ARGUMENT",
	"PERMISSION_DENIED",
	"PROTOCOL",
	"VERSION",
	"SHUTTING_DOWN",
	"LIMIT_EXCEEDED",
	"UNAVAILABLE",
	"INTERNAL",
	"RESTARTED",
};
static const char *const g_local_names[] = { "NO_DAEMON", "TRANSPORT", "NOMEM", "MAP",
					     "BUFFER",	  "AGAIN",     "FORKED" };
_Static_assert(sizeof(g_code_names) / sizeof(g_code_names[0]) == KVP_E_RESTARTED + 1, "names");
_Static_assert(sizeof(g_local_names) / sizeof(g_local_names[0]) == KVP_CODE_MAX - KVP_E_NO_DAEMON,
	       "local names");

KVP_EXPORT const char *kvp_code_name(int code)
{
	if (code == INT32_MIN)
		return "UNKNOWN";
	if (code < 0)
		code = -code;
	if (code <= KVP_E_RESTARTED)
		return g_code_names[code];
	if (code >= KVP_E_NO_DAEMON && code < KVP_CODE_MAX)
		return g_local_names[code - KVP_E_NO_DAEMON];
	return "UNKNOWN";
}

KVP_EXPORT const char *kvp_limit_name(int limit)
{
	static const char *const n[] = {
		"none",		  "MemAvailable",   "NUMA node free memory", "cgroup memory.max",
		"RLIMIT_MEMLOCK", "free huge pages"
	};

	return limit >= 0 && limit < KVP_LIMIT_MAX ? n[limit] : "?";
}

KVP_EXPORT const char *kvp_tier_name(int tier)
{
	return kvp_names_tier(tier);
}

KVP_EXPORT const char *kvp_backend_name(int backend)
{
	return kvp_names_backend(backend);
}

KVP_EXPORT const char *kvp_dtype_name(int dtype)
{
	return kvp_names_dtype(dtype);
}

int kvp__fail(struct kvp_error *err, int code, int sys_errno, const char *fmt, ...)
{
	va_list ap;

	if (err) {
		memset(err, 0, sizeof(*err));
		err->code = code;
		err->sys_errno = sys_errno;
		va_start(ap, fmt);
		vsnprintf(err->message, sizeof(err->message), fmt, ap);
		va_end(ap);
	}
	return -code;
}

static void geom_from(struct kvp_geometry *g, const Kvpool__Geometry *m)
{
	memset(g, 0, sizeof(*g));
	if (!m)
		return;
	g->layers = m->layers;
	g->kv_heads = m->kv_heads;
	g->head_dim = m->head_dim;
	g->dtype = (uint32_t)m->dtype;
	g->page_tokens = m->page_tokens;
}

int kvp__status_code(const Kvpool__Status *st)
{
	/* A code a newer daemon added passes through; one outside the daemon's range (negative,
	 * or into the library's) cannot be told from ours and says the reply is broken. */
	int code = (int)st->code;

	return code > 0 && code < KVP_E_NO_DAEMON ? code : KVP_E_PROTOCOL;
}

int kvp__status_to_error(const Kvpool__Status *st, struct kvp_error *err)
{
	int code = kvp__status_code(st);

	if (!err)
		return -code;
	memset(err, 0, sizeof(*err));
	err->code = code;
	if (code == KVP_E_PROTOCOL && (int)st->code != KVP_E_PROTOCOL) {
		snprintf(err->message, sizeof(err->message), "kvpoold sent unknown code %lld: %s",
			 (long long)st->code, st->message ? st->message : "");
		return -code;
	}
	snprintf(err->message, sizeof(err->message), "%s", st->message ? st->message : "");
	switch (st->detail_case) {
	case KVPOOL__STATUS__DETAIL_CAPACITY:
		err->detail = KVP_DETAIL_CAPACITY;
		err->capacity.tier = (uint32_t)st->capacity->tier;
		err->capacity.requested_tokens = st->capacity->requested_tokens;
		err->capacity.free_tokens = st->capacity->free_tokens;
		err->capacity.evictable_tokens = st->capacity->evictable_tokens;
		err->capacity.protected_tokens = st->capacity->protected_tokens;
		err->capacity.leased_tokens = st->capacity->leased_tokens;
		err->capacity.total_tokens = st->capacity->total_tokens;
		err->capacity_reserved_tokens = st->capacity->reserved_tokens;
		break;
	case KVPOOL__STATUS__DETAIL_BUDGET:
		err->detail = KVP_DETAIL_BUDGET;
		err->budget.requested_bytes = st->budget->requested_bytes;
		err->budget.available_bytes = st->budget->available_bytes;
		err->budget.limit = (uint32_t)st->budget->limit;
		err->budget.numa_node = st->budget->numa_node;
		snprintf(err->budget.pool, sizeof(err->budget.pool), "%s",
			 st->budget->pool ? st->budget->pool : "");
		break;
	case KVPOOL__STATUS__DETAIL_QUOTA:
		err->detail = KVP_DETAIL_QUOTA;
		err->quota.quota_tokens = st->quota->quota_tokens;
		err->quota.held_tokens = st->quota->held_tokens;
		err->quota.requested_tokens = st->quota->requested_tokens;
		break;
	case KVPOOL__STATUS__DETAIL_GEOMETRY:
		err->detail = KVP_DETAIL_GEOMETRY;
		geom_from(&err->geometry.expected, st->geometry->expected);
		geom_from(&err->geometry.actual, st->geometry->actual);
		break;
	case KVPOOL__STATUS__DETAIL_LIMIT:
		err->detail = KVP_DETAIL_LIMIT;
		snprintf(err->limit.what, sizeof(err->limit.what), "%s",
			 st->limit->what ? st->limit->what : "");
		err->limit.limit = st->limit->limit;
		break;
	default: break;
	}
	return -code;
}

static void close_fds(int *fds, int n)
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
		close_fds(fds, nfds);
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
	close_fds(fds, nfds);
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

static void pending_clear(struct pending *pd)
{
	if (pd->resp)
		kvpool__response__free_unpacked(pd->resp, NULL);
	close_fds(pd->fds, pd->nfds);
	memset(pd, 0, sizeof(*pd));
}

/* The connection failed: every outstanding request is given up. Returns the transport code. */
static int lose(struct kvp_client *c, int e, struct kvp_error *err)
{
	for (int i = 0; i < KVP_CLIENT_MAX_PENDING; i++)
		pending_clear(&c->pend[i]);
	close_fds(c->rxfds, c->nrxfds);
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

static int reconnect(struct kvp_client *c);

/* lose(), then: a restarted kvpoold that answers within reconnect_ms makes it RESTARTED. */
static int lose_call(struct kvp_client *c, int e, struct kvp_error *err)
{
	int r = lose(c, e, err);

	if (c->retry && c->instance && c->reconnect_ms != KVP_RECONNECT_NEVER && reconnect(c) == 0)
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
	    reconnect(c) == 0)
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
		pending_clear(pd);
		r = n->status ? kvp__status_to_error(n->status, err)
			      : kvp__fail(err, KVP_E_PROTOCOL, 0, "a refusal without a status");
		kvpool__response__free_unpacked(n, NULL);
		return r;
	}
	if (!pd->resp->status || pd->resp->status->code != KVPOOL__CODE__OK) {
		r = pd->resp->status ? kvp__status_to_error(pd->resp->status, err)
				     : kvp__fail(err, KVP_E_PROTOCOL, 0, "reply without a status");
		pending_clear(pd);
		return r;
	}
	if (want && (int)pd->resp->result_case != want) {
		r = kvp__fail(err, KVP_E_PROTOCOL, 0, "call %d answered with result %d",
			      (int)req->call_case, (int)pd->resp->result_case);
		pending_clear(pd);
		return r;
	}
	if (fds) {
		memcpy(fds, pd->fds, sizeof(int) * (size_t)pd->nfds);
		*nfds = pd->nfds;
	} else {
		close_fds(pd->fds, pd->nfds);
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

KVP_EXPORT const char *kvp_client_default_socket(char *buf, size_t len)
{
	return kvp_names_default_socket(buf, len) == 0 ? buf : NULL;
}

/* Declares req + the call message, fills the oneof. */
#define CALL_SETUP(req, field, CASE, Type, INIT)                                                   \
	Kvpool__Request req = KVPOOL__REQUEST__INIT;                                               \
	Type field = INIT;                                                                         \
	req.call_case = KVPOOL__REQUEST__CALL_##CASE;                                              \
	req.field = &field
#define RESULT(CASE) KVPOOL__RESPONSE__RESULT_##CASE

KVP_EXPORT struct kvp_client *kvp_client_connect_opts(const char *path,
						      const struct kvp_client_opts *caller_opts,
						      struct kvp_error *err)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct kvp_client_opts o, *opts = &o;
	CALL_SETUP(req, hello, HELLO, Kvpool__HelloReq, KVPOOL__HELLO_REQ__INIT);
	Kvpool__Response *resp;
	struct kvp_client *c;
	char def[sizeof(sa.sun_path)];
	uint64_t agreed;

	if (!caller_opts || caller_opts->struct_size < KVP_CLIENT_OPTS_SIZE_V02) {
		kvp__fail(err, KVP_E_INVALID_ARGUMENT, EINVAL, "struct kvp_client_opts too small");
		return NULL;
	}
	kvp__struct_in(&o, caller_opts, sizeof(o));
	if (!path && !(path = kvp_client_default_socket(def, sizeof(def)))) {
		kvp__fail(err, KVP_E_INVALID_ARGUMENT, ENAMETOOLONG, "socket path too long");
		return NULL;
	}
	if (strlen(path) >= sizeof(sa.sun_path)) {
		kvp__fail(err, KVP_E_INVALID_ARGUMENT, ENAMETOOLONG,
			  "socket path of %zu bytes does not fit a unix socket address (%zu)",
			  strlen(path), sizeof(sa.sun_path) - 1);
		return NULL;
	}
	memcpy(sa.sun_path, path, strlen(path) + 1);
	c = calloc(1, sizeof(*c));
	if (!c) {
		kvp__fail(err, KVP_E_NOMEM, ENOMEM, "out of memory");
		return NULL;
	}
	c->efd = c->epfd = -1;
	pthread_once(&g_fork_once, fork_watch);
	c->pid = getpid();
	c->forks = __atomic_load_n(&g_forks, __ATOMIC_RELAXED);
	kvp_frame_buf_init(&c->in);
	c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (c->fd < 0 || connect(c->fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int e = errno;

		kvp__fail(err, KVP_E_NO_DAEMON, e, "no kvpoold at %s (%s)", path,
			  e == ECONNREFUSED ? "connection refused"
			  : e == ENOENT	    ? "no such socket"
					    : strerror(e));
		kvp_client_close(c);
		return NULL;
	}
	if (opts->timeout_ms && kvp_client_set_timeout(c, opts->timeout_ms) < 0) {
		kvp__fail(err, KVP_E_INVALID_ARGUMENT, errno, "cannot set the timeout");
		kvp_client_close(c);
		return NULL;
	}
	hello.protocol_version = KVP_PROTOCOL_VERSION;
	hello.client_name = (char *)(opts->name ? opts->name : "");
	hello.pid = getpid();
	hello.capabilities = opts->capabilities | opts->required_capabilities;
	hello.required_capabilities = opts->required_capabilities;
	if (kvp__rpc(c, &req, RESULT(HELLO), &resp, NULL, NULL, err) < 0) {
		kvp_client_close(c);
		return NULL;
	}
	c->session_id = resp->hello->session_id;
	c->sa = sa;
	snprintf(c->name, sizeof(c->name), "%s", hello.client_name);
	c->offer = hello.capabilities;
	c->required = hello.required_capabilities;
	c->timeout_ms = opts->timeout_ms;
	c->reconnect_ms = opts->reconnect_ms ? opts->reconnect_ms : 3000;
	c->grace_ms = resp->hello->resume_grace_ms;
	c->instance = resp->hello->instance;
	if (resp->hello->resume_token.len == sizeof(c->token)) {
		memcpy(c->token, resp->hello->resume_token.data, sizeof(c->token));
		c->token_len = sizeof(c->token);
	}
	snprintf(c->daemon_version, sizeof(c->daemon_version), "%s",
		 resp->hello->daemon_version ? resp->hello->daemon_version : "");
	agreed = resp->hello->capabilities;
	kvpool__response__free_unpacked(resp, NULL);
	/* An answer must be within the offer, and hold what was required (an older daemon that
	 * ignores the requirement answers without it). */
	if ((agreed & ~hello.capabilities) ||
	    (agreed & opts->required_capabilities) != opts->required_capabilities) {
		kvp__fail(err, KVP_E_VERSION, 0,
			  "kvpoold agreed to capabilities 0x%llx; asked 0x%llx, required 0x%llx",
			  (unsigned long long)agreed, (unsigned long long)hello.capabilities,
			  (unsigned long long)opts->required_capabilities);
		kvp_client_close(c);
		return NULL;
	}
	c->caps = agreed;
	c->flags = opts->flags;
	return c;
}

KVP_EXPORT struct kvp_client *kvp_client_connect(const char *path, const char *name,
						 struct kvp_error *err)
{
	struct kvp_client_opts o = {
		.struct_size = sizeof(o),
		.name = name,
		.capabilities = KVP_CAP_ALL,
	};

	return kvp_client_connect_opts(path, &o, err);
}

/* ---- restarts ---- */

static uint64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* A new connection and Hello with the token: 0; -EAGAIN (no daemon yet: retry); -ESRCH (the
 * same kvpoold answers: the connection was lost for another reason). */
static int hello_again(struct kvp_client *c)
{
	CALL_SETUP(req, hello, HELLO, Kvpool__HelloReq, KVPOOL__HELLO_REQ__INIT);
	Kvpool__Response *resp;
	struct kvp_error e;

	c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (c->fd < 0)
		return -EAGAIN;
	if (connect(c->fd, (struct sockaddr *)&c->sa, sizeof(c->sa)) < 0 ||
	    (c->timeout_ms && kvp_client_set_timeout(c, c->timeout_ms) < 0)) {
		close(c->fd);
		c->fd = -1;
		return -EAGAIN;
	}
	hello.protocol_version = KVP_PROTOCOL_VERSION;
	hello.client_name = c->name;
	hello.pid = getpid();
	hello.capabilities = c->offer;
	hello.required_capabilities = c->required;
	hello.resume_token.data = c->token;
	hello.resume_token.len = c->token_len;
	if (kvp__rpc(c, &req, RESULT(HELLO), &resp, NULL, NULL, &e) < 0) {
		if (c->fd >= 0)
			close(c->fd);
		c->fd = -1;
		return -EAGAIN;
	}
	if (resp->hello->instance == c->instance) {
		kvpool__response__free_unpacked(resp, NULL);
		close(c->fd);
		c->fd = -1;
		return -ESRCH;
	}
	c->session_id = resp->hello->session_id;
	c->instance = resp->hello->instance;
	c->grace_ms = resp->hello->resume_grace_ms;
	c->caps = resp->hello->capabilities & c->offer;
	if (resp->hello->resume_token.len == sizeof(c->token))
		memcpy(c->token, resp->hello->resume_token.data, sizeof(c->token));
	kvpool__response__free_unpacked(resp, NULL);
	return 0;
}

static bool same_file(int a, int b)
{
	struct stat x, y;

	return a >= 0 && b >= 0 && fstat(a, &x) == 0 && fstat(b, &y) == 0 && x.st_dev == y.st_dev &&
	       x.st_ino == y.st_ino;
}

static int map_tier(struct kvp_pool *p, const Kvpool__TierInfo *ti, int fd, struct kvp_error *err);

/* Attaches p again; each tier keeps its mapping when the daemon hands the same memory. */
static int reattach(struct kvp_client *c, struct kvp_pool *p)
{
	CALL_SETUP(req, attach, ATTACH, Kvpool__AttachReq, KVPOOL__ATTACH_REQ__INIT);
	Kvpool__Response *resp;
	int fds[KVP_CLIENT_MAX_FDS], nfds = 0, r = 0;
	struct kvp_error e;

	attach.pool = p->name;
	if (kvp__rpc(c, &req, RESULT(ATTACH), &resp, fds, &nfds, &e) < 0) {
		return -1;
	}
	p->id = resp->attach->pool_id;
	for (size_t i = 0; i < resp->attach->n_tiers && r == 0; i++) {
		const Kvpool__TierInfo *ti = resp->attach->tiers[i];
		struct kvp_tier_map *t;
		int fd;

		if ((int)ti->tier < 0 || (int)ti->tier >= KVP_TIER_MAX || ti->fd_index < 0 ||
		    ti->fd_index >= nfds) {
			r = -1;
			break;
		}
		t = &p->tier[ti->tier];
		fd = fds[ti->fd_index];
		fds[ti->fd_index] = -1;
		if (t->m && ti->backend != KVPOOL__BACKEND__CUDA && same_file(t->m->fd, fd) &&
		    t->m->bytes == ti->bytes) {
			close(fd);
			continue;
		}
		kvp_mapping_unref(t->m);
		t->m = NULL;
		t->present = 0;
		r = map_tier(p, ti, fd, &e);
	}
	close_fds(fds, nfds);
	kvpool__response__free_unpacked(resp, NULL);
	return r;
}

/* After lose(): retries Hello until reconnect_ms passes, then re-attaches. 0 or -1. */
static int reconnect(struct kvp_client *c)
{
	uint64_t deadline = mono_ms() + c->reconnect_ms;
	uint32_t wait = 10;
	int r;

	c->reconnecting = true;
	c->retry = false; /* one try per loss: a kvpoold gone for good costs one deadline */
	while ((r = hello_again(c)) == -EAGAIN && mono_ms() < deadline) {
		struct timespec ts = { 0, (long)wait * 1000000L };

		nanosleep(&ts, NULL);
		wait = wait * 2 > 250 ? 250 : wait * 2;
	}
	for (struct kvp_pool *p = c->pools; r == 0 && p; p = p->next)
		if (reattach(c, p) < 0)
			r = -1;
	c->reconnecting = false;
	if (r < 0 && c->fd >= 0) {
		close(c->fd);
		c->fd = -1;
	}
	return r < 0 ? -1 : 0;
}

/* ---- mappings ---- */

static struct kvp_mapping *mapping_new(int tier, int backend, int fd, uint64_t bytes)
{
	struct kvp_mapping *m = calloc(1, sizeof(*m));

	if (!m)
		return NULL;
	m->refs = 1;
	m->tier = tier;
	m->backend = backend;
	m->fd = fd;
	m->bytes = bytes;
	m->cuda_device = -1;
	return m;
}

KVP_EXPORT struct kvp_mapping *kvp_mapping_ref(struct kvp_mapping *m)
{
	__atomic_add_fetch(&m->refs, 1, __ATOMIC_RELAXED);
	return m;
}

KVP_EXPORT void kvp_mapping_unref(struct kvp_mapping *m)
{
	if (!m || __atomic_sub_fetch(&m->refs, 1, __ATOMIC_ACQ_REL) != 0)
		return;
#if KVP_HAVE_CUDA
	if (m->backend == KVP_BACKEND_CUDA && m->base)
		kvp_cuda_mem_destroy(&m->cm);
	else
#endif
		if (m->base)
		munmap(m->base, m->bytes);
	if (m->fd >= 0)
		close(m->fd);
	free(m);
}

KVP_EXPORT void *kvp_mapping_base(const struct kvp_mapping *m)
{
	return m->base;
}

KVP_EXPORT uint64_t kvp_mapping_bytes(const struct kvp_mapping *m)
{
	return m->bytes;
}

KVP_EXPORT int kvp_mapping_tier(const struct kvp_mapping *m)
{
	return m->tier;
}

KVP_EXPORT int kvp_mapping_backend(const struct kvp_mapping *m)
{
	return m->backend;
}

KVP_EXPORT int kvp_mapping_cuda_device(const struct kvp_mapping *m)
{
	return m->backend == KVP_BACKEND_CUDA && m->cuda_device >= 0 ? m->cuda_device : -1;
}

static void pool_unmap(struct kvp_pool *p)
{
	kvp__resv_close(p->resv);
	p->resv = NULL;
	for (int t = 0; t < KVP_TIER_MAX; t++) {
		kvp_mapping_unref(p->tier[t].m);
		p->tier[t].m = NULL;
		p->tier[t].present = 0;
	}
}

KVP_EXPORT void kvp_client_close(struct kvp_client *c)
{
	if (!c)
		return;
	while (c->pools) {
		struct kvp_pool *p = c->pools;

		c->pools = p->next;
		pool_unmap(p);
		free(p);
	}
	for (int i = 0; i < KVP_CLIENT_MAX_PENDING; i++)
		pending_clear(&c->pend[i]);
	close_fds(c->rxfds, c->nrxfds);
	while (c->ev_n) {
		free(c->ev[c->ev_head].bytes);
		c->ev_head = (c->ev_head + 1) % KVP_CLIENT_MAX_EVENTS;
		c->ev_n--;
	}
	if (c->notice)
		kvpool__response__free_unpacked(c->notice, NULL);
	if (c->fd >= 0)
		close(c->fd);
	if (c->efd >= 0)
		close(c->efd);
	if (c->epfd >= 0)
		close(c->epfd);
	kvp_frame_buf_release(&c->in);
	free(c);
}

KVP_EXPORT uint64_t kvp_client_session_id(const struct kvp_client *c)
{
	return c->session_id;
}

KVP_EXPORT const char *kvp_client_daemon_version(const struct kvp_client *c)
{
	return c->daemon_version;
}

KVP_EXPORT uint64_t kvp_client_capabilities(const struct kvp_client *c)
{
	return c->caps;
}

KVP_EXPORT int kvp_client_set_timeout(struct kvp_client *c, uint32_t ms)
{
	struct timeval tv = { .tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000 };

	if (c->fd < 0 || setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0)
		return -KVP_E_INVALID_ARGUMENT;
	return 0;
}

/* Sends req, expects result `want`, and frees the reply: for calls that return nothing. */
static int rpc_void(struct kvp_client *c, Kvpool__Request *req, int want, struct kvp_error *err)
{
	Kvpool__Response *resp;
	int r = kvp__rpc(c, req, want, &resp, NULL, NULL, err);

	if (r == 0)
		kvpool__response__free_unpacked(resp, NULL);
	return r;
}

KVP_EXPORT int kvp_client_ping(struct kvp_client *c, struct kvp_error *err)
{
	CALL_SETUP(req, ping, PING, Kvpool__PingReq, KVPOOL__PING_REQ__INIT);
	Kvpool__Response *resp;
	int r;

	ping.nonce = c->next_id + 1;
	r = kvp__rpc(c, &req, RESULT(PING), &resp, NULL, NULL, err);
	if (r < 0)
		return r;
	if (resp->ping->nonce != ping.nonce)
		r = kvp__fail(err, KVP_E_PROTOCOL, 0, "ping answered with the wrong nonce");
	kvpool__response__free_unpacked(resp, NULL);
	return r;
}

static void counters_from(struct kvp_counter *out, uint32_t *n, Kvpool__Counter **in, size_t nin)
{
	*n = 0;
	for (size_t i = 0; i < nin && i < KVP_STATUS_MAX_COUNTERS; i++) {
		snprintf(out[i].name, sizeof(out[i].name), "%s", in[i]->name ? in[i]->name : "");
		out[i].value = in[i]->value;
		(*n)++;
	}
}

/* moving: the pool's row of kvp_status.moving_tokens. */
static void pool_status_from(struct kvp_pool_status *po, uint64_t *moving,
			     const Kvpool__PoolStats *ps)
{
	snprintf(po->name, sizeof(po->name), "%s", ps->name ? ps->name : "");
	po->pool_id = ps->pool_id;
	geom_from(&po->geometry, ps->geometry);
	po->hit_tokens = ps->hit_tokens;
	po->queried_tokens = ps->queried_tokens;
	po->token_bytes = ps->token_bytes;
	po->sessions = ps->sessions;
	po->session_quota_tokens = ps->session_quota_tokens;
	snprintf(po->eviction, sizeof(po->eviction), "%s", ps->eviction ? ps->eviction : "");
	po->nodes = ps->nodes;
	po->demoted_tokens = ps->demoted_tokens;
	po->promoted_tokens = ps->promoted_tokens;
	po->allocs = ps->allocs;
	po->frees = ps->frees;
	po->alloc_failures = ps->alloc_failures;
	counters_from(po->counters, &po->n_counters, ps->counters, ps->n_counters);
	for (size_t t = 0; t < ps->n_tiers; t++) {
		const Kvpool__TierStats *ts = ps->tiers[t];
		struct kvp_tier_status *to;

		if ((int)ts->tier < 0 || (int)ts->tier >= KVP_TIER_MAX)
			continue;
		to = &po->tiers[ts->tier];
		to->present = 1;
		to->backend = (uint32_t)ts->backend;
		to->total_tokens = ts->total_tokens;
		to->free_tokens = ts->free_tokens;
		to->leased_tokens = ts->leased_tokens;
		to->cached_tokens = ts->cached_tokens;
		to->evictable_tokens = ts->evictable_tokens;
		to->protected_tokens = ts->protected_tokens;
		to->numa_node = ts->numa_node;
		to->evicted_tokens = ts->evicted_tokens;
		moving[ts->tier] = ts->moving_tokens;
	}
}

KVP_EXPORT int kvp_client_status(struct kvp_client *c, struct kvp_status *out,
				 struct kvp_error *err)
{
	CALL_SETUP(req, status, STATUS, Kvpool__StatusReq, KVPOOL__STATUS_REQ__INIT);
	Kvpool__Response *resp;
	Kvpool__StatusResp *s;
	struct kvp_status *st;
	int r;

	if (!out || out->struct_size < KVP_STATUS_SIZE_V02)
		return kvp__fail(err, KVP_E_INVALID_ARGUMENT, 0, "struct kvp_status too small");
	r = kvp__rpc(c, &req, RESULT(STATUS_INFO), &resp, NULL, NULL, err);
	if (r < 0)
		return r;
	/* filled whole here (tens of KiB: not on the caller's stack), copied out as far as the
	 * caller's struct_size reaches */
	st = calloc(1, sizeof(*st));
	if (!st) {
		kvpool__response__free_unpacked(resp, NULL);
		return kvp__fail(err, KVP_E_NOMEM, ENOMEM, "out of memory");
	}
	st->struct_size = out->struct_size;
	s = resp->status_info;
	snprintf(st->daemon_version, sizeof(st->daemon_version), "%s",
		 s->daemon_version ? s->daemon_version : "");
	st->uptime_ms = s->uptime_ms;
	st->sessions = s->sessions;
	st->pid = s->pid;
	st->draining = s->draining;
	for (size_t i = 0; i < s->n_pools && i < KVP_STATUS_MAX_POOLS; i++, st->n_pools++)
		pool_status_from(&st->pools[i], st->moving_tokens[i], s->pools[i]);
	counters_from(st->counters, &st->n_counters, s->counters, s->n_counters);
	for (size_t i = KVP_STATUS_MAX_COUNTERS;
	     i < s->n_counters && st->n_more_counters < KVP_STATUS_MORE_COUNTERS; i++) {
		struct kvp_counter *m = &st->more_counters[st->n_more_counters++];

		snprintf(m->name, sizeof(m->name), "%s",
			 s->counters[i]->name ? s->counters[i]->name : "");
		m->value = s->counters[i]->value;
	}
	kvpool__response__free_unpacked(resp, NULL);
	kvp__struct_out(out, st, sizeof(*st));
	free(st);
	return 0;
}

KVP_EXPORT int kvp_client_metrics(struct kvp_client *c, char *buf, size_t len,
				  struct kvp_error *err)
{
	CALL_SETUP(req, metrics, METRICS, Kvpool__MetricsReq, KVPOOL__METRICS_REQ__INIT);
	Kvpool__Response *resp;
	size_t n;
	int r = kvp__rpc(c, &req, RESULT(METRICS), &resp, NULL, NULL, err);

	if (r < 0)
		return r;
	n = resp->metrics->text ? strlen(resp->metrics->text) : 0;
	if (n + 1 > len || n > INT32_MAX)
		r = kvp__fail(err, KVP_E_BUFFER, 0, "metrics need %zu bytes", n + 1);
	else {
		memcpy(buf, n ? resp->metrics->text : "", n + 1);
		r = (int)n;
	}
	kvpool__response__free_unpacked(resp, NULL);
	return r;
}

/* Writes entry e (this version's `size` bytes, filled by the caller) as entry i of a listing of
 * stride entries[0].struct_size: min(stride, size) bytes, struct_size set to the stride. */
static void list_put(void *entries, uint32_t i, void *e, size_t size)
{
	size_t stride = *(size_t *)entries;
	char *d = (char *)entries + stride * i;

	*(size_t *)d = stride;
	kvp__struct_out(d, e, size);
}

/* The stride must hold the entry's first version and keep every entry aligned. */
static int list_check(void *entries, uint32_t cap, size_t first_size, struct kvp_error *err)
{
	if (cap &&
	    (!entries || *(size_t *)entries < first_size || *(size_t *)entries % _Alignof(size_t)))
		return kvp__fail(err, KVP_E_INVALID_ARGUMENT, 0, "listing entries too small");
	return 0;
}

static int list_count(size_t n, struct kvp_error *err)
{
	return n > INT32_MAX ? kvp__fail(err, KVP_E_PROTOCOL, 0, "a listing of %zu", n) : (int)n;
}

KVP_EXPORT int kvp_session_list(struct kvp_client *c, struct kvp_session_info *entries,
				uint32_t cap, struct kvp_error *err)
{
	CALL_SETUP(req, sessions, SESSIONS, Kvpool__SessionsReq, KVPOOL__SESSIONS_REQ__INIT);
	Kvpool__Response *resp;
	Kvpool__SessionsResp *m;
	int r;

	if ((r = list_check(entries, cap, KVP_SESSION_INFO_SIZE_V02, err)) < 0)
		return r;
	if ((r = kvp__rpc(c, &req, RESULT(SESSIONS), &resp, NULL, NULL, err)) < 0)
		return r;
	m = resp->sessions;
	for (uint32_t i = 0; i < m->n_sessions && i < cap; i++) {
		const Kvpool__SessionInfo *s = m->sessions[i];
		struct kvp_session_info e = { 0 }, *o = &e;

		o->session_id = s->session_id;
		o->pid = s->pid;
		o->uid = s->uid;
		o->gid = s->gid;
		snprintf(o->name, sizeof(o->name), "%s", s->name ? s->name : "");
		o->leased_tokens = s->leased_tokens;
		o->locked_tokens = s->locked_tokens;
		o->leases = s->leases;
		o->locks = s->locks;
		o->age_ms = s->age_ms;
		o->idle_ms = s->idle_ms;
		list_put(entries, i, &e, sizeof(e));
	}
	r = list_count(m->n_sessions, err);
	kvpool__response__free_unpacked(resp, NULL);
	return r;
}

KVP_EXPORT int kvp_cache_list(struct kvp_client *c, const char *pool,
			      struct kvp_cache_prefix *entries, uint32_t cap, struct kvp_error *err)
{
	CALL_SETUP(req, cache, CACHE, Kvpool__CacheReq, KVPOOL__CACHE_REQ__INIT);
	Kvpool__Response *resp;
	Kvpool__CacheResp *m;
	int r;

	if ((r = list_check(entries, cap, KVP_CACHE_PREFIX_SIZE_V02, err)) < 0)
		return r;
	cache.pool = (char *)(pool ? pool : "");
	if ((r = kvp__rpc(c, &req, RESULT(CACHE), &resp, NULL, NULL, err)) < 0)
		return r;
	m = resp->cache;
	for (uint32_t i = 0; i < m->n_top && i < cap; i++) {
		struct kvp_cache_prefix e = { 0 };

		e.tokens = m->top[i]->tokens;
		e.hits = m->top[i]->hits;
		e.ns = m->top[i]->namespace_;
		list_put(entries, i, &e, sizeof(e));
	}
	r = list_count(m->n_top, err);
	kvpool__response__free_unpacked(resp, NULL);
	return r;
}

static int map_tier(struct kvp_pool *p, const Kvpool__TierInfo *ti, int fd, struct kvp_error *err)
{
	struct kvp_tier_map *t = &p->tier[ti->tier];
	struct kvp_mapping *m = mapping_new((int)ti->tier, (int)ti->backend, fd, ti->bytes);

	if (!m) {
		close(fd);
		return kvp__fail(err, KVP_E_NOMEM, ENOMEM, "out of memory");
	}
	t->present = 1;
	t->pages = ti->pages;
	t->m = m;
	m->cuda_device = ti->cuda_device;
	if (ti->backend == KVPOOL__BACKEND__CUDA) {
#if KVP_HAVE_CUDA
		char why[256] = "";
		int r = 0;

		/* the daemon's number for the GPU may not be ours: find it by its UUID */
		if (ti->cuda_uuid.len != 0 && ti->cuda_uuid.len != 16)
			return kvp__fail(err, KVP_E_PROTOCOL, 0,
					 "attach reply: a GPU uuid of %zu bytes",
					 ti->cuda_uuid.len);
		if (ti->cuda_uuid.len == 16)
			r = m->cuda_device =
				kvp_cuda_device_by_uuid(ti->cuda_uuid.data, why, sizeof(why));
		if (r >= 0)
			r = kvp_cuda_mem_import(m->cuda_device, fd, ti->bytes, &m->cm, why,
						sizeof(why));
		if (r < 0)
			return kvp__fail(err, KVP_E_MAP, -r, "importing the cuda device tier: %s",
					 why);
		m->base = (void *)(uintptr_t)m->cm.dptr;
#endif
		return 0;
	}
	m->base = mmap(NULL, ti->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m->base == MAP_FAILED) {
		int e = errno;

		m->base = NULL;
		return kvp__fail(err, KVP_E_MAP, e, "mapping the %s tier (%lu bytes): %s",
				 kvp_tier_name((int)ti->tier), (unsigned long)ti->bytes,
				 strerror(e));
	}
	return 0;
}

KVP_EXPORT struct kvp_pool *kvp_pool_attach(struct kvp_client *c, const char *name,
					    const struct kvp_geometry *expected,
					    struct kvp_error *err)
{
	struct kvp_pool_opts o = { .struct_size = sizeof(o), .expected = expected };

	return kvp_pool_attach_opts(c, name, &o, err);
}

/* The reserve region of an Attach reply, when there is one. 0 or a negative code. */
static int attach_resv(struct kvp_pool *p, const Kvpool__AttachResp *a, int *fds, int nfds,
		       struct kvp_error *err)
{
	int fd;

	if (!a->reserve_bytes)
		return 0;
	if (a->reserve_fd_index < 0 || a->reserve_fd_index >= nfds ||
	    fds[a->reserve_fd_index] < 0 || a->n_reserve_pages > KVP_TIER_MAX)
		return kvp__fail(err, KVP_E_PROTOCOL, 0, "attach reply names a bad reserve fd");
	fd = fds[a->reserve_fd_index];
	fds[a->reserve_fd_index] = -1;
	return kvp__resv_open(p->c, p->id, fd, a->reserve_bytes, a->reserve_slots, a->reserve_pages,
			      a->n_reserve_pages, &p->resv, err);
}

KVP_EXPORT struct kvp_pool *kvp_pool_attach_opts(struct kvp_client *c, const char *name,
						 const struct kvp_pool_opts *opts,
						 struct kvp_error *err)
{
	CALL_SETUP(req, attach, ATTACH, Kvpool__AttachReq, KVPOOL__ATTACH_REQ__INIT);
	struct kvp_pool_opts o = { 0 };
	const struct kvp_geometry *expected;
	Kvpool__Geometry eg = KVPOOL__GEOMETRY__INIT;
	Kvpool__Response *resp;
	Kvpool__AttachResp *a;
	int fds[KVP_CLIENT_MAX_FDS], nfds = 0, r;
	struct kvp_pool *p;

	if (opts) {
		if (opts->struct_size < KVP_POOL_OPTS_SIZE_V03) {
			kvp__fail(err, KVP_E_INVALID_ARGUMENT, 0, "opts->struct_size is not set");
			return NULL;
		}
		kvp__struct_in(&o, opts, sizeof(o));
	}
	expected = o.expected;
	attach.reserve_device_pages = o.reserve_pages[KVP_TIER_DEVICE];
	attach.reserve_host_pages = o.reserve_pages[KVP_TIER_HOST];
	attach.pool = (char *)name;
	if (expected) {
		eg.layers = expected->layers;
		eg.kv_heads = expected->kv_heads;
		eg.head_dim = expected->head_dim;
		eg.dtype = (Kvpool__Dtype)expected->dtype;
		eg.page_tokens = expected->page_tokens;
		attach.expected = &eg;
	}
	attach.pressure_notices = (c->flags & KVP_CLIENT_F_PRESSURE) && (c->caps & KVP_CAP_EVENTS);
	if (kvp__rpc(c, &req, RESULT(ATTACH), &resp, fds, &nfds, err) < 0)
		return NULL;
	p = calloc(1, sizeof(*p));
	if (!p) {
		kvp__fail(err, KVP_E_NOMEM, ENOMEM, "out of memory");
		goto fail;
	}
	a = resp->attach;
	p->c = c;
	p->id = a->pool_id;
	snprintf(p->name, sizeof(p->name), "%s", a->pool ? a->pool : "");
	geom_from(&p->g, a->geometry);
	p->pressure = a->pressure_notices;
	for (size_t t = 0; t < a->n_pressure_watermark_tokens && t < KVP_TIER_MAX; t++)
		p->pressure_wm[t] = a->pressure_watermark_tokens[t];
	for (size_t i = 0; i < a->n_tiers; i++) {
		const Kvpool__TierInfo *ti = a->tiers[i];

		if ((int)ti->tier < 0 || (int)ti->tier >= KVP_TIER_MAX || ti->fd_index < 0 ||
		    ti->fd_index >= nfds || fds[ti->fd_index] < 0 || p->tier[ti->tier].present) {
			kvp__fail(err, KVP_E_PROTOCOL, 0, "attach reply names a bad tier or fd");
			goto fail;
		}
		p->cg.row_bytes = ti->row_bytes;
		p->page_bytes = ti->page_bytes;
		r = map_tier(p, ti, fds[ti->fd_index], err);
		fds[ti->fd_index] = -1; /* the mapping owns it, mapped or not */
		if (r < 0)
			goto fail;
	}
	if (attach_resv(p, a, fds, nfds, err) < 0)
		goto fail;
	p->cg.layers = p->g.layers;
	p->cg.page_tokens = p->g.page_tokens;
	p->cg.dev_slots =
		(uint64_t)(p->tier[KVP_TIER_DEVICE].present ? p->tier[KVP_TIER_DEVICE].pages : 1) *
		p->g.page_tokens;
	close_fds(fds, nfds);
	kvpool__response__free_unpacked(resp, NULL);
	p->next = c->pools;
	c->pools = p;
	return p;
fail:
	if (p)
		pool_unmap(p);
	close_fds(fds, nfds);
	free(p);
	kvpool__response__free_unpacked(resp, NULL);
	return NULL;
}

KVP_EXPORT int kvp_pool_detach(struct kvp_pool *p, struct kvp_error *err)
{
	CALL_SETUP(req, detach, DETACH, Kvpool__DetachReq, KVPOOL__DETACH_REQ__INIT);
	struct kvp_client *c;
	int r;

	if (!p)
		return 0;
	c = p->c;
	detach.pool_id = p->id;
	r = rpc_void(c, &req, RESULT(DETACH), err);
	for (struct kvp_pool **pp = &c->pools; *pp; pp = &(*pp)->next) {
		if (*pp == p) {
			*pp = p->next;
			break;
		}
	}
	pool_unmap(p);
	free(p);
	return r;
}

KVP_EXPORT uint32_t kvp_pool_id(const struct kvp_pool *p)
{
	return p->id;
}

KVP_EXPORT void kvp_pool_geometry(const struct kvp_pool *p, struct kvp_geometry *out)
{
	*out = p->g;
}

static const struct kvp_tier_map *tmap(const struct kvp_pool *p, int tier)
{
	return tier >= 0 && tier < KVP_TIER_MAX && p->tier[tier].present ? &p->tier[tier] : NULL;
}

KVP_EXPORT uint32_t kvp_pool_tier_pages(const struct kvp_pool *p, int tier)
{
	return tmap(p, tier) ? tmap(p, tier)->pages : 0;
}

KVP_EXPORT int kvp_pool_tier_backend(const struct kvp_pool *p, int tier)
{
	return tmap(p, tier) ? tmap(p, tier)->m->backend : KVP_BACKEND_NONE;
}

KVP_EXPORT int kvp_pool_tier_cuda_device(const struct kvp_pool *p, int tier)
{
	return tmap(p, tier) ? kvp_mapping_cuda_device(tmap(p, tier)->m) : -1;
}

KVP_EXPORT void *kvp_pool_tier_base(const struct kvp_pool *p, int tier)
{
	return tmap(p, tier) ? tmap(p, tier)->m->base : NULL;
}

KVP_EXPORT int kvp_pool_tier_fd(const struct kvp_pool *p, int tier)
{
	return tmap(p, tier) ? tmap(p, tier)->m->fd : -1;
}

KVP_EXPORT uint64_t kvp_pool_tier_bytes(const struct kvp_pool *p, int tier)
{
	return tmap(p, tier) ? tmap(p, tier)->m->bytes : 0;
}

KVP_EXPORT int kvp_pool_pressure_notices(const struct kvp_pool *p)
{
	return p && p->pressure ? 1 : 0;
}

KVP_EXPORT uint64_t kvp_pool_pressure_watermark(const struct kvp_pool *p, int tier)
{
	return p && tier >= 0 && tier < KVP_TIER_MAX ? p->pressure_wm[tier] : 0;
}

KVP_EXPORT struct kvp_mapping *kvp_pool_tier_mapping(struct kvp_pool *p, int tier)
{
	const struct kvp_tier_map *t = tmap(p, tier);

	return t && t->m->base ? kvp_mapping_ref(t->m) : NULL;
}

KVP_EXPORT uint64_t kvp_pool_row_bytes(const struct kvp_pool *p)
{
	return p->cg.row_bytes;
}

KVP_EXPORT uint64_t kvp_pool_page_bytes(const struct kvp_pool *p)
{
	return p->page_bytes;
}

KVP_EXPORT uint32_t kvp_pool_pages_for(const struct kvp_pool *p, uint64_t tokens)
{
	uint64_t pt = p->g.page_tokens, n;

	if (!pt)
		return 0;
	n = tokens / pt + (tokens % pt != 0);
	return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

KVP_EXPORT uint64_t kvp_pool_slot_offset(const struct kvp_pool *p, int tier, uint32_t layer,
					 uint32_t kv, uint32_t page, uint32_t tok)
{
	const struct kvp_tier_map *m = tmap(p, tier);

	if (!m || layer >= p->g.layers || kv > 1 || page >= m->pages || tok >= p->g.page_tokens)
		return UINT64_MAX;
	if (tier == KVP_TIER_DEVICE)
		return kvp_dev_offset(&p->cg, layer, kv, (uint64_t)page * p->g.page_tokens + tok);
	return kvp_host_offset(&p->cg, page, layer, kv, tok);
}

KVP_EXPORT void *kvp_pool_slot_addr(const struct kvp_pool *p, int tier, uint32_t layer, uint32_t kv,
				    uint32_t page, uint32_t tok)
{
	uint64_t off = kvp_pool_slot_offset(p, tier, layer, kv, page, tok);
	void *base = kvp_pool_tier_base(p, tier);

	return off == UINT64_MAX || !base ? NULL : (char *)base + off;
}

/* ---- leases ---- */

KVP_EXPORT int kvp_lease_alloc(struct kvp_pool *p, int tier, uint32_t npages, uint64_t *lease_id,
			       uint32_t *pages, struct kvp_error *err)
{
	CALL_SETUP(req, alloc, ALLOC, Kvpool__AllocReq, KVPOOL__ALLOC_REQ__INIT);
	Kvpool__Response *resp;
	int r;

	if ((r = kvp__forked_fast(p->c, err)) < 0)
		return r; /* the reserve's rings are the connecting process's */
	if (p->resv && kvp__resv_alloc(p->resv, tier, npages, lease_id, pages))
		return 0;
	alloc.pool_id = p->id;
	alloc.pages = npages;
	alloc.tier = (Kvpool__Tier)tier;
	r = kvp__rpc(p->c, &req, RESULT(ALLOC), &resp, NULL, NULL, err);
	if (r < 0)
		return r;
	if (resp->alloc->n_pages != npages) {
		uint64_t lease = resp->alloc->lease_id;
		size_t got = resp->alloc->n_pages;

		kvpool__response__free_unpacked(resp, NULL);
		/* The caller cannot use a lease of another size: give it back. */
		if (lease)
			kvp_lease_free(p, lease, NULL, 0, NULL);
		return kvp__fail(err, KVP_E_PROTOCOL, 0, "alloc answered with %zu pages, not %u",
				 got, npages);
	}
	*lease_id = resp->alloc->lease_id;
	if (npages)
		memcpy(pages, resp->alloc->pages, sizeof(uint32_t) * npages);
	kvpool__response__free_unpacked(resp, NULL);
	return 0;
}

KVP_EXPORT int kvp_lease_extend(struct kvp_pool *p, uint64_t lease_id, uint32_t npages,
				uint32_t *pages, struct kvp_error *err)
{
	CALL_SETUP(req, extend, EXTEND, Kvpool__ExtendReq, KVPOOL__EXTEND_REQ__INIT);
	Kvpool__Response *resp;
	int r;

	if ((r = kvp__forked_fast(p->c, err)) < 0)
		return r;
	if (p->resv) {
		if (kvp__resv_extend(p->resv, lease_id, npages, pages))
			return 0;
		if ((r = kvp__resv_bind(p->resv, lease_id, err)) < 0)
			return r;
	}
	extend.lease_id = lease_id;
	extend.pages = npages;
	r = kvp__rpc(p->c, &req, RESULT(EXTEND), &resp, NULL, NULL, err);
	if (r < 0)
		return r;
	if (resp->extend->n_pages != npages) {
		size_t got = resp->extend->n_pages;

		/* Pages of another count cannot be handed out: return the ones added. */
		if (got && got <= UINT32_MAX)
			kvp_lease_free(p, lease_id, resp->extend->pages, (uint32_t)got, NULL);
		kvpool__response__free_unpacked(resp, NULL);
		return kvp__fail(err, KVP_E_PROTOCOL, 0, "extend answered with %zu pages, not %u",
				 got, npages);
	}
	if (npages)
		memcpy(pages, resp->extend->pages, sizeof(uint32_t) * npages);
	kvpool__response__free_unpacked(resp, NULL);
	return 0;
}

KVP_EXPORT int kvp_lease_free(struct kvp_pool *p, uint64_t lease_id, const uint32_t *pages,
			      uint32_t n, struct kvp_error *err)
{
	CALL_SETUP(req, free, FREE, Kvpool__FreeReq, KVPOOL__FREE_REQ__INIT);
	Kvpool__Response *resp;
	uint32_t left;
	int r;

	if ((r = kvp__forked_fast(p->c, err)) < 0)
		return r;
	if (p->resv) {
		r = kvp__resv_free(p->resv, lease_id, pages, n, &left, err);
		if (r > 0)
			return (int)left;
		if (r < 0 || (r = kvp__resv_bind(p->resv, lease_id, err)) < 0)
			return r;
	}
	free.lease_id = lease_id;
	free.pages = (uint32_t *)pages;
	free.n_pages = n;
	r = kvp__rpc(p->c, &req, RESULT(FREE), &resp, NULL, NULL, err);
	if (r < 0)
		return r;
	r = resp->free->lease_pages > INT32_MAX
		    ? kvp__fail(err, KVP_E_PROTOCOL, 0, "free answered with %u pages left",
				resp->free->lease_pages)
		    : (int)resp->free->lease_pages;
	kvpool__response__free_unpacked(resp, NULL);
	return r;
}

/* ---- prefix cache ---- */

KVP_EXPORT int kvp_cache_insert(struct kvp_pool *p, uint64_t lease_id, uint64_t ns,
				const uint32_t *tokens, uint32_t ntokens, uint32_t cached_pages,
				const uint32_t *pages, uint32_t npages, uint64_t *new_tokens,
				struct kvp_error *err)
{
	CALL_SETUP(req, insert, INSERT, Kvpool__InsertReq, KVPOOL__INSERT_REQ__INIT);
	Kvpool__Response *resp;
	int r;

	if (p->resv && (r = kvp__resv_bind(p->resv, lease_id, err)) < 0)
		return r;
	insert.lease_id = lease_id;
	insert.namespace_ = ns;
	insert.tokens = (uint32_t *)tokens;
	insert.n_tokens = ntokens;
	insert.pages = (uint32_t *)pages;
	insert.n_pages = npages;
	insert.cached_pages = cached_pages;
	r = kvp__rpc(p->c, &req, RESULT(INSERT), &resp, NULL, NULL, err);
	if (r < 0)
		return r;
	if (new_tokens)
		*new_tokens = resp->insert->new_tokens;
	kvpool__response__free_unpacked(resp, NULL);
	return 0;
}

KVP_EXPORT int kvp_cache_match(struct kvp_pool *p, uint64_t ns, const uint32_t *tokens,
			       uint32_t ntokens, int lock, struct kvp_match_result *m,
			       uint32_t *device_pages, uint32_t *host_pages, uint32_t cap,
			       struct kvp_error *err)
{
	CALL_SETUP(req, match, MATCH, Kvpool__MatchReq, KVPOOL__MATCH_REQ__INIT);
	Kvpool__Response *resp;
	Kvpool__MatchResp *mr;
	struct kvp_match_result o = { 0 };
	int r;

	if (!m || m->struct_size < KVP_MATCH_RESULT_SIZE_V02)
		return kvp__fail(err, KVP_E_INVALID_ARGUMENT, 0,
				 "struct kvp_match_result too small");
	match.pool_id = p->id;
	match.namespace_ = ns;
	match.tokens = (uint32_t *)tokens;
	match.n_tokens = ntokens;
	kvp__match_flags(lock, &match.lock, &match.local_only);
	r = kvp__rpc(p->c, &req, RESULT(MATCH), &resp, NULL, NULL, err);
	if (r < 0)
		return r;
	mr = resp->match;
	if (mr->n_device_pages > cap || mr->n_host_pages > cap) {
		uint64_t lock_id = mr->lock_id;

		/* The caller cannot take the pages: give the lock back rather than leak it. */
		kvpool__response__free_unpacked(resp, NULL);
		if (lock_id)
			kvp_cache_release(p, lock_id, NULL);
		return kvp__fail(err, KVP_E_BUFFER, 0, "match: %u entries do not hold the reply",
				 cap);
	}
	o.matched_tokens = mr->matched_tokens;
	o.n_device = (uint32_t)mr->n_device_pages;
	o.n_host = (uint32_t)mr->n_host_pages;
	o.lock_id = mr->lock_id;
	o.remote_pages = mr->remote_pages;
	kvp__struct_out(m, &o, sizeof(o));
	kvp__pages_out(device_pages, mr->device_pages, mr->n_device_pages, host_pages,
		       mr->host_pages, mr->n_host_pages);
	kvpool__response__free_unpacked(resp, NULL);
	return 0;
}

KVP_EXPORT int kvp_cache_release(struct kvp_pool *p, uint64_t lock_id, struct kvp_error *err)
{
	CALL_SETUP(req, release, RELEASE, Kvpool__ReleaseReq, KVPOOL__RELEASE_REQ__INIT);

	release.lock_id = lock_id;
	return rpc_void(p->c, &req, RESULT(RELEASE), err);
}

KVP_EXPORT int kvp_cache_load(struct kvp_pool *p, uint64_t lock_id, uint32_t *device_pages,
			      uint32_t cap, struct kvp_error *err)
{
	CALL_SETUP(req, load, LOAD, Kvpool__LoadReq, KVPOOL__LOAD_REQ__INIT);
	Kvpool__Response *resp;
	size_t n;
	int r;

	load.lock_id = lock_id;
	r = kvp__rpc(p->c, &req, RESULT(LOAD), &resp, NULL, NULL, err);
	if (r < 0)
		return r;
	n = resp->load->n_device_pages;
	if (n > cap) {
		r = kvp__fail(err, KVP_E_BUFFER, 0, "load: %u entries do not hold %zu pages", cap,
			      n);
	} else {
		if (n)
			memcpy(device_pages, resp->load->device_pages, sizeof(uint32_t) * n);
		r = (int)n;
	}
	kvpool__response__free_unpacked(resp, NULL);
	return r;
}

/* ---- administration ---- */

KVP_EXPORT int kvp_admin_evict(struct kvp_client *c, const char *pool, int tier, uint64_t tokens,
			       uint64_t *evicted, struct kvp_error *err)
{
	CALL_SETUP(req, evict, EVICT, Kvpool__EvictReq, KVPOOL__EVICT_REQ__INIT);
	Kvpool__Response *resp;
	int r;

	evict.pool = (char *)pool;
	evict.tier = (Kvpool__Tier)tier;
	evict.tokens = tokens;
	r = kvp__rpc(c, &req, RESULT(EVICT), &resp, NULL, NULL, err);
	if (r < 0)
		return r;
	if (evicted)
		*evicted = resp->evict->evicted_tokens;
	kvpool__response__free_unpacked(resp, NULL);
	return 0;
}

KVP_EXPORT int kvp_admin_flush(struct kvp_client *c, const char *pool, uint64_t *evicted,
			       struct kvp_error *err)
{
	CALL_SETUP(req, flush, FLUSH, Kvpool__FlushReq, KVPOOL__FLUSH_REQ__INIT);
	Kvpool__Response *resp;
	int r;

	flush.pool = (char *)pool;
	r = kvp__rpc(c, &req, RESULT(FLUSH), &resp, NULL, NULL, err);
	if (r < 0)
		return r;
	if (evicted)
		*evicted = resp->flush->evicted_tokens;
	kvpool__response__free_unpacked(resp, NULL);
	return 0;
}

KVP_EXPORT int kvp_admin_drain(struct kvp_client *c, uint32_t deadline_ms, struct kvp_error *err)
{
	CALL_SETUP(req, drain, DRAIN, Kvpool__DrainReq, KVPOOL__DRAIN_REQ__INIT);

	drain.deadline_ms = deadline_ms;
	return rpc_void(c, &req, RESULT(DRAIN), err);
}

KVP_EXPORT int kvp_admin_drain_cancel(struct kvp_client *c, struct kvp_error *err)
{
	CALL_SETUP(req, drain, DRAIN, Kvpool__DrainReq, KVPOOL__DRAIN_REQ__INIT);
	Kvpool__Response *resp;
	int r;

	drain.cancel = true;
	if ((r = kvp__rpc(c, &req, RESULT(DRAIN), &resp, NULL, NULL, err)) < 0)
		return r;
	r = resp->drain->was_draining ? 1 : 0;
	kvpool__response__free_unpacked(resp, NULL);
	return r;
}

KVP_EXPORT int kvp_admin_reload(struct kvp_client *c, struct kvp_reload_item *entries, uint32_t cap,
				struct kvp_error *err)
{
	CALL_SETUP(req, reload, RELOAD, Kvpool__ReloadReq, KVPOOL__RELOAD_REQ__INIT);
	Kvpool__Response *resp;
	Kvpool__ReloadResp *m;
	uint32_t k = 0;
	int r;

	if ((r = list_check(entries, cap, KVP_RELOAD_ITEM_SIZE_V02, err)) < 0)
		return r;
	if ((r = kvp__rpc(c, &req, RESULT(RELOAD), &resp, NULL, NULL, err)) < 0)
		return r;
	m = resp->reload;
	for (int refused = 0; refused < 2; refused++) {
		char **lines = refused ? m->refused : m->changes;
		size_t n = refused ? m->n_refused : m->n_changes;

		for (size_t i = 0; i < n; i++, k++) {
			struct kvp_reload_item e = { 0 };

			if (k >= cap)
				continue;
			e.refused = (uint32_t)refused;
			snprintf(e.text, sizeof(e.text), "%s", lines[i] ? lines[i] : "");
			list_put(entries, k, &e, sizeof(e));
		}
	}
	r = list_count(m->n_changes + m->n_refused, err);
	kvpool__response__free_unpacked(resp, NULL);
	return r;
}

struct kvp_resv *kvp__pool_resv(const struct kvp_pool *p)
{
	return p ? p->resv : NULL;
}

KVP_EXPORT uint32_t kvp_pool_reserve_pages(const struct kvp_pool *p, int tier)
{
	return p ? kvp__resv_granted(p->resv, tier) : 0;
}

struct kvp_client *kvp__pool_client(const struct kvp_pool *p)
{
	return p ? p->c : NULL;
}
