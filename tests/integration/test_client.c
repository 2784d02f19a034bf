/* test_client.c - libkvpool against a fake kvpoold that sends what a real one would not (frames
 * pushed before a reply, replies with stale ids and their descriptors, odd codes, replies of the
 * wrong kind or size), and against a real kvpoold: mappings that outlive their pool and
 * connection, listings, reload, and check-config's JSON. */
#include <CUnit/Basic.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "kvp_internal.h"

static const char *const g_conf = "[pool.default]\n"
				  "layers = 2\nkv_heads = 2\nhead_dim = 16\ndtype = fp16\n"
				  "page_tokens = 16\n"
				  "device = sim\ndevice_capacity = 1024t\nhost_capacity = 512t\n"
				  "mlock = off\n";

static struct daemon g_d;
static char g_fake[160];

static int init_suite(void)
{
	if (h_daemon_start(&g_d, g_conf, NULL) < 0)
		return -1;
	snprintf(g_fake, sizeof(g_fake), "%s/fake.sock", g_d.dir);
	return 0;
}

static int clean_suite(void)
{
	unlink(g_fake);
	return h_daemon_finish(&g_d);
}

/* ---- the fake daemon's side ---- */

static Kvpool__Status g_ok = KVPOOL__STATUS__INIT;

/* Reads the Hello and answers it (session 7, capabilities as offered). Returns the Hello's id
 * or 0. */
static uint64_t fake_hello(int fd)
{
	Kvpool__Request *q = h_fake_recv(fd, 5000);
	Kvpool__Response r = KVPOOL__RESPONSE__INIT;
	Kvpool__HelloResp h = KVPOOL__HELLO_RESP__INIT;
	uint64_t id;

	if (!q || q->call_case != KVPOOL__REQUEST__CALL_HELLO) {
		if (q)
			kvpool__request__free_unpacked(q, NULL);
		return 0;
	}
	id = q->id;
	h.session_id = 7;
	h.daemon_version = (char *)"fake";
	h.protocol_version = 1;
	h.capabilities = q->hello->capabilities;
	kvpool__request__free_unpacked(q, NULL);
	r.id = id;
	r.status = &g_ok;
	r.result_case = KVPOOL__RESPONSE__RESULT_HELLO;
	r.hello = &h;
	return h_fake_send(fd, &r, NULL, 0) == 0 ? id : 0;
}

/* Reads one request of the given call; returns it (free it) or NULL. */
static Kvpool__Request *fake_expect(int fd, int call)
{
	Kvpool__Request *q = h_fake_recv(fd, 5000);

	if (q && (int)q->call_case != call) {
		kvpool__request__free_unpacked(q, NULL);
		return NULL;
	}
	return q;
}

static int send_ping(int fd, uint64_t id, uint64_t nonce, const int *fds, int nfds)
{
	Kvpool__Response r = KVPOOL__RESPONSE__INIT;
	Kvpool__PingResp p = KVPOOL__PING_RESP__INIT;

	p.nonce = nonce;
	r.id = id;
	r.status = &g_ok;
	r.result_case = KVPOOL__RESPONSE__RESULT_PING;
	r.ping = &p;
	return h_fake_send(fd, &r, fds, nfds);
}

/* A memfd of n bytes, each `fill`. */
static int memfd_filled(size_t n, int fill)
{
	int fd = memfd_create("fake-tier", MFD_CLOEXEC);
	void *m;

	if (fd < 0 || ftruncate(fd, (off_t)n) < 0)
		return -1;
	m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED)
		return -1;
	memset(m, fill, n);
	munmap(m, n);
	return fd;
}

#define FAKE_PAGES 4
#define FAKE_PAGE_BYTES 4096

/* An Attach reply: one host tier of FAKE_PAGES pages of 16 tokens, memory fd at index 0. */
static int send_attach(int fd, uint64_t id, int memfd)
{
	Kvpool__Response r = KVPOOL__RESPONSE__INIT;
	Kvpool__AttachResp a = KVPOOL__ATTACH_RESP__INIT;
	Kvpool__Geometry g = KVPOOL__GEOMETRY__INIT;
	Kvpool__TierInfo t = KVPOOL__TIER_INFO__INIT, *tp = &t;

	g.layers = 1;
	g.kv_heads = 1;
	g.head_dim = 8;
	g.dtype = KVPOOL__DTYPE__FP32;
	g.page_tokens = 16;
	t.tier = KVPOOL__TIER__HOST;
	t.backend = KVPOOL__BACKEND__MEMFD;
	t.pages = FAKE_PAGES;
	t.bytes = FAKE_PAGES * FAKE_PAGE_BYTES;
	t.fd_index = 0;
	t.row_bytes = 32;
	t.page_bytes = FAKE_PAGE_BYTES;
	a.pool_id = 3;
	a.pool = (char *)"fake";
	a.geometry = &g;
	a.n_tiers = 1;
	a.tiers = &tp;
	r.id = id;
	r.status = &g_ok;
	r.result_case = KVPOOL__RESPONSE__RESULT_ATTACH;
	r.attach = &a;
	return h_fake_send(fd, &r, &memfd, 1);
}

/* Answers an Attach (the next request) with a host tier filled with 'B'. */
static int fake_attach(int fd)
{
	Kvpool__Request *q = fake_expect(fd, KVPOOL__REQUEST__CALL_ATTACH);
	int m = memfd_filled(FAKE_PAGES * FAKE_PAGE_BYTES, 'B'), r;

	if (!q || m < 0)
		return -1;
	r = send_attach(fd, q->id, m);
	close(m);
	kvpool__request__free_unpacked(q, NULL);
	return r;
}

/* Waits for the client to close. */
static int fake_end(int fd, int rc)
{
	Kvpool__Request *q = h_fake_recv(fd, 5000);

	/* a Detach may come first (kvp_client_close sends none; kvp_pool_detach does) */
	while (q) {
		kvpool__request__free_unpacked(q, NULL);
		q = h_fake_recv(fd, 5000);
	}
	close(fd);
	return rc;
}

static pid_t start_fake(int (*script)(int fd, void *arg), void *arg)
{
	pid_t pid = -1;

	CU_ASSERT_FATAL(h_fake_daemon(g_fake, script, arg, &pid) == 0);
	return pid;
}

static int wait_fake(pid_t pid)
{
	return h_wait_pid(pid, 10000);
}

static struct kvp_client *fake_connect(void)
{
	struct kvp_error e;
	struct kvp_client *c = kvp_client_connect(g_fake, "fake-client", &e);

	if (c)
		kvp_client_set_timeout(c, 5000);
	return c;
}

