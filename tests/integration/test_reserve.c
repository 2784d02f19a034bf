/* test_reserve.c - page reserves in shared memory: Alloc and Free served from the rings with no
 * call, local leases bound before a call names them, corrupt rings refused for their session
 * only, reserves taken back under pressure while their clients allocate (no page ever has two
 * owners: each owner's byte pattern is checked), OUT_OF_CAPACITY naming what clients hold in
 * reserves, and kill -9 storms of clients holding reserves that leave the books balanced. */
#include <CUnit/Basic.h>
#include <dirent.h>
#include <poll.h>
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "kvp_internal.h"
#include "kvp_ring.h"
#include "kvpool.h"

#define PT 16
#define R_PAGES 512 /* pool r: device pages */
#define P_PAGES 256 /* pool press: device pages */
#define RESV 64	    /* pages asked per reserve */
#define LOCAL (UINT64_C(1) << 63)

static struct daemon g_d;
static struct kvp_client *g_obs;

static int init_suite(void)
{
	char conf[2048];
	struct kvp_error e;

	snprintf(conf, sizeof(conf),
		 "[daemon]\n"
		 "reserve_max_pages = %u\n"
		 "reserve_free_percent = 50\n"
		 "[pool.r]\n"
		 "layers = 1\nkv_heads = 1\nhead_dim = 8\ndtype = fp16\npage_tokens = %u\n"
		 "device = sim\ndevice_capacity = %ut\nhost_capacity = 0\nmlock = off\n"
		 "[pool.press]\n"
		 "layers = 1\nkv_heads = 1\nhead_dim = 8\ndtype = fp16\npage_tokens = %u\n"
		 "device = sim\ndevice_capacity = %ut\nhost_capacity = 0\nmlock = off\n",
		 RESV, PT, R_PAGES * PT, PT, P_PAGES * PT);
	if (h_daemon_start(&g_d, conf, NULL) < 0)
		return -1;
	g_obs = kvp_client_connect(g_d.sock, "observer", &e);
	if (!g_obs)
		return -1;
	kvp_client_set_timeout(g_obs, 20000);
	return 0;
}

static int clean_suite(void)
{
	kvp_client_close(g_obs);
	return h_daemon_finish(&g_d);
}

static struct kvp_pool *attach_resv(struct kvp_client *c, const char *pool, uint32_t pages)
{
	struct kvp_pool_opts o = { .struct_size = sizeof(o) };
	struct kvp_error e;

	struct kvp_pool *p;

	o.reserve_pages[KVP_TIER_DEVICE] = pages;
	p = kvp_pool_attach_opts(c, pool, &o, &e);
	if (!p)
		fprintf(stderr, "attach %s: %s %s\n", pool, kvp_code_name(e.code), e.message);
	return p;
}

/* Pool `name` in the observer's status, or NULL when the call failed or lists no such pool. */
static const struct kvp_pool_status *pool_status(const char *name)
{
	static struct kvp_status st;
	struct kvp_error e;

	st.struct_size = sizeof(st);
	if (kvp_client_status(g_obs, &st, &e) < 0)
		return NULL;
	for (uint32_t i = 0; i < st.n_pools; i++)
		if (!strcmp(st.pools[i].name, name))
			return &st.pools[i];
	return NULL;
}

/* The device tier of pool `name` as the observer sees it; asserts free + leased + cached ==
 * total. Returns leased tokens, or UINT64_MAX when the status call failed. */
static uint64_t leased_tokens(const char *name, uint64_t *free_tokens)
{
	const struct kvp_pool_status *ps = pool_status(name);
	const struct kvp_tier_status *t = ps ? &ps->tiers[KVP_TIER_DEVICE] : NULL;

	if (!t)
		return UINT64_MAX;
	CU_ASSERT_EQUAL(t->free_tokens + t->leased_tokens + t->cached_tokens, t->total_tokens);
	if (free_tokens)
		*free_tokens = t->free_tokens;
	return t->leased_tokens;
}

static uint64_t pool_counter(const char *pool, const char *name)
{
	const struct kvp_pool_status *ps = pool_status(pool);

	for (uint32_t k = 0; ps && k < ps->n_counters; k++)
		if (!strcmp(ps->counters[k].name, name))
			return ps->counters[k].value;
	return UINT64_MAX;
}

/* Waits until only the observer's session is left (kvpoold saw the others go). */
static int wait_sessions(uint32_t n, int ms)
{
	static struct kvp_status st;
	struct kvp_error e;
	uint64_t end = h_now_ms() + (uint64_t)ms;

	do {
		st.struct_size = sizeof(st);
		if (kvp_client_status(g_obs, &st, &e) == 0 && st.sessions == n)
			return 0;
		usleep(10000);
	} while (h_now_ms() < end);
	fprintf(stderr, "sessions: %u, not %u\n", st.sessions, n);
	return -1;
}

