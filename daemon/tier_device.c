/* tier_device.c - the cuda device tier seen from the pool: creation with a typed refusal when
 * the build or the machine has no usable GPU, and host-tier registration for the kernels. */
#include <errno.h>
#include <string.h>

#include "kvp_config.h"
#include "tier.h"

#if KVP_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "cuda_drv.h"

int kvp_tier_cuda_create(struct kvp_tier_mem *t, int device, uint64_t bytes, struct kvp_fail *f)
{
	struct kvp_cuda_mem m;
	char why[256] = "";
	int r = kvp_cuda_mem_create(device, bytes, &m, why, sizeof(why));

	memset(t, 0, sizeof(*t));
	t->fd = -1;
	t->numa_node = -1;
	if (r < 0)
		return kvp_fail(f, KVPOOL__CODE__UNAVAILABLE, "cuda:%d device tier refused: %s",
				device, why[0] ? why : strerror(-r));
	t->backend = KVPOOL__BACKEND__CUDA;
	t->fd = m.fd;
	t->base = (void *)(uintptr_t)m.dptr;
	t->bytes = m.bytes;
	t->cuda_device = device;
	t->cuda_handle = m.handle;
	t->cuda_granularity = m.granularity;
	t->numa_node = kvp_cuda_device_numa_node(device);
	t->has_uuid = kvp_cuda_device_uuid(device, t->cuda_uuid, NULL, 0) == 0;
	return 0;
}

void kvp_tier_cuda_destroy(struct kvp_tier_mem *t)
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
}

int kvp_tier_cuda_register_host(struct kvp_tier_mem *host)
{
	cudaError_t e = cudaHostRegister(host->base, host->bytes,
					 cudaHostRegisterMapped | cudaHostRegisterPortable);
	void *view = NULL;

	if (e != cudaSuccess)
		return -EIO;
	/* The kernels may use the host address itself only where the device says
	 * cudaDevAttrCanUseHostPointerForRegisteredMem; the mapped address works everywhere. */
	e = cudaHostGetDevicePointer(&view, host->base, 0);
	if (e != cudaSuccess || !view) {
		cudaHostUnregister(host->base);
		cudaGetLastError();
		return -EIO;
	}
	host->host_registered = true;
	host->gpu_view = view;
	return 0;
}

void kvp_tier_cuda_unregister_host(struct kvp_tier_mem *host)
{
	cudaHostUnregister(host->base);
	host->host_registered = false;
	host->gpu_view = NULL;
}

#else

int kvp_tier_cuda_create(struct kvp_tier_mem *t, int device, uint64_t bytes, struct kvp_fail *f)
{
	(void)bytes;
	memset(t, 0, sizeof(*t));
	t->fd = -1;
	return kvp_fail(f, KVPOOL__CODE__UNAVAILABLE,
			"cuda:%d device tier refused: this kvpoold was built without CUDA "
			"(use device = sim, or rebuild with the CUDA toolkit)",
			device);
}

void kvp_tier_cuda_destroy(struct kvp_tier_mem *t)
{
	(void)t;
}

#endif
