/* test_config_events.c - CUnit tests of the [events] section and the per-pool events key
 * (daemon/conf/config.c, config_events.c): absent, defaults, values, every refusal. */
#include "config.h"

#include <CUnit/Basic.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include "suite.h"

/* A valid pool; lines 1..7. */
#define POOL_P                                                                                     \
	"[pool.p]\n"                                                                               \
	"layers = 2\n"                                                                             \
	"kv_heads = 1\n"                                                                           \
	"head_dim = 8\n"                                                                           \
	"dtype = fp16\n"                                                                           \
	"page_tokens = 4\n"                                                                        \
	"host_capacity = 1M\n"

static int load(const char *text, struct kvp_conf *c, char *err, size_t len)
{
	err[0] = '\0';
	return kvp_conf_load_string(c, text, "t.conf", err, len);
}

static void expect_err(const char *text, const char *msg)
{
	struct kvp_conf c;
	char err[512];

	CU_ASSERT_EQUAL(load(text, &c, err, sizeof(err)), -EINVAL);
	CU_ASSERT_STRING_EQUAL(err, msg);
	if (strcmp(err, msg))
		fprintf(stderr, "\n  got:    %s\n  wanted: %s\n", err, msg);
}

static void expect_ok(const char *text, struct kvp_conf *c)
{
	char err[512];
	int r = load(text, c, err, sizeof(err));

	if (r)
		fprintf(stderr, "\n  %s\n", err);
	CU_ASSERT_EQUAL_FATAL(r, 0);
}

static void test_kvp_conf_load_string_events_absent(void)
{
	struct kvp_conf c;

	expect_ok(POOL_P, &c);
	CU_ASSERT_EQUAL(c.events.enabled, 0);
	CU_ASSERT_EQUAL(c.pools[0].events, 1); /* on: meaningless without the section */
	expect_ok(POOL_P "events = off\n", &c);
	CU_ASSERT_EQUAL(c.pools[0].events, 0);
}

static void test_kvp_conf_load_string_events_defaults(void)
{
	struct kvp_conf c;

	expect_ok("[events]\nendpoint = tcp://*:5557\n" POOL_P, &c);
	CU_ASSERT_EQUAL(c.events.enabled, 1);
	CU_ASSERT_STRING_EQUAL(c.events.endpoint, "tcp://*:5557");
	CU_ASSERT_STRING_EQUAL(c.events.replay_endpoint, "");
	CU_ASSERT_STRING_EQUAL(c.events.topic, "");
	CU_ASSERT_STRING_EQUAL(c.events.source, "");
	CU_ASSERT_EQUAL(c.events.buffer_steps, 10000);
	CU_ASSERT_EQUAL(c.events.buffer_bytes, 64ull << 20);
	CU_ASSERT_EQUAL(c.events.hwm, 10000);
	CU_ASSERT_EQUAL(c.events.batch_us, 1000);
	CU_ASSERT_EQUAL(c.pools[0].events, 1);
}

static void test_kvp_conf_load_string_events_values(void)
{
	struct kvp_conf c;

	expect_ok("[events]\n"
		  "endpoint = ipc:///run/kvpool/events\n"
		  "replay_endpoint = tcp://*:5558\n"
		  "topic = kv@node1\n"
		  "source = node1\n"
		  "buffer_steps = 500\n"
		  "buffer_bytes = 1M\n"
		  "hwm = 64\n"
		  "batch_us = 0\n" POOL_P "events = on\n",
		  &c);
	CU_ASSERT_STRING_EQUAL(c.events.endpoint, "ipc:///run/kvpool/events");
	CU_ASSERT_STRING_EQUAL(c.events.replay_endpoint, "tcp://*:5558");
	CU_ASSERT_STRING_EQUAL(c.events.topic, "kv@node1");
	CU_ASSERT_STRING_EQUAL(c.events.source, "node1");
	CU_ASSERT_EQUAL(c.events.buffer_steps, 500);
	CU_ASSERT_EQUAL(c.events.buffer_bytes, 1ull << 20);
	CU_ASSERT_EQUAL(c.events.hwm, 64);
	CU_ASSERT_EQUAL(c.events.batch_us, 0);
	CU_ASSERT_EQUAL(c.pools[0].events, 1);
	expect_ok("[events]\nendpoint = inproc://kv\nreplay_endpoint =\n" POOL_P, &c);
	CU_ASSERT_STRING_EQUAL(c.events.replay_endpoint, "");
}

