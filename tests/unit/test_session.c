/* test_session.c - sessions in-process: admission by uid, group and admin group; creation up to
 * max_sessions; the accounting calls (leases, quota, locks); detach of one pool; destroy giving
 * everything back; and kvp_daemon_check seeing books that do not balance. */
#include <CUnit/Basic.h>
#include <errno.h>

#include "daemon_fixture.h"
#include "pool_cache.h"
#include "suite.h"

static const char *const g_conf =
	"[daemon]\nmax_sessions = 2\nmax_prehello = 1\nmax_leases_per_session = 3\nmax_locks_per_session = 2\n"
	"[pool.a]\nlayers = 1\nkv_heads = 1\nhead_dim = 4\ndtype = fp16\npage_tokens = 4\n"
	"device = sim\ndevice_capacity = 64t\nhost_capacity = 32t\nmlock = off\n"
	"session_quota = 40\n"
	"[pool.b]\nlayers = 1\nkv_heads = 1\nhead_dim = 4\ndtype = fp16\npage_tokens = 8\n"
	"device = none\nhost_capacity = 64t\nmlock = off\n";

static const char *const g_restricted = "[daemon]\nallowed_users = 1001, 1002\n"
					"allowed_groups = 2001\nadmin_groups = 3001\n"
					"[pool.a]\nlayers = 1\nkv_heads = 1\nhead_dim = 4\n"
					"dtype = fp16\npage_tokens = 4\ndevice = sim\n"
					"device_capacity = 64t\nmlock = off\n";

static void test_daemon_admit_open(void)
{
	struct kvp_daemon *d = fx_daemon(g_conf);
	struct kvp_fail f = { 0 };
	bool admin = true;

	CU_ASSERT_PTR_NOT_NULL_FATAL(d);
	d->self_uid = 555;
	CU_ASSERT_EQUAL(kvp_daemon_admit(d, 1, 4000, 4000, NULL, 0, &admin, &f), 0);
	CU_ASSERT_FALSE(admin);
	CU_ASSERT_EQUAL(kvp_daemon_admit(d, 1, 0, 0, NULL, 0, &admin, &f), 0);
	CU_ASSERT_TRUE(admin);
	admin = false;
	CU_ASSERT_EQUAL(kvp_daemon_admit(d, 1, 555, 4000, NULL, 0, &admin, &f), 0);
	CU_ASSERT_TRUE(admin); /* the daemon's own user */
	fx_daemon_free(d);
}

static void test_daemon_admit_restricted(void)
{
	struct kvp_daemon *d = fx_daemon(g_restricted);
	const gid_t other[] = { 7, 8 }, member[] = { 7, 2001 }, admins[] = { 3001 };
	struct kvp_fail f = { 0 };
	bool admin = false;

	CU_ASSERT_PTR_NOT_NULL_FATAL(d);
	d->self_uid = 555;
	CU_ASSERT_EQUAL(kvp_daemon_admit(d, 9, 4000, 4000, other, 2, &admin, &f),
			-KVP_ERR_PERMISSION_DENIED);
	CU_ASSERT_EQUAL(f.code, KVP_ERR_PERMISSION_DENIED);
	CU_ASSERT_PTR_NOT_NULL(strstr(f.msg, "uid 4000"));
	CU_ASSERT_EQUAL(kvp_daemon_admit(d, 9, 1002, 4000, NULL, 0, &admin, &f), 0);
	CU_ASSERT_FALSE(admin);
	CU_ASSERT_EQUAL(kvp_daemon_admit(d, 9, 4000, 2001, NULL, 0, &admin, &f), 0); /* gid */
	CU_ASSERT_EQUAL(kvp_daemon_admit(d, 9, 4000, 4000, member, 2, &admin, &f), 0);
	CU_ASSERT_FALSE(admin);
	/* an admin group does not admit by itself; root does, and is admin */
	CU_ASSERT_EQUAL(kvp_daemon_admit(d, 9, 4000, 4000, admins, 1, &admin, &f),
			-KVP_ERR_PERMISSION_DENIED);
	CU_ASSERT_EQUAL(kvp_daemon_admit(d, 9, 1001, 4000, admins, 1, &admin, &f), 0);
	CU_ASSERT_TRUE(admin);
	admin = false;
	CU_ASSERT_EQUAL(kvp_daemon_admit(d, 9, 0, 0, NULL, 0, &admin, &f), 0);
	CU_ASSERT_TRUE(admin);
	/* ids given on the command line add to the config's */
	d->flag_uids[d->n_flag_uids++] = 4000;
	CU_ASSERT_EQUAL(kvp_daemon_admit(d, 9, 4000, 4000, NULL, 0, &admin, &f), 0);
	CU_ASSERT_FALSE(admin);
	fx_daemon_free(d);
}

