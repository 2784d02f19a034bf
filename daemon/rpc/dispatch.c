/* dispatch.c - one handler per call, chosen from a table indexed by the Request's oneof case
 * (the handlers live in rpc_*.c, by area). Handlers validate everything before they change
 * anything, so a refused call leaves no trace. */
#include "dispatch.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "frame.h"
#include "rpc.h"

int kvp_rpc_oom(struct kvp_fail *f)
{
	return kvp_fail(f, KVP_ERR_INTERNAL, "kvpoold is out of memory");
}

void kvp_rpc_pool_geom(const struct kvpd_pool *p, struct kvp_geom *g)
{
	g->layers = p->conf.layers;
	g->kv_heads = p->conf.kv_heads;
	g->head_dim = p->conf.head_dim;
	g->dtype = (uint32_t)p->conf.dtype + 1; /* wire Dtype counts from FP16 = 1 */
	g->page_tokens = p->conf.page_tokens;
}

struct kvpd_pool *kvp_rpc_pool_by_name(struct kvp_daemon *d, const char *name)
{
	for (uint32_t i = 0; i < d->n_pools; i++)
		if (strcmp(d->pools[i]->conf.name, name) == 0)
			return d->pools[i];
	return NULL;
}

uint32_t kvp_rpc_pages_per_reply(const struct kvpd_pool *p)
{
	uint32_t top = 0, bytes = 1;

	for (int t = 0; t < KVP_TIER_ID_MAX; t++)
		if (p->pages[t] && kvp_pages_total(p->pages[t]) > top)
			top = kvp_pages_total(p->pages[t]);
	for (uint32_t v = top ? top - 1 : 0; v >= 0x80; v >>= 7)
		bytes++;
	/* Room for the envelope, the status and the reply's other fields. */
	return (KVP_FRAME_MAX - 4096) / bytes;
}

int kvp_rpc_reply_too_large(const struct kvpd_pool *p, const char *what, uint64_t npages,
			    struct kvp_fail *f)
{
	uint32_t max = kvp_rpc_pages_per_reply(p);

	kvp_fail_limit(f, "pages per reply", max);
	return kvp_fail(f, KVP_ERR_LIMIT_EXCEEDED,
			"%s: %lu pages of pool %s do not fit in one reply frame (at most %u); ask "
			"in smaller steps",
			what, (unsigned long)npages, p->conf.name, max);
}

int kvp_rpc_no_such_pool(const struct kvp_daemon *d, const char *name, struct kvp_fail *f)
{
	char names[256] = "";
	size_t n = 0;

	for (uint32_t i = 0; i < d->n_pools && n < sizeof(names) - 1; i++)
		n += (size_t)snprintf(names + n, sizeof(names) - n, "%s%s", i ? ", " : "",
				      d->pools[i]->conf.name);
	return kvp_fail(f, KVP_ERR_NO_SUCH_POOL, "no pool '%.64s' (pools: %s)", name,
			d->n_pools ? names : "none");
}

#define CALL(c) (KVPOOL__REQUEST__CALL_##c - KVPOOL__REQUEST__CALL_HELLO)
static const kvp_rpc_handler handlers[] = {
	[CALL(HELLO)] = kvp_rpc_hello,		 [CALL(PING)] = kvp_rpc_ping,
	[CALL(STATUS)] = kvp_rpc_status,	 [CALL(ATTACH)] = kvp_rpc_attach,
	[CALL(DETACH)] = kvp_rpc_detach,	 [CALL(ALLOC)] = kvp_rpc_alloc,
	[CALL(EXTEND)] = kvp_rpc_extend,	 [CALL(FREE)] = kvp_rpc_free,
	[CALL(INSERT)] = kvp_rpc_insert,	 [CALL(MATCH)] = kvp_rpc_match,
	[CALL(RELEASE)] = kvp_rpc_release,	 [CALL(LOAD)] = kvp_rpc_load,
	[CALL(EVICT)] = kvp_rpc_evict,		 [CALL(FLUSH)] = kvp_rpc_flush,
	[CALL(DRAIN)] = kvp_rpc_drain,		 [CALL(RELOAD)] = kvp_rpc_reload,
	[CALL(SESSIONS)] = kvp_rpc_sessions,	 [CALL(CACHE)] = kvp_rpc_cache,
	[CALL(METRICS)] = kvp_rpc_metrics,	 [CALL(INSERT_KEYS)] = kvp_rpc_insert_keys,
	[CALL(MATCH_KEYS)] = kvp_rpc_match_keys, [CALL(EXISTS_KEYS)] = kvp_rpc_exists_keys,
	[CALL(RESERVE)] = kvp_rpc_reserve,	 [CALL(FETCH)] = kvp_rpc_fetch,
};

