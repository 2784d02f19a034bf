/* test_restart.c - kvpoold restarted by a test supervisor that plays systemd's fd store: it owns
 * the NOTIFY_SOCKET, keeps the fds sent with FDSTORE=1/FDNAME= (once per file, dropped by
 * FDSTOREREMOVE=1) and starts the next kvpoold with them in LISTEN_FDS/LISTEN_FDNAMES/
 * LISTEN_PID. An engine publishes a prefix and holds a lease across a clean restart: its next
 * call returns RESTARTED, then its match hits the same bytes, its lease is still its own and
 * its mapping is the same memory. A kill -9 with a corrupt checkpoint starts the pool empty. */
#include <CUnit/Basic.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fdsup.h"
#include "harness.h"
#include "kvpool.h"
#include "suite.h"

#define PT 16

static struct h_fdsup g_s;
#define g_sock g_s.sock
#define g_log g_s.log
#define g_dir g_s.dir

static pid_t sup_start(void)
{
	pid_t pid = h_fdsup_start(&g_s);

	CU_ASSERT_FATAL(pid > 0);
	return pid;
}

static void sup_stop(pid_t pid, int sig)
{
	h_fdsup_stop(&g_s, pid, sig);
}

static void write_cfg_full(uint32_t host_pages, uint32_t grace_ms, uint32_t interval_ms)
{
	char text[512];

	snprintf(text, sizeof(text),
		 "[daemon]\nresume_grace_ms = %u\nsnapshot_interval_ms = %u\n"
		 "[pool.p]\nlayers = 2\nkv_heads = 2\nhead_dim = 8\ndtype = fp16\n"
		 "page_tokens = %d\ndevice = none\nhost_capacity = %ut\nmlock = off\n",
		 grace_ms, interval_ms, PT, host_pages * PT);
	CU_ASSERT_FATAL(h_fdsup_config(&g_s, text) == 0);
}

static void write_cfg(uint32_t host_pages)
{
	write_cfg_full(host_pages, 5000, 100);
}

static void setup(void)
{
	CU_ASSERT_FATAL(h_fdsup_init(&g_s) == 0);
}

static void teardown(void)
{
	h_fdsup_fini(&g_s);
}

/* A daemon counter as `kvpoolctl status` shows it, or -1. */
static long counter(const char *name)
{
	char cmd[300], line[256];
	long v = -1;
	FILE *f;

	snprintf(cmd, sizeof(cmd), "%s --socket %s status", h_kvpoolctl(), g_sock);
	f = popen(cmd, "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		char key[64];
		long x;

		if (sscanf(line, " %63s %ld", key, &x) == 2 && !strcmp(key, name))
			v = x;
	}
	pclose(f);
	return v;
}

static void fill(struct kvp_pool *p, uint32_t page, uint8_t seed)
{
	uint8_t *b = kvp_pool_tier_base(p, KVP_TIER_HOST);
	size_t pb = 2 * 2 * 2 * 8 * 2 * PT; /* layers * K/V * heads * dim * 2 bytes * tokens */

	for (size_t i = 0; i < pb; i++)
		b[(size_t)page * pb + i] = (uint8_t)(seed + i * 7);
}

static bool check(struct kvp_pool *p, uint32_t page, uint8_t seed)
{
	const uint8_t *b = kvp_pool_tier_base(p, KVP_TIER_HOST);
	size_t pb = 2 * 2 * 2 * 8 * 2 * PT;

	for (size_t i = 0; i < pb; i++)
		if (b[(size_t)page * pb + i] != (uint8_t)(seed + i * 7))
			return false;
	return true;
}

/* setup(), a config of 64 host pages and a supervised kvpoold: its pid. */
static pid_t start_full(uint32_t grace_ms, uint32_t interval_ms)
{
	setup();
	write_cfg_full(64, grace_ms, interval_ms);
	return sup_start();
}

static pid_t start(void)
{
	return start_full(5000, 100);
}

/* An engine named name attached to pool "p" (fatal when it cannot be). */
static struct kvp_pool *engine(const char *name, struct kvp_client **c)
{
	struct kvp_error e;
	struct kvp_pool *p;

	*c = kvp_client_connect(g_sock, name, &e);
	p = *c ? kvp_pool_attach(*c, "p", NULL, &e) : NULL;
	CU_ASSERT_FATAL(p != NULL);
	return p;
}

