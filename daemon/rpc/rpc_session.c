/* rpc_session.c - the session's own calls: Hello, Ping, Attach, Detach. */
#include "rpc.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "kvp_config.h"
#include "kvpool_caps.h"
#include "log.h"
#include "reserve.h"
#include "snapshot.h"

/* Length of the UTF-8 sequence at s (n bytes left) when it is valid and not a control character
 * (C0, DEL, C1); 0 otherwise. */
static size_t printable_utf8(const unsigned char *s, size_t n)
{
	uint32_t cp;
	size_t len;

	if (s[0] < 0x80)
		return s[0] >= 0x20 && s[0] != 0x7f;
	if (s[0] >= 0xc2 && s[0] <= 0xdf)
		len = 2, cp = s[0] & 0x1f;
	else if (s[0] >= 0xe0 && s[0] <= 0xef)
		len = 3, cp = s[0] & 0x0f;
	else if (s[0] >= 0xf0 && s[0] <= 0xf4)
		len = 4, cp = s[0] & 0x07;
	else
		return 0;
	if (len > n)
		return 0;
	for (size_t i = 1; i < len; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		cp = cp << 6 | (s[i] & 0x3f);
	}
	if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
	    (cp >= 0xd800 && cp <= 0xdfff) || (cp >= 0x80 && cp < 0xa0))
		return 0;
	return len;
}

/* The client's name as kvpoold keeps, logs and lists it: valid UTF-8 cut on a character
 * boundary to fit cap - 1 bytes, each control character or invalid byte written as \xNN. */
static void clean_name(char *dst, size_t cap, const char *src)
{
	const unsigned char *p = (const unsigned char *)src;
	size_t n = strlen(src), o = 0;

	while (n) {
		size_t len = printable_utf8(p, n);

		if (len) {
			if (o + len >= cap)
				break;
			memcpy(dst + o, p, len);
		} else {
			len = 1;
			if (o + 4 >= cap)
				break;
			snprintf(dst + o, cap - o, "\\x%02x", p[0]);
			o += 4;
			p++, n--;
			continue;
		}
		o += len;
		p += len;
		n -= len;
	}
	dst[o] = '\0';
}

