/* index.c - the one index of a pool's cached pages (index.h).
 *
 * Layout. Entries live in one array and name each other by 32-bit index: a chain hash table
 * (buckets[] heads, entry.hnext links), the parent (the page before it in the chain it was
 * inserted with), and the links of the eviction lists. A key page's table hash is a seeded hash
 * of (namespace, key bytes); a token page's is chained: a seeded hash of (namespace, the parent
 * page's table hash, the page's tokens), so a query's hashes are known before any lookup and its
 * lookups can be batched; a token lookup then compares the namespace, the parent link and the
 * stored tokens, so it is exact whatever the hashes do. Key bytes sit in four slabs by size class
 * (16, 32, 48, 64 bytes), a token page's key and tokens in a fifth slab of 32 + 4 * page_tokens
 * bytes, named by a slot index. An entry is 48 bytes; with its share of the table (2 .. 4 bytes)
 * a cached page costs at most 52 bytes of metadata plus its slab slot (arrays grow by a sixteenth).
 * Namespaces are small records in their own open-addressing map (ns -> record with an entry count),
 * so an entry carries a 32-bit namespace index.
 *
 * Eviction. Doubly linked lists of candidates, appended when an entry becomes one:
 *  - device: unlocked device entries that no device entry names as parent;
 *  - host: unlocked host entries that no entry names as parent (leaves).
 * LRU keeps one list per tier; LFU one per tier and power-of-two class of hits (0, 1, 2-3, 4-7,
 * .., 64 and up), taken from the lowest class up. A match moves the leaves it reads to their
 * list's tail (only leaves are listed, so a match of a long chain moves one entry or a few); a
 * parent whose last child leaves the tier goes to the head (it was used no later than that
 * child, the coldest candidate). A host entry that a device entry names as parent is stuck until
 * its device children are gone: it counts neither evictable nor protected.
 *
 * Write-back holds (kvp_index_hold): a host entry a disk write reads in place carries a held bit
 * and a record in a small table; it stays where it is in the lists. Whatever takes its page
 * away (eviction, flush, promotion, upgrade) turns the record's page MOVING instead of freeing
 * it; kvp_index_unhold frees it then. A page whose write landed carries a written bit, so the
 * next walks pass it by without asking.
 *
 * Complexity: insert, match, exists O(pages) expected (a chain inserted in one call sits in
 * consecutive entries and is followed without hashing; elsewhere one hash and one compare per
 * page, lookups batched with prefetches); unlock O(pages); evict O(pages freed);
 * flush, check O(entries). */
#include "index.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "fault.h"
#include "mix.h"

#define NONE UINT32_MAX
#define NCLASS 4u    /* key slabs */
#define TSLAB NCLASS /* the token pages' slab */
#define NSLAB (NCLASS + 1u)
#define CLASS_BYTES 16u
#define BATCH 32u
#define NLFU 8u /* LFU classes */
#define HITS_MAX ((1u << 19) - 1)
#define HOLD_PASS 16u /* kvp_index_hold passes by at most this many pages per question */

enum { LIST_NONE = 0, LIST_DEV, LIST_HOST, LIST_FREE };

struct kc_entry {
	uint32_t hash;	     /* of (namespace, key) */
	uint32_t ns;	     /* namespace record index */
	uint32_t parent;     /* entry index, NONE for a chain's first key */
	uint32_t page;	     /* page id in its tier */
	uint32_t hnext;	     /* hash chain; next free entry when unused */
	uint32_t prev, next; /* LRU list of its tier's candidates */
	uint32_t nchild;     /* entries naming this one as parent */
	uint32_t ndchild;    /* of those, device-resident and not being demoted */
	uint32_t lock;	     /* locks pinning it */
	uint32_t key;	     /* slot in the slab of its size class */
	uint32_t hits : 19;  /* saturating */
	uint32_t tok : 1;    /* a token page (its slot in the token slab) */
	uint32_t tier : 1;
	uint32_t list : 2;
	uint32_t klen1 : 6;   /* key length - 1 */
	uint32_t flying : 1;  /* its demotion is in flight (a flight's idx[] names it) */
	uint32_t held : 1;    /* a host page a write-back reads (a hold names it) */
	uint32_t written : 1; /* a write-back wrote this page (its walk passes it by) */
};
_Static_assert(sizeof(struct kc_entry) == 48, "a cached page's entry is 48 bytes");

struct kvp_index_lock {
	uint32_t n;
	uint32_t idx[];
};

/* A demotion in flight: entries idx[] (each locked by the flight) from device pages src[] to the
 * MOVING host pages dst[]. */
struct kvp_index_flight {
	struct kvp_index_flight *prev, *next;
	uint32_t n;
	uint32_t *idx, *src, *dst;
	uint32_t v[]; /* the three arrays */
};

/* A write-back's hold of entry idx's host page; gone: the entry left the host tier meanwhile and
 * the page, MOVING, is freed when the hold ends. */
struct kc_hold {
	uint32_t idx, page;
	uint8_t used, gone;
};

struct slab {
	uint8_t *mem;
	uint32_t cap, hw, free_head, nfree;
};

struct ns_rec {
	uint64_t ns;
	uint32_t count; /* entries */
	uint32_t used;	/* a live record (else on the free list, count = next free) */
};

struct list {
	uint32_t head, tail;
};

struct kvp_index {
	struct kvp_index_conf conf;
	struct kvp_pages *tier[KVP_TIER_ID_MAX];
	struct kc_entry *ent;
	uint32_t ent_cap, ent_hw, free_head, nfree;
	uint32_t *buckets;
	uint32_t nbuckets; /* power of two */
	struct slab slab[NSLAB];
	size_t tbytes;	    /* a token page's tokens: 4 * page_tokens */
	uint32_t hash_mask; /* of the table hashes: all bits, or none (conf.collide) */
	struct ns_rec *nsr; /* records */
	uint32_t nsr_cap, nsr_hw, nsr_free;
	uint32_t *nsmap; /* open addressing: record index + 1, 0 empty */
	uint32_t nsmap_cap;
	uint64_t seed;
	kvp_index_spill_fn spill; /* host pages evicted (kvp_index_set_spill) */
	void *spill_ctx;
	kvp_index_spill_fn landed; /* device pages demoted to host (kvp_index_set_landed) */
	void *landed_ctx;
	kvp_index_observe_fn observe; /* every change (kvp_index_set_observer) */
	void *observe_ctx;
	struct list lru[3][NLFU];	  /* [LIST_DEV or LIST_HOST][class] */
	struct kvp_index_flight *flights; /* in flight, newest first */
	struct kc_hold *holds;		  /* write-back holds (kvp_index_hold) */
	uint32_t nholds, holds_cap, holds_gone;
	uint32_t hold_cursor; /* where kvp_index_hold's walk of every entry goes on */
	struct kvp_index_stats st;
};

/* ---- helpers ---- */

/* Seeded: keys come from clients, who must not be able to build long chains. */
static uint32_t key_hash(const struct kvp_index *kc, uint64_t ns, const uint8_t *k, size_t len)
{
	uint64_t h = kc->seed ^ (ns * 0x9e3779b97f4a7c15ULL) ^ len;
	size_t i = 0;

	for (; i + 8 <= len; i += 8) {
		uint64_t v;

		memcpy(&v, k + i, 8);
		h = (h ^ (v * 0x87c37b91114253d5ULL)) * 0x4cf5ad432745937fULL;
		h ^= h >> 29;
	}
	if (i < len) {
		uint64_t v = 0;

		memcpy(&v, k + i, len - i);
		h = (h ^ (v * 0x87c37b91114253d5ULL)) * 0x4cf5ad432745937fULL;
	}
	return (uint32_t)kvp_mix64(h) & kc->hash_mask;
}

static inline uint32_t class_of(size_t len)
{
	return (uint32_t)((len - 1) / CLASS_BYTES);
}

static inline size_t slab_sz(const struct kvp_index *kc, uint32_t c)
{
	return c == TSLAB ? KVP_PAGE_KEY_BYTES + kc->tbytes : (size_t)(c + 1) * CLASS_BYTES;
}

static inline uint32_t slab_of(const struct kc_entry *e)
{
	return e->tok ? TSLAB : class_of(e->klen1 + 1u);
}

static inline uint8_t *key_at(const struct kvp_index *kc, const struct kc_entry *e)
{
	uint32_t c = slab_of(e);

	return kc->slab[c].mem + (size_t)e->key * slab_sz(kc, c);
}

/* A token page's tokens (after its key in the slot). */
static inline const uint8_t *tokens_at(const struct kvp_index *kc, const struct kc_entry *e)
{
	return key_at(kc, e) + KVP_PAGE_KEY_BYTES;
}

/* A token page's table hash: chained through its parent's (0 for a chain's first page). */
static uint32_t tok_hash(const struct kvp_index *kc, uint64_t ns, uint32_t parent_hash,
			 const uint32_t *t)
{
	uint64_t h = kc->seed ^ (ns * 0x9e3779b97f4a7c15ULL) ^ ((uint64_t)parent_hash << 17) ^
		     0x746f6b656e73ULL;
	uint32_t n = kc->conf.page_tokens, i = 0;

	for (; i + 2 <= n; i += 2) {
		uint64_t v = t[i] | (uint64_t)t[i + 1] << 32;

		h = (h ^ (v * 0x87c37b91114253d5ULL)) * 0x4cf5ad432745937fULL;
		h ^= h >> 29;
	}
	if (i < n)
		h = (h ^ (t[i] * 0x87c37b91114253d5ULL)) * 0x4cf5ad432745937fULL;
	return (uint32_t)kvp_mix64(h) & kc->hash_mask;
}

static inline bool key_ok(const struct kvp_key *k)
{
	return k->len >= 1 && k->len <= KVP_KEY_MAX && k->data;
}

static void *md_realloc(struct kvp_index *kc, void *p, size_t old, size_t sz, uint64_t *count)
{
	void *q = KVP_FAULT_OR(KVP_FAULT_PREFIX, realloc(p, sz));

	if (q)
		*count += sz - old;
	(void)kc;
	return q;
}

/* ---- namespaces ---- */

static inline uint32_t ns_slot0(const struct kvp_index *kc, uint64_t ns)
{
	return (uint32_t)kvp_mix64(ns ^ kc->seed) & (kc->nsmap_cap - 1);
}

/* Record index of ns, or NONE. */
static uint32_t ns_find(const struct kvp_index *kc, uint64_t ns)
{
	if (!kc->nsmap_cap)
		return NONE;
	for (uint32_t i = ns_slot0(kc, ns);; i = (i + 1) & (kc->nsmap_cap - 1)) {
		uint32_t r = kc->nsmap[i];

		if (!r)
			return NONE;
		if (kc->nsr[r - 1].ns == ns)
			return r - 1;
	}
}

static void nsmap_put(struct kvp_index *kc, uint32_t rec)
{
	uint32_t i = ns_slot0(kc, kc->nsr[rec].ns);

	while (kc->nsmap[i])
		i = (i + 1) & (kc->nsmap_cap - 1);
	kc->nsmap[i] = rec + 1;
}

