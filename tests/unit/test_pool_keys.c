/* test_pool_keys.c - the pool with both caches: token-keyed and hash-keyed pages share the page
 * books (kvp_pool_check covers the key cache too), the namespace rule, eviction that takes from
 * both caches, and loading a locked key run that must evict token-keyed pages to make room. */
#include <CUnit/Basic.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "config.h"
#include "pool.h"
#include "pool_cache.h"
#include "suite.h"

/* 16 device pages, 8 host pages of 4 tokens */
static const char *const g_conf = "[pool.u]\nlayers = 2\nkv_heads = 1\nhead_dim = 4\n"
				  "dtype = fp16\npage_tokens = 4\ndevice = sim\n"
				  "device_capacity = 64t\nhost_capacity = 32t\nmlock = off\n";
enum { PT = 4 };

static struct kvpd_pool *make_pool(void)
{
	static struct kvp_conf c;
	struct kvp_fail f = { 0 };
	char err[256];

	if (kvp_conf_load_string(&c, g_conf, "test", err, sizeof(err)) < 0)
		return NULL;
	return kvp_pool_create(&c.pools[0], 0, &f);
}

static uint8_t g_kb[32][8];
static void keys_of(int seq, struct kvp_key *k, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++) {
		memset(g_kb[i], seq * 16 + (int)i, 8);
		k[i] = (struct kvp_key){ 8, g_kb[i] };
	}
}

/* Publishes n pages of tier under keys (seq) in ns, the lease's own page array passed as the
 * pages; the first `cached` keys are published already, then `dups` more. */
static void put_keys_as(struct kvpd_pool *p, int tier, uint64_t ns, int seq, uint32_t n,
			uint32_t dups)
{
	struct kvp_fail f;
	struct kvp_key k[32];
	struct kvp_lease *l;
	uint32_t nw = 0, dup = 0, done = 0;

	kvp_fail_init(&f);
	keys_of(seq, k, n);
	l = kvp_lease_create(p, tier, 100 + (uint64_t)seq, n, &f);
	CU_ASSERT_PTR_NOT_NULL_FATAL(l);
	CU_ASSERT_EQUAL(kvp_lease_insert_keys(l, ns, k, n, 0, l->pages, n, &nw, &dup, &done, &f),
			0);
	CU_ASSERT_EQUAL(nw, n - dups);
	CU_ASSERT_EQUAL(dup, dups);
	CU_ASSERT_EQUAL(l->n, 0);
	CU_ASSERT_EQUAL(kvp_lease_check(l), 0);
	CU_ASSERT_EQUAL(kvp_pool_check(p), 0);
	kvp_lease_destroy(l);
}

static void put_keys(struct kvpd_pool *p, int tier, uint64_t ns, int seq, uint32_t n)
{
	put_keys_as(p, tier, ns, seq, n, 0);
}

/* Publishes n token pages of tier in ns. */
static void put_tokens(struct kvpd_pool *p, int tier, uint64_t ns, uint32_t seq, uint32_t n)
{
	struct kvp_fail f;
	struct kvp_lease *l;
	uint32_t tok[64 * PT];
	uint64_t nt = 0, dt = 0;

	kvp_fail_init(&f);
	for (uint32_t i = 0; i < n * PT; i++)
		tok[i] = seq * 1000 + i;
	l = kvp_lease_create(p, tier, 200 + seq, n, &f);
	CU_ASSERT_PTR_NOT_NULL_FATAL(l);
	CU_ASSERT_EQUAL(kvp_lease_insert(l, ns, tok, n * PT, 0, l->pages, n, &nt, &dt, &f), 0);
	CU_ASSERT_EQUAL(nt, (uint64_t)n * PT);
	kvp_lease_destroy(l);
}

static void test_kvp_pool_keys_share_the_books(void)
{
	struct kvpd_pool *p = make_pool();
	struct kvp_tier_counts c;
	struct kvp_key k[4];
	struct kvp_index_match m;
	uint32_t dev[4], host[4];

	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	put_tokens(p, KVP_TIER_ID_DEVICE, 1, 1, 3);
	put_keys(p, KVP_TIER_ID_DEVICE, 2, 1, 2);
	put_keys_as(p, KVP_TIER_ID_DEVICE, 2, 1, 4, 2); /* two duplicates freed, two taken */
	CU_ASSERT_EQUAL(kvp_pool_check(p), 0);
	kvp_pool_counts(p, KVP_TIER_ID_DEVICE, &c);
	CU_ASSERT_EQUAL(c.cached, 7);
	CU_ASSERT_EQUAL(c.evictable, 7);
	CU_ASSERT_EQUAL(c.free + c.leased + c.cached, c.total);
	/* both kinds in one namespace: token pages of namespace 1 beside keyed pages there */
	put_keys(p, KVP_TIER_ID_DEVICE, 1, 1, 1);
	keys_of(1, k, 1);
	CU_ASSERT_EQUAL(kvp_pool_match_keys(p, 1, k, 1, false, &m, dev, host), 0);
	CU_ASSERT_EQUAL(m.dev_pages, 1);
	CU_ASSERT_EQUAL(kvp_pool_check(p), 0);
	/* a lock counts as protected in the pool's figures */
	keys_of(1, k, 4);
	CU_ASSERT_EQUAL(kvp_pool_match_keys(p, 2, k, 4, true, &m, dev, host), 0);
	kvp_pool_counts(p, KVP_TIER_ID_DEVICE, &c);
	CU_ASSERT_EQUAL(c.protected_, 4);
	CU_ASSERT_EQUAL(c.evictable, 4);
	kvp_pool_unlock(p, m.lock);
	/* flush empties both caches */
	CU_ASSERT_EQUAL(kvp_pool_flush(p), 8);
	CU_ASSERT_EQUAL(kvp_pool_check(p), 0);
	kvp_pool_destroy(p);
}

