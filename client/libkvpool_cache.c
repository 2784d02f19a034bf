/* libkvpool_cache.c - the token-keyed prefix cache of a pool: Insert, Match, Release and Load.
 * The hash-keyed calls are in libkvpool_keys.c, Fetch in libkvpool_fetch.c. */
#include <string.h>

#include "kvp_internal.h"

KVP_EXPORT int kvp_cache_insert(struct kvp_pool *p, uint64_t lease_id, uint64_t ns,
				const uint32_t *tokens, uint32_t ntokens, uint32_t cached_pages,
				const uint32_t *pages, uint32_t npages, uint64_t *new_tokens,
				struct kvp_error *err)
{
	CALL_SETUP(req, insert, INSERT, Kvpool__InsertReq, KVPOOL__INSERT_REQ__INIT);
	Kvpool__Response *resp;
	int r;

	if (p->resv && (r = kvp__resv_bind(p->resv, lease_id, err)) < 0)
		return r;
	insert.lease_id = lease_id;
	insert.namespace_ = ns;
	insert.tokens = (uint32_t *)tokens;
	insert.n_tokens = ntokens;
	insert.pages = (uint32_t *)pages;
	insert.n_pages = npages;
	insert.cached_pages = cached_pages;
	r = kvp__rpc(p->c, &req, RESULT(INSERT), &resp, NULL, NULL, err);
	if (r < 0)
		return r;
	if (new_tokens)
		*new_tokens = resp->insert->new_tokens;
	kvpool__response__free_unpacked(resp, NULL);
	return 0;
}

KVP_EXPORT int kvp_cache_match(struct kvp_pool *p, uint64_t ns, const uint32_t *tokens,
			       uint32_t ntokens, int lock, struct kvp_match_result *m,
			       uint32_t *device_pages, uint32_t *host_pages, uint32_t cap,
			       struct kvp_error *err)
{
	CALL_SETUP(req, match, MATCH, Kvpool__MatchReq, KVPOOL__MATCH_REQ__INIT);
	Kvpool__Response *resp;
	Kvpool__MatchResp *mr;
	struct kvp_match_result o = { 0 };
	int r;

	if (!m || m->struct_size < KVP_MATCH_RESULT_SIZE_V02)
		return kvp__fail(err, KVP_E_INVALID_ARGUMENT, 0,
				 "struct kvp_match_result too small");
	match.pool_id = p->id;
	match.namespace_ = ns;
	match.tokens = (uint32_t *)tokens;
	match.n_tokens = ntokens;
	kvp__match_flags(lock, &match.lock, &match.local_only);
	r = kvp__rpc(p->c, &req, RESULT(MATCH), &resp, NULL, NULL, err);
	if (r < 0)
		return r;
	mr = resp->match;
	if (mr->n_device_pages > cap || mr->n_host_pages > cap) {
		uint64_t lock_id = mr->lock_id;

		/* The caller cannot take the pages: give the lock back rather than leak it. */
		kvpool__response__free_unpacked(resp, NULL);
		if (lock_id)
			kvp_cache_release(p, lock_id, NULL);
		return kvp__fail(err, KVP_E_BUFFER, 0, "match: %u entries do not hold the reply",
				 cap);
	}
	o.matched_tokens = mr->matched_tokens;
	o.n_device = (uint32_t)mr->n_device_pages;
	o.n_host = (uint32_t)mr->n_host_pages;
	o.lock_id = mr->lock_id;
	o.remote_pages = mr->remote_pages;
	kvp__struct_out(m, &o, sizeof(o));
	kvp__pages_out(device_pages, mr->device_pages, mr->n_device_pages, host_pages,
		       mr->host_pages, mr->n_host_pages);
	kvpool__response__free_unpacked(resp, NULL);
	return 0;
}

KVP_EXPORT int kvp_cache_release(struct kvp_pool *p, uint64_t lock_id, struct kvp_error *err)
{
	CALL_SETUP(req, release, RELEASE, Kvpool__ReleaseReq, KVPOOL__RELEASE_REQ__INIT);

	release.lock_id = lock_id;
	return kvp__rpc_void(p->c, &req, RESULT(RELEASE), err);
}

KVP_EXPORT int kvp_cache_load(struct kvp_pool *p, uint64_t lock_id, uint32_t *device_pages,
			      uint32_t cap, struct kvp_error *err)
{
	CALL_SETUP(req, load, LOAD, Kvpool__LoadReq, KVPOOL__LOAD_REQ__INIT);
	Kvpool__Response *resp;
	size_t n;
	int r;

	load.lock_id = lock_id;
	r = kvp__rpc(p->c, &req, RESULT(LOAD), &resp, NULL, NULL, err);
	if (r < 0)
		return r;
	n = resp->load->n_device_pages;
	if (n > cap) {
		r = kvp__fail(err, KVP_E_BUFFER, 0, "load: %u entries do not hold %zu pages", cap,
			      n);
	} else {
		if (n)
			memcpy(device_pages, resp->load->device_pages, sizeof(uint32_t) * n);
		r = (int)n;
	}
	kvpool__response__free_unpacked(resp, NULL);
	return r;
}
