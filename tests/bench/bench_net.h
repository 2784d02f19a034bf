/* bench_net.h - socket helpers for the benchmarks that talk to kvpoold: starting one on a
 * temporary socket (quiet log), exact reads and writes, a listening unix socket. */
#pragma once
#include <errno.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "bench.h"
#include "echo_server.h"
#include "frame.h"
#include "harness.h"

#include <signal.h>
#include <sys/wait.h>

/* What this process started and must stop, also when it exits through B_DIE. */
static struct daemon *g_bn_daemon;
static pid_t g_bn_owner, g_bn_kids[4];

/* Stops the echo/raw peer and the daemon, removes the daemon's temporary directory. Idempotent;
 * does nothing in forked children. */
static void bn_cleanup(void)
{
	if (getpid() != g_bn_owner)
		return;
	for (int i = 0; i < 4; i++) {
		if (g_bn_kids[i] > 0) {
			kill(g_bn_kids[i], SIGTERM);
			waitpid(g_bn_kids[i], NULL, 0);
			g_bn_kids[i] = 0;
		}
	}
	if (g_bn_daemon) {
		h_daemon_cleanup(g_bn_daemon);
		g_bn_daemon = NULL;
	}
}

/* Starts kvpoold (harness: $KVPOOLD or ../daemon/kvpoold) with config (NULL: embedded) on a
 * temporary socket, logging warnings only so the log costs nothing on the hot path. Registers
 * bn_cleanup to run at exit. */
static inline void bn_daemon_start(struct daemon *d, const char *config)
{
	static const char *const args[] = { "--log-level", "warning", NULL };

	g_bn_owner = getpid();
	atexit(bn_cleanup);
	if (h_daemon_start(d, config, args) < 0)
		B_DIE("kvpoold did not start (binary %s, log %s)", h_kvpoold(), d->log);
	g_bn_daemon = d;
}

/* Registers a forked helper (echo server, raw peer; at most 4) for bn_cleanup to stop. */
static inline void bn_kid(pid_t pid)
{
	for (int i = 0; i < 4; i++) {
		if (g_bn_kids[i] <= 0) {
			g_bn_kids[i] = pid;
			return;
		}
	}
}

static inline int bn_write_all(int fd, const void *p, size_t n)
{
	const uint8_t *b = p;

	while (n) {
		ssize_t k = send(fd, b, n, MSG_NOSIGNAL);

		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return -1;
		b += k;
		n -= (size_t)k;
	}
	return 0;
}

static inline int bn_read_all(int fd, void *p, size_t n)
{
	uint8_t *b = p;

	while (n) {
		ssize_t k = recv(fd, b, n, 0);

		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return -1;
		b += k;
		n -= (size_t)k;
	}
	return 0;
}

/* Listening unix stream socket at path. Returns the fd; dies on failure. */
static inline int bn_listen(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (strlen(path) >= sizeof(sa.sun_path))
		B_DIE("socket path too long: %s", path);
	memcpy(sa.sun_path, path, strlen(path) + 1);
	unlink(path);
	if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, 512) < 0)
		B_DIE("listen on %s: %s", path, strerror(errno));
	return fd;
}

/* Reads one frame (header + payload) into buf (cap bytes). Returns the frame's total size or
 * -1. */
static inline ssize_t bn_read_frame(int fd, uint8_t *buf, size_t cap)
{
	uint32_t len;

	if (bn_read_all(fd, buf, KVP_FRAME_HDR) < 0)
		return -1;
	len = (uint32_t)buf[0] | (uint32_t)buf[1] << 8 | (uint32_t)buf[2] << 16 |
	      (uint32_t)buf[3] << 24;
	if (len > cap - KVP_FRAME_HDR || bn_read_all(fd, buf + KVP_FRAME_HDR, len) < 0)
		return -1;
	return (ssize_t)(KVP_FRAME_HDR + len);
}

/* Sends Hello on a raw connection and reads the reply frame. Returns 0 or -1. */
static inline int bn_hello(int fd, const char *name)
{
	Kvpool__Request req = KVPOOL__REQUEST__INIT;
	Kvpool__HelloReq hello = KVPOOL__HELLO_REQ__INIT;
	uint8_t *out, buf[4096];
	size_t len;
	int r;

	hello.protocol_version = 1;
	hello.client_name = (char *)name;
	hello.pid = getpid();
	req.id = 1;
	req.call_case = KVPOOL__REQUEST__CALL_HELLO;
	req.hello = &hello;
	if (kvp_frame_pack(&req.base, &out, &len) < 0)
		return -1;
	r = bn_write_all(fd, out, len);
	free(out);
	if (r < 0 || bn_read_frame(fd, buf, sizeof(buf)) < 0)
		return -1;
	return 0;
}

/* Starts the io_uring echo server (echo_server.c) in a child listening on DIR/echo.sock next to
 * the daemon's socket, registered for bn_cleanup; writes the socket path into path. Returns the
 * child's pid. */
static inline pid_t bn_echo_start(const struct daemon *d, char *path, size_t len)
{
	pid_t pid;
	int lfd;

	snprintf(path, len, "%s/echo.sock", d->dir);
	lfd = bn_listen(path);
	pid = fork();
	if (pid < 0)
		B_DIE("fork failed");
	if (pid == 0)
		_exit(echo_server_run(lfd) < 0 ? 1 : 0);
	bn_kid(pid);
	close(lfd);
	return pid;
}
