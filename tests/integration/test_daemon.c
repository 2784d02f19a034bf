/* test_daemon.c - the foundation against a real kvpoold: hello, ping, status from several
 * client processes, version skew, garbage and oversized frames closing only their own
 * connection, PERMISSION_DENIED, SIGTERM with clients connected. */
#include <CUnit/Basic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "kvpool.h"

static struct daemon g_d;

static int init_suite(void)
{
	return h_daemon_start(&g_d, NULL, NULL);
}

static int clean_suite(void)
{
	return h_daemon_finish(&g_d);
}

static int client_pings(void *arg)
{
	struct kvp_error e;
	struct kvp_status st = { .struct_size = sizeof(st) };
	struct kvp_client *c = kvp_client_connect(g_d.sock, (const char *)arg, &e);

	if (!c)
		return 10;
	for (int i = 0; i < 100; i++)
		if (kvp_client_ping(c, &e) < 0)
			return 11;
	if (kvp_client_status(c, &st, &e) < 0 || st.sessions < 1 ||
	    strcmp(st.daemon_version, "") == 0 || st.n_pools != 1 ||
	    strcmp(st.pools[0].name, "default") != 0)
		return 12;
	if (kvp_client_session_id(c) == 0)
		return 13;
	kvp_client_close(c);
	return 0;
}

static void test_hello_ping_status_several_processes(void)
{
	pid_t pids[6];

	for (int i = 0; i < 6; i++) {
		pids[i] = fork();
		if (pids[i] == 0)
			_exit(client_pings("pinger"));
	}
	for (int i = 0; i < 6; i++) {
		int st;

		CU_ASSERT_EQUAL(waitpid(pids[i], &st, 0), pids[i]);
		CU_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	}
}

static void test_status_counts_sessions(void)
{
	struct kvp_error e;
	struct kvp_status st = { .struct_size = sizeof(st) };
	struct kvp_client *a = kvp_client_connect(g_d.sock, "a", &e);
	struct kvp_client *b = kvp_client_connect(g_d.sock, "b", &e);

	CU_ASSERT_PTR_NOT_NULL_FATAL(a);
	CU_ASSERT_PTR_NOT_NULL_FATAL(b);
	CU_ASSERT_EQUAL(kvp_client_status(a, &st, &e), 0);
	CU_ASSERT_EQUAL(st.sessions, 2);
	CU_ASSERT_NOT_EQUAL(kvp_client_session_id(a), kvp_client_session_id(b));
	CU_ASSERT_EQUAL(st.pools[0].tiers[KVP_TIER_DEVICE].present, 1);
	CU_ASSERT_EQUAL(st.pools[0].tiers[KVP_TIER_DEVICE].backend, KVP_BACKEND_SIM);
	CU_ASSERT_EQUAL(st.pools[0].tiers[KVP_TIER_DEVICE].free_tokens,
			st.pools[0].tiers[KVP_TIER_DEVICE].total_tokens);
	kvp_client_close(b);
	kvp_client_close(a);
}

static Kvpool__Response *raw_hello(int fd, uint32_t version, uint64_t offer, uint64_t required)
{
	Kvpool__Request req = KVPOOL__REQUEST__INIT;
	Kvpool__HelloReq h = KVPOOL__HELLO_REQ__INIT;

	h.protocol_version = version;
	h.client_name = (char *)"raw";
	h.capabilities = offer;
	h.required_capabilities = required;
	req.id = 1;
	req.call_case = KVPOOL__REQUEST__CALL_HELLO;
	req.hello = &h;
	if (h_raw_send_request(fd, &req) < 0)
		return NULL;
	return h_raw_recv(fd, 3000);
}

/* A requirement the daemon lacks is refused with both sides' versions and bits, and the
 * connection closed; protocol 0 likewise. */
