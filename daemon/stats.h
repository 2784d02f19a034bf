/* stats.h - counters as X-macro lists: one list generates the struct fields, the Prometheus
 * families (stats.c) and the CLI/JSON rows, so they never drift apart. */
#pragma once
#include <stddef.h>
#include <stdint.h>

/* X(field, prometheus name suffix, help) */
#define KVP_POOL_COUNTERS(X)                                                          \
	X(allocs, "allocs_total", "Alloc and Extend calls served")                    \
	X(alloc_pages, "alloc_pages_total", "Pages leased")                           \
	X(alloc_failures, "alloc_failures_total", "Alloc/Extend refused for capacity") \
	X(frees, "frees_total", "Free calls and lease ends")                          \
	X(free_pages, "free_pages_total", "Pages returned from leases")               \
	X(inserted_tokens, "inserted_tokens_total", "Tokens newly cached by Insert")  \
	X(matches, "matches_total", "Match calls")                                    \
	X(loads, "loads_total", "Load calls (promotions asked)")

#define KVP_DAEMON_COUNTERS(X)                                                                \
	X(sessions_opened, "sessions_opened_total", "Sessions that said Hello")                  \
	X(sessions_closed, "sessions_closed_total", "Sessions ended (any reason)")               \
	X(sessions_reclaimed, "sessions_reclaimed_total", "Sessions reclaimed by keep-alive or pid") \
	X(connections_refused, "connections_refused_total", "Connections refused (credentials, limits)") \
	X(protocol_errors, "protocol_errors_total", "Connections closed for malformed frames")   \
	X(frames_in, "frames_in_total", "Request frames received")                              \
	X(frames_out, "frames_out_total", "Response frames sent")                               \
	X(pidfd_failures, "pidfd_failures_total", "Peers whose exit cannot be tracked (no pidfd)")

#define KVP_STAT_FIELD(f, n, h) uint64_t f;
struct kvp_pool_stats {
	KVP_POOL_COUNTERS(KVP_STAT_FIELD)
};
struct kvp_daemon_stats {
	KVP_DAEMON_COUNTERS(KVP_STAT_FIELD)
};

/* RPC calls by oneof case (Request.call numbers 10..), failures by Code, latency buckets. */
#define KVP_RPC_SLOTS 32
#define KVP_CODE_SLOTS 16
#define KVP_LAT_BUCKETS 12
extern const double kvp_lat_bounds_us[KVP_LAT_BUCKETS]; /* upper bounds; last is +Inf */
struct kvp_rpc_stats {
	uint64_t calls[KVP_RPC_SLOTS];
	uint64_t failures[KVP_CODE_SLOTS];
	uint64_t lat[KVP_RPC_SLOTS][KVP_LAT_BUCKETS]; /* cumulative at export, per bucket here */
	double lat_sum_us[KVP_RPC_SLOTS];
};
void kvp_rpc_observe(struct kvp_rpc_stats *s, int call, int code, double us);