/* A keyed page freed behind the key cache's back: the pool's check sees it. */
static void test_kvp_pool_check_covers_the_key_cache(void)
{
	struct kvpd_pool *p = make_pool();
	struct kvp_key k[2];
	struct kvp_index_match m;
	uint32_t dev[2], host[2];

	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	put_keys(p, KVP_TIER_ID_DEVICE, 2, 3, 2);
	CU_ASSERT_EQUAL(kvp_pool_check(p), 0);
	keys_of(3, k, 2);
	CU_ASSERT_EQUAL(kvp_pool_match_keys(p, 2, k, 2, false, &m, dev, host), 0);
	CU_ASSERT_EQUAL_FATAL(m.dev_pages, 2);
	CU_ASSERT_EQUAL(kvp_pages_release(p->pages[KVP_TIER_ID_DEVICE], &dev[1], 1), 0);
	CU_ASSERT_EQUAL(kvp_pool_check(p), -EFAULT);
	/* put it back as it was, so the pool can go */
	CU_ASSERT_EQUAL(kvp_pages_alloc(p->pages[KVP_TIER_ID_DEVICE], 1, &dev[0]), 0);
	kvp_pages_move(p->pages[KVP_TIER_ID_DEVICE], dev[0], KVP_PAGE_LEASED, KVP_PAGE_CACHED);
	CU_ASSERT_EQUAL(dev[0], dev[1]);
	CU_ASSERT_EQUAL(kvp_pool_check(p), 0);
	kvp_pool_destroy(p);
}

static void test_kvp_pool_evict_takes_from_both(void)
{
	struct kvpd_pool *p = make_pool();
	struct kvp_tier_counts c;
	struct kvp_index_stats ks;
	struct kvp_fail f;
	struct kvp_lease *l;

	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	put_tokens(p, KVP_TIER_ID_DEVICE, 1, 1, 8);
	put_keys(p, KVP_TIER_ID_DEVICE, 2, 1, 8);
	kvp_fail_init(&f);
	/* 16 device pages, all cached in one index: a lease of 8 demotes the 8 least recently
	 * used, the token pages inserted first, whatever their kind */
	l = kvp_lease_create(p, KVP_TIER_ID_DEVICE, 9, 8, &f);
	CU_ASSERT_PTR_NOT_NULL_FATAL(l);
	kvp_index_stats(p->ix, &ks);
	CU_ASSERT_EQUAL(ks.cached_pages[KVP_TIER_ID_DEVICE], 8);
	CU_ASSERT_EQUAL(ks.demoted_pages, 8);
	CU_ASSERT_EQUAL(ks.token_entries, 8);
	kvp_pool_counts(p, KVP_TIER_ID_HOST, &c);
	CU_ASSERT_EQUAL(c.cached, 8);
	CU_ASSERT_EQUAL(kvp_pool_check(p), 0);
	kvp_lease_destroy(l);
	kvp_pool_destroy(p);
}

/* Loading a host-resident key run into a device tier full of token-keyed pages evicts those. */
static void test_kvp_pool_keys_load_makes_room(void)
{
	struct kvpd_pool *p = make_pool();
	struct kvp_key k[4];
	struct kvp_index_match m;
	uint32_t dev[4], host[4], out[4], n = 0, promoted = 0;

	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	put_keys(p, KVP_TIER_ID_HOST, 2, 5, 4);
	put_tokens(p, KVP_TIER_ID_DEVICE, 1, 1, 16);
	keys_of(5, k, 4);
	CU_ASSERT_EQUAL(kvp_pool_match_keys(p, 2, k, 4, true, &m, dev, host), 0);
	CU_ASSERT_EQUAL(m.host_pages, 4);
	CU_ASSERT_EQUAL(kvp_pool_load(p, m.lock, out, 4, &n, &promoted), 0);
	CU_ASSERT_EQUAL(n, 4);
	CU_ASSERT_EQUAL(promoted, 4);
	CU_ASSERT_EQUAL(kvp_pool_check(p), 0);
	/* loaded again: nothing to copy */
	CU_ASSERT_EQUAL(kvp_pool_load(p, m.lock, out, 4, &n, &promoted), 0);
	CU_ASSERT_EQUAL(promoted, 0);
	kvp_pool_unlock(p, m.lock);
	CU_ASSERT_EQUAL(kvp_pool_check(p), 0);
	kvp_pool_destroy(p);
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_kvp_pool_keys_share_the_books),
		H_TEST(test_kvp_pool_check_covers_the_key_cache),
		H_TEST(test_kvp_pool_evict_takes_from_both),
		H_TEST(test_kvp_pool_keys_load_makes_room),
	};

	return H_RUN_SUITE("pool_keys", NULL, NULL, tests);
}
