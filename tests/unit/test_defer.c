/* test_defer.c - deferred-reply tickets: bounded per session, per uid and in all
 * (LIMIT_EXCEEDED with the limit named), answered through the loop's deliver hook with the
 * request's id, a failure carried as its Status, and a ticket whose session is gone dropped and
 * freed (ASan shows no leak). */
#include <CUnit/Basic.h>
#include <stdlib.h>
#include <string.h>

#include "defer.h"
#include "reply.h"
#include "suite.h"

struct sink {
	uint64_t live_session; /* deliver succeeds for this session only */
	int calls;
	uint64_t last_id;
	int last_code;
	enum kvp_err last_status;
};

static bool deliver(void *ctx, const struct kvp_defer *t, struct kvp_reply *r, int code)
{
	struct sink *k = ctx;

	k->calls++;
	k->last_id = r->resp.id;
	k->last_code = code;
	k->last_status = (enum kvp_err)r->status.code;
	return t->session_id == k->live_session;
}

static void test_defer_take_bounded_per_session(void)
{
	struct sink k = { .live_session = 1 };
	struct kvp_defers ds = { .deliver = deliver, .ctx = &k };
	struct kvp_defer *t[KVP_DEFER_PER_SESSION + 1];
	struct kvp_fail f;
	struct kvp_reply r;

	for (int i = 0; i < KVP_DEFER_PER_SESSION; i++) {
		kvp_fail_init(&f);
		t[i] = kvp_defer_take(&ds, 1, 1000, 100 + (uint64_t)i, 0, &f);
		CU_ASSERT_PTR_NOT_NULL_FATAL(t[i]);
	}
	CU_ASSERT_EQUAL(kvp_defer_count(&ds, 1), KVP_DEFER_PER_SESSION);
	kvp_fail_init(&f);
	CU_ASSERT_PTR_NULL(kvp_defer_take(&ds, 1, 1000, 200, 0, &f));
	CU_ASSERT_EQUAL(f.code, KVP_ERR_LIMIT_EXCEEDED);
	CU_ASSERT_STRING_EQUAL(f.limit.what, "session_pending_replies");
	CU_ASSERT_EQUAL(f.limit.limit, KVP_DEFER_PER_SESSION);
	/* another session is not held back by this one's */
	kvp_fail_init(&f);
	t[KVP_DEFER_PER_SESSION] = kvp_defer_take(&ds, 2, 1000, 300, 0, &f);
	CU_ASSERT_PTR_NOT_NULL_FATAL(t[KVP_DEFER_PER_SESSION]);
	CU_ASSERT_EQUAL(ds.n, KVP_DEFER_PER_SESSION + 1);
	/* answering one frees room for the next */
	kvp_reply_init(&r, t[3]->req_id);
	kvp_defer_answer(&ds, t[3], &r, 0);
	kvp_reply_release(&r);
	CU_ASSERT_EQUAL(k.calls, 1);
	CU_ASSERT_EQUAL(k.last_id, 103);
	CU_ASSERT_EQUAL(ds.answered, 1);
	kvp_fail_init(&f);
	t[3] = kvp_defer_take(&ds, 1, 1000, 201, 0, &f);
	CU_ASSERT_PTR_NOT_NULL_FATAL(t[3]);
	for (int i = 0; i <= KVP_DEFER_PER_SESSION; i++) {
		kvp_fail_init(&f);
		kvp_fail(&f, KVP_ERR_SHUTTING_DOWN, "stopping");
		kvp_defer_fail(&ds, t[i], &f);
	}
	CU_ASSERT_EQUAL(ds.n, 0);
	CU_ASSERT_PTR_NULL(ds.all);
	CU_ASSERT_EQUAL(k.last_code, KVP_ERR_SHUTTING_DOWN);
	CU_ASSERT_EQUAL(k.last_status, KVP_ERR_SHUTTING_DOWN);
	CU_ASSERT_EQUAL(ds.answered, 1 + KVP_DEFER_PER_SESSION);
	CU_ASSERT_EQUAL(ds.dropped, 1); /* session 2's: deliver said it is gone */
}

static void test_defer_take_bounded_in_all(void)
{
	struct sink k = { 0 };
	struct kvp_defers ds = { .deliver = deliver, .ctx = &k, .max = 5, .per_session = 2 };
	static const int order[] = { 2, 0, 4, 1, 3 };
	struct kvp_defer *t[5];
	struct kvp_fail f;

	for (int i = 0; i < 5; i++) {
		kvp_fail_init(&f);
		t[i] = kvp_defer_take(&ds, (uint64_t)i, (uint32_t)i, 1, 0, &f);
		CU_ASSERT_PTR_NOT_NULL_FATAL(t[i]);
	}
	kvp_fail_init(&f);
	CU_ASSERT_PTR_NULL(kvp_defer_take(&ds, 9, 9, 1, 0, &f));
	CU_ASSERT_EQUAL(f.code, KVP_ERR_LIMIT_EXCEEDED);
	CU_ASSERT_STRING_EQUAL(f.limit.what, "pending_replies");
	/* freed in an order other than taken: the list stays whole */
	for (int i = 0; i < 5; i++) {
		kvp_fail_init(&f);
		kvp_fail(&f, KVP_ERR_INTERNAL, "x");
		kvp_defer_fail(&ds, t[order[i]], &f);
		CU_ASSERT_EQUAL(ds.n, 4 - (uint32_t)i);
	}
	CU_ASSERT_PTR_NULL(ds.all);
	CU_ASSERT_EQUAL(ds.dropped, 4); /* only session 0 "exists" */
}

