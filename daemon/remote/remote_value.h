/* remote_value.h - what kvpool stores in the remote tier: one value per page (a header that
 * names the pool geometry and carries a keyed MAC, then the page bytes in the host layout) and
 * the content keys the values live under (chained SHA-256 page hashes, prefixed by pool
 * fingerprint and namespace).
 *
 * Value layout, all integers little-endian, KVP_RV_HDR_SIZE (80) bytes of header:
 *   0  u32 magic "KVPV"      4 u16 version (2)   6 u16 header size (80)
 *   8  u32 layers  12 u32 kv_heads  16 u32 head_dim  20 u32 dtype  24 u32 page_tokens
 *   28 u32 layout  32 u64 payload length  40 u32 CRC32C (Castagnoli) of the payload
 *   44 u32 CRC32C of bytes 0..43 (the header itself)
 *   48 16 bytes: the MAC's nonce (8 random bytes of the writer, then its count, u64)
 *   64 16 bytes: UMAC-128 (RFC 4418, nettle's) under the deployment's key, with that nonce, of
 *      the key's length (u64), the key the value is stored under, bytes 0..63 and the payload
 *   80 payload (the page bytes)
 * The MAC key is the first 16 bytes of HMAC-SHA256(secret, "kvpool remote value mac v2").
 * UMAC-128 rather than HMAC-SHA256: 3.8 GB/s against 0.7 for nettle 3.8's HMAC-SHA256 over
 * 256 KiB pages on the build machine, on the remote I/O thread that writes and reads them.
 * The checksums catch corruption; the MAC refuses a value no kvpoold holding the secret wrote
 * under that key (a forged one, or one copied from another key). Version 1 values (no MAC) are
 * refused as another version. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#include <nettle/umac.h>

#define KVP_RV_MAGIC 0x5650564bu /* "KVPV" read little-endian */
#define KVP_RV_VERSION 2
#define KVP_RV_HDR_SIZE 80
#define KVP_RV_NONCE_AT 48
#define KVP_RV_NONCE_SIZE 16
#define KVP_RV_MAC_AT 64
#define KVP_RV_MAC_SIZE 16
#define KVP_RV_SECRET_MIN 16 /* bytes of a MAC secret at least */
#define KVP_RV_HASH_SIZE 32  /* SHA-256 */
#define KVP_RV_NS_MAX 64     /* namespace bytes in a key */
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
	KVP_RV_EMAC,	  /* MAC mismatch: not written under this key with the secret */
	KVP_RV_ERR_MAX,
};

/* The MAC key, prepared once, and the writer's nonces. One thread at a time: sealing and
 * checking change it. */
struct kvp_rv_mac {
	struct umac128_ctx ctx;
	uint8_t prefix[8]; /* random, per kvp_rv_mac_init */
	uint64_t count;	   /* values sealed */
};

/* Prepares m for secret (len bytes, at least KVP_RV_SECRET_MIN). 0, -EINVAL when shorter, or
 * the -errno of getrandom. */
int kvp_rv_mac_init(struct kvp_rv_mac *m, const void *secret, size_t len);

/* Name of an error (positive or negated value), "unknown" out of range. */
const char *kvp_rv_strerror(int err);

/* CRC32C (Castagnoli, reflected, init and final xor ~0) of n bytes: SSE4.2 when the CPU has
 * it, a table otherwise. crc32c("123456789") == 0xe3069283. */
uint32_t kvp_rv_crc32c(const void *p, size_t n);

/* Writes the header of a value stored under key (klen bytes) for a payload of n bytes at p into
 * hdr (KVP_RV_HDR_SIZE bytes), its MAC under m. The value is hdr followed by the payload: the
 * caller sends both (no copy of the page here). */
void kvp_rv_header(const struct kvp_rv_fp *fp, struct kvp_rv_mac *m, const void *key, size_t klen,
		   const void *p, uint64_t n, void *hdr);
/* Bytes 0..47 of the header for a payload of n bytes whose CRC32C (kvp_rv_crc32c) the caller
 * has: crc; nonce and MAC zero until kvp_rv_seal. */
void kvp_rv_header_crc(const struct kvp_rv_fp *fp, uint64_t n, uint32_t crc, void *hdr);
/* Writes a fresh nonce and the MAC of a value (key, hdr's bytes 0..63, the payload p of n
 * bytes) into hdr. */
void kvp_rv_seal(struct kvp_rv_mac *m, const void *key, size_t klen, void *hdr, const void *p,
		 uint64_t n);
/* hdr then payload into out (KVP_RV_HDR_SIZE + n bytes). Returns the value's size. */
size_t kvp_rv_encode(const struct kvp_rv_fp *fp, struct kvp_rv_mac *m, const void *key, size_t klen,
		     const void *p, uint64_t n, void *out);
/* Checks a value read from key (klen bytes) against fp, the expected page size (0: any) and
 * its MAC under m. On success returns 0 and points *payload / *n at the page bytes inside v;
 * otherwise -KVP_RV_E* and leaves them. */
int kvp_rv_decode(const struct kvp_rv_fp *fp, struct kvp_rv_mac *m, const void *key, size_t klen,
		  uint64_t page_bytes, const void *v, size_t len, const void **payload,
		  uint64_t *n);

/* 64-bit fingerprint id of a geometry (the first 8 bytes of SHA-256 of its fields), for keys. */
uint64_t kvp_rv_fp_id(const struct kvp_rv_fp *fp);

/* Chained page hash: the token page key of the page index (page_key.h: SHA-256 over prior, skipped
 * when NULL for the first page, then each token id as 4 bytes little-endian). Returns 0. */
int kvp_rv_page_hash(const uint8_t *prior, const uint32_t *tokens, size_t n,
		     uint8_t out[KVP_RV_HASH_SIZE]);

/* The namespace part of a remote key: "<scope id>.t<ns>" (token-keyed) or ".k<ns>" (keyed) into
 * out (KVP_RV_NSNAME_MAX bytes). The scope id, 16 hex, is the first 8 bytes of SHA-256 over
 * scope (with its NUL) and, for a namespace bound to users and groups (owner not NULL: its
 * n_uids, uids, n_gids, gids as u32 in host order), those ids: pools share content only within
 * one scope, and a bound namespace only with the one bound to the same ids. */
#define KVP_RV_NSNAME_MAX 48
struct kvp_ns_owner;
void kvp_rv_ns_name(const char *scope, const struct kvp_ns_owner *owner, int keyed, uint64_t ns,
		    char out[KVP_RV_NSNAME_MAX]);

/* The remote key "kvp:<fp id, 16 hex>:<ns>:<hash, 64 hex>" into out (KVP_RV_KEY_MAX bytes,
 * NUL-terminated). No hash tag: the pages of one prefix spread over all slots. Returns the key
 * length, -EINVAL when ns is empty, longer than KVP_RV_NS_MAX, or holds '{', '}', ':' or
 * bytes outside printable ASCII. */
int kvp_rv_key(const struct kvp_rv_fp *fp, const char *ns, const uint8_t hash[KVP_RV_HASH_SIZE],
	       char *out);
