/* test_dispatch.c - RPC handlers served in-process through kvp_dispatch (no loop, no socket):
 * a Release whose reply cannot be allocated keeps its lock; Evict with token counts near 2^64
 * evicts instead of wrapping; a call the decoder left unpacked is refused before its handler;
 * the books balance after each call. */
#include <CUnit/Basic.h>
#include <stdint.h>

#include "daemon_fixture.h"
#include "frame.h"
#include "pool_cache.h"
#include "suite.h"

static const char *const g_conf = "[pool.u]\nlayers = 1\nkv_heads = 1\nhead_dim = 4\n"
				  "dtype = fp16\npage_tokens = 4\ndevice = sim\n"
				  "device_capacity = 64t\nhost_capacity = 32t\nmlock = off\n";

static uint64_t protected_tokens(const struct kvpd_pool *p)
{
	struct kvp_tier_figures fig;

	kvp_pool_tier_figures(p, KVP_TIER_ID_DEVICE, &fig);
	return fig.protected_tokens;
}

/* Matches the cached tokens 0..ntokens with a lock; returns the lock id (0 on failure). */
static uint64_t match_locked(struct kvp_daemon *d, struct kvp_session *s, uint32_t ntokens)
{
	Kvpool__Request req = KVPOOL__REQUEST__INIT;
	Kvpool__MatchReq m = KVPOOL__MATCH_REQ__INIT;
	struct kvp_reply r;
	uint32_t tokens[64];
	uint64_t id = 0;

	for (uint32_t i = 0; i < ntokens; i++)
		tokens[i] = i;
	m.pool_id = 0;
	m.tokens = tokens;
	m.n_tokens = ntokens;
	m.lock = true;
	req.call_case = KVPOOL__REQUEST__CALL_MATCH;
	req.match = &m;
	if (fx_call(d, s, &req, &r) == 0 && r.resp.result_case == KVPOOL__RESPONSE__RESULT_MATCH)
		id = r.resp.match->lock_id;
	kvp_reply_release(&r);
	return id;
}

static int release(struct kvp_daemon *d, struct kvp_session *s, uint64_t lock_id)
{
	Kvpool__Request req = KVPOOL__REQUEST__INIT;
	Kvpool__ReleaseReq m = KVPOOL__RELEASE_REQ__INIT;
	struct kvp_reply r;
	int code;

	m.lock_id = lock_id;
	req.call_case = KVPOOL__REQUEST__CALL_RELEASE;
	req.release = &m;
	code = fx_call(d, s, &req, &r);
	CU_ASSERT_EQUAL(r.status.code, code);
	kvp_reply_release(&r);
	return code;
}

/* A Release answered INTERNAL (its reply could not be allocated) leaves the lock held and
 * booked, so the caller's retry releases it; before, the lock was dropped first. */
static void test_release_reply_failure_keeps_lock(void)
{
	struct kvp_daemon *d = fx_daemon(g_conf);
	struct kvp_session *s;
	uint64_t id, locked;

	CU_ASSERT_PTR_NOT_NULL_FATAL(d);
	s = fx_session(d, false);
	CU_ASSERT_PTR_NOT_NULL_FATAL(s);
	kvp_session_attach(s, d->pools[0]);
	CU_ASSERT_EQUAL_FATAL(fx_cache(d->pools[0], KVP_TIER_ID_DEVICE, 0, 0, 16), 4);
	id = match_locked(d, s, 16);
	CU_ASSERT_NOT_EQUAL_FATAL(id, 0);
	locked = s->locked_tokens;
	CU_ASSERT_EQUAL(locked, 16);
	CU_ASSERT_EQUAL(protected_tokens(d->pools[0]), 16);

	fx_faults("reply_alloc:1:1"); /* the next reply piece fails, once */
	CU_ASSERT_EQUAL(release(d, s, id), KVP_ERR_INTERNAL);
	fx_faults(NULL);
	CU_ASSERT_PTR_NOT_NULL(kvp_idmap_get(&s->locks, id));
	CU_ASSERT_EQUAL(s->locks.count, 1);
	CU_ASSERT_EQUAL(s->locked_tokens, locked);
	CU_ASSERT_EQUAL(protected_tokens(d->pools[0]), 16);
	CU_ASSERT_EQUAL(kvp_daemon_check(d), 0);

	CU_ASSERT_EQUAL(release(d, s, id), 0);
	CU_ASSERT_PTR_NULL(kvp_idmap_get(&s->locks, id));
	CU_ASSERT_EQUAL(s->locked_tokens, 0);
	CU_ASSERT_EQUAL(protected_tokens(d->pools[0]), 0);
	CU_ASSERT_EQUAL(release(d, s, id), KVP_ERR_NOT_FOUND);
	CU_ASSERT_EQUAL(kvp_daemon_check(d), 0);
	fx_daemon_free(d);
}

