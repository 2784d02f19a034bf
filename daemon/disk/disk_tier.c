/* disk_tier.c - the pools' disk tier: write-back of evicted host pages, reads for Fetch, the
 * rings and their eventfd (disk_tier.h). */
#include "disk_tier.h"

#include <errno.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "crc32c.h"
#include "disk.h"
#include "fault.h"
#include "log.h"
#include "page_key.h"
#include "pool_cache.h"

/* Staging slots of one pool (and so its I/O in flight at most): DT_STAGE_BYTES of them, at
 * least DT_STAGE_MIN and at most DT_STAGE_MAX: an Alloc that evicts that many pages in one turn
 * has them all written. */
#define DT_STAGE_BYTES (64ull << 20)
#define DT_STAGE_MIN 32u
#define DT_STAGE_MAX 1024u
/* A registered buffer holds at most 1 GiB: staging past that is written without registration. */
#define DT_REG_MAX (1ull << 30)

/* Write-back in place starts when the host tier's free pages fall under a DT_WB_FREE_DIV-th of
 * it and holds at most a DT_WB_HOLD_DIV-th of the tier and of its evictable pages at once (a held
 * page evicted stays MOVING until written: the rest is there for Allocs); it looks at
 * DT_WB_SCAN times the pages it may start. */
#define DT_WB_FREE_DIV 4u
#define DT_WB_HOLD_DIV 8u
#define DT_WB_SCAN 4u
/* After an in-place write failed, the write-back rests this long (a failing disk must not keep
 * the coldest pages held and rewritten). */
#define DT_WB_PAUSE_NS (100ull * 1000 * 1000)

/* IO_WRITE: a staging slot's copy of an evicted page; IO_WBACK: a held host page written in
 * place (its header in a header slot). */
enum dt_kind { IO_NONE, IO_WRITE, IO_READ, IO_WBACK };

/* A page's key as the disk tier names it. */
struct kvp_dt_key {
	uint32_t len;
	uint8_t b[KVP_KEY_MAX];
};

struct dt_pool;

/* A read not started yet (every staging slot busy). */
struct dt_req {
	uint64_t ns;
	int keyed;
	struct kvp_dt_key key;
	uint32_t page, i; /* the host page, and the page's index in its read */
	kvp_below_read_fn done;
	void *arg;
	struct dt_req *next;
};

/* One staging slot's I/O. */
struct dt_io {
	struct dt_pool *dp;
	enum dt_kind kind;
	uint32_t buf, slot;
	uint64_t ns;
	int keyed;
	struct kvp_dt_key key;
	uint32_t page, i; /* reads: the host page, the page's index in its read */
	uint32_t hold;	  /* IO_WBACK: the index's hold of the page */
	kvp_below_read_fn done;
	void *arg;
	uint64_t start_ns;
	bool failed;	     /* it failed or was short */
	struct iovec iov[2]; /* a direct read's header and page */
};

struct dt_pool {
	struct kvp_dt *dt;
	struct kvpd_pool *p; /* not to be touched once dead (the pool may be gone) */
	char name[KVP_POOL_NAME_MAX];
	uint64_t page_bytes;
	struct kvp_disk *k;
	struct io_uring ring;
	bool ring_ok, fixed, dead;
	/* Reads land in the host page itself (its header in a staging slot): pages of whole
	 * 4 KiB blocks (register_buffers). */
	bool direct;
	uint8_t *host_base;
	uint8_t *staging; /* DT_QD slots of kvp_disk_slot_bytes */
	uint64_t slot_bytes;
	uint32_t nbuf;
	struct dt_io *ios;   /* nbuf */
	uint32_t *free_bufs; /* nbuf */
	uint32_t nfree;
	uint32_t inflight, queued;
	/* In-place writes: nwb header slots (hdrs, KVP_DISK_HDR_BYTES each), their I/O and free
	 * list; qd the pool's disk_queue_depth (I/O in flight at most); through: write-through. */
	uint8_t *hdrs;
	struct dt_io *wios;	      /* nwb */
	uint32_t *free_wb;	      /* nwb */
	struct kvp_index_hold *holds; /* nwb */
	uint32_t nwb, nwfree, qd;
	bool through;
	uint64_t wb_pause_until; /* CLOCK_MONOTONIC ns */
	bool wb_active;		 /* the write-back found pages to write last turn */
	/* Staging slots copied and waiting for the queue depth (a ring of nbuf). */
	uint32_t *pend;
	uint32_t pend_head, npend;
	struct dt_req *wait_head, *wait_tail;
	bool dirty; /* SQEs to submit */
	struct kvp_disk_stats st;
	struct dt_pool *next;
};

struct kvp_dt {
	int efd;
	struct dt_pool *pools;
	struct dt_pool *failed; /* pools whose store could not open: not tried again */
	kvp_dt_observe_fn observe;
	void *observe_ctx;
};

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

struct kvp_dt *kvp_dt_new(void)
{
	struct kvp_dt *dt = calloc(1, sizeof(*dt));

	if (!dt)
		return NULL;
	dt->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (dt->efd < 0) {
		free(dt);
		return NULL;
	}
	return dt;
}

