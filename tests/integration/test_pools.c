/* test_pools.c - pools against a real kvpoold: shared pages across processes, typed capacity,
 * quota and geometry errors, reclaim on kill -9, idle sessions kept while their process lives
 * (keep-alive only where its exit is not watched), foreign leases, seals, and the
 * host budget refusal at start-up. */
#include <CUnit/Basic.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "kvpool.h"

/* 64 device pages and 32 host pages of 16 tokens; quota on a second pool. */
static const char *const g_conf =
	"[daemon]\n"
	"keepalive_ms = 1500\n"
	"[pool.small]\n"
	"layers = 2\nkv_heads = 2\nhead_dim = 16\ndtype = fp16\npage_tokens = 16\n"
	"device = sim\ndevice_capacity = 1024t\nhost_capacity = 512t\nmlock = off\n"
	"[pool.quota]\n"
	"layers = 1\nkv_heads = 1\nhead_dim = 8\ndtype = fp32\npage_tokens = 8\n"
	"device = sim\ndevice_capacity = 800t\nhost_capacity = 0\nsession_quota = 64\n"
	"mlock = off\n";

static struct daemon g_d;

static int init_suite(void)
{
	return h_daemon_start(&g_d, g_conf, NULL);
}

static int clean_suite(void)
{
	return h_daemon_finish(&g_d);
}

static struct kvp_client *conn(const char *name)
{
	struct kvp_error e;

	return kvp_client_connect(g_d.sock, name, &e);
}

static uint64_t tier_leased(int tier)
{
	struct kvp_error e;
	struct kvp_status st = { .struct_size = sizeof(st) };
	struct kvp_client *c = conn("probe");
	uint64_t v = UINT64_MAX;

	if (c && kvp_client_status(c, &st, &e) == 0)
		v = st.pools[0].tiers[tier].leased_tokens;
	kvp_client_close(c);
	return v;
}

/* Run leases: consecutive pages from a multiple of the alignment (past a busy page), booked as
 * leased, OUT_OF_CAPACITY naming the run when the free pages hold none, back at the session's
 * end; align 0 refused before a call. */
static void test_kvp_lease_alloc_run(void)
{
	struct kvp_error e;
	struct kvp_client *c = conn("run"), *c2 = conn("run2");
	uint64_t one, run, run2, before = tier_leased(KVP_TIER_DEVICE);
	uint32_t page, first = 99, first2;
	struct kvp_pool *p, *p2;

	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	CU_ASSERT_PTR_NOT_NULL_FATAL(c2);
	p = kvp_pool_attach(c, "small", NULL, &e);
	p2 = kvp_pool_attach(c2, "small", NULL, &e);
	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	CU_ASSERT_PTR_NOT_NULL_FATAL(p2);
	/* page 0 busy: a run of 8 aligned to 8 starts at 8 */
	CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc(p, KVP_TIER_DEVICE, 1, &one, &page, &e), 0);
	CU_ASSERT_EQUAL(page, 0);
	CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc_run(p, KVP_TIER_DEVICE, 8, 8, &run, &first, &e), 0);
	CU_ASSERT_EQUAL(first, 8);
	CU_ASSERT_EQUAL(tier_leased(KVP_TIER_DEVICE), before + 9 * 16);
	/* another session's run of 40 aligned to 4: pages 16..55 (1..7 too short, 8..15 taken) */
	CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc_run(p2, KVP_TIER_DEVICE, 40, 4, &run2, &first2, &e),
			      0);
	CU_ASSERT_EQUAL(first2, 16);
	/* 64 pages: 1..7 and 56..63 free, no run of 9 */
	first = 77;
	CU_ASSERT_EQUAL(kvp_lease_alloc_run(p, KVP_TIER_DEVICE, 9, 1, &run, &first, &e),
			-KVP_E_OUT_OF_CAPACITY);
	CU_ASSERT_EQUAL(e.code, KVP_E_OUT_OF_CAPACITY);
	CU_ASSERT_PTR_NOT_NULL(strstr(e.message, "no run of 9 free consecutive pages"));
	CU_ASSERT_EQUAL(first, 77);
	CU_ASSERT_EQUAL(kvp_lease_alloc_run(p, KVP_TIER_DEVICE, 8, 0, &run, &first, &e),
			-KVP_E_INVALID_ARGUMENT);
	/* a run of the host tier too, and its free */
	CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc_run(p, KVP_TIER_HOST, 4, 2, &one, &first, &e), 0);
	CU_ASSERT_EQUAL(first % 2, 0);
	CU_ASSERT_EQUAL(kvp_lease_free(p, one, NULL, 0, &e), 0);
	/* the second session ends: its run is free again */
	kvp_client_close(c2);
	CU_ASSERT_EQUAL(tier_leased(KVP_TIER_DEVICE), before + 9 * 16);
	kvp_client_close(c);
	CU_ASSERT_EQUAL(tier_leased(KVP_TIER_DEVICE), before);
}

