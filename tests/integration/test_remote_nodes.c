/* test_remote_nodes.c - two kvpoold nodes sharing a real 3-master Redis Cluster on loopback
 * (redis_cluster.sh: KVP_REDIS_PORTS, KVP_REDIS_DIR). Node A's engine publishes prompts into a
 * small host tier, which fills and spills; node B matches the same prompts, sees them remote,
 * fetches them and every byte equals what A wrote, also for prompts sharing a prefix spilled a
 * page at a time (deep paths hashed from the chain kept with a node). Then: one master killed
 * mid-run (misses for its slots, no error, both nodes serve; restarted: hits again), a corrupt
 * value and one of another geometry written by hand (misses, deleted, never served), and a master
 * slowed with DEBUG SLEEP while A's local Alloc and Match keep answering, far faster than the
 * sleep, with a p99 near that of a node without a remote tier (the ratio itself is bench_remote's
 * row). */
#include <CUnit/Basic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "eng.h"
#include "harness.h"
#include "remote_cluster.h"
#include "remote_value.h"
#include "secret.h"

enum { PT = 4, NP = 16, NTOK = PT * NP, PAGE = 256, HOST_PAGES = 64 };

static struct daemon g_a, g_b, g_c;
static struct h_eng g_ea, g_eb, g_ec;
static char g_ports[3][8];
static const char *g_dir;

static uint64_t now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* Prompts from FAMILY up share their first FAMILY_PAGES pages (those of prompt FAMILY, a node
 * of its own in the prefix tree, their tails the nodes below it). */
enum { FAMILY = 3840, FAMILY_PAGES = 8 };

static uint32_t owner_of(uint32_t prompt, uint32_t page)
{
	return prompt > FAMILY && page < FAMILY_PAGES ? FAMILY : prompt;
}

static uint8_t byte_of(uint32_t prompt, uint32_t page, uint32_t j)
{
	return (uint8_t)(owner_of(prompt, page) * 131u + page * 31u + j * 7u + 1u);
}

static void tokens_of(uint32_t prompt, uint32_t *t)
{
	for (uint32_t i = 0; i < NTOK; i++)
		t[i] = (owner_of(prompt, i / PT) << 12) | i;
}

/* A publishes prompt: 16 host pages written with its pattern, inserted. 0 or a code. */
static int publish(struct h_eng *e, uint32_t prompt)
{
	uint32_t pages[NP], t[NTOK];
	uint8_t *base = kvp_pool_tier_base(e->p, KVP_TIER_HOST);
	uint64_t lease, nt = 0;
	int r;

	if (!base)
		return -1;
	if ((r = kvp_lease_alloc(e->p, KVP_TIER_HOST, NP, &lease, pages, NULL)) < 0)
		return r;
	for (uint32_t i = 0; i < NP; i++)
		for (uint32_t j = 0; j < PAGE; j++)
			base[(uint64_t)pages[i] * PAGE + j] = byte_of(prompt, i, j);
	tokens_of(prompt, t);
	r = kvp_cache_insert(e->p, lease, 0, t, NTOK, 0, pages, NP, &nt, NULL);
	kvp_lease_free(e->p, lease, NULL, 0, NULL);
	return r;
}

/* Waits until node e has nothing in flight to the cluster (5 s). */
static void settle(struct h_eng *e)
{
	for (int i = 0; i < 500 && h_eng_counter(e, "remote_inflight_ops") != 0; i++)
		usleep(10000);
}

/* B fetches prompt with a lock; returns the leading pages now cached whose bytes are A's (and
 * checks that no page with other bytes is ever handed out), -1 on a call error. */
