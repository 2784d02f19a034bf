/* remote_tier.h - a pool's pages in the remote tier (remote.h drives the cluster client): host
 * pages about to be evicted are written out first (remote = spill, write-through), pages a host
 * Insert publishes are written at once (write-through), a Match asks the cluster how many of the
 * pages after the local ones it holds, and Fetch reads them into host pages and the cache.
 *
 * Content keys (remote_value.h): token-keyed namespaces chain SHA-256 over the page tokens from
 * the first page; hash-keyed ones use the engine's key (as is when it is 32 bytes, else its
 * SHA-256); both under "kvp:<pool fingerprint>:<t|k><namespace>:". Everything runs on the loop
 * thread and never waits: a spill that does not fit the in-flight bounds is dropped (counted),
 * a Match's query is bounded in keys (match_max_pages) and time (match_timeout_ms), and a value
 * whose header, fingerprint or checksum is wrong is a miss, counted and deleted. */
#pragma once
#include <stdint.h>

#include "kvpool.pb-c.h"

struct kvp_daemon;
struct kvp_session;
struct kvpd_pool;
struct kvp_remote_stats;

/* Hooks the spill of every pool whose remote mode is not off (once per pool; cheap to call on
 * every loop turn, which also binds pools a reload created). No-op without [remote]. */
void kvp_rt_bind(struct kvp_daemon *d);
/* Frees the tier's state; after kvp_remote_free (whose completions it takes). Accepts none. */
void kvp_rt_free(struct kvp_daemon *d);
/* Host pages of p that Fetches in flight hold in their leases (outside every session), for the
 * books check (kvp_daemon_check); a lease that fails kvp_lease_check counts UINT64_MAX / 2. */
uint64_t kvp_rt_leased(const struct kvp_daemon *d, const struct kvpd_pool *p);
/* Adds the tier's counters (spilled, fetched, bad values, Match queries) to out. */
void kvp_rt_stats_read(const struct kvp_daemon *d, struct kvp_remote_stats *out);
/* Answers the Match waits whose match_timeout_ms passed (remote_pages 0) and re-arms the
 * driver's alarm for the next one. Called after the driver ran (kvp_remote_on_ready). */
void kvp_rt_expire(struct kvp_daemon *d);

/* After a local Match answered m (lock taken and booked already): when pages follow the local
 * ones in a pool with the remote tier, submits one existence query of the next keys and takes
 * a ticket for q: returns KVP_DEFERRED, and m's fields are sent later with remote_pages set.
 * Otherwise 0 (answer m now). Never fails the Match: a refused query is remote_pages 0. */
int kvp_rt_match(struct kvp_daemon *d, struct kvp_session *s, const Kvpool__Request *q,
		 struct kvpd_pool *p, const Kvpool__MatchResp *m);
int kvp_rt_match_keys(struct kvp_daemon *d, struct kvp_session *s, const Kvpool__Request *q,
		      struct kvpd_pool *p, const Kvpool__MatchKeysResp *m);

/* Write-through of a host Insert: the whole pages pages[0 .. n) now cached at page positions
 * [first, first + n) of tokens (token-keyed). */
void kvp_rt_written(struct kvp_daemon *d, struct kvpd_pool *p, uint64_t ns, const uint32_t *tokens,
		    uint32_t first, const uint32_t *pages, uint32_t n);
/* The same for hash-keyed pages: keys[i] cached in pages[i]. */
void kvp_rt_written_keys(struct kvp_daemon *d, struct kvpd_pool *p, uint64_t ns,
			 const ProtobufCBinaryData *keys, const uint32_t *pages, uint32_t n);