int kvp_dt_fd(const struct kvp_dt *dt)
{
	return dt->efd;
}

static struct dt_pool *dp_find(const struct kvp_dt *dt, const struct kvpd_pool *p)
{
	for (struct dt_pool *dp = dt ? dt->pools : NULL; dp; dp = dp->next)
		if (dp->p == p && !dp->dead)
			return dp;
	return NULL;
}

bool kvp_dt_has(const struct kvp_dt *dt, const struct kvpd_pool *p)
{
	return dp_find(dt, p) != NULL;
}

static uint8_t *buf_at(const struct dt_pool *dp, uint32_t b)
{
	return dp->staging + (uint64_t)b * dp->slot_bytes;
}

static struct kvp_disk_key disk_key(uint64_t ns, int keyed, const struct kvp_dt_key *k)
{
	return (struct kvp_disk_key){ ns, keyed, k->len, k->b };
}

static struct io_uring_sqe *get_sqe(struct dt_pool *dp)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&dp->ring);

	if (!sqe) { /* the ring holds nbuf entries: submitted ones free theirs */
		io_uring_submit(&dp->ring);
		sqe = io_uring_get_sqe(&dp->ring);
	}
	return sqe;
}

/* Starts reading r's page: into the host page itself with its header into a staging slot
 * (direct), else the whole slot into the staging slot. 0, or -ENOENT (gone from the disk since),
 * -EBUSY (no SQE). */
static int read_start(struct dt_pool *dp, const struct dt_req *r)
{
	struct kvp_disk_key dk = disk_key(r->ns, r->keyed, &r->key);
	int64_t slot = kvp_disk_find(dp->k, &dk);
	struct io_uring_sqe *sqe;
	int fd = kvp_disk_fd(dp->k);
	struct dt_io *io;
	uint64_t off;
	uint32_t b;

	if (slot < 0)
		return -ENOENT;
	if (!(sqe = get_sqe(dp)))
		return -EBUSY;
	off = kvp_disk_slot_off(dp->k, (uint32_t)slot);
	b = dp->free_bufs[--dp->nfree];
	io = &dp->ios[b];
	*io = (struct dt_io){ .dp = dp,
			      .kind = IO_READ,
			      .buf = b,
			      .slot = (uint32_t)slot,
			      .ns = r->ns,
			      .keyed = r->keyed,
			      .key = r->key,
			      .page = r->page,
			      .i = r->i,
			      .done = r->done,
			      .arg = r->arg,
			      .start_ns = now_ns() };
	kvp_disk_pin(dp->k, (uint32_t)slot);
	if (dp->direct) { /* one read: the header into the staging slot, the page in place */
		io->iov[0] = (struct iovec){ buf_at(dp, b), KVP_DISK_HDR_BYTES };
		io->iov[1] = (struct iovec){ dp->host_base + (uint64_t)r->page * dp->page_bytes,
					     dp->page_bytes };
		io_uring_prep_readv(sqe, fd, io->iov, 2, off);
	} else if (dp->fixed) {
		io_uring_prep_read_fixed(sqe, fd, buf_at(dp, b), (unsigned)dp->slot_bytes, off, 0);
	} else {
		io_uring_prep_read(sqe, fd, buf_at(dp, b), (unsigned)dp->slot_bytes, off);
	}
	io_uring_sqe_set_data(sqe, io);
	dp->inflight++;
	dp->dirty = true;
	return 0;
}

/* Reads waiting for a staging slot go as slots free up; those whose page left the disk meanwhile
 * end as misses. */
static void start_waiting(struct dt_pool *dp)
{
	while (dp->wait_head && dp->nfree && dp->inflight < dp->qd) {
		struct dt_req *r = dp->wait_head;
		int rc;

		if ((rc = read_start(dp, r)) == -EBUSY)
			return;
		dp->wait_head = r->next;
		if (!dp->wait_head)
			dp->wait_tail = NULL;
		dp->queued--;
		if (rc < 0) {
			dp->st.read_misses++;
			r->done(r->arg, r->i, false);
		}
		free(r);
	}
}

/* Queues (or starts) the read of one page: 0, -ENOENT (not on the disk), -ENOMEM. */
static int read_one(struct dt_pool *dp, uint64_t ns, int keyed, const struct kvp_dt_key *key,
		    uint32_t page, uint32_t i, kvp_below_read_fn done, void *arg)
{
	struct kvp_disk_key dk = disk_key(ns, keyed, key);
	struct dt_req *r;

	if (kvp_disk_find(dp->k, &dk) < 0) {
		dp->st.read_misses++;
		return -ENOENT;
	}
	if (!(r = malloc(sizeof(*r))))
		return -ENOMEM;
	*r = (struct dt_req){ ns, keyed, *key, page, i, done, arg, NULL };
	if (dp->nfree && !dp->wait_head && dp->inflight < dp->qd && read_start(dp, r) == 0) {
		free(r);
		return 0;
	}
	if (dp->wait_tail)
		dp->wait_tail->next = r;
	else
		dp->wait_head = r;
	dp->wait_tail = r;
	dp->queued++;
	return 0;
}

