/* test_disk.c - the disk tier against a real kvpoold and real client processes: host pages
 * evicted to a plain file come back through Match and Fetch with every byte checked (token and
 * key calls); a kvpoold killed with SIGKILL (no fd store) and started again, with the page cache
 * dropped between, adopts what the disk holds (from the store's log; from every slot's header
 * when the log is lost); flipped bytes, a truncated file and injected EIO
 * are misses, never wrong bytes, and the engine sees no error. With "devices" (root; 77 with
 * the reason otherwise): an ext4 filesystem made by the test on a loop device, and a loop block
 * device itself, serve as disks; a disk too small stops start-up (exit 3, the limit named); two
 * pools share one filesystem. drop_caches needs root too: without it the page cache stays. */
#include <CUnit/Basic.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "eng.h"
#include "harness.h"

/* 2 layers x 8 heads x 64 dims fp16: rows of 1 KiB, pages of 16 tokens are 64 KiB. */
enum { PT = 16, NP = 8, NTOK = PT * NP, ROW = 1024, HOST_PAGES = 16, DISK_PAGES = 128 };
#define PAGE_BYTES (64u << 10)
#define SLOT_BYTES (4096u + PAGE_BYTES)

static char g_dir[256]; /* where the disk files live: a directory on a real filesystem */

static void tokens_of(uint32_t prompt, uint32_t *t)
{
	for (uint32_t i = 0; i < NTOK; i++)
		t[i] = (prompt << 12) | i;
}

static void keys_of(uint32_t prompt, uint8_t (*raw)[24], struct kvp_page_key *k)
{
	for (uint32_t i = 0; i < NP; i++) {
		memset(raw[i], 0x5a, 24);
		memcpy(raw[i], &prompt, 4);
		memcpy(raw[i] + 4, &i, 4);
		k[i] = (struct kvp_page_key){ raw[i], 24 };
	}
}

/* The config of one pool p on disk_path with disk = mode (extra: more lines for the pool, or
 * ""). */
static void config_mode(char *buf, size_t len, const char *mode, const char *path,
			uint32_t disk_pages, const char *extra)
{
	snprintf(buf, len,
		 "[pool.p]\nlayers = 2\nkv_heads = 8\nhead_dim = 64\ndtype = fp16\n"
		 "page_tokens = %d\ndevice = none\nhost_capacity = %ut\nmlock = off\n"
		 "disk = %s\ndisk_path = %s\ndisk_capacity = %ut\n%s",
		 PT, HOST_PAGES * PT, mode, path, disk_pages * PT, extra);
}

static void config(char *buf, size_t len, const char *path, uint32_t disk_pages, const char *extra)
{
	config_mode(buf, len, "write-back", path, disk_pages, extra);
}

static void start(struct daemon *d, struct h_eng *e, const char *cfg)
{
	memset(d, 0, sizeof(*d));
	CU_ASSERT_EQUAL_FATAL(h_daemon_start(d, cfg, NULL), 0);
	CU_ASSERT_EQUAL_FATAL(h_eng_open(e, d->sock, "disk-test", "p"), 0);
}

static void stop(struct daemon *d, struct h_eng *e)
{
	kvp_client_close(e->c);
	CU_ASSERT_EQUAL(h_daemon_finish(d), 0);
}

/* SIGKILL: no clean stop, no fd store; the next kvpoold starts from the disk alone. */
static void kill9(struct daemon *d, struct h_eng *e)
{
	kvp_client_close(e->c);
	kill(d->pid, SIGKILL);
	CU_ASSERT(h_wait_pid(d->pid, 10000) >= 0);
	d->pid = 0;
	h_daemon_cleanup(d);
}

/* Drops the page cache (root): the next reads come from the disk. */
/* Publishes prompt (keyed: chain prompt in namespace 7) on the host tier with its pattern. */
static int publish(struct h_eng *e, uint32_t prompt, int keyed)
{
	struct kvp_insert_keys_result ir = { .struct_size = sizeof(ir) };
	uint32_t pages[NP], t[NTOK];
	struct kvp_page_key k[NP];
	uint8_t raw[NP][24];
	uint64_t lease;
	int r;

	if ((r = kvp_lease_alloc(e->p, KVP_TIER_HOST, NP, &lease, pages, NULL)) < 0)
		return r;
	if (h_eng_rows(e->p, KVP_TIER_HOST, pages, NTOK, PT, ROW, prompt, 0))
		return -1;
	tokens_of(prompt, t);
	keys_of(prompt, raw, k);
	r = keyed ? kvp_cache_insert_keys(e->p, lease, 7, k, NP, 0, pages, NP, &ir, NULL)
		  : kvp_cache_insert(e->p, lease, 0, t, NTOK, 0, pages, NP, NULL, NULL);
	kvp_lease_free(e->p, lease, NULL, 0, NULL);
	return r;
}

/* Waits up to 10 s until the disk tier wrote at least n pages; the count written. */
static int64_t wait_written(struct h_eng *e, int64_t n)
{
	int64_t w = 0;

	for (int i = 0; i < 1000 && (w = h_eng_counter(e, "disk_written_pages")) < n; i++)
		usleep(10000);
	for (int i = 0; i < 500 && h_eng_counter(e, "disk_queue_depth") != 0; i++)
		usleep(10000);
	return w;
}

/* Waits up to 10 s until counter name reaches n, then for the disk's queue to drain; its
 * value. */
static int64_t wait_counter(struct h_eng *e, const char *name, int64_t n)
{
	int64_t v = 0;

	for (int i = 0; i < 1000 && (v = h_eng_counter(e, name)) < n; i++)
		usleep(10000);
	for (int i = 0; i < 500 && h_eng_counter(e, "disk_queue_depth") != 0; i++)
		usleep(10000);
	return v;
}

/* Pages after the local ones a Match reports (the disk tier's run); -1 on an error. */
static int disk_seen(struct h_eng *e, uint32_t prompt, int keyed)
{
	struct kvp_match_result m = { .struct_size = sizeof(m) };
	struct kvp_match_keys_result mk = { .struct_size = sizeof(mk) };
	uint32_t dev[NP], host[NP], t[NTOK];
	struct kvp_page_key k[NP];
	uint8_t raw[NP][24];

	tokens_of(prompt, t);
	keys_of(prompt, raw, k);
	if (keyed)
		return kvp_cache_match_keys(e->p, 7, k, NP, 0, &mk, dev, host, NP, NULL) < 0
			       ? -1
			       : (int)(mk.matched_keys + mk.remote_pages);
	return kvp_cache_match(e->p, 0, t, NTOK, 0, &m, dev, host, NP, NULL) < 0
		       ? -1
		       : (int)(m.matched_tokens / PT + m.remote_pages);
}

