/* page_key.h - a token page's content key: SHA-256 over (the parent page's key, when there is a
 * parent) and the page's tokens as 32-bit little-endian words. The same on every node: the page
 * index keeps it, the remote tier names values by it. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#define KVP_PAGE_KEY_BYTES 32u

/* out may be parent (the chain advanced in place). */
void kvp_page_key(const uint8_t *parent, const uint32_t *tokens, size_t n,
		  uint8_t out[KVP_PAGE_KEY_BYTES]);
