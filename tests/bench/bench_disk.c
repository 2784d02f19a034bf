/* bench_disk.c - the disk tier's figures, all on one file in a directory on a real filesystem
 * (the current directory, or $KVP_BENCH_DISK_DIR):
 *  - disk.spill / disk.load: GB/s of 256 KiB pages evicted from a kvpoold's host tier to the
 *    disk (Allocs of 128 pages evicting cached chains, each once the staging has room) and read
 *    back by Fetch (chains of 128 pages, two engines at once), from the daemon's own counters
 *    (bytes written and read over the time the client saw), against fio --ioengine=io_uring
 * --direct=1 --bs=256k --iodepth=32 (sequential write, then read) on the same file just before;
 *  - disk.reboot_to_first_hit: kvpoold killed (SIGKILL, no fd store), the page cache dropped
 *    (root), started again: seconds from its exec to the first Match that reports a prefix
 *    published before, against the same restart of a pool without a disk tier (first answered
 *    Match); disk.reboot.hit_rate: the pages of the prefixes on disk before that a Match reports
 *    after the restart (goal 1.0; without a disk tier: 0);
 *  - disk.startup_ms: a store written full (KVP_BENCH_DISK_STARTUP_GIB GiB, default 4; --quick
 *    2), kvpoold killed (SIGKILL), the page cache dropped (root), started again: milliseconds
 *    from its exec to its first answered call, the store's map read from its log, against the
 *    same start with the log region zeroed (every slot's header read, 64 at a time);
 *    disk.adopt_ms: the store's open alone in those two starts (disk_adopt_us);
 *  - e2e.disk.hit_rate: a shared-prefix workload (prompts of 8 pages, uniform, a working set 4x
 *    the host tier): pages served from the cache (local, or fetched from the disk) over pages
 *    asked, with the disk tier against without.
 * Rows say skipped without fio. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "bench.h"
#include "eng.h"
#include "harness.h"
#include "kvpool.h"

/* 2 layers x 8 heads x 128 dims fp16, 32 tokens a page: 8 KiB a token, 256 KiB a page. */
#define PT 32
#define PAGE (256u << 10)
#define CHAIN 128 /* pages of one Alloc / one chain */
#define QD 32	  /* the disk's I/O in flight at most: kvpoold's disk_queue_depth and fio's */

static char g_dir[512];

static void config(char *buf, size_t len, uint32_t host_pages, const char *path,
		   uint32_t disk_pages)
{
	int n = snprintf(buf, len,
			 "[pool.p]\nlayers = 2\nkv_heads = 8\nhead_dim = 128\ndtype = fp16\n"
			 "page_tokens = %d\ndevice = none\nhost_capacity = %ut\nmlock = off\n",
			 PT, host_pages * PT);

	if (path)
		snprintf(buf + n, len - (size_t)n,
			 "disk = write-back\ndisk_path = %s\ndisk_capacity = %ut\n"
			 "disk_queue_depth = %d\n",
			 path, disk_pages * PT, QD);
}

static void start(struct daemon *d, struct h_eng *e, const char *cfg)
{
	memset(d, 0, sizeof(*d));
	if (h_daemon_start(d, cfg, NULL) < 0 || h_eng_open(e, d->sock, "bench-disk", "p") < 0)
		B_DIE("kvpoold did not start (%s)", d->log);
}

static void stop(struct daemon *d, struct h_eng *e)
{
	kvp_client_close(e->c);
	if (h_daemon_stop(d) != 0)
		B_DIE("kvpoold did not stop cleanly (%s)", d->log);
	h_daemon_cleanup(d);
}

static void kill9(struct daemon *d, struct h_eng *e)
{
	kvp_client_close(e->c);
	kill(d->pid, SIGKILL);
	h_wait_pid(d->pid, 10000);
	d->pid = 0;
	h_daemon_cleanup(d);
}

static void tokens_of(uint32_t chain, uint32_t npages, uint32_t *t)
{
	for (uint32_t i = 0; i < npages * PT; i++)
		t[i] = (chain << 16) | i;
}

