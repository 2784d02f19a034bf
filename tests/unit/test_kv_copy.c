/* test_kv_copy.c - CUnit suite "kv_copy": the CPU page transfer (kernels/kv_copy_cpu.c) against
 * a byte-by-byte reference built only from kvp_dev_offset/kvp_host_offset, over fp8/fp16/fp32
 * rows, page_tokens 1/16/64, layers 1..4, shuffled page lists, with canaries everywhere else.
 */
#include <CUnit/Basic.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kv_copy.h"
#include "suite.h"
#include "rng.h"

#define CANARY 0xA5

struct case_geom {
	uint32_t layers;
	uint32_t page_tokens;
	uint32_t elem; /* dtype bytes: fp8 1, fp16/bf16 2, fp32 4 */
	uint32_t kv_heads;
	uint32_t head_dim;
	uint32_t dev_pages;
	uint32_t host_pages;
};

static const struct case_geom g_cases[] = {
	{ 1, 1, 1, 1, 8, 8, 8 },    /* fp8, one layer, one token per page */
	{ 2, 16, 2, 2, 8, 12, 10 }, /* fp16 */
	{ 3, 64, 4, 1, 4, 5, 7 },   /* fp32, big pages */
	{ 4, 16, 1, 2, 16, 9, 9 },  /* fp8, 4 layers */
	{ 4, 1, 2, 4, 8, 17, 13 },  /* fp16, page_tokens 1 */
	{ 2, 64, 2, 1, 8, 3, 6 },   /* fp16, 64 tokens */
	{ 3, 16, 1, 1, 3, 6, 8 },   /* fp8, odd 3-byte rows */
	{ 1, 64, 4, 3, 5, 4, 4 },   /* fp32, 60-byte rows */
};

static struct h_rng g_rng = { 0x9E3779B97F4A7C15ull };

static struct kvp_copy_geom geom_of(const struct case_geom *c)
{
	struct kvp_copy_geom g = {
		.layers = c->layers,
		.page_tokens = c->page_tokens,
		.row_bytes = (uint64_t)c->elem * c->kv_heads * c->head_dim,
		.dev_slots = (uint64_t)c->dev_pages * c->page_tokens,
		.host_pages = c->host_pages,
	};
	return g;
}

static uint64_t dev_bytes(const struct kvp_copy_geom *g)
{
	return 2ull * g->layers * g->dev_slots * g->row_bytes;
}

/* The reference: one byte at a time, addresses from the two offset helpers only. */
static void ref_copy(const struct kvp_copy_geom *g, int to_host, unsigned char *dev,
		     unsigned char *host, const uint32_t *dev_pages, const uint32_t *host_pages,
		     uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		for (uint32_t l = 0; l < g->layers; l++)
			for (uint32_t kv = 0; kv < 2; kv++)
				for (uint32_t t = 0; t < g->page_tokens; t++) {
					uint64_t slot = (uint64_t)dev_pages[i] * g->page_tokens + t;
					uint64_t d = kvp_dev_offset(g, l, kv, slot);
					uint64_t h = kvp_host_offset(g, host_pages[i], l, kv, t);

					for (uint64_t b = 0; b < g->row_bytes; b++) {
						if (to_host)
							host[h + b] = dev[d + b];
						else
							dev[d + b] = host[h + b];
					}
				}
}

