/* remote_tier.c - a pool's pages in the remote tier: spill, write-through, Match's existence
 * query and Fetch (remote_tier.h). */
#include "remote_tier.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nettle/sha2.h>

#include "daemon.h"
#include "log.h"
#include "mix.h"
#include "pool_cache.h"
#include "remote.h"
#include "remote_cluster.h"
#include "remote_value.h"
#include "session.h"

/* Write-through remembers the remote keys it wrote in a direct-mapped table of 2^SEEN_BITS key
 * tags (4 MiB, made with the first write-through pool), so that content written once (inserted,
 * or demoted to host) is not written again when it is promoted and demoted, or evicted. A tag
 * pushed out by another only costs a second SET; a failed SET forgets its tag. The cluster may
 * lose what it was given (a failover without replica, eviction under maxmemory, a flush), so an
 * entry lasts rewrite_after_s at most, and ttl_s / 2 with ttl_s (values about to expire are
 * written again); the whole table is forgotten when a node connection drops or comes back, or
 * the slot map changes. A Fetch's hit is remembered only without ttl_s (the value's remaining
 * TTL is unknown). */
#define SEEN_BITS 18

struct rt_pool {
	struct kvp_daemon *d;
	struct kvpd_pool *p;
	struct kvp_rv_fp fp;
	struct rt_pool *next;
};

/* An existence query: its caller's callback, called once (at the deadline, with 0, when the
 * cluster has not answered by then; the query's end frees it). */
struct rt_query {
	struct kvp_daemon *d;
	kvp_below_held_fn done;
	void *arg;
	bool answered;
	uint64_t deadline_ms;
	struct rt_query *prev, *next;
};

/* The reads of one run into host pages. */
struct rt_read;
struct rt_get {
	struct rt_read *rd;
	uint32_t i;
};
struct rt_read {
	struct kvp_daemon *d;
	struct kvpd_pool *p;
	struct rt_pool *rp;
	kvp_below_read_fn done;
	void *arg;
	uint32_t n, pending;
	uint32_t *pages;
	char (*rkey)[KVP_RV_KEY_MAX];
	struct rt_get *gets;
	struct rt_bhash *bh; /* the pages' block hashes, for the observer (NULL: none set) */
};

/* A page's block hash as the page index knows it (the engine's key, a token page's kvp_page_key):
 * what the observer is told. */
struct rt_bhash {
	uint8_t len;
	uint8_t b[KVP_KEY_MAX];
};

struct rt_seen {
	uint64_t tag; /* 0: empty */
	uint64_t at_ms;
};

struct kvp_rt {
	struct rt_pool *pools;
	struct rt_query *waits; /* queries not answered yet, for their deadlines */
	struct rt_seen *seen;	/* write-through's written keys (SEEN_BITS) */
	/* The cluster figures the table was last checked against (seen_check). */
	uint64_t seen_connects, seen_disconnects, seen_map_changes;
	/* counters */
	uint64_t spilled_pages, spill_dropped, written_pages, written_skipped, fetched_pages,
		fetch_misses;
	uint64_t bad_values, foreign_values, match_queries, match_timeouts, remote_pages,
		written_resets, set_pauses;
	/* SETs rest while a master times out (rt_set_status): until pause_until_ms only one every
	 * PROBE_MS goes (probe_at_ms: the next), and a SET that lands ends the rest; pause_ms
	 * doubles while the first ones sent after a rest time out too. */
	uint64_t pause_until_ms, probe_at_ms;
	uint32_t pause_ms;
	kvp_rt_observe_fn observe; /* kvp_rt_set_observer */
	void *observe_ctx;
};

#define PAUSE_FIRST_MS 1000
#define PAUSE_MAX_MS 30000
#define PROBE_MS 200

static struct kvp_rt *rt_of(struct kvp_daemon *d)
{
	if (!d->rt)
		d->rt = calloc(1, sizeof(*d->rt));
	return d->rt;
}

