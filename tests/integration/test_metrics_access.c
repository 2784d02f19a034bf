/* test_metrics_access.c - who reads kvpoold's metrics: the HTTP endpoint's access rule (TCP
 * peers from metrics_allow, loopback by default; a unix endpoint for root, kvpoold's user and
 * admin_groups), its per-peer connection bound and idle timeout (idle connections of one peer
 * do not lock the others out), and the Metrics RPC, which shows a non-admin only the pools it
 * may attach. Clients of other users are forked processes dropping to uid 60001. */
#include <CUnit/Basic.h>
#include <arpa/inet.h>
#include <grp.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "harness.h"
#include "kvpool.h"

#define OTHER_UID 60001

#define POOL(name, users)                                                                          \
	"[pool." name "]\nlayers = 1\nkv_heads = 1\nhead_dim = 8\ndtype = fp16\n"                  \
	"page_tokens = 4\nhost_capacity = 64t\nmlock = off\nallowed_users = " users "\n"

static int g_port;

/* A TCP connection from source address src (NULL: any) to 127.0.0.1:port, or -1. */
static int tcp_from(const char *src, int port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (fd < 0)
		return -1;
	if (src) {
		struct sockaddr_in me = { .sin_family = AF_INET };

		inet_pton(AF_INET, src, &me.sin_addr);
		if (bind(fd, (struct sockaddr *)&me, sizeof(me)) < 0) {
			close(fd);
			return -1;
		}
	}
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

static int unix_to(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/* GET /metrics on fd (closed here), the answer into buf within ms. Bytes read, or -1. */
static int get_on(int fd, char *buf, size_t len, int ms)
{
	static const char req[] = "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n";
	uint64_t end = h_now_ms() + (uint64_t)ms;
	size_t n = 0;

	buf[0] = 0;
	if (fd < 0)
		return -1;
	if (send(fd, req, sizeof(req) - 1, MSG_NOSIGNAL) < 0) {
		close(fd);
		return -1;
	}
	while (n + 1 < len && h_now_ms() < end) {
		struct pollfd pf = { .fd = fd, .events = POLLIN };
		ssize_t r;

		if (poll(&pf, 1, 100) <= 0)
			continue;
		r = recv(fd, buf + n, len - n - 1, 0);
		if (r <= 0)
			break;
		n += (size_t)r;
	}
	buf[n] = 0;
	close(fd);
	return (int)n;
}

/* Whether fd is closed by the other side within ms (a read of 0 or a reset). */
static bool closed_within(int fd, int ms)
{
	struct pollfd pf = { .fd = fd, .events = POLLIN };
	char b;

	return poll(&pf, 1, ms) > 0 && recv(fd, &b, 1, MSG_DONTWAIT) <= 0;
}

/* Waits for the loop's first snapshot (published every second): a 200 from 127.0.0.1. */
static bool endpoint_up(int port)
{
	static char buf[1 << 17];

	for (int i = 0; i < 50; i++) {
		if (get_on(tcp_from(NULL, port), buf, sizeof(buf), 2000) > 0 &&
		    strstr(buf, " 200 OK") && strstr(buf, "kvpool_sessions "))
			return true;
		usleep(100000);
	}
	return false;
}

static int drop_to(uid_t uid)
{
	return setgroups(0, NULL) < 0 || setresgid(uid, uid, uid) < 0 ||
			       setresuid(uid, uid, uid) < 0
		       ? -1
		       : 0;
}

/* 16 idle connections of one peer (127.0.0.2) lock nobody out: past 4 of them (the default
 * metrics_peer_connections) they are closed at once, the 4 within the idle timeout (2 s by
 * default), and a scrape from another address answers meanwhile. Before, 16 idle connections
 * filled the endpoint's 16 and every other scrape failed for 10 s. */
static void test_idle_peer_locks_nobody_out(void)
{
	static char buf[1 << 17];
	char conf[1024];
	struct daemon d;
	int fds[16], closed_now = 0, closed_later = 0;
	uint64_t t0;

	snprintf(conf, sizeof(conf), "[daemon]\nmetrics_listen = 127.0.0.1:%d\n" POOL("p", "0"),
		 g_port);
	CU_ASSERT_EQUAL_FATAL(h_daemon_start(&d, conf, NULL), 0);
	CU_ASSERT_FATAL(endpoint_up(g_port));
	for (int i = 0; i < 16; i++)
		fds[i] = tcp_from("127.0.0.2", g_port);
	t0 = h_now_ms();
	CU_ASSERT(get_on(tcp_from(NULL, g_port), buf, sizeof(buf), 1000) > 0 &&
		  strstr(buf, " 200 OK"));
	CU_ASSERT(h_now_ms() - t0 < 1000);
	usleep(300000); /* the endpoint's thread has taken every connection by then */
	for (int i = 0; i < 16; i++)
		closed_now += fds[i] < 0 || closed_within(fds[i], 0);
	for (int i = 0; i < 16; i++)
		closed_later += fds[i] < 0 || closed_within(fds[i], 4000);
	if (closed_now != 12 || closed_later != 16)
		fprintf(stderr, "idle connections closed: %d at once, %d within 4 s\n", closed_now,
			closed_later);
	CU_ASSERT_EQUAL(closed_now, 12);
	CU_ASSERT_EQUAL(closed_later, 16);
	for (int i = 0; i < 16; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	CU_ASSERT_EQUAL(h_daemon_finish(&d), 0);
}

/* metrics_allow = 127.0.0.1: a peer from 127.0.0.2 is closed without an answer. */
static void test_allow_list_refuses_other_addresses(void)
{
	static char buf[1 << 17];
	char conf[1024];
	struct daemon d;

	snprintf(conf, sizeof(conf),
		 "[daemon]\nmetrics_listen = 127.0.0.1:%d\nmetrics_allow = 127.0.0.1/32\n" POOL(
			 "p", "0"),
		 g_port);
	CU_ASSERT_EQUAL_FATAL(h_daemon_start(&d, conf, NULL), 0);
	CU_ASSERT_FATAL(endpoint_up(g_port));
	CU_ASSERT(get_on(tcp_from("127.0.0.2", g_port), buf, sizeof(buf), 2000) <= 0);
	CU_ASSERT_PTR_NULL(strstr(buf, "kvpool_"));
	CU_ASSERT_EQUAL(h_daemon_finish(&d), 0);
}

/* uid 60001 reading metrics over loopback TCP, in a child: 1 when it got figures, 0 when not
 * (and whether kvpoold's socket let it in, into *joined). */
static int other_reads(const char *sock, int port, int *joined)
{
	static char buf[1 << 17];
	int rep[2], got[2] = { -1, -1 };
	pid_t pid;

	if (pipe(rep) < 0)
		return -1;
	pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		struct kvp_client *c;
		int n[2];

		close(rep[0]);
		if (drop_to(OTHER_UID) < 0)
			_exit(90);
		c = kvp_client_connect(sock, "other", NULL);
		n[1] = c != NULL;
		kvp_client_close(c);
		n[0] = get_on(tcp_from(NULL, port), buf, sizeof(buf), 2000) > 0 &&
		       strstr(buf, " 200 OK") && strstr(buf, "kvpool_");
		if (write(rep[1], n, sizeof(n)) != sizeof(n))
			_exit(92);
		_exit(0);
	}
	close(rep[1]);
	if (read(rep[0], got, sizeof(got)) != sizeof(got))
		got[0] = -1;
	close(rep[0]);
	if (h_wait_pid(pid, 10000) != 0)
		return -1;
	*joined = got[1];
	return got[0];
}

/* A loopback TCP peer is held to kvpoold's own socket rule, by the uid owning its socket:
 * with allowed_users = 0, uid 60001 is refused at kvpoold's socket and gets no figures from
 * 127.0.0.1 either (root does); without it, and with the socket open to everyone, it gets
 * both. Before, any local uid read every pool's figures over loopback. */
static void test_loopback_peer_held_to_socket_rule(void)
{
	char conf[1024];
	struct daemon d;
	int joined = -1;

	snprintf(conf, sizeof(conf),
		 "[daemon]\nallowed_users = 0\nmetrics_listen = 127.0.0.1:%d\n" POOL("p", "0"),
		 g_port);
	CU_ASSERT_EQUAL_FATAL(h_daemon_start(&d, conf, NULL), 0);
	CU_ASSERT_FATAL(chmod(d.dir, 0755) == 0 && chmod(d.sock, 0666) == 0);
	CU_ASSERT_FATAL(endpoint_up(g_port)); /* root */
	CU_ASSERT_EQUAL(other_reads(d.sock, g_port, &joined), 0);
	CU_ASSERT_EQUAL(joined, 0);
	CU_ASSERT_EQUAL(h_daemon_finish(&d), 0);

	snprintf(conf, sizeof(conf), "[daemon]\nmetrics_listen = 127.0.0.1:%d\n" POOL("p", "0"),
		 g_port);
	CU_ASSERT_EQUAL_FATAL(h_daemon_start(&d, conf, NULL), 0);
	CU_ASSERT_FATAL(chmod(d.dir, 0755) == 0 && chmod(d.sock, 0666) == 0);
	CU_ASSERT_FATAL(endpoint_up(g_port));
	CU_ASSERT_EQUAL(other_reads(d.sock, g_port, &joined), 1);
	CU_ASSERT_EQUAL(joined, 1);
	/* the socket closed to others (mode 0600): refused there, and here */
	CU_ASSERT_FATAL(chmod(d.sock, 0600) == 0);
	CU_ASSERT_EQUAL(other_reads(d.sock, g_port, &joined), 0);
	CU_ASSERT_EQUAL(joined, 0);
	CU_ASSERT_EQUAL(h_daemon_finish(&d), 0);
}

/* metrics_listen = unix:PATH: root reads it; uid 60001, refused at kvpoold's socket too
 * (allowed_users = 0), gets no metrics. */
static void test_unix_endpoint_holds_to_uids(void)
{
	static char buf[1 << 17];
	char conf[1024], path[256];
	struct daemon d;
	int ok = 0, rep[2], got = -1;
	pid_t pid;

	snprintf(
		conf, sizeof(conf),
		"[daemon]\nallowed_users = 0\nmetrics_listen = unix:/tmp/kvp-metrics-%d.sock\n" POOL(
			"p", "0"),
		(int)getpid());
	snprintf(path, sizeof(path), "/tmp/kvp-metrics-%d.sock", (int)getpid());
	CU_ASSERT_EQUAL_FATAL(h_daemon_start(&d, conf, NULL), 0);
	for (int i = 0; i < 50 && !ok; i++) {
		ok = get_on(unix_to(path), buf, sizeof(buf), 2000) > 0 && strstr(buf, " 200 OK") &&
		     strstr(buf, "kvpool_tier_total_tokens{pool=\"p\"");
		if (!ok)
			usleep(100000);
	}
	CU_ASSERT(ok);
	CU_ASSERT_FATAL(pipe(rep) == 0);
	pid = fork();
	CU_ASSERT_FATAL(pid >= 0);
	if (pid == 0) {
		int n;

		close(rep[0]);
		if (drop_to(OTHER_UID) < 0)
			_exit(90);
		/* refused at kvpoold's socket ... */
		if (kvp_client_connect(d.sock, "other", NULL))
			_exit(91);
		/* ... and at the endpoint: closed, no figure */
		n = get_on(unix_to(path), buf, sizeof(buf), 2000);
		n = n > 0 && strstr(buf, "kvpool_") ? 1 : 0;
		if (write(rep[1], &n, sizeof(n)) != sizeof(n))
			_exit(92);
		_exit(0);
	}
	close(rep[1]);
	CU_ASSERT(read(rep[0], &got, sizeof(got)) == sizeof(got));
	close(rep[0]);
	CU_ASSERT_EQUAL(h_wait_pid(pid, 10000), 0);
	CU_ASSERT_EQUAL(got, 0);
	CU_ASSERT_EQUAL(h_daemon_finish(&d), 0);
	CU_ASSERT_EQUAL(access(path, F_OK), -1); /* removed at the stop */
}

/* The Metrics call of uid 60001 shows pool "mine" (it may attach it) and not pool "theirs";
 * root sees both. Before, every session got every pool's series. */
static void test_rpc_shows_non_admin_its_pools(void)
{
	static char buf[1 << 17];
	struct daemon d;
	struct kvp_client *c;
	int rep[2], got[2] = { -1, -1 };
	pid_t pid;

	CU_ASSERT_EQUAL_FATAL(h_daemon_start(&d,
					     "[daemon]\n" POOL("mine", "60001") POOL("theirs", "0"),
					     NULL),
			      0);
	CU_ASSERT_FATAL(chmod(d.dir, 0755) == 0 && chmod(d.sock, 0666) == 0);
	c = kvp_client_connect(d.sock, "root", NULL);
	CU_ASSERT_FATAL(c != NULL);
	CU_ASSERT(kvp_client_metrics(c, buf, sizeof(buf), NULL) >= 0);
	CU_ASSERT_PTR_NOT_NULL(strstr(buf, "{pool=\"mine\""));
	CU_ASSERT_PTR_NOT_NULL(strstr(buf, "{pool=\"theirs\""));
	kvp_client_close(c);
	CU_ASSERT_FATAL(pipe(rep) == 0);
	pid = fork();
	CU_ASSERT_FATAL(pid >= 0);
	if (pid == 0) {
		int r[2];

		close(rep[0]);
		if (drop_to(OTHER_UID) < 0 || !(c = kvp_client_connect(d.sock, "other", NULL)) ||
		    kvp_client_metrics(c, buf, sizeof(buf), NULL) < 0)
			_exit(90);
		r[0] = strstr(buf, "{pool=\"mine\"") != NULL;
		r[1] = strstr(buf, "{pool=\"theirs\"") != NULL;
		if (write(rep[1], r, sizeof(r)) != sizeof(r))
			_exit(91);
		_exit(0);
	}
	close(rep[1]);
	CU_ASSERT(read(rep[0], got, sizeof(got)) == sizeof(got));
	close(rep[0]);
	CU_ASSERT_EQUAL(h_wait_pid(pid, 10000), 0);
	CU_ASSERT_EQUAL(got[0], 1);
	CU_ASSERT_EQUAL(got[1], 0);
	CU_ASSERT_EQUAL(h_daemon_finish(&d), 0);
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_idle_peer_locks_nobody_out),
		H_TEST(test_allow_list_refuses_other_addresses),
		H_TEST(test_loopback_peer_held_to_socket_rule),
		H_TEST(test_unix_endpoint_holds_to_uids),
		H_TEST(test_rpc_shows_non_admin_its_pools),
	};

	if (geteuid() != 0) {
		fprintf(stderr, "skip: needs root (clients of other users)\n");
		return 77;
	}
	g_port = 20000 + (int)((getpid() * 7) % 20000);
	return H_RUN_SUITE("metrics_access", NULL, NULL, tests);
}
