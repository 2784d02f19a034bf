/* pages.c - page allocator of one tier.
 *
 * Free pages are the set bits of a bitmap, with summary levels above it (a bit set for every
 * word of the level below that is not zero; a bit whose word became zero is cleared by the next
 * search that meets it), so the lowest free page is a few loads away and a batch moves whole
 * words: alloc turns a byte of free bits into up to eight ids with one table load and one vector
 * store and clears each word it empties with one store; release gathers the ids of one word into
 * a mask (eight at a time) and sets them with one store, after checking the word (no page free
 * already, none listed twice) and the special bitmap (none cached or moving). Cached and moving
 * pages keep their state in a byte per page; free and leased pages read 0 there and the free
 * bitmap tells them apart. Pages are handed out lowest first: a fresh pool gives 0, 1, 2... */
#include "pages.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define LV_MAX 6 /* 64^6 bits > 2^32 pages; at least 2 */

struct kvp_pages {
	uint32_t total;
	uint32_t count[KVP_PAGE_STATE_MAX];
	uint32_t lo;		 /* no word of lv[0] below lo has a free bit */
	int nlv;		 /* levels, at least 2; lv[nlv - 1] is one word */
	bool avx2;		 /* the AVX2 loops (kvp_pages_simd) */
	uint32_t nwords[LV_MAX]; /* words of each level */
	uint64_t *lv[LV_MAX];	 /* lv[0]: a bit per page, 1 = free; lv[l + 1]: set for each word of
				  * lv[l] != 0 (and maybe for some that are 0 since) */
	uint64_t *special;  /* a bit per page: CACHED or MOVING; set past total (never leased) */
	uint64_t cap;	    /* bits of lv[0] and special: a power of two, at least 64 */
	uint8_t *state;	    /* a byte per page: CACHED or MOVING, else 0 */
	size_t state_bytes; /* mapped */
	volatile uint64_t *guard_gen; /* kvp_pages_guard */
	bool *guard_armed;
};

/* g_pos[b]: the positions of b's set bits, lowest first (then zeros); g_pos8[k][b]: the same
 * plus 8k, a byte each, for byte k of a word (the AVX2 loop widens them); g_cnt[b]: how many. */
static uint32_t g_pos[256][8] __attribute__((aligned(32)));
static uint8_t g_pos8[8][256][8] __attribute__((aligned(64)));
static uint8_t g_cnt[256];
static pthread_once_t g_tables_once = PTHREAD_ONCE_INIT;

typedef uint32_t v8u32 __attribute__((vector_size(32)));

static void tables_init(void)
{
	for (unsigned b = 0; b < 256; b++)
		for (unsigned j = 0; j < 8; j++)
			if (b & (1u << j)) {
				for (unsigned k = 0; k < 8; k++)
					g_pos8[k][b][g_cnt[b]] = (uint8_t)(8 * k + j);
				g_pos[b][g_cnt[b]++] = j;
			}
}

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

static inline bool is_free(const struct kvp_pages *p, uint32_t id)
{
	return p->lv[0][id >> 6] >> (id & 63) & 1;
}

/* up_set past its first level's bit. */
static void up_set_levels(struct kvp_pages *p, uint32_t w)
{
	for (int l = 1; l < p->nlv; l++, w >>= 6) {
		uint64_t *x = &p->lv[l][w >> 6], bit = 1ull << (w & 63);

		if (*x & bit) /* its word is not 0: the bits above are set */
			return;
		*x |= bit;
	}
}

/* Word w of lv[0] is not 0 (any more): set its summary bits as far up as they are clear. The
 * first is mostly set already, left from the word's last time (there is always a level 1). */
static inline void up_set(struct kvp_pages *p, uint32_t w)
{
	if (w < p->lo)
		p->lo = w;
	if (!(p->lv[1][w >> 6] >> (w & 63) & 1))
		up_set_levels(p, w);
}

/* The lowest word of lv[0] with a free bit; the caller knows that one exists. A summary bit
 * may be stale (its word became 0 and nobody looked since): the walk clears it and starts over. */
static inline uint32_t first_word(struct kvp_pages *p)
{
	uint32_t i = p->lo, end = p->nwords[0] - p->lo < 4 ? p->nwords[0] : p->lo + 4;

	/* a batch empties words in order: the next one up is likely the one */
	for (; i < end; i++)
		if (p->lv[0][i]) {
			p->lo = i;
			return i;
		}
again:
	i = 0;
	for (int l = p->nlv - 1; l >= 1; l--) {
		uint32_t j = i * 64 + (uint32_t)__builtin_ctzll(p->lv[l][i]);

		if (!p->lv[l - 1][j]) {
			p->lv[l][i] &= ~(1ull << (j & 63));
			goto again;
		}
		i = j;
	}
	p->lo = i;
	return i;
}

