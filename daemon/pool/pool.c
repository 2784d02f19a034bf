/* pool.c - pools: tier memory (through the tier backends' table), page leases, eviction before
 * any capacity error. */
#include "pool.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fault.h"
#include "log.h"
#include "names.h"
#include "budget.h"

/* budget.c counts this per page; the structures that hold it are here. */
_Static_assert(KVP_BUDGET_PAGE_FIXED_BYTES == sizeof(uint32_t) + sizeof(uint8_t) +
						      sizeof(**((struct kvpd_pool *)0)->lease_of) +
						      sizeof(**((struct kvpd_pool *)0)->lease_idx) +
						      2 * sizeof(*((struct kvp_lease *)0)->pages),
	       "per-page bookkeeping of pages.c, pool.h and leases");
#include "work.h"
#include "snapshot.h"

/* tier.h numbers options without the config's types (reply.c checks the backends) */
_Static_assert((int)KVP_OPT_OFF == (int)KVP_OFF && (int)KVP_OPT_TRY == (int)KVP_TRY &&
		       (int)KVP_OPT_ON == (int)KVP_ON,
	       "tier options follow the config's tristate");

bool kvp_pool_has_tier(const struct kvpd_pool *p, int tier)
{
	return tier >= 0 && tier < KVP_TIER_ID_MAX && p->pages[tier] != NULL;
}

/* Transfer between tiers for demotion and promotion, through the device tier's backend (the CPU
 * kernels for sim, the CUDA kernels for cuda); returns once the bytes are in place. */
static int pool_copy(void *ctx, enum kvp_copy_dir dir, const uint32_t *src, const uint32_t *dst,
		     uint32_t n)
{
	struct kvpd_pool *p = ctx;
	const struct kvp_tier_ops *ops = p->mem[KVP_TIER_ID_DEVICE].ops;
	int r = ops->copy(p->copy, dir, src, dst, n);

	return r < 0 ? r : ops->copy_wait(p->copy);
}

/* Demotions off the loop thread (kvp_pool_async): the worker waits for each flight, the loop
 * swaps the pages in and raises the pool's MOVED event. */
static struct kvp_work *g_work;

void kvp_pool_async(struct kvp_work *w)
{
	g_work = w;
}

bool kvp_pool_events_take(struct kvpd_pool *p, struct kvp_pool_events *out)
{
	if (!p->ev.short_ && !p->ev.moved)
		return false;
	*out = p->ev;
	p->ev.short_ = 0;
	p->ev.moved = false;
	return true;
}

struct demote_job {
	struct kvp_job job; /* first: the job is the struct */
	struct kvpd_pool *p;
	struct kvp_tier_flight *tf;
	struct kvp_index_flight *fl; /* the index's flight */
	int rc;
};

static void pool_free(struct kvpd_pool *p);
static uint32_t pool_evict(struct kvpd_pool *p, int tier, uint32_t pages, bool later);

/* On the worker: only the flight's own pages are touched. */
static void demote_run(struct kvp_job *j)
{
	struct demote_job *dj = (struct demote_job *)j;

	dj->rc = dj->p->mem[KVP_TIER_ID_DEVICE].ops->flight_wait(dj->tf);
}

/* On the loop thread. A cancelled flight (kvpoold stopping) is a failed copy. */
static void demote_land(struct kvp_job *j, bool cancelled)
{
	struct demote_job *dj = (struct demote_job *)j;
	struct kvpd_pool *p = dj->p;
	int rc = cancelled ? -ECANCELED : dj->rc;

	p->mem[KVP_TIER_ID_DEVICE].ops->flight_free(dj->tf);
	kvp_index_demote_done(p->ix, dj->fl, rc);
	if (rc < 0 && !cancelled)
		log_warn("pool %s: a demotion copy failed (%s): the device pages stay cached",
			 p->conf.name, strerror(-rc));
	free(dj);
	p->flights--;
	if (p->dying) {
		if (!p->flights)
			pool_free(p);
		return;
	}
	p->ev.moved = true;
}

/* The index's demotion: in flight on the worker where the backend and the daemon allow (1; the
 * index's demote_done is called with fl once it lands), else synchronous (0, or a negative
 * errno). */
static int flight_start(void *ctx, const uint32_t *src, const uint32_t *dst, uint32_t n,
			struct kvp_index_flight *fl)
{
	struct kvpd_pool *p = ctx;
	const struct kvp_tier_ops *ops = p->mem[KVP_TIER_ID_DEVICE].ops;
	struct demote_job *dj;
	int r;

	if (!g_work || !ops->copy_start || !(dj = calloc(1, sizeof(*dj))))
		return pool_copy(ctx, KVP_COPY_DEMOTE, src, dst, n);
	r = ops->copy_start(p->copy, KVP_COPY_DEMOTE, src, dst, n, &dj->tf);
	if (r != 1) {
		free(dj);
		return r < 0 ? r : 0;
	}
	dj->p = p;
	dj->fl = fl;
	dj->job.run = demote_run;
	dj->job.done = demote_land;
	if (kvp_work_submit(g_work, &dj->job) < 0) { /* stopping: wait here */
		r = ops->flight_wait(dj->tf);
		ops->flight_free(dj->tf);
		free(dj);
		return r < 0 ? r : 0;
	}
	p->flights++;
	return 1;
}

