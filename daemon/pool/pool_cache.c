/* pool_cache.c - the pool's way into its page index (pool_cache.h): the RPC handlers and
 * sessions call these, never index.c. */
#include "pool_cache.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>

int kvp_pool_match(struct kvpd_pool *p, uint64_t ns, const uint32_t *tokens, uint32_t ntokens,
		   bool lock, struct kvp_index_match *m, uint32_t *dev, uint32_t *host)
{
	p->st.matches++;
	return kvp_index_match_tokens(p->ix, ns, tokens, ntokens, lock, m, dev, host);
}

int kvp_pool_match_keys(struct kvpd_pool *p, uint64_t ns, const struct kvp_key *keys, uint32_t n,
			bool lock, struct kvp_index_match *m, uint32_t *dev, uint32_t *host)
{
	p->st.matches++;
	return kvp_index_match(p->ix, ns, keys, n, lock, m, dev, host);
}

void kvp_pool_page_keys(struct kvpd_pool *p, uint64_t ns, const uint32_t *tokens, uint32_t from,
			uint32_t to, uint8_t (*out)[KVP_PAGE_KEY_BYTES])
{
	uint32_t pt = p->conf.page_tokens, i = 0;
	uint8_t h[KVP_PAGE_KEY_BYTES];

	if (from && kvp_index_token_key(p->ix, ns, tokens, from, h) == 0)
		i = from;
	for (; i < to; i++) {
		kvp_page_key(i ? h : NULL, tokens + (size_t)i * pt, pt, h);
		if (i >= from)
			memcpy(out[i - from], h, KVP_PAGE_KEY_BYTES);
	}
}

uint32_t kvp_pool_exists_keys(struct kvpd_pool *p, uint64_t ns, const struct kvp_key *keys,
			      uint32_t n)
{
	return kvp_index_exists(p->ix, ns, keys, n);
}

void kvp_pool_unlock(struct kvpd_pool *p, struct kvp_index_lock *lock)
{
	kvp_index_unlock(p->ix, lock);
}

uint32_t kvp_pool_flush(struct kvpd_pool *p)
{
	return kvp_index_flush(p->ix);
}

int kvp_pool_load(struct kvpd_pool *p, struct kvp_index_lock *lock, uint32_t *dev_out, uint32_t cap,
		  uint32_t *n, uint32_t *promoted)
{
	uint32_t nh;
	int rc;

	p->st.loads++;
	if (!kvp_pool_has_tier(p, KVP_TIER_ID_DEVICE))
		return -EINVAL;
	nh = kvp_index_lock_host_pages(p->ix, lock);
	rc = kvp_index_promote(p->ix, lock, dev_out, cap, n);
	if (rc < 0)
		return rc;
	*promoted = nh;
	return 0;
}

uint32_t kvp_pool_top(const struct kvpd_pool *p, struct kvp_pool_top *out, uint32_t cap)
{
	struct kvp_index_top top[KVP_POOL_TOP_MAX];
	uint32_t n = kvp_index_top(p->ix, top, cap < KVP_POOL_TOP_MAX ? cap : KVP_POOL_TOP_MAX);

	for (uint32_t i = 0; i < n; i++)
		out[i] = (struct kvp_pool_top){ top[i].pages * p->conf.page_tokens, top[i].hits,
						top[i].ns, top[i].keyed };
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
	struct kvp_index_stats ks;
	struct kvp_tier_counts c;
	uint64_t pt = p->conf.page_tokens;

	kvp_pool_counts(p, tier, &c);
	out->total_tokens = c.total * pt;
	out->free_tokens = c.free * pt;
	out->leased_tokens = c.leased * pt;
	out->cached_tokens = c.cached * pt;
	out->evictable_tokens = c.evictable * pt;
	out->protected_tokens = c.protected_ * pt;
	out->moving_tokens = c.moving * pt;
	kvp_index_stats(p->ix, &ks);
	out->evicted_tokens = ks.evicted_pages[tier] * pt;
}

void kvp_pool_figures(const struct kvpd_pool *p, struct kvp_pool_figures *out)
{
	struct kvp_index_stats ks;
	uint64_t pt = p->conf.page_tokens;

	kvp_index_stats(p->ix, &ks);
	out->nodes = ks.entries;
	out->hit_tokens = ks.hit_tokens + ks.hit_keys * pt;
	out->queried_tokens = ks.queried_tokens + ks.queried_keys * pt;
	out->demoted_tokens = ks.demoted_pages * pt;
	out->promoted_tokens = ks.promoted_pages * pt;
	out->sessions = p->sessions;
	out->session_quota_tokens = p->conf.session_quota_tokens;
	out->token_bytes = kvp_conf_token_bytes(&p->conf);
}
