/* test_index_tokens.c - the page index through token calls: targeted cases (overlapping locks,
 * namespaces, duplicates, upgrades, exact eviction, demotion and promotion bytes, LRU/LFU order),
 * exactness under forced hash collisions, token and key pages side by side in one namespace, the
 * derived page keys, and long random operation sequences checked against a reference model after
 * every step, with a copy callback that really moves page bytes between an in-memory device tier
 * and host tier. */
#include <CUnit/Basic.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "pages.h"
#include "index.h"
#include "suite.h"

#define PB 16 /* bytes per page in the fake tiers */
#define DEV KVP_TIER_ID_DEVICE
#define HOST KVP_TIER_ID_HOST

/* ---- link seam: getrandom ----
 * This definition of libc's getrandom() takes the place of libc's for the whole test binary
 * (the tree is linked in statically), so the tests see the tree ask for its seed and can script
 * the answers. Unscripted, it is the real system call. */

static struct {
	unsigned calls;
	int fail_errno; /* every call fails with this when nonzero */
	int eintr_once; /* the next call fails with EINTR */
	size_t chunk;	/* at most this many bytes per call when nonzero */
	bool scripted;	/* bytes come from value (low byte first), not the kernel */
	uint64_t value;
	size_t given; /* bytes of value handed out so far */
} g_rnd;

ssize_t getrandom(void *buf, size_t len, unsigned int flags)
{
	g_rnd.calls++;
	if (g_rnd.eintr_once) {
		g_rnd.eintr_once = 0;
		errno = EINTR;
		return -1;
	}
	if (g_rnd.fail_errno) {
		errno = g_rnd.fail_errno;
		return -1;
	}
	if (g_rnd.chunk && len > g_rnd.chunk)
		len = g_rnd.chunk;
	if (!g_rnd.scripted)
		return syscall(SYS_getrandom, buf, len, flags);
	for (size_t i = 0; i < len; i++, g_rnd.given++)
		((unsigned char *)buf)[i] = (unsigned char)(g_rnd.value >> (8 * (g_rnd.given % 8)));
	return (ssize_t)len;
}

static void rnd_reset(void)
{
	memset(&g_rnd, 0, sizeof(g_rnd));
}

static struct kvp_index *host_only_tree(struct kvp_pages *host)
{
	struct kvp_index_conf c = { .page_tokens = 4, .host = host };

	return kvp_index_new(&c);
}

/* ---- fixture: two fake tiers, a clock, a copy callback ---- */

struct fx {
	struct kvp_pages *tp[KVP_TIER_ID_MAX];
	uint8_t *mem[KVP_TIER_ID_MAX];
	struct kvp_index *pfx;
	uint32_t pt;
	uint64_t clock;
	int copy_fail; /* copies return this when nonzero */
	uint64_t copied[2];
	bool copy_bad; /* the callback saw a page in the wrong state */
	/* Asynchronous demotions (fx_async before fx_init): flights started, not yet landed. */
	struct {
		const uint32_t *src, *dst;
		uint32_t n;
		struct kvp_index_flight *fl;
	} flight[8];
	uint32_t nflight;
	bool start_now; /* copy_start copies at once and returns 0 */
};

static bool fx_async; /* fx_init gives the tree a copy_start */

static int fx_copy(void *ctx, enum kvp_copy_dir dir, const uint32_t *src, const uint32_t *dst,
		   uint32_t n)
{
	struct fx *f = ctx;
	int s = dir == KVP_COPY_DEMOTE ? DEV : HOST, d = dir == KVP_COPY_DEMOTE ? HOST : DEV;

	if (f->copy_fail)
		return f->copy_fail;
	for (uint32_t i = 0; i < n; i++) {
		if (kvp_pages_state(f->tp[s], src[i]) != KVP_PAGE_CACHED ||
		    kvp_pages_state(f->tp[d], dst[i]) != KVP_PAGE_LEASED) {
			f->copy_bad = true;
			continue;
		}
		memcpy(f->mem[d] + (size_t)dst[i] * PB, f->mem[s] + (size_t)src[i] * PB, PB);
	}
	f->copied[dir] += n;
	return 0;
}

/* Demotion copy_start: the pages must be CACHED (device) and MOVING (host); the bytes move when
 * the test lands the flight (fx_land). */
static int fx_copy_start(void *ctx, const uint32_t *src, const uint32_t *dst, uint32_t n,
			 struct kvp_index_flight *fl)
{
	struct fx *f = ctx;

	for (uint32_t i = 0; i < n; i++)
		if (kvp_pages_state(f->tp[DEV], src[i]) != KVP_PAGE_CACHED ||
		    kvp_pages_state(f->tp[HOST], dst[i]) != KVP_PAGE_MOVING)
			f->copy_bad = true;
	if (f->copy_fail)
		return f->copy_fail;
	if (f->start_now) {
		for (uint32_t i = 0; i < n; i++)
			memcpy(f->mem[HOST] + (size_t)dst[i] * PB,
			       f->mem[DEV] + (size_t)src[i] * PB, PB);
		f->copied[KVP_COPY_DEMOTE] += n;
		return 0;
	}
	CU_ASSERT_FATAL(f->nflight < 8);
	f->flight[f->nflight].src = src;
	f->flight[f->nflight].dst = dst;
	f->flight[f->nflight].n = n;
	f->flight[f->nflight].fl = fl;
	f->nflight++;
	return 1;
}

/* Lands flight i (the oldest is 0): with rc 0 the bytes are copied first. */
static void fx_land(struct fx *f, uint32_t i, int rc)
{
	CU_ASSERT_FATAL(i < f->nflight);
	if (rc == 0) {
		for (uint32_t k = 0; k < f->flight[i].n; k++)
			memcpy(f->mem[HOST] + (size_t)f->flight[i].dst[k] * PB,
			       f->mem[DEV] + (size_t)f->flight[i].src[k] * PB, PB);
		f->copied[KVP_COPY_DEMOTE] += f->flight[i].n;
	}
	kvp_index_demote_done(f->pfx, f->flight[i].fl, rc);
	memmove(&f->flight[i], &f->flight[i + 1], (f->nflight - i - 1) * sizeof(f->flight[0]));
	f->nflight--;
}

static void fx_init(struct fx *f, uint32_t pt, uint32_t ndev, uint32_t nhost,
		    enum kvp_evict_policy policy)
{
	struct kvp_index_conf c = { 0 };
	uint32_t total[KVP_TIER_ID_MAX] = { ndev, nhost };

	memset(f, 0, sizeof(*f));
	f->pt = pt;
	f->clock = 1;
	for (int t = 0; t < KVP_TIER_ID_MAX; t++) {
		if (!total[t])
			continue;
		f->tp[t] = kvp_pages_new(total[t]);
		f->mem[t] = calloc(total[t], PB);
		CU_ASSERT_PTR_NOT_NULL_FATAL(f->tp[t]);
		CU_ASSERT_PTR_NOT_NULL_FATAL(f->mem[t]);
	}
	c.page_tokens = pt;
	c.policy = policy;
	c.dev = f->tp[DEV];
	c.host = f->tp[HOST];
	c.copy = fx_copy;
	c.copy_ctx = f;
	c.copy_start = fx_async ? fx_copy_start : NULL;
	f->pfx = kvp_index_new(&c);
	CU_ASSERT_PTR_NOT_NULL_FATAL(f->pfx);
}

static void fx_fini(struct fx *f)
{
	kvp_index_free(f->pfx);
	for (int t = 0; t < KVP_TIER_ID_MAX; t++) {
		kvp_pages_free(f->tp[t]);
		free(f->mem[t]);
	}
}

static struct kvp_index_stats fx_stats(const struct fx *f)
{
	struct kvp_index_stats st;

	kvp_index_stats(f->pfx, &st);
	return st;
}

static uint32_t fx_count(const struct fx *f, int t, enum kvp_page_state s)
{
	return f->tp[t] ? kvp_pages_count(f->tp[t], s) : 0;
}

/* Everything that must hold after any operation. Returns true when it does. */
static bool fx_sane(const struct fx *f)
{
	bool ok = kvp_index_check(f->pfx) == 0 && !f->copy_bad;

	for (int t = 0; t < KVP_TIER_ID_MAX; t++) {
		if (!f->tp[t])
			continue;
		uint64_t sum = (uint64_t)fx_count(f, t, KVP_PAGE_FREE) +
			       fx_count(f, t, KVP_PAGE_LEASED) + fx_count(f, t, KVP_PAGE_CACHED) +
			       fx_count(f, t, KVP_PAGE_MOVING);

		ok = ok && kvp_pages_check(f->tp[t]) == 0 && sum == kvp_pages_total(f->tp[t]);
	}
	return ok;
}

/* ---- page contents: a deterministic function of (namespace, prefix tokens) ---- */

static void content(uint64_t key, uint8_t *out)
{
	for (int i = 0; i < PB; i += 8) {
		uint64_t z = (key += 0x9e3779b97f4a7c15ULL);

		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
		z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
		z ^= z >> 31;
		memcpy(out + i, &z, 8);
	}
}

static uint64_t page_key(const struct fx *f, uint64_t ns, const uint32_t *tok, uint32_t pos)
{
	uint8_t k[KVP_PAGE_KEY_BYTES];
	uint64_t v;

	for (uint32_t i = 0; i <= pos; i++)
		kvp_page_key(i ? k : NULL, tok + (size_t)i * f->pt, f->pt, k);
	memcpy(&v, k, sizeof(v));
	return v ^ ns;
}

/* Page `id` of tier t is CACHED and holds the bytes of position pos of (ns, tok). */
static bool page_ok(const struct fx *f, int t, uint32_t id, uint64_t ns, const uint32_t *tok,
		    uint32_t pos)
{
	uint8_t want[PB];

	if (!f->tp[t] || id >= kvp_pages_total(f->tp[t]) ||
	    kvp_pages_state(f->tp[t], id) != KVP_PAGE_CACHED)
		return false;
	content(page_key(f, ns, tok, pos), want);
	return !memcmp(f->mem[t] + (size_t)id * PB, want, PB);
}

/* Leases npages in tier t (evicting the shortfall), writes their contents and inserts them;
 * frees the duplicates. ids (may be NULL) gets the page ids. Returns insert's result, or
 * -ENOSPC when the pages could not be had. */
static int fx_put(struct fx *f, uint64_t ns, const uint32_t *tok, uint32_t npages, int t,
		  struct kvp_index_insert_result *res, uint32_t *ids)
{
	uint32_t pg[64], dup[64];
	struct kvp_index_insert_result r;
	uint32_t nfree = fx_count(f, t, KVP_PAGE_FREE);
	int rc;

	CU_ASSERT_FATAL(npages <= 64);
	if (nfree < npages)
		kvp_index_evict_later(f->pfx, (enum kvp_tier_id)t, npages - nfree);
	if (kvp_pages_alloc(f->tp[t], npages, pg) < 0)
		return -ENOSPC;
	for (uint32_t i = 0; i < npages; i++)
		content(page_key(f, ns, tok, i), f->mem[t] + (size_t)pg[i] * PB);
	rc = kvp_index_insert_tokens(f->pfx, ns, tok, npages, (enum kvp_tier_id)t, pg, &r, dup);
	if (rc < 0) {
		kvp_pages_release(f->tp[t], pg, npages);
		return rc;
	}
	for (uint32_t i = 0; i < r.dup_pages; i++)
		dup[i] = pg[dup[i]];
	CU_ASSERT_EQUAL(kvp_pages_release(f->tp[t], dup, r.dup_pages), 0);
	if (res)
		*res = r;
	if (ids)
		memcpy(ids, pg, npages * sizeof(*pg));
	return 0;
}

static struct kvp_index_match fx_match(struct fx *f, uint64_t ns, const uint32_t *tok,
				       uint32_t ntok, int lock, uint32_t *dev, uint32_t *host)
{
	struct kvp_index_match m;
	uint32_t d[64], h[64];

	memset(&m, 0xff, sizeof(m));
	CU_ASSERT_EQUAL(kvp_index_match_tokens(f->pfx, ns, tok, ntok, lock, &m, dev ? dev : d,
					       host ? host : h),
			0);
	return m;
}

static void seq(uint32_t *tok, uint32_t n, uint32_t first)
{
	for (uint32_t i = 0; i < n; i++)
		tok[i] = first + i;
}

/* ---- targeted cases ---- */

static void test_kvp_prefix_new_bad_conf(void)
{
	struct kvp_pages *a = kvp_pages_new(4), *b = kvp_pages_new(4);
	struct kvp_index_conf c = { .page_tokens = 4, .dev = a };
	struct kvp_index *p;

	CU_ASSERT_PTR_NULL(kvp_index_new(NULL));
	c.page_tokens = 0; /* an index for key calls only: token calls are refused */
	p = kvp_index_new(&c);
	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	CU_ASSERT_EQUAL(kvp_index_insert_tokens(p, 0, (uint32_t[4]){ 0 }, 1, DEV,
						(uint32_t[1]){ KVP_PAGE_NONE }, NULL, NULL),
			-EINVAL);
	CU_ASSERT_EQUAL(kvp_index_match_tokens(p, 0, (uint32_t[4]){ 0 }, 4, 0,
					       &(struct kvp_index_match){ 0 }, NULL, NULL),
			-EINVAL);
	kvp_index_free(p);
	c.page_tokens = (1u << 16) + 1;
	CU_ASSERT_PTR_NULL(kvp_index_new(&c));
	c.page_tokens = 4;
	c.policy = KVP_EVICT_POLICY_MAX;
	CU_ASSERT_PTR_NULL(kvp_index_new(&c));
	c.policy = KVP_EVICT_POLICY_LRU;
	c.dev = NULL;
	CU_ASSERT_PTR_NULL(kvp_index_new(&c)); /* no tier */
	c.dev = a;
	c.host = a;
	CU_ASSERT_PTR_NULL(kvp_index_new(&c)); /* same allocator twice */
	c.host = b;
	CU_ASSERT_PTR_NULL(kvp_index_new(&c)); /* two tiers, no copy */
	c.host = NULL;
	p = kvp_index_new(&c); /* one tier needs no copy */
	CU_ASSERT_PTR_NOT_NULL(p);
	CU_ASSERT_EQUAL(kvp_index_check(p), 0);
	kvp_index_free(p);
	kvp_index_free(NULL);
	kvp_pages_free(a);
	kvp_pages_free(b);
}

