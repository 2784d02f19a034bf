/* test_hostile.c - bad input against a real kvpoold: every request field at zero, at its
 * maximum and as a negative number read as unsigned; foreign, freed and out-of-range ids;
 * repeated Hello, version skew, garbage after Hello, half-sent frames and silent
 * connections. Each bad input must get a typed error and leave no trace: the per-tier counts
 * of every pool and the session count are compared before and after. */
#include <CUnit/Basic.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"
#include "kvpool.h"

static const char *const g_conf =
	"[pool.small]\n"
	"layers = 2\nkv_heads = 2\nhead_dim = 16\ndtype = fp16\npage_tokens = 16\n"
	"device = sim\ndevice_capacity = 1024t\nhost_capacity = 512t\nmlock = off\n"
	"[pool.other]\n"
	"layers = 1\nkv_heads = 1\nhead_dim = 8\ndtype = fp32\npage_tokens = 8\n"
	"device = sim\ndevice_capacity = 256t\nhost_capacity = 0\nmlock = off\n";

#define NEG32 ((uint32_t)-5) /* -5 sent where the field is unsigned */
#define NEG64 ((uint64_t)-5)
#define END (-100)

static struct daemon g_d;
static struct kvp_client *g_obs; /* observer: status before/after */
static struct kvp_status g_snap;
static unsigned g_cases;
static uint64_t g_next_id = 100;

static int init_suite(void)
{
	struct kvp_error e;

	if (h_daemon_start(&g_d, g_conf, NULL) < 0)
		return -1;
	g_obs = kvp_client_connect(g_d.sock, "observer", &e);
	if (!g_obs)
		return -1;
	kvp_client_set_timeout(g_obs, 5000);
	return 0;
}

static int clean_suite(void)
{
	kvp_client_close(g_obs);
	return h_daemon_finish(&g_d);
}

static void snap(struct kvp_status *st)
{
	struct kvp_error e;

	memset(st, 0, sizeof(*st));
	st->struct_size = sizeof(*st);
	CU_ASSERT_EQUAL_FATAL(kvp_client_status(g_obs, st, &e), 0);
}

/* Same sessions, same pools, same counts in every tier. */
static bool same_state(const struct kvp_status *a, const struct kvp_status *b)
{
	if (a->sessions != b->sessions || a->n_pools != b->n_pools)
		return false;
	for (uint32_t i = 0; i < a->n_pools && i < KVP_STATUS_MAX_POOLS; i++) {
		for (int t = 0; t < KVP_TIER_MAX; t++) {
			const struct kvp_tier_status *x = &a->pools[i].tiers[t],
						     *y = &b->pools[i].tiers[t];

			if (x->total_tokens != y->total_tokens ||
			    x->free_tokens != y->free_tokens ||
			    x->leased_tokens != y->leased_tokens ||
			    x->cached_tokens != y->cached_tokens ||
			    x->free_tokens + x->leased_tokens + x->cached_tokens != x->total_tokens)
				return false;
		}
	}
	return true;
}

static void mark(void)
{
	snap(&g_snap);
}

static int raw_code(Kvpool__Response *r)
{
	return r->status ? (int)r->status->code : -2;
}

/* Sends q; the status code of its reply, -1 without one. */
static int rcall(int fd, Kvpool__Request *q, Kvpool__Response **out)
{
	Kvpool__Response *r;
	int code;

	q->id = ++g_next_id;
	if (h_raw_send_request(fd, q) < 0)
		return -1;
	/* Replies to earlier calls that came too late are skipped. */
	for (uint64_t end = h_now_ms() + 3000;;) {
		uint64_t now = h_now_ms();

		r = now < end ? h_raw_recv(fd, (int)(end - now)) : NULL;
		if (!r)
			return -1;
		if (r->id == q->id || r->id == 0)
			break;
		kvpool__response__free_unpacked(r, NULL);
	}
	code = raw_code(r);
	if (out)
		*out = r;
	else
		kvpool__response__free_unpacked(r, NULL);
	return code;
}

static bool in(int code, const int *ok)
{
	for (; *ok != END; ok++)
		if (*ok == code)
			return true;
	return false;
}

/* One bad input: a typed error from ok[] and the state as marked. */
static void bad(int fd, Kvpool__Request *q, const int *ok, const char *what)
{
	struct kvp_status after = { .struct_size = sizeof(after) };
	int code = rcall(fd, q, NULL);

	g_cases++;
	if (!in(code, ok))
		printf("\n    %s: got %d (%s)\n", what, code,
		       code >= 0 ? kvp_code_name(code) : "no reply");
	CU_ASSERT(in(code, ok));
	snap(&after);
	if (!same_state(&g_snap, &after))
		printf("\n    %s: changed the daemon's state\n", what);
	CU_ASSERT(same_state(&g_snap, &after));
}

