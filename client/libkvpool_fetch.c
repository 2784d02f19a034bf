/* libkvpool_fetch.c - libkvpool's remote-tier call (kvpool.h, "the remote tier"): Fetch, for
 * token-keyed and hash-keyed namespaces, over the library's call path (kvp_internal.h). */
#include <stdlib.h>
#include <string.h>

#include "kvp_internal.h"

#define KVP_FETCH_RESULT_SIZE_V03 KVP__SIZE_UPTO(struct kvp_fetch_result, lock_id)

static int fetch(struct kvp_pool *p, Kvpool__FetchReq *a, struct kvp_fetch_result *out,
		 uint32_t *device_pages, uint32_t *host_pages, uint32_t cap, struct kvp_error *err)
{
	Kvpool__Request req = KVPOOL__REQUEST__INIT;
	struct kvp_client *c = kvp__pool_client(p);
	struct kvp_fetch_result o = { 0 };
	Kvpool__Response *resp;
	Kvpool__FetchResp *m;
	int r;

	req.call_case = KVPOOL__REQUEST__CALL_FETCH;
	req.fetch = a;
	a->pool_id = kvp_pool_id(p);
	r = kvp__rpc(c, &req, KVPOOL__RESPONSE__RESULT_FETCH, &resp, NULL, NULL, err);
	if (r < 0)
		return r;
	m = resp->fetch;
	if (m->n_device_pages > cap || m->n_host_pages > cap ||
	    (m->n_device_pages && !device_pages) || (m->n_host_pages && !host_pages)) {
		/* The caller cannot take the pages: give the lock back rather than leak it. */
		if (m->lock_id)
			kvp_cache_release(p, m->lock_id, NULL);
		kvpool__response__free_unpacked(resp, NULL);
		return kvp__fail(err, KVP_E_BUFFER, 0, "fetch: %u entries do not hold the reply",
				 cap);
	}
	o.fetched_pages = m->fetched_pages;
	o.missed_pages = m->missed_pages;
	o.matched = m->matched;
	o.n_device = (uint32_t)m->n_device_pages;
	o.n_host = (uint32_t)m->n_host_pages;
	o.lock_id = m->lock_id;
	kvp__struct_out(out, &o, sizeof(o));
	kvp__pages_out(device_pages, m->device_pages, m->n_device_pages, host_pages, m->host_pages,
		       m->n_host_pages);
	kvpool__response__free_unpacked(resp, NULL);
	return 0;
}

KVP_EXPORT int kvp_cache_fetch(struct kvp_pool *p, uint64_t ns, const uint32_t *tokens,
			       uint32_t ntokens, int lock, struct kvp_fetch_result *out,
			       uint32_t *device_pages, uint32_t *host_pages, uint32_t cap,
			       struct kvp_error *err)
{
	Kvpool__FetchReq a = KVPOOL__FETCH_REQ__INIT;

	if (!kvp__pool_client(p) || !out || out->struct_size < KVP_FETCH_RESULT_SIZE_V03 ||
	    !tokens || !ntokens)
		return kvp__fail(err, KVP_E_INVALID_ARGUMENT, 0,
				 "pool, tokens or out is NULL, or out->struct_size is not set");
	a.namespace_ = ns;
	a.tokens = (uint32_t *)tokens;
	a.n_tokens = ntokens;
	a.lock = lock != 0;
	return fetch(p, &a, out, device_pages, host_pages, cap, err);
}

KVP_EXPORT int kvp_cache_fetch_keys(struct kvp_pool *p, uint64_t ns,
				    const struct kvp_page_key *keys, uint32_t nkeys, int lock,
				    struct kvp_fetch_result *out, uint32_t *device_pages,
				    uint32_t *host_pages, uint32_t cap, struct kvp_error *err)
{
	Kvpool__FetchReq a = KVPOOL__FETCH_REQ__INIT;
	ProtobufCBinaryData *b;
	int r;

	if (!kvp__pool_client(p) || !out || out->struct_size < KVP_FETCH_RESULT_SIZE_V03 || !keys ||
	    !nkeys)
		return kvp__fail(err, KVP_E_INVALID_ARGUMENT, 0,
				 "pool, keys or out is NULL, or out->struct_size is not set");
	if ((r = kvp__wire_keys(keys, nkeys, &b, err)) < 0)
		return r;
	a.namespace_ = ns;
	a.keys = b;
	a.n_keys = nkeys;
	a.lock = lock != 0;
	r = fetch(p, &a, out, device_pages, host_pages, cap, err);
	free(b);
	return r;
}