/* Room for one more namespace (map at most half full, one free record). 0 or -ENOMEM. */
static int ns_reserve(struct kvp_index *kc)
{
	if (kc->nsr_free == NONE && kc->nsr_hw == kc->nsr_cap) {
		uint32_t cap = kc->nsr_cap ? kc->nsr_cap * 2 : 8;
		struct ns_rec *r = md_realloc(kc, kc->nsr, (size_t)kc->nsr_cap * sizeof(*r),
					      (size_t)cap * sizeof(*r), &kc->st.metadata_bytes);

		if (!r)
			return -ENOMEM;
		kc->nsr = r;
		kc->nsr_cap = cap;
	}
	if ((kc->st.namespaces + 1) * 2 > kc->nsmap_cap) {
		uint32_t cap = kc->nsmap_cap ? kc->nsmap_cap * 2 : 16, *old = kc->nsmap;
		uint32_t oldcap = kc->nsmap_cap;
		uint32_t *m = KVP_FAULT_OR(KVP_FAULT_PREFIX, calloc(cap, sizeof(*m)));

		if (!m)
			return -ENOMEM;
		kc->st.metadata_bytes += (uint64_t)cap * sizeof(*m);
		kc->nsmap = m;
		kc->nsmap_cap = cap;
		for (uint32_t i = 0; i < oldcap; i++)
			if (old[i])
				nsmap_put(kc, old[i] - 1);
		free(old);
		kc->st.metadata_bytes -= (uint64_t)oldcap * sizeof(*old);
	}
	return 0;
}

/* The record of ns, made when missing (ns_reserve called first). */
static uint32_t ns_get(struct kvp_index *kc, uint64_t ns)
{
	uint32_t r = ns_find(kc, ns);

	if (r != NONE)
		return r;
	if (kc->nsr_free != NONE) {
		r = kc->nsr_free;
		kc->nsr_free = kc->nsr[r].count;
	} else {
		r = kc->nsr_hw++;
	}
	kc->nsr[r] = (struct ns_rec){ ns, 0, 1 };
	nsmap_put(kc, r);
	kc->st.namespaces++;
	return r;
}

/* Drops ns record r (count 0): backward-shift deletion keeps probe runs unbroken. */
static void ns_drop(struct kvp_index *kc, uint32_t r)
{
	uint32_t mask = kc->nsmap_cap - 1, i = ns_slot0(kc, kc->nsr[r].ns);

	while (kc->nsmap[i] != r + 1)
		i = (i + 1) & mask;
	for (uint32_t j = (i + 1) & mask; kc->nsmap[j]; j = (j + 1) & mask) {
		uint32_t home = ns_slot0(kc, kc->nsr[kc->nsmap[j] - 1].ns);

		/* j's entry may move to i when its home is not in (i, j] cyclically */
		if (((j - home) & mask) >= ((j - i) & mask)) {
			kc->nsmap[i] = kc->nsmap[j];
			i = j;
		}
	}
	kc->nsmap[i] = 0;
	kc->nsr[r].used = 0;
	kc->nsr[r].count = kc->nsr_free;
	kc->nsr_free = r;
	kc->st.namespaces--;
}

int kvp_index_has_ns(const struct kvp_index *kc, uint64_t ns)
{
	return kc && ns_find(kc, ns) != NONE;
}

/* ---- lists, counters ---- */

static inline int want_list(const struct kvp_index *kc, const struct kc_entry *e)
{
	(void)kc;
	if (e->lock)
		return LIST_NONE;
	if (e->tier == KVP_TIER_ID_DEVICE)
		return e->ndchild ? LIST_NONE : LIST_DEV;
	return e->nchild ? LIST_NONE : LIST_HOST;
}

/* The eviction class of e: 0 under LRU, its power-of-two class of hits under LFU. */
static inline uint32_t cls_of(const struct kvp_index *kc, const struct kc_entry *e)
{
	uint32_t c;

	if (kc->conf.policy != KVP_EVICT_POLICY_LFU)
		return 0;
	c = e->hits ? 32u - (uint32_t)__builtin_clz(e->hits) : 0;
	return c < NLFU ? c : NLFU - 1;
}

static void list_del(struct kvp_index *kc, uint32_t i)
{
	struct kc_entry *e = &kc->ent[i];
	struct list *l = &kc->lru[e->list][cls_of(kc, e)];

	if (e->prev != NONE)
		kc->ent[e->prev].next = e->next;
	else
		l->head = e->next;
	if (e->next != NONE)
		kc->ent[e->next].prev = e->prev;
	else
		l->tail = e->prev;
	e->prev = e->next = NONE;
	e->list = LIST_NONE;
}

/* Links entry i into list `which` (its class's) at the tail (most recent) or at the head. */
static void list_put(struct kvp_index *kc, uint32_t i, int which, bool head)
{
	struct kc_entry *e = &kc->ent[i];
	struct list *l = &kc->lru[which][cls_of(kc, e)];
	uint32_t *end = head ? &l->head : &l->tail, *other = head ? &l->tail : &l->head;
	uint32_t old = *end;

	e->list = (uint32_t)which;
	e->prev = head ? NONE : old;
	e->next = head ? old : NONE;
	if (old == NONE)
		*other = i;
	else if (head)
		kc->ent[old].prev = i;
	else
		kc->ent[old].next = i;
	*end = i;
}

static void list_add(struct kvp_index *kc, uint32_t i, int which)
{
	list_put(kc, i, which, false);
}

/* Puts entry i on the list its state asks for: at the tail (most recent), or at the head for a
 * parent whose last child just left the tier (it was used no later than that child, the
 * coldest candidate). */
static void refresh_at(struct kvp_index *kc, uint32_t i, bool head)
{
	int w = want_list(kc, &kc->ent[i]);

	if ((int)kc->ent[i].list == w)
		return;
	if (kc->ent[i].list != LIST_NONE)
		list_del(kc, i);
	if (w != LIST_NONE && head)
		list_put(kc, i, w, true);
	else if (w != LIST_NONE)
		list_add(kc, i, w);
}

static void refresh(struct kvp_index *kc, uint32_t i)
{
	refresh_at(kc, i, false);
}

/* Sets entry i's hits (saturating); under LFU a listed entry whose class changes goes to its new
 * class's tail. */
static void hits_set(struct kvp_index *kc, uint32_t i, uint32_t hits)
{
	struct kc_entry *e = &kc->ent[i];
	int l = (int)e->list;

	hits = hits > HITS_MAX ? HITS_MAX : hits;
	if (kc->conf.policy == KVP_EVICT_POLICY_LFU && (l == LIST_DEV || l == LIST_HOST)) {
		struct kc_entry t = *e;

		t.hits = hits;
		if (cls_of(kc, &t) != cls_of(kc, e)) {
			list_del(kc, i);
			e->hits = hits;
			list_add(kc, i, l);
			return;
		}
	}
	e->hits = hits;
}

/* A host entry that a device entry names as parent is stuck: it can go only once its device
 * children are gone, so it counts neither evictable nor protected (cached may exceed evictable +
 * protected). */
static inline bool stuck(const struct kc_entry *e)
{
	return e->tier == KVP_TIER_ID_HOST && e->ndchild;
}

static void acct(struct kvp_index *kc, const struct kc_entry *e, int d)
{
	kc->st.cached_pages[e->tier] += (uint64_t)(int64_t)d;
	if (e->lock)
		kc->st.protected_pages[e->tier] += (uint64_t)(int64_t)d;
	else if (!stuck(e))
		kc->st.evictable_pages[e->tier] += (uint64_t)(int64_t)d;
}

/* Entry i's count of device children changes by d (its books follow). */
static void nd_add(struct kvp_index *kc, uint32_t i, int d)
{
	acct(kc, &kc->ent[i], -1);
	kc->ent[i].ndchild += (uint32_t)d;
	acct(kc, &kc->ent[i], 1);
}

/* ---- table ---- */

uint64_t kvp_index_seed(const struct kvp_index *kc)
{
	return kc ? kc->seed : 0;
}

static inline uint32_t bucket_of(const struct kvp_index *kc, uint32_t hash)
{
	return hash & (kc->nbuckets - 1);
}

/* Whether n bytes at a (a slab slot) equal those at b: equality only, 8 bytes a step (the
 * compiler's loads, no library call for a page's few dozen bytes). */
static inline bool same_bytes(const uint8_t *a, const void *b, size_t n)
{
	const uint8_t *c = b;
	uint64_t d = 0;
	size_t i = 0;

	for (; i + 8 <= n; i += 8) {
		uint64_t x, y;

		memcpy(&x, a + i, 8);
		memcpy(&y, c + i, 8);
		d |= x ^ y;
	}
	for (; i < n; i++)
		d |= (uint64_t)(a[i] ^ c[i]);
	return !d;
}

static uint32_t find(const struct kvp_index *kc, uint32_t ns, uint32_t h, const struct kvp_key *k)
{
	for (uint32_t i = kc->buckets[bucket_of(kc, h)]; i != NONE; i = kc->ent[i].hnext) {
		const struct kc_entry *e = &kc->ent[i];

		if (e->hash == h && e->ns == ns && !e->tok && e->klen1 + 1u == k->len &&
		    same_bytes(key_at(kc, e), k->data, k->len))
			return i;
	}
	return NONE;
}

/* Whether entry e is the token page (namespace record ns, parent, tokens t). */
static inline bool tok_is(const struct kvp_index *kc, const struct kc_entry *e, uint32_t ns,
			  uint32_t h, uint32_t parent, const uint32_t *t)
{
	return e->hash == h && e->tok && e->ns == ns && e->parent == parent &&
	       same_bytes(tokens_at(kc, e), t, kc->tbytes);
}

static uint32_t find_tok(const struct kvp_index *kc, uint32_t ns, uint32_t h, uint32_t parent,
			 const uint32_t *t)
{
	for (uint32_t i = kc->buckets[bucket_of(kc, h)]; i != NONE; i = kc->ent[i].hnext)
		if (tok_is(kc, &kc->ent[i], ns, h, parent, t))
			return i;
	return NONE;
}

/* Doubles the table while it holds more than two entries a bucket (lookups mostly follow a
 * chain's consecutive entries without it). Failure lengthens chains only. */
static void table_grow(struct kvp_index *kc)
{
	while (kc->st.entries > 2ull * kc->nbuckets && kc->nbuckets < (1u << 31)) {
		uint32_t nb = kc->nbuckets * 2;
		uint32_t *b = KVP_FAULT_OR(KVP_FAULT_PREFIX, malloc((size_t)nb * sizeof(*b)));

		if (!b)
			return;
		memset(b, 0xff, (size_t)nb * sizeof(*b));
		for (uint32_t i = 0; i < kc->ent_hw; i++) {
			struct kc_entry *e = &kc->ent[i];

			if (e->list == LIST_FREE)
				continue;
			e->hnext = b[e->hash & (nb - 1)];
			b[e->hash & (nb - 1)] = i;
		}
		free(kc->buckets);
		kc->st.metadata_bytes += (uint64_t)(nb - kc->nbuckets) * sizeof(*b);
		kc->buckets = b;
		kc->nbuckets = nb;
	}
}

