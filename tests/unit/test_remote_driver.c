/* test_remote_driver.c - CUnit tests of daemon/remote/remote.c without a cluster: the I/O thread
 * does the client's work, its completions reach the owner through the one fd, so polling that fd
 * alone drives it, and nothing completes outside kvp_remote_on_ready(). */
#include <CUnit/Basic.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "remote.h"
#include "remote_cluster.h"
#include "secret.h"
#include "suite.h"

struct done {
	int n;
	enum kvp_rc_status st;
};

static const struct kvp_rv_fp g_fp = { 4, 2, 64, 1, 16, 0 };

static void on_page(void *arg, enum kvp_rc_status st, int err, const void *page, size_t n)
{
	struct done *d = arg;

	(void)err;
	(void)page;
	(void)n;
	d->n++;
	d->st = st;
}

static void conf_init(struct kvp_remote_conf *c, const char *seeds)
{
	memset(c, 0, sizeof(*c));
	c->enabled = 1;
	snprintf(c->seeds, sizeof(c->seeds), "%s", seeds);
	c->connect_timeout_ms = 200;
	c->command_timeout_ms = 100;
	c->max_inflight_bytes = 1 << 20;
	snprintf(c->secret, sizeof(c->secret), "%s", h_secret_src());
}

/* Polls the driver's fd alone for up to ms, running on_ready when it is readable, until
 * *until is nonzero. Returns the wake-ups. */
static int drive(struct kvp_remote *r, int ms, const int *until)
{
	uint64_t end = kvp_rc_now_ms() + (uint64_t)ms;
	int wakeups = 0;

	while (!*until && kvp_rc_now_ms() < end) {
		struct pollfd p = { .fd = kvp_remote_fd(r), .events = POLLIN };

		if (poll(&p, 1, 50) > 0) {
			wakeups++;
			kvp_remote_on_ready(r);
		}
	}
	return wakeups;
}

static void test_kvp_remote_new_refuses(void)
{
	struct kvp_remote_conf c;

	conf_init(&c, "127.0.0.1:1");
	c.enabled = 0;
	errno = 0;
	CU_ASSERT_PTR_NULL(kvp_remote_new(&c));
	CU_ASSERT_EQUAL(errno, EINVAL);
	conf_init(&c, "no-port");
	errno = 0;
	CU_ASSERT_PTR_NULL(kvp_remote_new(&c));
	CU_ASSERT_EQUAL(errno, EINVAL);
	/* no secret: no remote tier (a value could not be told from a forged one) */
	conf_init(&c, "127.0.0.1:1");
	c.secret[0] = '\0';
	errno = 0;
	CU_ASSERT_PTR_NULL(kvp_remote_new(&c));
	CU_ASSERT_EQUAL(errno, EINVAL);
	kvp_remote_free(NULL);
}

/* Secrets come from a file kvpoold alone may read, or a systemd credential; never from the
 * config text. */
static void test_kvp_remote_cred_read(void)
{
	char dir[] = "/tmp/kvp-cred.XXXXXX", path[64], buf[128], old[4096] = "";
	const char *had = getenv("CREDENTIALS_DIRECTORY");
	struct kvp_remote_conf c;
	size_t len = 0;
	FILE *f;

	CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(dir));
	if (had)
		snprintf(old, sizeof(old), "%s", had);
	snprintf(path, sizeof(path), "%s/redis-password", dir);
	f = fopen(path, "w");
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	fputs("s3cret\r\n", f);
	fclose(f);
	CU_ASSERT_EQUAL(chmod(path, 0400), 0);
	unsetenv("CREDENTIALS_DIRECTORY");
	CU_ASSERT_EQUAL(kvp_remote_cred_read("credential:redis-password", buf, sizeof(buf), &len),
			-ENOENT);
	setenv("CREDENTIALS_DIRECTORY", dir, 1);
	CU_ASSERT_EQUAL(kvp_remote_cred_read("credential:redis-password", buf, sizeof(buf), &len),
			0);
	CU_ASSERT_EQUAL(len, 6);
	CU_ASSERT_EQUAL(memcmp(buf, "s3cret", 6), 0);
	CU_ASSERT_EQUAL(kvp_remote_cred_read("credential:absent", buf, sizeof(buf), &len), -ENOENT);
	snprintf(buf, sizeof(buf), "file:%s", path);
	CU_ASSERT_EQUAL(kvp_remote_cred_read(buf, buf, 4, &len), -EFBIG);
	snprintf(buf, sizeof(buf), "file:%s", path);
	CU_ASSERT_EQUAL(chmod(path, 0644), 0); /* every user may read it */
	CU_ASSERT_EQUAL(kvp_remote_cred_read(buf, buf, sizeof(buf), &len), -EPERM);
	snprintf(buf, sizeof(buf), "file:%s", dir);
	CU_ASSERT_EQUAL(kvp_remote_cred_read(buf, buf, sizeof(buf), &len), -EINVAL);
	CU_ASSERT_EQUAL(kvp_remote_cred_read("s3cret", buf, sizeof(buf), &len), -EINVAL);
	/* a secret of 6 bytes is too short to key the MACs */
	CU_ASSERT_EQUAL(chmod(path, 0600), 0);
	conf_init(&c, "127.0.0.1:1");
	snprintf(c.secret, sizeof(c.secret), "file:%s", path);
	errno = 0;
	CU_ASSERT_PTR_NULL(kvp_remote_new(&c));
	CU_ASSERT_EQUAL(errno, EINVAL);
	unlink(path);
	rmdir(dir);
	if (old[0])
		setenv("CREDENTIALS_DIRECTORY", old, 1);
	else
		unsetenv("CREDENTIALS_DIRECTORY");
}

