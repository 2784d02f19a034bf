/* test_cuda_reclaim.c - CUnit suite "cuda_reclaim": engine processes that hold a cuda pool's
 * imported device memory, device and host leases, a prefix lock and queued GPU work are killed
 * with SIGKILL, CYCLES times. After each kill kvpoold has taken back every lease and lock of the
 * dead session; the daemon keeps demoting cached pages through its CUDA kernels; and nothing
 * grows over the cycles: the daemon's open fds and resident memory, the GPU's free memory (read
 * with cudaMemGetInfo in a fresh process), the tier counts. At the end every cycle's prefix is
 * still cached with its bytes (device or host tier), and the whole device tier can be leased and
 * written again. nvidia-smi's per-process figures are printed when it is installed (logged, not
 * asserted: in a container its pids are the host's). Exits 77 with the reason on machines without
 * a GPU. The parent never touches CUDA, so the children it forks may. */
#include <CUnit/Basic.h>
#include <cuda_runtime_api.h>
#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "kvpool.h"
#include "cuda_drv.h"

#define LAYERS 2
#define PT 16
#define ROW 256		 /* kv_heads * head_dim * fp16 */
#define DEV_TOKENS 65536 /* 64 MiB of device tier: a leak of it shows in cudaMemGetInfo */
#define CYCLES 20
#define CACHED_PAGES 8 /* inserted and locked by each engine */
#define HELD_PAGES 4   /* leased and never inserted, device and host each */
#define GPU_SLACK (32ull << 20)

static const char *const g_conf = "[pool.g]\n"
				  "layers = 2\nkv_heads = 2\nhead_dim = 64\ndtype = fp16\n"
				  "page_tokens = 16\ndevice = cuda:0\ndevice_capacity = 65536t\n"
				  "host_capacity = 16384t\nmlock = off\n";
static struct daemon g_d;
static struct kvp_client *g_obs; /* the parent's status connection: no CUDA */
static uint64_t g_demoted;	 /* tokens kvp_admin_evict demoted over the cycles */
static uint32_t g_sessions;	 /* sessions when no engine runs */

/* The byte every row of (cycle, layer, kv) holds. */
static uint8_t fill(uint32_t cycle, uint32_t l, uint32_t kv)
{
	return (uint8_t)(1 + cycle * 7 + l * 2 + kv);
}

static void tokens_of(uint32_t cycle, uint32_t *tok)
{
	for (uint32_t t = 0; t < CACHED_PAGES * PT; t++)
		tok[t] = 100000 * (cycle + 1) + t;
}

static int run_child(int (*fn)(void *), void *arg)
{
	fflush(stdout);
	return h_in_child(fn, arg);
}

static int probe(void *arg)
{
	char why[256] = "";
	int n = kvp_cuda_probe(why, sizeof(why));

	(void)arg;
	if (n == -ENODEV || n == -ENOTSUP) {
		printf("SKIP: no usable GPU: %s\n", why);
		fflush(stdout);
		return 77;
	}
	if (n < 1) { /* a GPU is there but kvpool cannot drive it: that is a failure */
		printf("FAIL: kvp_cuda_probe = %d: %s\n", n, why);
		fflush(stdout);
		return 1;
	}
	return 0;
}

/* Child: writes the GPU's free memory (bytes) to the pipe in arg. */
static int gpu_free_child(void *arg)
{
	int fd = *(int *)arg;
	size_t fr = 0, total = 0;

	if (cudaSetDevice(0) != cudaSuccess || cudaFree(0) != cudaSuccess ||
	    cudaMemGetInfo(&fr, &total) != cudaSuccess)
		return 1;
	return write(fd, &fr, sizeof(fr)) == sizeof(fr) ? 0 : 2;
}

/* Free memory of GPU 0 as a fresh process sees it; 0 when it cannot be read. */
static uint64_t gpu_free(void)
{
	int p[2];
	size_t fr = 0;

	if (pipe(p) < 0)
		return 0;
	if (run_child(gpu_free_child, &p[1]) != 0 || read(p[0], &fr, sizeof(fr)) != sizeof(fr))
		fr = 0;
	close(p[0]);
	close(p[1]);
	return fr;
}

static void log_nvidia_smi(const char *when)
{
	char line[256];
	FILE *f;

	if (system("command -v nvidia-smi >/dev/null 2>&1") != 0)
		return;
	f = popen("nvidia-smi --query-compute-apps=pid,process_name,used_memory "
		  "--format=csv,noheader 2>&1",
		  "r");
	if (!f)
		return;
	printf("\n    nvidia-smi compute apps %s (kvpoold is pid %d here):\n", when, (int)g_d.pid);
	while (fgets(line, sizeof(line), f))
		printf("      %s", line);
	pclose(f);
}

