/* test_remote_cluster.c - the Redis Cluster layer without a cluster: key slots (the vectors of
 * the cluster specification), seed parsing, in-flight bounds, and failures that complete from
 * kvp_rc_tick() (never inside the submitting call). The real cluster: integration/. */
#include <CUnit/Basic.h>
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "remote_cluster.h"
#include "suite.h"

static unsigned slot(const char *k)
{
	return kvp_rc_slot(k, strlen(k));
}

static void test_rc_crc16_known_vector(void)
{
	CU_ASSERT_EQUAL(kvp_rc_crc16("123456789", 9), 0x31c3);
	CU_ASSERT_EQUAL(kvp_rc_crc16("", 0), 0);
	CU_ASSERT_EQUAL(slot("123456789"), 0x31c3 & 0x3fff);
}

static void test_rc_slot_hash_tags(void)
{
	CU_ASSERT_EQUAL(slot("foo"), 12182);
	CU_ASSERT_EQUAL(slot("bar"), 5061);
	CU_ASSERT_EQUAL(slot("{user1000}.following"), slot("{user1000}.followers"));
	CU_ASSERT_EQUAL(slot("{user1000}.following"), slot("user1000"));
	CU_ASSERT_EQUAL(slot("foo{bar}{zap}"), slot("bar"));
	CU_ASSERT_EQUAL(slot("foo{{bar}}zap"), slot("{bar"));
	/* an empty first tag: the whole key */
	CU_ASSERT_EQUAL(slot("foo{}{bar}"), kvp_rc_crc16("foo{}{bar}", 10) & 0x3fff);
	CU_ASSERT_NOT_EQUAL(slot("foo{}{bar}"), slot("bar"));
	/* no closing brace: the whole key */
	CU_ASSERT_EQUAL(slot("foo{bar"), kvp_rc_crc16("foo{bar", 7) & 0x3fff);
}

static void test_rc_new_rejects_bad_seeds(void)
{
	static const char *const bad[] = {
		"",  "localhost", "127.0.0.1:", "127.0.0.1:x", "127.0.0.1:70000", "127.0.0.1:1,",
		":5"
	};
	struct kvp_rc_config cfg = { 0 };

	CU_ASSERT_PTR_NULL(kvp_rc_new(&cfg));
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		cfg.seeds = bad[i];
		CU_ASSERT_PTR_NULL(kvp_rc_new(&cfg));
	}
}

struct seen {
	int calls;
	enum kvp_rc_status st;
};

static void on_done(void *arg, enum kvp_rc_status st, const void *val, size_t len)
{
	struct seen *s = arg;

	CU_ASSERT_PTR_NULL(val);
	CU_ASSERT_EQUAL(len, 0);
	s->calls++;
	s->st = st;
}

static void on_multi(void *arg, size_t n, const enum kvp_rc_status *st)
{
	struct seen *s = arg;

	CU_ASSERT_EQUAL(n, 2);
	s->calls++;
	s->st = st[0] == st[1] ? st[0] : KVP_RC_STATUS_MAX;
}

/* A seed nobody listens on: no slot map, so every operation fails as "no master", from the
 * tick; the bounds refuse with -EAGAIN and the callback is never called for those. */