static void test_kvp_prefix_match_split_locked(void)
{
	struct fx f;
	uint32_t a[24], ids[6], dev[6];
	struct kvp_index_match m1, m2, m3;
	struct kvp_index_stats st;

	fx_init(&f, 4, 32, 0, KVP_EVICT_POLICY_LRU);
	seq(a, 24, 100);
	CU_ASSERT_EQUAL_FATAL(fx_put(&f, 0, a, 6, DEV, NULL, ids), 0);
	CU_ASSERT_EQUAL(fx_stats(&f).entries, 6); /* one entry per page */
	m1 = fx_match(&f, 0, a, 24, 1, NULL, NULL);
	CU_ASSERT_EQUAL(m1.dev_pages, 6);
	CU_ASSERT_PTR_NOT_NULL_FATAL(m1.lock);
	/* A second lock over the first half: the pages it shares are pinned twice. */
	m2 = fx_match(&f, 0, a, 12, 1, dev, NULL);
	CU_ASSERT_EQUAL(m2.dev_pages, 3);
	CU_ASSERT_EQUAL(memcmp(dev, ids, 3 * sizeof(*ids)), 0);
	CU_ASSERT_PTR_NOT_NULL_FATAL(m2.lock);
	CU_ASSERT_PTR_NOT_EQUAL(m1.lock, m2.lock);
	st = fx_stats(&f);
	CU_ASSERT_EQUAL(st.entries, 6);
	CU_ASSERT_EQUAL(st.protected_pages[DEV], 6);
	CU_ASSERT_EQUAL(st.evictable_pages[DEV], 0);
	CU_ASSERT(fx_sane(&f));
	m3 = fx_match(&f, 0, a, 24, 0, dev, NULL);
	CU_ASSERT_EQUAL(m3.dev_pages, 6);
	CU_ASSERT_PTR_NULL(m3.lock);
	CU_ASSERT_EQUAL(memcmp(dev, ids, sizeof(ids)), 0);
	/* Dropping m1 leaves exactly m2's pages protected. */
	kvp_index_unlock(f.pfx, m1.lock);
	st = fx_stats(&f);
	CU_ASSERT_EQUAL(st.protected_pages[DEV], 3);
	CU_ASSERT_EQUAL(st.evictable_pages[DEV], 3);
	CU_ASSERT_EQUAL(kvp_index_evict_later(f.pfx, DEV, 10), 3);
	CU_ASSERT(fx_sane(&f));
	CU_ASSERT_EQUAL(fx_match(&f, 0, a, 24, 0, NULL, NULL).dev_pages, 3);
	kvp_index_unlock(f.pfx, m2.lock);
	CU_ASSERT_EQUAL(kvp_index_evict_later(f.pfx, DEV, 10), 3);
	st = fx_stats(&f);
	CU_ASSERT_EQUAL(st.cached_pages[DEV], 0);
	CU_ASSERT_EQUAL(st.entries, 0);
	CU_ASSERT_EQUAL(fx_count(&f, DEV, KVP_PAGE_FREE), 32);
	CU_ASSERT(fx_sane(&f));
	fx_fini(&f);
}

static void test_kvp_prefix_match_namespace(void)
{
	struct fx f;
	uint32_t a[16], i1[4], i0[4], dev[4];
	struct kvp_index_insert_result r;
	struct kvp_index_top top[4];

	fx_init(&f, 4, 16, 0, KVP_EVICT_POLICY_LRU);
	seq(a, 16, 7);
	CU_ASSERT_EQUAL_FATAL(fx_put(&f, 1, a, 4, DEV, &r, i1), 0);
	CU_ASSERT_EQUAL(fx_match(&f, 0, a, 16, 0, NULL, NULL).dev_pages, 0);
	CU_ASSERT_EQUAL(fx_match(&f, 2, a, 16, 0, NULL, NULL).dev_pages, 0);
	CU_ASSERT_EQUAL(fx_match(&f, 1, a, 16, 0, dev, NULL).dev_pages, 4);
	CU_ASSERT_EQUAL(memcmp(dev, i1, sizeof(i1)), 0);
	CU_ASSERT_EQUAL_FATAL(fx_put(&f, 0, a, 4, DEV, &r, i0), 0);
	CU_ASSERT_EQUAL(r.new_pages, 4);
	CU_ASSERT_EQUAL(r.dup_pages, 0);
	CU_ASSERT_EQUAL(fx_stats(&f).cached_pages[DEV], 8);
	CU_ASSERT_EQUAL(fx_match(&f, 0, a, 16, 0, dev, NULL).dev_pages, 4);
	CU_ASSERT_EQUAL(memcmp(dev, i0, sizeof(i0)), 0);
	for (int k = 0; k < 4; k++)
		CU_ASSERT(page_ok(&f, DEV, dev[k], 0, a, (uint32_t)k));
	/* one hit on every page of both namespaces: the shortest chains first */
	CU_ASSERT_EQUAL(kvp_index_top(f.pfx, top, 4), 4);
	CU_ASSERT(top[0].ns != top[1].ns);
	CU_ASSERT(top[0].pages == 1 && top[1].pages == 1 && top[2].pages == 2);
	CU_ASSERT(top[0].hits == 1 && !top[0].keyed);
	CU_ASSERT(fx_sane(&f));
	fx_fini(&f);
}

static void test_kvp_prefix_insert_dup(void)
{
	struct fx f;
	uint32_t a[24], pg[6], dup[6], pg2[4];
	struct kvp_index_insert_result r;

	fx_init(&f, 4, 32, 16, KVP_EVICT_POLICY_LRU);
	seq(a, 24, 1);
	CU_ASSERT_EQUAL_FATAL(fx_put(&f, 0, a, 4, DEV, &r, NULL), 0);
	CU_ASSERT_EQUAL(r.new_pages, 4);
	CU_ASSERT_EQUAL(r.dup_pages, 0);
	/* The same 4 pages then 2 more: the first 4 come back as duplicates, still LEASED. */
	CU_ASSERT_EQUAL_FATAL(kvp_pages_alloc(f.tp[DEV], 6, pg), 0);
	memset(dup, 0xff, sizeof(dup));
	CU_ASSERT_EQUAL(kvp_index_insert_tokens(f.pfx, 0, a, 6, DEV, pg, &r, dup), 0);
	CU_ASSERT_EQUAL(r.new_pages, 2);
	CU_ASSERT_EQUAL(r.dup_pages, 4);
	for (uint32_t i = 0; i < 4; i++) {
		CU_ASSERT_EQUAL(dup[i], i);
		CU_ASSERT_EQUAL(kvp_pages_state(f.tp[DEV], pg[i]), KVP_PAGE_LEASED);
	}
	CU_ASSERT_EQUAL(kvp_pages_state(f.tp[DEV], pg[4]), KVP_PAGE_CACHED);
	CU_ASSERT_EQUAL(kvp_pages_release(f.tp[DEV], pg, 4), 0);
	CU_ASSERT_EQUAL(fx_stats(&f).cached_pages[DEV], 6);
	/* Host copies of device-resident positions are duplicates too; dup_idx may be NULL. */
	CU_ASSERT_EQUAL_FATAL(kvp_pages_alloc(f.tp[HOST], 4, pg2), 0);
	CU_ASSERT_EQUAL(kvp_index_insert_tokens(f.pfx, 0, a, 4, HOST, pg2, &r, NULL), 0);
	CU_ASSERT_EQUAL(r.dup_pages, 4);
	CU_ASSERT_EQUAL(fx_count(&f, HOST, KVP_PAGE_LEASED), 4);
	CU_ASSERT_EQUAL(kvp_pages_release(f.tp[HOST], pg2, 4), 0);
	CU_ASSERT_EQUAL(fx_stats(&f).cached_pages[HOST], 0);
	CU_ASSERT(fx_sane(&f));
	fx_fini(&f);
}

static void test_kvp_prefix_insert_invalid(void)
{
	struct fx f;
	uint32_t a[16], pg[4], bad[4];
	struct kvp_index_stats before, after;
	struct kvp_index_insert_result r = { 77, 77, 77 };

	fx_init(&f, 4, 16, 0, KVP_EVICT_POLICY_LRU);
	seq(a, 16, 1);
	CU_ASSERT_EQUAL_FATAL(fx_put(&f, 0, a, 2, DEV, NULL, NULL), 0);
	CU_ASSERT_EQUAL_FATAL(kvp_pages_alloc(f.tp[DEV], 4, pg), 0);
	before = fx_stats(&f);
	CU_ASSERT_EQUAL(kvp_index_insert_tokens(f.pfx, 0, a, 0, DEV, pg, &r, NULL), -EINVAL);
	CU_ASSERT_EQUAL(kvp_index_insert_tokens(f.pfx, 0, a, 4, HOST, pg, &r, NULL), -EINVAL);
	CU_ASSERT_EQUAL(kvp_index_insert_tokens(f.pfx, 0, a, 4, KVP_TIER_ID_MAX, pg, &r, NULL),
			-EINVAL);
	CU_ASSERT_EQUAL(kvp_index_insert_tokens(f.pfx, 0, NULL, 4, DEV, pg, &r, NULL), -EINVAL);
	CU_ASSERT_EQUAL(kvp_index_insert_tokens(NULL, 0, a, 4, DEV, pg, &r, NULL), -EINVAL);
	memcpy(bad, pg, sizeof(bad));
	bad[3] = 15; /* a FREE page */
	CU_ASSERT_EQUAL(kvp_index_insert_tokens(f.pfx, 0, a, 4, DEV, bad, &r, NULL), -EINVAL);
	bad[3] = 0; /* a CACHED page (the tree's own) */
	CU_ASSERT_EQUAL(kvp_index_insert_tokens(f.pfx, 0, a, 4, DEV, bad, &r, NULL), -EINVAL);
	bad[3] = 9999; /* out of range */
	CU_ASSERT_EQUAL(kvp_index_insert_tokens(f.pfx, 0, a, 4, DEV, bad, &r, NULL), -EINVAL);
	bad[3] = bad[1]; /* listed twice */
	CU_ASSERT_EQUAL(kvp_index_insert_tokens(f.pfx, 0, a, 4, DEV, bad, &r, NULL), -EINVAL);
	after = fx_stats(&f);
	CU_ASSERT_EQUAL(memcmp(&before, &after, sizeof(before)), 0);
	CU_ASSERT_EQUAL(r.new_pages, 77); /* output untouched on failure */
	CU_ASSERT_EQUAL(fx_count(&f, DEV, KVP_PAGE_LEASED), 4);
	for (int i = 0; i < 4; i++)
		CU_ASSERT_EQUAL(kvp_pages_state(f.tp[DEV], pg[i]), KVP_PAGE_LEASED);
	CU_ASSERT(fx_sane(&f));
	CU_ASSERT_EQUAL(kvp_pages_release(f.tp[DEV], pg, 4), 0);
	fx_fini(&f);
}

static void test_kvp_prefix_insert_upgrade(void)
{
	struct fx f;
	uint32_t a[16], b[16], c[8], dev[4], host[4];
	struct kvp_index_insert_result r;
	struct kvp_index_stats st;
	struct kvp_index_match m, lk;

	fx_init(&f, 4, 32, 32, KVP_EVICT_POLICY_LRU);
	seq(a, 16, 1);
	seq(b, 16, 501);
	seq(c, 8, 901);
	CU_ASSERT_EQUAL_FATAL(fx_put(&f, 0, a, 4, HOST, NULL, NULL), 0);
	CU_ASSERT_EQUAL(fx_stats(&f).cached_pages[HOST], 4);
	/* Recomputed on device: the tree takes the device pages and frees the host pages. */
	CU_ASSERT_EQUAL_FATAL(fx_put(&f, 0, a, 4, DEV, &r, NULL), 0);
	CU_ASSERT_EQUAL(r.new_pages, 4);
	CU_ASSERT_EQUAL(r.dup_pages, 0);
	st = fx_stats(&f);
	CU_ASSERT_EQUAL(st.cached_pages[DEV], 4);
	CU_ASSERT_EQUAL(st.cached_pages[HOST], 0);
	CU_ASSERT_EQUAL(fx_count(&f, HOST, KVP_PAGE_FREE), 32);
	m = fx_match(&f, 0, a, 16, 0, dev, host);
	CU_ASSERT_EQUAL(m.dev_pages, 4);
	CU_ASSERT_EQUAL(m.host_pages, 0);
	for (uint32_t k = 0; k < 4; k++)
		CU_ASSERT(page_ok(&f, DEV, dev[k], 0, a, k));
	/* Partial upgrade: device first half, host second half, in one node. */
	CU_ASSERT_EQUAL_FATAL(fx_put(&f, 0, b, 4, HOST, NULL, NULL), 0);
	CU_ASSERT_EQUAL_FATAL(fx_put(&f, 0, b, 2, DEV, &r, NULL), 0);
	CU_ASSERT_EQUAL(r.new_pages, 2);
	m = fx_match(&f, 0, b, 16, 0, dev, host);
	CU_ASSERT_EQUAL(m.dev_pages, 2);
	CU_ASSERT_EQUAL(m.host_pages, 2);
	for (uint32_t k = 0; k < 2; k++) {
		CU_ASSERT(page_ok(&f, DEV, dev[k], 0, b, k));
		CU_ASSERT(page_ok(&f, HOST, host[k], 0, b, k + 2));
	}
	/* A locked host path is not upgraded: the device pages are duplicates. */
	CU_ASSERT_EQUAL_FATAL(fx_put(&f, 0, c, 2, HOST, NULL, NULL), 0);
	lk = fx_match(&f, 0, c, 8, 1, NULL, host);
	CU_ASSERT_EQUAL(lk.host_pages, 2);
	CU_ASSERT_EQUAL_FATAL(fx_put(&f, 0, c, 2, DEV, &r, NULL), 0);
	CU_ASSERT_EQUAL(r.dup_pages, 2);
	CU_ASSERT(page_ok(&f, HOST, host[0], 0, c, 0));
	CU_ASSERT(page_ok(&f, HOST, host[1], 0, c, 1));
	kvp_index_unlock(f.pfx, lk.lock);
	CU_ASSERT(fx_sane(&f));
	fx_fini(&f);
}

