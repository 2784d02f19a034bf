/* remote_tier_none.c - remote_tier.h for a kvpoold built without hiredis and nettle: the tier
 * serves no pool, so Match reports no remote pages and Fetch reads nothing (its answer is the
 * local match). */
#include "remote_tier.h"

#include <errno.h>

void kvp_rt_bind(struct kvp_daemon *d)
{
	(void)d;
}

void kvp_rt_set_observer(struct kvp_daemon *d, kvp_rt_observe_fn fn, void *ctx)
{
	(void)d, (void)fn, (void)ctx;
}

void kvp_rt_free(struct kvp_daemon *d)
{
	(void)d;
}

void kvp_rt_stats_read(const struct kvp_daemon *d, struct kvp_remote_stats *out)
{
	(void)d, (void)out;
}

void kvp_rt_expire(struct kvp_daemon *d)
{
	(void)d;
}

uint32_t kvp_rt_serves(struct kvp_daemon *d, const struct kvpd_pool *p)
{
	(void)d, (void)p;
	return 0;
}

int kvp_rt_query(struct kvp_daemon *d, struct kvpd_pool *p, const struct kvp_below_run *run,
		 kvp_below_held_fn done, void *arg)
{
	(void)d, (void)p, (void)run, (void)done, (void)arg;
	return -ENOENT;
}

int kvp_rt_read(struct kvp_daemon *d, struct kvpd_pool *p, const struct kvp_below_run *run,
		const uint32_t *pages, kvp_below_read_fn done, void *arg)
{
	(void)d, (void)p, (void)run, (void)pages, (void)done, (void)arg;
	return -ENOENT;
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
