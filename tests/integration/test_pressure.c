/* test_pressure.c - pressure notices against a real kvpoold: a session that asked is told when a
 * tier's free pages fall below the watermark, before any eviction, and again when they
 * recover; a session that never reads costs one pending notice (the newer states replace it),
 * is not dropped, and the others are served meanwhile; the pool's rate limit holds; sessions
 * that did not ask (or cannot take events, or attach a pool without a watermark) get nothing. */
#include <CUnit/Basic.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "eng.h"
#include "harness.h"
#include "kvpool.h"
#include "kvpool_caps.h"

/* 64 device and 64 host pages of 4 tokens each pool; watermark 16 pages. Pool "p": no rate
 * limit; "q": 600 ms between two notices; "n": no watermark. */
#define POOL(name, extra)                                                                          \
	"[pool." name "]\nlayers = 2\nkv_heads = 1\nhead_dim = 8\ndtype = fp16\n"                  \
	"page_tokens = 4\ndevice = sim\ndevice_capacity = 256t\nhost_capacity = 256t\n"            \
	"mlock = off\n" extra
static const char *const g_conf =
	"[daemon]\nkeepalive_ms = 600000\n" POOL("p", "pressure_watermark = 25%\n"
						      "pressure_interval_ms = 0\n")
		POOL("q", "pressure_watermark = 64t\npressure_interval_ms = 600\n") POOL("n", "");
enum { PT = 4, PAGES = 64, WM = 16, GAP_MS = 600 };

static struct daemon g_d;

static int init_suite(void)
{
	return h_daemon_start(&g_d, g_conf, NULL);
}

static int clean_suite(void)
{
	return h_daemon_finish(&g_d);
}

/* An engine on pool; with notices, connected with KVP_CLIENT_F_PRESSURE (and caps offered). */
static int open_eng(struct h_eng *e, const char *pool, uint64_t caps, uint64_t flags)
{
	struct kvp_client_opts o = { .struct_size = sizeof(o),
				     .name = "pressure-test",
				     .capabilities = caps,
				     .flags = flags };
	struct kvp_error err;

	e->c = kvp_client_connect_opts(g_d.sock, &o, &err);
	e->p = e->c ? kvp_pool_attach(e->c, pool, NULL, &err) : NULL;
	return e->p ? 0 : -1;
}

static int listener(struct h_eng *e, const char *pool)
{
	return open_eng(e, pool, KVP_CAP_ALL, KVP_CLIENT_F_PRESSURE);
}

/* The next pressure notice of c within ms: 1 with *n filled, 0 when none came, -1 when another
 * kind of event or an undecodable one came. */
static int next_notice(struct kvp_client *c, int ms, struct kvp_pressure *n)
{
	uint8_t buf[4096];
	struct kvp_event ev = { .struct_size = sizeof(ev),
				.payload = buf,
				.payload_cap = sizeof(buf) };
	struct kvp_error err;
	uint64_t end = h_now_ms() + (uint64_t)ms;
	int fd = kvp_client_event_fd(c);

	if (fd < 0)
		return -1;
	for (;;) {
		struct pollfd pf = { .fd = fd, .events = POLLIN };
		int r = kvp_client_event_next(c, &ev, &err);
		uint64_t now;

		if (r == 0) {
			n->struct_size = sizeof(*n);
			return kvp_pressure_decode(&ev, n, &err) == 0 ? 1 : -1;
		}
		if (r != -KVP_E_AGAIN)
			return -1;
		now = h_now_ms();
		if (now >= end)
			return 0;
		poll(&pf, 1, (int)(end - now));
	}
}

static struct kvp_tier_status tier_of(const char *pool, int tier)
{
	struct h_eng e;
	struct kvp_status *st = calloc(1, sizeof(*st));
	struct kvp_tier_status t = { 0 };
	struct kvp_error err;