static void test_session_new_limit_and_ids(void)
{
	struct kvp_daemon *d = fx_daemon(g_conf);
	struct kvp_session *s[3];
	struct kvp_fail f = { 0 };

	CU_ASSERT_PTR_NOT_NULL_FATAL(d);
	for (int i = 0; i < 3; i++) {
		s[i] = kvp_session_new(d, 100 + i, 1000, 1000, i == 0, &f);
		CU_ASSERT_PTR_NOT_NULL_FATAL(s[i]);
		CU_ASSERT_EQUAL(s[i]->id, (uint64_t)i + 1);
		CU_ASSERT_EQUAL(s[i]->pid, 100 + i);
		CU_ASSERT_EQUAL(s[i]->admin, i == 0);
		CU_ASSERT_PTR_EQUAL(d->sessions, s[i]);
	}
	CU_ASSERT_EQUAL(d->n_sessions, 3);
	kvp_fail_init(&f);
	CU_ASSERT_PTR_NULL(kvp_session_new(d, 1, 1, 1, false, &f));
	CU_ASSERT_EQUAL(f.code, KVP_ERR_LIMIT_EXCEEDED);
	CU_ASSERT_EQUAL(f.detail, KVP_FAIL_LIMIT);
	CU_ASSERT_EQUAL(f.limit.limit, 3);
	/* unlinking from the middle keeps the list whole */
	s[1]->hello = true;
	kvp_session_destroy(d, s[1]);
	CU_ASSERT_EQUAL(d->n_sessions, 2);
	CU_ASSERT_EQUAL(d->st.sessions_closed, 1);
	CU_ASSERT_PTR_EQUAL(d->sessions, s[2]);
	CU_ASSERT_PTR_EQUAL(s[2]->next, s[0]);
	CU_ASSERT_PTR_EQUAL(s[0]->prev, s[2]);
	kvp_session_destroy(d, s[2]); /* no Hello: not counted closed */
	CU_ASSERT_EQUAL(d->st.sessions_closed, 1);
	CU_ASSERT_PTR_EQUAL(d->sessions, s[0]);
	CU_ASSERT_PTR_NULL(s[0]->prev);
	kvp_session_destroy(d, NULL);
	/* the "session" fault site: INTERNAL, nothing linked */
	fx_faults("session:1:1");
	CU_ASSERT_PTR_NULL(kvp_session_new(d, 1, 1, 1, false, &f));
	fx_faults(NULL);
	CU_ASSERT_EQUAL(f.code, KVP_ERR_INTERNAL);
	CU_ASSERT_EQUAL(d->n_sessions, 1);
	fx_daemon_free(d);
}

/* Leases through the accounting calls: the quota counts what the session holds, the lease
 * limit counts leases, and each resize and end keeps leased_pages equal to the leases. */
