/* rpc_fetch.c - the calls that reach below the host tier (below.h): a Match's or MatchKeys'
 * count of the pages after the local ones that the tiers below hold (the disk tier's at once,
 * else the remote tier's in a deferred reply), and Fetch, which reads them into leased host
 * pages and caches them, from the disk tier when it holds the next pages, else from the remote
 * tier. The tiers (disk_tier.h, remote_tier.h) answer through callbacks; replies, tickets and
 * sessions stay here. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "defer.h"
#include "disk_tier.h"
#include "pool_cache.h"
#include "remote_tier.h"
#include "rpc.h"

/* Pages one Fetch reads at most, whatever the tier's own bound says. */
#define FETCH_MAX 4096

/* ---- Match: how many pages after the local ones the tier below holds ---- */

/* A Match waiting for the tier's answer. */
struct match_wait {
	struct kvp_daemon *d;
	struct kvp_defer *t;
	struct kvpd_pool *p; /* the Match's pool (its id p->id), checked again at the answer */
	int keyed;
	uint64_t matched, lock_id;
	uint32_t ndev, nhost;
	uint32_t *pages; /* ndev device ids, then nhost host ids */
};

static void wait_free(struct match_wait *w)
{
	free(w->pages);
	free(w);
}

/* Whether w's session still holds what its answer names: the pool attached and the lock (when
 * one was taken) still its. A reload that revoked the session's access detached it meanwhile
 * (its lock and pages went back then), as may the session's own Detach: NULL then, and the
 * session (when it exists) in *sp. */
static struct kvp_lock *wait_lock(struct match_wait *w, struct kvp_session **sp, bool *ok)
{
	struct kvp_daemon *d = w->d;
	struct kvp_session *s = kvp_rpc_session_by_id(d, w->t->session_id);
	struct kvp_lock *k = NULL;
	struct kvp_fail f;

	if (s && s->evicted) /* a reload closes it: as good as ended */
		s = NULL;
	*sp = s;
	*ok = false;
	if (!s || !kvp_daemon_has_pool(d, w->p) || d->pools[w->p->id] != w->p ||
	    !s->attached[w->p->id])
		return NULL;
	kvp_fail_init(&f);
	if (w->lock_id && (!(k = kvp_session_lock(s, w->lock_id, &f)) || k->pool != w->p))
		return NULL;
	*ok = true;
	return k;
}

/* The tier's answer (kvp_below_held_fn): the local answer goes with remote_pages set. */
static void wait_answer(void *arg, uint32_t remote)
{
	struct match_wait *w = arg;
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
		wait_free(w);
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
	wait_free(w);
}

/* After a local Match (keyed 0) or MatchKeys (1) answered with local pages (dev[], host[], lock
 * booked already): when `total` pages were asked and the tier below serves p, its count of the
 * next ones is asked and the reply parked (KVP_DEFERRED). Otherwise 0: the local answer
 * stands. Never fails the call: a query that cannot be asked is remote_pages 0. */
static int match_below(struct kvp_daemon *d, struct kvp_session *s, const Kvpool__Request *q,
		       struct kvpd_pool *p, const struct kvp_below_run *run, uint64_t matched,
		       uint64_t lock_id, const uint32_t *dev, uint32_t ndev, const uint32_t *host,
		       uint32_t nhost)
{
	struct match_wait *w = calloc(1, sizeof(*w));
	struct kvp_fail f;

	if (!w || !(w->pages = malloc(sizeof(uint32_t) * ((size_t)ndev + nhost + 1)))) {
		free(w);
		return 0;
	}
	*w = (struct match_wait){ .d = d,
				  .p = p,
				  .keyed = run->keyed,
				  .matched = matched,
				  .lock_id = lock_id,
				  .ndev = ndev,
				  .nhost = nhost,
				  .pages = w->pages };
	memcpy(w->pages, dev, sizeof(uint32_t) * ndev);
	memcpy(w->pages + ndev, host, sizeof(uint32_t) * nhost);
	kvp_fail_init(&f);
	/* The ticket first: the tier's answer may not come before it (it never comes at once). */
	w->t = kvp_defer_take(&d->defers, s->id, s->uid, q->id, (int)q->call_case, &f);
	if (!w->t) {
		wait_free(w);
		return 0;
	}
	if (kvp_rt_query(d, p, run, wait_answer, w) < 0) {
		kvp_defer_drop(&d->defers, w->t);
		wait_free(w);
		return 0;
	}
	return KVP_DEFERRED;
}

