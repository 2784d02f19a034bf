/* kv_copy_cpu.c - CPU reference of the page transfer contract in kv_copy.h.
 *
 * A page is 2 * layers runs of page_tokens * row_bytes bytes that are contiguous on both sides,
 * so each run is one memcpy. Pages are visited in list order and, within a page, runs in host
 * order, so the host side is written (or read) as one sequential stream of page_bytes per page
 * while the device side is read as 2 * layers sequential streams.
 */
#include <string.h>

#include "kv_copy.h"

/* Checks shared by both directions; nothing is copied unless the whole batch is valid. */
static int check_batch(const struct kvp_copy_geom *g, const void *dev_base, const void *host_base,
		       const uint32_t *dev_pages, const uint32_t *host_pages, uint32_t n)
{
	uint64_t dev_pages_total;

	if (kvp_copy_geom_check(g))
		return -EINVAL;
	if (!n)
		return 0;
	if (!dev_base || !host_base || !dev_pages || !host_pages)
		return -EINVAL;
	dev_pages_total = kvp_dev_pages(g);
	for (uint32_t i = 0; i < n; i++)
		if (dev_pages[i] >= dev_pages_total)
			return -EINVAL;
	return 0;
}

int kvp_copy_dev_to_host_cpu(const struct kvp_copy_geom *g, const void *dev_base, void *host_base,
			     const uint32_t *dev_pages, const uint32_t *host_pages, uint32_t n)
{
	const unsigned char *dev = dev_base;
	unsigned char *host = host_base;
	uint64_t run, stride;
	int ret;

	ret = check_batch(g, dev_base, host_base, dev_pages, host_pages, n);
	if (ret || !n)
		return ret;
	run = (uint64_t)g->page_tokens * g->row_bytes;
	stride = g->dev_slots * g->row_bytes;

	for (uint32_t i = 0; i < n; i++) {
		const unsigned char *src = dev + (uint64_t)dev_pages[i] * run;
		unsigned char *dst = host + kvp_host_offset(g, host_pages[i], 0, 0, 0);

		/* host runs are back to back; device runs are one stride apart */
		for (uint32_t r = 0; r < 2 * g->layers; r++) {
			memcpy(dst, src, run);
			dst += run;
			src += stride;
		}
	}
	return 0;
}

int kvp_copy_host_to_dev_cpu(const struct kvp_copy_geom *g, const void *host_base, void *dev_base,
			     const uint32_t *host_pages, const uint32_t *dev_pages, uint32_t n)
{
	const unsigned char *host = host_base;
	unsigned char *dev = dev_base;
	uint64_t run, stride;
	int ret;

	ret = check_batch(g, dev_base, host_base, dev_pages, host_pages, n);
	if (ret || !n)
		return ret;
	run = (uint64_t)g->page_tokens * g->row_bytes;
	stride = g->dev_slots * g->row_bytes;

	for (uint32_t i = 0; i < n; i++) {
		const unsigned char *src = host + kvp_host_offset(g, host_pages[i], 0, 0, 0);
		unsigned char *dst = dev + (uint64_t)dev_pages[i] * run;

		for (uint32_t r = 0; r < 2 * g->layers; r++) {
			memcpy(dst, src, run);
			src += run;
			dst += stride;
		}
	}
	return 0;
}