	CU_ASSERT_EQUAL_FATAL(open_eng(&e, pool, 0, 0), 0);
	st->struct_size = sizeof(*st);
	CU_ASSERT_EQUAL(kvp_client_status(e.c, st, &err), 0);
	for (uint32_t i = 0; i < st->n_pools; i++)
		if (!strcmp(st->pools[i].name, pool))
			t = st->pools[i].tiers[tier];
	free(st);
	kvp_client_close(e.c);
	return t;
}

static uint64_t counter_of(const char *pool, const char *name)
{
	struct h_eng e;
	struct kvp_status *st = calloc(1, sizeof(*st));
	struct kvp_error err;
	uint64_t v = UINT64_MAX;

	CU_ASSERT_EQUAL_FATAL(open_eng(&e, pool, 0, 0), 0);
	st->struct_size = sizeof(*st);
	CU_ASSERT_EQUAL(kvp_client_status(e.c, st, &err), 0);
	for (uint32_t i = 0; i < st->n_pools; i++)
		for (uint32_t k = 0;
		     !strcmp(st->pools[i].name, pool) && k < st->pools[i].n_counters; k++)
			if (!strcmp(st->pools[i].counters[k].name, name))
				v = st->pools[i].counters[k].value;
	free(st);
	kvp_client_close(e.c);
	return v;
}

/* Leases n device pages of e's pool as one lease. */
static uint64_t lease(struct h_eng *e, uint32_t n)
{
	uint32_t pages[PAGES];
	uint64_t id = 0;
	struct kvp_error err;

	CU_ASSERT_EQUAL(kvp_lease_alloc(e->p, KVP_TIER_DEVICE, n, &id, pages, &err), 0);
	return id;
}

static void unlease(struct h_eng *e, uint64_t id)
{
	struct kvp_error err;

	CU_ASSERT(kvp_lease_free(e->p, id, NULL, 0, &err) >= 0);
}

/* Caches npages pages of sequence seq through e (leased, inserted, lease freed). */
static void publish(struct h_eng *e, uint32_t seq, uint32_t npages)
{
	uint32_t tok[PAGES * PT], pages[PAGES];
	uint64_t id, fresh = 0;
	struct kvp_error err;

	for (uint32_t i = 0; i < npages * PT; i++)
		tok[i] = seq * 10000 + i;
	CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc(e->p, KVP_TIER_DEVICE, npages, &id, pages, &err), 0);
	CU_ASSERT_EQUAL(kvp_cache_insert(e->p, id, 0, tok, npages * PT, 0, pages, npages, &fresh,
					 &err),
			0);
	CU_ASSERT_EQUAL(fresh, (uint64_t)npages * PT);
	unlease(e, id);
}

static void flush(const char *pool)
{
	struct h_eng e;
	struct kvp_error err;

	CU_ASSERT_EQUAL_FATAL(open_eng(&e, pool, 0, 0), 0);
	CU_ASSERT_EQUAL(kvp_admin_flush(e.c, pool, NULL, &err), 0);
	kvp_client_close(e.c);
}

