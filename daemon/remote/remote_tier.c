/* remote_tier.c - a pool's pages in the remote tier: spill, write-through, Match's existence
 * query and Fetch (remote_tier.h). */
#include "remote_tier.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nettle/sha2.h>

#include "defer.h"
#include "disk_tier.h"
#include "log.h"
#include "mix.h"
#include "pool_cache.h"
#include "remote.h"
#include "remote_cluster.h"
#include "remote_value.h"
#include "reply.h"
#include "rpc.h"

/* Pages one Fetch reads at most, whatever match_max_pages says. */
#define FETCH_MAX 4096
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

/* A Match waiting for its existence query. */
struct rt_wait {
	struct kvp_daemon *d;
	struct kvp_defer *t; /* NULL once answered (timed out): the query's end frees it */
	struct kvpd_pool *p; /* the Match's pool (its id p->id), checked again at the answer */
	int keyed;
	uint64_t matched, lock_id;
	uint32_t ndev, nhost;
	uint32_t *pages; /* ndev device ids, then nhost host ids */
	uint64_t deadline_ms;
	struct rt_wait *prev, *next;
};

/* One Fetch in flight. */
struct rt_fetch;
struct rt_get {
	struct rt_fetch *fe;
	uint32_t i;
};
struct rt_fetch {
	struct kvp_daemon *d;
	struct kvp_defer *t;
	struct kvpd_pool *p;
	struct rt_pool *rp;
	uint32_t pool_id;
	uint64_t ns;
	int keyed, lock;
	uint32_t *tokens;	   /* token-keyed: (local + n) whole pages of tokens */
	ProtobufCBinaryData *keys; /* hash-keyed: local + n keys (copies) */
	uint8_t *keybuf;
	uint32_t local, n, pending;
	struct kvp_lease *lease; /* n host pages the values land in */
	uint64_t sid;		 /* the session whose quotas count the lease's pages */
	uint32_t booked;	 /* those pages, until the answer (0: none) */
	uint8_t *ok;
	bool disk;		 /* the pages come from the pool's disk tier (dkey), not remote */
	struct kvp_dt_key *dkey; /* their keys */
	char (*rkey)[KVP_RV_KEY_MAX];
	struct rt_get *gets;
	struct rt_fetch *prev, *next; /* the daemon's Fetches in flight (their leases) */
};

struct rt_seen {
	uint64_t tag; /* 0: empty */
	uint64_t at_ms;
};

struct kvp_rt {
	struct rt_pool *pools;
	struct rt_wait *waits;
	struct rt_fetch *fetches;
	struct rt_seen *seen; /* write-through's written keys (SEEN_BITS) */
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

static bool pool_live(const struct kvp_daemon *d, const struct kvpd_pool *p)
{
	for (uint32_t i = 0; i < d->n_pools; i++)
		if (d->pools[i] == p)
			return true;
	return false;
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

/* A write-through SET in flight: its tag, forgotten when the SET fails. */
struct rt_set {
	struct kvp_rt *rt;
	uint64_t tag;
};

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
	if (st != KVP_RC_OK && (e = seen_slot(ws->rt, ws->tag)) && e->tag == ws->tag)
		e->tag = 0;
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

/* SET of one page under hash h: PUT_SENT; PUT_SEEN (write-through: that content was written
 * already, counted); PUT_DROPPED when the bounds refused it (counted) or the key is bad. */
static int put_page(struct rt_pool *rp, uint64_t ns, int keyed, const uint8_t *h, uint32_t page)
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
	/* Remembered before the submission: a completion that fails, even at once, forgets it. */
	if (tag && (ws = malloc(sizeof(*ws)))) {
		*ws = (struct rt_set){ rp->d->rt, tag };
		slot = seen_slot(rp->d->rt, tag);
		old = *slot;
		*slot = (struct rt_seen){ tag, kvp_rc_now_ms() };
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
	if (put_page(rp, ns, keyed, h, page) == PUT_SENT)
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
	if (put_page(rp, ns, keyed, h, page) == PUT_SENT)
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
			if (pool_live(d, rp->p)) {
				pp = &rp->next;
				continue;
			}
			*pp = rp->next;
			free(rp);
		}
	}
}

/* Where a chain of page hashes through tokens' pages [from, ..) starts: at from, with h the
 * index's key of page from - 1, when the pool still caches pages 0 .. from (their keys are
 * derived once and kept); else at 0 (the whole path hashed). */
static uint32_t chain_start(const struct rt_pool *rp, uint64_t ns, const uint32_t *tokens,
			    uint32_t from, uint8_t h[KVP_RV_HASH_SIZE])
{
	return from && kvp_pool_token_key(rp->p, ns, tokens, from, h) == 0 ? from : 0;
}

