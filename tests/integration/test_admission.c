/* test_admission.c - no client can lock the others out or take kvpoold's descriptors and memory:
 * connections refused (typed, LimitDetail "fds") before kvpoold's RLIMIT_NOFILE with the loop
 * idle and one log line per interval; accept backing off after EMFILE; pre-Hello connections
 * capped and closed after hello_timeout_ms, per-uid limits and admin slots; Attach replies with
 * descriptors capped per connection, so a client that reads nothing cannot make another's
 * Attach fail; one budget for reply and input buffers, large input buffers given back; a
 * pipelining client served with backpressure, and deadlines that run only while the client is
 * the one behind. Each case starts its own kvpoold (some under a small fd limit or as another
 * user); clients are forked processes, dropping to uids 60001.. where a second user is needed.
 *
 * With KVP_FIGURES=1 each case prints its figures (RSS, CPU, log lines, who was refused). To
 * take the same figures of an older kvpoold (KVPOOLD=path), KVP_LEGACY_CONFIG=1 leaves the
 * admission keys out of the configs it is given. */
#include <CUnit/Basic.h>
#include <errno.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "frame.h"
#include "harness.h"
#include "kvpool.h"

/* kvpoold's RSS figures are glibc malloc's (freed buffers go back to the system); under
 * AddressSanitizer its allocator holds freed memory in quarantine, so the RSS bounds are checked
 * only in a build without it (the refusals and answers are checked in both). */
#if defined(__SANITIZE_ADDRESS__)
#define RSS_BOUND(cond) ((void)(cond))
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RSS_BOUND(cond) ((void)(cond))
#endif
#endif
#ifndef RSS_BOUND
#define RSS_BOUND(cond) CU_ASSERT(cond)
#endif

#define OTHER_UID 60001
#define DAEMON_UID 60005 /* kvpoold's own user in the descriptors-in-flight case */

#define POOL_A                                                                                     \
	"[pool.a]\nlayers = 1\nkv_heads = 1\nhead_dim = 8\ndtype = fp16\npage_tokens = 16\n"       \
	"device = sim\ndevice_capacity = 4096t\nhost_capacity = 4096t\nmlock = off\n"

static bool g_figures;

/* The config text, less the admission keys under KVP_LEGACY_CONFIG. */
static const char *conf_of(const char *text)
{
	static const char *const keys[] = { "hello_timeout_ms", "max_prehello",
					    "max_sessions_per_uid", "admin_sessions",
					    "buffer_budget" };
	static char buf[4096];
	size_t n = 0;

	if (!getenv("KVP_LEGACY_CONFIG"))
		return text;
	for (const char *l = text; *l;) {
		const char *e = strchr(l, '\n');
		size_t len = e ? (size_t)(e - l) + 1 : strlen(l);
		bool drop = false;

		for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
			drop |= strncmp(l, keys[i], strlen(keys[i])) == 0;
		if (!drop && n + len < sizeof(buf)) {
			memcpy(buf + n, l, len);
			n += len;
		}
		l += len;
	}
	buf[n] = 0;
	return buf;
}

#define FIG(...)                                                                                   \
	do {                                                                                       \
		if (g_figures)                                                                     \
			printf("\n    FIGURE " __VA_ARGS__);                                       \
	} while (0)

/* ---- kvpoold's figures from /proc ---- */