static void test_session_lease_accounting(void)
{
	struct kvp_daemon *d = fx_daemon(g_conf);
	struct kvpd_pool *a;
	struct kvp_session *s, *s2;
	struct kvp_fail f = { 0 };
	struct kvp_lease *l1, *l2, *l3;
	uint32_t before, back[2];

	CU_ASSERT_PTR_NOT_NULL_FATAL(d);
	a = d->pools[0];
	s = fx_session(d, false);
	CU_ASSERT_PTR_NOT_NULL_FATAL(s);
	CU_ASSERT_PTR_NULL(kvp_session_pool(d, s, 0, &f));
	CU_ASSERT_EQUAL(f.code, KVP_ERR_NOT_FOUND);
	CU_ASSERT_PTR_NULL(kvp_session_pool(d, s, 2, &f));
	CU_ASSERT_EQUAL(f.code, KVP_ERR_NO_SUCH_POOL);
	kvp_session_attach(s, a);
	kvp_session_attach(s, a); /* counted once */
	CU_ASSERT_EQUAL(a->sessions, 1);
	CU_ASSERT_PTR_EQUAL(kvp_session_pool(d, s, 0, &f), a);

	/* quota 40 tokens = 10 pages of 4 */
	CU_ASSERT_EQUAL(kvp_session_may_lease(d, s, a, 10, true, &f), 0);
	kvp_fail_init(&f);
	CU_ASSERT_EQUAL(kvp_session_may_lease(d, s, a, 11, true, &f), -KVP_ERR_QUOTA_EXCEEDED);
	CU_ASSERT_EQUAL(f.detail, KVP_FAIL_QUOTA);
	CU_ASSERT_EQUAL(f.quota.quota, 40);
	CU_ASSERT_EQUAL(f.quota.held, 0);
	CU_ASSERT_EQUAL(f.quota.requested, 44);
	l1 = kvp_lease_create(a, KVP_TIER_ID_DEVICE, ++d->next_lease_id, 6, &f);
	CU_ASSERT_PTR_NOT_NULL_FATAL(l1);
	CU_ASSERT_EQUAL(kvp_session_lease_add(s, l1), 0);
	CU_ASSERT_EQUAL(s->leased_pages[0], 6);
	CU_ASSERT_PTR_EQUAL(kvp_session_lease(s, l1->id, &f), l1);
	CU_ASSERT_PTR_NULL(kvp_session_lease(s, l1->id + 100, &f));
	CU_ASSERT_EQUAL(f.code, KVP_ERR_NOT_FOUND);
	kvp_fail_init(&f);
	CU_ASSERT_EQUAL(kvp_session_may_lease(d, s, a, 5, false, &f), -KVP_ERR_QUOTA_EXCEEDED);
	CU_ASSERT_EQUAL(f.quota.held, 24);
	CU_ASSERT_EQUAL(kvp_session_may_lease(d, s, a, 4, false, &f), 0);
	CU_ASSERT_EQUAL(kvp_session_leased_tokens(d, s), 24);
	CU_ASSERT_EQUAL(kvp_daemon_check(d), 0);

	before = l1->n;
	CU_ASSERT_EQUAL(kvp_lease_grow(l1, 2, &f), 0);
	kvp_session_lease_resized(s, l1, before);
	CU_ASSERT_EQUAL(s->leased_pages[0], 8);
	CU_ASSERT_EQUAL(kvp_daemon_check(d), 0);
	back[0] = l1->pages[0];
	back[1] = l1->pages[5];
	before = l1->n;
	CU_ASSERT_EQUAL(kvp_lease_return(l1, back, 2, &f), 0);
	kvp_session_lease_resized(s, l1, before);
	CU_ASSERT_EQUAL(s->leased_pages[0], 6);
	CU_ASSERT_EQUAL(kvp_daemon_check(d), 0);

	/* the lease limit (3) counts leases, in any pool */
	kvp_session_attach(s, d->pools[1]);
	l2 = kvp_lease_create(d->pools[1], KVP_TIER_ID_HOST, ++d->next_lease_id, 2, &f);
	l3 = kvp_lease_create(a, KVP_TIER_ID_HOST, ++d->next_lease_id, 1, &f);
	CU_ASSERT_PTR_NOT_NULL_FATAL(l2);
	CU_ASSERT_PTR_NOT_NULL_FATAL(l3);
	CU_ASSERT_EQUAL(kvp_session_lease_add(s, l2), 0);
	CU_ASSERT_EQUAL(kvp_session_lease_add(s, l3), 0);
	CU_ASSERT_EQUAL(s->leased_pages[0], 7);
	CU_ASSERT_EQUAL(s->leased_pages[1], 2);
	CU_ASSERT_EQUAL(kvp_session_leased_tokens(d, s), 7 * 4 + 2 * 8);
	kvp_fail_init(&f);
	CU_ASSERT_EQUAL(kvp_session_may_lease(d, s, d->pools[1], 1, true, &f),
			-KVP_ERR_LIMIT_EXCEEDED);
	CU_ASSERT_PTR_NOT_NULL(strstr(f.msg, "leases"));
	CU_ASSERT_EQUAL(kvp_session_may_lease(d, s, d->pools[1], 1, false, &f), 0);
	CU_ASSERT_EQUAL(kvp_daemon_check(d), 0);

	CU_ASSERT_EQUAL(kvp_session_lease_end(s, l3), 1);
	CU_ASSERT_EQUAL(s->leased_pages[0], 6);
	CU_ASSERT_EQUAL(s->leases.count, 2);
	CU_ASSERT_EQUAL(kvp_daemon_check(d), 0);
	/* a failed booking ("idmap" fault site, a new session's first table) books nothing */
	s2 = fx_session(d, false);
	CU_ASSERT_PTR_NOT_NULL_FATAL(s2);
	kvp_session_attach(s2, a);
	l3 = kvp_lease_create(a, KVP_TIER_ID_HOST, ++d->next_lease_id, 1, &f);
	CU_ASSERT_PTR_NOT_NULL_FATAL(l3);
	fx_faults("idmap:1:1");
	CU_ASSERT_EQUAL(kvp_session_lease_add(s2, l3), -ENOMEM);
	fx_faults(NULL);
	CU_ASSERT_EQUAL(s2->leased_pages[0], 0);
	CU_ASSERT_EQUAL(s2->leases.count, 0);
	kvp_lease_destroy(l3);
	CU_ASSERT_EQUAL(kvp_daemon_check(d), 0);
	fx_daemon_free(d);
}

