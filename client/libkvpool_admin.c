/* libkvpool_admin.c - what operators ask: the daemon's status and metrics, the listings
 * (sessions, cached prefixes, a reload's changes) and the administration calls (evict, flush,
 * drain, reload). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvp_internal.h"

static void counters_from(struct kvp_counter *out, uint32_t *n, Kvpool__Counter **in, size_t nin)
{
	*n = 0;
	for (size_t i = 0; i < nin && i < KVP_STATUS_MAX_COUNTERS; i++) {
		snprintf(out[i].name, sizeof(out[i].name), "%s", in[i]->name ? in[i]->name : "");
		out[i].value = in[i]->value;
		(*n)++;
	}
}

/* moving: the pool's row of kvp_status.moving_tokens. */
static void pool_status_from(struct kvp_pool_status *po, uint64_t *moving,
			     const Kvpool__PoolStats *ps)
{
	snprintf(po->name, sizeof(po->name), "%s", ps->name ? ps->name : "");
	po->pool_id = ps->pool_id;
	kvp__geom_from(&po->geometry, ps->geometry);
	po->hit_tokens = ps->hit_tokens;
	po->queried_tokens = ps->queried_tokens;
	po->token_bytes = ps->token_bytes;
	po->sessions = ps->sessions;
	po->session_quota_tokens = ps->session_quota_tokens;
	snprintf(po->eviction, sizeof(po->eviction), "%s", ps->eviction ? ps->eviction : "");
	po->nodes = ps->nodes;
	po->demoted_tokens = ps->demoted_tokens;
	po->promoted_tokens = ps->promoted_tokens;
	po->allocs = ps->allocs;
	po->frees = ps->frees;
	po->alloc_failures = ps->alloc_failures;
	counters_from(po->counters, &po->n_counters, ps->counters, ps->n_counters);
	for (size_t t = 0; t < ps->n_tiers; t++) {
		const Kvpool__TierStats *ts = ps->tiers[t];
		struct kvp_tier_status *to;

		if ((int)ts->tier < 0 || (int)ts->tier >= KVP_TIER_MAX)
			continue;
		to = &po->tiers[ts->tier];
		to->present = 1;
		to->backend = (uint32_t)ts->backend;
		to->total_tokens = ts->total_tokens;
		to->free_tokens = ts->free_tokens;
		to->leased_tokens = ts->leased_tokens;
		to->cached_tokens = ts->cached_tokens;
		to->evictable_tokens = ts->evictable_tokens;
		to->protected_tokens = ts->protected_tokens;
		to->numa_node = ts->numa_node;
		to->evicted_tokens = ts->evicted_tokens;
		moving[ts->tier] = ts->moving_tokens;
	}
}

KVP_EXPORT int kvp_client_status(struct kvp_client *c, struct kvp_status *out,
				 struct kvp_error *err)
{
	CALL_SETUP(req, status, STATUS, Kvpool__StatusReq, KVPOOL__STATUS_REQ__INIT);
	Kvpool__Response *resp;
	Kvpool__StatusResp *s;
	struct kvp_status *st;
	int r;

	if (!out || out->struct_size < KVP_STATUS_SIZE_V02)
		return kvp__fail(err, KVP_E_INVALID_ARGUMENT, 0, "struct kvp_status too small");
	r = kvp__rpc(c, &req, RESULT(STATUS_INFO), &resp, NULL, NULL, err);
	if (r < 0)
		return r;
	/* filled whole here (tens of KiB: not on the caller's stack), copied out as far as the
	 * caller's struct_size reaches */
	st = calloc(1, sizeof(*st));
	if (!st) {
		kvpool__response__free_unpacked(resp, NULL);
		return kvp__fail(err, KVP_E_NOMEM, ENOMEM, "out of memory");
	}
	st->struct_size = out->struct_size;
	s = resp->status_info;
	snprintf(st->daemon_version, sizeof(st->daemon_version), "%s",
		 s->daemon_version ? s->daemon_version : "");
	st->uptime_ms = s->uptime_ms;
	st->sessions = s->sessions;
	st->pid = s->pid;
	st->draining = s->draining;
	for (size_t i = 0; i < s->n_pools && i < KVP_STATUS_MAX_POOLS; i++, st->n_pools++)
		pool_status_from(&st->pools[i], st->moving_tokens[i], s->pools[i]);
	counters_from(st->counters, &st->n_counters, s->counters, s->n_counters);
	for (size_t i = KVP_STATUS_MAX_COUNTERS;
	     i < s->n_counters && st->n_more_counters < KVP_STATUS_MORE_COUNTERS; i++) {
		struct kvp_counter *m = &st->more_counters[st->n_more_counters++];

		snprintf(m->name, sizeof(m->name), "%s",
			 s->counters[i]->name ? s->counters[i]->name : "");
		m->value = s->counters[i]->value;
	}
	kvpool__response__free_unpacked(resp, NULL);
	kvp__struct_out(out, st, sizeof(*st));
	free(st);
	return 0;
}

