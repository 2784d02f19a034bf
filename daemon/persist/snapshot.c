/* snapshot.c - a pool's books in a memfd kept by the fd store, checkpointed and rebuilt across
 * restarts (the design is in snapshot.h). */
#include "snapshot.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "daemon.h"
#include "fault.h"
#include "fdstore.h"
#include "log.h"
#include "session.h"
#include "crc32c.h"

#define SNAP_MAGIC 0x31504e5350564b4bull /* "KVPSNPP1" little-endian */
#define SNAP_VERSION 2u			 /* 2: one record kind, the page index's entries */
#define HDR_BYTES 4096u

static const char *const g_tier_what[KVP_TIER_ID_MAX] = { "device", "host" };

/* The memfd's first page, mapped shared: what survives a crash word by word. */
struct snap_hdr {
	uint64_t magic;
	uint32_t version;
	uint32_t clean_stop; /* the body holds the sessions: written at a clean stop */
	uint64_t gen_dirty;  /* bumped before a checkpoint and when a listed cached page goes */
	uint64_t gen_clean;  /* = gen_dirty once a checkpoint is whole */
	uint64_t fingerprint;
	uint64_t tier_bytes[KVP_TIER_ID_MAX]; /* 0: no such tier */
	uint64_t body_bytes;
	uint32_t body_crc;
	uint32_t pad;
	uint64_t written_ms;
};

struct kvp_snap {
	int fd;
	struct snap_hdr *hdr;
	uint8_t *map;	  /* the memfd from offset 0 (page aligned on any page size), shared */
	uint8_t *body;	  /* map + HDR_BYTES: checkpoints encode here */
	size_t body_cap;  /* bytes of the body mapped, and allocated in the file (fallocate) */
	bool armed;	  /* the page allocators' guard (kvp_pages_guard) */
	uint64_t last_ms; /* last checkpoint */
	uint32_t sig;	  /* the books' figures then */
	struct kvp_log_limit log_fail; /* a periodic checkpoint that failed */
	/* A periodic checkpoint being written by a forked copy of kvpoold (0: none): the
	 * generation it writes, the books' figures it saw, when it was forked. */
	pid_t writer;
	uint64_t writer_gen;
	uint32_t writer_sig;
	uint64_t writer_t0_us;
};

/* ---- buffers ---- */

/* A checkpoint being encoded, straight into sn's body mapping: no copy of its own, and no
 * pages to fault in (body_grow allocates them). */
struct wbuf {
	uint8_t *p;
	size_t n, cap;
	bool oom;
	struct kvp_snap *sn;
};

/* Grows sn's body mapping and file to hold at least need bytes, the grown range allocated
 * (fallocate), so that no write into the mapping faults for memory: a memfd short of memory
 * fails here with an errno, not with SIGBUS in the middle of a checkpoint. The mapping starts
 * at file offset 0: HDR_BYTES is not a page on every kernel. 0 or -errno. */
static int body_grow(struct kvp_snap *sn, size_t need)
{
	size_t cap = sn->body_cap ? sn->body_cap : HDR_BYTES;
	void *np;

	while (cap < need) /* by half (whole header-sized steps): what it allocates is resident */
		cap += cap / 2 >= HDR_BYTES ? cap / 2 / HDR_BYTES * HDR_BYTES : HDR_BYTES;
	if (cap == sn->body_cap)
		return 0;
	if (kvp_fault_hit(KVP_FAULT_SNAPSHOT))
		return -ENOMEM;
	/* From the end of what is mapped (all of the body the first time: an adopted file's
	 * holes are allocated too). */
	if (fallocate(sn->fd, 0, (off_t)(HDR_BYTES + sn->body_cap), (off_t)(cap - sn->body_cap)) <
	    0)
		return -errno;
	np = sn->map ? mremap(sn->map, HDR_BYTES + sn->body_cap, HDR_BYTES + cap, MREMAP_MAYMOVE)
		     : mmap(NULL, HDR_BYTES + cap, PROT_READ | PROT_WRITE, MAP_SHARED, sn->fd, 0);
	if (np == MAP_FAILED)
		return -errno;
	sn->map = np;
	sn->body = sn->map + HDR_BYTES;
	sn->body_cap = cap;
	return 0;
}

/* Room for n more bytes at b's end: a pointer to them (b->n advanced), NULL when there is none
 * (b->oom set). */
static uint8_t *room(struct wbuf *b, size_t n)
{
	uint8_t *at;

	if (b->oom)
		return NULL;
	if (b->n + n > b->cap) {
		if (body_grow(b->sn, b->n + n) < 0) {
			b->oom = true;
			return NULL;
		}
		b->p = b->sn->body;
		b->cap = b->sn->body_cap;
	}
	at = b->p + b->n;
	b->n += n;
	return at;
}

static void put(struct wbuf *b, const void *x, size_t n)
{
	uint8_t *at = room(b, n);

	if (at)
		memcpy(at, x, n);
}

static void put8(struct wbuf *b, uint8_t v)
{
	put(b, &v, 1);
}
static void put32(struct wbuf *b, uint32_t v)
{
	put(b, &v, 4);
}
static void put64(struct wbuf *b, uint64_t v)
{
	put(b, &v, 8);
}

struct rbuf {
	const uint8_t *p;
	size_t n, off;
	bool bad;
};

static const void *take(struct rbuf *r, size_t n)
{
	const void *x;

	if (r->bad || n > r->n - r->off) {
		r->bad = true;
		return NULL;
	}
	x = r->p + r->off;
	r->off += n;
	return x;
}

static uint64_t get64(struct rbuf *r)
{
	const void *x = take(r, 8);
	uint64_t v = 0;

	if (x)
		memcpy(&v, x, 8);
	return v;
}
static uint32_t get32(struct rbuf *r)
{
	const void *x = take(r, 4);
	uint32_t v = 0;

	if (x)
		memcpy(&v, x, 4);
	return v;
}
static uint8_t get8(struct rbuf *r)
{
	const uint8_t *x = take(r, 1);

	return x ? *x : 0;
}

/* ---- fingerprint and names ---- */

