/* reserve.c - per-session page reserves in shared memory.
 *
 * Each reserved tier books its pages in two leases that no call names: `ring`, the pages put
 * in the fill ring that the client had not taken when kvpoold last looked, and `out`, those it
 * took (now in its local leases, or on their way back through the return ring). kvpoold keeps
 * its own copy of the fill ring's ids and indices, so all it reads from the region is the
 * fill ring's head (which may only move forward to the tail it wrote) and the return ring's
 * tail and ids, each id checked to be one of `out`'s. Returned pages go back into the fill
 * ring while it is below the granted size, else to the pool. */
#include "reserve.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kvp_ring.h"
#include "names.h"
#include "session.h"

struct reserve_tier {
	uint32_t granted; /* 0: this tier has no reserve */
	struct kvp_lease *ring, *out;
	uint32_t *shadow;    /* what kvpoold wrote in each fill slot */
	uint32_t tail, seen; /* fill ring: kvpoold's tail, the head it last read */
	uint32_t rhead;	     /* return ring: kvpoold's head */
	struct kvp_ring fill, ret;
};

/* A session's region in one pool. It lives until the session ends, not the reserve: an Attach
 * reply naming its fd may still wait to be sent when the reserve ends, and that fd number must
 * not name another session's region by then. A later reserve of the session reuses it. */
struct kvp_resv_region {
	int fd;
	void *base;
	size_t bytes;
	uint32_t slots;
	uint32_t epoch;		       /* reserves it held */
	struct kvp_resv_region *older; /* smaller ones it replaced (a reload raised the limit) */
};

struct kvp_reserve {
	struct kvp_daemon *d;
	struct kvp_session *s;
	struct kvpd_pool *pool;
	struct kvp_resv_region *reg;
	int fd;
	void *base;
	size_t bytes;
	uint32_t slots;
	bool dead;
	uint32_t *scratch; /* 2 * slots ids */
	struct reserve_tier t[KVP_TIER_ID_MAX];
};

_Static_assert(KVP_TIER_ID_MAX == KVP_RESV_TIERS, "one ring pair per tier");

static struct kvp_resv_hdr *hdr(const struct kvp_reserve *r)
{
	return r->base;
}

static uint32_t booked(const struct reserve_tier *t)
{
	return (t->ring ? t->ring->n : 0) + (t->out ? t->out->n : 0);
}

/* After t's leases changed from `before` pages: the session's quota count and the pool's
 * reserved figure follow. */
static void recount(struct kvp_reserve *r, int tier, uint32_t before)
{
	uint32_t now = booked(&r->t[tier]);

	r->s->leased_pages[r->pool->id] += now;
	r->s->leased_pages[r->pool->id] -= before;
	r->pool->reserved[tier] += now;
	r->pool->reserved[tier] -= before;
}

static uint32_t pow2_at_least(uint32_t v)
{
	uint32_t n = KVP_RESV_MIN_SLOTS;

	while (n < v && n < KVP_RESV_MAX_SLOTS)
		n *= 2;
	return n;
}

/* The pages the client took since kvpoold last looked move from ring to out. 0, or -ENOMEM
 * (nothing changed: a later call retries). */
static int see_taken(struct kvp_reserve *r, struct reserve_tier *t, uint32_t head)
{
	uint32_t n = head - t->seen;
	int rc;

	for (uint32_t i = 0; i < n; i++)
		r->scratch[i] = t->shadow[(t->seen + i) & (r->slots - 1)];
	if (n && (rc = kvp_lease_move(t->ring, t->out, r->scratch, n)) < 0)
		return rc == -ENOMEM ? rc : -EFAULT; /* -EFAULT: kvpoold's own books disagree */
	t->seen = head;
	return 0;
}

/* Puts ring->pages[from ..] (pages of ring not in the fill ring yet) into the fill ring. */
static void produce(struct kvp_reserve *r, struct reserve_tier *t, uint32_t from)
{
	uint32_t n = t->ring->n - from;

	for (uint32_t i = 0; i < n; i++)
		t->shadow[(t->tail + i) & (r->slots - 1)] = t->ring->pages[from + i];
	kvp_ring_produce(&t->fill, &t->tail, t->ring->pages + from, n);
}

