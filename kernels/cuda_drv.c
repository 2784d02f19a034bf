/* cuda_drv.c - CUDA driver glue shared by kvpoold and libkvpool (see cuda_drv.h).
 *
 * The static CUDA runtime finds the driver (libcuda.so.1) at run time; driver calls are looked up
 * once through cudaGetDriverEntryPointByVersion and cuda.h supplies only types, so nothing here
 * links libcuda and a machine without a driver gets -ENODEV and a reason. Each call makes the
 * device's primary context current (retained by the runtime for the life of the process, which
 * keeps the mappings valid) and puts the caller's context back before returning.
 * No daemon dependencies.
 */
#include <ctype.h>
#include <cuda.h>	  /* types only */
#include <cudaTypedefs.h> /* PFN_* types only */
#include <cuda_runtime_api.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cuda_drv.h"

/* ABI of the driver symbols we ask for: every one used here exists in this form since <= 10.2,
 * and a driver able to run CUDA 13 runtime code is newer than this. */
#define KVP_CUDA_DRV_ABI 12000

struct drv_api {
	PFN_cuGetErrorString_v6000 get_error_string;
	PFN_cuDeviceGet_v2000 device_get;
	PFN_cuDeviceGetAttribute_v2000 device_get_attribute;
	PFN_cuCtxGetCurrent_v4000 ctx_get_current;
	PFN_cuCtxSetCurrent_v4000 ctx_set_current;
	PFN_cuMemGetAllocationGranularity_v10020 mem_get_granularity;
	PFN_cuMemCreate_v10020 mem_create;
	PFN_cuMemRelease_v10020 mem_release;
	PFN_cuMemExportToShareableHandle_v10020 mem_export;
	PFN_cuMemImportFromShareableHandle_v10020 mem_import;
	PFN_cuMemAddressReserve_v10020 mem_address_reserve;
	PFN_cuMemAddressFree_v10020 mem_address_free;
	PFN_cuMemMap_v10020 mem_map;
	PFN_cuMemUnmap_v10020 mem_unmap;
	PFN_cuMemSetAccess_v10020 mem_set_access;
};

/*
 * Filled once, by drv_init under pthread_once; read-only after. g_drv_state is DRV_UNTRIED until
 * then, and then 0 (g_drv usable) or a negative errno (g_drv_why says why), stored with release
 * after g_drv is written. A thread that went through pthread_once may read g_drv directly; one
 * that did not (kvp_cuda_mem_destroy) reads g_drv_state with acquire first (drv_loaded).
 */
#define DRV_UNTRIED 1
static struct drv_api g_drv;
static char g_drv_why[256];
static atomic_int g_drv_state = DRV_UNTRIED;
static pthread_once_t g_drv_once = PTHREAD_ONCE_INIT;
static kvp_cuda_drv_lookup_fn g_drv_lookup;

__attribute__((format(printf, 3, 4))) static void say(char *reason, size_t len, const char *fmt,
						      ...)
{
	va_list ap;

	if (!reason || !len)
		return;
	va_start(ap, fmt);
	vsnprintf(reason, len, fmt, ap);
	va_end(ap);
}

static const char *drv_str(CUresult r)
{
	const char *s = NULL;

	if (!g_drv.get_error_string || g_drv.get_error_string(r, &s) != CUDA_SUCCESS || !s)
		return "unknown driver error";
	return s;
}

static int drv_errno(CUresult r)
{
	switch (r) {
	case CUDA_ERROR_OUT_OF_MEMORY: return -ENOMEM;
	case CUDA_ERROR_NOT_SUPPORTED: return -ENOTSUP;
	case CUDA_ERROR_INVALID_VALUE: return -EINVAL;
	default: return -EIO;
	}
}

/* Number of devices the runtime sees (>= 1), or -ENODEV (no driver, an older one, no GPU) or
 * -EIO (the runtime failed otherwise) with a reason. */
