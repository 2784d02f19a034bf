/* test_headers.c - daemon.h stands on its own and without the generated wire types
 * (kvpool.pb-c.h): it is included first, before anything that could bring them in. */
#include "daemon.h"

#if defined(PROTOBUF_C_kvpool_2eproto__INCLUDED) || defined(PROTOBUF_C_VERSION_NUMBER)
#error "daemon.h brings in generated wire types"
#endif

#include <CUnit/Basic.h>

#include "suite.h"

/* The deferred-reply table is usable from daemon.h alone (struct kvp_reply stays opaque). */
static void test_headers_daemon_defers_without_reply(void)
{
	struct kvp_daemon d = { 0 };

	CU_ASSERT_EQUAL(kvp_defer_count(&d.defers, 1), 0);
	CU_ASSERT_PTR_NULL(d.defers.all);
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_headers_daemon_defers_without_reply),
	};

	return H_RUN_SUITE("headers", NULL, NULL, tests);
}
