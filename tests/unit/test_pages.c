/* test_pages.c - the page allocator under random alloc/free/cache sequences, with the
 * invariant free + leased + cached (+ moving) == total checked after every step. Every test runs
 * twice: with the AVX2 loops where the CPU has them, then with the generic ones. */
#include <CUnit/Basic.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pages.h"
#include "suite.h"

static int g_simd; /* kvp_pages_simd for every allocator a test makes */

static struct kvp_pages *new_pages(uint32_t total)
{
	struct kvp_pages *p = kvp_pages_new(total);

	if (p)
		kvp_pages_simd(p, g_simd);
	return p;
}

static void test_pages_alloc_all_then_enospc(void)
{
	struct kvp_pages *p = new_pages(10);
	uint32_t ids[11];

	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	CU_ASSERT_EQUAL(kvp_pages_alloc(p, 0, ids), -EINVAL);
	CU_ASSERT_EQUAL(kvp_pages_alloc(p, 11, ids), -ENOSPC);
	CU_ASSERT_EQUAL(kvp_pages_count(p, KVP_PAGE_FREE), 10); /* all or nothing */
	CU_ASSERT_EQUAL(kvp_pages_alloc(p, 10, ids), 0);
	CU_ASSERT_EQUAL(ids[0], 0);
	CU_ASSERT_EQUAL(kvp_pages_alloc(p, 1, ids), -ENOSPC);
	CU_ASSERT_EQUAL(kvp_pages_check(p), 0);
	kvp_pages_free(p);
}

static void test_pages_release_rejects_bad_ids_atomically(void)
{
	struct kvp_pages *p = new_pages(8);
	uint32_t ids[4], bad[3];

	CU_ASSERT_EQUAL_FATAL(kvp_pages_alloc(p, 4, ids), 0);
	bad[0] = ids[0], bad[1] = 99, bad[2] = ids[1];
	CU_ASSERT_EQUAL(kvp_pages_release(p, bad, 3), -EINVAL);
	bad[1] = ids[0]; /* duplicate */
	CU_ASSERT_EQUAL(kvp_pages_release(p, bad, 3), -EINVAL);
	bad[1] = 7; /* free page */
	CU_ASSERT_EQUAL(kvp_pages_release(p, bad, 2), -EINVAL);
	CU_ASSERT_EQUAL(kvp_pages_count(p, KVP_PAGE_LEASED), 4);
	CU_ASSERT_EQUAL(kvp_pages_check(p), 0);
	CU_ASSERT_EQUAL(kvp_pages_release(p, ids, 4), 0);
	CU_ASSERT_EQUAL(kvp_pages_release(p, ids, 1), -EINVAL); /* double free */
	CU_ASSERT_EQUAL(kvp_pages_count(p, KVP_PAGE_FREE), 8);
	kvp_pages_free(p);
}

static void test_pages_random_sequences_keep_invariant(void)
{
	enum { N = 257 };
	struct kvp_pages *p = new_pages(N);
	uint8_t model[N] = { 0 }; /* what the test believes each page is */
	unsigned seed = 12345;

	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	for (int step = 0; step < 20000; step++) {
		int op = rand_r(&seed) % 4;
		uint32_t ids[16], n = 1 + (uint32_t)rand_r(&seed) % 16,
				  c[KVP_PAGE_STATE_MAX] = { 0 };

		if (op == 0) {
			uint32_t nfree = kvp_pages_count(p, KVP_PAGE_FREE);
			int r = kvp_pages_alloc(p, n, ids);

			CU_ASSERT_EQUAL(r, n <= nfree ? 0 : -ENOSPC);
			for (uint32_t i = 0; r == 0 && i < n; i++) {
				CU_ASSERT_EQUAL(model[ids[i]], KVP_PAGE_FREE);
				model[ids[i]] = KVP_PAGE_LEASED;
			}
		} else if (op == 1 || op == 2) {
			uint32_t k = 0;

			for (uint32_t i = (uint32_t)rand_r(&seed) % N, j = 0; j < N && k < n; j++)
				if (model[(i + j) % N] != KVP_PAGE_FREE)
					ids[k++] = (i + j) % N;
			if (op == 1) {
				CU_ASSERT_EQUAL(kvp_pages_release(p, ids, k), 0);
				for (uint32_t i = 0; i < k; i++)
					model[ids[i]] = KVP_PAGE_FREE;
			} else {
				for (uint32_t i = 0; i < k; i++) {
					int from = model[ids[i]];
					int to = from == KVP_PAGE_LEASED ? KVP_PAGE_CACHED
									 : KVP_PAGE_LEASED;

					CU_ASSERT_EQUAL(kvp_pages_move(p, ids[i], from, to), 0);
					model[ids[i]] = (uint8_t)to;
				}
			}
		} else {
			uint32_t id = (uint32_t)rand_r(&seed) % (N + 3);

			CU_ASSERT_EQUAL(kvp_pages_state(p, id), id < N ? model[id] : -EINVAL);
		}
		for (int i = 0; i < N; i++)
			c[model[i]]++;
		for (int s = 0; s < KVP_PAGE_STATE_MAX; s++)
			CU_ASSERT_EQUAL(kvp_pages_count(p, s), c[s]);
		CU_ASSERT_EQUAL(c[0] + c[1] + c[2], N);
		if (step % 97 == 0)
			CU_ASSERT_EQUAL(kvp_pages_check(p), 0);
	}
	kvp_pages_free(p);
}

