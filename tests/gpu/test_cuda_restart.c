/* test_cuda_restart.c - a cuda pool across kvpoold restarts, with tests/lib/fdsup.c playing
 * systemd's fd store:
 *  - the device tier's exported fd goes to the store at a clean stop and the next kvpoold
 *    adopts it: a device page an engine wrote and published before the restart is matched on
 *    the device tier after it, same page id, same bytes (read back with cudaMemcpy);
 *  - SIGTERM to a kvpoold with a cuda pool exits 0 once it serves (the CUDA driver's threads,
 *    started before the loop blocks the signal, hand it on to the loop), and ends it, by the
 *    signal or cleanly, at any point of the start-up.
 * Exits 77 with the reason on machines without a GPU. The parent never touches CUDA, so its
 * children may. */
#include <cuda_runtime_api.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cuda_drv.h"
#include "fdsup.h"
#include "gpu_child.h"
#include "harness.h"
#include "kvpool.h"

#define CONF_POOL                                                                                  \
	"[pool.g]\n"                                                                               \
	"layers = 2\nkv_heads = 2\nhead_dim = 64\ndtype = fp16\n"                                  \
	"page_tokens = 16\ndevice = cuda:0\ndevice_capacity = 4096t\n"                             \
	"host_capacity = 4096t\nmlock = off\n"
static const char *const g_conf = "[daemon]\nresume_grace_ms = 5000\n" CONF_POOL;

#define LAYERS 2
#define PAGE_TOKENS 16
#define ROW 256 /* kv_heads * head_dim * fp16 */
#define TOK0 700

static struct h_fdsup g_s;
static int g_pipe[2];

static uint8_t pattern(uint32_t l, uint32_t kv, uint32_t t, uint32_t i)
{
	uint32_t x = ((l * 2 + kv) * PAGE_TOKENS + t) * ROW + i + 0x5a;

	return (uint8_t)((x * 2654435761u) >> 24);
}

static struct kvp_pool *attach(const char *name, struct kvp_client **c)
{
	struct kvp_error e;
	struct kvp_pool *p;

	*c = kvp_client_connect(g_s.sock, name, &e);
	p = *c ? kvp_pool_attach(*c, "g", NULL, &e) : NULL;
	if (!p)
		fprintf(stderr, "%s: %s\n", name, e.message);
	return p;
}

/* Writes the pattern into a leased device page, publishes it as tokens TOK0.., sends its id. */
static int writer(void)
{
	struct kvp_error e;
	struct kvp_client *c;
	struct kvp_pool *p = attach("gpu-restart-writer", &c);
	uint8_t buf[ROW];
	uint64_t lease, fresh;
	uint32_t page, tok[PAGE_TOKENS];

	if (!p)
		return 10;
	if (kvp_pool_tier_backend(p, KVP_TIER_DEVICE) != KVP_BACKEND_CUDA ||
	    kvp_pool_row_bytes(p) != ROW)
		return 11;
	if (kvp_lease_alloc(p, KVP_TIER_DEVICE, 1, &lease, &page, &e) < 0)
		return 12;
	for (uint32_t l = 0; l < LAYERS; l++)
		for (uint32_t kv = 0; kv < 2; kv++)
			for (uint32_t t = 0; t < PAGE_TOKENS; t++) {
				void *row = kvp_pool_slot_addr(p, KVP_TIER_DEVICE, l, kv, page, t);

				for (uint32_t i = 0; i < ROW; i++)
					buf[i] = pattern(l, kv, t, i);
				if (cudaMemcpy(row, buf, ROW, cudaMemcpyHostToDevice) !=
				    cudaSuccess)
					return 13;
			}
	if (cudaDeviceSynchronize() != cudaSuccess)
		return 13;
	for (uint32_t t = 0; t < PAGE_TOKENS; t++)
		tok[t] = TOK0 + t;
	if (kvp_cache_insert(p, lease, 0, tok, PAGE_TOKENS, 0, &page, 1, &fresh, &e) < 0 ||
	    fresh != PAGE_TOKENS)
		return 14;
	if (write(g_pipe[1], &page, sizeof(page)) != sizeof(page))
		return 15;
	kvp_client_close(c);
	return 0;
}

