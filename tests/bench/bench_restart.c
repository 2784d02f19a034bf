/* bench_restart.c - restarts through the fd store (tests/lib/fdsup.c plays systemd):
 *  - restart.first_hit_s: seconds from SIGTERM of kvpoold to an engine's first hit on a
 *    prefix it published before, against the first answered match of a restart without the
 *    fd store (the cache lost: that match is a miss);
 *  - restart.hit_rate_after: the share of the published tokens hit right after, against the
 *    same without the fd store;
 *  - restart.adopt_host_tier_ms: kvpoold's start to ready with a large host tier adopted,
 *    against the same start creating it (KVP_BENCH_ADOPT_MIB sets the size; 16384 is the
 *    issue's 16 GiB);
 *  - restart.checkpoint_ms: one periodic checkpoint of a changed pool's books with 100,000
 *    prefixes of 10 pages (KVP_BENCH_CK_PREFIXES), against a memcpy of the books' bytes. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "fdsup.h"
#include "kvpool.h"

#define PT 16

static int config(struct h_fdsup *s, uint64_t host_mib)
{
	char text[512];

	snprintf(text, sizeof(text),
		 "[daemon]\nresume_grace_ms = 5000\n"
		 "[pool.p]\nlayers = 2\nkv_heads = 2\nhead_dim = 8\ndtype = fp16\n"
		 "page_tokens = %d\ndevice = none\nhost_capacity = %luM\nmlock = off\n",
		 PT, (unsigned long)host_mib);
	return h_fdsup_config(s, text);
}

static void tokens_of(uint32_t seq, uint32_t *tok, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		tok[i] = seq * 100000 + i + 1;
}

/* One restart (with or without the store) after publishing nprefix prefixes of 4 pages:
 * seconds to the first answered match of prefix 0 (a hit with the store) and the hit rate
 * over all of them right after. 0 or -1. */
static int one_restart(bool store, uint32_t nprefix, double *first_s, double *hit_rate)
{
	struct h_fdsup s;
	struct kvp_error e;
	struct kvp_client *c = NULL;
	struct kvp_pool *p = NULL;
	uint32_t tok[4 * PT], pages[4], host[8], dev[8];
	uint64_t hit = 0;
	double t0;
	pid_t pid;
	int r = -1;

	if (h_fdsup_init(&s) < 0 || config(&s, 64) < 0 || (pid = h_fdsup_start(&s)) < 0)
		goto out;
	c = kvp_client_connect(s.sock, "bench-restart", &e);
	p = c ? kvp_pool_attach(c, "p", NULL, &e) : NULL;
	if (!p)
		goto stop;
	for (uint32_t i = 0; i < nprefix; i++) {
		uint64_t lease, nt;

		tokens_of(i, tok, 4 * PT);
		if (kvp_lease_alloc(p, KVP_TIER_HOST, 4, &lease, pages, &e) < 0 ||
		    kvp_cache_insert(p, lease, 1, tok, 4 * PT, 0, pages, 4, &nt, &e) < 0 ||
		    kvp_lease_free(p, lease, NULL, 0, &e) < 0)
			goto stop;
	}
	s.no_store = !store;
	t0 = b_now_s();
	h_fdsup_stop(&s, pid, SIGTERM);
	pid = h_fdsup_start(&s);
	if (pid < 0)
		goto out;
	tokens_of(0, tok, 4 * PT);
	for (;;) {
		struct kvp_match_result m = { .struct_size = sizeof(m) };
		int k = kvp_cache_match(p, 1, tok, 4 * PT, 0, &m, dev, host, 8, &e);

		if (k == 0)
			break;
		if (k != -KVP_E_RESTARTED)
			goto stop;
	}
	*first_s = b_now_s() - t0;
	for (uint32_t i = 0; i < nprefix; i++) {
		struct kvp_match_result m = { .struct_size = sizeof(m) };

		tokens_of(i, tok, 4 * PT);
		if (kvp_cache_match(p, 1, tok, 4 * PT, 0, &m, dev, host, 8, &e) == 0)
			hit += m.matched_tokens;
	}
	*hit_rate = (double)hit / ((double)nprefix * 4 * PT);
	r = 0;
stop:
	kvp_client_close(c);
	h_fdsup_stop(&s, pid, SIGTERM);
out:
	h_fdsup_fini(&s);
	return r;
}