static void test_notice_before_eviction(void)
{
	struct h_eng a, w;
	struct kvp_pressure n;
	uint64_t l1, l2;

	CU_ASSERT_EQUAL_FATAL(listener(&a, "p"), 0);
	CU_ASSERT_EQUAL_FATAL(open_eng(&w, "p", KVP_CAP_ALL, 0), 0);
	CU_ASSERT_EQUAL(kvp_pool_pressure_notices(a.p), 1);
	CU_ASSERT_EQUAL(kvp_pool_pressure_notices(w.p), 0);
	CU_ASSERT_EQUAL(kvp_pool_pressure_watermark(a.p, KVP_TIER_DEVICE), WM * PT);
	publish(&w, 1, 40); /* 40 cached, 24 free */
	CU_ASSERT_EQUAL(next_notice(a.c, 300, &n), 0);
	l1 = lease(&w, 10); /* 14 free: below the watermark, nothing evicted yet */
	CU_ASSERT_EQUAL_FATAL(next_notice(a.c, 2000, &n), 1);
	CU_ASSERT_EQUAL(n.recovered, 0);
	CU_ASSERT_EQUAL(n.tier, KVP_TIER_DEVICE);
	CU_ASSERT_STRING_EQUAL(n.pool, "p");
	CU_ASSERT_EQUAL(n.pool_id, kvp_pool_id(a.p));
	CU_ASSERT_EQUAL(n.free_tokens, 14 * PT);
	CU_ASSERT_EQUAL(n.evictable_tokens, 40 * PT);
	CU_ASSERT_EQUAL(n.watermark_tokens, WM * PT);
	CU_ASSERT_EQUAL(n.total_tokens, PAGES * PT);
	CU_ASSERT_EQUAL(n.reserved_tokens, 0);
	CU_ASSERT_EQUAL(n.coalesced, 0);
	CU_ASSERT_EQUAL(n.seq % 2, 1);
	CU_ASSERT_EQUAL(tier_of("p", KVP_TIER_DEVICE).evicted_tokens, 0);
	CU_ASSERT_EQUAL(tier_of("p", KVP_TIER_DEVICE).cached_tokens, 40 * PT);
	/* now eviction starts: the notice came before it */
	l2 = lease(&w, 20);
	CU_ASSERT_EQUAL(tier_of("p", KVP_TIER_DEVICE).evicted_tokens, 6 * PT);
	CU_ASSERT_EQUAL(next_notice(a.c, 300, &n), 0); /* still under: no new notice */
	unlease(&w, l1);
	unlease(&w, l2);
	kvp_client_close(w.c);
	kvp_client_close(a.c);
	flush("p");
}

/* One Alloc that goes from above the watermark straight into eviction, and one that fails with
 * OUT_OF_CAPACITY: the subscriber (here the caller itself) has the notice before the Alloc's
 * reply (it is read with the reply, no wait), with the figures from before the eviction. The
 * tier stays under until the next tick, then recovers. */
static void test_notice_before_eviction_in_one_alloc(void)
{
	struct h_eng a, w;
	struct kvp_pressure n;
	uint32_t pages[PAGES];
	uint64_t l1, l2, evicted = tier_of("p", KVP_TIER_DEVICE).evicted_tokens;
	struct kvp_error err;

	CU_ASSERT_EQUAL_FATAL(listener(&a, "p"), 0);
	CU_ASSERT_EQUAL_FATAL(open_eng(&w, "p", KVP_CAP_ALL, 0), 0);
	publish(&w, 2, 40); /* 40 cached, 24 free: above the watermark */
	CU_ASSERT_EQUAL(next_notice(a.c, 300, &n), 0);
	l1 = lease(&a, 30); /* needs 6 evicted */
	CU_ASSERT_EQUAL(tier_of("p", KVP_TIER_DEVICE).evicted_tokens - evicted, 6 * PT);
	CU_ASSERT_EQUAL_FATAL(next_notice(a.c, 0, &n), 1); /* it came before the reply */
	CU_ASSERT_EQUAL(n.recovered, 0);
	CU_ASSERT_EQUAL(n.free_tokens, 24 * PT);      /* nothing taken yet */
	CU_ASSERT_EQUAL(n.evictable_tokens, 40 * PT); /* nothing evicted yet */
	unlease(&a, l1);			      /* 30 free: recovers */
	CU_ASSERT_EQUAL_FATAL(next_notice(a.c, 2000, &n), 1);
	CU_ASSERT_EQUAL(n.recovered, 1);
	flush("p");
	/* nothing evictable: OUT_OF_CAPACITY, told first */
	l2 = lease(&w, 40); /* 24 free */
	CU_ASSERT_EQUAL(next_notice(a.c, 300, &n), 0);
	CU_ASSERT_EQUAL(kvp_lease_alloc(a.p, KVP_TIER_DEVICE, 30, &l1, pages, &err),
			-KVP_E_OUT_OF_CAPACITY);
	CU_ASSERT_EQUAL_FATAL(next_notice(a.c, 0, &n), 1);
	CU_ASSERT_EQUAL(n.recovered, 0);
	CU_ASSERT_EQUAL(n.free_tokens, 24 * PT);
	CU_ASSERT_EQUAL(n.evictable_tokens, 0);
	/* 24 free is above the watermark: recovered at the next tick */
	CU_ASSERT_EQUAL_FATAL(next_notice(a.c, 2000, &n), 1);
	CU_ASSERT_EQUAL(n.recovered, 1);
	CU_ASSERT_EQUAL(n.free_tokens, 24 * PT);
	unlease(&w, l2);
	kvp_client_close(w.c);
	kvp_client_close(a.c);
}

