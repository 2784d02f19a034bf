/* test_remote_features.c - the remote tier's write-through of demoted pages, Match's local_only
 * flag, and Fetches in flight across reloads, against a real 3-master Redis Cluster on loopback
 * (redis_cluster.sh: KVP_REDIS_PORTS). Node W (write-through, a sim device tier whose demotions
 * land later, KVPOOLD_COPY_DELAY_MS) writes; node R (spill, host only) reads and checks every
 * byte against the pattern W wrote on its device tier. */
#include <CUnit/Basic.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "eng.h"
#include "harness.h"
#include "secret.h"

enum { PT = 4, NP = 16, NTOK = PT * NP, ROW = 16, DEV_PAGES = 16, HOST_PAGES = 64 };

#define OTHER_UID 60001
#define FETCH_GID 60040 /* allowed_groups of R's pool p */

static struct daemon g_w, g_r;
static struct h_eng g_ew, g_er;
static char g_ports[3][8];
/* Pool 0's tier status on e's daemon, with the tokens of demotions in flight. */
static struct kvp_tier_status tier_of(struct h_eng *e, int tier, uint64_t *moving)
{
	struct kvp_status *s = calloc(1, sizeof(*s));
	struct kvp_tier_status t = { 0 };

	if (s) {
		s->struct_size = sizeof(*s);
		if (kvp_client_status(e->c, s, NULL) == 0 && s->n_pools) {
			t = s->pools[0].tiers[tier];
			*moving = s->moving_tokens[0][tier];
		}
	}
	free(s);
	return t;
}

/* Waits until node e has nothing in flight to the cluster (5 s). */
static void settle(struct h_eng *e)
{
	for (int i = 0; i < 500 && h_eng_counter(e, "remote_inflight_ops") != 0; i++)
		usleep(10000);
}

static void tokens_of(uint32_t prompt, uint32_t *t)
{
	for (uint32_t i = 0; i < NTOK; i++)
		t[i] = (prompt << 12) | i;
}

/* The keys of chain c (20 bytes each). */
static void chain_keys(uint32_t c, uint8_t (*raw)[20], struct kvp_page_key *k)
{
	for (uint32_t i = 0; i < NP; i++) {
		memset(raw[i], 0, 20);
		memcpy(raw[i], &c, 4);
		memcpy(raw[i] + 4, &i, 4);
		raw[i][19] = 0xcd;
		k[i] = (struct kvp_page_key){ raw[i], 20 };
	}
}

/* Node e (a write-through one: W) publishes prompt (keyed: chain prompt in namespace 7) on
 * tier with its pattern. 0 or a code. */
static int publish_on(struct h_eng *e, int tier, uint32_t prompt, int keyed)
{
	uint32_t pages[NP], t[NTOK];
	uint8_t raw[NP][20];
	struct kvp_page_key k[NP];
	struct kvp_insert_keys_result ir = { .struct_size = sizeof(ir) };
	uint64_t lease;
	int r;

	if ((r = kvp_lease_alloc(e->p, tier, NP, &lease, pages, NULL)) < 0)
		return r;
	if (h_eng_rows(e->p, tier, pages, NTOK, PT, ROW, prompt, 0))
		return -1;
	tokens_of(prompt, t);
	chain_keys(prompt, raw, k);
	r = keyed ? kvp_cache_insert_keys(e->p, lease, 7, k, NP, 0, pages, NP, &ir, NULL)
		  : kvp_cache_insert(e->p, lease, 0, t, NTOK, 0, pages, NP, NULL, NULL);
	kvp_lease_free(e->p, lease, NULL, 0, NULL);
	return r;
}

static int publish(int tier, uint32_t prompt, int keyed)
{
	return publish_on(&g_ew, tier, prompt, keyed);
}

/* e's device tier emptied by an Alloc of all its pages: the cached device pages are demoted
 * (their copies land later, KVPOOLD_COPY_DELAY_MS) and the Alloc answers once they did. */
static void demote_all_on(struct h_eng *e)
{
	uint32_t pages[DEV_PAGES];
	uint64_t lease;

	CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc(e->p, KVP_TIER_DEVICE, DEV_PAGES, &lease, pages,
					      NULL),
			      0);
	CU_ASSERT_EQUAL(kvp_lease_free(e->p, lease, NULL, 0, NULL), 0);
}

static void demote_all_by_alloc(void)
{
	demote_all_on(&g_ew);
}

/* Node e's cached prompt (keyed: chain) back to its device tier (Load), then demoted again
 * (admin Evict, synchronous). */