/* Reads the fill ring's head and the return ring. Returned pages refill the fill ring up to
 * the granted size; the rest go back to the pool. 0, -EPROTO for a bad ring, or -ENOMEM
 * (nothing consumed: a later call retries). */
static int sync_tier(struct kvp_reserve *r, int tier)
{
	struct reserve_tier *t = &r->t[tier];
	uint32_t head, before = booked(t), keep, n0;
	int64_t m;
	int rc;

	if (!t->granted)
		return 0;
	/* The return ring first: a page the client took and gave back since the fill ring's head
	 * was last read is then seen taken too (its head moved before the return ring's tail). */
	m = kvp_ring_peek(&t->ret, t->rhead, r->scratch + r->slots);
	if (m < 0 || kvp_ring_head_seen(&t->fill, t->seen, t->tail, &head) < 0)
		return -EPROTO;
	if ((rc = see_taken(r, t, head)) < 0)
		return rc;
	if (m == 0)
		return 0;
	memmove(r->scratch, r->scratch + r->slots, sizeof(uint32_t) * (size_t)m);
	/* Every id must be one the client took and has not given back or bound: checked, all of
	 * them, before anything moves (kvp_lease_move changes nothing on failure). */
	n0 = t->ring->n;
	if ((rc = kvp_lease_move(t->out, t->ring, r->scratch, (uint32_t)m)) < 0) {
		recount(r, tier, before);
		return rc == -ENOMEM ? rc : -EPROTO;
	}
	kvp_ring_consumed(&t->ret, &t->rhead, (uint32_t)m);
	keep = t->tail - t->seen >= t->granted ? 0 : t->granted - (t->tail - t->seen);
	if (keep > (uint32_t)m)
		keep = (uint32_t)m;
	if (keep < (uint32_t)m)
		kvp_lease_return(t->ring, r->scratch + keep, (uint32_t)m - keep, NULL);
	produce(r, t, n0);
	recount(r, tier, before);
	return 0;
}

/* Tops the fill ring up to the granted size from free pages (never evicting), within
 * reserve_free_percent of them and the quotas. */
static void refill_tier(struct kvp_reserve *r, int tier)
{
	struct reserve_tier *t = &r->t[tier];
	struct kvpd_pool *p = r->pool;
	uint64_t nfree, room;
	uint32_t level = t->tail - t->seen, need, before = booked(t), n0;

	if (!t->granted || level >= t->granted || r->d->draining)
		return;
	n0 = t->ring->n;
	nfree = kvp_pages_count(p->pages[tier], KVP_PAGE_FREE);
	need = t->granted - level;
	nfree = nfree * r->d->conf.reserve_free_percent / 100;
	if (need > nfree)
		need = (uint32_t)nfree;
	room = kvp_session_room(r->d, r->s, p);
	if (need > room)
		need = (uint32_t)room;
	if (!need || kvp_lease_grow(t->ring, need, NULL) < 0)
		return;
	produce(r, t, n0);
	recount(r, tier, before);
}

/* Takes back what the client has not taken from the fill ring: those pages are freed. Returns
 * pages freed, -EPROTO for a bad ring, or -ENOMEM. */
static int64_t take_back(struct kvp_reserve *r, int tier)
{
	struct reserve_tier *t = &r->t[tier];
	uint32_t from, n, before = booked(t);
	int rc;

	if (kvp_ring_take_back(&t->fill, t->seen, t->tail, &from) < 0)
		return -EPROTO;
	if ((rc = see_taken(r, t, from)) < 0) {
		/* the ring is empty now (its head at the tail) and kvpoold's copy says which of
		 * its pages the client took; without memory to move them, keep them in ring */
		return rc;
	}
	n = t->ring->n; /* what is left in ring is exactly [from, tail) */
	t->seen = t->tail;
	if (n) {
		memcpy(r->scratch, t->ring->pages, sizeof(uint32_t) * n);
		kvp_lease_return(t->ring, r->scratch, n, NULL);
	}
	recount(r, tier, before);
	return n;
}