int kvp_rpc_match_below(struct kvp_daemon *d, struct kvp_session *s, const Kvpool__Request *q,
			struct kvpd_pool *p, Kvpool__MatchResp *m)
{
	const Kvpool__MatchReq *a = q->match;
	uint32_t local = (uint32_t)(m->n_device_pages + m->n_host_pages), total, max;
	struct kvp_below_run run = { .ns = a->namespace_, .tokens = a->tokens, .from = local };

	total = (uint32_t)(a->n_tokens / p->conf.page_tokens);
	if (total <= local)
		return 0;
	run.n = total - local; /* the disk tier's count first: no I/O, the answer goes now */
	if ((m->disk_pages = kvp_dt_held(d->dt, p, &run))) {
		m->remote_pages = a->local_only ? 0 : m->disk_pages;
		return 0;
	}
	if (a->local_only || !(max = kvp_rt_serves(d, p)))
		return 0;
	run.n = total - local < max ? total - local : max;
	return match_below(d, s, q, p, &run, m->matched_tokens, m->lock_id, m->device_pages,
			   (uint32_t)m->n_device_pages, m->host_pages, (uint32_t)m->n_host_pages);
}

int kvp_rpc_match_keys_below(struct kvp_daemon *d, struct kvp_session *s, const Kvpool__Request *q,
			     struct kvpd_pool *p, Kvpool__MatchKeysResp *m)
{
	const Kvpool__MatchKeysReq *a = q->match_keys;
	uint32_t local = m->matched_keys, max;
	struct kvp_below_run run = { .ns = a->namespace_, .keyed = 1, .from = local };
	struct kvp_key *keys;
	int rc;

	if (a->n_keys <= local || !(keys = malloc(sizeof(*keys) * a->n_keys)))
		return 0;
	for (uint32_t i = 0; i < a->n_keys; i++)
		keys[i] = (struct kvp_key){ a->keys[i].len, a->keys[i].data };
	run.keys = keys;
	run.n = (uint32_t)(a->n_keys - local); /* the disk tier's count first, as for Match */
	if ((m->disk_pages = kvp_dt_held(d->dt, p, &run))) {
		m->remote_pages = a->local_only ? 0 : m->disk_pages;
		free(keys);
		return 0;
	}
	if (a->local_only || !(max = kvp_rt_serves(d, p))) {
		free(keys);
		return 0;
	}
	run.n = a->n_keys - local < max ? (uint32_t)(a->n_keys - local) : max;
	rc = match_below(d, s, q, p, &run, m->matched_keys, m->lock_id, m->device_pages,
			 (uint32_t)m->n_device_pages, m->host_pages, (uint32_t)m->n_host_pages);
	free(keys); /* the tier made its keys already */
	return rc;
}

/* ---- Fetch ---- */

/* One Fetch in flight. */
struct fetch {
	struct kvp_daemon *d;
	struct kvp_defer *t;
	struct kvpd_pool *p;
	uint32_t pool_id;
	uint64_t ns;
	int keyed, lock;
	bool disk;	      /* the pages come from p's disk tier, not the remote tier */
	uint32_t *tokens;     /* token-keyed: (local + n) whole pages of tokens */
	struct kvp_key *keys; /* hash-keyed: local + n keys (copies in keybuf) */
	uint8_t *keybuf;
	uint32_t local, n, pending;
	struct kvp_lease *lease; /* n host pages the values land in */
	uint32_t leased;	 /* its pages in d->fetch_leased until it goes */
	uint64_t sid;		 /* the session whose quotas count the lease's pages */
	uint32_t booked;	 /* those pages, until the answer (0: none) */
	uint8_t *ok;
};

/* The lease's pages stop counting in the session's quotas (a session gone took its count). */
static void fetch_unbook(struct fetch *fe)
{
	struct kvp_session *s;

	if (!fe->booked)
		return;
	s = kvp_rpc_session_by_id(fe->d, fe->sid);
	if (s)
		kvp_session_fetch_held(s, fe->p->id, -(int64_t)fe->booked);
	fe->booked = 0;
}

