/* bench_copy.c - page transfer throughput: demotion (kvp_copy_dev_to_host_cpu) and promotion
 * (kvp_copy_host_to_dev_cpu) of the CPU kernels against memcpy of the same bytes between the same
 * buffers (page-contiguous, the same shuffled page ids) in the same run. With CUDA built and a
 * GPU present, also kv_copy.cu against one cudaMemcpyAsync of the same bytes; otherwise those
 * rows say "skipped: no GPU" with a null ratio. */
#include <errno.h>

#include "bench.h"
#include "kv_copy.h"
#include "kvp_config.h"

#if KVP_HAVE_CUDA
#include <ctype.h>
#include <cuda_runtime_api.h>

#include "kv_copy_cuda.h"
#endif

#define LAYERS 32
#define PT 16
#define ROW 256
#define BATCH 256

static void shuffle_ids(uint32_t *v, uint32_t n, unsigned *seed)
{
	for (uint32_t i = 0; i < n; i++)
		v[i] = i;
	for (uint32_t i = n - 1; i > 0; i--) {
		uint32_t j = (uint32_t)rand_r(seed) % (i + 1), t = v[i];

		v[i] = v[j];
		v[j] = t;
	}
}

static const char *params(uint32_t pages, int reps, const char *impl)
{
	return b_fmt(
		"{\"layers\":%u,\"page_tokens\":%u,\"row_bytes\":%u,\"page_bytes\":%u,"
		"\"batch_pages\":%u,\"tier_pages\":%u,\"page_ids\":\"shuffled\",\"best_of\":%d,"
		"\"impl\":\"%s\",\"stream_min_bytes\":%llu}",
		LAYERS, PT, ROW, LAYERS * 2 * PT * ROW, BATCH, pages, reps, impl,
		(unsigned long long)KVP_COPY_STREAM_DEFAULT);
}

static void cuda_rows(int quick, uint32_t pages);

int main(int argc, char **argv)
{
	int quick = b_quick(argc, argv);
	uint32_t pages = quick ? 512 : 2048;
	int reps = quick ? 3 : 15;
	struct kvp_copy_geom g = { .layers = LAYERS,
				   .page_tokens = PT,
				   .row_bytes = ROW,
				   .dev_slots = (uint64_t)pages * PT,
				   .host_pages = pages };
	uint64_t pb = kvp_host_page_bytes(&g), bytes = pb * BATCH;
	uint8_t *dev = malloc(pb * pages), *host = malloc(pb * pages);
	uint32_t *dp = malloc(sizeof(uint32_t) * pages), *hp = malloc(sizeof(uint32_t) * pages);
	double best[4] = { 0 }; /* demote, memcpy d->h, promote, memcpy h->d: bytes/s */
	unsigned seed = 4242;

	if (!dev || !host || !dp || !hp)
		B_DIE("out of memory");
	memset(dev, 1, pb * pages);
	memset(host, 2, pb * pages);
	for (int r = 0; r < reps; r++) {
		uint64_t t0, t1;

		/* new shuffled ids every repetition: a batch of BATCH pages out of `pages` */
		shuffle_ids(dp, pages, &seed);
		shuffle_ids(hp, pages, &seed);
		for (int k = 0; k < 4; k++) {
			t0 = b_now_ns();
			switch (k) {
			case 0:
				if (kvp_copy_dev_to_host_cpu(&g, dev, host, dp, hp, BATCH) < 0)
					B_DIE("kvp_copy_dev_to_host_cpu failed");
				break;
			case 1:
				for (uint32_t i = 0; i < BATCH; i++)
					memcpy(host + hp[i] * pb, dev + dp[i] * pb, pb);
				break;
			case 2:
				if (kvp_copy_host_to_dev_cpu(&g, host, dev, hp, dp, BATCH) < 0)
					B_DIE("kvp_copy_host_to_dev_cpu failed");
				break;
			case 3:
				for (uint32_t i = 0; i < BATCH; i++)
					memcpy(dev + dp[i] * pb, host + hp[i] * pb, pb);
				break;
			}
			b_use(dev);
			b_use(host);
			t1 = b_now_ns();
			if ((double)bytes / ((double)(t1 - t0) / 1e9) > best[k])
				best[k] = (double)bytes / ((double)(t1 - t0) / 1e9);
		}
	}
	b_row_print(&(struct b_row){
		.name = "copy.demote.cpu",
		.params = params(pages, reps, "kvp_copy_dev_to_host_cpu"),
		.baseline_what = "memcpy of the same bytes, page-contiguous, same page ids (GB/s)",
		.baseline = best[1] / 1e9,
		.have_base = 1,
		.value = best[0] / 1e9,
		.have_value = 1,
		.unit = "GB/s",
		.target = "ratio >= 0.70" });
	b_row_print(&(struct b_row){
		.name = "copy.promote.cpu",
		.params = params(pages, reps, "kvp_copy_host_to_dev_cpu"),
		.baseline_what = "memcpy of the same bytes, page-contiguous, same page ids (GB/s)",
		.baseline = best[3] / 1e9,
		.have_base = 1,
		.value = best[2] / 1e9,
		.have_value = 1,
		.unit = "GB/s",
		.target = "ratio >= 0.70" });
	free(dev);
	free(host);
	free(dp);
	free(hp);
	cuda_rows(quick, pages);
	return 0;
}

