/* test_budget.c - CUnit tests of daemon/conf/budget.c: which host memory limit binds, with a fake
 * machine behind struct kvp_budget_env, and the wording of the verdict. */
#include "budget.h"

#include <CUnit/Basic.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include "suite.h"

#define MiB (1ull << 20)
#define GiB (1ull << 30)

/* The fake machine: limits in bytes, and how often each reader was asked. */
struct fake {
	uint64_t mem, cgroup, lock, huge;
	uint64_t node[4];
	int max_node;
	int err; /* returned by mem_available when nonzero */
	int calls_mem, calls_cgroup, calls_lock, calls_huge, calls_node;
};

static int fake_mem(void *ctx, uint64_t *bytes)
{
	struct fake *f = ctx;

	f->calls_mem++;
	if (f->err)
		return f->err;
	*bytes = f->mem;
	return 0;
}

static int fake_node(void *ctx, int node, uint64_t *bytes)
{
	struct fake *f = ctx;

	f->calls_node++;
	if (node < 0 || node > f->max_node)
		return -ENOENT;
	*bytes = f->node[node];
	return 0;
}

static int fake_cgroup(void *ctx, uint64_t *bytes)
{
	struct fake *f = ctx;

	f->calls_cgroup++;
	*bytes = f->cgroup;
	return 0;
}

static int fake_lock(void *ctx, uint64_t *bytes)
{
	struct fake *f = ctx;

	f->calls_lock++;
	*bytes = f->lock;
	return 0;
}

static int fake_huge(void *ctx, uint64_t *bytes)
{
	struct fake *f = ctx;

	f->calls_huge++;
	*bytes = f->huge;
	return 0;
}

static int fake_max_node(void *ctx)
{
	return ((struct fake *)ctx)->max_node;
}

/* Plenty of everything on two nodes. */
static struct fake g_f;
static struct kvp_budget_env g_env;

static void reset(void)
{
	memset(&g_f, 0, sizeof(g_f));
	g_f.mem = g_f.cgroup = g_f.lock = g_f.huge = UINT64_MAX;
	g_f.node[0] = g_f.node[1] = 1000 * GiB;
	g_f.max_node = 1;
	g_env = (struct kvp_budget_env){
		.mem_available = fake_mem,
		.numa_node_free = fake_node,
		.cgroup_room = fake_cgroup,
		.memlock_room = fake_lock,
		.hugepages_free = fake_huge,
		.numa_max_node = fake_max_node,
		.ctx = &g_f,
	};
}

/* Adds a pool with 1 MiB pages (1024 bytes a token, 1024 tokens a page). */
static struct kvp_pool_conf *add_pool(struct kvp_conf *c, const char *name,
				      enum kvp_device_kind dev, uint64_t dev_mib, uint64_t host_mib,
				      int node)
{
	struct kvp_pool_conf *p = &c->pools[c->n_pools++];

	memset(p, 0, sizeof(*p));
	snprintf(p->name, sizeof(p->name), "%s", name);
	p->layers = 1;
	p->kv_heads = 1;
	p->head_dim = 256;
	p->dtype = KVP_CONF_DTYPE_FP16;
	p->page_tokens = 1024;
	p->device = dev;
	p->device_pages = dev_mib;
	p->host_pages = host_mib;
	p->numa_node = node;
	p->hugepages = KVP_OFF;
	p->mlock = KVP_OFF;
	return p;
}

static void new_conf(struct kvp_conf *c)
{
	kvp_conf_defaults(c);
	reset();
}

static void expect_msg(const struct kvp_budget_verdict *v, const char *msg)
{
	char buf[512];

	kvp_budget_format(v, buf, sizeof(buf));
	if (strcmp(buf, msg) != 0)
		fprintf(stderr, "\n  expected: %s\n  got:      %s\n", msg, buf);
	CU_ASSERT_STRING_EQUAL(buf, msg);
}