static void test_version_mismatch(void)
{
	const struct {
		uint32_t version;
		uint64_t required;
	} bad[] = { { 99, UINT64_C(1) << 40 }, { 0, 0 } };

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		int fd = h_raw_connect(g_d.sock);
		Kvpool__Response *r;
		char want[32];

		CU_ASSERT_FATAL(fd >= 0);
		r = raw_hello(fd, bad[i].version, bad[i].required, bad[i].required);
		CU_ASSERT_PTR_NOT_NULL_FATAL(r);
		CU_ASSERT_EQUAL(r->id, 1);
		CU_ASSERT_EQUAL(r->status->code, KVPOOL__CODE__VERSION);
		snprintf(want, sizeof(want), "protocol %u", bad[i].version);
		CU_ASSERT_PTR_NOT_NULL(strstr(r->status->message, want));
		kvpool__response__free_unpacked(r, NULL);
		CU_ASSERT(h_raw_closed(fd, 3000));
		close(fd);
	}
}

/* Hello without capabilities (the old form) is served and agrees to none; a newer protocol is
 * served too; the answer is the offer's intersection with what the daemon supports. */
static void test_hello_capabilities(void)
{
	const struct {
		uint32_t version;
		uint64_t offer, required, agreed;
	} ok[] = {
		{ 1, 0, 0, 0 },
		{ 99, 0, 0, 0 },
		{ 1, UINT64_MAX, 0, KVP_CAPS_DAEMON },
		{ 2, KVP_CAP_EVENTS, KVP_CAP_EVENTS, KVP_CAP_EVENTS },
		{ 1, UINT64_C(1) << 40, 0, 0 },
	};

	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		int fd = h_raw_connect(g_d.sock);
		Kvpool__Response *r;

		CU_ASSERT_FATAL(fd >= 0);
		r = raw_hello(fd, ok[i].version, ok[i].offer, ok[i].required);
		CU_ASSERT_PTR_NOT_NULL_FATAL(r);
		CU_ASSERT_EQUAL(r->status->code, KVPOOL__CODE__OK);
		CU_ASSERT_EQUAL_FATAL(r->result_case, KVPOOL__RESPONSE__RESULT_HELLO);
		CU_ASSERT_EQUAL(r->hello->capabilities, ok[i].agreed);
		kvpool__response__free_unpacked(r, NULL);
		close(fd);
	}
}

/* The library offers every bit it knows and reports the agreement; asking for nothing still
 * connects; requiring a bit the daemon lacks is KVP_E_VERSION. */
static void test_client_connect_capabilities(void)
{
	struct kvp_client_opts o = { .struct_size = sizeof(o), .name = "caps" };
	struct kvp_error e;
	struct kvp_client *c = kvp_client_connect(g_d.sock, "caps", &e);

	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	CU_ASSERT_EQUAL(kvp_client_capabilities(c), KVP_CAP_ALL & KVP_CAPS_DAEMON);
	CU_ASSERT_EQUAL(kvp_client_ping(c, &e), 0);
	kvp_client_close(c);
	c = kvp_client_connect_opts(g_d.sock, &o, &e);
	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	CU_ASSERT_EQUAL(kvp_client_capabilities(c), 0);
	CU_ASSERT_EQUAL(kvp_client_ping(c, &e), 0);
	kvp_client_close(c);
	o.required_capabilities = KVP_CAP_EVENTS;
	c = kvp_client_connect_opts(g_d.sock, &o, &e);
	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	CU_ASSERT_EQUAL(kvp_client_capabilities(c), KVP_CAP_EVENTS);
	kvp_client_close(c);
	o.required_capabilities = UINT64_C(1) << 40;
	CU_ASSERT_PTR_NULL(kvp_client_connect_opts(g_d.sock, &o, &e));
	CU_ASSERT_EQUAL(e.code, KVP_E_VERSION);
	o.struct_size = sizeof(size_t);
	CU_ASSERT_PTR_NULL(kvp_client_connect_opts(g_d.sock, &o, &e));
	CU_ASSERT_EQUAL(e.code, KVP_E_INVALID_ARGUMENT);
}

