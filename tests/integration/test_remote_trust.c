/* test_remote_trust.c - who can read and write a pool's remote content, against a real
 * 3-master Redis Cluster on loopback that refuses every command before AUTH (redis_cluster.sh
 * with KVP_REDIS_ACL=1: the default user off, one ACL user kvpool whose password is in
 * KVP_REDIS_DIR/password).
 *
 * Pools share remote content only within a remote_scope (by default the pool's name): pool a
 * (alice only) and pool b (bob only), same geometry, both write-through, never see each
 * other's pages, while pools c and d that name one scope do, except in a namespace bound to
 * other users. A value not written by a kvpoold holding the deployment's secret (a copied
 * header, other bytes, both checksums redone) is a miss, counted in remote_bad_mac and deleted.
 * kvpoold AUTHs as the ACL user with a password read from a file or a systemd credential; with
 * a wrong one it counts remote_auth_failures and reads nothing.
 * Clients run in forked processes dropping to uids 60001 (alice) and 60002 (bob). */
#include <CUnit/Basic.h>
#include <errno.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "eng.h"
#include "harness.h"
#include "kvpool.h"
#include "remote_value.h"
#include "secret.h"

#define ALICE 60001
#define BOB 60002

enum { PT = 4, NP = 4, NTOK = NP * PT, ROW = 16 /* kv_heads 1 * head_dim 8 * fp16 */ };

static char g_ports[3][8];
static const char *g_dir;
static char g_password[128];
static struct daemon g_d;

#define GEOMETRY                                                                                   \
	"layers = 2\nkv_heads = 1\nhead_dim = 8\ndtype = fp16\npage_tokens = 4\n"                  \
	"host_capacity = 256t\nmlock = off\nremote = write-through\n"

/* The [remote] section: the cluster, the ACL user and where its password is (password). */
static void remote_head(char *buf, size_t len, const char *password)
{
	snprintf(buf, len,
		 "[remote]\nseeds = 127.0.0.1:%s,127.0.0.1:%s,127.0.0.1:%s\n"
		 "connect_timeout_ms = 300\ncommand_timeout_ms = 2000\n"
		 "match_timeout_ms = 1500\nmatch_max_pages = 64\n"
		 "user = kvpool\npassword = %s\nsecret = %s\n",
		 g_ports[0], g_ports[1], g_ports[2], password, h_secret_src());
}

/* Pools a (alice), b (bob): one geometry, no scope. c, d: scope "shared", namespace 5 bound
 * to alice in c and to bob in d. e: root's. */
static const char *conf_main(void)
{
	static char buf[4096];
	char head[1024], pw[256];

	snprintf(pw, sizeof(pw), "file:%s/password", g_dir);
	remote_head(head, sizeof(head), pw);
	snprintf(buf, sizeof(buf),
		 "[daemon]\nsnapshot_interval_ms = 0\n%s"
		 "[pool.a]\n" GEOMETRY "allowed_users = %d\n"
		 "[pool.b]\n" GEOMETRY "allowed_users = %d\n"
		 "[pool.c]\n" GEOMETRY "remote_scope = shared\nnamespace.5 = user:%d\n"
		 "[pool.d]\n" GEOMETRY "remote_scope = shared\nnamespace.5 = user:%d\n"
		 "[pool.e]\n" GEOMETRY "allowed_users = 0\n",
		 head, ALICE, BOB, ALICE, BOB);
	return buf;
}

/* Another node of the deployment: pool e alone, the password from `password`. */
static const char *conf_node(const char *password)
{
	static char buf[2048];
	char head[1024];

	remote_head(head, sizeof(head), password);
	snprintf(buf, sizeof(buf), "[daemon]\nsnapshot_interval_ms = 0\n%s[pool.e]\n" GEOMETRY,
		 head);
	return buf;
}

static void tokens_of(uint32_t prompt, uint32_t *t)
{
	for (uint32_t i = 0; i < NTOK; i++)
		t[i] = (prompt << 12) | i;
}

/* Waits until node sock has nothing in flight to the cluster (5 s). */
static void settle(const char *sock)
{
	struct h_eng e;

	if (h_eng_open(&e, sock, "settle", "e") < 0)
		return;
	for (int i = 0; i < 500 && h_eng_counter(&e, "remote_inflight_ops") != 0; i++)
		usleep(10000);
	kvp_client_close(e.c);
}

