/* prefix.h - prefix cache of one pool: a radix tree of page-aligned token ids whose values are
 * page ids in the pool's device or host tier, with locks, LRU/LFU eviction, demotion of device
 * pages to host pages and promotion back. Single-threaded: the daemon's event loop owns it. */
#pragma once
#include <stdint.h>

#include "kv_copy.h" /* enum kvp_copy_dir */
#include "pages.h"

enum kvp_tier_id {
	KVP_TIER_ID_DEVICE = 0,
	KVP_TIER_ID_HOST = 1,
	KVP_TIER_ID_MAX,
};

/* Named KVP_EVICT_POLICY_* because config.h already owns KVP_EVICT_LRU/LFU/MAX. */
enum kvp_evict_policy {
	KVP_EVICT_POLICY_LRU = 0, /* least recently matched or inserted first */
	KVP_EVICT_POLICY_LFU,	  /* fewest match hits first, ties by LRU */
	KVP_EVICT_POLICY_MAX,
};

/* Copies n pages' K/V bytes between tiers: src ids in the source tier, dst ids in the
 * destination tier. Returns 0 or a negative errno. */
typedef int (*kvp_prefix_copy_fn)(void *ctx, enum kvp_copy_dir dir, const uint32_t *src,
				  const uint32_t *dst, uint32_t n);

/* A demotion whose copy is in flight (opaque). */
struct kvp_prefix_flight;

/* Starts demoting n device pages src[] into host pages dst[] (the arrays live until the
 * flight ends). Returns 0 when the bytes are in place already; 1 when they land later: the
 * caller then calls kvp_prefix_demote_done(pfx, fl, rc) exactly once, on the tree's thread;
 * or a negative errno (nothing was started). */
typedef int (*kvp_prefix_copy_start_fn)(void *ctx, const uint32_t *src, const uint32_t *dst,
					uint32_t n, struct kvp_prefix_flight *fl);

struct kvp_prefix_conf {
	uint32_t page_tokens; /* 1 .. 65536 */
	enum kvp_evict_policy policy;
	struct kvp_pages *dev;	 /* NULL when the pool has no device tier */
	struct kvp_pages *host;	 /* NULL when the pool has no host tier */
	kvp_prefix_copy_fn copy; /* required when both tiers exist */
	void *copy_ctx;
	/* Optional, with copy_ctx: demotions through it may complete later (see
	 * kvp_prefix_demote_done); NULL: demotion copies through copy, synchronously. */
	kvp_prefix_copy_start_fn copy_start;
	uint64_t (*now)(void *ctx); /* monotonic clock seam; NULL = CLOCK_MONOTONIC ns */
	void *now_ctx;
};

struct kvp_prefix;	/* opaque */
struct kvp_prefix_node; /* opaque; a lock handle is a node pointer */

/* Returns a new, empty tree; NULL on a bad conf (page_tokens 0 or above 65536, bad policy, no
 * tier, dev == host, two tiers without copy), ENOMEM, or no randomness for the hash seed. The
 * allocators must outlive the tree. */
struct kvp_prefix *kvp_prefix_new(const struct kvp_prefix_conf *conf);
/* Accepts NULL. Does not touch the allocators' page states. */
void kvp_prefix_free(struct kvp_prefix *pfx);
/* Whether namespace ns holds pages in the tree now. */
int kvp_prefix_has_ns(const struct kvp_prefix *pfx, uint64_t ns);
/* The tree's hash seed, from getrandom(2) at kvp_prefix_new (for tests). */
uint64_t kvp_prefix_seed(const struct kvp_prefix *pfx);

struct kvp_insert_result {
	uint32_t new_pages;  /* pages the tree took: new positions and host->device upgrades */
	uint32_t dup_pages;  /* pages left LEASED for the caller to free (listed in dup_idx) */
	uint32_t done_pages; /* positions processed: npages, or the first lost named position */
};