/* Locks: booked with their tokens, released one by one; the lock limit. */
static void test_session_lock_accounting(void)
{
	struct kvp_daemon *d = fx_daemon(g_conf);
	struct kvpd_pool *a;
	struct kvp_session *s;
	struct kvp_fail f = { 0 };
	struct kvp_index_match mt;
	struct kvp_lock *k1, *k2;
	uint32_t tokens[16], dev[4], host[4];
	struct kvp_tier_figures fig;

	CU_ASSERT_PTR_NOT_NULL_FATAL(d);
	a = d->pools[0];
	s = fx_session(d, false);
	CU_ASSERT_PTR_NOT_NULL_FATAL(s);
	kvp_session_attach(s, a);
	CU_ASSERT_EQUAL_FATAL(fx_cache(a, KVP_TIER_ID_DEVICE, 0, 0, 16), 4);
	for (uint32_t i = 0; i < 16; i++)
		tokens[i] = i;

	CU_ASSERT_EQUAL(kvp_session_may_lock(d, s, &f), 0);
	k1 = kvp_session_lock_alloc();
	CU_ASSERT_PTR_NOT_NULL_FATAL(k1);
	CU_ASSERT_EQUAL(kvp_pool_match(a, 0, tokens, 16, true, &mt, dev, host), 0);
	CU_ASSERT_PTR_NOT_NULL_FATAL(mt.lock);
	k1->pool = a;
	k1->run = mt.lock;
	k1->pages = mt.dev_pages + mt.host_pages;
	CU_ASSERT_EQUAL(kvp_session_lock_add(d, s, k1), 0);
	CU_ASSERT_NOT_EQUAL(k1->id, 0);
	CU_ASSERT_EQUAL(s->locked_tokens, 16);
	CU_ASSERT_PTR_EQUAL(kvp_session_lock(s, k1->id, &f), k1);

	k2 = kvp_session_lock_alloc();
	CU_ASSERT_PTR_NOT_NULL_FATAL(k2);
	CU_ASSERT_EQUAL(kvp_pool_match(a, 0, tokens, 8, true, &mt, dev, host), 0);
	k2->pool = a;
	k2->run = mt.lock;
	k2->pages = mt.dev_pages + mt.host_pages;
	CU_ASSERT_EQUAL(kvp_session_lock_add(d, s, k2), 0);
	CU_ASSERT_NOT_EQUAL(k2->id, k1->id);
	CU_ASSERT_EQUAL(s->locked_tokens, 24);
	CU_ASSERT_EQUAL(kvp_session_may_lock(d, s, &f), -KVP_ERR_LIMIT_EXCEEDED);
	kvp_pool_tier_figures(a, KVP_TIER_ID_DEVICE, &fig);
	CU_ASSERT_EQUAL(fig.protected_tokens, 16);

	kvp_session_lock_release(s, k1);
	CU_ASSERT_EQUAL(s->locked_tokens, 8);
	CU_ASSERT_EQUAL(s->locks.count, 1);
	kvp_pool_tier_figures(a, KVP_TIER_ID_DEVICE, &fig);
	CU_ASSERT_EQUAL(fig.protected_tokens, 8);
	CU_ASSERT_EQUAL(kvp_session_may_lock(d, s, &f), 0);

	/* the "lock" fault site fails the allocation */
	fx_faults("lock:1:1");
	CU_ASSERT_PTR_NULL(kvp_session_lock_alloc());
	fx_faults(NULL);
	/* destroy drops the remaining lock */
	kvp_session_destroy(d, s);
	kvp_pool_tier_figures(a, KVP_TIER_ID_DEVICE, &fig);
	CU_ASSERT_EQUAL(fig.protected_tokens, 0);
	CU_ASSERT_EQUAL(kvp_index_check(a->ix), 0);
	fx_daemon_free(d);
}

