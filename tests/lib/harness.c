/* harness.c - real daemons and real client processes for the integration suites. */
#include "harness.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <CUnit/Basic.h>

#include "frame.h"

uint64_t h_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

const char *h_kvpoold(void)
{
	const char *p = getenv("KVPOOLD");

	return p ? p : "../daemon/kvpoold";
}

/* What h_daemon_start_as asks of the next spawn (reset by it). */
static unsigned g_spawn_nofile;
static uid_t g_spawn_uid;

static pid_t spawn(struct daemon *d, const char *config, const char *const *args)
{
	const char *argv[32];
	int n = 0, fd;
	pid_t pid, parent;

	memset(d, 0, sizeof(*d));
	snprintf(d->dir, sizeof(d->dir), "/tmp/kvpool-test-XXXXXX");
	if (!mkdtemp(d->dir))
		return -1;
	snprintf(d->sock, sizeof(d->sock), "%s/kvpoold.sock", d->dir);
	/* A test may name its own socket path. */
	for (int i = 0; args && args[i] && args[i + 1]; i++)
		if (strcmp(args[i], "--socket") == 0)
			snprintf(d->sock, sizeof(d->sock), "%s", args[i + 1]);
	snprintf(d->log, sizeof(d->log), "%s/kvpoold.log", d->dir);
	if (config) {
		FILE *f;

		snprintf(d->config, sizeof(d->config), "%s/kvpoold.conf", d->dir);
		f = fopen(d->config, "w");
		if (!f)
			return -1;
		fputs(config, f);
		fclose(f);
	}
	argv[n++] = h_kvpoold();
	argv[n++] = "--socket";
	argv[n++] = d->sock;
	argv[n++] = "--log-level";
	argv[n++] = "debug";
	if (config) {
		argv[n++] = "--config";
		argv[n++] = d->config;
	}
	for (int i = 0; args && args[i] && n < 30; i++)
		argv[n++] = args[i];
	argv[n] = NULL;
	parent = getpid();
	pid = fork();
	if (pid == 0) {
		fd = open(d->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		if (fd >= 0) {
			dup2(fd, 2);
			dup2(fd, 1);
		}
		unsetenv("NOTIFY_SOCKET");
		unsetenv("LISTEN_FDS");
		if (g_spawn_nofile) {
			struct rlimit rl = { g_spawn_nofile, g_spawn_nofile };

			if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
				_exit(126);
		}
		if (g_spawn_uid &&
		    (chown(d->dir, g_spawn_uid, g_spawn_uid) < 0 || setgroups(0, NULL) < 0 ||
		     setresgid(g_spawn_uid, g_spawn_uid, g_spawn_uid) < 0 ||
		     setresuid(g_spawn_uid, g_spawn_uid, g_spawn_uid) < 0))
			_exit(126);
		/* dies with its test (after the uid change, which clears it): a test killed at
		 * its timeout leaves no daemon behind */
		if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != parent)
			_exit(126);
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	d->pid = pid;
	return pid;
}

int h_daemon_start(struct daemon *d, const char *config, const char *const *args)
{
	if (spawn(d, config, args) < 0)
		return -1;
	return h_wait_accepting(d->sock, &d->pid, 10000);
}

int h_daemon_start_as(struct daemon *d, const char *config, const char *const *args,
		      unsigned nofile, uid_t uid)
{
	int r;

	g_spawn_nofile = nofile;
	g_spawn_uid = uid;
	r = spawn(d, config, args);
	g_spawn_nofile = 0;
	g_spawn_uid = 0;
	if (r < 0)
		return -1;
	return h_wait_accepting(d->sock, &d->pid, 10000);
}

int h_wait_accepting(const char *sock, pid_t *pid, int ms)
{
	uint64_t end = h_now_ms() + (uint64_t)ms;

	while (h_now_ms() < end) {
		int fd = h_raw_connect(sock), st;

		if (fd >= 0) {
			close(fd);
			return 0;
		}
		if (waitpid(*pid, &st, WNOHANG) == *pid) {
			*pid = 0;
			return -1;
		}
		usleep(10000);
	}
	return -1;
}

static int wait_exit(pid_t pid, int ms)
{
	uint64_t end = h_now_ms() + (uint64_t)ms;
	int st;

	while (h_now_ms() < end) {
		pid_t r = waitpid(pid, &st, WNOHANG);

		if (r == pid)
			return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
		usleep(5000);
	}
	return -1;
}

int h_daemon_run_to_exit(struct daemon *d, const char *config, const char *const *args)
{
	int r;

	if (spawn(d, config, args) < 0)
		return -1;
	r = wait_exit(d->pid, 10000);
	if (r < 0)
		kill(d->pid, SIGKILL), waitpid(d->pid, NULL, 0);
	d->pid = 0;
	return r;
}

int h_daemon_stop(struct daemon *d)
{
	int r;

	if (d->pid <= 0)
		return -1;
	kill(d->pid, SIGTERM);
	r = wait_exit(d->pid, 10000);
	if (r < 0) {
		kill(d->pid, SIGKILL);
		waitpid(d->pid, NULL, 0);
	}
	d->pid = 0;
	return r;
}

const char *h_kvpoolctl(void)
{
	const char *p = getenv("KVPOOLCTL");

	return p ? p : "../client/kvpoolctl";
}

int h_write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	if (!f)
		return -1;
	fputs(text, f);
	return fclose(f);
}

