/* conn.h - a connection's state machine: its state (changed only by conn_set_state), the
 * operations that keep it alive (holds), its per-turn request budget, its output-queue limit
 * and its deadlines (handshake, half-sent frame, reply flush, keep-alive). No I/O and no
 * clock here: the loop passes the time in, so each rule is tested on its own. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum conn_state {
	CONN_HANDSHAKE, /* accepted, no Hello yet: the handshake deadline runs */
	CONN_OPEN,	/* said Hello: served; the keep-alive runs */
	CONN_FLUSHING,	/* its last reply is queued: nothing more is read, closed once sent;
			 * the flush deadline, and the handshake or keep-alive limit, still run */
	CONN_CLOSING,	/* session ended: the memory goes when the last hold is released */
	CONN_STATE_MAX,
};

/* What refers to a connection besides the connection list; a closing one is freed when none
 * is left. */
enum conn_hold {
	CONN_HOLD_RECV = 1u << 0,  /* a receive is in flight */
	CONN_HOLD_SEND = 1u << 1,  /* a send is in flight */
	CONN_HOLD_PIDFD = 1u << 2, /* a poll of the peer's pidfd is in flight */
	CONN_HOLD_SERVE = 1u << 3, /* the loop is serving its frames (up the call stack) */
	CONN_HOLD_READY = 1u << 4, /* it is on the loop's ready list */
};

/* Why a connection's time is up. */
enum conn_expiry {
	CONN_LIVE,
	CONN_EXPIRED_FLUSH,	/* FLUSHING past its flush deadline */
	CONN_EXPIRED_HANDSHAKE, /* no Hello within handshake_ms */
	CONN_EXPIRED_PARTIAL,	/* a half-sent frame not completed within partial_ms */
	CONN_EXPIRED_KEEPALIVE, /* no call within keepalive_ms (its peer's exit not watched) */
	CONN_EXPIRED_UNREAD,	/* queued replies not read within keepalive_ms */
	CONN_EXPIRY_MAX,
};

struct conn_limits {
	int turn_budget;       /* frames served per turn */
	size_t outq_max;       /* queued reply bytes before reading stops */
	uint64_t handshake_ms; /* Hello within this of the accept (hello_timeout_ms) */
	uint64_t partial_ms;   /* a half-sent frame completes within this */
	/* keepalive_ms: an open connection whose peer's exit is not watched calls within this,
	 * and any open connection reads its queued replies within this; 0: no limit */
	uint64_t keepalive_ms;
};

struct conn {
	enum conn_state state;
	unsigned holds; /* enum conn_hold bits */
	bool greeted;	/* it was OPEN (said Hello): keep-alive, not the handshake, applies */
	bool backlog; /* complete requests wait to be served: kvpoold, not the client, is behind */
	bool watched; /* the peer process's exit is watched (a pidfd): quiet is not dead */
	int budget;   /* frames left this turn */
	size_t out_bytes;
	uint64_t accepted_ms, last_ms, partial_since_ms, flush_deadline_ms;
	uint64_t out_since_ms; /* when out_bytes last went from 0 to more; 0 while it is 0 */
	const struct conn_limits *lim;
};

/* A connection accepted at now, in CONN_HANDSHAKE. lim must outlive it (its values may change:
 * a reload changes keepalive_ms). */
void conn_init(struct conn *c, const struct conn_limits *lim, uint64_t now);
/* Moves c to s. The only legal moves go forward: HANDSHAKE -> OPEN -> FLUSHING -> CLOSING,
 * any of them may be skipped. Returns 0, or -EINVAL for any other move (c unchanged). */
int conn_set_state(struct conn *c, enum conn_state s);
/* "handshake", "open", "flushing", "closing"; "?" out of range. */
const char *conn_state_name(enum conn_state s);

static inline bool conn_closing(const struct conn *c)
{
	return c->state == CONN_CLOSING;
}

/* Whether requests are still read and served (HANDSHAKE or OPEN). */
bool conn_serving(const struct conn *c);
/* Whether the output queue is at its limit (reading waits until it drains below). */
bool conn_paused(const struct conn *c);
/* Whether a receive may be armed now: serving, not paused, none in flight. */
bool conn_may_recv(const struct conn *c);

void conn_hold(struct conn *c, enum conn_hold h);
void conn_release(struct conn *c, enum conn_hold h);
bool conn_held(const struct conn *c, enum conn_hold h);
/* Whether c may be freed: CLOSING with no hold left. */
bool conn_freeable(const struct conn *c);

/* Starts a turn: the budget is refilled. */
void conn_turn_begin(struct conn *c);
/* Takes one frame from this turn's budget: false when it is spent. */
bool conn_turn_take(struct conn *c);

/* Reply bytes queued at now (the unread-replies clock of a watched peer starts when the queue
 * stops being empty), and sent. */
void conn_outq_add(struct conn *c, size_t n, uint64_t now);
void conn_outq_sent(struct conn *c, size_t n);

/* After a turn: pending says whether a half frame waits in the input. Starts the half-frame
 * clock at now, or stops it. */
void conn_input_note(struct conn *c, bool pending, uint64_t now);
/* Whether the peer's exit is watched (its pidfd is polled). A watched connection is never
 * reclaimed for making no call: its process's exit or its socket's close ends it. The
 * keep-alive then runs only while replies wait unread (a client that stopped reading). */
void conn_watch_exit(struct conn *c, bool watched);
/* A call was served, or reply bytes were read by the client, at now (keep-alive). */
void conn_activity(struct conn *c, uint64_t now);
/* After a turn: whether complete requests still wait to be served. While they do, the
 * keep-alive does not run (the client is not the one behind); it restarts from the next
 * activity. */
void conn_backlog(struct conn *c, bool waiting);
/* Sets the time by which a FLUSHING connection's queue must be sent (0: none). */
void conn_flush_deadline(struct conn *c, uint64_t deadline_ms);
/* Which deadline, if any, c has passed at now. */
enum conn_expiry conn_expiry(const struct conn *c, uint64_t now);
/* The log text of an expiry ("no Hello within the handshake deadline", ...). */
const char *conn_expiry_reason(enum conn_expiry e);
