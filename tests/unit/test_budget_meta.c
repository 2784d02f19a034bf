/* test_budget_meta.c - kvpoold's own per-page bookkeeping in the budget: the per-page constant
 * of budget.h measured against the real allocator, pool arrays, lease arrays and prefix tree
 * (malloc'ed bytes per page, worst case of one tree node per page), and a pool of tiny pages
 * whose tiers fit but whose bookkeeping does not is refused. */
#include <CUnit/Basic.h>
#include <errno.h>
#include <malloc.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "budget.h"
#include "pages.h"
#include "pool.h"
#include "suite.h"

#define MiB (1024ull * 1024)
#define GiB (1024ull * MiB)

/* Whether malloc's statistics follow allocations (a sanitizer's allocator reports zeros). */
static bool heap_counted(void)
{
	struct mallinfo2 a = mallinfo2(), b;
	char *volatile p = malloc(1 << 20); /* volatile: the pair is not optimised away */

	if (p)
		p[0] = 1;
	b = mallinfo2();
	free(p);
	return b.uordblks + b.hblkhd > a.uordblks + a.hblkhd;
}

/* Bytes malloc holds now, heap and mmap'ed chunks. */
static uint64_t heap_bytes(void)
{
	struct mallinfo2 mi = mallinfo2();

	return (uint64_t)mi.uordblks + (uint64_t)mi.hblkhd;
}

static uint64_t g_mem;

static int fake_mem(void *ctx, uint64_t *b)
{
	(void)ctx;
	*b = g_mem;
	return 0;
}

static int fake_none(void *ctx, uint64_t *b)
{
	(void)ctx;
	*b = UINT64_MAX;
	return 0;
}

static int fake_node(void *ctx, int node, uint64_t *b)
{
	(void)ctx;
	if (node != 0)
		return -ENOENT;
	*b = UINT64_MAX;
	return 0;
}

static int fake_max_node(void *ctx)
{
	(void)ctx;
	return 0;
}

static const struct kvp_budget_env g_env = {
	.mem_available = fake_mem,
	.numa_node_free = fake_node,
	.cgroup_room = fake_none,
	.memlock_room = fake_none,
	.hugepages_free = fake_none,
	.numa_max_node = fake_max_node,
};

/* 2-byte pages (one fp8 token of one head of one layer): 200M of them are 0.4 GB. */
static void tiny_conf(struct kvp_conf *c, uint64_t pages)
{
	struct kvp_pool_conf *p = &c->pools[0];

	kvp_conf_defaults(c);
	c->n_pools = 1;
	memset(p, 0, sizeof(*p));
	snprintf(p->name, sizeof(p->name), "tiny");
	p->layers = p->kv_heads = p->head_dim = p->page_tokens = 1;
	p->dtype = KVP_CONF_DTYPE_FP8;
	p->device = KVP_DEVICE_SIM;
	p->device_pages = pages;
	p->numa_node = 0;
	p->mlock = KVP_OFF;
}

static void test_kvp_budget_check_counts_bookkeeping(void)
{
	struct kvp_conf c;
	struct kvp_budget_verdict v;
	char buf[512];
	uint64_t meta;

	tiny_conf(&c, 200000000);
	meta = kvp_conf_meta_bytes(&c.pools[0]);
	CU_ASSERT_EQUAL(kvp_conf_device_bytes(&c.pools[0]), 400000000);
	CU_ASSERT_EQUAL(meta, 200000000ull * KVP_BUDGET_PAGE_META_BYTES(1));
	g_mem = 20 * GiB; /* 50 times the tier, far less than its bookkeeping */
	CU_ASSERT_EQUAL(kvp_budget_check(&c, &g_env, &v), -ENOMEM);
	CU_ASSERT_EQUAL(v.limit, KVP_BUDGET_MEM_AVAILABLE);
	CU_ASSERT_EQUAL(v.requested, 400000000);
	CU_ASSERT_EQUAL(v.metadata, meta);
	kvp_budget_format(&v, buf, sizeof(buf));
	printf("\n    %s\n", buf);
	CU_ASSERT_STRING_EQUAL(buf, "pool tiny: sim device tier needs 0.40 GB and 45.00 GB of "
				    "kvpoold's bookkeeping for the pools' pages, but only 21.47 GB "
				    "is available (MemAvailable)");
	g_mem = 400000000 + meta;
	CU_ASSERT_EQUAL(kvp_budget_check(&c, &g_env, &v), 0);
	/* Pages of a cuda tier are not host memory; their bookkeeping is. */
	c.pools[0].device = KVP_DEVICE_CUDA;
	g_mem = meta - 1;
	CU_ASSERT_EQUAL(kvp_budget_check(&c, &g_env, &v), -ENOMEM);
	CU_ASSERT_EQUAL(v.requested, 0);
	CU_ASSERT_EQUAL(v.metadata, meta);
}

