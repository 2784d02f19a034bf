/* libkvpool_reserve.c - the client's side of a pool's page reserve (proto/kvp_ring.h): Alloc
 * takes pages from the fill ring and Free puts them into the return ring, with no system call;
 * below and above watermarks a Reserve call is sent without waiting for it (kvpoold refills
 * and drains the rings when it serves it). A lease leased that way has a local id (bit 63
 * set) that kvpoold learns only when a call is about to name it: the library first sends a
 * Reserve call binding its pages under that id, pipelined before the call itself. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kvp_internal.h"
#include "kvp_ring.h"

#define LOCAL_BIT (UINT64_C(1) << 63)
#define INLINE_PAGES 4

struct local_lease {
	uint64_t id; /* 0: the slot is free */
	int tier;
	uint32_t n, cap;
	uint32_t *pages; /* inl, or allocated beyond INLINE_PAGES */
	uint32_t inl[INLINE_PAGES];
};

struct kvp_resv {
	struct kvp_client *c;
	uint32_t pool_id;
	int fd;
	void *base;
	size_t bytes;
	uint32_t slots, epoch;
	struct kvp_resv_hdr *h;
	struct {
		uint32_t granted;
		struct kvp_ring fill, ret;
		uint32_t rtail; /* the return ring's tail: ours */
	} t[KVP_TIER_MAX];
	struct local_lease *ll;
	uint32_t nll;
	uint32_t *free_slots;
	uint32_t nfree;
	uint32_t gen;
	uint64_t seq;
	uint32_t miss_run, backoff; /* misses since the last refill asked, and how many to wait */
	struct kvp_resv_stats st;
};

static bool dead(const struct kvp_resv *rv);

int kvp__resv_open(struct kvp_client *c, uint32_t pool_id, int fd, uint64_t bytes, uint32_t slots,
		   const uint32_t *granted, size_t ngranted, struct kvp_resv **out,
		   struct kvp_error *err)
{
	struct kvp_resv *rv;

	if (!kvp_resv_slots_ok(slots) || bytes < kvp_resv_bytes(slots) || bytes > (1u << 30)) {
		close(fd);
		return kvp__fail(err, KVP_E_PROTOCOL, 0, "attach reply: a bad reserve region");
	}
	rv = calloc(1, sizeof(*rv));
	if (!rv) {
		close(fd);
		return kvp__fail(err, KVP_E_NOMEM, ENOMEM, "out of memory");
	}
	rv->c = c;
	rv->pool_id = pool_id;
	rv->fd = fd;
	rv->bytes = bytes;
	rv->slots = slots;
	rv->base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (rv->base == MAP_FAILED) {
		int e = errno;

		rv->base = NULL;
		kvp__resv_close(rv);
		return kvp__fail(err, KVP_E_MAP, e, "mapping the reserve region: %s", strerror(e));
	}
	rv->h = rv->base;
	if (rv->h->magic != KVP_RESV_MAGIC || rv->h->version != KVP_RESV_VERSION ||
	    rv->h->slots != slots) {
		kvp__resv_close(rv);
		return kvp__fail(err, KVP_E_PROTOCOL, 0, "the reserve region has a bad header");
	}
	rv->epoch = atomic_load_explicit(&rv->h->epoch, memory_order_acquire);
	for (int t = 0; t < KVP_TIER_MAX && (size_t)t < ngranted; t++) {
		rv->t[t].granted = granted[t];
		kvp_ring_at(rv->base, bytes, slots, t, KVP_RING_FILL, &rv->t[t].fill);
		kvp_ring_at(rv->base, bytes, slots, t, KVP_RING_RETURN, &rv->t[t].ret);
		rv->t[t].rtail = atomic_load_explicit(rv->t[t].ret.tail, memory_order_acquire);
	}
	*out = rv;
	return 0;
}

void kvp__resv_close(struct kvp_resv *rv)
{
	if (!rv)
		return;
	for (uint32_t i = 0; i < rv->nll; i++)
		if (rv->ll[i].pages != rv->ll[i].inl)
			free(rv->ll[i].pages);
	free(rv->ll);
	free(rv->free_slots);
	if (rv->base)
		munmap(rv->base, rv->bytes);
	if (rv->fd >= 0)
		close(rv->fd);
	free(rv);
}

uint32_t kvp__resv_granted(const struct kvp_resv *rv, int tier)
{
	if (!rv || tier < 0 || tier >= KVP_TIER_MAX || dead(rv))
		return 0;
	return rv->t[tier].granted;
}

void *kvp__resv_region(const struct kvp_resv *rv, size_t *bytes, uint32_t *slots)
{
	if (!rv)
		return NULL;
	*bytes = rv->bytes;
	*slots = rv->slots;
	return rv->base;
}

void kvp__resv_stats(const struct kvp_resv *rv, struct kvp_resv_stats *out)
{
	if (rv)
		*out = rv->st;
	else
		memset(out, 0, sizeof(*out));
}

