/* test_disk_store.c - one pool's disk store (daemon/disk/disk.h) on a file: slots reserved,
 * written and found; the map rebuilt from the log at open, and from the headers when the log is
 * missing or damaged (the newer of two copies kept); a torn log tail cut at its first bad block;
 * a log that disagrees with a slot makes a miss; the log full starts a new generation; torn
 * headers, another geometry, an older format and a file cut short make free slots; a page whose
 * bytes or header do not match is refused and its slot freed (once no read pins it); the oldest
 * slot is written over when the store is full. The file lives in the current directory (the
 * build tree: /tmp may be tmpfs, which has no direct I/O). */
#include <CUnit/Basic.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "budget.h"
#include "crc32c.h"
#include "disk.h"
#include "suite.h"

#define PAGE 8192u
#define SLOT (KVP_DISK_HDR_BYTES + PAGE)

static char g_path[256];
static const struct kvp_disk_geom g_geom = { 2, 2, 64, 0, 16, PAGE };

static struct kvp_disk *open_store(uint32_t pages, const struct kvp_disk_geom *g,
				   struct kvp_disk_open_info *info)
{
	char err[256];
	struct kvp_disk *k = kvp_disk_open(g_path, 0, pages, g, info, err, sizeof(err));

	if (!k)
		fprintf(stderr, "open: %s\n", err);
	return k;
}

static struct kvp_disk_key key_of(uint8_t *buf, uint32_t i)
{
	memset(buf, 0, 32);
	memcpy(buf, &i, sizeof(i));
	return (struct kvp_disk_key){ 7, 0, 32, buf };
}

/* Writes page i (bytes all i) through the store as the disk tier does: reserve, header, one
 * pwrite of the slot, written. Returns its slot. */
static uint32_t put(struct kvp_disk *k, uint32_t i)
{
	static uint8_t *buf;
	uint8_t kb[32];
	struct kvp_disk_key key = key_of(kb, i);
	uint32_t slot = UINT32_MAX;
	int dropped;

	if (!buf && posix_memalign((void **)&buf, 4096, SLOT) != 0)
		return UINT32_MAX;
	CU_ASSERT_EQUAL_FATAL(kvp_disk_reserve(k, &slot, &dropped), 0);
	memset(buf + KVP_DISK_HDR_BYTES, (int)i, PAGE);
	CU_ASSERT_EQUAL(kvp_disk_header(k, slot, &key, kvp_crc32c(buf + KVP_DISK_HDR_BYTES, PAGE),
					buf),
			0);
	CU_ASSERT_EQUAL(pwrite(kvp_disk_fd(k), buf, SLOT, (off_t)kvp_disk_slot_off(k, slot)), SLOT);
	kvp_disk_written(k, slot, &key, true);
	return slot;
}

/* Reads slot back and checks it as page i: 0 or -EBADMSG. */
static int check(struct kvp_disk *k, uint32_t slot, uint32_t i)
{
	static uint8_t *buf;
	uint8_t kb[32];
	struct kvp_disk_key key = key_of(kb, i);

	if (!buf && posix_memalign((void **)&buf, 4096, SLOT) != 0)
		return -ENOMEM;
	if (pread(kvp_disk_fd(k), buf, SLOT, (off_t)kvp_disk_slot_off(k, slot)) != SLOT)
		return -EIO;
	return kvp_disk_verify(k, slot, &key, buf, buf + KVP_DISK_HDR_BYTES);
}

static int64_t find(struct kvp_disk *k, uint32_t i)
{
	uint8_t kb[32];
	struct kvp_disk_key key = key_of(kb, i);

	return kvp_disk_find(k, &key);
}

static void poke(off_t at, uint8_t x)
{
	int fd = open(g_path, O_RDWR | O_CLOEXEC);
	uint8_t b = 0;

	CU_ASSERT_FATAL(fd >= 0);
	CU_ASSERT_EQUAL(pread(fd, &b, 1, at), 1);
	b ^= x;
	CU_ASSERT_EQUAL(pwrite(fd, &b, 1, at), 1);
	close(fd);
}

