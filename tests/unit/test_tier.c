/* test_tier.c - CUnit suite "tier": the tier backends through their operations table (tier.h),
 * on memfd and sim: create, adopt of the fd another create made (the same bytes seen through both
 * mappings, nothing zeroed), the typed refusals of adopt (wrong size, no seals, write-sealed, not
 * a memfd), destroy, and the sim backend's page copies against the layout helpers. The cuda
 * backend is exercised by the gpu suite (tests/gpu/test_cuda_tier.c); here only its table entry
 * and, on a machine without a GPU, its typed refusal. */
#include <CUnit/Basic.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fail.h"
#include "kvp_config.h"
#include "names.h"
#include "suite.h"
#include "tier.h"

/* tier.h and fail.h stand without the wire types (kvpool.pb-c.h) */
#if defined(PROTOBUF_C_kvpool_2eproto__INCLUDED) || defined(PROTOBUF_C_VERSION_NUMBER)
#error "tier.h or fail.h brings in generated wire types"
#endif

#define PAGE 4096u

static struct kvp_tier_spec spec(const char *name, uint64_t bytes)
{
	struct kvp_tier_spec s = {
		.name = name, .bytes = bytes, .numa_node = -1, .cuda_device = 0
	};

	return s;
}

static bool fd_open(int fd)
{
	return fcntl(fd, F_GETFD) >= 0;
}

static void fill(void *base, uint64_t bytes, uint32_t seed)
{
	uint8_t *b = base;

	for (uint64_t i = 0; i < bytes; i++)
		b[i] = (uint8_t)(((i * 131 + seed) >> 3) ^ seed);
}

static void test_kvp_tier_ops_of_table(void)
{
	static const char *const names[KVP_BACKEND_KIND_MAX] = {
		[KVP_BACKEND_KIND_SIM] = "sim",
		[KVP_BACKEND_KIND_CUDA] = "cuda",
		[KVP_BACKEND_KIND_MEMFD] = "memfd",
	};

	for (int k = KVP_BACKEND_KIND_SIM; k < KVP_BACKEND_KIND_MAX; k++) {
		const struct kvp_tier_ops *ops = kvp_tier_ops_of((enum kvp_backend_kind)k);

		CU_ASSERT_PTR_NOT_NULL_FATAL(ops);
		CU_ASSERT_EQUAL(ops->kind, k);
		CU_ASSERT_STRING_EQUAL(ops->name, names[k]);
		/* one name table: the backend's own name is the wire's (names.h) */
		CU_ASSERT_STRING_EQUAL(ops->name, kvp_names_backend(ops->kind));
		CU_ASSERT(ops->create && ops->adopt && ops->destroy);
		/* device backends copy; the host backend does not */
		CU_ASSERT(k == KVP_BACKEND_KIND_MEMFD
				  ? !ops->copy_open && !ops->copy && !ops->copy_wait
				  : ops->copy_open && ops->copy && ops->copy_wait &&
					    ops->copy_close);
	}
	CU_ASSERT_PTR_NULL(kvp_tier_ops_of(KVP_BACKEND_KIND_NONE));
	CU_ASSERT_PTR_NULL(kvp_tier_ops_of(KVP_BACKEND_KIND_MAX));
	CU_ASSERT_PTR_NULL(kvp_tier_ops_of((enum kvp_backend_kind) - 1));
	CU_ASSERT_STRING_EQUAL(kvp_names_backend(KVP_BACKEND_KIND_NONE), "none");
}

/* Create, then adopt a duplicate of its fd: both mappings show the same bytes both ways, the
 * adopted tier is not zeroed, and destroy closes each tier's own fd. */