/* Positions the caller matched earlier are named with KVP_PAGE_NONE instead of a page. */
static void test_kvp_prefix_insert_named_positions(void)
{
	struct fx f;
	uint32_t a[24], h[16], x[16], pg[6], dup[6], dev[6], host[6];
	uint32_t none = KVP_PAGE_NONE;
	struct kvp_index_insert_result r;
	struct kvp_index_match m;

	fx_init(&f, 4, 32, 32, KVP_EVICT_POLICY_LRU);
	seq(a, 24, 1);
	seq(h, 16, 500);
	CU_ASSERT_EQUAL_FATAL(fx_put(&f, 0, a, 4, DEV, NULL, NULL), 0);
	/* Named prefix, then new pages: the new pages are cached after it. */
	CU_ASSERT_EQUAL_FATAL(kvp_pages_alloc(f.tp[DEV], 2, pg + 4), 0);
	pg[0] = pg[1] = pg[2] = pg[3] = none;
	for (uint32_t k = 4; k < 6; k++)
		content(page_key(&f, 0, a, k), f.mem[DEV] + (size_t)pg[k] * PB);
	CU_ASSERT_EQUAL(kvp_index_insert_tokens(f.pfx, 0, a, 6, DEV, pg, &r, dup), 0);
	CU_ASSERT_EQUAL(r.new_pages, 2);
	CU_ASSERT_EQUAL(r.dup_pages, 0);
	CU_ASSERT_EQUAL(r.done_keys, 6);
	CU_ASSERT_EQUAL(fx_stats(&f).entries, 6);
	m = fx_match(&f, 0, a, 24, 0, dev, NULL);
	CU_ASSERT_EQUAL_FATAL(m.dev_pages, 6);
	for (uint32_t k = 0; k < 6; k++)
		CU_ASSERT(page_ok(&f, DEV, dev[k], 0, a, k));
	CU_ASSERT(fx_sane(&f));

	/* A named position lost since the match ends the insert; later pages stay leased. */
	CU_ASSERT_EQUAL(kvp_index_evict_later(f.pfx, DEV, 3), 3); /* a keeps 3 pages */
	seq(a + 12, 12, 900);					  /* a new tail for positions 3.. */
	CU_ASSERT_EQUAL_FATAL(kvp_pages_alloc(f.tp[DEV], 2, pg + 4), 0);
	CU_ASSERT_EQUAL(kvp_index_insert_tokens(f.pfx, 0, a, 6, DEV, pg, &r, dup), 0);
	CU_ASSERT_EQUAL(r.done_keys, 3);
	CU_ASSERT_EQUAL(r.new_pages, 0);
	CU_ASSERT_EQUAL(r.dup_pages, 0);
	CU_ASSERT_EQUAL(kvp_pages_state(f.tp[DEV], pg[4]), KVP_PAGE_LEASED);
	CU_ASSERT_EQUAL(kvp_pages_state(f.tp[DEV], pg[5]), KVP_PAGE_LEASED);
	CU_ASSERT_EQUAL(fx_stats(&f).cached_pages[DEV], 3);
	CU_ASSERT(fx_sane(&f));
	CU_ASSERT_EQUAL(kvp_pages_release(f.tp[DEV], pg + 4, 2), 0);

	/* Named host pages then device pages: no upgrade below a host page (a chain stays device
	 * pages first), so the device pages are duplicates. */
	CU_ASSERT_EQUAL_FATAL(fx_put(&f, 0, h, 4, HOST, NULL, NULL), 0);
	CU_ASSERT_EQUAL_FATAL(kvp_pages_alloc(f.tp[DEV], 2, pg + 2), 0);
	pg[0] = pg[1] = none;
	CU_ASSERT_EQUAL(kvp_index_insert_tokens(f.pfx, 0, h, 4, DEV, pg, &r, dup), 0);
	CU_ASSERT_EQUAL(r.new_pages, 0);
	CU_ASSERT_EQUAL(r.dup_pages, 2);
	CU_ASSERT_EQUAL(r.done_keys, 4);
	CU_ASSERT_EQUAL(dup[0], 2);
	CU_ASSERT_EQUAL(dup[1], 3);
	CU_ASSERT_EQUAL(kvp_pages_release(f.tp[DEV], pg + 2, 2), 0);
	/* A device page for the first host page upgrades it; the run ends at the named one. */
	CU_ASSERT_EQUAL_FATAL(kvp_pages_alloc(f.tp[DEV], 3, pg), 0);
	pg[3] = pg[2];
	pg[2] = pg[1];
	pg[1] = none;
	content(page_key(&f, 0, h, 0), f.mem[DEV] + (size_t)pg[0] * PB);
	CU_ASSERT_EQUAL(kvp_index_insert_tokens(f.pfx, 0, h, 4, DEV, pg, &r, dup), 0);
	CU_ASSERT_EQUAL(r.new_pages, 1);
	CU_ASSERT_EQUAL(r.dup_pages, 2);
	CU_ASSERT_EQUAL(dup[0], 2);
	CU_ASSERT_EQUAL(dup[1], 3);
	CU_ASSERT_EQUAL(kvp_pages_release(f.tp[DEV], pg + 2, 2), 0);
	m = fx_match(&f, 0, h, 16, 0, dev, host);
	CU_ASSERT_EQUAL(m.dev_pages, 1);
	CU_ASSERT_EQUAL_FATAL(m.host_pages, 3);
	CU_ASSERT(page_ok(&f, DEV, dev[0], 0, h, 0));
	for (uint32_t k = 0; k < 3; k++)
		CU_ASSERT(page_ok(&f, HOST, host[k], 0, h, k + 1));
	CU_ASSERT(fx_sane(&f));

	/* Named positions, then new pages diverging from a cached chain; only named positions and
	 * nothing cached: no namespace record appears. */
	memcpy(x, h, sizeof(x));
	x[9] = 4242;
	CU_ASSERT_EQUAL_FATAL(kvp_pages_alloc(f.tp[HOST], 2, pg + 2), 0);
	pg[0] = pg[1] = none;
	for (uint32_t k = 2; k < 4; k++)
		content(page_key(&f, 0, x, k), f.mem[HOST] + (size_t)pg[k] * PB);
	CU_ASSERT_EQUAL(kvp_index_insert_tokens(f.pfx, 0, x, 4, HOST, pg, &r, dup), 0);
	CU_ASSERT_EQUAL(r.new_pages, 2);
	CU_ASSERT_EQUAL(r.done_keys, 4);
	m = fx_match(&f, 0, x, 16, 0, dev, host);
	CU_ASSERT_EQUAL(m.dev_pages + m.host_pages, 4);
	pg[0] = pg[1] = none;
	CU_ASSERT_EQUAL(kvp_index_insert_tokens(f.pfx, 9, x, 2, DEV, pg, &r, dup), 0);
	CU_ASSERT_EQUAL(r.done_keys, 0);
	CU_ASSERT_EQUAL(r.new_pages + r.dup_pages, 0);
	CU_ASSERT_EQUAL(fx_match(&f, 9, x, 16, 0, dev, host).dev_pages, 0);
	CU_ASSERT(fx_sane(&f));
	fx_fini(&f);
}

static void test_kvp_prefix_insert_extend(void)
{
	struct fx f;
	uint32_t a[32], dev[8];
	struct kvp_index_insert_result r;
	struct kvp_index_match lk;

	fx_init(&f, 4, 32, 0, KVP_EVICT_POLICY_LRU);
	seq(a, 32, 1);
	/* Growing a sequence turn by turn adds one entry per turn. */
	for (uint32_t n = 1; n <= 4; n++) {
		CU_ASSERT_EQUAL_FATAL(fx_put(&f, 0, a, n, DEV, &r, NULL), 0);
		CU_ASSERT_EQUAL(r.new_pages, 1);
		CU_ASSERT_EQUAL(fx_stats(&f).entries, n);
	}
	CU_ASSERT_EQUAL(fx_match(&f, 0, a, 32, 0, dev, NULL).dev_pages, 4);
	for (uint32_t k = 0; k < 4; k++)
		CU_ASSERT(page_ok(&f, DEV, dev[k], 0, a, k));
	/* A locked run is extended below without growing the lock. */
	lk = fx_match(&f, 0, a, 16, 1, NULL, NULL);
	CU_ASSERT_EQUAL_FATAL(fx_put(&f, 0, a, 6, DEV, &r, NULL), 0);
	CU_ASSERT_EQUAL(r.new_pages, 2);
	CU_ASSERT_EQUAL(fx_stats(&f).entries, 6);
	CU_ASSERT_EQUAL(fx_stats(&f).protected_pages[DEV], 4);
	CU_ASSERT_EQUAL(fx_match(&f, 0, a, 32, 0, dev, NULL).dev_pages, 6);
	for (uint32_t k = 0; k < 6; k++)
		CU_ASSERT(page_ok(&f, DEV, dev[k], 0, a, k));
	kvp_index_unlock(f.pfx, lk.lock);
	CU_ASSERT(fx_sane(&f));
	fx_fini(&f);
}

static void test_kvp_prefix_evict_exact(void)
{
	struct fx f;
	uint32_t a[16], b[16], c[16];
	struct kvp_index_stats st;

	fx_init(&f, 4, 16, 0, KVP_EVICT_POLICY_LRU);
	seq(a, 16, 100);
	seq(b, 16, 200);
	seq(c, 16, 300);
	CU_ASSERT_EQUAL_FATAL(fx_put(&f, 0, a, 4, DEV, NULL, NULL), 0);
	CU_ASSERT_EQUAL_FATAL(fx_put(&f, 0, b, 4, DEV, NULL, NULL), 0);
	CU_ASSERT_EQUAL_FATAL(fx_put(&f, 0, c, 4, DEV, NULL, NULL), 0);
	CU_ASSERT_EQUAL(kvp_index_evict_later(f.pfx, DEV, 0), 0);
	CU_ASSERT_EQUAL(kvp_index_evict_later(f.pfx, HOST, 3), 0); /* no host tier */
	/* Exactly the shortfall: all of a (coldest), then b's deepest page only. */
	CU_ASSERT_EQUAL(kvp_index_evict_later(f.pfx, DEV, 5), 5);
	st = fx_stats(&f);
	CU_ASSERT_EQUAL(st.cached_pages[DEV], 7);
	CU_ASSERT_EQUAL(st.evictable_pages[DEV], 7);
	CU_ASSERT_EQUAL(st.evicted_pages[DEV], 5);
	CU_ASSERT_EQUAL(st.demoted_pages, 0);
	CU_ASSERT_EQUAL(fx_count(&f, DEV, KVP_PAGE_FREE), 9);
	CU_ASSERT(fx_sane(&f));
	CU_ASSERT_EQUAL(fx_match(&f, 0, a, 16, 0, NULL, NULL).dev_pages, 0);
	CU_ASSERT_EQUAL(fx_match(&f, 0, b, 16, 0, NULL, NULL).dev_pages, 3);
	CU_ASSERT_EQUAL(fx_match(&f, 0, c, 16, 0, NULL, NULL).dev_pages, 4);
	CU_ASSERT_EQUAL(kvp_index_evict_later(f.pfx, DEV, 100), 7);
	CU_ASSERT_EQUAL(fx_stats(&f).entries, 0);
	CU_ASSERT(fx_sane(&f));
	fx_fini(&f);
}

static void test_kvp_prefix_evict_all_locked(void)
{
	struct fx f;
	uint32_t a[16], b[16];
	struct kvp_index_stats before, after;
	struct kvp_index_match ma, mb;

	fx_init(&f, 4, 8, 8, KVP_EVICT_POLICY_LRU);
	seq(a, 16, 100);
	seq(b, 16, 200);
	CU_ASSERT_EQUAL_FATAL(fx_put(&f, 0, a, 4, DEV, NULL, NULL), 0);
	CU_ASSERT_EQUAL_FATAL(fx_put(&f, 0, b, 4, HOST, NULL, NULL), 0);
	ma = fx_match(&f, 0, a, 16, 1, NULL, NULL);
	mb = fx_match(&f, 0, b, 16, 1, NULL, NULL);
	before = fx_stats(&f);
	CU_ASSERT_EQUAL(before.evictable_pages[DEV] + before.evictable_pages[HOST], 0);
	CU_ASSERT_EQUAL(before.protected_pages[DEV], 4);
	CU_ASSERT_EQUAL(before.protected_pages[HOST], 4);
	CU_ASSERT_EQUAL(kvp_index_evict_later(f.pfx, DEV, 4), 0);
	CU_ASSERT_EQUAL(kvp_index_evict_later(f.pfx, HOST, 4), 0);
	CU_ASSERT_EQUAL(kvp_index_flush(f.pfx), 0);
	after = fx_stats(&f);
	CU_ASSERT_EQUAL(memcmp(&before, &after, sizeof(before)), 0);
	CU_ASSERT(fx_sane(&f));
	kvp_index_unlock(f.pfx, ma.lock);
	kvp_index_unlock(f.pfx, mb.lock);
	CU_ASSERT_EQUAL(kvp_index_flush(f.pfx), 8);
	CU_ASSERT_EQUAL(fx_stats(&f).entries, 0);
	CU_ASSERT(fx_sane(&f));
	fx_fini(&f);
}

static void test_kvp_prefix_evict_demote_bytes(void)
{
	struct fx f;
	uint32_t a[16], h[16], dev[4], host[4], n = 0;
	struct kvp_index_stats st;
	struct kvp_index_match m;

	fx_init(&f, 4, 8, 6, KVP_EVICT_POLICY_LRU);
	seq(h, 16, 900);
	seq(a, 16, 100);
	CU_ASSERT_EQUAL_FATAL(fx_put(&f, 0, h, 4, HOST, NULL, NULL), 0); /* older, host only */
	CU_ASSERT_EQUAL_FATAL(fx_put(&f, 0, a, 4, DEV, NULL, NULL), 0);
	/* 2 host pages free, 4 to demote: the 2 coldest host pages (h's deepest) make room. */
	CU_ASSERT_EQUAL(kvp_index_evict_later(f.pfx, DEV, 4), 4);
	st = fx_stats(&f);
	CU_ASSERT_EQUAL(st.demoted_pages, 4);
	CU_ASSERT_EQUAL(st.evicted_pages[DEV], 4);
	CU_ASSERT_EQUAL(st.evicted_pages[HOST], 2);
	CU_ASSERT_EQUAL(st.cached_pages[DEV], 0);
	CU_ASSERT_EQUAL(st.cached_pages[HOST], 6);
	CU_ASSERT_EQUAL(fx_count(&f, DEV, KVP_PAGE_FREE), 8);
	CU_ASSERT(fx_sane(&f));
	m = fx_match(&f, 0, h, 16, 0, NULL, host);
	CU_ASSERT_EQUAL(m.host_pages, 2);
	m = fx_match(&f, 0, a, 16, 1, dev, host);
	CU_ASSERT_EQUAL(m.dev_pages, 0);
	CU_ASSERT_EQUAL_FATAL(m.host_pages, 4);
	for (uint32_t k = 0; k < 4; k++)
		CU_ASSERT(page_ok(&f, HOST, host[k], 0, a, k));
	/* And back: promotion copies the bytes to new device pages. */
	CU_ASSERT_EQUAL(kvp_index_promote(f.pfx, m.lock, dev, 3, &n), -EINVAL); /* cap */
	CU_ASSERT_EQUAL(kvp_index_promote(f.pfx, m.lock, dev, 4, &n), 0);
	CU_ASSERT_EQUAL(n, 4);
	for (uint32_t k = 0; k < 4; k++)
		CU_ASSERT(page_ok(&f, DEV, dev[k], 0, a, k));
	st = fx_stats(&f);
	CU_ASSERT_EQUAL(st.promoted_pages, 4);
	CU_ASSERT_EQUAL(st.cached_pages[HOST], 2);
	CU_ASSERT_EQUAL(st.protected_pages[DEV], 4);
	CU_ASSERT_EQUAL(f.copied[KVP_COPY_DEMOTE], 4);
	CU_ASSERT_EQUAL(f.copied[KVP_COPY_PROMOTE], 4);
	/* Promoting an all-device path copies nothing and lists the pages again. */
	CU_ASSERT_EQUAL(kvp_index_promote(f.pfx, m.lock, host, 4, &n), 0);
	CU_ASSERT_EQUAL(memcmp(host, dev, sizeof(dev)), 0);
	CU_ASSERT_EQUAL(f.copied[KVP_COPY_PROMOTE], 4);
	kvp_index_unlock(f.pfx, m.lock);
	CU_ASSERT(fx_sane(&f));
	fx_fini(&f);
}