static uint64_t fingerprint(const struct kvp_pool_conf *pc)
{
	struct {
		uint32_t version, layers, kv_heads, head_dim, page_tokens, dtype, device;
		int32_t cuda_device;
		uint64_t device_pages, host_pages;
		uint32_t hugepages;
		char name[KVP_POOL_NAME_MAX];
	} g;
	uint32_t lo, hi;

	memset(&g, 0, sizeof(g));
	g.version = SNAP_VERSION;
	g.layers = pc->layers;
	g.kv_heads = pc->kv_heads;
	g.head_dim = pc->head_dim;
	g.page_tokens = pc->page_tokens;
	g.dtype = (uint32_t)pc->dtype;
	g.device = (uint32_t)pc->device;
	g.cuda_device = pc->cuda_device;
	g.device_pages = pc->device == KVP_DEVICE_NONE ? 0 : pc->device_pages;
	g.host_pages = pc->host_pages;
	g.hugepages = (uint32_t)pc->hugepages;
	snprintf(g.name, sizeof(g.name), "%s", pc->name);
	lo = kvp_crc32c(&g, sizeof(g));
	hi = kvp_crc32c(&lo, sizeof(lo)) ^ kvp_crc32c(g.name, strlen(g.name));
	return (uint64_t)hi << 32 | lo;
}

static void names_of(const struct kvp_pool_conf *pc, char tier[KVP_TIER_ID_MAX][300],
		     char meta[300])
{
	for (int t = 0; t < KVP_TIER_ID_MAX; t++)
		kvp_fdstore_name(tier[t], 300, pc->name, g_tier_what[t]);
	kvp_fdstore_name(meta, 300, pc->name, "meta");
}

static bool conf_has_tier(const struct kvp_pool_conf *pc, int t)
{
	return t == KVP_TIER_ID_DEVICE ? pc->device != KVP_DEVICE_NONE && pc->device_pages
				       : pc->host_pages != 0;
}

static int read_hdr(int fd, struct snap_hdr *h)
{
	return pread(fd, h, sizeof(*h), 0) == (ssize_t)sizeof(*h) ? 0 : -EIO;
}

/* Why the stored pool of pc cannot be adopted ("" when it can). */
static void adopt_check(const struct kvp_pool_conf *pc, char *why, size_t cap, struct snap_hdr *h)
{
	char tn[KVP_TIER_ID_MAX][300], mn[300];
	int mfd;

	why[0] = 0;
	names_of(pc, tn, mn);
	mfd = kvp_fdstore_peek(mn);
	if (mfd < 0 || read_hdr(mfd, h) < 0 || h->magic != SNAP_MAGIC) {
		snprintf(why, cap, "no readable books (%.100s)", mn);
		return;
	}
	if (h->version != SNAP_VERSION) {
		snprintf(why, cap, "books of version %u, this kvpoold reads %u", h->version,
			 SNAP_VERSION);
		return;
	}
	if (h->fingerprint != fingerprint(pc)) {
		snprintf(why, cap, "its geometry or size changed in the configuration");
		return;
	}
	for (int t = 0; t < KVP_TIER_ID_MAX; t++) {
		bool want = conf_has_tier(pc, t), have = kvp_fdstore_peek(tn[t]) >= 0;

		if (want != have || (want && !h->tier_bytes[t])) {
			snprintf(why, cap, "its %s tier's memory is %s", g_tier_what[t],
				 have ? "not configured now" : "missing from the fd store");
			return;
		}
	}
}

bool kvp_snap_adoptable(const struct kvp_pool_conf *pc)
{
	struct snap_hdr h;
	char why[160];

	adopt_check(pc, why, sizeof(why), &h);
	return !why[0];
}

/* ---- writing ---- */

struct walk_ctx {
	struct wbuf *b;
	uint32_t pt, n;
};

/* One record per cached page: the index's entry, its tokens after the key for a token page. */
static int put_entry(void *ctx, const struct kvp_index_entry *e)
{
	struct walk_ctx *w = ctx;

	put32(w->b, e->idx);
	put32(w->b, e->parent);
	put64(w->b, e->ns);
	put8(w->b, (uint8_t)e->tier);
	put8(w->b, (uint8_t)e->keyed);
	put8(w->b, (uint8_t)e->key.len);
	put32(w->b, e->page);
	put32(w->b, e->hits);
	put(w->b, e->key.data, e->key.len);
	if (!e->keyed)
		put(w->b, e->tokens, (size_t)w->pt * 4);
	w->n++;
	return w->b->oom ? -ENOMEM : 0;
}

static void patch32(struct wbuf *b, size_t at, uint32_t v)
{
	if (!b->oom)
		memcpy(b->p + at, &v, 4);
}

/* The sessions of d holding leases in p, with those leases (a clean stop). */
static void put_sessions(struct wbuf *b, struct kvp_daemon *d, struct kvpd_pool *p)
{
	size_t at = b->n;
	uint32_t n = 0;

	put32(b, 0);
	for (struct kvp_session *s = d->sessions; s; s = s->next) {
		size_t lat;
		uint32_t nl = 0;
		uint64_t id;
		void *v;

		if (!s->hello || !s->attached[p->id])
			continue;
		put(b, s->resume_token, sizeof(s->resume_token));
		put32(b, (uint32_t)s->uid);
		put32(b, (uint32_t)s->gid);
		put32(b, (uint32_t)s->pid);
		put(b, s->name, sizeof(s->name));
		lat = b->n;
		put32(b, 0);
		for (uint32_t i = 0; (i = kvp_idmap_next(&s->leases, i, &id, &v)) != 0;) {
			struct kvp_lease *l = v;

			if (l->pool != p || !l->n)
				continue;
			put64(b, l->id);
			put8(b, (uint8_t)l->tier);
			put32(b, l->n);
			put(b, l->pages, (size_t)l->n * 4);
			nl++;
		}
		patch32(b, lat, nl);
		lat = b->n;
		nl = 0;
		put32(b, 0);
		for (uint32_t i = 0; (i = kvp_idmap_next(&s->locks, i, &id, &v)) != 0;) {
			struct kvp_lock *k = v;
			uint32_t np;
			uint64_t ns = 0;
			bool tokened;

			if (k->pool != p)
				continue;
			if (!k->run)
				continue;
			np = kvp_index_lock_pages(k->run);
			kvp_index_lock_key(p->ix, k->run, 0, &(struct kvp_key){ 0 }, &ns);
			put64(b, k->id);
			tokened = kvp_index_lock_tokened(p->ix, k->run);
			put8(b, tokened ? 0 : 1);
			put64(b, ns);
			put32(b, np);
			for (uint32_t j = 0; j < np; j++) {
				struct kvp_key key = { 0 };

				if (tokened) {
					put(b, kvp_index_lock_tokens(p->ix, k->run, j),
					    (size_t)p->conf.page_tokens * 4);
					continue;
				}
				kvp_index_lock_key(p->ix, k->run, j, &key, &ns);
				put8(b, (uint8_t)key.len);
				put(b, key.data, key.len);
			}
			nl++;
		}
		patch32(b, lat, nl);
		n++;
	}
	patch32(b, at, n);
}

