/* index.h - the one index of a pool's cached pages: every cached page is an entry named by a page
 * key, with locks, leaves-first LRU or LFU eviction, demotion of device pages to host pages
 * (synchronous or as asynchronous copies), promotion back, host-to-device upgrade on insert,
 * spill and landed hooks, an observer of every change, hit counts, flush, walk and check, all once
 * for both kinds of calls:
 *  - key calls name pages by engine-supplied chains of page keys (opaque byte strings of 1 ..
 *    KVP_KEY_MAX bytes, each already folding in its parent);
 *  - token calls name pages by their tokens: the index stores the page's tokens and its parent
 *    link with it, so a lookup compares both and a hash collision can never become a hit; the
 *    page's key, the chained SHA-256 of (the parent page's key, the page's tokens) (kvp_page_key),
 *    is derived when first needed (the hooks, kvp_index_lock_key) and kept.
 * Namespaces of both kinds coexist: a token page and a key page never match each other. Shares the
 * pool's page allocators. Single-threaded: the event loop owns it. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kv_copy.h" /* enum kvp_copy_dir */
#include "page_key.h"
#include "pages.h"

enum kvp_tier_id {
	KVP_TIER_ID_DEVICE = 0,
	KVP_TIER_ID_HOST = 1,
	KVP_TIER_ID_MAX,
};

/* Named KVP_EVICT_POLICY_* because config.h already owns KVP_EVICT_LRU/LFU/MAX. */
enum kvp_evict_policy {
	KVP_EVICT_POLICY_LRU = 0, /* least recently matched or inserted first (clock) */
	KVP_EVICT_POLICY_LFU,	  /* fewest match hits first (power-of-two classes), then LRU */
	KVP_EVICT_POLICY_MAX,
};

/* Copies n pages' K/V bytes between tiers: src ids in the source tier, dst ids in the
 * destination tier. Returns 0 or a negative errno. */
typedef int (*kvp_index_copy_fn)(void *ctx, enum kvp_copy_dir dir, const uint32_t *src,
				 const uint32_t *dst, uint32_t n);

#define KVP_KEY_MAX 64u

/* One key: len bytes at data. */
struct kvp_key {
	size_t len;
	const uint8_t *data;
};

struct kvp_index_flight; /* a demotion copy in flight */
/* Starts copying n device pages src[] to host pages dst[] (DEMOTE). Returns 1 when the copy is
 * in flight (kvp_index_demote_done(fl, rc) is called once it lands, later, on the same thread),
 * 0 when it is already done, or a negative errno (nothing copied). */
typedef int (*kvp_index_copy_start_fn)(void *ctx, const uint32_t *src, const uint32_t *dst,
				       uint32_t n, struct kvp_index_flight *fl);

struct kvp_index_conf {
	struct kvp_pages *dev;	/* NULL when the pool has no device tier */
	struct kvp_pages *host; /* NULL when the pool has no host tier */
	kvp_index_copy_fn copy; /* required when both tiers exist (the pool's tier copy) */
	void *copy_ctx;
	kvp_index_copy_start_fn copy_start; /* optional: kvp_index_evict_later's demotions */
	uint32_t page_tokens;		    /* 1 .. 65536; 0: no token calls */
	enum kvp_evict_policy policy;
	/* Test seam: every table hash is 0, so every lookup walks one chain of colliding pages:
	 * matches must stay exact. */
	bool collide;
};

struct kvp_index;
struct kvp_index_lock; /* a matched run, pinned */

/* A new, empty cache; NULL on a bad conf (no tier, dev == host, two tiers without copy), ENOMEM
 * or no randomness for the hash seed. The allocators must outlive it. */
struct kvp_index *kvp_index_new(const struct kvp_index_conf *conf);
/* The remote tier's view of host pages leaving by eviction: called with the page's bytes still
 * in place, before it is released (ns, keyed: 1 for a key call's page, 0 for a token page, the
 * page's key (a token page's: its kvp_page_key), its host page id). Valid only during the call,
 * which must not change the index. Flush does not call it. fn NULL clears it. */
