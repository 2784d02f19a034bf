/* test_index.c - the hash-keyed page cache: insert and duplicates, longest leading run,
 * exists, namespaces, eviction order (leaves first, LRU with a second pass for matched entries),
 * a chain whose parent was evicted, locks, demotion and promotion with a copy callback that
 * moves page bytes between in-memory tiers, flush, and the books after every step. */
#include <CUnit/Basic.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "index.h"
#include "pages.h"
#include "suite.h"

#define DEV KVP_TIER_ID_DEVICE
#define HOST KVP_TIER_ID_HOST
#define PB 8 /* bytes per page in the fake tiers */

struct fix {
	struct kvp_pages *pg[KVP_TIER_ID_MAX];
	uint8_t *mem[KVP_TIER_ID_MAX];
	struct kvp_index *kc;
	int copies, fail_copy;
};

static int copy_fn(void *ctx, enum kvp_copy_dir dir, const uint32_t *src, const uint32_t *dst,
		   uint32_t n)
{
	struct fix *x = ctx;
	int from = dir == KVP_COPY_DEMOTE ? DEV : HOST, to = dir == KVP_COPY_DEMOTE ? HOST : DEV;

	if (x->fail_copy)
		return -EIO;
	for (uint32_t i = 0; i < n; i++)
		memcpy(x->mem[to] + (size_t)dst[i] * PB, x->mem[from] + (size_t)src[i] * PB, PB);
	x->copies++;
	return 0;
}

static void fix_init(struct fix *x, uint32_t ndev, uint32_t nhost)
{
	uint32_t n[KVP_TIER_ID_MAX] = { ndev, nhost };

	memset(x, 0, sizeof(*x));
	for (int t = 0; t < KVP_TIER_ID_MAX; t++) {
		if (!n[t])
			continue;
		x->pg[t] = kvp_pages_new(n[t]);
		x->mem[t] = calloc(n[t], PB);
		CU_ASSERT_FATAL(x->pg[t] && x->mem[t]);
	}
	x->kc = kvp_index_new(&(struct kvp_index_conf){ x->pg[DEV], x->pg[HOST], copy_fn, x, NULL,
							0, KVP_EVICT_POLICY_LRU, false });
	CU_ASSERT_FATAL(x->kc != NULL);
}

static void fix_done(struct fix *x)
{
	CU_ASSERT_EQUAL(kvp_index_check(x->kc), 0);
	kvp_index_free(x->kc);
	for (int t = 0; t < KVP_TIER_ID_MAX; t++) {
		kvp_pages_free(x->pg[t]);
		free(x->mem[t]);
	}
}

/* Key "c<i>" of chain c, as engines fold parents in: distinct per position. */
static uint8_t g_kb[4096][16];
static struct kvp_key key(int chain, int i)
{
	static int next;
	uint8_t *b = g_kb[next++ % 4096];
	int len = snprintf((char *)b, 16, "%c%d", 'a' + chain, i);

	return (struct kvp_key){ (size_t)len, b };
}

static void chain(struct kvp_key *out, int c, int n)
{
	for (int i = 0; i < n; i++)
		out[i] = key(c, i);
}

/* Leases n pages of tier, writes a byte pattern into each, inserts keys[cached .. n). */
static struct kvp_index_insert_result put(struct fix *x, uint64_t ns, const struct kvp_key *k,
					  uint32_t n, uint32_t cached, int tier, uint8_t pat)
{
	struct kvp_index_insert_result r = { 0 };
	uint32_t pages[64], dup[64];

	CU_ASSERT_FATAL(n - cached <= 64);
	if (n > cached) {
		CU_ASSERT_FATAL(kvp_pages_alloc(x->pg[tier], n - cached, pages) == 0);
		for (uint32_t i = 0; i < n - cached; i++)
			memset(x->mem[tier] + (size_t)pages[i] * PB, pat + (int)i, PB);
	}
	CU_ASSERT_EQUAL_FATAL(kvp_index_insert(x->kc, ns, k, n, cached, tier, pages, &r, dup), 0);
	for (uint32_t i = 0; i < r.dup_pages; i++)
		kvp_pages_release(x->pg[tier], &pages[dup[i]], 1);
	for (uint32_t i = r.done_keys > cached ? r.done_keys - cached : 0; i < n - cached; i++)
		kvp_pages_release(x->pg[tier], &pages[i], 1); /* past a lost key: the caller's */
	CU_ASSERT_EQUAL(kvp_index_check(x->kc), 0);
	return r;
}

