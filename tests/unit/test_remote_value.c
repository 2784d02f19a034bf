/* test_remote_value.c - the remote tier's value format (round trip, every corruption refused)
 * and content keys (page hashes equal to SGLang's get_hash_str, key text, slot spread).
 *
 * The hash vectors come from this Python run (hashlib, the same algorithm as get_hash_str:
 * previous digest bytes, then each token id as 4 bytes little-endian):
 *   def h(toks, prior=None):
 *       m = hashlib.sha256()
 *       if prior: m.update(bytes.fromhex(prior))
 *       for t in toks: m.update(t.to_bytes(4, 'little', signed=False))
 *       return m.hexdigest()
 *   a = h([1, 2, 3, 4]); b = h([5, 6, 7, 8], a); c = h([0, 4294967295, 151643, 128000], b)
 *   d = h(list(range(300))); e = h(list(range(300)), d)
 *   fp id: hashlib.sha256(struct.pack('<6I', 32, 8, 128, 1, 16, 0)).digest()[:8][::-1].hex() */
#include <CUnit/Basic.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nettle/hmac.h>
#include <nettle/umac.h>

#include "crc32c.h"
#include "remote_cluster.h"
#include "remote_value.h"
#include "suite.h"

static const struct kvp_rv_fp fp = { 32, 8, 128, 1, 16, 0 };
static struct kvp_rv_mac g_mac; /* under SECRET */
#define SECRET "0123456789abcdef0123456789abcdef"
static const char KEY[] = "kvp:567568aee78ee655:llama:00";

static void put32le(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void hex(const uint8_t *h, char *out)
{
	for (int i = 0; i < KVP_RV_HASH_SIZE; i++)
		sprintf(out + 2 * i, "%02x", h[i]);
}

static void fill(uint8_t *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++) {
		seed = seed * 1103515245u + 12345u;
		p[i] = (uint8_t)(seed >> 16);
	}
}

static void test_crc32c_known_vector(void)
{
	uint8_t a[1024], big[1027];

	CU_ASSERT_EQUAL(kvp_rv_crc32c("123456789", 9), 0xe3069283u);
	CU_ASSERT_EQUAL(kvp_rv_crc32c("", 0), 0);
	/* unaligned starts and odd tails give the same answer as the aligned whole */
	fill(a, sizeof(a), 7);
	for (size_t off = 0; off < 4; off++) {
		memcpy(big + off, a, sizeof(a));
		CU_ASSERT_EQUAL(kvp_rv_crc32c(big + off, 1021), kvp_rv_crc32c(a, 1021));
	}
}

/* Bit by bit, the definition. */
static uint32_t crc32c_ref(const uint8_t *p, size_t n)
{
	uint32_t c = ~0u;

	while (n--) {
		c ^= *p++;
		for (int k = 0; k < 8; k++)
			c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
	}
	return ~c;
}

/* Long buffers (the three-lane blocks of 3 x 4096 bytes, a partial block, odd starts and
 * tails) agree with the bitwise definition. */
static void test_crc32c_long_buffers_match_reference(void)
{
	static const size_t lens[] = { 12287, 12288, 12289, 24576 + 100, 65536, 262144 + 48 };
	size_t max = 262144 + 48 + 8;
	uint8_t *b = malloc(max);

	CU_ASSERT_FATAL(b != NULL);
	fill(b, max, 11);
	for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++)
		for (size_t off = 0; off < 8; off += 3)
			CU_ASSERT_EQUAL(kvp_rv_crc32c(b + off, lens[i]),
					crc32c_ref(b + off, lens[i]));
	free(b);
}

/* A copy with its checksum in one pass (a spilled page): the bytes land as memcpy puts them,
 * nothing past them is touched, and the checksum is the reference's, for the lengths and odd
 * starts above; a header built from it is the header built from the bytes. */
