/* rpc_session.c - the session's own calls: Hello, Ping, Attach, Detach. */
#include "rpc.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvp_config.h"
#include "kvpool_caps.h"
#include "log.h"

KVP_RPC_HANDLER(kvp_rpc_hello)
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
	m = KVP_REPLY_NEW(r, Kvpool__HelloResp, kvpool__hello_resp__descriptor);
	if (!m)
		return kvp_rpc_oom(f);
	snprintf(s->name, sizeof(s->name), "%s",
		 q->hello->client_name ? q->hello->client_name : "");
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

KVP_RPC_HANDLER(kvp_rpc_ping)
{
	Kvpool__PingResp *m = KVP_REPLY_NEW(r, Kvpool__PingResp, kvpool__ping_resp__descriptor);

	(void)d;
	(void)s;
	if (!m)
		return kvp_rpc_oom(f);
	m->nonce = q->ping->nonce;
	r->resp.result_case = KVPOOL__RESPONSE__RESULT_PING;
	r->resp.ping = m;
	return 0;
}

static bool geom_matches(const Kvpool__Geometry *e, const struct kvp_geom *a)
{
	return (!e->layers || e->layers == a->layers) &&
	       (!e->kv_heads || e->kv_heads == a->kv_heads) &&
	       (!e->head_dim || e->head_dim == a->head_dim) &&
	       (!e->dtype || (uint32_t)e->dtype == a->dtype) &&
	       (!e->page_tokens || e->page_tokens == a->page_tokens);
}

KVP_RPC_HANDLER(kvp_rpc_attach)
{
	const Kvpool__AttachReq *a = q->attach;
	struct kvp_pool *p = kvp_rpc_pool_by_name(d, a->pool ? a->pool : "");
	Kvpool__AttachResp *m;
	struct kvp_geom g;

	if (!p)
		return kvp_rpc_no_such_pool(d, a->pool ? a->pool : "", f);
	if (d->draining)
		return kvp_fail(f, KVPOOL__CODE__SHUTTING_DOWN, "kvpoold is draining");
	kvp_rpc_pool_geom(p, &g);
	if (a->expected && !geom_matches(a->expected, &g)) {
		f->detail = KVP_FAIL_GEOMETRY;
		f->geom.expected = (struct kvp_geom){
		    a->expected->layers, a->expected->kv_heads, a->expected->head_dim,
		    (uint32_t)a->expected->dtype, a->expected->page_tokens};
		f->geom.actual = g;
		return kvp_fail(
		    f, KVPOOL__CODE__GEOMETRY_MISMATCH,
		    "pool %s is layers %u kv_heads %u head_dim %u dtype %s page_tokens "
		    "%u; the client expects layers %u kv_heads %u head_dim %u page_tokens %u",
		    p->conf.name, g.layers, g.kv_heads, g.head_dim, kvp_conf_dtype_name(p->conf.dtype),
		    g.page_tokens, a->expected->layers, a->expected->kv_heads,
		    a->expected->head_dim, a->expected->page_tokens);
	}
	m = KVP_REPLY_NEW(r, Kvpool__AttachResp, kvpool__attach_resp__descriptor);
	if (!m || !(m->tiers = kvp_reply_alloc(r, sizeof(*m->tiers) * KVP_TIER_MAX)) ||
	    !(m->geometry = kvp_reply_geometry(r, &g)))
		return kvp_rpc_oom(f);
	m->pool_id = p->id;
	m->pool = p->conf.name;
	m->session_quota_tokens = p->conf.session_quota_tokens;
	for (int t = 0; t < KVP_TIER_MAX; t++) {
		Kvpool__TierInfo *ti;
		int fdi;

		if (!kvp_pool_has_tier(p, t))
			continue;
		ti = KVP_REPLY_NEW(r, Kvpool__TierInfo, kvpool__tier_info__descriptor);
		if (!ti)
			return kvp_rpc_oom(f);
		ti->tier = (Kvpool__Tier)t;
		ti->backend = (Kvpool__Backend)p->mem[t].backend;
		ti->pages = kvp_pages_total(p->pages[t]);
		ti->bytes = p->mem[t].bytes;
		if ((fdi = kvp_reply_add_fd(r, p->mem[t].fd)) < 0)
			return kvp_fail(f, KVPOOL__CODE__INTERNAL, "attach: too many descriptors");
		ti->fd_index = fdi;
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
	kvp_session_attach(s, p);
	r->resp.result_case = KVPOOL__RESPONSE__RESULT_ATTACH;
	r->resp.attach = m;
	return 0;
}

KVP_RPC_HANDLER(kvp_rpc_detach)
{
	struct kvp_pool *p = kvp_session_pool(d, s, q->detach->pool_id, f);
	Kvpool__DetachResp *m;

	if (!p)
		return -(int)f->code;
	m = KVP_REPLY_NEW(r, Kvpool__DetachResp, kvpool__detach_resp__descriptor);
	if (!m)
		return kvp_rpc_oom(f);
	m->freed_tokens = kvp_session_detach(d, s, p);
	r->resp.result_case = KVPOOL__RESPONSE__RESULT_DETACH;
	r->resp.detach = m;
	return 0;
}