/* Writes the log blocks the store has waiting as the disk tier would, one pwrite each: blocks
 * written. */
static uint32_t flush_log(struct kvp_disk *k)
{
	const void *buf;
	uint32_t len, n = 0;
	uint64_t off;
	uintptr_t id;

	while (kvp_disk_log_take(k, &buf, &len, &off, &id) == 0) {
		ssize_t r = pwrite(kvp_disk_fd(k), buf, len, (off_t)off);

		kvp_disk_log_done(k, id, (int)r);
		CU_ASSERT_EQUAL(r, (ssize_t)len);
		n += len / 4096;
	}
	return n;
}

/* Zeroes the log region of a store of `pages` slots: the next open reads the headers. */
static void wipe_log(uint32_t pages)
{
	uint64_t n = kvp_conf_disk_log_bytes(pages);
	uint8_t *z = calloc(1, n);
	int fd = open(g_path, O_RDWR | O_CLOEXEC);

	CU_ASSERT_FATAL(fd >= 0 && z);
	CU_ASSERT_EQUAL(pwrite(fd, z, n, (off_t)pages * SLOT), (ssize_t)n);
	close(fd);
	free(z);
}

static void test_disk_round_trip_and_reopen(void)
{
	struct kvp_disk_open_info info;
	struct kvp_disk *k;
	uint32_t slots[8];

	unlink(g_path);
	k = open_store(16, &g_geom, &info);
	CU_ASSERT_PTR_NOT_NULL_FATAL(k);
	CU_ASSERT_EQUAL(info.adopted, 0);
	CU_ASSERT_EQUAL(kvp_disk_slots(k), 16);
	CU_ASSERT_EQUAL(kvp_disk_slot_bytes(k), SLOT);
	for (uint32_t i = 0; i < 8; i++)
		slots[i] = put(k, i);
	CU_ASSERT_EQUAL(kvp_disk_used(k), 8);
	for (uint32_t i = 0; i < 8; i++) {
		CU_ASSERT_EQUAL(find(k, i), slots[i]);
		CU_ASSERT_EQUAL(check(k, slots[i], i), 0);
	}
	CU_ASSERT_EQUAL(find(k, 99), -ENOENT);
	kvp_disk_close(k);

	k = open_store(16, &g_geom, &info);
	CU_ASSERT_PTR_NOT_NULL_FATAL(k);
	CU_ASSERT_EQUAL(info.adopted, 8);
	CU_ASSERT(info.from_log);
	CU_ASSERT(info.adopt_us < 60u * 1000 * 1000); /* measured, not wrapped */
	CU_ASSERT_EQUAL(info.torn + info.foreign + info.dups, 0);
	for (uint32_t i = 0; i < 8; i++)
		CU_ASSERT_EQUAL(check(k, (uint32_t)find(k, i), i), 0);
	/* A page written while it is mapped (two spills of it raced): the map keeps the first
	 * slot and frees the second, whose header stays on the disk; the log keeps the first, and
	 * the header scan (no log) the newer copy. */
	{
		int64_t old = find(k, 3);

		slots[3] = put(k, 3);
		CU_ASSERT_NOT_EQUAL(slots[3], old);
		CU_ASSERT_EQUAL(find(k, 3), old);
		CU_ASSERT_EQUAL(kvp_disk_used(k), 8);
		kvp_disk_close(k);
		k = open_store(16, &g_geom, &info);
		CU_ASSERT_PTR_NOT_NULL_FATAL(k);
		CU_ASSERT(info.from_log);
		CU_ASSERT_EQUAL(info.adopted, 8);
		CU_ASSERT_EQUAL(find(k, 3), old);
		CU_ASSERT_EQUAL(check(k, (uint32_t)old, 3), 0);
	}
	kvp_disk_close(k);
	wipe_log(16);
	k = open_store(16, &g_geom, &info);
	CU_ASSERT_PTR_NOT_NULL_FATAL(k);
	CU_ASSERT(!info.from_log);
	CU_ASSERT_EQUAL(info.adopted, 8);
	CU_ASSERT_EQUAL(info.dups, 1);
	CU_ASSERT_EQUAL(find(k, 3), slots[3]);
	kvp_disk_close(k);
	/* The scan wrote a new log: the next open reads it. */
	k = open_store(16, &g_geom, &info);
	CU_ASSERT_PTR_NOT_NULL_FATAL(k);
	CU_ASSERT(info.from_log);
	CU_ASSERT_EQUAL(info.adopted, 8);
	CU_ASSERT_EQUAL(find(k, 3), slots[3]);
	for (uint32_t i = 0; i < 8; i++)
		CU_ASSERT_EQUAL(check(k, (uint32_t)find(k, i), i), 0);
	kvp_disk_close(k);
}

