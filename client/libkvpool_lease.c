/* libkvpool_lease.c - leases of a pool's pages: Alloc, Extend and Free, served from the page
 * reserve's rings when it can (libkvpool_reserve.c), else by a call. */
#include <string.h>

#include "kvp_internal.h"

KVP_EXPORT int kvp_lease_alloc(struct kvp_pool *p, int tier, uint32_t npages, uint64_t *lease_id,
			       uint32_t *pages, struct kvp_error *err)
{
	CALL_SETUP(req, alloc, ALLOC, Kvpool__AllocReq, KVPOOL__ALLOC_REQ__INIT);
	Kvpool__Response *resp;
	int r;

	if ((r = kvp__forked_fast(p->c, err)) < 0)
		return r; /* the reserve's rings are the connecting process's */
	if (p->resv && kvp__resv_alloc(p->resv, tier, npages, lease_id, pages))
		return 0;
	alloc.pool_id = p->id;
	alloc.pages = npages;
	alloc.tier = (Kvpool__Tier)tier;
	r = kvp__rpc(p->c, &req, RESULT(ALLOC), &resp, NULL, NULL, err);
	if (r < 0)
		return r;
	if (resp->alloc->n_pages != npages) {
		uint64_t lease = resp->alloc->lease_id;
		size_t got = resp->alloc->n_pages;

		kvpool__response__free_unpacked(resp, NULL);
		/* The caller cannot use a lease of another size: give it back. */
		if (lease)
			kvp_lease_free(p, lease, NULL, 0, NULL);
		return kvp__fail(err, KVP_E_PROTOCOL, 0, "alloc answered with %zu pages, not %u",
				 got, npages);
	}
	*lease_id = resp->alloc->lease_id;
	if (npages)
		memcpy(pages, resp->alloc->pages, sizeof(uint32_t) * npages);
	kvpool__response__free_unpacked(resp, NULL);
	return 0;
}

KVP_EXPORT int kvp_lease_alloc_run(struct kvp_pool *p, int tier, uint32_t npages, uint32_t align,
				   uint64_t *lease_id, uint32_t *first, struct kvp_error *err)
{
	CALL_SETUP(req, alloc, ALLOC, Kvpool__AllocReq, KVPOOL__ALLOC_REQ__INIT);
	Kvpool__Response *resp;
	int r;

	if ((r = kvp__forked_fast(p->c, err)) < 0)
		return r;
	if (!align || !npages)
		return kvp__fail(err, KVP_E_INVALID_ARGUMENT, 0,
				 "a run lease needs pages and an alignment (got %u, %u)", npages,
				 align);
	alloc.pool_id = p->id;
	alloc.pages = npages;
	alloc.tier = (Kvpool__Tier)tier;
	alloc.run_align = align;
	r = kvp__rpc(p->c, &req, RESULT(ALLOC), &resp, NULL, NULL, err);
	if (r < 0)
		return r;
	if (resp->alloc->run_pages != npages || resp->alloc->run_first % align) {
		uint64_t lease = resp->alloc->lease_id;
		uint32_t got = resp->alloc->run_pages, at = resp->alloc->run_first;

		kvpool__response__free_unpacked(resp, NULL);
		if (lease)
			kvp_lease_free(p, lease, NULL, 0, NULL);
		return kvp__fail(
			err, KVP_E_PROTOCOL, 0,
			"alloc answered with a run of %u pages at %u, not %u aligned to %u", got,
			at, npages, align);
	}
	*lease_id = resp->alloc->lease_id;
	*first = resp->alloc->run_first;
	kvpool__response__free_unpacked(resp, NULL);
	return 0;
}

KVP_EXPORT int kvp_lease_extend(struct kvp_pool *p, uint64_t lease_id, uint32_t npages,
				uint32_t *pages, struct kvp_error *err)
{
	CALL_SETUP(req, extend, EXTEND, Kvpool__ExtendReq, KVPOOL__EXTEND_REQ__INIT);
	Kvpool__Response *resp;
	int r;

	if ((r = kvp__forked_fast(p->c, err)) < 0)
		return r;
	if (p->resv) {
		if (kvp__resv_extend(p->resv, lease_id, npages, pages))
			return 0;
		if ((r = kvp__resv_bind(p->resv, lease_id, err)) < 0)
			return r;
	}
	extend.lease_id = lease_id;
	extend.pages = npages;
	r = kvp__rpc(p->c, &req, RESULT(EXTEND), &resp, NULL, NULL, err);
	if (r < 0)
		return r;
	if (resp->extend->n_pages != npages) {
		size_t got = resp->extend->n_pages;

		/* Pages of another count cannot be handed out: return the ones added. */
		if (got && got <= UINT32_MAX)
			kvp_lease_free(p, lease_id, resp->extend->pages, (uint32_t)got, NULL);
		kvpool__response__free_unpacked(resp, NULL);
		return kvp__fail(err, KVP_E_PROTOCOL, 0, "extend answered with %zu pages, not %u",
				 got, npages);
	}
	if (npages)
		memcpy(pages, resp->extend->pages, sizeof(uint32_t) * npages);
	kvpool__response__free_unpacked(resp, NULL);
	return 0;
}

KVP_EXPORT int kvp_lease_free(struct kvp_pool *p, uint64_t lease_id, const uint32_t *pages,
			      uint32_t n, struct kvp_error *err)
{
	CALL_SETUP(req, free, FREE, Kvpool__FreeReq, KVPOOL__FREE_REQ__INIT);
	Kvpool__Response *resp;
	uint32_t left;
	int r;

	if ((r = kvp__forked_fast(p->c, err)) < 0)
		return r;
	if (p->resv) {
		r = kvp__resv_free(p->resv, lease_id, pages, n, &left, err);
		if (r > 0)
			return (int)left;
		if (r < 0 || (r = kvp__resv_bind(p->resv, lease_id, err)) < 0)
			return r;
	}
	free.lease_id = lease_id;
	free.pages = (uint32_t *)pages;
	free.n_pages = n;
	r = kvp__rpc(p->c, &req, RESULT(FREE), &resp, NULL, NULL, err);
	if (r < 0)
		return r;
	r = resp->free->lease_pages > INT32_MAX
		    ? kvp__fail(err, KVP_E_PROTOCOL, 0, "free answered with %u pages left",
				resp->free->lease_pages)
		    : (int)resp->free->lease_pages;
	kvpool__response__free_unpacked(resp, NULL);
	return r;
}
