/* test_kv_copy_cuda.c - CUnit suite "kv_copy_cuda": the CUDA page transfer (kernels/kv_copy.cu)
 * against the CPU reference (kernels/kv_copy_cpu.c) on the same pages, both directions, with
 * canaries, odd row sizes and misaligned bases (vector width fallback), batches larger than the
 * initial staging buffer, and several batches queued without a sync while the caller rewrites its
 * page lists; kvp_copy_runs_cuda's lists of runs. Exits 77 (skipped) when there is no CUDA driver
 * or GPU.
 */
#include <CUnit/Basic.h>
#include <cuda_runtime_api.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_copy.h"
#include "kv_copy_cuda.h"
#include "rng.h"
#include "suite.h"

#define CANARY 0x5A
#define PAD 64 /* bytes around each buffer, for misaligned bases and overrun checks */

static struct kvp_copy_cuda *g_ctx;
static struct h_rng g_rng = { 0x243F6A8885A308D3ull };

#define CK(call) CU_ASSERT_FATAL((call) == cudaSuccess)

/* A device tier (cudaMalloc) and a mapped host tier, each with PAD bytes either side, plus
 * CPU shadows of both. */
struct tiers {
	struct kvp_copy_geom g;
	uint64_t dev_bytes, host_bytes;
	unsigned char *dev;	  /* device memory, PAD + dev_bytes + PAD */
	unsigned char *host;	  /* registered host memory, same shape */
	unsigned char *host_dptr; /* its device alias */
	unsigned char *sh_dev;	  /* CPU shadows */
	unsigned char *sh_host;
};

static void tiers_init(struct tiers *t, uint32_t layers, uint32_t page_tokens, uint64_t row,
		       uint32_t dev_pages, uint32_t host_pages)
{
	memset(t, 0, sizeof(*t));
	t->g.layers = layers;
	t->g.page_tokens = page_tokens;
	t->g.row_bytes = row;
	t->g.dev_slots = (uint64_t)dev_pages * page_tokens;
	t->g.host_pages = host_pages;
	CU_ASSERT_FATAL(kvp_copy_geom_check(&t->g) == 0);
	t->dev_bytes = 2ull * layers * t->g.dev_slots * row;
	t->host_bytes = host_pages * kvp_host_page_bytes(&t->g);

	CK(cudaMalloc((void **)&t->dev, t->dev_bytes + 2 * PAD));
	t->host = aligned_alloc(4096, (t->host_bytes + 2 * PAD + 4095) / 4096 * 4096);
	CU_ASSERT_FATAL(t->host != NULL);
	CK(cudaHostRegister(t->host, t->host_bytes + 2 * PAD, cudaHostRegisterMapped));
	CK(cudaHostGetDevicePointer((void **)&t->host_dptr, t->host, 0));
	t->sh_dev = malloc(t->dev_bytes + 2 * PAD);
	t->sh_host = malloc(t->host_bytes + 2 * PAD);
	CU_ASSERT_FATAL(t->sh_dev && t->sh_host);
}

static void tiers_free(struct tiers *t)
{
	cudaHostUnregister(t->host);
	free(t->host);
	cudaFree(t->dev);
	free(t->sh_dev);
	free(t->sh_host);
}

/* Random source, canary destination; the shadows get the same. */
static void tiers_fill(struct tiers *t, int to_host)
{
	if (to_host) {
		h_fill_random(&g_rng, t->sh_dev, t->dev_bytes + 2 * PAD);
		memset(t->sh_host, CANARY, t->host_bytes + 2 * PAD);
	} else {
		memset(t->sh_dev, CANARY, t->dev_bytes + 2 * PAD);
		h_fill_random(&g_rng, t->sh_host, t->host_bytes + 2 * PAD);
	}
	CK(cudaMemcpy(t->dev, t->sh_dev, t->dev_bytes + 2 * PAD, cudaMemcpyHostToDevice));
	memcpy(t->host, t->sh_host, t->host_bytes + 2 * PAD);
}

/* Both tiers, PAD included, equal their shadows. */
static void tiers_compare(struct tiers *t)
{
	unsigned char *dev = malloc(t->dev_bytes + 2 * PAD);

	CU_ASSERT_FATAL(dev != NULL);
	CK(cudaMemcpy(dev, t->dev, t->dev_bytes + 2 * PAD, cudaMemcpyDeviceToHost));
	CU_ASSERT(memcmp(dev, t->sh_dev, t->dev_bytes + 2 * PAD) == 0);
	CU_ASSERT(memcmp(t->host, t->sh_host, t->host_bytes + 2 * PAD) == 0);
	free(dev);
}