/* Evict of `tokens` from the device tier by an admin session; returns the tokens evicted. */
static uint64_t evict(struct kvp_daemon *d, struct kvp_session *s, uint64_t tokens, int *code)
{
	Kvpool__Request req = KVPOOL__REQUEST__INIT;
	Kvpool__EvictReq m = KVPOOL__EVICT_REQ__INIT;
	struct kvp_reply r;
	uint64_t n = 0;

	m.pool_id = 0;
	m.tokens = tokens;
	m.tier = KVPOOL__TIER__DEVICE;
	req.call_case = KVPOOL__REQUEST__CALL_EVICT;
	req.evict = &m;
	*code = fx_call(d, s, &req, &r);
	if (*code == 0)
		n = r.resp.evict->evicted_tokens;
	kvp_reply_release(&r);
	return n;
}

/* Token counts whose rounding up to pages once wrapped (UINT64_MAX + page_tokens - 1) evict
 * everything evictable; so do counts just below, and a count of one page evicts one page. */
static void test_evict_tokens_near_2_64_saturate(void)
{
	const uint64_t asks[] = { UINT64_MAX, UINT64_MAX - 4, UINT64_MAX - 3, UINT64_MAX - 1 };
	struct kvp_daemon *d = fx_daemon(g_conf);
	struct kvp_session *s;
	struct kvp_tier_figures fig;
	int code;

	CU_ASSERT_PTR_NOT_NULL_FATAL(d);
	s = fx_session(d, true);
	CU_ASSERT_PTR_NOT_NULL_FATAL(s);
	for (size_t i = 0; i < sizeof(asks) / sizeof(asks[0]); i++) {
		/* no host room to demote into: make the device pages the only copy */
		CU_ASSERT_EQUAL_FATAL(fx_cache(d->pools[0], KVP_TIER_ID_DEVICE, i + 1, 0, 32), 8);
		kvp_pool_tier_figures(d->pools[0], KVP_TIER_ID_DEVICE, &fig);
		CU_ASSERT_EQUAL(fig.cached_tokens, 32);
		CU_ASSERT_EQUAL(evict(d, s, asks[i], &code), 32);
		CU_ASSERT_EQUAL(code, 0);
		kvp_pool_tier_figures(d->pools[0], KVP_TIER_ID_DEVICE, &fig);
		CU_ASSERT_EQUAL(fig.cached_tokens, 0);
		CU_ASSERT_EQUAL(kvp_daemon_check(d), 0);
	}
	CU_ASSERT_EQUAL_FATAL(fx_cache(d->pools[0], KVP_TIER_ID_DEVICE, 9, 0, 32), 8);
	CU_ASSERT_EQUAL(evict(d, s, 1, &code), 4);
	CU_ASSERT_EQUAL(evict(d, s, 0, &code), 0);
	CU_ASSERT_EQUAL(code, KVP_ERR_INVALID_ARGUMENT);
	fx_daemon_free(d);
}

/* The tokens -> pages rounding saturates instead of wrapping. */
static void test_pool_pages_of_saturates(void)
{
	struct kvp_daemon *d = fx_daemon(g_conf);
	const struct kvpd_pool *p;

	CU_ASSERT_PTR_NOT_NULL_FATAL(d);
	p = d->pools[0];
	CU_ASSERT_EQUAL(kvp_pool_pages_of(p, 0), 0);
	CU_ASSERT_EQUAL(kvp_pool_pages_of(p, 1), 1);
	CU_ASSERT_EQUAL(kvp_pool_pages_of(p, 4), 1);
	CU_ASSERT_EQUAL(kvp_pool_pages_of(p, 5), 2);
	CU_ASSERT_EQUAL(kvp_pool_pages_of(p, (uint64_t)UINT32_MAX * 4), UINT32_MAX);
	CU_ASSERT_EQUAL(kvp_pool_pages_of(p, (uint64_t)UINT32_MAX * 4 + 1), UINT32_MAX);
	CU_ASSERT_EQUAL(kvp_pool_pages_of(p, UINT64_MAX), UINT32_MAX);
	CU_ASSERT_EQUAL(kvp_pool_pages_of(p, UINT64_MAX - 4), UINT32_MAX);
	CU_ASSERT_EQUAL(kvp_pool_pages_of(p, UINT64_MAX - 1), UINT32_MAX);
	fx_daemon_free(d);
}

