/* test_loop.c - kvpoold's event loop against a real daemon: a slow reload (its pools built on
 * the worker thread) while sessions keep being answered, a full submission ring (the "sqe"
 * fault site) retried instead of crashing, peer pidfds from SO_PEERPIDFD with the pidfd_open
 * fallback and failures counted, peers with more than 64 groups, a --socket path too long for
 * a unix address, a reload's budget counting only the new pools, and socket activation with
 * several named fds; a Reload call answered once its reload is applied (a call during a reload
 * waits for the next, a caller gone meanwhile has its answer dropped). */
#include <CUnit/Basic.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "kvpool.h"

#define CAP_IPC_LOCK_NR 14

#define POOL_A                                                                                     \
	"[pool.a]\n"                                                                               \
	"layers = 2\nkv_heads = 2\nhead_dim = 16\ndtype = fp16\npage_tokens = 16\n"                \
	"device = sim\ndevice_capacity = 1024t\nhost_capacity = 512t\nmlock = off\n"
#define POOL_B                                                                                     \
	"[pool.b]\n"                                                                               \
	"layers = 2\nkv_heads = 2\nhead_dim = 16\ndtype = fp16\npage_tokens = 16\n"                \
	"device = sim\ndevice_capacity = 1024t\nhost_capacity = 512t\nmlock = off\n"

/* A daemon of our own spawning: extra environment, fds passed at 3.., a memlock limit without
 * CAP_IPC_LOCK. */
struct svc {
	pid_t pid;
	char dir[128], sock[160], log[160], config[160];
};

struct spawn_opts {
	const char *const *env; /* name, value, ..., NULL */
	const int *fds;		/* passed as 3, 4, ... with LISTEN_FDS (then no --socket) */
	int nfds;
	const char *fdnames;	 /* LISTEN_FDNAMES, NULL: unset */
	unsigned long memlock;	 /* RLIMIT_MEMLOCK bytes and no CAP_IPC_LOCK; 0: as inherited */
	const char *const *args; /* extra arguments */
};

static int svc_init(struct svc *s)
{
	memset(s, 0, sizeof(*s));
	snprintf(s->dir, sizeof(s->dir), "/tmp/kvpool-test-XXXXXX");
	if (!mkdtemp(s->dir))
		return -1;
	snprintf(s->sock, sizeof(s->sock), "%s/kvpoold.sock", s->dir);
	snprintf(s->log, sizeof(s->log), "%s/kvpoold.log", s->dir);
	snprintf(s->config, sizeof(s->config), "%s/kvpoold.conf", s->dir);
	return 0;
}

