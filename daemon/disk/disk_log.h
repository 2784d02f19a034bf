/* disk_log.h - the log of a disk store's key map (disk.h), kept in a region of the store after
 * its slots, so that a kvpoold started after a reboot (no fd store) adopts the disk by reading
 * the log sequentially instead of every slot's header. The region is 4 KiB blocks, each a
 * header (magic, version, the store's fingerprint, the generation's nonce, the block's position,
 * its record count, the generation's checkpoint length, the highest sequence number, the
 * block's CRC32C) and up to KVP_DISK_LOG_RECS records (slot, set or free, namespace, kind, key,
 * sequence number, page CRC32C, the record's CRC32C). A generation starts at block 0 with a
 * checkpoint (one set record per mapped slot) and goes on with the records of pages stored and
 * freed since, in blocks never written twice; when the region is full, after a write that failed
 * and at every open a new generation starts with a fresh checkpoint. Replay stops at the first
 * block or record that fails its check (a torn tail); a generation whose checkpoint is not whole
 * is damaged, and the store falls back to reading the headers. The log is a hint: every page is
 * still checked against its slot's header and CRC32C when read, so a log that disagrees with a
 * slot makes a miss, never wrong bytes. The log does no I/O but at replay and the synchronous
 * flush at close: the disk tier writes the blocks it takes through its io_uring ring. Internal to
 * disk/. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum kvp_dlog_kind { KVP_DLOG_SET = 1, KVP_DLOG_FREE = 2 };

/* One record: a page stored in slot (SET) or the slot emptied (FREE: only slot and seq). */
struct kvp_dlog_rec {
	uint32_t slot;
	enum kvp_dlog_kind kind;
	int keyed;
	uint32_t len;
	uint64_t ns, seq;
	uint32_t page_crc;
	const uint8_t *key;
};

/* Applies a replayed record: 0, or negative to stop the replay as damaged. */
typedef int (*kvp_dlog_apply_fn)(void *ctx, const struct kvp_dlog_rec *r);

struct kvp_dlog;

/* Blocks of the log region of a store of `slots` slots (budget.h's kvp_conf_disk_log_bytes). */
uint64_t kvp_dlog_blocks(uint64_t slots);
/* The log of the region of nblocks blocks at byte off of fd (O_DIRECT), for a store of
 * fingerprint fp. NULL on no memory. No I/O. */
struct kvp_dlog *kvp_dlog_new(int fd, uint64_t off, uint64_t nblocks, uint64_t fp);
/* Accepts NULL. Buffers in flight are the caller's to wait for first (kvp_dlog_inflight). */
void kvp_dlog_free(struct kvp_dlog *l);

/* Reads the region and applies the newest generation's records in order. 0; -ENOENT (no log:
 * never written, or of an older format), -ESTALE (the log of another geometry or size),
 * -EBADMSG (damaged: a checkpoint not whole, a record refused), or a read's negative errno; why
 * says which in words. *max_seq is the highest sequence number the log names. */
int kvp_dlog_replay(struct kvp_dlog *l, kvp_dlog_apply_fn fn, void *ctx, uint64_t *max_seq,
		    char *why, size_t whylen);

/* Whether a new generation must start (at open, when the region is full, after a failed write or
 * a backlog): the caller then writes the checkpoint with kvp_dlog_begin, kvp_dlog_add of every
 * mapped slot, kvp_dlog_end. */
bool kvp_dlog_wants_checkpoint(const struct kvp_dlog *l);
/* Starts a new generation at block 0: records not yet taken are dropped (the checkpoint holds
 * what they said). */
void kvp_dlog_begin(struct kvp_dlog *l, uint64_t seq);
/* Appends a record (inside a checkpoint or after it). A record that finds no room (the region
 * full, too many blocks waiting) is dropped and a checkpoint wanted instead. */
void kvp_dlog_add(struct kvp_dlog *l, const struct kvp_dlog_rec *r, uint64_t seq);
void kvp_dlog_end(struct kvp_dlog *l);

/* The next run of blocks to write: its buffer, bytes and byte offset, and an id for
 * kvp_dlog_done. 0, or -ENODATA (nothing to write), -EBUSY (enough writes in flight). */
int kvp_dlog_take(struct kvp_dlog *l, const void **buf, uint32_t *len, uint64_t *off,
		  uintptr_t *id);
/* A taken write ended with res (bytes written or a negative errno): a failure wants a new
 * checkpoint. */
void kvp_dlog_done(struct kvp_dlog *l, uintptr_t id, int res);
/* Writes what is waiting with pwrite, now (at close): 0 or a negative errno. */
int kvp_dlog_sync(struct kvp_dlog *l);
/* Writes in flight, bytes written so far, checkpoints started, writes that failed. */
uint32_t kvp_dlog_inflight(const struct kvp_dlog *l);
uint64_t kvp_dlog_written(const struct kvp_dlog *l);
uint64_t kvp_dlog_checkpoints(const struct kvp_dlog *l);
uint64_t kvp_dlog_errors(const struct kvp_dlog *l);
