/* test_config_remote.c - CUnit tests of the [remote] section and the per-pool remote key of
 * daemon/conf/config.c: defaults, values, normalization of seeds, every refusal and the example.
 *
 * usage: test_config_remote [PATH-TO-kvpoold.conf.example]; without it the example is looked
 * up as $KVP_SRCDIR/systemd/kvpoold.conf.example, then systemd/kvpoold.conf.example. */
#include "config.h"

#include <CUnit/Basic.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "suite.h"

static const char *g_example_path;

/* A valid pool with a host tier: 256 bytes per page; lines 1..7. */
#define POOL_P                                                                                     \
	"[pool.p]\n"                                                                               \
	"layers = 2\n"                                                                             \
	"kv_heads = 1\n"                                                                           \
	"head_dim = 8\n"                                                                           \
	"dtype = fp16\n"                                                                           \
	"page_tokens = 4\n"                                                                        \
	"host_capacity = 1M\n"

/* A [remote] section with its seeds and secret; lines 1..3. */
#define SECRET_LINE "secret = file:/etc/kvpool/remote.secret\n"
#define REMOTE "[remote]\nseeds = 127.0.0.1:7000\n" SECRET_LINE

static int load(const char *text, struct kvp_conf *c, char *err, size_t len)
{
	err[0] = '\0';
	return kvp_conf_load_string(c, text, "t.conf", err, len);
}

/* Loads text, expects -EINVAL with exactly msg, and c untouched. */
static void expect_err(const char *text, const char *msg)
{
	struct kvp_conf c, before;
	char err[512];

	memset(&c, 0x5a, sizeof(c));
	before = c;
	CU_ASSERT_EQUAL(load(text, &c, err, sizeof(err)), -EINVAL);
	CU_ASSERT_STRING_EQUAL(err, msg);
	if (strcmp(err, msg))
		fprintf(stderr, "\n  got:    %s\n  wanted: %s\n", err, msg);
	CU_ASSERT_EQUAL(memcmp(&c, &before, sizeof(c)), 0);
}

static void expect_ok(const char *text, struct kvp_conf *c)
{
	char err[512];
	int r = load(text, c, err, sizeof(err));

	if (r)
		fprintf(stderr, "\n  %s\n", err);
	CU_ASSERT_EQUAL_FATAL(r, 0);
}

static void test_kvp_conf_load_string_remote_absent(void)
{
	struct kvp_conf c;

	expect_ok(POOL_P, &c);
	CU_ASSERT_EQUAL(c.remote.enabled, 0);
	CU_ASSERT_STRING_EQUAL(c.remote.seeds, "");
	CU_ASSERT_EQUAL(c.pools[0].remote, KVP_REMOTE_OFF);
}

static void test_kvp_conf_load_string_remote_defaults(void)
{
	struct kvp_conf c;

	expect_ok(REMOTE POOL_P, &c);
	CU_ASSERT_EQUAL(c.remote.enabled, 1);
	CU_ASSERT_STRING_EQUAL(c.remote.seeds, "127.0.0.1:7000");
	CU_ASSERT_EQUAL(c.remote.n_seeds, 1);
	CU_ASSERT_EQUAL(c.remote.connect_timeout_ms, 1000);
	CU_ASSERT_EQUAL(c.remote.command_timeout_ms, 500);
	CU_ASSERT_EQUAL(c.remote.match_timeout_ms, 20);
	CU_ASSERT_EQUAL(c.remote.match_max_pages, 64);
	CU_ASSERT_EQUAL(c.remote.max_inflight_bytes, 64ull << 20);
	CU_ASSERT_EQUAL(c.remote.ttl_s, 86400);
	CU_ASSERT_EQUAL(c.remote.rewrite_after_s, 3600);
	CU_ASSERT_EQUAL(c.remote.connections, 16);
	/* a [remote] section alone does not turn a pool's remote tier on */
	CU_ASSERT_EQUAL(c.pools[0].remote, KVP_REMOTE_OFF);
}

