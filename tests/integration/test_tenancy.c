/* test_tenancy.c - one user cannot hurt the others: per-pool access lists, owned namespaces,
 * listings limited to the caller's own sessions, quotas that count locks, replies too large
 * for a frame that leave nothing behind, unguessable ids, sanitised client names, and a reload
 * that revokes access of open sessions. A second Unix user is a forked child that drops to uid
 * 60001 (no passwd entry needed); kvpoold and the test run as root. */
#include <CUnit/Basic.h>
#include <errno.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "frame.h"
#include "harness.h"
#include "kvpool.h"

#define OTHER_UID 60001
#define ADMIN_GID 60010	  /* admin_groups at start */
#define NS7_GID 60020	  /* owns namespace 7 of pool open */
#define PRIVATE_GID 60030 /* allowed_groups of pool private at start */

#define TINY_PAGES 2200000u /* page ids above 2^21: four bytes each in a reply */

/* The config, with the lists a reload changes. */
static void conf_text(char *buf, size_t len, const char *daemon_extra, unsigned admin_gid,
		      unsigned private_gid)
{
	snprintf(buf, len,
		 "[daemon]\n"
		 "admin_groups = %u\n"
		 "max_leases_per_session = 8\n"
		 "%s"
		 "[pool.open]\n"
		 "layers = 2\nkv_heads = 2\nhead_dim = 16\ndtype = fp16\npage_tokens = 16\n"
		 "device = sim\ndevice_capacity = 1024t\nhost_capacity = 512t\nmlock = off\n"
		 "namespace.5 = user:0\n"
		 "namespace.7 = group:%u\n"
		 "[pool.private]\n"
		 "layers = 2\nkv_heads = 2\nhead_dim = 16\ndtype = fp16\npage_tokens = 16\n"
		 "device = sim\ndevice_capacity = 256t\nhost_capacity = 0\nmlock = off\n"
		 "allowed_users = 0\n"
		 "allowed_groups = %u\n"
		 "[pool.quota]\n"
		 "layers = 2\nkv_heads = 2\nhead_dim = 16\ndtype = fp16\npage_tokens = 16\n"
		 "device = sim\ndevice_capacity = 1024t\nhost_capacity = 0\nmlock = off\n"
		 "session_quota = 64t\n"
		 "[pool.tiny]\n"
		 "layers = 1\nkv_heads = 1\nhead_dim = 1\ndtype = fp8\npage_tokens = 1\n"
		 "device = sim\ndevice_capacity = %ut\nhost_capacity = 0\nmlock = off\n",
		 admin_gid, daemon_extra, NS7_GID, private_gid, TINY_PAGES);
}

static struct daemon g_d;
static struct kvp_client *g_root;
static uint64_t g_next_id = 1000;

static int init_suite(void)
{
	char conf[4096];
	struct kvp_error e;

	conf_text(conf, sizeof(conf), "", ADMIN_GID, PRIVATE_GID);
	if (h_daemon_start(&g_d, conf, NULL) < 0)
		return -1;
	/* The second user must reach the socket: access is the daemon's to decide here. */
	if (chmod(g_d.dir, 0755) < 0 || chmod(g_d.sock, 0666) < 0)
		return -1;
	g_root = kvp_client_connect(g_d.sock, "root-observer", &e);
	if (!g_root)
		return -1;
	kvp_client_set_timeout(g_root, 20000);
	return 0;
}

static int clean_suite(void)
{
	kvp_client_close(g_root);
	return h_daemon_finish(&g_d);
}

/* Drops to OTHER_UID with the given supplementary groups (in a forked child). */
static int become_other(const gid_t *groups, int n)
{
	if (setgroups((size_t)n, groups) < 0 || setresgid(OTHER_UID, OTHER_UID, OTHER_UID) < 0 ||
	    setresuid(OTHER_UID, OTHER_UID, OTHER_UID) < 0)
		return -1;
	return 0;
}

/* ---- raw calls (Sessions and Cache are not in the public API) ---- */

static Kvpool__Response *raw_call(int fd, Kvpool__Request *q)
{
	q->id = ++g_next_id;
	if (h_raw_send_request(fd, q) < 0)
		return NULL;
	for (uint64_t end = h_now_ms() + 5000;;) {
		uint64_t now = h_now_ms();
		Kvpool__Response *r = now < end ? h_raw_recv(fd, (int)(end - now)) : NULL;

		if (!r || r->id == q->id)
			return r;
		kvpool__response__free_unpacked(r, NULL);
	}
}