/* The page's state from the bitmap and the byte. */
static inline int state_of(const struct kvp_pages *p, uint32_t id)
{
	if (p->state[id])
		return p->state[id];
	return is_free(p, id) ? KVP_PAGE_FREE : KVP_PAGE_LEASED;
}

/* Writes every set bit of x as an id base + bit to out, ascending, a byte at a time: the byte's
 * positions from the table, its base added, eight slots stored at once (vector instructions
 * in either build), the next byte's slots after this one's ids. Returns the end of the ids;
 * writes up to 8 slots past it, never past out[63]. */
typedef uint32_t *emit_fn(uint32_t *out, uint64_t x, uint32_t base);

static inline __attribute__((always_inline)) uint32_t *emit_word(uint32_t *out, uint64_t x,
								 uint32_t base)
{
	v8u32 vb = (v8u32){ 0 } + base;

#pragma GCC unroll 8
	for (int b = 0; b < 64; b += 8) {
		unsigned byte = (unsigned)(x >> b) & 0xff;
		v8u32 v;

		memcpy(&v, g_pos[byte], sizeof(v));
		v += vb;
		memcpy(out, &v, sizeof(v));
		out += g_cnt[byte];
		vb += 8;
	}
	return out;
}

/* Copies c ids (at most 64) eight at a time, the last eight overlapping. */
static inline __attribute__((always_inline)) void copy_ids(uint32_t *d, const uint32_t *s,
							   uint32_t c)
{
	v8u32 v;

	if (c < 8) {
		for (uint32_t i = 0; i < c; i++)
			d[i] = s[i];
		return;
	}
	for (uint32_t i = 0; i + 8 < c; i += 8) {
		memcpy(&v, s + i, sizeof(v));
		memcpy(d + i, &v, sizeof(v));
	}
	memcpy(&v, s + c - 8, sizeof(v));
	memcpy(d + c - 8, &v, sizeof(v));
}

#if defined(__x86_64__)
#define AVX2 __attribute__((target("avx2,popcnt")))

/* emit_word with each byte's positions (plus its offset in the word) widened from bytes by one
 * instruction and counted by popcnt. */
static inline __attribute__((always_inline)) AVX2 uint32_t *emit_word_avx2(uint32_t *out,
									   uint64_t x,
									   uint32_t base)
{
	__m256i vb = _mm256_set1_epi32((int)base);

#pragma GCC unroll 8
	for (size_t k = 0; k < 8; k++, x >>= 8) {
		size_t byte = (size_t)(x & 0xff); /* 64-bit: the table offset folds into the load */
		__m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const void *)g_pos8[k][byte]));

		_mm256_storeu_si256((void *)out, _mm256_add_epi32(v, vb));
		out += __builtin_popcount((unsigned)byte);
	}
	return out;
}
#endif

/* Whole words straight into out while they fit with the stores' slack; the last ones through a
 * buffer, of which a word taken in part gives its lowest ids (the first id it keeps says which
 * bits remain). emit: emit_word or its AVX2 build. */
static inline __attribute__((always_inline)) void alloc_body(struct kvp_pages *p, uint32_t n,
							     uint32_t *out, emit_fn *emit)
{
	uint64_t *free = p->lv[0];
	uint32_t w = first_word(p), nw = p->nwords[0], left = n, c, buf[64];
	uint64_t x = free[w];

	/* whole words straight to out while the stores' slack stays below the end */
	while ((c = (uint32_t)__builtin_popcountll(x)) + 8 <= left) {
		out = emit(out, x, w * 64);
		left -= c;
		free[w] = 0;
		/* the next word up is likely the next one with free pages */
		if (w + 1 < nw && free[w + 1]) {
			w++;
		} else {
			p->lo = w;
			w = first_word(p);
		}
		x = free[w];
	}
	/* the last words through a buffer */
	for (;;) {
		emit(buf, x, w * 64);
		if (c > left) { /* in part: buf[left] is the lowest id left */
			x &= ~0ull << (buf[left] - w * 64);
			c = left;
		} else {
			x = 0;
		}
		copy_ids(out, buf, c);
		out += c;
		left -= c;
		free[w] = x;
		if (!left)
			break;
		p->lo = w;
		w = first_word(p);
		x = free[w];
		c = (uint32_t)__builtin_popcountll(x);
	}
	p->lo = w;
}

