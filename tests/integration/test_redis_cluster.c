/* test_redis_cluster.c - the remote tier's cluster layer against a real 3-master Redis Cluster
 * on loopback (started by redis_cluster.sh: KVP_REDIS_PORTS, KVP_REDIS_DIR), driven by a poll
 * loop here: one key's operations in order on a master still connecting, 1,000 page values
 * SET / GET / EXISTS across all slots, an ASK (slot migrating) and
 * a MOVED (slot moved), hand-written corrupt and foreign values refused, a slowed node timing
 * out, a killed master failing fast while the others serve, and its recovery. */
#include <CUnit/Basic.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "remote_cluster.h"
#include "remote_value.h"
#include "suite.h"

#define NPAGES 1000
#define PAGE 16384

static const struct kvp_rv_fp fp = { 32, 8, 128, 1, 16, 0 };
static struct kvp_rc *rc;
static int ports[3];
static const char *dir;
static char keys[NPAGES][KVP_RV_KEY_MAX];
static size_t klens[NPAGES];
static struct kvp_rv_mac g_mac; /* the values' MAC key */
static int owner[KVP_RC_SLOTS]; /* index into ports, from CLUSTER SLOTS; -1: none */

struct res {
	int idx;
	int done;
	enum kvp_rc_status st;
	int verified; /* GET: decoded and equal to the page written */
	int decode_err;
};
static struct res res[NPAGES];
static int left;

static void page_fill(uint8_t *p, int idx)
{
	uint32_t s = (uint32_t)idx * 2654435761u + 1;

	for (size_t i = 0; i < PAGE; i += 4) {
		s = s * 1664525u + 1013904223u;
		memcpy(p + i, &s, 4);
	}
}

static void pump_rc(struct kvp_rc *rc, int max_wait)
{
	struct pollfd p[KVP_RC_NODES_MAX];
	int n = kvp_rc_fds(rc, p, KVP_RC_NODES_MAX), t = kvp_rc_next_timeout_ms(rc);

	if (t < 0 || t > max_wait)
		t = max_wait;
	if (poll(p, (nfds_t)n, t) > 0)
		for (int i = 0; i < n; i++)
			if (p[i].revents)
				kvp_rc_on_ready(rc, p[i].fd, p[i].revents);
	kvp_rc_tick(rc, kvp_rc_now_ms());
}

static void pump(int max_wait)
{
	pump_rc(rc, max_wait);
}

/* Drives the client until left reaches 0 or max_ms pass. Returns 0 when it did. */
static int drive(int max_ms)
{
	uint64_t end = kvp_rc_now_ms() + (uint64_t)max_ms;

	while (left > 0 && kvp_rc_now_ms() < end)
		pump(10);
	return left > 0 ? -ETIMEDOUT : 0;
}

static redisReply *admin(int port, const char *fmt, ...)
{
	struct timeval tv = { 5, 0 };
	redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
	redisReply *r = NULL;
	va_list ap;

	if (!c || c->err) {
		redisFree(c);
		return NULL;
	}
	redisSetTimeout(c, tv);
	va_start(ap, fmt);
	r = redisvCommand(c, fmt, ap);
	va_end(ap);
	redisFree(c);
	return r;
}

static int port_index(long long port)
{
	for (int i = 0; i < 3; i++)
		if (ports[i] == port)
			return i;
	return -1;
}

/* owner[] from CLUSTER SLOTS of any live node. */
static int load_owners(void)
{
	for (int k = 0; k < 3; k++) {
		redisReply *r = admin(ports[k], "CLUSTER SLOTS");

		if (!r || r->type != REDIS_REPLY_ARRAY) {
			freeReplyObject(r);
			continue;
		}
		for (int s = 0; s < KVP_RC_SLOTS; s++)
			owner[s] = -1;
		for (size_t i = 0; i < r->elements; i++) {
			redisReply *e = r->element[i];
			int who = port_index(e->element[2]->element[1]->integer);

			for (long long s = e->element[0]->integer; s <= e->element[1]->integer; s++)
				owner[s] = who;
		}
		freeReplyObject(r);
		return 0;
	}
	return -1;
}

static int key_owner(int i)
{
	return owner[kvp_rc_slot(keys[i], klens[i])];
}