static void promote_and_demote(struct h_eng *e, uint32_t prompt, int keyed)
{
	struct kvp_match_result m = { .struct_size = sizeof(m) };
	struct kvp_match_keys_result mk = { .struct_size = sizeof(mk) };
	uint32_t dev[NP], host[NP], t[NTOK];
	uint8_t raw[NP][20];
	struct kvp_page_key k[NP];
	uint64_t lock, evicted = 0;

	tokens_of(prompt, t);
	chain_keys(prompt, raw, k);
	if (keyed) {
		CU_ASSERT_EQUAL_FATAL(kvp_cache_match_keys(e->p, 7, k, NP, KVP_MATCH_LOCK, &mk, dev,
							   host, NP, NULL),
				      0);
		lock = mk.lock_id;
	} else {
		CU_ASSERT_EQUAL_FATAL(kvp_cache_match(e->p, 0, t, NTOK, KVP_MATCH_LOCK, &m, dev,
						      host, NP, NULL),
				      0);
		lock = m.lock_id;
	}
	CU_ASSERT_EQUAL(kvp_cache_load(e->p, lock, dev, NP, NULL), NP);
	CU_ASSERT_EQUAL(kvp_cache_release(e->p, lock, NULL), 0);
	CU_ASSERT_EQUAL(kvp_admin_evict(e->c, "p", KVP_TIER_DEVICE, NTOK, &evicted, NULL), 0);
	CU_ASSERT_EQUAL(evicted, NTOK);
}

/* R fetches prompt (keyed: chain) with a lock: the pages fetched now, -1 on an error; *bad:
 * bytes that differ from W's pattern. */
static int fetch_checked(uint32_t prompt, int keyed, int *bad)
{
	struct kvp_fetch_result f = { .struct_size = sizeof(f) };
	uint32_t dev[NP], host[NP], t[NTOK];
	uint8_t raw[NP][20];
	struct kvp_page_key k[NP];
	int r;

	tokens_of(prompt, t);
	chain_keys(prompt, raw, k);
	r = keyed ? kvp_cache_fetch_keys(g_er.p, 7, k, NP, 1, &f, dev, host, NP, NULL)
		  : kvp_cache_fetch(g_er.p, 0, t, NTOK, 1, &f, dev, host, NP, NULL);
	if (r < 0)
		return -1;
	*bad = f.n_host == NP ? h_eng_rows(g_er.p, KVP_TIER_HOST, host, NTOK, PT, ROW, prompt, 1)
			      : 1000;
	if (f.lock_id)
		CU_ASSERT_EQUAL(kvp_cache_release(g_er.p, f.lock_id, NULL), 0);
	return (int)f.fetched_pages;
}

/* R's Match (keyed: MatchKeys) of prompt with flags; remote_pages, or -1 on an error. */
static int remote_seen(uint32_t prompt, int keyed, int flags)
{
	struct kvp_match_result m = { .struct_size = sizeof(m) };
	struct kvp_match_keys_result mk = { .struct_size = sizeof(mk) };
	uint32_t dev[NP], host[NP], t[NTOK];
	uint8_t raw[NP][20];
	struct kvp_page_key k[NP];

	tokens_of(prompt, t);
	chain_keys(prompt, raw, k);
	if (keyed)
		return kvp_cache_match_keys(g_er.p, 7, k, NP, flags, &mk, dev, host, NP, NULL) < 0
			       ? -1
			       : (int)mk.remote_pages;
	return kvp_cache_match(g_er.p, 0, t, NTOK, flags, &m, dev, host, NP, NULL) < 0
		       ? -1
		       : (int)m.remote_pages;
}

static char g_conf_w[1024];

static const char *remote_head(char *buf, size_t len)
{
	snprintf(buf, len,
		 "[remote]\nseeds = 127.0.0.1:%s,127.0.0.1:%s,127.0.0.1:%s\n"
		 "connect_timeout_ms = 300\ncommand_timeout_ms = 3000\n"
		 "match_timeout_ms = 1500\nmatch_max_pages = 64\nsecret = %s\n",
		 g_ports[0], g_ports[1], g_ports[2], h_secret_src());
	return buf;
}

#define GEOMETRY "layers = 2\nkv_heads = 1\nhead_dim = 8\ndtype = fp16\npage_tokens = 4\n"

/* R's config: pool p (spill, host only, allowed_groups gid) and, unless without_p, first;
 * pool q after it. */
static void conf_r(char *buf, size_t len, unsigned gid, int without_p)
{
	char head[512], p[512];

	snprintf(p, sizeof(p),
		 "[pool.p]\n" GEOMETRY "host_capacity = %dt\nmlock = off\nremote = spill\n"
		 "allowed_users = 0\nallowed_groups = %u\n",
		 HOST_PAGES * PT, gid);
	snprintf(buf, len,
		 "%s[daemon]\nmax_key_bytes = 48\n%s[pool.q]\n" GEOMETRY
		 "host_capacity = 64t\nmlock = off\n",
		 remote_head(head, sizeof(head)), without_p ? "" : p);
}

