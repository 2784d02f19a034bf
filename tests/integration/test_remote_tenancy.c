/* test_remote_tenancy.c - Fetch cannot let one user hurt the others, against a real 3-master
 * Redis Cluster on loopback (redis_cluster.sh: KVP_REDIS_PORTS, KVP_REDIS_DIR). Every master is
 * stopped (SIGSTOP) while the Fetches run, so their reads stay in flight, and continued after.
 * The host pages a Fetch leases count in its session's quota: a session whose quota is 4 pages
 * cannot lease the host tier through Fetches in flight (those past the quota are refused
 * QUOTA_EXCEEDED). Deferred-reply tickets are bounded per
 * uid: 32 sessions of one user hold a quarter of them, and another user's Fetch still gets one.
 * Clients are raw connections in forked processes, dropping to uids 60001.. */
#include <CUnit/Basic.h>
#include <errno.h>
#include <grp.h>
#include <stdbool.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "kvpool.h"
#include "secret.h"

#define OTHER_UID 60001
#define THIRD_UID 60002

enum { PT = 4, HOST_PAGES = 512, QUOTA_PAGES = 4, FETCHES = 8, FETCH_PAGES = 8 };
/* kvpoold's deferred-reply tickets (daemon/defer.h): per session, per uid, in all. */
enum { PER_SESSION = 8, PER_UID = 64, ALL = 256, SESSIONS = ALL / PER_SESSION };

static char g_ports[3][8];
static const char *g_dir;
static uint64_t g_id = 1;

/* SIGSTOP (stop) or SIGCONT every master of the cluster. 0 or -1. */
static int masters_signal(int sig)
{
	char path[256];
	int rc = 0;

	for (int i = 0; i < 3; i++) {
		FILE *f;
		int pid = 0;

		snprintf(path, sizeof(path), "%s/%s/redis.pid", g_dir, g_ports[i]);
		f = fopen(path, "r");
		if (!f || fscanf(f, "%d", &pid) != 1 || pid <= 0 || kill(pid, sig) < 0)
			rc = -1;
		if (f)
			fclose(f);
	}
	return rc;
}

/* A host-only pool p of HOST_PAGES pages of PT tokens with the remote tier; quota_pages > 0: the
 * session quota. Reads stay in flight 20 s before they time out. */
static const char *conf(unsigned quota_pages)
{
	static char buf[1024];
	char quota[64] = "";

	if (quota_pages)
		snprintf(quota, sizeof(quota), "session_quota = %ut\n", quota_pages * PT);
	snprintf(buf, sizeof(buf),
		 "[daemon]\nsnapshot_interval_ms = 0\nmax_sessions = 128\n"
		 "max_sessions_per_uid = 0\n"
		 "[remote]\nseeds = 127.0.0.1:%s,127.0.0.1:%s,127.0.0.1:%s\n"
		 "connect_timeout_ms = 300\ncommand_timeout_ms = 20000\n"
		 "match_timeout_ms = 300\nmatch_max_pages = 64\nsecret = %s\n"
		 "[pool.p]\nlayers = 1\nkv_heads = 1\nhead_dim = 8\ndtype = fp16\n"
		 "page_tokens = %d\nhost_capacity = %dt\nmlock = off\nremote = spill\n%s",
		 g_ports[0], g_ports[1], g_ports[2], h_secret_src(), PT, HOST_PAGES * PT, quota);
	return buf;
}

static int drop_to(uid_t uid)
{
	return setgroups(0, NULL) < 0 || setresgid(uid, uid, uid) < 0 ||
			       setresuid(uid, uid, uid) < 0
		       ? -1
		       : 0;
}

/* A raw connection that said Hello and attached pool p; its pool id in *pool_id. -1 on
 * failure. */
