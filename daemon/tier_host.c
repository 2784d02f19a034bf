/* tier_host.c - host tier memory: sealed memfd, NUMA-bound, locked, pre-faulted. */
#include "tier.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/memfd.h>
#include <linux/mman.h>
#include <numa.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "log.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

#define HUGE_2M (2ull << 20)

static void prefault(void *base, uint64_t bytes)
{
	long pg = sysconf(_SC_PAGESIZE);

	if (madvise(base, bytes, MADV_POPULATE_WRITE) == 0)
		return;
	for (uint64_t off = 0; off < bytes; off += (uint64_t)pg)
		((volatile char *)base)[off] = 0;
}

static int memfd_open(const char *name, uint64_t bytes, bool huge)
{
	unsigned flags = MFD_CLOEXEC | MFD_ALLOW_SEALING | (huge ? MFD_HUGETLB | MFD_HUGE_2MB : 0);
	int fd = memfd_create(name, flags);

	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t)bytes) < 0) {
		int e = -errno;

		close(fd);
		return e;
	}
	return fd;
}

int kvp_tier_memfd_create(struct kvp_tier_mem *t, const char *name, uint64_t bytes, int numa_node,
			  int hugepages, int mlock_opt, char *note, size_t notelen, struct kvp_fail *f)
{
	char mname[96];
	bool huge = hugepages != KVP_OPT_OFF;
	uint64_t size = bytes;
	int fd;

	memset(t, 0, sizeof(*t));
	t->fd = -1;
	t->numa_node = -1;
	t->cuda_device = -1;
	t->backend = KVPOOL__BACKEND__MEMFD;
	if (note && notelen)
		note[0] = 0;
	snprintf(mname, sizeof(mname), "kvpool:%s", name);
	if (huge) {
		size = (bytes + HUGE_2M - 1) / HUGE_2M * HUGE_2M;
		fd = memfd_open(mname, size, true);
		if (fd < 0 && hugepages == KVP_OPT_ON)
			return kvp_fail(f, KVPOOL__CODE__HOST_BUDGET_EXCEEDED,
					"%s: hugepages = on but a huge-page memfd of %lu bytes failed: %s",
					name, (unsigned long)size, strerror(-fd));
		if (fd < 0) {
			if (note)
				snprintf(note, notelen, "huge pages unavailable (%s), using 4 KiB pages",
					 strerror(-fd));
			huge = false;
			size = bytes;
		}
	}
	if (!huge)
		fd = memfd_open(mname, size, false);
	if (fd < 0)
		return kvp_fail(f, KVPOOL__CODE__INTERNAL, "%s: memfd of %lu bytes: %s", name,
				(unsigned long)size, strerror(-fd));
	/* Sealed: no client can shrink the file under the daemon's mapping (SIGBUS). */
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
		int e = errno;

		close(fd);
		return kvp_fail(f, KVPOOL__CODE__INTERNAL, "%s: sealing memfd: %s", name, strerror(e));
	}
	t->base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (t->base == MAP_FAILED) {
		int e = errno;

		t->base = NULL;
		close(fd);
		return kvp_fail(f, KVPOOL__CODE__INTERNAL, "%s: mmap %lu bytes: %s", name,
				(unsigned long)size, strerror(e));
	}
	t->fd = fd;
	t->bytes = size;
	t->huge = huge;
	if (numa_node >= 0 && numa_available() >= 0 && numa_node <= numa_max_node()) {
		numa_tonode_memory(t->base, size, numa_node);
		t->numa_node = numa_node;
	}
	if (mlock_opt != KVP_OPT_OFF) {
		if (mlock(t->base, size) == 0) {
			t->locked = true;
		} else if (mlock_opt == KVP_OPT_ON) {
			int e = errno;

			kvp_tier_mem_destroy(t);
			return kvp_fail(f, KVPOOL__CODE__HOST_BUDGET_EXCEEDED,
					"%s: mlock of %lu bytes failed (%s): raise RLIMIT_MEMLOCK "
					"(LimitMEMLOCK=infinity) or set mlock = try",
					name, (unsigned long)size, strerror(e));
		} else if (note && !note[0]) {
			snprintf(note, notelen, "not locked (mlock: %s; RLIMIT_MEMLOCK too low)",
				 strerror(errno));
		}
	}
	if (!t->locked)
		prefault(t->base, size);
	return 0;
}

int kvp_tier_sim_create(struct kvp_tier_mem *t, const char *name, uint64_t bytes, int numa_node,
			struct kvp_fail *f)
{
	int r = kvp_tier_memfd_create(t, name, bytes, numa_node, KVP_OPT_OFF, KVP_OPT_OFF, NULL, 0,
				      f);

	if (r == 0)
		t->backend = KVPOOL__BACKEND__SIM;
	return r;
}

void kvp_tier_mem_destroy(struct kvp_tier_mem *t)
{
	if (t->backend == KVPOOL__BACKEND__CUDA) {
		kvp_tier_cuda_destroy(t);
	} else {
		if (t->base)
			munmap(t->base, t->bytes);
		if (t->fd >= 0)
			close(t->fd);
	}
	t->base = NULL;
	t->fd = -1;
	t->backend = KVPOOL__BACKEND__BACKEND_NONE;
}