/* A copy's destination: reserved (neither free nor allocatable), counted in the sum, and
 * released (a failed copy) or cached (a finished one) from there. */
static void test_pages_moving_state_reserved_and_counted(void)
{
	struct kvp_pages *p = new_pages(4);
	uint32_t ids[4];

	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	CU_ASSERT_EQUAL_FATAL(kvp_pages_alloc(p, 2, ids), 0);
	CU_ASSERT_EQUAL(kvp_pages_move(p, ids[0], KVP_PAGE_LEASED, KVP_PAGE_MOVING), 0);
	CU_ASSERT_EQUAL(kvp_pages_move(p, ids[1], KVP_PAGE_LEASED, KVP_PAGE_MOVING), 0);
	CU_ASSERT_EQUAL(kvp_pages_state(p, ids[0]), KVP_PAGE_MOVING);
	CU_ASSERT_EQUAL(kvp_pages_count(p, KVP_PAGE_MOVING), 2);
	CU_ASSERT_EQUAL(kvp_pages_count(p, KVP_PAGE_FREE), 2);
	CU_ASSERT_EQUAL(kvp_pages_check(p), 0);
	CU_ASSERT_EQUAL(kvp_pages_alloc(p, 3, ids + 2), -ENOSPC); /* reserved, not free */
	CU_ASSERT_EQUAL(kvp_pages_move(p, ids[0], KVP_PAGE_LEASED, KVP_PAGE_CACHED), -EINVAL);
	CU_ASSERT_EQUAL(kvp_pages_move(p, ids[0], KVP_PAGE_MOVING, KVP_PAGE_FREE), -EINVAL);
	CU_ASSERT_EQUAL(kvp_pages_move(p, ids[0], KVP_PAGE_MOVING, KVP_PAGE_CACHED), 0);
	CU_ASSERT_EQUAL(kvp_pages_release(p, ids + 1, 1), 0);
	CU_ASSERT_EQUAL(kvp_pages_count(p, KVP_PAGE_MOVING), 0);
	CU_ASSERT_EQUAL(kvp_pages_count(p, KVP_PAGE_CACHED), 1);
	CU_ASSERT_EQUAL(kvp_pages_count(p, KVP_PAGE_FREE), 3);
	CU_ASSERT_EQUAL(kvp_pages_check(p), 0);
	kvp_pages_free(p);
}

/* A restart claims exactly the pages its books name; a bad list changes nothing. */
static void test_pages_claim_named_pages(void)
{
	struct kvp_pages *p = new_pages(8);
	uint32_t ids[3] = { 5, 1, 6 }, dup[2] = { 2, 2 }, out[5];

	CU_ASSERT_FATAL(p != NULL);
	CU_ASSERT_EQUAL(kvp_pages_claim(p, dup, 2), -EINVAL);
	CU_ASSERT_EQUAL(kvp_pages_count(p, KVP_PAGE_FREE), 8);
	CU_ASSERT_EQUAL(kvp_pages_claim(p, ids, 3), 0);
	CU_ASSERT_EQUAL(kvp_pages_state(p, 5), KVP_PAGE_LEASED);
	CU_ASSERT_EQUAL(kvp_pages_claim(p, ids, 1), -EINVAL); /* not free any more */
	CU_ASSERT_EQUAL(kvp_pages_check(p), 0);
	CU_ASSERT_EQUAL(kvp_pages_alloc(p, 5, out), 0); /* the five others, none claimed */
	for (int i = 0; i < 5; i++)
		CU_ASSERT(out[i] != 5 && out[i] != 1 && out[i] != 6);
	CU_ASSERT_EQUAL(kvp_pages_alloc(p, 1, out), -ENOSPC);
	kvp_pages_free(p);
}