static int raw_code(Kvpool__Response *r)
{
	return !r ? -1 : r->status ? (int)r->status->code : 0;
}

/* A raw session that said Hello with name; -1 on failure. */
static int raw_session(const char *name)
{
	Kvpool__Request q = KVPOOL__REQUEST__INIT;
	Kvpool__HelloReq h = KVPOOL__HELLO_REQ__INIT;
	Kvpool__Response *r;
	int fd = h_raw_connect(g_d.sock), code;

	if (fd < 0)
		return -1;
	h.protocol_version = KVP_PROTOCOL_VERSION;
	h.client_name = (char *)name;
	q.call_case = KVPOOL__REQUEST__CALL_HELLO;
	q.hello = &h;
	r = raw_call(fd, &q);
	code = raw_code(r);
	if (r)
		kvpool__response__free_unpacked(r, NULL);
	if (code != 0) {
		close(fd);
		return -1;
	}
	return fd;
}

static Kvpool__Response *raw_sessions(int fd)
{
	Kvpool__Request q = KVPOOL__REQUEST__INIT;
	Kvpool__SessionsReq s = KVPOOL__SESSIONS_REQ__INIT;

	q.call_case = KVPOOL__REQUEST__CALL_SESSIONS;
	q.sessions = &s;
	return raw_call(fd, &q);
}

static Kvpool__Response *raw_cache(int fd, const char *pool)
{
	Kvpool__Request q = KVPOOL__REQUEST__INIT;
	Kvpool__CacheReq c = KVPOOL__CACHE_REQ__INIT;

	c.pool = (char *)pool;
	q.call_case = KVPOOL__REQUEST__CALL_CACHE;
	q.cache = &c;
	return raw_call(fd, &q);
}

/* Caches one page of tokens in namespace ns of pool open as root. */
static void root_insert(uint64_t ns, uint32_t first)
{
	struct kvp_error e;
	struct kvp_pool *p = kvp_pool_attach(g_root, "open", NULL, &e);
	uint32_t tokens[16], page;
	uint64_t lease;

	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	for (uint32_t i = 0; i < 16; i++)
		tokens[i] = first + i;
	CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc(p, KVP_TIER_DEVICE, 1, &lease, &page, &e), 0);
	CU_ASSERT_EQUAL(kvp_cache_insert(p, lease, ns, tokens, 16, 0, &page, 1, NULL, &e), 0);
	kvp_lease_free(p, lease, NULL, 0, &e);
}

/* ---- per-pool access ---- */

static int child_attach(void *arg)
{
	const gid_t *groups = arg;
	struct kvp_error e;
	struct kvp_client *c;
	struct kvp_pool *p;
	int n = groups ? 1 : 0;

	if (become_other(groups, n) < 0)
		return 90;
	c = kvp_client_connect(g_d.sock, "other-user", &e);
	if (!c)
		return 91;
	if (!kvp_pool_attach(c, "open", NULL, &e))
		return 92; /* a pool without lists: everyone admitted */
	p = kvp_pool_attach(c, "private", NULL, &e);
	if (groups) {
		kvp_client_close(c);
		return p ? 0 : 93; /* in allowed_groups */
	}
	if (p)
		return 94;
	if (e.code != KVP_E_PERMISSION_DENIED)
		return 95;
	if (!strstr(e.message, "private"))
		return 96;
	kvp_client_close(c);
	return 0;
}

static void test_attach_pool_allowed_lists(void)
{
	gid_t g = PRIVATE_GID;
	struct kvp_error e;

	CU_ASSERT_EQUAL(h_in_child(child_attach, NULL), 0);
	CU_ASSERT_EQUAL(h_in_child(child_attach, &g), 0);
	CU_ASSERT_PTR_NOT_NULL(kvp_pool_attach(g_root, "private", NULL, &e));
}

/* ---- owned namespaces ---- */

struct ns_case {
	gid_t group; /* 0: none */
	uint64_t ns;
	int want; /* code of Match and Insert */
};