/* One case, one direction, n pages: implementation vs reference on canary-filled targets. */
static void check_case(const struct case_geom *c, int to_host, uint32_t n)
{
	struct kvp_copy_geom g = geom_of(c);
	uint64_t db = dev_bytes(&g), hb = c->host_pages * kvp_host_page_bytes(&g);
	unsigned char *dev = malloc(db), *host = malloc(hb);
	unsigned char *ref_dev = malloc(db), *ref_host = malloc(hb);
	uint32_t *dp = malloc((n ? n : 1) * sizeof(*dp)), *hp = malloc((n ? n : 1) * sizeof(*hp));
	int ret;

	CU_ASSERT_FATAL(dev && host && ref_dev && ref_host && dp && hp);
	CU_ASSERT_FATAL(n <= c->dev_pages && n <= c->host_pages);
	h_pick_ids(&g_rng, dp, n, c->dev_pages);
	h_pick_ids(&g_rng, hp, n, c->host_pages);
	if (to_host) {
		h_fill_random(&g_rng, dev, db);
		memset(host, CANARY, hb);
	} else {
		h_fill_random(&g_rng, host, hb);
		memset(dev, CANARY, db);
	}
	memcpy(ref_dev, dev, db);
	memcpy(ref_host, host, hb);

	if (to_host)
		ret = kvp_copy_dev_to_host_cpu(&g, dev, host, dp, hp, n);
	else
		ret = kvp_copy_host_to_dev_cpu(&g, host, dev, hp, dp, n);
	CU_ASSERT_EQUAL(ret, 0);
	ref_copy(&g, to_host, ref_dev, ref_host, dp, hp, n);
	/* whole buffers: copied bytes right, every other byte still the canary / source intact */
	CU_ASSERT(memcmp(dev, ref_dev, db) == 0);
	CU_ASSERT(memcmp(host, ref_host, hb) == 0);

	free(dev);
	free(host);
	free(ref_dev);
	free(ref_host);
	free(dp);
	free(hp);
}

static uint32_t min_u32(uint32_t a, uint32_t b)
{
	return a < b ? a : b;
}

static void test_kvp_dev_offset_layout(void)
{
	struct kvp_copy_geom g = {
		.layers = 3, .page_tokens = 4, .row_bytes = 10, .dev_slots = 20
	};

	CU_ASSERT_EQUAL(kvp_dev_offset(&g, 0, 0, 0), 0);
	CU_ASSERT_EQUAL(kvp_dev_offset(&g, 0, 0, 7), 70);
	CU_ASSERT_EQUAL(kvp_dev_offset(&g, 0, 1, 0), 200); /* V of layer 0 after K */
	CU_ASSERT_EQUAL(kvp_dev_offset(&g, 1, 0, 0), 400); /* layer 1 after K+V */
	CU_ASSERT_EQUAL(kvp_dev_offset(&g, 2, 1, 19), (5 * 20 + 19) * 10);
	CU_ASSERT_EQUAL(kvp_dev_pages(&g), 5);
}

static void test_kvp_host_offset_layout(void)
{
	struct kvp_copy_geom g = {
		.layers = 3, .page_tokens = 4, .row_bytes = 10, .dev_slots = 20
	};

	CU_ASSERT_EQUAL(kvp_host_page_bytes(&g), 3 * 2 * 4 * 10);
	CU_ASSERT_EQUAL(kvp_host_offset(&g, 0, 0, 0, 0), 0);
	CU_ASSERT_EQUAL(kvp_host_offset(&g, 0, 0, 0, 3), 30);
	CU_ASSERT_EQUAL(kvp_host_offset(&g, 0, 0, 1, 0), 40); /* V after K's 4 tokens */
	CU_ASSERT_EQUAL(kvp_host_offset(&g, 0, 1, 0, 0), 80);
	CU_ASSERT_EQUAL(kvp_host_offset(&g, 2, 0, 0, 0), 2 * 240);
	CU_ASSERT_EQUAL(kvp_host_offset(&g, 2, 2, 1, 3), 2 * 240 + ((2 * 2 + 1) * 4 + 3) * 10);
	/* a host page is contiguous: its last byte is just before the next page */
	CU_ASSERT_EQUAL(kvp_host_offset(&g, 1, 2, 1, 3) + g.row_bytes,
			kvp_host_offset(&g, 2, 0, 0, 0));
}

static void test_kvp_copy_dev_to_host_cpu_geometries(void)
{
	for (size_t i = 0; i < sizeof(g_cases) / sizeof(g_cases[0]); i++) {
		const struct case_geom *c = &g_cases[i];

		check_case(c, 1, 1);
		check_case(c, 1, min_u32(c->dev_pages, c->host_pages) / 2 + 1);
		check_case(c, 1, min_u32(c->dev_pages, c->host_pages));
	}
}