typedef void (*kvp_index_spill_fn)(void *ctx, uint64_t ns, int keyed, const uint8_t *key,
				   size_t klen, uint32_t page);
void kvp_index_set_spill(struct kvp_index *kc, kvp_index_spill_fn fn, void *ctx);
/* Write-back in place (the disk tier): host pages held for a write that reads them where they
 * are. A held entry stays cached, matched, readable and evictable, and keeps its place in the
 * eviction lists; if it leaves the host tier while held (evicted, flushed, promoted, upgraded),
 * its page is not freed but kept MOVING (counted in moving_pages) until the hold ends, so a write
 * in flight never reads a page that a lease got since. id names the hold; key points into the
 * index and is valid only until the index changes (copy it). */
struct kvp_index_hold {
	uint32_t id, page;
	uint64_t ns;
	int keyed;
	struct kvp_key key;
};
/* Whether a host page (ns, kind, key) is to be written (e.g. not on the disk yet). */
typedef bool (*kvp_index_want_fn)(void *ctx, uint64_t ns, int keyed, const uint8_t *key,
				  size_t klen);
/* Holds up to max host pages that want() asks for, asking about up to scan of them: cold, the
 * next ones eviction would take (the cold end of the host tier's eviction lists, coldest first,
 * each leaf followed by the parents only it names); else every cached host page in turn, from
 * where the last such call stopped (a write-through). Pages held already, or written by an
 * earlier hold, are passed by without a question (16 per question at most). Writes the holds to
 * out (room for max) and returns how many (0 on ENOMEM). */
uint32_t kvp_index_hold(struct kvp_index *kc, bool cold, uint32_t max, uint32_t scan,
			kvp_index_want_fn want, void *ctx, struct kvp_index_hold *out);
/* Ends hold id: its page is freed now when its entry left the host tier meanwhile; written says
 * whether its write landed (later walks pass the page by). */
void kvp_index_unhold(struct kvp_index *kc, uint32_t id, bool written);
/* Sets (fn NULL: clears) the hook for device pages that land in the host tier by demotion
 * (synchronous or a flight's), called as the spill hook is with the entry's new host page. */
void kvp_index_set_landed(struct kvp_index *kc, kvp_index_spill_fn fn, void *ctx);
/* What the observer hook sees: a page stored in a tier (a new entry, or one that moved there),
 * or removed from one (dropped, or moved away: a move is a removal from the old tier then a
 * store in the new one). key: the page's key (a token page's: its kvp_page_key, derived for the
 * hook); parent: its parent's key, 0 bytes for a chain's first page; tokens: a token page's
 * page_tokens ids, NULL for a key call's page. Valid only during the call. */
enum kvp_index_change {
	KVP_INDEX_STORED = 0,
	KVP_INDEX_REMOVED,
	KVP_INDEX_CHANGE_MAX,
};
struct kvp_index_event {
	enum kvp_index_change change;
	enum kvp_tier_id tier;
	uint64_t ns;
	int keyed;
	struct kvp_key key, parent;
	const uint32_t *tokens;
	uint32_t ntokens;
};
/* Called on every change, on the index's thread; it must not change the index. One branch when
 * unset. Flush and restores (kvp_index_put) are changes too. fn NULL clears it. */
typedef void (*kvp_index_observe_fn)(void *ctx, const struct kvp_index_event *ev);
void kvp_index_set_observer(struct kvp_index *kc, kvp_index_observe_fn fn, void *ctx);
/* Tells the observer of every cached page as stored in its tier, parents before children (a
 * snapshot); nothing when none is set. */
void kvp_index_observe_all(struct kvp_index *kc);
/* The table hashes' seed, from getrandom(2) at kvp_index_new (for tests). */
uint64_t kvp_index_seed(const struct kvp_index *kc);
/* Accepts NULL. Does not touch the allocators' page states. */
void kvp_index_free(struct kvp_index *kc);

