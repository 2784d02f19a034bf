/* loop_events.c - feeds the publisher (events/) from the pools' page indexes: each pool with
 * events = on gets an observer (kvp_index_set_observer) that stages its pages' stores and
 * removals with the tier as medium ("GPU" for the device tier, "CPU" for the host tier) and the
 * pool's page_tokens as block size; pages stored on or gone from a pool's disk tier
 * (kvp_dt_set_observer) are staged with medium "STORAGE", their key and no tokens or parent;
 * pages the remote tier wrote to the cluster or found gone from it (kvp_rt_set_observer) with
 * medium "REMOTE", the same way; snapshots walk every hooked pool's index and disk (the cluster's
 * pages are not listed: kvpoold keeps no record of them). A batch is published once
 * its first event is batch_us old, by the turn that finds it so or by a timeout on the ring;
 * replay requests are served when a poll of the replay socket's ZMQ_FD completes. */
#include "loop_events.h"

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "daemon.h"
#include "disk_tier.h"
#include "kvp_config.h"
#include "log.h"
#include "loop_server.h"
#include "remote_tier.h"

#if KVP_HAVE_EVENTS
#include "events.h"

/* A hooked pool: the observer's context. */
struct hooked {
	struct kvpd_pool *p;
	uint32_t id;
	struct kvp_events *ev;
	uint32_t block_size;
};

struct kvp_loop_events {
	struct kvp_daemon *d;
	struct kvp_events *ev;
	struct hooked pools[KVP_MAX_POOLS];
	uint32_t n;
	bool warned_encode;
	uint64_t batch_ns; /* [events] batch_us */
	uint64_t first_ns; /* when the loop first saw the staged events (0: none staged) */
	bool timer_armed;  /* a timeout for them is on the ring */
	struct kvp_src timer_src;
	struct __kernel_timespec ts;
	int replay_fd;	   /* the replay socket's ZMQ_FD, -1: none */
	bool replay_armed; /* a poll of it is on the ring */
	bool replay_due;   /* it fired: serve this turn */
	struct kvp_src replay_src;
};

#define BATCH_BYTES_MAX (256u << 10) /* staged bytes published at once, whatever their age */

static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static double wall_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void observed(void *ctx, const struct kvp_index_event *e)
{
	const struct hooked *h = ctx;
	struct kvp_events_page pg = {
		.stored = e->change == KVP_INDEX_STORED,
		.medium = e->tier == KVP_TIER_ID_DEVICE ? KVP_EVENTS_GPU : KVP_EVENTS_CPU,
		.key = e->key.data,
		.klen = e->key.len,
		.parent = e->parent.data,
		.plen = e->parent.len,
		.tokens = e->tokens,
		.ntokens = e->ntokens,
		.block_size = h->block_size,
	};

	kvp_events_page(h->ev, &pg);
}

/* A page of a tier outside the page index stored or gone: staged when its pool is hooked, with
 * its key and no tokens or parent. */
static void tier_observed(struct kvp_loop_events *le, const struct kvpd_pool *p,
			  enum kvp_events_medium medium, const uint8_t *key, size_t klen,
			  bool stored)
{
	for (uint32_t j = 0; j < le->n; j++) {
		struct kvp_events_page pg = {
			.stored = stored,
			.medium = medium,
			.key = key,
			.klen = klen,
			.block_size = le->pools[j].block_size,
		};

		if (le->pools[j].p != p)
			continue;
		kvp_events_page(le->ev, &pg);
		return;
	}
}

/* A page stored on or gone from a pool's disk tier. */
static void disk_observed(void *ctx, const struct kvpd_pool *p, uint64_t ns, int keyed,
			  const uint8_t *key, size_t klen, bool stored)
{
	(void)ns, (void)keyed;
	tier_observed(ctx, p, KVP_EVENTS_STORAGE, key, klen, stored);
}

/* A page the remote tier wrote to the cluster, or found gone from it. */
static void remote_observed(void *ctx, const struct kvpd_pool *p, const uint8_t *key, size_t klen,
			    bool stored)
{
	tier_observed(ctx, p, KVP_EVENTS_REMOTE, key, klen, stored);
}

/* Every page a hooked pool holds, in its index and on its disk, staged as stored. */
static void observe_all(const struct kvp_loop_events *le, const struct hooked *h)
{
	kvp_index_observe_all(h->p->ix);
	kvp_dt_observe_all(le->d->dt, h->p);
}

