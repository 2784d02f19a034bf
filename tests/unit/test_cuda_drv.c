/* test_cuda_drv.c - CUnit suite "cuda_drv": the driver entry points of kernels/cuda_drv.c are
 * looked up once however many threads ask at the same time, every thread gets that one result,
 * and a thread freeing memory meanwhile reads the loaded state safely (it used to read the flag
 * without the lock: run this binary under -Db_sanitize=thread to see the difference). Needs no
 * GPU: the lookup is the runtime's (which finds no driver here) or a fake one. The lookup happens
 * once per process, so each case runs in a child process and reports through its exit status.
 */
#include <CUnit/Basic.h>
#include <cuda.h> /* types only */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cuda_drv.h"
#include "suite.h"

#define THREADS 8
#define NSYMS 15 /* entry points cuda_drv.c looks up */

static atomic_uint g_lookups, g_releases;
static int g_fail_at; /* the fake lookup fails at this call (1-based) when nonzero */
static pthread_barrier_t g_go;

static CUresult stub_ctx_get(CUcontext *c)
{
	*c = NULL;
	return CUDA_SUCCESS;
}

static CUresult stub_ctx_set(CUcontext c)
{
	(void)c;
	return CUDA_SUCCESS;
}

static CUresult stub_unmap(CUdeviceptr p, size_t n)
{
	(void)p, (void)n;
	return CUDA_SUCCESS;
}

static CUresult stub_release(CUmemGenericAllocationHandle h)
{
	(void)h;
	atomic_fetch_add(&g_releases, 1);
	return CUDA_SUCCESS;
}

/* Never called by these tests: any entry point not listed above. */
static CUresult stub_other(void)
{
	abort();
}

#define AS_PTR(out, f)                                                                             \
	do {                                                                                       \
		__typeof__(&(f)) fp_ = &(f);                                                       \
		memcpy((out), &fp_, sizeof(void *));                                               \
	} while (0)

static int fake_lookup(const char *name, void **fn, char *reason, size_t len)
{
	unsigned n = atomic_fetch_add(&g_lookups, 1) + 1;

	usleep(200); /* keep the lookup under way while other threads free memory */
	if (g_fail_at && n == (unsigned)g_fail_at) {
		snprintf(reason, len, "fake driver has no %s", name);
		return -ENOSYS;
	}
	if (!strcmp(name, "cuCtxGetCurrent"))
		AS_PTR(fn, stub_ctx_get);
	else if (!strcmp(name, "cuCtxSetCurrent"))
		AS_PTR(fn, stub_ctx_set);
	else if (!strcmp(name, "cuMemUnmap") || !strcmp(name, "cuMemAddressFree"))
		AS_PTR(fn, stub_unmap);
	else if (!strcmp(name, "cuMemRelease"))
		AS_PTR(fn, stub_release);
	else
		AS_PTR(fn, stub_other);
	return 0;
}

struct worker {
	bool loads; /* calls kvp_cuda_drv_load; the others only free */
	int ret;
	char why[256];
	bool zeroed; /* the freed struct came back zeroed with fd -1 */
};

static void *worker_run(void *arg)
{
	struct worker *w = arg;
	struct kvp_cuda_mem m = { .device = 0,
				  .fd = -1,
				  .bytes = 2 << 20,
				  .dptr = 1 << 21,
				  .handle = 7,
				  .granularity = 2 << 20 };

	pthread_barrier_wait(&g_go);
	if (w->loads)
		w->ret = kvp_cuda_drv_load(w->why, sizeof(w->why));
	kvp_cuda_mem_destroy(&m);
	w->zeroed = m.bytes == 0 && m.fd == -1 && m.handle == 0;
	return NULL;
}

/* THREADS threads start at once, every other one loading; fills w[]. 0, or -1. */
static int run_threads(struct worker *w, bool all_load)
{
	pthread_t t[THREADS];

	if (pthread_barrier_init(&g_go, NULL, THREADS))
		return -1;
	for (int i = 0; i < THREADS; i++) {
		memset(&w[i], 0, sizeof(w[i]));
		w[i].loads = all_load || i % 2 == 0;
		if (pthread_create(&t[i], NULL, worker_run, &w[i]))
			return -1;
	}
	for (int i = 0; i < THREADS; i++)
		pthread_join(t[i], NULL);
	pthread_barrier_destroy(&g_go);
	return 0;
}