void kvp_rt_written(struct kvp_daemon *d, struct kvpd_pool *p, uint64_t ns, const uint32_t *tokens,
		    uint32_t first, const uint32_t *pages, uint32_t n)
{
	struct rt_pool *rp = rp_find(d, p);
	uint32_t pt = p->conf.page_tokens;
	uint8_t h[KVP_RV_HASH_SIZE];

	if (!rp || p->conf.remote != KVP_REMOTE_WRITE_THROUGH || !n)
		return;
	for (uint32_t i = chain_start(rp, ns, tokens, first, h); i < first + n; i++) {
		kvp_rv_page_hash(i ? h : NULL, tokens + (size_t)i * pt, pt, h);
		if (i >= first && put_page(rp, ns, 0, h, pages[i - first]) == PUT_SENT)
			d->rt->written_pages++;
	}
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
		if (put_page(rp, ns, 1, h, pages[i]) == PUT_SENT)
			d->rt->written_pages++;
	}
}

/* ---- keys of the pages after the local ones ---- */

/* Remote keys of pages [from, to) of tokens into out[to - from]; 0 or -EINVAL. */
static int token_keys(const struct rt_pool *rp, uint64_t ns, const uint32_t *tokens, uint32_t from,
		      uint32_t to, char (*out)[KVP_RV_KEY_MAX], size_t *lens)
{
	uint32_t pt = rp->p->conf.page_tokens;
	uint8_t h[KVP_RV_HASH_SIZE];
	char nsn[NS_NAME_MAX];
	int k;

	ns_name(rp, ns, 0, nsn);
	for (uint32_t i = chain_start(rp, ns, tokens, from, h); i < to; i++) {
		kvp_rv_page_hash(i ? h : NULL, tokens + (size_t)i * pt, pt, h);
		if (i < from)
			continue;
		if ((k = kvp_rv_key(&rp->fp, nsn, h, out[i - from])) < 0)
			return k;
		lens[i - from] = (size_t)k;
	}
	return 0;
}

static int hash_keys(const struct rt_pool *rp, uint64_t ns, const ProtobufCBinaryData *keys,
		     uint32_t n, char (*out)[KVP_RV_KEY_MAX], size_t *lens)
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

/* ---- Match: how many pages after the local ones the cluster holds ---- */

static void wait_unlink(struct kvp_rt *rt, struct rt_wait *w)
{
	if (w->prev)
		w->prev->next = w->next;
	else if (rt->waits == w)
		rt->waits = w->next;
	if (w->next)
		w->next->prev = w->prev;
	w->prev = w->next = NULL;
}

/* Whether w's session still holds what its answer names: the pool attached and the lock (when
 * one was taken) still its. A reload that revoked the session's access detached it meanwhile
 * (its lock and pages went back then), as may the session's own Detach: NULL then, and the
 * session (when it exists) in *sp. */
static struct kvp_lock *wait_lock(struct rt_wait *w, struct kvp_session **sp, bool *ok)
{
	struct kvp_daemon *d = w->d;
	struct kvp_session *s = kvp_rpc_session_by_id(d, w->t->session_id);
	struct kvp_lock *k = NULL;
	struct kvp_fail f;

	if (s && s->evicted) /* a reload closes it: as good as ended */
		s = NULL;
	*sp = s;
	*ok = false;
	if (!s || !pool_live(d, w->p) || d->pools[w->p->id] != w->p || !s->attached[w->p->id])
		return NULL;
	kvp_fail_init(&f);
	if (w->lock_id && (!(k = kvp_session_lock(s, w->lock_id, &f)) || k->pool != w->p))
		return NULL;
	*ok = true;
	return k;
}