/* Admin Flush of pool on node sock (as root). 0 or a code. */
static int flush(const char *sock, const char *pool)
{
	struct kvp_client *c = kvp_client_connect(sock, "flush", NULL);
	uint64_t n = 0;
	int r = c ? kvp_admin_flush(c, pool, &n, NULL) : -1;

	kvp_client_close(c);
	return r;
}

static int64_t counter(const char *sock, const char *name)
{
	struct h_eng e;
	int64_t v = -1;

	if (h_eng_open(&e, sock, "counter", "e") == 0)
		v = h_eng_counter(&e, name);
	kvp_client_close(e.c);
	return v;
}

/* What a client saw, through a pipe from its process. */
struct seen {
	int rc;		  /* 0, or the failing call's code */
	int remote_pages; /* Match's figure */
	int fetched;	  /* Fetch's pages */
	int bad;	  /* bytes of the fetched pages that differ from the pattern of seq */
	int forged;	  /* bytes equal to the forger's 0x41 (page 0's first row) */
};

/* Waits (5 s at most) until the node at sock has loaded the cluster's slot map: a node just
 * started connects in the background, and a probe before that finds no master. */
static void remote_ready(const char *sock)
{
	for (int i = 0; i < 500 && counter(sock, "remote_slot_map_loads") < 1; i++)
		usleep(10000);
}

/* A probe that must have fetched every page: on a shortfall, the node's remote figures say
 * why (a timeout, a dropped write, a node not connected yet). */
static void expect_all_fetched(const struct seen *s, const char *sock)
{
	if (s->fetched != NP)
		fprintf(stderr,
			"fetched %d of %d (remote_pages %d): written %ld, timeouts %ld, dropped %ld, "
			"pauses %ld, misses %ld, bad values %ld, node down %ld, no master %ld, "
			"slot maps %ld\n",
			s->fetched, NP, s->remote_pages,
			(long)counter(sock, "remote_written_pages"),
			(long)counter(sock, "remote_timeouts"),
			(long)counter(sock, "remote_spill_dropped"),
			(long)counter(sock, "remote_set_pauses"),
			(long)counter(sock, "remote_fetch_misses"),
			(long)counter(sock, "remote_bad_values"),
			(long)counter(sock, "remote_node_down"),
			(long)counter(sock, "remote_no_master"),
			(long)counter(sock, "remote_slot_map_loads"));
	CU_ASSERT_EQUAL(s->fetched, NP);
}

/* As uid (0: root), on pool ns of node sock: publish (pattern seq) prompt, or probe it (Match
 * then Fetch, the fetched bytes checked against pattern seq). */
static struct seen as_user(uid_t uid, const char *sock, const char *pool, uint64_t ns,
			   uint32_t prompt, uint32_t seq, int publish)
{
	struct seen s = { .rc = -1000 };
	int fds[2];
	pid_t pid;

	if (pipe(fds) < 0)
		return s;
	pid = fork();
	if (pid == 0) {
		struct kvp_match_result m = { .struct_size = sizeof(m) };
		struct kvp_fetch_result f = { .struct_size = sizeof(f) };
		uint32_t t[NTOK], pages[NP], dev[NP], host[NP];
		struct kvp_error err;
		struct h_eng e;
		uint64_t lease;

		close(fds[0]);
		if (uid && (setgroups(0, NULL) < 0 || setresgid(uid, uid, uid) < 0 ||
			    setresuid(uid, uid, uid) < 0))
			_exit(90);
		tokens_of(prompt, t);
		s = (struct seen){ 0 };
		if (h_eng_open(&e, sock, "trust", pool) < 0) {
			s.rc = -KVP_E_PERMISSION_DENIED;
		} else if (publish) {
			if ((s.rc = kvp_lease_alloc(e.p, KVP_TIER_HOST, NP, &lease, pages, &err)) ==
			    0) {
				h_eng_rows(e.p, KVP_TIER_HOST, pages, NTOK, PT, ROW, seq, 0);
				s.rc = kvp_cache_insert(e.p, lease, ns, t, NTOK, 0, pages, NP, NULL,
							&err);
				kvp_lease_free(e.p, lease, NULL, 0, NULL);
			}
		} else if ((s.rc = kvp_cache_match(e.p, ns, t, NTOK, 0, &m, dev, host, NP, &err)) ==
			   0) {
			s.remote_pages = (int)m.remote_pages;
			s.rc = kvp_cache_fetch(e.p, ns, t, NTOK, 1, &f, dev, host, NP, &err);
			s.fetched = (int)f.fetched_pages;
			if (f.n_host)
				s.bad = h_eng_rows(e.p, KVP_TIER_HOST, host, f.n_host * PT, PT, ROW,
						   seq, 1);
			if (f.n_host) {
				const uint8_t *row =
					kvp_pool_slot_addr(e.p, KVP_TIER_HOST, 0, 0, host[0], 0);

				for (int i = 0; row && i < ROW; i++)
					s.forged += row[i] == 0x41;
			}
			if (f.lock_id)
				kvp_cache_release(e.p, f.lock_id, NULL);
		}
		if (write(fds[1], &s, sizeof(s)) != sizeof(s))
			_exit(91);
		_exit(0);
	}
	close(fds[1]);
	if (pid < 0 || read(fds[0], &s, sizeof(s)) != sizeof(s))
		s.rc = -1000;
	close(fds[0]);
	if (pid > 0)
		h_wait_pid(pid, 20000);
	return s;
}