static void test_crc32c_copy_matches_copy_then_checksum(void)
{
	static const size_t lens[] = { 0, 1, 7, 8, 12287, 12288, 12289, 24576 + 100, 262144 + 48 };
	size_t max = 262144 + 48 + 16;
	uint8_t *src = malloc(max), *dst = malloc(max + 1), h1[KVP_RV_HDR_SIZE],
		h2[KVP_RV_HDR_SIZE];

	CU_ASSERT_FATAL(src != NULL && dst != NULL);
	fill(src, max, 5);
	for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++)
		for (size_t off = 0; off < 8; off += 3) {
			size_t n = lens[i];

			memset(dst, 0xa5, max + 1);
			CU_ASSERT_EQUAL(kvp_crc32c_copy(dst + (off ^ 1), src + off, n),
					crc32c_ref(src + off, n));
			CU_ASSERT_EQUAL(memcmp(dst + (off ^ 1), src + off, n), 0);
			CU_ASSERT_EQUAL(dst[(off ^ 1) + n], 0xa5);
		}
	kvp_rv_header(&fp, &g_mac, KEY, sizeof(KEY) - 1, src, 65536, h1);
	kvp_rv_header_crc(&fp, 65536, kvp_crc32c_copy(dst, src, 65536), h2);
	/* the same bytes but the nonce and MAC (a fresh nonce each seal) */
	CU_ASSERT_EQUAL(memcmp(h1, h2, KVP_RV_NONCE_AT), 0);
	free(src);
	free(dst);
}

static void test_rv_decode_round_trip(void)
{
	size_t n = 16384;
	uint8_t *page = malloc(n), *v = malloc(KVP_RV_HDR_SIZE + n), hdr[KVP_RV_HDR_SIZE];
	const void *pl = NULL;
	uint64_t pn = 0;

	CU_ASSERT_PTR_NOT_NULL_FATAL(page);
	CU_ASSERT_PTR_NOT_NULL_FATAL(v);
	fill(page, n, 1);
	CU_ASSERT_EQUAL(kvp_rv_encode(&fp, &g_mac, KEY, sizeof(KEY) - 1, page, n, v),
			KVP_RV_HDR_SIZE + n);
	CU_ASSERT_EQUAL(kvp_rv_decode(&fp, &g_mac, KEY, sizeof(KEY) - 1, n, v, KVP_RV_HDR_SIZE + n,
				      &pl, &pn),
			0);
	CU_ASSERT_EQUAL(pn, n);
	CU_ASSERT_PTR_EQUAL(pl, v + KVP_RV_HDR_SIZE);
	CU_ASSERT_EQUAL(memcmp(pl, page, n), 0);
	CU_ASSERT_EQUAL(kvp_rv_decode(&fp, &g_mac, KEY, sizeof(KEY) - 1, 0, v, KVP_RV_HDR_SIZE + n,
				      &pl, &pn),
			0);
	/* the header alone (sent before the page without copying it) is the same bytes but the
	 * nonce and MAC, and the value it heads decodes */
	kvp_rv_header(&fp, &g_mac, KEY, sizeof(KEY) - 1, page, n, hdr);
	CU_ASSERT_EQUAL(memcmp(hdr, v, KVP_RV_NONCE_AT), 0);
	memcpy(v, hdr, KVP_RV_HDR_SIZE);
	CU_ASSERT_EQUAL(kvp_rv_decode(&fp, &g_mac, KEY, sizeof(KEY) - 1, n, v, KVP_RV_HDR_SIZE + n,
				      &pl, &pn),
			0);
	CU_ASSERT_EQUAL(memcmp(v, "KVPV", 4), 0);
	free(page);
	free(v);
}

static int decode(const uint8_t *v, size_t len, uint64_t page)
{
	const void *pl = (const void *)1;
	uint64_t pn = 7;
	int rc = kvp_rv_decode(&fp, &g_mac, KEY, sizeof(KEY) - 1, page, v, len, &pl, &pn);

	if (rc) /* outputs untouched on failure */
		CU_ASSERT(pl == (const void *)1 && pn == 7);
	return rc;
}