static void wait_answer(struct rt_wait *w, uint32_t remote)
{
	struct kvp_daemon *d = w->d;
	struct kvp_session *s;
	struct kvp_reply r;
	struct kvp_lock *k;
	uint32_t *dev, *host;
	bool held;
	int ok = 1;

	k = wait_lock(w, &s, &held);
	if (!held) {
		struct kvp_fail f;

		/* Nothing the reply would name is the session's any more: no page ids, no lock. */
		kvp_fail_init(&f);
		if (s)
			kvp_fail(
				&f, KVP_ERR_NOT_FOUND,
				"%s: pool %s was detached from this session while the match waited "
				"for the remote tier (a reload revoked its access); nothing is locked",
				w->keyed ? "match keys" : "match", w->p->conf.name);
		else
			kvp_fail(&f, KVP_ERR_SHUTTING_DOWN, "the session ended or is closing");
		kvp_defer_fail(&d->defers, w->t, &f);
		w->t = NULL;
		return;
	}
	kvp_reply_init(&r, w->t->req_id);
	dev = kvp_reply_alloc(&r, sizeof(uint32_t) * (w->ndev + 1));
	host = kvp_reply_alloc(&r, sizeof(uint32_t) * (w->nhost + 1));
	if (dev && host) {
		memcpy(dev, w->pages, sizeof(uint32_t) * w->ndev);
		memcpy(host, w->pages + w->ndev, sizeof(uint32_t) * w->nhost);
	}
	if (!dev || !host) {
		ok = 0;
	} else if (w->keyed) {
		Kvpool__MatchKeysResp *m = KVP_REPLY_NEW(&r, Kvpool__MatchKeysResp,
							 kvpool__match_keys_resp__descriptor);

		if ((ok = m != NULL)) {
			m->matched_keys = (uint32_t)w->matched;
			m->device_pages = dev;
			m->n_device_pages = w->ndev;
			m->host_pages = host;
			m->n_host_pages = w->nhost;
			m->lock_id = w->lock_id;
			m->remote_pages = remote;
			r.resp.result_case = KVPOOL__RESPONSE__RESULT_MATCH_KEYS;
			r.resp.match_keys = m;
		}
	} else {
		Kvpool__MatchResp *m =
			KVP_REPLY_NEW(&r, Kvpool__MatchResp, kvpool__match_resp__descriptor);

		if ((ok = m != NULL)) {
			m->matched_tokens = w->matched;
			m->device_pages = dev;
			m->n_device_pages = w->ndev;
			m->host_pages = host;
			m->n_host_pages = w->nhost;
			m->lock_id = w->lock_id;
			m->remote_pages = remote;
			r.resp.result_case = KVPOOL__RESPONSE__RESULT_MATCH;
			r.resp.match = m;
		}
	}
	if (ok) {
		kvp_defer_answer(&d->defers, w->t, &r, 0);
	} else {
		struct kvp_fail f;

		/* The caller never learns the lock's id: it goes back now. */
		if (k)
			kvp_session_lock_release(s, k);
		kvp_fail_init(&f);
		kvp_rpc_oom(&f);
		kvp_defer_fail(&d->defers, w->t, &f);
	}
	kvp_reply_release(&r);
	w->t = NULL;
	if (d->rt)
		d->rt->remote_pages += remote;
}

static void exists_done(void *arg, size_t n, const enum kvp_rc_status *st)
{
	struct rt_wait *w = arg;
	uint32_t k = 0;

	while (k < n && st[k] == KVP_RC_HIT)
		k++;
	if (w->t) {
		wait_unlink(w->d->rt, w);
		wait_answer(w, k);
	}
	free(w->pages);
	free(w);
}

static void arm_alarm(struct kvp_daemon *d)
{
	int64_t at = -1;

	for (struct rt_wait *w = d->rt ? d->rt->waits : NULL; w; w = w->next)
		if (at < 0 || (int64_t)w->deadline_ms < at)
			at = (int64_t)w->deadline_ms;
	kvp_remote_set_alarm(d->remote, at);
}

void kvp_rt_expire(struct kvp_daemon *d)
{
	uint64_t now = kvp_rc_now_ms();
	struct rt_wait *w, *next;

	if (!d->rt || !d->remote)
		return;
	for (w = d->rt->waits; w; w = next) {
		next = w->next;
		if (now < w->deadline_ms)
			continue;
		wait_unlink(d->rt, w);
		d->rt->match_timeouts++;
		wait_answer(w, 0); /* the query's end frees w */
	}
	arm_alarm(d);
}

/* Submits the query of keys[0 .. n) and parks the reply (w's fields set by the caller).
 * KVP_DEFERRED; or a negative errno with nothing submitted (the caller frees w); or 1: the query
 * went but no ticket could be had, so the caller answers now and the query's end frees w. */
static int park(struct kvp_daemon *d, struct kvp_session *s, const Kvpool__Request *q,
		struct rt_wait *w, char (*keys)[KVP_RV_KEY_MAX], const size_t *lens, uint32_t n)
{
	const void **kp = malloc(sizeof(*kp) * n);
	struct kvp_fail f;
	int rc;

	kvp_fail_init(&f);
	if (!kp)
		return -ENOMEM;
	for (uint32_t i = 0; i < n; i++)
		kp[i] = keys[i];
	w->d = d;
	rc = kvp_remote_exists_many(d->remote, n, (const void *const *)kp, lens, exists_done, w);
	free(kp);
	if (rc < 0)
		return rc;
	d->rt->match_queries++;
	w->t = kvp_defer_take(&d->defers, s->id, s->uid, q->id, (int)q->call_case, &f);
	if (!w->t)
		return 1;
	w->deadline_ms = kvp_rc_now_ms() + kvp_remote_conf(d->remote)->match_timeout_ms;
	w->next = d->rt->waits;
	if (w->next)
		w->next->prev = w;
	d->rt->waits = w;
	arm_alarm(d);
	return KVP_DEFERRED;
}