static void test_kvp_copy_host_to_dev_cpu_geometries(void)
{
	for (size_t i = 0; i < sizeof(g_cases) / sizeof(g_cases[0]); i++) {
		const struct case_geom *c = &g_cases[i];

		check_case(c, 0, 1);
		check_case(c, 0, min_u32(c->dev_pages, c->host_pages) / 2 + 1);
		check_case(c, 0, min_u32(c->dev_pages, c->host_pages));
	}
}

/* Every geometry again with non-temporal stores forced on (threshold 0): aligned and unaligned
 * destinations, runs with and without a tail under 64 bytes. */
static void test_kvp_copy_cpu_streamed_geometries(void)
{
	uint64_t prev = kvp_copy_cpu_stream_threshold(0);

	for (size_t i = 0; i < sizeof(g_cases) / sizeof(g_cases[0]); i++) {
		const struct case_geom *c = &g_cases[i];
		uint32_t all = min_u32(c->dev_pages, c->host_pages);

		check_case(c, 1, 1);
		check_case(c, 1, all);
		check_case(c, 0, 1);
		check_case(c, 0, all);
	}
	CU_ASSERT_EQUAL(kvp_copy_cpu_stream_threshold(prev), 0);
}

static void test_kvp_copy_dev_to_host_cpu_n0(void)
{
	struct kvp_copy_geom g = geom_of(&g_cases[1]);
	unsigned char dev[16], host[16];

	memset(dev, 1, sizeof(dev));
	memset(host, CANARY, sizeof(host));
	/* n = 0: nothing read or written, NULL lists allowed */
	CU_ASSERT_EQUAL(kvp_copy_dev_to_host_cpu(&g, dev, host, NULL, NULL, 0), 0);
	CU_ASSERT_EQUAL(kvp_copy_dev_to_host_cpu(&g, NULL, NULL, NULL, NULL, 0), 0);
	for (size_t i = 0; i < sizeof(host); i++)
		CU_ASSERT_EQUAL(host[i], CANARY);
	check_case(&g_cases[2], 1, 0);
}

static void test_kvp_copy_host_to_dev_cpu_n0(void)
{
	struct kvp_copy_geom g = geom_of(&g_cases[1]);
	unsigned char dev[16], host[16];

	memset(host, 1, sizeof(host));
	memset(dev, CANARY, sizeof(dev));
	CU_ASSERT_EQUAL(kvp_copy_host_to_dev_cpu(&g, host, dev, NULL, NULL, 0), 0);
	CU_ASSERT_EQUAL(kvp_copy_host_to_dev_cpu(&g, NULL, NULL, NULL, NULL, 0), 0);
	for (size_t i = 0; i < sizeof(dev); i++)
		CU_ASSERT_EQUAL(dev[i], CANARY);
	check_case(&g_cases[2], 0, 0);
}

static void test_kvp_copy_dev_to_host_cpu_n1(void)
{
	for (size_t i = 0; i < sizeof(g_cases) / sizeof(g_cases[0]); i++)
		for (int rep = 0; rep < 4; rep++)
			check_case(&g_cases[i], 1, 1);
}

static void test_kvp_copy_host_to_dev_cpu_n1(void)
{
	for (size_t i = 0; i < sizeof(g_cases) / sizeof(g_cases[0]); i++)
		for (int rep = 0; rep < 4; rep++)
			check_case(&g_cases[i], 0, 1);
}