static int open_fds(void)
{
	int n = 0;

	for (int fd = 0; fd < 1024; fd++)
		n += fcntl(fd, F_GETFD) >= 0;
	return n;
}

/* ---- events ---- */

/* Before the Ping's reply: a pushed frame (id 0 with a result) and a frame of an id the client
 * never used; after it, while the client idles, one more push. */
static int script_push(int fd, void *arg)
{
	Kvpool__Request *q;

	(void)arg;
	if (!fake_hello(fd) || !(q = fake_expect(fd, KVPOOL__REQUEST__CALL_PING)))
		return 1;
	if (send_ping(fd, 0, 777, NULL, 0) < 0 || send_ping(fd, 1000, 778, NULL, 0) < 0 ||
	    send_ping(fd, q->id, q->ping->nonce, NULL, 0) < 0)
		return 2;
	kvpool__request__free_unpacked(q, NULL);
	usleep(200000);
	if (send_ping(fd, 0, 779, NULL, 0) < 0)
		return 3;
	return fake_end(fd, 0);
}

static uint64_t event_nonce(const struct kvp_event *ev, const uint8_t *buf)
{
	Kvpool__Response *m = kvp_frame_decode_response(buf, (uint32_t)ev->payload_len);
	uint64_t n = m && m->result_case == KVPOOL__RESPONSE__RESULT_PING ? m->ping->nonce : 0;

	if (m)
		kvpool__response__free_unpacked(m, NULL);
	return n;
}

static void test_kvp_client_event_next_pushed_before_reply(void)
{
	pid_t pid = start_fake(script_push, NULL);
	struct kvp_client *c = fake_connect();
	uint8_t buf[256];
	struct kvp_event ev = { .struct_size = sizeof(ev),
				.payload = buf,
				.payload_cap = sizeof(buf) };
	struct {
		struct kvp_event s;
		uint8_t tail[8];
	} big;
	struct kvp_error e;
	struct pollfd pf;
	int efd;

	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	CU_ASSERT_EQUAL(kvp_client_capabilities(c), KVP_CAP_ALL);
	/* the call gets its own reply, not the frames before it */
	CU_ASSERT_EQUAL(kvp_client_ping(c, &e), 0);
	efd = kvp_client_event_fd(c);
	CU_ASSERT_FATAL(efd >= 0);
	pf = (struct pollfd){ .fd = efd, .events = POLLIN };
	CU_ASSERT_EQUAL(poll(&pf, 1, 0), 1);
	CU_ASSERT_EQUAL_FATAL(kvp_client_event_next(c, &ev, &e), 0);
	CU_ASSERT_EQUAL(ev.type, KVPOOL__RESPONSE__RESULT_PING);
	CU_ASSERT_EQUAL(ev.id, 0);
	CU_ASSERT_EQUAL(ev.code, 0);
	CU_ASSERT_EQUAL(ev.dropped, 0);
	CU_ASSERT(ev.payload_len > 0 && ev.payload_len <= sizeof(buf));
	CU_ASSERT_EQUAL(event_nonce(&ev, buf), 777);
	/* a newer caller's larger struct: filled, its bytes past this version's untouched */
	memset(&big, 0xa5, sizeof(big));
	big.s = ev;
	big.s.struct_size = sizeof(big);
	CU_ASSERT_EQUAL_FATAL(kvp_client_event_next(c, &big.s, &e), 0);
	CU_ASSERT_EQUAL(big.s.struct_size, sizeof(big));
	CU_ASSERT_EQUAL(big.s.id, 1000);
	CU_ASSERT_EQUAL(event_nonce(&big.s, buf), 778);
	for (int i = 0; i < 8; i++)
		CU_ASSERT_EQUAL(big.tail[i], 0xa5);
	CU_ASSERT_EQUAL(kvp_client_event_next(c, &ev, &e), -KVP_E_AGAIN);
	CU_ASSERT_EQUAL(e.code, KVP_E_AGAIN);
	/* drained: nothing readable until the next push arrives on the socket */
	CU_ASSERT_EQUAL(poll(&pf, 1, 0), 0);
	CU_ASSERT_EQUAL(poll(&pf, 1, 3000), 1);
	CU_ASSERT_EQUAL_FATAL(kvp_client_event_next(c, &ev, &e), 0);
	CU_ASSERT_EQUAL(event_nonce(&ev, buf), 779);
	CU_ASSERT_EQUAL(kvp_client_event_next(c, &ev, &e), -KVP_E_AGAIN);
	ev.struct_size = sizeof(ev) - 1;
	CU_ASSERT_EQUAL(kvp_client_event_next(c, &ev, &e), -KVP_E_INVALID_ARGUMENT);
	kvp_client_close(c);
	CU_ASSERT_EQUAL(wait_fake(pid), 0);
}

/* Pushes more frames than the queue holds before a reply: the excess is dropped and counted. */
static int script_flood(int fd, void *arg)
{
	Kvpool__Request *q;

	(void)arg;
	if (!fake_hello(fd) || !(q = fake_expect(fd, KVPOOL__REQUEST__CALL_PING)))
		return 1;
	for (int i = 0; i < KVP_CLIENT_MAX_EVENTS + 10; i++)
		if (send_ping(fd, 0, (uint64_t)i + 1, NULL, 0) < 0)
			return 2;
	if (send_ping(fd, q->id, q->ping->nonce, NULL, 0) < 0)
		return 2;
	kvpool__request__free_unpacked(q, NULL);
	/* once the client drained the queue: one more push, then the next Ping's reply */
	if (!(q = fake_expect(fd, KVPOOL__REQUEST__CALL_PING)))
		return 3;
	if (send_ping(fd, 0, 5555, NULL, 0) < 0 ||
	    send_ping(fd, q->id, q->ping->nonce, NULL, 0) < 0)
		return 4;
	kvpool__request__free_unpacked(q, NULL);
	return fake_end(fd, 0);
}

static void test_kvp_client_event_next_bounded_queue(void)
{
	pid_t pid = start_fake(script_flood, NULL);
	struct kvp_client *c = fake_connect();
	struct kvp_event ev = { .struct_size = sizeof(ev) };
	struct kvp_error e;
	int n = 0;

	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	CU_ASSERT_EQUAL(kvp_client_ping(c, &e), 0);
	while (kvp_client_event_next(c, &ev, &e) == 0) {
		CU_ASSERT_EQUAL(ev.dropped, 0);
		CU_ASSERT(ev.payload_len > 0);
		n++;
	}
	CU_ASSERT_EQUAL(n, KVP_CLIENT_MAX_EVENTS);
	/* the first event queued after the drops reports them */
	CU_ASSERT_EQUAL(kvp_client_ping(c, &e), 0);
	CU_ASSERT_EQUAL_FATAL(kvp_client_event_next(c, &ev, &e), 0);
	CU_ASSERT_EQUAL(ev.dropped, 10);
	CU_ASSERT_EQUAL(kvp_client_event_next(c, &ev, &e), -KVP_E_AGAIN);
	kvp_client_close(c);
	CU_ASSERT_EQUAL(wait_fake(pid), 0);
}