static void test_call_before_hello_is_protocol(void)
{
	int fd = h_raw_connect(g_d.sock);
	Kvpool__Request req = KVPOOL__REQUEST__INIT;
	Kvpool__PingReq p = KVPOOL__PING_REQ__INIT;
	Kvpool__Response *r;

	CU_ASSERT_FATAL(fd >= 0);
	req.id = 5;
	req.call_case = KVPOOL__REQUEST__CALL_PING;
	req.ping = &p;
	CU_ASSERT_EQUAL(h_raw_send_request(fd, &req), 0);
	r = h_raw_recv(fd, 3000);
	CU_ASSERT_PTR_NOT_NULL_FATAL(r);
	CU_ASSERT_EQUAL(r->status->code, KVPOOL__CODE__PROTOCOL);
	kvpool__response__free_unpacked(r, NULL);
	close(fd);
}

/* A bystander keeps pinging while hostile connections come and go. */
static void hostile_while_bystander(const void *bytes, size_t n, int expect_protocol_reply)
{
	struct kvp_error e;
	struct kvp_client *ok = kvp_client_connect(g_d.sock, "bystander", &e);
	int fd = h_raw_connect(g_d.sock);
	Kvpool__Response *r;

	CU_ASSERT_PTR_NOT_NULL_FATAL(ok);
	CU_ASSERT_FATAL(fd >= 0);
	r = raw_hello(fd, KVP_PROTOCOL_VERSION, 0, 0);
	CU_ASSERT_PTR_NOT_NULL_FATAL(r);
	CU_ASSERT_EQUAL(r->status->code, KVPOOL__CODE__OK);
	kvpool__response__free_unpacked(r, NULL);
	CU_ASSERT_EQUAL(send(fd, bytes, n, MSG_NOSIGNAL), (ssize_t)n);
	if (expect_protocol_reply) {
		r = h_raw_recv(fd, 3000);
		CU_ASSERT_PTR_NOT_NULL(r);
		if (r) {
			CU_ASSERT_EQUAL(r->status->code, KVPOOL__CODE__PROTOCOL);
			kvpool__response__free_unpacked(r, NULL);
		}
	}
	CU_ASSERT(h_raw_closed(fd, 3000));
	close(fd);
	CU_ASSERT_EQUAL(kvp_client_ping(ok, &e), 0);
	kvp_client_close(ok);
}

static void test_garbage_frame_closes_only_its_connection(void)
{
	uint8_t garbage[] = { 6, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff };

	hostile_while_bystander(garbage, sizeof(garbage), 1);
}

static void test_oversized_frame_closes_only_its_connection(void)
{
	uint8_t big[] = { 0xff, 0xff, 0xff, 0x7f, 1, 2, 3 };

	hostile_while_bystander(big, sizeof(big), 1);
}

static void test_split_and_merged_frames(void)
{
	int fd = h_raw_connect(g_d.sock);
	Kvpool__Request req = KVPOOL__REQUEST__INIT;
	Kvpool__HelloReq h = KVPOOL__HELLO_REQ__INIT;
	Kvpool__PingReq p = KVPOOL__PING_REQ__INIT;
	uint8_t buf[512];
	size_t n = 0;

	CU_ASSERT_FATAL(fd >= 0);
	h.protocol_version = KVP_PROTOCOL_VERSION;
	req.id = 1;
	req.call_case = KVPOOL__REQUEST__CALL_HELLO;
	req.hello = &h;
	n += 4 + kvpool__request__pack(&req, buf + n + 4);
	buf[0] = (uint8_t)(n - 4);
	buf[1] = buf[2] = buf[3] = 0;
	for (int i = 0; i < 3; i++) {
		size_t at = n, len;

		req.id = 10 + (uint64_t)i;
		req.call_case = KVPOOL__REQUEST__CALL_PING;
		req.ping = &p;
		p.nonce = 77 + (uint64_t)i;
		len = kvpool__request__pack(&req, buf + at + 4);
		buf[at] = (uint8_t)len;
		buf[at + 1] = buf[at + 2] = buf[at + 3] = 0;
		n += 4 + len;
	}
	/* Byte by byte for the first frame and a half, then the rest merged. */
	for (size_t i = 0; i < 20 && i < n; i++) {
		CU_ASSERT_EQUAL(send(fd, buf + i, 1, MSG_NOSIGNAL), 1);
		usleep(1000);
	}
	CU_ASSERT_EQUAL(send(fd, buf + 20, n - 20, MSG_NOSIGNAL), (ssize_t)(n - 20));
	for (int i = 0; i < 4; i++) {
		Kvpool__Response *r = h_raw_recv(fd, 3000);

		CU_ASSERT_PTR_NOT_NULL_FATAL(r);
		CU_ASSERT_EQUAL(r->status->code, KVPOOL__CODE__OK);
		CU_ASSERT_EQUAL(r->id, i == 0 ? 1 : 10 + (uint64_t)(i - 1));
		if (i > 0) {
			CU_ASSERT_EQUAL(r->result_case, KVPOOL__RESPONSE__RESULT_PING);
			CU_ASSERT_EQUAL(r->ping->nonce, 77 + (uint64_t)(i - 1));
		}
		kvpool__response__free_unpacked(r, NULL);
	}
	close(fd);
}