/* dev -> host -> fresh dev under the same page mapping gives back the pages, nothing else. */
static void test_kvp_copy_host_to_dev_cpu_round_trip(void)
{
	for (size_t i = 0; i < sizeof(g_cases) / sizeof(g_cases[0]); i++) {
		const struct case_geom *c = &g_cases[i];
		struct kvp_copy_geom g = geom_of(c);
		uint32_t n = min_u32(c->dev_pages, c->host_pages) - 1; /* leave one page out */
		uint64_t db = dev_bytes(&g), hb = c->host_pages * kvp_host_page_bytes(&g);
		uint64_t run = g.page_tokens * g.row_bytes;
		unsigned char *dev = malloc(db), *dev2 = malloc(db), *host = malloc(hb);
		uint32_t *dp = malloc(n * sizeof(*dp)), *hp = malloc(n * sizeof(*hp));
		unsigned char *in_list = calloc(c->dev_pages, 1);

		CU_ASSERT_FATAL(dev && dev2 && host && dp && hp && in_list);
		h_pick_ids(&g_rng, dp, n, c->dev_pages);
		h_pick_ids(&g_rng, hp, n, c->host_pages);
		h_fill_random(&g_rng, dev, db);
		memset(host, CANARY, hb);
		memset(dev2, CANARY, db);

		CU_ASSERT_EQUAL(kvp_copy_dev_to_host_cpu(&g, dev, host, dp, hp, n), 0);
		CU_ASSERT_EQUAL(kvp_copy_host_to_dev_cpu(&g, host, dev2, hp, dp, n), 0);

		for (uint32_t k = 0; k < n; k++)
			in_list[dp[k]] = 1;
		for (uint32_t l = 0; l < g.layers; l++)
			for (uint32_t kv = 0; kv < 2; kv++)
				for (uint32_t p = 0; p < c->dev_pages; p++) {
					uint64_t off = kvp_dev_offset(&g, l, kv,
								      (uint64_t)p * g.page_tokens);

					if (in_list[p]) {
						CU_ASSERT(memcmp(dev2 + off, dev + off, run) == 0);
					} else {
						for (uint64_t b = 0; b < run; b++)
							CU_ASSERT_EQUAL_FATAL(dev2[off + b],
									      CANARY);
					}
				}
		free(dev);
		free(dev2);
		free(host);
		free(dp);
		free(hp);
		free(in_list);
	}
}

static void test_kvp_copy_geom_check_bad(void)
{
	const struct kvp_copy_geom ok = {
		.layers = 2, .page_tokens = 16, .row_bytes = 256, .dev_slots = 64
	};
	struct kvp_copy_geom g;

	CU_ASSERT_EQUAL(kvp_copy_geom_check(&ok), 0);
	CU_ASSERT_EQUAL(kvp_copy_geom_check(NULL), -EINVAL);
	g = ok, g.layers = 0;
	CU_ASSERT_EQUAL(kvp_copy_geom_check(&g), -EINVAL);
	g = ok, g.page_tokens = 0;
	CU_ASSERT_EQUAL(kvp_copy_geom_check(&g), -EINVAL);
	g = ok, g.row_bytes = 0;
	CU_ASSERT_EQUAL(kvp_copy_geom_check(&g), -EINVAL);
	g = ok, g.dev_slots = 0;
	CU_ASSERT_EQUAL(kvp_copy_geom_check(&g), -EINVAL);
	g = ok, g.dev_slots = 65; /* not a whole number of pages */
	CU_ASSERT_EQUAL(kvp_copy_geom_check(&g), -EINVAL);
	g = ok, g.row_bytes = UINT64_MAX / 8; /* device tier size overflows */
	CU_ASSERT_EQUAL(kvp_copy_geom_check(&g), -EINVAL);
	g = ok, g.dev_slots = UINT64_MAX / 16 * 16;
	CU_ASSERT_EQUAL(kvp_copy_geom_check(&g), -EINVAL);
	/* host page of 8 GiB: offset of page 2^32 - 1 overflows */
	g = ok, g.dev_slots = 16, g.row_bytes = 1ull << 27, g.layers = 2;
	CU_ASSERT_EQUAL(kvp_copy_geom_check(&g), -EINVAL);
	g = ok, g.dev_slots = 16, g.row_bytes = 1ull << 20, g.layers = 64; /* 2 GiB page: fine */
	CU_ASSERT_EQUAL(kvp_copy_geom_check(&g), 0);
	g = ok, g.page_tokens = UINT32_MAX, g.row_bytes = UINT64_MAX / 2, g.dev_slots = UINT32_MAX;
	CU_ASSERT_EQUAL(kvp_copy_geom_check(&g), -EINVAL);
}

/* Bad geometry or arguments: -EINVAL, a page id out of range: -ERANGE, and not one byte
 * written. */