/* ---- stale replies and their descriptors ---- */

/* Before the Attach's reply (memory 'B'), a reply with the Hello's id, carrying memory 'A'. */
static int script_stale_fd(int fd, void *arg)
{
	Kvpool__Request *q;
	uint64_t hello = fake_hello(fd);
	int a = memfd_filled(FAKE_PAGES * FAKE_PAGE_BYTES, 'A');
	int b = memfd_filled(FAKE_PAGES * FAKE_PAGE_BYTES, 'B');

	(void)arg;
	if (!hello || a < 0 || b < 0 || !(q = fake_expect(fd, KVPOOL__REQUEST__CALL_ATTACH)))
		return 1;
	if (send_attach(fd, hello, a) < 0 || send_attach(fd, q->id, b) < 0)
		return 2;
	close(a);
	close(b);
	kvpool__request__free_unpacked(q, NULL);
	return fake_end(fd, 0);
}

static void test_kvp_pool_attach_stale_reply_fds_closed(void)
{
	pid_t pid = start_fake(script_stale_fd, NULL);
	struct kvp_client *c = fake_connect();
	struct kvp_event ev = { .struct_size = sizeof(ev) };
	struct kvp_error e;
	struct kvp_pool *p;
	int before;
	char *base;

	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	before = open_fds();
	p = kvp_pool_attach(c, "fake", NULL, &e);
	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	base = kvp_pool_tier_base(p, KVP_TIER_HOST);
	CU_ASSERT_PTR_NOT_NULL_FATAL(base);
	/* the pool maps the reply's memory, not the stale frame's */
	CU_ASSERT_EQUAL(base[0], 'B');
	CU_ASSERT_EQUAL(base[FAKE_PAGES * FAKE_PAGE_BYTES - 1], 'B');
	/* one descriptor more: the tier's; the stale one was closed */
	CU_ASSERT_EQUAL(open_fds(), before + 1);
	/* a stale reply is no event */
	CU_ASSERT_EQUAL(kvp_client_event_next(c, &ev, &e), -KVP_E_AGAIN);

	/* pages for huge token counts saturate instead of wrapping */
	CU_ASSERT_EQUAL(kvp_pool_pages_for(p, 0), 0);
	CU_ASSERT_EQUAL(kvp_pool_pages_for(p, 1), 1);
	CU_ASSERT_EQUAL(kvp_pool_pages_for(p, 16), 1);
	CU_ASSERT_EQUAL(kvp_pool_pages_for(p, 17), 2);
	CU_ASSERT_EQUAL(kvp_pool_pages_for(p, (uint64_t)UINT32_MAX * 16), UINT32_MAX);
	CU_ASSERT_EQUAL(kvp_pool_pages_for(p, (uint64_t)UINT32_MAX * 16 + 1), UINT32_MAX);
	CU_ASSERT_EQUAL(kvp_pool_pages_for(p, UINT64_MAX - 3), UINT32_MAX);
	CU_ASSERT_EQUAL(kvp_pool_pages_for(p, UINT64_MAX), UINT32_MAX);
	kvp_client_close(c);
	CU_ASSERT_EQUAL(open_fds(), before - 1); /* the socket too */
	CU_ASSERT_EQUAL(wait_fake(pid), 0);
}

/* ---- odd status codes ---- */

static const int g_codes[] = { INT_MIN, INT_MAX, -3, 100, 104, 1000 };

/* Answers each Ping with a failed status of the next code in g_codes. */
static int script_codes(int fd, void *arg)
{
	(void)arg;
	if (!fake_hello(fd))
		return 1;
	for (size_t i = 0; i < sizeof(g_codes) / sizeof(g_codes[0]); i++) {
		Kvpool__Request *q = fake_expect(fd, KVPOOL__REQUEST__CALL_PING);
		Kvpool__Response r = KVPOOL__RESPONSE__INIT;
		Kvpool__Status st = KVPOOL__STATUS__INIT;

		if (!q)
			return 2;
		st.code = (Kvpool__Code)g_codes[i];
		st.message = (char *)"odd";
		r.id = q->id;
		r.status = &st;
		kvpool__request__free_unpacked(q, NULL);
		if (h_fake_send(fd, &r, NULL, 0) < 0)
			return 3;
	}
	/* a code a newer daemon may add passes through */
	{
		Kvpool__Request *q = fake_expect(fd, KVPOOL__REQUEST__CALL_PING);
		Kvpool__Response r = KVPOOL__RESPONSE__INIT;
		Kvpool__Status st = KVPOOL__STATUS__INIT;

		if (!q)
			return 4;
		st.code = (Kvpool__Code)20;
		r.id = q->id;
		r.status = &st;
		kvpool__request__free_unpacked(q, NULL);
		if (h_fake_send(fd, &r, NULL, 0) < 0)
			return 5;
	}
	return fake_end(fd, 0);
}

static void test_kvp_client_ping_out_of_range_codes(void)
{
	pid_t pid = start_fake(script_codes, NULL);
	struct kvp_client *c = fake_connect();
	struct kvp_error e;

	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	for (size_t i = 0; i < sizeof(g_codes) / sizeof(g_codes[0]); i++) {
		CU_ASSERT_EQUAL(kvp_client_ping(c, &e), -KVP_E_PROTOCOL);
		CU_ASSERT_EQUAL(e.code, KVP_E_PROTOCOL);
		CU_ASSERT_PTR_NOT_NULL(strstr(e.message, "unknown code"));
	}
	CU_ASSERT_EQUAL(kvp_client_ping(c, &e), -20);
	CU_ASSERT_EQUAL(e.code, 20);
	CU_ASSERT_STRING_EQUAL(kvp_code_name(INT_MIN), "UNKNOWN");
	CU_ASSERT_STRING_EQUAL(kvp_code_name(-KVP_E_AGAIN), "AGAIN");
	kvp_client_close(c);
	CU_ASSERT_EQUAL(wait_fake(pid), 0);
}

/* ---- replies of the wrong size or kind ---- */

