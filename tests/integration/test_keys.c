/* test_keys.c - hash-keyed pages against a real kvpoold: engine A inserts a key chain and engine
 * B (another process) finds it with exists and match and reads A's bytes; a host-resident chain
 * loaded to the device keeps its bytes; a key of 65 bytes and 10^6 keys in one call answer
 * LIMIT_EXCEEDED with the limit named (the library's and the daemon's; the daemon keeps
 * serving); a token call on a hash-keyed namespace and the reverse are typed errors; a foreign
 * namespace misses; leasing every device page evicts keyed pages; the books balance (status
 * figures, and the daemon's clean exit asserts them). */
#include <CUnit/Basic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eng.h"
#include "harness.h"
#include "kvpool.h"

/* 16 device pages, 16 host pages, 4 tokens a page, tiny rows; the daemon's key limits below
 * the library's (KVP_PAGE_KEYS_MAX, KVP_PAGE_KEY_BYTES_MAX), so both sides' refusals show. */
enum { DAEMON_KEYS = 4096, DAEMON_KEY_BYTES = 48 };
static const char *const g_conf = "[daemon]\nmax_keys_per_call = 4096\nmax_key_bytes = 48\n"
				  "[pool.c]\n"
				  "layers = 2\nkv_heads = 1\nhead_dim = 8\ndtype = fp16\n"
				  "page_tokens = 4\ndevice = sim\ndevice_capacity = 64t\n"
				  "host_capacity = 64t\nmlock = off\n";
enum { PT = 4, DEV_PAGES = 16, ROW = 16, KB = 32, NS = 5 };

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

/* Key i of chain seq: 32 bytes, as a chained page hash would be. */
static uint8_t g_kb[64][KB];
static void keys_of(uint32_t seq, struct kvp_page_key *k, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++) {
		for (uint32_t j = 0; j < KB; j++)
			g_kb[i][j] = (uint8_t)(seq * 17 + i * 5 + j);
		k[i] = (struct kvp_page_key){ g_kb[i], KB };
	}
}

/* Writes (check 0) or counts mismatches of (check 1) page i's first row of each layer/kv. */
static int page_bytes(struct kvp_pool *p, int tier, uint32_t page, uint32_t seq, uint32_t i,
		      int check)
{
	int bad = 0;

	for (uint32_t l = 0; l < 2; l++)
		for (uint32_t kv = 0; kv < 2; kv++) {
			uint8_t *a = kvp_pool_slot_addr(p, tier, l, kv, page, 0);

			if (!a)
				return 1000;
			for (uint32_t b = 0; b < ROW; b++) {
				uint8_t want = (uint8_t)(seq * 41 + i * 13 + l * 7 + kv * 3 + b);

				if (check)
					bad += a[b] != want;
				else
					a[b] = want;
			}
		}
	return bad;
}

static void flush_all(void)
{
	struct kvp_error err;
	struct kvp_client *c = kvp_client_connect(g_d.sock, "admin", &err);

	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	CU_ASSERT_EQUAL(kvp_admin_flush(c, "c", NULL, &err), 0);
	kvp_client_close(c);
}

