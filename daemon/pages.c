/* pages.c - page allocator of one tier.
 *
 * A stack of free page ids gives O(1) alloc and free per page; a state byte per
 * page catches double frees and foreign ids before anything changes. */
#include "pages.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

typedef uint32_t v4u32 __attribute__((vector_size(16)));

/* Two ids from one 64-bit load (half the loads of the per-page loops): ids[k] and ids[k + 1]. */
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define ID_LO(w) ((uint32_t)((w) >> 32))
#define ID_HI(w) ((uint32_t)(w))
#else
#define ID_LO(w) ((uint32_t)(w))
#define ID_HI(w) ((uint32_t)((w) >> 32))
#endif

struct kvp_pages {
	uint32_t total;
	uint32_t nfree;
	uint32_t count[KVP_PAGE_STATE_MAX];
	uint32_t *stack;	      /* free ids, stack[0..nfree) */
	uint8_t *state;		      /* span bytes: those past total stay FREE (release_leased) */
	uint32_t span;		      /* total rounded up to a power of two (at most 2^32 - 1) */
	size_t state_bytes;	      /* mapped */
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

/* The state bytes, zeroed (FREE). Past 256 KiB they are asked for in huge pages: a batch
 * touches one byte of a random page each, and with 4 KiB pages most of those would miss the
 * TLB. */
static uint8_t *state_map(size_t want, size_t *bytes)
{
	const size_t huge = (size_t)2 << 20;
	size_t len = want < ((size_t)256 << 10) ? want : (want + huge - 1) / huge * huge;
	uint8_t *m = mmap(NULL, len + (len >= huge ? huge : 0), PROT_READ | PROT_WRITE,
			  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	uintptr_t at;

	if (m == MAP_FAILED)
		return NULL;
	if (len < huge) {
		*bytes = len;
		return m;
	}
	/* aligned to a huge page, the slack unmapped */
	at = ((uintptr_t)m + huge - 1) & ~(uintptr_t)(huge - 1);
	if (at > (uintptr_t)m)
		munmap(m, at - (uintptr_t)m);
	munmap((uint8_t *)at + len, (uintptr_t)m + huge - at);
	(void)madvise((void *)at, len, MADV_HUGEPAGE); /* a hint: 4 KiB pages work too */
	*bytes = len;
	return (uint8_t *)at;
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
	p->span = total;
	while (p->span & (p->span - 1)) /* clear low bits until one is left, then double */
		p->span &= p->span - 1;
	if (p->span != total)
		p->span = p->span > UINT32_MAX / 2 ? UINT32_MAX : p->span * 2;
	p->state = state_map(p->span, &p->state_bytes);
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
	if (p->state)
		munmap(p->state, p->state_bytes);
	free(p);
}

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

/* state[ids[i]] = LEASED, eight at a time (one store a page: the loop's own bookkeeping would
 * cost as much). The stores are of a constant and independent of each other. */
static void set_leased(uint8_t *restrict state, const uint32_t *restrict ids, uint32_t n)
{
	uint32_t i = 0;

	/* ids two at a time from 64-bit loads: one load for two pages, stores independent */
	for (; i + 8 <= n; i += 8) {
		uint64_t a, b, c, d;

		memcpy(&a, ids + i, 8);
		memcpy(&b, ids + i + 2, 8);
		memcpy(&c, ids + i + 4, 8);
		memcpy(&d, ids + i + 6, 8);
		state[ID_LO(a)] = KVP_PAGE_LEASED;
		state[ID_HI(a)] = KVP_PAGE_LEASED;
		state[ID_LO(b)] = KVP_PAGE_LEASED;
		state[ID_HI(b)] = KVP_PAGE_LEASED;
		state[ID_LO(c)] = KVP_PAGE_LEASED;
		state[ID_HI(c)] = KVP_PAGE_LEASED;
		state[ID_LO(d)] = KVP_PAGE_LEASED;
		state[ID_HI(d)] = KVP_PAGE_LEASED;
	}
	for (; i < n; i++)
		state[ids[i]] = KVP_PAGE_LEASED;
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
	set_leased(state, top, n);
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

/* The OR of ids[0..n), sixteen at a time: below span it bounds every id. */
static uint32_t or_of(const uint32_t *ids, uint32_t n)
{
	v4u32 a = { 0 }, b = { 0 }, c = { 0 }, e = { 0 }, v;
	uint32_t i = 0, o;

	for (; i + 16 <= n; i += 16) {
		memcpy(&v, ids + i, sizeof(v));
		a |= v;
		memcpy(&v, ids + i + 4, sizeof(v));
		b |= v;
		memcpy(&v, ids + i + 8, sizeof(v));
		c |= v;
		memcpy(&v, ids + i + 12, sizeof(v));
		e |= v;
	}
	a |= b | c | e;
	o = a[0] | a[1] | a[2] | a[3];
	for (; i < n; i++)
		o |= ids[i];
	return o;
}

/* The common case: every page LEASED, each listed once. The ids' OR below `span` (the state
 * bytes, a power of two) bounds them all; the bytes from total to span are FREE forever, so an id
 * in that gap fails like a free page. Each page must read LEASED and is then written FREE (a
 * constant: the store waits on nothing), so a page listed twice reads FREE the second time. On
 * the first page that is not LEASED, the pages before it (all LEASED, now FREE) are put back.
 * Returns 0 with every page FREE, or -EINVAL with nothing changed. */
static int release_leased(uint8_t *restrict state, uint32_t span, const uint32_t *restrict ids,
			  uint32_t n)
{
	uint32_t i = 0;

	if (or_of(ids, n) >= span)
		return -EINVAL; /* some id is out of range (or the OR overshoots): the slow path */
#define FREE1(x, at)                                                                               \
	do {                                                                                       \
		if (__builtin_expect(state[x] != KVP_PAGE_LEASED, 0)) {                            \
			i = (at);                                                                  \
			goto undo;                                                                 \
		}                                                                                  \
		state[x] = KVP_PAGE_FREE;                                                          \
	} while (0)
#define FREE2(k)                                                                                   \
	do {                                                                                       \
		uint64_t w;                                                                        \
		memcpy(&w, ids + i + (k), 8);                                                      \
		FREE1(ID_LO(w), i + (k));                                                          \
		FREE1(ID_HI(w), i + (k) + 1);                                                      \
	} while (0)
	for (; i + 8 <= n; i += 8) {
		FREE2(0);
		FREE2(2);
		FREE2(4);
		FREE2(6);
	}
	for (; i < n; i++)
		FREE1(ids[i], i);
#undef FREE1
#undef FREE2
	return 0;
undo:
	while (i-- > 0)
		state[ids[i]] = KVP_PAGE_LEASED;
	return -EINVAL;
}

int kvp_pages_release(struct kvp_pages *p, const uint32_t *ids, uint32_t n)
{
	/* A page in another state, a duplicate or a bad id: the general path decides. */
	if (release_leased(p->state, p->span, ids, n) < 0)
		return release_any(p, ids, n);
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
