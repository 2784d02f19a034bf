/* pool.h - one pool: its tiers' memory and page allocators, leases, and page index.
 * Pool code never touches sockets; failures are typed (struct kvp_fail). */
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "config.h"
#include "fail.h"
#include "index.h"
#include "kv_copy.h"
#include "pages.h"
#include "stats.h"
#include "tier.h"

/* Per-tier figures, in pages. */
struct kvp_tier_counts {
	uint64_t total, free, leased, cached, evictable, protected_;
	uint64_t moving; /* destinations of demotion copies in flight (reserved, not readable) */
};

/* What pool code leaves for the layers above instead of calling up into them: events kept in
 * the pool (at most one of each kind per tier; a later one of the same kind folds into the
 * pending one, which keeps the first figures) until the event loop takes them, after every
 * call it serves (before that call's reply is queued) and every completion it reaps.
 * - short_: bit t: an allocation was about to take more pages of tier t than were free (it
 *   then took back reserves, evicted or failed); before[t] holds the tier's figures from
 *   before it took anything, so the pressure notices it causes say what the tier held.
 * - moved: demotions in flight landed: what waits for their pages can be retried. */
struct kvp_pool_events {
	uint8_t short_;
	struct kvp_tier_counts before[KVP_TIER_ID_MAX];
	uint64_t before_reserved[KVP_TIER_ID_MAX];
	bool moved;
};

struct kvpd_pool {
	uint32_t id;
	struct kvp_pool_conf conf;
	struct kvp_copy_geom geom; /* row bytes, dev slots: the transfer kernels' view */
	uint64_t page_bytes;	   /* one page, all layers, K and V */
	struct kvp_tier_mem mem[KVP_TIER_ID_MAX];
	struct kvp_pages *pages[KVP_TIER_ID_MAX]; /* NULL: the pool has no such tier */
	/* Owning lease of each LEASED page (the lease's owner tag, never its id: a session picks
	 * its local lease ids, so two sessions may hold leases of the same id), else 0. */
	uint64_t *lease_of[KVP_TIER_ID_MAX];
	uint32_t *lease_idx[KVP_TIER_ID_MAX]; /* its index in that lease's page array */
	struct kvp_index *ix;		      /* the cached pages, of token and key calls */
	struct kvp_pool_stats st;
	uint32_t sessions;	       /* attached */
	struct kvp_tier_copy *copy;    /* demotion and promotion: pools with both tiers */
	uint32_t flights;	       /* demotion copies waited for on the worker */
	bool dying;		       /* destroyed with flights left: the last one frees it */
	char note[256];		       /* start-up fallbacks worth a log line */
	struct kvp_index_stats logged; /* figures at the last eviction summary line */
	/* Page reserves (reserve.c): pages of each tier booked to sessions' reserves (counted as
	 * leased), and the hook that takes the unused part of them back before an allocation
	 * evicts or fails (returns pages freed). Unlike the events below it is called in the
	 * allocation: the pages it returns are what that allocation takes. */
	uint64_t reserved[KVP_TIER_ID_MAX];
	uint32_t (*reclaim)(void *ctx, struct kvpd_pool *p, int tier, uint32_t pages);
	void *reclaim_ctx;
	struct kvp_pool_events ev; /* pending for the loop (kvp_pool_events_take) */
	/* Restarts (snapshot.c): tier fds to adopt instead of creating (-1: create) and their
	 * sizes; which tiers were adopted; the pool's books in shared memory. */
	int adopt_fd[KVP_TIER_ID_MAX];
	uint64_t adopt_bytes[KVP_TIER_ID_MAX];
	bool adopted[KVP_TIER_ID_MAX];
	struct kvp_snap *snap;
	uint64_t next_owner; /* the last lease owner tag given out */
	/* What the node still gives the host tier as Status last read it (rpc_admin.c): bytes,
	 * the binding limit, the reader's result, and when (kvp_now_ms; 0: never). */
	uint64_t room_bytes, room_limit, room_ms;
	int room_rc;
};