/* A publishes chain seq of n keys in tier t with its bytes. Returns new pages or -1. */
static int publish(struct h_eng *a, uint32_t seq, uint32_t n, int t)
{
	struct kvp_page_key k[64];
	struct kvp_insert_keys_result r = { .struct_size = sizeof(r) };
	struct kvp_error err;
	uint32_t pages[64];
	uint64_t lease;

	keys_of(seq, k, n);
	if (kvp_lease_alloc(a->p, t, n, &lease, pages, &err) < 0)
		return -1;
	for (uint32_t i = 0; i < n; i++)
		page_bytes(a->p, t, pages[i], seq, i, 0);
	if (kvp_cache_insert_keys(a->p, lease, NS, k, n, 0, pages, n, &r, &err) < 0)
		return -1;
	if (r.lease_pages != 0 || r.done_keys != n || r.new_pages + r.dup_pages != n)
		return -1;
	kvp_lease_free(a->p, lease, NULL, 0, &err); /* ends the (empty) lease */
	return (int)r.new_pages;
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

static int reader(void *arg)
{
	struct h_eng b;
	struct kvp_error err;
	struct kvp_match_keys_result m = { .struct_size = sizeof(m) };
	struct kvp_page_key k[8];
	uint32_t dev[8], host[8];

	(void)arg;
	if (eng_open(&b, "engine-b") < 0)
		return 60;
	keys_of(7, k, 8); /* 6 cached, 8 asked */
	if (kvp_cache_exists_keys(b.p, NS, k, 8, &err) != 6)
		return 61;
	if (kvp_cache_exists_keys(b.p, NS + 1, k, 8, &err) != 0) /* another namespace: misses */
		return 62;
	if (kvp_cache_match_keys(b.p, NS, k, 8, 1, &m, dev, host, 8, &err) < 0 || m.n_device != 6 ||
	    m.matched_keys != 6 || !m.lock_id)
		return 63;
	for (uint32_t i = 0; i < 6; i++)
		if (page_bytes(b.p, KVP_TIER_DEVICE, dev[i], 7, i, 1))
			return 64;
	if (kvp_cache_release(b.p, m.lock_id, &err) < 0 ||
	    kvp_cache_release(b.p, m.lock_id, &err) != -KVP_E_NOT_FOUND)
		return 65;
	/* too small a buffer: the library gives the lock it got back */
	if (kvp_cache_match_keys(b.p, NS, k, 8, 1, &m, dev, host, 2, &err) != -KVP_E_BUFFER)
		return 66;
	if (tier(KVP_TIER_DEVICE).protected_tokens != 0)
		return 67;
	/* a lock left held goes with the session */
	if (kvp_cache_match_keys(b.p, NS, k, 2, 1, &m, dev, host, 8, &err) < 0 || !m.lock_id)
		return 68;
	kvp_client_close(b.c);
	return 0;
}

static void test_keys_insert_in_a_match_in_b_reads_a_bytes(void)
{
	struct h_eng a;

	CU_ASSERT_EQUAL_FATAL(eng_open(&a, "engine-a"), 0);
	CU_ASSERT_EQUAL(publish(&a, 7, 6, KVP_TIER_DEVICE), 6);
	CU_ASSERT_EQUAL(publish(&a, 7, 6, KVP_TIER_DEVICE), 0); /* again: duplicates, freed */
	CU_ASSERT_EQUAL(tier(KVP_TIER_DEVICE).cached_tokens, 6 * PT);
	CU_ASSERT_EQUAL(tier(KVP_TIER_DEVICE).leased_tokens, 0);
	kvp_client_close(a.c);
	CU_ASSERT_EQUAL(h_in_child(reader, NULL), 0);
	CU_ASSERT_EQUAL(tier(KVP_TIER_DEVICE).cached_tokens, 6 * PT); /* outlives its writer */
	CU_ASSERT_EQUAL(tier(KVP_TIER_DEVICE).protected_tokens, 0);
	flush_all();
	CU_ASSERT_EQUAL(tier(KVP_TIER_DEVICE).cached_tokens, 0);
}

static void test_keys_host_chain_loads_to_device(void)
{
	struct h_eng a;
	struct kvp_error err;
	struct kvp_match_keys_result m = { .struct_size = sizeof(m) };
	struct kvp_page_key k[4];
	uint32_t dev[4], host[4];

	CU_ASSERT_EQUAL_FATAL(eng_open(&a, "engine"), 0);
	CU_ASSERT_EQUAL(publish(&a, 9, 4, KVP_TIER_HOST), 4);
	keys_of(9, k, 4);
	CU_ASSERT_EQUAL(kvp_cache_match_keys(a.p, NS, k, 4, 1, &m, dev, host, 4, &err), 0);
	CU_ASSERT_EQUAL(m.n_host, 4);
	CU_ASSERT_EQUAL(kvp_cache_load(a.p, m.lock_id, dev, 4, &err), 4);
	for (uint32_t i = 0; i < 4; i++)
		CU_ASSERT_EQUAL(page_bytes(a.p, KVP_TIER_DEVICE, dev[i], 9, i, 1), 0);
	CU_ASSERT_EQUAL(tier(KVP_TIER_HOST).cached_tokens, 0);
	CU_ASSERT_EQUAL(tier(KVP_TIER_DEVICE).protected_tokens, 4 * PT);
	CU_ASSERT_EQUAL(kvp_cache_release(a.p, m.lock_id, &err), 0);
	kvp_client_close(a.c);
	flush_all();
}

static void test_keys_bad_keys_are_typed_errors(void)
{
	struct h_eng a;
	struct kvp_error err;
	struct kvp_page_key k[2];
	uint8_t big[65] = { 1 };
	uint32_t pages[2];
	uint64_t lease;
	int r;

	CU_ASSERT_EQUAL_FATAL(eng_open(&a, "engine"), 0);
	keys_of(3, k, 2);
	/* 65 bytes: past the library's limit, refused before sending */
	k[1] = (struct kvp_page_key){ big, sizeof(big) };
	r = kvp_cache_exists_keys(a.p, NS, k, 2, &err);
	CU_ASSERT_EQUAL(r, -KVP_E_LIMIT_EXCEEDED);
	CU_ASSERT_EQUAL(err.detail, KVP_DETAIL_LIMIT);
	CU_ASSERT_STRING_EQUAL(err.limit.what, "bytes per key");
	CU_ASSERT_EQUAL(err.limit.limit, KVP_PAGE_KEY_BYTES_MAX);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.message, "65 bytes"));
	/* 49 bytes: past the daemon's max_key_bytes */
	k[1] = (struct kvp_page_key){ big, DAEMON_KEY_BYTES + 1 };
	r = kvp_cache_exists_keys(a.p, NS, k, 2, &err);
	CU_ASSERT_EQUAL(r, -KVP_E_LIMIT_EXCEEDED);
	CU_ASSERT_EQUAL(err.detail, KVP_DETAIL_LIMIT);
	CU_ASSERT_STRING_EQUAL(err.limit.what, "bytes per key");
	CU_ASSERT_EQUAL(err.limit.limit, DAEMON_KEY_BYTES);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.message, "max_key_bytes"));
	CU_ASSERT_EQUAL(kvp_cache_match_keys(a.p, NS, k, 2, 1,
					     (struct kvp_match_keys_result[1]){
						     { .struct_size = sizeof(
							       struct kvp_match_keys_result) } },
					     pages, pages, 2, &err),
			-KVP_E_LIMIT_EXCEEDED);
	k[1] = (struct kvp_page_key){ big, sizeof(big) };
	CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc(a.p, KVP_TIER_DEVICE, 2, &lease, pages, &err), 0);
	CU_ASSERT_EQUAL(kvp_cache_insert_keys(a.p, lease, NS, k, 2, 0, pages, 2, NULL, &err),
			-KVP_E_LIMIT_EXCEEDED);
	k[1] = (struct kvp_page_key){ big, DAEMON_KEY_BYTES + 1 };
	CU_ASSERT_EQUAL(kvp_cache_insert_keys(a.p, lease, NS, k, 2, 0, pages, 2, NULL, &err),
			-KVP_E_LIMIT_EXCEEDED);
	CU_ASSERT_EQUAL(err.limit.limit, DAEMON_KEY_BYTES);
	k[1] = (struct kvp_page_key){ big, 0 };
	CU_ASSERT_EQUAL(kvp_cache_insert_keys(a.p, lease, NS, k, 2, 0, pages, 2, NULL, &err),
			-KVP_E_INVALID_ARGUMENT);
	/* pages that are not the lease's, and a count that does not fit */
	keys_of(3, k, 2);
	CU_ASSERT_EQUAL(kvp_cache_insert_keys(a.p, lease, NS, k, 2, 0,
					      (uint32_t[]){ pages[0], pages[0] }, 2, NULL, &err),
			-KVP_E_NOT_FOUND);
	CU_ASSERT_EQUAL(kvp_cache_insert_keys(a.p, lease, NS, k, 2, 0, pages, 1, NULL, &err),
			-KVP_E_INVALID_ARGUMENT);
	CU_ASSERT_EQUAL(kvp_cache_insert_keys(a.p, lease + 999, NS, k, 2, 0, pages, 2, NULL, &err),
			-KVP_E_NOT_FOUND);
	/* nothing changed: the pages are still leased, nothing cached */
	CU_ASSERT_EQUAL(tier(KVP_TIER_DEVICE).leased_tokens, 2 * PT);
	CU_ASSERT_EQUAL(tier(KVP_TIER_DEVICE).cached_tokens, 0);
	CU_ASSERT_EQUAL(kvp_lease_free(a.p, lease, NULL, 0, &err), 0);
	kvp_client_close(a.c);
}

