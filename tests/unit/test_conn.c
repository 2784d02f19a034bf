/* test_conn.c - CUnit tests of daemon/loop/conn.c: the connection state machine (legal and illegal
 * moves), holds, the per-turn budget, the output-queue limit, and every deadline with the
 * clock passed in. */
#include "conn.h"

#include "suite.h"
#include <CUnit/Basic.h>
#include <errno.h>
#include <string.h>

static const struct conn_limits g_lim = {
	.turn_budget = 4,
	.outq_max = 1000,
	.handshake_ms = 5000,
	.partial_ms = 3000,
	.keepalive_ms = 10000,
};

static void test_conn_init_handshake(void)
{
	struct conn c;

	conn_init(&c, &g_lim, 100);
	CU_ASSERT_EQUAL(c.state, CONN_HANDSHAKE);
	CU_ASSERT(conn_serving(&c));
	CU_ASSERT(conn_may_recv(&c));
	CU_ASSERT_FALSE(conn_closing(&c));
	CU_ASSERT_FALSE(conn_freeable(&c));
	CU_ASSERT_EQUAL(c.holds, 0u);
	CU_ASSERT_STRING_EQUAL(conn_state_name(c.state), "handshake");
}

static void test_conn_set_state_forward(void)
{
	struct conn c;

	conn_init(&c, &g_lim, 0);
	CU_ASSERT_EQUAL(conn_set_state(&c, CONN_OPEN), 0);
	CU_ASSERT(conn_serving(&c));
	CU_ASSERT_EQUAL(conn_set_state(&c, CONN_FLUSHING), 0);
	CU_ASSERT_FALSE(conn_serving(&c));
	CU_ASSERT_FALSE(conn_may_recv(&c));
	CU_ASSERT_EQUAL(conn_set_state(&c, CONN_CLOSING), 0);
	CU_ASSERT(conn_closing(&c));
	CU_ASSERT(conn_freeable(&c));
	/* Skipping states is allowed. */
	conn_init(&c, &g_lim, 0);
	CU_ASSERT_EQUAL(conn_set_state(&c, CONN_CLOSING), 0);
	conn_init(&c, &g_lim, 0);
	CU_ASSERT_EQUAL(conn_set_state(&c, CONN_FLUSHING), 0);
}

static void test_conn_set_state_illegal(void)
{
	static const struct {
		enum conn_state from, to;
	} bad[] = {
		{ CONN_HANDSHAKE, CONN_HANDSHAKE }, { CONN_OPEN, CONN_HANDSHAKE },
		{ CONN_OPEN, CONN_OPEN },	    { CONN_FLUSHING, CONN_OPEN },
		{ CONN_FLUSHING, CONN_HANDSHAKE },  { CONN_FLUSHING, CONN_FLUSHING },
		{ CONN_CLOSING, CONN_OPEN },	    { CONN_CLOSING, CONN_FLUSHING },
		{ CONN_CLOSING, CONN_CLOSING },	    { CONN_CLOSING, CONN_HANDSHAKE },
		{ CONN_OPEN, CONN_STATE_MAX },	    { CONN_OPEN, (enum conn_state) - 1 },
	};

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct conn c;

		conn_init(&c, &g_lim, 0);
		c.state = bad[i].from;
		CU_ASSERT_EQUAL(conn_set_state(&c, bad[i].to), -EINVAL);
		CU_ASSERT_EQUAL(c.state, bad[i].from); /* unchanged */
	}
	CU_ASSERT_STRING_EQUAL(conn_state_name(CONN_STATE_MAX), "?");
}