static uint32_t books_sig(const struct kvpd_pool *p)
{
	struct {
		struct kvp_pool_stats st;
		struct kvp_index_stats ks;
	} x;

	memset(&x, 0, sizeof(x));
	x.st = p->st;
	kvp_index_stats(p->ix, &x.ks);
	return kvp_crc32c(&x, sizeof(x));
}

static uint64_t now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

static int write_pool_body(struct kvp_daemon *d, struct kvpd_pool *p, bool clean);
static int fork_writer(struct kvp_daemon *d, struct kvpd_pool *p);
static void writer_end(struct kvp_daemon *d, struct kvpd_pool *p, bool wait);

/* A checkpoint of p's books, counted and timed (the loop's part of it). periodic: written by a
 * forked writer where one can be forked; else by the loop, after a writer still busy ends. */
static int write_pool(struct kvp_daemon *d, struct kvpd_pool *p, bool clean, bool periodic)
{
	uint64_t t0 = now_us();
	int r;

	if (periodic) {
		r = fork_writer(d, p);
		if (r == 0)
			d->st.checkpoint_forks++;
	} else {
		writer_end(d, p, true);
		r = write_pool_body(d, p, clean);
	}
	d->st.checkpoints++;
	d->st.checkpoint_us += now_us() - t0;
	return r < 0 ? r : 0;
}

/* A checkpoint of p that failed (why), logged at most once a minute with what is kept. */
static void checkpoint_failed(struct kvpd_pool *p, uint64_t now_ms, const char *why)
{
	kvp_log_limited(&p->snap->log_fail, now_ms ? now_ms : 1, LOG_WARNING,
			"pool %s: a checkpoint failed (%s): %s", p->conf.name, why,
			p->snap->hdr->gen_clean == p->snap->hdr->gen_dirty
				? "the previous one is kept"
				: "no books for a restart until one succeeds");
}

/* Everything a checkpoint holds, into b. */
static void encode(struct wbuf *b, struct kvp_daemon *d, struct kvpd_pool *p, bool clean)
{
	struct walk_ctx w = { b, p->conf.page_tokens, 0 };
	size_t at;

	put64(b, d->id_key[0]);
	put64(b, d->id_key[1]);
	put8(b, d->id_keyed);
	put64(b, d->next_session_id);
	put64(b, d->next_lease_id);
	put64(b, d->next_lock_id);
	for (int t = 0; t < KVP_TIER_ID_MAX; t++) {
		uint32_t total = p->pages[t] ? kvp_pages_total(p->pages[t]) : 0;
		uint8_t *states;

		put32(b, total);
		states = room(b, total);
		if (states && total)
			kvp_pages_states(p->pages[t], states);
	}
	at = b->n;
	put32(b, 0);
	if (kvp_index_walk(p->ix, put_entry, &w) < 0)
		b->oom = true;
	patch32(b, at, w.n);
	if (clean && d->conf.resume_grace_ms)
		put_sessions(b, d, p);
	else
		put32(b, 0);
}

/* Before a checkpoint overwrites the previous one, the body grows (allocated) to half as much
 * again as its size: failing that, it is left as it is, still valid where this kvpoold wrote it
 * and guarded it since (sn->armed). Only then is the generation marked in progress: a crash (or
 * a failure: books that grew by more than half since and could not grow further) from there
 * until the end leaves gen_clean != gen_dirty, and the next start discards the books. 0 or
 * -errno (nothing begun). */
static int begin(struct kvp_snap *sn)
{
	struct snap_hdr *h = sn->hdr;
	uint64_t last = h->gen_clean == h->gen_dirty ? h->body_bytes : 0;
	int r;

	sn->last_ms = kvp_now_ms();
	r = body_grow(sn, last < (1ull << 40) ? (size_t)(last + last / 2) : 0);
	if (r < 0) {
		/* Books this kvpoold did not write or no longer guards (adopted, or a page they
		 * list has gone) must not outlive this failure: a restart could trust them. */
		if (!sn->armed)
			__atomic_store_n(&h->gen_dirty, h->gen_dirty + 1, __ATOMIC_SEQ_CST);
		return r;
	}
	__atomic_store_n(&h->gen_dirty, h->gen_dirty + 1, __ATOMIC_SEQ_CST);
	h->clean_stop = 0;
	return 0;
}

/* Encodes p's books straight into the memfd's body, in one walk, and seals them as generation
 * gen: gen_clean = gen only then. Where a cached page left the cache since gen was begun, the
 * guard bumped gen_dirty past it and the books stay in doubt. 0 or -ENOMEM. */
static int encode_seal(struct kvp_daemon *d, struct kvpd_pool *p, bool clean, uint64_t gen)
{
	struct kvp_snap *sn = p->snap;
	struct snap_hdr *h = sn->hdr;
	struct wbuf b = { .sn = sn, .p = sn->body, .cap = sn->body_cap };

	encode(&b, d, p, clean);
	if (b.oom)
		return -ENOMEM;
	h->body_bytes = b.n;
	h->body_crc = kvp_crc32c(b.p, b.n);
	h->written_ms = sn->last_ms;
	h->clean_stop = clean;
	__atomic_store_n(&h->gen_clean, gen, __ATOMIC_SEQ_CST);
	return 0;
}

/* Encodes and seals generation gen on the loop thread; the books are then guarded. 0 or
 * -ENOMEM (no books now: the next tick writes them again). */
static int write_here(struct kvp_daemon *d, struct kvpd_pool *p, bool clean, uint64_t gen)
{
	struct kvp_snap *sn = p->snap;

	if (encode_seal(d, p, clean, gen) < 0) {
		sn->armed = false;
		return -ENOMEM;
	}
	sn->armed = true;
	sn->sig = books_sig(p);
	return 0;
}

/* A checkpoint written by the loop itself (at a stop, or at an adoption). */
static int write_pool_body(struct kvp_daemon *d, struct kvpd_pool *p, bool clean)
{
	int r = begin(p->snap);

	return r < 0 ? r : write_here(d, p, clean, p->snap->hdr->gen_dirty);
}

