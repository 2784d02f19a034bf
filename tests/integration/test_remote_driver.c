/* test_remote_driver.c - daemon/remote/remote.c against a real 3-master Redis Cluster on loopback
 * (redis_cluster.sh: KVP_REDIS_PORTS): the owner polls the driver's one fd and nothing else
 * (the I/O thread does the rest);
 * 300 page values are written and read back byte for byte (header and checksum checked on
 * the I/O thread), and EXISTS finds them; 24 values
 * of 256 KiB (written from the queue entries, read into the driver's own buffers) are put as
 * pages and read back verified on the I/O thread, and corrupt, foreign and missing ones are
 * refused there. */
#include <CUnit/Basic.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "remote.h"
#include "remote_cluster.h"
#include "remote_value.h"
#include "secret.h"
#include "suite.h"

#define NPAGES 300
#define PAGE 8192

static struct kvp_remote *g_r;
static const struct kvp_rv_fp g_fp = { 4, 2, 64, 1, 16, 0 };
static int g_left, g_bad;
static uint8_t g_pages[NPAGES][PAGE];
static char g_keys[NPAGES][32];

static void drive(int max_ms)
{
	uint64_t end = kvp_rc_now_ms() + (uint64_t)max_ms;

	while (g_left > 0 && kvp_rc_now_ms() < end) {
		struct pollfd p = { .fd = kvp_remote_fd(g_r), .events = POLLIN };

		if (poll(&p, 1, 50) > 0)
			kvp_remote_on_ready(g_r);
	}
}

static void on_set(void *arg, enum kvp_rc_status st, const void *val, size_t len)
{
	(void)arg;
	(void)val;
	(void)len;
	g_bad += st != KVP_RC_OK;
	g_left--;
}

static void on_get(void *arg, enum kvp_rc_status st, int err, const void *pl, size_t n)
{
	const uint8_t *want = arg;

	g_bad += st != KVP_RC_HIT || err || n != PAGE || memcmp(pl, want, PAGE) != 0;
	g_left--;
}

static void on_exists(void *arg, size_t n, const enum kvp_rc_status *st)
{
	(void)arg;
	for (size_t i = 0; i < n; i++)
		g_bad += st[i] != (i < NPAGES ? KVP_RC_HIT : KVP_RC_MISS);
	g_left--;
}

static void test_kvp_remote_on_ready_cluster_roundtrip(void)
{
	const void *keys[NPAGES + 1];
	size_t klens[NPAGES + 1];
	uint64_t end = kvp_rc_now_ms() + 10000;

	while (!kvp_remote_ready(g_r) && kvp_rc_now_ms() < end) {
		g_left = 1;
		drive(20);
	}
	CU_ASSERT_TRUE_FATAL(kvp_remote_ready(g_r));
	g_left = NPAGES;
	g_bad = 0;
	for (int i = 0; i < NPAGES; i++) {
		for (int j = 0; j < PAGE; j++)
			g_pages[i][j] = (uint8_t)(i * 131 + j * 7);
		snprintf(g_keys[i], sizeof(g_keys[i]), "kvp-driver-%d", i);
		CU_ASSERT_EQUAL(kvp_remote_put_page(g_r, &g_fp, g_keys[i], strlen(g_keys[i]),
						    g_pages[i], PAGE, 60, on_set, NULL),
				0);
	}
	kvp_remote_sync(g_r);
	drive(10000);
	CU_ASSERT_EQUAL(g_left, 0);
	CU_ASSERT_EQUAL(g_bad, 0);
	g_left = NPAGES + 1;
	for (int i = 0; i < NPAGES; i++) {
		CU_ASSERT_EQUAL(kvp_remote_get_page(g_r, &g_fp, PAGE, g_keys[i], strlen(g_keys[i]),
						    on_get, g_pages[i]),
				0);
		keys[i] = g_keys[i];
		klens[i] = strlen(g_keys[i]);
	}
	keys[NPAGES] = "kvp-driver-none";
	klens[NPAGES] = strlen("kvp-driver-none");
	CU_ASSERT_EQUAL(kvp_remote_exists_many(g_r, NPAGES + 1, keys, klens, on_exists, NULL), 0);
	kvp_remote_sync(g_r);
	drive(10000);
	CU_ASSERT_EQUAL(g_left, 0);
	CU_ASSERT_EQUAL(g_bad, 0);
}

#define NBIG 24
#define BIG (256 << 10)

struct page_want {
	const uint8_t *page; /* NULL: a refusal expected */
	enum kvp_rc_status st;
	int err;
};

