/* pages.c - page allocator of one tier.
 *
 * A stack of free page ids gives O(1) alloc and free per page; a state byte per
 * page catches double frees and foreign ids before anything changes. */
#include "pages.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct kvp_pages {
	uint32_t total;
	uint32_t nfree;
	uint32_t count[KVP_PAGE_STATE_MAX];
	uint32_t *stack; /* free ids, stack[0..nfree) */
	uint8_t *state;
	volatile uint64_t *guard_gen; /* kvp_pages_guard */
	bool *guard_armed;
};

static inline void guard_trip(struct kvp_pages *p)
{
	if (p->guard_armed && *p->guard_armed) {
		__atomic_store_n(p->guard_gen, *p->guard_gen + 1, __ATOMIC_SEQ_CST);
		*p->guard_armed = false;
	}
}

void kvp_pages_guard(struct kvp_pages *p, volatile uint64_t *gen, bool *armed)
{
	p->guard_gen = gen;
	p->guard_armed = gen ? armed : NULL;
}

int kvp_pages_claim(struct kvp_pages *p, const uint32_t *ids, uint32_t n)
{
	enum { MARK = 0x80 };
	uint32_t i, o = 0;

	for (i = 0; i < n; i++) {
		if (ids[i] >= p->total || p->state[ids[i]] != KVP_PAGE_FREE)
			break;
		p->state[ids[i]] |= MARK;
	}
	if (i < n) {
		while (i-- > 0)
			p->state[ids[i]] &= (uint8_t)~MARK;
		return -EINVAL;
	}
	for (i = 0; i < p->nfree; i++) /* the stack keeps its order without the claimed ids */
		if (!(p->state[p->stack[i]] & MARK))
			p->stack[o++] = p->stack[i];
	p->nfree = o;
	for (i = 0; i < n; i++)
		p->state[ids[i]] = KVP_PAGE_LEASED;
	p->count[KVP_PAGE_FREE] -= n;
	p->count[KVP_PAGE_LEASED] += n;
	return 0;
}

struct kvp_pages *kvp_pages_new(uint32_t total)
{
	struct kvp_pages *p;

	if (total == 0 || total == KVP_PAGE_NONE)
		return NULL;
	p = calloc(1, sizeof(*p));
	if (!p)
		return NULL;
	p->stack = malloc(sizeof(*p->stack) * total);
	p->state = calloc(total, 1);
	if (!p->stack || !p->state) {
		kvp_pages_free(p);
		return NULL;
	}
	p->total = total;
	/* Lowest ids on top of the stack: a fresh pool hands out 0, 1, 2... */
	for (uint32_t i = 0; i < total; i++)
		p->stack[i] = total - 1 - i;
	p->nfree = total;
	p->count[KVP_PAGE_FREE] = total;
	return p;
}

void kvp_pages_free(struct kvp_pages *p)
{
	if (!p)
		return;
	free(p->stack);
	free(p->state);
	free(p);
}

typedef uint32_t v4u32 __attribute__((vector_size(16)));

/* dst[i] = src[n - 1 - i] (the arrays do not overlap). */
static void reverse_copy(uint32_t *restrict dst, const uint32_t *restrict src, uint32_t n)
{
	uint32_t i = 0;

	for (; i + 4 <= n; i += 4) {
		v4u32 v;

		memcpy(&v, src + n - 4 - i, sizeof(v));
		v = __builtin_shufflevector(v, v, 3, 2, 1, 0); /* gcc 12+, clang */
		memcpy(dst + i, &v, sizeof(v));
	}
	for (; i < n; i++)
		dst[i] = src[n - 1 - i];
}

int kvp_pages_alloc(struct kvp_pages *p, uint32_t n, uint32_t *out)
{
	/* Locals for everything the loops touch: a byte store may alias any object, so fields
	 * read through p would be reloaded on every page. */
	uint8_t *state = p->state;
	const uint32_t *top;

	if (n == 0)
		return -EINVAL;
	if (n > p->nfree)
		return -ENOSPC;
	top = p->stack + p->nfree - n;
	/* the top of the stack first (a fresh pool hands out 0, 1, 2...): a reversed copy, four
	 * ids at a time, then the states */
	reverse_copy(out, top, n);
	for (uint32_t i = 0; i < n; i++)
		state[top[i]] = KVP_PAGE_LEASED;
	p->nfree -= n;
	p->count[KVP_PAGE_FREE] -= n;
	p->count[KVP_PAGE_LEASED] += n;
	return 0;
}

