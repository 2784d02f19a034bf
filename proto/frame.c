/* frame.c - length-prefixed protobuf frames: reassembly and packing. */
#include "frame.h"
#include "frame_limit.h"

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__)
#define KVP_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVP_ASAN 1
#endif
#endif
#ifdef KVP_ASAN
#include <sanitizer/asan_interface.h>
#define POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define POISON(p, n) ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

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
		b->off = b->len =
			0; /* payload stays readable: nothing is written before the next call */
	return 1;
}

size_t kvp_frame_pending(const struct kvp_frame_buf *b)
{
	return b->len - b->off;
}

bool kvp_frame_ready(const struct kvp_frame_buf *b)
{
	size_t held = b->len - b->off;
	uint32_t n;

	if (held < KVP_FRAME_HDR)
		return false;
	n = get_le32(b->data + b->off);
	return n > KVP_FRAME_MAX || held - KVP_FRAME_HDR >= n;
}

size_t kvp_frame_buf_shrink(struct kvp_frame_buf *b, size_t keep)
{
	size_t held = b->len - b->off, cap = keep > held ? keep : held;
	uint8_t *d;

	if (b->cap <= cap)
		return b->cap;
	if (b->off) {
		memmove(b->data, b->data + b->off, held);
		b->len = held;
		b->off = 0;
	}
	if (cap == 0) {
		free(b->data);
		b->data = NULL;
		b->cap = b->len = 0;
		return 0;
	}
	d = realloc(b->data, cap);
	if (d) {
		b->data = d;
		b->cap = cap;
	}
	return b->cap;
}

int kvp_frame_pack(const ProtobufCMessage *msg, uint8_t **out, size_t *outlen)
{
	struct kvp_frame_plan plan;
	size_t n = kvp_frame_plan(&plan, msg);
	uint8_t *buf;

	if (n > KVP_FRAME_HDR + KVP_FRAME_MAX)
		return -EMSGSIZE;
	buf = malloc(n);
	if (!buf)
		return -ENOMEM;
	*outlen = kvp_frame_pack_plan(&plan, buf);
	*out = buf;
	return 0;
}

/*
 * Envelope codec. Request and Response are envelopes: an id, (Response) a Status, and one member
 * of a 19-way oneof, each a plain uint64 or a sub-message. protobuf-c sizes a message, then packs
 * it, sizing every sub-message again on the way, and unpacks through its generic field tables.
 * Here the envelope is walked once, each sub-message is sized once (a packed list is walked once
 * more to write it), and decoding goes straight to the one sub-message present; plain
 * sub-messages (above) are packed and unpacked here too, others by protobuf-c. The bytes
 * written are the ones protobuf_c_message_pack writes, and anything but the plain shape (unknown,
 * repeated or out-of-type fields, a 10-byte varint) is decoded by protobuf-c itself, so both
 * paths give the same message; tests/unit/test_frame.c and tests/fuzz/fuzz_codec.c check both
 * against protobuf-c.
 */
static size_t varint_size(uint64_t v)
{
	size_t n = 1;

	while (v >= 0x80) {
		v >>= 7;
		n++;
	}
	return n;
}

static uint8_t *put_varint(uint8_t *p, uint64_t v)
{
	while (v >= 0x80) {
		*p++ = (uint8_t)(v | 0x80);
		v >>= 7;
	}
	*p++ = (uint8_t)v;
	return p;
}

static bool in_oneof(const ProtobufCFieldDescriptor *f)
{
	return (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) != 0;
}

/*
 * Plain sub-messages. A sub-message whose set fields are all proto3 scalars (uint32, uint64,
 * enum and int32 of non-negative value, bool), strings, or packed repeated uint32 (the page
 * and token lists of the hot calls) is sized and packed here, with protobuf-c's exact bytes:
 * fields in descriptor order, a zero scalar, empty string or empty list not written. It is
 * unpacked here when each field on the wire is one of those (strings excepted) in its canonical
 * form, at most once, and known; anything else (a nested message, a oneof member, a string, an
 * unpacked or empty list, an over-long varint, an unknown field) goes to protobuf-c. The value
 * is protobuf-c's in every case: tests/unit/test_frame.c compares both.
 */