static void table_del(struct kvp_index *kc, uint32_t i)
{
	uint32_t *pp = &kc->buckets[bucket_of(kc, kc->ent[i].hash)];

	while (*pp != i)
		pp = &kc->ent[*pp].hnext;
	*pp = kc->ent[i].hnext;
}

/* The next capacity of an array of entries or slab slots: doubling while small, then by an
 * sixteenth (large blocks are mmapped, and realloc moves them with mremap(2), not by copying), so
 * spare capacity stays a small part of the metadata per page. */
static uint64_t grown(uint64_t cap)
{
	if (cap < 64)
		return 64;
	return cap < (1u << 16) ? cap * 2 : cap + cap / 16;
}

/* Room for `need` more entries and slab slots (need_class[c] per slab). 0 or -ENOMEM. */
static int reserve(struct kvp_index *kc, uint32_t need, const uint32_t need_class[NSLAB])
{
	uint64_t want = (uint64_t)kc->ent_hw + (need > kc->nfree ? need - kc->nfree : 0);

	if (want > NONE - 1)
		return -ENOMEM;
	if (want > kc->ent_cap) {
		uint64_t cap = grown(kc->ent_cap);
		struct kc_entry *e;

		while (cap < want)
			cap = grown(cap);
		if (cap > NONE - 1)
			cap = NONE - 1;
		e = md_realloc(kc, kc->ent, (size_t)kc->ent_cap * sizeof(*e),
			       (size_t)cap * sizeof(*e), &kc->st.metadata_bytes);
		if (!e)
			return -ENOMEM;
		kc->ent = e;
		kc->ent_cap = (uint32_t)cap;
	}
	for (uint32_t c = 0; c < NSLAB; c++) {
		struct slab *s = &kc->slab[c];
		size_t sz = slab_sz(kc, c);
		uint64_t w =
			(uint64_t)s->hw + (need_class[c] > s->nfree ? need_class[c] - s->nfree : 0);
		uint64_t cap;
		uint8_t *m;

		if (w <= s->cap)
			continue;
		cap = grown(s->cap);
		while (cap < w)
			cap = grown(cap);
		if (cap > NONE - 1)
			return -ENOMEM;
		m = md_realloc(kc, s->mem, s->cap * sz, (size_t)cap * sz, &kc->st.key_bytes);
		if (!m)
			return -ENOMEM;
		s->mem = m;
		s->cap = (uint32_t)cap;
	}
	return 0;
}

static uint32_t slot_take(struct slab *s, size_t sz)
{
	uint32_t i;

	if (s->nfree) {
		i = s->free_head;
		memcpy(&s->free_head, s->mem + (size_t)i * sz, sizeof(uint32_t));
		s->nfree--;
		return i;
	}
	return s->hw++;
}

static void slot_put(struct slab *s, size_t sz, uint32_t i)
{
	memcpy(s->mem + (size_t)i * sz, &s->free_head, sizeof(uint32_t));
	s->free_head = i;
	s->nfree++;
}

static const uint8_t *page_key(struct kvp_index *kc, uint32_t i);

/* Tells the observer that entry i was stored in or removed from tier. */
static void observe(struct kvp_index *kc, uint32_t i, enum kvp_index_change ch, int tier)
{
	const struct kc_entry *e = &kc->ent[i];
	struct kvp_index_event ev = { .change = ch, .tier = (enum kvp_tier_id)tier };

	ev.ns = kc->nsr[e->ns].ns;
	ev.keyed = !e->tok;
	ev.key.data = page_key(kc, i);
	ev.key.len = e->klen1 + 1u;
	if (e->parent != NONE) {
		ev.parent.data = page_key(kc, e->parent);
		ev.parent.len = kc->ent[e->parent].klen1 + 1u;
	}
	if (e->tok) {
		ev.tokens = (const uint32_t *)(const void *)tokens_at(kc, e);
		ev.ntokens = kc->conf.page_tokens;
	}
	kc->observe(kc->observe_ctx, &ev);
}

void kvp_index_set_observer(struct kvp_index *kc, kvp_index_observe_fn fn, void *ctx)
{
	kc->observe = fn;
	kc->observe_ctx = ctx;
}

/* Entry i and its ancestors not yet told (seen[] marks the told), ancestors first: a loop up the
 * parent links to the first told one, then down again. */
static void observe_up(struct kvp_index *kc, uint32_t i, uint8_t *seen)
{
	while (!seen[i]) {
		uint32_t top = i;

		while (kc->ent[top].parent != NONE && !seen[kc->ent[top].parent])
			top = kc->ent[top].parent;
		seen[top] = 1;
		observe(kc, top, KVP_INDEX_STORED, (int)kc->ent[top].tier);
	}
}

void kvp_index_observe_all(struct kvp_index *kc)
{
	uint8_t *seen;

	if (!kc || !kc->observe)
		return;
	seen = calloc(kc->ent_hw ? kc->ent_hw : 1, 1);
	for (uint32_t i = 0; i < kc->ent_hw; i++) {
		if (kc->ent[i].list == LIST_FREE)
			continue;
		if (seen)
			observe_up(kc, i, seen);
		else
			observe(kc, i, KVP_INDEX_STORED, (int)kc->ent[i].tier);
	}
	free(seen);
}

/* A new entry (room reserved): in the table, counted, parent linked. A token page (t not NULL)
 * has its tokens t and key k of KVP_PAGE_KEY_BYTES, or of 0 bytes: derived when first asked
 * for (page_key). */
static uint32_t entry_new(struct kvp_index *kc, uint32_t ns, uint32_t h, const struct kvp_key *k,
			  const uint32_t *t, uint32_t parent, int tier, uint32_t page)
{
	uint32_t i, c = t ? TSLAB : class_of(k->len);
	struct kc_entry *e;

	if (kc->nfree) {
		i = kc->free_head;
		kc->free_head = kc->ent[i].hnext;
		kc->nfree--;
	} else {
		i = kc->ent_hw++;
	}
	e = &kc->ent[i];
	memset(e, 0, sizeof(*e));
	e->hash = h;
	e->ns = ns;
	e->parent = parent;
	e->page = page;
	e->prev = e->next = NONE;
	e->tier = (uint32_t)tier;
	e->klen1 = k->len ? (uint32_t)(k->len - 1) : 0; /* a token page's: 0 until derived */
	e->tok = t != NULL;
	e->key = slot_take(&kc->slab[c], slab_sz(kc, c));
	if (k->len)
		memcpy(key_at(kc, e), k->data, k->len);
	if (t) {
		memcpy(key_at(kc, e) + KVP_PAGE_KEY_BYTES, t, kc->tbytes);
		kc->st.token_entries++;
	}
	e->hnext = kc->buckets[bucket_of(kc, h)];
	kc->buckets[bucket_of(kc, h)] = i;
	kc->nsr[ns].count++;
	kc->st.entries++;
	acct(kc, e, 1);
	if (parent != NONE) {
		kc->ent[parent].nchild++;
		if (tier == KVP_TIER_ID_DEVICE)
			nd_add(kc, parent, 1);
		refresh(kc, parent);
	}
	refresh(kc, i);
	if (kc->st.entries > 2ull * kc->nbuckets)
		table_grow(kc); /* within a long insert too: chains stay short */
	if (kc->observe)
		observe(kc, i, KVP_INDEX_STORED, tier);
	return i;
}

/* Entry i's page leaves it: freed, or, while a write-back holds it, kept MOVING for the hold. */
static void host_let_go(struct kvp_index *kc, uint32_t i)
{
	struct kc_entry *e = &kc->ent[i];

	if (e->held && e->tier == KVP_TIER_ID_HOST) {
		for (uint32_t h = 0; h < kc->holds_cap; h++) {
			struct kc_hold *x = &kc->holds[h];

			if (x->used && !x->gone && x->idx == i) {
				x->gone = 1;
				kc->holds_gone++;
				kc->st.moving_pages++;
				kvp_pages_move(kc->tier[KVP_TIER_ID_HOST], e->page, KVP_PAGE_CACHED,
					       KVP_PAGE_MOVING);
				break;
			}
		}
		e->held = 0;
		return;
	}
	kvp_pages_release(kc->tier[e->tier], &e->page, 1);
}

/* Removes entry i (unlocked, no children): page freed, parent updated. */
static void entry_drop(struct kvp_index *kc, uint32_t i)
{
	struct kc_entry *e = &kc->ent[i];
	uint32_t c = slab_of(e), p = e->parent;

	if (kc->observe)
		observe(kc, i, KVP_INDEX_REMOVED, (int)e->tier);
	host_let_go(kc, i);
	kc->st.evicted_pages[e->tier]++;
	acct(kc, e, -1);
	if (e->list != LIST_NONE)
		list_del(kc, i);
	table_del(kc, i);
	slot_put(&kc->slab[c], slab_sz(kc, c), e->key);
	kc->st.token_entries -= e->tok;
	if (--kc->nsr[e->ns].count == 0)
		ns_drop(kc, e->ns);
	kc->st.entries--;
	if (p != NONE) {
		kc->ent[p].nchild--;
		if (e->tier == KVP_TIER_ID_DEVICE)
			nd_add(kc, p, -1);
		refresh_at(kc, p, true);
	}
	e->list = LIST_FREE;
	e->hnext = kc->free_head;
	kc->free_head = i;
	kc->nfree++;
}

/* ---- life ---- */

/* The hash seed: clients choose keys and token ids, so the seed must be unpredictable to them.
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

struct kvp_index *kvp_index_new(const struct kvp_index_conf *conf)
{
	struct kvp_index *kc;

	if (!conf || (!conf->dev && !conf->host) || conf->dev == conf->host ||
	    (conf->dev && conf->host && !conf->copy) || conf->page_tokens > 65536 ||
	    (unsigned)conf->policy >= KVP_EVICT_POLICY_MAX)
		return NULL;
	kc = calloc(1, sizeof(*kc));
	if (!kc)
		return NULL;
	kc->conf = *conf;
	kc->hash_mask = conf->collide ? 0 : UINT32_MAX;
	kc->tier[KVP_TIER_ID_DEVICE] = conf->dev;
	kc->tier[KVP_TIER_ID_HOST] = conf->host;
	kc->free_head = kc->nsr_free = NONE;
	kc->tbytes = (size_t)conf->page_tokens * sizeof(uint32_t);
	for (int l = 0; l < 3; l++)
		for (uint32_t c = 0; c < NLFU; c++)
			kc->lru[l][c].head = kc->lru[l][c].tail = NONE;
	kc->nbuckets = 64;
	kc->buckets = malloc(kc->nbuckets * sizeof(*kc->buckets));
	if (!kc->buckets || seed_of(&kc->seed) < 0) {
		free(kc->buckets);
		free(kc);
		return NULL;
	}
	memset(kc->buckets, 0xff, kc->nbuckets * sizeof(*kc->buckets));
	kc->st.metadata_bytes = sizeof(*kc) + kc->nbuckets * sizeof(*kc->buckets);
	return kc;
}

void kvp_index_free(struct kvp_index *kc)
{
	if (!kc)
		return;
	free(kc->ent);
	free(kc->buckets);
	for (uint32_t c = 0; c < NSLAB; c++)
		free(kc->slab[c].mem);
	free(kc->nsr);
	free(kc->nsmap);
	while (kc->flights) {
		struct kvp_index_flight *fl = kc->flights;

		kc->flights = fl->next;
		free(fl);
	}
	free(kc->holds);
	free(kc);
}

/* ---- insert ---- */

