/* reserve.h - per-session page reserves: pages booked to a session (counted as leased) and
 * shared with it in a memfd region of two rings per tier (proto/kvp_ring.h), so that its
 * common Alloc and Free need no call. Everything the client writes there is checked against
 * the session's books; a bad ring ends the reserve (its pages back) and answers PROTOCOL. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon.h"

struct kvp_reserve;

/* One bind of a Reserve call: pages the client took from its ring of tier, made lease id. */
struct kvp_reserve_bind {
	uint64_t lease_id;
	int tier;
	const uint32_t *pages;
	uint32_t n;
};

/* Opens s's reserve in p (ending one it had), want[t] pages asked per tier, granted up to
 * conf.reserve_max_pages, the session and uid quotas and reserve_free_percent of the tier's
 * free pages (granted 0 everywhere: no reserve, returns 0 with *out NULL). 0 or a negative
 * Code with f filled (INTERNAL). */
int kvp_reserve_open(struct kvp_daemon *d, struct kvp_session *s, struct kvpd_pool *p,
		     const uint32_t want[KVP_TIER_ID_MAX], struct kvp_reserve **out,
		     struct kvp_fail *f);
/* Unmaps and closes s's reserve regions (kept past their reserves, see reserve.c); at the
 * session's end, its reserves ended. */
void kvp_reserve_regions_free(struct kvp_session *s);
/* Ends s's reserve in p, if any: every page it books returns to the pool. */
void kvp_reserve_end(struct kvp_session *s, struct kvpd_pool *p);
struct kvpd_pool *kvp_reserve_pool(const struct kvp_reserve *r);
int kvp_reserve_fd(const struct kvp_reserve *r);
size_t kvp_reserve_bytes(const struct kvp_reserve *r);
uint32_t kvp_reserve_slots(const struct kvp_reserve *r);
uint32_t kvp_reserve_granted(const struct kvp_reserve *r, int tier);
/* Pages of tier booked to the reserve (in its ring, or taken by the client and not given
 * back or bound). */
uint32_t kvp_reserve_pages(const struct kvp_reserve *r, int tier);

/* The Reserve call: reads both rings of every tier, makes the binds, refills, stores seq as
 * served. Returns binds made, or a negative Code with f filled: PROTOCOL for a bad ring (the
 * reserve ends), NOT_FOUND for a bind naming a page the client did not take, INVALID_ARGUMENT,
 * LIMIT_EXCEEDED. Binds before a failing one stay made. */
int kvp_reserve_call(struct kvp_daemon *d, struct kvp_session *s, struct kvp_reserve *r,
		     uint64_t seq, const struct kvp_reserve_bind *binds, uint32_t nbinds,
		     struct kvp_fail *f);
/* The pool's reclaim hook (ctx: the daemon): takes back the pages sessions' reserves hold
 * unused in their rings until `pages` are freed or none is left. Returns pages freed. */
uint32_t kvp_reserve_reclaim(void *ctx, struct kvpd_pool *p, int tier, uint32_t pages);
/* Pages one turn of kvpoold's own upkeep may move (refills, returns): a session's upkeep costs
 * what its tiers may move, and at most this. */
#define KVP_RESERVE_TURN_PAGES 65536u
/* kvpoold's own refills and drains, with no call from the client: every reserved tier of s
 * whose fill ring is below its low watermark or whose return ring is at its high one
 * (kvp_ring.h) is synced and refilled, as a Reserve call would; a bad ring ends that reserve
 * (the session's next Reserve call answers PROTOCOL). Never waits. All or nothing: when what
 * s may move (at most KVP_RESERVE_TURN_PAGES) exceeds *budget, nothing is done and it returns
 * false (s is served first next turn); else *budget is charged and it returns true. */
bool kvp_reserve_upkeep(struct kvp_daemon *d, struct kvp_session *s, uint32_t *budget);
/* Whether the reserve ended for a bad ring (its calls answer PROTOCOL). */
bool kvp_reserve_dead(const struct kvp_reserve *r);
/* Its leases are booked to its pool and session, and its copy of the ring agrees with
 * them. For kvp_daemon_check. 0 or -EFAULT. */
int kvp_reserve_check(const struct kvp_reserve *r);