static struct rt_pool *rp_find(struct kvp_daemon *d, const struct kvpd_pool *p)
{
	if (!d->rt)
		return NULL;
	for (struct rt_pool *rp = d->rt->pools; rp; rp = rp->next)
		if (rp->p == p)
			return rp;
	return NULL;
}

/* The namespace part of a remote key (kvp_rv_ns_name): the pool's remote_scope (its name when
 * none is set) and the namespace's binding, read at each use (a reload may change them). */
#define NS_NAME_MAX KVP_RV_NSNAME_MAX
static void ns_name(const struct rt_pool *rp, uint64_t ns, int keyed, char out[NS_NAME_MAX])
{
	const struct kvp_pool_conf *c = &rp->p->conf;

	kvp_rv_ns_name(c->remote_scope[0] ? c->remote_scope : c->name,
		       kvp_pool_conf_ns_owner(c, ns), keyed, ns, out);
}

static void key_hash(const uint8_t *key, size_t len, uint8_t out[KVP_RV_HASH_SIZE])
{
	struct sha256_ctx c;

	if (len == KVP_RV_HASH_SIZE) {
		memcpy(out, key, len);
		return;
	}
	sha256_init(&c);
	sha256_update(&c, len, key);
	sha256_digest(&c, KVP_RV_HASH_SIZE, out);
}

static const uint8_t *host_page(const struct kvpd_pool *p, uint32_t page)
{
	return (const uint8_t *)p->mem[KVP_TIER_ID_HOST].base + (uint64_t)page * p->page_bytes;
}

/* ---- writes (spill, write-through) ---- */

/* A SET in flight that is remembered: its write-through tag (0: none), forgotten when the SET
 * fails; the page's block hash for the observer (bh.len 0: none), told when the SET landed. */
struct rt_set {
	struct kvp_rt *rt;
	uint64_t tag;
	struct kvp_daemon *d;
	const struct kvpd_pool *p;
	struct rt_bhash bh;
};

/* Tells the observer that the cluster holds (stored) or no longer holds a page of p, when one is
 * set and p is still a pool of the daemon. */
static void rt_tell(struct kvp_daemon *d, const struct kvpd_pool *p, const uint8_t *bh, size_t len,
		    bool stored)
{
	struct kvp_rt *rt = d->rt;

	if (rt && rt->observe && len && kvp_daemon_has_pool(d, p))
		rt->observe(rt->observe_ctx, p, bh, len, stored);
}

/* The seen-table entry of tag, NULL without the table. */
static struct rt_seen *seen_slot(const struct kvp_rt *rt, uint64_t tag)
{
	return rt->seen ? &rt->seen[tag & ((1u << SEEN_BITS) - 1)] : NULL;
}

/* A SET's end, for the pause: spills and write-through into a master that times out (asleep,
 * overloaded) rest for a while instead of filling the in-flight bounds again at once. Each
 * time the bounds filled, the SETs in them timed out together and the connections were dropped
 * with them: work on the I/O thread that took a core from the loop on a 2-core machine
 * (bench_remote remote.slow_master.match_p99 2.5-4x a node without a remote tier). A master
 * that is down fails at once and costs nothing: no pause for that. The rest is the node's, not
 * a master's (keys' masters are the I/O thread's to know): where other masters answer, their
 * acknowledgements end it soon. */
static void rt_set_status(struct kvp_rt *rt, enum kvp_rc_status st)
{
	uint64_t now;

	if (st == KVP_RC_OK) { /* the cluster takes SETs again */
		rt->pause_ms = 0;
		rt->pause_until_ms = 0;
		return;
	}
	if (st != KVP_RC_ETIMEOUT || (now = kvp_rc_now_ms()) < rt->pause_until_ms)
		return; /* sent before the pause began: it stands */
	rt->pause_ms = !rt->pause_ms			  ? PAUSE_FIRST_MS
		       : rt->pause_ms >= PAUSE_MAX_MS / 2 ? PAUSE_MAX_MS
							  : rt->pause_ms * 2;
	rt->pause_until_ms = now + rt->pause_ms;
	rt->probe_at_ms = now + PROBE_MS;
	rt->set_pauses++;
}