static void test_rv_decode_each_corruption(void)
{
	enum { N = 256 };
	uint8_t page[N], v[KVP_RV_HDR_SIZE + N], w[KVP_RV_HDR_SIZE + N];
	struct kvp_rv_fp other = fp;

	fill(page, N, 2);
	kvp_rv_encode(&fp, &g_mac, KEY, sizeof(KEY) - 1, page, N, v);
	CU_ASSERT_EQUAL(decode(v, KVP_RV_HDR_SIZE - 1, 0), -KVP_RV_ESHORT);
	memcpy(w, v, sizeof(v));
	w[0] ^= 1;
	CU_ASSERT_EQUAL(decode(w, sizeof(w), 0), -KVP_RV_EMAGIC);
	memcpy(w, v, sizeof(v));
	w[4] = 1; /* the format before MACs */
	CU_ASSERT_EQUAL(decode(w, sizeof(w), 0), -KVP_RV_EVERSION);
	memcpy(w, v, sizeof(v));
	w[6] = 40;
	CU_ASSERT_EQUAL(decode(w, sizeof(w), 0), -KVP_RV_EVERSION);
	memcpy(w, v, sizeof(v));
	w[33] ^= 1; /* payload length, header checksum not redone */
	CU_ASSERT_EQUAL(decode(w, sizeof(w), 0), -KVP_RV_EHEADER);
	memcpy(w, v, sizeof(v));
	w[KVP_RV_HDR_SIZE + N / 2] ^= 0x80;
	CU_ASSERT_EQUAL(decode(w, sizeof(w), 0), -KVP_RV_ECHECKSUM);
	CU_ASSERT_EQUAL(decode(v, sizeof(v) - 1, 0), -KVP_RV_ELENGTH);
	CU_ASSERT_EQUAL(decode(v, sizeof(v), N * 2), -KVP_RV_ELENGTH);
	/* each geometry field on its own makes the value foreign */
	for (int f = 0; f < 6; f++) {
		other = fp;
		((uint32_t *)&other)[f] += 1;
		kvp_rv_encode(&other, &g_mac, KEY, sizeof(KEY) - 1, page, N, w);
		CU_ASSERT_EQUAL(decode(w, sizeof(w), 0), -KVP_RV_EFOREIGN);
	}
	/* any single flipped bit anywhere is refused */
	for (size_t i = 0; i < sizeof(v); i++) {
		memcpy(w, v, sizeof(v));
		w[i] ^= (uint8_t)(1u << (i % 8));
		CU_ASSERT_NOT_EQUAL(decode(w, sizeof(w), 0), 0);
	}
	CU_ASSERT_STRING_EQUAL(kvp_rv_strerror(-KVP_RV_EFOREIGN), "foreign pool fingerprint");
	CU_ASSERT_STRING_EQUAL(kvp_rv_strerror(-KVP_RV_EMAC), "MAC mismatch");
	CU_ASSERT_STRING_EQUAL(kvp_rv_strerror(999), "unknown");
}

/* A forger without the secret: other bytes under a copied header with both checksums redone
 * (what a user who can SET in the cluster can write) are refused for their MAC; so is a true
 * value copied under another key, and one sealed with another secret. */
static void test_rv_decode_refuses_without_the_secret(void)
{
	enum { N = 256 };
	uint8_t page[N], v[KVP_RV_HDR_SIZE + N], w[KVP_RV_HDR_SIZE + N];
	static const char other_key[] = "kvp:567568aee78ee655:llama:01";
	struct kvp_rv_mac other;
	const void *pl;
	uint64_t pn;

	fill(page, N, 3);
	kvp_rv_encode(&fp, &g_mac, KEY, sizeof(KEY) - 1, page, N, v);
	memcpy(w, v, sizeof(v));
	memset(w + KVP_RV_HDR_SIZE, 0x41, N);
	put32le(w + 40, kvp_crc32c(w + KVP_RV_HDR_SIZE, N));
	put32le(w + 44, kvp_crc32c(w, 44));
	CU_ASSERT_EQUAL(decode(w, sizeof(w), N), -KVP_RV_EMAC);
	CU_ASSERT_EQUAL(kvp_rv_decode(&fp, &g_mac, other_key, sizeof(other_key) - 1, N, v,
				      sizeof(v), &pl, &pn),
			-KVP_RV_EMAC);
	CU_ASSERT_EQUAL(kvp_rv_mac_init(&other, "short", 5), -EINVAL);
	CU_ASSERT_EQUAL_FATAL(kvp_rv_mac_init(&other, "fedcba9876543210", 16), 0);
	kvp_rv_encode(&fp, &other, KEY, sizeof(KEY) - 1, page, N, w);
	CU_ASSERT_EQUAL(decode(w, sizeof(w), N), -KVP_RV_EMAC);
	CU_ASSERT_EQUAL(decode(v, sizeof(v), N), 0);
}

