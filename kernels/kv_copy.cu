/* kv_copy.cu - CUDA implementation of the page transfer contract (kv_copy_cuda.h).
 *
 * A batch of n pages is n * 2 * layers runs of page_tokens * row_bytes contiguous bytes on both
 * sides. One kernel launch covers the batch: each warp takes work items of one chunk of one run
 * (32 lanes * KVP_UNROLL vectors), grid-stride, and copies it with coalesced vector loads, all
 * loads of a lane issued before its stores so several PCIe reads are in flight per lane when the
 * source is mapped host memory. The vector is the widest of 16/8/4/2/1 bytes that divides the row
 * size and both base addresses, so every run start is aligned to it.
 *
 * kvp_copy_runs_cuda enqueues a list of copies an engine plug-in computed (kvpool.vllm_copy)
 * as one cudaMemcpyBatchAsync: the copy engines, no kernel.
 */
#include <cuda.h>	  /* types only: nothing links libcuda */
#include <cudaTypedefs.h> /* PFN_* types only */
#include <cuda_runtime.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kv_copy_cuda.h"

#define KVP_UNROLL 4
#define KVP_WARPS_PER_BLOCK 8
#define KVP_BLOCK_THREADS (32 * KVP_WARPS_PER_BLOCK)
#define KVP_BLOCKS_PER_SM 8	    /* 2048 threads/SM: sm_80/90/100; 1024-1536 elsewhere */
#define KVP_LISTS_INITIAL_CAP 1024u /* pages; grows on demand */

#ifdef __CUDA_ARCH__
#define KVP_UNROLL_LOOP _Pragma("unroll")
#else
#define KVP_UNROLL_LOOP /* host pass of __host__ __device__ code: gcc knows no such pragma */
#endif

struct kvp_copy_cuda {
	int device;
	int sms;
	cudaStream_t stream;
	cudaEvent_t staged; /* recorded after the last copy out of h_lists */
	int staged_pending; /* staged has been recorded at least once */
	uint32_t *h_lists;  /* pinned: [dev pages cap][host pages cap] */
	uint32_t *d_lists;  /* device: same shape */
	uint32_t cap;
	cudaError_t err; /* last CUDA failure, for kvp_copy_cuda_error */
};

struct kvp_copy_args {
	unsigned char *dev;
	unsigned char *host;
	const uint32_t *dev_pages; /* device copies of the lists */
	const uint32_t *host_pages;
	uint64_t run;	     /* bytes of a run: page_tokens * row_bytes */
	uint64_t dev_stride; /* bytes between runs of one device page: dev_slots * row_bytes */
	uint64_t page_bytes; /* host page bytes */
	uint64_t chunks;     /* chunks per run */
	uint64_t items;	     /* n * runs_per_page * chunks */
	uint32_t runs_per_page;
};

/* One work item: chunk `item % chunks` of run `item / chunks % runs_per_page` of page
 * `item / chunks / runs_per_page`, copied by the 32 lanes of a warp. __host__ too, so the exact
 * indexing can be exercised on a CPU. */
template <typename V, bool D2H>
__host__ __device__ __forceinline__ void kvp_copy_item(const kvp_copy_args &a, uint64_t item,
						       uint32_t lane)
{
	const uint64_t run_elems = a.run / sizeof(V);
	const uint64_t chunk = item % a.chunks;
	const uint64_t rest = item / a.chunks;
	const uint32_t r = (uint32_t)(rest % a.runs_per_page);
	const uint32_t i = (uint32_t)(rest / a.runs_per_page);
	const uint64_t dev_off = r * a.dev_stride + (uint64_t)a.dev_pages[i] * a.run;
	const uint64_t host_off = (uint64_t)a.host_pages[i] * a.page_bytes + r * a.run;
	const uint64_t e0 = chunk * (32u * KVP_UNROLL) + lane;
	const V *src;
	V *dst;
	V v[KVP_UNROLL];

	if constexpr (D2H) {
		src = reinterpret_cast<const V *>(a.dev + dev_off);
		dst = reinterpret_cast<V *>(a.host + host_off);
	} else {
		src = reinterpret_cast<const V *>(a.host + host_off);
		dst = reinterpret_cast<V *>(a.dev + dev_off);
	}
	/* all loads of the lane first: KVP_UNROLL requests in flight per lane */
	KVP_UNROLL_LOOP
	for (uint32_t k = 0; k < KVP_UNROLL; k++)
		if (e0 + 32u * k < run_elems)
			v[k] = src[e0 + 32u * k];
	KVP_UNROLL_LOOP
	for (uint32_t k = 0; k < KVP_UNROLL; k++)
		if (e0 + 32u * k < run_elems)
			dst[e0 + 32u * k] = v[k];
}

