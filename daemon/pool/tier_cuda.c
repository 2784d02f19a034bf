/* tier_cuda.c - the cuda backend of device tiers: GPU memory from the CUDA virtual memory API,
 * exported as a POSIX fd (kernels/cuda_drv.c), with the CUDA kernels (kernels/kv_copy.cu) for
 * demotion and promotion, which reach the host tier through its CUDA registration. A build or a
 * machine without CUDA gets a typed refusal (KVP_TIER_E_UNAVAILABLE) with the reason. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kvp_config.h"
#include "tier.h"

#if KVP_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "cuda_drv.h"
#include "kv_copy_cuda.h"

struct kvp_tier_copy {
	struct kvp_copy_geom g;
	struct kvp_copy_cuda *cc;
	void *dev;  /* device tier */
	void *host; /* host tier, registered with CUDA */
	uint64_t host_bytes;
	void *gpu_view; /* the host tier's address for the GPU's kernels */
	bool registered;
};

static void fill(struct kvp_tier_mem *t, const struct kvp_cuda_mem *m, int device, int fd)
{
	t->ops = &kvp_tier_cuda_ops;
	t->backend = KVP_BACKEND_KIND_CUDA;
	t->fd = fd;
	t->base = (void *)(uintptr_t)m->dptr;
	t->bytes = m->bytes;
	t->cuda_device = device;
	t->cuda_handle = m->handle;
	t->cuda_granularity = m->granularity;
	t->numa_node = kvp_cuda_device_numa_node(device);
	t->has_uuid = kvp_cuda_device_uuid(device, t->cuda_uuid, NULL, 0) == 0;
}

static int cuda_create(struct kvp_tier_mem *t, const struct kvp_tier_spec *s, char *note,
		       size_t notelen, struct kvp_tier_fail *tf)
{
	struct kvp_cuda_mem m;
	char why[256] = "";
	int r;

	(void)note, (void)notelen;
	kvp_tier_mem_init(t);
	r = kvp_cuda_mem_create(s->cuda_device, s->bytes, &m, why, sizeof(why));
	if (r < 0)
		return kvp_tier_err(tf, KVP_TIER_E_UNAVAILABLE, "cuda:%d device tier refused: %s",
				    s->cuda_device, why[0] ? why : strerror(-r));
	fill(t, &m, s->cuda_device, m.fd);
	return 0;
}

static int cuda_adopt(struct kvp_tier_mem *t, int fd, const struct kvp_tier_spec *s,
		      struct kvp_tier_fail *tf)
{
	struct kvp_cuda_mem m;
	char why[256] = "";
	enum kvp_tier_error code;
	int r;

	kvp_tier_mem_init(t);
	if (fd < 0)
		return kvp_tier_err(tf, KVP_TIER_E_INVALID, "%s: adopting needs an fd", s->name);
	r = kvp_cuda_mem_import(s->cuda_device, fd, s->bytes, &m, why, sizeof(why));
	if (r < 0) {
		code = r == -EBADF    ? KVP_TIER_E_BAD_FD
		       : r == -EINVAL ? KVP_TIER_E_SIZE
				      : KVP_TIER_E_UNAVAILABLE;
		return kvp_tier_err(tf, code, "%s: cuda:%d cannot adopt fd %d: %s", s->name,
				    s->cuda_device, fd, why[0] ? why : strerror(-r));
	}
	fill(t, &m, s->cuda_device, fd);
	return 0;
}

static void cuda_destroy(struct kvp_tier_mem *t)
{
	struct kvp_cuda_mem m = {
		.device = t->cuda_device,
		.fd = t->fd,
		.bytes = t->bytes,
		.dptr = (uint64_t)(uintptr_t)t->base,
		.handle = t->cuda_handle,
		.granularity = t->cuda_granularity,
	};

	kvp_cuda_mem_destroy(&m);
	kvp_tier_mem_init(t);
}

static void cuda_copy_close(struct kvp_tier_copy *c)
{
	if (!c)
		return;
	kvp_copy_cuda_free(c->cc); /* waits for queued copies first */
	if (c->registered)
		cudaHostUnregister(c->host);
	free(c);
}

static int cuda_copy_open(struct kvp_tier_mem *dev, struct kvp_tier_mem *host,
			  const struct kvp_copy_geom *g, struct kvp_tier_copy **out,
			  struct kvp_tier_fail *tf)
{
	struct kvp_tier_copy *c;
	cudaError_t e;
	int r;

	if (!dev->base || !host->base || kvp_copy_geom_check(g))
		return kvp_tier_err(tf, KVP_TIER_E_INVALID,
				    "cuda copies: no tier or a bad geometry");
	c = calloc(1, sizeof(*c));
	if (!c)
		return kvp_tier_err(tf, KVP_TIER_E_INTERNAL, "cuda copies: out of memory");
	c->g = *g;
	c->dev = dev->base;
	c->host = host->base;
	c->host_bytes = host->bytes;
	r = kvp_copy_cuda_new(dev->cuda_device, &c->cc);
	if (r < 0) {
		free(c);
		return kvp_tier_err(tf, KVP_TIER_E_UNAVAILABLE,
				    "CUDA transfer stream on device %d: error %d", dev->cuda_device,
				    r);
	}
	/* The kernels may use the host address itself only where the device says
	 * cudaDevAttrCanUseHostPointerForRegisteredMem; the mapped address works everywhere. */
	e = cudaHostRegister(host->base, host->bytes,
			     cudaHostRegisterMapped | cudaHostRegisterPortable);
	if (e == cudaSuccess) {
		c->registered = true;
		e = cudaHostGetDevicePointer(&c->gpu_view, host->base, 0);
	}
	if (e != cudaSuccess || !c->gpu_view) {
		cudaGetLastError();
		cuda_copy_close(c);
		return kvp_tier_err(tf, KVP_TIER_E_UNAVAILABLE,
				    "cudaHostRegister of the host tier failed (%s)",
				    cudaGetErrorString(e));
	}
	*out = c;
	return 0;
}

