/* test_events_restart.c - KV events across a restart through the fd store (a test supervisor
 * plays systemd): pages an engine inserted by key survive the restart, and the new kvpoold's
 * first batch, sequence 0, is [AllBlocksCleared, BlockStored of each of them]; a replay from 0
 * gets it, a snapshot says the same at the last sequence, and the sequence goes on from there. */
#include <CUnit/Basic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "fdsup.h"
#include "harness.h"
#include "kvpool.h"
#include "suite.h"

#define PT 16
#define NKEYS 6

static struct h_fdsup g_s;

static int config(void)
{
	char text[768];

	snprintf(text, sizeof(text),
		 "[daemon]\nresume_grace_ms = 5000\n"
		 "[events]\nendpoint = ipc://%s/ev.pub\nreplay_endpoint = ipc://%s/ev.replay\n"
		 "topic = kv\nsource = node-r\n"
		 "[pool.p]\nlayers = 2\nkv_heads = 2\nhead_dim = 8\ndtype = fp16\n"
		 "page_tokens = %d\ndevice = none\nhost_capacity = 64M\nmlock = off\n",
		 g_s.dir, g_s.dir, PT);
	return h_fdsup_config(&g_s, text);
}

/* One replay request (8 bytes) answered: the payloads up to the end marker into pay[] (their
 * sequences into seq[]); their count, or -1 on no answer in 10 s. */
static int ask(void *ctx, const void *req, uint64_t *seq, char **pay, size_t *len, int cap)
{
	char ep[160];
	void *d = zmq_socket(ctx, ZMQ_DEALER);
	int n = 0, t = 10000, zero = 0;

	snprintf(ep, sizeof(ep), "ipc://%s/ev.replay", g_s.dir);
	zmq_setsockopt(d, ZMQ_RCVTIMEO, &t, sizeof(t));
	zmq_setsockopt(d, ZMQ_LINGER, &zero, sizeof(zero));
	if (zmq_connect(d, ep) < 0 || zmq_send(d, "", 0, ZMQ_SNDMORE) < 0 ||
	    zmq_send(d, req, 8, 0) < 0) {
		fprintf(stderr, "replay request to %s: %s\n", ep, zmq_strerror(zmq_errno()));
		zmq_close(d);
		return -1;
	}
	for (;;) {
		zmq_msg_t m[4];
		int more = 1, k = 0;
		uint64_t s = 0;

		while (more) {
			size_t ml = sizeof(more);

			if (k == 4) {
				zmq_close(d);
				return -1;
			}
			zmq_msg_init(&m[k]);
			if (zmq_msg_recv(&m[k], d, 0) < 0) {
				fprintf(stderr, "replay answer from %s: %s\n", ep,
					zmq_strerror(zmq_errno()));
				zmq_close(d);
				return -1;
			}
			zmq_getsockopt(d, ZMQ_RCVMORE, &more, &ml);
			k++;
		}
		CU_ASSERT_EQUAL_FATAL(k, 4);
		CU_ASSERT_EQUAL_FATAL(zmq_msg_size(&m[2]), 8);
		for (int i = 0; i < 8; i++)
			s = s << 8 | ((const unsigned char *)zmq_msg_data(&m[2]))[i];
		if (s == UINT64_MAX) { /* the end marker */
			for (int i = 0; i < k; i++)
				zmq_msg_close(&m[i]);
			break;
		}
		CU_ASSERT_FATAL(n < cap);
		seq[n] = s;
		len[n] = zmq_msg_size(&m[3]);
		pay[n] = malloc(len[n]);
		memcpy(pay[n], zmq_msg_data(&m[3]), len[n]);
		n++;
		for (int i = 0; i < k; i++)
			zmq_msg_close(&m[i]);
	}
	zmq_close(d);
	return n;
}

static size_t count_of(const char *p, size_t len, const void *needle, size_t nlen)
{
	size_t c = 0;

	for (const char *q = p; (q = memmem(q, len - (size_t)(q - p), needle, nlen)); q += nlen)
		c++;
	return c;
}