static void check_create_adopt(enum kvp_backend_kind kind)
{
	const struct kvp_tier_ops *ops = kvp_tier_ops_of(kind);
	struct kvp_tier_spec s = spec("t:tier", 3 * PAGE + 100);
	struct kvp_tier_mem a, b;
	struct kvp_tier_fail tf = { 0 };
	char note[128] = "x";
	int dup_fd, afd;

	CU_ASSERT_EQUAL_FATAL(ops->create(&a, &s, note, sizeof(note), &tf), 0);
	CU_ASSERT_PTR_EQUAL(a.ops, ops);
	CU_ASSERT_EQUAL(a.backend, kind);
	CU_ASSERT(a.fd >= 0);
	CU_ASSERT_PTR_NOT_NULL(a.base);
	CU_ASSERT_EQUAL(a.bytes, s.bytes);
	CU_ASSERT(!a.huge);
	CU_ASSERT(!a.locked);
	CU_ASSERT_STRING_EQUAL(note, "");
	CU_ASSERT_EQUAL(fcntl(a.fd, F_GET_SEALS) & (F_SEAL_SHRINK | F_SEAL_GROW),
			F_SEAL_SHRINK | F_SEAL_GROW);
	fill(a.base, a.bytes, 7);

	dup_fd = fcntl(a.fd, F_DUPFD_CLOEXEC, 0);
	CU_ASSERT_FATAL(dup_fd >= 0);
	s.bytes = a.bytes;
	CU_ASSERT_EQUAL_FATAL(ops->adopt(&b, dup_fd, &s, &tf), 0);
	CU_ASSERT_PTR_EQUAL(b.ops, ops);
	CU_ASSERT_EQUAL(b.backend, kind);
	CU_ASSERT_EQUAL(b.fd, dup_fd);
	CU_ASSERT_EQUAL(b.bytes, a.bytes);
	CU_ASSERT_PTR_NOT_EQUAL(b.base, a.base);
	CU_ASSERT(memcmp(a.base, b.base, a.bytes) == 0); /* adopted as is */
	fill(b.base, b.bytes, 99);
	CU_ASSERT(memcmp(a.base, b.base, a.bytes) == 0); /* one memory, two mappings */

	afd = a.fd;
	kvp_tier_mem_destroy(&a);
	CU_ASSERT(!fd_open(afd));
	CU_ASSERT_PTR_NULL(a.ops);
	CU_ASSERT_EQUAL(a.fd, -1);
	CU_ASSERT_PTR_NULL(a.base);
	/* the adopted tier outlives the first; its bytes are still there */
	{
		uint8_t *want = malloc(b.bytes);

		CU_ASSERT_PTR_NOT_NULL_FATAL(want);
		fill(want, b.bytes, 99);
		CU_ASSERT(memcmp(want, b.base, b.bytes) == 0);
		free(want);
	}
	ops->destroy(&b);
	CU_ASSERT(!fd_open(dup_fd));
	CU_ASSERT_EQUAL(b.fd, -1);
	kvp_tier_mem_destroy(&b); /* twice is fine */
}

static void test_kvp_tier_memfd_create_adopt(void)
{
	check_create_adopt(KVP_BACKEND_KIND_MEMFD);
}

static void test_kvp_tier_sim_create_adopt(void)
{
	check_create_adopt(KVP_BACKEND_KIND_SIM);
}

/* A memfd of `bytes` with `seals` added (MFD_ALLOW_SEALING unless no_sealing). */
static int make_memfd(uint64_t bytes, int seals, bool no_sealing)
{
	int fd = memfd_create("test_tier", MFD_CLOEXEC | (no_sealing ? 0 : MFD_ALLOW_SEALING));

	if (fd < 0)
		return -1;
	if (ftruncate(fd, (off_t)bytes) < 0 || (seals && fcntl(fd, F_ADD_SEALS, seals) < 0)) {
		close(fd);
		return -1;
	}
	return fd;
}

/* Every refusal is typed, returns -code, leaves the tier empty and the fd the caller's. */
static void check_refused(const struct kvp_tier_ops *ops, int fd, uint64_t bytes,
			  enum kvp_tier_error want)
{
	struct kvp_tier_spec s = spec("t:adopt", bytes);
	struct kvp_tier_fail tf = { 0 };
	struct kvp_tier_mem t;

	memset(&t, 0x5a, sizeof(t));
	CU_ASSERT_EQUAL(ops->adopt(&t, fd, &s, &tf), -(int)want);
	CU_ASSERT_EQUAL(tf.code, want);
	CU_ASSERT(tf.msg[0] != '\0');
	CU_ASSERT_PTR_NULL(t.ops);
	CU_ASSERT_PTR_NULL(t.base);
	CU_ASSERT_EQUAL(t.fd, -1);
	if (fd >= 0)
		CU_ASSERT(fd_open(fd));
	if (tf.code != want)
		fprintf(stderr, "\n  adopt: %d %s\n", tf.code, tf.msg);
}

