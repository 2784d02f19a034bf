/* events.c - the publisher: the PUB and replay ROUTER sockets (libzmq), the turn's batch, the
 * replay ring (bounded in batches and in bytes) and the answers to replay and snapshot requests.
 * Nothing here blocks: every send is ZMQ_DONTWAIT, and the PUB socket refuses (ZMQ_XPUB_NODROP)
 * rather than silently drops a batch a subscriber has no room for, so drops are counted.
 * A batch is staged in one buffer that stays the publisher's (hot in the cache, turn after turn),
 * its payload made in place there (kvp_events_batch_payload) and copied once, past the cache,
 * into a buffer the ring and every message that carries it (live, replays) share by reference:
 * the last reference frees it (libzmq drops its own on its I/O thread, hence the atomic count),
 * or, once no message holds it, the ring gives it to a later batch (no new pages to fault in). */
#include "events.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define SNAPSHOT_REQUEST "SNAPSHOT" /* 8 bytes, where a replay request has its start sequence */

/* A published batch's payload, shared by the ring and the messages in flight. */
struct blob {
	atomic_uint refs;
	uint8_t *buf;	     /* the batch's buffer, freed with the last reference */
	size_t cap;	     /* its size */
	const uint8_t *data; /* the payload in it */
	size_t len;
};

struct ring_slot {
	uint64_t seq;
	struct blob *b;
};

struct kvp_events {
	void *zctx, *pub, *replay;
	char *topic;
	size_t topic_len;
	char *source;
	struct kvp_events_batch batch; /* the turn's events */
	uint8_t *spare;		       /* a buffer the ring let go of, for the next batch */
	size_t spare_cap;
	uint64_t lost;		  /* events that could not be staged, this turn */
	const zmq_msg_t *snap_to; /* a snapshot's requester, while its batches are staged */
	double snap_ts;		  /* and its stamp */
	int snap_err;		  /* the first error of the snapshot's sends */
	struct ring_slot *ring;	  /* buffer_steps slots, oldest at head */
	uint32_t cap, head, count;
	uint64_t ring_bytes, max_bytes;
	struct kvp_events_stats st;
};

static void be64(uint64_t x, uint8_t out[8])
{
	for (int i = 7; i >= 0; i--) {
		out[i] = (uint8_t)x;
		x >>= 8;
	}
}

static uint64_t from_be64(const uint8_t in[8])
{
	uint64_t x = 0;

	for (int i = 0; i < 8; i++)
		x = x << 8 | in[i];
	return x;
}

struct kvp_events *kvp_events_new(const struct kvp_events_conf *c, char *err, size_t errlen)
{
	struct kvp_events *ev = calloc(1, sizeof(*ev));
	int one = 1, zero = 0, hwm = (int)c->hwm;

	if (!ev || !c->endpoint || !c->buffer_steps) {
		snprintf(err, errlen, "%s",
			 ev ? "no endpoint or no replay buffer" : "out of memory");
		free(ev);
		return NULL;
	}
	ev->cap = c->buffer_steps;
	ev->max_bytes = c->buffer_bytes;
	ev->ring = calloc(ev->cap, sizeof(*ev->ring));
	ev->topic = strdup(c->topic ? c->topic : "");
	ev->source = c->source && c->source[0] ? strdup(c->source) : NULL;
	ev->zctx = zmq_ctx_new();
	if (!ev->ring || !ev->topic || (c->source && c->source[0] && !ev->source) || !ev->zctx) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	ev->topic_len = strlen(ev->topic);
	ev->batch.source = ev->source;
	ev->pub = zmq_socket(ev->zctx, ZMQ_PUB);
	if (!ev->pub || zmq_setsockopt(ev->pub, ZMQ_SNDHWM, &hwm, sizeof(hwm)) < 0 ||
	    zmq_setsockopt(ev->pub, ZMQ_XPUB_NODROP, &one, sizeof(one)) < 0 ||
	    zmq_setsockopt(ev->pub, ZMQ_LINGER, &zero, sizeof(zero)) < 0 ||
	    zmq_bind(ev->pub, c->endpoint) < 0) {
		snprintf(err, errlen, "endpoint %s: %s", c->endpoint, zmq_strerror(zmq_errno()));
		goto fail;
	}
	if (c->replay_endpoint && c->replay_endpoint[0]) {
		/* room for a whole ring and its end marker to each requester */
		int rhwm = c->buffer_steps > (uint32_t)(INT32_MAX / 2 - 1)
				   ? INT32_MAX
				   : (int)(2 * (c->buffer_steps + 1));

		ev->replay = zmq_socket(ev->zctx, ZMQ_ROUTER);
		if (!ev->replay ||
		    zmq_setsockopt(ev->replay, ZMQ_SNDHWM, &rhwm, sizeof(rhwm)) < 0 ||
		    zmq_setsockopt(ev->replay, ZMQ_LINGER, &zero, sizeof(zero)) < 0 ||
		    zmq_bind(ev->replay, c->replay_endpoint) < 0) {
			snprintf(err, errlen, "replay endpoint %s: %s", c->replay_endpoint,
				 zmq_strerror(zmq_errno()));
			goto fail;
		}
	}
	return ev;
fail:
	kvp_events_free(ev);
	return NULL;
}