static void test_conn_hold_frees_when_last_released(void)
{
	static const enum conn_hold holds[] = { CONN_HOLD_RECV, CONN_HOLD_SEND, CONN_HOLD_PIDFD,
						CONN_HOLD_SERVE, CONN_HOLD_READY };
	struct conn c;

	conn_init(&c, &g_lim, 0);
	for (size_t i = 0; i < 5; i++)
		conn_hold(&c, holds[i]);
	CU_ASSERT(conn_held(&c, CONN_HOLD_RECV));
	CU_ASSERT_FALSE(conn_may_recv(&c)); /* one receive in flight at a time */
	CU_ASSERT_EQUAL(conn_set_state(&c, CONN_CLOSING), 0);
	for (size_t i = 0; i < 5; i++) {
		CU_ASSERT_FALSE(conn_freeable(&c));
		conn_release(&c, holds[i]);
		CU_ASSERT_FALSE(conn_held(&c, holds[i]));
	}
	CU_ASSERT(conn_freeable(&c));
	/* A hold taken twice is one hold. */
	conn_init(&c, &g_lim, 0);
	conn_hold(&c, CONN_HOLD_SEND);
	conn_hold(&c, CONN_HOLD_SEND);
	conn_release(&c, CONN_HOLD_SEND);
	conn_set_state(&c, CONN_CLOSING);
	CU_ASSERT(conn_freeable(&c));
}

static void test_conn_turn_take_budget(void)
{
	struct conn c;
	int taken = 0;

	conn_init(&c, &g_lim, 0);
	conn_turn_begin(&c);
	while (conn_turn_take(&c) && taken < 100)
		taken++;
	CU_ASSERT_EQUAL(taken, g_lim.turn_budget);
	CU_ASSERT_FALSE(conn_turn_take(&c));
	conn_turn_begin(&c); /* the next turn refills it */
	CU_ASSERT(conn_turn_take(&c));
}

static void test_conn_outq_pauses_reading(void)
{
	struct conn c;

	conn_init(&c, &g_lim, 0);
	conn_outq_add(&c, 999, 0);
	CU_ASSERT_FALSE(conn_paused(&c));
	CU_ASSERT(conn_may_recv(&c));
	conn_outq_add(&c, 1, 0);
	CU_ASSERT(conn_paused(&c));
	CU_ASSERT_FALSE(conn_may_recv(&c));
	conn_outq_sent(&c, 1);
	CU_ASSERT_FALSE(conn_paused(&c));
	conn_outq_sent(&c, 5000); /* never below zero */
	CU_ASSERT_EQUAL(c.out_bytes, 0u);
}

static void test_conn_expiry_handshake(void)
{
	struct conn c;

	conn_init(&c, &g_lim, 1000);
	CU_ASSERT_EQUAL(conn_expiry(&c, 1000 + 5000), CONN_LIVE);
	CU_ASSERT_EQUAL(conn_expiry(&c, 1000 + 5001), CONN_EXPIRED_HANDSHAKE);
	CU_ASSERT_EQUAL(conn_set_state(&c, CONN_OPEN), 0);
	conn_activity(&c, 6000);
	CU_ASSERT_EQUAL(conn_expiry(&c, 6001), CONN_LIVE); /* Hello said: no handshake limit */
	CU_ASSERT_STRING_EQUAL(conn_expiry_reason(CONN_EXPIRED_HANDSHAKE),
			       "no Hello within the handshake deadline");
}

static void test_conn_expiry_partial_frame(void)
{
	struct conn c;

	conn_init(&c, &g_lim, 0);
	conn_set_state(&c, CONN_OPEN);
	conn_input_note(&c, true, 2000);
	conn_input_note(&c, true, 4000); /* still the same half frame: the clock keeps running */
	CU_ASSERT_EQUAL(c.partial_since_ms, 2000u);
	conn_activity(&c, 4000);
	CU_ASSERT_EQUAL(conn_expiry(&c, 5000), CONN_LIVE);
	CU_ASSERT_EQUAL(conn_expiry(&c, 5001), CONN_EXPIRED_PARTIAL);
	conn_input_note(&c, false, 5001); /* completed: the clock stops */
	CU_ASSERT_EQUAL(conn_expiry(&c, 5001), CONN_LIVE);
	/* Before Hello too. */
	conn_init(&c, &g_lim, 0);
	conn_input_note(&c, true, 100);
	CU_ASSERT_EQUAL(conn_expiry(&c, 3101), CONN_EXPIRED_PARTIAL);
}