static void test_kvp_conf_load_string_remote_values(void)
{
	struct kvp_conf c;

	expect_ok("[remote]\n"
		  "seeds = 127.0.0.1:7000, redis-a.local:7001 ,10.0.0.3:65535\n"
		  "connect_timeout_ms = 250ms\n"
		  "command_timeout_ms = 1m\n"
		  "match_timeout_ms = 5\n"
		  "match_max_pages = 4096\n"
		  "max_inflight_bytes = 1G\n"
		  "ttl_s = 0\n"
		  "rewrite_after_s = 90m\n"
		  "connections = 3\n"
		  "user = kvpool\n"
		  "password = credential:redis-password\n"
		  "secret = file:/etc/kvpool/remote.secret\n" POOL_P "remote = write-through\n"
		  "remote_scope = llama-8b.v2\n"
		  "[pool.q]\nlayers = 1\nkv_heads = 1\nhead_dim = 1\ndtype = fp32\n"
		  "page_tokens = 1\nhost_capacity = 4K\nremote = spill\n"
		  "[pool.r]\nlayers = 1\nkv_heads = 1\nhead_dim = 1\ndtype = fp32\n"
		  "page_tokens = 1\nhost_capacity = 4K\nremote = off\n",
		  &c);
	CU_ASSERT_STRING_EQUAL(c.remote.seeds, "127.0.0.1:7000,redis-a.local:7001,10.0.0.3:65535");
	CU_ASSERT_EQUAL(c.remote.n_seeds, 3);
	CU_ASSERT_EQUAL(c.remote.connect_timeout_ms, 250);
	CU_ASSERT_EQUAL(c.remote.command_timeout_ms, 60000);
	CU_ASSERT_EQUAL(c.remote.match_timeout_ms, 5);
	CU_ASSERT_EQUAL(c.remote.match_max_pages, 4096);
	CU_ASSERT_EQUAL(c.remote.max_inflight_bytes, 1ull << 30);
	CU_ASSERT_EQUAL(c.remote.ttl_s, 0);
	CU_ASSERT_EQUAL(c.remote.rewrite_after_s, 5400);
	CU_ASSERT_EQUAL(c.remote.connections, 3);
	CU_ASSERT_STRING_EQUAL(c.remote.user, "kvpool");
	CU_ASSERT_STRING_EQUAL(c.remote.password, "credential:redis-password");
	CU_ASSERT_STRING_EQUAL(c.remote.secret, "file:/etc/kvpool/remote.secret");
	CU_ASSERT_EQUAL_FATAL(c.n_pools, 3);
	CU_ASSERT_STRING_EQUAL(c.pools[0].remote_scope, "llama-8b.v2");
	CU_ASSERT_STRING_EQUAL(c.pools[1].remote_scope, ""); /* its name, pool q */
	CU_ASSERT_EQUAL(c.pools[0].remote, KVP_REMOTE_WRITE_THROUGH);
	CU_ASSERT_EQUAL(c.pools[1].remote, KVP_REMOTE_SPILL);
	CU_ASSERT_EQUAL(c.pools[2].remote, KVP_REMOTE_OFF);
	CU_ASSERT_STRING_EQUAL(kvp_remote_mode_name(KVP_REMOTE_WRITE_THROUGH), "write-through");
	CU_ASSERT_STRING_EQUAL(kvp_remote_mode_name(KVP_REMOTE_SPILL), "spill");
	CU_ASSERT_STRING_EQUAL(kvp_remote_mode_name(KVP_REMOTE_OFF), "off");
	CU_ASSERT_STRING_EQUAL(kvp_remote_mode_name(KVP_REMOTE_MODE_MAX), "?");
}