static size_t u32_size(uint32_t v)
{
	return varint_size(v);
}

/* The packed size of sub-message m, or SIZE_MAX when it is not plain. */
static size_t plain_size(const ProtobufCMessage *m)
{
	const ProtobufCMessageDescriptor *d = m->descriptor;
	const char *base = (const char *)m;
	size_t n = 0;

	if (m->n_unknown_fields)
		return SIZE_MAX;
	for (unsigned i = 0; i < d->n_fields; i++) {
		const ProtobufCFieldDescriptor *f = &d->fields[i];
		const void *mb = base + f->offset;
		size_t tag = varint_size((uint64_t)f->id << 3);

		if (in_oneof(f)) {
			if (*(const uint32_t *)(base + f->quantifier_offset) == f->id)
				return SIZE_MAX;
			continue;
		}
		if (f->label == PROTOBUF_C_LABEL_REPEATED) {
			size_t cnt = *(const size_t *)(base + f->quantifier_offset), body = 0;
			const uint32_t *a = *(uint32_t *const *)mb;

			if (f->type != PROTOBUF_C_TYPE_UINT32 ||
			    !(f->flags & PROTOBUF_C_FIELD_FLAG_PACKED))
				return SIZE_MAX;
			for (size_t k = 0; k < cnt; k++)
				body += u32_size(a[k]);
			if (cnt)
				n += tag + varint_size(body) + body;
			continue;
		}
		if (f->label != PROTOBUF_C_LABEL_NONE)
			return SIZE_MAX;
		switch (f->type) {
		case PROTOBUF_C_TYPE_INT32:
		case PROTOBUF_C_TYPE_ENUM:
			if (*(const int32_t *)mb < 0)
				return SIZE_MAX;
			/* fall through */
		case PROTOBUF_C_TYPE_UINT32:
			if (*(const uint32_t *)mb)
				n += tag + u32_size(*(const uint32_t *)mb);
			break;
		case PROTOBUF_C_TYPE_UINT64:
			if (*(const uint64_t *)mb)
				n += tag + varint_size(*(const uint64_t *)mb);
			break;
		case PROTOBUF_C_TYPE_BOOL:
			if (*(const protobuf_c_boolean *)mb)
				n += tag + 1;
			break;
		case PROTOBUF_C_TYPE_STRING: {
			const char *s = *(char *const *)mb;
			size_t l = s ? strlen(s) : 0;

			if (l)
				n += tag + varint_size(l) + l;
			break;
		}
		default: return SIZE_MAX;
		}
	}
	return n;
}

/* Packs a sub-message plain_size accepted; returns the bytes written. */
static size_t plain_pack(const ProtobufCMessage *m, uint8_t *out)
{
	const ProtobufCMessageDescriptor *d = m->descriptor;
	const char *base = (const char *)m;
	uint8_t *w = out;

	for (unsigned i = 0; i < d->n_fields; i++) {
		const ProtobufCFieldDescriptor *f = &d->fields[i];
		const void *mb = base + f->offset;
		uint64_t tag = (uint64_t)f->id << 3;

		if (in_oneof(f))
			continue;
		if (f->label == PROTOBUF_C_LABEL_REPEATED) {
			size_t cnt = *(const size_t *)(base + f->quantifier_offset), body = 0;
			const uint32_t *a = *(uint32_t *const *)mb;

			if (!cnt)
				continue;
			for (size_t k = 0; k < cnt; k++)
				body += u32_size(a[k]);
			w = put_varint(w, tag | 2);
			w = put_varint(w, body);
			for (size_t k = 0; k < cnt; k++)
				w = put_varint(w, a[k]);
			continue;
		}
		switch (f->type) {
		case PROTOBUF_C_TYPE_INT32:
		case PROTOBUF_C_TYPE_ENUM:
		case PROTOBUF_C_TYPE_UINT32:
			if (*(const uint32_t *)mb) {
				w = put_varint(w, tag);
				w = put_varint(w, *(const uint32_t *)mb);
			}
			break;
		case PROTOBUF_C_TYPE_UINT64:
			if (*(const uint64_t *)mb) {
				w = put_varint(w, tag);
				w = put_varint(w, *(const uint64_t *)mb);
			}
			break;
		case PROTOBUF_C_TYPE_BOOL:
			if (*(const protobuf_c_boolean *)mb) {
				w = put_varint(w, tag);
				*w++ = 1;
			}
			break;
		default: { /* PROTOBUF_C_TYPE_STRING: plain_size let nothing else through */
			const char *s = *(char *const *)mb;
			size_t l = s ? strlen(s) : 0;

			if (l) {
				w = put_varint(w, tag | 2);
				w = put_varint(w, l);
				memcpy(w, s, l);
				w += l;
			}
			break;
		}
		}
	}
	return (size_t)(w - out);
}