static int raw_session(const char *sock, const char *name, uint32_t *pool_id)
{
	Kvpool__Request q = KVPOOL__REQUEST__INIT;
	Kvpool__HelloReq h = KVPOOL__HELLO_REQ__INIT;
	Kvpool__AttachReq a = KVPOOL__ATTACH_REQ__INIT;
	Kvpool__Response *r;
	int fd = h_raw_connect(sock), ok;

	if (fd < 0)
		return -1;
	h.protocol_version = KVP_PROTOCOL_VERSION;
	h.client_name = (char *)name;
	q.id = ++g_id;
	q.call_case = KVPOOL__REQUEST__CALL_HELLO;
	q.hello = &h;
	r = h_raw_send_request(fd, &q) == 0 ? h_raw_recv(fd, 5000) : NULL;
	ok = r && (!r->status || !r->status->code);
	if (r)
		kvpool__response__free_unpacked(r, NULL);
	a.pool = "p";
	q = (Kvpool__Request)KVPOOL__REQUEST__INIT;
	q.id = ++g_id;
	q.call_case = KVPOOL__REQUEST__CALL_ATTACH;
	q.attach = &a;
	r = ok && h_raw_send_request(fd, &q) == 0 ? h_raw_recv(fd, 5000) : NULL;
	ok = r && (!r->status || !r->status->code) && r->attach;
	if (ok)
		*pool_id = r->attach->pool_id;
	if (r)
		kvpool__response__free_unpacked(r, NULL);
	if (!ok) {
		close(fd);
		return -1;
	}
	return fd;
}

/* Sends a Fetch (id) of npages pages of prompt's tokens, none of them cached anywhere. */
static int send_fetch(int fd, uint32_t pool_id, uint64_t id, uint32_t prompt, uint32_t npages)
{
	Kvpool__Request q = KVPOOL__REQUEST__INIT;
	Kvpool__FetchReq f = KVPOOL__FETCH_REQ__INIT;
	uint32_t t[64 * PT];

	for (uint32_t i = 0; i < npages * PT; i++)
		t[i] = (prompt << 12) | i;
	f.pool_id = pool_id;
	f.tokens = t;
	f.n_tokens = npages * PT;
	q.id = id;
	q.call_case = KVPOOL__REQUEST__CALL_FETCH;
	q.fetch = &f;
	return h_raw_send_request(fd, &q);
}

/* Sends a Ping of id PING_ID: its answer follows those of the calls sent before it that are
 * answered at once (a deferred answer comes later). */
#define PING_ID 99
static int send_ping(int fd)
{
	Kvpool__Request q = KVPOOL__REQUEST__INIT;
	Kvpool__PingReq p = KVPOOL__PING_REQ__INIT;

	q.id = PING_ID;
	q.call_case = KVPOOL__REQUEST__CALL_PING;
	q.ping = &p;
	return h_raw_send_request(fd, &q);
}

/* The answer on fd within ms: its code (0: OK; PING for the Ping's), or -1 when none came;
 * the LimitDetail's what (or "quota" for a QuotaDetail) into what. */
#define PING 1000
static int answer(int fd, int ms, char *what, size_t wlen)
{
	Kvpool__Response *r = h_raw_recv(fd, ms);
	int code;

	what[0] = 0;
	if (!r)
		return -1;
	code = r->id == PING_ID ? PING : r->status ? (int)r->status->code : 0;
	if (r->status && r->status->detail_case == KVPOOL__STATUS__DETAIL_LIMIT &&
	    r->status->limit->what)
		snprintf(what, wlen, "%s", r->status->limit->what);
	if (r->status && r->status->detail_case == KVPOOL__STATUS__DETAIL_QUOTA)
		snprintf(what, wlen, "quota");
	kvpool__response__free_unpacked(r, NULL);
	return code;
}

/* Waits up to 20 s until every master says cluster_state:ok (after a stop, the masters mark
 * each other failing for a while). */