static int daemon_fds(void)
{
	char path[64];
	struct dirent *de;
	int n = 0;
	DIR *d;

	snprintf(path, sizeof(path), "/proc/%d/fd", (int)g_d.pid);
	d = opendir(path);
	if (!d)
		return -1;
	while ((de = readdir(d)))
		n += de->d_name[0] != '.';
	closedir(d);
	return n;
}

/* VmRSS of the daemon in KiB, -1 when unreadable. */
static long daemon_rss_kib(void)
{
	char path[64], line[128];
	long kib = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)g_d.pid);
	f = fopen(path, "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmRSS: %ld kB", &kib) == 1)
			break;
	fclose(f);
	return kib;
}

static const struct kvp_tier_status *tier(const struct kvp_status *st, int t)
{
	return &st->pools[0].tiers[t];
}

/* Waits up to ms for the daemon to hold `sessions` sessions and no lease or lock in any tier. */
static bool reclaimed(uint32_t sessions, int ms, struct kvp_status *st)
{
	uint64_t end = h_now_ms() + (uint64_t)ms;
	struct kvp_error e;

	do {
		bool clean = kvp_client_status(g_obs, st, &e) == 0 && st->n_pools == 1 &&
			     st->sessions == sessions;

		for (int t = 0; clean && t < KVP_TIER_MAX; t++)
			clean = tier(st, t)->leased_tokens == 0 &&
				tier(st, t)->protected_tokens == 0;
		if (clean)
			return true;
		usleep(20000);
	} while (h_now_ms() < end);
	return false;
}

static struct kvp_pool *attach(const char *name, struct kvp_client **c)
{
	struct kvp_error e;
	struct kvp_pool *p;

	*c = kvp_client_connect(g_d.sock, name, &e);
	p = *c ? kvp_pool_attach(*c, "g", NULL, &e) : NULL;
	if (!p)
		fprintf(stderr, "%s: %s\n", name, e.message);
	if (p && (kvp_pool_tier_backend(p, KVP_TIER_DEVICE) != KVP_BACKEND_CUDA ||
		  !kvp_pool_tier_base(p, KVP_TIER_DEVICE) || kvp_pool_row_bytes(p) != ROW)) {
		fprintf(stderr, "%s: the device tier is not a mapped cuda tier\n", name);
		return NULL;
	}
	return p;
}

/* Every row of `page` in (layer, kv) of the device tier set to the byte fill(cycle, l, kv). */
static int fill_page(struct kvp_pool *p, uint32_t page, uint32_t cycle)
{
	for (uint32_t l = 0; l < LAYERS; l++)
		for (uint32_t kv = 0; kv < 2; kv++)
			if (cudaMemset(kvp_pool_slot_addr(p, KVP_TIER_DEVICE, l, kv, page, 0),
				       fill(cycle, l, kv), (size_t)PT * ROW) != cudaSuccess)
				return -1;
	return 0;
}

struct engine {
	uint32_t cycle;
	int ready; /* write end: one byte when everything is held */
};

/* Child: attach (imports the device memory), lease, write, publish, lock, lease more, queue
 * GPU work that keeps running, say ready and wait to be killed. */
