/* tier.c - the table of tier backends and what every backend shares: an empty tier, destruction
 * through the tier's own backend, typed failures. */
#include "tier.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const struct kvp_tier_ops *const backends[KVP_BACKEND_KIND_MAX] = {
	[KVP_BACKEND_KIND_SIM] = &kvp_tier_sim_ops,
	[KVP_BACKEND_KIND_CUDA] = &kvp_tier_cuda_ops,
	[KVP_BACKEND_KIND_MEMFD] = &kvp_tier_memfd_ops,
};

const struct kvp_tier_ops *kvp_tier_ops_of(enum kvp_backend_kind kind)
{
	if ((unsigned)kind >= KVP_BACKEND_KIND_MAX)
		return NULL;
	return backends[kind];
}

void kvp_tier_mem_init(struct kvp_tier_mem *t)
{
	memset(t, 0, sizeof(*t));
	t->backend = KVP_BACKEND_KIND_NONE;
	t->fd = -1;
	t->numa_node = -1;
	t->cuda_device = -1;
}

void kvp_tier_mem_destroy(struct kvp_tier_mem *t)
{
	if (t->ops)
		t->ops->destroy(t);
	kvp_tier_mem_init(t);
}

int kvp_tier_err(struct kvp_tier_fail *tf, enum kvp_tier_error code, const char *fmt, ...)
{
	va_list ap;

	if (tf) {
		tf->code = code;
		va_start(ap, fmt);
		vsnprintf(tf->msg, sizeof(tf->msg), fmt, ap);
		va_end(ap);
	}
	return -(int)code;
}