/* The reserve ended, or the region serves a later reserve of the session now. */
static bool dead(const struct kvp_resv *rv)
{
	return (atomic_load_explicit(&rv->h->flags, memory_order_relaxed) & KVP_RESV_DEAD) ||
	       atomic_load_explicit(&rv->h->epoch, memory_order_relaxed) != rv->epoch;
}

static struct local_lease *find(struct kvp_resv *rv, uint64_t id)
{
	uint32_t idx = (uint32_t)id;

	if (!(id & LOCAL_BIT) || idx >= rv->nll || rv->ll[idx].id != id)
		return NULL;
	return &rv->ll[idx];
}

static struct local_lease *slot_new(struct kvp_resv *rv)
{
	uint32_t idx;

	if (!rv->nfree) {
		uint32_t cap = rv->nll ? rv->nll * 2 : 64;
		struct local_lease *ll = realloc(rv->ll, sizeof(*ll) * cap);
		uint32_t *fs;

		if (!ll)
			return NULL;
		rv->ll = ll;
		fs = realloc(rv->free_slots, sizeof(*fs) * cap);
		if (!fs)
			return NULL;
		rv->free_slots = fs;
		for (uint32_t i = cap; i-- > rv->nll;) {
			memset(&ll[i], 0, sizeof(ll[i]));
			ll[i].pages = ll[i].inl;
			ll[i].cap = INLINE_PAGES;
			fs[rv->nfree++] = i;
		}
		rv->nll = cap;
	}
	idx = rv->free_slots[--rv->nfree];
	rv->gen = (rv->gen + 1) & 0x7fffffffu;
	rv->ll[idx].id = LOCAL_BIT | (uint64_t)rv->gen << 32 | idx;
	rv->ll[idx].n = 0;
	return &rv->ll[idx];
}

static void slot_drop(struct kvp_resv *rv, struct local_lease *l)
{
	if (l->pages != l->inl) {
		free(l->pages);
		l->pages = l->inl;
		l->cap = INLINE_PAGES;
	}
	l->id = 0;
	l->n = 0;
	rv->free_slots[rv->nfree++] = (uint32_t)(l - rv->ll);
}

static int room_for(struct local_lease *l, uint32_t more)
{
	uint32_t cap = l->cap;
	uint32_t *np;

	if (l->n + more <= cap)
		return 0;
	while (cap < l->n + more)
		cap *= 2;
	np = malloc(sizeof(*np) * cap);
	if (!np)
		return -1;
	memcpy(np, l->pages, sizeof(*np) * l->n);
	if (l->pages != l->inl)
		free(l->pages);
	l->pages = np;
	l->cap = cap;
	return 0;
}

/* Sends a Reserve call (binds may be NULL), without waiting when !wait. 0 or a negative
 * code. */
static int reserve_call(struct kvp_resv *rv, Kvpool__ReserveBind **binds, size_t nbinds, bool wait,
			struct kvp_error *err)
{
	Kvpool__Request req = KVPOOL__REQUEST__INIT;
	Kvpool__ReserveReq a = KVPOOL__RESERVE_REQ__INIT;
	Kvpool__Response *resp;
	int r;

	req.call_case = KVPOOL__REQUEST__CALL_RESERVE;
	req.reserve = &a;
	a.pool_id = rv->pool_id;
	a.seq = ++rv->seq;
	a.binds = binds;
	a.n_binds = nbinds;
	atomic_store_explicit(&rv->h->kick_seq, a.seq, memory_order_release);
	rv->st.calls++;
	if (!wait)
		return kvp__rpc_send(rv->c, &req, err);
	r = kvp__rpc(rv->c, &req, KVPOOL__RESPONSE__RESULT_RESERVE, &resp, NULL, NULL, err);
	if (r == 0)
		kvpool__response__free_unpacked(resp, NULL);
	return r;
}

/* A refill or drain, unless one is in flight (kvpoold has not served the last one sent). */
static void kick(struct kvp_resv *rv)
{
	if (dead(rv) || atomic_load_explicit(&rv->h->served_seq, memory_order_acquire) != rv->seq)
		return;
	reserve_call(rv, NULL, 0, false, NULL);
}

int kvp__resv_alloc(struct kvp_resv *rv, int tier, uint32_t npages, uint64_t *lease_id,
		    uint32_t *pages)
{
	struct local_lease *l;
	uint32_t level;

	if (!rv || tier < 0 || tier >= KVP_TIER_MAX || !rv->t[tier].granted || !npages ||
	    npages > rv->t[tier].granted || dead(rv))
		return 0;
	if (!(l = slot_new(rv)))
		return 0;
	if (room_for(l, npages) < 0 || !kvp_ring_take(&rv->t[tier].fill, npages, l->pages)) {
		slot_drop(rv, l);
		rv->st.misses++;
		/* An empty ring that refills do not fill (kvpoold has no free pages to spare): ask
		 * again after 1, 2, 4 .. 1024 misses, so the fallback costs what the call costs. */
		if (++rv->miss_run >= rv->backoff) {
			rv->miss_run = 0;
			rv->backoff =
				rv->backoff ? (rv->backoff < 1024 ? rv->backoff * 2 : 1024) : 1;
			kick(rv);
		}
		return 0;
	}
	rv->backoff = 0;
	rv->miss_run = 0;
	l->tier = tier;
	l->n = npages;
	memcpy(pages, l->pages, sizeof(uint32_t) * npages);
	*lease_id = l->id;
	rv->st.allocs++;
	level = kvp_ring_count(&rv->t[tier].fill);
	if (level < KVP_RESV_LOW(rv->t[tier].granted))
		kick(rv);
	return 1;
}