static int rt_count(char *reason, size_t len)
{
	int count = 0, drv = 0, rt = 0;
	cudaError_t e;

	e = cudaGetDeviceCount(&count);
	if (e != cudaSuccess) {
		cudaDriverGetVersion(&drv);
		cudaRuntimeGetVersion(&rt);
		if (!drv)
			say(reason, len, "no CUDA driver (cudaGetDeviceCount: %s)",
			    cudaGetErrorString(e));
		else if (e == cudaErrorInsufficientDriver)
			say(reason, len,
			    "CUDA driver %d.%d is older than the runtime %d.%d "
			    "(cudaGetDeviceCount: %s)",
			    drv / 1000, drv % 1000 / 10, rt / 1000, rt % 1000 / 10,
			    cudaGetErrorString(e));
		else if (e == cudaErrorNoDevice)
			say(reason, len, "no CUDA GPU (cudaGetDeviceCount: %s)",
			    cudaGetErrorString(e));
		else
			say(reason, len, "CUDA unusable (cudaGetDeviceCount: %s)",
			    cudaGetErrorString(e));
		cudaGetLastError();
		/* no driver, an older one or no GPU: none to use; anything else is a failure */
		return !drv || e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice ? -ENODEV
											  : -EIO;
	}
	if (count <= 0) {
		say(reason, len, "no CUDA GPU (cudaGetDeviceCount: 0 devices)");
		return -ENODEV;
	}
	return count;
}

static int rt_device(int device, char *reason, size_t len)
{
	int count = rt_count(reason, len);

	if (count < 0)
		return count;
	if (device < 0 || device >= count) {
		say(reason, len, "device %d not present (%d GPU%s)", device, count,
		    count == 1 ? "" : "s");
		return -ENODEV;
	}
	return 0;
}

/* The default lookup: the runtime's, at the ABI above. */
static int rt_lookup(const char *name, void **fn, char *reason, size_t len)
{
	enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
	int drv = 0;
	cudaError_t e;

	*fn = NULL;
	e = cudaGetDriverEntryPointByVersion(name, fn, KVP_CUDA_DRV_ABI, cudaEnableDefault, &q);
	if (e == cudaSuccess && q == cudaDriverEntryPointSuccess && *fn)
		return 0;
	cudaDriverGetVersion(&drv);
	if (!drv || e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice) {
		say(reason, len, "no usable CUDA driver (looking up %s: %s)", name,
		    cudaGetErrorString(e));
		cudaGetLastError();
		return -ENODEV;
	}
	say(reason, len, "CUDA driver lacks %s for CUDA %d.%d ABI (%s, status %d)", name,
	    KVP_CUDA_DRV_ABI / 1000, KVP_CUDA_DRV_ABI % 1000 / 10, cudaGetErrorString(e), (int)q);
	cudaGetLastError();
	return -ENOSYS;
}

void kvp_cuda_drv_set_lookup(kvp_cuda_drv_lookup_fn lookup)
{
	g_drv_lookup = lookup;
}

