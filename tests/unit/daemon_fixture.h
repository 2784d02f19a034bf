/* daemon_fixture.h - an in-process kvpoold state for unit tests (no loop, no socket): pools
 * from an INI text, sessions that have said Hello, requests served by kvp_dispatch, and a
 * prefix cache filled through the pool. Header-only: each test binary includes it once. */
#pragma once
#include <CUnit/CUnit.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "dispatch.h"
#include "fault.h"
#include "log.h"
#include "session.h"

/* A daemon with every pool of conf created; NULL when the conf or a pool fails. */
static inline struct kvp_daemon *fx_daemon(const char *conf)
{
	struct kvp_daemon *d = calloc(1, sizeof(*d));
	struct kvp_fail f = { 0 };
	char err[256];

	g_log_level = -1; /* quiet */
	if (!d || kvp_conf_load_string(&d->conf, conf, "test", err, sizeof(err)) < 0) {
		free(d);
		return NULL;
	}
	for (uint32_t i = 0; i < d->conf.n_pools; i++) {
		d->pools[i] = kvp_pool_create(&d->conf.pools[i], i, &f);
		if (!d->pools[i]) {
			for (uint32_t j = 0; j < i; j++)
				kvp_pool_destroy(d->pools[j]);
			free(d);
			return NULL;
		}
		d->n_pools++;
	}
	d->started_ms = kvp_now_ms();
	return d;
}

static inline void fx_daemon_free(struct kvp_daemon *d)
{
	if (!d)
		return;
	while (d->sessions)
		kvp_session_destroy(d, d->sessions);
	for (uint32_t i = 0; i < d->n_pools; i++)
		kvp_pool_destroy(d->pools[i]);
	free(d);
}

/* A session past Hello (admin or not). */
static inline struct kvp_session *fx_session(struct kvp_daemon *d, bool admin)
{
	struct kvp_fail f = { 0 };
	struct kvp_session *s = kvp_session_new(d, 4242, 1000, 1000, admin, &f);

	if (s)
		s->hello = true;
	return s;
}

/* Arms failure injection as KVPOOLD_FAULTS=spec would (NULL disarms). */
static inline void fx_faults(const char *spec)
{
	char err[256];

	if (spec)
		setenv("KVPOOLD_FAULTS", spec, 1);
	else
		unsetenv("KVPOOLD_FAULTS");
	CU_ASSERT_EQUAL(kvp_fault_init(err, sizeof(err)), 0);
}

/* Serves req into r (initialised here; the caller releases it). Returns the Code. */
static inline int fx_call(struct kvp_daemon *d, struct kvp_session *s, Kvpool__Request *req,
			  struct kvp_reply *r)
{
	kvp_reply_init(r, 7);
	return kvp_dispatch(d, s, req, r);
}

/* Caches ntokens tokens (tokens[i] = base + i, whole pages) in pool p's tier through a lease
 * that is gone afterwards. Returns the pages cached, or -1. */
static inline int fx_cache(struct kvpd_pool *p, int tier, uint64_t ns, uint32_t base,
			   uint32_t ntokens)
{
	uint32_t npages = ntokens / p->conf.page_tokens;
	uint32_t *tokens = malloc(sizeof(*tokens) * (ntokens + 1));
	struct kvp_fail f = { 0 };
	struct kvp_lease *l;
	uint64_t newt = 0, dup = 0;
	int rc = -1;

	if (!tokens)
		return -1;
	for (uint32_t i = 0; i < ntokens; i++)
		tokens[i] = base + i;
	l = kvp_lease_create(p, tier, 999999, npages, &f);
	if (l &&
	    kvp_lease_insert(l, ns, tokens, ntokens, 0, l->pages, npages, &newt, &dup, &f) == 0)
		rc = (int)(newt / p->conf.page_tokens);
	kvp_lease_destroy(l);
	free(tokens);
	return rc;
}