/* Pages the disk tier reports for prompt after the local ones (a Match's remote_pages), -1 on
 * an error. */
static int disk_only(struct h_eng *e, uint32_t prompt, int keyed)
{
	struct kvp_match_result m = { .struct_size = sizeof(m) };
	struct kvp_match_keys_result mk = { .struct_size = sizeof(mk) };
	uint32_t dev[NP], host[NP], t[NTOK];
	struct kvp_page_key k[NP];
	uint8_t raw[NP][24];

	tokens_of(prompt, t);
	keys_of(prompt, raw, k);
	if (keyed)
		return kvp_cache_match_keys(e->p, 7, k, NP, 0, &mk, dev, host, NP, NULL) < 0
			       ? -1
			       : (int)mk.remote_pages;
	return kvp_cache_match(e->p, 0, t, NTOK, 0, &m, dev, host, NP, NULL) < 0
		       ? -1
		       : (int)m.remote_pages;
}

/* Fetches prompt with a lock: the pages cached for it now (local and fetched), -1 on an error;
 * *bad: bytes of those pages that differ from the prompt's pattern. */
static int fetch_checked(struct h_eng *e, uint32_t prompt, int keyed, int *bad)
{
	struct kvp_fetch_result f = { .struct_size = sizeof(f) };
	uint32_t dev[NP], host[NP], t[NTOK];
	struct kvp_page_key k[NP];
	uint8_t raw[NP][24];
	int r;

	tokens_of(prompt, t);
	keys_of(prompt, raw, k);
	r = keyed ? kvp_cache_fetch_keys(e->p, 7, k, NP, 1, &f, dev, host, NP, NULL)
		  : kvp_cache_fetch(e->p, 0, t, NTOK, 1, &f, dev, host, NP, NULL);
	if (r < 0)
		return -1;
	*bad = f.n_device
		       ? 1000
		       : h_eng_rows(e->p, KVP_TIER_HOST, host, f.n_host * PT, PT, ROW, prompt, 1);
	if (f.lock_id)
		CU_ASSERT_EQUAL(kvp_cache_release(e->p, f.lock_id, NULL), 0);
	return (int)f.n_host;
}

/* Publishes prompts [0, 6) (token calls) and [100, 106) (key calls): 96 pages through a host
 * tier of 16, so the first ones of each kind leave it for the disk. */
static void publish_all(struct h_eng *e)
{
	for (uint32_t i = 0; i < 6; i++) {
		CU_ASSERT_EQUAL_FATAL(publish(e, i, 0), 0);
		CU_ASSERT_EQUAL_FATAL(publish(e, 100 + i, 1), 0);
	}
	CU_ASSERT_EQUAL(h_eng_counter(e, "disk_write_dropped"), 0); /* 80 pages fit the staging */
}

/* Every page of the early prompts is on disk (Match says so, with no I/O) and a Fetch brings it
 * back with every byte right. */
static void check_all_back(struct h_eng *e)
{
	int bad = -1;

	for (uint32_t i = 0; i < 3; i++) {
		CU_ASSERT_EQUAL(disk_seen(e, i, 0), NP);
		CU_ASSERT_EQUAL(fetch_checked(e, i, 0, &bad), NP);
		CU_ASSERT_EQUAL(bad, 0);
		CU_ASSERT_EQUAL(disk_seen(e, 100 + i, 1), NP);
		CU_ASSERT_EQUAL(fetch_checked(e, 100 + i, 1, &bad), NP);
		CU_ASSERT_EQUAL(bad, 0);
	}
}

/* Whether `kvpoolctl ARGS` on d's socket prints a line holding s. */
static bool ctl_prints(const struct daemon *d, const char *args, const char *s)
{
	char cmd[512], line[1024];
	bool found = false;
	FILE *f;

	snprintf(cmd, sizeof(cmd), "%s --socket %s %s", h_kvpoolctl(), d->sock, args);
	if (!(f = popen(cmd, "r")))
		return false;
	while (fgets(line, sizeof(line), f))
		found = found || strstr(line, s) != NULL;
	pclose(f);
	return found;
}

static void path_in(char *out, size_t len, const char *dir, const char *name)
{
	snprintf(out, len, "%s/%s", dir, name);
	unlink(out);
}

/* A plain file: spill, Match, Fetch with every byte checked; then kill -9, the page cache
 * dropped, a new kvpoold without the fd store: the same pages are hits, bytes checked. */
static void test_file_round_trip_and_reboot(void)
{
	char path[300], cfg[1024];
	struct daemon d;
	struct h_eng e;

	path_in(path, sizeof(path), g_dir, "p.disk");
	config(cfg, sizeof(cfg), path, DISK_PAGES, "");
	start(&d, &e, cfg);
	publish_all(&e);
	CU_ASSERT(wait_written(&e, 48) >= 48);
	CU_ASSERT_EQUAL(h_eng_counter(&e, "disk_io_errors"), 0);
	check_all_back(&e);
	CU_ASSERT(h_eng_counter(&e, "disk_read_pages") >= 6 * NP);
	CU_ASSERT_EQUAL(h_eng_counter(&e, "disk_corrupt_pages"), 0);
	/* The operator's views: `kvpoolctl cache` and the metrics. */
	CU_ASSERT(ctl_prints(&d, "cache", "disk tier: "));
	CU_ASSERT(ctl_prints(&d, "cache", " of 128 pages"));
	CU_ASSERT(ctl_prints(&d, "metrics", "kvpool_disk_read_pages_total{pool=\"p\"} "));
	CU_ASSERT(ctl_prints(&d, "metrics", "kvpool_disk_write_microseconds_total{pool=\"p\"} "));
	CU_ASSERT(ctl_prints(&d, "metrics", "kvpool_disk_log_bytes{pool=\"p\"} "));
	CU_ASSERT(h_eng_counter(&e, "disk_log_written_bytes") > 0);
	CU_ASSERT_EQUAL(h_eng_counter(&e, "disk_adopted_from_log"), 0); /* a new file */
	kill9(&d, &e);

	/* The next kvpoold reads the log, not the headers. */
	h_drop_caches();
	start(&d, &e, cfg);
	CU_ASSERT(h_eng_counter(&e, "disk_adopted_pages") >= 48);
	CU_ASSERT_EQUAL(h_eng_counter(&e, "disk_adopted_from_log"), 1);
	CU_ASSERT(ctl_prints(&d, "cache", "(1 pools from their log"));
	check_all_back(&e);
	stop(&d, &e);
	unlink(path);
}