static void test_conn_expiry_keepalive(void)
{
	struct conn_limits lim = g_lim;
	struct conn c;

	conn_init(&c, &lim, 0);
	conn_set_state(&c, CONN_OPEN);
	conn_activity(&c, 1000);
	CU_ASSERT_EQUAL(conn_expiry(&c, 11000), CONN_LIVE);
	CU_ASSERT_EQUAL(conn_expiry(&c, 11001), CONN_EXPIRED_KEEPALIVE);
	conn_activity(&c, 11001);
	CU_ASSERT_EQUAL(conn_expiry(&c, 11002), CONN_LIVE);
	lim.keepalive_ms = 0; /* a reload turned it off: read through the pointer */
	CU_ASSERT_EQUAL(conn_expiry(&c, 1000000), CONN_LIVE);
	/* The handshake limit, not keep-alive, applies before Hello. */
	lim.keepalive_ms = 10;
	conn_init(&c, &lim, 0);
	CU_ASSERT_EQUAL(conn_expiry(&c, 4000), CONN_LIVE);
}

/* While complete requests wait on kvpoold (backlog), the keep-alive does not reclaim the
 * client; reading replies counts as activity. */
static void test_conn_expiry_keepalive_backlog(void)
{
	struct conn c;

	conn_init(&c, &g_lim, 0);
	conn_set_state(&c, CONN_OPEN);
	conn_activity(&c, 1000);
	conn_backlog(&c, true);
	CU_ASSERT_EQUAL(conn_expiry(&c, 50000), CONN_LIVE);
	conn_backlog(&c, false);
	CU_ASSERT_EQUAL(conn_expiry(&c, 50000), CONN_EXPIRED_KEEPALIVE);
	conn_activity(&c, 49000); /* reply bytes read */
	CU_ASSERT_EQUAL(conn_expiry(&c, 50000), CONN_LIVE);
}

/* A peer whose exit is watched is never reclaimed for making no call; replies it leaves unread
 * still run the keep-alive. Unwatched again (its pidfd poll failed): today's rule. */
static void test_conn_expiry_keepalive_watched(void)
{
	struct conn c;

	conn_init(&c, &g_lim, 0);
	conn_set_state(&c, CONN_OPEN);
	conn_watch_exit(&c, true);
	conn_activity(&c, 1000);
	CU_ASSERT_EQUAL(conn_expiry(&c, 100000000), CONN_LIVE);
	conn_outq_add(&c, 4096, 1000); /* a reply it does not read */
	CU_ASSERT_EQUAL(conn_expiry(&c, 11000), CONN_LIVE);
	CU_ASSERT_EQUAL(conn_expiry(&c, 11001), CONN_EXPIRED_UNREAD);
	conn_outq_sent(&c, 1024);
	conn_activity(&c, 11001); /* it reads again */
	CU_ASSERT_EQUAL(conn_expiry(&c, 21001), CONN_LIVE);
	conn_outq_sent(&c, 3072);
	CU_ASSERT_EQUAL(conn_expiry(&c, 100000000), CONN_LIVE);
	CU_ASSERT_STRING_EQUAL(conn_expiry_reason(CONN_EXPIRED_UNREAD),
			       "reclaimed: replies not read within keepalive_ms");
	conn_watch_exit(&c, false);
	CU_ASSERT_EQUAL(conn_expiry(&c, 100000000), CONN_EXPIRED_KEEPALIVE);
}

/* A watched peer quiet for long gets a notice: the unread-replies clock starts when the notice
 * is queued, not at its last call; it restarts once the queue has drained. */