static int child_namespace(void *arg)
{
	const struct ns_case *k = arg;
	struct kvp_error e;
	struct kvp_client *c;
	struct kvp_pool *p;
	struct kvp_match_result m = { .struct_size = sizeof(m) };
	uint32_t tokens[16], dev[1], host[1], page;
	uint64_t lease;
	int rc;

	if (become_other(&k->group, k->group ? 1 : 0) < 0)
		return 90;
	c = kvp_client_connect(g_d.sock, "ns-user", &e);
	if (!c || !(p = kvp_pool_attach(c, "open", NULL, &e)))
		return 91;
	for (uint32_t i = 0; i < 16; i++)
		tokens[i] = 100 + i; /* root cached these in every namespace */
	rc = kvp_cache_match(p, k->ns, tokens, 16, 1, &m, dev, host, 1, &e);
	if ((rc < 0 ? e.code : 0) != k->want)
		return 92;
	if (rc == 0 && (m.matched_tokens != 16 || !m.lock_id))
		return 93;
	if (kvp_lease_alloc(p, KVP_TIER_DEVICE, 1, &lease, &page, &e) < 0)
		return 94;
	for (uint32_t i = 0; i < 16; i++)
		tokens[i] = 900 + i;
	rc = kvp_cache_insert(p, lease, k->ns, tokens, 16, 0, &page, 1, NULL, &e);
	if ((rc < 0 ? e.code : 0) != k->want)
		return 95;
	kvp_client_close(c);
	return 0;
}

static void test_namespace_bound_to_users(void)
{
	struct ns_case cases[] = {
		{ 0, 5, KVP_E_PERMISSION_DENIED },	 /* root's namespace */
		{ 0, 7, KVP_E_PERMISSION_DENIED },	 /* a group's, not a member */
		{ NS7_GID, 7, 0 },			 /* a member */
		{ 0, 6, 0 },				 /* unbound: shared */
		{ NS7_GID, 5, KVP_E_PERMISSION_DENIED }, /* the group does not own 5 */
	};

	root_insert(5, 100);
	root_insert(6, 100);
	root_insert(7, 100);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		int st = h_in_child(child_namespace, &cases[i]);

		if (st)
			printf("\n    namespace case %zu: child exit %d\n", i, st);
		CU_ASSERT_EQUAL(st, 0);
	}
}

/* ---- listings ---- */

static int child_listings(void *arg)
{
	const gid_t *groups = arg;
	Kvpool__Response *r;
	bool saw_root = false, saw_self = false;
	int fd;

	if (become_other(groups, groups ? 1 : 0) < 0)
		return 90;
	if ((fd = raw_session("lister")) < 0)
		return 91;
	r = raw_sessions(fd);
	if (raw_code(r) != 0 || r->result_case != KVPOOL__RESPONSE__RESULT_SESSIONS)
		return 92;
	for (size_t i = 0; i < r->sessions->n_sessions; i++) {
		saw_root |= r->sessions->sessions[i]->uid == 0;
		saw_self |= r->sessions->sessions[i]->uid == OTHER_UID;
	}
	kvpool__response__free_unpacked(r, NULL);
	if (!saw_self)
		return 93;
	if (saw_root != (groups != NULL)) /* only the admin sees root's sessions */
		return 94;
	r = raw_cache(fd, "open");
	if (raw_code(r) != 0 || r->result_case != KVPOOL__RESPONSE__RESULT_CACHE ||
	    r->cache->n_pools != 1)
		return 95;
	if (r->cache->pools[0]->n_tiers == 0)
		return 96; /* the aggregate figures stay */
	if ((r->cache->n_top > 0) != (groups != NULL))
		return 97;
	kvpool__response__free_unpacked(r, NULL);
	close(fd);
	return 0;
}

static void test_sessions_and_cache_detail_own_only(void)
{
	gid_t admin = ADMIN_GID;
	Kvpool__Response *r;
	int fd;

	root_insert(0, 300);
	fd = raw_session("root-lister");
	CU_ASSERT_FATAL(fd >= 0);
	r = raw_cache(fd, "open");
	CU_ASSERT_EQUAL_FATAL(raw_code(r), 0);
	CU_ASSERT(r->cache->n_top > 0);
	kvpool__response__free_unpacked(r, NULL);
	close(fd);
	CU_ASSERT_EQUAL(h_in_child(child_listings, NULL), 0);
	CU_ASSERT_EQUAL(h_in_child(child_listings, &admin), 0);
}

/* ---- quotas count locks ---- */

