/* test_ring.c - the reserve region's rings (proto/kvp_ring.h): layout, put/take with wrap,
 * full and empty rings, corrupt indices refused by kvpoold's side, and a consumer racing the
 * take-back of a producer thread: every id is taken by exactly one side. */
#include <CUnit/Basic.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kvp_ring.h"
#include "suite.h"

#define SLOTS 64u

static void *region(void)
{
	void *p = aligned_alloc(64, kvp_resv_bytes(SLOTS));

	CU_ASSERT_FATAL(p != NULL);
	memset(p, 0, kvp_resv_bytes(SLOTS));
	return p;
}

static void test_ring_layout_lines_apart(void)
{
	void *base = region();
	struct kvp_ring f, r, f1;

	CU_ASSERT_EQUAL(kvp_ring_at(base, kvp_resv_bytes(SLOTS), SLOTS, 0, KVP_RING_FILL, &f), 0);
	CU_ASSERT_EQUAL(kvp_ring_at(base, kvp_resv_bytes(SLOTS), SLOTS, 0, KVP_RING_RETURN, &r), 0);
	CU_ASSERT_EQUAL(kvp_ring_at(base, kvp_resv_bytes(SLOTS), SLOTS, 1, KVP_RING_FILL, &f1), 0);
	/* head and tail on their own cache lines, past the header */
	CU_ASSERT_EQUAL((char *)f.head - (char *)base, 64);
	CU_ASSERT_EQUAL((char *)f.tail - (char *)f.head, 64);
	CU_ASSERT((char *)r.head >= (char *)(f.slot + SLOTS));
	CU_ASSERT((char *)f1.head >= (char *)(r.slot + SLOTS));
	CU_ASSERT(((uintptr_t)r.head & 63) == 0 && ((uintptr_t)f1.head & 63) == 0);
	CU_ASSERT((char *)(f1.slot + SLOTS) <= (char *)base + kvp_resv_bytes(SLOTS));
	/* bad sizes and tiers */
	CU_ASSERT_EQUAL(kvp_ring_at(base, kvp_resv_bytes(SLOTS) - 1, SLOTS, 0, KVP_RING_FILL, &f),
			-1);
	CU_ASSERT_EQUAL(kvp_ring_at(base, kvp_resv_bytes(SLOTS), 48, 0, KVP_RING_FILL, &f), -1);
	CU_ASSERT_EQUAL(kvp_ring_at(base, kvp_resv_bytes(SLOTS), SLOTS, 2, KVP_RING_FILL, &f), -1);
	CU_ASSERT_FALSE(kvp_resv_slots_ok(32));
	CU_ASSERT_TRUE(kvp_resv_slots_ok(KVP_RESV_MAX_SLOTS));
	free(base);
}

