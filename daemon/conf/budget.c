/* budget.c - checks, before any pool memory exists, that all pools fit in host memory.
 *
 * Every reading of the machine goes through struct kvp_budget_env, so the arithmetic here is
 * tested with fake numbers; the system readers at the bottom are thin. */
#include "budget.h"
#include "units.h"

#include <errno.h>
#include <numa.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#define CAP_IPC_LOCK_BIT 14

/* What one pool adds to each limit. */
struct share {
	uint64_t host;	 /* host tier bytes */
	uint64_t sim;	 /* sim device tier bytes */
	uint64_t normal; /* seen by MemAvailable, cgroup and its node */
	uint64_t huge;	 /* seen by free huge pages */
	uint64_t lock;	 /* seen by RLIMIT_MEMLOCK */
	uint64_t meta;	 /* kvpoold's bookkeeping: seen by MemAvailable and cgroup */
	int node;
};

static uint64_t add_sat(uint64_t a, uint64_t b)
{
	return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

static uint64_t mul_sat(uint64_t a, uint64_t b)
{
	uint64_t r;

	return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}

uint64_t kvp_conf_host_bytes(const struct kvp_pool_conf *p)
{
	return mul_sat(p->host_pages, kvp_conf_page_bytes(p));
}

uint64_t kvp_conf_device_bytes(const struct kvp_pool_conf *p)
{
	if (p->device == KVP_DEVICE_NONE)
		return 0;
	return mul_sat(p->device_pages, kvp_conf_page_bytes(p));
}

uint64_t kvp_conf_meta_bytes(const struct kvp_pool_conf *p)
{
	uint64_t pages = p->host_pages + (p->device == KVP_DEVICE_NONE ? 0 : p->device_pages);

	return mul_sat(pages, KVP_BUDGET_PAGE_META_BYTES(p->page_tokens));
}

static void pool_share(const struct kvp_pool_conf *p, struct share *s)
{
	memset(s, 0, sizeof(*s));
	s->meta = kvp_conf_meta_bytes(p);
	s->host = kvp_conf_host_bytes(p);
	s->sim = p->device == KVP_DEVICE_SIM ? kvp_conf_device_bytes(p) : 0;
	if (p->hugepages == KVP_ON)
		s->huge = s->host;
	else
		s->normal = s->host;
	s->normal = add_sat(s->normal, s->sim);
	if (p->mlock != KVP_OFF)
		s->lock = add_sat(s->host, s->sim);
	s->node = p->numa_node < 0 ? 0 : p->numa_node;
}

static unsigned share_tiers(const struct share *s, bool with_host)
{
	return (with_host && s->host ? KVP_BUDGET_TIER_HOST : 0) |
	       (s->sim ? KVP_BUDGET_TIER_SIM : 0);
}

static void verdict(struct kvp_budget_verdict *v, enum kvp_budget_limit limit, const char *pool,
		    uint64_t requested, uint64_t mine, uint64_t available, int node, unsigned tiers)
{
	v->limit = limit;
	snprintf(v->pool, sizeof(v->pool), "%s", pool);
	v->requested = requested;
	v->earlier = requested - mine;
	v->available = available;
	v->numa_node = node;
	v->tiers = tiers;
}

/* The machine's numbers a check of c needs, read once. */
struct readings {
	uint64_t mem, cgroup, huge, lock;
	int nodes[KVP_MAX_POOLS];
	uint64_t node_free[KVP_MAX_POOLS];
	int n_nodes;
};

static int node_index(const struct readings *r, int node)
{
	for (int i = 0; i < r->n_nodes; i++)
		if (r->nodes[i] == node)
			return i;
	return -1;
}

/* Reads what the shares need. Returns 0, -ENODEV with *bad_pool set, or a reader's error. */
static int read_limits(const struct kvp_conf *c, const struct share *sh,
		       const struct kvp_budget_env *env, struct readings *r, int *bad_pool)
{
	bool need_normal = false, need_huge = false, need_lock = false;
	int max_node = -1;
	int ret;

	r->mem = r->cgroup = r->huge = r->lock = UINT64_MAX;
	r->n_nodes = 0;
	for (uint32_t i = 0; i < c->n_pools; i++) {
		need_normal |= sh[i].normal > 0 || sh[i].meta > 0;
		need_huge |= sh[i].huge > 0;
		need_lock |= sh[i].lock > 0;
		if (!sh[i].normal && !sh[i].huge)
			continue;
		if (max_node < 0)
			max_node = env->numa_max_node(env->ctx);
		if (sh[i].node > max_node) {
			*bad_pool = (int)i;
			return -ENODEV;
		}
		if (!sh[i].normal || node_index(r, sh[i].node) >= 0)
			continue;
		ret = env->numa_node_free(env->ctx, sh[i].node, &r->node_free[r->n_nodes]);
		if (ret == -ENOENT) {
			*bad_pool = (int)i;
			return -ENODEV;
		}
		if (ret < 0)
			return ret;
		r->nodes[r->n_nodes++] = sh[i].node;
	}
	if (need_normal && ((ret = env->mem_available(env->ctx, &r->mem)) < 0 ||
			    (ret = env->cgroup_room(env->ctx, &r->cgroup)) < 0))
		return ret;
	if (need_huge && (ret = env->hugepages_free(env->ctx, &r->huge)) < 0)
		return ret;
	if (need_lock && (ret = env->memlock_room(env->ctx, &r->lock)) < 0)
		return ret;
	return 0;
}

int kvp_budget_check(const struct kvp_conf *c, const struct kvp_budget_env *env,
		     struct kvp_budget_verdict *v)
{
	struct share sh[KVP_MAX_POOLS];
	struct readings r;
	struct kvp_budget_verdict out;
	uint64_t mem = 0, huge = 0, lock_on = 0, lock_all = 0, meta = 0;
	int bad = -1;
	int ret;

	if (!c || !env || !v || c->n_pools > KVP_MAX_POOLS)
		return -EINVAL;
	for (uint32_t i = 0; i < c->n_pools; i++)
		pool_share(&c->pools[i], &sh[i]);

	memset(&out, 0, sizeof(out));
	out.numa_node = -1;
	ret = read_limits(c, sh, env, &r, &bad);
	if (ret == -ENODEV) {
		snprintf(out.pool, sizeof(out.pool), "%s", c->pools[bad].name);
		out.numa_node = sh[bad].node;
		*v = out;
		return ret;
	}
	if (ret < 0)
		return ret;

	for (uint32_t i = 0; i < c->n_pools; i++) {
		const struct share *s = &sh[i];
		const char *name = c->pools[i].name;
		uint64_t node = 0;

		mem = add_sat(mem, s->normal);
		meta = add_sat(meta, s->meta);
		out.metadata = meta;
		huge = add_sat(huge, s->huge);
		lock_all = add_sat(lock_all, s->lock);
		if (c->pools[i].mlock == KVP_ON)
			lock_on = add_sat(lock_on, s->lock);
		for (uint32_t j = 0; j <= i; j++)
			if (sh[j].node == s->node)
				node = add_sat(node, sh[j].normal);

		if ((s->normal || s->meta) && add_sat(mem, meta) > r.mem) {
			verdict(&out, KVP_BUDGET_MEM_AVAILABLE, name, mem, s->normal, r.mem, -1,
				share_tiers(s, !s->huge));
			break;
		}
		if ((s->normal || s->meta) && add_sat(mem, meta) > r.cgroup) {
			verdict(&out, KVP_BUDGET_CGROUP_MEMORY_MAX, name, mem, s->normal, r.cgroup,
				-1, share_tiers(s, !s->huge));
			break;
		}
		if (s->normal && node > r.node_free[node_index(&r, s->node)]) {
			verdict(&out, KVP_BUDGET_NUMA_NODE_FREE, name, node, s->normal,
				r.node_free[node_index(&r, s->node)], s->node,
				share_tiers(s, !s->huge));
			break;
		}
		if (s->huge && huge > r.huge) {
			verdict(&out, KVP_BUDGET_HUGEPAGES_FREE, name, huge, s->huge, r.huge, -1,
				KVP_BUDGET_TIER_HOST);
			break;
		}
		if (c->pools[i].mlock == KVP_ON && s->lock && lock_on > r.lock) {
			verdict(&out, KVP_BUDGET_RLIMIT_MEMLOCK, name, lock_on, s->lock, r.lock, -1,
				share_tiers(s, true));
			break;
		}
		if (c->pools[i].mlock == KVP_TRY && s->lock && lock_all > r.lock &&
		    !out.warning[0]) {
			char want[32], room[32];

			kvp_units_bytes(lock_all, want, sizeof(want));
			kvp_units_bytes(r.lock, room, sizeof(room));
			snprintf(out.warning, sizeof(out.warning),
				 "pool %s: mlock = try: %s would be locked but RLIMIT_MEMLOCK "
				 "allows %s; the rest stays unlocked",
				 name, want, room);
		}
	}
	*v = out;
	return out.limit == KVP_BUDGET_NONE ? 0 : -ENOMEM;
}

/* Lowers *room to x, naming limit, when x is lower. */
static void room_min(struct kvp_budget_room *room, uint64_t x, enum kvp_budget_limit limit)
{
	if (x < room->bytes) {
		room->bytes = x;
		room->limit = limit;
	}
}

int kvp_budget_room(const struct kvp_pool_conf *p, const struct kvp_budget_env *env,
		    struct kvp_budget_room *out)
{
	struct kvp_budget_room room = { .bytes = UINT64_MAX, .limit = KVP_BUDGET_NONE };
	uint64_t x;
	int ret;

	if (!p || !env || !out)
		return -EINVAL;
	room.numa_node = p->numa_node < 0 ? 0 : p->numa_node;
	if (p->hugepages == KVP_ON) {
		if ((ret = env->hugepages_free(env->ctx, &x)) < 0)
			return ret;
		room_min(&room, x, KVP_BUDGET_HUGEPAGES_FREE);
	} else {
		if ((ret = env->mem_available(env->ctx, &x)) < 0)
			return ret;
		room_min(&room, x, KVP_BUDGET_MEM_AVAILABLE);
		if ((ret = env->cgroup_room(env->ctx, &x)) < 0)
			return ret;
		room_min(&room, x, KVP_BUDGET_CGROUP_MEMORY_MAX);
		if ((ret = env->numa_node_free(env->ctx, room.numa_node, &x)) < 0)
			return ret;
		room_min(&room, x, KVP_BUDGET_NUMA_NODE_FREE);
	}
	if (p->mlock == KVP_ON) {
		if ((ret = env->memlock_room(env->ctx, &x)) < 0)
			return ret;
		room_min(&room, x, KVP_BUDGET_RLIMIT_MEMLOCK);
	}
	*out = room;
	return 0;
}

const char *kvp_budget_limit_name(enum kvp_budget_limit l)
{
	static const char *const names[KVP_BUDGET_MAX] = {
		[KVP_BUDGET_NONE] = "none",
		[KVP_BUDGET_MEM_AVAILABLE] = "MemAvailable",
		[KVP_BUDGET_NUMA_NODE_FREE] = "NUMA node free memory",
		[KVP_BUDGET_CGROUP_MEMORY_MAX] = "cgroup memory.max",
		[KVP_BUDGET_RLIMIT_MEMLOCK] = "RLIMIT_MEMLOCK",
		[KVP_BUDGET_HUGEPAGES_FREE] = "free huge pages",
	};

	return (unsigned)l < KVP_BUDGET_MAX ? names[l] : "?";
}

int kvp_budget_format(const struct kvp_budget_verdict *v, char *buf, size_t len)
{
	char limit[64], req[32], avail[32], meta[32], earlier[32];
	char before[80] = "";
	const char *what;

	if (v->limit == KVP_BUDGET_NONE) {
		if (v->pool[0])
			return snprintf(buf, len, "pool %s: NUMA node %d does not exist", v->pool,
					v->numa_node);
		return snprintf(buf, len, "all pools fit in host memory");
	}
	if (v->tiers == (KVP_BUDGET_TIER_HOST | KVP_BUDGET_TIER_SIM))
		what = "host and sim device tiers need";
	else if (v->tiers == KVP_BUDGET_TIER_SIM)
		what = "sim device tier needs";
	else
		what = "host tier needs";
	if (v->limit == KVP_BUDGET_NUMA_NODE_FREE)
		snprintf(limit, sizeof(limit), "NUMA node %d free memory", v->numa_node);
	else
		snprintf(limit, sizeof(limit), "%s", kvp_budget_limit_name(v->limit));
	kvp_units_bytes(v->requested, req, sizeof(req));
	kvp_units_bytes(v->available, avail, sizeof(avail));
	kvp_units_bytes(v->metadata, meta, sizeof(meta));
	if (v->earlier) {
		kvp_units_bytes(v->earlier, earlier, sizeof(earlier));
		snprintf(before, sizeof(before), " (with %s for the pools before it)", earlier);
	}
	if (v->metadata && v->requested <= v->available)
		return snprintf(buf, len,
				"pool %s: %s %s%s and %s of kvpoold's bookkeeping for the "
				"pools' pages, but only %s is available (%s)",
				v->pool, what, req, before, meta, avail, limit);
	return snprintf(buf, len, "pool %s: %s %s%s but only %s is available (%s)", v->pool, what,
			req, before, avail, limit);
}

/* ---- the system readers ---- */

/* Finds "key" at the start of a line (after an optional "Node N " prefix, as in the per-node
 * meminfo files) in path and reads the number after it. Returns 0, -ENOENT, -errno. */
static int read_field(const char *path, const char *key, uint64_t *out)
{
	char line[256];
	size_t klen = strlen(key);
	FILE *f = fopen(path, "re");
	int ret = -ENOENT;

	if (!f)
		return -errno;
	while (fgets(line, sizeof(line), f)) {
		char *p = line;
		char *end;
		unsigned long long x;

		if (strncmp(p, "Node ", 5) == 0) {
			p += 5;
			while (*p && *p != ' ')
				p++;
			while (*p == ' ')
				p++;
		}
		if (strncmp(p, key, klen) != 0)
			continue;
		errno = 0;
		x = strtoull(p + klen, &end, 10);
		if (errno || end == p + klen) {
			ret = -EIO;
			break;
		}
		*out = x;
		ret = 0;
		break;
	}
	fclose(f);
	return ret;
}

/* Reads a one-line file holding a number or "max" (UINT64_MAX). */
static int read_number_file(const char *path, uint64_t *out)
{
	char buf[64];
	FILE *f = fopen(path, "re");
	char *end;
	unsigned long long x;

	if (!f)
		return -errno;
	if (!fgets(buf, sizeof(buf), f)) {
		fclose(f);
		return -EIO;
	}
	fclose(f);
	if (strncmp(buf, "max", 3) == 0) {
		*out = UINT64_MAX;
		return 0;
	}
	errno = 0;
	x = strtoull(buf, &end, 10);
	if (errno || end == buf)
		return -EIO;
	*out = x;
	return 0;
}

static int sys_mem_available(void *ctx, uint64_t *bytes)
{
	uint64_t kb;
	int ret = read_field("/proc/meminfo", "MemAvailable:", &kb);

	(void)ctx;
	if (ret < 0)
		return ret;
	*bytes = mul_sat(kb, 1024);
	return 0;
}

static int sys_numa_max_node(void *ctx)
{
	(void)ctx;
	return numa_available() < 0 ? 0 : numa_max_node();
}

/* Free memory of the node plus what the kernel reclaims there on demand (file pages and
 * reclaimable slab): the node's counterpart of MemAvailable. MemFree alone would refuse
 * memory that page cache (model weights just read, say) holds only until asked. */
static int sys_numa_node_free(void *ctx, int node, uint64_t *bytes)
{
	static const char *const reclaimable[] = { "Active(file):", "Inactive(file):",
						   "SReclaimable:" };
	char path[96];
	long long free_bytes = 0;
	uint64_t sum, kb;

	(void)ctx;
	if (numa_available() < 0) {
		if (node != 0)
			return -ENOENT;
		*bytes = UINT64_MAX; /* no NUMA: MemAvailable covers it */
		return 0;
	}
	if (node < 0 || node > numa_max_node() || numa_node_size64(node, &free_bytes) < 0)
		return -ENOENT;
	sum = free_bytes > 0 ? (uint64_t)free_bytes : 0;
	snprintf(path, sizeof(path), "/sys/devices/system/node/node%d/meminfo", node);
	for (size_t i = 0; i < sizeof(reclaimable) / sizeof(reclaimable[0]); i++)
		if (read_field(path, reclaimable[i], &kb) == 0)
			sum = add_sat(sum, mul_sat(kb, 1024));
	*bytes = sum;
	return 0;
}

static int sys_cgroup_room(void *ctx, uint64_t *bytes)
{
	char line[512];
	char dir[768];
	char file[800];
	uint64_t room = UINT64_MAX;
	FILE *f = fopen("/proc/self/cgroup", "re");
	bool found = false;
	char *slash;

	(void)ctx;
	if (!f) {
		*bytes = UINT64_MAX; /* no cgroups at all */
		return 0;
	}
	while (fgets(line, sizeof(line), f)) {
		if (strncmp(line, "0::", 3) == 0) {
			line[strcspn(line, "\n")] = '\0';
			found = true;
			break;
		}
	}
	fclose(f);
	if (!found) {
		*bytes = UINT64_MAX; /* cgroup v1 only: not checked */
		return 0;
	}
	snprintf(dir, sizeof(dir), "/sys/fs/cgroup%s", strcmp(line + 3, "/") ? line + 3 : "");
	/* The cgroup and every ancestor up to the mount point may limit us. */
	for (;;) {
		uint64_t max, cur;

		snprintf(file, sizeof(file), "%s/memory.max", dir);
		if (read_number_file(file, &max) == 0 && max != UINT64_MAX) {
			snprintf(file, sizeof(file), "%s/memory.current", dir);
			if (read_number_file(file, &cur) == 0) {
				uint64_t r = max > cur ? max - cur : 0;

				if (r < room)
					room = r;
			}
		}
		if (strcmp(dir, "/sys/fs/cgroup") == 0)
			break;
		slash = strrchr(dir, '/');
		if (!slash || slash == dir)
			break;
		*slash = '\0';
	}
	*bytes = room;
	return 0;
}

static bool has_cap_ipc_lock(void)
{
	uint64_t caps = 0;
	char line[256];
	FILE *f = fopen("/proc/self/status", "re");

	if (!f)
		return false;
	while (fgets(line, sizeof(line), f))
		if (strncmp(line, "CapEff:", 7) == 0)
			caps = strtoull(line + 7, NULL, 16);
	fclose(f);
	return caps & (1ull << CAP_IPC_LOCK_BIT);
}

static int sys_memlock_room(void *ctx, uint64_t *bytes)
{
	struct rlimit rl;
	uint64_t locked_kb = 0;

	(void)ctx;
	if (getrlimit(RLIMIT_MEMLOCK, &rl) < 0)
		return -errno;
	if (rl.rlim_cur == RLIM_INFINITY || has_cap_ipc_lock()) {
		*bytes = UINT64_MAX;
		return 0;
	}
	read_field("/proc/self/status", "VmLck:", &locked_kb);
	locked_kb = mul_sat(locked_kb, 1024);
	*bytes = rl.rlim_cur > locked_kb ? rl.rlim_cur - locked_kb : 0;
	return 0;
}

static int sys_hugepages_free(void *ctx, uint64_t *bytes)
{
	uint64_t n, kb;
	int ret;

	(void)ctx;
	ret = read_field("/proc/meminfo", "HugePages_Free:", &n);
	if (ret == 0)
		ret = read_field("/proc/meminfo", "Hugepagesize:", &kb);
	if (ret == -ENOENT) {
		*bytes = 0; /* a kernel without hugetlb */
		return 0;
	}
	if (ret < 0)
		return ret;
	*bytes = mul_sat(n, mul_sat(kb, 1024));
	return 0;
}

static const struct kvp_budget_env g_system_env = {
	.mem_available = sys_mem_available,
	.numa_node_free = sys_numa_node_free,
	.cgroup_room = sys_cgroup_room,
	.memlock_room = sys_memlock_room,
	.hugepages_free = sys_hugepages_free,
	.numa_max_node = sys_numa_max_node,
	.ctx = NULL,
};

const struct kvp_budget_env *kvp_budget_env_system(void)
{
	return &g_system_env;
}