static const int NOT_FOUND[] = { KVP_E_NOT_FOUND, END };
static const int NO_POOL[] = { KVP_E_NO_SUCH_POOL, END };
static const int NO_POOL_OR_NF[] = { KVP_E_NO_SUCH_POOL, KVP_E_NOT_FOUND, END };
static const int INVALID[] = { KVP_E_INVALID_ARGUMENT, END };
static const int TOO_BIG[] = { KVP_E_INVALID_ARGUMENT, KVP_E_OUT_OF_CAPACITY, KVP_E_LIMIT_EXCEEDED,
			       END };
static const int PAGE_BAD[] = { KVP_E_NOT_FOUND, KVP_E_INVALID_ARGUMENT, END };
static const int ANY_TYPED[] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, END };

static int raw_hello_caps(int fd, uint32_t version, uint64_t offer, uint64_t required)
{
	Kvpool__Request q = KVPOOL__REQUEST__INIT;
	Kvpool__HelloReq h = KVPOOL__HELLO_REQ__INIT;

	h.protocol_version = version;
	h.client_name = (char *)"hostile";
	h.capabilities = offer;
	h.required_capabilities = required;
	q.call_case = KVPOOL__REQUEST__CALL_HELLO;
	q.hello = &h;
	return rcall(fd, &q, NULL);
}

static int raw_hello(int fd, uint32_t version)
{
	return raw_hello_caps(fd, version, 0, 0);
}

static int raw_session(void)
{
	int fd = h_raw_connect(g_d.sock);

	if (fd >= 0 && raw_hello(fd, KVP_PROTOCOL_VERSION) != 0) {
		close(fd);
		return -1;
	}
	return fd;
}

static int raw_attach(int fd, const char *pool)
{
	Kvpool__Request q = KVPOOL__REQUEST__INIT;
	Kvpool__AttachReq a = KVPOOL__ATTACH_REQ__INIT;
	Kvpool__Response *r = NULL;
	int code, id = -1;

	a.pool = (char *)pool;
	q.call_case = KVPOOL__REQUEST__CALL_ATTACH;
	q.attach = &a;
	code = rcall(fd, &q, &r);
	if (code == 0 && r->result_case == KVPOOL__RESPONSE__RESULT_ATTACH)
		id = (int)r->attach->pool_id;
	if (r)
		kvpool__response__free_unpacked(r, NULL);
	return id;
}

/* A valid lease of n device pages; its id and pages. */
static uint64_t raw_alloc(int fd, uint32_t pool_id, uint32_t n, uint32_t *pages)
{
	Kvpool__Request q = KVPOOL__REQUEST__INIT;
	Kvpool__AllocReq a = KVPOOL__ALLOC_REQ__INIT;
	Kvpool__Response *r = NULL;
	uint64_t id = 0;

	a.pool_id = pool_id;
	a.pages = n;
	q.call_case = KVPOOL__REQUEST__CALL_ALLOC;
	q.alloc = &a;
	if (rcall(fd, &q, &r) == 0 && r->result_case == KVPOOL__RESPONSE__RESULT_ALLOC &&
	    r->alloc->n_pages == n) {
		id = r->alloc->lease_id;
		memcpy(pages, r->alloc->pages, sizeof(uint32_t) * n);
	}
	if (r)
		kvpool__response__free_unpacked(r, NULL);
	return id;
}

static void alloc_case(int fd, uint32_t pool_id, uint64_t tokens, uint32_t pages, uint32_t tier,
		       const int *ok, const char *what)
{
	Kvpool__Request q = KVPOOL__REQUEST__INIT;
	Kvpool__AllocReq a = KVPOOL__ALLOC_REQ__INIT;

	a.pool_id = pool_id;
	a.tokens = tokens;
	a.pages = pages;
	a.tier = (Kvpool__Tier)tier;
	q.call_case = KVPOOL__REQUEST__CALL_ALLOC;
	q.alloc = &a;
	bad(fd, &q, ok, what);
}