/* The engine closed, kvpoold stopped cleanly, the test's folder removed. */
static void finish(struct kvp_client *c, pid_t pid)
{
	kvp_client_close(c);
	sup_stop(pid, SIGTERM);
	teardown();
}

/* A lease of n host pages, each filled with seed + i * step (none when step is 0), published as
 * the prefix tok[i] = tok0 + i of n pages (fatal when it fails). */
static void publish(struct kvp_pool *p, uint32_t n, uint32_t tok0, int seed, int step,
		    uint32_t *tok, uint32_t *pages)
{
	struct kvp_error e;
	uint64_t lease, nt;

	for (uint32_t i = 0; i < n * PT; i++)
		tok[i] = tok0 + i;
	CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc(p, KVP_TIER_HOST, n, &lease, pages, &e), 0);
	for (uint32_t i = 0; step && i < n; i++)
		fill(p, pages[i], (uint8_t)(seed + (int)i * step));
	CU_ASSERT_EQUAL_FATAL(kvp_cache_insert(p, lease, 1, tok, n * PT, 0, pages, n, &nt, &e), 0);
	CU_ASSERT_EQUAL(nt, n * PT);
}

static int match_retry(struct kvp_pool *p, const uint32_t *tok, uint32_t n,
		       struct kvp_match_result *m, uint32_t *host, int *restarted)
{
	uint32_t dev[8];
	struct kvp_error e;
	int r;

	m->struct_size = sizeof(*m);
	while ((r = kvp_cache_match(p, 1, tok, n, 0, m, dev, host, 8, &e)) == -KVP_E_RESTARTED)
		(*restarted)++;
	if (r < 0)
		printf("\n    match: %s: %s\n", kvp_code_name(r), e.message);
	return r;
}

/* Publishes 4 pages, holds a lease of 2 more; restarts; everything is back. */
static void test_restart_clean_keeps_cache_lease_and_mapping(void)
{
	uint32_t tok[4 * PT], pages[4], held[2], host[8];
	struct kvp_match_result m;
	struct kvp_error e;
	struct kvp_client *c;
	struct kvp_pool *p;
	uint64_t held_id, lock_id, klease, klock;
	uint32_t kpages[3];
	static const struct kvp_page_key keys[3] = { { "k-one", 5 }, { "k-two", 5 }, { "k-3", 3 } };
	struct kvp_insert_keys_result kres;
	struct kvp_match_keys_result km;
	void *base;
	int restarted = 0;
	pid_t pid;

	pid = start();
	p = engine("restart-engine", &c);
	base = kvp_pool_tier_base(p, KVP_TIER_HOST);
	publish(p, 4, 1000, 1, 17, tok, pages);
	CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc(p, KVP_TIER_HOST, 2, &held_id, held, &e), 0);
	/* a lock on the first two pages, and a hash-keyed chain of 3 pages, locked too */
	m.struct_size = sizeof(m);
	CU_ASSERT_EQUAL_FATAL(kvp_cache_match(p, 1, tok, 2 * PT, 1, &m, NULL, host, 8, &e), 0);
	CU_ASSERT_FATAL(m.lock_id != 0);
	lock_id = m.lock_id;
	CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc(p, KVP_TIER_HOST, 3, &klease, kpages, &e), 0);
	for (int i = 0; i < 3; i++)
		fill(p, kpages[i], (uint8_t)(99 + i));
	kres.struct_size = sizeof(kres);
	CU_ASSERT_EQUAL_FATAL(kvp_cache_insert_keys(p, klease, 2, keys, 3, 0, kpages, 3, &kres, &e),
			      0);
	CU_ASSERT_EQUAL(kres.new_pages, 3);
	km.struct_size = sizeof(km);
	CU_ASSERT_EQUAL_FATAL(kvp_cache_match_keys(p, 2, keys, 3, 1, &km, NULL, host, 8, &e), 0);
	CU_ASSERT_FATAL(km.lock_id != 0);
	klock = km.lock_id;

	sup_stop(pid, SIGTERM);
	pid = sup_start();

	CU_ASSERT_EQUAL(match_retry(p, tok, 4 * PT, &m, host, &restarted), 0);
	CU_ASSERT_EQUAL(restarted, 1);
	CU_ASSERT_EQUAL(m.matched_tokens, 4 * PT);
	CU_ASSERT_EQUAL(m.n_host, 4);
	CU_ASSERT_PTR_EQUAL(kvp_pool_tier_base(p, KVP_TIER_HOST), base);
	for (int i = 0; i < 4 && m.n_host == 4; i++) {
		CU_ASSERT_EQUAL(host[i], pages[i]);
		CU_ASSERT(check(p, host[i], (uint8_t)(17 * i + 1)));
	}
	/* the lease and the locks are still this session's */
	CU_ASSERT_EQUAL(kvp_lease_free(p, held_id, held, 2, &e), 0);
	CU_ASSERT_EQUAL(kvp_cache_release(p, lock_id, &e), 0);
	km.struct_size = sizeof(km);
	CU_ASSERT_EQUAL(kvp_cache_match_keys(p, 2, keys, 3, 0, &km, NULL, host, 8, &e), 0);
	CU_ASSERT_EQUAL(km.n_host, 3);
	for (int i = 0; i < 3 && km.n_host == 3; i++) {
		CU_ASSERT_EQUAL(host[i], kpages[i]);
		CU_ASSERT(check(p, host[i], (uint8_t)(99 + i)));
	}
	CU_ASSERT_EQUAL(kvp_cache_release(p, klock, &e), 0);
	CU_ASSERT(h_file_contains(g_log, "adopted from the fd store"));
	CU_ASSERT_EQUAL(counter("restarts"), 1);
	CU_ASSERT_EQUAL(counter("sessions_resumed"), 1);
	CU_ASSERT_EQUAL(counter("pages_adopted"), 7); /* 4 token pages, 3 keyed */
	CU_ASSERT_EQUAL(counter("pages_discarded"), 0);
	finish(c, pid);
}

