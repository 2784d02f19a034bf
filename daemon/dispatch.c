/* dispatch.c - one handler per call, chosen from a table indexed by the Request's oneof case
 * (the handlers live in rpc_*.c, by area). Handlers validate everything before they change
 * anything, so a refused call leaves no trace. */
#include "dispatch.h"

#include <stdio.h>
#include <string.h>

#include "rpc.h"

int kvp_rpc_oom(struct kvp_fail *f)
{
	return kvp_fail(f, KVPOOL__CODE__INTERNAL, "kvpoold is out of memory");
}

void kvp_rpc_pool_geom(const struct kvp_pool *p, struct kvp_geom *g)
{
	g->layers = p->conf.layers;
	g->kv_heads = p->conf.kv_heads;
	g->head_dim = p->conf.head_dim;
	g->dtype = (uint32_t)p->conf.dtype + 1; /* wire Dtype counts from FP16 = 1 */
	g->page_tokens = p->conf.page_tokens;
}

struct kvp_pool *kvp_rpc_pool_by_name(struct kvp_daemon *d, const char *name)
{
	for (uint32_t i = 0; i < d->n_pools; i++)
		if (strcmp(d->pools[i]->conf.name, name) == 0)
			return d->pools[i];
	return NULL;
}

int kvp_rpc_no_such_pool(const struct kvp_daemon *d, const char *name, struct kvp_fail *f)
{
	char names[256] = "";
	size_t n = 0;

	for (uint32_t i = 0; i < d->n_pools && n < sizeof(names) - 1; i++)
		n += (size_t)snprintf(names + n, sizeof(names) - n, "%s%s", i ? ", " : "",
				      d->pools[i]->conf.name);
	return kvp_fail(f, KVPOOL__CODE__NO_SUCH_POOL, "no pool '%.64s' (pools: %s)", name,
			d->n_pools ? names : "none");
}

#define CALL(c) (KVPOOL__REQUEST__CALL_##c - KVPOOL__REQUEST__CALL_HELLO)
static const kvp_rpc_handler handlers[] = {
    [CALL(HELLO)] = kvp_rpc_hello,	 [CALL(PING)] = kvp_rpc_ping,
    [CALL(STATUS)] = kvp_rpc_status,	 [CALL(ATTACH)] = kvp_rpc_attach,
    [CALL(DETACH)] = kvp_rpc_detach,	 [CALL(ALLOC)] = kvp_rpc_alloc,
    [CALL(EXTEND)] = kvp_rpc_extend,	 [CALL(FREE)] = kvp_rpc_free,
    [CALL(INSERT)] = kvp_rpc_insert,	 [CALL(MATCH)] = kvp_rpc_match,
    [CALL(RELEASE)] = kvp_rpc_release,	 [CALL(LOAD)] = kvp_rpc_load,
    [CALL(EVICT)] = kvp_rpc_evict,	 [CALL(FLUSH)] = kvp_rpc_flush,
    [CALL(DRAIN)] = kvp_rpc_drain,	 [CALL(RELOAD)] = kvp_rpc_reload,
    [CALL(SESSIONS)] = kvp_rpc_sessions, [CALL(CACHE)] = kvp_rpc_cache,
    [CALL(METRICS)] = kvp_rpc_metrics,
};

int kvp_dispatch(struct kvp_daemon *d, struct kvp_session *s, const Kvpool__Request *req,
		 struct kvp_reply *r)
{
	struct kvp_fail f;
	int idx = (int)req->call_case - KVPOOL__REQUEST__CALL_HELLO;
	kvp_rpc_handler h =
	    idx >= 0 && idx < (int)(sizeof(handlers) / sizeof(handlers[0])) ? handlers[idx] : NULL;
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
	if (rc == KVP_DEFERRED)
		return rc; /* answered later through its ticket (defer.h) */
	if (rc < 0) {
		/* A failed handler's partial result is dropped: only the Status goes back. */
		r->resp.result_case = KVPOOL__RESPONSE__RESULT__NOT_SET;
		r->nfds = 0;
		kvp_reply_fail(r, &f);
		return (int)f.code;
	}
	return 0;
}
