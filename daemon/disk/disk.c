/* disk.c - one pool's disk store: slots, their headers, the key map, its rebuild at open from
 * the log (disk_log.h) or the headers, and the log's records of the map's changes (disk.h). */
#include "disk.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "budget.h"
#include "crc32c.h"
#include "disk_log.h"
#include "mix.h"

#define DISK_MAGIC 0x31304b5344505640ULL /* "@VPDSK01" */
/* 2: the store ends with the log of its map (disk_log.h). Slots of version 1 start free. */
#define DISK_VERSION 2u
#define NONE UINT32_MAX

/* The header as written at the start of each slot (little-endian, the rest of its 4 KiB 0). */
struct disk_hdr {
	uint64_t magic;
	uint32_t version;
	uint32_t hdr_crc; /* CRC32C of the header with this field 0 */
	uint32_t layers, kv_heads, head_dim, dtype, page_tokens;
	uint32_t keyed_len; /* keyed << 8 | key length */
	uint64_t page_bytes;
	uint64_t seq;
	uint64_t ns;
	uint32_t page_crc;
	uint32_t pad;
	uint8_t key[KVP_DISK_KEY_MAX];
};
_Static_assert(sizeof(struct disk_hdr) == 136, "the header's layout is the file format");

enum slot_state {
	SLOT_FREE,
	SLOT_WRITING,
	SLOT_VALID,
	SLOT_DEAD, /* dropped while pinned: free once unpinned */
};

struct slot {
	uint64_t ns, seq;
	uint32_t page_crc;
	uint8_t keyed, len, state;
	uint16_t pins;
	uint8_t key[KVP_DISK_KEY_MAX];
};

struct kvp_disk {
	int fd;
	struct kvp_disk_geom g;
	uint64_t base; /* the region's first byte on the file or device */
	uint64_t slot_bytes;
	uint32_t nslots, used;
	struct slot *slots;
	uint32_t *free_stack, nfree;
	uint32_t *tab; /* open addressing, linear probing: slot ids, NONE empty */
	uint64_t tab_mask;
	uint32_t cursor; /* where the search for the oldest slot goes on */
	uint64_t seq;	 /* the last sequence number written */
	kvp_disk_observe_fn observe;
	void *observe_ctx;
	struct kvp_dlog *log;
	uint64_t log_bytes;
};

static uint64_t round_up(uint64_t x, uint64_t a)
{
	return (x + a - 1) / a * a;
}

static uint64_t key_hash(uint64_t ns, int keyed, const uint8_t *b, uint32_t len)
{
	uint64_t h = kvp_mix64(ns ^ ((uint64_t)keyed << 63) ^ len);

	for (uint32_t i = 0; i < len; i++)
		h = (h ^ b[i]) * 0x100000001b3ULL;
	return kvp_mix64(h);
}

static bool slot_is(const struct slot *s, uint64_t ns, int keyed, const uint8_t *b, uint32_t len)
{
	return s->ns == ns && s->keyed == (keyed != 0) && s->len == len &&
	       memcmp(s->key, b, len) == 0;
}

static uint64_t tab_find(const struct kvp_disk *k, uint64_t ns, int keyed, const uint8_t *b,
			 uint32_t len)
{
	uint64_t i = key_hash(ns, keyed, b, len) & k->tab_mask;

	while (k->tab[i] != NONE) {
		if (slot_is(&k->slots[k->tab[i]], ns, keyed, b, len))
			return i;
		i = (i + 1) & k->tab_mask;
	}
	return i; /* the empty bucket where it would go */
}

static void observe(const struct kvp_disk *k, const struct slot *s, bool stored)
{
	struct kvp_disk_key key = { s->ns, s->keyed, s->len, s->key };

	if (k->observe)
		k->observe(k->observe_ctx, &key, stored);
}

/* Appends slot's change to the log: SET names its page, FREE empties it. */
static void log_slot(struct kvp_disk *k, uint32_t slot, enum kvp_dlog_kind kind)
{
	const struct slot *s = &k->slots[slot];
	struct kvp_dlog_rec r = {
		slot, kind, s->keyed, s->len, s->ns, s->seq, s->page_crc, s->key
	};

	if (kind == KVP_DLOG_FREE)
		r = (struct kvp_dlog_rec){ .slot = slot, .kind = kind, .seq = s->seq };
	kvp_dlog_add(k->log, &r, k->seq);
}