static void test_fast_path_serves_without_calls(void)
{
	struct kvp_error e;
	struct kvp_client *c = kvp_client_connect(g_d.sock, "fast", &e);
	struct kvp_pool *p = c ? attach_resv(c, "r", RESV) : NULL;
	struct kvp_resv_stats st;
	uint32_t pages[4];
	uint64_t id, local = 0;

	CU_ASSERT_FATAL(p != NULL);
	CU_ASSERT_EQUAL(kvp_pool_reserve_pages(p, KVP_TIER_DEVICE), RESV);
	CU_ASSERT_EQUAL(kvp_pool_reserve_pages(p, KVP_TIER_HOST), 0);
	/* the reserve is booked as leased at once */
	CU_ASSERT_EQUAL(leased_tokens("r", NULL), (uint64_t)RESV * PT);
	for (int i = 0; i < 10000; i++) {
		uint32_t n = 1 + (uint32_t)i % 4;

		CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc(p, KVP_TIER_DEVICE, n, &id, pages, &e), 0);
		for (uint32_t k = 0; k < n; k++)
			CU_ASSERT(pages[k] < R_PAGES);
		local += (id & LOCAL) != 0;
		CU_ASSERT_EQUAL_FATAL(kvp_lease_free(p, id, NULL, 0, &e), 0);
	}
	kvp__resv_stats(kvp__pool_resv(p), &st);
	/* nearly all from the rings (local lease ids); a Reserve call per many operations */
	CU_ASSERT(st.allocs >= 9000);
	CU_ASSERT(local >= st.allocs);
	CU_ASSERT(st.calls <= st.allocs / 8);
	CU_ASSERT_EQUAL(kvp__resv_sync(kvp__pool_resv(p), &e), 0);
	/* still only the reserve leased: every freed page went back */
	CU_ASSERT_EQUAL(leased_tokens("r", NULL), (uint64_t)RESV * PT);
	/* more than the reserve: the RPC, a daemon lease id */
	{
		uint32_t big[RESV + 8];

		CU_ASSERT_EQUAL(kvp_lease_alloc(p, KVP_TIER_DEVICE, RESV + 8, &id, big, &e), 0);
		CU_ASSERT_EQUAL(kvp_lease_free(p, id, NULL, 0, &e), 0);
	}
	kvp_pool_detach(p, &e);
	CU_ASSERT_EQUAL(leased_tokens("r", NULL), 0);
	kvp_client_close(c);
}

static void test_local_leases_bound_before_calls(void)
{
	struct kvp_error e;
	struct kvp_client *c = kvp_client_connect(g_d.sock, "bind", &e);
	struct kvp_pool *p = c ? attach_resv(c, "r", RESV) : NULL;
	uint32_t pages[8], more[2], tokens[3 * PT + 5];
	uint64_t id, id2, newt = 0;
	struct kvp_match_result m = { .struct_size = sizeof(m) };
	uint32_t dev[8], host[8];
	int left;

	CU_ASSERT_FATAL(p != NULL);
	for (uint32_t i = 0; i < sizeof(tokens) / sizeof(tokens[0]); i++)
		tokens[i] = 7000 + i;
	CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc(p, KVP_TIER_DEVICE, 3, &id, pages, &e), 0);
	CU_ASSERT((id & LOCAL) != 0);
	/* extended from the ring too */
	CU_ASSERT_EQUAL(kvp_lease_extend(p, id, 1, pages + 3, &e), 0);
	/* Insert names the local lease: bound first, pipelined */
	CU_ASSERT_EQUAL(kvp_cache_insert(p, id, 0, tokens, 3 * PT + 5, 0, pages, 4, &newt, &e), 0);
	CU_ASSERT_EQUAL(newt, 3 * PT);
	CU_ASSERT_EQUAL(kvp_cache_match(p, 0, tokens, 3 * PT + 5, 0, &m, dev, host, 8, &e), 0);
	CU_ASSERT_EQUAL(m.matched_tokens, 3 * PT);
	CU_ASSERT_EQUAL(dev[0], pages[0]);
	/* the tail page stays in the (now kvpoold's) lease: extend by RPC, free by RPC */
	CU_ASSERT_EQUAL(kvp_lease_extend(p, id, 2, more, &e), 0);
	left = kvp_lease_free(p, id, more, 2, &e);
	CU_ASSERT_EQUAL(left, 1);
	CU_ASSERT_EQUAL(kvp_lease_free(p, id, NULL, 0, &e), 0);
	CU_ASSERT_EQUAL(kvp_lease_free(p, id, NULL, 0, &e), -KVP_E_NOT_FOUND);
	/* a partial local free, then a free that names a page not in the lease */
	CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc(p, KVP_TIER_DEVICE, 2, &id2, pages, &e), 0);
	CU_ASSERT_EQUAL(kvp_lease_free(p, id2, pages, 1, &e), 1);
	CU_ASSERT_EQUAL(kvp_lease_free(p, id2, pages, 1, &e), -KVP_E_NOT_FOUND);
	CU_ASSERT_EQUAL(kvp_lease_free(p, id2, pages + 1, 1, &e), 0);
	CU_ASSERT_EQUAL(kvp_lease_free(p, id2, NULL, 0, &e), 0);
	CU_ASSERT_EQUAL(kvp__resv_sync(kvp__pool_resv(p), &e), 0);
	kvp_admin_flush(g_obs, "r", NULL, &e);
	kvp_pool_detach(p, &e);
	CU_ASSERT_EQUAL(leased_tokens("r", NULL), 0);
	kvp_client_close(c);
}

/* A raw Reserve call of pool p binding pages[0..n) as lease id. Returns the status code. */
static int raw_bind(struct kvp_pool *p, uint64_t id, const uint32_t *pages, uint32_t n)
{
	Kvpool__Request req = KVPOOL__REQUEST__INIT;
	Kvpool__ReserveReq a = KVPOOL__RESERVE_REQ__INIT;
	Kvpool__ReserveBind bd = KVPOOL__RESERVE_BIND__INIT, *bp = &bd;
	Kvpool__Response *resp;
	struct kvp_error e;
	int r;

	req.call_case = KVPOOL__REQUEST__CALL_RESERVE;
	req.reserve = &a;
	a.pool_id = kvp_pool_id(p);
	a.binds = &bp;
	a.n_binds = 1;
	bd.lease_id = id;
	bd.tier = KVPOOL__TIER__DEVICE;
	bd.pages = (uint32_t *)pages;
	bd.n_pages = n;
	r = kvp__rpc(kvp__pool_client(p), &req, KVPOOL__RESPONSE__RESULT_RESERVE, &resp, NULL, NULL,
		     &e);
	if (r == 0)
		kvpool__response__free_unpacked(resp, NULL);
	return -r;
}