/* The log region zeroed while kvpoold is down (lost, or damaged): the next kvpoold reads every
 * slot's header instead, with one log line, adopts the same pages and writes a new log, which
 * the one after it reads. */
static void test_log_lost_falls_back_to_scan(void)
{
	char path[300], cfg[1024];
	struct daemon d;
	struct h_eng e;
	int fd;

	path_in(path, sizeof(path), g_dir, "l.disk");
	config(cfg, sizeof(cfg), path, DISK_PAGES, "");
	start(&d, &e, cfg);
	publish_all(&e);
	CU_ASSERT(wait_written(&e, 48) >= 48);
	stop(&d, &e);
	fd = open(path, O_RDWR | O_CLOEXEC);
	CU_ASSERT_FATAL(fd >= 0);
	{
		static uint8_t z[64 << 10];

		for (off_t at = (off_t)DISK_PAGES * SLOT_BYTES; at < lseek(fd, 0, SEEK_END);
		     at += (off_t)sizeof(z))
			CU_ASSERT(pwrite(fd, z, sizeof(z), at) > 0);
	}
	fsync(fd);
	close(fd);
	h_drop_caches();
	start(&d, &e, cfg);
	CU_ASSERT_EQUAL(h_eng_counter(&e, "disk_adopted_from_log"), 0);
	CU_ASSERT(h_log_contains(&d, "no usable log"));
	CU_ASSERT(h_eng_counter(&e, "disk_adopted_pages") >= 48);
	check_all_back(&e);
	kill9(&d, &e);
	start(&d, &e, cfg);
	CU_ASSERT_EQUAL(h_eng_counter(&e, "disk_adopted_from_log"), 1);
	CU_ASSERT(h_eng_counter(&e, "disk_adopted_pages") >= 48);
	check_all_back(&e);
	stop(&d, &e);
	unlink(path);
}

/* kvpoold killed while its writes are in flight: after the restart every page is its bytes or
 * a miss. */
static void test_kill_during_writes(void)
{
	char path[300], cfg[1024];
	struct daemon d;
	struct h_eng e;
	int bad = -1, got = 0;

	path_in(path, sizeof(path), g_dir, "k.disk");
	config(cfg, sizeof(cfg), path, DISK_PAGES, "");
	start(&d, &e, cfg);
	for (uint32_t i = 0; i < 6; i++) { /* the last Allocs' evictions are still being written */
		CU_ASSERT_EQUAL_FATAL(publish(&e, i, 0), 0);
		CU_ASSERT_EQUAL_FATAL(publish(&e, 100 + i, 1), 0);
	}
	kill9(&d, &e);
	h_drop_caches();
	start(&d, &e, cfg);
	for (uint32_t i = 0; i < 6; i++) {
		int n = fetch_checked(&e, i, 0, &bad);

		CU_ASSERT(n >= 0);
		CU_ASSERT_EQUAL(bad, 0);
		got += n;
		n = fetch_checked(&e, 100 + i, 1, &bad);
		CU_ASSERT(n >= 0);
		CU_ASSERT_EQUAL(bad, 0);
		got += n;
	}
	CU_ASSERT_EQUAL(h_eng_counter(&e, "disk_corrupt_pages"), 0);
	fprintf(stderr, "after kill -9 during writes: %d pages back\n", got);
	stop(&d, &e);
	unlink(path);
}

/* Flips a byte in the page of every other slot, and in the header of one: those pages are
 * misses (counted), the rest come back right. */
static void test_flipped_bytes_are_misses(void)
{
	char path[300], cfg[1024];
	struct daemon d;
	struct h_eng e;
	int bad = -1, got = 0, fd;

	path_in(path, sizeof(path), g_dir, "f.disk");
	config(cfg, sizeof(cfg), path, DISK_PAGES, "");
	start(&d, &e, cfg);
	publish_all(&e);
	CU_ASSERT(wait_written(&e, 48) >= 48);
	stop(&d, &e);

	fd = open(path, O_RDWR | O_CLOEXEC);
	CU_ASSERT_FATAL(fd >= 0);
	for (uint32_t s = 0; s < DISK_PAGES; s += 2) {
		uint8_t b;
		off_t at = (off_t)s * SLOT_BYTES + 4096 + 777 + s;

		CU_ASSERT_EQUAL(pread(fd, &b, 1, at), 1);
		b ^= 0x10;
		CU_ASSERT_EQUAL(pwrite(fd, &b, 1, at), 1);
	}
	{
		uint8_t b = 0;
		off_t at = (off_t)1 * SLOT_BYTES + 60; /* slot 1's header: its namespace */

		CU_ASSERT_EQUAL(pread(fd, &b, 1, at), 1);
		b ^= 0x01;
		CU_ASSERT_EQUAL(pwrite(fd, &b, 1, at), 1);
	}
	fsync(fd);
	close(fd);
	h_drop_caches();

	start(&d, &e, cfg);
	for (uint32_t i = 0; i < 6; i++) {
		int n = fetch_checked(&e, i, 0, &bad);

		CU_ASSERT(n >= 0);
		CU_ASSERT_EQUAL(bad, 0);
		got += n;
		n = fetch_checked(&e, 100 + i, 1, &bad);
		CU_ASSERT(n >= 0);
		CU_ASSERT_EQUAL(bad, 0);
		got += n;
	}
	CU_ASSERT(h_eng_counter(&e, "disk_corrupt_pages") > 0);
	CU_ASSERT(got < 12 * NP);
	/* Pages the Fetches could not bring stay misses: the engine saw no error, and host pages
	 * still serve new prompts. */
	CU_ASSERT_EQUAL(publish(&e, 50, 0), 0);
	CU_ASSERT_EQUAL(fetch_checked(&e, 50, 0, &bad), NP);
	CU_ASSERT_EQUAL(bad, 0);
	stop(&d, &e);
	unlink(path);
}

/* The file cut to 4 slots while kvpoold is down (the cut inside the fifth slot's header): at
 * most those 4 pages are adopted (the file is extended again), every page fetched is right. */
