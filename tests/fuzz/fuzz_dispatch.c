/* fuzz_dispatch.c - libFuzzer target: arbitrary bytes through frame reassembly (in chunks
 * whose sizes come from the input), request decoding and dispatch against an in-process pool
 * and two sessions. After every input the pool invariant must hold and nothing may leak. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "dispatch.h"
#include "frame.h"
#include "log.h"
#include "session.h"

static const char g_conf[] =
	"[daemon]\nmax_leases_per_session = 64\nmax_locks_per_session = 64\n"
	"[pool.f]\nlayers = 1\nkv_heads = 1\nhead_dim = 4\ndtype = fp16\npage_tokens = 4\n"
	"device = sim\ndevice_capacity = 256t\nhost_capacity = 128t\nmlock = off\n"
	"eviction = lru\nsession_quota = 200\n";

static struct kvp_daemon g_d;
static struct kvp_arena g_arena;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	char err[256];
	struct kvp_fail f = { 0 };

	(void)argc;
	(void)argv;
	g_log_level = -1; /* quiet */
	if (kvp_conf_load_string(&g_d.conf, g_conf, "fuzz", err, sizeof(err)) < 0) {
		fprintf(stderr, "fuzz config: %s\n", err);
		abort();
	}
	g_d.pools[0] = kvp_pool_create(&g_d.conf.pools[0], 0, &f);
	if (!g_d.pools[0]) {
		fprintf(stderr, "fuzz pool: %s\n", f.msg);
		abort();
	}
	g_d.n_pools = 1;
	if (kvp_arena_init(&g_arena, 4096) < 0) /* small: large requests spill to malloc */
		abort();
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct kvp_fail f = { 0 };
	struct kvp_session *s[2];
	struct kvp_frame_buf b[2];
	size_t off = size ? 1 : 0; /* byte 0: which sessions said Hello */

	for (int i = 0; i < 2; i++) {
		s[i] = kvp_session_new(&g_d, 1000 + i, (uid_t)i, 0, i == 0, &f);
		if (!s[i])
			abort();
		s[i]->hello = (size > 0 && (data[0] & (1 << i)));
		kvp_frame_buf_init(&b[i]);
	}
	while (off < size) {
		/* Each chunk: 1 byte header (session bit + length), then up to 63 bytes. */
		int who = data[off] >> 7;
		size_t n = data[off] & 0x3f;
		const uint8_t *payload;
		uint32_t len;
		int r;

		off++;
		if (n > size - off)
			n = size - off;
		if (kvp_frame_buf_append(&b[who], data + off, n) < 0)
			break;
		off += n;
		while ((r = kvp_frame_next(&b[who], &payload, &len)) == 1) {
			/* decoded as kvpoold does: into an arena reset after the reply is packed
			 * (under ASan, a pointer kept into the request is reported) */
			Kvpool__Request *req = kvp_frame_decode_request_in(&g_arena, payload, len);
			struct kvp_reply rep;
			uint8_t *out;
			size_t outlen;

			if (!req) {
				kvp_arena_reset(&g_arena);
				break;
			}
			kvp_reply_init(&rep, req->id);
			kvp_dispatch(&g_d, s[who], req, &rep);
			if (kvp_frame_pack(&rep.resp.base, &out, &outlen) == 0)
				free(out);
			kvp_reply_release(&rep);
			kvp_arena_reset(&g_arena);
			if (kvp_daemon_check(&g_d) < 0)
				abort();
		}
		if (r < 0)
			break;
	}
	/* Deferred Reload calls (no loop here to run the reload): answered as at a stop, and no
	 * ticket may be left. */
	while (g_d.defers.reload_waiting) {
		struct kvp_defer *t = g_d.defers.reload_waiting;

		g_d.defers.reload_waiting = t->next;
		kvp_fail(&f, KVP_ERR_SHUTTING_DOWN, "fuzz");
		kvp_defer_fail(&g_d.defers, t, &f);
	}
	if (g_d.defers.n)
		abort();
	g_d.reload_requested = false;
	for (int i = 0; i < 2; i++) {
		kvp_session_destroy(&g_d, s[i]);
		kvp_frame_buf_release(&b[i]);
	}
	/* Everything a session held came back: only cached pages may remain in use. */
	for (int t = 0; t < KVP_TIER_ID_MAX; t++) {
		struct kvp_tier_counts c;

		kvp_pool_counts(g_d.pools[0], t, &c);
		if (c.leased != 0 || c.protected_ != 0 || c.free + c.cached != c.total)
			abort();
	}
	if (kvp_daemon_check(&g_d) < 0)
		abort();
	return 0;
}