/* Answers an Alloc of n pages with n - 1, then expects the lease's Free. */
static int script_alloc_short(int fd, void *arg)
{
	Kvpool__Request *q;
	Kvpool__Response r = KVPOOL__RESPONSE__INIT;
	Kvpool__AllocResp a = KVPOOL__ALLOC_RESP__INIT;
	Kvpool__FreeResp f = KVPOOL__FREE_RESP__INIT;
	uint32_t pages[8] = { 0, 1, 2, 3, 4, 5, 6, 7 };
	int ok;

	(void)arg;
	if (!fake_hello(fd) || fake_attach(fd) < 0 ||
	    !(q = fake_expect(fd, KVPOOL__REQUEST__CALL_ALLOC)))
		return 1;
	a.lease_id = 42;
	a.n_pages = q->alloc->pages - 1;
	a.pages = pages;
	r.id = q->id;
	r.status = &g_ok;
	r.result_case = KVPOOL__RESPONSE__RESULT_ALLOC;
	r.alloc = &a;
	kvpool__request__free_unpacked(q, NULL);
	if (h_fake_send(fd, &r, NULL, 0) < 0)
		return 2;
	q = fake_expect(fd, KVPOOL__REQUEST__CALL_FREE);
	if (!q)
		return 3; /* the lease leaked */
	ok = q->free->lease_id == 42 && q->free->n_pages == 0;
	r.id = q->id;
	r.result_case = KVPOOL__RESPONSE__RESULT_FREE;
	r.free = &f;
	kvpool__request__free_unpacked(q, NULL);
	if (!ok || h_fake_send(fd, &r, NULL, 0) < 0)
		return 4;
	return fake_end(fd, 0);
}

static void test_kvp_lease_alloc_short_reply_frees_lease(void)
{
	pid_t pid = start_fake(script_alloc_short, NULL);
	struct kvp_client *c = fake_connect();
	uint32_t pages[4] = { 99, 99, 99, 99 };
	uint64_t lease = 5;
	struct kvp_error e;
	struct kvp_pool *p;

	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	p = kvp_pool_attach(c, "fake", NULL, &e);
	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	CU_ASSERT_EQUAL(kvp_lease_alloc(p, KVP_TIER_HOST, 4, &lease, pages, &e), -KVP_E_PROTOCOL);
	CU_ASSERT_EQUAL(e.code, KVP_E_PROTOCOL);
	/* outputs untouched on failure */
	CU_ASSERT_EQUAL(lease, 5);
	CU_ASSERT_EQUAL(pages[0], 99);
	kvp_client_close(c);
	CU_ASSERT_EQUAL(wait_fake(pid), 0);
}

/* Answers the next four requests (Free, Insert, Evict, Flush) with a Ping result. */
static int script_wrong_kind(int fd, void *arg)
{
	static const int calls[] = { KVPOOL__REQUEST__CALL_FREE,    KVPOOL__REQUEST__CALL_INSERT,
				     KVPOOL__REQUEST__CALL_EVICT,   KVPOOL__REQUEST__CALL_FLUSH,
				     KVPOOL__REQUEST__CALL_RELEASE, KVPOOL__REQUEST__CALL_DRAIN };

	(void)arg;
	if (!fake_hello(fd) || fake_attach(fd) < 0)
		return 1;
	for (size_t i = 0; i < sizeof(calls) / sizeof(calls[0]); i++) {
		Kvpool__Request *q = fake_expect(fd, calls[i]);

		if (!q)
			return 10 + (int)i;
		if (send_ping(fd, q->id, 1, NULL, 0) < 0)
			return 2;
		kvpool__request__free_unpacked(q, NULL);
	}
	return fake_end(fd, 0);
}

static void test_kvp_client_wrong_result_is_protocol(void)
{
	pid_t pid = start_fake(script_wrong_kind, NULL);
	struct kvp_client *c = fake_connect();
	uint32_t tokens[16] = { 1 }, pages[1] = { 0 };
	uint64_t n = 77;
	struct kvp_error e;
	struct kvp_pool *p;

	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	p = kvp_pool_attach(c, "fake", NULL, &e);
	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	CU_ASSERT_EQUAL(kvp_lease_free(p, 1, NULL, 0, &e), -KVP_E_PROTOCOL);
	CU_ASSERT_EQUAL(kvp_cache_insert(p, 1, 0, tokens, 16, 0, pages, 1, &n, &e),
			-KVP_E_PROTOCOL);
	CU_ASSERT_EQUAL(kvp_admin_evict(c, "fake", KVP_TIER_DEVICE, 16, &n, &e), -KVP_E_PROTOCOL);
	CU_ASSERT_EQUAL(kvp_admin_flush(c, "fake", &n, &e), -KVP_E_PROTOCOL);
	CU_ASSERT_EQUAL(kvp_cache_release(p, 1, &e), -KVP_E_PROTOCOL);
	CU_ASSERT_EQUAL(kvp_admin_drain(c, 1, &e), -KVP_E_PROTOCOL);
	CU_ASSERT_EQUAL(e.code, KVP_E_PROTOCOL);
	CU_ASSERT_EQUAL(n, 77);
	kvp_client_close(c);
	CU_ASSERT_EQUAL(wait_fake(pid), 0);
}

/* ExistsKeys answered with more leading keys than were asked about, then with all of them. */
static int script_exists_too_many(int fd, void *arg)
{
	(void)arg;
	if (!fake_hello(fd) || fake_attach(fd) < 0)
		return 1;
	for (uint32_t count = 3; count >= 2; count--) {
		Kvpool__Request *q = fake_expect(fd, KVPOOL__REQUEST__CALL_EXISTS_KEYS);
		Kvpool__Response r = KVPOOL__RESPONSE__INIT;
		Kvpool__ExistsKeysResp x = KVPOOL__EXISTS_KEYS_RESP__INIT;

		if (!q)
			return 2;
		x.count = count;
		r.id = q->id;
		r.status = &g_ok;
		r.result_case = KVPOOL__RESPONSE__RESULT_EXISTS_KEYS;
		r.exists_keys = &x;
		kvpool__request__free_unpacked(q, NULL);
		if (h_fake_send(fd, &r, NULL, 0) < 0)
			return 3;
	}
	return fake_end(fd, 0);
}

