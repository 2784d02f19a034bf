/* test_idmap.c - the id map of leases and locks: put/get/del, refused ids, growth through many
 * entries and tombstones, iteration (deleting as it goes), and a failed growth that changes
 * nothing. */
#include <CUnit/Basic.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#include "fault.h"
#include "idmap.h"
#include "suite.h"

static int g_vals[4096];

static void test_idmap_put_get_del(void)
{
	struct kvp_idmap m;

	kvp_idmap_init(&m);
	CU_ASSERT_PTR_NULL(kvp_idmap_get(&m, 1)); /* empty, no table yet */
	CU_ASSERT_PTR_NULL(kvp_idmap_del(&m, 1));
	CU_ASSERT_EQUAL(kvp_idmap_put(&m, 1, &g_vals[1]), 0);
	CU_ASSERT_EQUAL(kvp_idmap_put(&m, 2, &g_vals[2]), 0);
	CU_ASSERT_EQUAL(m.count, 2);
	CU_ASSERT_PTR_EQUAL(kvp_idmap_get(&m, 1), &g_vals[1]);
	CU_ASSERT_PTR_EQUAL(kvp_idmap_get(&m, 2), &g_vals[2]);
	CU_ASSERT_PTR_NULL(kvp_idmap_get(&m, 3));
	CU_ASSERT_EQUAL(kvp_idmap_put(&m, 1, &g_vals[3]), -EEXIST);
	CU_ASSERT_PTR_EQUAL(kvp_idmap_get(&m, 1), &g_vals[1]);
	CU_ASSERT_PTR_EQUAL(kvp_idmap_del(&m, 1), &g_vals[1]);
	CU_ASSERT_PTR_NULL(kvp_idmap_get(&m, 1));
	CU_ASSERT_PTR_NULL(kvp_idmap_del(&m, 1));
	CU_ASSERT_EQUAL(m.count, 1);
	/* a deleted id may come back */
	CU_ASSERT_EQUAL(kvp_idmap_put(&m, 1, &g_vals[4]), 0);
	CU_ASSERT_PTR_EQUAL(kvp_idmap_get(&m, 1), &g_vals[4]);
	CU_ASSERT_EQUAL(m.count, 2);
	kvp_idmap_release(&m);
	CU_ASSERT_EQUAL(m.count, 0);
	CU_ASSERT_PTR_NULL(kvp_idmap_get(&m, 2));
}

/* 0 and UINT64_MAX are the map's empty and deleted marks: refused, never found. */
static void test_idmap_put_reserved_ids(void)
{
	struct kvp_idmap m;

	kvp_idmap_init(&m);
	CU_ASSERT_EQUAL(kvp_idmap_put(&m, 0, &g_vals[0]), -EINVAL);
	CU_ASSERT_EQUAL(kvp_idmap_put(&m, UINT64_MAX, &g_vals[0]), -EINVAL);
	CU_ASSERT_EQUAL(kvp_idmap_put(&m, 5, &g_vals[5]), 0);
	CU_ASSERT_PTR_NULL(kvp_idmap_get(&m, 0));
	CU_ASSERT_PTR_NULL(kvp_idmap_get(&m, UINT64_MAX));
	CU_ASSERT_PTR_NULL(kvp_idmap_del(&m, 0));
	CU_ASSERT_PTR_NULL(kvp_idmap_del(&m, UINT64_MAX));
	CU_ASSERT_EQUAL(m.count, 1);
	CU_ASSERT_EQUAL(kvp_idmap_put(&m, UINT64_MAX - 1, &g_vals[6]), 0);
	CU_ASSERT_PTR_EQUAL(kvp_idmap_get(&m, UINT64_MAX - 1), &g_vals[6]);
	kvp_idmap_release(&m);
}

/* Thousands of ids, half deleted and put again many times: every live id is found with its
 * value, no deleted one is, and the table stays a power of two under 3/4 full. */
static void test_idmap_put_grows_through_tombstones(void)
{
	struct kvp_idmap m;
	uint32_t n = 4000;

	kvp_idmap_init(&m);
	for (uint32_t i = 1; i <= n; i++)
		CU_ASSERT_EQUAL_FATAL(kvp_idmap_put(&m, (uint64_t)i * 0x9e3779b9ULL, &g_vals[i]),
				      0);
	CU_ASSERT_EQUAL(m.count, n);
	for (int round = 0; round < 20; round++) {
		for (uint32_t i = 1; i <= n; i += 2)
			CU_ASSERT_PTR_EQUAL(kvp_idmap_del(&m, (uint64_t)i * 0x9e3779b9ULL),
					    &g_vals[i]);
		CU_ASSERT_EQUAL(m.count, n / 2);
		for (uint32_t i = 1; i <= n; i += 2)
			CU_ASSERT_EQUAL(kvp_idmap_put(&m, (uint64_t)i * 0x9e3779b9ULL, &g_vals[i]),
					0);
	}
	CU_ASSERT_EQUAL(m.count, n);
	CU_ASSERT_EQUAL(m.cap & (m.cap - 1), 0);
	CU_ASSERT_TRUE(m.used * 4 < m.cap * 3);
	CU_ASSERT_TRUE(m.used >= m.count);
	for (uint32_t i = 1; i <= n; i++)
		CU_ASSERT_PTR_EQUAL(kvp_idmap_get(&m, (uint64_t)i * 0x9e3779b9ULL), &g_vals[i]);
	CU_ASSERT_PTR_NULL(kvp_idmap_get(&m, 0x9e3779b9ULL * (n + 1)));
	kvp_idmap_release(&m);
}

