/* kv_copy.h - page transfer contract between the device and host KV layouts.
 *
 * Shared by the CPU reference (kv_copy_cpu.c), the CUDA implementation (kv_copy.cu, through
 * kv_copy_cuda.h) and the client library's address helpers. Plain C; includable from C++/.cu.
 *
 * elem = dtype bytes, row = kv_heads * head_dim * elem bytes: one token of one layer of K or V.
 *
 * Device tier, layer-first [layer][k|v][slot][head][dim]:
 *   offset(layer, kv, slot) = ((layer * 2 + kv) * dev_slots + slot) * row
 *   device page p = slots [p * page_tokens, (p + 1) * page_tokens): 2 * layers runs of
 *   page_tokens * row contiguous bytes, strided by dev_slots * row.
 * Host tier, page-first [page][layer][k|v][page_tokens][head][dim]:
 *   offset(page, layer, kv, t) = (((page * layers + layer) * 2 + kv) * page_tokens + t) * row
 *   a host page is contiguous, page_bytes = layers * 2 * page_tokens * row.
 */
#ifndef KVP_KV_COPY_H
#define KVP_KV_COPY_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The two directions between tiers. */
enum kvp_copy_dir {
	KVP_COPY_DEMOTE = 0, /* device -> host */
	KVP_COPY_PROMOTE,    /* host -> device */
};

struct kvp_copy_geom {
	uint32_t layers;      /* transformer layers, >= 1 */
	uint32_t page_tokens; /* token slots per page, >= 1 */
	uint64_t row_bytes;   /* kv_heads * head_dim * elem, >= 1 */
	uint64_t dev_slots;   /* device tier slots = dev_pages * page_tokens */
	uint64_t host_pages;  /* host tier pages: host page ids of a batch are below it */
};

/* Byte offset of (layer, kv, slot) in the device tier. No checks: call kvp_copy_geom_check first.
 */
static inline uint64_t kvp_dev_offset(const struct kvp_copy_geom *g, uint32_t layer, uint32_t kv,
				      uint64_t slot)
{
	return (((uint64_t)layer * 2 + kv) * g->dev_slots + slot) * g->row_bytes;
}

/* Byte offset of (page, layer, kv, token t of the page) in the host tier. No checks. */
static inline uint64_t kvp_host_offset(const struct kvp_copy_geom *g, uint32_t page, uint32_t layer,
				       uint32_t kv, uint32_t t)
{
	return ((((uint64_t)page * g->layers + layer) * 2 + kv) * g->page_tokens + t) *
	       g->row_bytes;
}

/* Bytes of one host page (= bytes of one device page, spread over 2 * layers runs). */
static inline uint64_t kvp_host_page_bytes(const struct kvp_copy_geom *g)
{
	return (uint64_t)g->layers * 2 * g->page_tokens * g->row_bytes;
}

/* Number of device pages the geometry describes (dev_slots / page_tokens). */
static inline uint64_t kvp_dev_pages(const struct kvp_copy_geom *g)
{
	return g->dev_slots / g->page_tokens;
}

/*
 * Validate a geometry. Returns 0, or -EINVAL when g is NULL, a field but host_pages is zero (no
 * host tier: every host page id is out of range), dev_slots is not a
 * whole number of pages, or the device tier size (2 * layers * dev_slots * row_bytes) or the size
 * of the host tier at the largest page id (2^32 * page_bytes) does not fit in 64 bits.
 * The second bound means any uint32_t host page id has a representable offset.
 */
static inline int kvp_copy_geom_check(const struct kvp_copy_geom *g)
{
	uint64_t run;

	if (!g || !g->layers || !g->page_tokens || !g->row_bytes || !g->dev_slots)
		return -EINVAL;
	if (g->dev_slots % g->page_tokens)
		return -EINVAL;
	/* device tier: 2 * layers * dev_slots * row_bytes */
	if (g->dev_slots > UINT64_MAX / g->row_bytes)
		return -EINVAL;
	if (g->dev_slots * g->row_bytes > UINT64_MAX / 2 / g->layers)
		return -EINVAL;
	/* host page: 2 * layers * page_tokens * row_bytes, times 2^32 pages */
	if (g->row_bytes > UINT64_MAX / g->page_tokens)
		return -EINVAL;
	run = g->row_bytes * g->page_tokens;
	if (run > (UINT64_MAX >> 32) / 2 / g->layers)
		return -EINVAL;
	return 0;
}