/* An asynchronous demotion: while in flight, the device pages are cached, protected, matched as
 * device pages and not free; the host pages are MOVING and matched by nothing; landing swaps
 * them in with the right bytes. */
static void test_kvp_prefix_demote_async_in_flight(void)
{
	struct fx f;
	uint32_t a[16], dev[4], host[4];
	struct kvp_index_stats st;
	struct kvp_index_match m;

	fx_async = true;
	fx_init(&f, 4, 8, 8, KVP_EVICT_POLICY_LRU);
	fx_async = false;
	seq(a, 16, 100);
	CU_ASSERT_EQUAL_FATAL(fx_put(&f, 0, a, 4, DEV, NULL, NULL), 0);
	CU_ASSERT_EQUAL(kvp_index_evict_later(f.pfx, DEV, 4), 0); /* started, nothing free yet */
	CU_ASSERT_EQUAL_FATAL(f.nflight, 1);
	CU_ASSERT_EQUAL(f.flight[0].n, 4);
	st = fx_stats(&f);
	CU_ASSERT_EQUAL(st.inflight_pages, 4);
	CU_ASSERT_EQUAL(st.moving_pages, 4);
	CU_ASSERT_EQUAL(st.flights, 1);
	CU_ASSERT_EQUAL(st.cached_pages[DEV], 4);
	CU_ASSERT_EQUAL(st.protected_pages[DEV], 4);
	CU_ASSERT_EQUAL(st.evictable_pages[DEV], 0);
	CU_ASSERT_EQUAL(st.demoted_pages, 0);
	CU_ASSERT_EQUAL(fx_count(&f, DEV, KVP_PAGE_FREE), 4);
	CU_ASSERT_EQUAL(fx_count(&f, HOST, KVP_PAGE_MOVING), 4);
	CU_ASSERT_EQUAL(fx_count(&f, HOST, KVP_PAGE_FREE), 4);
	CU_ASSERT(fx_sane(&f));
	/* Nothing more to evict, flush keeps the path, match sees device pages. */
	CU_ASSERT_EQUAL(kvp_index_evict_later(f.pfx, DEV, 4), 0);
	CU_ASSERT_EQUAL(f.nflight, 1);
	CU_ASSERT_EQUAL(kvp_index_flush(f.pfx), 0);
	m = fx_match(&f, 0, a, 16, 0, dev, host);
	CU_ASSERT_EQUAL(m.dev_pages, 4);
	CU_ASSERT_EQUAL(m.host_pages, 0);
	for (uint32_t k = 0; k < 4; k++)
		CU_ASSERT(page_ok(&f, DEV, dev[k], 0, a, k));
	CU_ASSERT(fx_sane(&f));
	fx_land(&f, 0, 0);
	st = fx_stats(&f);
	CU_ASSERT_EQUAL(st.inflight_pages, 0);
	CU_ASSERT_EQUAL(st.moving_pages, 0);
	CU_ASSERT_EQUAL(st.flights, 0);
	CU_ASSERT_EQUAL(st.demoted_pages, 4);
	CU_ASSERT_EQUAL(st.evicted_pages[DEV], 4);
	CU_ASSERT_EQUAL(st.cached_pages[HOST], 4);
	CU_ASSERT_EQUAL(st.protected_pages[DEV], 0);
	CU_ASSERT_EQUAL(fx_count(&f, DEV, KVP_PAGE_FREE), 8);
	CU_ASSERT_EQUAL(fx_count(&f, HOST, KVP_PAGE_MOVING), 0);
	CU_ASSERT(fx_sane(&f));
	m = fx_match(&f, 0, a, 16, 0, dev, host);
	CU_ASSERT_EQUAL(m.dev_pages, 0);
	CU_ASSERT_EQUAL_FATAL(m.host_pages, 4);
	for (uint32_t k = 0; k < 4; k++)
		CU_ASSERT(page_ok(&f, HOST, host[k], 0, a, k));
	fx_fini(&f);
}

/* A failed flight gives its host pages back and leaves the device pages cached; a copy_start
 * that finishes at once (0) or refuses (< 0) is the synchronous demotion or its failure. */
static void test_kvp_prefix_demote_async_fails(void)
{
	struct fx f;
	uint32_t a[16], b[16], dev[4], host[4];
	struct kvp_index_stats st;
	struct kvp_index_match m;

	fx_async = true;
	fx_init(&f, 4, 8, 8, KVP_EVICT_POLICY_LRU);
	fx_async = false;
	seq(a, 16, 100);
	seq(b, 16, 300);
	CU_ASSERT_EQUAL_FATAL(fx_put(&f, 0, a, 4, DEV, NULL, NULL), 0);
	CU_ASSERT_EQUAL(kvp_index_evict_later(f.pfx, DEV, 2), 0);
	CU_ASSERT_EQUAL_FATAL(f.nflight, 1);
	fx_land(&f, 0, -EIO);
	st = fx_stats(&f);
	CU_ASSERT_EQUAL(st.demoted_pages, 0);
	CU_ASSERT_EQUAL(st.moving_pages, 0);
	CU_ASSERT_EQUAL(st.cached_pages[DEV], 4);
	CU_ASSERT_EQUAL(st.evictable_pages[DEV], 4);
	CU_ASSERT_EQUAL(fx_count(&f, HOST, KVP_PAGE_FREE), 8);
	CU_ASSERT(fx_sane(&f));
	m = fx_match(&f, 0, a, 16, 0, dev, host);
	CU_ASSERT_EQUAL(m.dev_pages, 4);
	for (uint32_t k = 0; k < 4; k++)
		CU_ASSERT(page_ok(&f, DEV, dev[k], 0, a, k));
	/* Finished at once: freed now. */
	f.start_now = true;
	CU_ASSERT_EQUAL(kvp_index_evict_later(f.pfx, DEV, 2), 2);
	CU_ASSERT_EQUAL(f.nflight, 0);
	CU_ASSERT_EQUAL(fx_stats(&f).demoted_pages, 2);
	CU_ASSERT(fx_sane(&f));
	/* Refused: a device-only leaf with host pages after it cannot be dropped instead. */
	f.copy_fail = -EIO;
	CU_ASSERT_EQUAL(kvp_index_evict_later(f.pfx, DEV, 2), 0);
	CU_ASSERT_EQUAL(fx_count(&f, HOST, KVP_PAGE_MOVING), 0);
	CU_ASSERT(fx_sane(&f));
	f.copy_fail = 0;
	(void)b;
	fx_fini(&f);
}

/* Evictions that need the pages now demote synchronously even with copy_start: evict_now, and
 * promotion's own eviction. */
static void test_kvp_prefix_demote_async_not_for_promotion(void)
{
	struct fx f;
	uint32_t a[16], b[16], dev[4], host[4], n = 0;
	struct kvp_index_match m;

	fx_async = true;
	fx_init(&f, 4, 4, 8, KVP_EVICT_POLICY_LRU);
	fx_async = false;
	seq(a, 16, 100);
	seq(b, 16, 500);
	CU_ASSERT_EQUAL_FATAL(fx_put(&f, 0, a, 4, DEV, NULL, NULL), 0);
	CU_ASSERT_EQUAL(kvp_index_evict(f.pfx, DEV, 4), 4);
	CU_ASSERT_EQUAL(f.nflight, 0);
	CU_ASSERT_EQUAL(fx_stats(&f).demoted_pages, 4);
	CU_ASSERT_EQUAL(kvp_pages_alloc(f.tp[DEV], 4, dev), 0); /* b's pages, cached below */
	for (uint32_t i = 0; i < 4; i++)
		content(page_key(&f, 0, b, i), f.mem[DEV] + (size_t)dev[i] * PB);
	CU_ASSERT_EQUAL_FATAL(kvp_index_insert_tokens(f.pfx, 0, b, 4, DEV, dev, NULL, NULL), 0);
	m = fx_match(&f, 0, a, 16, 1, dev, host);
	CU_ASSERT_EQUAL_FATAL(m.host_pages, 4);
	CU_ASSERT_EQUAL(kvp_index_promote(f.pfx, m.lock, dev, 4, &n), 0); /* b demoted now */
	CU_ASSERT_EQUAL(n, 4);
	CU_ASSERT_EQUAL(f.nflight, 0);
	for (uint32_t k = 0; k < 4; k++)
		CU_ASSERT(page_ok(&f, DEV, dev[k], 0, a, k));
	kvp_index_unlock(f.pfx, m.lock);
	m = fx_match(&f, 0, b, 16, 0, dev, host);
	CU_ASSERT_EQUAL_FATAL(m.host_pages, 4);
	for (uint32_t k = 0; k < 4; k++)
		CU_ASSERT(page_ok(&f, HOST, host[k], 0, b, k));
	CU_ASSERT(fx_sane(&f));
	fx_fini(&f);
}

/* A split of the node while its pages are in flight (an insert diverging inside the moving
 * pages) moves part of them into the new upper node: landing finds them in both. */
static void test_kvp_prefix_demote_async_split(void)
{
	struct fx f;
	uint32_t a[16], b[16], dev[4], host[4];
	struct kvp_index_match m;

	fx_async = true;
	fx_init(&f, 4, 12, 8, KVP_EVICT_POLICY_LRU);
	fx_async = false;
	seq(a, 16, 100);
	memcpy(b, a, sizeof(b));
	b[12] = 999; /* b shares a's first 3 pages */
	CU_ASSERT_EQUAL_FATAL(fx_put(&f, 0, a, 4, DEV, NULL, NULL), 0);
	CU_ASSERT_EQUAL(kvp_index_evict_later(f.pfx, DEV, 2), 0); /* a's pages 2 and 3 */
	CU_ASSERT_EQUAL_FATAL(f.nflight, 1);
	CU_ASSERT_EQUAL_FATAL(fx_put(&f, 0, b, 4, DEV, NULL, NULL), 0); /* b[3] beside a[3] */
	CU_ASSERT(fx_sane(&f));
	CU_ASSERT_EQUAL(fx_stats(&f).entries, 5); /* a[0..4), b[3] */
	fx_land(&f, 0, 0);
	CU_ASSERT(fx_sane(&f));
	CU_ASSERT_EQUAL(fx_stats(&f).demoted_pages, 2);
	m = fx_match(&f, 0, a, 16, 0, dev, host);
	CU_ASSERT_EQUAL_FATAL(m.dev_pages, 2);
	CU_ASSERT_EQUAL_FATAL(m.host_pages, 2);
	for (uint32_t k = 0; k < 2; k++) {
		CU_ASSERT(page_ok(&f, DEV, dev[k], 0, a, k));
		CU_ASSERT(page_ok(&f, HOST, host[k], 0, a, 2 + k));
	}
	m = fx_match(&f, 0, b, 16, 0, dev, host);
	CU_ASSERT_EQUAL(m.dev_pages, 2);
	CU_ASSERT_EQUAL(m.host_pages, 1); /* b[3] is a device page below host pages: not matched */
	fx_fini(&f);
}

static void test_kvp_prefix_promote_enospc(void)
{
	struct fx f, g;
	uint32_t a[16], b[16], out[8], n = 99;
	struct kvp_index_stats before, after;
	struct kvp_index_match ma, mb;
	uint32_t cnt[2][3];

	fx_init(&f, 4, 4, 8, KVP_EVICT_POLICY_LRU);
	seq(a, 16, 100);
	seq(b, 16, 200);
	CU_ASSERT_EQUAL_FATAL(fx_put(&f, 0, a, 4, HOST, NULL, NULL), 0);
	CU_ASSERT_EQUAL_FATAL(fx_put(&f, 0, b, 4, DEV, NULL, NULL), 0);
	mb = fx_match(&f, 0, b, 16, 1, NULL, NULL); /* the device is full of locked pages */
	ma = fx_match(&f, 0, a, 16, 1, NULL, NULL);
	CU_ASSERT_EQUAL_FATAL(ma.host_pages, 4);
	before = fx_stats(&f);
	for (int t = 0; t < 2; t++)
		for (int s = 0; s < 3; s++)
			cnt[t][s] = fx_count(&f, t, (enum kvp_page_state)s);
	CU_ASSERT_EQUAL(kvp_index_promote(f.pfx, ma.lock, out, 8, &n), -ENOSPC);
	CU_ASSERT_EQUAL(n, 99);
	after = fx_stats(&f);
	CU_ASSERT_EQUAL(memcmp(&before, &after, sizeof(before)), 0);
	for (int t = 0; t < 2; t++)
		for (int s = 0; s < 3; s++)
			CU_ASSERT_EQUAL(cnt[t][s], fx_count(&f, t, (enum kvp_page_state)s));
	CU_ASSERT_EQUAL(f.copied[KVP_COPY_PROMOTE], 0);
	CU_ASSERT(fx_sane(&f));
	/* Once b is unlocked, promotion demotes b to make room. */
	kvp_index_unlock(f.pfx, mb.lock);
	CU_ASSERT_EQUAL(kvp_index_promote(f.pfx, ma.lock, out, 8, &n), 0);
	CU_ASSERT_EQUAL(n, 4);
	for (uint32_t k = 0; k < 4; k++)
		CU_ASSERT(page_ok(&f, DEV, out[k], 0, a, k));
	CU_ASSERT_EQUAL(fx_stats(&f).demoted_pages, 4);
	mb = fx_match(&f, 0, b, 16, 0, NULL, out);
	CU_ASSERT_EQUAL(mb.host_pages, 4);
	for (uint32_t k = 0; k < 4; k++)
		CU_ASSERT(page_ok(&f, HOST, out[k], 0, b, k));
	CU_ASSERT_EQUAL(kvp_index_promote(f.pfx, NULL, out, 8, &n), -EINVAL);
	kvp_index_unlock(f.pfx, ma.lock);
	CU_ASSERT(fx_sane(&f));
	fx_fini(&f);
	/* No device tier: -EINVAL. */
	fx_init(&g, 4, 0, 8, KVP_EVICT_POLICY_LRU);
	CU_ASSERT_EQUAL_FATAL(fx_put(&g, 0, a, 2, HOST, NULL, NULL), 0);
	ma = fx_match(&g, 0, a, 16, 1, NULL, NULL);
	CU_ASSERT_EQUAL(kvp_index_promote(g.pfx, ma.lock, out, 8, &n), -EINVAL);
	kvp_index_unlock(g.pfx, ma.lock);
	CU_ASSERT(fx_sane(&g));
	fx_fini(&g);
}