static void test_kvp_conf_load_string_remote_section_errors(void)
{
	expect_err("[remote]\nconnect_timeout_ms = 5\n" POOL_P,
		   "t.conf:1: [remote]: missing required key 'seeds'");
	expect_err("[remote]\n" POOL_P, "t.conf:1: [remote]: missing required key 'seeds'");
	expect_err(REMOTE "[remote]\n" POOL_P,
		   "t.conf:4: [remote] appears twice (first at line 1)");
	expect_err("[remote]\nseeds = 127.0.0.1:7000\n" POOL_P,
		   "t.conf:1: [remote]: missing required key 'secret'");
	expect_err(REMOTE "secret = s3cret\n" POOL_P,
		   "t.conf:4: key 'secret' in [remote]: given twice (first at line 3)");
	expect_err("[remote]\nseeds = 127.0.0.1:7000\nsecret = s3cret\n" POOL_P,
		   "t.conf:3: key 'secret' in [remote]: expected file:PATH (absolute) or "
		   "credential:NAME (a systemd credential), at most 191 characters: the secret "
		   "itself is never written here");
	expect_err(REMOTE "password = hunter2\n" POOL_P,
		   "t.conf:4: key 'password' in [remote]: expected file:PATH (absolute) or "
		   "credential:NAME (a systemd credential), at most 191 characters: the secret "
		   "itself is never written here");
	expect_err(REMOTE "password = file:relative\n" POOL_P,
		   "t.conf:4: key 'password' in [remote]: expected file:PATH (absolute) or "
		   "credential:NAME (a systemd credential), at most 191 characters: the secret "
		   "itself is never written here");
	expect_err(REMOTE "password = credential:../x\n" POOL_P,
		   "t.conf:4: key 'password' in [remote]: expected file:PATH (absolute) or "
		   "credential:NAME (a systemd credential), at most 191 characters: the secret "
		   "itself is never written here");
	expect_err(REMOTE "user = a b\n" POOL_P,
		   "t.conf:4: key 'user' in [remote]: expected a Redis ACL user name of 1..63 "
		   "printable characters, got 'a b'");
	expect_err(REMOTE POOL_P "remote_scope = a/b\n",
		   "t.conf:11: key 'remote_scope' in [pool.p]: expected 1..63 characters of "
		   "[A-Za-z0-9._-], got 'a/b'");
	expect_err(REMOTE "seeds = 127.0.0.1:7001\n" POOL_P,
		   "t.conf:4: key 'seeds' in [remote]: given twice (first at line 2)");
	expect_err(REMOTE "timeout_ms = 5\n" POOL_P,
		   "t.conf:4: unknown key 'timeout_ms' in [remote]");
	expect_err(REMOTE "connect_timeout_ms = 0\n" POOL_P,
		   "t.conf:4: key 'connect_timeout_ms' in [remote]: expected a duration in "
		   "1..60000 ms, got '0'");
	expect_err(REMOTE "command_timeout_ms = 60001\n" POOL_P,
		   "t.conf:4: key 'command_timeout_ms' in [remote]: expected a duration in "
		   "1..60000 ms, got '60001'");
	expect_err(REMOTE "match_timeout_ms = -1\n" POOL_P,
		   "t.conf:4: key 'match_timeout_ms' in [remote]: expected a duration: a "
		   "whole number of ms, or one with a unit (ms, s, m, h), got '-1'");
	expect_err(REMOTE "match_max_pages = 4097\n" POOL_P,
		   "t.conf:4: key 'match_max_pages' in [remote]: expected an integer in 1..4096, "
		   "got '4097'");
	expect_err(REMOTE "max_inflight_bytes = 1000t\n" POOL_P,
		   "t.conf:4: key 'max_inflight_bytes' in [remote]: expected bytes in 64K..64G "
		   "(256M), got '1000t'");
	expect_err(REMOTE "max_inflight_bytes = 1K\n" POOL_P,
		   "t.conf:4: key 'max_inflight_bytes' in [remote]: expected bytes in 64K..64G "
		   "(256M), got '1K'");
	expect_err(REMOTE "max_inflight_bytes = 65G\n" POOL_P,
		   "t.conf:4: key 'max_inflight_bytes' in [remote]: expected bytes in 64K..64G "
		   "(256M), got '65G'");
	expect_err(REMOTE "ttl_s = 1500ms\n" POOL_P,
		   "t.conf:4: key 'ttl_s' in [remote]: expected a duration: a whole number of s, "
		   "or one with a unit (ms, s, m, h), got '1500ms'");
	expect_err(REMOTE "command_timeout_ms = 2m\n" POOL_P,
		   "t.conf:4: key 'command_timeout_ms' in [remote]: expected a duration in "
		   "1..60000 ms, got '2m'");
	expect_err(REMOTE "ttl_s = 2147483648\n" POOL_P,
		   "t.conf:4: key 'ttl_s' in [remote]: expected a duration in 0..2147483647 s, "
		   "got '2147483648'");
	expect_err(REMOTE "rewrite_after_s = 0\n" POOL_P,
		   "t.conf:4: key 'rewrite_after_s' in [remote]: expected a duration in "
		   "1..2147483647 s, got '0'");
	expect_err(
		REMOTE "connections = 0\n" POOL_P,
		"t.conf:4: key 'connections' in [remote]: expected an integer in 1..16, got '0'");
	expect_err(
		REMOTE "connections = 17\n" POOL_P,
		"t.conf:4: key 'connections' in [remote]: expected an integer in 1..16, got '17'");
	expect_err(REMOTE "rewrite_after_s = 500ms\n" POOL_P,
		   "t.conf:4: key 'rewrite_after_s' in [remote]: expected a duration: a whole "
		   "number of s, or one with a unit (ms, s, m, h), got '500ms'");
}

