/* test_cuda_pool.c - two processes share a cuda pool through kvpoold: the device tier's memory
 * travels as a POSIX fd (SCM_RIGHTS), one process writes K/V bytes into a leased page with
 * cudaMemcpy, the other reads them back; a demotion and promotion through the daemon's CUDA
 * kernels keep them. Exits 77 with the reason on machines without a GPU. The parent never
 * touches CUDA, so its children may. */
#include <cuda_runtime_api.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "kvpool.h"
#include "tier_cuda.h"

static const char *const g_conf = "[pool.g]\n"
				  "layers = 2\nkv_heads = 2\nhead_dim = 64\ndtype = fp16\n"
				  "page_tokens = 16\ndevice = cuda:0\ndevice_capacity = 4096t\n"
				  "host_capacity = 4096t\nmlock = off\n";
static struct daemon g_d;
static int g_pipe[2];

static int run_child(int (*fn)(void))
{
	pid_t pid = fork();
	int st;

	if (pid == 0)
		_exit(fn());
	waitpid(pid, &st, 0);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static int probe(void)
{
	char why[256] = "";
	int n = kvp_cuda_probe(why, sizeof(why));

	if (n < 1) {
		printf("SKIP: no usable GPU: %s\n", why);
		return 77;
	}
	return 0;
}

static uint8_t pattern(uint32_t i)
{
	return (uint8_t)(i * 13 + 7);
}

static int writer(void)
{
	struct kvp_error e;
	struct kvp_client *c = kvp_client_connect(g_d.sock, "gpu-writer", &e);
	struct kvp_pool *p = c ? kvp_pool_attach(c, "g", NULL, &e) : NULL;
	uint8_t buf[256];
	uint64_t lease, fresh;
	uint32_t page, tok[16];

	if (!p) {
		fprintf(stderr, "writer: %s\n", e.message);
		return 10;
	}
	if (kvp_pool_tier_backend(p, KVP_TIER_DEVICE) != KVP_BACKEND_CUDA ||
	    !kvp_pool_tier_base(p, KVP_TIER_DEVICE))
		return 11;
	if (kvp_alloc(p, KVP_TIER_DEVICE, 1, &lease, &page, &e) < 0)
		return 12;
	for (uint32_t t = 0; t < 16; t++) {
		for (uint32_t i = 0; i < sizeof(buf); i++)
			buf[i] = pattern(t * 256 + i);
		if (cudaMemcpy(kvp_slot_addr(p, KVP_TIER_DEVICE, 1, 1, page, t), buf, sizeof(buf),
			       cudaMemcpyHostToDevice) != cudaSuccess)
			return 13;
		tok[t] = 500 + t;
	}
	if (kvp_insert(p, lease, 0, tok, 16, 0, &page, 1, &fresh, &e) < 0 || fresh != 16)
		return 14;
	if (write(g_pipe[1], &page, sizeof(page)) != sizeof(page))
		return 15;
	kvp_client_close(c);
	return 0;
}

static int check_page(struct kvp_pool *p, uint32_t page)
{
	uint8_t buf[256];

	for (uint32_t t = 0; t < 16; t++) {
		if (cudaMemcpy(buf, kvp_slot_addr(p, KVP_TIER_DEVICE, 1, 1, page, t), sizeof(buf),
			       cudaMemcpyDeviceToHost) != cudaSuccess)
			return -1;
		for (uint32_t i = 0; i < sizeof(buf); i++)
			if (buf[i] != pattern(t * 256 + i))
				return -1;
	}
	return 0;
}

static int reader(void)
{
	struct kvp_error e;
	struct kvp_client *c = kvp_client_connect(g_d.sock, "gpu-reader", &e);
	struct kvp_pool *p = c ? kvp_pool_attach(c, "g", NULL, &e) : NULL;
	struct kvp_match m;
	uint32_t page, tok[16], dev[2], host[2], loaded[2];
	uint64_t ev;

	if (!p)
		return 20;
	if (read(g_pipe[0], &page, sizeof(page)) != sizeof(page))
		return 21;
	for (uint32_t t = 0; t < 16; t++)
		tok[t] = 500 + t;
	if (kvp_match(p, 0, tok, 16, 0, &m, dev, host, 2, &e) < 0 || m.n_device != 1 ||
	    dev[0] != page)
		return 22;
	if (check_page(p, page) < 0)
		return 23;
	/* Demote through the CUDA kernels, then promote back. */
	if (kvp_evict(c, "g", KVP_TIER_DEVICE, 16, &ev, &e) < 0 || ev != 16)
		return 24;
	if (kvp_match(p, 0, tok, 16, 1, &m, dev, host, 2, &e) < 0 || m.n_host != 1)
		return 25;
	if (kvp_load(p, m.lock_id, loaded, 2, &e) != 1 || check_page(p, loaded[0]) < 0)
		return 26;
	kvp_client_close(c);
	return 0;
}

int main(void)
{
	int r = run_child(probe);

	signal(SIGPIPE, SIG_IGN);
	if (r)
		return r;
	if (h_daemon_start(&g_d, g_conf, NULL) < 0) {
		fprintf(stderr, "kvpoold did not start: see %s\n", g_d.log);
		return 1;
	}
	if (pipe(g_pipe) < 0)
		return 1;
	r = run_child(writer);
	if (r == 0)
		r = run_child(reader);
	printf("cuda pool shared across processes: %s (%d)\n", r ? "FAILED" : "ok", r);
	if (h_daemon_stop(&g_d) != 0)
		r = r ? r : 2;
	h_daemon_cleanup(&g_d);
	return r ? 1 : 0;
}