static void check_adopt_refusals(enum kvp_backend_kind kind)
{
	const struct kvp_tier_ops *ops = kvp_tier_ops_of(kind);
	const uint64_t bytes = 4 * PAGE;
	struct kvp_tier_spec s = spec("t:good", bytes);
	struct kvp_tier_mem good;
	int fds[6], p[2];
	char path[] = "/tmp/test_tier.XXXXXX";

	CU_ASSERT_EQUAL_FATAL(ops->create(&good, &s, NULL, 0, NULL), 0);
	/* the right memory at the wrong size, either way */
	check_refused(ops, good.fd, bytes + PAGE, KVP_TIER_E_SIZE);
	check_refused(ops, good.fd, bytes - PAGE, KVP_TIER_E_SIZE);
	/* memfds a client could shrink under the daemon (SIGBUS) */
	fds[0] = make_memfd(bytes, 0, false);
	fds[1] = make_memfd(bytes, F_SEAL_SHRINK, false);
	fds[2] = make_memfd(bytes, 0, true); /* no sealing at all: F_SEAL_SEAL alone */
	fds[3] = make_memfd(bytes, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE, false);
	for (int i = 0; i < 4; i++)
		CU_ASSERT_FATAL(fds[i] >= 0);
	for (int i = 0; i < 4; i++)
		check_refused(ops, fds[i], bytes, KVP_TIER_E_SEALS);
	/* not a memfd: a regular file, a pipe; no fd at all; no size */
	fds[4] = mkstemp(path);
	CU_ASSERT_FATAL(fds[4] >= 0);
	unlink(path);
	CU_ASSERT_EQUAL_FATAL(ftruncate(fds[4], (off_t)bytes), 0);
	/* on tmpfs a plain file answers F_GET_SEALS (with F_SEAL_SEAL alone): refused for that */
	check_refused(ops, fds[4], bytes,
		      fcntl(fds[4], F_GET_SEALS) < 0 ? KVP_TIER_E_BAD_FD : KVP_TIER_E_SEALS);
	CU_ASSERT_EQUAL_FATAL(pipe2(p, O_CLOEXEC), 0);
	check_refused(ops, p[0], bytes, KVP_TIER_E_BAD_FD);
	check_refused(ops, -1, bytes, KVP_TIER_E_INVALID);
	check_refused(ops, good.fd, 0, KVP_TIER_E_INVALID);
	fds[5] = open("/dev/null", O_RDWR | O_CLOEXEC);
	check_refused(ops, fds[5], bytes, KVP_TIER_E_BAD_FD);
	for (int i = 0; i < 6; i++)
		close(fds[i]);
	close(p[0]);
	close(p[1]);
	kvp_tier_mem_destroy(&good);
}

static void test_kvp_tier_memfd_adopt_refused(void)
{
	check_adopt_refusals(KVP_BACKEND_KIND_MEMFD);
}

static void test_kvp_tier_sim_adopt_refused(void)
{
	check_adopt_refusals(KVP_BACKEND_KIND_SIM);
}

static void test_kvp_tier_memfd_create_bad(void)
{
	struct kvp_tier_spec s = spec("t:zero", 0);
	struct kvp_tier_fail tf = { 0 };
	struct kvp_tier_mem t;

	CU_ASSERT_EQUAL(kvp_tier_memfd_ops.create(&t, &s, NULL, 0, &tf), -KVP_TIER_E_INVALID);
	CU_ASSERT_EQUAL(tf.code, KVP_TIER_E_INVALID);
	CU_ASSERT_EQUAL(t.fd, -1);
	CU_ASSERT_PTR_NULL(t.ops);
	kvp_tier_mem_destroy(&t);
}

/* The sim backend's copies: device layout -> host layout and back, through the table, with the
 * batch checked before anything moves. */