static void extend_case(int fd, uint64_t lease, uint64_t tokens, uint32_t pages, const int *ok,
			const char *what)
{
	Kvpool__Request q = KVPOOL__REQUEST__INIT;
	Kvpool__ExtendReq a = KVPOOL__EXTEND_REQ__INIT;

	a.lease_id = lease;
	a.tokens = tokens;
	a.pages = pages;
	q.call_case = KVPOOL__REQUEST__CALL_EXTEND;
	q.extend = &a;
	bad(fd, &q, ok, what);
}

static void free_case(int fd, uint64_t lease, uint32_t *pages, size_t n, const int *ok,
		      const char *what)
{
	Kvpool__Request q = KVPOOL__REQUEST__INIT;
	Kvpool__FreeReq a = KVPOOL__FREE_REQ__INIT;

	a.lease_id = lease;
	a.pages = pages;
	a.n_pages = n;
	q.call_case = KVPOOL__REQUEST__CALL_FREE;
	q.free = &a;
	bad(fd, &q, ok, what);
}

static void insert_case(int fd, uint64_t lease, uint32_t *pages, size_t npages, uint32_t ntokens,
			const int *ok, const char *what)
{
	static uint32_t tokens[64];
	Kvpool__Request q = KVPOOL__REQUEST__INIT;
	Kvpool__InsertReq a = KVPOOL__INSERT_REQ__INIT;

	for (int i = 0; i < 64; i++)
		tokens[i] = 1000 + (uint32_t)i;
	a.lease_id = lease;
	a.tokens = tokens;
	a.n_tokens = ntokens;
	a.pages = pages;
	a.n_pages = npages;
	q.call_case = KVPOOL__REQUEST__CALL_INSERT;
	q.insert = &a;
	bad(fd, &q, ok, what);
}

static void id_case(int fd, int call, uint64_t id, const int *ok, const char *what)
{
	Kvpool__Request q = KVPOOL__REQUEST__INIT;
	Kvpool__ReleaseReq rel = KVPOOL__RELEASE_REQ__INIT;
	Kvpool__LoadReq ld = KVPOOL__LOAD_REQ__INIT;
	Kvpool__DetachReq de = KVPOOL__DETACH_REQ__INIT;
	Kvpool__MatchReq ma = KVPOOL__MATCH_REQ__INIT;
	uint32_t toks[32] = { 0 };

	q.call_case = (Kvpool__Request__CallCase)call;
	switch (call) {
	case KVPOOL__REQUEST__CALL_RELEASE:
		rel.lock_id = id;
		q.release = &rel;
		break;
	case KVPOOL__REQUEST__CALL_LOAD:
		ld.lock_id = id;
		q.load = &ld;
		break;
	case KVPOOL__REQUEST__CALL_DETACH:
		de.pool_id = (uint32_t)id;
		q.detach = &de;
		break;
	default:
		ma.pool_id = (uint32_t)id;
		ma.tokens = toks;
		ma.n_tokens = 32;
		ma.lock = 1;
		q.match = &ma;
		break;
	}
	bad(fd, &q, ok, what);
}

static void test_alloc_fields_zero_max_negative(void)
{
	int fd = raw_session();
	int pid;

	CU_ASSERT_FATAL(fd >= 0);
	pid = raw_attach(fd, "small");
	CU_ASSERT_EQUAL_FATAL(pid, 0);
	mark();
	alloc_case(fd, 0, 0, 0, 0, INVALID, "alloc all zero");
	alloc_case(fd, UINT32_MAX, 0, 1, 0, NO_POOL, "alloc pool_id max");
	alloc_case(fd, NEG32, 0, 1, 0, NO_POOL, "alloc pool_id -5");
	alloc_case(fd, 2, 0, 1, 0, NO_POOL, "alloc pool_id 2 (no such)");
	alloc_case(fd, 1, 0, 1, 0, NOT_FOUND, "alloc pool not attached");
	alloc_case(fd, 0, UINT64_MAX, 0, 0, INVALID, "alloc tokens max");
	alloc_case(fd, 0, NEG64, 0, 0, INVALID, "alloc tokens -5");
	alloc_case(fd, 0, UINT64_MAX - 100, 0, 0, INVALID, "alloc tokens max-100");
	alloc_case(fd, 0, 0, UINT32_MAX, 0, TOO_BIG, "alloc pages max");
	alloc_case(fd, 0, 0, NEG32, 0, TOO_BIG, "alloc pages -5");
	alloc_case(fd, 0, 0, 65, 0, TOO_BIG, "alloc pages beyond the tier");
	alloc_case(fd, 0, 16, 2, 0, INVALID, "alloc tokens and pages disagree");
	alloc_case(fd, 0, 0, 1, 7, INVALID, "alloc tier 7");
	alloc_case(fd, 0, 0, 1, UINT32_MAX, INVALID, "alloc tier max (-1)");
	alloc_case(fd, 0, 0, 1, NEG32, INVALID, "alloc tier -5");
	close(fd);
}

