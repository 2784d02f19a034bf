/* pool_cache.h - the pool's page index as the RPC handlers and sessions use it: match (token or
 * key calls) with an optional lock, unlock, load (promotion), flush, top pages, and the figures the
 * stats tables export. Handlers reach the index only through these (and the lease inserts). */
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "pool.h"
#include "stats.h"

/* Longest cached run of whole pages of tokens[0 .. ntokens) in namespace ns (see
 * kvp_index_match_tokens; dev[] and host[] have room for ntokens / page_tokens ids each); counts a
 * match in p->st. With lock and a non-empty match, m->lock pins the run until kvp_pool_unlock.
 * 0, -EINVAL or -ENOMEM. */
int kvp_pool_match(struct kvpd_pool *p, uint64_t ns, const uint32_t *tokens, uint32_t ntokens,
		   bool lock, struct kvp_index_match *m, uint32_t *dev, uint32_t *host);
/* The longest leading run of keys[0 .. n) cached in ns (see kvp_index_match; dev[] and host[]
 * have room for n ids); like kvp_pool_match. */
int kvp_pool_match_keys(struct kvpd_pool *p, uint64_t ns, const struct kvp_key *keys, uint32_t n,
			bool lock, struct kvp_index_match *m, uint32_t *dev, uint32_t *host);
/* The page keys (the kvp_page_key chain) of pages [from, to) of tokens in ns into
 * out[0 .. to - from): chained from the index's key of page from - 1 when p still caches pages
 * 0 .. from - 1 (their keys are derived once and kept), else hashed from page 0. What the tiers
 * below host name a token page by. */
void kvp_pool_page_keys(struct kvpd_pool *p, uint64_t ns, const uint32_t *tokens, uint32_t from,
			uint32_t to, uint8_t (*out)[KVP_PAGE_KEY_BYTES]);
/* Count of leading keys of keys[0 .. n) cached in ns. */
uint32_t kvp_pool_exists_keys(struct kvpd_pool *p, uint64_t ns, const struct kvp_key *keys,
			      uint32_t n);
/* Drops a lock a match took. Accepts NULL. */
void kvp_pool_unlock(struct kvpd_pool *p, struct kvp_index_lock *lock);
/* Brings the locked run into the device tier, evicting other unlocked pages of the pool to make
 * room (see kvp_index_promote); counts a load in p->st. Writes the run's device ids to dev_out
 * (cap entries), their count to *n and the pages copied from the host tier to *promoted. 0,
 * -EINVAL, -ENOSPC, -EBUSY, -ENOMEM or the copy's error. */
int kvp_pool_load(struct kvpd_pool *p, struct kvp_index_lock *lock, uint32_t *dev_out, uint32_t cap,
		  uint32_t *n, uint32_t *promoted);
/* Drops every unlocked cached page in both tiers. Returns the pages freed. */
uint32_t kvp_pool_flush(struct kvpd_pool *p);
/* One of the most-hit cached pages (`kvpoolctl cache`), of either kind of call. */
struct kvp_pool_top {
	uint32_t tokens; /* length of the chain through the page, in tokens */
	uint64_t hits;
	uint64_t ns;
	bool keyed; /* a key call's page */
};
#define KVP_POOL_TOP_MAX 64
/* Up to cap (at most KVP_POOL_TOP_MAX) most-hit pages, most hits first (ties: shorter
 * first). Returns how many. */
uint32_t kvp_pool_top(const struct kvpd_pool *p, struct kvp_pool_top *out, uint32_t cap);
/* Pages that hold tokens tokens, rounded up, saturating at UINT32_MAX (never wraps). */
uint32_t kvp_pool_pages_of(const struct kvpd_pool *p, uint64_t tokens);

/* The tier's figures of KVP_TIER_FIGURES, in tokens. The tier must exist. */
void kvp_pool_tier_figures(const struct kvpd_pool *p, int tier, struct kvp_tier_figures *out);
/* The pool's figures of KVP_POOL_FIGURES. */
void kvp_pool_figures(const struct kvpd_pool *p, struct kvp_pool_figures *out);
