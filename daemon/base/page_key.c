/* page_key.c - a token page's content key (page_key.h), with nettle's SHA-256. */
#include "page_key.h"

#include <nettle/sha2.h>

void kvp_page_key(const uint8_t *parent, const uint32_t *tokens, size_t n,
		  uint8_t out[KVP_PAGE_KEY_BYTES])
{
	struct sha256_ctx ctx;
	uint8_t buf[256];

	sha256_init(&ctx);
	if (parent)
		sha256_update(&ctx, KVP_PAGE_KEY_BYTES, parent);
	while (n) {
		size_t k = n < sizeof(buf) / 4 ? n : sizeof(buf) / 4;

		for (size_t i = 0; i < k; i++) {
			buf[4 * i] = (uint8_t)tokens[i];
			buf[4 * i + 1] = (uint8_t)(tokens[i] >> 8);
			buf[4 * i + 2] = (uint8_t)(tokens[i] >> 16);
			buf[4 * i + 3] = (uint8_t)(tokens[i] >> 24);
		}
		sha256_update(&ctx, 4 * k, buf);
		tokens += k;
		n -= k;
	}
	sha256_digest(&ctx, KVP_PAGE_KEY_BYTES, out);
}