/* kvpoold knows a local lease only once bound: a call naming it before is NOT_FOUND, and a
 * bind naming pages the session did not take from its ring (another's, one still in the ring,
 * twice) is refused with nothing changed. */
/* Waits up to ms for *v to reach want; returns whether it did. */
static bool wait_word(_Atomic uint32_t *v, uint32_t want, int ms)
{
	uint64_t end = h_now_ms() + (uint64_t)ms;

	while (atomic_load(v) != want && h_now_ms() < end)
		usleep(1000);
	return atomic_load(v) == want;
}

/* kvpoold refills and drains a reserve by itself: a client that takes pages straight from its
 * fill ring (below the low watermark) and gives them back through its return ring (past the
 * high one), with no call at all, sees both rings served, and the books stay right. */
static void test_rings_served_without_calls(void)
{
	struct kvp_error e;
	struct kvp_client *c = kvp_client_connect(g_d.sock, "quiet", &e);
	struct kvp_pool *p = c ? attach_resv(c, "r", RESV) : NULL;
	struct kvp_resv_stats st0, st1;
	struct kvp_ring fill = { 0 }, ret = { 0 };
	uint32_t got[RESV], slots, n = KVP_RESV_LOW(RESV) + 1, t;
	uint64_t upkeeps = pool_counter("r", "reserve_upkeeps_total");
	size_t bytes;
	void *base;

	CU_ASSERT_FATAL(p != NULL);
	base = kvp__resv_region(kvp__pool_resv(p), &bytes, &slots);
	CU_ASSERT_FATAL(base != NULL);
	CU_ASSERT_EQUAL_FATAL(kvp_ring_at(base, bytes, slots, 0, KVP_RING_FILL, &fill), 0);
	CU_ASSERT_EQUAL_FATAL(kvp_ring_at(base, bytes, slots, 0, KVP_RING_RETURN, &ret), 0);
	CU_ASSERT_FATAL(n <= RESV && n >= KVP_RESV_HIGH(slots));
	kvp__resv_stats(kvp__pool_resv(p), &st0);
	CU_ASSERT_EQUAL_FATAL(kvp_ring_count(&fill), RESV);
	CU_ASSERT_EQUAL_FATAL(kvp_ring_take(&fill, n, got), n); /* below the low watermark */
	CU_ASSERT(wait_word(fill.tail, atomic_load(fill.head) + RESV, 3000));
	CU_ASSERT_EQUAL(kvp_ring_count(&fill), RESV);
	/* the pages taken are the session's (booked as leased), the ring full again beside them */
	CU_ASSERT_EQUAL(leased_tokens("r", NULL), (uint64_t)(RESV + n) * PT);
	t = atomic_load(ret.tail);
	CU_ASSERT_EQUAL_FATAL(kvp_ring_put(&ret, &t, got, n), n); /* past the high watermark */
	CU_ASSERT(wait_word(ret.head, t, 3000));
	CU_ASSERT_EQUAL(leased_tokens("r", NULL), (uint64_t)RESV * PT);
	CU_ASSERT(pool_counter("r", "reserve_upkeeps_total") >= upkeeps + 2);
	kvp__resv_stats(kvp__pool_resv(p), &st1);
	CU_ASSERT_EQUAL(st1.calls, st0.calls); /* the library sent nothing */
	CU_ASSERT_EQUAL(kvp__resv_sync(kvp__pool_resv(p), &e), 0);
	kvp_client_close(c);
	CU_ASSERT_EQUAL(wait_sessions(1, 5000), 0);
	CU_ASSERT_EQUAL(leased_tokens("r", NULL), 0);
}

/* A reserve larger than half of reserve_max_pages' top (32768): its rings have 65536 slots, so
 * what one look at it may move (granted + slots) is more than a turn of kvpoold's upkeep
 * (KVP_RESERVE_TURN_PAGES); it is still refilled and drained with no call (it is served alone
 * in a turn). Its own kvpoold: 65536 device pages, all of them reservable. */
#define BIG 20000
static void test_big_reserve_served_without_calls(void)
{
	static uint32_t got[2 * BIG];
	char conf[1024];
	struct daemon d;
	struct kvp_error e;
	struct kvp_client *c;
	struct kvp_pool *p;
	struct kvp_resv_stats st0, st1;
	struct kvp_ring fill = { 0 }, ret = { 0 };
	uint32_t slots, n = KVP_RESV_LOW(BIG) + 1, t;
	size_t bytes;
	void *base;

	snprintf(conf, sizeof(conf),
		 "[daemon]\nreserve_max_pages = 32768\nreserve_free_percent = 100\n"
		 "[pool.big]\n"
		 "layers = 1\nkv_heads = 1\nhead_dim = 8\ndtype = fp16\npage_tokens = %u\n"
		 "device = sim\ndevice_capacity = %ut\nhost_capacity = 0\nmlock = off\n",
		 PT, 65536 * PT);
	CU_ASSERT_EQUAL_FATAL(h_daemon_start(&d, conf, NULL), 0);
	c = kvp_client_connect(d.sock, "big", &e);
	p = c ? attach_resv(c, "big", BIG) : NULL;
	CU_ASSERT_FATAL(p != NULL);
	base = kvp__resv_region(kvp__pool_resv(p), &bytes, &slots);
	CU_ASSERT_FATAL(base != NULL);
	CU_ASSERT_EQUAL(slots, 65536);
	CU_ASSERT_FATAL(BIG + slots > 65536); /* more than a turn's budget */
	CU_ASSERT_EQUAL_FATAL(kvp_ring_at(base, bytes, slots, 0, KVP_RING_FILL, &fill), 0);
	CU_ASSERT_EQUAL_FATAL(kvp_ring_at(base, bytes, slots, 0, KVP_RING_RETURN, &ret), 0);
	kvp__resv_stats(kvp__pool_resv(p), &st0);
	CU_ASSERT_EQUAL_FATAL(kvp_ring_count(&fill), BIG);
	/* twice below the low watermark: refilled each time */
	for (int k = 0; k < 2; k++) {
		CU_ASSERT_EQUAL_FATAL(kvp_ring_take(&fill, n, got + k * n), n);
		CU_ASSERT(wait_word(fill.tail, atomic_load(fill.head) + BIG, 3000));
		CU_ASSERT_EQUAL(kvp_ring_count(&fill), BIG);
	}
	/* 2n taken, past the return ring's high watermark once given back: drained */
	CU_ASSERT_FATAL(2 * n >= KVP_RESV_HIGH(slots));
	t = atomic_load(ret.tail);
	CU_ASSERT_EQUAL_FATAL(kvp_ring_put(&ret, &t, got, 2 * n), 2 * n);
	CU_ASSERT(wait_word(ret.head, t, 3000));
	kvp__resv_stats(kvp__pool_resv(p), &st1);
	CU_ASSERT_EQUAL(st1.calls, st0.calls); /* the library sent nothing */
	CU_ASSERT_EQUAL(kvp__resv_sync(kvp__pool_resv(p), &e), 0);
	kvp_client_close(c);
	CU_ASSERT_EQUAL(h_daemon_stop(&d), 0);
	h_daemon_cleanup(&d);
}

