/* budget.h - host memory budget check of all configured pools, before any pool memory exists. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"

enum kvp_budget_limit {
	KVP_BUDGET_NONE,
	KVP_BUDGET_MEM_AVAILABLE,
	KVP_BUDGET_NUMA_NODE_FREE,
	KVP_BUDGET_CGROUP_MEMORY_MAX,
	KVP_BUDGET_RLIMIT_MEMLOCK,
	KVP_BUDGET_HUGEPAGES_FREE,
	KVP_BUDGET_MAX,
};

/* Where the check reads the machine: one seam, so unit tests pass fake numbers.
 * Each reader returns 0 and writes *bytes, or a negative errno. UINT64_MAX means "no limit". */
struct kvp_budget_env {
	/* MemAvailable of /proc/meminfo. */
	int (*mem_available)(void *ctx, uint64_t *bytes);
	/* Free memory of one NUMA node; -ENOENT for a node that does not exist. */
	int (*numa_node_free)(void *ctx, int node, uint64_t *bytes);
	/* Least memory.max - memory.current of the process's cgroup v2 and its ancestors
	 * (0 when current > max); UINT64_MAX when none has a limit or there is no cgroup v2. */
	int (*cgroup_room)(void *ctx, uint64_t *bytes);
	/* RLIMIT_MEMLOCK minus what is already locked; UINT64_MAX when the limit is infinity or
	 * the process has CAP_IPC_LOCK. */
	int (*memlock_room)(void *ctx, uint64_t *bytes);
	/* HugePages_Free * Hugepagesize. */
	int (*hugepages_free)(void *ctx, uint64_t *bytes);
	/* Highest NUMA node number; 0 on a machine without NUMA. */
	int (*numa_max_node)(void *ctx);
	void *ctx;
};

/* The readers of this machine: /proc/meminfo, libnuma (numa_node_size64) plus the node's
 * reclaimable page cache and slab from /sys/devices/system/node/nodeN/meminfo, /proc/self/cgroup
 * and /sys/fs/cgroup, getrlimit and /proc/self/status. Never NULL. */
const struct kvp_budget_env *kvp_budget_env_system(void);

/* What the node still gives a pool's host tier, read now (the tier's own pages are already
 * counted by the readings): the least of the limits its pages are subject to, as
 * kvp_budget_check applies them: MemAvailable, cgroup memory.max and its NUMA node's free memory
 * for normal pages, free huge pages for hugepages = on, RLIMIT_MEMLOCK for mlock = on. */
struct kvp_budget_room {
	uint64_t bytes;		     /* UINT64_MAX: no limit binds */
	enum kvp_budget_limit limit; /* the one that binds; KVP_BUDGET_NONE when none does */
	int numa_node;		     /* the pool's node */
};

/* The room of p's host tier into *out. Returns 0, or a reader's negative errno (-ENOENT for a
 * NUMA node that does not exist) with *out untouched. */
int kvp_budget_room(const struct kvp_pool_conf *p, const struct kvp_budget_env *env,
		    struct kvp_budget_room *out);

/* Which tiers made up a pool's share in a verdict. */
#define KVP_BUDGET_TIER_HOST 1u
#define KVP_BUDGET_TIER_SIM 2u

struct kvp_budget_verdict {
	enum kvp_budget_limit limit; /* KVP_BUDGET_NONE when everything fits */
	char pool[KVP_POOL_NAME_MAX];
	uint64_t requested; /* bytes this limit sees up to and including pool */
	uint64_t earlier;   /* the part of requested that pools before it need */
	uint64_t available; /* what the limit allows */
	int numa_node;	    /* the node, for KVP_BUDGET_NUMA_NODE_FREE; else -1 */
	unsigned tiers;	    /* KVP_BUDGET_TIER_* of pool's share */
	char warning[256];  /* a limit that only warns (mlock = try); "" when none */
	/* kvpoold's own bookkeeping of the pages of the pools up to and including pool
	 * (kvp_conf_meta_bytes), checked on top of requested against MemAvailable and cgroup
	 * memory.max. */
	uint64_t metadata;
};

/* Host bytes kvpoold keeps per page of a pool, on top of the page, whatever its tier:
 * - pages.c: a free-stack slot (uint32) and a state byte;
 * - pool.h: lease_of (uint64) and lease_idx (uint32);
 * - a lease's page array: a uint32 per leased page, up to twice that as it grows;
 * - prefix.c, per cached page: its tokens (page_tokens uint32) and its page id in a node, and,
 *   in the worst case a client can force (one node per page), the node itself, its malloc
 *   header and two hash-bucket slots: KVP_BUDGET_NODE_BYTES.
 * tests/unit/test_budget_meta.c measures each part against the real structures. */
#define KVP_BUDGET_PAGE_FIXED_BYTES 25u
#define KVP_BUDGET_NODE_BYTES 192u
/* Per page of a pool of page_tokens tokens per page. */
#define KVP_BUDGET_PAGE_META_BYTES(page_tokens)                                                    \
	(KVP_BUDGET_PAGE_FIXED_BYTES + 4u * (uint64_t)(page_tokens) + 4u + KVP_BUDGET_NODE_BYTES)