/* Field name ("VmRSS", "VmHWM": the peak so far) of kvpoold's /proc status, in kB; -1. */
static long proc_status_kb(pid_t pid, const char *name)
{
	char path[64], line[256], fmt[32];
	long kb = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	snprintf(fmt, sizeof(fmt), "%s: %%ld kB", name);
	f = fopen(path, "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, fmt, &kb) == 1)
			break;
	fclose(f);
	return kb;
}

/* User + system CPU time of pid in ms. */
static long proc_cpu_ms(pid_t pid)
{
	char path[64], buf[1024], *p;
	unsigned long ut = 0, st = 0;
	FILE *f;
	size_t n;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	f = fopen(path, "r");
	if (!f)
		return -1;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	p = strrchr(buf, ')');
	if (!p ||
	    sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
		return -1;
	return (long)((ut + st) * 1000 / (unsigned long)sysconf(_SC_CLK_TCK));
}

/* Lines of the daemon's log (containing s when s is not NULL). */
static long log_lines(const struct daemon *d, const char *s)
{
	char line[2048];
	long n = 0;
	FILE *f = fopen(d->log, "r");

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		n += !s || strstr(line, s) != NULL;
	fclose(f);
	return n;
}

/* A counter of kvpoold's metrics (kvpool_<name>), read by a root client; -1 when absent. */
static long metric(const struct daemon *d, const char *name)
{
	static char text[1 << 18];
	struct kvp_error e;
	struct kvp_client *c = kvp_client_connect(d->sock, "metrics", &e);
	char key[128], *p;
	long v = -1;

	if (!c)
		return -1;
	if (kvp_client_metrics(c, text, sizeof(text), &e) > 0) {
		snprintf(key, sizeof(key), "\nkvpool_%s ", name);
		p = strstr(text, key);
		if (p)
			v = strtol(p + strlen(key), NULL, 10);
	}
	kvp_client_close(c);
	return v;
}

/* ---- raw calls ---- */

static uint64_t g_id = 1;

/* A Hello on fd within ms. Returns 0, the status code, or -1 (no answer: closed or timeout);
 * what gets the LimitDetail's what of a refusal ("" without one). */
static int raw_hello(int fd, const char *name, int ms, char *what, size_t wlen)
{
	Kvpool__Request q = KVPOOL__REQUEST__INIT;
	Kvpool__HelloReq h = KVPOOL__HELLO_REQ__INIT;
	Kvpool__Response *r;
	int code;

	if (what)
		what[0] = 0;
	h.protocol_version = KVP_PROTOCOL_VERSION;
	h.client_name = (char *)name;
	q.id = ++g_id;
	q.call_case = KVPOOL__REQUEST__CALL_HELLO;
	q.hello = &h;
	/* A refusal at accept may close the connection before Hello is sent: read it anyway. */
	h_raw_send_request(fd, &q);
	r = h_raw_recv(fd, ms);
	if (!r)
		return -1;
	code = r->status ? (int)r->status->code : 0;
	if (what && r->status && r->status->detail_case == KVPOOL__STATUS__DETAIL_LIMIT &&
	    r->status->limit->what)
		snprintf(what, wlen, "%s", r->status->limit->what);
	kvpool__response__free_unpacked(r, NULL);
	return code;
}

static int drop_to(uid_t uid)
{
	return setgroups(0, NULL) < 0 || setresgid(uid, uid, uid) < 0 ||
			       setresuid(uid, uid, uid) < 0
		       ? -1
		       : 0;
}

/* A child's figures through a pipe. */
struct report {
	int ok, refused, other;
	int closed;
	char what[48];
};

/* The parent's end of a forked client: it writes its report, then waits for a byte. */
struct kid {
	pid_t pid;
	int rep[2], go[2];
};

static int kid_start(struct kid *k)
{
	if (pipe(k->rep) < 0 || pipe(k->go) < 0)
		return -1;
	k->pid = fork();
	if (k->pid < 0)
		return -1;
	if (k->pid == 0) {
		close(k->rep[0]);
		close(k->go[1]);
		return 0;
	}
	close(k->rep[1]);
	close(k->go[0]);
	return 1;
}

static int kid_report(struct kid *k, const struct report *r)
{
	return write(k->rep[1], r, sizeof(*r)) == (ssize_t)sizeof(*r) ? 0 : -1;
}

static int kid_wait_go(struct kid *k)
{
	char b;

	return read(k->go[0], &b, 1) == 1 ? 0 : -1;
}

static int kid_read(struct kid *k, struct report *r, int ms)
{
	struct pollfd p = { .fd = k->rep[0], .events = POLLIN };

	if (poll(&p, 1, ms) != 1)
		return -1;
	return read(k->rep[0], r, sizeof(*r)) == (ssize_t)sizeof(*r) ? 0 : -1;
}

/* Lets the child go on and waits for its exit status. */
static int kid_finish(struct kid *k)
{
	int st;

	if (write(k->go[1], "g", 1) != 1)
		kill(k->pid, SIGKILL);
	st = h_wait_pid(k->pid, 20000);
	close(k->rep[0]);
	close(k->go[1]);
	return st;
}

static int more_fds(unsigned n)
{
	struct rlimit rl = { n, n };

	return setrlimit(RLIMIT_NOFILE, &rl);
}

/* ---- out of descriptors ---- */

/* Under a 256-descriptor limit, a second user opens 400 connections, each saying Hello: those
 * past the limit (less the reserve) are refused at once with LIMIT_EXCEEDED "fds"; kvpoold
 * stays idle (no accept spinning on EMFILE), logs a line per interval, and root still gets in
 * on the reserve. */
static void test_fds_refused_before_limit(void)
{
	static const char conf[] = "[daemon]\nmax_sessions = 4096\nmax_prehello = 4096\n"
				   "max_sessions_per_uid = 0\nhello_timeout_ms = 60000\n" POOL_A;
	struct daemon d;
	struct kid k;
	struct report r = { 0 };
	struct kvp_error e;
	struct kvp_client *root;
	struct kvp_status st = { .struct_size = sizeof(st) };
	long cpu0, cpu1, lines0, lines1, refused_lines;
	int c;

	CU_ASSERT_FATAL(h_daemon_start_as(&d, conf_of(conf), NULL, 256, 0) == 0);
	CU_ASSERT_FATAL(chmod(d.dir, 0755) == 0 && chmod(d.sock, 0666) == 0);
	c = kid_start(&k);
	CU_ASSERT_FATAL(c >= 0);
	if (c == 0) {
		static int fds[400];
		int n = 0;

		if (more_fds(1024) < 0 || drop_to(OTHER_UID) < 0)
			_exit(90);
		for (int i = 0, silent = 0; i < 400; i++) {
			int fd = h_raw_connect(d.sock);
			char what[48];
			/* an unanswered Hello is waited for a second, after three of them 50 ms */
			int code = fd < 0 ? -1
					  : raw_hello(fd, "flood", silent < 3 ? 1000 : 50, what,
						      sizeof(what));

			silent += code == -1;

			if (code == 0) {
				fds[n++] = fd;
				r.ok++;
				continue;
			}
			if (code == KVP_E_LIMIT_EXCEEDED && strcmp(what, "fds") == 0) {
				r.refused++;
			} else {
				r.other++;
				r.closed = fd < 0 ? -1000 - errno : code;
				snprintf(r.what, sizeof(r.what), "%s", what);
			}
			if (fd >= 0)
				close(fd);
		}
		kid_report(&k, &r);
		kid_wait_go(&k);
		for (int i = 0; i < n; i++)
			close(fds[i]);
		_exit(0);
	}
	CU_ASSERT_FATAL(kid_read(&k, &r, 120000) == 0);
	/* The flood's connections stay open: kvpoold at its limit, idle for a second. */
	cpu0 = proc_cpu_ms(d.pid);
	lines0 = log_lines(&d, NULL);
	usleep(1000000);
	cpu1 = proc_cpu_ms(d.pid);
	lines1 = log_lines(&d, NULL);
	refused_lines = log_lines(&d, "refused connection");
	root = kvp_client_connect(d.sock, "root-on-reserve", &e);
	CU_ASSERT_PTR_NOT_NULL(root);
	if (root) {
		CU_ASSERT_EQUAL(kvp_client_status(root, &st, &e), 0);
		kvp_client_close(root);
	}
	if (r.other)
		printf("\n    last other: code %d what '%s'\n", r.closed, r.what);
	FIG("fds: 400 connections of uid %d under a 256-fd limit: %d served, %d refused "
	    "LIMIT_EXCEEDED fds, %d other; kvpoold at the limit: %ld ms CPU and %ld log lines in "
	    "1 s; %ld 'refused connection' lines in all; root %s\n",
	    OTHER_UID, r.ok, r.refused, r.other, cpu1 - cpu0, lines1 - lines0, refused_lines,
	    root ? "served" : "refused");
	CU_ASSERT(r.ok >= 80);
	CU_ASSERT(r.refused >= 100);
	CU_ASSERT_EQUAL(r.other, 0);
	CU_ASSERT(cpu1 - cpu0 < 300);
	CU_ASSERT(lines1 - lines0 < 20);
	CU_ASSERT(refused_lines >= 1 && refused_lines <= 10);
	CU_ASSERT(metric(&d, "refused_fds_total") >= r.refused);
	CU_ASSERT(metric(&d, "log_lines_suppressed_total") >= r.refused / 2);
	CU_ASSERT_EQUAL(kid_finish(&k), 0);
	CU_ASSERT_EQUAL(h_daemon_finish(&d), 0);
}

/* An accept that fails EMFILE (the "accept" fault site) is not retried at once: accept backs off
 * (50 ms, doubling), and the failures make one log line. */
static void test_accept_backs_off_after_emfile(void)
{
	struct daemon d;
	int fds[6];
	uint64_t t0, t1;
	long lines;
	int started;

	setenv("KVPOOLD_FAULTS", "accept:1:5", 1);
	started = h_daemon_start(&d, "[daemon]\n" POOL_A, NULL);
	unsetenv("KVPOOLD_FAULTS");
	CU_ASSERT_FATAL(started == 0);
	/* h_daemon_start's probe took the first failure; four more to go, one at a time (each
	 * waits for the backoff to end), then served. */
	t0 = h_now_ms();
	for (int i = 0; i < 5; i++) {
		fds[i] = h_raw_connect(d.sock);
		CU_ASSERT_FATAL(fds[i] >= 0);
		if (i < 4)
			CU_ASSERT(h_raw_closed(fds[i], 5000));
	}
	fds[5] = -1;
	CU_ASSERT_EQUAL(raw_hello(fds[4], "after-backoff", 10000, NULL, 0), 0);
	t1 = h_now_ms();
	lines = log_lines(&d, "accept: Too many open files");
	FIG("accept: 5 EMFILE failures: the next connection served after %lu ms of backoff; %ld "
	    "log lines about them\n",
	    (unsigned long)(t1 - t0), lines);
	CU_ASSERT(t1 - t0 >= 700); /* 100 + 200 + 400 + 800 ms after the probe's 50 */
	CU_ASSERT(lines >= 1 && lines <= 2);
	CU_ASSERT_EQUAL(metric(&d, "accept_errors_total"), 5);
	for (int i = 0; i < 6; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	CU_ASSERT_EQUAL(h_daemon_finish(&d), 0);
}

/* ---- pre-Hello connections, per-uid limits, admin slots ---- */

/* uid 60001 opens 40 connections and says nothing: 12 (max_sessions_per_uid) are kept, the rest
 * refused at once; root and another user still connect; the silent ones are closed after
 * hello_timeout_ms (2 s). Then three users fill the sessions: the last admin_sessions stay for
 * root. */
static void test_prehello_uid_and_admin_slots(void)
{
	static const char conf[] = "[daemon]\nmax_sessions = 32\nmax_prehello = 24\n"
				   "max_sessions_per_uid = 12\nadmin_sessions = 4\n"
				   "hello_timeout_ms = 2000\n" POOL_A;
	struct daemon d;
	struct kid k, k2[3];
	struct report r = { 0 }, r2;
	char what[48];
	int c, fd, code, other_ok = 0, filled = 0, hello_refused = 0;
	long refused_lines;

	CU_ASSERT_FATAL(h_daemon_start(&d, conf_of(conf), NULL) == 0);
	CU_ASSERT_FATAL(chmod(d.dir, 0755) == 0 && chmod(d.sock, 0666) == 0);
	c = kid_start(&k);
	CU_ASSERT_FATAL(c >= 0);
	if (c == 0) {
		int fds[40], n = 0;

		if (drop_to(OTHER_UID) < 0)
			_exit(90);
		for (int i = 0; i < 40; i++) {
			Kvpool__Response *m;

			fds[i] = h_raw_connect(d.sock);
			if (fds[i] < 0) {
				r.other++;
				continue;
			}
			/* A refusal comes at once; a kept connection answers nothing. */
			m = h_raw_recv(fds[i], 40);
			if (!m) {
				r.ok++;
				fds[n++] = fds[i];
				continue;
			}
			if (m->status && m->status->code == KVPOOL__CODE__LIMIT_EXCEEDED &&
			    m->status->detail_case == KVPOOL__STATUS__DETAIL_LIMIT) {
				r.refused++;
				snprintf(r.what, sizeof(r.what), "%s", m->status->limit->what);
			} else {
				r.other++;
			}
			kvpool__response__free_unpacked(m, NULL);
			close(fds[i]);
		}
		kid_report(&k, &r);
		kid_wait_go(&k);
		for (int i = 0; i < n; i++)
			r.closed += h_raw_closed(fds[i], 2000);
		kid_report(&k, &r);
		_exit(0);
	}
	CU_ASSERT_FATAL(kid_read(&k, &r, 30000) == 0);
	/* root, and another user, are not locked out by them */
	fd = h_raw_connect(d.sock);
	code = fd < 0 ? -1 : raw_hello(fd, "root", 2000, NULL, 0);
	CU_ASSERT_EQUAL(code, 0);
	if (fd >= 0)
		close(fd);
	c = kid_start(&k2[0]);
	CU_ASSERT_FATAL(c >= 0);
	if (c == 0) {
		if (drop_to(OTHER_UID + 1) < 0)
			_exit(90);
		fd = h_raw_connect(d.sock);
		_exit(fd >= 0 && raw_hello(fd, "neighbour", 2000, NULL, 0) == 0 ? 0 : 1);
	}
	close(k2[0].rep[0]);
	close(k2[0].go[1]);
	other_ok = h_wait_pid(k2[0].pid, 10000) == 0;
	CU_ASSERT(other_ok);
	/* the silent ones are closed after hello_timeout_ms */
	usleep(2300000);
	CU_ASSERT_EQUAL(write(k.go[1], "g", 1), 1);
	CU_ASSERT_FATAL(kid_read(&k, &r, 10000) == 0);
	CU_ASSERT_EQUAL(h_wait_pid(k.pid, 10000), 0);
	close(k.rep[0]);
	close(k.go[1]);
	refused_lines = log_lines(&d, "refused connection");
	FIG("pre-Hello: uid %d opened 40 silent connections: %d kept, %d refused LIMIT_EXCEEDED "
	    "'%s', %d other; root %s, uid %d %s; %d of the kept closed after hello_timeout_ms; "
	    "%ld 'refused connection' log lines\n",
	    OTHER_UID, r.ok, r.refused, r.what, r.other, code == 0 ? "served" : "refused",
	    OTHER_UID + 1, other_ok ? "served" : "refused", r.closed, refused_lines);
	CU_ASSERT_EQUAL(r.ok, 12);
	CU_ASSERT_EQUAL(r.refused, 28);
	CU_ASSERT_STRING_EQUAL(r.what, "connections of uid 60001");
	CU_ASSERT_EQUAL(r.closed, 12);
	CU_ASSERT(refused_lines >= 1 && refused_lines <= 3);
	CU_ASSERT(metric(&d, "refused_uid_total") >= 28);
	CU_ASSERT(metric(&d, "hello_timeouts_total") >= 12);

	/* Three users, 12 sessions each, fill max_sessions less the admin slots (28 of 32). */
	for (int u = 0; u < 3; u++) {
		c = kid_start(&k2[u]);
		CU_ASSERT_FATAL(c >= 0);
		if (c == 0) {
			int fds[12];

			memset(&r2, 0, sizeof(r2));
			if (drop_to(OTHER_UID + 10 + (uid_t)u) < 0)
				_exit(90);
			for (int i = 0; i < 12; i++) {
				fds[i] = h_raw_connect(d.sock);
				code = fds[i] < 0 ? -1
						  : raw_hello(fds[i], "filler", 2000, what,
							      sizeof(what));
				if (code == 0)
					r2.ok++;
				else if (code == KVP_E_LIMIT_EXCEEDED &&
					 strcmp(what, "sessions") == 0)
					r2.refused++;
				else
					r2.other++;
			}
			kid_report(&k2[u], &r2);
			kid_wait_go(&k2[u]);
			_exit(0);
		}
		CU_ASSERT_FATAL(kid_read(&k2[u], &r2, 30000) == 0);
		filled += r2.ok;
		hello_refused += r2.refused;
		CU_ASSERT_EQUAL(r2.other, 0);
	}
	fd = h_raw_connect(d.sock);
	code = fd < 0 ? -1 : raw_hello(fd, "root-admin-slot", 2000, NULL, 0);
	FIG("admin slots: 3 users asked 36 sessions of max_sessions 32: %d served, %d refused "
	    "LIMIT_EXCEEDED sessions; root then %s\n",
	    filled, hello_refused, code == 0 ? "served" : "refused");
	CU_ASSERT_EQUAL(filled, 28);
	CU_ASSERT_EQUAL(hello_refused, 8);
	CU_ASSERT_EQUAL(code, 0);
	if (fd >= 0)
		close(fd);
	for (int u = 0; u < 3; u++)
		CU_ASSERT_EQUAL(kid_finish(&k2[u]), 0);
	CU_ASSERT_EQUAL(h_daemon_finish(&d), 0);
}

/* ---- Attach descriptors in flight ---- */

static Kvpool__Request attach_req(Kvpool__AttachReq *a, const char *pool)
{
	Kvpool__Request q = KVPOOL__REQUEST__INIT;

	kvpool__attach_req__init(a);
	a->pool = (char *)pool;
	q.id = ++g_id;
	q.call_case = KVPOOL__REQUEST__CALL_ATTACH;
	q.attach = a;
	return q;
}

/* kvpoold runs as its own user under a 256-descriptor limit, so descriptors in flight to
 * clients count against it. A client pipelines 300 Attach calls (two memory fds each) and reads
 * nothing; another client then attaches and pings. The first gets LIMIT_EXCEEDED past
 * KVP_ATTACH_FDS_INFLIGHT; the second is served; nobody's connection is closed. */
static void test_attach_fds_in_flight_capped(void)
{
	struct daemon d;
	struct kid k;
	struct report r = { 0 };
	struct kvp_error e;
	struct kvp_client *c2;
	struct kvp_pool *pool = NULL;
	int c, attached, pinged = -1;

	CU_ASSERT_FATAL(h_daemon_start_as(&d, "[daemon]\n" POOL_A, NULL, 256, DAEMON_UID) == 0);
	c = kid_start(&k);
	CU_ASSERT_FATAL(c >= 0);
	if (c == 0) {
		int fd = h_raw_connect(d.sock);

		if (fd < 0 || raw_hello(fd, "attach-flood", 5000, NULL, 0) != 0)
			_exit(91);
		for (int i = 0; i < 300; i++) {
			Kvpool__AttachReq a;
			Kvpool__Request q = attach_req(&a, "a");

			if (h_raw_send_request(fd, &q) < 0)
				_exit(92);
		}
		r.ok = -1;
		kid_report(&k, &r);
		kid_wait_go(&k);
		r.ok = 0;
		for (int i = 0; i < 300; i++) {
			Kvpool__Response *m = h_raw_recv(fd, 5000);

			if (!m) {
				r.closed = 1;
				break;
			}
			if (!m->status || !m->status->code)
				r.ok++;
			else if (m->status->code == KVPOOL__CODE__LIMIT_EXCEEDED)
				r.refused++;
			else
				r.other++;
			kvpool__response__free_unpacked(m, NULL);
		}
		kid_report(&k, &r);
		_exit(0);
	}
	CU_ASSERT_FATAL(kid_read(&k, &r, 10000) == 0);
	usleep(300000); /* kvpoold answers what it will */
	c2 = kvp_client_connect(d.sock, "innocent", &e);
	CU_ASSERT_PTR_NOT_NULL(c2);
	if (c2) {
		pool = kvp_pool_attach(c2, "a", NULL, &e);
		if (!pool)
			printf("\n    innocent attach: %s\n", e.message);
		pinged = kvp_client_ping(c2, &e);
	}
	attached = pool != NULL;
	CU_ASSERT_EQUAL(write(k.go[1], "g", 1), 1);
	CU_ASSERT_FATAL(kid_read(&k, &r, 30000) == 0);
	CU_ASSERT_EQUAL(h_wait_pid(k.pid, 10000), 0);
	close(k.rep[0]);
	close(k.go[1]);
	FIG("attach fds: a client pipelined 300 Attach (2 fds each) reading nothing, kvpoold under "
	    "256 fds as uid %d: it got %d replies with fds, %d LIMIT_EXCEEDED, %d other%s; the "
	    "other client's Attach %s, its ping %s\n",
	    DAEMON_UID, r.ok, r.refused, r.other, r.closed ? ", then its connection closed" : "",
	    attached ? "served" : "failed", pinged == 0 ? "answered" : "failed");
	CU_ASSERT(attached);
	CU_ASSERT_EQUAL(pinged, 0);
	CU_ASSERT_EQUAL(r.closed, 0);
	CU_ASSERT(r.ok >= 1 && r.ok <= 64);
	CU_ASSERT_EQUAL(r.ok + r.refused, 300);
	CU_ASSERT(!h_log_contains(&d, "send failed"));
	if (pool)
		kvp_pool_detach(pool, &e);
	kvp_client_close(c2);
	CU_ASSERT_EQUAL(h_daemon_finish(&d), 0);
}

/* ---- memory held for clients ---- */

/* Six clients of another user pipeline Status calls and never read: together their replies
 * stay within buffer_budget (4 MiB) instead of 8 MiB queued each; a new call of a non-admin is
 * then refused LIMIT_EXCEEDED "buffer bytes" while root is still answered. */
#define POOL_N(n)                                                                                  \
	"[pool.p" #n "]\nlayers = 1\nkv_heads = 1\nhead_dim = 8\ndtype = fp16\n"                   \
	"page_tokens = 16\ndevice = sim\ndevice_capacity = 256t\nhost_capacity = 0\nmlock = off\n"

static void test_buffer_budget_holds(void)
{
	/* a dozen pools: a Status reply is a few KiB, its request a few bytes */
	static const char conf[] =
		"[daemon]\nbuffer_budget = 4M\n" POOL_A POOL_N(1) POOL_N(2) POOL_N(3) POOL_N(4)
			POOL_N(5) POOL_N(6) POOL_N(7) POOL_N(8) POOL_N(9) POOL_N(10) POOL_N(11);
	struct daemon d;
	struct kid k[6], late;
	struct report r = { 0 };
	struct kvp_error e;
	struct kvp_client *root;
	long rss0, rss1;
	int c, late_status;
	bool root_ok;

	CU_ASSERT_FATAL(h_daemon_start(&d, conf_of(conf), NULL) == 0);
	CU_ASSERT_FATAL(chmod(d.dir, 0755) == 0 && chmod(d.sock, 0666) == 0);
	usleep(200000);
	rss0 = proc_status_kb(d.pid, "VmRSS");
	for (int i = 0; i < 6; i++) {
		c = kid_start(&k[i]);
		CU_ASSERT_FATAL(c >= 0);
		if (c == 0) {
			Kvpool__Request q = KVPOOL__REQUEST__INIT;
			Kvpool__StatusReq sq = KVPOOL__STATUS_REQ__INIT;
			uint8_t *one, batch[64 << 10];
			size_t len, n = 0;
			int fd;

			if (drop_to(OTHER_UID) < 0)
				_exit(90);
			fd = h_raw_connect(d.sock);
			if (fd < 0 || raw_hello(fd, "status-flood", 5000, NULL, 0) != 0)
				_exit(91);
			q.call_case = KVPOOL__REQUEST__CALL_STATUS;
			q.status = &sq;
			q.id = 7;
			if (kvp_frame_pack(&q.base, &one, &len) < 0)
				_exit(92);
			while (n + len <= sizeof(batch)) {
				memcpy(batch + n, one, len);
				n += len;
			}
			free(one);
			/* All six say Hello before any floods: a flood that filled the budget first
			 * would get a later Hello refused, as the late client's below is. */
			if (kid_report(&k[i], &r) < 0 || kid_wait_go(&k[i]) < 0)
				_exit(93);
			/* Writes until kvpoold stops reading; the parent kills it. */
			for (;;)
				if (send(fd, batch, n, MSG_NOSIGNAL) < 0)
					_exit(0);
		}
		CU_ASSERT_FATAL(kid_read(&k[i], &r, 10000) == 0);
	}
	for (int i = 0; i < 6; i++)
		CU_ASSERT_FATAL(write(k[i].go[1], "g", 1) == 1);
	usleep(3000000);
	rss1 = proc_status_kb(d.pid, "VmRSS");
	/* a late client of the same user: refused, typed; root: served */
	c = kid_start(&late);
	CU_ASSERT_FATAL(c >= 0);
	if (c == 0) {
		char what[48];
		int fd, code;

		if (drop_to(OTHER_UID) < 0)
			_exit(90);
		fd = h_raw_connect(d.sock);
		code = fd < 0 ? -1 : raw_hello(fd, "late", 5000, what, sizeof(what));
		_exit(code == KVP_E_LIMIT_EXCEEDED && strcmp(what, "buffer bytes") == 0 ? 0 : 1);
	}
	close(late.rep[0]);
	close(late.go[1]);
	late_status = h_wait_pid(late.pid, 10000);
	CU_ASSERT_EQUAL(late_status, 0);
	root = kvp_client_connect(d.sock, "root", &e);
	CU_ASSERT_PTR_NOT_NULL(root);
	root_ok = root && kvp_client_ping(root, &e) == 0;
	CU_ASSERT(root_ok);
	kvp_client_close(root);
	FIG("buffers: 6 clients pipelining Status without reading, buffer_budget 4 MiB: kvpoold RSS "
	    "%ld -> %ld kB (+%ld kB); a late non-admin client %s; root %s\n",
	    rss0, rss1, rss1 - rss0,
	    late_status == 0 ? "refused LIMIT_EXCEEDED buffer bytes" : "not refused",
	    root_ok ? "served" : "not served");
	RSS_BOUND(rss1 - rss0 < 16 * 1024);
	CU_ASSERT(metric(&d, "refused_buffers_total") >= 1);
	for (int i = 0; i < 6; i++) {
		kill(k[i].pid, SIGKILL);
		h_wait_pid(k[i].pid, 10000);
		close(k[i].rep[0]);
		close(k[i].go[1]);
	}
	CU_ASSERT_EQUAL(h_daemon_finish(&d), 0);
}

/* Four connections, each one 3 MiB request (a Hello with a 3 MiB name), kept open: once
 * served, their input buffers are given back (not 4 MiB held each for the connection's life). */
static void test_input_buffer_shrinks(void)
{
	static char name[3 << 20];
	struct daemon d;
	long rss0, rss1;
	int fd, fds[4];

	CU_ASSERT_FATAL(h_daemon_start(&d, "[daemon]\n" POOL_A, NULL) == 0);
	memset(name, 'n', sizeof(name) - 1);
	/* Two first on connections closed after them: kvpoold's receive buffers (4 MiB, shared
	 * by every connection) are all touched, and count before the figure is taken. */
	for (int i = 0; i < 2; i++) {
		fd = h_raw_connect(d.sock);
		CU_ASSERT_FATAL(fd >= 0);
		CU_ASSERT_EQUAL(raw_hello(fd, name, 10000, NULL, 0), 0);
		close(fd);
	}
	usleep(300000);
	rss0 = proc_status_kb(d.pid, "VmRSS");
	for (int i = 0; i < 4; i++) {
		fds[i] = h_raw_connect(d.sock);
		CU_ASSERT_FATAL(fds[i] >= 0);
		CU_ASSERT_EQUAL(raw_hello(fds[i], name, 10000, NULL, 0), 0);
	}
	usleep(300000);
	rss1 = proc_status_kb(d.pid, "VmRSS");
	FIG("input buffer: 4 open connections, one 3 MiB request each: kvpoold RSS %ld -> %ld kB "
	    "(+%ld kB) after they were served\n",
	    rss0, rss1, rss1 - rss0);
	RSS_BOUND(rss1 - rss0 < 2048);
	for (int i = 0; i < 4; i++)
		close(fds[i]);
	CU_ASSERT_EQUAL(h_daemon_finish(&d), 0);
}

/* ---- key floods ---- */

#define FLOOD_KEYS 1300000 /* one-byte keys: a frame of about 3.9 MB */
#define FLOOD_PINGS 200

static int send_all(int fd, const uint8_t *p, size_t n)
{
	while (n) {
		ssize_t w = send(fd, p, n, MSG_NOSIGNAL);

		if (w <= 0)
			return -1;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

/* One ExistsKeys of n one-byte keys in pool pool_id, packed as a frame. 0 or -1. */
static int exists_keys_frame(uint32_t pool_id, size_t n, uint64_t id, uint8_t **out, size_t *len)
{
	static uint8_t key = 'k';
	Kvpool__Request q = KVPOOL__REQUEST__INIT;
	Kvpool__ExistsKeysReq x = KVPOOL__EXISTS_KEYS_REQ__INIT;
	ProtobufCBinaryData *keys = malloc(n * sizeof(*keys));
	int rc;

	if (!keys)
		return -1;
	for (size_t i = 0; i < n; i++)
		keys[i] = (ProtobufCBinaryData){ 1, &key };
	x.pool_id = pool_id;
	x.n_keys = n;
	x.keys = keys;
	q.id = id;
	q.call_case = KVPOOL__REQUEST__CALL_EXISTS_KEYS;
	q.exists_keys = &x;
	rc = kvp_frame_pack(&q.base, out, len);
	free(keys);
	return rc < 0 ? -1 : 0;
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* A client sends ExistsKeys frames of 1.3 million one-byte keys, one after another, for about
 * two seconds; each is refused LIMIT_EXCEEDED "keys per call" (max_keys_per_call 65536) before
 * kvpoold unpacks its keys, so another session's Pings meanwhile keep a p50 under 10 ms and
 * kvpoold's peak RSS grows by the frame's input buffer only (unpacked, the keys took some
 * 150 MiB and each frame some 90 ms of the loop). The flooding connection stays usable. */
static void test_key_flood_refused_before_decoding(void)
{
	static char name[3 << 20];
	static uint64_t lat[FLOOD_PINGS];
	struct daemon d;
	struct kid k;
	struct report r = { 0 };
	struct kvp_error e;
	struct kvp_client *c2;
	long hwm0, hwm1;
	uint64_t p50 = UINT64_MAX, p90 = 0;
	int c, pings = 0, fd;

	CU_ASSERT_FATAL(h_daemon_start(&d, "[daemon]\n" POOL_A, NULL) == 0);
	CU_ASSERT_FATAL(chmod(d.dir, 0755) == 0 && chmod(d.sock, 0666) == 0);
	/* kvpoold's receive buffers (shared by every connection) touched before the figure */
	memset(name, 'n', sizeof(name) - 1);
	fd = h_raw_connect(d.sock);
	CU_ASSERT_FATAL(fd >= 0);
	CU_ASSERT_EQUAL(raw_hello(fd, name, 10000, NULL, 0), 0);
	close(fd);
	c = kid_start(&k);
	CU_ASSERT_FATAL(c >= 0);
	if (c == 0) {
		Kvpool__AttachReq at;
		Kvpool__Request q;
		Kvpool__Response *m;
		struct pollfd stop = { .fd = k.go[0], .events = POLLIN };
		uint8_t *flood, *small;
		size_t flen, slen;
		uint32_t pool_id;

		if (drop_to(OTHER_UID) < 0)
			_exit(90);
		fd = h_raw_connect(d.sock);
		if (fd < 0 || raw_hello(fd, "key-flood", 5000, NULL, 0) != 0)
			_exit(91);
		q = attach_req(&at, "a");
		if (h_raw_send_request(fd, &q) < 0 || !(m = h_raw_recv(fd, 5000)) || !m->attach)
			_exit(92);
		pool_id = m->attach->pool_id;
		kvpool__response__free_unpacked(m, NULL);
		if (exists_keys_frame(pool_id, FLOOD_KEYS, 77, &flood, &flen) < 0 ||
		    exists_keys_frame(pool_id, 4, 78, &small, &slen) < 0)
			_exit(93);
		if (kid_report(&k, &r) < 0 || kid_wait_go(&k) < 0)
			_exit(94);
		while (poll(&stop, 1, 0) == 0) {
			if (send_all(fd, flood, flen) < 0 || !(m = h_raw_recv(fd, 20000))) {
				r.closed = 1;
				break;
			}
			if (m->id == 77 && m->status &&
			    m->status->code == KVPOOL__CODE__LIMIT_EXCEEDED &&
			    m->status->detail_case == KVPOOL__STATUS__DETAIL_LIMIT &&
			    strcmp(m->status->limit->what, "keys per call") == 0 &&
			    m->status->limit->limit == 65536) {
				r.refused++;
			} else {
				r.other++;
				if (m->status && m->status->message)
					snprintf(r.what, sizeof(r.what), "%s", m->status->message);
			}
			kvpool__response__free_unpacked(m, NULL);
		}
		/* a call of four keys on the same connection: answered */
		if (!r.closed && send_all(fd, small, slen) == 0 && (m = h_raw_recv(fd, 5000))) {
			r.ok = m->id == 78 && (!m->status || !m->status->code) && m->exists_keys;
			kvpool__response__free_unpacked(m, NULL);
		}
		kid_report(&k, &r);
		kid_wait_go(&k);
		_exit(0);
	}
	CU_ASSERT_FATAL(kid_read(&k, &r, 20000) == 0);
	c2 = kvp_client_connect(d.sock, "pinger", &e);
	CU_ASSERT_FATAL(c2 != NULL);
	CU_ASSERT_EQUAL(kvp_client_ping(c2, &e), 0);
	usleep(200000);
	hwm0 = proc_status_kb(d.pid, "VmHWM");
	CU_ASSERT_FATAL(write(k.go[1], "g", 1) == 1);
	usleep(300000); /* the flood under way */
	for (; pings < FLOOD_PINGS; pings++) {
		uint64_t t0 = now_ns();

		if (kvp_client_ping(c2, &e) < 0)
			break;
		lat[pings] = now_ns() - t0;
		usleep(5000);
	}
	CU_ASSERT_FATAL(write(k.go[1], "g", 1) == 1);
	CU_ASSERT_FATAL(kid_read(&k, &r, 30000) == 0);
	hwm1 = proc_status_kb(d.pid, "VmHWM");
	CU_ASSERT_EQUAL(kid_finish(&k), 0);
	if (pings) {
		qsort(lat, (size_t)pings, sizeof(lat[0]), cmp_u64);
		p50 = lat[pings / 2];
		p90 = lat[pings * 9 / 10];
	}
	FIG("key flood: ExistsKeys of %d one-byte keys, %d refused, %d otherwise answered%s%s; "
	    "another session's Ping p50 %.2f ms, p90 %.2f ms over %d; kvpoold VmHWM %ld -> %ld kB "
	    "(+%ld kB)\n",
	    FLOOD_KEYS, r.refused, r.other, r.what[0] ? ": " : "", r.what, p50 / 1e6, p90 / 1e6,
	    pings, hwm0, hwm1, hwm1 - hwm0);
	CU_ASSERT_EQUAL(pings, FLOOD_PINGS);
	CU_ASSERT(r.refused >= 5);
	CU_ASSERT_EQUAL(r.other, 0);
	CU_ASSERT_EQUAL(r.closed, 0);
	CU_ASSERT_EQUAL(r.ok, 1);
	CU_ASSERT(p50 < 10000000);
	RSS_BOUND(hwm1 - hwm0 < 16 * 1024);
	kvp_client_close(c2);
	CU_ASSERT_EQUAL(h_daemon_finish(&d), 0);
}

/* ---- pipelining clients ---- */

#define PINGS 1000000

/* A client pipelines a million Pings from one process and reads the replies steadily (slower
 * than kvpoold answers, so kvpoold holds replies back for seconds) from another: every reply
 * arrives, in order, the connection stays open (neither "frame larger than the maximum" nor
 * the half-sent-frame deadline). */
static void test_pipelined_stream_served(void)
{
	struct daemon d;
	struct kid k;
	struct report r = { 0 };
	uint64_t t0, t1;
	int c;

	CU_ASSERT_FATAL(h_daemon_start(&d, "[daemon]\n" POOL_A, NULL) == 0);
	CU_ASSERT_FATAL(chmod(d.dir, 0755) == 0 && chmod(d.sock, 0666) == 0);
	t0 = h_now_ms();
	c = kid_start(&k);
	CU_ASSERT_FATAL(c >= 0);
	if (c == 0) {
		static uint8_t buf[1 << 16];
		size_t have = 0;
		uint64_t want = 100;
		pid_t writer;
		int fd;

		if (drop_to(OTHER_UID) < 0)
			_exit(90);
		fd = h_raw_connect(d.sock);
		if (fd < 0 || raw_hello(fd, "pipeliner", 5000, NULL, 0) != 0)
			_exit(91);
		writer = fork();
		if (writer == 0) {
			static uint8_t out[1 << 16];
			size_t n = 0;

			for (uint64_t i = 0; i < PINGS; i++) {
				Kvpool__Request q = KVPOOL__REQUEST__INIT;
				Kvpool__PingReq p = KVPOOL__PING_REQ__INIT;
				uint8_t *one;
				size_t len;

				p.nonce = i;
				q.id = 100 + i;
				q.call_case = KVPOOL__REQUEST__CALL_PING;
				q.ping = &p;
				if (kvp_frame_pack(&q.base, &one, &len) < 0)
					_exit(1);
				if (n + len > sizeof(out)) {
					if (send(fd, out, n, MSG_NOSIGNAL) != (ssize_t)n)
						_exit(2);
					n = 0;
				}
				memcpy(out + n, one, len);
				n += len;
				free(one);
			}
			if (n && send(fd, out, n, MSG_NOSIGNAL) != (ssize_t)n)
				_exit(2);
			_exit(0);
		}
		/* The reader: at most 64 KiB every 30 ms (about 2 MB/s, some 7 s for the lot):
		 * kvpoold's replies wait on it, its requests wait on kvpoold, for longer than the
		 * half-sent-frame deadline (5 s). */
		for (int reads = 0; want < 100 + PINGS; reads++) {
			ssize_t got;
			size_t off = 0;

			usleep(30000);
			got = recv(fd, buf + have, sizeof(buf) - have, 0);
			if (got <= 0) {
				r.closed = 1;
				break;
			}
			have += (size_t)got;
			while (have - off >= 4) {
				uint32_t len = (uint32_t)buf[off] | (uint32_t)buf[off + 1] << 8 |
					       (uint32_t)buf[off + 2] << 16 |
					       (uint32_t)buf[off + 3] << 24;
				Kvpool__Response *m;

				if (have - off - 4 < len)
					break;
				m = kvp_frame_decode_response(buf + off + 4, len);
				if (m && (!m->status || !m->status->code) && m->id == want)
					r.ok++;
				else
					r.other++;
				if (m)
					kvpool__response__free_unpacked(m, NULL);
				want++;
				off += 4 + len;
			}
			memmove(buf, buf + off, have - off);
			have -= off;
		}
		r.refused = h_wait_pid(writer, 30000);
		kid_report(&k, &r);
		_exit(0);
	}
	CU_ASSERT_FATAL(kid_read(&k, &r, 120000) == 0);
	t1 = h_now_ms();
	CU_ASSERT_EQUAL(h_wait_pid(k.pid, 10000), 0);
	close(k.rep[0]);
	close(k.go[1]);
	FIG("pipelining: %d Pings pipelined, replies read steadily: %d answered in order, %d wrong, "
	    "connection %s, in %lu ms\n",
	    PINGS, r.ok, r.other, r.closed ? "closed by kvpoold" : "kept",
	    (unsigned long)(t1 - t0));
	CU_ASSERT_EQUAL(r.ok, PINGS);
	CU_ASSERT_EQUAL(r.other, 0);
	CU_ASSERT_EQUAL(r.closed, 0);
	CU_ASSERT_EQUAL(r.refused, 0); /* the writer's status */
	CU_ASSERT(!h_log_contains(&d, "frame larger than the maximum"));
	CU_ASSERT(!h_log_contains(&d, "half-sent frame"));
	CU_ASSERT_EQUAL(h_daemon_finish(&d), 0);
}

/* Starts kvpoold with keepalive_ms 400 and a pool of 1,100,000 one-byte pages; a raw client
 * named name attaches and asks for 1,000,000 pages (a reply of about 4 MB). Its socket. */
static int send_big_alloc(struct daemon *d, const char *name)
{
	static const char conf[] =
		"[daemon]\nkeepalive_ms = 400\n"
		"[pool.tiny]\nlayers = 1\nkv_heads = 1\nhead_dim = 1\ndtype = fp8\n"
		"page_tokens = 1\ndevice = sim\ndevice_capacity = 1100000t\nhost_capacity = 0\n"
		"mlock = off\n";
	Kvpool__Request q;
	Kvpool__AllocReq a = KVPOOL__ALLOC_REQ__INIT;
	Kvpool__AttachReq at;
	Kvpool__Response *m;
	int fd;

	CU_ASSERT_FATAL(h_daemon_start(d, conf_of(conf), NULL) == 0);
	fd = h_raw_connect(d->sock);
	CU_ASSERT_FATAL(fd >= 0);
	CU_ASSERT_FATAL(raw_hello(fd, name, 5000, NULL, 0) == 0);
	q = attach_req(&at, "tiny");
	CU_ASSERT_FATAL(h_raw_send_request(fd, &q) == 0);
	m = h_raw_recv(fd, 5000);
	CU_ASSERT_FATAL(m && (!m->status || !m->status->code) && m->attach);
	a.pool_id = m->attach->pool_id;
	kvpool__response__free_unpacked(m, NULL);
	q = (Kvpool__Request)KVPOOL__REQUEST__INIT;
	a.tokens = 1000000;
	q.id = ++g_id;
	q.call_case = KVPOOL__REQUEST__CALL_ALLOC;
	q.alloc = &a;
	CU_ASSERT_FATAL(h_raw_send_request(fd, &q) == 0);
	return fd;
}

/* keepalive_ms 400, one reply of 3 MB read over about two seconds: the client is reading, so
 * the keep-alive does not reclaim it. */
static void test_keepalive_spares_a_reading_client(void)
{
	static uint8_t reply[4 << 20];
	Kvpool__Response *m;
	struct daemon d;
	size_t have = 0, need = 0;
	uint64_t t0, t1;
	size_t pages = 0;
	int fd, closed = 0;

	fd = send_big_alloc(&d, "slow-reader");
	t0 = h_now_ms();
	/* 32 KiB every 20 ms */
	while (!need || have < need) {
		ssize_t got;

		usleep(20000);
		got = recv(fd, reply + have,
			   need ? (need - have < (32u << 10) ? need - have : 32u << 10) : 4, 0);
		if (got <= 0) {
			closed = 1;
			break;
		}
		have += (size_t)got;
		if (!need && have >= 4)
			need = 4 + ((uint32_t)reply[0] | (uint32_t)reply[1] << 8 |
				    (uint32_t)reply[2] << 16 | (uint32_t)reply[3] << 24);
		if (need > sizeof(reply))
			break;
	}
	t1 = h_now_ms();
	if (!closed && need && have == need) {
		m = kvp_frame_decode_response(reply + 4, need - 4);
		if (m && (!m->status || !m->status->code) && m->alloc)
			pages = m->alloc->n_pages;
		if (m)
			kvpool__response__free_unpacked(m, NULL);
	}
	FIG("keepalive: keepalive_ms 400, a %zu-byte reply read over %lu ms: %s, %zu pages "
	    "received\n",
	    need, (unsigned long)(t1 - t0), closed ? "reclaimed mid-reply" : "kept", pages);
	CU_ASSERT_EQUAL(closed, 0);
	CU_ASSERT(t1 - t0 > 800);
	CU_ASSERT_EQUAL(pages, 1000000);
	CU_ASSERT(!h_log_contains(&d, "within keepalive_ms"));
	close(fd);
	CU_ASSERT_EQUAL(h_daemon_finish(&d), 0);
}

/* keepalive_ms 400, a 4 MB reply the client never reads: its process lives (a watched peer is
 * never reclaimed for being quiet), but a client that stopped reading is, and what it held
 * (the 1,000,000 pages the reply names) returns. */
static void test_keepalive_ends_a_client_that_stopped_reading(void)
{
	struct kvp_status st = { .struct_size = sizeof(st) };
	struct kvp_error e;
	struct kvp_client *c;
	struct daemon d;
	uint64_t t0, end, leased = UINT64_MAX;
	bool seen;
	int fd;

	fd = send_big_alloc(&d, "stopped-reading");
	t0 = h_now_ms();
	seen = h_wait_file_contains(d.log, "reclaimed: replies not read within keepalive_ms", 5000);
	CU_ASSERT(seen);
	CU_ASSERT(h_now_ms() - t0 >= 400);
	c = kvp_client_connect(d.sock, "probe", &e);
	end = h_now_ms() + 3000;
	while (c && h_now_ms() < end &&
	       (kvp_client_status(c, &st, &e) < 0 ||
		(leased = st.pools[0].tiers[KVP_TIER_DEVICE].leased_tokens) != 0))
		usleep(20000);
	CU_ASSERT_EQUAL(leased, 0);
	FIG("keepalive: keepalive_ms 400, a 4 MB reply never read: %s after %lu ms\n",
	    seen ? "reclaimed" : "kept", (unsigned long)(h_now_ms() - t0));
	kvp_client_close(c);
	close(fd);
	CU_ASSERT_EQUAL(h_daemon_finish(&d), 0);
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_fds_refused_before_limit),
		H_TEST(test_accept_backs_off_after_emfile),
		H_TEST(test_prehello_uid_and_admin_slots),
		H_TEST(test_attach_fds_in_flight_capped),
		H_TEST(test_buffer_budget_holds),
		H_TEST(test_input_buffer_shrinks),
		H_TEST(test_key_flood_refused_before_decoding),
		H_TEST(test_pipelined_stream_served),
		H_TEST(test_keepalive_spares_a_reading_client),
		H_TEST(test_keepalive_ends_a_client_that_stopped_reading),
	};

	if (getuid() != 0) {
		printf("test_admission: needs root (other users, fd limits, kvpoold as another "
		       "user)\n");
		return 77;
	}
	g_figures = getenv("KVP_FIGURES") != NULL;
	return H_RUN_SUITE("admission", NULL, NULL, tests);
}
