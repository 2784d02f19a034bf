/* bench_rpc_throughput.c - Ping calls/s through kvpoold with 1, 4, 16, 64 client processes and
 * pipeline depth 1 and 16 (raw framed Ping requests: Hello first, then per turn `depth` requests
 * in one write and `depth` replies read back), against the io_uring echo server of
 * echo_server.c serving the same framing on the same kind of socket path, driven by the same
 * client code. kvpoold and the echo server are measured alternately in short windows, best of
 * N windows each, so that bursts of noise on the machine hit both sides alike. The ping_evloop
 * rows drive both with redis-benchmark's client shape instead: one process holding one
 * connection per client in an epoll loop. (redis-server + redis-benchmark is the third column:
 * scripts/bench.sh adds it.) */
#include <signal.h>
#include <stdatomic.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include "bench_net.h"
#include "echo_server.h"

#define MAXCLIENTS 64

struct shared {
	atomic_int ready, go, stop, failed;
	_Alignas(64) atomic_ulong calls[MAXCLIENTS * 8]; /* one cache line per client */
};

/* Counts the complete frames at the front of in[0, *inlen) and drops them. */
static int take_frames(uint8_t *in, size_t *inlen)
{
	size_t off = 0;
	int got = 0;

	while (*inlen - off >= 4) {
		const uint8_t *h = in + off;
		uint32_t l = (uint32_t)h[0] | (uint32_t)h[1] << 8 | (uint32_t)h[2] << 16 |
			     (uint32_t)h[3] << 24;

		if (*inlen - off - 4 < l)
			break;
		off += 4 + l;
		got++;
	}
	memmove(in, in + off, *inlen - off);
	*inlen -= off;
	return got;
}

static void client(struct shared *sh, int idx, const char *sock, int depth)
{
	Kvpool__Request req = KVPOOL__REQUEST__INIT;
	Kvpool__PingReq ping = KVPOOL__PING_REQ__INIT;
	uint8_t *one, *batch, *in;
	size_t len, inlen = 0, incap = 1 << 16;
	int fd = h_raw_connect(sock);

	req.call_case = KVPOOL__REQUEST__CALL_PING;
	req.ping = &ping;
	req.id = 1000;
	ping.nonce = 0x1234;
	if (fd < 0 || bn_hello(fd, "bench-tput") < 0 || kvp_frame_pack(&req.base, &one, &len) < 0)
		goto fail;
	batch = malloc(len * (size_t)depth);
	in = malloc(incap);
	if (!batch || !in)
		goto fail;
	for (int i = 0; i < depth; i++)
		memcpy(batch + len * (size_t)i, one, len);
	atomic_fetch_add(&sh->ready, 1);
	while (!atomic_load(&sh->go))
		usleep(1000);
	while (!atomic_load(&sh->stop)) {
		int got = 0;

		if (bn_write_all(fd, batch, len * (size_t)depth) < 0)
			goto fail;
		while (got < depth) {
			ssize_t k = recv(fd, in + inlen, incap - inlen, 0);

			if (k <= 0)
				goto fail;
			inlen += (size_t)k;
			got += take_frames(in, &inlen);
		}
		atomic_fetch_add_explicit(&sh->calls[idx * 8], (unsigned long)depth,
					  memory_order_relaxed);
	}
	_exit(0);
fail:
	atomic_fetch_add(&sh->failed, 1);
	atomic_fetch_add(&sh->ready, 1);
	_exit(1);
}

/* redis-benchmark's shape: one process, n connections in an epoll loop; each connection sends
 * `depth` requests, waits for their `depth` replies, and sends again. Counts into calls[0]. */
static void evloop_client(struct shared *sh, const char *sock, int n, int depth)
{
	Kvpool__Request req = KVPOOL__REQUEST__INIT;
	Kvpool__PingReq ping = KVPOOL__PING_REQ__INIT;
	struct econn {
		int fd, got;
		size_t inlen;
		uint8_t in[1 << 14];
	} *c = calloc((size_t)n, sizeof(*c));
	uint8_t *one, *batch;
	size_t len;
	int ep = epoll_create1(EPOLL_CLOEXEC);

	req.call_case = KVPOOL__REQUEST__CALL_PING;
	req.ping = &ping;
	req.id = 1000;
	ping.nonce = 0x1234;
	if (!c || ep < 0 || kvp_frame_pack(&req.base, &one, &len) < 0)
		goto fail;
	batch = malloc(len * (size_t)depth);
	if (!batch)
		goto fail;
	for (int i = 0; i < depth; i++)
		memcpy(batch + len * (size_t)i, one, len);
	for (int i = 0; i < n; i++) {
		struct epoll_event ev = { .events = EPOLLIN, .data.u32 = (uint32_t)i };

		c[i].fd = h_raw_connect(sock);
		if (c[i].fd < 0 || bn_hello(c[i].fd, "bench-evloop") < 0 ||
		    epoll_ctl(ep, EPOLL_CTL_ADD, c[i].fd, &ev) < 0)
			goto fail;
	}
	atomic_fetch_add(&sh->ready, 1);
	while (!atomic_load(&sh->go))
		usleep(1000);
	for (int i = 0; i < n; i++)
		if (bn_write_all(c[i].fd, batch, len * (size_t)depth) < 0)
			goto fail;
	while (!atomic_load(&sh->stop)) {
		struct epoll_event evs[64];
		int k = epoll_wait(ep, evs, 64, 100);

		if (k < 0 && errno != EINTR)
			goto fail;
		for (int e = 0; e < k; e++) {
			struct econn *x = &c[evs[e].data.u32];
			ssize_t r = recv(x->fd, x->in + x->inlen, sizeof(x->in) - x->inlen,
					 MSG_DONTWAIT);

			if (r < 0 && (errno == EAGAIN || errno == EINTR))
				continue;
			if (r <= 0)
				goto fail;
			x->inlen += (size_t)r;
			x->got += take_frames(x->in, &x->inlen);
			if (x->got < depth)
				continue;
			x->got -= depth;
			atomic_fetch_add_explicit(&sh->calls[0], (unsigned long)depth,
						  memory_order_relaxed);
			if (bn_write_all(x->fd, batch, len * (size_t)depth) < 0)
				goto fail;
		}
	}
	_exit(0);
fail:
	atomic_fetch_add(&sh->failed, 1);
	atomic_fetch_add(&sh->ready, 1);
	_exit(1);
}