/* The calls that carry keys, named as their handlers name them in a refusal. */
static const char *const key_calls[] = {
	[CALL(INSERT_KEYS)] = "insert keys",
	[CALL(MATCH_KEYS)] = "match keys",
	[CALL(EXISTS_KEYS)] = "exists keys",
	[CALL(FETCH)] = "fetch keys",
};

/* A call whose message the decoder left unpacked for holding more than KVP_FRAME_FIELDS_MAX
 * fields (frame.h): a key call is refused as its handler refuses too many keys (the limit is
 * max_keys_per_call, at most KVP_FRAME_KEYS_MAX), any other with the decoder's bound. */
static int refuse_crowded(const struct kvp_daemon *d, int idx, struct kvp_fail *f)
{
	const char *call =
		idx < (int)(sizeof(key_calls) / sizeof(key_calls[0])) ? key_calls[idx] : NULL;

	if (!call) {
		kvp_fail_limit(f, "fields per call", KVP_FRAME_FIELDS_MAX);
		return kvp_fail(f, KVP_ERR_LIMIT_EXCEEDED,
				"more than %u fields in one call message: refused unread",
				KVP_FRAME_FIELDS_MAX);
	}
	kvp_fail_limit(f, "keys per call", d->conf.max_keys_per_call);
	return kvp_fail(f, KVP_ERR_LIMIT_EXCEEDED,
			"%s: more than %u keys in one call, the limit is %u (max_keys_per_call)",
			call, KVP_FRAME_KEYS_MAX, d->conf.max_keys_per_call);
}

int kvp_dispatch(struct kvp_daemon *d, struct kvp_session *s, const Kvpool__Request *req,
		 struct kvp_reply *r)
{
	struct kvp_fail f;
	int idx = (int)req->call_case - KVPOOL__REQUEST__CALL_HELLO;
	kvp_rpc_handler h = idx >= 0 && idx < (int)(sizeof(handlers) / sizeof(handlers[0]))
				    ? handlers[idx]
				    : NULL;
	int rc;

	kvp_fail_init(&f);
	if (!h) {
		rc = kvp_fail(&f, KVP_ERR_INVALID_ARGUMENT, "unknown call %d", (int)req->call_case);
	} else if (!s->hello && req->call_case != KVPOOL__REQUEST__CALL_HELLO) {
		rc = kvp_fail(&f, KVP_ERR_PROTOCOL, "the first call must be Hello");
		r->close_after = true;
	} else if (s->evicted) {
		rc = kvp_fail(&f, KVP_ERR_PERMISSION_DENIED, "%s", s->evict_reason);
		r->close_after = true;
	} else if (kvp_frame_call_unpacked(req)) {
		rc = refuse_crowded(d, idx, &f);
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

static bool wire_varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
	*v = 0;
	for (unsigned i = 0; i < 10 && *p < end; i++) {
		uint8_t b = *(*p)++;

		*v |= (uint64_t)(b & 0x7f) << (7 * i);
		if (!(b & 0x80))
			return true;
	}
	return false;
}

/* Whether a string field of message d in data[0, len), or of one nested in it, holds a NUL
 * byte. The payload decoded already, so it is well-formed; anything odd stops the walk. */
static bool string_has_nul(const ProtobufCMessageDescriptor *d, const uint8_t *p,
			   const uint8_t *end, int depth)
{
	while (p < end) {
		const ProtobufCFieldDescriptor *f;
		uint64_t tag, v;

		if (!wire_varint(&p, end, &tag))
			return false;
		switch (tag & 7) {
		case 0:
			if (!wire_varint(&p, end, &v))
				return false;
			break;
		case 1: p += 8; break;
		case 5: p += 4; break;
		case 2:
			if (!wire_varint(&p, end, &v) || v > (uint64_t)(end - p))
				return false;
			f = protobuf_c_message_descriptor_get_field(d, (unsigned)(tag >> 3));
			if (f && f->type == PROTOBUF_C_TYPE_STRING && memchr(p, 0, (size_t)v))
				return true;
			if (f && f->type == PROTOBUF_C_TYPE_MESSAGE && depth < 8 &&
			    string_has_nul(f->descriptor, p, p + v, depth + 1))
				return true;
			p += v;
			break;
		default: return false;
		}
	}
	return false;
}

int kvp_dispatch_frame(struct kvp_daemon *d, struct kvp_session *s, const Kvpool__Request *req,
		       const uint8_t *payload, size_t len, struct kvp_reply *r)
{
	struct kvp_fail f;

	/* A call left unpacked is refused without the walk (its message is most of the frame). */
	if (kvp_frame_call_unpacked(req) ||
	    !string_has_nul(&kvpool__request__descriptor, payload, payload + len, 0))
		return kvp_dispatch(d, s, req, r);
	kvp_fail_init(&f);
	kvp_fail(&f, KVP_ERR_INVALID_ARGUMENT,
		 "a string field holds a NUL byte (names and strings are NUL-free)");
	kvp_reply_fail(r, &f);
	return (int)f.code;
}