static void test_kvp_conf_load_string_remote_bad_seeds(void)
{
	expect_err("[remote]\nseeds = \n" POOL_P,
		   "t.conf:2: key 'seeds' in [remote]: expected at least one host:port "
		   "(127.0.0.1:7000)");
	expect_err("[remote]\nseeds = , ,\n" POOL_P,
		   "t.conf:2: key 'seeds' in [remote]: expected at least one host:port "
		   "(127.0.0.1:7000)");
	expect_err("[remote]\nseeds = 127.0.0.1\n" POOL_P,
		   "t.conf:2: key 'seeds' in [remote]: expected host:port, got '127.0.0.1'");
	expect_err("[remote]\nseeds = :7000\n" POOL_P,
		   "t.conf:2: key 'seeds' in [remote]: expected host:port, got ':7000'");
	expect_err("[remote]\nseeds = 127.0.0.1:\n" POOL_P,
		   "t.conf:2: key 'seeds' in [remote]: expected host:port, got '127.0.0.1:'");
	expect_err("[remote]\nseeds = 127.0.0.1:0\n" POOL_P,
		   "t.conf:2: key 'seeds' in [remote]: bad port in '127.0.0.1:0': expected "
		   "1..65535");
	expect_err("[remote]\nseeds = 127.0.0.1:7000,127.0.0.1:65536\n" POOL_P,
		   "t.conf:2: key 'seeds' in [remote]: bad port in '127.0.0.1:65536': expected "
		   "1..65535");
	expect_err("[remote]\nseeds = 127.0.0.1:70x\n" POOL_P,
		   "t.conf:2: key 'seeds' in [remote]: bad port in '127.0.0.1:70x': expected "
		   "1..65535");
	expect_err("[remote]\nseeds = red/is:7000\n" POOL_P,
		   "t.conf:2: key 'seeds' in [remote]: bad host in 'red/is:7000': a name or IPv4 "
		   "address (A-Z a-z 0-9 . - _)");
	/* IPv6 addresses are not taken */
	expect_err("[remote]\nseeds = [::1]:7000\n" POOL_P,
		   "t.conf:2: key 'seeds' in [remote]: expected host:port, got '[::1]:7000'");
	expect_err("[remote]\nseeds = a:1 b:2 c:3 d:4 e:5 f:6 g:7 h:8 i:9 j:10 k:11 l:12 m:13 "
		   "n:14 o:15 p:16 q:17\n" POOL_P,
		   "t.conf:2: key 'seeds' in [remote]: more than 16 seeds");
}

static void test_kvp_conf_load_string_remote_pool_errors(void)
{
	expect_err(POOL_P "remote = spill\n",
		   "t.conf:8: key 'remote' in [pool.p]: remote = spill needs a [remote] section "
		   "with seeds");
	expect_err(POOL_P "remote = write-through\n",
		   "t.conf:8: key 'remote' in [pool.p]: remote = write-through needs a [remote] "
		   "section with seeds");
	expect_err(REMOTE POOL_P "remote = on\n",
		   "t.conf:11: key 'remote' in [pool.p]: expected off, spill or write-through, "
		   "got 'on'");
	expect_err(REMOTE POOL_P "remote = off\nremote = spill\n",
		   "t.conf:12: key 'remote' in [pool.p]: given twice (first at line 11)");
	expect_err(REMOTE "[pool.d]\nlayers = 1\nkv_heads = 1\nhead_dim = 1\ndtype = fp32\n"
			  "page_tokens = 1\ndevice = sim\ndevice_capacity = 4K\nremote = spill\n",
		   "t.conf:12: key 'remote' in [pool.d]: remote = spill needs a host tier "
		   "(host_capacity)");
	/* off needs nothing */
	{
		struct kvp_conf c;

		expect_ok(POOL_P "remote = off\n", &c);
		CU_ASSERT_EQUAL(c.pools[0].remote, KVP_REMOTE_OFF);
	}
}