static int fetch_verified(struct h_eng *e, uint32_t prompt, uint32_t *remote_seen)
{
	struct kvp_match_result m = { .struct_size = sizeof(m) };
	struct kvp_fetch_result f = { .struct_size = sizeof(f) };
	uint32_t dev[NP], host[NP], t[NTOK];
	const uint8_t *base = kvp_pool_tier_base(e->p, KVP_TIER_HOST);
	int good = 0;

	tokens_of(prompt, t);
	if (kvp_cache_match(e->p, 0, t, NTOK, 0, &m, dev, host, NP, NULL) < 0)
		return -1;
	if (remote_seen)
		*remote_seen = m.remote_pages;
	if (kvp_cache_fetch(e->p, 0, t, NTOK, 1, &f, dev, host, NP, NULL) < 0)
		return -1;
	for (uint32_t i = 0; i < f.n_host; i++) {
		int same = 1;

		for (uint32_t j = 0; j < PAGE && same; j++)
			same = base[(uint64_t)host[i] * PAGE + j] == byte_of(prompt, i, j);
		CU_ASSERT(same); /* never a page with other bytes */
		good += same;
	}
	if (f.lock_id)
		CU_ASSERT_EQUAL(kvp_cache_release(e->p, f.lock_id, NULL), 0);
	return good;
}

static char g_conf_buf[3][1024];

/* Config idx: a host-only pool of 64 pages of 256 bytes, with the remote tier (spill) or
 * without any. No periodic checkpoint of the books: it rewrites them on the loop every second
 * they changed, on A and C alike, and one landing in a block of the latency test decided that
 * block's p99 on whichever node it hit. */
static const char *conf(int idx, int remote)
{
	char head[512] = "";

	if (remote)
		snprintf(head, sizeof(head),
			 "[remote]\nseeds = 127.0.0.1:%s,127.0.0.1:%s,127.0.0.1:%s\n"
			 "connect_timeout_ms = 300\ncommand_timeout_ms = 300\n"
			 "match_timeout_ms = 300\nmatch_max_pages = 64\nsecret = %s\n",
			 g_ports[0], g_ports[1], g_ports[2], h_secret_src());
	snprintf(
		g_conf_buf[idx], sizeof(g_conf_buf[idx]),
		"[daemon]\nsnapshot_interval_ms = 0\n%s[pool.p]\nlayers = 2\nkv_heads = 1\nhead_dim = 8\ndtype = fp16\n"
		"page_tokens = 4\nhost_capacity = %dt\nmlock = off\n%s",
		head, HOST_PAGES * PT, remote ? "remote = spill\n" : "");
	return g_conf_buf[idx];
}

static int init_suite(void)
{
	if (h_daemon_start(&g_a, conf(0, 1), NULL) < 0 ||
	    h_daemon_start(&g_b, conf(1, 1), NULL) < 0 ||
	    h_daemon_start(&g_c, conf(2, 0), NULL) < 0)
		return -1;
	if (h_eng_open(&g_ea, g_a.sock, "node-a", "p") < 0 ||
	    h_eng_open(&g_eb, g_b.sock, "node-b", "p") < 0 ||
	    h_eng_open(&g_ec, g_c.sock, "node-c", "p") < 0)
		return -1;
	/* Both nodes connected to every master. */
	for (int i = 0; i < 300; i++) {
		if (h_eng_counter(&g_ea, "remote_connects") >= 3 &&
		    h_eng_counter(&g_eb, "remote_connects") >= 3)
			return 0;
		usleep(10000);
	}
	return -1;
}

static int clean_suite(void)
{
	kvp_client_close(g_ea.c);
	kvp_client_close(g_eb.c);
	kvp_client_close(g_ec.c);
	return (h_daemon_finish(&g_a) | h_daemon_finish(&g_b) | h_daemon_finish(&g_c)) ? -1 : 0;
}