/* W's config: pool p (write-through, a sim device tier), extra added to [remote]. */
static void conf_w(char *buf, size_t len, const char *extra)
{
	char head[512];

	snprintf(buf, len,
		 "%s%s[pool.p]\n" GEOMETRY "device = sim\ndevice_capacity = %dt\n"
		 "host_capacity = %dt\nmlock = off\nremote = write-through\n",
		 remote_head(head, sizeof(head)), extra, DEV_PAGES * PT, HOST_PAGES * PT);
}

static int init_suite(void)
{
	char r[2048];

	conf_w(g_conf_w, sizeof(g_conf_w), "");
	conf_r(r, sizeof(r), FETCH_GID, 0);
	setenv("KVPOOLD_COPY_DELAY_MS", "20", 1);
	if (h_daemon_start(&g_w, g_conf_w, NULL) < 0)
		return -1;
	unsetenv("KVPOOLD_COPY_DELAY_MS");
	if (h_daemon_start(&g_r, r, NULL) < 0)
		return -1;
	/* A second user reaches R's socket: access is the daemon's to decide. */
	if (chmod(g_r.dir, 0755) < 0 || chmod(g_r.sock, 0666) < 0)
		return -1;
	if (h_eng_open(&g_ew, g_w.sock, "node-w", "p") < 0 ||
	    h_eng_open(&g_er, g_r.sock, "node-r", "p") < 0)
		return -1;
	kvp_client_set_timeout(g_ew.c, 20000);
	kvp_client_set_timeout(g_er.c, 20000);
	for (int i = 0; i < 300; i++) {
		if (h_eng_counter(&g_ew, "remote_connects") >= 3 &&
		    h_eng_counter(&g_er, "remote_connects") >= 3)
			return 0;
		usleep(10000);
	}
	return -1;
}

static int clean_suite(void)
{
	kvp_client_close(g_ew.c);
	kvp_client_close(g_er.c);
	return (h_daemon_finish(&g_w) | h_daemon_finish(&g_r)) ? -1 : 0;
}

/* Pages inserted on the device tier are written out when their demotion lands them on host,
 * once: promoted (Load) and demoted again (admin Evict, synchronous), they are not written
 * again. */
static void demoted_pages_are_written_once(int keyed)
{
	uint32_t prompt = keyed ? 11 : 1;
	int64_t written = h_eng_counter(&g_ew, "remote_written_pages");
	int64_t skipped = h_eng_counter(&g_ew, "remote_written_skipped");
	uint64_t moving = 0;
	int bad = -1;

	CU_ASSERT_FATAL(written >= 0 && skipped >= 0);
	CU_ASSERT_EQUAL_FATAL(publish(KVP_TIER_DEVICE, prompt, keyed), 0);
	settle(&g_ew);
	CU_ASSERT_EQUAL(h_eng_counter(&g_ew, "remote_written_pages"),
			written); /* not on host yet */
	demote_all_by_alloc();
	CU_ASSERT_EQUAL(tier_of(&g_ew, KVP_TIER_HOST, &moving).cached_tokens >= NTOK, 1);
	settle(&g_ew);
	CU_ASSERT_EQUAL(h_eng_counter(&g_ew, "remote_written_pages") - written, NP);
	/* Another node sees and fetches them: W's bytes. */
	CU_ASSERT_EQUAL(remote_seen(prompt, keyed, 0), NP);
	CU_ASSERT_EQUAL(fetch_checked(prompt, keyed, &bad), NP);
	CU_ASSERT_EQUAL(bad, 0);

	/* Back to the device tier (Load), then demoted again: already written, not again. */
	promote_and_demote(&g_ew, prompt, keyed);
	settle(&g_ew);
	CU_ASSERT_EQUAL(h_eng_counter(&g_ew, "remote_written_pages") - written, NP);
	CU_ASSERT_EQUAL(h_eng_counter(&g_ew, "remote_written_skipped") - skipped, NP);
}

static void test_write_through_of_demoted_pages(void)
{
	demoted_pages_are_written_once(0);
}

static void test_write_through_of_demoted_keyed_pages(void)
{
	demoted_pages_are_written_once(1);
}

/* Match / MatchKeys with KVP_MATCH_LOCAL_ONLY ask the cluster nothing: remote_pages 0, no
 * query counted, and a cluster that sleeps does not delay them. */