static int engine(void *arg)
{
	const struct engine *en = arg;
	struct kvp_client *c;
	struct kvp_pool *p = attach("gpu-engine", &c);
	struct kvp_error e;
	struct kvp_match_result m = { .struct_size = sizeof(m) };
	uint32_t tok[CACHED_PAGES * PT], pages[CACHED_PAGES], held[HELD_PAGES], dev[CACHED_PAGES];
	uint32_t host[CACHED_PAGES];
	uint64_t lease, fresh, held_lease;
	cudaStream_t s;
	char one = 1;

	if (!p)
		return 10;
	if (kvp_lease_alloc(p, KVP_TIER_DEVICE, CACHED_PAGES, &lease, pages, &e) < 0)
		return 11;
	for (uint32_t i = 0; i < CACHED_PAGES; i++)
		if (fill_page(p, pages[i], en->cycle) < 0)
			return 12;
	if (cudaDeviceSynchronize() != cudaSuccess)
		return 12;
	tokens_of(en->cycle, tok);
	if (kvp_cache_insert(p, lease, 0, tok, CACHED_PAGES * PT, 0, pages, CACHED_PAGES, &fresh,
			     &e) < 0 ||
	    fresh != CACHED_PAGES * PT)
		return 13;
	if (kvp_cache_match(p, 0, tok, CACHED_PAGES * PT, 1, &m, dev, host, CACHED_PAGES, &e) < 0 ||
	    m.n_device != CACHED_PAGES || !m.lock_id)
		return 14;
	if (kvp_lease_alloc(p, KVP_TIER_DEVICE, HELD_PAGES, &held_lease, held, &e) < 0 ||
	    kvp_lease_alloc(p, KVP_TIER_HOST, HELD_PAGES, &held_lease, held, &e) < 0)
		return 15;
	/* GPU work still queued when the kill comes: memsets of the held device pages */
	if (kvp_lease_alloc(p, KVP_TIER_DEVICE, 1, &held_lease, held, &e) < 0 ||
	    cudaStreamCreate(&s) != cudaSuccess)
		return 16;
	for (int i = 0; i < 2000; i++)
		if (cudaMemsetAsync(kvp_pool_slot_addr(p, KVP_TIER_DEVICE, i % LAYERS, 0, held[0],
						       0),
				    i & 0xff, (size_t)PT * ROW, s) != cudaSuccess)
			return 17;
	if (write(en->ready, &one, 1) != 1)
		return 18;
	for (;;)
		pause();
}

static bool wait_ready(int fd, int ms)
{
	struct pollfd pf = { .fd = fd, .events = POLLIN };
	char b;

	return poll(&pf, 1, ms) == 1 && read(fd, &b, 1) == 1;
}

static void test_reclaim_sigkill_cycles(void)
{
	struct kvp_status st = { .struct_size = sizeof(st) };
	struct kvp_error e;
	uint64_t gpu0 = 0, gpu1 = 0;
	long rss0 = -1, rss1 = -1;
	int fds0 = -1, fds1 = -1;
	CU_ASSERT_FATAL(kvp_client_status(g_obs, &st, &e) == 0);
	g_sessions = st.sessions;
	CU_ASSERT_EQUAL(tier(&st, KVP_TIER_DEVICE)->backend, KVP_BACKEND_CUDA);
	CU_ASSERT_EQUAL(tier(&st, KVP_TIER_DEVICE)->total_tokens, DEV_TOKENS);
	log_nvidia_smi("before the cycles");
	for (uint32_t cycle = 0; cycle < CYCLES; cycle++) {
		struct engine en = { .cycle = cycle };
		int p[2], rc;
		pid_t pid;
		uint64_t ev = 0;

		CU_ASSERT_FATAL(pipe(p) == 0);
		en.ready = p[1];
		fflush(stdout);
		pid = fork();
		if (pid == 0)
			_exit(engine(&en));
		CU_ASSERT_FATAL(pid > 0);
		close(p[1]);
		if (!wait_ready(p[0], 60000)) {
			rc = h_wait_pid(pid, 1);
			printf("\n    cycle %u: the engine did not get ready (exit %d)\n", cycle,
			       rc);
			CU_FAIL_FATAL("engine not ready");
		}
		close(p[0]);
		CU_ASSERT_FATAL(kvp_client_status(g_obs, &st, &e) == 0);
		CU_ASSERT_EQUAL(st.sessions, g_sessions + 1);
		CU_ASSERT_EQUAL(tier(&st, KVP_TIER_DEVICE)->leased_tokens, (HELD_PAGES + 1) * PT);
		CU_ASSERT_EQUAL(tier(&st, KVP_TIER_HOST)->leased_tokens, HELD_PAGES * PT);
		CU_ASSERT_EQUAL(tier(&st, KVP_TIER_DEVICE)->protected_tokens, CACHED_PAGES * PT);
		kill(pid, SIGKILL);
		CU_ASSERT_EQUAL(h_wait_pid(pid, 10000), 128 + SIGKILL);
		if (!reclaimed(g_sessions, 10000, &st)) {
			printf("\n    cycle %u: not reclaimed: sessions %u, device leased %llu "
			       "protected %llu, host leased %llu\n",
			       cycle, st.sessions,
			       (unsigned long long)tier(&st, KVP_TIER_DEVICE)->leased_tokens,
			       (unsigned long long)tier(&st, KVP_TIER_DEVICE)->protected_tokens,
			       (unsigned long long)tier(&st, KVP_TIER_HOST)->leased_tokens);
			CU_FAIL_FATAL("the dead engine's leases and lock were not reclaimed");
		}
		for (int t = 0; t < KVP_TIER_MAX; t++)
			CU_ASSERT_EQUAL(tier(&st, t)->free_tokens + tier(&st, t)->cached_tokens,
					tier(&st, t)->total_tokens);
		CU_ASSERT_EQUAL(tier(&st, KVP_TIER_DEVICE)->cached_tokens +
					tier(&st, KVP_TIER_HOST)->cached_tokens,
				(uint64_t)(cycle + 1) * CACHED_PAGES * PT);
		/* every other cycle the daemon demotes a prefix through its CUDA kernels */
		if (cycle % 2 == 0) {
			CU_ASSERT(kvp_admin_evict(g_obs, "g", KVP_TIER_DEVICE, CACHED_PAGES * PT,
						  &ev, &e) == 0);
			CU_ASSERT_EQUAL(ev, CACHED_PAGES * PT);
			g_demoted += ev;
		}
		if (cycle == 0) { /* after the first import and demotion: the baseline */
			fds0 = daemon_fds();
			rss0 = daemon_rss_kib();
			gpu0 = gpu_free();
		}
	}
	fds1 = daemon_fds();
	rss1 = daemon_rss_kib();
	/* the driver may still be tearing down the last killed engine's context: give it 5 s */
	for (int i = 0; i < 10; i++) {
		gpu1 = gpu_free();
		if (gpu1 + GPU_SLACK >= gpu0)
			break;
		usleep(500000);
	}
	log_nvidia_smi("after the cycles");
	printf("\n    %d cycles: kvpoold fds %d -> %d, VmRSS %ld -> %ld KiB, GPU free %.1f -> %.1f "
	       "MiB, %llu tokens demoted\n",
	       CYCLES, fds0, fds1, rss0, rss1, (double)gpu0 / (1 << 20), (double)gpu1 / (1 << 20),
	       (unsigned long long)g_demoted);
	CU_ASSERT(fds0 > 0);
	CU_ASSERT_EQUAL(fds1, fds0);
	CU_ASSERT(rss0 > 0 && rss1 > 0);
	CU_ASSERT(rss1 <= rss0 + 4096); /* 4 MiB of slack for the allocator's pools */
	CU_ASSERT(gpu0 > 0 && gpu1 > 0);
	CU_ASSERT(gpu1 + GPU_SLACK >= gpu0); /* one leaked tier or engine context is far more */
	CU_ASSERT(g_demoted >= (CYCLES / 2) * CACHED_PAGES * PT);
	CU_ASSERT(!h_log_contains(&g_d, "do not balance"));
}