static void test_attach_geometry_and_backend(void)
{
	struct kvp_error e;
	struct kvp_client *c = conn("geo");
	struct kvp_geometry g;
	struct kvp_pool *p;

	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	p = kvp_pool_attach(c, "small", NULL, &e);
	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	kvp_pool_geometry(p, &g);
	CU_ASSERT_EQUAL(g.layers, 2);
	CU_ASSERT_EQUAL(g.page_tokens, 16);
	CU_ASSERT_EQUAL(g.dtype, KVP_DTYPE_FP16);
	CU_ASSERT_EQUAL(kvp_pool_tier_pages(p, KVP_TIER_DEVICE), 64);
	CU_ASSERT_EQUAL(kvp_pool_tier_pages(p, KVP_TIER_HOST), 32);
	CU_ASSERT_EQUAL(kvp_pool_tier_backend(p, KVP_TIER_DEVICE), KVP_BACKEND_SIM);
	CU_ASSERT_EQUAL(kvp_pool_tier_backend(p, KVP_TIER_HOST), KVP_BACKEND_MEMFD);
	CU_ASSERT_EQUAL(kvp_pool_tier_cuda_device(p, KVP_TIER_DEVICE), -1); /* sim: no GPU */
	CU_ASSERT_EQUAL(kvp_pool_tier_cuda_device(p, KVP_TIER_HOST), -1);
	CU_ASSERT_EQUAL(kvp_pool_row_bytes(p), 2 * 16 * 2);
	CU_ASSERT_EQUAL(kvp_pool_page_bytes(p), 2 * 2 * 16 * 64);
	CU_ASSERT_PTR_NOT_NULL(kvp_pool_tier_base(p, KVP_TIER_DEVICE));
	/* layer-first device layout, page-first host layout */
	CU_ASSERT_EQUAL(kvp_pool_slot_offset(p, KVP_TIER_DEVICE, 1, 1, 3, 5),
			((1 * 2 + 1) * (64 * 16) + 3 * 16 + 5) * 64);
	CU_ASSERT_EQUAL(kvp_pool_slot_offset(p, KVP_TIER_HOST, 1, 0, 3, 5),
			(((3 * 2 + 1) * 2 + 0) * 16 + 5) * 64);
	CU_ASSERT_EQUAL(kvp_pool_slot_offset(p, KVP_TIER_DEVICE, 2, 0, 0, 0), UINT64_MAX);
	kvp_client_close(c);
}

static void test_attach_errors_are_typed(void)
{
	struct kvp_error e;
	struct kvp_client *c = conn("err");
	struct kvp_geometry want = { .layers = 32, .page_tokens = 16 };

	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	CU_ASSERT_PTR_NULL(kvp_pool_attach(c, "nope", NULL, &e));
	CU_ASSERT_EQUAL(e.code, KVP_E_NO_SUCH_POOL);
	CU_ASSERT_PTR_NULL(kvp_pool_attach(c, "small", &want, &e));
	CU_ASSERT_EQUAL(e.code, KVP_E_GEOMETRY_MISMATCH);
	CU_ASSERT_EQUAL(e.detail, KVP_DETAIL_GEOMETRY);
	CU_ASSERT_EQUAL(e.geometry.expected.layers, 32);
	CU_ASSERT_EQUAL(e.geometry.actual.layers, 2);
	kvp_client_close(c);
}

