/* test_units.c - the duration parser (config keys, kvpoolctl drain --deadline) and the byte
 * counts both sides print (units.h). */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "suite.h"
#include "units.h"

#define U32 ((uint64_t)UINT32_MAX)

static uint64_t ms_of(const char *s, uint64_t bare, uint64_t max, int *r)
{
	uint64_t ms = 12345;

	*r = kvp_units_duration_ms(s, bare, max, &ms);
	return ms;
}

static void test_kvp_units_duration_ms_units(void)
{
	int r;

	CU_ASSERT_EQUAL(ms_of("30s", 1, U32, &r), 30000);
	CU_ASSERT_EQUAL(r, 0);
	CU_ASSERT_EQUAL(ms_of("250ms", 1, U32, &r), 250);
	CU_ASSERT_EQUAL(ms_of("5m", 1, U32, &r), 300000);
	CU_ASSERT_EQUAL(ms_of("2h", 1, U32, &r), 7200000);
	CU_ASSERT_EQUAL(ms_of("30 s", 1, U32, &r), 30000);
	CU_ASSERT_EQUAL(r, 0);
	CU_ASSERT_EQUAL(ms_of("0", 1, U32, &r), 0);
	CU_ASSERT_EQUAL(r, 0);
}

static void test_kvp_units_duration_ms_bare_number(void)
{
	int r;

	CU_ASSERT_EQUAL(ms_of("30", 1, U32, &r), 30);
	CU_ASSERT_EQUAL(r, 0);
	CU_ASSERT_EQUAL(ms_of("30", 1000, U32, &r), 30000);
	CU_ASSERT_EQUAL(r, 0);
	CU_ASSERT_EQUAL(ms_of("4294967295", 1, U32, &r), U32);
	CU_ASSERT_EQUAL(r, 0);
}

static void test_kvp_units_duration_ms_overflow(void)
{
	int r;

	/* What the wire's uint32 ms cannot hold is refused, never wrapped. */
	CU_ASSERT_EQUAL(ms_of("5000000000", 1, U32, &r), 12345);
	CU_ASSERT_EQUAL(r, -ERANGE);
	ms_of("4294967296", 1, U32, &r);
	CU_ASSERT_EQUAL(r, -ERANGE);
	ms_of("1194h", 1, U32, &r); /* 4298400000 ms */
	CU_ASSERT_EQUAL(r, -ERANGE);
	ms_of("1193h", 1, U32, &r); /* 4294800000 ms */
	CU_ASSERT_EQUAL(r, 0);
	ms_of("99999999999999999999999", 1, UINT64_MAX, &r);
	CU_ASSERT_EQUAL(r, -ERANGE);
	ms_of("18446744073709551615h", 1, UINT64_MAX, &r);
	CU_ASSERT_EQUAL(r, -ERANGE);
	ms_of("61s", 1, 60000, &r);
	CU_ASSERT_EQUAL(r, -ERANGE);
}

static void test_kvp_units_duration_ms_not_a_duration(void)
{
	static const char *const bad[] = { "",	   " 5s", "-5",	  "+5",	 "5x", "5 sec",
					   "1.5s", "s",	  "0x10", "5s ", "5S", "5ms5" };
	int r;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		CU_ASSERT_EQUAL(ms_of(bad[i], 1, U32, &r), 12345);
		CU_ASSERT_EQUAL(r, -EINVAL);
		if (r != -EINVAL)
			printf("\n    '%s' was taken: %d\n", bad[i], r);
	}
	ms_of(NULL, 1, U32, &r);
	CU_ASSERT_EQUAL(r, -EINVAL);
	ms_of("99999999999999999999999q", 1, U32, &r);
	CU_ASSERT_EQUAL(r, -EINVAL);
}

static void test_kvp_units_bytes_small_and_large(void)
{
	char b[32];

	kvp_units_bytes(512, b, sizeof(b));
	CU_ASSERT_STRING_EQUAL(b, "512 B");
	kvp_units_bytes(64 << 10, b, sizeof(b));
	CU_ASSERT_STRING_EQUAL(b, "64.0 KiB");
	kvp_units_bytes(1 << 20, b, sizeof(b));
	CU_ASSERT_STRING_EQUAL(b, "1.0 MiB");
	kvp_units_bytes(99999999, b, sizeof(b));
	CU_ASSERT_STRING_EQUAL(b, "95.4 MiB");
	kvp_units_bytes(100000000, b, sizeof(b));
	CU_ASSERT_STRING_EQUAL(b, "0.10 GB");
	kvp_units_bytes(1099511627776ull, b, sizeof(b));
	CU_ASSERT_STRING_EQUAL(b, "1099.51 GB");
	kvp_units_bytes(0, b, sizeof(b));
	CU_ASSERT_STRING_EQUAL(b, "0 B");
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_kvp_units_duration_ms_units),
		H_TEST(test_kvp_units_duration_ms_bare_number),
		H_TEST(test_kvp_units_duration_ms_overflow),
		H_TEST(test_kvp_units_duration_ms_not_a_duration),
		H_TEST(test_kvp_units_bytes_small_and_large),
	};

	return H_RUN_SUITE("units", NULL, NULL, tests);
}