static void check_rejected(int to_host)
{
	const struct kvp_copy_geom ok = {
		.layers = 2, .page_tokens = 4, .row_bytes = 8, .dev_slots = 16, .host_pages = 4
	};
	unsigned char dev[2 * 2 * 16 * 8], host[4 * 2 * 2 * 4 * 8];
	unsigned char dev0[sizeof(dev)], host0[sizeof(host)];
	uint32_t dp[3] = { 0, 3, 1 }, hp[3] = { 2, 0, 3 }, bad_dp[3] = { 0, 1, 4 },
		 bad_hp[3] = { 2, 0, 4 };
	struct kvp_copy_geom g;
	int (*d2h)(const struct kvp_copy_geom *, const void *, void *, const uint32_t *,
		   const uint32_t *, uint32_t) = kvp_copy_dev_to_host_cpu;
	int (*h2d)(const struct kvp_copy_geom *, const void *, void *, const uint32_t *,
		   const uint32_t *, uint32_t) = kvp_copy_host_to_dev_cpu;
#define RUN(geom, d, h, dl, hl, n)                                                                 \
	(to_host ? d2h((geom), (d), (h), (dl), (hl), (n)) : h2d((geom), (h), (d), (hl), (dl), (n)))

	h_fill_random(&g_rng, dev, sizeof(dev));
	h_fill_random(&g_rng, host, sizeof(host));
	memcpy(dev0, dev, sizeof(dev));
	memcpy(host0, host, sizeof(host));

	CU_ASSERT_EQUAL(RUN(NULL, dev, host, dp, hp, 3), -EINVAL);
	g = ok, g.layers = 0;
	CU_ASSERT_EQUAL(RUN(&g, dev, host, dp, hp, 3), -EINVAL);
	g = ok, g.page_tokens = 0;
	CU_ASSERT_EQUAL(RUN(&g, dev, host, dp, hp, 3), -EINVAL);
	g = ok, g.row_bytes = 0;
	CU_ASSERT_EQUAL(RUN(&g, dev, host, dp, hp, 3), -EINVAL);
	g = ok, g.dev_slots = 0;
	CU_ASSERT_EQUAL(RUN(&g, dev, host, dp, hp, 3), -EINVAL);
	g = ok, g.dev_slots = 15;
	CU_ASSERT_EQUAL(RUN(&g, dev, host, dp, hp, 3), -EINVAL);
	g = ok, g.row_bytes = UINT64_MAX / 4;
	CU_ASSERT_EQUAL(RUN(&g, dev, host, dp, hp, 3), -EINVAL);
	/* bad geometry with n = 0 is still bad */
	g = ok, g.layers = 0;
	CU_ASSERT_EQUAL(RUN(&g, dev, host, dp, hp, 0), -EINVAL);
	/* device page 4 of 4, host page 4 of 4: checked before the first page is copied */
	CU_ASSERT_EQUAL(RUN(&ok, dev, host, bad_dp, hp, 3), -ERANGE);
	CU_ASSERT_EQUAL(RUN(&ok, dev, host, dp, bad_hp, 3), -ERANGE);
	g = ok, g.host_pages = 0; /* no host tier: no host page id is valid */
	CU_ASSERT_EQUAL(RUN(&g, dev, host, dp, hp, 3), -ERANGE);
	CU_ASSERT_EQUAL(RUN(&g, dev, host, dp, hp, 0), 0);
	CU_ASSERT_EQUAL(RUN(&ok, NULL, host, dp, hp, 3), -EINVAL);
	CU_ASSERT_EQUAL(RUN(&ok, dev, NULL, dp, hp, 3), -EINVAL);
	CU_ASSERT_EQUAL(RUN(&ok, dev, host, NULL, hp, 3), -EINVAL);
	CU_ASSERT_EQUAL(RUN(&ok, dev, host, dp, NULL, 3), -EINVAL);
	CU_ASSERT(memcmp(dev, dev0, sizeof(dev)) == 0);
	CU_ASSERT(memcmp(host, host0, sizeof(host)) == 0);
	/* and the same arguments, corrected, do copy */
	CU_ASSERT_EQUAL(RUN(&ok, dev, host, dp, hp, 3), 0);
	CU_ASSERT(to_host ? memcmp(host, host0, sizeof(host)) != 0
			  : memcmp(dev, dev0, sizeof(dev)) != 0);
#undef RUN
}

