/* eng.h - a test "engine": one client connected to a running kvpoold and attached to one pool,
 * and the byte pattern the page-data integration tests write and check. Header only, so the
 * harness library itself does not need libkvpool. */
#pragma once
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

/* Writes (check 0) or counts the mismatches (check 1) of sequence seq's pattern at positions
 * [0, ntok) of pages of tier: a pool of 2 layers, K and V, rows of row bytes, page_tokens pt.
 * Returns the mismatches (1000 when a slot has no address). */
static inline int h_eng_rows(struct kvp_pool *p, int tier, const uint32_t *pages, uint32_t ntok,
			     uint32_t pt, uint32_t row, uint32_t seq, int check)
{
	int bad = 0;

	for (uint32_t pos = 0; pos < ntok; pos++)
		for (uint32_t l = 0; l < 2; l++)
			for (uint32_t kv = 0; kv < 2; kv++) {
				uint8_t *a = kvp_pool_slot_addr(p, tier, l, kv, pages[pos / pt],
								pos % pt);

				if (!a)
					return 1000;
				for (uint32_t i = 0; i < row; i++) {
					if (!check)
						a[i] = h_byte_of(pos, seq, l, kv, i);
					else
						bad += a[i] != h_byte_of(pos, seq, l, kv, i);
				}
			}
	return bad;
}

/* The daemon's counter name (status counters, then the further ones), or -1. */
static inline int64_t h_eng_counter(struct h_eng *e, const char *name)
{
	struct kvp_status *s = calloc(1, sizeof(*s));
	int64_t v = -1;

	if (!s)
		return -1;
	s->struct_size = sizeof(*s);
	if (kvp_client_status(e->c, s, NULL) == 0) {
		for (uint32_t i = 0; i < s->n_counters; i++)
			if (strcmp(s->counters[i].name, name) == 0)
				v = (int64_t)s->counters[i].value;
		for (uint32_t i = 0; i < s->n_more_counters; i++)
			if (strcmp(s->more_counters[i].name, name) == 0)
				v = (int64_t)s->more_counters[i].value;
	}
	free(s);
	return v;
}