/* A second lock on the same host pages keeps them where they are: its holder may read them. */
static void test_kvp_prefix_promote_busy_when_shared(void)
{
	struct fx f;
	uint32_t a[16], out[8], hostids[8], n = 99;
	struct kvp_index_match m1, m2;

	fx_init(&f, 4, 8, 8, KVP_EVICT_POLICY_LRU);
	seq(a, 16, 300);
	CU_ASSERT_EQUAL_FATAL(fx_put(&f, 0, a, 4, HOST, NULL, NULL), 0);
	m1 = fx_match(&f, 0, a, 16, 1, NULL, NULL);
	m2 = fx_match(&f, 0, a, 8, 1, NULL, hostids); /* another holder, a shorter prefix */
	CU_ASSERT_EQUAL_FATAL(m1.host_pages, 4);
	CU_ASSERT_EQUAL_FATAL(m2.host_pages, 2);
	CU_ASSERT_EQUAL(kvp_index_promote(f.pfx, m1.lock, out, 8, &n), -EBUSY);
	CU_ASSERT_EQUAL(n, 99);
	CU_ASSERT_EQUAL(f.copied[KVP_COPY_PROMOTE], 0);
	for (uint32_t k = 0; k < 2; k++) /* the other holder's ids still name the bytes */
		CU_ASSERT(page_ok(&f, HOST, hostids[k], 0, a, k));
	kvp_index_unlock(f.pfx, m2.lock);
	CU_ASSERT_EQUAL(kvp_index_promote(f.pfx, m1.lock, out, 8, &n), 0);
	CU_ASSERT_EQUAL(n, 4);
	for (uint32_t k = 0; k < 4; k++)
		CU_ASSERT(page_ok(&f, DEV, out[k], 0, a, k));
	kvp_index_unlock(f.pfx, m1.lock);
	CU_ASSERT(fx_sane(&f));
	fx_fini(&f);
}

static void test_kvp_prefix_promote_copy_fails(void)
{
	struct fx f;
	uint32_t a[16], out[4], n = 0;
	struct kvp_index_stats before, after;
	struct kvp_index_match m;

	fx_init(&f, 4, 8, 8, KVP_EVICT_POLICY_LRU);
	seq(a, 16, 100);
	CU_ASSERT_EQUAL_FATAL(fx_put(&f, 0, a, 4, HOST, NULL, NULL), 0);
	m = fx_match(&f, 0, a, 16, 1, NULL, NULL);
	f.copy_fail = -EIO;
	before = fx_stats(&f);
	CU_ASSERT_EQUAL(kvp_index_promote(f.pfx, m.lock, out, 4, &n), -EIO);
	after = fx_stats(&f);
	CU_ASSERT_EQUAL(memcmp(&before, &after, sizeof(before)), 0);
	CU_ASSERT_EQUAL(fx_count(&f, DEV, KVP_PAGE_FREE), 8);
	kvp_index_unlock(f.pfx, m.lock);
	f.copy_fail = 0;
	CU_ASSERT_EQUAL(fx_match(&f, 0, a, 16, 0, NULL, NULL).host_pages, 4);
	CU_ASSERT(fx_sane(&f));
	fx_fini(&f);
}

static void test_kvp_prefix_evict_copy_fails(void)
{
	struct fx f;
	uint32_t a[16], b[16], dev[4], host[4];
	struct kvp_index_match m;

	fx_init(&f, 4, 8, 8, KVP_EVICT_POLICY_LRU);
	seq(a, 16, 100);
	seq(b, 16, 200);
	/* Device pages then host pages: a failed demotion copy cannot drop the device page without
	 * orphaning the host pages after it, so eviction stops. */
	CU_ASSERT_EQUAL_FATAL(fx_put(&f, 0, a, 2, DEV, NULL, NULL), 0);
	CU_ASSERT_EQUAL_FATAL(fx_put(&f, 0, a, 4, HOST, NULL, NULL), 0);
	CU_ASSERT_EQUAL(fx_stats(&f).entries, 4);
	f.copy_fail = -EIO;
	CU_ASSERT_EQUAL(kvp_index_evict_later(f.pfx, DEV, 2), 0);
	CU_ASSERT(fx_sane(&f));
	m = fx_match(&f, 0, a, 16, 0, dev, host);
	CU_ASSERT_EQUAL(m.dev_pages, 2);
	CU_ASSERT_EQUAL_FATAL(m.host_pages, 2);
	for (uint32_t k = 0; k < 2; k++) {
		CU_ASSERT(page_ok(&f, DEV, dev[k], 0, a, k));
		CU_ASSERT(page_ok(&f, HOST, host[k], 0, a, k + 2));
	}
	CU_ASSERT_EQUAL(kvp_index_flush(f.pfx), 4);
	/* A device leaf whose demotion copy fails is dropped instead: memory still comes free. */
	CU_ASSERT_EQUAL_FATAL(fx_put(&f, 0, b, 4, DEV, NULL, NULL), 0);
	CU_ASSERT_EQUAL(kvp_index_evict_later(f.pfx, DEV, 3), 3);
	CU_ASSERT_EQUAL(fx_stats(&f).demoted_pages, 0);
	CU_ASSERT_EQUAL(fx_stats(&f).cached_pages[DEV], 1);
	CU_ASSERT_EQUAL(fx_count(&f, HOST, KVP_PAGE_FREE), 8);
	CU_ASSERT(fx_sane(&f));
	fx_fini(&f);
}

/* Sets up a -> b in two nodes with a's pages host-resident and b's device-resident:
 * the shape left by inserting device pages under a locked host prefix. */
static void test_kvp_prefix_evict_host_over_device(void)
{
	struct fx f;
	uint32_t a[16], host[4];
	struct kvp_index_insert_result r;
	struct kvp_index_stats st;
	struct kvp_index_match m;

	fx_init(&f, 4, 8, 8, KVP_EVICT_POLICY_LRU);
	seq(a, 16, 1);
	CU_ASSERT_EQUAL_FATAL(fx_put(&f, 0, a, 2, HOST, NULL, NULL), 0);
	m = fx_match(&f, 0, a, 8, 1, NULL, NULL);
	CU_ASSERT_EQUAL_FATAL(fx_put(&f, 0, a, 4, DEV, &r, NULL), 0);
	CU_ASSERT_EQUAL(r.dup_pages, 2);
	CU_ASSERT_EQUAL(r.new_pages, 2);
	kvp_index_unlock(f.pfx, m.lock);
	st = fx_stats(&f);
	CU_ASSERT_EQUAL(st.cached_pages[HOST], 2);
	/* a[1] is stuck (a device page below it), a[0] counts but waits behind a[1] */
	CU_ASSERT_EQUAL(st.evictable_pages[HOST], 1);
	CU_ASSERT_EQUAL(st.evictable_pages[DEV], 2);
	CU_ASSERT_EQUAL(kvp_index_evict_later(f.pfx, HOST, 2), 0);
	m = fx_match(&f, 0, a, 16, 0, NULL, host); /* stops at the device page after host */
	CU_ASSERT_EQUAL(m.dev_pages, 0);
	CU_ASSERT_EQUAL(m.host_pages, 2);
	CU_ASSERT(fx_sane(&f));
	/* Demoting the device pages below frees the host pages for eviction. */
	CU_ASSERT_EQUAL(kvp_index_evict_later(f.pfx, DEV, 2), 2);
	st = fx_stats(&f);
	CU_ASSERT_EQUAL(st.evictable_pages[HOST], 4);
	m = fx_match(&f, 0, a, 16, 0, NULL, host);
	CU_ASSERT_EQUAL(m.host_pages, 4);
	for (uint32_t k = 0; k < 4; k++)
		CU_ASSERT(page_ok(&f, HOST, host[k], 0, a, k));
	CU_ASSERT_EQUAL(kvp_index_evict_later(f.pfx, HOST, 3), 3);
	CU_ASSERT_EQUAL(fx_match(&f, 0, a, 16, 0, NULL, NULL).host_pages, 1);
	/* Device pages inserted over an unlocked host prefix upgrade it all. */
	CU_ASSERT_EQUAL_FATAL(fx_put(&f, 0, a, 4, DEV, &r, NULL), 0);
	CU_ASSERT_EQUAL(r.new_pages, 4);
	CU_ASSERT_EQUAL(fx_match(&f, 0, a, 16, 0, NULL, NULL).dev_pages, 4);
	CU_ASSERT(fx_sane(&f));
	fx_fini(&f);
}

static void evict_order_case(enum kvp_evict_policy policy, bool expect_a_gone)
{
	struct fx f;
	uint32_t a[8], b[8];

	fx_init(&f, 2, 8, 0, policy);
	seq(a, 8, 10);
	seq(b, 8, 20);
	CU_ASSERT_EQUAL_FATAL(fx_put(&f, 0, a, 2, DEV, NULL, NULL), 0); /* t=1 */
	CU_ASSERT_EQUAL_FATAL(fx_put(&f, 0, b, 2, DEV, NULL, NULL), 0); /* t=2 */
	fx_match(&f, 0, a, 4, 0, NULL, NULL);				/* a: 1 hit, t=3 */
	fx_match(&f, 0, a, 4, 0, NULL, NULL);				/* a: 2 hits, t=4 */
	fx_match(&f, 0, b, 4, 0, NULL, NULL);				/* b: 1 hit, t=5 */
	CU_ASSERT_EQUAL(kvp_index_evict_later(f.pfx, DEV, 2), 2);
	CU_ASSERT(fx_sane(&f));
	CU_ASSERT_EQUAL(fx_match(&f, 0, a, 4, 0, NULL, NULL).dev_pages, expect_a_gone ? 0 : 2);
	CU_ASSERT_EQUAL(fx_match(&f, 0, b, 4, 0, NULL, NULL).dev_pages, expect_a_gone ? 2 : 0);
	fx_fini(&f);
}

static void test_kvp_prefix_evict_lru_vs_lfu(void)
{
	evict_order_case(KVP_EVICT_POLICY_LRU, true);  /* a touched at 4, b at 5 */
	evict_order_case(KVP_EVICT_POLICY_LFU, false); /* a 2 hits, b 1 */
}

static void test_kvp_prefix_match_unaligned(void)
{
	struct fx f;
	uint32_t a[12], dev[3];
	struct kvp_index_stats st;
	struct kvp_index_match m;

	fx_init(&f, 4, 8, 0, KVP_EVICT_POLICY_LRU);
	seq(a, 12, 1);
	CU_ASSERT_EQUAL_FATAL(fx_put(&f, 0, a, 3, DEV, NULL, NULL), 0);
	m = fx_match(&f, 0, a, 11, 0, dev, NULL); /* 2 whole pages asked */
	CU_ASSERT_EQUAL(m.dev_pages, 2);
	st = fx_stats(&f);
	CU_ASSERT_EQUAL(st.queried_tokens, 8);
	CU_ASSERT_EQUAL(st.hit_tokens, 8);
	m = fx_match(&f, 0, a, 3, 1, NULL, NULL); /* not one whole page: nothing, no lock */
	CU_ASSERT_EQUAL(m.dev_pages, 0);
	CU_ASSERT_EQUAL(m.host_pages, 0);
	CU_ASSERT_PTR_NULL(m.lock);
	CU_ASSERT_EQUAL(kvp_index_match_tokens(f.pfx, 0, NULL, 3, 1, &m, NULL, NULL), 0);
	CU_ASSERT_EQUAL(kvp_index_match_tokens(f.pfx, 0, NULL, 4, 1, &m, dev, dev), -EINVAL);
	m = fx_match(&f, 0, a, 12 + 3, 1, dev, NULL);
	CU_ASSERT_EQUAL(m.dev_pages, 3);
	CU_ASSERT_PTR_NOT_NULL(m.lock);
	st = fx_stats(&f);
	CU_ASSERT_EQUAL(st.queried_tokens, 20);
	CU_ASSERT_EQUAL(st.hit_tokens, 20);
	/* A query that diverges inside a page matches only the pages before it. */
	a[6] = 999;
	CU_ASSERT_EQUAL(fx_match(&f, 0, a, 12, 0, NULL, NULL).dev_pages, 1);
	kvp_index_unlock(f.pfx, m.lock);
	kvp_index_unlock(f.pfx, NULL);
	CU_ASSERT(fx_sane(&f));
	fx_fini(&f);
}

static void test_kvp_prefix_flush_keeps_locked(void)
{
	struct fx f;
	uint32_t a[24], b[24];
	struct kvp_index_stats st;
	struct kvp_index_match m;

	fx_init(&f, 4, 16, 16, KVP_EVICT_POLICY_LRU);
	seq(a, 24, 1);
	seq(b, 24, 300);
	CU_ASSERT_EQUAL_FATAL(fx_put(&f, 0, a, 6, DEV, NULL, NULL), 0);
	CU_ASSERT_EQUAL_FATAL(fx_put(&f, 5, b, 3, HOST, NULL, NULL), 0);
	m = fx_match(&f, 0, a, 12, 1, NULL, NULL); /* locks a's first 3 pages */
	CU_ASSERT_EQUAL(kvp_index_flush(f.pfx), 6);
	st = fx_stats(&f);
	CU_ASSERT_EQUAL(st.cached_pages[DEV], 3);
	CU_ASSERT_EQUAL(st.cached_pages[HOST], 0);
	CU_ASSERT_EQUAL(st.protected_pages[DEV], 3);
	CU_ASSERT_EQUAL(st.entries, 3);
	CU_ASSERT(fx_sane(&f));
	CU_ASSERT_EQUAL(fx_match(&f, 0, a, 24, 0, NULL, NULL).dev_pages, 3);
	kvp_index_unlock(f.pfx, m.lock);
	CU_ASSERT_EQUAL(kvp_index_flush(f.pfx), 3);
	CU_ASSERT_EQUAL(fx_stats(&f).entries, 0);
	CU_ASSERT_EQUAL(fx_count(&f, DEV, KVP_PAGE_FREE), 16);
	CU_ASSERT_EQUAL(fx_count(&f, HOST, KVP_PAGE_FREE), 16);
	CU_ASSERT(fx_sane(&f));
	fx_fini(&f);
}

static void test_kvp_prefix_top_by_hits(void)
{
	struct fx f;
	uint32_t a[16], b[16];
	struct kvp_index_top top[8];

	fx_init(&f, 4, 16, 0, KVP_EVICT_POLICY_LRU);
	seq(a, 16, 1);
	memcpy(b, a, sizeof(b));
	b[8] = 777; /* b shares a's first 2 pages */
	CU_ASSERT_EQUAL_FATAL(fx_put(&f, 0, a, 4, DEV, NULL, NULL), 0);
	CU_ASSERT_EQUAL_FATAL(fx_put(&f, 0, b, 4, DEV, NULL, NULL), 0);
	for (int i = 0; i < 3; i++)
		fx_match(&f, 0, a, 16, 0, NULL, NULL);
	fx_match(&f, 0, b, 16, 0, NULL, NULL);
	CU_ASSERT_EQUAL(kvp_index_top(f.pfx, top, 0), 0);
	/* per page: a's first two (shared with b) 4 hits, a's last two 3, b's last two 1 */
	CU_ASSERT_EQUAL_FATAL(kvp_index_top(f.pfx, top, 8), 6);
	CU_ASSERT(top[0].hits == 4 && top[0].pages == 1 && !top[0].keyed);
	CU_ASSERT(top[1].hits == 4 && top[1].pages == 2);
	CU_ASSERT(top[2].hits == 3 && top[2].pages == 3);
	CU_ASSERT(top[3].hits == 3 && top[3].pages == 4);
	CU_ASSERT(top[4].hits == 1 && top[4].pages == 3);
	CU_ASSERT(top[5].hits == 1 && top[5].pages == 4);
	CU_ASSERT_EQUAL_FATAL(kvp_index_top(f.pfx, top, 2), 2);
	CU_ASSERT(top[0].hits == 4 && top[0].pages == 1);
	CU_ASSERT(top[1].hits == 4 && top[1].pages == 2);
	CU_ASSERT(fx_sane(&f));
	fx_fini(&f);
}