static void test_kvp_cache_exists_keys_count_beyond_keys_is_protocol(void)
{
	pid_t pid = start_fake(script_exists_too_many, NULL);
	struct kvp_client *c = fake_connect();
	struct kvp_page_key k[2] = { { "a", 1 }, { "b", 1 } };
	struct kvp_error e;
	struct kvp_pool *p;

	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	p = kvp_pool_attach(c, "fake", NULL, &e);
	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	CU_ASSERT_EQUAL(kvp_cache_exists_keys(p, 0, k, 2, &e), -KVP_E_PROTOCOL);
	CU_ASSERT_EQUAL(e.code, KVP_E_PROTOCOL);
	CU_ASSERT_EQUAL(kvp_cache_exists_keys(p, 0, k, 2, &e), 2);
	kvp_client_close(c);
	CU_ASSERT_EQUAL(wait_fake(pid), 0);
}

/* ---- socket paths ---- */

static void test_kvp_client_connect_path_too_long(void)
{
	char path[300];
	struct kvp_error e;
	char *old = getenv("KVPOOL_SOCKET") ? strdup(getenv("KVPOOL_SOCKET")) : NULL;

	/* 108 bytes do not fit sun_path with its NUL; a prefix of the path must not be used */
	memset(path, 'x', sizeof(path));
	path[0] = '/';
	path[108] = '\0';
	CU_ASSERT_PTR_NULL(kvp_client_connect(path, "long", &e));
	CU_ASSERT_EQUAL(e.code, KVP_E_INVALID_ARGUMENT);
	CU_ASSERT_EQUAL(e.sys_errno, ENAMETOOLONG);
	path[250] = '\0';
	path[108] = 'x';
	CU_ASSERT_PTR_NULL(kvp_client_connect(path, "long", &e));
	CU_ASSERT_EQUAL(e.code, KVP_E_INVALID_ARGUMENT);
	/* through the environment as well */
	setenv("KVPOOL_SOCKET", path, 1);
	CU_ASSERT_PTR_NULL(kvp_client_default_socket(path, 108));
	CU_ASSERT_PTR_NULL(kvp_client_connect(NULL, "long", &e));
	CU_ASSERT_EQUAL(e.code, KVP_E_INVALID_ARGUMENT);
	if (old)
		setenv("KVPOOL_SOCKET", old, 1);
	else
		unsetenv("KVPOOL_SOCKET");
	free(old);
}

static void test_kvpoolctl_socket_too_long(void)
{
	char cmd[600], path[200];
	int st;

	memset(path, 'y', sizeof(path));
	path[0] = '/';
	path[150] = '\0';
	snprintf(cmd, sizeof(cmd), "%s --socket '%s' --json ping >/dev/null 2>&1",
		 getenv("KVPOOLCTL"), path);
	st = system(cmd);
	CU_ASSERT(WIFEXITED(st));
	/* the library refuses it (KVP_E_INVALID_ARGUMENT): a typed refusal, not "no daemon" */
	CU_ASSERT_EQUAL(WEXITSTATUS(st), 1);
}

/* ---- mappings outlive the pool and the connection ---- */

static bool maps_contain(const void *addr)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512];
	bool found = false;

	if (!f)
		return false;
	while (!found && fgets(line, sizeof(line), f)) {
		unsigned long lo, hi;

		if (sscanf(line, "%lx-%lx", &lo, &hi) == 2)
			found = (unsigned long)addr >= lo && (unsigned long)addr < hi;
	}
	fclose(f);
	return found;
}

static void test_kvp_pool_tier_mapping_outlives_detach_and_close(void)
{
	struct kvp_error e;
	struct kvp_client *c = kvp_client_connect(g_d.sock, "mapping", &e);
	struct kvp_mapping *m[KVP_TIER_MAX], *extra;
	struct kvp_pool *p;
	char *base[KVP_TIER_MAX];
	uint64_t bytes[KVP_TIER_MAX];

	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	p = kvp_pool_attach(c, "default", NULL, &e);
	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	for (int t = 0; t < KVP_TIER_MAX; t++) {
		m[t] = kvp_pool_tier_mapping(p, t);
		CU_ASSERT_PTR_NOT_NULL_FATAL(m[t]);
		base[t] = kvp_mapping_base(m[t]);
		bytes[t] = kvp_mapping_bytes(m[t]);
		CU_ASSERT_PTR_EQUAL(base[t], kvp_pool_tier_base(p, t));
		CU_ASSERT_EQUAL(bytes[t], kvp_pool_tier_bytes(p, t));
		CU_ASSERT_EQUAL(kvp_mapping_tier(m[t]), t);
		CU_ASSERT_EQUAL(kvp_mapping_backend(m[t]), kvp_pool_tier_backend(p, t));
		CU_ASSERT_EQUAL(kvp_mapping_cuda_device(m[t]), -1);
		memset(base[t], 0x5a, 64);
	}
	CU_ASSERT_PTR_NULL(kvp_pool_tier_mapping(p, KVP_TIER_MAX));
	CU_ASSERT_PTR_NULL(kvp_pool_tier_mapping(p, -1));
	extra = kvp_mapping_ref(m[KVP_TIER_HOST]);
	CU_ASSERT_PTR_EQUAL(extra, m[KVP_TIER_HOST]);
	CU_ASSERT_EQUAL(kvp_pool_detach(p, &e), 0);
	kvp_client_close(c);
	for (int t = 0; t < KVP_TIER_MAX; t++) {
		CU_ASSERT(maps_contain(base[t]));
		CU_ASSERT(maps_contain(base[t] + bytes[t] - 1));
		CU_ASSERT_EQUAL(base[t][63], 0x5a);
		base[t][bytes[t] - 1] = 7;
		CU_ASSERT_EQUAL(base[t][bytes[t] - 1], 7);
	}
	kvp_mapping_unref(m[KVP_TIER_DEVICE]);
	CU_ASSERT(!maps_contain(base[KVP_TIER_DEVICE]));
	kvp_mapping_unref(m[KVP_TIER_HOST]);
	CU_ASSERT(maps_contain(base[KVP_TIER_HOST])); /* `extra` still holds it */
	kvp_mapping_unref(extra);
	CU_ASSERT(!maps_contain(base[KVP_TIER_HOST]));
	kvp_mapping_unref(NULL);
}

/* The pool's own mappings go at detach when nobody took a reference. */
static void test_kvp_pool_detach_unmaps_unreferenced(void)
{
	struct kvp_error e;
	struct kvp_client *c = kvp_client_connect(g_d.sock, "mapping", &e);
	struct kvp_pool *p;
	void *base;

	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	p = kvp_pool_attach(c, "default", NULL, &e);
	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	base = kvp_pool_tier_base(p, KVP_TIER_HOST);
	CU_ASSERT(maps_contain(base));
	CU_ASSERT_EQUAL(kvp_pool_detach(p, &e), 0);
	CU_ASSERT(!maps_contain(base));
	kvp_client_close(c);
}