/* Submits staging slot io's write (its page and header copied in already): 0, or -EBUSY (no
 * SQE). */
static int write_prep(struct dt_pool *dp, struct dt_io *io)
{
	struct io_uring_sqe *sqe = get_sqe(dp);
	uint8_t *buf = buf_at(dp, io->buf);
	uint64_t off = kvp_disk_slot_off(dp->k, io->slot);

	if (!sqe)
		return -EBUSY;
	if (dp->fixed)
		io_uring_prep_write_fixed(sqe, kvp_disk_fd(dp->k), buf, (unsigned)dp->slot_bytes,
					  off, 0);
	else
		io_uring_prep_write(sqe, kvp_disk_fd(dp->k), buf, (unsigned)dp->slot_bytes, off);
	io_uring_sqe_set_data(sqe, io);
	dp->inflight++;
	dp->dirty = true;
	return 0;
}

/* Queue slots staged writes leave to the write-back while it has work: half the depth (it
 * writes the pages eviction takes next, so that they need no copy). */
static uint32_t wb_room(const struct dt_pool *dp)
{
	uint32_t want = dp->qd / 2, held = dp->nwb - dp->nwfree;

	return dp->wb_active && held < want ? want - held : 0;
}

/* Staged writes waiting for the queue depth go as I/O completes (after waiting reads). */
static void start_pending(struct dt_pool *dp)
{
	while (dp->npend && dp->inflight + wb_room(dp) < dp->qd) {
		struct dt_io *io = &dp->ios[dp->pend[dp->pend_head]];

		if (write_prep(dp, io) < 0)
			return;
		dp->pend_head = (dp->pend_head + 1) % dp->nbuf;
		dp->npend--;
	}
}

/* The index's spill hook: a host page about to be evicted goes to the disk unless it is there
 * already (its write-back reached it) or being written in place (the index does not ask then):
 * copied with its CRC32C into a staging slot, written at once or, past the queue depth, as I/O
 * completes; with no staging slot or disk slot free now it is dropped (counted). */
static void spill_page(void *ctx, uint64_t ns, int keyed, const uint8_t *key, size_t klen,
		       uint32_t page)
{
	struct dt_pool *dp = ctx;
	struct kvp_disk_key dk = { ns, keyed, (uint32_t)klen, key };
	const uint8_t *src;
	struct dt_io *io;
	uint32_t b, slot, crc;
	int dropped;

	if (dp->dead || klen == 0 || klen > KVP_KEY_MAX)
		return;
	if (kvp_disk_find(dp->k, &dk) >= 0) {
		dp->st.write_skipped++;
		return;
	}
	if (!dp->nfree || kvp_disk_reserve(dp->k, &slot, &dropped) < 0) {
		dp->st.write_dropped++;
		return;
	}
	dp->st.evicted_pages += (uint64_t)dropped;
	b = dp->free_bufs[--dp->nfree];
	io = &dp->ios[b];
	*io = (struct dt_io){ .dp = dp,
			      .kind = IO_WRITE,
			      .buf = b,
			      .slot = slot,
			      .ns = ns,
			      .keyed = keyed,
			      .page = page,
			      .start_ns = now_ns() };
	io->key.len = (uint32_t)klen;
	memcpy(io->key.b, key, klen);
	src = (const uint8_t *)dp->p->mem[KVP_TIER_ID_HOST].base +
	      (uint64_t)page * dp->p->page_bytes;
	crc = kvp_crc32c_copy(buf_at(dp, b) + KVP_DISK_HDR_BYTES, src, dp->p->page_bytes);
	kvp_disk_header(dp->k, slot, &dk, crc, buf_at(dp, b));
	if (dp->npend || dp->inflight + wb_room(dp) >= dp->qd || write_prep(dp, io) < 0)
		dp->pend[(dp->pend_head + dp->npend++) % dp->nbuf] = b;
}

/* kvp_index_hold's question: a page not on the disk yet, with a key the disk can name. */
static bool wb_want(void *ctx, uint64_t ns, int keyed, const uint8_t *key, size_t klen)
{
	const struct dt_pool *dp = ctx;
	struct kvp_disk_key dk = { ns, keyed, (uint32_t)klen, key };

	return klen && klen <= KVP_KEY_MAX && kvp_disk_find(dp->k, &dk) < 0;
}

/* Starts writing held host page h in place: one WRITEV of its header (from a header slot) and
 * the host page itself, its CRC32C taken now (the hold keeps the page's bytes and key until the
 * write ends). A page that finds no disk slot or SQE is let go (dropped, counted). */