uint64_t kvp_pool_inflight(const struct kvpd_pool *p, int tier)
{
	struct kvp_index_stats ks;

	if (tier != KVP_TIER_ID_DEVICE || !kvp_pool_has_tier(p, tier))
		return 0;
	kvp_index_stats(p->ix, &ks);
	return ks.inflight_pages;
}

bool kvp_pool_fits_later(const struct kvpd_pool *p, int tier, uint32_t npages)
{
	struct kvp_tier_counts c;
	uint64_t later = kvp_pool_inflight(p, tier);

	if (!later)
		return false;
	kvp_pool_counts(p, tier, &c);
	return c.free + c.evictable + later >= npages;
}

/* The wire code of a tier failure. */
static enum kvp_err tier_code(const struct kvp_tier_fail *tf)
{
	static const enum kvp_err codes[KVP_TIER_E_MAX] = {
		[KVP_TIER_E_INTERNAL] = KVP_ERR_INTERNAL,
		[KVP_TIER_E_BUDGET] = KVP_ERR_HOST_BUDGET_EXCEEDED,
		[KVP_TIER_E_UNAVAILABLE] = KVP_ERR_UNAVAILABLE,
		[KVP_TIER_E_INVALID] = KVP_ERR_INVALID_ARGUMENT,
		[KVP_TIER_E_BAD_FD] = KVP_ERR_INVALID_ARGUMENT,
		[KVP_TIER_E_SIZE] = KVP_ERR_INVALID_ARGUMENT,
		[KVP_TIER_E_SEALS] = KVP_ERR_INVALID_ARGUMENT,
	};

	if ((unsigned)tf->code >= KVP_TIER_E_MAX || tf->code == KVP_TIER_OK)
		return KVP_ERR_INTERNAL;
	return codes[tf->code];
}

static int create_tier(struct kvpd_pool *p, int tier, enum kvp_backend_kind kind,
		       const struct kvp_tier_spec *s, struct kvp_fail *f)
{
	const struct kvp_tier_ops *ops = kvp_tier_ops_of(kind);
	struct kvp_tier_fail tf = { 0 };

	if (!ops)
		return kvp_fail(f, KVP_ERR_INTERNAL, "%s: no backend %d", s->name, (int)kind);
	if (p->adopt_fd[tier] >= 0) {
		struct kvp_tier_spec as = *s;

		as.bytes = p->adopt_bytes[tier];
		if (ops->adopt(&p->mem[tier], p->adopt_fd[tier], &as, &tf) < 0)
			return kvp_fail(f, tier_code(&tf), "%s", tf.msg);
		p->adopted[tier] = true;
		return 0;
	}
	if (ops->create(&p->mem[tier], s, p->note, sizeof(p->note), &tf) < 0)
		return kvp_fail(f, tier_code(&tf), "%s", tf.msg);
	return 0;
}

static int create_tiers(struct kvpd_pool *p, struct kvp_fail *f)
{
	const struct kvp_pool_conf *c = &p->conf;
	int node = c->numa_node;
	char name[96];
	struct kvp_tier_spec s = { .name = name };
	int r = 0;

	for (int t = 0; t < KVP_TIER_ID_MAX; t++)
		kvp_tier_mem_init(&p->mem[t]);
	if (c->device != KVP_DEVICE_NONE && c->device_pages) {
		snprintf(name, sizeof(name), "%s:device", c->name);
		s.bytes = c->device_pages * p->page_bytes;
		s.numa_node = node < 0 ? 0 : node;
		s.cuda_device = c->cuda_device;
		r = create_tier(p, KVP_TIER_ID_DEVICE,
				c->device == KVP_DEVICE_CUDA ? KVP_BACKEND_KIND_CUDA
							     : KVP_BACKEND_KIND_SIM,
				&s, f);
		if (r < 0)
			return r;
		if (node < 0 && p->mem[KVP_TIER_ID_DEVICE].numa_node >= 0)
			node = p->mem[KVP_TIER_ID_DEVICE].numa_node;
	}
	if (c->host_pages) {
		snprintf(name, sizeof(name), "%s:host", c->name);
		s.bytes = c->host_pages * p->page_bytes;
		s.numa_node = node < 0 ? 0 : node;
		s.cuda_device = -1;
		s.hugepages = (enum kvp_tristate_opt)c->hugepages;
		s.mlock = (enum kvp_tristate_opt)c->mlock;
		r = create_tier(p, KVP_TIER_ID_HOST, KVP_BACKEND_KIND_MEMFD, &s, f);
		if (r < 0)
			return r;
	}
	return 0;
}

