/* test_config.c - CUnit tests of daemon/conf/config.c: the INI format, its errors and defaults.
 *
 * usage: test_config [PATH-TO-kvpoold.conf.example]; without it the example is looked up as
 * $KVP_SRCDIR/systemd/kvpoold.conf.example, then systemd/kvpoold.conf.example. */
#include "config.h"

#include <CUnit/Basic.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>
#include <unistd.h>
#include "suite.h"

static const char *g_example_path;

/* A valid pool: 64 bytes per token, 256 bytes per page; lines 1..8. */
#define POOL_P                                                                                     \
	"[pool.p]\n"                                                                               \
	"layers = 2\n"                                                                             \
	"kv_heads = 1\n"                                                                           \
	"head_dim = 8\n"                                                                           \
	"dtype = fp16\n"                                                                           \
	"page_tokens = 4\n"                                                                        \
	"device = sim\n"                                                                           \
	"device_capacity = 1M\n"

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
	int r;

	memset(&c, 0xa5, sizeof(c));
	before = c;
	r = load(text, &c, err, sizeof(err));
	CU_ASSERT_EQUAL(r, -EINVAL);
	if (strcmp(err, msg) != 0)
		fprintf(stderr, "\n  expected: %s\n  got:      %s\n", msg, err);
	CU_ASSERT_STRING_EQUAL(err, msg);
	CU_ASSERT_EQUAL(memcmp(&c, &before, sizeof(c)), 0);
}

static void test_kvp_conf_load_string_good(void)
{
	static const char text[] = "; full file\n"
				   "[daemon]\n"
				   "socket = /run/kvp/test.sock\n"
				   "allowed_users = 0 root, 1000       ; uids or names\n"
				   "allowed_groups = root,5\n"
				   "admin_groups = 0\n"
				   "keepalive_ms = 2500\n"
				   "log_level = debug\n"
				   "metrics_listen = 127.0.0.1:9464\n"
				   "max_sessions = 8\n"
				   "max_leases_per_session = 16\n"
				   "max_locks_per_session = 32\n"
				   "\n"
				   "[pool.llama3-8b]\n"
				   "layers = 32\n"
				   "kv_heads = 8\n"
				   "head_dim = 128\n"
				   "dtype = bf16            ; fp16 bf16 fp8 fp32\n"
				   "page_tokens = 16\n"
				   "device = cuda:1\n"
				   "device_capacity = 40G\n"
				   "host_capacity = 64G\n"
				   "numa_node = 1\n"
				   "hugepages = try\n"
				   "mlock = on\n"
				   "session_quota = 100000\n"
				   "eviction = lfu\n"
				   "[pool.Small_2.x]\n"
				   "layers = 1\n"
				   "kv_heads = 1\n"
				   "head_dim = 1\n"
				   "dtype = fp8\n"
				   "page_tokens = 1\n"
				   "host_capacity = 10t\n";
	struct kvp_conf c;
	char err[512];
	const struct kvp_pool_conf *p = &c.pools[0], *q = &c.pools[1];

	CU_ASSERT_EQUAL_FATAL(load(text, &c, err, sizeof(err)), 0);
	CU_ASSERT_STRING_EQUAL(err, "");
	CU_ASSERT_STRING_EQUAL(c.socket, "/run/kvp/test.sock");
	CU_ASSERT_EQUAL(c.n_allowed_uids, 3);
	CU_ASSERT_EQUAL(c.allowed_uids[0], 0);
	CU_ASSERT_EQUAL(c.allowed_uids[1], 0);
	CU_ASSERT_EQUAL(c.allowed_uids[2], 1000);
	CU_ASSERT_EQUAL(c.n_allowed_gids, 2);
	CU_ASSERT_EQUAL(c.allowed_gids[0], 0);
	CU_ASSERT_EQUAL(c.allowed_gids[1], 5);
	CU_ASSERT_EQUAL(c.n_admin_gids, 1);
	CU_ASSERT_EQUAL(c.keepalive_ms, 2500);
	CU_ASSERT_EQUAL(c.log_level, LOG_DEBUG);
	CU_ASSERT_STRING_EQUAL(c.metrics_listen, "127.0.0.1:9464");
	CU_ASSERT_EQUAL(c.max_sessions, 8);
	CU_ASSERT_EQUAL(c.max_leases_per_session, 16);
	CU_ASSERT_EQUAL(c.max_locks_per_session, 32);
	CU_ASSERT_EQUAL_FATAL(c.n_pools, 2);

	CU_ASSERT_STRING_EQUAL(p->name, "llama3-8b");
	CU_ASSERT_EQUAL(p->layers, 32);
	CU_ASSERT_EQUAL(p->kv_heads, 8);
	CU_ASSERT_EQUAL(p->head_dim, 128);
	CU_ASSERT_EQUAL(p->page_tokens, 16);
	CU_ASSERT_EQUAL(p->dtype, KVP_CONF_DTYPE_BF16);
	CU_ASSERT_EQUAL(p->device, KVP_DEVICE_CUDA);
	CU_ASSERT_EQUAL(p->cuda_device, 1);
	CU_ASSERT_EQUAL(kvp_conf_token_bytes(p), 131072);
	CU_ASSERT_EQUAL(kvp_conf_page_bytes(p), 2097152);
	CU_ASSERT_EQUAL(p->device_pages, 20480); /* 40 GiB / 2 MiB */
	CU_ASSERT_EQUAL(p->host_pages, 32768);
	CU_ASSERT_EQUAL(p->numa_node, 1);
	CU_ASSERT_EQUAL(p->hugepages, KVP_TRY);
	CU_ASSERT_EQUAL(p->mlock, KVP_ON);
	CU_ASSERT_EQUAL(p->session_quota_tokens, 100000);
	CU_ASSERT_EQUAL(p->eviction, KVP_EVICT_LFU);

	CU_ASSERT_STRING_EQUAL(q->name, "Small_2.x");
	CU_ASSERT_EQUAL(q->device, KVP_DEVICE_NONE);
	CU_ASSERT_EQUAL(q->device_pages, 0);
	CU_ASSERT_EQUAL(q->host_pages, 10);
	CU_ASSERT_EQUAL(kvp_conf_page_bytes(q), 2);
	/* defaults */
	CU_ASSERT_EQUAL(q->numa_node, KVP_NUMA_NODE_AUTO);
	CU_ASSERT_EQUAL(q->hugepages, KVP_OFF);
	CU_ASSERT_EQUAL(q->mlock, KVP_TRY);
	CU_ASSERT_EQUAL(q->session_quota_tokens, 0);
	CU_ASSERT_EQUAL(q->eviction, KVP_EVICT_LRU);
}