static void test_conn_expiry_unread_from_queueing(void)
{
	struct conn c;

	conn_init(&c, &g_lim, 0);
	conn_set_state(&c, CONN_OPEN);
	conn_watch_exit(&c, true);
	conn_activity(&c, 1000);
	conn_outq_add(&c, 64, 500000); /* a pressure notice, long after its last call */
	CU_ASSERT_EQUAL(conn_expiry(&c, 500001), CONN_LIVE);
	CU_ASSERT_EQUAL(conn_expiry(&c, 510000), CONN_LIVE);
	conn_outq_add(&c, 64, 505000); /* more behind it: the clock does not restart */
	CU_ASSERT_EQUAL(conn_expiry(&c, 510001), CONN_EXPIRED_UNREAD);
	conn_outq_sent(&c, 128);
	CU_ASSERT_EQUAL(conn_expiry(&c, 900000), CONN_LIVE);
	conn_outq_add(&c, 64, 900000);
	CU_ASSERT_EQUAL(conn_expiry(&c, 909000), CONN_LIVE);
	CU_ASSERT_EQUAL(conn_expiry(&c, 910001), CONN_EXPIRED_UNREAD);
	/* not watched: the keep-alive runs from the last call, queued replies or not */
	conn_watch_exit(&c, false);
	CU_ASSERT_EQUAL(conn_expiry(&c, 900001), CONN_EXPIRED_UNREAD);
}

static void test_conn_expiry_flush(void)
{
	struct conn c;

	conn_init(&c, &g_lim, 0);
	conn_set_state(&c, CONN_OPEN);
	conn_flush_deadline(&c, 500); /* not flushing: ignored */
	CU_ASSERT_EQUAL(c.flush_deadline_ms, 0u);
	conn_set_state(&c, CONN_FLUSHING);
	CU_ASSERT_EQUAL(conn_expiry(&c, 9000), CONN_LIVE); /* no deadline set */
	conn_flush_deadline(&c, 2000);
	CU_ASSERT_EQUAL(conn_expiry(&c, 2000), CONN_LIVE);
	CU_ASSERT_EQUAL(conn_expiry(&c, 2001), CONN_EXPIRED_FLUSH);
	/* A flushing connection that said Hello is still reclaimed by keep-alive; one that never
	 * did, by the handshake limit. */
	CU_ASSERT_EQUAL(conn_expiry(&c, 1000), CONN_LIVE);
	conn_flush_deadline(&c, 0);
	CU_ASSERT_EQUAL(conn_expiry(&c, 10001), CONN_EXPIRED_KEEPALIVE);
	conn_set_state(&c, CONN_CLOSING);
	CU_ASSERT_EQUAL(conn_expiry(&c, 1000000), CONN_LIVE); /* closing: nothing expires */
	conn_init(&c, &g_lim, 0);
	conn_set_state(&c, CONN_FLUSHING);
	CU_ASSERT_EQUAL(conn_expiry(&c, 5001), CONN_EXPIRED_HANDSHAKE);
	CU_ASSERT_STRING_EQUAL(conn_expiry_reason(CONN_EXPIRY_MAX), "?");
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_conn_init_handshake),
		H_TEST(test_conn_set_state_forward),
		H_TEST(test_conn_set_state_illegal),
		H_TEST(test_conn_hold_frees_when_last_released),
		H_TEST(test_conn_turn_take_budget),
		H_TEST(test_conn_outq_pauses_reading),
		H_TEST(test_conn_expiry_handshake),
		H_TEST(test_conn_expiry_partial_frame),
		H_TEST(test_conn_expiry_keepalive),
		H_TEST(test_conn_expiry_keepalive_backlog),
		H_TEST(test_conn_expiry_keepalive_watched),
		H_TEST(test_conn_expiry_unread_from_queueing),
		H_TEST(test_conn_expiry_flush),
	};

	return H_RUN_SUITE("conn", NULL, NULL, tests);
}