static struct rt_wait *wait_new(struct kvpd_pool *p, int keyed, uint64_t matched, uint64_t lock_id,
				uint32_t ndev, const uint32_t *dev, uint32_t nhost,
				const uint32_t *host)
{
	struct rt_wait *w = calloc(1, sizeof(*w));

	if (!w || !(w->pages = malloc(sizeof(uint32_t) * ((size_t)ndev + nhost + 1)))) {
		free(w);
		return NULL;
	}
	w->p = p;
	w->keyed = keyed;
	w->matched = matched;
	w->lock_id = lock_id;
	w->ndev = ndev;
	w->nhost = nhost;
	memcpy(w->pages, dev, sizeof(uint32_t) * ndev);
	memcpy(w->pages + ndev, host, sizeof(uint32_t) * nhost);
	return w;
}

static uint32_t query_pages(const struct kvp_daemon *d, uint64_t have)
{
	uint32_t max = kvp_remote_conf(d->remote)->match_max_pages;

	return have < max ? (uint32_t)have : max;
}

/* Asks the remote tier for the n pages past the local ones of q's Match (w->keyed 0) or
 * MatchKeys (1) and parks its reply. 0 (the local answer stands, w freed or left to the query's
 * end), or KVP_DEFERRED. */
static int query(struct kvp_daemon *d, struct kvp_session *s, const Kvpool__Request *q,
		 const struct rt_pool *rp, struct rt_wait *w, uint32_t local, uint32_t n)
{
	char(*keys)[KVP_RV_KEY_MAX] = malloc(sizeof(*keys) * n);
	size_t *lens = malloc(sizeof(*lens) * n);
	int rc = -ENOMEM;

	if (keys && lens && w)
		rc = w->keyed ? hash_keys(rp, q->match_keys->namespace_,
					  q->match_keys->keys + local, n, keys, lens)
			      : token_keys(rp, q->match->namespace_, q->match->tokens, local,
					   local + n, keys, lens);
	if (rc == 0)
		rc = park(d, s, q, w, keys, lens, n);
	free(keys);
	free(lens);
	if (rc == KVP_DEFERRED || rc == 1)
		return rc == 1 ? 0 : rc;
	if (w)
		free(w->pages);
	free(w);
	return 0;
}

int kvp_rt_match(struct kvp_daemon *d, struct kvp_session *s, const Kvpool__Request *q,
		 struct kvpd_pool *p, const Kvpool__MatchResp *m)
{
	const Kvpool__MatchReq *a = q->match;
	struct rt_pool *rp = rp_find(d, p);
	uint32_t local = (uint32_t)(m->n_device_pages + m->n_host_pages), total, n;

	if (!rp || a->local_only)
		return 0;
	total = (uint32_t)a->n_tokens / p->conf.page_tokens;
	if (total <= local || !(n = query_pages(d, total - local)))
		return 0;
	return query(d, s, q, rp,
		     wait_new(p, 0, m->matched_tokens, m->lock_id, (uint32_t)m->n_device_pages,
			      m->device_pages, (uint32_t)m->n_host_pages, m->host_pages),
		     local, n);
}

int kvp_rt_match_keys(struct kvp_daemon *d, struct kvp_session *s, const Kvpool__Request *q,
		      struct kvpd_pool *p, const Kvpool__MatchKeysResp *m)
{
	const Kvpool__MatchKeysReq *a = q->match_keys;
	struct rt_pool *rp = rp_find(d, p);
	uint32_t local = m->matched_keys, n;

	if (!rp || a->local_only || a->n_keys <= local || !(n = query_pages(d, a->n_keys - local)))
		return 0;
	return query(d, s, q, rp,
		     wait_new(p, 1, m->matched_keys, m->lock_id, (uint32_t)m->n_device_pages,
			      m->device_pages, (uint32_t)m->n_host_pages, m->host_pages),
		     local, n);
}

/* ---- Fetch ---- */

/* The lease's pages stop counting in the session's quotas (a session gone took its count). */
static void fetch_unbook(struct rt_fetch *fe)
{
	struct kvp_session *s;

	if (!fe->booked)
		return;
	s = kvp_rpc_session_by_id(fe->d, fe->sid);
	if (s)
		kvp_session_fetch_held(s, fe->p->id, -(int64_t)fe->booked);
	fe->booked = 0;
}

