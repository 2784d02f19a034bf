/* remote_tier_none.c - remote_tier.h for a kvpoold built without hiredis and nettle: Match
 * reports no remote pages and Fetch is refused with a typed UNAVAILABLE. */
#include "remote_tier.h"

#include "rpc.h"

void kvp_rt_bind(struct kvp_daemon *d)
{
	(void)d;
}

void kvp_rt_free(struct kvp_daemon *d)
{
	(void)d;
}

void kvp_rt_stats_read(const struct kvp_daemon *d, struct kvp_remote_stats *out)
{
	(void)d, (void)out;
}

uint64_t kvp_rt_leased(const struct kvp_daemon *d, const struct kvpd_pool *p)
{
	(void)d, (void)p;
	return 0;
}

void kvp_rt_expire(struct kvp_daemon *d)
{
	(void)d;
}

int kvp_rt_match(struct kvp_daemon *d, struct kvp_session *s, const Kvpool__Request *q,
		 struct kvpd_pool *p, const Kvpool__MatchResp *m)
{
	(void)d, (void)s, (void)q, (void)p, (void)m;
	return 0;
}

int kvp_rt_match_keys(struct kvp_daemon *d, struct kvp_session *s, const Kvpool__Request *q,
		      struct kvpd_pool *p, const Kvpool__MatchKeysResp *m)
{
	(void)d, (void)s, (void)q, (void)p, (void)m;
	return 0;
}

void kvp_rt_written(struct kvp_daemon *d, struct kvpd_pool *p, uint64_t ns, const uint32_t *tokens,
		    uint32_t first, const uint32_t *pages, uint32_t n)
{
	(void)d, (void)p, (void)ns, (void)tokens, (void)first, (void)pages, (void)n;
}

void kvp_rt_written_keys(struct kvp_daemon *d, struct kvpd_pool *p, uint64_t ns,
			 const ProtobufCBinaryData *keys, const uint32_t *pages, uint32_t n)
{
	(void)d, (void)p, (void)ns, (void)keys, (void)pages, (void)n;
}

KVP_RPC_HANDLER(kvp_rpc_fetch)
{
	(void)d, (void)s, (void)q, (void)r;
	return kvp_fail(f, KVP_ERR_UNAVAILABLE,
			"fetch: kvpoold was built without the remote tier (hiredis, nettle)");
}