/* The caller matched keys that are evicted before it inserts the rest: nothing is taken, its
 * pages stay in its lease. */
static void test_keys_insert_after_matched_keys_evicted(void)
{
	struct h_eng a;
	struct kvp_error err;
	struct kvp_page_key k[4];
	struct kvp_insert_keys_result r = { .struct_size = 0 };
	uint32_t pages[2];
	uint64_t lease;

	CU_ASSERT_EQUAL_FATAL(eng_open(&a, "engine"), 0);
	CU_ASSERT_EQUAL(publish(&a, 11, 2, KVP_TIER_DEVICE), 2);
	flush_all();
	keys_of(11, k, 4);
	CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc(a.p, KVP_TIER_DEVICE, 2, &lease, pages, &err), 0);
	/* out's struct_size unset: refused before anything is sent */
	CU_ASSERT_EQUAL(kvp_cache_insert_keys(a.p, lease, NS, k, 4, 2, pages, 2, &r, &err),
			-KVP_E_INVALID_ARGUMENT);
	r.struct_size = sizeof(r);
	CU_ASSERT_EQUAL(kvp_cache_insert_keys(a.p, lease, NS, k, 4, 2, pages, 2, &r, &err), 0);
	CU_ASSERT_EQUAL(r.struct_size, sizeof(r));
	CU_ASSERT_EQUAL(r.done_keys, 0);
	CU_ASSERT_EQUAL(r.new_pages, 0);
	CU_ASSERT_EQUAL(r.lease_pages, 2);
	CU_ASSERT_EQUAL(kvp_cache_exists_keys(a.p, NS, k + 2, 2, &err), 0);
	CU_ASSERT_EQUAL(tier(KVP_TIER_DEVICE).leased_tokens, 2 * PT);
	CU_ASSERT_EQUAL(tier(KVP_TIER_DEVICE).cached_tokens, 0);
	CU_ASSERT_EQUAL(kvp_lease_free(a.p, lease, NULL, 0, &err), 0);
	kvp_client_close(a.c);
}