/* Runs fn in a child process; its exit status is the number of failed checks. */
static int in_child(int (*fn)(void))
{
	int status = 0;
	pid_t pid = fork();

	if (pid == 0)
		_exit(fn());
	if (pid < 0 || waitpid(pid, &status, 0) != pid)
		return -1;
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

#define CHECK(c)                                                                                   \
	do {                                                                                       \
		if (!(c)) {                                                                        \
			fprintf(stderr, "child: %s:%d: %s\n", __FILE__, __LINE__, #c);             \
			bad++;                                                                     \
		}                                                                                  \
	} while (0)

static int child_fake_loads_once(void)
{
	struct worker w[THREADS];
	struct kvp_cuda_mem m = { .fd = -1, .bytes = 2 << 20, .handle = 9 };
	unsigned before;
	int bad = 0;

	kvp_cuda_drv_set_lookup(fake_lookup);
	CHECK(run_threads(w, false) == 0);
	CHECK(atomic_load(&g_lookups) == NSYMS);
	for (int i = 0; i < THREADS; i++) {
		if (w[i].loads)
			CHECK(w[i].ret == 0);
		CHECK(w[i].zeroed);
	}
	/* loaded now: a free goes to the driver's release */
	before = atomic_load(&g_releases);
	kvp_cuda_mem_destroy(&m);
	CHECK(atomic_load(&g_releases) == before + 1);
	CHECK(kvp_cuda_drv_load(NULL, 0) == 0);
	CHECK(atomic_load(&g_lookups) == NSYMS);
	return bad;
}

static int child_fake_fails_once(void)
{
	struct worker w[THREADS];
	char why[256] = "";
	int bad = 0;

	g_fail_at = 5;
	kvp_cuda_drv_set_lookup(fake_lookup);
	CHECK(run_threads(w, true) == 0);
	/* one lookup, stopped at the missing entry point, whatever the number of callers */
	CHECK(atomic_load(&g_lookups) == 5);
	for (int i = 0; i < THREADS; i++) {
		CHECK(w[i].ret == -ENOSYS);
		CHECK(strstr(w[i].why, "fake driver has no cuCtxSetCurrent") != NULL);
		CHECK(w[i].zeroed);
	}
	CHECK(atomic_load(&g_releases) == 0); /* nothing loaded: no driver call on free */
	CHECK(kvp_cuda_drv_load(why, sizeof(why)) == -ENOSYS && why[0]);
	CHECK(atomic_load(&g_lookups) == 5);
	return bad;
}

static int child_runtime_lookup(void)
{
	struct worker w[THREADS];
	char why[256] = "";
	int bad = 0, probe;

	CHECK(run_threads(w, true) == 0);
	for (int i = 0; i < THREADS; i++) {
		CHECK(w[i].ret == w[0].ret);
		CHECK(w[i].ret == 0 || w[i].ret == -ENODEV || w[i].ret == -ENOSYS);
		CHECK(w[i].ret == 0 || w[i].why[0]);
		CHECK(w[i].zeroed);
	}
	CHECK(kvp_cuda_drv_load(why, sizeof(why)) == w[0].ret);
	/* no driver: the probe says so too */
	probe = kvp_cuda_probe(why, sizeof(why));
	if (w[0].ret == -ENODEV)
		CHECK(probe == -ENODEV);
	printf("\n  runtime lookup: %d (%s); probe %d\n", w[0].ret, w[0].why, probe);
	return bad;
}

static void test_kvp_cuda_drv_load_threads_once(void)
{
	CU_ASSERT_EQUAL(in_child(child_fake_loads_once), 0);
}

static void test_kvp_cuda_drv_load_threads_failure_once(void)
{
	CU_ASSERT_EQUAL(in_child(child_fake_fails_once), 0);
}

static void test_kvp_cuda_drv_load_threads_runtime(void)
{
	CU_ASSERT_EQUAL(in_child(child_runtime_lookup), 0);
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_kvp_cuda_drv_load_threads_once),
		H_TEST(test_kvp_cuda_drv_load_threads_failure_once),
		H_TEST(test_kvp_cuda_drv_load_threads_runtime),
	};

	return H_RUN_SUITE("cuda_drv", NULL, NULL, tests);
}
