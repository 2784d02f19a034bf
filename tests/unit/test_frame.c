/* test_frame.c - framing: split and merged reads, oversized and garbage frames, codec round
 * trips of every call. */
#include <CUnit/Basic.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "frame.h"
#include "msg_eq.h"
#include "suite.h"

static size_t pack_ping(uint8_t *out, uint64_t id, uint64_t nonce)
{
	Kvpool__Request req = KVPOOL__REQUEST__INIT;
	Kvpool__PingReq p = KVPOOL__PING_REQ__INIT;
	uint8_t *buf;
	size_t len;

	req.id = id;
	req.call_case = KVPOOL__REQUEST__CALL_PING;
	req.ping = &p;
	p.nonce = nonce;
	CU_ASSERT_EQUAL_FATAL(kvp_frame_pack(&req.base, &buf, &len), 0);
	memcpy(out, buf, len);
	free(buf);
	return len;
}

static void test_frame_next_split_byte_by_byte(void)
{
	struct kvp_frame_buf b;
	uint8_t f[64];
	size_t n = pack_ping(f, 7, 99);
	const uint8_t *pl;
	uint32_t len;

	kvp_frame_buf_init(&b);
	for (size_t i = 0; i < n; i++) {
		CU_ASSERT_EQUAL(kvp_frame_next(&b, &pl, &len), 0);
		CU_ASSERT_EQUAL(kvp_frame_buf_append(&b, f + i, 1), 0);
	}
	CU_ASSERT_EQUAL_FATAL(kvp_frame_next(&b, &pl, &len), 1);
	{
		Kvpool__Request *r = kvp_frame_decode_request(pl, len);

		CU_ASSERT_PTR_NOT_NULL_FATAL(r);
		CU_ASSERT_EQUAL(r->id, 7);
		CU_ASSERT_EQUAL(r->ping->nonce, 99);
		kvpool__request__free_unpacked(r, NULL);
	}
	CU_ASSERT_EQUAL(kvp_frame_pending(&b), 0);
	kvp_frame_buf_release(&b);
}

static void test_frame_next_merged(void)
{
	struct kvp_frame_buf b;
	uint8_t f[256];
	size_t n = 0;
	const uint8_t *pl;
	uint32_t len;

	for (int i = 0; i < 5; i++)
		n += pack_ping(f + n, (uint64_t)i + 1, (uint64_t)i * 10);
	kvp_frame_buf_init(&b);
	CU_ASSERT_EQUAL(kvp_frame_buf_append(&b, f, n - 3), 0); /* the last one incomplete */
	for (int i = 0; i < 4; i++) {
		Kvpool__Request *r;

		CU_ASSERT_EQUAL_FATAL(kvp_frame_next(&b, &pl, &len), 1);
		r = kvp_frame_decode_request(pl, len);
		CU_ASSERT_PTR_NOT_NULL_FATAL(r);
		CU_ASSERT_EQUAL(r->id, (uint64_t)i + 1);
		kvpool__request__free_unpacked(r, NULL);
	}
	CU_ASSERT_EQUAL(kvp_frame_next(&b, &pl, &len), 0);
	CU_ASSERT(kvp_frame_pending(&b) > 0);
	CU_ASSERT_EQUAL(kvp_frame_buf_append(&b, f + n - 3, 3), 0);
	CU_ASSERT_EQUAL(kvp_frame_next(&b, &pl, &len), 1);
	kvp_frame_buf_release(&b);
}

static void test_frame_next_oversized(void)
{
	struct kvp_frame_buf b;
	uint8_t hdr[4] = { 0x01, 0x00, 0x40, 0x00 }; /* 4 MiB + 1 */
	const uint8_t *pl;
	uint32_t len;

	kvp_frame_buf_init(&b);
	CU_ASSERT_EQUAL(kvp_frame_buf_append(&b, hdr, 4), 0);
	CU_ASSERT_EQUAL(kvp_frame_next(&b, &pl, &len), -EMSGSIZE);
	kvp_frame_buf_release(&b);
}