static void test_disk_corruption_and_geometry(void)
{
	struct kvp_disk_geom other = g_geom;
	struct kvp_disk_open_info info;
	struct kvp_disk *k;
	uint32_t s0, s1, s2;

	unlink(g_path);
	k = open_store(16, &g_geom, &info);
	CU_ASSERT_PTR_NOT_NULL_FATAL(k);
	s0 = put(k, 0);
	s1 = put(k, 1);
	s2 = put(k, 2);
	kvp_disk_close(k);
	poke((off_t)s1 * SLOT + KVP_DISK_HDR_BYTES + 100, 0x40); /* page bytes */
	poke((off_t)s2 * SLOT + 40, 0x01);			 /* its header */
	/* The log names all three: page 2's torn header is found when it is read. */
	k = open_store(16, &g_geom, &info);
	CU_ASSERT_PTR_NOT_NULL_FATAL(k);
	CU_ASSERT(info.from_log);
	CU_ASSERT_EQUAL(info.adopted, 3);
	CU_ASSERT_EQUAL(check(k, s2, 2), -EBADMSG);
	CU_ASSERT_EQUAL(find(k, 2), -ENOENT);
	kvp_disk_close(k);
	wipe_log(16);
	k = open_store(16, &g_geom, &info);
	CU_ASSERT_PTR_NOT_NULL_FATAL(k);
	CU_ASSERT_EQUAL(info.adopted, 2); /* 0 and 1: 1's bytes are checked when read */
	CU_ASSERT_EQUAL(info.torn, 1);
	CU_ASSERT_EQUAL(find(k, 2), -ENOENT);
	CU_ASSERT_EQUAL(check(k, s0, 0), 0);
	/* Pinned by a read, a bad page leaves the map at once and its slot once unpinned. */
	kvp_disk_pin(k, s1);
	CU_ASSERT_EQUAL(check(k, s1, 1), -EBADMSG);
	CU_ASSERT_EQUAL(find(k, 1), -ENOENT);
	kvp_disk_unpin(k, s1);
	CU_ASSERT_EQUAL(kvp_disk_used(k), 1);
	/* A header asked for another key is refused too. */
	CU_ASSERT_EQUAL(check(k, s0, 5), -EBADMSG);
	kvp_disk_close(k);

	other.head_dim = 32;
	other.kv_heads = 4; /* the same page bytes, another geometry */
	k = open_store(16, &other, &info);
	CU_ASSERT_PTR_NOT_NULL_FATAL(k);
	CU_ASSERT_EQUAL(info.adopted, 0);
	CU_ASSERT(info.foreign >= 1);
	kvp_disk_close(k);
}