/* Whether namespace ns holds cached pages (of either kind) now. */
int kvp_index_has_ns(const struct kvp_index *kc, uint64_t ns);

struct kvp_index_insert_result {
	uint32_t new_pages; /* pages the index took: new entries and host-to-device upgrades */
	uint32_t dup_pages; /* keys already cached: their pages stay LEASED, listed in dup_idx */
	uint32_t done_keys; /* keys processed: n, or the first of the first `cached` not present */
};

/* Inserts the chain keys[0 .. n) of namespace ns: keys[0 .. cached) must be cached already (the
 * caller matched them, holds no page for them); keys[cached + i] gets pages[i], a LEASED page of
 * `tier`, which moves to CACHED and belongs to the cache; its parent is the entry of the key
 * before it. A key already cached keeps its page, and pages[i]'s index i goes to dup_idx (room
 * for n - cached entries; may be NULL): the caller frees it. A key of keys[0 .. cached) no longer
 * cached ends the insert there: nothing from it on is taken, res->done_keys says where.
 * Upgrade: a key cached in an unlocked host entry, offered a device page, takes the device page
 * and frees its host page (counted in new_pages).
 * Everything is validated first. Returns 0; -EINVAL (NULL pointer, n 0, cached > n, a key of 0
 * or above KVP_KEY_MAX bytes, tier absent, a page not LEASED in that tier or listed twice);
 * -ENOMEM. Nothing changes on failure. */
int kvp_index_insert(struct kvp_index *kc, uint64_t ns, const struct kvp_key *keys, uint32_t n,
		     uint32_t cached, enum kvp_tier_id tier, const uint32_t *pages,
		     struct kvp_index_insert_result *res, uint32_t *dup_idx);

struct kvp_index_match {
	uint32_t dev_pages;	     /* leading run of device-resident pages written to dev[] */
	uint32_t host_pages;	     /* following run of host-resident pages written to host[] */
	struct kvp_index_lock *lock; /* when locked and non-empty; else NULL */
};

/* The longest leading run of keys[0 .. n) cached in ns: device pages first, then the host
 * continuation (the run stops at a device page after a host page). dev[] and host[] have room
 * for n ids each (either may be NULL for an exists query, with lock 0). Matched entries are
 * marked referenced for the LRU and their hits bumped. With lock and a non-empty run, pins it
 * until kvp_index_unlock. Returns 0; -EINVAL (NULL kc or m); -ENOMEM (the lock record). */
int kvp_index_match(struct kvp_index *kc, uint64_t ns, const struct kvp_key *keys, uint32_t n,
		    int lock, struct kvp_index_match *m, uint32_t *dev, uint32_t *host);
/* Token calls. Inserts tokens[0 .. npages * page_tokens) of namespace ns page by page: pages[i]
 * is a LEASED page of `tier` for page position i, or KVP_PAGE_NONE for a position the caller
 * matched earlier and holds no page for. A page at a new position moves to CACHED and belongs to
 * the index; at a cached position it is a duplicate (its index i in dup_idx, room for npages),
 * or upgrades an unlocked host entry when tier is the device (as kvp_index_insert). A
 * KVP_PAGE_NONE position not cached (evicted since the match) ends the insert there:
 * done_keys says where. Validated first: 0; -EINVAL (NULL pointer, npages 0, no token calls,
 * tier absent, a page not LEASED in that tier or listed twice); -ENOMEM. Nothing changes on
 * failure. */
int kvp_index_insert_tokens(struct kvp_index *kc, uint64_t ns, const uint32_t *tokens,
			    uint32_t npages, enum kvp_tier_id tier, const uint32_t *pages,
			    struct kvp_index_insert_result *res, uint32_t *dup_idx);
/* The longest cached run of whole pages of tokens[0 .. ntokens) in ns (ntokens need not be
 * aligned), as kvp_index_match: dev[] and host[] have room for ntokens / page_tokens ids. */
