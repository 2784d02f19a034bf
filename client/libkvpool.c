/* libkvpool.c - the kvpool client library: synchronous calls over the unix socket, and the
 * pool mappings through which an engine reads and writes K/V bytes directly. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "kv_copy.h"
#include "kvp_config.h"
#include "kvp_internal.h"
#if KVP_HAVE_CUDA
#include "cuda_drv.h"
#endif

_Static_assert((int)KVP_E_INTERNAL == (int)KVPOOL__CODE__INTERNAL, "codes follow the wire");
_Static_assert((int)KVP_E_UNAVAILABLE == (int)KVPOOL__CODE__UNAVAILABLE, "codes follow the wire");
_Static_assert((int)KVP_DTYPE_FP32 == (int)KVPOOL__DTYPE__FP32, "dtypes follow the wire");
_Static_assert((int)KVP_BACKEND_MEMFD == (int)KVPOOL__BACKEND__MEMFD, "backends follow the wire");
_Static_assert((int)KVP_LIMIT_HUGEPAGES_FREE == (int)KVPOOL__LIMIT__HUGEPAGES_FREE, "limits follow");

struct kvp_tier_map {
	int present;
	int backend;
	int fd;
	void *base;
	uint64_t bytes;
	uint32_t pages;
	int cuda_device;
#if KVP_HAVE_CUDA
	struct kvp_cuda_mem cm;
#endif
};

struct kvp_pool {
	struct kvp_client *c;
	uint32_t id;
	char name[64];
	struct kvp_geometry g;
	struct kvp_copy_geom cg;
	uint64_t page_bytes;
	struct kvp_tier_map tier[KVP_TIER_MAX];
	struct kvp_pool *next;
};

struct kvp_client {
	int fd;
	uint64_t next_id;
	uint64_t session_id;
	char daemon_version[32];
	struct kvp_frame_buf in;
	struct kvp_pool *pools;
};

KVP_EXPORT const char *kvp_strerror(int code)
{
	static const char *const names[] = {
		"OK",	       "OUT_OF_CAPACITY", "HOST_BUDGET_EXCEEDED", "QUOTA_EXCEEDED",
		"NO_SUCH_POOL", "GEOMETRY_MISMATCH", "NOT_FOUND",	  "INVALID_ARGUMENT",
		"PERMISSION_DENIED", "PROTOCOL",  "VERSION",		  "SHUTTING_DOWN",
		"LIMIT_EXCEEDED", "UNAVAILABLE",  "INTERNAL",
	};
	static const char *const local[] = { "NO_DAEMON", "TRANSPORT", "NOMEM", "MAP", "BUFFER" };

	if (code < 0)
		code = -code;
	if (code < (int)(sizeof(names) / sizeof(names[0])))
		return names[code];
	if (code >= KVP_E_NO_DAEMON && code < KVP_CODE_MAX)
		return local[code - KVP_E_NO_DAEMON];
	return "UNKNOWN";
}

KVP_EXPORT const char *kvp_limit_name(int limit)
{
	static const char *const n[] = { "none", "MemAvailable", "NUMA node free memory",
					  "cgroup memory.max", "RLIMIT_MEMLOCK", "free huge pages" };

	return limit >= 0 && limit < KVP_LIMIT_MAX ? n[limit] : "?";
}

KVP_EXPORT const char *kvp_tier_name(int tier)
{
	return tier == KVP_TIER_DEVICE ? "device" : tier == KVP_TIER_HOST ? "host" : "?";
}

KVP_EXPORT const char *kvp_backend_name(int backend)
{
	static const char *const n[] = { "none", "sim", "cuda", "memfd" };

	return backend >= 0 && backend < KVP_BACKEND_MAX ? n[backend] : "?";
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

void kvp__status_to_error(const Kvpool__Status *st, struct kvp_error *err)
{
	if (!err)
		return;
	memset(err, 0, sizeof(*err));
	err->code = (int)st->code;
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
	default:
		break;
	}
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

/* Reads until one complete frame is buffered; collects passed descriptors. */
static int recv_frame(struct kvp_client *c, const uint8_t **payload, uint32_t *len, int *fds,
		      int *nfds)
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
			return r < 0 ? -EMSGSIZE : 0;
		space = kvp_frame_buf_space(&c->in, 65536, &avail);
		if (!space)
			return -ENOMEM;
		iov.iov_base = space;
		iov.iov_len = avail;
		msg.msg_iov = &iov;
		msg.msg_iovlen = 1;
		msg.msg_control = cm.buf;
		msg.msg_controllen = sizeof(cm.buf);
		n = recvmsg(c->fd, &msg, MSG_CMSG_CLOEXEC);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return -ECONNRESET;
		for (struct cmsghdr *h = CMSG_FIRSTHDR(&msg); h; h = CMSG_NXTHDR(&msg, h)) {
			if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS)
				continue;
			int cnt = (int)((h->cmsg_len - CMSG_LEN(0)) / sizeof(int));
			int *in = (int *)CMSG_DATA(h);

			for (int i = 0; i < cnt; i++) {
				if (fds && *nfds < KVP_CLIENT_MAX_FDS)
					fds[(*nfds)++] = in[i];
				else
					close(in[i]);
			}
		}
		kvp_frame_buf_commit(&c->in, (size_t)n);
	}
}