static void test_kvp_tier_sim_copy(void)
{
	const struct kvp_copy_geom g = {
		.layers = 2, .page_tokens = 4, .row_bytes = 16, .dev_slots = 6 * 4, .host_pages = 5
	};
	const uint64_t pb = kvp_host_page_bytes(&g);
	struct kvp_tier_spec ds = spec("t:device", 6 * pb), hs = spec("t:host", 5 * pb);
	struct kvp_tier_mem dev, host;
	struct kvp_tier_copy *c = NULL;
	struct kvp_tier_fail tf = { 0 };
	const struct kvp_tier_ops *ops = &kvp_tier_sim_ops;
	uint32_t dsrc[3] = { 5, 0, 2 }, hdst[3] = { 4, 1, 0 }, dback[3] = { 1, 3, 4 },
		 bad[3] = { 4, 1, 5 };
	uint8_t *host0;

	CU_ASSERT_EQUAL_FATAL(ops->create(&dev, &ds, NULL, 0, &tf), 0);
	CU_ASSERT_EQUAL_FATAL(kvp_tier_memfd_ops.create(&host, &hs, NULL, 0, &tf), 0);
	fill(dev.base, dev.bytes, 3);
	memset(host.base, 0, host.bytes);
	CU_ASSERT_EQUAL_FATAL(ops->copy_open(&dev, &host, &g, &c, &tf), 0);
	CU_ASSERT_PTR_NOT_NULL_FATAL(c);

	CU_ASSERT_EQUAL(ops->copy(c, KVP_COPY_DEMOTE, dsrc, hdst, 3), 0);
	CU_ASSERT_EQUAL(ops->copy_wait(c), 0);
	for (int i = 0; i < 3; i++)
		for (uint32_t l = 0; l < g.layers; l++)
			for (uint32_t kv = 0; kv < 2; kv++) {
				const uint8_t *d =
					(const uint8_t *)dev.base +
					kvp_dev_offset(&g, l, kv,
						       (uint64_t)dsrc[i] * g.page_tokens);
				const uint8_t *h = (const uint8_t *)host.base +
						   kvp_host_offset(&g, hdst[i], l, kv, 0);

				CU_ASSERT(memcmp(d, h, g.page_tokens * g.row_bytes) == 0);
			}
	/* host page 3 was not a destination */
	for (uint64_t i = 0; i < pb; i++)
		CU_ASSERT_EQUAL_FATAL(((uint8_t *)host.base)[3 * pb + i], 0);

	/* and back into other device pages */
	CU_ASSERT_EQUAL(ops->copy(c, KVP_COPY_PROMOTE, hdst, dback, 3), 0);
	CU_ASSERT_EQUAL(ops->copy_wait(c), 0);
	for (int i = 0; i < 3; i++)
		for (uint32_t l = 0; l < g.layers; l++)
			for (uint32_t kv = 0; kv < 2; kv++) {
				const uint8_t *d =
					(const uint8_t *)dev.base +
					kvp_dev_offset(&g, l, kv,
						       (uint64_t)dback[i] * g.page_tokens);
				const uint8_t *h = (const uint8_t *)host.base +
						   kvp_host_offset(&g, hdst[i], l, kv, 0);

				CU_ASSERT(memcmp(d, h, g.page_tokens * g.row_bytes) == 0);
			}

	/* a host page past the host tier: refused, nothing written */
	host0 = malloc(host.bytes);
	CU_ASSERT_PTR_NOT_NULL_FATAL(host0);
	memcpy(host0, host.base, host.bytes);
	CU_ASSERT_EQUAL(ops->copy(c, KVP_COPY_DEMOTE, dsrc, bad, 3), -ERANGE);
	CU_ASSERT_EQUAL(ops->copy(c, KVP_COPY_PROMOTE, bad, dsrc, 3), -ERANGE);
	CU_ASSERT(memcmp(host0, host.base, host.bytes) == 0);
	free(host0);

	ops->copy_close(c);
	ops->copy_close(NULL);
	/* no copies without a host tier, or with a bad geometry */
	{
		struct kvp_tier_mem none;
		struct kvp_copy_geom g0 = g;

		kvp_tier_mem_init(&none);
		c = NULL;
		CU_ASSERT_EQUAL(ops->copy_open(&dev, &none, &g, &c, &tf), -KVP_TIER_E_INVALID);
		g0.layers = 0;
		CU_ASSERT_EQUAL(ops->copy_open(&dev, &host, &g0, &c, &tf), -KVP_TIER_E_INVALID);
		CU_ASSERT_PTR_NULL(c);
	}
	kvp_tier_mem_destroy(&dev);
	kvp_tier_mem_destroy(&host);
}

/* Without a GPU (or without CUDA in the build) a cuda tier is a typed refusal, never a crash. */
static void test_kvp_tier_cuda_create_refused_without_gpu(void)
{
	struct kvp_tier_spec s = spec("t:cuda", 2u << 20);
	struct kvp_tier_fail tf = { 0 };
	struct kvp_tier_mem t;
	int r;

	r = kvp_tier_cuda_ops.create(&t, &s, NULL, 0, &tf);
	if (r == 0) { /* a machine with a GPU: the gpu suite covers it */
		CU_ASSERT_EQUAL(t.backend, KVP_BACKEND_KIND_CUDA);
		kvp_tier_mem_destroy(&t);
		return;
	}
	CU_ASSERT_EQUAL(r, -KVP_TIER_E_UNAVAILABLE);
	CU_ASSERT_EQUAL(tf.code, KVP_TIER_E_UNAVAILABLE);
	CU_ASSERT(strstr(tf.msg, "cuda:0 device tier refused") != NULL);
	CU_ASSERT_PTR_NULL(t.ops);
	CU_ASSERT_EQUAL(t.fd, -1);
	kvp_tier_mem_destroy(&t);
	if (!KVP_HAVE_CUDA)
		CU_ASSERT(strstr(tf.msg, "built without CUDA") != NULL);
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_kvp_tier_ops_of_table),
		H_TEST(test_kvp_tier_memfd_create_adopt),
		H_TEST(test_kvp_tier_sim_create_adopt),
		H_TEST(test_kvp_tier_memfd_adopt_refused),
		H_TEST(test_kvp_tier_sim_adopt_refused),
		H_TEST(test_kvp_tier_memfd_create_bad),
		H_TEST(test_kvp_tier_sim_copy),
		H_TEST(test_kvp_tier_cuda_create_refused_without_gpu),
	};

	return H_RUN_SUITE("tier", NULL, NULL, tests);
}