static void test_frame_buf_append_refuses_unbounded_growth(void)
{
	struct kvp_frame_buf b;
	uint8_t *chunk = calloc(1, 1 << 20);
	int r = 0;

	kvp_frame_buf_init(&b);
	/* No frame boundary ever completes: the buffer must stop growing near the maximum. */
	chunk[0] = 0xff, chunk[1] = 0xff, chunk[2] = 0x3f, chunk[3] = 0x00;
	for (int i = 0; i < 8 && r == 0; i++)
		r = kvp_frame_buf_append(&b, chunk, 1 << 20);
	CU_ASSERT_EQUAL(r, -EMSGSIZE);
	kvp_frame_buf_release(&b);
	free(chunk);
}

static void test_frame_decode_garbage(void)
{
	uint8_t g[] = { 0xff, 0xff, 0xff, 0xff, 0xff, 0xff };

	CU_ASSERT_PTR_NULL(kvp_frame_decode_request(g, sizeof(g)));
	CU_ASSERT_PTR_NULL(kvp_frame_decode_response(g, sizeof(g)));
}

static void test_frame_pack_roundtrip_response_with_detail(void)
{
	Kvpool__Response resp = KVPOOL__RESPONSE__INIT;
	Kvpool__Status st = KVPOOL__STATUS__INIT;
	Kvpool__CapacityDetail cap = KVPOOL__CAPACITY_DETAIL__INIT;
	Kvpool__Response *back;
	uint8_t *buf;
	size_t len;

	cap.tier = KVPOOL__TIER__HOST;
	cap.requested_tokens = 1000;
	cap.free_tokens = 10;
	cap.evictable_tokens = 20;
	cap.protected_tokens = 30;
	st.code = KVPOOL__CODE__OUT_OF_CAPACITY;
	st.message = (char *)"full";
	st.detail_case = KVPOOL__STATUS__DETAIL_CAPACITY;
	st.capacity = &cap;
	resp.id = 42;
	resp.status = &st;
	CU_ASSERT_EQUAL_FATAL(kvp_frame_pack(&resp.base, &buf, &len), 0);
	back = kvp_frame_decode_response(buf + KVP_FRAME_HDR, (uint32_t)(len - KVP_FRAME_HDR));
	CU_ASSERT_PTR_NOT_NULL_FATAL(back);
	CU_ASSERT_EQUAL(back->id, 42);
	CU_ASSERT_EQUAL(back->status->code, KVPOOL__CODE__OUT_OF_CAPACITY);
	CU_ASSERT_EQUAL(back->status->detail_case, KVPOOL__STATUS__DETAIL_CAPACITY);
	CU_ASSERT_EQUAL(back->status->capacity->tier, KVPOOL__TIER__HOST);
	CU_ASSERT_EQUAL(back->status->capacity->requested_tokens, 1000);
	CU_ASSERT_EQUAL(back->status->capacity->protected_tokens, 30);
	CU_ASSERT_STRING_EQUAL(back->status->message, "full");
	kvpool__response__free_unpacked(back, NULL);
	free(buf);
}

static void test_frame_pack_roundtrip_every_call(void)
{
	/* Each oneof case of Request survives pack + unpack with its case and id. */
	const ProtobufCMessageDescriptor *d = &kvpool__request__descriptor;

	for (unsigned i = 0; i < d->n_fields; i++) {
		const ProtobufCFieldDescriptor *f = &d->fields[i];
		Kvpool__Request req = KVPOOL__REQUEST__INIT, *back;
		void *sub;
		uint8_t *buf;
		size_t len;

		if (f->id == 1)
			continue;
		sub = calloc(1,
			     ((const ProtobufCMessageDescriptor *)f->descriptor)->sizeof_message);
		protobuf_c_message_init(f->descriptor, sub);
		req.id = 1000 + f->id;
		req.call_case = (Kvpool__Request__CallCase)f->id;
		*(void **)((char *)&req + f->offset) = sub;
		CU_ASSERT_EQUAL_FATAL(kvp_frame_pack(&req.base, &buf, &len), 0);
		back = kvp_frame_decode_request(buf + 4, (uint32_t)(len - 4));
		CU_ASSERT_PTR_NOT_NULL_FATAL(back);
		CU_ASSERT_EQUAL(back->call_case, (Kvpool__Request__CallCase)f->id);
		CU_ASSERT_EQUAL(back->id, 1000 + f->id);
		kvpool__request__free_unpacked(back, NULL);
		free(buf);
		free(sub);
	}
}

