/* crc32c.h - CRC32C of a buffer (crc32c("123456789") == 0xe3069283). */
#pragma once
#include <stddef.h>
#include <stdint.h>

uint32_t kvp_crc32c(const void *p, size_t n);
/* Copies n bytes from src to dst (which do not overlap) and returns their CRC32C: one pass over
 * them where the CPU has the crc32 instruction. */
uint32_t kvp_crc32c_copy(void *dst, const void *src, size_t n);
