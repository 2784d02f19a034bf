/* bench_reserve.c - the page reserve's fast path (kvp_lease_alloc + kvp_lease_free of one page
 * served from the shared rings, no system call) against today's RPC Alloc + Free and against a
 * raw unix-socket ping-pong (two round trips, as an Alloc + Free needs): p50 and p99 of one
 * client. Then Alloc + Free operations per second of 1, 4, 16 and 64 client processes, each
 * with its reserve, against redis-server INCR from the same number of processes (hiredis,
 * pipelined 32 deep, over a unix socket). Then both again with the reserve exhausted (kvpoold
 * has no free pages to spare for refills, so every call falls back to the RPC) against today's
 * RPC rows. kvpoold runs on a temporary socket with reserve_free_percent = 1 so that leaving
 * fewer than 100 free pages exhausts every reserve. */
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>

#include "bench_net.h"
#include "kvp_config.h"
#include "kvpool.h"
#if KVP_HAVE_REMOTE
#include <hiredis/hiredis.h>
#endif

#define PAGES 65536u
#define RESV 256u
#define PIPE_DEPTH 32

static struct daemon g_d;

static const char *const g_conf = "[daemon]\n"
				  "reserve_max_pages = 256\n"
				  "reserve_free_percent = 1\n"
				  "max_sessions = 1024\n"
				  "keepalive_ms = 3600000\n"
				  "[pool.bench]\n"
				  "layers = 1\nkv_heads = 1\nhead_dim = 8\ndtype = fp16\n"
				  "page_tokens = 16\ndevice = sim\ndevice_capacity = 1048576t\n"
				  "host_capacity = 0\nmlock = off\n";

enum mode { M_RESERVE, M_RPC, M_REDIS };

static struct kvp_pool *attach(struct kvp_client **c, enum mode m)
{
	struct kvp_pool_opts o = { .struct_size = sizeof(o) };
	struct kvp_error e;
	struct kvp_pool *p;

	*c = kvp_client_connect(g_d.sock, "bench-reserve", &e);
	if (!*c)
		B_DIE("connect: %s", e.message);
	if (m == M_RESERVE)
		o.reserve_pages[KVP_TIER_DEVICE] = RESV;
	p = kvp_pool_attach_opts(*c, "bench", &o, &e);
	if (!p)
		B_DIE("attach: %s", e.message);
	return p;
}

static void alloc_free(struct kvp_pool *p)
{
	struct kvp_error e;
	uint64_t id;
	uint32_t pg;

	if (kvp_lease_alloc(p, KVP_TIER_DEVICE, 1, &id, &pg, &e) < 0 ||
	    kvp_lease_free(p, id, NULL, 0, &e) < 0)
		B_DIE("alloc/free: %s", e.message);
}

/* ---- latency, one client ---- */

static void lat_kvpool(struct kvp_pool *p, uint64_t *lat, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		uint64_t t0 = b_now_ns();

		alloc_free(p);
		lat[i] = b_now_ns() - t0;
	}
}

/* A peer answering each frame of `req` bytes with `resp` bytes, twice per pair. */
static pid_t raw_peer(int *fd)
{
	int sv[2];
	pid_t pid;

	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		B_DIE("socketpair: %s", strerror(errno));
	pid = fork();
	if (pid == 0) {
		uint8_t buf[64];

		close(sv[0]);
		for (;;) {
			if (bn_read_all(sv[1], buf, 16) < 0 || bn_write_all(sv[1], buf, 24) < 0)
				_exit(0);
		}
	}
	close(sv[1]);
	bn_kid(pid);
	*fd = sv[0];
	return pid;
}

static void lat_raw(int fd, uint64_t *lat, size_t n)
{
	uint8_t buf[64] = { 0 };

	for (size_t i = 0; i < n; i++) {
		uint64_t t0 = b_now_ns();

		for (int k = 0; k < 2; k++)
			if (bn_write_all(fd, buf, 16) < 0 || bn_read_all(fd, buf, 24) < 0)
				B_DIE("raw ping-pong failed");
		lat[i] = b_now_ns() - t0;
	}
}