static void on_op(void *arg, enum kvp_rc_status st, const void *val, size_t len)
{
	struct res *r = arg;
	static uint8_t want[PAGE];
	const void *pl;
	uint64_t n;

	r->done++;
	r->st = st;
	r->verified = 0;
	r->decode_err = 0;
	if (st == KVP_RC_HIT && val) {
		r->decode_err = kvp_rv_decode(&fp, &g_mac, keys[r->idx], klens[r->idx], PAGE, val,
					      len, &pl, &n);
		if (!r->decode_err) {
			page_fill(want, r->idx);
			r->verified = !memcmp(pl, want, PAGE);
		}
	}
	left--;
}

/* Counts of each status among res[0..n), on stderr (when an assertion is about to fail). */
static void show(const char *what, int n)
{
	int c[KVP_RC_STATUS_MAX] = { 0 };

	for (int i = 0; i < n; i++)
		c[res[i].st]++;
	fprintf(stderr, "%s:", what);
	for (int s = 0; s < KVP_RC_STATUS_MAX; s++)
		if (c[s])
			fprintf(stderr, " %s %d", kvp_rc_strstatus((enum kvp_rc_status)s), c[s]);
	fputc('\n', stderr);
}

static void reset(void)
{
	for (int i = 0; i < NPAGES; i++)
		res[i] = (struct res){ .idx = i };
}

static void set_page(int i)
{
	static uint8_t page[PAGE];
	uint8_t hdr[KVP_RV_HDR_SIZE];

	page_fill(page, i);
	kvp_rv_header(&fp, &g_mac, keys[i], klens[i], page, PAGE, hdr);
	left++;
	while (kvp_rc_set(rc, keys[i], klens[i], hdr, sizeof(hdr), page, PAGE, 600, on_op,
			  &res[i]) == -EAGAIN)
		pump(10);
}

static void get_page(int i)
{
	left++;
	while (kvp_rc_get(rc, keys[i], klens[i], on_op, &res[i]) == -EAGAIN)
		pump(10);
}

static int init(void)
{
	const char *p = getenv("KVP_REDIS_PORTS");
	struct kvp_rc_config cfg = { .op_timeout_ms = 1000,
				     .connect_timeout_ms = 1000,
				     .max_inflight_bytes = 4u << 20,
				     .backoff_max_ms = 500 };
	char seeds[128];
	uint8_t h[32], prev[32];
	uint32_t toks[16];

	dir = getenv("KVP_REDIS_DIR");
	kvp_rv_mac_init(&g_mac, "itest-secret-0123456789", 23);
	if (!p || !dir || sscanf(p, "%d,%d,%d", &ports[0], &ports[1], &ports[2]) != 3)
		return -1;
	for (int i = 0; i < NPAGES; i++) {
		for (int t = 0; t < 16; t++)
			toks[t] = (uint32_t)(i * 16 + t);
		kvp_rv_page_hash(i ? prev : NULL, toks, 16, h);
		memcpy(prev, h, 32);
		klens[i] = (size_t)kvp_rv_key(&fp, "itest", h, keys[i]);
	}
	snprintf(seeds, sizeof(seeds), "127.0.0.1:%d", ports[0]); /* the rest from the map */
	cfg.seeds = seeds;
	rc = kvp_rc_new(&cfg);
	return rc && !load_owners() ? 0 : -1;
}

static int clean(void)
{
	const struct kvp_rc_stats *s = kvp_rc_stats(rc);

	printf("\nstats: moved %llu ask %llu refreshes %llu connects %llu disconnects %llu "
	       "rejected %llu timeouts %llu node-down %llu\n",
	       (unsigned long long)s->moved, (unsigned long long)s->ask,
	       (unsigned long long)s->refreshes, (unsigned long long)s->connects,
	       (unsigned long long)s->disconnects, (unsigned long long)s->rejected,
	       (unsigned long long)s->status[KVP_RC_ETIMEOUT],
	       (unsigned long long)s->status[KVP_RC_ENODE_DOWN]);
	kvp_rc_free(rc);
	return 0;
}

static void test_rc_map_loads_from_one_seed(void)
{
	uint64_t end = kvp_rc_now_ms() + 5000;

	while (!kvp_rc_ready(rc) && kvp_rc_now_ms() < end)
		pump(10);
	CU_ASSERT_FATAL(kvp_rc_ready(rc));
	CU_ASSERT(kvp_rc_stats(rc)->refreshes >= 1);
	CU_ASSERT(kvp_rc_stats(rc)->connects >= 3);
}

