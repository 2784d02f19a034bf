/* metrics.c - Prometheus text exposition, every family generated from the X-macro tables of
 * stats.h; RPC accounting. */
#include "metrics.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvpool.pb-c.h"
#include "disk_tier.h"
#include "names.h"
#include "pool_cache.h"

const double kvp_lat_bounds_us[KVP_LAT_BUCKETS] = { 10,	  25,	50,   100,   250,   500,
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
		protobuf_c_message_descriptor_get_field(&kvpool__request__descriptor,
							(unsigned)call);

	return f ? f->name : NULL;
}

static const char *code_name(int code)
{
	const ProtobufCEnumValue *v =
		protobuf_c_enum_descriptor_get_value(&kvpool__code__descriptor, code);

	return v ? v->name : NULL;
}

void kvp_daemon_figures(const struct kvp_daemon *d, struct kvp_daemon_figures *out)
{
	out->sessions = d->n_sessions;
	out->uptime_ms = kvp_now_ms() - d->started_ms;
}

static void family(struct out *o, const char *name, const char *type, const char *help)
{
	put(o, "# HELP kvpool_%s %s.\n# TYPE kvpool_%s %s\n", name, help, name, type);
}

static void rpc_family(struct out *o, int id, const struct kvp_daemon *d)
{
	switch (id) {
	case KVP_RPC_FAMILY_CALLS:
		for (int c = 0; c < KVP_RPC_SLOTS; c++)
			if (d->rpc.calls[c] && call_name(c))
				put(o, "kvpool_rpc_total{call=\"%s\"} %lu\n", call_name(c),
				    (unsigned long)d->rpc.calls[c]);
		break;
	case KVP_RPC_FAMILY_FAILURES:
		for (int c = 1; c < KVP_CODE_SLOTS; c++)
			if (code_name(c))
				put(o, "kvpool_rpc_failures_total{code=\"%s\"} %lu\n", code_name(c),
				    (unsigned long)d->rpc.failures[c]);
		break;
	case KVP_RPC_FAMILY_DURATION:
		for (int c = 0; c < KVP_RPC_SLOTS; c++) {
			const char *name = call_name(c);
			uint64_t cum = 0;

			if (!d->rpc.calls[c] || !name)
				continue;
			for (int b = 0; b < KVP_LAT_BUCKETS; b++) {
				cum += d->rpc.lat[c][b];
				if (b == KVP_LAT_BUCKETS - 1)
					put(o,
					    "kvpool_rpc_duration_seconds_bucket{call=\"%s\",le=\"+"
					    "Inf\"} "
					    "%lu\n",
					    name, (unsigned long)cum);
				else
					put(o,
					    "kvpool_rpc_duration_seconds_bucket{call=\"%s\",le=\"%"
					    "g\"} "
					    "%lu\n",
					    name, kvp_lat_bounds_us[b] / 1e6, (unsigned long)cum);
			}
			put(o, "kvpool_rpc_duration_seconds_sum{call=\"%s\"} %.9f\n", name,
			    d->rpc.lat_sum_us[c] / 1e6);
			put(o, "kvpool_rpc_duration_seconds_count{call=\"%s\"} %lu\n", name,
			    (unsigned long)cum);
		}
		break;
	}
}

char *kvp_metrics_render(const struct kvp_daemon *d)
{
	return kvp_metrics_render_pools(d, NULL);
}