static void tab_add(struct kvp_disk *k, uint32_t slot)
{
	const struct slot *s = &k->slots[slot];

	k->tab[tab_find(k, s->ns, s->keyed, s->key, s->len)] = slot;
	k->used++;
	log_slot(k, slot, KVP_DLOG_SET);
	observe(k, s, true);
}

/* Removes slot's key from the table (backward-shift deletion). */
static void tab_del(struct kvp_disk *k, uint32_t slot)
{
	const struct slot *s = &k->slots[slot];
	uint64_t i = tab_find(k, s->ns, s->keyed, s->key, s->len), j = i;

	if (k->tab[i] != slot)
		return;
	k->used--;
	log_slot(k, slot, KVP_DLOG_FREE);
	observe(k, s, false);
	for (;;) {
		uint64_t home;

		j = (j + 1) & k->tab_mask;
		if (k->tab[j] == NONE)
			break;
		s = &k->slots[k->tab[j]];
		home = key_hash(s->ns, s->keyed, s->key, s->len) & k->tab_mask;
		/* Entry j may move to i when its home is not in (i, j] (cyclically). */
		if (i <= j ? (home <= i || home > j) : (home <= i && home > j)) {
			k->tab[i] = k->tab[j];
			i = j;
		}
	}
	k->tab[i] = NONE;
}

static void slot_free(struct kvp_disk *k, uint32_t slot)
{
	k->slots[slot].state = SLOT_FREE;
	k->free_stack[k->nfree++] = slot;
}

static uint32_t hdr_crc(const struct disk_hdr *h)
{
	struct disk_hdr c = *h;

	c.hdr_crc = 0;
	return kvp_crc32c(&c, sizeof(c));
}

static bool geom_is(const struct disk_hdr *h, const struct kvp_disk_geom *g)
{
	return h->layers == g->layers && h->kv_heads == g->kv_heads && h->head_dim == g->head_dim &&
	       h->dtype == g->dtype && h->page_tokens == g->page_tokens &&
	       h->page_bytes == g->page_bytes;
}

/* Sizes the file (its region allocated) or checks the device: the region of need bytes from
 * k->base. 0 or a negative errno with err filled. */
static int disk_size(struct kvp_disk *k, const char *path, uint64_t need,
		     struct kvp_disk_open_info *info, char *err, size_t errlen)
{
	uint64_t end = k->base + need;

	struct stat st;
	uint64_t have = 0;

	if (fstat(k->fd, &st) < 0)
		return -errno;
	if (S_ISBLK(st.st_mode)) {
		info->block_device = true;
		if (ioctl(k->fd, BLKGETSIZE64, &have) < 0)
			return -errno;
		if (have < end) {
			snprintf(err, errlen,
				 "block device %s holds %lu bytes, the disk tier needs %lu "
				 "(disk_capacity, a 4 KiB header per page and the log)",
				 path, (unsigned long)have, (unsigned long)end);
			return -ENOSPC;
		}
		return 0;
	}
	if (!S_ISREG(st.st_mode)) {
		snprintf(err, errlen, "%s is neither a regular file nor a block device", path);
		return -EINVAL;
	}
	if ((uint64_t)st.st_size >= end && !k->base)
		return 0;
	if (fallocate(k->fd, 0, (off_t)k->base, (off_t)need) < 0) {
		int e = errno;

		snprintf(err, errlen, "cannot extend %s to %lu bytes: %s", path, (unsigned long)end,
			 strerror(e));
		return -e;
	}
	return 0;
}

/* What slot i's header (r bytes read into hdr) says: the slot mapped, or left free. */
static void scan_one(struct kvp_disk *k, struct kvp_disk_open_info *info, uint32_t i,
		     const void *hdr, int r)
{
	struct slot *s = &k->slots[i];
	struct disk_hdr h;

	if (r < (int)sizeof(h))
		return; /* past a truncated end: free */
	memcpy(&h, hdr, sizeof(h));
	if (h.magic != DISK_MAGIC)
		return; /* never written */
	if (h.version < DISK_VERSION && h.hdr_crc == hdr_crc(&h)) {
		info->old++;
		return;
	}
	if (h.version != DISK_VERSION || h.hdr_crc != hdr_crc(&h) || (h.keyed_len & 0xff) == 0 ||
	    (h.keyed_len & 0xff) > KVP_DISK_KEY_MAX) {
		info->torn++;
		return;
	}
	if (!geom_is(&h, &k->g)) {
		info->foreign++;
		return;
	}
	s->ns = h.ns;
	s->seq = h.seq;
	s->page_crc = h.page_crc;
	s->keyed = (uint8_t)(h.keyed_len >> 8 != 0);
	s->len = (uint8_t)(h.keyed_len & 0xff);
	memcpy(s->key, h.key, s->len);
	if (h.seq > k->seq)
		k->seq = h.seq;
	s->state = SLOT_VALID;
}