static void lat_row(const char *name, const char *what, const char *target, uint64_t *v, size_t n,
		    uint64_t *base, size_t nb, double q)
{
	b_row_print(&(struct b_row){
		.name = name,
		.params = b_fmt("{\"clients\":1,\"pairs\":%zu,\"baseline_pairs\":%zu,\"pages\":1,"
				"\"reserve_pages\":%u}",
				n, nb, RESV),
		.baseline_what = what,
		.baseline = (double)b_quantile(base, nb, q) / 1e3,
		.have_base = 1,
		.value = (double)b_quantile(v, n, q) / 1e3,
		.have_value = 1,
		.unit = "us per Alloc+Free",
		.target = target });
}

/* ---- throughput, many client processes ---- */

#if KVP_HAVE_REMOTE
static char g_redis_sock[256];
static pid_t g_redis;

static int redis_start(void)
{
	char dir[128];

	snprintf(dir, sizeof(dir), "%s", g_d.dir);
	snprintf(g_redis_sock, sizeof(g_redis_sock), "%s/redis.sock", dir);
	g_redis = fork();
	if (g_redis == 0) {
		int null = open("/dev/null", O_WRONLY);

		if (null >= 0) {
			dup2(null, 1);
			dup2(null, 2);
		}
		prctl(PR_SET_PDEATHSIG, SIGKILL); /* gone with the bench, however it ends */
		execlp("redis-server", "redis-server", "--port", "0", "--unixsocket", g_redis_sock,
		       "--save", "", "--appendonly", "no", "--dir", dir, (char *)NULL);
		_exit(127);
	}
	if (g_redis < 0)
		return -1;
	bn_kid(g_redis);
	for (int i = 0; i < 200; i++) {
		redisContext *c = redisConnectUnix(g_redis_sock);

		if (c && !c->err) {
			redisFree(c);
			return 0;
		}
		redisFree(c);
		if (waitpid(g_redis, NULL, WNOHANG) == g_redis)
			return -1;
		usleep(20000);
	}
	return -1;
}

static uint64_t redis_loop(int k, double secs, int ready, int go)
{
	redisContext *c = redisConnectUnix(g_redis_sock);
	char key[32];
	uint64_t n = 0;
	uint64_t end;

	if (!c || c->err)
		_exit(2);
	snprintf(key, sizeof(key), "kvp-bench-%d", k);
	if (write(ready, "r", 1) != 1)
		_exit(2);
	{
		struct pollfd pf = { .fd = go, .events = POLLIN };

		poll(&pf, 1, -1);
	}
	end = b_now_ns() + (uint64_t)(secs * 1e9);
	while (b_now_ns() < end) {
		redisReply *r;

		for (int i = 0; i < PIPE_DEPTH; i++)
			redisAppendCommand(c, "INCR %s", key);
		for (int i = 0; i < PIPE_DEPTH; i++) {
			if (redisGetReply(c, (void **)&r) != REDIS_OK)
				_exit(2);
			freeReplyObject(r);
		}
		n += PIPE_DEPTH;
	}
	redisFree(c);
	return n;
}
#endif

static uint64_t kvpool_loop(enum mode m, double secs, int ready, int go)
{
	struct kvp_client *c;
	struct kvp_pool *p = attach(&c, m);
	struct pollfd pf = { .fd = go, .events = POLLIN };
	uint64_t n = 0, end;

	for (int i = 0; i < 100; i++)
		alloc_free(p);
	if (write(ready, "r", 1) != 1)
		_exit(2);
	poll(&pf, 1, -1);
	end = b_now_ns() + (uint64_t)(secs * 1e9);
	while (b_now_ns() < end) {
		for (int i = 0; i < 64; i++)
			alloc_free(p);
		n += 64;
	}
	kvp_client_close(c);
	return n;
}