int kvp__call(struct kvp_client *c, Kvpool__Request *req, Kvpool__Response **resp, int *fds,
	      int *nfds, struct kvp_error *err)
{
	int got[KVP_CLIENT_MAX_FDS], ngot = 0;
	uint8_t *buf;
	size_t len;
	int r;

	if (c->fd < 0)
		return kvp__fail(err, KVP_E_TRANSPORT, EPIPE, "the connection was closed before");
	req->id = ++c->next_id;
	r = kvp_frame_pack(&req->base, &buf, &len);
	if (r < 0)
		return kvp__fail(err, r == -EMSGSIZE ? KVP_E_INVALID_ARGUMENT : KVP_E_NOMEM, -r,
				 "request does not fit in one frame");
	r = send_all(c->fd, buf, len);
	free(buf);
	/* A refusal (id 0) may already wait in the socket when the peer closed: read it first. */
	if (r < 0 && r != -EPIPE && r != -ECONNRESET)
		goto transport;
	for (;;) {
		const uint8_t *payload;
		uint32_t plen;
		Kvpool__Response *m;

		r = recv_frame(c, &payload, &plen, got, &ngot);
		if (r < 0)
			goto transport;
		m = kvp_frame_decode_response(payload, plen);
		if (!m) {
			r = -EPROTO;
			goto transport;
		}
		if (m->id != req->id && m->id != 0) {
			kvpool__response__free_unpacked(m, NULL); /* a reply to an abandoned call */
			continue;
		}
		if (!m->status || m->status->code != KVPOOL__CODE__OK) {
			int code = m->status ? (int)m->status->code : KVP_E_PROTOCOL;

			if (m->status)
				kvp__status_to_error(m->status, err);
			else
				kvp__fail(err, KVP_E_PROTOCOL, 0, "reply without a status");
			kvpool__response__free_unpacked(m, NULL);
			for (int i = 0; i < ngot; i++)
				close(got[i]);
			return -code;
		}
		if (fds) {
			memcpy(fds, got, sizeof(int) * (size_t)ngot);
			*nfds = ngot;
		} else {
			for (int i = 0; i < ngot; i++)
				close(got[i]);
		}
		*resp = m;
		return 0;
	}
transport:
	for (int i = 0; i < ngot; i++)
		close(got[i]);
	close(c->fd);
	c->fd = -1;
	return kvp__fail(err, KVP_E_TRANSPORT, -r, "connection to kvpoold lost: %s", strerror(-r));
}

int kvp__client_fd(const struct kvp_client *c)
{
	return c->fd;
}