int kvp__resv_extend(struct kvp_resv *rv, uint64_t lease_id, uint32_t npages, uint32_t *pages)
{
	struct local_lease *l = rv ? find(rv, lease_id) : NULL;

	if (!l || !npages || npages > rv->t[l->tier].granted || dead(rv) ||
	    room_for(l, npages) < 0 ||
	    !kvp_ring_take(&rv->t[l->tier].fill, npages, l->pages + l->n))
		return 0;
	memcpy(pages, l->pages + l->n, sizeof(uint32_t) * npages);
	l->n += npages;
	if (kvp_ring_count(&rv->t[l->tier].fill) < KVP_RESV_LOW(rv->t[l->tier].granted))
		kick(rv);
	return 1;
}

/* Index of page pg in l, or -1. */
static int64_t index_of(const struct local_lease *l, uint32_t pg)
{
	for (uint32_t i = l->n; i-- > 0;)
		if (l->pages[i] == pg)
			return i;
	return -1;
}

int kvp__resv_free(struct kvp_resv *rv, uint64_t lease_id, const uint32_t *pages, uint32_t n,
		   uint32_t *left, struct kvp_error *err)
{
	struct local_lease *l = rv ? find(rv, lease_id) : NULL;
	uint32_t give = n ? n : 0, tier;
	const uint32_t *ids;

	if (!l)
		return 0;
	tier = (uint32_t)l->tier;
	if (n > l->n)
		return kvp__fail(err, KVP_E_NOT_FOUND, 0,
				 "free: %u pages listed but lease %llu holds %u", n,
				 (unsigned long long)lease_id, l->n);
	if (n) {
		/* every page must be in the lease, once: checked before anything moves */
		for (uint32_t i = 0; i < n; i++) {
			int64_t at = index_of(l, pages[i]);

			if (at < 0 || (uint32_t)at >= l->n - i)
				goto not_found;
			/* move it to the end so a duplicate is not found again */
			l->pages[at] = l->pages[l->n - 1 - i];
			l->pages[l->n - 1 - i] = pages[i];
		}
		ids = l->pages + (l->n - n);
	} else {
		give = l->n;
		ids = l->pages;
	}
	if (dead(rv)) {
		/* kvpoold ended the reserve and took every page of it back: nothing to return */
		give = n ? n : l->n;
	} else if (give && !kvp_ring_put(&rv->t[tier].ret, &rv->t[tier].rtail, ids, give)) {
		/* no room now: a waited drain, then the ring or (failing that) the call */
		if (dead(rv) || reserve_call(rv, NULL, 0, true, NULL) < 0 ||
		    !kvp_ring_put(&rv->t[tier].ret, &rv->t[tier].rtail, ids, give))
			return 0;
	}
	l->n -= give;
	*left = l->n;
	rv->st.frees++;
	if (!n)
		slot_drop(rv, l);
	if (kvp_ring_count(&rv->t[tier].ret) >= KVP_RESV_HIGH(rv->slots))
		kick(rv);
	return 1;
not_found:
	return kvp__fail(err, KVP_E_NOT_FOUND, 0,
			 "free: a page listed is not in lease %llu (or listed twice)",
			 (unsigned long long)lease_id);
}

int kvp__resv_bind(struct kvp_resv *rv, uint64_t lease_id, struct kvp_error *err)
{
	struct local_lease *l = rv ? find(rv, lease_id) : NULL;
	Kvpool__ReserveBind b = KVPOOL__RESERVE_BIND__INIT, *bp = &b;
	int r;

	if (!l)
		return 0;
	if (!l->n) { /* nothing to bind: kvpoold answers NOT_FOUND for the id, as for any */
		slot_drop(rv, l);
		return 0;
	}
	b.lease_id = l->id;
	b.tier = (Kvpool__Tier)l->tier;
	b.pages = l->pages;
	b.n_pages = l->n;
	r = reserve_call(rv, &bp, 1, false, err);
	rv->st.binds++;
	slot_drop(rv, l);
	return r;
}

int kvp__resv_sync(struct kvp_resv *rv, struct kvp_error *err)
{
	if (!rv)
		return kvp__fail(err, KVP_E_NOT_FOUND, 0, "no reserve");
	return reserve_call(rv, NULL, 0, true, err);
}