/* kvp_copy_batch_check, the one check both kernels run: every id of the batch, either side,
 * against the geometry's counts, including the last entry and ids far past the end. */
static void test_kvp_copy_batch_check_bounds(void)
{
	const struct kvp_copy_geom g = {
		.layers = 2, .page_tokens = 4, .row_bytes = 8, .dev_slots = 12, .host_pages = 5
	};
	uint32_t dp[4] = { 0, 1, 2, 1 }, hp[4] = { 4, 0, 3, 2 };
	unsigned char d, h;

	CU_ASSERT_EQUAL(kvp_copy_batch_check(&g, &d, &h, dp, hp, 4), 0);
	CU_ASSERT_EQUAL(kvp_copy_batch_check(&g, NULL, NULL, NULL, NULL, 0), 0);
	hp[3] = 5;
	CU_ASSERT_EQUAL(kvp_copy_batch_check(&g, &d, &h, dp, hp, 4), -ERANGE);
	CU_ASSERT_EQUAL(kvp_copy_batch_check(&g, &d, &h, dp, hp, 3), 0); /* only n entries */
	hp[3] = UINT32_MAX;
	CU_ASSERT_EQUAL(kvp_copy_batch_check(&g, &d, &h, dp, hp, 4), -ERANGE);
	hp[3] = 2, dp[3] = 3;
	CU_ASSERT_EQUAL(kvp_copy_batch_check(&g, &d, &h, dp, hp, 4), -ERANGE);
	dp[3] = 1;
	CU_ASSERT_EQUAL(kvp_copy_batch_check(&g, &d, NULL, dp, hp, 4), -EINVAL);
	CU_ASSERT_EQUAL(kvp_copy_batch_check(NULL, &d, &h, dp, hp, 4), -EINVAL);
}

/* A host page id past the host tier is refused by the copy itself: before, the CPU kernel wrote
 * (or read) beyond the host tier. The buffer here is exactly the host tier plus a guard that
 * must stay untouched. */
static void test_kvp_copy_dev_to_host_cpu_host_page_out_of_range(void)
{
	const struct kvp_copy_geom g = {
		.layers = 1, .page_tokens = 2, .row_bytes = 4, .dev_slots = 4, .host_pages = 2
	};
	uint64_t pb = kvp_host_page_bytes(&g);
	unsigned char dev[2 * 4 * 4], host[3 * 16], host0[sizeof(host)];
	uint32_t dp[1] = { 1 }, hp[1] = { 2 };

	CU_ASSERT_EQUAL_FATAL(pb, 16);
	h_fill_random(&g_rng, dev, sizeof(dev));
	memset(host, CANARY, sizeof(host));
	memcpy(host0, host, sizeof(host));
	CU_ASSERT_EQUAL(kvp_copy_dev_to_host_cpu(&g, dev, host, dp, hp, 1), -ERANGE);
	CU_ASSERT_EQUAL(kvp_copy_host_to_dev_cpu(&g, host, dev, hp, dp, 1), -ERANGE);
	CU_ASSERT(memcmp(host, host0, sizeof(host)) == 0);
	hp[0] = 1;
	CU_ASSERT_EQUAL(kvp_copy_dev_to_host_cpu(&g, dev, host, dp, hp, 1), 0);
	CU_ASSERT(memcmp(host + 2 * pb, host0 + 2 * pb, pb) == 0);
}

static void test_kvp_copy_dev_to_host_cpu_bad_geometry(void)
{
	check_rejected(1);
}

static void test_kvp_copy_host_to_dev_cpu_bad_geometry(void)
{
	check_rejected(0);
}

/* Runs of odd sizes and odd offsets (unaligned destinations too), shuffled over a buffer, streamed
 * and not: every run's bytes land, nothing between the runs changes. batch: 0 copies them with
 * kvp_copy_runs_cpu, else as a part of a batch of that many bytes (kvp_copy_runs_cpu_part). */
