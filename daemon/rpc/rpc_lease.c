/* rpc_lease.c - leases: Alloc, Extend, Free. The session's books change only through
 * session.c's accounting calls, after everything that can fail has succeeded. */
#include "rpc.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dispatch.h"

/* Pages asked by tokens or pages (one of them, or both agreeing). 0 with f on bad input. */
static uint32_t pages_asked(const struct kvpd_pool *p, uint64_t tokens, uint32_t pages,
			    struct kvp_fail *f)
{
	uint64_t pt = p->conf.page_tokens;
	uint64_t from_tokens = tokens / pt + (tokens % pt != 0);

	if (!tokens && !pages) {
		kvp_fail(f, KVP_ERR_INVALID_ARGUMENT, "neither tokens nor pages given");
		return 0;
	}
	if (tokens && pages && from_tokens != pages) {
		kvp_fail(f, KVP_ERR_INVALID_ARGUMENT, "tokens %lu need %lu pages but pages says %u",
			 (unsigned long)tokens, (unsigned long)from_tokens, pages);
		return 0;
	}
	if (from_tokens > UINT32_MAX - 1) {
		kvp_fail(f, KVP_ERR_INVALID_ARGUMENT, "tokens %lu is absurd",
			 (unsigned long)tokens);
		return 0;
	}
	return pages ? pages : (uint32_t)from_tokens;
}

static int put_pages(struct kvp_reply *r, uint32_t **dst, size_t *n, const uint32_t *src,
		     uint32_t cnt)
{
	*dst = kvp_reply_alloc(r, sizeof(uint32_t) * cnt);
	if (!*dst)
		return -1;
	memcpy(*dst, src, sizeof(uint32_t) * cnt);
	*n = cnt;
	return 0;
}

/* The lease of npages pages of tier and its Alloc answer in r. 0 or a negative Code with f. */
static int alloc_lease(struct kvp_daemon *d, struct kvp_session *s, struct kvpd_pool *p, int tier,
		       uint32_t npages, struct kvp_reply *r, struct kvp_fail *f)
{
	struct kvp_lease *l;
	Kvpool__AllocResp *m;

	m = KVP_REPLY_NEW(r, Kvpool__AllocResp, kvpool__alloc_resp__descriptor);
	if (!m)
		return kvp_rpc_oom(f);
	l = kvp_lease_create(p, tier, kvp_daemon_new_id(d, &d->next_lease_id), npages, f);
	if (!l)
		return -(int)f->code;
	if (kvp_session_lease_add(s, l) < 0) {
		kvp_lease_destroy(l);
		return kvp_rpc_oom(f);
	}
	if (put_pages(r, &m->pages, &m->n_pages, l->pages, l->n) < 0) {
		kvp_session_lease_end(s, l);
		return kvp_rpc_oom(f);
	}
	m->lease_id = l->id;
	m->tier = (Kvpool__Tier)l->tier;
	r->resp.result_case = KVPOOL__RESPONSE__RESULT_ALLOC;
	r->resp.alloc = m;
	return 0;
}

/* An Alloc waiting for demotions in flight to free device pages (kvp_pool_fits_later): retried
 * each time one lands (kvp_rpc_alloc_retry), in arrival order. */
struct kvp_alloc_wait {
	struct kvp_defer *t;
	uint32_t pool_id;
	int tier;
	uint32_t npages;
	struct kvp_alloc_wait *next;
};

/* Checks everything an Alloc checks before it leases (again, for a waiting one). 0 or a
 * negative Code with f. */
static int alloc_check(struct kvp_daemon *d, struct kvp_session *s, struct kvpd_pool *p, int tier,
		       uint32_t npages, struct kvp_fail *f)
{
	int rc;

	if (d->draining)
		return kvp_fail(f, KVP_ERR_SHUTTING_DOWN, "kvpoold is draining: no new leases");
	if ((rc = kvp_session_may_lease(d, s, p, npages, true, f)) < 0)
		return rc;
	kvp_session_reap_empty(d, s);
	/* Sizes beyond the whole tier get the capacity figures; a lease whose page list cannot
	 * be answered is never made (its id would be lost with the reply). */
	if (npages <= kvp_pages_total(p->pages[tier]) && npages > kvp_rpc_pages_per_reply(p))
		return kvp_rpc_reply_too_large(p, "alloc", npages, f);
	return 0;
}

struct kvp_session *kvp_rpc_session_by_id(struct kvp_daemon *d, uint64_t id)
{
	for (struct kvp_session *s = d->sessions; s; s = s->next)
		if (s->id == id)
			return s;
	return NULL;
}

/* One waiting Alloc: true when it was answered (or dropped, its session gone). */
static bool alloc_retry(struct kvp_daemon *d, struct kvp_alloc_wait *w)
{
	struct kvp_session *s = kvp_rpc_session_by_id(d, w->t->session_id);
	struct kvpd_pool *p;
	struct kvp_reply r;
	struct kvp_fail f;
	int rc;

	kvp_fail_init(&f);
	if (!s) { /* nothing to lease for: the ticket is dropped */
		kvp_fail(&f, KVP_ERR_SHUTTING_DOWN, "the session ended");
		kvp_defer_fail(&d->defers, w->t, &f);
		return true;
	}
	kvp_reply_init(&r, w->t->req_id);
	p = kvp_session_pool(d, s, w->pool_id, &f);
	rc = p ? alloc_check(d, s, p, w->tier, w->npages, &f) : -(int)f.code;
	if (rc == 0)
		rc = alloc_lease(d, s, p, w->tier, w->npages, &r, &f);
	if (rc == -KVP_ERR_OUT_OF_CAPACITY && kvp_pool_fits_later(p, w->tier, w->npages)) {
		kvp_reply_release(&r);
		return false;
	}
	if (rc == 0)
		kvp_defer_answer(&d->defers, w->t, &r, 0);
	else
		kvp_defer_fail(&d->defers, w->t, &f);
	kvp_reply_release(&r);
	return true;
}

