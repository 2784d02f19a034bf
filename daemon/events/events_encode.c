/* events_encode.c - KVEventBatch in msgpack, byte for byte as vLLM's msgspec classes encode it
 * (vllm/distributed/kv_events.py): the batch an array [ts (float 64), [events], null], each event
 * a map whose first key "type" names its class (BlockStored, BlockRemoved, AllBlocksCleared),
 * then the class's fields without a default in declaration order, then the optional fields
 * kvpool sets (locality, ownership). Block hashes are bin (Python bytes). BlockStored's map has a
 * map 16 header, as msgspec writes a struct of more than 15 fields: the bytes are msgspec's.
 *
 * The hot path of KV events: an event is written straight into the batch's one buffer, its
 * constant parts copied as prebuilt msgpack bytes, after one check of room for the whole event
 * (no per-field calls, no string lengths measured, no allocation once the buffer has grown).
 * The buffer keeps room for the batch's header before the events, so kvp_events_batch_payload
 * turns it into the payload in place, without copying the events; the buffer is the batch's for
 * good, so it stays in the cache from one batch to the next. */
#include "events.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static const char *const g_medium_names[KVP_EVENTS_MEDIUM_MAX] = {
	[KVP_EVENTS_GPU] = "GPU",
	[KVP_EVENTS_CPU] = "CPU",
	[KVP_EVENTS_STORAGE] = "STORAGE",
	[KVP_EVENTS_REMOTE] = "REMOTE",
};

const char *kvp_events_medium_name(enum kvp_events_medium m)
{
	return (unsigned)m < KVP_EVENTS_MEDIUM_MAX ? g_medium_names[m] : "?";
}

/* Copies a string literal's bytes (a constant size: no call) and moves w past them. */
#define PUT(w, s) ((w) = (uint8_t *)memcpy((w), (s), sizeof(s) - 1) + sizeof(s) - 1)

/* An event's bytes that depend only on its medium, copied as TAIL_MAX bytes whatever their length
 * (a constant size again; what lies past them is written over next or lies past the event). */
#define TAIL_MAX 64
struct tail {
	uint8_t b[TAIL_MAX];
	size_t n;
};
#define TAIL(s)                                                                                    \
	{                                                                                          \
		s, sizeof(s) - 1                                                                   \
	}
#define LOCAL "\xa8locality\xa5LOCAL"
/* BlockStored's fields after block_size: lora_id, medium, lora_name, locality */
#define STORED_TAIL(m, loc) TAIL("\xa7lora_id\xc0\xa6medium" m "\xa9lora_name\xc0" loc)
/* BlockRemoved's after block_hashes: medium, locality */
#define REMOVED_TAIL(m, loc) TAIL("\xa6medium" m loc)
static const struct tail g_stored_tail[KVP_EVENTS_MEDIUM_MAX] = {
	[KVP_EVENTS_GPU] = STORED_TAIL("\xa3GPU", LOCAL),
	[KVP_EVENTS_CPU] = STORED_TAIL("\xa3"
				       "CPU",
				       LOCAL),
	[KVP_EVENTS_STORAGE] = STORED_TAIL("\xa7STORAGE", LOCAL),
	[KVP_EVENTS_REMOTE] = STORED_TAIL("\xa6REMOTE", "\xa8locality\xa6REMOTE"),
};
static const struct tail g_removed_tail[KVP_EVENTS_MEDIUM_MAX] = {
	[KVP_EVENTS_GPU] = REMOVED_TAIL("\xa3GPU", LOCAL),
	[KVP_EVENTS_CPU] = REMOVED_TAIL("\xa3"
					"CPU",
					LOCAL),
	[KVP_EVENTS_STORAGE] = REMOVED_TAIL("\xa7STORAGE", LOCAL),
	[KVP_EVENTS_REMOTE] = REMOVED_TAIL("\xa6REMOTE", "\xa8locality\xa6REMOTE"),
};

/* The most bytes an event takes beyond its hashes, tokens and source (its constants, a tail's
 * TAIL_MAX, the headers of its hashes, token array, block size and source). */