/* Iteration visits every live entry exactly once, also when it deletes the current one. */
static void test_idmap_next_visits_each_once(void)
{
	struct kvp_idmap m;
	unsigned char seen[301] = { 0 };
	uint32_t visits = 0;
	uint64_t id;
	void *v;

	kvp_idmap_init(&m);
	CU_ASSERT_EQUAL(kvp_idmap_next(&m, 0, &id, &v), 0);
	for (uint64_t i = 1; i <= 300; i++)
		CU_ASSERT_EQUAL(kvp_idmap_put(&m, i, &g_vals[i]), 0);
	for (uint64_t i = 1; i <= 300; i += 3)
		kvp_idmap_del(&m, i);
	for (uint32_t c = 0; (c = kvp_idmap_next(&m, c, &id, &v)) != 0;) {
		CU_ASSERT_FATAL(id >= 1 && id <= 300);
		CU_ASSERT_PTR_EQUAL(v, &g_vals[id]);
		CU_ASSERT_NOT_EQUAL(id % 3, 1);
		seen[id]++;
		visits++;
		if (id % 2 == 0)
			CU_ASSERT_PTR_EQUAL(kvp_idmap_del(&m, id), v);
	}
	CU_ASSERT_EQUAL(visits, 200);
	for (uint64_t i = 1; i <= 300; i++)
		CU_ASSERT_EQUAL(seen[i], i % 3 == 1 ? 0 : 1);
	CU_ASSERT_EQUAL(m.count, 100); /* the odd ids not deleted before */
	visits = 0;
	for (uint32_t c = 0; (c = kvp_idmap_next(&m, c, &id, &v)) != 0;) {
		CU_ASSERT(id % 2 == 1 && id % 3 != 1);
		visits++;
	}
	CU_ASSERT_EQUAL(visits, 100);
	kvp_idmap_release(&m);
}

/* A growth that fails ("idmap" fault site) returns -ENOMEM and leaves the map as it was. */
static void test_idmap_put_failed_growth_changes_nothing(void)
{
	struct kvp_idmap m;
	char err[128];
	uint64_t i;
	int rc = 0;

	kvp_idmap_init(&m);
	setenv("KVPOOLD_FAULTS", "idmap:1", 1);
	CU_ASSERT_EQUAL_FATAL(kvp_fault_init(err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(kvp_idmap_put(&m, 1, &g_vals[1]), -ENOMEM); /* the first table */
	CU_ASSERT_EQUAL(m.count, 0);
	unsetenv("KVPOOLD_FAULTS");
	CU_ASSERT_EQUAL_FATAL(kvp_fault_init(err, sizeof(err)), 0);
	for (i = 1; i <= 11; i++)
		CU_ASSERT_EQUAL(kvp_idmap_put(&m, i, &g_vals[i]), 0);
	CU_ASSERT_EQUAL(m.cap, 16);
	setenv("KVPOOLD_FAULTS", "idmap:1", 1);
	CU_ASSERT_EQUAL_FATAL(kvp_fault_init(err, sizeof(err)), 0);
	for (; i <= 16 && rc == 0; i++)
		rc = kvp_idmap_put(&m, i, &g_vals[i]);
	unsetenv("KVPOOLD_FAULTS");
	CU_ASSERT_EQUAL_FATAL(kvp_fault_init(err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(rc, -ENOMEM);
	i--; /* the id refused */
	CU_ASSERT_EQUAL(m.cap, 16);
	CU_ASSERT_EQUAL(m.count, i - 1);
	CU_ASSERT_PTR_NULL(kvp_idmap_get(&m, i));
	for (uint64_t j = 1; j < i; j++)
		CU_ASSERT_PTR_EQUAL(kvp_idmap_get(&m, j), &g_vals[j]);
	CU_ASSERT_EQUAL(kvp_idmap_put(&m, i, &g_vals[i]), 0);
	CU_ASSERT_EQUAL(m.cap, 32);
	kvp_idmap_release(&m);
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_idmap_put_get_del),
		H_TEST(test_idmap_put_reserved_ids),
		H_TEST(test_idmap_put_grows_through_tombstones),
		H_TEST(test_idmap_next_visits_each_once),
		H_TEST(test_idmap_put_failed_growth_changes_nothing),
	};

	return H_RUN_SUITE("idmap", NULL, NULL, tests);
}