char *kvp_metrics_render_pools(const struct kvp_daemon *d, const bool *show)
{
	struct kvp_tier_figures tf[KVP_MAX_POOLS][KVP_TIER_ID_MAX];
	struct kvp_pool_figures pf[KVP_MAX_POOLS];
	struct kvp_daemon_figures df;
	struct out o = { .cap = 16384 };

	o.buf = malloc(o.cap);
	if (!o.buf)
		return NULL;
	o.buf[0] = 0;
	kvp_daemon_figures(d, &df);
	for (uint32_t i = 0; i < d->n_pools; i++) {
		kvp_pool_figures(d->pools[i], &pf[i]);
		for (int t = 0; t < KVP_TIER_ID_MAX; t++)
			if (kvp_pool_has_tier(d->pools[i], t))
				kvp_pool_tier_figures(d->pools[i], t, &tf[i][t]);
	}

#define DAEMON_FIGURE(f, n, t, h, scale)                                                           \
	family(&o, n, t, h);                                                                       \
	if ((scale) == 1)                                                                          \
		put(&o, "kvpool_" n " %lu\n", (unsigned long)df.f);                                \
	else                                                                                       \
		put(&o, "kvpool_" n " %.3f\n", (double)df.f / (scale));
	KVP_DAEMON_FIGURES(DAEMON_FIGURE)
#undef DAEMON_FIGURE
#define DAEMON_COUNTER(f, n, h)                                                                    \
	family(&o, n, "counter", h);                                                               \
	put(&o, "kvpool_" n " %lu\n", (unsigned long)d->st.f);
	KVP_DAEMON_COUNTERS(DAEMON_COUNTER)
#undef DAEMON_COUNTER
#define REMOTE_STAT(f, n, t, h)                                                                    \
	family(&o, n, t, h);                                                                       \
	put(&o, "kvpool_" n " %lu\n", (unsigned long)d->remote_st.f);
	if (d->conf.remote.enabled) {
		KVP_REMOTE_STATS(REMOTE_STAT)
	}
#undef REMOTE_STAT
	if (d->dt) { /* the disk tier, by pool */
		struct kvp_disk_stats ds[KVP_MAX_POOLS] = { 0 };

		for (uint32_t i = 0; i < d->n_pools && i < KVP_MAX_POOLS; i++)
			kvp_dt_stats(d->dt, d->pools[i], &ds[i]);
#define DISK_STAT(f, n, t, h)                                                                      \
	family(&o, n, t, h);                                                                       \
	for (uint32_t i = 0; i < d->n_pools && i < KVP_MAX_POOLS; i++)                             \
		if ((!show || show[i]) && kvp_dt_has(d->dt, d->pools[i]))                          \
			put(&o, "kvpool_" n "{pool=\"%s\"} %lu\n", d->pools[i]->conf.name,         \
			    (unsigned long)ds[i].f);
		KVP_DISK_STATS(DISK_STAT)
#undef DISK_STAT
	}
#define TIER_FIGURE(f, n, t, h)                                                                    \
	family(&o, n, t, h);                                                                       \
	for (uint32_t i = 0; i < d->n_pools; i++)                                                  \
		for (int k = 0; k < KVP_TIER_ID_MAX; k++)                                          \
			if ((!show || show[i]) && kvp_pool_has_tier(d->pools[i], k))               \
				put(&o, "kvpool_" n "{pool=\"%s\",tier=\"%s\"} %lu\n",             \
				    d->pools[i]->conf.name, kvp_names_tier(k),                     \
				    (unsigned long)tf[i][k].f);
	KVP_TIER_FIGURES(TIER_FIGURE)
#undef TIER_FIGURE
#define POOL_COUNTER(f, n, h)                                                                      \
	family(&o, "pool_" n, "counter", h);                                                       \
	for (uint32_t i = 0; i < d->n_pools; i++)                                                  \
		if (!show || show[i])                                                              \
			put(&o, "kvpool_pool_" n "{pool=\"%s\"} %lu\n", d->pools[i]->conf.name,    \
			    (unsigned long)d->pools[i]->st.f);
	KVP_POOL_COUNTERS(POOL_COUNTER)
#undef POOL_COUNTER
#define POOL_FIGURE(f, n, t, h)                                                                    \
	family(&o, n, t, h);                                                                       \
	for (uint32_t i = 0; i < d->n_pools; i++)                                                  \
		if (!show || show[i])                                                              \
			put(&o, "kvpool_" n "{pool=\"%s\"} %lu\n", d->pools[i]->conf.name,         \
			    (unsigned long)pf[i].f);
	KVP_POOL_FIGURES(POOL_FIGURE)
#undef POOL_FIGURE
#define RPC_FAMILY(id, n, t, h)                                                                    \
	family(&o, n, t, h);                                                                       \
	rpc_family(&o, id, d);
	KVP_RPC_FAMILIES(RPC_FAMILY)
#undef RPC_FAMILY
	if (o.oom) {
		free(o.buf);
		return NULL;
	}
	return o.buf;
}