static void test_ring_put_take_wrap_full_empty(void)
{
	void *base = region();
	struct kvp_ring f, r;
	uint32_t tail = 0, seen = 0, rhead = 0, ids[SLOTS], out[SLOTS * 2];

	kvp_ring_at(base, kvp_resv_bytes(SLOTS), SLOTS, 1, KVP_RING_FILL, &f);
	kvp_ring_at(base, kvp_resv_bytes(SLOTS), SLOTS, 1, KVP_RING_RETURN, &r);
	for (uint32_t round = 0; round < 10; round++) {
		/* producer (kvpoold) fills 40, the client takes 3 x 13, one is left */
		for (uint32_t i = 0; i < 40; i++)
			ids[i] = round * 1000 + i;
		CU_ASSERT(kvp_ring_room(&f, tail, seen) >= 40);
		kvp_ring_produce(&f, &tail, ids, 40);
		CU_ASSERT_EQUAL(kvp_ring_count(&f), 40);
		for (uint32_t k = 0; k < 3; k++) {
			CU_ASSERT_EQUAL(kvp_ring_take(&f, 13, out), 13);
			for (uint32_t i = 0; i < 13; i++)
				CU_ASSERT_EQUAL(out[i], round * 1000 + k * 13 + i);
		}
		CU_ASSERT_EQUAL(kvp_ring_take(&f, 2, out), 0); /* one left: all or nothing */
		CU_ASSERT_EQUAL(kvp_ring_take(&f, 1, out), 1);
		CU_ASSERT_EQUAL(kvp_ring_count(&f), 0);
		CU_ASSERT_EQUAL(kvp_ring_head_seen(&f, seen, tail, &seen), 0);
		CU_ASSERT_EQUAL(seen, tail);
	}
	{
		uint32_t rt = 0;

		for (uint32_t i = 0; i < SLOTS; i++)
			ids[i] = 7 + i;
		CU_ASSERT_EQUAL(kvp_ring_put(&r, &rt, ids, SLOTS - 4), SLOTS - 4);
		CU_ASSERT_EQUAL(kvp_ring_put(&r, &rt, ids, 5), 0); /* no room for all */
		CU_ASSERT_EQUAL(kvp_ring_put(&r, &rt, ids, 4), 4);
		CU_ASSERT_EQUAL(kvp_ring_peek(&r, rhead, out), SLOTS);
		CU_ASSERT_EQUAL(out[SLOTS - 1], 7 + 3);
		kvp_ring_consumed(&r, &rhead, SLOTS);
		CU_ASSERT_EQUAL(kvp_ring_count(&r), 0);
		CU_ASSERT_EQUAL(kvp_ring_put(&r, &rt, ids, SLOTS), SLOTS); /* wraps */
		CU_ASSERT_EQUAL(kvp_ring_peek(&r, rhead, out), SLOTS);
		CU_ASSERT_EQUAL(out[0], 7);
	}
	free(base);
}

static void test_ring_corrupt_indices_refused(void)
{
	void *base = region();
	struct kvp_ring f, r;
	uint32_t tail = 0, seen = 0, ids[8] = { 1, 2, 3, 4, 5, 6, 7, 8 }, h, out[SLOTS];

	kvp_ring_at(base, kvp_resv_bytes(SLOTS), SLOTS, 0, KVP_RING_FILL, &f);
	kvp_ring_at(base, kvp_resv_bytes(SLOTS), SLOTS, 0, KVP_RING_RETURN, &r);
	kvp_ring_produce(&f, &tail, ids, 8);
	CU_ASSERT_EQUAL(kvp_ring_take(&f, 3, out), 3);
	CU_ASSERT_EQUAL(kvp_ring_head_seen(&f, seen, tail, &h), 0);
	CU_ASSERT_EQUAL(h, 3);
	seen = h;
	/* a head behind what kvpoold saw, or past its tail */
	atomic_store(f.head, 2);
	CU_ASSERT_EQUAL(kvp_ring_head_seen(&f, seen, tail, &h), -1);
	CU_ASSERT_EQUAL(kvp_ring_take_back(&f, seen, tail, &h), -1);
	atomic_store(f.head, 9);
	CU_ASSERT_EQUAL(kvp_ring_head_seen(&f, seen, tail, &h), -1);
	atomic_store(f.head, 0x80000000u);
	CU_ASSERT_EQUAL(kvp_ring_head_seen(&f, seen, tail, &h), -1);
	/* the client sees nonsense indices as an empty ring */
	CU_ASSERT_EQUAL(kvp_ring_count(&f), 0);
	CU_ASSERT_EQUAL(kvp_ring_take(&f, 1, out), 0);
	atomic_store(f.head, 5);
	CU_ASSERT_EQUAL(kvp_ring_take_back(&f, seen, tail, &h), 0);
	CU_ASSERT_EQUAL(h, 5);
	CU_ASSERT_EQUAL(atomic_load(f.head), tail);
	/* a return ring whose tail claims more than it holds */
	atomic_store(r.tail, SLOTS + 1);
	CU_ASSERT_EQUAL(kvp_ring_peek(&r, 0, out), -1);
	atomic_store(r.tail, UINT32_MAX);
	CU_ASSERT_EQUAL(kvp_ring_peek(&r, 0, out), -1);
	atomic_store(r.tail, SLOTS);
	CU_ASSERT_EQUAL(kvp_ring_peek(&r, 0, out), SLOTS);
	free(base);
}