static void test_binds_are_checked(void)
{
	struct kvp_error e;
	struct kvp_client *a = kvp_client_connect(g_d.sock, "binder", &e);
	struct kvp_client *b = kvp_client_connect(g_d.sock, "other", &e);
	struct kvp_pool *pa = a ? attach_resv(a, "r", RESV) : NULL;
	struct kvp_pool *pb = b ? attach_resv(b, "r", RESV) : NULL;
	uint32_t ap[2], bp[1], slots, dup[2];
	uint64_t aid, bid;
	struct kvp_ring fill = { 0 };
	size_t bytes;
	void *base;

	CU_ASSERT_FATAL(pa && pb);
	CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc(pa, KVP_TIER_DEVICE, 2, &aid, ap, &e), 0);
	CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc(pb, KVP_TIER_DEVICE, 1, &bid, bp, &e), 0);
	/* not bound yet: kvpoold has no such lease */
	{
		Kvpool__Request req = KVPOOL__REQUEST__INIT;
		Kvpool__FreeReq fr = KVPOOL__FREE_REQ__INIT;
		Kvpool__Response *resp;

		req.call_case = KVPOOL__REQUEST__CALL_FREE;
		req.free = &fr;
		fr.lease_id = aid;
		CU_ASSERT_EQUAL(kvp__rpc(a, &req, KVPOOL__RESPONSE__RESULT_FREE, &resp, NULL, NULL,
					 &e),
				-KVP_E_NOT_FOUND);
	}
	/* another session's page, a page still in the ring, a page twice, a bad id */
	CU_ASSERT_EQUAL(raw_bind(pa, LOCAL | 77, bp, 1), KVP_E_NOT_FOUND);
	base = kvp__resv_region(kvp__pool_resv(pa), &bytes, &slots);
	kvp_ring_at(base, bytes, slots, 0, KVP_RING_FILL, &fill);
	{
		uint32_t waiting = fill.slot[atomic_load(fill.head) & fill.mask];

		CU_ASSERT_EQUAL(raw_bind(pa, LOCAL | 78, &waiting, 1), KVP_E_NOT_FOUND);
	}
	dup[0] = dup[1] = ap[0];
	CU_ASSERT_EQUAL(raw_bind(pa, LOCAL | 79, dup, 2), KVP_E_NOT_FOUND);
	CU_ASSERT_EQUAL(raw_bind(pa, 80, ap, 1), KVP_E_INVALID_ARGUMENT);
	/* the right bind works once, under the client's id */
	CU_ASSERT_EQUAL(raw_bind(pa, LOCAL | 81, ap, 2), KVP_OK);
	CU_ASSERT_EQUAL(raw_bind(pa, LOCAL | 82, ap, 2), KVP_E_NOT_FOUND);
	CU_ASSERT_EQUAL(kvp_lease_free(pa, LOCAL | 81, NULL, 0, &e), 0);
	/* both reserves are intact */
	CU_ASSERT_EQUAL(kvp_pool_reserve_pages(pa, KVP_TIER_DEVICE), RESV);
	CU_ASSERT_EQUAL(kvp_lease_free(pb, bid, NULL, 0, &e), 0);
	CU_ASSERT_EQUAL(kvp__resv_sync(kvp__pool_resv(pb), &e), 0);
	kvp_client_close(a);
	kvp_client_close(b);
	CU_ASSERT_EQUAL(wait_sessions(1, 5000), 0);
	CU_ASSERT_EQUAL(leased_tokens("r", NULL), 0);
}

/* A raw Free of pool p naming lease id and pages[0..n). Returns the status code. */
static int raw_free(struct kvp_pool *p, uint64_t id, const uint32_t *pages, uint32_t n)
{
	Kvpool__Request req = KVPOOL__REQUEST__INIT;
	Kvpool__FreeReq fr = KVPOOL__FREE_REQ__INIT;
	Kvpool__Response *resp;
	struct kvp_error e;
	int r;

	req.call_case = KVPOOL__REQUEST__CALL_FREE;
	req.free = &fr;
	fr.lease_id = id;
	fr.pages = (uint32_t *)pages;
	fr.n_pages = n;
	r = kvp__rpc(kvp__pool_client(p), &req, KVPOOL__RESPONSE__RESULT_FREE, &resp, NULL, NULL,
		     &e);
	if (r == 0)
		kvpool__response__free_unpacked(resp, NULL);
	return -r;
}

