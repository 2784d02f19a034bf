/* remote_cluster.h - an asynchronous Redis Cluster client over hiredis: key slots (CRC16 with
 * {hash tags}), the slot map from CLUSTER SLOTS, MOVED and ASK redirects, reconnects with
 * backoff, per-node timeouts, bounded in-flight commands and bytes.
 *
 * A node is not trusted: each reply is checked as it is read against what its command can
 * answer (its type, a string's length, an array's elements and depth, an integer's range,
 * CLUSTER SLOTS's shape); one that does not fit closes that node's connection, its commands
 * fail with KVP_RC_EPROTOCOL and it is counted (bad_replies). A MOVED or ASK is followed only
 * to a master of the slot map; to another address the map is asked for again first, and the
 * operation fails with KVP_RC_EREDIRECTS (counted in bad_redirects) when the new map does not
 * name it either. The node table holds the seeds and the masters of the last map, no more.
 *
 * Nothing here blocks and nothing owns a thread or an event loop. The owner drives it:
 *   n = kvp_rc_fds(rc, pfds, max);       fds to watch and their events (POLLIN / POLLOUT)
 *   kvp_rc_on_ready(rc, fd, revents);     when one of them is ready
 *   kvp_rc_next_timeout_ms(rc);           how long it may wait at most (-1: no deadline)
 *   kvp_rc_tick(rc, kvp_rc_now_ms());     when that time has come (cheap; also fine to call
 *                                         on every loop turn)
 * The fd set and each fd's events change after any call; an io_uring owner re-reads
 * kvp_rc_fds() after each call (or when kvp_rc_fds_gen() changed) and re-arms one-shot polls.
 * Completion callbacks run only inside kvp_rc_on_ready() and kvp_rc_tick() (and kvp_rc_free()),
 * never inside the call that submits an operation. One thread at a time. */
#pragma once
#include <poll.h>
#include <stddef.h>
#include <stdint.h>

#define KVP_RC_SLOTS 16384
#define KVP_RC_NODES_MAX 64
#define KVP_RC_BUF_MIN (64u << 10) /* GET values from this size on land in buf_get's buffers */

struct kvp_rc_config {
	const char *seeds;	     /* "host:port,host:port" (at least one) */
	uint32_t connect_timeout_ms; /* 0: 1000 */
	uint32_t op_timeout_ms;	 /* a node whose oldest command waits longer is dropped; 0: 1000 */
	uint32_t backoff_min_ms; /* first reconnect delay, doubled per failure; 0: 50 */
	uint32_t backoff_max_ms; /* 0: 2000 */
	uint32_t refresh_ms;	 /* slot map refresh period; 0: 10000 */
	uint32_t max_redirects;	 /* per operation; 0: 5 */
	uint32_t max_inflight_cmds;  /* operations submitted and not completed; 0: 4096 */
	uint64_t max_inflight_bytes; /* their key and value bytes; 0: 256 MiB */
	uint64_t max_value; /* the longest value kvp_rc_get takes; 0: 64 MiB (kvp_rc_get_max) */
	/* Optional: where a GET's value of at least KVP_RC_BUF_MIN bytes is read to (len bytes;
	 * NULL: malloc'd here), and how such a buffer goes back. The GET's callback may keep it
	 * (kvp_rc_take_value) instead of copying the value. Called on the client's thread. */
	void *(*buf_get)(void *ctx, size_t len);
	void (*buf_put)(void *ctx, void *buf);
	void *buf_ctx;
	/* AUTH on every connection before anything else: the ACL user (NULL: the default user)
	 * and its password (NULL: no AUTH). Both copied. A refused AUTH closes the connection
	 * (counted in auth_failures); it is made again after the backoff. */
	const char *user;
	const char *password;
};

/* How an operation ended. */
enum kvp_rc_status {
	KVP_RC_OK = 0,	   /* SET stored, DEL done */
	KVP_RC_HIT,	   /* GET found the value, EXISTS found the key */
	KVP_RC_MISS,	   /* no such key */
	KVP_RC_ETIMEOUT,   /* the node did not answer within op_timeout_ms */
	KVP_RC_ENODE_DOWN, /* the slot's master is not connected (failing fast) */
	KVP_RC_ENO_MASTER, /* no master for the slot in the map (or the cluster says so) */
	KVP_RC_EREDIRECTS, /* more than max_redirects MOVED/ASK answers */
	KVP_RC_EPROTOCOL,  /* an unexpected answer */
	KVP_RC_ECLOSED,	   /* kvp_rc_free() while it was in flight */
	KVP_RC_STATUS_MAX,
};

/* Counters (monotonic). */
struct kvp_rc_stats {
	uint64_t status[KVP_RC_STATUS_MAX]; /* operations completed, by status */
	uint64_t moved, ask;		    /* redirects followed */
	uint64_t refreshes;		    /* slot maps loaded */
	uint64_t map_changes;		    /* of them, those that differ from the map before */
	uint64_t refresh_timeouts;	    /* CLUSTER SLOTS not answered within op_timeout_ms */
	uint64_t connects, disconnects;	    /* node connections made / lost (or dropped) */
	uint64_t rejected;		    /* submissions refused for the in-flight bounds */
	uint64_t sent_bytes, recv_bytes;    /* value bytes of SET / of GET hits */
	uint64_t bad_replies;		    /* replies refused (the node's connection closed) */
	uint64_t bad_redirects;		    /* MOVED / ASK to a node the slot map does not name */
	uint64_t auth_failures;		    /* AUTH refused (connection closed) */
};