static void test_disk_log_torn_tail_and_damage(void)
{
	struct kvp_disk_open_info info;
	struct kvp_disk_log_stats ls;
	struct kvp_disk *k;
	uint64_t log_off = 16 * (uint64_t)SLOT;

	unlink(g_path);
	k = open_store(16, &g_geom, &info);
	CU_ASSERT_PTR_NOT_NULL_FATAL(k);
	CU_ASSERT(!info.from_log);
	CU_ASSERT_EQUAL(flush_log(k), 1); /* the checkpoint of an empty map: block 0 */
	for (uint32_t i = 0; i < 4; i++)
		put(k, i);
	CU_ASSERT_EQUAL(flush_log(k), 1); /* block 1: pages 0-3 */
	for (uint32_t i = 4; i < 8; i++)
		put(k, i);
	kvp_disk_log_stats(k, &ls);
	CU_ASSERT_EQUAL(ls.region_bytes, kvp_conf_disk_log_bytes(16));
	CU_ASSERT_EQUAL(ls.written_bytes, 2 * 4096);
	CU_ASSERT_EQUAL(ls.checkpoints, 1);
	kvp_disk_close(k); /* block 2: pages 4-7, written at close */

	/* A torn tail: block 2 fails its CRC, the log ends at block 1. */
	poke((off_t)(log_off + 2 * 4096 + 200), 0x10);
	k = open_store(16, &g_geom, &info);
	CU_ASSERT_PTR_NOT_NULL_FATAL(k);
	CU_ASSERT(info.from_log);
	CU_ASSERT_EQUAL(info.adopted, 4);
	for (uint32_t i = 0; i < 4; i++)
		CU_ASSERT_EQUAL(check(k, (uint32_t)find(k, i), i), 0);
	for (uint32_t i = 4; i < 8; i++)
		CU_ASSERT_EQUAL(find(k, i), -ENOENT);
	kvp_disk_close(k); /* a new generation: the checkpoint of pages 0-3 */

	/* The checkpoint damaged: the headers are read (all 8 pages are on the disk). */
	poke((off_t)(log_off + 300), 0x01);
	k = open_store(16, &g_geom, &info);
	CU_ASSERT_PTR_NOT_NULL_FATAL(k);
	CU_ASSERT(!info.from_log);
	CU_ASSERT(strstr(info.log_why, "torn") != NULL);
	CU_ASSERT_EQUAL(info.adopted, 8);
	for (uint32_t i = 0; i < 8; i++)
		CU_ASSERT_EQUAL(check(k, (uint32_t)find(k, i), i), 0);
	kvp_disk_close(k);

	/* Another geometry of the same page bytes: its log is not read, its slots are foreign. */
	{
		struct kvp_disk_geom other = g_geom;

		other.layers = 1;
		other.head_dim = 128;
		k = open_store(16, &other, &info);
		CU_ASSERT_PTR_NOT_NULL_FATAL(k);
		CU_ASSERT(!info.from_log);
		CU_ASSERT_EQUAL(info.adopted, 0);
		CU_ASSERT_EQUAL(info.foreign, 8);
		kvp_disk_close(k);
	}
}

/* A log that names a slot whose header holds another page (a write landed, its record did not):
 * the page the log names is a miss, never the other page's bytes. */
static void test_disk_log_disagrees_with_slot(void)
{
	struct kvp_disk_open_info info;
	struct kvp_disk *k;
	uint32_t s0, s1;
	uint8_t *buf = NULL;
	int fd;

	unlink(g_path);
	k = open_store(8, &g_geom, &info);
	CU_ASSERT_PTR_NOT_NULL_FATAL(k);
	s0 = put(k, 0);
	s1 = put(k, 1);
	kvp_disk_close(k);
	CU_ASSERT_FATAL(posix_memalign((void **)&buf, 4096, SLOT) == 0);
	fd = open(g_path, O_RDWR | O_CLOEXEC);
	CU_ASSERT_FATAL(fd >= 0);
	CU_ASSERT_EQUAL(pread(fd, buf, SLOT, (off_t)s1 * SLOT), SLOT);
	CU_ASSERT_EQUAL(pwrite(fd, buf, SLOT, (off_t)s0 * SLOT), SLOT);
	close(fd);
	free(buf);
	k = open_store(8, &g_geom, &info);
	CU_ASSERT_PTR_NOT_NULL_FATAL(k);
	CU_ASSERT(info.from_log);
	CU_ASSERT_EQUAL(find(k, 0), s0);
	CU_ASSERT_EQUAL(check(k, s0, 0), -EBADMSG);
	CU_ASSERT_EQUAL(find(k, 0), -ENOENT);
	CU_ASSERT_EQUAL(check(k, s1, 1), 0);
	kvp_disk_close(k);
	/* The slot's FREE record was logged: the next open does not name it. */
	k = open_store(8, &g_geom, &info);
	CU_ASSERT_PTR_NOT_NULL_FATAL(k);
	CU_ASSERT(info.from_log);
	CU_ASSERT_EQUAL(info.adopted, 1);
	CU_ASSERT_EQUAL(find(k, 0), -ENOENT);
	kvp_disk_close(k);
}

