/* stats.h - every stats family as an X-macro list: one list generates the struct fields, the
 * Status/Cache reply fields or Counter rows, and the Prometheus families (metrics.c), so they
 * never drift apart. */
#pragma once
#include <stddef.h>
#include <stdint.h>

/* X(field, prometheus name suffix, help) */
#define KVP_POOL_COUNTERS(X)                                                                       \
	X(allocs, "allocs_total", "Alloc and Extend calls served")                                 \
	X(alloc_pages, "alloc_pages_total", "Pages leased")                                        \
	X(alloc_failures, "alloc_failures_total", "Alloc/Extend refused for capacity")             \
	X(frees, "frees_total", "Free calls and lease ends")                                       \
	X(free_pages, "free_pages_total", "Pages returned from leases")                            \
	X(inserted_tokens, "inserted_tokens_total", "Tokens newly cached by Insert")               \
	X(matches, "matches_total", "Match calls")                                                 \
	X(loads, "loads_total", "Load calls (promotions asked)")                                   \
	X(pressure_changes, "pressure_changes_total",                                              \
	  "Tier free pages crossing the pressure watermark, either way")                           \
	X(pressure_notices, "pressure_notices_total", "Pressure notices sent to sessions")         \
	X(pressure_coalesced, "pressure_coalesced_total",                                          \
	  "Pressure notices replaced by a newer state before they were sent")                      \
	X(reserve_taken_back, "reserve_taken_back_pages_total",                                    \
	  "Unused pages of session reserves taken back under pressure")                            \
	X(reserve_upkeeps, "reserve_upkeeps_total",                                                \
	  "Reserve rings refilled or drained by kvpoold with no call from the client")             \
	X(reserve_bad_rings, "reserve_bad_rings_total",                                            \
	  "Reserves ended by kvpoold's own look at their rings (a corrupt index or id)")

#define KVP_DAEMON_COUNTERS(X)                                                                     \
	X(sessions_opened, "sessions_opened_total", "Sessions that said Hello")                    \
	X(sessions_closed, "sessions_closed_total", "Sessions ended (any reason)")                 \
	X(sessions_reclaimed, "sessions_reclaimed_total",                                          \
	  "Sessions reclaimed by keep-alive or pid")                                               \
	X(connections_refused, "connections_refused_total",                                        \
	  "Connections refused (credentials, limits)")                                             \
	X(protocol_errors, "protocol_errors_total", "Connections closed for malformed frames")     \
	X(frames_in, "frames_in_total", "Request frames received")                                 \
	X(frames_out, "frames_out_total", "Response frames sent")                                  \
	X(pidfd_failures, "pidfd_failures_total", "Peers whose exit cannot be tracked (no pidfd)") \
	X(refused_fds, "refused_fds_total", "Connections refused: the fd reserve reached")         \
	X(refused_prehello, "refused_prehello_total",                                              \
	  "Connections refused: too many not yet said Hello")                                      \
	X(refused_uid, "refused_uid_total", "Connections refused: max_sessions_per_uid reached")   \
	X(refused_sessions, "refused_sessions_total", "Hellos refused: max_sessions reached")      \
	X(refused_buffers, "refused_buffers_total", "Calls or connections refused: buffer_budget") \
	X(refused_attach_fds, "refused_attach_fds_total",                                          \
	  "Attach calls refused: too many descriptors in flight")                                  \
	X(hello_timeouts, "hello_timeouts_total", "Connections closed: no Hello in time")          \
	X(accept_errors, "accept_errors_total", "Accept failures (accept backs off after them)")   \
	X(log_suppressed, "log_lines_suppressed_total", "Repeated log lines left out (counted)")   \
	X(restarts, "restarts_total", "Starts that took pools back from the fd store")             \
	X(sessions_resumed, "sessions_resumed_total", "Sessions resumed with their token")         \
	X(resume_expired, "resume_expired_total",                                                  \
	  "Sessions of the previous kvpoold reclaimed after the resume grace")                     \
	X(pages_adopted, "pages_adopted_total",                                                    \
	  "Cached pages taken over from the previous kvpoold")                                     \
	X(pages_discarded, "pages_discarded_total",                                                \
	  "Pages of the previous kvpoold freed at start (state in doubt, or pool changed)")        \
	X(checkpoints, "books_checkpoints_total",                                                  \
	  "Checkpoints of a pool's books written for restarts (periodic and at a stop)")           \
	X(checkpoint_us, "books_checkpoint_microseconds_total",                                    \
	  "Microseconds the loop spent on those checkpoints (writing, or forking the writer)")     \
	X(checkpoint_write_us, "books_checkpoint_write_microseconds_total",                        \
	  "Microseconds forked writers took to write periodic checkpoints, off the loop")          \
	X(checkpoint_forks, "books_checkpoint_forks_total",                                        \
	  "Periodic checkpoints written by a forked writer")                                       \
	X(events_batches, "events_batches_total", "KV event batches published ([events])")         \
	X(events_published, "events_total", "KV events in the batches published")                  \
	X(events_dropped, "events_dropped_batches_total",                                          \
	  "KV event batches not sent: a subscriber's high-water mark (replayable) or no memory")   \
	X(events_replays, "events_replays_total", "KV event replay requests answered")             \
	X(events_snapshots, "events_snapshots_total", "KV event snapshot requests answered")