static void test_unknown_call_is_typed(void)
{
	struct kvp_error e;
	struct kvp_client *c = kvp_client_connect(g_d.sock, "t", &e);
	int fd = h_raw_connect(g_d.sock);
	Kvpool__Response *r;
	/* Hello, then a Request whose oneof is field 99 (unknown to this daemon). */
	uint8_t unk[] = { 5, 0, 0, 0, 0x08, 0x02, 0x9a, 0x06, 0x00 };

	CU_ASSERT_FATAL(fd >= 0 && c);
	r = raw_hello(fd, KVP_PROTOCOL_VERSION, 0, 0);
	CU_ASSERT_PTR_NOT_NULL_FATAL(r);
	kvpool__response__free_unpacked(r, NULL);
	CU_ASSERT_EQUAL(send(fd, unk, sizeof(unk), MSG_NOSIGNAL), (ssize_t)sizeof(unk));
	r = h_raw_recv(fd, 3000);
	CU_ASSERT_PTR_NOT_NULL_FATAL(r);
	CU_ASSERT_EQUAL(r->id, 2);
	CU_ASSERT_EQUAL(r->status->code, KVPOOL__CODE__INVALID_ARGUMENT);
	kvpool__response__free_unpacked(r, NULL);
	CU_ASSERT_EQUAL(kvp_client_ping(c, &e), 0);
	close(fd);
	kvp_client_close(c);
}

static int denied_client(void *arg)
{
	struct kvp_error e;
	struct kvp_client *c;

	(void)arg;
	if (getuid() == 0 && setuid(65534) < 0)
		return 20;
	c = kvp_client_connect(g_d.sock, "intruder", &e);
	if (c)
		return 21;
	return e.code == KVP_E_PERMISSION_DENIED ? 0 : 22;
}

static void test_permission_denied_for_uid_not_allowed(void)
{
	struct daemon saved = g_d, d;
	char uid[32];
	const char *args[] = { "--allow-uid", uid, NULL };
	struct kvp_status st = { .struct_size = sizeof(st) };
	struct kvp_error e;
	struct kvp_client *c;

	/* Allow only a uid nobody here has: root stays allowed, others are refused. */
	snprintf(uid, sizeof(uid), "%u", 4242u);
	CU_ASSERT_EQUAL_FATAL(h_daemon_start(&d, NULL, args), 0);
	/* Let any uid reach the socket: the daemon's credential check is what is tested. */
	CU_ASSERT_EQUAL(chmod(d.dir, 0755), 0);
	CU_ASSERT_EQUAL(chmod(d.sock, 0666), 0);
	g_d = d;
	CU_ASSERT_EQUAL(h_in_child(denied_client, NULL), 0);
	if (getuid() == 0) {
		c = kvp_client_connect(d.sock, "root", &e);
		CU_ASSERT_PTR_NOT_NULL_FATAL(c);
		CU_ASSERT_EQUAL(kvp_client_status(c, &st, &e), 0);
		CU_ASSERT_EQUAL(st.sessions, 1); /* the refused one made no session */
		kvp_client_close(c);
	}
	CU_ASSERT(h_log_contains(&d, "not allowed"));
	CU_ASSERT_EQUAL(h_daemon_stop(&d), 0);
	h_daemon_cleanup(&d);
	g_d = saved;
}

