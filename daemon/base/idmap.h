/* idmap.h - open-addressing map from nonzero uint64 ids to pointers (leases, locks). */
#pragma once
#include <stdint.h>

struct kvp_idmap {
	uint64_t *keys; /* 0 = empty, UINT64_MAX = deleted */
	void **vals;
	uint32_t cap;	/* power of two */
	uint32_t used;	/* live + deleted */
	uint32_t count; /* live */
};

void kvp_idmap_init(struct kvp_idmap *m);
void kvp_idmap_release(struct kvp_idmap *m);
/* Returns 0, -EEXIST, -EINVAL (id 0 or UINT64_MAX), -ENOMEM. */
int kvp_idmap_put(struct kvp_idmap *m, uint64_t id, void *val);
void *kvp_idmap_get(const struct kvp_idmap *m, uint64_t id);
/* Returns the removed value or NULL. */
void *kvp_idmap_del(struct kvp_idmap *m, uint64_t id);
/* Iteration: for (uint32_t i = 0; (i = kvp_idmap_next(m, i, &id, &val)) != 0;) ...
 * Returns the cursor to pass next time, 0 at the end. Deleting the current entry is allowed. */
uint32_t kvp_idmap_next(const struct kvp_idmap *m, uint32_t cursor, uint64_t *id, void **val);
