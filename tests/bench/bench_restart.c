/* bench_restart.c - restarts through the fd store (tests/lib/fdsup.c plays systemd):
 *  - restart.first_hit_s: seconds from SIGTERM of kvpoold to an engine's first hit on a
 *    prefix it published before, against the first answered match of a restart without the
 *    fd store (the cache lost: that match is a miss);
 *  - restart.hit_rate_after: the share of the published tokens hit right after, against the
 *    same without the fd store;
 *  - restart.adopt_host_tier_ms: kvpoold's start to ready with a large host tier adopted,
 *    against the same start creating it (KVP_BENCH_ADOPT_MIB sets the size; 16384 is the
 *    issue's 16 GiB). */
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
	return failed;
}
