/* test_frame.c - framing: split and merged reads, oversized and garbage frames, codec round
 * trips of every call. */
#include <CUnit/Basic.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "frame.h"

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
		sub = calloc(1, ((const ProtobufCMessageDescriptor *)f->descriptor)->sizeof_message);
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

int main(void)
{
	CU_pSuite s;

	if (CU_initialize_registry() != CUE_SUCCESS)
		return 1;
	s = CU_add_suite("frame", NULL, NULL);
	CU_add_test(s, "test_frame_next_split_byte_by_byte", test_frame_next_split_byte_by_byte);
	CU_add_test(s, "test_frame_next_merged", test_frame_next_merged);
	CU_add_test(s, "test_frame_next_oversized", test_frame_next_oversized);
	CU_add_test(s, "test_frame_buf_append_refuses_unbounded_growth",
		    test_frame_buf_append_refuses_unbounded_growth);
	CU_add_test(s, "test_frame_decode_garbage", test_frame_decode_garbage);
	CU_add_test(s, "test_frame_pack_roundtrip_response_with_detail",
		    test_frame_pack_roundtrip_response_with_detail);
	CU_add_test(s, "test_frame_pack_roundtrip_every_call", test_frame_pack_roundtrip_every_call);
	CU_basic_set_mode(CU_BRM_VERBOSE);
	CU_basic_run_tests();
	{
		unsigned f = CU_get_number_of_failures();

		CU_cleanup_registry();
		return f ? 1 : 0;
	}
}
