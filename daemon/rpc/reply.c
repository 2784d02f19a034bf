/* reply.c - the reply arena (reply.h): pieces from the inline buffer, then malloc, all freed
 * by kvp_reply_release; typed failures written into the reply's Status. */
#include "reply.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "fault.h"
#include "tier.h"

/* fail.h's codes are the wire's, number for number. */
_Static_assert((int)KVP_ERR_NONE == (int)KVPOOL__CODE__OK, "codes follow the wire");
_Static_assert((int)KVP_ERR_OUT_OF_CAPACITY == (int)KVPOOL__CODE__OUT_OF_CAPACITY,
	       "codes follow the wire");
_Static_assert((int)KVP_ERR_HOST_BUDGET_EXCEEDED == (int)KVPOOL__CODE__HOST_BUDGET_EXCEEDED,
	       "codes follow the wire");
_Static_assert((int)KVP_ERR_QUOTA_EXCEEDED == (int)KVPOOL__CODE__QUOTA_EXCEEDED,
	       "codes follow the wire");
_Static_assert((int)KVP_ERR_NO_SUCH_POOL == (int)KVPOOL__CODE__NO_SUCH_POOL,
	       "codes follow the wire");
_Static_assert((int)KVP_ERR_GEOMETRY_MISMATCH == (int)KVPOOL__CODE__GEOMETRY_MISMATCH,
	       "codes follow the wire");
_Static_assert((int)KVP_ERR_NOT_FOUND == (int)KVPOOL__CODE__NOT_FOUND, "codes follow the wire");
_Static_assert((int)KVP_ERR_INVALID_ARGUMENT == (int)KVPOOL__CODE__INVALID_ARGUMENT,
	       "codes follow the wire");
_Static_assert((int)KVP_ERR_PERMISSION_DENIED == (int)KVPOOL__CODE__PERMISSION_DENIED,
	       "codes follow the wire");
_Static_assert((int)KVP_ERR_PROTOCOL == (int)KVPOOL__CODE__PROTOCOL, "codes follow the wire");
_Static_assert((int)KVP_ERR_VERSION == (int)KVPOOL__CODE__VERSION, "codes follow the wire");
_Static_assert((int)KVP_ERR_SHUTTING_DOWN == (int)KVPOOL__CODE__SHUTTING_DOWN,
	       "codes follow the wire");
_Static_assert((int)KVP_ERR_LIMIT_EXCEEDED == (int)KVPOOL__CODE__LIMIT_EXCEEDED,
	       "codes follow the wire");
_Static_assert((int)KVP_ERR_UNAVAILABLE == (int)KVPOOL__CODE__UNAVAILABLE, "codes follow the wire");
_Static_assert((int)KVP_ERR_INTERNAL == (int)KVPOOL__CODE__INTERNAL, "codes follow the wire");
_Static_assert((int)KVP_ERR_RESTARTED == (int)KVPOOL__CODE__RESTARTED, "codes follow the wire");
_Static_assert((int)KVP_ERR_MAX == (int)KVPOOL__CODE__RESTARTED + 1, "every wire code has a name");

/* tier.h numbers backends as the wire does. */
_Static_assert((int)KVP_BACKEND_KIND_NONE == (int)KVPOOL__BACKEND__BACKEND_NONE &&
		       (int)KVP_BACKEND_KIND_SIM == (int)KVPOOL__BACKEND__SIM &&
		       (int)KVP_BACKEND_KIND_CUDA == (int)KVPOOL__BACKEND__CUDA &&
		       (int)KVP_BACKEND_KIND_MEMFD == (int)KVPOOL__BACKEND__MEMFD,
	       "tier backends follow the wire's Backend");

void kvp_reply_init(struct kvp_reply *r, uint64_t id)
{
	/* resp and status are set by their inits; the rest up to the inline buffer is cleared */
	memset(&r->allocs, 0, offsetof(struct kvp_reply, inl) - offsetof(struct kvp_reply, allocs));
	kvpool__response__init(&r->resp);
	kvpool__status__init(&r->status);
	r->resp.id = id;
	r->resp.status = &r->status;
}

void kvp_reply_release(struct kvp_reply *r)
{
	for (size_t i = 0; i < r->nallocs; i++)
		free(r->allocs[i]);
	free(r->allocs);
	r->allocs = NULL;
	r->nallocs = r->capallocs = 0;
}

int kvp_reply_adopt(struct kvp_reply *r, void *p)
{
	if (r->nallocs == r->capallocs) {
		size_t cap = r->capallocs ? r->capallocs * 2 : 16;
		void **a = realloc(r->allocs, cap * sizeof(*a));

		if (!a) {
			free(p);
			return -ENOMEM;
		}
		r->allocs = a;
		r->capallocs = cap;
	}
	r->allocs[r->nallocs++] = p;
	return 0;
}