static void test_rc_slot_matches_server(void)
{
	static const char *const tagged[] = { "{user1000}.following", "{user1000}.followers",
					      "foo{}{bar}", "foo{{bar}}zap", "foo{bar}{zap}" };

	for (int i = 0; i < 200; i++) {
		redisReply *r = admin(ports[i % 3], "CLUSTER KEYSLOT %b", keys[i], klens[i]);

		CU_ASSERT_FATAL(r && r->type == REDIS_REPLY_INTEGER);
		CU_ASSERT_EQUAL(r->integer, kvp_rc_slot(keys[i], klens[i]));
		freeReplyObject(r);
	}
	for (size_t i = 0; i < sizeof(tagged) / sizeof(tagged[0]); i++) {
		redisReply *r = admin(ports[0], "CLUSTER KEYSLOT %s", tagged[i]);

		CU_ASSERT_FATAL(r && r->type == REDIS_REPLY_INTEGER);
		CU_ASSERT_EQUAL(r->integer, kvp_rc_slot(tagged[i], strlen(tagged[i])));
		freeReplyObject(r);
	}
}

struct multi {
	int calls;
	size_t n;
	enum kvp_rc_status st[NPAGES + 24];
};

static void on_multi(void *arg, size_t n, const enum kvp_rc_status *st)
{
	struct multi *m = arg;

	m->calls++;
	m->n = n;
	memcpy(m->st, st, n * sizeof(*st));
	left--;
}

/* Completions in the order they came, for the ordering test. */
static char g_order[8][8];
static enum kvp_rc_status g_order_st[8];
static size_t g_order_len[8];
static int g_norder;

static void on_ordered(void *arg, enum kvp_rc_status st, const void *val, size_t len)
{
	(void)val;
	if (g_norder < 8) {
		snprintf(g_order[g_norder], sizeof(g_order[0]), "%s", (const char *)arg);
		g_order_st[g_norder] = st;
		g_order_len[g_norder++] = len;
	}
	left--;
}

/* One key's operations keep their order on a master still connecting: a fresh client that has
 * just loaded the map sends a value written from the caller's buffer (kvp_rc_set_ref, held
 * until the connection is up), then DEL and GET of the same key. They complete in that order
 * and the key is gone; before, the DEL and GET went ahead of the held SET and the value
 * survived its DEL. */
static void test_rc_order_kept_while_connecting(void)
{
	char seeds[32], key[32];
	struct kvp_rc_config cfg = { .seeds = seeds,
				     .op_timeout_ms = 2000,
				     .connect_timeout_ms = 2000 };
	static char val[70000];
	uint64_t end = kvp_rc_now_ms() + 5000;
	struct kvp_rc *c;

	snprintf(seeds, sizeof(seeds), "127.0.0.1:%d", ports[0]);
	c = kvp_rc_new(&cfg);
	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	while (kvp_rc_stats(c)->refreshes < 1 && kvp_rc_now_ms() < end)
		pump_rc(c, 10);
	CU_ASSERT_FATAL(kvp_rc_stats(c)->refreshes >= 1);
	for (int i = 0;; i++) { /* a key whose master is not the seed */
		snprintf(key, sizeof(key), "ordkey%d", i);
		if (owner[kvp_rc_slot(key, strlen(key))] != 0)
			break;
	}
	CU_ASSERT(!kvp_rc_ready(c)); /* the other masters are still connecting */
	memset(val, 'x', sizeof(val));
	g_norder = 0;
	left = 3;
	CU_ASSERT_EQUAL(kvp_rc_set_ref(c, key, strlen(key), NULL, 0, val, sizeof(val), 0,
				       on_ordered, "SET"),
			0);
	CU_ASSERT_EQUAL(kvp_rc_del(c, key, strlen(key), on_ordered, "DEL"), 0);
	CU_ASSERT_EQUAL(kvp_rc_get(c, key, strlen(key), on_ordered, "GET"), 0);
	while (left > 0 && kvp_rc_now_ms() < end)
		pump_rc(c, 10);
	CU_ASSERT_EQUAL_FATAL(g_norder, 3);
	CU_ASSERT_STRING_EQUAL(g_order[0], "SET");
	CU_ASSERT_EQUAL(g_order_st[0], KVP_RC_OK);
	CU_ASSERT_STRING_EQUAL(g_order[1], "DEL");
	CU_ASSERT_EQUAL(g_order_st[1], KVP_RC_OK);
	CU_ASSERT_STRING_EQUAL(g_order[2], "GET");
	CU_ASSERT_EQUAL(g_order_st[2], KVP_RC_MISS);
	left = 1;
	CU_ASSERT_EQUAL(kvp_rc_get(c, key, strlen(key), on_ordered, "GET2"), 0);
	while (left > 0 && kvp_rc_now_ms() < end)
		pump_rc(c, 10);
	CU_ASSERT_EQUAL(g_order_st[3], KVP_RC_MISS); /* the DEL took the value */
	CU_ASSERT_EQUAL(g_order_len[3], 0);
	kvp_rc_free(c);
}