static void set_done(void *arg, enum kvp_rc_status st, const void *val, size_t len)
{
	struct rt_set *ws = arg; /* the rest is counted by the client, by status */
	struct rt_seen *e;

	(void)val, (void)len;
	rt_set_status(ws->rt, st);
	if (st != KVP_RC_OK && ws->tag && (e = seen_slot(ws->rt, ws->tag)) && e->tag == ws->tag)
		e->tag = 0;
	if (st == KVP_RC_OK)
		rt_tell(ws->d, ws->p, ws->bh.b, ws->bh.len, true);
	free(ws);
}

/* A spill's end (nothing remembered for it). */
static void spill_done(void *arg, enum kvp_rc_status st, const void *val, size_t len)
{
	(void)val, (void)len;
	rt_set_status(arg, st);
}

/* How long an entry of the table stands: rewrite_after_s, and at most ttl_s / 2 with ttl_s. */
static uint64_t seen_max_ms(const struct kvp_daemon *d)
{
	const struct kvp_remote_conf *c = kvp_remote_conf(d->remote);
	uint64_t ms = c->rewrite_after_s * 1000ull;

	return c->ttl_s && c->ttl_s * 500ull < ms ? c->ttl_s * 500ull : ms;
}

/* Whether write-through wrote key (its tag *tag) already and recently; false for other modes
 * (*tag 0: not remembered). */
static bool seen_written(const struct rt_pool *rp, const char *key, size_t klen, uint64_t *tag)
{
	const struct kvp_rt *rt = rp->d->rt;
	uint64_t t = 0x9e3779b97f4a7c15ULL;
	const struct rt_seen *e;

	*tag = 0;
	if (rp->p->conf.remote != KVP_REMOTE_WRITE_THROUGH || !rt->seen)
		return false;
	for (size_t i = 0; i < klen; i++)
		t = kvp_mix64(t ^ (uint8_t)key[i]);
	*tag = t | 1u;
	e = seen_slot(rt, *tag);
	return e->tag == *tag && kvp_rc_now_ms() - e->at_ms < seen_max_ms(rp->d);
}

/* Remembers that the cluster holds key (write-through pools only), from a Fetch's hit: not with
 * ttl_s, where the value may be about to expire. */
static void seen_note(const struct rt_pool *rp, const char *key)
{
	uint64_t tag;

	if (kvp_remote_conf(rp->d->remote)->ttl_s)
		return;
	if (!seen_written(rp, key, strlen(key), &tag) && tag)
		*seen_slot(rp->d->rt, tag) = (struct rt_seen){ tag, kvp_rc_now_ms() };
}

/* Forgets the whole table when a node connection dropped or was made again (after a drop), or
 * the slot map changed (after the first one): the cluster may have lost what it holds. Uses the
 * figures of the last loop turn (d->remote_st). */
static void seen_check(struct kvp_daemon *d)
{
	struct kvp_rt *rt = d->rt;
	const struct kvp_remote_stats *st = &d->remote_st;
	bool lost;

	if (!rt)
		return;
	lost = st->disconnects != rt->seen_disconnects ||
	       (st->disconnects && st->connects != rt->seen_connects) ||
	       (rt->seen_map_changes && st->slot_map_changes != rt->seen_map_changes);
	rt->seen_connects = st->connects;
	rt->seen_disconnects = st->disconnects;
	rt->seen_map_changes = st->slot_map_changes;
	if (!lost || !rt->seen)
		return;
	memset(rt->seen, 0, sizeof(*rt->seen) << SEEN_BITS);
	rt->written_resets++;
}

enum { PUT_DROPPED = -1, PUT_SEEN = 0, PUT_SENT = 1 };

