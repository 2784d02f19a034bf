/* bench_events.c - the cost of KV events ([events]) to the engines and their lag to a router.
 *
 * events.overhead: Insert + Match calls per second (one client; each op leases 4 device pages,
 * inserts their 64 tokens, frees the lease and matches the prompt; the pool fills, so demotions
 * and host evictions publish events too) on a kvpoold publishing KV events with a subscriber
 * reading them, against the same calls on a kvpoold without [events], rounds alternating (each
 * pair in the other order than the last) in the same run. Target: ratio >= 0.9.
 * Every thread is left to the scheduler (on a 2-CPU machine the subscriber takes turns with the
 * engine's path).
 * events.overhead.pinned: the same with the engine's path (the client and kvpoold's loop) on one
 * CPU and the subscriber with the ZeroMQ I/O threads (kvpoold's and its own) on another, as on a
 * node whose router does not run on the engine's cores; both kvpoolds pinned alike. The calls
 * run faster so (no wake-up crosses CPUs), and what publishing costs kvpoold's loop weighs more.
 * events.overhead.no_subscriber: the same before any subscriber connects (kvpoold's own cost).
 * events.lag_p99: from the start of a page's Insert (Alloc, Insert of one key page, Free) to its
 * BlockStored at a subscriber on the same node (ZeroMQ SUB over ipc), p99 in microseconds,
 * against the p99 of the calls alone. */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <zmq.h>

#include "bench.h"
#include "harness.h"
#include "kvpool.h"

#define PT 16
#define OP_PAGES 4

static char g_ipc[64];

static const char *conf_text(bool events, char *buf, size_t n)
{
	int k = snprintf(buf, n,
			 "[daemon]\n"
			 "[pool.p]\nlayers = 2\nkv_heads = 2\nhead_dim = 16\ndtype = fp16\n"
			 "page_tokens = %d\ndevice = sim\ndevice_capacity = 16384t\n"
			 "host_capacity = 16384t\nmlock = off\n",
			 PT);

	if (events)
		snprintf(buf + k, n - (size_t)k,
			 "[events]\nendpoint = ipc://%s/pub\nreplay_endpoint = ipc://%s/replay\n"
			 "topic = kv\n",
			 g_ipc, g_ipc);
	return buf;
}

struct side {
	struct daemon d;
	struct kvp_client *c;
	struct kvp_pool *p;
	uint32_t next; /* prompts inserted so far */
};

static void side_stop(struct side *s)
{
	kvp_client_close(s->c);
	h_daemon_stop(&s->d);
	h_daemon_cleanup(&s->d);
}

static int side_start(struct side *s, bool events)
{
	char conf[1024];
	struct kvp_error e;

	memset(s, 0, sizeof(*s));
	if (h_daemon_start(&s->d, conf_text(events, conf, sizeof(conf)), NULL) < 0) {
		fprintf(stderr, "bench_events: kvpoold did not start:\n");
		if (system((snprintf(conf, sizeof(conf), "cat %s >&2", s->d.log), conf)) != 0)
			fprintf(stderr, "(no log)\n");
		h_daemon_cleanup(&s->d);
		return -1;
	}
	s->c = kvp_client_connect(s->d.sock, "bench-events", &e);
	s->p = s->c ? kvp_pool_attach(s->c, "p", NULL, &e) : NULL;
	if (!s->p) {
		fprintf(stderr, "bench_events: attach: %s\n", e.message);
		side_stop(s);
		return -1;
	}
	return 0;
}

