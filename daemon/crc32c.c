/* crc32c.c - CRC32C (Castagnoli): SSE4.2 where the CPU has it, a table otherwise. Shared by the
 * remote tier's values and the restart snapshots. */
#include "crc32c.h"

#include <stdint.h>
#include <string.h>

static uint32_t crc_table[256];

/* Filled before main so that threads never race on it. */
__attribute__((constructor)) static void crc_table_init(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;

		for (int k = 0; k < 8; k++)
			c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
		crc_table[i] = c;
	}
}

static uint32_t crc32c_sw(uint32_t c, const uint8_t *p, size_t n)
{
	while (n--)
		c = crc_table[(c ^ *p++) & 0xff] ^ (c >> 8);
	return c;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t crc32c_hw(uint32_t c, const uint8_t *p, size_t n)
{
	uint64_t c64 = c;

	for (; n && ((uintptr_t)p & 7); n--)
		c64 = __builtin_ia32_crc32qi((uint32_t)c64, *p++);
	for (; n >= 8; n -= 8, p += 8) {
		uint64_t w;

		memcpy(&w, p, 8);
		c64 = __builtin_ia32_crc32di(c64, w);
	}
	for (; n; n--)
		c64 = __builtin_ia32_crc32qi((uint32_t)c64, *p++);
	return (uint32_t)c64;
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
