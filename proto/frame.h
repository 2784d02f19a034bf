/* frame.h - framing shared by kvpoold and libkvpool: 4-byte little-endian length + one
 * protobuf message, reassembled from partial and merged reads. */
#pragma once
#include <stdbool.h>
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
 * the free tail, or NULL on ENOMEM or when more than a maximal frame is already held. Call
 * kvp_frame_buf_commit with what was read. */
uint8_t *kvp_frame_buf_space(struct kvp_frame_buf *b, size_t want, size_t *avail);
void kvp_frame_buf_commit(struct kvp_frame_buf *b, size_t n);
/* The next complete frame's payload. Returns 1 and sets *payload and *len when one is complete
 * (valid until the next call on b), 0 when more bytes are needed, -EMSGSIZE when the header
 * announces more than KVP_FRAME_MAX (the stream cannot be resynchronised). */
int kvp_frame_next(struct kvp_frame_buf *b, const uint8_t **payload, uint32_t *len);
/* Bytes of an incomplete frame held (0 when the buffer ends on a frame boundary). */
size_t kvp_frame_pending(const struct kvp_frame_buf *b);
/* Whether a complete frame (or a header announcing more than KVP_FRAME_MAX) is held: the
 * next kvp_frame_next answers without more bytes. */
bool kvp_frame_ready(const struct kvp_frame_buf *b);
/* After a large frame: gives back all but max(keep, the bytes held) of the buffer's memory.
 * Returns the capacity now. */
size_t kvp_frame_buf_shrink(struct kvp_frame_buf *b, size_t keep);

/* Packs msg as one frame into a new malloc'ed buffer. Returns 0 and sets *out and *outlen,
 * -EMSGSIZE when the message exceeds KVP_FRAME_MAX, -ENOMEM. */
int kvp_frame_pack(const ProtobufCMessage *msg, uint8_t **out, size_t *outlen);

/* Packing a Request or Response envelope in two steps without sizing anything twice:
 * kvp_frame_plan returns the frame's size (header included), kvp_frame_pack_plan writes it into
 * a buffer of that size and returns it. The bytes are protobuf_c_message_pack's. Any other
 * message goes through protobuf-c. The plan borrows msg: pack before changing it. */
#define KVP_FRAME_PARTS 4
struct kvp_frame_part {
	const ProtobufCFieldDescriptor *f;
	const ProtobufCMessage *sub; /* NULL: a uint64 field of value v */
	uint64_t v;		     /* the value, or the sub-message's packed size */
	bool plain;		     /* sub packs without protobuf-c (frame.c, plain messages) */
};
struct kvp_frame_plan {
	const ProtobufCMessage *msg;
	size_t total;
	bool generic;
	unsigned n;
	struct kvp_frame_part part[KVP_FRAME_PARTS];
};
size_t kvp_frame_plan(struct kvp_frame_plan *p, const ProtobufCMessage *msg);
size_t kvp_frame_pack_plan(const struct kvp_frame_plan *p, uint8_t *buf);

/*
 * Bump allocator for decoding one message at a time. A message decoded through it is never
 * freed field by field: kvp_arena_reset() returns all of it at once. Pieces that do not fit in
 * the block come from malloc and are freed by the reset. Built with AddressSanitizer, reset
 * poisons the block, so a pointer kept into a decoded message past the reset is reported.
 */
struct kvp_arena {
	ProtobufCAllocator pa; /* hand &a->pa to protobuf-c */
	uint8_t *block;
	size_t cap, used;
	void *big; /* malloc'ed pieces, a list through their headers */
	bool oom;  /* a piece could not be had since the last reset: a decode failed for that */
	bool (*deny)(void); /* optional: a spill it answers true for fails (failure injection) */
};

/* Returns 0 or -ENOMEM. */
int kvp_arena_init(struct kvp_arena *a, size_t cap);
void kvp_arena_reset(struct kvp_arena *a);
/* Accepts an arena whose init failed or never ran after a zero fill. */
void kvp_arena_release(struct kvp_arena *a);
/*
 * What one request may make the decoder unpack. The keys of a hash-keyed call are one field
 * occurrence each on the wire (a packed number list, tokens or pages, is one in all), and
 * protobuf-c allocates each as it unpacks it: a call message (the Request's oneof member)
 * holding more than KVP_FRAME_FIELDS_MAX field occurrences is not unpacked. Its Request comes
 * back with the id and the call's case set and the member NULL (kvp_frame_call_unpacked), for
 * the daemon to refuse with a typed LIMIT_EXCEEDED; a Request holding more than that many
 * fields outside its member is not valid. KVP_FRAME_KEYS_MAX is the top of max_keys_per_call's
 * range, so no call the daemon may accept is cut.
 */
#define KVP_FRAME_KEYS_MAX 65536u
#define KVP_FRAME_FIELDS_MAX (KVP_FRAME_KEYS_MAX + 64u)

/* Decodes a Request into a; NULL when the payload is not a valid Request, or (a->oom set) when
 * memory for it ran out. Valid until the next kvp_arena_reset(a). A call message past
 * KVP_FRAME_FIELDS_MAX is left unpacked (above). */
Kvpool__Request *kvp_frame_decode_request_in(struct kvp_arena *a, const uint8_t *payload,
					     uint32_t len);

/* Decoding helpers: NULL when the payload is not a valid message. Free with the matching
 * kvpool__request__free_unpacked / kvpool__response__free_unpacked(m, NULL). A Request's call
 * message past KVP_FRAME_FIELDS_MAX is left unpacked, as kvp_frame_decode_request_in does. */
Kvpool__Request *kvp_frame_decode_request(const uint8_t *payload, uint32_t len);
Kvpool__Response *kvp_frame_decode_response(const uint8_t *payload, uint32_t len);
/* Whether req's call message was left unpacked for holding more than KVP_FRAME_FIELDS_MAX
 * fields: its case is set and its member NULL (protobuf-c never decodes a member so). */
bool kvp_frame_call_unpacked(const Kvpool__Request *req);