static int svc_spawn(struct svc *s, const char *config, const struct spawn_opts *o)
{
	const char *argv[24];
	int n = 0;

	argv[n++] = h_kvpoold();
	if (!o || !o->nfds) {
		argv[n++] = "--socket";
		argv[n++] = s->sock;
	}
	argv[n++] = "--log-level";
	argv[n++] = "debug";
	if (config) {
		if (h_write_file(s->config, config) < 0)
			return -1;
		argv[n++] = "--config";
		argv[n++] = s->config;
	}
	for (int i = 0; o && o->args && o->args[i] && n < 22; i++)
		argv[n++] = o->args[i];
	argv[n] = NULL;
	s->pid = fork();
	if (s->pid < 0)
		return -1;
	if (s->pid == 0) {
		char pid[32], count[16];
		int fd = open(s->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);

		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		unsetenv("NOTIFY_SOCKET");
		unsetenv("LISTEN_FDS");
		unsetenv("LISTEN_PID");
		unsetenv("LISTEN_FDNAMES");
		unsetenv("WATCHDOG_USEC");
		unsetenv("KVPOOL_SOCKET");
		for (int i = 0; o && o->env && o->env[i]; i += 2)
			setenv(o->env[i], o->env[i + 1], 1);
		if (o && o->nfds) {
			/* Move them above the target range first, then down to 3.. in order. */
			int tmp[8];

			for (int i = 0; i < o->nfds; i++)
				tmp[i] = fcntl(o->fds[i], F_DUPFD, 20);
			for (int i = 0; i < o->nfds; i++) {
				if (dup2(tmp[i], 3 + i) < 0)
					_exit(126);
				close(tmp[i]);
			}
			snprintf(pid, sizeof(pid), "%d", (int)getpid());
			snprintf(count, sizeof(count), "%d", o->nfds);
			setenv("LISTEN_FDS", count, 1);
			setenv("LISTEN_PID", pid, 1);
			if (o->fdnames)
				setenv("LISTEN_FDNAMES", o->fdnames, 1);
		}
		if (o && o->memlock) {
			struct rlimit rl = { o->memlock, o->memlock };

			if (setrlimit(RLIMIT_MEMLOCK, &rl) < 0 ||
			    (geteuid() == 0 &&
			     prctl(PR_CAPBSET_DROP, CAP_IPC_LOCK_NR, 0, 0, 0) < 0))
				_exit(125);
		}
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	return 0;
}

static int svc_wait_ready(struct svc *s)
{
	return h_wait_accepting(s->sock, &s->pid, 10000);
}

static bool svc_log_contains(const struct svc *s, const char *needle)
{
	return h_file_contains(s->log, needle);
}

static bool svc_wait_log(const struct svc *s, const char *needle, int ms)
{
	return h_wait_file_contains(s->log, needle, ms);
}

/* How many lines of the log contain needle. */
static int svc_log_count(const struct svc *s, const char *needle)
{
	FILE *f = fopen(s->log, "r");
	char line[1024];
	int n = 0;

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (strstr(line, needle))
			n++;
	fclose(f);
	return n;
}

static int svc_stop(struct svc *s)
{
	int r;

	if (s->pid <= 0)
		return -1;
	kill(s->pid, SIGTERM);
	r = h_wait_pid(s->pid, 10000);
	s->pid = 0;
	return r;
}

static void svc_cleanup(struct svc *s)
{
	if (s->pid > 0)
		svc_stop(s);
	h_dir_remove(s->dir);
}

/* The value of a counter in `kvpoolctl metrics`, -1 when absent. */
static long metric(const struct svc *s, const char *name)
{
	char cmd[512], line[512];
	long v = -1;
	FILE *f;

	snprintf(cmd, sizeof(cmd), "%s --socket '%s' metrics 2>/dev/null", h_kvpoolctl(), s->sock);
	f = popen(cmd, "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		size_t n = strlen(name);

		if (strncmp(line, name, n) == 0 && line[n] == ' ')
			v = strtol(line + n + 1, NULL, 10);
	}
	pclose(f);
	return v;
}

static uint32_t n_pools(struct kvp_client *c)
{
	struct kvp_status st = { .struct_size = sizeof(st) };
	struct kvp_error e;

	if (kvp_client_status(c, &st, &e) < 0)
		return 0;
	return st.n_pools;
}

/* ---- a slow reload does not stop the loop ---- */

/* WATCHDOG=1 datagrams waiting on the fake notify socket (drained). */
static int watchdogs(int fd)
{
	char buf[512];
	ssize_t r;
	int n = 0;

	while ((r = recv(fd, buf, sizeof(buf) - 1, MSG_DONTWAIT)) > 0) {
		buf[r] = 0;
		n += strstr(buf, "WATCHDOG=1") != NULL;
	}
	return n;
}

static void test_reload_slow_pools_built_off_the_loop(void)
{
	char notify[200];
	const char *env[] = { "KVPOOLD_RELOAD_DELAY_MS",
			      "2500",
			      "WATCHDOG_USEC",
			      "400000",
			      "NOTIFY_SOCKET",
			      notify,
			      NULL };
	struct spawn_opts o = { .env = env };
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct svc s;
	struct kvp_error e;
	struct kvp_client *c, *c2;
	uint64_t worst = 0, t0;
	int pings = 0, nfd, fed = 0;

	CU_ASSERT_EQUAL_FATAL(svc_init(&s), 0);
	snprintf(notify, sizeof(notify), "%s/notify.sock", s.dir);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%.100s", notify);
	nfd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	CU_ASSERT_FATAL(nfd >= 0);
	CU_ASSERT_EQUAL_FATAL(bind(nfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	CU_ASSERT_EQUAL_FATAL(svc_spawn(&s, POOL_A, &o), 0);
	CU_ASSERT_EQUAL_FATAL(svc_wait_ready(&s), 0);
	c = kvp_client_connect(s.sock, "during-reload", &e);
	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	kvp_client_set_timeout(c, 5000);
	CU_ASSERT_EQUAL(n_pools(c), 1);
	CU_ASSERT_EQUAL(h_write_file(s.config, POOL_A POOL_B), 0);
	CU_ASSERT_EQUAL(kill(s.pid, SIGHUP), 0);
	CU_ASSERT_FATAL(svc_wait_log(&s, "reload: delayed", 3000));
	/* The worker sleeps 2.5 s before creating pool b: meanwhile every call is answered at
	 * once, a new session is admitted, the watchdog is fed, and the pool is not there yet. */
	watchdogs(nfd);
	fed = 0;
	t0 = h_now_ms();
	while (h_now_ms() - t0 < 1500) {
		uint64_t a = h_now_ms(), took;

		CU_ASSERT_EQUAL(kvp_client_ping(c, &e), 0);
		took = h_now_ms() - a;
		worst = took > worst ? took : worst;
		pings++;
		fed += watchdogs(nfd); /* drained as they come: a full queue would block kvpoold */
		usleep(20000);
	}
	c2 = kvp_client_connect(s.sock, "new-during-reload", &e);
	CU_ASSERT_PTR_NOT_NULL(c2);
	if (c2) {
		kvp_client_set_timeout(c2, 5000);
		CU_ASSERT_EQUAL(kvp_client_ping(c2, &e), 0);
		kvp_client_close(c2);
	}
	fed += watchdogs(nfd);
	close(nfd); /* notices go nowhere from here on */
	CU_ASSERT_FALSE(svc_log_contains(&s, "reload: done"));
	CU_ASSERT_EQUAL(n_pools(c), 1);
	printf("\n    %d pings during the reload, slowest %lu ms; %d watchdog notices\n", pings,
	       (unsigned long)worst, fed);
	CU_ASSERT(fed >= 4); /* every 200 ms for 1.5 s */
	CU_ASSERT(pings >= 10);
	CU_ASSERT(worst < 1000);
	/* Then the reload lands, on the loop thread: pool b is served. */
	CU_ASSERT(svc_wait_log(&s, "reload: done (2 pools)", 5000));
	CU_ASSERT_EQUAL(n_pools(c), 2);
	{
		struct kvp_pool *p = kvp_pool_attach(c, "b", NULL, &e);

		CU_ASSERT_PTR_NOT_NULL(p);
		kvp_pool_detach(p, &e);
	}
	kvp_client_close(c);
	CU_ASSERT_EQUAL(svc_stop(&s), 0);
	svc_cleanup(&s);
}

/* A reload still running at SIGTERM: the daemon waits for it and exits cleanly (its pool is
 * destroyed with the others, nothing leaks). */
static void test_reload_in_progress_at_stop(void)
{
	static const char *const env[] = { "KVPOOLD_RELOAD_DELAY_MS", "800", NULL };
	struct spawn_opts o = { .env = env };
	struct svc s;

	CU_ASSERT_EQUAL_FATAL(svc_init(&s), 0);
	CU_ASSERT_EQUAL_FATAL(svc_spawn(&s, POOL_A, &o), 0);
	CU_ASSERT_EQUAL_FATAL(svc_wait_ready(&s), 0);
	CU_ASSERT_EQUAL(h_write_file(s.config, POOL_A POOL_B), 0);
	CU_ASSERT_EQUAL(kill(s.pid, SIGHUP), 0);
	CU_ASSERT(svc_wait_log(&s, "reload: delayed", 3000));
	CU_ASSERT_EQUAL(svc_stop(&s), 0);
	CU_ASSERT(svc_log_contains(&s, "kvpoold stopped"));
	svc_cleanup(&s);
}

/* ---- a Reload call is answered when the reload is applied ---- */

/* `kvpoolctl [--json] reload` started in the background; its output is read by the caller. */
static FILE *reload_cmd(const struct svc *s, bool json)
{
	char cmd[512];

	snprintf(cmd, sizeof(cmd), "%s --socket '%s'%s reload 2>&1", h_kvpoolctl(), s->sock,
		 json ? " --json" : "");
	return popen(cmd, "r");
}

/* All of f's output, and its exit status. */
static int read_all(FILE *f, char *buf, size_t cap)
{
	size_t n = 0, got;

	while (n + 1 < cap && (got = fread(buf + n, 1, cap - 1 - n, f)) > 0)
		n += got;
	buf[n] = 0;
	return pclose(f);
}

static void test_reload_call_answered_when_applied(void)
{
	static const char *const env[] = { "KVPOOLD_RELOAD_DELAY_MS", "1500", NULL };
	struct spawn_opts o = { .env = env };
	struct svc s;
	struct kvp_error e;
	struct kvp_client *c;
	char out[2048];
	uint64_t t0, worst = 0;
	int pings = 0, st;
	FILE *f;

	CU_ASSERT_EQUAL_FATAL(svc_init(&s), 0);
	CU_ASSERT_EQUAL_FATAL(svc_spawn(&s, POOL_A, &o), 0);
	CU_ASSERT_EQUAL_FATAL(svc_wait_ready(&s), 0);
	c = kvp_client_connect(s.sock, "pinger", &e);
	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	kvp_client_set_timeout(c, 5000);
	CU_ASSERT_EQUAL(h_write_file(s.config, POOL_A POOL_B), 0);
	t0 = h_now_ms();
	f = reload_cmd(&s, true);
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	CU_ASSERT_FATAL(svc_wait_log(&s, "reload: delayed", 3000));
	/* While the Reload call waits for its pools, another session is answered at once. */
	while (h_now_ms() - t0 < 1000) {
		uint64_t a = h_now_ms(), took;

		CU_ASSERT_EQUAL(kvp_client_ping(c, &e), 0);
		took = h_now_ms() - a;
		worst = took > worst ? took : worst;
		pings++;
		usleep(20000);
	}
	CU_ASSERT_FALSE(svc_log_contains(&s, "reload: done"));
	CU_ASSERT(pings >= 10);
	CU_ASSERT(worst < 500);
	/* The call returns only once the pool exists, and says so. */
	st = read_all(f, out, sizeof(out));
	printf("\n    reload answered after %lu ms: %s", (unsigned long)(h_now_ms() - t0), out);
	CU_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	CU_ASSERT(h_now_ms() - t0 >= 1500);
	CU_ASSERT(svc_log_contains(&s, "reload: done (2 pools)"));
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "\"reload\":\"done\""));
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "pool b: created"));
	CU_ASSERT_EQUAL(n_pools(c), 2);
	/* Through the library too: nothing changed this time, answered at once. */
	{
		struct kvp_reload_item it[4] = { [0].struct_size = sizeof(it[0]) };

		CU_ASSERT_EQUAL(kvp_admin_reload(c, it, 4, &e), 0);
	}
	/* A file refused whole is the call's failure, with its reason. */
	CU_ASSERT_EQUAL(h_write_file(s.config, POOL_B), 0);
	{
		struct kvp_reload_item it[4] = { [0].struct_size = sizeof(it[0]) };

		CU_ASSERT_EQUAL(kvp_admin_reload(c, it, 4, &e), -KVP_E_INVALID_ARGUMENT);
		CU_ASSERT_PTR_NOT_NULL(strstr(e.message, "pool a was removed"));
	}
	CU_ASSERT_EQUAL(n_pools(c), 2);
	kvp_client_close(c);
	CU_ASSERT_EQUAL(svc_stop(&s), 0);
	svc_cleanup(&s);
}

