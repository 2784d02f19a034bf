/* bench_e2e.c - end to end, two scenarios against one kvpoold (started here on a temporary
 * socket), each run on one shared pool of capacity C and on four pools of C/4, which is what
 * in-process allocators give each engine today. Ratios shared / private.
 * (1) kvpool-loadgen --workload shared-prefix --procs 4: pool "shared" (device and host tier)
 *     against "part0".."part3". Requests/s, hit rate, hit tokens (tokens not recomputed),
 *     OUT_OF_CAPACITY errors. Every byte the loadgen reads from a cached page is verified by it;
 *     a mismatch fails the run. The loadgen verifies every matched byte and writes every
 *     computed one, so a hit costs it about as much as a miss: requests/s says little about
 *     recompute saved; hit_tokens does.
 * (2) Uneven demand (lease workload): one engine serves long contexts, three serve short
 *     requests, at the same time. Pool "burst" against "long0", "short0".."short2". Long
 *     requests served, short requests/s, OUT_OF_CAPACITY errors.
 * (3) The same uneven demand on one pool "tight" of 3C/4 (the four engines' peak needs more),
 *     with pressure_watermark = 25%: the engines without pressure notices against the same
 *     engines with kvpool-loadgen --on-pressure (they shrink their batch below the watermark,
 *     before an Alloc fails). OUT_OF_CAPACITY errors, requests served. */
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>

#include "bench_net.h"

#define C_TOKENS 8192

static const char *loadgen(void)
{
	const char *p = getenv("KVPOOL_LOADGEN");

	return p ? p : "../client/kvpool-loadgen";
}

static void pool_section(char *buf, size_t cap, const char *name, uint32_t tokens)
{
	size_t n = strlen(buf);

	snprintf(buf + n, cap - n,
		 "[pool.%s]\nlayers = 4\nkv_heads = 2\nhead_dim = 64\ndtype = fp16\n"
		 "page_tokens = 16\ndevice = sim\ndevice_capacity = %ut\nhost_capacity = %ut\n"
		 "mlock = off\neviction = lru\n",
		 name, tokens, tokens);
}

struct lg {
	double rps, wall;
	double requests, hit, queried, oom, failed, mismatches, notices;
};

static double field(const char *json, const char *key)
{
	char pat[80];
	const char *p;

	snprintf(pat, sizeof(pat), "\"%s\":", key);
	p = strstr(json, pat);
	return p ? strtod(p + strlen(pat), NULL) : 0;
}

/* After a failed run: whether kvpoold is still alive, and the end of its log. */
static void daemon_report(struct daemon *d)
{
	char buf[2049];
	FILE *f = fopen(d->log, "r");
	size_t n = 0;
	int st;

	if (d->pid > 0 && waitpid(d->pid, &st, WNOHANG) == d->pid) {
		if (WIFSIGNALED(st))
			fprintf(stderr, "bench: kvpoold was killed by signal %d\n", WTERMSIG(st));
		else
			fprintf(stderr, "bench: kvpoold exited with status %d\n", WEXITSTATUS(st));
		d->pid = 0;
	}
	if (f) {
		fseek(f, 0, SEEK_END);
		if (ftell(f) > 2048)
			fseek(f, -2048, SEEK_END);
		else
			rewind(f);
		n = fread(buf, 1, sizeof(buf) - 1, f);
		buf[n] = 0;
		fclose(f);
		fprintf(stderr, "bench: end of the kvpoold log (%s):\n%s\n", d->log, buf);
	}
}

struct lg_run {
	pid_t pid;
	int fd;
	const char *what;
};

/* Starts kvpool-loadgen on pool `pool` (a private pool per process: pool<i>) with workload
 * arguments wl (NULL-terminated); its JSON summary is read by lg_finish. */