static void fetch_free(struct rt_fetch *fe)
{
	struct kvp_rt *rt = fe->d->rt;

	fetch_unbook(fe);
	if (fe->prev)
		fe->prev->next = fe->next;
	else if (rt && rt->fetches == fe)
		rt->fetches = fe->next;
	if (fe->next)
		fe->next->prev = fe->prev;
	kvp_lease_destroy(fe->lease);
	free(fe->tokens);
	free(fe->keys);
	free(fe->keybuf);
	free(fe->ok);
	free(fe->dkey);
	free(fe->rkey);
	free(fe->gets);
	free(fe);
}

/* The local match of what fe asks, locked when lock; fills the Fetch reply's page fields. */
static int fetch_match(struct kvp_daemon *d, struct kvp_session *s, struct rt_fetch *fe, bool lock,
		       struct kvp_reply *r, Kvpool__FetchResp *m, uint32_t *local,
		       struct kvp_fail *f)
{
	struct kvpd_pool *p = fe->p;
	uint32_t n = fe->local + fe->n;
	struct kvp_index_match mt = { 0 };
	struct kvp_lock *k = NULL;
	int rc = 0;

	if (!(m->device_pages = kvp_reply_alloc(r, sizeof(uint32_t) * (n + 1))) ||
	    !(m->host_pages = kvp_reply_alloc(r, sizeof(uint32_t) * (n + 1))) ||
	    (lock && !(k = kvp_session_lock_alloc())))
		return kvp_rpc_oom(f);
	if (fe->keyed) {
		struct kvp_key *keys = malloc(sizeof(*keys) * (n + 1));

		if (!keys) {
			free(k);
			return kvp_rpc_oom(f);
		}
		for (uint32_t i = 0; i < n; i++)
			keys[i] = (struct kvp_key){ fe->keys[i].len, fe->keys[i].data };
		rc = kvp_pool_match_keys(p, fe->ns, keys, n, lock, &mt, m->device_pages,
					 m->host_pages);
		free(keys);
	} else {
		rc = kvp_pool_match(p, fe->ns, fe->tokens, n * p->conf.page_tokens, lock, &mt,
				    m->device_pages, m->host_pages);
	}
	if (rc < 0) {
		free(k);
		return kvp_rpc_oom(f);
	}
	if (k && mt.lock &&
	    (rc = kvp_session_may_lock_pages(d, s, p, mt.dev_pages + mt.host_pages, f)) < 0) {
		kvp_pool_unlock(p, mt.lock);
		free(k);
		return rc;
	}
	m->n_device_pages = mt.dev_pages;
	m->n_host_pages = mt.host_pages;
	*local = mt.dev_pages + mt.host_pages;
	m->matched = fe->keyed ? *local : (uint64_t)*local * p->conf.page_tokens;
	if (k && mt.lock) {
		k->pool = p;
		k->run = mt.lock;
		k->pages = *local;
		if (kvp_session_lock_add(d, s, k) < 0)
			return kvp_rpc_oom(f);
		m->lock_id = k->id;
	} else {
		free(k);
	}
	return 0;
}

/* Caches the leading run of pages that arrived (from where the cache ends now). */
static uint32_t fetch_insert(struct rt_fetch *fe)
{
	struct kvpd_pool *p = fe->p;
	uint32_t run = 0, c, ntot;
	struct kvp_fail f;
	int rc;

	kvp_fail_init(&f);
	while (run < fe->n && fe->ok[run])
		run++;
	if (!run)
		return 0;
	ntot = fe->local + run;
	if (fe->keyed) {
		struct kvp_key *keys = calloc(ntot, sizeof(*keys));
		uint32_t nw = 0, dup = 0, done = 0;

		if (!keys)
			return 0;
		for (uint32_t i = 0; i < ntot; i++)
			keys[i] = (struct kvp_key){ fe->keys[i].len, fe->keys[i].data };
		c = kvp_pool_exists_keys(p, fe->ns, keys, ntot);
		rc = c >= fe->local && c < ntot
			     ? kvp_lease_insert_keys(fe->lease, fe->ns, keys, ntot, c,
						     fe->lease->pages + (c - fe->local), ntot - c,
						     &nw, &dup, &done, &f)
			     : -1;
		free(keys);
		return rc == 0 ? nw : 0;
	} else {
		struct kvp_index_match mt = { 0 };
		uint32_t *dv = malloc(sizeof(uint32_t) * (ntot + 1) * 2);
		uint64_t nt = 0, dt = 0;

		if (!dv)
			return 0;
		rc = kvp_pool_match(p, fe->ns, fe->tokens, ntot * p->conf.page_tokens, false, &mt,
				    dv, dv + ntot + 1);
		free(dv);
		c = mt.dev_pages + mt.host_pages;
		rc = rc == 0 && c >= fe->local && c < ntot
			     ? kvp_lease_insert(fe->lease, fe->ns, fe->tokens,
						ntot * p->conf.page_tokens, c,
						fe->lease->pages + (c - fe->local), ntot - c, &nt,
						&dt, &f)
			     : -1;
		return rc == 0 ? (uint32_t)(nt / p->conf.page_tokens) : 0;
	}
}

