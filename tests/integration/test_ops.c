/* test_ops.c - operating kvpoold: a reload applies all or nothing and kvpoolctl says so in its
 * exit status; a drain refuses new non-admin sessions but lets admins watch and cancel it;
 * durations with units and no wrap; SIGTERM ends a start-up that waits on its config or
 * prefaults a large tier; check-config and --check exit statuses and small sizes. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "kvpool.h"

#define POOL_A                                                                                     \
	"[pool.a]\nlayers = 2\nkv_heads = 2\nhead_dim = 16\ndtype = fp16\npage_tokens = 16\n"      \
	"device = sim\ndevice_capacity = 1024t\nhost_capacity = 512t\nmlock = off\n"
#define POOL_B                                                                                     \
	"[pool.b]\nlayers = 1\nkv_heads = 1\nhead_dim = 8\ndtype = fp16\npage_tokens = 16\n"       \
	"device = sim\ndevice_capacity = 256t\nhost_capacity = 256t\nmlock = off\n"
/* Passes the budget check (its host tier is small) but cannot be created: no CUDA device 1023
 * exists, with or without a GPU or a CUDA build. */
#define POOL_C                                                                                     \
	"[pool.c]\nlayers = 1\nkv_heads = 1\nhead_dim = 8\ndtype = fp16\npage_tokens = 16\n"       \
	"device = cuda:1023\ndevice_capacity = 256t\nhost_capacity = 256t\nmlock = off\n"

/* Runs argv (argv[0] a path) as uid (uid 0: as is), stdout and stderr into out. Returns the exit
 * status, 128+signal, or -1; 126 when the uid could not be taken. */
static int run_as(uid_t uid, char *out, size_t len, const char *const *argv)
{
	int pfd[2], st;
	size_t n = 0;
	pid_t pid;

	out[0] = 0;
	if (pipe(pfd) < 0)
		return -1;
	pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		dup2(pfd[1], 1);
		dup2(pfd[1], 2);
		close(pfd[0]);
		if (uid && (setgid(uid) < 0 || setuid(uid) < 0))
			_exit(126);
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	close(pfd[1]);
	for (;;) {
		ssize_t r = read(pfd[0], out + n, len - 1 - n);

		if (r <= 0 || (n += (size_t)r) >= len - 1)
			break;
	}
	out[n] = 0;
	close(pfd[0]);
	if (waitpid(pid, &st, 0) != pid)
		return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* kvpoolctl --socket SOCK args... as uid. */
static int ctl(const struct daemon *d, uid_t uid, char *out, size_t len, const char *a1,
	       const char *a2, const char *a3)
{
	const char *argv[] = { h_kvpoolctl(), "--socket", d->sock, a1, a2, a3, NULL };

	return run_as(uid, out, len, argv);
}

static int n_pools(struct kvp_client *c)
{
	struct kvp_error e;
	struct kvp_status st = { .struct_size = sizeof(st) };
	int r = kvp_client_status(c, &st, &e);

	return r < 0 ? r : (int)st.n_pools;
}

/* kvpoold started with pool a, and a client named name with that call timeout (fatal when
 * either fails). */
static struct kvp_client *start_with_client(struct daemon *d, const char *name, uint32_t timeout_ms)
{
	struct kvp_error e;
	struct kvp_client *c;

	CU_ASSERT_EQUAL_FATAL(h_daemon_start(d, POOL_A, NULL), 0);
	c = kvp_client_connect(d->sock, name, &e);
	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	kvp_client_set_timeout(c, timeout_ms);
	return c;
}

/* ---- reload ---- */

/* A reload whose new pool c cannot be created applies nothing: not pool b made before it, not
 * a's new quota. kvpoolctl lists the refusal and what would have changed, and exits 1. */
static void test_reload_all_or_nothing(void)
{
	struct daemon d;
	struct kvp_error e;
	struct kvp_client *c;
	struct kvp_pool *p;
	uint64_t lease;
	uint32_t pages[8];
	char out[4096];
	int rc;

	c = start_with_client(&d, "reloader", 10000);
	CU_ASSERT_EQUAL(n_pools(c), 1);
	CU_ASSERT_EQUAL(h_write_file(d.config, POOL_A "session_quota = 32\n" POOL_B POOL_C), 0);
	rc = ctl(&d, 0, out, sizeof(out), "reload", NULL, NULL);
	printf("\n    kvpoolctl reload: exit %d:\n%s", rc, out);
	CU_ASSERT_EQUAL(rc, 1);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "reload refused, nothing applied"));
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "refused: pool c: cannot be created"));
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "not applied: pool a: session quota 0 -> 32 tokens"));
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "not applied: pool b: would be created"));
	CU_ASSERT_EQUAL(n_pools(c), 1); /* pool b was not kept */
	/* a's quota is still none: 8 pages (128 tokens) are granted */
	p = kvp_pool_attach(c, "a", NULL, &e);
	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	CU_ASSERT_EQUAL(kvp_lease_alloc(p, KVP_TIER_DEVICE, 8, &lease, pages, &e), 0);
	CU_ASSERT(h_log_contains(&d, "reload refused, nothing applied: pool c: cannot be created"));
	CU_ASSERT_FALSE(h_log_contains(&d, "reload: done"));
	/* --json says the same */
	rc = ctl(&d, 0, out, sizeof(out), "reload", "--json", NULL);
	CU_ASSERT_EQUAL(rc, 1);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "{\"reload\":\"refused\""));
	/* Without pool c the same file applies whole, and kvpoolctl exits 0. */
	CU_ASSERT_EQUAL(h_write_file(d.config, POOL_A "session_quota = 32\n" POOL_B), 0);
	rc = ctl(&d, 0, out, sizeof(out), "reload", NULL, NULL);
	CU_ASSERT_EQUAL(rc, 0);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "changed: pool b: created"));
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "changed: pool a: session quota 0 -> 32 tokens"));
	CU_ASSERT_EQUAL(n_pools(c), 2);
	kvp_client_close(c);
	CU_ASSERT_EQUAL(h_daemon_finish(&d), 0);
}