/* Maps the slots found valid (by the headers or the log), the newer of two copies of one page;
 * the others go free. */
static void map_build(struct kvp_disk *k, struct kvp_disk_open_info *info)
{
	uint32_t best = NONE;

	for (uint32_t i = 0; i < k->nslots; i++) {
		struct slot *s = &k->slots[i];
		uint64_t at;

		if (s->state != SLOT_VALID)
			continue;
		at = tab_find(k, s->ns, s->keyed, s->key, s->len);
		if (k->tab[at] == NONE) {
			k->tab[at] = i;
			k->used++;
			continue;
		}
		info->dups++; /* the same page twice: the newer stays */
		if (k->slots[k->tab[at]].seq >= s->seq) {
			s->state = SLOT_FREE;
			continue;
		}
		k->slots[k->tab[at]].state = SLOT_FREE;
		k->tab[at] = i;
	}
	for (uint32_t i = k->nslots; i-- > 0;)
		if (k->slots[i].state != SLOT_VALID)
			slot_free(k, i);
		else if (best == NONE || k->slots[i].seq > k->slots[best].seq)
			best = i;
	info->adopted = k->used;
	k->cursor = best == NONE ? 0 : (best + 1) % k->nslots;
}

/* Reads every slot's header, SCAN_QD at a time through a ring of its own (start-up only), and
 * maps the valid ones. */
#define SCAN_QD 64u
static int disk_scan(struct kvp_disk *k, struct kvp_disk_open_info *info, char *err, size_t errlen)
{
	uint32_t next = 0, inflight = 0, free_ids[SCAN_QD], nfree = SCAN_QD;
	uint32_t slot_of[SCAN_QD];
	struct io_uring ring;
	uint8_t *buf = NULL;
	int rc = 0;

	if (posix_memalign((void **)&buf, KVP_DISK_ALIGN, (size_t)KVP_DISK_HDR_BYTES * SCAN_QD))
		return -ENOMEM;
	if ((rc = io_uring_queue_init(SCAN_QD, &ring, 0)) < 0) {
		snprintf(err, errlen, "io_uring for reading the headers: %s", strerror(-rc));
		free(buf);
		return rc;
	}
	for (uint32_t b = 0; b < SCAN_QD; b++)
		free_ids[b] = b;
	while (rc == 0 && (next < k->nslots || inflight)) {
		struct io_uring_cqe *cqe;

		while (next < k->nslots && nfree) {
			struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
			uint32_t b = free_ids[--nfree];

			slot_of[b] = next;
			io_uring_prep_read(sqe, k->fd, buf + (size_t)b * KVP_DISK_HDR_BYTES,
					   KVP_DISK_HDR_BYTES, kvp_disk_slot_off(k, next++));
			io_uring_sqe_set_data64(sqe, b);
			inflight++;
		}
		if ((rc = io_uring_submit_and_wait(&ring, 1)) < 0) {
			snprintf(err, errlen, "reading the headers: %s", strerror(-rc));
			break;
		}
		rc = 0;
		while (io_uring_peek_cqe(&ring, &cqe) == 0) {
			uint32_t b = (uint32_t)io_uring_cqe_get_data64(cqe);
			int r = cqe->res;

			io_uring_cqe_seen(&ring, cqe);
			inflight--;
			free_ids[nfree++] = b;
			if (r < 0 && !rc) {
				snprintf(err, errlen, "reading the header of slot %u: %s",
					 slot_of[b], strerror(-r));
				rc = r;
			}
			if (r >= 0)
				scan_one(k, info, slot_of[b], buf + (size_t)b * KVP_DISK_HDR_BYTES,
					 r);
		}
	}
	while (rc < 0 && inflight) { /* what is still in flight lands before buf goes */
		struct io_uring_cqe *cqe;

		if (io_uring_wait_cqe(&ring, &cqe) < 0)
			break;
		io_uring_cqe_seen(&ring, cqe);
		inflight--;
	}
	io_uring_queue_exit(&ring);
	free(buf);
	return rc;
}