/* Warps take items grid-stride; consecutive lanes touch consecutive vectors (coalesced). */
template <typename V, bool D2H>
__global__ void __launch_bounds__(KVP_BLOCK_THREADS) kvp_copy_kernel(const kvp_copy_args a)
{
	const uint32_t lane = threadIdx.x & 31u;
	const uint64_t nwarps = ((uint64_t)gridDim.x * blockDim.x) >> 5;

	for (uint64_t item = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; item < a.items;
	     item += nwarps)
		kvp_copy_item<V, D2H>(a, item, lane);
}

static int fail(struct kvp_copy_cuda *c, cudaError_t e)
{
	c->err = e;
	return e == cudaErrorMemoryAllocation ? -ENOMEM : -EIO;
}

/* The caller's current context is put back after each call. With the runtime alone that would
 * mean cudaSetDevice(previous device), which creates a context on that device when the thread had
 * none; the driver's cuCtxGetCurrent/cuCtxSetCurrent (through the runtime's entry point lookup)
 * restore exactly what was there, including nothing. */
static PFN_cuCtxGetCurrent_v4000 g_ctx_get;
static PFN_cuCtxSetCurrent_v4000 g_ctx_set;
static pthread_once_t g_ctx_once = PTHREAD_ONCE_INIT;

static void ctx_fns_load(void)
{
	enum cudaDriverEntryPointQueryResult q;
	void *get = NULL, *set = NULL;

	if (cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &get, 12000, cudaEnableDefault,
					     &q) != cudaSuccess ||
	    q != cudaDriverEntryPointSuccess ||
	    cudaGetDriverEntryPointByVersion("cuCtxSetCurrent", &set, 12000, cudaEnableDefault,
					     &q) != cudaSuccess ||
	    q != cudaDriverEntryPointSuccess || !get || !set) {
		(void)cudaGetLastError();
		return;
	}
	g_ctx_get = (PFN_cuCtxGetCurrent_v4000)get;
	g_ctx_set = (PFN_cuCtxSetCurrent_v4000)set;
}

struct saved_ctx {
	CUcontext ctx; /* with the driver entry points */
	int device;    /* without them: fall back to the runtime's current device */
	bool have_ctx;
};

/* Make c's device current for this thread, remembering what was current before. */
static int enter(struct kvp_copy_cuda *c, struct saved_ctx *prev)
{
	cudaError_t e;

	pthread_once(&g_ctx_once, ctx_fns_load);
	prev->have_ctx = g_ctx_get && g_ctx_get(&prev->ctx) == CUDA_SUCCESS;
	prev->device = c->device;
	if (!prev->have_ctx) {
		e = cudaGetDevice(&prev->device);
		if (e != cudaSuccess)
			return fail(c, e);
	}
	e = cudaSetDevice(c->device);
	if (e != cudaSuccess)
		return fail(c, e);
	return 0;
}

static void leave(struct kvp_copy_cuda *c, const struct saved_ctx *prev)
{
	if (prev->have_ctx)
		g_ctx_set(prev->ctx);
	else if (prev->device != c->device)
		cudaSetDevice(prev->device);
}