static void wb_start(struct dt_pool *dp, const struct kvp_index_hold *h)
{
	struct kvp_disk_key dk = { h->ns, h->keyed, (uint32_t)h->key.len, h->key.data };
	uint8_t *src = dp->host_base + (uint64_t)h->page * dp->page_bytes, *hdr;
	struct io_uring_sqe *sqe = NULL;
	struct dt_io *io;
	uint32_t b, slot;
	int dropped;

	if (kvp_disk_reserve(dp->k, &slot, &dropped) < 0) {
		dp->st.write_dropped++;
		kvp_index_unhold(dp->p->ix, h->id, false);
		return;
	}
	if (!(sqe = get_sqe(dp))) {
		kvp_disk_written(dp->k, slot, &dk, false);
		dp->st.write_dropped++;
		kvp_index_unhold(dp->p->ix, h->id, false);
		return;
	}
	dp->st.evicted_pages += (uint64_t)dropped;
	b = dp->free_wb[--dp->nwfree];
	io = &dp->wios[b];
	hdr = dp->hdrs + (uint64_t)b * KVP_DISK_HDR_BYTES;
	*io = (struct dt_io){ .dp = dp,
			      .kind = IO_WBACK,
			      .buf = b,
			      .slot = slot,
			      .ns = h->ns,
			      .keyed = h->keyed,
			      .page = h->page,
			      .hold = h->id,
			      .start_ns = now_ns() };
	io->key.len = (uint32_t)h->key.len;
	memcpy(io->key.b, h->key.data, h->key.len);
	kvp_disk_header(dp->k, slot, &dk, kvp_crc32c(src, dp->page_bytes), hdr);
	io->iov[0] = (struct iovec){ hdr, KVP_DISK_HDR_BYTES };
	io->iov[1] = (struct iovec){ src, dp->page_bytes };
	io_uring_prep_writev(sqe, kvp_disk_fd(dp->k), io->iov, 2, kvp_disk_slot_off(dp->k, slot));
	io_uring_sqe_set_data(sqe, io);
	dp->inflight++;
	dp->dirty = true;
}

/* This turn's write-back of dp's pool: under write-back, once the host tier's free pages run
 * short, the next pages eviction would take are written in place ahead of it (eviction then
 * finds them on the disk and frees them at once); under write-through, every cached host page
 * not on the disk yet. Bounded by the header slots free, the queue depth and (write-back) a
 * share of the evictable pages, so Allocs always find pages to evict. */
static void writeback(struct dt_pool *dp)
{
	struct kvp_pages *hp = dp->p->pages[KVP_TIER_ID_HOST];
	uint32_t max, n, held = dp->nwb - dp->nwfree, cap = kvp_pages_total(hp) / DT_WB_HOLD_DIV;
	struct kvp_index_stats ist;

	if (dp->dead || !dp->nwb || (dp->wb_pause_until && now_ns() < dp->wb_pause_until) ||
	    (!dp->through &&
	     kvp_pages_count(hp, KVP_PAGE_FREE) >= kvp_pages_total(hp) / DT_WB_FREE_DIV)) {
		dp->wb_active = false;
		return;
	}
	if (!dp->nwfree || dp->inflight >= dp->qd)
		return;
	max = dp->qd - dp->inflight < dp->nwfree ? dp->qd - dp->inflight : dp->nwfree;
	if (!dp->through) {
		kvp_index_stats(dp->p->ix, &ist);
		if (ist.evictable_pages[KVP_TIER_ID_HOST] / DT_WB_HOLD_DIV < cap)
			cap = (uint32_t)(ist.evictable_pages[KVP_TIER_ID_HOST] / DT_WB_HOLD_DIV);
	}
	/* Pages held now (an eviction would keep them MOVING until written): a share of the tier */
	if (held >= cap)
		return;
	max = cap - held < max ? cap - held : max;
	n = kvp_index_hold(dp->p->ix, !dp->through, max, max * DT_WB_SCAN, wb_want, dp, dp->holds);
	for (uint32_t i = 0; i < n; i++)
		wb_start(dp, &dp->holds[i]);
	dp->wb_active = n || held;
}

