/* test_remote_driver.c - daemon/remote.c against a real 3-master Redis Cluster on loopback
 * (redis_cluster.sh: KVP_REDIS_PORTS): the owner polls the driver's one fd and nothing else
 * (the I/O thread does the rest);
 * 300 page values are written and read back byte for byte, and EXISTS finds them. */
#include <CUnit/Basic.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "remote.h"
#include "remote_cluster.h"
#include "suite.h"

#define NPAGES 300
#define PAGE 8192

static struct kvp_remote *g_r;
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

static void on_get(void *arg, enum kvp_rc_status st, const void *val, size_t len)
{
	const uint8_t *want = arg;

	g_bad += st != KVP_RC_HIT || len != PAGE || memcmp(val, want, PAGE) != 0;
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
		CU_ASSERT_EQUAL(kvp_remote_set(g_r, g_keys[i], strlen(g_keys[i]), NULL, 0,
					       g_pages[i], PAGE, 60, on_set, NULL),
				0);
	}
	kvp_remote_sync(g_r);
	drive(10000);
	CU_ASSERT_EQUAL(g_left, 0);
	CU_ASSERT_EQUAL(g_bad, 0);
	g_left = NPAGES + 1;
	for (int i = 0; i < NPAGES; i++) {
		CU_ASSERT_EQUAL(kvp_remote_get(g_r, g_keys[i], strlen(g_keys[i]), on_get,
					       g_pages[i]),
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

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_kvp_remote_on_ready_cluster_roundtrip),
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
	g_r = kvp_remote_new(&c);
	if (!g_r)
		return 1;
	rc = H_RUN_SUITE("remote_driver_cluster", NULL, NULL, tests);
	kvp_remote_free(g_r);
	return rc;
}
