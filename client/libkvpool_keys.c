/* libkvpool_keys.c - libkvpool's hash-keyed page calls (kvpool.h, "hash-keyed pages"):
 * InsertKeys, MatchKeys, ExistsKeys over the library's call path (kvp_internal.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvp_internal.h"

#define KEYS_CALL(req, var, member, CASE, Type, INIT)                                              \
	Kvpool__Request req = KVPOOL__REQUEST__INIT;                                               \
	Type var = INIT;                                                                           \
	req.call_case = KVPOOL__REQUEST__CALL_##CASE;                                              \
	req.member = &var

/* A refusal past one of the library's limits (KVP_E_LIMIT_EXCEEDED, detail: limit). */
static int limit_fail(struct kvp_error *err, const char *what, uint64_t limit, const char *fmt,
		      uint64_t have)
{
	int r = kvp__fail(err, KVP_E_LIMIT_EXCEEDED, 0, fmt, (unsigned long long)have,
			  (unsigned long long)limit);

	if (err) {
		err->detail = KVP_DETAIL_LIMIT;
		snprintf(err->limit.what, sizeof(err->limit.what), "%s", what);
		err->limit.limit = limit;
	}
	return r;
}

int kvp__wire_keys(const struct kvp_page_key *keys, uint32_t n, ProtobufCBinaryData **out,
		   struct kvp_error *err)
{
	/* room for the envelope and the call's other fields */
	const uint64_t budget = KVP_FRAME_MAX - 4096;
	ProtobufCBinaryData *b;
	uint64_t bytes = 0;

	if (n && !keys)
		return kvp__fail(err, KVP_E_INVALID_ARGUMENT, 0, "keys is NULL");
	if (n > KVP_PAGE_KEYS_MAX)
		return limit_fail(err, "keys per call", KVP_PAGE_KEYS_MAX,
				  "%llu keys in one call, the limit is %llu", n);
	for (uint32_t i = 0; i < n; i++) {
		if (keys[i].len == 0 || !keys[i].data)
			return kvp__fail(err, KVP_E_INVALID_ARGUMENT, 0, "key %u is empty", i);
		if (keys[i].len > KVP_PAGE_KEY_BYTES_MAX)
			return limit_fail(err, "bytes per key", KVP_PAGE_KEY_BYTES_MAX,
					  "a key of %llu bytes, the limit is %llu", keys[i].len);
		bytes += keys[i].len + 2; /* the field's tag and length */
	}
	if (bytes > budget)
		return limit_fail(err, "key bytes per call", budget,
				  "%llu bytes of keys in one call, one frame holds %llu", bytes);
	b = malloc(((size_t)n + 1) * sizeof(*b));
	if (!b)
		return kvp__fail(err, KVP_E_NOMEM, 0, "out of memory for %u keys", n);
	for (uint32_t i = 0; i < n; i++) {
		b[i].len = keys[i].len;
		b[i].data = (uint8_t *)keys[i].data;
	}
	*out = b;
	return 0;
}

KVP_EXPORT int kvp_cache_insert_keys(struct kvp_pool *p, uint64_t lease_id, uint64_t ns,
				     const struct kvp_page_key *keys, uint32_t nkeys,
				     uint32_t cached_keys, const uint32_t *pages, uint32_t npages,
				     struct kvp_insert_keys_result *out, struct kvp_error *err)
{
	KEYS_CALL(req, a, insert_keys, INSERT_KEYS, Kvpool__InsertKeysReq,
		  KVPOOL__INSERT_KEYS_REQ__INIT);
	Kvpool__Response *resp;
	struct kvp_insert_keys_result o = { 0 };
	int r;

	struct kvp_client *c = kvp__pool_client(p);