int kvp_index_match_tokens(struct kvp_index *kc, uint64_t ns, const uint32_t *tokens,
			   uint32_t ntokens, int lock, struct kvp_index_match *m, uint32_t *dev,
			   uint32_t *host);

/* Count of leading keys of keys[0 .. n) cached in ns (no lock, no hit counted). */
uint32_t kvp_index_exists(struct kvp_index *kc, uint64_t ns, const struct kvp_key *keys,
			  uint32_t n);
/* Drops a lock and frees its record. Accepts NULL. */
void kvp_index_unlock(struct kvp_index *kc, struct kvp_index_lock *lock);
/* Pages the lock pins. */
uint32_t kvp_index_lock_pages(const struct kvp_index_lock *lock);
/* Host pages of the lock's run (what a promotion needs in device pages). */
uint32_t kvp_index_lock_host_pages(const struct kvp_index *kc, const struct kvp_index_lock *lock);

/* Moves every host page of the locked run to a free device page (copy PROMOTE, host page
 * freed), making room first by evicting other unlocked device pages (demoted or dropped,
 * synchronously). Writes the run's device ids to dev_out (cap entries) and
 * their count to *n. 0; -EINVAL (NULL argument, no device tier, cap too small); -ENOSPC (fewer
 * free and evictable device pages than host pages in the run: nothing changed; pages evicted
 * to make room stay evicted); -EBUSY (a host entry of the
 * run is pinned by another lock too: nothing changed); -ENOMEM; or copy's error (unchanged). */
int kvp_index_promote(struct kvp_index *kc, struct kvp_index_lock *lock, uint32_t *dev_out,
		      uint32_t cap, uint32_t *n);

/* Frees up to `pages` pages of tier: unlocked leaves first (a host entry goes only when no entry
 * names it as parent, a device entry only when no device entry does), least recently used first
 * (a referenced entry gets a second pass). Device pages are demoted to host pages when a host
 * tier exists and a host page can be had (free, or by evicting unlocked host leaves); otherwise
 * dropped when they are leaves. Returns the pages freed in tier. */
uint32_t kvp_index_evict(struct kvp_index *kc, enum kvp_tier_id tier, uint32_t pages);
/* Drops every unlocked entry no locked entry depends on (admin Flush). Returns pages freed. */
uint32_t kvp_index_flush(struct kvp_index *kc);
/*
 * kvp_index_evict, with the device tier's demotions started through conf.copy_start (one copy
 * for the batch) where it is set. While a copy is in flight:
 *  - its device entries stay cached, readable and matched as device pages, held by a lock of
 *    the flight (protected, never evicted or flushed), their pages not yet free;
 *  - its host pages are MOVING (reserved, in no entry): nothing matches or reads them.
 * kvp_index_demote_done(rc == 0) then frees the device pages and moves the entries to their host
 * pages (CACHED), as the synchronous demotion does, and unlocks; rc < 0 frees the host pages and
 * leaves the entries as they were. Pages whose demotion started count toward `pages` but the
 * result says only those freed now; the stats' inflight_pages says how many device pages the
 * flights will free.
 */
uint32_t kvp_index_evict_later(struct kvp_index *kc, enum kvp_tier_id tier, uint32_t pages);
void kvp_index_demote_done(struct kvp_index *kc, struct kvp_index_flight *fl, int rc);