static void *alloc_with(ProtobufCAllocator *a, size_t n)
{
	return a ? a->alloc(a->allocator_data, n) : malloc(n);
}

/* Starts a fast unpack: a fresh message of d (fields tracked in a 64-bit mask), or NULL with
 * *fallback set for protobuf-c (too many fields) or unset (out of memory). */
static ProtobufCMessage *fast_begin(const ProtobufCMessageDescriptor *d, ProtobufCAllocator *a,
				    bool *fallback)
{
	ProtobufCMessage *m;

	*fallback = d->n_fields > 64;
	if (*fallback)
		return NULL;
	m = alloc_with(a, d->sizeof_message);
	if (m)
		d->message_init(m);
	return m;
}

/* Reads the tag at *p (< end) and returns the field it names, with its wire type in *wire; NULL
 * (protobuf-c must decide) for a bad tag, an unknown field, or a field already seen (seen: a bit
 * per field index, at most 64 fields, as fast_begin ensures). */
static const ProtobufCFieldDescriptor *next_field(const ProtobufCMessageDescriptor *d,
						  const uint8_t **p, const uint8_t *end,
						  uint64_t *seen, unsigned *wire)
{
	const ProtobufCFieldDescriptor *f;
	uint64_t tag, bit;

	if (kvp_frame_varint(p, end, 5, &tag) < 0 || tag >> 3 == 0 || tag >> 3 > UINT32_MAX)
		return NULL;
	f = protobuf_c_message_descriptor_get_field(d, (unsigned)(tag >> 3));
	if (!f)
		return NULL;
	bit = (uint64_t)1 << (f - d->fields);
	if (*seen & bit)
		return NULL; /* a field twice: protobuf-c merges or overrides */
	*seen |= bit;
	*wire = (unsigned)(tag & 7);
	return f;
}

/* Unpacks a plain sub-message of descriptor d from data[0, len). Returns the message, or NULL
 * with *fallback set when protobuf-c must unpack it (unset: out of memory). */