static void test_truncated_file(void)
{
	char path[300], cfg[1024];
	struct daemon d;
	struct h_eng e;
	int bad = -1;

	path_in(path, sizeof(path), g_dir, "t.disk");
	config(cfg, sizeof(cfg), path, DISK_PAGES, "");
	start(&d, &e, cfg);
	publish_all(&e);
	CU_ASSERT(wait_written(&e, 48) >= 48);
	stop(&d, &e);
	CU_ASSERT_EQUAL(truncate(path, 4 * (off_t)SLOT_BYTES + 20), 0);
	start(&d, &e, cfg);
	CU_ASSERT(h_eng_counter(&e, "disk_adopted_pages") <= 4);
	for (uint32_t i = 0; i < 6; i++) {
		CU_ASSERT(fetch_checked(&e, i, 0, &bad) >= 0);
		CU_ASSERT_EQUAL(bad, 0);
		CU_ASSERT(fetch_checked(&e, 100 + i, 1, &bad) >= 0);
		CU_ASSERT_EQUAL(bad, 0);
	}
	stop(&d, &e);
	unlink(path);
}

/* Every disk read and write fails with EIO: pages are misses, counted; no call fails. */
static void test_eio_is_a_miss(void)
{
	char path[300], cfg[1024];
	struct daemon d;
	struct h_eng e;
	int bad = -1;

	path_in(path, sizeof(path), g_dir, "e.disk");
	config(cfg, sizeof(cfg), path, DISK_PAGES, "");
	setenv("KVPOOLD_FAULTS", "disk_io:1", 1);
	start(&d, &e, cfg);
	unsetenv("KVPOOLD_FAULTS");
	publish_all(&e);
	for (int i = 0; i < 500 && h_eng_counter(&e, "disk_io_errors") < 48; i++)
		usleep(10000);
	CU_ASSERT(h_eng_counter(&e, "disk_io_errors") >= 48);
	CU_ASSERT_EQUAL(h_eng_counter(&e, "disk_written_pages"), 0);
	/* The disk holds nothing: every prompt is what the host tier kept, bytes right. */
	for (uint32_t i = 0; i < 6; i++) {
		CU_ASSERT_EQUAL(disk_only(&e, i, 0), 0);
		CU_ASSERT_EQUAL(disk_only(&e, 100 + i, 1), 0);
		CU_ASSERT(fetch_checked(&e, i, 0, &bad) >= 0);
		CU_ASSERT_EQUAL(bad, 0);
	}
	CU_ASSERT_EQUAL(publish(&e, 60, 0), 0);
	CU_ASSERT_EQUAL(fetch_checked(&e, 60, 0, &bad), NP);
	CU_ASSERT_EQUAL(bad, 0);
	stop(&d, &e);
	unlink(path);
}

/* Runs a shell command; its exit status. */
static int sh(const char *fmt, const char *a, const char *b)
{
	char cmd[1024];
	int r;

	snprintf(cmd, sizeof(cmd), fmt, a, b);
	r = system(cmd);
	return WIFEXITED(r) ? WEXITSTATUS(r) : 128;
}

/* An ext4 filesystem of mb MiB made in a file and mounted on a loop device at mnt. */
static int ext4_make(const char *img, const char *mnt, unsigned mb)
{
	char size[32];

	snprintf(size, sizeof(size), "%u", mb);
	if (sh("truncate -s %sM '%s'", size, img) != 0 ||
	    sh("mkfs.ext4 -q -F '%s' >/dev/null 2>&1%s", img, "") != 0 || mkdir(mnt, 0700) < 0 ||
	    sh("mount -o loop '%s' '%s'", img, mnt) != 0)
		return -1;
	return 0;
}

/* Whether this machine lets root attach and mount a loop device (a container may not): a 1 MiB
 * image attached read-only and detached at once. */
static bool loop_usable(void)
{
	char img[] = "/tmp/kvpool-loop-probe-XXXXXX";
	int fd = mkstemp(img);
	bool ok;

	if (fd < 0)
		return false;
	close(fd);
	ok = access("/dev/loop-control", F_OK) == 0 && sh("truncate -s 1M '%s'%s", img, "") == 0 &&
	     sh("dev=$(losetup -f -r --show '%s' 2>/dev/null) && losetup -d \"$dev\"%s", img, "") ==
		     0 &&
	     sh("command -v mkfs.ext4 >/dev/null%s%s", "", "") == 0;
	unlink(img);
	return ok;
}

static void ext4_remove(const char *img, const char *mnt)
{
	sh("umount '%s'%s", mnt, "");
	rmdir(mnt);
	unlink(img);
}

/* A real ext4 made by the test: round trip and reboot; two pools on it, each in its file;
 * then a disk_capacity past its free space stops start-up (exit 3, DISK_FREE_SPACE). */
static void test_ext4_two_pools_and_full(void)
{
	char img[300], mnt[300], p1[350], p2[350], cfg[2048];
	struct daemon d;
	struct h_eng e, e2;
	int bad = -1;

	snprintf(img, sizeof(img), "%s/ext4.img", g_dir);
	snprintf(mnt, sizeof(mnt), "%s/mnt", g_dir);
	CU_ASSERT_EQUAL_FATAL(ext4_make(img, mnt, 64), 0);
	snprintf(p1, sizeof(p1), "%s/p.disk", mnt);
	snprintf(p2, sizeof(p2), "%s/q.disk", mnt);
	{
		char pool_q[700];

		config(cfg, sizeof(cfg), p1, DISK_PAGES, "");
		snprintf(pool_q, sizeof(pool_q),
			 "[pool.q]\nlayers = 2\nkv_heads = 8\nhead_dim = 64\ndtype = fp16\n"
			 "page_tokens = %d\ndevice = none\nhost_capacity = %ut\nmlock = off\n"
			 "disk = write-back\ndisk_path = %s\ndisk_capacity = %ut\n",
			 PT, HOST_PAGES * PT, p2, DISK_PAGES * PT);
		strncat(cfg, pool_q, sizeof(cfg) - strlen(cfg) - 1);
	}
	start(&d, &e, cfg);
	CU_ASSERT_EQUAL_FATAL(h_eng_open(&e2, d.sock, "disk-test-q", "q"), 0);
	publish_all(&e);
	for (uint32_t i = 0; i < 6; i++)
		CU_ASSERT_EQUAL(publish(&e2, 200 + i, 0), 0);
	CU_ASSERT(wait_written(&e, 48 + 32) >= 48 + 32);
	check_all_back(&e);
	for (uint32_t i = 0; i < 3; i++) {
		CU_ASSERT_EQUAL(fetch_checked(&e2, 200 + i, 0, &bad), NP);
		CU_ASSERT_EQUAL(bad, 0);
		CU_ASSERT_EQUAL(fetch_checked(&e, 200 + i, 0, &bad), 0); /* pool q's pages only */
	}
	kvp_client_close(e2.c);
	kill9(&d, &e);
	sh("umount '%s'%s", mnt, "");
	h_drop_caches();
	CU_ASSERT_EQUAL(sh("mount -o loop '%s' '%s'", img, mnt), 0);
	start(&d, &e, cfg);
	check_all_back(&e);
	stop(&d, &e);

	/* 64 MiB of filesystem cannot hold 2048 pages of 64 KiB. */
	config(cfg, sizeof(cfg), p1, 2048, "");
	memset(&d, 0, sizeof(d));
	unlink(p1);
	CU_ASSERT_EQUAL(h_daemon_run_to_exit(&d, cfg, NULL), 3);
	CU_ASSERT(h_log_contains(&d, "DISK_FREE_SPACE"));
	{ /* kvpoolctl check-config says the same, starting nothing */
		char cmd[600];

		snprintf(cmd, sizeof(cmd), "%s check-config '%s' | grep -q DISK_FREE_SPACE",
			 h_kvpoolctl(), d.config);
		CU_ASSERT_EQUAL(system(cmd), 0);
	}
	h_daemon_cleanup(&d);
	ext4_remove(img, mnt);
}