/* The page allocator and the pool's per-page arrays, measured. */
static void test_pool_arrays_per_page_measured(void)
{
	const uint32_t n = 1u << 20;
	static struct kvp_conf c;
	struct kvp_fail f = { 0 };
	struct kvpd_pool *p;
	struct kvp_pages *pg;
	struct kvp_lease *l;
	uint64_t before, pages_b, pool_b, lease_b;

	if (!heap_counted())
		printf("\n    malloc statistics unavailable (a sanitizer's allocator): the heap "
		       "figures are measured by the normal build");
	before = heap_bytes();
	pg = kvp_pages_new(n);
	CU_ASSERT_PTR_NOT_NULL_FATAL(pg);
	pages_b = heap_bytes() - before;
	kvp_pages_free(pg);

	tiny_conf(&c, n);
	before = heap_bytes();
	p = kvp_pool_create(&c.pools[0], 0, &f);
	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	pool_b = heap_bytes() - before;
	before = heap_bytes();
	l = kvp_lease_create(p, KVP_TIER_ID_DEVICE, 1, n / 2, &f);
	CU_ASSERT_PTR_NOT_NULL_FATAL(l);
	CU_ASSERT_EQUAL(kvp_lease_grow(l, n / 2, &f), 0);
	lease_b = heap_bytes() - before;
	printf("\n    per page: allocator %.2f B, pool (allocator, lease_of, lease_idx, tree) "
	       "%.2f B, a lease %.2f B; budgeted fixed part %u B\n",
	       (double)pages_b / n, (double)pool_b / n, (double)lease_b / n,
	       KVP_BUDGET_PAGE_FIXED_BYTES);
	CU_ASSERT(pages_b <= 5ull * n + 16384); /* two mmap chunks, rounded to pages */
	CU_ASSERT(pool_b + lease_b <= (uint64_t)KVP_BUDGET_PAGE_FIXED_BYTES * n + 64 * 1024);
	kvp_lease_destroy(l);
	kvp_pool_destroy(p);
}

/* The prefix tree at its worst: every cached page its own node (branches at the root). */
static void test_prefix_per_page_measured(void)
{
	static const uint32_t pts[] = { 1, 16 };

	for (size_t k = 0; k < sizeof(pts) / sizeof(pts[0]); k++) {
		const uint32_t n = 1u << 16, pt = pts[k];
		static struct kvp_conf c;
		struct kvp_fail f = { 0 };
		struct kvpd_pool *p;
		struct kvp_lease *l;
		uint32_t tokens[16];
		uint64_t before, tree_b, nt, dt;
		struct kvp_index_stats ps;

		tiny_conf(&c, n);
		c.pools[0].page_tokens = pt;
		p = kvp_pool_create(&c.pools[0], 0, &f);
		CU_ASSERT_PTR_NOT_NULL_FATAL(p);
		l = kvp_lease_create(p, KVP_TIER_ID_DEVICE, 1, n, &f);
		CU_ASSERT_PTR_NOT_NULL_FATAL(l);
		before = heap_bytes();
		for (uint32_t i = 0; i < n; i++) {
			uint32_t page = l->pages[l->n - 1];

			for (uint32_t t = 0; t < pt; t++)
				tokens[t] = i * 16 + t; /* a new first page each time */
			CU_ASSERT_EQUAL_FATAL(kvp_lease_insert(l, 0, tokens, pt, 0, &page, 1, &nt,
							       &dt, &f),
					      0);
		}
		tree_b = heap_bytes() - before;
		kvp_index_stats(p->ix, &ps);
		/* The index's own count of what it allocated holds under any allocator (its
		 * metadata and its slabs: a token page's key and tokens). */
		CU_ASSERT(ps.metadata_bytes + ps.key_bytes <=
			  (KVP_BUDGET_PAGE_META_BYTES(pt) - KVP_BUDGET_PAGE_FIXED_BYTES) * n);
		printf("    page_tokens %u: the index holds %.1f B per cached page by malloc, "
		       "%.1f B by its own count (budget %lu)\n",
		       pt, (double)tree_b / n, (double)(ps.metadata_bytes + ps.key_bytes) / n,
		       (unsigned long)(KVP_BUDGET_PAGE_META_BYTES(pt) -
				       KVP_BUDGET_PAGE_FIXED_BYTES));
		CU_ASSERT(tree_b <=
			  (KVP_BUDGET_PAGE_META_BYTES(pt) - KVP_BUDGET_PAGE_FIXED_BYTES) * n);
		CU_ASSERT_EQUAL(kvp_pool_check(p), 0);
		kvp_lease_destroy(l);
		kvp_pool_destroy(p);
	}
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_kvp_budget_check_counts_bookkeeping),
		H_TEST(test_pool_arrays_per_page_measured),
		H_TEST(test_prefix_per_page_measured),
	};

	return H_RUN_SUITE("budget_meta", NULL, NULL, tests);
}
