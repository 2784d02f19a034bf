/* test_admit.c - admission rules (daemon/loop/admit.c): the descriptor reserve, pre-Hello and
 * per-uid caps, admin slots, the buffer budget, and the repeated-line limiter (log.c). */
#include <CUnit/Basic.h>
#include <string.h>

#include "admit.h"
#include "log.h"
#include "suite.h"

static struct kvp_conf conf(void)
{
	struct kvp_conf c;

	kvp_conf_defaults(&c);
	c.max_sessions = 32;
	c.max_prehello = 24;
	c.max_sessions_per_uid = 12;
	c.admin_sessions = 4;
	return c;
}

static void test_admit_fd_reserve(void)
{
	CU_ASSERT_EQUAL(kvp_admit_fd_reserve(256), 32);
	CU_ASSERT_EQUAL(kvp_admit_fd_reserve(65536), 2048);
	CU_ASSERT_EQUAL(kvp_admit_fd_reserve(40), 20); /* at most half */
}

static void test_admit_connect_fds(void)
{
	struct kvp_conf c = conf();
	struct kvp_admit_counts n = { .fd_limit = 256, .fds_used = 223 };
	struct kvp_fail f = { 0 };

	CU_ASSERT_EQUAL(kvp_admit_connect(&c, &n, false, 1000, &f), KVP_ADMIT_OK);
	n.fds_used = 224; /* its pidfd would take the 225th: past 256 - 32 */
	CU_ASSERT_EQUAL(kvp_admit_connect(&c, &n, false, 1000, &f), KVP_ADMIT_FDS);
	CU_ASSERT_EQUAL(f.code, KVP_ERR_LIMIT_EXCEEDED);
	CU_ASSERT_EQUAL(f.detail, KVP_FAIL_LIMIT);
	CU_ASSERT_STRING_EQUAL(f.limit.what, "fds");
	CU_ASSERT_EQUAL(f.limit.limit, 224);
	/* admins may use half the reserve */
	CU_ASSERT_EQUAL(kvp_admit_connect(&c, &n, true, 0, &f), KVP_ADMIT_OK);
	n.fds_used = 240;
	CU_ASSERT_EQUAL(kvp_admit_connect(&c, &n, true, 0, &f), KVP_ADMIT_FDS);
}

static void test_admit_connect_prehello_and_uid(void)
{
	struct kvp_conf c = conf();
	struct kvp_admit_counts n = { .fd_limit = 65536, .fds_used = 10, .prehello = 19 };
	struct kvp_fail f = { 0 };

	CU_ASSERT_EQUAL(kvp_admit_connect(&c, &n, false, 1000, &f), KVP_ADMIT_OK);
	n.prehello = 20; /* 24 less the 4 admin slots */
	CU_ASSERT_EQUAL(kvp_admit_connect(&c, &n, false, 1000, &f), KVP_ADMIT_PREHELLO);
	CU_ASSERT_STRING_EQUAL(f.limit.what, "pre-Hello connections");
	CU_ASSERT_EQUAL(kvp_admit_connect(&c, &n, true, 0, &f), KVP_ADMIT_OK);
	n.prehello = 24;
	CU_ASSERT_EQUAL(kvp_admit_connect(&c, &n, true, 0, &f), KVP_ADMIT_PREHELLO);
	n.prehello = 0;
	n.uid_conns = 12;
	CU_ASSERT_EQUAL(kvp_admit_connect(&c, &n, false, 1000, &f), KVP_ADMIT_UID);
	CU_ASSERT_STRING_EQUAL(f.limit.what, "connections of uid 1000");
	CU_ASSERT_EQUAL(f.limit.limit, 12);
	CU_ASSERT_EQUAL(kvp_admit_connect(&c, &n, true, 0, &f), KVP_ADMIT_OK); /* admins: none */
	c.max_sessions_per_uid = 0;
	CU_ASSERT_EQUAL(kvp_admit_connect(&c, &n, false, 1000, &f), KVP_ADMIT_OK);
}