static ProtobufCMessage *plain_unpack(const ProtobufCMessageDescriptor *d, ProtobufCAllocator *a,
				      const uint8_t *data, size_t len, bool *fallback)
{
	const uint8_t *p = data, *end = data + len;
	uint64_t seen = 0;
	unsigned wire;
	ProtobufCMessage *m;

	m = fast_begin(d, a, fallback);
	if (!m)
		return NULL;
	while (p < end) {
		const ProtobufCFieldDescriptor *f = next_field(d, &p, end, &seen, &wire);
		uint64_t v;
		void *mb;

		if (!f || in_oneof(f))
			goto fallback;
		mb = (char *)m + f->offset;
		if (f->label == PROTOBUF_C_LABEL_REPEATED) {
			const uint8_t *q, *stop;
			size_t cnt = 0;
			uint32_t *arr;

			if (f->type != PROTOBUF_C_TYPE_UINT32 || wire != 2 ||
			    kvp_frame_varint(&p, end, 5, &v) < 0 || v == 0 ||
			    v > (uint64_t)(end - p))
				goto fallback;
			stop = p + v;
			for (q = p; q < stop; q++)
				cnt += !(*q & 0x80);
			if (stop[-1] & 0x80)
				goto fallback;
			arr = alloc_with(a, cnt * sizeof(uint32_t));
			if (!arr) {
				*fallback = false;
				goto fail;
			}
			*(uint32_t **)mb = arr;
			*(size_t *)((char *)m + f->quantifier_offset) = cnt;
			for (size_t k = 0; k < cnt; k++) {
				if (kvp_frame_varint(&p, stop, 5, &v) < 0)
					goto fallback;
				arr[k] = (uint32_t)v;
			}
			continue;
		}
		if (f->label != PROTOBUF_C_LABEL_NONE || wire != 0)
			goto fallback;
		switch (f->type) {
		case PROTOBUF_C_TYPE_INT32:
		case PROTOBUF_C_TYPE_ENUM:
		case PROTOBUF_C_TYPE_UINT32:
			if (kvp_frame_varint(&p, end, 5, &v) < 0)
				goto fallback;
			*(uint32_t *)mb = (uint32_t)v;
			break;
		case PROTOBUF_C_TYPE_UINT64:
			if (kvp_frame_varint(&p, end, 9, &v) < 0)
				goto fallback;
			*(uint64_t *)mb = v;
			break;
		case PROTOBUF_C_TYPE_BOOL:
			if (kvp_frame_varint(&p, end, 5, &v) < 0)
				goto fallback;
			*(protobuf_c_boolean *)mb = v != 0;
			break;
		default: goto fallback;
		}
	}
	*fallback = false;
	return m;
fallback:
	*fallback = true;
fail:
	protobuf_c_message_free_unpacked(m, a);
	return NULL;
}

typedef ProtobufCMessage *fast_unpack_fn(const ProtobufCMessageDescriptor *d, ProtobufCAllocator *a,
					 const uint8_t *data, size_t len, bool *fallback);

/* Unpacks with fast, or with protobuf-c where fast leaves the bytes to it. */
static ProtobufCMessage *unpack(fast_unpack_fn *fast, const ProtobufCMessageDescriptor *d,
				ProtobufCAllocator *a, const uint8_t *data, size_t len)
{
	bool fallback;
	ProtobufCMessage *m = fast(d, a, data, len, &fallback);

	if (m || !fallback)
		return m;
	return protobuf_c_message_unpack(d, a, len, data);
}

static bool is_envelope(const ProtobufCMessageDescriptor *d)
{
	return d == &kvpool__request__descriptor || d == &kvpool__response__descriptor;
}

static size_t pack_generic(const ProtobufCMessage *msg, uint8_t *buf)
{
	size_t n = protobuf_c_message_pack(msg, buf + KVP_FRAME_HDR);

	put_le32(buf, (uint32_t)n);
	return KVP_FRAME_HDR + n;
}

/* Adds field f of msg to the plan, if present. Returns 0, or -1 when f is not of a plain kind. */
static int plan_field(struct kvp_frame_plan *p, const ProtobufCFieldDescriptor *f, const char *base,
		      size_t *body)
{
	struct kvp_frame_part *part = &p->part[p->n];

	if (f->label != PROTOBUF_C_LABEL_NONE || p->n == KVP_FRAME_PARTS)
		return -1;
	if (f->type == PROTOBUF_C_TYPE_UINT64 && !in_oneof(f)) {
		part->v = *(const uint64_t *)(base + f->offset);
		if (!part->v)
			return 0; /* proto3: a zero scalar is not written */
		part->sub = NULL;
		*body += varint_size((uint64_t)f->id << 3) + varint_size(part->v);
	} else if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
		part->sub = *(ProtobufCMessage *const *)(base + f->offset);
		if (!part->sub)
			return 0;
		part->v = plain_size(part->sub);
		part->plain = part->v != SIZE_MAX;
		if (!part->plain)
			part->v = protobuf_c_message_get_packed_size(part->sub);
		*body += varint_size((uint64_t)f->id << 3 | 2) + varint_size(part->v) + part->v;
	} else {
		return -1;
	}
	part->f = f;
	p->n++;
	return 0;
}

/* An envelope's fields, in number order, are plain fields, then the members of its one oneof
 * (test_frame checks the schema keeps that shape): the plain ones are walked, the oneof member
 * set is looked up by its case, so the 19 others cost nothing. */