/* One completion (no longer counted in flight): res the bytes moved or a negative errno. */
static void io_done(struct dt_pool *dp, struct dt_io *io, int res)
{
	struct kvp_disk_key dk = disk_key(io->ns, io->keyed, &io->key);
	bool direct = (io->kind == IO_READ && dp->direct) || io->kind == IO_WBACK, ok = false;
	uint64_t want = direct ? KVP_DISK_HDR_BYTES + dp->page_bytes : dp->slot_bytes;
	uint64_t us;

	if (kvp_fault_hit(KVP_FAULT_DISK_IO))
		res = -EIO;
	if ((res < 0 || (uint64_t)res != want) && !io->failed) {
		io->failed = true;
		dp->st.io_errors++;
		if (dp->st.io_errors == 1 || dp->st.io_errors % 1000 == 0)
			log_warn("disk tier of pool %s: a %s of slot %u %s%s (%lu errors so far); "
				 "the page is a miss",
				 dp->name, io->kind == IO_READ ? "read" : "write", io->slot,
				 res < 0 ? "failed: " : "was short", res < 0 ? strerror(-res) : "",
				 (unsigned long)dp->st.io_errors);
	}
	us = (now_ns() - io->start_ns) / 1000;
	if (io->kind == IO_WRITE || io->kind == IO_WBACK) {
		kvp_disk_written(dp->k, io->slot, &dk, !io->failed && !dp->dead);
		if (!io->failed) {
			dp->st.written_pages++;
			dp->st.written_bytes += dp->page_bytes;
			dp->st.write_us += us;
			if (io->kind == IO_WBACK)
				dp->st.write_inplace++;
			else
				dp->st.write_copied++;
		}
	} else {
		if (!io->failed && !dp->dead) {
			const uint8_t *b = buf_at(dp, io->buf);
			uint8_t *dst = (uint8_t *)dp->p->mem[KVP_TIER_ID_HOST].base +
				       (uint64_t)io->page * dp->page_bytes;
			const uint8_t *page = direct ? dst : b + KVP_DISK_HDR_BYTES;

			/* A direct read put the bytes in the leased page already: a failed check
			 * leaves them there, never cached (the Fetch frees the page). */
			if (kvp_disk_verify(dp->k, io->slot, &dk, b, page) == 0) {
				if (!direct)
					memcpy(dst, page, dp->page_bytes);
				ok = true;
			} else {
				dp->st.corrupt_pages++;
				if (dp->st.corrupt_pages == 1 || dp->st.corrupt_pages % 1000 == 0)
					log_warn(
						"disk tier of pool %s: a page failed its header or "
						"CRC32C check: a miss, its slot freed (%lu so far)",
						dp->name, (unsigned long)dp->st.corrupt_pages);
			}
		} else if (!dp->dead) {
			kvp_disk_drop(dp->k, io->slot);
		}
		kvp_disk_unpin(dp->k, io->slot);
		if (ok) {
			dp->st.read_pages++;
			dp->st.read_bytes += dp->page_bytes;
			dp->st.read_us += us;
		} else {
			dp->st.read_misses++;
		}
		io->done(io->arg, io->i, ok);
	}
	if (io->kind == IO_WBACK) { /* the page may go now; a dead pool's index is gone */
		if (io->failed)
			dp->wb_pause_until = now_ns() + DT_WB_PAUSE_NS;
		io->kind = IO_NONE;
		dp->free_wb[dp->nwfree++] = io->buf;
		if (!dp->dead)
			kvp_index_unhold(dp->p->ix, io->hold, !io->failed);
		return;
	}
	io->kind = IO_NONE;
	dp->free_bufs[dp->nfree++] = io->buf;
}

/* Handles dp's completions, DT_REAP at a time: the I/O that waits for the queue depth goes out
 * (one submission) before the completions' checks and copies run, so the disk does not idle
 * while the loop checks CRC32Cs. */
#define DT_REAP 64u
static void reap(struct dt_pool *dp)
{
	struct io_uring_cqe *cqes[DT_REAP];
	uint64_t data[DT_REAP];
	int res[DT_REAP];
	unsigned n;

	do {
		n = dp->ring_ok ? io_uring_peek_batch_cqe(&dp->ring, cqes, DT_REAP) : 0;
		for (unsigned i = 0; i < n; i++) {
			data[i] = io_uring_cqe_get_data64(cqes[i]);
			res[i] = cqes[i]->res;
			dp->inflight -= data[i] != 0;
		}
		if (n)
			io_uring_cq_advance(&dp->ring, n);
		if (!dp->dead)
			start_waiting(dp);
		start_pending(dp);
		if (dp->dirty && n) {
			dp->dirty = false;
			io_uring_submit(&dp->ring);
		}
		for (unsigned i = 0; i < n; i++)
			if (data[i] & 1) /* a write of the store's log (log_submit) */
				kvp_disk_log_done(dp->k, (uintptr_t)(data[i] & ~1ull), res[i]);
			else if (data[i])
				io_done(dp, (struct dt_io *)(uintptr_t)data[i], res[i]);
	} while (n == DT_REAP);
	if (!dp->dead)
		start_waiting(dp);
	start_pending(dp);
}

static void dp_free(struct dt_pool *dp)
{
	while (dp->ring_ok && dp->inflight) {
		struct io_uring_cqe *cqe;

		io_uring_submit(&dp->ring);
		if (io_uring_wait_cqe(&dp->ring, &cqe) < 0)
			break;
		reap(dp);
	}
	while (dp->wait_head) {
		struct dt_req *r = dp->wait_head;

		dp->wait_head = r->next;
		if (!dp->dead)
			r->done(r->arg, r->i, false);
		free(r);
	}
	if (dp->ring_ok)
		io_uring_queue_exit(&dp->ring);
	kvp_disk_close(dp->k);
	free(dp->staging);
	free(dp->ios);
	free(dp->free_bufs);
	free(dp->hdrs);
	free(dp->wios);
	free(dp->free_wb);
	free(dp->holds);
	free(dp->pend);
	free(dp);
}

/* Registers the staging slots with dp's ring as one fixed buffer (written and read with
 * WRITE_FIXED / READ_FIXED; without the registration, plain writes and reads). Reads land in the
 * host page itself (one READV: the header into a staging slot, the page in place) when pages
 * are whole 4 KiB blocks; the pool's host memory lives as long as the daemon (a reload never
 * removes a pool). */
