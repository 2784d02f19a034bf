/* test_names.c - kvpool.h and every daemon header compile in one file (no name means two things),
 * and the values both sides share agree: tiers, limits, dtypes (through the wire), codes. */
#include "kvpool.h"

#include "budget.h"
#include "config.h"
#include "daemon.h"
#include "dispatch.h"
#include "fail.h"
#include "idmap.h"
#include "kv_copy.h"
#include "metrics.h"
#include "names.h"
#include "pages.h"
#include "pool.h"
#include "pool_cache.h"
#include "index.h"
#include "reply.h"
#include "stats.h"
#include "tier.h"

#include "suite.h"

static void test_names_tiers_agree(void)
{
	CU_ASSERT_EQUAL((int)KVP_TIER_DEVICE, (int)KVP_TIER_ID_DEVICE);
	CU_ASSERT_EQUAL((int)KVP_TIER_HOST, (int)KVP_TIER_ID_HOST);
	CU_ASSERT_EQUAL((int)KVP_TIER_MAX, (int)KVP_TIER_ID_MAX);
	CU_ASSERT_STRING_EQUAL(kvp_tier_name(KVP_TIER_HOST), kvp_names_tier(KVP_TIER_ID_HOST));
	CU_ASSERT_STRING_EQUAL(kvp_tier_name(5), "?");
}

static void test_names_limits_agree(void)
{
	CU_ASSERT_EQUAL((int)KVP_LIMIT_NONE, (int)KVP_BUDGET_NONE);
	CU_ASSERT_EQUAL((int)KVP_LIMIT_MEM_AVAILABLE, (int)KVP_BUDGET_MEM_AVAILABLE);
	CU_ASSERT_EQUAL((int)KVP_LIMIT_NUMA_NODE_FREE, (int)KVP_BUDGET_NUMA_NODE_FREE);
	CU_ASSERT_EQUAL((int)KVP_LIMIT_CGROUP_MEMORY_MAX, (int)KVP_BUDGET_CGROUP_MEMORY_MAX);
	CU_ASSERT_EQUAL((int)KVP_LIMIT_RLIMIT_MEMLOCK, (int)KVP_BUDGET_RLIMIT_MEMLOCK);
	CU_ASSERT_EQUAL((int)KVP_LIMIT_HUGEPAGES_FREE, (int)KVP_BUDGET_HUGEPAGES_FREE);
	CU_ASSERT_EQUAL((int)KVP_LIMIT_MAX, (int)KVP_BUDGET_MAX);
}

/* The config numbers dtypes from 0, the public header from 1 (0 = none): both name them alike. */
static void test_names_dtypes_by_name(void)
{
	static const struct {
		int conf, pub;
	} m[] = { { KVP_CONF_DTYPE_FP16, KVP_DTYPE_FP16 },
		  { KVP_CONF_DTYPE_BF16, KVP_DTYPE_BF16 },
		  { KVP_CONF_DTYPE_FP8, KVP_DTYPE_FP8 },
		  { KVP_CONF_DTYPE_FP32, KVP_DTYPE_FP32 } };

	for (size_t i = 0; i < sizeof(m) / sizeof(m[0]); i++)
		CU_ASSERT_STRING_EQUAL(kvp_conf_dtype_name(m[i].conf), kvp_dtype_name(m[i].pub));
	/* one table (names.h) behind both */
	CU_ASSERT_STRING_EQUAL(kvp_dtype_name(KVP_DTYPE_BF16), kvp_names_dtype(KVP_DTYPE_BF16));
	CU_ASSERT_STRING_EQUAL(kvp_conf_dtype_name(KVP_CONF_DTYPE_FP8), "fp8");
	CU_ASSERT_STRING_EQUAL(kvp_names_dtype(0), "none");
	CU_ASSERT_STRING_EQUAL(kvp_names_dtype(5), "?");
	CU_ASSERT_STRING_EQUAL(kvp_conf_dtype_name(KVP_CONF_DTYPE_MAX), "?");
}

static void test_names_codes_agree(void)
{
	CU_ASSERT_EQUAL((int)KVP_E_OUT_OF_CAPACITY, (int)KVP_ERR_OUT_OF_CAPACITY);
	CU_ASSERT_EQUAL((int)KVP_E_HOST_BUDGET_EXCEEDED, (int)KVP_ERR_HOST_BUDGET_EXCEEDED);
	CU_ASSERT_EQUAL((int)KVP_E_QUOTA_EXCEEDED, (int)KVP_ERR_QUOTA_EXCEEDED);
	CU_ASSERT_EQUAL((int)KVP_E_NO_SUCH_POOL, (int)KVP_ERR_NO_SUCH_POOL);
	CU_ASSERT_EQUAL((int)KVP_E_GEOMETRY_MISMATCH, (int)KVP_ERR_GEOMETRY_MISMATCH);
	CU_ASSERT_EQUAL((int)KVP_E_NOT_FOUND, (int)KVP_ERR_NOT_FOUND);
	CU_ASSERT_EQUAL((int)KVP_E_INVALID_ARGUMENT, (int)KVP_ERR_INVALID_ARGUMENT);
	CU_ASSERT_EQUAL((int)KVP_E_PERMISSION_DENIED, (int)KVP_ERR_PERMISSION_DENIED);
	CU_ASSERT_EQUAL((int)KVP_E_PROTOCOL, (int)KVP_ERR_PROTOCOL);
	CU_ASSERT_EQUAL((int)KVP_E_VERSION, (int)KVP_ERR_VERSION);
	CU_ASSERT_EQUAL((int)KVP_E_SHUTTING_DOWN, (int)KVP_ERR_SHUTTING_DOWN);
	CU_ASSERT_EQUAL((int)KVP_E_LIMIT_EXCEEDED, (int)KVP_ERR_LIMIT_EXCEEDED);
	CU_ASSERT_EQUAL((int)KVP_E_UNAVAILABLE, (int)KVP_ERR_UNAVAILABLE);
	CU_ASSERT_EQUAL((int)KVP_E_INTERNAL, (int)KVP_ERR_INTERNAL);
	CU_ASSERT_EQUAL((int)KVP_E_RESTARTED, (int)KVP_ERR_RESTARTED);
	CU_ASSERT_STRING_EQUAL(kvp_code_name(-KVP_E_RESTARTED), "RESTARTED");
	CU_ASSERT_STRING_EQUAL(kvp_code_name(KVP_ERR_NOT_FOUND), "NOT_FOUND");
}

static void test_names_backends_agree(void)
{
	CU_ASSERT_EQUAL((int)KVP_BACKEND_SIM, (int)KVP_BACKEND_KIND_SIM);
	CU_ASSERT_EQUAL((int)KVP_BACKEND_CUDA, (int)KVP_BACKEND_KIND_CUDA);
	CU_ASSERT_EQUAL((int)KVP_BACKEND_MEMFD, (int)KVP_BACKEND_KIND_MEMFD);
	CU_ASSERT_STRING_EQUAL(kvp_backend_name(KVP_BACKEND_MEMFD),
			       kvp_names_backend(KVP_BACKEND_KIND_MEMFD));
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_names_tiers_agree),	   H_TEST(test_names_limits_agree),
		H_TEST(test_names_dtypes_by_name), H_TEST(test_names_codes_agree),
		H_TEST(test_names_backends_agree),
	};

	return H_RUN_SUITE("names", NULL, NULL, tests);
}