/* The log region full: a new generation starts at block 0 with a checkpoint, and the next open
 * adopts what the store holds last. */
static void test_disk_log_full_checkpoints(void)
{
	const uint32_t pages = 4, blocks = (uint32_t)(kvp_conf_disk_log_bytes(pages) / 4096);
	struct kvp_disk_open_info info;
	struct kvp_disk_log_stats ls;
	struct kvp_disk *k;

	unlink(g_path);
	k = open_store(pages, &g_geom, &info);
	CU_ASSERT_PTR_NOT_NULL_FATAL(k);
	flush_log(k);
	for (uint32_t i = 0; i < 2 * blocks; i++) { /* one block a write, each page written over */
		put(k, i);
		flush_log(k);
	}
	kvp_disk_log_stats(k, &ls);
	CU_ASSERT(ls.checkpoints >= 2);
	CU_ASSERT_EQUAL(ls.errors, 0);
	kvp_disk_close(k);
	k = open_store(pages, &g_geom, &info);
	CU_ASSERT_PTR_NOT_NULL_FATAL(k);
	CU_ASSERT(info.from_log);
	CU_ASSERT_EQUAL(info.adopted, pages);
	for (uint32_t i = 2 * blocks - pages; i < 2 * blocks; i++)
		CU_ASSERT_EQUAL(check(k, (uint32_t)find(k, i), i), 0);
	CU_ASSERT_EQUAL(find(k, 2 * blocks - pages - 1), -ENOENT);
	kvp_disk_close(k);
}

/* A log write that fails: counted, and a new generation's checkpoint follows, which the next open
 * reads. */
static void test_disk_log_write_fails(void)
{
	struct kvp_disk_open_info info;
	struct kvp_disk_log_stats ls;
	struct kvp_disk *k;
	const void *buf;
	uint32_t len;
	uint64_t off;
	uintptr_t id;

	unlink(g_path);
	k = open_store(16, &g_geom, &info);
	CU_ASSERT_PTR_NOT_NULL_FATAL(k);
	flush_log(k);
	for (uint32_t i = 0; i < 6; i++)
		put(k, i);
	CU_ASSERT_EQUAL_FATAL(kvp_disk_log_take(k, &buf, &len, &off, &id), 0);
	kvp_disk_log_done(k, id, -EIO); /* the block naming pages 0-5 never lands */
	kvp_disk_log_stats(k, &ls);
	CU_ASSERT_EQUAL(ls.errors, 1);
	CU_ASSERT_EQUAL(ls.checkpoints, 1);
	CU_ASSERT_EQUAL(flush_log(k), 1); /* the new checkpoint: pages 0-5 */
	kvp_disk_log_stats(k, &ls);
	CU_ASSERT_EQUAL(ls.checkpoints, 2);
	put(k, 6);
	CU_ASSERT_EQUAL(flush_log(k), 1);
	kvp_disk_close(k);
	k = open_store(16, &g_geom, &info);
	CU_ASSERT_PTR_NOT_NULL_FATAL(k);
	CU_ASSERT(info.from_log);
	CU_ASSERT_EQUAL(info.adopted, 7);
	for (uint32_t i = 0; i < 7; i++)
		CU_ASSERT_EQUAL(check(k, (uint32_t)find(k, i), i), 0);
	kvp_disk_close(k);
}