/* Every Request and Response of every oneof case (and none), with ids that need 0 to 10 varint
 * bytes, a Status or none: kvp_frame_pack writes exactly protobuf_c_message_pack's bytes. */
static const uint64_t g_ids[] = { 0, 1, 127, 128, 300, 1ull << 35, (1ull << 63) - 1, UINT64_MAX };

static void check_same_bytes(const ProtobufCMessage *m)
{
	size_t want = protobuf_c_message_get_packed_size(m);
	uint8_t *ref = malloc(want + 1), *buf;
	size_t len;

	protobuf_c_message_pack(m, ref);
	CU_ASSERT_EQUAL_FATAL(kvp_frame_pack(m, &buf, &len), 0);
	CU_ASSERT_EQUAL(len, KVP_FRAME_HDR + want);
	CU_ASSERT_EQUAL(buf[0] | buf[1] << 8 | buf[2] << 16 | (uint32_t)buf[3] << 24, want);
	CU_ASSERT(len == KVP_FRAME_HDR + want && !memcmp(buf + KVP_FRAME_HDR, ref, want));
	free(buf);
	free(ref);
}

/* Random in-memory values of every plain kind, the odd ones too: bools other than 0 and 1,
 * negative int32 and enums, NULL and empty strings, lists of 0 to 6 elements of every varint
 * size. The array and string storage is static: the message is only packed. */
static void fill_random(ProtobufCMessage *sub, unsigned *seed)
{
	static uint32_t lists[8][6];
	static char strs[4][8] = { "", "x", "kvpool", "1234567" };
	static const int32_t ints[] = { 0, 1, 127, 128, -1, -2, INT32_MAX, INT32_MIN };
	static const int bools[] = { 0, 1, 2, -1, 256 };
	const ProtobufCMessageDescriptor *sd = sub->descriptor;

	for (unsigned k = 0; k < sd->n_fields; k++) {
		const ProtobufCFieldDescriptor *sf = &sd->fields[k];
		char *mb = (char *)sub + sf->offset;
		unsigned r = (unsigned)rand_r(seed);

		if (sf->flags & PROTOBUF_C_FIELD_FLAG_ONEOF)
			continue;
		if (sf->label == PROTOBUF_C_LABEL_REPEATED) {
			if (sf->type == PROTOBUF_C_TYPE_UINT32) {
				uint32_t *l = lists[k % 8];
				size_t n = r % 7;

				/* one rand_r per statement: the same values in every build */
				for (size_t j = 0; j < n; j++) {
					uint32_t x = (uint32_t)rand_r(seed);

					l[j] = x >> (rand_r(seed) % 32);
				}
				*(uint32_t **)mb = n ? l : NULL;
				*(size_t *)((char *)sub + sf->quantifier_offset) = n;
			}
			continue;
		}
		switch (sf->type) {
		case PROTOBUF_C_TYPE_UINT64:
			*(uint64_t *)mb = (uint64_t)rand_r(seed) << 33;
			*(uint64_t *)mb = (*(uint64_t *)mb ^ (uint64_t)rand_r(seed)) >> (r % 64);
			break;
		case PROTOBUF_C_TYPE_UINT32:
			*(uint32_t *)mb = (uint32_t)rand_r(seed) << 1 >> (r % 32);
			break;
		case PROTOBUF_C_TYPE_INT32:
		case PROTOBUF_C_TYPE_ENUM: *(int32_t *)mb = ints[r % 8]; break;
		case PROTOBUF_C_TYPE_BOOL: *(protobuf_c_boolean *)mb = bools[r % 5]; break;
		case PROTOBUF_C_TYPE_STRING: *(char **)mb = r % 5 == 4 ? NULL : strs[r % 4]; break;
		default: break;
		}
	}
}

