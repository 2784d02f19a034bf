/* test_demote_async.c - demotion off the loop thread against a real kvpoold whose sim copies
 * land late (KVPOOLD_COPY_DELAY_MS=1000): an Alloc that must evict and demote is answered only
 * once the copy landed, while another session's pings and matches are answered at once (the
 * device pages being copied stay cached and readable); the demoted bytes are right in the host
 * tier; an engine that goes while its Alloc waits leaves nothing behind; the same for a
 * hash-keyed namespace; status counts the copies' destinations as moving (free + leased + cached
 * + moving == total); the books balance at exit (the suite's cleanup wants exit status 0). */
#include <CUnit/Basic.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "eng.h"
#include "harness.h"
#include "kvpool.h"

/* 64 device pages, 64 host pages, 4 tokens a page, tiny rows. */
static const char *const g_conf = "[pool.c]\n"
				  "layers = 2\nkv_heads = 1\nhead_dim = 8\ndtype = fp16\n"
				  "page_tokens = 4\ndevice = sim\ndevice_capacity = 256t\n"
				  "host_capacity = 256t\nmlock = off\n";
enum { PT = 4, DEV_PAGES = 64, ROW = 16, DELAY_MS = 1000 };

static struct daemon g_d;

static int init_suite(void)
{
	int r;

	setenv("KVPOOLD_COPY_DELAY_MS", "1000", 1);
	r = h_daemon_start(&g_d, g_conf, NULL);
	unsetenv("KVPOOLD_COPY_DELAY_MS");
	return r;
}

static int clean_suite(void)
{
	return h_daemon_finish(&g_d);
}

static int eng_open(struct h_eng *e, const char *name)
{
	return h_eng_open(e, g_d.sock, name, "c");
}

static void tokens_of(uint32_t seq, uint32_t *t, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		t[i] = seq * 1000 + i;
}

/* Leases, writes and inserts a sequence of npages device pages. Returns new tokens or -1. */
static int64_t publish(struct h_eng *e, uint32_t seq, uint32_t npages)
{
	struct kvp_error err;
	uint32_t tok[256], pages[64];
	uint64_t lease, fresh = 0;

	tokens_of(seq, tok, npages * PT);
	if (kvp_lease_alloc(e->p, KVP_TIER_DEVICE, npages, &lease, pages, &err) < 0)
		return -1;
	h_eng_rows(e->p, KVP_TIER_DEVICE, pages, npages * PT, PT, ROW, seq, 0);
	if (kvp_cache_insert(e->p, lease, 0, tok, npages * PT, 0, pages, npages, &fresh, &err) < 0)
		return -1;
	kvp_lease_free(e->p, lease, NULL, 0, &err);
	return (int64_t)fresh;
}

/* Pool 0's figures of tier t; its moving tokens into *moving when set. */
static struct kvp_tier_status tier_moving(int t, uint64_t *moving)
{
	struct kvp_error err;
	struct kvp_status st = { .struct_size = sizeof(st) };
	struct kvp_client *c = kvp_client_connect(g_d.sock, "probe", &err);
	struct kvp_tier_status z = { 0 };

	if (moving)
		*moving = UINT64_MAX;
	if (c && kvp_client_status(c, &st, &err) == 0) {
		z = st.pools[0].tiers[t];
		if (moving)
			*moving = st.moving_tokens[0][t];
	}
	kvp_client_close(c);
	return z;
}

static struct kvp_tier_status tier(int t)
{
	return tier_moving(t, NULL);
}

/* In a child: the whole device tier, which needs the 12 cached pages demoted first. Exit 0 when
 * the Alloc succeeded no sooner than the copy could land; 2 when it came too soon. */
