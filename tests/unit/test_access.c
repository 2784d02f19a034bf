/* test_access.c - session.c's access and quota rules in-process: unguessable ids, the uid and
 * lock quotas, per-pool and namespace checks, and a reload's re-check of open sessions
 * (evicted, demoted, detached) with dispatch refusing an evicted session. */
#include <CUnit/Basic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon_fixture.h"
#include "suite.h"

static const char *const g_conf = "[pool.a]\n"
				  "layers = 1\nkv_heads = 1\nhead_dim = 4\ndtype = fp16\n"
				  "page_tokens = 16\ndevice = sim\ndevice_capacity = 1024t\n"
				  "host_capacity = 0\nmlock = off\n"
				  "uid_quota = 64t\nsession_lock_quota = 32t\n"
				  "allowed_groups = 60\n"
				  "namespace.9 = group:61\n";

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static void test_kvp_daemon_new_id_distinct_unpredictable(void)
{
	enum { N = 100000 };
	struct kvp_daemon *d = calloc(1, sizeof(*d));
	uint64_t *ids = malloc(sizeof(uint64_t) * N), ctr = 0, steps = 0;

	CU_ASSERT_FATAL(d && ids);
	for (int i = 0; i < N; i++) {
		ids[i] = kvp_daemon_new_id(d, &ctr);
		CU_ASSERT(ids[i] != 0 && ids[i] != UINT64_MAX);
		steps += i && ids[i] == ids[i - 1] + 1;
	}
	CU_ASSERT_EQUAL(steps, 0);
	qsort(ids, N, sizeof(*ids), cmp_u64);
	for (int i = 1; i < N; i++)
		CU_ASSERT_NOT_EQUAL_FATAL(ids[i], ids[i - 1]);
	free(ids);
	free(d);
}

static struct kvp_lease *lease(struct kvp_daemon *d, struct kvp_session *s, uint32_t pages)
{
	struct kvp_fail f = { 0 };
	struct kvp_lease *l = kvp_lease_create(d->pools[0], KVP_TIER_ID_DEVICE,
					       kvp_daemon_new_id(d, &d->next_lease_id), pages, &f);

	CU_ASSERT_PTR_NOT_NULL_FATAL(l);
	CU_ASSERT_EQUAL_FATAL(kvp_session_lease_add(s, l), 0);
	return l;
}

static void test_kvp_session_may_lease_uid_quota(void)
{
	struct kvp_daemon *d = fx_daemon(g_conf);
	struct kvp_session *s1, *s2, *other;
	struct kvp_fail f = { 0 };

	CU_ASSERT_PTR_NOT_NULL_FATAL(d);
	s1 = fx_session(d, false);
	s2 = fx_session(d, false); /* the same uid 1000 */
	other = fx_session(d, false);
	other->uid = 2000;
	lease(d, s1, 2);
	lease(d, s2, 1);
	CU_ASSERT_EQUAL(kvp_session_may_lease(d, s1, d->pools[0], 1, true, &f), 0);
	CU_ASSERT_EQUAL(kvp_session_may_lease(d, s2, d->pools[0], 2, true, &f),
			-KVP_ERR_QUOTA_EXCEEDED);
	CU_ASSERT_EQUAL(f.detail, KVP_FAIL_QUOTA);
	CU_ASSERT_EQUAL(f.quota.quota, 64);
	CU_ASSERT_EQUAL(f.quota.held, 48);
	CU_ASSERT_EQUAL(f.quota.requested, 32);
	CU_ASSERT_PTR_NOT_NULL(strstr(f.msg, "uid quota"));
	CU_ASSERT_EQUAL(kvp_session_may_lease(d, other, d->pools[0], 4, true, &f), 0);
	fx_daemon_free(d);
}

static void test_kvp_session_may_lock_pages_lock_quota(void)
{
	struct kvp_daemon *d = fx_daemon(g_conf);
	struct kvp_session *s;
	struct kvp_fail f = { 0 };

	CU_ASSERT_PTR_NOT_NULL_FATAL(d);
	s = fx_session(d, false);
	CU_ASSERT_EQUAL(kvp_session_may_lock_pages(d, s, d->pools[0], 2, &f), 0);
	CU_ASSERT_EQUAL(kvp_session_may_lock_pages(d, s, d->pools[0], 3, &f),
			-KVP_ERR_QUOTA_EXCEEDED);
	CU_ASSERT_PTR_NOT_NULL(strstr(f.msg, "session lock quota"));
	/* Locked pages count against the uid quota with the leased ones. */
	s->locked_pages[0] = 2;
	lease(d, s, 2);
	CU_ASSERT_EQUAL(kvp_session_may_lease(d, s, d->pools[0], 1, true, &f),
			-KVP_ERR_QUOTA_EXCEEDED);
	s->locked_pages[0] = 0;
	fx_daemon_free(d);
}