/* Publishes chain c of n pages (its pages' first bytes marked). */
static void publish(struct h_eng *e, uint32_t c, uint32_t n)
{
	uint32_t pages[CHAIN], t[CHAIN * PT];
	uint64_t lease;

	if (kvp_lease_alloc(e->p, KVP_TIER_HOST, n, &lease, pages, NULL) < 0)
		B_DIE("alloc of %u pages failed", n);
	for (uint32_t i = 0; i < n; i++) {
		uint8_t *a = kvp_pool_slot_addr(e->p, KVP_TIER_HOST, 0, 0, pages[i], 0);

		if (a)
			memcpy(a, &c, sizeof(c));
	}
	tokens_of(c, n, t);
	if (kvp_cache_insert(e->p, lease, 0, t, n * PT, 0, pages, n, NULL, NULL) < 0)
		B_DIE("insert failed");
	kvp_lease_free(e->p, lease, NULL, 0, NULL);
}

static void wait_idle(struct h_eng *e)
{
	for (int i = 0; i < 6000 && h_eng_counter(e, "disk_queue_depth") != 0; i++)
		usleep(1000);
}

/* Waits until the disk tier has room for the next publish's evictions in its staging (252 slots
 * of 260 KiB): the bench measures what reaches the disk, not pages dropped under a backlog. */
static void pace(struct h_eng *e, int64_t max)
{
	while (h_eng_counter(e, "disk_queue_depth") > max)
		usleep(200);
}

/* Pages of chain c (n pages) a Match reports: local and on disk. */
static uint32_t seen(struct h_eng *e, uint32_t c, uint32_t n)
{
	struct kvp_match_result m = { .struct_size = sizeof(m) };
	uint32_t dev[CHAIN], host[CHAIN], t[CHAIN * PT];

	tokens_of(c, n, t);
	if (kvp_cache_match(e->p, 0, t, n * PT, 0, &m, dev, host, n, NULL) < 0)
		B_DIE("match failed");
	return (uint32_t)(m.matched_tokens / PT) + m.remote_pages;
}

/* Fetches chain c (n pages): the pages cached for it now; *fetched those read. */
static uint32_t fetch(struct h_eng *e, uint32_t c, uint32_t n, uint32_t *fetched)
{
	struct kvp_fetch_result f = { .struct_size = sizeof(f) };
	uint32_t dev[CHAIN], host[CHAIN], t[CHAIN * PT];

	tokens_of(c, n, t);
	if (kvp_cache_fetch(e->p, 0, t, n * PT, 0, &f, dev, host, n, NULL) < 0)
		B_DIE("fetch failed");
	if (fetched)
		*fetched = f.fetched_pages;
	return f.n_device + f.n_host;
}

/* fio on path: bytes/s of a sequential run (rw "write" or "read"), -1 without fio. */
static double fio(const char *path, const char *rw, uint64_t bytes)
{
	char cmd[1024], line[4096];
	double bw = -1;
	FILE *f;

	snprintf(cmd, sizeof(cmd),
		 "fio --name=b --filename=%s --ioengine=io_uring --direct=1 --bs=256k "
		 "--iodepth=%d --rw=%s --size=%lu --output-format=json 2>/dev/null",
		 path, QD, rw, (unsigned long)bytes);
	if (!(f = popen(cmd, "r")))
		return -1;
	/* The job's "bw_bytes" of the side that ran (the first nonzero one). */
	while (fgets(line, sizeof(line), f)) {
		char *p = strstr(line, "\"bw_bytes\"");
		double v;

		if (p && bw <= 0 && sscanf(strchr(p, ':') + 1, "%lf", &v) == 1 && v > 0)
			bw = v;
	}
	pclose(f);
	return bw;
}

static int have_fio(void)
{
	return system("command -v fio >/dev/null 2>&1") == 0;
}

/* Fetches chains [first, n) stepping by step on its own connection to d, checking each page's
 * mark under the Fetch's lock: 0, or 1 (an error or a wrong mark). */
