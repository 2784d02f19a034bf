/* test_service.c - kvpoold as a system service: sd_notify (READY, STATUS, WATCHDOG, STOPPING)
 * through a fake NOTIFY_SOCKET, socket activation (LISTEN_FDS), SIGHUP and `kvpoolctl reload`,
 * drain, Prometheus metrics, `kvpoolctl check-config`, and admin calls refused to others. */
#include <CUnit/Basic.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <regex.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "kvpool.h"

#define POOL_SMALL                                                                                 \
	"[pool.small]\n"                                                                           \
	"layers = 2\nkv_heads = 2\nhead_dim = 16\ndtype = fp16\npage_tokens = %u\n"                \
	"device = sim\ndevice_capacity = 1024t\nhost_capacity = 512t\nmlock = off\n"               \
	"session_quota = %u\n"

static void write_small_conf(const char *path, unsigned page_tokens, unsigned quota)
{
	char buf[512];

	snprintf(buf, sizeof(buf), POOL_SMALL, page_tokens, quota);
	CU_ASSERT_EQUAL(h_write_file(path, buf), 0);
}

static int stop_pid(pid_t pid)
{
	int r;

	if (pid <= 0)
		return -1;
	kill(pid, SIGTERM);
	r = h_wait_pid(pid, 10000); /* SIGKILLed and reaped on timeout */
	return r;
}

/* Own spawn (h_daemon_start drops NOTIFY_SOCKET and LISTEN_FDS): a temp dir with a config,
 * extra environment, optionally a listening socket passed as fd 3 (then no --socket). */
struct svc {
	pid_t pid;
	char dir[128], sock[160], log[160], config[160], notify[160];
};