static void test_extend_free_insert_bad_ids_and_pages(void)
{
	struct kvp_error e;
	struct kvp_client *b = kvp_client_connect(g_d.sock, "bystander", &e);
	struct kvp_pool *bp = b ? kvp_pool_attach(b, "small", NULL, &e) : NULL;
	uint32_t pages[4], bpages[2], two[2], one[1];
	uint64_t lease, blease = 0, gone;
	int fd = raw_session();

	CU_ASSERT_PTR_NOT_NULL_FATAL(bp);
	CU_ASSERT_FATAL(fd >= 0);
	CU_ASSERT_EQUAL_FATAL(raw_attach(fd, "small"), 0);
	CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc(bp, KVP_TIER_DEVICE, 2, &blease, bpages, &e), 0);
	lease = raw_alloc(fd, 0, 4, pages);
	CU_ASSERT_FATAL(lease != 0);
	gone = raw_alloc(fd, 0, 1, one);
	CU_ASSERT_FATAL(gone != 0);
	{
		Kvpool__Request q = KVPOOL__REQUEST__INIT;
		Kvpool__FreeReq a = KVPOOL__FREE_REQ__INIT;

		a.lease_id = gone;
		q.call_case = KVPOOL__REQUEST__CALL_FREE;
		q.free = &a;
		CU_ASSERT_EQUAL_FATAL(rcall(fd, &q, NULL), 0);
	}
	mark();

	extend_case(fd, 0, 0, 0, NOT_FOUND, "extend all zero");
	extend_case(fd, UINT64_MAX, 0, 1, NOT_FOUND, "extend lease max");
	extend_case(fd, NEG64, 0, 1, NOT_FOUND, "extend lease -5");
	extend_case(fd, gone, 0, 1, NOT_FOUND, "extend freed lease");
	extend_case(fd, blease, 0, 1, NOT_FOUND, "extend another session's lease");
	extend_case(fd, lease, 0, 0, INVALID, "extend zero pages");
	extend_case(fd, lease, UINT64_MAX, 0, INVALID, "extend tokens max");
	extend_case(fd, lease, NEG64, 0, INVALID, "extend tokens -5");
	extend_case(fd, lease, 0, 65, TOO_BIG, "extend pages beyond the tier");

	free_case(fd, 0, NULL, 0, NOT_FOUND, "free all zero");
	free_case(fd, UINT64_MAX, NULL, 0, NOT_FOUND, "free lease max");
	free_case(fd, NEG64, NULL, 0, NOT_FOUND, "free lease -5");
	free_case(fd, gone, NULL, 0, NOT_FOUND, "free after free");
	free_case(fd, blease, NULL, 0, NOT_FOUND, "free another session's lease");
	one[0] = UINT32_MAX;
	free_case(fd, lease, one, 1, PAGE_BAD, "free page id max");
	one[0] = NEG32;
	free_case(fd, lease, one, 1, PAGE_BAD, "free page id -5");
	one[0] = 64;
	free_case(fd, lease, one, 1, PAGE_BAD, "free page id one past the tier");
	free_case(fd, lease, bpages, 1, PAGE_BAD, "free another session's page");
	two[0] = pages[0];
	two[1] = bpages[1];
	free_case(fd, lease, two, 2, PAGE_BAD, "free own page plus another session's");
	two[0] = two[1] = pages[1];
	free_case(fd, lease, two, 2, PAGE_BAD, "free the same page twice in one call");
	{
		uint32_t five[5] = { pages[0], pages[1], pages[2], pages[3], pages[0] };

		free_case(fd, lease, five, 5, PAGE_BAD, "free more pages than the lease holds");
	}

	insert_case(fd, 0, NULL, 0, 16, NOT_FOUND, "insert all zero (lease 0)");
	insert_case(fd, UINT64_MAX, pages, 1, 16, NOT_FOUND, "insert lease max");
	insert_case(fd, gone, pages, 1, 16, NOT_FOUND, "insert freed lease");
	insert_case(fd, blease, bpages, 1, 16, NOT_FOUND, "insert another session's lease");
	one[0] = UINT32_MAX;
	insert_case(fd, lease, one, 1, 16, ANY_TYPED, "insert page id max");
	insert_case(fd, lease, bpages, 1, 16, ANY_TYPED, "insert another session's page");
	{
		uint32_t five[5] = { pages[0], pages[1], pages[2], pages[3], pages[0] };

		insert_case(fd, lease, five, 5, 64, INVALID, "insert more pages than the lease");
	}

	/* The lease is intact: freeing it whole returns all 4 pages. */
	{
		Kvpool__Request q = KVPOOL__REQUEST__INIT;
		Kvpool__FreeReq a = KVPOOL__FREE_REQ__INIT;
		Kvpool__Response *r = NULL;

		a.lease_id = lease;
		q.call_case = KVPOOL__REQUEST__CALL_FREE;
		q.free = &a;
		CU_ASSERT_EQUAL(rcall(fd, &q, &r), 0);
		if (r) {
			CU_ASSERT_EQUAL(r->result_case, KVPOOL__RESPONSE__RESULT_FREE);
			if (r->result_case == KVPOOL__RESPONSE__RESULT_FREE)
				CU_ASSERT_EQUAL(r->free->freed_pages, 4);
			kvpool__response__free_unpacked(r, NULL);
		}
		mark();
		free_case(fd, lease, NULL, 0, NOT_FOUND, "double free");
	}
	/* The bystander's lease is untouched too. */
	CU_ASSERT_EQUAL(kvp_lease_free(bp, blease, NULL, 0, &e), 0);
	kvp_client_close(b);
	close(fd);
}