/* Shared-prefix shapes, ~1M tokens: metadata beyond the token ids stays <= 64 B per page. */
static void test_kvp_prefix_stats_metadata_per_page(void)
{
	enum { PT = 16, SYS = 16, SYSP = 32, CONV = 60, TURNS = 4, TURNP = 16 };
	struct kvp_pages *dev = kvp_pages_new(70000);
	struct kvp_index_conf c = { .page_tokens = PT, .dev = dev };
	struct kvp_index *p = kvp_index_new(&c);
	uint32_t *tok = malloc(sizeof(*tok) * (SYSP + TURNS * TURNP) * PT);
	uint32_t pg[SYSP + TURNS * TURNP];
	struct kvp_index_stats st;
	uint64_t tokbytes;
	int rc;

	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	CU_ASSERT_PTR_NOT_NULL_FATAL(tok);
	for (uint32_t s = 0; s < SYS; s++) {
		for (uint32_t i = 0; i < SYSP * PT; i++)
			tok[i] = s * 100000 + i;
		for (uint32_t cv = 0; cv < CONV; cv++) {
			for (uint32_t t = 1; t <= TURNS; t++) {
				uint32_t np = SYSP + t * TURNP;
				struct kvp_index_insert_result r;
				uint32_t dup[SYSP + TURNS * TURNP];

				for (uint32_t i = SYSP * PT; i < np * PT; i++)
					tok[i] = 1u << 30 | (s * CONV + cv) << 12 | (i & 0xfff);
				CU_ASSERT_EQUAL_FATAL(kvp_pages_alloc(dev, np, pg), 0);
				rc = kvp_index_insert_tokens(p, 0, tok, np, DEV, pg, &r, dup);
				CU_ASSERT_EQUAL_FATAL(rc, 0);
				for (uint32_t i = 0; i < r.dup_pages; i++)
					dup[i] = pg[dup[i]];
				kvp_pages_release(dev, dup, r.dup_pages);
			}
		}
	}
	kvp_index_stats(p, &st);
	CU_ASSERT_EQUAL(st.cached_pages[DEV], SYS * SYSP + SYS * CONV * TURNS * TURNP);
	/* the slabs hold each page's tokens and 32-byte key; the rest is <= 64 B a page */
	tokbytes = st.cached_pages[DEV] * (PT * sizeof(uint32_t) + KVP_PAGE_KEY_BYTES);
	CU_ASSERT(st.key_bytes >= tokbytes);
	CU_ASSERT(st.metadata_bytes <= 64 * st.cached_pages[DEV]);
	CU_ASSERT_EQUAL(kvp_index_check(p), 0);
	kvp_index_free(p);
	kvp_pages_free(dev);
	free(tok);
}

/* ---- random operation sequences against a reference model ---- */

#define R_PT 2
#define R_MAXP 10
#define R_ALPHA 3
#define R_LOCKS 6
#define R_SEQS 32768
#define R_SET (1u << 18)

struct rseq {
	uint64_t ns;
	uint32_t np;
	uint32_t tok[R_MAXP * R_PT];
};

struct rlock {
	struct kvp_index_lock *h;
	uint64_t ns;
	uint32_t np;
	uint32_t tok[R_MAXP * R_PT];
	uint8_t tier[R_MAXP];
	uint32_t id[R_MAXP];
};

/* What a run went through, so each run can assert it reached the paths it is for. */
struct cover {
	uint32_t promote_ok, promote_enospc, upgrades, stuck_host, flushes, named, named_lost;
	uint64_t demoted, evicted[KVP_TIER_ID_MAX];
	uint64_t hook_calls, hook_pages, hook_bad; /* chain_hook */
};

struct model {
	struct fx f;
	struct cover cov;
	uint64_t rng;
	struct rseq *seqs;
	uint32_t nseqs;
	uint64_t *set; /* keys of every inserted prefix; 0 = empty */
	struct rlock locks[R_LOCKS];
	uint32_t nlocks;
	uint32_t lock_pct; /* of matches that lock */
	uint64_t steps_failed;
};

static uint64_t rnd(struct model *m)
{
	m->rng ^= m->rng << 13;
	m->rng ^= m->rng >> 7;
	m->rng ^= m->rng << 17;
	return m->rng;
}

static uint32_t rnd_below(struct model *m, uint32_t n)
{
	return (uint32_t)(rnd(m) % n);
}

static void set_add(struct model *m, uint64_t k)
{
	uint32_t i = (uint32_t)(k * 0x9e3779b97f4a7c15ULL >> 46) & (R_SET - 1);

	k |= 1;
	while (m->set[i] && m->set[i] != k)
		i = (i + 1) & (R_SET - 1);
	m->set[i] = k;
}

static bool set_has(const struct model *m, uint64_t k)
{
	uint32_t i = (uint32_t)(k * 0x9e3779b97f4a7c15ULL >> 46) & (R_SET - 1);

	k |= 1;
	while (m->set[i]) {
		if (m->set[i] == k)
			return true;
		i = (i + 1) & (R_SET - 1);
	}
	return false;
}

/* A token sequence of np pages: often an inserted one's prefix with a new tail. */
static uint32_t gen_query(struct model *m, uint64_t *ns, uint32_t *tok)
{
	uint32_t np = 1 + rnd_below(m, R_MAXP), keep = 0;

	*ns = rnd_below(m, 4) ? 0 : 7;
	if (m->nseqs && rnd_below(m, 10) < 7) {
		const struct rseq *s = &m->seqs[rnd_below(m, m->nseqs)];

		*ns = s->ns;
		keep = 1 + rnd_below(m, s->np);
		memcpy(tok, s->tok, keep * R_PT * sizeof(*tok));
		if (np < keep)
			np = keep;
	}
	for (uint32_t i = keep * R_PT; i < np * R_PT; i++)
		tok[i] = 1 + rnd_below(m, R_ALPHA);
	return np;
}

static bool model_locks_ok(struct model *m)
{
	for (uint32_t i = 0; i < m->nlocks; i++) {
		const struct rlock *l = &m->locks[i];

		for (uint32_t k = 0; k < l->np; k++)
			if (!page_ok(&m->f, l->tier[k], l->id[k], l->ns, l->tok, k))
				return false;
	}
	return true;
}

static void step_insert(struct model *m)
{
	struct fx *f = &m->f;
	uint32_t tok[R_MAXP * R_PT], np;
	struct kvp_index_insert_result r;
	uint64_t ns;
	int t = f->tp[HOST] && (!f->tp[DEV] || rnd_below(m, 10) < 3) ? HOST : DEV;
	struct kvp_index_stats st = fx_stats(f), after;
	uint32_t nfree = fx_count(f, t, KVP_PAGE_FREE), want;
	int rc;

	np = gen_query(m, &ns, tok);
	want = np > nfree ? np - nfree : 0;
	rc = fx_put(f, ns, tok, np, t, &r, NULL);
	if (want) /* fx_put evicted the shortfall, or all it could */
		CU_ASSERT(fx_stats(f).evicted_pages[t] - st.evicted_pages[t] <=
			  (want < st.evictable_pages[t] ? want : st.evictable_pages[t]));
	if (rc == -ENOSPC)
		return;
	CU_ASSERT_EQUAL_FATAL(rc, 0);
	CU_ASSERT_EQUAL(r.new_pages + r.dup_pages, np);
	after = fx_stats(f);
	if (t == DEV && after.cached_pages[HOST] < st.cached_pages[HOST])
		m->cov.upgrades++;
	if (after.cached_pages[HOST] - after.protected_pages[HOST] > after.evictable_pages[HOST])
		m->cov.stuck_host++; /* host pages above a device page */
	if (m->nseqs < R_SEQS) {
		struct rseq *s = &m->seqs[m->nseqs++];

		s->ns = ns;
		s->np = np;
		memcpy(s->tok, tok, sizeof(tok));
	}
	for (uint32_t k = 0; k < np; k++)
		set_add(m, page_key(f, ns, tok, k));
	/* Without locks a device insert leaves the whole path device-resident. */
	if (t == DEV && !m->nlocks) {
		uint32_t dev[R_MAXP];
		struct kvp_index_match mt = fx_match(f, ns, tok, np * R_PT, 0, dev, NULL);

		CU_ASSERT_EQUAL(mt.dev_pages, np);
		CU_ASSERT_EQUAL(mt.host_pages, 0);
		for (uint32_t k = 0; k < mt.dev_pages && k < np; k++)
			CU_ASSERT(page_ok(f, DEV, dev[k], ns, tok, k));
	}
}

/* The client's flow: match, compute the rest, insert naming the matched pages by position. In
 * between, eviction may take some of them: then the insert stops there. */
static void step_insert_named(struct model *m)
{
	struct fx *f = &m->f;
	uint32_t tok[R_MAXP * R_PT], pg[R_MAXP], dup[R_MAXP], d[R_MAXP], h[R_MAXP], np, named;
	int t = f->tp[HOST] && (!f->tp[DEV] || rnd_below(m, 10) < 3) ? HOST : DEV;
	struct kvp_index_insert_result r;
	struct kvp_index_match mt;
	uint32_t given = 0, nfree;
	uint64_t ns;
	int rc;

	np = gen_query(m, &ns, tok);
	mt = fx_match(f, ns, tok, np * R_PT, 0, d, h);
	named = rnd_below(m, mt.dev_pages + mt.host_pages + 1);
	if (named == np)
		return;
	if (rnd_below(m, 5) == 0) { /* others' allocations evict meanwhile, the match's too */
		for (int et = DEV; et <= HOST; et++)
			kvp_index_evict_later(f->pfx, (enum kvp_tier_id)et,
					      (uint32_t)fx_stats(f).evictable_pages[et]);
	}
	nfree = fx_count(f, t, KVP_PAGE_FREE);
	if (nfree < np - named)
		kvp_index_evict_later(f->pfx, (enum kvp_tier_id)t, np - named - nfree);
	if (kvp_pages_alloc(f->tp[t], np - named, pg + named) < 0)
		return;
	for (uint32_t k = 0; k < named; k++)
		pg[k] = KVP_PAGE_NONE;
	for (uint32_t k = named; k < np; k++)
		content(page_key(f, ns, tok, k), f->mem[t] + (size_t)pg[k] * PB);
	rc = kvp_index_insert_tokens(f->pfx, ns, tok, np, (enum kvp_tier_id)t, pg, &r, dup);
	CU_ASSERT_EQUAL_FATAL(rc, 0);
	CU_ASSERT_FATAL(r.done_keys <= np);
	CU_ASSERT(r.done_keys == np || r.done_keys < named); /* stops only at a named one */
	for (uint32_t k = named; k < r.done_keys; k++)
		given++;
	CU_ASSERT_EQUAL(r.new_pages + r.dup_pages, given);
	for (uint32_t k = r.done_keys > named ? r.done_keys : named; k < np; k++)
		CU_ASSERT_EQUAL(kvp_pages_state(f->tp[t], pg[k]), KVP_PAGE_LEASED);
	for (uint32_t i = 0; i < r.dup_pages; i++) {
		CU_ASSERT_FATAL(dup[i] >= named && dup[i] < r.done_keys);
		dup[i] = pg[dup[i]];
	}
	CU_ASSERT_EQUAL(kvp_pages_release(f->tp[t], dup, r.dup_pages), 0);
	if (np > (r.done_keys > named ? r.done_keys : named)) {
		uint32_t from = r.done_keys > named ? r.done_keys : named;

		CU_ASSERT_EQUAL(kvp_pages_release(f->tp[t], pg + from, np - from), 0);
	}
	for (uint32_t k = 0; k < r.done_keys; k++)
		set_add(m, page_key(f, ns, tok, k));
	if (r.done_keys && m->nseqs < R_SEQS) {
		struct rseq *s = &m->seqs[m->nseqs++];

		s->ns = ns;
		s->np = r.done_keys;
		memcpy(s->tok, tok, sizeof(tok));
	}
	m->cov.named++;
	if (r.done_keys < np)
		m->cov.named_lost++;
}

static void step_match(struct model *m)
{
	struct fx *f = &m->f;
	uint32_t tok[R_MAXP * R_PT + R_PT], dev[R_MAXP + 1], host[R_MAXP + 1], np, ntok, got;
	int lock = m->nlocks < R_LOCKS && rnd_below(m, 100) < m->lock_pct;
	struct kvp_index_stats st = fx_stats(f);
	struct kvp_index_match mt;
	uint64_t ns;

	np = gen_query(m, &ns, tok);
	ntok = np * R_PT - (rnd_below(m, 3) ? 0 : rnd_below(m, R_PT)); /* sometimes unaligned */
	mt = fx_match(f, ns, tok, ntok, lock, dev, host);
	got = mt.dev_pages + mt.host_pages;
	CU_ASSERT_FATAL(got <= ntok / R_PT);
	CU_ASSERT_EQUAL(fx_stats(f).queried_tokens - st.queried_tokens, ntok / R_PT * R_PT);
	CU_ASSERT_EQUAL(fx_stats(f).hit_tokens - st.hit_tokens, got * R_PT);
	CU_ASSERT(got == 0 || set_has(m, page_key(f, ns, tok, got - 1)));
	for (uint32_t k = 0; k < got; k++) {
		bool d = k < mt.dev_pages;

		CU_ASSERT(page_ok(f, d ? DEV : HOST, d ? dev[k] : host[k - mt.dev_pages], ns, tok,
				  k));
	}
	CU_ASSERT((mt.lock != NULL) == (lock && got));
	if (mt.lock) {
		struct rlock *l = &m->locks[m->nlocks++];

		l->h = mt.lock;
		l->ns = ns;
		l->np = got;
		memcpy(l->tok, tok, sizeof(l->tok));
		for (uint32_t k = 0; k < got; k++) {
			bool d = k < mt.dev_pages;

			l->tier[k] = d ? DEV : HOST;
			l->id[k] = d ? dev[k] : host[k - mt.dev_pages];
		}
	}
}