/* The guard bumps the generation once, on the first cached page to leave the cache, and only
 * while armed. */
static void test_pages_guard_trips_on_uncache(void)
{
	struct kvp_pages *p = new_pages(4);
	volatile uint64_t gen = 7;
	bool armed = true;
	uint32_t a[4];

	CU_ASSERT_FATAL(p != NULL);
	kvp_pages_guard(p, &gen, &armed);
	CU_ASSERT_EQUAL(kvp_pages_alloc(p, 4, a), 0);
	CU_ASSERT_EQUAL(kvp_pages_release(p, &a[3], 1), 0); /* leased -> free: no trip */
	CU_ASSERT_EQUAL(gen, 7);
	CU_ASSERT_EQUAL(kvp_pages_move(p, a[0], KVP_PAGE_LEASED, KVP_PAGE_CACHED), 0);
	CU_ASSERT_EQUAL(kvp_pages_move(p, a[1], KVP_PAGE_LEASED, KVP_PAGE_CACHED), 0);
	CU_ASSERT_EQUAL(gen, 7);
	CU_ASSERT_EQUAL(kvp_pages_release(p, &a[0], 1), 0); /* cached -> free */
	CU_ASSERT_EQUAL(gen, 8);
	CU_ASSERT(!armed);
	CU_ASSERT_EQUAL(kvp_pages_release(p, &a[1], 1), 0); /* disarmed: once per checkpoint */
	CU_ASSERT_EQUAL(gen, 8);
	armed = true;
	CU_ASSERT_EQUAL(kvp_pages_move(p, a[2], KVP_PAGE_LEASED, KVP_PAGE_CACHED), 0);
	CU_ASSERT_EQUAL(kvp_pages_move(p, a[2], KVP_PAGE_CACHED, KVP_PAGE_LEASED), 0);
	CU_ASSERT_EQUAL(gen, 9);
	kvp_pages_free(p);
}

/* Long batches (the fast path works eight at a time) with one bad entry anywhere: an id just
 * past total, one past the power of two above it, a duplicate, a free page or a cached page.
 * Each is refused with nothing changed, and the same batch without it goes through. */
static void test_pages_release_batches_refused_whole(void)
{
	enum { TOTAL = 1000, N = 40 };
	const uint32_t bad_ids[] = { TOTAL, 1023, 1024, 4095, UINT32_MAX - 1, UINT32_MAX };
	struct kvp_pages *p = new_pages(TOTAL);
	uint32_t ids[N + 1], batch[N + 1], cached;

	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	CU_ASSERT_EQUAL_FATAL(kvp_pages_alloc(p, N, ids), 0);
	CU_ASSERT_EQUAL_FATAL(kvp_pages_alloc(p, 1, &cached), 0);
	CU_ASSERT_EQUAL_FATAL(kvp_pages_move(p, cached, KVP_PAGE_LEASED, KVP_PAGE_CACHED), 0);
	for (uint32_t at = 0; at < N; at++) {
		for (size_t b = 0; b < sizeof(bad_ids) / sizeof(bad_ids[0]) + 3; b++) {
			memcpy(batch, ids, sizeof(ids));
			if (b < sizeof(bad_ids) / sizeof(bad_ids[0]))
				batch[at] = bad_ids[b];
			else if (b == sizeof(bad_ids) / sizeof(bad_ids[0]))
				batch[at] = ids[(at + 1) % N]; /* listed twice */
			else if (b == sizeof(bad_ids) / sizeof(bad_ids[0]) + 1)
				batch[at] = 999; /* free */
			else
				batch[N] = ids[at]; /* the last of N + 1 repeats one */
			CU_ASSERT_EQUAL(
				kvp_pages_release(p, batch,
						  b == sizeof(bad_ids) / sizeof(bad_ids[0]) + 2
							  ? N + 1
							  : N),
				-EINVAL);
			CU_ASSERT_EQUAL(kvp_pages_count(p, KVP_PAGE_LEASED), N);
			CU_ASSERT_EQUAL(kvp_pages_count(p, KVP_PAGE_FREE), TOTAL - N - 1);
			CU_ASSERT_EQUAL(kvp_pages_check(p), 0);
		}
		for (uint32_t i = 0; i < N; i++)
			CU_ASSERT_EQUAL(kvp_pages_state(p, ids[i]), KVP_PAGE_LEASED);
	}
	/* a cached page among leased ones takes the general path and is counted */
	memcpy(batch, ids, sizeof(uint32_t) * N);
	batch[N] = cached;
	CU_ASSERT_EQUAL(kvp_pages_release(p, batch, N + 1), 0);
	CU_ASSERT_EQUAL(kvp_pages_count(p, KVP_PAGE_FREE), TOTAL);
	CU_ASSERT_EQUAL(kvp_pages_count(p, KVP_PAGE_CACHED), 0);
	CU_ASSERT_EQUAL(kvp_pages_check(p), 0);
	CU_ASSERT_EQUAL(kvp_pages_release(p, ids, N), -EINVAL); /* all free now */
	kvp_pages_free(p);
}