/* Child: attaches, writes a pattern into a leased page, reports the page via a pipe, waits. */
static int g_pipe[2], g_back[2];

static int writer(void *arg)
{
	struct kvp_error e;
	struct kvp_client *c = conn("writer");
	struct kvp_pool *p = c ? kvp_pool_attach(c, "small", NULL, &e) : NULL;
	uint32_t page;
	uint64_t lease;
	char done;

	(void)arg;
	if (!p || kvp_lease_alloc(p, KVP_TIER_DEVICE, 1, &lease, &page, &e) < 0)
		return 30;
	for (uint32_t l = 0; l < 2; l++)
		for (uint32_t kv = 0; kv < 2; kv++)
			for (uint32_t t = 0; t < 16; t++)
				memset(kvp_pool_slot_addr(p, KVP_TIER_DEVICE, l, kv, page, t),
				       (int)(0x10 + l * 4 + kv * 2 + (t & 1)), 64);
	if (write(g_pipe[1], &page, sizeof(page)) != sizeof(page))
		return 31;
	if (read(g_back[0], &done, 1) != 1 || done != 'k')
		return 32; /* the reader saw it */
	/* And the reader's write is visible here. */
	if (*(uint8_t *)kvp_pool_slot_addr(p, KVP_TIER_DEVICE, 1, 1, page, 15) != 0xee)
		return 33;
	kvp_client_close(c);
	return 0;
}

static void test_two_clients_share_bytes(void)
{
	struct kvp_error e;
	struct kvp_client *c = conn("reader");
	struct kvp_pool *p;
	pid_t pid;
	uint32_t page;
	int st, ok = 1;

	CU_ASSERT_FATAL(pipe(g_pipe) == 0 && pipe(g_back) == 0);
	pid = fork();
	if (pid == 0)
		_exit(writer(NULL));
	p = kvp_pool_attach(c, "small", NULL, &e);
	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	CU_ASSERT_EQUAL_FATAL(read(g_pipe[0], &page, sizeof(page)), sizeof(page));
	for (uint32_t l = 0; l < 2; l++)
		for (uint32_t kv = 0; kv < 2; kv++)
			for (uint32_t t = 0; t < 16; t++) {
				uint8_t *a = kvp_pool_slot_addr(p, KVP_TIER_DEVICE, l, kv, page, t);

				for (int i = 0; i < 64; i++)
					ok &= a[i] == (uint8_t)(0x10 + l * 4 + kv * 2 + (t & 1));
			}
	CU_ASSERT(ok);
	memset(kvp_pool_slot_addr(p, KVP_TIER_DEVICE, 1, 1, page, 15), 0xee, 64);
	CU_ASSERT_EQUAL(write(g_back[1], "k", 1), 1);
	CU_ASSERT_EQUAL(waitpid(pid, &st, 0), pid);
	CU_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	kvp_client_close(c);
	for (int i = 0; i < 2; i++)
		close(g_pipe[i]), close(g_back[i]);
}

