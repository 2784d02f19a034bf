/* kvpoolctl_top.c - `kvpoolctl top`: a live view of kvpoold (pools and their tiers, prefix hit
 * rates over the last interval and since the start, the KV event counters, the busiest sessions
 * by leased and locked tokens), redrawn in place with plain ANSI escapes on a terminal; printed
 * once when stdout is not a terminal. */
#include "kvpoolctl.h"

#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "names.h"

#define TOP_SESSIONS 10

struct sess_cap {
	uint32_t n;
	struct kvp_session_info *v;
};

static int sessions(struct kvp_client *c, struct sess_cap *s, struct kvp_error *e)
{
	uint32_t cap = 64;

	for (;;) {
		struct kvp_session_info *v = calloc(cap, sizeof(*v));
		int n;

		if (!v)
			return -KVP_E_NOMEM;
		v[0].struct_size = sizeof(*v);
		n = kvp_session_list(c, v, cap, e);
		if (n < 0 || (uint32_t)n <= cap) {
			if (n < 0) {
				free(v);
				return n;
			}
			s->v = v;
			s->n = (uint32_t)n;
			return 0;
		}
		free(v);
		cap = (uint32_t)n;
	}
}

static int busier(const void *a, const void *b)
{
	const struct kvp_session_info *x = a, *y = b;
	uint64_t wx = x->leased_tokens + x->locked_tokens, wy = y->leased_tokens + y->locked_tokens;

	return wx > wy ? -1 : wx < wy;
}

static uint64_t counter(const struct kvp_status *st, const char *name)
{
	for (uint32_t i = 0; i < st->n_counters; i++)
		if (strcmp(st->counters[i].name, name) == 0)
			return st->counters[i].value;
	for (uint32_t i = 0; i < st->n_more_counters; i++)
		if (strcmp(st->more_counters[i].name, name) == 0)
			return st->more_counters[i].value;
	return 0;
}

static double pct(uint64_t part, uint64_t whole)
{
	return whole ? 100.0 * (double)part / (double)whole : 0.0;
}

/* One screen; prev (may be NULL) is the status of the last one, for the interval's rates. */
static void draw(const struct kvp_status *st, const struct kvp_status *prev, struct sess_cap *s,
		 bool tty)
{
	if (tty)
		fputs("\033[H\033[2J", stdout); /* home, clear */
	printf("kvpoold %s (pid %d), up %.1f s, %u sessions, %u pools%s\n", st->daemon_version,
	       st->pid, (double)st->uptime_ms / 1e3, st->sessions, st->n_pools,
	       st->draining ? ", draining" : "");
	printf("events: %lu batches, %lu events, %lu dropped, %lu replays, %lu snapshots\n\n",
	       (unsigned long)counter(st, "events_batches"),
	       (unsigned long)counter(st, "events_published"),
	       (unsigned long)counter(st, "events_dropped"),
	       (unsigned long)counter(st, "events_replays"),
	       (unsigned long)counter(st, "events_snapshots"));
	printf("%-16s %-7s %6s %12s %12s %12s %12s %8s %8s\n", "POOL", "TIER", "USED%", "CACHED",
	       "LEASED", "FREE", "EVICTED", "HIT%", "HIT%ALL");
	for (uint32_t i = 0; i < st->n_pools; i++) {
		const struct kvp_pool_status *p = &st->pools[i];
		const struct kvp_pool_status *q = NULL;
		uint64_t dh = 0, dq = 0;

		for (uint32_t j = 0; prev && j < prev->n_pools; j++)
			if (prev->pools[j].pool_id == p->pool_id)
				q = &prev->pools[j];
		if (q && p->queried_tokens >= q->queried_tokens && p->hit_tokens >= q->hit_tokens) {
			dh = p->hit_tokens - q->hit_tokens;
			dq = p->queried_tokens - q->queried_tokens;
		}
		for (int t = 0; t < KVP_TIER_MAX; t++) {
			const struct kvp_tier_status *ts = &p->tiers[t];
			bool first = t == 0 || !p->tiers[0].present;

			if (!ts->present)
				continue;
			printf("%-16.16s %-7s %6.1f %12lu %12lu %12lu %12lu", first ? p->name : "",
			       kvp_tier_name(t),
			       pct(ts->total_tokens - ts->free_tokens, ts->total_tokens),
			       (unsigned long)ts->cached_tokens, (unsigned long)ts->leased_tokens,
			       (unsigned long)ts->free_tokens, (unsigned long)ts->evicted_tokens);
			if (first && q && dq)
				printf(" %8.1f", pct(dh, dq));
			else
				printf(" %8s", first ? "-" : "");
			if (first)
				printf(" %8.1f", pct(p->hit_tokens, p->queried_tokens));
			putchar('\n');
		}
	}
	qsort(s->v, s->n, sizeof(*s->v), busier);
	printf("\n%8s %8s %-20s %12s %12s %7s %6s %8s\n", "SESSION", "PID", "NAME", "LEASED",
	       "LOCKED", "LEASES", "LOCKS", "IDLE_S");
	for (uint32_t i = 0; i < s->n && i < TOP_SESSIONS; i++) {
		const struct kvp_session_info *x = &s->v[i];

		printf("%8lu %8d %-20.20s %12lu %12lu %7u %6u %8.1f\n",
		       (unsigned long)x->session_id, x->pid, x->name,
		       (unsigned long)x->leased_tokens, (unsigned long)x->locked_tokens, x->leases,
		       x->locks, (double)x->idle_ms / 1e3);
	}
	if (s->n > TOP_SESSIONS)
		printf("%8s (%u more)\n", "", s->n - TOP_SESSIONS);
	fflush(stdout);
}

int kvp_ctl_top(struct kvp_client *c, int argc, char **argv)
{
	struct kvp_status *st = calloc(2, sizeof(*st));
	long interval = 1000, count = -1;
	bool tty = isatty(STDOUT_FILENO);
	int rc = 0;

	if (!st)
		return 1;
	for (int i = 1; i < argc; i++) {
		if (i + 1 < argc && strcmp(argv[i], "--interval") == 0) {
			interval = strtol(argv[++i], NULL, 10);
		} else if (i + 1 < argc && strcmp(argv[i], "--count") == 0) {
			count = strtol(argv[++i], NULL, 10);
		} else {
			fprintf(stderr, "usage: kvpoolctl top [--interval MS] [--count N]\n");
			free(st);
			return 2;
		}
	}
	if (interval < 100 || count == 0) {
		fprintf(stderr,
			"kvpoolctl top: --interval is at least 100 ms, --count at least 1\n");
		free(st);
		return 2;
	}
	if (!tty && count < 0)
		count = 1; /* a pipe or a file gets one screen */
	for (long k = 0; count < 0 || k < count; k++) {
		struct kvp_status *cur = &st[k & 1], *prev = k ? &st[(k + 1) & 1] : NULL;
		struct sess_cap s = { 0 };
		struct kvp_error e;

		cur->struct_size = sizeof(*cur);
		if (kvp_client_status(c, cur, &e) < 0 || sessions(c, &s, &e) < 0) {
			fprintf(stderr, "kvpoolctl top: %s\n", e.message);
			rc = e.code >= KVP_E_NO_DAEMON ? 3 : 1;
			break;
		}
		draw(cur, prev, &s, tty);
		free(s.v);
		if (count < 0 || k + 1 < count)
			poll(NULL, 0, (int)interval);
	}
	free(st);
	return rc;
}