static void test_kvp_conf_load_string_defaults(void)
{
	struct kvp_conf c, d;
	char err[256];

	CU_ASSERT_EQUAL_FATAL(load(POOL_P, &c, err, sizeof(err)), 0);
	kvp_conf_defaults(&d);
	CU_ASSERT_STRING_EQUAL(c.socket, "/run/kvpool/kvpoold.sock");
	CU_ASSERT_STRING_EQUAL(d.socket, "/run/kvpool/kvpoold.sock");
	CU_ASSERT_EQUAL(c.keepalive_ms, 10000);
	CU_ASSERT_EQUAL(c.log_level, LOG_INFO);
	CU_ASSERT_STRING_EQUAL(c.metrics_listen, "");
	CU_ASSERT_EQUAL(c.max_sessions, 1024);
	CU_ASSERT_EQUAL(c.max_leases_per_session, 4096);
	CU_ASSERT_EQUAL(c.max_locks_per_session, 4096);
	CU_ASSERT_EQUAL(c.n_allowed_uids + c.n_allowed_gids + c.n_admin_gids, 0);
	CU_ASSERT_EQUAL(d.n_pools, 0);
	CU_ASSERT_EQUAL(c.n_pools, 1);
	CU_ASSERT_EQUAL(c.pools[0].device_pages, 4096);
	CU_ASSERT_EQUAL(c.pools[0].host_pages, 0);
}