/* A Reload call made while a reload runs waits for the next one, which reads the file after
 * the call: both callers are answered, the second with what its own reload did. */
static void test_reload_call_during_reload_waits_for_next(void)
{
	static const char *const env[] = { "KVPOOLD_RELOAD_DELAY_MS", "1000", NULL };
	struct spawn_opts o = { .env = env };
	struct svc s;
	char out1[2048], out2[2048];
	int st1, st2;
	FILE *f1, *f2;

	CU_ASSERT_EQUAL_FATAL(svc_init(&s), 0);
	CU_ASSERT_EQUAL_FATAL(svc_spawn(&s, POOL_A, &o), 0);
	CU_ASSERT_EQUAL_FATAL(svc_wait_ready(&s), 0);
	CU_ASSERT_EQUAL(h_write_file(s.config, POOL_A POOL_B), 0);
	f1 = reload_cmd(&s, false);
	CU_ASSERT_PTR_NOT_NULL_FATAL(f1);
	CU_ASSERT_FATAL(svc_wait_log(&s, "reload: delayed", 3000));
	f2 = reload_cmd(&s, false);
	CU_ASSERT_PTR_NOT_NULL_FATAL(f2);
	st1 = read_all(f1, out1, sizeof(out1));
	st2 = read_all(f2, out2, sizeof(out2));
	CU_ASSERT(WIFEXITED(st1) && WEXITSTATUS(st1) == 0);
	CU_ASSERT(WIFEXITED(st2) && WEXITSTATUS(st2) == 0);
	CU_ASSERT_PTR_NOT_NULL(strstr(out1, "pool b: created"));
	/* the second reload found pool b there already: nothing changed */
	CU_ASSERT_PTR_NOT_NULL(strstr(out2, "reload done: nothing changed"));
	CU_ASSERT_EQUAL(svc_log_count(&s, "reload: done (2 pools)"), 2);
	CU_ASSERT_EQUAL(svc_stop(&s), 0);
	svc_cleanup(&s);
}