/* ---- drain ---- */

static int nobody_connect(void *arg)
{
	struct kvp_error e;
	struct kvp_client *c;
	struct kvp_pool *p;
	uint64_t lease;
	uint32_t page;
	bool expect_refused = *(bool *)arg;
	const char *sock = getenv("KVP_OPS_SOCK");

	if (setgid(65534) < 0 || setuid(65534) < 0)
		return 50;
	c = kvp_client_connect(sock, "nobody", &e);
	if (expect_refused)
		return !c && e.code == KVP_E_SHUTTING_DOWN ? 0 : 1;
	if (!c)
		return 2;
	kvp_client_set_timeout(c, 5000);
	p = kvp_pool_attach(c, "a", NULL, &e);
	if (!p || kvp_lease_alloc(p, KVP_TIER_DEVICE, 1, &lease, &page, &e) < 0)
		return 3;
	kvp_client_close(c);
	return 0;
}

/* While draining: a non-admin's connection and `kvpoolctl status` are refused SHUTTING_DOWN;
 * an admin connects, sees the drain, and cancels it; then others are served again. */
static void test_drain_refuses_others_admins_watch_and_cancel(void)
{
	struct daemon d;
	struct kvp_error e;
	struct kvp_client *c;
	bool refused = true, served = false;
	char out[4096];
	int rc;

	if (getuid() != 0) {
		printf("\n    skipped: needs root to act as uid 65534\n");
		CU_PASS("not root: skipped");
		return;
	}
	CU_ASSERT_EQUAL_FATAL(h_daemon_start(&d, POOL_A, NULL), 0);
	CU_ASSERT_EQUAL(chmod(d.dir, 0777), 0);
	CU_ASSERT_EQUAL(chmod(d.sock, 0666), 0);
	setenv("KVP_OPS_SOCK", d.sock, 1);
	/* a session that keeps the drain from ending */
	c = kvp_client_connect(d.sock, "holder", &e);
	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	kvp_client_set_timeout(c, 5000);
	rc = ctl(&d, 0, out, sizeof(out), "drain", "--deadline", "1h");
	CU_ASSERT_EQUAL(rc, 0);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "draining, deadline 3600000 ms"));

	rc = h_in_child(nobody_connect, &refused);
	printf("\n    non-admin connect while draining: %s\n", rc == 0 ? "refused" : "not refused");
	CU_ASSERT_EQUAL(rc, 0);
	rc = ctl(&d, 65534, out, sizeof(out), "status", NULL, NULL);
	printf("    non-admin kvpoolctl status: exit %d: %s", rc, out);
	CU_ASSERT_EQUAL(rc, 1);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "SHUTTING_DOWN"));

	/* an admin (root) watches it */
	rc = ctl(&d, 0, out, sizeof(out), "status", NULL, NULL);
	printf("    admin kvpoolctl status: exit %d\n", rc);
	CU_ASSERT_EQUAL(rc, 0);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "draining"));
	/* and cancels it */
	rc = ctl(&d, 0, out, sizeof(out), "drain", "--cancel", NULL);
	printf("    admin kvpoolctl drain --cancel: exit %d: %s", rc, out);
	CU_ASSERT_EQUAL(rc, 0);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "drain cancelled"));
	CU_ASSERT_EQUAL(kvp_admin_drain_cancel(c, &e), 0); /* none running now */
	rc = h_in_child(nobody_connect, &served);
	CU_ASSERT_EQUAL(rc, 0);
	rc = ctl(&d, 0, out, sizeof(out), "status", "--json", NULL);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "\"draining\":false"));
	/* a non-admin may not cancel */
	rc = ctl(&d, 65534, out, sizeof(out), "drain", "--cancel", NULL);
	CU_ASSERT_EQUAL(rc, 1);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "PERMISSION_DENIED"));
	CU_ASSERT(h_log_contains(&d, "drain cancelled by session"));
	kvp_client_close(c);
	CU_ASSERT_EQUAL(h_daemon_finish(&d), 0);
}