static void test_match_release_load_detach_unknown(void)
{
	int fd = raw_session(), fresh = raw_session();

	CU_ASSERT_FATAL(fd >= 0 && fresh >= 0);
	CU_ASSERT_EQUAL_FATAL(raw_attach(fd, "small"), 0);
	mark();
	id_case(fd, KVPOOL__REQUEST__CALL_MATCH, 1, NOT_FOUND, "match pool not attached");
	id_case(fd, KVPOOL__REQUEST__CALL_MATCH, UINT32_MAX, NO_POOL, "match pool_id max");
	id_case(fd, KVPOOL__REQUEST__CALL_MATCH, NEG32, NO_POOL, "match pool_id -5");
	id_case(fresh, KVPOOL__REQUEST__CALL_MATCH, 0, NOT_FOUND, "match all zero, not attached");
	id_case(fd, KVPOOL__REQUEST__CALL_RELEASE, 0, NOT_FOUND, "release lock 0");
	id_case(fd, KVPOOL__REQUEST__CALL_RELEASE, UINT64_MAX, NOT_FOUND, "release lock max");
	id_case(fd, KVPOOL__REQUEST__CALL_RELEASE, NEG64, NOT_FOUND, "release lock -5");
	id_case(fd, KVPOOL__REQUEST__CALL_RELEASE, 12345, NOT_FOUND, "release unknown lock");
	id_case(fd, KVPOOL__REQUEST__CALL_RELEASE, 12345, NOT_FOUND, "double release");
	id_case(fd, KVPOOL__REQUEST__CALL_LOAD, 0, NOT_FOUND, "load lock 0");
	id_case(fd, KVPOOL__REQUEST__CALL_LOAD, UINT64_MAX, NOT_FOUND, "load lock max");
	id_case(fd, KVPOOL__REQUEST__CALL_LOAD, NEG64, NOT_FOUND, "load lock -5");
	id_case(fresh, KVPOOL__REQUEST__CALL_DETACH, 0, NOT_FOUND, "detach all zero, not attached");
	id_case(fd, KVPOOL__REQUEST__CALL_DETACH, 1, NOT_FOUND, "detach pool not attached");
	id_case(fd, KVPOOL__REQUEST__CALL_DETACH, UINT32_MAX, NO_POOL, "detach pool_id max");
	id_case(fd, KVPOOL__REQUEST__CALL_DETACH, NEG32, NO_POOL, "detach pool_id -5");
	id_case(fd, KVPOOL__REQUEST__CALL_DETACH, 16, NO_POOL, "detach pool_id 16");
	close(fresh);
	close(fd);
}