/* Calls fn with envelope m of descriptor d set to each oneof case in turn (and to none), the
 * sub-message left at its defaults and filled twice with random values (fill_random). */
static void each_case(ProtobufCMessage *m, void (*fn)(ProtobufCMessage *m, void *arg), void *arg)
{
	const ProtobufCMessageDescriptor *d = m->descriptor;
	static unsigned seed = 777;

	fn(m, arg);
	for (unsigned i = 0; i < d->n_fields; i++) {
		const ProtobufCFieldDescriptor *f = &d->fields[i];
		const ProtobufCMessageDescriptor *sd = f->descriptor;

		if (!(f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF))
			continue;
		for (int v = 0; v < 3; v++) {
			ProtobufCMessage *sub = calloc(1, sd->sizeof_message);

			protobuf_c_message_init(sd, sub);
			if (v)
				fill_random(sub, &seed);
			*(uint32_t *)((char *)m + f->quantifier_offset) = f->id;
			*(ProtobufCMessage **)((char *)m + f->offset) = sub;
			fn(m, arg);
			free(sub);
		}
		*(ProtobufCMessage **)((char *)m + f->offset) = NULL; /* case set, no message */
		fn(m, arg);
		*(uint32_t *)((char *)m + f->quantifier_offset) = 0;
	}
}

static void same_bytes_cb(ProtobufCMessage *m, void *arg)
{
	(void)arg;
	check_same_bytes(m);
}

/* The envelope codec relies on this shape: plain fields first, then one oneof to the end. */
static void check_envelope_shape(const ProtobufCMessageDescriptor *d)
{
	unsigned i = 0;

	while (i < d->n_fields && !(d->fields[i].flags & PROTOBUF_C_FIELD_FLAG_ONEOF))
		i++;
	CU_ASSERT_FATAL(i < d->n_fields);
	for (unsigned k = i; k < d->n_fields; k++) {
		CU_ASSERT(d->fields[k].flags & PROTOBUF_C_FIELD_FLAG_ONEOF);
		CU_ASSERT_EQUAL(d->fields[k].quantifier_offset, d->fields[i].quantifier_offset);
		CU_ASSERT_EQUAL(d->fields[k].type, PROTOBUF_C_TYPE_MESSAGE);
		if (k > 0)
			CU_ASSERT(d->fields[k].id > d->fields[k - 1].id);
	}
}

static void test_frame_envelope_bytes_match_protobuf_c(void)
{
	Kvpool__Request req = KVPOOL__REQUEST__INIT;
	Kvpool__Response resp = KVPOOL__RESPONSE__INIT;
	Kvpool__Status st = KVPOOL__STATUS__INIT, st_full = KVPOOL__STATUS__INIT;
	Kvpool__CapacityDetail cap = KVPOOL__CAPACITY_DETAIL__INIT;
	Kvpool__PingReq ping = KVPOOL__PING_REQ__INIT;

	check_envelope_shape(&kvpool__request__descriptor);
	check_envelope_shape(&kvpool__response__descriptor);
	cap.requested_tokens = 5;
	st_full.code = KVPOOL__CODE__OUT_OF_CAPACITY;
	st_full.message = (char *)"full";
	st_full.detail_case = KVPOOL__STATUS__DETAIL_CAPACITY;
	st_full.capacity = &cap;
	for (size_t i = 0; i < sizeof(g_ids) / sizeof(g_ids[0]); i++) {
		req.id = resp.id = g_ids[i];
		each_case(&req.base, same_bytes_cb, NULL);
		resp.status = NULL;
		each_case(&resp.base, same_bytes_cb, NULL);
		resp.status = &st;
		each_case(&resp.base, same_bytes_cb, NULL);
		resp.status = &st_full;
		each_case(&resp.base, same_bytes_cb, NULL);
	}
	/* a message that is not an envelope goes through protobuf-c */
	ping.nonce = 9;
	check_same_bytes(&ping.base);
}