/* A client that gives up before its deferred reply arrives: the reply is dropped when the
 * reload lands, the daemon goes on serving and exits cleanly (its books, tickets included,
 * checked at exit). */
static void test_reload_caller_gone_before_answer(void)
{
	static const char *const env[] = { "KVPOOLD_RELOAD_DELAY_MS", "800", NULL };
	struct spawn_opts o = { .env = env };
	struct svc s;
	struct kvp_error e;
	struct kvp_client *c, *c2;
	struct kvp_reload_item it[4] = { [0].struct_size = sizeof(it[0]) };

	CU_ASSERT_EQUAL_FATAL(svc_init(&s), 0);
	CU_ASSERT_EQUAL_FATAL(svc_spawn(&s, POOL_A, &o), 0);
	CU_ASSERT_EQUAL_FATAL(svc_wait_ready(&s), 0);
	CU_ASSERT_EQUAL(h_write_file(s.config, POOL_A POOL_B), 0);
	c = kvp_client_connect(s.sock, "impatient", &e);
	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	kvp_client_set_timeout(c, 200);
	CU_ASSERT_EQUAL(kvp_admin_reload(c, it, 4, &e), -KVP_E_TRANSPORT);
	kvp_client_close(c);
	CU_ASSERT(svc_wait_log(&s, "reload: done (2 pools)", 5000));
	CU_ASSERT(svc_wait_log(&s, "dropped: the session ended", 2000));
	c2 = kvp_client_connect(s.sock, "after", &e);
	CU_ASSERT_PTR_NOT_NULL_FATAL(c2);
	kvp_client_set_timeout(c2, 5000);
	CU_ASSERT_EQUAL(kvp_client_ping(c2, &e), 0);
	CU_ASSERT_EQUAL(n_pools(c2), 2);
	kvp_client_close(c2);
	CU_ASSERT_EQUAL(svc_stop(&s), 0);
	svc_cleanup(&s);
}

/* A Reload call waiting when kvpoold stops: its connection ends with the others (the call
 * fails, it does not hang), the reload finishes, its answer is dropped, the exit is clean. */
static void test_reload_call_at_stop_answered(void)
{
	static const char *const env[] = { "KVPOOLD_RELOAD_DELAY_MS", "1500", NULL };
	struct spawn_opts o = { .env = env };
	struct svc s;
	char out[2048];
	int st;
	FILE *f;

	CU_ASSERT_EQUAL_FATAL(svc_init(&s), 0);
	CU_ASSERT_EQUAL_FATAL(svc_spawn(&s, POOL_A, &o), 0);
	CU_ASSERT_EQUAL_FATAL(svc_wait_ready(&s), 0);
	CU_ASSERT_EQUAL(h_write_file(s.config, POOL_A POOL_B), 0);
	f = reload_cmd(&s, false);
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	CU_ASSERT_FATAL(svc_wait_log(&s, "reload: delayed", 3000));
	CU_ASSERT_EQUAL(svc_stop(&s), 0);
	st = read_all(f, out, sizeof(out));
	CU_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) != 0);
	CU_ASSERT(strstr(out, "TRANSPORT") || strstr(out, "SHUTTING_DOWN"));
	CU_ASSERT(svc_log_contains(&s, "dropped: the session ended"));
	svc_cleanup(&s);
}

/* ---- a full submission ring ---- */