KVP_EXPORT int kvp_client_metrics(struct kvp_client *c, char *buf, size_t len,
				  struct kvp_error *err)
{
	CALL_SETUP(req, metrics, METRICS, Kvpool__MetricsReq, KVPOOL__METRICS_REQ__INIT);
	Kvpool__Response *resp;
	size_t n;
	int r = kvp__rpc(c, &req, RESULT(METRICS), &resp, NULL, NULL, err);

	if (r < 0)
		return r;
	n = resp->metrics->text ? strlen(resp->metrics->text) : 0;
	if (n + 1 > len || n > INT32_MAX)
		r = kvp__fail(err, KVP_E_BUFFER, 0, "metrics need %zu bytes", n + 1);
	else {
		memcpy(buf, n ? resp->metrics->text : "", n + 1);
		r = (int)n;
	}
	kvpool__response__free_unpacked(resp, NULL);
	return r;
}

/* Writes entry e (this version's `size` bytes, filled by the caller) as entry i of a listing of
 * stride entries[0].struct_size: min(stride, size) bytes, struct_size set to the stride. */
static void list_put(void *entries, uint32_t i, void *e, size_t size)
{
	size_t stride = *(size_t *)entries;
	char *d = (char *)entries + stride * i;

	*(size_t *)d = stride;
	kvp__struct_out(d, e, size);
}

/* The stride must hold the entry's first version and keep every entry aligned. */
static int list_check(void *entries, uint32_t cap, size_t first_size, struct kvp_error *err)
{
	if (cap &&
	    (!entries || *(size_t *)entries < first_size || *(size_t *)entries % _Alignof(size_t)))
		return kvp__fail(err, KVP_E_INVALID_ARGUMENT, 0, "listing entries too small");
	return 0;
}

static int list_count(size_t n, struct kvp_error *err)
{
	return n > INT32_MAX ? kvp__fail(err, KVP_E_PROTOCOL, 0, "a listing of %zu", n) : (int)n;
}

KVP_EXPORT int kvp_session_list(struct kvp_client *c, struct kvp_session_info *entries,
				uint32_t cap, struct kvp_error *err)
{
	CALL_SETUP(req, sessions, SESSIONS, Kvpool__SessionsReq, KVPOOL__SESSIONS_REQ__INIT);
	Kvpool__Response *resp;
	Kvpool__SessionsResp *m;
	int r;

	if ((r = list_check(entries, cap, KVP_SESSION_INFO_SIZE_V02, err)) < 0)
		return r;
	if ((r = kvp__rpc(c, &req, RESULT(SESSIONS), &resp, NULL, NULL, err)) < 0)
		return r;
	m = resp->sessions;
	for (uint32_t i = 0; i < m->n_sessions && i < cap; i++) {
		const Kvpool__SessionInfo *s = m->sessions[i];
		struct kvp_session_info e = { 0 }, *o = &e;

		o->session_id = s->session_id;
		o->pid = s->pid;
		o->uid = s->uid;
		o->gid = s->gid;
		snprintf(o->name, sizeof(o->name), "%s", s->name ? s->name : "");
		o->leased_tokens = s->leased_tokens;
		o->locked_tokens = s->locked_tokens;
		o->leases = s->leases;
		o->locks = s->locks;
		o->age_ms = s->age_ms;
		o->idle_ms = s->idle_ms;
		list_put(entries, i, &e, sizeof(e));
	}
	r = list_count(m->n_sessions, err);
	kvpool__response__free_unpacked(resp, NULL);
	return r;
}

KVP_EXPORT int kvp_cache_list(struct kvp_client *c, const char *pool,
			      struct kvp_cache_prefix *entries, uint32_t cap, struct kvp_error *err)
{
	CALL_SETUP(req, cache, CACHE, Kvpool__CacheReq, KVPOOL__CACHE_REQ__INIT);
	Kvpool__Response *resp;
	Kvpool__CacheResp *m;
	int r;

