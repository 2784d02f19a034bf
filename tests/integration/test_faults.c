/* test_faults.c - faults against a real kvpoold: clients SIGKILLed mid-cycle, a client that
 * pipelines without reading, session and lease limits, SIGTERM under load, a session whose
 * process exits while a forked child keeps its socket open, and injected allocation and
 * pidfd failures at every site kvpoold has (KVPOOLD_FAULTS). */
#include <CUnit/Basic.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "kvpool.h"
#include "kvpool_caps.h"

#define POOL                                                                                       \
	"[pool.small]\n"                                                                           \
	"layers = 2\nkv_heads = 2\nhead_dim = 16\ndtype = fp16\npage_tokens = 16\n"                \
	"device = sim\ndevice_capacity = 1024t\nhost_capacity = 512t\nmlock = off\n"

static unsigned g_faults;

static int status_of(const char *sock, struct kvp_status *st)
{
	struct kvp_error e;
	struct kvp_client *c = kvp_client_connect(sock, "probe", &e);
	int r;

	if (!c)
		return -1;
	kvp_client_set_timeout(c, 5000);
	st->struct_size = sizeof(*st);
	r = kvp_client_status(c, st, &e);
	kvp_client_close(c);
	return r;
}

/* Waits until no tier of any pool has leased tokens (the probe itself holds none). */
static bool all_returned(const char *sock, int ms, struct kvp_status *st)
{
	uint64_t end = h_now_ms() + (uint64_t)ms;

	do {
		bool clean = status_of(sock, st) == 0;

		for (uint32_t i = 0; clean && i < st->n_pools; i++)
			for (int t = 0; t < KVP_TIER_MAX; t++)
				clean &= st->pools[i].tiers[t].leased_tokens == 0;
		if (clean)
			return true;
		usleep(20000);
	} while (h_now_ms() < end);
	return false;
}

static const char *g_sock;

enum { CYCLERS = 8, CYCLES = 1000 };

/* One engine: CYCLES lease/insert/match/release cycles over a few shared sequences. */
static int cycler(void *arg)
{
	struct kvp_error e;
	struct kvp_client *c = kvp_client_connect(g_sock, "cycler", &e);
	struct kvp_pool *p = c ? kvp_pool_attach(c, "small", NULL, &e) : NULL;
	unsigned seed = (unsigned)getpid();

	(void)arg;
	if (!p)
		return 10;
	kvp_client_set_timeout(c, 5000);
	for (int i = 0; i < CYCLES; i++) {
		uint32_t fam = (uint32_t)rand_r(&seed) % 4, n = 1 + (uint32_t)rand_r(&seed) % 4;
		uint32_t tok[64], dev[8], host[8], pages[8];
		struct kvp_match_result m = { .struct_size = sizeof(m) };
		uint64_t lease;

		for (uint32_t k = 0; k < n * 16; k++)
			tok[k] = fam * 1000 + k;
		if (kvp_cache_match(p, 0, tok, n * 16, 1, &m, dev, host, 8, &e) < 0)
			continue;
		if (m.n_device + m.n_host < n &&
		    kvp_lease_alloc(p, KVP_TIER_DEVICE, n - m.n_device - m.n_host, &lease, pages,
				    &e) == 0) {
			kvp_cache_insert(p, lease, 0, tok, n * 16, m.n_device + m.n_host, pages,
					 n - m.n_device - m.n_host, NULL, &e);
			kvp_lease_free(p, lease, NULL, 0, &e);
		}
		if (i % 3 == 0 && kvp_lease_alloc(p, KVP_TIER_HOST, 2, &lease, pages, &e) == 0) {
			kvp_lease_extend(p, lease, 1, pages + 2, &e);
			kvp_lease_free(p, lease, pages, 1, &e);
			kvp_lease_free(p, lease, NULL, 0, &e);
		}
		if (m.lock_id)
			kvp_cache_release(p, m.lock_id, &e);
	}
	kvp_client_close(c);
	return 0;
}