static int u32_cmp(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return x < y ? -1 : x > y;
}

static void retier(struct kvp_index *kc, uint32_t i, int to, uint32_t page);

/* Pages[0 .. n) (KVP_PAGE_NONE ones skipped) are distinct and LEASED in tier: 0, -EINVAL or
 * -ENOMEM. *own gets how many are not KVP_PAGE_NONE. */
static int pages_ok(const struct kvp_index *kc, enum kvp_tier_id tier, const uint32_t *pages,
		    uint32_t n, uint32_t *own)
{
	uint32_t *sorted, k = 0;

	*own = 0;
	if (!n)
		return 0;
	sorted = malloc((size_t)n * sizeof(*sorted));
	if (!sorted)
		return -ENOMEM;
	for (uint32_t i = 0; i < n; i++)
		if (pages[i] != KVP_PAGE_NONE)
			sorted[k++] = pages[i];
	qsort(sorted, k, sizeof(*sorted), u32_cmp);
	for (uint32_t i = 0; i < k; i++) {
		if ((i && sorted[i] == sorted[i - 1]) ||
		    kvp_pages_state(kc->tier[tier], sorted[i]) != KVP_PAGE_LEASED) {
			free(sorted);
			return -EINVAL;
		}
	}
	free(sorted);
	*own = k;
	return 0;
}

/* A cached page offered again in a LEASED page of tier: when the entry is an unlocked host entry
 * and the page a device page, the entry takes it and frees its host page (true). */
static bool upgrade(struct kvp_index *kc, uint32_t at, enum kvp_tier_id tier, uint32_t page)
{
	struct kc_entry *e = &kc->ent[at];

	/* the chain stays device pages first: a page below a host page stays a host page */
	if (tier != KVP_TIER_ID_DEVICE || e->tier != KVP_TIER_ID_HOST || e->lock ||
	    (e->parent != NONE && kc->ent[e->parent].tier == KVP_TIER_ID_HOST))
		return false;
	host_let_go(kc, at);
	kvp_pages_move(kc->tier[KVP_TIER_ID_DEVICE], page, KVP_PAGE_LEASED, KVP_PAGE_CACHED);
	retier(kc, at, KVP_TIER_ID_DEVICE, page);
	return true;
}

/* One position of an insert, pos in dup_idx's numbering: at is its cached entry (NONE: not
 * cached) for key k (and tokens t: a token page) under parent, offered page (KVP_PAGE_NONE:
 * the caller holds none, the position is cached). A cached position keeps its entry: the page
 * upgrades it or is a duplicate; a new one takes the page. Returns the position's entry. */
static uint32_t insert_at(struct kvp_index *kc, uint32_t nsi, uint32_t h, const struct kvp_key *k,
			  const uint32_t *t, uint32_t parent, enum kvp_tier_id tier, uint32_t page,
			  uint32_t at, uint32_t pos, struct kvp_index_insert_result *r,
			  uint32_t *dup_idx)
{
	if (page == KVP_PAGE_NONE)
		return at;
	if (at != NONE) {
		if (upgrade(kc, at, tier, page)) {
			r->new_pages++;
		} else {
			if (dup_idx)
				dup_idx[r->dup_pages] = pos;
			r->dup_pages++;
		}
		return at;
	}
	kvp_pages_move(kc->tier[tier], page, KVP_PAGE_LEASED, KVP_PAGE_CACHED);
	r->new_pages++;
	return entry_new(kc, nsi, h, k, t, parent, (int)tier, page);
}

int kvp_index_insert(struct kvp_index *kc, uint64_t ns, const struct kvp_key *keys, uint32_t n,
		     uint32_t cached, enum kvp_tier_id tier, const uint32_t *pages,
		     struct kvp_index_insert_result *res, uint32_t *dup_idx)
{
	struct kvp_index_insert_result r = { 0, 0, 0 };
	uint32_t need_class[NSLAB] = { 0 }, own, parent = NONE, nsi;
	int e;

	if (!kc || !keys || !n || cached > n || (unsigned)tier >= KVP_TIER_ID_MAX ||
	    !kc->tier[tier] || (n > cached && !pages))
		return -EINVAL;
	own = n - cached;
	for (uint32_t i = 0; i < n; i++) {
		if (!key_ok(&keys[i]))
			return -EINVAL;
		if (i >= cached)
			need_class[class_of(keys[i].len)]++;
	}
	for (uint32_t i = 0; i < own; i++)
		if (pages[i] == KVP_PAGE_NONE)
			return -EINVAL;
	if ((e = pages_ok(kc, tier, pages, own, &own)) < 0)
		return e;
	if (ns_reserve(kc) < 0 || reserve(kc, own, need_class) < 0)
		return -ENOMEM;
	nsi = ns_get(kc, ns);
	for (uint32_t i = 0; i < n; i++) {
		uint32_t h = key_hash(kc, ns, keys[i].data, keys[i].len);
		uint32_t at = find(kc, nsi, h, &keys[i]);

		if (i < cached && at == NONE)
			break; /* evicted since the caller matched it */
		at = insert_at(kc, nsi, h, &keys[i], NULL, parent, tier,
			       i < cached ? KVP_PAGE_NONE : pages[i - cached], at,
			       i < cached ? 0 : i - cached, &r, dup_idx);
		parent = at;
		r.done_keys = i + 1;
	}
	if (!kc->nsr[nsi].count)
		ns_drop(kc, nsi);
	table_grow(kc);
	if (res)
		*res = r;
	return 0;
}

int kvp_index_insert_tokens(struct kvp_index *kc, uint64_t ns, const uint32_t *tokens,
			    uint32_t npages, enum kvp_tier_id tier, const uint32_t *pages,
			    struct kvp_index_insert_result *res, uint32_t *dup_idx)
{
	struct kvp_index_insert_result r = { 0, 0, 0 };
	uint32_t need_class[NSLAB] = { 0 }, own, parent = NONE, nsi, h = 0;
	int e;

	if (!kc || !tokens || !npages || !pages || !kc->conf.page_tokens ||
	    (unsigned)tier >= KVP_TIER_ID_MAX || !kc->tier[tier])
		return -EINVAL;
	if ((e = pages_ok(kc, tier, pages, npages, &own)) < 0)
		return e;
	need_class[TSLAB] = own;
	if (ns_reserve(kc) < 0 || reserve(kc, own, need_class) < 0)
		return -ENOMEM;
	nsi = ns_get(kc, ns);
	for (uint32_t i = 0; i < npages; i++) {
		const uint32_t *t = tokens + (size_t)i * kc->conf.page_tokens;
		uint32_t at;

		/* the entry after the parent's first (a chain cached in one call), then the table
		 */
		if (parent != NONE && parent + 1 < kc->ent_hw &&
		    kc->ent[parent + 1].list != LIST_FREE &&
		    tok_is(kc, &kc->ent[parent + 1], nsi, kc->ent[parent + 1].hash, parent, t)) {
			at = parent + 1;
			h = kc->ent[at].hash;
		} else {
			h = tok_hash(kc, ns, parent == NONE ? 0 : h, t);
			at = find_tok(kc, nsi, h, parent, t);
		}
		if (pages[i] == KVP_PAGE_NONE && at == NONE)
			break; /* evicted since the caller matched it */
		at = insert_at(kc, nsi, h, &(struct kvp_key){ 0, NULL }, t, parent, tier, pages[i],
			       at, i, &r, dup_idx);
		parent = at;
		r.done_keys = i + 1;
	}
	if (!kc->nsr[nsi].count)
		ns_drop(kc, nsi);
	table_grow(kc);
	if (res)
		*res = r;
	return 0;
}

static inline bool key_derived(const struct kc_entry *e)
{
	return !e->tok || e->klen1 == KVP_PAGE_KEY_BYTES - 1;
}

/* Entry i's key: a token page's is derived here when first asked for, with every ancestor's
 * that is not yet (keys chain from the first page). The chain up to the nearest page with a key
 * is walked with its parent links reversed, then back down restoring them while each key is
 * derived from its parent's: no memory, O(pages derived). */
static const uint8_t *page_key(struct kvp_index *kc, uint32_t i)
{
	uint32_t prev = NONE, cur = i, up;

	while (cur != NONE && !key_derived(&kc->ent[cur])) {
		uint32_t next = kc->ent[cur].parent;

		kc->ent[cur].parent = prev;
		prev = cur;
		cur = next;
	}
	up = cur; /* the nearest ancestor with a key, or NONE */
	while (prev != NONE) {
		struct kc_entry *e = &kc->ent[prev];
		uint32_t next = e->parent;

		e->parent = up;
		kvp_page_key(up == NONE ? NULL : key_at(kc, &kc->ent[up]),
			     (const uint32_t *)(const void *)tokens_at(kc, e), kc->conf.page_tokens,
			     key_at(kc, e));
		e->klen1 = KVP_PAGE_KEY_BYTES - 1;
		up = prev;
		prev = next;
	}
	return key_at(kc, &kc->ent[i]);
}

int kvp_index_put(struct kvp_index *kc, const struct kvp_index_entry *x, uint32_t parent,
		  uint32_t *idx)
{
	uint32_t need_class[NSLAB] = { 0 }, nsi, h, at, ph = 0;

	if (!kc || !x || !idx || (unsigned)x->tier >= KVP_TIER_ID_MAX || !kc->tier[x->tier] ||
	    (x->keyed && !key_ok(&x->key)) ||
	    (!x->keyed && (!x->tokens || !kc->conf.page_tokens ||
			   (x->key.len && (x->key.len != KVP_PAGE_KEY_BYTES || !x->key.data)))) ||
	    kvp_pages_state(kc->tier[x->tier], x->page) != KVP_PAGE_LEASED)
		return -EINVAL;
	if (parent != NONE) {
		if (parent >= kc->ent_hw || kc->ent[parent].list == LIST_FREE ||
		    kc->ent[parent].tok == !!x->keyed || kc->nsr[kc->ent[parent].ns].ns != x->ns)
			return -EINVAL;
		/* its hash by value: reserve() below may move the entry table */
		ph = kc->ent[parent].hash;
	}
	need_class[x->keyed ? class_of(x->key.len) : TSLAB] = 1;
	if (ns_reserve(kc) < 0 || reserve(kc, 1, need_class) < 0)
		return -ENOMEM;
	nsi = ns_get(kc, x->ns);
	if (x->keyed) {
		h = key_hash(kc, x->ns, x->key.data, x->key.len);
		at = find(kc, nsi, h, &x->key);
	} else {
		h = tok_hash(kc, x->ns, ph, x->tokens);
		at = find_tok(kc, nsi, h, parent, x->tokens);
	}
	if (at != NONE) {
		if (!kc->nsr[nsi].count)
			ns_drop(kc, nsi);
		return -EEXIST;
	}
	kvp_pages_move(kc->tier[x->tier], x->page, KVP_PAGE_LEASED, KVP_PAGE_CACHED);
	at = entry_new(kc, nsi, h, &x->key, x->keyed ? NULL : x->tokens, parent, (int)x->tier,
		       x->page);
	hits_set(kc, at, x->hits);
	table_grow(kc);
	*idx = at;
	return 0;
}