#define KVP_STAT_FIELD(f, n, h) uint64_t f;
struct kvp_pool_stats {
	KVP_POOL_COUNTERS(KVP_STAT_FIELD)
};
struct kvp_daemon_stats {
	KVP_DAEMON_COUNTERS(KVP_STAT_FIELD)
};

/* Figures read from the state rather than counted: X(field, prometheus name suffix, type, help).
 *
 * Per pool and tier, in tokens, labelled {pool, tier}: the field is a member of struct
 * kvp_tier_figures and of the TierStats message. */
#define KVP_TIER_FIGURES(X)                                                                        \
	X(total_tokens, "tier_total_tokens", "gauge", "Tokens total in a pool's tier")             \
	X(free_tokens, "tier_free_tokens", "gauge", "Tokens free in a pool's tier")                \
	X(leased_tokens, "tier_leased_tokens", "gauge", "Tokens leased in a pool's tier")          \
	X(cached_tokens, "tier_cached_tokens", "gauge", "Tokens cached in a pool's tier")          \
	X(evictable_tokens, "tier_evictable_tokens", "gauge", "Tokens evictable in a pool's tier") \
	X(protected_tokens, "tier_protected_tokens", "gauge", "Tokens protected in a pool's tier") \
	X(evicted_tokens, "evicted_tokens_total", "counter", "Tokens evicted from a tier")         \
	X(moving_tokens, "tier_moving_tokens", "gauge",                                            \
	  "Tokens reserved in a pool's tier as destinations of demotion copies in flight")

/* Per pool, labelled {pool}: the field is a member of struct kvp_pool_figures and of the
 * PoolStats message. */
#define KVP_POOL_FIGURES(X)                                                                        \
	X(hit_tokens, "prefix_hit_tokens_total", "counter",                                        \
	  "Tokens matched in the page index (a key call's page counts page_tokens)")               \
	X(queried_tokens, "prefix_queried_tokens_total", "counter",                                \
	  "Tokens asked of the page index (a key call's page counts page_tokens)")                 \
	X(demoted_tokens, "demoted_tokens_total", "counter",                                       \
	  "Tokens demoted from device to host pages")                                              \
	X(promoted_tokens, "promoted_tokens_total", "counter",                                     \
	  "Tokens promoted from host to device pages")                                             \
	X(nodes, "index_pages", "gauge", "Cached pages in the page index, of both kinds of calls") \
	X(sessions, "pool_sessions", "gauge", "Sessions attached to a pool")                       \
	X(session_quota_tokens, "pool_session_quota_tokens", "gauge",                              \
	  "Tokens one session may lease in a pool (0: no quota)")                                  \
	X(token_bytes, "pool_token_bytes", "gauge", "Bytes of K and V one token takes in a pool")

/* Daemon-wide, unlabelled: X(field, prometheus name suffix, type, help, scale); the field is a
 * member of struct kvp_daemon_figures and of the StatusResp message; Prometheus shows
 * value / scale (uptime in seconds). */
#define KVP_DAEMON_FIGURES(X)                                                                      \
	X(sessions, "sessions", "gauge", "Sessions connected", 1)                                  \
	X(uptime_ms, "uptime_seconds", "gauge", "Seconds since kvpoold started", 1000)

#define KVP_FIGURE_FIELD(f, n, t, h) uint64_t f;
#define KVP_DAEMON_FIGURE_FIELD(f, n, t, h, s) uint64_t f;
struct kvp_tier_figures {
	KVP_TIER_FIGURES(KVP_FIGURE_FIELD)
};
struct kvp_pool_figures {
	KVP_POOL_FIGURES(KVP_FIGURE_FIELD)
};
struct kvp_daemon_figures {
	KVP_DAEMON_FIGURES(KVP_DAEMON_FIGURE_FIELD)
};

/* The remote tier's cluster client, daemon-wide, read from it once per loop turn:
 * X(field, prometheus name suffix, type, help). Shown (metrics, Status counters named
 * remote_<field>) only when [remote] is configured. */
