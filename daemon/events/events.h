/* events.h - kvpoold's KV event publisher: what the node's page tiers hold, as vLLM's
 * KVEventBatch (vllm/distributed/kv_events.py) over ZeroMQ, the format cache-aware routers read.
 *
 * Pages stored in and removed from a tier are staged (kvp_events_page) during a loop turn and
 * published as one batch at its end (kvp_events_flush): a PUB multipart [topic, seq (8 bytes,
 * big-endian), payload (msgpack of [ts, [event, ...], null])], never blocking: a batch a
 * subscriber has no room for (its high-water mark reached) is not sent and counted as dropped,
 * but stays in the replay ring. The ROUTER replay socket answers a request of 8 bytes, a
 * big-endian start sequence, with every batch of the ring from there on, then the end marker
 * [b"", -1 (8 bytes), b""], as vLLM's ZmqEventPublisher does; a request of the 8 bytes
 * "SNAPSHOT" is answered with AllBlocksCleared then a BlockStored of every page held, in batches
 * of at most KVP_EVENTS_SNAPSHOT_BATCH events (AllBlocksCleared first in the first), each
 * carrying the sequence of the last published batch, then the end marker.
 * Single-threaded: the event loop owns it. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The most events of one batch of a snapshot's answer: a large node's snapshot is split, so that
 * no message (nor a subscriber's decoding of it) grows with the node's size. */
#define KVP_EVENTS_SNAPSHOT_BATCH 1024

/* The tier a page event names, as its `medium` string: "GPU" (the device tier), "CPU" (the host
 * tier), "STORAGE" (a disk tier), "REMOTE" (the remote tier). */
enum kvp_events_medium {
	KVP_EVENTS_GPU = 0,
	KVP_EVENTS_CPU,
	KVP_EVENTS_STORAGE,
	KVP_EVENTS_REMOTE,
	KVP_EVENTS_MEDIUM_MAX,
};

/* The medium's string ("GPU", ...), "?" out of range. */
const char *kvp_events_medium_name(enum kvp_events_medium m);

struct kvp_events_conf {
	const char *endpoint;	     /* PUB: bound (tcp://HOST:PORT, ipc://, inproc://) */
	const char *replay_endpoint; /* ROUTER, bound; NULL or "": no replay */
	const char *topic;	     /* the first frame of every message ("" allowed) */
	const char *source;	     /* the `ownership` field of page events: names the node */
	uint32_t buffer_steps;	     /* batches the replay ring keeps (>= 1) */
	uint64_t buffer_bytes;	     /* and at most this many payload bytes */
	uint32_t hwm;		     /* the PUB socket's send high-water mark, in batches */
};

/* One page event: a page stored in or removed from a tier. key: its block hash (the engine's
 * key of a key call's page, a token page's kvp_page_key); parent: the parent page's, plen 0
 * for a chain's first page (stores only); tokens: a token page's ids (stores only, ntokens 0
 * for a key call's page); block_size: tokens per page. */
struct kvp_events_page {
	bool stored;
	enum kvp_events_medium medium;
	const uint8_t *key;
	size_t klen;
	const uint8_t *parent;
	size_t plen;
	const uint32_t *tokens;
	uint32_t ntokens;
	uint32_t block_size;
};

struct kvp_events_stats {
	uint64_t batches;	  /* published (sent or dropped) */
	uint64_t events;	  /* in them */
	uint64_t dropped_batches; /* not sent: a subscriber's high-water mark, or a send error */
	uint64_t replays;	  /* replay requests answered */
	uint64_t snapshots;	  /* snapshot requests answered */
	uint64_t ring_batches;	  /* in the replay ring now */
	uint64_t ring_bytes;	  /* their payload bytes */
	uint64_t next_seq;	  /* the sequence the next batch gets */
};

struct kvp_events;
/* Binds the sockets. NULL on failure, with why in err (errlen bytes). */
struct kvp_events *kvp_events_new(const struct kvp_events_conf *conf, char *err, size_t errlen);
/* Accepts NULL. Staged events are dropped. */
void kvp_events_free(struct kvp_events *ev);

/* Stages one page event into the turn's batch. Also what a tier outside the page index (disk,
 * remote) calls. Returns 0, -ENOMEM (the event is lost and counted with the batch as dropped). */
int kvp_events_page(struct kvp_events *ev, const struct kvp_events_page *pg);
/* Stages AllBlocksCleared: every page of the node is gone (kvpoold's start). */
int kvp_events_cleared(struct kvp_events *ev);
/* Events staged and not yet published, and their encoded bytes. */
uint32_t kvp_events_staged(const struct kvp_events *ev);
size_t kvp_events_staged_bytes(const struct kvp_events *ev);
/* Publishes the staged events as one batch stamped ts (seconds since the epoch); nothing when
 * none are staged. Returns the events published (0: none staged) or a negative errno (the batch
 * could not be encoded: it is lost, its sequence unused). */
int kvp_events_flush(struct kvp_events *ev, double ts);

/* Stages one BlockStored for every page held (kvp_events_page) and returns 0 or a negative
 * errno. */
typedef int (*kvp_events_snapshot_fn)(void *ctx, struct kvp_events *ev);
/* Answers the replay requests waiting, without blocking; a snapshot request first publishes the
 * staged events (stamped ts), then calls fn: the snapshot is the state as of the last published
 * sequence. Returns the requests answered, or a negative errno. */
int kvp_events_serve(struct kvp_events *ev, kvp_events_snapshot_fn fn, void *ctx, double ts);

void kvp_events_stats(const struct kvp_events *ev, struct kvp_events_stats *st);
/* The replay socket's ZMQ_FD: readable when kvp_events_serve has something to do (poll it, then
 * serve until it says nothing is left, as libzmq asks). -1 without a replay endpoint. */
int kvp_events_replay_fd(const struct kvp_events *ev);

/* ---- the encoder (events_encode.c), for tests ---- */

/* A KVEventBatch under construction: its n events' msgpack bytes (len) in body, after
 * KVP_EVENTS_BATCH_HEAD bytes kept for the batch's header (kvp_events_batch_payload); cap: body's
 * size. */
#define KVP_EVENTS_BATCH_HEAD 15 /* [ts, [: array 3, float 64, array 32 headers */
struct kvp_events_batch {
	uint8_t *body;
	size_t len, cap;
	uint32_t n;
	const char *source; /* ownership of page events; NULL: none */
};
/* Appends one event. 0, -EINVAL (a medium out of range) or -ENOMEM (the batch unchanged). */
int kvp_events_batch_page(struct kvp_events_batch *b, const struct kvp_events_page *pg);
int kvp_events_batch_cleared(struct kvp_events_batch *b);
/* The payload: msgpack of [ts, [events], null] into a malloc'd buffer (*out, *outlen). 0 or
 * -ENOMEM. The batch is left as it was. */
int kvp_events_batch_encode(const struct kvp_events_batch *b, double ts, uint8_t **out,
			    size_t *outlen);
/* The payload made in place, without copying the events: the header written before them, the
 * closing nil after; its *len bytes at the pointer returned, valid until the batch changes (the
 * batch's events stay as they were). NULL without memory. */
const uint8_t *kvp_events_batch_payload(struct kvp_events_batch *b, double ts, size_t *len);
/* Empties the batch (keeps its buffer). */
void kvp_events_batch_reset(struct kvp_events_batch *b);
void kvp_events_batch_free(struct kvp_events_batch *b);