static uint32_t matched(struct fix *x, uint64_t ns, const struct kvp_key *k, uint32_t n)
{
	struct kvp_index_match m;
	uint32_t dev[64], host[64];

	CU_ASSERT_EQUAL_FATAL(kvp_index_match(x->kc, ns, k, n, 0, &m, dev, host), 0);
	return m.dev_pages + m.host_pages;
}

static void test_kvp_index_insert_match_run(void)
{
	struct fix x;
	struct kvp_key k[8], other[4];
	struct kvp_index_insert_result r;
	struct kvp_index_match m;
	uint32_t dev[8], host[8];

	fix_init(&x, 16, 0);
	chain(k, 0, 8);
	r = put(&x, 1, k, 5, 0, DEV, 10);
	CU_ASSERT_EQUAL(r.new_pages, 5);
	CU_ASSERT_EQUAL(r.dup_pages, 0);
	CU_ASSERT_EQUAL(r.done_keys, 5);
	/* longest leading run: 5 of the 8 asked */
	CU_ASSERT_EQUAL(kvp_index_match(x.kc, 1, k, 8, 0, &m, dev, host), 0);
	CU_ASSERT_EQUAL(m.dev_pages, 5);
	CU_ASSERT_EQUAL(m.host_pages, 0);
	CU_ASSERT_PTR_NULL(m.lock);
	for (int i = 0; i < 5; i++)
		CU_ASSERT_EQUAL(x.mem[DEV][dev[i] * PB], 10 + i);
	CU_ASSERT_EQUAL(kvp_index_exists(x.kc, 1, k, 8), 5);
	/* a missing first key: nothing, even with later keys present */
	chain(other, 1, 1);
	other[1] = k[1];
	CU_ASSERT_EQUAL(kvp_index_exists(x.kc, 1, other, 2), 0);
	/* another namespace sees none of it */
	CU_ASSERT_EQUAL(kvp_index_exists(x.kc, 2, k, 5), 0);
	CU_ASSERT_TRUE(kvp_index_has_ns(x.kc, 1));
	CU_ASSERT_FALSE(kvp_index_has_ns(x.kc, 2));
	/* extend the chain: the first 5 are the caller's match, 3 new pages, one duplicate */
	r = put(&x, 1, k, 8, 5, DEV, 50);
	CU_ASSERT_EQUAL(r.new_pages, 3);
	r = put(&x, 1, k, 8, 6, DEV, 60);
	CU_ASSERT_EQUAL(r.new_pages, 0);
	CU_ASSERT_EQUAL(r.dup_pages, 2);
	CU_ASSERT_EQUAL(matched(&x, 1, k, 8), 8);
	CU_ASSERT_EQUAL(kvp_pages_count(x.pg[DEV], KVP_PAGE_CACHED), 8);
	CU_ASSERT_EQUAL(kvp_pages_count(x.pg[DEV], KVP_PAGE_LEASED), 0);
	fix_done(&x);
}

/* A chain whose entries are not consecutive (inserted in pieces between other chains, in another
 * namespace with the same key bytes, over freed entries) is still matched in full, and only it. */
static void test_kvp_index_match_chain_not_consecutive(void)
{
	struct fix x;
	struct kvp_key a[6], b[3];

	fix_init(&x, 32, 0);
	chain(a, 0, 6);
	chain(b, 1, 3);
	put(&x, 0, a, 2, 0, DEV, 1);
	put(&x, 1, a, 3, 0, DEV, 1); /* the same bytes in namespace 1, right after a1 */
	put(&x, 0, b, 3, 0, DEV, 1);
	put(&x, 0, a, 4, 2, DEV, 1);
	CU_ASSERT_EQUAL(kvp_index_exists(x.kc, 0, a, 6), 4);
	CU_ASSERT_EQUAL(kvp_index_exists(x.kc, 1, a, 6), 3);
	CU_ASSERT_EQUAL(kvp_index_exists(x.kc, 0, b, 3), 3);
	/* namespace 1's chain goes; its entries are reused by a new chain of namespace 0 */
	CU_ASSERT_EQUAL(kvp_index_evict(x.kc, DEV, 3 + 3 + 4), 10);
	CU_ASSERT_EQUAL(kvp_index_exists(x.kc, 1, a, 3), 0);
	put(&x, 0, a, 6, 0, DEV, 1);
	put(&x, 0, b, 3, 0, DEV, 1);
	CU_ASSERT_EQUAL(kvp_index_exists(x.kc, 0, a, 6), 6);
	CU_ASSERT_EQUAL(kvp_index_exists(x.kc, 0, b, 3), 3);
	CU_ASSERT_EQUAL(matched(&x, 0, a, 6), 6);
	fix_done(&x);
}

