/* libkvpool_client.c - a client's connection: connect and Hello, the fork checks (a session
 * belongs to the process that connected), close, what Hello agreed, the timeout and ping. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "kvp_internal.h"
#include "names.h"

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

KVP_EXPORT const char *kvp_client_default_socket(char *buf, size_t len)
{
	return kvp_names_default_socket(buf, len) == 0 ? buf : NULL;
}

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

KVP_EXPORT void kvp_client_close(struct kvp_client *c)
{
	if (!c)
		return;
	while (c->pools) {
		struct kvp_pool *p = c->pools;

		c->pools = p->next;
		kvp__pool_unmap(p);
		free(p);
	}
	for (int i = 0; i < KVP_CLIENT_MAX_PENDING; i++)
		kvp__pending_clear(&c->pend[i]);
	kvp__close_fds(c->rxfds, c->nrxfds);
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