/* Two sessions bind local leases of the same id (a client picks its local ids): each lease's
 * pages are its own. Another session's Free naming the same id and the first one's pages is
 * NOT_FOUND, the owner's Free works, and no page is handed out twice (kvpoold once accepted the
 * foreign Free, gave the pages to the next Alloc and then aborted in the owner's Free). */
static void test_same_local_id_in_two_sessions(void)
{
	struct kvp_error e;
	struct kvp_client *a = kvp_client_connect(g_d.sock, "first", &e);
	struct kvp_client *b = kvp_client_connect(g_d.sock, "second", &e);
	struct kvp_pool *pa = a ? attach_resv(a, "r", RESV) : NULL;
	struct kvp_pool *pb = b ? attach_resv(b, "r", RESV) : NULL;
	uint32_t ap[2], bp[2];
	uint64_t id = LOCAL | 0x4242;

	CU_ASSERT_FATAL(pa && pb);
	CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc(pa, KVP_TIER_DEVICE, 2, &(uint64_t){ 0 }, ap, &e), 0);
	CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc(pb, KVP_TIER_DEVICE, 2, &(uint64_t){ 0 }, bp, &e), 0);
	/* both bind the same local id, each with pages it took from its own reserve */
	CU_ASSERT_EQUAL(raw_bind(pa, id, ap, 2), KVP_OK);
	CU_ASSERT_EQUAL(raw_bind(pb, id, bp, 2), KVP_OK);
	/* the second session names the first one's pages under that id */
	CU_ASSERT_EQUAL(raw_free(pb, id, ap, 1), KVP_E_NOT_FOUND);
	CU_ASSERT_EQUAL(raw_free(pb, id, ap + 1, 1), KVP_E_NOT_FOUND);
	/* each frees its own */
	CU_ASSERT_EQUAL(raw_free(pa, id, ap, 2), KVP_OK);
	CU_ASSERT_EQUAL(raw_free(pb, id, bp, 1), KVP_OK);
	CU_ASSERT_EQUAL(raw_free(pb, id, NULL, 0), KVP_OK);
	CU_ASSERT_EQUAL(raw_free(pa, id, NULL, 0), KVP_OK);
	CU_ASSERT_EQUAL(kvp_client_ping(a, &e), 0);
	kvp_client_close(a);
	kvp_client_close(b);
	CU_ASSERT_EQUAL(wait_sessions(1, 5000), 0);
	CU_ASSERT_EQUAL(leased_tokens("r", NULL), 0);
}

/* Detach ends the reserve (its pages back); attaching again gets a fresh reserve in the same
 * region, pipelined Attach + Detach + Attach included. */
static void test_reattach_gets_a_fresh_reserve(void)
{
	struct kvp_error e;
	struct kvp_client *c = kvp_client_connect(g_d.sock, "again", &e);
	uint32_t pages[2];
	uint64_t id;

	CU_ASSERT_FATAL(c != NULL);
	for (int round = 0; round < 20; round++) {
		struct kvp_pool *p = attach_resv(c, "r", RESV / 2);

		CU_ASSERT_FATAL(p != NULL);
		CU_ASSERT_EQUAL(kvp_pool_reserve_pages(p, KVP_TIER_DEVICE), RESV / 2);
		CU_ASSERT_EQUAL(leased_tokens("r", NULL), (uint64_t)RESV / 2 * PT);
		CU_ASSERT_EQUAL(kvp_lease_alloc(p, KVP_TIER_DEVICE, 2, &id, pages, &e), 0);
		CU_ASSERT((id & LOCAL) != 0);
		if (round & 1)
			CU_ASSERT_EQUAL(kvp_lease_free(p, id, NULL, 0, &e), 0);
		CU_ASSERT_EQUAL(kvp_pool_detach(p, &e), 0);
		CU_ASSERT_EQUAL(leased_tokens("r", NULL), 0);
	}
	/* a second handle on a pool the session holds attached gets no reserve of its own; the
	 * Detach of either ends the first handle's too */
	{
		struct kvp_pool *p1 = attach_resv(c, "r", RESV / 2),
				*p2 = attach_resv(c, "r", RESV);

		CU_ASSERT_FATAL(p1 && p2);
		CU_ASSERT_EQUAL(kvp_pool_reserve_pages(p1, KVP_TIER_DEVICE), RESV / 2);
		CU_ASSERT_EQUAL(kvp_pool_reserve_pages(p2, KVP_TIER_DEVICE), 0);
		CU_ASSERT_EQUAL(kvp_lease_alloc(p1, KVP_TIER_DEVICE, 1, &id, pages, &e), 0);
		CU_ASSERT((id & LOCAL) != 0);
		CU_ASSERT_EQUAL(kvp_pool_detach(p2, &e), 0);
		CU_ASSERT_EQUAL(kvp_pool_reserve_pages(p1, KVP_TIER_DEVICE), 0);
		CU_ASSERT_EQUAL(kvp_lease_free(p1, id, NULL, 0, &e), 0);
		CU_ASSERT_EQUAL(leased_tokens("r", NULL), 0);
		kvp_pool_detach(p1, &e);
	}
	kvp_client_close(c);
	CU_ASSERT_EQUAL(wait_sessions(1, 5000), 0);
}

/* One corruption of a session's rings: the next Reserve call is PROTOCOL for it, its reserve
 * ends with its pages back, and the honest session beside it keeps its pages and its reserve.
 */
enum corrupt { C_TAIL, C_FOREIGN, C_DUP, C_RANGE, C_HEAD_BACK, C_HEAD_AHEAD, C_GARBAGE };

