/* keycache.h - hash-keyed cached pages of one pool: pages named by engine-supplied chains of page
 * keys (opaque byte strings of 1 .. KVP_KEY_MAX bytes, each already folding in its parent), with
 * locks, leaves-first LRU eviction and demotion of device pages to host pages. Shares the pool's
 * page allocators with the token tree (prefix.c). Single-threaded: the event loop owns it. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "pages.h"
#include "prefix.h" /* enum kvp_tier_id, kvp_prefix_copy_fn */

#define KVP_KEY_MAX 64u

/* One key: len bytes at data. */
struct kvp_key {
	size_t len;
	const uint8_t *data;
};

struct kvp_keys_flight; /* a demotion copy in flight */
/* Starts copying n device pages src[] to host pages dst[] (DEMOTE). Returns 1 when the copy is
 * in flight (kvp_keys_demote_done(fl, rc) is called once it lands, later, on the same thread),
 * 0 when it is already done, or a negative errno (nothing copied). */
typedef int (*kvp_keys_copy_start_fn)(void *ctx, const uint32_t *src, const uint32_t *dst,
				      uint32_t n, struct kvp_keys_flight *fl);

struct kvp_keys_conf {
	struct kvp_pages *dev;	 /* NULL when the pool has no device tier */
	struct kvp_pages *host;	 /* NULL when the pool has no host tier */
	kvp_prefix_copy_fn copy; /* required when both tiers exist (the pool's tier copy) */
	void *copy_ctx;
	kvp_keys_copy_start_fn copy_start; /* optional: kvp_keys_evict_later's demotions */
};

struct kvp_keys;
struct kvp_keys_lock; /* a matched run, pinned */

/* A new, empty cache; NULL on a bad conf (no tier, dev == host, two tiers without copy), ENOMEM
 * or no randomness for the hash seed. The allocators must outlive it. */
struct kvp_keys *kvp_keys_new(const struct kvp_keys_conf *conf);
/* The remote tier's view of host pages leaving by eviction: called with the page's bytes still
 * in place, before it is released (ns, the page's key, its host page id). Valid only during the
 * call, which must not change the cache. Flush does not call it. fn NULL clears it. */
typedef void (*kvp_keys_spill_fn)(void *ctx, uint64_t ns, const uint8_t *key, size_t klen,
				  uint32_t page);
void kvp_keys_set_spill(struct kvp_keys *kc, kvp_keys_spill_fn fn, void *ctx);
/* Sets (fn NULL: clears) the hook for device pages that land in the host tier by demotion
 * (synchronous or a flight's), called as the spill hook is with the entry's new host page. */
void kvp_keys_set_landed(struct kvp_keys *kc, kvp_keys_spill_fn fn, void *ctx);
/* Accepts NULL. Does not touch the allocators' page states. */
void kvp_keys_free(struct kvp_keys *kc);

/* Whether namespace ns holds hash-keyed pages now. */
int kvp_keys_has_ns(const struct kvp_keys *kc, uint64_t ns);

struct kvp_keys_insert_result {
	uint32_t new_pages; /* pages the cache took */
	uint32_t dup_pages; /* keys already cached: their pages stay LEASED, listed in dup_idx */
	uint32_t done_keys; /* keys processed: n, or the first of the first `cached` not present */
};

/* Inserts the chain keys[0 .. n) of namespace ns: keys[0 .. cached) must be cached already (the
 * caller matched them, holds no page for them); keys[cached + i] gets pages[i], a LEASED page of
 * `tier`, which moves to CACHED and belongs to the cache; its parent is the entry of the key
 * before it. A key already cached keeps its page, and pages[i]'s index i goes to dup_idx (room
 * for n - cached entries; may be NULL): the caller frees it. A key of keys[0 .. cached) no longer
 * cached ends the insert there: nothing from it on is taken, res->done_keys says where.
 * Everything is validated first. Returns 0; -EINVAL (NULL pointer, n 0, cached > n, a key of 0
 * or above KVP_KEY_MAX bytes, tier absent, a page not LEASED in that tier or listed twice);
 * -ENOMEM. Nothing changes on failure. */
int kvp_keys_insert(struct kvp_keys *kc, uint64_t ns, const struct kvp_key *keys, uint32_t n,
		    uint32_t cached, enum kvp_tier_id tier, const uint32_t *pages,
		    struct kvp_keys_insert_result *res, uint32_t *dup_idx);

struct kvp_keys_match {
	uint32_t dev_pages;	    /* leading run of device-resident pages written to dev[] */
	uint32_t host_pages;	    /* following run of host-resident pages written to host[] */
	struct kvp_keys_lock *lock; /* when locked and non-empty; else NULL */
};

/* The longest leading run of keys[0 .. n) cached in ns: device pages first, then the host
 * continuation (the run stops at a device page after a host page). dev[] and host[] have room
 * for n ids each (either may be NULL for an exists query, with lock 0). Matched entries are
 * marked referenced for the LRU and their hits bumped. With lock and a non-empty run, pins it
 * until kvp_keys_unlock. Returns 0; -EINVAL (NULL kc or m); -ENOMEM (the lock record). */
int kvp_keys_match(struct kvp_keys *kc, uint64_t ns, const struct kvp_key *keys, uint32_t n,
		   int lock, struct kvp_keys_match *m, uint32_t *dev, uint32_t *host);