size_t kvp_frame_plan(struct kvp_frame_plan *p, const ProtobufCMessage *msg)
{
	const ProtobufCMessageDescriptor *d = msg->descriptor;
	const char *base = (const char *)msg;
	size_t body = 0;
	unsigned i;

	p->msg = msg;
	p->n = 0;
	if (!is_envelope(d) || msg->n_unknown_fields)
		goto generic;
	for (i = 0; i < d->n_fields && !in_oneof(&d->fields[i]); i++)
		if (plan_field(p, &d->fields[i], base, &body) < 0)
			goto generic;
	if (i < d->n_fields) {
		uint32_t which = *(const uint32_t *)(base + d->fields[i].quantifier_offset);
		const ProtobufCFieldDescriptor *f;

		if (which) {
			f = protobuf_c_message_descriptor_get_field(d, which);
			if (!f || !in_oneof(f) || plan_field(p, f, base, &body) < 0)
				goto generic;
		}
	}
	p->generic = false;
	p->total = KVP_FRAME_HDR + body;
	return p->total;
generic:
	p->generic = true;
	p->total = KVP_FRAME_HDR + protobuf_c_message_get_packed_size(msg);
	return p->total;
}

size_t kvp_frame_pack_plan(const struct kvp_frame_plan *p, uint8_t *buf)
{
	uint8_t *w = buf + KVP_FRAME_HDR;

	if (p->generic)
		return pack_generic(p->msg, buf);
	for (unsigned i = 0; i < p->n; i++) {
		const struct kvp_frame_part *part = &p->part[i];

		if (!part->sub) {
			w = put_varint(w, (uint64_t)part->f->id << 3);
			w = put_varint(w, part->v);
		} else {
			w = put_varint(w, (uint64_t)part->f->id << 3 | 2);
			w = put_varint(w, part->v);
			w += part->plain ? plain_pack(part->sub, w)
					 : protobuf_c_message_pack(part->sub, w);
		}
	}
	put_le32(buf, (uint32_t)(w - buf - KVP_FRAME_HDR));
	return (size_t)(w - buf);
}

/* Decodes an envelope of descriptor d with allocator a (NULL: malloc) when the payload has the
 * plain shape. Returns the message, or NULL with *fallback set when protobuf-c must decode it
 * (or unset when the payload is invalid either way). */
static ProtobufCMessage *envelope_unpack(const ProtobufCMessageDescriptor *d, ProtobufCAllocator *a,
					 const uint8_t *data, size_t len, bool *fallback)
{
	const uint8_t *p = data, *end = data + len;
	ProtobufCMessage *m;
	uint32_t seen_oneof = 0;
	uint64_t seen = 0; /* bit per field index (envelopes have fewer than 64) */
	unsigned wire;

	m = fast_begin(d, a, fallback);
	if (!m)
		return NULL;
	while (p < end) {
		const ProtobufCFieldDescriptor *f = next_field(d, &p, end, &seen, &wire);
		uint64_t v;

		if (!f || f->label != PROTOBUF_C_LABEL_NONE)
			goto fallback;
		if (f->type == PROTOBUF_C_TYPE_UINT64 && !in_oneof(f) && wire == 0) {
			if (kvp_frame_varint(&p, end, 9, &v) < 0)
				goto fallback;
			*(uint64_t *)((char *)m + f->offset) = v;
		} else if (f->type == PROTOBUF_C_TYPE_MESSAGE && wire == 2) {
			ProtobufCMessage *sub;

			if (in_oneof(f)) {
				if (seen_oneof)
					goto fallback; /* a second member: the last one wins */
				seen_oneof = f->id;
			}
			if (kvp_frame_varint(&p, end, 5, &v) < 0 || v > (uint64_t)(end - p))
				goto fallback;
			sub = unpack(plain_unpack, f->descriptor, a, p, (size_t)v);
			if (!sub) {
				/* protobuf-c fails the whole message the same way */
				*fallback = false;
				goto fail;
			}
			*(ProtobufCMessage **)((char *)m + f->offset) = sub;
			if (in_oneof(f))
				*(uint32_t *)((char *)m + f->quantifier_offset) = f->id;
			p += v;
		} else {
			goto fallback;
		}
	}
	*fallback = false;
	return m;
fallback:
	*fallback = true;
fail:
	protobuf_c_message_free_unpacked(m, a);
	return NULL;
}