static void test_admit_hello_admin_slots(void)
{
	struct kvp_conf c = conf();
	struct kvp_admit_counts n = { .sessions = 27 };
	struct kvp_fail f = { 0 };

	CU_ASSERT_EQUAL(kvp_admit_hello(&c, &n, false, &f), KVP_ADMIT_OK);
	n.sessions = 28;
	CU_ASSERT_EQUAL(kvp_admit_hello(&c, &n, false, &f), KVP_ADMIT_SESSIONS);
	CU_ASSERT_STRING_EQUAL(f.limit.what, "sessions");
	CU_ASSERT_EQUAL(kvp_admit_hello(&c, &n, true, &f), KVP_ADMIT_OK);
	n.sessions = 32;
	CU_ASSERT_EQUAL(kvp_admit_hello(&c, &n, true, &f), KVP_ADMIT_SESSIONS);
	/* admin_sessions past half of max_sessions keeps half */
	c.admin_sessions = 1000;
	n.sessions = 16;
	CU_ASSERT_EQUAL(kvp_admit_hello(&c, &n, false, &f), KVP_ADMIT_SESSIONS);
	n.sessions = 15;
	CU_ASSERT_EQUAL(kvp_admit_hello(&c, &n, false, &f), KVP_ADMIT_OK);
}

static void test_admit_buffer_budget(void)
{
	struct kvp_conf c = conf();
	struct kvp_admit_counts n = { 0 };
	struct kvp_fail f = { 0 };

	CU_ASSERT_EQUAL(kvp_admit_buffer_budget(&c), KVP_BUDGET_MIN); /* 32 x 64 KiB < 32 MiB */
	c.max_sessions = 4096;
	CU_ASSERT_EQUAL(kvp_admit_buffer_budget(&c), 4096ull * KVP_BUDGET_PER_SESSION);
	c.buffer_budget = 4u << 20;
	CU_ASSERT_EQUAL(kvp_admit_buffer_budget(&c), 4u << 20);
	n.buf_bytes = (4u << 20) - 10;
	CU_ASSERT_EQUAL(kvp_admit_buffer(&c, &n, 10, &f), 0);
	CU_ASSERT(kvp_admit_buffer(&c, &n, 11, &f) < 0);
	CU_ASSERT_EQUAL(f.code, KVP_ERR_LIMIT_EXCEEDED);
	CU_ASSERT_STRING_EQUAL(f.limit.what, "buffer bytes");
	CU_ASSERT_EQUAL(f.limit.limit, 4u << 20);
}

static void test_log_limited_counts(void)
{
	struct kvp_log_limit l = { .interval_ms = 1000 };
	uint64_t before = g_log_suppressed;

	g_log_level = LOG_DEBUG;
	kvp_log_limited(&l, 5000, LOG_DEBUG, "event %d", 1);
	CU_ASSERT_EQUAL(l.last_ms, 5000);
	CU_ASSERT_EQUAL(l.suppressed, 0);
	for (int i = 2; i <= 10; i++)
		kvp_log_limited(&l, 5000 + (uint64_t)i, LOG_DEBUG, "event %d", i);
	CU_ASSERT_EQUAL(l.suppressed, 9);
	CU_ASSERT_EQUAL(g_log_suppressed - before, 9);
	CU_ASSERT_STRING_EQUAL(l.last, "event 10");
	kvp_log_limit_flush(&l, 5500); /* the interval is not over */
	CU_ASSERT_EQUAL(l.suppressed, 9);
	kvp_log_limit_flush(&l, 6000);
	CU_ASSERT_EQUAL(l.suppressed, 0);
	CU_ASSERT_EQUAL(l.last_ms, 6000);
	kvp_log_limited(&l, 7000, LOG_DEBUG, "event %d", 11); /* a new interval: logged */
	CU_ASSERT_EQUAL(l.suppressed, 0);
	CU_ASSERT_EQUAL(l.last_ms, 7000);
	g_log_level = -1;
	kvp_log_limited(&l, 7001, LOG_DEBUG, "quiet"); /* below the level: not even counted */
	CU_ASSERT_EQUAL(l.suppressed, 0);
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_admit_fd_reserve),
		H_TEST(test_admit_connect_fds),
		H_TEST(test_admit_connect_prehello_and_uid),
		H_TEST(test_admit_hello_admin_slots),
		H_TEST(test_admit_buffer_budget),
		H_TEST(test_log_limited_counts),
	};

	return H_RUN_SUITE("admit", NULL, NULL, tests);
}
