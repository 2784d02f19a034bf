/* loop_events.h - the KV event publisher (events/) fed by the pools' page indexes: started with
 * kvpoold, one batch per loop turn, replay and snapshot requests answered each turn. */
#pragma once
#include <stddef.h>

#include "loop_server.h"

struct kvp_daemon;

/* Starts the publisher of an [events] section (nothing without one): binds its sockets, hooks
 * the page index of every pool with events = on, and publishes the first batch, [AllBlocksCleared,
 * BlockStored of every page the pools hold], as sequence 0. 0, or -1 with why in
 * err: a socket cannot be bound, or kvpoold was built without libzmq and msgpack-c. */
int kvp_loop_events_start(struct kvp_daemon *d, char *err, size_t errlen);
/* End of a loop turn: hooks pools a reload created, publishes what is staged once its first
 * event is batch_us old (a timeout on the ring publishes it when the loop has nothing else to
 * do; batch_us 0: at the end of every turn), answers replay and snapshot requests, and copies the
 * figures into the daemon's counters. */
void kvp_loop_events_turn(struct server *sv);
struct kvp_events;
/* The publisher, for a tier other than those observed here (the page index's device and host
 * tiers, the disk tier, the remote tier): it stages its pages' stores and removals with
 * kvp_events_page (events.h), on the loop thread; they go out with the page index's. NULL
 * without [events]. */
struct kvp_events *kvp_loop_events_publisher(struct kvp_daemon *d);
/* Publishes what is staged, unhooks the pools and closes the sockets. */
void kvp_loop_events_stop(struct kvp_daemon *d);