/* No slot map (nothing listens): the GET fails with "no master", and only through the fd:
 * the failure is a deferred completion, run when the timer the driver armed fires. */
static void test_kvp_remote_on_ready_timer_completes(void)
{
	struct kvp_remote_conf c;
	struct kvp_remote *r;
	struct done d = { 0 };
	struct pollfd p;

	conf_init(&c, "127.0.0.1:1");
	r = kvp_remote_new(&c);
	CU_ASSERT_PTR_NOT_NULL_FATAL(r);
	CU_ASSERT_EQUAL(kvp_remote_get_page(r, &g_fp, 0, "k", 1, on_page, &d), 0);
	kvp_remote_sync(r);
	CU_ASSERT_EQUAL(d.n, 0);
	p = (struct pollfd){ .fd = kvp_remote_fd(r), .events = POLLIN };
	CU_ASSERT_EQUAL(poll(&p, 1, 1000), 1);
	CU_ASSERT_EQUAL(d.n, 0); /* readable, but nothing runs before on_ready */
	drive(r, 2000, &d.n);
	CU_ASSERT_EQUAL(d.n, 1);
	CU_ASSERT(d.st == KVP_RC_ENO_MASTER || d.st == KVP_RC_ENODE_DOWN);
	kvp_remote_free(r);
}

/* A seed that accepts connections and never answers: the connection completes through the
 * fd alone (its socket in the epoll set), no slot map loads, and the driver does not spin
 * while it waits: wake-ups stay far below one per millisecond. */
static void test_kvp_remote_on_ready_silent_node(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t alen = sizeof(a);
	int ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct kvp_remote_conf c;
	struct kvp_remote *r;
	char seeds[64];
	int never = 0, wakeups, as;

	CU_ASSERT_FATAL(ls >= 0);
	CU_ASSERT_FATAL(bind(ls, (struct sockaddr *)&a, sizeof(a)) == 0);
	CU_ASSERT_FATAL(listen(ls, 16) == 0);
	CU_ASSERT_FATAL(getsockname(ls, (struct sockaddr *)&a, &alen) == 0);
	snprintf(seeds, sizeof(seeds), "127.0.0.1:%u", ntohs(a.sin_port));
	conf_init(&c, seeds);
	r = kvp_remote_new(&c);
	CU_ASSERT_PTR_NOT_NULL_FATAL(r);
	wakeups = drive(r, 1000, &never);
	{
		struct kvp_remote_stats st = { 0 };

		kvp_remote_stats_read(r, &st);
		CU_ASSERT(st.connects >= 1);
	}
	CU_ASSERT_FALSE(kvp_remote_ready(r));
	CU_ASSERT(wakeups < 500);
	as = accept4(ls, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
	CU_ASSERT(as >= 0);
	/* The socket is quiet now: only the timer can wake the owner for the deferred failure
	 * of a GET without a slot map. */
	{
		struct done d = { 0 };
		struct pollfd p = { .fd = kvp_remote_fd(r), .events = POLLIN };

		CU_ASSERT_EQUAL(kvp_remote_get_page(r, &g_fp, 0, "k", 1, on_page, &d), 0);
		kvp_remote_sync(r);
		CU_ASSERT_EQUAL(poll(&p, 1, 1000), 1);
		CU_ASSERT_EQUAL(d.n, 0);
		kvp_remote_on_ready(r);
		CU_ASSERT_EQUAL(d.n, 1);
		CU_ASSERT_EQUAL(d.st, KVP_RC_ENO_MASTER);
	}
	kvp_remote_free(r);
	if (as >= 0)
		close(as);
	close(ls);
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_kvp_remote_new_refuses),
		H_TEST(test_kvp_remote_cred_read),
		H_TEST(test_kvp_remote_on_ready_timer_completes),
		H_TEST(test_kvp_remote_on_ready_silent_node),
	};

	return H_RUN_SUITE("remote_driver", NULL, NULL, tests);
}