static void test_kvp_pool_host_bytes_tiers(void)
{
	struct kvp_conf c;
	struct kvp_pool_conf *p;

	new_conf(&c);
	p = add_pool(&c, "a", KVP_DEVICE_SIM, 3, 5, 0);
	CU_ASSERT_EQUAL(kvp_conf_page_bytes(p), MiB);
	CU_ASSERT_EQUAL(kvp_conf_host_bytes(p), 5 * MiB);
	CU_ASSERT_EQUAL(kvp_conf_device_bytes(p), 3 * MiB);
	p = add_pool(&c, "b", KVP_DEVICE_NONE, 0, 7, 0);
	CU_ASSERT_EQUAL(kvp_conf_device_bytes(p), 0);
	CU_ASSERT_EQUAL(kvp_conf_host_bytes(p), 7 * MiB);
}

static void test_kvp_budget_check_fits(void)
{
	struct kvp_conf c;
	struct kvp_budget_verdict v;

	new_conf(&c);
	add_pool(&c, "a", KVP_DEVICE_SIM, 100, 100, KVP_NUMA_NODE_AUTO);
	add_pool(&c, "b", KVP_DEVICE_CUDA, 100000, 100, 1);
	/* exactly enough: the cuda tier is not host memory, but kvpoold's bookkeeping of its
	 * pages is */
	g_f.mem = g_f.cgroup =
		300 * MiB + kvp_conf_meta_bytes(&c.pools[0]) + kvp_conf_meta_bytes(&c.pools[1]);
	g_f.node[0] = 200 * MiB;
	g_f.node[1] = 100 * MiB;
	memset(&v, 0xff, sizeof(v));
	CU_ASSERT_EQUAL(kvp_budget_check(&c, &g_env, &v), 0);
	CU_ASSERT_EQUAL(v.limit, KVP_BUDGET_NONE);
	CU_ASSERT_STRING_EQUAL(v.pool, "");
	CU_ASSERT_STRING_EQUAL(v.warning, "");
	/* limits no pool needs are not read */
	CU_ASSERT_EQUAL(g_f.calls_mem, 1);
	CU_ASSERT_EQUAL(g_f.calls_cgroup, 1);
	CU_ASSERT_EQUAL(g_f.calls_node, 2);
	CU_ASSERT_EQUAL(g_f.calls_lock, 0);
	CU_ASSERT_EQUAL(g_f.calls_huge, 0);
	expect_msg(&v, "all pools fit in host memory");
}

static void test_kvp_budget_check_mem_available_binds(void)
{
	struct kvp_conf c;
	struct kvp_budget_verdict v;

	new_conf(&c);
	add_pool(&c, "a", KVP_DEVICE_NONE, 0, 1000, 0);
	add_pool(&c, "b", KVP_DEVICE_SIM, 500, 600, 0);
	add_pool(&c, "c", KVP_DEVICE_NONE, 0, 100000, 0);
	g_f.mem = 2000 * MiB;
	CU_ASSERT_EQUAL(kvp_budget_check(&c, &g_env, &v), -ENOMEM);
	CU_ASSERT_EQUAL(v.limit, KVP_BUDGET_MEM_AVAILABLE);
	CU_ASSERT_STRING_EQUAL(v.pool, "b");
	CU_ASSERT_EQUAL(v.requested, 2100 * MiB);
	CU_ASSERT_EQUAL(v.earlier, 1000 * MiB);
	CU_ASSERT_EQUAL(v.available, 2000 * MiB);
	CU_ASSERT_EQUAL(v.numa_node, -1);
	CU_ASSERT_EQUAL(v.tiers, KVP_BUDGET_TIER_HOST | KVP_BUDGET_TIER_SIM);
	expect_msg(&v, "pool b: host and sim device tiers need 2.20 GB (with 1.05 GB for the pools "
		       "before it) but only 2.10 GB is available (MemAvailable)");
}

