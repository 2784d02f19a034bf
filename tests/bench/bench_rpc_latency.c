/* bench_rpc_latency.c - Alloc(1 page) + Free round trip through libkvpool (kvp_lease_alloc +
 * kvp_lease_free against a kvpoold this program starts on a temporary socket), one client, p50 and
 * p99, against a raw unix-socket ping-pong between two processes with the same four frame sizes
 * (Alloc request, Alloc reply, Free request, Free reply, packed with kvp_frame_pack from the same
 * protobuf messages): two raw round trips per pair, the transport's limit. A second baseline is
 * the io_uring frame echo server of echo_server.c (same frames, a reply as long as the request):
 * a server that waits in io_uring_enter like kvpoold does, which on some VMs wakes up much more
 * slowly than a blocking recv; the rows against it separate kvpoold's own cost from that.
 * All three are measured in alternating blocks so that noise on the machine falls on each.
 * Then the same again with the processes pinned (diagnostic rows) to the first two CPUs it may
 * use: all on the first (same_cpu), and the client on the first with kvpoold and both peers on
 * the second (cross_cpu). The spec rows leave the placement to the scheduler, which on a VM
 * whose idle vCPUs halt makes a large difference: a wake-up across vCPUs there costs as much as
 * a hundred microseconds. */
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>

#include "bench_net.h"
#include "echo_server.h"
#include "kvpool.h"

#define BLOCK 1000

static size_t packed_size(const ProtobufCMessage *m)
{
	uint8_t *b;
	size_t n;

	if (kvp_frame_pack(m, &b, &n) < 0)
		B_DIE("kvp_frame_pack failed");
	free(b);
	return n;
}

/* Frame sizes of Alloc/Free as libkvpool and kvpoold send them, with the live values. */
static void frame_sizes(uint64_t req_id, uint32_t pool_id, uint64_t lease, uint32_t page,
			size_t sz[4])
{
	Kvpool__Request rq = KVPOOL__REQUEST__INIT;
	Kvpool__Response rs = KVPOOL__RESPONSE__INIT;
	Kvpool__Status st = KVPOOL__STATUS__INIT;
	Kvpool__AllocReq areq = KVPOOL__ALLOC_REQ__INIT;
	Kvpool__AllocResp aresp = KVPOOL__ALLOC_RESP__INIT;
	Kvpool__FreeReq freq = KVPOOL__FREE_REQ__INIT;
	Kvpool__FreeResp fresp = KVPOOL__FREE_RESP__INIT;

	areq.pool_id = pool_id;
	areq.pages = 1;
	areq.tier = KVPOOL__TIER__DEVICE;
	rq.id = req_id;
	rq.call_case = KVPOOL__REQUEST__CALL_ALLOC;
	rq.alloc = &areq;
	sz[0] = packed_size(&rq.base);
	aresp.lease_id = lease;
	aresp.tier = KVPOOL__TIER__DEVICE;
	aresp.n_pages = 1;
	aresp.pages = &page;
	rs.id = req_id;
	rs.status = &st;
	rs.result_case = KVPOOL__RESPONSE__RESULT_ALLOC;
	rs.alloc = &aresp;
	sz[1] = packed_size(&rs.base);
	freq.lease_id = lease;
	rq.id = req_id + 1;
	rq.call_case = KVPOOL__REQUEST__CALL_FREE;
	rq.free = &freq;
	sz[2] = packed_size(&rq.base);
	fresp.freed_pages = 1;
	fresp.lease_pages = 0;
	rs.id = req_id + 1;
	rs.result_case = KVPOOL__RESPONSE__RESULT_FREE;
	rs.free = &fresp;
	sz[3] = packed_size(&rs.base);
}

/* The raw peer: per pair, read an Alloc-sized request, write an Alloc-sized reply, same for
 * Free. Exits at EOF. */
static void raw_server(int lfd, const size_t sz[4])
{
	uint8_t in[256], out[256] = { 0 };
	int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);

	if (fd < 0)
		_exit(1);
	for (;;) {
		for (int k = 0; k < 4; k += 2) {
			if (bn_read_all(fd, in, sz[k]) < 0)
				_exit(0);
			if (bn_write_all(fd, out, sz[k + 1]) < 0)
				_exit(1);
		}
	}
}

struct sides {
	struct kvp_pool *p;
	int fd, efd;
	const size_t *sz;
	uint8_t (*ef)[256];
};