static void test_quota_counts_locked_tokens(void)
{
	struct kvp_error e;
	struct kvp_client *a = kvp_client_connect(g_d.sock, "pinner", &e);
	struct kvp_client *v = kvp_client_connect(g_d.sock, "victim", &e);
	struct kvp_pool *pa, *pv;
	uint32_t tokens[1024], pages[64], dev[64], host[64];
	uint64_t lease, lock = 0, refused = 0;
	struct kvp_status st = { .struct_size = sizeof(st) };
	int rc;

	CU_ASSERT_PTR_NOT_NULL_FATAL(a);
	CU_ASSERT_PTR_NOT_NULL_FATAL(v);
	pa = kvp_pool_attach(a, "quota", NULL, &e);
	pv = kvp_pool_attach(v, "quota", NULL, &e);
	CU_ASSERT_PTR_NOT_NULL_FATAL(pa);
	CU_ASSERT_PTR_NOT_NULL_FATAL(pv);
	for (uint32_t i = 0; i < 1024; i++)
		tokens[i] = i + 1;
	/* Grow one prefix four pages (64 tokens, the quota) at a time, keeping it locked. */
	for (uint32_t i = 0; i < 16; i++) {
		struct kvp_match_result m = { .struct_size = sizeof(m) };

		rc = kvp_lease_alloc(pa, KVP_TIER_DEVICE, 4, &lease, pages, &e);
		if (rc < 0) {
			CU_ASSERT_EQUAL(e.code, KVP_E_QUOTA_EXCEEDED);
			refused++;
			break;
		}
		CU_ASSERT_EQUAL(kvp_cache_insert(pa, lease, 0, tokens, (i + 1) * 64, i * 4, pages,
						 4, NULL, &e),
				0);
		CU_ASSERT_EQUAL(kvp_lease_free(pa, lease, NULL, 0, &e), 0); /* emptied: gone */
		rc = kvp_cache_match(pa, 0, tokens, (i + 1) * 64, 1, &m, dev, host, 64, &e);
		if (rc < 0) {
			CU_ASSERT_EQUAL(e.code, KVP_E_QUOTA_EXCEEDED);
			refused++;
			break;
		}
		if (lock)
			CU_ASSERT_EQUAL(kvp_cache_release(pa, lock, &e), 0);
		lock = m.lock_id;
	}
	CU_ASSERT(refused > 0);
	CU_ASSERT_EQUAL_FATAL(kvp_client_status(g_root, &st, &e), 0);
	printf("\n    quota 64t: the pinning session protects %lu of %lu device tokens\n",
	       (unsigned long)st.pools[2].tiers[0].protected_tokens,
	       (unsigned long)st.pools[2].tiers[0].total_tokens);
	CU_ASSERT(st.pools[2].tiers[0].protected_tokens <= 64);
	/* A second lock on the same prefix counts too. */
	if (lock) {
		struct kvp_match_result m = { .struct_size = sizeof(m) };

		CU_ASSERT(kvp_cache_match(pa, 0, tokens, 64, 1, &m, dev, host, 64, &e) < 0);
		CU_ASSERT_EQUAL(e.code, KVP_E_QUOTA_EXCEEDED);
	}
	/* Others keep getting pages. */
	rc = kvp_lease_alloc(pv, KVP_TIER_DEVICE, 4, &lease, pages, &e);
	if (rc < 0)
		printf("\n    victim: %s\n", e.message);
	CU_ASSERT_EQUAL(rc, 0);
	kvp_client_close(a);
	kvp_client_close(v);
}

/* ---- replies too large for a frame ---- */

static void test_alloc_reply_too_large_keeps_nothing(void)
{
	struct kvp_error e;
	struct kvp_pool *p = kvp_pool_attach(g_root, "tiny", NULL, &e);
	uint32_t *pages = malloc(sizeof(uint32_t) * 2000000);
	struct kvp_status st = { .struct_size = sizeof(st) };
	uint64_t lease = 0;
	int rc;

	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	CU_ASSERT_PTR_NOT_NULL_FATAL(pages);
	rc = kvp_lease_alloc(p, KVP_TIER_DEVICE, 2000000, &lease, pages, &e);
	CU_ASSERT(rc < 0);
	printf("\n    alloc of 2M pages: %s: %s\n", kvp_code_name(e.code), e.message);
	CU_ASSERT_EQUAL(e.code, KVP_E_LIMIT_EXCEEDED);
	CU_ASSERT_EQUAL(e.detail, KVP_DETAIL_LIMIT);
	CU_ASSERT(e.limit.limit > 0 && e.limit.limit < 2000000);
	CU_ASSERT_EQUAL_FATAL(kvp_client_status(g_root, &st, &e), 0);
	CU_ASSERT_EQUAL(st.pools[3].tiers[0].leased_tokens, 0);
	/* The limit it names is one that works. */
	rc = kvp_lease_alloc(p, KVP_TIER_DEVICE, (uint32_t)e.limit.limit, &lease, pages, &e);
	CU_ASSERT_EQUAL(rc, 0);
	if (rc == 0)
		CU_ASSERT_EQUAL(kvp_lease_free(p, lease, NULL, 0, &e), 0);
	free(pages);
}

