/* rpc_keys.c - hash-keyed pages: InsertKeys, MatchKeys, ExistsKeys, through the pool
 * (pool_cache.h, kvp_lease_insert_keys); their locks are booked by session.c like Match's, so
 * Release and Load take them.
 * Pages of both kinds share a namespace: every cache call checks only the session's namespace
 * bindings (kvp_session_may_use_ns). */
#include "rpc.h"

#include <errno.h>
#include <stdlib.h>

#include "pool_cache.h"
#include "remote_tier.h"

int kvp_rpc_keys_check(const struct kvp_daemon *d, const char *call, const ProtobufCBinaryData *k,
		       size_t n, struct kvp_fail *f)
{
	if (n > d->conf.max_keys_per_call) {
		kvp_fail_limit(f, "keys per call", d->conf.max_keys_per_call);
		kvp_fail(f, KVP_ERR_LIMIT_EXCEEDED,
			 "%s: %zu keys in one call, the limit is %u (max_keys_per_call)", call, n,
			 d->conf.max_keys_per_call);
		return -(int)f->code;
	}
	if (n == 0)
		return kvp_fail(f, KVP_ERR_INVALID_ARGUMENT, "%s: no keys", call);
	for (size_t i = 0; i < n; i++) {
		if (k[i].len == 0)
			return kvp_fail(f, KVP_ERR_INVALID_ARGUMENT, "%s: key %zu is empty", call,
					i);
		if (k[i].len > d->conf.max_key_bytes) {
			kvp_fail_limit(f, "bytes per key", d->conf.max_key_bytes);
			kvp_fail(f, KVP_ERR_LIMIT_EXCEEDED,
				 "%s: key %zu has %zu bytes, the limit is %u (max_key_bytes)", call,
				 i, k[i].len, d->conf.max_key_bytes);
			return -(int)f->code;
		}
	}
	return 0;
}

/* The call's keys, checked (kvp_rpc_keys_check); NULL with f filled (also INTERNAL). Free with
 * free(). */
static struct kvp_key *keys_of(const struct kvp_daemon *d, const char *call,
			       const ProtobufCBinaryData *k, size_t n, struct kvp_fail *f)
{
	struct kvp_key *out;

	if (kvp_rpc_keys_check(d, call, k, n, f) < 0)
		return NULL;
	out = malloc(n * sizeof(*out));
	if (!out) {
		kvp_rpc_oom(f);
		return NULL;
	}
	for (size_t i = 0; i < n; i++)
		out[i] = (struct kvp_key){ k[i].len, k[i].data };
	return out;
}

KVP_RPC_HANDLER(kvp_rpc_insert_keys)
{
	const Kvpool__InsertKeysReq *a = q->insert_keys;
	struct kvp_lease *l = kvp_session_lease(s, a->lease_id, f);
	Kvpool__InsertKeysResp *m;
	struct kvp_key *keys;
	uint32_t before;
	int rc;

	if (!l)
		return -(int)f->code;
	if ((rc = kvp_session_may_use_ns(d, s, l->pool, a->namespace_, "insert_keys", f)) < 0)
		return rc;
	if (!(keys = keys_of(d, "insert keys", a->keys, a->n_keys, f)))
		return -(int)f->code;
	if (a->n_pages > l->n || a->cached_keys > a->n_keys) {
		free(keys);
		return kvp_fail(
			f, KVP_ERR_INVALID_ARGUMENT,
			"insert keys: %zu keys (%u cached) in %zu pages do not fit lease %lu "
			"(%u pages)",
			a->n_keys, a->cached_keys, a->n_pages, (unsigned long)l->id, l->n);
	}
	m = KVP_REPLY_NEW(r, Kvpool__InsertKeysResp, kvpool__insert_keys_resp__descriptor);
	if (!m) {
		free(keys);
		return kvp_rpc_oom(f);
	}
	before = l->n;
	rc = kvp_lease_insert_keys(l, a->namespace_, keys, (uint32_t)a->n_keys, a->cached_keys,
				   a->pages, (uint32_t)a->n_pages, &m->new_pages, &m->dup_pages,
				   &m->done_keys, f);
	free(keys);
	if (rc < 0)
		return rc;
	if (l->tier == KVP_TIER_ID_HOST && m->done_keys > a->cached_keys)
		kvp_rt_written_keys(d, l->pool, a->namespace_, a->keys + a->cached_keys, a->pages,
				    m->done_keys - a->cached_keys);
	kvp_session_lease_resized(s, l, before);
	m->lease_pages = l->n;
	r->resp.result_case = KVPOOL__RESPONSE__RESULT_INSERT_KEYS;
	r->resp.insert_keys = m;
	return 0;
}