static void step_unlock(struct model *m)
{
	uint32_t i;

	if (!m->nlocks)
		return;
	i = rnd_below(m, m->nlocks);
	kvp_index_unlock(m->f.pfx, m->locks[i].h);
	m->locks[i] = m->locks[--m->nlocks];
}

static void step_evict(struct model *m)
{
	struct fx *f = &m->f;
	int t = rnd_below(m, 2) ? DEV : HOST;
	uint32_t want = 1 + rnd_below(m, 12), nfree = fx_count(f, t, KVP_PAGE_FREE), got;
	struct kvp_index_stats st = fx_stats(f);

	got = kvp_index_evict_later(f->pfx, (enum kvp_tier_id)t, want);
	if (!f->tp[t]) {
		CU_ASSERT_EQUAL(got, 0);
		return;
	}
	/* exactly what was asked or what is evictable; short of it only when what is left counted
	 * evictable waits behind a page that is not (a host page above a host page above a device
	 * page): then nothing more comes free */
	CU_ASSERT(got <= (want < st.evictable_pages[t] ? want : st.evictable_pages[t]));
	if (got < (want < st.evictable_pages[t] ? want : st.evictable_pages[t])) {
		m->cov.stuck_host++;
		CU_ASSERT_EQUAL(kvp_index_evict(f->pfx, (enum kvp_tier_id)t, 1), 0);
	}
	CU_ASSERT_EQUAL(fx_count(f, t, KVP_PAGE_FREE), nfree + got);
}

static void step_promote(struct model *m)
{
	struct fx *f = &m->f;
	struct kvp_index_stats before, after;
	uint32_t out[R_MAXP], n = 0, cnt[2][3];
	struct rlock *l;
	int rc;

	if (!m->nlocks)
		return;
	l = &m->locks[rnd_below(m, m->nlocks)];
	for (uint32_t i = 0; i < m->nlocks; i++) /* prefer a path with host pages on it */
		if (m->locks[i].np && m->locks[i].tier[m->locks[i].np - 1] == HOST)
			l = &m->locks[i];
	before = fx_stats(f);
	for (int t = 0; t < 2; t++)
		for (int s = 0; s < 3; s++)
			cnt[t][s] = fx_count(f, t, (enum kvp_page_state)s);
	rc = kvp_index_promote(f->pfx, l->h, out, R_MAXP, &n);
	if (!f->tp[DEV]) {
		CU_ASSERT_EQUAL(rc, -EINVAL);
		return;
	}
	if (rc == -ENOSPC || rc == -EBUSY) { /* EBUSY: another lock pins host pages on it */
		m->cov.promote_enospc++;
		after = fx_stats(f);
		CU_ASSERT_EQUAL(memcmp(&before, &after, sizeof(before)), 0);
		for (int t = 0; t < 2; t++)
			for (int s = 0; s < 3; s++)
				CU_ASSERT_EQUAL(cnt[t][s], fx_count(f, t, (enum kvp_page_state)s));
		return;
	}
	CU_ASSERT_EQUAL_FATAL(rc, 0);
	CU_ASSERT_EQUAL_FATAL(n, l->np);
	m->cov.promote_ok++;
	for (uint32_t k = 0; k < n; k++)
		CU_ASSERT(page_ok(f, DEV, out[k], l->ns, l->tok, k));
	/* Every lock sharing this path's positions now sees them on the device. */
	for (uint32_t i = 0; i < m->nlocks; i++) {
		struct rlock *o = &m->locks[i];
		uint32_t k = 0;

		if (o->ns != l->ns)
			continue;
		for (; k < o->np && k < n; k++) {
			if (memcmp(o->tok + k * R_PT, l->tok + k * R_PT, R_PT * sizeof(*o->tok)))
				break;
			o->tier[k] = DEV;
			o->id[k] = out[k];
		}
	}
}

static void step_flush(struct model *m)
{
	struct kvp_index_stats st = fx_stats(&m->f), after;
	uint64_t want = 0;

	for (int t = 0; t < KVP_TIER_ID_MAX; t++)
		want += st.cached_pages[t] - st.protected_pages[t];
	CU_ASSERT_EQUAL(kvp_index_flush(m->f.pfx), want);
	m->cov.flushes++;
	after = fx_stats(&m->f);
	for (int t = 0; t < KVP_TIER_ID_MAX; t++) {
		CU_ASSERT_EQUAL(after.cached_pages[t], after.protected_pages[t]);
		CU_ASSERT_EQUAL(after.evictable_pages[t], 0);
	}
}

/* The remote tier's use of the spill and landed hooks, mirrored: every page handed over must
 * hold the bytes its key names (page_key's: the chained page key the index derived). */
static void chain_hook(void *ctx, uint64_t ns, int keyed, const uint8_t *key, size_t klen,
		       uint32_t page)
{
	struct model *m = ctx;
	uint8_t want[PB];
	uint64_t v;

	m->cov.hook_calls++;
	if (keyed || klen != KVP_PAGE_KEY_BYTES) {
		m->cov.hook_bad++;
		return;
	}
	memcpy(&v, key, sizeof(v));
	content(v ^ ns, want);
	if (memcmp(m->f.mem[HOST] + (size_t)page * PB, want, PB))
		m->cov.hook_bad++;
	else
		m->cov.hook_pages++;
}

static struct cover random_run(uint64_t seed, uint32_t ndev, uint32_t nhost,
			       enum kvp_evict_policy policy, uint32_t lock_pct, uint32_t steps)
{
	struct model *m = calloc(1, sizeof(*m));
	struct kvp_index_stats st;
	struct cover cov;
	uint64_t bad = 0;

	CU_ASSERT_PTR_NOT_NULL_FATAL(m);
	m->seqs = malloc(sizeof(*m->seqs) * R_SEQS);
	m->set = calloc(R_SET, sizeof(*m->set));
	CU_ASSERT_PTR_NOT_NULL_FATAL(m->seqs);
	CU_ASSERT_PTR_NOT_NULL_FATAL(m->set);
	m->rng = seed;
	m->lock_pct = lock_pct;
	fx_init(&m->f, R_PT, ndev, nhost, policy);
	if (nhost) {
		kvp_index_set_spill(m->f.pfx, chain_hook, m);
		kvp_index_set_landed(m->f.pfx, chain_hook, m);
	}
	for (uint32_t i = 0; i < steps; i++) {
		uint32_t r = rnd_below(m, 1000);

		if (r < 230)
			step_insert(m);
		else if (r < 350)
			step_insert_named(m);
		else if (r < 650)
			step_match(m);
		else if (r < 750)
			step_unlock(m);
		else if (r < 880)
			step_evict(m);
		else if (r < 997)
			step_promote(m);
		else
			step_flush(m);
		m->f.clock += rnd_below(m, 3); /* some operations share a timestamp */
		if (!fx_sane(&m->f) || !model_locks_ok(m) ||
		    fx_count(&m->f, DEV, KVP_PAGE_LEASED) + fx_count(&m->f, HOST, KVP_PAGE_LEASED))
			bad++;
		CU_ASSERT_EQUAL_FATAL(bad, 0); /* stop at the first broken step */
	}
	CU_ASSERT_EQUAL(m->cov.hook_bad, 0);
	st = fx_stats(&m->f);
	m->cov.demoted = st.demoted_pages;
	m->cov.evicted[DEV] = st.evicted_pages[DEV];
	m->cov.evicted[HOST] = st.evicted_pages[HOST];
	while (m->nlocks)
		step_unlock(m);
	kvp_index_flush(m->f.pfx);
	CU_ASSERT_EQUAL(fx_stats(&m->f).entries, 0);
	CU_ASSERT_EQUAL(fx_count(&m->f, DEV, KVP_PAGE_CACHED), 0);
	CU_ASSERT_EQUAL(fx_count(&m->f, HOST, KVP_PAGE_CACHED), 0);
	CU_ASSERT(fx_sane(&m->f));
	fx_fini(&m->f);
	cov = m->cov;
	free(m->seqs);
	free(m->set);
	free(m);
	return cov;
}

static void test_kvp_prefix_random_two_tiers_lru(void)
{
	struct cover c = random_run(0x1234567887654321ULL, 48, 64, KVP_EVICT_POLICY_LRU, 40, 20000);

	CU_ASSERT(c.demoted > 1000);
	CU_ASSERT(c.promote_ok > 100);
	CU_ASSERT(c.upgrades > 100);
	CU_ASSERT(c.stuck_host > 0);
	CU_ASSERT(c.flushes > 10);
	CU_ASSERT(c.named > 1000);
	CU_ASSERT(c.named_lost > 10);
	CU_ASSERT(c.hook_pages > 1000); /* pages spilled and landed, each checked */
}

static void test_kvp_prefix_random_two_tiers_lfu(void)
{
	struct cover c = random_run(0xdeadbeefcafef00dULL, 40, 24, KVP_EVICT_POLICY_LFU, 40, 8000);

	CU_ASSERT(c.demoted > 1000);
	CU_ASSERT(c.evicted[HOST] > 1000);
	CU_ASSERT(c.promote_ok > 10);
}

/* The host tier is mostly full: demotion has to evict host leaves or drop instead. */
static void test_kvp_prefix_random_small_host(void)
{
	struct cover c = random_run(0x0badc0ffee0ddf00ULL, 32, 6, KVP_EVICT_POLICY_LRU, 40, 6000);

	CU_ASSERT(c.demoted > 100);
	CU_ASSERT(c.evicted[DEV] > c.demoted); /* some device pages were dropped */
}

/* The device tier is small next to what locks pin: promotion runs out of room. */
static void test_kvp_prefix_random_small_device(void)
{
	struct cover c = random_run(0x7777aaaa5555ccccULL, 6, 48, KVP_EVICT_POLICY_LRU, 90, 6000);

	CU_ASSERT(c.promote_enospc > 10);
	CU_ASSERT(c.promote_ok > 10);
}

static void test_kvp_prefix_random_device_only(void)
{
	struct cover c = random_run(0x5eed5eed5eed5eedULL, 40, 0, KVP_EVICT_POLICY_LRU, 40, 4000);

	CU_ASSERT(c.evicted[DEV] > 1000);
	CU_ASSERT_EQUAL(c.demoted, 0);
}

static void test_kvp_prefix_random_host_only(void)
{
	struct cover c = random_run(0x0123456789abcdefULL, 0, 40, KVP_EVICT_POLICY_LFU, 40, 4000);

	CU_ASSERT(c.evicted[HOST] > 1000);
	CU_ASSERT_EQUAL(c.promote_ok, 0);
}

/* The seed is what getrandom(2) returns, read whole even when the kernel gives it in parts or a
 * signal interrupts the call: not a function of the clock and of addresses. */
static void test_kvp_prefix_new_seed_from_getrandom(void)
{
	struct kvp_pages *host = kvp_pages_new(4);
	struct kvp_index *a, *b;

	CU_ASSERT_PTR_NOT_NULL_FATAL(host);
	rnd_reset();
	g_rnd.scripted = true;
	g_rnd.value = 0x0123456789abcdefULL;
	a = host_only_tree(host);
	CU_ASSERT_PTR_NOT_NULL_FATAL(a);
	CU_ASSERT(g_rnd.calls >= 1);
	CU_ASSERT_EQUAL(kvp_index_seed(a), 0x0123456789abcdefULL);
	rnd_reset();
	g_rnd.scripted = true;
	g_rnd.value = 0xfedcba9876543210ULL;
	g_rnd.chunk = 3;
	g_rnd.eintr_once = 1;
	b = host_only_tree(host);
	CU_ASSERT_PTR_NOT_NULL_FATAL(b);
	CU_ASSERT_EQUAL(g_rnd.calls, 4); /* EINTR, then 3 + 3 + 2 bytes */
	CU_ASSERT_EQUAL(kvp_index_seed(b), 0xfedcba9876543210ULL);
	rnd_reset();
	kvp_index_free(a);
	kvp_index_free(b);
	kvp_pages_free(host);
}

/* Two trees of one process get different seeds from the kernel. */
static void test_kvp_prefix_new_seeds_differ(void)
{
	struct kvp_pages *host = kvp_pages_new(4);
	struct kvp_index *a, *b;

	CU_ASSERT_PTR_NOT_NULL_FATAL(host);
	rnd_reset();
	a = host_only_tree(host);
	b = host_only_tree(host);
	CU_ASSERT_PTR_NOT_NULL_FATAL(a);
	CU_ASSERT_PTR_NOT_NULL_FATAL(b);
	CU_ASSERT(g_rnd.calls >= 2);
	CU_ASSERT_NOT_EQUAL(kvp_index_seed(a), kvp_index_seed(b));
	kvp_index_free(a);
	kvp_index_free(b);
	kvp_pages_free(host);
}

/* A kernel without getrandom (ENOSYS): the seed comes from /dev/urandom. Any other failure
 * refuses the tree rather than seeding it guessably. */
static void test_kvp_prefix_new_seed_without_getrandom(void)
{
	struct kvp_pages *host = kvp_pages_new(4);
	struct kvp_index *a, *b;

	CU_ASSERT_PTR_NOT_NULL_FATAL(host);
	rnd_reset();
	g_rnd.fail_errno = ENOSYS;
	a = host_only_tree(host);
	b = host_only_tree(host);
	CU_ASSERT_PTR_NOT_NULL_FATAL(a);
	CU_ASSERT_PTR_NOT_NULL_FATAL(b);
	CU_ASSERT_EQUAL(g_rnd.calls, 2);
	CU_ASSERT_NOT_EQUAL(kvp_index_seed(a), kvp_index_seed(b));
	g_rnd.fail_errno = EIO;
	CU_ASSERT_PTR_NULL(host_only_tree(host));
	rnd_reset();
	kvp_index_free(a);
	kvp_index_free(b);
	kvp_pages_free(host);
}

/* Registers a test under its function's name. */
/* Every table hash 0 (the collide seam): all pages share one chain. Token pages that
 * differ only in their parent, or only in one token, or that sit in another namespace, never
 * match each other; every answer equals the answer of an index with full hashes. */