static void test_locked_match_too_large_keeps_no_lock(void)
{
	const uint32_t n = 1100000, chunk = 275000;
	struct kvp_error e;
	struct kvp_pool *p = kvp_pool_attach(g_root, "tiny", NULL, &e);
	uint32_t *tokens = malloc(sizeof(uint32_t) * n), *pages = malloc(sizeof(uint32_t) * n);
	uint32_t *dev = malloc(sizeof(uint32_t) * n), *host = malloc(sizeof(uint32_t) * n);
	struct kvp_match_result m = { .struct_size = sizeof(m) };
	struct kvp_status st = { .struct_size = sizeof(st) };
	uint64_t lease, evicted = 0;
	int rc;

	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	CU_ASSERT_FATAL(tokens && pages && dev && host);
	for (uint32_t i = 0; i < n; i++)
		tokens[i] = i % 100; /* one byte each on the wire */
	for (uint32_t done = 0; done < n; done += chunk) {
		CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc(p, KVP_TIER_DEVICE, chunk, &lease, pages, &e),
				      0);
		rc = kvp_cache_insert(p, lease, 0, tokens, done + chunk, done, pages, chunk, NULL,
				      &e);
		if (rc < 0)
			printf("\n    insert: %s\n", e.message);
		CU_ASSERT_EQUAL_FATAL(rc, 0);
		kvp_lease_free(p, lease, NULL, 0, &e);
	}
	rc = kvp_cache_match(p, 0, tokens, n, 1, &m, dev, host, n, &e);
	CU_ASSERT(rc < 0);
	printf("\n    locked match of 1.1M pages: %s: %s\n", kvp_code_name(e.code), e.message);
	CU_ASSERT_EQUAL(e.code, KVP_E_LIMIT_EXCEEDED);
	CU_ASSERT_EQUAL_FATAL(kvp_client_status(g_root, &st, &e), 0);
	CU_ASSERT_EQUAL(st.pools[3].tiers[0].protected_tokens, 0);
	/* Nothing pins the prefix: a flush takes all of it. */
	CU_ASSERT_EQUAL(kvp_admin_flush(g_root, "tiny", &evicted, &e), 0);
	CU_ASSERT_EQUAL(evicted, n);
	free(tokens);
	free(pages);
	free(dev);
	free(host);
}

/* ---- ids ---- */

static void test_ids_not_sequential_across_sessions(void)
{
	struct kvp_error e;
	struct kvp_client *b = kvp_client_connect(g_d.sock, "second", &e);
	struct kvp_pool *pa = kvp_pool_attach(g_root, "open", NULL, &e), *pb;
	uint64_t a1, b1, a2;
	uint32_t page;

	CU_ASSERT_PTR_NOT_NULL_FATAL(b);
	pb = kvp_pool_attach(b, "open", NULL, &e);
	CU_ASSERT_PTR_NOT_NULL_FATAL(pa);
	CU_ASSERT_PTR_NOT_NULL_FATAL(pb);
	CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc(pa, KVP_TIER_DEVICE, 1, &a1, &page, &e), 0);
	CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc(pb, KVP_TIER_DEVICE, 1, &b1, &page, &e), 0);
	CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc(pa, KVP_TIER_DEVICE, 1, &a2, &page, &e), 0);
	printf("\n    lease ids: %lu, %lu (other session), %lu\n", (unsigned long)a1,
	       (unsigned long)b1, (unsigned long)a2);
	CU_ASSERT(b1 != a1 + 1 && a2 != a1 + 1 && a2 != b1 + 1);
	/* 64-bit ids from a keyed permutation: all three below 2^32 has odds of 2^-96. */
	CU_ASSERT(a1 > UINT32_MAX || b1 > UINT32_MAX || a2 > UINT32_MAX);
	/* Another session's id is not this one's. */
	CU_ASSERT(kvp_lease_free(pa, b1, NULL, 0, &e) < 0);
	CU_ASSERT_EQUAL(e.code, KVP_E_NOT_FOUND);
	kvp_lease_free(pa, a1, NULL, 0, &e);
	kvp_lease_free(pa, a2, NULL, 0, &e);
	kvp_client_close(b);
}