/* SET of one page under hash h (its block hash bh, bhlen bytes, for the observer): PUT_SENT;
 * PUT_SEEN (write-through: that content was written already, counted); PUT_DROPPED when the
 * bounds refused it (counted) or the key is bad. */
static int put_page(struct rt_pool *rp, uint64_t ns, int keyed, const uint8_t *h, uint32_t page,
		    const uint8_t *bh, size_t bhlen)
{
	struct kvp_remote *r = rp->d->remote;
	char key[KVP_RV_KEY_MAX], nsn[NS_NAME_MAX];
	const uint8_t *b = host_page(rp->p, page);
	struct rt_seen *slot = NULL, old = { 0 };
	struct rt_set *ws = NULL;
	uint64_t tag;
	int klen;

	ns_name(rp, ns, keyed, nsn);
	if ((klen = kvp_rv_key(&rp->fp, nsn, h, key)) < 0)
		return PUT_DROPPED;
	if (seen_written(rp, key, (size_t)klen, &tag)) {
		rp->d->rt->written_skipped++;
		return PUT_SEEN;
	}
	if (rp->d->rt->pause_until_ms) { /* a master timed out: SETs rest (rt_set_status) */
		struct kvp_rt *rt = rp->d->rt;
		uint64_t now = kvp_rc_now_ms();

		if (now < rt->pause_until_ms) {
			if (now < rt->probe_at_ms) {
				rt->spill_dropped++;
				return PUT_DROPPED;
			}
			rt->probe_at_ms = now + PROBE_MS; /* this one goes: the probe */
		}
	}
	if (!rp->d->rt->observe || bhlen > KVP_KEY_MAX)
		bhlen = 0;
	/* Remembered before the submission: a completion that fails, even at once, forgets it. */
	if ((tag || bhlen) && (ws = malloc(sizeof(*ws)))) {
		*ws = (struct rt_set){ rp->d->rt, tag, rp->d, rp->p, { (uint8_t)bhlen, { 0 } } };
		memcpy(ws->bh.b, bh, bhlen);
		if (tag) {
			slot = seen_slot(rp->d->rt, tag);
			old = *slot;
			*slot = (struct rt_seen){ tag, kvp_rc_now_ms() };
		}
	}
	/* The page is copied here (it is about to be reused), its checksum taken in the same pass;
	 * the header is the I/O thread's. */
	if (kvp_remote_put_page(r, &rp->fp, key, (size_t)klen, b, rp->p->page_bytes,
				kvp_remote_conf(r)->ttl_s, ws ? set_done : spill_done,
				ws ? (void *)ws : (void *)rp->d->rt) < 0) {
		if (slot)
			*slot = old;
		free(ws);
		rp->d->rt->spill_dropped++;
		return PUT_DROPPED;
	}
	return PUT_SENT;
}

/* The index's spill hook: a host page leaving by eviction. */
static void spill_page(void *ctx, uint64_t ns, int keyed, const uint8_t *key, size_t klen,
		       uint32_t page)
{
	struct rt_pool *rp = ctx;
	uint8_t h[KVP_RV_HASH_SIZE];

	key_hash(key, klen, h); /* a token page's key is its chained page hash already */
	if (put_page(rp, ns, keyed, h, page, key, klen) == PUT_SENT)
		rp->d->rt->spilled_pages++;
}

/* The index's landed hook (write-through): a device page demoted to a host page. */
static void landed_page(void *ctx, uint64_t ns, int keyed, const uint8_t *key, size_t klen,
			uint32_t page)
{
	struct rt_pool *rp = ctx;
	uint8_t h[KVP_RV_HASH_SIZE];

	if (rp->p->conf.remote != KVP_REMOTE_WRITE_THROUGH)
		return;
	key_hash(key, klen, h); /* a token page's key is its chained page hash already */
	if (put_page(rp, ns, keyed, h, page, key, klen) == PUT_SENT)
		rp->d->rt->written_pages++;
}