#define CUDA_TARGET "ratio >= 1.00"
#define PCIE_WHAT "the PCIe link's limit per direction, as the card reports it in sysfs (GB/s)"

static void skipped(const char *why)
{
	const char *names[2] = { "copy.demote.cuda", "copy.promote.cuda" };
	const char *pcie[2] = { "copy.demote.cuda_vs_pcie", "copy.promote.cuda_vs_pcie" };

	for (int i = 0; i < 2; i++) {
		b_row_print(&(struct b_row){ .name = names[i],
					     .params = params(0, 0, "kv_copy.cu"),
					     .baseline_what =
						     "cudaMemcpyAsync of the same bytes (GB/s)",
					     .unit = "GB/s",
					     .target = CUDA_TARGET,
					     .note = why });
		b_row_print(&(struct b_row){ .name = pcie[i],
					     .params = params(0, 0, "kv_copy.cu"),
					     .baseline_what = PCIE_WHAT,
					     .unit = "GB/s",
					     .target = "none (the link's ceiling)",
					     .note = why });
	}
}

#if !KVP_HAVE_CUDA
static void cuda_rows(int quick, uint32_t pages)
{
	(void)quick;
	(void)pages;
	skipped("skipped: no GPU (built without CUDA)");
}
#else
/* The PCIe limit of the device's link, per direction, in GB/s: the negotiated speed and width
 * the card reports (/sys/bus/pci/devices/BUS/current_link_{speed,width}) times the line code's
 * efficiency (8b/10b up to 5 GT/s, 128b/130b up to 32 GT/s, FLIT 242/256 beyond). Returns 0 and
 * describes the link in what, or -1 when the link is not reported (some VMs). */
static int pcie_limit(int dev, double *gbs, char *what, size_t n)
{
	char bus[32], path[128], buf[64];
	double gts, eff;
	unsigned width;
	FILE *f;

	if (cudaDeviceGetPCIBusId(bus, sizeof(bus), dev) != cudaSuccess)
		return -1;
	for (char *c = bus; *c; c++)
		*c = (char)tolower((unsigned char)*c);
	snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/current_link_speed", bus);
	f = fopen(path, "r");
	if (!f || !fgets(buf, sizeof(buf), f) || sscanf(buf, "%lf", &gts) != 1 || gts <= 0) {
		if (f)
			fclose(f);
		return -1;
	}
	fclose(f);
	snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/current_link_width", bus);
	f = fopen(path, "r");
	if (!f || fscanf(f, "%u", &width) != 1 || !width) {
		if (f)
			fclose(f);
		return -1;
	}
	fclose(f);
	eff = gts <= 5.0 ? 0.8 : gts <= 32.0 ? 128.0 / 130.0 : 242.0 / 256.0;
	*gbs = gts * width * eff / 8.0;
	snprintf(what, n, "%s: %.1f GT/s x%u", bus, gts, width);
	return 0;
}