static void free_lists(struct kvp_copy_cuda *c)
{
	if (c->h_lists)
		cudaFreeHost(c->h_lists);
	if (c->d_lists)
		cudaFree(c->d_lists);
	c->h_lists = NULL;
	c->d_lists = NULL;
	c->cap = 0;
}

/* Make room for n pages. The device list is read by kernels still queued, so growing waits for
 * the stream first. */
static int reserve_lists(struct kvp_copy_cuda *c, uint32_t n)
{
	uint32_t *h = NULL, *d = NULL, cap;
	cudaError_t e;

	if (n <= c->cap)
		return 0;
	cap = c->cap ? c->cap : KVP_LISTS_INITIAL_CAP;
	while (cap < n)
		cap = cap > UINT32_MAX / 2 ? UINT32_MAX : cap * 2;

	e = cudaStreamSynchronize(c->stream);
	if (e != cudaSuccess)
		return fail(c, e);
	free_lists(c);
	e = cudaHostAlloc((void **)&h, 2 * (size_t)cap * sizeof(uint32_t), cudaHostAllocDefault);
	if (e != cudaSuccess)
		return fail(c, e);
	e = cudaMalloc((void **)&d, 2 * (size_t)cap * sizeof(uint32_t));
	if (e != cudaSuccess) {
		cudaFreeHost(h);
		return fail(c, e);
	}
	c->h_lists = h;
	c->d_lists = d;
	c->cap = cap;
	c->staged_pending = 0;
	return 0;
}

template <bool D2H>
static cudaError_t launch(const kvp_copy_args &a, unsigned width, unsigned blocks, cudaStream_t s)
{
	switch (width) {
	case 16: kvp_copy_kernel<uint4, D2H><<<blocks, KVP_BLOCK_THREADS, 0, s>>>(a); break;
	case 8: kvp_copy_kernel<uint2, D2H><<<blocks, KVP_BLOCK_THREADS, 0, s>>>(a); break;
	case 4: kvp_copy_kernel<uint32_t, D2H><<<blocks, KVP_BLOCK_THREADS, 0, s>>>(a); break;
	case 2: kvp_copy_kernel<uint16_t, D2H><<<blocks, KVP_BLOCK_THREADS, 0, s>>>(a); break;
	default: kvp_copy_kernel<uint8_t, D2H><<<blocks, KVP_BLOCK_THREADS, 0, s>>>(a); break;
	}
	return cudaGetLastError();
}