static void test_kvp_index_insert_bad(void)
{
	struct fix x;
	struct kvp_key k[2];
	uint8_t big[65] = { 0 };
	uint32_t pg[2];

	fix_init(&x, 4, 0);
	chain(k, 0, 2);
	CU_ASSERT_EQUAL(kvp_pages_alloc(x.pg[DEV], 2, pg), 0);
	/* a key of 65 bytes and one of 0 bytes */
	k[1] = (struct kvp_key){ 65, big };
	CU_ASSERT_EQUAL(kvp_index_insert(x.kc, 0, k, 2, 0, DEV, pg, NULL, NULL), -EINVAL);
	k[1] = (struct kvp_key){ 0, big };
	CU_ASSERT_EQUAL(kvp_index_insert(x.kc, 0, k, 2, 0, DEV, pg, NULL, NULL), -EINVAL);
	chain(k, 0, 2);
	/* a page listed twice, a page not leased, no host tier */
	pg[1] = pg[0];
	CU_ASSERT_EQUAL(kvp_index_insert(x.kc, 0, k, 2, 0, DEV, pg, NULL, NULL), -EINVAL);
	pg[1] = 3;
	CU_ASSERT_EQUAL(kvp_index_insert(x.kc, 0, k, 2, 0, DEV, pg, NULL, NULL), -EINVAL);
	CU_ASSERT_EQUAL(kvp_index_insert(x.kc, 0, k, 2, 0, HOST, pg, NULL, NULL), -EINVAL);
	CU_ASSERT_EQUAL(kvp_index_insert(x.kc, 0, k, 1, 2, DEV, pg, NULL, NULL), -EINVAL);
	/* nothing changed */
	CU_ASSERT_EQUAL(kvp_pages_count(x.pg[DEV], KVP_PAGE_CACHED), 0);
	CU_ASSERT_EQUAL(kvp_pages_count(x.pg[DEV], KVP_PAGE_LEASED), 2);
	CU_ASSERT_FALSE(kvp_index_has_ns(x.kc, 0));
	kvp_pages_release(x.pg[DEV], pg, 1);
	fix_done(&x);
}

static void test_kvp_index_evict_leaves_first_lru(void)
{
	struct fix x;
	struct kvp_key a[3], b[1], c[1];
	struct kvp_index_stats st;

	fix_init(&x, 8, 0);
	chain(b, 1, 1);
	chain(a, 0, 3);
	chain(c, 2, 1);
	put(&x, 0, b, 1, 0, DEV, 1); /* oldest */
	put(&x, 0, a, 3, 0, DEV, 2); /* a0 <- a1 <- a2 */
	put(&x, 0, c, 1, 0, DEV, 3);
	kvp_index_stats(x.kc, &st);
	CU_ASSERT_EQUAL(st.evictable_pages[DEV], 5);
	/* c matched: it gets a second pass */
	CU_ASSERT_EQUAL(matched(&x, 0, c, 1), 1);
	CU_ASSERT_EQUAL(kvp_index_evict(x.kc, DEV, 1), 1);
	CU_ASSERT_EQUAL(kvp_index_exists(x.kc, 0, b, 1), 0);
	CU_ASSERT_EQUAL(kvp_index_check(x.kc), 0);
	/* next the leaf a2, never a0 or a1 while a child is cached */
	CU_ASSERT_EQUAL(kvp_index_evict(x.kc, DEV, 1), 1);
	CU_ASSERT_EQUAL(kvp_index_exists(x.kc, 0, a, 3), 2);
	CU_ASSERT_EQUAL(kvp_index_exists(x.kc, 0, c, 1), 1);
	CU_ASSERT_EQUAL(kvp_index_evict(x.kc, DEV, 2), 2);
	CU_ASSERT_EQUAL(kvp_index_exists(x.kc, 0, a, 3), 0);
	CU_ASSERT_EQUAL(kvp_index_exists(x.kc, 0, c, 1), 1);
	CU_ASSERT_EQUAL(kvp_index_check(x.kc), 0);
	CU_ASSERT_EQUAL(kvp_index_evict(x.kc, DEV, 5), 1);
	CU_ASSERT_EQUAL(kvp_pages_count(x.pg[DEV], KVP_PAGE_FREE), 8);
	kvp_index_stats(x.kc, &st);
	CU_ASSERT_EQUAL(st.entries, 0);
	CU_ASSERT_EQUAL(st.namespaces, 0);
	CU_ASSERT_EQUAL(st.evicted_pages[DEV], 5);
	fix_done(&x);
}