static void lg_start(struct lg_run *run, struct daemon *d, const char *pool, int private_pools,
		     const char *procs, const char *seconds, const char *const *wl)
{
	const char *argv[40];
	int n = 0, pfd[2];

	argv[n++] = loadgen();
	argv[n++] = "--socket";
	argv[n++] = d->sock;
	argv[n++] = "--pool";
	argv[n++] = pool;
	argv[n++] = "--procs";
	argv[n++] = procs;
	argv[n++] = "--seconds";
	argv[n++] = seconds;
	for (int i = 0; wl[i] && n < 36; i++)
		argv[n++] = wl[i];
	if (private_pools)
		argv[n++] = "--private-pools";
	argv[n++] = "--json";
	argv[n] = NULL;
	if (pipe2(pfd, O_CLOEXEC) < 0)
		B_DIE("pipe failed");
	run->what = b_fmt("%s on %s pools %s", argv[0], private_pools ? "private" : "shared", pool);
	run->pid = fork();
	if (run->pid < 0)
		B_DIE("fork failed");
	if (run->pid == 0) {
		dup2(pfd[1], 1);
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	close(pfd[1]);
	run->fd = pfd[0];
}

/* Reads run's summary into out. Returns 0, or -1 after saying why the run failed. */
static int lg_finish(struct lg_run *run, struct daemon *d, struct lg *out)
{
	char buf[8192];
	size_t len = 0;
	ssize_t k;
	int st;

	while ((k = read(run->fd, buf + len, sizeof(buf) - 1 - len)) > 0)
		len += (size_t)k;
	buf[len] = 0;
	close(run->fd);
	waitpid(run->pid, &st, 0);
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || !strstr(buf, "\"requests_per_s\"")) {
		daemon_report(d);
		fprintf(stderr, "bench: %s failed: exit %d, output: %s\n", run->what,
			WIFEXITED(st) ? WEXITSTATUS(st) : -1, buf);
		return -1;
	}
	out->rps = field(buf, "requests_per_s");
	out->wall = field(buf, "wall_s");
	out->requests = field(buf, "requests");
	out->hit = field(buf, "hit_tokens");
	out->queried = field(buf, "queried_tokens");
	out->oom = field(buf, "OUT_OF_CAPACITY");
	out->failed = field(buf, "failed_procs");
	out->mismatches = field(buf, "mismatches");
	out->notices = field(buf, "pressure_notices");
	return 0;
}

/* The shared-prefix workload on 4 processes: the shared pool, or part0..part3. */
static void run_prefix(struct daemon *d, int private_pools, const char *seconds,
		       const char *const *wl, struct lg *out)
{
	struct lg_run r;

	lg_start(&r, d, private_pools ? "part" : "shared", private_pools, "4", seconds, wl);
	if (lg_finish(&r, d, out) < 0)
		B_DIE("the shared-prefix run failed");
}

/* Uneven demand, run at once: one engine serves long contexts (LONG_TOKENS each, more than a
 * quarter pool holds), three serve short requests. Shared: all four on pool "burst" (C);
 * private: "long0" and "short0".."short2" (C/4 each). */
#define LONG_TOKENS "3072"
static void run_uneven_on(struct daemon *d, const char *long_pool, const char *short_pool,
			  int private_pools, int on_pressure, const char *seconds, struct lg *lng,
			  struct lg *shrt)
{
	const char *const long_wl[] = { "--workload",
					"lease",
					"--min-tokens",
					LONG_TOKENS,
					"--max-tokens",
					LONG_TOKENS,
					"--batch",
					"1",
					on_pressure ? "--on-pressure" : NULL,
					NULL };
	const char *const short_wl[] = { "--workload",
					 "lease",
					 "--min-tokens",
					 "128",
					 "--max-tokens",
					 "768",
					 "--batch",
					 "2",
					 on_pressure ? "--on-pressure" : NULL,
					 NULL };
	struct lg_run a, b;

	lg_start(&a, d, long_pool, private_pools, "1", seconds, long_wl);
	lg_start(&b, d, short_pool, private_pools, "3", seconds, short_wl);
	if (lg_finish(&a, d, lng) < 0) {
		kill(b.pid, SIGTERM); /* not left running past this process */
		waitpid(b.pid, NULL, 0);
		B_DIE("the uneven run failed");
	}
	if (lg_finish(&b, d, shrt) < 0)
		B_DIE("the uneven run failed");
}

static void run_uneven(struct daemon *d, int private_pools, const char *seconds, struct lg *lng,
		       struct lg *shrt)
{
	run_uneven_on(d, private_pools ? "long" : "burst", private_pools ? "short" : "burst",
		      private_pools, 0, seconds, lng, shrt);
}

