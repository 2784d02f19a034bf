/* tier_shm.h - sealed shared memfds: the memory of the memfd and sim backends (tier_memfd.c,
 * tier_sim.c), which differ only in what they ask for. Not a backend itself: these leave
 * t->ops and t->backend to the caller. Returns as struct kvp_tier_ops's create, adopt, destroy. */
#pragma once
#include "tier.h"

/* A memfd of at least s->bytes (rounded up to 2 MiB with huge pages), sealed against shrinking
 * and growing, mapped shared, bound to s->numa_node (>= 0), locked per s->mlock and pre-faulted
 * when not locked. */
int kvp_tier_shm_create(struct kvp_tier_mem *t, const struct kvp_tier_spec *s, char *note,
			size_t notelen, struct kvp_tier_fail *tf);
/* Maps an existing memfd of exactly s->bytes that is sealed against shrinking and growing (and
 * not against writing), binds and locks it like create; no pre-fault, no zeroing. */
int kvp_tier_shm_adopt(struct kvp_tier_mem *t, int fd, const struct kvp_tier_spec *s,
		       struct kvp_tier_fail *tf);
/* Unmaps and closes; the tier is then as kvp_tier_mem_init leaves it. */
void kvp_tier_shm_destroy(struct kvp_tier_mem *t);