/* A loop block device as the disk: round trip and reboot; the device turned read-only under
 * kvpoold; a device smaller than disk_capacity stops start-up (exit 3, DISK_DEVICE_SIZE). */
static void test_block_device(void)
{
	char img[300], dev[128] = "", cfg[1024];
	struct daemon d;
	struct h_eng e;
	FILE *f;

	snprintf(img, sizeof(img), "%s/blk.img", g_dir);
	CU_ASSERT_EQUAL_FATAL(sh("truncate -s %s '%s'", "16M", img), 0);
	{
		char cmd[400];

		snprintf(cmd, sizeof(cmd), "losetup -f --show '%s'", img);
		f = popen(cmd, "r");
		CU_ASSERT_FATAL(f != NULL);
		if (!fgets(dev, sizeof(dev), f))
			dev[0] = 0;
		pclose(f);
		dev[strcspn(dev, "\n")] = 0;
	}
	CU_ASSERT_FATAL(dev[0] == '/');
	config(cfg, sizeof(cfg), dev, 128, ""); /* 128 slots of 68 KiB: 8.5 MiB */
	start(&d, &e, cfg);
	publish_all(&e);
	CU_ASSERT(wait_written(&e, 48) >= 48);
	check_all_back(&e);
	kill9(&d, &e);
	h_drop_caches();
	start(&d, &e, cfg);
	CU_ASSERT(h_eng_counter(&e, "disk_adopted_pages") >= 48);
	CU_ASSERT_EQUAL(h_eng_counter(&e, "disk_adopted_from_log"), 1);
	check_all_back(&e);
	/* The device turns read-only under kvpoold: writes fail (counted), the pages on it still
	 * come back, no call fails. */
	CU_ASSERT_EQUAL(sh("blockdev --setro '%s'%s", dev, ""), 0);
	{
		int64_t errs = h_eng_counter(&e, "disk_io_errors"), reads;
		int bad = -1;

		for (uint32_t i = 0; i < 4; i++)
			CU_ASSERT_EQUAL(publish(&e, 300 + i, 0), 0);
		for (int i = 0; i < 500 && h_eng_counter(&e, "disk_io_errors") == errs; i++)
			usleep(10000);
		CU_ASSERT(h_eng_counter(&e, "disk_io_errors") > errs);
		reads = h_eng_counter(&e, "disk_read_pages");
		CU_ASSERT_EQUAL(fetch_checked(&e, 3, 0, &bad), NP); /* from the disk */
		CU_ASSERT_EQUAL(bad, 0);
		CU_ASSERT_EQUAL(h_eng_counter(&e, "disk_read_pages") - reads, NP);
	}
	CU_ASSERT_EQUAL(sh("blockdev --setrw '%s'%s", dev, ""), 0);
	stop(&d, &e);

	config(cfg, sizeof(cfg), dev, 300, ""); /* 20 MiB on a 16 MiB device */
	memset(&d, 0, sizeof(d));
	CU_ASSERT_EQUAL(h_daemon_run_to_exit(&d, cfg, NULL), 3);
	CU_ASSERT(h_log_contains(&d, "DISK_DEVICE_SIZE"));
	h_daemon_cleanup(&d);
	sh("losetup -d '%s'%s", dev, "");
	unlink(img);
}

/* The config of pools p and q on one disk, q's region from q_off (MiB) on; 128 slots each. */
static void config_two(char *buf, size_t len, const char *dev, unsigned q_off)
{
	char p[1024], q[1024];

	config(p, sizeof(p), dev, 128, "");
	config(q, sizeof(q), dev, 128, "");
	q[strlen("[pool.")] = 'q';
	snprintf(buf, len, "%s%sdisk_offset = %uM\n", p, q, q_off);
}

/* Publishes prompts [base, base + 6) (token calls) of one pool: 48 pages through a host tier of
 * 16, the first ones of which go to the disk. */
static void publish_from(struct h_eng *e, uint32_t base)
{
	for (uint32_t i = 0; i < 6; i++)
		CU_ASSERT_EQUAL_FATAL(publish(e, base + i, 0), 0);
}

/* The first 3 prompts from base come back from the disk, every byte checked. */
static void check_back_from(struct h_eng *e, uint32_t base)
{
	for (uint32_t i = 0; i < 3; i++) {
		int bad = -1;

		CU_ASSERT_EQUAL(disk_seen(e, base + i, 0), NP);
		CU_ASSERT_EQUAL(fetch_checked(e, base + i, 0, &bad), NP);
		CU_ASSERT_EQUAL(bad, 0);
	}
}

/* Two pools on one loop block device, p from byte 0 and q from 16 MiB (disk_offset): round trips
 * with every byte checked, each pool's pages its own; kill -9 and a start without the fd store
 * adopt both from their logs; regions that overlap or pass the device's end stop start-up (exit
 * 3, DISK_REGION_OVERLAP, DISK_DEVICE_SIZE). */