static void test_rc_set_get_exists_1000_pages(void)
{
	static struct multi m;
	static char absent[24][KVP_RV_KEY_MAX];
	const void *ks[NPAGES + 24];
	size_t kl[NPAGES + 24];
	int per_node[3] = { 0 }, ok = 0, hit = 0;
	uint64_t t0;

	reset();
	t0 = kvp_rc_now_ms();
	for (int i = 0; i < NPAGES; i++)
		set_page(i);
	CU_ASSERT_EQUAL_FATAL(drive(30000), 0);
	for (int i = 0; i < NPAGES; i++) {
		ok += res[i].done == 1 && res[i].st == KVP_RC_OK;
		per_node[key_owner(i)]++;
	}
	if (ok != NPAGES)
		show("SET", NPAGES);
	CU_ASSERT_EQUAL(ok, NPAGES);
	printf("\nSET %d x %d B: %llu ms; ", NPAGES, PAGE,
	       (unsigned long long)(kvp_rc_now_ms() - t0));
	for (int k = 0; k < 3; k++)
		CU_ASSERT(per_node[k] > NPAGES / 6); /* spread over the three masters */
	reset();
	t0 = kvp_rc_now_ms();
	for (int i = 0; i < NPAGES; i++)
		get_page(i);
	CU_ASSERT_EQUAL_FATAL(drive(30000), 0);
	for (int i = 0; i < NPAGES; i++)
		hit += res[i].done == 1 && res[i].st == KVP_RC_HIT && res[i].verified;
	if (hit != NPAGES)
		show("GET", NPAGES);
	CU_ASSERT_EQUAL(hit, NPAGES);
	printf("GET: %llu ms\n", (unsigned long long)(kvp_rc_now_ms() - t0));
	for (int i = 0; i < NPAGES; i++) {
		ks[i] = keys[i];
		kl[i] = klens[i];
	}
	for (int i = 0; i < 24; i++) {
		uint8_t h[32] = { (uint8_t)i, 0xee };

		kl[NPAGES + i] = (size_t)kvp_rv_key(&fp, "itest", h, absent[i]);
		ks[NPAGES + i] = absent[i];
	}
	left = 1;
	CU_ASSERT_EQUAL_FATAL(kvp_rc_exists_many(rc, NPAGES + 24, ks, kl, on_multi, &m), 0);
	CU_ASSERT_EQUAL_FATAL(drive(10000), 0);
	CU_ASSERT_EQUAL(m.calls, 1);
	CU_ASSERT_EQUAL(m.n, NPAGES + 24);
	hit = 0;
	for (int i = 0; i < NPAGES; i++)
		hit += m.st[i] == KVP_RC_HIT;
	CU_ASSERT_EQUAL(hit, NPAGES);
	for (int i = 0; i < 24; i++)
		CU_ASSERT_EQUAL(m.st[NPAGES + i], KVP_RC_MISS);
	CU_ASSERT_EQUAL(kvp_rc_inflight(rc, NULL), 0);
}

/* Writes bytes as the value of keys[i] through redis-cli (following redirects). */
static int cli_set(int i, const void *v, size_t n)
{
	char path[512], cmd[1024];
	FILE *f;
	int st;

	snprintf(path, sizeof(path), "%s/value.bin", dir);
	f = fopen(path, "wb");
	if (!f || fwrite(v, 1, n, f) != n) {
		if (f)
			fclose(f);
		return -1;
	}
	fclose(f);
	snprintf(cmd, sizeof(cmd), "redis-cli -c -h 127.0.0.1 -p %d -x SET %s < %s >/dev/null",
		 ports[0], keys[i], path);
	st = system(cmd);
	return st == 0 ? 0 : -1;
}