int kvp_index_walk(const struct kvp_index *kc,
		   int (*fn)(void *ctx, const struct kvp_index_entry *e), void *ctx)
{
	for (uint32_t i = 0; i < kc->ent_hw; i++) {
		const struct kc_entry *e = &kc->ent[i];
		struct kvp_index_entry x;
		int r;

		if (e->list == LIST_FREE)
			continue;
		x.idx = i;
		x.parent = e->parent;
		x.ns = kc->nsr[e->ns].ns;
		x.keyed = !e->tok;
		x.key.len = key_derived(e) ? e->klen1 + 1u : 0;
		x.key.data = key_at(kc, e);
		x.tokens = e->tok ? (const uint32_t *)(const void *)tokens_at(kc, e) : NULL;
		x.tier = (enum kvp_tier_id)e->tier;
		x.page = e->page;
		x.hits = e->hits;
		if ((r = fn(ctx, &x)) != 0)
			return r;
	}
	return 0;
}

int kvp_index_lock_key(struct kvp_index *kc, const struct kvp_index_lock *lock, uint32_t i,
		       struct kvp_key *k, uint64_t *ns)
{
	const struct kc_entry *e;

	if (!kc || !lock || i >= lock->n || !k || !ns)
		return -EINVAL;
	e = &kc->ent[lock->idx[i]];
	k->data = page_key(kc, lock->idx[i]);
	k->len = e->klen1 + 1u;
	*ns = kc->nsr[e->ns].ns;
	return 0;
}

static uint32_t run_tok(const struct kvp_index *kc, uint64_t ns, const uint32_t *tokens, uint32_t n,
			uint32_t *out);

int kvp_index_token_key(struct kvp_index *kc, uint64_t ns, const uint32_t *tokens, uint32_t npages,
			uint8_t out[KVP_PAGE_KEY_BYTES])
{
	uint32_t *idx, run;

	if (!kc || !tokens || !npages || !kc->conf.page_tokens)
		return -EINVAL;
	if (!(idx = malloc((size_t)npages * sizeof(*idx))))
		return -ENOMEM;
	run = run_tok(kc, ns, tokens, npages, idx);
	if (run == npages)
		memcpy(out, page_key(kc, idx[npages - 1]), KVP_PAGE_KEY_BYTES);
	free(idx);
	return run == npages ? 0 : -ENOENT;
}

const uint32_t *kvp_index_lock_tokens(const struct kvp_index *kc, const struct kvp_index_lock *lock,
				      uint32_t i)
{
	const struct kc_entry *e;

	if (!kc || !lock || i >= lock->n)
		return NULL;
	e = &kc->ent[lock->idx[i]];
	return e->tok ? (const uint32_t *)(const void *)tokens_at(kc, e) : NULL;
}

bool kvp_index_lock_tokened(const struct kvp_index *kc, const struct kvp_index_lock *lock)
{
	return kc && lock && lock->n && kc->ent[lock->idx[0]].tok;
}

/* Chain depth of entry i in pages. */
static uint32_t depth_of(const struct kvp_index *kc, uint32_t i)
{
	uint32_t d = 1;

	while ((i = kc->ent[i].parent) != NONE)
		d++;
	return d;
}

static bool top_before(const struct kvp_index_top *a, const struct kvp_index_top *b)
{
	return a->hits > b->hits || (a->hits == b->hits && a->pages < b->pages);
}

uint32_t kvp_index_top(const struct kvp_index *kc, struct kvp_index_top *out, uint32_t cap)
{
	uint32_t n = 0;

	if (!kc || !out || !cap)
		return 0;
	/* insertion into a sorted array of cap: cap is small (the listing's rows) */
	for (uint32_t i = 0; i < kc->ent_hw; i++) {
		const struct kc_entry *e = &kc->ent[i];
		struct kvp_index_top t;
		uint32_t j;

		if (e->list == LIST_FREE || !e->hits)
			continue;
		if (n == cap && e->hits < out[n - 1].hits)
			continue;
		t = (struct kvp_index_top){ kc->nsr[e->ns].ns, depth_of(kc, i), e->hits, !e->tok };
		if (n == cap && !top_before(&t, &out[n - 1]))
			continue;
		j = n < cap ? n++ : n - 1;
		while (j && top_before(&t, &out[j - 1])) {
			out[j] = out[j - 1];
			j--;
		}
		out[j] = t;
	}
	return n;
}

/* ---- match ---- */

/* Looks up keys[0 .. m) (m <= BATCH) of namespace record nsi into out[]; returns how many
 * leading ones are present. Hashes and bucket prefetches first, then the entries', then the
 * keys', so the batch's cache misses overlap. */
static uint32_t batch_find(const struct kvp_index *kc, uint64_t ns, uint32_t nsi,
			   const struct kvp_key *keys, uint32_t m, uint32_t *out)
{
	uint32_t h[BATCH], head[BATCH];

	for (uint32_t j = 0; j < m; j++) {
		const struct kvp_key *k = &keys[j];

		if (!key_ok(k)) {
			m = j;
			break;
		}
		h[j] = key_hash(kc, ns, k->data, k->len);
		__builtin_prefetch(&kc->buckets[bucket_of(kc, h[j])]);
	}
	for (uint32_t j = 0; j < m; j++) {
		head[j] = kc->buckets[bucket_of(kc, h[j])];
		if (head[j] != NONE)
			__builtin_prefetch(&kc->ent[head[j]]);
	}
	for (uint32_t j = 0; j < m; j++)
		if (head[j] != NONE && kc->ent[head[j]].hash == h[j])
			__builtin_prefetch(key_at(kc, &kc->ent[head[j]]));
	for (uint32_t j = 0; j < m; j++) {
		const struct kvp_key *k = &keys[j];
		uint32_t i = head[j];

		for (; i != NONE; i = kc->ent[i].hnext) {
			const struct kc_entry *e = &kc->ent[i];

			if (e->hash == h[j] && e->ns == nsi && !e->tok && e->klen1 + 1u == k->len &&
			    same_bytes(key_at(kc, e), k->data, k->len))
				break;
		}
		if (i == NONE)
			return j;
		out[j] = i;
	}
	return m;
}

/* Whether entry g holds key k of namespace record nsi (a guess, checked in full). */
static inline bool guess_ok(const struct kvp_index *kc, uint32_t g, uint32_t nsi,
			    const struct kvp_key *k)
{
	const struct kc_entry *e = &kc->ent[g];

	return g < kc->ent_hw && e->list != LIST_FREE && e->ns == nsi && !e->tok && key_ok(k) &&
	       e->klen1 + 1u == k->len && same_bytes(key_at(kc, e), k->data, k->len);
}

/* Indices of the entries of the leading run of keys[0 .. n) present, in out[] (n entries);
 * returns the run's length. A chain inserted in one call sits in consecutive entries, so the
 * entry after the previous key's is tried first (compared in full: no hash, no table); where
 * that fails, keys are looked up through the table in batches that grow while guesses keep
 * failing. */
static uint32_t run_of(const struct kvp_index *kc, uint64_t ns, const struct kvp_key *keys,
		       uint32_t n, uint32_t *out)
{
	uint32_t nsi = ns_find(kc, ns), j = 0, w = 1;

	if (nsi == NONE)
		return 0;
	while (j < n) {
		uint32_t m, got;

		if (j && guess_ok(kc, out[j - 1] + 1, nsi, &keys[j])) {
			out[j] = out[j - 1] + 1;
			j++;
			w = 1;
			continue;
		}
		m = n - j < w ? n - j : w;
		got = batch_find(kc, ns, nsi, keys + j, m, out + j);
		j += got;
		if (got < m)
			return j;
		w = w * 2 > BATCH ? BATCH : w * 2;
	}
	return n;
}

/* Token pages [j, j + m) (m <= BATCH) of tokens looked up into out[], the page before j being
 * out[j - 1] (with table hash *h; nothing before page 0): hashes and bucket prefetches first,
 * then the entries', then the checks in order. Returns how many were found; *h is the last
 * found one's hash. */
static uint32_t batch_find_tok(const struct kvp_index *kc, uint64_t ns, uint32_t nsi,
			       const uint32_t *tokens, uint32_t j, uint32_t m, uint32_t *out,
			       uint32_t *hp)
{
	uint32_t h[BATCH], head[BATCH], pt = kc->conf.page_tokens, prev = *hp;

	for (uint32_t q = 0; q < m; q++) {
		prev = h[q] = tok_hash(kc, ns, j + q ? prev : 0, tokens + (size_t)(j + q) * pt);
		__builtin_prefetch(&kc->buckets[bucket_of(kc, h[q])]);
	}
	for (uint32_t q = 0; q < m; q++) {
		head[q] = kc->buckets[bucket_of(kc, h[q])];
		if (head[q] != NONE)
			__builtin_prefetch(&kc->ent[head[q]]);
	}
	for (uint32_t q = 0; q < m; q++) {
		uint32_t parent = j + q ? out[j + q - 1] : NONE, i = head[q];
		const uint32_t *t = tokens + (size_t)(j + q) * pt;

		for (; i != NONE; i = kc->ent[i].hnext)
			if (tok_is(kc, &kc->ent[i], nsi, h[q], parent, t))
				break;
		if (i == NONE)
			return q;
		out[j + q] = i;
		*hp = h[q];
	}
	return m;
}

/* Indices of the entries of the leading run of token pages 0 .. n of tokens present, in out[];
 * returns the run's length. As run_of: the entry after the previous page's is tried first (the
 * stored hash then carries the chain on), the table in growing batches where that fails. */
static uint32_t run_tok(const struct kvp_index *kc, uint64_t ns, const uint32_t *tokens, uint32_t n,
			uint32_t *out)
{
	uint32_t nsi = ns_find(kc, ns), j = 0, w = 1, h = 0, pt = kc->conf.page_tokens;

	if (nsi == NONE)
		return 0;
	while (j < n) {
		uint32_t m, got, g;

		if (j && (g = out[j - 1] + 1) < kc->ent_hw && kc->ent[g].list != LIST_FREE &&
		    tok_is(kc, &kc->ent[g], nsi, kc->ent[g].hash, out[j - 1],
			   tokens + (size_t)j * pt)) {
			out[j++] = g;
			h = kc->ent[g].hash;
			w = 1;
			continue;
		}
		m = n - j < w ? n - j : w;
		got = batch_find_tok(kc, ns, nsi, tokens, j, m, out, &h);
		j += got;
		if (got < m)
			return j;
		w = w * 2 > BATCH ? BATCH : w * 2;
	}
	return n;
}

