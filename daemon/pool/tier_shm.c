/* tier_shm.c - sealed shared memfds for the memfd and sim backends: created (NUMA-bound, locked,
 * pre-faulted) or adopted from an existing fd (checked, never pre-faulted nor zeroed). */
#include "tier_shm.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <linux/memfd.h>
#include <linux/mman.h>
#include <numa.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

#define HUGE_2M (2ull << 20)
#define SIZE_SEALS (F_SEAL_SHRINK | F_SEAL_GROW)

/* Faults in 32 MiB at a time, so a signal that stops kvpoold (SIGTERM at start-up) is taken
 * between pieces instead of after many gigabytes. */
#define PREFAULT_STEP (32ull << 20)

static void prefault(void *base, uint64_t bytes)
{
	long pg = sysconf(_SC_PAGESIZE);

	for (uint64_t off = 0; off < bytes; off += PREFAULT_STEP) {
		uint64_t n = bytes - off < PREFAULT_STEP ? bytes - off : PREFAULT_STEP;

		if (madvise((char *)base + off, n, MADV_POPULATE_WRITE) == 0)
			continue;
		for (uint64_t o = off; o < bytes; o += (uint64_t)pg)
			((volatile char *)base)[o] = 0;
		return;
	}
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

/* The NUMA binding and the lock both create and adopt apply to t's mapping. A failed lock under
 * ON fails (the caller undoes the mapping). */
static int bind_and_lock(struct kvp_tier_mem *t, const struct kvp_tier_spec *s, char *note,
			 size_t notelen, struct kvp_tier_fail *tf)
{
	if (s->numa_node >= 0 && numa_available() >= 0 && s->numa_node <= numa_max_node()) {
		numa_tonode_memory(t->base, t->bytes, s->numa_node);
		t->numa_node = s->numa_node;
	}
	if (s->mlock == KVP_OPT_OFF)
		return 0;
	if (mlock(t->base, t->bytes) == 0) {
		t->locked = true;
	} else if (s->mlock == KVP_OPT_ON) {
		return kvp_tier_err(tf, KVP_TIER_E_BUDGET,
				    "%s: mlock of %lu bytes failed (%s): raise RLIMIT_MEMLOCK "
				    "(LimitMEMLOCK=infinity) or set mlock = try",
				    s->name, (unsigned long)t->bytes, strerror(errno));
	} else if (note && !note[0]) {
		snprintf(note, notelen, "not locked (mlock: %s; RLIMIT_MEMLOCK too low)",
			 strerror(errno));
	}
	return 0;
}

static int map_shared(struct kvp_tier_mem *t, int fd, uint64_t bytes, const char *name,
		      struct kvp_tier_fail *tf)
{
	void *base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);

	if (base == MAP_FAILED)
		return kvp_tier_err(tf, KVP_TIER_E_INTERNAL, "%s: mmap %lu bytes: %s", name,
				    (unsigned long)bytes, strerror(errno));
	t->base = base;
	t->fd = fd;
	t->bytes = bytes;
	return 0;
}