/* MemAvailable in MiB, 0 when unknown. */
static uint64_t mem_available_mib(void)
{
	FILE *f = fopen("/proc/meminfo", "re");
	char line[256];
	unsigned long long kb = 0;

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
			break;
	fclose(f);
	return kb / 1024;
}

/* Start-to-ready of kvpoold with a host tier of mib MiB: created (a first start) and adopted
 * (the restart after it), in ms. 0 or -1. One copy of the tier exists at any time: the first
 * kvpoold's, then the same memory held by the store while nothing runs, then the adopter's;
 * it is freed before this returns (a start not ready in time is killed, see fdsup.h). */
static int start_times(uint64_t mib, double *create_ms, double *adopt_ms)
{
	struct h_fdsup s;
	double t0;
	pid_t pid;
	int r = -1;

	if (h_fdsup_init(&s) < 0 || config(&s, mib) < 0)
		goto out;
	/* Creating faults in every page: at 0.3 GB/s (a VM's fresh memory) 16 GiB takes about a
	 * minute, far past the 10 s a start usually gets. */
	s.start_ms = 60000 + (int)(mib < 131072 ? mib : 131072) * 10;
	t0 = b_now_s();
	pid = h_fdsup_start(&s);
	if (pid < 0)
		goto out;
	*create_ms = (b_now_s() - t0) * 1e3;
	h_fdsup_stop(&s, pid, SIGTERM);
	t0 = b_now_s();
	pid = h_fdsup_start(&s);
	if (pid < 0)
		goto out;
	*adopt_ms = (b_now_s() - t0) * 1e3;
	r = h_fdsup_log_count(&s, "adopted from the fd store") == 1 ? 0 : -1;
	h_fdsup_stop(&s, pid, SIGTERM);
out:
	h_fdsup_fini(&s);
	return r;
}

/* A daemon counter by name (in either list), or -1. */
static int64_t counter_of(const struct kvp_status *st, const char *name)
{
	for (uint32_t i = 0; i < st->n_counters && i < KVP_STATUS_MAX_COUNTERS; i++)
		if (!strcmp(st->counters[i].name, name))
			return (int64_t)st->counters[i].value;
	for (uint32_t i = 0; i < st->n_more_counters && i < KVP_STATUS_MORE_COUNTERS; i++)
		if (!strcmp(st->more_counters[i].name, name))
			return (int64_t)st->more_counters[i].value;
	return -1;
}

#define CK_PAGES 10  /* pages a prefix */
#define CK_BATCH 100 /* prefixes published from one lease */

/* The periodic books checkpoint of a pool holding nprefix prefixes of CK_PAGES pages (the loop
 * waits for it): its mean time over changes made one every interval, in ms, the body's bytes,
 * and the time of a memcpy of as many bytes (the floor of any checkpoint that copies the books
 * once). 0 or -1. */