/* Prompts 0 .. 11 on A (192 pages into 64 host pages): the first ones spill. */
static void test_spill_then_remote_hits_on_other_node(void)
{
	uint32_t remote = 0;
	int64_t before = h_eng_counter(&g_eb, "remote_fetched_pages");

	for (uint32_t s = 0; s < 12; s++)
		CU_ASSERT_EQUAL_FATAL(publish(&g_ea, s), 0);
	settle(&g_ea);
	CU_ASSERT(h_eng_counter(&g_ea, "remote_spilled_pages") >= 8 * NP);
	for (uint32_t s = 0; s < 4; s++) {
		int good = fetch_verified(&g_eb, s, &remote);

		CU_ASSERT_EQUAL(remote, NP);
		CU_ASSERT_EQUAL(good, NP);
	}
	CU_ASSERT_EQUAL(h_eng_counter(&g_eb, "remote_fetched_pages") - before, 4 * NP);
	/* Fetched pages are B's own now: a second Match hits them locally. */
	{
		struct kvp_match_result m = { .struct_size = sizeof(m) };
		uint32_t dev[NP], host[NP], t[NTOK];

		tokens_of(0, t);
		CU_ASSERT_EQUAL(kvp_cache_match(g_eb.p, 0, t, NTOK, 0, &m, dev, host, NP, NULL), 0);
		CU_ASSERT_EQUAL(m.n_host, NP);
		CU_ASSERT_EQUAL(m.remote_pages, 0);
	}
}

/* Deep paths spilled a page at a time: six prompts share their first half (one node) and A's
 * engine then holds a lease on every host page, one page per Alloc, so the tails are evicted
 * and spilled page by page. The remote tier hashes a tail's later pages from the chain it kept
 * with the node at the first one, not from the root again; B finds every page by the keys it
 * computes from the whole prompt, with A's bytes. */
static void test_deep_paths_spilled_page_by_page(void)
{
	enum { FAMS = 6 };
	uint64_t leases[HOST_PAGES];
	uint32_t page, held = 0, remote = 0;
	int64_t spilled = h_eng_counter(&g_ea, "remote_spilled_pages");

	for (uint32_t s = 1; s <= FAMS; s++)
		CU_ASSERT_EQUAL_FATAL(publish(&g_ea, FAMILY + s), 0);
	for (; held < HOST_PAGES; held++)
		if (kvp_lease_alloc(g_ea.p, KVP_TIER_HOST, 1, &leases[held], &page, NULL) < 0)
			break;
	CU_ASSERT_EQUAL(held, HOST_PAGES);
	settle(&g_ea);
	CU_ASSERT(h_eng_counter(&g_ea, "remote_spilled_pages") - spilled >=
		  FAMILY_PAGES + FAMS * (NP - FAMILY_PAGES));
	for (uint32_t s = 1; s <= FAMS; s++) {
		int good = fetch_verified(&g_eb, FAMILY + s, &remote);

		/* the tail is new to B; the shared half may be B's own since the first fetch */
		CU_ASSERT(remote >= NP - FAMILY_PAGES && remote <= NP);
		CU_ASSERT_EQUAL(good, NP);
	}
	for (uint32_t i = 0; i < held; i++)
		kvp_lease_free(g_ea.p, leases[i], NULL, 0, NULL);
}

/* Hash-keyed chains (namespace 7, 20-byte engine keys): A publishes 12 chains of 16 keys,
 * spilling the first; B's MatchKeys reports them remote and FetchKeys brings A's bytes. */
static void chain_keys(uint32_t chain, uint8_t (*raw)[20], struct kvp_page_key *k)
{
	for (uint32_t i = 0; i < NP; i++) {
		memset(raw[i], 0, 20);
		memcpy(raw[i], &chain, 4);
		memcpy(raw[i] + 4, &i, 4);
		raw[i][19] = 0xab;
		k[i] = (struct kvp_page_key){ raw[i], 20 };
	}
}