static int svc_spawn(struct svc *s, const char *config, const char *const *env, int listen_fd)
{
	const char *argv[12];
	int n = 0;

	argv[n++] = h_kvpoold();
	if (listen_fd < 0) {
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
	argv[n] = NULL;
	s->pid = fork();
	if (s->pid < 0)
		return -1;
	if (s->pid == 0) {
		char pid[32];
		int fd = open(s->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);

		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		unsetenv("NOTIFY_SOCKET");
		unsetenv("LISTEN_FDS");
		unsetenv("LISTEN_PID");
		unsetenv("WATCHDOG_USEC");
		unsetenv("KVPOOL_SOCKET");
		for (int i = 0; env && env[i]; i += 2)
			setenv(env[i], env[i + 1], 1);
		if (listen_fd >= 0) {
			if (listen_fd != 3) {
				if (dup2(listen_fd, 3) < 0)
					_exit(126);
				close(listen_fd);
			} else {
				fcntl(3, F_SETFD, 0);
			}
			snprintf(pid, sizeof(pid), "%d", (int)getpid());
			setenv("LISTEN_FDS", "1", 1);
			setenv("LISTEN_PID", pid, 1);
		}
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	return 0;
}

static int svc_init(struct svc *s)
{
	memset(s, 0, sizeof(*s));
	snprintf(s->dir, sizeof(s->dir), "/tmp/kvpool-test-XXXXXX");
	if (!mkdtemp(s->dir))
		return -1;
	snprintf(s->sock, sizeof(s->sock), "%s/kvpoold.sock", s->dir);
	snprintf(s->log, sizeof(s->log), "%s/kvpoold.log", s->dir);
	snprintf(s->config, sizeof(s->config), "%s/kvpoold.conf", s->dir);
	snprintf(s->notify, sizeof(s->notify), "%s/notify.sock", s->dir);
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

static void svc_cleanup(struct svc *s)
{
	if (s->pid > 0)
		stop_pid(s->pid);
	s->pid = 0;
	h_dir_remove(s->dir);
}

/* ---- sd_notify ---- */

struct notes {
	int ready, status, watchdog, stopping;
	char status_line[256];
	uint64_t first_watchdog_ms, last_watchdog_ms;
};

static void note(struct notes *n, char *msg)
{
	for (char *line = strtok(msg, "\n"); line; line = strtok(NULL, "\n")) {
		if (strcmp(line, "READY=1") == 0) {
			n->ready++;
		} else if (strncmp(line, "STATUS=", 7) == 0) {
			n->status++;
			snprintf(n->status_line, sizeof(n->status_line), "%s", line);
		} else if (strcmp(line, "WATCHDOG=1") == 0) {
			if (!n->watchdog++)
				n->first_watchdog_ms = h_now_ms();
			n->last_watchdog_ms = h_now_ms();
		} else if (strcmp(line, "STOPPING=1") == 0) {
			n->stopping++;
		}
	}
}

/* Reads datagrams for ms, or until stop(n) holds. */
static void collect(int fd, struct notes *n, int ms, bool (*stop)(const struct notes *))
{
	uint64_t end = h_now_ms() + (uint64_t)ms;

	while (h_now_ms() < end && !(stop && stop(n))) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		char buf[1024];
		ssize_t r;

		if (poll(&p, 1, (int)(end - h_now_ms())) <= 0)
			continue;
		r = recv(fd, buf, sizeof(buf) - 1, MSG_DONTWAIT);
		if (r <= 0)
			continue;
		buf[r] = 0;
		note(n, buf);
	}
}

static bool got_ready(const struct notes *n)
{
	return n->ready && n->status;
}

static bool got_stopping(const struct notes *n)
{
	return n->stopping > 0;
}

static void test_notify_ready_status_watchdog_stopping(void)
{
	struct svc s;
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct notes n = { 0 };
	const char *env[] = { "NOTIFY_SOCKET", s.notify, "WATCHDOG_USEC", "400000", NULL };
	int fd;

	CU_ASSERT_EQUAL_FATAL(svc_init(&s), 0);
	fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	CU_ASSERT_FATAL(fd >= 0);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%.107s", s.notify);
	CU_ASSERT_EQUAL_FATAL(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	{
		int one = 1;

		setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &one, sizeof(one));
	}
	env[1] = s.notify;
	CU_ASSERT_EQUAL_FATAL(svc_spawn(&s, NULL, env, -1), 0);
	collect(fd, &n, 10000, got_ready);
	CU_ASSERT_EQUAL(n.ready, 1);
	CU_ASSERT(n.status >= 1);
	CU_ASSERT_PTR_NOT_NULL(strstr(n.status_line, "pools"));
	CU_ASSERT_PTR_NOT_NULL(strstr(n.status_line, "sessions"));
	/* READY means accepting: a client gets through at once. */
	{
		struct kvp_error e;
		struct kvp_client *c = kvp_client_connect(s.sock, "notified", &e);

		CU_ASSERT_PTR_NOT_NULL(c);
		if (c)
			CU_ASSERT_EQUAL(kvp_client_ping(c, &e), 0);
		kvp_client_close(c);
	}
	n.watchdog = 0;
	collect(fd, &n, 1500, NULL);
	printf("\n    watchdog pings in 1.5 s at WATCHDOG_USEC=400000: %d\n", n.watchdog);
	CU_ASSERT(n.watchdog >= 2);
	CU_ASSERT_EQUAL(n.stopping, 0);
	kill(s.pid, SIGTERM);
	collect(fd, &n, 5000, got_stopping);
	CU_ASSERT_EQUAL(n.stopping, 1);
	CU_ASSERT_EQUAL(h_wait_pid(s.pid, 10000), 0);
	s.pid = 0;
	close(fd);
	svc_cleanup(&s);
}

/* ---- socket activation ---- */

static void test_socket_activation_serves_passed_fd(void)
{
	struct svc s;
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct kvp_error e;
	struct kvp_client *c;
	struct kvp_status st = { .struct_size = sizeof(st) };
	int fd;

	CU_ASSERT_EQUAL_FATAL(svc_init(&s), 0);
	fd = socket(AF_UNIX, SOCK_STREAM, 0); /* not CLOEXEC: the daemon inherits it */
	CU_ASSERT_FATAL(fd >= 0);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%.107s", s.sock);
	CU_ASSERT_EQUAL_FATAL(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	CU_ASSERT_EQUAL_FATAL(listen(fd, 16), 0);
	CU_ASSERT_EQUAL_FATAL(svc_spawn(&s, NULL, NULL, fd), 0);
	close(fd); /* the daemon holds the only listener now */
	c = kvp_client_connect(s.sock, "activated", &e);
	CU_ASSERT_PTR_NOT_NULL(c);
	if (c) {
		kvp_client_set_timeout(c, 5000);
		CU_ASSERT_EQUAL(kvp_client_ping(c, &e), 0);
		CU_ASSERT_EQUAL(kvp_client_status(c, &st, &e), 0);
		CU_ASSERT_EQUAL(st.sessions, 1);
		kvp_client_close(c);
	}
	CU_ASSERT(svc_wait_log(&s, "socket activation", 2000));
	CU_ASSERT_EQUAL(stop_pid(s.pid), 0);
	s.pid = 0;
	svc_cleanup(&s);
}

/* ---- reload ---- */

static int alloc_one(struct kvp_pool *p, uint64_t *lease, struct kvp_error *e)
{
	uint32_t page;

	return kvp_lease_alloc(p, KVP_TIER_DEVICE, 1, lease, &page, e);
}

static int retry_alloc(struct kvp_pool *p, int want, int ms)
{
	uint64_t end = h_now_ms() + (uint64_t)ms, lease;
	struct kvp_error e;
	int r;

	do {
		r = alloc_one(p, &lease, &e);
		if (r == want || (want == 0 && r == 0))
			return r;
		if (r == 0)
			kvp_lease_free(p, lease, NULL, 0, &e);
		usleep(20000);
	} while (h_now_ms() < end);
	return r;
}

static void test_reload_quota_sighup_and_kvpoolctl(void)
{
	struct svc s;
	struct kvp_error e;
	struct kvp_client *c;
	struct kvp_pool *p;
	struct kvp_status st = { .struct_size = sizeof(st) };
	uint64_t lease;
	char cmd[512];
	int held = 0, r;

	CU_ASSERT_EQUAL_FATAL(svc_init(&s), 0);
	{
		char conf[512];

		snprintf(conf, sizeof(conf), POOL_SMALL, 16u, 64u);
		CU_ASSERT_EQUAL_FATAL(svc_spawn(&s, conf, NULL, -1), 0);
	}
	CU_ASSERT_EQUAL_FATAL(svc_wait_ready(&s), 0);
	c = kvp_client_connect(s.sock, "reload", &e);
	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	kvp_client_set_timeout(c, 5000);
	p = kvp_pool_attach(c, "small", NULL, &e);
	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	while ((r = alloc_one(p, &lease, &e)) == 0 && held < 100)
		held++;
	CU_ASSERT_EQUAL(held, 4); /* 64 tokens of 16-token pages */
	CU_ASSERT_EQUAL(r, -KVP_E_QUOTA_EXCEEDED);
	CU_ASSERT_EQUAL(e.code, KVP_E_QUOTA_EXCEEDED);
	CU_ASSERT_EQUAL(e.detail, KVP_DETAIL_QUOTA);
	CU_ASSERT_EQUAL(e.quota.quota_tokens, 64);
	CU_ASSERT_EQUAL(e.quota.held_tokens, 64);

	/* No quota any more: SIGHUP, and the same alloc goes through. */
	write_small_conf(s.config, 16, 0);
	CU_ASSERT_EQUAL(kill(s.pid, SIGHUP), 0);
	CU_ASSERT_EQUAL(retry_alloc(p, 0, 3000), 0);
	held++;
	CU_ASSERT(svc_wait_log(&s, "session quota 64 -> 0", 2000));

	/* Back to 64 through `kvpoolctl reload`: this session is over it, so the next is refused.
	 */
	write_small_conf(s.config, 16, 64);
	snprintf(cmd, sizeof(cmd), "%s --socket '%s' reload >/dev/null 2>&1", h_kvpoolctl(),
		 s.sock);
	r = system(cmd);
	CU_ASSERT(WIFEXITED(r) && WEXITSTATUS(r) == 0);
	CU_ASSERT_EQUAL(retry_alloc(p, -KVP_E_QUOTA_EXCEEDED, 3000), -KVP_E_QUOTA_EXCEEDED);
	CU_ASSERT(svc_wait_log(&s, "session quota 0 -> 64", 2000));

	/* A geometry change is refused: still running, old geometry served. */
	write_small_conf(s.config, 32, 64);
	CU_ASSERT_EQUAL(kill(s.pid, SIGHUP), 0);
	CU_ASSERT(svc_wait_log(&s, "reload refused", 3000));
	CU_ASSERT_EQUAL(kvp_client_ping(c, &e), 0);
	CU_ASSERT_EQUAL(kvp_client_status(c, &st, &e), 0);
	CU_ASSERT_EQUAL(st.pools[0].geometry.page_tokens, 16);
	CU_ASSERT_EQUAL(st.pools[0].tiers[KVP_TIER_DEVICE].leased_tokens, (uint64_t)held * 16);
	CU_ASSERT_EQUAL(waitpid(s.pid, NULL, WNOHANG), 0);
	{
		struct kvp_error e2;
		struct kvp_client *c2 = kvp_client_connect(s.sock, "after", &e2);
		struct kvp_geometry g;
		struct kvp_pool *p2 = c2 ? kvp_pool_attach(c2, "small", NULL, &e2) : NULL;

		CU_ASSERT_PTR_NOT_NULL(p2);
		if (p2) {
			kvp_pool_geometry(p2, &g);
			CU_ASSERT_EQUAL(g.page_tokens, 16);
		}
		kvp_client_close(c2);
	}
	kvp_client_close(c);
	CU_ASSERT_EQUAL(stop_pid(s.pid), 0);
	s.pid = 0;
	svc_cleanup(&s);
}

/* ---- drain ---- */

static void test_drain_refuses_leases_then_exits_0(void)
{
	struct svc s;
	struct kvp_error e;
	struct kvp_client *c;
	struct kvp_pool *p;
	uint64_t lease, t0;
	uint32_t page;
	int r;

	CU_ASSERT_EQUAL_FATAL(svc_init(&s), 0);
	{
		char conf[512];

		snprintf(conf, sizeof(conf), POOL_SMALL, 16u, 0u);
		CU_ASSERT_EQUAL_FATAL(svc_spawn(&s, conf, NULL, -1), 0);
	}
	CU_ASSERT_EQUAL_FATAL(svc_wait_ready(&s), 0);
	c = kvp_client_connect(s.sock, "drainer", &e);
	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	kvp_client_set_timeout(c, 5000);
	p = kvp_pool_attach(c, "small", NULL, &e);
	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	CU_ASSERT_EQUAL(kvp_lease_alloc(p, KVP_TIER_DEVICE, 2, &lease, (uint32_t[2]){ 0 }, &e), 0);
	CU_ASSERT_EQUAL(kvp_admin_drain(c, 5000, &e),
			0); /* this process is root or the daemon's uid */
	r = kvp_lease_alloc(p, KVP_TIER_DEVICE, 1, &lease, &page, &e);
	CU_ASSERT_EQUAL(r, -KVP_E_SHUTTING_DOWN);
	CU_ASSERT_EQUAL(e.code, KVP_E_SHUTTING_DOWN);
	CU_ASSERT_EQUAL(kvp_client_ping(c, &e), 0); /* the session itself still works */
	/* An admin (this process) may still connect to watch the drain; others are refused
	 * (test_ops). */
	{
		struct kvp_error e2;
		struct kvp_client *c2 = kvp_client_connect(s.sock, "late", &e2);

		CU_ASSERT_PTR_NOT_NULL(c2);
		kvp_client_close(c2);
	}
	CU_ASSERT_EQUAL(waitpid(s.pid, NULL, WNOHANG), 0); /* not before the session ends */
	t0 = h_now_ms();
	kvp_client_close(c);
	CU_ASSERT_EQUAL(h_wait_pid(s.pid, 4000), 0);
	printf("\n    drained daemon exited %lu ms after the last session closed\n",
	       (unsigned long)(h_now_ms() - t0));
	s.pid = 0;
	CU_ASSERT(svc_log_contains(&s, "drained"));
	svc_cleanup(&s);
}

/* ---- metrics ---- */

struct family {
	char name[128];
	bool help, type;
	char kind[16];
};

static struct family *family_get(struct family *f, int *n, const char *name)
{
	for (int i = 0; i < *n; i++)
		if (strcmp(f[i].name, name) == 0)
			return &f[i];
	if (*n >= 256)
		return NULL;
	memset(&f[*n], 0, sizeof(f[*n]));
	snprintf(f[*n].name, sizeof(f[*n].name), "%s", name);
	return &f[(*n)++];
}

/* The family a sample belongs to: histogram/summary suffixes map to their base. */
static struct family *family_of(struct family *f, int n, const char *sample)
{
	static const char *const sfx[] = { "_bucket", "_sum", "_count", NULL };

	for (int i = 0; i < n; i++)
		if (strcmp(f[i].name, sample) == 0)
			return &f[i];
	for (int k = 0; sfx[k]; k++) {
		size_t ls = strlen(sample), lk = strlen(sfx[k]);

		if (ls <= lk || strcmp(sample + ls - lk, sfx[k]))
			continue;
		for (int i = 0; i < n; i++)
			if (strlen(f[i].name) == ls - lk && !strncmp(f[i].name, sample, ls - lk) &&
			    (!strcmp(f[i].kind, "histogram") || !strcmp(f[i].kind, "summary")))
				return &f[i];
	}
	return NULL;
}

static void test_metrics_prometheus_text_and_leased_gauge(void)
{
	struct svc s;
	struct kvp_error e;
	struct kvp_client *c;
	struct kvp_pool *p;
	struct kvp_status st = { .struct_size = sizeof(st) };
	struct family *fam = calloc(256, sizeof(*fam));
	regex_t sample_re;
	char cmd[512], line[4096], want[128];
	uint64_t lease, leased_gauge = UINT64_MAX;
	uint32_t pages[3];
	int nfam = 0, nsamples = 0, bad = 0;
	FILE *f;

	CU_ASSERT_PTR_NOT_NULL_FATAL(fam);
	CU_ASSERT_EQUAL_FATAL(
		regcomp(&sample_re,
			"^([a-zA-Z_:][a-zA-Z0-9_:]*)"
			"(\\{[a-zA-Z_][a-zA-Z0-9_]*=\"([^\"\\\\]|\\\\.)*\""
			"(,[a-zA-Z_][a-zA-Z0-9_]*=\"([^\"\\\\]|\\\\.)*\")*,?\\})?"
			" ([-+]?([0-9]+(\\.[0-9]*)?|\\.[0-9]+)([eE][-+]?[0-9]+)?|[-+]?Inf|NaN)"
			"( -?[0-9]+)?$",
			REG_EXTENDED),
		0);
	CU_ASSERT_EQUAL_FATAL(svc_init(&s), 0);
	{
		char conf[512];

		snprintf(conf, sizeof(conf), POOL_SMALL, 16u, 0u);
		CU_ASSERT_EQUAL_FATAL(svc_spawn(&s, conf, NULL, -1), 0);
	}
	CU_ASSERT_EQUAL_FATAL(svc_wait_ready(&s), 0);
	c = kvp_client_connect(s.sock, "metrics", &e);
	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	kvp_client_set_timeout(c, 5000);
	p = kvp_pool_attach(c, "small", NULL, &e);
	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc(p, KVP_TIER_DEVICE, 3, &lease, pages, &e), 0);
	CU_ASSERT_EQUAL(kvp_client_status(c, &st, &e), 0);
	CU_ASSERT_EQUAL(st.pools[0].tiers[KVP_TIER_DEVICE].leased_tokens, 48);

	snprintf(cmd, sizeof(cmd), "%s --socket '%s' metrics", h_kvpoolctl(), s.sock);
	f = popen(cmd, "r");
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	snprintf(want, sizeof(want), "kvpool_tier_leased_tokens{pool=\"small\",tier=\"device\"} ");
	/* Pass 1 collects the text; HELP/TYPE may follow no order we rely on within a family. */
	{
		char *text = NULL;
		size_t len = 0, cap = 0;

		while (fgets(line, sizeof(line), f)) {
			size_t l = strlen(line);

			if (len + l + 1 > cap) {
				cap = (cap + l + 1) * 2;
				text = realloc(text, cap);
				CU_ASSERT_PTR_NOT_NULL_FATAL(text);
			}
			memcpy(text + len, line, l + 1);
			len += l;
		}
		{
			int rc = pclose(f);

			CU_ASSERT(WIFEXITED(rc) && WEXITSTATUS(rc) == 0);
		}
		CU_ASSERT_FATAL(text != NULL && len > 0);
		for (char *ln = strtok(text, "\n"); ln; ln = strtok(NULL, "\n")) {
			char name[128];
			struct family *fm;

			if (!strncmp(ln, "# HELP ", 7) || !strncmp(ln, "# TYPE ", 7)) {
				char kind[32] = "";

				if (sscanf(ln + 7, "%127s %31s", name, kind) < 1) {
					bad++;
					continue;
				}
				fm = family_get(fam, &nfam, name);
				if (!fm)
					continue;
				if (ln[2] == 'H') {
					fm->help = true;
				} else {
					fm->type = true;
					snprintf(fm->kind, sizeof(fm->kind), "%s", kind);
					if (strcmp(kind, "counter") && strcmp(kind, "gauge") &&
					    strcmp(kind, "histogram") && strcmp(kind, "summary") &&
					    strcmp(kind, "untyped")) {
						printf("\n    bad TYPE: %s\n", ln);
						bad++;
					}
				}
				continue;
			}
			if (ln[0] == '#')
				continue;
			nsamples++;
			if (regexec(&sample_re, ln, 0, NULL, 0) != 0) {
				printf("\n    not Prometheus text: '%s'\n", ln);
				bad++;
				continue;
			}
			snprintf(name, sizeof(name), "%.*s", (int)strcspn(ln, "{ "), ln);
			fm = family_of(fam, nfam, name);
			if (!fm || !fm->help || !fm->type) {
				printf("\n    sample without HELP and TYPE before it: '%s'\n", ln);
				bad++;
			}
			if (!strncmp(ln, want, strlen(want)))
				leased_gauge = strtoull(ln + strlen(want), NULL, 10);
		}
		free(text);
	}
	for (int i = 0; i < nfam; i++)
		if (!fam[i].help || !fam[i].type) {
			printf("\n    family %s lacks %s\n", fam[i].name,
			       fam[i].help ? "TYPE" : "HELP");
			bad++;
		}
	printf("\n    metrics: %d families, %d samples\n", nfam, nsamples);
	CU_ASSERT(nfam > 5);
	CU_ASSERT(nsamples > 5);
	CU_ASSERT_EQUAL(bad, 0);
	CU_ASSERT_EQUAL(leased_gauge, st.pools[0].tiers[KVP_TIER_DEVICE].leased_tokens);
	kvp_lease_free(p, lease, NULL, 0, &e);
	kvp_client_close(c);
	regfree(&sample_re);
	free(fam);
	CU_ASSERT_EQUAL(stop_pid(s.pid), 0);
	s.pid = 0;
	svc_cleanup(&s);
}

/* ---- check-config ---- */

static int run_capture(const char *cmd, char *out, size_t len)
{
	FILE *f = popen(cmd, "r");
	size_t n = 0;
	int rc;

	out[0] = 0;
	if (!f)
		return -1;
	while (n + 1 < len) {
		size_t r = fread(out + n, 1, len - 1 - n, f);

		if (r == 0)
			break;
		n += r;
	}
	out[n] = 0;
	rc = pclose(f);
	return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

/* GET path from 127.0.0.1:port; the whole answer into buf. Returns bytes read or -1. */
static int http_get(int port, const char *path, char *buf, size_t len)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	char req[128];
	size_t n = 0;
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	uint64_t end = h_now_ms() + 3000;

	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\nHost: localhost\r\n\r\n", path);
	if (send(fd, req, strlen(req), MSG_NOSIGNAL) < 0) {
		close(fd);
		return -1;
	}
	while (n + 1 < len && h_now_ms() < end) {
		struct pollfd pf = { .fd = fd, .events = POLLIN };
		ssize_t r;

		if (poll(&pf, 1, 500) <= 0)
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

static void test_metrics_http_endpoint(void)
{
	struct daemon d;
	static char buf[1 << 18];
	char conf[1024];
	int port = 20000 + (int)(getpid() % 20000), ok = 0;
	uint64_t end;

	snprintf(conf, sizeof(conf), "[daemon]\nmetrics_listen = 127.0.0.1:%d\n" POOL_SMALL, port,
		 16u, 0u);
	CU_ASSERT_EQUAL_FATAL(h_daemon_start(&d, conf, NULL), 0);
	/* The loop publishes a snapshot every second; the first within a tick or two. */
	end = h_now_ms() + 5000;
	while (!ok && h_now_ms() < end) {
		if (http_get(port, "/metrics", buf, sizeof(buf)) > 0 && strstr(buf, " 200 OK") &&
		    strstr(buf, "kvpool_sessions ") &&
		    strstr(buf, "kvpool_tier_total_tokens{pool=\"small\",tier=\"device\"} 1024"))
			ok = 1;
		else
			usleep(100000);
	}
	CU_ASSERT(ok);
	CU_ASSERT(http_get(port, "/nope", buf, sizeof(buf)) > 0 && strstr(buf, " 404 "));
	CU_ASSERT(h_log_contains(&d, "metrics served at"));
	CU_ASSERT_EQUAL(h_daemon_stop(&d), 0);
	h_daemon_cleanup(&d);
}

static void test_check_config_good_bad_and_too_big(void)
{
	char dir[] = "/tmp/kvpool-test-XXXXXX", path[160], cmd[512], out[8192], conf[512];
	int rc;

	CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/good.conf", dir);
	snprintf(conf, sizeof(conf),
		 POOL_SMALL "[pool.other]\nlayers = 1\nkv_heads = 1\n"
			    "head_dim = 8\ndtype = fp32\npage_tokens = 8\n"
			    "device = none\nhost_capacity = 800t\nmlock = off\n",
		 16u, 0u);
	CU_ASSERT_EQUAL_FATAL(h_write_file(path, conf), 0);
	snprintf(cmd, sizeof(cmd), "%s check-config '%s' 2>&1", h_kvpoolctl(), path);
	rc = run_capture(cmd, out, sizeof(out));
	CU_ASSERT_EQUAL(rc, 0);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "valid"));
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "pool small: 256 B/token, 4096 B/page"));
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "pool other: 64 B/token, 512 B/page"));

	snprintf(path, sizeof(path), "%s/bad.conf", dir);
	CU_ASSERT_EQUAL_FATAL(h_write_file(path, "[pool.small]\nlayers = 2\nkv_heads = many\n"), 0);
	snprintf(cmd, sizeof(cmd), "%s check-config '%s' 2>&1", h_kvpoolctl(), path);
	rc = run_capture(cmd, out, sizeof(out));
	CU_ASSERT_EQUAL(rc, 2);
	{
		char where[200];

		snprintf(where, sizeof(where), "%s:3", path);
		CU_ASSERT_PTR_NOT_NULL(strstr(out, where));
		CU_ASSERT_PTR_NOT_NULL(strstr(out, "kv_heads"));
	}

	/* 64 TB of host pages (4 MiB pages): valid, but it fits no machine here. */
	snprintf(path, sizeof(path), "%s/huge.conf", dir);
	CU_ASSERT_EQUAL_FATAL(h_write_file(path,
					   "[pool.big]\nlayers = 64\nkv_heads = 8\n"
					   "head_dim = 128\ndtype = fp16\npage_tokens = 16\n"
					   "device = none\nhost_capacity = 64T\nmlock = off\n"),
			      0);
	snprintf(cmd, sizeof(cmd), "%s check-config '%s' 2>&1", h_kvpoolctl(), path);
	rc = run_capture(cmd, out, sizeof(out));
	CU_ASSERT_EQUAL(rc, 1);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "pool big"));
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "but only"));
	CU_ASSERT(strstr(out, "(MemAvailable)") || strstr(out, "(cgroup memory.max)") ||
		  strstr(out, "(NUMA node") || strstr(out, "(RLIMIT_MEMLOCK)") ||
		  strstr(out, "(free huge pages)"));
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	CU_ASSERT_EQUAL(system(cmd), 0);
}

