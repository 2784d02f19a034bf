/* remote_value.c - the remote tier's value format and content keys (see remote_value.h). */
#include "remote_value.h"

#include "config.h"
#include "crc32c.h"
#include "page_key.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <sys/random.h>

#include <nettle/hmac.h>
#include <nettle/sha2.h>

static const char *const rv_err_names[KVP_RV_ERR_MAX] = {
	[KVP_RV_OK] = "ok",
	[KVP_RV_ESHORT] = "short value",
	[KVP_RV_EMAGIC] = "bad magic",
	[KVP_RV_EVERSION] = "unknown version",
	[KVP_RV_EHEADER] = "header checksum mismatch",
	[KVP_RV_EFOREIGN] = "foreign pool fingerprint",
	[KVP_RV_ELENGTH] = "payload length mismatch",
	[KVP_RV_ECHECKSUM] = "payload checksum mismatch",
	[KVP_RV_EMAC] = "MAC mismatch",
};

const char *kvp_rv_strerror(int err)
{
	if (err < 0)
		err = -err;
	return err < KVP_RV_ERR_MAX ? rv_err_names[err] : "unknown";
}

uint32_t kvp_rv_crc32c(const void *p, size_t n)
{
	return kvp_crc32c(p, n);
}

static void put16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}

static void put32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint16_t get16(const uint8_t *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}

static uint32_t get32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get64(const uint8_t *p)
{
	return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32;
}

static void fp_put(uint8_t *p, const struct kvp_rv_fp *fp)
{
	put32(p, fp->layers);
	put32(p + 4, fp->kv_heads);
	put32(p + 8, fp->head_dim);
	put32(p + 12, fp->dtype);
	put32(p + 16, fp->page_tokens);
	put32(p + 20, fp->layout);
}

int kvp_rv_mac_init(struct kvp_rv_mac *m, const void *secret, size_t len)
{
	static const char label[] = "kvpool remote value mac v2";
	struct hmac_sha256_ctx h;
	uint8_t k[SHA256_DIGEST_SIZE];

	if (len < KVP_RV_SECRET_MIN)
		return -EINVAL;
	if (getrandom(m->prefix, sizeof(m->prefix), 0) != (ssize_t)sizeof(m->prefix))
		return -errno;
	m->count = 0;
	hmac_sha256_set_key(&h, len, secret);
	hmac_sha256_update(&h, sizeof(label) - 1, (const uint8_t *)label);
	hmac_sha256_digest(&h, sizeof(k), k);
	umac128_set_key(&m->ctx, k); /* its first UMAC_KEY_SIZE bytes */
	explicit_bzero(k, sizeof(k));
	explicit_bzero(&h, sizeof(h));
	return 0;
}

/* The MAC of a value into out (KVP_RV_MAC_SIZE bytes), under hdr's nonce: over the key's length
 * (so that no key and header bytes pass for another split of the same bytes), the key, bytes
 * 0..63 of the header (the nonce among them) and the payload. */
static void rv_mac(struct kvp_rv_mac *m, const void *key, size_t klen, const uint8_t *hdr,
		   const void *p, uint64_t n, uint8_t out[KVP_RV_MAC_SIZE])
{
	uint8_t kl[8];

	put64(kl, klen);
	umac128_set_nonce(&m->ctx, KVP_RV_NONCE_SIZE, hdr + KVP_RV_NONCE_AT);
	umac128_update(&m->ctx, sizeof(kl), kl);
	umac128_update(&m->ctx, klen, key);
	umac128_update(&m->ctx, KVP_RV_MAC_AT, hdr);
	umac128_update(&m->ctx, n, p);
	umac128_digest(&m->ctx, KVP_RV_MAC_SIZE, out);
}

void kvp_rv_header_crc(const struct kvp_rv_fp *fp, uint64_t n, uint32_t crc, void *hdr)
{
	uint8_t *h = hdr;

	memset(h + KVP_RV_NONCE_AT, 0, KVP_RV_NONCE_SIZE + KVP_RV_MAC_SIZE);
	put32(h, KVP_RV_MAGIC);
	put16(h + 4, KVP_RV_VERSION);
	put16(h + 6, KVP_RV_HDR_SIZE);
	fp_put(h + 8, fp);
	put64(h + 32, n);
	put32(h + 40, crc);
	put32(h + 44, kvp_rv_crc32c(h, 44));
}

void kvp_rv_seal(struct kvp_rv_mac *m, const void *key, size_t klen, void *hdr, const void *p,
		 uint64_t n)
{
	uint8_t *h = hdr;

	/* unique per value: the writer's random prefix and its count */
	memcpy(h + KVP_RV_NONCE_AT, m->prefix, sizeof(m->prefix));
	put64(h + KVP_RV_NONCE_AT + 8, m->count++);
	rv_mac(m, key, klen, h, p, n, h + KVP_RV_MAC_AT);
}

void kvp_rv_header(const struct kvp_rv_fp *fp, struct kvp_rv_mac *m, const void *key, size_t klen,
		   const void *p, uint64_t n, void *hdr)
{
	kvp_rv_header_crc(fp, n, kvp_rv_crc32c(p, n), hdr);
	kvp_rv_seal(m, key, klen, hdr, p, n);
}