/* kill -9 with the checkpoint's bytes corrupted: the pool starts empty, says why, never serves
 * what the books do not prove. */
static void test_restart_corrupt_books_start_empty(void)
{
	uint32_t tok[2 * PT], pages[2], host[8];
	struct kvp_match_result m;
	struct kvp_client *c;
	struct kvp_pool *p;
	int restarted = 0;
	pid_t pid;

	pid = start();
	p = engine("crash-engine", &c);
	publish(p, 2, 7, 0, 0, tok, pages);
	usleep(400 * 1000); /* a checkpoint is written */
	sup_stop(pid, SIGKILL);
	{ /* flip a byte of the books' body */
		int mfd = h_fdsup_fd(&g_s, ".meta");
		uint8_t b = 0;

		CU_ASSERT_FATAL(mfd >= 0);
		CU_ASSERT_EQUAL(pread(mfd, &b, 1, 4096 + 60), 1);
		b ^= 0xff;
		CU_ASSERT_EQUAL(pwrite(mfd, &b, 1, 4096 + 60), 1);
	}
	pid = sup_start();
	CU_ASSERT_EQUAL(match_retry(p, tok, 2 * PT, &m, host, &restarted), 0);
	CU_ASSERT_EQUAL(m.matched_tokens, 0);
	CU_ASSERT(h_file_contains(g_log, "checksum of its books does not match"));
	finish(c, pid);
}

/* Books of the previous format (version 1: a token tree beside a key cache, before the one
 * page index) are not read: the pool starts empty and says why, once. */
static void test_restart_old_books_start_empty(void)
{
	uint32_t tok[2 * PT], pages[2], host[8], v = 1;
	struct kvp_match_result m;
	struct kvp_client *c;
	struct kvp_pool *p;
	int restarted = 0;
	pid_t pid;

	pid = start();
	p = engine("old-books-engine", &c);
	publish(p, 2, 9, 0, 0, tok, pages);
	sup_stop(pid, SIGTERM); /* clean: the books list the 2 pages */
	{ /* the header's version (after the 8-byte magic) as an older kvpoold wrote it */
		int mfd = h_fdsup_fd(&g_s, ".meta");

		CU_ASSERT_FATAL(mfd >= 0);
		CU_ASSERT_EQUAL(pwrite(mfd, &v, sizeof(v), 8), (ssize_t)sizeof(v));
	}
	pid = sup_start();
	CU_ASSERT_EQUAL(match_retry(p, tok, 2 * PT, &m, host, &restarted), 0);
	CU_ASSERT_EQUAL(m.matched_tokens, 0);
	CU_ASSERT_EQUAL(h_fdsup_log_count(&g_s, "books of version 1, this kvpoold reads 2"), 1);
	finish(c, pid);
}