static void test_attach_evict_flush_unknown_pool(void)
{
	int fd = raw_session();
	Kvpool__Request q = KVPOOL__REQUEST__INIT;
	Kvpool__AttachReq at = KVPOOL__ATTACH_REQ__INIT;
	Kvpool__Geometry g = KVPOOL__GEOMETRY__INIT;
	Kvpool__EvictReq ev = KVPOOL__EVICT_REQ__INIT;
	Kvpool__FlushReq fl = KVPOOL__FLUSH_REQ__INIT;
	static char longname[8192];
	/* This test process is root or the daemon's uid, so admin: the pool is what is wrong. */
	const int *admin_no_pool = NO_POOL;

	CU_ASSERT_FATAL(fd >= 0);
	mark();
	q.call_case = KVPOOL__REQUEST__CALL_ATTACH;
	q.attach = &at;
	at.pool = (char *)"";
	bad(fd, &q, NO_POOL, "attach all zero (empty name)");
	at.pool = (char *)"nope";
	bad(fd, &q, NO_POOL, "attach unknown pool");
	memset(longname, 'x', sizeof(longname) - 1);
	at.pool = longname;
	bad(fd, &q, NO_POOL, "attach 8 KiB pool name");
	at.pool = (char *)"small";
	at.expected = &g;
	g.layers = UINT32_MAX;
	bad(fd, &q, (const int[]){ KVP_E_GEOMETRY_MISMATCH, END }, "attach geometry layers max");
	g.layers = 0;
	g.page_tokens = NEG32;
	bad(fd, &q, (const int[]){ KVP_E_GEOMETRY_MISMATCH, END }, "attach page_tokens -5");

	q.call_case = KVPOOL__REQUEST__CALL_EVICT;
	q.evict = &ev;
	ev.pool = (char *)"";
	bad(fd, &q, INVALID, "evict all zero (pool 0, zero tokens)");
	ev.tokens = 16;
	ev.pool = (char *)"nope";
	bad(fd, &q, admin_no_pool, "evict unknown pool name");
	ev.pool = (char *)"";
	ev.pool_id = UINT32_MAX;
	bad(fd, &q, admin_no_pool, "evict pool_id max");
	ev.pool_id = NEG32;
	bad(fd, &q, admin_no_pool, "evict pool_id -5");
	ev.pool_id = 0;
	ev.tier = (Kvpool__Tier)7;
	bad(fd, &q, INVALID, "evict tier 7");
	ev.pool_id = 1;
	ev.tier = KVPOOL__TIER__HOST;
	bad(fd, &q, INVALID, "evict a tier the pool lacks");

	q.call_case = KVPOOL__REQUEST__CALL_FLUSH;
	q.flush = &fl;
	fl.pool = (char *)"";
	bad(fd, &q, admin_no_pool, "flush all zero (empty name)");
	fl.pool = (char *)"nope";
	bad(fd, &q, admin_no_pool, "flush unknown pool");
	(void)NO_POOL_OR_NF;
	close(fd);
}

static void test_hello_twice_is_protocol(void)
{
	int fd = raw_session();
	Kvpool__Request q = KVPOOL__REQUEST__INIT;
	Kvpool__PingReq p = KVPOOL__PING_REQ__INIT;
	Kvpool__HelloReq h = KVPOOL__HELLO_REQ__INIT;

	CU_ASSERT_FATAL(fd >= 0);
	mark();
	h.protocol_version = KVP_PROTOCOL_VERSION;
	q.call_case = KVPOOL__REQUEST__CALL_HELLO;
	q.hello = &h;
	bad(fd, &q, (const int[]){ KVP_E_PROTOCOL, END }, "hello twice");
	q.call_case = KVPOOL__REQUEST__CALL_PING;
	q.ping = &p;
	p.nonce = UINT64_MAX;
	{
		Kvpool__Response *r = NULL;

		/* Whether the session survives is the daemon's choice; it must answer or close. */
		int code = rcall(fd, &q, &r);

		CU_ASSERT(code == 0 || (code == -1 && h_raw_closed(fd, 1000)));
		if (r) {
			CU_ASSERT_EQUAL(r->ping->nonce, UINT64_MAX);
			kvpool__response__free_unpacked(r, NULL);
		}
	}
	close(fd);
}

/* Protocol 0 and any requirement the daemon lacks are refused and close the connection; newer
 * protocols that require nothing new are served. */
static void test_version_skew_is_version(void)
{
	static const struct {
		uint32_t version;
		uint64_t required;
		int code;
	} cases[] = {
		{ 0, 0, KVP_E_VERSION },
		{ KVP_PROTOCOL_VERSION + 1, UINT64_C(1) << 63, KVP_E_VERSION },
		{ UINT32_MAX, UINT64_MAX, KVP_E_VERSION },
		{ NEG32, NEG64, KVP_E_VERSION },
		{ KVP_PROTOCOL_VERSION + 1, 0, 0 },
		{ UINT32_MAX, KVP_CAP_ALL, 0 },
		{ NEG32, 0, 0 },
	};
	struct kvp_status after = { .struct_size = sizeof(after) };

	mark();
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		int fd = h_raw_connect(g_d.sock);

		CU_ASSERT_FATAL(fd >= 0);
		g_cases++;
		CU_ASSERT_EQUAL(raw_hello_caps(fd, cases[i].version, UINT64_MAX, cases[i].required),
				cases[i].code);
		if (cases[i].code)
			CU_ASSERT(h_raw_closed(fd, 3000));
		close(fd);
	}
	usleep(100000);
	snap(&after);
	CU_ASSERT(same_state(&g_snap, &after));
}