static void test_keys_a_million_keys_is_limit_exceeded(void)
{
	struct h_eng a;
	struct kvp_error err;
	struct kvp_page_key *k = malloc(1000000 * sizeof(*k));
	static const uint8_t wide[64] = { 7 };
	static const uint8_t one = 7;

	CU_ASSERT_PTR_NOT_NULL_FATAL(k);
	CU_ASSERT_EQUAL_FATAL(eng_open(&a, "engine"), 0);
	for (uint32_t i = 0; i < 1000000; i++)
		k[i] = (struct kvp_page_key){ &one, 1 };
	/* past the library's keys per call, whatever their size: refused before sending */
	CU_ASSERT_EQUAL(kvp_cache_exists_keys(a.p, NS, k, 1000000, &err), -KVP_E_LIMIT_EXCEEDED);
	CU_ASSERT_EQUAL(err.detail, KVP_DETAIL_LIMIT);
	CU_ASSERT_EQUAL(err.limit.limit, KVP_PAGE_KEYS_MAX);
	CU_ASSERT_STRING_EQUAL(err.limit.what, "keys per call");
	for (uint32_t i = 0; i < 1000000; i++)
		k[i] = (struct kvp_page_key){ wide, 32 };
	CU_ASSERT_EQUAL(kvp_cache_match_keys(a.p, NS, k, 1000000, 1,
					     (struct kvp_match_keys_result[1]){
						     { .struct_size = sizeof(
							       struct kvp_match_keys_result) } },
					     NULL, NULL, 0, &err),
			-KVP_E_LIMIT_EXCEEDED);
	CU_ASSERT_EQUAL(err.limit.limit, KVP_PAGE_KEYS_MAX);
	/* within the library's count but past one frame's bytes */
	for (uint32_t i = 0; i < KVP_PAGE_KEYS_MAX; i++)
		k[i] = (struct kvp_page_key){ wide, 64 };
	CU_ASSERT_EQUAL(kvp_cache_exists_keys(a.p, NS, k, KVP_PAGE_KEYS_MAX, &err),
			-KVP_E_LIMIT_EXCEEDED);
	CU_ASSERT_STRING_EQUAL(err.limit.what, "key bytes per call");
	/* past the daemon's max_keys_per_call: the daemon's refusal, its limit named */
	for (uint32_t i = 0; i <= DAEMON_KEYS; i++)
		k[i] = (struct kvp_page_key){ &one, 1 };
	CU_ASSERT_EQUAL(kvp_cache_exists_keys(a.p, NS, k, DAEMON_KEYS + 1, &err),
			-KVP_E_LIMIT_EXCEEDED);
	CU_ASSERT_EQUAL(err.detail, KVP_DETAIL_LIMIT);
	CU_ASSERT_EQUAL(err.limit.limit, DAEMON_KEYS);
	CU_ASSERT_STRING_EQUAL(err.limit.what, "keys per call");
	CU_ASSERT_PTR_NOT_NULL(strstr(err.message, "max_keys_per_call"));
	/* the same session and the daemon keep serving */
	CU_ASSERT_EQUAL(kvp_client_ping(a.c, &err), 0);
	CU_ASSERT_EQUAL(kvp_cache_exists_keys(a.p, NS, k, DAEMON_KEYS, &err), 0);
	kvp_client_close(a.c);
	free(k);
}