/*
 * Validate one batch before anything of it is copied: the geometry, the pointers, and every page
 * id against the tiers' sizes (device ids below kvp_dev_pages(g), host ids below g->host_pages).
 * Both the CPU and the CUDA kernels call it. Returns 0 (n == 0 with any pointers is fine);
 * -EINVAL for a bad geometry or a NULL base or list with n > 0; -ERANGE for a page id out of
 * range.
 */
static inline int kvp_copy_batch_check(const struct kvp_copy_geom *g, const void *dev_base,
				       const void *host_base, const uint32_t *dev_pages,
				       const uint32_t *host_pages, uint32_t n)
{
	uint64_t dev_total;

	if (kvp_copy_geom_check(g))
		return -EINVAL;
	if (!n)
		return 0;
	if (!dev_base || !host_base || !dev_pages || !host_pages)
		return -EINVAL;
	dev_total = kvp_dev_pages(g);
	for (uint32_t i = 0; i < n; i++)
		if (dev_pages[i] >= dev_total || host_pages[i] >= g->host_pages)
			return -ERANGE;
	return 0;
}

/*
 * Gather device pages dev_pages[i] into host pages host_pages[i] (device layout -> host layout),
 * all layers, K and V, for i < n. dev_base/host_base are the starts of the two tiers.
 * Destination page ids must be distinct; source and destination must not overlap.
 * Returns 0, or what kvp_copy_batch_check returns (-EINVAL, -ERANGE: nothing is copied then).
 */
int kvp_copy_dev_to_host_cpu(const struct kvp_copy_geom *g, const void *dev_base, void *host_base,
			     const uint32_t *dev_pages, const uint32_t *host_pages, uint32_t n);

/* Scatter host pages host_pages[i] into device pages dev_pages[i] (host layout -> device layout).
 * Same rules and returns as kvp_copy_dev_to_host_cpu. */
int kvp_copy_host_to_dev_cpu(const struct kvp_copy_geom *g, const void *host_base, void *dev_base,
			     const uint32_t *host_pages, const uint32_t *dev_pages, uint32_t n);

/*
 * Copy n runs of bytes between addresses the caller owns: bytes[i] bytes from src[i] to dst[i],
 * in list order (the copies of engine block tensors to and from mapped host pages: one call for a
 * whole transfer instead of one memcpy call each). Runs of a batch whose bytes add up to at least
 * kvp_copy_cpu_stream_threshold() are written with non-temporal stores, an sfence ending the
 * batch. Runs must not overlap each other or themselves. Returns 0, or -EINVAL when n > 0 and a
 * list is NULL (nothing is copied then).
 */
int kvp_copy_runs_cpu(const uint64_t *dst, const uint64_t *src, const uint64_t *bytes, uint64_t n);

/* The same copy for the runs of one part of a batch of batch bytes that several threads copy,
 * each its parts: the part is streamed when the batch reaches kvp_copy_cpu_stream_threshold(),
 * whatever the part's own bytes, and the sfence ends the part (it orders the calling thread's
 * stores only). Same returns as kvp_copy_runs_cpu. */
int kvp_copy_runs_cpu_part(const uint64_t *dst, const uint64_t *src, const uint64_t *bytes,
			   uint64_t n, uint64_t batch);

/* Batches of at least this many bytes are written with non-temporal stores (x86; elsewhere
 * memcpy): they skip the cache and the read of each destination line. */
#define KVP_COPY_STREAM_DEFAULT (4ull << 20)
/* Sets the threshold for the CPU kernels (0: stream every batch, UINT64_MAX: never) and returns
 * the previous one. Process-wide; not synchronised (kvpoold copies from one thread). */
uint64_t kvp_copy_cpu_stream_threshold(uint64_t bytes);

#ifdef __cplusplus
}
#endif

#endif /* KVP_KV_COPY_H */
