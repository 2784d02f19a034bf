/* tier_memfd.c - the memfd backend of host tiers: sealed shared memory, NUMA-bound, locked and
 * huge-paged as the pool asks (tier_shm.c). Not a device backend: no copies of its own. */
#include "tier_shm.h"

static int memfd_create_tier(struct kvp_tier_mem *t, const struct kvp_tier_spec *s, char *note,
			     size_t notelen, struct kvp_tier_fail *tf)
{
	int r = kvp_tier_shm_create(t, s, note, notelen, tf);

	if (r == 0) {
		t->ops = &kvp_tier_memfd_ops;
		t->backend = KVP_BACKEND_KIND_MEMFD;
	}
	return r;
}

static int memfd_adopt(struct kvp_tier_mem *t, int fd, const struct kvp_tier_spec *s,
		       struct kvp_tier_fail *tf)
{
	int r = kvp_tier_shm_adopt(t, fd, s, tf);

	if (r == 0) {
		t->ops = &kvp_tier_memfd_ops;
		t->backend = KVP_BACKEND_KIND_MEMFD;
	}
	return r;
}

const struct kvp_tier_ops kvp_tier_memfd_ops = {
	.name = "memfd",
	.kind = KVP_BACKEND_KIND_MEMFD,
	.create = memfd_create_tier,
	.adopt = memfd_adopt,
	.destroy = kvp_tier_shm_destroy,
};