static int fetch_stream(const struct daemon *d, uint32_t first, uint32_t n, uint32_t step)
{
	struct kvp_fetch_result f = { .struct_size = sizeof(f) };
	uint32_t dev[CHAIN], host[CHAIN], t[CHAIN * PT];
	struct h_eng e;

	if (h_eng_open(&e, d->sock, "bench-disk-load", "p") < 0)
		return 1;
	for (uint32_t c = first; c < n; c += step) {
		tokens_of(c, CHAIN, t);
		if (kvp_cache_fetch(e.p, 0, t, CHAIN * PT, 1, &f, dev, host, CHAIN, NULL) < 0)
			return 1;
		for (uint32_t i = 0; i < f.n_host; i++) { /* locked: each page its chain's mark */
			uint8_t *a = kvp_pool_slot_addr(e.p, KVP_TIER_HOST, 0, 0, host[i], 0);
			uint32_t mark = UINT32_MAX;

			if (a)
				memcpy(&mark, a, sizeof(mark));
			if (mark != c)
				return 1;
		}
		if (f.lock_id && kvp_cache_release(e.p, f.lock_id, NULL) < 0)
			return 1;
	}
	kvp_client_close(e.c);
	return 0;
}

static void rows_spill_load(int quick, const char *path)
{
	/* Staging holds 252 pages of 260 KiB: an Alloc of 128 goes once 124 are free. */
	uint32_t host = 512, chains = quick ? 12 : 40, disk = chains * CHAIN + 2 * host, spilled;
	uint64_t bytes = (uint64_t)(chains - 4) * CHAIN * PAGE;
	double fio_w, fio_r, t0, tw, tr, wb, rb;
	int64_t w0, r0, dropped, read_pages, inplace, copied;
	char cfg[1024];
	struct daemon d;
	struct h_eng e;
	pid_t kids[2];
	int bad = 0;

	unlink(path);
	/* fio first, on the file kvpoold then takes (its headers are garbage then: free slots). */
	fio_w = fio(path, "write", bytes);
	fio_r = fio(path, "read", bytes);
	config(cfg, sizeof(cfg), host, path, disk);
	start(&d, &e, cfg);
	for (uint32_t c = 0; c < host / CHAIN; c++)
		publish(&e, c, CHAIN);
	w0 = h_eng_counter(&e, "disk_written_bytes");
	t0 = b_now_s();
	for (uint32_t c = host / CHAIN; c < chains; c++) {
		/* Each Alloc evicts a chain of 128 cached pages: it goes once the staging has room
		 * for them, so that the disk always has work and nothing is dropped. */
		pace(&e, 124);
		publish(&e, c, CHAIN);
	}
	wait_idle(&e);
	tw = b_now_s() - t0;
	wb = (double)(h_eng_counter(&e, "disk_written_bytes") - w0);
	dropped = h_eng_counter(&e, "disk_write_dropped");
	inplace = h_eng_counter(&e, "disk_write_inplace");
	copied = h_eng_counter(&e, "disk_write_copied");
	spilled = (uint32_t)(wb / PAGE);
	r0 = h_eng_counter(&e, "disk_read_bytes");
	read_pages = h_eng_counter(&e, "disk_read_pages");
	t0 = b_now_s();
	/* Two engines fetch at once (half the chains each), so that the disk has work while one
	 * of them is between calls. */
	for (int k = 0; k < 2; k++) {
		kids[k] = fork();
		if (kids[k] == 0)
			_exit(fetch_stream(&d, (uint32_t)k, chains - host / CHAIN, 2));
	}
	for (int k = 0; k < 2; k++) {
		int st = 0;

		if (kids[k] < 0 || waitpid(kids[k], &st, 0) < 0 || !WIFEXITED(st) ||
		    WEXITSTATUS(st) != 0)
			bad = 1;
	}
	tr = b_now_s() - t0;
	rb = (double)(h_eng_counter(&e, "disk_read_bytes") - r0);
	read_pages = h_eng_counter(&e, "disk_read_pages") - read_pages;
	if (bad)
		B_DIE("a fetching engine failed (%s)", d.log);
	if (h_eng_counter(&e, "disk_corrupt_pages") != 0)
		B_DIE("pages failed their check (%s)", d.log);
	stop(&d, &e);
	unlink(path);
	b_row_print(&(struct b_row){
		.name = "disk.spill",
		.params = b_fmt(
			"{\"page_bytes\":%u,\"pages\":%u,\"alloc_pages\":%d,\"queue_depth\":%d,"
			"\"fio_iodepth\":%d}",
			PAGE, spilled, CHAIN, QD, QD),
		.baseline_what = "fio --ioengine=io_uring --direct=1 --bs=256k --iodepth=32 "
				 "--rw=write, the same file and bytes",
		.baseline = fio_w / 1e9,
		.have_base = fio_w > 0,
		.value = wb / tw / 1e9,
		.have_value = tw > 0 && wb > 0,
		.unit = "GB/s",
		.target = ">= 0.9",
		.note = b_fmt(
			"kvpoold: Allocs of %d pages evicting as many cached ones (each once the "
			"disk's queue has room), at most %d writes in flight (disk_queue_depth, "
			"fio's iodepth); %ld pages written in place ahead of eviction (one WRITEV "
			"of a 4 KiB header and the host page), %ld copied with their CRC32C into "
			"a staging slot at eviction, %ld dropped",
			CHAIN, QD, (long)inplace, (long)copied, (long)dropped),
	});
	b_row_print(&(struct b_row){
		.name = "disk.load",
		.params =
			b_fmt("{\"page_bytes\":%u,\"pages\":%ld,\"fetch_pages\":%d,\"engines\":2}",
			      PAGE, (long)read_pages, CHAIN),
		.baseline_what = "fio --ioengine=io_uring --direct=1 --bs=256k --iodepth=32 "
				 "--rw=read, the same file and bytes",
		.baseline = fio_r / 1e9,
		.have_base = fio_r > 0,
		.value = rb / tr / 1e9,
		.have_value = tr > 0 && rb > 0,
		.unit = "GB/s",
		.target = ">= 0.9",
		.note = b_fmt("kvpoold: two engines' Fetches of 128-page chains from the disk, "
			      "at most %d reads in flight (disk_queue_depth), each page read with "
			      "O_DIRECT straight into a leased host page (one READV: its header "
			      "into a staging slot, the page in place), checked (header, CRC32C), "
			      "then cached",
			      QD),
	});
}