static void test_exhaustion_is_out_of_capacity_with_numbers(void)
{
	struct kvp_error e;
	struct kvp_client *c = conn("hog");
	struct kvp_pool *p = kvp_pool_attach(c, "small", NULL, &e);
	uint32_t pages[64];
	uint64_t lease, lease2;

	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc(p, KVP_TIER_DEVICE, 60, &lease, pages, &e), 0);
	CU_ASSERT_EQUAL(kvp_lease_alloc(p, KVP_TIER_DEVICE, 5, &lease2, pages, &e),
			-KVP_E_OUT_OF_CAPACITY);
	CU_ASSERT_EQUAL(e.code, KVP_E_OUT_OF_CAPACITY);
	CU_ASSERT_EQUAL(e.detail, KVP_DETAIL_CAPACITY);
	CU_ASSERT_EQUAL(e.capacity.tier, KVP_TIER_DEVICE);
	CU_ASSERT_EQUAL(e.capacity.requested_tokens, 80);
	CU_ASSERT_EQUAL(e.capacity.free_tokens, 64);
	CU_ASSERT_EQUAL(e.capacity.evictable_tokens, 0);
	CU_ASSERT_EQUAL(e.capacity.protected_tokens, 0);
	CU_ASSERT_EQUAL(e.capacity.leased_tokens, 960);
	CU_ASSERT_EQUAL(e.capacity.total_tokens, 1024);
	CU_ASSERT_PTR_NOT_NULL(strstr(e.message, "asked for 80 tokens"));
	/* Exactly what is free still works; one more page does not. */
	CU_ASSERT_EQUAL(kvp_lease_alloc(p, KVP_TIER_DEVICE, 4, &lease2, pages, &e), 0);
	CU_ASSERT_EQUAL(kvp_lease_extend(p, lease2, 1, pages, &e), -KVP_E_OUT_OF_CAPACITY);
	/* Absurd and zero sizes are typed too. */
	CU_ASSERT_EQUAL(kvp_lease_alloc(p, KVP_TIER_DEVICE, 0, &lease2, pages, &e),
			-KVP_E_INVALID_ARGUMENT);
	CU_ASSERT_EQUAL(kvp_lease_free(p, lease, NULL, 0, &e), 0);
	CU_ASSERT_EQUAL(tier_leased(KVP_TIER_DEVICE), 64);
	kvp_client_close(c);
	CU_ASSERT_EQUAL(tier_leased(KVP_TIER_DEVICE), 0);
}

static void test_free_some_pages_and_foreign_pages(void)
{
	struct kvp_error e;
	struct kvp_client *c = conn("part");
	struct kvp_pool *p = kvp_pool_attach(c, "small", NULL, &e);
	uint32_t pages[8], more[2];
	uint64_t lease;

	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc(p, KVP_TIER_DEVICE, 4, &lease, pages, &e), 0);
	CU_ASSERT_EQUAL(kvp_lease_extend(p, lease, 2, more, &e), 0);
	CU_ASSERT_EQUAL(kvp_lease_free(p, lease, pages, 2, &e), 4); /* 4 left */
	CU_ASSERT_EQUAL(kvp_lease_free(p, lease, pages, 1, &e),
			-KVP_E_NOT_FOUND); /* already freed */
	{
		uint32_t dup[2] = { pages[2], pages[2] };

		CU_ASSERT_EQUAL(kvp_lease_free(p, lease, dup, 2, &e), -KVP_E_NOT_FOUND);
	}
	CU_ASSERT_EQUAL(tier_leased(KVP_TIER_DEVICE), 64); /* nothing changed by the refusals */
	CU_ASSERT_EQUAL(kvp_lease_free(p, lease, NULL, 0, &e), 0);
	CU_ASSERT_EQUAL(kvp_lease_free(p, lease, NULL, 0, &e), -KVP_E_NOT_FOUND); /* double free */
	kvp_client_close(c);
}

static int foreign(void *arg)
{
	struct kvp_error e;
	struct kvp_client *c = conn("thief");
	struct kvp_pool *p = c ? kvp_pool_attach(c, "small", NULL, &e) : NULL;
	uint64_t lease = *(uint64_t *)arg;
	uint32_t pages[1];

	if (!p)
		return 40;
	if (kvp_lease_free(p, lease, NULL, 0, &e) != -KVP_E_NOT_FOUND)
		return 41;
	if (kvp_lease_extend(p, lease, 1, pages, &e) != -KVP_E_NOT_FOUND)
		return 42;
	kvp_client_close(c);
	return 0;
}

static void test_foreign_lease_is_not_found(void)
{
	struct kvp_error e;
	struct kvp_client *c = conn("owner");
	struct kvp_pool *p = kvp_pool_attach(c, "small", NULL, &e);
	uint32_t pages[2];
	uint64_t lease;

	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc(p, KVP_TIER_DEVICE, 2, &lease, pages, &e), 0);
	CU_ASSERT_EQUAL(h_in_child(foreign, &lease), 0);
	CU_ASSERT_EQUAL(kvp_lease_free(p, lease, NULL, 0, &e), 0); /* still ours, untouched */
	kvp_client_close(c);
}

/* The session named name, from a second connection (so the quiet one makes no call): its
 * entry, or false when there is none. */