/* A store of the previous format (version 1, no log): its pages are dropped, counted. */
static void test_disk_old_format(void)
{
	struct kvp_disk_open_info info;
	struct kvp_disk *k;
	uint8_t h[136];
	uint32_t s0, v = 1, crc = 0;
	int fd;

	unlink(g_path);
	k = open_store(8, &g_geom, &info);
	CU_ASSERT_PTR_NOT_NULL_FATAL(k);
	s0 = put(k, 0);
	kvp_disk_close(k);
	wipe_log(8);
	fd = open(g_path, O_RDWR | O_CLOEXEC);
	CU_ASSERT_FATAL(fd >= 0);
	CU_ASSERT_EQUAL(pread(fd, h, sizeof(h), (off_t)s0 * SLOT), (ssize_t)sizeof(h));
	memcpy(h + 8, &v, 4);	 /* version */
	memcpy(h + 12, &crc, 4); /* the header's CRC, over the header with it 0 */
	crc = kvp_crc32c(h, sizeof(h));
	memcpy(h + 12, &crc, 4);
	CU_ASSERT_EQUAL(pwrite(fd, h, sizeof(h), (off_t)s0 * SLOT), (ssize_t)sizeof(h));
	close(fd);
	k = open_store(8, &g_geom, &info);
	CU_ASSERT_PTR_NOT_NULL_FATAL(k);
	CU_ASSERT(!info.from_log);
	CU_ASSERT_EQUAL(info.old, 1);
	CU_ASSERT_EQUAL(info.torn, 0);
	CU_ASSERT_EQUAL(info.adopted, 0);
	kvp_disk_close(k);
}

static void test_disk_full_writes_over_oldest(void)
{
	struct kvp_disk_open_info info;
	struct kvp_disk *k;
	uint32_t slot;
	int dropped = 0;

	unlink(g_path);
	k = open_store(4, &g_geom, &info);
	CU_ASSERT_PTR_NOT_NULL_FATAL(k);
	for (uint32_t i = 0; i < 4; i++)
		put(k, i);
	kvp_disk_pin(k, (uint32_t)find(k, 0)); /* being read: not written over */
	put(k, 4);
	CU_ASSERT_EQUAL(find(k, 0) >= 0, 1);
	CU_ASSERT_EQUAL(find(k, 1), -ENOENT); /* the oldest not being read went */
	CU_ASSERT_EQUAL(kvp_disk_used(k), 4);
	/* Every slot pinned or being written: nothing to reserve. */
	for (uint32_t i = 2; i < 5; i++)
		kvp_disk_pin(k, (uint32_t)find(k, i));
	CU_ASSERT_EQUAL(kvp_disk_reserve(k, &slot, &dropped), -EBUSY);
	kvp_disk_close(k);
}

static void test_disk_truncated(void)
{
	struct kvp_disk_open_info info;
	struct kvp_disk *k;

	unlink(g_path);
	k = open_store(8, &g_geom, &info);
	CU_ASSERT_PTR_NOT_NULL_FATAL(k);
	for (uint32_t i = 0; i < 8; i++)
		put(k, i);
	kvp_disk_close(k);
	CU_ASSERT_EQUAL(truncate(g_path, 3 * (off_t)SLOT + 10), 0);
	k = open_store(8, &g_geom, &info);
	CU_ASSERT_PTR_NOT_NULL_FATAL(k);
	CU_ASSERT_EQUAL(info.adopted, 3);
	kvp_disk_close(k);
	unlink(g_path);
}

static int init(void)
{
	char cwd[200];

	if (!getcwd(cwd, sizeof(cwd)))
		return -1;
	snprintf(g_path, sizeof(g_path), "%s/test_disk_store.%d.disk", cwd, (int)getpid());
	return 0;
}

static int clean(void)
{
	unlink(g_path);
	return 0;
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_disk_round_trip_and_reopen),
		H_TEST(test_disk_corruption_and_geometry),
		H_TEST(test_disk_log_torn_tail_and_damage),
		H_TEST(test_disk_log_disagrees_with_slot),
		H_TEST(test_disk_log_full_checkpoints),
		H_TEST(test_disk_log_write_fails),
		H_TEST(test_disk_old_format),
		H_TEST(test_disk_full_writes_over_oldest),
		H_TEST(test_disk_truncated),
	};

	return H_RUN_SUITE("disk_store", init, clean, tests);
}