/* Alternating blocks of BLOCK pairs: kvpool, the raw peer, the io_uring echo server. */
static void run_blocks(const struct sides *x, uint32_t blocks, uint64_t *lk, uint64_t *lr,
		       uint64_t *lu)
{
	uint8_t buf[256] = { 0 };
	struct kvp_error e;
	uint64_t lease;
	uint32_t page;
	const size_t *sz = x->sz;

	for (uint32_t b = 0; b < blocks; b++) {
		for (uint32_t i = 0; i < BLOCK; i++) {
			uint64_t t0 = b_now_ns();

			if (kvp_lease_alloc(x->p, KVP_TIER_DEVICE, 1, &lease, &page, &e) < 0 ||
			    kvp_lease_free(x->p, lease, NULL, 0, &e) < 0)
				B_DIE("alloc/free: %s", e.message);
			lk[b * BLOCK + i] = b_now_ns() - t0;
		}
		for (uint32_t i = 0; i < BLOCK; i++) {
			uint64_t t0 = b_now_ns();

			for (int k = 0; k < 4; k += 2)
				if (bn_write_all(x->fd, buf, sz[k]) < 0 ||
				    bn_read_all(x->fd, buf, sz[k + 1]) < 0)
					B_DIE("raw ping-pong failed");
			lr[b * BLOCK + i] = b_now_ns() - t0;
		}
		for (uint32_t i = 0; i < BLOCK; i++) {
			uint64_t t0 = b_now_ns();

			for (int k = 0; k < 2; k++)
				if (bn_write_all(x->efd, x->ef[k], sz[2 * k]) < 0 ||
				    bn_read_all(x->efd, buf, sz[2 * k]) < 0)
					B_DIE("echo ping-pong failed");
			lu[b * BLOCK + i] = b_now_ns() - t0;
		}
	}
}

/* Pins pid (0: this process) to one CPU. */
static int pin(pid_t pid, int cpu)
{
	cpu_set_t set;

	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	return sched_setaffinity(pid, sizeof(set), &set);
}

/* p50 and p99 rows of one run: kvpool against the raw peer (targets only for the spec row,
 * unpinned) and against the echo server. */
static void rows(const char *prefix, const char *placement, size_t n, const size_t sz[4],
		 uint64_t *lk, uint64_t *lr, uint64_t *lu, int spec)
{
	const double q[2] = { 0.50, 0.99 };
	const char *const qn[2] = { "p50", "p99" };
	const char *const targets[2] = { "ratio <= 1.5", "ratio <= 3" };

	for (int i = 0; i < 2; i++) {
		double vk = (double)b_quantile(lk, n, q[i]) / 1e3;
		double vr = (double)b_quantile(lr, n, q[i]) / 1e3;
		double vu = (double)b_quantile(lu, n, q[i]) / 1e3;
		const char *pl = placement[0] ? b_fmt(",\"placement\":\"%s\"", placement) : "";

		b_row_print(&(struct b_row){
			.name = b_fmt("%s.%s", prefix, qn[i]),
			.params = b_fmt("{\"clients\":1,\"pairs\":%zu,\"block\":%u,"
					"\"frames_bytes\":{\"alloc_req\":%zu,\"alloc_resp\":%zu,"
					"\"free_req\":%zu,\"free_resp\":%zu},\"pages\":1%s}",
					n, BLOCK, sz[0], sz[1], sz[2], sz[3], pl),
			.baseline_what =
				"raw unix-socket ping-pong, 2 processes, same 4 frame sizes "
				"(2 round trips, us)",
			.baseline = vr,
			.have_base = 1,
			.value = vk,
			.have_value = 1,
			.unit = "us per Alloc+Free",
			.target = spec ? targets[i] : "diagnostic: placement" });
		b_row_print(&(struct b_row){
			.name = b_fmt("%s_vs_uring_echo.%s", prefix, qn[i]),
			.params = b_fmt("{\"clients\":1,\"pairs\":%zu,\"block\":%u,"
					"\"frames_bytes\":[%zu,%zu],\"pages\":1%s}",
					n, BLOCK, sz[0], sz[2], pl),
			.baseline_what = "io_uring frame echo server (echo_server.c), frames of "
					 "the Alloc and Free request sizes (2 round trips, us)",
			.baseline = vu,
			.have_base = 1,
			.value = vk,
			.have_value = 1,
			.unit = "us per Alloc+Free",
			.target = "diagnostic: kvpoold's own cost" });
	}
}