void kvp_rpc_alloc_retry(struct kvp_daemon *d)
{
	struct kvp_alloc_wait **pp = &d->alloc_waiting, *w;

	while ((w = *pp)) {
		if (!alloc_retry(d, w)) {
			pp = &w->next;
			continue;
		}
		*pp = w->next;
		free(w);
	}
}

/* Answered at once, or, when the pages are there once demotions in flight land, when they do
 * (a ticket, defer.h; bounded by its limits). */
KVP_RPC_HANDLER(kvp_rpc_alloc)
{
	const Kvpool__AllocReq *a = q->alloc;
	struct kvpd_pool *p = kvp_session_pool(d, s, a->pool_id, f);
	struct kvp_alloc_wait *w, **end;
	uint32_t npages;
	int rc, tier = (int)a->tier;

	if (!p)
		return -(int)f->code;
	if (d->draining)
		return kvp_fail(f, KVP_ERR_SHUTTING_DOWN, "kvpoold is draining: no new leases");
	if (tier < 0 || tier >= KVP_TIER_ID_MAX || !kvp_pool_has_tier(p, tier))
		return kvp_fail(f, KVP_ERR_INVALID_ARGUMENT, "pool %s has no tier %d", p->conf.name,
				tier);
	npages = pages_asked(p, a->tokens, a->pages, f);
	if (!npages)
		return -(int)f->code;
	if ((rc = alloc_check(d, s, p, tier, npages, f)) < 0)
		return rc;
	rc = alloc_lease(d, s, p, tier, npages, r, f);
	if (rc != -KVP_ERR_OUT_OF_CAPACITY || !kvp_pool_fits_later(p, tier, npages))
		return rc;
	if (!(w = calloc(1, sizeof(*w))))
		return kvp_rpc_oom(f);
	w->t = kvp_defer_take(&d->defers, s->id, s->uid, q->id, (int)q->call_case, f);
	if (!w->t) {
		free(w);
		return -(int)f->code;
	}
	w->pool_id = a->pool_id;
	w->tier = tier;
	w->npages = npages;
	for (end = &d->alloc_waiting; *end; end = &(*end)->next)
		;
	*end = w;
	return KVP_DEFERRED;
}

KVP_RPC_HANDLER(kvp_rpc_extend)
{
	struct kvp_lease *l = kvp_session_lease(s, q->extend->lease_id, f);
	Kvpool__ExtendResp *m;
	uint32_t npages, old;
	int rc;

	if (!l)
		return -(int)f->code;
	if (d->draining)
		return kvp_fail(f, KVP_ERR_SHUTTING_DOWN, "kvpoold is draining: no new leases");
	npages = pages_asked(l->pool, q->extend->tokens, q->extend->pages, f);
	if (!npages)
		return -(int)f->code;
	if ((rc = kvp_session_may_lease(d, s, l->pool, npages, false, f)) < 0)
		return rc;
	m = KVP_REPLY_NEW(r, Kvpool__ExtendResp, kvpool__extend_resp__descriptor);
	if (!m)
		return kvp_rpc_oom(f);
	/* Sizes beyond the whole tier are refused (with the capacity figures) before any
	 * reply memory is sized by them. */
	if (npages > kvp_pages_total(l->pool->pages[l->tier]))
		return kvp_lease_grow(l, npages, f);
	if (npages > kvp_rpc_pages_per_reply(l->pool))
		return kvp_rpc_reply_too_large(l->pool, "extend", npages, f);
	if (!(m->pages = kvp_reply_alloc(r, sizeof(uint32_t) * npages)))
		return kvp_rpc_oom(f);
	old = l->n;
	if ((rc = kvp_lease_grow(l, npages, f)) < 0)
		return rc;
	memcpy(m->pages, l->pages + old, sizeof(uint32_t) * npages);
	m->n_pages = npages;
	m->lease_pages = l->n;
	kvp_session_lease_resized(s, l, old);
	r->resp.result_case = KVPOOL__RESPONSE__RESULT_EXTEND;
	r->resp.extend = m;
	return 0;
}

KVP_RPC_HANDLER(kvp_rpc_free)
{
	struct kvp_lease *l = kvp_session_lease(s, q->free->lease_id, f);
	Kvpool__FreeResp *m;
	uint32_t n, before;
	int rc;

	(void)d;
	if (!l)
		return -(int)f->code;
	m = KVP_REPLY_NEW(r, Kvpool__FreeResp, kvpool__free_resp__descriptor);
	if (!m)
		return kvp_rpc_oom(f);
	if (q->free->n_pages == 0) {
		n = kvp_session_lease_end(s, l);
		m->lease_pages = 0;
	} else {
		if (q->free->n_pages > l->n)
			return kvp_fail(f, KVP_ERR_NOT_FOUND,
					"free: %zu pages listed but lease %lu holds %u",
					q->free->n_pages, (unsigned long)l->id, l->n);
		n = (uint32_t)q->free->n_pages;
		before = l->n;
		if ((rc = kvp_lease_return(l, q->free->pages, n, f)) < 0)
			return rc;
		kvp_session_lease_resized(s, l, before);
		m->lease_pages = l->n;
	}
	m->freed_pages = n;
	r->resp.result_case = KVPOOL__RESPONSE__RESULT_FREE;
	r->resp.free = m;
	return 0;
}
