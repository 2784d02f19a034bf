/* kv_copy_cuda.h - CUDA implementation of the page transfer contract in kv_copy.h.
 *
 * Plain C header; the implementation (kv_copy.cu) has C linkage. Built only when meson's
 * have_cuda is true (KVP_HAVE_CUDA in kvp_config.h).
 *
 * Pointers: dev_base is device memory of the context's device; host_base is host memory
 * registered with cudaHostRegister(cudaHostRegisterMapped) (or cudaHostAlloc'd mapped), passed as
 * its device alias (cudaHostGetDevicePointer) or, where the device reports
 * cudaDevAttrCanUseHostPointerForRegisteredMem, as the host pointer itself. The page lists live
 * in ordinary host memory and may be reused as soon as a call returns: they are staged into a
 * device buffer owned by the context. One kernel launch per batch, asynchronous on the context's
 * stream; kvp_copy_cuda_sync waits for all of them. A context is used by one thread at a time.
 */
#ifndef KVP_KV_COPY_CUDA_H
#define KVP_KV_COPY_CUDA_H

#include <stdint.h>

#include "kv_copy.h"

#ifdef __cplusplus
extern "C" {
#endif

struct kvp_copy_cuda; /* opaque: device, stream, page list staging buffers */

/* Create a copy context on CUDA device `device`. Returns 0 and sets *out; -ENODEV when there is
 * no driver or GPU (cudaGetDeviceCount fails or reports 0) or `device` is not present; -ENOMEM or
 * -EIO when the stream or staging buffers cannot be created. *out is untouched on failure. */
int kvp_copy_cuda_new(int device, struct kvp_copy_cuda **out);

/* Wait for outstanding work and release the context. Accepts NULL. */
void kvp_copy_cuda_free(struct kvp_copy_cuda *c);

/* Enqueue a gather of device pages dev_pages[i] into host pages host_pages[i], i < n.
 * Returns 0 once enqueued (n == 0 enqueues nothing); -EINVAL for a NULL context or what
 * kvp_copy_batch_check refuses (-EINVAL, or -ERANGE for a device or host page id out of range:
 * nothing enqueued);
 * -ENOMEM if the staging buffers cannot grow; -EIO for a CUDA error (see kvp_copy_cuda_error).
 * Destination page ids must be distinct. */
int kvp_copy_dev_to_host_cuda(struct kvp_copy_cuda *c, const struct kvp_copy_geom *g,
			      const void *dev_base, void *host_base, const uint32_t *dev_pages,
			      const uint32_t *host_pages, uint32_t n);

/* Enqueue a scatter of host pages host_pages[i] into device pages dev_pages[i], i < n.
 * Same rules and returns as kvp_copy_dev_to_host_cuda. */
int kvp_copy_host_to_dev_cuda(struct kvp_copy_cuda *c, const struct kvp_copy_geom *g,
			      const void *host_base, void *dev_base, const uint32_t *host_pages,
			      const uint32_t *dev_pages, uint32_t n);

/* Wait until everything enqueued on the context has finished. Returns 0, -EINVAL for NULL, or
 * -EIO when a copy failed (a fault in a kernel is sticky for the process: see CUDA docs). */
int kvp_copy_cuda_sync(struct kvp_copy_cuda *c);

/* A fence after everything enqueued on the context so far (a CUDA event, as void *): 0 and *out
 * set, or -EIO / -ENOMEM. kvp_copy_cuda_fence_wait blocks until the fence is reached and may run
 * on any thread (it touches only the event); kvp_copy_cuda_fence_free waits too, then frees. */
int kvp_copy_cuda_fence(struct kvp_copy_cuda *c, void **out);
int kvp_copy_cuda_fence_wait(void *fence);
void kvp_copy_cuda_fence_free(void *fence);

/* Enqueue n copies of bytes[i] bytes from src[i] to dst[i] (addresses: device memory, or host
 * memory registered with CUDA; cudaMemcpyDefault's unified addressing) on `stream` (a
 * cudaStream_t, not the legacy default stream): one cudaMemcpyBatchAsync where the runtime has
 * it (CUDA 12.8 on) and the driver takes it, else one cudaMemcpyAsync each. The three lists may
 * be reused as soon as the call returns. Returns 0 once enqueued (n == 0: nothing), -EINVAL for
 * a NULL list with n > 0, -EIO for a CUDA error (nothing more is enqueued after it). No
 * context: the caller's current device. */
int kvp_copy_runs_cuda(const uint64_t *dst, const uint64_t *src, const uint64_t *bytes, uint64_t n,
		       void *stream);

/* The CUDA error string of the context's last failure, or "" when none. Never NULL. */
const char *kvp_copy_cuda_error(const struct kvp_copy_cuda *c);

#ifdef __cplusplus
}
#endif

#endif /* KVP_KV_COPY_CUDA_H */