static void test_hash_keyed_pages_spill_and_fetch(void)
{
	uint8_t raw[NP][20];
	struct kvp_page_key k[NP];
	uint32_t pages[NP], dev[NP], host[NP];
	uint8_t *base = kvp_pool_tier_base(g_ea.p, KVP_TIER_HOST);
	const uint8_t *bb = kvp_pool_tier_base(g_eb.p, KVP_TIER_HOST);
	uint64_t lease;

	for (uint32_t c = 0; c < 12; c++) {
		struct kvp_insert_keys_result ir = { .struct_size = sizeof(ir) };

		chain_keys(c, raw, k);
		CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc(g_ea.p, KVP_TIER_HOST, NP, &lease, pages,
						      NULL),
				      0);
		for (uint32_t i = 0; i < NP; i++)
			for (uint32_t j = 0; j < PAGE; j++)
				base[(uint64_t)pages[i] * PAGE + j] = byte_of(500 + c, i, j);
		CU_ASSERT_EQUAL(kvp_cache_insert_keys(g_ea.p, lease, 7, k, NP, 0, pages, NP, &ir,
						      NULL),
				0);
		kvp_lease_free(g_ea.p, lease, NULL, 0, NULL);
	}
	settle(&g_ea);
	for (uint32_t c = 0; c < 2; c++) {
		struct kvp_match_keys_result m = { .struct_size = sizeof(m) };
		struct kvp_fetch_result f = { .struct_size = sizeof(f) };
		int same = 1;

		chain_keys(c, raw, k);
		CU_ASSERT_EQUAL(kvp_cache_match_keys(g_eb.p, 7, k, NP, 0, &m, dev, host, NP, NULL),
				0);
		CU_ASSERT_EQUAL(m.matched_keys, 0);
		CU_ASSERT_EQUAL(m.remote_pages, NP);
		CU_ASSERT_EQUAL(kvp_cache_fetch_keys(g_eb.p, 7, k, NP, 1, &f, dev, host, NP, NULL),
				0);
		CU_ASSERT_EQUAL(f.fetched_pages, NP);
		CU_ASSERT_EQUAL(f.matched, NP);
		CU_ASSERT_EQUAL(f.n_host, NP);
		for (uint32_t i = 0; i < f.n_host; i++)
			for (uint32_t j = 0; j < PAGE; j++)
				same &= bb[(uint64_t)host[i] * PAGE + j] == byte_of(500 + c, i, j);
		CU_ASSERT(same);
		CU_ASSERT(f.lock_id != 0);
		if (f.lock_id)
			CU_ASSERT_EQUAL(kvp_cache_release(g_eb.p, f.lock_id, NULL), 0);
	}
}

/* A node without a remote tier: Match says nothing remote, Fetch is the local match. */
static void test_fetch_without_remote_tier_is_local(void)
{
	struct kvp_match_result m = { .struct_size = sizeof(m) };
	struct kvp_fetch_result f = { .struct_size = sizeof(f) };
	uint32_t dev[NP], host[NP], t[NTOK];

	CU_ASSERT_EQUAL_FATAL(publish(&g_ec, 900), 0);
	tokens_of(900, t);
	CU_ASSERT_EQUAL(kvp_cache_match(g_ec.p, 0, t, NTOK, 0, &m, dev, host, NP, NULL), 0);
	CU_ASSERT_EQUAL(m.remote_pages, 0);
	tokens_of(901, t);
	CU_ASSERT_EQUAL(kvp_cache_fetch(g_ec.p, 0, t, NTOK, 0, &f, dev, host, NP, NULL), 0);
	CU_ASSERT_EQUAL(f.fetched_pages + f.n_host + f.matched, 0);
	tokens_of(900, t);
	CU_ASSERT_EQUAL(kvp_cache_fetch(g_ec.p, 0, t, NTOK, 1, &f, dev, host, NP, NULL), 0);
	CU_ASSERT_EQUAL(f.n_host, NP);
	CU_ASSERT(f.lock_id != 0);
	CU_ASSERT_EQUAL(kvp_cache_release(g_ec.p, f.lock_id, NULL), 0);
	CU_ASSERT_EQUAL(kvp_cache_fetch(g_ec.p, 0, NULL, 0, 0, &f, dev, host, NP, NULL),
			-KVP_E_INVALID_ARGUMENT);
}