/*
 * Periodic checkpoints off the loop (as a copy-on-write snapshot): the loop grows the body and
 * begins generation G (both cheap), arms the guard for G and forks; the child, a frozen copy of
 * the books at that instant, encodes them into the shared memfd and seals G, then exits. The
 * loop serves on meanwhile: a cached page that leaves the cache after the fork bumps gen_dirty
 * past G (the guard), so the sealed books are trusted only when they still describe the pages.
 * The loop reaps the writer at its next ticks (writer_end). The child holds no descriptor but
 * the memfd (sockets of clients would otherwise stay open in it), dies with kvpoold and writes
 * no log: its exit status says what happened.
 */
enum { WRITER_OK = 0, WRITER_NOMEM = 3 };

/* Starts a periodic checkpoint of p: 0 (a writer is forked), 1 (no fork: the loop wrote it), or
 * a negative errno (nothing begun, or the loop's own write failed). */
static int fork_writer(struct kvp_daemon *d, struct kvpd_pool *p)
{
	struct kvp_snap *sn = p->snap;
	pid_t parent = getpid(), pid;
	uint64_t gen;
	int r = begin(sn);

	if (r < 0)
		return r;
	gen = sn->hdr->gen_dirty;
	sn->armed = true; /* from now on a page that leaves bumps gen_dirty past gen */
	pid = fork();
	if (pid < 0) /* no writer: the loop writes them */
		return write_here(d, p, false, gen) < 0 ? -ENOMEM : 1;
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent) /* kvpoold ended before the line above */
			_exit(1);
		if (sn->fd > 3)
			close_range(3, (unsigned)sn->fd - 1, 0);
		close_range((unsigned)sn->fd + 1, ~0u, 0);
		_exit(encode_seal(d, p, false, gen) < 0 ? WRITER_NOMEM : WRITER_OK);
	}
	sn->writer = pid;
	sn->writer_gen = gen;
	sn->writer_sig = books_sig(p);
	sn->writer_t0_us = now_us();
	return 0;
}

/* Reaps p's writer when it has ended (wait: waits for it). Where it failed, the books are in
 * doubt until a later tick writes them. */
static void writer_end(struct kvp_daemon *d, struct kvpd_pool *p, bool wait)
{
	struct kvp_snap *sn = p->snap;
	int status = 0;
	pid_t r;

	if (!sn || !sn->writer)
		return;
	do
		r = waitpid(sn->writer, &status, wait ? 0 : WNOHANG);
	while (r < 0 && errno == EINTR);
	if (r == 0)
		return;
	sn->writer = 0;
	d->st.checkpoint_write_us += now_us() - sn->writer_t0_us;
	if (r > 0 && WIFEXITED(status) && WEXITSTATUS(status) == WRITER_OK) {
		/* sealed: trusted while the guard still holds for its generation */
		if (sn->armed && sn->hdr->gen_dirty == sn->writer_gen)
			sn->sig = sn->writer_sig;
		return;
	}
	/* No books now: the next tick writes them again. A writer killed after it sealed them
	 * leaves them unguarded from here on, so they are put in doubt too. */
	sn->armed = false;
	if (sn->hdr->gen_clean == sn->hdr->gen_dirty)
		__atomic_store_n(&sn->hdr->gen_dirty, sn->hdr->gen_dirty + 1, __ATOMIC_SEQ_CST);
	checkpoint_failed(p, kvp_now_ms(),
			  r > 0 && WIFEXITED(status) && WEXITSTATUS(status) == WRITER_NOMEM
				  ? strerror(ENOMEM)
				  : "its writer ended abnormally");
}

void kvp_snap_write_all(struct kvp_daemon *d, bool clean_stop)
{
	for (uint32_t i = 0; i < d->n_pools; i++) {
		struct kvpd_pool *p = d->pools[i];
		int r;

		if (!p || !p->snap)
			continue;
		r = write_pool(d, p, clean_stop, false);
		if (r < 0)
			log_warn("pool %s: writing its books for a restart failed: %s (%s)",
				 p->conf.name, strerror(-r),
				 p->snap->hdr->gen_clean == p->snap->hdr->gen_dirty
					 ? "the previous checkpoint is kept"
					 : "none is kept");
		else if (clean_stop)
			log_info("pool %s: books written for a restart (%lu bytes)", p->conf.name,
				 (unsigned long)p->snap->hdr->body_bytes);
	}
}

void kvp_snap_tick(struct kvp_daemon *d, uint64_t now_ms)
{
	for (struct kvp_session *s = d->sessions, *n; s; s = n) {
		n = s->next;
		if (s->resume_until_ms && now_ms >= s->resume_until_ms) {
			log_info("session %lu ('%s'): not resumed within resume_grace_ms: its "
				 "leases are reclaimed",
				 (unsigned long)s->id, s->name);
			d->st.resume_expired++;
			d->st.sessions_reclaimed++;
			kvp_session_destroy(d, s);
		}
	}
	for (uint32_t i = 0; i < d->n_pools; i++) {
		struct kvpd_pool *p = d->pools[i];
		int r;

		if (!p || !p->snap)
			continue;
		writer_end(d, p, false);
		if (!d->conf.snapshot_interval_ms || p->snap->writer ||
		    now_ms - p->snap->last_ms < d->conf.snapshot_interval_ms)
			continue;
		if (p->snap->armed && books_sig(p) == p->snap->sig) {
			p->snap->last_ms = now_ms;
			continue;
		}
		r = write_pool(d, p, false, true);
		if (r < 0)
			checkpoint_failed(p, now_ms, strerror(-r));
	}
}

/* ---- the memfd ---- */