static void test_rc_corrupt_and_foreign_values_are_refused(void)
{
	static uint8_t page[PAGE], v[KVP_RV_HDR_SIZE + PAGE];
	struct kvp_rv_fp other = fp;
	static const int want[3] = { -KVP_RV_EMAGIC, -KVP_RV_EFOREIGN, -KVP_RV_ECHECKSUM };

	memset(v, 'x', 100); /* longer than a header, not one */
	CU_ASSERT_EQUAL_FATAL(cli_set(0, v, 100), 0);
	other.layers = 33;
	page_fill(page, 1);
	kvp_rv_encode(&other, &g_mac, keys[1], klens[1], page, PAGE, v);
	CU_ASSERT_EQUAL_FATAL(cli_set(1, v, sizeof(v)), 0);
	page_fill(page, 2);
	kvp_rv_encode(&fp, &g_mac, keys[2], klens[2], page, PAGE, v);
	v[KVP_RV_HDR_SIZE + 100] ^= 1;
	CU_ASSERT_EQUAL_FATAL(cli_set(2, v, sizeof(v)), 0);
	reset();
	for (int i = 0; i < 4; i++)
		get_page(i);
	CU_ASSERT_EQUAL_FATAL(drive(5000), 0);
	for (int i = 0; i < 3; i++) {
		if (res[i].decode_err != want[i])
			fprintf(stderr, "value %d: %s\n", i, kvp_rv_strerror(res[i].decode_err));
		CU_ASSERT_EQUAL(res[i].st, KVP_RC_HIT);	     /* the bytes came back... */
		CU_ASSERT_EQUAL(res[i].decode_err, want[i]); /* ...and are refused */
		CU_ASSERT_FALSE(res[i].verified);
	}
	CU_ASSERT(res[3].st == KVP_RC_HIT && res[3].verified); /* the neighbour is intact */
	/* refused values are deleted: gone afterwards */
	reset();
	for (int i = 0; i < 3; i++) {
		left++;
		CU_ASSERT_EQUAL(kvp_rc_del(rc, keys[i], klens[i], on_op, &res[i]), 0);
	}
	CU_ASSERT_EQUAL_FATAL(drive(5000), 0);
	for (int i = 0; i < 3; i++)
		CU_ASSERT_EQUAL(res[i].st, KVP_RC_OK);
	reset();
	for (int i = 0; i < 3; i++)
		get_page(i);
	CU_ASSERT_EQUAL_FATAL(drive(5000), 0);
	for (int i = 0; i < 3; i++)
		CU_ASSERT_EQUAL(res[i].st, KVP_RC_MISS);
	reset();
	for (int i = 0; i < 3; i++) /* written back for the tests after this one */
		set_page(i);
	CU_ASSERT_EQUAL_FATAL(drive(5000), 0);
}

static char *myid(int port)
{
	redisReply *r = admin(port, "CLUSTER MYID");
	char *id = r && r->type == REDIS_REPLY_STRING ? strdup(r->str) : NULL;

	freeReplyObject(r);
	return id;
}

static int admin_ok(redisReply *r)
{
	int ok = r && r->type == REDIS_REPLY_STATUS;

	if (!ok)
		fprintf(stderr, "admin: %s\n", r ? r->str : "no reply");
	freeReplyObject(r);
	return ok;
}

/* Migrates the slot of a page from its master A to B: while migrating, a new key of the slot
 * answers ASK (written on B through ASKING); once moved, the old key answers MOVED. */