static void test_block_device_two_pools(void)
{
	char img[300], dev[128] = "", cfg[3072], cmd[400];
	struct daemon d;
	struct h_eng e, e2;
	FILE *f;

	snprintf(img, sizeof(img), "%s/blk2.img", g_dir);
	CU_ASSERT_EQUAL_FATAL(sh("truncate -s %s '%s'", "32M", img), 0);
	snprintf(cmd, sizeof(cmd), "losetup -f --show '%s'", img);
	f = popen(cmd, "r");
	CU_ASSERT_FATAL(f != NULL);
	if (!fgets(dev, sizeof(dev), f))
		dev[0] = 0;
	pclose(f);
	dev[strcspn(dev, "\n")] = 0;
	CU_ASSERT_FATAL(dev[0] == '/');
	config_two(cfg, sizeof(cfg), dev, 16); /* 128 slots of 68 KiB and a log: 8.8 MiB each */
	start(&d, &e, cfg);
	CU_ASSERT_EQUAL_FATAL(h_eng_open(&e2, d.sock, "disk-test", "q"), 0);
	publish_from(&e, 0);
	publish_from(&e2, 500);
	CU_ASSERT(wait_written(&e, 24) >= 24);
	CU_ASSERT(wait_written(&e2, 24) >= 24);
	check_back_from(&e, 0);
	check_back_from(&e2, 500);
	CU_ASSERT_EQUAL(disk_seen(&e, 500, 0), 0); /* q's pages are not p's */
	CU_ASSERT_EQUAL(h_eng_counter(&e, "disk_corrupt_pages"), 0);
	CU_ASSERT_EQUAL(h_eng_counter(&e2, "disk_corrupt_pages"), 0);
	kvp_client_close(e2.c);
	kill9(&d, &e);
	h_drop_caches();
	start(&d, &e, cfg);
	CU_ASSERT_EQUAL_FATAL(h_eng_open(&e2, d.sock, "disk-test", "q"), 0);
	/* The status counters are the daemon's sums; the metrics say each pool's. */
	CU_ASSERT(h_eng_counter(&e, "disk_adopted_pages") >= 48);
	CU_ASSERT_EQUAL(h_eng_counter(&e, "disk_adopted_from_log"), 2);
	CU_ASSERT(ctl_prints(&d, "metrics", "kvpool_disk_adopted_from_log{pool=\"p\"} 1"));
	CU_ASSERT(ctl_prints(&d, "metrics", "kvpool_disk_adopted_from_log{pool=\"q\"} 1"));
	check_back_from(&e, 0);
	check_back_from(&e2, 500);
	CU_ASSERT_EQUAL(h_eng_counter(&e, "disk_corrupt_pages"), 0);
	CU_ASSERT_EQUAL(h_eng_counter(&e2, "disk_corrupt_pages"), 0);
	kvp_client_close(e2.c);
	stop(&d, &e);

	config_two(cfg, sizeof(cfg), dev, 4); /* q from 4 MiB: inside p's 8.8 */
	memset(&d, 0, sizeof(d));
	CU_ASSERT_EQUAL(h_daemon_run_to_exit(&d, cfg, NULL), 3);
	CU_ASSERT(h_log_contains(&d, "DISK_REGION_OVERLAP"));
	CU_ASSERT(h_log_contains(&d, "overlaps pool p's"));
	h_daemon_cleanup(&d);
	config_two(cfg, sizeof(cfg), dev, 28); /* q from 28 MiB: past the 32 MiB device's end */
	memset(&d, 0, sizeof(d));
	CU_ASSERT_EQUAL(h_daemon_run_to_exit(&d, cfg, NULL), 3);
	CU_ASSERT(h_log_contains(&d, "DISK_DEVICE_SIZE"));
	CU_ASSERT(h_log_contains(&d, "pool q"));
	h_daemon_cleanup(&d);
	sh("losetup -d '%s'%s", dev, "");
	unlink(img);
}

/* A geometry change: the pages written for another geometry are not served; one log line. */
static void test_geometry_change_starts_empty(void)
{
	char path[300], cfg[1024];
	struct daemon d;
	struct h_eng e;
	int bad = -1;

	path_in(path, sizeof(path), g_dir, "g.disk");
	config(cfg, sizeof(cfg), path, DISK_PAGES, "");
	start(&d, &e, cfg);
	publish_all(&e);
	CU_ASSERT(wait_written(&e, 48) >= 48);
	stop(&d, &e);
	/* head_dim 32 with 2x the heads: the same page bytes, another geometry. */
	snprintf(cfg, sizeof(cfg),
		 "[pool.p]\nlayers = 2\nkv_heads = 16\nhead_dim = 32\ndtype = fp16\n"
		 "page_tokens = %d\ndevice = none\nhost_capacity = %ut\nmlock = off\n"
		 "disk = write-back\ndisk_path = %s\ndisk_capacity = %ut\n",
		 PT, HOST_PAGES * PT, path, DISK_PAGES * PT);
	start(&d, &e, cfg);
	CU_ASSERT_EQUAL(h_eng_counter(&e, "disk_adopted_pages"), 0);
	CU_ASSERT(h_log_contains(&d, "of another geometry dropped"));
	CU_ASSERT_EQUAL(disk_seen(&e, 0, 0), 0);
	CU_ASSERT_EQUAL(fetch_checked(&e, 0, 0, &bad), 0);
	stop(&d, &e);
	unlink(path);
}

/* The host tier full, nothing evicted yet: its pages go to the disk in place, ahead of eviction
 * (no staging copy); the Allocs that then evict them find them there (skipped, not written
 * again); with the page cache dropped they come back from the disk with every byte right. */