size_t kvp_rv_encode(const struct kvp_rv_fp *fp, struct kvp_rv_mac *m, const void *key, size_t klen,
		     const void *p, uint64_t n, void *out)
{
	kvp_rv_header(fp, m, key, klen, p, n, out);
	memcpy((uint8_t *)out + KVP_RV_HDR_SIZE, p, n);
	return KVP_RV_HDR_SIZE + n;
}

/* Compares n bytes in a time that does not depend on where they differ. */
static int same_bytes(const uint8_t *a, const uint8_t *b, size_t n)
{
	uint8_t d = 0;

	for (size_t i = 0; i < n; i++)
		d |= a[i] ^ b[i];
	return d == 0;
}

int kvp_rv_decode(const struct kvp_rv_fp *fp, struct kvp_rv_mac *m, const void *key, size_t klen,
		  uint64_t page_bytes, const void *v, size_t len, const void **payload, uint64_t *n)
{
	const uint8_t *h = v;
	uint8_t want[24], mac[KVP_RV_MAC_SIZE];
	uint64_t plen;

	if (len < KVP_RV_HDR_SIZE)
		return -KVP_RV_ESHORT;
	if (get32(h) != KVP_RV_MAGIC)
		return -KVP_RV_EMAGIC;
	if (get16(h + 4) != KVP_RV_VERSION || get16(h + 6) != KVP_RV_HDR_SIZE)
		return -KVP_RV_EVERSION;
	if (get32(h + 44) != kvp_rv_crc32c(h, 44))
		return -KVP_RV_EHEADER;
	fp_put(want, fp);
	if (memcmp(want, h + 8, sizeof(want)))
		return -KVP_RV_EFOREIGN;
	plen = get64(h + 32);
	if (plen != len - KVP_RV_HDR_SIZE || (page_bytes && plen != page_bytes))
		return -KVP_RV_ELENGTH;
	if (get32(h + 40) != kvp_rv_crc32c(h + KVP_RV_HDR_SIZE, plen))
		return -KVP_RV_ECHECKSUM;
	rv_mac(m, key, klen, h, h + KVP_RV_HDR_SIZE, plen, mac);
	if (!same_bytes(mac, h + KVP_RV_MAC_AT, sizeof(mac)))
		return -KVP_RV_EMAC;
	*payload = h + KVP_RV_HDR_SIZE;
	*n = plen;
	return 0;
}

uint64_t kvp_rv_fp_id(const struct kvp_rv_fp *fp)
{
	struct sha256_ctx ctx;
	uint8_t b[24], md[SHA256_DIGEST_SIZE];

	fp_put(b, fp);
	sha256_init(&ctx);
	sha256_update(&ctx, sizeof(b), b);
	sha256_digest(&ctx, sizeof(md), md);
	return get64(md);
}

int kvp_rv_page_hash(const uint8_t *prior, const uint32_t *tokens, size_t n,
		     uint8_t out[KVP_RV_HASH_SIZE])
{
	_Static_assert(KVP_RV_HASH_SIZE == KVP_PAGE_KEY_BYTES, "a remote hash is a page key");
	kvp_page_key(prior, tokens, n, out); /* the page index's own keys */
	return 0;
}

int kvp_rv_key(const struct kvp_rv_fp *fp, const char *ns, const uint8_t hash[KVP_RV_HASH_SIZE],
	       char *out)
{
	static const char hex[] = "0123456789abcdef";
	size_t nl = strlen(ns);
	int len;

	if (!nl || nl > KVP_RV_NS_MAX)
		return -EINVAL;
	for (size_t i = 0; i < nl; i++)
		if (ns[i] <= ' ' || ns[i] > '~' || ns[i] == '{' || ns[i] == '}' || ns[i] == ':')
			return -EINVAL;
	len = snprintf(out, KVP_RV_KEY_MAX, "kvp:%016llx:%s:", (unsigned long long)kvp_rv_fp_id(fp),
		       ns);
	for (int i = 0; i < KVP_RV_HASH_SIZE; i++) {
		out[len++] = hex[hash[i] >> 4];
		out[len++] = hex[hash[i] & 15];
	}
	out[len] = '\0';
	return len;
}

void kvp_rv_ns_name(const char *scope, const struct kvp_ns_owner *o, int keyed, uint64_t ns,
		    char out[KVP_RV_NSNAME_MAX])
{
	uint32_t ids[2 * KVP_MAX_IDS + 2];
	uint8_t md[SHA256_DIGEST_SIZE];
	struct sha256_ctx h;
	uint32_t n = 0;

	sha256_init(&h);
	sha256_update(&h, strlen(scope) + 1, (const uint8_t *)scope);
	if (o) {
		ids[n++] = o->n_uids;
		for (uint32_t i = 0; i < o->n_uids && i < KVP_MAX_IDS; i++)
			ids[n++] = o->uids[i];
		ids[n++] = o->n_gids;
		for (uint32_t i = 0; i < o->n_gids && i < KVP_MAX_IDS; i++)
			ids[n++] = o->gids[i];
		sha256_update(&h, n * sizeof(ids[0]), (const uint8_t *)ids);
	}
	sha256_digest(&h, sizeof(md), md);
	snprintf(out, KVP_RV_NSNAME_MAX, "%02x%02x%02x%02x%02x%02x%02x%02x.%c%llu", md[0], md[1],
		 md[2], md[3], md[4], md[5], md[6], md[7], keyed ? 'k' : 't',
		 (unsigned long long)ns);
}
