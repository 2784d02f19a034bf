/* pool_cache.c - the pool's way into its prefix cache (pool_cache.h): the RPC handlers and
 * sessions call these, never prefix.c. */
#include "pool_cache.h"

#include <errno.h>
#include <stdint.h>

int kvp_pool_match(struct kvpd_pool *p, uint64_t ns, const uint32_t *tokens, uint32_t ntokens,
		   bool lock, struct kvp_prefix_match *m, uint32_t *dev, uint32_t *host)
{
	p->st.matches++;
	return kvp_prefix_match(p->pfx, ns, tokens, ntokens, lock, m, dev, host);
}

void kvp_pool_unlock(struct kvpd_pool *p, struct kvp_prefix_node *lock)
{
	kvp_prefix_unlock(p->pfx, lock);
}

int kvp_pool_load(struct kvpd_pool *p, struct kvp_prefix_node *lock, uint32_t *dev_out,
		  uint32_t cap, uint32_t *n, uint32_t *promoted)
{
	struct kvp_prefix_stats before, after;
	int rc;

	p->st.loads++;
	kvp_prefix_stats(p->pfx, &before);
	rc = kvp_prefix_promote(p->pfx, lock, dev_out, cap, n);
	if (rc < 0)
		return rc;
	kvp_prefix_stats(p->pfx, &after);
	*promoted = (uint32_t)(after.promoted_pages - before.promoted_pages);
	return 0;
}

uint32_t kvp_pool_flush(struct kvpd_pool *p)
{
	return kvp_prefix_flush(p->pfx) + kvp_keys_flush(p->keys);
}

int kvp_pool_match_keys(struct kvpd_pool *p, uint64_t ns, const struct kvp_key *keys, uint32_t n,
			bool lock, struct kvp_keys_match *m, uint32_t *dev, uint32_t *host)
{
	p->st.matches++;
	return kvp_keys_match(p->keys, ns, keys, n, lock, m, dev, host);
}

uint32_t kvp_pool_exists_keys(struct kvpd_pool *p, uint64_t ns, const struct kvp_key *keys,
			      uint32_t n)
{
	return kvp_keys_exists(p->keys, ns, keys, n);
}

void kvp_pool_keys_unlock(struct kvpd_pool *p, struct kvp_keys_lock *lock)
{
	kvp_keys_unlock(p->keys, lock);
}

int kvp_pool_keys_load(struct kvpd_pool *p, struct kvp_keys_lock *lock, uint32_t *dev_out,
		       uint32_t cap, uint32_t *n, uint32_t *promoted)
{
	uint32_t nh, nfree;
	struct kvp_tier_counts c;
	int rc;

	p->st.loads++;
	if (!kvp_pool_has_tier(p, KVP_TIER_ID_DEVICE))
		return -EINVAL;
	nh = kvp_keys_lock_host_pages(p->keys, lock);
	nfree = kvp_pages_count(p->pages[KVP_TIER_ID_DEVICE], KVP_PAGE_FREE);
	if (nh > nfree) {
		kvp_pool_counts(p, KVP_TIER_ID_DEVICE, &c);
		if (nh - nfree > c.evictable)
			return -ENOSPC;
		kvp_pool_evict(p, KVP_TIER_ID_DEVICE, nh - nfree); /* the run is locked: kept */
	}
	rc = kvp_keys_promote(p->keys, lock, dev_out, cap, n);
	if (rc < 0)
		return rc;
	*promoted = nh;
	return 0;
}

uint32_t kvp_pool_top(const struct kvpd_pool *p, struct kvp_pool_top *out, uint32_t cap)
{
	struct kvp_prefix_top top[KVP_POOL_TOP_MAX];
	uint32_t n = kvp_prefix_top(p->pfx, top, cap < KVP_POOL_TOP_MAX ? cap : KVP_POOL_TOP_MAX);

	for (uint32_t i = 0; i < n; i++)
		out[i] = (struct kvp_pool_top){ top[i].tokens, top[i].hits, top[i].ns };
	return n;
}

uint32_t kvp_pool_pages_of(const struct kvpd_pool *p, uint64_t tokens)
{
	uint64_t pt = p->conf.page_tokens;
	/* tokens + pt - 1 would wrap near 2^64: divide first, then round up */
	uint64_t pages = tokens / pt + (tokens % pt != 0);

	return pages > UINT32_MAX ? UINT32_MAX : (uint32_t)pages;
}

void kvp_pool_tier_figures(const struct kvpd_pool *p, int tier, struct kvp_tier_figures *out)
{
	struct kvp_prefix_stats ps;
	struct kvp_keys_stats ks;
	struct kvp_tier_counts c;
	uint64_t pt = p->conf.page_tokens;

	kvp_pool_counts(p, tier, &c);
	kvp_prefix_stats(p->pfx, &ps);
	out->total_tokens = c.total * pt;
	out->free_tokens = c.free * pt;
	out->leased_tokens = c.leased * pt;
	out->cached_tokens = c.cached * pt;
	out->evictable_tokens = c.evictable * pt;
	out->protected_tokens = c.protected_ * pt;
	out->moving_tokens = c.moving * pt;
	kvp_keys_stats(p->keys, &ks);
	out->evicted_tokens = (ps.evicted_pages[tier] + ks.evicted_pages[tier]) * pt;
}

void kvp_pool_figures(const struct kvpd_pool *p, struct kvp_pool_figures *out)
{
	struct kvp_prefix_stats ps;
	struct kvp_keys_stats ks;
	uint64_t pt = p->conf.page_tokens;

	kvp_prefix_stats(p->pfx, &ps);
	kvp_keys_stats(p->keys, &ks);
	out->nodes = ps.nodes + ks.entries;
	out->hit_tokens = ps.hit_tokens + ks.hit_keys * pt;
	out->queried_tokens = ps.queried_tokens + ks.queried_keys * pt;
	out->demoted_tokens = (ps.demoted_pages + ks.demoted_pages) * pt;
	out->promoted_tokens = (ps.promoted_pages + ks.promoted_pages) * pt;
	out->sessions = p->sessions;
	out->session_quota_tokens = p->conf.session_quota_tokens;
	out->token_bytes = kvp_conf_token_bytes(&p->conf);
}