bool h_log_contains(const struct daemon *d, const char *s)
{
	return h_file_contains(d->log, s);
}

bool h_wait_file_contains(const char *path, const char *s, int ms)
{
	uint64_t end = h_now_ms() + (uint64_t)ms;

	do {
		if (h_file_contains(path, s))
			return true;
		usleep(20000);
	} while (h_now_ms() < end);
	return false;
}

bool h_file_contains(const char *path, const char *s)
{
	char buf[1 << 16];
	FILE *f = fopen(path, "r");
	size_t n;
	bool found = false;

	if (!f)
		return false;
	while ((n = fread(buf, 1, sizeof(buf) - 1, f)) > 0) {
		buf[n] = 0;
		if (strstr(buf, s)) {
			found = true;
			break;
		}
	}
	fclose(f);
	return found;
}

void h_daemon_cleanup(struct daemon *d)
{
	if (d->pid > 0)
		h_daemon_stop(d);
	h_dir_remove(d->dir);
}

void h_dir_remove(const char *dir)
{
	char cmd[300];

	if (getenv("KVP_KEEP_LOGS")) {
		fprintf(stderr, "kept %s\n", dir);
		return;
	}
	if (dir[0] && strncmp(dir, "/tmp/kvpool-test-", 17) == 0) {
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
		if (system(cmd) != 0)
			fprintf(stderr, "cleanup of %s failed\n", dir);
	}
}

int h_in_child(int (*fn)(void *arg), void *arg)
{
	pid_t pid = fork();
	int st;

	if (pid == 0)
		_exit(fn(arg));
	if (pid < 0 || waitpid(pid, &st, 0) != pid)
		return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int h_raw_connect(const char *sock)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock);
	if (fd < 0)
		return -1;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

int h_raw_send_request(int fd, Kvpool__Request *req)
{
	uint8_t *buf;
	size_t len;
	int r = kvp_frame_pack(&req->base, &buf, &len);

	if (r < 0)
		return r;
	r = send(fd, buf, len, MSG_NOSIGNAL) == (ssize_t)len ? 0 : -errno;
	free(buf);
	return r;
}

/* Reads exactly n bytes before the deadline. 0, or -1 on EOF, error or timeout. */
static int read_exact(int fd, uint8_t *p, size_t n, uint64_t end)
{
	while (n) {
		struct pollfd pf = { .fd = fd, .events = POLLIN };
		uint64_t now = h_now_ms();
		ssize_t r;

		if (now >= end || poll(&pf, 1, (int)(end - now)) <= 0)
			return -1;
		r = recv(fd, p, n, 0);
		if (r <= 0)
			return -1;
		p += r;
		n -= (size_t)r;
	}
	return 0;
}

/* Reads exactly one frame within ms (nothing of the next one is consumed): its payload
 * (malloc'd, the caller frees it) and *len, or NULL on EOF, timeout or an oversized length. */