/* Detach frees the leases and locks of one pool only and returns their tokens. */
static void test_session_detach_one_pool(void)
{
	struct kvp_daemon *d = fx_daemon(g_conf);
	struct kvp_session *s;
	struct kvp_fail f = { 0 };
	struct kvp_lease *la, *lb;
	struct kvp_lock *k;
	struct kvp_index_match mt;
	uint32_t tokens[8] = { 0, 1, 2, 3, 4, 5, 6, 7 }, dev[2], host[2];
	struct kvp_tier_figures fig;

	CU_ASSERT_PTR_NOT_NULL_FATAL(d);
	s = fx_session(d, false);
	CU_ASSERT_PTR_NOT_NULL_FATAL(s);
	kvp_session_attach(s, d->pools[0]);
	kvp_session_attach(s, d->pools[1]);
	la = kvp_lease_create(d->pools[0], KVP_TIER_ID_DEVICE, ++d->next_lease_id, 3, &f);
	lb = kvp_lease_create(d->pools[1], KVP_TIER_ID_HOST, ++d->next_lease_id, 2, &f);
	CU_ASSERT_PTR_NOT_NULL_FATAL(la);
	CU_ASSERT_PTR_NOT_NULL_FATAL(lb);
	CU_ASSERT_EQUAL(kvp_session_lease_add(s, la), 0);
	CU_ASSERT_EQUAL(kvp_session_lease_add(s, lb), 0);
	CU_ASSERT_EQUAL_FATAL(fx_cache(d->pools[0], KVP_TIER_ID_DEVICE, 0, 0, 8), 2);
	k = kvp_session_lock_alloc();
	CU_ASSERT_PTR_NOT_NULL_FATAL(k);
	CU_ASSERT_EQUAL(kvp_pool_match(d->pools[0], 0, tokens, 8, true, &mt, dev, host), 0);
	k->pool = d->pools[0];
	k->run = mt.lock;
	k->pages = 2;
	CU_ASSERT_EQUAL(kvp_session_lock_add(d, s, k), 0);
	CU_ASSERT_EQUAL(kvp_daemon_check(d), 0);

	CU_ASSERT_EQUAL(kvp_session_detach(d, s, d->pools[0]), 12);
	CU_ASSERT_FALSE(s->attached[0]);
	CU_ASSERT_TRUE(s->attached[1]);
	CU_ASSERT_EQUAL(d->pools[0]->sessions, 0);
	CU_ASSERT_EQUAL(d->pools[1]->sessions, 1);
	CU_ASSERT_EQUAL(s->leases.count, 1);
	CU_ASSERT_EQUAL(s->locks.count, 0);
	CU_ASSERT_EQUAL(s->locked_tokens, 0);
	CU_ASSERT_EQUAL(s->leased_pages[0], 0);
	CU_ASSERT_EQUAL(s->leased_pages[1], 2);
	kvp_pool_tier_figures(d->pools[0], KVP_TIER_ID_DEVICE, &fig);
	CU_ASSERT_EQUAL(fig.leased_tokens, 0);
	CU_ASSERT_EQUAL(fig.protected_tokens, 0);
	CU_ASSERT_EQUAL(kvp_daemon_check(d), 0);
	CU_ASSERT_EQUAL(kvp_session_detach(d, s, d->pools[0]), 0); /* again: nothing */
	CU_ASSERT_EQUAL(d->pools[0]->sessions, 0);

	kvp_session_destroy(d, s);
	CU_ASSERT_EQUAL(d->pools[1]->sessions, 0);
	kvp_pool_tier_figures(d->pools[1], KVP_TIER_ID_HOST, &fig);
	CU_ASSERT_EQUAL(fig.leased_tokens, 0);
	CU_ASSERT_EQUAL(fig.free_tokens, fig.total_tokens);
	CU_ASSERT_EQUAL(kvp_daemon_check(d), 0);
	fx_daemon_free(d);
}