struct kvp_rc;

/* Completion of one operation. val / len: the value of a GET hit, valid only during the call
 * (NULL / 0 otherwise). */
typedef void kvp_rc_cb(void *arg, enum kvp_rc_status st, const void *val, size_t len);
/* Completion of kvp_rc_exists_many(): st[i] for keys[i] (HIT, MISS or an error), valid only
 * during the call. */
typedef void kvp_rc_multi_cb(void *arg, size_t n, const enum kvp_rc_status *st);

/* Returns a client that starts connecting to the seeds (the slot map loads once one answers),
 * NULL on a bad seed list or ENOMEM. The config is copied. */
struct kvp_rc *kvp_rc_new(const struct kvp_rc_config *cfg);
/* Completes everything in flight with KVP_RC_ECLOSED, closes every connection. Accepts NULL. */
void kvp_rc_free(struct kvp_rc *rc);

/* The cluster slot of a key: CRC16-XMODEM of the key, or of the text inside its first
 * non-empty {...}, modulo 16384. */
unsigned kvp_rc_slot(const void *key, size_t len);
/* CRC16-XMODEM (poly 0x1021, init 0): crc16("123456789") == 0x31c3. */
uint16_t kvp_rc_crc16(const void *p, size_t n);

/* Submissions. Each returns 0 (cb will be called exactly once), -EAGAIN when the in-flight
 * bounds are reached (nothing submitted, cb never called), -EINVAL for an empty key,
 * -ENOMEM. Keys are copied. */
/* SET key hdr+val EX ttl_s (no EX when 0): the value is hlen bytes of hdr followed by vlen of
 * val (either may be 0), both copied at submission. */
int kvp_rc_set(struct kvp_rc *rc, const void *key, size_t klen, const void *hdr, size_t hlen,
	       const void *val, size_t vlen, uint32_t ttl_s, kvp_rc_cb *cb, void *arg);
/* The same, but val is not copied: it is written to the socket from where it is (writev), so it
 * must stay valid and unchanged until cb runs. hdr is copied. Follows redirects. */
int kvp_rc_set_ref(struct kvp_rc *rc, const void *key, size_t klen, const void *hdr, size_t hlen,
		   const void *val, size_t vlen, uint32_t ttl_s, kvp_rc_cb *cb, void *arg);
int kvp_rc_get(struct kvp_rc *rc, const void *key, size_t klen, kvp_rc_cb *cb, void *arg);
/* The same, for a value of at most max_len bytes (0: the config's max_value): a longer one is
 * refused as it is announced, before it is read (KVP_RC_EPROTOCOL, the connection closed and
 * the refusal counted in bad_replies). */
int kvp_rc_get_max(struct kvp_rc *rc, const void *key, size_t klen, uint64_t max_len, kvp_rc_cb *cb,
		   void *arg);
/* Inside a GET hit's callback: the value's buffer, now the caller's (to give back through the
 * config's buf_put), when it is one of buf_get's; NULL otherwise (the value stays valid only
 * during the call). */
void *kvp_rc_take_value(struct kvp_rc *rc);
/* DEL: OK when it removed the key, MISS when there was none. */
int kvp_rc_del(struct kvp_rc *rc, const void *key, size_t klen, kvp_rc_cb *cb, void *arg);
/* EXISTS of n keys, pipelined per node (one command per key: keys of different slots cannot
 * share one); one callback when all n answered. All or nothing against the bounds. */
int kvp_rc_exists_many(struct kvp_rc *rc, size_t n, const void *const *keys, const size_t *klens,
		       kvp_rc_multi_cb *cb, void *arg);

/* Driving (see the top of this file). kvp_rc_fds writes up to max entries and returns how many
 * fds there are (which may exceed max). */
int kvp_rc_fds(struct kvp_rc *rc, struct pollfd *pfds, int max);
/* Bumped whenever the fd set or an fd's events change. */
uint64_t kvp_rc_fds_gen(const struct kvp_rc *rc);
void kvp_rc_on_ready(struct kvp_rc *rc, int fd, short revents);
/* Milliseconds until kvp_rc_tick() has work (0: now), -1 when nothing is timed. */
int kvp_rc_next_timeout_ms(const struct kvp_rc *rc);
/* Fails timed-out nodes, reconnects, refreshes the slot map, runs deferred completions. */
void kvp_rc_tick(struct kvp_rc *rc, uint64_t now_ms);
/* CLOCK_MONOTONIC in milliseconds (the clock every deadline here is on). */
uint64_t kvp_rc_now_ms(void);

/* Whether a slot map is loaded and every slot has a connected master. */
int kvp_rc_ready(const struct kvp_rc *rc);
/* Operations submitted and not yet completed, and their bytes. */
uint32_t kvp_rc_inflight(const struct kvp_rc *rc, uint64_t *bytes);
const struct kvp_rc_stats *kvp_rc_stats(const struct kvp_rc *rc);
const char *kvp_rc_strstatus(enum kvp_rc_status st);