/* A changed host size: the stored pool is released, the new one created afresh. */
static void test_restart_geometry_change_fresh_pool(void)
{
	pid_t pid;

	pid = start();
	sup_stop(pid, SIGTERM);
	write_cfg(32);
	pid = sup_start();
	CU_ASSERT(h_file_contains(g_log, "created afresh: its geometry or size changed"));
	sup_stop(pid, SIGTERM);
	teardown();
}

/* Key entries whose slots were reused (a child stored before its parent) come back whole. */
static void test_restart_key_chains_out_of_order(void)
{
	static const struct kvp_page_key a[3] = { { "a1", 2 }, { "a2", 2 }, { "a3", 2 } };
	static const struct kvp_page_key b[2] = { { "b1", 2 }, { "b2", 2 } };
	struct kvp_insert_keys_result res = { .struct_size = sizeof(res) };
	struct kvp_match_keys_result m = { .struct_size = sizeof(m) };
	uint32_t pages[3], host[8];
	struct kvp_error e;
	struct kvp_client *c;
	struct kvp_pool *p;
	uint64_t lease, ev = 0;
	pid_t pid;

	pid = start();
	p = engine("keys-engine", &c);
	CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc(p, KVP_TIER_HOST, 3, &lease, pages, &e), 0);
	CU_ASSERT_EQUAL_FATAL(kvp_cache_insert_keys(p, lease, 5, a, 3, 0, pages, 3, &res, &e), 0);
	CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc(p, KVP_TIER_HOST, 1, &lease, pages, &e), 0);
	CU_ASSERT_EQUAL_FATAL(kvp_cache_insert_keys(p, lease, 5, b, 1, 0, pages, 1, &res, &e), 0);
	/* the coldest leaf (a3) goes; b2 then takes its slot, below b1's */
	CU_ASSERT_EQUAL(kvp_admin_evict(c, "p", KVP_TIER_HOST, PT, &ev, &e), 0);
	CU_ASSERT_EQUAL(ev, PT);
	CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc(p, KVP_TIER_HOST, 1, &lease, pages, &e), 0);
	CU_ASSERT_EQUAL_FATAL(kvp_cache_insert_keys(p, lease, 5, b, 2, 1, pages, 1, &res, &e), 0);
	CU_ASSERT_EQUAL(res.new_pages, 1);
	sup_stop(pid, SIGTERM);
	pid = sup_start();
	while (kvp_cache_match_keys(p, 5, b, 2, 0, &m, NULL, host, 8, &e) == -KVP_E_RESTARTED)
		;
	CU_ASSERT_EQUAL(m.matched_keys, 2);
	CU_ASSERT_EQUAL(kvp_cache_match_keys(p, 5, a, 3, 0, &m, NULL, host, 8, &e), 0);
	CU_ASSERT_EQUAL(m.matched_keys, 2);
	CU_ASSERT_EQUAL(counter("pages_adopted"), 4);
	finish(c, pid);
}

/* 100 prefixes of 4 pages, each page its bytes, across a clean restart: every prefix matches
 * all its pages, each the same bytes. The books are put back parents first, so the index's
 * entry table grows while the chains' second pages go in (the first 64 fill its first
 * allocation): a page put under a parent whose entry the growth moved must still be found. */
static void test_restart_many_chains_match_whole(void)
{
	enum { N = 100, NP = 4 };
	static uint32_t tok[N][NP * PT], pages[N][NP];
	struct kvp_match_result m;
	struct kvp_client *c;
	struct kvp_pool *p;
	uint32_t host[8];
	int restarted = 0;
	pid_t pid;

	setup();
	write_cfg(N * NP + 16);
	pid = sup_start();
	p = engine("chains-engine", &c);
	for (uint32_t i = 0; i < N; i++)
		publish(p, NP, 100000 * (i + 1), (int)i, 3, tok[i], pages[i]);
	sup_stop(pid, SIGTERM);
	pid = sup_start();
	for (uint32_t i = 0; i < N; i++) {
		CU_ASSERT_EQUAL_FATAL(match_retry(p, tok[i], NP * PT, &m, host, &restarted), 0);
		CU_ASSERT_EQUAL(m.matched_tokens, NP * PT);
		CU_ASSERT_EQUAL(m.n_host, NP);
		for (uint32_t k = 0; k < NP && k < m.n_host; k++)
			CU_ASSERT(host[k] == pages[i][k] &&
				  check(p, host[k], (uint8_t)(i + k * 3)));
	}
	CU_ASSERT_EQUAL(restarted, 1);
	CU_ASSERT_EQUAL(counter("pages_adopted"), N * NP);
	finish(c, pid);
}