/* A forked child cannot use the client its parent connected: every call is FORKED (nothing is
 * sent on the parent's socket, the parent's lease stays the parent's); it connects its own. */
static void test_kvp_client_forked_child_refused(void)
{
	struct kvp_error e;
	struct kvp_client *c = kvp_client_connect(g_d.sock, "parent", &e);
	struct kvp_pool *p;
	uint64_t lease, other;
	uint32_t pages[2], more[1];
	int st = -1;
	pid_t pid;

	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	p = kvp_pool_attach(c, "default", NULL, &e);
	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc(p, KVP_TIER_HOST, 2, &lease, pages, &e), 0);
	pid = fork();
	CU_ASSERT_FATAL(pid >= 0);
	if (pid == 0) {
		struct kvp_event ev = { .struct_size = sizeof(ev) };
		struct kvp_client *own;
		int bad = 0;

		bad |= (kvp_client_ping(c, &e) != -KVP_E_FORKED || e.code != KVP_E_FORKED) << 0;
		bad |= (kvp_lease_free(p, lease, pages, 2, &e) != -KVP_E_FORKED) << 1;
		bad |= (kvp_lease_alloc(p, KVP_TIER_HOST, 1, &other, more, &e) != -KVP_E_FORKED)
		       << 2;
		bad |= (kvp_lease_extend(p, lease, 1, more, &e) != -KVP_E_FORKED) << 3;
		bad |= (kvp_client_event_next(c, &ev, &e) != -KVP_E_FORKED) << 4;
		bad |= (kvp_client_event_fd(c) != -KVP_E_FORKED) << 5;
		bad |= (kvp_pool_detach(p, &e) != -KVP_E_FORKED) << 6;
		kvp_client_close(c); /* the child's copy: sends nothing */
		own = kvp_client_connect(g_d.sock, "child", &e);
		bad |= (!own || kvp_client_ping(own, &e) != 0) << 7;
		kvp_client_close(own);
		_exit(bad);
	}
	CU_ASSERT_EQUAL(waitpid(pid, &st, 0), pid);
	CU_ASSERT(WIFEXITED(st));
	if (WEXITSTATUS(st))
		printf("\n    child's failed checks: 0x%x\n", WEXITSTATUS(st));
	CU_ASSERT_EQUAL(WEXITSTATUS(st), 0);
	CU_ASSERT_EQUAL(kvp_client_ping(c, &e), 0);
	CU_ASSERT_EQUAL(kvp_lease_free(p, lease, pages, 2, &e), 0); /* still the parent's */
	CU_ASSERT_STRING_EQUAL(kvp_code_name(-KVP_E_FORKED), "FORKED");
	kvp_client_close(c);
}

/* ---- listings against the real daemon ---- */

static void test_kvp_session_list_and_cache_list(void)
{
	struct kvp_error e;
	struct kvp_client *c = kvp_client_connect(g_d.sock, "lister", &e);
	struct kvp_session_info s[8] = { [0].struct_size = sizeof(s[0]) };
	struct kvp_cache_prefix top[4] = { [0].struct_size = sizeof(top[0]) };
	struct kvp_match_result mr = { .struct_size = sizeof(mr) };
	uint32_t tokens[32], pages[2], dev[4], host[4];
	struct kvp_pool *p;
	uint64_t lease;
	int n, found = 0;

	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	n = kvp_session_list(c, s, 8, &e);
	CU_ASSERT(n >= 1);
	for (int i = 0; i < n && i < 8; i++) {
		CU_ASSERT_EQUAL(s[i].struct_size, sizeof(s[0]));
		if (s[i].session_id == kvp_client_session_id(c)) {
			found = 1;
			CU_ASSERT_STRING_EQUAL(s[i].name, "lister");
			CU_ASSERT_EQUAL(s[i].pid, getpid());
		}
	}
	CU_ASSERT(found);
	CU_ASSERT_EQUAL(kvp_session_list(c, NULL, 0, &e), n);
	s[0].struct_size = sizeof(size_t);
	CU_ASSERT_EQUAL(kvp_session_list(c, s, 8, &e), -KVP_E_INVALID_ARGUMENT);

	p = kvp_pool_attach(c, "default", NULL, &e);
	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	for (int i = 0; i < 32; i++)
		tokens[i] = 5000u + (uint32_t)i;
	CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc(p, KVP_TIER_DEVICE, 2, &lease, pages, &e), 0);
	CU_ASSERT_EQUAL(kvp_cache_insert(p, lease, 0, tokens, 32, 0, pages, 2, NULL, &e), 0);
	CU_ASSERT_EQUAL(kvp_cache_match(p, 0, tokens, 32, 0, &mr, dev, host, 4, &e), 0);
	CU_ASSERT_EQUAL(mr.matched_tokens, 32);
	n = kvp_cache_list(c, "default", top, 4, &e);
	CU_ASSERT(n >= 1);
	CU_ASSERT_EQUAL(top[0].struct_size, sizeof(top[0]));
	CU_ASSERT(top[0].tokens >= 16);
	CU_ASSERT_EQUAL(top[0].keyed, 0);
	{ /* pages of key calls are listed too, with their kind, from the same index */
		struct kvp_page_key k[1] = { { "listed-key", 10 } };
		struct kvp_match_keys_result km = { .struct_size = sizeof(km) };
		int hot = 0;

		CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc(p, KVP_TIER_DEVICE, 1, &lease, pages, &e), 0);
		CU_ASSERT_EQUAL(kvp_cache_insert_keys(p, lease, 7, k, 1, 0, pages, 1, NULL, &e), 0);
		for (int i = 0; i < 3; i++)
			CU_ASSERT_EQUAL(kvp_cache_match_keys(p, 7, k, 1, 0, &km, dev, host, 4, &e),
					0);
		CU_ASSERT_EQUAL(km.matched_keys, 1);
		n = kvp_cache_list(c, "default", top, 4, &e);
		CU_ASSERT(n >= 2);
		for (int i = 0; i < n && i < 4; i++)
			hot += top[i].keyed == 1 && top[i].ns == 7 && top[i].hits == 3;
		CU_ASSERT_EQUAL(hot, 1);
		CU_ASSERT_EQUAL(top[0].keyed, 1); /* 3 hits: the hottest */
	}
	CU_ASSERT_EQUAL(kvp_cache_list(c, "no-such-pool", top, 4, &e), -KVP_E_NO_SUCH_POOL);
	mr.struct_size = 4;
	CU_ASSERT_EQUAL(kvp_cache_match(p, 0, tokens, 32, 0, &mr, dev, host, 4, &e),
			-KVP_E_INVALID_ARGUMENT);
	CU_ASSERT_EQUAL(kvp_admin_flush(c, "default", NULL, &e), 0);
	kvp_client_close(c);
}