static void test_local_only_asks_the_cluster_nothing(void)
{
	int64_t q;
	uint64_t t0, local_ms, remote_ms;
	char cmd[256];

	CU_ASSERT_EQUAL_FATAL(publish(KVP_TIER_HOST, 3, 0), 0); /* written at insert */
	CU_ASSERT_EQUAL_FATAL(publish(KVP_TIER_HOST, 13, 1), 0);
	settle(&g_ew);
	for (int keyed = 0; keyed < 2; keyed++) {
		q = h_eng_counter(&g_er, "remote_match_queries");
		CU_ASSERT_EQUAL(remote_seen(keyed ? 13 : 3, keyed, KVP_MATCH_LOCAL_ONLY), 0);
		CU_ASSERT_EQUAL(h_eng_counter(&g_er, "remote_match_queries"), q);
		CU_ASSERT_EQUAL(remote_seen(keyed ? 13 : 3, keyed, 0), NP);
		CU_ASSERT_EQUAL(h_eng_counter(&g_er, "remote_match_queries"), q + 1);
	}
	/* A lock value not made of KVP_MATCH_* bits keeps its old meaning (a boolean): -1 from a
	 * binding asks the cluster as before. */
	{
		struct kvp_match_result m = { .struct_size = sizeof(m) };
		uint32_t dev[NP], host[NP], t[NTOK];

		tokens_of(3, t);
		q = h_eng_counter(&g_er, "remote_match_queries");
		CU_ASSERT_EQUAL_FATAL(kvp_cache_match(g_er.p, 0, t, NTOK, -1, &m, dev, host, NP,
						      NULL),
				      0);
		CU_ASSERT_EQUAL(m.remote_pages, NP);
		CU_ASSERT_EQUAL(h_eng_counter(&g_er, "remote_match_queries"), q + 1);
		if (m.lock_id)
			CU_ASSERT_EQUAL(kvp_cache_release(g_er.p, m.lock_id, NULL), 0);
	}
	/* Every master asleep for 1 s: the local-only Match answers at once, the other waits. */
	for (int i = 0; i < 3; i++) {
		snprintf(cmd, sizeof(cmd), "redis-cli -p %s DEBUG SLEEP 1 >/dev/null 2>&1 &",
			 g_ports[i]);
		CU_ASSERT_EQUAL(system(cmd), 0);
	}
	usleep(100000);
	t0 = h_now_ms();
	CU_ASSERT_EQUAL(remote_seen(3, 0, KVP_MATCH_LOCAL_ONLY), 0);
	local_ms = h_now_ms() - t0;
	t0 = h_now_ms();
	CU_ASSERT(remote_seen(3, 0, 0) >= 0);
	remote_ms = h_now_ms() - t0;
	fprintf(stderr, "match with the cluster asleep: local_only %lu ms, with query %lu ms\n",
		(unsigned long)local_ms, (unsigned long)remote_ms);
	CU_ASSERT(local_ms < 500);
	CU_ASSERT(remote_ms >= 500);
	sleep(1);
}

/* FetchKeys holds to the key limits of the other keyed calls: past the daemon's max_key_bytes
 * (48 here) and past the library's 64 bytes, LIMIT_EXCEEDED; an empty key INVALID_ARGUMENT. */
static void test_fetch_keys_limits(void)
{
	struct kvp_fetch_result f = { .struct_size = sizeof(f) };
	uint8_t big[65];
	struct kvp_page_key k = { big, 50 };
	uint32_t dev[1], host[1];
	struct kvp_error e;

	memset(big, 0x42, sizeof(big));
	CU_ASSERT_EQUAL(kvp_cache_fetch_keys(g_er.p, 7, &k, 1, 0, &f, dev, host, 1, &e),
			-KVP_E_LIMIT_EXCEEDED);
	CU_ASSERT_PTR_NOT_NULL(strstr(e.message, "max_key_bytes"));
	k.len = 65;
	CU_ASSERT_EQUAL(kvp_cache_fetch_keys(g_er.p, 7, &k, 1, 0, &f, dev, host, 1, &e),
			-KVP_E_LIMIT_EXCEEDED);
	k.len = 0;
	CU_ASSERT_EQUAL(kvp_cache_fetch_keys(g_er.p, 7, &k, 1, 0, &f, dev, host, 1, &e),
			-KVP_E_INVALID_ARGUMENT);
}

/* ---- a Fetch in flight across a reload ---- */

struct fetch_child {
	int ready[2]; /* child -> parent: its Fetch goes out */
	unsigned gid; /* 0: stays root */
	uint32_t prompt;
	int match; /* 1: a locking Match instead, 2: a locking MatchKeys (chain prompt) */
};

