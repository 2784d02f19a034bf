/* rpc_cache.c - the prefix cache: Insert, Match, Release, Load, through the pool
 * (pool_cache.h); locks are booked by session.c. */
#include "rpc.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pool_cache.h"
#include "remote_tier.h"

KVP_RPC_HANDLER(kvp_rpc_insert)
{
	const Kvpool__InsertReq *a = q->insert;
	struct kvp_lease *l = kvp_session_lease(s, a->lease_id, f);
	Kvpool__InsertResp *m;
	uint32_t before;
	int rc;

	if (!l)
		return -(int)f->code;
	/* An earlier Insert took every page: the lease waits only for its Free. */
	if (l->n == 0)
		return kvp_fail(f, KVP_ERR_NOT_FOUND,
				"insert: lease %lu is empty (an earlier Insert took all its pages)",
				(unsigned long)l->id);
	if ((rc = kvp_session_may_use_ns(d, s, l->pool, a->namespace_, "insert", f)) < 0)
		return rc;
	if (a->n_tokens > UINT32_MAX / 2 || a->n_pages > l->n)
		return kvp_fail(f, KVP_ERR_INVALID_ARGUMENT,
				"insert: %zu tokens in %zu pages do not fit lease %lu (%u pages)",
				a->n_tokens, a->n_pages, (unsigned long)l->id, l->n);
	m = KVP_REPLY_NEW(r, Kvpool__InsertResp, kvpool__insert_resp__descriptor);
	if (!m)
		return kvp_rpc_oom(f);
	before = l->n;
	rc = kvp_lease_insert(l, a->namespace_, a->tokens, (uint32_t)a->n_tokens, a->cached_pages,
			      a->pages, (uint32_t)a->n_pages, &m->new_tokens, &m->dup_tokens, f);
	if (rc < 0)
		return rc;
	if (l->tier == KVP_TIER_ID_HOST) /* write-through: the whole pages, now cached */
		kvp_rt_written(d, l->pool, a->namespace_, a->tokens, a->cached_pages, a->pages,
			       (uint32_t)a->n_tokens / l->pool->conf.page_tokens > a->cached_pages
				       ? (uint32_t)a->n_tokens / l->pool->conf.page_tokens -
						 a->cached_pages
				       : 0);
	kvp_session_lease_resized(s, l, before);
	m->lease_pages = l->n;
	r->resp.result_case = KVPOOL__RESPONSE__RESULT_INSERT;
	r->resp.insert = m;
	return 0;
}

KVP_RPC_HANDLER(kvp_rpc_match)
{
	const Kvpool__MatchReq *a = q->match;
	struct kvpd_pool *p = kvp_session_pool(d, s, a->pool_id, f);
	struct kvp_index_match mt = { 0 };
	Kvpool__MatchResp *m;
	struct kvp_lock *k = NULL;
	uint32_t cap;
	int rc = 0;

	if (!p)
		return -(int)f->code;
	if ((rc = kvp_session_may_use_ns(d, s, p, a->namespace_, "match", f)) < 0)
		return rc;
	if (a->n_tokens > UINT32_MAX / 2)
		return kvp_fail(f, KVP_ERR_INVALID_ARGUMENT, "match: too many tokens");
	if (a->lock && (rc = kvp_session_may_lock(d, s, f)) < 0)
		return rc;
	cap = (uint32_t)a->n_tokens / p->conf.page_tokens;
	m = KVP_REPLY_NEW(r, Kvpool__MatchResp, kvpool__match_resp__descriptor);
	if (!m || !(m->device_pages = kvp_reply_alloc(r, sizeof(uint32_t) * cap)) ||
	    !(m->host_pages = kvp_reply_alloc(r, sizeof(uint32_t) * cap)) ||
	    (a->lock && !(k = kvp_session_lock_alloc())))
		return kvp_rpc_oom(f);
	if (kvp_pool_match(p, a->namespace_, a->tokens, (uint32_t)a->n_tokens, a->lock, &mt,
			   m->device_pages, m->host_pages) < 0) {
		free(k);
		return kvp_rpc_oom(f);
	}
	/* A match whose pages cannot be answered, or whose lock the quotas refuse, leaves no
	 * lock behind. */
	if ((uint64_t)mt.dev_pages + mt.host_pages > kvp_rpc_pages_per_reply(p))
		rc = kvp_rpc_reply_too_large(p, "match", (uint64_t)mt.dev_pages + mt.host_pages, f);
	else if (k && mt.lock)
		rc = kvp_session_may_lock_pages(d, s, p, (uint64_t)mt.dev_pages + mt.host_pages, f);
	if (rc < 0) {
		kvp_pool_unlock(p, mt.lock);
		free(k);
		return rc;
	}
	m->n_device_pages = mt.dev_pages;
	m->n_host_pages = mt.host_pages;
	m->matched_tokens = (uint64_t)(mt.dev_pages + mt.host_pages) * p->conf.page_tokens;
	if (k && mt.lock) {
		k->pool = p;
		k->run = mt.lock;
		k->pages = mt.dev_pages + mt.host_pages;
		if (kvp_session_lock_add(d, s, k) < 0)
			return kvp_rpc_oom(f);
		m->lock_id = k->id;
	} else {
		free(k);
	}
	r->resp.result_case = KVPOOL__RESPONSE__RESULT_MATCH;
	r->resp.match = m;
	/* Pages after the local ones: the remote tier's count comes with a later answer. */
	return kvp_rpc_match_below(d, s, q, p, m);
}

