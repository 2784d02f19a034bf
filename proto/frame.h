/* frame.h - framing shared by kvpoold and libkvpool: 4-byte little-endian length + one
 * protobuf message, reassembled from partial and merged reads. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "kvpool.pb-c.h"

#define KVP_FRAME_HDR 4u
/* Largest message either side accepts: a Match of 512K tokens fits with room to spare. */
#define KVP_FRAME_MAX (4u << 20)

/* Reassembly buffer of one stream. */
struct kvp_frame_buf {
	uint8_t *data;
	size_t len; /* bytes held */
	size_t off; /* bytes already consumed */
	size_t cap;
};

void kvp_frame_buf_init(struct kvp_frame_buf *b);
/* Accepts a buffer never initialised with data. */
void kvp_frame_buf_release(struct kvp_frame_buf *b);
/* Appends n bytes. Returns 0, -ENOMEM, or -EMSGSIZE when the unconsumed bytes would exceed
 * one maximal frame plus its header (the peer is not respecting the limit). */
int kvp_frame_buf_append(struct kvp_frame_buf *b, const void *p, size_t n);
/* Where to read into directly: makes room for at least `want` bytes and returns a pointer to
 * the free tail, or NULL on ENOMEM or when more than a maximal frame is already held. Call kvp_frame_buf_commit with what was read. */
uint8_t *kvp_frame_buf_space(struct kvp_frame_buf *b, size_t want, size_t *avail);
void kvp_frame_buf_commit(struct kvp_frame_buf *b, size_t n);
/* The next complete frame's payload. Returns 1 and sets *payload and *len when one is complete
 * (valid until the next call on b), 0 when more bytes are needed, -EMSGSIZE when the header
 * announces more than KVP_FRAME_MAX (the stream cannot be resynchronised). */
int kvp_frame_next(struct kvp_frame_buf *b, const uint8_t **payload, uint32_t *len);
/* Bytes of an incomplete frame held (0 when the buffer ends on a frame boundary). */
size_t kvp_frame_pending(const struct kvp_frame_buf *b);

/* Packs msg as one frame into a new malloc'ed buffer. Returns 0 and sets *out and *outlen,
 * -EMSGSIZE when the message exceeds KVP_FRAME_MAX, -ENOMEM. */
int kvp_frame_pack(const ProtobufCMessage *msg, uint8_t **out, size_t *outlen);

/* Decoding helpers: NULL when the payload is not a valid message. Free with the matching
 * kvpool__request__free_unpacked / kvpool__response__free_unpacked(m, NULL). */
Kvpool__Request *kvp_frame_decode_request(const uint8_t *payload, uint32_t len);
Kvpool__Response *kvp_frame_decode_response(const uint8_t *payload, uint32_t len);