static int redis_pid(const char *port)
{
	char path[512];
	FILE *f;
	int pid = -1;

	snprintf(path, sizeof(path), "%s/%s/redis.pid", g_dir, port);
	if ((f = fopen(path, "r"))) {
		if (fscanf(f, "%d", &pid) != 1)
			pid = -1;
		fclose(f);
	}
	return pid;
}

static int sh(const char *fmt, const char *a, const char *b)
{
	char cmd[1024];

	snprintf(cmd, sizeof(cmd), fmt, a, b);
	return system(cmd);
}

/* Master 3 killed: prompts 4 .. 7 (spilled before) come back only up to their first page on the
 * dead master; nothing fails; A keeps publishing. Restarted: new spills are hits again. */
static void test_master_down_is_a_miss_and_recovers(void)
{
	int pid = redis_pid(g_ports[2]);
	int total = 0, n;

	CU_ASSERT_FATAL(pid > 0);
	kill(pid, SIGKILL);
	usleep(200000);
	for (uint32_t s = 4; s < 8; s++) {
		n = fetch_verified(&g_eb, s, NULL);
		CU_ASSERT(n >= 0); /* a miss, never an error */
		total += n > 0 ? n : 0;
	}
	CU_ASSERT(total < 4 * NP); /* some pages live on the dead master */
	/* Both nodes keep serving: A publishes (spilling partly into a dead slot range). */
	for (uint32_t s = 12; s < 16; s++)
		CU_ASSERT_EQUAL(publish(&g_ea, s), 0);
	CU_ASSERT(h_eng_counter(&g_ea, "remote_node_down") +
			  h_eng_counter(&g_ea, "remote_timeouts") +
			  h_eng_counter(&g_eb, "remote_node_down") +
			  h_eng_counter(&g_eb, "remote_timeouts") >
		  0);
	/* Restart it (its slots come back with it: nodes.conf is kept). */
	CU_ASSERT_EQUAL(sh("redis-server %s/%s/redis.conf >/dev/null", g_dir, g_ports[2]), 0);
	CU_ASSERT_EQUAL(sh("for i in $(seq 100); do redis-cli -p %s cluster info 2>/dev/null | "
			   "grep -q cluster_state:ok && exit 0; sleep 0.1; done; exit 1 #%s",
			   g_ports[2], ""),
			0);
	/* The nodes reconnect (backoff at most 2 s), then new spills are hits. */
	for (int i = 0; i < 60; i++) {
		uint64_t c = (uint64_t)h_eng_counter(&g_ea, "remote_connects");

		if (c >= 4 && h_eng_counter(&g_eb, "remote_connects") >= 4)
			break;
		usleep(100000);
	}
	sleep(1);
	for (uint32_t s = 16; s < 28; s++)
		CU_ASSERT_EQUAL(publish(&g_ea, s), 0);
	settle(&g_ea);
	for (uint32_t s = 16; s < 19; s++)
		CU_ASSERT_EQUAL(fetch_verified(&g_eb, s, NULL), NP);
}

/* The remote key of page 0 of prompt, as kvpoold names it. */
static void key_of(uint32_t prompt, char *key)
{
	struct kvp_rv_fp fp = { 2, 1, 8, 0, PT, 0 }; /* dtype fp16 is the config's first */
	uint32_t t[NTOK];
	uint8_t h[KVP_RV_HASH_SIZE];

	tokens_of(prompt, t);
	kvp_rv_page_hash(NULL, t, PT, h);
	char ns[KVP_RV_NSNAME_MAX];

	kvp_rv_ns_name("p", NULL, 0, 0, ns); /* pool p, no remote_scope: its name */
	kvp_rv_key(&fp, ns, h, key);
}