	if (!c || (npages && !pages))
		return kvp__fail(err, KVP_E_INVALID_ARGUMENT, 0, "pool or pages is NULL");
	if (out && out->struct_size < KVP_INSERT_KEYS_RESULT_SIZE_V02)
		return kvp__fail(err, KVP_E_INVALID_ARGUMENT, 0, "out->struct_size is not set");
	if ((r = kvp__resv_bind(kvp__pool_resv(p), lease_id, err)) < 0)
		return r;
	if ((r = kvp__wire_keys(keys, nkeys, &a.keys, err)) < 0)
		return r;
	a.n_keys = nkeys;
	a.lease_id = lease_id;
	a.namespace_ = ns;
	a.pages = (uint32_t *)pages;
	a.n_pages = npages;
	a.cached_keys = cached_keys;
	r = kvp__rpc(c, &req, KVPOOL__RESPONSE__RESULT_INSERT_KEYS, &resp, NULL, NULL, err);
	free(a.keys);
	if (r < 0)
		return r;
	if (out) {
		o.new_pages = resp->insert_keys->new_pages;
		o.dup_pages = resp->insert_keys->dup_pages;
		o.done_keys = resp->insert_keys->done_keys;
		o.lease_pages = resp->insert_keys->lease_pages;
		kvp__struct_out(out, &o, sizeof(o));
	}
	kvpool__response__free_unpacked(resp, NULL);
	return 0;
}

KVP_EXPORT int kvp_cache_match_keys(struct kvp_pool *p, uint64_t ns,
				    const struct kvp_page_key *keys, uint32_t nkeys, int lock,
				    struct kvp_match_keys_result *m, uint32_t *device_pages,
				    uint32_t *host_pages, uint32_t cap, struct kvp_error *err)
{
	KEYS_CALL(req, a, match_keys, MATCH_KEYS, Kvpool__MatchKeysReq,
		  KVPOOL__MATCH_KEYS_REQ__INIT);
	Kvpool__Response *resp;
	Kvpool__MatchKeysResp *mr;
	struct kvp_match_keys_result o = { 0 };
	int r;

	struct kvp_client *c = kvp__pool_client(p);

	if (!c || !m || m->struct_size < KVP_MATCH_KEYS_RESULT_SIZE_V02)
		return kvp__fail(err, KVP_E_INVALID_ARGUMENT, 0,
				 "pool or m is NULL, or m->struct_size is not set");
	if ((r = kvp__wire_keys(keys, nkeys, &a.keys, err)) < 0)
		return r;
	a.n_keys = nkeys;
	a.pool_id = kvp_pool_id(p);
	a.namespace_ = ns;
	kvp__match_flags(lock, &a.lock, &a.local_only);
	r = kvp__rpc(c, &req, KVPOOL__RESPONSE__RESULT_MATCH_KEYS, &resp, NULL, NULL, err);
	free(a.keys);
	if (r < 0)
		return r;
	mr = resp->match_keys;
	if (mr->n_device_pages > cap || mr->n_host_pages > cap ||
	    (mr->n_device_pages && !device_pages) || (mr->n_host_pages && !host_pages)) {
		/* The caller cannot take the pages: give the lock back rather than leak it. */
		if (mr->lock_id)
			kvp_cache_release(p, mr->lock_id, NULL);
		kvpool__response__free_unpacked(resp, NULL);
		return kvp__fail(err, KVP_E_BUFFER, 0,
				 "match keys: %u entries do not hold the reply", cap);
	}
	o.matched_keys = mr->matched_keys;
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

KVP_EXPORT int kvp_cache_exists_keys(struct kvp_pool *p, uint64_t ns,
				     const struct kvp_page_key *keys, uint32_t nkeys,
				     struct kvp_error *err)
{
	KEYS_CALL(req, a, exists_keys, EXISTS_KEYS, Kvpool__ExistsKeysReq,
		  KVPOOL__EXISTS_KEYS_REQ__INIT);
	Kvpool__Response *resp;
	int r;

	struct kvp_client *c = kvp__pool_client(p);

	if (!c)
		return kvp__fail(err, KVP_E_INVALID_ARGUMENT, 0, "pool is NULL");
	if ((r = kvp__wire_keys(keys, nkeys, &a.keys, err)) < 0)
		return r;
	a.n_keys = nkeys;
	a.pool_id = kvp_pool_id(p);
	a.namespace_ = ns;
	r = kvp__rpc(c, &req, KVPOOL__RESPONSE__RESULT_EXISTS_KEYS, &resp, NULL, NULL, err);
	free(a.keys);
	if (r < 0)
		return r;
	if (resp->exists_keys->count > nkeys || resp->exists_keys->count > INT32_MAX)
		r = kvp__fail(err, KVP_E_PROTOCOL, 0, "exists keys: %u leading keys of %u",
			      resp->exists_keys->count, nkeys);
	else
		r = (int)resp->exists_keys->count;
	kvpool__response__free_unpacked(resp, NULL);
	return r;
}