static void test_frame_plain_pack_matches_protobuf_c_on_random_values(void)
{
	Kvpool__Request req = KVPOOL__REQUEST__INIT;
	Kvpool__Response resp = KVPOOL__RESPONSE__INIT;
	Kvpool__Status st = KVPOOL__STATUS__INIT;
	ProtobufCMessage *env[2] = { &req.base, &resp.base };
	unsigned seed = 4242;

	resp.status = &st;
	for (int e = 0; e < 2; e++) {
		const ProtobufCMessageDescriptor *d = env[e]->descriptor;

		for (unsigned i = 0; i < d->n_fields; i++) {
			const ProtobufCFieldDescriptor *f = &d->fields[i];
			const ProtobufCMessageDescriptor *sd = f->descriptor;

			if (!(f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF))
				continue;
			for (int it = 0; it < 200; it++) {
				ProtobufCMessage *sub = calloc(1, sd->sizeof_message);

				protobuf_c_message_init(sd, sub);
				fill_random(sub, &seed);
				fill_random(&st.base, &seed); /* the Response's Status too */
				*(uint32_t *)((char *)env[e] + f->quantifier_offset) = f->id;
				*(ProtobufCMessage **)((char *)env[e] + f->offset) = sub;
				check_same_bytes(env[e]);
				*(ProtobufCMessage **)((char *)env[e] + f->offset) = NULL;
				*(uint32_t *)((char *)env[e] + f->quantifier_offset) = 0;
				free(sub);
			}
		}
	}
}

/* The envelope decoder (with malloc and with an arena) against protobuf-c's own unpack on the
 * same bytes: both refuse, or both give the same message, field by field, that packs to the
 * same bytes. */
static void check_same_decode(const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t n)
{
	ProtobufCMessage *ref = protobuf_c_message_unpack(d, NULL, n, p), *got, *in_arena = NULL;
	struct kvp_arena a;

	CU_ASSERT_EQUAL_FATAL(kvp_arena_init(&a, 512), 0);
	if (d == &kvpool__request__descriptor) {
		got = (ProtobufCMessage *)kvp_frame_decode_request(p, (uint32_t)n);
		in_arena = (ProtobufCMessage *)kvp_frame_decode_request_in(&a, p, (uint32_t)n);
	} else {
		got = (ProtobufCMessage *)kvp_frame_decode_response(p, (uint32_t)n);
	}
	CU_ASSERT_EQUAL(ref == NULL, got == NULL);
	if (d == &kvpool__request__descriptor)
		CU_ASSERT_EQUAL(ref == NULL, in_arena == NULL);
	if (ref && got) {
		size_t n1 = protobuf_c_message_get_packed_size(ref);
		size_t n2 = protobuf_c_message_get_packed_size(got);
		uint8_t *b1 = malloc(n1 + 1), *b2 = malloc(n2 + 1);

		protobuf_c_message_pack(ref, b1);
		protobuf_c_message_pack(got, b2);
		CU_ASSERT(n1 == n2 && !memcmp(b1, b2, n1));
		CU_ASSERT(h_msg_eq(ref, got));
		if (in_arena)
			CU_ASSERT(h_msg_eq(ref, in_arena));
		if (in_arena) {
			CU_ASSERT_EQUAL(protobuf_c_message_get_packed_size(in_arena), n1);
			protobuf_c_message_pack(in_arena, b2);
			CU_ASSERT(!memcmp(b1, b2, n1));
		}
		free(b1);
		free(b2);
	}
	if (ref)
		protobuf_c_message_free_unpacked(ref, NULL);
	if (got)
		protobuf_c_message_free_unpacked(got, NULL);
	kvp_arena_release(&a);
}

struct corpus {
	uint8_t *buf[512];
	size_t len[512];
	int n;
};