void kvp_rt_bind(struct kvp_daemon *d)
{
	struct kvp_rt *rt;

	if (!d->remote)
		return;
	seen_check(d);
	for (uint32_t i = 0; i < d->n_pools; i++) {
		struct kvpd_pool *p = d->pools[i];
		struct rt_pool *rp;

		if (p->conf.remote == KVP_REMOTE_OFF || !p->pages[KVP_TIER_ID_HOST] ||
		    rp_find(d, p))
			continue;
		if (!(rt = rt_of(d)) || !(rp = calloc(1, sizeof(*rp))))
			return;
		rp->d = d;
		rp->p = p;
		rp->fp = (struct kvp_rv_fp){ p->conf.layers,	  p->conf.kv_heads,
					     p->conf.head_dim,	  (uint32_t)p->conf.dtype,
					     p->conf.page_tokens, 0 };
		rp->next = rt->pools;
		rt->pools = rp;
		kvp_index_set_spill(p->ix, spill_page, rp);
		if (p->conf.remote != KVP_REMOTE_WRITE_THROUGH)
			continue;
		if (!rt->seen)
			rt->seen = calloc((size_t)1 << SEEN_BITS, sizeof(*rt->seen));
		kvp_index_set_landed(p->ix, landed_page, rp);
	}
	/* Pools gone (a reload removed them) leave their records. */
	if (d->rt) {
		struct rt_pool **pp = &d->rt->pools, *rp;

		while ((rp = *pp)) {
			if (kvp_daemon_has_pool(d, rp->p)) {
				pp = &rp->next;
				continue;
			}
			*pp = rp->next;
			free(rp);
		}
	}
}

void kvp_rt_written(struct kvp_daemon *d, struct kvpd_pool *p, uint64_t ns, const uint32_t *tokens,
		    uint32_t first, const uint32_t *pages, uint32_t n)
{
	struct rt_pool *rp = rp_find(d, p);
	uint8_t(*h)[KVP_PAGE_KEY_BYTES];

	if (!rp || p->conf.remote != KVP_REMOTE_WRITE_THROUGH || !n ||
	    !(h = malloc(sizeof(*h) * n)))
		return;
	kvp_pool_page_keys(p, ns, tokens, first, first + n, h);
	for (uint32_t i = 0; i < n; i++)
		if (put_page(rp, ns, 0, h[i], pages[i], h[i], KVP_PAGE_KEY_BYTES) == PUT_SENT)
			d->rt->written_pages++;
	free(h);
}

void kvp_rt_written_keys(struct kvp_daemon *d, struct kvpd_pool *p, uint64_t ns,
			 const ProtobufCBinaryData *keys, const uint32_t *pages, uint32_t n)
{
	struct rt_pool *rp = rp_find(d, p);
	uint8_t h[KVP_RV_HASH_SIZE];

	if (!rp || p->conf.remote != KVP_REMOTE_WRITE_THROUGH)
		return;
	for (uint32_t i = 0; i < n; i++) {
		key_hash(keys[i].data, keys[i].len, h);
		if (put_page(rp, ns, 1, h, pages[i], keys[i].data, keys[i].len) == PUT_SENT)
			d->rt->written_pages++;
	}
}

/* ---- keys of the pages after the local ones ---- */

/* Remote keys of pages [from, to) of tokens into out[to - from], and their page keys, the
 * block hashes the observer is told, into bh[to - from] unless bh is NULL; 0, -EINVAL or
 * -ENOMEM. */