/* One batch at base offsets (dev_off, host_off) into the padded buffers, CUDA vs CPU. */
static void run_batch(struct tiers *t, int to_host, uint32_t n, unsigned dev_off, unsigned host_off)
{
	uint32_t dev_pages = (uint32_t)kvp_dev_pages(&t->g);
	uint32_t host_pages = (uint32_t)(t->host_bytes / kvp_host_page_bytes(&t->g));
	uint32_t *dp = malloc((n + 1) * sizeof(*dp)), *hp = malloc((n + 1) * sizeof(*hp));
	int ret;

	CU_ASSERT_FATAL(dp && hp && dev_off < PAD && host_off < PAD);
	h_pick_ids(&g_rng, dp, n, dev_pages);
	h_pick_ids(&g_rng, hp, n, host_pages);
	tiers_fill(t, to_host);

	if (to_host) {
		ret = kvp_copy_dev_to_host_cuda(g_ctx, &t->g, t->dev + PAD + dev_off,
						t->host_dptr + PAD + host_off, dp, hp, n);
		CU_ASSERT_EQUAL(kvp_copy_dev_to_host_cpu(&t->g, t->sh_dev + PAD + dev_off,
							 t->sh_host + PAD + host_off, dp, hp, n),
				0);
	} else {
		ret = kvp_copy_host_to_dev_cuda(g_ctx, &t->g, t->host_dptr + PAD + host_off,
						t->dev + PAD + dev_off, hp, dp, n);
		CU_ASSERT_EQUAL(kvp_copy_host_to_dev_cpu(&t->g, t->sh_host + PAD + host_off,
							 t->sh_dev + PAD + dev_off, hp, dp, n),
				0);
	}
	CU_ASSERT_EQUAL(ret, 0);
	/* the caller may scribble on its lists right after the call returns */
	memset(dp, 0xff, n * sizeof(*dp));
	memset(hp, 0xff, n * sizeof(*hp));
	CU_ASSERT_EQUAL(kvp_copy_cuda_sync(g_ctx), 0);
	if (ret || kvp_copy_cuda_error(g_ctx)[0])
		fprintf(stderr, "\n  CUDA error: %s\n", kvp_copy_cuda_error(g_ctx));
	tiers_compare(t);
	free(dp);
	free(hp);
}

struct case_geom {
	uint32_t layers, page_tokens;
	uint64_t row;
	uint32_t dev_pages, host_pages;
};

static const struct case_geom g_cases[] = {
	{ 1, 1, 16, 8, 8 },	  /* fp8 2x8 */
	{ 2, 16, 256, 12, 10 },	  /* fp16 2 heads x 64 */
	{ 3, 64, 64, 5, 7 },	  /* fp32 2x8 */
	{ 4, 16, 1024, 9, 9 },	  /* fp8 8x128 */
	{ 4, 1, 2048, 17, 13 },	  /* fp16 8x128, one token pages */
	{ 2, 64, 4096, 3, 6 },	  /* fp32 8x128 */
	{ 3, 16, 3, 6, 8 },	  /* fp8 1x3: byte path */
	{ 2, 16, 6, 6, 8 },	  /* fp16 1x3: 2-byte path */
	{ 1, 64, 60, 4, 4 },	  /* fp32 3x5: 4-byte path */
	{ 2, 8, 24, 5, 5 },	  /* fp8 3x8: 8-byte path */
	{ 32, 16, 2048, 40, 64 }, /* a real model's shape: 2 MiB pages */
};

static void each_case(int to_host)
{
	for (size_t i = 0; i < sizeof(g_cases) / sizeof(g_cases[0]); i++) {
		const struct case_geom *c = &g_cases[i];
		uint32_t most = c->dev_pages < c->host_pages ? c->dev_pages : c->host_pages;
		struct tiers t;

		tiers_init(&t, c->layers, c->page_tokens, c->row, c->dev_pages, c->host_pages);
		run_batch(&t, to_host, 1, 0, 0);
		run_batch(&t, to_host, most / 2 + 1, 0, 0);
		run_batch(&t, to_host, most, 0, 0);
		tiers_free(&t);
	}
}