static int client_round(void *arg)
{
	const char *sock = arg;
	struct kvp_error e;
	struct kvp_client *c = kvp_client_connect(sock, "sqe", &e);
	int ok = 0;

	if (!c)
		return 2;
	kvp_client_set_timeout(c, 5000);
	for (int i = 0; i < 20; i++)
		ok += kvp_client_ping(c, &e) == 0;
	kvp_client_close(c);
	return ok == 20 ? 0 : 1;
}

/* Every third SQE "cannot be had" (KVPOOLD_FAULTS=sqe:3): each arm that finds none is retried
 * the next turn: accepts, receives, sends, pidfd polls and their removal, the timer, the
 * signalfd. Every call is answered and the daemon stops cleanly. */
static void test_sqe_exhaustion_retried(void)
{
	static const char *const env[] = { "KVPOOLD_FAULTS", "sqe:3", NULL };
	struct spawn_opts o = { .env = env };
	struct svc s;
	int failed = 0;

	CU_ASSERT_EQUAL_FATAL(svc_init(&s), 0);
	CU_ASSERT_EQUAL_FATAL(svc_spawn(&s, POOL_A, &o), 0);
	CU_ASSERT_EQUAL_FATAL(svc_wait_ready(&s), 0);
	for (int i = 0; i < 20; i++)
		failed += h_in_child(client_round, s.sock) != 0;
	CU_ASSERT_EQUAL(failed, 0);
	/* A peer killed while connected: its pidfd poll completes, or is removed. */
	{
		pid_t pid = fork();

		if (pid == 0) {
			struct kvp_error e;
			struct kvp_client *c = kvp_client_connect(s.sock, "killed", &e);

			if (c)
				kvp_client_ping(c, &e);
			pause();
			_exit(0);
		}
		usleep(200000);
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
	}
	CU_ASSERT_EQUAL(h_in_child(client_round, s.sock), 0);
	CU_ASSERT(svc_log_contains(&s, "failure injection: sqe fails"));
	CU_ASSERT_EQUAL(kill(s.pid, SIGHUP), 0); /* the signalfd read is re-armed too */
	CU_ASSERT(svc_wait_log(&s, "nothing to re-read", 3000) ||
		  svc_wait_log(&s, "reload: done", 3000));
	CU_ASSERT_EQUAL(svc_stop(&s), 0);
	svc_cleanup(&s);
}

/* ---- peer pidfds ---- */

/* A child that connects (with Hello and a ping, or raw: a bare connect), hands its socket to a
 * grandchild that lives on, and exits; it is reaped before this returns, so its pid is free.
 * Its session must end with it (the pidfd), not with the socket. Returns the grandchild. */
static pid_t connect_then_exit(const char *sock, bool raw)
{
	int pfd[2];
	pid_t child, grand = -1;

	if (pipe(pfd) < 0)
		return -1;
	child = fork();
	if (child == 0) {
		pid_t g;

		if (raw) {
			/* a bare connect completes in the listen backlog, even with kvpoold stopped
			 */
			if (h_raw_connect(sock) < 0)
				_exit(1);
		} else {
			struct kvp_error e;
			struct kvp_client *c = kvp_client_connect(sock, "exits", &e);

			if (!c || kvp_client_ping(c, &e) < 0)
				_exit(1);
		}
		g = fork();
		if (g == 0) {
			sleep(30); /* holds the socket open */
			_exit(0);
		}
		if (write(pfd[1], &g, sizeof(g)) != sizeof(g))
			_exit(1);
		_exit(0);
	}
	close(pfd[1]);
	if (read(pfd[0], &grand, sizeof(grand)) != sizeof(grand))
		grand = -1;
	close(pfd[0]);
	waitpid(child, NULL, 0);
	return grand;
}

static bool wait_sessions(struct kvp_client *c, uint32_t want, int ms)
{
	uint64_t end = h_now_ms() + (uint64_t)ms;
	struct kvp_status st = { .struct_size = sizeof(st) };
	struct kvp_error e;

	do {
		if (kvp_client_status(c, &st, &e) == 0 && st.sessions == want)
			return true;
		usleep(20000);
	} while (h_now_ms() < end);
	return false;
}

static void pidfd_exit_tracked(const char *faults, const char *expect_log)
{
	const char *env[] = { "KVPOOLD_FAULTS", faults, NULL };
	struct spawn_opts o = { .env = faults ? env : NULL };
	struct svc s;
	struct kvp_error e;
	struct kvp_client *c;
	pid_t grand;

	CU_ASSERT_EQUAL_FATAL(svc_init(&s), 0);
	CU_ASSERT_EQUAL_FATAL(svc_spawn(&s, POOL_A, &o), 0);
	CU_ASSERT_EQUAL_FATAL(svc_wait_ready(&s), 0);
	c = kvp_client_connect(s.sock, "watcher", &e);
	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	kvp_client_set_timeout(c, 5000);
	grand = connect_then_exit(s.sock, false);
	CU_ASSERT(grand > 0);
	CU_ASSERT(wait_sessions(c, 1, 3000)); /* only the watcher's */
	CU_ASSERT(svc_wait_log(&s, "client process exited", 2000));
	if (expect_log)
		CU_ASSERT(svc_log_contains(&s, expect_log));
	CU_ASSERT_EQUAL(metric(&s, "kvpool_pidfd_failures_total"), 0);
	if (grand > 0) {
		kill(grand, SIGKILL);
		waitpid(grand, NULL, 0);
	}
	kvp_client_close(c);
	CU_ASSERT_EQUAL(svc_stop(&s), 0);
	svc_cleanup(&s);
}