static void corrupt_case(enum corrupt how)
{
	struct kvp_error e;
	struct kvp_client *a = kvp_client_connect(g_d.sock, "honest", &e);
	struct kvp_client *b = kvp_client_connect(g_d.sock, "liar", &e);
	struct kvp_pool *pa = a ? attach_resv(a, "r", RESV) : NULL;
	struct kvp_pool *pb = b ? attach_resv(b, "r", RESV) : NULL;
	uint32_t apages[4], bpages[4], slots, got[64];
	uint64_t aid, bid, lbid;
	struct kvp_ring fill = { 0 }, ret = { 0 };
	size_t bytes;
	void *base;
	uint32_t t;

	CU_ASSERT_FATAL(pa && pb);
	CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc(pa, KVP_TIER_DEVICE, 4, &aid, apages, &e), 0);
	CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc(pb, KVP_TIER_DEVICE, 2, &bid, bpages, &e), 0);
	lbid = bid;
	base = kvp__resv_region(kvp__pool_resv(pb), &bytes, &slots);
	CU_ASSERT_FATAL(base != NULL);
	CU_ASSERT_EQUAL_FATAL(kvp_ring_at(base, bytes, slots, 0, KVP_RING_FILL, &fill), 0);
	CU_ASSERT_EQUAL_FATAL(kvp_ring_at(base, bytes, slots, 0, KVP_RING_RETURN, &ret), 0);
	t = atomic_load(ret.tail);
	switch (how) {
	case C_TAIL: atomic_store(ret.tail, t + slots + 5); break;
	case C_FOREIGN: kvp_ring_put(&ret, &t, apages, 2); break;
	case C_DUP: {
		uint32_t d[2] = { bpages[0], bpages[0] };

		kvp_ring_put(&ret, &t, d, 2);
		break;
	}
	case C_RANGE: {
		uint32_t d[2] = { R_PAGES + 3, UINT32_MAX };

		kvp_ring_put(&ret, &t, d, 2);
		break;
	}
	case C_HEAD_BACK:
		/* behind what kvpoold saw (a head not yet seen may move back: that is a free) */
		CU_ASSERT_EQUAL(kvp__resv_sync(kvp__pool_resv(pb), &e), 0);
		atomic_fetch_sub(fill.head, 2);
		break;
	case C_HEAD_AHEAD: atomic_fetch_add(fill.head, slots + 1); break;
	case C_GARBAGE:
		for (uint32_t i = 0; i < slots; i++)
			ret.slot[i] = (uint32_t)rand();
		atomic_store(ret.tail, t + slots / 2);
		break;
	}
	if (kvp__resv_sync(kvp__pool_resv(pb), &e) != -KVP_E_PROTOCOL) {
		fprintf(stderr, "corruption %d not refused: %s\n", (int)how, e.message);
		CU_FAIL("a corrupt ring was not refused");
	}
	CU_ASSERT_EQUAL(e.code, KVP_E_PROTOCOL);
	CU_ASSERT_EQUAL(kvp_pool_reserve_pages(pb, KVP_TIER_DEVICE), 0);
	CU_ASSERT_EQUAL(kvp__resv_sync(kvp__pool_resv(pb), &e), -KVP_E_PROTOCOL);
	/* its local lease went with the reserve: freeing it is a no-op that succeeds */
	CU_ASSERT_EQUAL(kvp_lease_free(pb, lbid, NULL, 0, &e), 0);
	/* the liar's session still works through calls */
	CU_ASSERT_EQUAL(kvp_lease_alloc(pb, KVP_TIER_DEVICE, 1, &bid, bpages, &e), 0);
	CU_ASSERT_EQUAL(kvp_lease_free(pb, bid, NULL, 0, &e), 0);
	/* the honest one is untouched: its reserve, and its pages nobody else gets */
	CU_ASSERT_EQUAL(kvp__resv_sync(kvp__pool_resv(pa), &e), 0);
	CU_ASSERT_EQUAL(kvp_pool_reserve_pages(pa, KVP_TIER_DEVICE), RESV);
	{
		struct kvp_client *x = kvp_client_connect(g_d.sock, "sweep", &e);
		struct kvp_pool *px = x ? kvp_pool_attach(x, "r", NULL, &e) : NULL;
		uint64_t xid;
		int clash = 0;

		CU_ASSERT_FATAL(px != NULL);
		/* lease everything there is in small leases: none of a's pages come back */
		while (kvp_lease_alloc(px, KVP_TIER_DEVICE, 1, &xid, got, &e) == 0)
			for (int k = 0; k < 4; k++)
				clash += got[0] == apages[k];
		CU_ASSERT_EQUAL(e.code, KVP_E_OUT_OF_CAPACITY);
		CU_ASSERT_EQUAL(clash, 0);
		kvp_client_close(x);
	}
	CU_ASSERT_EQUAL(kvp_lease_free(pa, aid, NULL, 0, &e), 0);
	kvp_client_close(b);
	kvp_client_close(a);
	CU_ASSERT_EQUAL(wait_sessions(1, 5000), 0);
	CU_ASSERT_EQUAL(leased_tokens("r", NULL), 0);
}

static void test_corrupt_rings_refused_for_that_session(void)
{
	for (int how = C_TAIL; how <= C_GARBAGE; how++)
		corrupt_case((enum corrupt)how);
}

/* ---- take-back under pressure ---- */

#define OWNERS 3

/* Writes (or checks) owner/serial tags into the first row of every page of a lease. */
static int tag(struct kvp_pool *p, const uint32_t *pages, uint32_t n, uint64_t v, bool check)
{
	for (uint32_t i = 0; i < n; i++) {
		uint64_t *a = kvp_pool_slot_addr(p, KVP_TIER_DEVICE, 0, 0, pages[i], 0);

		if (!a)
			return -1;
		for (int k = 0; k < 2; k++) {
			if (check && a[k] != v + i)
				return -1;
			a[k] = v + i;
		}
	}
	return 0;
}

struct held {
	uint64_t id, tag;
	uint32_t n;
	uint32_t pages[8];
};

