/* kvpoolctl_events.c - `kvpoolctl events`: subscribes to kvpoold's KV event publisher ([events])
 * and prints each event of each KVEventBatch as one readable line (or one JSON object), for a
 * person checking what a router sees. With --replay it first asks the replay socket for the
 * batches from --from SEQ on, or for a snapshot of what the node holds (--snapshot), as a router
 * that joins late does. */
#include "kvpoolctl.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "kvp_config.h"

enum { EV_OK = 0, EV_USAGE = 2, EV_UNREACHABLE = 3 };

#if KVP_HAVE_EVENTS
#include <msgpack.h>
#include <zmq.h>

static bool str_is(const msgpack_object *o, const char *s)
{
	size_t n = strlen(s);

	return o->type == MSGPACK_OBJECT_STR && o->via.str.size == n &&
	       memcmp(o->via.str.ptr, s, n) == 0;
}

static void put_hex(const msgpack_object *o, bool json)
{
	if (o->type == MSGPACK_OBJECT_BIN) {
		if (json)
			putchar('"');
		for (uint32_t i = 0; i < o->via.bin.size; i++)
			printf("%02x", (unsigned char)o->via.bin.ptr[i]);
		if (json)
			putchar('"');
	} else if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
		printf("%llu", (unsigned long long)o->via.u64);
	} else {
		fputs(json ? "null" : "none", stdout);
	}
}

static void put_text(const msgpack_object *o, bool json)
{
	if (o->type != MSGPACK_OBJECT_STR) {
		fputs(json ? "null" : "-", stdout);
		return;
	}
	if (json) {
		char buf[256];
		size_t n = o->via.str.size < sizeof(buf) - 1 ? o->via.str.size : sizeof(buf) - 1;

		memcpy(buf, o->via.str.ptr, n);
		buf[n] = '\0';
		kvp_json_str(stdout, buf);
	} else {
		fwrite(o->via.str.ptr, 1, o->via.str.size, stdout);
	}
}

/* The fields of one event map kvpoolctl shows. */
struct ev_fields {
	const msgpack_object *type, *hashes, *parent, *tokens, *block_size, *medium, *locality,
		*ownership;
};

static void print_event(uint64_t seq, double ts, const msgpack_object *m, bool json)
{
	static const msgpack_object none = { .type = MSGPACK_OBJECT_NIL };
	struct ev_fields f = { &none, &none, &none, &none, &none, &none, &none, &none };

	if (m->type != MSGPACK_OBJECT_MAP)
		return;
	for (uint32_t i = 0; i < m->via.map.size; i++) {
		const msgpack_object *k = &m->via.map.ptr[i].key, *v = &m->via.map.ptr[i].val;

		if (str_is(k, "type"))
			f.type = v;
		else if (str_is(k, "block_hashes"))
			f.hashes = v;
		else if (str_is(k, "parent_block_hash"))
			f.parent = v;
		else if (str_is(k, "token_ids"))
			f.tokens = v;
		else if (str_is(k, "block_size"))
			f.block_size = v;
		else if (str_is(k, "medium"))
			f.medium = v;
		else if (str_is(k, "locality"))
			f.locality = v;
		else if (str_is(k, "ownership"))
			f.ownership = v;
	}
	if (json) {
		printf("{\"seq\":%llu,\"ts\":%.6f,\"type\":", (unsigned long long)seq, ts);
		put_text(f.type, true);
		printf(",\"medium\":");
		put_text(f.medium, true);
		printf(",\"block_hashes\":[");
		for (uint32_t i = 0;
		     f.hashes->type == MSGPACK_OBJECT_ARRAY && i < f.hashes->via.array.size; i++) {
			printf("%s", i ? "," : "");
			put_hex(&f.hashes->via.array.ptr[i], true);
		}
		printf("],\"parent_block_hash\":");
		put_hex(f.parent, true);
		printf(",\"token_ids\":[");
		for (uint32_t i = 0;
		     f.tokens->type == MSGPACK_OBJECT_ARRAY && i < f.tokens->via.array.size; i++)
			printf("%s%llu", i ? "," : "",
			       (unsigned long long)f.tokens->via.array.ptr[i].via.u64);
		printf("],\"locality\":");
		put_text(f.locality, true);
		printf(",\"ownership\":");
		put_text(f.ownership, true);
		printf("}\n");
		return;
	}
	printf("#%-6llu %.3f  %-16.*s %-7.*s", (unsigned long long)seq, ts,
	       f.type->type == MSGPACK_OBJECT_STR ? (int)f.type->via.str.size : 1,
	       f.type->type == MSGPACK_OBJECT_STR ? f.type->via.str.ptr : "?",
	       f.medium->type == MSGPACK_OBJECT_STR ? (int)f.medium->via.str.size : 0,
	       f.medium->type == MSGPACK_OBJECT_STR ? f.medium->via.str.ptr : "");
	for (uint32_t i = 0; f.hashes->type == MSGPACK_OBJECT_ARRAY && i < f.hashes->via.array.size;
	     i++) {
		printf(" ");
		put_hex(&f.hashes->via.array.ptr[i], false);
	}
	if (f.parent->type != MSGPACK_OBJECT_NIL) {
		printf("  parent ");
		put_hex(f.parent, false);
	}
	if (f.tokens->type == MSGPACK_OBJECT_ARRAY && f.tokens->via.array.size) {
		uint32_t n = f.tokens->via.array.size;

		printf("  tokens [");
		for (uint32_t i = 0; i < n && i < 8; i++)
			printf("%s%llu", i ? " " : "",
			       (unsigned long long)f.tokens->via.array.ptr[i].via.u64);
		printf("%s]", n > 8 ? " ..." : "");
	}
	if (f.ownership->type == MSGPACK_OBJECT_STR) {
		printf("  ");
		put_text(f.ownership, false);
	}
	putchar('\n');
}

