/* frame.c - length-prefixed protobuf frames: reassembly and packing. */
#include "frame.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static uint32_t get_le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void put_le32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
	p[2] = (uint8_t)(v >> 16);
	p[3] = (uint8_t)(v >> 24);
}

void kvp_frame_buf_init(struct kvp_frame_buf *b)
{
	memset(b, 0, sizeof(*b));
}

void kvp_frame_buf_release(struct kvp_frame_buf *b)
{
	free(b->data);
	kvp_frame_buf_init(b);
}

/* Moves unconsumed bytes to the front and grows the buffer to hold `need` more. */
static int reserve(struct kvp_frame_buf *b, size_t need)
{
	size_t held = b->len - b->off;
	size_t cap;
	uint8_t *d;

	if (b->off) {
		memmove(b->data, b->data + b->off, held);
		b->len = held;
		b->off = 0;
	}
	if (b->len + need <= b->cap)
		return 0;
	cap = b->cap ? b->cap : 4096;
	while (cap < b->len + need)
		cap *= 2;
	d = realloc(b->data, cap);
	if (!d)
		return -ENOMEM;
	b->data = d;
	b->cap = cap;
	return 0;
}

int kvp_frame_buf_append(struct kvp_frame_buf *b, const void *p, size_t n)
{
	int r;

	if (b->len - b->off + n > (size_t)KVP_FRAME_MAX + KVP_FRAME_HDR + 65536)
		return -EMSGSIZE;
	r = reserve(b, n);
	if (r < 0)
		return r;
	memcpy(b->data + b->len, p, n);
	b->len += n;
	return 0;
}

uint8_t *kvp_frame_buf_space(struct kvp_frame_buf *b, size_t want, size_t *avail)
{
	if (b->len - b->off > (size_t)KVP_FRAME_MAX + KVP_FRAME_HDR || reserve(b, want) < 0)
		return NULL;
	*avail = b->cap - b->len;
	return b->data + b->len;
}

void kvp_frame_buf_commit(struct kvp_frame_buf *b, size_t n)
{
	b->len += n;
}

int kvp_frame_next(struct kvp_frame_buf *b, const uint8_t **payload, uint32_t *len)
{
	size_t held = b->len - b->off;
	uint32_t n;

	if (held < KVP_FRAME_HDR)
		return 0;
	n = get_le32(b->data + b->off);
	if (n > KVP_FRAME_MAX)
		return -EMSGSIZE;
	if (held - KVP_FRAME_HDR < n)
		return 0;
	*payload = b->data + b->off + KVP_FRAME_HDR;
	*len = n;
	b->off += KVP_FRAME_HDR + n;
	if (b->off == b->len)
		b->off = b->len = 0; /* payload stays readable: nothing is written before the next call */
	return 1;
}

size_t kvp_frame_pending(const struct kvp_frame_buf *b)
{
	return b->len - b->off;
}

int kvp_frame_pack(const ProtobufCMessage *msg, uint8_t **out, size_t *outlen)
{
	size_t n = protobuf_c_message_get_packed_size(msg);
	uint8_t *buf;

	if (n > KVP_FRAME_MAX)
		return -EMSGSIZE;
	buf = malloc(KVP_FRAME_HDR + n);
	if (!buf)
		return -ENOMEM;
	put_le32(buf, (uint32_t)n);
	protobuf_c_message_pack(msg, buf + KVP_FRAME_HDR);
	*out = buf;
	*outlen = KVP_FRAME_HDR + n;
	return 0;
}

Kvpool__Request *kvp_frame_decode_request(const uint8_t *payload, uint32_t len)
{
	return kvpool__request__unpack(NULL, len, payload);
}

Kvpool__Response *kvp_frame_decode_response(const uint8_t *payload, uint32_t len)
{
	return kvpool__response__unpack(NULL, len, payload);
}