static void collect_cb(ProtobufCMessage *m, void *arg)
{
	struct corpus *c = arg;
	size_t n = protobuf_c_message_get_packed_size(m);

	if (c->n == 512)
		return;
	c->buf[c->n] = malloc(n + 1);
	c->len[c->n] = protobuf_c_message_pack(m, c->buf[c->n]);
	c->n++;
}

static void test_frame_envelope_decode_matches_protobuf_c(void)
{
	static const uint8_t odd[][16] = {
		{ 0x08, 0x05, 0x08, 0x06 },		/* id twice */
		{ 0x5a, 0x00, 0x5a, 0x02, 0x08, 0x01 }, /* the same call twice: merged */
		{ 0x52, 0x00, 0x5a, 0x00 },		/* two calls: the last wins */
		/* a 10-byte id, then one whose last byte overflows 64 bits */
		{ 0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01 },
		{ 0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f },
		{ 0x0a, 0x01, 0x00 },	    /* id with the wrong wire type */
		{ 0xf8, 0x07, 0x01 },	    /* unknown field 127 */
		{ 0x88, 0x00, 0x01 },	    /* non-minimal tag */
		{ 0x5a, 0x05, 0x08 },	    /* length past the end */
		{ 0x5a, 0x80 },		    /* truncated length */
		{ 0x00, 0x01 },		    /* field 0 */
		{ 0x12, 0x02, 0x08, 0x07 }, /* Response status / Request unknown 2 */
	};
	Kvpool__Request req = KVPOOL__REQUEST__INIT;
	Kvpool__Response resp = KVPOOL__RESPONSE__INIT;
	Kvpool__Status st = KVPOOL__STATUS__INIT;
	struct corpus rq = { .n = 0 }, rs = { .n = 0 };
	unsigned seed = 12345;

	st.code = KVPOOL__CODE__NOT_FOUND;
	st.message = (char *)"gone";
	for (size_t i = 0; i < sizeof(g_ids) / sizeof(g_ids[0]); i += 3) {
		req.id = resp.id = g_ids[i];
		each_case(&req.base, collect_cb, &rq);
		resp.status = &st;
		each_case(&resp.base, collect_cb, &rs);
	}
	for (size_t i = 0; i < sizeof(odd) / sizeof(odd[0]); i++) {
		size_t n = sizeof(odd[i]);

		while (n && !odd[i][n - 1])
			n--;
		if (i == 5)
			n = 3;
		check_same_decode(&kvpool__request__descriptor, odd[i], n);
		check_same_decode(&kvpool__response__descriptor, odd[i], n);
	}
	/* Sub-messages in odd forms, inside a Request's call: FreeReq (lease_id = 1 uint64,
	 * pages = 2 packed uint32), AllocReq (pool_id = 1, tier = 4 enum), MatchReq (lock = 4
	 * bool). */
	{
		static const struct {
			const char *call;
			uint8_t n, b[16];
		} subs[] = {
			{ "free", 6, { 0x08, 0x05, 0x12, 0x02, 0x01, 0x02 } }, /* canonical */
			{ "free", 4, { 0x10, 0x01, 0x10, 0x02 } },	       /* list unpacked */
			{ "free", 4, { 0x12, 0x00, 0x08, 0x01 } },	       /* empty list */
			{ "free", 3, { 0x12, 0x01, 0x81 } },		       /* ends mid-varint */
			{ "free",
			  8,
			  { 0x12, 0x06, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01 } }, /* 6 bytes */
			{ "free",
			  7,
			  { 0x12, 0x05, 0xff, 0xff, 0xff, 0xff, 0x7f } },      /* past 32 bits */
			{ "free", 4, { 0x08, 0x01, 0x08, 0x02 } },	       /* a scalar twice */
			{ "free", 6, { 0x12, 0x01, 0x01, 0x12, 0x01, 0x02 } }, /* a list twice */
			{ "free", 2, { 0x18, 0x01 } },			       /* unknown field 3 */
			{ "free", 9, { 0x09, 0, 0, 0, 0, 0, 0, 0, 0 } }, /* fixed64 lease_id */
			{ "alloc", 6, { 0x08, 0x80, 0x80, 0x80, 0x80, 0x10 } }, /* past 32 bits */
			{ "alloc", 6, { 0x20, 0xff, 0xff, 0xff, 0xff, 0x0f } }, /* enum 2^32 - 1 */
			{ "alloc",
			  11,
			  { 0x20, 0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
			    0x01 } },						/* -2 */
			{ "alloc", 2, { 0x08, 0x00 } },				/* a zero written */
			{ "match", 2, { 0x20, 0x02 } },				/* bool as 2 */
			{ "match", 6, { 0x20, 0x80, 0x80, 0x80, 0x80, 0x01 } }, /* bool, 5 bytes */
			{ "match", 3, { 0x20, 0x80, 0x00 } }, /* bool 0, 2 bytes */
		};

		for (size_t i = 0; i < sizeof(subs) / sizeof(subs[0]); i++) {
			const ProtobufCFieldDescriptor *f =
				protobuf_c_message_descriptor_get_field_by_name(
					&kvpool__request__descriptor, subs[i].call);
			uint8_t m[32] = { 0x08, 0x07 };
			size_t k = 2;

			CU_ASSERT_PTR_NOT_NULL_FATAL(f);
			for (uint32_t t = f->id << 3 | 2;; t >>= 7) { /* the tag, a varint */
				m[k++] = (uint8_t)(t > 0x7f ? (t & 0x7f) | 0x80 : t);
				if (t <= 0x7f)
					break;
			}
			m[k++] = subs[i].n;
			memcpy(m + k, subs[i].b, subs[i].n);
			check_same_decode(&kvpool__request__descriptor, m, k + subs[i].n);
		}
	}
	/* Valid messages, then each mutated: bytes changed, cut short, joined with another. */
	for (int round = 0; round < 40; round++) {
		for (int k = 0; k < 2; k++) {
			struct corpus *c = k ? &rs : &rq;
			const ProtobufCMessageDescriptor *d =
				k ? &kvpool__response__descriptor : &kvpool__request__descriptor;

			for (int i = 0; i < c->n; i++) {
				uint8_t m[256];
				size_t n = c->len[i] < 200 ? c->len[i] : 200;
				int j = rand_r(&seed) % c->n;

				if (round == 0) {
					check_same_decode(d, c->buf[i], c->len[i]);
					continue;
				}
				memcpy(m, c->buf[i], n);
				if (n && round % 3 == 0) {
					size_t at = (size_t)rand_r(&seed) % n;

					m[at] = (uint8_t)rand_r(&seed);
				}
				if (n && round % 3 == 1)
					n = (size_t)rand_r(&seed) % n;
				if (round % 3 == 2 && n + c->len[j] <= sizeof(m)) {
					memcpy(m + n, c->buf[j], c->len[j]);
					n += c->len[j];
				}
				check_same_decode(d, m, n);
			}
		}
	}
	for (int i = 0; i < rq.n; i++)
		free(rq.buf[i]);
	for (int i = 0; i < rs.n; i++)
		free(rs.buf[i]);
}

