/* test_pool.c - pool logic in-process (no daemon): leases, insert, match, eviction and
 * demotion/promotion under long random sequences, with free + leased + cached == total and the
 * tree's own consistency checked after every step; typed capacity figures. */
#include <CUnit/Basic.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "pool.h"
#include "suite.h"
#include "work.h"

static const char *const g_conf = "[pool.u]\nlayers = 2\nkv_heads = 1\nhead_dim = 4\n"
				  "dtype = fp16\npage_tokens = 4\ndevice = sim\n"
				  "device_capacity = 128t\nhost_capacity = 64t\nmlock = off\n";

static struct kvpd_pool *make_pool(void)
{
	static struct kvp_conf c;
	struct kvp_fail f = { 0 };
	char err[256];

	if (kvp_conf_load_string(&c, g_conf, "test", err, sizeof(err)) < 0)
		return NULL;
	return kvp_pool_create(&c.pools[0], 0, &f);
}

static void test_lease_create_capacity_figures(void)
{
	struct kvpd_pool *p = make_pool();
	struct kvp_fail f = { 0 };
	struct kvp_lease *a, *b;

	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	a = kvp_lease_create(p, KVP_TIER_ID_DEVICE, 1, 30, &f);
	CU_ASSERT_PTR_NOT_NULL_FATAL(a);
	b = kvp_lease_create(p, KVP_TIER_ID_DEVICE, 2, 3, &f);
	CU_ASSERT_PTR_NULL(b);
	CU_ASSERT_EQUAL(f.code, KVP_ERR_OUT_OF_CAPACITY);
	CU_ASSERT_EQUAL(f.detail, KVP_FAIL_CAPACITY);
	CU_ASSERT_EQUAL(f.cap.requested, 12);
	CU_ASSERT_EQUAL(f.cap.free, 8);
	CU_ASSERT_EQUAL(f.cap.leased, 120);
	CU_ASSERT_EQUAL(f.cap.total, 128);
	CU_ASSERT_PTR_NULL(kvp_lease_create(p, 7, 3, 1, &f));
	CU_ASSERT_EQUAL(f.code, KVP_ERR_INVALID_ARGUMENT);
	CU_ASSERT_EQUAL(kvp_pool_check(p), 0);
	kvp_lease_destroy(a);
	CU_ASSERT_EQUAL(kvp_pool_check(p), 0);
	kvp_pool_destroy(p);
}

static struct kvpd_pool *make_pool_from(const char *conf, struct kvp_fail *f)
{
	static struct kvp_conf c;
	char err[256];

	if (kvp_conf_load_string(&c, conf, "test", err, sizeof(err)) < 0) {
		fprintf(stderr, "\n  config: %s\n", err);
		return NULL;
	}
	return kvp_pool_create(&c.pools[0], 0, f);
}

/* The tiers come from their backends (through the table): a sim device tier and a memfd host
 * tier, each named as the wire numbers it, with the copies between them open. */
static void test_pool_create_tier_backends(void)
{
	struct kvp_fail f = { 0 };
	struct kvpd_pool *p = make_pool_from(g_conf, &f);

	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	CU_ASSERT_EQUAL(p->mem[KVP_TIER_ID_DEVICE].backend, KVP_BACKEND_KIND_SIM);
	CU_ASSERT_EQUAL(p->mem[KVP_TIER_ID_HOST].backend, KVP_BACKEND_KIND_MEMFD);
	CU_ASSERT_PTR_EQUAL(p->mem[KVP_TIER_ID_DEVICE].ops, &kvp_tier_sim_ops);
	CU_ASSERT_PTR_EQUAL(p->mem[KVP_TIER_ID_HOST].ops, &kvp_tier_memfd_ops);
	CU_ASSERT(p->mem[KVP_TIER_ID_DEVICE].fd >= 0 && p->mem[KVP_TIER_ID_HOST].fd >= 0);
	CU_ASSERT_EQUAL(p->mem[KVP_TIER_ID_DEVICE].bytes, 32 * p->page_bytes);
	CU_ASSERT_EQUAL(p->mem[KVP_TIER_ID_HOST].bytes, 16 * p->page_bytes);
	CU_ASSERT_EQUAL(p->geom.host_pages, 16);
	CU_ASSERT_PTR_NOT_NULL(p->copy);
	kvp_pool_destroy(p);
}