/* n ops; 0 or -1. */
static int ops(struct side *s, uint32_t n)
{
	uint32_t tok[OP_PAGES * PT], pages[OP_PAGES], dev[OP_PAGES], host[OP_PAGES];
	struct kvp_error e;

	for (uint32_t i = 0; i < n; i++) {
		struct kvp_match_result m = { .struct_size = sizeof(m) };
		uint64_t lease, nt;
		uint32_t id = s->next++;

		for (uint32_t t = 0; t < OP_PAGES * PT; t++)
			tok[t] = t < PT ? t + 1 : id * 1000 + t; /* a shared first page */
		if (kvp_lease_alloc(s->p, KVP_TIER_DEVICE, OP_PAGES, &lease, pages, &e) < 0 ||
		    kvp_cache_insert(s->p, lease, 0, tok, OP_PAGES * PT, 0, pages, OP_PAGES, &nt,
				     &e) < 0 ||
		    kvp_lease_free(s->p, lease, NULL, 0, &e) < 0 ||
		    kvp_cache_match(s->p, 0, tok, OP_PAGES * PT, 0, &m, dev, host, OP_PAGES, &e) <
			    0) {
			fprintf(stderr, "bench_events: op %u: %s\n", i, e.message);
			return -1;
		}
	}
	return 0;
}

/* A router reading every batch, on its own thread. */
struct reader {
	void *sub;
	atomic_bool stop;
	uint64_t msgs;
	pid_t tid;
};

/* Pins thread tid to cpu. 0 or -errno. */
static int pin(pid_t tid, int cpu)
{
	cpu_set_t set;

	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	return sched_setaffinity(tid, sizeof(set), &set) < 0 ? -errno : 0;
}

/* Pins every thread of process pid: ZeroMQ's I/O threads ("ZMQbg/...") and the thread skip to
 * cpu_io, the others to cpu_main. 0 or -errno. */
static int pin_process(pid_t pid, pid_t skip, int cpu_main, int cpu_io)
{
	char path[64], comm[32];
	struct dirent *de;
	DIR *dir;
	int rc = 0;

	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	if (!(dir = opendir(path)))
		return -errno;
	while ((de = readdir(dir)) && rc == 0) {
		pid_t tid = (pid_t)atoi(de->d_name);
		FILE *f;

		if (tid <= 0)
			continue;
		snprintf(path, sizeof(path), "/proc/%d/task/%d/comm", (int)pid, (int)tid);
		comm[0] = '\0';
		if ((f = fopen(path, "re"))) {
			if (!fgets(comm, sizeof(comm), f))
				comm[0] = '\0';
			fclose(f);
		}
		rc = pin(tid, tid == skip || strncmp(comm, "ZMQbg", 5) == 0 ? cpu_io : cpu_main);
	}
	closedir(dir);
	return rc;
}

/* Undoes the pinning of process pid: every thread on any of the CPUs in all. */
static void unpin_process(pid_t pid, const cpu_set_t *all)
{
	char path[64];
	struct dirent *de;
	DIR *dir;

	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	if (!(dir = opendir(path)))
		return;
	while ((de = readdir(dir)))
		if (atoi(de->d_name) > 0)
			(void)sched_setaffinity((pid_t)atoi(de->d_name), sizeof(*all), all);
	closedir(dir);
}

static void *read_all(void *arg)
{
	struct reader *r = arg;
	char buf[1 << 16];

	__atomic_store_n(&r->tid, (pid_t)syscall(SYS_gettid), __ATOMIC_RELEASE);
	while (!atomic_load(&r->stop)) {
		zmq_pollitem_t it = { r->sub, 0, ZMQ_POLLIN, 0 };

		if (zmq_poll(&it, 1, 50) > 0)
			while (zmq_recv(r->sub, buf, sizeof(buf), ZMQ_DONTWAIT) >= 0)
				r->msgs++;
	}
	return NULL;
}