static void test_inplace_ahead_of_eviction(void)
{
	char path[300], cfg[1024];
	struct daemon d;
	struct h_eng e;
	int bad = -1;

	path_in(path, sizeof(path), g_dir, "w.disk");
	config(cfg, sizeof(cfg), path, DISK_PAGES, "disk_queue_depth = 4\n");
	start(&d, &e, cfg);
	/* 16 of 16 host pages cached: under the watermark, every page is written where it is */
	CU_ASSERT_EQUAL_FATAL(publish(&e, 0, 0), 0);
	CU_ASSERT_EQUAL_FATAL(publish(&e, 100, 1), 0);
	CU_ASSERT(wait_counter(&e, "disk_write_inplace", 2 * NP) >= 2 * NP);
	CU_ASSERT_EQUAL(h_eng_counter(&e, "disk_write_copied"), 0);
	CU_ASSERT_EQUAL(h_eng_counter(&e, "disk_written_pages"), 2 * NP);
	CU_ASSERT_EQUAL(h_eng_counter(&e, "disk_write_dropped"), 0);
	CU_ASSERT_EQUAL(disk_only(&e, 0, 0), 0); /* still cached in the host tier: no disk run */
	CU_ASSERT_EQUAL(fetch_checked(&e, 0, 0, &bad), NP);
	CU_ASSERT_EQUAL(bad, 0);
	/* under pressure: each Alloc evicts pages the disk holds already, and the write-back keeps
	 * writing the cold end in place while the prompts go through */
	for (uint32_t i = 1; i < 5; i++) {
		CU_ASSERT_EQUAL_FATAL(publish(&e, i, 0), 0);
		CU_ASSERT_EQUAL_FATAL(publish(&e, 100 + i, 1), 0);
	}
	CU_ASSERT(h_eng_counter(&e, "disk_write_skipped") >= NP);
	CU_ASSERT(wait_counter(&e, "disk_written_pages", 8 * NP) >= 8 * NP);
	CU_ASSERT(h_eng_counter(&e, "disk_write_inplace") > 2 * NP);
	CU_ASSERT_EQUAL(h_eng_counter(&e, "disk_write_inplace") +
				h_eng_counter(&e, "disk_write_copied"),
			h_eng_counter(&e, "disk_written_pages"));
	CU_ASSERT_EQUAL(h_eng_counter(&e, "disk_io_errors"), 0);
	CU_ASSERT(ctl_prints(&d, "metrics", "kvpool_disk_write_inplace_total{pool=\"p\"} "));
	CU_ASSERT(ctl_prints(&d, "status", "disk_write_copied"));
	CU_ASSERT(ctl_prints(&d, "cache", " in place), "));
	h_drop_caches();
	for (uint32_t i = 0; i < 3; i++) {
		CU_ASSERT_EQUAL(disk_seen(&e, i, 0), NP);
		CU_ASSERT_EQUAL(fetch_checked(&e, i, 0, &bad), NP);
		CU_ASSERT_EQUAL(bad, 0);
		CU_ASSERT_EQUAL(disk_seen(&e, 100 + i, 1), NP);
		CU_ASSERT_EQUAL(fetch_checked(&e, 100 + i, 1, &bad), NP);
		CU_ASSERT_EQUAL(bad, 0);
	}
	CU_ASSERT(h_eng_counter(&e, "disk_read_pages") >= NP);
	CU_ASSERT_EQUAL(h_eng_counter(&e, "disk_corrupt_pages"), 0);
	stop(&d, &e);
	unlink(path);
}

/* disk = write-through: a page is on the disk as soon as it is cached, with the host tier far
 * from full (write-back writes nothing then); kvpoold killed with SIGKILL and started again
 * without the fd store, the page cache dropped: every page is a hit with its bytes. */
static void test_write_through_survives_kill(void)
{
	char path[300], cfg[1024];
	struct daemon d;
	struct h_eng e;
	int bad = -1;

	path_in(path, sizeof(path), g_dir, "b.disk");
	config(cfg, sizeof(cfg), path, DISK_PAGES, "");
	start(&d, &e, cfg);
	CU_ASSERT_EQUAL_FATAL(publish(&e, 0, 0), 0);
	usleep(200000);
	CU_ASSERT_EQUAL(h_eng_counter(&e, "disk_written_pages"), 0); /* write-back: 8 free */
	stop(&d, &e);

	path_in(path, sizeof(path), g_dir, "t2.disk");
	config_mode(cfg, sizeof(cfg), "write-through", path, DISK_PAGES, "");
	start(&d, &e, cfg);
	CU_ASSERT_EQUAL_FATAL(publish(&e, 0, 0), 0);
	CU_ASSERT_EQUAL_FATAL(publish(&e, 100, 1), 0);
	CU_ASSERT(wait_counter(&e, "disk_write_inplace", 2 * NP) >= 2 * NP);
	CU_ASSERT_EQUAL(h_eng_counter(&e, "disk_write_copied"), 0);
	CU_ASSERT_EQUAL(h_eng_counter(&e, "disk_pages"), 2 * NP);
	kill9(&d, &e);

	h_drop_caches();
	start(&d, &e, cfg);
	CU_ASSERT_EQUAL(h_eng_counter(&e, "disk_adopted_pages"), 2 * NP);
	CU_ASSERT_EQUAL(disk_only(&e, 0, 0), NP);
	CU_ASSERT_EQUAL(fetch_checked(&e, 0, 0, &bad), NP);
	CU_ASSERT_EQUAL(bad, 0);
	CU_ASSERT_EQUAL(disk_only(&e, 100, 1), NP);
	CU_ASSERT_EQUAL(fetch_checked(&e, 100, 1, &bad), NP);
	CU_ASSERT_EQUAL(bad, 0);
	CU_ASSERT_EQUAL(h_eng_counter(&e, "disk_read_pages"), 2 * NP);
	/* pages fetched back are cached again: on the disk already, nothing written */
	usleep(200000);
	CU_ASSERT_EQUAL(h_eng_counter(&e, "disk_written_pages"), 0);
	stop(&d, &e);
	unlink(path);
	path_in(path, sizeof(path), g_dir, "b.disk");
}

/* Config checks: disk without its path or capacity, a disk_offset not of whole 4 KiB blocks, two
 * pools on one file with overlapping regions (exit 3; a reload adding the second is refused),
 * then with disjoint ones (they start, or the reload adds it). */