/* A cuda pool on a machine (or a build) without a GPU: a typed refusal, nothing left behind. */
static void test_pool_create_cuda_unavailable(void)
{
	static const char conf[] = "[pool.c]\nlayers = 2\nkv_heads = 1\nhead_dim = 4\n"
				   "dtype = fp16\npage_tokens = 4\ndevice = cuda:0\n"
				   "device_capacity = 128t\nhost_capacity = 64t\nmlock = off\n";
	struct kvp_fail f = { 0 };
	struct kvpd_pool *p = make_pool_from(conf, &f);

	if (p) { /* a GPU is there: the gpu suite covers cuda pools */
		CU_ASSERT_EQUAL(p->mem[KVP_TIER_ID_DEVICE].backend, KVP_BACKEND_KIND_CUDA);
		kvp_pool_destroy(p);
		return;
	}
	CU_ASSERT_EQUAL(f.code, KVP_ERR_UNAVAILABLE);
	CU_ASSERT(strstr(f.msg, "cuda:0 device tier refused") != NULL);
}

/* A pool refused before its tiers exist (no tier at all) closes no fd: its empty tiers used to
 * read as fd 0 and closed it. */
static void test_pool_create_refused_closes_no_fd(void)
{
	static struct kvp_conf c;
	struct kvp_fail f = { 0 };
	char err[256];
	int fd = -1;

	if (fcntl(0, F_GETFD) < 0)
		fd = open("/dev/null", O_RDONLY); /* make sure fd 0 is there to be closed */
	CU_ASSERT_FATAL(fcntl(0, F_GETFD) >= 0);
	CU_ASSERT_FATAL(kvp_conf_load_string(&c, g_conf, "test", err, sizeof(err)) == 0);
	c.pools[0].device_pages = 0;
	c.pools[0].host_pages = 0;
	CU_ASSERT_PTR_NULL(kvp_pool_create(&c.pools[0], 0, &f));
	CU_ASSERT_EQUAL(f.code, KVP_ERR_INVALID_ARGUMENT);
	CU_ASSERT(fcntl(0, F_GETFD) >= 0);
	if (fd >= 0)
		close(fd);
}

/* kvp_lease_check (the daemon's books check uses it) sees a lease that lists a page the pool
 * does not book to it: a free page, a page of another tier, pages out of their order, one
 * beyond the tier. */
static void test_lease_check_catches_wrong_books(void)
{
	struct kvpd_pool *p = make_pool();
	struct kvp_fail f = { 0 };
	struct kvp_lease *a, *b;
	uint32_t keep;

	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	a = kvp_lease_create(p, KVP_TIER_ID_DEVICE, 1, 4, &f);
	b = kvp_lease_create(p, KVP_TIER_ID_DEVICE, 2, 2, &f);
	CU_ASSERT_PTR_NOT_NULL_FATAL(a);
	CU_ASSERT_PTR_NOT_NULL_FATAL(b);
	CU_ASSERT_EQUAL(kvp_lease_check(a), 0);
	CU_ASSERT_EQUAL(kvp_lease_check(b), 0);
	keep = a->pages[2];
	for (uint32_t pg = 0; pg < kvp_pages_total(p->pages[KVP_TIER_ID_DEVICE]); pg++) {
		if (kvp_pages_state(p->pages[KVP_TIER_ID_DEVICE], pg) == KVP_PAGE_FREE) {
			a->pages[2] = pg; /* a free page */
			break;
		}
	}
	CU_ASSERT_EQUAL(kvp_lease_check(a), -EFAULT);
	a->pages[2] = b->pages[0]; /* another lease's page */
	CU_ASSERT_EQUAL(kvp_lease_check(a), -EFAULT);
	a->pages[2] = kvp_pages_total(p->pages[KVP_TIER_ID_DEVICE]); /* beyond the tier */
	CU_ASSERT_EQUAL(kvp_lease_check(a), -EFAULT);
	a->pages[2] = keep;
	a->tier = KVP_TIER_ID_HOST; /* the right ids in the wrong tier */
	CU_ASSERT_EQUAL(kvp_lease_check(a), -EFAULT);
	a->tier = KVP_TIER_ID_DEVICE;
	a->pages[2] = a->pages[3], a->pages[3] = keep; /* out of order */
	CU_ASSERT_EQUAL(kvp_lease_check(a), -EFAULT);
	a->pages[3] = a->pages[2], a->pages[2] = keep;
	CU_ASSERT_EQUAL(kvp_lease_check(a), 0);
	kvp_lease_destroy(a);
	kvp_lease_destroy(b);
	CU_ASSERT_EQUAL(kvp_pool_check(p), 0);
	kvp_pool_destroy(p);
}