static void test_kvp_index_insert_parent_evicted(void)
{
	struct fix x;
	struct kvp_key k[4];
	struct kvp_index_insert_result r;

	fix_init(&x, 8, 0);
	chain(k, 0, 4);
	put(&x, 0, k, 2, 0, DEV, 1);
	CU_ASSERT_EQUAL(kvp_index_evict(x.kc, DEV, 2), 2);
	/* the caller matched k0, k1 before; they are gone: nothing is taken */
	r = put(&x, 0, k, 4, 2, DEV, 5);
	CU_ASSERT_EQUAL(r.done_keys, 0);
	CU_ASSERT_EQUAL(r.new_pages, 0);
	CU_ASSERT_EQUAL(kvp_pages_count(x.pg[DEV], KVP_PAGE_CACHED), 0);
	CU_ASSERT_EQUAL(kvp_index_exists(x.kc, 0, k + 2, 2), 0);
	/* a chain inserted from its third key on (its parents evicted): found from there only */
	r = put(&x, 0, k + 2, 2, 0, DEV, 5);
	CU_ASSERT_EQUAL(r.new_pages, 2);
	CU_ASSERT_EQUAL(kvp_index_exists(x.kc, 0, k, 4), 0);
	CU_ASSERT_EQUAL(kvp_index_exists(x.kc, 0, k + 2, 2), 2);
	fix_done(&x);
}

static void test_kvp_index_lock_pins(void)
{
	struct fix x;
	struct kvp_key k[3];
	struct kvp_index_match m, m2;
	struct kvp_index_stats st;
	uint32_t dev[3], host[3];

	fix_init(&x, 4, 0);
	chain(k, 0, 3);
	put(&x, 0, k, 3, 0, DEV, 1);
	CU_ASSERT_EQUAL(kvp_index_match(x.kc, 0, k, 2, 1, &m, dev, host), 0);
	CU_ASSERT_PTR_NOT_NULL_FATAL(m.lock);
	CU_ASSERT_EQUAL(kvp_index_lock_pages(m.lock), 2);
	CU_ASSERT_EQUAL(kvp_index_match(x.kc, 0, k, 1, 1, &m2, dev, host), 0);
	kvp_index_stats(x.kc, &st);
	CU_ASSERT_EQUAL(st.protected_pages[DEV], 2);
	CU_ASSERT_EQUAL(st.evictable_pages[DEV], 1);
	CU_ASSERT_EQUAL(kvp_index_check(x.kc), 0);
	/* only the unlocked leaf can go */
	CU_ASSERT_EQUAL(kvp_index_evict(x.kc, DEV, 3), 1);
	CU_ASSERT_EQUAL(kvp_index_flush(x.kc), 0);
	CU_ASSERT_EQUAL(kvp_index_exists(x.kc, 0, k, 3), 2);
	kvp_index_unlock(x.kc, m.lock);
	CU_ASSERT_EQUAL(kvp_index_check(x.kc), 0);
	/* k0 still pinned by the second lock: k1 goes, k0 stays */
	CU_ASSERT_EQUAL(kvp_index_flush(x.kc), 1);
	CU_ASSERT_EQUAL(kvp_index_exists(x.kc, 0, k, 3), 1);
	kvp_index_unlock(x.kc, m2.lock);
	CU_ASSERT_EQUAL(kvp_index_flush(x.kc), 1);
	CU_ASSERT_EQUAL(kvp_pages_count(x.pg[DEV], KVP_PAGE_FREE), 4);
	/* an empty match takes no lock */
	CU_ASSERT_EQUAL(kvp_index_match(x.kc, 0, k, 3, 1, &m, dev, host), 0);
	CU_ASSERT_PTR_NULL(m.lock);
	fix_done(&x);
}