static void test_recovery_notice(void)
{
	struct h_eng a, w;
	struct kvp_pressure n;
	uint64_t l;
	uint64_t seq;

	CU_ASSERT_EQUAL_FATAL(listener(&a, "p"), 0);
	CU_ASSERT_EQUAL_FATAL(open_eng(&w, "p", KVP_CAP_ALL, 0), 0);
	l = lease(&w, PAGES - WM + 1); /* 15 free */
	CU_ASSERT_EQUAL_FATAL(next_notice(a.c, 2000, &n), 1);
	CU_ASSERT_EQUAL(n.recovered, 0);
	CU_ASSERT_EQUAL(n.free_tokens, (WM - 1) * PT);
	seq = n.seq;
	unlease(&w, l); /* all free again */
	CU_ASSERT_EQUAL_FATAL(next_notice(a.c, 2000, &n), 1);
	CU_ASSERT_EQUAL(n.recovered, 1);
	CU_ASSERT_EQUAL(n.free_tokens, PAGES * PT);
	CU_ASSERT_EQUAL(n.seq, seq + 1);
	CU_ASSERT_EQUAL(n.coalesced, 0);
	/* exactly at the watermark is not under it */
	l = lease(&w, PAGES - WM);
	CU_ASSERT_EQUAL(next_notice(a.c, 300, &n), 0);
	unlease(&w, l);
	kvp_client_close(w.c);
	kvp_client_close(a.c);
}

/* A raw session: Hello with events, Attach p with notices, the reply read; then it reads
 * nothing until told. */
static int raw_listener(const char *pool)
{
	Kvpool__Request q = KVPOOL__REQUEST__INIT;
	Kvpool__HelloReq h = KVPOOL__HELLO_REQ__INIT;
	Kvpool__AttachReq a = KVPOOL__ATTACH_REQ__INIT;
	Kvpool__Response *m;
	int fd = h_raw_connect(g_d.sock), ok;

	if (fd < 0)
		return -1;
	h.protocol_version = 1;
	h.client_name = "never-reads";
	h.capabilities = KVP_CAP_EVENTS;
	q.id = 1;
	q.call_case = KVPOOL__REQUEST__CALL_HELLO;
	q.hello = &h;
	if (h_raw_send_request(fd, &q) < 0 || !(m = h_raw_recv(fd, 2000)))
		goto fail;
	ok = m->result_case == KVPOOL__RESPONSE__RESULT_HELLO &&
	     (m->hello->capabilities & KVP_CAP_EVENTS);
	kvpool__response__free_unpacked(m, NULL);
	if (!ok)
		goto fail;
	a.pool = (char *)pool;
	a.pressure_notices = 1;
	q.id = 2;
	q.call_case = KVPOOL__REQUEST__CALL_ATTACH;
	q.attach = &a;
	if (h_raw_send_request(fd, &q) < 0 || !(m = h_raw_recv(fd, 2000)))
		goto fail;
	ok = m->result_case == KVPOOL__RESPONSE__RESULT_ATTACH && m->attach->pressure_notices;
	kvpool__response__free_unpacked(m, NULL);
	if (ok)
		return fd;
fail:
	close(fd);
	return -1;
}