/* The race: the connecting process exits (and is reaped, so its pid may be reused) before
 * kvpoold accepts, while a grandchild keeps the socket open. The session must still end with
 * the process that connected: SO_PEERPIDFD names that process even when it is gone, and a
 * fallback pidfd_open that finds no such pid closes the connection instead of tracking
 * nothing (or a stranger that reused the pid). */
static void peer_gone_before_accept(const char *faults, const char *expect_log)
{
	const char *env[] = { "KVPOOLD_FAULTS", faults, NULL };
	struct spawn_opts o = { .env = faults ? env : NULL };
	struct svc s;
	struct kvp_error e;
	struct kvp_client *c;
	pid_t grand;

	CU_ASSERT_EQUAL_FATAL(svc_init(&s), 0);
	CU_ASSERT_EQUAL_FATAL(svc_spawn(&s, POOL_A, &o), 0);
	CU_ASSERT_EQUAL_FATAL(svc_wait_ready(&s), 0);
	c = kvp_client_connect(s.sock, "watcher", &e);
	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	kvp_client_set_timeout(c, 5000);
	CU_ASSERT_EQUAL(kill(s.pid, SIGSTOP), 0); /* nothing is accepted meanwhile */
	grand = connect_then_exit(s.sock, true);
	CU_ASSERT(grand > 0);
	CU_ASSERT_EQUAL(kill(s.pid, SIGCONT), 0);
	/* Well before the 5 s handshake deadline, which would end it anyway. */
	CU_ASSERT(wait_sessions(c, 1, 2000));
	CU_ASSERT(svc_wait_log(&s, expect_log, 2000));
	if (grand > 0) {
		kill(grand, SIGKILL);
		waitpid(grand, NULL, 0);
	}
	kvp_client_close(c);
	CU_ASSERT_EQUAL(svc_stop(&s), 0);
	svc_cleanup(&s);
}

static void test_peer_gone_before_accept_peerpidfd(void)
{
	peer_gone_before_accept(NULL, "client process exited");
}

static void test_peer_gone_before_accept_pidfd_open(void)
{
	peer_gone_before_accept("peer_pidfd:1", "exited before its connection was accepted");
}

static void test_peer_pidfd_tracks_exit(void)
{
	pidfd_exit_tracked(NULL, NULL);
}

/* SO_PEERPIDFD refused (an older kernel): pidfd_open is used, said once, and exits are still
 * tracked. */
static void test_peer_pidfd_fallback_pidfd_open(void)
{
	pidfd_exit_tracked("peer_pidfd:1", "SO_PEERPIDFD not supported here");
}

/* No pidfd at all: every such peer is counted in pidfd_failures_total, and logged once (rate
 * limited), not silently. */
static void test_pidfd_failure_counted_and_logged(void)
{
	static const char *const env[] = { "KVPOOLD_FAULTS", "pidfd:1", NULL };
	struct spawn_opts o = { .env = env };
	struct svc s;
	struct kvp_error e;
	struct kvp_client *c[3];

	CU_ASSERT_EQUAL_FATAL(svc_init(&s), 0);
	CU_ASSERT_EQUAL_FATAL(svc_spawn(&s, POOL_A, &o), 0);
	CU_ASSERT_EQUAL_FATAL(svc_wait_ready(&s), 0); /* that probe connection is one */
	for (int i = 0; i < 3; i++) {
		c[i] = kvp_client_connect(s.sock, "no-pidfd", &e);
		CU_ASSERT_PTR_NOT_NULL(c[i]);
		if (c[i])
			CU_ASSERT_EQUAL(kvp_client_ping(c[i], &e), 0);
	}
	/* The probe, three clients, and kvpoolctl's own connection. */
	CU_ASSERT_EQUAL(metric(&s, "kvpool_pidfd_failures_total"), 5);
	CU_ASSERT_EQUAL(svc_log_count(&s, "no pidfd for pid"), 1);
	for (int i = 0; i < 3; i++)
		kvp_client_close(c[i]);
	CU_ASSERT_EQUAL(svc_stop(&s), 0);
	svc_cleanup(&s);
}

/* ---- peers in many groups ---- */

struct groups_arg {
	const char *sock;
	gid_t first;
	int n;
};

/* As uid/gid 4242 with n supplementary groups first.. : 0 when admitted and answered,
 * 3 when refused PERMISSION_DENIED, else 1 (2: setup failed). */
static int connect_with_groups(void *arg)
{
	const struct groups_arg *g = arg;
	gid_t list[128];
	struct kvp_error e;
	struct kvp_client *c;
	int r;

	for (int i = 0; i < g->n; i++)
		list[i] = g->first + (gid_t)i;
	if (setgroups((size_t)g->n, list) < 0 || setgid(4242) < 0 || setuid(4242) < 0)
		return 2;
	c = kvp_client_connect(g->sock, "grouped", &e);
	if (!c)
		return e.code == KVP_E_PERMISSION_DENIED ? 3 : 1;
	kvp_client_set_timeout(c, 5000);
	r = kvp_client_ping(c, &e) == 0 ? 0 : 1;
	kvp_client_close(c);
	return r;
}