#define KVP_REMOTE_STATS(X)                                                                        \
	X(ok, "remote_ok_total", "counter", "Remote writes and deletes acknowledged")              \
	X(hits, "remote_hits_total", "counter",                                                    \
	  "Remote reads and existence checks that found the key")                                  \
	X(misses, "remote_misses_total", "counter",                                                \
	  "Remote reads and existence checks without the key")                                     \
	X(timeouts, "remote_timeouts_total", "counter", "Remote operations timed out")             \
	X(node_down, "remote_node_down_total", "counter",                                          \
	  "Remote operations failed fast: the slot's master not connected")                        \
	X(no_master, "remote_no_master_total", "counter",                                          \
	  "Remote operations failed: no master for the slot")                                      \
	X(redirect_limit, "remote_redirect_limit_total", "counter",                                \
	  "Remote operations failed: too many MOVED/ASK redirects")                                \
	X(protocol_errors, "remote_protocol_errors_total", "counter",                              \
	  "Remote operations failed: an unexpected answer")                                        \
	X(bad_replies, "remote_bad_replies_total", "counter",                                      \
	  "Replies refused: not what the command answers (type, length, elements, range); the "    \
	  "node's connection closed")                                                              \
	X(bad_redirects, "remote_bad_redirects_total", "counter",                                  \
	  "MOVED/ASK redirects refused: to a node the cluster's slot map does not name")           \
	X(closed, "remote_closed_total", "counter", "Remote operations ended by shutdown")         \
	X(moved, "remote_moved_total", "counter", "MOVED redirects followed")                      \
	X(ask, "remote_ask_total", "counter", "ASK redirects followed")                            \
	X(slot_map_loads, "remote_slot_map_loads_total", "counter", "Cluster slot maps loaded")    \
	X(slot_map_changes, "remote_slot_map_changes_total", "counter",                            \
	  "Cluster slot maps loaded that differ from the one before")                              \
	X(connects, "remote_connects_total", "counter", "Connections to cluster nodes made")       \
	X(disconnects, "remote_disconnects_total", "counter",                                      \
	  "Connections to cluster nodes lost or dropped")                                          \
	X(rejected, "remote_rejected_total", "counter",                                            \
	  "Remote operations not submitted: in-flight bound reached (backlog)")                    \
	X(sent_bytes, "remote_sent_bytes_total", "counter", "Value bytes written to the cluster")  \
	X(recv_bytes, "remote_recv_bytes_total", "counter", "Value bytes read from the cluster")   \
	X(inflight_ops, "remote_inflight_ops", "gauge", "Remote operations in flight (backlog)")   \
	X(inflight_bytes, "remote_inflight_bytes", "gauge",                                        \
	  "Bytes of remote operations in flight")                                                  \
	X(slot_map_timeouts, "remote_slot_map_timeouts_total", "counter",                          \
	  "CLUSTER SLOTS refreshes not answered in time (that node dropped)")                      \
	X(spilled_pages, "remote_spilled_pages_total", "counter",                                  \
	  "Host pages written to the cluster as they were evicted")                                \
	X(spill_dropped, "remote_spill_dropped_total", "counter",                                  \
	  "Pages not written: in-flight bound reached (spill or write-through under backlog), or " \
	  "SETs paused after a timeout")                                                           \
	X(set_pauses, "remote_set_pauses_total", "counter",                                        \
	  "Pauses of spill and write-through SETs: one timed out (a master slow or asleep)")       \
	X(written_pages, "remote_written_pages_total", "counter",                                  \
	  "Pages written through to the cluster as they reached the host tier (insert, demotion)") \
	X(written_skipped, "remote_written_skipped_total", "counter",                              \
	  "Write-through pages not written again: the same content was written already")           \
	X(written_resets, "remote_written_resets_total", "counter",                                \
	  "Write-through's table of written keys forgotten (node connection lost or made again, "  \
	  "slot map changed)")                                                                     \
	X(fetched_pages, "remote_fetched_pages_total", "counter",                                  \
	  "Pages read from the cluster and cached by Fetch")                                       \
	X(fetch_misses, "remote_fetch_misses_total", "counter",                                    \
	  "Pages Fetch asked for and did not get (miss, fault or bad value)")                      \
	X(bad_values, "remote_bad_values_total", "counter",                                        \
	  "Values refused for a bad header, length or checksum (deleted)")                         \
	X(foreign_values, "remote_foreign_values_total", "counter",                                \
	  "Values refused as written by a pool of another geometry (deleted)")                     \
	X(bad_mac, "remote_bad_mac_total", "counter",                                              \
	  "Values refused for their MAC: not written under that key by a kvpoold holding the "     \
	  "deployment's secret (also counted as bad values, deleted)")                             \
	X(auth_failures, "remote_auth_failures_total", "counter",                                  \
	  "AUTH refused by a cluster node (wrong user or password; the connection closed)")        \
	X(match_queries, "remote_match_queries_total", "counter",                                  \
	  "Existence queries made for a Match of pages after the local ones")                      \
	X(match_timeouts, "remote_match_timeouts_total", "counter",                                \
	  "Matches answered without the remote figure: match_timeout_ms passed")                   \
	X(remote_pages, "remote_match_pages_total", "counter",                                     \
	  "Pages Matches reported held by the remote tier")