/* A replayed record: slot's page (SET) or none (FREE). */
static int log_apply(void *ctx, const struct kvp_dlog_rec *r)
{
	struct kvp_disk *k = ctx;
	struct slot *s;

	if (r->slot >= k->nslots || r->len > KVP_DISK_KEY_MAX)
		return -EINVAL;
	s = &k->slots[r->slot];
	if (r->kind == KVP_DLOG_FREE) {
		s->state = SLOT_FREE;
		return 0;
	}
	s->ns = r->ns;
	s->seq = r->seq;
	s->page_crc = r->page_crc;
	s->keyed = (uint8_t)(r->keyed != 0);
	s->len = (uint8_t)r->len;
	memcpy(s->key, r->key, r->len);
	s->state = SLOT_VALID;
	return 0;
}

/* What identifies the store a log belongs to: its geometry, slots and log size. */
static uint64_t store_fp(const struct kvp_disk *k, uint64_t log_blocks)
{
	const uint64_t v[] = { k->g.layers, k->g.kv_heads,    k->g.head_dim,
			       k->g.dtype,  k->g.page_tokens, k->g.page_bytes,
			       k->nslots,   k->slot_bytes,    log_blocks };
	uint64_t h = DISK_MAGIC;

	for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++)
		h = kvp_mix64(h ^ v[i]);
	return h;
}

/* Writes a checkpoint of the map into the log: every mapped slot, as a new generation. */
static void log_checkpoint(struct kvp_disk *k)
{
	kvp_dlog_begin(k->log, k->seq);
	for (uint32_t i = 0; i < k->nslots; i++)
		if (k->slots[i].state == SLOT_VALID)
			log_slot(k, i, KVP_DLOG_SET);
	kvp_dlog_end(k->log);
}

/* Adopts the map from the log, else (none, damaged, another geometry) from the headers; then
 * starts the log's new generation. */
static int disk_adopt(struct kvp_disk *k, struct kvp_disk_open_info *info, char *err, size_t errlen)
{
	uint64_t blocks = kvp_dlog_blocks(k->nslots), max_seq = 0;
	struct timespec t0, t1;
	int rc;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	k->log_bytes = blocks * KVP_DISK_ALIGN;
	if (!(k->log = kvp_dlog_new(k->fd, k->base + (uint64_t)k->nslots * k->slot_bytes, blocks,
				    store_fp(k, blocks)))) {
		snprintf(err, errlen, "out of memory for the log");
		return -ENOMEM;
	}
	rc = kvp_dlog_replay(k->log, log_apply, k, &max_seq, info->log_why, sizeof(info->log_why));
	if (rc == 0) {
		info->from_log = true;
		/* Pages written after the log's last block landed have higher numbers. */
		k->seq = max_seq + (1ull << 32);
	} else {
		for (uint32_t i = 0; i < k->nslots; i++)
			k->slots[i] = (struct slot){ 0 };
		if ((rc = disk_scan(k, info, err, errlen)) < 0)
			return rc;
	}
	map_build(k, info);
	log_checkpoint(k);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	info->adopt_us = (uint64_t)(((int64_t)t1.tv_sec - t0.tv_sec) * 1000000000 +
				    ((int64_t)t1.tv_nsec - t0.tv_nsec)) /
			 1000u;
	return 0;
}