static int whole_tier(void)
{
	struct h_eng e;
	struct kvp_error err;
	uint32_t pages[DEV_PAGES];
	uint64_t lease, t0;

	if (eng_open(&e, "allocator") < 0)
		return 1;
	t0 = h_now_ms();
	if (kvp_lease_alloc(e.p, KVP_TIER_DEVICE, DEV_PAGES, &lease, pages, &err) < 0)
		return 3;
	if (h_now_ms() - t0 < DELAY_MS * 8 / 10)
		return 2;
	if (kvp_lease_free(e.p, lease, NULL, 0, &err) < 0)
		return 4;
	kvp_client_close(e.c);
	return 0;
}

static pid_t spawn_whole_tier(void)
{
	pid_t pid = fork();

	if (pid == 0)
		_exit(whole_tier());
	return pid;
}

static void sleep_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

static void test_alloc_waits_for_demotion_others_served(void)
{
	struct h_eng a;
	struct kvp_error err;
	struct kvp_match_result m = { .struct_size = sizeof(m) };
	uint32_t tok[64], dev[16], host[16];
	struct kvp_tier_status d, h;
	uint64_t t0, slowest = 0, dmov, hmov;
	pid_t pid;

	CU_ASSERT_EQUAL_FATAL(eng_open(&a, "engine"), 0);
	CU_ASSERT_EQUAL_FATAL(publish(&a, 42, 12), 48); /* 12 device pages cached, 52 free */
	tokens_of(42, tok, 48);
	pid = spawn_whole_tier();
	CU_ASSERT_FATAL(pid > 0);
	sleep_ms(200); /* its Alloc is in: the demotion runs */
	d = tier_moving(KVP_TIER_DEVICE, &dmov);
	h = tier_moving(KVP_TIER_HOST, &hmov);
	/* the books add up on the wire: the copy's destination is moving */
	CU_ASSERT_EQUAL(dmov, 0);
	CU_ASSERT_EQUAL(hmov, 48);
	CU_ASSERT_EQUAL(d.free_tokens + d.leased_tokens + d.cached_tokens + dmov, d.total_tokens);
	CU_ASSERT_EQUAL(h.free_tokens + h.leased_tokens + h.cached_tokens + hmov, h.total_tokens);
	CU_ASSERT_EQUAL(d.cached_tokens, 48);	 /* still cached, being copied */
	CU_ASSERT_EQUAL(d.protected_tokens, 48); /* and held by the copy */
	CU_ASSERT_EQUAL(d.free_tokens, 208);
	CU_ASSERT_EQUAL(h.cached_tokens, 0);	  /* the destination is not readable yet */
	CU_ASSERT_EQUAL(h.free_tokens, 256 - 48); /* nor free */
	/* Meanwhile this session is served at once: pings, and matches of the pages in flight,
	 * which are read from the device tier. */
	for (int i = 0; i < 5; i++) {
		t0 = h_now_ms();
		CU_ASSERT_EQUAL(kvp_client_ping(a.c, &err), 0);
		CU_ASSERT_EQUAL_FATAL(kvp_cache_match(a.p, 0, tok, 48, 0, &m, dev, host, 16, &err),
				      0);
		if (h_now_ms() - t0 > slowest)
			slowest = h_now_ms() - t0;
		CU_ASSERT_EQUAL(m.n_device, 12);
		CU_ASSERT_EQUAL(m.n_host, 0);
		CU_ASSERT_EQUAL(h_eng_rows(a.p, KVP_TIER_DEVICE, dev, 48, PT, ROW, 42, 1), 0);
		sleep_ms(50);
	}
	CU_ASSERT(slowest < 300);
	CU_ASSERT_EQUAL(h_wait_pid(pid, 10000), 0); /* answered after the copy, with the tier */
	/* Landed: the pages are host pages with the bytes the device pages had. */
	CU_ASSERT_EQUAL_FATAL(kvp_cache_match(a.p, 0, tok, 48, 0, &m, dev, host, 16, &err), 0);
	CU_ASSERT_EQUAL(m.n_device, 0);
	CU_ASSERT_EQUAL_FATAL(m.n_host, 12);
	CU_ASSERT_EQUAL(h_eng_rows(a.p, KVP_TIER_HOST, host, 48, PT, ROW, 42, 1), 0);
	d = tier(KVP_TIER_DEVICE);
	h = tier_moving(KVP_TIER_HOST, &hmov);
	CU_ASSERT_EQUAL(hmov, 0);
	CU_ASSERT_EQUAL(d.free_tokens, 256);
	CU_ASSERT_EQUAL(d.cached_tokens + d.leased_tokens, 0);
	CU_ASSERT_EQUAL(h.cached_tokens, 48);
	CU_ASSERT_EQUAL(h.free_tokens + h.cached_tokens, h.total_tokens);
	kvp_client_close(a.c);
}