/* Transfers between the two tiers, when the pool has both. */
static int open_copies(struct kvpd_pool *p, struct kvp_fail *f)
{
	struct kvp_tier_mem *dev = &p->mem[KVP_TIER_ID_DEVICE];
	struct kvp_tier_fail tf = { 0 };

	if (!p->pages[KVP_TIER_ID_DEVICE] || !p->pages[KVP_TIER_ID_HOST])
		return 0;
	if (!dev->ops->copy_open)
		return kvp_fail(f, KVP_ERR_INTERNAL, "pool %s: the %s backend cannot copy",
				p->conf.name, dev->ops->name);
	if (dev->ops->copy_open(dev, &p->mem[KVP_TIER_ID_HOST], &p->geom, &p->copy, &tf) < 0)
		return kvp_fail(f, tier_code(&tf), "pool %s: %s", p->conf.name, tf.msg);
	return 0;
}

struct kvpd_pool *kvp_pool_create(const struct kvp_pool_conf *pc, uint32_t id, struct kvp_fail *f)
{
	const int none[KVP_TIER_ID_MAX] = { -1, -1 };
	const uint64_t zero[KVP_TIER_ID_MAX] = { 0, 0 };

	return kvp_pool_adopt(pc, id, none, zero, f);
}

struct kvpd_pool *kvp_pool_adopt(const struct kvp_pool_conf *pc, uint32_t id,
				 const int fds[KVP_TIER_ID_MAX],
				 const uint64_t bytes[KVP_TIER_ID_MAX], struct kvp_fail *f)
{
	struct kvpd_pool *p = calloc(1, sizeof(*p));
	struct kvp_index_conf xc = { 0 };
	uint64_t npages[KVP_TIER_ID_MAX];
	int r;

	if (!p) {
		for (int t = 0; t < KVP_TIER_ID_MAX; t++)
			if (fds[t] >= 0)
				close(fds[t]);
		kvp_fail(f, KVP_ERR_INTERNAL, "out of memory");
		return NULL;
	}
	for (int t = 0; t < KVP_TIER_ID_MAX; t++) {
		p->adopt_fd[t] = fds[t];
		p->adopt_bytes[t] = bytes[t];
	}
	p->id = id;
	p->conf = *pc;
	npages[KVP_TIER_ID_DEVICE] = pc->device == KVP_DEVICE_NONE ? 0 : pc->device_pages;
	npages[KVP_TIER_ID_HOST] = pc->host_pages;
	p->geom.layers = pc->layers;
	p->geom.page_tokens = pc->page_tokens;
	p->geom.row_bytes = (uint64_t)pc->kv_heads * pc->head_dim * kvp_dtype_size(pc->dtype);
	p->geom.dev_slots =
		(npages[KVP_TIER_ID_DEVICE] ? npages[KVP_TIER_ID_DEVICE] : 1) * pc->page_tokens;
	p->geom.host_pages = npages[KVP_TIER_ID_HOST];
	p->page_bytes = kvp_conf_page_bytes(pc);
	if (npages[0] + npages[1] == 0 || kvp_copy_geom_check(&p->geom) < 0) {
		kvp_fail(f, KVP_ERR_INVALID_ARGUMENT, "pool %s: bad geometry or no tier", pc->name);
		for (int t = 0; t < KVP_TIER_ID_MAX; t++)
			if (fds[t] >= 0)
				close(fds[t]);
		goto fail;
	}
	r = create_tiers(p, f);
	for (int t = 0; t < KVP_TIER_ID_MAX; t++) /* every fd given is the pool's to close */
		if (fds[t] >= 0 && !p->adopted[t])
			close(fds[t]);
	if (r < 0)
		goto fail;
	for (int t = 0; t < KVP_TIER_ID_MAX; t++) {
		if (!npages[t])
			continue;
		p->pages[t] = kvp_pages_new((uint32_t)npages[t]);
		p->lease_of[t] = calloc(npages[t], sizeof(uint64_t));
		p->lease_idx[t] = calloc(npages[t], sizeof(uint32_t));
		if (!p->pages[t] || !p->lease_of[t] || !p->lease_idx[t]) {
			kvp_fail(f, KVP_ERR_INTERNAL, "pool %s: out of memory", pc->name);
			goto fail;
		}
	}
	if (open_copies(p, f) < 0)
		goto fail;
	xc.page_tokens = pc->page_tokens;
	xc.policy = pc->eviction == KVP_EVICT_LFU ? KVP_EVICT_POLICY_LFU : KVP_EVICT_POLICY_LRU;
	xc.dev = p->pages[KVP_TIER_ID_DEVICE];
	xc.host = p->pages[KVP_TIER_ID_HOST];
	xc.copy = pool_copy;
	xc.copy_ctx = p;
	xc.copy_start = flight_start;
	p->ix = kvp_index_new(&xc);
	if (!p->ix) {
		kvp_fail(f, KVP_ERR_INTERNAL, "pool %s: page index: out of memory", pc->name);
		goto fail;
	}
	return p;
fail:
	kvp_pool_destroy(p);
	return NULL;
}

void kvp_pool_destroy(struct kvpd_pool *p)
{
	if (!p)
		return;
	if (p->flights) { /* the last one to land frees the pool (its tiers stay mapped) */
		p->dying = true;
		return;
	}
	pool_free(p);
}

