/* dispatch.c - one handler per call, chosen by the Request's oneof case. Handlers validate
 * everything before they change anything, so a refused call leaves no trace. */
#include "dispatch.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fault.h"
#include "kvp_config.h"
#include "kvpool_caps.h"
#include "log.h"

typedef int (*handler_fn)(struct kvp_daemon *d, struct kvp_session *s, const Kvpool__Request *q,
			  struct kvp_reply *r, struct kvp_fail *f);

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

/* Records p to be freed with the reply; frees it and returns -1 when it cannot. */
static int reply_adopt(struct kvp_reply *r, void *p)
{
	if (r->nallocs == r->capallocs) {
		size_t cap = r->capallocs ? r->capallocs * 2 : 16;
		void **a = realloc(r->allocs, cap * sizeof(*a));

		if (!a) {
			free(p);
			return -1;
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

	if (!p || reply_adopt(r, p) < 0)
		return NULL;
	return p;
}

/* A zeroed, initialised message of type desc, owned by the reply. */
static void *rep_new(struct kvp_reply *r, size_t size, const ProtobufCMessageDescriptor *desc)
{
	void *m = kvp_reply_alloc(r, size);

	if (m)
		protobuf_c_message_init(desc, m);
	return m;
}

#define NEW(r, T, desc) ((T *)rep_new((r), sizeof(T), &(desc)))

static char *rep_strdup(struct kvp_reply *r, const char *s)
{
	size_t n = strlen(s) + 1;
	char *p = kvp_reply_alloc(r, n);

	if (p)
		memcpy(p, s, n);
	return p;
}

static Kvpool__Geometry *geom_msg(struct kvp_reply *r, const struct kvp_geom *g)
{
	Kvpool__Geometry *m = NEW(r, Kvpool__Geometry, kvpool__geometry__descriptor);

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

	st->code = f->code;
	st->message = rep_strdup(r, f->msg);
	if (!st->message)
		st->message = (char *)"out of memory";
	switch (f->detail) {
	case KVP_FAIL_CAPACITY: {
		Kvpool__CapacityDetail *c = NEW(r, Kvpool__CapacityDetail,
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
		st->detail_case = KVPOOL__STATUS__DETAIL_CAPACITY;
		st->capacity = c;
		break;
	}
	case KVP_FAIL_BUDGET: {
		Kvpool__BudgetDetail *b = NEW(r, Kvpool__BudgetDetail, kvpool__budget_detail__descriptor);
		if (!b)
			break;
		b->requested_bytes = f->budget.requested;
		b->available_bytes = f->budget.available;
		b->limit = (Kvpool__Limit)f->budget.limit;
		b->numa_node = f->budget.numa_node;
		b->pool = rep_strdup(r, f->budget.pool);
		if (!b->pool)
			b->pool = (char *)"";
		st->detail_case = KVPOOL__STATUS__DETAIL_BUDGET;
		st->budget = b;
		break;
	}
	case KVP_FAIL_QUOTA: {
		Kvpool__QuotaDetail *q = NEW(r, Kvpool__QuotaDetail, kvpool__quota_detail__descriptor);
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
		Kvpool__GeometryDetail *g = NEW(r, Kvpool__GeometryDetail,
						kvpool__geometry_detail__descriptor);
		if (!g)
			break;
		g->expected = geom_msg(r, &f->geom.expected);
		g->actual = geom_msg(r, &f->geom.actual);
		st->detail_case = KVPOOL__STATUS__DETAIL_GEOMETRY;
		st->geometry = g;
		break;
	}
	case KVP_FAIL_LIMIT: {
		Kvpool__LimitDetail *l = NEW(r, Kvpool__LimitDetail, kvpool__limit_detail__descriptor);
		if (!l)
			break;
		l->what = rep_strdup(r, f->limit.what);
		if (!l->what)
			l->what = (char *)"";
		l->limit = f->limit.limit;
		st->detail_case = KVPOOL__STATUS__DETAIL_LIMIT;
		st->limit = l;
		break;
	}
	default:
		break;
	}
}

static int oom(struct kvp_fail *f)
{
	return kvp_fail(f, KVPOOL__CODE__INTERNAL, "kvpoold is out of memory");
}

static void pool_geom(const struct kvp_pool *p, struct kvp_geom *g)
{
	g->layers = p->conf.layers;
	g->kv_heads = p->conf.kv_heads;
	g->head_dim = p->conf.head_dim;
	g->dtype = (uint32_t)p->conf.dtype + 1; /* wire Dtype counts from FP16 = 1 */
	g->page_tokens = p->conf.page_tokens;
}

static struct kvp_pool *pool_by_name(struct kvp_daemon *d, const char *name)
{
	for (uint32_t i = 0; i < d->n_pools; i++)
		if (strcmp(d->pools[i]->conf.name, name) == 0)
			return d->pools[i];
	return NULL;
}

static int no_such_pool(struct kvp_daemon *d, const char *name, struct kvp_fail *f)
{
	char names[256] = "";
	size_t n = 0;

	for (uint32_t i = 0; i < d->n_pools && n < sizeof(names) - 1; i++)
		n += (size_t)snprintf(names + n, sizeof(names) - n, "%s%s", i ? ", " : "",
				      d->pools[i]->conf.name);
	return kvp_fail(f, KVPOOL__CODE__NO_SUCH_POOL, "no pool '%.64s' (pools: %s)", name,
			d->n_pools ? names : "none");
}

/* The pool a pool_id names, attached by this session; NULL with f filled. */
static struct kvp_pool *attached_pool(struct kvp_daemon *d, struct kvp_session *s, uint32_t id,
				      struct kvp_fail *f)
{
	if (id >= d->n_pools) {
		kvp_fail(f, KVPOOL__CODE__NO_SUCH_POOL, "pool_id %u does not exist", id);
		return NULL;
	}
	if (!s->attached[id]) {
		kvp_fail(f, KVPOOL__CODE__NOT_FOUND, "pool_id %u is not attached by this session",
			 id);
		return NULL;
	}
	return d->pools[id];
}

static struct kvp_lease *own_lease(struct kvp_session *s, uint64_t id, struct kvp_fail *f)
{
	struct kvp_lease *l = kvp_idmap_get(&s->leases, id);

	if (!l)
		kvp_fail(f, KVPOOL__CODE__NOT_FOUND, "lease %lu is not one of this session's",
			 (unsigned long)id);
	return l;
}

static Kvpool__TierStats *tier_stats(struct kvp_reply *r, const struct kvp_pool *p, int t)
{
	Kvpool__TierStats *m = NEW(r, Kvpool__TierStats, kvpool__tier_stats__descriptor);
	struct kvp_prefix_stats ps;
	struct kvp_tier_counts c;
	uint64_t pt = p->conf.page_tokens;

	if (!m)
		return NULL;
	kvp_pool_counts(p, t, &c);
	kvp_prefix_stats(p->pfx, &ps);
	m->tier = (Kvpool__Tier)t;
	m->backend = (Kvpool__Backend)p->mem[t].backend;
	m->total_tokens = c.total * pt;
	m->free_tokens = c.free * pt;
	m->leased_tokens = c.leased * pt;
	m->cached_tokens = c.cached * pt;
	m->evictable_tokens = c.evictable * pt;
	m->protected_tokens = c.protected_ * pt;
	m->evicted_tokens = ps.evicted_pages[t] * pt;
	m->numa_node = p->mem[t].numa_node;
	return m;
}

/* Counter entries generated from an X-macro list: names are the struct fields. */
static Kvpool__Counter **counters(struct kvp_reply *r, const char *const *names,
				  const uint64_t *values, size_t n)
{
	Kvpool__Counter **v = kvp_reply_alloc(r, sizeof(*v) * n);

	for (size_t i = 0; v && i < n; i++) {
		v[i] = NEW(r, Kvpool__Counter, kvpool__counter__descriptor);
		if (!v[i])
			return NULL;
		v[i]->name = (char *)names[i];
		v[i]->value = values[i];
	}
	return v;
}

#define COUNTER_NAME(f, n, h) #f,
#define COUNTER_VALUE(f, n, h) st->f,
static const char *const pool_counter_names[] = { KVP_POOL_COUNTERS(COUNTER_NAME) };
static const char *const daemon_counter_names[] = { KVP_DAEMON_COUNTERS(COUNTER_NAME) };
#define N_POOL_COUNTERS (sizeof(pool_counter_names) / sizeof(pool_counter_names[0]))
#define N_DAEMON_COUNTERS (sizeof(daemon_counter_names) / sizeof(daemon_counter_names[0]))

static Kvpool__Counter **pool_counters(struct kvp_reply *r, const struct kvp_pool_stats *st)
{
	const uint64_t values[] = { KVP_POOL_COUNTERS(COUNTER_VALUE) };

	return counters(r, pool_counter_names, values, N_POOL_COUNTERS);
}

static Kvpool__Counter **daemon_counters(struct kvp_reply *r, const struct kvp_daemon_stats *st)
{
	const uint64_t values[] = { KVP_DAEMON_COUNTERS(COUNTER_VALUE) };

	return counters(r, daemon_counter_names, values, N_DAEMON_COUNTERS);
}

static Kvpool__PoolStats *pool_stats(struct kvp_reply *r, const struct kvp_pool *p)
{
	Kvpool__PoolStats *m = NEW(r, Kvpool__PoolStats, kvpool__pool_stats__descriptor);
	struct kvp_prefix_stats ps;
	struct kvp_geom g;
	uint64_t pt = p->conf.page_tokens;

	if (!m)
		return NULL;
	kvp_prefix_stats(p->pfx, &ps);
	pool_geom(p, &g);
	m->name = (char *)p->conf.name;
	m->pool_id = p->id;
	m->geometry = geom_msg(r, &g);
	m->tiers = kvp_reply_alloc(r, sizeof(*m->tiers) * KVP_TIER_MAX);
	if (!m->geometry || !m->tiers)
		return NULL;
	for (int t = 0; t < KVP_TIER_MAX; t++) {
		if (!kvp_pool_has_tier(p, t))
			continue;
		m->tiers[m->n_tiers] = tier_stats(r, p, t);
		if (!m->tiers[m->n_tiers])
			return NULL;
		m->n_tiers++;
	}
	m->sessions = p->sessions;
	m->session_quota_tokens = p->conf.session_quota_tokens;
	m->nodes = ps.nodes;
	m->hit_tokens = ps.hit_tokens;
	m->queried_tokens = ps.queried_tokens;
	m->demoted_tokens = ps.demoted_pages * pt;
	m->promoted_tokens = ps.promoted_pages * pt;
	m->allocs = p->st.allocs;
	m->frees = p->st.frees;
	m->alloc_failures = p->st.alloc_failures;
	m->eviction = (char *)kvp_eviction_name(p->conf.eviction);
	m->token_bytes = kvp_conf_token_bytes(&p->conf);
	m->counters = pool_counters(r, &p->st);
	if (!m->counters)
		return NULL;
	m->n_counters = N_POOL_COUNTERS;
	return m;
}

static int h_hello(struct kvp_daemon *d, struct kvp_session *s, const Kvpool__Request *q,
		   struct kvp_reply *r, struct kvp_fail *f)
{
	Kvpool__HelloResp *m;

	/* Any protocol from 1 on, as long as the client requires no capability this daemon
	 * lacks; the answer is the offer's intersection with what the daemon supports. */
	if (q->hello->protocol_version < 1 ||
	    (q->hello->required_capabilities & ~(uint64_t)KVP_CAPS_DAEMON)) {
		r->close_after = true;
		return kvp_fail(f, KVPOOL__CODE__VERSION,
				"client speaks protocol %u requiring capabilities 0x%llx; kvpoold %s "
				"speaks %u with 0x%llx",
				q->hello->protocol_version,
				(unsigned long long)q->hello->required_capabilities, KVP_VERSION,
				KVP_PROTO_VERSION, (unsigned long long)KVP_CAPS_DAEMON);
	}
	if (s->hello)
		return kvp_fail(f, KVPOOL__CODE__PROTOCOL, "Hello was already said");
	m = NEW(r, Kvpool__HelloResp, kvpool__hello_resp__descriptor);
	if (!m)
		return oom(f);
	snprintf(s->name, sizeof(s->name), "%s", q->hello->client_name ? q->hello->client_name : "");
	s->hello = true;
	d->st.sessions_opened++;
	m->session_id = s->id;
	m->daemon_version = (char *)KVP_VERSION;
	m->protocol_version = KVP_PROTO_VERSION;
	m->keepalive_ms = d->conf.keepalive_ms;
	m->capabilities = q->hello->capabilities & KVP_CAPS_DAEMON;
	r->resp.result_case = KVPOOL__RESPONSE__RESULT_HELLO;
	r->resp.hello = m;
	log_info("session %lu: hello from '%s' pid %d uid %u%s", (unsigned long)s->id, s->name,
		 (int)s->pid, (unsigned)s->uid, s->admin ? " (admin)" : "");
	return 0;
}

static int h_ping(struct kvp_daemon *d, struct kvp_session *s, const Kvpool__Request *q,
		  struct kvp_reply *r, struct kvp_fail *f)
{
	Kvpool__PingResp *m = NEW(r, Kvpool__PingResp, kvpool__ping_resp__descriptor);

	(void)d;
	(void)s;
	if (!m)
		return oom(f);
	m->nonce = q->ping->nonce;
	r->resp.result_case = KVPOOL__RESPONSE__RESULT_PING;
	r->resp.ping = m;
	return 0;
}

static int h_status(struct kvp_daemon *d, struct kvp_session *s, const Kvpool__Request *q,
		    struct kvp_reply *r, struct kvp_fail *f)
{
	Kvpool__StatusResp *m = NEW(r, Kvpool__StatusResp, kvpool__status_resp__descriptor);

	(void)s;
	(void)q;
	if (!m)
		return oom(f);
	m->daemon_version = (char *)KVP_VERSION;
	m->uptime_ms = kvp_now_ms() - d->started_ms;
	m->sessions = d->n_sessions;
	m->draining = d->draining;
	m->pid = (int32_t)getpid();
	m->pools = kvp_reply_alloc(r, sizeof(*m->pools) * (d->n_pools + 1));
	if (!m->pools)
		return oom(f);
	for (uint32_t i = 0; i < d->n_pools; i++) {
		m->pools[i] = pool_stats(r, d->pools[i]);
		if (!m->pools[i])
			return oom(f);
	}
	m->n_pools = d->n_pools;
	m->counters = daemon_counters(r, &d->st);
	if (!m->counters)
		return oom(f);
	m->n_counters = N_DAEMON_COUNTERS;
	r->resp.result_case = KVPOOL__RESPONSE__RESULT_STATUS_INFO;
	r->resp.status_info = m;
	return 0;
}

static bool geom_matches(const Kvpool__Geometry *e, const struct kvp_geom *a)
{
	return (!e->layers || e->layers == a->layers) && (!e->kv_heads || e->kv_heads == a->kv_heads) &&
	       (!e->head_dim || e->head_dim == a->head_dim) &&
	       (!e->dtype || (uint32_t)e->dtype == a->dtype) &&
	       (!e->page_tokens || e->page_tokens == a->page_tokens);
}

static int h_attach(struct kvp_daemon *d, struct kvp_session *s, const Kvpool__Request *q,
		    struct kvp_reply *r, struct kvp_fail *f)
{
	const Kvpool__AttachReq *a = q->attach;
	struct kvp_pool *p = pool_by_name(d, a->pool ? a->pool : "");
	Kvpool__AttachResp *m;
	struct kvp_geom g;

	if (!p)
		return no_such_pool(d, a->pool ? a->pool : "", f);
	if (d->draining)
		return kvp_fail(f, KVPOOL__CODE__SHUTTING_DOWN, "kvpoold is draining");
	pool_geom(p, &g);
	if (a->expected && !geom_matches(a->expected, &g)) {
		f->detail = KVP_FAIL_GEOMETRY;
		f->geom.expected = (struct kvp_geom){ a->expected->layers, a->expected->kv_heads,
						      a->expected->head_dim,
						      (uint32_t)a->expected->dtype,
						      a->expected->page_tokens };
		f->geom.actual = g;
		return kvp_fail(f, KVPOOL__CODE__GEOMETRY_MISMATCH,
				"pool %s is layers %u kv_heads %u head_dim %u dtype %s page_tokens "
				"%u; the client expects layers %u kv_heads %u head_dim %u page_tokens %u",
				p->conf.name, g.layers, g.kv_heads, g.head_dim,
				kvp_conf_dtype_name(p->conf.dtype), g.page_tokens, a->expected->layers,
				a->expected->kv_heads, a->expected->head_dim,
				a->expected->page_tokens);
	}
	m = NEW(r, Kvpool__AttachResp, kvpool__attach_resp__descriptor);
	if (!m || !(m->tiers = kvp_reply_alloc(r, sizeof(*m->tiers) * KVP_TIER_MAX)) ||
	    !(m->geometry = geom_msg(r, &g)))
		return oom(f);
	m->pool_id = p->id;
	m->pool = p->conf.name;
	m->session_quota_tokens = p->conf.session_quota_tokens;
	for (int t = 0; t < KVP_TIER_MAX; t++) {
		Kvpool__TierInfo *ti;

		if (!kvp_pool_has_tier(p, t))
			continue;
		ti = NEW(r, Kvpool__TierInfo, kvpool__tier_info__descriptor);
		if (!ti)
			return oom(f);
		ti->tier = (Kvpool__Tier)t;
		ti->backend = (Kvpool__Backend)p->mem[t].backend;
		ti->pages = kvp_pages_total(p->pages[t]);
		ti->bytes = p->mem[t].bytes;
		ti->fd_index = r->nfds;
		r->fds[r->nfds++] = p->mem[t].fd;
		ti->numa_node = p->mem[t].numa_node;
		ti->cuda_device = p->mem[t].cuda_device;
		if (p->mem[t].has_uuid) {
			ti->cuda_uuid.data = (uint8_t *)p->mem[t].cuda_uuid;
			ti->cuda_uuid.len = sizeof(p->mem[t].cuda_uuid);
		}
		ti->hugepages = p->mem[t].huge;
		ti->locked = p->mem[t].locked;
		ti->row_bytes = p->geom.row_bytes;
		ti->page_bytes = p->page_bytes;
		m->tiers[m->n_tiers++] = ti;
	}
	if (!s->attached[p->id]) {
		s->attached[p->id] = true;
		p->sessions++;
	}
	r->resp.result_case = KVPOOL__RESPONSE__RESULT_ATTACH;
	r->resp.attach = m;
	return 0;
}

static int h_detach(struct kvp_daemon *d, struct kvp_session *s, const Kvpool__Request *q,
		    struct kvp_reply *r, struct kvp_fail *f)
{
	struct kvp_pool *p = attached_pool(d, s, q->detach->pool_id, f);
	Kvpool__DetachResp *m;

	if (!p)
		return -(int)f->code;
	m = NEW(r, Kvpool__DetachResp, kvpool__detach_resp__descriptor);
	if (!m)
		return oom(f);
	m->freed_tokens = kvp_session_detach(d, s, p);
	r->resp.result_case = KVPOOL__RESPONSE__RESULT_DETACH;
	r->resp.detach = m;
	return 0;
}

/* Pages asked by tokens or pages (one of them, or both agreeing). 0 with f on bad input. */
static uint32_t pages_asked(const struct kvp_pool *p, uint64_t tokens, uint32_t pages,
			    struct kvp_fail *f)
{
	uint64_t pt = p->conf.page_tokens;
	uint64_t from_tokens = tokens / pt + (tokens % pt != 0);

	if (!tokens && !pages) {
		kvp_fail(f, KVPOOL__CODE__INVALID_ARGUMENT, "neither tokens nor pages given");
		return 0;
	}
	if (tokens && pages && from_tokens != pages) {
		kvp_fail(f, KVPOOL__CODE__INVALID_ARGUMENT,
			 "tokens %lu need %lu pages but pages says %u", (unsigned long)tokens,
			 (unsigned long)from_tokens, pages);
		return 0;
	}
	if (from_tokens > UINT32_MAX - 1) {
		kvp_fail(f, KVPOOL__CODE__INVALID_ARGUMENT, "tokens %lu is absurd",
			 (unsigned long)tokens);
		return 0;
	}
	return pages ? pages : (uint32_t)from_tokens;
}

static int check_quota(const struct kvp_session *s, const struct kvp_pool *p, uint32_t npages,
		       struct kvp_fail *f)
{
	uint64_t pt = p->conf.page_tokens, q = p->conf.session_quota_tokens;
	uint64_t held = s->leased_pages[p->id] * pt, want = (uint64_t)npages * pt;

	if (!q || held + want <= q)
		return 0;
	f->detail = KVP_FAIL_QUOTA;
	f->quota.quota = q;
	f->quota.held = held;
	f->quota.requested = want;
	return kvp_fail(f, KVPOOL__CODE__QUOTA_EXCEEDED,
			"pool %s: session quota is %lu tokens; this session holds %lu and asked "
			"for %lu more",
			p->conf.name, (unsigned long)q, (unsigned long)held, (unsigned long)want);
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

static int h_alloc(struct kvp_daemon *d, struct kvp_session *s, const Kvpool__Request *q,
		   struct kvp_reply *r, struct kvp_fail *f)
{
	const Kvpool__AllocReq *a = q->alloc;
	struct kvp_pool *p = attached_pool(d, s, a->pool_id, f);
	struct kvp_lease *l;
	Kvpool__AllocResp *m;
	uint32_t npages;
	int rc;

	if (!p)
		return -(int)f->code;
	if (d->draining)
		return kvp_fail(f, KVPOOL__CODE__SHUTTING_DOWN, "kvpoold is draining: no new leases");
	if ((int)a->tier < 0 || (int)a->tier >= KVP_TIER_MAX || !kvp_pool_has_tier(p, (int)a->tier))
		return kvp_fail(f, KVPOOL__CODE__INVALID_ARGUMENT, "pool %s has no tier %d",
				p->conf.name, (int)a->tier);
	npages = pages_asked(p, a->tokens, a->pages, f);
	if (!npages)
		return -(int)f->code;
	if (s->leases.count >= d->conf.max_leases_per_session)
		return kvp_fail_limit(f, "leases", d->conf.max_leases_per_session);
	if ((rc = check_quota(s, p, npages, f)) < 0)
		return rc;
	m = NEW(r, Kvpool__AllocResp, kvpool__alloc_resp__descriptor);
	if (!m)
		return oom(f);
	l = kvp_lease_create(p, (int)a->tier, ++d->next_lease_id, npages, f);
	if (!l)
		return -(int)f->code;
	if (kvp_idmap_put(&s->leases, l->id, l) < 0 ||
	    put_pages(r, &m->pages, &m->n_pages, l->pages, l->n) < 0) {
		kvp_idmap_del(&s->leases, l->id);
		kvp_lease_destroy(l);
		return oom(f);
	}
	s->leased_pages[p->id] += npages;
	m->lease_id = l->id;
	m->tier = (Kvpool__Tier)l->tier;
	r->resp.result_case = KVPOOL__RESPONSE__RESULT_ALLOC;
	r->resp.alloc = m;
	return 0;
}

static int h_extend(struct kvp_daemon *d, struct kvp_session *s, const Kvpool__Request *q,
		    struct kvp_reply *r, struct kvp_fail *f)
{
	struct kvp_lease *l = own_lease(s, q->extend->lease_id, f);
	Kvpool__ExtendResp *m;
	uint32_t npages, old;
	int rc;

	if (!l)
		return -(int)f->code;
	if (d->draining)
		return kvp_fail(f, KVPOOL__CODE__SHUTTING_DOWN, "kvpoold is draining: no new leases");
	npages = pages_asked(l->pool, q->extend->tokens, q->extend->pages, f);
	if (!npages)
		return -(int)f->code;
	if ((rc = check_quota(s, l->pool, npages, f)) < 0)
		return rc;
	m = NEW(r, Kvpool__ExtendResp, kvpool__extend_resp__descriptor);
	if (!m)
		return oom(f);
	/* Sizes beyond the whole tier are refused (with the capacity figures) before any
	 * reply memory is sized by them. */
	if (npages > kvp_pages_total(l->pool->pages[l->tier]))
		return kvp_lease_extend(l, npages, f);
	if (!(m->pages = kvp_reply_alloc(r, sizeof(uint32_t) * npages)))
		return oom(f);
	old = l->n;
	if ((rc = kvp_lease_extend(l, npages, f)) < 0)
		return rc;
	memcpy(m->pages, l->pages + old, sizeof(uint32_t) * npages);
	m->n_pages = npages;
	m->lease_pages = l->n;
	s->leased_pages[l->pool->id] += npages;
	r->resp.result_case = KVPOOL__RESPONSE__RESULT_EXTEND;
	r->resp.extend = m;
	return 0;
}

static int h_free(struct kvp_daemon *d, struct kvp_session *s, const Kvpool__Request *q,
		  struct kvp_reply *r, struct kvp_fail *f)
{
	struct kvp_lease *l = own_lease(s, q->free->lease_id, f);
	Kvpool__FreeResp *m;
	uint32_t n;
	int rc;

	(void)d;
	if (!l)
		return -(int)f->code;
	m = NEW(r, Kvpool__FreeResp, kvpool__free_resp__descriptor);
	if (!m)
		return oom(f);
	if (q->free->n_pages == 0) {
		n = l->n;
		s->leased_pages[l->pool->id] -= n;
		kvp_idmap_del(&s->leases, l->id);
		kvp_lease_destroy(l);
		m->lease_pages = 0;
	} else {
		if (q->free->n_pages > l->n)
			return kvp_fail(f, KVPOOL__CODE__NOT_FOUND,
					"free: %zu pages listed but lease %lu holds %u",
					q->free->n_pages, (unsigned long)l->id, l->n);
		n = (uint32_t)q->free->n_pages;
		if ((rc = kvp_lease_return(l, q->free->pages, n, f)) < 0)
			return rc;
		s->leased_pages[l->pool->id] -= n;
		m->lease_pages = l->n;
	}
	m->freed_pages = n;
	r->resp.result_case = KVPOOL__RESPONSE__RESULT_FREE;
	r->resp.free = m;
	return 0;
}

static int h_insert(struct kvp_daemon *d, struct kvp_session *s, const Kvpool__Request *q,
		    struct kvp_reply *r, struct kvp_fail *f)
{
	const Kvpool__InsertReq *a = q->insert;
	struct kvp_lease *l = own_lease(s, a->lease_id, f);
	Kvpool__InsertResp *m;
	uint32_t before;
	int rc;

	(void)d;
	if (!l)
		return -(int)f->code;
	if (a->n_tokens > UINT32_MAX / 2 || a->n_pages > l->n)
		return kvp_fail(f, KVPOOL__CODE__INVALID_ARGUMENT,
				"insert: %zu tokens in %zu pages do not fit lease %lu (%u pages)",
				a->n_tokens, a->n_pages, (unsigned long)l->id, l->n);
	m = NEW(r, Kvpool__InsertResp, kvpool__insert_resp__descriptor);
	if (!m)
		return oom(f);
	before = l->n;
	rc = kvp_lease_insert(l, a->namespace_, a->tokens, (uint32_t)a->n_tokens, a->cached_pages,
			      a->pages, (uint32_t)a->n_pages, &m->new_tokens, &m->dup_tokens, f);
	if (rc < 0)
		return rc;
	s->leased_pages[l->pool->id] -= before - l->n;
	m->lease_pages = l->n;
	r->resp.result_case = KVPOOL__RESPONSE__RESULT_INSERT;
	r->resp.insert = m;
	return 0;
}

static int h_match(struct kvp_daemon *d, struct kvp_session *s, const Kvpool__Request *q,
		   struct kvp_reply *r, struct kvp_fail *f)
{
	const Kvpool__MatchReq *a = q->match;
	struct kvp_pool *p = attached_pool(d, s, a->pool_id, f);
	struct kvp_match mt = { 0 };
	Kvpool__MatchResp *m;
	struct kvp_lock *k = NULL;
	uint32_t cap;

	if (!p)
		return -(int)f->code;
	if (a->n_tokens > UINT32_MAX / 2)
		return kvp_fail(f, KVPOOL__CODE__INVALID_ARGUMENT, "match: too many tokens");
	if (a->lock && s->locks.count >= d->conf.max_locks_per_session)
		return kvp_fail_limit(f, "locks", d->conf.max_locks_per_session);
	cap = (uint32_t)a->n_tokens / p->conf.page_tokens;
	m = NEW(r, Kvpool__MatchResp, kvpool__match_resp__descriptor);
	if (!m || !(m->device_pages = kvp_reply_alloc(r, sizeof(uint32_t) * cap)) ||
	    !(m->host_pages = kvp_reply_alloc(r, sizeof(uint32_t) * cap)) ||
	    (a->lock && !(k = KVP_FAULT_OR(KVP_FAULT_LOCK, calloc(1, sizeof(*k))))))
		return oom(f);
	p->st.matches++;
	if (kvp_prefix_match(p->pfx, a->namespace_, a->tokens, (uint32_t)a->n_tokens, a->lock, &mt,
			     m->device_pages, m->host_pages) < 0) {
		free(k);
		return oom(f);
	}
	m->n_device_pages = mt.dev_pages;
	m->n_host_pages = mt.host_pages;
	m->matched_tokens = (uint64_t)(mt.dev_pages + mt.host_pages) * p->conf.page_tokens;
	if (k && mt.lock) {
		k->id = ++d->next_lock_id;
		k->pool = p;
		k->node = mt.lock;
		k->pages = mt.dev_pages + mt.host_pages;
		if (kvp_idmap_put(&s->locks, k->id, k) < 0) {
			kvp_prefix_unlock(p->pfx, mt.lock);
			free(k);
			return oom(f);
		}
		s->locked_tokens += (uint64_t)k->pages * p->conf.page_tokens;
		m->lock_id = k->id;
	} else {
		free(k);
	}
	r->resp.result_case = KVPOOL__RESPONSE__RESULT_MATCH;
	r->resp.match = m;
	return 0;
}

static int h_release(struct kvp_daemon *d, struct kvp_session *s, const Kvpool__Request *q,
		     struct kvp_reply *r, struct kvp_fail *f)
{
	struct kvp_lock *k = kvp_idmap_del(&s->locks, q->release->lock_id);
	Kvpool__ReleaseResp *m;

	(void)d;
	if (!k)
		return kvp_fail(f, KVPOOL__CODE__NOT_FOUND, "lock %lu is not one of this session's",
				(unsigned long)q->release->lock_id);
	kvp_prefix_unlock(k->pool->pfx, k->node);
	s->locked_tokens -= (uint64_t)k->pages * k->pool->conf.page_tokens;
	free(k);
	m = NEW(r, Kvpool__ReleaseResp, kvpool__release_resp__descriptor);
	if (!m)
		return oom(f);
	r->resp.result_case = KVPOOL__RESPONSE__RESULT_RELEASE;
	r->resp.release = m;
	return 0;
}

static int h_load(struct kvp_daemon *d, struct kvp_session *s, const Kvpool__Request *q,
		  struct kvp_reply *r, struct kvp_fail *f)
{
	struct kvp_lock *k = kvp_idmap_get(&s->locks, q->load->lock_id);
	struct kvp_prefix_stats before, after;
	Kvpool__LoadResp *m;
	uint32_t n = 0;
	int rc;

	(void)d;
	if (!k)
		return kvp_fail(f, KVPOOL__CODE__NOT_FOUND, "lock %lu is not one of this session's",
				(unsigned long)q->load->lock_id);
	if (!kvp_pool_has_tier(k->pool, KVP_TIER_DEVICE))
		return kvp_fail(f, KVPOOL__CODE__INVALID_ARGUMENT, "pool %s has no device tier",
				k->pool->conf.name);
	m = NEW(r, Kvpool__LoadResp, kvpool__load_resp__descriptor);
	if (!m || !(m->device_pages = kvp_reply_alloc(r, sizeof(uint32_t) * (k->pages + 1))))
		return oom(f);
	k->pool->st.loads++;
	kvp_prefix_stats(k->pool->pfx, &before);
	rc = kvp_prefix_promote(k->pool->pfx, k->node, m->device_pages, k->pages, &n);
	if (rc == -ENOSPC) {
		kvp_pool_capacity_detail(k->pool, KVP_TIER_DEVICE, k->pages, f);
		return kvp_fail(f, KVPOOL__CODE__OUT_OF_CAPACITY,
				"load: pool %s device tier cannot hold the %lu tokens of lock %lu "
				"(%lu free, %lu evictable)",
				k->pool->conf.name, (unsigned long)f->cap.requested,
				(unsigned long)k->id, (unsigned long)f->cap.free,
				(unsigned long)f->cap.evictable);
	}
	if (rc == -EBUSY)
		return kvp_fail(f, KVPOOL__CODE__UNAVAILABLE,
				"load: another session's lock also pins host pages of lock %lu and may "
				"be reading them; read them in the host tier, or retry after it releases",
				(unsigned long)k->id);
	if (rc < 0)
		return kvp_fail(f, KVPOOL__CODE__INTERNAL, "load: promotion failed (%d)", rc);
	kvp_prefix_stats(k->pool->pfx, &after);
	m->n_device_pages = n;
	m->promoted_pages = (uint32_t)(after.promoted_pages - before.promoted_pages);
	r->resp.result_case = KVPOOL__RESPONSE__RESULT_LOAD;
	r->resp.load = m;
	return 0;
}

static int need_admin(const struct kvp_session *s, const char *what, struct kvp_fail *f)
{
	if (s->admin)
		return 0;
	return kvp_fail(f, KVPOOL__CODE__PERMISSION_DENIED,
			"%s is an admin call: root or a member of admin_groups only", what);
}

static int h_evict(struct kvp_daemon *d, struct kvp_session *s, const Kvpool__Request *q,
		   struct kvp_reply *r, struct kvp_fail *f)
{
	const Kvpool__EvictReq *a = q->evict;
	struct kvp_pool *p;
	Kvpool__EvictResp *m;
	uint64_t pages;
	int rc;

	if ((rc = need_admin(s, "Evict", f)) < 0)
		return rc;
	p = a->pool && a->pool[0] ? pool_by_name(d, a->pool)
				  : (a->pool_id < d->n_pools ? d->pools[a->pool_id] : NULL);
	if (!p)
		return no_such_pool(d, a->pool ? a->pool : "", f);
	if ((int)a->tier < 0 || (int)a->tier >= KVP_TIER_MAX || !kvp_pool_has_tier(p, (int)a->tier))
		return kvp_fail(f, KVPOOL__CODE__INVALID_ARGUMENT, "pool %s has no tier %d",
				p->conf.name, (int)a->tier);
	if (!a->tokens)
		return kvp_fail(f, KVPOOL__CODE__INVALID_ARGUMENT, "evict: zero tokens");
	pages = (a->tokens + p->conf.page_tokens - 1) / p->conf.page_tokens;
	if (pages > UINT32_MAX)
		pages = UINT32_MAX;
	m = NEW(r, Kvpool__EvictResp, kvpool__evict_resp__descriptor);
	if (!m)
		return oom(f);
	m->evicted_tokens = (uint64_t)kvp_pool_evict(p, (int)a->tier, (uint32_t)pages) *
			    p->conf.page_tokens;
	log_info("pool %s: admin evict of %lu tokens from the %s tier by session %lu: %lu evicted",
		 p->conf.name, (unsigned long)a->tokens, a->tier ? "host" : "device",
		 (unsigned long)s->id, (unsigned long)m->evicted_tokens);
	r->resp.result_case = KVPOOL__RESPONSE__RESULT_EVICT;
	r->resp.evict = m;
	return 0;
}

static int h_flush(struct kvp_daemon *d, struct kvp_session *s, const Kvpool__Request *q,
		   struct kvp_reply *r, struct kvp_fail *f)
{
	struct kvp_pool *p;
	Kvpool__FlushResp *m;
	int rc;

	if ((rc = need_admin(s, "Flush", f)) < 0)
		return rc;
	p = pool_by_name(d, q->flush->pool ? q->flush->pool : "");
	if (!p)
		return no_such_pool(d, q->flush->pool ? q->flush->pool : "", f);
	m = NEW(r, Kvpool__FlushResp, kvpool__flush_resp__descriptor);
	if (!m)
		return oom(f);
	m->evicted_tokens = (uint64_t)kvp_prefix_flush(p->pfx) * p->conf.page_tokens;
	log_info("pool %s: flushed by session %lu: %lu tokens evicted", p->conf.name,
		 (unsigned long)s->id, (unsigned long)m->evicted_tokens);
	r->resp.result_case = KVPOOL__RESPONSE__RESULT_FLUSH;
	r->resp.flush = m;
	return 0;
}

static int h_drain(struct kvp_daemon *d, struct kvp_session *s, const Kvpool__Request *q,
		   struct kvp_reply *r, struct kvp_fail *f)
{
	Kvpool__DrainResp *m;
	int rc;

	if ((rc = need_admin(s, "Drain", f)) < 0)
		return rc;
	m = NEW(r, Kvpool__DrainResp, kvpool__drain_resp__descriptor);
	if (!m)
		return oom(f);
	d->draining = true;
	d->drain_deadline_ms = kvp_now_ms() + q->drain->deadline_ms;
	m->sessions = d->n_sessions;
	log_notice("draining: no new leases; exiting when sessions end or in %u ms",
		   q->drain->deadline_ms);
	r->resp.result_case = KVPOOL__RESPONSE__RESULT_DRAIN;
	r->resp.drain = m;
	return 0;
}

static int h_reload(struct kvp_daemon *d, struct kvp_session *s, const Kvpool__Request *q,
		    struct kvp_reply *r, struct kvp_fail *f)
{
	Kvpool__ReloadResp *m;
	int rc;

	(void)q;
	if ((rc = need_admin(s, "Reload", f)) < 0)
		return rc;
	m = NEW(r, Kvpool__ReloadResp, kvpool__reload_resp__descriptor);
	if (!m)
		return oom(f);
	d->reload_requested = true;
	r->resp.result_case = KVPOOL__RESPONSE__RESULT_RELOAD;
	r->resp.reload = m;
	return 0;
}

static int h_sessions(struct kvp_daemon *d, struct kvp_session *s, const Kvpool__Request *q,
		      struct kvp_reply *r, struct kvp_fail *f)
{
	Kvpool__SessionsResp *m = NEW(r, Kvpool__SessionsResp, kvpool__sessions_resp__descriptor);
	uint64_t now = kvp_now_ms();
	size_t i = 0;

	(void)s;
	(void)q;
	if (!m || !(m->sessions = kvp_reply_alloc(r, sizeof(*m->sessions) * (d->n_sessions + 1))))
		return oom(f);
	for (struct kvp_session *x = d->sessions; x; x = x->next) {
		Kvpool__SessionInfo *e = NEW(r, Kvpool__SessionInfo, kvpool__session_info__descriptor);
		uint64_t leased = 0;

		if (!e)
			return oom(f);
		for (uint32_t p = 0; p < d->n_pools; p++)
			leased += x->leased_pages[p] * d->pools[p]->conf.page_tokens;
		e->session_id = x->id;
		e->pid = x->pid;
		e->uid = x->uid;
		e->gid = x->gid;
		e->name = x->name;
		e->leased_tokens = leased;
		e->locked_tokens = x->locked_tokens;
		e->leases = x->leases.count;
		e->locks = x->locks.count;
		e->age_ms = now - x->started_ms;
		e->idle_ms = now - x->last_ms;
		m->sessions[i++] = e;
	}
	m->n_sessions = i;
	r->resp.result_case = KVPOOL__RESPONSE__RESULT_SESSIONS;
	r->resp.sessions = m;
	return 0;
}

static int h_cache(struct kvp_daemon *d, struct kvp_session *s, const Kvpool__Request *q,
		   struct kvp_reply *r, struct kvp_fail *f)
{
	const char *name = q->cache->pool ? q->cache->pool : "";
	Kvpool__CacheResp *m = NEW(r, Kvpool__CacheResp, kvpool__cache_resp__descriptor);
	struct kvp_prefix_top top[16];
	uint32_t ntop;

	(void)s;
	if (!m || !(m->pools = kvp_reply_alloc(r, sizeof(*m->pools) * (d->n_pools + 1))))
		return oom(f);
	for (uint32_t i = 0; i < d->n_pools; i++) {
		if (name[0] && strcmp(name, d->pools[i]->conf.name))
			continue;
		if (!(m->pools[m->n_pools++] = pool_stats(r, d->pools[i])))
			return oom(f);
	}
	if (name[0] && !m->n_pools)
		return no_such_pool(d, name, f);
	if (m->n_pools) {
		struct kvp_pool *p = d->pools[m->pools[0]->pool_id];

		ntop = kvp_prefix_top(p->pfx, top, 16);
		if (!(m->top = kvp_reply_alloc(r, sizeof(*m->top) * (ntop + 1))))
			return oom(f);
		for (uint32_t i = 0; i < ntop; i++) {
			Kvpool__TopPrefix *t = NEW(r, Kvpool__TopPrefix, kvpool__top_prefix__descriptor);

			if (!t)
				return oom(f);
			t->tokens = top[i].tokens;
			t->hits = top[i].hits;
			t->namespace_ = top[i].ns;
			m->top[m->n_top++] = t;
		}
	}
	r->resp.result_case = KVPOOL__RESPONSE__RESULT_CACHE;
	r->resp.cache = m;
	return 0;
}

static int h_metrics(struct kvp_daemon *d, struct kvp_session *s, const Kvpool__Request *q,
		     struct kvp_reply *r, struct kvp_fail *f)
{
	Kvpool__MetricsResp *m = NEW(r, Kvpool__MetricsResp, kvpool__metrics_resp__descriptor);
	char *text;

	(void)s;
	(void)q;
	if (!m)
		return oom(f);
	text = kvp_metrics_render(d);
	if (!text)
		return oom(f);
	if (reply_adopt(r, text) < 0)
		return oom(f);
	m->text = text;
	r->resp.result_case = KVPOOL__RESPONSE__RESULT_METRICS;
	r->resp.metrics = m;
	return 0;
}

#define CALL(c) (KVPOOL__REQUEST__CALL_##c - KVPOOL__REQUEST__CALL_HELLO)
static const handler_fn handlers[] = {
	[CALL(HELLO)] = h_hello,       [CALL(PING)] = h_ping,	  [CALL(STATUS)] = h_status,
	[CALL(ATTACH)] = h_attach,     [CALL(DETACH)] = h_detach, [CALL(ALLOC)] = h_alloc,
	[CALL(EXTEND)] = h_extend,     [CALL(FREE)] = h_free,	  [CALL(INSERT)] = h_insert,
	[CALL(MATCH)] = h_match,       [CALL(RELEASE)] = h_release, [CALL(LOAD)] = h_load,
	[CALL(EVICT)] = h_evict,       [CALL(FLUSH)] = h_flush,	  [CALL(DRAIN)] = h_drain,
	[CALL(RELOAD)] = h_reload,     [CALL(SESSIONS)] = h_sessions, [CALL(CACHE)] = h_cache,
	[CALL(METRICS)] = h_metrics,
};

int kvp_dispatch(struct kvp_daemon *d, struct kvp_session *s, const Kvpool__Request *req,
		 struct kvp_reply *r)
{
	struct kvp_fail f;
	int idx = (int)req->call_case - KVPOOL__REQUEST__CALL_HELLO;
	handler_fn h = idx >= 0 && idx < (int)(sizeof(handlers) / sizeof(handlers[0]))
			       ? handlers[idx]
			       : NULL;
	int rc;

	kvp_fail_init(&f);
	if (!h) {
		rc = kvp_fail(&f, KVPOOL__CODE__INVALID_ARGUMENT, "unknown call %d",
			      (int)req->call_case);
	} else if (!s->hello && req->call_case != KVPOOL__REQUEST__CALL_HELLO) {
		rc = kvp_fail(&f, KVPOOL__CODE__PROTOCOL, "the first call must be Hello");
		r->close_after = true;
	} else {
		rc = h(d, s, req, r, &f);
	}
	if (rc < 0) {
		/* A failed handler's partial result is dropped: only the Status goes back. */
		r->resp.result_case = KVPOOL__RESPONSE__RESULT__NOT_SET;
		r->nfds = 0;
		kvp_reply_fail(r, &f);
		return (int)f.code;
	}
	return 0;
}