/* ---- client names ---- */

static bool utf8_clean(const unsigned char *s)
{
	while (*s) {
		size_t len = *s < 0x80 ? 1 : (*s & 0xe0) == 0xc0 ? 2 : (*s & 0xf0) == 0xe0 ? 3 : 4;

		if (*s < 0x20 || *s == 0x7f || (*s >= 0x80 && *s < 0xc2) || *s > 0xf4)
			return false;
		for (size_t i = 1; i < len; i++)
			if ((s[i] & 0xc0) != 0x80)
				return false;
		s += len;
	}
	return true;
}

static void test_client_names_sanitised(void)
{
	char long_name[80];
	const char *forged = "evil\n<0>forged emergency \x1b[31mred";
	Kvpool__Response *r;
	bool saw_long = false, saw_forged = false;
	char line[512];
	FILE *f;
	int f1, f2, fd;

	memset(long_name, 'a', 62);
	strcpy(long_name + 62, "\xe2\x82\xac"); /* a euro sign across byte 63 */
	f1 = raw_session(forged);
	f2 = raw_session(long_name);
	fd = raw_session("root-lister");
	CU_ASSERT_FATAL(f1 >= 0 && f2 >= 0 && fd >= 0);
	r = raw_sessions(fd);
	CU_ASSERT_EQUAL_FATAL(raw_code(r), 0);
	for (size_t i = 0; i < r->sessions->n_sessions; i++) {
		const char *name = r->sessions->sessions[i]->name;

		CU_ASSERT(strlen(name) <= 63);
		CU_ASSERT(utf8_clean((const unsigned char *)name));
		if (!utf8_clean((const unsigned char *)name))
			printf("\n    unclean name listed: '%s'\n", name);
		if (strncmp(name, "aaaa", 4) == 0) {
			saw_long = true;
			CU_ASSERT_EQUAL(strlen(name), 62);
		}
		if (strncmp(name, "evil", 4) == 0) {
			saw_forged = true;
			CU_ASSERT_PTR_NOT_NULL(strstr(name, "\\x0a<0>forged"));
		}
	}
	CU_ASSERT(saw_long && saw_forged);
	kvpool__response__free_unpacked(r, NULL);
	/* No log line begins where the name tried to begin one, and none has an escape. */
	f = fopen(g_d.log, "r");
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	while (fgets(line, sizeof(line), f)) {
		CU_ASSERT(strncmp(line, "<0>forged", 9) != 0);
		CU_ASSERT_PTR_NULL(strchr(line, '\x1b'));
	}
	fclose(f);
	CU_ASSERT(h_log_contains(&g_d, "evil\\x0a<0>forged"));
	close(f1);
	close(f2);
	close(fd);
}

/* ---- small typed errors ---- */

static void test_geometry_mismatch_names_dtype(void)
{
	struct kvp_geometry want = { .dtype = KVP_DTYPE_FP32 };
	struct kvp_error e;

	CU_ASSERT_PTR_NULL(kvp_pool_attach(g_root, "open", &want, &e));
	CU_ASSERT_EQUAL(e.code, KVP_E_GEOMETRY_MISMATCH);
	CU_ASSERT_PTR_NOT_NULL(strstr(e.message, "dtype fp32"));
	CU_ASSERT_PTR_NOT_NULL(strstr(e.message, "dtype fp16"));
}

static void test_attach_name_with_nul_refused(void)
{
	Kvpool__Request q = KVPOOL__REQUEST__INIT;
	Kvpool__AttachReq a = KVPOOL__ATTACH_REQ__INIT;
	Kvpool__Request ping = KVPOOL__REQUEST__INIT;
	Kvpool__PingReq pr = KVPOOL__PING_REQ__INIT;
	Kvpool__Response *r;
	uint8_t *buf, *at;
	size_t len;
	int fd = raw_session("nul-name");

	CU_ASSERT_FATAL(fd >= 0);
	a.pool = (char *)"openXtra"; /* sent as "open\0tra": read as a C string, "open" */
	q.call_case = KVPOOL__REQUEST__CALL_ATTACH;
	q.attach = &a;
	q.id = ++g_next_id;
	CU_ASSERT_EQUAL_FATAL(kvp_frame_pack(&q.base, &buf, &len), 0);
	at = memmem(buf, len, "openXtra", 8);
	CU_ASSERT_PTR_NOT_NULL_FATAL(at);
	at[4] = '\0';
	CU_ASSERT_EQUAL(send(fd, buf, len, MSG_NOSIGNAL), (ssize_t)len);
	free(buf);
	r = h_raw_recv(fd, 5000);
	CU_ASSERT_PTR_NOT_NULL_FATAL(r);
	CU_ASSERT_EQUAL(r->id, q.id);
	CU_ASSERT_EQUAL(raw_code(r), KVP_E_INVALID_ARGUMENT);
	CU_ASSERT_NOT_EQUAL(r->result_case, KVPOOL__RESPONSE__RESULT_ATTACH);
	kvpool__response__free_unpacked(r, NULL);
	/* The connection goes on. */
	ping.call_case = KVPOOL__REQUEST__CALL_PING;
	ping.ping = &pr;
	r = raw_call(fd, &ping);
	CU_ASSERT_EQUAL(raw_code(r), 0);
	if (r)
		kvpool__response__free_unpacked(r, NULL);
	close(fd);
}