/* Inserts tokens[0 .. npages * page_tokens) in namespace ns with pages[] (npages entries, one
 * per page position): a page id LEASED in tier `tier`, or KVP_PAGE_NONE for a position the
 * caller matched earlier and holds no page for. A page at a new position moves LEASED ->
 * CACHED and belongs to the tree. A page whose position is already cached stays LEASED and its
 * index goes to dup_idx (ascending; room for npages entries; may be NULL); the caller frees it.
 * Upgrade: when the position holds an unlocked host page and `tier` is the device, the tree
 * takes the device page and frees the host page (counted in new_pages; the upgraded pages of a
 * node are a run from its first host page, so a KVP_PAGE_NONE there ends the run and the device
 * pages after it are duplicates). A KVP_PAGE_NONE position that is not cached (evicted since the
 * match) ends the insert: nothing from it on is cached and the pages past it stay LEASED,
 * neither taken nor listed; done_pages says where it stopped. Everything is validated before
 * anything changes. Returns 0 and fills *res (may be NULL); -EINVAL (NULL pointer, npages 0,
 * tier absent, a page not LEASED in that tier or listed twice); -ENOMEM. Nothing changes on
 * failure. */
int kvp_prefix_insert(struct kvp_prefix *pfx, uint64_t ns, const uint32_t *tokens, uint32_t npages,
		      enum kvp_tier_id tier, const uint32_t *pages, struct kvp_insert_result *res,
		      uint32_t *dup_idx);

struct kvp_prefix_match {
	uint32_t dev_pages;	      /* leading run of device-resident pages written to dev[] */
	uint32_t host_pages;	      /* following run of host-resident pages written to host[] */
	struct kvp_prefix_node *lock; /* the handle when locked and non-empty; else NULL */
};

/* Longest cached prefix of tokens[0 .. ntokens) in namespace ns, whole pages only (ntokens need
 * not be aligned): device pages first, then the host-resident continuation; the match stops at a
 * device page that follows a host page. dev[] and host[] have room for ntokens / page_tokens ids
 * each. With lock != 0 and a non-empty match, pins the matched path (splitting the last node when
 * the match ends inside it) until kvp_prefix_unlock. Matched nodes get their access time set and
 * their hit count bumped. Counts the aligned tokens queried and the tokens hit in the stats.
 * Returns 0; -EINVAL for a NULL pfx or m, or NULL tokens/dev/host with ntokens >= page_tokens;
 * -ENOMEM (a split failed; *m is untouched, dev[]/host[] too). */
int kvp_prefix_match(struct kvp_prefix *pfx, uint64_t ns, const uint32_t *tokens, uint32_t ntokens,
		     int lock, struct kvp_prefix_match *m, uint32_t *dev, uint32_t *host);
/* Drops one lock taken by kvp_prefix_match. The handle must come from this tree and not have
 * been unlocked yet (a handle whose node holds no lock is ignored). Accepts NULL. */
void kvp_prefix_unlock(struct kvp_prefix *pfx, struct kvp_prefix_node *lock);

/* Moves every host-resident page on the locked path (root .. lock) to a newly allocated device
 * page: device pages are taken free first, then by kvp_prefix_evict on the device tier (demote or
 * drop of other unlocked pages); copy PROMOTE; host pages freed; device pages CACHED. Writes the
 * device ids of the whole path, in order, to dev_out and their count to *n.
 * Returns 0; -EINVAL (NULL argument, no device tier, handle holds no lock, cap below the path's
 * page count); -ENOSPC (free + evictable device pages short of what is needed: nothing changed);
 * -EBUSY (a node of the path with host pages is also pinned by another lock, whose holder may be
 * reading those host pages: nothing changed; read them where they are, or retry once the other
 * lock is released); -ENOMEM; or copy's error (the path is unchanged then, but pages evicted to
 * make room stay evicted). So host page ids a lock holder got from match stay valid for as long
 * as it holds the lock. */
int kvp_prefix_promote(struct kvp_prefix *pfx, struct kvp_prefix_node *lock, uint32_t *dev_out,
		       uint32_t cap, uint32_t *n);

/* Frees up to `pages` pages of `tier`, coldest first by the policy, deepest first: a device page
 * goes only when no device page is cached below it, a host page only when nothing is cached
 * below it. Device pages are demoted when a host tier exists and a host page can be had (free,
 * or by evicting unlocked host leaves, never an ancestor of the page being demoted); otherwise
 * dropped. Locked pages are never evicted. Frees exactly min(pages, evictable_pages[tier]) in
 * that tier (eviction is per page, not per node), unless a copy fails on a page that cannot be
 * dropped instead: then it stops early. Returns the number of pages freed in `tier`. */