/* kvpoold killed and started again: seconds to the first hit, and the hit rate of what was
 * published before. path NULL: a pool without a disk tier. */
static void reboot(const char *path, uint32_t chains, double *secs, double *rate)
{
	/* The disk holds every chain, and the host tier's pages too: the write-back writes the
	 * host tier's cold end before eviction takes it. */
	uint32_t host = 64, disk = chains * 8 + 2 * host, hits = 0;
	char cfg[1024];
	struct daemon d;
	struct h_eng e;
	double t0;

	if (path)
		unlink(path);
	config(cfg, sizeof(cfg), host, path, disk);
	start(&d, &e, cfg);
	for (uint32_t c = 0; c < chains; c++) {
		if (path)
			pace(&e, 200);
		publish(&e, 1000 + c, 8);
	}
	if (path) {
		wait_idle(&e);
		for (uint32_t i = 0; i <= host / 8; i++)
			publish(&e, 500000 + i, 8); /* the last ones out too */
		wait_idle(&e);
	}
	kill9(&d, &e);
	h_drop_caches();
	t0 = b_now_s();
	start(&d, &e, cfg);
	while (!seen(&e, 1000, 8) && b_now_s() - t0 < (path ? 30 : 0))
		;
	*secs = b_now_s() - t0;
	for (uint32_t c = 0; c < chains; c++)
		hits += seen(&e, 1000 + c, 8);
	*rate = (double)hits / (chains * 8.0);
	stop(&d, &e);
	if (path)
		unlink(path);
}

static void rows_reboot(int quick, const char *path)
{
	uint32_t chains = quick ? 32 : 256;
	double s_disk, r_disk, s_none, r_none;

	reboot(path, chains, &s_disk, &r_disk);
	reboot(NULL, chains, &s_none, &r_none);
	b_row_print(&(struct b_row){
		.name = "disk.reboot_to_first_hit",
		.params = b_fmt("{\"prefixes\":%u,\"pages_each\":8}", chains),
		.baseline_what = "the same kill -9 and start of a pool without a disk tier: its "
				 "first answered Match (a miss)",
		.baseline = s_none,
		.have_base = 1,
		.value = s_disk,
		.have_value = 1,
		.unit = "s",
		.note = b_fmt(
			"kvpoold exec to the first Match that reports a prefix published "
			"before the SIGKILL, the page cache dropped between (root); every slot's "
			"header read at start, 64 at a time through io_uring; hit rate %.3f",
			r_disk),
	});
	b_row_print(&(struct b_row){
		.name = "disk.reboot.hit_rate",
		.params = b_fmt("{\"prefixes\":%u,\"pages_each\":8}", chains),
		.baseline_what = "the same without a disk tier",
		.baseline = r_none,
		.have_base = 1,
		.value = r_disk,
		.have_value = 1,
		.unit = "fraction",
		.target = "1.0",
		.note = "pages of the prefixes published before the restart that a Match reports "
			"right after it",
	});
}

