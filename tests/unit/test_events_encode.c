/* test_events_encode.c - CUnit tests of daemon/events/events_encode.c: batches encoded byte for
 * byte as vLLM's msgspec classes encode them (the expected bytes are msgspec.msgpack.encode of
 * the same KVEventBatch built from vllm.distributed.kv_events), an empty batch, medium names,
 * a bad medium refused with the batch unchanged. */
#include "events.h"

#include <CUnit/Basic.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "suite.h"

/* KVEventBatch(ts=1.5, events=[
 *   BlockStored([b"\x01\x02"], None, [1, 300, 70000, 4294967295], 4, None, "GPU", None,
 *               locality="LOCAL", ownership="n1"),
 *   BlockStored([b"\x03"], b"\x01\x02", [], 16, None, "REMOTE", None, locality="REMOTE",
 *               ownership="n1"),
 *   BlockRemoved([b"\xaa" * 32], "CPU", locality="LOCAL", ownership="n1"),
 *   AllBlocksCleared()]) */
static const char g_batch1[] = "93cb3ff800000000000094de000aa474797065ab426c6f636b53746f726564ac"
			       "626c6f636b5f68617368657391c4020102b1706172656e745f626c6f636b5f68"
			       "617368c0a9746f6b656e5f6964739401cd012cce00011170ceffffffffaa626c"
			       "6f636b5f73697a6504a76c6f72615f6964c0a66d656469756da3475055a96c6f"
			       "72615f6e616d65c0a86c6f63616c697479a54c4f43414ca96f776e6572736869"
			       "70a26e31de000aa474797065ab426c6f636b53746f726564ac626c6f636b5f68"
			       "617368657391c40103b1706172656e745f626c6f636b5f68617368c4020102a9"
			       "746f6b656e5f69647390aa626c6f636b5f73697a6510a76c6f72615f6964c0a6"
			       "6d656469756da652454d4f5445a96c6f72615f6e616d65c0a86c6f63616c6974"
			       "79a652454d4f5445a96f776e657273686970a26e3185a474797065ac426c6f63"
			       "6b52656d6f766564ac626c6f636b5f68617368657391c420aaaaaaaaaaaaaaaa"
			       "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa66d656469756da3"
			       "435055a86c6f63616c697479a54c4f43414ca96f776e657273686970a26e3181"
			       "a474797065b0416c6c426c6f636b73436c6561726564c0";

/* KVEventBatch(ts=2.0, events=[BlockRemoved([b"k"], "STORAGE", locality="LOCAL")]) */
static const char g_batch2[] = "93cb40000000000000009184a474797065ac426c6f636b52656d6f766564ac62"
			       "6c6f636b5f68617368657391c4016ba66d656469756da753544f52414745a86c"
			       "6f63616c697479a54c4f43414cc0";

static void expect_hex(const uint8_t *p, size_t n, const char *hex)
{
	char *got = malloc(2 * n + 1);

	CU_ASSERT_FATAL(got != NULL);
	for (size_t i = 0; i < n; i++)
		snprintf(got + 2 * i, 3, "%02x", p[i]);
	CU_ASSERT_STRING_EQUAL(got, hex);
	if (strcmp(got, hex))
		fprintf(stderr, "\n  got:    %s\n  wanted: %s\n", got, hex);
	free(got);
}