static bool session_named(const char *sock, const char *name, struct kvp_session_info *out)
{
	struct kvp_session_info s[16] = { [0].struct_size = sizeof(s[0]) };
	struct kvp_error e;
	struct kvp_client *c = kvp_client_connect(sock, "lister", &e);
	int n = c ? kvp_session_list(c, s, 16, &e) : -1;
	bool found = false;

	for (int i = 0; i < n && i < 16 && !found; i++)
		if (strcmp(s[i].name, name) == 0) {
			*out = s[i];
			found = true;
		}
	kvp_client_close(c);
	return found;
}

static int holder(void *arg)
{
	struct kvp_error e;
	struct kvp_client *c = conn("victim");
	struct kvp_pool *p = c ? kvp_pool_attach(c, "small", NULL, &e) : NULL;
	struct kvp_match_result m = { .struct_size = sizeof(m) };
	uint32_t pages[40], tok[32], dev[2], host[2];
	uint64_t lease, nt;

	(void)arg;
	for (uint32_t i = 0; i < 32; i++)
		tok[i] = 9000 + i;
	/* a cached prefix it holds a lock on, then its leases */
	if (!p || kvp_lease_alloc(p, KVP_TIER_DEVICE, 2, &lease, pages, &e) < 0 ||
	    kvp_cache_insert(p, lease, 0, tok, 32, 0, pages, 2, &nt, &e) < 0 ||
	    kvp_cache_match(p, 0, tok, 32, 1, &m, dev, host, 2, &e) < 0 || !m.lock_id ||
	    kvp_lease_alloc(p, KVP_TIER_DEVICE, 40, &lease, pages, &e) < 0 ||
	    kvp_lease_alloc(p, KVP_TIER_HOST, 8, &lease, pages, &e) < 0)
		_exit(50);
	if (write(g_pipe[1], "r", 1) != 1)
		_exit(51);
	for (;;)
		pause();
}

/* kill -9 of a client holding leases and a lock: all of it returns at once (its pidfd), well
 * within keepalive_ms (1500). */
static void test_kill9_frees_leases(void)
{
	struct kvp_session_info si;
	struct kvp_error e;
	struct kvp_client *c;
	pid_t pid;
	char b;
	uint64_t end, t0, evicted;

	CU_ASSERT_FATAL(pipe(g_pipe) == 0);
	pid = fork();
	if (pid == 0)
		holder(NULL);
	CU_ASSERT_EQUAL_FATAL(read(g_pipe[0], &b, 1), 1);
	CU_ASSERT_EQUAL(tier_leased(KVP_TIER_DEVICE), 640);
	CU_ASSERT_EQUAL(tier_leased(KVP_TIER_HOST), 128);
	CU_ASSERT(session_named(g_d.sock, "victim", &si) && si.locks == 1);
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	t0 = h_now_ms();
	end = t0 + 5000;
	while (h_now_ms() < end &&
	       (tier_leased(KVP_TIER_DEVICE) != 0 || session_named(g_d.sock, "victim", &si)))
		usleep(10000);
	printf("\n    leases and lock of the killed client returned after %lu ms\n",
	       (unsigned long)(h_now_ms() - t0));
	CU_ASSERT(h_now_ms() - t0 < 1000);
	CU_ASSERT_EQUAL(tier_leased(KVP_TIER_DEVICE), 0);
	CU_ASSERT_EQUAL(tier_leased(KVP_TIER_HOST), 0);
	CU_ASSERT(!session_named(g_d.sock, "victim", &si));
	c = conn("flusher"); /* the prefix is no longer locked: a flush drops it */
	CU_ASSERT(c && kvp_admin_flush(c, "small", &evicted, &e) == 0 && evicted == 32);
	kvp_client_close(c);
	close(g_pipe[0]);
	close(g_pipe[1]);
}

/* A live client that makes no call for much longer than keepalive_ms (1500) keeps its session:
 * its lease, its cache lock and its connection. kvpoold watches its process (a pidfd); being
 * quiet is not being dead. */