static int checkpoint_time(uint32_t nprefix, double *ck_ms, double *copy_ms, uint64_t *body)
{
	struct kvp_status *st = calloc(1, sizeof(*st));
	uint64_t pages = (uint64_t)nprefix * CK_PAGES + CK_BATCH * CK_PAGES;
	uint32_t tok[CK_PAGES * PT], lp[CK_BATCH * CK_PAGES];
	int64_t n0, us0, n1, us1;
	struct kvp_client *c = NULL;
	struct kvp_pool *p = NULL;
	struct kvp_error e;
	struct h_fdsup s;
	char text[512];
	pid_t pid = -1;
	int r = -1;

	if (!st || h_fdsup_init(&s) < 0)
		goto out;
	snprintf(text, sizeof(text),
		 "[daemon]\nsnapshot_interval_ms = 200\n"
		 "[pool.p]\nlayers = 1\nkv_heads = 1\nhead_dim = 1\ndtype = fp8\n"
		 "page_tokens = %d\ndevice = none\nhost_capacity = %lut\nmlock = off\n",
		 PT, (unsigned long)(pages * PT));
	if (h_fdsup_config(&s, text) < 0)
		goto out;
	s.start_ms = 60000;
	pid = h_fdsup_start(&s);
	c = pid > 0 ? kvp_client_connect(s.sock, "bench-checkpoint", &e) : NULL;
	p = c ? kvp_pool_attach(c, "p", NULL, &e) : NULL;
	if (!p)
		goto stop;
	for (uint32_t i = 0; i < nprefix + CK_BATCH; i += CK_BATCH) {
		uint64_t lease, nt;

		if (kvp_lease_alloc(p, KVP_TIER_HOST, CK_BATCH * CK_PAGES, &lease, lp, &e) < 0)
			goto stop;
		for (uint32_t j = 0; j < CK_BATCH; j++) {
			for (uint32_t t = 0; t < CK_PAGES * PT; t++)
				tok[t] = (i + j) * 7919u + t +
					 1; /* the first token tells them apart */
			if (kvp_cache_insert(p, lease, 0, tok, CK_PAGES * PT, 0, lp + j * CK_PAGES,
					     CK_PAGES, &nt, &e) < 0)
				goto stop;
			/* the last batch is published one prefix at a time, below */
			if (i + CK_BATCH > nprefix && j == 0)
				break;
		}
		if (i + CK_BATCH > nprefix) {
			/* one prefix every 250 ms: each makes the next checkpoint write the books
			 */
			st->struct_size = sizeof(*st);
			usleep(600000); /* the checkpoint of the whole load lands first */
			if (kvp_client_status(c, st, &e) < 0)
				goto stop;
			n0 = counter_of(st, "checkpoints");
			us0 = counter_of(st, "checkpoint_us");
			for (uint32_t j = 1; j < 9; j++) {
				for (uint32_t t = 0; t < CK_PAGES * PT; t++)
					tok[t] = (i + j) * 7919u + t + 1;
				if (kvp_cache_insert(p, lease, 0, tok, CK_PAGES * PT, 0,
						     lp + j * CK_PAGES, CK_PAGES, &nt, &e) < 0)
					goto stop;
				usleep(250000);
			}
			if (kvp_client_status(c, st, &e) < 0)
				goto stop;
			n1 = counter_of(st, "checkpoints");
			us1 = counter_of(st, "checkpoint_us");
			if (n0 < 0 || us0 < 0 || n1 <= n0)
				goto stop;
			*ck_ms = (double)(us1 - us0) / (double)(n1 - n0) / 1e3;
		}
		kvp_lease_free(p, lease, NULL, 0, &e);
	}
	kvp_client_close(c);
	c = NULL;
	if (h_fdsup_stop(&s, pid, SIGTERM) != 0)
		goto out;
	pid = -1;
	{
		FILE *f = fopen(s.log, "r");
		char line[512];
		unsigned long b = 0;

		while (f && fgets(line, sizeof(line), f)) {
			char *x = strstr(line, "books written for a restart (");

			if (x)
				b = strtoul(x + strlen("books written for a restart ("), NULL, 10);
		}
		if (f)
			fclose(f);
		*body = b;
	}
	if (*body) {
		uint8_t *a = malloc(*body), *b2 = malloc(*body);
		double t0, best = 1e30;

		if (a && b2) {
			memset(a, 1, *body);
			memset(b2, 0, *body);
			for (int k = 0; k < 5; k++) {
				t0 = b_now_s();
				memcpy(b2, a, *body);
				__asm__ volatile("" ::"r"(b2) : "memory");
				if (b_now_s() - t0 < best)
					best = b_now_s() - t0;
			}
			*copy_ms = best * 1e3;
			r = 0;
		}
		free(a);
		free(b2);
	}
stop:
	kvp_client_close(c);
	if (pid > 0)
		h_fdsup_stop(&s, pid, SIGTERM);
out:
	h_fdsup_fini(&s);
	free(st);
	return r;
}

