/* test_pressure.c - pressure notices in-process (pressure.c, no loop): watermarks from percent
 * and tokens, grants only to sessions that agreed to events, a notice per state change, the
 * pool's rate limit, newer states replacing unsent ones, and detach ending them. */
#include <CUnit/Basic.h>
#include <stdint.h>

#include "daemon_fixture.h"
#include "kvpool_caps.h"
#include "pressure.h"
#include "suite.h"

/* Pool "w": 32 device pages, 8 host pages, watermark 10% (4 and 1 pages), 500 ms apart.
 * Pool "t": 16 device pages, watermark 9 tokens (3 pages), no rate limit. "n": none. */
static const char *const g_conf =
	"[pool.w]\nlayers = 1\nkv_heads = 1\nhead_dim = 4\ndtype = fp16\npage_tokens = 4\n"
	"device = sim\ndevice_capacity = 128t\nhost_capacity = 32t\nmlock = off\n"
	"pressure_watermark = 10%\npressure_interval_ms = 500\n"
	"[pool.t]\nlayers = 1\nkv_heads = 1\nhead_dim = 4\ndtype = fp16\npage_tokens = 4\n"
	"device = sim\ndevice_capacity = 64t\nhost_capacity = 0\nmlock = off\n"
	"pressure_watermark = 9t\npressure_interval_ms = 0\n"
	"[pool.n]\nlayers = 1\nkv_heads = 1\nhead_dim = 4\ndtype = fp16\npage_tokens = 4\n"
	"device = sim\ndevice_capacity = 64t\nhost_capacity = 0\nmlock = off\n";

static struct kvp_session *events_session(struct kvp_daemon *d)
{
	struct kvp_session *s = fx_session(d, false);

	if (s)
		s->caps = KVP_CAP_EVENTS;
	return s;
}

/* The next notice of s at now: 1 with *m copied, 0 when none is due. */
static int next(struct kvp_daemon *d, struct kvp_session *s, uint64_t now,
		Kvpool__PressureNotice *m)
{
	struct kvp_reply r;
	int rc;

	kvp_reply_init(&r, 0);
	rc = kvp_pressure_next(d, s, now, &r);
	if (rc > 0) {
		CU_ASSERT_EQUAL(r.resp.id, 0);
		CU_ASSERT_EQUAL(r.resp.result_case, KVPOOL__RESPONSE__RESULT_PRESSURE);
		CU_ASSERT_EQUAL(r.status.code, KVPOOL__CODE__OK);
		*m = *r.resp.pressure;
		m->pool = NULL;
	}
	kvp_reply_release(&r);
	return rc;
}

static void test_kvp_pressure_watermark_percent_and_tokens(void)
{
	struct kvp_daemon *d = fx_daemon(g_conf);

	CU_ASSERT_PTR_NOT_NULL_FATAL(d);
	CU_ASSERT_EQUAL(kvp_pressure_watermark(d->pools[0], KVP_TIER_ID_DEVICE), 4); /* 3.2 up */
	CU_ASSERT_EQUAL(kvp_pressure_watermark(d->pools[0], KVP_TIER_ID_HOST), 1);   /* 0.8 up */
	CU_ASSERT_EQUAL(kvp_pressure_watermark(d->pools[1], KVP_TIER_ID_DEVICE), 3); /* 9t */
	CU_ASSERT_EQUAL(kvp_pressure_watermark(d->pools[1], KVP_TIER_ID_HOST), 0);   /* absent */
	CU_ASSERT_EQUAL(kvp_pressure_watermark(d->pools[2], KVP_TIER_ID_DEVICE), 0);
	d->pools[1]->conf.pressure_watermark_tokens = 1000; /* above the tier: the whole tier */
	CU_ASSERT_EQUAL(kvp_pressure_watermark(d->pools[1], KVP_TIER_ID_DEVICE), 16);
	fx_daemon_free(d);
}

static void test_kvp_pressure_attach_needs_events(void)
{
	struct kvp_daemon *d = fx_daemon(g_conf);
	struct kvp_session *plain, *ev;

	CU_ASSERT_PTR_NOT_NULL_FATAL(d);
	plain = fx_session(d, false);
	ev = events_session(d);
	CU_ASSERT_FALSE(kvp_pressure_attach(d, plain, d->pools[1], true));
	CU_ASSERT_FALSE(kvp_pressure_attach(d, ev, d->pools[1], false));
	CU_ASSERT_FALSE(kvp_pressure_scan(d, true));
	CU_ASSERT_TRUE(kvp_pressure_attach(d, ev, d->pools[1], true));
	CU_ASSERT_TRUE(kvp_pressure_scan(d, false)); /* a subscriber: look once */
	kvp_pressure_walked(d, false);
	CU_ASSERT_FALSE(kvp_pressure_scan(d, true));
	fx_daemon_free(d);
}