static int token_keys(const struct rt_pool *rp, uint64_t ns, const uint32_t *tokens, uint32_t from,
		      uint32_t to, char (*out)[KVP_RV_KEY_MAX], size_t *lens, struct rt_bhash *bh)
{
	uint8_t(*h)[KVP_PAGE_KEY_BYTES] = malloc(sizeof(*h) * (to - from + 1));
	char nsn[NS_NAME_MAX];
	int k = 0;

	if (!h)
		return -ENOMEM;
	ns_name(rp, ns, 0, nsn);
	kvp_pool_page_keys(rp->p, ns, tokens, from, to, h);
	for (uint32_t i = from; i < to && k >= 0; i++)
		if ((k = kvp_rv_key(&rp->fp, nsn, h[i - from], out[i - from])) >= 0)
			lens[i - from] = (size_t)k;
	for (uint32_t i = 0; bh && i < to - from; i++) {
		bh[i].len = KVP_PAGE_KEY_BYTES;
		memcpy(bh[i].b, h[i], KVP_PAGE_KEY_BYTES);
	}
	free(h);
	return k < 0 ? k : 0;
}

static int hash_keys(const struct rt_pool *rp, uint64_t ns, const struct kvp_key *keys, uint32_t n,
		     char (*out)[KVP_RV_KEY_MAX], size_t *lens)
{
	uint8_t h[KVP_RV_HASH_SIZE];
	char nsn[NS_NAME_MAX];
	int k;

	ns_name(rp, ns, 1, nsn);
	for (uint32_t i = 0; i < n; i++) {
		key_hash(keys[i].data, keys[i].len, h);
		if ((k = kvp_rv_key(&rp->fp, nsn, h, out[i])) < 0)
			return k;
		lens[i] = (size_t)k;
	}
	return 0;
}

/* Remote keys of run's pages into out[run->n], lens[run->n]; 0 or a negative errno. */
static int run_keys(const struct rt_pool *rp, const struct kvp_below_run *run,
		    char (*out)[KVP_RV_KEY_MAX], size_t *lens, struct rt_bhash *bh)
{
	if (!run->keyed)
		return token_keys(rp, run->ns, run->tokens, run->from, run->from + run->n, out,
				  lens, bh);
	for (uint32_t i = 0; bh && i < run->n; i++) { /* the engine's keys */
		const struct kvp_key *k = &run->keys[run->from + i];

		bh[i].len = k->len <= KVP_KEY_MAX ? (uint8_t)k->len : 0;
		memcpy(bh[i].b, k->data, bh[i].len);
	}
	return hash_keys(rp, run->ns, run->keys + run->from, run->n, out, lens);
}

uint32_t kvp_rt_serves(struct kvp_daemon *d, const struct kvpd_pool *p)
{
	return d->remote && rp_find(d, p) ? kvp_remote_conf(d->remote)->match_max_pages : 0;
}

/* ---- queries: how many pages after the local ones the cluster holds ---- */

static void query_unlink(struct kvp_rt *rt, struct rt_query *w)
{
	if (w->prev)
		w->prev->next = w->next;
	else if (rt->waits == w)
		rt->waits = w->next;
	if (w->next)
		w->next->prev = w->prev;
	w->prev = w->next = NULL;
}

static void query_answer(struct rt_query *w, uint32_t held)
{
	w->answered = true;
	if (w->d->rt)
		w->d->rt->remote_pages += held;
	w->done(w->arg, held);
}

static void exists_done(void *arg, size_t n, const enum kvp_rc_status *st)
{
	struct rt_query *w = arg;
	uint32_t k = 0;

	while (k < n && st[k] == KVP_RC_HIT)
		k++;
	if (!w->answered) {
		query_unlink(w->d->rt, w);
		query_answer(w, k);
	}
	free(w);
}

static void arm_alarm(struct kvp_daemon *d)
{
	int64_t at = -1;

	for (struct rt_query *w = d->rt ? d->rt->waits : NULL; w; w = w->next)
		if (at < 0 || (int64_t)w->deadline_ms < at)
			at = (int64_t)w->deadline_ms;
	kvp_remote_set_alarm(d->remote, at);
}

void kvp_rt_expire(struct kvp_daemon *d)
{
	uint64_t now = kvp_rc_now_ms();
	struct rt_query *w, *next;

	if (!d->rt || !d->remote)
		return;
	for (w = d->rt->waits; w; w = next) {
		next = w->next;
		if (now < w->deadline_ms)
			continue;
		query_unlink(d->rt, w);
		d->rt->match_timeouts++;
		query_answer(w, 0); /* the query's end frees w */
	}
	arm_alarm(d);
}