/* The MAC is UMAC-128 under the first 16 bytes of HMAC-SHA256(secret, "kvpool remote value mac
 * v2"), with the header's nonce, of (key length, 8 bytes LE; key; header bytes 0..63; payload):
 * computed here from nettle's primitives as remote_value.h describes it. Each value sealed
 * gets a fresh nonce (the writer's prefix, then its count). */
static void test_rv_mac_layout(void)
{
	static const char label[] = "kvpool remote value mac v2";
	uint8_t page[8] = { 1, 2, 3, 4, 5, 6, 7, 8 }, v[KVP_RV_HDR_SIZE + 8],
		w[KVP_RV_HDR_SIZE + 8], k[32], kl[8] = { sizeof(KEY) - 1 }, mac[16];
	struct hmac_sha256_ctx h;
	struct umac128_ctx u;

	kvp_rv_encode(&fp, &g_mac, KEY, sizeof(KEY) - 1, page, sizeof(page), v);
	kvp_rv_encode(&fp, &g_mac, KEY, sizeof(KEY) - 1, page, sizeof(page), w);
	hmac_sha256_set_key(&h, strlen(SECRET), (const uint8_t *)SECRET);
	hmac_sha256_update(&h, sizeof(label) - 1, (const uint8_t *)label);
	hmac_sha256_digest(&h, sizeof(k), k);
	umac128_set_key(&u, k);
	umac128_set_nonce(&u, 16, v + 48);
	umac128_update(&u, sizeof(kl), kl);
	umac128_update(&u, sizeof(KEY) - 1, (const uint8_t *)KEY);
	umac128_update(&u, 64, v);
	umac128_update(&u, sizeof(page), page);
	umac128_digest(&u, sizeof(mac), mac);
	CU_ASSERT_EQUAL(memcmp(mac, v + KVP_RV_MAC_AT, sizeof(mac)), 0);
	/* the same page sealed twice: one prefix, the count one more, another MAC */
	CU_ASSERT_EQUAL(memcmp(v + 48, w + 48, 8), 0);
	CU_ASSERT_EQUAL(w[56], (uint8_t)(v[56] + 1));
	CU_ASSERT_NOT_EQUAL(memcmp(v + KVP_RV_MAC_AT, w + KVP_RV_MAC_AT, 16), 0);
	CU_ASSERT_EQUAL(decode(w, sizeof(w), sizeof(page)), 0);
}

static void test_rv_page_hash_matches_sglang(void)
{
	static const uint32_t t1[] = { 1, 2, 3, 4 }, t2[] = { 5, 6, 7, 8 };
	static const uint32_t t3[] = { 0, 4294967295u, 151643, 128000 };
	uint32_t t300[300];
	uint8_t a[32], b[32], c[32], d[32], e[32];
	char s[65];

	for (int i = 0; i < 300; i++)
		t300[i] = (uint32_t)i;
	CU_ASSERT_EQUAL(kvp_rv_page_hash(NULL, t1, 4, a), 0);
	hex(a, s);
	CU_ASSERT_STRING_EQUAL(s,
			       "cf97adeedb59e05bfd73a2b4c2a8885708c4f4f70c84c64b27120e72ab733b72");
	CU_ASSERT_EQUAL(kvp_rv_page_hash(a, t2, 4, b), 0);
	hex(b, s);
	CU_ASSERT_STRING_EQUAL(s,
			       "4ebfa8a1f3c341517621838c6e1b9aa350307e3f00b3cbd1a07ef740f54396d6");
	CU_ASSERT_EQUAL(kvp_rv_page_hash(b, t3, 4, c), 0);
	hex(c, s);
	CU_ASSERT_STRING_EQUAL(s,
			       "ddde2320ec2ae9c74512f20ca6255b63a04fc3490758f0e88134541c1d7a8277");
	/* more tokens than one internal chunk */
	CU_ASSERT_EQUAL(kvp_rv_page_hash(NULL, t300, 300, d), 0);
	hex(d, s);
	CU_ASSERT_STRING_EQUAL(s,
			       "31c4d357f4440759108dcb4b14645a7d75bc02cf3597e7c6e20d8173e33e0fc3");
	CU_ASSERT_EQUAL(kvp_rv_page_hash(d, t300, 300, e), 0);
	hex(e, s);
	CU_ASSERT_STRING_EQUAL(s,
			       "0b0277fea470a8221d76eb411fd56996b222b37d9c77154f146a3a4a2959d455");
}