static void pool_free(struct kvpd_pool *p)
{
	kvp_snap_free(p->snap);
	kvp_index_free(p->ix);
	if (p->copy)
		p->mem[KVP_TIER_ID_DEVICE].ops->copy_close(p->copy);
	for (int t = 0; t < KVP_TIER_ID_MAX; t++) {
		kvp_pages_free(p->pages[t]);
		free(p->lease_of[t]);
		free(p->lease_idx[t]);
		kvp_tier_mem_destroy(&p->mem[t]);
	}
	free(p);
}

void kvp_pool_counts(const struct kvpd_pool *p, int tier, struct kvp_tier_counts *out)
{
	struct kvp_index_stats ks;

	memset(out, 0, sizeof(*out));
	if (!kvp_pool_has_tier(p, tier))
		return;
	kvp_index_stats(p->ix, &ks);
	out->total = kvp_pages_total(p->pages[tier]);
	out->free = kvp_pages_count(p->pages[tier], KVP_PAGE_FREE);
	out->leased = kvp_pages_count(p->pages[tier], KVP_PAGE_LEASED);
	out->cached = kvp_pages_count(p->pages[tier], KVP_PAGE_CACHED);
	out->moving = kvp_pages_count(p->pages[tier], KVP_PAGE_MOVING);
	out->evictable = ks.evictable_pages[tier];
	out->protected_ = ks.protected_pages[tier];
}

int kvp_pool_check(const struct kvpd_pool *p)
{
	struct kvp_index_stats ks;

	for (int t = 0; t < KVP_TIER_ID_MAX; t++) {
		struct kvp_tier_counts c;
		uint64_t owned = 0;

		if (!p->pages[t])
			continue;
		if (kvp_pages_check(p->pages[t]) < 0)
			return -EFAULT;
		kvp_pool_counts(p, t, &c);
		if (c.free + c.leased + c.cached + c.moving != c.total)
			return -EFAULT;
		for (uint32_t i = 0; i < c.total; i++) {
			bool leased = kvp_pages_state(p->pages[t], i) == KVP_PAGE_LEASED;

			if (leased != (p->lease_of[t][i] != 0))
				return -EFAULT;
			owned += leased;
		}
		if (owned != c.leased)
			return -EFAULT;
	}
	kvp_index_stats(p->ix, &ks);
	if (kvp_index_check(p->ix) < 0)
		return -EFAULT;
	for (int t = 0; t < KVP_TIER_ID_MAX; t++) /* every CACHED page is the index's */
		if (p->pages[t] &&
		    kvp_pages_count(p->pages[t], KVP_PAGE_CACHED) != ks.cached_pages[t])
			return -EFAULT;
	/* every MOVING page belongs to one of the index's flights */
	if (p->pages[KVP_TIER_ID_HOST] &&
	    kvp_pages_count(p->pages[KVP_TIER_ID_HOST], KVP_PAGE_MOVING) != ks.moving_pages)
		return -EFAULT;
	return 0;
}

int kvp_lease_check(const struct kvp_lease *l)
{
	const struct kvpd_pool *p = l->pool;
	uint32_t total;

	if (l->tier < 0 || l->tier >= KVP_TIER_ID_MAX || !p->pages[l->tier] || l->n > l->cap)
		return -EFAULT;
	total = kvp_pages_total(p->pages[l->tier]);
	for (uint32_t i = 0; i < l->n; i++) {
		uint32_t pg = l->pages[i];

		if (pg >= total || kvp_pages_state(p->pages[l->tier], pg) != KVP_PAGE_LEASED ||
		    p->lease_of[l->tier][pg] != l->owner || p->lease_idx[l->tier][pg] != i)
			return -EFAULT;
	}
	return 0;
}

void kvp_pool_capacity_detail(const struct kvpd_pool *p, int tier, uint64_t npages,
			      struct kvp_fail *f)
{
	struct kvp_tier_counts c;
	uint64_t pt = p->conf.page_tokens;

	if (!f)
		return;
	kvp_pool_counts(p, tier, &c);
	f->detail = KVP_FAIL_CAPACITY;
	f->cap.tier = tier;
	f->cap.requested = npages * pt;
	f->cap.free = c.free * pt;
	f->cap.evictable = c.evictable * pt;
	f->cap.protected_ = c.protected_ * pt;
	f->cap.leased = c.leased * pt;
	f->cap.total = c.total * pt;
	f->cap.reserved = p->reserved[tier] * pt;
}

static int capacity_fail(struct kvpd_pool *p, int tier, uint32_t npages, struct kvp_fail *f)
{
	struct kvp_fail local = { 0 };

	if (!f)
		f = &local;
	kvp_pool_capacity_detail(p, tier, npages, f);
	if (!kvp_pool_fits_later(p, tier, npages)) /* else the caller waits (not a failure) */
		p->st.alloc_failures++;
	return kvp_fail(f, KVP_ERR_OUT_OF_CAPACITY,
			"pool %s %s tier: asked for %lu tokens, %lu free, %lu evictable, "
			"%lu leased, %lu protected by locks (of %lu): free leases, release "
			"locks, or give the pool more %s capacity",
			p->conf.name, kvp_names_tier(tier), (unsigned long)f->cap.requested,
			(unsigned long)f->cap.free, (unsigned long)f->cap.evictable,
			(unsigned long)f->cap.leased, (unsigned long)f->cap.protected_,
			(unsigned long)f->cap.total, kvp_names_tier(tier));
}