static void test_kvp_session_may_attach_and_use_ns(void)
{
	struct kvp_daemon *d = fx_daemon(g_conf);
	struct kvp_session *s, *root;
	struct kvp_fail f = { 0 };
	gid_t g60 = 60, g61[] = { 60, 61 };

	CU_ASSERT_PTR_NOT_NULL_FATAL(d);
	s = fx_session(d, false);
	root = fx_session(d, true);
	root->uid = 0;
	CU_ASSERT_EQUAL(kvp_session_may_attach(d, s, d->pools[0], &f), -KVP_ERR_PERMISSION_DENIED);
	CU_ASSERT_PTR_NOT_NULL(strstr(f.msg, "pool a"));
	CU_ASSERT_EQUAL(kvp_session_may_attach(d, root, d->pools[0], &f), 0);
	kvp_session_set_groups(s, &g60, 1);
	CU_ASSERT_EQUAL(kvp_session_may_attach(d, s, d->pools[0], &f), 0);
	CU_ASSERT_EQUAL(kvp_session_may_use_ns(d, s, d->pools[0], 9, "match", &f),
			-KVP_ERR_PERMISSION_DENIED);
	CU_ASSERT_PTR_NOT_NULL(strstr(f.msg, "match: namespace 9 of pool a"));
	CU_ASSERT_EQUAL(kvp_session_may_use_ns(d, s, d->pools[0], 8, "match", &f), 0);
	CU_ASSERT_EQUAL(kvp_session_may_use_ns(d, root, d->pools[0], 9, "insert", &f), 0);
	kvp_session_set_groups(s, g61, 2);
	CU_ASSERT_EQUAL(kvp_session_may_use_ns(d, s, d->pools[0], 9, "insert", &f), 0);
	fx_daemon_free(d);
}

static void test_kvp_daemon_recheck_sessions(void)
{
	struct kvp_daemon *d = fx_daemon(g_conf);
	Kvpool__Request q = KVPOOL__REQUEST__INIT;
	Kvpool__PingReq ping = KVPOOL__PING_REQ__INIT;
	struct kvp_session *s, *keep;
	struct kvp_reply r;
	gid_t groups[] = { 50, 60 };

	CU_ASSERT_PTR_NOT_NULL_FATAL(d);
	d->conf.admin_gids[0] = 50;
	d->conf.n_admin_gids = 1;
	s = fx_session(d, true);
	kvp_session_set_groups(s, groups, 2);
	keep = fx_session(d, false);
	keep->uid = 3000;
	kvp_session_attach(s, d->pools[0]);
	lease(d, s, 3);
	CU_ASSERT_EQUAL(kvp_daemon_recheck_sessions(d), 0); /* nothing changed */
	/* admin_groups and the pool's groups no longer name s's groups. */
	d->conf.n_admin_gids = 0;
	d->pools[0]->conf.allowed_gids[0] = 70;
	CU_ASSERT_EQUAL(kvp_daemon_recheck_sessions(d), 1);
	CU_ASSERT_FALSE(s->admin);
	CU_ASSERT_FALSE(s->attached[0]);
	CU_ASSERT_EQUAL(s->leases.count, 0);
	CU_ASSERT_EQUAL(d->pools[0]->sessions, 0);
	CU_ASSERT_FALSE(s->evicted);
	CU_ASSERT_EQUAL(kvp_daemon_recheck_sessions(d), 0); /* said once */
	/* allowed_users no longer names s's uid: it is evicted, the others stay. */
	d->conf.allowed_uids[0] = 3000;
	d->conf.n_allowed_uids = 1;
	CU_ASSERT_EQUAL(kvp_daemon_recheck_sessions(d), 1);
	CU_ASSERT_TRUE(s->evicted);
	CU_ASSERT_FALSE(keep->evicted);
	q.call_case = KVPOOL__REQUEST__CALL_PING;
	q.ping = &ping;
	CU_ASSERT_EQUAL(fx_call(d, s, &q, &r), KVP_ERR_PERMISSION_DENIED);
	CU_ASSERT_TRUE(r.close_after);
	kvp_reply_release(&r);
	CU_ASSERT_EQUAL(fx_call(d, keep, &q, &r), 0);
	kvp_reply_release(&r);
	CU_ASSERT_EQUAL(kvp_daemon_check(d), 0);
	fx_daemon_free(d);
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_kvp_daemon_new_id_distinct_unpredictable),
		H_TEST(test_kvp_session_may_lease_uid_quota),
		H_TEST(test_kvp_session_may_lock_pages_lock_quota),
		H_TEST(test_kvp_session_may_attach_and_use_ns),
		H_TEST(test_kvp_daemon_recheck_sessions),
	};

	return H_RUN_SUITE("access", NULL, NULL, tests);
}
