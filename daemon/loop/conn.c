/* conn.c - a connection's state machine and limits (conn.h). */
#include "conn.h"

#include <errno.h>

/* legal[from] = the states from may move to. */
static const unsigned legal[CONN_STATE_MAX] = {
	[CONN_HANDSHAKE] = 1u << CONN_OPEN | 1u << CONN_FLUSHING | 1u << CONN_CLOSING,
	[CONN_OPEN] = 1u << CONN_FLUSHING | 1u << CONN_CLOSING,
	[CONN_FLUSHING] = 1u << CONN_CLOSING,
	[CONN_CLOSING] = 0,
};

void conn_init(struct conn *c, const struct conn_limits *lim, uint64_t now)
{
	*c = (struct conn){
		.state = CONN_HANDSHAKE,
		.budget = lim->turn_budget,
		.accepted_ms = now,
		.last_ms = now,
		.lim = lim,
	};
}

int conn_set_state(struct conn *c, enum conn_state s)
{
	if ((unsigned)s >= CONN_STATE_MAX || (unsigned)c->state >= CONN_STATE_MAX ||
	    !(legal[c->state] & 1u << s))
		return -EINVAL;
	c->state = s;
	if (s == CONN_OPEN)
		c->greeted = true;
	if (s != CONN_FLUSHING)
		c->flush_deadline_ms = 0;
	if (s == CONN_CLOSING)
		c->partial_since_ms = 0;
	return 0;
}

const char *conn_state_name(enum conn_state s)
{
	static const char *const names[CONN_STATE_MAX] = {
		[CONN_HANDSHAKE] = "handshake",
		[CONN_OPEN] = "open",
		[CONN_FLUSHING] = "flushing",
		[CONN_CLOSING] = "closing",
	};

	return (unsigned)s < CONN_STATE_MAX ? names[s] : "?";
}

bool conn_serving(const struct conn *c)
{
	return c->state == CONN_HANDSHAKE || c->state == CONN_OPEN;
}

bool conn_paused(const struct conn *c)
{
	return c->out_bytes >= c->lim->outq_max;
}

bool conn_may_recv(const struct conn *c)
{
	return conn_serving(c) && !conn_paused(c) && !conn_held(c, CONN_HOLD_RECV);
}

void conn_hold(struct conn *c, enum conn_hold h)
{
	c->holds |= (unsigned)h;
}

void conn_release(struct conn *c, enum conn_hold h)
{
	c->holds &= ~(unsigned)h;
}

bool conn_held(const struct conn *c, enum conn_hold h)
{
	return (c->holds & (unsigned)h) != 0;
}

bool conn_freeable(const struct conn *c)
{
	return c->state == CONN_CLOSING && c->holds == 0;
}

void conn_turn_begin(struct conn *c)
{
	c->budget = c->lim->turn_budget;
}

bool conn_turn_take(struct conn *c)
{
	if (c->budget <= 0)
		return false;
	c->budget--;
	return true;
}

void conn_outq_add(struct conn *c, size_t n, uint64_t now)
{
	if (!c->out_bytes && n)
		c->out_since_ms = now ? now : 1;
	c->out_bytes += n;
}

void conn_outq_sent(struct conn *c, size_t n)
{
	c->out_bytes = n > c->out_bytes ? 0 : c->out_bytes - n;
	if (!c->out_bytes)
		c->out_since_ms = 0;
}

void conn_input_note(struct conn *c, bool pending, uint64_t now)
{
	if (!pending)
		c->partial_since_ms = 0;
	else if (!c->partial_since_ms)
		c->partial_since_ms = now ? now : 1;
}

void conn_watch_exit(struct conn *c, bool watched)
{
	c->watched = watched;
}

void conn_activity(struct conn *c, uint64_t now)
{
	c->last_ms = now;
}

void conn_backlog(struct conn *c, bool waiting)
{
	c->backlog = waiting;
}

void conn_flush_deadline(struct conn *c, uint64_t deadline_ms)
{
	if (c->state == CONN_FLUSHING)
		c->flush_deadline_ms = deadline_ms;
}

static bool past(uint64_t now, uint64_t since, uint64_t limit)
{
	return now > since && now - since > limit;
}

enum conn_expiry conn_expiry(const struct conn *c, uint64_t now)
{
	const struct conn_limits *l = c->lim;

	if (c->state == CONN_CLOSING || (unsigned)c->state >= CONN_STATE_MAX)
		return CONN_LIVE;
	if (c->state == CONN_FLUSHING && c->flush_deadline_ms && now > c->flush_deadline_ms)
		return CONN_EXPIRED_FLUSH;
	if (!c->greeted && past(now, c->accepted_ms, l->handshake_ms))
		return CONN_EXPIRED_HANDSHAKE;
	if (c->state != CONN_FLUSHING && c->partial_since_ms &&
	    past(now, c->partial_since_ms, l->partial_ms))
		return CONN_EXPIRED_PARTIAL;
	/* A watched peer may be quiet as long as it lives; only replies it leaves unread run
	 * the keep-alive then, from the later of its last call and when they began to wait (a
	 * notice queued for a long-quiet peer is not unread yet). */
	if (c->greeted && l->keepalive_ms && !c->backlog && (!c->watched || c->out_bytes)) {
		uint64_t since = c->last_ms;

		if (c->watched && c->out_since_ms > since)
			since = c->out_since_ms;
		if (past(now, since, l->keepalive_ms))
			return c->out_bytes ? CONN_EXPIRED_UNREAD : CONN_EXPIRED_KEEPALIVE;
	}
	return CONN_LIVE;
}

const char *conn_expiry_reason(enum conn_expiry e)
{
	static const char *const reasons[CONN_EXPIRY_MAX] = {
		[CONN_LIVE] = "live",
		[CONN_EXPIRED_FLUSH] = "reply not read in time",
		[CONN_EXPIRED_HANDSHAKE] = "no Hello within the handshake deadline",
		[CONN_EXPIRED_PARTIAL] = "half-sent frame not completed in time",
		[CONN_EXPIRED_KEEPALIVE] = "reclaimed: no call within keepalive_ms",
		[CONN_EXPIRED_UNREAD] = "reclaimed: replies not read within keepalive_ms",
	};

	return (unsigned)e < CONN_EXPIRY_MAX ? reasons[e] : "?";
}
