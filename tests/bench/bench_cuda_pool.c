/* bench_cuda_pool.c - lease and prefix calls on a cuda pool against the same calls on a sim pool
 * of the same geometry, in one kvpoold this program starts, from one client process attached to
 * both: Alloc(1 page) + Free round trips, and Match(1024 cached tokens, lock) + Release round
 * trips, calls/s. The daemon's bookkeeping is the same for both backends, so the ratio shows
 * what the cuda backend costs on the lease path (nothing, if all is well). Windows alternate
 * between the pools so that noise falls on both; best window of each. Without CUDA built or
 * without a GPU the rows say "skipped" with a null ratio. The parent never touches CUDA: the
 * measuring client is a forked child. */
#include <errno.h>
#include <sys/wait.h>

#include "bench_net.h"
#include "kvp_config.h"
#include "kvpool.h"

#if KVP_HAVE_CUDA
#include "cuda_drv.h"
#endif

#define PT 16
#define PREFIX_PAGES 64
#define POOL_FMT                                                                                   \
	"[pool.%s]\nlayers = 4\nkv_heads = 2\nhead_dim = 64\ndtype = fp16\npage_tokens = 16\n"     \
	"device = %s\ndevice_capacity = 16384t\nhost_capacity = 4096t\nmlock = off\n"
#define TARGET "ratio >= 0.90"

static const char *const g_names[2] = { "pool.alloc_free.cuda", "pool.match_release.cuda" };
static const char *const g_what[2] = {
	"the same Alloc(1 page) + Free pairs on a sim pool of the same geometry (pairs/s)",
	"the same Match(1024 tokens, lock) + Release pairs on a sim pool of the same geometry "
	"(pairs/s)"
};

static const char *params(int reps, double window)
{
	return b_fmt("{\"layers\":4,\"kv_heads\":2,\"head_dim\":64,\"dtype\":\"fp16\","
		     "\"page_tokens\":%d,\"device_tokens\":16384,\"prefix_tokens\":%d,"
		     "\"best_of\":%d,\"window_s\":%.2f,\"client\":\"one process, one connection\"}",
		     PT, PREFIX_PAGES * PT, reps, window);
}

static void skipped(const char *why)
{
	for (int i = 0; i < 2; i++)
		b_row_print(&(struct b_row){ .name = g_names[i],
					     .params = params(0, 0),
					     .baseline_what = g_what[i],
					     .unit = "pairs/s",
					     .target = TARGET,
					     .note = why });
}

#if !KVP_HAVE_CUDA
int main(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	skipped("skipped: no GPU (built without CUDA)");
	return 0;
}
#else
struct run {
	const char *sock;
	int quick;
	int out; /* pipe: the four best rates (alloc sim, alloc cuda, match sim, match cuda) */
};

/* Pairs/s of kind k (0 alloc + free, 1 match + release) on p over `secs`; < 0 on a failed call. */
static double window(struct kvp_pool *p, int k, const uint32_t *tok, double secs)
{
	double t0 = b_now_s(), t;
	struct kvp_error e;
	uint64_t n = 0, lease;
	uint32_t page, dev[PREFIX_PAGES], host[PREFIX_PAGES];
	struct kvp_match_result m = { .struct_size = sizeof(m) };

	do {
		for (int i = 0; i < 64; i++, n++) {
			if (k == 0) {
				if (kvp_lease_alloc(p, KVP_TIER_DEVICE, 1, &lease, &page, &e) < 0 ||
				    kvp_lease_free(p, lease, NULL, 0, &e) < 0)
					return -1;
			} else if (kvp_cache_match(p, 0, tok, PREFIX_PAGES * PT, 1, &m, dev, host,
						   PREFIX_PAGES, &e) < 0 ||
				   m.n_device != PREFIX_PAGES ||
				   kvp_cache_release(p, m.lock_id, &e) < 0) {
				return -1;
			}
		}
		t = b_now_s();
	} while (t - t0 < secs);
	return (double)n / (t - t0);
}