/* Page contents: every byte of a cached page is a function of its sequence and position. */
static void stamp(struct kvpd_pool *p, uint32_t page, uint32_t key)
{
	for (uint32_t l = 0; l < p->conf.layers; l++)
		for (uint32_t kv = 0; kv < 2; kv++) {
			uint8_t *a = (uint8_t *)p->mem[KVP_TIER_ID_DEVICE].base +
				     kvp_dev_offset(&p->geom, l, kv,
						    (uint64_t)page * p->conf.page_tokens);

			memset(a, (int)((key * 7 + l * 3 + kv) & 0xff),
			       p->geom.row_bytes * p->conf.page_tokens);
		}
}

static int verify(struct kvpd_pool *p, int tier, uint32_t page, uint32_t key)
{
	for (uint32_t l = 0; l < p->conf.layers; l++)
		for (uint32_t kv = 0; kv < 2; kv++) {
			const uint8_t *a =
				tier == KVP_TIER_ID_DEVICE
					? (uint8_t *)p->mem[tier].base +
						  kvp_dev_offset(&p->geom, l, kv,
								 (uint64_t)page *
									 p->conf.page_tokens)
					: (uint8_t *)p->mem[tier].base +
						  kvp_host_offset(&p->geom, page, l, kv, 0);

			for (uint64_t i = 0; i < p->geom.row_bytes * p->conf.page_tokens; i++)
				if (a[i] != (uint8_t)((key * 7 + l * 3 + kv) & 0xff))
					return 0;
		}
	return 1;
}

static void test_pool_random_sequences_keep_invariant(void)
{
	struct kvpd_pool *p = make_pool();
	struct kvp_lease *leases[8] = { 0 };
	struct kvp_index_lock *locks[8] = { 0 };
	uint32_t lock_pages[8] = { 0 };
	unsigned seed = 4242;
	uint64_t next_id = 1;
	int verified = 0;

	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	for (int step = 0; step < 6000; step++) {
		int op = rand_r(&seed) % 7, k = rand_r(&seed) % 8;
		struct kvp_fail f = { 0 };
		/* Sequences: 4 families, a page's tokens depend on family and position. */
		uint32_t fam = (uint32_t)rand_r(&seed) % 4,
			 npages = 1 + (uint32_t)rand_r(&seed) % 8;
		uint32_t tok[64];

		for (uint32_t i = 0; i < npages * 4; i++)
			tok[i] = fam * 1000 + i;
		switch (op) {
		case 0: /* lease */
			if (!leases[k])
				leases[k] = kvp_lease_create(p, KVP_TIER_ID_DEVICE, next_id++,
							     npages, &f);
			if (!leases[k])
				CU_ASSERT_EQUAL(f.code, KVP_ERR_OUT_OF_CAPACITY);
			break;
		case 1: /* insert the lease's pages as fam's prefix */
			if (leases[k] && leases[k]->n) {
				uint64_t nt, dt;
				uint32_t n = leases[k]->n < npages ? leases[k]->n : npages;
				uint32_t pg[8];

				memcpy(pg, leases[k]->pages, sizeof(uint32_t) * n);
				for (uint32_t i = 0; i < n; i++)
					stamp(p, pg[i], fam * 64 + i);
				CU_ASSERT_EQUAL(kvp_lease_insert(leases[k], 0, tok, n * 4, 0, pg, n,
								 &nt, &dt, &f),
						0);
				CU_ASSERT_EQUAL(nt + dt, n * 4);
			}
			break;
		case 2: /* free the lease */
			kvp_lease_destroy(leases[k]);
			leases[k] = NULL;
			break;
		case 3: { /* match, maybe lock, verify bytes */
			struct kvp_index_match m = { 0 };
			uint32_t dev[16], host[16];

			CU_ASSERT_EQUAL(kvp_index_match_tokens(p->ix, 0, tok, npages * 4, !locks[k],
							       &m, dev, host),
					0);
			for (uint32_t i = 0; i < m.dev_pages; i++, verified++)
				CU_ASSERT(verify(p, KVP_TIER_ID_DEVICE, dev[i], fam * 64 + i));
			for (uint32_t i = 0; i < m.host_pages; i++, verified++)
				CU_ASSERT(verify(p, KVP_TIER_ID_HOST, host[i],
						 fam * 64 + m.dev_pages + i));
			if (m.lock) {
				locks[k] = m.lock;
				lock_pages[k] = m.dev_pages + m.host_pages;
			}
			break;
		}
		case 4: /* release a lock */
			if (locks[k]) {
				kvp_index_unlock(p->ix, locks[k]);
				locks[k] = NULL;
			}
			break;
		case 5: /* promote a locked path */
			if (locks[k]) {
				uint32_t out[16], n = 0;
				int r = kvp_index_promote(p->ix, locks[k], out, 16, &n);

				CU_ASSERT(r == 0 || r == -ENOSPC || r == -EBUSY);
				if (r == 0)
					CU_ASSERT_EQUAL(n, lock_pages[k]);
			}
			break;
		default: { /* evict from either tier (one rand_r per statement: same in every build)
			    */
			int tier = rand_r(&seed) % 2;

			kvp_pool_evict(p, tier, 1 + (uint32_t)rand_r(&seed) % 6);
			break;
		}
		}
		CU_ASSERT_EQUAL_FATAL(kvp_pool_check(p), 0);
	}
	for (int k = 0; k < 8; k++) {
		kvp_lease_destroy(leases[k]);
		if (locks[k])
			kvp_index_unlock(p->ix, locks[k]);
	}
	CU_ASSERT_EQUAL(kvp_pool_check(p), 0);
	{
		struct kvp_tier_counts c;

		kvp_pool_counts(p, KVP_TIER_ID_DEVICE, &c);
		CU_ASSERT_EQUAL(c.leased, 0);
		CU_ASSERT_EQUAL(c.protected_, 0);
	}
	CU_ASSERT(verified > 100); /* the sequence really matched cached bytes */
	kvp_pool_destroy(p);
}