/* CPU seconds (user + system) process pid used so far, -1 when unknown. */
static double cpu_s(pid_t pid)
{
	char path[64], buf[1024], *p;
	unsigned long ut = 0, st = 0;
	FILE *f;
	size_t n;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return -1;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	p = strrchr(buf, ')'); /* fields after the command name: state is field 3 */
	if (!p ||
	    sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
		return -1;
	return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static double p99_us(uint64_t *v, uint32_t n)
{
	qsort(v, n, sizeof(*v), cmp_u64);
	return (double)v[(size_t)((n - 1) * 0.99)] / 1e3;
}

/* One page inserted by key, then its BlockStored awaited on sub: lag[i] and call[i] in ns. */
static int lag_run(struct side *s, void *sub, uint32_t n, uint64_t *lag, uint64_t *call)
{
	static char buf[1 << 16];
	struct kvp_error e;

	for (uint32_t i = 0; i < n; i++) {
		uint8_t key[16];
		struct kvp_page_key k = { key, sizeof(key) };
		struct kvp_insert_keys_result res = { .struct_size = sizeof(res) };
		uint64_t lease, t0, t1;
		uint32_t page;
		bool seen = false;

		memset(key, 0, sizeof(key));
		memcpy(key, "lag-", 4);
		memcpy(key + 4, &i, sizeof(i));
		t0 = b_now_ns();
		if (kvp_lease_alloc(s->p, KVP_TIER_DEVICE, 1, &lease, &page, &e) < 0 ||
		    kvp_cache_insert_keys(s->p, lease, 9, &k, 1, 0, &page, 1, &res, &e) < 0 ||
		    kvp_lease_free(s->p, lease, NULL, 0, &e) < 0) {
			fprintf(stderr, "bench_events: lag insert: %s\n", e.message);
			return -1;
		}
		t1 = b_now_ns();
		while (!seen) {
			zmq_pollitem_t it = { sub, 0, ZMQ_POLLIN, 0 };
			int more = 0;
			size_t ml = sizeof(more);
			int len;

			if (zmq_poll(&it, 1, 5000) <= 0) {
				fprintf(stderr, "bench_events: no event for key %u in 5 s\n", i);
				return -1;
			}
			do { /* topic, seq, payload */
				len = zmq_recv(sub, buf, sizeof(buf), 0);
				if (len < 0)
					return -1;
				if (len > (int)sizeof(buf))
					len = sizeof(buf);
				zmq_getsockopt(sub, ZMQ_RCVMORE, &more, &ml);
			} while (more);
			seen = memmem(buf, (size_t)len, key, sizeof(key)) != NULL;
		}
		lag[i] = b_now_ns() - t0;
		call[i] = t1 - t0;
	}
	return 0;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

struct result {
	double on, off;		/* median ops/s of the rounds */
	double cpu_on, cpu_off; /* kvpoold CPU microseconds per op */
};

#define ROUNDS_MAX 11

/* per ops on s: ops/s into *rate. 0 or -1. */
static int timed(struct side *s, uint32_t per, double *rate)
{
	double t0 = b_now_s();

	if (ops(s, per) < 0)
		return -1;
	*rate = per / (b_now_s() - t0);
	return 0;
}

/* rounds of per ops on b (no events) and a (events), alternating, each round's pair in the other
 * order than the last (b a, a b, b a, ...): neither side is always the one that runs after the
 * other. 0 or -1. */
static int rounds_of(struct side *a, struct side *b, uint32_t rounds, uint32_t per,
		     struct result *res)
{
	double on[ROUNDS_MAX], off[ROUNDS_MAX], ca = cpu_s(a->d.pid), cb = cpu_s(b->d.pid);

	for (uint32_t r = 0; r < rounds; r++) {
		if (r % 2 == 0 ? timed(b, per, &off[r]) < 0 || timed(a, per, &on[r]) < 0
			       : timed(a, per, &on[r]) < 0 || timed(b, per, &off[r]) < 0)
			return -1;
	}
	res->cpu_on = (cpu_s(a->d.pid) - ca) / (rounds * per) * 1e6;
	res->cpu_off = (cpu_s(b->d.pid) - cb) / (rounds * per) * 1e6;
	qsort(on, rounds, sizeof(double), cmp_d);
	qsort(off, rounds, sizeof(double), cmp_d);
	res->on = on[rounds / 2];
	res->off = off[rounds / 2];
	return 0;
}

int main(int argc, char **argv)
{
	int quick = b_quick(argc, argv);
	uint32_t rounds = quick ? 3 : ROUNDS_MAX, per = quick ? 300 : 2000,
		 nlag = quick ? 200 : 2000;
	struct result res0 = { 0 }, res = { 0 }, shared = { 0 };
	cpu_set_t all;
	int cpu[2], ncpu = 0;
	bool pinned = false;
	struct side a, b;
	bool started = false;
	struct reader rd = { 0 };
	pthread_t th;
	void *zctx = NULL;
	uint64_t *lag, *call;
	char params[512];
	int rc = 1;

	snprintf(g_ipc, sizeof(g_ipc), "/tmp/kvpool-bench-events-XXXXXX");
	if (!mkdtemp(g_ipc))
		return 1;
	if (side_start(&a, true) < 0) {
		rmdir(g_ipc);
		return 1;
	}
	if (side_start(&b, false) < 0) {
		side_stop(&a);
		rmdir(g_ipc); /* a's sockets went with it */
		return 1;
	}
	/* warm both up (the pools fill: demotions and evictions from here on) */
	if (ops(&a, 300) < 0 || ops(&b, 300) < 0)
		goto out;
	/* no subscriber yet: what publishing costs kvpoold itself */
	if (rounds_of(&a, &b, rounds, per, &res0) < 0)
		goto out;
	zctx = zmq_ctx_new();
	rd.sub = zmq_socket(zctx, ZMQ_SUB);
	{
		char ep[128];

		snprintf(ep, sizeof(ep), "ipc://%s/pub", g_ipc);
		zmq_setsockopt(rd.sub, ZMQ_SUBSCRIBE, "kv", 2);
		if (zmq_connect(rd.sub, ep) < 0)
			goto out;
	}
	usleep(200000); /* the subscription reaches kvpoold */
	pthread_create(&th, NULL, read_all, &rd);
	started = true;
	while (!__atomic_load_n(&rd.tid, __ATOMIC_ACQUIRE))
		usleep(1000);
	/* every thread where the scheduler puts it */
	if (rounds_of(&a, &b, rounds, per, &shared) < 0)
		goto out;
	/* the engine's path on one CPU, the reader and the ZeroMQ I/O threads on another */
	CPU_ZERO(&all);
	if (sched_getaffinity(0, sizeof(all), &all) == 0)
		for (int c = 0; c < CPU_SETSIZE && ncpu < 2; c++)
			if (CPU_ISSET(c, &all))
				cpu[ncpu++] = c;
	if (ncpu == 2) {
		int e = pin_process(getpid(), rd.tid, cpu[0], cpu[1]);

		if (!e)
			e = pin_process(a.d.pid, 0, cpu[0], cpu[1]);
		if (!e)
			e = pin_process(b.d.pid, 0, cpu[0], cpu[1]);
		pinned = e == 0;
		if (!pinned)
			fprintf(stderr, "bench_events: pinning failed: %s\n", strerror(-e));
	}
	if (pinned && rounds_of(&a, &b, rounds, per, &res) < 0)
		goto out;
	if (ncpu == 2) { /* a pinning that failed half-way is undone too */
		unpin_process(getpid(), &all);
		unpin_process(a.d.pid, &all);
		unpin_process(b.d.pid, &all);
	}
	atomic_store(&rd.stop, true);
	pthread_join(th, NULL);
	started = false;
	snprintf(
		params, sizeof(params),
		"{\"rounds\":%u,\"ops_per_round\":%u,\"op\":\"alloc 4 pages + insert 64 tokens + "
		"free + match\",\"page_tokens\":%d,\"batches_read\":%lu,"
		"\"kvpoold_cpu_us_per_op_on\":%.1f,\"kvpoold_cpu_us_per_op_off\":%.1f,"
		"\"placement\":\"%s\"}",
		rounds, per, PT, (unsigned long)rd.msgs, res.cpu_on, res.cpu_off,
		pinned ? b_fmt("client and kvpoold's loop on CPU %d, the subscriber and the ZeroMQ "
			       "I/O threads on CPU %d",
			       cpu[0], cpu[1])
		       : "not pinned (fewer than 2 CPUs, or pinning failed)");
	if (pinned)
		b_row_print(&(struct b_row){
			.name = "events.overhead.pinned",
			.params = params,
			.baseline_what =
				"the same Insert+Match ops/s on a kvpoold without [events] "
				"(median of the rounds, alternating), pinned alike",
			.baseline = res.off,
			.have_base = 1,
			.value = res.on,
			.have_value = 1,
			.unit = "ops/s",
			.target =
				"report (kvpoold's loop's own cost when nothing else shares its CPU)",
			.note = "one subscriber reading every batch over ipc, on the same machine but not "
				"on the engine's CPU",
		});
	snprintf(params, sizeof(params),
		 "{\"rounds\":%u,\"ops_per_round\":%u,\"op\":\"alloc 4 pages + insert 64 tokens + "
		 "free + match\",\"page_tokens\":%d,\"kvpoold_cpu_us_per_op_on\":%.1f,"
		 "\"kvpoold_cpu_us_per_op_off\":%.1f,\"placement\":\"any CPU\"}",
		 rounds, per, PT, shared.cpu_on, shared.cpu_off);
	b_row_print(&(struct b_row){
		.name = "events.overhead",
		.params = params,
		.baseline_what = "the same Insert+Match ops/s on a kvpoold without [events] "
				 "(median of the rounds, alternating)",
		.baseline = shared.off,
		.have_base = 1,
		.value = shared.on,
		.have_value = 1,
		.unit = "ops/s",
		.target = "ratio >= 0.9",
		.note = "one subscriber reading every batch over ipc, on the same machine, every "
			"thread left to the scheduler; token pages' keys (SHA-256) are derived for the "
			"events",
	});
	snprintf(params, sizeof(params),
		 "{\"rounds\":%u,\"ops_per_round\":%u,\"kvpoold_cpu_us_per_op_on\":%.1f,"
		 "\"kvpoold_cpu_us_per_op_off\":%.1f}",
		 rounds, per, res0.cpu_on, res0.cpu_off);
	b_row_print(&(struct b_row){
		.name = "events.overhead.no_subscriber",
		.params = params,
		.baseline_what = "the same Insert+Match ops/s on a kvpoold without [events]",
		.baseline = res0.off,
		.have_base = 1,
		.value = res0.on,
		.have_value = 1,
		.unit = "ops/s",
		.target = "ratio >= 0.9 (diagnostic: kvpoold's own cost, no reader on the machine)",
		.note = "events staged, encoded, kept in the replay ring and offered to a PUB socket "
			"with no subscriber",
	});

	lag = calloc(nlag, sizeof(*lag));
	call = calloc(nlag, sizeof(*call));
	if (!lag || !call || lag_run(&a, rd.sub, nlag, lag, call) < 0)
		goto out;
	snprintf(params, sizeof(params), "{\"pages\":%u,\"transport\":\"ipc\"}", nlag);
	b_row_print(&(struct b_row){
		.name = "events.lag_p99",
		.params = params,
		.baseline_what = "p99 of the Alloc + Insert (one key page) + Free calls alone",
		.baseline = p99_us(call, nlag),
		.have_base = 1,
		.value = p99_us(lag, nlag),
		.have_value = 1,
		.unit = "us",
		.target =
			"report (the event is published at the end of the loop turn of the Insert)",
		.note = "from the start of the Alloc to the batch holding the page's BlockStored at "
			"a SUB socket of the same node",
	});
	free(lag);
	free(call);
	rc = 0;
out:
	if (started) {
		atomic_store(&rd.stop, true);
		pthread_join(th, NULL);
	}
	if (zctx) {
		zmq_close(rd.sub);
		zmq_ctx_term(zctx);
	}
	side_stop(&a);
	side_stop(&b);
	{
		char cmd[128];

		snprintf(cmd, sizeof(cmd), "rm -rf %s", g_ipc);
		if (system(cmd) != 0)
			fprintf(stderr, "bench_events: %s failed\n", cmd);
	}
	return rc;
}