int main(int argc, char **argv)
{
	int quick = b_quick(argc, argv);
	const char *only = b_only(argc, argv);
	uint32_t nprefix = quick ? 64 : 256;
	uint64_t mib = getenv("KVP_BENCH_ADOPT_MIB")
			       ? strtoull(getenv("KVP_BENCH_ADOPT_MIB"), NULL, 10)
		       : quick ? 256
			       : 1024;
	int failed = 0;

	if (b_wanted(only, "restart.first_hit") || b_wanted(only, "restart.hit_rate")) {
		double f_store = 0, f_none = 0, h_store = 0, h_none = 0;

		if (one_restart(true, nprefix, &f_store, &h_store) < 0 ||
		    one_restart(false, nprefix, &f_none, &h_none) < 0) {
			fprintf(stderr, "bench_restart: a restart failed\n");
			failed = 1;
		}
		b_row_print(&(struct b_row){
			.name = "restart.first_hit_s",
			.params = b_fmt("{\"prefixes\":%u,\"tokens\":%u}", nprefix, 4 * PT),
			.baseline_what =
				"first answered match (a miss) after a restart without the fd "
				"store",
			.baseline = f_none,
			.have_base = !failed,
			.value = f_store,
			.have_value = !failed,
			.unit = "s",
			.target = "ratio <= 1.5",
			.note = "SIGTERM to the engine's first hit on a prefix it published before; the "
				"baseline restart loses the cache, so its first hit needs the prefill "
				"again" });
		b_row_print(&(struct b_row){
			.name = "restart.hit_rate_after",
			.params = b_fmt("{\"prefixes\":%u}", nprefix),
			.baseline_what = "hit rate after a restart without the fd store",
			.baseline = h_none,
			.have_base = !failed,
			.value = h_store,
			.have_value = !failed,
			.unit = "fraction",
			.target = "value == 1",
			.note = "share of the published tokens matched right after the restart" });
	}
	if (b_wanted(only, "restart.adopt")) {
		double c_ms = 0, a_ms = 0;
		uint64_t avail = mem_available_mib();
		/* The tier, its bookkeeping and 1 GiB for everything else on the machine. */
		int skip = avail && avail < mib + mib / 64 + 1024;
		int bad = skip || start_times(mib, &c_ms, &a_ms) < 0;

		if (skip) {
			fprintf(stderr,
				"bench_restart: skipped the adopt row: a %lu MiB tier needs about "
				"%lu MiB, MemAvailable is %lu MiB\n",
				(unsigned long)mib, (unsigned long)(mib + mib / 64 + 1024),
				(unsigned long)avail);
		} else if (bad) {
			fprintf(stderr, "bench_restart: the adopt start failed\n");
			failed = 1;
		}
		b_row_print(&(struct b_row){
			.name = "restart.adopt_host_tier_ms",
			.params = b_fmt("{\"host_mib\":%lu}", (unsigned long)mib),
			.baseline_what =
				"kvpoold start to ready creating the host tier (pre-faulted)",
			.baseline = c_ms,
			.have_base = !bad,
			.value = a_ms,
			.have_value = !bad,
			.unit = "ms",
			.target = "ratio <= 0.2",
			.note = skip ? "skipped: not enough MemAvailable for the tier"
				     : "start to ready adopting it from the fd store (mapped, never "
				       "touched); KVP_BENCH_ADOPT_MIB=16384 for 16 GiB" });
	}
	if (b_wanted(only, "restart.checkpoint")) {
		uint32_t np = getenv("KVP_BENCH_CK_PREFIXES")
				      ? (uint32_t)strtoul(getenv("KVP_BENCH_CK_PREFIXES"), NULL, 10)
			      : quick ? 10000
				      : 100000;
		double ck = 0, cp = 0;
		uint64_t body = 0;
		int bad = checkpoint_time(np, &ck, &cp, &body) < 0;

		if (bad) {
			fprintf(stderr, "bench_restart: the checkpoint run failed\n");
			failed = 1;
		}
		b_row_print(&(struct b_row){
			.name = "restart.checkpoint_ms",
			.params = b_fmt("{\"prefixes\":%u,\"pages\":%lu,\"body_bytes\":%lu}", np,
					(unsigned long)np * CK_PAGES, (unsigned long)body),
			.baseline_what = "memcpy of the books' bytes once",
			.baseline = cp,
			.have_base = !bad,
			.value = ck,
			.have_value = !bad,
			.unit = "ms",
			.target = "value <= 5",
			.note = "one periodic checkpoint of a changed pool's books: the time the loop "
				"does not serve (books_checkpoint_microseconds_total over "
				"books_checkpoints_total)" });
	}
	return failed;
}