static void test_insert_on_emptied_lease(void)
{
	struct kvp_error e;
	struct kvp_pool *p = kvp_pool_attach(g_root, "open", NULL, &e);
	uint32_t tokens[32], pages[2];
	uint64_t lease, last = 0;

	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	for (uint32_t i = 0; i < 32; i++)
		tokens[i] = 5000 + i;
	CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc(p, KVP_TIER_DEVICE, 2, &lease, pages, &e), 0);
	CU_ASSERT_EQUAL(kvp_cache_insert(p, lease, 0, tokens, 32, 0, pages, 2, NULL, &e), 0);
	CU_ASSERT(kvp_cache_insert(p, lease, 0, tokens, 32, 2, NULL, 0, NULL, &e) < 0);
	CU_ASSERT_EQUAL(e.code, KVP_E_NOT_FOUND);
	CU_ASSERT_EQUAL(kvp_lease_free(p, lease, NULL, 0, &e), 0);
	/* Emptied leases left unfreed do not count against max_leases_per_session (8). */
	for (uint32_t i = 0; i < 12; i++) {
		int rc = kvp_lease_alloc(p, KVP_TIER_DEVICE, 1, &lease, pages, &e);

		if (rc < 0)
			printf("\n    alloc %u: %s\n", i, e.message);
		CU_ASSERT_EQUAL_FATAL(rc, 0);
		tokens[0] = 7000 + i;
		CU_ASSERT_EQUAL(kvp_cache_insert(p, lease, 0, tokens, 16, 0, pages, 1, NULL, &e),
				0);
		last = lease;
	}
	CU_ASSERT_EQUAL(kvp_lease_free(p, last, NULL, 0, &e), 0);
}

/* ---- reload revokes ---- */

struct reload_child {
	int to_parent[2], to_child[2];
};

static int child_reload(void *arg)
{
	struct reload_child *rc = arg;
	gid_t groups[] = { ADMIN_GID, PRIVATE_GID };
	struct kvp_error e;
	struct kvp_client *c;
	struct kvp_pool *p;
	uint64_t lease, evicted;
	uint32_t pages[2];
	char b;

	if (become_other(groups, 2) < 0)
		return 90;
	c = kvp_client_connect(g_d.sock, "revoked", &e);
	if (!c || !(p = kvp_pool_attach(c, "private", NULL, &e)))
		return 91;
	if (kvp_lease_alloc(p, KVP_TIER_DEVICE, 2, &lease, pages, &e) < 0)
		return 92;
	if (kvp_admin_flush(c, "open", &evicted, &e) < 0)
		return 93; /* an admin, for now */
	if (write(rc->to_parent[1], "1", 1) != 1 || read(rc->to_child[0], &b, 1) != 1)
		return 94;
	/* admin_groups and the pool's allowed_groups no longer name this user's groups. */
	if (kvp_admin_flush(c, "open", &evicted, &e) == 0 || e.code != KVP_E_PERMISSION_DENIED)
		return 95;
	if (kvp_lease_alloc(p, KVP_TIER_DEVICE, 1, &lease, pages, &e) == 0 ||
	    e.code != KVP_E_NOT_FOUND)
		return 96;
	if (write(rc->to_parent[1], "2", 1) != 1 || read(rc->to_child[0], &b, 1) != 1)
		return 97;
	/* allowed_users no longer names this user: the session is gone. */
	if (kvp_client_ping(c, &e) == 0)
		return 98;
	kvp_client_close(c);
	return 0;
}