static void test_random_bytes_after_hello_closes_only_it(void)
{
	struct kvp_error e;
	struct kvp_client *by = kvp_client_connect(g_d.sock, "bystander", &e);
	struct kvp_pool *bp = by ? kvp_pool_attach(by, "small", NULL, &e) : NULL;
	uint8_t junk[4 + 64];
	uint64_t lease;
	uint32_t pg[2];
	struct kvp_status after = { .struct_size = sizeof(after) };
	int fd = raw_session();
	Kvpool__Response *r;

	CU_ASSERT_PTR_NOT_NULL_FATAL(bp);
	CU_ASSERT_FATAL(fd >= 0);
	CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc(bp, KVP_TIER_DEVICE, 2, &lease, pg, &e), 0);
	mark();
	srand(42);
	junk[0] = 64;
	junk[1] = junk[2] = junk[3] = 0;
	junk[4] = 0x0f; /* field 1 with wire type 7: no Request decodes from this */
	for (int i = 5; i < (int)sizeof(junk); i++)
		junk[i] = (uint8_t)rand();
	g_cases++;
	CU_ASSERT_EQUAL(send(fd, junk, sizeof(junk), MSG_NOSIGNAL), (ssize_t)sizeof(junk));
	r = h_raw_recv(fd, 3000);
	CU_ASSERT_PTR_NOT_NULL(r);
	if (r) {
		CU_ASSERT_EQUAL(raw_code(r), KVP_E_PROTOCOL);
		kvpool__response__free_unpacked(r, NULL);
	}
	CU_ASSERT(h_raw_closed(fd, 3000));
	close(fd);
	CU_ASSERT_EQUAL(kvp_client_ping(by, &e), 0);
	usleep(100000);
	snap(&after);
	CU_ASSERT_EQUAL(after.sessions + 1, g_snap.sessions); /* only the hostile one went */
	CU_ASSERT_EQUAL(after.pools[0].tiers[0].leased_tokens, 32);
	CU_ASSERT_EQUAL(kvp_lease_free(bp, lease, NULL, 0, &e), 0);
	kvp_client_close(by);
}

static void test_half_frame_and_silent_connection_dropped(void)
{
	int half = raw_session(), silent = h_raw_connect(g_d.sock);
	uint8_t part[4 + 10] = { 100, 0, 0, 0, 0x08, 0x01 };
	uint64_t t0, t_half = 0, t_silent = 0, end;
	struct kvp_status mid = { .struct_size = sizeof(mid) },
			  after = { .struct_size = sizeof(after) };

	CU_ASSERT_FATAL(half >= 0 && silent >= 0);
	g_cases += 2;
	CU_ASSERT_EQUAL(send(half, part, sizeof(part), MSG_NOSIGNAL), (ssize_t)sizeof(part));
	t0 = h_now_ms();
	usleep(200000);
	snap(&mid);
	end = t0 + 9000;
	while ((!t_half || !t_silent) && h_now_ms() < end) {
		struct pollfd p[2] = { { .fd = half, .events = POLLIN },
				       { .fd = silent, .events = POLLIN } };
		char buf[256];

		if (poll(p, 2, 200) <= 0)
			continue;
		if (!t_half && (p[0].revents & (POLLIN | POLLHUP)) &&
		    recv(half, buf, sizeof(buf), 0) <= 0)
			t_half = h_now_ms();
		if (!t_silent && (p[1].revents & (POLLIN | POLLHUP)) &&
		    recv(silent, buf, sizeof(buf), 0) <= 0)
			t_silent = h_now_ms();
	}
	printf("\n    half-sent frame dropped after %lu ms, silent connection after %lu ms\n",
	       (unsigned long)(t_half ? t_half - t0 : 0),
	       (unsigned long)(t_silent ? t_silent - t0 : 0));
	CU_ASSERT(t_half && t_half - t0 >= 4500 && t_half - t0 <= 8000);
	/* hello_timeout_ms: 2000 by default */
	CU_ASSERT(t_silent && t_silent - t0 >= 1500 && t_silent - t0 <= 4500);
	usleep(100000);
	snap(&after);
	CU_ASSERT_EQUAL(after.sessions + 2, mid.sessions);
	CU_ASSERT(h_log_contains(&g_d, "half-sent frame"));
	CU_ASSERT(h_log_contains(&g_d, "no Hello"));
	close(half);
	close(silent);
}