int kvp_rt_query(struct kvp_daemon *d, struct kvpd_pool *p, const struct kvp_below_run *run,
		 kvp_below_held_fn done, void *arg)
{
	struct rt_pool *rp = rp_find(d, p);
	char(*keys)[KVP_RV_KEY_MAX] = NULL;
	size_t *lens = NULL;
	const void **kp = NULL;
	struct rt_query *w = NULL;
	int rc = -ENOMEM;

	if (!rp || !d->remote || !run->n)
		return -ENOENT;
	if (!(keys = malloc(sizeof(*keys) * run->n)) || !(lens = malloc(sizeof(*lens) * run->n)) ||
	    !(kp = malloc(sizeof(*kp) * run->n)) || !(w = calloc(1, sizeof(*w))))
		goto out;
	if ((rc = run_keys(rp, run, keys, lens, NULL)) < 0)
		goto out;
	for (uint32_t i = 0; i < run->n; i++)
		kp[i] = keys[i];
	*w = (struct rt_query){ .d = d, .done = done, .arg = arg };
	rc = kvp_remote_exists_many(d->remote, run->n, (const void *const *)kp, lens, exists_done,
				    w);
	if (rc < 0)
		goto out;
	d->rt->match_queries++;
	w->deadline_ms = kvp_rc_now_ms() + kvp_remote_conf(d->remote)->match_timeout_ms;
	w->next = d->rt->waits;
	if (w->next)
		w->next->prev = w;
	d->rt->waits = w;
	arm_alarm(d);
	w = NULL; /* the query's end frees it */
	rc = 0;
out:
	free(w);
	free(kp);
	free(keys);
	free(lens);
	return rc;
}

/* ---- reads into host pages ---- */

static void read_free(struct rt_read *rd)
{
	free(rd->pages);
	free(rd->rkey);
	free(rd->gets);
	free(rd->bh);
	free(rd);
}

static void del_done(void *arg, enum kvp_rc_status st, const void *val, size_t len)
{
	(void)arg, (void)st, (void)val, (void)len;
}

/* A fetched value, its header and checksums verified on the remote I/O thread already
 * (kvp_remote_get_page): the loop copies the page bytes in, or counts and deletes a refused
 * value. */
static void get_done(void *arg, enum kvp_rc_status st, int e, const void *pl, size_t n)
{
	struct rt_get *g = arg;
	struct rt_read *rd = g->rd;
	struct kvp_rt *rt = rd->d->rt;
	bool ok = false;

	if (st == KVP_RC_HIT && kvp_daemon_has_pool(rd->d, rd->p)) {
		if (e == 0 && n == rd->p->page_bytes) {
			memcpy((uint8_t *)rd->p->mem[KVP_TIER_ID_HOST].base +
				       (uint64_t)rd->pages[g->i] * rd->p->page_bytes,
			       pl, n);
			ok = true;
			seen_note(rd->rp,
				  rd->rkey[g->i]); /* the cluster has it: not written back */
		} else {
			/* Never served: a miss, counted, and the value deleted. */
			if (e == -KVP_RV_EFOREIGN)
				rt->foreign_values++;
			else
				rt->bad_values++;
			kvp_remote_del(rd->d->remote, rd->rkey[g->i], strlen(rd->rkey[g->i]),
				       del_done, NULL);
			if (rd->bh)
				rt_tell(rd->d, rd->p, rd->bh[g->i].b, rd->bh[g->i].len, false);
		}
	} else if (st == KVP_RC_MISS && rd->bh) {
		/* gone from the cluster (expired, evicted, deleted) since it was written */
		rt_tell(rd->d, rd->p, rd->bh[g->i].b, rd->bh[g->i].len, false);
	}
	if (ok)
		rt->fetched_pages++;
	else
		rt->fetch_misses++;
	rd->done(rd->arg, g->i, ok);
	if (--rd->pending == 0)
		read_free(rd);
}