uint32_t kvp_prefix_evict(struct kvp_prefix *pfx, enum kvp_tier_id tier, uint32_t pages);
/*
 * Demotions in flight (conf.copy_start returned 1). While one is in flight:
 *  - its device pages stay CACHED in the tree, readable and matched as device pages, on a path
 *    the flight holds locked (so they count as protected, are never evicted, flushed or
 *    promoted: promotion through that path is -EBUSY), and they are not yet free;
 *  - its host pages are MOVING (reserved, in no lease and not in the tree): nothing can match
 *    or read them before the copy is done.
 * kvp_prefix_demote_done(rc == 0) then swaps the pages into the tree as the synchronous
 * demotion does (device pages freed, host pages CACHED, wherever splits moved the pages on the
 * path meanwhile) and unlocks; rc < 0 frees the host pages and leaves the tree as it was.
 * kvp_prefix_evict counts pages whose demotion started toward `pages` but returns only those
 * freed now; the stats' inflight_pages says how many device pages will be freed by flights.
 */
void kvp_prefix_demote_done(struct kvp_prefix *pfx, struct kvp_prefix_flight *fl, int rc);
/* kvp_prefix_evict with every demotion synchronous (through conf.copy), for callers that need
 * the pages at once (kvp_prefix_promote's own eviction works so too). */
uint32_t kvp_prefix_evict_now(struct kvp_prefix *pfx, enum kvp_tier_id tier, uint32_t pages);
/* Drops every unlocked page in both tiers (admin Flush). Returns the pages freed. */
uint32_t kvp_prefix_flush(struct kvp_prefix *pfx);

/* What a hook keeps for the path before a node (its chained page hash there): the tree
 * stores it with the node, forgets it when the node is split (the node's first page changes),
 * and frees it with the node. ok is the hook's: 0 until it writes v. */
#define KVP_PREFIX_MEMO_BYTES 32
struct kvp_prefix_memo {
	uint8_t ok;
	uint8_t v[KVP_PREFIX_MEMO_BYTES];
};

/* One node's part of the path a hook is given, the root side first. */
struct kvp_prefix_seg {
	const uint32_t *tokens; /* npages * page_tokens token ids */
	uint32_t npages;
	bool first;		      /* the path starts here (nothing before it) */
	struct kvp_prefix_memo *memo; /* the path before this segment; NULL: none kept (memory) */
};

/* The remote tier's view of host pages leaving the tree by eviction: called with their bytes
 * still in place, before the pages are released. ns: the namespace; segs[0 .. nsegs): the path
 * through the last evicted page, from the root or from the first node whose memo is ok (what
 * comes before it is in that memo), so a hook that keeps its chain state in the memos does work
 * in proportion to the node, not the path; pages[0 .. k): the host page ids of the last k
 * positions of that path (the pages evicted). Valid only during the call, which must not change
 * the tree (the memos excepted). */
typedef void (*kvp_prefix_spill_fn)(void *ctx, uint64_t ns, const struct kvp_prefix_seg *segs,
				    uint32_t nsegs, const uint32_t *pages, uint32_t k);
/* Sets (fn NULL: clears) the spill hook. Flush does not call it (an admin drop is not a spill). */
void kvp_prefix_set_spill(struct kvp_prefix *pfx, kvp_prefix_spill_fn fn, void *ctx);
/* Sets (fn NULL: clears) the hook for device pages that land in the host tier by demotion
 * (synchronous or a flight's): called as the spill hook is, once they are the tree's host pages
 * with their bytes in place; tokens: the path through the last of them. */
void kvp_prefix_set_landed(struct kvp_prefix *pfx, kvp_prefix_spill_fn fn, void *ctx);