static int copy_batch(struct kvp_copy_cuda *c, const struct kvp_copy_geom *g, bool d2h,
		      const void *dev_base, const void *host_base, const uint32_t *dev_pages,
		      const uint32_t *host_pages, uint32_t n)
{
	uintptr_t dev_addr = (uintptr_t)dev_base, host_addr = (uintptr_t)host_base;
	uint64_t vec_items, blocks, max_blocks;
	unsigned width = 16;
	struct saved_ctx prev;
	kvp_copy_args a;
	cudaError_t e;
	int ret;

	if (!c)
		return -EINVAL;
	ret = kvp_copy_batch_check(g, dev_base, host_base, dev_pages, host_pages, n);
	if (ret || !n)
		return ret;

	while (width > 1 && (g->row_bytes % width || dev_addr % width || host_addr % width))
		width >>= 1;

	ret = enter(c, &prev);
	if (ret)
		return ret;
	ret = reserve_lists(c, n);
	if (ret)
		goto out;
	/* the previous staging copy out of h_lists must be done before h_lists is rewritten */
	if (c->staged_pending) {
		e = cudaEventSynchronize(c->staged);
		if (e != cudaSuccess) {
			ret = fail(c, e);
			goto out;
		}
	}
	memcpy(c->h_lists, dev_pages, (size_t)n * sizeof(uint32_t));
	memcpy(c->h_lists + c->cap, host_pages, (size_t)n * sizeof(uint32_t));
	e = cudaMemcpyAsync(c->d_lists, c->h_lists, (size_t)n * sizeof(uint32_t),
			    cudaMemcpyHostToDevice, c->stream);
	if (e == cudaSuccess)
		e = cudaMemcpyAsync(c->d_lists + c->cap, c->h_lists + c->cap,
				    (size_t)n * sizeof(uint32_t), cudaMemcpyHostToDevice,
				    c->stream);
	if (e == cudaSuccess)
		e = cudaEventRecord(c->staged, c->stream);
	if (e != cudaSuccess) {
		ret = fail(c, e);
		goto out;
	}
	c->staged_pending = 1;

	a.dev = (unsigned char *)dev_base;
	a.host = (unsigned char *)host_base;
	a.dev_pages = c->d_lists;
	a.host_pages = c->d_lists + c->cap;
	a.run = (uint64_t)g->page_tokens * g->row_bytes;
	a.dev_stride = g->dev_slots * g->row_bytes;
	a.page_bytes = kvp_host_page_bytes(g);
	a.runs_per_page = 2 * g->layers;
	vec_items = 32u * KVP_UNROLL * width; /* bytes one warp item covers */
	a.chunks = (a.run + vec_items - 1) / vec_items;
	a.items = (uint64_t)n * a.runs_per_page * a.chunks;

	blocks = (a.items + KVP_WARPS_PER_BLOCK - 1) / KVP_WARPS_PER_BLOCK;
	max_blocks = (uint64_t)c->sms * KVP_BLOCKS_PER_SM;
	if (blocks > max_blocks)
		blocks = max_blocks;

	/* the launch check below reads the thread's last error: start from a clean one */
	(void)cudaGetLastError();
	e = d2h ? launch<true>(a, width, (unsigned)blocks, c->stream)
		: launch<false>(a, width, (unsigned)blocks, c->stream);
	if (e != cudaSuccess)
		ret = fail(c, e);
out:
	leave(c, &prev);
	return ret;
}

extern "C" int kvp_copy_cuda_new(int device, struct kvp_copy_cuda **out)
{
	struct kvp_copy_cuda *c;
	struct saved_ctx prev;
	int count = 0, ret;
	cudaError_t e;

	if (!out)
		return -EINVAL;
	e = cudaGetDeviceCount(&count);
	if (e != cudaSuccess || count <= 0 || device < 0 || device >= count)
		return -ENODEV;

	c = (struct kvp_copy_cuda *)calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->device = device;
	ret = enter(c, &prev);
	if (ret) {
		free(c);
		return ret;
	}
	e = cudaDeviceGetAttribute(&c->sms, cudaDevAttrMultiProcessorCount, device);
	if (e == cudaSuccess && c->sms <= 0)
		c->sms = 1;
	if (e == cudaSuccess)
		e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
	if (e == cudaSuccess)
		e = cudaEventCreateWithFlags(&c->staged, cudaEventDisableTiming);
	if (e != cudaSuccess) {
		ret = fail(c, e);
		goto err;
	}
	ret = reserve_lists(c, KVP_LISTS_INITIAL_CAP);
	if (ret)
		goto err;
	leave(c, &prev);
	*out = c;
	return 0;
err:
	if (c->staged)
		cudaEventDestroy(c->staged);
	if (c->stream)
		cudaStreamDestroy(c->stream);
	leave(c, &prev);
	free(c);
	return ret;
}

extern "C" void kvp_copy_cuda_free(struct kvp_copy_cuda *c)
{
	struct saved_ctx prev;

	if (!c)
		return;
	if (!enter(c, &prev)) {
		cudaStreamSynchronize(c->stream);
		free_lists(c);
		cudaEventDestroy(c->staged);
		cudaStreamDestroy(c->stream);
		leave(c, &prev);
	}
	free(c);
}