#if defined(__x86_64__)
static AVX2 void alloc_avx2(struct kvp_pages *p, uint32_t n, uint32_t *out)
{
	alloc_body(p, n, out, emit_word_avx2);
}
#endif

static void alloc_generic(struct kvp_pages *p, uint32_t n, uint32_t *out)
{
	alloc_body(p, n, out, emit_word);
}

int kvp_pages_alloc(struct kvp_pages *p, uint32_t n, uint32_t *out)
{
	if (n == 0)
		return -EINVAL;
	if (n > p->count[KVP_PAGE_FREE])
		return -ENOSPC;
	if (n == 1) {
		uint32_t w = first_word(p);
		uint64_t x = p->lv[0][w];

		out[0] = w * 64 + (uint32_t)__builtin_ctzll(x);
		p->lv[0][w] = x & (x - 1);
	}
#if defined(__x86_64__)
	else if (p->avx2)
		alloc_avx2(p, n, out);
	else
#endif
		alloc_generic(p, n, out);
	p->count[KVP_PAGE_FREE] -= n;
	p->count[KVP_PAGE_LEASED] += n;
	return 0;
}

/* Frees the ids gathered for word w (mask m, from cnt ids): all LEASED and each listed once, or
 * nothing changes and it returns false. */
static inline bool flush_word(struct kvp_pages *p, uint32_t w, uint64_t m, uint32_t cnt)
{
	uint64_t old = p->lv[0][w];

	if ((uint32_t)__builtin_popcountll(m) != cnt || ((old | p->special[w]) & m))
		return false;
	p->lv[0][w] = old | m;
	if (!old)
		up_set(p, w);
	return true;
}

/* Takes back what flush_word freed for ids[0..n): their words lose those bits again (summary
 * bits set meanwhile may stay: first_word clears stale ones). */
static void unfree(struct kvp_pages *p, const uint32_t *ids, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		p->lv[0][ids[i] >> 6] &= ~(1ull << (ids[i] & 63));
}

/* One id of a release, run by run: an id of another word first frees the run before it
 * (flush_word). Returns false when that is refused or the id is out of range: the caller undoes
 * ids[0 .. *start). */
static inline bool release_step(struct kvp_pages *p, uint32_t id, uint32_t i, uint32_t *cur,
				uint64_t *m, uint32_t *start)
{
	if (id >> 6 != *cur) {
		if (id >= p->total || !flush_word(p, *cur, *m, i - *start))
			return false;
		*cur = id >> 6;
		*m = 0;
		*start = i;
	}
	*m |= 1ull << (id & 63);
	return true;
}

/* The common case: every page LEASED, each listed once, in runs of ids sharing a word (a batch
 * that alloc handed out comes in ascending order). A run's ids gather into a mask (eight at a
 * time in the AVX2 build) that one store frees. Returns 0 with every page FREE, or -EINVAL with
 * nothing changed (the general path then decides). */
static int release_generic(struct kvp_pages *p, const uint32_t *ids, uint32_t n)
{
	uint32_t start = 0, cur;
	uint64_t m = 0;

	if (ids[0] >= p->total)
		return -EINVAL;
	cur = ids[0] >> 6;
	for (uint32_t i = 0; i < n; i++) {
		for (; i < n && ids[i] >> 6 == cur; i++) /* the run, in a tight loop */
			m |= 1ull << (ids[i] & 63);
		if (i < n && !release_step(p, ids[i], i, &cur, &m, &start))
			goto undo;
	}
	if (flush_word(p, cur, m, n - start))
		return 0;
undo:
	unfree(p, ids, start);
	return -EINVAL;
}

#if defined(__x86_64__)
/* The mask of 64 bits from the OR of eight 32-bit lanes of low halves and eight of high halves. */
static inline AVX2 uint64_t mask_of(__m256i lo, __m256i hi)
{
	__m256i t = _mm256_or_si256(_mm256_unpacklo_epi32(lo, hi), _mm256_unpackhi_epi32(lo, hi));
	__m128i h = _mm_or_si128(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));

	return (uint64_t)_mm_cvtsi128_si64(_mm_or_si128(h, _mm_unpackhi_epi64(h, h)));
}

/* Where a release stands: the run's bits so far, its word, its first id. */
struct run {
	uint64_t m;
	uint32_t cur, start;
};