struct kvp_disk *kvp_disk_open(const char *path, uint64_t offset, uint64_t pages,
			       const struct kvp_disk_geom *g, struct kvp_disk_open_info *info,
			       char *err, size_t errlen)
{
	struct kvp_disk *k;
	uint64_t cap = 2;
	int rc;

	*info = (struct kvp_disk_open_info){ 0 };
	err[0] = 0;
	if (!pages || pages >= NONE || !g->page_bytes || offset % KVP_DISK_ALIGN) {
		snprintf(err, errlen, "bad disk tier size or offset: %lu pages at byte %lu",
			 (unsigned long)pages, (unsigned long)offset);
		errno = EINVAL;
		return NULL;
	}
	if (!(k = calloc(1, sizeof(*k)))) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	k->g = *g;
	k->base = offset;
	k->slot_bytes = KVP_DISK_HDR_BYTES + round_up(g->page_bytes, KVP_DISK_ALIGN);
	k->nslots = (uint32_t)pages;
	while (cap < 2 * (uint64_t)k->nslots)
		cap <<= 1;
	k->tab_mask = cap - 1;
	k->slots = calloc(k->nslots, sizeof(*k->slots));
	k->free_stack = malloc(sizeof(uint32_t) * k->nslots);
	k->tab = malloc(sizeof(uint32_t) * cap);
	k->fd = open(path, O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0600);
	if (!k->slots || !k->free_stack || !k->tab) {
		snprintf(err, errlen, "out of memory for the map of %u pages", k->nslots);
		rc = -ENOMEM;
		goto fail;
	}
	memset(k->tab, 0xff, sizeof(uint32_t) * cap);
	if (k->fd < 0) {
		rc = -errno;
		snprintf(err, errlen, "cannot open %s with O_DIRECT: %s%s", path, strerror(-rc),
			 rc == -EINVAL ? " (the filesystem has no direct I/O: tmpfs?)" : "");
		goto fail;
	}
	if ((rc = disk_size(k, path,
			    (uint64_t)k->nslots * k->slot_bytes +
				    kvp_conf_disk_log_bytes(k->nslots),
			    info, err, errlen)) < 0 ||
	    (rc = disk_adopt(k, info, err, errlen)) < 0) {
		if (!err[0])
			snprintf(err, errlen, "%s: %s", path, strerror(-rc));
		goto fail;
	}
	return k;
fail:
	kvp_disk_close(k);
	errno = -rc;
	return NULL;
}

void kvp_disk_close(struct kvp_disk *k)
{
	if (!k)
		return;
	if (k->log && k->fd >= 0) { /* what the log still holds, written now */
		if (kvp_dlog_wants_checkpoint(k->log))
			log_checkpoint(k);
		kvp_dlog_sync(k->log);
	}
	kvp_dlog_free(k->log);
	if (k->fd >= 0)
		close(k->fd);
	free(k->slots);
	free(k->free_stack);
	free(k->tab);
	free(k);
}

int kvp_disk_fd(const struct kvp_disk *k)
{
	return k->fd;
}

uint64_t kvp_disk_slot_bytes(const struct kvp_disk *k)
{
	return k->slot_bytes;
}

uint64_t kvp_disk_slot_off(const struct kvp_disk *k, uint32_t slot)
{
	return k->base + (uint64_t)slot * k->slot_bytes;
}

uint64_t kvp_disk_page_bytes(const struct kvp_disk *k)
{
	return k->g.page_bytes;
}

uint32_t kvp_disk_slots(const struct kvp_disk *k)
{
	return k->nslots;
}

uint32_t kvp_disk_used(const struct kvp_disk *k)
{
	return k->used;
}

int64_t kvp_disk_find(const struct kvp_disk *k, const struct kvp_disk_key *key)
{
	uint64_t i;

	if (!key->len || key->len > KVP_DISK_KEY_MAX)
		return -ENOENT;
	i = tab_find(k, key->ns, key->keyed, key->data, key->len);
	return k->tab[i] == NONE ? -ENOENT : (int64_t)k->tab[i];
}

int kvp_disk_reserve(struct kvp_disk *k, uint32_t *slot, int *dropped)
{
	*dropped = 0;
	if (k->nfree) {
		*slot = k->free_stack[--k->nfree];
		k->slots[*slot].state = SLOT_WRITING;
		return 0;
	}
	for (uint32_t n = 0; n < k->nslots; n++) {
		uint32_t i = k->cursor;
		struct slot *s = &k->slots[i];

		k->cursor = (k->cursor + 1) % k->nslots;
		if (s->state != SLOT_VALID || s->pins)
			continue;
		tab_del(k, i);
		s->state = SLOT_WRITING;
		*slot = i;
		*dropped = 1;
		return 0;
	}
	return -EBUSY;
}