static void test_kvp_copy_dev_to_host_cuda_geometries(void)
{
	each_case(1);
}

static void test_kvp_copy_host_to_dev_cuda_geometries(void)
{
	each_case(0);
}

/* Bases off 16-byte alignment force the 8/4/2/1-byte paths even for 16-multiple rows. */
static void test_kvp_copy_dev_to_host_cuda_misaligned(void)
{
	static const unsigned offs[][2] = { { 0, 8 }, { 4, 0 }, { 2, 2 },
					    { 1, 0 }, { 0, 3 }, { 16, 32 } };
	struct tiers t;

	tiers_init(&t, 2, 16, 256, 8, 8);
	for (size_t i = 0; i < sizeof(offs) / sizeof(offs[0]); i++)
		run_batch(&t, 1, 5, offs[i][0], offs[i][1]);
	tiers_free(&t);
}

static void test_kvp_copy_host_to_dev_cuda_misaligned(void)
{
	static const unsigned offs[][2] = { { 0, 8 }, { 4, 0 }, { 2, 2 },
					    { 1, 0 }, { 0, 3 }, { 16, 32 } };
	struct tiers t;

	tiers_init(&t, 2, 16, 256, 8, 8);
	for (size_t i = 0; i < sizeof(offs) / sizeof(offs[0]); i++)
		run_batch(&t, 0, 5, offs[i][0], offs[i][1]);
	tiers_free(&t);
}

/* More pages than the context's initial staging capacity (1024), then fewer again. */
static void test_kvp_copy_dev_to_host_cuda_large_batch(void)
{
	struct tiers t;

	tiers_init(&t, 1, 1, 16, 5000, 4500);
	run_batch(&t, 1, 4000, 0, 0);
	run_batch(&t, 1, 7, 0, 0);
	run_batch(&t, 0, 4321, 0, 0);
	tiers_free(&t);
}

/* Several batches queued without a sync, the caller reusing one pair of list arrays; the
 * dev->host->dev chain only comes out right if each batch ran with its own lists, in order. */
static void test_kvp_copy_host_to_dev_cuda_queued(void)
{
	uint32_t dp[6], hp[6];
	struct tiers t;
	int ret = 0;

	tiers_init(&t, 3, 16, 128, 12, 12);
	tiers_fill(&t, 1);
	for (int round = 0; round < 20; round++) {
		h_pick_ids(&g_rng, dp, 6, 12);
		h_pick_ids(&g_rng, hp, 6, 12);
		if (round % 2) {
			ret |= kvp_copy_host_to_dev_cuda(g_ctx, &t.g, t.host_dptr + PAD,
							 t.dev + PAD, hp, dp, 6);
			kvp_copy_host_to_dev_cpu(&t.g, t.sh_host + PAD, t.sh_dev + PAD, hp, dp, 6);
		} else {
			ret |= kvp_copy_dev_to_host_cuda(g_ctx, &t.g, t.dev + PAD,
							 t.host_dptr + PAD, dp, hp, 6);
			kvp_copy_dev_to_host_cpu(&t.g, t.sh_dev + PAD, t.sh_host + PAD, dp, hp, 6);
		}
	}
	CU_ASSERT_EQUAL(ret, 0);
	CU_ASSERT_EQUAL(kvp_copy_cuda_sync(g_ctx), 0);
	tiers_compare(&t);
	tiers_free(&t);
}

