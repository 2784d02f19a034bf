/* disk_log.c - the log of a disk store's key map: blocks, records, generations, replay
 * (disk_log.h). */
#include "disk_log.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "budget.h"
#include "disk.h"
#include "crc32c.h"
#include "mix.h"

#define LOG_MAGIC 0x31474c4b53445640ULL /* "@VDSKLG1" */
#define LOG_VERSION 2u
/* A block is the store's unit of direct I/O; a record holds a key as long as a slot's. */
#define BLOCK KVP_DISK_ALIGN
#define KEY_MAX KVP_DISK_KEY_MAX
/* Blocks one write carries at most, writes in flight at most. */
#define CHUNK_BLOCKS 64u
#define INFLIGHT_MAX 16u
/* Blocks waiting to be written past a checkpoint's: past them the records are dropped and a new
 * checkpoint wanted (a disk that stopped answering must not grow kvpoold's memory). */
#define WAIT_EXTRA 1024u

/* A block's header (little-endian, as on the disk). */
struct blk {
	uint64_t magic;
	uint32_t version;
	uint32_t crc; /* CRC32C of the whole block with this field 0 */
	uint64_t fp;
	uint64_t nonce;
	uint64_t max_seq;
	uint32_t pos;
	uint32_t nrec;
	uint32_t ckpt_blocks;
	uint32_t gen;
	uint64_t pad;
};
_Static_assert(sizeof(struct blk) == 64, "the block header's layout is the log format");

/* A record (little-endian, as on the disk). */
struct rec {
	uint32_t slot;
	uint8_t kind, keyed, len, pad;
	uint64_t seq;
	uint64_t ns;
	uint32_t page_crc;
	uint32_t crc; /* CRC32C of the record with this field 0 */
	uint8_t key[KEY_MAX];
};
_Static_assert(sizeof(struct rec) == 96, "the record's layout is the log format");
_Static_assert((BLOCK - sizeof(struct blk)) / sizeof(struct rec) == KVP_DISK_LOG_RECS,
	       "budget.h sizes the log region with this many records to a block");

/* Consecutive blocks written with one write. */
struct chunk {
	struct chunk *next;
	uint8_t *buf;
	uint64_t pos; /* of its first block */
	uint32_t nblocks;
};

struct kvp_dlog {
	int fd;
	uint64_t off, nblocks, fp;
	uint64_t nonce, max_seq;
	uint32_t gen, ckpt_blocks;
	uint64_t pos; /* the next block's position */
	struct chunk *open;
	struct chunk *head, *tail;  /* closed, to be taken */
	struct chunk *flying;	    /* taken, not done */
	uint64_t waiting, wait_max; /* blocks in open and head..tail */
	uint32_t inflight;
	bool want; /* a new generation is due */
	uint64_t written, ckpts, errors;
};

uint64_t kvp_dlog_blocks(uint64_t slots)
{
	return kvp_conf_disk_log_bytes(slots) / BLOCK;
}

struct kvp_dlog *kvp_dlog_new(int fd, uint64_t off, uint64_t nblocks, uint64_t fp)
{
	struct kvp_dlog *l = calloc(1, sizeof(*l));

	if (!l)
		return NULL;
	l->fd = fd;
	l->off = off;
	l->nblocks = nblocks;
	l->fp = fp;
	l->want = true;
	l->wait_max = nblocks / 4 + WAIT_EXTRA;
	return l;
}

static void chunk_free(struct chunk *c)
{
	if (c)
		free(c->buf);
	free(c);
}

static void drop_waiting(struct kvp_dlog *l)
{
	chunk_free(l->open);
	l->open = NULL;
	while (l->head) {
		struct chunk *c = l->head;

		l->head = c->next;
		chunk_free(c);
	}
	l->tail = NULL;
	l->waiting = 0;
}

void kvp_dlog_free(struct kvp_dlog *l)
{
	if (!l)
		return;
	drop_waiting(l);
	while (l->flying) {
		struct chunk *c = l->flying;

		l->flying = c->next;
		chunk_free(c);
	}
	free(l);
}