static void register_buffers(struct dt_pool *dp)
{
	const struct kvp_tier_mem *h = &dp->p->mem[KVP_TIER_ID_HOST];
	struct iovec iov = { dp->staging, dp->slot_bytes * dp->nbuf };

	dp->host_base = h->base;
	dp->direct =
		dp->page_bytes % KVP_DISK_ALIGN == 0 && (uintptr_t)h->base % KVP_DISK_ALIGN == 0;
	dp->fixed = iov.iov_len <= DT_REG_MAX && io_uring_register_buffers(&dp->ring, &iov, 1) == 0;
}

/* Opens p's store and ring: 0 or a negative errno, logged. */
static int dp_open(struct kvp_dt *dt, struct kvpd_pool *p, struct dt_pool **out)
{
	const struct kvp_pool_conf *c = &p->conf;
	struct kvp_disk_geom g = { c->layers,	       c->kv_heads,    c->head_dim,
				   (uint32_t)c->dtype, c->page_tokens, p->page_bytes };
	struct kvp_disk_open_info info;
	struct dt_pool *dp = calloc(1, sizeof(*dp));
	char err[384];
	int rc;

	*out = dp;
	if (!dp)
		return -ENOMEM;
	dp->dt = dt;
	dp->p = p;
	dp->page_bytes = p->page_bytes;
	snprintf(dp->name, sizeof(dp->name), "%s", c->name);
	dp->k = kvp_disk_open(c->disk_path, c->disk_offset, c->disk_pages, &g, &info, err,
			      sizeof(err));
	if (!dp->k) {
		rc = -errno;
		log_err("disk tier of pool %s: %s; the pool runs without it", c->name, err);
		return rc ? rc : -EIO;
	}
	dp->slot_bytes = kvp_disk_slot_bytes(dp->k);
	dp->nbuf = (uint32_t)(DT_STAGE_BYTES / dp->slot_bytes);
	dp->nbuf = dp->nbuf < DT_STAGE_MIN ? DT_STAGE_MIN : dp->nbuf;
	dp->nbuf = dp->nbuf > DT_STAGE_MAX ? DT_STAGE_MAX : dp->nbuf;
	dp->qd = c->disk_queue_depth ? c->disk_queue_depth : 64;
	dp->through = c->disk == KVP_DISK_WRITE_THROUGH;
	/* In place: pages of whole 4 KiB blocks in 4 KiB-aligned host memory (O_DIRECT). */
	dp->nwb = p->page_bytes % KVP_DISK_ALIGN == 0 &&
				  (uintptr_t)p->mem[KVP_TIER_ID_HOST].base % KVP_DISK_ALIGN == 0
			  ? dp->qd
			  : 0;
	dp->ios = calloc(dp->nbuf, sizeof(*dp->ios));
	dp->free_bufs = calloc(dp->nbuf, sizeof(*dp->free_bufs));
	dp->wios = calloc(dp->nwb + 1, sizeof(*dp->wios));
	dp->free_wb = calloc(dp->nwb + 1, sizeof(*dp->free_wb));
	dp->holds = calloc(dp->nwb + 1, sizeof(*dp->holds));
	dp->pend = calloc(dp->nbuf, sizeof(*dp->pend));
	if (!dp->ios || !dp->free_bufs || !dp->wios || !dp->free_wb || !dp->holds || !dp->pend ||
	    posix_memalign((void **)&dp->hdrs, KVP_DISK_ALIGN,
			   (uint64_t)KVP_DISK_HDR_BYTES * (dp->nwb + 1)) != 0 ||
	    posix_memalign((void **)&dp->staging, 4096, dp->slot_bytes * dp->nbuf) != 0) {
		log_err("disk tier of pool %s: no memory for its staging slots", c->name);
		return -ENOMEM;
	}
	memset(dp->staging, 0, dp->slot_bytes * dp->nbuf);
	for (uint32_t i = 0; i < dp->nwb; i++)
		dp->free_wb[dp->nwfree++] = dp->nwb - 1 - i;
	if ((rc = io_uring_queue_init(dp->nbuf + dp->nwb, &dp->ring, 0)) < 0) {
		log_err("disk tier of pool %s: io_uring: %s", c->name, strerror(-rc));
		return rc;
	}
	dp->ring_ok = true;
	if ((rc = io_uring_register_eventfd(&dp->ring, dt->efd)) < 0) {
		log_err("disk tier of pool %s: io_uring eventfd: %s", c->name, strerror(-rc));
		return rc;
	}
	register_buffers(dp);
	for (uint32_t i = 0; i < dp->nbuf; i++)
		dp->free_bufs[dp->nfree++] = dp->nbuf - 1 - i;
	dp->st.adopted_pages = info.adopted;
	dp->st.adopted_from_log = info.from_log;
	dp->st.adopt_us = info.adopt_us;
	log_info("disk tier of pool %s: %s (%s), %u pages of %lu bytes; %lu adopted from %s in "
		 "%lu ms",
		 c->name, c->disk_path, info.block_device ? "block device" : "file",
		 kvp_disk_slots(dp->k), (unsigned long)p->page_bytes, (unsigned long)info.adopted,
		 info.from_log ? "its log" : "its slot headers",
		 (unsigned long)(info.adopt_us / 1000));
	if (!info.from_log)
		log_notice("disk tier of pool %s: no usable log (%s): the slot headers were read",
			   c->name, info.log_why);
	if (info.old)
		log_notice("disk tier of pool %s: %lu pages of an older store format dropped: they "
			   "start empty",
			   c->name, (unsigned long)info.old);
	if (info.foreign)
		log_notice(
			"disk tier of pool %s: %lu pages of another geometry dropped (the pool's "
			"layers, heads, head_dim, dtype or page_tokens changed): they start empty",
			c->name, (unsigned long)info.foreign);
	if (info.torn || info.dups)
		log_notice("disk tier of pool %s: %lu torn headers and %lu older copies freed",
			   c->name, (unsigned long)info.torn, (unsigned long)info.dups);
	return 0;
}