struct kvp_snap;

struct kvp_lease {
	uint64_t id;	/* as its session names it (unique in that session only) */
	uint64_t owner; /* unique in the pool for its life: what lease_of holds */
	struct kvpd_pool *pool;
	int tier;
	uint32_t n, cap;
	uint32_t *pages;
};

/* Creates the pool's tiers (memory, allocators) and page index. NULL with f filled
 * (UNAVAILABLE for a cuda pool without a usable GPU, HOST_BUDGET_EXCEEDED, INTERNAL). */
struct kvpd_pool *kvp_pool_create(const struct kvp_pool_conf *pc, uint32_t id, struct kvp_fail *f);
/* kvp_pool_create, with the memory of each tier whose fds[t] >= 0 adopted (exactly bytes[t]
 * bytes, through the backend's adopt: never touched nor zeroed) instead of created. The pool's
 * books start empty. Takes every fd given: adopted, or closed (also on failure). */
struct kvpd_pool *kvp_pool_adopt(const struct kvp_pool_conf *pc, uint32_t id,
				 const int fds[KVP_TIER_ID_MAX],
				 const uint64_t bytes[KVP_TIER_ID_MAX], struct kvp_fail *f);
/* Accepts NULL. Leases must be gone (sessions destroyed) before. With demotion copies in
 * flight the pool is freed when the last one lands (no callback for it then). */
void kvp_pool_destroy(struct kvpd_pool *p);

/* Demotions off the loop thread: with w set, a pool whose device backend has copy_start (cuda;
 * sim under KVPOOLD_COPY_DELAY_MS) demotes asynchronously: the worker waits for the copy, then
 * on the loop thread (kvp_work_reap) the pages are swapped in and the pool's MOVED event is
 * raised, so that the daemon retries what waited for them. w NULL: every demotion is
 * synchronous (the default; unit tests). Set by the event loop. */
struct kvp_work;
void kvp_pool_async(struct kvp_work *w);

/* Moves p's pending events into *out and clears them. Returns whether there were any. */
bool kvp_pool_events_take(struct kvpd_pool *p, struct kvp_pool_events *out);
/* Device pages of tier whose demotion is in flight: cached now, free when it lands. */
uint64_t kvp_pool_inflight(const struct kvpd_pool *p, int tier);
/* Whether npages of tier can be had once the demotions in flight land (some are in flight and
 * free + evictable + in flight covers npages): an Alloc refused now may wait for them. */
bool kvp_pool_fits_later(const struct kvpd_pool *p, int tier, uint32_t npages);
bool kvp_pool_has_tier(const struct kvpd_pool *p, int tier);

void kvp_pool_counts(const struct kvpd_pool *p, int tier, struct kvp_tier_counts *out);
/* Fills f's OUT_OF_CAPACITY detail (tier, requested = npages, and the tier's free, evictable,
 * protected, leased, total figures, in tokens). f may be NULL. */
void kvp_pool_capacity_detail(const struct kvpd_pool *p, int tier, uint64_t npages,
			      struct kvp_fail *f);
/* free + leased + cached + moving == total in each tier, allocator and tree consistent. 0 or
 * -EFAULT. */
int kvp_pool_check(const struct kvpd_pool *p);
/* Every page l lists is a LEASED page of its tier that the pool books to l at that index.
 * O(pages of l). 0 or -EFAULT. */
int kvp_lease_check(const struct kvp_lease *l);

/* A new lease of npages pages of tier (free pages first, then evicting unlocked cached
 * prefixes, exactly the shortfall). NULL with f filled: OUT_OF_CAPACITY with its figures,
 * INVALID_ARGUMENT. */
struct kvp_lease *kvp_lease_create(struct kvpd_pool *p, int tier, uint64_t id, uint32_t npages,
				   struct kvp_fail *f);