static void test_kvp_budget_check_numa_node_binds(void)
{
	struct kvp_conf c;
	struct kvp_budget_verdict v;

	new_conf(&c);
	add_pool(&c, "n0", KVP_DEVICE_NONE, 0, 3000, KVP_NUMA_NODE_AUTO);
	add_pool(&c, "n1a", KVP_DEVICE_NONE, 0, 3000, 1);
	add_pool(&c, "n1b", KVP_DEVICE_SIM, 2000, 0, 1);
	g_f.mem = g_f.cgroup = 100000 * MiB;
	g_f.node[0] = 10000 * MiB; /* room left on node 0 */
	g_f.node[1] = 4000 * MiB;
	CU_ASSERT_EQUAL(kvp_budget_check(&c, &g_env, &v), -ENOMEM);
	CU_ASSERT_EQUAL(v.limit, KVP_BUDGET_NUMA_NODE_FREE);
	CU_ASSERT_STRING_EQUAL(v.pool, "n1b");
	CU_ASSERT_EQUAL(v.numa_node, 1);
	CU_ASSERT_EQUAL(v.requested, 5000 * MiB);
	CU_ASSERT_EQUAL(v.earlier, 3000 * MiB);
	CU_ASSERT_EQUAL(v.available, 4000 * MiB);
	CU_ASSERT_EQUAL(v.tiers, KVP_BUDGET_TIER_SIM);
	expect_msg(&v, "pool n1b: sim device tier needs 5.24 GB (with 3.15 GB for the pools before "
		       "it) but only 4.19 GB is available (NUMA node 1 free memory)");

	/* the same pools on node 0 alone fit: auto is node 0 */
	c.pools[1].numa_node = 0;
	c.pools[2].numa_node = KVP_NUMA_NODE_AUTO;
	reset();
	g_f.node[0] = 8000 * MiB;
	g_f.node[1] = 0;
	CU_ASSERT_EQUAL(kvp_budget_check(&c, &g_env, &v), 0);
	CU_ASSERT_EQUAL(g_f.calls_node, 1);
}

static void test_kvp_budget_check_numa_node_missing(void)
{
	struct kvp_conf c;
	struct kvp_budget_verdict v;

	new_conf(&c);
	add_pool(&c, "a", KVP_DEVICE_NONE, 0, 10, 0);
	add_pool(&c, "far", KVP_DEVICE_NONE, 0, 10, 3);
	CU_ASSERT_EQUAL(kvp_budget_check(&c, &g_env, &v), -ENODEV);
	CU_ASSERT_EQUAL(v.limit, KVP_BUDGET_NONE);
	CU_ASSERT_STRING_EQUAL(v.pool, "far");
	CU_ASSERT_EQUAL(v.numa_node, 3);
	expect_msg(&v, "pool far: NUMA node 3 does not exist");
	/* a node without host memory in it is not looked at */
	c.pools[1].device = KVP_DEVICE_CUDA;
	c.pools[1].device_pages = 10;
	c.pools[1].host_pages = 0;
	CU_ASSERT_EQUAL(kvp_budget_check(&c, &g_env, &v), 0);
}

static void test_kvp_budget_check_cgroup_binds(void)
{
	struct kvp_conf c;
	struct kvp_budget_verdict v;

	new_conf(&c);
	add_pool(&c, "a", KVP_DEVICE_NONE, 0, 512, 0);
	g_f.mem = 1024 * MiB;
	g_f.cgroup = 256 * MiB;
	CU_ASSERT_EQUAL(kvp_budget_check(&c, &g_env, &v), -ENOMEM);
	CU_ASSERT_EQUAL(v.limit, KVP_BUDGET_CGROUP_MEMORY_MAX);
	CU_ASSERT_STRING_EQUAL(v.pool, "a");
	CU_ASSERT_EQUAL(v.requested, 512 * MiB);
	CU_ASSERT_EQUAL(v.earlier, 0);
	CU_ASSERT_EQUAL(v.available, 256 * MiB);
	expect_msg(&v, "pool a: host tier needs 0.54 GB but only 0.27 GB is available (cgroup "
		       "memory.max)");
	/* when MemAvailable binds too, it is named first */
	g_f.mem = 100 * MiB;
	CU_ASSERT_EQUAL(kvp_budget_check(&c, &g_env, &v), -ENOMEM);
	CU_ASSERT_EQUAL(v.limit, KVP_BUDGET_MEM_AVAILABLE);
}

