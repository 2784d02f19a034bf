/* metrics.c - Prometheus text exposition, generated from the X-macro counter lists. */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dispatch.h"
#include "kvpool.pb-c.h"

const double kvp_lat_bounds_us[KVP_LAT_BUCKETS] = { 10,	  25,	50,    100,   250,   500,
						    1000, 2500, 5000, 10000, 50000, 1e300 };

void kvp_rpc_observe(struct kvp_rpc_stats *s, int call, int code, double us)
{
	int b = 0;

	if (call < 0 || call >= KVP_RPC_SLOTS)
		call = 0;
	s->calls[call]++;
	if (code > 0 && code < KVP_CODE_SLOTS)
		s->failures[code]++;
	while (b < KVP_LAT_BUCKETS - 1 && us > kvp_lat_bounds_us[b])
		b++;
	s->lat[call][b]++;
	s->lat_sum_us[call] += us;
}

struct out {
	char *buf;
	size_t len, cap;
	int oom;
};

static void put(struct out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(struct out *o, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (o->oom)
		return;
	for (;;) {
		va_start(ap, fmt);
		n = vsnprintf(o->buf + o->len, o->cap - o->len, fmt, ap);
		va_end(ap);
		if (n < 0) {
			o->oom = 1;
			return;
		}
		if ((size_t)n < o->cap - o->len) {
			o->len += (size_t)n;
			return;
		}
		char *nb = realloc(o->buf, o->cap * 2 + (size_t)n);

		if (!nb) {
			o->oom = 1;
			return;
		}
		o->buf = nb;
		o->cap = o->cap * 2 + (size_t)n;
	}
}

static const char *call_name(int call)
{
	const ProtobufCFieldDescriptor *f =
		protobuf_c_message_descriptor_get_field(&kvpool__request__descriptor, (unsigned)call);

	return f ? f->name : NULL;
}

static const char *code_name(int code)
{
	const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value(&kvpool__code__descriptor,
									   code);

	return v ? v->name : NULL;
}

char *kvp_metrics_render(const struct kvp_daemon *d)
{
	static const char *const tier_name[KVP_TIER_MAX] = { "device", "host" };
	struct out o = { .cap = 16384 };

	o.buf = malloc(o.cap);
	if (!o.buf)
		return NULL;
	o.buf[0] = 0;

	put(&o, "# HELP kvpool_sessions Sessions connected.\n# TYPE kvpool_sessions gauge\n");
	put(&o, "kvpool_sessions %u\n", d->n_sessions);
	put(&o, "# HELP kvpool_uptime_seconds Seconds since kvpoold started.\n"
		"# TYPE kvpool_uptime_seconds gauge\n");
	put(&o, "kvpool_uptime_seconds %.3f\n", (double)(kvp_now_ms() - d->started_ms) / 1e3);
#define DAEMON_FAMILY(f, n, h)                                                          \
	put(&o, "# HELP kvpool_" n " " h ".\n# TYPE kvpool_" n " counter\nkvpool_" n " %lu\n", \
	    (unsigned long)d->st.f);
	KVP_DAEMON_COUNTERS(DAEMON_FAMILY)
#undef DAEMON_FAMILY

	/* Per pool and tier token gauges. */
	{
		static const char *const gauges[] = { "total", "free",	    "leased",
						      "cached", "evictable", "protected" };

		for (size_t g = 0; g < sizeof(gauges) / sizeof(gauges[0]); g++) {
			put(&o, "# HELP kvpool_tier_%s_tokens Tokens %s in a pool's tier.\n",
			    gauges[g], gauges[g]);
			put(&o, "# TYPE kvpool_tier_%s_tokens gauge\n", gauges[g]);
			for (uint32_t i = 0; i < d->n_pools; i++) {
				const struct kvp_pool *p = d->pools[i];

				for (int t = 0; t < KVP_TIER_MAX; t++) {
					struct kvp_tier_counts c;
					uint64_t v[6];

					if (!kvp_pool_has_tier(p, t))
						continue;
					kvp_pool_counts(p, t, &c);
					v[0] = c.total, v[1] = c.free, v[2] = c.leased;
					v[3] = c.cached, v[4] = c.evictable, v[5] = c.protected_;
					put(&o, "kvpool_tier_%s_tokens{pool=\"%s\",tier=\"%s\"} %lu\n",
					    gauges[g], p->conf.name, tier_name[t],
					    (unsigned long)(v[g] * p->conf.page_tokens));
				}
			}
		}
	}
	/* Per pool counters from the X-macro list, and the prefix cache's own. */
#define POOL_FAMILY(f, n, h)                                                            \
	put(&o, "# HELP kvpool_pool_" n " " h ".\n# TYPE kvpool_pool_" n " counter\n");       \
	for (uint32_t i = 0; i < d->n_pools; i++)                                       \
		put(&o, "kvpool_pool_" n "{pool=\"%s\"} %lu\n", d->pools[i]->conf.name,   \
		    (unsigned long)d->pools[i]->st.f);
	KVP_POOL_COUNTERS(POOL_FAMILY)
#undef POOL_FAMILY
	{
		/* each a field of struct kvp_prefix_stats, in pages (times page_tokens) or not */
		static const struct {
			const char *name, *help, *type;
			size_t off;
			bool pages;
		} pf[] = {
#define PF(n, h, t, f, pg) { n, h, t, offsetof(struct kvp_prefix_stats, f), pg }
			PF("prefix_hit_tokens_total", "Tokens matched in the prefix cache", "counter",
			   hit_tokens, false),
			PF("prefix_queried_tokens_total", "Tokens asked of the prefix cache", "counter",
			   queried_tokens, false),
			PF("demoted_tokens_total", "Tokens demoted from device to host pages", "counter",
			   demoted_pages, true),
			PF("promoted_tokens_total", "Tokens promoted from host to device pages", "counter",
			   promoted_pages, true),
			PF("prefix_nodes", "Nodes of the prefix tree", "gauge", nodes, false),
#undef PF
		};

		for (size_t k = 0; k < sizeof(pf) / sizeof(pf[0]); k++) {
			put(&o, "# HELP kvpool_%s %s.\n# TYPE kvpool_%s %s\n", pf[k].name, pf[k].help,
			    pf[k].name, pf[k].type);
			for (uint32_t i = 0; i < d->n_pools; i++) {
				const struct kvp_pool *p = d->pools[i];
				struct kvp_prefix_stats ps;
				uint64_t v;

				kvp_prefix_stats(p->pfx, &ps);
				v = *(const uint64_t *)((const char *)&ps + pf[k].off);
				if (pf[k].pages)
					v *= p->conf.page_tokens;
				put(&o, "kvpool_%s{pool=\"%s\"} %lu\n", pf[k].name, p->conf.name,
				    (unsigned long)v);
			}
		}
		put(&o, "# HELP kvpool_evicted_tokens_total Tokens evicted from a tier.\n"
			"# TYPE kvpool_evicted_tokens_total counter\n");
		for (uint32_t i = 0; i < d->n_pools; i++) {
			const struct kvp_pool *p = d->pools[i];
			struct kvp_prefix_stats ps;

			kvp_prefix_stats(p->pfx, &ps);
			for (int t = 0; t < KVP_TIER_MAX; t++)
				if (kvp_pool_has_tier(p, t))
					put(&o, "kvpool_evicted_tokens_total{pool=\"%s\",tier=\"%s\"} %lu\n",
					    p->conf.name, tier_name[t],
					    (unsigned long)(ps.evicted_pages[t] * p->conf.page_tokens));
		}
	}
	/* RPCs by call, failures by code, latency histogram. */
	put(&o, "# HELP kvpool_rpc_total RPCs served, by call.\n# TYPE kvpool_rpc_total counter\n");
	for (int c = 0; c < KVP_RPC_SLOTS; c++)
		if (d->rpc.calls[c] && call_name(c))
			put(&o, "kvpool_rpc_total{call=\"%s\"} %lu\n", call_name(c),
			    (unsigned long)d->rpc.calls[c]);
	put(&o, "# HELP kvpool_rpc_failures_total RPCs answered with an error, by code.\n"
		"# TYPE kvpool_rpc_failures_total counter\n");
	for (int c = 1; c < KVP_CODE_SLOTS; c++)
		if (code_name(c))
			put(&o, "kvpool_rpc_failures_total{code=\"%s\"} %lu\n", code_name(c),
			    (unsigned long)d->rpc.failures[c]);
	put(&o, "# HELP kvpool_rpc_duration_seconds Time kvpoold spends on an RPC: decode, serve, "
		"encode the reply.\n"
		"# TYPE kvpool_rpc_duration_seconds histogram\n");
	for (int c = 0; c < KVP_RPC_SLOTS; c++) {
		const char *name = call_name(c);
		uint64_t cum = 0;

		if (!d->rpc.calls[c] || !name)
			continue;
		for (int b = 0; b < KVP_LAT_BUCKETS; b++) {
			cum += d->rpc.lat[c][b];
			if (b == KVP_LAT_BUCKETS - 1)
				put(&o, "kvpool_rpc_duration_seconds_bucket{call=\"%s\",le=\"+Inf\"} %lu\n",
				    name, (unsigned long)cum);
			else
				put(&o, "kvpool_rpc_duration_seconds_bucket{call=\"%s\",le=\"%g\"} %lu\n",
				    name, kvp_lat_bounds_us[b] / 1e6, (unsigned long)cum);
		}
		put(&o, "kvpool_rpc_duration_seconds_sum{call=\"%s\"} %.9f\n", name,
		    d->rpc.lat_sum_us[c] / 1e6);
		put(&o, "kvpool_rpc_duration_seconds_count{call=\"%s\"} %lu\n", name,
		    (unsigned long)cum);
	}
	if (o.oom) {
		free(o.buf);
		return NULL;
	}
	return o.buf;
}