static bool cluster_ok(void)
{
	char cmd[256];

	for (int t = 0; t < 200; t++) {
		int ok = 1;

		for (int i = 0; i < 3 && ok; i++) {
			snprintf(
				cmd, sizeof(cmd),
				"redis-cli -p %s cluster info 2>/dev/null | grep -q cluster_state:ok",
				g_ports[i]);
			ok = system(cmd) == 0;
		}
		if (ok)
			return true;
		usleep(100000);
	}
	return false;
}

/* Sends Fetches while every master runs and waits for their answers: the cluster's slot map is
 * loaded and every connection up before the masters are stopped. */
static void cluster_warm(const struct daemon *d)
{
	uint32_t pool_id = 0;
	char what[48];
	int fd;

	CU_ASSERT_FATAL(cluster_ok());
	fd = raw_session(d->sock, "warm", &pool_id);
	CU_ASSERT_FATAL(fd >= 0);
	for (int i = 0; i < 3; i++) {
		CU_ASSERT_FATAL(send_fetch(fd, pool_id, ++g_id, 9000 + (uint32_t)i, 1) == 0);
		CU_ASSERT_EQUAL(answer(fd, 10000, what, sizeof(what)), 0);
	}
	close(fd);
}

/* A child's figures through a pipe. */
struct report {
	int deferred, refused, other, answered;
	int code;
	char what[48];
};

/* Reads fd's answers up to the Ping's (10 s each), counting in r the refusals of code want
 * that name limit (else r->other, with the last such code and what). Returns the answers read
 * before the Ping, -1 when one did not come. */
static int tally_until_ping(int fd, int want, const char *limit, struct report *r)
{
	char what[48];
	int code, n = 0;

	while ((code = answer(fd, 10000, what, sizeof(what))) != PING) {
		if (code < 0)
			return -1;
		n++;
		if (code == want && strcmp(what, limit) == 0) {
			r->refused++;
		} else {
			r->other++;
			r->code = code;
			snprintf(r->what, sizeof(r->what), "%s", what);
		}
	}
	return n;
}

/* Host pages leased in pool p now (Status, as root): Fetches' in flight included. */
static uint64_t host_leased_pages(const struct daemon *d)
{
	struct kvp_status st = { .struct_size = sizeof(st) };
	struct kvp_error e;
	struct kvp_client *c = kvp_client_connect(d->sock, "status", &e);
	uint64_t n = UINT64_MAX;

	if (c && kvp_client_status(c, &st, &e) == 0 && st.n_pools)
		n = st.pools[0].tiers[KVP_TIER_HOST].leased_tokens / PT;
	kvp_client_close(c);
	return n;
}

/* Session quota 4 pages. A session of uid 60001 sends 8 Fetches of 8 pages each while every
 * master is stopped: the first leases 4 host pages (as many as its quota leaves), the other 7
 * are refused at once QUOTA_EXCEEDED, and the host tier has 4 pages leased. Once the masters
 * run again the Fetch in flight answers, and its pages are free again. Before, the 8 Fetches
 * leased 64 pages whatever the quota (with a smaller host tier, all of it: other sessions got
 * OUT_OF_CAPACITY). */