/* dev -> host -> dev on other device pages gives the same bytes per page. */
static void test_kvp_copy_host_to_dev_cuda_round_trip(void)
{
	uint32_t from[4] = { 7, 0, 3, 5 }, via[4] = { 2, 9, 4, 0 }, to[4] = { 1, 6, 2, 8 };
	struct tiers t;
	uint64_t run;
	unsigned char *dev;

	tiers_init(&t, 4, 16, 512, 10, 10);
	run = (uint64_t)t.g.page_tokens * t.g.row_bytes;
	tiers_fill(&t, 1);
	CU_ASSERT_EQUAL(kvp_copy_dev_to_host_cuda(g_ctx, &t.g, t.dev + PAD, t.host_dptr + PAD, from,
						  via, 4),
			0);
	CU_ASSERT_EQUAL(kvp_copy_host_to_dev_cuda(g_ctx, &t.g, t.host_dptr + PAD, t.dev + PAD, via,
						  to, 4),
			0);
	CU_ASSERT_EQUAL(kvp_copy_cuda_sync(g_ctx), 0);
	dev = malloc(t.dev_bytes + 2 * PAD);
	CU_ASSERT_FATAL(dev != NULL);
	CK(cudaMemcpy(dev, t.dev, t.dev_bytes + 2 * PAD, cudaMemcpyDeviceToHost));
	/* page from[i] of the original (shadow) is now also at page to[i] */
	for (int i = 0; i < 4; i++)
		for (uint32_t l = 0; l < t.g.layers; l++)
			for (uint32_t kv = 0; kv < 2; kv++) {
				uint64_t a =
					PAD + kvp_dev_offset(&t.g, l, kv,
							     (uint64_t)from[i] * t.g.page_tokens);
				uint64_t b =
					PAD + kvp_dev_offset(&t.g, l, kv,
							     (uint64_t)to[i] * t.g.page_tokens);

				CU_ASSERT(memcmp(dev + b, t.sh_dev + a, run) == 0);
			}
	free(dev);
	tiers_free(&t);
}

static void test_kvp_copy_dev_to_host_cuda_bad_args(void)
{
	struct kvp_copy_geom bad = {
		.layers = 0, .page_tokens = 16, .row_bytes = 256, .dev_slots = 64
	};
	uint32_t dp[2] = { 0, 4 }, hp[2] = { 0, 1 };
	struct tiers t;

	tiers_init(&t, 2, 16, 256, 4, 4);
	tiers_fill(&t, 1);
	CU_ASSERT_EQUAL(kvp_copy_dev_to_host_cuda(NULL, &t.g, t.dev, t.host_dptr, dp, hp, 1),
			-EINVAL);
	CU_ASSERT_EQUAL(kvp_copy_dev_to_host_cuda(g_ctx, &bad, t.dev, t.host_dptr, dp, hp, 1),
			-EINVAL);
	CU_ASSERT_EQUAL(kvp_copy_dev_to_host_cuda(g_ctx, NULL, t.dev, t.host_dptr, dp, hp, 1),
			-EINVAL);
	/* device page 4 of 4, then host page 4 of 4 */
	CU_ASSERT_EQUAL(kvp_copy_dev_to_host_cuda(g_ctx, &t.g, t.dev + PAD, t.host_dptr + PAD, dp,
						  hp, 2),
			-ERANGE);
	CU_ASSERT_EQUAL(kvp_copy_host_to_dev_cuda(g_ctx, &t.g, t.host_dptr + PAD, t.dev + PAD, hp,
						  dp, 2),
			-ERANGE);
	CU_ASSERT_EQUAL(kvp_copy_dev_to_host_cuda(g_ctx, &t.g, t.dev + PAD, t.host_dptr + PAD, hp,
						  dp, 2),
			-ERANGE);
	CU_ASSERT_EQUAL(kvp_copy_host_to_dev_cuda(g_ctx, &t.g, t.host_dptr + PAD, t.dev + PAD, dp,
						  hp, 2),
			-ERANGE);
	CU_ASSERT_EQUAL(kvp_copy_dev_to_host_cuda(g_ctx, &t.g, NULL, t.host_dptr, dp, hp, 1),
			-EINVAL);
	CU_ASSERT_EQUAL(kvp_copy_dev_to_host_cuda(g_ctx, &t.g, t.dev, t.host_dptr, NULL, hp, 1),
			-EINVAL);
	CU_ASSERT_EQUAL(kvp_copy_dev_to_host_cuda(g_ctx, &t.g, t.dev, t.host_dptr, NULL, NULL, 0),
			0);
	CU_ASSERT_EQUAL(kvp_copy_cuda_sync(g_ctx), 0);
	CU_ASSERT_EQUAL(kvp_copy_cuda_sync(NULL), -EINVAL);
	tiers_compare(&t); /* nothing was written */
	tiers_free(&t);
}

/* kvp_copy_runs_cuda: shuffled runs of odd sizes from device memory into registered host
 * memory and back into another device buffer on a stream of the test's own, every byte equal
 * and nothing between the runs written; bad lists refused before anything is enqueued. */