/* nproc processes in mode m for secs after all are ready: their operations per second. */
static double run_clients(int nproc, enum mode m, double secs)
{
	int ready[2], go[2], res[2];
	pid_t pid[64];
	uint64_t total = 0;
	char b;

	if (pipe(ready) < 0 || pipe(go) < 0 || pipe(res) < 0)
		B_DIE("pipe: %s", strerror(errno));
	for (int i = 0; i < nproc; i++) {
		pid[i] = fork();
		if (pid[i] == 0) {
			uint64_t n = 0;

			close(go[1]);
#if KVP_HAVE_REMOTE
			if (m == M_REDIS)
				n = redis_loop(i, secs, ready[1], go[0]);
			else
#endif
				n = kvpool_loop(m, secs, ready[1], go[0]);
			if (write(res[1], &n, sizeof(n)) != sizeof(n))
				_exit(2);
			_exit(0);
		}
	}
	close(ready[1]);
	close(res[1]);
	for (int i = 0; i < nproc; i++)
		if (read(ready[0], &b, 1) != 1)
			B_DIE("a client process failed to start");
	close(go[1]); /* every client starts now */
	for (int i = 0; i < nproc; i++) {
		uint64_t n;

		if (read(res[0], &n, sizeof(n)) != (ssize_t)sizeof(n))
			B_DIE("a client process failed");
		total += n;
	}
	for (int i = 0; i < nproc; i++)
		waitpid(pid[i], NULL, 0);
	close(ready[0]);
	close(go[0]);
	close(res[0]);
	return (double)total / secs;
}

/* A session leasing every free page but `leave`, by calls; returned by closing it. */
static struct kvp_client *hog(uint32_t leave)
{
	struct kvp_client *c;
	struct kvp_pool *p = attach(&c, M_RPC);
	static struct kvp_status st;
	struct kvp_error e;
	uint64_t id, fr;
	uint32_t *pages;

	st.struct_size = sizeof(st);
	if (kvp_client_status(c, &st, &e) < 0)
		B_DIE("status: %s", e.message);
	fr = st.pools[0].tiers[KVP_TIER_DEVICE].free_tokens / 16;
	if (fr <= leave)
		return c;
	pages = malloc(sizeof(uint32_t) * fr);
	for (uint64_t left = fr - leave; left;) {
		uint32_t n = left > 8192 ? 8192 : (uint32_t)left;

		if (!pages || kvp_lease_alloc(p, KVP_TIER_DEVICE, n, &id, pages, &e) < 0)
			B_DIE("hog: %s", e.message);
		left -= n;
	}
	free(pages);
	return c;
}