/* One payload: [ts, [events], dp_rank]. Returns the events printed, -1 when it is no batch. */
static int print_batch(uint64_t seq, const void *data, size_t len, bool json)
{
	msgpack_unpacked u;
	size_t off = 0;
	int n = -1;

	msgpack_unpacked_init(&u);
	if (msgpack_unpack_next(&u, data, len, &off) == MSGPACK_UNPACK_SUCCESS &&
	    u.data.type == MSGPACK_OBJECT_ARRAY && u.data.via.array.size >= 2 &&
	    u.data.via.array.ptr[1].type == MSGPACK_OBJECT_ARRAY) {
		const msgpack_object *ts = &u.data.via.array.ptr[0];
		const msgpack_object_array *evs = &u.data.via.array.ptr[1].via.array;

		n = (int)evs->size;
		for (uint32_t i = 0; i < evs->size; i++)
			print_event(seq, ts->type == MSGPACK_OBJECT_FLOAT64 ? ts->via.f64 : 0.0,
				    &evs->ptr[i], json);
		if (!evs->size && !json)
			printf("#%-6llu (empty batch)\n", (unsigned long long)seq);
	}
	msgpack_unpacked_destroy(&u);
	return n;
}

/* Receives one multipart message of up to 8 parts into msgs; their count, or -1. */
static int recv_parts(void *sock, zmq_msg_t *msgs, int cap)
{
	int n = 0, more = 1;

	while (more) {
		size_t ml = sizeof(more);

		zmq_msg_init(&msgs[n < cap ? n : cap - 1]);
		if (zmq_msg_recv(&msgs[n < cap ? n : cap - 1], sock, 0) < 0)
			return -1;
		zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &ml);
		if (n < cap)
			n++;
		else
			zmq_msg_close(&msgs[cap - 1]);
	}
	return n;
}

static uint64_t seq_of(zmq_msg_t *m)
{
	const unsigned char *p = zmq_msg_data(m);
	uint64_t x = 0;

	if (zmq_msg_size(m) != 8)
		return UINT64_MAX;
	for (int i = 0; i < 8; i++)
		x = x << 8 | p[i];
	return x;
}

/* Asks the replay socket: prints every batch up to the end marker. Returns the last seq seen
 * (UINT64_MAX: none), *ok false when the socket did not answer in timeout ms. */
static uint64_t replay(void *ctx, const char *ep, const uint8_t req[8], int timeout, bool json,
		       long *count, bool *ok)
{
	void *d = zmq_socket(ctx, ZMQ_DEALER);
	uint64_t last = UINT64_MAX;
	int zero = 0;

	*ok = false;
	zmq_setsockopt(d, ZMQ_LINGER, &zero, sizeof(zero));
	zmq_setsockopt(d, ZMQ_RCVTIMEO, &timeout, sizeof(timeout));
	if (zmq_connect(d, ep) < 0 || zmq_send(d, "", 0, ZMQ_SNDMORE) < 0 ||
	    zmq_send(d, req, 8, 0) < 0) {
		zmq_close(d);
		return last;
	}
	for (;;) {
		zmq_msg_t m[8];
		int n = recv_parts(d, m, 8);
		uint64_t seq;

		if (n < 0)
			break;
		seq = n == 4 ? seq_of(&m[2]) : UINT64_MAX;
		if (n == 4 && seq == UINT64_MAX) { /* the end marker */
			*ok = true;
			for (int i = 0; i < n; i++)
				zmq_msg_close(&m[i]);
			break;
		}
		if (n == 4 && (*count < 0 || *count > 0)) {
			print_batch(seq, zmq_msg_data(&m[3]), zmq_msg_size(&m[3]), json);
			last = seq;
			if (*count > 0)
				(*count)--;
		}
		for (int i = 0; i < n; i++)
			zmq_msg_close(&m[i]);
	}
	zmq_close(d);
	fflush(stdout);
	return last;
}

