/* libkvpool_mapping.c - the tier mappings: a tier's memory in this process (memfd mapped, or a
 * CUDA allocation imported), reference-counted and freed with its last reference, and a pool's
 * tiers and slot addresses read through them. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kvp_internal.h"

static struct kvp_mapping *mapping_new(int tier, int backend, int fd, uint64_t bytes)
{
	struct kvp_mapping *m = calloc(1, sizeof(*m));

	if (!m)
		return NULL;
	m->refs = 1;
	m->tier = tier;
	m->backend = backend;
	m->fd = fd;
	m->bytes = bytes;
	m->cuda_device = -1;
	return m;
}

KVP_EXPORT struct kvp_mapping *kvp_mapping_ref(struct kvp_mapping *m)
{
	__atomic_add_fetch(&m->refs, 1, __ATOMIC_RELAXED);
	return m;
}

KVP_EXPORT void kvp_mapping_unref(struct kvp_mapping *m)
{
	if (!m || __atomic_sub_fetch(&m->refs, 1, __ATOMIC_ACQ_REL) != 0)
		return;
#if KVP_HAVE_CUDA
	if (m->backend == KVP_BACKEND_CUDA && m->base)
		kvp_cuda_mem_destroy(&m->cm);
	else
#endif
		if (m->base)
		munmap(m->base, m->bytes);
	if (m->fd >= 0)
		close(m->fd);
	free(m);
}

KVP_EXPORT void *kvp_mapping_base(const struct kvp_mapping *m)
{
	return m->base;
}

KVP_EXPORT uint64_t kvp_mapping_bytes(const struct kvp_mapping *m)
{
	return m->bytes;
}

KVP_EXPORT int kvp_mapping_tier(const struct kvp_mapping *m)
{
	return m->tier;
}

KVP_EXPORT int kvp_mapping_backend(const struct kvp_mapping *m)
{
	return m->backend;
}

KVP_EXPORT int kvp_mapping_cuda_device(const struct kvp_mapping *m)
{
	return m->backend == KVP_BACKEND_CUDA && m->cuda_device >= 0 ? m->cuda_device : -1;
}

int kvp__map_tier(struct kvp_pool *p, const Kvpool__TierInfo *ti, int fd, struct kvp_error *err)
{
	struct kvp_tier_map *t = &p->tier[ti->tier];
	struct kvp_mapping *m = mapping_new((int)ti->tier, (int)ti->backend, fd, ti->bytes);

	if (!m) {
		close(fd);
		return kvp__fail(err, KVP_E_NOMEM, ENOMEM, "out of memory");
	}
	t->present = 1;
	t->pages = ti->pages;
	t->m = m;
	m->cuda_device = ti->cuda_device;
	if (ti->backend == KVPOOL__BACKEND__CUDA) {
#if KVP_HAVE_CUDA
		char why[256] = "";
		int r = 0;

		/* the daemon's number for the GPU may not be ours: find it by its UUID */
		if (ti->cuda_uuid.len != 0 && ti->cuda_uuid.len != 16)
			return kvp__fail(err, KVP_E_PROTOCOL, 0,
					 "attach reply: a GPU uuid of %zu bytes",
					 ti->cuda_uuid.len);
		if (ti->cuda_uuid.len == 16)
			r = m->cuda_device =
				kvp_cuda_device_by_uuid(ti->cuda_uuid.data, why, sizeof(why));
		if (r >= 0)
			r = kvp_cuda_mem_import(m->cuda_device, fd, ti->bytes, &m->cm, why,
						sizeof(why));
		if (r < 0)
			return kvp__fail(err, KVP_E_MAP, -r, "importing the cuda device tier: %s",
					 why);
		m->base = (void *)(uintptr_t)m->cm.dptr;
#endif
		return 0;
	}
	m->base = mmap(NULL, ti->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m->base == MAP_FAILED) {
		int e = errno;

		m->base = NULL;
		return kvp__fail(err, KVP_E_MAP, e, "mapping the %s tier (%lu bytes): %s",
				 kvp_tier_name((int)ti->tier), (unsigned long)ti->bytes,
				 strerror(e));
	}
	return 0;
}

static const struct kvp_tier_map *tmap(const struct kvp_pool *p, int tier)
{
	return tier >= 0 && tier < KVP_TIER_MAX && p->tier[tier].present ? &p->tier[tier] : NULL;
}

KVP_EXPORT uint32_t kvp_pool_tier_pages(const struct kvp_pool *p, int tier)
{
	return tmap(p, tier) ? tmap(p, tier)->pages : 0;
}

KVP_EXPORT int kvp_pool_tier_backend(const struct kvp_pool *p, int tier)
{
	return tmap(p, tier) ? tmap(p, tier)->m->backend : KVP_BACKEND_NONE;
}

KVP_EXPORT int kvp_pool_tier_cuda_device(const struct kvp_pool *p, int tier)
{
	return tmap(p, tier) ? kvp_mapping_cuda_device(tmap(p, tier)->m) : -1;
}

KVP_EXPORT void *kvp_pool_tier_base(const struct kvp_pool *p, int tier)
{
	return tmap(p, tier) ? tmap(p, tier)->m->base : NULL;
}

KVP_EXPORT int kvp_pool_tier_fd(const struct kvp_pool *p, int tier)
{
	return tmap(p, tier) ? tmap(p, tier)->m->fd : -1;
}

KVP_EXPORT uint64_t kvp_pool_tier_bytes(const struct kvp_pool *p, int tier)
{
	return tmap(p, tier) ? tmap(p, tier)->m->bytes : 0;
}

KVP_EXPORT struct kvp_mapping *kvp_pool_tier_mapping(struct kvp_pool *p, int tier)
{
	const struct kvp_tier_map *t = tmap(p, tier);

	return t && t->m->base ? kvp_mapping_ref(t->m) : NULL;
}

KVP_EXPORT uint64_t kvp_pool_row_bytes(const struct kvp_pool *p)
{
	return p->cg.row_bytes;
}

KVP_EXPORT uint64_t kvp_pool_page_bytes(const struct kvp_pool *p)
{
	return p->page_bytes;
}

KVP_EXPORT uint32_t kvp_pool_pages_for(const struct kvp_pool *p, uint64_t tokens)
{
	uint64_t pt = p->g.page_tokens, n;

	if (!pt)
		return 0;
	n = tokens / pt + (tokens % pt != 0);
	return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

KVP_EXPORT uint64_t kvp_pool_slot_offset(const struct kvp_pool *p, int tier, uint32_t layer,
					 uint32_t kv, uint32_t page, uint32_t tok)
{
	const struct kvp_tier_map *m = tmap(p, tier);

	if (!m || layer >= p->g.layers || kv > 1 || page >= m->pages || tok >= p->g.page_tokens)
		return UINT64_MAX;
	if (tier == KVP_TIER_DEVICE)
		return kvp_dev_offset(&p->cg, layer, kv, (uint64_t)page * p->g.page_tokens + tok);
	return kvp_host_offset(&p->cg, page, layer, kv, tok);
}

KVP_EXPORT void *kvp_pool_slot_addr(const struct kvp_pool *p, int tier, uint32_t layer, uint32_t kv,
				    uint32_t page, uint32_t tok)
{
	uint64_t off = kvp_pool_slot_offset(p, tier, layer, kv, page, tok);
	void *base = kvp_pool_tier_base(p, tier);

	return off == UINT64_MAX || !base ? NULL : (char *)base + off;
}
