/* bench_e2e.c - end to end: kvpool-loadgen --workload shared-prefix --procs 4 against one
 * kvpoold (started here on a temporary socket) whose config has one shared pool "shared" of
 * capacity C (device and host tier) and four pools "part0".."part3" of C/4 each, which is what
 * in-process allocators give each engine today. Same workload against both: requests/s, hit
 * rate, hit tokens (tokens not recomputed), OUT_OF_CAPACITY errors. Ratios shared / private.
 * Every byte the loadgen reads from a cached page is verified by it; a mismatch fails the run.
 * Note: the loadgen verifies every matched byte and writes every computed one, so a hit costs
 * it about as much as a miss: requests/s says little about recompute saved; hit_tokens does. */
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
	double requests, hit, queried, oom, failed, mismatches;
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

static void run_loadgen(struct daemon *d, int private_pools, const char *seconds,
			const char *const *wl, struct lg *out)
{
	const char *sock = d->sock;
	const char *argv[40];
	char buf[8192];
	int n = 0, pfd[2], st;
	size_t len = 0;
	ssize_t k;
	pid_t pid;

	argv[n++] = loadgen();
	argv[n++] = "--socket";
	argv[n++] = sock;
	argv[n++] = "--pool";
	argv[n++] = private_pools ? "part" : "shared";
	argv[n++] = "--workload";
	argv[n++] = "shared-prefix";
	argv[n++] = "--procs";
	argv[n++] = "4";
	argv[n++] = "--seconds";
	argv[n++] = seconds;
	for (int i = 0; wl[i]; i++)
		argv[n++] = wl[i];
	if (private_pools)
		argv[n++] = "--private-pools";
	argv[n++] = "--json";
	argv[n] = NULL;
	if (pipe2(pfd, O_CLOEXEC) < 0)
		B_DIE("pipe failed");
	pid = fork();
	if (pid == 0) {
		dup2(pfd[1], 1);
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	close(pfd[1]);
	while ((k = read(pfd[0], buf + len, sizeof(buf) - 1 - len)) > 0)
		len += (size_t)k;
	buf[len] = 0;
	close(pfd[0]);
	waitpid(pid, &st, 0);
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || !strstr(buf, "\"requests_per_s\""))
		daemon_report(d);
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || !strstr(buf, "\"requests_per_s\""))
		B_DIE("%s (%s pools) failed: exit %d, output: %s", argv[0],
		      private_pools ? "private" : "shared", WIFEXITED(st) ? WEXITSTATUS(st) : -1, buf);
	out->rps = field(buf, "requests_per_s");
	out->wall = field(buf, "wall_s");
	out->requests = field(buf, "requests");
	out->hit = field(buf, "hit_tokens");
	out->queried = field(buf, "queried_tokens");
	out->oom = field(buf, "OUT_OF_CAPACITY");
	out->failed = field(buf, "failed_procs");
	out->mismatches = field(buf, "mismatches");
}

int main(int argc, char **argv)
{
	int quick = b_quick(argc, argv);
	const char *seconds = quick ? "1.5" : "6";
	/* 16 system prompts of 768 tokens (12288 tokens: fit the shared pool's 2 x 8192, not a
	 * private pool's 2 x 2048), conversations of 4 turns of 128 tokens */
	static const char *const wl[] = { "--families", "16", "--prefix-tokens", "768",
					  "--turn-tokens", "128", "--turns", "4", NULL };
	char conf[4096] = "[daemon]\nkeepalive_ms = 10000\n";
	struct lg sh = { 0 }, pr = { 0 };
	static struct daemon d;
	const char *prm;

	pool_section(conf, sizeof(conf), "shared", C_TOKENS);
	for (int i = 0; i < 4; i++)
		pool_section(conf, sizeof(conf), b_fmt("part%d", i), C_TOKENS / 4);
	bn_daemon_start(&d, conf);
	/* alternate: private first, then shared (each pool starts cold) */
	run_loadgen(&d, 1, seconds, wl, &pr);
	run_loadgen(&d, 0, seconds, wl, &sh);
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
	b_row_print(&(struct b_row){
		.name = "e2e.shared_prefix.requests_per_s", .params = prm,
		.baseline_what = "same workload, 4 private pools of C/4 (requests/s)",
		.baseline = pr.rps, .have_base = 1, .value = sh.rps, .have_value = 1,
		.unit = "requests/s", .target = "shared / private" });
	b_row_print(&(struct b_row){
		.name = "e2e.shared_prefix.hit_tokens", .params = prm,
		.baseline_what = "same workload, 4 private pools of C/4 (tokens not recomputed)",
		.baseline = pr.hit, .have_base = 1, .value = sh.hit, .have_value = 1,
		.unit = "tokens", .target = "shared / private",
		.note = "totals over the run; compare with requests (params) for per-request" });
	b_row_print(&(struct b_row){
		.name = "e2e.shared_prefix.hit_rate", .params = prm,
		.baseline_what = "same workload, 4 private pools of C/4 (hit tokens / queried tokens)",
		.baseline = pr.queried ? pr.hit / pr.queried : 0, .have_base = pr.queried > 0,
		.value = sh.queried ? sh.hit / sh.queried : 0, .have_value = sh.queried > 0,
		.unit = "fraction", .target = "shared / private" });
	b_row_print(&(struct b_row){
		.name = "e2e.shared_prefix.capacity_errors", .params = prm,
		.baseline_what = "same workload, 4 private pools of C/4 (errors.OUT_OF_CAPACITY)",
		.baseline = pr.oom, .have_base = 1, .value = sh.oom, .have_value = 1,
		.unit = "errors", .target = "fewer is better" });
	return 0;
}