/* A restart that loses the fd store: the client maps the new (zeroed) memory instead of
 * keeping the old mapping, and its lease is gone. */
static void test_restart_without_store_maps_new_memory(void)
{
	uint32_t held[1];
	struct kvp_error e;
	struct kvp_client *c;
	struct kvp_pool *p;
	uint64_t held_id;
	const uint8_t *b;
	size_t pb = 2 * 2 * 2 * 8 * 2 * PT, nonzero = 0;
	pid_t pid;

	pid = start();
	p = engine("fresh-engine", &c);
	CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc(p, KVP_TIER_HOST, 1, &held_id, held, &e), 0);
	fill(p, held[0], 3);
	g_s.no_store = true;
	sup_stop(pid, SIGTERM);
	pid = sup_start();
	CU_ASSERT_EQUAL(kvp_lease_free(p, held_id, held, 1, &e), -KVP_E_RESTARTED);
	CU_ASSERT_EQUAL(kvp_lease_free(p, held_id, held, 1, &e), -KVP_E_NOT_FOUND);
	b = kvp_pool_tier_base(p, KVP_TIER_HOST);
	for (size_t i = 0; i < pb; i++)
		nonzero += b[(size_t)held[0] * pb + i] != 0;
	CU_ASSERT_EQUAL(nonzero, 0); /* the new tier, not the old mapping */
	CU_ASSERT(h_fdsup_log_count(&g_s, "the stored pool is released") == 0);
	finish(c, pid);
}

/* The engine comes back after resume_grace_ms: its lease was reclaimed. */
static void test_restart_after_grace_reclaimed(void)
{
	uint32_t held[2];
	struct kvp_error e;
	struct kvp_client *c;
	struct kvp_pool *p;
	uint64_t held_id, ev = 0;
	int r;
	pid_t pid;

	pid = start_full(300, 100);
	p = engine("late-engine", &c);
	CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc(p, KVP_TIER_HOST, 2, &held_id, held, &e), 0);
	sup_stop(pid, SIGTERM);
	pid = sup_start();
	CU_ASSERT(h_wait_file_contains(g_log, "not resumed within resume_grace_ms", 3000));
	r = kvp_admin_flush(c, "p", &ev, &e);
	CU_ASSERT_EQUAL(r, -KVP_E_RESTARTED);
	CU_ASSERT_EQUAL(kvp_lease_free(p, held_id, held, 2, &e), -KVP_E_NOT_FOUND);
	finish(c, pid);
}

/* kill -9 of an idle pool after a checkpoint: the cache is adopted (same bytes), the lease is
 * not (leases come back only from a clean stop). */
static void test_restart_kill9_consistent_adopts_cache(void)
{
	uint32_t tok[3 * PT], pages[3], held[1], host[8];
	struct kvp_match_result m;
	struct kvp_error e;
	struct kvp_client *c;
	struct kvp_pool *p;
	uint64_t held_id;
	int restarted = 0;
	pid_t pid;

	pid = start();
	p = engine("crash-engine", &c);
	publish(p, 3, 500, 40, 1, tok, pages);
	CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc(p, KVP_TIER_HOST, 1, &held_id, held, &e), 0);
	usleep(400 * 1000);
	sup_stop(pid, SIGKILL);
	pid = sup_start();
	CU_ASSERT_EQUAL(match_retry(p, tok, 3 * PT, &m, host, &restarted), 0);
	CU_ASSERT_EQUAL(restarted, 1);
	CU_ASSERT_EQUAL(m.n_host, 3);
	for (int i = 0; i < 3 && m.n_host == 3; i++)
		CU_ASSERT(check(p, host[i], (uint8_t)(40 + i)));
	CU_ASSERT_EQUAL(kvp_lease_free(p, held_id, held, 1, &e), -KVP_E_NOT_FOUND);
	finish(c, pid);
}