/* The once routine: every entry point, or none (g_drv zeroed) and the reason. */
static void drv_init(void)
{
	struct {
		const char *name;
		void **slot;
	} syms[] = {
		{ "cuGetErrorString", (void **)&g_drv.get_error_string },
		{ "cuDeviceGet", (void **)&g_drv.device_get },
		{ "cuDeviceGetAttribute", (void **)&g_drv.device_get_attribute },
		{ "cuCtxGetCurrent", (void **)&g_drv.ctx_get_current },
		{ "cuCtxSetCurrent", (void **)&g_drv.ctx_set_current },
		{ "cuMemGetAllocationGranularity", (void **)&g_drv.mem_get_granularity },
		{ "cuMemCreate", (void **)&g_drv.mem_create },
		{ "cuMemRelease", (void **)&g_drv.mem_release },
		{ "cuMemExportToShareableHandle", (void **)&g_drv.mem_export },
		{ "cuMemImportFromShareableHandle", (void **)&g_drv.mem_import },
		{ "cuMemAddressReserve", (void **)&g_drv.mem_address_reserve },
		{ "cuMemAddressFree", (void **)&g_drv.mem_address_free },
		{ "cuMemMap", (void **)&g_drv.mem_map },
		{ "cuMemUnmap", (void **)&g_drv.mem_unmap },
		{ "cuMemSetAccess", (void **)&g_drv.mem_set_access },
	};
	kvp_cuda_drv_lookup_fn lookup = g_drv_lookup ? g_drv_lookup : rt_lookup;

	for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
		void *fn = NULL;
		int r = lookup(syms[i].name, &fn, g_drv_why, sizeof(g_drv_why));

		if (r < 0 || !fn) {
			if (r >= 0)
				say(g_drv_why, sizeof(g_drv_why), "no entry point %s",
				    syms[i].name);
			memset(&g_drv, 0, sizeof(g_drv));
			atomic_store_explicit(&g_drv_state, r < 0 ? r : -ENOSYS,
					      memory_order_release);
			return;
		}
		*syms[i].slot = fn;
	}
	atomic_store_explicit(&g_drv_state, 0, memory_order_release);
}

int kvp_cuda_drv_load(char *reason, size_t len)
{
	int st;

	pthread_once(&g_drv_once, drv_init);
	st = atomic_load_explicit(&g_drv_state, memory_order_acquire);
	if (st < 0)
		say(reason, len, "%s", g_drv_why);
	return st;
}

/* Whether the entry points are there, without looking them up (nor waiting for a lookup under
 * way in another thread). */
static bool drv_loaded(void)
{
	return atomic_load_explicit(&g_drv_state, memory_order_acquire) == 0;
}

/* Can `device` back a cuda tier? 0, or -ENOTSUP/-EIO with a reason. Needs kvp_cuda_drv_load. */
static int device_usable(int device, char *reason, size_t len)
{
	int vmm = 0, fd_export = 0;
	CUdevice dev;
	CUresult r;

	r = g_drv.device_get(&dev, device);
	if (r == CUDA_SUCCESS)
		r = g_drv.device_get_attribute(
			&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev);
	if (r == CUDA_SUCCESS)
		r = g_drv.device_get_attribute(
			&fd_export, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
			dev);
	if (r != CUDA_SUCCESS) {
		say(reason, len, "device %d: cuDeviceGetAttribute: %s", device, drv_str(r));
		return -EIO;
	}
	if (!vmm) {
		say(reason, len, "device %d does not support CUDA virtual memory management",
		    device);
		return -ENOTSUP;
	}
	if (!fd_export) {
		say(reason, len, "device %d cannot export memory as a POSIX fd", device);
		return -ENOTSUP;
	}
	return 0;
}

/*
 * Everything a create or import needs before touching memory: runtime and driver present, the
 * device there and usable, its primary context current. *prev gets the caller's context, to be
 * given back with ctx_leave.
 */
static int ctx_enter(int device, CUcontext *prev, char *reason, size_t len)
{
	cudaError_t e;
	CUresult r;
	int ret;

	ret = rt_device(device, reason, len);
	if (!ret)
		ret = kvp_cuda_drv_load(reason, len);
	if (!ret)
		ret = device_usable(device, reason, len);
	if (ret)
		return ret;
	r = g_drv.ctx_get_current(prev);
	if (r != CUDA_SUCCESS) {
		say(reason, len, "cuCtxGetCurrent: %s", drv_str(r));
		return -EIO;
	}
	/* cudaSetDevice makes the primary context current; cudaFree(NULL) makes sure it exists */
	e = cudaSetDevice(device);
	if (e == cudaSuccess)
		e = cudaFree(NULL);
	if (e != cudaSuccess) {
		say(reason, len, "device %d: cannot initialise its context: %s", device,
		    cudaGetErrorString(e));
		cudaGetLastError();
		g_drv.ctx_set_current(*prev);
		return e == cudaErrorMemoryAllocation ? -ENOMEM : -EIO;
	}
	return 0;
}