KVP_EXPORT const char *kvp_default_socket(char *buf, size_t len)
{
	const char *env = getenv("KVPOOL_SOCKET"), *xdg = getenv("XDG_RUNTIME_DIR");
	int n;

	if (env && env[0])
		n = snprintf(buf, len, "%s", env);
	else if (geteuid() == 0 || !xdg || !xdg[0])
		n = snprintf(buf, len, "/run/kvpool/kvpoold.sock");
	else
		n = snprintf(buf, len, "%s/kvpool/kvpoold.sock", xdg);
	return n >= 0 && (size_t)n < len ? buf : NULL;
}

KVP_EXPORT struct kvp_client *kvp_client_connect(const char *path, const char *name,
						 struct kvp_error *err)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	Kvpool__Request req = KVPOOL__REQUEST__INIT;
	Kvpool__HelloReq hello = KVPOOL__HELLO_REQ__INIT;
	Kvpool__Response *resp;
	struct kvp_client *c;
	char def[108];

	if (!path && !(path = kvp_default_socket(def, sizeof(def)))) {
		kvp__fail(err, KVP_E_INVALID_ARGUMENT, ENAMETOOLONG, "socket path too long");
		return NULL;
	}
	if (strlen(path) >= sizeof(sa.sun_path)) {
		kvp__fail(err, KVP_E_INVALID_ARGUMENT, ENAMETOOLONG, "socket path too long: %s", path);
		return NULL;
	}
	strcpy(sa.sun_path, path);
	c = calloc(1, sizeof(*c));
	if (!c) {
		kvp__fail(err, KVP_E_NOMEM, ENOMEM, "out of memory");
		return NULL;
	}
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
	hello.protocol_version = KVP_PROTOCOL_VERSION;
	hello.client_name = (char *)(name ? name : "");
	hello.pid = getpid();
	req.call_case = KVPOOL__REQUEST__CALL_HELLO;
	req.hello = &hello;
	if (kvp__call(c, &req, &resp, NULL, NULL, err) < 0) {
		kvp_client_close(c);
		return NULL;
	}
	if (resp->result_case == KVPOOL__RESPONSE__RESULT_HELLO) {
		c->session_id = resp->hello->session_id;
		snprintf(c->daemon_version, sizeof(c->daemon_version), "%s",
			 resp->hello->daemon_version ? resp->hello->daemon_version : "");
	}
	kvpool__response__free_unpacked(resp, NULL);
	return c;
}