int main(int argc, char **argv)
{
	int quick = b_quick(argc, argv);
	uint32_t blocks = quick ? 3 : 40; /* per side */
	uint64_t *lk = malloc(sizeof(uint64_t) * blocks * BLOCK);
	uint64_t *lr = malloc(sizeof(uint64_t) * blocks * BLOCK);
	uint64_t *lu = malloc(sizeof(uint64_t) * blocks * BLOCK);
	uint8_t ef[2][256] = { { 0 } };
	int efd;
	static struct daemon d;
	struct kvp_error e;
	struct kvp_client *c;
	struct kvp_pool *p;
	uint64_t lease;
	uint32_t page;
	size_t sz[4];
	char path[200];
	uint8_t buf[256] = { 0 };
	int lfd, fd;
	pid_t srv, echo;

	if (!lk || !lr || !lu)
		B_DIE("out of memory");
	bn_daemon_start(&d, NULL);
	c = kvp_client_connect(d.sock, "bench-latency", &e);
	if (!c)
		B_DIE("connect: %s", e.message);
	p = kvp_pool_attach(c, "default", NULL, &e);
	if (!p)
		B_DIE("attach default: %s", e.message);
	/* warm up, and take live values for the frame sizes from the middle of the run */
	for (int i = 0; i < 2000; i++) {
		if (kvp_lease_alloc(p, KVP_TIER_DEVICE, 1, &lease, &page, &e) < 0 ||
		    kvp_lease_free(p, lease, NULL, 0, &e) < 0)
			B_DIE("alloc/free: %s", e.message);
	}
	frame_sizes(2000 + (uint64_t)blocks * BLOCK, kvp_pool_id(p),
		    lease + (uint64_t)blocks * BLOCK, page, sz);

	snprintf(path, sizeof(path), "%s/raw.sock", d.dir);
	lfd = bn_listen(path);
	srv = fork();
	if (srv == 0)
		raw_server(lfd, sz);
	bn_kid(srv);
	close(lfd);
	fd = h_raw_connect(path);
	if (fd < 0)
		B_DIE("connect to the raw peer failed");
	for (int i = 0; i < 2000; i++) /* warm up */
		for (int k = 0; k < 4; k += 2)
			if (bn_write_all(fd, buf, sz[k]) < 0 || bn_read_all(fd, buf, sz[k + 1]) < 0)
				B_DIE("raw ping-pong failed");

	/* the io_uring echo server, with framed Alloc- and Free-request-sized frames */
	echo = bn_echo_start(&d, path, sizeof(path));
	efd = h_raw_connect(path);
	if (efd < 0)
		B_DIE("connect to the echo server failed");
	for (int k = 0; k < 2; k++) {
		uint32_t l = (uint32_t)sz[2 * k] - KVP_FRAME_HDR;

		ef[k][0] = (uint8_t)l, ef[k][1] = (uint8_t)(l >> 8);
		ef[k][2] = (uint8_t)(l >> 16), ef[k][3] = (uint8_t)(l >> 24);
	}
	for (int i = 0; i < 2000; i++) /* warm up */
		for (int k = 0; k < 2; k++)
			if (bn_write_all(efd, ef[k], sz[2 * k]) < 0 ||
			    bn_read_all(efd, buf, sz[2 * k]) < 0)
				B_DIE("echo ping-pong failed");

	run_blocks(&(struct sides){ p, fd, efd, sz, ef }, blocks, lk, lr, lu);
	rows("rpc.latency.alloc_free", "", (size_t)blocks * BLOCK, sz, lk, lr, lu, 1);
	/* The same on pinned CPUs (the first two this process may use): the placement the
	 * scheduler chose above can be either. A row whose pinning fails is left out. */
	{
		uint32_t pb = quick ? 1 : 15;
		pid_t servers[3] = { d.pid, srv, echo };
		int cpu[2], ncpu = 0;
		cpu_set_t allowed;

		CPU_ZERO(&allowed);
		if (sched_getaffinity(0, sizeof(allowed), &allowed) == 0)
			for (int c = 0; c < CPU_SETSIZE && ncpu < 2; c++)
				if (CPU_ISSET(c, &allowed))
					cpu[ncpu++] = c;
		for (int cross = 0; cross < ncpu; cross++) {
			int ok = pin(0, cpu[0]) == 0;

			for (int k = 0; k < 3; k++)
				ok &= pin(servers[k], cpu[cross]) == 0;
			if (!ok) {
				fprintf(stderr, "bench: pinning to CPU %d failed: %s; no %s rows\n",
					cpu[cross], strerror(errno),
					cross ? "cross_cpu" : "same_cpu");
				continue;
			}
			run_blocks(&(struct sides){ p, fd, efd, sz, ef }, pb, lk, lr, lu);
			rows(cross ? "rpc.latency.alloc_free.cross_cpu"
				   : "rpc.latency.alloc_free.same_cpu",
			     cross ? b_fmt("client on CPU %d, servers on CPU %d", cpu[0], cpu[1])
				   : b_fmt("client and servers on CPU %d", cpu[0]),
			     (size_t)pb * BLOCK, sz, lk, lr, lu, 0);
		}
	}
	close(fd);
	close(efd);
	kvp_pool_detach(p, NULL);
	kvp_client_close(c);
	bn_cleanup();

	free(lk);
	free(lr);
	free(lu);
	return 0;
}
