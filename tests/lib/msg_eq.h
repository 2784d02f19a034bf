/* msg_eq.h - field-by-field equality of two protobuf-c messages of one descriptor, walked from
 * the descriptor: what each decoder stored, not what it packs back to (a bool stored as 2 packs
 * like 1). For the codec's differential tests (test_frame, fuzz_codec). */
#pragma once
#include <protobuf-c/protobuf-c.h>
#include <stdbool.h>
#include <string.h>

static bool h_msg_eq(const ProtobufCMessage *a, const ProtobufCMessage *b);

static inline size_t h_scalar_size(ProtobufCType t)
{
	switch (t) {
	case PROTOBUF_C_TYPE_INT64:
	case PROTOBUF_C_TYPE_SINT64:
	case PROTOBUF_C_TYPE_SFIXED64:
	case PROTOBUF_C_TYPE_UINT64:
	case PROTOBUF_C_TYPE_FIXED64:
	case PROTOBUF_C_TYPE_DOUBLE: return 8;
	case PROTOBUF_C_TYPE_BOOL: return sizeof(protobuf_c_boolean);
	case PROTOBUF_C_TYPE_STRING:
	case PROTOBUF_C_TYPE_BYTES:
	case PROTOBUF_C_TYPE_MESSAGE: return 0;
	default: return 4;
	}
}

/* One value of field f at pa and pb. */
static inline bool h_value_eq(const ProtobufCFieldDescriptor *f, const void *pa, const void *pb)
{
	switch (f->type) {
	case PROTOBUF_C_TYPE_STRING: {
		const char *x = *(char *const *)pa, *y = *(char *const *)pb;

		return (!x || !y) ? x == y : strcmp(x, y) == 0;
	}
	case PROTOBUF_C_TYPE_BYTES: {
		const ProtobufCBinaryData *x = pa, *y = pb;

		return x->len == y->len && (!x->len || memcmp(x->data, y->data, x->len) == 0);
	}
	case PROTOBUF_C_TYPE_MESSAGE: {
		const ProtobufCMessage *x = *(ProtobufCMessage *const *)pa;
		const ProtobufCMessage *y = *(ProtobufCMessage *const *)pb;

		return (!x || !y) ? x == y : h_msg_eq(x, y);
	}
	default: return memcmp(pa, pb, h_scalar_size(f->type)) == 0;
	}
}

static inline size_t h_elem_size(const ProtobufCFieldDescriptor *f)
{
	switch (f->type) {
	case PROTOBUF_C_TYPE_STRING: return sizeof(char *);
	case PROTOBUF_C_TYPE_BYTES: return sizeof(ProtobufCBinaryData);
	case PROTOBUF_C_TYPE_MESSAGE: return sizeof(ProtobufCMessage *);
	default: return h_scalar_size(f->type);
	}
}

static bool h_msg_eq(const ProtobufCMessage *a, const ProtobufCMessage *b)
{
	const ProtobufCMessageDescriptor *d = a->descriptor;
	const char *ba = (const char *)a, *bb = (const char *)b;

	if (b->descriptor != d || a->n_unknown_fields != b->n_unknown_fields)
		return false;
	for (unsigned i = 0; i < a->n_unknown_fields; i++) {
		const ProtobufCMessageUnknownField *x = &a->unknown_fields[i],
						   *y = &b->unknown_fields[i];

		if (x->tag != y->tag || x->wire_type != y->wire_type || x->len != y->len ||
		    (x->len && memcmp(x->data, y->data, x->len)))
			return false;
	}
	for (unsigned i = 0; i < d->n_fields; i++) {
		const ProtobufCFieldDescriptor *f = &d->fields[i];
		const void *pa = ba + f->offset, *pb = bb + f->offset;

		if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
			uint32_t ca = *(const uint32_t *)(ba + f->quantifier_offset);

			if (ca != *(const uint32_t *)(bb + f->quantifier_offset))
				return false;
			if (ca == f->id && !h_value_eq(f, pa, pb))
				return false;
			continue;
		}
		if (f->label == PROTOBUF_C_LABEL_REPEATED) {
			size_t n = *(const size_t *)(ba + f->quantifier_offset);
			const char *xa = *(char *const *)pa, *xb = *(char *const *)pb;

			if (n != *(const size_t *)(bb + f->quantifier_offset))
				return false;
			for (size_t k = 0; k < n; k++)
				if (!h_value_eq(f, xa + k * h_elem_size(f),
						xb + k * h_elem_size(f)))
					return false;
			continue;
		}
		if (f->label == PROTOBUF_C_LABEL_OPTIONAL && f->quantifier_offset &&
		    f->type != PROTOBUF_C_TYPE_STRING && f->type != PROTOBUF_C_TYPE_MESSAGE &&
		    memcmp(ba + f->quantifier_offset, bb + f->quantifier_offset,
			   sizeof(protobuf_c_boolean)))
			return false;
		if (!h_value_eq(f, pa, pb))
			return false;
	}
	return true;
}
