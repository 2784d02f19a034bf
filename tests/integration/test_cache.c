/* test_cache.c - the shared prefix cache against a real kvpoold: engine A inserts and engine B
 * reads A's bytes; eviction under pressure frees exactly the shortfall; demotion then promotion
 * keeps every byte; a killed client's locks are released; capacity errors carry the real
 * evictable and protected figures; namespaces never share pages. */
#include <CUnit/Basic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "eng.h"
#include "harness.h"
#include "kvpool.h"

/* 64 device pages, 64 host pages, 4 tokens a page, tiny rows. */
static const char *const g_conf = "[pool.c]\n"
				  "layers = 2\nkv_heads = 1\nhead_dim = 8\ndtype = fp16\n"
				  "page_tokens = 4\ndevice = sim\ndevice_capacity = 256t\n"
				  "host_capacity = 256t\nmlock = off\n";
enum { PT = 4, DEV_PAGES = 64, ROW = 16 };

static struct daemon g_d;

static int init_suite(void)
{
	return h_daemon_start(&g_d, g_conf, NULL);
}

static int clean_suite(void)
{
	return h_daemon_finish(&g_d);
}

static int eng_open(struct h_eng *e, const char *name)
{
	return h_eng_open(e, g_d.sock, name, "c");
}

/* Writes (or checks) positions [from, to) of sequence seq into pages (page i = positions
 * [base + i*PT ...)) of tier. Returns mismatches. */
static int rows(struct kvp_pool *p, int tier, const uint32_t *pages, uint32_t base, uint32_t from,
		uint32_t to, uint32_t seq, int check)
{
	int bad = 0;

	for (uint32_t pos = from; pos < to; pos++)
		for (uint32_t l = 0; l < 2; l++)
			for (uint32_t kv = 0; kv < 2; kv++) {
				uint8_t *a =
					kvp_pool_slot_addr(p, tier, l, kv, pages[(pos - base) / PT],
							   (pos - base) % PT);

				if (!a)
					return 1000;
				for (uint32_t i = 0; i < ROW; i++) {
					if (!check)
						a[i] = h_byte_of(pos, seq, l, kv, i);
					else
						bad += a[i] != h_byte_of(pos, seq, l, kv, i);
				}
			}
	return bad;
}

static void tokens_of(uint32_t seq, uint32_t *t, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		t[i] = seq * 1000 + i;
}

/* Leases, writes and inserts a sequence of npages pages. Returns new tokens or -1. */
static int64_t publish(struct h_eng *e, uint32_t seq, uint32_t npages, uint64_t ns)
{
	struct kvp_error err;
	uint32_t tok[256], pages[64];
	uint64_t lease, fresh = 0;

	tokens_of(seq, tok, npages * PT);
	if (kvp_lease_alloc(e->p, KVP_TIER_DEVICE, npages, &lease, pages, &err) < 0)
		return -1;
	rows(e->p, KVP_TIER_DEVICE, pages, 0, 0, npages * PT, seq, 0);
	if (kvp_cache_insert(e->p, lease, ns, tok, npages * PT, 0, pages, npages, &fresh, &err) < 0)
		return -1;
	kvp_lease_free(e->p, lease, NULL, 0, &err);
	return (int64_t)fresh;
}

static struct kvp_tier_status tier(int t)
{
	struct kvp_error err;
	struct kvp_status st = { .struct_size = sizeof(st) };
	struct kvp_client *c = kvp_client_connect(g_d.sock, "probe", &err);
	struct kvp_tier_status z = { 0 };

	if (c && kvp_client_status(c, &st, &err) == 0)
		z = st.pools[0].tiers[t];
	kvp_client_close(c);
	return z;
}

static void flush_all(void)
{
	struct kvp_error err;
	struct kvp_client *c = kvp_client_connect(g_d.sock, "admin", &err);

	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	CU_ASSERT_EQUAL(kvp_admin_flush(c, "c", NULL, &err), 0);
	kvp_client_close(c);
}

