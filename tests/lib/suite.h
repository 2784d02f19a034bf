/* suite.h - one way to run a CUnit suite, shared by every test binary. */
#pragma once
#include <stddef.h>

#include <CUnit/CUnit.h>

struct h_test {
	const char *name;
	CU_TestFunc fn;
};
#define H_TEST(fn)                                                                                 \
	{                                                                                          \
#fn, fn                                                                            \
	}

/* Runs tests as suite `suite` (init and clean may be NULL): SIGPIPE ignored, verbose output.
 * Returns the exit status: 0 when every test passed and the suite's init and cleanup did too. */
int h_run_suite(const char *suite, CU_InitializeFunc init, CU_CleanupFunc clean,
		const struct h_test *tests, size_t n);

/* The path of a source-tree file a test reads: argv[1] when given (meson passes it), else
 * $KVP_SRCDIR/rel, else rel (run from the source root). The result lives until exit. */
const char *h_src_path(int argc, char **argv, const char *rel);

#define H_RUN_SUITE(name, init, clean, tests)                                                      \
	h_run_suite((name), (init), (clean), (tests), sizeof(tests) / sizeof((tests)[0]))
