/* test_cuda_pool.c - two processes share a cuda pool through kvpoold: the device tier's memory
 * travels as a POSIX fd (SCM_RIGHTS), one process writes K/V bytes (every layer, K and V) into a
 * leased page with cudaMemcpy, the other reads them back; a demotion through the daemon's CUDA
 * kernels puts them in the host page, and a promotion brings them back after the old device page
 * was cleared; an Alloc of the whole device tier demotes it again off the loop thread (a CUDA
 * event waited for on the daemon's worker). Exits 77 with the reason on machines without a GPU. The
 * parent never touches CUDA, so its children may. */
#include <cuda_runtime_api.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpu_child.h"
#include "harness.h"
#include "kvpool.h"
#include "cuda_drv.h"

static const char *const g_conf = "[pool.g]\n"
				  "layers = 2\nkv_heads = 2\nhead_dim = 64\ndtype = fp16\n"
				  "page_tokens = 16\ndevice = cuda:0\ndevice_capacity = 4096t\n"
				  "host_capacity = 4096t\nmlock = off\n";
static struct daemon g_d;
static int g_pipe[2];

#define LAYERS 2
#define PAGE_TOKENS 16
#define ROW 256 /* kv_heads * head_dim * fp16 */

/* Byte i of token t of layer l, K or V: differs between rows, so a row copied to the wrong place
 * shows. */
static uint8_t pattern(uint32_t l, uint32_t kv, uint32_t t, uint32_t i)
{
	uint32_t x = ((l * 2 + kv) * PAGE_TOKENS + t) * ROW + i;

	return (uint8_t)((x * 2654435761u) >> 24);
}

static int writer(void)
{
	struct kvp_error e;
	struct kvp_client *c = kvp_client_connect(g_d.sock, "gpu-writer", &e);
	struct kvp_pool *p = c ? kvp_pool_attach(c, "g", NULL, &e) : NULL;
	uint8_t buf[ROW];
	uint64_t lease, fresh;
	uint32_t page, tok[PAGE_TOKENS];

	if (!p) {
		fprintf(stderr, "writer: %s\n", e.message);
		return 10;
	}
	if (kvp_pool_tier_backend(p, KVP_TIER_DEVICE) != KVP_BACKEND_CUDA ||
	    !kvp_pool_tier_base(p, KVP_TIER_DEVICE) || kvp_pool_row_bytes(p) != ROW ||
	    kvp_pool_tier_cuda_device(p, KVP_TIER_DEVICE) != 0 ||
	    kvp_pool_tier_cuda_device(p, KVP_TIER_HOST) != -1)
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
	/* from pageable memory cudaMemcpy may return before the bytes reach the device */
	if (cudaDeviceSynchronize() != cudaSuccess)
		return 13;
	for (uint32_t t = 0; t < PAGE_TOKENS; t++)
		tok[t] = 500 + t;
	if (kvp_cache_insert(p, lease, 0, tok, PAGE_TOKENS, 0, &page, 1, &fresh, &e) < 0 ||
	    fresh != PAGE_TOKENS)
		return 14;
	if (write(g_pipe[1], &page, sizeof(page)) != sizeof(page))
		return 15;
	kvp_client_close(c);
	return 0;
}

/* Every row of page `page` of `tier` holds the writer's pattern (device rows read with
 * cudaMemcpy, host rows straight from the shared mapping). */
static int check_page(struct kvp_pool *p, int tier, uint32_t page)
{
	uint8_t buf[ROW];

	for (uint32_t l = 0; l < LAYERS; l++)
		for (uint32_t kv = 0; kv < 2; kv++)
			for (uint32_t t = 0; t < PAGE_TOKENS; t++) {
				const uint8_t *row = kvp_pool_slot_addr(p, tier, l, kv, page, t);

				if (!row)
					return -1;
				if (tier == KVP_TIER_DEVICE) {
					if (cudaMemcpy(buf, row, ROW, cudaMemcpyDeviceToHost) !=
					    cudaSuccess)
						return -1;
					row = buf;
				}
				for (uint32_t i = 0; i < ROW; i++)
					if (row[i] != pattern(l, kv, t, i))
						return -1;
			}
	return 0;
}

/* Zero every row of device page `page`, so only a real copy can bring the pattern back. */
static int clear_page(struct kvp_pool *p, uint32_t page)
{
	for (uint32_t l = 0; l < LAYERS; l++)
		for (uint32_t kv = 0; kv < 2; kv++)
			if (cudaMemset(kvp_pool_slot_addr(p, KVP_TIER_DEVICE, l, kv, page, 0), 0,
				       (size_t)PAGE_TOKENS * ROW) != cudaSuccess)
				return -1;
	return cudaDeviceSynchronize() == cudaSuccess ? 0 : -1;
}

