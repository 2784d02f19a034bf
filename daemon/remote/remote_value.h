/* remote_value.h - what kvpool stores in the remote tier: one value per page (a header that
 * names the pool geometry, then the page bytes in the host layout) and the content keys the
 * values live under (chained SHA-256 page hashes, prefixed by pool fingerprint and namespace).
 *
 * Value layout, all integers little-endian, KVP_RV_HDR_SIZE (48) bytes of header:
 *   0  u32 magic "KVPV"      4 u16 version (1)   6 u16 header size (48)
 *   8  u32 layers  12 u32 kv_heads  16 u32 head_dim  20 u32 dtype  24 u32 page_tokens
 *   28 u32 layout  32 u64 payload length  40 u32 CRC32C (Castagnoli) of the payload
 *   44 u32 CRC32C of bytes 0..43 (the header itself)
 *   48 payload (the page bytes) */
#pragma once
#include <stddef.h>
#include <stdint.h>

#define KVP_RV_MAGIC 0x5650564bu /* "KVPV" read little-endian */
#define KVP_RV_VERSION 1
#define KVP_RV_HDR_SIZE 48
#define KVP_RV_HASH_SIZE 32 /* SHA-256 */
#define KVP_RV_NS_MAX 64    /* namespace bytes in a key */
#define KVP_RV_KEY_MAX (4 + 16 + 1 + KVP_RV_NS_MAX + 1 + 2 * KVP_RV_HASH_SIZE + 1)

/* The pool geometry a page's bytes only make sense in. Pools that differ in any field never
 * read each other's values. */
struct kvp_rv_fp {
	uint32_t layers;
	uint32_t kv_heads;
	uint32_t head_dim;
	uint32_t dtype;
	uint32_t page_tokens;
	uint32_t layout;
};

/* Why a value was refused (returned negated). */
enum kvp_rv_err {
	KVP_RV_OK = 0,
	KVP_RV_ESHORT,	  /* shorter than a header */
	KVP_RV_EMAGIC,	  /* not a kvpool value */
	KVP_RV_EVERSION,  /* another format version (or header size) */
	KVP_RV_EHEADER,	  /* header checksum mismatch */
	KVP_RV_EFOREIGN,  /* written by a pool of another geometry */
	KVP_RV_ELENGTH,	  /* payload length differs from the header's, or from the page size */
	KVP_RV_ECHECKSUM, /* payload checksum mismatch */
	KVP_RV_ERR_MAX,
};

/* Name of an error (positive or negated value), "unknown" out of range. */
const char *kvp_rv_strerror(int err);

/* CRC32C (Castagnoli, reflected, init and final xor ~0) of n bytes: SSE4.2 when the CPU has
 * it, a table otherwise. crc32c("123456789") == 0xe3069283. */
uint32_t kvp_rv_crc32c(const void *p, size_t n);

/* Writes the header for a payload of n bytes at p into hdr (KVP_RV_HDR_SIZE bytes). The value
 * is hdr followed by the payload: the caller sends both (no copy of the page here). */
void kvp_rv_header(const struct kvp_rv_fp *fp, const void *p, uint64_t n, void *hdr);
/* The same for a payload of n bytes whose CRC32C (kvp_rv_crc32c) the caller has: crc. */
void kvp_rv_header_crc(const struct kvp_rv_fp *fp, uint64_t n, uint32_t crc, void *hdr);
/* hdr then payload into out (KVP_RV_HDR_SIZE + n bytes). Returns the value's size. */
size_t kvp_rv_encode(const struct kvp_rv_fp *fp, const void *p, uint64_t n, void *out);
/* Checks a value against fp and the expected page size (0: any). On success returns 0 and
 * points *payload / *n at the page bytes inside v; otherwise -KVP_RV_E* and leaves them. */
int kvp_rv_decode(const struct kvp_rv_fp *fp, uint64_t page_bytes, const void *v, size_t len,
		  const void **payload, uint64_t *n);

/* 64-bit fingerprint id of a geometry (the first 8 bytes of SHA-256 of its fields), for keys. */
uint64_t kvp_rv_fp_id(const struct kvp_rv_fp *fp);

/* Chained page hash: SHA-256 (nettle's) over prior (KVP_RV_HASH_SIZE bytes, skipped when NULL:
 * the first page) then each token id as 4 bytes little-endian. Returns 0. */
int kvp_rv_page_hash(const uint8_t *prior, const uint32_t *tokens, size_t n,
		     uint8_t out[KVP_RV_HASH_SIZE]);

/* The remote key "kvp:<fp id, 16 hex>:<ns>:<hash, 64 hex>" into out (KVP_RV_KEY_MAX bytes,
 * NUL-terminated). No hash tag: the pages of one prefix spread over all slots. Returns the key
 * length, -EINVAL when ns is empty, longer than KVP_RV_NS_MAX, or holds '{', '}', ':' or
 * bytes outside printable ASCII. */
int kvp_rv_key(const struct kvp_rv_fp *fp, const char *ns, const uint8_t hash[KVP_RV_HASH_SIZE],
	       char *out);
