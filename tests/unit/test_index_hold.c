/* test_index_hold.c - the page index's write-back holds (kvp_index_hold, kvp_index_unhold): the
 * cold walk holds the next pages eviction would take, the full walk every host page in turn; a
 * held page stays cached and matched; a held page that leaves the host tier (evicted, flushed,
 * promoted) stays MOVING, out of every allocation, until its hold ends; eviction takes unheld
 * pages first and never spills a held one; the books balance after every step. */
#include <CUnit/Basic.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
	uint32_t spilled;
	uint8_t skip; /* wanted(): the chain letter not to hold, 0 none */
	uint32_t asked;
};

static int copy_fn(void *ctx, enum kvp_copy_dir dir, const uint32_t *src, const uint32_t *dst,
		   uint32_t n)
{
	struct fix *x = ctx;
	int from = dir == KVP_COPY_DEMOTE ? DEV : HOST, to = dir == KVP_COPY_DEMOTE ? HOST : DEV;

	for (uint32_t i = 0; i < n; i++)
		memcpy(x->mem[to] + (size_t)dst[i] * PB, x->mem[from] + (size_t)src[i] * PB, PB);
	return 0;
}

static void spill_fn(void *ctx, uint64_t ns, int keyed, const uint8_t *key, size_t klen,
		     uint32_t page)
{
	struct fix *x = ctx;

	(void)ns, (void)keyed, (void)key, (void)klen, (void)page;
	x->spilled++;
}