KVP_RPC_HANDLER(kvp_rpc_match_keys)
{
	const Kvpool__MatchKeysReq *a = q->match_keys;
	struct kvpd_pool *p = kvp_session_pool(d, s, a->pool_id, f);
	struct kvp_index_match mt = { 0 };
	Kvpool__MatchKeysResp *m;
	struct kvp_lock *k = NULL;
	struct kvp_key *keys;
	size_t n = a->n_keys;
	int rc;

	if (!p)
		return -(int)f->code;
	if ((rc = kvp_session_may_use_ns(d, s, p, a->namespace_, "match_keys", f)) < 0)
		return rc;
	if (a->lock && (rc = kvp_session_may_lock(d, s, f)) < 0)
		return rc;
	if (!(keys = keys_of(d, "match keys", a->keys, n, f)))
		return -(int)f->code;
	m = KVP_REPLY_NEW(r, Kvpool__MatchKeysResp, kvpool__match_keys_resp__descriptor);
	if (!m || !(m->device_pages = kvp_reply_alloc(r, sizeof(uint32_t) * n)) ||
	    !(m->host_pages = kvp_reply_alloc(r, sizeof(uint32_t) * n)) ||
	    (a->lock && !(k = kvp_session_lock_alloc()))) {
		free(keys);
		return kvp_rpc_oom(f);
	}
	rc = kvp_pool_match_keys(p, a->namespace_, keys, (uint32_t)n, a->lock, &mt, m->device_pages,
				 m->host_pages);
	free(keys);
	if (rc < 0) {
		free(k);
		return kvp_rpc_oom(f);
	}
	m->n_device_pages = mt.dev_pages;
	m->n_host_pages = mt.host_pages;
	m->matched_keys = mt.dev_pages + mt.host_pages;
	if (k && mt.lock) {
		k->pool = p;
		k->run = mt.lock;
		k->pages = m->matched_keys;
		if (kvp_session_lock_add(d, s, k) < 0)
			return kvp_rpc_oom(f);
		m->lock_id = k->id;
	} else {
		free(k);
	}
	r->resp.result_case = KVPOOL__RESPONSE__RESULT_MATCH_KEYS;
	r->resp.match_keys = m;
	/* Keys after the local ones: the remote tier's count comes with a later answer. */
	return kvp_rpc_match_keys_below(d, s, q, p, m);
}

KVP_RPC_HANDLER(kvp_rpc_exists_keys)
{
	const Kvpool__ExistsKeysReq *a = q->exists_keys;
	struct kvpd_pool *p = kvp_session_pool(d, s, a->pool_id, f);
	Kvpool__ExistsKeysResp *m;
	struct kvp_key *keys;
	int rc;

	if (!p)
		return -(int)f->code;
	if ((rc = kvp_session_may_use_ns(d, s, p, a->namespace_, "exists_keys", f)) < 0)
		return rc;
	if (!(keys = keys_of(d, "exists keys", a->keys, a->n_keys, f)))
		return -(int)f->code;
	m = KVP_REPLY_NEW(r, Kvpool__ExistsKeysResp, kvpool__exists_keys_resp__descriptor);
	if (!m) {
		free(keys);
		return kvp_rpc_oom(f);
	}
	m->count = kvp_pool_exists_keys(p, a->namespace_, keys, (uint32_t)a->n_keys);
	free(keys);
	r->resp.result_case = KVPOOL__RESPONSE__RESULT_EXISTS_KEYS;
	r->resp.exists_keys = m;
	return 0;
}