/* Extend by UINT32_MAX pages: a typed refusal, and no stall of everyone else meanwhile. */
static void test_extend_huge_pages_no_stall(void)
{
	struct kvp_error e;
	struct kvp_client *by = kvp_client_connect(g_d.sock, "bystander", &e);
	Kvpool__Request q = KVPOOL__REQUEST__INIT;
	Kvpool__ExtendReq a = KVPOOL__EXTEND_REQ__INIT;
	Kvpool__Response *r;
	uint32_t pages[1];
	uint64_t lease, t0, ping_ms;
	int fd = raw_session();

	CU_ASSERT_PTR_NOT_NULL_FATAL(by);
	CU_ASSERT_FATAL(fd >= 0);
	kvp_client_set_timeout(by, 30000);
	CU_ASSERT_EQUAL_FATAL(raw_attach(fd, "small"), 0);
	lease = raw_alloc(fd, 0, 1, pages);
	CU_ASSERT_FATAL(lease != 0);
	a.lease_id = lease;
	a.pages = UINT32_MAX;
	q.call_case = KVPOOL__REQUEST__CALL_EXTEND;
	q.extend = &a;
	q.id = 7;
	g_cases++;
	t0 = h_now_ms();
	CU_ASSERT_EQUAL(h_raw_send_request(fd, &q), 0);
	usleep(20000);
	CU_ASSERT_EQUAL(kvp_client_ping(by, &e), 0);
	ping_ms = h_now_ms() - t0;
	r = h_raw_recv(fd, 30000);
	printf("\n    extend by UINT32_MAX pages: reply after %lu ms, bystander ping after %lu ms\n",
	       (unsigned long)(h_now_ms() - t0), (unsigned long)ping_ms);
	CU_ASSERT_PTR_NOT_NULL(r);
	if (r) {
		CU_ASSERT(in(raw_code(r), TOO_BIG));
		kvpool__response__free_unpacked(r, NULL);
	}
	CU_ASSERT(ping_ms < 1000);
	kvp_client_close(by);
	close(fd);
}

static void test_zz_daemon_unharmed_and_count(void)
{
	struct kvp_error e;
	struct kvp_client *c = kvp_client_connect(g_d.sock, "after", &e);
	struct kvp_pool *p = c ? kvp_pool_attach(c, "small", NULL, &e) : NULL;
	struct kvp_status st = { .struct_size = sizeof(st) };
	uint32_t pages[64];
	uint64_t lease;

	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	usleep(200000); /* sessions closed by earlier tests are gone */
	/* Every page is still there to lease. */
	CU_ASSERT_EQUAL(kvp_lease_alloc(p, KVP_TIER_DEVICE, 64, &lease, pages, &e), 0);
	CU_ASSERT_EQUAL(kvp_lease_free(p, lease, NULL, 0, &e), 0);
	CU_ASSERT_EQUAL(kvp_client_status(c, &st, &e), 0);
	CU_ASSERT_EQUAL(st.sessions, 2); /* observer and this one */
	CU_ASSERT_EQUAL(st.pools[0].tiers[0].leased_tokens, 0);
	CU_ASSERT_EQUAL(st.pools[0].tiers[0].free_tokens, st.pools[0].tiers[0].total_tokens);
	kvp_client_close(c);
	printf("\n    hostile: %u bad inputs tried\n", g_cases);
	CU_ASSERT(g_cases >= 70);
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_alloc_fields_zero_max_negative),
		H_TEST(test_extend_free_insert_bad_ids_and_pages),
		H_TEST(test_match_release_load_detach_unknown),
		H_TEST(test_attach_evict_flush_unknown_pool),
		H_TEST(test_hello_twice_is_protocol),
		H_TEST(test_version_skew_is_version),
		H_TEST(test_random_bytes_after_hello_closes_only_it),
		H_TEST(test_half_frame_and_silent_connection_dropped),
		H_TEST(test_extend_huge_pages_no_stall),
		H_TEST(test_zz_daemon_unharmed_and_count),
	};

	return H_RUN_SUITE("hostile", init_suite, clean_suite, tests);
}