/* A lock on entry i: its first takes it off the eviction lists and from evictable to
 * protected (acct's rule, without its two passes). */
static inline void lock_get(struct kvp_index *kc, uint32_t i)
{
	struct kc_entry *e = &kc->ent[i];

	if (e->lock++)
		return;
	if (!stuck(e))
		kc->st.evictable_pages[e->tier]--;
	kc->st.protected_pages[e->tier]++;
	if (e->list != LIST_NONE)
		list_del(kc, i);
}

static inline void lock_put(struct kvp_index *kc, uint32_t i)
{
	struct kc_entry *e = &kc->ent[i];

	if (--e->lock)
		return;
	kc->st.protected_pages[e->tier]--;
	if (!stuck(e))
		kc->st.evictable_pages[e->tier]++;
	refresh(kc, i);
}

/* The match of the run idx[0 .. run) (in lk's idx): device pages first, then the host
 * continuation; marks and counts the entries, locks them when asked. Returns the pages matched;
 * lk is m->lock or freed. */
static uint32_t take_run(struct kvp_index *kc, struct kvp_index_lock *lk, uint32_t run, int lock,
			 struct kvp_index_match *m, uint32_t *dev, uint32_t *host)
{
	uint32_t *idx = lk->idx, nd = 0, nh = 0;

	for (uint32_t j = 0; j < run; j++) {
		struct kc_entry *e = &kc->ent[idx[j]];

		if (e->tier == KVP_TIER_ID_DEVICE) {
			if (nh)
				break; /* a device page after a host page ends the run */
			if (dev)
				dev[nd] = e->page;
			nd++;
		} else {
			if (host)
				host[nh] = e->page;
			nh++;
		}
		if (e->hits < HITS_MAX)
			hits_set(kc, idx[j], e->hits + 1u);
		if (e->list == LIST_DEV || e->list == LIST_HOST) { /* a leaf: most recent now */
			int l = (int)e->list;

			list_del(kc, idx[j]);
			list_add(kc, idx[j], l);
		}
	}
	run = nd + nh;
	m->dev_pages = nd;
	m->host_pages = nh;
	if (lock && run) {
		lk->n = run;
		for (uint32_t j = 0; j < run; j++)
			lock_get(kc, idx[j]);
		m->lock = lk;
	} else {
		free(lk);
	}
	return run;
}

static struct kvp_index_lock *lock_new(uint32_t n)
{
	return KVP_FAULT_OR(KVP_FAULT_PREFIX,
			    malloc(sizeof(struct kvp_index_lock) + (size_t)n * sizeof(uint32_t)));
}

int kvp_index_match(struct kvp_index *kc, uint64_t ns, const struct kvp_key *keys, uint32_t n,
		    int lock, struct kvp_index_match *m, uint32_t *dev, uint32_t *host)
{
	struct kvp_index_lock *lk;

	if (!kc || !m || (n && (!keys || ((!dev || !host) && lock))))
		return -EINVAL;
	kc->st.queried_keys += n;
	m->dev_pages = m->host_pages = 0;
	m->lock = NULL;
	if (!n)
		return 0;
	if (!(lk = lock_new(n)))
		return -ENOMEM;
	kc->st.hit_keys += take_run(kc, lk, run_of(kc, ns, keys, n, lk->idx), lock, m, dev, host);
	return 0;
}

int kvp_index_match_tokens(struct kvp_index *kc, uint64_t ns, const uint32_t *tokens,
			   uint32_t ntokens, int lock, struct kvp_index_match *m, uint32_t *dev,
			   uint32_t *host)
{
	struct kvp_index_lock *lk;
	uint32_t n, pt;

	if (!kc || !m || !(pt = kc->conf.page_tokens))
		return -EINVAL;
	n = ntokens / pt;
	if (n && (!tokens || !dev || !host))
		return -EINVAL;
	kc->st.queried_tokens += (uint64_t)n * pt;
	m->dev_pages = m->host_pages = 0;
	m->lock = NULL;
	if (!n)
		return 0;
	if (!(lk = lock_new(n)))
		return -ENOMEM;
	kc->st.hit_tokens += (uint64_t)take_run(kc, lk, run_tok(kc, ns, tokens, n, lk->idx), lock,
						m, dev, host) *
			     pt;
	return 0;
}

uint32_t kvp_index_exists(struct kvp_index *kc, uint64_t ns, const struct kvp_key *keys, uint32_t n)
{
	uint32_t buf[256], run = 0;

	if (!kc || !keys)
		return 0;
	/* in windows: run_of stores indices, which exists does not keep */
	while (run < n) {
		uint32_t w = n - run < 256 ? n - run : 256,
			 got = run_of(kc, ns, keys + run, w, buf);

		run += got;
		if (got < w)
			break;
	}
	return run;
}

void kvp_index_unlock(struct kvp_index *kc, struct kvp_index_lock *lock)
{
	if (!kc || !lock)
		return;
	for (uint32_t j = 0; j < lock->n; j++)
		lock_put(kc, lock->idx[j]);
	free(lock);
}

uint32_t kvp_index_lock_pages(const struct kvp_index_lock *lock)
{
	return lock ? lock->n : 0;
}

uint32_t kvp_index_lock_host_pages(const struct kvp_index *kc, const struct kvp_index_lock *lock)
{
	uint32_t nh = 0;

	for (uint32_t j = 0; lock && j < lock->n; j++)
		nh += kc->ent[lock->idx[j]].tier == KVP_TIER_ID_HOST;
	return nh;
}

/* ---- promotion ---- */

static uint32_t evict_dev(struct kvp_index *kc, uint32_t want);

/* Entry i moves to tier `to`, its page now `page` (the old one already freed by the caller). */
static void retier(struct kvp_index *kc, uint32_t i, int to, uint32_t page)
{
	struct kc_entry *e = &kc->ent[i];
	int from = (int)e->tier;

	if (kc->observe && from != to)
		observe(kc, i, KVP_INDEX_REMOVED, from);
	acct(kc, e, -1);
	e->tier = (uint32_t)to;
	e->page = page;
	acct(kc, e, 1);
	if (e->parent != NONE) {
		if (from == KVP_TIER_ID_DEVICE)
			nd_add(kc, e->parent, -1);
		if (to == KVP_TIER_ID_DEVICE)
			nd_add(kc, e->parent, 1);
		refresh_at(kc, e->parent, from == KVP_TIER_ID_DEVICE);
	}
	refresh(kc, i);
	if (kc->observe && from != to)
		observe(kc, i, KVP_INDEX_STORED, to);
}

int kvp_index_promote(struct kvp_index *kc, struct kvp_index_lock *lock, uint32_t *dev_out,
		      uint32_t cap, uint32_t *n)
{
	struct kvp_pages *dp;
	uint32_t nh, *src, *dst, k = 0;
	int r;

	if (!kc || !lock || !dev_out || !n || !(dp = kc->tier[KVP_TIER_ID_DEVICE]) || cap < lock->n)
		return -EINVAL;
	nh = kvp_index_lock_host_pages(kc, lock);
	for (uint32_t j = 0; j < lock->n; j++) {
		const struct kc_entry *e = &kc->ent[lock->idx[j]];

		if (e->tier == KVP_TIER_ID_HOST && e->lock > 1)
			return -EBUSY;
	}
	if (nh) {
		uint32_t nfree = kvp_pages_count(dp, KVP_PAGE_FREE);

		/* room first: other unlocked device pages demoted or dropped (the run is locked) */
		if (nfree < nh) {
			if (nh - nfree > kc->st.evictable_pages[KVP_TIER_ID_DEVICE])
				return -ENOSPC;
			evict_dev(kc, nh - nfree);
		}
		if (kvp_pages_count(dp, KVP_PAGE_FREE) < nh)
			return -ENOSPC;
		src = malloc((size_t)nh * 2 * sizeof(*src));
		if (!src)
			return -ENOMEM;
		dst = src + nh;
		for (uint32_t j = 0; j < lock->n; j++)
			if (kc->ent[lock->idx[j]].tier == KVP_TIER_ID_HOST)
				src[k++] = kc->ent[lock->idx[j]].page;
		if (kvp_pages_alloc(dp, nh, dst) < 0) {
			free(src);
			return -ENOSPC;
		}
		r = kc->conf.copy(kc->conf.copy_ctx, KVP_COPY_PROMOTE, src, dst, nh);
		if (r < 0) {
			kvp_pages_release(dp, dst, nh);
			free(src);
			return r;
		}
		for (uint32_t j = 0; j < lock->n; j++)
			if (kc->ent[lock->idx[j]].tier == KVP_TIER_ID_HOST)
				host_let_go(kc, lock->idx[j]);
		k = 0;
		for (uint32_t j = 0; j < lock->n; j++) {
			if (kc->ent[lock->idx[j]].tier != KVP_TIER_ID_HOST)
				continue;
			kvp_pages_move(dp, dst[k], KVP_PAGE_LEASED, KVP_PAGE_CACHED);
			retier(kc, lock->idx[j], KVP_TIER_ID_DEVICE, dst[k++]);
		}
		free(src);
		kc->st.promoted_pages += nh;
	}
	for (uint32_t j = 0; j < lock->n; j++)
		dev_out[j] = kc->ent[lock->idx[j]].page;
	*n = lock->n;
	return 0;
}

/* ---- eviction ---- */

/* Head of list l's lowest non-empty class; NONE when every class is empty. */
static uint32_t coldest(const struct kvp_index *kc, int l)
{
	for (uint32_t c = 0; c < NLFU; c++)
		if (kc->lru[l][c].head != NONE)
			return kc->lru[l][c].head;
	return NONE;
}

void kvp_index_set_spill(struct kvp_index *kc, kvp_index_spill_fn fn, void *ctx)
{
	kc->spill = fn;
	kc->spill_ctx = ctx;
}

void kvp_index_set_landed(struct kvp_index *kc, kvp_index_spill_fn fn, void *ctx)
{
	kc->landed = fn;
	kc->landed_ctx = ctx;
}

/* ---- write-back holds ---- */

/* A free hold record: its id, or NONE (ENOMEM). */
static uint32_t hold_slot(struct kvp_index *kc)
{
	if (kc->nholds == kc->holds_cap) {
		uint32_t cap = kc->holds_cap ? kc->holds_cap * 2 : 64;
		struct kc_hold *h = md_realloc(kc, kc->holds, sizeof(*h) * kc->holds_cap,
					       sizeof(*h) * cap, &kc->st.metadata_bytes);

		if (!h)
			return NONE;
		memset(h + kc->holds_cap, 0, sizeof(*h) * (cap - kc->holds_cap));
		kc->holds = h;
		kc->holds_cap = cap;
	}
	for (uint32_t i = 0; i < kc->holds_cap; i++)
		if (!kc->holds[i].used)
			return i;
	return NONE;
}

