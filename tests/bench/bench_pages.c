/* bench_pages.c - page allocator in-process: pages/s of alloc + free batches of 1, 16 and 256
 * pages (kvp_pages_alloc / kvp_pages_release) against the floor of touching the ids: memcpy of
 * the same id arrays in and out. The allocator is half full first, its free pages scattered at
 * random (every page allocated, half of them released in shuffled order): a batch of 256 spans
 * about eight words of the free bitmap. */
#include <errno.h>

#include "bench.h"
#include "pages.h"

#define TOTAL (1u << 20)

static volatile uint32_t g_sink;

int main(int argc, char **argv)
{
	int quick = b_quick(argc, argv);
	const uint32_t batches[] = { 1, 16, 256 };
	double secs = quick ? 0.15 : 1.0;
	/* best of: the first run of a batch size also pays for warming up */
	int reps = quick ? 2 : 3;
	struct kvp_pages *p = kvp_pages_new(TOTAL);
	uint32_t *held = malloc(sizeof(uint32_t) * TOTAL), *ids = malloc(sizeof(uint32_t) * 256);
	uint32_t *src = malloc(sizeof(uint32_t) * 256), *mid = malloc(sizeof(uint32_t) * 256);
	unsigned seed = 12345;

	if (!p || !held || !ids || !src || !mid)
		B_DIE("out of memory");
	/* Fill, shuffle, free half: the free pages are scattered, about half of each word. */
	if (kvp_pages_alloc(p, TOTAL, held) < 0)
		B_DIE("alloc of all pages failed");
	for (uint32_t i = TOTAL - 1; i > 0; i--) {
		uint32_t j = (uint32_t)rand_r(&seed) % (i + 1), t = held[i];

		held[i] = held[j];
		held[j] = t;
	}
	if (kvp_pages_release(p, held, TOTAL / 2) < 0)
		B_DIE("release failed");
	for (uint32_t i = 0; i < 256; i++)
		src[i] = held[TOTAL / 2 + i];

	for (size_t bi = 0; bi < sizeof(batches) / sizeof(batches[0]); bi++) {
		uint32_t b = batches[bi];
		double best_k = 0, best_m = 0;

		for (int r = 0; r < reps; r++) {
			/* kvpool: alloc b, release the same b */
			uint64_t n = 0, t0 = b_now_ns(), t1;
			uint64_t stop = t0 + (uint64_t)(secs * 1e9);

			do {
				for (int k = 0; k < 1024; k++) {
					if (kvp_pages_alloc(p, b, ids) < 0 ||
					    kvp_pages_release(p, ids, b) < 0)
						B_DIE("alloc/release of %u pages failed", b);
				}
				n += 1024;
				t1 = b_now_ns();
			} while (t1 < stop);
			if ((double)n * b / ((double)(t1 - t0) / 1e9) > best_k)
				best_k = (double)n * b / ((double)(t1 - t0) / 1e9);

			/* baseline: copy the ids in and out */
			n = 0;
			t0 = b_now_ns();
			stop = t0 + (uint64_t)(secs * 1e9);
			do {
				for (int k = 0; k < 1024; k++) {
					memcpy(mid, src, sizeof(uint32_t) * b);
					b_use(mid);
					memcpy(ids, mid, sizeof(uint32_t) * b);
					b_use(ids);
					src[0] ^= ids[0] & 1;
				}
				n += 1024;
				t1 = b_now_ns();
			} while (t1 < stop);
			if ((double)n * b / ((double)(t1 - t0) / 1e9) > best_m)
				best_m = (double)n * b / ((double)(t1 - t0) / 1e9);
		}
		g_sink = ids[0];
		if (kvp_pages_check(p) < 0)
			B_DIE("allocator inconsistent after the run");
		b_row_print(&(struct b_row){
			.name = b_fmt("pages.alloc_free.batch%u", b),
			.params = b_fmt("{\"batch_pages\":%u,\"total_pages\":%u,\"free_pages\":%u,"
					"\"seconds\":%.2f,\"best_of\":%d}",
					b, TOTAL, TOTAL / 2, secs, reps),
			.baseline_what = "memcpy of the same id arrays in and out (pages/s)",
			.baseline = best_m,
			.have_base = 1,
			.value = best_k,
			.have_value = 1,
			.unit = "pages/s",
			.target = "none (floor of touching the ids)",
		});
	}
	kvp_pages_free(p);
	free(held);
	free(ids);
	free(src);
	free(mid);
	return 0;
}