static void fetch_finish(struct rt_fetch *fe)
{
	struct kvp_daemon *d = fe->d;
	struct kvp_session *s = kvp_rpc_session_by_id(d, fe->t->session_id);
	Kvpool__FetchResp *m;
	struct kvp_reply r;
	struct kvp_fail f;
	uint32_t got = 0, local = 0;
	int rc;

	kvp_fail_init(&f);
	fetch_unbook(fe); /* before the answer's lock, which the quotas count in turn */
	if (!s || !pool_live(d, fe->p)) {
		kvp_fail(&f, KVP_ERR_SHUTTING_DOWN, "the session or its pool ended");
		kvp_defer_fail(&d->defers, fe->t, &f);
		fetch_free(fe);
		return;
	}
	if (fe->pool_id >= d->n_pools || d->pools[fe->pool_id] != fe->p ||
	    !s->attached[fe->pool_id]) {
		/* A reload revoked the session's access to the pool meanwhile (it was detached):
		 * nothing is cached for it, and the pages the values landed in go back. */
		kvp_fail(
			&f, KVP_ERR_NOT_FOUND,
			"fetch: pool %s was detached from this session while the fetch ran (a reload "
			"revoked its access); nothing was cached",
			fe->p->conf.name);
		kvp_defer_fail(&d->defers, fe->t, &f);
		fetch_free(fe);
		return;
	}
	got = fetch_insert(fe);
	if (!fe->disk) /* the disk tier counts its own */
		d->rt->fetched_pages += got;
	kvp_reply_init(&r, fe->t->req_id);
	m = KVP_REPLY_NEW(&r, Kvpool__FetchResp, kvpool__fetch_resp__descriptor);
	rc = m ? fetch_match(d, s, fe, fe->lock, &r, m, &local, &f) : kvp_rpc_oom(&f);
	if (rc == 0) {
		m->fetched_pages = got;
		m->missed_pages = fe->n - got;
		r.resp.result_case = KVPOOL__RESPONSE__RESULT_FETCH;
		r.resp.fetch = m;
		kvp_defer_answer(&d->defers, fe->t, &r, 0);
	} else {
		kvp_defer_fail(&d->defers, fe->t, &f);
	}
	kvp_reply_release(&r);
	fetch_free(fe);
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
	struct rt_fetch *fe = g->fe;
	struct kvp_rt *rt = fe->d->rt;

	if (st == KVP_RC_HIT && pool_live(fe->d, fe->p)) {
		if (e == 0 && n == fe->p->page_bytes) {
			memcpy((uint8_t *)fe->p->mem[KVP_TIER_ID_HOST].base +
				       (uint64_t)fe->lease->pages[g->i] * fe->p->page_bytes,
			       pl, n);
			fe->ok[g->i] = 1;
			seen_note(fe->rp,
				  fe->rkey[g->i]); /* the cluster has it: not written back */
		} else {
			/* Never served: a miss, counted, and the value deleted. */
			if (e == -KVP_RV_EFOREIGN)
				rt->foreign_values++;
			else
				rt->bad_values++;
			kvp_remote_del(fe->d->remote, fe->rkey[g->i], strlen(fe->rkey[g->i]),
				       del_done, NULL);
		}
	}
	if (!fe->ok[g->i])
		rt->fetch_misses++;
	if (--fe->pending == 0)
		fetch_finish(fe);
}

/* A disk read's end: the page is in its host page, checked, or a miss (counted by the disk
 * tier). */
static void disk_done(void *arg, bool ok)
{
	struct rt_get *g = arg;
	struct rt_fetch *fe = g->fe;

	if (ok && pool_live(fe->d, fe->p))
		fe->ok[g->i] = 1;
	if (--fe->pending == 0)
		fetch_finish(fe);
}

/* The pages after the local ones that p's disk tier holds: their count (at most max), with
 * their keys in fe->dkey; 0 without a disk tier or such pages. */
static uint32_t disk_run(struct kvp_daemon *d, struct rt_fetch *fe, uint32_t local, uint32_t total,
			 uint32_t max)
{
	uint32_t n = total - local;

	if (!kvp_dt_has(d->dt, fe->p) || !n)
		return 0;
	if (n > max)
		n = max;
	if (!(fe->dkey = malloc(sizeof(*fe->dkey) * n)))
		return 0;
	if (kvp_dt_keys(fe->p, fe->ns, fe->keyed ? NULL : fe->tokens, fe->keyed ? fe->keys : NULL,
			local, local + n, fe->dkey) < 0)
		return 0;
	n = kvp_dt_count(d->dt, fe->p, fe->ns, fe->keyed, fe->dkey, n);
	fe->disk = n > 0;
	return n;
}