static void fetch_free(struct fetch *fe)
{
	fetch_unbook(fe);
	fe->d->fetch_leased[fe->pool_id] -= fe->leased; /* cached or freed now */
	kvp_lease_destroy(fe->lease);
	free(fe->tokens);
	free(fe->keys);
	free(fe->keybuf);
	free(fe->ok);
	free(fe);
}

/* The local match of what fe asks, locked when lock; fills the Fetch reply's page fields. */
static int fetch_match(struct kvp_daemon *d, struct kvp_session *s, struct fetch *fe, bool lock,
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
	if (fe->keyed)
		rc = kvp_pool_match_keys(p, fe->ns, fe->keys, n, lock, &mt, m->device_pages,
					 m->host_pages);
	else
		rc = kvp_pool_match(p, fe->ns, fe->tokens, n * p->conf.page_tokens, lock, &mt,
				    m->device_pages, m->host_pages);
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
static uint32_t fetch_insert(struct fetch *fe)
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
		uint32_t nw = 0, dup = 0, done = 0;

		c = kvp_pool_exists_keys(p, fe->ns, fe->keys, ntot);
		rc = c >= fe->local && c < ntot
			     ? kvp_lease_insert_keys(fe->lease, fe->ns, fe->keys, ntot, c,
						     fe->lease->pages + (c - fe->local), ntot - c,
						     &nw, &dup, &done, &f)
			     : -1;
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

static void fetch_finish(struct fetch *fe)
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
	if (!s || !kvp_daemon_has_pool(d, fe->p)) {
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

/* A read of page i ended (kvp_below_read_fn). */
static void fetch_read(void *arg, uint32_t i, bool ok)
{
	struct fetch *fe = arg;

	fe->ok[i] = ok;
	if (--fe->pending == 0)
		fetch_finish(fe);
}

/* The host pages fe leases while it runs count in the session's and its uid's quotas, as an
 * Alloc's do: past the room left, fewer pages are fetched (as when free pages are short); with
 * no room, the Fetch is refused QUOTA_EXCEEDED. 0 or that Code with f filled. */
static int fetch_room(const struct kvp_daemon *d, const struct kvp_session *s, struct fetch *fe,
		      struct kvp_fail *f)
{
	uint64_t room = kvp_session_room(d, s, fe->p);

	if (room == 0)
		return kvp_session_may_lease(d, s, fe->p, fe->n, false, f);
	if (fe->n > room)
		fe->n = (uint32_t)room;
	return 0;
}

/* fe's copy of the call's tokens or keys. 0 or -ENOMEM. */
static int fetch_copy(struct fetch *fe, const Kvpool__FetchReq *a, uint32_t total)
{
	if (fe->keyed) {
		size_t bytes = 0, at = 0;

		for (size_t i = 0; i < a->n_keys; i++)
			bytes += a->keys[i].len;
		fe->keys = malloc(sizeof(*fe->keys) * total);
		fe->keybuf = malloc(bytes + 1);
		if (!fe->keys || !fe->keybuf)
			return -ENOMEM;
		for (uint32_t i = 0; i < total; i++) {
			memcpy(fe->keybuf + at, a->keys[i].data, a->keys[i].len);
			fe->keys[i] = (struct kvp_key){ a->keys[i].len, fe->keybuf + at };
			at += a->keys[i].len;
		}
		return 0;
	}
	fe->tokens = malloc(sizeof(uint32_t) * ((size_t)total * fe->p->conf.page_tokens + 1));
	if (!fe->tokens)
		return -ENOMEM;
	memcpy(fe->tokens, a->tokens, sizeof(uint32_t) * total * fe->p->conf.page_tokens);
	return 0;
}

/* The host pages the values land in: free ones first, then evicting (and spilling) others;
 * short of them, fewer pages are fetched (fe->n 0: none). */
static void fetch_lease(struct kvp_daemon *d, struct kvp_session *s, struct fetch *fe)
{
	while (fe->n && !fe->lease) {
		struct kvp_fail lf;

		kvp_fail_init(&lf);
		fe->lease = kvp_lease_create(fe->p, KVP_TIER_ID_HOST,
					     kvp_daemon_new_id(d, &d->next_lease_id), fe->n, &lf);
		if (!fe->lease)
			fe->n /= 2;
	}
	if (!fe->lease)
		return;
	fe->leased = fe->lease->n;
	d->fetch_leased[fe->pool_id] += fe->leased;
	fe->sid = s->id;
	fe->booked = fe->lease->n;
	kvp_session_fetch_held(s, fe->p->id, fe->booked);
}

KVP_RPC_HANDLER(kvp_rpc_fetch)
{
	const Kvpool__FetchReq *a = q->fetch;
	struct kvpd_pool *p = kvp_session_pool(d, s, a->pool_id, f);
	struct kvp_below_run run;
	struct fetch *fe;
	Kvpool__FetchResp *m;
	uint32_t total, local = 0, max;
	int rc;

	if (!p)
		return -(int)f->code;
	if ((a->n_keys > 0) == (a->n_tokens > 0))
		return kvp_fail(f, KVP_ERR_INVALID_ARGUMENT,
				"fetch: give tokens (token-keyed) or keys (hash-keyed), not both");
	if (a->n_tokens > UINT32_MAX / 2)
		return kvp_fail(f, KVP_ERR_INVALID_ARGUMENT, "fetch: too many tokens");
	if (a->n_keys > 0 && (rc = kvp_rpc_keys_check(d, "fetch keys", a->keys, a->n_keys, f)) < 0)
		return rc;
	if ((rc = kvp_session_may_use_ns(d, s, p, a->namespace_, "fetch", f)) < 0)
		return rc;
	if (a->lock && (rc = kvp_session_may_lock(d, s, f)) < 0)
		return rc;
	total = a->n_keys > 0 ? (uint32_t)a->n_keys : (uint32_t)a->n_tokens / p->conf.page_tokens;
	if (total > kvp_rpc_pages_per_reply(p))
		return kvp_rpc_reply_too_large(p, "fetch", total, f);
	if (!(fe = calloc(1, sizeof(*fe))))
		return kvp_rpc_oom(f);
	*fe = (struct fetch){ .d = d,
			      .p = p,
			      .pool_id = a->pool_id,
			      .ns = a->namespace_,
			      .keyed = a->n_keys > 0,
			      .lock = a->lock };
	if (fetch_copy(fe, a, total) < 0) {
		fetch_free(fe);
		return kvp_rpc_oom(f);
	}
	/* Where the local cache ends now (no lock: the answer matches again). */
	m = KVP_REPLY_NEW(r, Kvpool__FetchResp, kvpool__fetch_resp__descriptor);
	fe->local = total;
	if (!m || (rc = fetch_match(d, s, fe, false, r, m, &local, f)) < 0) {
		fetch_free(fe);
		return m ? rc : kvp_rpc_oom(f);
	}
	fe->local = local;
	/* The disk tier's pages first (below host, above remote), else the remote tier's. */
	run = (struct kvp_below_run){ .ns = fe->ns,
				      .keyed = fe->keyed,
				      .tokens = fe->tokens,
				      .keys = fe->keys,
				      .from = local,
				      .n = total - local };
	if (total > local && (fe->n = kvp_dt_held(d->dt, p, &run))) {
		fe->disk = true;
	} else {
		max = kvp_rt_serves(d, p);
		fe->n = total - local < max ? total - local : max;
	}
	if (fe->n > FETCH_MAX)
		fe->n = FETCH_MAX;
	if (fe->n && (rc = fetch_room(d, s, fe, f)) < 0) {
		fetch_free(fe);
		return rc;
	}
	if (fe->n && !(fe->ok = calloc(fe->n, 1))) {
		fetch_free(fe);
		return kvp_rpc_oom(f);
	}
	fetch_lease(d, s, fe);
	if (!fe->n) { /* nothing to read: the local answer stands (locked when asked) */
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
		fetch_free(fe);
		return -(int)f->code;
	}
	run = (struct kvp_below_run){ .ns = fe->ns,
				      .keyed = fe->keyed,
				      .tokens = fe->tokens,
				      .keys = fe->keys,
				      .from = local,
				      .n = fe->n };
	rc = fe->disk ? kvp_dt_read(d->dt, p, &run, fe->lease->pages, fetch_read, fe)
		      : kvp_rt_read(d, p, &run, fe->lease->pages, fetch_read, fe);
	fe->pending = rc > 0 ? (uint32_t)rc : 0;
	if (!fe->pending) /* nothing went out: answered now, through the ticket */
		fetch_finish(fe);
	return KVP_DEFERRED;
}