static uint8_t *read_frame(int fd, int ms, uint32_t *len)
{
	uint64_t end = h_now_ms() + (uint64_t)ms;
	uint8_t hdr[4], *payload;

	if (read_exact(fd, hdr, 4, end) < 0)
		return NULL;
	*len = (uint32_t)hdr[0] | (uint32_t)hdr[1] << 8 | (uint32_t)hdr[2] << 16 |
	       (uint32_t)hdr[3] << 24;
	if (*len > KVP_FRAME_MAX || !(payload = malloc(*len ? *len : 1)))
		return NULL;
	if (read_exact(fd, payload, *len, end) < 0) {
		free(payload);
		return NULL;
	}
	return payload;
}

Kvpool__Response *h_raw_recv(int fd, int ms)
{
	Kvpool__Response *m;
	uint32_t len;
	uint8_t *payload = read_frame(fd, ms, &len);

	if (!payload)
		return NULL;
	m = kvp_frame_decode_response(payload, len);
	free(payload);
	return m;
}

Kvpool__Request *h_fake_recv(int fd, int ms)
{
	Kvpool__Request *m;
	uint32_t len;
	uint8_t *payload = read_frame(fd, ms, &len);

	if (!payload)
		return NULL;
	m = kvp_frame_decode_request(payload, len);
	free(payload);
	return m;
}

int h_fake_send(int fd, Kvpool__Response *resp, const int *fds, int nfds)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * 8)];
		struct cmsghdr align;
	} cm;
	struct msghdr msg = { 0 };
	struct iovec iov;
	uint8_t *buf;
	size_t len;
	int r = kvp_frame_pack(&resp->base, &buf, &len);

	if (r < 0)
		return r;
	if (nfds < 0 || nfds > 8) {
		free(buf);
		return -EINVAL;
	}
	iov.iov_base = buf;
	iov.iov_len = len;
	msg.msg_iov = &iov;
	msg.msg_iovlen = 1;
	if (nfds) {
		struct cmsghdr *h;

		memset(&cm, 0, sizeof(cm));
		msg.msg_control = cm.buf;
		msg.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
		h = CMSG_FIRSTHDR(&msg);
		h->cmsg_level = SOL_SOCKET;
		h->cmsg_type = SCM_RIGHTS;
		h->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
		memcpy(CMSG_DATA(h), fds, sizeof(int) * (size_t)nfds);
	}
	r = sendmsg(fd, &msg, MSG_NOSIGNAL) == (ssize_t)len ? 0 : -errno;
	free(buf);
	return r;
}

int h_fake_daemon(const char *sock, int (*script)(int fd, void *arg), void *arg, pid_t *pid)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (lfd < 0 || strlen(sock) >= sizeof(sa.sun_path))
		return -1;
	memcpy(sa.sun_path, sock, strlen(sock) + 1);
	unlink(sock);
	if (bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(lfd, 4) < 0) {
		close(lfd);
		return -1;
	}
	*pid = fork();
	if (*pid < 0) {
		close(lfd);
		return -1;
	}
	if (*pid == 0) {
		struct pollfd pf = { .fd = lfd, .events = POLLIN };
		int fd;

		alarm(20);
		if (poll(&pf, 1, 10000) <= 0 || (fd = accept(lfd, NULL, NULL)) < 0)
			_exit(90);
		_exit(script(fd, arg));
	}
	close(lfd);
	return 0;
}

bool h_raw_closed(int fd, int ms)
{
	uint64_t end = h_now_ms() + (uint64_t)ms;

	while (h_now_ms() < end) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		char tmp[4096];
		ssize_t n;

		if (poll(&p, 1, (int)(end - h_now_ms())) <= 0)
			return false;
		n = recv(fd, tmp, sizeof(tmp), 0);
		if (n == 0 || (n < 0 && errno == ECONNRESET))
			return true;
	}
	return false;
}

int h_daemon_finish(struct daemon *d)
{
	int r = h_daemon_stop(d);

	h_daemon_cleanup(d);
	return r == 0 ? 0 : -1;
}

void h_drop_caches(void)
{
	int fd = open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC);

	sync();
	if (fd >= 0) {
		if (write(fd, "3\n", 2) != 2)
			fprintf(stderr, "drop_caches: %s\n", strerror(errno));
		close(fd);
	}
}

int h_wait_pid(pid_t pid, int ms)
{
	uint64_t end = h_now_ms() + (uint64_t)ms;
	int st;

	while (h_now_ms() < end) {
		if (waitpid(pid, &st, WNOHANG) == pid)
			return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
		usleep(2000);
	}
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	return -1;
}