static void on_page(void *arg, enum kvp_rc_status st, int err, const void *pl, size_t n)
{
	const struct page_want *w = arg;

	if (w->page)
		g_bad += st != KVP_RC_HIT || err || n != BIG || memcmp(pl, w->page, BIG) != 0;
	else
		g_bad += st != w->st || err != w->err || pl != NULL;
	g_left--;
}

static void test_kvp_remote_get_page_cluster_verified(void)
{
	static uint8_t pages[NBIG][BIG], bad[KVP_RV_HDR_SIZE + BIG];
	static struct page_want want[NBIG + 3];
	static const struct kvp_rv_fp other = { 4, 2, 64, 1, 32, 0 };
	char keys[NBIG + 3][32];

	CU_ASSERT_TRUE_FATAL(kvp_remote_ready(g_r));
	g_left = NBIG + 2;
	g_bad = 0;
	for (int i = 0; i < NBIG + 3; i++)
		snprintf(keys[i], sizeof(keys[i]), "kvp-driver-big-%d", i);
	for (int i = 0; i < NBIG; i++) {
		for (int j = 0; j < BIG; j++)
			pages[i][j] = (uint8_t)(i * 17 + j * 13 + (j >> 9));
		want[i] = (struct page_want){ .page = pages[i] };
		CU_ASSERT_EQUAL(kvp_remote_put_page(g_r, &g_fp, keys[i], strlen(keys[i]), pages[i],
						    BIG, 60, on_set, NULL),
				0);
	}
	/* A value whose payload changed after its header was made, and a foreign page. */
	struct kvp_rv_mac mac;

	CU_ASSERT_EQUAL_FATAL(kvp_rv_mac_init(&mac, H_SECRET, strlen(H_SECRET)), 0);
	kvp_rv_encode(&g_fp, &mac, keys[NBIG], strlen(keys[NBIG]), pages[0], BIG, bad);
	bad[KVP_RV_HDR_SIZE + 1000] ^= 1;
	CU_ASSERT_EQUAL(kvp_remote_set(g_r, keys[NBIG], strlen(keys[NBIG]), NULL, 0, bad,
				       sizeof(bad), 60, on_set, NULL),
			0);
	want[NBIG] = (struct page_want){ NULL, KVP_RC_HIT, -KVP_RV_ECHECKSUM };
	CU_ASSERT_EQUAL(kvp_remote_put_page(g_r, &other, keys[NBIG + 1], strlen(keys[NBIG + 1]),
					    pages[1], BIG, 60, on_set, NULL),
			0);
	want[NBIG + 1] = (struct page_want){ NULL, KVP_RC_HIT, -KVP_RV_EFOREIGN };
	want[NBIG + 2] = (struct page_want){ NULL, KVP_RC_MISS, 0 };
	kvp_remote_sync(g_r);
	drive(10000);
	CU_ASSERT_EQUAL(g_left, 0);
	CU_ASSERT_EQUAL(g_bad, 0);
	g_left = NBIG + 3;
	for (int i = 0; i < NBIG + 3; i++)
		CU_ASSERT_EQUAL(kvp_remote_get_page(g_r, &g_fp, BIG, keys[i], strlen(keys[i]),
						    on_page, &want[i]),
				0);
	kvp_remote_sync(g_r);
	drive(10000);
	CU_ASSERT_EQUAL(g_left, 0);
	CU_ASSERT_EQUAL(g_bad, 0);
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_kvp_remote_on_ready_cluster_roundtrip),
		H_TEST(test_kvp_remote_get_page_cluster_verified),
	};
	const char *ports = getenv("KVP_REDIS_PORTS");
	struct kvp_remote_conf c = { .enabled = 1,
				     .connect_timeout_ms = 1000,
				     .command_timeout_ms = 2000,
				     .max_inflight_bytes = 64 << 20 };
	int p[3], rc;

	if (!ports || sscanf(ports, "%d,%d,%d", &p[0], &p[1], &p[2]) != 3) {
		fprintf(stderr, "KVP_REDIS_PORTS not set: run through redis_cluster.sh\n");
		return 77;
	}
	snprintf(c.seeds, sizeof(c.seeds), "127.0.0.1:%d", p[1]);
	snprintf(c.secret, sizeof(c.secret), "%s", h_secret_src());
	g_r = kvp_remote_new(&c);
	if (!g_r)
		return 1;
	rc = H_RUN_SUITE("remote_driver_cluster", NULL, NULL, tests);
	kvp_remote_free(g_r);
	return rc;
}