/* --deadline takes units and refuses what the wire's uint32 ms cannot hold. */
static void test_drain_deadline_units_and_overflow(void)
{
	struct daemon d;
	struct kvp_error e;
	struct kvp_client *c;
	char out[4096];
	int rc;

	c = start_with_client(&d, "holder", 5000);

	rc = ctl(&d, 0, out, sizeof(out), "drain", "--deadline", "5000000000");
	printf("\n    drain --deadline 5000000000: exit %d: %s", rc, out);
	CU_ASSERT_EQUAL(rc, 2);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "longer than the 4294967295 ms"));
	rc = ctl(&d, 0, out, sizeof(out), "drain", "--deadline", "30x");
	CU_ASSERT_EQUAL(rc, 2);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "is not a duration"));
	rc = ctl(&d, 0, out, sizeof(out), "status", "--json", NULL);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "\"draining\":false")); /* neither one drained */

	rc = ctl(&d, 0, out, sizeof(out), "drain", "--deadline", "30s");
	printf("    drain --deadline 30s: exit %d: %s", rc, out);
	CU_ASSERT_EQUAL(rc, 0);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "deadline 30000 ms"));
	CU_ASSERT(h_log_contains(&d, "or in 30000 ms"));
	CU_ASSERT_EQUAL(kvp_admin_drain_cancel(c, &e), 1);
	{
		const char *argv[] = { h_kvpoolctl(), "--socket",   d.sock, "--json",
				       "drain",	      "--deadline", "1500", NULL };

		rc = run_as(0, out, sizeof(out), argv);
	}
	CU_ASSERT_EQUAL(rc, 0);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "\"deadline_ms\":1500")); /* a bare number is ms */
	CU_ASSERT_EQUAL(kvp_admin_drain_cancel(c, &e), 1);
	kvp_client_close(c);
	CU_ASSERT_EQUAL(h_daemon_finish(&d), 0);
}