/* The Match (fc->match 1) or MatchKeys (2) of fc->prompt with a lock, on p: 0 when it answered
 * (whatever it says), else 10 + code with an error naming pool p, 93 otherwise. */
static int child_match(struct fetch_child *fc, struct kvp_pool *p)
{
	struct kvp_match_result m = { .struct_size = sizeof(m) };
	struct kvp_match_keys_result mk = { .struct_size = sizeof(mk) };
	uint32_t dev[NP], host[NP], t[NTOK];
	uint8_t raw[NP][20];
	struct kvp_page_key k[NP];
	struct kvp_error e;
	int r;

	tokens_of(fc->prompt, t);
	chain_keys(fc->prompt, raw, k);
	r = fc->match == 2
		    ? kvp_cache_match_keys(p, 7, k, NP, KVP_MATCH_LOCK, &mk, dev, host, NP, &e)
		    : kvp_cache_match(p, 0, t, NTOK, KVP_MATCH_LOCK, &m, dev, host, NP, &e);
	if (r < 0)
		return strstr(e.message, "pool p") ? 10 + (int)e.code : 93;
	fprintf(stderr, "match answered: lock %lu, %u local pages, %u remote\n",
		(unsigned long)(m.lock_id | mk.lock_id), m.n_host + mk.n_host,
		m.remote_pages + mk.remote_pages);
	return 0;
}

/* Exit codes: 0 fetched all of prompt with W's bytes; 10 + n: the Fetch failed with code n
 * and an error naming pool p; other: a setup failure. */
static int child_fetch(struct fetch_child *fc)
{
	struct kvp_fetch_result f = { .struct_size = sizeof(f) };
	uint32_t dev[NP], host[NP], t[NTOK];
	struct kvp_error e;
	struct kvp_client *c;
	struct kvp_pool *p;
	gid_t g = (gid_t)fc->gid;
	int r;

	if (fc->gid && (setgroups(1, &g) < 0 || setresgid(OTHER_UID, OTHER_UID, OTHER_UID) < 0 ||
			setresuid(OTHER_UID, OTHER_UID, OTHER_UID) < 0))
		return 90;
	if (!(c = kvp_client_connect(g_r.sock, "fetcher", &e)) ||
	    !(p = kvp_pool_attach(c, "p", NULL, &e)))
		return 91;
	kvp_client_set_timeout(c, 20000);
	tokens_of(fc->prompt, t);
	if (write(fc->ready[1], "1", 1) != 1)
		return 92;
	if (fc->match)
		return child_match(fc, p);
	r = kvp_cache_fetch(p, 0, t, NTOK, 1, &f, dev, host, NP, &e);
	if (r < 0)
		return strstr(e.message, "pool p") ? 10 + (int)e.code : 93;
	if (f.fetched_pages != NP || f.n_host != NP || !f.lock_id)
		return 94;
	if (h_eng_rows(p, KVP_TIER_HOST, host, NTOK, PT, ROW, fc->prompt, 1))
		return 95;
	if (kvp_cache_release(p, f.lock_id, &e) < 0)
		return 96;
	kvp_client_close(c);
	return 0;
}

/* Starts a child whose Fetch of prompt stays in flight (every master asleep for 1 s, the
 * command timeout 3 s); returns its pid once R has reads in flight, or -1. */
static pid_t fetch_in_flight(struct fetch_child *fc)
{
	char cmd[256], b;
	pid_t pid;

	if (pipe(fc->ready) < 0)
		return -1;
	for (int i = 0; i < 3; i++) {
		snprintf(cmd, sizeof(cmd), "redis-cli -p %s DEBUG SLEEP 1 >/dev/null 2>&1 &",
			 g_ports[i]);
		if (system(cmd) != 0)
			return -1;
	}
	usleep(100000);
	if ((pid = fork()) == 0) {
		close(fc->ready[0]);
		_exit(child_fetch(fc));
	}
	close(fc->ready[1]);
	if (pid < 0 || read(fc->ready[0], &b, 1) != 1) {
		close(fc->ready[0]);
		return -1;
	}
	close(fc->ready[0]);
	for (int i = 0; i < 100 && h_eng_counter(&g_er, "remote_inflight_ops") <= 0; i++)
		usleep(5000);
	return h_eng_counter(&g_er, "remote_inflight_ops") > 0 ? pid : -1;
}