/* Token and hash-keyed pages share a namespace: each kind matches its own pages only, a locked
 * page of one kind does not keep the other kind out, and a flush empties both. */
static void test_keys_namespace_kinds_coexist(void)
{
	struct h_eng a, b;
	struct kvp_error err;
	struct kvp_page_key k[2];
	struct kvp_match_result m = { .struct_size = sizeof(m) };
	struct kvp_match_keys_result mk = { .struct_size = sizeof(mk) };
	uint32_t tok[8] = { 1, 2, 3, 4, 5, 6, 7, 8 }, pages[2], dev[2], host[2];
	uint64_t lease, newt = 0;

	CU_ASSERT_EQUAL_FATAL(eng_open(&a, "engine"), 0);
	CU_ASSERT_EQUAL_FATAL(eng_open(&b, "other"), 0);
	/* token pages in namespace 9, keyed pages in namespace 9 and NS */
	CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc(a.p, KVP_TIER_DEVICE, 2, &lease, pages, &err), 0);
	CU_ASSERT_EQUAL(kvp_cache_insert(a.p, lease, 9, tok, 8, 0, pages, 2, &newt, &err), 0);
	CU_ASSERT_EQUAL(newt, 8);
	keys_of(1, k, 2);
	CU_ASSERT_EQUAL(kvp_cache_exists_keys(a.p, 9, k, 2, &err), 0);
	CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc(a.p, KVP_TIER_DEVICE, 2, &lease, pages, &err), 0);
	CU_ASSERT_EQUAL(kvp_cache_insert_keys(a.p, lease, 9, k, 2, 0, pages, 2, NULL, &err), 0);
	CU_ASSERT_EQUAL(kvp_cache_exists_keys(a.p, 9, k, 2, &err), 2);
	CU_ASSERT_EQUAL(publish(&a, 1, 2, KVP_TIER_DEVICE), 2);
	/* a locked keyed page in namespace 9 keeps no token call out of it, in another session */
	CU_ASSERT_EQUAL(kvp_cache_match_keys(a.p, 9, k, 2, 1, &mk, dev, host, 2, &err), 0);
	CU_ASSERT_EQUAL(mk.matched_keys, 2);
	CU_ASSERT_EQUAL(kvp_cache_match(b.p, 9, tok, 8, 0, &m, dev, host, 2, &err), 0);
	CU_ASSERT_EQUAL(m.matched_tokens, 8);
	/* each kind matches only its own: no token pages in NS */
	CU_ASSERT_EQUAL(kvp_cache_match(b.p, NS, tok, 8, 0, &m, dev, host, 2, &err), 0);
	CU_ASSERT_EQUAL(m.matched_tokens, 0);
	CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc(b.p, KVP_TIER_DEVICE, 2, &lease, pages, &err), 0);
	CU_ASSERT_EQUAL(kvp_cache_insert(b.p, lease, NS, tok, 8, 0, pages, 2, &newt, &err), 0);
	CU_ASSERT_EQUAL(newt, 8);
	CU_ASSERT_EQUAL(kvp_cache_release(a.p, mk.lock_id, &err), 0);
	kvp_client_close(a.c);
	kvp_client_close(b.c);
	/* a flush empties both kinds */
	flush_all();
	CU_ASSERT_EQUAL_FATAL(eng_open(&a, "engine"), 0);
	CU_ASSERT_EQUAL(kvp_cache_exists_keys(a.p, 9, k, 2, &err), 0);
	CU_ASSERT_EQUAL(kvp_cache_match(a.p, 9, tok, 8, 0, &m, dev, host, 2, &err), 0);
	CU_ASSERT_EQUAL(m.matched_tokens, 0);
	kvp_client_close(a.c);
}