static void test_kvp_index_demote_promote(void)
{
	struct fix x;
	struct kvp_key k[3];
	struct kvp_index_match m;
	struct kvp_index_stats st;
	uint32_t dev[3], host[3], out[3], n = 0;

	fix_init(&x, 3, 4);
	chain(k, 0, 3);
	put(&x, 0, k, 3, 0, DEV, 20);
	/* device pages go leaves first, demoted: the bytes follow */
	CU_ASSERT_EQUAL(kvp_index_evict(x.kc, DEV, 2), 2);
	CU_ASSERT_EQUAL(kvp_index_match(x.kc, 0, k, 3, 1, &m, dev, host), 0);
	CU_ASSERT_EQUAL(m.dev_pages, 1);
	CU_ASSERT_EQUAL(m.host_pages, 2);
	CU_ASSERT_EQUAL(x.mem[DEV][dev[0] * PB], 20);
	CU_ASSERT_EQUAL(x.mem[HOST][host[0] * PB], 21);
	CU_ASSERT_EQUAL(x.mem[HOST][host[1] * PB], 22);
	kvp_index_stats(x.kc, &st);
	CU_ASSERT_EQUAL(st.demoted_pages, 2);
	CU_ASSERT_EQUAL(st.cached_pages[HOST], 2);
	/* promotion back: device ids of the whole run, bytes intact */
	CU_ASSERT_EQUAL(kvp_index_promote(x.kc, m.lock, out, 3, &n), 0);
	CU_ASSERT_EQUAL(n, 3);
	for (int i = 0; i < 3; i++)
		CU_ASSERT_EQUAL(x.mem[DEV][out[i] * PB], 20 + i);
	CU_ASSERT_EQUAL(kvp_pages_count(x.pg[HOST], KVP_PAGE_CACHED), 0);
	CU_ASSERT_EQUAL(kvp_index_check(x.kc), 0);
	kvp_index_unlock(x.kc, m.lock);
	/* a failed copy demotes nothing; a leaf is then dropped */
	x.fail_copy = 1;
	CU_ASSERT_EQUAL(kvp_index_evict(x.kc, DEV, 1), 1);
	CU_ASSERT_EQUAL(kvp_index_exists(x.kc, 0, k, 3), 2);
	x.fail_copy = 0;
	/* host eviction: only leaves */
	CU_ASSERT_EQUAL(kvp_index_evict(x.kc, DEV, 2), 2);
	CU_ASSERT_EQUAL(kvp_index_evict(x.kc, HOST, 1), 1);
	CU_ASSERT_EQUAL(kvp_index_exists(x.kc, 0, k, 3), 1);
	CU_ASSERT_EQUAL(kvp_index_check(x.kc), 0);
	fix_done(&x);
}

/* The asynchronous seam: copy_start records the flight (and copies at once, so the bytes can
 * be checked when it lands); start_rc says what it returns. */
static struct kvp_index_flight *g_fl;
static uint32_t g_fl_n;
static int g_start_rc = 1;

static int copy_start_fn(void *ctx, const uint32_t *src, const uint32_t *dst, uint32_t n,
			 struct kvp_index_flight *fl)
{
	if (g_start_rc < 0)
		return g_start_rc;
	CU_ASSERT_EQUAL(copy_fn(ctx, KVP_COPY_DEMOTE, src, dst, n), 0);
	g_fl = fl;
	g_fl_n = n;
	return g_start_rc;
}

static void fix_init_async(struct fix *x, uint32_t ndev, uint32_t nhost)
{
	fix_init(x, ndev, nhost);
	kvp_index_free(x->kc);
	x->kc = kvp_index_new(&(struct kvp_index_conf){ x->pg[DEV], x->pg[HOST], copy_fn, x,
							copy_start_fn, 0, KVP_EVICT_POLICY_LRU,
							false });
	CU_ASSERT_FATAL(x->kc != NULL);
	g_fl = NULL;
	g_fl_n = 0;
	g_start_rc = 1;
}

/* A demotion in flight: the device entries stay matched as device pages and protected, the host
 * destinations are MOVING; once it lands the entries are host pages with the bytes. */
