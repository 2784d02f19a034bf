/* rpc_reserve.c - the Reserve call: kvpoold reads the session's reserve rings, binds the pages
 * the client leased locally under its local lease ids, and refills (reserve.c does the work). */
#include "rpc.h"

#include <stdlib.h>

#include "reserve.h"

#define RESERVE_MAX_BINDS 4096

KVP_RPC_HANDLER(kvp_rpc_reserve)
{
	const Kvpool__ReserveReq *a = q->reserve;
	struct kvpd_pool *p = kvp_session_pool(d, s, a->pool_id, f);
	struct kvp_reserve_bind *b = NULL;
	struct kvp_reserve *rv;
	Kvpool__ReserveResp *m;
	int rc;

	if (!p)
		return -(int)f->code;
	if (!(rv = s->reserve[p->id]))
		return kvp_fail(f, KVP_ERR_NOT_FOUND,
				"no reserve in pool %s: ask for one at Attach", p->conf.name);
	if (a->n_binds > RESERVE_MAX_BINDS)
		return kvp_fail_limit(f, "binds in one Reserve call", RESERVE_MAX_BINDS);
	m = KVP_REPLY_NEW(r, Kvpool__ReserveResp, kvpool__reserve_resp__descriptor);
	if (!m || !(m->reserve_pages = kvp_reply_alloc(r, sizeof(uint32_t) * KVP_TIER_ID_MAX)))
		return kvp_rpc_oom(f);
	if (a->n_binds && !(b = calloc(a->n_binds, sizeof(*b))))
		return kvp_rpc_oom(f);
	for (size_t i = 0; i < a->n_binds; i++) {
		const Kvpool__ReserveBind *x = a->binds[i];

		if (x->n_pages > UINT32_MAX / 2) {
			free(b);
			return kvp_fail(f, KVP_ERR_INVALID_ARGUMENT, "bind of %zu pages",
					x->n_pages);
		}
		b[i] = (struct kvp_reserve_bind){ x->lease_id, (int)x->tier, x->pages,
						  (uint32_t)x->n_pages };
	}
	rc = kvp_reserve_call(d, s, rv, a->seq, b, (uint32_t)a->n_binds, f);
	free(b);
	if (rc < 0)
		return rc;
	m->n_reserve_pages = KVP_TIER_ID_MAX;
	for (int t = 0; t < KVP_TIER_ID_MAX; t++)
		m->reserve_pages[t] = kvp_reserve_pages(rv, t);
	m->bound = (uint32_t)rc;
	r->resp.result_case = KVPOOL__RESPONSE__RESULT_RESERVE;
	r->resp.reserve = m;
	return 0;
}
