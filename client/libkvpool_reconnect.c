/* libkvpool_reconnect.c - a lost connection to a restarted kvpoold (a new instance): Hello again
 * with the session's resume token within reconnect_ms, backing off, then every pool attached
 * again, a tier keeping its mapping when the daemon hands the same memory. */
#include <errno.h>
#include <stdbool.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kvp_internal.h"

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
		r = kvp__map_tier(p, ti, fd, &e);
	}
	kvp__close_fds(fds, nfds);
	kvpool__response__free_unpacked(resp, NULL);
	return r;
}

/* After lose(): retries Hello until reconnect_ms passes, then re-attaches. 0 or -1. */
int kvp__reconnect(struct kvp_client *c)
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