/* A Request is counted first (frame_limit.h): a crowded call comes back unpacked, a crowded
 * Request not at all. */
static ProtobufCMessage *decode(const ProtobufCMessageDescriptor *d, ProtobufCAllocator *a,
				const uint8_t *payload, uint32_t len)
{
	uint64_t id = 0;
	uint32_t call = 0;
	int c;

	if (d == &kvpool__request__descriptor) {
		c = kvp_frame_limit_scan(payload, len, &id, &call);
		if (c < 0)
			return NULL;
		if (c > 0)
			return kvp_frame_limit_stub(a, id, call);
	}
	return unpack(envelope_unpack, d, a, payload, len);
}

/* Every piece is aligned for any type protobuf-c stores in it. */
#define ARENA_ALIGN _Alignof(max_align_t)

union big_hdr {
	void *next;
	max_align_t align;
};

static void *arena_alloc(void *data, size_t n)
{
	struct kvp_arena *a = data;
	size_t want = (n + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
	union big_hdr *h;
	void *p;

	if (want >= n && want <= a->cap - a->used) {
		p = a->block + a->used;
		a->used += want;
		UNPOISON(p, n);
		return p;
	}
	if (n > SIZE_MAX - sizeof(*h) || (a->deny && a->deny()) || !(h = malloc(sizeof(*h) + n))) {
		a->oom = true;
		return NULL;
	}
	h->next = a->big;
	a->big = h;
	return h + 1;
}

/* Pieces go back all at once in kvp_arena_reset. */
static void arena_free(void *data, void *p)
{
	(void)data;
	(void)p;
}

int kvp_arena_init(struct kvp_arena *a, size_t cap)
{
	memset(a, 0, sizeof(*a));
	a->block = aligned_alloc(ARENA_ALIGN, (cap + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1));
	if (!a->block)
		return -ENOMEM;
	a->cap = cap & ~(size_t)(ARENA_ALIGN - 1);
	a->pa.alloc = arena_alloc;
	a->pa.free = arena_free;
	a->pa.allocator_data = a;
	POISON(a->block, a->cap);
	return 0;
}

void kvp_arena_reset(struct kvp_arena *a)
{
	while (a->big) {
		union big_hdr *h = a->big;

		a->big = h->next;
		free(h);
	}
	if (a->used)
		POISON(a->block, a->used);
	a->used = 0;
	a->oom = false;
}

void kvp_arena_release(struct kvp_arena *a)
{
	kvp_arena_reset(a);
	if (a->block)
		UNPOISON(a->block, a->cap);
	free(a->block);
	memset(a, 0, sizeof(*a));
}

Kvpool__Request *kvp_frame_decode_request_in(struct kvp_arena *a, const uint8_t *payload,
					     uint32_t len)
{
	return (Kvpool__Request *)decode(&kvpool__request__descriptor, &a->pa, payload, len);
}

Kvpool__Request *kvp_frame_decode_request(const uint8_t *payload, uint32_t len)
{
	return (Kvpool__Request *)decode(&kvpool__request__descriptor, NULL, payload, len);
}

Kvpool__Response *kvp_frame_decode_response(const uint8_t *payload, uint32_t len)
{
	return (Kvpool__Response *)decode(&kvpool__response__descriptor, NULL, payload, len);
}

bool kvp_frame_call_unpacked(const Kvpool__Request *req)
{
	const ProtobufCFieldDescriptor *f;

	if (req->call_case == KVPOOL__REQUEST__CALL__NOT_SET)
		return false;
	f = protobuf_c_message_descriptor_get_field(&kvpool__request__descriptor,
						    (unsigned)req->call_case);
	return f && f->type == PROTOBUF_C_TYPE_MESSAGE &&
	       !*(ProtobufCMessage *const *)((const char *)req + f->offset);
}