static void test_peer_groups_beyond_64_admitted(void)
{
	static const char *const args[] = { "--allow-gid", "5069", NULL };
	struct spawn_opts o = { .args = args };
	struct groups_arg g;
	struct svc s;

	if (geteuid() != 0) {
		printf("\n    skipped: needs root (setgroups)\n");
		return;
	}
	CU_ASSERT_EQUAL_FATAL(svc_init(&s), 0);
	CU_ASSERT_EQUAL_FATAL(svc_spawn(&s, POOL_A, &o), 0);
	CU_ASSERT_EQUAL_FATAL(svc_wait_ready(&s), 0);
	/* The peer must reach the socket: the file mode is not what this test is about. */
	CU_ASSERT_EQUAL(chmod(s.dir, 0755), 0);
	CU_ASSERT_EQUAL(chmod(s.sock, 0666), 0);
	g.sock = s.sock;
	g.first = 5000;
	g.n = 70; /* the allowed group, 5069, is the 70th */
	CU_ASSERT_EQUAL(h_in_child(connect_with_groups, &g), 0);
	g.n = 69; /* without it: refused, so the 70th is what admitted the first */
	CU_ASSERT_EQUAL(h_in_child(connect_with_groups, &g), 3);
	g.first = 5069 - 2;
	g.n = 3; /* few groups still work */
	CU_ASSERT_EQUAL(h_in_child(connect_with_groups, &g), 0);
	CU_ASSERT_EQUAL(svc_stop(&s), 0);
	svc_cleanup(&s);
}

/* ---- --socket too long ---- */

static void test_socket_path_too_long_refused(void)
{
	char path[300], cut[108];
	const char *args[] = { "--socket", path, NULL };
	struct daemon d;
	struct stat sb;
	int r;

	snprintf(path, sizeof(path), "/tmp/%0200d/kvpoold.sock", 7);
	memcpy(cut, path, sizeof(cut) - 1);
	cut[sizeof(cut) - 1] = 0; /* where a truncated bind would land */
	unlink(cut);
	r = h_daemon_run_to_exit(&d, NULL, args);
	CU_ASSERT_EQUAL(r, 2);
	CU_ASSERT(h_log_contains(&d, "longer than the 107 a unix socket address holds"));
	/* Nothing was bound at the truncated path either. */
	CU_ASSERT_NOT_EQUAL(stat(cut, &sb), 0);
	h_daemon_cleanup(&d);
}

/* ---- the reload's budget ---- */

/* 16 KiB tokens: 320 of them are 5 MiB, 64 are 1 MiB. */
#define POOL_LOCKED(name, tokens)                                                                  \
	"[pool." name "]\n"                                                                        \
	"layers = 4\nkv_heads = 8\nhead_dim = 128\ndtype = fp16\npage_tokens = 16\n"               \
	"device = none\nhost_capacity = " tokens "\nmlock = on\n"

/* RLIMIT_MEMLOCK 8 MiB: the running pool locks 5 MiB, so 3 MiB of locked memory is left. A
 * reload adding a 1 MiB locked pool fits; counting the running pool again (6 MiB against the
 * 3 MiB left) would refuse it. */
static void test_reload_budget_counts_only_new_pools(void)
{
	struct spawn_opts o = { .memlock = 8ul << 20 };
	struct svc s;
	struct kvp_error e;
	struct kvp_client *c;
	struct rlimit rl;

	if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_max < (8ul << 20)) {
		printf("\n    skipped: RLIMIT_MEMLOCK hard limit below 8 MiB\n");
		return;
	}

	CU_ASSERT_EQUAL_FATAL(svc_init(&s), 0);
	CU_ASSERT_EQUAL_FATAL(svc_spawn(&s, POOL_LOCKED("big", "320t"), &o), 0);
	if (svc_wait_ready(&s) < 0) {
		char line[256];
		FILE *f = fopen(s.log, "r");

		while (f && fgets(line, sizeof(line), f))
			fputs(line, stderr);
		if (f)
			fclose(f);
		CU_FAIL_FATAL("kvpoold did not start with its locked pool");
	}
	CU_ASSERT(svc_log_contains(&s, "locked"));
	c = kvp_client_connect(s.sock, "budget", &e);
	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	kvp_client_set_timeout(c, 5000);
	CU_ASSERT_EQUAL(h_write_file(s.config,
				     POOL_LOCKED("big", "320t") POOL_LOCKED("small", "64t")),
			0);
	CU_ASSERT_EQUAL(kill(s.pid, SIGHUP), 0);
	CU_ASSERT(svc_wait_log(&s, "reload: done (2 pools)", 5000));
	CU_ASSERT_FALSE(svc_log_contains(&s, "HOST_BUDGET_EXCEEDED"));
	CU_ASSERT_EQUAL(n_pools(c), 2);
	/* A new pool that does not fit is still refused: 9 MiB exceed the limit itself (under
	 * AddressSanitizer, which makes mlock a no-op, nothing is locked and 8 MiB are left). */
	CU_ASSERT_EQUAL(h_write_file(s.config,
				     POOL_LOCKED("big", "320t") POOL_LOCKED("small", "64t")
					     POOL_LOCKED("huge", "576t")),
			0);
	CU_ASSERT_EQUAL(kill(s.pid, SIGHUP), 0);
	CU_ASSERT(svc_wait_log(&s, "new pools do not fit", 5000));
	CU_ASSERT(svc_log_contains(&s, "HOST_BUDGET_EXCEEDED"));
	CU_ASSERT_EQUAL(n_pools(c), 2);
	kvp_client_close(c);
	CU_ASSERT_EQUAL(svc_stop(&s), 0);
	svc_cleanup(&s);
}