int kvp_rt_read(struct kvp_daemon *d, struct kvpd_pool *p, const struct kvp_below_run *run,
		const uint32_t *pages, kvp_below_read_fn done, void *arg)
{
	struct rt_pool *rp = rp_find(d, p);
	struct rt_read *rd;
	size_t *lens = NULL;
	uint32_t sent = 0;

	if (!rp || !d->remote || !run->n)
		return -ENOENT;
	if (!(rd = calloc(1, sizeof(*rd))))
		return -ENOMEM;
	*rd = (struct rt_read){ .d = d, .p = p, .rp = rp, .done = done, .arg = arg, .n = run->n };
	rd->pages = malloc(sizeof(uint32_t) * run->n);
	rd->rkey = malloc(sizeof(*rd->rkey) * run->n);
	rd->gets = calloc(run->n, sizeof(*rd->gets));
	lens = malloc(sizeof(*lens) * run->n);
	if (d->rt->observe) /* the pages' block hashes (NULL, out of memory: not told) */
		rd->bh = calloc(run->n, sizeof(*rd->bh));
	if (!rd->pages || !rd->rkey || !rd->gets || !lens ||
	    run_keys(rp, run, rd->rkey, lens, rd->bh) < 0) {
		free(lens);
		read_free(rd);
		return -ENOMEM;
	}
	memcpy(rd->pages, pages, sizeof(uint32_t) * run->n);
	rd->pending = 1; /* until every read went out: none of them frees rd meanwhile */
	for (uint32_t i = 0; i < run->n; i++) {
		rd->gets[i] = (struct rt_get){ rd, i };
		rd->pending++;
		if (kvp_remote_get_page(d->remote, &rp->fp, p->page_bytes, rd->rkey[i], lens[i],
					get_done, &rd->gets[i]) < 0) {
			rd->pending--;
			d->rt->fetch_misses++;
			continue;
		}
		sent++;
	}
	free(lens);
	if (--rd->pending == 0)
		read_free(rd);
	return sent ? (int)sent : -EAGAIN;
}

void kvp_rt_stats_read(const struct kvp_daemon *d, struct kvp_remote_stats *out)
{
	const struct kvp_rt *rt = d->rt;

	if (!rt)
		return;
	out->spilled_pages = rt->spilled_pages;
	out->spill_dropped = rt->spill_dropped;
	out->written_pages = rt->written_pages;
	out->written_skipped = rt->written_skipped;
	out->fetched_pages = rt->fetched_pages;
	out->fetch_misses = rt->fetch_misses;
	out->bad_values = rt->bad_values;
	out->foreign_values = rt->foreign_values;
	out->match_queries = rt->match_queries;
	out->match_timeouts = rt->match_timeouts;
	out->remote_pages = rt->remote_pages;
	out->written_resets = rt->written_resets;
	out->set_pauses = rt->set_pauses;
}

void kvp_rt_set_observer(struct kvp_daemon *d, kvp_rt_observe_fn fn, void *ctx)
{
	struct kvp_rt *rt;

	if (!d->remote || (!fn && !d->rt) || !(rt = rt_of(d)))
		return;
	rt->observe = fn;
	rt->observe_ctx = ctx;
}

void kvp_rt_free(struct kvp_daemon *d)
{
	struct rt_pool *rp, *next;

	if (!d->rt)
		return;
	for (rp = d->rt->pools; rp; rp = next) {
		next = rp->next;
		if (kvp_daemon_has_pool(d, rp->p)) {
			kvp_index_set_spill(rp->p->ix, NULL, NULL);
			kvp_index_set_landed(rp->p->ix, NULL, NULL);
		}
		free(rp);
	}
	free(d->rt->seen);
	free(d->rt);
	d->rt = NULL;
}