KVP_RPC_HANDLER(kvp_rpc_hello)
{
	Kvpool__HelloResp *m;

	/* Any protocol from 1 on, as long as the client requires no capability this daemon
	 * lacks; the answer is the offer's intersection with what the daemon supports. */
	if (q->hello->protocol_version < 1 ||
	    (q->hello->required_capabilities & ~(uint64_t)KVP_CAPS_DAEMON)) {
		r->close_after = true;
		return kvp_fail(
			f, KVP_ERR_VERSION,
			"client speaks protocol %u requiring capabilities 0x%llx; kvpoold %s "
			"speaks %u with 0x%llx",
			q->hello->protocol_version,
			(unsigned long long)q->hello->required_capabilities, KVP_VERSION,
			KVP_PROTO_VERSION, (unsigned long long)KVP_CAPS_DAEMON);
	}
	if (s->hello)
		return kvp_fail(f, KVP_ERR_PROTOCOL, "Hello was already said");
	/* A drain takes no new sessions but admins', who may watch it and cancel it. */
	if (d->draining && !s->admin) {
		r->close_after = true;
		d->st.connections_refused++;
		log_info("refused connection of pid %d uid %u: kvpoold is draining", (int)s->pid,
			 (unsigned)s->uid);
		return kvp_fail(f, KVP_ERR_SHUTTING_DOWN, "kvpoold is draining: no new sessions");
	}
	m = KVP_REPLY_NEW(r, Kvpool__HelloResp, kvpool__hello_resp__descriptor);
	if (!m)
		return kvp_rpc_oom(f);
	clean_name(s->name, sizeof(s->name), q->hello->client_name ? q->hello->client_name : "");
	m->resumed = kvp_snap_hello(d, s, q->hello->resume_token.data, q->hello->resume_token.len);
	m->resume_token.data = s->resume_token;
	m->resume_token.len = sizeof(s->resume_token);
	m->resume_grace_ms = d->conf.resume_grace_ms;
	{
		static uint64_t instance;

		while (!instance && getrandom(&instance, sizeof(instance), 0) < 0)
			;
		m->instance = instance;
	}
	s->hello = true;
	d->st.sessions_opened++;
	m->session_id = s->id;
	m->daemon_version = (char *)KVP_VERSION;
	m->protocol_version = KVP_PROTO_VERSION;
	m->keepalive_ms = d->conf.keepalive_ms;
	m->capabilities = q->hello->capabilities & KVP_CAPS_DAEMON;
	s->caps = m->capabilities;
	r->resp.result_case = KVPOOL__RESPONSE__RESULT_HELLO;
	r->resp.hello = m;
	log_info("session %lu: hello from '%s' pid %d uid %u%s%s", (unsigned long)s->id, s->name,
		 (int)s->pid, (unsigned)s->uid, s->admin ? " (admin)" : "",
		 m->resumed ? ", resumed" : "");
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

/* The wire Dtype (FP16 = 1, 0 = unset) by its config name. */
static const char *wire_dtype_name(int dtype)
{
	if (dtype == 0)
		return "none";
	return dtype > 0 && dtype <= KVP_CONF_DTYPE_MAX
		       ? kvp_conf_dtype_name((enum kvp_conf_dtype)(dtype - 1))
		       : "unknown";
}

static bool geom_matches(const Kvpool__Geometry *e, const struct kvp_geom *a)
{
	return (!e->layers || e->layers == a->layers) &&
	       (!e->kv_heads || e->kv_heads == a->kv_heads) &&
	       (!e->head_dim || e->head_dim == a->head_dim) &&
	       (!e->dtype || (uint32_t)e->dtype == a->dtype) &&
	       (!e->page_tokens || e->page_tokens == a->page_tokens);
}

/* The page reserve the Attach asks for, its region's fd and figures in m. 0 or a negative
 * Code with f (the reserve is ended then). */
static int attach_reserve(struct kvp_daemon *d, struct kvp_session *s, struct kvpd_pool *p,
			  const Kvpool__AttachReq *a, struct kvp_reply *r, Kvpool__AttachResp *m,
			  struct kvp_fail *f)
{
	uint32_t want[KVP_TIER_ID_MAX] = { a->reserve_device_pages, a->reserve_host_pages };
	struct kvp_reserve *rv;
	int rc, fdi;

	/* One reserve per session and pool: an Attach of a pool the session holds attached
	 * already gets none (the first handle keeps its own; Detach ends it). */
	if ((!want[0] && !want[1]) || s->attached[p->id])
		return 0;
	if ((rc = kvp_reserve_open(d, s, p, want, &rv, f)) < 0)
		return rc;
	if (!rv)
		return 0;
	if (!(m->reserve_pages = kvp_reply_alloc(r, sizeof(uint32_t) * KVP_TIER_ID_MAX)) ||
	    (fdi = kvp_reply_add_fd(r, kvp_reserve_fd(rv))) < 0) {
		kvp_reserve_end(s, p);
		return kvp_fail(f, KVP_ERR_INTERNAL, "attach: no room for the reserve");
	}
	m->n_reserve_pages = KVP_TIER_ID_MAX;
	for (int t = 0; t < KVP_TIER_ID_MAX; t++)
		m->reserve_pages[t] = kvp_reserve_granted(rv, t);
	m->reserve_fd_index = fdi;
	m->reserve_bytes = kvp_reserve_bytes(rv);
	m->reserve_slots = kvp_reserve_slots(rv);
	return 0;
}

KVP_RPC_HANDLER(kvp_rpc_attach)
{
	const Kvpool__AttachReq *a = q->attach;
	struct kvpd_pool *p = kvp_rpc_pool_by_name(d, a->pool ? a->pool : "");
	Kvpool__AttachResp *m;
	struct kvp_geom g;

	int rc;

	if (!p)
		return kvp_rpc_no_such_pool(d, a->pool ? a->pool : "", f);
	if (d->draining)
		return kvp_fail(f, KVP_ERR_SHUTTING_DOWN, "kvpoold is draining");
	if ((rc = kvp_session_may_attach(d, s, p, f)) < 0)
		return rc;
	kvp_rpc_pool_geom(p, &g);
	if (a->expected && !geom_matches(a->expected, &g)) {
		f->detail = KVP_FAIL_GEOMETRY;
		f->geom.expected =
			(struct kvp_geom){ a->expected->layers, a->expected->kv_heads,
					   a->expected->head_dim, (uint32_t)a->expected->dtype,
					   a->expected->page_tokens };
		f->geom.actual = g;
		return kvp_fail(
			f, KVP_ERR_GEOMETRY_MISMATCH,
			"pool %s is layers %u kv_heads %u head_dim %u dtype %s page_tokens "
			"%u; the client expects layers %u kv_heads %u head_dim %u dtype %s page_tokens "
			"%u (0 or none: any)",
			p->conf.name, g.layers, g.kv_heads, g.head_dim,
			kvp_conf_dtype_name(p->conf.dtype), g.page_tokens, a->expected->layers,
			a->expected->kv_heads, a->expected->head_dim,
			wire_dtype_name(a->expected->dtype), a->expected->page_tokens);
	}
	m = KVP_REPLY_NEW(r, Kvpool__AttachResp, kvpool__attach_resp__descriptor);
	if (!m || !(m->tiers = kvp_reply_alloc(r, sizeof(*m->tiers) * KVP_TIER_ID_MAX)) ||
	    !(m->geometry = kvp_reply_geometry(r, &g)))
		return kvp_rpc_oom(f);
	m->pool_id = p->id;
	m->pool = p->conf.name;
	m->session_quota_tokens = p->conf.session_quota_tokens;
	for (int t = 0; t < KVP_TIER_ID_MAX; t++) {
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
			return kvp_fail(f, KVP_ERR_INTERNAL, "attach: too many descriptors");
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
	m->pressure_watermark_tokens = kvp_reply_alloc(r, sizeof(uint64_t) * KVP_TIER_ID_MAX);
	if (!m->pressure_watermark_tokens)
		return kvp_rpc_oom(f);
	for (int t = 0; t < KVP_TIER_ID_MAX; t++)
		m->pressure_watermark_tokens[t] =
			kvp_pressure_watermark(p, t) * p->conf.page_tokens;
	m->n_pressure_watermark_tokens = KVP_TIER_ID_MAX;
	m->pressure_interval_ms = p->conf.pressure_interval_ms;
	if ((rc = attach_reserve(d, s, p, a, r, m, f)) < 0)
		return rc;
	kvp_session_attach(s, p);
	m->pressure_notices = kvp_pressure_attach(d, s, p, a->pressure_notices);
	r->resp.result_case = KVPOOL__RESPONSE__RESULT_ATTACH;
	r->resp.attach = m;
	return 0;
}

KVP_RPC_HANDLER(kvp_rpc_detach)
{
	struct kvpd_pool *p = kvp_session_pool(d, s, q->detach->pool_id, f);
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