static void test_idle_session_keeps_lease_and_locks(void)
{
	struct kvp_error e;
	struct kvp_client *c = conn("quiet");
	struct kvp_pool *p = c ? kvp_pool_attach(c, "small", NULL, &e) : NULL;
	struct kvp_match_result m = { .struct_size = sizeof(m) };
	struct kvp_session_info si;
	uint32_t pages[4], dev[4], host[4], tok[64];
	uint64_t lease, pub, nt, evicted;

	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	for (uint32_t i = 0; i < 64; i++)
		tok[i] = 7000 + i;
	CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc(p, KVP_TIER_DEVICE, 4, &pub, pages, &e), 0);
	CU_ASSERT_EQUAL_FATAL(kvp_cache_insert(p, pub, 0, tok, 64, 0, pages, 4, &nt, &e), 0);
	CU_ASSERT_EQUAL(nt, 64);
	CU_ASSERT_EQUAL_FATAL(kvp_cache_match(p, 0, tok, 64, 1, &m, dev, host, 4, &e), 0);
	CU_ASSERT_EQUAL(m.matched_tokens, 64);
	CU_ASSERT(m.lock_id != 0);
	CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc(p, KVP_TIER_DEVICE, 3, &lease, pages, &e), 0);
	CU_ASSERT_EQUAL(tier_leased(KVP_TIER_DEVICE), 48);
	/* More than twice keepalive_ms without a call. */
	usleep(4000 * 1000);
	CU_ASSERT_FATAL(session_named(g_d.sock, "quiet", &si));
	CU_ASSERT(si.idle_ms >= 3500);
	CU_ASSERT_EQUAL(si.leases, 2); /* the publishing lease (emptied) and the held one */
	CU_ASSERT_EQUAL(si.leased_tokens, 48);
	CU_ASSERT_EQUAL(si.locks, 1);
	CU_ASSERT_EQUAL(si.locked_tokens, 64);
	CU_ASSERT_EQUAL(tier_leased(KVP_TIER_DEVICE), 48);
	CU_ASSERT(!h_log_contains(&g_d, "keepalive_ms"));
	/* Still its own: the same lease and lock, not a new session's NOT_FOUND. */
	CU_ASSERT_EQUAL(kvp_cache_release(p, m.lock_id, &e), 0);
	CU_ASSERT_EQUAL(kvp_lease_free(p, lease, NULL, 0, &e), 0);
	CU_ASSERT_EQUAL(kvp_lease_free(p, pub, NULL, 0, &e), 0);
	CU_ASSERT_EQUAL(kvp_admin_flush(c, "small", &evicted, &e), 0);
	kvp_client_close(c);
}

/* Where kvpoold cannot watch a peer's exit (no pidfd: injected here), keepalive_ms still
 * reclaims a session that makes no call. */
static void test_keepalive_reclaims_unwatched_session(void)
{
	struct daemon d;
	struct kvp_error e;
	struct kvp_client *c;
	struct kvp_pool *p;
	struct kvp_session_info si;
	uint32_t pages[3];
	uint64_t lease, end;
	bool gone = false;

	setenv("KVPOOLD_FAULTS", "pidfd:1", 1);
	CU_ASSERT_EQUAL_FATAL(h_daemon_start(&d, g_conf, NULL), 0);
	unsetenv("KVPOOLD_FAULTS");
	c = kvp_client_connect(d.sock, "sleeper", &e);
	p = c ? kvp_pool_attach(c, "small", NULL, &e) : NULL;
	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc(p, KVP_TIER_DEVICE, 3, &lease, pages, &e), 0);
	/* No call for longer than keepalive_ms (1500): the session is reclaimed. */
	end = h_now_ms() + 6000;
	while (h_now_ms() < end && !(gone = !session_named(d.sock, "sleeper", &si)))
		usleep(100000);
	CU_ASSERT(gone);
	CU_ASSERT(h_log_contains(&d, "reclaimed: no call within keepalive_ms"));
	CU_ASSERT(h_log_contains(&d, "no pidfd for pid"));
	kvp_client_close(c);
	CU_ASSERT_EQUAL(h_daemon_stop(&d), 0);
	h_daemon_cleanup(&d);
}