static void test_kvp_events_batch_encode_as_msgspec(void)
{
	static const uint8_t k1[] = { 1, 2 }, k2[] = { 3 };
	static const uint32_t toks[] = { 1, 300, 70000, 4294967295u };
	uint8_t k3[32], *out = NULL;
	struct kvp_events_batch b = { .source = "n1" };
	size_t len = 0;

	memset(k3, 0xaa, sizeof(k3));
	CU_ASSERT_EQUAL(kvp_events_batch_page(&b,
					      &(struct kvp_events_page){
						      .stored = true,
						      .medium = KVP_EVENTS_GPU,
						      .key = k1,
						      .klen = sizeof(k1),
						      .tokens = toks,
						      .ntokens = 4,
						      .block_size = 4,
					      }),
			0);
	CU_ASSERT_EQUAL(kvp_events_batch_page(&b,
					      &(struct kvp_events_page){
						      .stored = true,
						      .medium = KVP_EVENTS_REMOTE,
						      .key = k2,
						      .klen = sizeof(k2),
						      .parent = k1,
						      .plen = sizeof(k1),
						      .block_size = 16,
					      }),
			0);
	CU_ASSERT_EQUAL(kvp_events_batch_page(&b,
					      &(struct kvp_events_page){
						      .medium = KVP_EVENTS_CPU,
						      .key = k3,
						      .klen = sizeof(k3),
					      }),
			0);
	CU_ASSERT_EQUAL(kvp_events_batch_cleared(&b), 0);
	CU_ASSERT_EQUAL(b.n, 4);
	CU_ASSERT_EQUAL_FATAL(kvp_events_batch_encode(&b, 1.5, &out, &len), 0);
	CU_ASSERT_EQUAL(len, (sizeof(g_batch1) - 1) / 2);
	expect_hex(out, len, g_batch1);
	free(out);
	/* the batch is left as it was: encoding again gives the same bytes */
	CU_ASSERT_EQUAL_FATAL(kvp_events_batch_encode(&b, 1.5, &out, &len), 0);
	expect_hex(out, len, g_batch1);
	free(out);

	/* made in place: the same bytes, in the batch's own buffer, its events left as they were */
	{
		size_t plen = 0;
		const uint8_t *pl = kvp_events_batch_payload(&b, 1.5, &plen);

		CU_ASSERT_PTR_NOT_NULL_FATAL(pl);
		CU_ASSERT(pl > b.body && pl < b.body + KVP_EVENTS_BATCH_HEAD);
		CU_ASSERT_EQUAL(plen, (sizeof(g_batch1) - 1) / 2);
		expect_hex(pl, plen, g_batch1);
		CU_ASSERT_EQUAL(b.n, 4);
		CU_ASSERT_EQUAL_FATAL(kvp_events_batch_encode(&b, 1.5, &out, &len), 0);
		expect_hex(out, len, g_batch1);
		free(out);
	}

	/* reset: the next batch starts empty; no source: no ownership field */
	kvp_events_batch_reset(&b);
	b.source = NULL;
	CU_ASSERT_EQUAL(b.n, 0);
	CU_ASSERT_EQUAL(kvp_events_batch_page(&b,
					      &(struct kvp_events_page){
						      .medium = KVP_EVENTS_STORAGE,
						      .key = (const uint8_t *)"k",
						      .klen = 1,
					      }),
			0);
	CU_ASSERT_EQUAL_FATAL(kvp_events_batch_encode(&b, 2.0, &out, &len), 0);
	expect_hex(out, len, g_batch2);
	free(out);
	kvp_events_batch_free(&b);
	kvp_events_batch_free(NULL);
}

static void test_kvp_events_batch_encode_empty(void)
{
	struct kvp_events_batch b = { 0 };
	uint8_t *out = NULL;
	size_t len = 0;

	/* [0.0, [], null] */
	CU_ASSERT_EQUAL_FATAL(kvp_events_batch_encode(&b, 0.0, &out, &len), 0);
	expect_hex(out, len, "93cb000000000000000090c0");
	free(out);
}

/* Long forms: a 40-byte source (str 8), 300 tokens (array 16) of every uint width, a 300-byte
 * hash (bin 16), 20 events (array 16 in the header): msgspec's bytes, made in place. */