struct kvp_index_stats {
	uint64_t cached_pages[KVP_TIER_ID_MAX];
	uint64_t evictable_pages[KVP_TIER_ID_MAX]; /* unlocked cached pages */
	uint64_t protected_pages[KVP_TIER_ID_MAX]; /* locked */
	uint64_t entries, namespaces;
	uint64_t token_entries;		     /* of entries, token pages */
	uint64_t hit_keys, queried_keys;     /* key calls */
	uint64_t hit_tokens, queried_tokens; /* token calls (whole pages' tokens) */
	uint64_t evicted_pages[KVP_TIER_ID_MAX];
	uint64_t demoted_pages, promoted_pages;
	uint64_t metadata_bytes; /* entries, table, namespace map; key bytes not included */
	uint64_t key_bytes;	 /* the key slabs (a token page's slot: its key and tokens) */
	/* Demotions in flight: device pages being copied (cached and protected until done), host
	 * pages reserved for them (MOVING), flights. */
	uint64_t inflight_pages, moving_pages, flights;
};
/* Copies the counters. O(1). */
void kvp_index_stats(const struct kvp_index *kc, struct kvp_index_stats *st);
/* Bytes of metadata per cached page now (entry + its share of the hash table). */
double kvp_index_bytes_per_page(const struct kvp_index *kc);

/* One cached entry as kvp_index_walk shows it: idx names it during the walk (parent: its
 * parent's idx, UINT32_MAX for a chain's first key). */
struct kvp_index_entry {
	uint32_t idx, parent;
	uint64_t ns;
	int keyed;		/* 0: a token page, whose tokens (page_tokens ids) follow */
	struct kvp_key key;	/* a token page's: its kvp_page_key, or 0 bytes: not derived yet */
	const uint32_t *tokens; /* token pages */
	enum kvp_tier_id tier;
	uint32_t page, hits;
};
/* Calls fn for every entry (any order). fn's nonzero return stops the walk and is returned. */
int kvp_index_walk(const struct kvp_index *kc,
		   int (*fn)(void *ctx, const struct kvp_index_entry *e), void *ctx);
/* A restore: caches x's page (LEASED in x->tier: it moves to CACHED) as entry *idx of x->ns
 * under parent (an index an earlier call gave, of the same namespace and kind; UINT32_MAX: a
 * chain's first page), with x's key, tokens (a token page's) and hits. 0; -EINVAL (a bad
 * argument, parent or page state); -EEXIST (that page is cached already); -ENOMEM. */
int kvp_index_put(struct kvp_index *kc, const struct kvp_index_entry *x, uint32_t parent,
		  uint32_t *idx);
/* Key i (< kvp_index_lock_pages(lock)) of the run a lock pins, and its namespace; k->data
 * points into the cache (valid until it changes). 0 or -EINVAL. */
int kvp_index_lock_key(struct kvp_index *kc, const struct kvp_index_lock *lock, uint32_t i,
		       struct kvp_key *k, uint64_t *ns);
/* The key of page npages - 1 of tokens[0 .. npages * page_tokens) in ns, when all those pages
 * are cached (derived now if it was not yet): 0, -ENOENT (not all cached), -EINVAL, -ENOMEM.
 * The remote tier chains the keys of the pages after it from there. */
int kvp_index_token_key(struct kvp_index *kc, uint64_t ns, const uint32_t *tokens, uint32_t npages,
			uint8_t out[KVP_PAGE_KEY_BYTES]);
/* Tokens of entry i of a lock's run (page_tokens ids; token pages only), NULL otherwise. */
const uint32_t *kvp_index_lock_tokens(const struct kvp_index *kc, const struct kvp_index_lock *lock,
				      uint32_t i);
/* Whether a lock's run is of token pages. */
bool kvp_index_lock_tokened(const struct kvp_index *kc, const struct kvp_index_lock *lock);

/* The hottest cached pages for `kvpoolctl cache`: chain depth in pages (1 for a chain's first
 * page), hits, namespace, kind. */
struct kvp_index_top {
	uint64_t ns;
	uint32_t pages, hits;
	int keyed;
};
/* Writes up to cap entries, most hits first (ties: shorter first). Returns how many. */
uint32_t kvp_index_top(const struct kvp_index *kc, struct kvp_index_top *out, uint32_t cap);

/* Full consistency check for tests: table, parents and child counts, lock counts, LRU lists,
 * counters, every page CACHED in its tier and listed once. Returns 0, -EFAULT or -ENOMEM. */
int kvp_index_check(const struct kvp_index *kc);