static int reader(void *arg)
{
	struct h_eng b;
	struct kvp_error err;
	struct kvp_match_result m = { .struct_size = sizeof(m) };
	uint32_t tok[64], dev[16], host[16];
	int bad;

	(void)arg;
	if (eng_open(&b, "engine-b") < 0)
		return 60;
	tokens_of(7, tok, 40 + 2); /* a longer query: the cached 40 tokens match */
	if (kvp_cache_match(b.p, 0, tok, 42, 1, &m, dev, host, 16, &err) < 0)
		return 61;
	if (m.matched_tokens != 40 || m.n_device != 10 || m.n_host != 0 || !m.lock_id)
		return 62;
	bad = rows(b.p, KVP_TIER_DEVICE, dev, 0, 0, 40, 7, 1);
	if (bad)
		return 63;
	if (kvp_cache_release(b.p, m.lock_id, &err) < 0 ||
	    kvp_cache_release(b.p, m.lock_id, &err) != -KVP_E_NOT_FOUND)
		return 64;
	kvp_client_close(b.c);
	return 0;
}

static void test_insert_in_a_match_in_b_reads_a_bytes(void)
{
	struct h_eng a;

	CU_ASSERT_EQUAL_FATAL(eng_open(&a, "engine-a"), 0);
	CU_ASSERT_EQUAL(publish(&a, 7, 10, 0), 40);
	CU_ASSERT_EQUAL(publish(&a, 7, 10, 0), 0); /* again: all duplicates, freed */
	CU_ASSERT_EQUAL(tier(KVP_TIER_DEVICE).cached_tokens, 40);
	CU_ASSERT_EQUAL(tier(KVP_TIER_DEVICE).leased_tokens, 0);
	kvp_client_close(a.c);
	CU_ASSERT_EQUAL(h_in_child(reader, NULL), 0);
	CU_ASSERT_EQUAL(tier(KVP_TIER_DEVICE).cached_tokens, 40); /* outlives its writer */
	flush_all();
}

static void test_insert_after_match_extends_the_prefix(void)
{
	struct h_eng a;
	struct kvp_error err;
	struct kvp_match_result m = { .struct_size = sizeof(m) };
	uint32_t tok[64], dev[16], host[16], pages[8];
	uint64_t lease, fresh = 0;

	CU_ASSERT_EQUAL_FATAL(eng_open(&a, "engine"), 0);
	CU_ASSERT_EQUAL(publish(&a, 3, 4, 0), 16);
	tokens_of(3, tok, 30);
	CU_ASSERT_EQUAL_FATAL(kvp_cache_match(a.p, 0, tok, 30, 1, &m, dev, host, 16, &err), 0);
	CU_ASSERT_EQUAL(m.matched_tokens, 16);
	/* Compute tokens 16..30 (3 whole pages + a tail of 2) and publish the whole sequence. */
	CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc(a.p, KVP_TIER_DEVICE, 4, &lease, pages, &err), 0);
	rows(a.p, KVP_TIER_DEVICE, pages, 16, 16, 30, 3, 0);
	CU_ASSERT_EQUAL(kvp_cache_insert(a.p, lease, 0, tok, 30, 4, pages, 4, &fresh, &err), 0);
	CU_ASSERT_EQUAL(fresh, 12);
	CU_ASSERT_EQUAL(kvp_lease_free(a.p, lease, NULL, 0, &err), 0); /* the tail page */
	CU_ASSERT_EQUAL(kvp_cache_release(a.p, m.lock_id, &err), 0);
	CU_ASSERT_EQUAL_FATAL(kvp_cache_match(a.p, 0, tok, 30, 0, &m, dev, host, 16, &err), 0);
	CU_ASSERT_EQUAL(m.matched_tokens, 28);
	CU_ASSERT_EQUAL(rows(a.p, KVP_TIER_DEVICE, dev, 0, 0, 28, 3, 1), 0);
	kvp_client_close(a.c);
	flush_all();
}

