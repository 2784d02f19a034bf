/* test_metrics.c - the Prometheus text: every family of stats.h's tables exactly once with its
 * HELP and TYPE lines and no family beside them, and sample values equal to a known daemon
 * state (sessions, counters, tier and pool figures, RPC counts and histogram). */
#include <CUnit/Basic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon_fixture.h"
#include "metrics.h"
#include "pool_cache.h"
#include "suite.h"

static const char *const g_conf =
	"[pool.a]\nlayers = 1\nkv_heads = 1\nhead_dim = 4\ndtype = fp16\npage_tokens = 4\n"
	"device = sim\ndevice_capacity = 64t\nhost_capacity = 32t\nmlock = off\n"
	"session_quota = 40\n"
	"[pool.b]\nlayers = 2\nkv_heads = 1\nhead_dim = 8\ndtype = fp16\npage_tokens = 8\n"
	"device = none\nhost_capacity = 128t\nmlock = off\n";

static size_t count(const char *hay, const char *needle)
{
	size_t n = 0;

	for (const char *p = hay; (p = strstr(p, needle)) != NULL; p += strlen(needle))
		n++;
	return n;
}

/* The value of the sample line that starts with `series` followed by a space; -1 if absent or
 * present more than once. */
static double sample(const char *text, const char *series)
{
	char want[256];
	const char *p;
	size_t n;

	snprintf(want, sizeof(want), "\n%s ", series);
	n = count(text, want);
	if (n != 1)
		return -1;
	p = strstr(text, want) + strlen(want);
	return strtod(p, NULL);
}

static size_t family_checks(const char *text, const char *name, const char *type)
{
	char help[160], typeline[160];

	snprintf(help, sizeof(help), "# HELP kvpool_%s ", name);
	snprintf(typeline, sizeof(typeline), "# TYPE kvpool_%s %s\n", name, type);
	CU_ASSERT_EQUAL(count(text, help), 1);
	CU_ASSERT_EQUAL(count(text, typeline), 1);
	if (count(text, help) != 1 || count(text, typeline) != 1)
		fprintf(stderr, "family %s (%s) not exactly once\n", name, type);
	return 1;
}

static void test_metrics_render_every_family_once(void)
{
	struct kvp_daemon *d = fx_daemon(g_conf);
	size_t families = 0;
	char *text;

	CU_ASSERT_PTR_NOT_NULL_FATAL(d);
	text = kvp_metrics_render(d);
	CU_ASSERT_PTR_NOT_NULL_FATAL(text);
#define DAEMON_FIGURE(f, n, t, h, s) families += family_checks(text, n, t);
#define DAEMON_COUNTER(f, n, h) families += family_checks(text, n, "counter");
#define POOL_COUNTER(f, n, h) families += family_checks(text, "pool_" n, "counter");
#define FIGURE(f, n, t, h) families += family_checks(text, n, t);
	KVP_DAEMON_FIGURES(DAEMON_FIGURE)
	KVP_DAEMON_COUNTERS(DAEMON_COUNTER)
	KVP_TIER_FIGURES(FIGURE)
	KVP_POOL_COUNTERS(POOL_COUNTER)
	KVP_POOL_FIGURES(FIGURE)
	KVP_RPC_FAMILIES(FIGURE)
#undef DAEMON_FIGURE
#undef DAEMON_COUNTER
#undef POOL_COUNTER
#undef FIGURE
	/* nothing but the tables' families, each HELP line followed by its TYPE line */
	CU_ASSERT_EQUAL(count(text, "# TYPE "), families);
	CU_ASSERT_EQUAL(count(text, "# HELP "), families);
	CU_ASSERT_TRUE(families >= 30);
	for (const char *p = text; (p = strstr(p, "# HELP kvpool_")) != NULL; p++) {
		const char *nl = strchr(p, '\n');
		char name[96];

		CU_ASSERT_FATAL(nl && sscanf(p, "# HELP %95s", name) == 1);
		CU_ASSERT_EQUAL(strncmp(nl + 1, "# TYPE ", 7), 0);
		CU_ASSERT_EQUAL(strncmp(nl + 8, name, strlen(name)), 0);
		CU_ASSERT_EQUAL(nl[-1], '.'); /* help text ends as a sentence */
	}
	CU_ASSERT_EQUAL(text[strlen(text) - 1], '\n');
	free(text);
	fx_daemon_free(d);
}