static void test_rc_submit_without_map_fails_from_tick(void)
{
	struct kvp_rc_config cfg = { .seeds = "127.0.0.1:1", .max_inflight_cmds = 3 };
	struct kvp_rc *rc = kvp_rc_new(&cfg);
	struct seen g = { 0 }, s = { 0 }, e = { 0 }, x = { 0 };
	const void *keys[2] = { "a", "b" };
	size_t klens[2] = { 1, 1 };

	CU_ASSERT_PTR_NOT_NULL_FATAL(rc);
	CU_ASSERT_EQUAL(kvp_rc_get(rc, "k", 0, on_done, &g), -EINVAL);
	CU_ASSERT_EQUAL(kvp_rc_get(rc, "k", 1, on_done, &g), 0);
	CU_ASSERT_EQUAL(kvp_rc_exists_many(rc, 2, keys, klens, on_multi, &e), 0);
	CU_ASSERT_EQUAL(kvp_rc_set(rc, "k", 1, "h", 1, "v", 1, 0, on_done, &s), -EAGAIN);
	CU_ASSERT_EQUAL(kvp_rc_inflight(rc, NULL), 3);
	CU_ASSERT_EQUAL(kvp_rc_stats(rc)->rejected, 1);
	CU_ASSERT_EQUAL(g.calls + e.calls, 0); /* not inside the submission */
	CU_ASSERT_EQUAL(kvp_rc_next_timeout_ms(rc), 0);
	kvp_rc_tick(rc, kvp_rc_now_ms());
	CU_ASSERT_EQUAL(g.calls, 1);
	CU_ASSERT_EQUAL(g.st, KVP_RC_ENO_MASTER);
	CU_ASSERT_EQUAL(e.calls, 1);
	CU_ASSERT_EQUAL(e.st, KVP_RC_ENO_MASTER);
	CU_ASSERT_EQUAL(kvp_rc_inflight(rc, NULL), 0);
	CU_ASSERT_EQUAL(kvp_rc_stats(rc)->status[KVP_RC_ENO_MASTER], 3);
	CU_ASSERT_FALSE(kvp_rc_ready(rc));
	/* once the bounds have room again a submission is taken */
	CU_ASSERT_EQUAL(kvp_rc_del(rc, "k", 1, on_done, &x), 0);
	kvp_rc_free(rc);
	CU_ASSERT_EQUAL(x.calls, 1);
	CU_ASSERT_EQUAL(x.st, KVP_RC_ENO_MASTER);
	CU_ASSERT_EQUAL(s.calls, 0);
	CU_ASSERT_STRING_EQUAL(kvp_rc_strstatus(KVP_RC_ENODE_DOWN), "node down");
}

/* A seed that accepts the connection (the kernel's backlog) and never answers: its CLUSTER
 * SLOTS times out after op_timeout_ms, the node is dropped and the map asked again, instead of
 * waiting for that answer for ever. */
static void test_rc_slot_map_refresh_times_out(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t alen = sizeof(a);
	int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct kvp_rc_config cfg = { .op_timeout_ms = 100, .connect_timeout_ms = 100 };
	struct kvp_rc *rc;
	char seeds[64];
	uint64_t end;

	CU_ASSERT_FATAL(lfd >= 0);
	CU_ASSERT_FATAL(bind(lfd, (struct sockaddr *)&a, sizeof(a)) == 0);
	CU_ASSERT_FATAL(listen(lfd, 8) == 0);
	CU_ASSERT_FATAL(getsockname(lfd, (struct sockaddr *)&a, &alen) == 0);
	snprintf(seeds, sizeof(seeds), "127.0.0.1:%u", ntohs(a.sin_port));
	cfg.seeds = seeds;
	rc = kvp_rc_new(&cfg);
	CU_ASSERT_PTR_NOT_NULL_FATAL(rc);
	end = kvp_rc_now_ms() + 3000;
	while (kvp_rc_now_ms() < end && kvp_rc_stats(rc)->refresh_timeouts < 2) {
		struct pollfd p[KVP_RC_NODES_MAX];
		int n = kvp_rc_fds(rc, p, KVP_RC_NODES_MAX), t = kvp_rc_next_timeout_ms(rc);

		CU_ASSERT(t >= 0); /* a refresh in flight always has a deadline */
		if (poll(p, (nfds_t)n, t < 0 || t > 50 ? 50 : t) > 0)
			for (int i = 0; i < n; i++)
				if (p[i].revents)
					kvp_rc_on_ready(rc, p[i].fd, p[i].revents);
		kvp_rc_tick(rc, kvp_rc_now_ms());
	}
	CU_ASSERT(kvp_rc_stats(rc)->refresh_timeouts >= 2); /* asked, timed out, asked again */
	CU_ASSERT(kvp_rc_stats(rc)->connects >= 2);	    /* dropped, then connected again */
	CU_ASSERT_EQUAL(kvp_rc_stats(rc)->refreshes, 0);
	CU_ASSERT_FALSE(kvp_rc_ready(rc));
	kvp_rc_free(rc);
	close(lfd);
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_rc_crc16_known_vector),
		H_TEST(test_rc_slot_hash_tags),
		H_TEST(test_rc_new_rejects_bad_seeds),
		H_TEST(test_rc_submit_without_map_fails_from_tick),
		H_TEST(test_rc_slot_map_refresh_times_out),
	};

	return H_RUN_SUITE("remote_cluster", NULL, NULL, tests);
}