/* A run lease: npages consecutive FREE pages of tier, the first a multiple of align (>= 1), the
 * lowest such run. Cached pages are not evicted for it: NULL with f filled (OUT_OF_CAPACITY
 * naming the run asked when the free pages hold none; INVALID_ARGUMENT). */
struct kvp_lease *kvp_lease_create_run(struct kvpd_pool *p, int tier, uint64_t id, uint32_t npages,
				       uint32_t align, struct kvp_fail *f);
/* A lease of the n LEASED pages[] of tier (claimed by a restore, owned by no lease) under id.
 * NULL with f filled (INVALID_ARGUMENT: a page not LEASED or already a lease's; INTERNAL). */
struct kvp_lease *kvp_lease_restore(struct kvpd_pool *p, int tier, uint64_t id,
				    const uint32_t *pages, uint32_t n, struct kvp_fail *f);
/* Adds npages pages; the new ids are lease->pages[old n ..]. 0 or negative Code. */
int kvp_lease_grow(struct kvp_lease *l, uint32_t npages, struct kvp_fail *f);
/* Returns the listed pages (all distinct, all in this lease) to the free pool. Nothing
 * changes on failure (NOT_FOUND for a page not in the lease). 0 or negative Code. */
int kvp_lease_return(struct kvp_lease *l, const uint32_t *pages, uint32_t n, struct kvp_fail *f);
/* Frees every page and the lease. Accepts NULL. */
void kvp_lease_destroy(struct kvp_lease *l);
/* An empty lease of tier (grown by kvp_lease_grow, filled by kvp_lease_move). NULL on ENOMEM
 * or a tier the pool lacks. */
struct kvp_lease *kvp_lease_new_empty(struct kvpd_pool *p, int tier, uint64_t id);
/* Moves pages[0..n) (all distinct, all in from) into to, of the same pool and tier; they stay
 * LEASED. Nothing changes on failure (-EINVAL for a page not in from, or listed twice). */
int kvp_lease_move(struct kvp_lease *from, struct kvp_lease *to, const uint32_t *pages, uint32_t n);
/* Publishes whole pages of tokens into the page index: the first `cached` pages of the
 * sequence are already cached (the caller matched them), pages[] are lease pages for the rest
 * (see kvp_insert in kvpool.h). 0 or negative Code. */
int kvp_lease_insert(struct kvp_lease *l, uint64_t ns, const uint32_t *tokens, uint32_t ntokens,
		     uint32_t cached, const uint32_t *pages, uint32_t npages, uint64_t *new_tokens,
		     uint64_t *dup_tokens, struct kvp_fail *f);

/* Publishes the chain keys[0 .. n) of hash-keyed namespace ns: keys[0 .. cached) already cached
 * (the caller matched them), pages[] (npages == n - cached, in the lease) for the rest (see
 * kvp_index_insert). Pages taken or duplicate leave the lease (duplicates are freed); past a
 * matched key evicted meanwhile they stay. 0 or negative Code (INVALID_ARGUMENT, NOT_FOUND,
 * INTERNAL). */
int kvp_lease_insert_keys(struct kvp_lease *l, uint64_t ns, const struct kvp_key *keys, uint32_t n,
			  uint32_t cached, const uint32_t *pages, uint32_t npages,
			  uint32_t *new_pages, uint32_t *dup_pages, uint32_t *done_keys,
			  struct kvp_fail *f);

/* One log line summarising evictions, demotions, promotions and capacity refusals since the
 * previous call, when there were any (called every few seconds, never per page). */
void kvp_pool_log_summary(struct kvpd_pool *p, uint64_t interval_ms);
/* Evicts up to `pages` pages of tier, demotions synchronous (admin Evict, Load): returns pages
 * freed. (Alloc's own eviction may leave demotions in flight: see kvp_pool_async.) */
uint32_t kvp_pool_evict(struct kvpd_pool *p, int tier, uint32_t pages);