/* The fast path stops at the first page that is not LEASED and puts back the ones before it: a
 * cached page (or a moving one) at any position of a batch whose length is no multiple of
 * eight, then refused by the general path for a free page at the end, leaves every state as it
 * was; without the free page the batch goes through and is counted. */
static void test_pages_release_stops_at_first_not_leased(void)
{
	enum { TOTAL = 300, N = 43 };
	struct kvp_pages *p = new_pages(TOTAL);
	uint32_t ids[N], other, batch[N + 1];

	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	for (uint32_t at = 0; at < N; at++) {
		enum kvp_page_state s = at % 2 ? KVP_PAGE_MOVING : KVP_PAGE_CACHED;

		CU_ASSERT_EQUAL_FATAL(kvp_pages_alloc(p, N, ids), 0);
		CU_ASSERT_EQUAL_FATAL(kvp_pages_alloc(p, 1, &other), 0);
		CU_ASSERT_EQUAL_FATAL(kvp_pages_release(p, &other, 1), 0); /* free again */
		CU_ASSERT_EQUAL_FATAL(kvp_pages_move(p, ids[at], KVP_PAGE_LEASED, s), 0);
		memcpy(batch, ids, sizeof(ids));
		batch[N] = other;
		CU_ASSERT_EQUAL(kvp_pages_release(p, batch, N + 1), -EINVAL);
		CU_ASSERT_EQUAL(kvp_pages_count(p, KVP_PAGE_LEASED), N - 1);
		CU_ASSERT_EQUAL(kvp_pages_count(p, s), 1);
		CU_ASSERT_EQUAL(kvp_pages_count(p, KVP_PAGE_FREE), TOTAL - N);
		CU_ASSERT_EQUAL(kvp_pages_check(p), 0);
		for (uint32_t i = 0; i < N; i++)
			CU_ASSERT_EQUAL(kvp_pages_state(p, ids[i]),
					i == at ? (int)s : KVP_PAGE_LEASED);
		CU_ASSERT_EQUAL(kvp_pages_state(p, other), KVP_PAGE_FREE);
		CU_ASSERT_EQUAL(kvp_pages_release(p, batch, N), 0);
		CU_ASSERT_EQUAL(kvp_pages_count(p, KVP_PAGE_FREE), TOTAL);
		CU_ASSERT_EQUAL(kvp_pages_check(p), 0);
	}
	kvp_pages_free(p);
}

/* The allocator against a model, in batches long enough for the whole-word and eight-at-a-time
 * loops (up to 400 pages) across several summary levels: alloc hands out the lowest free pages in
 * ascending order; release takes leased, cached and moving pages in ascending or shuffled order,
 * and a batch with one bad entry anywhere (listed twice, free, past total, past the bitmaps) is
 * refused whole; claim and move in between; the states and the books are compared throughout. */