static void test_kvpoold_restart_events_start_over(void)
{
	uint8_t keys[NKEYS][16];
	struct kvp_page_key k[NKEYS];
	struct kvp_error e;
	struct kvp_client *c;
	struct kvp_pool *p;
	uint32_t pages[NKEYS];
	uint64_t lease, seq[64];
	char *pay[64];
	size_t len[64];
	void *ctx;
	pid_t pid;
	int n;

	CU_ASSERT_EQUAL_FATAL(h_fdsup_init(&g_s), 0);
	CU_ASSERT_EQUAL_FATAL(config(), 0);
	pid = h_fdsup_start(&g_s);
	CU_ASSERT_FATAL(pid > 0);
	c = kvp_client_connect(g_s.sock, "events-restart", &e);
	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	p = kvp_pool_attach(c, "p", NULL, &e);
	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	for (int i = 0; i < NKEYS; i++) {
		memset(keys[i], 0, sizeof(keys[i]));
		snprintf((char *)keys[i], sizeof(keys[i]), "restart-key-%02d", i);
		k[i] = (struct kvp_page_key){ keys[i], sizeof(keys[i]) };
	}
	CU_ASSERT_EQUAL_FATAL(kvp_lease_alloc(p, KVP_TIER_HOST, NKEYS, &lease, pages, &e), 0);
	CU_ASSERT_EQUAL_FATAL(kvp_cache_insert_keys(p, lease, 5, k, NKEYS, 0, pages, NKEYS, NULL,
						    &e),
			      0);
	CU_ASSERT_EQUAL(kvp_lease_free(p, lease, NULL, 0, &e), 0);
	kvp_client_close(c);

	/* a clean restart through the fd store: the pages are adopted */
	CU_ASSERT_EQUAL(h_fdsup_stop(&g_s, pid, SIGTERM), 0);
	pid = h_fdsup_start(&g_s);
	CU_ASSERT_FATAL(pid > 0);
	CU_ASSERT(h_fdsup_log_count(&g_s, "events: publishing on") == 2);

	ctx = zmq_ctx_new();
	n = ask(ctx, (const uint8_t[8]){ 0 }, seq, pay, len, 64);
	CU_ASSERT_FATAL(n >= 1);
	/* sequence 0 again, and it holds the whole state: cleared, then each page stored once */
	CU_ASSERT_EQUAL(seq[0], 0);
	CU_ASSERT_EQUAL(count_of(pay[0], len[0], "AllBlocksCleared", 16), 1);
	CU_ASSERT_EQUAL(count_of(pay[0], len[0], "BlockStored", 11), NKEYS);
	CU_ASSERT_EQUAL(count_of(pay[0], len[0], "BlockRemoved", 12), 0);
	CU_ASSERT_EQUAL(count_of(pay[0], len[0],
				 "\xa3"
				 "CPU",
				 4),
			NKEYS);
	CU_ASSERT_EQUAL(count_of(pay[0], len[0], "node-r", 6), NKEYS);
	for (int i = 0; i < NKEYS; i++)
		CU_ASSERT(count_of(pay[0], len[0], keys[i], sizeof(keys[i])) >= 1);
	for (int i = 0; i < n; i++)
		free(pay[i]);

	/* a snapshot: the same pages, at the last sequence published */
	n = ask(ctx, "SNAPSHOT", seq, pay, len, 64);
	CU_ASSERT_EQUAL_FATAL(n, 1);
	CU_ASSERT_EQUAL(seq[0], 0);
	CU_ASSERT_EQUAL(count_of(pay[0], len[0], "AllBlocksCleared", 16), 1);
	CU_ASSERT_EQUAL(count_of(pay[0], len[0], "BlockStored", 11), NKEYS);
	free(pay[0]);
	zmq_ctx_term(ctx);
	CU_ASSERT_EQUAL(h_fdsup_stop(&g_s, pid, SIGTERM), 0);
	h_fdsup_fini(&g_s);
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_kvpoold_restart_events_start_over),
	};

	return H_RUN_SUITE("events_restart", NULL, NULL, tests);
}