/* ---- admin calls from others ---- */

static const char *g_admin_sock;

static int nobody_admin_calls(void *arg)
{
	struct kvp_error e;
	struct kvp_client *c;
	uint64_t ev = 0;
	int fails = 0;

	(void)arg;
	if (setgid(65534) < 0 || setuid(65534) < 0)
		return 50;
	c = kvp_client_connect(g_admin_sock, "nobody", &e);
	if (!c)
		return 51;
	kvp_client_set_timeout(c, 5000);
	if (kvp_admin_evict(c, "small", KVP_TIER_DEVICE, 16, &ev, &e) != -KVP_E_PERMISSION_DENIED ||
	    e.code != KVP_E_PERMISSION_DENIED)
		fails |= 1;
	if (kvp_admin_drain(c, 1000, &e) != -KVP_E_PERMISSION_DENIED ||
	    e.code != KVP_E_PERMISSION_DENIED)
		fails |= 2;
	if (kvp_admin_flush(c, "small", &ev, &e) != -KVP_E_PERMISSION_DENIED ||
	    e.code != KVP_E_PERMISSION_DENIED)
		fails |= 4;
	if (kvp_client_ping(c, &e) != 0) /* refused calls do not end the session */
		fails |= 8;
	kvp_client_close(c);
	return fails;
}