int kvp_disk_header(struct kvp_disk *k, uint32_t slot, const struct kvp_disk_key *key,
		    uint32_t page_crc, void *hdr)
{
	struct disk_hdr h = { 0 };

	if (!key->len || key->len > KVP_DISK_KEY_MAX)
		return -EINVAL;
	h.magic = DISK_MAGIC;
	h.version = DISK_VERSION;
	h.layers = k->g.layers;
	h.kv_heads = k->g.kv_heads;
	h.head_dim = k->g.head_dim;
	h.dtype = k->g.dtype;
	h.page_tokens = k->g.page_tokens;
	h.keyed_len = (uint32_t)(key->keyed != 0) << 8 | key->len;
	h.page_bytes = k->g.page_bytes;
	h.seq = ++k->seq;
	h.ns = key->ns;
	h.page_crc = page_crc;
	k->slots[slot].seq = h.seq;
	k->slots[slot].page_crc = page_crc;
	memcpy(h.key, key->data, key->len);
	h.hdr_crc = hdr_crc(&h);
	memset(hdr, 0, KVP_DISK_HDR_BYTES);
	memcpy(hdr, &h, sizeof(h));
	return 0;
}

void kvp_disk_written(struct kvp_disk *k, uint32_t slot, const struct kvp_disk_key *key, bool ok)
{
	struct slot *s = &k->slots[slot];

	if (!ok || kvp_disk_find(k, key) >= 0) {
		slot_free(k, slot);
		return;
	}
	s->ns = key->ns;
	s->keyed = (uint8_t)(key->keyed != 0);
	s->len = (uint8_t)key->len;
	memcpy(s->key, key->data, key->len);
	s->state = SLOT_VALID;
	tab_add(k, slot);
}

void kvp_disk_pin(struct kvp_disk *k, uint32_t slot)
{
	k->slots[slot].pins++;
}

void kvp_disk_unpin(struct kvp_disk *k, uint32_t slot)
{
	struct slot *s = &k->slots[slot];

	if (s->pins && --s->pins == 0 && s->state == SLOT_DEAD)
		slot_free(k, slot);
}

void kvp_disk_drop(struct kvp_disk *k, uint32_t slot)
{
	struct slot *s = &k->slots[slot];

	if (s->state != SLOT_VALID)
		return;
	tab_del(k, slot);
	if (s->pins) {
		s->state = SLOT_DEAD;
		return;
	}
	slot_free(k, slot);
}

int kvp_disk_verify(struct kvp_disk *k, uint32_t slot, const struct kvp_disk_key *key,
		    const void *hdr, const void *page)
{
	struct disk_hdr h;

	memcpy(&h, hdr, sizeof(h));
	if (h.magic == DISK_MAGIC && h.version == DISK_VERSION && h.hdr_crc == hdr_crc(&h) &&
	    geom_is(&h, &k->g) && h.ns == key->ns && (h.keyed_len >> 8 != 0) == (key->keyed != 0) &&
	    (h.keyed_len & 0xff) == key->len && memcmp(h.key, key->data, key->len) == 0 &&
	    h.page_crc == kvp_crc32c(page, k->g.page_bytes))
		return 0;
	kvp_disk_drop(k, slot);
	return -EBADMSG;
}

void kvp_disk_set_observer(struct kvp_disk *k, kvp_disk_observe_fn fn, void *ctx)
{
	k->observe = fn;
	k->observe_ctx = ctx;
}

void kvp_disk_observe_all(const struct kvp_disk *k)
{
	for (uint64_t i = 0; k->observe && i <= k->tab_mask; i++)
		if (k->tab[i] != NONE)
			observe(k, &k->slots[k->tab[i]], true);
}

int kvp_disk_log_take(struct kvp_disk *k, const void **buf, uint32_t *len, uint64_t *off,
		      uintptr_t *id)
{
	if (kvp_dlog_wants_checkpoint(k->log) && !kvp_dlog_inflight(k->log))
		log_checkpoint(k);
	return kvp_dlog_take(k->log, buf, len, off, id);
}

void kvp_disk_log_done(struct kvp_disk *k, uintptr_t id, int res)
{
	kvp_dlog_done(k->log, id, res);
}

void kvp_disk_log_stats(const struct kvp_disk *k, struct kvp_disk_log_stats *st)
{
	st->region_bytes = k->log_bytes;
	st->written_bytes = kvp_dlog_written(k->log);
	st->checkpoints = kvp_dlog_checkpoints(k->log);
	st->errors = kvp_dlog_errors(k->log);
}