/* The engine whose Alloc waits is killed: when the copy lands its ticket is dropped and no
 * lease is made for it. */
static void test_engine_gone_while_alloc_waits(void)
{
	struct h_eng a;
	struct kvp_tier_status d, h;
	pid_t pid;
	int st;

	CU_ASSERT_EQUAL_FATAL(eng_open(&a, "engine"), 0);
	CU_ASSERT_EQUAL_FATAL(publish(&a, 43, 12), 48);
	pid = spawn_whole_tier();
	CU_ASSERT_FATAL(pid > 0);
	sleep_ms(300);
	kill(pid, SIGKILL);
	CU_ASSERT_EQUAL(waitpid(pid, &st, 0), pid);
	sleep_ms(DELAY_MS + 500); /* the copy lands */
	CU_ASSERT(kvp_client_ping(a.c, NULL) == 0);
	d = tier(KVP_TIER_DEVICE);
	h = tier(KVP_TIER_HOST);
	CU_ASSERT_EQUAL(d.leased_tokens, 0);
	CU_ASSERT_EQUAL(d.free_tokens, 256);
	CU_ASSERT_EQUAL(h.cached_tokens, 96);
	CU_ASSERT_EQUAL(h.free_tokens + h.cached_tokens, h.total_tokens);
	kvp_client_close(a.c);
}

/* Key i of keyed chain seq: 32 bytes, as a chained page hash would be. */
enum { KB = 32, KNS = 5 };
static uint8_t g_kb[16][KB];
static void keys_of(uint32_t seq, struct kvp_page_key *k, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++) {
		for (uint32_t j = 0; j < KB; j++)
			g_kb[i][j] = (uint8_t)(seq * 17 + i * 5 + j);
		k[i] = (struct kvp_page_key){ g_kb[i], KB };
	}
}

/* Leases, writes and inserts a keyed chain of npages device pages (page i holds positions
 * [i * PT, i * PT + PT) of sequence seq). Returns the pages taken, or -1. */
static int publish_keys(struct h_eng *e, uint32_t seq, uint32_t npages)
{
	struct kvp_insert_keys_result r = { .struct_size = sizeof(r) };
	struct kvp_page_key k[16];
	struct kvp_error err;
	uint32_t pages[16];
	uint64_t lease;

	keys_of(seq, k, npages);
	if (kvp_lease_alloc(e->p, KVP_TIER_DEVICE, npages, &lease, pages, &err) < 0)
		return -1;
	h_eng_rows(e->p, KVP_TIER_DEVICE, pages, npages * PT, PT, ROW, seq, 0);
	if (kvp_cache_insert_keys(e->p, lease, KNS, k, npages, 0, pages, npages, &r, &err) < 0)
		return -1;
	kvp_lease_free(e->p, lease, NULL, 0, &err);
	return (int)r.new_pages;
}

/* The same with a keyed namespace: the Alloc that must demote keyed pages is answered after
 * the copy; meanwhile the chain is matched as device pages with its bytes, and the books add
 * up with the destinations moving; then the chain is in the host tier with the same bytes. */
