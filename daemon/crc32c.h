/* crc32c.h - CRC32C of a buffer (crc32c("123456789") == 0xe3069283). */
#pragma once
#include <stddef.h>
#include <stdint.h>

uint32_t kvp_crc32c(const void *p, size_t n);