static void publish(uid_t uid, const char *pool, uint64_t ns, uint32_t prompt)
{
	struct seen s = as_user(uid, g_d.sock, pool, ns, prompt, prompt, 1);

	if (s.rc)
		fprintf(stderr, "publish of %u in pool %s ns %lu: %d\n", prompt, pool,
			(unsigned long)ns, s.rc);
	CU_ASSERT_EQUAL_FATAL(s.rc, 0);
	settle(g_d.sock);
}

static struct seen probe(uid_t uid, const char *sock, const char *pool, uint64_t ns,
			 uint32_t prompt)
{
	return as_user(uid, sock, pool, ns, prompt, prompt, 0);
}

/* Alice's and bob's pools of one geometry, both write-through, share nothing: bob (refused on
 * pool a) neither sees nor fetches alice's prefix into pool b, and alice's pool never gets
 * bob's bytes. Before, the remote key carried the geometry but no pool: bob's Match reported
 * alice's 4 pages and his Fetch brought her bytes into pool b. */
static void test_pools_of_other_users_share_nothing(void)
{
	struct seen s;

	CU_ASSERT_EQUAL(as_user(BOB, g_d.sock, "a", 0, 99, 99, 0).rc, -KVP_E_PERMISSION_DENIED);
	publish(ALICE, "a", 0, 1);
	s = probe(BOB, g_d.sock, "b", 0, 1);
	CU_ASSERT_EQUAL(s.rc, 0);
	CU_ASSERT_EQUAL(s.remote_pages, 0);
	CU_ASSERT_EQUAL(s.fetched, 0);
	publish(BOB, "b", 0, 2);
	s = probe(ALICE, g_d.sock, "a", 0, 2);
	CU_ASSERT_EQUAL(s.rc, 0);
	CU_ASSERT_EQUAL(s.remote_pages, 0);
	CU_ASSERT_EQUAL(s.fetched, 0);
	/* each pool reads its own content back from the cluster: the writes landed */
	CU_ASSERT_EQUAL(flush(g_d.sock, "a"), 0);
	s = probe(ALICE, g_d.sock, "a", 0, 1);
	expect_all_fetched(&s, g_d.sock);
	CU_ASSERT_EQUAL(s.bad, 0);
	CU_ASSERT_EQUAL(flush(g_d.sock, "b"), 0);
	s = probe(BOB, g_d.sock, "b", 0, 2);
	expect_all_fetched(&s, g_d.sock);
	CU_ASSERT_EQUAL(s.bad, 0);
}

/* Pools c and d name one remote_scope: they share content (alice's prefix in c is bob's hit in
 * d), but not in namespace 5, bound to alice in c and to bob in d. */
static void test_scope_shares_and_bindings_apply(void)
{
	struct seen s;

	publish(ALICE, "c", 0, 3);
	s = probe(BOB, g_d.sock, "d", 0, 3);
	CU_ASSERT_EQUAL(s.rc, 0);
	CU_ASSERT_EQUAL(s.remote_pages, NP);
	expect_all_fetched(&s, g_d.sock);
	CU_ASSERT_EQUAL(s.bad, 0);
	publish(ALICE, "c", 5, 4);
	s = probe(BOB, g_d.sock, "d", 5, 4);
	CU_ASSERT_EQUAL(s.rc, 0);
	CU_ASSERT_EQUAL(s.remote_pages, 0);
	CU_ASSERT_EQUAL(s.fetched, 0);
	/* alice reads namespace 5 of c back: it is there */
	CU_ASSERT_EQUAL(flush(g_d.sock, "c"), 0);
	s = probe(ALICE, g_d.sock, "c", 5, 4);
	expect_all_fetched(&s, g_d.sock);
	CU_ASSERT_EQUAL(s.bad, 0);
}