/* Small figures read in MiB and KiB, never "0.00 GB". */
static void test_kvp_budget_format_small_sizes(void)
{
	struct kvp_conf c;
	struct kvp_budget_verdict v;

	new_conf(&c);
	add_pool(&c, "tiny", KVP_DEVICE_NONE, 0, 1, 0)->mlock = KVP_ON;
	g_f.lock = 512 << 10;
	CU_ASSERT_EQUAL(kvp_budget_check(&c, &g_env, &v), -ENOMEM);
	expect_msg(&v, "pool tiny: host tier needs 1.0 MiB but only 512.0 KiB is available "
		       "(RLIMIT_MEMLOCK)");
	g_f.lock = 100;
	CU_ASSERT_EQUAL(kvp_budget_check(&c, &g_env, &v), -ENOMEM);
	expect_msg(&v, "pool tiny: host tier needs 1.0 MiB but only 100 B is available "
		       "(RLIMIT_MEMLOCK)");
	g_f.lock = UINT64_MAX;
}

static void test_kvp_budget_check_memlock_binds_on(void)
{
	struct kvp_conf c;
	struct kvp_budget_verdict v;

	new_conf(&c);
	add_pool(&c, "a", KVP_DEVICE_SIM, 64, 64, 0)->mlock = KVP_ON;
	add_pool(&c, "b", KVP_DEVICE_NONE, 0, 64, 0)->mlock = KVP_ON;
	g_f.lock = 150 * MiB;
	CU_ASSERT_EQUAL(kvp_budget_check(&c, &g_env, &v), -ENOMEM);
	CU_ASSERT_EQUAL(v.limit, KVP_BUDGET_RLIMIT_MEMLOCK);
	CU_ASSERT_STRING_EQUAL(v.pool, "b");
	CU_ASSERT_EQUAL(v.requested, 192 * MiB);
	CU_ASSERT_EQUAL(v.earlier, 128 * MiB);
	CU_ASSERT_EQUAL(v.available, 150 * MiB);
	CU_ASSERT_STRING_EQUAL(v.warning, "");
	expect_msg(&v, "pool b: host tier needs 0.20 GB (with 0.13 GB for the pools before it) but "
		       "only 0.16 GB is available (RLIMIT_MEMLOCK)");
	/* unlimited (RLIM_INFINITY or CAP_IPC_LOCK) */
	g_f.lock = UINT64_MAX;
	CU_ASSERT_EQUAL(kvp_budget_check(&c, &g_env, &v), 0);
}

static void test_kvp_budget_check_memlock_warns_try(void)
{
	struct kvp_conf c;
	struct kvp_budget_verdict v;

	new_conf(&c);
	add_pool(&c, "on", KVP_DEVICE_NONE, 0, 64, 0)->mlock = KVP_ON;
	add_pool(&c, "try", KVP_DEVICE_NONE, 0, 64, 0)->mlock = KVP_TRY;
	add_pool(&c, "off", KVP_DEVICE_NONE, 0, 1024, 0);
	g_f.lock = 100 * MiB;
	CU_ASSERT_EQUAL(kvp_budget_check(&c, &g_env, &v), 0);
	CU_ASSERT_EQUAL(v.limit, KVP_BUDGET_NONE);
	CU_ASSERT_STRING_EQUAL(v.warning, "pool try: mlock = try: 0.13 GB would be locked but "
					  "RLIMIT_MEMLOCK allows 0.10 GB; the rest stays unlocked");
	CU_ASSERT_EQUAL(g_f.calls_lock, 1);
	/* all try: never an error */
	c.pools[0].mlock = KVP_TRY;
	g_f.lock = 0;
	CU_ASSERT_EQUAL(kvp_budget_check(&c, &g_env, &v), 0);
	CU_ASSERT_PTR_NOT_NULL(strstr(v.warning, "pool on: mlock = try"));
	/* off everywhere: RLIMIT_MEMLOCK is not even read */
	c.pools[0].mlock = c.pools[1].mlock = KVP_OFF;
	g_f.calls_lock = 0;
	CU_ASSERT_EQUAL(kvp_budget_check(&c, &g_env, &v), 0);
	CU_ASSERT_STRING_EQUAL(v.warning, "");
	CU_ASSERT_EQUAL(g_f.calls_lock, 0);
}