/* A Request with an ExistsKeys of n one-byte keys and an extra unknown field repeated u times
 * at its top level (u > 0 sends protobuf-c down its own path), packed. */
static uint8_t *keys_request(size_t n, size_t u, size_t *len)
{
	static uint8_t key = 'k';
	Kvpool__Request q = KVPOOL__REQUEST__INIT;
	Kvpool__ExistsKeysReq x = KVPOOL__EXISTS_KEYS_REQ__INIT;
	ProtobufCBinaryData *keys = malloc(n * sizeof(*keys));
	size_t body;
	uint8_t *buf;

	CU_ASSERT_PTR_NOT_NULL_FATAL(keys);
	for (size_t i = 0; i < n; i++)
		keys[i] = (ProtobufCBinaryData){ 1, &key };
	x.pool_id = 3;
	x.n_keys = n;
	x.keys = keys;
	q.id = 4242;
	q.call_case = KVPOOL__REQUEST__CALL_EXISTS_KEYS;
	q.exists_keys = &x;
	body = protobuf_c_message_get_packed_size(&q.base);
	buf = malloc(body + 2 * u);
	CU_ASSERT_PTR_NOT_NULL_FATAL(buf);
	protobuf_c_message_pack(&q.base, buf);
	for (size_t i = 0; i < u; i++) {
		buf[body + 2 * i] = 5 << 3; /* field 5, varint: unknown to Request */
		buf[body + 2 * i + 1] = 0;
	}
	free(keys);
	*len = body + 2 * u;
	return buf;
}