/* A bad ring: the reserve ends, every page it books returns, the region says so. */
static void kill(struct kvp_reserve *r)
{
	if (r->dead)
		return;
	r->dead = true;
	atomic_fetch_or_explicit(&hdr(r)->flags, KVP_RESV_DEAD, memory_order_release);
	for (int i = 0; i < KVP_TIER_ID_MAX; i++) {
		struct reserve_tier *t = &r->t[i];
		uint32_t before = booked(t), from;

		if (!t->granted)
			continue;
		/* the client can take nothing more from the fill ring (its swaps now fail) */
		if (kvp_ring_take_back(&t->fill, t->seen, t->tail, &from) < 0)
			atomic_store_explicit(t->fill.head, t->tail, memory_order_release);
		kvp_lease_destroy(t->ring);
		kvp_lease_destroy(t->out);
		t->ring = t->out = NULL;
		t->seen = t->tail;
		recount(r, i, before);
		t->granted = 0;
		hdr(r)->granted[i] = 0;
	}
}

static void release(struct kvp_reserve *r)
{
	if (!r)
		return;
	for (int i = 0; i < KVP_TIER_ID_MAX; i++) {
		struct reserve_tier *t = &r->t[i];
		uint32_t before = booked(t);

		kvp_lease_destroy(t->ring);
		kvp_lease_destroy(t->out);
		t->ring = t->out = NULL;
		recount(r, i, before);
		free(t->shadow);
	}
	free(r->scratch);
	free(r);
}

void kvp_reserve_end(struct kvp_session *s, struct kvpd_pool *p)
{
	struct kvp_reserve *r = s->reserve[p->id];

	if (!r)
		return;
	s->reserve[p->id] = NULL;
	r->d->n_reserves--;
	if (!r->dead)
		atomic_fetch_or_explicit(&hdr(r)->flags, KVP_RESV_DEAD, memory_order_release);
	release(r);
}

static void region_free(struct kvp_resv_region *g)
{
	while (g) {
		struct kvp_resv_region *o = g->older;

		if (g->base)
			munmap(g->base, g->bytes);
		if (g->fd >= 0)
			close(g->fd);
		free(g);
		g = o;
	}
}

void kvp_reserve_regions_free(struct kvp_session *s)
{
	for (int i = 0; i < KVP_MAX_POOLS; i++) {
		region_free(s->resv_region[i]);
		s->resv_region[i] = NULL;
	}
}

/* s's region in p with at least `slots` per ring, zeroed: the one it has, or a new one. 0 or
 * -errno. */