static void test_kvp_budget_check_hugepages_binds_on(void)
{
	struct kvp_conf c;
	struct kvp_budget_verdict v;

	new_conf(&c);
	add_pool(&c, "h", KVP_DEVICE_SIM, 100, 1024, 0)->hugepages = KVP_ON;
	/* huge pages are not MemAvailable: only the sim tier (and the bookkeeping) counts there */
	g_f.mem = g_f.cgroup = 100 * MiB + kvp_conf_meta_bytes(&c.pools[0]);
	g_f.node[0] = 100 * MiB;
	g_f.huge = 512 * MiB;
	CU_ASSERT_EQUAL(kvp_budget_check(&c, &g_env, &v), -ENOMEM);
	CU_ASSERT_EQUAL(v.limit, KVP_BUDGET_HUGEPAGES_FREE);
	CU_ASSERT_EQUAL(v.requested, 1024 * MiB);
	CU_ASSERT_EQUAL(v.available, 512 * MiB);
	CU_ASSERT_EQUAL(v.tiers, KVP_BUDGET_TIER_HOST);
	expect_msg(&v, "pool h: host tier needs 1.07 GB but only 0.54 GB is available (free huge "
		       "pages)");
	g_f.huge = 1024 * MiB;
	CU_ASSERT_EQUAL(kvp_budget_check(&c, &g_env, &v), 0);

	/* try falls back to normal pages: counted as normal memory, huge pages not read */
	c.pools[0].hugepages = KVP_TRY;
	g_f.calls_huge = 0;
	g_f.huge = 0;
	CU_ASSERT_EQUAL(kvp_budget_check(&c, &g_env, &v), -ENOMEM);
	CU_ASSERT_EQUAL(v.limit, KVP_BUDGET_MEM_AVAILABLE);
	CU_ASSERT_EQUAL(v.requested, 1124 * MiB);
	CU_ASSERT_EQUAL(g_f.calls_huge, 0);
}

static void test_kvp_budget_format_known_case(void)
{
	struct kvp_conf c;
	struct kvp_budget_verdict v;
	struct kvp_pool_conf *p;
	char buf[256];
	int n;

	new_conf(&c);
	p = &c.pools[c.n_pools++];
	memset(p, 0, sizeof(*p));
	snprintf(p->name, sizeof(p->name), "llama3-8b");
	p->layers = 32;
	p->kv_heads = 8;
	p->head_dim = 128;
	p->dtype = KVP_CONF_DTYPE_BF16;
	p->page_tokens = 16;
	p->device = KVP_DEVICE_CUDA;
	p->device_pages = 20480; /* 40 GiB */
	p->host_pages = 32768;	 /* 64 GiB */
	p->numa_node = KVP_NUMA_NODE_AUTO;
	p->mlock = KVP_ON;
	g_f.node[0] = 41300000000ull;
	CU_ASSERT_EQUAL(kvp_budget_check(&c, &g_env, &v), -ENOMEM);
	CU_ASSERT_EQUAL(v.requested, 64 * GiB);
	n = kvp_budget_format(&v, buf, sizeof(buf));
	CU_ASSERT_STRING_EQUAL(buf, "pool llama3-8b: host tier needs 68.72 GB but only 41.30 GB is "
				    "available (NUMA node 0 free memory)");
	CU_ASSERT_EQUAL(n, (int)strlen(buf));
	/* snprintf semantics: truncates, returns the full length */
	CU_ASSERT_EQUAL(kvp_budget_format(&v, buf, 10), n);
	CU_ASSERT_STRING_EQUAL(buf, "pool llam");
}

static void test_kvp_budget_check_read_error(void)
{
	struct kvp_conf c;
	struct kvp_budget_verdict v, before;

	new_conf(&c);
	add_pool(&c, "a", KVP_DEVICE_NONE, 0, 10, 0);
	g_f.err = -EIO;
	memset(&v, 0x5a, sizeof(v));
	before = v;
	CU_ASSERT_EQUAL(kvp_budget_check(&c, &g_env, &v), -EIO);
	CU_ASSERT_EQUAL(memcmp(&v, &before, sizeof(v)), 0);
	CU_ASSERT_EQUAL(kvp_budget_check(NULL, &g_env, &v), -EINVAL);
	CU_ASSERT_EQUAL(kvp_budget_check(&c, NULL, &v), -EINVAL);
	CU_ASSERT_EQUAL(kvp_budget_check(&c, &g_env, NULL), -EINVAL);
}