static void test_eviction_frees_exactly_the_shortfall(void)
{
	struct h_eng a;
	struct kvp_error err;
	uint32_t pages[DEV_PAGES];
	uint64_t lease;
	struct kvp_tier_status d0, d1, h1;

	CU_ASSERT_EQUAL_FATAL(eng_open(&a, "engine"), 0);
	for (uint32_t s = 0; s < 5; s++)
		CU_ASSERT_EQUAL(publish(&a, 100 + s, 8, 0), 32); /* 40 pages cached */
	d0 = tier(KVP_TIER_DEVICE);
	CU_ASSERT_EQUAL(d0.cached_tokens, 160);
	CU_ASSERT_EQUAL(d0.free_tokens, 96);
	/* 30 pages asked, 24 free: exactly 6 pages must go (demoted to host pages). */
	CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc(a.p, KVP_TIER_DEVICE, 30, &lease, pages, &err), 0);
	d1 = tier(KVP_TIER_DEVICE);
	h1 = tier(KVP_TIER_HOST);
	CU_ASSERT_EQUAL(d1.free_tokens, 0);
	CU_ASSERT_EQUAL(d1.cached_tokens, 160 - 24);
	CU_ASSERT_EQUAL(d1.leased_tokens, 120);
	CU_ASSERT_EQUAL(h1.cached_tokens, 24);
	CU_ASSERT_EQUAL(d1.free_tokens + d1.leased_tokens + d1.cached_tokens, d1.total_tokens);
	CU_ASSERT_EQUAL(kvp_lease_free(a.p, lease, NULL, 0, &err), 0);
	kvp_client_close(a.c);
	flush_all();
}

static void test_demotion_then_promotion_keeps_bytes(void)
{
	struct h_eng a;
	struct kvp_error err;
	struct kvp_match_result m = { .struct_size = sizeof(m) };
	uint32_t tok[64], dev[16], host[16], loaded[16];
	uint64_t evicted = 0;
	int n;

	CU_ASSERT_EQUAL_FATAL(eng_open(&a, "engine"), 0);
	CU_ASSERT_EQUAL(publish(&a, 42, 12, 0), 48);
	/* Admin eviction of the device tier demotes every cached page to the host tier. */
	CU_ASSERT_EQUAL(kvp_admin_evict(a.c, "c", KVP_TIER_DEVICE, 48, &evicted, &err), 0);
	CU_ASSERT_EQUAL(evicted, 48);
	CU_ASSERT_EQUAL(tier(KVP_TIER_DEVICE).cached_tokens, 0);
	CU_ASSERT_EQUAL(tier(KVP_TIER_HOST).cached_tokens, 48);
	tokens_of(42, tok, 48);
	CU_ASSERT_EQUAL_FATAL(kvp_cache_match(a.p, 0, tok, 48, 1, &m, dev, host, 16, &err), 0);
	CU_ASSERT_EQUAL(m.n_device, 0);
	CU_ASSERT_EQUAL_FATAL(m.n_host, 12);
	CU_ASSERT_EQUAL(rows(a.p, KVP_TIER_HOST, host, 0, 0, 48, 42, 1), 0); /* host layout */
	n = kvp_cache_load(a.p, m.lock_id, loaded, 16, &err);
	CU_ASSERT_EQUAL_FATAL(n, 12);
	CU_ASSERT_EQUAL(rows(a.p, KVP_TIER_DEVICE, loaded, 0, 0, 48, 42, 1), 0); /* device layout */
	CU_ASSERT_EQUAL(tier(KVP_TIER_DEVICE).cached_tokens, 48);
	CU_ASSERT_EQUAL(tier(KVP_TIER_HOST).cached_tokens, 0);
	CU_ASSERT_EQUAL(kvp_cache_release(a.p, m.lock_id, &err), 0);
	kvp_client_close(a.c);
	flush_all();
}

static int g_pipe[2];

static int locker(void)
{
	struct h_eng b;
	struct kvp_error err;
	struct kvp_match_result m = { .struct_size = sizeof(m) };
	uint32_t tok[64], dev[16], host[16];

	if (eng_open(&b, "locker") < 0)
		return 70;
	tokens_of(9, tok, 32);
	if (kvp_cache_match(b.p, 0, tok, 32, 1, &m, dev, host, 16, &err) < 0 ||
	    m.matched_tokens != 32)
		return 71;
	if (write(g_pipe[1], "l", 1) != 1)
		return 72;
	for (;;)
		pause();
}