/* Any mix of LEASED, CACHED and MOVING pages, duplicates and bad ids refused. */
static int release_any(struct kvp_pages *p, const uint32_t *ids, uint32_t n)
{
	enum { MARK = 0x80 };
	uint8_t *state = p->state;
	const uint32_t total = p->total;
	uint32_t i, cached = 0, moving = 0;

	/* Validate everything first, marking each id so a duplicate in one call is caught, and
	 * count what each page was. */
	for (i = 0; i < n; i++) {
		uint32_t id = ids[i];
		uint8_t st;

		if (id >= total)
			break;
		st = state[id];
		if (st == KVP_PAGE_FREE || (st & MARK))
			break;
		state[id] = (uint8_t)(st | MARK);
		cached += st == KVP_PAGE_CACHED;
		moving += st == KVP_PAGE_MOVING;
	}
	if (i < n) {
		while (i-- > 0)
			state[ids[i]] &= (uint8_t)~MARK;
		return -EINVAL;
	}
	if (cached)
		guard_trip(p); /* a cached page leaves the cache: the snapshot is in doubt */
	for (i = 0; i < n; i++)
		state[ids[i]] = KVP_PAGE_FREE;
	memcpy(p->stack + p->nfree, ids, sizeof(uint32_t) * n);
	p->nfree += n;
	p->count[KVP_PAGE_LEASED] -= n - cached - moving;
	p->count[KVP_PAGE_CACHED] -= cached;
	p->count[KVP_PAGE_MOVING] -= moving;
	p->count[KVP_PAGE_FREE] += n;
	return 0;
}

int kvp_pages_release(struct kvp_pages *p, const uint32_t *ids, uint32_t n)
{
	uint8_t *state = p->state;
	const uint32_t total = p->total;
	uint32_t i;

	/* The common case in one pass: every page LEASED. A page in another state, a duplicate
	 * (FREE by its first mention) or a bad id stops it; every page before that was LEASED, so
	 * putting that back is exact, and the general path decides. */
	for (i = 0; i < n; i++) {
		uint32_t id = ids[i];

		if (id >= total || state[id] != KVP_PAGE_LEASED)
			break;
		state[id] = KVP_PAGE_FREE;
	}
	if (i < n) {
		while (i-- > 0)
			state[ids[i]] = KVP_PAGE_LEASED;
		return release_any(p, ids, n);
	}
	memcpy(p->stack + p->nfree, ids, sizeof(uint32_t) * n);
	p->nfree += n;
	p->count[KVP_PAGE_LEASED] -= n;
	p->count[KVP_PAGE_FREE] += n;
	return 0;
}

int kvp_pages_move(struct kvp_pages *p, uint32_t id, enum kvp_page_state from,
		   enum kvp_page_state to)
{
	if (id >= p->total || p->state[id] != from || from == KVP_PAGE_FREE ||
	    to == KVP_PAGE_FREE || to >= KVP_PAGE_STATE_MAX)
		return -EINVAL;
	if (from == KVP_PAGE_CACHED)
		guard_trip(p);
	p->state[id] = (uint8_t)to;
	p->count[from]--;
	p->count[to]++;
	return 0;
}

int kvp_pages_state(const struct kvp_pages *p, uint32_t id)
{
	if (id >= p->total)
		return -EINVAL;
	return p->state[id];
}

uint32_t kvp_pages_total(const struct kvp_pages *p)
{
	return p->total;
}

void kvp_pages_states(const struct kvp_pages *p, uint8_t *out)
{
	memcpy(out, p->state, p->total);
}

uint32_t kvp_pages_count(const struct kvp_pages *p, enum kvp_page_state s)
{
	return s < KVP_PAGE_STATE_MAX ? p->count[s] : 0;
}

int kvp_pages_check(const struct kvp_pages *p)
{
	uint32_t seen[KVP_PAGE_STATE_MAX] = { 0 };
	uint64_t sum = 0;

	for (uint32_t i = 0; i < p->total; i++)
		seen[p->state[i]]++;
	for (int s = 0; s < KVP_PAGE_STATE_MAX; s++) {
		if (seen[s] != p->count[s])
			return -EFAULT;
		sum += p->count[s];
	}
	if (sum != p->total || p->nfree != p->count[KVP_PAGE_FREE])
		return -EFAULT;
	for (uint32_t i = 0; i < p->nfree; i++)
		if (p->stack[i] >= p->total || p->state[p->stack[i]] != KVP_PAGE_FREE)
			return -EFAULT;
	return 0;
}