static void test_index_tokens_exact_under_collisions(void)
{
	struct kvp_pages *dv[2] = { kvp_pages_new(256), kvp_pages_new(256) };
	struct kvp_index *ix[2];
	uint32_t a[64], b[64], c[64], pg[16], dev[16], host[16];

	for (int k = 0; k < 2; k++) {
		struct kvp_index_conf cf = { .dev = dv[k], .page_tokens = 4 };

		CU_ASSERT_PTR_NOT_NULL_FATAL(dv[k]);
		cf.collide = k == 1;
		ix[k] = kvp_index_new(&cf);
		CU_ASSERT_PTR_NOT_NULL_FATAL(ix[k]);
	}
	seq(a, 64, 1);
	memcpy(b, a, sizeof(b));
	b[0] = 999; /* b: a's pages 1.. under another first page */
	memcpy(c, a, sizeof(c));
	c[35] = 7777; /* c: a with one token changed in page 8 */
	for (int k = 0; k < 2; k++) {
		const uint32_t *seqs[3] = { a, b, c };

		for (int q = 0; q < 3; q++) {
			struct kvp_index_insert_result r;
			uint32_t dup[16];

			CU_ASSERT_EQUAL_FATAL(kvp_pages_alloc(dv[k], 16, pg), 0);
			CU_ASSERT_EQUAL_FATAL(kvp_index_insert_tokens(ix[k], (uint64_t)q % 2,
								      seqs[q], 16, DEV, pg, &r,
								      dup),
					      0);
			for (uint32_t i = 0; i < r.dup_pages; i++)
				dup[i] = pg[dup[i]];
			kvp_pages_release(dv[k], dup, r.dup_pages);
		}
		CU_ASSERT_EQUAL(kvp_index_check(ix[k]), 0);
	}
	/* a in ns 0 (16 pages), b in ns 1 (16), c in ns 0 (shares a's first 8 pages: 8 new) */
	for (int k = 0; k < 2; k++) {
		struct kvp_index_stats st;

		kvp_index_stats(ix[k], &st);
		CU_ASSERT_EQUAL(st.entries, 40);
	}
	for (uint64_t ns = 0; ns < 3; ns++) {
		const uint32_t *qs[4] = { a, b, c, NULL };
		uint32_t d[64];

		memcpy(d, a, sizeof(d));
		d[63] = 1; /* a with its last page changed */
		qs[3] = d;
		for (int q = 0; q < 4; q++) {
			struct kvp_index_match m[2];
			uint32_t ids[2][16];

			for (int k = 0; k < 2; k++) {
				CU_ASSERT_EQUAL(kvp_index_match_tokens(ix[k], ns, qs[q], 64, 0,
								       &m[k], dev, host),
						0);
				memcpy(ids[k], dev, sizeof(dev));
			}
			CU_ASSERT_EQUAL(m[0].dev_pages, m[1].dev_pages);
			CU_ASSERT_EQUAL(memcmp(ids[0], ids[1], m[0].dev_pages * 4), 0);
			if (ns == 2)
				CU_ASSERT_EQUAL(m[1].dev_pages, 0);
		}
	}
	{
		struct kvp_index_match m;

		CU_ASSERT_EQUAL(kvp_index_match_tokens(ix[1], 0, a, 64, 0, &m, dev, host), 0);
		CU_ASSERT_EQUAL(m.dev_pages, 16);
		CU_ASSERT_EQUAL(kvp_index_match_tokens(ix[1], 0, c, 64, 0, &m, dev, host), 0);
		CU_ASSERT_EQUAL(m.dev_pages, 16);
		CU_ASSERT_EQUAL(kvp_index_match_tokens(ix[1], 0, b, 64, 0, &m, dev, host), 0);
		CU_ASSERT_EQUAL(m.dev_pages, 0); /* b's pages live in ns 1 */
		CU_ASSERT_EQUAL(kvp_index_match_tokens(ix[1], 1, b, 64, 0, &m, dev, host), 0);
		CU_ASSERT_EQUAL(m.dev_pages, 16);
		b[5] = 0;
		CU_ASSERT_EQUAL(kvp_index_match_tokens(ix[1], 1, b, 64, 0, &m, dev, host), 0);
		CU_ASSERT_EQUAL(m.dev_pages, 1);
		/* z: one page of its own in ns 0, then a's pages 1..: those are cached under a's
		 * first page, never under z's */
		b[5] = 6;
		CU_ASSERT_EQUAL_FATAL(kvp_pages_alloc(dv[1], 1, pg), 0);
		CU_ASSERT_EQUAL(kvp_index_insert_tokens(ix[1], 0, b, 1, DEV, pg, NULL, NULL), 0);
		CU_ASSERT_EQUAL(kvp_index_match_tokens(ix[1], 0, b, 64, 0, &m, dev, host), 0);
		CU_ASSERT_EQUAL(m.dev_pages, 1);
		CU_ASSERT_EQUAL(dev[0], pg[0]);
		CU_ASSERT_EQUAL(kvp_index_evict(ix[1], DEV, 1), 1); /* 40 left, as in ix[0] */
	}
	for (int k = 0; k < 2; k++) {
		CU_ASSERT_EQUAL(kvp_index_evict(ix[k], DEV, 1000), 40);
		CU_ASSERT_EQUAL(kvp_index_check(ix[k]), 0);
		kvp_index_free(ix[k]);
		kvp_pages_free(dv[k]);
	}
}

/* One namespace holds token pages and key pages side by side: a key that happens to equal a
 * token page's derived key is still another page; a flush empties both kinds; one eviction
 * order covers both. */
static void test_index_tokens_and_keys_side_by_side(void)
{
	struct kvp_pages *dv = kvp_pages_new(64);
	struct kvp_index_conf cf = { .dev = dv, .page_tokens = 4 };
	struct kvp_index *ix;
	struct kvp_index_insert_result r;
	struct kvp_index_match m;
	struct kvp_index_lock *lk;
	uint32_t a[16], pg[4], dev[4], host[4];
	uint8_t k0[KVP_PAGE_KEY_BYTES];
	struct kvp_key keys[2];
	struct kvp_index_stats st;

	CU_ASSERT_PTR_NOT_NULL_FATAL(dv);
	ix = kvp_index_new(&cf);
	CU_ASSERT_PTR_NOT_NULL_FATAL(ix);
	seq(a, 16, 5);
	CU_ASSERT_EQUAL_FATAL(kvp_pages_alloc(dv, 4, pg), 0);
	CU_ASSERT_EQUAL(kvp_index_insert_tokens(ix, 3, a, 4, DEV, pg, &r, NULL), 0);
	CU_ASSERT_EQUAL(r.new_pages, 4);
	/* key pages in the same namespace, the first one named by the token page's own key */
	kvp_page_key(NULL, a, 4, k0);
	keys[0] = (struct kvp_key){ sizeof(k0), k0 };
	keys[1] = (struct kvp_key){ 3, (const uint8_t *)"abc" };
	CU_ASSERT_EQUAL(kvp_index_exists(ix, 3, keys, 2), 0);
	CU_ASSERT_EQUAL_FATAL(kvp_pages_alloc(dv, 2, pg), 0);
	CU_ASSERT_EQUAL(kvp_index_insert(ix, 3, keys, 2, 0, DEV, pg, &r, NULL), 0);
	CU_ASSERT_EQUAL(r.new_pages, 2);
	CU_ASSERT_EQUAL(kvp_index_exists(ix, 3, keys, 2), 2);
	CU_ASSERT_EQUAL(kvp_index_match_tokens(ix, 3, a, 16, 1, &m, dev, host), 0);
	CU_ASSERT_EQUAL(m.dev_pages, 4);
	lk = m.lock;
	CU_ASSERT(kvp_index_lock_tokened(ix, lk));
	CU_ASSERT_EQUAL(memcmp(kvp_index_lock_tokens(ix, lk, 1), a + 4, 16), 0);
	kvp_index_stats(ix, &st);
	CU_ASSERT_EQUAL(st.entries, 6);
	CU_ASSERT_EQUAL(st.token_entries, 4);
	CU_ASSERT_EQUAL(st.namespaces, 1);
	CU_ASSERT_EQUAL(kvp_index_check(ix), 0);
	/* the flush keeps the locked token pages, drops the key pages */
	CU_ASSERT_EQUAL(kvp_index_flush(ix), 2);
	CU_ASSERT_EQUAL(kvp_index_exists(ix, 3, keys, 2), 0);
	kvp_index_unlock(ix, lk);
	CU_ASSERT_EQUAL(kvp_index_flush(ix), 4);
	kvp_index_stats(ix, &st);
	CU_ASSERT_EQUAL(st.entries, 0);
	CU_ASSERT_EQUAL(st.namespaces, 0);
	CU_ASSERT_EQUAL(kvp_pages_count(dv, KVP_PAGE_FREE), 64);
	CU_ASSERT_EQUAL(kvp_index_check(ix), 0);
	kvp_index_free(ix);
	kvp_pages_free(dv);
}

/* A token page's key is the chained SHA-256 of its parent's key and its tokens (little-endian
 * words), what the spill hook hands over and the walk shows. */
static void test_index_tokens_page_keys(void)
{
	struct kvp_pages *dv = kvp_pages_new(8);
	struct kvp_index_conf cf = { .dev = dv, .page_tokens = 2 };
	struct kvp_index *ix;
	uint32_t t[4] = { 1, 0x01020304, 3, 4 }, pg[2];
	uint8_t k1[KVP_PAGE_KEY_BYTES], k2[KVP_PAGE_KEY_BYTES];
	/* SHA-256 of the bytes 01 00 00 00 04 03 02 01 */
	static const uint8_t want1[4] = { 0xcd, 0x48, 0xbd, 0x37 };
	struct kvp_key k;
	uint64_t ns;
	struct kvp_index_match m;
	uint32_t dev[2], host[2];

	CU_ASSERT_PTR_NOT_NULL_FATAL(dv);
	ix = kvp_index_new(&cf);
	CU_ASSERT_PTR_NOT_NULL_FATAL(ix);
	kvp_page_key(NULL, t, 2, k1);
	kvp_page_key(k1, t + 2, 2, k2);
	CU_ASSERT_EQUAL(memcmp(k1, want1, sizeof(want1)), 0);
	CU_ASSERT_EQUAL_FATAL(kvp_pages_alloc(dv, 2, pg), 0);
	CU_ASSERT_EQUAL(kvp_index_insert_tokens(ix, 9, t, 2, DEV, pg, NULL, NULL), 0);
	CU_ASSERT_EQUAL(kvp_index_match_tokens(ix, 9, t, 4, 1, &m, dev, host), 0);
	CU_ASSERT_EQUAL_FATAL(m.dev_pages, 2);
	CU_ASSERT_EQUAL(kvp_index_lock_key(ix, m.lock, 0, &k, &ns), 0);
	CU_ASSERT(k.len == sizeof(k1) && !memcmp(k.data, k1, sizeof(k1)) && ns == 9);
	CU_ASSERT_EQUAL(kvp_index_lock_key(ix, m.lock, 1, &k, &ns), 0);
	CU_ASSERT(k.len == sizeof(k2) && !memcmp(k.data, k2, sizeof(k2)));
	CU_ASSERT(memcmp(k1, k2, sizeof(k1)) != 0);
	kvp_index_unlock(ix, m.lock);
	kvp_index_free(ix);
	kvp_pages_free(dv);
}

/* A restore's kvp_index_put order, parents first: 100 chains' first pages, then each one's
 * second page under it. The 65th entry grows the entry table (its first allocation holds 64),
 * so the second page of chain 0 is put under an entry the growth moved: every chain must
 * still match both its pages (a child hashed through a stale parent would match 1). */
static void test_index_put_chains_across_table_growth(void)
{
	enum { N = 100, PT = 4 };
	struct kvp_pages *host = kvp_pages_new(2 * N);
	struct kvp_index *ix;
	uint32_t page[2 * N], first[N], t[2 * PT], dev[2], hp[2];

	CU_ASSERT_PTR_NOT_NULL_FATAL(host);
	ix = host_only_tree(host);
	CU_ASSERT_PTR_NOT_NULL_FATAL(ix);
	CU_ASSERT_EQUAL_FATAL(kvp_pages_alloc(host, 2 * N, page), 0);
	for (uint32_t i = 0; i < 2 * N; i++) {
		uint32_t c = i % N, at;

		seq(t, 2 * PT, 1000 * c + 1);
		struct kvp_index_entry x = { .ns = 3,
					     .keyed = 0,
					     .tokens = t + (i < N ? 0 : PT),
					     .tier = HOST,
					     .page = page[i],
					     .hits = 1 };

		CU_ASSERT_EQUAL_FATAL(kvp_index_put(ix, &x, i < N ? UINT32_MAX : first[c], &at), 0);
		if (i < N)
			first[c] = at;
	}
	CU_ASSERT_EQUAL(kvp_index_check(ix), 0);
	for (uint32_t c = 0; c < N; c++) {
		struct kvp_index_match m;

		seq(t, 2 * PT, 1000 * c + 1);
		CU_ASSERT_EQUAL(kvp_index_match_tokens(ix, 3, t, 2 * PT, 0, &m, dev, hp), 0);
		CU_ASSERT_EQUAL(m.host_pages, 2);
		CU_ASSERT(m.host_pages == 2 && hp[0] == page[c] && hp[1] == page[N + c]);
	}
	kvp_index_free(ix);
	kvp_pages_free(host);
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_kvp_prefix_new_bad_conf),
		H_TEST(test_kvp_prefix_new_seed_from_getrandom),
		H_TEST(test_kvp_prefix_new_seeds_differ),
		H_TEST(test_kvp_prefix_new_seed_without_getrandom),
		H_TEST(test_kvp_prefix_match_split_locked),
		H_TEST(test_kvp_prefix_match_namespace),
		H_TEST(test_kvp_prefix_match_unaligned),
		H_TEST(test_kvp_prefix_insert_dup),
		H_TEST(test_kvp_prefix_insert_invalid),
		H_TEST(test_kvp_prefix_insert_upgrade),
		H_TEST(test_kvp_prefix_insert_extend),
		H_TEST(test_kvp_prefix_insert_named_positions),
		H_TEST(test_kvp_prefix_evict_exact),
		H_TEST(test_kvp_prefix_evict_all_locked),
		H_TEST(test_kvp_prefix_evict_demote_bytes),
		H_TEST(test_kvp_prefix_evict_host_over_device),
		H_TEST(test_kvp_prefix_evict_lru_vs_lfu),
		H_TEST(test_kvp_prefix_evict_copy_fails),
		H_TEST(test_kvp_prefix_demote_async_in_flight),
		H_TEST(test_kvp_prefix_demote_async_fails),
		H_TEST(test_kvp_prefix_demote_async_split),
		H_TEST(test_kvp_prefix_demote_async_not_for_promotion),
		H_TEST(test_kvp_prefix_promote_enospc),
		H_TEST(test_kvp_prefix_promote_busy_when_shared),
		H_TEST(test_kvp_prefix_promote_copy_fails),
		H_TEST(test_kvp_prefix_flush_keeps_locked),
		H_TEST(test_kvp_prefix_top_by_hits),
		H_TEST(test_index_tokens_exact_under_collisions),
		H_TEST(test_index_tokens_and_keys_side_by_side),
		H_TEST(test_index_tokens_page_keys),
		H_TEST(test_index_put_chains_across_table_growth),
		H_TEST(test_kvp_prefix_stats_metadata_per_page),
		H_TEST(test_kvp_prefix_random_two_tiers_lru),
		H_TEST(test_kvp_prefix_random_two_tiers_lfu),
		H_TEST(test_kvp_prefix_random_small_host),
		H_TEST(test_kvp_prefix_random_small_device),
		H_TEST(test_kvp_prefix_random_device_only),
		H_TEST(test_kvp_prefix_random_host_only),
	};

	return H_RUN_SUITE("prefix", NULL, NULL, tests);
}
