/* libkvpool_pool.c - pools: attach (tiers mapped, the page reserve opened, pressure notices
 * asked), detach, and the figures the Attach reply gave. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "kvp_internal.h"

void kvp__pool_unmap(struct kvp_pool *p)
{
	kvp__resv_close(p->resv);
	p->resv = NULL;
	for (int t = 0; t < KVP_TIER_MAX; t++) {
		kvp_mapping_unref(p->tier[t].m);
		p->tier[t].m = NULL;
		p->tier[t].present = 0;
	}
}

KVP_EXPORT struct kvp_pool *kvp_pool_attach(struct kvp_client *c, const char *name,
					    const struct kvp_geometry *expected,
					    struct kvp_error *err)
{
	struct kvp_pool_opts o = { .struct_size = sizeof(o), .expected = expected };

	return kvp_pool_attach_opts(c, name, &o, err);
}

/* The reserve region of an Attach reply, when there is one. 0 or a negative code. */
static int attach_resv(struct kvp_pool *p, const Kvpool__AttachResp *a, int *fds, int nfds,
		       struct kvp_error *err)
{
	int fd;

	if (!a->reserve_bytes)
		return 0;
	if (a->reserve_fd_index < 0 || a->reserve_fd_index >= nfds ||
	    fds[a->reserve_fd_index] < 0 || a->n_reserve_pages > KVP_TIER_MAX)
		return kvp__fail(err, KVP_E_PROTOCOL, 0, "attach reply names a bad reserve fd");
	fd = fds[a->reserve_fd_index];
	fds[a->reserve_fd_index] = -1;
	return kvp__resv_open(p->c, p->id, fd, a->reserve_bytes, a->reserve_slots, a->reserve_pages,
			      a->n_reserve_pages, &p->resv, err);
}

KVP_EXPORT struct kvp_pool *kvp_pool_attach_opts(struct kvp_client *c, const char *name,
						 const struct kvp_pool_opts *opts,
						 struct kvp_error *err)
{
	CALL_SETUP(req, attach, ATTACH, Kvpool__AttachReq, KVPOOL__ATTACH_REQ__INIT);
	struct kvp_pool_opts o = { 0 };
	const struct kvp_geometry *expected;
	Kvpool__Geometry eg = KVPOOL__GEOMETRY__INIT;
	Kvpool__Response *resp;
	Kvpool__AttachResp *a;
	int fds[KVP_CLIENT_MAX_FDS], nfds = 0, r;
	struct kvp_pool *p;

	if (opts) {
		if (opts->struct_size < KVP_POOL_OPTS_SIZE_V03) {
			kvp__fail(err, KVP_E_INVALID_ARGUMENT, 0, "opts->struct_size is not set");
			return NULL;
		}
		kvp__struct_in(&o, opts, sizeof(o));
	}
	expected = o.expected;
	attach.reserve_device_pages = o.reserve_pages[KVP_TIER_DEVICE];
	attach.reserve_host_pages = o.reserve_pages[KVP_TIER_HOST];
	attach.pool = (char *)name;
	if (expected) {
		eg.layers = expected->layers;
		eg.kv_heads = expected->kv_heads;
		eg.head_dim = expected->head_dim;
		eg.dtype = (Kvpool__Dtype)expected->dtype;
		eg.page_tokens = expected->page_tokens;
		attach.expected = &eg;
	}
	attach.pressure_notices = (c->flags & KVP_CLIENT_F_PRESSURE) && (c->caps & KVP_CAP_EVENTS);
	if (kvp__rpc(c, &req, RESULT(ATTACH), &resp, fds, &nfds, err) < 0)
		return NULL;
	p = calloc(1, sizeof(*p));
	if (!p) {
		kvp__fail(err, KVP_E_NOMEM, ENOMEM, "out of memory");
		goto fail;
	}
	a = resp->attach;
	p->c = c;
	p->id = a->pool_id;
	snprintf(p->name, sizeof(p->name), "%s", a->pool ? a->pool : "");
	kvp__geom_from(&p->g, a->geometry);
	p->pressure = a->pressure_notices;
	for (size_t t = 0; t < a->n_pressure_watermark_tokens && t < KVP_TIER_MAX; t++)
		p->pressure_wm[t] = a->pressure_watermark_tokens[t];
	for (size_t i = 0; i < a->n_tiers; i++) {
		const Kvpool__TierInfo *ti = a->tiers[i];

		if ((int)ti->tier < 0 || (int)ti->tier >= KVP_TIER_MAX || ti->fd_index < 0 ||
		    ti->fd_index >= nfds || fds[ti->fd_index] < 0 || p->tier[ti->tier].present) {
			kvp__fail(err, KVP_E_PROTOCOL, 0, "attach reply names a bad tier or fd");
			goto fail;
		}
		p->cg.row_bytes = ti->row_bytes;
		p->page_bytes = ti->page_bytes;
		r = kvp__map_tier(p, ti, fds[ti->fd_index], err);
		fds[ti->fd_index] = -1; /* the mapping owns it, mapped or not */
		if (r < 0)
			goto fail;
	}
	if (attach_resv(p, a, fds, nfds, err) < 0)
		goto fail;
	p->cg.layers = p->g.layers;
	p->cg.page_tokens = p->g.page_tokens;
	p->cg.dev_slots =
		(uint64_t)(p->tier[KVP_TIER_DEVICE].present ? p->tier[KVP_TIER_DEVICE].pages : 1) *
		p->g.page_tokens;
	kvp__close_fds(fds, nfds);
	kvpool__response__free_unpacked(resp, NULL);
	p->next = c->pools;
	c->pools = p;
	return p;
fail:
	if (p)
		kvp__pool_unmap(p);
	kvp__close_fds(fds, nfds);
	free(p);
	kvpool__response__free_unpacked(resp, NULL);
	return NULL;
}

KVP_EXPORT int kvp_pool_detach(struct kvp_pool *p, struct kvp_error *err)
{
	CALL_SETUP(req, detach, DETACH, Kvpool__DetachReq, KVPOOL__DETACH_REQ__INIT);
	struct kvp_client *c;
	int r;

	if (!p)
		return 0;
	c = p->c;
	detach.pool_id = p->id;
	r = kvp__rpc_void(c, &req, RESULT(DETACH), err);
	for (struct kvp_pool **pp = &c->pools; *pp; pp = &(*pp)->next) {
		if (*pp == p) {
			*pp = p->next;
			break;
		}
	}
	kvp__pool_unmap(p);
	free(p);
	return r;
}

KVP_EXPORT uint32_t kvp_pool_id(const struct kvp_pool *p)
{
	return p->id;
}

KVP_EXPORT void kvp_pool_geometry(const struct kvp_pool *p, struct kvp_geometry *out)
{
	*out = p->g;
}

KVP_EXPORT int kvp_pool_pressure_notices(const struct kvp_pool *p)
{
	return p && p->pressure ? 1 : 0;
}

KVP_EXPORT uint64_t kvp_pool_pressure_watermark(const struct kvp_pool *p, int tier)
{
	return p && tier >= 0 && tier < KVP_TIER_MAX ? p->pressure_wm[tier] : 0;
}

struct kvp_resv *kvp__pool_resv(const struct kvp_pool *p)
{
	return p ? p->resv : NULL;
}

KVP_EXPORT uint32_t kvp_pool_reserve_pages(const struct kvp_pool *p, int tier)
{
	return p ? kvp__resv_granted(p->resv, tier) : 0;
}

struct kvp_client *kvp__pool_client(const struct kvp_pool *p)
{
	return p ? p->c : NULL;
}