static void test_corrupt_and_foreign_values_are_deleted_misses(void)
{
	char key[2][KVP_RV_KEY_MAX], path[512];
	struct kvp_rv_fp other = { 3, 1, 8, 0, PT, 0 };
	uint8_t page[PAGE], val[KVP_RV_HDR_SIZE + PAGE];
	int64_t bad = h_eng_counter(&g_eb, "remote_bad_values");
	int64_t foreign = h_eng_counter(&g_eb, "remote_foreign_values");
	struct kvp_rv_mac mac;
	FILE *f;

	/* Prompts 20 and 21 spilled whole (after the restart). */
	key_of(20, key[0]);
	key_of(21, key[1]);
	CU_ASSERT_EQUAL(sh("redis-cli -c -p %s EXISTS %s | grep -q 1", g_ports[0], key[0]), 0);
	CU_ASSERT_EQUAL(sh("redis-cli -c -p %s SET %s garbage-not-a-kvpool-value >/dev/null",
			   g_ports[0], key[0]),
			0);
	memset(page, 0x5a, sizeof(page));
	snprintf(path, sizeof(path), "%s/foreign.bin", g_dir);
	CU_ASSERT_FATAL((f = fopen(path, "w")) != NULL);
	CU_ASSERT_EQUAL_FATAL(kvp_rv_mac_init(&mac, H_SECRET, strlen(H_SECRET)), 0);
	fwrite(val, 1, kvp_rv_encode(&other, &mac, key[1], strlen(key[1]), page, PAGE, val), f);
	fclose(f);
	{
		char cmd[1024];

		snprintf(cmd, sizeof(cmd), "redis-cli -c -p %s -x SET %s < %s >/dev/null",
			 g_ports[0], key[1], path);
		CU_ASSERT_EQUAL(system(cmd), 0);
	}
	/* Never served: no page of either prompt comes back. */
	CU_ASSERT_EQUAL(fetch_verified(&g_eb, 20, NULL), 0);
	CU_ASSERT_EQUAL(fetch_verified(&g_eb, 21, NULL), 0);
	CU_ASSERT_EQUAL(h_eng_counter(&g_eb, "remote_bad_values") - bad, 1);
	CU_ASSERT_EQUAL(h_eng_counter(&g_eb, "remote_foreign_values") - foreign, 1);
	settle(&g_eb);
	CU_ASSERT_EQUAL(sh("redis-cli -c -p %s EXISTS %s | grep -q 0", g_ports[0], key[0]), 0);
	CU_ASSERT_EQUAL(sh("redis-cli -c -p %s EXISTS %s | grep -q 0", g_ports[0], key[1]), 0);
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

enum { ROUNDS = 400, BLOCKS = 5, SLEEP_S = 5 };

/* The bounds of test_slow_master_leaves_local_latency. They tell a node that serves locally
 * while the master sleeps from one that waits for the cluster inside Alloc or Match (each such
 * call then takes about the command timeout, 300 ms, or the sleep), not a fast node from a
 * slightly slower one: that ratio is the benchmark's (bench_remote, remote.slow_master.*). */
enum {
	MAX_US = SLEEP_S * 1000000 / 5, /* every call of A answers within a fifth of the sleep */
	P99_SLACK_US = 2000,		/* A's p99 <= 2x C's + 2 ms ... */
	P99_BLOCKS = 1,			/* ... in at least one block of BLOCKS */
};

/* One round on e: Alloc of 4 host pages (evicting: on A that spills) and a Match of a prompt
 * just inserted (a local hit); their times in microseconds. */
static void local_round(struct h_eng *e, uint32_t prompt, uint64_t *alloc_us, uint64_t *match_us)
{
	struct kvp_match_result m = { .struct_size = sizeof(m) };
	uint8_t *hb = kvp_pool_tier_base(e->p, KVP_TIER_HOST);
	uint32_t pages[4], t[4 * PT], dev[4], host[4];
	uint64_t lease, t0;

	for (uint32_t i = 0; i < 4 * PT; i++)
		t[i] = (prompt << 12) | i;
	t0 = now_us();
	CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc(e->p, KVP_TIER_HOST, 4, &lease, pages, NULL), 0);
	*alloc_us = now_us() - t0;
	for (uint32_t i = 0; i < 4; i++)
		memset(hb + (uint64_t)pages[i] * PAGE, (int)prompt, PAGE);
	CU_ASSERT_EQUAL(kvp_cache_insert(e->p, lease, 0, t, 4 * PT, 0, pages, 4, NULL, NULL), 0);
	kvp_lease_free(e->p, lease, NULL, 0, NULL);
	t0 = now_us();
	CU_ASSERT_EQUAL_FATAL(kvp_cache_match(e->p, 0, t, 4 * PT, 0, &m, dev, host, 4, NULL), 0);
	*match_us = now_us() - t0;
	CU_ASSERT_EQUAL(m.n_host, 4);
}