int main(int argc, char **argv)
{
	int quick = b_quick(argc, argv);
	size_t n = quick ? 20000 : 200000, nr = quick ? 3000 : 30000;
	double secs = quick ? 0.3 : 2.0;
	const int procs[] = { 1, 4, 16, 64 };
	uint64_t *fast = malloc(sizeof(uint64_t) * n), *rpc = malloc(sizeof(uint64_t) * nr);
	uint64_t *raw = malloc(sizeof(uint64_t) * nr), *exh = malloc(sizeof(uint64_t) * nr);
	struct kvp_client *cf, *cr, *ch;
	struct kvp_pool *pf, *pr;
	double rpc_ops[4], redis_ops[4];
	int have_redis = 0, fd;

	if (!fast || !rpc || !raw || !exh)
		B_DIE("out of memory");
	bn_daemon_start(&g_d, g_conf);
	pf = attach(&cf, M_RESERVE);
	pr = attach(&cr, M_RPC);
	raw_peer(&fd);
	for (int i = 0; i < 2000; i++) {
		alloc_free(pf);
		alloc_free(pr);
	}
	/* alternate kvpool sides and the raw peer in blocks, so noise falls on each */
	for (size_t b = 0; b < 10; b++) {
		lat_kvpool(pf, fast + b * (n / 10), n / 10);
		lat_kvpool(pr, rpc + b * (nr / 10), nr / 10);
		lat_raw(fd, raw + b * (nr / 10), nr / 10);
	}
	for (int q = 0; q < 2; q++) {
		double qq = q ? 0.99 : 0.50;
		const char *qn = q ? "p99" : "p50";

		lat_row(b_fmt("reserve.latency.alloc_free.%s", qn),
			"raw unix-socket ping-pong, 2 processes, 2 round trips (us)",
			q ? "none" : "value <= 1 us and ratio <= 1/15", fast, n, raw, nr, qq);
		lat_row(b_fmt("reserve.latency.alloc_free_vs_rpc.%s", qn),
			"today's RPC kvp_lease_alloc + kvp_lease_free, no reserve (us)", "none",
			fast, n, rpc, nr, qq);
	}

#if KVP_HAVE_REMOTE
	have_redis = redis_start() == 0;
	if (!have_redis)
		fprintf(stderr, "bench: redis-server did not start: no INCR baseline\n");
#endif
	for (int i = 0; i < 4; i++) {
		double v = run_clients(procs[i], M_RESERVE, secs);

		redis_ops[i] = have_redis ? run_clients(procs[i], M_REDIS, secs) : 0;
		b_row_print(&(struct b_row){
			.name = b_fmt("reserve.throughput.alloc_free.clients%d", procs[i]),
			.params = b_fmt("{\"clients\":%d,\"seconds\":%.2f,\"pages\":1,"
					"\"reserve_pages\":%u,\"redis_pipeline\":%d}",
					procs[i], secs, RESV, PIPE_DEPTH),
			.baseline_what = "redis-server INCR, same processes, hiredis pipelined 32 "
					 "deep over a unix socket (ops/s)",
			.baseline = redis_ops[i],
			.have_base = have_redis,
			.value = v,
			.have_value = 1,
			.unit = "Alloc+Free/s",
			.target = "ratio >= 2",
			.note = have_redis ? "" : "skipped baseline: no redis-server" });
	}
	/* Exhausted: fewer than 100 free pages, so no refill gives anything (1% of them). */
	lat_kvpool(pr, rpc, nr); /* today's rows again, just before, under the same load */
	ch = hog(96);
	{
		struct kvp_client *ce;
		struct kvp_pool *pe = attach(&ce, M_RESERVE);

		if (kvp_pool_reserve_pages(pe, KVP_TIER_DEVICE) != RESV)
			B_DIE("reserve not granted");
		for (int i = 0; i < 200; i++)
			alloc_free(pe);
		for (size_t b = 0; b < 10; b++) {
			lat_kvpool(pe, exh + b * (nr / 10), nr / 10);
			lat_kvpool(pr, rpc + b * (nr / 10), nr / 10);
		}
		for (int q = 0; q < 2; q++)
			lat_row(b_fmt("reserve.latency.exhausted.alloc_free.%s", q ? "p99" : "p50"),
				"today's RPC kvp_lease_alloc + kvp_lease_free, no reserve (us)",
				"ratio <= 1 (no worse than the RPC)", exh, nr, rpc, nr,
				q ? 0.99 : 0.5);
		kvp_client_close(ce);
	}
	for (int i = 0; i < 4; i++) {
		double v = 0;

		/* alternating with today's RPC clients, in the same pool state; best of two */
		rpc_ops[i] = 0;
		for (int k = 0; k < 2; k++) {
			double a = run_clients(procs[i], M_RPC, secs);
			double b = run_clients(procs[i], M_RESERVE, secs);

			rpc_ops[i] = a > rpc_ops[i] ? a : rpc_ops[i];
			v = b > v ? b : v;
		}
		b_row_print(&(struct b_row){
			.name = b_fmt("reserve.throughput.exhausted.alloc_free.clients%d",
				      procs[i]),
			.params = b_fmt("{\"clients\":%d,\"seconds\":%.2f,\"pages\":1,"
					"\"reserve_pages\":%u,\"free_pages\":96}",
					procs[i], secs, RESV),
			.baseline_what = "today's RPC Alloc+Free, same processes, no reserve, "
					 "alternating with these runs (ops/s, best of 2 each)",
			.baseline = rpc_ops[i],
			.have_base = 1,
			.value = v,
			.have_value = 1,
			.unit = "Alloc+Free/s",
			.target = "ratio >= 1 (no worse than the RPC)" });
	}
	kvp_client_close(ch);
	kvp_client_close(cf);
	kvp_client_close(cr);
	close(fd);
	bn_cleanup();
	free(fast);
	free(rpc);
	free(raw);
	free(exh);
	return 0;
}