/* An authenticated connection to the master of key (the one of the three that does not answer
 * MOVED), or NULL. */
static redisContext *master_of(const char *key)
{
	for (int i = 0; i < 3; i++) {
		redisContext *c = redisConnect("127.0.0.1", atoi(g_ports[i]));
		redisReply *r = c && !c->err ? redisCommand(c, "AUTH kvpool %s", g_password) : NULL;
		int ok = r && r->type == REDIS_REPLY_STATUS;

		freeReplyObject(r);
		r = ok ? redisCommand(c, "EXISTS %s", key) : NULL;
		ok = r && r->type == REDIS_REPLY_INTEGER;
		freeReplyObject(r);
		if (ok)
			return c;
		if (c)
			redisFree(c);
	}
	return NULL;
}

static void put32le(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

/* Someone who can write to the cluster (here with kvpool's own ACL user; without AUTH on the
 * cluster, any local user) takes the value kvpoold wrote for page 0 of prompt 6 of pool e,
 * puts other bytes under its header and redoes both CRC32Cs: kvpoold's Fetch refuses it
 * (remote_bad_mac), deletes it, and never serves those bytes. Before, the forged page was
 * fetched into the pool and served. */
static void test_forged_value_is_a_miss(void)
{
	struct kvp_rv_fp fp = { 2, 1, 8, 0, PT, 0 };
	char ns[KVP_RV_NSNAME_MAX], key[KVP_RV_KEY_MAX];
	uint32_t t[NTOK];
	uint8_t h[KVP_RV_HASH_SIZE], *v;
	redisContext *c;
	redisReply *r;
	int64_t bad_mac;
	size_t len;
	struct seen s;

	publish(0, "e", 0, 6);
	tokens_of(6, t);
	kvp_rv_page_hash(NULL, t, PT, h);
	kvp_rv_ns_name("e", NULL, 0, 0, ns);
	CU_ASSERT_FATAL(kvp_rv_key(&fp, ns, h, key) > 0);
	c = master_of(key);
	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	r = redisCommand(c, "GET %s", key);
	CU_ASSERT_FATAL(r && r->type == REDIS_REPLY_STRING && r->len > KVP_RV_HDR_SIZE);
	len = r->len;
	v = malloc(len);
	CU_ASSERT_PTR_NOT_NULL_FATAL(v);
	memcpy(v, r->str, len);
	freeReplyObject(r);
	memset(v + KVP_RV_HDR_SIZE, 0x41, len - KVP_RV_HDR_SIZE); /* the forger's bytes */
	put32le(v + 40, kvp_rv_crc32c(v + KVP_RV_HDR_SIZE, len - KVP_RV_HDR_SIZE));
	put32le(v + 44, kvp_rv_crc32c(v, 44));
	r = redisCommand(c, "SET %s %b", key, v, len);
	CU_ASSERT(r && r->type == REDIS_REPLY_STATUS);
	freeReplyObject(r);
	free(v);
	bad_mac = counter(g_d.sock, "remote_bad_mac");
	CU_ASSERT_EQUAL(flush(g_d.sock, "e"), 0);
	s = probe(0, g_d.sock, "e", 0, 6);
	CU_ASSERT_EQUAL(s.rc, 0);
	CU_ASSERT_EQUAL(s.forged, 0);
	CU_ASSERT_EQUAL(s.fetched, 0); /* page 0 refused: nothing after it is linked */
	settle(g_d.sock);
	CU_ASSERT_EQUAL(counter(g_d.sock, "remote_bad_mac") - bad_mac, 1);
	r = redisCommand(c, "EXISTS %s", key); /* deleted */
	CU_ASSERT(r && r->type == REDIS_REPLY_INTEGER && r->integer == 0);
	freeReplyObject(r);
	redisFree(c);
}

/* The cluster refuses a client without AUTH; kvpoold AUTHs as its ACL user (every write above
 * landed, no failure counted). A second node reads the password from a systemd credential and
 * reads the first node's pool e content (one deployment: same scope, same secret); a third
 * with a wrong password counts AUTH failures and reads nothing. */
static void test_auth_from_file_and_credential(void)
{
	char cred[] = "/tmp/kvp-cred.XXXXXX", path[320], bad[256];
	redisContext *c = redisConnect("127.0.0.1", atoi(g_ports[0]));
	redisReply *r = c && !c->err ? redisCommand(c, "SET kvp-trust-noauth x") : NULL;
	struct daemon n2, n3;
	struct seen s;
	FILE *f;

	CU_ASSERT(r && r->type == REDIS_REPLY_ERROR && strstr(r->str, "NOAUTH"));
	freeReplyObject(r);
	if (c)
		redisFree(c);
	CU_ASSERT_EQUAL(counter(g_d.sock, "remote_auth_failures"), 0);
	publish(0, "e", 0, 7);
	CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(cred));
	snprintf(path, sizeof(path), "%s/redis-password", cred);
	CU_ASSERT_FATAL((f = fopen(path, "w")) != NULL);
	fprintf(f, "%s\n", g_password);
	fclose(f);
	CU_ASSERT_EQUAL(chmod(path, 0400), 0);
	setenv("CREDENTIALS_DIRECTORY", cred, 1);
	CU_ASSERT_EQUAL_FATAL(h_daemon_start(&n2, conf_node("credential:redis-password"), NULL), 0);
	remote_ready(n2.sock);
	unsetenv("CREDENTIALS_DIRECTORY");
	s = probe(0, n2.sock, "e", 0, 7);
	CU_ASSERT_EQUAL(s.rc, 0);
	expect_all_fetched(&s, n2.sock);
	CU_ASSERT_EQUAL(s.bad, 0);
	CU_ASSERT_EQUAL(counter(n2.sock, "remote_auth_failures"), 0);
	CU_ASSERT_EQUAL(h_daemon_finish(&n2), 0);

	snprintf(bad, sizeof(bad), "%s/wrong", cred);
	CU_ASSERT_FATAL((f = fopen(bad, "w")) != NULL);
	fputs("not-the-password\n", f);
	fclose(f);
	CU_ASSERT_EQUAL(chmod(bad, 0600), 0);
	snprintf(path, sizeof(path), "file:%s", bad);
	CU_ASSERT_EQUAL_FATAL(h_daemon_start(&n3, conf_node(path), NULL), 0);
	for (int i = 0; i < 300 && counter(n3.sock, "remote_auth_failures") < 3; i++)
		usleep(10000);
	CU_ASSERT(counter(n3.sock, "remote_auth_failures") >= 3);
	s = probe(0, n3.sock, "e", 0, 7);
	CU_ASSERT_EQUAL(s.rc, 0);
	CU_ASSERT_EQUAL(s.fetched, 0);
	CU_ASSERT_EQUAL(h_daemon_finish(&n3), 0);
	unlink(bad);
	snprintf(path, sizeof(path), "%s/redis-password", cred);
	unlink(path);
	rmdir(cred);
}

