/* prefix.c - prefix cache of one pool: a radix tree of page-aligned token ids.
 *
 * Layout. A node holds a run of k >= 1 pages: k * page_tokens token ids and k page ids in one
 * buffer (tokens[cap * pt], then pages[cap]). Pages [0, ndev) of a node live in the device tier,
 * [ndev, npages) in the host tier: every operation keeps that order inside a node (insert
 * writes one tier, demotion takes the last device page, upgrade and promotion take a prefix of
 * the host pages), so no per-page tier byte is needed. One namespace root (no pages) per
 * namespace hangs off nothing. Children are found in one hash table for the whole tree keyed by
 * (parent pointer, hash of the child's first page); a chain hit is confirmed with memcmp.
 *
 * Locks. A node's lock count is the number of locks whose path runs through it (a lock
 * increments root..handle). A split keeps the old node as the deeper part, so handles stay
 * valid, and the new upper part copies the lock count.
 *
 * Eviction. Two binary heaps of candidates, ordered by (atime) or (hits, atime):
 *  - device: unlocked nodes with device pages and no device page in any child's subtree
 *    (dev_below == 0); their last device page goes first;
 *  - host: unlocked leaves whose last page is a host page.
 * Each node counts the children whose subtree holds a device (host) page, so candidacy changes
 * are propagated upward only while a subtree's "holds a device/host page" bit flips.
 * Counters (cached/evictable/protected) are kept per node change, so stats are O(1).
 *
 * Complexity (n nodes, d = depth of the path in nodes, p = pages of the call, t = page_tokens):
 *  insert  O(p * t + d log n) expected: one hash per node boundary, memcmp along nodes;
 *  match   O(p * t + d log n) expected, same walk, plus a split when a lock ends inside a node;
 *  unlock  O(d log n);  promote O(path pages + d log n + eviction);
 *  evict   O((p + nodes emptied) log n) plus upward flag propagation, amortised O(1) per node;
 *  flush, top, check  O(n) (top O(n log cap), check O(n log n + tier pages)); stats O(1).
 * Memory per node: sizeof(struct kvp_prefix_node) + one hash bucket + one slot in each heap;
 * per page: 4 bytes of page id + t * 4 bytes of token ids (+ slack of up to 1/4 on nodes grown
 * by extension). */
#include "prefix.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "fault.h"
#include "mix.h"

#define PT_MAX (1u << 16)
#define NO_IDX UINT32_MAX
#define BUCKETS_MIN 64u
#define DEMOTE_BATCH 64u

enum { HEAP_DEV = KVP_TIER_ID_DEVICE, HEAP_HOST = KVP_TIER_ID_HOST, HEAP_MAX };

struct kvp_prefix_node {
	struct kvp_prefix_node *parent; /* NULL for a namespace root */
	struct kvp_prefix_node *hnext;	/* hash chain */
	uint32_t *data;			/* tokens[cap * pt], then pages[cap]; NULL for a root */
	uint64_t atime;
	uint32_t hits; /* saturating */
	uint32_t hash; /* of the first page's tokens; roots: of the namespace */
	uint32_t npages;
	uint32_t cap;
	uint32_t ndev; /* pages [0, ndev) device-resident, [ndev, npages) host-resident */
	uint32_t lock; /* locks whose path runs through this node */
	uint32_t nchildren;
	uint32_t dev_below;  /* children whose subtree holds a device page */
	uint32_t host_below; /* children whose subtree holds a host page */
	uint32_t hidx[HEAP_MAX];
	struct kvp_prefix_memo *memo; /* the hooks' chain state before this node; NULL: none */
};

struct ns_root {
	struct kvp_prefix_node n;
	uint64_t ns;
};

struct heap {
	struct kvp_prefix_node **v;
	uint32_t n, cap;
};

struct kvp_prefix {
	struct kvp_prefix_conf conf;
	uint32_t pt;
	struct kvp_pages *tier[KVP_TIER_ID_MAX];
	struct kvp_prefix_node **buckets;
	uint32_t nbuckets; /* power of two */
	uint64_t npnodes;  /* nodes holding pages (heap capacity is kept >= this) */
	uint64_t seed;	   /* of the hashes */
	struct heap heap[HEAP_MAX];
	struct kvp_prefix_stats st;
	struct kvp_prefix_flight *flights; /* demotions in flight */
	bool sync_only;			   /* this eviction needs its pages now: no copy_start */
	kvp_prefix_spill_fn spill;	   /* host pages evicted (kvp_prefix_set_spill) */
	void *spill_ctx;
	kvp_prefix_spill_fn landed; /* device pages demoted to host (kvp_prefix_set_landed) */
	void *landed_ctx;
	struct kvp_prefix_seg *segs; /* the evicted path's segments, for the hooks */
	size_t segs_cap;	     /* entries of segs */
};

struct kvp_prefix_flight {
	struct kvp_prefix_node *node; /* the locked path's end; the pages are its device tail or,
				       * after splits, the device tails of it and its ancestors */
	uint32_t n;
	uint32_t src[DEMOTE_BATCH], dst[DEMOTE_BATCH];
	struct kvp_prefix_flight *prev, *next;
};

/* ---- small helpers ---- */

static inline uint32_t min_u32(uint32_t a, uint32_t b)
{
	return a < b ? a : b;
}

/* Seeded per tree: token ids come from clients, who must not be able to build long chains. */
static uint32_t page_hash(const struct kvp_prefix *pfx, const uint32_t *t)
{
	uint64_t h = pfx->seed;
	uint32_t i = 0, pt = pfx->pt;

	for (; i + 2 <= pt; i += 2) {
		uint64_t v;

		memcpy(&v, t + i, sizeof(v));
		h = (h ^ (v * 0x87c37b91114253d5ULL)) * 0x4cf5ad432745937fULL;
		h ^= h >> 29;
	}
	if (i < pt)
		h = (h ^ (t[i] * 0x87c37b91114253d5ULL)) * 0x4cf5ad432745937fULL;
	return (uint32_t)kvp_mix64(h);
}

static inline uint32_t ns_hash(const struct kvp_prefix *pfx, uint64_t ns)
{
	return (uint32_t)kvp_mix64(ns ^ pfx->seed);
}

static inline uint32_t *node_tokens(const struct kvp_prefix_node *n)
{
	return n->data;
}

static inline uint32_t *node_pages(const struct kvp_prefix *pfx, const struct kvp_prefix_node *n)
{
	return n->data + (size_t)n->cap * pfx->pt;
}

static inline size_t data_bytes(const struct kvp_prefix *pfx, uint32_t cap)
{
	return (size_t)cap * (pfx->pt + 1) * sizeof(uint32_t);
}

static inline bool is_root(const struct kvp_prefix_node *n)
{
	return !n->parent;
}

static inline uint64_t root_ns(const struct kvp_prefix_node *n)
{
	return ((const struct ns_root *)n)->ns;
}

static inline bool has_dev(const struct kvp_prefix_node *n)
{
	return n->ndev || n->dev_below;
}

static inline bool has_host(const struct kvp_prefix_node *n)
{
	return n->ndev < n->npages || n->host_below;
}