/* ids[i .. e) one by one (release_step) after r; r.cur == UINT32_MAX when refused. Out of line:
 * the rare chunks of the AVX2 loop that are not one word's ids then the next's, and its tail. */
static __attribute__((noinline)) struct run release_ids(struct kvp_pages *p, const uint32_t *ids,
							uint32_t i, uint32_t e, struct run r)
{
	for (; i < e; i++)
		if (!release_step(p, ids[i], i, &r.cur, &r.m, &r.start))
			return (struct run){ .cur = UINT32_MAX, .start = r.start };
	return r;
}

/* release_generic eight ids at a time. XOR with the run's word base leaves each id's bit number
 * for the ids of the run's word and 64 or more for others; a lane's bit lands in a low or a high
 * 32-bit half of the lane (a shift by 32 or more gives 0, so other words' ids add nothing). While
 * all eight lie in the word (one test) they are ORed into the run. A chunk whose leading ids are
 * the word's and the rest those of its last id's word ends the run (flush_word) and starts the
 * next one with them: no step waits on a load whose address came from the data. Other chunks go
 * id by id. */
static AVX2 int release_avx2(struct kvp_pages *p, const uint32_t *ids, uint32_t n)
{
	const __m256i one = _mm256_set1_epi32(1), k32 = _mm256_set1_epi32(32);
	const __m256i high = _mm256_set1_epi32(~63), zero = _mm256_setzero_si256();
	const uint32_t *q = ids, *qe = ids + (n & ~7u);
	__m256i alo = zero, ahi = zero, vb;
	struct run r = { .m = 0, .cur = ids[0] >> 6, .start = 0 };

	if (ids[0] >= p->total)
		return -EINVAL;
	vb = _mm256_set1_epi32((int)(r.cur << 6));
	for (; q < qe; q += 8) {
		__m256i x = _mm256_xor_si256(_mm256_loadu_si256((const void *)q), vb), v, xn, vn;
		__m256i lo = _mm256_sllv_epi32(one, x);
		__m256i hi = _mm256_sllv_epi32(one, _mm256_xor_si256(x, k32));
		uint32_t in, next, at;

		if (__builtin_expect(_mm256_testz_si256(x, high), 1)) { /* all eight in word cur */
			alo = _mm256_or_si256(alo, lo);
			ahi = _mm256_or_si256(ahi, hi);
			continue;
		}
		/* the ids again, from memory: the fast path above then keeps no copy of them */
		__asm__ volatile("" ::: "memory");
		v = _mm256_loadu_si256((const void *)q);
		next = q[7] >> 6;
		vn = _mm256_and_si256(_mm256_set1_epi32((int)q[7]), high);
		xn = _mm256_xor_si256(v, vn);
		/* lanes of word cur (one bit each) */
		in = 0xff & ~(uint32_t)_mm256_movemask_ps(_mm256_castsi256_ps(
				    _mm256_cmpeq_epi32(_mm256_or_si256(lo, hi), zero)));
		at = (uint32_t)(q - ids);
		if (__builtin_expect((in & (in + 1)) || next >= p->nwords[0] ||
					     !_mm256_testz_si256(_mm256_min_epu32(x, xn), high),
				     0)) {
			/* not word cur's ids then word next's: id by id */
			r.m |= mask_of(alo, ahi);
			r = release_ids(p, ids, at, at + 8, r);
			if (r.cur == UINT32_MAX)
				goto undo;
			vb = _mm256_set1_epi32((int)(r.cur << 6));
			alo = ahi = zero;
			continue;
		}
		at += (uint32_t)__builtin_popcount(in); /* the next word's first id */
		if (!flush_word(p, r.cur,
				r.m | mask_of(_mm256_or_si256(alo, lo), _mm256_or_si256(ahi, hi)),
				at - r.start))
			goto undo;
		r.m = 0;
		r.cur = next;
		r.start = at;
		vb = vn;
		alo = _mm256_sllv_epi32(one, xn);
		ahi = _mm256_sllv_epi32(one, _mm256_xor_si256(xn, k32));
	}
	r.m |= mask_of(alo, ahi);
	if (q < ids + n) /* the last ids, fewer than eight */
		r = release_ids(p, ids, (uint32_t)(q - ids), n, r);
	if (r.cur != UINT32_MAX && flush_word(p, r.cur, r.m, n - r.start))
		return 0;
undo:
	unfree(p, ids, r.start);
	return -EINVAL;
}
#endif

/* Any mix of LEASED, CACHED and MOVING pages, duplicates and bad ids refused. Each page's free
 * bit is set as it is checked, so a page listed twice reads free the second time; a refusal
 * clears them again before the summaries were touched. */