/* One owner: a reserve of RESV (owner 0 and 1) or none (owner 2, leasing big by calls), random
 * allocs and frees for ms, each lease's pages tagged on alloc and checked before free. Exit 0,
 * 1 on a tag found overwritten (a page with two owners), 2 on a call failing otherwise. */
static int owner_run(int who, int ms)
{
	struct kvp_error e;
	struct kvp_client *c = kvp_client_connect(g_d.sock, "owner", &e);
	struct kvp_pool *p = c ? (who < 2 ? attach_resv(c, "press", RESV)
					  : kvp_pool_attach(c, "press", NULL, &e))
			       : NULL;
	struct held h[16] = { 0 };
	uint64_t end = h_now_ms() + (uint64_t)ms, serial = 0;
	unsigned seed = 77 + (unsigned)who;

	if (!p)
		return 2;
	while (h_now_ms() < end) {
		int k = rand_r(&seed) % 16;
		struct held *x = &h[k];

		if (x->n) {
			if (tag(p, x->pages, x->n, x->tag, true) < 0)
				return 1;
			if (kvp_lease_free(p, x->id, NULL, 0, &e) < 0) {
				fprintf(stderr, "owner %d: free: %s\n", who, e.message);
				return 2;
			}
			x->n = 0;
			continue;
		}
		x->n = who < 2 ? 1 + (uint32_t)rand_r(&seed) % 4 : 8;
		if (kvp_lease_alloc(p, KVP_TIER_DEVICE, x->n, &x->id, x->pages, &e) < 0) {
			x->n = 0;
			if (e.code != KVP_E_OUT_OF_CAPACITY) {
				fprintf(stderr, "owner %d: alloc: %s\n", who, e.message);
				return 2;
			}
			continue;
		}
		x->tag = ((uint64_t)who << 56) | (++serial << 8);
		tag(p, x->pages, x->n, x->tag, false);
	}
	for (int k = 0; k < 16; k++)
		if (h[k].n && tag(p, h[k].pages, h[k].n, h[k].tag, true) < 0)
			return 1;
	kvp_client_close(c);
	return 0;
}

static void test_take_back_under_pressure_keeps_one_owner(void)
{
	pid_t pid[OWNERS];
	uint64_t before = pool_counter("press", "reserve_taken_back");
	int st;

	for (int i = 0; i < OWNERS; i++) {
		pid[i] = fork();
		if (pid[i] == 0)
			_exit(owner_run(i, 3000));
	}
	/* and a hog leasing most of the pool in big leases, by calls */
	{
		struct kvp_error e;
		struct kvp_client *c = kvp_client_connect(g_d.sock, "hog", &e);
		struct kvp_pool *p = c ? kvp_pool_attach(c, "press", NULL, &e) : NULL;
		uint32_t pages[96];
		uint64_t end = h_now_ms() + 3000, id;

		CU_ASSERT_FATAL(p != NULL);
		while (h_now_ms() < end) {
			if (kvp_lease_alloc(p, KVP_TIER_DEVICE, 96, &id, pages, &e) == 0) {
				CU_ASSERT_EQUAL(tag(p, pages, 96, UINT64_C(0xf0) << 56, false), 0);
				usleep(2000);
				CU_ASSERT_EQUAL(tag(p, pages, 96, UINT64_C(0xf0) << 56, true), 0);
				kvp_lease_free(p, id, NULL, 0, &e);
			} else {
				CU_ASSERT_EQUAL(e.code, KVP_E_OUT_OF_CAPACITY);
				usleep(500);
			}
		}
		kvp_client_close(c);
	}
	for (int i = 0; i < OWNERS; i++) {
		CU_ASSERT_EQUAL(waitpid(pid[i], &st, 0), pid[i]);
		CU_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
		if (!WIFEXITED(st) || WEXITSTATUS(st))
			fprintf(stderr, "owner %d: status 0x%x\n", i, st);
	}
	CU_ASSERT(pool_counter("press", "reserve_taken_back") > before);
	CU_ASSERT_EQUAL(wait_sessions(1, 5000), 0);
	CU_ASSERT_EQUAL(leased_tokens("press", NULL), 0);
}

static void test_out_of_capacity_names_reserved_tokens(void)
{
	struct kvp_error e;
	struct kvp_client *a = kvp_client_connect(g_d.sock, "holder", &e);
	struct kvp_client *b = kvp_client_connect(g_d.sock, "asker", &e);
	struct kvp_pool *pa = a ? attach_resv(a, "press", RESV) : NULL;
	struct kvp_pool *pb = b ? kvp_pool_attach(b, "press", NULL, &e) : NULL;
	uint32_t held[8], big[P_PAGES];
	uint64_t aid, bid, fr = 0;

	CU_ASSERT_FATAL(pa && pb);
	/* a holds 8 pages from its reserve locally: those cannot be taken back */
	CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc(pa, KVP_TIER_DEVICE, 8, &aid, held, &e), 0);
	CU_ASSERT_EQUAL(kvp__resv_sync(kvp__pool_resv(pa), &e), 0);
	CU_ASSERT_EQUAL(kvp_lease_alloc(pb, KVP_TIER_DEVICE, P_PAGES - 4, &bid, big, &e),
			-KVP_E_OUT_OF_CAPACITY);
	CU_ASSERT_EQUAL(e.detail, KVP_DETAIL_CAPACITY);
	CU_ASSERT_EQUAL(e.capacity_reserved_tokens, 8 * PT);
	CU_ASSERT_EQUAL(e.capacity.free_tokens, (P_PAGES - 8) * PT);
	/* what it asked within the free pages once the ring was taken back: served */
	CU_ASSERT_EQUAL(kvp_lease_alloc(pb, KVP_TIER_DEVICE, P_PAGES - 8, &bid, big, &e), 0);
	leased_tokens("press", &fr);
	CU_ASSERT_EQUAL(fr, 0);
	CU_ASSERT_EQUAL(kvp_lease_free(pb, bid, NULL, 0, &e), 0);
	CU_ASSERT_EQUAL(kvp_lease_free(pa, aid, NULL, 0, &e), 0);
	kvp_client_close(a);
	kvp_client_close(b);
	CU_ASSERT_EQUAL(wait_sessions(1, 5000), 0);
	CU_ASSERT_EQUAL(leased_tokens("press", NULL), 0);
}