void *kvp_reply_alloc(struct kvp_reply *r, size_t n)
{
	size_t want = (n + _Alignof(max_align_t) - 1) & ~(size_t)(_Alignof(max_align_t) - 1);
	void *p;

	if (kvp_fault_hit(KVP_FAULT_REPLY_ALLOC))
		return NULL;
	if (want >= n && want <= sizeof(r->inl) - r->inl_used) {
		p = r->inl + r->inl_used;
		r->inl_used += want;
		return memset(p, 0, n);
	}
	p = calloc(1, n ? n : 1);

	if (!p || kvp_reply_adopt(r, p) < 0)
		return NULL;
	return p;
}

void *kvp_reply_msg(struct kvp_reply *r, size_t size, const ProtobufCMessageDescriptor *desc)
{
	void *m = kvp_reply_alloc(r, size);

	if (m)
		protobuf_c_message_init(desc, m);
	return m;
}

char *kvp_reply_strdup(struct kvp_reply *r, const char *s)
{
	size_t n = strlen(s) + 1;
	char *p = kvp_reply_alloc(r, n);

	if (p)
		memcpy(p, s, n);
	return p;
}

int kvp_reply_add_fd(struct kvp_reply *r, int fd)
{
	if (r->nfds >= KVP_REPLY_MAX_FDS)
		return -ENOSPC;
	r->fds[r->nfds] = fd;
	return r->nfds++;
}

Kvpool__Geometry *kvp_reply_geometry(struct kvp_reply *r, const struct kvp_geom *g)
{
	Kvpool__Geometry *m = KVP_REPLY_NEW(r, Kvpool__Geometry, kvpool__geometry__descriptor);

	if (m) {
		m->layers = g->layers;
		m->kv_heads = g->kv_heads;
		m->head_dim = g->head_dim;
		m->dtype = (Kvpool__Dtype)g->dtype;
		m->page_tokens = g->page_tokens;
	}
	return m;
}

void kvp_reply_fail(struct kvp_reply *r, const struct kvp_fail *f)
{
	Kvpool__Status *st = &r->status;

	st->code = (Kvpool__Code)f->code;
	st->message = kvp_reply_strdup(r, f->msg);
	if (!st->message)
		st->message = (char *)"out of memory";
	switch (f->detail) {
	case KVP_FAIL_CAPACITY: {
		Kvpool__CapacityDetail *c = KVP_REPLY_NEW(r, Kvpool__CapacityDetail,
							  kvpool__capacity_detail__descriptor);
		if (!c)
			break;
		c->tier = (Kvpool__Tier)f->cap.tier;
		c->requested_tokens = f->cap.requested;
		c->free_tokens = f->cap.free;
		c->evictable_tokens = f->cap.evictable;
		c->protected_tokens = f->cap.protected_;
		c->leased_tokens = f->cap.leased;
		c->total_tokens = f->cap.total;
		c->reserved_tokens = f->cap.reserved;
		st->detail_case = KVPOOL__STATUS__DETAIL_CAPACITY;
		st->capacity = c;
		break;
	}
	case KVP_FAIL_BUDGET: {
		Kvpool__BudgetDetail *b =
			KVP_REPLY_NEW(r, Kvpool__BudgetDetail, kvpool__budget_detail__descriptor);
		if (!b)
			break;
		b->requested_bytes = f->budget.requested;
		b->available_bytes = f->budget.available;
		b->limit = (Kvpool__Limit)f->budget.limit;
		b->numa_node = f->budget.numa_node;
		b->pool = kvp_reply_strdup(r, f->budget.pool);
		if (!b->pool)
			b->pool = (char *)"";
		st->detail_case = KVPOOL__STATUS__DETAIL_BUDGET;
		st->budget = b;
		break;
	}
	case KVP_FAIL_QUOTA: {
		Kvpool__QuotaDetail *q =
			KVP_REPLY_NEW(r, Kvpool__QuotaDetail, kvpool__quota_detail__descriptor);
		if (!q)
			break;
		q->quota_tokens = f->quota.quota;
		q->held_tokens = f->quota.held;
		q->requested_tokens = f->quota.requested;
		st->detail_case = KVPOOL__STATUS__DETAIL_QUOTA;
		st->quota = q;
		break;
	}
	case KVP_FAIL_GEOMETRY: {
		Kvpool__GeometryDetail *g = KVP_REPLY_NEW(r, Kvpool__GeometryDetail,
							  kvpool__geometry_detail__descriptor);
		if (!g)
			break;
		g->expected = kvp_reply_geometry(r, &f->geom.expected);
		g->actual = kvp_reply_geometry(r, &f->geom.actual);
		st->detail_case = KVPOOL__STATUS__DETAIL_GEOMETRY;
		st->geometry = g;
		break;
	}
	case KVP_FAIL_LIMIT: {
		Kvpool__LimitDetail *l =
			KVP_REPLY_NEW(r, Kvpool__LimitDetail, kvpool__limit_detail__descriptor);
		if (!l)
			break;
		l->what = kvp_reply_strdup(r, f->limit.what);
		if (!l->what)
			l->what = (char *)"";
		l->limit = f->limit.limit;
		st->detail_case = KVPOOL__STATUS__DETAIL_LIMIT;
		st->limit = l;
		break;
	}
	default: break;
	}
}