static void test_kvp_limit_name_all(void)
{
	CU_ASSERT_STRING_EQUAL(kvp_budget_limit_name(KVP_BUDGET_MEM_AVAILABLE), "MemAvailable");
	CU_ASSERT_STRING_EQUAL(kvp_budget_limit_name(KVP_BUDGET_NUMA_NODE_FREE),
			       "NUMA node free memory");
	CU_ASSERT_STRING_EQUAL(kvp_budget_limit_name(KVP_BUDGET_CGROUP_MEMORY_MAX),
			       "cgroup memory.max");
	CU_ASSERT_STRING_EQUAL(kvp_budget_limit_name(KVP_BUDGET_RLIMIT_MEMLOCK), "RLIMIT_MEMLOCK");
	CU_ASSERT_STRING_EQUAL(kvp_budget_limit_name(KVP_BUDGET_HUGEPAGES_FREE), "free huge pages");
	CU_ASSERT_STRING_EQUAL(kvp_budget_limit_name(KVP_BUDGET_NONE), "none");
	CU_ASSERT_STRING_EQUAL(kvp_budget_limit_name(KVP_BUDGET_MAX), "?");
}

/* The room of one pool's host tier: the least limit its pages are subject to, named. */
static void test_kvp_budget_room_names_the_least_limit(void)
{
	struct kvp_conf c;
	struct kvp_pool_conf *p;
	struct kvp_budget_room room;

	new_conf(&c);
	p = add_pool(&c, "a", KVP_DEVICE_NONE, 0, 64, 1);
	CU_ASSERT_EQUAL(kvp_budget_room(p, &g_env, &room), 0);
	CU_ASSERT_EQUAL(room.limit, KVP_BUDGET_NUMA_NODE_FREE);
	CU_ASSERT_EQUAL(room.bytes, 1000 * GiB);
	CU_ASSERT_EQUAL(room.numa_node, 1);
	g_f.mem = 300 * GiB;
	CU_ASSERT_EQUAL(kvp_budget_room(p, &g_env, &room), 0);
	CU_ASSERT_EQUAL(room.limit, KVP_BUDGET_MEM_AVAILABLE);
	CU_ASSERT_EQUAL(room.bytes, 300 * GiB);
	g_f.cgroup = 2 * GiB;
	CU_ASSERT_EQUAL(kvp_budget_room(p, &g_env, &room), 0);
	CU_ASSERT_EQUAL(room.limit, KVP_BUDGET_CGROUP_MEMORY_MAX);
	CU_ASSERT_EQUAL(room.bytes, 2 * GiB);
	/* RLIMIT_MEMLOCK binds only with mlock = on; try only warns */
	g_f.lock = 1 * GiB;
	p->mlock = KVP_TRY;
	CU_ASSERT_EQUAL(kvp_budget_room(p, &g_env, &room), 0);
	CU_ASSERT_EQUAL(room.limit, KVP_BUDGET_CGROUP_MEMORY_MAX);
	p->mlock = KVP_ON;
	CU_ASSERT_EQUAL(kvp_budget_room(p, &g_env, &room), 0);
	CU_ASSERT_EQUAL(room.limit, KVP_BUDGET_RLIMIT_MEMLOCK);
	CU_ASSERT_EQUAL(room.bytes, 1 * GiB);
	/* huge pages: only the free huge pages (and the lock) count */
	p->mlock = KVP_OFF;
	p->hugepages = KVP_ON;
	g_f.huge = 4 * GiB;
	g_f.calls_mem = 0;
	CU_ASSERT_EQUAL(kvp_budget_room(p, &g_env, &room), 0);
	CU_ASSERT_EQUAL(room.limit, KVP_BUDGET_HUGEPAGES_FREE);
	CU_ASSERT_EQUAL(room.bytes, 4 * GiB);
	CU_ASSERT_EQUAL(g_f.calls_mem, 0);
}