static void test_rv_key_text_and_refusals(void)
{
	uint8_t h[32];
	char key[KVP_RV_KEY_MAX], ns[KVP_RV_NS_MAX + 2];
	static const uint32_t t1[] = { 1, 2, 3, 4 };
	int len;

	CU_ASSERT_EQUAL(kvp_rv_fp_id(&fp), 0x567568aee78ee655ull);
	kvp_rv_page_hash(NULL, t1, 4, h);
	len = kvp_rv_key(&fp, "llama", h, key);
	CU_ASSERT_EQUAL(len, (int)strlen(key));
	CU_ASSERT_STRING_EQUAL(key,
			       "kvp:567568aee78ee655:llama:"
			       "cf97adeedb59e05bfd73a2b4c2a8885708c4f4f70c84c64b27120e72ab733b72");
	CU_ASSERT_EQUAL(kvp_rv_key(&fp, "", h, key), -EINVAL);
	CU_ASSERT_EQUAL(kvp_rv_key(&fp, "a{b", h, key), -EINVAL);
	CU_ASSERT_EQUAL(kvp_rv_key(&fp, "a}b", h, key), -EINVAL);
	CU_ASSERT_EQUAL(kvp_rv_key(&fp, "a:b", h, key), -EINVAL);
	CU_ASSERT_EQUAL(kvp_rv_key(&fp, "a b", h, key), -EINVAL);
	memset(ns, 'n', KVP_RV_NS_MAX);
	ns[KVP_RV_NS_MAX] = '\0';
	CU_ASSERT_EQUAL(kvp_rv_key(&fp, ns, h, key), KVP_RV_KEY_MAX - 1);
	ns[KVP_RV_NS_MAX] = 'n';
	ns[KVP_RV_NS_MAX + 1] = '\0';
	CU_ASSERT_EQUAL(kvp_rv_key(&fp, ns, h, key), -EINVAL);
}

/* The 1,000 pages of one prompt land on many slots (no shared hash tag). */
static void test_rv_key_pages_of_one_prefix_spread(void)
{
	static unsigned char seen[KVP_RC_SLOTS];
	uint8_t h[32], prev[32];
	uint32_t toks[16];
	char key[KVP_RV_KEY_MAX];
	int distinct = 0;

	for (int p = 0; p < 1000; p++) {
		for (int i = 0; i < 16; i++)
			toks[i] = (uint32_t)(p * 16 + i);
		kvp_rv_page_hash(p ? prev : NULL, toks, 16, h);
		memcpy(prev, h, 32);
		int len = kvp_rv_key(&fp, "ns", h, key);
		unsigned s = kvp_rc_slot(key, (size_t)len);

		distinct += !seen[s];
		seen[s] = 1;
	}
	/* 1,000 uniform draws from 16,384 slots give ~970 distinct; one tag would give 1 */
	CU_ASSERT(distinct > 900);
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_crc32c_known_vector),
		H_TEST(test_crc32c_long_buffers_match_reference),
		H_TEST(test_crc32c_copy_matches_copy_then_checksum),
		H_TEST(test_rv_decode_round_trip),
		H_TEST(test_rv_decode_each_corruption),
		H_TEST(test_rv_decode_refuses_without_the_secret),
		H_TEST(test_rv_mac_layout),
		H_TEST(test_rv_page_hash_matches_sglang),
		H_TEST(test_rv_key_text_and_refusals),
		H_TEST(test_rv_key_pages_of_one_prefix_spread),
	};

	if (kvp_rv_mac_init(&g_mac, SECRET, strlen(SECRET)) < 0)
		return 1;
	return H_RUN_SUITE("remote_value", NULL, NULL, tests);
}