static int reader(void)
{
	struct kvp_error e;
	struct kvp_client *c = kvp_client_connect(g_d.sock, "gpu-reader", &e);
	struct kvp_pool *p = c ? kvp_pool_attach(c, "g", NULL, &e) : NULL;
	struct kvp_match_result m = { .struct_size = sizeof(m) };
	uint32_t page, tok[PAGE_TOKENS], dev[2], host[2], loaded[2];
	uint64_t ev;

	if (!p)
		return 20;
	if (read(g_pipe[0], &page, sizeof(page)) != sizeof(page))
		return 21;
	for (uint32_t t = 0; t < PAGE_TOKENS; t++)
		tok[t] = 500 + t;
	if (kvp_cache_match(p, 0, tok, PAGE_TOKENS, 0, &m, dev, host, 2, &e) < 0 ||
	    m.n_device != 1 || dev[0] != page)
		return 22;
	if (check_page(p, KVP_TIER_DEVICE, page) < 0)
		return 23;
	/* Demote through the CUDA kernels: the bytes are in the host page. */
	if (kvp_admin_evict(c, "g", KVP_TIER_DEVICE, PAGE_TOKENS, &ev, &e) < 0 || ev != PAGE_TOKENS)
		return 24;
	if (kvp_cache_match(p, 0, tok, PAGE_TOKENS, 1, &m, dev, host, 2, &e) < 0 || m.n_host != 1)
		return 25;
	if (check_page(p, KVP_TIER_HOST, host[0]) < 0)
		return 27;
	/* The freed device page may be the one the promotion gets: clear it first. */
	if (clear_page(p, page) < 0)
		return 28;
	if (kvp_cache_load(p, m.lock_id, loaded, 2, &e) != 1 ||
	    check_page(p, KVP_TIER_DEVICE, loaded[0]) < 0)
		return 26;
	kvp_client_close(c);
	return 0;
}

/* An Alloc of the whole device tier needs the cached page (promoted by reader) demoted: through
 * the cuda backend's copy_start, whose CUDA event the daemon's worker waits for; the Alloc is
 * answered once it landed, and the bytes are in the host page. */
static int whole_tier(void)
{
	struct kvp_error e;
	struct kvp_client *c = kvp_client_connect(g_d.sock, "gpu-whole", &e);
	struct kvp_pool *p = c ? kvp_pool_attach(c, "g", NULL, &e) : NULL;
	struct kvp_status st = { .struct_size = sizeof(st) };
	struct kvp_match_result m = { .struct_size = sizeof(m) };
	uint32_t tok[PAGE_TOKENS], dev[2], host[2], n, *pages;
	uint64_t lease;

	if (!p || kvp_client_status(c, &st, &e) < 0)
		return 40;
	n = (uint32_t)(st.pools[0].tiers[KVP_TIER_DEVICE].total_tokens / PAGE_TOKENS);
	pages = malloc(n * sizeof(*pages));
	if (!pages || kvp_lease_alloc(p, KVP_TIER_DEVICE, n, &lease, pages, &e) < 0)
		return 41;
	free(pages);
	if (kvp_lease_free(p, lease, NULL, 0, &e) < 0)
		return 42;
	for (uint32_t t = 0; t < PAGE_TOKENS; t++)
		tok[t] = 500 + t;
	if (kvp_cache_match(p, 0, tok, PAGE_TOKENS, 0, &m, dev, host, 2, &e) < 0 ||
	    m.n_device != 0 || m.n_host != 1)
		return 43;
	if (check_page(p, KVP_TIER_HOST, host[0]) < 0)
		return 44;
	kvp_client_close(c);
	return 0;
}

/* An engine that does not see the pool's GPU (CUDA_VISIBLE_DEVICES hides it) is told so. */
static int blind(void)
{
	struct kvp_error e;
	struct kvp_client *c;
	struct kvp_pool *p;

	setenv("CUDA_VISIBLE_DEVICES", "", 1); /* before this process's first CUDA call */
	c = kvp_client_connect(g_d.sock, "gpu-blind", &e);
	if (!c)
		return 30;
	p = kvp_pool_attach(c, "g", NULL, &e);
	if (p || e.code != KVP_E_MAP) {
		fprintf(stderr, "blind attach: %s\n", p ? "mapped" : e.message);
		return 31;
	}
	printf("attach without the GPU visible: %s\n", e.message);
	kvp_client_close(c);
	return 0;
}

int main(void)
{
	int r = h_gpu_run_child(h_gpu_probe);

	signal(SIGPIPE, SIG_IGN);
	if (r)
		return r;
	if (h_daemon_start(&g_d, g_conf, NULL) < 0) {
		fprintf(stderr, "kvpoold did not start: see %s\n", g_d.log);
		return 1;
	}
	if (pipe(g_pipe) < 0)
		return 1;
	r = h_gpu_run_child(writer);
	if (r == 0)
		r = h_gpu_run_child(reader);
	if (r == 0)
		r = h_gpu_run_child(whole_tier);
	if (r == 0)
		r = h_gpu_run_child(blind);
	printf("cuda pool shared across processes: %s (%d)\n", r ? "FAILED" : "ok", r);
	if (h_daemon_stop(&g_d) != 0)
		r = r ? r : 2;
	h_daemon_cleanup(&g_d);
	return r ? 1 : 0;
}
