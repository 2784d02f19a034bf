/* idmap.c - linear-probing hash map of uint64 ids, tombstones on delete. */
#include "idmap.h"

#include <errno.h>
#include <stdlib.h>

#include "fault.h"

#define TOMB UINT64_MAX

static uint32_t slot_of(uint64_t id, uint32_t cap)
{
	id ^= id >> 33;
	id *= 0xff51afd7ed558ccdULL;
	id ^= id >> 33;
	return (uint32_t)id & (cap - 1);
}

void kvp_idmap_init(struct kvp_idmap *m)
{
	m->keys = NULL;
	m->vals = NULL;
	m->cap = m->used = m->count = 0;
}

void kvp_idmap_release(struct kvp_idmap *m)
{
	free(m->keys);
	free(m->vals);
	kvp_idmap_init(m);
}

static int grow(struct kvp_idmap *m)
{
	uint32_t cap = m->count * 4 >= m->cap ? (m->cap ? m->cap * 2 : 16) : m->cap;
	struct kvp_idmap n = { 0 };

	if (kvp_fault_hit(KVP_FAULT_IDMAP))
		return -ENOMEM;
	n.keys = calloc(cap, sizeof(*n.keys));
	n.vals = calloc(cap, sizeof(*n.vals));
	if (!n.keys || !n.vals) {
		free(n.keys);
		free(n.vals);
		return -ENOMEM;
	}
	n.cap = cap;
	for (uint32_t i = 0; i < m->cap; i++) {
		uint64_t k = m->keys[i];
		uint32_t j;

		if (k == 0 || k == TOMB)
			continue;
		for (j = slot_of(k, cap); n.keys[j]; j = (j + 1) & (cap - 1))
			;
		n.keys[j] = k;
		n.vals[j] = m->vals[i];
		n.used++;
		n.count++;
	}
	kvp_idmap_release(m);
	*m = n;
	return 0;
}

int kvp_idmap_put(struct kvp_idmap *m, uint64_t id, void *val)
{
	uint32_t j;

	if (id == 0 || id == TOMB)
		return -EINVAL;
	if (kvp_idmap_get(m, id))
		return -EEXIST;
	if ((m->used + 1) * 4 >= m->cap * 3 && grow(m) < 0)
		return -ENOMEM;
	for (j = slot_of(id, m->cap); m->keys[j] != 0 && m->keys[j] != TOMB;
	     j = (j + 1) & (m->cap - 1))
		;
	if (m->keys[j] == 0)
		m->used++;
	m->keys[j] = id;
	m->vals[j] = val;
	m->count++;
	return 0;
}

static int64_t find(const struct kvp_idmap *m, uint64_t id)
{
	if (!m->cap || id == 0 || id == TOMB)
		return -1;
	for (uint32_t j = slot_of(id, m->cap), n = 0; n < m->cap; j = (j + 1) & (m->cap - 1), n++) {
		if (m->keys[j] == id)
			return j;
		if (m->keys[j] == 0)
			return -1;
	}
	return -1;
}

void *kvp_idmap_get(const struct kvp_idmap *m, uint64_t id)
{
	int64_t j = find(m, id);

	return j < 0 ? NULL : m->vals[j];
}

void *kvp_idmap_del(struct kvp_idmap *m, uint64_t id)
{
	int64_t j = find(m, id);
	void *v;

	if (j < 0)
		return NULL;
	v = m->vals[j];
	m->keys[j] = TOMB;
	m->vals[j] = NULL;
	m->count--;
	return v;
}

uint32_t kvp_idmap_next(const struct kvp_idmap *m, uint32_t cursor, uint64_t *id, void **val)
{
	for (uint32_t i = cursor; i < m->cap; i++) {
		if (m->keys[i] != 0 && m->keys[i] != TOMB) {
			*id = m->keys[i];
			*val = m->vals[i];
			return i + 1;
		}
	}
	return 0;
}