static void test_fetch_leases_count_in_quota(void)
{
	static const char *const args[] = { NULL };
	struct daemon d;
	struct report r = { 0 };
	int rep[2], go[2], fd, code;
	uint32_t pool_id = 0;
	uint64_t leased, after;
	char what[48];
	pid_t pid;

	CU_ASSERT_FATAL(h_daemon_start(&d, conf(QUOTA_PAGES), args) == 0);
	CU_ASSERT_FATAL(chmod(d.dir, 0755) == 0 && chmod(d.sock, 0666) == 0);
	cluster_warm(&d);
	CU_ASSERT_FATAL(pipe(rep) == 0 && pipe(go) == 0);
	CU_ASSERT_FATAL(masters_signal(SIGSTOP) == 0);
	pid = fork();
	CU_ASSERT_FATAL(pid >= 0);
	if (pid == 0) {
		char b;

		close(rep[0]);
		close(go[1]);
		if (drop_to(OTHER_UID) < 0 || (fd = raw_session(d.sock, "fetcher", &pool_id)) < 0)
			_exit(90);
		for (int i = 0; i < FETCHES; i++)
			if (send_fetch(fd, pool_id, 100 + (uint64_t)i, (uint32_t)i, FETCH_PAGES) <
			    0)
				_exit(91);
		if (send_ping(fd) < 0)
			_exit(91);
		/* the refusals come at once; a Fetch in flight answers after the masters run */
		if (tally_until_ping(fd, KVP_E_QUOTA_EXCEEDED, "quota", &r) < 0)
			_exit(94);
		r.deferred = FETCHES - r.refused - r.other;
		if (write(rep[1], &r, sizeof(r)) != sizeof(r) || read(go[0], &b, 1) != 1)
			_exit(92);
		while (r.answered < r.deferred &&
		       (code = answer(fd, 15000, what, sizeof(what))) >= 0)
			r.answered += code == 0;
		if (write(rep[1], &r, sizeof(r)) != sizeof(r))
			_exit(93);
		_exit(0);
	}
	close(rep[1]);
	close(go[0]);
	CU_ASSERT_FATAL(read(rep[0], &r, sizeof(r)) == sizeof(r));
	leased = host_leased_pages(&d);
	CU_ASSERT_EQUAL(masters_signal(SIGCONT), 0);
	CU_ASSERT_FATAL(write(go[1], "g", 1) == 1);
	CU_ASSERT(read(rep[0], &r, sizeof(r)) == sizeof(r));
	CU_ASSERT_EQUAL(h_wait_pid(pid, 20000), 0);
	CU_ASSERT(cluster_ok());
	close(rep[0]);
	close(go[1]);
	after = host_leased_pages(&d);
	if (r.other || leased != QUOTA_PAGES)
		fprintf(stderr,
			"fetches: %d deferred, %d refused, %d other (code %d %s); %lu host "
			"pages leased\n",
			r.deferred, r.refused, r.other, r.code, r.what, (unsigned long)leased);
	CU_ASSERT_EQUAL(r.deferred, 1);
	CU_ASSERT_EQUAL(r.refused, FETCHES - 1);
	CU_ASSERT_EQUAL(r.other, 0);
	CU_ASSERT_EQUAL(r.answered, r.deferred);
	CU_ASSERT_EQUAL(leased, QUOTA_PAGES);
	CU_ASSERT_EQUAL(after, 0);
	CU_ASSERT_EQUAL(h_daemon_finish(&d), 0);
}

/* 32 sessions of uid 60001 each send 8 Fetches of a page while every master is stopped: the
 * uid holds 64 deferred-reply tickets, the others are refused LIMIT_EXCEEDED
 * "uid_pending_replies"; a Fetch of another user then gets a ticket (it is answered once the
 * masters run), not LIMIT_EXCEEDED "pending_replies". Before, the one uid held all 256. */