static uint32_t rec_crc(const struct rec *r)
{
	struct rec c = *r;

	c.crc = 0;
	return kvp_crc32c(&c, sizeof(c));
}

static void close_open(struct kvp_dlog *l)
{
	struct chunk *c = l->open;

	if (!c)
		return;
	l->open = NULL;
	if (l->tail)
		l->tail->next = c;
	else
		l->head = c;
	l->tail = c;
}

/* A new empty block at the end of the open chunk: its records, or NULL (no room: the region full
 * or too much waiting; a checkpoint is wanted then, the waiting blocks dropped). */
static uint8_t *new_block(struct kvp_dlog *l)
{
	struct chunk *c = l->open;
	struct blk h = { 0 };
	uint8_t *b;

	if (l->pos >= l->nblocks || l->waiting >= l->wait_max) {
		l->want = true;
		drop_waiting(l);
		return NULL;
	}
	if (!c || c->nblocks == CHUNK_BLOCKS) {
		close_open(l);
		if (!(c = calloc(1, sizeof(*c))) ||
		    posix_memalign((void **)&c->buf, BLOCK, (size_t)BLOCK * CHUNK_BLOCKS) != 0) {
			free(c);
			l->want = true;
			drop_waiting(l);
			return NULL;
		}
		c->pos = l->pos;
		l->open = c;
	}
	b = c->buf + (size_t)c->nblocks++ * BLOCK;
	memset(b, 0, BLOCK);
	h.pos = (uint32_t)l->pos++;
	memcpy(b, &h, sizeof(h));
	l->waiting++;
	return b;
}

bool kvp_dlog_wants_checkpoint(const struct kvp_dlog *l)
{
	return l->want;
}

static uint64_t fresh_nonce(uint64_t old)
{
	uint64_t n = 0;
	struct timespec ts;

	if (getrandom(&n, sizeof(n), GRND_NONBLOCK) != (ssize_t)sizeof(n)) {
		clock_gettime(CLOCK_REALTIME, &ts);
		n = kvp_mix64((uint64_t)ts.tv_sec << 30 ^ (uint64_t)ts.tv_nsec ^
			      (uint64_t)getpid() << 48);
	}
	return n == old ? n + 1 : n;
}

void kvp_dlog_begin(struct kvp_dlog *l, uint64_t seq)
{
	drop_waiting(l);
	l->nonce = fresh_nonce(l->nonce);
	l->gen++;
	l->pos = 0;
	l->ckpt_blocks = 0;
	l->max_seq = seq;
	l->want = false;
	l->ckpts++;
}

void kvp_dlog_add(struct kvp_dlog *l, const struct kvp_dlog_rec *r, uint64_t seq)
{
	struct chunk *c = l->open;
	uint8_t *b = NULL;
	struct blk h;
	struct rec x = { 0 };

	if (l->want || r->len > KEY_MAX)
		return; /* the checkpoint to come holds it */
	if (c && c->nblocks) {
		b = c->buf + (size_t)(c->nblocks - 1) * BLOCK;
		memcpy(&h, b, sizeof(h));
		if (h.nrec == KVP_DISK_LOG_RECS)
			b = NULL;
	}
	if (!b && !(b = new_block(l)))
		return;
	memcpy(&h, b, sizeof(h));
	x.slot = r->slot;
	x.kind = (uint8_t)r->kind;
	x.keyed = (uint8_t)(r->keyed != 0);
	x.len = (uint8_t)r->len;
	x.seq = r->seq;
	x.ns = r->ns;
	x.page_crc = r->page_crc;
	if (r->len)
		memcpy(x.key, r->key, r->len);
	x.crc = rec_crc(&x);
	memcpy(b + sizeof(h) + (size_t)h.nrec * sizeof(x), &x, sizeof(x));
	h.nrec++;
	memcpy(b, &h, sizeof(h));
	if (seq > l->max_seq)
		l->max_seq = seq;
}

void kvp_dlog_end(struct kvp_dlog *l)
{
	if (!l->pos) /* an empty map: one empty block says so */
		new_block(l);
	l->ckpt_blocks = (uint32_t)l->pos;
	close_open(l); /* the checkpoint leaves in writes of its own */
}