static void check_runs(uint64_t threshold, uint64_t batch)
{
	enum { NR = 40, RUN = 200, SPAN = NR * (RUN + 8) };
	static unsigned char src[SPAN], dst[SPAN], want[SPAN];
	uint64_t d[NR], s[NR], n[NR], prev;
	uint32_t order[NR];

	h_fill_random(&g_rng, src, sizeof(src));
	memset(dst, CANARY, sizeof(dst));
	memcpy(want, dst, sizeof(want));
	h_pick_ids(&g_rng, order, NR, NR);
	for (uint32_t i = 0; i < NR; i++) {
		uint64_t off = (uint64_t)order[i] * (RUN + 8) + i % 7;

		n[i] = 1 + h_rng_next(&g_rng) % RUN;
		s[i] = (uintptr_t)(src + (uint64_t)i * (RUN + 8));
		d[i] = (uintptr_t)(dst + off);
		memcpy(want + off, (void *)(uintptr_t)s[i], n[i]);
	}
	prev = kvp_copy_cpu_stream_threshold(threshold);
	if (batch) {
		CU_ASSERT_EQUAL(kvp_copy_runs_cpu_part(d, s, n, NR, batch), 0);
	} else {
		CU_ASSERT_EQUAL(kvp_copy_runs_cpu(d, s, n, NR), 0);
	}
	kvp_copy_cpu_stream_threshold(prev);
	CU_ASSERT(memcmp(dst, want, sizeof(dst)) == 0);
}

static void test_kvp_copy_runs_cpu_plain(void)
{
	check_runs(UINT64_MAX, 0);
}

static void test_kvp_copy_runs_cpu_streamed(void)
{
	check_runs(0, 0);
}

/* A part streams when its batch reaches the threshold (its own bytes are below it), and not when
 * the batch is below it: the same bytes land either way. */
static void test_kvp_copy_runs_cpu_part(void)
{
	check_runs(1u << 20, 4u << 20);
	check_runs(1u << 20, 1000);
}

static void test_kvp_copy_runs_cpu_bad(void)
{
	uint64_t a = 1;

	CU_ASSERT_EQUAL(kvp_copy_runs_cpu(NULL, NULL, NULL, 0), 0);
	CU_ASSERT_EQUAL(kvp_copy_runs_cpu(NULL, &a, &a, 1), -EINVAL);
	CU_ASSERT_EQUAL(kvp_copy_runs_cpu(&a, NULL, &a, 1), -EINVAL);
	CU_ASSERT_EQUAL(kvp_copy_runs_cpu(&a, &a, NULL, 1), -EINVAL);
	CU_ASSERT_EQUAL(kvp_copy_runs_cpu_part(NULL, NULL, NULL, 0, 1), 0);
	CU_ASSERT_EQUAL(kvp_copy_runs_cpu_part(&a, NULL, &a, 1, 1), -EINVAL);
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_kvp_dev_offset_layout),
		H_TEST(test_kvp_host_offset_layout),
		H_TEST(test_kvp_copy_geom_check_bad),
		H_TEST(test_kvp_copy_dev_to_host_cpu_geometries),
		H_TEST(test_kvp_copy_host_to_dev_cpu_geometries),
		H_TEST(test_kvp_copy_cpu_streamed_geometries),
		H_TEST(test_kvp_copy_dev_to_host_cpu_n0),
		H_TEST(test_kvp_copy_host_to_dev_cpu_n0),
		H_TEST(test_kvp_copy_dev_to_host_cpu_n1),
		H_TEST(test_kvp_copy_host_to_dev_cpu_n1),
		H_TEST(test_kvp_copy_host_to_dev_cpu_round_trip),
		H_TEST(test_kvp_copy_batch_check_bounds),
		H_TEST(test_kvp_copy_dev_to_host_cpu_host_page_out_of_range),
		H_TEST(test_kvp_copy_dev_to_host_cpu_bad_geometry),
		H_TEST(test_kvp_copy_host_to_dev_cpu_bad_geometry),
		H_TEST(test_kvp_copy_runs_cpu_plain),
		H_TEST(test_kvp_copy_runs_cpu_streamed),
		H_TEST(test_kvp_copy_runs_cpu_part),
		H_TEST(test_kvp_copy_runs_cpu_bad),
	};

	return H_RUN_SUITE("kv_copy", NULL, NULL, tests);
}