static void test_rc_ask_while_migrating_then_moved(void)
{
	uint64_t ask0 = kvp_rc_stats(rc)->ask, moved0;
	char k2[64], *ida, *idb;
	int j = 5, a = key_owner(j), b = (a + 1) % 3, c = (a + 2) % 3, n = 0;
	unsigned s = kvp_rc_slot(keys[j], klens[j]);
	static struct res r2;
	static uint8_t page[PAGE];
	redisReply *r;

	ida = myid(ports[a]);
	idb = myid(ports[b]);
	CU_ASSERT_FATAL(ida && idb);
	do
		snprintf(k2, sizeof(k2), "kvp-ask-%d", n++);
	while (kvp_rc_slot(k2, strlen(k2)) != s);
	CU_ASSERT_FATAL(admin_ok(admin(ports[b], "CLUSTER SETSLOT %u IMPORTING %s", s, ida)));
	CU_ASSERT_FATAL(admin_ok(admin(ports[a], "CLUSTER SETSLOT %u MIGRATING %s", s, idb)));
	/* a new key of a migrating slot: ASK to B */
	page_fill(page, 7);
	left = 1;
	r2 = (struct res){ .idx = 7 };
	CU_ASSERT_EQUAL(kvp_rc_set(rc, k2, strlen(k2), NULL, 0, page, 64, 60, on_op, &r2), 0);
	CU_ASSERT_EQUAL_FATAL(drive(5000), 0);
	CU_ASSERT_EQUAL(r2.st, KVP_RC_OK);
	CU_ASSERT(kvp_rc_stats(rc)->ask > ask0);
	r = admin(ports[a], "EXISTS %s", k2); /* not written on A */
	CU_ASSERT(r && r->type == REDIS_REPLY_ERROR && !strncmp(r->str, "ASK", 3));
	freeReplyObject(r);
	/* the page written earlier is still served by A while the slot migrates */
	reset();
	get_page(j);
	CU_ASSERT_EQUAL_FATAL(drive(5000), 0);
	CU_ASSERT(res[j].st == KVP_RC_HIT && res[j].verified);
	/* move the old key and the slot: MOVED to B, which then serves both */
	r = admin(ports[a], "MIGRATE 127.0.0.1 %d %s 0 5000 KEYS %b", ports[b], "", keys[j],
		  klens[j]);
	CU_ASSERT(r && r->type == REDIS_REPLY_STATUS);
	freeReplyObject(r);
	for (int k = 0; k < 3; k++)
		CU_ASSERT(
			admin_ok(admin(ports[(b + k) % 3], "CLUSTER SETSLOT %u NODE %s", s, idb)));
	(void)c;
	moved0 = kvp_rc_stats(rc)->moved;
	reset();
	get_page(j);
	CU_ASSERT_EQUAL_FATAL(drive(5000), 0);
	CU_ASSERT(res[j].st == KVP_RC_HIT && res[j].verified);
	CU_ASSERT(kvp_rc_stats(rc)->moved > moved0);
	/* the map learnt it: no second redirect */
	moved0 = kvp_rc_stats(rc)->moved;
	reset();
	get_page(j);
	CU_ASSERT_EQUAL_FATAL(drive(5000), 0);
	CU_ASSERT(res[j].st == KVP_RC_HIT && res[j].verified);
	CU_ASSERT_EQUAL(kvp_rc_stats(rc)->moved, moved0);
	CU_ASSERT_EQUAL(load_owners(), 0);
	CU_ASSERT_EQUAL(key_owner(j), b);
	free(ida);
	free(idb);
}

/* GETs every page; counts hits verified, and failures on node `victim` / elsewhere. */
static void get_all(int victim, int *hits, int *victim_err, int *other_bad)
{
	reset();
	for (int i = 0; i < NPAGES; i++)
		get_page(i);
	CU_ASSERT_EQUAL(drive(10000), 0);
	*hits = *victim_err = *other_bad = 0;
	for (int i = 0; i < NPAGES; i++) {
		int on_victim = key_owner(i) == victim;
		enum kvp_rc_status st = res[i].st;

		if (st == KVP_RC_HIT && res[i].verified)
			++*hits;
		else if (on_victim && (st == KVP_RC_ETIMEOUT || st == KVP_RC_ENODE_DOWN))
			++*victim_err;
		else if (!on_victim)
			++*other_bad;
	}
}

static int count_on(int node)
{
	int n = 0;

	for (int i = 0; i < NPAGES; i++)
		n += key_owner(i) == node;
	return n;
}

/* DEBUG SLEEP on one master: its commands time out after op_timeout_ms (1000), well before it
 * wakes (3 s); the other masters answer; afterwards hits resume. */
static void test_rc_slow_node_times_out(void)
{
	int v = 2, hits, verr, bad, on = count_on(v);
	uint64_t t0, dt, end;
	char cmd[256];

	snprintf(cmd, sizeof(cmd), "redis-cli -p %d DEBUG SLEEP 3 >/dev/null 2>&1 &", ports[v]);
	CU_ASSERT_EQUAL_FATAL(system(cmd), 0);
	usleep(300 * 1000);
	t0 = kvp_rc_now_ms();
	get_all(v, &hits, &verr, &bad);
	dt = kvp_rc_now_ms() - t0;
	printf("\nslow node: %d hits, %d timed out (of %d on it), %llu ms\n", hits, verr, on,
	       (unsigned long long)dt);
	CU_ASSERT_EQUAL(bad, 0);
	CU_ASSERT_EQUAL(hits + verr, NPAGES);
	CU_ASSERT(verr > 0);
	CU_ASSERT(dt < 2500); /* bounded by the op timeout, not by the 3 s sleep */
	CU_ASSERT(kvp_rc_stats(rc)->status[KVP_RC_ETIMEOUT] > 0);
	end = kvp_rc_now_ms() + 10000;
	do {
		get_all(v, &hits, &verr, &bad);
	} while (hits < NPAGES && kvp_rc_now_ms() < end);
	CU_ASSERT_EQUAL(hits, NPAGES);
}