/* The host pages fe leases while it runs count in the session's and its uid's quotas, as an
 * Alloc's do: past the room left, fewer pages are fetched (as when free pages are short); with
 * no room, the Fetch is refused QUOTA_EXCEEDED. 0 or that Code with f filled. */
static int fetch_room(const struct kvp_daemon *d, const struct kvp_session *s, struct rt_fetch *fe,
		      struct kvp_fail *f)
{
	uint64_t room = kvp_session_room(d, s, fe->p);

	if (room == 0)
		return kvp_session_may_lease(d, s, fe->p, fe->n, false, f);
	if (fe->n > room)
		fe->n = (uint32_t)room;
	return 0;
}

KVP_RPC_HANDLER(kvp_rpc_fetch)
{
	const Kvpool__FetchReq *a = q->fetch;
	struct kvpd_pool *p = kvp_session_pool(d, s, a->pool_id, f);
	int keyed = a->n_keys > 0;
	struct rt_fetch *fe;
	Kvpool__FetchResp *m;
	uint32_t total, local = 0;
	size_t *lens = NULL;
	int rc;

	if (!p)
		return -(int)f->code;
	if ((a->n_keys > 0) == (a->n_tokens > 0))
		return kvp_fail(f, KVP_ERR_INVALID_ARGUMENT,
				"fetch: give tokens (token-keyed) or keys (hash-keyed), not both");
	if (a->n_tokens > UINT32_MAX / 2)
		return kvp_fail(f, KVP_ERR_INVALID_ARGUMENT, "fetch: too many tokens");
	if (keyed && (rc = kvp_rpc_keys_check(d, "fetch keys", a->keys, a->n_keys, f)) < 0)
		return rc;
	if ((rc = kvp_session_may_use_ns(d, s, p, a->namespace_, "fetch", f)) < 0)
		return rc;
	if (a->lock && (rc = kvp_session_may_lock(d, s, f)) < 0)
		return rc;
	total = keyed ? (uint32_t)a->n_keys : (uint32_t)a->n_tokens / p->conf.page_tokens;
	if (total > kvp_rpc_pages_per_reply(p))
		return kvp_rpc_reply_too_large(p, "fetch", total, f);
	if (!(fe = calloc(1, sizeof(*fe))))
		return kvp_rpc_oom(f);
	fe->d = d;
	fe->p = p;
	fe->rp = rp_find(d, p);
	fe->pool_id = a->pool_id;
	fe->ns = a->namespace_;
	fe->keyed = keyed;
	fe->lock = a->lock;
	if (keyed) {
		size_t bytes = 0, at = 0;

		for (size_t i = 0; i < a->n_keys; i++)
			bytes += a->keys[i].len;
		fe->keys = malloc(sizeof(*fe->keys) * total);
		fe->keybuf = malloc(bytes + 1);
		if (!fe->keys || !fe->keybuf) {
			fetch_free(fe);
			return kvp_rpc_oom(f);
		}
		for (uint32_t i = 0; i < total; i++) {
			memcpy(fe->keybuf + at, a->keys[i].data, a->keys[i].len);
			fe->keys[i] = (ProtobufCBinaryData){ a->keys[i].len, fe->keybuf + at };
			at += a->keys[i].len;
		}
	} else {
		fe->tokens = malloc(sizeof(uint32_t) * ((size_t)total * p->conf.page_tokens + 1));
		if (!fe->tokens) {
			fetch_free(fe);
			return kvp_rpc_oom(f);
		}
		memcpy(fe->tokens, a->tokens, sizeof(uint32_t) * total * p->conf.page_tokens);
	}
	/* Where the local cache ends now (no lock: the answer matches again). */
	m = KVP_REPLY_NEW(r, Kvpool__FetchResp, kvpool__fetch_resp__descriptor);
	fe->n = 0;
	fe->local = total;
	if (!m || (rc = fetch_match(d, s, fe, false, r, m, &local, f)) < 0) {
		fetch_free(fe);
		return m ? rc : kvp_rpc_oom(f);
	}
	fe->local = local;
	if (!rt_of(d)) {
		fetch_free(fe);
		return kvp_rpc_oom(f);
	}
	/* The disk tier's pages first (below host, above remote), else the remote tier's. */
	fe->n = disk_run(d, fe, local, total, FETCH_MAX);
	if (!fe->n)
		fe->n = fe->rp && d->remote ? total - local : 0;
	if (!fe->disk && fe->n && fe->n > kvp_remote_conf(d->remote)->match_max_pages)
		fe->n = kvp_remote_conf(d->remote)->match_max_pages;
	if (fe->n > FETCH_MAX)
		fe->n = FETCH_MAX;
	if (fe->n && (rc = fetch_room(d, s, fe, f)) < 0) {
		fetch_free(fe);
		return rc;
	}
	if (fe->n) {
		fe->ok = calloc(fe->n, 1);
		fe->rkey = malloc(sizeof(*fe->rkey) * fe->n);
		fe->gets = calloc(fe->n, sizeof(*fe->gets));
		lens = malloc(sizeof(*lens) * fe->n);
		rc = fe->ok && fe->rkey && fe->gets && lens ? 0 : -ENOMEM;
		if (rc == 0 && !fe->disk)
			rc = keyed ? hash_keys(fe->rp, fe->ns, fe->keys + local, fe->n, fe->rkey,
					       lens)
				   : token_keys(fe->rp, fe->ns, fe->tokens, local, local + fe->n,
						fe->rkey, lens);
		if (rc < 0) {
			free(lens);
			fetch_free(fe);
			return kvp_rpc_oom(f);
		}
		/* The host pages the values land in: free ones first, then evicting (and
		 * spilling) others; short of them, fewer pages are fetched. */
		while (fe->n && !fe->lease) {
			struct kvp_fail lf;

			kvp_fail_init(&lf);
			fe->lease = kvp_lease_create(p, KVP_TIER_ID_HOST,
						     kvp_daemon_new_id(d, &d->next_lease_id), fe->n,
						     &lf);
			if (!fe->lease)
				fe->n /= 2;
		}
		if (fe->lease) {
			fe->sid = s->id;
			fe->booked = fe->lease->n;
			kvp_session_fetch_held(s, p->id, fe->booked);
		}
	}
	if (!fe->n) { /* nothing to read: the local answer stands (locked when asked) */
		free(lens);
		if (a->lock) {
			kvp_reply_release(r);
			kvp_reply_init(r, q->id);
			m = KVP_REPLY_NEW(r, Kvpool__FetchResp, kvpool__fetch_resp__descriptor);
			if (!m || (rc = fetch_match(d, s, fe, true, r, m, &local, f)) < 0) {
				fetch_free(fe);
				return m ? rc : kvp_rpc_oom(f);
			}
		}
		fetch_free(fe);
		r->resp.result_case = KVPOOL__RESPONSE__RESULT_FETCH;
		r->resp.fetch = m;
		return 0;
	}
	fe->t = kvp_defer_take(&d->defers, s->id, s->uid, q->id, (int)q->call_case, f);
	if (!fe->t) {
		free(lens);
		fetch_free(fe);
		return -(int)f->code;
	}
	fe->next = d->rt->fetches;
	if (fe->next)
		fe->next->prev = fe;
	d->rt->fetches = fe;
	for (uint32_t i = 0; i < fe->n; i++) {
		fe->gets[i] = (struct rt_get){ fe, i };
		fe->pending++;
		if (fe->disk) {
			if (kvp_dt_read(d->dt, p, fe->ns, fe->keyed, &fe->dkey[i],
					fe->lease->pages[i], disk_done, &fe->gets[i]) < 0)
				fe->pending--;
			continue;
		}
		if (kvp_remote_get_page(d->remote, &fe->rp->fp, p->page_bytes, fe->rkey[i], lens[i],
					get_done, &fe->gets[i]) < 0) {
			fe->pending--;
			d->rt->fetch_misses++;
		}
	}
	free(lens);
	if (!fe->pending) /* nothing submitted: answered now, through the ticket */
		fetch_finish(fe);
	return KVP_DEFERRED;
}

uint64_t kvp_rt_leased(const struct kvp_daemon *d, const struct kvpd_pool *p)
{
	uint64_t n = 0;

	for (const struct rt_fetch *fe = d->rt ? d->rt->fetches : NULL; fe; fe = fe->next)
		if (fe->p == p && fe->lease)
			n += kvp_lease_check(fe->lease) < 0 ? UINT64_MAX / 2 : fe->lease->n;
	return n;
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

void kvp_rt_free(struct kvp_daemon *d)
{
	struct rt_pool *rp, *next;

	if (!d->rt)
		return;
	for (rp = d->rt->pools; rp; rp = next) {
		next = rp->next;
		if (pool_live(d, rp->p)) {
			kvp_index_set_spill(rp->p->ix, NULL, NULL);
			kvp_index_set_landed(rp->p->ix, NULL, NULL);
		}
		free(rp);
	}
	free(d->rt->seen);
	free(d->rt);
	d->rt = NULL;
}