/* npages pages of tier into out: free pages first, then exactly the shortfall evicted. */
static int take_pages(struct kvpd_pool *p, int tier, uint32_t npages, uint32_t *out,
		      struct kvp_fail *f)
{
	struct kvp_pages *pg = p->pages[tier];
	uint32_t nfree = kvp_pages_count(pg, KVP_PAGE_FREE);

	if (npages > nfree && !(p->ev.short_ & (1u << tier))) {
		/* the notices it causes carry the figures from before anything is taken */
		p->ev.short_ |= (uint8_t)(1u << tier);
		kvp_pool_counts(p, tier, &p->ev.before[tier]);
		p->ev.before_reserved[tier] = p->reserved[tier];
	}
	if (npages > nfree && p->reclaim) {
		/* Unused pages of sessions' reserves go back before any cached prefix does. */
		p->reclaim(p->reclaim_ctx, p, tier, npages - nfree);
		nfree = kvp_pages_count(pg, KVP_PAGE_FREE);
	}
	if (npages > nfree) {
		struct kvp_tier_counts c;

		kvp_pool_counts(p, tier, &c);
		if (npages - nfree > c.evictable)
			return capacity_fail(p, tier, npages, f);
		pool_evict(p, tier, npages - nfree, true); /* demotions may land later */
		if (kvp_pages_count(pg, KVP_PAGE_FREE) < npages)
			return capacity_fail(p, tier, npages, f);
	}
	if (kvp_pages_alloc(pg, npages, out) < 0)
		return capacity_fail(p, tier, npages, f);
	return 0;
}

static void lease_adopt(struct kvp_lease *l, uint32_t from)
{
	for (uint32_t i = from; i < l->n; i++) {
		l->pool->lease_of[l->tier][l->pages[i]] = l->owner;
		l->pool->lease_idx[l->tier][l->pages[i]] = i;
	}
}

static int lease_grow(struct kvp_lease *l, uint32_t more)
{
	uint32_t cap = l->cap ? l->cap : 4;
	uint32_t *np;

	if ((uint64_t)l->n + more > UINT32_MAX / 2)
		return -ENOMEM;
	while (cap < l->n + more)
		cap *= 2;
	if (cap == l->cap)
		return 0;
	np = KVP_FAULT_OR(KVP_FAULT_LEASE, realloc(l->pages, cap * sizeof(*np)));
	if (!np)
		return -ENOMEM;
	l->pages = np;
	l->cap = cap;
	return 0;
}

static int check_size(struct kvpd_pool *p, int tier, uint32_t npages, struct kvp_fail *f)
{
	if (!kvp_pool_has_tier(p, tier))
		return kvp_fail(f, KVP_ERR_INVALID_ARGUMENT, "pool %s has no %s tier", p->conf.name,
				tier < 0 || tier >= KVP_TIER_ID_MAX ? "such"
								    : kvp_names_tier(tier));
	if (npages == 0)
		return kvp_fail(f, KVP_ERR_INVALID_ARGUMENT, "zero pages asked");
	if (npages > kvp_pages_total(p->pages[tier])) {
		capacity_fail(p, tier, npages, f);
		snprintf(f->msg, sizeof(f->msg),
			 "pool %s %s tier: asked for %lu tokens but the tier holds %lu in all",
			 p->conf.name, kvp_names_tier(tier),
			 (unsigned long)npages * p->conf.page_tokens,
			 (unsigned long)kvp_pages_total(p->pages[tier]) * p->conf.page_tokens);
		return -KVP_ERR_OUT_OF_CAPACITY;
	}
	return 0;
}

/* A lease of id with room for npages pages, none taken yet. NULL with f filled (INTERNAL). */
static struct kvp_lease *lease_new(struct kvpd_pool *p, int tier, uint64_t id, uint32_t npages,
				   struct kvp_fail *f)
{
	struct kvp_lease *l = KVP_FAULT_OR(KVP_FAULT_LEASE, calloc(1, sizeof(*l)));

	if (!l || lease_grow(l, npages) < 0) {
		free(l);
		kvp_fail(f, KVP_ERR_INTERNAL, "out of memory");
		return NULL;
	}
	l->id = id;
	l->pool = p;
	l->tier = tier;
	return l;
}

/* l's npages pages, taken: they are its, booked as an allocation. */
static struct kvp_lease *lease_taken(struct kvp_lease *l, uint32_t npages)
{
	struct kvpd_pool *p = l->pool;

	l->owner = ++p->next_owner;
	l->n = npages;
	lease_adopt(l, 0);
	p->st.allocs++;
	p->st.alloc_pages += npages;
	return l;
}

struct kvp_lease *kvp_lease_create(struct kvpd_pool *p, int tier, uint64_t id, uint32_t npages,
				   struct kvp_fail *f)
{
	struct kvp_lease *l;

	if (check_size(p, tier, npages, f) < 0 || !(l = lease_new(p, tier, id, npages, f)))
		return NULL;
	if (take_pages(p, tier, npages, l->pages, f) < 0) {
		free(l->pages);
		free(l);
		return NULL;
	}
	return lease_taken(l, npages);
}