/* Fills the headers of c's blocks: the generation, the checkpoint's length, the CRCs. */
static void finish(const struct kvp_dlog *l, struct chunk *c)
{
	for (uint32_t i = 0; i < c->nblocks; i++) {
		uint8_t *b = c->buf + (size_t)i * BLOCK;
		struct blk h;

		memcpy(&h, b, sizeof(h));
		h.magic = LOG_MAGIC;
		h.version = LOG_VERSION;
		h.fp = l->fp;
		h.nonce = l->nonce;
		h.max_seq = l->max_seq;
		h.ckpt_blocks = l->ckpt_blocks;
		h.gen = l->gen;
		h.crc = 0;
		memcpy(b, &h, sizeof(h));
		h.crc = kvp_crc32c(b, BLOCK);
		memcpy(b, &h, sizeof(h));
	}
}

static struct chunk *pop(struct kvp_dlog *l)
{
	struct chunk *c;

	if (!l->head)
		close_open(l);
	if (!(c = l->head))
		return NULL;
	l->head = c->next;
	if (!l->head)
		l->tail = NULL;
	c->next = NULL;
	l->waiting -= c->nblocks;
	finish(l, c);
	return c;
}

int kvp_dlog_take(struct kvp_dlog *l, const void **buf, uint32_t *len, uint64_t *off, uintptr_t *id)
{
	struct chunk *c;

	if (l->inflight >= INFLIGHT_MAX)
		return l->head || l->open ? -EBUSY : -ENODATA;
	if (!(c = pop(l)))
		return -ENODATA;
	c->next = l->flying;
	l->flying = c;
	l->inflight++;
	*buf = c->buf;
	*len = c->nblocks * BLOCK;
	*off = l->off + c->pos * BLOCK;
	*id = (uintptr_t)c;
	return 0;
}

void kvp_dlog_done(struct kvp_dlog *l, uintptr_t id, int res)
{
	struct chunk **pp = &l->flying, *c;

	while ((c = *pp) && (uintptr_t)c != id)
		pp = &c->next;
	if (!c)
		return;
	*pp = c->next;
	l->inflight--;
	if (res == (int)(c->nblocks * BLOCK)) {
		l->written += (uint64_t)c->nblocks * BLOCK;
	} else {
		l->errors++;
		l->want = true;
	}
	chunk_free(c);
}

int kvp_dlog_sync(struct kvp_dlog *l)
{
	struct chunk *c;
	int rc = 0;

	while ((c = pop(l))) {
		size_t n = (size_t)c->nblocks * BLOCK;

		if (!rc && pwrite(l->fd, c->buf, n, (off_t)(l->off + c->pos * BLOCK)) != (ssize_t)n)
			rc = errno ? -errno : -EIO;
		if (!rc)
			l->written += n;
		chunk_free(c);
	}
	if (rc)
		l->errors++;
	return rc;
}

uint32_t kvp_dlog_inflight(const struct kvp_dlog *l)
{
	return l->inflight;
}

uint64_t kvp_dlog_written(const struct kvp_dlog *l)
{
	return l->written;
}

uint64_t kvp_dlog_checkpoints(const struct kvp_dlog *l)
{
	return l->ckpts;
}

uint64_t kvp_dlog_errors(const struct kvp_dlog *l)
{
	return l->errors;
}

/* Checks block b at position pos (first: block 0's header, NULL for block 0 itself): 0, or
 * -ENOENT (no log: never written, another format), -ESTALE (another store's), -EBADMSG (torn,
 * out of place, another generation), with *why in words. */