static void test_metrics_render_values_match_state(void)
{
	struct kvp_daemon *d = fx_daemon(g_conf);
	struct kvp_session *s;
	struct kvp_fail f = { 0 };
	struct kvp_lease *l;
	char *text;

	CU_ASSERT_PTR_NOT_NULL_FATAL(d);
	s = fx_session(d, false);
	CU_ASSERT_PTR_NOT_NULL_FATAL(s);
	CU_ASSERT_PTR_NOT_NULL_FATAL(fx_session(d, true));
	kvp_session_attach(s, d->pools[0]);
	l = kvp_lease_create(d->pools[0], KVP_TIER_ID_DEVICE, ++d->next_lease_id, 3, &f);
	CU_ASSERT_PTR_NOT_NULL_FATAL(l);
	CU_ASSERT_EQUAL(kvp_session_lease_add(s, l), 0);
	CU_ASSERT_EQUAL_FATAL(fx_cache(d->pools[0], KVP_TIER_ID_DEVICE, 5, 100, 20), 5);
	d->st.frames_in = 1234;
	d->st.protocol_errors = 3;
	d->pools[1]->st.matches = 17;
	kvp_rpc_observe(&d->rpc, KVPOOL__REQUEST__CALL_PING, 0, 20);   /* <= 25 us */
	kvp_rpc_observe(&d->rpc, KVPOOL__REQUEST__CALL_PING, 0, 2000); /* <= 2500 us */
	kvp_rpc_observe(&d->rpc, KVPOOL__REQUEST__CALL_ALLOC, KVP_ERR_QUOTA_EXCEEDED, 5);
	d->started_ms -= 2500;

	text = kvp_metrics_render(d);
	CU_ASSERT_PTR_NOT_NULL_FATAL(text);
	CU_ASSERT_EQUAL(sample(text, "kvpool_sessions"), 2);
	CU_ASSERT_TRUE(sample(text, "kvpool_uptime_seconds") >= 2.5);
	CU_ASSERT_TRUE(sample(text, "kvpool_uptime_seconds") < 60);
	CU_ASSERT_EQUAL(sample(text, "kvpool_frames_in_total"), 1234);
	CU_ASSERT_EQUAL(sample(text, "kvpool_protocol_errors_total"), 3);
	CU_ASSERT_EQUAL(sample(text, "kvpool_sessions_opened_total"), 0);
	/* tier figures, in tokens, for the tiers that exist only */
	CU_ASSERT_EQUAL(sample(text, "kvpool_tier_total_tokens{pool=\"a\",tier=\"device\"}"), 64);
	CU_ASSERT_EQUAL(sample(text, "kvpool_tier_total_tokens{pool=\"a\",tier=\"host\"}"), 32);
	CU_ASSERT_EQUAL(sample(text, "kvpool_tier_total_tokens{pool=\"b\",tier=\"host\"}"), 128);
	CU_ASSERT_EQUAL(sample(text, "kvpool_tier_total_tokens{pool=\"b\",tier=\"device\"}"), -1);
	CU_ASSERT_EQUAL(sample(text, "kvpool_tier_leased_tokens{pool=\"a\",tier=\"device\"}"), 12);
	CU_ASSERT_EQUAL(sample(text, "kvpool_tier_cached_tokens{pool=\"a\",tier=\"device\"}"), 20);
	CU_ASSERT_EQUAL(sample(text, "kvpool_tier_evictable_tokens{pool=\"a\",tier=\"device\"}"),
			20);
	CU_ASSERT_EQUAL(sample(text, "kvpool_tier_free_tokens{pool=\"a\",tier=\"device\"}"),
			64 - 12 - 20);
	CU_ASSERT_EQUAL(sample(text, "kvpool_tier_protected_tokens{pool=\"a\",tier=\"device\"}"),
			0);
	CU_ASSERT_EQUAL(sample(text, "kvpool_evicted_tokens_total{pool=\"a\",tier=\"device\"}"), 0);
	/* pool counters and figures */
	CU_ASSERT_EQUAL(sample(text, "kvpool_pool_matches_total{pool=\"b\"}"), 17);
	CU_ASSERT_EQUAL(sample(text, "kvpool_pool_matches_total{pool=\"a\"}"), 0);
	CU_ASSERT_EQUAL(sample(text, "kvpool_pool_sessions{pool=\"a\"}"), 1);
	CU_ASSERT_EQUAL(sample(text, "kvpool_pool_sessions{pool=\"b\"}"), 0);
	CU_ASSERT_EQUAL(sample(text, "kvpool_pool_session_quota_tokens{pool=\"a\"}"), 40);
	CU_ASSERT_EQUAL(sample(text, "kvpool_pool_token_bytes{pool=\"a\"}"), 1 * 2 * 1 * 4 * 2);
	CU_ASSERT_EQUAL(sample(text, "kvpool_pool_token_bytes{pool=\"b\"}"), 2 * 2 * 1 * 8 * 2);
	CU_ASSERT_TRUE(sample(text, "kvpool_index_pages{pool=\"a\"}") >= 2);
	CU_ASSERT_EQUAL(sample(text, "kvpool_prefix_hit_tokens_total{pool=\"a\"}"), 0);
	/* RPC families */
	CU_ASSERT_EQUAL(sample(text, "kvpool_rpc_total{call=\"ping\"}"), 2);
	CU_ASSERT_EQUAL(sample(text, "kvpool_rpc_total{call=\"alloc\"}"), 1);
	CU_ASSERT_EQUAL(sample(text, "kvpool_rpc_total{call=\"match\"}"), -1); /* never called */
	CU_ASSERT_EQUAL(sample(text, "kvpool_rpc_failures_total{code=\"QUOTA_EXCEEDED\"}"), 1);
	CU_ASSERT_EQUAL(sample(text, "kvpool_rpc_failures_total{code=\"NOT_FOUND\"}"), 0);
	CU_ASSERT_EQUAL(sample(text,
			       "kvpool_rpc_duration_seconds_bucket{call=\"ping\",le=\"2.5e-05\"}"),
			1);
	CU_ASSERT_EQUAL(sample(text,
			       "kvpool_rpc_duration_seconds_bucket{call=\"ping\",le=\"0.001\"}"),
			1);
	CU_ASSERT_EQUAL(sample(text,
			       "kvpool_rpc_duration_seconds_bucket{call=\"ping\",le=\"0.0025\"}"),
			2);
	CU_ASSERT_EQUAL(sample(text,
			       "kvpool_rpc_duration_seconds_bucket{call=\"ping\",le=\"+Inf\"}"),
			2);
	CU_ASSERT_EQUAL(sample(text, "kvpool_rpc_duration_seconds_count{call=\"ping\"}"), 2);
	CU_ASSERT_DOUBLE_EQUAL(sample(text, "kvpool_rpc_duration_seconds_sum{call=\"ping\"}"),
			       0.00202, 1e-9);
	free(text);
	fx_daemon_free(d);
}

/* kvp_daemon_figures reads the state the Status reply and the exposition show. */
static void test_daemon_figures_now(void)
{
	struct kvp_daemon *d = fx_daemon(g_conf);
	struct kvp_daemon_figures fig;

	CU_ASSERT_PTR_NOT_NULL_FATAL(d);
	CU_ASSERT_PTR_NOT_NULL_FATAL(fx_session(d, false));
	d->started_ms -= 1000;
	kvp_daemon_figures(d, &fig);
	CU_ASSERT_EQUAL(fig.sessions, 1);
	CU_ASSERT_TRUE(fig.uptime_ms >= 1000 && fig.uptime_ms < 60000);
	fx_daemon_free(d);
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_metrics_render_every_family_once),
		H_TEST(test_metrics_render_values_match_state),
		H_TEST(test_daemon_figures_now),
	};

	return H_RUN_SUITE("metrics", NULL, NULL, tests);
}