static void test_kvp_index_evict_later_lands(void)
{
	struct fix x;
	struct kvp_key k[3], k2[2];
	struct kvp_index_match m;
	struct kvp_index_stats st;
	uint32_t dev[3], host[3];

	fix_init_async(&x, 3, 4);
	chain(k, 0, 3);
	put(&x, 0, k, 3, 0, DEV, 30);
	/* the whole chain in one copy: each parent goes once its children are in flight */
	CU_ASSERT_EQUAL(kvp_index_evict_later(x.kc, DEV, 3), 0); /* started, not freed yet */
	CU_ASSERT_PTR_NOT_NULL_FATAL(g_fl);
	CU_ASSERT_EQUAL(g_fl_n, 3);
	kvp_index_stats(x.kc, &st);
	CU_ASSERT_EQUAL(st.flights, 1);
	CU_ASSERT_EQUAL(st.inflight_pages, 3);
	CU_ASSERT_EQUAL(st.moving_pages, 3);
	CU_ASSERT_EQUAL(st.cached_pages[DEV], 3);
	CU_ASSERT_EQUAL(st.protected_pages[DEV], 3);
	CU_ASSERT_EQUAL(st.evictable_pages[DEV], 0);
	CU_ASSERT_EQUAL(kvp_pages_count(x.pg[HOST], KVP_PAGE_MOVING), 3);
	CU_ASSERT_EQUAL(kvp_pages_count(x.pg[DEV], KVP_PAGE_FREE), 0);
	CU_ASSERT_EQUAL(kvp_index_check(x.kc), 0);
	/* readable meanwhile, as device pages; neither evicted nor flushed */
	CU_ASSERT_EQUAL(kvp_index_match(x.kc, 0, k, 3, 0, &m, dev, host), 0);
	CU_ASSERT_EQUAL(m.dev_pages, 3);
	CU_ASSERT_EQUAL(m.host_pages, 0);
	CU_ASSERT_EQUAL(x.mem[DEV][dev[2] * PB], 32);
	CU_ASSERT_EQUAL(kvp_index_evict(x.kc, DEV, 3), 0);
	CU_ASSERT_EQUAL(kvp_index_evict_later(x.kc, DEV, 3), 0);
	CU_ASSERT_EQUAL(kvp_index_flush(x.kc), 0);
	CU_ASSERT_EQUAL(kvp_index_exists(x.kc, 0, k, 3), 3);
	kvp_index_stats(x.kc, &st);
	CU_ASSERT_EQUAL(st.flights, 1);
	CU_ASSERT_EQUAL(kvp_index_check(x.kc), 0);
	/* lands: host pages with the bytes */
	kvp_index_demote_done(x.kc, g_fl, 0);
	kvp_index_stats(x.kc, &st);
	CU_ASSERT_EQUAL(st.flights + st.inflight_pages + st.moving_pages, 0);
	CU_ASSERT_EQUAL(st.cached_pages[DEV], 0);
	CU_ASSERT_EQUAL(st.cached_pages[HOST], 3);
	CU_ASSERT_EQUAL(st.demoted_pages, 3);
	CU_ASSERT_EQUAL(st.evicted_pages[DEV], 3);
	CU_ASSERT_EQUAL(st.evictable_pages[HOST], 3);
	CU_ASSERT_EQUAL(kvp_pages_count(x.pg[HOST], KVP_PAGE_MOVING), 0);
	CU_ASSERT_EQUAL(kvp_pages_count(x.pg[DEV], KVP_PAGE_FREE), 3);
	CU_ASSERT_EQUAL(kvp_index_match(x.kc, 0, k, 3, 0, &m, dev, host), 0);
	CU_ASSERT_EQUAL(m.dev_pages, 0);
	CU_ASSERT_EQUAL_FATAL(m.host_pages, 3);
	for (int i = 0; i < 3; i++)
		CU_ASSERT_EQUAL(x.mem[HOST][host[i] * PB], 30 + i);
	CU_ASSERT_EQUAL(kvp_index_check(x.kc), 0);
	/* a copy done at once (0) lands at once */
	chain(k2, 1, 2);
	put(&x, 0, k2, 2, 0, DEV, 50);
	g_start_rc = 0;
	g_fl = NULL;
	CU_ASSERT_EQUAL(kvp_index_evict_later(x.kc, DEV, 1), 1);
	kvp_index_stats(x.kc, &st);
	CU_ASSERT_EQUAL(st.flights, 0);
	CU_ASSERT_EQUAL(st.cached_pages[DEV], 1);
	CU_ASSERT_EQUAL(st.cached_pages[HOST], 4);
	CU_ASSERT_EQUAL(kvp_pages_count(x.pg[HOST], KVP_PAGE_CACHED), 4);
	CU_ASSERT_EQUAL(kvp_index_check(x.kc), 0);
	fix_done(&x);
}

/* A failed copy, in flight or at its start: the host pages go back, the entries stay on the
 * device as they were. */
static void test_kvp_index_evict_later_fails(void)
{
	struct fix x;
	struct kvp_key k[2];
	struct kvp_index_stats st;

	fix_init_async(&x, 2, 2);
	chain(k, 0, 2);
	put(&x, 0, k, 2, 0, DEV, 40);
	CU_ASSERT_EQUAL(kvp_index_evict_later(x.kc, DEV, 2), 0);
	CU_ASSERT_PTR_NOT_NULL_FATAL(g_fl);
	CU_ASSERT_EQUAL(kvp_index_check(x.kc), 0);
	kvp_index_demote_done(x.kc, g_fl, -EIO);
	kvp_index_stats(x.kc, &st);
	CU_ASSERT_EQUAL(st.flights + st.inflight_pages + st.moving_pages, 0);
	CU_ASSERT_EQUAL(st.cached_pages[DEV], 2);
	CU_ASSERT_EQUAL(st.cached_pages[HOST], 0);
	CU_ASSERT_EQUAL(st.evictable_pages[DEV], 2);
	CU_ASSERT_EQUAL(st.demoted_pages, 0);
	CU_ASSERT_EQUAL(kvp_pages_count(x.pg[HOST], KVP_PAGE_FREE), 2);
	CU_ASSERT_EQUAL(kvp_index_check(x.kc), 0);
	g_fl = NULL;
	g_start_rc = -EIO;
	CU_ASSERT_EQUAL(kvp_index_evict_later(x.kc, DEV, 1), 0);
	CU_ASSERT_PTR_NULL(g_fl);
	CU_ASSERT_EQUAL(kvp_index_exists(x.kc, 0, k, 2), 2);
	CU_ASSERT_EQUAL(kvp_pages_count(x.pg[HOST], KVP_PAGE_FREE), 2);
	CU_ASSERT_EQUAL(kvp_index_check(x.kc), 0);
	/* a flight left when the cache is freed goes with it */
	g_start_rc = 1;
	CU_ASSERT_EQUAL(kvp_index_evict_later(x.kc, DEV, 1), 0);
	CU_ASSERT_PTR_NOT_NULL(g_fl);
	CU_ASSERT_EQUAL(kvp_index_check(x.kc), 0);
	kvp_index_free(x.kc);
	x.kc = NULL;
	for (int t = 0; t < KVP_TIER_ID_MAX; t++) {
		kvp_pages_free(x.pg[t]);
		free(x.mem[t]);
	}
}

