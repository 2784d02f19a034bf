/* crc32c.c - CRC32C (Castagnoli): SSE4.2 where the CPU has it, a table otherwise. Shared by the
 * remote tier's values and the restart snapshots.
 *
 * The crc32 instruction has a latency of 3 cycles and a throughput of 1, so one chain of it
 * runs at a third of what the CPU can do: long buffers go in blocks of three lanes of LANE
 * bytes, each lane its own chain, joined by the CRC's linearity:
 *   raw(A B C, c) = shift(shift(raw(A, c)) ^ raw(B, 0)) ^ raw(C, 0)
 * where raw is the register update without the final inversion and shift(x) advances x over
 * LANE zero bytes (a 32-bit linear map, tabulated once per byte of x). */
#include "crc32c.h"

#include <stdint.h>
#include <string.h>

#define LANE 4096

static uint32_t crc_table[256];
static uint32_t shift_table[4][256]; /* shift(x) = XOR of shift_table[k][byte k of x] */

/* Filled before main so that threads never race on them. */
__attribute__((constructor)) static void crc_table_init(void)
{
	uint32_t bit[32];

	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;

		for (int k = 0; k < 8; k++)
			c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
		crc_table[i] = c;
	}
	for (int b = 0; b < 32; b++) { /* each bit of the register over LANE zero bytes */
		uint32_t c = 1u << b;

		for (int k = 0; k < LANE; k++)
			c = crc_table[c & 0xff] ^ (c >> 8);
		bit[b] = c;
	}
	for (int k = 0; k < 4; k++)
		for (uint32_t v = 0; v < 256; v++) {
			uint32_t c = 0;

			for (int b = 0; b < 8; b++)
				if (v >> b & 1)
					c ^= bit[8 * k + b];
			shift_table[k][v] = c;
		}
}

static uint32_t shift(uint32_t c)
{
	return shift_table[0][c & 0xff] ^ shift_table[1][(c >> 8) & 0xff] ^
	       shift_table[2][(c >> 16) & 0xff] ^ shift_table[3][c >> 24];
}

static uint32_t crc32c_sw(uint32_t c, const uint8_t *p, size_t n)
{
	while (n--)
		c = crc_table[(c ^ *p++) & 0xff] ^ (c >> 8);
	return c;
}

#if defined(__x86_64__)
/* The hardware loop; with dst, each 8 bytes read are stored there too (one pass for a copy and
 * its checksum). */
static inline __attribute__((always_inline, target("sse4.2"))) uint32_t crc32c_hw_body(
	uint32_t c, const uint8_t *p, size_t n, uint8_t *dst)
{
	uint64_t c64 = c;

	for (; n && ((uintptr_t)p & 7); n--) {
		if (dst)
			*dst++ = *p;
		c64 = __builtin_ia32_crc32qi((uint32_t)c64, *p++);
	}
	for (; n >= 3 * LANE; n -= 3 * LANE, p += 3 * LANE) {
		uint64_t c1 = 0, c2 = 0;

		for (size_t i = 0; i < LANE; i += 8) {
			uint64_t w0, w1, w2;

			memcpy(&w0, p + i, 8);
			memcpy(&w1, p + LANE + i, 8);
			memcpy(&w2, p + 2 * LANE + i, 8);
			if (dst) {
				memcpy(dst + i, &w0, 8);
				memcpy(dst + LANE + i, &w1, 8);
				memcpy(dst + 2 * LANE + i, &w2, 8);
			}
			c64 = __builtin_ia32_crc32di(c64, w0);
			c1 = __builtin_ia32_crc32di(c1, w1);
			c2 = __builtin_ia32_crc32di(c2, w2);
		}
		c64 = shift(shift((uint32_t)c64) ^ (uint32_t)c1) ^ (uint32_t)c2;
		if (dst)
			dst += 3 * LANE;
	}
	for (; n >= 8; n -= 8, p += 8) {
		uint64_t w;

		memcpy(&w, p, 8);
		if (dst) {
			memcpy(dst, &w, 8);
			dst += 8;
		}
		c64 = __builtin_ia32_crc32di(c64, w);
	}
	for (; n; n--) {
		if (dst)
			*dst++ = *p;
		c64 = __builtin_ia32_crc32qi((uint32_t)c64, *p++);
	}
	return (uint32_t)c64;
}

__attribute__((target("sse4.2"))) static uint32_t crc32c_hw(uint32_t c, const uint8_t *p, size_t n)
{
	return crc32c_hw_body(c, p, n, NULL);
}

__attribute__((target("sse4.2"))) static uint32_t crc32c_hw_copy(uint32_t c, const uint8_t *p,
								 size_t n, uint8_t *dst)
{
	return crc32c_hw_body(c, p, n, dst);
}
#endif

uint32_t kvp_crc32c(const void *p, size_t n)
{
#if defined(__x86_64__)
	if (__builtin_cpu_supports("sse4.2"))
		return ~crc32c_hw(~0u, p, n);
#endif
	return ~crc32c_sw(~0u, p, n);
}

uint32_t kvp_crc32c_copy(void *dst, const void *src, size_t n)
{
#if defined(__x86_64__)
	if (__builtin_cpu_supports("sse4.2"))
		return ~crc32c_hw_copy(~0u, src, n, dst);
#endif
	memcpy(dst, src, n);
	return ~crc32c_sw(~0u, dst, n);
}
