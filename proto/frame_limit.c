/* frame_limit.c - a Request's fields counted on the wire before either decoder allocates
 * anything (frame_limit.h, KVP_FRAME_FIELDS_MAX). A field takes two bytes at least (a tag, then a
 * value or length byte), so a payload or call message of at most twice the bound is never
 * walked. Bytes that are not well-formed stop the walk with no judgement: the decoders refuse
 * them. */
#include "frame_limit.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>

#include "frame.h"

int kvp_frame_varint(const uint8_t **p, const uint8_t *end, unsigned max, uint64_t *v)
{
	uint64_t r = 0;

	for (unsigned i = 0; i < max && *p + i < end; i++) {
		r |= (uint64_t)((*p)[i] & 0x7f) << (7 * i);
		if (!((*p)[i] & 0x80)) {
			*p += i + 1;
			*v = r;
			return 0;
		}
	}
	return -1;
}

/* Skips the value of the field whose tag was read (wire type wire) at *p (< end); a
 * length-delimited one's length goes to *len. Returns 0, or -1 for bytes not well-formed. */
static int skip_value(const uint8_t **p, const uint8_t *end, unsigned wire, uint64_t *len)
{
	uint64_t v;

	*len = 0;
	switch (wire) {
	case 0: return kvp_frame_varint(p, end, 10, &v);
	case 1: v = 8; break;
	case 5: v = 4; break;
	case 2:
		if (kvp_frame_varint(p, end, 10, &v) < 0)
			return -1;
		*len = v;
		break;
	default: return -1;
	}
	if (v > (uint64_t)(end - *p))
		return -1;
	*p += v;
	return 0;
}

/* Whether data[0, len) holds more than KVP_FRAME_FIELDS_MAX fields; the walk stops there, so
 * what follows is not looked at. */
static bool crowded(const uint8_t *p, size_t len)
{
	const uint8_t *end = p + len;
	uint64_t tag, vlen;
	uint32_t n = 0;

	if (len <= 2 * (size_t)KVP_FRAME_FIELDS_MAX)
		return false;
	while (p < end && n <= KVP_FRAME_FIELDS_MAX) {
		if (kvp_frame_varint(&p, end, 10, &tag) < 0 ||
		    skip_value(&p, end, tag & 7, &vlen) < 0)
			return false;
		n++;
	}
	return n > KVP_FRAME_FIELDS_MAX;
}

int kvp_frame_limit_scan(const uint8_t *payload, uint32_t len, uint64_t *id, uint32_t *call)
{
	const ProtobufCMessageDescriptor *d = &kvpool__request__descriptor;
	const uint8_t *p = payload, *end = payload + len;
	uint32_t n = 0;
	int found = 0;

	if (len <= 2 * KVP_FRAME_FIELDS_MAX)
		return 0;
	while (p < end) {
		const ProtobufCFieldDescriptor *f = NULL;
		uint64_t tag, v;

		if (kvp_frame_varint(&p, end, 10, &tag) < 0)
			return 0;
		if (tag >> 3 && tag >> 3 <= UINT32_MAX)
			f = protobuf_c_message_descriptor_get_field(d, (unsigned)(tag >> 3));
		if ((tag & 7) == 0 && f && !(f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF)) {
			if (kvp_frame_varint(&p, end, 10, &v) < 0)
				return 0;
			*id = v;
		} else if (skip_value(&p, end, tag & 7, &v) < 0) {
			return 0;
		} else if ((tag & 7) == 2 && f && (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
			   crowded(p - v, v)) {
			*call = f->id;
			found = 1;
		}
		if (++n > KVP_FRAME_FIELDS_MAX)
			return -1;
	}
	return found;
}

ProtobufCMessage *kvp_frame_limit_stub(ProtobufCAllocator *a, uint64_t id, uint32_t call)
{
	Kvpool__Request *q = a ? a->alloc(a->allocator_data, sizeof(*q)) : malloc(sizeof(*q));

	if (!q)
		return NULL;
	kvpool__request__init(q);
	q->id = id;
	q->call_case = (Kvpool__Request__CallCase)call;
	return &q->base;
}