/* The books check sees a quota count that disagrees with the leases, a lease the pool does not
 * book, and leased pages no live session holds. */
static void test_daemon_check_catches_wrong_books(void)
{
	struct kvp_daemon *d = fx_daemon(g_conf);
	struct kvp_session *s;
	struct kvp_fail f = { 0 };
	struct kvp_lease *l, *orphan;
	uint32_t keep;

	CU_ASSERT_PTR_NOT_NULL_FATAL(d);
	s = fx_session(d, false);
	CU_ASSERT_PTR_NOT_NULL_FATAL(s);
	kvp_session_attach(s, d->pools[0]);
	l = kvp_lease_create(d->pools[0], KVP_TIER_ID_DEVICE, ++d->next_lease_id, 3, &f);
	CU_ASSERT_PTR_NOT_NULL_FATAL(l);
	CU_ASSERT_EQUAL(kvp_session_lease_add(s, l), 0);
	CU_ASSERT_EQUAL(kvp_daemon_check(d), 0);
	s->leased_pages[0]++;
	CU_ASSERT_EQUAL(kvp_daemon_check(d), -EFAULT);
	s->leased_pages[0]--;
	keep = l->pages[1];
	l->pages[1] = l->pages[0];
	CU_ASSERT_EQUAL(kvp_daemon_check(d), -EFAULT);
	l->pages[1] = keep;
	CU_ASSERT_EQUAL(kvp_daemon_check(d), 0);
	orphan = kvp_lease_create(d->pools[0], KVP_TIER_ID_DEVICE, ++d->next_lease_id, 1, &f);
	CU_ASSERT_PTR_NOT_NULL_FATAL(orphan);
	CU_ASSERT_EQUAL(kvp_daemon_check(d), -EFAULT); /* no session holds it */
	kvp_lease_destroy(orphan);
	CU_ASSERT_EQUAL(kvp_daemon_check(d), 0);
	fx_daemon_free(d);
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_daemon_admit_open),
		H_TEST(test_daemon_admit_restricted),
		H_TEST(test_session_new_limit_and_ids),
		H_TEST(test_session_lease_accounting),
		H_TEST(test_session_lock_accounting),
		H_TEST(test_session_detach_one_pool),
		H_TEST(test_daemon_check_catches_wrong_books),
	};

	return H_RUN_SUITE("session", NULL, NULL, tests);
}