static void observed(void *ctx, const struct kvp_disk_key *key, bool stored)
{
	const struct dt_pool *dp = ctx;

	if (dp->dt->observe && !dp->dead)
		dp->dt->observe(dp->dt->observe_ctx, dp->p, key->ns, key->keyed, key->data,
				key->len, stored);
}

void kvp_dt_set_observer(struct kvp_dt *dt, kvp_dt_observe_fn fn, void *ctx)
{
	if (!dt)
		return;
	dt->observe = fn;
	dt->observe_ctx = ctx;
	for (struct dt_pool *dp = dt->pools; dp; dp = dp->next)
		kvp_disk_set_observer(dp->k, fn ? observed : NULL, dp);
}

void kvp_dt_observe_all(const struct kvp_dt *dt, const struct kvpd_pool *p)
{
	const struct dt_pool *dp = dt ? dp_find(dt, p) : NULL;

	if (dp && dt->observe)
		kvp_disk_observe_all(dp->k);
}

static bool listed(struct kvpd_pool *const *pools, uint32_t n, const struct kvpd_pool *p)
{
	for (uint32_t i = 0; i < n; i++)
		if (pools[i] == p)
			return true;
	return false;
}

int kvp_dt_bind(struct kvp_dt *dt, struct kvpd_pool *const *pools, uint32_t n)
{
	struct dt_pool **pp, *dp;
	int first = 0;

	if (!dt)
		return 0;
	/* Pools gone (a reload removed them): their I/O ends, their hooks are gone with them. */
	for (pp = &dt->pools; (dp = *pp);) {
		if (listed(pools, n, dp->p)) {
			pp = &dp->next;
			continue;
		}
		*pp = dp->next;
		dp->dead = true;
		dp_free(dp);
	}
	for (pp = &dt->failed; (dp = *pp);) {
		if (listed(pools, n, dp->p)) {
			pp = &dp->next;
			continue;
		}
		*pp = dp->next;
		dp_free(dp);
	}
	for (uint32_t i = 0; i < n; i++) {
		struct kvpd_pool *p = pools[i];
		int rc;

		if (p->conf.disk == KVP_DISK_OFF || !p->pages[KVP_TIER_ID_HOST] || dp_find(dt, p))
			continue;
		for (dp = dt->failed; dp && dp->p != p; dp = dp->next)
			;
		if (dp)
			continue;
		if ((rc = dp_open(dt, p, &dp)) < 0) {
			if (!first)
				first = rc;
			if (dp) {
				dp->dead = true;
				dp->next = dt->failed;
				dt->failed = dp;
			}
			continue;
		}
		dp->next = dt->pools;
		dt->pools = dp;
		kvp_index_set_spill(p->ix, spill_page, dp);
		kvp_disk_set_observer(dp->k, dt->observe ? observed : NULL, dp);
		kvp_disk_observe_all(dp->k); /* what it adopted */
	}
	return first;
}

/* Queues the store's log blocks that wait (the records of pages whose writes landed), tagged
 * apart from the page I/O by the low bit of their user data. */
static void log_submit(struct dt_pool *dp)
{
	const void *buf;
	uint32_t len;
	uint64_t off;
	uintptr_t id;

	while (!dp->dead && kvp_disk_log_take(dp->k, &buf, &len, &off, &id) == 0) {
		struct io_uring_sqe *sqe = get_sqe(dp);

		if (!sqe) {
			kvp_disk_log_done(dp->k, id, -EAGAIN);
			return;
		}
		io_uring_prep_write(sqe, kvp_disk_fd(dp->k), buf, len, off);
		io_uring_sqe_set_data64(sqe, (uint64_t)id | 1);
		dp->inflight++;
		dp->dirty = true;
	}
}

void kvp_dt_submit(struct kvp_dt *dt)
{
	for (struct dt_pool *dp = dt ? dt->pools : NULL; dp; dp = dp->next) {
		writeback(dp);
		log_submit(dp);
		if (dp->dirty) {
			dp->dirty = false;
			io_uring_submit(&dp->ring);
		}
	}
}

void kvp_dt_run(struct kvp_dt *dt, struct kvpd_pool *const *pools, uint32_t n)
{
	uint64_t v;

	if (!dt)
		return;
	kvp_dt_bind(dt, pools, n);
	if (read(dt->efd, &v, sizeof(v)) < 0 && errno != EAGAIN)
		log_warn("disk tier eventfd: %s", strerror(errno));
	for (struct dt_pool *dp = dt->pools; dp; dp = dp->next)
		reap(dp);
	kvp_dt_submit(dt);
}