/* The sessions of one uid hold KVP_DEFER_PER_UID tickets at most (a quarter of them all), each
 * session its own share: the next is refused uid_pending_replies while another uid's session
 * still gets one, and one answered frees room for the uid again. */
static void test_defer_take_bounded_per_uid(void)
{
	enum { SESSIONS = KVP_DEFER_PER_UID / KVP_DEFER_PER_SESSION };
	struct sink k = { 0 };
	struct kvp_defers ds = { .deliver = deliver, .ctx = &k };
	struct kvp_defer *t[KVP_DEFER_PER_UID], *other;
	struct kvp_fail f;
	struct kvp_reply r;

	CU_ASSERT(KVP_DEFER_PER_UID >= KVP_DEFER_PER_SESSION);
	CU_ASSERT(KVP_DEFER_PER_UID < KVP_DEFER_MAX);
	for (int i = 0; i < KVP_DEFER_PER_UID; i++) {
		kvp_fail_init(&f);
		t[i] = kvp_defer_take(&ds, 1 + (uint64_t)(i % SESSIONS), 1000, (uint64_t)i, 0, &f);
		CU_ASSERT_PTR_NOT_NULL_FATAL(t[i]);
	}
	CU_ASSERT_EQUAL(kvp_defer_count_uid(&ds, 1000), KVP_DEFER_PER_UID);
	/* a fresh session of the same uid, holding none */
	kvp_fail_init(&f);
	CU_ASSERT_PTR_NULL(kvp_defer_take(&ds, 100, 1000, 1, 0, &f));
	CU_ASSERT_EQUAL(f.code, KVP_ERR_LIMIT_EXCEEDED);
	CU_ASSERT_STRING_EQUAL(f.limit.what, "uid_pending_replies");
	CU_ASSERT_EQUAL(f.limit.limit, KVP_DEFER_PER_UID);
	kvp_fail_init(&f);
	other = kvp_defer_take(&ds, 200, 2000, 1, 0, &f);
	CU_ASSERT_PTR_NOT_NULL_FATAL(other);
	CU_ASSERT_EQUAL(kvp_defer_count_uid(&ds, 2000), 1);
	kvp_reply_init(&r, t[0]->req_id);
	kvp_defer_answer(&ds, t[0], &r, 0);
	kvp_reply_release(&r);
	kvp_fail_init(&f);
	t[0] = kvp_defer_take(&ds, 100, 1000, 2, 0, &f);
	CU_ASSERT_PTR_NOT_NULL_FATAL(t[0]);
	for (int i = 0; i < KVP_DEFER_PER_UID; i++) {
		kvp_fail_init(&f);
		kvp_fail(&f, KVP_ERR_SHUTTING_DOWN, "stopping");
		kvp_defer_fail(&ds, t[i], &f);
	}
	kvp_defer_fail(&ds, other, &f);
	CU_ASSERT_EQUAL(ds.n, 0);
	CU_ASSERT_PTR_NULL(ds.all);
}

/* With a small max, the per-uid default is a quarter of it but never below one session's. */
static void test_defer_per_uid_default_follows_max(void)
{
	struct kvp_defers ds = { .max = 8, .per_session = 3 };
	struct kvp_defer *t[4];
	struct kvp_fail f;

	for (int i = 0; i < 3; i++) {
		kvp_fail_init(&f);
		t[i] = kvp_defer_take(&ds, 1 + (uint64_t)i, 7, 1, 0, &f);
		CU_ASSERT_PTR_NOT_NULL_FATAL(t[i]);
	}
	kvp_fail_init(&f);
	CU_ASSERT_PTR_NULL(kvp_defer_take(&ds, 9, 7, 1, 0, &f));
	CU_ASSERT_STRING_EQUAL(f.limit.what, "uid_pending_replies");
	CU_ASSERT_EQUAL(f.limit.limit, 3);
	kvp_fail_init(&f);
	t[3] = kvp_defer_take(&ds, 9, 8, 1, 0, &f);
	CU_ASSERT_PTR_NOT_NULL_FATAL(t[3]);
	for (int i = 0; i < 4; i++) {
		kvp_fail_init(&f);
		kvp_fail(&f, KVP_ERR_SHUTTING_DOWN, "stopping");
		kvp_defer_fail(&ds, t[i], &f);
	}
	CU_ASSERT_EQUAL(ds.n, 0);
}

static void test_defer_answer_without_deliver_drops(void)
{
	struct kvp_defers ds = { 0 };
	struct kvp_fail f;
	struct kvp_defer *t;
	struct kvp_reply r;

	kvp_fail_init(&f);
	t = kvp_defer_take(&ds, 1, 1000, 7, 0, &f);
	CU_ASSERT_PTR_NOT_NULL_FATAL(t);
	kvp_reply_init(&r, 7);
	kvp_defer_answer(&ds, t, &r, 0);
	kvp_reply_release(&r);
	CU_ASSERT_EQUAL(ds.n, 0);
	CU_ASSERT_EQUAL(ds.dropped, 1);
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_defer_take_bounded_per_session),
		H_TEST(test_defer_take_bounded_in_all),
		H_TEST(test_defer_take_bounded_per_uid),
		H_TEST(test_defer_per_uid_default_follows_max),
		H_TEST(test_defer_answer_without_deliver_drops),
	};

	return H_RUN_SUITE("defer", NULL, NULL, tests);
}