static uint64_t p99(uint64_t *v, uint32_t n)
{
	qsort(v, n, sizeof(v[0]), cmp_u64);
	return v[n * 99 / 100];
}

static uint64_t max_of(const uint64_t *v, uint32_t n, uint64_t m)
{
	for (uint32_t i = 0; i < n; i++)
		m = v[i] > m ? v[i] : m;
	return m;
}

/* What A's remote tier counts when a master stalls: timeouts, a node marked down, submissions
 * refused while its backlog is full. */
static int64_t stall_faults(void)
{
	return h_eng_counter(&g_ea, "remote_timeouts") + h_eng_counter(&g_ea, "remote_node_down") +
	       h_eng_counter(&g_ea, "remote_rejected") +
	       h_eng_counter(&g_ea, "remote_spill_dropped");
}

/* One attempt: the master asleep SLEEP_S seconds while A spills into it; BLOCKS blocks of
 * ROUNDS rounds alternating between C (no remote tier) and A, so that the machine's noise
 * falls on both alike, all inside the sleep (a block the sleep's end cuts short counts as
 * missed). Returns the blocks whose A p99 (Alloc and Match) is within 2x C's + P99_SLACK_US;
 * *max_us: A's slowest call; *stalled: whether A's remote tier saw the master stall (a timeout
 * or a node marked down), i.e. the attempt measured what it claims to. */
static int slow_master_attempt(uint32_t first_prompt, uint64_t *max_us, int *stalled)
{
	static uint64_t ca[ROUNDS], cm[ROUNDS], aa[ROUNDS], am[ROUNDS];
	int64_t faults = stall_faults(), spilled = h_eng_counter(&g_ea, "remote_spilled_pages");
	int within = 0;
	char cmd[256];
	uint64_t start, end;

	*max_us = 0;
	snprintf(cmd, sizeof(cmd), "redis-cli -p %s DEBUG SLEEP %d >/dev/null 2>&1 &", g_ports[1],
		 SLEEP_S);
	CU_ASSERT_EQUAL(system(cmd), 0);
	usleep(50000);
	start = now_us();
	end = start + (SLEEP_S * 1000000u) - 300000u; /* the master still asleep */
	for (uint32_t blk = 0; blk < BLOCKS; blk++) {
		uint64_t pca, pcm, paa, pam;
		uint32_t n = 0;

		for (; n < ROUNDS && now_us() < end; n++) {
			local_round(&g_ec, first_prompt + blk * ROUNDS + n, &ca[n], &cm[n]);
			local_round(&g_ea, first_prompt + blk * ROUNDS + n, &aa[n], &am[n]);
		}
		*max_us = max_of(am, n, max_of(aa, n, *max_us));
		if (n < ROUNDS) {
			fprintf(stderr,
				"p99: block %u cut short by the end of the sleep (%u rounds)\n",
				blk, n);
			break;
		}
		pca = p99(ca, n), pcm = p99(cm, n), paa = p99(aa, n), pam = p99(am, n);
		fprintf(stderr,
			"p99 us: no remote alloc %lu match %lu; remote (master asleep) alloc %lu "
			"match %lu\n",
			(unsigned long)pca, (unsigned long)pcm, (unsigned long)paa,
			(unsigned long)pam);
		within += paa <= 2 * pca + P99_SLACK_US && pam <= 2 * pcm + P99_SLACK_US;
	}
	while (now_us() < start + SLEEP_S * 1000000u + 500000u) /* the master is awake again */
		usleep(100000);
	h_eng_counter(&g_ea, "remote_ok"); /* a turn: the counters below are up to date */
	*stalled = stall_faults() > faults;
	fprintf(stderr, "p99: A spilled %ld pages, stall faults %ld\n",
		(long)(h_eng_counter(&g_ea, "remote_spilled_pages") - spilled),
		(long)(stall_faults() - faults));
	return within;
}