static void test_never_reader_holds_one_pending(void)
{
	struct h_eng a, w;
	struct kvp_pressure n;
	struct kvp_session_info si[16] = { { .struct_size = sizeof(si[0]) } };
	struct kvp_error err;
	Kvpool__Response *m;
	uint64_t c0 = counter_of("p", "pressure_coalesced");
	uint64_t s0 = counter_of("p", "pressure_notices");
	uint64_t seq0 = 0;
	int fd, cycles = 5, got = 0, listed = 0, nsess;

	CU_ASSERT_EQUAL_FATAL(listener(&a, "p"), 0);
	fd = raw_listener("p");
	CU_ASSERT_FATAL(fd >= 0);
	CU_ASSERT_EQUAL_FATAL(open_eng(&w, "p", KVP_CAP_ALL, 0), 0);
	for (int i = 0; i < cycles; i++) {
		uint64_t l = lease(&w, PAGES - 4);

		got += next_notice(a.c, 2000, &n) == 1 && !n.recovered;
		if (i == 0)
			seq0 = n.seq;
		unlease(&w, l);
		got += next_notice(a.c, 2000, &n) == 1 && n.recovered;
		CU_ASSERT_EQUAL(n.coalesced, 0); /* the reader missed nothing */
	}
	CU_ASSERT_EQUAL(got, 2 * cycles);
	CU_ASSERT_EQUAL(n.seq, seq0 + 2 * cycles - 1);
	/* The silent session is still there, and kvpoold holds its last state only: the 4
	 * recoveries it could not send were each replaced by the pressure that followed. */
	nsess = kvp_session_list(w.c, si, 16, &err);
	for (int i = 0; i < nsess && i < 16; i++)
		listed += !strcmp(si[i].name, "never-reads");
	CU_ASSERT_EQUAL(listed, 1);
	CU_ASSERT_EQUAL(counter_of("p", "pressure_coalesced") - c0, (uint64_t)cycles - 1);
	/* sent: the reader's 10, the silent one's first */
	CU_ASSERT_EQUAL(counter_of("p", "pressure_notices") - s0, 2 * (uint64_t)cycles + 1);
	/* It reads now: the first notice, then (once read) the latest state, and nothing else. */
	m = h_raw_recv(fd, 2000);
	CU_ASSERT_PTR_NOT_NULL_FATAL(m);
	CU_ASSERT_EQUAL(m->id, 0);
	CU_ASSERT_EQUAL_FATAL(m->result_case, KVPOOL__RESPONSE__RESULT_PRESSURE);
	CU_ASSERT_EQUAL(m->pressure->recovered, 0);
	CU_ASSERT_EQUAL(m->pressure->seq, seq0);
	kvpool__response__free_unpacked(m, NULL);
	m = h_raw_recv(fd, 2000);
	CU_ASSERT_PTR_NOT_NULL_FATAL(m);
	CU_ASSERT_EQUAL_FATAL(m->result_case, KVPOOL__RESPONSE__RESULT_PRESSURE);
	CU_ASSERT_EQUAL(m->pressure->recovered, 1);
	CU_ASSERT_EQUAL(m->pressure->seq, seq0 + 2 * cycles - 1);
	CU_ASSERT_EQUAL(m->pressure->coalesced, (uint32_t)cycles - 1);
	kvpool__response__free_unpacked(m, NULL);
	m = h_raw_recv(fd, 400);
	CU_ASSERT_PTR_NULL(m);
	if (m)
		kvpool__response__free_unpacked(m, NULL);
	close(fd);
	kvp_client_close(w.c);
	kvp_client_close(a.c);
}