/* ---- signals before the loop ---- */

static pid_t spawn_kvpoold(const char *dir, const char *const *args)
{
	char log[200];
	pid_t pid;

	snprintf(log, sizeof(log), "%s/kvpoold.log", dir);
	pid = fork();
	if (pid == 0) {
		const char *argv[16];
		int n = 0, fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);

		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		unsetenv("NOTIFY_SOCKET");
		unsetenv("LISTEN_FDS");
		argv[n++] = h_kvpoold();
		for (int i = 0; args[i] && n < 15; i++)
			argv[n++] = args[i];
		argv[n] = NULL;
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	return pid;
}

/* `kvpoold --check` on a FIFO nobody writes: SIGTERM ends it. */
static void test_check_on_fifo_ends_on_sigterm(void)
{
	char dir[] = "/tmp/kvpool-test-XXXXXX", fifo[160];
	pid_t pid;
	int rc;

	CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(dir));
	snprintf(fifo, sizeof(fifo), "%s/conf.fifo", dir);
	CU_ASSERT_EQUAL_FATAL(mkfifo(fifo, 0600), 0);
	pid = spawn_kvpoold(dir, (const char *const[]){ "--check", "--config", fifo, NULL });
	CU_ASSERT_FATAL(pid > 0);
	usleep(300 * 1000);
	kill(pid, SIGTERM);
	rc = h_wait_pid(pid, 3000); /* -1: still running after 3 s (then killed) */
	printf("\n    kvpoold --check on a FIFO, SIGTERM: %s (%d)\n",
	       rc == 128 + SIGTERM ? "ended by SIGTERM"
	       : rc < 0		   ? "still running 3 s later"
				   : "exited",
	       rc);
	CU_ASSERT_EQUAL(rc, 128 + SIGTERM);
	h_dir_remove(dir);
}

static uint64_t rss_shmem_kib(pid_t pid)
{
	char path[64], line[256];
	unsigned long long v = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "RssShmem: %llu kB", &v) == 1)
			break;
	fclose(f);
	return v;
}

/* SIGTERM while a 3 GiB host tier is being faulted in ends kvpoold then, not after the whole
 * tier is in (and the socket open). */
static void test_sigterm_during_prefault(void)
{
	char dir[] = "/tmp/kvpool-test-XXXXXX", conf[160], sock[160], log[200];
	uint64_t t0, rss = 0, at_signal;
	pid_t pid;
	int rc;

	CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(dir));
	snprintf(conf, sizeof(conf), "%s/kvpoold.conf", dir);
	snprintf(sock, sizeof(sock), "%s/kvpoold.sock", dir);
	snprintf(log, sizeof(log), "%s/kvpoold.log", dir);
	CU_ASSERT_EQUAL_FATAL(h_write_file(conf, "[pool.big]\nlayers = 1\nkv_heads = 1\n"
						 "head_dim = 64\ndtype = fp16\npage_tokens = 16\n"
						 "device = none\nhost_capacity = 3G\nmlock = off\n"
						 "hugepages = off\n"),
			      0);
	pid = spawn_kvpoold(dir, (const char *const[]){ "--socket", sock, "--config", conf, NULL });
	CU_ASSERT_FATAL(pid > 0);
	t0 = h_now_ms();
	while (h_now_ms() - t0 < 10000 && (rss = rss_shmem_kib(pid)) < 32 * 1024)
		usleep(500);
	if (rss < 32 * 1024 || access(sock, F_OK) == 0) {
		/* refused by the budget check on a small machine, or already serving */
		printf("\n    skipped: the prefault was not seen (RssShmem %lu KiB)\n",
		       (unsigned long)rss);
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
		h_dir_remove(dir);
		CU_PASS("prefault not observed");
		return;
	}
	at_signal = rss;
	t0 = h_now_ms();
	kill(pid, SIGTERM);
	rc = h_wait_pid(pid, 20000);
	printf("\n    SIGTERM at %lu MiB of 3072 faulted in: %s (%d) after %lu ms\n",
	       (unsigned long)(at_signal >> 10),
	       rc == 128 + SIGTERM ? "ended by SIGTERM" : "exited after start-up", rc,
	       (unsigned long)(h_now_ms() - t0));
	CU_ASSERT_EQUAL(rc, 128 + SIGTERM);
	CU_ASSERT(h_file_contains(log, "stopped by a signal before serving"));
	CU_ASSERT_FALSE(h_file_contains(log, "listening on"));
	h_dir_remove(dir);
}