static void test_sigkill_clients_mid_cycle_returns_pages(void)
{
	struct daemon d;
	struct kvp_status st = { .struct_size = sizeof(st) };
	unsigned killed = 0;

	CU_ASSERT_EQUAL_FATAL(h_daemon_start(&d, POOL, NULL), 0);
	g_sock = d.sock;
	srand(1234);
	for (int gen = 0; gen < 3; gen++) { /* started, then restarted twice */
		pid_t pids[CYCLERS];

		for (int i = 0; i < CYCLERS; i++) {
			pids[i] = fork();
			if (pids[i] == 0)
				_exit(cycler(NULL));
		}
		/* Kill each at a random point of its run (some may finish first). */
		for (int i = 0; i < CYCLERS; i++) {
			usleep((useconds_t)(rand() % 30000));
			if (waitpid(pids[i], NULL, WNOHANG) == pids[i]) {
				pids[i] = 0; /* finished first, reaped */
				continue;
			}
			if (kill(pids[i], SIGKILL) == 0)
				killed++;
		}
		for (int i = 0; i < CYCLERS; i++)
			if (pids[i])
				h_wait_pid(pids[i], 20000);
	}
	g_faults += killed;
	printf("\n    %u of %d cyclers SIGKILLed mid-run\n", killed, 3 * CYCLERS);
	CU_ASSERT(killed >= 12);
	CU_ASSERT(all_returned(d.sock, 5000, &st));
	for (int t = 0; t < KVP_TIER_MAX; t++) {
		const struct kvp_tier_status *x = &st.pools[0].tiers[t];

		CU_ASSERT_EQUAL(x->leased_tokens, 0);
		CU_ASSERT_EQUAL(x->protected_tokens, 0); /* every lock went with its session */
		CU_ASSERT_EQUAL(x->free_tokens + x->leased_tokens + x->cached_tokens,
				x->total_tokens);
	}
	CU_ASSERT(st.pools[0].tiers[KVP_TIER_DEVICE].cached_tokens > 0); /* the cycles cached */
	CU_ASSERT_EQUAL(st.sessions, 1);				 /* just the probe */
	CU_ASSERT_EQUAL(h_daemon_stop(&d), 0);
	h_daemon_cleanup(&d);
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static void test_pipelining_client_does_not_stall_others(void)
{
	struct daemon d;
	struct kvp_error e;
	struct kvp_client *c;
	uint64_t lat[200];
	int ok = 0;
	pid_t hog;
	int sync[2];

	CU_ASSERT_EQUAL_FATAL(h_daemon_start(&d, POOL, NULL), 0);
	CU_ASSERT_EQUAL_FATAL(pipe(sync), 0);
	hog = fork();
	if (hog == 0) {
		int fd = h_raw_connect(d.sock), sent = 0;
		Kvpool__Request q = KVPOOL__REQUEST__INIT;
		Kvpool__HelloReq h = KVPOOL__HELLO_REQ__INIT;
		Kvpool__PingReq p = KVPOOL__PING_REQ__INIT;
		struct timeval tv = { .tv_sec = 0, .tv_usec = 100000 };

		h.protocol_version = KVP_PROTOCOL_VERSION;
		q.call_case = KVPOOL__REQUEST__CALL_HELLO;
		q.hello = &h;
		q.id = 1;
		if (fd < 0 || h_raw_send_request(fd, &q) < 0)
			_exit(1);
		setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
		q.call_case = KVPOOL__REQUEST__CALL_PING;
		q.ping = &p;
		if (write(sync[1], "g", 1) != 1)
			_exit(2);
		for (uint64_t end = h_now_ms() + 8000; sent < 20000 && h_now_ms() < end;) {
			q.id = 2 + (uint64_t)sent;
			p.nonce = (uint64_t)sent;
			if (h_raw_send_request(fd, &q) == 0)
				sent++;
		}
		printf("\n    pipelining client sent %d pings without reading\n", sent);
		fflush(stdout);
		pause(); /* never reads */
		_exit(0);
	}
	{
		char ch;

		CU_ASSERT_EQUAL(read(sync[0], &ch, 1), 1);
	}
	usleep(200000);
	c = kvp_client_connect(d.sock, "bystander", &e);
	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	kvp_client_set_timeout(c, 5000);
	for (int i = 0; i < 200; i++) {
		uint64_t t0 = h_now_ms();

		if (kvp_client_ping(c, &e) == 0)
			ok++;
		lat[i] = h_now_ms() - t0;
	}
	qsort(lat, 200, sizeof(lat[0]), cmp_u64);
	printf("\n    bystander: %d/200 pings, p50 %lu ms, p99 %lu ms, max %lu ms\n", ok,
	       (unsigned long)lat[100], (unsigned long)lat[197], (unsigned long)lat[199]);
	CU_ASSERT_EQUAL(ok, 200);
	CU_ASSERT(lat[197] < 200);
	g_faults++;
	kvp_client_close(c);
	kill(hog, SIGKILL);
	waitpid(hog, NULL, 0);
	close(sync[0]);
	close(sync[1]);
	CU_ASSERT_EQUAL(h_daemon_stop(&d), 0);
	h_daemon_cleanup(&d);
}

static void test_limits_sessions_and_leases(void)
{
	struct daemon d;
	struct kvp_error e;
	struct kvp_client *c[5];
	struct kvp_pool *p;
	uint64_t lease;
	uint32_t page;
	int typed = 0, lost = 0;

	CU_ASSERT_EQUAL_FATAL(
		h_daemon_start(&d,
			       "[daemon]\nmax_sessions = 4\nmax_leases_per_session = 3\n"
			       "max_locks_per_session = 2\n" POOL,
			       NULL),
		0);
	for (int i = 0; i < 4; i++) {
		c[i] = kvp_client_connect(d.sock, "held", &e);
		CU_ASSERT_PTR_NOT_NULL_FATAL(c[i]);
	}
	/* The 5th is refused, typed, every time (the library reads the refusal even when the
	 * daemon closed before the Hello arrived). */
	for (int k = 0; k < 10; k++) {
		c[4] = kvp_client_connect(d.sock, "fifth", &e);
		CU_ASSERT_PTR_NULL(c[4]);
		kvp_client_close(c[4]);
		g_faults++;
		if (e.code == KVP_E_LIMIT_EXCEEDED) {
			typed++;
			CU_ASSERT_EQUAL(e.detail, KVP_DETAIL_LIMIT);
			CU_ASSERT_EQUAL(e.limit.limit, 4);
		} else if (e.code == KVP_E_TRANSPORT && e.sys_errno == EPIPE) {
			lost++;
		}
	}
	printf("\n    5th connect: %d typed LIMIT_EXCEEDED, %d lost to EPIPE\n", typed, lost);
	CU_ASSERT_EQUAL(typed, 10);
	CU_ASSERT_EQUAL(lost, 0);
	p = kvp_pool_attach(c[0], "small", NULL, &e);
	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	for (int i = 0; i < 3; i++)
		CU_ASSERT_EQUAL(kvp_lease_alloc(p, KVP_TIER_DEVICE, 1, &lease, &page, &e), 0);
	CU_ASSERT_EQUAL(kvp_lease_alloc(p, KVP_TIER_DEVICE, 1, &lease, &page, &e),
			-KVP_E_LIMIT_EXCEEDED);
	CU_ASSERT_EQUAL(e.code, KVP_E_LIMIT_EXCEEDED);
	CU_ASSERT_EQUAL(e.detail, KVP_DETAIL_LIMIT);
	CU_ASSERT_EQUAL(e.limit.limit, 3);
	CU_ASSERT_STRING_EQUAL(e.limit.what, "leases");
	g_faults++;
	/* Freeing one lets the next through. */
	CU_ASSERT_EQUAL(kvp_lease_free(p, lease, NULL, 0, &e),
			0); /* the 3rd; output untouched on failure */
	CU_ASSERT_EQUAL(kvp_lease_alloc(p, KVP_TIER_DEVICE, 1, &lease, &page, &e), 0);
	/* Locks: cache one page, then the third lock on it is refused. */
	{
		uint32_t tok[16], dev[2], host[2];
		struct kvp_match_result m = { .struct_size = sizeof(m) };

		for (uint32_t k = 0; k < 16; k++)
			tok[k] = 9000 + k;
		CU_ASSERT_EQUAL(kvp_cache_insert(p, lease, 0, tok, 16, 0, &page, 1, NULL, &e), 0);
		for (int k = 0; k < 2; k++) {
			CU_ASSERT_EQUAL(kvp_cache_match(p, 0, tok, 16, 1, &m, dev, host, 2, &e), 0);
			CU_ASSERT(m.lock_id != 0);
		}
		CU_ASSERT_EQUAL(kvp_cache_match(p, 0, tok, 16, 1, &m, dev, host, 2, &e),
				-KVP_E_LIMIT_EXCEEDED);
		CU_ASSERT_STRING_EQUAL(e.limit.what, "locks");
		CU_ASSERT_EQUAL(e.limit.limit, 2);
		CU_ASSERT_EQUAL(kvp_cache_match(p, 0, tok, 16, 0, &m, dev, host, 2, &e),
				0); /* unlocked ok */
		g_faults++;
	}
	for (int i = 0; i < 4; i++)
		kvp_client_close(c[i]);
	/* Sessions came back: a new client gets in. */
	{
		struct kvp_status st = { .struct_size = sizeof(st) };
		uint64_t end = h_now_ms() + 3000;
		int r = -1;

		while (r != 0 && h_now_ms() < end) {
			r = status_of(d.sock, &st);
			usleep(20000);
		}
		CU_ASSERT_EQUAL(r, 0);
	}
	CU_ASSERT_EQUAL(h_daemon_stop(&d), 0);
	h_daemon_cleanup(&d);
}

static int loader(void *arg)
{
	struct kvp_error e;
	struct kvp_client *c = kvp_client_connect(g_sock, "loader", &e);
	struct kvp_pool *p = c ? kvp_pool_attach(c, "small", NULL, &e) : NULL;
	uint32_t pages[2];
	uint64_t lease;

	(void)arg;
	if (!p)
		return 10;
	kvp_client_set_timeout(c, 5000);
	for (uint64_t end = h_now_ms() + 15000; h_now_ms() < end;) {
		int r = kvp_client_ping(c, &e);

		if (r == 0)
			r = kvp_lease_alloc(p, KVP_TIER_DEVICE, 2, &lease, pages, &e);
		if (r == 0)
			r = kvp_lease_free(p, lease, NULL, 0, &e) < 0 ? -e.code : 0;
		if (r == 0 || r == -KVP_E_OUT_OF_CAPACITY)
			continue;
		if (e.code == KVP_E_SHUTTING_DOWN)
			continue;
		if (e.code == KVP_E_TRANSPORT && e.sys_errno != EAGAIN)
			return 0; /* clean EOF: done */
		return 20 + e.code > 255 ? 255 : 20 + e.code;
	}
	return 30; /* never saw the end */
}

static void test_sigterm_under_load(void)
{
	struct daemon d;
	pid_t pids[4];

	CU_ASSERT_EQUAL_FATAL(h_daemon_start(&d, POOL, NULL), 0);
	g_sock = d.sock;
	for (int i = 0; i < 4; i++) {
		pids[i] = fork();
		if (pids[i] == 0)
			_exit(loader(NULL));
	}
	usleep(500000);
	CU_ASSERT_EQUAL(h_daemon_stop(&d), 0);
	g_faults++;
	for (int i = 0; i < 4; i++) {
		int r = h_wait_pid(pids[i], 10000);

		if (r)
			printf("\n    loader %d: %d\n", i, r);
		CU_ASSERT_EQUAL(r, 0);
	}
	h_daemon_cleanup(&d);
}

static void test_fork_inheritance_parent_exit_frees(void)
{
	struct daemon d;
	struct kvp_status st = { .struct_size = sizeof(st) };
	int pfd[2];
	pid_t a, b = 0;
	uint64_t t0;

	CU_ASSERT_EQUAL_FATAL(h_daemon_start(&d, POOL, NULL), 0);
	CU_ASSERT_EQUAL_FATAL(pipe(pfd), 0);
	a = fork();
	if (a == 0) {
		struct kvp_error e;
		struct kvp_client *c = kvp_client_connect(d.sock, "parent", &e);
		struct kvp_pool *p = c ? kvp_pool_attach(c, "small", NULL, &e) : NULL;
		uint32_t pages[4];
		uint64_t lease;
		pid_t kid;

		if (!p || kvp_lease_alloc(p, KVP_TIER_DEVICE, 4, &lease, pages, &e) < 0)
			_exit(1);
		kid = fork();
		if (kid == 0) {
			sleep(20); /* keeps the socket open */
			_exit(0);
		}
		if (write(pfd[1], &kid, sizeof(kid)) != sizeof(kid))
			_exit(2);
		_exit(0);
	}
	CU_ASSERT_EQUAL(read(pfd[0], &b, sizeof(b)), (ssize_t)sizeof(b));
	CU_ASSERT_EQUAL(h_wait_pid(a, 5000), 0);
	t0 = h_now_ms();
	g_faults++;
	CU_ASSERT(all_returned(d.sock, 3000, &st));
	printf("\n    leases of the exited parent returned after %lu ms (child still holds the fd)\n",
	       (unsigned long)(h_now_ms() - t0));
	CU_ASSERT(h_now_ms() - t0 <= 2500);
	CU_ASSERT(b > 0 && kill(b, 0) == 0); /* the child really was alive meanwhile */
	if (b > 0) {
		kill(b, SIGKILL);
		/* b is a's child, reparented: not ours to wait for. */
	}
	close(pfd[0]);
	close(pfd[1]);
	CU_ASSERT_EQUAL(h_daemon_stop(&d), 0);
	h_daemon_cleanup(&d);
}

/* Injected failures (KVPOOLD_FAULTS, daemon/base/fault.h): no peer gets a pidfd, every 13th reply
 * buffer and every 17th reply piece cannot be allocated (25 times each, then they can). Each
 * call answers, fails typed (INTERNAL) or finds its connection closed (TRANSPORT), and never
 * anything else; kvpoold keeps serving the next connection, every page comes back, and it
 * exits 0 (under ASan: no use-after-free, no leak). */
static void test_injected_failures_end_typed_or_closed(void)
{
	struct daemon d;
	struct kvp_status st = { .struct_size = sizeof(st) };
	unsigned ok = 0, internal = 0, closed = 0, other = 0;

	setenv("KVPOOLD_FAULTS", "pidfd:1,reply_queue:13:25,reply_alloc:17:25", 1);
	CU_ASSERT_EQUAL_FATAL(h_daemon_start(&d, POOL, NULL), 0);
	unsetenv("KVPOOLD_FAULTS");
	CU_ASSERT(h_log_contains(&d, "failure injection armed"));
	for (int round = 0; round < 60; round++) {
		struct kvp_error e;
		struct kvp_client *c = kvp_client_connect(d.sock, "faulty", &e);
		struct kvp_pool *p = c ? kvp_pool_attach(c, "small", NULL, &e) : NULL;
		int r = 0;

		for (int k = 0; p && k < 20 && r == 0; k++) {
			uint32_t pages[2];
			uint64_t lease;

			r = kvp_lease_alloc(p, KVP_TIER_DEVICE, 2, &lease, pages, &e) < 0 ? -1 : 0;
			if (r == 0) {
				ok++;
				r = kvp_lease_free(p, lease, NULL, 0, &e) < 0 ? -1 : 0;
			}
			if (r == 0) {
				ok++;
				r = kvp_client_ping(c, &e) < 0 ? -1 : 0;
			}
			if (r == 0)
				ok++;
			else if (e.code == KVP_E_INTERNAL)
				internal++, r = 0; /* typed: the connection goes on */
		}
		if (!c || !p || r) {
			if (e.code == KVP_E_INTERNAL)
				internal++;
			else if (e.code == KVP_E_TRANSPORT)
				closed++;
			else
				other++, printf("\n    unexpected: code %d: %s\n", e.code,
						e.message);
		}
		kvp_client_close(c);
	}
	printf("\n    injected: %u calls answered, %u INTERNAL, %u connections closed\n", ok,
	       internal, closed);
	g_faults += internal + closed;
	CU_ASSERT(ok > 100);
	CU_ASSERT(internal > 0);
	CU_ASSERT(closed > 0);
	CU_ASSERT_EQUAL(other, 0);
	CU_ASSERT(all_returned(d.sock, 5000, &st));
	CU_ASSERT_EQUAL(h_daemon_stop(&d), 0);
	h_daemon_cleanup(&d);
}

/* One outcome of a call under injected failures; false ends the connection's round. */
struct tally {
	unsigned ok, internal, capacity, closed, other;
};

static bool count(struct tally *t, int r, const struct kvp_error *e)
{
	if (r >= 0) {
		t->ok++;
		return true;
	}
	switch (e->code) {
	case KVP_E_INTERNAL:
		t->internal++; /* typed; when it had id 0 the next call finds the socket closed */
		return true;
	case KVP_E_OUT_OF_CAPACITY:
		t->capacity++; /* pressure: the unit tests cover it, here it is just allowed */
		return true;
	case KVP_E_TRANSPORT: t->closed++; return false;
	default:
		t->other++;
		printf("\n    unexpected: code %d: %s\n", e->code, e->message);
		return false;
	}
}

#define BIG_MATCH 20000 /* tokens: 80 KB decoded, beyond kvpoold's 64 KiB decode arena */

/* A request as an engine makes it: match (locked) the longest cached prefix of a family's
 * system prompt plus a turn, promote a host continuation, lease and publish the rest, end
 * the lease, release the lock; every 5th step also one match too big for the decode arena.
 * False when the connection ended. */
static bool engine_step(struct kvp_pool *p, unsigned step, struct tally *t)
{
	static uint32_t big[BIG_MATCH], dev[BIG_MATCH / 16], host[BIG_MATCH / 16];
	uint32_t tok[96], lease_pages[6];
	struct kvp_match_result m = { .struct_size = sizeof(m) };
	struct kvp_error e;
	uint64_t lease = 0;
	bool alive;
	int r;

	for (uint32_t i = 0; i < 96; i++)
		tok[i] = i < 64 ? 100 + (step % 5) * 1000 + i : 900000 + step * 32 + i;
	r = kvp_cache_match(p, 0, tok, 96, 1, &m, dev, host, 6, &e);
	alive = count(t, r, &e);
	if (alive && r == 0 && m.n_host)
		alive = count(t, kvp_cache_load(p, m.lock_id, dev, 6, &e), &e);
	if (alive && r == 0 && m.n_device < 6) {
		uint32_t n = 6 - m.n_device;

		r = kvp_lease_alloc(p, KVP_TIER_DEVICE, n, &lease, lease_pages, &e);
		alive = count(t, r, &e);
		if (alive && r == 0)
			alive = count(t,
				      kvp_cache_insert(p, lease, 0, tok, 96, m.n_device,
						       lease_pages, n, NULL, &e),
				      &e);
		if (alive && r == 0)
			alive = count(t, kvp_lease_free(p, lease, NULL, 0, &e), &e);
	}
	if (alive && m.lock_id)
		alive = count(t, kvp_cache_release(p, m.lock_id, &e), &e);
	if (alive && step % 5 == 4) {
		for (uint32_t i = 0; i < BIG_MATCH; i++)
			big[i] = i < 64 ? 100 + i : 7000000 + i;
		alive = count(t,
			      kvp_cache_match(p, 0, big, BIG_MATCH, 0, &m, dev, host,
					      BIG_MATCH / 16, &e),
			      &e);
	}
	return alive;
}

/* Injected allocation failures at every site of the request path (KVPOOLD_FAULTS): accepted
 * connections, sessions, input buffers, decode spills, leases, lease and lock tables, locks,
 * prefix-tree memory. Every call ends OK, typed INTERNAL (or OUT_OF_CAPACITY under
 * pressure), or finds its connection closed after a typed status. kvpoold checks after each
 * session's end, while armed, that every page is free, leased or cached and the tree is
 * consistent (it aborts otherwise), and again at exit (status 70 otherwise). */
static void test_injected_allocation_failures_keep_the_books(void)
{
	static const char *const sites[] = { "conn",  "session", "input", "decode",
					     "lease", "idmap",	 "lock",  "prefix" };
	struct tally t = { 0 };
	struct daemon d;
	struct kvp_status st = { .struct_size = sizeof(st) };
	unsigned step = 0, refused = 0;

	setenv("KVPOOLD_FAULTS",
	       "conn:7:4,session:5:4,input:53:6,decode:2:4,lease:11:25,idmap:3:12,lock:7:25,"
	       "prefix:17:40",
	       1);
	CU_ASSERT_EQUAL_FATAL(h_daemon_start(&d, POOL, NULL), 0);
	unsetenv("KVPOOLD_FAULTS");
	for (int round = 0; round < 80; round++) {
		struct kvp_error e;
		struct kvp_client *c = kvp_client_connect(d.sock, "faulty", &e);
		struct kvp_pool *p = c ? kvp_pool_attach(c, "small", NULL, &e) : NULL;

		if (!c && e.code == KVP_E_INTERNAL) {
			refused++; /* typed refusal of the connection or its session */
			continue;
		}
		if (!p && !count(&t, -1, &e)) {
			kvp_client_close(c);
			continue;
		}
		for (int k = 0; p && k < 12 && engine_step(p, step, &t); k++)
			step++;
		kvp_client_close(c);
	}
	printf("\n    injected: %u calls answered, %u INTERNAL, %u OUT_OF_CAPACITY, %u closed, "
	       "%u connections refused\n",
	       t.ok, t.internal, t.capacity, t.closed, refused);
	g_faults += t.internal + t.closed + refused;
	for (size_t i = 0; i < sizeof(sites) / sizeof(sites[0]); i++) {
		char what[64];

		snprintf(what, sizeof(what), "failure injection: %s fails", sites[i]);
		if (!h_log_contains(&d, what))
			printf("\n    site %s never failed\n", sites[i]);
		CU_ASSERT(h_log_contains(&d, what));
	}
	CU_ASSERT(t.ok > 300);
	CU_ASSERT(t.internal > 0);
	CU_ASSERT(t.closed > 0);
	CU_ASSERT(refused > 0);
	CU_ASSERT_EQUAL(t.other, 0);
	CU_ASSERT(all_returned(d.sock, 5000, &st));
	CU_ASSERT(!h_log_contains(&d, "do not balance"));
	CU_ASSERT_EQUAL(h_daemon_stop(&d), 0); /* 70 if the books were off at exit */
	h_daemon_cleanup(&d);
}

/* A session's pressure notice that cannot be queued while an Alloc is evicting
 * (KVPOOLD_FAULTS notice: the first two fail): the notices go out right after the allocation,
 * before its reply, while its connection is still served: closing there would destroy the
 * session still in use. Both subscribers'
 * connections close once the Alloc is done (the caller's Alloc finds its connection closed,
 * the other's next call too); kvpoold keeps serving, every page comes back and it exits 0
 * (under ASan: no use-after-free). */
static void test_notice_that_cannot_be_queued_mid_alloc(void)
{
	static const char conf[] = "[pool.small]\nlayers = 2\nkv_heads = 2\nhead_dim = 16\n"
				   "dtype = fp16\npage_tokens = 16\ndevice = sim\n"
				   "device_capacity = 1024t\nhost_capacity = 512t\nmlock = off\n"
				   "pressure_watermark = 25%\npressure_interval_ms = 0\n";
	struct kvp_client_opts o = { .struct_size = sizeof(o),
				     .name = "listener",
				     .capabilities = KVP_CAP_ALL,
				     .flags = KVP_CLIENT_F_PRESSURE };
	struct kvp_status st = { .struct_size = sizeof(st) };
	uint32_t tok[40 * 16], pages[40];
	struct kvp_client *a, *b, *c;
	struct kvp_pool *pa, *pb;
	struct kvp_error e;
	struct daemon d;
	uint64_t id, fresh = 0;

	setenv("KVPOOLD_FAULTS", "notice:1:2", 1);
	CU_ASSERT_EQUAL_FATAL(h_daemon_start(&d, conf, NULL), 0);
	unsetenv("KVPOOLD_FAULTS");
	a = kvp_client_connect_opts(d.sock, &o, &e);
	b = kvp_client_connect_opts(d.sock, &o, &e);
	pa = a ? kvp_pool_attach(a, "small", NULL, &e) : NULL;
	pb = b ? kvp_pool_attach(b, "small", NULL, &e) : NULL;
	CU_ASSERT_FATAL(pa && pb);
	CU_ASSERT_EQUAL(kvp_pool_pressure_notices(pa), 1);
	CU_ASSERT_EQUAL(kvp_pool_pressure_notices(pb), 1);
	kvp_client_set_timeout(a, 5000);
	kvp_client_set_timeout(b, 5000);
	/* 40 of the 64 device pages cached, 24 free: above the watermark (16) */
	for (uint32_t i = 0; i < 40 * 16; i++)
		tok[i] = 7000 + i;
	CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc(pa, KVP_TIER_DEVICE, 40, &id, pages, &e), 0);
	CU_ASSERT_EQUAL(kvp_cache_insert(pa, id, 0, tok, 40 * 16, 0, pages, 40, &fresh, &e), 0);
	CU_ASSERT_EQUAL(fresh, 40u * 16);
	CU_ASSERT(kvp_lease_free(pa, id, NULL, 0, &e) >= 0);
	/* 30 pages: 6 evicted, the tier under pressure first, both notices fail */
	CU_ASSERT_EQUAL(kvp_lease_alloc(pa, KVP_TIER_DEVICE, 30, &id, pages, &e), -KVP_E_TRANSPORT);
	CU_ASSERT_EQUAL(kvp_client_ping(b, &e), -KVP_E_TRANSPORT);
	kvp_client_close(a);
	kvp_client_close(b);
	c = kvp_client_connect(d.sock, "after", &e);
	CU_ASSERT_PTR_NOT_NULL(c);
	CU_ASSERT(c && kvp_client_ping(c, &e) == 0);
	kvp_client_close(c);
	CU_ASSERT(all_returned(d.sock, 5000, &st));
	CU_ASSERT(h_log_contains(&d, "failure injection: notice fails"));
	CU_ASSERT(h_log_contains(&d, "out of memory queueing a reply"));
	CU_ASSERT_EQUAL(h_daemon_stop(&d), 0); /* killed by ASan or 70 (books off) otherwise */
	h_daemon_cleanup(&d);
	g_faults += 2;
}

static void test_zz_report(void)
{
	printf("\n    faults injected: %u\n", g_faults);
	CU_ASSERT(g_faults > 20);
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_sigkill_clients_mid_cycle_returns_pages),
		H_TEST(test_pipelining_client_does_not_stall_others),
		H_TEST(test_limits_sessions_and_leases),
		H_TEST(test_sigterm_under_load),
		H_TEST(test_fork_inheritance_parent_exit_frees),
		H_TEST(test_injected_failures_end_typed_or_closed),
		H_TEST(test_injected_allocation_failures_keep_the_books),
		H_TEST(test_notice_that_cannot_be_queued_mid_alloc),
		H_TEST(test_zz_report),
	};

	return H_RUN_SUITE("faults", NULL, NULL, tests);
}
