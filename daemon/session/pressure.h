/* pressure.h - pressure notices: each pool tier's free pages against its configured watermark
 * (pressure_watermark), and for every session that asked at Attach the notices it is owed: one
 * when a tier falls below the watermark (before eviction has to start) and one when it is back.
 * No sockets here: the loop asks which sessions have notices due and sends the Responses this
 * module builds. At most one notice per session, pool and tier is pending: a newer state
 * replaces an unsent one. */
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "config.h"
#include "index.h"
#include "pool.h"

/* The pools' side, in struct kvp_daemon. */
struct kvpd_pressure {
	uint8_t under[KVP_MAX_POOLS];  /* bit t: tier t below its watermark */
	uint8_t short_[KVP_MAX_POOLS]; /* bit t: an allocation wanted more than was free (since
					* the last tick): under, whatever the count says */
	uint64_t seq[KVP_MAX_POOLS][KVP_TIER_ID_MAX]; /* changes of that state so far */
	/* bit t: notices built now give the figures of before[t], from before the allocation
	 * that put the tier under (kvp_pressure_short), not the tier's figures after it */
	uint8_t figures[KVP_MAX_POOLS];
	struct kvp_tier_counts before[KVP_MAX_POOLS][KVP_TIER_ID_MAX];
	uint64_t before_reserved[KVP_MAX_POOLS][KVP_TIER_ID_MAX];
	bool walk;    /* a state changed or a session subscribed: look at the sessions */
	bool pending; /* some session had a notice it could not be sent at the last walk */
};

/* A session's side, in struct kvp_session. */
struct kvpd_pressure_sub {
	uint8_t told[KVP_MAX_POOLS]; /* bit t: the last notice sent said tier t is below */
	bool on[KVP_MAX_POOLS];	     /* notices asked and granted for the pool */
	uint32_t coalesced[KVP_MAX_POOLS][KVP_TIER_ID_MAX]; /* states replaced unsent */
	uint64_t last_ms[KVP_MAX_POOLS];		    /* when the last notice went */
};

struct kvp_daemon;
struct kvp_reply;
struct kvp_session;
struct kvpd_pool;

/* The watermark of a tier of p in pages (0: none, or no such tier). */
uint64_t kvp_pressure_watermark(const struct kvpd_pool *p, int tier);
/* Attach asked for notices (want): granted when s agreed to events in Hello. Returns whether
 * notices are on for s in p. */
bool kvp_pressure_attach(struct kvp_daemon *d, struct kvp_session *s, struct kvpd_pool *p,
			 bool want);
/* s leaves p: no more notices for it. */
void kvp_pressure_detach(struct kvp_session *s, const struct kvpd_pool *p);
/* Recomputes every pool tier's state (after requests were served, and on the tick). Returns
 * whether the loop should look at the sessions now: a state changed or a session subscribed,
 * or (tick true) some session still has a notice pending. */
bool kvp_pressure_scan(struct kvp_daemon *d, bool tick);
/* An allocation of tier of p took more pages than were free (it evicted, took reserves back or
 * failed; ev: the pool's events, with the tier's figures from before it): the tier counts as
 * below its watermark until the next tick, when it has one. Returns whether that changed its
 * state: the loop then pushes the notices at once, ahead of the allocation's reply, and they
 * give the figures from before (until kvp_pressure_figures_done). */
bool kvp_pressure_short(struct kvp_daemon *d, const struct kvpd_pool *p, int tier,
			const struct kvp_pool_events *ev);
/* Notices built from now on give the tiers' current figures. */
void kvp_pressure_figures_done(struct kvp_daemon *d);
/* Whether s has a notice pending (a tier's state differs from the one it was told). */
bool kvp_pressure_owed(const struct kvp_daemon *d, const struct kvp_session *s);
/* Builds into r (initialised by the caller with id 0) the next notice owed to s whose pool's
 * rate limit allows it at now, and books it as sent. Returns 1 when built, 0 when nothing is
 * due, a negative errno (-ENOMEM) when it could not be built (it stays pending). */
int kvp_pressure_next(struct kvp_daemon *d, struct kvp_session *s, uint64_t now,
		      struct kvp_reply *r);
/* After the loop's walk: whether some session was left with a notice pending. */
void kvp_pressure_walked(struct kvp_daemon *d, bool pending);