static int client(void *arg)
{
	const struct run *r = arg;
	const char *names[2] = { "sim", "cuda" };
	struct kvp_pool *p[2];
	struct kvp_client *c;
	struct kvp_error e;
	uint32_t tok[PREFIX_PAGES * PT], pages[PREFIX_PAGES];
	double best[4] = { 0 }, secs = r->quick ? 0.2 : 1.0;
	int reps = r->quick ? 2 : 5;
	uint64_t lease, fresh;

	c = kvp_client_connect(r->sock, "bench-cuda-pool", &e);
	if (!c) {
		fprintf(stderr, "connect: %s\n", e.message);
		return 1;
	}
	for (uint32_t t = 0; t < PREFIX_PAGES * PT; t++)
		tok[t] = 7000 + t;
	for (int i = 0; i < 2; i++) {
		p[i] = kvp_pool_attach(c, names[i], NULL, &e);
		if (!p[i]) {
			fprintf(stderr, "attach %s: %s\n", names[i], e.message);
			return 2;
		}
		/* the bytes do not matter to the daemon: publish the pages as they are */
		if (kvp_lease_alloc(p[i], KVP_TIER_DEVICE, PREFIX_PAGES, &lease, pages, &e) < 0 ||
		    kvp_cache_insert(p[i], lease, 0, tok, PREFIX_PAGES * PT, 0, pages, PREFIX_PAGES,
				     &fresh, &e) < 0) {
			fprintf(stderr, "insert %s: %s\n", names[i], e.message);
			return 3;
		}
	}
	if (kvp_pool_tier_backend(p[1], KVP_TIER_DEVICE) != KVP_BACKEND_CUDA ||
	    kvp_pool_tier_backend(p[0], KVP_TIER_DEVICE) != KVP_BACKEND_SIM)
		return 4;
	window(p[0], 0, tok, secs / 4); /* warm-up */
	window(p[1], 0, tok, secs / 4);
	for (int rep = 0; rep < reps; rep++)
		for (int k = 0; k < 2; k++)
			for (int i = 0; i < 2; i++) {
				double v = window(p[i], k, tok, secs);

				if (v < 0) {
					fprintf(stderr, "%s %s: %s\n", names[i],
						k ? "match" : "alloc", e.message);
					return 5;
				}
				if (v > best[k * 2 + i])
					best[k * 2 + i] = v;
			}
	if (write(r->out, best, sizeof(best)) != sizeof(best))
		return 6;
	kvp_client_close(c);
	return 0;
}

static int probe(void *arg)
{
	char why[200];
	int n = kvp_cuda_probe(why, sizeof(why));

	(void)arg;
	if (n < 1)
		fprintf(stderr, "kvp_cuda_probe: %d: %s\n", n, why);

	return n >= 1 ? 0 : n == -ENODEV || n == -ENOTSUP ? 77 : 1;
}

int main(int argc, char **argv)
{
	static struct daemon d;
	static char conf[1024];
	struct run r = { .quick = b_quick(argc, argv) };
	double best[4];
	int p[2], rc;

	rc = h_in_child(probe, NULL);
	if (rc == 77) {
		skipped("skipped: no GPU");
		return 0;
	}
	if (rc != 0)
		B_DIE("kvp_cuda_probe failed in a child (exit %d): a GPU is there but unusable",
		      rc);
	snprintf(conf, sizeof(conf), POOL_FMT POOL_FMT, "sim", "sim", "cuda", "cuda:0");
	bn_daemon_start(&d, conf);
	if (pipe(p) < 0)
		B_DIE("pipe: %s", strerror(errno));
	r.sock = d.sock;
	r.out = p[1];
	rc = h_in_child(client, &r);
	close(p[1]);
	if (rc != 0 || read(p[0], best, sizeof(best)) != sizeof(best))
		B_DIE("the measuring client failed (exit %d); daemon log %s", rc, d.log);
	close(p[0]);
	for (int k = 0; k < 2; k++)
		b_row_print(&(struct b_row){ .name = g_names[k],
					     .params = params(r.quick ? 2 : 5, r.quick ? 0.2 : 1.0),
					     .baseline_what = g_what[k],
					     .baseline = best[k * 2],
					     .have_base = 1,
					     .value = best[k * 2 + 1],
					     .have_value = 1,
					     .unit = "pairs/s",
					     .target = TARGET });
	return 0;
}
#endif