static bool live(const struct kvp_daemon *d, const struct hooked *h)
{
	for (uint32_t i = 0; i < d->n_pools; i++)
		if (d->pools[i] == h->p && d->pools[i]->id == h->id)
			return true;
	return false;
}

/* Hooks the pools not hooked yet (a reload's) and forgets the ones gone; a new pool's pages
 * (none, or a restart's) are staged as stored. A pool gone (a reload removed it) took its pages
 * with it unseen: the stream starts over, AllBlocksCleared then every page of the others. */
static void hook_pools(struct kvp_daemon *d, struct kvp_loop_events *le)
{
	bool gone = false;

	for (uint32_t j = 0; j < le->n;) {
		if (live(d, &le->pools[j])) {
			j++;
			continue;
		}
		le->pools[j] = le->pools[--le->n];
		gone = true;
	}
	if (gone) {
		kvp_events_cleared(le->ev);
		for (uint32_t j = 0; j < le->n; j++) {
			kvp_index_set_observer(le->pools[j].p->ix, observed, &le->pools[j]);
			observe_all(le, &le->pools[j]);
		}
	}
	for (uint32_t i = 0; i < d->n_pools; i++) {
		struct kvpd_pool *p = d->pools[i];
		bool have = false;

		for (uint32_t j = 0; j < le->n && !have; j++)
			have = le->pools[j].p == p && le->pools[j].id == p->id;
		if (have || !p->conf.events || le->n == KVP_MAX_POOLS)
			continue;
		le->pools[le->n] = (struct hooked){ p, p->id, le->ev, p->conf.page_tokens };
		kvp_index_set_observer(p->ix, observed, &le->pools[le->n]);
		le->n++; /* before its pages: the disk's observer looks the pool up */
		observe_all(le, &le->pools[le->n - 1]);
	}
	/* the moves of the removal above changed where each record lives */
	for (uint32_t j = 0; j < le->n; j++)
		kvp_index_set_observer(le->pools[j].p->ix, observed, &le->pools[j]);
}

static int snapshot(void *ctx, struct kvp_events *ev)
{
	struct kvp_loop_events *le = ctx;

	(void)ev;
	for (uint32_t j = 0; j < le->n; j++)
		observe_all(le, &le->pools[j]);
	return 0;
}

static void publish(struct kvp_loop_events *le);
static void timer_fired(void *loop, struct kvp_src *src, const struct io_uring_cqe *cqe);
static void replay_ready(void *loop, struct kvp_src *src, const struct io_uring_cqe *cqe);

int kvp_loop_events_start(struct kvp_daemon *d, char *err, size_t errlen)
{
	const struct kvp_conf_events *c = &d->conf.events;
	char host[64] = "", source[KVP_EVENTS_NAME_MAX];
	struct kvp_events_conf ec;
	struct kvp_loop_events *le;

	if (!c->enabled)
		return 0;
	if (c->source[0]) {
		snprintf(source, sizeof(source), "%s", c->source);
	} else {
		gethostname(host, sizeof(host) - 1);
		snprintf(source, sizeof(source), "kvpool@%s", host[0] ? host : "localhost");
	}
	ec = (struct kvp_events_conf){
		.endpoint = c->endpoint,
		.replay_endpoint = c->replay_endpoint,
		.topic = c->topic,
		.source = source,
		.buffer_steps = c->buffer_steps,
		.buffer_bytes = c->buffer_bytes,
		.hwm = c->hwm,
	};
	le = calloc(1, sizeof(*le));
	if (!le) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	le->ev = kvp_events_new(&ec, err, errlen);
	if (!le->ev) {
		free(le);
		return -1;
	}
	le->batch_ns = (uint64_t)c->batch_us * 1000u;
	kvp_src_init(&le->timer_src, KVP_SRC_EVENTS, timer_fired, le);
	kvp_src_init(&le->replay_src, KVP_SRC_EVENTS, replay_ready, le);
	le->replay_fd = kvp_events_replay_fd(le->ev);
	le->replay_due = true;
	le->d = d;
	d->events = le;
	kvp_dt_set_observer(d->dt, disk_observed, le);
	kvp_rt_set_observer(d, remote_observed, le);
	kvp_events_cleared(le->ev);
	hook_pools(d, le);
	publish(le); /* sequence 0, in the ring before any subscriber can ask for it */
	return 0;
}

static void publish(struct kvp_loop_events *le)
{
	if (kvp_events_flush(le->ev, wall_now()) < 0 && !le->warned_encode) {
		log_warn("events: a batch could not be encoded (out of memory): dropped");
		le->warned_encode = true;
	}
	le->first_ns = 0;
}