/* Child: every cycle's prefix matches whole, with its bytes in whichever tier holds each page. */
static int check_prefixes(void *arg)
{
	struct kvp_client *c;
	struct kvp_pool *p = attach("gpu-checker", &c);
	uint32_t tok[CACHED_PAGES * PT], dev[CACHED_PAGES], host[CACHED_PAGES];
	uint64_t host_pages = 0;
	int out = *(int *)arg;
	uint8_t buf[ROW];
	struct kvp_error e;
	struct kvp_match_result m = { .struct_size = sizeof(m) };

	if (!p)
		return 40;
	for (uint32_t cycle = 0; cycle < CYCLES; cycle++) {
		tokens_of(cycle, tok);
		if (kvp_cache_match(p, 0, tok, CACHED_PAGES * PT, 1, &m, dev, host, CACHED_PAGES,
				    &e) < 0 ||
		    m.matched_tokens != CACHED_PAGES * PT ||
		    m.n_device + m.n_host != CACHED_PAGES) {
			printf("cycle %u's prefix: matched %llu tokens\n", cycle,
			       (unsigned long long)m.matched_tokens);
			return 41;
		}
		host_pages += m.n_host;
		for (uint32_t i = 0; i < CACHED_PAGES; i++) {
			int t = i < m.n_device ? KVP_TIER_DEVICE : KVP_TIER_HOST;
			uint32_t page = i < m.n_device ? dev[i] : host[i - m.n_device];

			for (uint32_t l = 0; l < LAYERS; l++)
				for (uint32_t kv = 0; kv < 2; kv++)
					for (uint32_t r = 0; r < PT; r++) {
						const uint8_t *row =
							kvp_pool_slot_addr(p, t, l, kv, page, r);

						if (!row)
							return 42;
						if (t == KVP_TIER_DEVICE) {
							if (cudaMemcpy(buf, row, ROW,
								       cudaMemcpyDeviceToHost) !=
							    cudaSuccess)
								return 43;
							row = buf;
						}
						for (uint32_t b = 0; b < ROW; b++)
							if (row[b] != fill(cycle, l, kv)) {
								printf("cycle %u page %u (%s) "
								       "layer %u kv %u row %u: "
								       "wrong bytes\n",
								       cycle, i, kvp_tier_name(t),
								       l, kv, r);
								return 44;
							}
					}
		}
		if (kvp_cache_release(p, m.lock_id, &e) < 0)
			return 45;
	}
	kvp_client_close(c);
	return write(out, &host_pages, sizeof(host_pages)) == sizeof(host_pages) ? 0 : 46;
}

