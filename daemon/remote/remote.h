/* remote.h - the remote tier's driver: one I/O thread owns the cluster client (struct kvp_rc,
 * remote_cluster.h), its sockets, their system calls, the values' headers and checksums; the
 * io_uring loop sees one pollable fd.
 *
 * The loop submits with kvp_remote_put_page / _get_page / _del / _exists_many (and _set, a raw
 * value, which tests use to plant corrupt ones): each copies what it needs (key, value) into a
 * queue entry and returns, never waiting (-EAGAIN past the in-flight bounds: the caller drops
 * and counts). kvp_remote_sync(), once per loop turn, wakes the thread when something was
 * queued. The thread runs the cluster client (poll on its sockets, its deadlines, a wake-up
 * eventfd) and queues each completion, with a fetched page (read into a buffer of the
 * driver's, its header and checksums verified there); the loop's fd turns readable and
 * kvp_remote_on_ready() runs the callbacks there, on the loop's own thread, so they touch pools
 * and deferred replies directly. Nothing of the loop waits on the thread but two short mutex
 * sections (the queues, the figures). */
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "remote_cluster.h"
#include "remote_value.h"
#include "stats.h"

struct kvp_remote;

/* Completion of kvp_remote_get_page(): st as a GET's (remote_cluster.h). On a HIT, err is 0 and
 * page / n are the verified payload (valid only during the call), or err is the value's
 * refusal (-KVP_RV_E*: not a page of this geometry, or corrupt) and page is NULL. */
typedef void kvp_remote_page_cb(void *arg, enum kvp_rc_status st, int err, const void *page,
				size_t n);

/* A driver for the cluster of conf (which must be enabled), its thread started; NULL with errno
 * set (EINVAL: bad seeds, no secret or one shorter than KVP_RV_SECRET_MIN; the errno of reading
 * the secret or the password (kvp_remote_cred_read), the reason written to stderr; ENOMEM; or
 * the errno of epoll_create1 / timerfd_create / eventfd / pthread_create). The secret keys
 * the values' MACs (remote_value.h); the password, with conf->user, AUTHs every connection. */
struct kvp_remote *kvp_remote_new(const struct kvp_remote_conf *conf);
/* Reads a secret from src ("file:PATH", or "credential:NAME": $CREDENTIALS_DIRECTORY/NAME)
 * into out (cap bytes), one trailing line end dropped; its length into *len. 0, or -ENOENT
 * (no such file, no $CREDENTIALS_DIRECTORY), -EPERM (a file every user may read or write),
 * -EINVAL (not a regular file, a bad src), -EFBIG (cap bytes or more), another -errno of
 * open / read. */
int kvp_remote_cred_read(const char *src, void *out, size_t cap, size_t *len);
/* Stops the thread; everything in flight or queued completes with KVP_RC_ECLOSED, its callback
 * run in here. Accepts NULL. */
void kvp_remote_free(struct kvp_remote *r);

/* The fd to poll for POLLIN: readable when completions wait or the alarm fired. */
int kvp_remote_fd(const struct kvp_remote *r);
/* Runs the completions that wait (their callbacks), in the order the thread finished them;
 * SET completions come in batches, at most 5 ms late. Then kvp_remote_sync(). */
void kvp_remote_on_ready(struct kvp_remote *r);
/* Wakes the thread (an eventfd write) for what was queued: anything but SETs at once, SETs once
 * 1 MiB of them wait or 20 ms after the first (the fd's timer wakes the owner for that), so
 * that spills of small pages, one Alloc at a time, leave in batches. Cheap when nothing is
 * due. The loop calls it after its turn's replies were submitted. */
void kvp_remote_sync(struct kvp_remote *r);
/* Whether kvp_remote_sync() would wake the thread now. */
int kvp_remote_pending(const struct kvp_remote *r);
/* An extra wake-up at at_ms on kvp_rc_now_ms() (-1: none), for deadlines of the owner's own
 * (a Match waiting for its existence query): kvp_remote_on_ready() runs then. */
void kvp_remote_set_alarm(struct kvp_remote *r, int64_t at_ms);
const struct kvp_remote_conf *kvp_remote_conf(const struct kvp_remote *r);
/* The figures now (the thread's as of its last turn, the queues' as of now). */
void kvp_remote_stats_read(const struct kvp_remote *r, struct kvp_remote_stats *out);
/* Whether the client had a slot map with every slot's master connected, at the thread's last
 * turn. */
int kvp_remote_ready(const struct kvp_remote *r);

/* Submissions, as kvp_rc_set / kvp_rc_get / kvp_rc_del / kvp_rc_exists_many (remote_cluster.h):
 * 0 (cb runs exactly once, inside kvp_remote_on_ready or kvp_remote_free), -EAGAIN past the
 * in-flight bounds (max_inflight_bytes of the conf, 4096 operations), -EINVAL for an empty key,
 * -ENOMEM; nothing submitted on failure. Keys and values are copied. A page passed to cb is
 * valid only during the call. */
int kvp_remote_set(struct kvp_remote *r, const void *key, size_t klen, const void *hdr, size_t hlen,
		   const void *val, size_t vlen, uint32_t ttl_s, kvp_rc_cb *cb, void *arg);
/* SET of a page value: page[0 .. n) is copied and its CRC32C taken in the same pass; the thread
 * puts the value header for fp (remote_value.h) in front of it. */
int kvp_remote_put_page(struct kvp_remote *r, const struct kvp_rv_fp *fp, const void *key,
			size_t klen, const void *page, size_t n, uint32_t ttl_s, kvp_rc_cb *cb,
			void *arg);
/* GET of a page value: the thread checks its header against fp and page_bytes (0: any size)
 * and its checksums (kvp_rv_decode), so the loop gets verified page bytes or a refusal. */
int kvp_remote_get_page(struct kvp_remote *r, const struct kvp_rv_fp *fp, uint64_t page_bytes,
			const void *key, size_t klen, kvp_remote_page_cb *cb, void *arg);
int kvp_remote_del(struct kvp_remote *r, const void *key, size_t klen, kvp_rc_cb *cb, void *arg);
int kvp_remote_exists_many(struct kvp_remote *r, size_t n, const void *const *keys,
			   const size_t *klens, kvp_rc_multi_cb *cb, void *arg);
