/* budget_disk.c - the disk tier's budget check (budget.h): each pool's disk_path has room for its
 * region (disk_capacity with its headers and log, from disk_offset) before any pool starts, and
 * pools on one disk have disjoint regions. */
#include "budget.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <linux/fs.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

uint64_t kvp_conf_disk_log_bytes(uint64_t pages)
{
	return (4 * ((pages + KVP_DISK_LOG_RECS - 1) / KVP_DISK_LOG_RECS) + 64) * 4096;
}

uint64_t kvp_conf_disk_bytes(const struct kvp_pool_conf *p)
{
	uint64_t page = (kvp_conf_page_bytes(p) + 4095) / 4096 * 4096 + 4096;

	return p->disk == KVP_DISK_OFF
		       ? 0
		       : p->disk_pages * page + kvp_conf_disk_log_bytes(p->disk_pages);
}

/* A block device's size: 0 or a negative errno. */
static int device_bytes(const char *path, uint64_t *out)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC), rc = 0;

	if (fd < 0)
		return -errno;
	if (ioctl(fd, BLKGETSIZE64, out) < 0)
		rc = -errno;
	close(fd);
	return rc;
}

/* Which disk a path names, so that two spellings of one disk meet: a block device by its device
 * number, a file by its inode, a path not there yet by its name. */
struct disk_id {
	int kind; /* 0 a name, 1 a block device, 2 a file */
	dev_t dev;
	ino_t ino;
	const char *path;
};

static struct disk_id disk_id_of(const char *path)
{
	struct disk_id id = { 0, 0, 0, path };
	struct stat st;

	if (stat(path, &st) == 0 && S_ISBLK(st.st_mode))
		id = (struct disk_id){ 1, st.st_rdev, 0, path };
	else if (stat(path, &st) == 0)
		id = (struct disk_id){ 2, st.st_dev, st.st_ino, path };
	return id;
}

static bool disk_id_same(const struct disk_id *a, const struct disk_id *b)
{
	if (a->kind != b->kind)
		return false;
	return a->kind == 0 ? strcmp(a->path, b->path) == 0
			    : a->dev == b->dev && (a->kind == 1 || a->ino == b->ino);
}

/* Refuses a pool whose region of its disk overlaps a region of a pool before it on the same disk:
 * 0 or -EEXIST with line filled. */
static int check_overlap(const struct kvp_conf *c, uint32_t i, const struct disk_id *ids,
			 char *line, size_t len)
{
	const struct kvp_pool_conf *p = &c->pools[i];
	uint64_t a0 = p->disk_offset, a1 = a0 + kvp_conf_disk_bytes(p);

	for (uint32_t j = 0; j < i; j++) {
		const struct kvp_pool_conf *q = &c->pools[j];
		uint64_t b0 = q->disk_offset, b1 = b0 + kvp_conf_disk_bytes(q);

		if (q->disk == KVP_DISK_OFF || !disk_id_same(&ids[i], &ids[j]) || a1 <= b0 ||
		    b1 <= a0)
			continue;
		snprintf(line, len,
			 "pool %s: its disk region [%lu, %lu) of %s overlaps pool %s's [%lu, %lu) "
			 "(disk_offset plus disk_capacity, a 4 KiB header per page and the log; "
			 "give one of them a disk_offset of at least %lu): DISK_REGION_OVERLAP",
			 p->name, (unsigned long)a0, (unsigned long)a1, p->disk_path, q->name,
			 (unsigned long)b0, (unsigned long)b1, (unsigned long)(a0 < b0 ? a1 : b1));
		return -EEXIST;
	}
	return 0;
}

int kvp_budget_disk_check(const struct kvp_conf *c, char *line, size_t len)
{
	/* Bytes still to allocate per filesystem, by the pools up to the one checked. */
	struct {
		dev_t dev;
		uint64_t want;
	} fs[KVP_MAX_POOLS];
	struct disk_id ids[KVP_MAX_POOLS];
	/* Bytes a file holds already, counted once for the pools that share it. */
	uint64_t held[KVP_MAX_POOLS] = { 0 };
	uint32_t nfs = 0;

	line[0] = 0;
	for (uint32_t i = 0; i < c->n_pools; i++) {
		const struct kvp_pool_conf *p = &c->pools[i];
		uint64_t need = kvp_conf_disk_bytes(p), have = 0, more, *credit = &held[i];
		char dir[KVP_DISK_PATH_MAX];
		struct statvfs vfs;
		struct stat st;
		uint32_t f;
		int rc;

		if (p->disk == KVP_DISK_OFF)
			continue;
		ids[i] = disk_id_of(p->disk_path);
		if ((rc = check_overlap(c, i, ids, line, len)) < 0)
			return rc;
		if (ids[i].kind == 1) {
			if ((rc = device_bytes(p->disk_path, &have)) < 0) {
				snprintf(line, len, "pool %s: disk_path %s: %s: DISK_PATH", p->name,
					 p->disk_path, strerror(-rc));
				return rc;
			}
			if (have < p->disk_offset + need) {
				snprintf(
					line, len,
					"pool %s: disk_path %s is a block device of %lu bytes, the "
					"disk tier needs %lu (disk_capacity, a 4 KiB header per page "
					"and the log) from disk_offset %lu: DISK_DEVICE_SIZE",
					p->name, p->disk_path, (unsigned long)have,
					(unsigned long)need, (unsigned long)p->disk_offset);
				return -ENOSPC;
			}
			continue;
		}
		snprintf(dir, sizeof(dir), "%s", p->disk_path);
		if (statvfs(dirname(dir), &vfs) < 0 || stat(dir, &st) < 0) {
			rc = -errno;
			snprintf(line, len,
				 "pool %s: disk_path %s: its directory %s: %s: DISK_PATH", p->name,
				 p->disk_path, dir, strerror(-rc));
			return rc;
		}
		more = need;
		for (uint32_t j = 0; j < i; j++) /* the file's bytes, counted for its first pool */
			if (c->pools[j].disk != KVP_DISK_OFF && disk_id_same(&ids[i], &ids[j])) {
				credit = &held[j];
				break;
			}
		if (credit == &held[i]) {
			struct stat fst;

			if (stat(p->disk_path, &fst) == 0 && S_ISREG(fst.st_mode))
				held[i] = (uint64_t)fst.st_blocks * 512;
		}
		{
			uint64_t take = *credit < more ? *credit : more;

			more -= take;
			*credit -= take;
		}
		for (f = 0; f < nfs && fs[f].dev != st.st_dev; f++)
			;
		if (f == nfs) {
			fs[nfs].dev = st.st_dev;
			fs[nfs++].want = 0;
		}
		fs[f].want += more;
		have = (uint64_t)vfs.f_bavail * vfs.f_frsize;
		if (fs[f].want > have) {
			snprintf(
				line, len,
				"pool %s: disk_path %s needs %lu more bytes on the filesystem of %s "
				"(%lu with the pools before it), which has %lu free: DISK_FREE_SPACE",
				p->name, p->disk_path, (unsigned long)more, dir,
				(unsigned long)fs[f].want, (unsigned long)have);
			return -ENOSPC;
		}
	}
	return 0;
}