static pid_t node_pid(int k)
{
	char path[512];
	FILE *f;
	int pid = -1;

	snprintf(path, sizeof(path), "%s/%d/redis.pid", dir, ports[k]);
	f = fopen(path, "r");
	if (f) {
		if (fscanf(f, "%d", &pid) != 1)
			pid = -1;
		fclose(f);
	}
	return pid;
}

/* SIGKILL one master mid-run: its pages fail (node down) at once, the others serve; restarted,
 * it reconnects and hits resume once its pages are written again (no persistence). */
static void test_rc_killed_master_fails_fast_then_recovers(void)
{
	int v = 1, hits, verr, bad, on = count_on(v), ok;
	pid_t pid = node_pid(v);
	uint64_t t0, dt, end;
	char cmd[600];

	CU_ASSERT_FATAL(pid > 0);
	/* half the GETs in flight when it dies */
	reset();
	for (int i = 0; i < NPAGES / 2; i++)
		get_page(i);
	CU_ASSERT_EQUAL_FATAL(kill(pid, SIGKILL), 0);
	t0 = kvp_rc_now_ms();
	CU_ASSERT_EQUAL(drive(5000), 0);
	CU_ASSERT(kvp_rc_now_ms() - t0 < 1500);
	get_all(v, &hits, &verr, &bad);
	CU_ASSERT_EQUAL(bad, 0);
	CU_ASSERT_EQUAL(verr, on);
	CU_ASSERT_EQUAL(hits, NPAGES - on);
	/* again: now failing fast, without waiting for a timeout */
	t0 = kvp_rc_now_ms();
	get_all(v, &hits, &verr, &bad);
	dt = kvp_rc_now_ms() - t0;
	printf("\nkilled master: %d hits, %d node-down (of %d on it), %llu ms\n", hits, verr, on,
	       (unsigned long long)dt);
	CU_ASSERT_EQUAL(bad, 0);
	CU_ASSERT_EQUAL(hits, NPAGES - on);
	CU_ASSERT(dt < 400);
	/* restart it */
	snprintf(cmd, sizeof(cmd), "redis-server %s/%d/redis.conf", dir, ports[v]);
	CU_ASSERT_EQUAL_FATAL(system(cmd), 0);
	end = kvp_rc_now_ms() + 20000;
	do {
		reset();
		for (int i = 0; i < NPAGES; i++)
			if (key_owner(i) == v)
				set_page(i);
		CU_ASSERT_EQUAL(drive(10000), 0);
		ok = 0;
		for (int i = 0; i < NPAGES; i++)
			ok += key_owner(i) == v && res[i].st == KVP_RC_OK;
		if (ok < on)
			for (int k = 0; k < 20; k++)
				pump(10);
	} while (ok < on && kvp_rc_now_ms() < end);
	CU_ASSERT_EQUAL(ok, on);
	get_all(v, &hits, &verr, &bad);
	CU_ASSERT_EQUAL(hits, NPAGES);
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_rc_map_loads_from_one_seed),
		H_TEST(test_rc_slot_matches_server),
		H_TEST(test_rc_order_kept_while_connecting),
		H_TEST(test_rc_set_get_exists_1000_pages),
		H_TEST(test_rc_corrupt_and_foreign_values_are_refused),
		H_TEST(test_rc_ask_while_migrating_then_moved),
		H_TEST(test_rc_slow_node_times_out),
		H_TEST(test_rc_killed_master_fails_fast_then_recovers),
	};

	if (!getenv("KVP_REDIS_PORTS")) {
		printf("skip: run through redis_cluster.sh (KVP_REDIS_PORTS unset)\n");
		return 77;
	}
	return H_RUN_SUITE("redis_cluster", init, clean, tests);
}