static void ctx_leave(CUcontext prev)
{
	g_drv.ctx_set_current(prev);
}

static void prop_init(int device, CUmemAllocationProp *prop)
{
	memset(prop, 0, sizeof(*prop));
	prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop->location.id = device;
}

static int granularity(int device, const CUmemAllocationProp *prop, uint64_t *rec, uint64_t *min,
		       char *reason, size_t len)
{
	size_t g_rec = 0, g_min = 0;
	CUresult r;

	r = g_drv.mem_get_granularity(&g_min, prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
	if (r == CUDA_SUCCESS)
		r = g_drv.mem_get_granularity(&g_rec, prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
	if (r != CUDA_SUCCESS || !g_min) {
		say(reason, len, "device %d: cuMemGetAllocationGranularity: %s", device,
		    r != CUDA_SUCCESS ? drv_str(r) : "returned 0");
		return r != CUDA_SUCCESS ? drv_errno(r) : -EIO;
	}
	/* recommended is a multiple of minimum; be safe if a driver says otherwise */
	if (!g_rec || g_rec % g_min)
		g_rec = g_min;
	*rec = g_rec;
	*min = g_min;
	return 0;
}

/* The start of an allocation or import: enters device's context (the previous one in *prev),
 * fills prop and reads its granularities. 0, or a negative errno (with reason, the context left
 * again). */
static int mem_begin(int device, CUcontext *prev, CUmemAllocationProp *prop, uint64_t *g_rec,
		     uint64_t *g_min, char *reason, size_t len)
{
	int ret = ctx_enter(device, prev, reason, len);

	if (ret)
		return ret;
	prop_init(device, prop);
	ret = granularity(device, prop, g_rec, g_min, reason, len);
	if (ret)
		ctx_leave(*prev);
	return ret;
}

/* Reserve an address range, map h over all of it and grant `device` read-write access. */
static int map_rw(int device, CUmemGenericAllocationHandle h, uint64_t bytes, uint64_t align,
		  uint64_t *dptr, char *reason, size_t len)
{
	CUmemAccessDesc access;
	CUdeviceptr ptr = 0;
	const char *what;
	CUresult r;

	r = g_drv.mem_address_reserve(&ptr, bytes, align, 0, 0);
	if (r != CUDA_SUCCESS) {
		what = "cuMemAddressReserve";
		goto err;
	}
	r = g_drv.mem_map(ptr, bytes, 0, h, 0);
	if (r != CUDA_SUCCESS) {
		what = "cuMemMap";
		g_drv.mem_address_free(ptr, bytes);
		goto err;
	}
	memset(&access, 0, sizeof(access));
	access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	access.location.id = device;
	access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	r = g_drv.mem_set_access(ptr, bytes, &access, 1);
	if (r != CUDA_SUCCESS) {
		what = "cuMemSetAccess";
		g_drv.mem_unmap(ptr, bytes);
		g_drv.mem_address_free(ptr, bytes);
		goto err;
	}
	*dptr = ptr;
	return 0;
err:
	say(reason, len, "device %d: %s(%llu bytes): %s", device, what, (unsigned long long)bytes,
	    drv_str(r));
	return drv_errno(r);
}

int kvp_cuda_mem_create(int device, uint64_t bytes, struct kvp_cuda_mem *out, char *reason,
			size_t len)
{
	struct kvp_cuda_mem m = { .device = device, .fd = -1 };
	CUmemGenericAllocationHandle h = 0;
	CUmemAllocationProp prop;
	uint64_t g_rec, g_min;
	CUcontext prev = NULL;
	int fd = -1, flags, ret;
	CUresult r;

	if (!out || !bytes) {
		say(reason, len, "device %d: bad arguments (%s)", device,
		    !out ? "no output" : "0 bytes");
		return -EINVAL;
	}
	ret = mem_begin(device, &prev, &prop, &g_rec, &g_min, reason, len);
	if (ret)
		return ret;
	if (bytes > UINT64_MAX - (g_rec - 1) || bytes > SIZE_MAX - (g_rec - 1)) {
		say(reason, len, "device %d: %llu bytes is too large", device,
		    (unsigned long long)bytes);
		ret = -EINVAL;
		goto out;
	}
	m.bytes = (bytes + g_rec - 1) / g_rec * g_rec;
	m.granularity = g_rec;

	r = g_drv.mem_create(&h, m.bytes, &prop, 0);
	if (r != CUDA_SUCCESS) {
		say(reason, len, "device %d: cuMemCreate(%llu bytes): %s", device,
		    (unsigned long long)m.bytes, drv_str(r));
		ret = drv_errno(r);
		goto out;
	}
	r = g_drv.mem_export(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
	if (r != CUDA_SUCCESS || fd < 0) {
		say(reason, len, "device %d: cuMemExportToShareableHandle: %s", device,
		    r != CUDA_SUCCESS ? drv_str(r) : "no fd");
		ret = r != CUDA_SUCCESS ? drv_errno(r) : -EIO;
		goto err_release;
	}
	/* the driver does not promise CLOEXEC */
	flags = fcntl(fd, F_GETFD);
	if (flags < 0 || (!(flags & FD_CLOEXEC) && fcntl(fd, F_SETFD, flags | FD_CLOEXEC) < 0)) {
		ret = -errno;
		say(reason, len, "device %d: fcntl(FD_CLOEXEC) on the exported fd: %s", device,
		    strerror(errno));
		goto err_close;
	}
	ret = map_rw(device, h, m.bytes, g_rec, &m.dptr, reason, len);
	if (ret)
		goto err_close;
	m.fd = fd;
	m.handle = (uint64_t)h;
	*out = m;
	goto out;

err_close:
	close(fd);
err_release:
	g_drv.mem_release(h);
out:
	ctx_leave(prev);
	return ret;
}

int kvp_cuda_mem_import(int device, int fd, uint64_t bytes, struct kvp_cuda_mem *out, char *reason,
			size_t len)
{
	struct kvp_cuda_mem m = { .device = device, .fd = -1 };
	CUmemGenericAllocationHandle h = 0;
	CUmemAllocationProp prop;
	uint64_t g_rec, g_min;
	CUcontext prev = NULL;
	CUresult r;
	int ret;

	if (!out || fd < 0 || !bytes || bytes > SIZE_MAX) {
		say(reason, len, "device %d: bad arguments (%s)", device,
		    !out     ? "no output"
		    : fd < 0 ? "no fd"
			     : "size");
		return -EINVAL;
	}
	ret = mem_begin(device, &prev, &prop, &g_rec, &g_min, reason, len);
	if (ret)
		return ret;
	if (bytes % g_min) {
		say(reason, len, "device %d: %llu bytes is not a multiple of the granularity %llu",
		    device, (unsigned long long)bytes, (unsigned long long)g_min);
		ret = -EINVAL;
		goto out;
	}
	m.bytes = bytes;
	m.granularity = g_rec;

	r = g_drv.mem_import(&h, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	if (r != CUDA_SUCCESS) {
		say(reason, len, "device %d: cuMemImportFromShareableHandle(fd %d): %s", device, fd,
		    drv_str(r));
		ret = r == CUDA_ERROR_INVALID_VALUE || r == CUDA_ERROR_INVALID_HANDLE
			      ? -EBADF
			      : drv_errno(r);
		goto out;
	}
	ret = map_rw(device, h, m.bytes, g_rec, &m.dptr, reason, len);
	if (ret) {
		g_drv.mem_release(h);
		goto out;
	}
	m.handle = (uint64_t)h;
	*out = m;
out:
	ctx_leave(prev);
	return ret;
}

void kvp_cuda_mem_destroy(struct kvp_cuda_mem *m)
{
	CUcontext prev = NULL;
	int have_ctx;

	if (!m)
		return;
	if (m->bytes && drv_loaded()) {
		have_ctx = g_drv.ctx_get_current(&prev) == CUDA_SUCCESS;
		if (cudaSetDevice(m->device) != cudaSuccess)
			cudaGetLastError();
		if (m->dptr) {
			g_drv.mem_unmap((CUdeviceptr)m->dptr, m->bytes);
			g_drv.mem_address_free((CUdeviceptr)m->dptr, m->bytes);
		}
		g_drv.mem_release((CUmemGenericAllocationHandle)m->handle);
		if (have_ctx)
			g_drv.ctx_set_current(prev);
	}
	if (m->fd >= 0)
		close(m->fd);
	memset(m, 0, sizeof(*m));
	m->fd = -1;
}

int kvp_cuda_device_numa_node(int device)
{
	char bus[32], path[96];
	int node = -1;
	FILE *f;

	if (rt_device(device, NULL, 0))
		return -1;
	if (cudaDeviceGetAttribute(&node, cudaDevAttrHostNumaId, device) == cudaSuccess &&
	    node >= 0)
		return node;
	cudaGetLastError();
	/* older drivers: the PCI device's node from sysfs */
	if (cudaDeviceGetPCIBusId(bus, sizeof(bus), device) != cudaSuccess) {
		cudaGetLastError();
		return -1;
	}
	for (char *p = bus; *p; p++)
		*p = (char)tolower((unsigned char)*p);
	snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/numa_node", bus);
	f = fopen(path, "re");
	if (!f)
		return -1;
	if (fscanf(f, "%d", &node) != 1)
		node = -1;
	fclose(f);
	return node >= 0 ? node : -1;
}

int kvp_cuda_device_uuid(int device, uint8_t uuid[16], char *reason, size_t len)
{
	struct cudaDeviceProp prop;
	cudaError_t e;
	int r = rt_device(device, reason, len);

	if (r)
		return r;
	e = cudaGetDeviceProperties(&prop, device);
	if (e != cudaSuccess) {
		say(reason, len, "device %d: cudaGetDeviceProperties: %s", device,
		    cudaGetErrorString(e));
		cudaGetLastError();
		return -ENODEV;
	}
	memcpy(uuid, prop.uuid.bytes, 16);
	return 0;
}

int kvp_cuda_device_by_uuid(const uint8_t uuid[16], char *reason, size_t len)
{
	int count = rt_count(reason, len);

	for (int d = 0; d < count; d++) {
		uint8_t u[16];

		if (kvp_cuda_device_uuid(d, u, NULL, 0) == 0 && memcmp(u, uuid, 16) == 0)
			return d;
	}
	if (count >= 0) {
		char hex[33];

		for (int i = 0; i < 16; i++)
			snprintf(hex + 2 * i, 3, "%02x", uuid[i]);
		say(reason, len,
		    "the pool's GPU (uuid %s) is not among the %d this process sees "
		    "(CUDA_VISIBLE_DEVICES=%s)",
		    hex, count,
		    getenv("CUDA_VISIBLE_DEVICES") ? getenv("CUDA_VISIBLE_DEVICES") : "");
	}
	return -ENODEV;
}

int kvp_cuda_probe(char *reason, size_t len)
{
	char why[160] = "";
	int count, usable = 0, ret, failed = 0;

	count = rt_count(reason, len);
	if (count < 0)
		return count;
	ret = kvp_cuda_drv_load(reason, len);
	if (ret)
		return ret;
	for (int d = 0; d < count; d++) {
		char one[160];
		int r = device_usable(d, one, sizeof(one));

		if (!r)
			usable++;
		else if (!why[0] || (r != -ENOTSUP && !failed))
			memcpy(why, one, sizeof(why));
		if (r && r != -ENOTSUP)
			failed = r;
	}
	if (!usable) {
		say(reason, len, "%d GPU%s, none usable for a cuda tier: %s", count,
		    count == 1 ? "" : "s", why);
		return failed ? failed : -ENOTSUP;
	}
	return usable;
}
