/* mix.h - the 64-bit finalizer the daemon's seeded hash tables (prefix tree, key cache) mix
 * their hashes with. */
#pragma once
#include <stdint.h>

/* Spreads every input bit over the whole result (a bijection on 64 bits). */
static inline uint64_t kvp_mix64(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdULL;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ULL;
	x ^= x >> 33;
	return x;
}