/* ---- kill -9 storms ---- */

/* A client that attaches with a reserve, says so on `ready`, and leases, binds, inserts and
 * frees until killed. */
static void storm_child(int k, int ready)
{
	struct kvp_error e;
	struct kvp_client *c = kvp_client_connect(g_d.sock, "storm", &e);
	struct kvp_pool *p = c ? attach_resv(c, "r", 16) : NULL;
	uint32_t pages[4], tokens[PT];
	uint64_t id;

	if (!p)
		_exit(3);
	for (uint32_t i = 0; i < PT; i++)
		tokens[i] = (uint32_t)k * 100 + i;
	for (int i = 0;; i++) {
		if (i == 8 && write(ready, "r", 1) != 1)
			_exit(4);
		if (kvp_lease_alloc(p, KVP_TIER_DEVICE, 1 + (uint32_t)i % 4, &id, pages, &e) < 0)
			continue;
		if (i % 7 == 0)
			kvp_cache_insert(p, id, 0, tokens, PT, 0, pages, 1, NULL, &e);
		if (i % 3 != 0)
			kvp_lease_free(p, id, NULL, 0, &e);
	}
}

static int count_fds(pid_t pid)
{
	char path[64];
	int n = 0;
	DIR *dir;

	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	if (!(dir = opendir(path)))
		return -1;
	while (readdir(dir))
		n++;
	closedir(dir);
	return n;
}

/* 8 client processes at a time, each holding a reserve (and local leases, bound leases and
 * cached pages) when SIGKILLed, 1000 times over (KVP_RESERVE_CYCLES). */
static void test_kill_storm_leaves_books_balanced(void)
{
	const char *env = getenv("KVP_RESERVE_CYCLES");
	int cycles = env ? atoi(env) : 1000, procs = 8, killed = 0, ready = 0;
	int fds_before = count_fds(g_d.pid);
	unsigned seed = 4242;
	struct kvp_error e;

	for (int cyc = 0; cyc < cycles; cyc++) {
		pid_t pid[8];
		int pp[2];
		char buf[8];
		uint64_t end = h_now_ms() + 5000;

		CU_ASSERT_FATAL(pipe(pp) == 0);
		for (int i = 0; i < procs; i++) {
			pid[i] = fork();
			if (pid[i] == 0) {
				close(pp[0]);
				storm_child(cyc * procs + i, pp[1]);
			}
		}
		close(pp[1]);
		/* every child holds its reserve before the kill (or gave up) */
		for (int got = 0; got < procs && h_now_ms() < end;) {
			struct pollfd pf = { .fd = pp[0], .events = POLLIN };
			ssize_t n;

			if (poll(&pf, 1, 100) <= 0)
				continue;
			n = read(pp[0], buf, sizeof(buf));
			if (n <= 0)
				break;
			got += (int)n;
			ready += (int)n;
		}
		close(pp[0]);
		if (cyc % 64 == 0) /* the observer stays within its keep-alive */
			kvp_client_ping(g_obs, &e);
		usleep((unsigned)(rand_r(&seed) % 300));
		for (int i = 0; i < procs; i++) {
			kill(pid[i], SIGKILL);
			waitpid(pid[i], NULL, 0);
			killed++;
		}
	}
	CU_ASSERT_EQUAL(killed, cycles * procs);
	CU_ASSERT_EQUAL(ready, cycles * procs);
	CU_ASSERT_EQUAL(wait_sessions(1, 20000), 0);
	kvp_admin_flush(g_obs, "r", NULL, &e);
	CU_ASSERT_EQUAL(leased_tokens("r", NULL), 0);
	{
		uint64_t fr = 0;

		leased_tokens("r", &fr);
		CU_ASSERT_EQUAL(fr, (uint64_t)R_PAGES * PT);
	}
	/* nothing leaked: no descriptor (reserve memfds) left in kvpoold */
	CU_ASSERT_EQUAL(count_fds(g_d.pid), fds_before);
	/* every page is still there: one client can lease them all */
	{
		struct kvp_client *c = kvp_client_connect(g_d.sock, "after", &e);
		struct kvp_pool *p = c ? kvp_pool_attach(c, "r", NULL, &e) : NULL;
		static uint32_t all[R_PAGES];
		uint64_t id;

		CU_ASSERT_FATAL(p != NULL);
		CU_ASSERT_EQUAL(kvp_lease_alloc(p, KVP_TIER_DEVICE, R_PAGES, &id, all, &e), 0);
		kvp_client_close(c);
	}
	CU_ASSERT_FALSE(h_log_contains(&g_d, "do not balance"));
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_fast_path_serves_without_calls),
		H_TEST(test_local_leases_bound_before_calls),
		H_TEST(test_reattach_gets_a_fresh_reserve),
		H_TEST(test_binds_are_checked),
		H_TEST(test_same_local_id_in_two_sessions),
		H_TEST(test_rings_served_without_calls),
		H_TEST(test_big_reserve_served_without_calls),
		H_TEST(test_corrupt_rings_refused_for_that_session),
		H_TEST(test_take_back_under_pressure_keeps_one_owner),
		H_TEST(test_out_of_capacity_names_reserved_tokens),
		H_TEST(test_kill_storm_leaves_books_balanced),
	};

	return H_RUN_SUITE("reserve", init_suite, clean_suite, tests);
}