static void test_pending_replies_bounded_per_uid(void)
{
	static const char *const args[] = { NULL };
	struct daemon d;
	struct report r = { 0 };
	int rep[2], go[2], fd, code, early;
	uint32_t pool_id = 0;
	char what[48];
	pid_t pid;

	CU_ASSERT_FATAL(h_daemon_start(&d, conf(0), args) == 0);
	CU_ASSERT_FATAL(chmod(d.dir, 0755) == 0 && chmod(d.sock, 0666) == 0);
	cluster_warm(&d);
	CU_ASSERT_FATAL(pipe(rep) == 0 && pipe(go) == 0);
	CU_ASSERT_FATAL(masters_signal(SIGSTOP) == 0);
	pid = fork();
	CU_ASSERT_FATAL(pid >= 0);
	if (pid == 0) {
		int fds[SESSIONS], pending[SESSIONS];
		char b;

		close(rep[0]);
		close(go[1]);
		if (drop_to(OTHER_UID) < 0)
			_exit(90);
		for (int s = 0; s < SESSIONS; s++) {
			if ((fds[s] = raw_session(d.sock, "ticket-taker", &pool_id)) < 0)
				_exit(91);
			for (int i = 0; i < PER_SESSION; i++)
				if (send_fetch(fds[s], pool_id, 100 + (uint64_t)i,
					       (uint32_t)(s * PER_SESSION + i), 1) < 0)
					_exit(92);
			if (send_ping(fds[s]) < 0)
				_exit(92);
		}
		for (int s = 0; s < SESSIONS; s++) {
			int n = tally_until_ping(fds[s], KVP_E_LIMIT_EXCEEDED,
						 "uid_pending_replies", &r);

			if (n < 0)
				_exit(95);
			pending[s] = PER_SESSION - n;
		}
		r.deferred = ALL - r.refused - r.other;
		if (write(rep[1], &r, sizeof(r)) != sizeof(r) || read(go[0], &b, 1) != 1)
			_exit(93);
		for (int s = 0; s < SESSIONS; s++)
			for (; pending[s] > 0; pending[s]--)
				r.answered += answer(fds[s], 15000, what, sizeof(what)) == 0;
		if (write(rep[1], &r, sizeof(r)) != sizeof(r))
			_exit(94);
		_exit(0);
	}
	close(rep[1]);
	close(go[0]);
	CU_ASSERT_FATAL(read(rep[0], &r, sizeof(r)) == sizeof(r));
	/* another user's Fetch: in flight too (no answer while the masters are stopped) */
	fd = raw_session(d.sock, "other-user", &pool_id);
	CU_ASSERT_FATAL(fd >= 0);
	CU_ASSERT_FATAL(send_fetch(fd, pool_id, 7, 777, 1) == 0);
	early = answer(fd, 500, what, sizeof(what));
	if (early >= 0)
		fprintf(stderr, "the other user's Fetch answered %d (%s) at once\n", early, what);
	CU_ASSERT_EQUAL(masters_signal(SIGCONT), 0);
	code = early >= 0 ? early : answer(fd, 15000, what, sizeof(what));
	CU_ASSERT_FATAL(write(go[1], "g", 1) == 1);
	CU_ASSERT(read(rep[0], &r, sizeof(r)) == sizeof(r));
	CU_ASSERT_EQUAL(h_wait_pid(pid, 60000), 0);
	CU_ASSERT(cluster_ok());
	close(rep[0]);
	close(go[1]);
	close(fd);
	if (r.other)
		fprintf(stderr, "uid 60001: %d deferred, %d refused, %d other (code %d %s)\n",
			r.deferred, r.refused, r.other, r.code, r.what);
	CU_ASSERT_EQUAL(r.deferred, PER_UID);
	CU_ASSERT_EQUAL(r.refused, ALL - PER_UID);
	CU_ASSERT_EQUAL(r.other, 0);
	CU_ASSERT_EQUAL(r.answered, PER_UID);
	CU_ASSERT_EQUAL(early, -1);
	CU_ASSERT_EQUAL(code, 0);
	CU_ASSERT_EQUAL(h_daemon_finish(&d), 0);
}

/* Whatever happened, the masters run again. */
static int clean_suite(void)
{
	masters_signal(SIGCONT);
	return 0;
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_fetch_leases_count_in_quota),
		H_TEST(test_pending_replies_bounded_per_uid),
	};
	const char *ports = getenv("KVP_REDIS_PORTS");

	g_dir = getenv("KVP_REDIS_DIR");
	if (!ports || !g_dir ||
	    sscanf(ports, "%7[0-9],%7[0-9],%7[0-9]", g_ports[0], g_ports[1], g_ports[2]) != 3) {
		fprintf(stderr, "KVP_REDIS_PORTS not set: run through redis_cluster.sh\n");
		return 77;
	}
	if (geteuid() != 0) {
		fprintf(stderr, "skip: needs root (clients of other users)\n");
		return 77;
	}
	return H_RUN_SUITE("remote_tenancy", NULL, clean_suite, tests);
}