extern "C" int kvp_copy_dev_to_host_cuda(struct kvp_copy_cuda *c, const struct kvp_copy_geom *g,
					 const void *dev_base, void *host_base,
					 const uint32_t *dev_pages, const uint32_t *host_pages,
					 uint32_t n)
{
	return copy_batch(c, g, true, dev_base, host_base, dev_pages, host_pages, n);
}

extern "C" int kvp_copy_host_to_dev_cuda(struct kvp_copy_cuda *c, const struct kvp_copy_geom *g,
					 const void *host_base, void *dev_base,
					 const uint32_t *host_pages, const uint32_t *dev_pages,
					 uint32_t n)
{
	return copy_batch(c, g, false, dev_base, host_base, dev_pages, host_pages, n);
}

extern "C" int kvp_copy_cuda_sync(struct kvp_copy_cuda *c)
{
	cudaError_t e;

	if (!c)
		return -EINVAL;
	e = cudaStreamSynchronize(c->stream);
	if (e != cudaSuccess)
		return fail(c, e);
	return 0;
}

extern "C" int kvp_copy_cuda_fence(struct kvp_copy_cuda *c, void **out)
{
	struct saved_ctx prev;
	cudaEvent_t ev = NULL;
	cudaError_t e;
	int r;

	if (!c || !out)
		return -EINVAL;
	if ((r = enter(c, &prev)) < 0)
		return r;
	e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
	if (e == cudaSuccess) {
		e = cudaEventRecord(ev, c->stream);
		if (e != cudaSuccess)
			cudaEventDestroy(ev);
	}
	leave(c, &prev);
	if (e != cudaSuccess)
		return fail(c, e);
	*out = (void *)ev;
	return 0;
}

extern "C" int kvp_copy_cuda_fence_wait(void *fence)
{
	if (!fence)
		return -EINVAL;
	return cudaEventSynchronize((cudaEvent_t)fence) == cudaSuccess ? 0 : -EIO;
}

extern "C" void kvp_copy_cuda_fence_free(void *fence)
{
	if (!fence)
		return;
	cudaEventSynchronize((cudaEvent_t)fence);
	cudaEventDestroy((cudaEvent_t)fence);
}

extern "C" const char *kvp_copy_cuda_error(const struct kvp_copy_cuda *c)
{
	if (!c || c->err == cudaSuccess)
		return "";
	return cudaGetErrorString(c->err);
}

extern "C" int kvp_copy_runs_cuda(const uint64_t *dst, const uint64_t *src, const uint64_t *bytes,
				  uint64_t n, void *stream)
{
	cudaStream_t s = (cudaStream_t)stream;
	cudaError_t e;

	static_assert(sizeof(void *) == sizeof(uint64_t) && sizeof(size_t) == sizeof(uint64_t),
		      "addresses and sizes are 64-bit");
	if (!n)
		return 0;
	if (!dst || !src || !bytes)
		return -EINVAL;
#if CUDART_VERSION >= 12080
	{
		struct cudaMemcpyAttributes attr;
		size_t idx = 0;

		memset(&attr, 0, sizeof(attr));
		attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
		attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
#if CUDART_VERSION >= 13000
		e = cudaMemcpyBatchAsync((void *const *)dst, (const void *const *)src,
					 (const size_t *)bytes, n, &attr, &idx, 1, s);
#else
		size_t failed = 0;

		e = cudaMemcpyBatchAsync((void **)dst, (void **)src, (size_t *)bytes, n, &attr,
					 &idx, 1, &failed, s);
#endif
		if (e == cudaSuccess)
			return 0;
		(void)cudaGetLastError(); /* an older driver: one copy each below */
	}
#endif
	for (uint64_t i = 0; i < n; i++) {
		e = cudaMemcpyAsync((void *)(uintptr_t)dst[i], (const void *)(uintptr_t)src[i],
				    bytes[i], cudaMemcpyDefault, s);
		if (e != cudaSuccess)
			return -EIO;
	}
	return 0;
}