int kvp_ctl_events(int argc, char **argv, int json)
{
	const char *ep = NULL, *rep = NULL, *topic = "";
	uint64_t from = 0, last = UINT64_MAX;
	bool snapshot = false, from_given = false, ok;
	long count = -1; /* batches to print; -1: until interrupted */
	int timeout = 5000, zero = 0, rc = EV_OK;
	void *ctx, *sub;

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (strcmp(a, "--snapshot") == 0) {
			snapshot = true;
		} else if (a[0] == '-' && !v) {
			fprintf(stderr, "kvpoolctl events: %s needs a value\n", a);
			return EV_USAGE;
		} else if (strcmp(a, "--topic") == 0) {
			topic = argv[++i];
		} else if (strcmp(a, "--replay") == 0) {
			rep = argv[++i];
		} else if (strcmp(a, "--from") == 0) {
			from = strtoull(argv[++i], NULL, 10);
			from_given = true;
		} else if (strcmp(a, "--count") == 0) {
			count = strtol(argv[++i], NULL, 10);
		} else if (strcmp(a, "--timeout") == 0) {
			timeout = (int)strtol(argv[++i], NULL, 10);
		} else if (a[0] != '-' && !ep) {
			ep = a;
		} else {
			fprintf(stderr, "kvpoolctl events: unexpected argument '%s'\n", a);
			return EV_USAGE;
		}
	}
	if (!ep || ((snapshot || from_given) && !rep) || (snapshot && from_given) || count == 0) {
		fprintf(stderr, "usage: kvpoolctl events ENDPOINT [--topic T] [--replay ENDPOINT "
				"[--from SEQ | --snapshot]] [--count BATCHES] [--timeout MS]\n");
		return EV_USAGE;
	}
	ctx = zmq_ctx_new();
	sub = zmq_socket(ctx, ZMQ_SUB);
	zmq_setsockopt(sub, ZMQ_LINGER, &zero, sizeof(zero));
	zmq_setsockopt(sub, ZMQ_SUBSCRIBE, topic, strlen(topic));
	if (zmq_connect(sub, ep) < 0) {
		fprintf(stderr, "kvpoolctl events: %s: %s\n", ep, zmq_strerror(zmq_errno()));
		zmq_close(sub);
		zmq_ctx_term(ctx);
		return EV_USAGE;
	}
	if (rep) { /* subscribed first: nothing falls between the replay and the stream */
		uint8_t req[8];

		if (snapshot) {
			memcpy(req, "SNAPSHOT", 8);
		} else {
			for (int i = 7; i >= 0; i--, from >>= 8)
				req[i] = (uint8_t)from;
		}
		last = replay(ctx, rep, req, timeout, json, &count, &ok);
		if (!ok) {
			fprintf(stderr, "kvpoolctl events: no answer from %s in %d ms\n", rep,
				timeout);
			rc = EV_UNREACHABLE;
		}
	}
	while (rc == EV_OK && count != 0) {
		zmq_msg_t m[8];
		int n = recv_parts(sub, m, 8);
		uint64_t seq;

		if (n < 0)
			break;
		seq = n == 3 ? seq_of(&m[1]) : UINT64_MAX;
		/* after a replay, live batches it already showed are skipped */
		if (n == 3 && seq != UINT64_MAX && (last == UINT64_MAX || seq > last)) {
			if (last != UINT64_MAX && seq > last + 1 && !json)
				printf("# batches %llu..%llu missed (ask --replay --from %llu)\n",
				       (unsigned long long)last + 1, (unsigned long long)seq - 1,
				       (unsigned long long)last + 1);
			print_batch(seq, zmq_msg_data(&m[2]), zmq_msg_size(&m[2]), json);
			fflush(stdout);
			last = seq;
			if (count > 0)
				count--;
		}
		for (int i = 0; i < n; i++)
			zmq_msg_close(&m[i]);
	}
	zmq_close(sub);
	zmq_ctx_term(ctx);
	return rc;
}

#else /* built without libzmq and msgpack-c */

int kvp_ctl_events(int argc, char **argv, int json)
{
	(void)argc;
	(void)argv;
	(void)json;
	fprintf(stderr, "kvpoolctl events: built without KV events (libzmq and msgpack-c: "
			"apt-get install libzmq3-dev libmsgpack-dev)\n");
	return EV_USAGE;
}
#endif