	if ((r = list_check(entries, cap, KVP_CACHE_PREFIX_SIZE_V02, err)) < 0)
		return r;
	cache.pool = (char *)(pool ? pool : "");
	if ((r = kvp__rpc(c, &req, RESULT(CACHE), &resp, NULL, NULL, err)) < 0)
		return r;
	m = resp->cache;
	for (uint32_t i = 0; i < m->n_top && i < cap; i++) {
		struct kvp_cache_prefix e = { 0 };

		e.tokens = m->top[i]->tokens;
		e.hits = m->top[i]->hits;
		e.ns = m->top[i]->namespace_;
		e.keyed = m->top[i]->keyed;
		list_put(entries, i, &e, sizeof(e));
	}
	r = list_count(m->n_top, err);
	kvpool__response__free_unpacked(resp, NULL);
	return r;
}

/* ---- administration ---- */

KVP_EXPORT int kvp_admin_evict(struct kvp_client *c, const char *pool, int tier, uint64_t tokens,
			       uint64_t *evicted, struct kvp_error *err)
{
	CALL_SETUP(req, evict, EVICT, Kvpool__EvictReq, KVPOOL__EVICT_REQ__INIT);
	Kvpool__Response *resp;
	int r;

	evict.pool = (char *)pool;
	evict.tier = (Kvpool__Tier)tier;
	evict.tokens = tokens;
	r = kvp__rpc(c, &req, RESULT(EVICT), &resp, NULL, NULL, err);
	if (r < 0)
		return r;
	if (evicted)
		*evicted = resp->evict->evicted_tokens;
	kvpool__response__free_unpacked(resp, NULL);
	return 0;
}

KVP_EXPORT int kvp_admin_flush(struct kvp_client *c, const char *pool, uint64_t *evicted,
			       struct kvp_error *err)
{
	CALL_SETUP(req, flush, FLUSH, Kvpool__FlushReq, KVPOOL__FLUSH_REQ__INIT);
	Kvpool__Response *resp;
	int r;

	flush.pool = (char *)pool;
	r = kvp__rpc(c, &req, RESULT(FLUSH), &resp, NULL, NULL, err);
	if (r < 0)
		return r;
	if (evicted)
		*evicted = resp->flush->evicted_tokens;
	kvpool__response__free_unpacked(resp, NULL);
	return 0;
}

KVP_EXPORT int kvp_admin_drain(struct kvp_client *c, uint32_t deadline_ms, struct kvp_error *err)
{
	CALL_SETUP(req, drain, DRAIN, Kvpool__DrainReq, KVPOOL__DRAIN_REQ__INIT);

	drain.deadline_ms = deadline_ms;
	return kvp__rpc_void(c, &req, RESULT(DRAIN), err);
}

KVP_EXPORT int kvp_admin_drain_cancel(struct kvp_client *c, struct kvp_error *err)
{
	CALL_SETUP(req, drain, DRAIN, Kvpool__DrainReq, KVPOOL__DRAIN_REQ__INIT);
	Kvpool__Response *resp;
	int r;

	drain.cancel = true;
	if ((r = kvp__rpc(c, &req, RESULT(DRAIN), &resp, NULL, NULL, err)) < 0)
		return r;
	r = resp->drain->was_draining ? 1 : 0;
	kvpool__response__free_unpacked(resp, NULL);
	return r;
}

KVP_EXPORT int kvp_admin_reload(struct kvp_client *c, struct kvp_reload_item *entries, uint32_t cap,
				struct kvp_error *err)
{
	CALL_SETUP(req, reload, RELOAD, Kvpool__ReloadReq, KVPOOL__RELOAD_REQ__INIT);
	Kvpool__Response *resp;
	Kvpool__ReloadResp *m;
	uint32_t k = 0;
	int r;

	if ((r = list_check(entries, cap, KVP_RELOAD_ITEM_SIZE_V02, err)) < 0)
		return r;
	if ((r = kvp__rpc(c, &req, RESULT(RELOAD), &resp, NULL, NULL, err)) < 0)
		return r;
	m = resp->reload;
	for (int refused = 0; refused < 2; refused++) {
		char **lines = refused ? m->refused : m->changes;
		size_t n = refused ? m->n_refused : m->n_changes;

		for (size_t i = 0; i < n; i++, k++) {
			struct kvp_reload_item e = { 0 };

			if (k >= cap)
				continue;
			e.refused = (uint32_t)refused;
			snprintf(e.text, sizeof(e.text), "%s", lines[i] ? lines[i] : "");
			list_put(entries, k, &e, sizeof(e));
		}
	}
	r = list_count(m->n_changes + m->n_refused, err);
	kvpool__response__free_unpacked(resp, NULL);
	return r;
}