struct kvp_remote_stats {
	KVP_REMOTE_STATS(KVP_FIGURE_FIELD)
};

/* The disk tier's figures (disk_tier.h), per pool: X(field, prometheus name, type, help). */
#define KVP_DISK_STATS(X)                                                                          \
	X(pages, "disk_pages", "gauge", "Pages the disk tier holds")                               \
	X(bytes, "disk_bytes", "gauge", "Page bytes the disk tier holds")                          \
	X(capacity_pages, "disk_capacity_pages", "gauge", "Pages the disk tier has room for")      \
	X(queue_depth, "disk_queue_depth", "gauge", "Disk reads and writes in flight or waiting")  \
	X(written_pages, "disk_written_pages_total", "counter",                                    \
	  "Host pages written to the disk tier (in place or copied)")                              \
	X(written_bytes, "disk_written_bytes_total", "counter", "Page bytes written to the disk")  \
	X(write_dropped, "disk_write_dropped_total", "counter",                                    \
	  "Host pages not written: every staging or disk slot busy (backlog)")                     \
	X(write_skipped, "disk_write_skipped_total", "counter",                                    \
	  "Evicted host pages not written again: the disk holds them already")                     \
	X(read_pages, "disk_read_pages_total", "counter", "Pages read from the disk, checked")     \
	X(read_bytes, "disk_read_bytes_total", "counter", "Page bytes read from the disk")         \
	X(read_misses, "disk_read_misses_total", "counter",                                        \
	  "Pages asked of the disk tier and not had (gone, an I/O error, a failed check)")         \
	X(corrupt_pages, "disk_corrupt_pages_total", "counter",                                    \
	  "Pages whose header or CRC32C failed when read (a miss; the slot freed)")                \
	X(io_errors, "disk_io_errors_total", "counter",                                            \
	  "Disk reads and writes that failed or were short (EIO, ENOSPC, a removed disk)")         \
	X(adopted_pages, "disk_adopted_pages", "gauge",                                            \
	  "Pages found on the disk when the pool started (written by an earlier kvpoold)")         \
	X(evicted_pages, "disk_evicted_pages_total", "counter",                                    \
	  "Pages the disk tier dropped to make room (oldest written first)")                       \
	X(write_us, "disk_write_microseconds_total", "counter",                                    \
	  "Summed latency of the disk writes that completed (per page: divide by written pages)")  \
	X(read_us, "disk_read_microseconds_total", "counter",                                      \
	  "Summed latency of the disk reads that completed")                                       \
	X(adopted_from_log, "disk_adopted_from_log", "gauge",                                      \
	  "1: the pages found at start came from the store's log; 0: from every slot's header")    \
	X(adopt_us, "disk_adopt_microseconds", "gauge",                                            \
	  "Time the pool's start spent reading the store's log or its slot headers")               \
	X(log_bytes, "disk_log_bytes", "gauge", "Bytes of the store's log region")                 \
	X(log_written_bytes, "disk_log_written_bytes_total", "counter",                            \
	  "Bytes of log blocks written (records of pages stored and freed, checkpoints)")          \
	X(log_checkpoints, "disk_log_checkpoints_total", "counter",                                \
	  "Log generations started with a checkpoint of the map (at start, log full, an error)")   \
	X(log_errors, "disk_log_errors_total", "counter",                                          \
	  "Log writes that failed (a new checkpoint follows; the pages stay checked when read)")   \
	X(write_inplace, "disk_write_inplace_total", "counter",                                    \
	  "Pages written from the host page itself, ahead of eviction (no copy)")                  \
	X(write_copied, "disk_write_copied_total", "counter",                                      \
	  "Evicted host pages copied to a staging slot and written (not reached in place)")

struct kvp_disk_stats {
	KVP_DISK_STATS(KVP_FIGURE_FIELD)
};

/* The RPC families, labelled by call or code: X(id, prometheus name suffix, type, help). */
#define KVP_RPC_FAMILIES(X)                                                                        \
	X(KVP_RPC_FAMILY_CALLS, "rpc_total", "counter", "RPCs served, by call")                    \
	X(KVP_RPC_FAMILY_FAILURES, "rpc_failures_total", "counter",                                \
	  "RPCs answered with an error, by code")                                                  \
	X(KVP_RPC_FAMILY_DURATION, "rpc_duration_seconds", "histogram",                            \
	  "Time kvpoold spends on an RPC: decode, serve, encode the reply")

#define KVP_RPC_FAMILY_ID(id, n, t, h) id,
enum kvp_rpc_family { KVP_RPC_FAMILIES(KVP_RPC_FAMILY_ID) KVP_RPC_FAMILY_MAX };

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