int kvp_tier_shm_create(struct kvp_tier_mem *t, const struct kvp_tier_spec *s, char *note,
			size_t notelen, struct kvp_tier_fail *tf)
{
	char mname[96];
	bool huge = s->hugepages != KVP_OPT_OFF;
	uint64_t size = s->bytes;
	int fd = -1, r;

	kvp_tier_mem_init(t);
	if (note && notelen)
		note[0] = 0;
	if (!s->bytes)
		return kvp_tier_err(tf, KVP_TIER_E_INVALID, "%s: a tier of 0 bytes", s->name);
	snprintf(mname, sizeof(mname), "kvpool:%s", s->name);
	if (huge) {
		size = (s->bytes + HUGE_2M - 1) / HUGE_2M * HUGE_2M;
		fd = memfd_open(mname, size, true);
		if (fd < 0 && s->hugepages == KVP_OPT_ON)
			return kvp_tier_err(
				tf, KVP_TIER_E_BUDGET,
				"%s: hugepages = on but a huge-page memfd of %lu bytes failed: %s",
				s->name, (unsigned long)size, strerror(-fd));
		if (fd < 0) {
			if (note)
				snprintf(note, notelen,
					 "huge pages unavailable (%s), using 4 KiB pages",
					 strerror(-fd));
			huge = false;
			size = s->bytes;
		}
	}
	if (!huge)
		fd = memfd_open(mname, size, false);
	if (fd < 0)
		return kvp_tier_err(tf, KVP_TIER_E_INTERNAL, "%s: memfd of %lu bytes: %s", s->name,
				    (unsigned long)size, strerror(-fd));
	/* Sealed: no client can shrink the file under the daemon's mapping (SIGBUS). */
	if (fcntl(fd, F_ADD_SEALS, SIZE_SEALS | F_SEAL_SEAL) < 0) {
		int e = errno;

		close(fd);
		return kvp_tier_err(tf, KVP_TIER_E_INTERNAL, "%s: sealing memfd: %s", s->name,
				    strerror(e));
	}
	r = map_shared(t, fd, size, s->name, tf);
	if (r < 0) {
		close(fd);
		return r;
	}
	t->huge = huge;
	r = bind_and_lock(t, s, note, notelen, tf);
	if (r < 0) {
		kvp_tier_shm_destroy(t);
		return r;
	}
	if (!t->locked)
		prefault(t->base, size);
	return 0;
}

int kvp_tier_shm_adopt(struct kvp_tier_mem *t, int fd, const struct kvp_tier_spec *s,
		       struct kvp_tier_fail *tf)
{
	struct statfs sfs;
	struct stat st;
	int seals, r;

	kvp_tier_mem_init(t);
	if (fd < 0 || !s->bytes)
		return kvp_tier_err(tf, KVP_TIER_E_INVALID, "%s: adopting needs an fd and a size",
				    s->name);
	if (fstat(fd, &st) < 0)
		return kvp_tier_err(tf, KVP_TIER_E_BAD_FD, "%s: fd %d: %s", s->name, fd,
				    strerror(errno));
	seals = S_ISREG(st.st_mode) ? fcntl(fd, F_GET_SEALS) : -1;
	if (seals < 0)
		return kvp_tier_err(tf, KVP_TIER_E_BAD_FD, "%s: fd %d is not a memfd", s->name, fd);
	if ((uint64_t)st.st_size != s->bytes)
		return kvp_tier_err(tf, KVP_TIER_E_SIZE, "%s: fd %d holds %lu bytes, the tier %lu",
				    s->name, fd, (unsigned long)st.st_size,
				    (unsigned long)s->bytes);
	if ((seals & SIZE_SEALS) != SIZE_SEALS)
		return kvp_tier_err(tf, KVP_TIER_E_SEALS,
				    "%s: fd %d is not sealed against shrinking and growing (seals "
				    "%#x): a client could make the daemon fault",
				    s->name, fd, (unsigned)seals);
	if (seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE))
		return kvp_tier_err(tf, KVP_TIER_E_SEALS, "%s: fd %d is sealed against writing",
				    s->name, fd);
	r = map_shared(t, fd, s->bytes, s->name, tf);
	if (r < 0)
		return r;
	t->huge = fstatfs(fd, &sfs) == 0 && sfs.f_type == HUGETLBFS_MAGIC;
	r = bind_and_lock(t, s, NULL, 0, tf);
	if (r < 0) {
		munmap(t->base, t->bytes);
		kvp_tier_mem_init(t); /* the fd stays the caller's */
	}
	return r;
}

void kvp_tier_shm_destroy(struct kvp_tier_mem *t)
{
	if (t->base)
		munmap(t->base, t->bytes);
	if (t->fd >= 0)
		close(t->fd);
	kvp_tier_mem_init(t);
}