/* The turn's end (kvp_loop_events_turn) publishes the batch when its first event is old enough
 * by now, or arms the timeout again for what is left: one that was armed for an earlier batch
 * (published since by a busy turn) does not cut the next one short. */
static void timer_fired(void *loop, struct kvp_src *src, const struct io_uring_cqe *cqe)
{
	struct kvp_loop_events *le = src->owner;

	(void)loop;
	(void)cqe;
	le->timer_armed = false;
}

static void replay_ready(void *loop, struct kvp_src *src, const struct io_uring_cqe *cqe)
{
	struct kvp_loop_events *le = src->owner;

	(void)loop;
	(void)cqe;
	le->replay_armed = false;
	le->replay_due = true;
}

/* A timeout that publishes the staged events after left_ns, when the loop would sleep. False
 * when the ring has no SQE to spare. */
static bool arm_timer(struct server *sv, struct kvp_loop_events *le, uint64_t left_ns)
{
	struct io_uring_sqe *sqe;

	if (le->timer_armed)
		return true;
	sqe = io_uring_get_sqe(&sv->ring);
	if (!sqe)
		return false;
	le->ts.tv_sec = (long long)(left_ns / 1000000000u);
	le->ts.tv_nsec = (long long)(left_ns % 1000000000u);
	io_uring_prep_timeout(sqe, &le->ts, 0, 0);
	io_uring_sqe_set_data(sqe, &le->timer_src);
	le->timer_armed = true;
	return true;
}

void kvp_loop_events_turn(struct server *sv)
{
	struct kvp_daemon *d = sv->d;
	struct kvp_loop_events *le = d->events;
	struct kvp_events_stats st;

	if (!le)
		return;
	hook_pools(d, le);
	if (kvp_events_staged(le->ev)) {
		uint64_t now = mono_ns();

		if (!le->first_ns)
			le->first_ns = now;
		if (now - le->first_ns >= le->batch_ns || sv->stopping ||
		    kvp_events_staged_bytes(le->ev) >= BATCH_BYTES_MAX ||
		    !arm_timer(sv, le, le->batch_ns - (now - le->first_ns)))
			publish(le);
	}
	/* the replay socket only when its fd said so: no libzmq call on a turn without requests */
	if (le->replay_due) {
		le->replay_due = false;
		kvp_events_serve(le->ev, snapshot, le, wall_now());
	}
	if (le->replay_fd >= 0 && !le->replay_armed) {
		struct io_uring_sqe *sqe = io_uring_get_sqe(&sv->ring);

		if (sqe) {
			io_uring_prep_poll_add(sqe, le->replay_fd, POLLIN);
			io_uring_sqe_set_data(sqe, &le->replay_src);
			le->replay_armed = true;
		} else {
			le->replay_due = true; /* no SQE: look next turn */
		}
	}
	kvp_events_stats(le->ev, &st);
	d->st.events_batches = st.batches;
	d->st.events_published = st.events;
	d->st.events_dropped = st.dropped_batches;
	d->st.events_replays = st.replays;
	d->st.events_snapshots = st.snapshots;
}

struct kvp_events *kvp_loop_events_publisher(struct kvp_daemon *d)
{
	return d->events ? d->events->ev : NULL;
}

void kvp_loop_events_stop(struct kvp_daemon *d)
{
	struct kvp_loop_events *le = d->events;

	if (!le)
		return;
	kvp_events_flush(le->ev, wall_now());
	kvp_dt_set_observer(d->dt, NULL, NULL);
	kvp_rt_set_observer(d, NULL, NULL);
	for (uint32_t j = 0; j < le->n; j++)
		if (live(d, &le->pools[j]))
			kvp_index_set_observer(le->pools[j].p->ix, NULL, NULL);
	kvp_events_free(le->ev);
	free(le);
	d->events = NULL;
}

#else /* without libzmq and msgpack-c */

int kvp_loop_events_start(struct kvp_daemon *d, char *err, size_t errlen)
{
	if (!d->conf.events.enabled)
		return 0;
	snprintf(err, errlen,
		 "[events] is given but kvpoold was built without KV events (libzmq and "
		 "msgpack-c: apt-get install libzmq3-dev libmsgpack-dev)");
	return -1;
}

void kvp_loop_events_turn(struct server *sv)
{
	(void)sv;
}

struct kvp_events *kvp_loop_events_publisher(struct kvp_daemon *d)
{
	(void)d;
	return NULL;
}

void kvp_loop_events_stop(struct kvp_daemon *d)
{
	(void)d;
}
#endif