/* kvpoold's bookkeeping for all pages of p (both tiers, any backend). */
uint64_t kvp_conf_meta_bytes(const struct kvp_pool_conf *p);

/* Host-resident bytes of the host tier: host_pages * page bytes. */
uint64_t kvp_conf_host_bytes(const struct kvp_pool_conf *p);
/* Bytes of the device tier (device_pages * page bytes) whatever its backend; host memory only
 * for KVP_DEVICE_SIM. */
uint64_t kvp_conf_device_bytes(const struct kvp_pool_conf *p);

/* Checks that every pool of c fits, all together, in what the host allows.
 *
 * What counts: a pool's host-resident bytes are its host tier plus, for device = sim, its
 * device tier (a memfd in host memory like the host tier: same node, same mlock setting,
 * never huge pages). Walking the pools in order, each limit sees a running sum:
 * - MemAvailable and cgroup memory.max: all host-resident bytes except a hugepages = on host
 *   tier (hugetlb memory is neither in MemAvailable nor charged to memory.max);
 * - NUMA node free memory: the same bytes, summed per node. numa_node = auto counts as node
 *   0: for a cuda pool the daemon knows the GPU's node and may write it into numa_node of the
 *   copy it passes here. The node must exist when the pool has host-resident bytes;
 * - free huge pages: host tiers with hugepages = on (try falls back to normal pages, which
 *   the limits above count);
 * - RLIMIT_MEMLOCK: host-resident bytes of mlock = on pools. mlock = try pools only warn
 *   (in v->warning) when on + try pools together exceed it: the daemon locks on pools first.
 * - kvpoold's own per-page bookkeeping (kvp_conf_meta_bytes, every tier of every pool) is
 *   counted on top against MemAvailable and cgroup memory.max, in v->metadata.
 * At the first pool where a running sum exceeds its limit, the limit binds; when several do
 * at that pool, the first in the order above. Limits no pool needs are not read.
 *
 * Returns 0 when everything fits (v: limit KVP_BUDGET_NONE, maybe a warning), -ENOMEM when it
 * does not (v names the limit, the pool and the numbers), -ENODEV when a pool's numa_node does
 * not exist (v: limit KVP_BUDGET_NONE, pool and numa_node set), or a reader's negative errno
 * (v untouched). */
int kvp_budget_check(const struct kvp_conf *c, const struct kvp_budget_env *env,
		     struct kvp_budget_verdict *v);

/* "MemAvailable", "NUMA node free memory", "cgroup memory.max", "RLIMIT_MEMLOCK",
 * "free huge pages"; "none" for KVP_BUDGET_NONE, "?" out of range. */
const char *kvp_budget_limit_name(enum kvp_budget_limit l);

/* Writes one line explaining v, with GB = 1e9 bytes and 2 decimals:
 * "pool llama3-8b: host tier needs 68.72 GB but only 41.30 GB is available (NUMA node 0 free
 * memory)". With earlier pools in the sum: "... needs 68.72 GB (with 20.00 GB for the pools
 * before it) but ...". When the tiers alone fit and the bookkeeping makes the difference:
 * "pool tiny: sim device tier needs 0.40 GB and 45.00 GB of kvpoold's bookkeeping for the
 * pools' pages, but only 21.47 GB is available (MemAvailable)". Returns what snprintf
 * returns. */
int kvp_budget_format(const struct kvp_budget_verdict *v, char *buf, size_t len);

/* Records of the disk tier's log (daemon/disk/disk_log.h) in one 4 KiB block. */
#define KVP_DISK_LOG_RECS 42u
/* Bytes of the log region after the slots of a disk tier of `pages` pages: room for four
 * checkpoints of every page, and 64 blocks more (256 KiB), in 4 KiB blocks. */
uint64_t kvp_conf_disk_log_bytes(uint64_t pages);
/* Bytes of p's disk tier on its disk: disk_pages * (page bytes rounded up to 4 KiB + a 4 KiB
 * header), and its log; 0 for disk = off. */
uint64_t kvp_conf_disk_bytes(const struct kvp_pool_conf *p);
/* Checks that every pool's disk tier fits where disk_path points: a block device holds its region
 * (disk_offset plus kvp_conf_disk_bytes), a file's filesystem (all the pools' files on it
 * together) the free space still to allocate; and that pools on one disk (one block device, one
 * file) have disjoint regions. 0; -ENOSPC (line names the pool and the binding limit,
 * DISK_DEVICE_SIZE or DISK_FREE_SPACE); -EEXIST (two regions overlap: DISK_REGION_OVERLAP, both
 * pools and regions named); or a negative errno of a path that cannot be read (DISK_PATH). */
int kvp_budget_disk_check(const struct kvp_conf *c, char *line, size_t len);