static void test_keys_leasing_every_page_evicts_keyed_pages(void)
{
	struct h_eng a;
	struct kvp_error err;
	struct kvp_page_key k[8];
	uint32_t pages[DEV_PAGES];
	uint64_t lease;

	CU_ASSERT_EQUAL_FATAL(eng_open(&a, "engine"), 0);
	CU_ASSERT_EQUAL(publish(&a, 4, 8, KVP_TIER_DEVICE), 8);
	CU_ASSERT_EQUAL(tier(KVP_TIER_DEVICE).evictable_tokens, 8 * PT);
	CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc(a.p, KVP_TIER_DEVICE, DEV_PAGES, &lease, pages, &err),
			      0);
	/* the chain was demoted to host pages, bytes kept */
	CU_ASSERT_EQUAL(tier(KVP_TIER_DEVICE).cached_tokens, 0);
	CU_ASSERT_EQUAL(tier(KVP_TIER_HOST).cached_tokens, 8 * PT);
	keys_of(4, k, 8);
	CU_ASSERT_EQUAL(kvp_cache_exists_keys(a.p, NS, k, 8, &err), 8);
	CU_ASSERT_EQUAL(kvp_lease_free(a.p, lease, NULL, 0, &err), 0);
	kvp_client_close(a.c);
	flush_all();
	CU_ASSERT_EQUAL(tier(KVP_TIER_HOST).cached_tokens, 0);
	CU_ASSERT_EQUAL(tier(KVP_TIER_DEVICE).free_tokens, DEV_PAGES * PT);
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_keys_insert_in_a_match_in_b_reads_a_bytes),
		H_TEST(test_keys_host_chain_loads_to_device),
		H_TEST(test_keys_bad_keys_are_typed_errors),
		H_TEST(test_keys_insert_after_matched_keys_evicted),
		H_TEST(test_keys_a_million_keys_is_limit_exceeded),
		H_TEST(test_keys_namespace_kinds_coexist),
		H_TEST(test_keys_leasing_every_page_evicts_keyed_pages),
	};

	return H_RUN_SUITE("keys", init_suite, clean_suite, tests);
}