static int count_in_log(const char *s)
{
	char line[1024];
	int n = 0;
	FILE *f = fopen(g_d.log, "r");

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		n += strstr(line, s) != NULL;
	fclose(f);
	return n;
}

static void rewrite_and_reload(const char *daemon_extra, unsigned admin_gid, unsigned private_gid)
{
	char conf[4096];
	int before = count_in_log("reload: done");
	FILE *f;

	conf_text(conf, sizeof(conf), daemon_extra, admin_gid, private_gid);
	f = fopen(g_d.config, "w");
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	fputs(conf, f);
	fclose(f);
	CU_ASSERT_EQUAL(kill(g_d.pid, SIGHUP), 0);
	for (uint64_t end = h_now_ms() + 5000; h_now_ms() < end;) {
		if (count_in_log("reload: done") > before)
			break;
		usleep(20000);
	}
	CU_ASSERT(count_in_log("reload: done") > before);
}

static void test_reload_revokes_open_sessions(void)
{
	struct reload_child rc;
	struct kvp_status st = { .struct_size = sizeof(st) };
	struct kvp_error e;
	pid_t pid;
	char b;
	int status;

	signal(SIGPIPE, SIG_IGN);
	CU_ASSERT_EQUAL_FATAL(pipe(rc.to_parent), 0);
	CU_ASSERT_EQUAL_FATAL(pipe(rc.to_child), 0);
	pid = fork();
	CU_ASSERT_FATAL(pid >= 0);
	if (pid == 0)
		_exit(child_reload(&rc));
	/* The child's ends: a child that gives up reads as EOF here, never a hang. */
	close(rc.to_parent[1]);
	close(rc.to_child[0]);
	CU_ASSERT_EQUAL(read(rc.to_parent[0], &b, 1), 1);
	rewrite_and_reload("", ADMIN_GID + 1, PRIVATE_GID + 1);
	CU_ASSERT_EQUAL(count_in_log("('revoked' pid"), 2);
	CU_ASSERT_EQUAL(count_in_log("is no longer an admin"), 1);
	CU_ASSERT_EQUAL(count_in_log("lost access to pool private; detached (32 tokens freed)"), 1);
	CU_ASSERT_EQUAL(kvp_client_status(g_root, &st, &e), 0);
	CU_ASSERT_EQUAL(st.pools[1].tiers[0].leased_tokens, 0);
	CU_ASSERT_EQUAL(write(rc.to_child[1], "a", 1), 1);
	CU_ASSERT_EQUAL(read(rc.to_parent[0], &b, 1), 1);
	rewrite_and_reload("allowed_users = 0\n", ADMIN_GID + 1, PRIVATE_GID + 1);
	CU_ASSERT_EQUAL(count_in_log("lost access to kvpoold; closing it"), 1);
	CU_ASSERT_EQUAL(count_in_log("is no longer an admin"), 1); /* said once */
	/* The idle session is closed by the loop, not at its next call. */
	for (uint64_t end = h_now_ms() + 3000; h_now_ms() < end;) {
		if (h_log_contains(&g_d, "closed: a reload revoked its access to kvpoold"))
			break;
		usleep(20000);
	}
	CU_ASSERT(h_log_contains(&g_d, "closed: a reload revoked its access to kvpoold"));
	CU_ASSERT_EQUAL(write(rc.to_child[1], "b", 1), 1);
	status = h_wait_pid(pid, 10000);
	if (status)
		printf("\n    reload child: exit %d\n", status);
	CU_ASSERT_EQUAL(status, 0);
	CU_ASSERT_EQUAL(kvp_client_status(g_root, &st, &e), 0);
	close(rc.to_parent[0]);
	close(rc.to_child[1]);
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_attach_pool_allowed_lists),
		H_TEST(test_namespace_bound_to_users),
		H_TEST(test_sessions_and_cache_detail_own_only),
		H_TEST(test_quota_counts_locked_tokens),
		H_TEST(test_alloc_reply_too_large_keeps_nothing),
		H_TEST(test_locked_match_too_large_keeps_no_lock),
		H_TEST(test_ids_not_sequential_across_sessions),
		H_TEST(test_client_names_sanitised),
		H_TEST(test_geometry_mismatch_names_dtype),
		H_TEST(test_attach_name_with_nul_refused),
		H_TEST(test_insert_on_emptied_lease),
		H_TEST(test_reload_revokes_open_sessions),
	};

	return H_RUN_SUITE("tenancy", init_suite, clean_suite, tests);
}