/* ---- struct_size: a newer library serves an older (smaller) and a newer (larger) caller ---- */

#define PAT 0xa5
/* A struct of this version followed by 8 pattern bytes that its struct_size covers: a newer
 * caller's. The library writes none of them. */
#define BIG(type)                                                                                  \
	struct {                                                                                   \
		type s;                                                                            \
		uint8_t tail[8];                                                                   \
	}

static bool tail_intact(const uint8_t *t)
{
	for (int i = 0; i < 8; i++)
		if (t[i] != PAT)
			return false;
	return true;
}

static void test_kvp_struct_size_larger_first_and_smaller(void)
{
	struct kvp_error e;
	struct kvp_client *c = kvp_client_connect(g_d.sock, "sizes", &e), *c2;
	BIG(struct kvp_status) *st = malloc(sizeof(*st));
	BIG(struct kvp_match_result) mr;
	BIG(struct kvp_match_keys_result) mk;
	BIG(struct kvp_client_opts) op;
	BIG(struct kvp_session_info) si[2];
	BIG(struct kvp_cache_prefix) cp[2];
	BIG(struct kvp_reload_item) ri[2];
	BIG(struct kvp_event) ev;
	struct kvp_page_key key = { "struct-size-key", 15 };
	uint32_t tokens[16], pages[1], dev[4], host[4];
	struct kvp_pool *p;
	uint64_t lease;

	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	CU_ASSERT_PTR_NOT_NULL_FATAL(st);
	p = kvp_pool_attach(c, "default", NULL, &e);
	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	for (int i = 0; i < 16; i++)
		tokens[i] = 7000u + (uint32_t)i;
	CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc(p, KVP_TIER_DEVICE, 1, &lease, pages, &e), 0);
	CU_ASSERT_EQUAL(kvp_cache_insert(p, lease, 9, tokens, 16, 0, pages, 1, NULL, &e), 0);

	/* status */
	memset(st, PAT, sizeof(*st));
	st->s.struct_size = sizeof(st->s) + 8;
	CU_ASSERT_EQUAL(kvp_client_status(c, &st->s, &e), 0);
	CU_ASSERT_EQUAL(st->s.struct_size, sizeof(st->s) + 8);
	CU_ASSERT(st->s.n_pools >= 1 && st->s.sessions >= 1);
	CU_ASSERT(tail_intact(st->tail));
	memset(st, PAT, sizeof(*st));
	st->s.struct_size = KVP_STATUS_SIZE_V02;
	CU_ASSERT_EQUAL(kvp_client_status(c, &st->s, &e), 0);
	CU_ASSERT(st->s.n_pools >= 1);
	/* a first-version caller's struct ends before the moving figures: left as it was */
	CU_ASSERT(KVP_STATUS_SIZE_V02 <= offsetof(struct kvp_status, moving_tokens));
	CU_ASSERT_EQUAL(((unsigned char *)st->s.moving_tokens)[0], PAT);
	CU_ASSERT(tail_intact(st->tail));
	st->s.struct_size = KVP_STATUS_SIZE_V02 - 1;
	CU_ASSERT_EQUAL(kvp_client_status(c, &st->s, &e), -KVP_E_INVALID_ARGUMENT);

	/* match */
	memset(&mr, PAT, sizeof(mr));
	mr.s.struct_size = sizeof(mr.s) + 8;
	CU_ASSERT_EQUAL(kvp_cache_match(p, 9, tokens, 16, 0, &mr.s, dev, host, 4, &e), 0);
	CU_ASSERT_EQUAL(mr.s.matched_tokens, 16);
	CU_ASSERT_EQUAL(mr.s.lock_id, 0);
	CU_ASSERT(tail_intact(mr.tail));
	mr.s.struct_size = KVP_MATCH_RESULT_SIZE_V02;
	CU_ASSERT_EQUAL(kvp_cache_match(p, 9, tokens, 16, 0, &mr.s, dev, host, 4, &e), 0);
	mr.s.struct_size = KVP_MATCH_RESULT_SIZE_V02 - 1;
	CU_ASSERT_EQUAL(kvp_cache_match(p, 9, tokens, 16, 0, &mr.s, dev, host, 4, &e),
			-KVP_E_INVALID_ARGUMENT);

	/* match keys (nothing cached under the key: a miss, written all the same) */
	memset(&mk, PAT, sizeof(mk));
	mk.s.struct_size = sizeof(mk.s) + 8;
	CU_ASSERT_EQUAL(kvp_cache_match_keys(p, 10, &key, 1, 0, &mk.s, dev, host, 4, &e), 0);
	CU_ASSERT_EQUAL(mk.s.matched_keys, 0);
	CU_ASSERT_EQUAL(mk.s.lock_id, 0);
	CU_ASSERT(tail_intact(mk.tail));
	mk.s.struct_size = KVP_MATCH_KEYS_RESULT_SIZE_V02;
	CU_ASSERT_EQUAL(kvp_cache_match_keys(p, 10, &key, 1, 0, &mk.s, dev, host, 4, &e), 0);
	mk.s.struct_size = KVP_MATCH_KEYS_RESULT_SIZE_V02 - 1;
	CU_ASSERT_EQUAL(kvp_cache_match_keys(p, 10, &key, 1, 0, &mk.s, dev, host, 4, &e),
			-KVP_E_INVALID_ARGUMENT);

	/* client opts: the trailing bytes are not read (a pattern would be a name pointer) */
	memset(&op, PAT, sizeof(op));
	op.s = (struct kvp_client_opts){ .struct_size = sizeof(op.s) + 8, .name = "sizes-2" };
	c2 = kvp_client_connect_opts(g_d.sock, &op.s, &e);
	CU_ASSERT_PTR_NOT_NULL_FATAL(c2);
	CU_ASSERT(tail_intact(op.tail));
	op.s.struct_size = KVP_CLIENT_OPTS_SIZE_V02 - 1;
	CU_ASSERT_PTR_NULL(kvp_client_connect_opts(g_d.sock, &op.s, &e));
	CU_ASSERT_EQUAL(e.code, KVP_E_INVALID_ARGUMENT);
	op.s.struct_size = KVP_CLIENT_OPTS_SIZE_V02;
	kvp_client_close(kvp_client_connect_opts(g_d.sock, &op.s, &e));

	/* listings: two sessions at a stride of sizeof + 8, each entry's tail untouched */
	memset(si, PAT, sizeof(si));
	si[0].s.struct_size = sizeof(si[0]);
	CU_ASSERT_EQUAL(sizeof(si[0]), sizeof(si[0].s) + 8);
	CU_ASSERT(kvp_session_list(c, &si[0].s, 2, &e) >= 2);
	for (int i = 0; i < 2; i++) {
		CU_ASSERT_EQUAL(si[i].s.struct_size, sizeof(si[0]));
		CU_ASSERT(si[i].s.session_id != 0);
		CU_ASSERT(tail_intact(si[i].tail));
	}
	si[0].s.struct_size = KVP_SESSION_INFO_SIZE_V02;
	CU_ASSERT(kvp_session_list(c, &si[0].s, 1, &e) >= 2);
	si[0].s.struct_size = KVP_SESSION_INFO_SIZE_V02 - 1;
	CU_ASSERT_EQUAL(kvp_session_list(c, &si[0].s, 1, &e), -KVP_E_INVALID_ARGUMENT);
	/* a stride that would misalign the entries after the first */
	si[0].s.struct_size = sizeof(si[0].s) + 4;
	CU_ASSERT_EQUAL(kvp_session_list(c, &si[0].s, 2, &e), -KVP_E_INVALID_ARGUMENT);

	memset(cp, PAT, sizeof(cp));
	cp[0].s.struct_size = sizeof(cp[0]);
	CU_ASSERT(kvp_cache_list(c, "default", &cp[0].s, 2, &e) >= 1);
	CU_ASSERT(cp[0].s.tokens >= 16);
	CU_ASSERT(tail_intact(cp[0].tail) && tail_intact(cp[1].tail));
	cp[0].s.struct_size = KVP_CACHE_PREFIX_SIZE_V02;
	CU_ASSERT(kvp_cache_list(c, "default", &cp[0].s, 1, &e) >= 1);
	cp[0].s.struct_size = KVP_CACHE_PREFIX_SIZE_V02 - 1;
	CU_ASSERT_EQUAL(kvp_cache_list(c, "default", &cp[0].s, 1, &e), -KVP_E_INVALID_ARGUMENT);

	memset(ri, PAT, sizeof(ri));
	ri[0].s.struct_size = sizeof(ri[0]);
	CU_ASSERT(kvp_admin_reload(c, &ri[0].s, 2, &e) >= 0);
	CU_ASSERT(tail_intact(ri[0].tail) && tail_intact(ri[1].tail));
	ri[0].s.struct_size = KVP_RELOAD_ITEM_SIZE_V02;
	CU_ASSERT(kvp_admin_reload(c, &ri[0].s, 1, &e) >= 0);
	ri[0].s.struct_size = KVP_RELOAD_ITEM_SIZE_V02 - 1;
	CU_ASSERT_EQUAL(kvp_admin_reload(c, &ri[0].s, 1, &e), -KVP_E_INVALID_ARGUMENT);

	/* event: none queued, but the size is checked first */
	memset(&ev, PAT, sizeof(ev));
	ev.s = (struct kvp_event){ .struct_size = KVP_EVENT_SIZE_V02 };
	CU_ASSERT_EQUAL(kvp_client_event_next(c, &ev.s, &e), -KVP_E_AGAIN);
	ev.s.struct_size = KVP_EVENT_SIZE_V02 - 1;
	CU_ASSERT_EQUAL(kvp_client_event_next(c, &ev.s, &e), -KVP_E_INVALID_ARGUMENT);

	CU_ASSERT_EQUAL(kvp_admin_flush(c, "default", NULL, &e), 0);
	kvp_client_close(c2);
	kvp_client_close(c);
	free(st);
}