static int release_any(struct kvp_pages *p, const uint32_t *ids, uint32_t n)
{
	uint64_t *free = p->lv[0];
	uint32_t i, cached = 0, moving = 0;

	for (i = 0; i < n; i++) {
		uint32_t id = ids[i];

		if (id >= p->total || is_free(p, id))
			break;
		free[id >> 6] |= 1ull << (id & 63);
		cached += p->state[id] == KVP_PAGE_CACHED;
		moving += p->state[id] == KVP_PAGE_MOVING;
	}
	if (i < n) {
		while (i-- > 0)
			free[ids[i] >> 6] &= ~(1ull << (ids[i] & 63));
		return -EINVAL;
	}
	if (cached)
		guard_trip(p); /* a cached page leaves the cache: the snapshot is in doubt */
	for (i = 0; i < n; i++) {
		uint32_t id = ids[i];

		if (p->state[id]) {
			p->state[id] = 0;
			p->special[id >> 6] &= ~(1ull << (id & 63));
		}
		up_set(p, id >> 6);
	}
	p->count[KVP_PAGE_LEASED] -= n - cached - moving;
	p->count[KVP_PAGE_CACHED] -= cached;
	p->count[KVP_PAGE_MOVING] -= moving;
	p->count[KVP_PAGE_FREE] += n;
	return 0;
}

int kvp_pages_release(struct kvp_pages *p, const uint32_t *ids, uint32_t n)
{
	int r;

	if (n == 0)
		return 0;
	if (n == 1) {
		uint32_t id = ids[0], w = id >> 6;
		uint64_t bit = 1ull << (id & 63), old;

		if (id >= p->total || ((old = p->lv[0][w]) | p->special[w]) & bit)
			return release_any(p, ids, n);
		p->lv[0][w] = old | bit;
		if (!old)
			up_set(p, w);
		r = 0;
	}
#if defined(__x86_64__)
	else if (p->avx2)
		r = release_avx2(p, ids, n);
	else
#endif
		r = release_generic(p, ids, n);
	/* A page in another state, a duplicate or a bad id: the general path decides. */
	if (r < 0)
		return release_any(p, ids, n);
	p->count[KVP_PAGE_LEASED] -= n;
	p->count[KVP_PAGE_FREE] += n;
	return 0;
}

int kvp_pages_claim(struct kvp_pages *p, const uint32_t *ids, uint32_t n)
{
	uint64_t *free = p->lv[0];
	uint32_t i;

	/* each bit cleared as it is checked: a page listed twice is no longer free */
	for (i = 0; i < n; i++) {
		if (ids[i] >= p->total || !is_free(p, ids[i]))
			break;
		free[ids[i] >> 6] &= ~(1ull << (ids[i] & 63));
	}
	if (i < n) {
		while (i-- > 0)
			free[ids[i] >> 6] |= 1ull << (ids[i] & 63);
		return -EINVAL;
	}
	p->count[KVP_PAGE_FREE] -= n;
	p->count[KVP_PAGE_LEASED] += n;
	return 0;
}

/* The state bytes, zeroed. Past 256 KiB they are asked for in huge pages (a hint). */
static uint8_t *state_map(size_t want, size_t *bytes)
{
	const size_t huge = (size_t)2 << 20;
	size_t len = want < ((size_t)256 << 10) ? want : (want + huge - 1) / huge * huge;
	uint8_t *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (m == MAP_FAILED)
		return NULL;
	if (len >= huge)
		(void)madvise(m, len, MADV_HUGEPAGE);
	*bytes = len;
	return m;
}

struct kvp_pages *kvp_pages_new(uint32_t total)
{
	struct kvp_pages *p;
	uint64_t words;