/* Count of leading keys of keys[0 .. n) cached in ns (no lock, no hit counted). */
uint32_t kvp_keys_exists(struct kvp_keys *kc, uint64_t ns, const struct kvp_key *keys, uint32_t n);
/* Drops a lock and frees its record. Accepts NULL. */
void kvp_keys_unlock(struct kvp_keys *kc, struct kvp_keys_lock *lock);
/* Pages the lock pins. */
uint32_t kvp_keys_lock_pages(const struct kvp_keys_lock *lock);
/* Host pages of the lock's run (what a promotion needs in device pages). */
uint32_t kvp_keys_lock_host_pages(const struct kvp_keys *kc, const struct kvp_keys_lock *lock);

/* Moves every host page of the locked run to a free device page (copy PROMOTE, host page
 * freed); the caller makes room first. Writes the run's device ids to dev_out (cap entries) and
 * their count to *n. 0; -EINVAL (NULL argument, no device tier, cap too small); -ENOSPC (fewer
 * free device pages than host pages in the run: nothing changed); -EBUSY (a host entry of the
 * run is pinned by another lock too: nothing changed); -ENOMEM; or copy's error (unchanged). */
int kvp_keys_promote(struct kvp_keys *kc, struct kvp_keys_lock *lock, uint32_t *dev_out,
		     uint32_t cap, uint32_t *n);

/* Frees up to `pages` pages of tier: unlocked leaves first (a host entry goes only when no entry
 * names it as parent, a device entry only when no device entry does), least recently used first
 * (a referenced entry gets a second pass). Device pages are demoted to host pages when a host
 * tier exists and a host page can be had (free, or by evicting unlocked host leaves); otherwise
 * dropped when they are leaves. Returns the pages freed in tier. */
uint32_t kvp_keys_evict(struct kvp_keys *kc, enum kvp_tier_id tier, uint32_t pages);
/* Drops every unlocked entry no locked entry depends on (admin Flush). Returns pages freed. */
uint32_t kvp_keys_flush(struct kvp_keys *kc);
/*
 * kvp_keys_evict, with the device tier's demotions started through conf.copy_start (one copy
 * for the batch) where it is set. While a copy is in flight:
 *  - its device entries stay cached, readable and matched as device pages, held by a lock of
 *    the flight (protected, never evicted or flushed), their pages not yet free;
 *  - its host pages are MOVING (reserved, in no entry): nothing matches or reads them.
 * kvp_keys_demote_done(rc == 0) then frees the device pages and moves the entries to their host
 * pages (CACHED), as the synchronous demotion does, and unlocks; rc < 0 frees the host pages and
 * leaves the entries as they were. Pages whose demotion started count toward `pages` but the
 * result says only those freed now; the stats' inflight_pages says how many device pages the
 * flights will free.
 */
uint32_t kvp_keys_evict_later(struct kvp_keys *kc, enum kvp_tier_id tier, uint32_t pages);
void kvp_keys_demote_done(struct kvp_keys *kc, struct kvp_keys_flight *fl, int rc);

struct kvp_keys_stats {
	uint64_t cached_pages[KVP_TIER_ID_MAX];
	uint64_t evictable_pages[KVP_TIER_ID_MAX]; /* unlocked cached pages */
	uint64_t protected_pages[KVP_TIER_ID_MAX]; /* locked */
	uint64_t entries, namespaces;
	uint64_t hit_keys, queried_keys;
	uint64_t evicted_pages[KVP_TIER_ID_MAX];
	uint64_t demoted_pages, promoted_pages;
	uint64_t metadata_bytes; /* entries, table, namespace map; key bytes not included */
	uint64_t key_bytes;	 /* the key slabs */
	/* Demotions in flight: device pages being copied (cached and protected until done), host
	 * pages reserved for them (MOVING), flights. */
	uint64_t inflight_pages, moving_pages, flights;
};
/* Copies the counters. O(1). */
void kvp_keys_stats(const struct kvp_keys *kc, struct kvp_keys_stats *st);
/* Bytes of metadata per cached page now (entry + its share of the hash table). */
double kvp_keys_bytes_per_page(const struct kvp_keys *kc);

/* One cached entry as kvp_keys_walk shows it: idx names it during the walk (parent: its
 * parent's idx, UINT32_MAX for a chain's first key). */
struct kvp_keys_entry {
	uint32_t idx, parent;
	uint64_t ns;
	struct kvp_key key;
	enum kvp_tier_id tier;
	uint32_t page, hits;
};
/* Calls fn for every entry (any order). fn's nonzero return stops the walk and is returned. */
int kvp_keys_walk(const struct kvp_keys *kc, int (*fn)(void *ctx, const struct kvp_keys_entry *e),
		  void *ctx);
/* Key i (< kvp_keys_lock_pages(lock)) of the run a lock pins, and its namespace; k->data
 * points into the cache (valid until it changes). 0 or -EINVAL. */
int kvp_keys_lock_key(const struct kvp_keys *kc, const struct kvp_keys_lock *lock, uint32_t i,
		      struct kvp_key *k, uint64_t *ns);
/* Sets the hit count of cached key k of ns to at least hits (a restore). 0 or -ENOENT. */
int kvp_keys_set_hits(struct kvp_keys *kc, uint64_t ns, const struct kvp_key *k, uint32_t hits);

/* Full consistency check for tests: table, parents and child counts, lock counts, LRU lists,
 * counters, every page CACHED in its tier and listed once. Returns 0, -EFAULT or -ENOMEM. */
int kvp_keys_check(const struct kvp_keys *kc);