/* ---- socket activation with several fds ---- */

static int unix_listener(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM, 0);

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, 16) < 0)
		return -1;
	return fd;
}

/* Three fds: a pipe named "kvpoold" (not a socket: refused despite its name), a listener named
 * "metrics" (not the control socket: kept, still listening), and the control socket named
 * "kvpoold.sock", last. */
static void test_socket_activation_fds_by_name_and_type(void)
{
	char other[200];
	struct spawn_opts o = { .fdnames = "kvpoold:metrics:kvpoold.sock" };
	struct svc s;
	struct kvp_error e;
	struct kvp_client *c;
	int fds[3], pfd[2], fd;

	CU_ASSERT_EQUAL_FATAL(svc_init(&s), 0);
	snprintf(other, sizeof(other), "%s/other.sock", s.dir);
	CU_ASSERT_EQUAL_FATAL(pipe(pfd), 0);
	fds[0] = pfd[0];
	fds[1] = unix_listener(other);
	fds[2] = unix_listener(s.sock);
	CU_ASSERT_FATAL(fds[1] >= 0 && fds[2] >= 0);
	o.fds = fds;
	o.nfds = 3;
	CU_ASSERT_EQUAL_FATAL(svc_spawn(&s, POOL_A, &o), 0);
	for (int i = 0; i < 3; i++)
		close(fds[i]); /* the daemon holds the only copies now */
	close(pfd[1]);
	c = kvp_client_connect(s.sock, "activated", &e);
	CU_ASSERT_PTR_NOT_NULL(c);
	if (c) {
		kvp_client_set_timeout(c, 5000);
		CU_ASSERT_EQUAL(kvp_client_ping(c, &e), 0);
		kvp_client_close(c);
	}
	CU_ASSERT(svc_wait_log(&s, "serving fd 5 ('kvpoold.sock')", 2000));
	CU_ASSERT(svc_log_contains(&s, "fd 3 ('kvpoold') is not a socket: closed"));
	CU_ASSERT(svc_log_contains(&s, "fd 4 ('metrics') kept (not the control socket)"));
	/* kept: the daemon holds the only copy and it still listens */
	fd = h_raw_connect(other);
	CU_ASSERT(fd >= 0);
	if (fd >= 0)
		close(fd);
	CU_ASSERT_EQUAL(svc_stop(&s), 0);
	svc_cleanup(&s);
}

/* Without names the first listening unix socket is served; a non-socket before it is
 * skipped. */
static void test_socket_activation_unnamed_first_listener(void)
{
	struct spawn_opts o = { 0 };
	struct svc s;
	struct kvp_error e;
	struct kvp_client *c;
	int fds[2], pfd[2];

	CU_ASSERT_EQUAL_FATAL(svc_init(&s), 0);
	CU_ASSERT_EQUAL_FATAL(pipe(pfd), 0);
	fds[0] = pfd[1];
	fds[1] = unix_listener(s.sock);
	CU_ASSERT_FATAL(fds[1] >= 0);
	o.fds = fds;
	o.nfds = 2;
	CU_ASSERT_EQUAL_FATAL(svc_spawn(&s, POOL_A, &o), 0);
	close(fds[1]);
	close(pfd[0]);
	close(pfd[1]);
	c = kvp_client_connect(s.sock, "activated", &e);
	CU_ASSERT_PTR_NOT_NULL(c);
	if (c) {
		kvp_client_set_timeout(c, 5000);
		CU_ASSERT_EQUAL(kvp_client_ping(c, &e), 0);
		kvp_client_close(c);
	}
	CU_ASSERT(svc_wait_log(&s, "serving fd 4 ('unnamed')", 2000));
	CU_ASSERT_EQUAL(svc_stop(&s), 0);
	svc_cleanup(&s);
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_reload_slow_pools_built_off_the_loop),
		H_TEST(test_reload_in_progress_at_stop),
		H_TEST(test_reload_call_answered_when_applied),
		H_TEST(test_reload_call_during_reload_waits_for_next),
		H_TEST(test_reload_caller_gone_before_answer),
		H_TEST(test_reload_call_at_stop_answered),
		H_TEST(test_sqe_exhaustion_retried),
		H_TEST(test_peer_pidfd_tracks_exit),
		H_TEST(test_peer_pidfd_fallback_pidfd_open),
		H_TEST(test_pidfd_failure_counted_and_logged),
		H_TEST(test_peer_gone_before_accept_peerpidfd),
		H_TEST(test_peer_gone_before_accept_pidfd_open),
		H_TEST(test_peer_groups_beyond_64_admitted),
		H_TEST(test_socket_path_too_long_refused),
		H_TEST(test_reload_budget_counts_only_new_pools),
		H_TEST(test_socket_activation_fds_by_name_and_type),
		H_TEST(test_socket_activation_unnamed_first_listener),
	};

	return H_RUN_SUITE("loop", NULL, NULL, tests);
}