/* Calls before Hello and unknown calls are refused with a Status, and nothing else. */
static void test_dispatch_refuses_before_hello(void)
{
	struct kvp_daemon *d = fx_daemon(g_conf);
	Kvpool__Request req = KVPOOL__REQUEST__INIT;
	Kvpool__PingReq ping = KVPOOL__PING_REQ__INIT;
	struct kvp_session *s;
	struct kvp_reply r;

	CU_ASSERT_PTR_NOT_NULL_FATAL(d);
	s = fx_session(d, false);
	CU_ASSERT_PTR_NOT_NULL_FATAL(s);
	req.call_case = KVPOOL__REQUEST__CALL_PING;
	req.ping = &ping;
	ping.nonce = 77;
	CU_ASSERT_EQUAL(fx_call(d, s, &req, &r), 0);
	CU_ASSERT_EQUAL(r.resp.result_case, KVPOOL__RESPONSE__RESULT_PING);
	CU_ASSERT_EQUAL(r.resp.ping->nonce, 77);
	kvp_reply_release(&r);
	s->hello = false;
	CU_ASSERT_EQUAL(fx_call(d, s, &req, &r), KVP_ERR_PROTOCOL);
	CU_ASSERT_EQUAL(r.resp.result_case, KVPOOL__RESPONSE__RESULT__NOT_SET);
	CU_ASSERT_TRUE(r.close_after);
	kvp_reply_release(&r);
	s->hello = true;
	req.call_case = (Kvpool__Request__CallCase)99;
	CU_ASSERT_EQUAL(fx_call(d, s, &req, &r), KVP_ERR_INVALID_ARGUMENT);
	kvp_reply_release(&r);
	fx_daemon_free(d);
}

/* A call the decoder left unpacked (its member NULL: more than KVP_FRAME_FIELDS_MAX fields) is
 * refused LIMIT_EXCEEDED without its handler: a key call as too many keys (max_keys_per_call),
 * any other with the decoder's bound. Every call is tried. */
static void test_dispatch_refuses_calls_left_unpacked(void)
{
	const ProtobufCMessageDescriptor *rd = &kvpool__request__descriptor;
	struct kvp_daemon *d = fx_daemon(g_conf);
	struct kvp_session *s;
	struct kvp_reply r;

	CU_ASSERT_PTR_NOT_NULL_FATAL(d);
	s = fx_session(d, false);
	CU_ASSERT_PTR_NOT_NULL_FATAL(s);
	kvp_session_attach(s, d->pools[0]);
	for (unsigned i = 0; i < rd->n_fields; i++) {
		const ProtobufCFieldDescriptor *f = &rd->fields[i];
		Kvpool__Request req = KVPOOL__REQUEST__INIT;
		bool keyed = f->id == KVPOOL__REQUEST__CALL_INSERT_KEYS ||
			     f->id == KVPOOL__REQUEST__CALL_MATCH_KEYS ||
			     f->id == KVPOOL__REQUEST__CALL_EXISTS_KEYS ||
			     f->id == KVPOOL__REQUEST__CALL_FETCH;

		if (f->type != PROTOBUF_C_TYPE_MESSAGE)
			continue;
		req.call_case = (Kvpool__Request__CallCase)f->id;
		CU_ASSERT(kvp_frame_call_unpacked(&req));
		CU_ASSERT_EQUAL(fx_call(d, s, &req, &r), KVP_ERR_LIMIT_EXCEEDED);
		CU_ASSERT_EQUAL(r.resp.result_case, KVPOOL__RESPONSE__RESULT__NOT_SET);
		CU_ASSERT_EQUAL(r.status.detail_case, KVPOOL__STATUS__DETAIL_LIMIT);
		if (r.status.detail_case == KVPOOL__STATUS__DETAIL_LIMIT) {
			CU_ASSERT_STRING_EQUAL(r.status.limit->what,
					       keyed ? "keys per call" : "fields per call");
			CU_ASSERT_EQUAL(r.status.limit->limit,
					keyed ? d->conf.max_keys_per_call : KVP_FRAME_FIELDS_MAX);
		}
		kvp_reply_release(&r);
	}
	CU_ASSERT_EQUAL(kvp_daemon_check(d), 0);
	fx_daemon_free(d);
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_release_reply_failure_keeps_lock),
		H_TEST(test_evict_tokens_near_2_64_saturate),
		H_TEST(test_pool_pages_of_saturates),
		H_TEST(test_dispatch_refuses_before_hello),
		H_TEST(test_dispatch_refuses_calls_left_unpacked),
	};

	return H_RUN_SUITE("dispatch", NULL, NULL, tests);
}
