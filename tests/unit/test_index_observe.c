/* test_index_observe.c - the page index's observer hook (kvp_index_set_observer): stores with
 * their parent's key, demotion as a removal from the device tier then a store in the host tier,
 * promotion back, host eviction and flush as removals, token pages with their derived key and
 * tokens, kvp_index_observe_all parents first, and nothing once the hook is cleared. The events
 * counted per tier always equal what the index holds. */
#include <CUnit/Basic.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "index.h"
#include "page_key.h"
#include "pages.h"
#include "suite.h"

#define DEV KVP_TIER_ID_DEVICE
#define HOST KVP_TIER_ID_HOST
#define PT 4
#define MAXREC 256

struct rec {
	enum kvp_index_change change;
	enum kvp_tier_id tier;
	uint64_t ns;
	int keyed;
	uint8_t key[KVP_KEY_MAX], parent[KVP_KEY_MAX];
	size_t klen, plen;
	uint32_t tokens[PT], ntokens;
};

struct fix {
	struct kvp_pages *pg[KVP_TIER_ID_MAX];
	struct kvp_index *kc;
	struct rec r[MAXREC];
	uint32_t n;		       /* records since the test last reset it */
	int64_t held[KVP_TIER_ID_MAX]; /* pages per tier, as every event so far tells it */
};

static int copy_fn(void *ctx, enum kvp_copy_dir dir, const uint32_t *src, const uint32_t *dst,
		   uint32_t n)
{
	(void)ctx;
	(void)dir;
	(void)src;
	(void)dst;
	(void)n;
	return 0;
}

static void seen(void *ctx, const struct kvp_index_event *e)
{
	struct fix *x = ctx;
	struct rec *r;

	CU_ASSERT_FATAL(x->n < MAXREC);
	x->held[e->tier] += e->change == KVP_INDEX_STORED ? 1 : -1;
	r = &x->r[x->n++];
	r->change = e->change;
	r->tier = e->tier;
	r->ns = e->ns;
	r->keyed = e->keyed;
	CU_ASSERT_FATAL(e->key.len >= 1 && e->key.len <= KVP_KEY_MAX);
	CU_ASSERT_FATAL(e->parent.len <= KVP_KEY_MAX);
	memcpy(r->key, e->key.data, e->key.len);
	r->klen = e->key.len;
	if (e->parent.len)
		memcpy(r->parent, e->parent.data, e->parent.len);
	r->plen = e->parent.len;
	r->ntokens = e->ntokens;
	CU_ASSERT_FATAL(e->ntokens <= PT);
	if (e->ntokens)
		memcpy(r->tokens, e->tokens, e->ntokens * sizeof(uint32_t));
}

static void fix_init(struct fix *x, uint32_t ndev, uint32_t nhost)
{
	memset(x, 0, sizeof(*x));
	x->pg[DEV] = kvp_pages_new(ndev);
	x->pg[HOST] = kvp_pages_new(nhost);
	x->kc = kvp_index_new(&(struct kvp_index_conf){ x->pg[DEV], x->pg[HOST], copy_fn, x, NULL,
							PT, KVP_EVICT_POLICY_LRU, false });
	CU_ASSERT_FATAL(x->kc != NULL);
	kvp_index_set_observer(x->kc, seen, x);
}

static void fix_done(struct fix *x)
{
	CU_ASSERT_EQUAL(kvp_index_check(x->kc), 0);
	kvp_index_free(x->kc);
	kvp_pages_free(x->pg[DEV]);
	kvp_pages_free(x->pg[HOST]);
}

static void expect_held(const struct fix *x)
{
	struct kvp_index_stats st;

	kvp_index_stats(x->kc, &st);
	CU_ASSERT_EQUAL(x->held[DEV], (int64_t)st.cached_pages[DEV]);
	CU_ASSERT_EQUAL(x->held[HOST], (int64_t)st.cached_pages[HOST]);
}

static void put_keys(struct fix *x, const char *const *names, uint32_t n, int tier)
{
	struct kvp_key k[8];
	uint32_t pages[8];

	for (uint32_t i = 0; i < n; i++)
		k[i] = (struct kvp_key){ strlen(names[i]), (const uint8_t *)names[i] };
	CU_ASSERT_FATAL(kvp_pages_alloc(x->pg[tier], n, pages) == 0);
	CU_ASSERT_EQUAL_FATAL(kvp_index_insert(x->kc, 3, k, n, 0, tier, pages, NULL, NULL), 0);
}

static bool rec_is(const struct rec *r, enum kvp_index_change ch, int tier, const char *key,
		   const char *parent)
{
	return r->change == ch && (int)r->tier == tier && r->klen == strlen(key) &&
	       memcmp(r->key, key, r->klen) == 0 &&
	       (parent ? r->plen == strlen(parent) && memcmp(r->parent, parent, r->plen) == 0
		       : r->plen == 0);
}