/* A master sleeping 5 s (DEBUG SLEEP) while A spills into it never holds up A's local service:
 * every Alloc and Match of A answers, the slowest within a fifth of the sleep, and A's p99 stays
 * within 2x + 2 ms of node C's (no remote tier) in at least one block. A node that waited for
 * the cluster in Alloc (each spill to the sleeping master then takes the 300 ms command
 * timeout) fails every block. A second attempt only when the first missed: a machine busy with
 * other work for a few seconds can spoil one, a cost of A's own spoils both. The timeouts
 * paused A's SETs (remote_set_pauses); once the master is awake they land again. */
static void test_slow_master_leaves_local_latency(void)
{
	int64_t pauses = h_eng_counter(&g_ea, "remote_set_pauses"), ok;
	uint64_t max_us, t;
	int stalled, within = slow_master_attempt(1000, &max_us, &stalled);

	if (within < P99_BLOCKS || max_us >= MAX_US) {
		fprintf(stderr, "p99: %d of %d blocks within, slowest call %lu us, again\n", within,
			BLOCKS, (unsigned long)max_us);
		within = slow_master_attempt(1000 + BLOCKS * ROUNDS, &max_us, &stalled);
	}
	fprintf(stderr, "p99: %d of %d blocks within, slowest call of A %lu us, stall seen %d\n",
		within, BLOCKS, (unsigned long)max_us, stalled);
	CU_ASSERT(stalled);
	CU_ASSERT(max_us < MAX_US);
	CU_ASSERT(within >= P99_BLOCKS);
	/* The timeouts rested A's SETs; the master awake, a probe lands and spills go again. */
	CU_ASSERT(h_eng_counter(&g_ea, "remote_set_pauses") > pauses);
	ok = h_eng_counter(&g_ea, "remote_ok");
	for (uint32_t n = 0; n < 200 && h_eng_counter(&g_ea, "remote_ok") <= ok; n++) {
		local_round(&g_ea, 50000 + n, &t, &t);
		usleep(20000);
	}
	CU_ASSERT(h_eng_counter(&g_ea, "remote_ok") > ok);
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_spill_then_remote_hits_on_other_node),
		H_TEST(test_deep_paths_spilled_page_by_page),
		H_TEST(test_hash_keyed_pages_spill_and_fetch),
		H_TEST(test_fetch_without_remote_tier_is_local),
		H_TEST(test_master_down_is_a_miss_and_recovers),
		H_TEST(test_corrupt_and_foreign_values_are_deleted_misses),
		H_TEST(test_slow_master_leaves_local_latency),
	};
	const char *ports = getenv("KVP_REDIS_PORTS");

	g_dir = getenv("KVP_REDIS_DIR");
	if (!ports || !g_dir ||
	    sscanf(ports, "%7[0-9],%7[0-9],%7[0-9]", g_ports[0], g_ports[1], g_ports[2]) != 3) {
		fprintf(stderr, "KVP_REDIS_PORTS / KVP_REDIS_DIR not set: run through "
				"redis_cluster.sh\n");
		return 77;
	}
	return H_RUN_SUITE("remote_nodes", init_suite, clean_suite, tests);
}