static int init_suite(void)
{
	static const char *const args[] = { NULL };

	if (h_daemon_start(&g_d, conf_main(), args) < 0)
		return -1;
	if (chmod(g_d.dir, 0755) < 0 || chmod(g_d.sock, 0666) < 0)
		return -1;
	return 0;
}

static int clean_suite(void)
{
	return h_daemon_finish(&g_d);
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_pools_of_other_users_share_nothing),
		H_TEST(test_scope_shares_and_bindings_apply),
		H_TEST(test_forged_value_is_a_miss),
		H_TEST(test_auth_from_file_and_credential),
	};
	const char *ports = getenv("KVP_REDIS_PORTS");
	char path[512];
	FILE *f;

	g_dir = getenv("KVP_REDIS_DIR");
	if (!ports || !g_dir ||
	    sscanf(ports, "%7[0-9],%7[0-9],%7[0-9]", g_ports[0], g_ports[1], g_ports[2]) != 3) {
		fprintf(stderr, "KVP_REDIS_PORTS not set: run through redis_cluster.sh\n");
		return 77;
	}
	if (geteuid() != 0) {
		fprintf(stderr, "skip: needs root (clients of other users)\n");
		return 77;
	}
	snprintf(path, sizeof(path), "%s/password", g_dir);
	if (!(f = fopen(path, "r")) || !fgets(g_password, sizeof(g_password), f)) {
		fprintf(stderr, "no %s: run through redis_cluster.sh with KVP_REDIS_ACL=1\n", path);
		return 1;
	}
	fclose(f);
	g_password[strcspn(g_password, "\n")] = '\0';
	return H_RUN_SUITE("remote_trust", init_suite, clean_suite, tests);
}
