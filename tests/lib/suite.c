/* suite.c - the CUnit runner of suite.h. */
#include "suite.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

#include <CUnit/Basic.h>

int h_run_suite(const char *suite, CU_InitializeFunc init, CU_CleanupFunc clean,
		const struct h_test *tests, size_t n)
{
	unsigned failed;
	CU_pSuite s;

	signal(SIGPIPE, SIG_IGN);
	if (CU_initialize_registry() != CUE_SUCCESS)
		return 1;
	s = CU_add_suite(suite, init, clean);
	for (size_t i = 0; s && i < n; i++)
		if (!CU_add_test(s, tests[i].name, tests[i].fn))
			s = NULL;
	CU_basic_set_mode(CU_BRM_VERBOSE);
	if (s)
		CU_basic_run_tests();
	failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
		 CU_get_number_of_suites_failed() + !s;
	CU_cleanup_registry();
	return failed ? 1 : 0;
}

const char *h_src_path(int argc, char **argv, const char *rel)
{
	static char path[4096];
	const char *srcdir = getenv("KVP_SRCDIR");

	if (argc > 1)
		return argv[1];
	if (srcdir && *srcdir &&
	    snprintf(path, sizeof(path), "%s/%s", srcdir, rel) < (int)sizeof(path))
		return path;
	return rel;
}