static int blk_check(const struct kvp_dlog *l, const uint8_t *b, uint64_t pos,
		     const struct blk *first, const char **why)
{
	struct blk h;
	uint8_t tmp[BLOCK];

	memcpy(&h, b, sizeof(h));
	*why = "no log block";
	if (h.magic != LOG_MAGIC)
		return -ENOENT;
	*why = "a log of another format";
	if (h.version != LOG_VERSION)
		return -ENOENT;
	memcpy(tmp, b, BLOCK);
	memset(tmp + offsetof(struct blk, crc), 0, sizeof(h.crc));
	*why = "a torn log block";
	if (kvp_crc32c(tmp, BLOCK) != h.crc)
		return -EBADMSG;
	*why = "a log of another geometry or size";
	if (h.fp != l->fp)
		return -ESTALE;
	*why = "a log block out of place";
	if (h.pos != pos || h.nrec > KVP_DISK_LOG_RECS)
		return -EBADMSG;
	*why = "a block of an older generation";
	if (first && (h.nonce != first->nonce || h.gen != first->gen))
		return -EBADMSG;
	return 0;
}

int kvp_dlog_replay(struct kvp_dlog *l, kvp_dlog_apply_fn fn, void *ctx, uint64_t *max_seq,
		    char *why, size_t whylen)
{
	const uint64_t per = 256; /* blocks read at a time */
	struct blk first = { 0 };
	uint64_t pos = 0, have = 0, got = 0;
	uint8_t *buf = NULL;
	int rc = 0;

	*max_seq = 0;
	why[0] = 0;
	if (posix_memalign((void **)&buf, BLOCK, (size_t)BLOCK * per) != 0)
		return -ENOMEM;
	for (pos = 0; pos < l->nblocks; pos++) {
		const uint8_t *b;
		const char *what;
		int bad;
		struct blk h;

		if (pos == have) {
			uint64_t n = l->nblocks - pos < per ? l->nblocks - pos : per;
			ssize_t r = pread(l->fd, buf, (size_t)(n * BLOCK),
					  (off_t)(l->off + pos * BLOCK));

			if (r < 0) {
				rc = -errno;
				snprintf(why, whylen, "reading the log: %s", strerror(errno));
				break;
			}
			got = (uint64_t)r / BLOCK;
			have = pos + got;
			if (!got)
				break; /* past a file's end */
		}
		b = buf + (size_t)(pos - (have - got)) * BLOCK;
		if ((bad = blk_check(l, b, pos, pos ? &first : NULL, &what)) < 0) {
			if (pos)
				break; /* the end of the log, or a torn tail */
			snprintf(why, whylen, "%s", what);
			rc = bad;
			break;
		}
		memcpy(&h, b, sizeof(h));
		if (!pos)
			first = h;
		if (h.max_seq > *max_seq)
			*max_seq = h.max_seq;
		for (uint32_t i = 0; i < h.nrec; i++) {
			struct rec x;
			struct kvp_dlog_rec r;

			memcpy(&x, b + sizeof(h) + (size_t)i * sizeof(x), sizeof(x));
			if (x.crc != rec_crc(&x) ||
			    (x.kind != KVP_DLOG_SET && x.kind != KVP_DLOG_FREE) ||
			    x.len > KEY_MAX || (x.kind == KVP_DLOG_SET && !x.len)) {
				snprintf(why, whylen, "a bad record in log block %lu",
					 (unsigned long)pos);
				rc = -EBADMSG;
				goto out;
			}
			r = (struct kvp_dlog_rec){ x.slot,     (enum kvp_dlog_kind)x.kind,
						   x.keyed,    x.len,
						   x.ns,       x.seq,
						   x.page_crc, x.key };
			if (x.seq > *max_seq)
				*max_seq = x.seq;
			if (fn(ctx, &r) < 0) {
				snprintf(why, whylen, "log block %lu names slot %u, past the store",
					 (unsigned long)pos, x.slot);
				rc = -EBADMSG;
				goto out;
			}
		}
	}
	if (!rc && pos == 0 && !why[0]) {
		snprintf(why, whylen, "no log block");
		rc = -ENOENT;
	}
	if (!rc && pos < first.ckpt_blocks) {
		snprintf(why, whylen, "its checkpoint ends at block %lu of %u", (unsigned long)pos,
			 first.ckpt_blocks);
		rc = -EBADMSG;
	}
out:
	if (!rc)
		l->gen = first.gen;
	l->nonce = first.nonce;
	free(buf);
	return rc;
}