static void test_kvp_conf_load_string_events_errors(void)
{
	expect_err("[events]\ntopic = x\n" POOL_P, "t.conf:1: [events]: missing required key "
						   "'endpoint'");
	expect_err("[events]\nendpoint = http://x\n" POOL_P,
		   "t.conf:2: key 'endpoint' in [events]: expected a ZeroMQ endpoint to bind "
		   "(tcp://*:5557, ipc://PATH or inproc://NAME) of at most 127 characters, got "
		   "'http://x'");
	expect_err("[events]\nendpoint = tcp://\n" POOL_P,
		   "t.conf:2: key 'endpoint' in [events]: expected a ZeroMQ endpoint to bind "
		   "(tcp://*:5557, ipc://PATH or inproc://NAME) of at most 127 characters, got "
		   "'tcp://'");
	expect_err("[events]\nendpoint = tcp://*:1\nsource =\n" POOL_P,
		   "t.conf:3: key 'source' in [events]: expected 1..127 printable characters, got "
		   "''");
	expect_err(
		"[events]\nendpoint = tcp://*:1\nbuffer_steps = 0\n" POOL_P,
		"t.conf:3: key 'buffer_steps' in [events]: expected an integer in 1..1048576, got "
		"'0'");
	expect_err("[events]\nendpoint = tcp://*:1\n[events]\n" POOL_P,
		   "t.conf:3: [events] appears twice (first at line 1)");
	expect_err("[events]\nendpoint = tcp://*:1\nport = 1\n" POOL_P,
		   "t.conf:3: unknown key 'port' in [events]");
	expect_err(POOL_P "events = on\n",
		   "t.conf:8: key 'events' in [pool.p]: events = on needs an [events] section with "
		   "an endpoint");
	expect_err(POOL_P "events = maybe\n",
		   "t.conf:8: key 'events' in [pool.p]: expected on or off, got 'maybe'");
}

static void test_kvp_conf_events_same_cases(void)
{
	struct kvp_conf a, b;

	expect_ok("[events]\nendpoint = tcp://*:1\n" POOL_P, &a);
	expect_ok("[events]\nendpoint = tcp://*:1\n" POOL_P, &b);
	CU_ASSERT_EQUAL(kvp_conf_events_same(&a, &b), 1);
	expect_ok("[events]\nendpoint = tcp://*:1\nhwm = 5\n" POOL_P, &b);
	CU_ASSERT_EQUAL(kvp_conf_events_same(&a, &b), 0);
	expect_ok("[events]\nendpoint = tcp://*:2\n" POOL_P, &b);
	CU_ASSERT_EQUAL(kvp_conf_events_same(&a, &b), 0);
	expect_ok(POOL_P, &b);
	CU_ASSERT_EQUAL(kvp_conf_events_same(&a, &b), 0);
	expect_ok("[events]\nendpoint = tcp://*:1\n" POOL_P "events = off\n", &b);
	CU_ASSERT_EQUAL(kvp_conf_events_same(&a, &b), 0);
	/* a pool the reload adds may say either */
	expect_ok("[events]\nendpoint = tcp://*:1\n" POOL_P "[pool.q]\nlayers = 2\nkv_heads = 1\n"
		  "head_dim = 8\ndtype = fp16\npage_tokens = 4\nhost_capacity = 1M\nevents = off\n",
		  &b);
	CU_ASSERT_EQUAL(kvp_conf_events_same(&a, &b), 1);
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_kvp_conf_load_string_events_absent),
		H_TEST(test_kvp_conf_load_string_events_defaults),
		H_TEST(test_kvp_conf_load_string_events_values),
		H_TEST(test_kvp_conf_load_string_events_errors),
		H_TEST(test_kvp_conf_events_same_cases),
	};

	return H_RUN_SUITE("config_events", NULL, NULL, tests);
}