/* A call message of more than KVP_FRAME_FIELDS_MAX fields is not unpacked, whichever decoder
 * path the frame takes: the Request keeps its id and case, the member is NULL; one of
 * KVP_FRAME_KEYS_MAX keys is unpacked whole; a Request crowded at its top level is refused. */
static void test_frame_decode_crowded_call_left_unpacked(void)
{
	struct kvp_arena a;
	Kvpool__Request *q;
	uint8_t *buf;
	size_t len;

	CU_ASSERT_EQUAL_FATAL(kvp_arena_init(&a, 4096), 0);
	for (size_t u = 0; u <= 1; u++) {
		buf = keys_request(KVP_FRAME_FIELDS_MAX + 1, u, &len);
		q = kvp_frame_decode_request_in(&a, buf, (uint32_t)len);
		CU_ASSERT_PTR_NOT_NULL_FATAL(q);
		CU_ASSERT_EQUAL(q->id, 4242);
		CU_ASSERT_EQUAL(q->call_case, KVPOOL__REQUEST__CALL_EXISTS_KEYS);
		CU_ASSERT_PTR_NULL(q->exists_keys);
		CU_ASSERT(kvp_frame_call_unpacked(q));
		CU_ASSERT(a.used < 1024 && !a.big); /* nothing of the keys was allocated */
		kvp_arena_reset(&a);
		q = kvp_frame_decode_request(buf, (uint32_t)len);
		CU_ASSERT_PTR_NOT_NULL_FATAL(q);
		CU_ASSERT(kvp_frame_call_unpacked(q));
		kvpool__request__free_unpacked(q, NULL);
		free(buf);
	}
	buf = keys_request(KVP_FRAME_KEYS_MAX, 0, &len);
	q = kvp_frame_decode_request_in(&a, buf, (uint32_t)len);
	CU_ASSERT_PTR_NOT_NULL_FATAL(q);
	CU_ASSERT_FALSE(kvp_frame_call_unpacked(q));
	CU_ASSERT_PTR_NOT_NULL_FATAL(q->exists_keys);
	CU_ASSERT_EQUAL(q->exists_keys->n_keys, KVP_FRAME_KEYS_MAX);
	CU_ASSERT_EQUAL(q->exists_keys->pool_id, 3);
	kvp_arena_reset(&a);
	free(buf);
	buf = keys_request(1, KVP_FRAME_FIELDS_MAX + 1, &len);
	CU_ASSERT_PTR_NULL(kvp_frame_decode_request_in(&a, buf, (uint32_t)len));
	CU_ASSERT_FALSE(a.oom);
	kvp_arena_reset(&a);
	free(buf);
	kvp_arena_release(&a);
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_frame_next_split_byte_by_byte),
		H_TEST(test_frame_next_merged),
		H_TEST(test_frame_next_oversized),
		H_TEST(test_frame_buf_append_refuses_unbounded_growth),
		H_TEST(test_frame_decode_garbage),
		H_TEST(test_frame_pack_roundtrip_response_with_detail),
		H_TEST(test_frame_pack_roundtrip_every_call),
		H_TEST(test_frame_envelope_bytes_match_protobuf_c),
		H_TEST(test_frame_envelope_decode_matches_protobuf_c),
		H_TEST(test_frame_plain_pack_matches_protobuf_c_on_random_values),
		H_TEST(test_frame_decode_crowded_call_left_unpacked),
	};

	return H_RUN_SUITE("frame", NULL, NULL, tests);
}
