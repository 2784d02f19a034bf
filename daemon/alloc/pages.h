/* pages.h - page allocator of one tier: a free bitmap with summary levels (lowest free page
 * first, batches a word at a time), per-page state. */
#pragma once
#include <stdint.h>
#include <stdbool.h>
#include <stddef.h>

#define KVP_PAGE_NONE UINT32_MAX

enum kvp_page_state {
	KVP_PAGE_FREE = 0,
	KVP_PAGE_LEASED,
	KVP_PAGE_CACHED,
	KVP_PAGE_MOVING, /* reserved as the destination of a copy still in flight: not free, not
			  * readable, owned by the copy until it completes */
	KVP_PAGE_STATE_MAX,
};

struct kvp_pages;

/* Returns a new allocator of `total` pages, all free; NULL on ENOMEM or total == 0. */
struct kvp_pages *kvp_pages_new(uint32_t total);
/* Accepts NULL. */
void kvp_pages_free(struct kvp_pages *p);

/* Takes the n lowest free pages, all or nothing, marks them LEASED and writes their ids to out
 * in ascending order. Returns 0, -ENOSPC when fewer than n pages are free, -EINVAL for n == 0.
 * O(n + levels). */
int kvp_pages_alloc(struct kvp_pages *p, uint32_t n, uint32_t *out);
/* LEASED, CACHED or MOVING -> FREE. Returns 0, -EINVAL for an out-of-range id, a FREE page or
 * an id listed twice (nothing changes then: all ids are checked before any is freed). Fastest
 * for LEASED pages in runs that share a word of 64 ids (as alloc hands them out). */
int kvp_pages_release(struct kvp_pages *p, const uint32_t *ids, uint32_t n);
/* Moves one page between LEASED, CACHED and MOVING. Returns 0, -EINVAL when the page is not in
 * `from` or `to` is FREE. */
int kvp_pages_move(struct kvp_pages *p, uint32_t id, enum kvp_page_state from,
		   enum kvp_page_state to);

/* Returns the state of page id, or -EINVAL when out of range. */
int kvp_pages_state(const struct kvp_pages *p, uint32_t id);
uint32_t kvp_pages_total(const struct kvp_pages *p);
/* Writes the state of every page (kvp_pages_total bytes, enum kvp_page_state values) to out. */
void kvp_pages_states(const struct kvp_pages *p, uint8_t *out);
/* Count of pages in state s (s < KVP_PAGE_STATE_MAX). */
uint32_t kvp_pages_count(const struct kvp_pages *p, enum kvp_page_state s);
/* Takes the listed FREE pages (distinct), all or nothing, and marks them LEASED: a restart
 * rebuilding its books (snapshot.c). Returns 0, -EINVAL (an id out of range, not FREE or listed
 * twice: nothing changes). O(n). */
int kvp_pages_claim(struct kvp_pages *p, const uint32_t *ids, uint32_t n);

/* The snapshot's guard (snapshot.c): while *armed, the first CACHED page that leaves CACHED
 * (released, or moved to another state) first bumps *gen (a word in shared memory that
 * outlives a crash) and disarms. Both pointers may be shared by a pool's tiers; NULL: none. */
void kvp_pages_guard(struct kvp_pages *p, volatile uint64_t *gen, bool *armed);

/* Returns 0 when free + leased + cached + moving == total and the bitmaps, their summary levels
 * and the state bytes agree, -EFAULT otherwise. O(total): for tests. */
int kvp_pages_check(const struct kvp_pages *p);

/* The AVX2 loops of alloc and release (chosen at kvp_pages_new where the CPU has AVX2): on >= 0
 * turns them on (where the CPU has them) or off, so tests run both; returns whether they are on. */
bool kvp_pages_simd(struct kvp_pages *p, int on);