/* Rewrites R's config and reloads it: kvp_admin_reload's result (message into msg). */
static int reload_r(unsigned gid, int without_p, char *msg, size_t len)
{
	struct kvp_reload_item it[8] = { { .struct_size = sizeof(it[0]) } };
	struct kvp_error e = { 0 };
	char conf[2048];
	int r;

	conf_r(conf, sizeof(conf), gid, without_p);
	if (h_write_file(g_r.config, conf) < 0)
		return -1000;
	r = kvp_admin_reload(g_er.c, it, 8, &e);
	snprintf(msg, len, "%s", r < 0 ? e.message : (r > 0 ? it[0].text : ""));
	return r;
}

/* R's books on its pool p host tier: free + leased + cached + moving == total, nothing leased. */
static void books_balanced(void)
{
	uint64_t moving = 0;
	struct kvp_tier_status h = tier_of(&g_er, KVP_TIER_HOST, &moving);

	CU_ASSERT(h.total_tokens > 0);
	CU_ASSERT_EQUAL(h.free_tokens + h.leased_tokens + h.cached_tokens + moving, h.total_tokens);
	CU_ASSERT_EQUAL(h.leased_tokens, 0);
}

/* A reload whose file no longer has the Fetch's pool is refused, naming the pool (pools are
 * removed only by a restart); the Fetch in flight then completes with W's bytes. */
static void test_fetch_survives_reload_that_drops_its_pool(void)
{
	struct fetch_child fc = { .gid = 0, .prompt = 4 };
	char msg[600];
	pid_t pid;

	CU_ASSERT_EQUAL_FATAL(publish(KVP_TIER_HOST, 4, 0), 0);
	settle(&g_ew);
	pid = fetch_in_flight(&fc);
	CU_ASSERT_FATAL(pid > 0);
	CU_ASSERT_EQUAL(reload_r(FETCH_GID, 1, msg, sizeof(msg)), -KVP_E_INVALID_ARGUMENT);
	if (!strstr(msg, "pool p was removed"))
		fprintf(stderr, "reload answered: %s\n", msg);
	CU_ASSERT_PTR_NOT_NULL(strstr(msg, "pool p was removed"));
	CU_ASSERT_EQUAL(h_wait_pid(pid, 15000), 0);
	books_balanced();
	CU_ASSERT(reload_r(FETCH_GID, 0, msg, sizeof(msg)) >= 0);
}

/* A reload that revokes the fetching session's access to the pool (it is detached) while the
 * Fetch is in flight: the Fetch answers NOT_FOUND naming the pool, nothing is cached, the host
 * pages the values landed in are free again, no lock is left. */
static void test_fetch_answers_not_found_when_reload_revokes_its_pool(void)
{
	struct fetch_child fc = { .gid = FETCH_GID, .prompt = 5 };
	struct kvp_match_result m = { .struct_size = sizeof(m) };
	uint32_t dev[NP], host[NP], t[NTOK];
	uint64_t moving = 0, cached;
	char msg[600];
	pid_t pid;

	CU_ASSERT_EQUAL_FATAL(publish(KVP_TIER_HOST, 5, 0), 0);
	settle(&g_ew);
	cached = tier_of(&g_er, KVP_TIER_HOST, &moving).cached_tokens;
	pid = fetch_in_flight(&fc);
	CU_ASSERT_FATAL(pid > 0);
	CU_ASSERT(reload_r(FETCH_GID + 1, 0, msg, sizeof(msg)) >= 0);
	CU_ASSERT_EQUAL(h_wait_pid(pid, 15000), 10 + KVP_E_NOT_FOUND);
	settle(&g_er);
	books_balanced();
	CU_ASSERT_EQUAL(tier_of(&g_er, KVP_TIER_HOST, &moving).cached_tokens, cached);
	tokens_of(5, t);
	CU_ASSERT_EQUAL(kvp_cache_match(g_er.p, 0, t, NTOK, KVP_MATCH_LOCAL_ONLY, &m, dev, host, NP,
					NULL),
			0);
	CU_ASSERT_EQUAL(m.matched_tokens, 0);
	CU_ASSERT(reload_r(FETCH_GID, 0, msg, sizeof(msg)) >= 0);
}

/* A reload that revokes the session's access to the pool while its locking Match / MatchKeys
 * waits for the remote existence query (every master asleep): the deferred answer is
 * NOT_FOUND naming the pool, not the page ids and lock id the detach already released. R holds
 * the first half of the prompt (fetched), the cluster all of it. */