static void test_admin_calls_permission_denied_for_others(void)
{
	struct svc s;
	struct kvp_error e;
	struct kvp_client *c;
	struct kvp_pool *p;
	uint64_t lease;
	uint32_t page;
	int r;

	if (getuid() != 0) {
		printf("\n    skipped: needs root to setuid(65534)\n");
		CU_PASS("not root: skipped");
		return;
	}
	CU_ASSERT_EQUAL_FATAL(svc_init(&s), 0);
	{
		char conf[512];

		snprintf(conf, sizeof(conf), POOL_SMALL, 16u, 0u);
		CU_ASSERT_EQUAL_FATAL(svc_spawn(&s, conf, NULL, -1), 0);
	}
	CU_ASSERT_EQUAL_FATAL(svc_wait_ready(&s), 0);
	CU_ASSERT_EQUAL(chmod(s.dir, 0777), 0);
	CU_ASSERT_EQUAL(chmod(s.sock, 0666), 0);
	g_admin_sock = s.sock;
	r = h_in_child(nobody_admin_calls, NULL);
	CU_ASSERT_EQUAL(r, 0);
	if (r)
		printf("\n    nobody child: %d (1 evict, 2 drain, 4 flush, 8 ping; 50+ setup)\n",
		       r);
	/* Nothing changed: not draining, leases still granted. */
	c = kvp_client_connect(s.sock, "root", &e);
	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	p = kvp_pool_attach(c, "small", NULL, &e);
	CU_ASSERT_PTR_NOT_NULL(p);
	if (p)
		CU_ASSERT_EQUAL(kvp_lease_alloc(p, KVP_TIER_DEVICE, 1, &lease, &page, &e), 0);
	kvp_client_close(c);
	CU_ASSERT(svc_log_contains(&s, "uid 65534"));
	CU_ASSERT_EQUAL(stop_pid(s.pid), 0);
	s.pid = 0;
	svc_cleanup(&s);
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_notify_ready_status_watchdog_stopping),
		H_TEST(test_socket_activation_serves_passed_fd),
		H_TEST(test_reload_quota_sighup_and_kvpoolctl),
		H_TEST(test_drain_refuses_leases_then_exits_0),
		H_TEST(test_metrics_prometheus_text_and_leased_gauge),
		H_TEST(test_metrics_http_endpoint),
		H_TEST(test_check_config_good_bad_and_too_big),
		H_TEST(test_admin_calls_permission_denied_for_others),
	};

	return H_RUN_SUITE("service", NULL, NULL, tests);
}