/* A consumer thread takes while the producer refills and takes back: each id is taken once. */
#define RACE_IDS 400000u

struct race {
	struct kvp_ring f;
	_Atomic int stop;
	uint8_t *owner; /* 1: consumer, 2: take-back */
	uint64_t taken;
};

static void *consumer(void *arg)
{
	struct race *x = arg;
	uint32_t out[4];
	unsigned seed = 5;

	while (!atomic_load(&x->stop)) {
		uint32_t n = 1 + (uint32_t)rand_r(&seed) % 4;

		if (kvp_ring_take(&x->f, n, out) != n)
			continue;
		for (uint32_t i = 0; i < n; i++) {
			if (x->owner[out[i]])
				x->owner[out[i]] = 9; /* a second owner */
			else
				x->owner[out[i]] = 1;
		}
		x->taken += n;
	}
	return NULL;
}

static void test_ring_take_back_races_consumer(void)
{
	void *base = region();
	struct race x = { .owner = calloc(RACE_IDS, 1) };
	uint32_t tail = 0, seen = 0, next = 0, back = 0, *shadow = calloc(SLOTS, 4);
	pthread_t th;

	CU_ASSERT_FATAL(x.owner && shadow);
	kvp_ring_at(base, kvp_resv_bytes(SLOTS), SLOTS, 0, KVP_RING_FILL, &x.f);
	CU_ASSERT_FATAL(pthread_create(&th, NULL, consumer, &x) == 0);
	while (next < RACE_IDS) {
		uint32_t h = 0, room, ids[SLOTS];

		CU_ASSERT_EQUAL_FATAL(kvp_ring_head_seen(&x.f, seen, tail, &h), 0);
		seen = h;
		room = kvp_ring_room(&x.f, tail, seen);
		if (room > RACE_IDS - next)
			room = RACE_IDS - next;
		for (uint32_t i = 0; i < room; i++) {
			ids[i] = next++;
			shadow[(tail + i) & (SLOTS - 1)] = ids[i];
		}
		kvp_ring_produce(&x.f, &tail, ids, room);
		if (next % 7 == 0) { /* pressure: take back what waits */
			uint32_t from = 0;

			CU_ASSERT_EQUAL_FATAL(kvp_ring_take_back(&x.f, seen, tail, &from), 0);
			for (uint32_t k = from; k != tail; k++) {
				uint32_t id = shadow[k & (SLOTS - 1)];

				if (x.owner[id])
					x.owner[id] = 9;
				else
					x.owner[id] = 2;
				back++;
			}
			seen = tail;
		}
	}
	/* wait for the consumer to empty the ring, then stop it */
	while (kvp_ring_count(&x.f))
		;
	atomic_store(&x.stop, 1);
	pthread_join(th, NULL);
	{
		uint64_t ones = 0, twos = 0, bad = 0;

		for (uint32_t i = 0; i < RACE_IDS; i++) {
			ones += x.owner[i] == 1;
			twos += x.owner[i] == 2;
			bad += x.owner[i] == 9 || x.owner[i] == 0;
		}
		CU_ASSERT_EQUAL(bad, 0);
		CU_ASSERT_EQUAL(ones, x.taken);
		CU_ASSERT_EQUAL(twos, back);
		CU_ASSERT(x.taken > 0);
		CU_ASSERT(back > 0);
	}
	free(x.owner);
	free(shadow);
	free(base);
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_ring_layout_lines_apart),
		H_TEST(test_ring_put_take_wrap_full_empty),
		H_TEST(test_ring_corrupt_indices_refused),
		H_TEST(test_ring_take_back_races_consumer),
	};

	return H_RUN_SUITE("ring", NULL, NULL, tests);
}