/* Milliseconds from exec to the first answered call of a kvpoold on cfg, after a page cache
 * drop; *adopted the pages it adopted, *from_log whether from the log, *adopt_ms the time its
 * store's open took (disk_adopt_us). kvpoold is killed. */
static double start_ms(const char *cfg, int64_t *adopted, int64_t *from_log, double *adopt_ms)
{
	struct daemon d;
	struct h_eng e;
	double t0;

	h_drop_caches();
	t0 = b_now_s();
	start(&d, &e, cfg);
	t0 = (b_now_s() - t0) * 1000.0;
	*adopted = h_eng_counter(&e, "disk_adopted_pages");
	*from_log = h_eng_counter(&e, "disk_adopted_from_log");
	*adopt_ms = (double)h_eng_counter(&e, "disk_adopt_us") / 1000.0;
	kill9(&d, &e);
	return t0;
}

static void rows_startup(int quick, const char *path)
{
	const char *env = getenv("KVP_BENCH_DISK_STARTUP_GIB");
	double gib = quick ? 2.0 : env ? atof(env) : 4.0, ms_log, ms_scan, ad_log, ad_scan;
	uint32_t host = 256, pages = (uint32_t)(gib * 1024 * 4); /* 256 KiB pages */
	int64_t a_log, a_scan, f_log, f_scan;
	char cfg[1024];
	struct daemon d;
	struct h_eng e;
	int fd;

	unlink(path);
	config(cfg, sizeof(cfg), host, path, pages);
	start(&d, &e, cfg);
	for (uint32_t c = 0; c < pages / CHAIN + host / CHAIN + 1; c++) {
		pace(&e, 100);
		publish(&e, 3000000 + c, CHAIN);
	}
	wait_idle(&e);
	kill9(&d, &e);
	ms_log = start_ms(cfg, &a_log, &f_log, &ad_log);
	/* The log region (after the slots) zeroed: the next start reads every header. */
	if ((fd = open(path, O_RDWR | O_CLOEXEC)) < 0)
		B_DIE("open %s: %s", path, strerror(errno));
	{
		static uint8_t z[1 << 20];
		off_t end = lseek(fd, 0, SEEK_END);

		for (off_t at = (off_t)pages * (PAGE + 4096); at < end; at += (off_t)sizeof(z))
			if (pwrite(fd, z, sizeof(z), at) < 0)
				B_DIE("zeroing the log: %s", strerror(errno));
		fsync(fd);
		close(fd);
	}
	ms_scan = start_ms(cfg, &a_scan, &f_scan, &ad_scan);
	unlink(path);
	if (f_log != 1 || f_scan != 0 || a_log != a_scan || a_log < (int64_t)pages * 9 / 10)
		B_DIE("startup: adopted %ld from the log (%ld), %ld from the headers (%ld) of %u",
		      (long)a_log, (long)f_log, (long)a_scan, (long)f_scan, pages);
	b_row_print(&(struct b_row){
		.name = "disk.startup_ms",
		.params = b_fmt("{\"store_gib\":%.2f,\"pages\":%u,\"page_bytes\":%u}", gib, pages,
				PAGE),
		.baseline_what = "the same start with the store's log zeroed: every slot's header "
				 "read, 64 at a time through io_uring",
		.baseline = ms_scan,
		.have_base = 1,
		.value = ms_log,
		.have_value = 1,
		.unit = "ms",
		.target = "< 1 (ratio)",
		.note = b_fmt("kvpoold exec to its first answered call after a SIGKILL and a page "
			      "cache drop (root), the store written full; %ld pages adopted both "
			      "ways",
			      (long)a_log),
	});
	b_row_print(&(struct b_row){
		.name = "disk.adopt_ms",
		.params = b_fmt("{\"store_gib\":%.2f,\"pages\":%u,\"page_bytes\":%u}", gib, pages,
				PAGE),
		.baseline_what =
			"the same store's open with its log zeroed (every slot's header read)",
		.baseline = ad_scan,
		.have_base = 1,
		.value = ad_log,
		.have_value = 1,
		.unit = "ms",
		.target = "< 1 (ratio)",
		.note = b_fmt("the store's open in the two starts of disk.startup_ms "
			      "(disk_adopt_us): the map read from the log and its new checkpoint "
			      "built, against every header read; %.0f pages/s from the log, %.0f "
			      "from the headers",
			      ad_log > 0 ? a_log / (ad_log / 1000.0) : 0.0,
			      ad_scan > 0 ? a_scan / (ad_scan / 1000.0) : 0.0),
	});
}