/* Holds host entry i for a write when want() asks for it: 1, else 0. */
static uint32_t hold_one(struct kvp_index *kc, uint32_t i, kvp_index_want_fn want, void *ctx,
			 struct kvp_index_hold *out)
{
	struct kc_entry *e = &kc->ent[i];
	const uint8_t *k = page_key(kc, i);
	uint64_t ns = kc->nsr[e->ns].ns;
	uint32_t h;

	if (!want(ctx, ns, !e->tok, k, e->klen1 + 1u) || (h = hold_slot(kc)) == NONE)
		return 0;
	kc->holds[h] = (struct kc_hold){ i, e->page, 1, 0 };
	kc->nholds++;
	e->held = 1;
	*out = (struct kvp_index_hold){ h, e->page, ns, !e->tok, { e->klen1 + 1u, k } };
	return 1;
}

/* Entry j as a walk meets it: held when want() asks for it (*asked counts the questions); one
 * held already or written once is passed by without a question (*passed). */
static uint32_t hold_visit(struct kvp_index *kc, uint32_t j, kvp_index_want_fn want, void *ctx,
			   struct kvp_index_hold *out, uint32_t *asked, uint32_t *passed)
{
	const struct kc_entry *e = &kc->ent[j];

	if (e->held || e->written) {
		(*passed)++;
		return 0;
	}
	(*asked)++;
	return hold_one(kc, j, want, ctx, out);
}

uint32_t kvp_index_hold(struct kvp_index *kc, bool cold, uint32_t max, uint32_t scan,
			kvp_index_want_fn want, void *ctx, struct kvp_index_hold *out)
{
	uint32_t n = 0, seen = 0, passed = 0, far = scan * HOLD_PASS;

#define MORE (n < max && seen < scan && passed < far)
	if (!kc || !want || !out || !kc->tier[KVP_TIER_ID_HOST])
		return 0;
	if (cold) { /* each leaf, then the parents it leaves leaves (eviction's order) */
		for (uint32_t c = 0; c < NLFU && MORE; c++)
			for (uint32_t i = kc->lru[LIST_HOST][c].head; i != NONE && MORE;
			     i = kc->ent[i].next)
				for (uint32_t j = i; j != NONE && MORE;) {
					n += hold_visit(kc, j, want, ctx, out + n, &seen, &passed);
					j = kc->ent[j].parent;
					if (j != NONE && (kc->ent[j].nchild != 1 ||
							  kc->ent[j].lock || stuck(&kc->ent[j]) ||
							  kc->ent[j].tier != KVP_TIER_ID_HOST))
						j = NONE;
				}
		return n;
	}
	for (uint32_t k = 0; k < kc->ent_hw && MORE; k++) {
		uint32_t i = kc->hold_cursor++ % kc->ent_hw;
		const struct kc_entry *e = &kc->ent[i];

		if (e->list != LIST_FREE && e->tier == KVP_TIER_ID_HOST)
			n += hold_visit(kc, i, want, ctx, out + n, &seen, &passed);
	}
#undef MORE
	kc->hold_cursor %= kc->ent_hw ? kc->ent_hw : 1;
	return n;
}

void kvp_index_unhold(struct kvp_index *kc, uint32_t id, bool written)
{
	struct kc_hold *h;

	if (!kc || id >= kc->holds_cap || !(h = &kc->holds[id])->used)
		return;
	if (h->gone) {
		kvp_pages_release(kc->tier[KVP_TIER_ID_HOST], &h->page, 1);
		kc->holds_gone--;
		kc->st.moving_pages--;
	} else {
		kc->ent[h->idx].held = 0;
		kc->ent[h->idx].written = written;
	}
	h->used = 0;
	kc->nholds--;
}

/* Entry i was demoted into host page `page` (its bytes in place): tells the landed hook. */
static void landed(struct kvp_index *kc, uint32_t i, uint32_t page)
{
	const struct kc_entry *e = &kc->ent[i];

	if (kc->landed) {
		const uint8_t *k = page_key(kc, i);

		kc->landed(kc->landed_ctx, kc->nsr[e->ns].ns, !e->tok, k, e->klen1 + 1u, page);
	}
}

static uint32_t evict_host(struct kvp_index *kc, uint32_t want)
{
	uint32_t freed = 0, i;

	while (freed < want && (i = coldest(kc, LIST_HOST)) != NONE) {
		const struct kc_entry *e = &kc->ent[i];
		/* A held page's write is in flight: its page frees once written (not counted). */
		bool held = e->held;

		if (kc->spill && !held) {
			const uint8_t *k = page_key(kc, i);

			kc->spill(kc->spill_ctx, kc->nsr[e->ns].ns, !e->tok, k, e->klen1 + 1u,
				  e->page);
		}
		entry_drop(kc, i);
		freed += !held;
	}
	return freed;
}

/* Demotes device entry i to a host page. 1 when done, 0 when no host page or the copy failed. */
static uint32_t demote(struct kvp_index *kc, uint32_t i)
{
	struct kvp_pages *hp = kc->tier[KVP_TIER_ID_HOST];
	uint32_t dst, src = kc->ent[i].page;

	if (!kvp_pages_count(hp, KVP_PAGE_FREE))
		evict_host(kc,
			   1); /* a host leaf: never one of i's ancestors (they have children) */
	if (kvp_pages_alloc(hp, 1, &dst) < 0)
		return 0;
	if (kc->conf.copy(kc->conf.copy_ctx, KVP_COPY_DEMOTE, &src, &dst, 1) < 0) {
		kvp_pages_release(hp, &dst, 1);
		return 0;
	}
	kvp_pages_release(kc->tier[KVP_TIER_ID_DEVICE], &src, 1);
	kvp_pages_move(hp, dst, KVP_PAGE_LEASED, KVP_PAGE_CACHED);
	retier(kc, i, KVP_TIER_ID_HOST, dst);
	landed(kc, i, dst);
	kc->st.demoted_pages++;
	kc->st.evicted_pages[KVP_TIER_ID_DEVICE]++;
	return 1;
}

static uint32_t evict_dev(struct kvp_index *kc, uint32_t want)
{
	uint32_t freed = 0, i;

	while (freed < want && (i = coldest(kc, LIST_DEV)) != NONE) {
		if (kc->tier[KVP_TIER_ID_HOST] && demote(kc, i)) {
			freed++;
			continue;
		}
		if (kc->ent[i].nchild)
			break; /* host entries below it and no host page to be had: it must stay */
		entry_drop(kc, i);
		freed++;
	}
	return freed;
}

uint32_t kvp_index_evict(struct kvp_index *kc, enum kvp_tier_id tier, uint32_t pages)
{
	if (!kc || (unsigned)tier >= KVP_TIER_ID_MAX || !kc->tier[tier] || !pages)
		return 0;
	return tier == KVP_TIER_ID_DEVICE ? evict_dev(kc, pages) : evict_host(kc, pages);
}

/* Lands flight fl's pages (rc 0) or gives its host pages back (rc < 0); unlocks its entries. */
static void flight_land(struct kvp_index *kc, struct kvp_index_flight *fl, int rc)
{
	struct kvp_pages *dp = kc->tier[KVP_TIER_ID_DEVICE], *hp = kc->tier[KVP_TIER_ID_HOST];

	for (uint32_t k = 0; k < fl->n; k++) {
		uint32_t i = fl->idx[k];

		struct kc_entry *e = &kc->ent[i];

		e->flying = 0;
		lock_put(kc, i);
		if (e->parent != NONE)
			nd_add(kc, e->parent, 1); /* a device child again, until retier */
		if (rc < 0) {
			kvp_pages_release(hp, &fl->dst[k], 1);
			if (e->parent != NONE)
				refresh(kc, e->parent);
			continue;
		}
		kvp_pages_release(dp, &fl->src[k], 1);
		kvp_pages_move(hp, fl->dst[k], KVP_PAGE_MOVING, KVP_PAGE_CACHED);
		retier(kc, i, KVP_TIER_ID_HOST, fl->dst[k]);
		landed(kc, i, fl->dst[k]);
		kc->st.demoted_pages++;
		kc->st.evicted_pages[KVP_TIER_ID_DEVICE]++;
	}
}

void kvp_index_demote_done(struct kvp_index *kc, struct kvp_index_flight *fl, int rc)
{
	if (!kc || !fl)
		return;
	if (fl->prev)
		fl->prev->next = fl->next;
	else
		kc->flights = fl->next;
	if (fl->next)
		fl->next->prev = fl->prev;
	kc->st.flights--;
	kc->st.inflight_pages -= fl->n;
	kc->st.moving_pages -= fl->n;
	flight_land(kc, fl, rc);
	free(fl);
}

/* Device eviction whose demotions go out as one copy through copy_start. */
static uint32_t evict_dev_later(struct kvp_index *kc, uint32_t want)
{
	struct kvp_pages *hp = kc->tier[KVP_TIER_ID_HOST];
	struct kvp_index_flight *fl;
	uint64_t cap = kc->st.evictable_pages[KVP_TIER_ID_DEVICE];
	uint32_t n = 0, i;
	int r;

	if (!hp || !kc->conf.copy_start)
		return evict_dev(kc, want);
	cap = cap < want ? cap : want;
	if (!cap || !(fl = malloc(sizeof(*fl) + 3 * cap * sizeof(uint32_t))))
		return evict_dev(kc, want);
	fl->idx = fl->v;
	fl->src = fl->v + cap;
	fl->dst = fl->v + 2 * cap;
	while (n < cap && (i = coldest(kc, LIST_DEV)) != NONE) {
		if (!kvp_pages_count(hp, KVP_PAGE_FREE))
			evict_host(kc, 1); /* a host leaf: never a locked or device entry */
		if (kvp_pages_alloc(hp, 1, &fl->dst[n]) < 0)
			break;
		kvp_pages_move(hp, fl->dst[n], KVP_PAGE_LEASED, KVP_PAGE_MOVING);
		fl->idx[n] = i;
		fl->src[n] = kc->ent[i].page;
		lock_get(kc, i); /* off the eviction list until the copy lands */
		kc->ent[i].flying = 1;
		if (kc->ent[i].parent != NONE) { /* its parent may go in the same copy */
			nd_add(kc, kc->ent[i].parent, -1);
			refresh_at(kc, kc->ent[i].parent, true);
		}
		n++;
	}
	fl->n = n;
	if (!n) {
		free(fl);
		return evict_dev(kc, want);
	}
	r = kc->conf.copy_start(kc->conf.copy_ctx, fl->src, fl->dst, n, fl);
	if (r == 1) {
		fl->prev = NULL;
		fl->next = kc->flights;
		if (kc->flights)
			kc->flights->prev = fl;
		kc->flights = fl;
		kc->st.flights++;
		kc->st.inflight_pages += n;
		kc->st.moving_pages += n;
		return n < want ? evict_dev(kc, want - n) : 0;
	}
	flight_land(kc, fl, r < 0 ? r : 0);
	free(fl);
	if (r < 0)
		return 0; /* the copy failed: everything as it was */
	return n + (n < want ? evict_dev(kc, want - n) : 0);
}