static void test_rate_limit(void)
{
	struct h_eng a, w;
	struct kvp_pressure n;
	uint64_t l, t0, seq;

	CU_ASSERT_EQUAL_FATAL(listener(&a, "q"), 0);
	CU_ASSERT_EQUAL_FATAL(open_eng(&w, "q", KVP_CAP_ALL, 0), 0);
	CU_ASSERT_EQUAL(kvp_pool_pressure_watermark(a.p, KVP_TIER_DEVICE), WM * PT);
	l = lease(&w, PAGES - 4);
	CU_ASSERT_EQUAL_FATAL(next_notice(a.c, 2000, &n), 1);
	t0 = h_now_ms();
	CU_ASSERT_EQUAL(n.recovered, 0);
	seq = n.seq;
	/* recovered, under again, recovered: within the pool's interval */
	unlease(&w, l);
	l = lease(&w, PAGES - 4);
	unlease(&w, l);
	CU_ASSERT_EQUAL(next_notice(a.c, GAP_MS / 2, &n), 0);
	CU_ASSERT_EQUAL_FATAL(next_notice(a.c, 3000, &n), 1);
	CU_ASSERT(h_now_ms() - t0 >= GAP_MS - 50);
	CU_ASSERT_EQUAL(n.recovered, 1);
	CU_ASSERT_EQUAL(n.seq, seq + 3);
	CU_ASSERT_EQUAL(n.coalesced, 1);
	CU_ASSERT_EQUAL(next_notice(a.c, 300, &n), 0);
	kvp_client_close(w.c);
	kvp_client_close(a.c);
}

static void test_sessions_that_did_not_ask_get_nothing(void)
{
	struct h_eng a, w, nocaps, other;
	struct kvp_pressure n;
	struct kvp_event ev = { .struct_size = sizeof(ev) };
	struct kvp_error err;
	uint64_t l, l2;

	CU_ASSERT_EQUAL_FATAL(listener(&a, "p"), 0);
	CU_ASSERT_EQUAL_FATAL(open_eng(&w, "p", KVP_CAP_ALL, 0), 0);
	/* asked, but did not offer events in Hello: not granted */
	CU_ASSERT_EQUAL_FATAL(open_eng(&nocaps, "p", 0, KVP_CLIENT_F_PRESSURE), 0);
	CU_ASSERT_EQUAL(kvp_pool_pressure_notices(nocaps.p), 0);
	/* asked, on a pool without a watermark */
	CU_ASSERT_EQUAL_FATAL(listener(&other, "n"), 0);
	CU_ASSERT_EQUAL(kvp_pool_pressure_watermark(other.p, KVP_TIER_DEVICE), 0);
	l = lease(&w, PAGES - 4);
	{
		struct kvp_pool *np = kvp_pool_attach(w.c, "n", NULL, &err);
		uint32_t pages[PAGES];

		CU_ASSERT_PTR_NOT_NULL_FATAL(np);
		CU_ASSERT_EQUAL(kvp_lease_alloc(np, KVP_TIER_DEVICE, PAGES, &l2, pages, &err), 0);
		CU_ASSERT(kvp_lease_free(np, l2, NULL, 0, &err) >= 0);
	}
	CU_ASSERT_EQUAL(next_notice(a.c, 2000, &n), 1);
	unlease(&w, l);
	CU_ASSERT_EQUAL(next_notice(a.c, 2000, &n), 1);
	kvp_client_ping(w.c, &err);
	kvp_client_ping(nocaps.c, &err);
	kvp_client_ping(other.c, &err);
	CU_ASSERT_EQUAL(kvp_client_event_next(w.c, &ev, &err), -KVP_E_AGAIN);
	CU_ASSERT_EQUAL(kvp_client_event_next(nocaps.c, &ev, &err), -KVP_E_AGAIN);
	CU_ASSERT_EQUAL(kvp_client_event_next(other.c, &ev, &err), -KVP_E_AGAIN);
	/* a detached pool sends nothing more */
	CU_ASSERT_EQUAL(kvp_pool_detach(a.p, &err), 0);
	l = lease(&w, PAGES - 4);
	CU_ASSERT_EQUAL(next_notice(a.c, 300, &n), 0);
	unlease(&w, l);
	kvp_client_close(other.c);
	kvp_client_close(nocaps.c);
	kvp_client_close(w.c);
	kvp_client_close(a.c);
}