static void cuda_rows(int quick, uint32_t pages)
{
	struct kvp_copy_geom g = { .layers = LAYERS,
				   .page_tokens = PT,
				   .row_bytes = ROW,
				   .dev_slots = (uint64_t)pages * PT,
				   .host_pages = pages };
	uint64_t pb = kvp_host_page_bytes(&g), bytes = pb * BATCH;
	struct kvp_copy_cuda *cc = NULL;
	void *dev = NULL, *host = NULL, *host_d = NULL;
	uint32_t *dp = malloc(sizeof(uint32_t) * pages), *hp = malloc(sizeof(uint32_t) * pages);
	double best[4] = { 0 };
	int reps = quick ? 3 : 15, rc;
	unsigned seed = 99;
	cudaStream_t s;
	char why[200];

	rc = kvp_copy_cuda_new(0, &cc);
	if (rc == -ENODEV) {
		skipped("skipped: no GPU");
		free(dp);
		free(hp);
		return;
	}
	if (rc < 0)
		B_DIE("kvp_copy_cuda_new: %d", rc);
	if (cudaMalloc(&dev, pb * pages) != cudaSuccess ||
	    cudaHostAlloc(&host, pb * pages, cudaHostAllocMapped) != cudaSuccess ||
	    cudaHostGetDevicePointer(&host_d, host, 0) != cudaSuccess ||
	    cudaStreamCreate(&s) != cudaSuccess) {
		snprintf(why, sizeof(why), "skipped: CUDA allocation failed: %s",
			 cudaGetErrorString(cudaGetLastError()));
		skipped(why);
		cudaFree(dev);
		cudaFreeHost(host);
		kvp_copy_cuda_free(cc);
		free(dp);
		free(hp);
		return;
	}
	cudaMemset(dev, 1, pb * pages);
	memset(host, 2, pb * pages);
	cudaDeviceSynchronize();
	for (int r = 0; r < reps; r++) {
		shuffle_ids(dp, pages, &seed);
		shuffle_ids(hp, pages, &seed);
		for (int k = 0; k < 4; k++) {
			uint64_t t0 = b_now_ns(), t1;

			switch (k) {
			case 0:
				if (kvp_copy_dev_to_host_cuda(cc, &g, dev, host_d, dp, hp, BATCH) <
					    0 ||
				    kvp_copy_cuda_sync(cc) < 0)
					B_DIE("cuda demote: %s", kvp_copy_cuda_error(cc));
				break;
			case 1:
				cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, s);
				cudaStreamSynchronize(s);
				break;
			case 2:
				if (kvp_copy_host_to_dev_cuda(cc, &g, host_d, dev, hp, dp, BATCH) <
					    0 ||
				    kvp_copy_cuda_sync(cc) < 0)
					B_DIE("cuda promote: %s", kvp_copy_cuda_error(cc));
				break;
			case 3:
				cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, s);
				cudaStreamSynchronize(s);
				break;
			}
			t1 = b_now_ns();
			if (r > 0 && (double)bytes / ((double)(t1 - t0) / 1e9) > best[k])
				best[k] = (double)bytes / ((double)(t1 - t0) / 1e9);
		}
	}
	b_row_print(&(struct b_row){
		.name = "copy.demote.cuda",
		.params = params(pages, reps - 1, "kv_copy.cu"),
		.baseline_what = "one cudaMemcpyAsync DtoH of the same bytes to pinned host (GB/s)",
		.baseline = best[1] / 1e9,
		.have_base = 1,
		.value = best[0] / 1e9,
		.have_value = 1,
		.unit = "GB/s",
		.target = CUDA_TARGET });
	b_row_print(&(struct b_row){
		.name = "copy.promote.cuda",
		.params = params(pages, reps - 1, "kv_copy.cu"),
		.baseline_what =
			"one cudaMemcpyAsync HtoD of the same bytes from pinned host (GB/s)",
		.baseline = best[3] / 1e9,
		.have_base = 1,
		.value = best[2] / 1e9,
		.have_value = 1,
		.unit = "GB/s",
		.target = CUDA_TARGET });
	{
		double limit = 0;
		char link[96];
		int have = pcie_limit(0, &limit, link, sizeof(link)) == 0;

		for (int k = 0; k < 2; k++)
			b_row_print(&(struct b_row){
				.name = k ? "copy.promote.cuda_vs_pcie"
					  : "copy.demote.cuda_vs_pcie",
				.params = params(pages, reps - 1, "kv_copy.cu"),
				.baseline_what = PCIE_WHAT,
				.baseline = limit,
				.have_base = have,
				.value = best[k ? 2 : 0] / 1e9,
				.have_value = 1,
				.unit = "GB/s",
				.target = "none (the link's ceiling)",
				.note = have ? b_fmt("link %s", link)
					     : "PCIe link not reported in sysfs" });
	}
	cudaStreamDestroy(s);
	cudaFree(dev);
	cudaFreeHost(host);
	kvp_copy_cuda_free(cc);
	free(dp);
	free(hp);
}
#endif
