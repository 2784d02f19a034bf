/* budget_disk.c - the disk tier's budget check (budget.h): each pool's disk_path has room for its
 * disk_capacity before any pool starts. */
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

int kvp_budget_disk_check(const struct kvp_conf *c, char *line, size_t len)
{
	/* Bytes still to allocate per filesystem, by the pools up to the one checked. */
	struct {
		dev_t dev;
		uint64_t want;
	} fs[KVP_MAX_POOLS];
	uint32_t nfs = 0;

	line[0] = 0;
	for (uint32_t i = 0; i < c->n_pools; i++) {
		const struct kvp_pool_conf *p = &c->pools[i];
		uint64_t need = kvp_conf_disk_bytes(p), have = 0, more;
		char dir[KVP_DISK_PATH_MAX];
		struct statvfs vfs;
		struct stat st;
		uint32_t f;
		int rc;

		if (p->disk == KVP_DISK_OFF)
			continue;
		if (stat(p->disk_path, &st) == 0 && S_ISBLK(st.st_mode)) {
			if ((rc = device_bytes(p->disk_path, &have)) < 0) {
				snprintf(line, len, "pool %s: disk_path %s: %s: DISK_PATH", p->name,
					 p->disk_path, strerror(-rc));
				return rc;
			}
			if (have < need) {
				snprintf(
					line, len,
					"pool %s: disk_path %s is a block device of %lu bytes, the disk "
					"tier needs %lu (disk_capacity, a 4 KiB header per page and the log): "
					"DISK_DEVICE_SIZE",
					p->name, p->disk_path, (unsigned long)have,
					(unsigned long)need);
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
		{
			struct stat fst;

			if (stat(p->disk_path, &fst) == 0 && S_ISREG(fst.st_mode))
				more = (uint64_t)fst.st_blocks * 512 >= need
					       ? 0
					       : need - (uint64_t)fst.st_blocks * 512;
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