static void test_decode_refuses_other_events(void)
{
	uint8_t junk[3] = { 1, 2, 3 };
	struct kvp_event ev = { .struct_size = sizeof(ev),
				.type = 11,
				.payload = junk,
				.payload_cap = sizeof(junk),
				.payload_len = sizeof(junk) };
	struct kvp_pressure n = { .struct_size = sizeof(n) };
	struct kvp_error err;

	CU_ASSERT_EQUAL(kvp_pressure_decode(&ev, &n, &err), -KVP_E_INVALID_ARGUMENT);
	ev.type = KVP_EVENT_PRESSURE;
	CU_ASSERT_EQUAL(kvp_pressure_decode(&ev, &n, &err), -KVP_E_PROTOCOL);
	ev.payload_len = 100;
	CU_ASSERT_EQUAL(kvp_pressure_decode(&ev, &n, &err), -KVP_E_BUFFER);
	n.struct_size = 4;
	CU_ASSERT_EQUAL(kvp_pressure_decode(&ev, &n, &err), -KVP_E_INVALID_ARGUMENT);
}

/* kvpool-loadgen on pool p (its demand is four times the pool), with or without
 * --on-pressure; its JSON summary into out. Returns its exit status. */
static int loadgen(int on_pressure, char *out, size_t cap)
{
	const char *lg = getenv("KVPOOL_LOADGEN");
	char cmd[1024];
	size_t n = 0;
	FILE *f;

	snprintf(cmd, sizeof(cmd),
		 "%s --socket %s --pool p --procs 2 --seconds 1 --min-tokens 16 --max-tokens 64 "
		 "--batch 8 --json %s",
		 lg ? lg : "../client/kvpool-loadgen", g_d.sock,
		 on_pressure ? "--on-pressure" : "");
	f = popen(cmd, "r");
	if (!f)
		return -1;
	n = fread(out, 1, cap - 1, f);
	out[n] = 0;
	return pclose(f);
}

static double json_field(const char *json, const char *key)
{
	char pat[64];
	const char *p;

	snprintf(pat, sizeof(pat), "\"%s\":", key);
	p = strstr(json, pat);
	return p ? strtod(p + strlen(pat), NULL) : -1;
}

static void test_loadgen_on_pressure_takes_notices(void)
{
	char out[4096];

	CU_ASSERT_EQUAL_FATAL(loadgen(1, out, sizeof(out)), 0);
	CU_ASSERT(json_field(out, "pressure_notices") > 0);
	CU_ASSERT(json_field(out, "pressure_waits") > 0);
	CU_ASSERT_EQUAL(json_field(out, "mismatches"), 0);
	CU_ASSERT(json_field(out, "requests") > 0);
	CU_ASSERT_EQUAL_FATAL(loadgen(0, out, sizeof(out)), 0);
	CU_ASSERT_EQUAL(json_field(out, "pressure_notices"), 0);
	CU_ASSERT_EQUAL(tier_of("p", KVP_TIER_DEVICE).leased_tokens, 0);
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_notice_before_eviction),
		H_TEST(test_notice_before_eviction_in_one_alloc),
		H_TEST(test_recovery_notice),
		H_TEST(test_never_reader_holds_one_pending),
		H_TEST(test_rate_limit),
		H_TEST(test_sessions_that_did_not_ask_get_nothing),
		H_TEST(test_decode_refuses_other_events),
		H_TEST(test_loadgen_on_pressure_takes_notices),
	};

	return H_RUN_SUITE("pressure", init_suite, clean_suite, tests);
}