static void blob_unref(struct blob *b)
{
	if (atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) == 1) {
		free(b->buf);
		free(b);
	}
}

/* libzmq's free function of a message that carries a blob (on its I/O thread, or in the call
 * that closes or drops the message). */
static void blob_msg_free(void *data, void *hint)
{
	(void)data;
	blob_unref(hint);
}

static void ring_drop_oldest(struct kvp_events *ev)
{
	struct ring_slot *s = &ev->ring[ev->head];

	ev->ring_bytes -= s->b->len;
	/* no message holds it: its buffer (its pages faulted in already) takes a later batch */
	if (atomic_load_explicit(&s->b->refs, memory_order_acquire) == 1 &&
	    s->b->cap > ev->spare_cap) {
		free(ev->spare);
		ev->spare = s->b->buf;
		ev->spare_cap = s->b->cap;
		s->b->buf = NULL;
	}
	blob_unref(s->b);
	s->b = NULL;
	ev->head = (ev->head + 1) % ev->cap;
	ev->count--;
}

void kvp_events_free(struct kvp_events *ev)
{
	if (!ev)
		return;
	if (ev->pub)
		zmq_close(ev->pub);
	if (ev->replay)
		zmq_close(ev->replay);
	if (ev->zctx)
		zmq_ctx_term(ev->zctx);
	while (ev->ring && ev->count)
		ring_drop_oldest(ev);
	free(ev->ring);
	free(ev->spare);
	kvp_events_batch_free(&ev->batch);
	free(ev->topic);
	free(ev->source);
	free(ev);
}

static int snapshot_part(struct kvp_events *ev);

int kvp_events_page(struct kvp_events *ev, const struct kvp_events_page *pg)
{
	int r = kvp_events_batch_page(&ev->batch, pg);

	if (r < 0)
		ev->lost++;
	else if (ev->snap_to && ev->batch.n >= KVP_EVENTS_SNAPSHOT_BATCH)
		r = snapshot_part(ev);
	return r;
}

int kvp_events_cleared(struct kvp_events *ev)
{
	int r = kvp_events_batch_cleared(&ev->batch);

	if (r < 0)
		ev->lost++;
	return r;
}

uint32_t kvp_events_staged(const struct kvp_events *ev)
{
	return ev->batch.n;
}

size_t kvp_events_staged_bytes(const struct kvp_events *ev)
{
	return ev->batch.len;
}

/* Sends [topic, seq, payload] on sock (after the frames of `to`, a ROUTER peer's identity and
 * its empty delimiter, when given); the payload is blob's (a reference, no copy), or data's len
 * bytes (copied) when blob is NULL. 0 or -errno. */
static int send_msg(void *sock, const zmq_msg_t *to, const char *topic, size_t tlen,
		    const uint8_t seq[8], struct blob *blob, const uint8_t *data, size_t len)
{
	int f = ZMQ_DONTWAIT | ZMQ_SNDMORE;
	zmq_msg_t m;

	if (to) {
		zmq_msg_t id;

		zmq_msg_init(&id);
		zmq_msg_copy(&id, (zmq_msg_t *)to);
		if (zmq_msg_send(&id, sock, f) < 0) {
			zmq_msg_close(&id);
			return -zmq_errno();
		}
		if (zmq_send(sock, "", 0, f) < 0)
			return -zmq_errno();
	}
	if (zmq_send(sock, topic, tlen, f) < 0 || zmq_send(sock, seq, 8, f) < 0)
		return -zmq_errno();
	if (!blob)
		return zmq_send(sock, data, len, ZMQ_DONTWAIT) < 0 ? -zmq_errno() : 0;
	atomic_fetch_add_explicit(&blob->refs, 1, memory_order_relaxed);
	if (zmq_msg_init_data(&m, (void *)blob->data, blob->len, blob_msg_free, blob) < 0) {
		blob_unref(blob);
		return -zmq_errno();
	}
	if (zmq_msg_send(&m, sock, ZMQ_DONTWAIT) < 0) {
		int e = zmq_errno();

		zmq_msg_close(&m); /* drops the reference */
		return -e;
	}
	return 0;
}