/* After the restart: the prefix is a device hit on the same page with the same bytes. */
static int reader(void)
{
	struct kvp_error e;
	struct kvp_client *c;
	struct kvp_pool *p = attach("gpu-restart-reader", &c);
	struct kvp_match_result m = { .struct_size = sizeof(m) };
	uint32_t page, tok[PAGE_TOKENS], dev[2], host[2];
	uint8_t buf[ROW];

	if (!p)
		return 20;
	if (read(g_pipe[0], &page, sizeof(page)) != sizeof(page))
		return 21;
	for (uint32_t t = 0; t < PAGE_TOKENS; t++)
		tok[t] = TOK0 + t;
	if (kvp_cache_match(p, 0, tok, PAGE_TOKENS, 0, &m, dev, host, 2, &e) < 0) {
		fprintf(stderr, "reader: match: %s\n", e.message);
		return 22;
	}
	if (m.matched_tokens != PAGE_TOKENS || m.n_device != 1 || dev[0] != page) {
		fprintf(stderr, "reader: matched %lu tokens, %u device pages (page %u, wrote %u)\n",
			(unsigned long)m.matched_tokens, m.n_device, m.n_device ? dev[0] : 0, page);
		return 23;
	}
	for (uint32_t l = 0; l < LAYERS; l++)
		for (uint32_t kv = 0; kv < 2; kv++)
			for (uint32_t t = 0; t < PAGE_TOKENS; t++) {
				const void *row =
					kvp_pool_slot_addr(p, KVP_TIER_DEVICE, l, kv, page, t);

				if (!row || cudaMemcpy(buf, row, ROW, cudaMemcpyDeviceToHost) !=
						    cudaSuccess)
					return 24;
				for (uint32_t i = 0; i < ROW; i++)
					if (buf[i] != pattern(l, kv, t, i)) {
						fprintf(stderr,
							"reader: layer %u %c token %u byte %u differs\n",
							l, kv ? 'V' : 'K', t, i);
						return 25;
					}
			}
	kvp_client_close(c);
	return 0;
}

/* 1: the device tier's fd through the fd store. 0 or a failure code. */
static int device_fd_through_store(void)
{
	pid_t pid;
	int r, st;

	if (h_fdsup_init(&g_s) < 0 || h_fdsup_config(&g_s, g_conf) < 0 || pipe(g_pipe) < 0)
		return 1;
	g_s.start_ms = 60000; /* the CUDA driver's first start may take long */
	pid = h_fdsup_start(&g_s);
	if (pid < 0) {
		fprintf(stderr, "kvpoold did not start: see %s\n", g_s.log);
		return 2;
	}
	r = h_gpu_run_child(writer);
	if (r) {
		h_fdsup_stop(&g_s, pid, SIGTERM);
		return r;
	}
	st = h_fdsup_stop(&g_s, pid, SIGTERM);
	if (st != 0) {
		fprintf(stderr, "kvpoold with a cuda pool: SIGTERM gave exit %d, not 0\n", st);
		return 3;
	}
	if (h_fdsup_fd(&g_s, "kvp.g.device") < 0 || h_fdsup_fd(&g_s, "kvp.g.meta") < 0) {
		fprintf(stderr, "the store holds no kvp.g.device or kvp.g.meta fd\n");
		return 4;
	}
	pid = h_fdsup_start(&g_s);
	if (pid < 0) {
		fprintf(stderr, "kvpoold did not restart: see %s\n", g_s.log);
		return 5;
	}
	if (h_fdsup_log_count(&g_s, "adopted from the fd store: 1 cached pages kept") != 1 ||
	    h_fdsup_log_count(&g_s, "cannot be adopted") != 0) {
		fprintf(stderr, "pool g was not adopted with its cached page: see %s\n", g_s.log);
		h_fdsup_stop(&g_s, pid, SIGTERM);
		return 6;
	}
	r = h_gpu_run_child(reader);
	st = h_fdsup_stop(&g_s, pid, SIGTERM);
	if (!r && st != 0)
		r = 7;
	printf("cuda tier through the fd store: %s (%d)\n", r ? "FAILED" : "ok", r);
	close(g_pipe[0]);
	close(g_pipe[1]);
	if (!r)
		h_fdsup_fini(&g_s);
	else
		fprintf(stderr, "kept %s\n", g_s.dir); /* its log says why */
	return r;
}