static int map_region(struct kvp_reserve *r, uint32_t slots)
{
	struct kvp_resv_region **gp = &r->s->resv_region[r->pool->id], *g = *gp;

	if (g && g->slots >= slots) {
		memset(g->base, 0, g->bytes);
	} else {
		if (!(g = calloc(1, sizeof(*g))))
			return -ENOMEM;
		g->slots = slots;
		g->bytes = kvp_resv_bytes(slots);
		g->fd = memfd_create("kvpool-reserve", MFD_CLOEXEC | MFD_ALLOW_SEALING);
		/* sized and sealed: the client cannot shrink it under kvpoold (SIGBUS) */
		if (g->fd < 0 || ftruncate(g->fd, (off_t)g->bytes) < 0 ||
		    fcntl(g->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0 ||
		    (g->base = mmap(NULL, g->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, g->fd,
				    0)) == MAP_FAILED) {
			int e = errno;

			g->base = NULL;
			region_free(g);
			return -e;
		}
		g->older = *gp;
		*gp = g;
	}
	g->epoch++;
	r->reg = g;
	r->fd = g->fd;
	r->base = g->base;
	r->bytes = g->bytes;
	r->slots = g->slots;
	return 0;
}

int kvp_reserve_open(struct kvp_daemon *d, struct kvp_session *s, struct kvpd_pool *p,
		     const uint32_t want[KVP_TIER_ID_MAX], struct kvp_reserve **out,
		     struct kvp_fail *f)
{
	uint32_t grant[KVP_TIER_ID_MAX] = { 0 }, most = 0;
	struct kvp_reserve *r;
	int rc = -ENOMEM;

	kvp_reserve_end(s, p);
	*out = NULL;
	for (int t = 0; t < KVP_TIER_ID_MAX; t++) {
		if (!kvp_pool_has_tier(p, t))
			continue;
		grant[t] =
			want[t] < d->conf.reserve_max_pages ? want[t] : d->conf.reserve_max_pages;
		if (grant[t] > most)
			most = grant[t];
	}
	{
		uint64_t room = kvp_session_room(d, s, p);

		for (int t = 0; t < KVP_TIER_ID_MAX; t++)
			if (grant[t] > room)
				grant[t] = (uint32_t)room;
		if (most > room)
			most = (uint32_t)room;
	}
	if (!most)
		return 0;
	r = calloc(1, sizeof(*r));
	if (!r)
		return kvp_fail(f, KVP_ERR_INTERNAL, "out of memory");
	r->d = d;
	r->s = s;
	r->pool = p;
	r->fd = -1;
	/* the return ring holds every page the reserve can book twice over */
	if ((rc = map_region(r, pow2_at_least(2 * most))) < 0 ||
	    (rc = -ENOMEM, !(r->scratch = malloc(sizeof(uint32_t) * 2 * r->slots)))) {
		release(r);
		return kvp_fail(f, KVP_ERR_INTERNAL, "reserve region: %s", strerror(-rc));
	}
	*hdr(r) = (struct kvp_resv_hdr){ .magic = KVP_RESV_MAGIC,
					 .version = KVP_RESV_VERSION,
					 .slots = r->slots,
					 .epoch = r->reg->epoch };
	for (int i = 0; i < KVP_TIER_ID_MAX; i++) {
		struct reserve_tier *t = &r->t[i];

		if (!grant[i])
			continue;
		kvp_ring_at(r->base, r->bytes, r->slots, i, KVP_RING_FILL, &t->fill);
		kvp_ring_at(r->base, r->bytes, r->slots, i, KVP_RING_RETURN, &t->ret);
		t->shadow = calloc(r->slots, sizeof(uint32_t));
		t->ring = kvp_lease_new_empty(p, i, kvp_daemon_new_id(d, &d->next_lease_id));
		t->out = kvp_lease_new_empty(p, i, kvp_daemon_new_id(d, &d->next_lease_id));
		if (!t->shadow || !t->ring || !t->out) {
			release(r);
			return kvp_fail(f, KVP_ERR_INTERNAL, "out of memory");
		}
		t->granted = grant[i];
		hdr(r)->granted[i] = grant[i];
	}
	s->reserve[p->id] = r;
	d->n_reserves++;
	p->reclaim = kvp_reserve_reclaim;
	p->reclaim_ctx = d;
	for (int i = 0; i < KVP_TIER_ID_MAX; i++)
		refill_tier(r, i);
	*out = r;
	return 0;
}

struct kvpd_pool *kvp_reserve_pool(const struct kvp_reserve *r)
{
	return r->pool;
}

int kvp_reserve_fd(const struct kvp_reserve *r)
{
	return r->fd;
}

size_t kvp_reserve_bytes(const struct kvp_reserve *r)
{
	return r->bytes;
}

uint32_t kvp_reserve_slots(const struct kvp_reserve *r)
{
	return r->slots;
}

uint32_t kvp_reserve_granted(const struct kvp_reserve *r, int tier)
{
	return tier >= 0 && tier < KVP_TIER_ID_MAX ? r->t[tier].granted : 0;
}

uint32_t kvp_reserve_pages(const struct kvp_reserve *r, int tier)
{
	return tier >= 0 && tier < KVP_TIER_ID_MAX ? booked(&r->t[tier]) : 0;
}

bool kvp_reserve_dead(const struct kvp_reserve *r)
{
	return r->dead;
}

static int bad_ring(struct kvp_reserve *r, int tier, struct kvp_fail *f)
{
	kill(r);
	return kvp_fail(f, KVP_ERR_PROTOCOL,
			"the %s reserve ring of pool %s holds an index or page id that is not "
			"this session's: the reserve ended and its pages returned",
			kvp_names_tier(tier), r->pool->conf.name);
}

static int bind(struct kvp_reserve *r, const struct kvp_reserve_bind *b, struct kvp_fail *f)
{
	struct kvp_session *s = r->s;
	struct reserve_tier *t;
	struct kvp_lease *l;
	uint32_t before;
	int rc;

	if (b->tier < 0 || b->tier >= KVP_TIER_ID_MAX || !r->t[b->tier].granted)
		return kvp_fail(f, KVP_ERR_INVALID_ARGUMENT, "bind: no reserve of tier %d",
				b->tier);
	if (!(b->lease_id >> 63) || b->lease_id == UINT64_MAX || !b->n)
		return kvp_fail(f, KVP_ERR_INVALID_ARGUMENT,
				"bind: a local lease id has bit 63 set and names pages");
	if (kvp_idmap_get(&s->leases, b->lease_id))
		return kvp_fail(f, KVP_ERR_INVALID_ARGUMENT, "bind: lease %lu exists",
				(unsigned long)b->lease_id);
	if ((rc = kvp_session_may_lease(r->d, s, r->pool, 0, true, f)) < 0)
		return rc;
	t = &r->t[b->tier];
	if (!(l = kvp_lease_new_empty(r->pool, b->tier, b->lease_id)))
		return kvp_fail(f, KVP_ERR_INTERNAL, "out of memory");
	before = booked(t);
	if ((rc = kvp_lease_move(t->out, l, b->pages, b->n)) < 0) {
		kvp_lease_destroy(l);
		return rc == -ENOMEM ? kvp_fail(f, KVP_ERR_INTERNAL, "out of memory")
				     : kvp_fail(f, KVP_ERR_NOT_FOUND,
						"bind: a page listed is not one this session took "
						"from its reserve (or is listed twice)");
	}
	recount(r, b->tier, before);
	if (kvp_session_lease_add(s, l) < 0) {
		kvp_lease_move(l, t->out, b->pages, b->n);
		recount(r, b->tier, before - b->n);
		kvp_lease_destroy(l);
		return kvp_fail(f, KVP_ERR_INTERNAL, "out of memory");
	}
	return 0;
}

int kvp_reserve_call(struct kvp_daemon *d, struct kvp_session *s, struct kvp_reserve *r,
		     uint64_t seq, const struct kvp_reserve_bind *binds, uint32_t nbinds,
		     struct kvp_fail *f)
{
	int rc = 0;

	(void)d;
	(void)s;
	if (r->dead)
		return kvp_fail(f, KVP_ERR_PROTOCOL,
				"the reserve of pool %s ended for a bad ring: use Alloc",
				r->pool->conf.name);
	for (int i = 0; i < KVP_TIER_ID_MAX; i++) {
		int rc2 = sync_tier(r, i);

		if (rc2 == -ENOMEM)
			return kvp_fail(f, KVP_ERR_INTERNAL, "out of memory");
		if (rc2 < 0)
			return bad_ring(r, i, f);
	}
	for (uint32_t i = 0; i < nbinds && rc == 0; i++)
		rc = bind(r, &binds[i], f);
	for (int i = 0; i < KVP_TIER_ID_MAX; i++)
		refill_tier(r, i);
	atomic_store_explicit(&hdr(r)->served_seq, seq, memory_order_release);
	return rc < 0 ? rc : (int)nbinds;
}

/* Whether tier t of r wants kvpoold (kvp_ring.h's watermarks). The indices are read as the
 * client left them: one that makes no sense wants kvpoold too (sync_tier then refuses it). */
static bool wants_upkeep(const struct kvp_reserve *r, const struct reserve_tier *t)
{
	uint32_t head = atomic_load_explicit(t->fill.head, memory_order_acquire);
	uint32_t rtail = atomic_load_explicit(t->ret.tail, memory_order_acquire);

	return head - t->seen > t->tail - t->seen || t->tail - head < KVP_RESV_LOW(t->granted) ||
	       rtail - t->rhead >= KVP_RESV_HIGH(r->slots);
}

/* What upkeep of s may move now: for each tier that wants it, at most refilled + returned;
 * a session worth more than a turn counts as one turn (it is served alone in one). */
static uint32_t upkeep_cost(const struct kvp_session *s)
{
	uint64_t cost = 0;

	for (uint32_t i = 0; i < KVP_MAX_POOLS; i++) {
		const struct kvp_reserve *r = s->reserve[i];

		for (int k = 0; r && !r->dead && k < KVP_TIER_ID_MAX; k++)
			if (r->t[k].granted && wants_upkeep(r, &r->t[k]))
				cost += (uint64_t)r->t[k].granted + r->slots;
	}
	return cost < KVP_RESERVE_TURN_PAGES ? (uint32_t)cost : KVP_RESERVE_TURN_PAGES;
}

bool kvp_reserve_upkeep(struct kvp_daemon *d, struct kvp_session *s, uint32_t *budget)
{
	uint32_t cost = upkeep_cost(s);

	(void)d;
	if (cost > *budget)
		return false;
	*budget -= cost;
	for (uint32_t i = 0; cost && i < KVP_MAX_POOLS; i++) {
		struct kvp_reserve *r = s->reserve[i];

		if (!r || r->dead)
			continue;
		for (int k = 0; k < KVP_TIER_ID_MAX && !r->dead; k++) {
			struct reserve_tier *t = &r->t[k];
			uint32_t tail, rhead;
			int rc;

			if (!t->granted || !wants_upkeep(r, t))
				continue;
			tail = t->tail;
			rhead = t->rhead;
			rc = sync_tier(r, k);
			if (rc == -EPROTO) {
				kill(r); /* its next Reserve call answers PROTOCOL */
				r->pool->st.reserve_bad_rings++;
				break;
			}
			if (rc == 0)
				refill_tier(r, k);
			if (t->tail != tail || t->rhead != rhead) /* something moved */
				r->pool->st.reserve_upkeeps++;
		}
	}
	return true;
}

uint32_t kvp_reserve_reclaim(void *ctx, struct kvpd_pool *p, int tier, uint32_t pages)
{
	struct kvp_daemon *d = ctx;
	uint32_t freed = 0;

	for (struct kvp_session *s = d->sessions; s && freed < pages; s = s->next) {
		struct kvp_reserve *r = s->reserve[p->id];
		uint32_t before;
		int64_t n;

		if (!r || r->dead || !r->t[tier].granted)
			continue;
		before = booked(&r->t[tier]);
		if ((n = sync_tier(r, tier)) == 0)
			n = take_back(r, tier);
		if (n == -ENOMEM)
			continue;
		if (n < 0) {
			kill(r); /* that session's next Reserve call answers PROTOCOL */
			freed += before;
			continue;
		}
		/* returned pages sync_tier put back in the fill ring were taken back too */
		freed += (uint32_t)n;
		p->st.reserve_taken_back += (uint32_t)n;
	}
	return freed;
}

int kvp_reserve_check(const struct kvp_reserve *r)
{
	for (int i = 0; i < KVP_TIER_ID_MAX; i++) {
		const struct reserve_tier *t = &r->t[i];

		if (!t->granted)
			continue;
		if (kvp_lease_check(t->ring) < 0 || kvp_lease_check(t->out) < 0 ||
		    t->tail - t->seen != t->ring->n)
			return -EFAULT;
		for (uint32_t k = t->seen; k != t->tail; k++) {
			uint32_t pg = t->shadow[k & (r->slots - 1)];

			if (r->pool->lease_of[i][pg] != t->ring->owner)
				return -EFAULT;
		}
	}
	return 0;
}