static void test_pages_model_long_batches(void)
{
	enum { N = 5000, MAXB = 400 };
	struct kvp_pages *p = new_pages(N);
	static uint8_t model[N], states[N];
	static uint32_t ids[MAXB + 1];
	unsigned seed = 777;

	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	memset(model, 0, sizeof(model));
	for (int step = 0; step < 4000; step++) {
		int op = rand_r(&seed) % 8;
		uint32_t n = 1 + (uint32_t)rand_r(&seed) % MAXB, k = 0, free = 0;

		for (uint32_t i = 0; i < N; i++)
			free += model[i] == KVP_PAGE_FREE;
		if (op <= 2) { /* alloc: the n lowest free pages */
			int r = kvp_pages_alloc(p, n, ids);

			CU_ASSERT_EQUAL_FATAL(r, n <= free ? 0 : -ENOSPC);
			for (uint32_t i = 0, j = 0; r == 0 && i < N && j < n; i++)
				if (model[i] == KVP_PAGE_FREE) {
					CU_ASSERT_EQUAL_FATAL(ids[j], i);
					model[i] = KVP_PAGE_LEASED;
					j++;
				}
		} else if (op <= 5) { /* release, maybe with one bad entry */
			uint32_t at = (uint32_t)rand_r(&seed) % N;
			int bad = rand_r(&seed) % 4 == 0 ? 1 + rand_r(&seed) % 6 : 0;

			for (uint32_t j = 0; j < N && k < n; j++)
				if (model[(at + j) % N] != KVP_PAGE_FREE &&
				    (op != 5 || model[(at + j) % N] == KVP_PAGE_LEASED))
					ids[k++] = (at + j) % N;
			if (k == 0)
				continue;
			if (rand_r(&seed) % 2) /* sorted, as alloc hands them out */
				for (uint32_t i = 1; i < k; i++)
					for (uint32_t j = i; j > 0 && ids[j - 1] > ids[j]; j--) {
						uint32_t t = ids[j];

						ids[j] = ids[j - 1];
						ids[j - 1] = t;
					}
			else
				for (uint32_t i = k - 1; i > 0; i--) {
					uint32_t j = (uint32_t)rand_r(&seed) % (i + 1), t = ids[i];

					ids[i] = ids[j];
					ids[j] = t;
				}
			if (bad) {
				uint32_t pos = (uint32_t)rand_r(&seed) % (k + 1), v = 0;

				if (bad == 1 && pos < k)
					v = ids[(pos + 1) % k]; /* listed twice */
				else if (bad == 1)
					v = ids[0];
				else if (bad == 2) { /* a free page, if any */
					v = N;
					for (uint32_t i = 0; i < N; i++)
						if (model[(at + i) % N] == KVP_PAGE_FREE) {
							v = (at + i) % N;
							break;
						}
				} else
					v = (const uint32_t[]){ N, 8191, 8192,
								UINT32_MAX }[bad - 3];
				if (pos < k && k > 1)
					ids[pos] = v;
				else
					ids[k++] = v;
				if (k > 1 && ids[0] == ids[1] && bad != 1)
					ids[1] = N; /* keep it one bad entry, still bad */
				CU_ASSERT_EQUAL_FATAL(kvp_pages_release(p, ids, k), -EINVAL);
			} else {
				CU_ASSERT_EQUAL_FATAL(kvp_pages_release(p, ids, k), 0);
				for (uint32_t i = 0; i < k; i++)
					model[ids[i]] = KVP_PAGE_FREE;
			}
		} else if (op == 6) { /* move some leased pages to cached or moving and back */
			for (uint32_t j = 0, at = (uint32_t)rand_r(&seed) % N;
			     j < N && k < n / 4 + 1; j++) {
				uint32_t id = (at + j) % N;
				int to = model[id] == KVP_PAGE_LEASED
						 ? (id % 3 ? KVP_PAGE_CACHED : KVP_PAGE_MOVING)
						 : KVP_PAGE_LEASED;

				if (model[id] == KVP_PAGE_FREE)
					continue;
				CU_ASSERT_EQUAL_FATAL(kvp_pages_move(p, id, model[id], to), 0);
				/* the page is no longer in its old state */
				CU_ASSERT_EQUAL(kvp_pages_move(p, id, model[id], to), -EINVAL);
				model[id] = (uint8_t)to;
				k++;
			}
		} else { /* claim a few free pages, or fail on a leased one */
			for (uint32_t j = 0, at = (uint32_t)rand_r(&seed) % N; j < N && k < 8; j++)
				if (model[(at + j) % N] == KVP_PAGE_FREE)
					ids[k++] = (at + j) % N;
			if (k && step % 2) {
				CU_ASSERT_EQUAL_FATAL(kvp_pages_claim(p, ids, k), 0);
				for (uint32_t i = 0; i < k; i++)
					model[ids[i]] = KVP_PAGE_LEASED;
			} else if (k) {
				ids[k] = ids[0];
				CU_ASSERT_EQUAL_FATAL(kvp_pages_claim(p, ids, k + 1), -EINVAL);
			}
		}
		if (step % 50 == 0) {
			uint32_t c[KVP_PAGE_STATE_MAX] = { 0 };

			CU_ASSERT_EQUAL_FATAL(kvp_pages_check(p), 0);
			kvp_pages_states(p, states);
			CU_ASSERT_EQUAL_FATAL(memcmp(states, model, N), 0);
			for (uint32_t i = 0; i < N; i++)
				c[model[i]]++;
			for (int st = 0; st < KVP_PAGE_STATE_MAX; st++)
				CU_ASSERT_EQUAL_FATAL(kvp_pages_count(p, st), c[st]);
		}
	}
	CU_ASSERT_EQUAL(kvp_pages_check(p), 0);
	kvp_pages_free(p);
}