/* The lowest run of n FREE pages of tier starting at a multiple of align: its first page, or
 * UINT32_MAX when none. O(total). */
static uint32_t find_run(struct kvpd_pool *p, int tier, uint32_t n, uint32_t align)
{
	uint32_t total = kvp_pages_total(p->pages[tier]), i, found = UINT32_MAX;
	uint8_t *st = malloc(total);
	uint64_t start;

	if (!st)
		return UINT32_MAX;
	kvp_pages_states(p->pages[tier], st);
	for (start = 0; (uint64_t)start + n <= total; start += align) {
		for (i = 0; i < n && st[start + i] == KVP_PAGE_FREE; i++)
			;
		if (i == n) {
			found = (uint32_t)start;
			break;
		}
		/* the next start past the busy page start + i */
		start = (start + i) / align * align;
	}
	free(st);
	return found;
}

struct kvp_lease *kvp_lease_create_run(struct kvpd_pool *p, int tier, uint64_t id, uint32_t npages,
				       uint32_t align, struct kvp_fail *f)
{
	struct kvp_lease *l;
	uint32_t first;

	if (check_size(p, tier, npages, f) < 0)
		return NULL;
	if (!align)
		return kvp_fail(f, KVP_ERR_INVALID_ARGUMENT, "a run aligned to 0 pages"), NULL;
	first = find_run(p, tier, npages, align);
	if (first == UINT32_MAX) {
		capacity_fail(p, tier, npages, f);
		snprintf(f->msg, sizeof(f->msg),
			 "pool %s %s tier: no run of %u free consecutive pages starting at a "
			 "multiple of %u (%lu pages free of %lu; cached pages are not evicted for "
			 "a run): free leases or flush the cache",
			 p->conf.name, kvp_names_tier(tier), npages, align,
			 (unsigned long)kvp_pages_count(p->pages[tier], KVP_PAGE_FREE),
			 (unsigned long)kvp_pages_total(p->pages[tier]));
		return NULL;
	}
	if (!(l = lease_new(p, tier, id, npages, f)))
		return NULL;
	for (uint32_t i = 0; i < npages; i++)
		l->pages[i] = first + i;
	if (kvp_pages_claim(p->pages[tier], l->pages, npages) < 0) {
		free(l->pages);
		free(l);
		kvp_fail(f, KVP_ERR_INTERNAL, "the free run at page %u could not be claimed",
			 first);
		return NULL;
	}
	return lease_taken(l, npages);
}

struct kvp_lease *kvp_lease_restore(struct kvpd_pool *p, int tier, uint64_t id,
				    const uint32_t *pages, uint32_t n, struct kvp_fail *f)
{
	struct kvp_lease *l;

	if (!kvp_pool_has_tier(p, tier) || !id)
		return kvp_fail(f, KVP_ERR_INVALID_ARGUMENT, "restore: no such tier"), NULL;
	for (uint32_t i = 0; i < n; i++)
		if (pages[i] >= kvp_pages_total(p->pages[tier]) ||
		    kvp_pages_state(p->pages[tier], pages[i]) != KVP_PAGE_LEASED ||
		    p->lease_of[tier][pages[i]])
			return kvp_fail(f, KVP_ERR_INVALID_ARGUMENT,
					"restore: page %u is not a free-standing leased page",
					pages[i]),
			       NULL;
	l = calloc(1, sizeof(*l));
	if (!l || (n && lease_grow(l, n) < 0)) {
		free(l);
		return kvp_fail(f, KVP_ERR_INTERNAL, "out of memory"), NULL;
	}
	l->id = id;
	l->owner = ++p->next_owner;
	l->pool = p;
	l->tier = tier;
	if (n)
		memcpy(l->pages, pages, n * sizeof(*pages));
	l->n = n;
	lease_adopt(l, 0);
	return l;
}

int kvp_lease_grow(struct kvp_lease *l, uint32_t npages, struct kvp_fail *f)
{
	int r = check_size(l->pool, l->tier, npages, f);

	if (r < 0)
		return r;
	if (lease_grow(l, npages) < 0)
		return kvp_fail(f, KVP_ERR_INTERNAL, "out of memory");
	r = take_pages(l->pool, l->tier, npages, l->pages + l->n, f);
	if (r < 0)
		return r;
	l->n += npages;
	lease_adopt(l, l->n - npages);
	l->pool->st.allocs++;
	l->pool->st.alloc_pages += npages;
	return 0;
}

/* Checks that pages[0..n) are distinct pages of this lease. Marks by clearing lease_of
 * temporarily; restores before returning. */
static int lease_owns_all(struct kvp_lease *l, const uint32_t *pages, uint32_t n)
{
	uint64_t *owner = l->pool->lease_of[l->tier];
	uint32_t total = kvp_pages_total(l->pool->pages[l->tier]);
	uint32_t i;

	for (i = 0; i < n; i++) {
		if (pages[i] >= total || owner[pages[i]] != l->owner)
			break;
		owner[pages[i]] = 0;
	}
	for (uint32_t j = 0; j < i; j++)
		owner[pages[j]] = l->owner;
	return i == n ? 0 : -1;
}