/* Caches 8 device pages of sequence fam (stamped). */
static void cache_seq(struct kvpd_pool *p, uint32_t fam, uint64_t id)
{
	struct kvp_fail f = { 0 };
	struct kvp_lease *l = kvp_lease_create(p, KVP_TIER_ID_DEVICE, id, 8, &f);
	uint32_t tok[32], pg[8];
	uint64_t nt, dt;

	CU_ASSERT_PTR_NOT_NULL_FATAL(l);
	for (uint32_t i = 0; i < 32; i++)
		tok[i] = fam * 1000 + i;
	memcpy(pg, l->pages, sizeof(pg));
	for (uint32_t i = 0; i < 8; i++)
		stamp(p, pg[i], fam * 64 + i);
	CU_ASSERT_EQUAL(kvp_lease_insert(l, 0, tok, 32, 0, pg, 8, &nt, &dt, &f), 0);
	kvp_lease_destroy(l);
}

/* With the worker (kvp_pool_async) and a sim tier whose copies land late: the Alloc that needs
 * demoted pages is refused now but fits later, the books balance with the pages in flight
 * (host pages MOVING), the short allocation leaves its event with the figures from before it,
 * the landing leaves the moved event and then the Alloc succeeds with the bytes in the host
 * tier; a pool destroyed with a copy in flight is freed when it lands. */
