/* loop_events.c - feeds the publisher (events/) from the pools' page indexes: each pool with
 * events = on gets an observer (kvp_index_set_observer) that stages its pages' stores and
 * removals with the tier as medium ("GPU" for the device tier, "CPU" for the host tier) and the
 * pool's page_tokens as block size; snapshots walk every hooked pool. */
#include "loop_events.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "daemon.h"
#include "kvp_config.h"
#include "log.h"

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
	struct kvp_events *ev;
	struct hooked pools[KVP_MAX_POOLS];
	uint32_t n;
	bool warned_encode;
};

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

static bool live(const struct kvp_daemon *d, const struct hooked *h)
{
	for (uint32_t i = 0; i < d->n_pools; i++)
		if (d->pools[i] == h->p && d->pools[i]->id == h->id)
			return true;
	return false;
}

/* Hooks the pools not hooked yet (a reload's) and forgets the ones gone; a new pool's pages
 * (none, or a restart's) are staged as stored. */
static void hook_pools(struct kvp_daemon *d, struct kvp_loop_events *le)
{
	for (uint32_t j = 0; j < le->n;) {
		if (live(d, &le->pools[j])) {
			j++;
			continue;
		}
		le->pools[j] = le->pools[--le->n];
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
		kvp_index_observe_all(p->ix);
		le->n++;
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
		kvp_index_observe_all(le->pools[j].p->ix);
	return 0;
}

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
	d->events = le;
	kvp_events_cleared(le->ev);
	hook_pools(d, le);
	return 0;
}

void kvp_loop_events_turn(struct kvp_daemon *d)
{
	struct kvp_loop_events *le = d->events;
	struct kvp_events_stats st;
	double now;

	if (!le)
		return;
	hook_pools(d, le);
	now = wall_now();
	if (kvp_events_flush(le->ev, now) < 0 && !le->warned_encode) {
		log_warn("events: a batch could not be encoded (out of memory): dropped");
		le->warned_encode = true;
	}
	kvp_events_serve(le->ev, snapshot, le, now);
	kvp_events_stats(le->ev, &st);
	d->st.events_batches = st.batches;
	d->st.events_published = st.events;
	d->st.events_dropped = st.dropped_batches;
	d->st.events_replays = st.replays;
	d->st.events_snapshots = st.snapshots;
}

void kvp_loop_events_stop(struct kvp_daemon *d)
{
	struct kvp_loop_events *le = d->events;

	if (!le)
		return;
	kvp_events_flush(le->ev, wall_now());
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

void kvp_loop_events_turn(struct kvp_daemon *d)
{
	(void)d;
}

void kvp_loop_events_stop(struct kvp_daemon *d)
{
	(void)d;
}
#endif
