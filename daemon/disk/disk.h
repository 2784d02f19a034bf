/* disk.h - one pool's disk store: a file on a local filesystem or a block device, opened with
 * O_DIRECT, cut into slots of one page each, then the log of its map (disk_log.h). A slot is a
 * 4 KiB header (the pool's geometry fingerprint, the page's namespace, kind and key, a write
 * sequence number, the CRC32C of the page bytes and of the header itself) followed by the page
 * bytes rounded up to 4 KiB. The store keeps the map of keys to slots in memory and logs its
 * changes (a page stored in a slot, a slot emptied); at open the map is rebuilt from the log,
 * read sequentially, and when the log is missing, damaged or of another geometry, from every
 * slot's header, so a kvpoold started after a reboot adopts what an earlier one wrote. A header
 * that is torn, of another geometry or of another format makes its slot free; a page whose header
 * does not name it or whose bytes do not match the header's CRC32C is found when it is read
 * (kvp_disk_verify) and freed then: a log that disagrees with a slot makes a miss, never wrong
 * bytes. The store does no I/O after open but at close (the log's last blocks): the disk tier
 * (disk_tier.h) reads and writes the slots and the log's blocks through io_uring.
 * Single-threaded: the event loop owns it. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVP_DISK_HDR_BYTES 4096u
#define KVP_DISK_ALIGN 4096u
#define KVP_DISK_KEY_MAX 64u

/* What a page's bytes mean: a slot of another geometry is never served. */
struct kvp_disk_geom {
	uint32_t layers, kv_heads, head_dim, dtype, page_tokens;
	uint64_t page_bytes;
};

/* A page's name: its namespace, kind (keyed 1: a key call's page, 0: a token page) and key. */
struct kvp_disk_key {
	uint64_t ns;
	int keyed;
	uint32_t len;
	const uint8_t *data;
};

struct kvp_disk_open_info {
	uint64_t adopted;  /* pages found valid and mapped */
	uint64_t foreign;  /* slots of another geometry (now free) */
	uint64_t torn;	   /* headers that failed their CRC (now free) */
	uint64_t dups;	   /* older copies of a key found twice (now free) */
	uint64_t old;	   /* slots of an older store format (now free) */
	bool block_device; /* the path is a block device */
	bool from_log;	   /* the map came from the log, not the headers */
	char log_why[128]; /* why not, in words */
	uint64_t adopt_us; /* microseconds reading the log or the headers */
};

/* The log's figures: its region's bytes, bytes written, checkpoints started, failed writes. */
struct kvp_disk_log_stats {
	uint64_t region_bytes, written_bytes, checkpoints, errors;
};

struct kvp_disk;

/* Opens (a regular file is created and extended to its size when needed) the store of `pages`
 * slots in the region of path from byte `offset` (a multiple of 4 KiB; the region is
 * kvp_conf_disk_bytes long: pools with disjoint regions share one file or device) for pages of
 * geometry g and rebuilds its map from its log or every slot's header. NULL with errno and a
 * message in err: ENOSPC (the filesystem or device is too small), EINVAL (no O_DIRECT on that
 * filesystem, a bad geometry), or the open's or a read's errno. */
struct kvp_disk *kvp_disk_open(const char *path, uint64_t offset, uint64_t pages,
			       const struct kvp_disk_geom *g, struct kvp_disk_open_info *info,
			       char *err, size_t errlen);
/* Accepts NULL. Slots pinned or being written are simply forgotten; the log's records not written
 * yet are written with pwrite (the caller has waited for the log writes it took). */
void kvp_disk_close(struct kvp_disk *k);

/* The O_DIRECT fd, the bytes of one slot (header + page rounded up), the byte offset of a slot,
 * the page bytes and the slot count. */
int kvp_disk_fd(const struct kvp_disk *k);
uint64_t kvp_disk_slot_bytes(const struct kvp_disk *k);
uint64_t kvp_disk_slot_off(const struct kvp_disk *k, uint32_t slot);
uint64_t kvp_disk_page_bytes(const struct kvp_disk *k);
uint32_t kvp_disk_slots(const struct kvp_disk *k);
/* Slots that hold a mapped page now. */
uint32_t kvp_disk_used(const struct kvp_disk *k);

/* The slot that holds key, or -ENOENT. */
int64_t kvp_disk_find(const struct kvp_disk *k, const struct kvp_disk_key *key);
/* A slot to write a page into: a free one, else the oldest mapped slot not being read (its page
 * leaves the store: *dropped set to 1). The slot is WRITING until kvp_disk_written. 0 or -EBUSY
 * (every slot is being read or written). */
int kvp_disk_reserve(struct kvp_disk *k, uint32_t *slot, int *dropped);
/* Writes the header of key's page into hdr (KVP_DISK_HDR_BYTES bytes) for slot, whose page bytes
 * have CRC32C page_crc. -EINVAL for a key longer than KVP_DISK_KEY_MAX. */
int kvp_disk_header(struct kvp_disk *k, uint32_t slot, const struct kvp_disk_key *key,
		    uint32_t page_crc, void *hdr);
/* The end of a slot's write: ok maps key to it (a key mapped meanwhile keeps its slot and this
 * one goes free), else it goes free. */
void kvp_disk_written(struct kvp_disk *k, uint32_t slot, const struct kvp_disk_key *key, bool ok);
/* A read in flight pins a slot against reuse. */
void kvp_disk_pin(struct kvp_disk *k, uint32_t slot);
void kvp_disk_unpin(struct kvp_disk *k, uint32_t slot);
/* Checks a slot read back: hdr its header, page its page bytes, for key. 0, or -EBADMSG (torn
 * or corrupt: the slot leaves the map and goes free once unpinned). */
int kvp_disk_verify(struct kvp_disk *k, uint32_t slot, const struct kvp_disk_key *key,
		    const void *hdr, const void *page);
/* Drops a slot's page (an I/O error): it leaves the map. */
void kvp_disk_drop(struct kvp_disk *k, uint32_t slot);

/* Told of every page that enters the map (stored) or leaves it (written over, corrupt, an I/O
 * error) from now on; key is valid only during the call. fn NULL: nobody. */
typedef void (*kvp_disk_observe_fn)(void *ctx, const struct kvp_disk_key *key, bool stored);
void kvp_disk_set_observer(struct kvp_disk *k, kvp_disk_observe_fn fn, void *ctx);
/* Tells the observer of every page mapped now, as stored. */
void kvp_disk_observe_all(const struct kvp_disk *k);

/* The next run of log blocks to write (after the pages it names landed; a checkpoint when one is
 * due): buf, len bytes at byte off of kvp_disk_fd, and an id for kvp_disk_log_done. 0, or
 * -ENODATA (nothing to write), -EBUSY (enough log writes in flight). */
int kvp_disk_log_take(struct kvp_disk *k, const void **buf, uint32_t *len, uint64_t *off,
		      uintptr_t *id);
/* A taken log write ended with res (bytes written or a negative errno). */
void kvp_disk_log_done(struct kvp_disk *k, uintptr_t id, int res);
void kvp_disk_log_stats(const struct kvp_disk *k, struct kvp_disk_log_stats *st);