static int cuda_copy(struct kvp_tier_copy *c, enum kvp_copy_dir dir, const uint32_t *src,
		     const uint32_t *dst, uint32_t n)
{
	if (dir == KVP_COPY_DEMOTE)
		return kvp_copy_dev_to_host_cuda(c->cc, &c->g, c->dev, c->gpu_view, src, dst, n);
	return kvp_copy_host_to_dev_cuda(c->cc, &c->g, c->gpu_view, c->dev, src, dst, n);
}

static int cuda_copy_wait(struct kvp_tier_copy *c)
{
	return kvp_copy_cuda_sync(c->cc);
}

/* A flight is the CUDA event recorded after the copy's kernel: the worker waits on the event,
 * the loop thread keeps using the stream meanwhile. */
struct kvp_tier_flight {
	void *fence;
};

static int cuda_copy_start(struct kvp_tier_copy *c, enum kvp_copy_dir dir, const uint32_t *src,
			   const uint32_t *dst, uint32_t n, struct kvp_tier_flight **out)
{
	struct kvp_tier_flight *f;
	int r;

	*out = NULL;
	if (!(f = malloc(sizeof(*f))))
		return -ENOMEM;
	if ((r = cuda_copy(c, dir, src, dst, n)) < 0) {
		free(f);
		return r;
	}
	if ((r = kvp_copy_cuda_fence(c->cc, &f->fence)) < 0) {
		kvp_copy_cuda_sync(c->cc); /* the kernel is queued: done before its pages go back */
		free(f);
		return r;
	}
	*out = f;
	return 1;
}

static int cuda_flight_wait(struct kvp_tier_flight *f)
{
	return kvp_copy_cuda_fence_wait(f->fence);
}

static void cuda_flight_free(struct kvp_tier_flight *f)
{
	if (!f)
		return;
	kvp_copy_cuda_fence_free(f->fence); /* waits first */
	free(f);
}

const struct kvp_tier_ops kvp_tier_cuda_ops = {
	.name = "cuda",
	.kind = KVP_BACKEND_KIND_CUDA,
	.create = cuda_create,
	.adopt = cuda_adopt,
	.destroy = cuda_destroy,
	.copy_open = cuda_copy_open,
	.copy = cuda_copy,
	.copy_wait = cuda_copy_wait,
	.copy_close = cuda_copy_close,
	.copy_start = cuda_copy_start,
	.flight_wait = cuda_flight_wait,
	.flight_free = cuda_flight_free,
};

#else

static const char no_cuda[] = "this kvpoold was built without CUDA (use device = sim, or "
			      "rebuild with the CUDA toolkit)";

/* Creating and adopting a device tier both end here. */
static int cuda_refuse(struct kvp_tier_mem *t, const struct kvp_tier_spec *s,
		       struct kvp_tier_fail *tf)
{
	kvp_tier_mem_init(t);
	return kvp_tier_err(tf, KVP_TIER_E_UNAVAILABLE, "cuda:%d device tier refused: %s",
			    s->cuda_device, no_cuda);
}

static int cuda_create(struct kvp_tier_mem *t, const struct kvp_tier_spec *s, char *note,
		       size_t notelen, struct kvp_tier_fail *tf)
{
	(void)note, (void)notelen;
	return cuda_refuse(t, s, tf);
}

static int cuda_adopt(struct kvp_tier_mem *t, int fd, const struct kvp_tier_spec *s,
		      struct kvp_tier_fail *tf)
{
	(void)fd;
	return cuda_refuse(t, s, tf);
}

/* Nothing can have been created. */
static void cuda_destroy(struct kvp_tier_mem *t)
{
	kvp_tier_mem_init(t);
}

static int cuda_copy_open(struct kvp_tier_mem *dev, struct kvp_tier_mem *host,
			  const struct kvp_copy_geom *g, struct kvp_tier_copy **out,
			  struct kvp_tier_fail *tf)
{
	(void)dev, (void)host, (void)g, (void)out;
	return kvp_tier_err(tf, KVP_TIER_E_UNAVAILABLE, "cuda copies: %s", no_cuda);
}

static int cuda_copy(struct kvp_tier_copy *c, enum kvp_copy_dir dir, const uint32_t *src,
		     const uint32_t *dst, uint32_t n)
{
	(void)c, (void)dir, (void)src, (void)dst, (void)n;
	return -ENODEV;
}

static int cuda_copy_wait(struct kvp_tier_copy *c)
{
	(void)c;
	return -ENODEV;
}

static void cuda_copy_close(struct kvp_tier_copy *c)
{
	(void)c;
}

const struct kvp_tier_ops kvp_tier_cuda_ops = {
	.name = "cuda",
	.kind = KVP_BACKEND_KIND_CUDA,
	.create = cuda_create,
	.adopt = cuda_adopt,
	.destroy = cuda_destroy,
	.copy_open = cuda_copy_open,
	.copy = cuda_copy,
	.copy_wait = cuda_copy_wait,
	.copy_close = cuda_copy_close,
};

#endif