uint32_t kvp_index_evict_later(struct kvp_index *kc, enum kvp_tier_id tier, uint32_t pages)
{
	if (!kc || (unsigned)tier >= KVP_TIER_ID_MAX || !kc->tier[tier] || !pages)
		return 0;
	return tier == KVP_TIER_ID_DEVICE ? evict_dev_later(kc, pages) : evict_host(kc, pages);
}

uint32_t kvp_index_flush(struct kvp_index *kc)
{
	uint32_t *stack, sp = 0, freed = 0;

	if (!kc || !kc->st.entries)
		return 0;
	stack = malloc((size_t)kc->ent_hw * sizeof(*stack));
	if (!stack) { /* without scratch: leaves one by one through the lists */
		kvp_index_spill_fn spill = kc->spill, land = kc->landed; /* a flush is no spill */
		uint32_t f;

		kc->spill = kc->landed = NULL;
		while ((f = evict_host(kc, UINT32_MAX) + evict_dev(kc, UINT32_MAX)) != 0)
			freed += f;
		kc->spill = spill;
		kc->landed = land;
		return freed;
	}
	for (uint32_t i = 0; i < kc->ent_hw; i++) {
		const struct kc_entry *e = &kc->ent[i];

		if (e->list != LIST_FREE && !e->lock && !e->nchild)
			stack[sp++] = i;
	}
	while (sp) {
		uint32_t i = stack[--sp], p = kc->ent[i].parent;

		entry_drop(kc, i);
		freed++;
		if (p != NONE && !kc->ent[p].lock && !kc->ent[p].nchild)
			stack[sp++] = p;
	}
	free(stack);
	return freed;
}

/* ---- stats, check ---- */

void kvp_index_stats(const struct kvp_index *kc, struct kvp_index_stats *st)
{
	if (!st)
		return;
	if (!kc) {
		memset(st, 0, sizeof(*st));
		return;
	}
	*st = kc->st;
}

double kvp_index_bytes_per_page(const struct kvp_index *kc)
{
	if (!kc || !kc->st.entries)
		return 0;
	return (double)sizeof(struct kc_entry) +
	       (double)kc->nbuckets * sizeof(*kc->buckets) / (double)kc->st.entries;
}

/* Counts entry e's pages into sum as acct does. */
static void acct_into(struct kvp_index_stats *sum, const struct kc_entry *e)
{
	sum->cached_pages[e->tier]++;
	if (e->lock)
		sum->protected_pages[e->tier]++;
	else if (!stuck(e))
		sum->evictable_pages[e->tier]++;
}

static int check_lists(const struct kvp_index *kc, const uint64_t inlist[3])
{
	for (int l = LIST_DEV; l <= LIST_HOST; l++) {
		uint64_t cnt = 0;

		for (uint32_t c = 0; c < NLFU; c++) {
			uint32_t prev = NONE;

			for (uint32_t i = kc->lru[l][c].head; i != NONE; i = kc->ent[i].next) {
				if (i >= kc->ent_hw || (int)kc->ent[i].list != l ||
				    cls_of(kc, &kc->ent[i]) != c || kc->ent[i].prev != prev ||
				    ++cnt > inlist[l])
					return -EFAULT;
				prev = i;
			}
			if (kc->lru[l][c].tail != prev)
				return -EFAULT;
		}
		if (cnt != inlist[l])
			return -EFAULT;
	}
	return 0;
}

int kvp_index_check(const struct kvp_index *kc)
{
	struct kvp_index_stats sum = { 0 };
	uint32_t *nchild = NULL, *ndchild = NULL, *nscount = NULL;
	uint8_t *seen[KVP_TIER_ID_MAX] = { NULL, NULL };
	uint64_t live = 0, inlist[3] = { 0, 0, 0 }, md, kb = 0, nfree = 0, nsl = 0, tok = 0;
	int r = -ENOMEM;

	if (!kc)
		return -EFAULT;
	nchild = calloc((size_t)kc->ent_hw + 1, sizeof(*nchild));
	ndchild = calloc((size_t)kc->ent_hw + 1, sizeof(*ndchild));
	nscount = calloc((size_t)kc->nsr_hw + 1, sizeof(*nscount));
	for (int t = 0; t < KVP_TIER_ID_MAX; t++)
		if (kc->tier[t] && !(seen[t] = calloc(kvp_pages_total(kc->tier[t]), 1)))
			goto out;
	if (!nchild || !ndchild || !nscount)
		goto out;
	r = -EFAULT;
	for (uint32_t i = 0; i < kc->ent_hw; i++) {
		const struct kc_entry *e = &kc->ent[i];
		struct kvp_key k;
		struct kvp_pages *tp;

		if (e->list == LIST_FREE) {
			nfree++;
			continue;
		}
		live++;
		tp = kc->tier[e->tier];
		if (!tp || e->page >= kvp_pages_total(tp) || seen[e->tier][e->page] ||
		    kvp_pages_state(tp, e->page) != KVP_PAGE_CACHED)
			goto out;
		seen[e->tier][e->page] = 1;
		if (e->ns >= kc->nsr_hw || !kc->nsr[e->ns].used)
			goto out;
		nscount[e->ns]++;
		k.len = e->klen1 + 1u;
		k.data = key_at(kc, e);
		if (e->tok) {
			const struct kc_entry *pe =
				e->parent < kc->ent_hw ? &kc->ent[e->parent] : NULL;
			const uint32_t *t = (const uint32_t *)(const void *)tokens_at(kc, e);
			uint8_t want[KVP_PAGE_KEY_BYTES];

			tok++;
			if ((e->parent != NONE && (!pe || !pe->tok)) ||
			    (e->klen1 && k.len != sizeof(want)) ||
			    tok_hash(kc, kc->nsr[e->ns].ns, pe ? pe->hash : 0, t) != e->hash ||
			    find_tok(kc, e->ns, e->hash, e->parent, t) != i)
				goto out;
			/* a key derived is its parent's chain (the parent's derived first) */
			if (key_derived(e)) {
				if (pe && !key_derived(pe))
					goto out;
				kvp_page_key(pe ? key_at(kc, pe) : NULL, t, kc->conf.page_tokens,
					     want);
				if (memcmp(want, k.data, sizeof(want)))
					goto out;
			}
		} else if (key_hash(kc, kc->nsr[e->ns].ns, k.data, k.len) != e->hash ||
			   find(kc, e->ns, e->hash, &k) != i) {
			goto out;
		} else if (e->parent != NONE && e->parent < kc->ent_hw && kc->ent[e->parent].tok) {
			goto out;
		}
		if (e->parent != NONE) {
			if (e->parent >= kc->ent_hw || kc->ent[e->parent].list == LIST_FREE)
				goto out;
			nchild[e->parent]++;
			ndchild[e->parent] += e->tier == KVP_TIER_ID_DEVICE && !e->flying;
		}
		if ((int)e->list != want_list(kc, e))
			goto out;
		kb += e->flying; /* counted against the flights below, then reset */
		if (e->list != LIST_NONE)
			inlist[e->list]++;
		acct_into(&sum, e);
	}
	if (live != kc->st.entries || tok != kc->st.token_entries || nfree != kc->nfree ||
	    check_lists(kc, inlist) < 0)
		goto out;
	for (uint32_t i = 0; i < kc->ent_hw; i++)
		if (kc->ent[i].list != LIST_FREE &&
		    (kc->ent[i].nchild != nchild[i] || kc->ent[i].ndchild != ndchild[i]))
			goto out;
	for (uint32_t i = 0; i < kc->nsr_hw; i++) {
		if (!kc->nsr[i].used)
			continue;
		nsl++;
		if (!nscount[i] || nscount[i] != kc->nsr[i].count ||
		    ns_find(kc, kc->nsr[i].ns) != i)
			goto out;
	}
	if (nsl != kc->st.namespaces)
		goto out;
	for (int t = 0; t < KVP_TIER_ID_MAX; t++)
		if (sum.cached_pages[t] != kc->st.cached_pages[t] ||
		    sum.evictable_pages[t] != kc->st.evictable_pages[t] ||
		    sum.protected_pages[t] != kc->st.protected_pages[t] ||
		    (!kc->tier[t] && sum.cached_pages[t]))
			goto out;
	md = sizeof(*kc) + (uint64_t)kc->nbuckets * sizeof(*kc->buckets) +
	     (uint64_t)kc->ent_cap * sizeof(*kc->ent) + (uint64_t)kc->nsr_cap * sizeof(*kc->nsr) +
	     (uint64_t)kc->nsmap_cap * sizeof(*kc->nsmap) +
	     (uint64_t)kc->holds_cap * sizeof(*kc->holds);
	if (kb != kc->st.inflight_pages)
		goto out;
	kb = 0;
	for (uint32_t c = 0; c < NSLAB; c++)
		kb += (uint64_t)kc->slab[c].cap * slab_sz(kc, c);
	if (md != kc->st.metadata_bytes || kb != kc->st.key_bytes)
		goto out;
	nfree = 0; /* now the pages in flight */
	nsl = 0;   /* and the flights */
	for (const struct kvp_index_flight *fl = kc->flights; fl; fl = fl->next) {
		nsl++;
		for (uint32_t k = 0; k < fl->n; k++) {
			const struct kc_entry *e;
			uint32_t d = fl->dst[k];

			if (fl->idx[k] >= kc->ent_hw || !kc->tier[KVP_TIER_ID_HOST])
				goto out;
			e = &kc->ent[fl->idx[k]];
			if (e->list == LIST_FREE || !e->lock || !e->flying ||
			    e->tier != KVP_TIER_ID_DEVICE || e->page != fl->src[k] ||
			    d >= kvp_pages_total(kc->tier[KVP_TIER_ID_HOST]) ||
			    seen[KVP_TIER_ID_HOST][d] ||
			    kvp_pages_state(kc->tier[KVP_TIER_ID_HOST], d) != KVP_PAGE_MOVING)
				goto out;
			seen[KVP_TIER_ID_HOST][d] = 1;
			nfree++;
		}
	}
	if (nsl != kc->st.flights || nfree != kc->st.inflight_pages ||
	    nfree + kc->holds_gone != kc->st.moving_pages)
		goto out;
	nsl = 0;				       /* now the holds */
	for (uint32_t h = 0; h < kc->holds_cap; h++) { /* a live entry's page, or MOVING */
		const struct kc_hold *x = &kc->holds[h];

		if (!x->used)
			continue;
		if (x->gone ? !kc->tier[KVP_TIER_ID_HOST] ||
				      kvp_pages_state(kc->tier[KVP_TIER_ID_HOST], x->page) !=
					      KVP_PAGE_MOVING
			    : x->idx >= kc->ent_hw || kc->ent[x->idx].list == LIST_FREE ||
				      !kc->ent[x->idx].held || kc->ent[x->idx].page != x->page)
			goto out;
		nsl++;
		nfree += x->gone;
	}
	if (nsl != kc->nholds || nfree != kc->st.inflight_pages + kc->holds_gone)
		goto out;
	r = 0;
out:
	free(nchild);
	free(ndchild);
	free(nscount);
	for (int t = 0; t < KVP_TIER_ID_MAX; t++)
		free(seen[t]);
	return r;
}
