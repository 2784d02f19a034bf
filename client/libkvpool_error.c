/* libkvpool_error.c - names of codes, limits, tiers, backends and dtypes, and the typed error
 * (struct kvp_error) a failed call fills from the daemon's Status or from the library itself. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "kvp_internal.h"
#include "names.h"

_Static_assert((int)KVP_E_INTERNAL == (int)KVPOOL__CODE__INTERNAL, "codes follow the wire");
_Static_assert((int)KVP_E_RESTARTED == (int)KVPOOL__CODE__RESTARTED, "codes follow the wire");
_Static_assert((int)KVP_E_UNAVAILABLE == (int)KVPOOL__CODE__UNAVAILABLE, "codes follow the wire");
_Static_assert((int)KVP_DTYPE_FP32 == (int)KVPOOL__DTYPE__FP32, "dtypes follow the wire");
_Static_assert((int)KVP_BACKEND_MEMFD == (int)KVPOOL__BACKEND__MEMFD, "backends follow the wire");
_Static_assert((int)KVP_LIMIT_HUGEPAGES_FREE == (int)KVPOOL__LIMIT__HUGEPAGES_FREE,
	       "limits follow");
_Static_assert((int)KVP_TIER_HOST == (int)KVPOOL__TIER__HOST, "tiers follow the wire");

static const char *const g_code_names[] = {
	"OK",
	"OUT_OF_CAPACITY",
	"HOST_BUDGET_EXCEEDED",
	"QUOTA_EXCEEDED",
	"NO_SUCH_POOL",
	"GEOMETRY_MISMATCH",
	"NOT_FOUND",
	"INVALID_ARGUMENT",
	"PERMISSION_DENIED",
	"PROTOCOL",
	"VERSION",
	"SHUTTING_DOWN",
	"LIMIT_EXCEEDED",
	"UNAVAILABLE",
	"INTERNAL",
	"RESTARTED",
};
static const char *const g_local_names[] = { "NO_DAEMON", "TRANSPORT", "NOMEM", "MAP",
					     "BUFFER",	  "AGAIN",     "FORKED" };
_Static_assert(sizeof(g_code_names) / sizeof(g_code_names[0]) == KVP_E_RESTARTED + 1, "names");
_Static_assert(sizeof(g_local_names) / sizeof(g_local_names[0]) == KVP_CODE_MAX - KVP_E_NO_DAEMON,
	       "local names");

KVP_EXPORT const char *kvp_code_name(int code)
{
	if (code == INT32_MIN)
		return "UNKNOWN";
	if (code < 0)
		code = -code;
	if (code <= KVP_E_RESTARTED)
		return g_code_names[code];
	if (code >= KVP_E_NO_DAEMON && code < KVP_CODE_MAX)
		return g_local_names[code - KVP_E_NO_DAEMON];
	return "UNKNOWN";
}

KVP_EXPORT const char *kvp_limit_name(int limit)
{
	static const char *const n[] = {
		"none",		  "MemAvailable",   "NUMA node free memory", "cgroup memory.max",
		"RLIMIT_MEMLOCK", "free huge pages"
	};

	return limit >= 0 && limit < KVP_LIMIT_MAX ? n[limit] : "?";
}

KVP_EXPORT const char *kvp_tier_name(int tier)
{
	return kvp_names_tier(tier);
}

KVP_EXPORT const char *kvp_backend_name(int backend)
{
	return kvp_names_backend(backend);
}

KVP_EXPORT const char *kvp_dtype_name(int dtype)
{
	return kvp_names_dtype(dtype);
}

int kvp__fail(struct kvp_error *err, int code, int sys_errno, const char *fmt, ...)
{
	va_list ap;

	if (err) {
		memset(err, 0, sizeof(*err));
		err->code = code;
		err->sys_errno = sys_errno;
		va_start(ap, fmt);
		vsnprintf(err->message, sizeof(err->message), fmt, ap);
		va_end(ap);
	}
	return -code;
}

void kvp__geom_from(struct kvp_geometry *g, const Kvpool__Geometry *m)
{
	memset(g, 0, sizeof(*g));
	if (!m)
		return;
	g->layers = m->layers;
	g->kv_heads = m->kv_heads;
	g->head_dim = m->head_dim;
	g->dtype = (uint32_t)m->dtype;
	g->page_tokens = m->page_tokens;
}

int kvp__status_code(const Kvpool__Status *st)
{
	/* A code a newer daemon added passes through; one outside the daemon's range (negative,
	 * or into the library's) cannot be told from ours and says the reply is broken. */
	int code = (int)st->code;

	return code > 0 && code < KVP_E_NO_DAEMON ? code : KVP_E_PROTOCOL;
}

int kvp__status_to_error(const Kvpool__Status *st, struct kvp_error *err)
{
	int code = kvp__status_code(st);

	if (!err)
		return -code;
	memset(err, 0, sizeof(*err));
	err->code = code;
	if (code == KVP_E_PROTOCOL && (int)st->code != KVP_E_PROTOCOL) {
		snprintf(err->message, sizeof(err->message), "kvpoold sent unknown code %lld: %s",
			 (long long)st->code, st->message ? st->message : "");
		return -code;
	}
	snprintf(err->message, sizeof(err->message), "%s", st->message ? st->message : "");
	switch (st->detail_case) {
	case KVPOOL__STATUS__DETAIL_CAPACITY:
		err->detail = KVP_DETAIL_CAPACITY;
		err->capacity.tier = (uint32_t)st->capacity->tier;
		err->capacity.requested_tokens = st->capacity->requested_tokens;
		err->capacity.free_tokens = st->capacity->free_tokens;
		err->capacity.evictable_tokens = st->capacity->evictable_tokens;
		err->capacity.protected_tokens = st->capacity->protected_tokens;
		err->capacity.leased_tokens = st->capacity->leased_tokens;
		err->capacity.total_tokens = st->capacity->total_tokens;
		err->capacity_reserved_tokens = st->capacity->reserved_tokens;
		break;
	case KVPOOL__STATUS__DETAIL_BUDGET:
		err->detail = KVP_DETAIL_BUDGET;
		err->budget.requested_bytes = st->budget->requested_bytes;
		err->budget.available_bytes = st->budget->available_bytes;
		err->budget.limit = (uint32_t)st->budget->limit;
		err->budget.numa_node = st->budget->numa_node;
		snprintf(err->budget.pool, sizeof(err->budget.pool), "%s",
			 st->budget->pool ? st->budget->pool : "");
		break;
	case KVPOOL__STATUS__DETAIL_QUOTA:
		err->detail = KVP_DETAIL_QUOTA;
		err->quota.quota_tokens = st->quota->quota_tokens;
		err->quota.held_tokens = st->quota->held_tokens;
		err->quota.requested_tokens = st->quota->requested_tokens;
		break;
	case KVPOOL__STATUS__DETAIL_GEOMETRY:
		err->detail = KVP_DETAIL_GEOMETRY;
		kvp__geom_from(&err->geometry.expected, st->geometry->expected);
		kvp__geom_from(&err->geometry.actual, st->geometry->actual);
		break;
	case KVPOOL__STATUS__DETAIL_LIMIT:
		err->detail = KVP_DETAIL_LIMIT;
		snprintf(err->limit.what, sizeof(err->limit.what), "%s",
			 st->limit->what ? st->limit->what : "");
		err->limit.limit = st->limit->limit;
		break;
	default: break;
	}
	return -code;
}