/* Takes page (owned by l) out of the lease's array: swap with the last. */
static void lease_drop(struct kvp_lease *l, uint32_t page)
{
	struct kvpd_pool *p = l->pool;
	uint32_t i = p->lease_idx[l->tier][page];
	uint32_t last = l->pages[--l->n];

	l->pages[i] = last;
	p->lease_idx[l->tier][last] = i;
	p->lease_of[l->tier][page] = 0;
	p->lease_idx[l->tier][page] = 0;
}

int kvp_lease_return(struct kvp_lease *l, const uint32_t *pages, uint32_t n, struct kvp_fail *f)
{
	if (lease_owns_all(l, pages, n) < 0)
		return kvp_fail(f, KVP_ERR_NOT_FOUND,
				"free: a page listed is not in lease %lu (or listed twice)",
				(unsigned long)l->id);
	for (uint32_t i = 0; i < n; i++)
		lease_drop(l, pages[i]);
	kvp_pages_release(l->pool->pages[l->tier], pages, n);
	l->pool->st.frees++;
	l->pool->st.free_pages += n;
	return 0;
}

void kvp_lease_destroy(struct kvp_lease *l)
{
	if (!l)
		return;
	if (l->n) {
		for (uint32_t i = 0; i < l->n; i++)
			l->pool->lease_of[l->tier][l->pages[i]] = 0;
		kvp_pages_release(l->pool->pages[l->tier], l->pages, l->n);
		l->pool->st.frees++;
		l->pool->st.free_pages += l->n;
	}
	free(l->pages);
	free(l);
}

struct kvp_lease *kvp_lease_new_empty(struct kvpd_pool *p, int tier, uint64_t id)
{
	struct kvp_lease *l;

	if (!kvp_pool_has_tier(p, tier))
		return NULL;
	l = KVP_FAULT_OR(KVP_FAULT_LEASE, calloc(1, sizeof(*l)));
	if (!l)
		return NULL;
	l->id = id;
	l->owner = ++p->next_owner;
	l->pool = p;
	l->tier = tier;
	return l;
}

int kvp_lease_move(struct kvp_lease *from, struct kvp_lease *to, const uint32_t *pages, uint32_t n)
{
	if (from->pool != to->pool || from->tier != to->tier || lease_owns_all(from, pages, n) < 0)
		return -EINVAL;
	if (lease_grow(to, n) < 0)
		return -ENOMEM;
	for (uint32_t i = 0; i < n; i++) {
		lease_drop(from, pages[i]);
		to->pages[to->n++] = pages[i];
	}
	lease_adopt(to, to->n - n);
	return 0;
}

int kvp_lease_insert(struct kvp_lease *l, uint64_t ns, const uint32_t *tokens, uint32_t ntokens,
		     uint32_t cached, const uint32_t *pages, uint32_t npages, uint64_t *new_tokens,
		     uint64_t *dup_tokens, struct kvp_fail *f)
{
	struct kvpd_pool *p = l->pool;
	uint32_t pt = p->conf.page_tokens;
	uint32_t whole = ntokens / pt, own;
	struct kvp_index_insert_result res = { 0 };
	uint32_t *all, *dup;
	int r;

	if (cached > whole)
		return kvp_fail(f, KVP_ERR_INVALID_ARGUMENT,
				"insert: cached_pages %u exceeds the %u whole pages of %u tokens",
				cached, whole, ntokens);
	own = whole - cached;
	if (npages < own || npages > own + 1 || (npages == own + 1 && ntokens % pt == 0))
		return kvp_fail(
			f, KVP_ERR_INVALID_ARGUMENT,
			"insert: tokens %u..%u need %u lease pages (page_tokens %u), got %u",
			cached * pt, ntokens, (ntokens - cached * pt + pt - 1) / pt, pt, npages);
	if (lease_owns_all(l, pages, npages) < 0)
		return kvp_fail(f, KVP_ERR_NOT_FOUND,
				"insert: a page listed is not in lease %lu (or listed twice)",
				(unsigned long)l->id);
	*new_tokens = *dup_tokens = 0;
	if (own == 0)
		return 0;
	all = KVP_FAULT_OR(KVP_FAULT_PREFIX, malloc(sizeof(*all) * whole));
	dup = malloc(sizeof(*dup) * whole);
	if (!all || !dup) {
		free(all);
		free(dup);
		return kvp_fail(f, KVP_ERR_INTERNAL, "out of memory");
	}
	/* The matched prefix is named by position only: the index must still hold it. */
	for (uint32_t i = 0; i < whole; i++)
		all[i] = i < cached ? KVP_PAGE_NONE : pages[i - cached];
	r = kvp_index_insert_tokens(p->ix, ns, tokens, whole, l->tier, all, &res, dup);
	if (r < 0) {
		free(all);
		free(dup);
		return kvp_fail(f, r == -ENOMEM ? KVP_ERR_INTERNAL : KVP_ERR_INVALID_ARGUMENT,
				"insert into the page index failed (%d)", r);
	}
	/* Pages the index processed leave the lease: cached now, or duplicates that are freed.
	 * Past a matched page that was evicted meanwhile, pages stay in the lease. */
	for (uint32_t i = cached; i < res.done_keys; i++)
		lease_drop(l, all[i]);
	for (uint32_t i = 0; i < res.dup_pages; i++)
		dup[i] = all[dup[i]];
	if (res.dup_pages)
		kvp_pages_release(p->pages[l->tier], dup, res.dup_pages);
	free(all);
	free(dup);
	p->st.inserted_tokens += (uint64_t)res.new_pages * pt;
	*new_tokens = (uint64_t)res.new_pages * pt;
	*dup_tokens = (uint64_t)res.dup_pages * pt;
	return 0;
}