static bool wanted(void *ctx, uint64_t ns, int keyed, const uint8_t *key, size_t klen)
{
	struct fix *x = ctx;

	(void)ns;
	x->asked++;
	return keyed && klen >= 2 && key[0] != x->skip;
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
	kvp_index_set_spill(x->kc, spill_fn, x);
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

static struct fix x;
static uint8_t g_kb[64][16];

/* Chain c's keys "<c><i>", i < n. */
static void chain(struct kvp_key *out, int c, int n)
{
	for (int i = 0; i < n; i++) {
		uint8_t *b = g_kb[(c * 8 + i) % 64];
		int len = snprintf((char *)b, 16, "%c%d", 'a' + c, i);

		out[i] = (struct kvp_key){ (size_t)len, b };
	}
}

/* Inserts chain k[0 .. n) into fresh pages of tier, page i's bytes pat + i. */
static void put(struct fix *x, const struct kvp_key *k, uint32_t n, int tier, uint8_t pat)
{
	struct kvp_index_insert_result r = { 0 };
	uint32_t pages[16];

	CU_ASSERT_FATAL(kvp_pages_alloc(x->pg[tier], n, pages) == 0);
	for (uint32_t i = 0; i < n; i++)
		memset(x->mem[tier] + (size_t)pages[i] * PB, pat + (int)i, PB);
	CU_ASSERT_EQUAL_FATAL(kvp_index_insert(x->kc, 0, k, n, 0, tier, pages, &r, NULL), 0);
	CU_ASSERT_EQUAL(r.new_pages, n);
	CU_ASSERT_EQUAL(kvp_index_check(x->kc), 0);
}

static uint32_t state(struct fix *x, int tier, enum kvp_page_state s)
{
	return kvp_pages_count(x->pg[tier], s);
}

/* The cold walk holds the pages eviction would take, in its order (each leaf, then the parents
 * it leaves leaves), as want() asks; a held page stays cached, matched and evictable; later
 * walks skip it; max and scan bound a walk; unhold changes nothing else. */
static void test_kvp_index_hold_cold_order(void)
{
	struct kvp_index_hold h[16];
	struct kvp_key a[4], b[4], c[4];
	struct kvp_index_match m;
	struct kvp_index_stats st;
	static const char *const first[] = { "a3", "a2", "a1", "a0", "c3", "c2", "c1", "c0" };
	uint32_t host[4];

	fix_init(&x, 0, 16);
	chain(a, 0, 4);
	chain(b, 1, 4);
	chain(c, 2, 4);
	put(&x, a, 4, HOST, 10);
	put(&x, b, 4, HOST, 20);
	put(&x, c, 4, HOST, 30);
	x.skip = 'b'; /* chain b not wanted */
	CU_ASSERT_EQUAL(kvp_index_hold(x.kc, true, 3, 64, wanted, &x, h), 3);
	CU_ASSERT_EQUAL(kvp_index_hold(x.kc, true, 16, 64, wanted, &x, h + 3), 5);
	for (int i = 0; i < 8; i++)
		CU_ASSERT_EQUAL(memcmp(h[i].key.data, first[i], 2), 0);
	CU_ASSERT_EQUAL(h[0].key.len, 2);
	CU_ASSERT_EQUAL(h[0].keyed, 1);
	CU_ASSERT_EQUAL(x.mem[HOST][h[0].page * PB], 13);
	CU_ASSERT_EQUAL(kvp_index_check(x.kc), 0);
	/* held: still cached, matched and evictable */
	CU_ASSERT_EQUAL(kvp_index_match(x.kc, 0, a, 4, 0, &m, NULL, host), 0);
	CU_ASSERT_EQUAL(m.host_pages, 4);
	CU_ASSERT_EQUAL(host[3], h[0].page);
	kvp_index_stats(x.kc, &st);
	CU_ASSERT_EQUAL(st.evictable_pages[HOST], 12);
	CU_ASSERT_EQUAL(st.protected_pages[HOST], 0);
	CU_ASSERT_EQUAL(kvp_index_hold(x.kc, true, 16, 64, wanted, &x, h + 8), 0);
	/* the match made a3 the most recent leaf: b3, c3, a3 now */
	x.skip = 0;
	x.asked = 0;
	CU_ASSERT_EQUAL(kvp_index_hold(x.kc, true, 1, 64, wanted, &x, h + 8), 1);
	CU_ASSERT_EQUAL(memcmp(h[8].key.data, "b3", 2), 0);
	CU_ASSERT_EQUAL(x.asked, 1);
	/* b3 held: passed by without a question; scan counts the questions */
	x.asked = 0;
	CU_ASSERT_EQUAL(kvp_index_hold(x.kc, true, 16, 1, wanted, &x, h + 9), 1);
	CU_ASSERT_EQUAL(memcmp(h[9].key.data, "b2", 2), 0);
	CU_ASSERT_EQUAL(x.asked, 1);
	CU_ASSERT_EQUAL(kvp_index_hold(x.kc, true, 16, 64, wanted, &x, h + 10), 2);
	CU_ASSERT_EQUAL(memcmp(h[11].key.data, "b0", 2), 0);
	CU_ASSERT_EQUAL(kvp_index_hold(x.kc, true, 16, 64, wanted, &x, h + 12), 0);
	/* a write that landed: later walks pass the page by; one that failed: asked again */
	for (int i = 0; i < 12; i++)
		kvp_index_unhold(x.kc, h[i].id, i != 4); /* c3's write failed */
	kvp_index_unhold(x.kc, h[0].id, false);		 /* twice: nothing */
	x.asked = 0;
	CU_ASSERT_EQUAL(kvp_index_hold(x.kc, true, 16, 64, wanted, &x, h), 1);
	CU_ASSERT_EQUAL(memcmp(h[0].key.data, "c3", 2), 0);
	CU_ASSERT_EQUAL(x.asked, 1);
	kvp_index_unhold(x.kc, h[0].id, true);
	CU_ASSERT_EQUAL(state(&x, HOST, KVP_PAGE_CACHED), 12);
	CU_ASSERT_EQUAL(state(&x, HOST, KVP_PAGE_MOVING), 0);
	CU_ASSERT_EQUAL(kvp_index_check(x.kc), 0);
	fix_done(&x);
}

/* Eviction keeps its order; a held page it takes is not spilled, not counted freed, and stays
 * MOVING (no allocation gets it) until its hold ends. */
static void test_kvp_index_hold_evicted_stays_moving(void)
{
	struct kvp_index_hold h[4];
	struct kvp_key a[4], b[4];
	struct kvp_index_stats st;
	uint32_t pages[8];

	fix_init(&x, 0, 8);
	chain(a, 0, 4);
	chain(b, 1, 4);
	put(&x, a, 4, HOST, 10);
	put(&x, b, 4, HOST, 20);
	CU_ASSERT_EQUAL(kvp_index_hold(x.kc, true, 1, 8, wanted, &x, h), 1); /* a3, the coldest */
	CU_ASSERT_EQUAL(memcmp(h[0].key.data, "a3", 2), 0);
	/* one page freed: a3 (held, MOVING) and a2 go */
	CU_ASSERT_EQUAL(kvp_index_evict(x.kc, HOST, 1), 1);
	CU_ASSERT_EQUAL(x.spilled, 1);
	CU_ASSERT_EQUAL(kvp_index_exists(x.kc, 0, a, 4), 2);
	CU_ASSERT_EQUAL(kvp_index_exists(x.kc, 0, b, 4), 4);
	/* everything: 7 pages freed, a3's page kept MOVING */
	CU_ASSERT_EQUAL(kvp_index_evict(x.kc, HOST, 8), 6);
	CU_ASSERT_EQUAL(x.spilled, 7); /* a3 was not spilled: its write is in flight */
	CU_ASSERT_EQUAL(kvp_index_exists(x.kc, 0, a, 4), 0);
	CU_ASSERT_EQUAL(state(&x, HOST, KVP_PAGE_FREE), 7);
	CU_ASSERT_EQUAL(state(&x, HOST, KVP_PAGE_MOVING), 1);
	kvp_index_stats(x.kc, &st);
	CU_ASSERT_EQUAL(st.moving_pages, 1);
	CU_ASSERT_EQUAL(kvp_index_check(x.kc), 0);
	CU_ASSERT_EQUAL(kvp_pages_alloc(x.pg[HOST], 8, pages), -ENOSPC);
	CU_ASSERT_EQUAL(kvp_pages_state(x.pg[HOST], h[0].page), KVP_PAGE_MOVING);
	kvp_index_unhold(x.kc, h[0].id, true);
	CU_ASSERT_EQUAL(state(&x, HOST, KVP_PAGE_FREE), 8);
	kvp_index_stats(x.kc, &st);
	CU_ASSERT_EQUAL(st.moving_pages, 0);
	CU_ASSERT_EQUAL(kvp_index_check(x.kc), 0);
	fix_done(&x);
}

/* A held page flushed or promoted to the device tier keeps its host page MOVING until the hold
 * ends; the entry's new device page is unaffected. */
static void test_kvp_index_hold_flush_promote(void)
{
	struct kvp_index_hold h[8];
	struct kvp_key a[2], b[2];
	struct kvp_index_match m;
	uint32_t host[2], dev[2], n;

	fix_init(&x, 4, 8);
	chain(a, 0, 2);
	chain(b, 1, 2);
	put(&x, a, 2, HOST, 10);
	put(&x, b, 2, HOST, 20);
	CU_ASSERT_EQUAL(kvp_index_hold(x.kc, false, 8, 64, wanted, &x, h), 4); /* every page */
	CU_ASSERT_EQUAL(kvp_index_match(x.kc, 0, a, 2, 1, &m, dev, host), 0);
	CU_ASSERT_PTR_NOT_NULL_FATAL(m.lock);
	CU_ASSERT_EQUAL(kvp_index_promote(x.kc, m.lock, dev, 2, &n), 0); /* no -EBUSY */
	CU_ASSERT_EQUAL(n, 2);
	CU_ASSERT_EQUAL(x.mem[DEV][dev[1] * PB], 11);
	CU_ASSERT_EQUAL(state(&x, HOST, KVP_PAGE_MOVING), 2);
	CU_ASSERT_EQUAL(kvp_index_check(x.kc), 0);
	kvp_index_unlock(x.kc, m.lock);
	CU_ASSERT_EQUAL(kvp_index_flush(x.kc), 4);
	CU_ASSERT_EQUAL(state(&x, HOST, KVP_PAGE_MOVING), 4);
	CU_ASSERT_EQUAL(state(&x, HOST, KVP_PAGE_FREE), 4);
	CU_ASSERT_EQUAL(kvp_index_check(x.kc), 0);
	for (int i = 0; i < 4; i++)
		kvp_index_unhold(x.kc, h[i].id, false);
	CU_ASSERT_EQUAL(state(&x, HOST, KVP_PAGE_FREE), 8);
	CU_ASSERT_EQUAL(state(&x, DEV, KVP_PAGE_FREE), 4);
	fix_done(&x);
}

/* The full walk (write-through) holds every host page, parents too, from where it stopped, and
 * skips held ones and device pages. */
static void test_kvp_index_hold_walk_all(void)
{
	struct kvp_index_hold h[16];
	struct kvp_key a[4], b[3];
	uint32_t n;

	fix_init(&x, 4, 8);
	chain(a, 0, 4);
	chain(b, 1, 3);
	put(&x, a, 4, HOST, 10);
	put(&x, b, 3, DEV, 20);
	n = kvp_index_hold(x.kc, false, 2, 64, wanted, &x, h);
	CU_ASSERT_EQUAL(n, 2);
	n += kvp_index_hold(x.kc, false, 16, 64, wanted, &x, h + n);
	CU_ASSERT_EQUAL(n, 4);
	for (uint32_t i = 0; i < n; i++)
		CU_ASSERT_EQUAL(h[i].key.data[0], 'a');
	x.asked = 0;
	CU_ASSERT_EQUAL(kvp_index_hold(x.kc, false, 16, 64, wanted, &x, h + n), 0);
	CU_ASSERT_EQUAL(x.asked, 0); /* held and device pages are not even asked about */
	CU_ASSERT_EQUAL(kvp_index_check(x.kc), 0);
	for (uint32_t i = 0; i < n; i++)
		kvp_index_unhold(x.kc, h[i].id, false);
	CU_ASSERT_EQUAL(kvp_index_check(x.kc), 0);
	fix_done(&x);
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_kvp_index_hold_cold_order),
		H_TEST(test_kvp_index_hold_evicted_stays_moving),
		H_TEST(test_kvp_index_hold_flush_promote),
		H_TEST(test_kvp_index_hold_walk_all),
	};

	return H_RUN_SUITE("index_hold", NULL, NULL, tests);
}