static void test_quota_exceeded(void)
{
	struct kvp_error e;
	struct kvp_client *c = conn("greedy");
	struct kvp_pool *p = kvp_pool_attach(c, "quota", NULL, &e);
	uint32_t pages[16];
	uint64_t lease;

	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	CU_ASSERT_EQUAL(kvp_lease_alloc(p, KVP_TIER_DEVICE, 6, &lease, pages, &e),
			0); /* 48 tokens */
	CU_ASSERT_EQUAL(kvp_lease_extend(p, lease, 3, pages, &e), -KVP_E_QUOTA_EXCEEDED);
	CU_ASSERT_EQUAL(e.detail, KVP_DETAIL_QUOTA);
	CU_ASSERT_EQUAL(e.quota.quota_tokens, 64);
	CU_ASSERT_EQUAL(e.quota.held_tokens, 48);
	CU_ASSERT_EQUAL(e.quota.requested_tokens, 24);
	CU_ASSERT_EQUAL(kvp_lease_extend(p, lease, 2, pages, &e), 0); /* exactly the quota */
	kvp_client_close(c);
}

static void test_tier_fd_is_sealed(void)
{
	struct kvp_error e;
	struct kvp_client *c = conn("truncator");
	struct kvp_pool *p = kvp_pool_attach(c, "small", NULL, &e);

	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	for (int t = 0; t < KVP_TIER_MAX; t++) {
		int fd = kvp_pool_tier_fd(p, t);

		CU_ASSERT(fd >= 0);
		CU_ASSERT_EQUAL(ftruncate(fd, 0), -1);
		CU_ASSERT_EQUAL(errno, EPERM);
		CU_ASSERT_EQUAL(ftruncate(fd, (off_t)kvp_pool_tier_bytes(p, t) * 2), -1);
	}
	CU_ASSERT_EQUAL(kvp_client_ping(c, &e), 0); /* the daemon did not notice a thing */
	kvp_client_close(c);
}

static void test_pool_larger_than_memory_exits_budget(void)
{
	struct daemon d;
	const char *conf = "[pool.huge]\n"
			   "layers = 80\nkv_heads = 8\nhead_dim = 128\ndtype = bf16\n"
			   "page_tokens = 16\ndevice = none\nhost_capacity = 64T\n";
	int rc = h_daemon_run_to_exit(&d, conf, NULL);

	CU_ASSERT_EQUAL(rc, 3);
	CU_ASSERT(h_log_contains(&d, "HOST_BUDGET_EXCEEDED"));
	CU_ASSERT(h_log_contains(&d, "pool huge: host tier needs"));
	h_daemon_cleanup(&d);
}

static void test_cuda_pool_without_gpu_is_refused_typed(void)
{
	struct daemon d;
	const char *conf = "[pool.gpu]\n"
			   "layers = 2\nkv_heads = 2\nhead_dim = 16\ndtype = fp16\n"
			   "page_tokens = 16\ndevice = cuda:0\ndevice_capacity = 1M\n"
			   "host_capacity = 1M\nmlock = off\n";
	int rc;

	if (access("/dev/nvidiactl", F_OK) == 0)
		return; /* a GPU machine: the gpu suite covers it */
	rc = h_daemon_run_to_exit(&d, conf, NULL);
	CU_ASSERT_EQUAL(rc, 4);
	CU_ASSERT(h_log_contains(&d, "cuda:0 device tier refused"));
	h_daemon_cleanup(&d);
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_attach_geometry_and_backend),
		H_TEST(test_attach_errors_are_typed),
		H_TEST(test_two_clients_share_bytes),
		H_TEST(test_exhaustion_is_out_of_capacity_with_numbers),
		H_TEST(test_free_some_pages_and_foreign_pages),
		H_TEST(test_foreign_lease_is_not_found),
		H_TEST(test_kill9_frees_leases),
		H_TEST(test_idle_session_keeps_lease_and_locks),
		H_TEST(test_keepalive_reclaims_unwatched_session),
		H_TEST(test_quota_exceeded),
		H_TEST(test_tier_fd_is_sealed),
		H_TEST(test_pool_larger_than_memory_exits_budget),
		H_TEST(test_cuda_pool_without_gpu_is_refused_typed),
		H_TEST(test_kvp_lease_alloc_run),
	};

	return H_RUN_SUITE("pools", init_suite, clean_suite, tests);
}