/* ---- check-config, --check ---- */

static void test_check_config_statuses_and_small_sizes(void)
{
	char dir[] = "/tmp/kvpool-test-XXXXXX", path[160], out[4096];
	const char *argv[] = { h_kvpoolctl(), "check-config", path, NULL };
	const char *dargv[] = { h_kvpoold(), "--check", "--config", path, NULL };
	int rc;

	CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/small.conf", dir);
	CU_ASSERT_EQUAL_FATAL(
		h_write_file(path, "[pool.tiny]\nlayers = 1\nkv_heads = 1\nhead_dim = 8\n"
				   "dtype = fp16\npage_tokens = 16\ndevice = sim\n"
				   "device_capacity = 64K\nhost_capacity = 3M\nmlock = off\n"),
		0);
	rc = run_as(0, out, sizeof(out), argv);
	printf("\n    check-config small: exit %d:\n%s", rc, out);
	CU_ASSERT_EQUAL(rc, 0);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "64.0 KiB"));
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "3.0 MiB"));
	CU_ASSERT_PTR_NULL(strstr(out, "0.00 GB"));
	CU_ASSERT_EQUAL(run_as(0, out, sizeof(out), dargv), 0);

	/* valid, but fits no machine: 1 (kvpoold --check: 3) */
	CU_ASSERT_EQUAL_FATAL(h_write_file(path,
					   "[pool.big]\nlayers = 64\nkv_heads = 8\nhead_dim = 128\n"
					   "dtype = fp16\npage_tokens = 16\ndevice = none\n"
					   "host_capacity = 64T\nmlock = off\n"),
			      0);
	CU_ASSERT_EQUAL(run_as(0, out, sizeof(out), argv), 1);
	CU_ASSERT_EQUAL(run_as(0, out, sizeof(out), dargv), 3);
	/* a NUMA node this machine lacks: does not fit, 1 */
	CU_ASSERT_EQUAL_FATAL(h_write_file(path,
					   "[pool.n]\nlayers = 1\nkv_heads = 1\nhead_dim = 8\n"
					   "dtype = fp16\npage_tokens = 16\ndevice = none\n"
					   "host_capacity = 1M\nmlock = off\nnuma_node = 1023\n"),
			      0);
	CU_ASSERT_EQUAL(run_as(0, out, sizeof(out), argv), 1);
	/* invalid: 2, both */
	CU_ASSERT_EQUAL_FATAL(h_write_file(path, "[pool.x]\nlayers = many\n"), 0);
	CU_ASSERT_EQUAL(run_as(0, out, sizeof(out), argv), 2);
	CU_ASSERT_EQUAL(run_as(0, out, sizeof(out), dargv), 2);
	snprintf(path, sizeof(path), "%s/missing.conf", dir);
	CU_ASSERT_EQUAL(run_as(0, out, sizeof(out), argv), 2);
	CU_ASSERT_EQUAL(run_as(0, out, sizeof(out), dargv), 2);
	h_dir_remove(dir);
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_reload_all_or_nothing),
		H_TEST(test_drain_refuses_others_admins_watch_and_cancel),
		H_TEST(test_drain_deadline_units_and_overflow),
		H_TEST(test_check_on_fifo_ends_on_sigterm),
		H_TEST(test_sigterm_during_prefault),
		H_TEST(test_check_config_statuses_and_small_sizes),
	};

	return H_RUN_SUITE("ops", NULL, NULL, tests);
}