static void test_kvp_conf_remote_same_cases(void)
{
	static const char *const base = REMOTE POOL_P "remote = spill\n";
	struct kvp_conf a, b;

	expect_ok(base, &a);
	expect_ok(base, &b);
	CU_ASSERT_TRUE(kvp_conf_remote_same(&a, &b));
	/* a new pool with the remote tier off is fine, one with it on is not */
	expect_ok(REMOTE POOL_P "remote = spill\n[pool.q]\nlayers = 1\nkv_heads = 1\nhead_dim = 1\n"
				"dtype = fp32\npage_tokens = 1\nhost_capacity = 4K\n",
		  &b);
	CU_ASSERT_TRUE(kvp_conf_remote_same(&a, &b));
	expect_ok(REMOTE POOL_P "remote = spill\n[pool.q]\nlayers = 1\nkv_heads = 1\nhead_dim = 1\n"
				"dtype = fp32\npage_tokens = 1\nhost_capacity = 4K\n"
				"remote = spill\n",
		  &b);
	CU_ASSERT_FALSE(kvp_conf_remote_same(&a, &b));
	expect_ok(REMOTE POOL_P "remote = write-through\n", &b);
	CU_ASSERT_FALSE(kvp_conf_remote_same(&a, &b));
	expect_ok("[remote]\nseeds = 127.0.0.1:7001\n" SECRET_LINE POOL_P "remote = spill\n", &b);
	CU_ASSERT_FALSE(kvp_conf_remote_same(&a, &b));
	expect_ok("[remote]\nseeds = 127.0.0.1:7000\nsecret = credential:remote-secret\n" POOL_P
		  "remote = spill\n",
		  &b);
	CU_ASSERT_FALSE(kvp_conf_remote_same(&a, &b));
	expect_ok(REMOTE "password = file:/etc/kvpool/redis.pass\n" POOL_P "remote = spill\n", &b);
	CU_ASSERT_FALSE(kvp_conf_remote_same(&a, &b));
	expect_ok(REMOTE "ttl_s = 5\n" POOL_P "remote = spill\n", &b);
	CU_ASSERT_FALSE(kvp_conf_remote_same(&a, &b));
	expect_ok(REMOTE "rewrite_after_s = 5\n" POOL_P "remote = spill\n", &b);
	CU_ASSERT_FALSE(kvp_conf_remote_same(&a, &b));
	expect_ok(REMOTE "match_max_pages = 8\n" POOL_P "remote = spill\n", &b);
	CU_ASSERT_FALSE(kvp_conf_remote_same(&a, &b));
	expect_ok(POOL_P, &b);
	CU_ASSERT_FALSE(kvp_conf_remote_same(&a, &b));
}

/* The example's commented-out [remote] block is valid, and turns on with remote = spill. */
static void test_kvp_conf_load_file_example_remote(void)
{
	char text[16384], line[512], err[512];
	struct kvp_conf c;
	bool in_remote = false, seen = false;
	FILE *f = fopen(g_example_path, "re");
	size_t n = 0;

	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	text[0] = '\0';
	while (fgets(line, sizeof(line), f)) {
		const char *l = line;

		if (strcmp(line, ";[remote]\n") == 0)
			in_remote = seen = true;
		else if (line[0] != ';')
			in_remote = false;
		/* ";key = value" lines, not the "; text" comments between them */
		if (in_remote && line[1] != ' ')
			l = line + 1;
		if (strcmp(line, "remote = off\n") == 0)
			l = "remote = spill\n";
		n += (size_t)snprintf(text + n, sizeof(text) - n, "%s", l);
		CU_ASSERT_FATAL(n < sizeof(text));
	}
	fclose(f);
	CU_ASSERT_TRUE_FATAL(seen);
	if (load(text, &c, err, sizeof(err)))
		fprintf(stderr, "\n  %s\n", err);
	CU_ASSERT_EQUAL_FATAL(load(text, &c, err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(c.remote.enabled, 1);
	CU_ASSERT_STRING_EQUAL(c.remote.seeds, "127.0.0.1:7000,127.0.0.1:7001");
	CU_ASSERT_EQUAL(c.remote.max_inflight_bytes, 64ull << 20);
	CU_ASSERT_EQUAL(c.remote.rewrite_after_s, 3600);
	CU_ASSERT_EQUAL_FATAL(c.n_pools, 1);
	CU_ASSERT_EQUAL(c.pools[0].remote, KVP_REMOTE_SPILL);

	/* as shipped: no remote tier, the pool's remote = off */
	CU_ASSERT_EQUAL_FATAL(kvp_conf_load_file(&c, g_example_path, err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(c.remote.enabled, 0);
	CU_ASSERT_EQUAL(c.pools[0].remote, KVP_REMOTE_OFF);
}

int main(int argc, char **argv)
{
	static const struct h_test tests[] = {
		H_TEST(test_kvp_conf_load_string_remote_absent),
		H_TEST(test_kvp_conf_load_string_remote_defaults),
		H_TEST(test_kvp_conf_load_string_remote_values),
		H_TEST(test_kvp_conf_load_string_remote_section_errors),
		H_TEST(test_kvp_conf_load_string_remote_bad_seeds),
		H_TEST(test_kvp_conf_load_string_remote_pool_errors),
		H_TEST(test_kvp_conf_remote_same_cases),
		H_TEST(test_kvp_conf_load_file_example_remote),
	};
	g_example_path = h_src_path(argc, argv, "systemd/kvpoold.conf.example");

	return H_RUN_SUITE("config_remote", NULL, NULL, tests);
}
