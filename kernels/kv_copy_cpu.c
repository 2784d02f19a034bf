/* kv_copy_cpu.c - CPU reference of the page transfer contract in kv_copy.h.
 *
 * A page is 2 * layers runs of page_tokens * row_bytes bytes that are contiguous on both sides,
 * so each run is one copy. Pages are visited in list order and, within a page, runs in host
 * order, so the host side is written (or read) as one sequential stream of page_bytes per page
 * while the device side is read as 2 * layers sequential streams.
 *
 * A batch of at least kvp_copy_cpu_stream_threshold() bytes is written with non-temporal stores
 * (x86 SSE2): it bypasses the cache, which a batch that size would mostly evict anyway, and it
 * skips reading the destination lines before writing them. An sfence ends such a batch, so the
 * bytes are visible to every other process once the call returns.
 *
 * kvp_copy_runs_cpu is the same copy for a list of (destination, source, bytes) runs an engine
 * plug-in computed (kvpool.vllm_copy): the bytes of its whole list decide whether it streams.
 * kvp_copy_runs_cpu_part copies one part of such a list that several threads share: the bytes of
 * the whole batch decide.
 */
#include <stdbool.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "kv_copy.h"

static uint64_t g_stream_min = KVP_COPY_STREAM_DEFAULT;

uint64_t kvp_copy_cpu_stream_threshold(uint64_t bytes)
{
	uint64_t prev = g_stream_min;

	g_stream_min = bytes;
	return prev;
}

/* One run: streamed in 64-byte steps when asked (loads may be unaligned; a destination that is
 * not 16-byte aligned gets its first bytes up to the alignment through memcpy), the rest through
 * memcpy. */
static void copy_run(unsigned char *dst, const unsigned char *src, uint64_t n, bool stream)
{
#if defined(__SSE2__)
	uint64_t head = (16 - ((uintptr_t)dst & 15)) & 15;

	if (stream && n >= head + 64) {
		uint64_t body;

		memcpy(dst, src, head);
		dst += head;
		src += head;
		n -= head;
		body = n & ~(uint64_t)63;
		for (uint64_t i = 0; i < body; i += 64) {
			__m128i a = _mm_loadu_si128((const __m128i *)(src + i));
			__m128i b = _mm_loadu_si128((const __m128i *)(src + i + 16));
			__m128i c = _mm_loadu_si128((const __m128i *)(src + i + 32));
			__m128i d = _mm_loadu_si128((const __m128i *)(src + i + 48));

			_mm_stream_si128((__m128i *)(dst + i), a);
			_mm_stream_si128((__m128i *)(dst + i + 16), b);
			_mm_stream_si128((__m128i *)(dst + i + 32), c);
			_mm_stream_si128((__m128i *)(dst + i + 48), d);
		}
		memcpy(dst + body, src + body, n - body);
		return;
	}
#endif
	(void)stream;
	memcpy(dst, src, n);
}

static void end_batch(bool stream)
{
#if defined(__SSE2__)
	if (stream)
		_mm_sfence();
#endif
	(void)stream;
}

int kvp_copy_dev_to_host_cpu(const struct kvp_copy_geom *g, const void *dev_base, void *host_base,
			     const uint32_t *dev_pages, const uint32_t *host_pages, uint32_t n)
{
	const unsigned char *dev = dev_base;
	unsigned char *host = host_base;
	uint64_t run, stride;
	bool stream;
	int ret;

	ret = kvp_copy_batch_check(g, dev_base, host_base, dev_pages, host_pages, n);
	if (ret || !n)
		return ret;
	run = (uint64_t)g->page_tokens * g->row_bytes;
	stride = g->dev_slots * g->row_bytes;
	stream = (uint64_t)n * kvp_host_page_bytes(g) >= g_stream_min;

	for (uint32_t i = 0; i < n; i++) {
		const unsigned char *src = dev + (uint64_t)dev_pages[i] * run;
		unsigned char *dst = host + kvp_host_offset(g, host_pages[i], 0, 0, 0);

		/* host runs are back to back; device runs are one stride apart */
		for (uint32_t r = 0; r < 2 * g->layers; r++) {
			copy_run(dst, src, run, stream);
			dst += run;
			src += stride;
		}
	}
	end_batch(stream);
	return 0;
}

int kvp_copy_host_to_dev_cpu(const struct kvp_copy_geom *g, const void *host_base, void *dev_base,
			     const uint32_t *host_pages, const uint32_t *dev_pages, uint32_t n)
{
	const unsigned char *host = host_base;
	unsigned char *dev = dev_base;
	uint64_t run, stride;
	bool stream;
	int ret;

	ret = kvp_copy_batch_check(g, dev_base, host_base, dev_pages, host_pages, n);
	if (ret || !n)
		return ret;
	run = (uint64_t)g->page_tokens * g->row_bytes;
	stride = g->dev_slots * g->row_bytes;
	stream = (uint64_t)n * kvp_host_page_bytes(g) >= g_stream_min;

	for (uint32_t i = 0; i < n; i++) {
		const unsigned char *src = host + kvp_host_offset(g, host_pages[i], 0, 0, 0);
		unsigned char *dst = dev + (uint64_t)dev_pages[i] * run;

		for (uint32_t r = 0; r < 2 * g->layers; r++) {
			copy_run(dst, src, run, stream);
			src += run;
			dst += stride;
		}
	}
	end_batch(stream);
	return 0;
}

int kvp_copy_runs_cpu_part(const uint64_t *dst, const uint64_t *src, const uint64_t *bytes,
			   uint64_t n, uint64_t batch)
{
	bool stream = batch >= g_stream_min;

	if (!n)
		return 0;
	if (!dst || !src || !bytes)
		return -EINVAL;
	for (uint64_t i = 0; i < n; i++)
		copy_run((unsigned char *)(uintptr_t)dst[i],
			 (const unsigned char *)(uintptr_t)src[i], bytes[i], stream);
	end_batch(stream);
	return 0;
}

int kvp_copy_runs_cpu(const uint64_t *dst, const uint64_t *src, const uint64_t *bytes, uint64_t n)
{
	uint64_t total = 0;

	if (!n)
		return 0;
	if (!dst || !src || !bytes)
		return -EINVAL;
	for (uint64_t i = 0; i < n; i++)
		total += bytes[i];
	return kvp_copy_runs_cpu_part(dst, src, bytes, n, total);
}