static void test_kvp_index_promote_refused(void)
{
	struct fix x;
	struct kvp_key k[2];
	struct kvp_index_match m, m2;
	uint32_t dev[2], host[2], out[2], n = 0, pg[2];

	fix_init(&x, 2, 2);
	chain(k, 0, 2);
	put(&x, 0, k, 2, 0, HOST, 1);
	CU_ASSERT_EQUAL(kvp_index_match(x.kc, 0, k, 2, 1, &m, dev, host), 0);
	CU_ASSERT_EQUAL(m.host_pages, 2);
	CU_ASSERT_EQUAL(kvp_index_promote(x.kc, m.lock, out, 1, &n), -EINVAL);
	/* no free device page */
	CU_ASSERT_EQUAL(kvp_pages_alloc(x.pg[DEV], 2, pg), 0);
	CU_ASSERT_EQUAL(kvp_index_promote(x.kc, m.lock, out, 2, &n), -ENOSPC);
	kvp_pages_release(x.pg[DEV], pg, 2);
	/* pinned by another lock too */
	CU_ASSERT_EQUAL(kvp_index_match(x.kc, 0, k, 1, 1, &m2, dev, host), 0);
	CU_ASSERT_EQUAL(kvp_index_promote(x.kc, m.lock, out, 2, &n), -EBUSY);
	kvp_index_unlock(x.kc, m2.lock);
	x.fail_copy = 1;
	CU_ASSERT_EQUAL(kvp_index_promote(x.kc, m.lock, out, 2, &n), -EIO);
	x.fail_copy = 0;
	CU_ASSERT_EQUAL(kvp_pages_count(x.pg[HOST], KVP_PAGE_CACHED), 2);
	CU_ASSERT_EQUAL(kvp_pages_count(x.pg[DEV], KVP_PAGE_FREE), 2);
	CU_ASSERT_EQUAL(kvp_index_check(x.kc), 0);
	kvp_index_unlock(x.kc, m.lock);
	fix_done(&x);
}

/* Many chains in several namespaces with random evictions, the books checked throughout. */
static void test_kvp_index_books_random(void)
{
	struct fix x;
	uint8_t kb[64][40];
	struct kvp_key k[40];
	unsigned seed = 12345;

	fix_init(&x, 64, 64);
	for (int round = 0; round < 300; round++) {
		uint32_t n = 1 + (uint32_t)(rand_r(&seed) % 40), ns = (uint32_t)(rand_r(&seed) % 3);
		uint32_t base = (uint32_t)(rand_r(&seed) % 64), freep, have;
		int tier = rand_r(&seed) % 2 ? DEV : HOST;

		for (uint32_t i = 0; i < n; i++) {
			/* chain keys of 1 .. 40 bytes, shared prefixes across rounds */
			uint32_t len = 1 + (base + i) % 40;

			memset(kb[i], (int)(base + i), len);
			k[i] = (struct kvp_key){ len, kb[i] };
		}
		have = kvp_index_exists(x.kc, ns, k, n);
		freep = kvp_pages_count(x.pg[tier], KVP_PAGE_FREE);
		if (freep < n - have)
			kvp_index_evict(x.kc, (enum kvp_tier_id)tier, n - have - freep);
		have = kvp_index_exists(x.kc, ns, k, n);
		if (kvp_pages_count(x.pg[tier], KVP_PAGE_FREE) >= n - have && n > have)
			put(&x, ns, k, n, have, tier, 0);
		if (rand_r(&seed) % 7 == 0)
			kvp_index_evict(x.kc, rand_r(&seed) % 2 ? DEV : HOST, 5);
		CU_ASSERT_EQUAL_FATAL(kvp_index_check(x.kc), 0);
		CU_ASSERT_EQUAL_FATAL(kvp_pages_check(x.pg[DEV]), 0);
	}
	kvp_index_flush(x.kc);
	CU_ASSERT_EQUAL(kvp_pages_count(x.pg[DEV], KVP_PAGE_FREE), 64);
	CU_ASSERT_EQUAL(kvp_pages_count(x.pg[HOST], KVP_PAGE_FREE), 64);
	CU_ASSERT_TRUE(kvp_index_bytes_per_page(x.kc) == 0);
	fix_done(&x);
}

