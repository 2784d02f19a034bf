/* rng.h - deterministic random data for tests (xorshift64*): a failure reproduces. */
#pragma once
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <CUnit/CUnit.h>

struct h_rng {
	uint64_t s; /* any non-zero seed */
};

static inline uint64_t h_rng_next(struct h_rng *r)
{
	r->s ^= r->s >> 12;
	r->s ^= r->s << 25;
	r->s ^= r->s >> 27;
	return r->s * 0x2545F4914F6CDD1Dull;
}

static inline void h_fill_random(struct h_rng *r, unsigned char *p, uint64_t n)
{
	for (uint64_t i = 0; i < n; i++)
		p[i] = (unsigned char)h_rng_next(r);
}

/* k distinct ids out of [0, total), in shuffled order. */
static inline void h_pick_ids(struct h_rng *r, uint32_t *out, uint32_t k, uint32_t total)
{
	uint32_t *all = malloc(total * sizeof(*all));

	CU_ASSERT_FATAL(all != NULL);
	for (uint32_t i = 0; i < total; i++)
		all[i] = i;
	for (uint32_t i = total - 1; i > 0; i--) {
		uint32_t j = (uint32_t)(h_rng_next(r) % (i + 1));
		uint32_t t = all[i];

		all[i] = all[j];
		all[j] = t;
	}
	memcpy(out, all, k * sizeof(*out));
	free(all);
}