int main(int argc, char **argv)
{
	int quick = b_quick(argc, argv);
	const char *seconds = quick ? "1" : "6";
	/* 16 system prompts of 768 tokens (12288 tokens: fit the shared pool's 2 x 8192, not a
	 * private pool's 2 x 2048), conversations of 4 turns of 128 tokens */
	static const char *const wl[] = {
		"--workload", "shared-prefix", "--families", "16",	"--prefix-tokens",
		"768",	      "--turn-tokens", "128",	     "--turns", "4",
		NULL
	};
	char conf[8192] = "[daemon]\nkeepalive_ms = 10000\n";
	struct lg sh = { 0 }, pr = { 0 }, ul_sh = { 0 }, us_sh = { 0 }, ul_pr = { 0 },
		  us_pr = { 0 }, tl_off = { 0 }, ts_off = { 0 }, tl_on = { 0 }, ts_on = { 0 };
	static struct daemon d;
	const char *prm;

	pool_section(conf, sizeof(conf), "shared", C_TOKENS);
	for (int i = 0; i < 4; i++)
		pool_section(conf, sizeof(conf), b_fmt("part%d", i), C_TOKENS / 4);
	pool_section(conf, sizeof(conf), "burst", C_TOKENS);
	pool_section(conf, sizeof(conf), "long0", C_TOKENS / 4);
	for (int i = 0; i < 3; i++)
		pool_section(conf, sizeof(conf), b_fmt("short%d", i), C_TOKENS / 4);
	pool_section(conf, sizeof(conf), "tight", C_TOKENS * 3 / 4);
	snprintf(conf + strlen(conf), sizeof(conf) - strlen(conf),
		 "pressure_watermark = 50%%\npressure_interval_ms = 10\n");
	bn_daemon_start(&d, conf);
	/* alternate: private first, then shared (each pool starts cold) */
	run_prefix(&d, 1, seconds, wl, &pr);
	run_prefix(&d, 0, seconds, wl, &sh);
	run_uneven(&d, 1, seconds, &ul_pr, &us_pr);
	run_uneven(&d, 0, seconds, &ul_sh, &us_sh);
	run_uneven_on(&d, "tight", "tight", 0, 0, seconds, &tl_off, &ts_off);
	run_uneven_on(&d, "tight", "tight", 0, 1, seconds, &tl_on, &ts_on);
	bn_cleanup();

	prm = b_fmt("{\"procs\":4,\"seconds\":%s,\"families\":16,\"prefix_tokens\":768,"
		    "\"turn_tokens\":128,\"turns\":4,\"page_tokens\":16,\"row_bytes\":256,"
		    "\"shared\":{\"device_tokens\":%u,\"host_tokens\":%u},"
		    "\"private\":{\"pools\":4,\"device_tokens\":%u,\"host_tokens\":%u},"
		    "\"hit_rate\":{\"shared\":%.3f,\"private\":%.3f},"
		    "\"capacity_errors\":{\"shared\":%.0f,\"private\":%.0f},"
		    "\"requests\":{\"shared\":%.0f,\"private\":%.0f}}",
		    seconds, C_TOKENS, C_TOKENS, C_TOKENS / 4, C_TOKENS / 4,
		    sh.queried ? sh.hit / sh.queried : 0, pr.queried ? pr.hit / pr.queried : 0,
		    sh.oom, pr.oom, sh.requests, pr.requests);
	b_row_print(&(struct b_row){ .name = "e2e.shared_prefix.requests_per_s",
				     .params = prm,
				     .baseline_what =
					     "same workload, 4 private pools of C/4 (requests/s)",
				     .baseline = pr.rps,
				     .have_base = 1,
				     .value = sh.rps,
				     .have_value = 1,
				     .unit = "requests/s",
				     .target = "shared / private" });
	b_row_print(&(struct b_row){
		.name = "e2e.shared_prefix.hit_tokens",
		.params = prm,
		.baseline_what = "same workload, 4 private pools of C/4 (tokens not recomputed)",
		.baseline = pr.hit,
		.have_base = 1,
		.value = sh.hit,
		.have_value = 1,
		.unit = "tokens",
		.target = "shared / private",
		.note = "totals over the run; compare with requests (params) for per-request" });
	b_row_print(&(struct b_row){
		.name = "e2e.shared_prefix.hit_rate",
		.params = prm,
		.baseline_what =
			"same workload, 4 private pools of C/4 (hit tokens / queried tokens)",
		.baseline = pr.queried ? pr.hit / pr.queried : 0,
		.have_base = pr.queried > 0,
		.value = sh.queried ? sh.hit / sh.queried : 0,
		.have_value = sh.queried > 0,
		.unit = "fraction",
		.target = "shared / private" });
	b_row_print(&(struct b_row){
		.name = "e2e.shared_prefix.capacity_errors",
		.params = prm,
		.baseline_what = "same workload, 4 private pools of C/4 (errors.OUT_OF_CAPACITY)",
		.baseline = pr.oom,
		.have_base = 1,
		.value = sh.oom,
		.have_value = 1,
		.unit = "errors",
		.target = "fewer is better" });

	prm = b_fmt("{\"seconds\":%s,\"long\":{\"procs\":1,\"tokens\":%s,\"batch\":1},"
		    "\"short\":{\"procs\":3,\"tokens\":\"128-768\",\"batch\":2},"
		    "\"page_tokens\":16,\"shared\":{\"device_tokens\":%u},"
		    "\"private\":{\"pools\":4,\"device_tokens\":%u},"
		    "\"long_requests\":{\"shared\":%.0f,\"private\":%.0f},"
		    "\"short_requests_per_s\":{\"shared\":%.1f,\"private\":%.1f},"
		    "\"capacity_errors\":{\"shared\":%.0f,\"private\":%.0f}}",
		    seconds, LONG_TOKENS, C_TOKENS, C_TOKENS / 4, ul_sh.requests, ul_pr.requests,
		    us_sh.rps, us_pr.rps, ul_sh.oom + us_sh.oom, ul_pr.oom + us_pr.oom);
	b_row_print(&(struct b_row){
		.name = "e2e.uneven.long_requests",
		.params = prm,
		.baseline_what =
			"same engines, 4 private pools of C/4 (long-context requests served)",
		.baseline = ul_pr.requests,
		.have_base = 1,
		.value = ul_sh.requests,
		.have_value = 1,
		.unit = "requests",
		.target = "shared / private",
		.note = "a long request needs more than a quarter pool: privately it is refused "
			"every time (short requests/s in params: on few cores they share the CPU "
			"with the long engine's byte work)" });
	b_row_print(&(struct b_row){
		.name = "e2e.uneven.capacity_errors",
		.params = prm,
		.baseline_what = "same engines, 4 private pools of C/4 (errors.OUT_OF_CAPACITY)",
		.baseline = ul_pr.oom + us_pr.oom,
		.have_base = 1,
		.value = ul_sh.oom + us_sh.oom,
		.have_value = 1,
		.unit = "errors",
		.target = "fewer is better" });

	prm = b_fmt("{\"seconds\":%s,\"long\":{\"procs\":1,\"tokens\":%s,\"batch\":1},"
		    "\"short\":{\"procs\":3,\"tokens\":\"128-768\",\"batch\":2},"
		    "\"page_tokens\":16,\"pool\":{\"device_tokens\":%u,"
		    "\"pressure_watermark\":\"50%%\",\"pressure_interval_ms\":10},"
		    "\"capacity_errors\":{\"notices\":%.0f,\"no_notices\":%.0f},"
		    "\"long_requests\":{\"notices\":%.0f,\"no_notices\":%.0f},"
		    "\"short_requests\":{\"notices\":%.0f,\"no_notices\":%.0f},"
		    "\"notices_taken\":%.0f}",
		    seconds, LONG_TOKENS, C_TOKENS * 3 / 4, tl_on.oom + ts_on.oom,
		    tl_off.oom + ts_off.oom, tl_on.requests, tl_off.requests, ts_on.requests,
		    ts_off.requests, tl_on.notices + ts_on.notices);
	b_row_print(&(struct b_row){
		.name = "e2e.uneven.pressure_notices.capacity_errors",
		.params = prm,
		.baseline_what = "same engines on the same pool of 3C/4, no pressure notices "
				 "(errors.OUT_OF_CAPACITY)",
		.baseline = tl_off.oom + ts_off.oom,
		.have_base = 1,
		.value = tl_on.oom + ts_on.oom,
		.have_value = 1,
		.unit = "errors",
		.target = "fewer is better",
		.note = "with notices (kvpool-loadgen --on-pressure) the engines halve their batch "
			"and admit one request at a time below the watermark; requests served in "
			"params" });
	return 0;
}
