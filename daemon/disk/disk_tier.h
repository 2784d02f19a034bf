/* disk_tier.h - the disk tier of the pools with disk != off: below host, above remote. Host
 * pages reach the pool's disk store (disk.h) with O_DIRECT through the pool's io_uring ring,
 * all of a turn's I/O in one submission, at most disk_queue_depth in flight. Write-back: once
 * the host tier runs short, the pages eviction would take next are written where they are (one
 * WRITEV of a 4 KiB header and the host page, no copy), held by the index meanwhile
 * (kvp_index_hold), so that eviction finds them on the disk; a page evicted before that is
 * copied with its CRC32C into one of the pool's staging slots (64 MiB of them, 32 to 1024
 * slots, registered with the ring as one fixed buffer) and written from there; a page that
 * finds no free staging slot is dropped and counted, so an Alloc never waits. Write-through:
 * every page cached in the host tier is written in place as soon as it is there. Reads bring
 * pages back for Fetch straight into leased host pages (one READV: the header into a staging
 * slot, the page in place), checked against their header and CRC32C: a torn or corrupt page is
 * a miss (counted, its slot freed), never wrong bytes; an I/O error is a miss too. Each pool's
 * ring signals one eventfd the event loop polls (kvp_dt_fd); the loop never waits on the disk.
 * Single-threaded: the event loop owns it. */
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "below.h"
#include "index.h"
#include "stats.h"

struct kvpd_pool;
struct kvp_dt;

/* Pages one Match reports and one Fetch reads from the disk at most. */
#define KVP_DT_RUN_MAX 4096u

/* A new disk tier without pools: NULL with errno (no eventfd). */
struct kvp_dt *kvp_dt_new(void);
/* Ends every pool's I/O (waiting for what is in flight) and frees it all. Accepts NULL. */
void kvp_dt_free(struct kvp_dt *dt);
/* Opens the store of every pool of pools[0 .. n) whose disk is not off and not bound yet, and
 * hooks its spill; forgets pools no longer listed (their I/O in flight ends as misses). 0, or
 * the first failure's negative errno with a line logged (that pool runs without a disk tier).
 * Cheap to call on every loop turn. */
int kvp_dt_bind(struct kvp_dt *dt, struct kvpd_pool *const *pools, uint32_t n);
/* Starts this turn's write-back (or write-through) of host pages in place and submits what
 * the turn queued (those writes, spilled pages' writes, reads). */
void kvp_dt_submit(struct kvp_dt *dt);
/* The eventfd that is readable when a disk I/O completed. */
int kvp_dt_fd(const struct kvp_dt *dt);
/* Handles every completed I/O (reads call their done), after kvp_dt_bind(dt, pools, n): a read
 * of a pool gone ends as a miss, its bytes never copied. */
void kvp_dt_run(struct kvp_dt *dt, struct kvpd_pool *const *pools, uint32_t n);

/* Whether p has a disk tier now. */
bool kvp_dt_has(const struct kvp_dt *dt, const struct kvpd_pool *p);
/* The tier below host for rpc/'s Match and Fetch (below.h), asked before the remote tier. The
 * leading pages of run that p's disk holds (at most KVP_DT_RUN_MAX), known without I/O (the key
 * map is in memory); 0 without a disk tier. Token pages are named by the index's key of page
 * run->from - 1 when it is cached, else by the chain from page 0. */
uint32_t kvp_dt_held(const struct kvp_dt *dt, struct kvpd_pool *p, const struct kvp_below_run *run);
/* Starts reading pages [0, run->n) of run from p's disk into host pages pages[0 .. run->n) (the
 * caller leases them): returns how many reads went out (a page not on the disk any more goes
 * not); done(arg, i, ok) is called once for each of them, later, on the loop thread, never from
 * this call. A negative errno when none went out (-ENOENT: no disk tier, -ENOMEM). */
int kvp_dt_read(struct kvp_dt *dt, struct kvpd_pool *p, const struct kvp_below_run *run,
		const uint32_t *pages, kvp_below_read_fn done, void *arg);

/* KV events: fn is told of every page stored on a pool's disk or gone from it (written over,
 * corrupt, an I/O error); a pool bound later tells the pages it adopted, as stored, when it is
 * bound. key is valid only during the call. fn NULL: nobody. */
typedef void (*kvp_dt_observe_fn)(void *ctx, const struct kvpd_pool *p, uint64_t ns, int keyed,
				  const uint8_t *key, size_t klen, bool stored);
void kvp_dt_set_observer(struct kvp_dt *dt, kvp_dt_observe_fn fn, void *ctx);
/* Tells the observer of every page on p's disk now, as stored (a snapshot). */
void kvp_dt_observe_all(const struct kvp_dt *dt, const struct kvpd_pool *p);

/* Adds p's disk tier figures to st (p NULL: every pool's; nothing without a disk tier). */
void kvp_dt_stats(const struct kvp_dt *dt, const struct kvpd_pool *p, struct kvp_disk_stats *st);