/* Child: after a flush, one lease takes every device page, and its last page reads back. */
static int lease_all(void *arg)
{
	struct kvp_client *c;
	struct kvp_pool *p = attach("gpu-lease-all", &c);
	uint32_t n = p ? kvp_pool_tier_pages(p, KVP_TIER_DEVICE) : 0, *pages;
	uint8_t buf[ROW];
	struct kvp_error e;
	uint64_t lease;

	(void)arg;
	if (!p || n != DEV_TOKENS / PT)
		return 50;
	pages = calloc(n, sizeof(*pages));
	if (!pages || kvp_lease_alloc(p, KVP_TIER_DEVICE, n, &lease, pages, &e) < 0) {
		printf("lease of all %u device pages: %s\n", n, e.message);
		return 51;
	}
	if (fill_page(p, pages[n - 1], 3) < 0 || cudaDeviceSynchronize() != cudaSuccess ||
	    cudaMemcpy(buf, kvp_pool_slot_addr(p, KVP_TIER_DEVICE, 1, 1, pages[n - 1], PT - 1), ROW,
		       cudaMemcpyDeviceToHost) != cudaSuccess)
		return 52;
	for (uint32_t b = 0; b < ROW; b++)
		if (buf[b] != fill(3, 1, 1))
			return 53;
	free(pages);
	kvp_client_close(c);
	return 0;
}

static void test_reclaim_keeps_prefixes_and_capacity(void)
{
	struct kvp_status st = { .struct_size = sizeof(st) };
	struct kvp_error e;
	uint64_t host_pages = 0, ev = 0;
	int p[2];

	/* the checker's count of host pages comes back through a pipe */
	CU_ASSERT_FATAL(pipe(p) == 0);
	CU_ASSERT_EQUAL(run_child(check_prefixes, &p[1]), 0);
	close(p[1]);
	CU_ASSERT(read(p[0], &host_pages, sizeof(host_pages)) == sizeof(host_pages));
	close(p[0]);
	/* each demoted page is host-only now, none was promoted back */
	CU_ASSERT_EQUAL(host_pages * PT, g_demoted);
	CU_ASSERT(reclaimed(g_sessions, 5000, &st));
	CU_ASSERT(kvp_admin_flush(g_obs, "g", &ev, &e) == 0);
	CU_ASSERT_EQUAL(ev, (uint64_t)CYCLES * CACHED_PAGES * PT);
	CU_ASSERT_FATAL(kvp_client_status(g_obs, &st, &e) == 0);
	CU_ASSERT_EQUAL(tier(&st, KVP_TIER_DEVICE)->free_tokens, DEV_TOKENS);
	CU_ASSERT_EQUAL(run_child(lease_all, NULL), 0);
	CU_ASSERT(reclaimed(g_sessions, 5000, &st));
	CU_ASSERT_EQUAL(tier(&st, KVP_TIER_DEVICE)->free_tokens, DEV_TOKENS);
}

static int suite_init(void)
{
	struct kvp_error e;

	if (h_daemon_start(&g_d, g_conf, NULL) < 0) {
		fprintf(stderr, "kvpoold did not start: see %s\n", g_d.log);
		return -1;
	}
	g_obs = kvp_client_connect(g_d.sock, "gpu-observer", &e);
	if (!g_obs)
		return -1;
	kvp_client_set_timeout(g_obs, 10000);
	return 0;
}

static int suite_clean(void)
{
	kvp_client_close(g_obs);
	return h_daemon_finish(&g_d);
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_reclaim_sigkill_cycles),
		H_TEST(test_reclaim_keeps_prefixes_and_capacity),
	};
	int r = run_child(probe, NULL);

	if (r)
		return r;
	return H_RUN_SUITE("cuda_reclaim", suite_init, suite_clean, tests);
}