static void test_kvp_admin_reload_lists_result(void)
{
	struct kvp_error e;
	struct kvp_client *c = kvp_client_connect(g_d.sock, "reloader", &e);
	struct kvp_reload_item it[4] = { [0].struct_size = sizeof(it[0]) };
	int n;

	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	/* the test's uid owns the daemon: admin; the config did not change */
	n = kvp_admin_reload(c, it, 4, &e);
	CU_ASSERT(n >= 0);
	for (int i = 0; i < n && i < 4; i++)
		CU_ASSERT(it[i].refused <= 1 && it[i].text[0]);
	CU_ASSERT_EQUAL(kvp_client_ping(c, &e), 0);
	kvp_client_close(c);
}

/* ---- kvpoolctl check-config --json ---- */

static void test_kvpoolctl_check_config_json_escapes_error(void)
{
	char conf[256], cmd[1024];
	FILE *f;
	int st;

	snprintf(conf, sizeof(conf), "%s/bad.conf", g_d.dir);
	f = fopen(conf, "w");
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	/* the value (quoted into the error) holds a quote, a backslash and a tab */
	fprintf(f, "[pool.default]\nlayers = 1\"\\\tx\n");
	fclose(f);
	snprintf(cmd, sizeof(cmd),
		 "%s --json check-config '%s' 2>/dev/null | python3 -c 'import json,sys; "
		 "d = json.load(sys.stdin); assert d[\"valid\"] is False; "
		 "assert \"\\\"\" in d[\"error\"] and \"\\\\\" in d[\"error\"] and \"\\t\" in "
		 "d[\"error\"]'",
		 getenv("KVPOOLCTL"), conf);
	st = system(cmd);
	CU_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_kvp_client_event_next_pushed_before_reply),
		H_TEST(test_kvp_client_event_next_bounded_queue),
		H_TEST(test_kvp_pool_attach_stale_reply_fds_closed),
		H_TEST(test_kvp_client_ping_out_of_range_codes),
		H_TEST(test_kvp_lease_alloc_short_reply_frees_lease),
		H_TEST(test_kvp_client_wrong_result_is_protocol),
		H_TEST(test_kvp_cache_exists_keys_count_beyond_keys_is_protocol),
		H_TEST(test_kvp_client_connect_path_too_long),
		H_TEST(test_kvpoolctl_socket_too_long),
		H_TEST(test_kvp_pool_tier_mapping_outlives_detach_and_close),
		H_TEST(test_kvp_pool_detach_unmaps_unreferenced),
		H_TEST(test_kvp_client_forked_child_refused),
		H_TEST(test_kvp_session_list_and_cache_list),
		H_TEST(test_kvp_admin_reload_lists_result),
		H_TEST(test_kvp_struct_size_larger_first_and_smaller),
		H_TEST(test_kvpoolctl_check_config_json_escapes_error),
	};

	return H_RUN_SUITE("client", init_suite, clean_suite, tests);
}