static void test_kvp_index_set_observer_keys_moves(void)
{
	static const char *const names[] = { "k0", "k1", "k2" };
	struct fix x;
	struct kvp_index_lock *lk;
	struct kvp_index_match m;
	struct kvp_key k[3];
	uint32_t dev[3], host[3], n = 0;

	fix_init(&x, 4, 4);
	put_keys(&x, names, 3, DEV);
	CU_ASSERT_EQUAL_FATAL(x.n, 3);
	CU_ASSERT_TRUE(rec_is(&x.r[0], KVP_INDEX_STORED, DEV, "k0", NULL));
	CU_ASSERT_TRUE(rec_is(&x.r[1], KVP_INDEX_STORED, DEV, "k1", "k0"));
	CU_ASSERT_TRUE(rec_is(&x.r[2], KVP_INDEX_STORED, DEV, "k2", "k1"));
	CU_ASSERT_TRUE(x.r[0].keyed && x.r[0].ns == 3 && x.r[0].ntokens == 0);
	expect_held(&x);

	/* demotion: leaves first, each a removal from the device tier then a store in the host */
	x.n = 0;
	CU_ASSERT_EQUAL(kvp_index_evict(x.kc, DEV, 3), 3);
	CU_ASSERT_EQUAL_FATAL(x.n, 6);
	CU_ASSERT_TRUE(rec_is(&x.r[0], KVP_INDEX_REMOVED, DEV, "k2", "k1"));
	CU_ASSERT_TRUE(rec_is(&x.r[1], KVP_INDEX_STORED, HOST, "k2", "k1"));
	expect_held(&x);

	/* promotion back: removal from the host, store in the device tier */
	x.n = 0;
	for (uint32_t i = 0; i < 3; i++)
		k[i] = (struct kvp_key){ 2, (const uint8_t *)names[i] };
	CU_ASSERT_EQUAL_FATAL(kvp_index_match(x.kc, 3, k, 3, 1, &m, dev, host), 0);
	CU_ASSERT_EQUAL(m.host_pages, 3);
	lk = m.lock;
	CU_ASSERT_EQUAL_FATAL(kvp_index_promote(x.kc, lk, dev, 3, &n), 0);
	CU_ASSERT_EQUAL(n, 3);
	CU_ASSERT_EQUAL(x.n, 6);
	CU_ASSERT_TRUE(rec_is(&x.r[0], KVP_INDEX_REMOVED, HOST, "k0", NULL));
	CU_ASSERT_TRUE(rec_is(&x.r[1], KVP_INDEX_STORED, DEV, "k0", NULL));
	kvp_index_unlock(x.kc, lk);

	/* flush: every page removed, leaves first */
	x.n = 0;
	CU_ASSERT_EQUAL(kvp_index_flush(x.kc), 3);
	CU_ASSERT_EQUAL_FATAL(x.n, 3);
	for (uint32_t i = 0; i < 3; i++)
		CU_ASSERT_EQUAL(x.r[i].change, KVP_INDEX_REMOVED);
	CU_ASSERT_TRUE(rec_is(&x.r[2], KVP_INDEX_REMOVED, DEV, "k0", NULL));
	expect_held(&x);
	CU_ASSERT_EQUAL(x.held[DEV] + x.held[HOST], 0);
	fix_done(&x);
}

static void test_kvp_index_set_observer_tokens_and_all(void)
{
	uint32_t tok[3 * PT], pages[3];
	uint8_t k0[KVP_PAGE_KEY_BYTES], k1[KVP_PAGE_KEY_BYTES];
	struct fix x;

	for (uint32_t i = 0; i < 3 * PT; i++)
		tok[i] = 100 + i;
	kvp_page_key(NULL, tok, PT, k0);
	kvp_page_key(k0, tok + PT, PT, k1);
	fix_init(&x, 4, 1);
	CU_ASSERT_FATAL(kvp_pages_alloc(x.pg[DEV], 3, pages) == 0);
	CU_ASSERT_EQUAL_FATAL(kvp_index_insert_tokens(x.kc, 0, tok, 3, DEV, pages, NULL, NULL), 0);
	CU_ASSERT_EQUAL_FATAL(x.n, 3);
	CU_ASSERT_FALSE(x.r[0].keyed);
	CU_ASSERT_EQUAL(x.r[0].klen, KVP_PAGE_KEY_BYTES);
	CU_ASSERT_EQUAL(memcmp(x.r[0].key, k0, sizeof(k0)), 0);
	CU_ASSERT_EQUAL(x.r[0].plen, 0);
	CU_ASSERT_EQUAL(x.r[1].plen, KVP_PAGE_KEY_BYTES);
	CU_ASSERT_EQUAL(memcmp(x.r[1].key, k1, sizeof(k1)), 0);
	CU_ASSERT_EQUAL(memcmp(x.r[1].parent, k0, sizeof(k0)), 0);
	CU_ASSERT_EQUAL(x.r[1].ntokens, PT);
	CU_ASSERT_EQUAL(memcmp(x.r[1].tokens, tok + PT, PT * sizeof(uint32_t)), 0);

	/* a host tier of one page: one leaf demoted, the next demotion drops the host leaf */
	CU_ASSERT_EQUAL(kvp_index_evict(x.kc, DEV, 2), 2);
	expect_held(&x);

	CU_ASSERT_EQUAL(x.held[DEV] + x.held[HOST], 2);
	/* a snapshot: every page stored, each after its parent */
	x.n = 0;
	kvp_index_observe_all(x.kc);
	CU_ASSERT_EQUAL_FATAL(x.n, 2);
	for (uint32_t i = 0; i < x.n; i++) {
		CU_ASSERT_EQUAL(x.r[i].change, KVP_INDEX_STORED);
		if (x.r[i].plen) {
			bool before = false;

			for (uint32_t j = 0; j < i; j++)
				before |=
					memcmp(x.r[j].key, x.r[i].parent, KVP_PAGE_KEY_BYTES) == 0;
			CU_ASSERT_TRUE(before);
		}
	}

	/* cleared: nothing more is told */
	kvp_index_set_observer(x.kc, NULL, NULL);
	x.n = 0;
	kvp_index_observe_all(x.kc);
	CU_ASSERT_EQUAL(kvp_index_flush(x.kc), 2);
	CU_ASSERT_EQUAL(x.n, 0);
	fix_done(&x);
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_kvp_index_set_observer_keys_moves),
		H_TEST(test_kvp_index_set_observer_tokens_and_all),
	};

	return H_RUN_SUITE("index_observe", NULL, NULL, tests);
}