void kvp_pool_log_summary(struct kvpd_pool *p, uint64_t interval_ms)
{
	struct kvp_index_stats now;
	uint64_t pt = p->conf.page_tokens;
	uint64_t ev_d, ev_h, dem, pro;

	kvp_index_stats(p->ix, &now);
	ev_d = now.evicted_pages[KVP_TIER_ID_DEVICE] - p->logged.evicted_pages[KVP_TIER_ID_DEVICE];
	ev_h = now.evicted_pages[KVP_TIER_ID_HOST] - p->logged.evicted_pages[KVP_TIER_ID_HOST];
	dem = now.demoted_pages - p->logged.demoted_pages;
	pro = now.promoted_pages - p->logged.promoted_pages;
	if (ev_d || ev_h || dem || pro)
		log_info("pool %s, last %.0f s: %lu device tokens evicted (%lu demoted to host), "
			 "%lu host tokens evicted, %lu promoted; %lu cached on device, %lu on host",
			 p->conf.name, (double)interval_ms / 1e3, (unsigned long)(ev_d * pt),
			 (unsigned long)(dem * pt), (unsigned long)(ev_h * pt),
			 (unsigned long)(pro * pt),
			 (unsigned long)(now.cached_pages[KVP_TIER_ID_DEVICE] * pt),
			 (unsigned long)(now.cached_pages[KVP_TIER_ID_HOST] * pt));
	p->logged = now;
}

/* Evicts as kvp_pool_evict does; with later set, the index's demotions may be left in flight
 * (counted toward pages, not in the result). */
static uint32_t pool_evict(struct kvpd_pool *p, int tier, uint32_t pages, bool later)
{
	if (!kvp_pool_has_tier(p, tier) || !pages)
		return 0;
	return later ? kvp_index_evict_later(p->ix, (enum kvp_tier_id)tier, pages)
		     : kvp_index_evict(p->ix, (enum kvp_tier_id)tier, pages);
}

uint32_t kvp_pool_evict(struct kvpd_pool *p, int tier, uint32_t pages)
{
	return pool_evict(p, tier, pages, false);
}

int kvp_lease_insert_keys(struct kvp_lease *l, uint64_t ns, const struct kvp_key *keys, uint32_t n,
			  uint32_t cached, const uint32_t *pages, uint32_t npages,
			  uint32_t *new_pages, uint32_t *dup_pages, uint32_t *done_keys,
			  struct kvp_fail *f)
{
	struct kvpd_pool *p = l->pool;
	struct kvp_index_insert_result res = { 0 };
	uint32_t *dup, *own;
	int r;

	if (!n || cached > n || npages != n - cached)
		return kvp_fail(f, KVP_ERR_INVALID_ARGUMENT,
				"insert keys: %u keys, %u cached, need %u lease pages, got %u", n,
				cached, n >= cached ? n - cached : 0, npages);
	if (lease_owns_all(l, pages, npages) < 0)
		return kvp_fail(f, KVP_ERR_NOT_FOUND,
				"insert keys: a page listed is not in lease %lu (or listed twice)",
				(unsigned long)l->id);
	*new_pages = *dup_pages = 0;
	/* pages may be the lease's own array, which lease_drop reorders: work on a copy */
	dup = KVP_FAULT_OR(KVP_FAULT_PREFIX, malloc(sizeof(*dup) * (2 * (size_t)npages + 1)));
	if (!dup)
		return kvp_fail(f, KVP_ERR_INTERNAL, "out of memory");
	own = dup + npages;
	memcpy(own, pages, sizeof(*own) * npages);
	pages = own;
	r = kvp_index_insert(p->ix, ns, keys, n, cached, l->tier, pages, &res, dup);
	if (r < 0) {
		free(dup);
		return kvp_fail(f, r == -ENOMEM ? KVP_ERR_INTERNAL : KVP_ERR_INVALID_ARGUMENT,
				"insert into the page index failed (%d)", r);
	}
	for (uint32_t i = cached; i < res.done_keys; i++)
		lease_drop(l, pages[i - cached]);
	for (uint32_t i = 0; i < res.dup_pages; i++)
		dup[i] = pages[dup[i]];
	if (res.dup_pages)
		kvp_pages_release(p->pages[l->tier], dup, res.dup_pages);
	free(dup);
	p->st.inserted_tokens += (uint64_t)res.new_pages * p->conf.page_tokens;
	*new_pages = res.new_pages;
	*dup_pages = res.dup_pages;
	*done_keys = res.done_keys;
	return 0;
}