static void test_config_refused(void)
{
	char cfg[2048], path[300];
	struct daemon d;

	path_in(path, sizeof(path), g_dir, "c.disk");
	snprintf(cfg, sizeof(cfg),
		 "[pool.p]\nlayers = 2\nkv_heads = 8\nhead_dim = 64\ndtype = fp16\n"
		 "page_tokens = 16\nhost_capacity = 16t\nmlock = off\ndisk = write-back\n");
	memset(&d, 0, sizeof(d));
	CU_ASSERT_EQUAL(h_daemon_run_to_exit(&d, cfg, NULL), 2);
	CU_ASSERT(h_log_contains(&d, "needs disk_path"));
	h_daemon_cleanup(&d);
	config(cfg, sizeof(cfg), path, DISK_PAGES, "");
	{
		char q[600];

		snprintf(q, sizeof(q),
			 "[pool.q]\nlayers = 2\nkv_heads = 8\nhead_dim = 64\ndtype = fp16\n"
			 "page_tokens = 16\nhost_capacity = 16t\nmlock = off\ndisk = write-back\n"
			 "disk_path = %s\ndisk_capacity = 64t\n",
			 path);
		strncat(cfg, q, sizeof(cfg) - strlen(cfg) - 1);
	}
	memset(&d, 0, sizeof(d));
	CU_ASSERT_EQUAL(h_daemon_run_to_exit(&d, cfg, NULL), 3);
	CU_ASSERT(h_log_contains(&d, "DISK_REGION_OVERLAP"));
	h_daemon_cleanup(&d);
	{
		/* the same pool q added by a reload to a kvpoold running p: refused the same way,
		 * nothing applied; at a disjoint offset it is added */
		char one[1024], more[2100];
		struct h_eng e;

		config(one, sizeof(one), path, DISK_PAGES, "");
		start(&d, &e, one);
		CU_ASSERT_EQUAL_FATAL(h_write_file(d.config, cfg), 0);
		CU_ASSERT(ctl_prints(&d, "reload 2>&1", "DISK_REGION_OVERLAP"));
		CU_ASSERT(h_log_contains(&d, "reload refused, keeping the running config: disk "
					     "budget"));
		CU_ASSERT_EQUAL(h_eng_counter(&e, "disk_capacity_pages"), DISK_PAGES);
		snprintf(more, sizeof(more), "%sdisk_offset = 16M\n", cfg);
		CU_ASSERT_EQUAL_FATAL(h_write_file(d.config, more), 0);
		CU_ASSERT_FALSE(ctl_prints(&d, "reload 2>&1", "DISK_REGION_OVERLAP"));
		CU_ASSERT_EQUAL(h_eng_counter(&e, "disk_capacity_pages"), DISK_PAGES + 4);
		stop(&d, &e);
		unlink(path);
	}
	{
		char more[2100];
		struct h_eng e;

		snprintf(more, sizeof(more), "%sdisk_offset = 4097\n", cfg);
		memset(&d, 0, sizeof(d));
		CU_ASSERT_EQUAL(h_daemon_run_to_exit(&d, more, NULL), 2);
		CU_ASSERT(h_log_contains(&d, "not a multiple of 4096"));
		h_daemon_cleanup(&d);
		snprintf(more, sizeof(more), "%sdisk_offset = 16M\n", cfg);
		start(&d, &e, more);
		CU_ASSERT_EQUAL(h_eng_counter(&e, "disk_capacity_pages"), DISK_PAGES + 4);
		stop(&d, &e);
	}
	unlink(path);
	/* write-through needs room for the whole host tier */
	config_mode(cfg, sizeof(cfg), "write-through", path, HOST_PAGES - 1, "");
	memset(&d, 0, sizeof(d));
	CU_ASSERT_EQUAL(h_daemon_run_to_exit(&d, cfg, NULL), 2);
	CU_ASSERT(h_log_contains(&d, "needs room for at least the host tier"));
	h_daemon_cleanup(&d);
	config(cfg, sizeof(cfg), path, DISK_PAGES, "disk_queue_depth = 0\n");
	memset(&d, 0, sizeof(d));
	CU_ASSERT_EQUAL(h_daemon_run_to_exit(&d, cfg, NULL), 2);
	CU_ASSERT(h_log_contains(&d, "disk_queue_depth"));
	h_daemon_cleanup(&d);
}

/* Whether dir's filesystem takes O_DIRECT (tmpfs before Linux 6.6 does not). */
static bool direct_io(const char *dir)
{
	char probe[300];
	int fd;

	snprintf(probe, sizeof(probe), "%s/kvpool-direct-probe-%d", dir, (int)getpid());
	fd = open(probe, O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0600);
	if (fd < 0)
		return false;
	close(fd);
	unlink(probe);
	return true;
}

/* The folder the disk files go under: the build tree, else /var/tmp, else /tmp, the first with
 * direct I/O. Empty when none has it. */
static char g_base[200];

static void pick_base(void)
{
	const char *cand[] = { NULL, "/var/tmp", "/tmp" };

	g_base[0] = 0;
	if (getcwd(g_base, sizeof(g_base)) && direct_io(g_base))
		return;
	for (size_t i = 1; i < sizeof(cand) / sizeof(cand[0]); i++) {
		if (direct_io(cand[i])) {
			snprintf(g_base, sizeof(g_base), "%s", cand[i]);
			return;
		}
	}
	g_base[0] = 0;
}

static int init_suite(void)
{
	snprintf(g_dir, sizeof(g_dir), "%s/disk-test-XXXXXX", g_base);
	return mkdtemp(g_dir) ? 0 : -1;
}

static int clean_suite(void)
{
	char cmd[400];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
	return system(cmd) == 0 ? 0 : -1;
}

/* No argument: the plain file parts. "devices": the ext4 and block device parts (root). */
int main(int argc, char **argv)
{
	static const struct h_test tests[] = {
		H_TEST(test_file_round_trip_and_reboot),
		H_TEST(test_log_lost_falls_back_to_scan),
		H_TEST(test_kill_during_writes),
		H_TEST(test_flipped_bytes_are_misses),
		H_TEST(test_truncated_file),
		H_TEST(test_eio_is_a_miss),
		H_TEST(test_geometry_change_starts_empty),
		H_TEST(test_inplace_ahead_of_eviction),
		H_TEST(test_write_through_survives_kill),
		H_TEST(test_config_refused),
	};
	static const struct h_test devices[] = {
		H_TEST(test_ext4_two_pools_and_full),
		H_TEST(test_block_device),
		H_TEST(test_block_device_two_pools),
	};

	pick_base();
	if (!g_base[0]) {
		fprintf(stderr,
			"skip: no filesystem here takes direct I/O (the build tree, /var/tmp, "
			"/tmp), which the disk tier needs\n");
		return 77;
	}
	if (argc > 1 && strcmp(argv[1], "devices") == 0) {
		if (geteuid() != 0) {
			fprintf(stderr, "skip: needs root (mkfs.ext4 on a loop device, mount, "
					"losetup)\n");
			return 77;
		}
		if (!loop_usable()) {
			fprintf(stderr, "skip: this machine gives root no loop devices (no "
					"/dev/loop-control, losetup failed, or no mkfs.ext4)\n");
			return 77;
		}
		return H_RUN_SUITE("disk_devices", init_suite, clean_suite, devices);
	}
	return H_RUN_SUITE("disk", init_suite, clean_suite, tests);
}