static int snap_open(struct kvpd_pool *p, int fd)
{
	struct kvp_snap *sn = calloc(1, sizeof(*sn));
	struct stat st;
	bool fresh = fd < 0;

	if (!sn) {
		if (fd >= 0)
			close(fd);
		return -ENOMEM;
	}
	if (fresh) {
		char name[96];

		snprintf(name, sizeof(name), "kvpool:%s:meta", p->conf.name);
		fd = memfd_create(name, MFD_CLOEXEC);
		if (fd < 0 || ftruncate(fd, HDR_BYTES) < 0)
			goto fail;
	} else if (fstat(fd, &st) < 0 || (uint64_t)st.st_size < HDR_BYTES) {
		goto fail;
	}
	sn->hdr = mmap(NULL, HDR_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (sn->hdr == MAP_FAILED)
		goto fail;
	sn->fd = fd;
	sn->log_fail.interval_ms = 60000;
	if (fresh || sn->hdr->magic != SNAP_MAGIC) {
		memset(sn->hdr, 0, sizeof(*sn->hdr));
		sn->hdr->magic = SNAP_MAGIC;
		sn->hdr->version = SNAP_VERSION;
		sn->hdr->gen_dirty = 1; /* nothing written yet */
	}
	sn->hdr->fingerprint = fingerprint(&p->conf);
	for (int t = 0; t < KVP_TIER_ID_MAX; t++) {
		sn->hdr->tier_bytes[t] = kvp_pool_has_tier(p, t) ? p->mem[t].bytes : 0;
		if (p->pages[t])
			kvp_pages_guard(p->pages[t], &sn->hdr->gen_dirty, &sn->armed);
	}
	p->snap = sn;
	return 0;
fail : {
	int e = errno ? -errno : -EIO;

	if (fd >= 0)
		close(fd);
	free(sn);
	return e;
}
}

void kvp_snap_free(struct kvp_snap *s)
{
	if (!s)
		return;
	if (s->writer) { /* its books would be in doubt anyway: the pool goes */
		kill(s->writer, SIGKILL);
		while (waitpid(s->writer, NULL, 0) < 0 && errno == EINTR)
			;
	}
	if (s->hdr && s->hdr != MAP_FAILED)
		munmap(s->hdr, HDR_BYTES);
	if (s->map)
		munmap(s->map, HDR_BYTES + s->body_cap);
	if (s->fd >= 0)
		close(s->fd);
	free(s);
}

static void store_put(struct kvpd_pool *p)
{
	char tn[KVP_TIER_ID_MAX][300], mn[300];
	int r = 0;

	names_of(&p->conf, tn, mn);
	for (int t = 0; t < KVP_TIER_ID_MAX && r >= 0; t++)
		if (kvp_pool_has_tier(p, t) && p->mem[t].fd >= 0)
			r = kvp_fdstore_put(tn[t], p->mem[t].fd);
	if (r >= 0)
		r = kvp_fdstore_put(mn, p->snap->fd);
	if (r < 0 && r != -ENOTCONN)
		log_warn("pool %s: handing its memory to the fd store failed (%s): a restart "
			 "starts it empty",
			 p->conf.name, strerror(-r));
}

int kvp_snap_attach(struct kvpd_pool *p)
{
	int r = snap_open(p, -1);

	if (r < 0)
		return r;
	store_put(p);
	return 0;
}

/* ---- restoring ---- */

/* One cached page's record; at: its entry in the rebuilt index (UINT32_MAX: not rebuilt). */
struct key_rec {
	uint32_t idx, parent, page, hits, depth, at;
	uint64_t ns;
	uint8_t tier, keyed, len;
	const uint8_t *key, *tokens;
};

static int key_cmp(const void *a, const void *b)
{
	const struct key_rec *x = a, *y = b;

	if (x->depth != y->depth)
		return x->depth < y->depth ? -1 : 1;
	return x->idx < y->idx ? -1 : x->idx > y->idx;
}

static int idx_cmp(const void *a, const void *b)
{
	const struct key_rec *x = a, *y = b;

	return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/* kr sorted by idx: the record of idx, or NULL. */
static struct key_rec *key_find(struct key_rec *kr, uint32_t n, uint32_t idx)
{
	struct key_rec k = { .idx = idx };

	return bsearch(&k, kr, n, sizeof(*kr), idx_cmp);
}

#define DEPTH_BAD (UINT32_MAX - 1) /* a missing parent or a cycle: never inserted */

/* Depth of kr[i] (kr sorted by idx; UINT32_MAX: not known yet) through its parents: 0 for a
 * chain's first key. Iterative, memoised: each record is walked over once. */
static void key_depth(struct key_rec *kr, uint32_t n, uint32_t i)
{
	struct key_rec *a = &kr[i], *x = &kr[i];
	uint32_t len = 0, d;

	while (a->depth == UINT32_MAX && a->parent != UINT32_MAX && len <= n) {
		struct key_rec *up = key_find(kr, n, a->parent);

		if (!up)
			break;
		a = up;
		len++;
	}
	if (a->depth != UINT32_MAX)
		d = a->depth;
	else if (a->parent == UINT32_MAX)
		d = a->depth = 0;
	else
		d = a->depth = DEPTH_BAD;
	for (uint32_t k = 0; k < len && x; k++) {
		x->depth = d == DEPTH_BAD ? DEPTH_BAD : d + (len - k);
		x = key_find(kr, n, x->parent);
	}
}

/* A page reference of the body: in range, CACHED (or LEASED) in the stored states, once. */
struct refs {
	uint32_t total[KVP_TIER_ID_MAX];
	const uint8_t *state[KVP_TIER_ID_MAX];
	uint8_t *seen[KVP_TIER_ID_MAX];
	uint32_t *ids[KVP_TIER_ID_MAX];
	uint32_t n[KVP_TIER_ID_MAX];
};

static bool ref(struct refs *rf, int t, uint32_t pg, int want)
{
	if (t < 0 || t >= KVP_TIER_ID_MAX || pg >= rf->total[t] || rf->state[t][pg] != want ||
	    rf->seen[t][pg])
		return false;
	rf->seen[t][pg] = 1;
	rf->ids[t][rf->n[t]++] = pg;
	return true;
}

struct restored {
	uint64_t cached, discarded;
	uint32_t sessions, leases, locks;
};

/* Books a restored match's lock (n pages, all of the run) as s's under id; a short or failed
 * match books nothing and keeps no lock. 0 or -1. */
static int book_lock(struct kvpd_pool *p, struct kvp_session *s, uint64_t id,
		     const struct kvp_index_match *m, uint32_t n)
{
	struct kvp_lock *k;

	if (!m->lock)
		return -1;
	if (m->dev_pages + m->host_pages != n || !(k = kvp_session_lock_alloc())) {
		kvp_index_unlock(p->ix, m->lock);
		return -1;
	}
	k->id = id;
	k->pool = p;
	k->run = m->lock;
	k->pages = n;
	return kvp_session_lock_restore(s, k);
}

/* Takes the lock of a run of token pages again (match with lock) and books it as s's under id. */
static int restore_token_lock(struct kvpd_pool *p, struct kvp_session *s, uint64_t id, uint64_t ns,
			      const uint8_t *tok, uint32_t npages)
{
	uint32_t *dev = calloc((size_t)npages + 1, sizeof(uint32_t));
	uint32_t *host = calloc((size_t)npages + 1, sizeof(uint32_t));
	uint32_t *t = malloc((size_t)npages * p->conf.page_tokens * 4 + 4);
	struct kvp_index_match m = { 0 };
	int r = -1;

	if (!dev || !host || !t || !tok || !npages)
		goto out;
	memcpy(t, tok, (size_t)npages * p->conf.page_tokens * 4);
	if (kvp_index_match_tokens(p->ix, ns, t, npages * p->conf.page_tokens, 1, &m, dev, host) ==
	    0)
		r = book_lock(p, s, id, &m, npages);
out:
	free(dev);
	free(host);
	free(t);
	return r;
}

static int restore_keys_lock(struct kvpd_pool *p, struct kvp_session *s, uint64_t id, uint64_t ns,
			     const struct kvp_key *keys, uint32_t n)
{
	uint32_t *dev = calloc((size_t)n + 1, sizeof(uint32_t));
	uint32_t *host = calloc((size_t)n + 1, sizeof(uint32_t));
	struct kvp_index_match m = { 0 };
	int r = -1;

	for (uint32_t i = 0; i < n; i++)
		if (!keys[i].data || !keys[i].len)
			goto out;
	if (dev && host && n && kvp_index_match(p->ix, ns, keys, n, 1, &m, dev, host) == 0)
		r = book_lock(p, s, id, &m, n);
out:
	free(dev);
	free(host);
	return r;
}

static struct kvp_session *limbo_session(struct kvp_daemon *d, const uint8_t *tok, uint32_t uid,
					 uint32_t gid, int32_t pid, const char *name)
{
	struct kvp_fail f;

	for (struct kvp_session *s = d->sessions; s; s = s->next)
		if (s->resume_until_ms && !memcmp(s->resume_token, tok, sizeof(s->resume_token)))
			return s;
	kvp_fail_init(&f);
	struct kvp_session *s = kvp_session_new(d, pid, uid, gid, false, &f);

	if (!s)
		return NULL;
	memcpy(s->resume_token, tok, sizeof(s->resume_token));
	memcpy(s->name, name, sizeof(s->name));
	s->name[sizeof(s->name) - 1] = 0;
	s->hello = true;
	s->resume_until_ms = kvp_now_ms() + d->conf.resume_grace_ms;
	return s;
}

/* Rebuilds p's books from the body. 0, or -1 with why set (nothing restored, p empty). */
static int restore(struct kvp_daemon *d, struct kvpd_pool *p, const struct snap_hdr *h,
		   const uint8_t *body, struct restored *out, char *why, size_t cap)
{
	struct rbuf r = { body, h->body_bytes, 0, false };
	uint32_t pt = p->conf.page_tokens, nkeys, nsess;
	struct key_rec *kr = NULL, *byidx = NULL;
	struct refs rf;
	uint64_t key[2], ids[3];
	bool keyed, with_sessions = h->clean_stop && d->conf.resume_grace_ms;
	size_t sess_off;
	int ret = -1;

	memset(&rf, 0, sizeof(rf));
	memset(out, 0, sizeof(*out));
	key[0] = get64(&r);
	key[1] = get64(&r);
	keyed = get8(&r);
	for (int i = 0; i < 3; i++)
		ids[i] = get64(&r);
	for (int t = 0; t < KVP_TIER_ID_MAX; t++) {
		rf.total[t] = get32(&r);
		rf.state[t] = take(&r, rf.total[t]);
		if (r.bad || rf.total[t] != (p->pages[t] ? kvp_pages_total(p->pages[t]) : 0)) {
			snprintf(why, cap, "the %s tier's page count differs", g_tier_what[t]);
			return -1;
		}
		rf.seen[t] = calloc(rf.total[t] + 1, 1);
		rf.ids[t] = malloc(sizeof(uint32_t) * (rf.total[t] + 1));
		if (!rf.seen[t] || !rf.ids[t]) {
			snprintf(why, cap, "out of memory");
			goto out;
		}
		for (uint32_t i = 0; i < rf.total[t]; i++)
			out->discarded += rf.state[t][i] != KVP_PAGE_FREE;
	}
	nkeys = get32(&r);
	if (r.bad || nkeys > h->body_bytes / 27 || !(kr = calloc(nkeys + 1, sizeof(*kr)))) {
		snprintf(why, cap, "a bad entry count");
		goto out;
	}
	for (uint32_t i = 0; i < nkeys && !r.bad; i++) {
		struct key_rec *e = &kr[i];

		e->idx = get32(&r);
		e->parent = get32(&r);
		e->ns = get64(&r);
		e->tier = get8(&r);
		e->keyed = get8(&r);
		e->len = get8(&r);
		e->page = get32(&r);
		e->hits = get32(&r);
		e->key = take(&r, e->len);
		e->tokens = e->keyed ? NULL : take(&r, (size_t)pt * 4);
		e->at = UINT32_MAX;
		if (!r.bad && ((e->keyed ? !e->len : e->len && e->len != KVP_PAGE_KEY_BYTES) ||
			       e->len > KVP_KEY_MAX || e->keyed > 1 ||
			       !ref(&rf, e->tier, e->page, KVP_PAGE_CACHED)))
			r.bad = true;
	}
	sess_off = r.off;
	nsess = get32(&r);
	for (uint32_t i = 0; i < nsess && !r.bad; i++) {
		uint32_t nl;

		take(&r, 16 + 12 + 64);
		nl = get32(&r);
		for (uint32_t j = 0; j < nl && !r.bad; j++) {
			uint8_t t;
			uint32_t n;
			const uint8_t *pg;

			get64(&r);
			t = get8(&r);
			n = get32(&r);
			pg = take(&r, (size_t)n * 4);
			for (uint32_t k = 0; pg && k < n && with_sessions; k++) {
				uint32_t id;

				memcpy(&id, pg + 4 * k, 4);
				if (!ref(&rf, t, id, KVP_PAGE_LEASED))
					r.bad = true;
			}
		}
		nl = get32(&r);
		for (uint32_t j = 0; j < nl && !r.bad; j++) {
			uint8_t kind;
			uint32_t n;

			get64(&r);
			kind = get8(&r);
			get64(&r);
			n = get32(&r);
			if (kind == 0) {
				take(&r, (size_t)n * pt * 4);
			} else if (kind == 1 && n <= h->body_bytes) {
				for (uint32_t k = 0; k < n && !r.bad; k++)
					take(&r, get8(&r));
			} else {
				r.bad = true;
			}
		}
	}
	if (r.bad || r.off != r.n) {
		snprintf(why, cap,
			 "the books do not parse or name a page twice or in the wrong state");
		goto out;
	}
	byidx = malloc(sizeof(*byidx) * (nkeys + 1));
	if (!byidx) {
		snprintf(why, cap, "out of memory");
		goto out;
	}
	/* Consistent: claim every page named, then rebuild. */
	for (int t = 0; t < KVP_TIER_ID_MAX; t++)
		if (rf.n[t] && kvp_pages_claim(p->pages[t], rf.ids[t], rf.n[t]) < 0) {
			snprintf(why, cap, "the %s tier's pages cannot be claimed", g_tier_what[t]);
			while (t-- > 0) /* a fresh pool: cannot happen, but leave it empty */
				if (rf.n[t])
					kvp_pages_release(p->pages[t], rf.ids[t], rf.n[t]);
			goto out;
		}
	/* Entries parents first: each one's depth through its parent (found by idx). */
	qsort(kr, nkeys, sizeof(*kr), idx_cmp);
	for (uint32_t i = 0; i < nkeys; i++)
		kr[i].depth = UINT32_MAX;
	for (uint32_t i = 0; i < nkeys; i++)
		key_depth(kr, nkeys, i);
	memcpy(byidx, kr, sizeof(*kr) * nkeys);
	qsort(kr, nkeys, sizeof(*kr), key_cmp);
	for (uint32_t i = 0; i < nkeys; i++) {
		struct key_rec *e = &kr[i], *par = NULL;
		uint32_t *tk = NULL, at;
		struct kvp_index_entry x = { 0 };

		if (e->depth == DEPTH_BAD)
			continue;
		if (e->parent != UINT32_MAX &&
		    (!(par = key_find(byidx, nkeys, e->parent)) || par->at == UINT32_MAX))
			continue;
		if (!e->keyed && !(tk = malloc((size_t)pt * 4))) /* aligned: the body is not */
			continue;
		if (tk)
			memcpy(tk, e->tokens, (size_t)pt * 4);
		x = (struct kvp_index_entry){ .ns = e->ns,
					      .keyed = e->keyed,
					      .key = { e->len, e->key },
					      .tokens = tk,
					      .tier = (enum kvp_tier_id)e->tier,
					      .page = e->page,
					      .hits = e->hits };
		if (kvp_index_put(p->ix, &x, par ? par->at : UINT32_MAX, &at) == 0) {
			key_find(byidx, nkeys, e->idx)->at = at;
			out->cached++;
		}
		free(tk);
	}
	/* Sessions that may resume, their leases. */
	r.off = sess_off;
	nsess = get32(&r);
	for (uint32_t i = 0; i < nsess; i++) {
		const uint8_t *tok = take(&r, 16);
		uint32_t uid = get32(&r), gid = get32(&r);
		int32_t pid = (int32_t)get32(&r);
		const char *name = take(&r, 64);
		uint32_t nl = get32(&r);
		struct kvp_session *s =
			with_sessions ? limbo_session(d, tok, uid, gid, pid, name) : NULL;

		if (s)
			out->sessions++;
		for (uint32_t j = 0; j < nl; j++) {
			uint64_t id = get64(&r);
			uint8_t t = get8(&r);
			uint32_t n = get32(&r);
			const uint8_t *pg = take(&r, (size_t)n * 4);
			uint32_t *pages = s ? malloc((size_t)n * 4 + 4) : NULL;
			struct kvp_lease *l = NULL;
			struct kvp_fail f;

			if (!pages)
				continue;
			memcpy(pages, pg, (size_t)n * 4);
			kvp_fail_init(&f);
			l = kvp_lease_restore(p, t, id, pages, n, &f);
			free(pages);
			if (!l)
				continue;
			if (kvp_session_lease_add(s, l) < 0) {
				kvp_lease_destroy(l);
				continue;
			}
			kvp_session_attach(s, p);
			out->leases++;
		}
		nl = get32(&r);
		for (uint32_t j = 0; j < nl; j++) {
			uint64_t id = get64(&r), ns;
			uint8_t kind = get8(&r);
			uint32_t n;

			ns = get64(&r);
			n = get32(&r);
			if (kind == 0) {
				const uint8_t *tok = take(&r, (size_t)n * pt * 4);

				if (s && restore_token_lock(p, s, id, ns, tok, n) == 0)
					out->locks++;
			} else {
				struct kvp_key *keys = calloc(n + 1, sizeof(*keys));

				for (uint32_t k = 0; k < n; k++) {
					if (keys) {
						keys[k].len = get8(&r);
						keys[k].data = take(&r, keys[k].len);
					} else {
						take(&r, get8(&r));
					}
				}
				if (s && keys && restore_keys_lock(p, s, id, ns, keys, n) == 0)
					out->locks++;
				free(keys);
			}
		}
	}
	/* What no one took back (duplicates, failed inserts) is free again. */
	for (int t = 0; t < KVP_TIER_ID_MAX; t++) {
		uint32_t k = 0;

		for (uint32_t i = 0; i < rf.n[t]; i++)
			if (kvp_pages_state(p->pages[t], rf.ids[t][i]) == KVP_PAGE_LEASED &&
			    !p->lease_of[t][rf.ids[t][i]])
				rf.ids[t][k++] = rf.ids[t][i];
		if (k)
			kvp_pages_release(p->pages[t], rf.ids[t], k);
	}
	for (int t = 0; t < KVP_TIER_ID_MAX; t++)
		if (p->pages[t])
			out->discarded -= kvp_pages_total(p->pages[t]) -
					  kvp_pages_count(p->pages[t], KVP_PAGE_FREE);
	if (keyed && !d->id_keyed) {
		d->id_key[0] = key[0];
		d->id_key[1] = key[1];
		d->id_keyed = true;
	}
	if (ids[0] > d->next_session_id)
		d->next_session_id = ids[0];
	if (ids[1] > d->next_lease_id)
		d->next_lease_id = ids[1];
	if (ids[2] > d->next_lock_id)
		d->next_lock_id = ids[2];
	ret = 0;
out:
	for (int t = 0; t < KVP_TIER_ID_MAX; t++) {
		free(rf.seen[t]);
		free(rf.ids[t]);
	}
	free(kr);
	free(byidx);
	return ret;
}

/* Reads, checks and restores the body of fd into p. 0 or -1 with why. */
static int restore_from(struct kvp_daemon *d, struct kvpd_pool *p, int fd, struct restored *res,
			char *why, size_t cap)
{
	struct snap_hdr h;
	uint8_t *body;
	size_t off = 0;
	int r;

	if (read_hdr(fd, &h) < 0) {
		snprintf(why, cap, "its header cannot be read");
		return -1;
	}
	if (h.gen_clean != h.gen_dirty) {
		snprintf(why, cap,
			 "the previous kvpoold stopped without a clean checkpoint "
			 "(generation %lu of %lu): pages in doubt",
			 (unsigned long)h.gen_clean, (unsigned long)h.gen_dirty);
		return -1;
	}
	if (!h.body_bytes || h.body_bytes > (1ull << 40)) {
		snprintf(why, cap, "no checkpoint was written");
		return -1;
	}
	body = malloc(h.body_bytes);
	if (!body) {
		snprintf(why, cap, "out of memory for %lu bytes of books",
			 (unsigned long)h.body_bytes);
		return -1;
	}
	while (off < h.body_bytes) {
		ssize_t k = pread(fd, body + off, h.body_bytes - off, HDR_BYTES + off);

		if (k <= 0) {
			if (k < 0 && errno == EINTR)
				continue;
			break;
		}
		off += (size_t)k;
	}
	if (off != h.body_bytes || kvp_crc32c(body, h.body_bytes) != h.body_crc) {
		snprintf(why, cap, "the checksum of its books does not match");
		free(body);
		return -1;
	}
	r = restore(d, p, &h, body, res, why, cap);
	free(body);
	return r;
}

static void store_drop(const struct kvp_pool_conf *pc)
{
	char tn[KVP_TIER_ID_MAX][300], mn[300];

	names_of(pc, tn, mn);
	for (int t = 0; t < KVP_TIER_ID_MAX; t++) {
		int fd = kvp_fdstore_get(tn[t]);

		if (fd >= 0)
			close(fd);
		kvp_fdstore_remove(tn[t]);
	}
	{
		int fd = kvp_fdstore_get(mn);

		if (fd >= 0)
			close(fd);
	}
	kvp_fdstore_remove(mn);
}

static struct kvpd_pool *adopt_pool(struct kvp_daemon *d, const struct kvp_pool_conf *pc,
				    uint32_t id, const struct snap_hdr *h, bool *adopted)
{
	char tn[KVP_TIER_ID_MAX][300], mn[300], why[256];
	int fds[KVP_TIER_ID_MAX];
	struct restored res = { 0 };
	struct kvp_fail f;
	struct kvpd_pool *p;
	int mfd;

	names_of(pc, tn, mn);
	for (int t = 0; t < KVP_TIER_ID_MAX; t++)
		fds[t] = kvp_fdstore_get(tn[t]);
	mfd = kvp_fdstore_get(mn);
	kvp_fail_init(&f);
	p = kvp_pool_adopt(pc, id, fds, h->tier_bytes, &f);
	if (!p) {
		log_warn("pool %s: its memory from the fd store cannot be adopted (%s): created "
			 "afresh",
			 pc->name, f.msg);
		if (mfd >= 0)
			close(mfd);
		store_drop(pc);
		return NULL;
	}
	*adopted = true;
	if (restore_from(d, p, mfd, &res, why, sizeof(why)) < 0) {
		/* what the stored page states held, when they could be read */
		d->st.pages_discarded += res.discarded;
		log_warn("pool %s: memory adopted but its books are not (%s): the pool starts "
			 "empty",
			 pc->name, why);
	} else {
		d->st.pages_adopted += res.cached;
		d->st.pages_discarded += res.discarded;
		log_notice(
			"pool %s: adopted from the fd store: %lu cached pages kept, %lu pages "
			"in doubt freed, %u sessions (%u leases, %u locks) may resume within %u ms",
			pc->name, (unsigned long)res.cached, (unsigned long)res.discarded,
			res.sessions, res.leases, res.locks, d->conf.resume_grace_ms);
	}
	if (snap_open(p, mfd) < 0)
		log_warn("pool %s: its books cannot be kept for the next restart", pc->name);
	return p;
}

int kvp_snap_start_pools(struct kvp_daemon *d,
			 struct kvpd_pool *(*create)(const struct kvp_pool_conf *pc, uint32_t id,
						     char *why, size_t whylen))
{
	bool any = false;

	for (uint32_t i = 0; i < d->conf.n_pools; i++) {
		const struct kvp_pool_conf *pc = &d->conf.pools[i];
		char tn[KVP_TIER_ID_MAX][300], mn[300], why[160];
		struct snap_hdr h;
		struct kvpd_pool *p = NULL;
		bool stored = false, adopted = false;

		names_of(pc, tn, mn);
		stored = kvp_fdstore_peek(mn) >= 0 || kvp_fdstore_peek(tn[0]) >= 0 ||
			 kvp_fdstore_peek(tn[1]) >= 0;
		if (stored) {
			adopt_check(pc, why, sizeof(why), &h);
			if (!why[0]) {
				p = adopt_pool(d, pc, i, &h, &adopted);
			} else {
				log_notice(
					"pool %s: the stored pool is released and the pool created "
					"afresh: %s",
					pc->name, why);
				store_drop(pc);
			}
		}
		if (!p) {
			p = create(pc, i, NULL, 0);
			if (!p)
				return -1;
			if (kvp_snap_attach(p) < 0)
				log_warn("pool %s: no books for restarts: %s", pc->name,
					 strerror(errno));
		} else {
			store_put(p);
		}
		any |= adopted;
		d->pools[i] = p;
		d->n_pools = i + 1;
		if (p->snap)
			write_pool(d, p, false, false); /* the books as they are now */
	}
	if (any)
		d->st.restarts++;
	kvp_fdstore_release_rest();
	return 0;
}

int kvp_snap_hello(struct kvp_daemon *d, struct kvp_session *s, const uint8_t *tok, size_t len)
{
	if (tok && len == sizeof(s->resume_token)) {
		for (struct kvp_session *o = d->sessions; o; o = o->next) {
			if (o == s || !o->resume_until_ms || o->uid != s->uid ||
			    memcmp(o->resume_token, tok, len))
				continue;
			kvp_session_take_over(d, s, o);
			d->st.sessions_resumed++;
			return 1;
		}
	}
	if (getrandom(s->resume_token, sizeof(s->resume_token), 0) !=
	    (ssize_t)sizeof(s->resume_token))
		memset(s->resume_token, 0, sizeof(s->resume_token)); /* no token: none resumes */
	return 0;
}