/* No limit at all: UINT64_MAX and none named; a reader's error leaves *out as it was. */
static void test_kvp_budget_room_unlimited_and_errors(void)
{
	struct kvp_conf c;
	struct kvp_pool_conf *p;
	struct kvp_budget_room room = { .bytes = 7, .limit = KVP_BUDGET_MAX, .numa_node = 9 };

	new_conf(&c);
	p = add_pool(&c, "a", KVP_DEVICE_NONE, 0, 64, -1);
	g_f.node[0] = UINT64_MAX;
	g_f.err = -EIO;
	CU_ASSERT_EQUAL(kvp_budget_room(p, &g_env, &room), -EIO);
	CU_ASSERT_EQUAL(room.bytes, 7);
	CU_ASSERT_EQUAL(room.limit, KVP_BUDGET_MAX);
	g_f.err = 0;
	CU_ASSERT_EQUAL(kvp_budget_room(p, &g_env, &room), 0);
	CU_ASSERT_EQUAL(room.bytes, UINT64_MAX);
	CU_ASSERT_EQUAL(room.limit, KVP_BUDGET_NONE);
	CU_ASSERT_EQUAL(room.numa_node, 0);
	p->numa_node = 3; /* past max_node */
	CU_ASSERT_EQUAL(kvp_budget_room(p, &g_env, &room), -ENOENT);
	CU_ASSERT_EQUAL(kvp_budget_room(NULL, &g_env, &room), -EINVAL);
}

/* The real readers on this machine: each answers, with plausible numbers. */
static void test_kvp_budget_env_system_reads(void)
{
	const struct kvp_budget_env *env = kvp_budget_env_system();
	struct kvp_budget_verdict v;
	struct kvp_conf c;
	uint64_t x;
	char err[256];
	int r;

	CU_ASSERT_PTR_NOT_NULL_FATAL(env);
	CU_ASSERT_EQUAL(env->mem_available(env->ctx, &x), 0);
	CU_ASSERT(x > 0 && x != UINT64_MAX);
	CU_ASSERT(env->numa_max_node(env->ctx) >= 0);
	x = 0;
	CU_ASSERT_EQUAL(env->numa_node_free(env->ctx, 0, &x), 0);
	CU_ASSERT(x > 0);
	CU_ASSERT_EQUAL(env->numa_node_free(env->ctx, 1023, &x), -ENOENT);
	CU_ASSERT_EQUAL(env->cgroup_room(env->ctx, &x), 0);
	CU_ASSERT_EQUAL(env->memlock_room(env->ctx, &x), 0);
	CU_ASSERT_EQUAL(env->hugepages_free(env->ctx, &x), 0);
	CU_ASSERT_EQUAL_FATAL(kvp_conf_load_embedded(&c, err, sizeof(err)), 0);
	r = kvp_budget_check(&c, env, &v);
	CU_ASSERT(r == 0 || r == -ENOMEM);
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_kvp_pool_host_bytes_tiers),
		H_TEST(test_kvp_budget_check_fits),
		H_TEST(test_kvp_budget_check_mem_available_binds),
		H_TEST(test_kvp_budget_check_numa_node_binds),
		H_TEST(test_kvp_budget_check_numa_node_missing),
		H_TEST(test_kvp_budget_check_cgroup_binds),
		H_TEST(test_kvp_budget_check_memlock_binds_on),
		H_TEST(test_kvp_budget_check_memlock_warns_try),
		H_TEST(test_kvp_budget_check_hugepages_binds_on),
		H_TEST(test_kvp_budget_format_known_case),
		H_TEST(test_kvp_budget_check_read_error),
		H_TEST(test_kvp_budget_format_small_sizes),
		H_TEST(test_kvp_limit_name_all),
		H_TEST(test_kvp_budget_room_names_the_least_limit),
		H_TEST(test_kvp_budget_room_unlimited_and_errors),
		H_TEST(test_kvp_budget_env_system_reads),
	};

	return H_RUN_SUITE("budget", NULL, NULL, tests);
}