static void test_pool_demotion_in_flight_on_worker(void)
{
	struct kvp_work *w = kvp_work_start();
	struct kvp_index_match m = { 0 };
	struct kvp_fail f = { 0 };
	struct kvp_tier_counts dc, hc;
	struct kvpd_pool *p;
	struct kvp_lease *l;
	struct kvp_pool_events ev;
	uint32_t tok[32], dev[8], host[8];

	CU_ASSERT_PTR_NOT_NULL_FATAL(w);
	setenv("KVPOOLD_COPY_DELAY_MS", "100", 1);
	p = make_pool();
	unsetenv("KVPOOLD_COPY_DELAY_MS");
	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	kvp_pool_async(w);
	cache_seq(p, 1, 1);
	CU_ASSERT_PTR_NULL(kvp_lease_create(p, KVP_TIER_ID_DEVICE, 2, 32, &f));
	CU_ASSERT_EQUAL(f.code, KVP_ERR_OUT_OF_CAPACITY);
	CU_ASSERT(kvp_pool_fits_later(p, KVP_TIER_ID_DEVICE, 32));
	CU_ASSERT_FALSE(kvp_pool_fits_later(p, KVP_TIER_ID_DEVICE, 33));
	CU_ASSERT_EQUAL(kvp_pool_inflight(p, KVP_TIER_ID_DEVICE), 8);
	CU_ASSERT_EQUAL(p->st.alloc_failures, 0); /* waiting is no failure */
	kvp_pool_counts(p, KVP_TIER_ID_DEVICE, &dc);
	kvp_pool_counts(p, KVP_TIER_ID_HOST, &hc);
	CU_ASSERT_EQUAL(dc.cached, 8);
	CU_ASSERT_EQUAL(dc.free, 24);
	CU_ASSERT_EQUAL(hc.moving, 8);
	CU_ASSERT_EQUAL(hc.cached, 0);
	CU_ASSERT_EQUAL(kvp_pool_check(p), 0);
	CU_ASSERT_FATAL(kvp_pool_events_take(p, &ev));
	CU_ASSERT_EQUAL(ev.short_, 1u << KVP_TIER_ID_DEVICE);
	CU_ASSERT_FALSE(ev.moved);
	CU_ASSERT_EQUAL(ev.before[KVP_TIER_ID_DEVICE].free, 24); /* before the demotions began */
	CU_ASSERT_EQUAL(ev.before[KVP_TIER_ID_DEVICE].evictable, 8);
	CU_ASSERT_FALSE(kvp_pool_events_take(p, &ev)); /* taken */
	CU_ASSERT_EQUAL(poll(&(struct pollfd){ .fd = kvp_work_fd(w), .events = POLLIN }, 1, 5000),
			1);
	CU_ASSERT_EQUAL(kvp_work_reap(w), 1);
	CU_ASSERT_FATAL(kvp_pool_events_take(p, &ev));
	CU_ASSERT(ev.moved);
	CU_ASSERT_EQUAL(ev.short_, 0);
	CU_ASSERT_EQUAL(kvp_pool_inflight(p, KVP_TIER_ID_DEVICE), 0);
	kvp_pool_counts(p, KVP_TIER_ID_HOST, &hc);
	CU_ASSERT_EQUAL(hc.moving, 0);
	CU_ASSERT_EQUAL(hc.cached, 8);
	CU_ASSERT_EQUAL(kvp_pool_check(p), 0);
	for (uint32_t i = 0; i < 32; i++)
		tok[i] = 1000 + i;
	CU_ASSERT_EQUAL(kvp_index_match_tokens(p->ix, 0, tok, 32, 0, &m, dev, host), 0);
	CU_ASSERT_EQUAL(m.dev_pages, 0);
	CU_ASSERT_EQUAL_FATAL(m.host_pages, 8);
	for (uint32_t i = 0; i < 8; i++)
		CU_ASSERT(verify(p, KVP_TIER_ID_HOST, host[i], 64 + i));
	l = kvp_lease_create(p, KVP_TIER_ID_DEVICE, 3, 32, &f);
	CU_ASSERT_PTR_NOT_NULL(l);
	kvp_lease_destroy(l);
	/* In flight again, then destroyed: freed when the copy lands, with no callback. */
	cache_seq(p, 2, 4);
	CU_ASSERT_PTR_NULL(kvp_lease_create(p, KVP_TIER_ID_DEVICE, 5, 32, &f));
	CU_ASSERT_EQUAL(kvp_pool_inflight(p, KVP_TIER_ID_DEVICE), 8);
	kvp_pool_destroy(p);
	kvp_work_stop(w); /* lands it (and frees the pool: ASan sees a use after free otherwise) */
	kvp_pool_async(NULL);
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_pool_create_tier_backends),
		H_TEST(test_pool_create_cuda_unavailable),
		H_TEST(test_pool_create_refused_closes_no_fd),
		H_TEST(test_lease_create_capacity_figures),
		H_TEST(test_lease_check_catches_wrong_books),
		H_TEST(test_pool_random_sequences_keep_invariant),
		H_TEST(test_pool_demotion_in_flight_on_worker),
	};

	g_log_level = LOG_WARNING;
	return H_RUN_SUITE("pool", NULL, NULL, tests);
}