static void test_kvp_pressure_next_change_recovery_coalesce(void)
{
	struct kvp_daemon *d = fx_daemon(g_conf);
	struct kvpd_pool *p;
	struct kvp_session *a, *b, *quiet;
	struct kvp_fail f = { 0 };
	struct kvp_lease *l, *l2;
	Kvpool__PressureNotice m;

	CU_ASSERT_PTR_NOT_NULL_FATAL(d);
	p = d->pools[1];
	a = events_session(d);
	b = events_session(d);
	quiet = events_session(d);
	kvp_pressure_attach(d, a, p, true);
	kvp_pressure_attach(d, b, p, true);
	kvp_pressure_scan(d, false);
	kvp_pressure_walked(d, false);
	l = kvp_lease_create(p, KVP_TIER_ID_DEVICE, 1, 13, &f); /* 3 free: not below 3 */
	CU_ASSERT_PTR_NOT_NULL_FATAL(l);
	CU_ASSERT_FALSE(kvp_pressure_scan(d, true));
	l2 = kvp_lease_create(p, KVP_TIER_ID_DEVICE, 2, 1, &f); /* 2 free */
	CU_ASSERT_PTR_NOT_NULL_FATAL(l2);
	CU_ASSERT_TRUE(kvp_pressure_scan(d, false));
	CU_ASSERT_TRUE(kvp_pressure_owed(d, a));
	CU_ASSERT_FALSE(kvp_pressure_owed(d, quiet));
	CU_ASSERT_EQUAL(next(d, quiet, 1000, &m), 0);
	CU_ASSERT_EQUAL_FATAL(next(d, a, 1000, &m), 1);
	CU_ASSERT_EQUAL(m.pool_id, 1);
	CU_ASSERT_EQUAL(m.tier, KVPOOL__TIER__DEVICE);
	CU_ASSERT_FALSE(m.recovered);
	CU_ASSERT_EQUAL(m.free_tokens, 8);
	CU_ASSERT_EQUAL(m.watermark_tokens, 12);
	CU_ASSERT_EQUAL(m.total_tokens, 64);
	CU_ASSERT_EQUAL(m.seq, 1);
	CU_ASSERT_EQUAL(m.coalesced, 0);
	CU_ASSERT_EQUAL(next(d, a, 1000, &m), 0); /* told */
	CU_ASSERT_FALSE(kvp_pressure_owed(d, a));
	kvp_pressure_walked(d, true); /* b left pending */
	/* b never takes its notice: up, down, up again replace it; a is told each */
	kvp_lease_destroy(l2);
	CU_ASSERT_TRUE(kvp_pressure_scan(d, false));
	CU_ASSERT_EQUAL_FATAL(next(d, a, 1001, &m), 1);
	CU_ASSERT_TRUE(m.recovered);
	CU_ASSERT_EQUAL(m.seq, 2);
	l2 = kvp_lease_create(p, KVP_TIER_ID_DEVICE, 3, 1, &f);
	kvp_pressure_scan(d, false);
	CU_ASSERT_EQUAL_FATAL(next(d, a, 1002, &m), 1);
	kvp_lease_destroy(l2);
	kvp_pressure_scan(d, false);
	CU_ASSERT_EQUAL_FATAL(next(d, a, 1003, &m), 1);
	CU_ASSERT_TRUE(m.recovered);
	CU_ASSERT_EQUAL(m.seq, 4);
	CU_ASSERT_EQUAL(m.coalesced, 0);
	CU_ASSERT_FALSE(kvp_pressure_owed(d, b));     /* b's last news (nothing) is right again */
	CU_ASSERT_EQUAL(p->st.pressure_coalesced, 2); /* b: its pressure, then its recovery */
	l2 = kvp_lease_create(p, KVP_TIER_ID_DEVICE, 4, 2, &f);
	kvp_pressure_scan(d, false);
	CU_ASSERT_EQUAL_FATAL(next(d, b, 1004, &m), 1);
	CU_ASSERT_FALSE(m.recovered);
	CU_ASSERT_EQUAL(m.seq, 5);
	CU_ASSERT_EQUAL(m.coalesced, 2);
	CU_ASSERT_EQUAL(m.free_tokens, 4);
	CU_ASSERT_EQUAL(p->st.pressure_changes, 5);
	CU_ASSERT_EQUAL(p->st.pressure_notices, 5); /* a: 4, b: 1 */
	/* detached: nothing more */
	CU_ASSERT_TRUE(kvp_pressure_owed(d, a));
	kvp_pressure_detach(a, p);
	CU_ASSERT_FALSE(kvp_pressure_owed(d, a));
	CU_ASSERT_EQUAL(next(d, a, 1005, &m), 0);
	kvp_lease_destroy(l2);
	kvp_lease_destroy(l);
	fx_daemon_free(d);
}

static void test_kvp_pressure_next_rate_limit(void)
{
	struct kvp_daemon *d = fx_daemon(g_conf);
	struct kvpd_pool *p;
	struct kvp_session *a;
	struct kvp_fail f = { 0 };
	struct kvp_lease *l;
	Kvpool__PressureNotice m;

	CU_ASSERT_PTR_NOT_NULL_FATAL(d);
	p = d->pools[0];
	a = events_session(d);
	kvp_pressure_attach(d, a, p, true);
	l = kvp_lease_create(p, KVP_TIER_ID_DEVICE, 1, 30, &f); /* 2 free < 4 */
	CU_ASSERT_PTR_NOT_NULL_FATAL(l);
	kvp_pressure_scan(d, false);
	CU_ASSERT_EQUAL_FATAL(next(d, a, 10000, &m), 1);
	kvp_lease_destroy(l);
	kvp_pressure_scan(d, false);
	CU_ASSERT_TRUE(kvp_pressure_owed(d, a));
	CU_ASSERT_EQUAL(next(d, a, 10499, &m), 0); /* 500 ms apart */
	kvp_pressure_walked(d, true);
	CU_ASSERT_TRUE(kvp_pressure_scan(d, true)); /* the tick looks again */
	CU_ASSERT_FALSE(kvp_pressure_scan(d, false));
	CU_ASSERT_EQUAL_FATAL(next(d, a, 10500, &m), 1);
	CU_ASSERT_TRUE(m.recovered);
	fx_daemon_free(d);
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_kvp_pressure_watermark_percent_and_tokens),
		H_TEST(test_kvp_pressure_attach_needs_events),
		H_TEST(test_kvp_pressure_next_change_recovery_coalesce),
		H_TEST(test_kvp_pressure_next_rate_limit),
	};

	return H_RUN_SUITE("pressure_unit", NULL, NULL, tests);
}