#define EVENT_FIXED_MAX 256u
/* The most bytes msgpack's header of an array, a string or bin takes; of a uint32. */
#define HDR_MAX 5u

static uint8_t *put_tail(uint8_t *w, const struct tail *t)
{
	memcpy(w, t->b, TAIL_MAX);
	return w + t->n;
}

static uint8_t *put_be16(uint8_t *w, uint8_t tag, uint32_t x)
{
	w[0] = tag;
	w[1] = (uint8_t)(x >> 8);
	w[2] = (uint8_t)x;
	return w + 3;
}

static uint8_t *put_be32(uint8_t *w, uint8_t tag, uint32_t x)
{
	w[0] = tag;
	w[1] = (uint8_t)(x >> 24);
	w[2] = (uint8_t)(x >> 16);
	w[3] = (uint8_t)(x >> 8);
	w[4] = (uint8_t)x;
	return w + 5;
}

/* msgpack's shortest forms, as msgpack-c and msgspec write them */
static inline uint8_t *put_uint(uint8_t *w, uint32_t x)
{
	if (x < 0x80) {
		*w = (uint8_t)x;
		return w + 1;
	}
	if (x < 0x100) {
		w[0] = 0xcc;
		w[1] = (uint8_t)x;
		return w + 2;
	}
	if (x < 0x10000)
		return put_be16(w, 0xcd, x);
	return put_be32(w, 0xce, x);
}

static uint8_t *put_array_hdr(uint8_t *w, uint32_t n)
{
	if (n < 16) {
		*w = (uint8_t)(0x90 | n);
		return w + 1;
	}
	return n < 0x10000 ? put_be16(w, 0xdc, n) : put_be32(w, 0xdd, n);
}

static uint8_t *put_bin(uint8_t *w, const uint8_t *p, size_t n)
{
	if (n < 0x100) {
		w[0] = 0xc4;
		w[1] = (uint8_t)n;
		w += 2;
	} else {
		w = n < 0x10000 ? put_be16(w, 0xc5, (uint32_t)n) : put_be32(w, 0xc6, (uint32_t)n);
	}
	memcpy(w, p, n);
	return w + n;
}

static uint8_t *put_str(uint8_t *w, const char *s, size_t n)
{
	if (n < 32) {
		*w++ = (uint8_t)(0xa0 | n);
	} else if (n < 0x100) {
		w[0] = 0xd9;
		w[1] = (uint8_t)n;
		w += 2;
	} else {
		w = n < 0x10000 ? put_be16(w, 0xda, (uint32_t)n) : put_be32(w, 0xdb, (uint32_t)n);
	}
	memcpy(w, s, n);
	return w + n;
}

/* Room for `more` bytes after the events and the closing nil: 0 or -ENOMEM (unchanged). */
static int reserve(struct kvp_events_batch *b, size_t more)
{
	size_t need = KVP_EVENTS_BATCH_HEAD + b->len + more + 1, cap;
	uint8_t *p;

	if (need <= b->cap)
		return 0;
	cap = b->cap ? b->cap : 4096;
	while (cap < need)
		cap *= 2;
	p = realloc(b->body, cap);
	if (!p)
		return -ENOMEM;
	b->body = p;
	b->cap = cap;
	return 0;
}