static void test_socket_mode_0660(void)
{
	struct stat sb;

	CU_ASSERT_EQUAL_FATAL(stat(g_d.sock, &sb), 0);
	CU_ASSERT_EQUAL(sb.st_mode & 0777, 0660);
}

/* A socket path whose directory does not exist yet: kvpoold makes it 0750 (its runtime
 * directory, like RuntimeDirectoryMode=0750 under systemd), the socket 0660. */
static void test_runtime_directory_mode_0750(void)
{
	struct daemon d;
	char sock[160], dir[64];
	const char *args[] = { "--socket", sock, NULL };
	struct stat sb;

	snprintf(dir, sizeof(dir), "/tmp/kvpool-rundir-%d", (int)getpid());
	snprintf(sock, sizeof(sock), "%s/kvpoold.sock", dir);
	CU_ASSERT_EQUAL_FATAL(h_daemon_start(&d, NULL, args), 0);
	CU_ASSERT_EQUAL(stat(dir, &sb), 0);
	CU_ASSERT(S_ISDIR(sb.st_mode));
	CU_ASSERT_EQUAL(sb.st_mode & 0777, 0750);
	CU_ASSERT_EQUAL(stat(sock, &sb), 0);
	CU_ASSERT_EQUAL(sb.st_mode & 0777, 0660);
	CU_ASSERT_EQUAL(h_daemon_stop(&d), 0);
	CU_ASSERT_NOT_EQUAL(access(sock, F_OK), 0); /* removed at exit */
	rmdir(dir);
	h_daemon_cleanup(&d);
}

static void test_sigterm_with_clients_connected_exits_0(void)
{
	struct daemon d;
	struct kvp_error e;
	struct kvp_client *c[4];

	CU_ASSERT_EQUAL_FATAL(h_daemon_start(&d, NULL, NULL), 0);
	for (int i = 0; i < 4; i++) {
		c[i] = kvp_client_connect(d.sock, "held", &e);
		CU_ASSERT_PTR_NOT_NULL(c[i]);
	}
	CU_ASSERT_EQUAL(h_daemon_stop(&d), 0);
	for (int i = 0; i < 4; i++) {
		if (!c[i])
			continue;
		/* The session is gone: a call sees a clean EOF, not a hang. */
		CU_ASSERT(kvp_client_ping(c[i], &e) < 0);
		CU_ASSERT_EQUAL(e.code, KVP_E_TRANSPORT);
		kvp_client_close(c[i]);
	}
	CU_ASSERT(h_log_contains(&d, "stopping: SIGTERM"));
	h_daemon_cleanup(&d);
}

static void test_no_daemon_is_typed(void)
{
	struct kvp_error e;
	struct kvp_client *c = kvp_client_connect("/tmp/kvpool-nonexistent.sock", "x", &e);

	CU_ASSERT_PTR_NULL(c);
	CU_ASSERT_EQUAL(e.code, KVP_E_NO_DAEMON);
	CU_ASSERT_PTR_NOT_NULL(strstr(e.message, "no kvpoold at"));
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_hello_ping_status_several_processes),
		H_TEST(test_status_counts_sessions),
		H_TEST(test_version_mismatch),
		H_TEST(test_hello_capabilities),
		H_TEST(test_client_connect_capabilities),
		H_TEST(test_call_before_hello_is_protocol),
		H_TEST(test_garbage_frame_closes_only_its_connection),
		H_TEST(test_oversized_frame_closes_only_its_connection),
		H_TEST(test_split_and_merged_frames),
		H_TEST(test_unknown_call_is_typed),
		H_TEST(test_permission_denied_for_uid_not_allowed),
		H_TEST(test_socket_mode_0660),
		H_TEST(test_runtime_directory_mode_0750),
		H_TEST(test_sigterm_with_clients_connected_exits_0),
		H_TEST(test_no_daemon_is_typed),
	};

	return H_RUN_SUITE("daemon", init_suite, clean_suite, tests);
}