void kvp_dt_free(struct kvp_dt *dt)
{
	struct dt_pool *dp;

	if (!dt)
		return;
	while ((dp = dt->pools)) {
		dt->pools = dp->next;
		kvp_index_set_spill(dp->p->ix, NULL, NULL);
		dp_free(dp);
	}
	while ((dp = dt->failed)) {
		dt->failed = dp->next;
		dp_free(dp);
	}
	close(dt->efd);
	free(dt);
}

/* Keys of run's pages [0, n): a key call's keys; a token call's page keys, chained from the
 * index's key of page run->from - 1 when it is cached, else from page 0 (kvp_pool_page_keys).
 * 0, -EINVAL or -ENOMEM. */
static int run_keys(struct kvpd_pool *p, const struct kvp_below_run *run, uint32_t n,
		    struct kvp_dt_key *out)
{
	uint32_t from = run->from;
	uint8_t(*h)[KVP_PAGE_KEY_BYTES];

	if (run->keyed) {
		for (uint32_t i = 0; i < n; i++) {
			const struct kvp_key *k = &run->keys[from + i];

			if (!k->len || k->len > KVP_KEY_MAX)
				return -EINVAL;
			out[i].len = (uint32_t)k->len;
			memcpy(out[i].b, k->data, k->len);
		}
		return 0;
	}
	if (!run->tokens)
		return -EINVAL;
	if (!(h = malloc(sizeof(*h) * (n + 1))))
		return -ENOMEM;
	kvp_pool_page_keys(p, run->ns, run->tokens, from, from + n, h);
	for (uint32_t i = 0; i < n; i++) {
		out[i].len = KVP_PAGE_KEY_BYTES;
		memcpy(out[i].b, h[i], KVP_PAGE_KEY_BYTES);
	}
	free(h);
	return 0;
}

/* run's keys (at most KVP_DT_RUN_MAX) and how many of the leading ones p's disk holds; NULL
 * without a disk tier, keys or memory. */
static struct kvp_dt_key *run_held(const struct kvp_dt *dt, struct kvpd_pool *p,
				   const struct kvp_below_run *run, uint32_t *held)
{
	const struct dt_pool *dp = dp_find(dt, p);
	uint32_t n = run->n < KVP_DT_RUN_MAX ? run->n : KVP_DT_RUN_MAX, i = 0;
	struct kvp_dt_key *k;

	*held = 0;
	if (!dp || !n || !(k = malloc(sizeof(*k) * n)))
		return NULL;
	if (run_keys(p, run, n, k) < 0) {
		free(k);
		return NULL;
	}
	while (i < n) {
		struct kvp_disk_key dk = disk_key(run->ns, run->keyed, &k[i]);

		if (kvp_disk_find(dp->k, &dk) < 0)
			break;
		i++;
	}
	*held = i;
	return k;
}

uint32_t kvp_dt_held(const struct kvp_dt *dt, struct kvpd_pool *p, const struct kvp_below_run *run)
{
	uint32_t held;

	free(run_held(dt, p, run, &held));
	return held;
}

int kvp_dt_read(struct kvp_dt *dt, struct kvpd_pool *p, const struct kvp_below_run *run,
		const uint32_t *pages, kvp_below_read_fn done, void *arg)
{
	struct dt_pool *dp = dp_find(dt, p);
	uint32_t n = run->n < KVP_DT_RUN_MAX ? run->n : KVP_DT_RUN_MAX;
	struct kvp_dt_key *k;
	int sent = 0, rc = -ENOENT;

	if (!dp)
		return -ENOENT;
	if (!(k = malloc(sizeof(*k) * (n + 1))))
		return -ENOMEM;
	if (run_keys(p, run, n, k) < 0) {
		free(k);
		return -EINVAL;
	}
	for (uint32_t i = 0; i < n; i++)
		if ((rc = read_one(dp, run->ns, run->keyed, &k[i], pages[i], i, done, arg)) == 0)
			sent++;
	free(k);
	return sent ? sent : rc;
}

void kvp_dt_stats(const struct kvp_dt *dt, const struct kvpd_pool *p, struct kvp_disk_stats *st)
{
	for (const struct dt_pool *dp = dt ? dt->pools : NULL; dp; dp = dp->next) {
		struct kvp_disk_stats x = dp->st;
		struct kvp_disk_log_stats ls;

		if (p && dp->p != p)
			continue;
		kvp_disk_log_stats(dp->k, &ls);
		x.log_bytes = ls.region_bytes;
		x.log_written_bytes = ls.written_bytes;
		x.log_checkpoints = ls.checkpoints;
		x.log_errors = ls.errors;
		x.pages = kvp_disk_used(dp->k);
		x.bytes = x.pages * dp->page_bytes;
		x.capacity_pages = kvp_disk_slots(dp->k);
		x.queue_depth = dp->inflight + dp->queued + dp->npend;
#define ADD(f, n, t, h) st->f += x.f;
		KVP_DISK_STATS(ADD)
#undef ADD
	}
}