static void test_kvp_index_new_bad_conf(void)
{
	struct kvp_pages *a = kvp_pages_new(2), *b = kvp_pages_new(2);

	CU_ASSERT_PTR_NULL(kvp_index_new(NULL));
	CU_ASSERT_PTR_NULL(kvp_index_new(&(struct kvp_index_conf){
		NULL, NULL, copy_fn, NULL, NULL, 0, KVP_EVICT_POLICY_LRU, false }));
	CU_ASSERT_PTR_NULL(kvp_index_new(&(struct kvp_index_conf){ a, a, copy_fn, NULL, NULL, 0,
								   KVP_EVICT_POLICY_LRU, false }));
	CU_ASSERT_PTR_NULL(kvp_index_new(&(struct kvp_index_conf){ a, b, NULL, NULL, NULL, 0,
								   KVP_EVICT_POLICY_LRU, false }));
	kvp_index_free(NULL);
	kvp_pages_free(a);
	kvp_pages_free(b);
}

#define POOL                                                                                       \
	"[pool.p]\nlayers = 1\nkv_heads = 1\nhead_dim = 8\ndtype = fp16\npage_tokens = 4\n"        \
	"device = none\nhost_capacity = 64t\nmlock = off\n"

/* The hash-keyed limits of the [daemon] section: defaults, values, bounds. */
static void test_kvp_conf_keys_limits(void)
{
	struct kvp_conf c;
	char err[256];

	kvp_conf_defaults(&c);
	CU_ASSERT_EQUAL(c.max_keys_per_call, 65536);
	CU_ASSERT_EQUAL(c.max_key_bytes, 64);
	CU_ASSERT_EQUAL(kvp_conf_load_string(&c,
					     "[daemon]\nmax_keys_per_call = 10\n"
					     "max_key_bytes = 32\n" POOL,
					     NULL, err, sizeof(err)),
			0);
	CU_ASSERT_EQUAL(c.max_keys_per_call, 10);
	CU_ASSERT_EQUAL(c.max_key_bytes, 32);
	CU_ASSERT_EQUAL(kvp_conf_load_string(&c, "[daemon]\nmax_key_bytes = 65\n" POOL, NULL, err,
					     sizeof(err)),
			-EINVAL);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "max_key_bytes"));
	CU_ASSERT_EQUAL(kvp_conf_load_string(&c, "[daemon]\nmax_keys_per_call = 0\n" POOL, NULL,
					     err, sizeof(err)),
			-EINVAL);
	CU_ASSERT_EQUAL(c.max_keys_per_call, 10); /* untouched on failure */
	/* more keys than libkvpool sends in one call (KVP_PAGE_KEYS_MAX) */
	CU_ASSERT_EQUAL(kvp_conf_load_string(&c, "[daemon]\nmax_keys_per_call = 65537\n" POOL, NULL,
					     err, sizeof(err)),
			-EINVAL);
	CU_ASSERT_EQUAL(kvp_conf_load_string(&c, "[daemon]\nmax_keys_per_call = 65536\n" POOL, NULL,
					     err, sizeof(err)),
			0);
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_kvp_index_insert_match_run),
		H_TEST(test_kvp_index_match_chain_not_consecutive),
		H_TEST(test_kvp_index_insert_bad),
		H_TEST(test_kvp_index_evict_leaves_first_lru),
		H_TEST(test_kvp_index_insert_parent_evicted),
		H_TEST(test_kvp_index_lock_pins),
		H_TEST(test_kvp_index_demote_promote),
		H_TEST(test_kvp_index_evict_later_lands),
		H_TEST(test_kvp_index_evict_later_fails),
		H_TEST(test_kvp_index_promote_refused),
		H_TEST(test_kvp_index_books_random),
		H_TEST(test_kvp_index_new_bad_conf),
		H_TEST(test_kvp_conf_keys_limits),
	};

	return H_RUN_SUITE("keycache", NULL, NULL, tests);
}