/* kill -9 right after cached pages were evicted and reused: the checkpoint no longer proves
 * them, so the pool starts empty and says why. */
static void test_restart_kill9_after_eviction_discards(void)
{
	uint32_t tok[2 * PT], pages[64], host[8];
	struct kvp_match_result m;
	struct kvp_error e;
	struct kvp_client *c;
	struct kvp_pool *p;
	uint64_t big;
	int restarted = 0;
	pid_t pid;

	pid = start_full(5000, 3600000); /* no checkpoint after the first */
	p = engine("evict-engine", &c);
	publish(p, 2, 900, 0, 0, tok, pages);
	/* a clean stop and start: the books now list the 2 cached pages */
	sup_stop(pid, SIGTERM);
	pid = sup_start();
	CU_ASSERT_EQUAL(match_retry(p, tok, 2 * PT, &m, host, &restarted), 0);
	CU_ASSERT_EQUAL(m.n_host, 2);
	/* every page leased: the cached ones are evicted and overwritten */
	CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc(p, KVP_TIER_HOST, 64, &big, pages, &e), 0);
	for (int i = 0; i < 64; i++)
		fill(p, pages[i], 0xee);
	sup_stop(pid, SIGKILL);
	pid = sup_start();
	CU_ASSERT_EQUAL(match_retry(p, tok, 2 * PT, &m, host, &restarted), 0);
	CU_ASSERT_EQUAL(m.matched_tokens, 0);
	CU_ASSERT(h_file_contains(g_log, "without a clean checkpoint"));
	finish(c, pid);
}

/* A checkpoint that cannot grow the books' memory (the "snapshot" fault site: the second
 * growth, once) leaves the previous checkpoint valid: a kill -9 right after it still adopts
 * the cache the previous one listed. The books (91 bytes a cached page: its record and tokens;
 * no page key derived without the remote tier): about 0.4 KiB with 3 pages cached (the first
 * growth made room for 4 KiB), 2.8 KiB with 27 more (the next checkpoint grows to half as much
 * again before it overwrites anything: the growth that fails), 5 KiB with 25 more. */
static void test_restart_failed_checkpoint_keeps_previous(void)
{
	static uint32_t tok[36 * PT], pages[36], tok2[36 * PT], tok3[25 * PT];
	uint32_t host[8];
	struct kvp_match_result m;
	struct kvp_client *c;
	struct kvp_pool *p;
	int restarted = 0;
	pid_t pid;

	setup();
	write_cfg_full(64, 5000, 300);
	setenv("KVPOOLD_FAULTS", "snapshot:2:1", 1);
	pid = sup_start();
	unsetenv("KVPOOLD_FAULTS");
	p = engine("grow-engine", &c);
	publish(p, 3, 700, 60, 1, tok, pages);
	publish(p, 27, 100000, 0, 0, tok2, pages);
	usleep(700 * 1000); /* a checkpoint lists the 30 pages */
	CU_ASSERT(!h_file_contains(g_log, "a checkpoint failed"));
	publish(p, 25, 200000, 0, 0, tok3, pages);
	CU_ASSERT_FATAL(h_wait_file_contains(g_log, "a checkpoint failed", 5000));
	CU_ASSERT(h_file_contains(g_log, "the previous one is kept"));
	sup_stop(pid, SIGKILL);
	pid = sup_start();
	CU_ASSERT_EQUAL(match_retry(p, tok, 3 * PT, &m, host, &restarted), 0);
	CU_ASSERT_EQUAL(restarted, 1);
	CU_ASSERT_EQUAL(m.n_host, 3);
	for (int i = 0; i < 3 && m.n_host == 3; i++)
		CU_ASSERT(check(p, host[i], (uint8_t)(60 + i)));
	CU_ASSERT_EQUAL(match_retry(p, tok2, 8 * PT, &m, host, &restarted), 0);
	CU_ASSERT_EQUAL(m.n_host, 8); /* of the 27 (8 asked for) */
	CU_ASSERT_EQUAL(match_retry(p, tok3, 8 * PT, &m, host, &restarted), 0);
	CU_ASSERT_EQUAL(m.matched_tokens, 0); /* after the kept checkpoint */
	CU_ASSERT(!h_file_contains(g_log, "without a clean checkpoint"));
	finish(c, pid);
}

