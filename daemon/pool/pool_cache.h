/* pool_cache.h - the pool's prefix cache as the RPC handlers and sessions use it: match with an
 * optional lock, unlock, load (promotion), flush, top prefixes, and the figures the stats
 * tables export. Handlers reach the cache only through these (and kvp_lease_insert). */
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "pool.h"
#include "stats.h"

/* Longest cached prefix of tokens[0 .. ntokens) in namespace ns (see kvp_prefix_match; dev[]
 * and host[] have room for ntokens / page_tokens ids each); counts a match in p->st. With lock
 * and a non-empty match, m->lock pins the path until kvp_pool_unlock. 0, -EINVAL or -ENOMEM. */
int kvp_pool_match(struct kvpd_pool *p, uint64_t ns, const uint32_t *tokens, uint32_t ntokens,
		   bool lock, struct kvp_prefix_match *m, uint32_t *dev, uint32_t *host);
/* Drops a lock kvp_pool_match took. Accepts NULL. */
void kvp_pool_unlock(struct kvpd_pool *p, struct kvp_prefix_node *lock);
/* Brings the locked path into the device tier (see kvp_prefix_promote); counts a load in p->st.
 * Writes the path's device ids to dev_out (cap entries), their count to *n and the pages copied
 * from the host tier to *promoted. 0, -EINVAL, -ENOSPC, -EBUSY, -ENOMEM or the copy's error. */
int kvp_pool_load(struct kvpd_pool *p, struct kvp_prefix_node *lock, uint32_t *dev_out,
		  uint32_t cap, uint32_t *n, uint32_t *promoted);
/* The longest leading run of keys[0 .. n) cached in hash-keyed namespace ns (see kvp_keys_match;
 * dev[] and host[] have room for n ids); counts a match. With lock and a non-empty run, *lock
 * pins it until kvp_pool_keys_unlock. 0, -EINVAL or -ENOMEM. */
int kvp_pool_match_keys(struct kvpd_pool *p, uint64_t ns, const struct kvp_key *keys, uint32_t n,
			bool lock, struct kvp_keys_match *m, uint32_t *dev, uint32_t *host);
/* Count of leading keys of keys[0 .. n) cached in ns. */
uint32_t kvp_pool_exists_keys(struct kvpd_pool *p, uint64_t ns, const struct kvp_key *keys,
			      uint32_t n);
/* Drops a lock kvp_pool_match_keys took. Accepts NULL. */
void kvp_pool_keys_unlock(struct kvpd_pool *p, struct kvp_keys_lock *lock);
/* Brings the locked run into the device tier, evicting other unlocked pages of the pool to make
 * room (see kvp_keys_promote). Like kvp_pool_load. */
int kvp_pool_keys_load(struct kvpd_pool *p, struct kvp_keys_lock *lock, uint32_t *dev_out,
		       uint32_t cap, uint32_t *n, uint32_t *promoted);
/* Drops every unlocked cached page in both tiers. Returns the pages freed. */
uint32_t kvp_pool_flush(struct kvpd_pool *p);
/* One of the most-hit cached prefixes (`kvpoolctl cache`). */
struct kvp_pool_top {
	uint32_t tokens; /* length of the path to the node, in tokens */
	uint64_t hits;
	uint64_t ns;
};
#define KVP_POOL_TOP_MAX 64
/* Up to cap (at most KVP_POOL_TOP_MAX) most-hit prefixes, most hits first (ties: shorter
 * first). Returns how many. */
uint32_t kvp_pool_top(const struct kvpd_pool *p, struct kvp_pool_top *out, uint32_t cap);
/* Pages that hold tokens tokens, rounded up, saturating at UINT32_MAX (never wraps). */
uint32_t kvp_pool_pages_of(const struct kvpd_pool *p, uint64_t tokens);

/* The tier's figures of KVP_TIER_FIGURES, in tokens. The tier must exist. */
void kvp_pool_tier_figures(const struct kvpd_pool *p, int tier, struct kvp_tier_figures *out);
/* The pool's figures of KVP_POOL_FIGURES. */
void kvp_pool_figures(const struct kvpd_pool *p, struct kvp_pool_figures *out);