/* A buffer of at least len bytes for a published batch: the ring's spare when it is large enough,
 * else a new one with room to spare (so that it serves later batches about its size). */
static uint8_t *blob_buf(struct kvp_events *ev, size_t len, size_t *cap)
{
	uint8_t *p;

	if (ev->spare && ev->spare_cap >= len) {
		p = ev->spare;
		*cap = ev->spare_cap;
		ev->spare = NULL;
		ev->spare_cap = 0;
		return p;
	}
	*cap = (len + len / 4 + 4095) & ~(size_t)4095;
	return malloc(*cap);
}

/* Copies n bytes to dst (from malloc: 16-byte aligned) with non-temporal stores where the machine
 * has them: a published batch is written once here and read later by libzmq's I/O thread or a
 * replay, so it need not go through the cache, nor push the loop's own state out of it (the
 * ring is buffer_bytes of batches: writing them through the cache costs the loop its misses). */
static void copy_stream(uint8_t *dst, const uint8_t *src, size_t n)
{
#if defined(__SSE2__)
	size_t i = 0;

	for (; i + 16 <= n; i += 16)
		_mm_stream_si128((__m128i *)(void *)(dst + i),
				 _mm_loadu_si128((const __m128i *)(const void *)(src + i)));
	_mm_sfence(); /* before the batch is handed to another thread */
	memcpy(dst + i, src + i, n - i);
#else
	memcpy(dst, src, n);
#endif
}

int kvp_events_flush(struct kvp_events *ev, double ts)
{
	const uint8_t *payload;
	uint8_t seq[8];
	size_t len = 0, cap = 0;
	uint32_t n = ev->batch.n;
	struct ring_slot *s;
	struct blob *b;

	if (!n) {
		if (ev->lost) {
			ev->st.dropped_batches++; /* events lost to memory: a batch never formed */
			ev->lost = 0;
		}
		return 0;
	}
	payload = kvp_events_batch_payload(&ev->batch, ts, &len);
	/* the ring's room first: the oldest batch's buffer may take this one */
	while (payload && ev->count &&
	       (ev->count == ev->cap || ev->ring_bytes + len > ev->max_bytes))
		ring_drop_oldest(ev);
	b = payload ? malloc(sizeof(*b)) : NULL;
	if (!b || !(b->buf = blob_buf(ev, len, &cap))) {
		free(b);
		kvp_events_batch_reset(&ev->batch);
		ev->st.dropped_batches++;
		ev->lost = 0;
		return -ENOMEM;
	}
	copy_stream(b->buf, payload, len);
	kvp_events_batch_reset(&ev->batch); /* its buffer stages the next batch */
	atomic_init(&b->refs, 1);	    /* the ring's */
	b->cap = cap;
	b->data = b->buf;
	b->len = len;
	if (ev->lost)
		ev->st.dropped_batches++; /* a partial batch: counted as a drop too */
	ev->lost = 0;
	be64(ev->st.next_seq, seq);
	if (send_msg(ev->pub, NULL, ev->topic, ev->topic_len, seq, b, NULL, 0) < 0)
		ev->st.dropped_batches++;
	ev->st.batches++;
	ev->st.events += n;
	s = &ev->ring[(ev->head + ev->count) % ev->cap];
	s->seq = ev->st.next_seq;
	s->b = b;
	ev->count++;
	ev->ring_bytes += len;
	ev->st.next_seq++;
	return (int)n;
}

static const uint8_t g_end_seq[8] = { 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff };

/* A snapshot's staged events, as one batch to its requester, carrying the sequence of the last
 * published batch; the staging batch is left empty. A failed send ends the snapshot (snap_err):
 * its later batches are not sent. 0 or a negative errno. */