/* An engine in another process publishes and matches without pause while kvpoold restarts 20
 * times (every fifth a kill -9): every hit holds the bytes of its own prefix. */
static int load_engine(const char *stopfile)
{
	struct kvp_error e;
	struct kvp_client *c = kvp_client_connect(g_sock, "load-engine", &e);
	struct kvp_pool *p = c ? kvp_pool_attach(c, "p", NULL, &e) : NULL;
	uint32_t seq = 0, mismatches = 0, hits = 0, restarts = 0;

	if (!p)
		return 100;
	while (access(stopfile, F_OK) != 0) {
		uint32_t tok[2 * PT], pages[2], host[8], dev[8];
		struct kvp_match_result m = { .struct_size = sizeof(m) };
		uint64_t lease, nt;
		uint32_t probe = seq ? seq - 1 - (uint32_t)rand() % (seq < 16 ? seq : 16) : 0;
		int r;

		for (uint32_t i = 0; i < 2 * PT; i++)
			tok[i] = seq * 1000 + i + 1;
		r = kvp_lease_alloc(p, KVP_TIER_HOST, 2, &lease, pages, &e);
		if (r == 0) {
			fill(p, pages[0], (uint8_t)seq);
			fill(p, pages[1], (uint8_t)(seq + 100));
			r = kvp_cache_insert(p, lease, 1, tok, 2 * PT, 0, pages, 2, &nt, &e);
			if (r == 0)
				r = kvp_lease_free(p, lease, NULL, 0, &e);
			seq += r == 0;
		}
		restarts += r == -KVP_E_RESTARTED;
		for (uint32_t i = 0; i < 2 * PT; i++)
			tok[i] = probe * 1000 + i + 1;
		r = kvp_cache_match(p, 1, tok, 2 * PT, 0, &m, dev, host, 8, &e);
		restarts += r == -KVP_E_RESTARTED;
		if (r == 0 && m.n_host) {
			hits++;
			if (!check(p, host[0], (uint8_t)probe))
				mismatches++;
			if (m.n_host > 1 && !check(p, host[1], (uint8_t)(probe + 100)))
				mismatches++;
		}
		if (r < 0 && r != -KVP_E_RESTARTED && r != -KVP_E_NOT_FOUND)
			return 101;
	}
	printf("\n    load engine: %u prefixes, %u hits, %u restarts seen, %u mismatches\n", seq,
	       hits, restarts, mismatches);
	kvp_client_close(c);
	return mismatches ? 1 : restarts ? 0 : 102;
}

static void test_restart_20_under_load_no_mismatch(void)
{
	char stopfile[128];
	pid_t pid, eng;
	int st;

	pid = start();
	snprintf(stopfile, sizeof(stopfile), "%s/stop", g_dir);
	eng = fork();
	if (eng == 0) {
		_exit(load_engine(stopfile));
	}
	for (int i = 0; i < 20; i++) {
		usleep(150 * 1000);
		sup_stop(pid, i % 5 == 4 ? SIGKILL : SIGTERM);
		pid = sup_start();
	}
	usleep(200 * 1000);
	CU_ASSERT_EQUAL(h_write_file(stopfile, "stop"), 0);
	CU_ASSERT_EQUAL(waitpid(eng, &st, 0), eng);
	CU_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	sup_stop(pid, SIGTERM);
	teardown();
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_restart_clean_keeps_cache_lease_and_mapping),
		H_TEST(test_restart_corrupt_books_start_empty),
		H_TEST(test_restart_geometry_change_fresh_pool),
		H_TEST(test_restart_old_books_start_empty),
		H_TEST(test_restart_key_chains_out_of_order),
		H_TEST(test_restart_many_chains_match_whole),
		H_TEST(test_restart_without_store_maps_new_memory),
		H_TEST(test_restart_after_grace_reclaimed),
		H_TEST(test_restart_kill9_consistent_adopts_cache),
		H_TEST(test_restart_kill9_after_eviction_discards),
		H_TEST(test_restart_failed_checkpoint_keeps_previous),
		H_TEST(test_restart_20_under_load_no_mismatch),
	};

	return H_RUN_SUITE("restart", NULL, NULL, tests);
}