static void test_match_answers_not_found_when_reload_revokes_its_pool(void)
{
	for (int keyed = 0; keyed < 2; keyed++) {
		struct fetch_child fc = { .gid = FETCH_GID,
					  .prompt = keyed ? 16 : 6,
					  .match = 1 + keyed };
		struct kvp_fetch_result fr = { .struct_size = sizeof(fr) };
		uint32_t dev[NP], host[NP], t[NTOK];
		uint8_t raw[NP][20];
		struct kvp_page_key k[NP];
		int64_t q;
		char msg[600];
		pid_t pid;

		CU_ASSERT_EQUAL_FATAL(publish(KVP_TIER_HOST, fc.prompt, keyed), 0);
		settle(&g_ew);
		tokens_of(fc.prompt, t);
		chain_keys(fc.prompt, raw, k);
		CU_ASSERT_EQUAL_FATAL(keyed ? kvp_cache_fetch_keys(g_er.p, 7, k, NP / 2, 0, &fr,
								   dev, host, NP, NULL)
					    : kvp_cache_fetch(g_er.p, 0, t, NTOK / 2, 0, &fr, dev,
							      host, NP, NULL),
				      0);
		CU_ASSERT_EQUAL(fr.n_host, NP / 2);
		q = h_eng_counter(&g_er, "remote_match_queries");
		pid = fetch_in_flight(&fc);
		CU_ASSERT_FATAL(pid > 0);
		CU_ASSERT_EQUAL(h_eng_counter(&g_er, "remote_match_queries"), q + 1);
		CU_ASSERT(reload_r(FETCH_GID + 1, 0, msg, sizeof(msg)) >= 0);
		CU_ASSERT_EQUAL(h_wait_pid(pid, 15000), 10 + KVP_E_NOT_FOUND);
		settle(&g_er);
		books_balanced();
		CU_ASSERT(reload_r(FETCH_GID, 0, msg, sizeof(msg)) >= 0);
	}
}

/* Write-through forgets what it wrote when its connections to the cluster drop and come back
 * (CLIENT KILL on every master: a node may have restarted empty): a page promoted and demoted
 * again is written again, though well within rewrite_after_s (W: the default hour). */
static void test_write_through_forgets_on_reconnect(void)
{
	uint32_t prompt = 10;
	int64_t written, resets, connects;

	CU_ASSERT_EQUAL_FATAL(publish(KVP_TIER_DEVICE, prompt, 0), 0);
	demote_all_by_alloc();
	settle(&g_ew);
	written = h_eng_counter(&g_ew, "remote_written_pages");
	resets = h_eng_counter(&g_ew, "remote_written_resets");
	connects = h_eng_counter(&g_ew, "remote_connects");
	promote_and_demote(&g_ew, prompt, 0);
	settle(&g_ew);
	CU_ASSERT_EQUAL(h_eng_counter(&g_ew, "remote_written_pages"), written); /* seen */
	for (int i = 0; i < 3; i++) {
		char cmd[128];

		snprintf(cmd, sizeof(cmd), "redis-cli -p %s CLIENT KILL TYPE normal >/dev/null",
			 g_ports[i]);
		CU_ASSERT_EQUAL(system(cmd), 0);
	}
	for (int i = 0; i < 500 && (h_eng_counter(&g_ew, "remote_connects") < connects + 3 ||
				    h_eng_counter(&g_er, "remote_connects") < 6);
	     i++)
		usleep(10000);
	CU_ASSERT(h_eng_counter(&g_ew, "remote_connects") >= connects + 3);
	CU_ASSERT(h_eng_counter(&g_ew, "remote_written_resets") > resets);
	promote_and_demote(&g_ew, prompt, 0);
	settle(&g_ew);
	CU_ASSERT_EQUAL(h_eng_counter(&g_ew, "remote_written_pages") - written, NP);
}

/* A Fetch's hit is not taken as written when ttl_s is set (W: the default day): the value may
 * be about to expire. W fetches what W2 wrote; demoted on W, it is written by W too. */
static void fetched_is_written_again_with_ttl(struct h_eng *e2)
{
	struct kvp_fetch_result f = { .struct_size = sizeof(f) };
	uint32_t dev[NP], host[NP], t[NTOK];
	uint32_t prompt = 12;
	int64_t written;

	CU_ASSERT_EQUAL_FATAL(publish_on(e2, KVP_TIER_HOST, prompt, 0), 0);
	settle(e2);
	tokens_of(prompt, t);
	written = h_eng_counter(&g_ew, "remote_written_pages");
	CU_ASSERT_EQUAL_FATAL(kvp_cache_fetch(g_ew.p, 0, t, NTOK, 0, &f, dev, host, NP, NULL), 0);
	CU_ASSERT_EQUAL(f.fetched_pages, NP);
	CU_ASSERT_EQUAL(h_eng_rows(g_ew.p, KVP_TIER_HOST, host, NTOK, PT, ROW, prompt, 1), 0);
	promote_and_demote(&g_ew, prompt, 0);
	settle(&g_ew);
	CU_ASSERT_EQUAL(h_eng_counter(&g_ew, "remote_written_pages") - written, NP);
}