struct kvp_prefix_stats {
	uint64_t cached_pages[KVP_TIER_ID_MAX];
	/* Unlocked cached pages that eviction can free now. Host pages that sit above a cached
	 * device page (made by inserting device pages below host pages that were locked or named
	 * with KVP_PAGE_NONE) count only once the device pages below are gone, so cached may
	 * exceed evictable + protected. */
	uint64_t evictable_pages[KVP_TIER_ID_MAX];
	uint64_t protected_pages[KVP_TIER_ID_MAX]; /* cached pages on locked paths */
	uint64_t nodes;				   /* tree nodes, one root per namespace included */
	uint64_t hit_tokens, queried_tokens;
	uint64_t evicted_pages[KVP_TIER_ID_MAX]; /* freed from a tier by evict/flush (demotions too)
						  */
	uint64_t demoted_pages, promoted_pages;
	/* Demotions in flight: device pages being copied (cached and protected until done) and
	 * host pages reserved for them (MOVING), flights. */
	uint64_t inflight_pages, moving_pages, flights;
	/* Bytes the tree asked malloc for, token ids included (heap capacity reserved by a call
	 * that then failed with -ENOMEM stays counted: it is kept for the next call). */
	uint64_t metadata_bytes;
};
/* Copies the counters. O(1). */
void kvp_prefix_stats(const struct kvp_prefix *pfx, struct kvp_prefix_stats *st);

/* Top prefixes by hits for `kvpoolctl cache`. */
struct kvp_prefix_top {
	uint32_t tokens; /* length of the path to the node, in tokens */
	uint64_t hits;
	uint64_t ns;
};
/* Writes up to cap entries, most hits first (ties: shorter first). Returns how many. */
uint32_t kvp_prefix_top(const struct kvp_prefix *pfx, struct kvp_prefix_top *out, uint32_t cap);

/* One node as kvp_prefix_walk shows it: its path from the namespace root through the node is
 * path_pages pages (kvp_prefix_entry_tokens writes their tokens), the node's own pages at
 * positions [start, path_pages): the first ndev in the device tier, the rest in the host
 * tier. */
struct kvp_prefix_entry {
	uint64_t ns;
	const struct kvp_prefix_node *node;
	uint32_t path_pages, start, ndev;
	const uint32_t *pages; /* path_pages - start ids */
	uint32_t hits;
};
/* Calls fn for every node holding pages (any order; a restore inserts shorter paths first).
 * fn's nonzero return stops the walk and is returned. 0 or fn's value. */
int kvp_prefix_walk(const struct kvp_prefix *pfx,
		    int (*fn)(void *ctx, const struct kvp_prefix_entry *e), void *ctx);
/* Writes the tokens of e's path (path_pages * page_tokens ids, in host order) to dst, which
 * need not be aligned. Valid while the walk's fn runs. */
void kvp_prefix_entry_tokens(const struct kvp_prefix *pfx, const struct kvp_prefix_entry *e,
			     void *dst);
/* The path a lock handle pins: its namespace and tokens (root .. the handle's node, *npages
 * pages), in a malloc'd array the caller frees. 0, -EINVAL (NULL), -ENOMEM. */
int kvp_prefix_lock_path(const struct kvp_prefix *pfx, const struct kvp_prefix_node *lock,
			 uint64_t *ns, uint32_t **tokens, uint32_t *npages);
/* Sets the hit count of the node holding position npages - 1 of the cached path tokens[0 ..
 * npages * page_tokens) in ns to at least hits (a restore). 0, or -ENOENT when not cached. */
int kvp_prefix_set_hits(struct kvp_prefix *pfx, uint64_t ns, const uint32_t *tokens,
			uint32_t npages, uint32_t hits);

/* Full consistency check for tests: tree structure and hash index, counters equal the stats,
 * every page in the tree CACHED in its tier's allocator and the allocators' CACHED counts equal
 * the tree's, no page twice, lock counts consistent, eviction heaps exact.
 * Returns 0, -EFAULT, or -ENOMEM (could not allocate the scratch it needs). */
int kvp_prefix_check(const struct kvp_prefix *pfx);
/* The same when others[t] more pages of tier t are CACHED outside the tree (the pool's key
 * cache): the allocators' CACHED counts must equal the tree's plus those. */
int kvp_prefix_check_shared(const struct kvp_prefix *pfx, const uint64_t others[KVP_TIER_ID_MAX]);
