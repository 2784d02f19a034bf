/* test_cuda_tier.c - CUnit suite "cuda_tier": device tier memory exported as a POSIX fd
 * (kernels/cuda_drv.c), and the cuda tier backend through its operations table
 * (daemon/pool/tier_cuda.c: create, adopt of the exported fd, copies to and from a memfd host
 * tier). The parent creates a kvp_cuda_mem and writes a pattern; a child process receives the fd
 * over a socketpair with SCM_RIGHTS, imports and maps it, checks the pattern and writes a reply
 * pattern that the parent then checks. The child is this binary re-executed (fork + exec): CUDA
 * cannot be used in a child forked after the parent initialised it, and a real client is a separate
 * program anyway. Exits 77 (skipped) when kvp_cuda_probe finds no GPU.
 */
#include <CUnit/Basic.h>
#include <cuda_runtime_api.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cuda_drv.h"
#include "kv_copy.h"
#include "suite.h"
#include "tier.h"

#define REQ_BYTES ((64ull << 20) + 1) /* rounded up to the granularity */

/* what the parent sends along with the fd */
struct share_msg {
	uint64_t bytes;
	int32_t device;
};

static const char *g_self;

static unsigned char pattern(uint64_t i, unsigned seed)
{
	return (unsigned char)((i * 2654435761u >> 7) ^ seed);
}

static int send_fd(int sock, int fd, const void *data, size_t len)
{
	char cbuf[CMSG_SPACE(sizeof(int))];
	struct iovec iov = { .iov_base = (void *)data, .iov_len = len };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
	struct cmsghdr *cm;

	memset(cbuf, 0, sizeof(cbuf));
	mh.msg_control = cbuf;
	mh.msg_controllen = sizeof(cbuf);
	cm = CMSG_FIRSTHDR(&mh);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &fd, sizeof(int));
	return sendmsg(sock, &mh, MSG_NOSIGNAL) == (ssize_t)len ? 0 : -1;
}