static uint64_t now_of(const struct kvp_prefix *pfx)
{
	struct timespec ts;

	if (pfx->conf.now)
		return pfx->conf.now(pfx->conf.now_ctx);
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* ---- metadata memory, counted ---- */

static void *md_alloc(struct kvp_prefix *pfx, size_t sz)
{
	void *p = KVP_FAULT_OR(KVP_FAULT_PREFIX, malloc(sz));

	if (p)
		pfx->st.metadata_bytes += sz;
	return p;
}

static void md_free(struct kvp_prefix *pfx, void *p, size_t sz)
{
	if (!p)
		return;
	free(p);
	pfx->st.metadata_bytes -= sz;
}

/* A page node with an uninitialised buffer of cap pages; NULL on ENOMEM. */
static struct kvp_prefix_node *node_alloc(struct kvp_prefix *pfx, uint32_t cap)
{
	struct kvp_prefix_node *n = md_alloc(pfx, sizeof(*n));

	if (!n)
		return NULL;
	memset(n, 0, sizeof(*n));
	n->data = md_alloc(pfx, data_bytes(pfx, cap));
	if (!n->data) {
		md_free(pfx, n, sizeof(*n));
		return NULL;
	}
	n->cap = cap;
	n->hidx[HEAP_DEV] = n->hidx[HEAP_HOST] = NO_IDX;
	return n;
}

static void node_dealloc(struct kvp_prefix *pfx, struct kvp_prefix_node *n)
{
	if (!n)
		return;
	if (!n->data) { /* a namespace root; an unlinked page node has no parent yet */
		md_free(pfx, n, sizeof(struct ns_root));
		return;
	}
	md_free(pfx, n->data, data_bytes(pfx, n->cap));
	md_free(pfx, n->memo, sizeof(*n->memo));
	md_free(pfx, n, sizeof(*n));
}

/* ---- hash index ---- */

static inline uint32_t bucket_of(const struct kvp_prefix *pfx, const struct kvp_prefix_node *parent,
				 uint32_t hash)
{
	uint64_t k = (uint64_t)(uintptr_t)parent ^ ((uint64_t)hash * 0x9e3779b97f4a7c15ULL);

	return (uint32_t)kvp_mix64(k) & (pfx->nbuckets - 1);
}

static void hash_add(struct kvp_prefix *pfx, struct kvp_prefix_node *n)
{
	uint32_t b = bucket_of(pfx, n->parent, n->hash);

	n->hnext = pfx->buckets[b];
	pfx->buckets[b] = n;
}

static void hash_del(struct kvp_prefix *pfx, struct kvp_prefix_node *n)
{
	struct kvp_prefix_node **pp = &pfx->buckets[bucket_of(pfx, n->parent, n->hash)];

	while (*pp != n)
		pp = &(*pp)->hnext;
	*pp = n->hnext;
	n->hnext = NULL;
}

/* Doubles the table when it holds more nodes than buckets. Failure only lengthens chains. */
static void hash_grow(struct kvp_prefix *pfx)
{
	struct kvp_prefix_node **old = pfx->buckets, **nb;
	uint32_t oldn = pfx->nbuckets;

	if (pfx->st.nodes <= oldn || oldn >= (1u << 31))
		return;
	nb = KVP_FAULT_OR(KVP_FAULT_PREFIX, calloc((size_t)oldn * 2, sizeof(*nb)));
	if (!nb)
		return;
	pfx->st.metadata_bytes += (size_t)oldn * 2 * sizeof(*nb);
	pfx->buckets = nb;
	pfx->nbuckets = oldn * 2;
	for (uint32_t i = 0; i < oldn; i++) {
		struct kvp_prefix_node *n = old[i], *next;

		for (; n; n = next) {
			next = n->hnext;
			hash_add(pfx, n);
		}
	}
	md_free(pfx, old, (size_t)oldn * sizeof(*old));
}

static struct kvp_prefix_node *child_find(const struct kvp_prefix *pfx,
					  const struct kvp_prefix_node *parent, const uint32_t *tok,
					  uint32_t hash)
{
	struct kvp_prefix_node *n = pfx->buckets[bucket_of(pfx, parent, hash)];

	for (; n; n = n->hnext)
		if (n->parent == parent && n->hash == hash &&
		    !memcmp(n->data, tok, (size_t)pfx->pt * sizeof(*tok)))
			return n;
	return NULL;
}

static struct kvp_prefix_node *root_find(const struct kvp_prefix *pfx, uint64_t ns)
{
	uint32_t hash = ns_hash(pfx, ns);
	struct kvp_prefix_node *n = pfx->buckets[bucket_of(pfx, NULL, hash)];

	for (; n; n = n->hnext)
		if (!n->parent && n->hash == hash && root_ns(n) == ns)
			return n;
	return NULL;
}

int kvp_prefix_has_ns(const struct kvp_prefix *pfx, uint64_t ns)
{
	return pfx && root_find(pfx, ns) != NULL;
}

/* ---- eviction heaps ---- */

/* True when a goes before b. */
static inline bool colder(const struct kvp_prefix *pfx, const struct kvp_prefix_node *a,
			  const struct kvp_prefix_node *b)
{
	if (pfx->conf.policy == KVP_EVICT_POLICY_LFU && a->hits != b->hits)
		return a->hits < b->hits;
	return a->atime < b->atime;
}

static inline void heap_set(struct heap *h, int hid, uint32_t i, struct kvp_prefix_node *n)
{
	h->v[i] = n;
	n->hidx[hid] = i;
}

static void heap_up(struct kvp_prefix *pfx, int hid, uint32_t i)
{
	struct heap *h = &pfx->heap[hid];
	struct kvp_prefix_node *n = h->v[i];

	while (i > 0) {
		uint32_t p = (i - 1) / 2;

		if (!colder(pfx, n, h->v[p]))
			break;
		heap_set(h, hid, i, h->v[p]);
		i = p;
	}
	heap_set(h, hid, i, n);
}

static void heap_down(struct kvp_prefix *pfx, int hid, uint32_t i)
{
	struct heap *h = &pfx->heap[hid];
	struct kvp_prefix_node *n = h->v[i];

	for (;;) {
		uint32_t c = 2 * i + 1;

		if (c >= h->n)
			break;
		if (c + 1 < h->n && colder(pfx, h->v[c + 1], h->v[c]))
			c++;
		if (!colder(pfx, h->v[c], n))
			break;
		heap_set(h, hid, i, h->v[c]);
		i = c;
	}
	heap_set(h, hid, i, n);
}

/* Capacity is reserved before any node is created, so this cannot fail. */
static void heap_add(struct kvp_prefix *pfx, int hid, struct kvp_prefix_node *n)
{
	struct heap *h = &pfx->heap[hid];

	heap_set(h, hid, h->n++, n);
	heap_up(pfx, hid, h->n - 1);
}

static void heap_del(struct kvp_prefix *pfx, int hid, struct kvp_prefix_node *n)
{
	struct heap *h = &pfx->heap[hid];
	uint32_t i = n->hidx[hid];
	struct kvp_prefix_node *last = h->v[--h->n];

	n->hidx[hid] = NO_IDX;
	if (last == n)
		return;
	heap_set(h, hid, i, last);
	heap_up(pfx, hid, i);
	heap_down(pfx, hid, last->hidx[hid]);
}

static int heap_reserve(struct kvp_prefix *pfx, uint64_t need)
{
	for (int hid = 0; hid < HEAP_MAX; hid++) {
		struct heap *h = &pfx->heap[hid];
		struct kvp_prefix_node **v;
		uint64_t cap;

		if (need <= h->cap)
			continue;
		cap = h->cap ? (uint64_t)h->cap * 2 : 16;
		if (cap < need)
			cap = need;
		if (cap > UINT32_MAX)
			return -ENOMEM;
		v = KVP_FAULT_OR(KVP_FAULT_PREFIX, realloc(h->v, (size_t)cap * sizeof(*v)));
		if (!v)
			return -ENOMEM;
		pfx->st.metadata_bytes += (size_t)(cap - h->cap) * sizeof(*v);
		h->v = v;
		h->cap = (uint32_t)cap;
	}
	return 0;
}

static inline bool dev_candidate(const struct kvp_prefix_node *n)
{
	return n->npages && !n->lock && n->ndev && !n->dev_below;
}

static inline bool host_candidate(const struct kvp_prefix_node *n)
{
	return n->npages && !n->lock && !n->nchildren && n->ndev < n->npages;
}

/* Puts n in or out of each heap as its state says. */
static void heap_refresh(struct kvp_prefix *pfx, struct kvp_prefix_node *n)
{
	bool want[HEAP_MAX] = { dev_candidate(n), host_candidate(n) };

	for (int hid = 0; hid < HEAP_MAX; hid++) {
		bool in = n->hidx[hid] != NO_IDX;

		if (want[hid] && !in)
			heap_add(pfx, hid, n);
		else if (!want[hid] && in)
			heap_del(pfx, hid, n);
	}
}

/* After n's key (atime, hits) changed. */
static void heap_fix(struct kvp_prefix *pfx, struct kvp_prefix_node *n)
{
	for (int hid = 0; hid < HEAP_MAX; hid++) {
		if (n->hidx[hid] == NO_IDX)
			continue;
		heap_up(pfx, hid, n->hidx[hid]);
		heap_down(pfx, hid, n->hidx[hid]);
	}
}

/* ---- counters: a node's share of the stats, taken out before it changes, put back after ---- */

static void acct(struct kvp_prefix *pfx, const struct kvp_prefix_node *n, bool add)
{
	uint64_t d = n->ndev, h = n->npages - n->ndev;
	struct kvp_prefix_stats *st = &pfx->st;

	if (!add) {
		d = -d;
		h = -h;
	}
	st->cached_pages[KVP_TIER_ID_DEVICE] += d;
	st->cached_pages[KVP_TIER_ID_HOST] += h;
	if (n->lock) {
		st->protected_pages[KVP_TIER_ID_DEVICE] += d;
		st->protected_pages[KVP_TIER_ID_HOST] += h;
		return;
	}
	st->evictable_pages[KVP_TIER_ID_DEVICE] += d;
	if (!n->dev_below) /* host pages above a device page cannot go before it */
		st->evictable_pages[KVP_TIER_ID_HOST] += h;
}

/* A child subtree of p gained (+1) or lost (-1) a device / host page: walk up while the
 * "subtree holds one" bits flip. */
static void below_changed(struct kvp_prefix *pfx, struct kvp_prefix_node *p, int ddev, int dhost)
{
	while (p && (ddev || dhost)) {
		bool hd = has_dev(p), hh = has_host(p);

		acct(pfx, p, false);
		p->dev_below = (uint32_t)((int64_t)p->dev_below + ddev);
		p->host_below = (uint32_t)((int64_t)p->host_below + dhost);
		acct(pfx, p, true);
		heap_refresh(pfx, p);
		ddev = (int)has_dev(p) - (int)hd;
		dhost = (int)has_host(p) - (int)hh;
		p = p->parent;
	}
}

/* After n's own pages changed (acct already redone): heaps and the ancestors' bits. */
static void node_changed(struct kvp_prefix *pfx, struct kvp_prefix_node *n, bool had_dev,
			 bool had_host)
{
	heap_refresh(pfx, n);
	below_changed(pfx, n->parent, (int)has_dev(n) - (int)had_dev,
		      (int)has_host(n) - (int)had_host);
}

static void lock_get(struct kvp_prefix *pfx, struct kvp_prefix_node *n)
{
	acct(pfx, n, false);
	n->lock++;
	acct(pfx, n, true);
	if (n->lock == 1)
		heap_refresh(pfx, n);
}

static void lock_put(struct kvp_prefix *pfx, struct kvp_prefix_node *n)
{
	acct(pfx, n, false);
	n->lock--;
	acct(pfx, n, true);
	if (n->lock == 0)
		heap_refresh(pfx, n);
}

/* Links a fresh node (pages filled, acct not yet counted) under parent. */
static void node_link(struct kvp_prefix *pfx, struct kvp_prefix_node *n,
		      struct kvp_prefix_node *parent)
{
	n->parent = parent;
	n->hash = page_hash(pfx, node_tokens(n));
	hash_add(pfx, n);
	parent->nchildren++;
	pfx->st.nodes++;
	pfx->npnodes++;
	acct(pfx, n, true);
	heap_refresh(pfx, parent); /* no longer a leaf */
	node_changed(pfx, n, false, false);
}

static void root_unlink(struct kvp_prefix *pfx, struct kvp_prefix_node *r)
{
	hash_del(pfx, r);
	pfx->st.nodes--;
	node_dealloc(pfx, r);
}

/* Removes a page node left with no pages and no children (already out of the heaps). */
static void node_unlink(struct kvp_prefix *pfx, struct kvp_prefix_node *n)
{
	struct kvp_prefix_node *p = n->parent;

	hash_del(pfx, n);
	p->nchildren--;
	pfx->st.nodes--;
	pfx->npnodes--;
	node_dealloc(pfx, n);
	heap_refresh(pfx, p);
	if (is_root(p) && !p->nchildren)
		root_unlink(pfx, p);
}

/* Number of leading pages of node c equal to tok's pages, at most avail (the first page is
 * known to match: the hash lookup compared it). */
static uint32_t run_match(const struct kvp_prefix *pfx, const struct kvp_prefix_node *c,
			  const uint32_t *tok, uint32_t avail)
{
	uint32_t pt = pfx->pt, lim = min_u32(c->npages, avail), k;
	const uint32_t *a = node_tokens(c);

	if (lim <= 1)
		return lim;
	if (!memcmp(a + pt, tok + pt, (size_t)(lim - 1) * pt * sizeof(*tok)))
		return lim;
	for (k = 1; k < lim; k++)
		if (memcmp(a + (size_t)k * pt, tok + (size_t)k * pt, (size_t)pt * sizeof(*tok)))
			break;
	return k;
}

/* ---- split ---- */

struct split_mem {
	struct kvp_prefix_node *upper; /* buffer of j pages */
	uint32_t *lower;	       /* buffer of npages - j pages */
};

static int split_prepare(struct kvp_prefix *pfx, const struct kvp_prefix_node *x, uint32_t j,
			 struct split_mem *sm)
{
	sm->upper = node_alloc(pfx, j);
	sm->lower = sm->upper ? md_alloc(pfx, data_bytes(pfx, x->npages - j)) : NULL;
	if (!sm->lower) {
		node_dealloc(pfx, sm->upper);
		sm->upper = NULL;
		return -ENOMEM;
	}
	return 0;
}

/* Splits x after j pages (0 < j < npages): a new upper node takes pages [0, j) and x's place;
 * x keeps [j, npages) as its child, so lock handles on x keep naming the same path.
 * The parent's counters do not change (same subtree, same pages). Returns the upper node. */
static struct kvp_prefix_node *split_commit(struct kvp_prefix *pfx, struct kvp_prefix_node *x,
					    uint32_t j, struct split_mem *sm)
{
	struct kvp_prefix_node *u = sm->upper;
	uint32_t pt = pfx->pt, n = x->npages, rest = n - j;
	uint32_t *xp = node_pages(pfx, x), *lower = sm->lower;

	acct(pfx, x, false);
	hash_del(pfx, x);
	u->parent = x->parent;
	u->hash = x->hash;
	u->atime = x->atime;
	u->hits = x->hits;
	u->lock = x->lock;
	u->memo = x->memo; /* the path before u is the one that was before x */
	x->memo = NULL;
	u->npages = j;
	u->ndev = min_u32(x->ndev, j);
	u->nchildren = 1;
	memcpy(node_tokens(u), node_tokens(x), (size_t)j * pt * sizeof(uint32_t));
	memcpy(node_pages(pfx, u), xp, (size_t)j * sizeof(uint32_t));
	memcpy(lower, node_tokens(x) + (size_t)j * pt, (size_t)rest * pt * sizeof(uint32_t));
	memcpy(lower + (size_t)rest * pt, xp + j, (size_t)rest * sizeof(uint32_t));
	md_free(pfx, x->data, data_bytes(pfx, x->cap));
	x->data = lower;
	x->cap = x->npages = rest;
	x->ndev -= u->ndev;
	x->parent = u;
	x->hash = page_hash(pfx, node_tokens(x));
	u->dev_below = has_dev(x);
	u->host_below = has_host(x);
	hash_add(pfx, u);
	hash_add(pfx, x);
	pfx->st.nodes++;
	pfx->npnodes++;
	acct(pfx, u, true);
	acct(pfx, x, true);
	heap_refresh(pfx, u);
	heap_refresh(pfx, x);
	sm->upper = NULL;
	sm->lower = NULL;
	return u;
}

/* ---- construction ---- */

/* The hash seed: clients choose the token ids, so the seed must be unpredictable to them.
 * getrandom(2); /dev/urandom only on a kernel without it (ENOSYS). 0 or -1. */
static int seed_of(uint64_t *seed)
{
	unsigned char b[sizeof(*seed)];
	size_t got = 0;
	FILE *f;

	while (got < sizeof(b)) {
		ssize_t n = getrandom(b + got, sizeof(b) - got, 0);

		if (n > 0) {
			got += (size_t)n;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == ENOSYS)
			break;
		return -1;
	}
	if (got < sizeof(b)) {
		f = fopen("/dev/urandom", "rbe");
		if (!f)
			return -1;
		got += fread(b + got, 1, sizeof(b) - got, f);
		fclose(f);
		if (got < sizeof(b))
			return -1;
	}
	memcpy(seed, b, sizeof(*seed));
	return 0;
}

uint64_t kvp_prefix_seed(const struct kvp_prefix *pfx)
{
	return pfx->seed;
}

struct kvp_prefix *kvp_prefix_new(const struct kvp_prefix_conf *conf)
{
	struct kvp_prefix *pfx;

	if (!conf || !conf->page_tokens || conf->page_tokens > PT_MAX ||
	    (unsigned)conf->policy >= KVP_EVICT_POLICY_MAX || (!conf->dev && !conf->host) ||
	    conf->dev == conf->host || (conf->dev && conf->host && !conf->copy))
		return NULL;
	pfx = calloc(1, sizeof(*pfx));
	if (!pfx)
		return NULL;
	pfx->conf = *conf;
	pfx->pt = conf->page_tokens;
	pfx->tier[KVP_TIER_ID_DEVICE] = conf->dev;
	pfx->tier[KVP_TIER_ID_HOST] = conf->host;
	if (seed_of(&pfx->seed) < 0) {
		free(pfx);
		return NULL;
	}
	pfx->st.metadata_bytes = sizeof(*pfx);
	/* not md_alloc: its failure injection ("prefix") is for serving, not for start-up */
	pfx->buckets = calloc(BUCKETS_MIN, sizeof(*pfx->buckets));
	if (!pfx->buckets) {
		free(pfx);
		return NULL;
	}
	pfx->st.metadata_bytes += BUCKETS_MIN * sizeof(*pfx->buckets);
	pfx->nbuckets = BUCKETS_MIN;
	return pfx;
}

void kvp_prefix_free(struct kvp_prefix *pfx)
{
	if (!pfx)
		return;
	free(pfx->segs);
	for (uint32_t i = 0; i < pfx->nbuckets; i++) {
		struct kvp_prefix_node *n = pfx->buckets[i], *next;

		for (; n; n = next) {
			next = n->hnext;
			node_dealloc(pfx, n);
		}
	}
	free(pfx->buckets);
	for (int hid = 0; hid < HEAP_MAX; hid++)
		free(pfx->heap[hid].v);
	while (pfx->flights) { /* the owner ended their copies first; only the memory is left */
		struct kvp_prefix_flight *fl = pfx->flights;

		pfx->flights = fl->next;
		free(fl);
	}
	free(pfx);
}

/* ---- insert ---- */

static void unmark(struct kvp_pages *tp, const uint32_t *pages, uint32_t from, uint32_t to)
{
	for (uint32_t i = from; i < to; i++)
		if (pages[i] != KVP_PAGE_NONE)
			kvp_pages_move(tp, pages[i], KVP_PAGE_CACHED, KVP_PAGE_LEASED);
}

/* What insert does with the first m pages of existing node c, at positions [s, s + m):
 * upgrades host pages [ndev, ndev + *up) (device insert, unlocked node, a page given for each:
 * a contiguous run, so the node stays device-then-host); every other position that came with
 * a page is a duplicate. Returns the number of duplicates. */
static uint32_t plan_node(const struct kvp_prefix_node *c, uint32_t s, uint32_t m,
			  enum kvp_tier_id tier, const uint32_t *pages, uint32_t *up)
{
	uint32_t u = 0, given = 0;

	if (tier == KVP_TIER_ID_DEVICE && !c->lock)
		while (c->ndev + u < m && pages[s + c->ndev + u] != KVP_PAGE_NONE)
			u++;
	for (uint32_t k = 0; k < m; k++)
		given += pages[s + k] != KVP_PAGE_NONE;
	*up = u;
	return given - u;
}

int kvp_prefix_insert(struct kvp_prefix *pfx, uint64_t ns, const uint32_t *tokens, uint32_t npages,
		      enum kvp_tier_id tier, const uint32_t *pages, struct kvp_insert_result *res,
		      uint32_t *dup_idx)
{
	struct kvp_prefix_node *root, *cur, *end = NULL, *div = NULL, *fresh = NULL, *last;
	struct ns_root *newroot = NULL;
	struct split_mem sm = { 0 };
	struct kvp_pages *tp;
	uint32_t pt, pos = 0, endm = 0, divm = 0, ndup = 0, nup = 0, nnew, done, dw, up = 0;
	uint32_t *grown = NULL;
	uint32_t grow_cap = 0;
	bool extend = false;
	uint64_t now;

	if (!pfx || !tokens || !pages || !npages || (unsigned)tier >= KVP_TIER_ID_MAX)
		return -EINVAL;
	tp = pfx->tier[tier];
	if (!tp)
		return -EINVAL;
	pt = pfx->pt;
	/* Validate: every page LEASED and listed once. LEASED -> CACHED marks them as we go. */
	for (uint32_t i = 0; i < npages; i++) {
		if (pages[i] != KVP_PAGE_NONE &&
		    kvp_pages_move(tp, pages[i], KVP_PAGE_LEASED, KVP_PAGE_CACHED) < 0) {
			unmark(tp, pages, 0, i);
			return -EINVAL;
		}
	}

	/* Plan: walk the existing positions without changing anything. */
	root = root_find(pfx, ns);
	cur = root;
	while (cur && pos < npages) {
		const uint32_t *t = tokens + (size_t)pos * pt;
		struct kvp_prefix_node *c = child_find(pfx, cur, t, page_hash(pfx, t));
		uint32_t m;

		if (!c)
			break;
		m = run_match(pfx, c, t, npages - pos);
		ndup += plan_node(c, pos, m, tier, pages, &up);
		nup += up;
		pos += m;
		if (m < c->npages) {
			if (pos < npages) { /* diverges inside c: split it */
				div = c;
				divm = m;
			} else { /* ends inside c: no split needed */
				end = c;
				endm = m;
			}
			break;
		}
		cur = c;
	}
	/* New positions run up to the first one named without a page: the tree lost it. */
	for (done = pos; done < npages && pages[done] != KVP_PAGE_NONE;)
		done++;
	nnew = done - pos;
	if (div && !nnew) { /* nothing to hang below the divergence: no split */
		end = div;
		endm = divm;
		div = NULL;
	}

	/* Reserve every allocation the commit needs, so the commit cannot fail. */
	if (!root && nnew) {
		newroot = md_alloc(pfx, sizeof(*newroot));
		if (!newroot)
			goto nomem;
		memset(newroot, 0, sizeof(*newroot));
		newroot->n.hidx[HEAP_DEV] = newroot->n.hidx[HEAP_HOST] = NO_IDX;
		newroot->n.hash = ns_hash(pfx, ns);
		newroot->ns = ns;
	}
	if (div && split_prepare(pfx, div, divm, &sm) < 0)
		goto nomem;
	/* A leaf grows in place, unless locked (the lock's path would grow) or device pages would
	 * follow host pages it keeps. */
	if (nnew && !div && cur && !is_root(cur) && !cur->lock && !cur->nchildren &&
	    (tier == KVP_TIER_ID_HOST || cur->ndev + up == cur->npages) &&
	    (uint64_t)cur->npages + nnew <= UINT32_MAX) {
		extend = true;
		if (cur->npages + nnew > cur->cap) {
			uint64_t c = (uint64_t)cur->npages + cur->npages / 4;

			if (c < (uint64_t)cur->npages + nnew)
				c = (uint64_t)cur->npages + nnew;
			if (c > UINT32_MAX)
				c = UINT32_MAX;
			grow_cap = (uint32_t)c;
			grown = md_alloc(pfx, data_bytes(pfx, grow_cap));
			if (!grown)
				goto nomem;
		}
	} else if (nnew) {
		fresh = node_alloc(pfx, nnew);
		if (!fresh)
			goto nomem;
	}
	if (heap_reserve(pfx, pfx->npnodes + 2) < 0)
		goto nomem;

	/* Commit. */
	now = now_of(pfx);
	if (newroot) {
		root = cur = &newroot->n;
		hash_add(pfx, root);
		pfx->st.nodes++;
	}
	unmark(tp, pages, done, npages); /* past a lost position: the caller keeps them */
	/* The deepest node whose pages are existing positions, and how many of them are. */
	if (div) {
		last = split_commit(pfx, div, divm, &sm);
		endm = divm;
	} else if (end) {
		last = end;
	} else {
		last = cur;
		endm = cur ? cur->npages : 0;
	}
	dw = ndup;
	for (uint32_t p = pos, c = endm; last && !is_root(last);
	     last = last->parent, c = last->npages) {
		uint32_t s = p - c, d = last->ndev, *lp = node_pages(pfx, last);

		plan_node(last, s, c, tier, pages, &up);
		for (uint32_t k = c; k-- > 0;) {
			if (pages[s + k] == KVP_PAGE_NONE || (k >= d && k < d + up))
				continue;
			kvp_pages_move(tp, pages[s + k], KVP_PAGE_CACHED, KVP_PAGE_LEASED);
			--dw;
			if (dup_idx)
				dup_idx[dw] = s + k;
		}
		if (up) { /* host positions [d, d + up) take the inserted device pages */
			bool hd = has_dev(last), hh = has_host(last);

			kvp_pages_release(pfx->tier[KVP_TIER_ID_HOST], lp + d, up);
			memcpy(lp + d, pages + s + d, (size_t)up * sizeof(*pages));
			acct(pfx, last, false);
			last->ndev = d + up;
			acct(pfx, last, true);
			node_changed(pfx, last, hd, hh);
		}
		last->atime = now;
		heap_fix(pfx, last);
		p = s;
	}

	if (extend) {
		bool hd = has_dev(cur), hh = has_host(cur);
		uint32_t n = cur->npages;

		acct(pfx, cur, false);
		if (grown) {
			memcpy(grown, node_tokens(cur), (size_t)n * pt * sizeof(uint32_t));
			memcpy(grown + (size_t)grow_cap * pt, node_pages(pfx, cur),
			       (size_t)n * sizeof(uint32_t));
			md_free(pfx, cur->data, data_bytes(pfx, cur->cap));
			cur->data = grown;
			cur->cap = grow_cap;
		}
		memcpy(node_tokens(cur) + (size_t)n * pt, tokens + (size_t)pos * pt,
		       (size_t)nnew * pt * sizeof(uint32_t));
		memcpy(node_pages(pfx, cur) + n, pages + pos, (size_t)nnew * sizeof(*pages));
		cur->npages = n + nnew;
		if (tier == KVP_TIER_ID_DEVICE) /* all of cur is device now: upgraded above */
			cur->ndev = cur->npages;
		acct(pfx, cur, true);
		cur->atime = now;
		node_changed(pfx, cur, hd, hh);
		heap_fix(pfx, cur);
	} else if (fresh) {
		struct kvp_prefix_node *parent = div ? div->parent : cur;

		memcpy(node_tokens(fresh), tokens + (size_t)pos * pt,
		       (size_t)nnew * pt * sizeof(uint32_t));
		memcpy(node_pages(pfx, fresh), pages + pos, (size_t)nnew * sizeof(*pages));
		fresh->npages = nnew;
		fresh->ndev = tier == KVP_TIER_ID_DEVICE ? nnew : 0;
		fresh->atime = now;
		node_link(pfx, fresh, parent);
	}
	hash_grow(pfx);
	if (res) {
		res->new_pages = nup + nnew;
		res->dup_pages = ndup;
		res->done_pages = done;
	}
	return 0;

nomem:
	md_free(pfx, grown, data_bytes(pfx, grow_cap));
	node_dealloc(pfx, fresh);
	if (sm.upper) {
		md_free(pfx, sm.lower, data_bytes(pfx, div->npages - divm));
		node_dealloc(pfx, sm.upper);
	}
	md_free(pfx, newroot, sizeof(*newroot));
	unmark(tp, pages, 0, npages);
	return -ENOMEM;
}

/* ---- match, lock, unlock ---- */

int kvp_prefix_match(struct kvp_prefix *pfx, uint64_t ns, const uint32_t *tokens, uint32_t ntokens,
		     int lock, struct kvp_prefix_match *m, uint32_t *dev, uint32_t *host)
{
	struct kvp_prefix_node *cur, *end = NULL, *handle;
	uint32_t pt, want, pos = 0, endm = 0, nd = 0, nh = 0;
	bool in_host = false;
	uint64_t now;

	if (!pfx || !m)
		return -EINVAL;
	pt = pfx->pt;
	want = ntokens / pt;
	if (want && (!tokens || !dev || !host))
		return -EINVAL;
	cur = want ? root_find(pfx, ns) : NULL;
	while (cur && pos < want) {
		const uint32_t *t = tokens + (size_t)pos * pt;
		struct kvp_prefix_node *c = child_find(pfx, cur, t, page_hash(pfx, t));
		uint32_t k;

		if (!c || (in_host && c->ndev))
			break;
		k = run_match(pfx, c, t, want - pos);
		if (!in_host) {
			uint32_t d = min_u32(k, c->ndev);

			nd += d;
			if (k > d) {
				nh += k - d;
				in_host = true;
			}
		} else {
			nh += k;
		}
		pos += k;
		end = c;
		endm = k;
		if (k < c->npages)
			break;
		cur = c;
	}
	if (lock && end && endm < end->npages) {
		struct split_mem sm;

		if (heap_reserve(pfx, pfx->npnodes + 1) < 0 ||
		    split_prepare(pfx, end, endm, &sm) < 0)
			return -ENOMEM;
		end = split_commit(pfx, end, endm, &sm);
	}
	/* Fill the outputs walking up from the end of the match; touch and lock the path. */
	handle = end;
	now = now_of(pfx);
	for (uint32_t p = pos, c = endm; end && !is_root(end); end = end->parent, c = end->npages) {
		const uint32_t *lp = node_pages(pfx, end);
		uint32_t s = p - c;

		for (uint32_t k = 0; k < c; k++) {
			uint32_t at = s + k;

			if (at < nd)
				dev[at] = lp[k];
			else
				host[at - nd] = lp[k];
		}
		end->atime = now;
		if (end->hits != UINT32_MAX)
			end->hits++;
		heap_fix(pfx, end);
		if (lock)
			lock_get(pfx, end);
		p = s;
	}
	pfx->st.queried_tokens += (uint64_t)want * pt;
	pfx->st.hit_tokens += (uint64_t)pos * pt;
	m->dev_pages = nd;
	m->host_pages = nh;
	m->lock = lock && pos ? handle : NULL;
	return 0;
}

void kvp_prefix_unlock(struct kvp_prefix *pfx, struct kvp_prefix_node *lock)
{
	if (!pfx || !lock || !lock->lock || is_root(lock))
		return;
	for (struct kvp_prefix_node *n = lock; !is_root(n); n = n->parent)
		lock_put(pfx, n);
}

/* ---- eviction ---- */

/* Drops the last k pages of n, all in `tier` (n is a leaf: host pages, or device pages with no
 * host page after them). Removes n when it ends up empty. */
static void drop_tail(struct kvp_prefix *pfx, struct kvp_prefix_node *n, uint32_t k,
		      enum kvp_tier_id tier)
{
	bool hd = has_dev(n), hh = has_host(n);

	kvp_pages_release(pfx->tier[tier], node_pages(pfx, n) + n->npages - k, k);
	acct(pfx, n, false);
	n->npages -= k;
	if (tier == KVP_TIER_ID_DEVICE)
		n->ndev -= k;
	acct(pfx, n, true);
	pfx->st.evicted_pages[tier] += k;
	node_changed(pfx, n, hd, hh);
	if (!n->npages)
		node_unlink(pfx, n);
}

void kvp_prefix_set_spill(struct kvp_prefix *pfx, kvp_prefix_spill_fn fn, void *ctx)
{
	pfx->spill = fn;
	pfx->spill_ctx = ctx;
}

void kvp_prefix_set_landed(struct kvp_prefix *pfx, kvp_prefix_spill_fn fn, void *ctx)
{
	pfx->landed = fn;
	pfx->landed_ctx = ctx;
}

/* Hands n's host pages [upto - k, upto), with the path through n's first upto pages, to fn (the
 * spill or the landed hook): the segments from the root, or from the nearest node whose memo the
 * hook has filled, down to n. Nodes on the way get a memo for the hook to fill (not from
 * md_alloc: its fault injection is for the serving path's own memory; a memo that cannot be had
 * is only work again next time). Skipped when the segments cannot be gathered (out of memory):
 * both hooks are best effort. */
static void path_tail(struct kvp_prefix *pfx, struct kvp_prefix_node *n, uint32_t upto, uint32_t k,
		      kvp_prefix_spill_fn fn, void *ctx)
{
	struct kvp_prefix_node *m;
	size_t nsegs = 0, i;

	for (m = n; !is_root(m); m = m->parent) {
		nsegs++;
		if (!m->memo && !is_root(m->parent) && (m->memo = calloc(1, sizeof(*m->memo))))
			pfx->st.metadata_bytes += sizeof(*m->memo);
		if (m->memo && m->memo->ok)
			break;
	}
	if (nsegs > pfx->segs_cap) {
		struct kvp_prefix_seg *b = realloc(pfx->segs, nsegs * sizeof(*b));

		if (!b)
			return;
		pfx->segs = b;
		pfx->segs_cap = nsegs;
	}
	for (m = n, i = nsegs; i > 0; m = m->parent) {
		i--;
		pfx->segs[i] = (struct kvp_prefix_seg){ node_tokens(m), m == n ? upto : m->npages,
							is_root(m->parent), m->memo };
	}
	while (!is_root(m))
		m = m->parent;
	fn(ctx, root_ns(m), pfx->segs, (uint32_t)nsegs, node_pages(pfx, n) + upto - k, k);
}

static uint32_t evict_host(struct kvp_prefix *pfx, uint32_t want)
{
	uint32_t freed = 0;

	while (freed < want && pfx->heap[HEAP_HOST].n) {
		struct kvp_prefix_node *n = pfx->heap[HEAP_HOST].v[0];
		uint32_t k = min_u32(want - freed, n->npages - n->ndev);

		if (pfx->spill)
			path_tail(pfx, n, n->npages, k, pfx->spill, pfx->spill_ctx);
		drop_tail(pfx, n, k, KVP_TIER_ID_HOST);
		freed += k;
	}
	return freed;
}

/* n's device pages src[0 .. m) (its last device pages, in the node's array) become the host pages
 * dst[] (state `from`): device pages freed, host pages CACHED. */
static void demote_apply(struct kvp_prefix *pfx, struct kvp_prefix_node *n, uint32_t *src,
			 const uint32_t *dst, uint32_t m, enum kvp_page_state from)
{
	struct kvp_pages *hp = pfx->tier[KVP_TIER_ID_HOST];
	bool hd, hh;

	kvp_pages_release(pfx->tier[KVP_TIER_ID_DEVICE], src, m);
	for (uint32_t i = 0; i < m; i++) {
		kvp_pages_move(hp, dst[i], from, KVP_PAGE_CACHED);
		src[i] = dst[i];
	}
	hd = has_dev(n);
	hh = has_host(n);
	acct(pfx, n, false);
	n->ndev -= m;
	acct(pfx, n, true);
	pfx->st.demoted_pages += m;
	pfx->st.evicted_pages[KVP_TIER_ID_DEVICE] += m;
	node_changed(pfx, n, hd, hh);
	if (pfx->landed) /* n's pages [ndev, ndev + m) are those host pages now */
		path_tail(pfx, n, n->ndev + m, m, pfx->landed, pfx->landed_ctx);
}

void kvp_prefix_demote_done(struct kvp_prefix *pfx, struct kvp_prefix_flight *fl, int rc)
{
	uint32_t left = fl->n;

	if (fl->prev)
		fl->prev->next = fl->next;
	else
		pfx->flights = fl->next;
	if (fl->next)
		fl->next->prev = fl->prev;
	pfx->st.inflight_pages -= fl->n;
	pfx->st.moving_pages -= fl->n;
	pfx->st.flights--;
	/* The path is locked, so its pages kept their order; a split may have moved the head of
	 * them into new nodes above fl->node. Device page ids are unique: match them from the end.
	 */
	for (struct kvp_prefix_node *c = fl->node; rc >= 0 && left && !is_root(c); c = c->parent) {
		uint32_t *lp = node_pages(pfx, c), t = 0;

		while (t < left && t < c->ndev && lp[c->ndev - 1 - t] == fl->src[left - 1 - t])
			t++;
		if (t)
			demote_apply(pfx, c, lp + c->ndev - t, fl->dst + left - t, t,
				     KVP_PAGE_MOVING);
		left -= t;
	}
	if (left) /* failed (or, never, not found): those host pages were never the tree's */
		kvp_pages_release(pfx->tier[KVP_TIER_ID_HOST], fl->dst, left);
	kvp_prefix_unlock(pfx, fl->node);
	free(fl);
}

/* Starts demoting src[0 .. m) (n's last device pages) into dst[] (LEASED host pages) through
 * copy_start. Returns 1 when in flight, 0 when done now, -1 when it failed (dst freed). */
static int demote_start(struct kvp_prefix *pfx, struct kvp_prefix_node *n, uint32_t *src,
			const uint32_t *dst, uint32_t m)
{
	struct kvp_pages *hp = pfx->tier[KVP_TIER_ID_HOST];
	struct kvp_prefix_flight *fl = malloc(sizeof(*fl));
	int r;

	if (!fl) {
		kvp_pages_release(hp, dst, m);
		return -1;
	}
	fl->node = n;
	fl->n = m;
	memcpy(fl->src, src, m * sizeof(uint32_t));
	memcpy(fl->dst, dst, m * sizeof(uint32_t));
	for (uint32_t i = 0; i < m; i++)
		kvp_pages_move(hp, dst[i], KVP_PAGE_LEASED, KVP_PAGE_MOVING);
	for (struct kvp_prefix_node *x = n; !is_root(x); x = x->parent)
		lock_get(pfx, x);
	fl->prev = NULL;
	fl->next = pfx->flights;
	if (fl->next)
		fl->next->prev = fl;
	pfx->flights = fl;
	pfx->st.inflight_pages += m;
	pfx->st.moving_pages += m;
	pfx->st.flights++;
	r = pfx->conf.copy_start(pfx->conf.copy_ctx, fl->src, fl->dst, m, fl);
	if (r == 1)
		return 1;
	kvp_prefix_demote_done(pfx, fl, r < 0 ? r : 0);
	return r < 0 ? -1 : 0;
}

/* Demotes up to k of n's last device pages into host pages. Returns how many were demoted
 * (*started: still in flight, freed later): 0 when no host page can be had or the copy failed. */
static uint32_t demote(struct kvp_prefix *pfx, struct kvp_prefix_node *n, uint32_t k, bool *started)
{
	struct kvp_pages *hp = pfx->tier[KVP_TIER_ID_HOST];
	uint32_t dst[DEMOTE_BATCH], hf, m, *src;
	int r;

	*started = false;
	k = min_u32(k, DEMOTE_BATCH);
	hf = kvp_pages_count(hp, KVP_PAGE_FREE);
	if (hf < k)
		evict_host(pfx, k - hf); /* host leaves only: never n's ancestors, never n itself */
	m = min_u32(k, kvp_pages_count(hp, KVP_PAGE_FREE));
	if (!m || kvp_pages_alloc(hp, m, dst) < 0)
		return 0;
	src = node_pages(pfx, n) + n->ndev - m;
	if (pfx->conf.copy_start && !pfx->sync_only) {
		r = demote_start(pfx, n, src, dst, m);
		*started = r == 1;
		return r < 0 ? 0 : m;
	}
	if (pfx->conf.copy(pfx->conf.copy_ctx, KVP_COPY_DEMOTE, src, dst, m) < 0) {
		kvp_pages_release(hp, dst, m);
		return 0;
	}
	demote_apply(pfx, n, src, dst, m, KVP_PAGE_LEASED);
	return m;
}

static uint32_t evict_dev(struct kvp_prefix *pfx, uint32_t want)
{
	uint32_t freed = 0, started = 0;

	while (freed + started < want && pfx->heap[HEAP_DEV].n) {
		struct kvp_prefix_node *n = pfx->heap[HEAP_DEV].v[0];
		uint32_t k = min_u32(want - freed - started, n->ndev), m = 0;
		bool later = false;

		if (pfx->tier[KVP_TIER_ID_HOST])
			m = demote(pfx, n, k, &later);
		if (m) {
			if (later)
				started += m;
			else
				freed += m;
			continue;
		}
		/* Drop. Without a host tier every candidate is a device-only leaf; with one, the
		 * host eviction above found nothing below n, so n is one too, unless a copy
		 * failed: then a page with host pages below it cannot go, stop. */
		if (n->nchildren || n->ndev != n->npages)
			break;
		drop_tail(pfx, n, k, KVP_TIER_ID_DEVICE);
		freed += k;
	}
	return freed;
}

uint32_t kvp_prefix_evict(struct kvp_prefix *pfx, enum kvp_tier_id tier, uint32_t pages)
{
	if (!pfx || (unsigned)tier >= KVP_TIER_ID_MAX || !pfx->tier[tier] || !pages)
		return 0;
	return tier == KVP_TIER_ID_DEVICE ? evict_dev(pfx, pages) : evict_host(pfx, pages);
}

uint32_t kvp_prefix_evict_now(struct kvp_prefix *pfx, enum kvp_tier_id tier, uint32_t pages)
{
	uint32_t freed;

	if (!pfx)
		return 0;
	pfx->sync_only = true;
	freed = kvp_prefix_evict(pfx, tier, pages);
	pfx->sync_only = false;
	return freed;
}

uint32_t kvp_prefix_flush(struct kvp_prefix *pfx)
{
	uint32_t freed = 0;

	if (!pfx)
		return 0;
	/* Every unlocked page node goes, with its whole (unlocked) subtree. Pass 1: free pages and
	 * take the nodes out of the counters, fields kept for pass 2. */
	for (uint32_t b = 0; b < pfx->nbuckets; b++) {
		for (struct kvp_prefix_node *n = pfx->buckets[b]; n; n = n->hnext) {
			uint32_t *lp;

			if (is_root(n) || n->lock)
				continue;
			lp = node_pages(pfx, n);
			acct(pfx, n, false);
			if (n->ndev)
				kvp_pages_release(pfx->tier[KVP_TIER_ID_DEVICE], lp, n->ndev);
			if (n->npages > n->ndev)
				kvp_pages_release(pfx->tier[KVP_TIER_ID_HOST], lp + n->ndev,
						  n->npages - n->ndev);
			pfx->st.evicted_pages[KVP_TIER_ID_DEVICE] += n->ndev;
			pfx->st.evicted_pages[KVP_TIER_ID_HOST] += n->npages - n->ndev;
			freed += n->npages;
		}
	}
	/* Pass 2: survivors (locked nodes and roots) forget their dropped children. */
	for (uint32_t b = 0; b < pfx->nbuckets; b++) {
		for (struct kvp_prefix_node *n = pfx->buckets[b]; n; n = n->hnext) {
			struct kvp_prefix_node *p = n->parent;

			if (is_root(n) || n->lock || (!is_root(p) && !p->lock))
				continue;
			p->nchildren--;
			below_changed(pfx, p, -(int)has_dev(n), -(int)has_host(n));
		}
	}
	/* Pass 3: free the dropped nodes and the roots left empty. Every heap member was an
	 * unlocked node, so the heaps end up empty. */
	pfx->heap[HEAP_DEV].n = pfx->heap[HEAP_HOST].n = 0;
	for (uint32_t b = 0; b < pfx->nbuckets; b++) {
		struct kvp_prefix_node **pp = &pfx->buckets[b];

		while (*pp) {
			struct kvp_prefix_node *n = *pp;

			if (!is_root(n) && !n->lock) {
				*pp = n->hnext;
				pfx->st.nodes--;
				pfx->npnodes--;
				node_dealloc(pfx, n);
			} else {
				pp = &n->hnext;
			}
		}
	}
	for (uint32_t b = 0; b < pfx->nbuckets; b++) {
		struct kvp_prefix_node **pp = &pfx->buckets[b];

		while (*pp) {
			struct kvp_prefix_node *n = *pp;

			if (is_root(n) && !n->nchildren) {
				*pp = n->hnext;
				pfx->st.nodes--;
				node_dealloc(pfx, n);
			} else {
				pp = &n->hnext;
			}
		}
	}
	return freed;
}

/* ---- promotion ---- */

int kvp_prefix_promote(struct kvp_prefix *pfx, struct kvp_prefix_node *lock, uint32_t *dev_out,
		       uint32_t cap, uint32_t *n)
{
	struct kvp_pages *dp;
	uint64_t total = 0, nhost = 0;
	uint32_t *ids, k;
	int r;

	if (!pfx || !lock || !dev_out || !n || is_root(lock) || !lock->lock)
		return -EINVAL;
	dp = pfx->tier[KVP_TIER_ID_DEVICE];
	if (!dp)
		return -EINVAL;
	for (struct kvp_prefix_node *x = lock; !is_root(x); x = x->parent) {
		total += x->npages;
		nhost += x->npages - x->ndev;
	}
	if (total > cap)
		return -EINVAL;
	/* Host pages another lock also pins may be read by its holder right now: they stay. */
	for (struct kvp_prefix_node *x = lock; !is_root(x); x = x->parent)
		if (x->npages > x->ndev && x->lock > 1)
			return -EBUSY;
	if (nhost) {
		uint32_t nfree = kvp_pages_count(dp, KVP_PAGE_FREE);

		if (nfree + pfx->st.evictable_pages[KVP_TIER_ID_DEVICE] < nhost)
			return -ENOSPC;
		ids = KVP_FAULT_OR(KVP_FAULT_PREFIX, malloc((size_t)nhost * sizeof(*ids)));
		if (!ids)
			return -ENOMEM;
		if (nfree < nhost) { /* the path is locked: kept; the pages are needed now */
			pfx->sync_only = true;
			evict_dev(pfx, (uint32_t)(nhost - nfree));
			pfx->sync_only = false;
		}
		if (kvp_pages_alloc(dp, (uint32_t)nhost, ids) < 0) {
			free(ids);
			return -ENOSPC;
		}
		/* Copy everything first: a failed copy leaves the path as it was. */
		k = 0;
		for (struct kvp_prefix_node *x = lock; !is_root(x); x = x->parent) {
			uint32_t h = x->npages - x->ndev;

			if (!h)
				continue;
			r = pfx->conf.copy(pfx->conf.copy_ctx, KVP_COPY_PROMOTE,
					   node_pages(pfx, x) + x->ndev, ids + k, h);
			if (r < 0) {
				kvp_pages_release(dp, ids, (uint32_t)nhost);
				free(ids);
				return r;
			}
			k += h;
		}
		k = 0;
		for (struct kvp_prefix_node *x = lock; !is_root(x); x = x->parent) {
			uint32_t h = x->npages - x->ndev, *lp = node_pages(pfx, x) + x->ndev;
			bool hd = has_dev(x), hh = has_host(x);

			if (!h)
				continue;
			kvp_pages_release(pfx->tier[KVP_TIER_ID_HOST], lp, h);
			memcpy(lp, ids + k, (size_t)h * sizeof(*ids));
			for (uint32_t i = 0; i < h; i++)
				kvp_pages_move(dp, lp[i], KVP_PAGE_LEASED, KVP_PAGE_CACHED);
			acct(pfx, x, false);
			x->ndev = x->npages;
			acct(pfx, x, true);
			node_changed(pfx, x, hd, hh);
			k += h;
		}
		free(ids);
		pfx->st.promoted_pages += nhost;
	}
	k = (uint32_t)total;
	for (struct kvp_prefix_node *x = lock; !is_root(x); x = x->parent) {
		k -= x->npages;
		memcpy(dev_out + k, node_pages(pfx, x), (size_t)x->npages * sizeof(*dev_out));
	}
	*n = (uint32_t)total;
	return 0;
}

/* ---- stats, top ---- */

void kvp_prefix_stats(const struct kvp_prefix *pfx, struct kvp_prefix_stats *st)
{
	if (!st)
		return;
	if (!pfx) {
		memset(st, 0, sizeof(*st));
		return;
	}
	*st = pfx->st;
}

static uint32_t path_tokens(const struct kvp_prefix *pfx, const struct kvp_prefix_node *n,
			    uint64_t *ns)
{
	uint64_t pages = 0;

	for (; !is_root(n); n = n->parent)
		pages += n->npages;
	*ns = root_ns(n);
	pages *= pfx->pt;
	return pages > UINT32_MAX ? UINT32_MAX : (uint32_t)pages;
}

int kvp_prefix_walk(const struct kvp_prefix *pfx,
		    int (*fn)(void *ctx, const struct kvp_prefix_entry *e), void *ctx)
{
	int r = 0;

	for (uint32_t b = 0; b < pfx->nbuckets && !r; b++) {
		for (const struct kvp_prefix_node *n = pfx->buckets[b]; n && !r; n = n->hnext) {
			struct kvp_prefix_entry e = { 0 };
			const struct kvp_prefix_node *a;
			uint64_t pages = 0;

			if (is_root(n) || !n->npages)
				continue;
			for (a = n; !is_root(a); a = a->parent)
				pages += a->npages;
			e.ns = root_ns(a);
			e.node = n;
			e.path_pages = (uint32_t)pages;
			e.start = (uint32_t)pages - n->npages;
			e.ndev = n->ndev;
			e.pages = node_pages(pfx, n);
			e.hits = n->hits;
			r = fn(ctx, &e);
		}
	}
	return r;
}

void kvp_prefix_entry_tokens(const struct kvp_prefix *pfx, const struct kvp_prefix_entry *e,
			     void *dst)
{
	size_t off = (size_t)e->path_pages * pfx->pt * sizeof(uint32_t);

	for (const struct kvp_prefix_node *a = e->node; !is_root(a); a = a->parent) {
		size_t n = (size_t)a->npages * pfx->pt * sizeof(uint32_t);

		off -= n;
		memcpy((uint8_t *)dst + off, node_tokens(a), n);
	}
}

int kvp_prefix_lock_path(const struct kvp_prefix *pfx, const struct kvp_prefix_node *lock,
			 uint64_t *ns, uint32_t **tokens, uint32_t *npages)
{
	const struct kvp_prefix_node *a;
	uint64_t pages = 0;
	size_t off;
	uint32_t *t;

	if (!pfx || !lock || !ns || !tokens || !npages)
		return -EINVAL;
	for (a = lock; !is_root(a); a = a->parent)
		pages += a->npages;
	t = malloc(pages * pfx->pt * sizeof(*t) + sizeof(*t));
	if (!t)
		return -ENOMEM;
	off = pages * pfx->pt;
	for (a = lock; !is_root(a); a = a->parent) {
		off -= (size_t)a->npages * pfx->pt;
		memcpy(t + off, node_tokens(a), (size_t)a->npages * pfx->pt * sizeof(*t));
	}
	*ns = root_ns(a);
	*tokens = t;
	*npages = (uint32_t)pages;
	return 0;
}

int kvp_prefix_set_hits(struct kvp_prefix *pfx, uint64_t ns, const uint32_t *tokens,
			uint32_t npages, uint32_t hits)
{
	struct kvp_prefix_node *n = root_find(pfx, ns);
	uint32_t pos = 0, pt = pfx->pt;

	while (n && pos < npages) {
		const uint32_t *t = tokens + (size_t)pos * pt;
		struct kvp_prefix_node *c = child_find(pfx, n, t, page_hash(pfx, t));
		uint32_t k;

		if (!c)
			return -ENOENT;
		k = run_match(pfx, c, t, npages - pos);
		if (k < c->npages && pos + k < npages)
			return -ENOENT;
		pos += k;
		n = c;
	}
	if (!n || pos != npages || is_root(n))
		return -ENOENT;
	if (n->hits < hits) {
		n->hits = hits;
		heap_fix(pfx, n);
	}
	return 0;
}

/* Order for top: more hits first, then shorter, then lower namespace. */
static bool top_before(const struct kvp_prefix_top *a, const struct kvp_prefix_top *b)
{
	if (a->hits != b->hits)
		return a->hits > b->hits;
	if (a->tokens != b->tokens)
		return a->tokens < b->tokens;
	return a->ns < b->ns;
}

static int top_cmp(const void *x, const void *y)
{
	const struct kvp_prefix_top *a = x, *b = y;

	return top_before(a, b) ? -1 : top_before(b, a) ? 1 : 0;
}

/* out[0 .. len) is a heap whose root is the entry that sorts last. */
static void top_down(struct kvp_prefix_top *out, uint32_t len, uint32_t i)
{
	for (;;) {
		uint32_t c = 2 * i + 1;
		struct kvp_prefix_top t;

		if (c >= len)
			return;
		if (c + 1 < len && top_before(&out[c], &out[c + 1]))
			c++;
		if (!top_before(&out[i], &out[c]))
			return;
		t = out[i];
		out[i] = out[c];
		out[c] = t;
		i = c;
	}
}

uint32_t kvp_prefix_top(const struct kvp_prefix *pfx, struct kvp_prefix_top *out, uint32_t cap)
{
	uint32_t len = 0;

	if (!pfx || !out || !cap)
		return 0;
	for (uint32_t b = 0; b < pfx->nbuckets; b++) {
		for (const struct kvp_prefix_node *n = pfx->buckets[b]; n; n = n->hnext) {
			struct kvp_prefix_top e;

			if (is_root(n))
				continue;
			if (len == cap && out[0].hits > n->hits)
				continue;
			e.hits = n->hits;
			e.tokens = path_tokens(pfx, n, &e.ns);
			if (len < cap) {
				uint32_t i = len++;

				out[i] = e;
				while (i > 0 && top_before(&out[(i - 1) / 2], &out[i])) {
					struct kvp_prefix_top t = out[i];

					out[i] = out[(i - 1) / 2];
					out[(i - 1) / 2] = t;
					i = (i - 1) / 2;
				}
			} else if (top_before(&e, &out[0])) {
				out[0] = e;
				top_down(out, len, 0);
			}
		}
	}
	qsort(out, len, sizeof(*out), top_cmp);
	return len;
}

/* ---- consistency check ---- */

static int ptr_cmp(const void *x, const void *y)
{
	uintptr_t a = (uintptr_t) * (struct kvp_prefix_node *const *)x;
	uintptr_t b = (uintptr_t) * (struct kvp_prefix_node *const *)y;

	return a < b ? -1 : a > b;
}

static int64_t node_index(struct kvp_prefix_node **sorted, uint64_t n,
			  const struct kvp_prefix_node *x)
{
	struct kvp_prefix_node **f = bsearch(&x, sorted, n, sizeof(*sorted), ptr_cmp);

	return f ? f - sorted : -1;
}

struct check_sums {
	uint32_t children, dev_below, host_below;
	uint64_t child_locks;
};

static int check_nodes(const struct kvp_prefix *pfx, struct kvp_prefix_node **all, uint64_t cnt,
		       struct check_sums *sum, uint8_t *seen[KVP_TIER_ID_MAX])
{
	uint64_t npn = 0, md = sizeof(*pfx) + (uint64_t)pfx->nbuckets * sizeof(*pfx->buckets);

	for (int hid = 0; hid < HEAP_MAX; hid++)
		md += (uint64_t)pfx->heap[hid].cap * sizeof(*pfx->heap[hid].v);
	for (uint64_t i = 0; i < cnt; i++) {
		const struct kvp_prefix_node *n = all[i], *x = n;
		const uint32_t *lp;
		uint64_t depth = 0;
		int64_t pi;

		if (is_root(n)) {
			md += sizeof(struct ns_root);
			if (n->npages || n->data || n->lock ||
			    n->hash != ns_hash(pfx, root_ns(n)) || root_find(pfx, root_ns(n)) != n)
				return -EFAULT;
			continue;
		}
		md += sizeof(*n) + data_bytes(pfx, n->cap) + (n->memo ? sizeof(*n->memo) : 0);
		npn++;
		if (!n->npages || (n->memo && is_root(n->parent)) || n->ndev > n->npages ||
		    n->npages > n->cap || n->hash != page_hash(pfx, node_tokens(n)))
			return -EFAULT;
		pi = node_index(all, cnt, n->parent);
		if (pi < 0 || child_find(pfx, n->parent, node_tokens(n), n->hash) != n)
			return -EFAULT;
		while (!is_root(x) && ++depth <= cnt)
			x = x->parent;
		if (!is_root(x))
			return -EFAULT;
		sum[pi].children++;
		sum[pi].dev_below += has_dev(n);
		sum[pi].host_below += has_host(n);
		sum[pi].child_locks += n->lock;
		lp = node_pages(pfx, n);
		for (uint32_t k = 0; k < n->npages; k++) {
			int t = k < n->ndev ? KVP_TIER_ID_DEVICE : KVP_TIER_ID_HOST;
			struct kvp_pages *tp = pfx->tier[t];

			if (!tp || lp[k] >= kvp_pages_total(tp) || seen[t][lp[k]] ||
			    kvp_pages_state(tp, lp[k]) != KVP_PAGE_CACHED)
				return -EFAULT;
			seen[t][lp[k]] = 1;
		}
	}
	if (npn != pfx->npnodes || md != pfx->st.metadata_bytes)
		return -EFAULT;
	return 0;
}

int kvp_prefix_check(const struct kvp_prefix *pfx)
{
	const uint64_t none[KVP_TIER_ID_MAX] = { 0, 0 };

	return kvp_prefix_check_shared(pfx, none);
}

int kvp_prefix_check_shared(const struct kvp_prefix *pfx, const uint64_t others[KVP_TIER_ID_MAX])
{
	struct kvp_prefix scratch;
	struct kvp_prefix_node **all = NULL;
	struct check_sums *sum = NULL;
	uint8_t *seen[KVP_TIER_ID_MAX] = { NULL, NULL };
	uint64_t cnt = 0;
	int r = -ENOMEM;

	if (!pfx)
		return -EFAULT;
	all = malloc((pfx->st.nodes + 1) * sizeof(*all));
	sum = calloc(pfx->st.nodes + 1, sizeof(*sum));
	for (int t = 0; t < KVP_TIER_ID_MAX; t++)
		if (pfx->tier[t] && !(seen[t] = calloc(kvp_pages_total(pfx->tier[t]), 1)))
			goto out;
	if (!all || !sum)
		goto out;
	r = -EFAULT;
	for (uint32_t b = 0; b < pfx->nbuckets; b++) {
		for (struct kvp_prefix_node *n = pfx->buckets[b]; n; n = n->hnext) {
			if (cnt == pfx->st.nodes || bucket_of(pfx, n->parent, n->hash) != b)
				goto out;
			all[cnt++] = n;
		}
	}
	if (cnt != pfx->st.nodes)
		goto out;
	qsort(all, cnt, sizeof(*all), ptr_cmp);
	if (check_nodes(pfx, all, cnt, sum, seen) < 0)
		goto out;
	/* Counters: recomputed from the nodes. */
	memset(&scratch, 0, sizeof(scratch));
	for (uint64_t i = 0; i < cnt; i++) {
		const struct kvp_prefix_node *n = all[i];

		if (n->nchildren != sum[i].children || n->dev_below != sum[i].dev_below ||
		    n->host_below != sum[i].host_below)
			goto out;
		/* lock = locks ending here + locks of the children; roots hold none */
		if (!is_root(n) && n->lock < sum[i].child_locks)
			goto out;
		if (is_root(n)) {
			if (!n->nchildren)
				goto out;
			continue;
		}
		acct(&scratch, n, true);
		for (int hid = 0; hid < HEAP_MAX; hid++) {
			bool want = hid == HEAP_DEV ? dev_candidate(n) : host_candidate(n);
			const struct heap *h = &pfx->heap[hid];
			uint32_t at = n->hidx[hid];

			if (want != (at != NO_IDX) || (want && (at >= h->n || h->v[at] != n)))
				goto out;
		}
	}
	for (int t = 0; t < KVP_TIER_ID_MAX; t++) {
		if (scratch.st.cached_pages[t] != pfx->st.cached_pages[t] ||
		    scratch.st.evictable_pages[t] != pfx->st.evictable_pages[t] ||
		    scratch.st.protected_pages[t] != pfx->st.protected_pages[t])
			goto out;
		if (pfx->tier[t] && kvp_pages_count(pfx->tier[t], KVP_PAGE_CACHED) !=
					    pfx->st.cached_pages[t] + others[t])
			goto out;
		/* only demotion flights hold MOVING pages, host ones */
		if (pfx->tier[t] && kvp_pages_count(pfx->tier[t], KVP_PAGE_MOVING) !=
					    (t == KVP_TIER_ID_HOST ? pfx->st.moving_pages : 0))
			goto out;
		if (!pfx->tier[t] && pfx->st.cached_pages[t])
			goto out;
	}
	for (int hid = 0; hid < HEAP_MAX; hid++) {
		const struct heap *h = &pfx->heap[hid];

		if (h->cap < pfx->npnodes || h->n > h->cap)
			goto out;
		for (uint32_t i = 1; i < h->n; i++)
			if (colder(pfx, h->v[i], h->v[(i - 1) / 2]))
				goto out;
	}
	r = 0;
out:
	free(all);
	free(sum);
	for (int t = 0; t < KVP_TIER_ID_MAX; t++)
		free(seen[t]);
	return r;
}