static int snapshot_part(struct kvp_events *ev)
{
	const uint8_t *data;
	uint8_t seq[8];
	size_t len = 0;
	int r;

	if (ev->snap_err) {
		r = ev->snap_err;
	} else if (!(data = kvp_events_batch_payload(&ev->batch, ev->snap_ts, &len))) {
		r = -ENOMEM;
	} else { /* made in place in the staging batch: zmq_send copies it */
		be64(ev->st.next_seq ? ev->st.next_seq - 1 : 0, seq);
		r = send_msg(ev->replay, ev->snap_to, ev->topic, ev->topic_len, seq, NULL, data,
			     len);
	}
	kvp_events_batch_reset(&ev->batch);
	if (r < 0 && !ev->snap_err)
		ev->snap_err = r;
	return r < 0 ? r : 0;
}

/* One snapshot: what the node holds, as batches of at most KVP_EVENTS_SNAPSHOT_BATCH events to
 * the requester, AllBlocksCleared first, each with the sequence of the last published batch (the
 * subscriber goes on from the one after it), stamped ts. */
static int serve_snapshot(struct kvp_events *ev, const zmq_msg_t *id, kvp_events_snapshot_fn fn,
			  void *ctx, double ts)
{
	struct kvp_events_batch turn;
	int r;

	if (ev->batch.n)
		kvp_events_flush(ev, ts); /* the snapshot holds what they say */
	turn = ev->batch;		  /* kvp_events_page stages into the snapshot */
	ev->batch = (struct kvp_events_batch){ .source = ev->source };
	ev->snap_to = id;
	ev->snap_ts = ts;
	ev->snap_err = 0;
	if ((r = kvp_events_batch_cleared(&ev->batch)) >= 0 && (!fn || (r = fn(ctx, ev)) >= 0) &&
	    ev->batch.n)
		r = snapshot_part(ev);
	if (r >= 0 && ev->snap_err)
		r = ev->snap_err;
	ev->snap_to = NULL;
	kvp_events_batch_free(&ev->batch);
	ev->batch = turn;
	ev->st.snapshots++;
	return r;
}

int kvp_events_serve(struct kvp_events *ev, kvp_events_snapshot_fn fn, void *ctx, double ts)
{
	int answered = 0;

	if (!ev->replay)
		return 0;
	for (;;) {
		zmq_msg_t part[3];
		int np = 0, more = 1;

		/* [identity, "", request] from a REQ; [identity, request] from a DEALER */
		while (more) {
			zmq_msg_t m;
			size_t ml = sizeof(more);

			zmq_msg_init(&m);
			if (zmq_msg_recv(&m, ev->replay, ZMQ_DONTWAIT) < 0) {
				zmq_msg_close(&m);
				for (int i = 0; i < np; i++)
					zmq_msg_close(&part[i]);
				return zmq_errno() == EAGAIN ? answered : -zmq_errno();
			}
			zmq_getsockopt(ev->replay, ZMQ_RCVMORE, &more, &ml);
			if (np < 3)
				part[np++] = m;
			else
				zmq_msg_close(&m);
		}
		if (np == 3 && zmq_msg_size(&part[2]) == 8) {
			const uint8_t *req = zmq_msg_data(&part[2]);

			if (memcmp(req, SNAPSHOT_REQUEST, 8) == 0) {
				serve_snapshot(ev, &part[0], fn, ctx, ts);
			} else {
				uint64_t start = from_be64(req);

				for (uint32_t i = 0; i < ev->count; i++) {
					const struct ring_slot *s =
						&ev->ring[(ev->head + i) % ev->cap];
					uint8_t seq[8];

					if (s->seq < start)
						continue;
					be64(s->seq, seq);
					if (send_msg(ev->replay, &part[0], ev->topic, ev->topic_len,
						     seq, s->b, NULL, 0) < 0)
						break;
				}
				ev->st.replays++;
			}
			send_msg(ev->replay, &part[0], "", 0, g_end_seq, NULL, (const uint8_t *)"",
				 0);
			answered++;
		}
		for (int i = 0; i < np; i++)
			zmq_msg_close(&part[i]);
	}
}

int kvp_events_replay_fd(const struct kvp_events *ev)
{
	int fd = -1;
	size_t len = sizeof(fd);

	if (!ev->replay || zmq_getsockopt(ev->replay, ZMQ_FD, &fd, &len) < 0)
		return -1;
	return fd;
}

void kvp_events_stats(const struct kvp_events *ev, struct kvp_events_stats *st)
{
	*st = ev->st;
	st->ring_batches = ev->count;
	st->ring_bytes = ev->ring_bytes;
}