/* Alloc leaves the summary bits of the words it empties set. A search that finds no free word
 * near lo walks from the top, clears the stale bits it meets and still finds the lowest free
 * page; the next search does not meet them again. */
static void test_pages_stale_summary_bits_skipped(void)
{
	enum { N = 64 * 64 * 3 }; /* 192 words: three levels */
	struct kvp_pages *p = new_pages(N);
	static uint32_t ids[N];
	uint32_t id, far[2] = { 150 * 64 + 7, 190 * 64 + 1 }, near = 5 * 64 + 3;

	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	CU_ASSERT_EQUAL_FATAL(kvp_pages_alloc(p, N, ids), 0); /* every summary bit now stale */
	CU_ASSERT_EQUAL(kvp_pages_check(p), 0);
	CU_ASSERT_EQUAL_FATAL(kvp_pages_release(p, &near, 1), 0); /* lo comes down to word 5 */
	CU_ASSERT_EQUAL_FATAL(kvp_pages_claim(p, &near, 1), 0);	  /* and word 5 is empty again */
	CU_ASSERT_EQUAL_FATAL(kvp_pages_release(p, far, 2), 0);
	CU_ASSERT_EQUAL(kvp_pages_check(p), 0);
	CU_ASSERT_EQUAL(kvp_pages_alloc(p, 1, &id), 0);
	CU_ASSERT_EQUAL(id, far[0]);
	CU_ASSERT_EQUAL(kvp_pages_check(p), 0);
	CU_ASSERT_EQUAL(kvp_pages_alloc(p, 1, &id), 0);
	CU_ASSERT_EQUAL(id, far[1]);
	CU_ASSERT_EQUAL(kvp_pages_alloc(p, 1, &id), -ENOSPC);
	CU_ASSERT_EQUAL_FATAL(kvp_pages_release(p, ids, N), 0);
	CU_ASSERT_EQUAL(kvp_pages_alloc(p, 64, ids), 0); /* a fresh run from page 0 */
	CU_ASSERT_EQUAL(ids[0], 0);
	CU_ASSERT_EQUAL(ids[63], 63);
	CU_ASSERT_EQUAL(kvp_pages_check(p), 0);
	kvp_pages_free(p);
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_pages_alloc_all_then_enospc),
		H_TEST(test_pages_release_rejects_bad_ids_atomically),
		H_TEST(test_pages_random_sequences_keep_invariant),
		H_TEST(test_pages_moving_state_reserved_and_counted),
		H_TEST(test_pages_claim_named_pages),
		H_TEST(test_pages_guard_trips_on_uncache),
		H_TEST(test_pages_release_batches_refused_whole),
		H_TEST(test_pages_release_stops_at_first_not_leased),
		H_TEST(test_pages_model_long_batches),
		H_TEST(test_pages_stale_summary_bits_skipped),
	};
	struct kvp_pages *probe = kvp_pages_new(1);
	int simd = probe && kvp_pages_simd(probe, -1), rc = 0;

	kvp_pages_free(probe);
	if (simd) {
		g_simd = 1;
		rc = H_RUN_SUITE("pages-avx2", NULL, NULL, tests);
	} else
		printf("pages: no AVX2 on this CPU; the generic loops only\n");
	g_simd = 0;
	return H_RUN_SUITE("pages", NULL, NULL, tests) | rc;
}