static void pool_unmap(struct kvp_pool *p)
{
	for (int t = 0; t < KVP_TIER_MAX; t++) {
		struct kvp_tier_map *m = &p->tier[t];

		if (!m->present)
			continue;
#if KVP_HAVE_CUDA
		if (m->backend == KVP_BACKEND_CUDA && m->base)
			kvp_cuda_mem_destroy(&m->cm);
		else
#endif
			if (m->base)
			munmap(m->base, m->bytes);
		if (m->fd >= 0)
			close(m->fd);
		m->base = NULL;
		m->fd = -1;
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
	if (c->fd >= 0)
		close(c->fd);
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

KVP_EXPORT int kvp_client_set_timeout(struct kvp_client *c, uint32_t ms)
{
	struct timeval tv = { .tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000 };

	if (c->fd < 0 || setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0)
		return -KVP_E_INVALID_ARGUMENT;
	return 0;
}

/* Declares req + the call message, fills the oneof. */
#define CALL_SETUP(req, field, CASE, Type, INIT) \
	Kvpool__Request req = KVPOOL__REQUEST__INIT; \
	Type field = INIT;                            \
	req.call_case = KVPOOL__REQUEST__CALL_##CASE; \
	req.field = &field

KVP_EXPORT int kvp_ping(struct kvp_client *c, struct kvp_error *err)
{
	CALL_SETUP(req, ping, PING, Kvpool__PingReq, KVPOOL__PING_REQ__INIT);
	Kvpool__Response *resp;
	int r;

	ping.nonce = c->next_id + 1;
	r = kvp__call(c, &req, &resp, NULL, NULL, err);
	if (r < 0)
		return r;
	r = resp->result_case == KVPOOL__RESPONSE__RESULT_PING && resp->ping->nonce == ping.nonce
		    ? 0
		    : kvp__fail(err, KVP_E_PROTOCOL, 0, "ping answered with the wrong nonce");
	kvpool__response__free_unpacked(resp, NULL);
	return r;
}

KVP_EXPORT int kvp_status(struct kvp_client *c, struct kvp_status *out, struct kvp_error *err)
{
	CALL_SETUP(req, status, STATUS, Kvpool__StatusReq, KVPOOL__STATUS_REQ__INIT);
	Kvpool__Response *resp;
	Kvpool__StatusResp *s;
	int r = kvp__call(c, &req, &resp, NULL, NULL, err);

	if (r < 0)
		return r;
	if (resp->result_case != KVPOOL__RESPONSE__RESULT_STATUS_INFO) {
		kvpool__response__free_unpacked(resp, NULL);
		return kvp__fail(err, KVP_E_PROTOCOL, 0, "status answered with another call");
	}
	s = resp->status_info;
	memset(out, 0, sizeof(*out));
	snprintf(out->daemon_version, sizeof(out->daemon_version), "%s",
		 s->daemon_version ? s->daemon_version : "");
	out->uptime_ms = s->uptime_ms;
	out->sessions = s->sessions;
	for (size_t i = 0; i < s->n_pools && i < KVP_STATUS_MAX_POOLS; i++) {
		const Kvpool__PoolStats *ps = s->pools[i];
		struct kvp_pool_status *po = &out->pools[out->n_pools++];

		snprintf(po->name, sizeof(po->name), "%s", ps->name ? ps->name : "");
		po->pool_id = ps->pool_id;
		geom_from(&po->geometry, ps->geometry);
		po->hit_tokens = ps->hit_tokens;
		po->queried_tokens = ps->queried_tokens;
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
		}
	}
	kvpool__response__free_unpacked(resp, NULL);
	return 0;
}

static int map_tier(struct kvp_pool *p, const Kvpool__TierInfo *ti, int fd, struct kvp_error *err)
{
	struct kvp_tier_map *m = &p->tier[ti->tier];

	m->present = 1;
	m->backend = (int)ti->backend;
	m->fd = fd;
	m->bytes = ti->bytes;
	m->pages = ti->pages;
	m->cuda_device = ti->cuda_device;
	if (ti->backend == KVPOOL__BACKEND__CUDA) {
#if KVP_HAVE_CUDA
		char why[256] = "";
		int r = 0;

		/* the daemon's number for the GPU may not be ours: find it by its UUID */
		if (ti->cuda_uuid.len != 0 && ti->cuda_uuid.len != 16)
			return kvp__fail(err, KVP_E_PROTOCOL, 0, "attach reply: a GPU uuid of %zu bytes",
					 ti->cuda_uuid.len);
		if (ti->cuda_uuid.len == 16)
			r = m->cuda_device = kvp_cuda_device_by_uuid(ti->cuda_uuid.data, why,
								      sizeof(why));
		if (r >= 0)
			r = kvp_cuda_mem_import(m->cuda_device, fd, ti->bytes, &m->cm, why,
						sizeof(why));
		if (r < 0)
			return kvp__fail(err, KVP_E_MAP, -r, "importing the cuda device tier: %s", why);
		m->base = (void *)(uintptr_t)m->cm.dptr;
#endif
		return 0;
	}
	m->base = mmap(NULL, ti->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m->base == MAP_FAILED) {
		int e = errno;

		m->base = NULL;
		return kvp__fail(err, KVP_E_MAP, e, "mapping the %s tier (%lu bytes): %s",
				 kvp_tier_name((int)ti->tier), (unsigned long)ti->bytes, strerror(e));
	}
	return 0;
}

KVP_EXPORT struct kvp_pool *kvp_pool_attach(struct kvp_client *c, const char *name,
					    const struct kvp_geometry *expected,
					    struct kvp_error *err)
{
	CALL_SETUP(req, attach, ATTACH, Kvpool__AttachReq, KVPOOL__ATTACH_REQ__INIT);
	Kvpool__Geometry eg = KVPOOL__GEOMETRY__INIT;
	Kvpool__Response *resp;
	Kvpool__AttachResp *a;
	int fds[KVP_CLIENT_MAX_FDS], nfds = 0, r;
	struct kvp_pool *p;

	attach.pool = (char *)name;
	if (expected) {
		eg.layers = expected->layers;
		eg.kv_heads = expected->kv_heads;
		eg.head_dim = expected->head_dim;
		eg.dtype = (Kvpool__Dtype)expected->dtype;
		eg.page_tokens = expected->page_tokens;
		attach.expected = &eg;
	}
	if (kvp__call(c, &req, &resp, fds, &nfds, err) < 0)
		return NULL;
	p = calloc(1, sizeof(*p));
	if (!p || resp->result_case != KVPOOL__RESPONSE__RESULT_ATTACH) {
		kvp__fail(err, p ? KVP_E_PROTOCOL : KVP_E_NOMEM, 0, "attach failed");
		goto fail;
	}
	a = resp->attach;
	p->c = c;
	p->id = a->pool_id;
	snprintf(p->name, sizeof(p->name), "%s", a->pool ? a->pool : "");
	geom_from(&p->g, a->geometry);
	for (int t = 0; t < KVP_TIER_MAX; t++)
		p->tier[t].fd = -1;
	for (size_t i = 0; i < a->n_tiers; i++) {
		const Kvpool__TierInfo *ti = a->tiers[i];

		if ((int)ti->tier < 0 || (int)ti->tier >= KVP_TIER_MAX || ti->fd_index < 0 ||
		    ti->fd_index >= nfds || p->tier[ti->tier].present) {
			kvp__fail(err, KVP_E_PROTOCOL, 0, "attach reply names a bad tier or fd");
			goto fail;
		}
		p->cg.row_bytes = ti->row_bytes;
		p->page_bytes = ti->page_bytes;
		r = map_tier(p, ti, fds[ti->fd_index], err);
		fds[ti->fd_index] = -1; /* the tier owns it, mapped or not: pool_unmap closes it */
		if (r < 0)
			goto fail;
	}
	p->cg.layers = p->g.layers;
	p->cg.page_tokens = p->g.page_tokens;
	p->cg.dev_slots = (uint64_t)(p->tier[KVP_TIER_DEVICE].present
					     ? p->tier[KVP_TIER_DEVICE].pages
					     : 1) *
			  p->g.page_tokens;
	for (int i = 0; i < nfds; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	kvpool__response__free_unpacked(resp, NULL);
	p->next = c->pools;
	c->pools = p;
	return p;
fail:
	if (p)
		pool_unmap(p);
	for (int i = 0; i < nfds; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	free(p);
	kvpool__response__free_unpacked(resp, NULL);
	return NULL;
}

KVP_EXPORT int kvp_pool_detach(struct kvp_pool *p, struct kvp_error *err)
{
	CALL_SETUP(req, detach, DETACH, Kvpool__DetachReq, KVPOOL__DETACH_REQ__INIT);
	Kvpool__Response *resp;
	struct kvp_client *c;
	int r;

	if (!p)
		return 0;
	c = p->c;
	detach.pool_id = p->id;
	r = kvp__call(c, &req, &resp, NULL, NULL, err);
	if (r == 0)
		kvpool__response__free_unpacked(resp, NULL);
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
	return tmap(p, tier) ? tmap(p, tier)->backend : KVP_BACKEND_NONE;
}

KVP_EXPORT int kvp_pool_tier_cuda_device(const struct kvp_pool *p, int tier)
{
	const struct kvp_tier_map *m = tmap(p, tier);

	return m && m->backend == KVP_BACKEND_CUDA && m->cuda_device >= 0 ? m->cuda_device : -1;
}

KVP_EXPORT void *kvp_pool_tier_base(const struct kvp_pool *p, int tier)
{
	return tmap(p, tier) ? tmap(p, tier)->base : NULL;
}

KVP_EXPORT int kvp_pool_tier_fd(const struct kvp_pool *p, int tier)
{
	return tmap(p, tier) ? tmap(p, tier)->fd : -1;
}

KVP_EXPORT uint64_t kvp_pool_tier_bytes(const struct kvp_pool *p, int tier)
{
	return tmap(p, tier) ? tmap(p, tier)->bytes : 0;
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
	return (uint32_t)((tokens + p->g.page_tokens - 1) / p->g.page_tokens);
}

KVP_EXPORT uint64_t kvp_slot_offset(const struct kvp_pool *p, int tier, uint32_t layer,
				    uint32_t kv, uint32_t page, uint32_t tok)
{
	const struct kvp_tier_map *m = tmap(p, tier);

	if (!m || layer >= p->g.layers || kv > 1 || page >= m->pages || tok >= p->g.page_tokens)
		return UINT64_MAX;
	if (tier == KVP_TIER_DEVICE)
		return kvp_dev_offset(&p->cg, layer, kv, (uint64_t)page * p->g.page_tokens + tok);
	return kvp_host_offset(&p->cg, page, layer, kv, tok);
}

KVP_EXPORT void *kvp_slot_addr(const struct kvp_pool *p, int tier, uint32_t layer, uint32_t kv,
			       uint32_t page, uint32_t tok)
{
	uint64_t off = kvp_slot_offset(p, tier, layer, kv, page, tok);
	void *base = kvp_pool_tier_base(p, tier);

	return off == UINT64_MAX || !base ? NULL : (char *)base + off;
}

KVP_EXPORT int kvp_alloc(struct kvp_pool *p, int tier, uint32_t npages, uint64_t *lease_id,
			 uint32_t *pages, struct kvp_error *err)
{
	CALL_SETUP(req, alloc, ALLOC, Kvpool__AllocReq, KVPOOL__ALLOC_REQ__INIT);
	Kvpool__Response *resp;
	int r;

	alloc.pool_id = p->id;
	alloc.pages = npages;
	alloc.tier = (Kvpool__Tier)tier;
	r = kvp__call(p->c, &req, &resp, NULL, NULL, err);
	if (r < 0)
		return r;
	if (resp->result_case != KVPOOL__RESPONSE__RESULT_ALLOC || resp->alloc->n_pages != npages) {
		r = kvp__fail(err, KVP_E_PROTOCOL, 0, "alloc answered with %zu pages, not %u",
			      resp->alloc ? resp->alloc->n_pages : 0, npages);
	} else {
		*lease_id = resp->alloc->lease_id;
		memcpy(pages, resp->alloc->pages, sizeof(uint32_t) * npages);
	}
	kvpool__response__free_unpacked(resp, NULL);
	return r;
}

KVP_EXPORT int kvp_extend(struct kvp_pool *p, uint64_t lease_id, uint32_t npages, uint32_t *pages,
			  struct kvp_error *err)
{
	CALL_SETUP(req, extend, EXTEND, Kvpool__ExtendReq, KVPOOL__EXTEND_REQ__INIT);
	Kvpool__Response *resp;
	int r;

	extend.lease_id = lease_id;
	extend.pages = npages;
	r = kvp__call(p->c, &req, &resp, NULL, NULL, err);
	if (r < 0)
		return r;
	if (resp->result_case != KVPOOL__RESPONSE__RESULT_EXTEND || resp->extend->n_pages != npages)
		r = kvp__fail(err, KVP_E_PROTOCOL, 0, "extend answered with the wrong page count");
	else
		memcpy(pages, resp->extend->pages, sizeof(uint32_t) * npages);
	kvpool__response__free_unpacked(resp, NULL);
	return r;
}

KVP_EXPORT int kvp_free(struct kvp_pool *p, uint64_t lease_id, const uint32_t *pages, uint32_t n,
			struct kvp_error *err)
{
	CALL_SETUP(req, free, FREE, Kvpool__FreeReq, KVPOOL__FREE_REQ__INIT);
	Kvpool__Response *resp;
	int r;

	free.lease_id = lease_id;
	free.pages = (uint32_t *)pages;
	free.n_pages = n;
	r = kvp__call(p->c, &req, &resp, NULL, NULL, err);
	if (r < 0)
		return r;
	r = resp->result_case == KVPOOL__RESPONSE__RESULT_FREE ? (int)resp->free->lease_pages : 0;
	kvpool__response__free_unpacked(resp, NULL);
	return r;
}

KVP_EXPORT int kvp_insert(struct kvp_pool *p, uint64_t lease_id, uint64_t ns,
			  const uint32_t *tokens, uint32_t ntokens, uint32_t cached_pages,
			  const uint32_t *pages, uint32_t npages, uint64_t *new_tokens,
			  struct kvp_error *err)
{
	CALL_SETUP(req, insert, INSERT, Kvpool__InsertReq, KVPOOL__INSERT_REQ__INIT);
	Kvpool__Response *resp;
	int r;

	insert.lease_id = lease_id;
	insert.namespace_ = ns;
	insert.tokens = (uint32_t *)tokens;
	insert.n_tokens = ntokens;
	insert.pages = (uint32_t *)pages;
	insert.n_pages = npages;
	insert.cached_pages = cached_pages;
	r = kvp__call(p->c, &req, &resp, NULL, NULL, err);
	if (r < 0)
		return r;
	if (new_tokens && resp->result_case == KVPOOL__RESPONSE__RESULT_INSERT)
		*new_tokens = resp->insert->new_tokens;
	kvpool__response__free_unpacked(resp, NULL);
	return 0;
}

KVP_EXPORT int kvp_match(struct kvp_pool *p, uint64_t ns, const uint32_t *tokens, uint32_t ntokens,
			 int lock, struct kvp_match *m, uint32_t *device_pages,
			 uint32_t *host_pages, uint32_t cap, struct kvp_error *err)
{
	CALL_SETUP(req, match, MATCH, Kvpool__MatchReq, KVPOOL__MATCH_REQ__INIT);
	Kvpool__Response *resp;
	Kvpool__MatchResp *mr;
	int r;

	match.pool_id = p->id;
	match.namespace_ = ns;
	match.tokens = (uint32_t *)tokens;
	match.n_tokens = ntokens;
	match.lock = lock != 0;
	r = kvp__call(p->c, &req, &resp, NULL, NULL, err);
	if (r < 0)
		return r;
	if (resp->result_case != KVPOOL__RESPONSE__RESULT_MATCH) {
		kvpool__response__free_unpacked(resp, NULL);
		return kvp__fail(err, KVP_E_PROTOCOL, 0, "match answered with another call");
	}
	mr = resp->match;
	if (mr->n_device_pages > cap || mr->n_host_pages > cap) {
		/* The caller cannot take the pages: give the lock back rather than leak it. */
		if (mr->lock_id)
			kvp_release(p, mr->lock_id, NULL);
		kvpool__response__free_unpacked(resp, NULL);
		return kvp__fail(err, KVP_E_BUFFER, 0, "match: %u entries do not hold the reply",
				 cap);
	}
	m->matched_tokens = mr->matched_tokens;
	m->n_device = (uint32_t)mr->n_device_pages;
	m->n_host = (uint32_t)mr->n_host_pages;
	m->lock_id = mr->lock_id;
	/* (an empty repeated field arrives as NULL) */
	if (mr->n_device_pages)
		memcpy(device_pages, mr->device_pages, sizeof(uint32_t) * mr->n_device_pages);
	if (mr->n_host_pages)
		memcpy(host_pages, mr->host_pages, sizeof(uint32_t) * mr->n_host_pages);
	kvpool__response__free_unpacked(resp, NULL);
	return 0;
}

KVP_EXPORT int kvp_release(struct kvp_pool *p, uint64_t lock_id, struct kvp_error *err)
{
	CALL_SETUP(req, release, RELEASE, Kvpool__ReleaseReq, KVPOOL__RELEASE_REQ__INIT);
	Kvpool__Response *resp;
	int r;

	release.lock_id = lock_id;
	r = kvp__call(p->c, &req, &resp, NULL, NULL, err);
	if (r == 0)
		kvpool__response__free_unpacked(resp, NULL);
	return r;
}

KVP_EXPORT int kvp_load(struct kvp_pool *p, uint64_t lock_id, uint32_t *device_pages, uint32_t cap,
			struct kvp_error *err)
{
	CALL_SETUP(req, load, LOAD, Kvpool__LoadReq, KVPOOL__LOAD_REQ__INIT);
	Kvpool__Response *resp;
	int r;

	load.lock_id = lock_id;
	r = kvp__call(p->c, &req, &resp, NULL, NULL, err);
	if (r < 0)
		return r;
	if (resp->result_case != KVPOOL__RESPONSE__RESULT_LOAD)
		r = kvp__fail(err, KVP_E_PROTOCOL, 0, "load answered with another call");
	else if (resp->load->n_device_pages > cap)
		r = kvp__fail(err, KVP_E_BUFFER, 0, "load: %u entries do not hold %zu pages", cap,
			      resp->load->n_device_pages);
	else {
		if (resp->load->n_device_pages)
			memcpy(device_pages, resp->load->device_pages,
			       sizeof(uint32_t) * resp->load->n_device_pages);
		r = (int)resp->load->n_device_pages;
	}
	kvpool__response__free_unpacked(resp, NULL);
	return r;
}

KVP_EXPORT int kvp_evict(struct kvp_client *c, const char *pool, int tier, uint64_t tokens,
			 uint64_t *evicted, struct kvp_error *err)
{
	CALL_SETUP(req, evict, EVICT, Kvpool__EvictReq, KVPOOL__EVICT_REQ__INIT);
	Kvpool__Response *resp;
	int r;

	evict.pool = (char *)pool;
	evict.tier = (Kvpool__Tier)tier;
	evict.tokens = tokens;
	r = kvp__call(c, &req, &resp, NULL, NULL, err);
	if (r < 0)
		return r;
	if (evicted && resp->result_case == KVPOOL__RESPONSE__RESULT_EVICT)
		*evicted = resp->evict->evicted_tokens;
	kvpool__response__free_unpacked(resp, NULL);
	return 0;
}

KVP_EXPORT int kvp_flush(struct kvp_client *c, const char *pool, uint64_t *evicted,
			 struct kvp_error *err)
{
	CALL_SETUP(req, flush, FLUSH, Kvpool__FlushReq, KVPOOL__FLUSH_REQ__INIT);
	Kvpool__Response *resp;
	int r;

	flush.pool = (char *)pool;
	r = kvp__call(c, &req, &resp, NULL, NULL, err);
	if (r < 0)
		return r;
	if (evicted && resp->result_case == KVPOOL__RESPONSE__RESULT_FLUSH)
		*evicted = resp->flush->evicted_tokens;
	kvpool__response__free_unpacked(resp, NULL);
	return 0;
}

KVP_EXPORT int kvp_drain(struct kvp_client *c, uint32_t deadline_ms, struct kvp_error *err)
{
	CALL_SETUP(req, drain, DRAIN, Kvpool__DrainReq, KVPOOL__DRAIN_REQ__INIT);
	Kvpool__Response *resp;
	int r;

	drain.deadline_ms = deadline_ms;
	r = kvp__call(c, &req, &resp, NULL, NULL, err);
	if (r == 0)
		kvpool__response__free_unpacked(resp, NULL);
	return r;
}

KVP_EXPORT int kvp_metrics(struct kvp_client *c, char *buf, size_t len, struct kvp_error *err)
{
	CALL_SETUP(req, metrics, METRICS, Kvpool__MetricsReq, KVPOOL__METRICS_REQ__INIT);
	Kvpool__Response *resp;
	size_t n;
	int r = kvp__call(c, &req, &resp, NULL, NULL, err);

	if (r < 0)
		return r;
	n = resp->result_case == KVPOOL__RESPONSE__RESULT_METRICS && resp->metrics->text
		    ? strlen(resp->metrics->text)
		    : 0;
	if (n + 1 > len || n > INT32_MAX)
		r = kvp__fail(err, KVP_E_BUFFER, 0, "metrics need %zu bytes", n + 1);
	else {
		memcpy(buf, n ? resp->metrics->text : "", n + 1);
		r = (int)n;
	}
	kvpool__response__free_unpacked(resp, NULL);
	return r;
}