	if (total == 0 || total == KVP_PAGE_NONE)
		return NULL;
	(void)pthread_once(&g_tables_once, tables_init);
	p = calloc(1, sizeof(*p));
	if (!p)
		return NULL;
	p->cap = 64;
	while (p->cap < total)
		p->cap *= 2;
	words = p->cap / 64;
	for (p->nlv = 0;; p->nlv++) {
		p->nwords[p->nlv] = (uint32_t)words;
		p->lv[p->nlv] = calloc(words, sizeof(uint64_t));
		if (!p->lv[p->nlv]) {
			kvp_pages_free(p);
			return NULL;
		}
		if (words == 1 && p->nlv) /* at least one summary level */
			break;
		words = (words + 63) / 64;
	}
	p->nlv++;
	p->special = calloc(p->nwords[0], sizeof(uint64_t));
	p->state = state_map(total, &p->state_bytes);
	if (!p->special || !p->state) {
		kvp_pages_free(p);
		return NULL;
	}
	p->total = total;
	for (uint64_t b = 0; b < p->cap; b += 64) {
		uint64_t below = total - b >= 64 ? ~0ull : (1ull << (total - b)) - 1;

		if (b >= total)
			below = 0;
		p->lv[0][b / 64] = below;
		p->special[b / 64] = ~below;
		if (below)
			up_set(p, (uint32_t)(b / 64));
	}
	p->lo = 0;
	p->count[KVP_PAGE_FREE] = total;
#if defined(__x86_64__)
	p->avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("popcnt");
#endif
	return p;
}

void kvp_pages_free(struct kvp_pages *p)
{
	if (!p)
		return;
	for (int l = 0; l < LV_MAX; l++)
		free(p->lv[l]);
	free(p->special);
	if (p->state)
		munmap(p->state, p->state_bytes);
	free(p);
}

bool kvp_pages_simd(struct kvp_pages *p, int on)
{
#if defined(__x86_64__)
	if (on >= 0)
		p->avx2 = on && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("popcnt");
#else
	(void)on;
#endif
	return p->avx2;
}

int kvp_pages_move(struct kvp_pages *p, uint32_t id, enum kvp_page_state from,
		   enum kvp_page_state to)
{
	if (id >= p->total || from == KVP_PAGE_FREE || to == KVP_PAGE_FREE ||
	    to >= KVP_PAGE_STATE_MAX || state_of(p, id) != (int)from)
		return -EINVAL;
	if (from == KVP_PAGE_CACHED)
		guard_trip(p);
	if (to == KVP_PAGE_LEASED)
		p->special[id >> 6] &= ~(1ull << (id & 63));
	else
		p->special[id >> 6] |= 1ull << (id & 63);
	p->state[id] = to == KVP_PAGE_LEASED ? 0 : (uint8_t)to;
	p->count[from]--;
	p->count[to]++;
	return 0;
}

int kvp_pages_state(const struct kvp_pages *p, uint32_t id)
{
	if (id >= p->total)
		return -EINVAL;
	return state_of(p, id);
}

uint32_t kvp_pages_total(const struct kvp_pages *p)
{
	return p->total;
}

void kvp_pages_states(const struct kvp_pages *p, uint8_t *out)
{
	for (uint32_t i = 0; i < p->total; i++)
		out[i] = (uint8_t)state_of(p, i);
}

uint32_t kvp_pages_count(const struct kvp_pages *p, enum kvp_page_state s)
{
	return s < KVP_PAGE_STATE_MAX ? p->count[s] : 0;
}

int kvp_pages_check(const struct kvp_pages *p)
{
	uint32_t seen[KVP_PAGE_STATE_MAX] = { 0 };
	uint64_t sum = 0;

	for (uint32_t i = 0; i < p->total; i++) {
		uint8_t st = p->state[i];
		bool sp = p->special[i >> 6] >> (i & 63) & 1;

		if ((st && (st != KVP_PAGE_CACHED && st != KVP_PAGE_MOVING)) || sp != (st != 0) ||
		    (st && is_free(p, i)))
			return -EFAULT;
		seen[state_of(p, i)]++;
	}
	for (int s = 0; s < KVP_PAGE_STATE_MAX; s++) {
		if (seen[s] != p->count[s])
			return -EFAULT;
		sum += p->count[s];
	}
	if (sum != p->total)
		return -EFAULT;
	/* past total: never free, always special */
	for (uint64_t b = p->total; b < p->cap; b++)
		if ((p->lv[0][b / 64] >> (b & 63) & 1) || !(p->special[b / 64] >> (b & 63) & 1))
			return -EFAULT;
	/* a summary bit is set for each word below that is not 0, never past the level's words;
	 * nothing free below lo */
	for (int l = 1; l < p->nlv; l++)
		for (uint64_t j = 0; j < (uint64_t)p->nwords[l] * 64; j++) {
			bool bit = p->lv[l][j / 64] >> (j & 63) & 1;

			if (j < p->nwords[l - 1] ? (p->lv[l - 1][j] && !bit) : bit)
				return -EFAULT;
		}
	for (uint32_t w = 0; w < p->lo && w < p->nwords[0]; w++)
		if (p->lv[0][w])
			return -EFAULT;
	return 0;
}