KVP_RPC_HANDLER(kvp_rpc_release)
{
	struct kvp_lock *k = kvp_session_lock(s, q->release->lock_id, f);
	Kvpool__ReleaseResp *m;

	(void)d;
	if (!k)
		return -(int)f->code;
	/* The reply first: a Release answered INTERNAL leaves the lock held, as it says. */
	m = KVP_REPLY_NEW(r, Kvpool__ReleaseResp, kvpool__release_resp__descriptor);
	if (!m)
		return kvp_rpc_oom(f);
	kvp_session_lock_release(s, k);
	r->resp.result_case = KVPOOL__RESPONSE__RESULT_RELEASE;
	r->resp.release = m;
	return 0;
}

KVP_RPC_HANDLER(kvp_rpc_load)
{
	struct kvp_lock *k = kvp_session_lock(s, q->load->lock_id, f);
	Kvpool__LoadResp *m;
	uint32_t n = 0, promoted = 0;
	int rc;

	(void)d;
	if (!k)
		return -(int)f->code;
	if (!kvp_pool_has_tier(k->pool, KVP_TIER_ID_DEVICE))
		return kvp_fail(f, KVP_ERR_INVALID_ARGUMENT, "pool %s has no device tier",
				k->pool->conf.name);
	m = KVP_REPLY_NEW(r, Kvpool__LoadResp, kvpool__load_resp__descriptor);
	if (!m || !(m->device_pages = kvp_reply_alloc(r, sizeof(uint32_t) * (k->pages + 1))))
		return kvp_rpc_oom(f);
	rc = kvp_pool_load(k->pool, k->run, m->device_pages, k->pages, &n, &promoted);
	if (rc == -ENOSPC) {
		kvp_pool_capacity_detail(k->pool, KVP_TIER_ID_DEVICE, k->pages, f);
		return kvp_fail(f, KVP_ERR_OUT_OF_CAPACITY,
				"load: pool %s device tier cannot hold the %lu tokens of lock %lu "
				"(%lu free, %lu evictable)",
				k->pool->conf.name, (unsigned long)f->cap.requested,
				(unsigned long)k->id, (unsigned long)f->cap.free,
				(unsigned long)f->cap.evictable);
	}
	if (rc == -EBUSY)
		return kvp_fail(
			f, KVP_ERR_UNAVAILABLE,
			"load: another session's lock also pins host pages of lock %lu and may "
			"be reading them; read them in the host tier, or retry after it releases",
			(unsigned long)k->id);
	if (rc < 0)
		return kvp_fail(f, KVP_ERR_INTERNAL, "load: promotion failed (%d)", rc);
	m->n_device_pages = n;
	m->promoted_pages = promoted;
	r->resp.result_case = KVPOOL__RESPONSE__RESULT_LOAD;
	r->resp.load = m;
	return 0;
}