/* Write-through's table of written keys ages its entries (rewrite_after_s, 1 s on a second
 * write-through node W2; ttl_s is the default day): a page promoted and demoted again at once is
 * not written again, but after the age it is. So content the cluster lost (FLUSHALL on every
 * master) is written again and another node (R) fetches it. Runs last (it flushes). */
static void test_write_through_rewrites_after_rewrite_after_s(void)
{
	struct daemon w2;
	struct h_eng e2;
	char conf[1024];
	int64_t written, skipped;
	uint32_t prompt = 9;
	int bad = -1;

	conf_w(conf, sizeof(conf), "rewrite_after_s = 1s\n");
	setenv("KVPOOLD_COPY_DELAY_MS", "20", 1);
	CU_ASSERT_EQUAL_FATAL(h_daemon_start(&w2, conf, NULL), 0);
	unsetenv("KVPOOLD_COPY_DELAY_MS");
	CU_ASSERT_EQUAL_FATAL(h_eng_open(&e2, w2.sock, "node-w2", "p"), 0);
	kvp_client_set_timeout(e2.c, 20000);
	for (int i = 0; i < 300 && h_eng_counter(&e2, "remote_connects") < 3; i++)
		usleep(10000);
	CU_ASSERT(h_eng_counter(&e2, "remote_written_resets") >= 0); /* reported */
	fetched_is_written_again_with_ttl(&e2);
	written = h_eng_counter(&e2, "remote_written_pages");
	skipped = h_eng_counter(&e2, "remote_written_skipped");

	CU_ASSERT_EQUAL_FATAL(publish_on(&e2, KVP_TIER_DEVICE, prompt, 0), 0);
	demote_all_on(&e2);
	settle(&e2);
	CU_ASSERT_EQUAL(h_eng_counter(&e2, "remote_written_pages") - written, NP);
	promote_and_demote(&e2, prompt, 0); /* within the age: not again */
	settle(&e2);
	CU_ASSERT_EQUAL(h_eng_counter(&e2, "remote_written_pages") - written, NP);
	CU_ASSERT_EQUAL(h_eng_counter(&e2, "remote_written_skipped") - skipped, NP);

	/* The cluster loses everything; R sees none of it. */
	for (int i = 0; i < 3; i++) {
		char cmd[128];

		snprintf(cmd, sizeof(cmd), "redis-cli -p %s FLUSHALL >/dev/null 2>&1", g_ports[i]);
		CU_ASSERT_EQUAL(system(cmd), 0);
	}
	CU_ASSERT_EQUAL(remote_seen(prompt, 0, 0), 0);
	/* Past the age, demoted again: written again, and R fetches W2's bytes. */
	usleep(1200000);
	promote_and_demote(&e2, prompt, 0);
	settle(&e2);
	CU_ASSERT_EQUAL(h_eng_counter(&e2, "remote_written_pages") - written, 2 * NP);
	CU_ASSERT_EQUAL(h_eng_counter(&e2, "remote_written_skipped") - skipped, NP);
	CU_ASSERT_EQUAL(remote_seen(prompt, 0, 0), NP);
	CU_ASSERT_EQUAL(fetch_checked(prompt, 0, &bad), NP);
	CU_ASSERT_EQUAL(bad, 0);
	kvp_client_close(e2.c);
	CU_ASSERT_EQUAL(h_daemon_finish(&w2), 0);
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_write_through_of_demoted_pages),
		H_TEST(test_write_through_of_demoted_keyed_pages),
		H_TEST(test_local_only_asks_the_cluster_nothing),
		H_TEST(test_fetch_keys_limits),
		H_TEST(test_fetch_survives_reload_that_drops_its_pool),
		H_TEST(test_fetch_answers_not_found_when_reload_revokes_its_pool),
		H_TEST(test_match_answers_not_found_when_reload_revokes_its_pool),
		H_TEST(test_write_through_forgets_on_reconnect),
		H_TEST(test_write_through_rewrites_after_rewrite_after_s),
	};
	const char *ports = getenv("KVP_REDIS_PORTS");

	if (!ports ||
	    sscanf(ports, "%7[0-9],%7[0-9],%7[0-9]", g_ports[0], g_ports[1], g_ports[2]) != 3) {
		fprintf(stderr, "KVP_REDIS_PORTS not set: run through redis_cluster.sh\n");
		return 77;
	}
	if (geteuid() != 0) {
		fprintf(stderr, "skip: needs root (a second user for the revoked-access case)\n");
		return 77;
	}
	return H_RUN_SUITE("remote_features", init_suite, clean_suite, tests);
}