static int recv_fd(int sock, int *fd, void *data, size_t len)
{
	char cbuf[CMSG_SPACE(sizeof(int))];
	struct iovec iov = { .iov_base = data, .iov_len = len };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
	struct cmsghdr *cm;

	mh.msg_control = cbuf;
	mh.msg_controllen = sizeof(cbuf);
	if (recvmsg(sock, &mh, MSG_CMSG_CLOEXEC) != (ssize_t)len)
		return -1;
	cm = CMSG_FIRSTHDR(&mh);
	if (!cm || cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
		return -1;
	memcpy(fd, CMSG_DATA(cm), sizeof(int));
	return 0;
}

/* Child: import, check the parent's pattern in the first half, write ours in the second half,
 * reply with one line ("ok" or what went wrong). */
static int child_main(int sock)
{
	struct kvp_cuda_mem m;
	struct share_msg msg;
	char reason[256] = "", reply[320];
	unsigned char *buf = NULL;
	uint64_t half, bad = UINT64_MAX;
	int fd = -1, ret;

	if (recv_fd(sock, &fd, &msg, sizeof(msg))) {
		snprintf(reply, sizeof(reply), "child: recvmsg: %s", strerror(errno));
		goto out;
	}
	ret = kvp_cuda_mem_import(msg.device, fd, msg.bytes, &m, reason, sizeof(reason));
	if (ret) {
		snprintf(reply, sizeof(reply), "child: kvp_cuda_mem_import = %d: %s", ret, reason);
		close(fd);
		goto out;
	}
	/* the import does not own the fd: still open, and closing it keeps the mapping */
	if (m.fd != -1 || fcntl(fd, F_GETFD) < 0) {
		snprintf(reply, sizeof(reply), "child: import took the fd (m.fd %d)", m.fd);
		close(fd);
		goto out_destroy;
	}
	close(fd);
	half = m.bytes / 2;
	buf = malloc(half);
	if (!buf || cudaSetDevice(msg.device) != cudaSuccess ||
	    cudaMemcpy(buf, (void *)(uintptr_t)m.dptr, half, cudaMemcpyDeviceToHost) !=
		    cudaSuccess) {
		snprintf(reply, sizeof(reply), "child: reading the mapping: %s",
			 cudaGetErrorString(cudaGetLastError()));
		goto out_destroy;
	}
	for (uint64_t i = 0; i < half && bad == UINT64_MAX; i++)
		if (buf[i] != pattern(i, 0x11))
			bad = i;
	if (bad != UINT64_MAX) {
		snprintf(reply, sizeof(reply), "child: byte %llu is %#x, expected %#x",
			 (unsigned long long)bad, buf[bad], pattern(bad, 0x11));
		goto out_destroy;
	}
	for (uint64_t i = 0; i < half; i++)
		buf[i] = pattern(i, 0x77);
	if (cudaMemcpy((void *)(uintptr_t)(m.dptr + half), buf, half, cudaMemcpyHostToDevice) !=
		    cudaSuccess ||
	    cudaDeviceSynchronize() != cudaSuccess) {
		snprintf(reply, sizeof(reply), "child: writing the mapping: %s",
			 cudaGetErrorString(cudaGetLastError()));
		goto out_destroy;
	}
	snprintf(reply, sizeof(reply), "ok");
out_destroy:
	kvp_cuda_mem_destroy(&m);
out:
	free(buf);
	if (write(sock, reply, strlen(reply) + 1) < 0)
		return 1;
	return strcmp(reply, "ok") ? 1 : 0;
}

static void test_kvp_cuda_probe_count(void)
{
	char reason[256] = "";
	int n = kvp_cuda_probe(reason, sizeof(reason));

	CU_ASSERT(n >= 1);
	CU_ASSERT(kvp_cuda_device_numa_node(0) >= -1);
	CU_ASSERT_EQUAL(kvp_cuda_device_numa_node(-1), -1);
	CU_ASSERT_EQUAL(kvp_cuda_device_numa_node(1 << 20), -1);
}

static void test_kvp_cuda_mem_create_share(void)
{
	struct share_msg msg = { .device = 0 };
	struct kvp_cuda_mem m;
	char reason[256] = "", reply[320] = "", fdarg[16];
	unsigned char *buf;
	uint64_t half, bad = UINT64_MAX;
	int sv[2], status = 0, ret;
	ssize_t got;
	pid_t pid;

	ret = kvp_cuda_mem_create(0, REQ_BYTES, &m, reason, sizeof(reason));
	if (ret)
		fprintf(stderr, "\n  kvp_cuda_mem_create: %d: %s\n", ret, reason);
	CU_ASSERT_FATAL(ret == 0);
	CU_ASSERT(m.bytes >= REQ_BYTES);
	CU_ASSERT(m.granularity > 0 && m.bytes % m.granularity == 0);
	CU_ASSERT(m.fd >= 0 && (fcntl(m.fd, F_GETFD) & FD_CLOEXEC));
	CU_ASSERT(m.dptr != 0);
	CU_ASSERT_EQUAL(m.device, 0);

	half = m.bytes / 2;
	buf = malloc(half);
	CU_ASSERT_FATAL(buf != NULL);
	for (uint64_t i = 0; i < half; i++)
		buf[i] = pattern(i, 0x11);
	CU_ASSERT_FATAL(cudaSetDevice(0) == cudaSuccess);
	CU_ASSERT_FATAL(cudaMemcpy((void *)(uintptr_t)m.dptr, buf, half, cudaMemcpyHostToDevice) ==
			cudaSuccess);
	CU_ASSERT_FATAL(cudaMemset((void *)(uintptr_t)(m.dptr + half), 0, half) == cudaSuccess);
	CU_ASSERT_FATAL(cudaDeviceSynchronize() == cudaSuccess);

	CU_ASSERT_FATAL(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
	pid = fork();
	CU_ASSERT_FATAL(pid >= 0);
	if (pid == 0) {
		/* only sv[1] crosses the exec */
		if (fcntl(sv[1], F_SETFD, 0) < 0)
			_exit(126);
		snprintf(fdarg, sizeof(fdarg), "%d", sv[1]);
		execl(g_self, g_self, "--child", fdarg, (char *)NULL);
		_exit(127);
	}
	close(sv[1]);
	msg.bytes = m.bytes;
	CU_ASSERT(send_fd(sv[0], m.fd, &msg, sizeof(msg)) == 0);
	got = read(sv[0], reply, sizeof(reply) - 1);
	CU_ASSERT(got > 0);
	if (got > 0)
		reply[got] = 0;
	CU_ASSERT_STRING_EQUAL(reply, "ok");
	if (strcmp(reply, "ok"))
		fprintf(stderr, "\n  %s\n", reply[0] ? reply : "child: no reply");
	close(sv[0]);
	CU_ASSERT(waitpid(pid, &status, 0) == pid);
	CU_ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);

	/* the child's writes, through its own mapping, are in our memory */
	CU_ASSERT_FATAL(cudaMemcpy(buf, (void *)(uintptr_t)(m.dptr + half), half,
				   cudaMemcpyDeviceToHost) == cudaSuccess);
	for (uint64_t i = 0; i < half && bad == UINT64_MAX; i++)
		if (buf[i] != pattern(i, 0x77))
			bad = i;
	CU_ASSERT_EQUAL(bad, UINT64_MAX);
	/* and our first half is as we left it */
	CU_ASSERT_FATAL(cudaMemcpy(buf, (void *)(uintptr_t)m.dptr, half, cudaMemcpyDeviceToHost) ==
			cudaSuccess);
	for (uint64_t i = 0; i < half && bad == UINT64_MAX; i++)
		if (buf[i] != pattern(i, 0x11))
			bad = i;
	CU_ASSERT_EQUAL(bad, UINT64_MAX);

	free(buf);
	kvp_cuda_mem_destroy(&m);
	CU_ASSERT_EQUAL(m.fd, -1);
	CU_ASSERT_EQUAL(m.bytes, 0);
	kvp_cuda_mem_destroy(&m); /* twice is fine */
}

static void test_kvp_cuda_mem_create_bad(void)
{
	struct kvp_cuda_mem m, before;
	char reason[256] = "";

	memset(&m, 0x3c, sizeof(m));
	before = m;
	CU_ASSERT_EQUAL(kvp_cuda_mem_create(1 << 20, 1 << 20, &m, reason, sizeof(reason)), -ENODEV);
	CU_ASSERT(strstr(reason, "not present") != NULL);
	CU_ASSERT_EQUAL(kvp_cuda_mem_create(-1, 1 << 20, &m, reason, sizeof(reason)), -ENODEV);
	CU_ASSERT_EQUAL(kvp_cuda_mem_create(0, 0, &m, reason, sizeof(reason)), -EINVAL);
	CU_ASSERT_EQUAL(kvp_cuda_mem_create(0, UINT64_MAX - 5, &m, reason, sizeof(reason)),
			-EINVAL);
	CU_ASSERT_EQUAL(kvp_cuda_mem_create(0, 1 << 20, NULL, NULL, 0), -EINVAL);
	CU_ASSERT(memcmp(&m, &before, sizeof(m)) == 0); /* output untouched on failure */
}

static void test_kvp_cuda_mem_import_bad(void)
{
	struct kvp_cuda_mem m, before, good;
	char reason[256] = "";
	int devnull, ret;

	memset(&m, 0x3c, sizeof(m));
	before = m;
	CU_ASSERT_EQUAL(kvp_cuda_mem_import(0, -1, 2 << 20, &m, reason, sizeof(reason)), -EINVAL);
	CU_ASSERT_FATAL(kvp_cuda_mem_create(0, 1, &good, reason, sizeof(reason)) == 0);
	CU_ASSERT_EQUAL(kvp_cuda_mem_import(0, good.fd, good.bytes - 1, &m, reason, sizeof(reason)),
			-EINVAL);
	devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
	CU_ASSERT_FATAL(devnull >= 0);
	ret = kvp_cuda_mem_import(0, devnull, good.bytes, &m, reason, sizeof(reason));
	CU_ASSERT(ret < 0);
	close(devnull);
	CU_ASSERT(memcmp(&m, &before, sizeof(m)) == 0);
	CU_ASSERT(fcntl(good.fd, F_GETFD) >= 0); /* failed imports leave the fd alone */
	kvp_cuda_mem_destroy(&good);
	kvp_cuda_mem_destroy(NULL);
}

/* The cuda backend: create, adopt a duplicate of the exported fd (a second mapping of the same
 * memory, nothing zeroed), typed refusals, destroy closing each tier's own fd. */
static void test_kvp_tier_cuda_create_adopt(void)
{
	const struct kvp_tier_ops *ops = &kvp_tier_cuda_ops;
	struct kvp_tier_spec s = { .name = "t:cuda", .bytes = (3u << 20) + 1, .numa_node = -1 };
	struct kvp_tier_fail tf = { 0 };
	struct kvp_tier_mem a, b, c;
	unsigned char *buf, *back;
	int dup_fd;

	CU_ASSERT_EQUAL_FATAL(ops->create(&a, &s, NULL, 0, &tf), 0);
	CU_ASSERT_PTR_EQUAL(a.ops, ops);
	CU_ASSERT_EQUAL(a.backend, KVP_BACKEND_KIND_CUDA);
	CU_ASSERT(a.fd >= 0);
	CU_ASSERT(a.bytes >= s.bytes && a.cuda_granularity && a.bytes % a.cuda_granularity == 0);
	CU_ASSERT(a.has_uuid);
	buf = malloc(a.bytes);
	back = malloc(a.bytes);
	CU_ASSERT_FATAL(buf && back);
	for (uint64_t i = 0; i < a.bytes; i++)
		buf[i] = pattern(i, 5);
	CU_ASSERT_FATAL(cudaMemcpy(a.base, buf, a.bytes, cudaMemcpyHostToDevice) == cudaSuccess);

	dup_fd = fcntl(a.fd, F_DUPFD_CLOEXEC, 0);
	CU_ASSERT_FATAL(dup_fd >= 0);
	s.bytes = a.bytes - 1; /* not the tier's size */
	CU_ASSERT_EQUAL(ops->adopt(&c, dup_fd, &s, &tf), -KVP_TIER_E_SIZE);
	CU_ASSERT_EQUAL(tf.code, KVP_TIER_E_SIZE);
	CU_ASSERT_PTR_NULL(c.ops);
	CU_ASSERT(fcntl(dup_fd, F_GETFD) >= 0); /* still the caller's */
	CU_ASSERT_EQUAL(ops->adopt(&c, -1, &s, &tf), -KVP_TIER_E_INVALID);
	s.bytes = a.bytes;
	CU_ASSERT_EQUAL_FATAL(ops->adopt(&b, dup_fd, &s, &tf), 0);
	CU_ASSERT_EQUAL(b.fd, dup_fd);
	CU_ASSERT_EQUAL(b.bytes, a.bytes);
	CU_ASSERT_PTR_NOT_EQUAL(b.base, a.base);
	CU_ASSERT_FATAL(cudaMemcpy(back, b.base, b.bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
	CU_ASSERT(memcmp(buf, back, a.bytes) == 0);

	kvp_tier_mem_destroy(&b);
	CU_ASSERT(fcntl(dup_fd, F_GETFD) < 0);
	memset(back, 0, a.bytes);
	CU_ASSERT_FATAL(cudaMemcpy(back, a.base, a.bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
	CU_ASSERT(memcmp(buf, back, a.bytes) == 0);
	kvp_tier_mem_destroy(&a);
	kvp_tier_mem_destroy(&a);
	free(buf);
	free(back);
}

/* The cuda backend's copies between its device tier and a memfd host tier, checked against the
 * layout helpers, and the host page bound of the batch check. */
static void test_kvp_tier_cuda_copy(void)
{
	const struct kvp_copy_geom g = { .layers = 3,
					 .page_tokens = 16,
					 .row_bytes = 256,
					 .dev_slots = 8 * 16,
					 .host_pages = 6 };
	const uint64_t pb = kvp_host_page_bytes(&g), run = g.page_tokens * g.row_bytes;
	struct kvp_tier_spec ds = { .name = "t:device", .bytes = 8 * pb, .numa_node = -1 };
	struct kvp_tier_spec hs = { .name = "t:host", .bytes = 6 * pb, .numa_node = -1 };
	const struct kvp_tier_ops *ops = &kvp_tier_cuda_ops;
	uint32_t dsrc[3] = { 7, 0, 3 }, hdst[3] = { 5, 2, 0 }, dback[3] = { 1, 4, 6 },
		 bad[3] = { 5, 6, 0 };
	struct kvp_tier_fail tf = { 0 };
	struct kvp_tier_copy *c = NULL;
	struct kvp_tier_mem dev, host;
	unsigned char *buf, *back;

	CU_ASSERT_EQUAL_FATAL(ops->create(&dev, &ds, NULL, 0, &tf), 0);
	CU_ASSERT_EQUAL_FATAL(kvp_tier_memfd_ops.create(&host, &hs, NULL, 0, &tf), 0);
	buf = malloc(dev.bytes);
	back = malloc(dev.bytes);
	CU_ASSERT_FATAL(buf && back);
	for (uint64_t i = 0; i < dev.bytes; i++)
		buf[i] = pattern(i, 9);
	CU_ASSERT_FATAL(cudaMemcpy(dev.base, buf, dev.bytes, cudaMemcpyHostToDevice) ==
			cudaSuccess);
	memset(host.base, 0, host.bytes);
	if (ops->copy_open(&dev, &host, &g, &c, &tf) < 0)
		fprintf(stderr, "\n  copy_open: %s\n", tf.msg);
	CU_ASSERT_PTR_NOT_NULL_FATAL(c);

	CU_ASSERT_EQUAL(ops->copy(c, KVP_COPY_DEMOTE, dsrc, hdst, 3), 0);
	CU_ASSERT_EQUAL(ops->copy_wait(c), 0);
	for (int i = 0; i < 3; i++)
		for (uint32_t l = 0; l < g.layers; l++)
			for (uint32_t kv = 0; kv < 2; kv++)
				CU_ASSERT(memcmp(buf + kvp_dev_offset(&g, l, kv,
								      (uint64_t)dsrc[i] *
									      g.page_tokens),
						 (unsigned char *)host.base +
							 kvp_host_offset(&g, hdst[i], l, kv, 0),
						 run) == 0);
	CU_ASSERT_EQUAL(ops->copy(c, KVP_COPY_PROMOTE, hdst, dback, 3), 0);
	CU_ASSERT_EQUAL(ops->copy_wait(c), 0);
	CU_ASSERT_FATAL(cudaMemcpy(back, dev.base, dev.bytes, cudaMemcpyDeviceToHost) ==
			cudaSuccess);
	for (int i = 0; i < 3; i++)
		for (uint32_t l = 0; l < g.layers; l++)
			for (uint32_t kv = 0; kv < 2; kv++)
				CU_ASSERT(memcmp(back + kvp_dev_offset(&g, l, kv,
								       (uint64_t)dback[i] *
									       g.page_tokens),
						 (unsigned char *)host.base +
							 kvp_host_offset(&g, hdst[i], l, kv, 0),
						 run) == 0);
	/* host page 6 of 6: refused before anything is queued */
	CU_ASSERT_EQUAL(ops->copy(c, KVP_COPY_DEMOTE, dsrc, bad, 3), -ERANGE);
	CU_ASSERT_EQUAL(ops->copy(c, KVP_COPY_PROMOTE, bad, dsrc, 3), -ERANGE);
	CU_ASSERT_EQUAL(ops->copy_wait(c), 0);
	ops->copy_close(c);
	kvp_tier_mem_destroy(&host);
	kvp_tier_mem_destroy(&dev);
	free(buf);
	free(back);
}

int main(int argc, char **argv)
{
	static const struct h_test tests[] = {
		H_TEST(test_kvp_cuda_probe_count),	 H_TEST(test_kvp_cuda_mem_create_share),
		H_TEST(test_kvp_cuda_mem_create_bad),	 H_TEST(test_kvp_cuda_mem_import_bad),
		H_TEST(test_kvp_tier_cuda_create_adopt), H_TEST(test_kvp_tier_cuda_copy),
	};
	char reason[256] = "";
	int n;

	if (argc == 3 && !strcmp(argv[1], "--child"))
		return child_main(atoi(argv[2]));
	g_self = "/proc/self/exe";

	n = kvp_cuda_probe(reason, sizeof(reason));
	if (n == -ENODEV || n == -ENOTSUP) {
		printf("SKIP: kvp_cuda_probe = %d: %s\n", n, reason);
		return 77;
	}
	if (n < 0) { /* a GPU is there but kvpool cannot drive it: that is a failure */
		printf("FAIL: kvp_cuda_probe = %d: %s\n", n, reason);
		return 1;
	}
	printf("kvp_cuda_probe: %d usable GPU(s); device 0 NUMA node %d\n", n,
	       kvp_cuda_device_numa_node(0));

	return H_RUN_SUITE("cuda_tier", NULL, NULL, tests);
}