/* kvpoold with g_conf on sock, stderr to log: its pid, or -1. */
static pid_t spawn(const char *dir, char *sock, size_t len)
{
	char cfg[256], log[256];
	pid_t pid;

	snprintf(cfg, sizeof(cfg), "%s/kvpoold.conf", dir);
	snprintf(log, sizeof(log), "%s/log", dir);
	snprintf(sock, len, "%s/s.sock", dir);
	unlink(sock);
	if (h_write_file(cfg, CONF_POOL) < 0)
		return -1;
	pid = fork();
	if (pid == 0) {
		int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);

		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		unsetenv("NOTIFY_SOCKET");
		unsetenv("LISTEN_FDS");
		execl(h_kvpoold(), "kvpoold", "--config", cfg, "--socket", sock, (char *)NULL);
		_exit(127);
	}
	return pid;
}

/* Its exit status (128 + signal), or -1 when it is not gone within ms (then killed). */
static int wait_gone(pid_t pid, int ms)
{
	uint64_t end = h_now_ms() + (uint64_t)ms;
	int st;

	while (h_now_ms() < end) {
		if (waitpid(pid, &st, WNOHANG) == pid)
			return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
		usleep(5000);
	}
	kill(pid, SIGKILL);
	waitpid(pid, &st, 0);
	return -1;
}

/* 2: SIGTERM to a kvpoold with a cuda pool. Serving: exit 0, five times. During the start-up
 * (0 to 2 s after exec, while the driver starts its threads): it ends, 0 or by SIGTERM, within
 * 15 s. 0 or a failure code. */
static int sigterm_exits_0(void)
{
	static const int early_ms[] = { 0, 20, 100, 300, 1000, 2000 };
	char dir[] = "/tmp/kvpool-test-cuda-term-XXXXXX", sock[300];
	int bad = 0;

	if (!mkdtemp(dir))
		return 1;
	for (int i = 0; i < 5; i++) {
		pid_t pid = spawn(dir, sock, sizeof(sock));
		int st;

		if (pid < 0 || h_wait_accepting(sock, &pid, 60000) < 0) {
			fprintf(stderr, "kvpoold did not start: see %s/log\n", dir);
			if (pid > 0)
				wait_gone(pid, 0);
			return 2;
		}
		usleep((useconds_t)(i * 50000)); /* 0 to 200 ms into serving */
		kill(pid, SIGTERM);
		st = wait_gone(pid, 15000);
		printf("SIGTERM %d ms after serving: exit %d\n", i * 50, st);
		bad |= st != 0;
	}
	for (size_t i = 0; i < sizeof(early_ms) / sizeof(early_ms[0]); i++) {
		pid_t pid = spawn(dir, sock, sizeof(sock));
		int st;

		if (pid < 0)
			return 3;
		usleep((useconds_t)early_ms[i] * 1000);
		kill(pid, SIGTERM);
		st = wait_gone(pid, 15000);
		printf("SIGTERM %d ms after exec: exit %d\n", early_ms[i], st);
		bad |= st != 0 && st != 128 + SIGTERM;
	}
	printf("SIGTERM with a cuda pool: %s\n", bad ? "FAILED" : "ok");
	if (bad)
		fprintf(stderr, "kept %s\n", dir);
	else
		h_dir_remove(dir);
	return bad ? 8 : 0;
}

int main(void)
{
	int r = h_gpu_run_child(h_gpu_probe), r2;

	signal(SIGPIPE, SIG_IGN);
	if (r)
		return r;
	r = device_fd_through_store();
	r2 = sigterm_exits_0();
	printf("cuda restart: 2 cases, %d passed, %d failed\n", !r + !r2, !!r + !!r2);
	return r || r2 ? 1 : 0;
}
