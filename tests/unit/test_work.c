/* test_work.c - CUnit tests of daemon/base/work.c: jobs run on the worker thread, in order; the
 * eventfd becomes readable when they finish; completions run on the caller's thread at reap;
 * stop cancels what never ran. */
#include "work.h"

#include "suite.h"
#include <CUnit/Basic.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

struct tjob {
	struct kvp_job job;
	pthread_t ran_on, done_on;
	int order;
	int ms; /* how long run sleeps */
	bool ran, done, cancelled;
	int started; /* set first thing on the worker (atomic) */
};

static int g_next_order;

static void tjob_run(struct kvp_job *j)
{
	struct tjob *t = (struct tjob *)j;
	struct timespec ts = { .tv_sec = t->ms / 1000, .tv_nsec = (t->ms % 1000) * 1000000L };

	__atomic_store_n(&t->started, 1, __ATOMIC_SEQ_CST);
	if (t->ms)
		nanosleep(&ts, NULL);
	t->ran_on = pthread_self();
	t->ran = true;
}

static void tjob_done(struct kvp_job *j, bool cancelled)
{
	struct tjob *t = (struct tjob *)j;

	t->done_on = pthread_self();
	t->done = true;
	t->cancelled = cancelled;
	t->order = ++g_next_order;
}

static void tjob_init(struct tjob *t, int ms)
{
	*t = (struct tjob){ .job = { .run = tjob_run, .done = tjob_done }, .ms = ms };
}

/* Waits for the eventfd and reaps until n jobs completed (5 s at most). */
static int reap_until(struct kvp_work *w, int n)
{
	int got = 0;

	for (int i = 0; i < 500 && got < n; i++) {
		struct pollfd p = { .fd = kvp_work_fd(w), .events = POLLIN };
		uint64_t v;

		if (poll(&p, 1, 10) == 1 && read(kvp_work_fd(w), &v, sizeof(v)) == sizeof(v))
			CU_ASSERT(v >= 1);
		got += kvp_work_reap(w);
	}
	return got;
}

static void test_kvp_work_submit_runs_off_thread(void)
{
	struct kvp_work *w = kvp_work_start();
	struct tjob t;

	CU_ASSERT_PTR_NOT_NULL_FATAL(w);
	tjob_init(&t, 50);
	g_next_order = 0;
	CU_ASSERT_EQUAL(kvp_work_submit(w, &t.job), 0);
	CU_ASSERT_EQUAL(kvp_work_pending(w), 1);
	CU_ASSERT_FALSE(t.done); /* a completion never runs on the worker */
	CU_ASSERT_EQUAL(reap_until(w, 1), 1);
	CU_ASSERT(t.ran);
	CU_ASSERT(t.done);
	CU_ASSERT_FALSE(t.cancelled);
	CU_ASSERT_FALSE(pthread_equal(t.ran_on, pthread_self()));
	CU_ASSERT(pthread_equal(t.done_on, pthread_self()));
	CU_ASSERT_EQUAL(kvp_work_pending(w), 0);
	kvp_work_stop(w);
}

static void test_kvp_work_reap_in_order(void)
{
	struct kvp_work *w = kvp_work_start();
	struct tjob t[4];

	CU_ASSERT_PTR_NOT_NULL_FATAL(w);
	g_next_order = 0;
	for (int i = 0; i < 4; i++) {
		tjob_init(&t[i], 5);
		CU_ASSERT_EQUAL(kvp_work_submit(w, &t[i].job), 0);
	}
	CU_ASSERT_EQUAL(reap_until(w, 4), 4);
	for (int i = 0; i < 4; i++)
		CU_ASSERT_EQUAL(t[i].order, i + 1);
	CU_ASSERT_EQUAL(kvp_work_reap(w), 0);
	kvp_work_stop(w);
}

static void test_kvp_work_stop_cancels_queued(void)
{
	struct kvp_work *w = kvp_work_start();
	struct tjob slow, queued;

	CU_ASSERT_PTR_NOT_NULL_FATAL(w);
	g_next_order = 0;
	tjob_init(&slow, 200);
	tjob_init(&queued, 0);
	CU_ASSERT_EQUAL(kvp_work_submit(w, &slow.job), 0);
	CU_ASSERT_EQUAL(kvp_work_submit(w, &queued.job), 0);
	for (int i = 0; i < 5000 && !__atomic_load_n(&slow.started, __ATOMIC_SEQ_CST); i++)
		usleep(1000); /* until slow is running */
	CU_ASSERT_FATAL(__atomic_load_n(&slow.started, __ATOMIC_SEQ_CST));
	kvp_work_stop(w);
	CU_ASSERT(slow.ran);
	CU_ASSERT(slow.done);
	CU_ASSERT_FALSE(slow.cancelled);
	CU_ASSERT_FALSE(queued.ran);
	CU_ASSERT(queued.done);
	CU_ASSERT(queued.cancelled);
	kvp_work_stop(NULL);
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_kvp_work_submit_runs_off_thread),
		H_TEST(test_kvp_work_reap_in_order),
		H_TEST(test_kvp_work_stop_cancels_queued),
	};

	return H_RUN_SUITE("work", NULL, NULL, tests);
}
