/* remote_tier.h - a pool's pages in the remote tier (remote.h drives the cluster client): host
 * pages about to be evicted are written out first (remote = spill, write-through), pages a host
 * Insert publishes are written at once (write-through); rpc/'s Match asks it how many of the
 * pages after the local ones it holds, and Fetch has them read into host pages (below.h).
 *
 * Content keys (remote_value.h): token-keyed namespaces chain SHA-256 over the page tokens from
 * the first page; hash-keyed ones use the engine's key (as is when it is 32 bytes, else its
 * SHA-256); both under "kvp:<pool fingerprint>:<t|k><namespace>:". Everything runs on the loop
 * thread and never waits: a spill that does not fit the in-flight bounds is dropped (counted),
 * a Match's query is bounded in keys (match_max_pages) and time (match_timeout_ms), and a value
 * whose header, fingerprint or checksum is wrong is a miss, counted and deleted. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "below.h"
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
/* Adds the tier's counters (spilled, fetched, bad values, Match queries) to out. */
void kvp_rt_stats_read(const struct kvp_daemon *d, struct kvp_remote_stats *out);
/* Answers the Match waits whose match_timeout_ms passed (remote_pages 0) and re-arms the
 * driver's alarm for the next one. Called after the driver ran (kvp_remote_on_ready). */
void kvp_rt_expire(struct kvp_daemon *d);

/* The tier below host for rpc/'s Match and Fetch (below.h). The most pages one query or read
 * names (match_max_pages) when the tier serves p, else 0. */
uint32_t kvp_rt_serves(struct kvp_daemon *d, const struct kvpd_pool *p);
/* Asks the cluster how many leading pages of run it holds, in one existence query (counted):
 * 0, and done(arg, held) is called once, later (with 0 once match_timeout_ms passed first); or
 * a negative errno with nothing asked (-ENOENT: the tier does not serve p). */
int kvp_rt_query(struct kvp_daemon *d, struct kvpd_pool *p, const struct kvp_below_run *run,
		 kvp_below_held_fn done, void *arg);
/* Reads run's pages into p's host pages pages[0 .. run->n) (the caller keeps them leased until
 * every read ended): returns how many reads went out; done(arg, i, ok) is called once for each
 * of them, later. A value whose header, fingerprint or checksum is wrong is a miss (not ok),
 * counted and deleted. A negative errno when none went out (those are misses). */
int kvp_rt_read(struct kvp_daemon *d, struct kvpd_pool *p, const struct kvp_below_run *run,
		const uint32_t *pages, kvp_below_read_fn done, void *arg);

/* The events' view of the remote tier (loop/loop_events.c): a page of p the cluster holds now
 * (stored: a SET of it, spill or write-through, landed; the same content SET again is told again)
 * or that this kvpoold found gone (a Fetch's read found no value: expired, evicted or deleted;
 * or a value refused and deleted). key: the page's block hash as the page index knows it (the
 * engine's key of a key call's page, a token page's kvp_page_key). Valid only during the call,
 * on the loop thread. What the cluster drops unasked (TTL, maxmemory) is never told. */
typedef void (*kvp_rt_observe_fn)(void *ctx, const struct kvpd_pool *p, const uint8_t *key,
				  size_t klen, bool stored);
/* Sets (fn NULL: clears) the observer. No-op without [remote]. */
void kvp_rt_set_observer(struct kvp_daemon *d, kvp_rt_observe_fn fn, void *ctx);

/* Write-through of a host Insert: the whole pages pages[0 .. n) now cached at page positions
 * [first, first + n) of tokens (token-keyed). */
void kvp_rt_written(struct kvp_daemon *d, struct kvpd_pool *p, uint64_t ns, const uint32_t *tokens,
		    uint32_t first, const uint32_t *pages, uint32_t n);
/* The same for hash-keyed pages: keys[i] cached in pages[i]. */
void kvp_rt_written_keys(struct kvp_daemon *d, struct kvpd_pool *p, uint64_t ns,
			 const ProtobufCBinaryData *keys, const uint32_t *pages, uint32_t n);
