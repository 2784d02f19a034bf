/* cuda_drv.h - CUDA driver glue shared by kvpoold's cuda tier and libkvpool: device memory
 * allocated with the CUDA virtual memory API and exported as a POSIX file descriptor (so it can
 * be passed to clients with SCM_RIGHTS), its import on the client side, and device lookups.
 *
 * The static library kvp_cuda_drv (kernels/meson.build, only when have_cuda is true); depends on
 * nothing but the static CUDA runtime. Driver calls go through cudaGetDriverEntryPointByVersion,
 * so nothing links libcuda and a machine without a driver or GPU gets a negative return and a
 * reason, never a crash. Every call makes `device` current for its duration and restores the
 * caller's current device afterwards. Thread-safe: the entry points are looked up once.
 *
 * Fallback (not built): on a driver without POSIX-fd export (CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_
 * POSIX_FILE_DESCRIPTOR_SUPPORTED = 0) a cuda pool is refused with UNAVAILABLE and that reason.
 * The legacy path would be cudaMalloc + cudaIpcGetMemHandle, the 64-byte handle sent in the
 * Attach reply instead of an fd and opened with cudaIpcOpenMemHandle; it cannot be sealed or
 * passed through SCM_RIGHTS, and every engine process would need the same device visible, so
 * kvpool does not use it by default.
 */
#ifndef KVP_CUDA_DRV_H
#define KVP_CUDA_DRV_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct kvp_cuda_mem {
	int device;	      /* CUDA device ordinal */
	int fd;		      /* exported POSIX fd (CLOEXEC), owned; -1 for an import */
	uint64_t bytes;	      /* size, a multiple of granularity */
	uint64_t dptr;	      /* device virtual address of the mapping in this process */
	uint64_t handle;      /* CUmemGenericAllocationHandle */
	uint64_t granularity; /* allocation granularity of the device */
};

/*
 * Allocate `bytes` (rounded up to the device's recommended granularity) of device memory on
 * `device`, exportable as a POSIX fd, export it (fd CLOEXEC) and map it in this process with
 * read-write access for `device`.
 * Returns 0 and fills *out; on failure *out is untouched, `reason` (if non-NULL) gets one line
 * for an operator, and the return is -ENODEV (no driver, no GPU, device not present), -ENOSYS
 * (the driver lacks an entry point), -ENOTSUP (the device lacks virtual memory management or
 * POSIX fd export), -EINVAL (bytes 0 or too large), -ENOMEM (out of device memory) or -EIO (other
 * driver failure).
 */
int kvp_cuda_mem_create(int device, uint64_t bytes, struct kvp_cuda_mem *out, char *reason,
			size_t len);

/*
 * Unmap and release m (created or imported) and close its fd if it owns one; m is then zeroed
 * with fd = -1. Accepts NULL and an already destroyed or zeroed struct. The caller must make sure
 * no queued GPU work still uses the memory.
 */
void kvp_cuda_mem_destroy(struct kvp_cuda_mem *m);

/*
 * Client side: import the allocation behind `fd` (as passed by kvpoold), reserve an address
 * range and map it on `device` with read-write access. `bytes` is the exporter's size and must
 * be a multiple of the granularity. Does not take ownership of fd (the caller may close it
 * afterwards; out->fd is -1). Returns and reports like kvp_cuda_mem_create; -EINVAL also for a
 * negative fd or a size that is not a multiple of the granularity, -EBADF (or -EIO) when the
 * driver rejects the fd.
 */
int kvp_cuda_mem_import(int device, int fd, uint64_t bytes, struct kvp_cuda_mem *out, char *reason,
			size_t len);

/* NUMA node of the host memory closest to `device`, or -1 when unknown (no driver, no NUMA). */
int kvp_cuda_device_numa_node(int device);

/* The UUID of `device` (this process's number). 0, or -ENODEV with a reason. */
int kvp_cuda_device_uuid(int device, uint8_t uuid[16], char *reason, size_t len);

/* This process's number for the GPU with that UUID: CUDA_VISIBLE_DEVICES may number GPUs
 * otherwise than the daemon does, or hide them. >= 0, or -ENODEV with a reason. */
int kvp_cuda_device_by_uuid(const uint8_t uuid[16], char *reason, size_t len);

/*
 * Look the driver entry points up: once per process, whichever thread comes first; every call
 * returns what that first lookup found. 0, or -ENODEV (no driver, or one older than the runtime)
 * or -ENOSYS (the driver lacks an entry point) with `reason` filled. The calls above and below do
 * it themselves; it is public for tests and for callers that want the reason early.
 */
int kvp_cuda_drv_load(char *reason, size_t len);

/*
 * Test seam: how one driver entry point is found (by default the runtime's
 * cudaGetDriverEntryPointByVersion). 0 with *fn set, or a negative errno with `reason` filled.
 * Takes effect only when set before the first lookup (kvp_cuda_drv_load or any call that needs
 * the driver); NULL restores the default.
 */
typedef int (*kvp_cuda_drv_lookup_fn)(const char *name, void **fn, char *reason, size_t len);
void kvp_cuda_drv_set_lookup(kvp_cuda_drv_lookup_fn lookup);

/*
 * Number of GPUs usable for a cuda device tier (present, with virtual memory management and POSIX
 * fd export). Returns >= 1, or a negative errno with `reason` (if non-NULL) filled: -ENODEV (no
 * driver, a driver older than the runtime, or no GPU), -ENOTSUP (GPUs present, none with virtual
 * memory management and fd export), -ENOSYS (the driver lacks an entry point kvpool needs) or
 * -EIO (the runtime or a driver query failed otherwise). Tests skip on the first two only: the
 * others are failures.
 */
int kvp_cuda_probe(char *reason, size_t len);

#ifdef __cplusplus
}
#endif

#endif /* KVP_CUDA_DRV_H */