static void test_kvp_copy_runs_cuda_round_trip(void)
{
	enum { NR = 64, RUN = 3000, SLOT = 4096, SPAN = NR * SLOT };
	uint64_t d[NR], s[NR], n[NR];
	unsigned char *src = malloc(SPAN), *host = malloc(SPAN), *back = malloc(SPAN);
	unsigned char *dev_a, *dev_b;
	uint32_t order[NR];
	cudaStream_t st;

	CU_ASSERT_PTR_NOT_NULL_FATAL(src);
	CU_ASSERT_PTR_NOT_NULL_FATAL(host);
	CU_ASSERT_PTR_NOT_NULL_FATAL(back);
	h_fill_random(&g_rng, src, SPAN);
	memset(host, CANARY, SPAN);
	CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
	CK(cudaMalloc((void **)&dev_a, SPAN));
	CK(cudaMalloc((void **)&dev_b, SPAN));
	CK(cudaMemcpy(dev_a, src, SPAN, cudaMemcpyHostToDevice));
	CK(cudaMemset(dev_b, CANARY, SPAN));
	CK(cudaHostRegister(host, SPAN, cudaHostRegisterDefault));
	h_pick_ids(&g_rng, order, NR, NR);
	for (uint32_t i = 0; i < NR; i++) {
		n[i] = 1 + (uint64_t)(h_rng_next(&g_rng) % RUN);
		s[i] = (uintptr_t)(dev_a + (uint64_t)i * SLOT);
		d[i] = (uintptr_t)(host + (uint64_t)order[i] * SLOT + i % 5);
	}
	CU_ASSERT_EQUAL(kvp_copy_runs_cuda(d, s, n, NR, st), 0);
	CK(cudaStreamSynchronize(st));
	for (uint32_t i = 0; i < NR; i++) {
		CU_ASSERT(memcmp((void *)(uintptr_t)d[i], src + (uint64_t)i * SLOT, n[i]) == 0);
		s[i] = d[i]; /* and back, into dev_b at dev_a's offsets */
		d[i] = (uintptr_t)(dev_b + (uint64_t)i * SLOT);
	}
	CU_ASSERT_EQUAL(kvp_copy_runs_cuda(d, s, n, NR, st), 0);
	CK(cudaStreamSynchronize(st));
	CK(cudaMemcpy(back, dev_b, SPAN, cudaMemcpyDeviceToHost));
	for (uint32_t i = 0; i < NR; i++) {
		const unsigned char *b = back + (uint64_t)i * SLOT;

		CU_ASSERT(memcmp(b, src + (uint64_t)i * SLOT, n[i]) == 0);
		CU_ASSERT(n[i] == SLOT || b[n[i]] == CANARY);
	}
	CU_ASSERT_EQUAL(kvp_copy_runs_cuda(NULL, s, n, 1, st), -EINVAL);
	CU_ASSERT_EQUAL(kvp_copy_runs_cuda(NULL, NULL, NULL, 0, st), 0);
	CK(cudaHostUnregister(host));
	CK(cudaFree(dev_a));
	CK(cudaFree(dev_b));
	CK(cudaStreamDestroy(st));
	free(src);
	free(host);
	free(back);
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_kvp_copy_dev_to_host_cuda_geometries),
		H_TEST(test_kvp_copy_host_to_dev_cuda_geometries),
		H_TEST(test_kvp_copy_dev_to_host_cuda_misaligned),
		H_TEST(test_kvp_copy_host_to_dev_cuda_misaligned),
		H_TEST(test_kvp_copy_dev_to_host_cuda_large_batch),
		H_TEST(test_kvp_copy_host_to_dev_cuda_queued),
		H_TEST(test_kvp_copy_host_to_dev_cuda_round_trip),
		H_TEST(test_kvp_copy_dev_to_host_cuda_bad_args),
		H_TEST(test_kvp_copy_runs_cuda_round_trip),
	};
	int ret, count = 0, status;

	ret = kvp_copy_cuda_new(0, &g_ctx);
	if (ret == -ENODEV) {
		cudaError_t e = cudaGetDeviceCount(&count);

		printf("SKIP: no CUDA device: kvp_copy_cuda_new(0) = -ENODEV (cudaGetDeviceCount: "
		       "%s, %d devices)\n",
		       e == cudaSuccess ? "ok" : cudaGetErrorString(e), count);
		return 77;
	}
	if (ret) {
		fprintf(stderr, "kvp_copy_cuda_new(0) = %d\n", ret);
		return 1;
	}

	status = H_RUN_SUITE("kv_copy_cuda", NULL, NULL, tests);
	kvp_copy_cuda_free(g_ctx);
	return status;
}