static void test_keyed_alloc_waits_for_demotion_others_served(void)
{
	struct h_eng a;
	struct kvp_error err;
	struct kvp_match_keys_result m = { .struct_size = sizeof(m) };
	struct kvp_page_key k[12];
	uint32_t dev[12], host[12];
	struct kvp_tier_status d, h, h0;
	uint64_t t0, slowest = 0, dmov, hmov;
	pid_t pid;

	CU_ASSERT_EQUAL_FATAL(eng_open(&a, "engine"), 0);
	h0 = tier(KVP_TIER_HOST);
	CU_ASSERT_EQUAL_FATAL(publish_keys(&a, 44, 12), 12);
	keys_of(44, k, 12);
	pid = spawn_whole_tier();
	CU_ASSERT_FATAL(pid > 0);
	sleep_ms(200); /* its Alloc is in: the demotion runs */
	d = tier_moving(KVP_TIER_DEVICE, &dmov);
	h = tier_moving(KVP_TIER_HOST, &hmov);
	CU_ASSERT_EQUAL(d.cached_tokens, 48);	 /* still cached, being copied */
	CU_ASSERT_EQUAL(d.protected_tokens, 48); /* and held by the copy */
	CU_ASSERT_EQUAL(d.free_tokens, 208);
	CU_ASSERT_EQUAL(dmov, 0);
	CU_ASSERT_EQUAL(hmov, 48);
	CU_ASSERT_EQUAL(h.cached_tokens, h0.cached_tokens); /* the destination is not readable */
	CU_ASSERT_EQUAL(h.free_tokens, h0.free_tokens - 48);
	CU_ASSERT_EQUAL(d.free_tokens + d.leased_tokens + d.cached_tokens + dmov, d.total_tokens);
	CU_ASSERT_EQUAL(h.free_tokens + h.leased_tokens + h.cached_tokens + hmov, h.total_tokens);
	for (int i = 0; i < 5; i++) {
		t0 = h_now_ms();
		CU_ASSERT_EQUAL(kvp_client_ping(a.c, &err), 0);
		CU_ASSERT_EQUAL_FATAL(kvp_cache_match_keys(a.p, KNS, k, 12, 0, &m, dev, host, 12,
							   &err),
				      0);
		if (h_now_ms() - t0 > slowest)
			slowest = h_now_ms() - t0;
		CU_ASSERT_EQUAL(m.n_device, 12);
		CU_ASSERT_EQUAL(m.n_host, 0);
		CU_ASSERT_EQUAL(h_eng_rows(a.p, KVP_TIER_DEVICE, dev, 48, PT, ROW, 44, 1), 0);
		sleep_ms(50);
	}
	CU_ASSERT(slowest < 300);
	CU_ASSERT_EQUAL(h_wait_pid(pid, 10000), 0); /* answered after the copy, with the tier */
	CU_ASSERT_EQUAL_FATAL(kvp_cache_match_keys(a.p, KNS, k, 12, 0, &m, dev, host, 12, &err), 0);
	CU_ASSERT_EQUAL(m.n_device, 0);
	CU_ASSERT_EQUAL_FATAL(m.n_host, 12);
	CU_ASSERT_EQUAL(h_eng_rows(a.p, KVP_TIER_HOST, host, 48, PT, ROW, 44, 1), 0);
	d = tier(KVP_TIER_DEVICE);
	h = tier_moving(KVP_TIER_HOST, &hmov);
	CU_ASSERT_EQUAL(hmov, 0);
	CU_ASSERT_EQUAL(d.free_tokens, 256);
	CU_ASSERT_EQUAL(d.cached_tokens + d.leased_tokens, 0);
	CU_ASSERT_EQUAL(h.cached_tokens, h0.cached_tokens + 48);
	CU_ASSERT_EQUAL(h.free_tokens + h.cached_tokens, h.total_tokens);
	kvp_client_close(a.c);
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_alloc_waits_for_demotion_others_served),
		H_TEST(test_engine_gone_while_alloc_waits),
		H_TEST(test_keyed_alloc_waits_for_demotion_others_served),
	};

	return H_RUN_SUITE("demote_async", init_suite, clean_suite, tests);
}
