/* eng.h - a test "engine": one client connected to a running kvpoold and attached to one pool,
 * and the byte pattern the page-data integration tests write and check. Header only, so the
 * harness library itself does not need libkvpool. */
#pragma once
#include <stdint.h>

#include "kvpool.h"

struct h_eng {
	struct kvp_client *c;
	struct kvp_pool *p;
};

/* Connects to sock as client name and attaches pool. 0, or -1 (e->c may then be set). */
static inline int h_eng_open(struct h_eng *e, const char *sock, const char *name, const char *pool)
{
	struct kvp_error err;

	e->c = kvp_client_connect(sock, name, &err);
	e->p = e->c ? kvp_pool_attach(e->c, pool, NULL, &err) : NULL;
	return e->p ? 0 : -1;
}

/* Byte i of the row of (layer, kv) at position tok_pos of sequence seq. */
static inline uint8_t h_byte_of(uint32_t tok_pos, uint32_t seq, uint32_t layer, uint32_t kv,
				uint32_t i)
{
	return (uint8_t)(seq * 131 + tok_pos * 31 + layer * 7 + kv * 3 + i);
}