static void test_kvp_conf_load_string_crlf_bom_comments(void)
{
	static const char text[] = "\xEF\xBB\xBF# comment\r\n"
				   "[daemon]\r\n"
				   "log_level = warning ; inline\r\n"
				   "\r\n"
				   "[pool.q]   ; comment\r\n"
				   "  layers = 2 ; indented, but the first key of its section\r\n"
				   "kv_heads=1\r\n"
				   "head_dim:8\r\n"
				   "dtype = fp32\r\n"
				   "page_tokens = 4\r\n"
				   "host_capacity = 4 tokens\r\n";
	struct kvp_conf c;
	char err[256];

	CU_ASSERT_EQUAL_FATAL(load(text, &c, err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(c.log_level, LOG_WARNING);
	CU_ASSERT_STRING_EQUAL(c.pools[0].name, "q");
	CU_ASSERT_EQUAL(c.pools[0].host_pages, 1);
	CU_ASSERT_EQUAL(c.pools[0].dtype, KVP_CONF_DTYPE_FP32);
}

static void test_kvp_conf_load_embedded_default(void)
{
	struct kvp_conf c;
	char err[256] = "";
	const struct kvp_pool_conf *p = &c.pools[0];

	CU_ASSERT_EQUAL_FATAL(kvp_conf_load_embedded(&c, err, sizeof(err)), 0);
	CU_ASSERT_STRING_EQUAL(err, "");
	CU_ASSERT_EQUAL_FATAL(c.n_pools, 1);
	CU_ASSERT_STRING_EQUAL(p->name, "default");
	CU_ASSERT_EQUAL(p->layers, 4);
	CU_ASSERT_EQUAL(p->kv_heads, 2);
	CU_ASSERT_EQUAL(p->head_dim, 64);
	CU_ASSERT_EQUAL(p->dtype, KVP_CONF_DTYPE_FP16);
	CU_ASSERT_EQUAL(p->page_tokens, 16);
	CU_ASSERT_EQUAL(p->device, KVP_DEVICE_SIM);
	CU_ASSERT_EQUAL(kvp_conf_page_bytes(p), 32768);
	CU_ASSERT_EQUAL(p->device_pages * kvp_conf_page_bytes(p), 128ull << 20);
	CU_ASSERT_EQUAL(p->host_pages * kvp_conf_page_bytes(p), 128ull << 20);
	CU_ASSERT_EQUAL(p->numa_node, KVP_NUMA_NODE_AUTO);
	CU_ASSERT_EQUAL(p->hugepages, KVP_OFF);
	CU_ASSERT_EQUAL(p->mlock, KVP_TRY);
	CU_ASSERT_EQUAL(p->eviction, KVP_EVICT_LRU);
	CU_ASSERT_EQUAL(p->session_quota_tokens, 0);
	CU_ASSERT_STRING_EQUAL(c.socket, "/run/kvpool/kvpoold.sock");
	CU_ASSERT_PTR_NOT_NULL(strstr(kvp_conf_embedded_text(), "[pool.default]"));
}

static void test_kvp_conf_load_file_example(void)
{
	struct kvp_conf c;
	char err[512] = "";
	int r = kvp_conf_load_file(&c, g_example_path, err, sizeof(err));

	if (r)
		fprintf(stderr, "\n  %s\n", err);
	CU_ASSERT_EQUAL_FATAL(r, 0);
	CU_ASSERT_EQUAL_FATAL(c.n_pools, 1);
	CU_ASSERT_STRING_EQUAL(c.pools[0].name, "example");
	CU_ASSERT_EQUAL(c.pools[0].device, KVP_DEVICE_SIM);
	CU_ASSERT_EQUAL(c.pools[0].device_pages, 2048); /* 64 MiB of 32 KiB pages */
	CU_ASSERT_EQUAL(c.pools[0].host_pages, 2048);
	CU_ASSERT_STRING_EQUAL(c.socket, "/run/kvpool/kvpoold.sock");
}

/* The commented-out cuda pool of the example is valid too. */
static void test_kvp_conf_load_file_example_cuda(void)
{
	static char text[16384];
	char line[512], err[512];
	struct kvp_conf c;
	bool in_cuda = false;
	FILE *f = fopen(g_example_path, "re");
	size_t n = 0;

	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	text[0] = '\0';
	while (fgets(line, sizeof(line), f)) {
		const char *l = line;

		if (strncmp(line, ";[pool.", 7) == 0)
			in_cuda = true;
		if (in_cuda && line[0] == ';')
			l = line + 1;
		n += (size_t)snprintf(text + n, sizeof(text) - n, "%s", l);
		CU_ASSERT_FATAL(n < sizeof(text));
	}
	fclose(f);
	CU_ASSERT_TRUE(in_cuda);
	CU_ASSERT_EQUAL_FATAL(load(text, &c, err, sizeof(err)), 0);
	CU_ASSERT_EQUAL_FATAL(c.n_pools, 2);
	CU_ASSERT_STRING_EQUAL(c.pools[1].name, "llama3-8b");
	CU_ASSERT_EQUAL(c.pools[1].device, KVP_DEVICE_CUDA);
	CU_ASSERT_EQUAL(c.pools[1].device_pages, 20480);
}

static void test_kvp_conf_load_file_line_numbers(void)
{
	char path[] = "/tmp/kvp-test-conf.XXXXXX";
	char expect[512], err[512];
	struct kvp_conf c;
	int fd = mkstemp(path);
	FILE *f;

	CU_ASSERT_FATAL(fd >= 0);
	f = fdopen(fd, "w");
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	fputs("[daemon]\n\n; comment\nlog_level = info\n" POOL_P "page_tokens = 8\n", f);
	fclose(f);
	CU_ASSERT_EQUAL(kvp_conf_load_file(&c, path, err, sizeof(err)), -EINVAL);
	snprintf(expect, sizeof(expect),
		 "%s:13: key 'page_tokens' in [pool.p]: given twice (first at line 10)", path);
	CU_ASSERT_STRING_EQUAL(err, expect);

	/* a NUL byte in a file */
	f = fopen(path, "w");
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	fwrite(POOL_P "x = \0y\n", 1, sizeof(POOL_P "x = \0y\n") - 1, f);
	fclose(f);
	CU_ASSERT_EQUAL(kvp_conf_load_file(&c, path, err, sizeof(err)), -EINVAL);
	snprintf(expect, sizeof(expect), "%s:9: line contains a NUL byte", path);
	CU_ASSERT_STRING_EQUAL(err, expect);
	unlink(path);
}

static void test_kvp_conf_load_file_missing(void)
{
	struct kvp_conf c;
	char err[256];

	CU_ASSERT_EQUAL(kvp_conf_load_file(&c, "/nonexistent/kvpoold.conf", err, sizeof(err)),
			-ENOENT);
	CU_ASSERT_STRING_EQUAL(err, "/nonexistent/kvpoold.conf: cannot open: No such file or "
				    "directory");
}

static void test_kvp_conf_load_string_bad_number(void)
{
	expect_err(POOL_P "[pool.q]\nlayers = x\n",
		   "t.conf:10: key 'layers' in [pool.q]: expected a positive integer, got 'x'");
	expect_err("[pool.q]\nlayers = -1\n",
		   "t.conf:2: key 'layers' in [pool.q]: expected a positive integer, got '-1'");
	expect_err("[pool.q]\nlayers = 12abc\n",
		   "t.conf:2: key 'layers' in [pool.q]: expected a positive integer, got '12abc'");
	expect_err("[pool.q]\nlayers =\n",
		   "t.conf:2: key 'layers' in [pool.q]: expected a positive integer, got ''");
	expect_err("[pool.q]\nsession_quota = many\n",
		   "t.conf:2: key 'session_quota' in [pool.q]: expected a non-negative integer, "
		   "got 'many'");
	expect_err("[daemon]\nmax_sessions = 0x10\n",
		   "t.conf:2: key 'max_sessions' in [daemon]: expected a positive integer, got "
		   "'0x10'");
	expect_err("[daemon]\nmax_sessions = 65537\n",
		   "t.conf:2: key 'max_sessions' in [daemon]: expected an integer in 1..65536, got "
		   "'65537'");
}

static void test_kvp_conf_load_string_out_of_range(void)
{
	expect_err("[pool.q]\npage_tokens = 1025\n",
		   "t.conf:2: key 'page_tokens' in [pool.q]: expected an integer in 1..1024, got "
		   "'1025'");
	expect_err("[pool.q]\nlayers = 0\n",
		   "t.conf:2: key 'layers' in [pool.q]: expected an integer in 1..1024, got '0'");
	expect_err("[pool.q]\nhead_dim = 4097\n",
		   "t.conf:2: key 'head_dim' in [pool.q]: expected an integer in 1..4096, got "
		   "'4097'");
	expect_err("[pool.q]\nkv_heads = 99999999999999999999999\n",
		   "t.conf:2: key 'kv_heads' in [pool.q]: expected an integer in 1..1024, got "
		   "'99999999999999999999999'");
	expect_err(
		"[daemon]\nkeepalive_ms = 99\n",
		"t.conf:2: key 'keepalive_ms' in [daemon]: expected a duration in 100..86400000 ms, "
		"got '99'");
	expect_err("[daemon]\nkeepalive_ms = 2d\n",
		   "t.conf:2: key 'keepalive_ms' in [daemon]: expected a duration: a whole number "
		   "of ms, or one with a unit (ms, s, m, h), got '2d'");
	expect_err(
		"[daemon]\nkeepalive_ms = 25h\n",
		"t.conf:2: key 'keepalive_ms' in [daemon]: expected a duration in 100..86400000 ms, "
		"got '25h'");
	expect_err("[pool.q]\nnuma_node = 1024\n",
		   "t.conf:2: key 'numa_node' in [pool.q]: expected auto or a node number in "
		   "0..1023, got '1024'");
}

static void test_kvp_conf_load_string_unknown_key(void)
{
	expect_err(POOL_P "layer = 3\n", "t.conf:9: unknown key 'layer' in [pool.p]");
	expect_err("[daemon]\nsocket_path = /x\n",
		   "t.conf:2: unknown key 'socket_path' in [daemon]");
	expect_err("; top\nlayers = 3\n" POOL_P, "t.conf:2: key 'layers' outside any section");
}

static void test_kvp_conf_load_string_unknown_section(void)
{
	expect_err(POOL_P "[pools.x]\nlayers = 1\n",
		   "t.conf:9: unknown section [pools.x]: "
		   "expected [daemon], [remote], [events] or [pool.NAME]");
	/* even one without keys */
	expect_err(POOL_P "[Daemon]\n", "t.conf:9: unknown section [Daemon]: "
					"expected [daemon], [remote], [events] or [pool.NAME]");
	expect_err("[daemon]\n[daemon]\n" POOL_P, "t.conf:2: [daemon] appears twice");
}

static void test_kvp_conf_load_string_missing_key(void)
{
	expect_err("[pool.q]\nlayers = 2\nkv_heads = 1\ndtype = fp16\npage_tokens = 4\n"
		   "host_capacity = 1M\n",
		   "t.conf:1: [pool.q]: missing required key 'head_dim'");
	expect_err(POOL_P "\n[pool.empty]\n",
		   "t.conf:10: [pool.empty]: missing required key 'layers'");
	expect_err("[pool.q]\nlayers = 2\nkv_heads = 1\nhead_dim = 8\npage_tokens = 4\n"
		   "host_capacity = 1M\n",
		   "t.conf:1: [pool.q]: missing required key 'dtype'");
	expect_err("[daemon]\nlog_level = info\n",
		   "t.conf: no [pool.NAME] section: at least one pool is required");
	expect_err("", "t.conf: no [pool.NAME] section: at least one pool is required");
}

static void test_kvp_conf_load_string_no_capacity(void)
{
	expect_err("[pool.q]\nlayers = 2\nkv_heads = 1\nhead_dim = 8\ndtype = fp16\n"
		   "page_tokens = 4\n",
		   "t.conf:1: [pool.q]: no capacity: a pool without a device (device = none) "
		   "needs a nonzero host_capacity");
	expect_err("[pool.q]\nlayers = 2\nkv_heads = 1\nhead_dim = 8\ndtype = fp16\n"
		   "page_tokens = 4\ndevice = none\nhost_capacity = 0\n",
		   "t.conf:1: [pool.q]: no capacity: a pool without a device (device = none) "
		   "needs a nonzero host_capacity");
	expect_err("[pool.q]\nlayers = 2\nkv_heads = 1\nhead_dim = 8\ndtype = fp16\n"
		   "page_tokens = 4\ndevice = sim\nhost_capacity = 1M\n",
		   "t.conf:1: [pool.q]: device = sim needs a nonzero device_capacity");
	expect_err("[pool.q]\nlayers = 2\nkv_heads = 1\nhead_dim = 8\ndtype = fp16\n"
		   "page_tokens = 4\ndevice_capacity = 1M\n",
		   "t.conf:7: key 'device_capacity' in [pool.q]: the pool has no device (device "
		   "= none, the default); set device = cuda:N or sim, or remove the key");
}

static void test_kvp_conf_load_string_bad_enum(void)
{
	expect_err("[pool.q]\ndtype = int8\n",
		   "t.conf:2: key 'dtype' in [pool.q]: expected fp16, bf16, fp8 or fp32, got "
		   "'int8'");
	expect_err("[pool.q]\ndevice = gpu0\n",
		   "t.conf:2: key 'device' in [pool.q]: expected cuda:N, sim or none, got 'gpu0'");
	expect_err(
		"[pool.q]\ndevice = cuda:x\n",
		"t.conf:2: key 'device' in [pool.q]: expected cuda:N, sim or none, got 'cuda:x'");
	expect_err("[pool.q]\nhugepages = yes\n",
		   "t.conf:2: key 'hugepages' in [pool.q]: expected off, try or on, got 'yes'");
	expect_err("[pool.q]\nmlock = always\n",
		   "t.conf:2: key 'mlock' in [pool.q]: expected off, try or on, got 'always'");
	expect_err("[pool.q]\neviction = fifo\n",
		   "t.conf:2: key 'eviction' in [pool.q]: expected lru or lfu, got 'fifo'");
	expect_err("[daemon]\nlog_level = verbose\n",
		   "t.conf:2: key 'log_level' in [daemon]: expected err, warning, notice, info or "
		   "debug, got 'verbose'");
}

static void test_kvp_conf_load_string_bad_size(void)
{
	expect_err("[pool.q]\nhost_capacity = 40X\n",
		   "t.conf:2: key 'host_capacity' in [pool.q]: expected bytes with an optional "
		   "K/M/G/T suffix (powers of 1024) or tokens like 300000t, got '40X'");
	expect_err("[pool.q]\nhost_capacity = G\n",
		   "t.conf:2: key 'host_capacity' in [pool.q]: expected bytes with an optional "
		   "K/M/G/T suffix (powers of 1024) or tokens like 300000t, got 'G'");
	expect_err("[pool.q]\ndevice_capacity = 40GB\n",
		   "t.conf:2: key 'device_capacity' in [pool.q]: expected bytes with an optional "
		   "K/M/G/T suffix (powers of 1024) or tokens like 300000t, got '40GB'");
	expect_err("[pool.q]\ndevice_capacity = 16777216T\n",
		   "t.conf:2: key 'device_capacity' in [pool.q]: '16777216T' does not fit in 64 "
		   "bits");
}

static void test_kvp_conf_load_string_capacity_resolution(void)
{
	/* page: 64 bytes per token * 4 tokens = 256 bytes */
	static const char head[] = "[pool.q]\nlayers = 2\nkv_heads = 1\nhead_dim = 8\n"
				   "dtype = fp16\npage_tokens = 4\ndevice = sim\n";
	static const struct {
		const char *dev, *host;
		uint64_t dev_pages, host_pages;
	} cases[] = {
		{ "1000", "0", 3, 0 }, /* bytes round down */
		{ "1024", "1025", 4, 4 },   { "1K", "2k", 4, 8 },
		{ "1KiB", "1M", 4, 4096 },  { "5t", "4t", 2, 1 }, /* tokens round up */
		{ "8 tokens", "9t", 2, 3 }, { "1G", "1GiB", 1u << 22, 1u << 22 },
	};
	char text[512], err[512];
	struct kvp_conf c;

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		snprintf(text, sizeof(text), "%sdevice_capacity = %s\nhost_capacity = %s\n", head,
			 cases[i].dev, cases[i].host);
		CU_ASSERT_EQUAL_FATAL(load(text, &c, err, sizeof(err)), 0);
		CU_ASSERT_EQUAL(c.pools[0].device_pages, cases[i].dev_pages);
		CU_ASSERT_EQUAL(c.pools[0].host_pages, cases[i].host_pages);
	}
	/* 1 TiB of 256-byte pages is 2^32 pages: one too many */
	snprintf(text, sizeof(text), "%sdevice_capacity = 1T\n", head);
	CU_ASSERT_EQUAL(load(text, &c, err, sizeof(err)), -EINVAL);
	CU_ASSERT_STRING_EQUAL(err,
			       "t.conf:8: key 'device_capacity' in [pool.q]: '1T' is too "
			       "large: 4294967296 pages of 256 bytes, at most 4294967294 pages "
			       "and 2^63 bytes");
	/* the largest count that fits */
	snprintf(text, sizeof(text), "%sdevice_capacity = %llut\n", head, 4ull * (UINT32_MAX - 1));
	CU_ASSERT_EQUAL_FATAL(load(text, &c, err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(c.pools[0].device_pages, UINT32_MAX - 1);
	snprintf(text, sizeof(text), "%sdevice_capacity = %llut\n", head,
		 4ull * (UINT32_MAX - 1) + 1);
	CU_ASSERT_EQUAL(load(text, &c, err, sizeof(err)), -EINVAL);
	snprintf(text, sizeof(text), "%shost_capacity = 255\ndevice_capacity = 1K\n", head);
	CU_ASSERT_EQUAL(load(text, &c, err, sizeof(err)), -EINVAL);
	CU_ASSERT_STRING_EQUAL(err, "t.conf:8: key 'host_capacity' in [pool.q]: '255' is less than "
				    "one page (256 bytes)");
}

static void test_kvp_conf_load_string_too_large(void)
{
	/* 1024 layers * 2 * 1024 heads * 4096 dim * 4 bytes * 1024 tokens = 2^45 bytes a page:
	 * 2^18 pages are 2^63 bytes, over the limit even though the page count fits. */
	static const char text[] = "[pool.big]\nlayers = 1024\nkv_heads = 1024\nhead_dim = 4096\n"
				   "dtype = fp32\npage_tokens = 1024\nhost_capacity = 268435456t\n";
	struct kvp_conf c;
	char err[512];

	CU_ASSERT_EQUAL(load(text, &c, err, sizeof(err)), -EINVAL);
	CU_ASSERT_STRING_EQUAL(err, "t.conf:7: key 'host_capacity' in [pool.big]: '268435456t' is "
				    "too large: 262144 pages of 35184372088832 bytes, at most "
				    "4294967294 pages and 2^63 bytes");
	expect_err("[pool.q]\nhost_capacity = 18446744073709551616\n",
		   "t.conf:2: key 'host_capacity' in [pool.q]: '18446744073709551616' does not fit "
		   "in 64 bits");
}

static void test_kvp_conf_load_string_duplicate_pool(void)
{
	expect_err(POOL_P "[pool.x]\n" POOL_P,
		   "t.conf:10: [pool.p]: duplicate pool name (first at line 1)");
	expect_err(POOL_P "page_tokens = 4\n",
		   "t.conf:9: key 'page_tokens' in [pool.p]: given twice (first at line 6)");
}

/* n pools p0..p(n-1), 7 lines each */
static void make_pools(char *text, size_t len, int n)
{
	size_t off = 0;

	text[0] = '\0';
	for (int i = 0; i < n; i++)
		off += (size_t)snprintf(text + off, len - off,
					"[pool.p%d]\nlayers = 1\nkv_heads = 1\nhead_dim = 1\n"
					"dtype = fp16\npage_tokens = 1\nhost_capacity = 1K\n",
					i);
}

static void test_kvp_conf_load_string_too_many_pools(void)
{
	char text[8192], err[256];
	struct kvp_conf c;

	make_pools(text, sizeof(text), KVP_MAX_POOLS + 1);
	expect_err(text, "t.conf:113: [pool.p16]: more than 16 pools");
	make_pools(text, sizeof(text), KVP_MAX_POOLS);
	CU_ASSERT_EQUAL(load(text, &c, err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(c.n_pools, KVP_MAX_POOLS);
	CU_ASSERT_STRING_EQUAL(c.pools[15].name, "p15");
}

static void test_kvp_conf_load_string_bad_name(void)
{
	char text[512], err[512], name[80];
	struct kvp_conf c;

	expect_err("[pool.a b]\n", "t.conf:1: [pool.a b]: bad pool name 'a b': use 1..63 "
				   "characters of A-Z a-z 0-9 . _ -");
	expect_err("[pool.]\n", "t.conf:1: [pool.]: bad pool name '': use 1..63 characters of "
				"A-Z a-z 0-9 . _ -");
	expect_err("[pool.x/y]\n", "t.conf:1: [pool.x/y]: bad pool name 'x/y': use 1..63 "
				   "characters of A-Z a-z 0-9 . _ -");
	/* 63 characters load whole, beyond the 49 inih keeps of a section name */
	memset(name, 'n', 63);
	name[63] = '\0';
	snprintf(text, sizeof(text),
		 "[pool.%s]\nlayers = 1\nkv_heads = 1\nhead_dim = 1\ndtype = fp16\n"
		 "page_tokens = 1\nhost_capacity = 1K\n",
		 name);
	CU_ASSERT_EQUAL_FATAL(load(text, &c, err, sizeof(err)), 0);
	CU_ASSERT_STRING_EQUAL(c.pools[0].name, name);
	name[63] = 'n';
	name[64] = '\0';
	snprintf(text, sizeof(text), "[pool.%s]\n", name);
	CU_ASSERT_EQUAL(load(text, &c, err, sizeof(err)), -EINVAL);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "t.conf:1: [pool.nnnn"));
	CU_ASSERT_PTR_NOT_NULL(strstr(err, ": use 1..63 characters"));
}

static void test_kvp_conf_load_string_syntax(void)
{
	expect_err(POOL_P "layers 3\n",
		   "t.conf:9: syntax error: expected [section], key = value or a comment");
	expect_err("[pool.p\nlayers = 1\n",
		   "t.conf:1: syntax error: expected [section], key = value or a comment");
	expect_err(POOL_P "host_capacity = 1M\n    1M\n",
		   "t.conf:10: key 'host_capacity' in [pool.p]: an indented line continues the "
		   "previous value, which this file does not allow; remove the leading "
		   "whitespace");
	/* inih reads an indented header after a key as a continuation too */
	expect_err("[daemon]\nlog_level = info\n  [pool.p]\n",
		   "t.conf:3: key 'log_level' in [daemon]: an indented line continues the "
		   "previous value, which this file does not allow; remove the leading "
		   "whitespace");
	expect_err("[pool.p]\n  layers = 2\n  kv_heads = 1\n",
		   "t.conf:3: key 'layers' in [pool.p]: an indented line continues the previous "
		   "value, which this file does not allow; remove the leading whitespace");
}

static void test_kvp_conf_load_string_long_line(void)
{
	struct kvp_conf c;
	char text[1024], err[256];
	int n = snprintf(text, sizeof(text), "%s; ", POOL_P);

	memset(text + n, 'c', 300);
	strcpy(text + n + 300, "\n");
	expect_err(text, "t.conf:9: line longer than 199 characters");
	/* exactly 199 characters before the newline is fine */
	text[n + 197] = '\n';
	text[n + 198] = '\0';
	CU_ASSERT_EQUAL(load(text, &c, err, sizeof(err)), 0);
}

static void test_kvp_conf_load_string_daemon_values(void)
{
	char text[1024];
	struct kvp_conf c;
	char err[512];

	expect_err("[daemon]\nsocket = run/kvp.sock\n",
		   "t.conf:2: key 'socket' in [daemon]: expected an absolute path of at most 107 "
		   "characters, got 'run/kvp.sock'");
	expect_err("[daemon]\nmetrics_listen = 9464\n",
		   "t.conf:2: key 'metrics_listen' in [daemon]: expected host:port of at most 63 "
		   "characters (127.0.0.1:9464, [::1]:9464), got '9464'");
	expect_err("[daemon]\nmetrics_listen = ::1:9464\n",
		   "t.conf:2: key 'metrics_listen' in [daemon]: expected host:port of at most 63 "
		   "characters (127.0.0.1:9464, [::1]:9464), got '::1:9464'");
	expect_err("[daemon]\nmetrics_listen = localhost:70000\n",
		   "t.conf:2: key 'metrics_listen' in [daemon]: expected host:port of at most 63 "
		   "characters (127.0.0.1:9464, [::1]:9464), got 'localhost:70000'");
	expect_err("[daemon]\nallowed_groups = root kvp-no-such-group-x\n",
		   "t.conf:2: key 'allowed_groups' in [daemon]: unknown group "
		   "'kvp-no-such-group-x'");
	expect_err("[daemon]\nallowed_users = kvp-no-such-user-x\n",
		   "t.conf:2: key 'allowed_users' in [daemon]: unknown user 'kvp-no-such-user-x'");
	expect_err("[daemon]\nadmin_groups = 4294967295\n",
		   "t.conf:2: key 'admin_groups' in [daemon]: '4294967295' is not a valid group "
		   "id");

	snprintf(text, sizeof(text), "[daemon]\nmetrics_listen = [::1]:9464\n%s", POOL_P);
	CU_ASSERT_EQUAL(load(text, &c, err, sizeof(err)), 0);
	CU_ASSERT_STRING_EQUAL(c.metrics_listen, "[::1]:9464");
	/* 32 ids fit, 33 do not */
	strcpy(text, "[daemon]\nallowed_users =");
	for (int i = 0; i < KVP_MAX_IDS; i++)
		sprintf(text + strlen(text), " %d", i);
	strcat(text, "\n" POOL_P);
	CU_ASSERT_EQUAL(load(text, &c, err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(c.n_allowed_uids, KVP_MAX_IDS);
	CU_ASSERT_EQUAL(c.allowed_uids[31], 31);
	strcpy(text, "[daemon]\nallowed_users =");
	for (int i = 0; i <= KVP_MAX_IDS; i++)
		sprintf(text + strlen(text), " %d", i);
	strcat(text, "\n");
	expect_err(text, "t.conf:2: key 'allowed_users' in [daemon]: more than 32 entries");
}

static void test_kvp_conf_load_string_error_truncated(void)
{
	struct kvp_conf c;
	char err[12];

	CU_ASSERT_EQUAL(load("[x]\n", &c, err, sizeof(err)), -EINVAL);
	CU_ASSERT_STRING_EQUAL(err, "t.conf:1: u");
	CU_ASSERT_EQUAL(kvp_conf_load_string(&c, "[x]\n", NULL, NULL, 0), -EINVAL);
	CU_ASSERT_EQUAL(kvp_conf_load_string(&c, "[x]\n", NULL, err, sizeof(err)), -EINVAL);
	CU_ASSERT_STRING_EQUAL(err, "<string>:1:");
}

static void test_kvp_pool_page_bytes_dtypes(void)
{
	struct kvp_pool_conf p = {
		.layers = 32, .kv_heads = 8, .head_dim = 128, .page_tokens = 16
	};

	p.dtype = KVP_CONF_DTYPE_FP8;
	CU_ASSERT_EQUAL(kvp_conf_token_bytes(&p), 65536);
	p.dtype = KVP_CONF_DTYPE_FP32;
	CU_ASSERT_EQUAL(kvp_conf_token_bytes(&p), 262144);
	CU_ASSERT_EQUAL(kvp_conf_page_bytes(&p), 262144 * 16);
	CU_ASSERT_STRING_EQUAL(kvp_conf_dtype_name(KVP_CONF_DTYPE_BF16), "bf16");
	CU_ASSERT_STRING_EQUAL(kvp_conf_dtype_name(KVP_CONF_DTYPE_MAX), "?");
	CU_ASSERT_STRING_EQUAL(kvp_device_kind_name(KVP_DEVICE_CUDA), "cuda");
	CU_ASSERT_STRING_EQUAL(kvp_device_kind_name(KVP_DEVICE_SIM), "sim");
	CU_ASSERT_STRING_EQUAL(kvp_device_kind_name((enum kvp_device_kind) - 1), "?");
	CU_ASSERT_STRING_EQUAL(kvp_tristate_name(KVP_TRY), "try");
	CU_ASSERT_STRING_EQUAL(kvp_eviction_name(KVP_EVICT_LFU), "lfu");
}

static void test_kvp_conf_load_string_pool_access(void)
{
	struct kvp_conf c, d;
	const struct kvp_ns_owner *o;
	char err[512];

	CU_ASSERT_EQUAL_FATAL(load(POOL_P "allowed_users = 0, 1000 root\n"
					  "allowed_groups = root 5\n"
					  "session_quota = 64t\n"
					  "session_lock_quota = 32 tokens\n"
					  "uid_quota = 1000\n"
					  "namespace.7 = user:0, group:root,group:60020\n"
					  "namespace.18446744073709551615 = user:1000\n",
				   &c, err, sizeof(err)),
			      0);
	CU_ASSERT_EQUAL(c.pools[0].n_allowed_uids, 3);
	CU_ASSERT_EQUAL(c.pools[0].allowed_uids[1], 1000);
	CU_ASSERT_EQUAL(c.pools[0].allowed_uids[2], 0);
	CU_ASSERT_EQUAL(c.pools[0].n_allowed_gids, 2);
	CU_ASSERT_EQUAL(c.pools[0].allowed_gids[1], 5);
	CU_ASSERT_EQUAL(c.n_allowed_uids, 0); /* the daemon's lists are apart */
	CU_ASSERT_EQUAL(c.pools[0].session_quota_tokens, 64);
	CU_ASSERT_EQUAL(c.pools[0].session_lock_quota_tokens, 32);
	CU_ASSERT_EQUAL(c.pools[0].uid_quota_tokens, 1000);
	CU_ASSERT_EQUAL(c.pools[0].n_ns_owners, 2);
	o = kvp_pool_conf_ns_owner(&c.pools[0], 7);
	CU_ASSERT_PTR_NOT_NULL_FATAL(o);
	CU_ASSERT_EQUAL(o->n_uids, 1);
	CU_ASSERT_EQUAL(o->uids[0], 0);
	CU_ASSERT_EQUAL(o->n_gids, 2);
	CU_ASSERT_EQUAL(o->gids[1], 60020);
	CU_ASSERT_PTR_NOT_NULL(kvp_pool_conf_ns_owner(&c.pools[0], UINT64_MAX));
	CU_ASSERT_PTR_NULL(kvp_pool_conf_ns_owner(&c.pools[0], 0));
	/* What a reload carries over to a running pool. */
	CU_ASSERT_EQUAL_FATAL(load(POOL_P, &d, err, sizeof(err)), 0);
	kvp_pool_conf_copy_access(&d.pools[0], &c.pools[0]);
	CU_ASSERT_EQUAL(d.pools[0].n_allowed_uids, 3);
	CU_ASSERT_EQUAL(d.pools[0].session_quota_tokens, 64);
	CU_ASSERT_EQUAL(d.pools[0].uid_quota_tokens, 1000);
	CU_ASSERT_PTR_NOT_NULL(kvp_pool_conf_ns_owner(&d.pools[0], 7));

	expect_err(POOL_P "namespace.x = user:0\n",
		   "t.conf:9: key 'namespace.x' in [pool.p]: expected namespace.N with N a "
		   "namespace number");
	expect_err(POOL_P "namespace.3 = user:0\nnamespace.3 = user:1\n",
		   "t.conf:10: key 'namespace.3' in [pool.p]: namespace 3 is bound twice");
	expect_err(POOL_P "namespace.3 = alice\n",
		   "t.conf:9: key 'namespace.3' in [pool.p]: expected user:NAME or group:NAME "
		   "entries, got 'alice'");
	expect_err(POOL_P "namespace.3 =\n",
		   "t.conf:9: key 'namespace.3' in [pool.p]: no owner: give user:NAME or "
		   "group:NAME entries");
	expect_err(POOL_P "namespace.3 = user:kvp-no-such-user-x\n",
		   "t.conf:9: key 'namespace.3' in [pool.p]: unknown user 'kvp-no-such-user-x'");
	expect_err(POOL_P "allowed_groups = kvp-no-such-group-x\n",
		   "t.conf:9: key 'allowed_groups' in [pool.p]: unknown group "
		   "'kvp-no-such-group-x'");
	expect_err(POOL_P "session_quota = 64G\n",
		   "t.conf:9: key 'session_quota' in [pool.p]: expected a non-negative integer, "
		   "got '64G'");
	expect_err(POOL_P "uid_quota = 99999999999999999999t\n",
		   "t.conf:9: key 'uid_quota' in [pool.p]: '99999999999999999999t' does not fit "
		   "in 64 bits");
	expect_err("[daemon]\nnamespace.3 = user:0\n",
		   "t.conf:2: unknown key 'namespace.3' in [daemon]");
}

static void test_kvp_conf_load_string_pressure_watermark(void)
{
	struct kvp_conf c, d;
	char err[512];

	CU_ASSERT_EQUAL_FATAL(load(POOL_P, &c, err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(c.pools[0].pressure_watermark_tokens, 0);
	CU_ASSERT_EQUAL(c.pools[0].pressure_watermark_pct, 0);
	CU_ASSERT_EQUAL(c.pools[0].pressure_interval_ms, 100);
	CU_ASSERT_EQUAL_FATAL(load(POOL_P "pressure_watermark = 12.5%\n"
					  "pressure_interval_ms = 0\n",
				   &c, err, sizeof(err)),
			      0);
	CU_ASSERT_EQUAL(c.pools[0].pressure_watermark_pct, 12.5);
	CU_ASSERT_EQUAL(c.pools[0].pressure_watermark_tokens, 0);
	CU_ASSERT_EQUAL(c.pools[0].pressure_interval_ms, 0);
	CU_ASSERT_EQUAL_FATAL(load(POOL_P "pressure_watermark = 4096t\n", &d, err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(d.pools[0].pressure_watermark_tokens, 4096);
	CU_ASSERT_EQUAL(d.pools[0].pressure_watermark_pct, 0);
	CU_ASSERT_EQUAL_FATAL(load(POOL_P "pressure_watermark = 300 tokens\n", &d, err,
				   sizeof(err)),
			      0);
	CU_ASSERT_EQUAL(d.pools[0].pressure_watermark_tokens, 300);
	/* a reload carries both over */
	kvp_pool_conf_copy_access(&d.pools[0], &c.pools[0]);
	CU_ASSERT_EQUAL(d.pools[0].pressure_watermark_pct, 12.5);
	CU_ASSERT_EQUAL(d.pools[0].pressure_watermark_tokens, 0);
	CU_ASSERT_EQUAL(d.pools[0].pressure_interval_ms, 0);
	expect_err(POOL_P "pressure_watermark = 101%\n",
		   "t.conf:9: key 'pressure_watermark' in [pool.p]: expected a percent in 0..100%, "
		   "got '101%'");
	expect_err(POOL_P "pressure_watermark = x%\n",
		   "t.conf:9: key 'pressure_watermark' in [pool.p]: expected a percent like 10% or "
		   "tokens like 4096t, got 'x%'");
	expect_err(POOL_P "pressure_watermark = 5G\n",
		   "t.conf:9: key 'pressure_watermark' in [pool.p]: expected a non-negative "
		   "integer, got '5G'");
	expect_err(POOL_P "pressure_interval_ms = 3600001\n",
		   "t.conf:9: key 'pressure_interval_ms' in [pool.p]: expected an integer in "
		   "0..3600000, got '3600001'");
}

int main(int argc, char **argv)
{
	static const struct h_test tests[] = {
		H_TEST(test_kvp_conf_load_string_good),
		H_TEST(test_kvp_conf_load_string_defaults),
		H_TEST(test_kvp_conf_load_string_crlf_bom_comments),
		H_TEST(test_kvp_conf_load_embedded_default),
		H_TEST(test_kvp_conf_load_file_example),
		H_TEST(test_kvp_conf_load_file_example_cuda),
		H_TEST(test_kvp_conf_load_file_line_numbers),
		H_TEST(test_kvp_conf_load_file_missing),
		H_TEST(test_kvp_conf_load_string_bad_number),
		H_TEST(test_kvp_conf_load_string_out_of_range),
		H_TEST(test_kvp_conf_load_string_unknown_key),
		H_TEST(test_kvp_conf_load_string_unknown_section),
		H_TEST(test_kvp_conf_load_string_missing_key),
		H_TEST(test_kvp_conf_load_string_no_capacity),
		H_TEST(test_kvp_conf_load_string_bad_enum),
		H_TEST(test_kvp_conf_load_string_bad_size),
		H_TEST(test_kvp_conf_load_string_capacity_resolution),
		H_TEST(test_kvp_conf_load_string_too_large),
		H_TEST(test_kvp_conf_load_string_duplicate_pool),
		H_TEST(test_kvp_conf_load_string_too_many_pools),
		H_TEST(test_kvp_conf_load_string_bad_name),
		H_TEST(test_kvp_conf_load_string_syntax),
		H_TEST(test_kvp_conf_load_string_long_line),
		H_TEST(test_kvp_conf_load_string_daemon_values),
		H_TEST(test_kvp_conf_load_string_error_truncated),
		H_TEST(test_kvp_pool_page_bytes_dtypes),
		H_TEST(test_kvp_conf_load_string_pool_access),
		H_TEST(test_kvp_conf_load_string_pressure_watermark),
	};
	g_example_path = h_src_path(argc, argv, "systemd/kvpoold.conf.example");

	return H_RUN_SUITE("config", NULL, NULL, tests);
}