static unsigned long total(struct shared *sh, int n)
{
	unsigned long t = 0;

	for (int i = 0; i < n; i++)
		t += atomic_load(&sh->calls[i * 8]);
	return t;
}

/* Calls/s of n clients at depth against sock over secs (after a warm-up): n client processes,
 * or with evloop one process holding n connections. */
static double measure(struct shared *sh, const char *sock, int n, int depth, double secs,
		      double warm, int evloop)
{
	pid_t pids[MAXCLIENTS];
	int procs = evloop ? 1 : n;
	unsigned long c0, c1;
	double t0, t1;

	memset((void *)sh, 0, sizeof(*sh));
	for (int i = 0; i < procs; i++) {
		pids[i] = fork();
		if (pids[i] == 0) {
			if (evloop)
				evloop_client(sh, sock, n, depth);
			client(sh, i, sock, depth);
		}
		if (pids[i] < 0)
			B_DIE("fork failed");
	}
	n = procs;
	while (atomic_load(&sh->ready) < n)
		usleep(1000);
	atomic_store(&sh->go, 1);
	usleep((useconds_t)(warm * 1e6));
	c0 = total(sh, n);
	t0 = b_now_s();
	usleep((useconds_t)(secs * 1e6));
	c1 = total(sh, n);
	t1 = b_now_s();
	atomic_store(&sh->stop, 1);
	for (int i = 0; i < n; i++)
		waitpid(pids[i], NULL, 0);
	if (atomic_load(&sh->failed))
		B_DIE("%d of %d clients failed against %s", atomic_load(&sh->failed), n, sock);
	return (double)(c1 - c0) / (t1 - t0);
}

int main(int argc, char **argv)
{
	int quick = b_quick(argc, argv);
	const char *only = b_only(argc, argv);
	const int full_clients[] = { 1, 4, 16, 64 }, quick_clients[] = { 1, 4 };
	const int *clients = quick ? quick_clients : full_clients;
	int nclients = quick ? 2 : 4, reps = quick ? 1 : 5;
	const int depths[] = { 1, 16 };
	double secs = quick ? 0.25 : 0.7, warm = quick ? 0.05 : 0.15;
	struct shared *sh =
		mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	static struct daemon d;
	char echo_path[200];

	if (sh == MAP_FAILED)
		B_DIE("mmap failed");
	bn_daemon_start(&d, NULL);
	bn_echo_start(&d, echo_path, sizeof(echo_path));

	for (int evloop = 0; evloop < 2; evloop++) {
		for (int ci = 0; ci < nclients; ci++) {
			for (int di = 0; di < 2; di++) {
				int n = clients[ci], depth = depths[di];
				int nreps = evloop ? (quick ? 1 : 3) : reps;
				const char *name = b_fmt("rpc.throughput.%s.c%d.d%d",
							 evloop ? "ping_evloop" : "ping", n, depth);
				double best_k = 0, best_e = 0, k, e;

				if (!b_wanted(only, name))
					continue;
				for (int r = 0; r < nreps; r++) {
					k = measure(sh, d.sock, n, depth, secs, warm, evloop);
					e = measure(sh, echo_path, n, depth, secs, warm, evloop);

					best_k = k > best_k ? k : best_k;
					best_e = e > best_e ? e : best_e;
				}
				b_row_print(&(struct b_row){
					.name = name,
					.params = b_fmt(
						"{\"clients\":%d,\"client_kind\":\"%s\","
						"\"pipeline\":%d,\"seconds\":%.2f,\"best_of\":%d,"
						"\"call\":\"Ping\"}",
						n,
						evloop ? "one process, a connection per client"
						       : "processes",
						depth, secs, nreps),
					.baseline_what = "io_uring frame echo server (tests/bench/"
							 "echo_server.c), same clients (calls/s)",
					.baseline = best_e,
					.have_base = 1,
					.value = best_k,
					.have_value = 1,
					.unit = "calls/s",
					.target = "ratio >= 0.60" });
			}
		}
	}
	bn_cleanup();
	return 0;
}