static void test_kvp_events_batch_payload_long_forms(void)
{
	static const char src[] = "node-with-a-rather-long-name-0123456789";
	struct kvp_events_batch b = { .source = src };
	uint32_t toks[300];
	uint8_t key[300], *ref = NULL;
	const uint8_t *buf;
	size_t len = 0, rlen = 0;

	for (uint32_t i = 0; i < 300; i++)
		toks[i] = i % 4 == 0   ? i
			  : i % 4 == 1 ? 200 + i
			  : i % 4 == 2 ? 70000 + i
				       : 5000000 + i;
	memset(key, 7, sizeof(key));
	for (int i = 0; i < 20; i++)
		CU_ASSERT_EQUAL(kvp_events_batch_page(&b,
						      &(struct kvp_events_page){
							      .stored = i % 2 == 0,
							      .medium = KVP_EVENTS_REMOTE,
							      .key = key,
							      .klen = sizeof(key),
							      .tokens = toks,
							      .ntokens = 300,
							      .block_size = 300,
						      }),
				0);
	CU_ASSERT_EQUAL_FATAL(kvp_events_batch_encode(&b, 3.25, &ref, &rlen), 0);
	/* [ts, array 16 of 20, ...: the header's 14 bytes */
	CU_ASSERT_EQUAL(ref[10], 0xdc);
	CU_ASSERT_EQUAL(ref[12], 20);
	CU_ASSERT_EQUAL(ref[rlen - 1], 0xc0);
	CU_ASSERT(memmem(ref, rlen, "\xd9\x27node-with", 11) != NULL);	 /* str 8 of 39 bytes */
	CU_ASSERT(memmem(ref, rlen, "\xc5\x01\x2c\x07\x07", 5) != NULL); /* bin 16 of 300 */
	CU_ASSERT(memmem(ref, rlen, "\xdc\x01\x2c\x00\xcc\xc9\xce", 7) != NULL);
	buf = kvp_events_batch_payload(&b, 3.25, &len);
	CU_ASSERT_PTR_NOT_NULL_FATAL(buf);
	CU_ASSERT_EQUAL(buf - b.body, KVP_EVENTS_BATCH_HEAD - 13); /* 1 + 9 + 3 header bytes */
	CU_ASSERT_EQUAL_FATAL(len, rlen);
	CU_ASSERT_EQUAL(memcmp(buf, ref, len), 0);
	free(ref);
	kvp_events_batch_free(&b);
}

static void test_kvp_events_batch_page_bad_medium(void)
{
	struct kvp_events_batch b = { 0 };

	CU_ASSERT_EQUAL(kvp_events_batch_page(&b,
					      &(struct kvp_events_page){
						      .stored = true,
						      .medium = KVP_EVENTS_MEDIUM_MAX,
						      .key = (const uint8_t *)"k",
						      .klen = 1,
					      }),
			-EINVAL);
	CU_ASSERT_EQUAL(b.n, 0);
	CU_ASSERT_EQUAL(b.len, 0);
	kvp_events_batch_free(&b);
}

static void test_kvp_events_medium_name_all(void)
{
	CU_ASSERT_STRING_EQUAL(kvp_events_medium_name(KVP_EVENTS_GPU), "GPU");
	CU_ASSERT_STRING_EQUAL(kvp_events_medium_name(KVP_EVENTS_CPU), "CPU");
	CU_ASSERT_STRING_EQUAL(kvp_events_medium_name(KVP_EVENTS_STORAGE), "STORAGE");
	CU_ASSERT_STRING_EQUAL(kvp_events_medium_name(KVP_EVENTS_REMOTE), "REMOTE");
	CU_ASSERT_STRING_EQUAL(kvp_events_medium_name(KVP_EVENTS_MEDIUM_MAX), "?");
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_kvp_events_batch_encode_as_msgspec),
		H_TEST(test_kvp_events_batch_encode_empty),
		H_TEST(test_kvp_events_batch_payload_long_forms),
		H_TEST(test_kvp_events_batch_page_bad_medium),
		H_TEST(test_kvp_events_medium_name_all),
	};

	return H_RUN_SUITE("events_encode", NULL, NULL, tests);
}
