/* kvpool_caps.h - the capability bits a Hello offers and answers, shared by kvpoold and
 * libkvpool (installed beside kvpool.h). A client offers what it handles and names what it
 * requires; the daemon answers the intersection of the offer with what it supports and refuses
 * (VERSION) a client that requires a bit it lacks. A client that offers nothing works with
 * every daemon of protocol 1. */
#ifndef KVPOOL_CAPS_H
#define KVPOOL_CAPS_H

#include <stdint.h>

/* The peer takes frames it did not ask for: a Response with id 0 that carries a result (a
 * pushed notice), queued by the client as an event. */
#define KVP_CAP_EVENTS (UINT64_C(1) << 0)

/* Every bit this tree defines. */
#define KVP_CAP_ALL KVP_CAP_EVENTS
/* What kvpoold of this tree supports. */
#define KVP_CAPS_DAEMON KVP_CAP_EVENTS

#endif