static void test_killed_client_locks_are_released(void)
{
	struct h_eng a;
	struct kvp_error err;
	uint32_t pages[DEV_PAGES];
	uint64_t lease, end;
	pid_t pid;
	char c;

	CU_ASSERT_EQUAL_FATAL(eng_open(&a, "engine"), 0);
	CU_ASSERT_EQUAL(publish(&a, 9, 8, 0), 32);
	CU_ASSERT_EQUAL(publish(&a, 10, 4, 0), 16);
	CU_ASSERT_FATAL(pipe(g_pipe) == 0);
	pid = fork();
	if (pid == 0)
		_exit(locker());
	CU_ASSERT_EQUAL_FATAL(read(g_pipe[0], &c, 1), 1);
	CU_ASSERT_EQUAL(tier(KVP_TIER_DEVICE).protected_tokens, 32);
	CU_ASSERT_EQUAL(tier(KVP_TIER_DEVICE).evictable_tokens, 16);
	/* Asking for more than free + evictable: the error carries the real figures. */
	CU_ASSERT_EQUAL(kvp_lease_alloc(a.p, KVP_TIER_DEVICE, DEV_PAGES, &lease, pages, &err),
			-KVP_E_OUT_OF_CAPACITY);
	CU_ASSERT_EQUAL(err.capacity.requested_tokens, 256);
	CU_ASSERT_EQUAL(err.capacity.free_tokens, 256 - 48);
	CU_ASSERT_EQUAL(err.capacity.evictable_tokens, 16);
	CU_ASSERT_EQUAL(err.capacity.protected_tokens, 32);
	CU_ASSERT_EQUAL(tier(KVP_TIER_DEVICE).cached_tokens, 48); /* nothing evicted for nothing */
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	end = h_now_ms() + 5000;
	while (h_now_ms() < end && tier(KVP_TIER_DEVICE).protected_tokens != 0)
		usleep(10000);
	CU_ASSERT_EQUAL(tier(KVP_TIER_DEVICE).protected_tokens, 0);
	CU_ASSERT_EQUAL(tier(KVP_TIER_DEVICE).evictable_tokens, 48);
	/* Now the whole tier can be had: every cached page gives way. */
	CU_ASSERT_EQUAL(kvp_lease_alloc(a.p, KVP_TIER_DEVICE, DEV_PAGES, &lease, pages, &err), 0);
	CU_ASSERT_EQUAL(kvp_lease_free(a.p, lease, NULL, 0, &err), 0);
	close(g_pipe[0]);
	close(g_pipe[1]);
	kvp_client_close(a.c);
	flush_all();
}

static void test_namespaces_never_share(void)
{
	struct h_eng a;
	struct kvp_error err;
	struct kvp_match_result m = { .struct_size = sizeof(m) };
	uint32_t tok[64], dev[16], host[16];

	CU_ASSERT_EQUAL_FATAL(eng_open(&a, "engine"), 0);
	CU_ASSERT_EQUAL(publish(&a, 5, 4, 1), 16);
	CU_ASSERT_EQUAL(publish(&a, 5, 4, 2), 16); /* same tokens, another adapter: new pages */
	tokens_of(5, tok, 16);
	CU_ASSERT_EQUAL(kvp_cache_match(a.p, 0, tok, 16, 0, &m, dev, host, 16, &err), 0);
	CU_ASSERT_EQUAL(m.matched_tokens, 0);
	CU_ASSERT_EQUAL(kvp_cache_match(a.p, 2, tok, 16, 0, &m, dev, host, 16, &err), 0);
	CU_ASSERT_EQUAL(m.matched_tokens, 16);
	CU_ASSERT_EQUAL(tier(KVP_TIER_DEVICE).cached_tokens, 32);
	kvp_client_close(a.c);
	flush_all();
}

static void test_admin_calls_refused_for_others(void)
{
	struct h_eng a;
	struct kvp_error err;

	if (getuid() != 0)
		return; /* as root the test client is admin; the fault suite covers non-admins */
	CU_ASSERT_EQUAL_FATAL(eng_open(&a, "engine"), 0);
	CU_ASSERT_EQUAL(kvp_admin_evict(a.c, "nope", KVP_TIER_DEVICE, 4, NULL, &err),
			-KVP_E_NO_SUCH_POOL);
	CU_ASSERT_EQUAL(kvp_admin_evict(a.c, "c", 5, 4, NULL, &err), -KVP_E_INVALID_ARGUMENT);
	kvp_client_close(a.c);
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_insert_in_a_match_in_b_reads_a_bytes),
		H_TEST(test_insert_after_match_extends_the_prefix),
		H_TEST(test_eviction_frees_exactly_the_shortfall),
		H_TEST(test_demotion_then_promotion_keeps_bytes),
		H_TEST(test_killed_client_locks_are_released),
		H_TEST(test_namespaces_never_share),
		H_TEST(test_admin_calls_refused_for_others),
	};

	return H_RUN_SUITE("cache", init_suite, clean_suite, tests);
}