int kvp_events_batch_page(struct kvp_events_batch *b, const struct kvp_events_page *pg)
{
	size_t slen = b->source ? strlen(b->source) : 0;
	enum kvp_events_medium m = pg->medium;
	uint8_t *w0, *w;

	if ((unsigned)m >= KVP_EVENTS_MEDIUM_MAX)
		return -EINVAL;
	if (reserve(b, EVENT_FIXED_MAX + pg->klen + pg->plen + (size_t)pg->ntokens * HDR_MAX +
			       slen) < 0)
		return -ENOMEM;
	w0 = w = b->body + KVP_EVENTS_BATCH_HEAD + b->len;
	if (pg->stored) {
		/* map 16 whatever the count, as msgspec writes a struct of more than 15 fields */
		w = put_be16(w, 0xde, 9u + (b->source != NULL));
		PUT(w, "\xa4type\xab"
		       "BlockStored\xac"
		       "block_hashes\x91");
		w = put_bin(w, pg->key, pg->klen);
		PUT(w, "\xb1parent_block_hash");
		if (pg->plen)
			w = put_bin(w, pg->parent, pg->plen);
		else
			*w++ = 0xc0;
		PUT(w, "\xa9token_ids");
		w = put_array_hdr(w, pg->ntokens);
		for (uint32_t i = 0; i < pg->ntokens; i++)
			w = put_uint(w, pg->tokens[i]);
		PUT(w, "\xaa"
		       "block_size");
		w = put_uint(w, pg->block_size);
		w = put_tail(w, &g_stored_tail[m]);
	} else {
		*w++ = (uint8_t)(0x80 | (4u + (b->source != NULL)));
		PUT(w, "\xa4type\xac"
		       "BlockRemoved\xac"
		       "block_hashes\x91");
		w = put_bin(w, pg->key, pg->klen);
		w = put_tail(w, &g_removed_tail[m]);
	}
	if (b->source) {
		PUT(w, "\xa9ownership");
		w = put_str(w, b->source, slen);
	}
	b->len += (size_t)(w - w0);
	b->n++;
	return 0;
}

int kvp_events_batch_cleared(struct kvp_events_batch *b)
{
	static const char cleared[] = "\x81\xa4type\xb0"
				      "AllBlocksCleared";
	uint8_t *w;

	if (reserve(b, sizeof(cleared)) < 0)
		return -ENOMEM;
	w = b->body + KVP_EVENTS_BATCH_HEAD + b->len;
	PUT(w, cleared);
	b->len += sizeof(cleared) - 1;
	b->n++;
	return 0;
}

/* The batch's header, [ts, [ of n events: into the end of head (KVP_EVENTS_BATCH_HEAD bytes);
 * returns where it starts. */
static uint8_t *put_header(uint8_t *head, double ts, uint32_t n)
{
	uint8_t tmp[KVP_EVENTS_BATCH_HEAD], *w = tmp;
	uint64_t bits;
	size_t len;

	memcpy(&bits, &ts, sizeof(bits));
	*w++ = 0x93;
	*w++ = 0xcb;
	for (int i = 7; i >= 0; i--)
		*w++ = (uint8_t)(bits >> (8 * i));
	w = put_array_hdr(w, n);
	len = (size_t)(w - tmp);
	memcpy(head + KVP_EVENTS_BATCH_HEAD - len, tmp, len);
	return head + KVP_EVENTS_BATCH_HEAD - len;
}

int kvp_events_batch_encode(const struct kvp_events_batch *b, double ts, uint8_t **out,
			    size_t *outlen)
{
	uint8_t head[KVP_EVENTS_BATCH_HEAD], *h = put_header(head, ts, b->n), *p;
	size_t hl = (size_t)(head + sizeof(head) - h);

	p = malloc(hl + b->len + 1);
	if (!p)
		return -ENOMEM;
	memcpy(p, h, hl);
	if (b->len)
		memcpy(p + hl, b->body + KVP_EVENTS_BATCH_HEAD, b->len);
	p[hl + b->len] = 0xc0; /* data_parallel_rank */
	*out = p;
	*outlen = hl + b->len + 1;
	return 0;
}

const uint8_t *kvp_events_batch_payload(struct kvp_events_batch *b, double ts, size_t *len)
{
	uint8_t *h;

	if (reserve(b, 0) < 0)
		return NULL;
	h = put_header(b->body, ts, b->n);
	b->body[KVP_EVENTS_BATCH_HEAD + b->len] = 0xc0; /* data_parallel_rank */
	*len = (size_t)(b->body + KVP_EVENTS_BATCH_HEAD + b->len + 1 - h);
	return h;
}

void kvp_events_batch_reset(struct kvp_events_batch *b)
{
	b->len = 0;
	b->n = 0;
}

void kvp_events_batch_free(struct kvp_events_batch *b)
{
	if (!b)
		return;
	free(b->body);
	b->body = NULL;
	b->len = b->cap = 0;
	b->n = 0;
}