/* A shared-prefix workload: requests for prompts drawn uniformly from `prompts` (8 pages
 * each); a request matches, fetches from the disk what it can, and publishes the rest. */
static double workload(const char *path, uint32_t host, uint32_t prompts, uint32_t reqs)
{
	uint64_t asked = 0, served = 0, x = 88172645463325252ull;
	char cfg[1024];
	struct daemon d;
	struct h_eng e;

	if (path)
		unlink(path);
	config(cfg, sizeof(cfg), host, path, prompts * 8 * 2);
	start(&d, &e, cfg);
	for (uint32_t r = 0; r < reqs; r++) {
		uint32_t c, have;

		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		c = 20000 + (uint32_t)(x % prompts);
		have = fetch(&e, c, 8, NULL);
		asked += 8;
		served += have;
		if (have < 8) { /* the miss computed and published */
			if (path)
				pace(&e, 200);
			publish(&e, c, 8);
		}
	}
	stop(&d, &e);
	if (path)
		unlink(path);
	return (double)served / (double)asked;
}

static void rows_e2e(int quick, const char *path)
{
	uint32_t host = 64, prompts = host * 4 / 8, reqs = quick ? 400 : 4000;
	double with = workload(path, host, prompts, reqs),
	       without = workload(NULL, host, prompts, reqs);

	b_row_print(&(struct b_row){
		.name = "e2e.disk.hit_rate",
		.params =
			b_fmt("{\"host_pages\":%u,\"prompts\":%u,\"pages_each\":8,\"requests\":%u}",
			      host, prompts, reqs),
		.baseline_what = "the same workload without a disk tier",
		.baseline = without,
		.have_base = 1,
		.value = with,
		.have_value = 1,
		.unit = "fraction",
		.target = "> 1 (ratio)",
		.note = "pages served from the cache (host, or fetched from the disk) over pages asked; "
			"prompts drawn uniformly, a working set 4x the host tier",
	});
}

int main(int argc, char **argv)
{
	int quick = b_quick(argc, argv);
	const char *only = b_only(argc, argv), *base = getenv("KVP_BENCH_DISK_DIR");
	char path[600], cwd[400];

	if (!base)
		base = getcwd(cwd, sizeof(cwd)) ? cwd : ".";
	snprintf(g_dir, sizeof(g_dir), "%s/kvp-bench-disk-XXXXXX", base);
	if (!mkdtemp(g_dir))
		B_DIE("mkdtemp in %s: %s", base, strerror(errno));
	snprintf(path, sizeof(path), "%s/bench.disk", g_dir);
	if (b_wanted(only, "disk.spill") || b_wanted(only, "disk.load")) {
		if (have_fio())
			rows_spill_load(quick, path);
		else
			for (int i = 0; i < 2; i++)
				b_row_print(&(struct b_row){ .name = i ? "disk.load" : "disk.spill",
							     .unit = "GB/s",
							     .note = "skipped: no fio" });
	}
	if (b_wanted(only, "disk.reboot"))
		rows_reboot(quick, path);
	if (b_wanted(only, "disk.startup"))
		rows_startup(quick, path);
	if (b_wanted(only, "e2e.disk"))
		rows_e2e(quick, path);
	rmdir(g_dir);
	return 0;
}
