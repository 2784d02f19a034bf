/* kvpoolctl.c - inspect and steer a running kvpoold. */
#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "kvpool.h"
#include "kvpoolctl.h"
#include "names.h"
#include "units.h"

enum { EXIT_OK = 0, EXIT_REFUSED = 1, EXIT_USAGE = 2, EXIT_NO_DAEMON = 3 };

static int g_json;

/* Library-style failure for kvpoolctl's own errors (out of memory). */
static int ctl_fail(struct kvp_error *e, int code, int sys_errno, const char *what)
{
	memset(e, 0, sizeof(*e));
	e->code = code;
	e->sys_errno = sys_errno;
	snprintf(e->message, sizeof(e->message), "%s", what);
	return -code;
}

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: kvpoolctl [--socket PATH] [--json] COMMAND [ARGS]\n"
		"Inspect and steer kvpoold.\n\n"
		"Commands:\n"
		"  status                 daemon, pools and per-tier token counts\n"
		"  ping                   one round trip\n"
		"  pools                  pools with geometry, backends and sizes\n"
		"  sessions               connected sessions: pid, uid, name, leased/locked tokens, "
		"age\n"
		"  cache [POOL]           page index statistics and top cached pages by hits\n"
		"  evict POOL TOKENS [--tier device|host]   evict cached prefixes (admin)\n"
		"  flush POOL             drop every unlocked cached prefix (admin)\n"
		"  drain [--deadline DURATION]  refuse new leases and non-admin connections, exit when\n"
		"                         sessions end or at the deadline (30s, 500ms, 5m; a bare\n"
		"                         number is ms; default 30s) (admin)\n"
		"  drain --cancel         end a drain: serve as before (admin)\n"
		"  reload                 re-read the configuration file and print what changed, once "
		"applied (admin)\n"
		"  metrics                Prometheus text exposition\n"
		"  top [--interval MS] [--count N]   live view of pools, tiers, hit rates and the\n"
		"                         busiest sessions (one screen when not on a terminal)\n"
		"  events ENDPOINT [--topic T] [--replay ENDPOINT [--from SEQ | --snapshot]]\n"
		"         [--count BATCHES] [--timeout MS]   kvpoold's KV events ([events]) as\n"
		"                         readable lines (--json: one object a line)\n"
		"  check-config FILE      validate a config and print its memory plan, starting "
		"nothing\n\n"
		"Options:\n"
		"  -s, --socket PATH   kvpoold's socket (default: $KVPOOL_SOCKET, " KVP_ROOT_SOCKET
		"\n"
		"                      as root, else $XDG_RUNTIME_DIR/kvpool/kvpoold.sock)\n"
		"  -j, --json          one JSON object on stdout, stable field names\n"
		"  -h, --help          this text\n\n"
		"Exit status: 0 success; 1 kvpoold refused the call (the typed error is printed) or\n"
		"refused part of a reload (nothing was applied);\n"
		"2 usage error or invalid config; 3 no kvpoold reachable or the connection failed.\n");
}

/* drain's flags: --deadline DURATION (units.h: "30s", "500ms", "2m"; a bare number is ms; at
 * most what the wire's uint32 of ms holds) and --cancel. -1, with the reason printed, when
 * they are wrong. */
static int drain_args(int argc, char **argv, uint64_t *ms, bool *cancel)
{
	for (int i = 1; i < argc; i++) {
		int r;

		if (strcmp(argv[i], "--cancel") == 0) {
			*cancel = true;
			continue;
		}
		if (strcmp(argv[i], "--deadline") != 0) {
			fprintf(stderr, "kvpoolctl: drain: unexpected '%s'\n", argv[i]);
			return -1;
		}
		if (i + 1 >= argc) {
			fprintf(stderr, "kvpoolctl: drain: --deadline needs a duration (30s)\n");
			return -1;
		}
		r = kvp_units_duration_ms(argv[++i], 1, UINT32_MAX, ms);
		if (r == -ERANGE) {
			fprintf(stderr,
				"kvpoolctl: drain: --deadline '%s' is longer than the %lu ms (about "
				"49 days) kvpoold takes\n",
				argv[i], (unsigned long)UINT32_MAX);
			return -1;
		}
		if (r < 0) {
			fprintf(stderr,
				"kvpoolctl: drain: --deadline '%s' is not a duration (a number of ms, "
				"or with a unit: 500ms, 30s, 5m, 1h)\n",
				argv[i]);
			return -1;
		}
	}
	return 0;
}

static int report(const struct kvp_error *e)
{
	if (g_json) {
		printf("{\"error\":{\"code\":\"%s\",\"message\":", kvp_code_name(e->code));
		kvp_json_str(stdout, e->message);
		printf("}}\n");
	}
	fprintf(stderr, "kvpoolctl: %s: %s\n", kvp_code_name(e->code), e->message);
	return e->code >= KVP_E_NO_DAEMON && e->code != KVP_E_BUFFER ? EXIT_NO_DAEMON
								     : EXIT_REFUSED;
}

static void json_str(const char *s)
{
	kvp_json_str(stdout, s);
}

static void json_geometry(const struct kvp_geometry *g)
{
	printf("{\"layers\":%u,\"kv_heads\":%u,\"head_dim\":%u,\"dtype\":\"%s\",\"page_tokens\":%u}",
	       g->layers, g->kv_heads, g->head_dim, kvp_dtype_name((int)g->dtype), g->page_tokens);
}

static void json_counter_list(const struct kvp_counter *c, uint32_t n, int first)
{
	for (uint32_t i = 0; i < n; i++) {
		printf("%s", i || !first ? "," : "");
		json_str(c[i].name);
		printf(":%lu", (unsigned long)c[i].value);
	}
}

static void json_counters(const struct kvp_counter *c, uint32_t n)
{
	printf("{");
	json_counter_list(c, n, 1);
	printf("}");
}

/* The counter rows: whatever the daemon's stats table lists, in its order. */
static void text_counters(const char *indent, const struct kvp_counter *c, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		printf("%s%-24s %14lu\n", indent, c[i].name, (unsigned long)c[i].value);
}

static void json_pool(const struct kvp_pool_status *p, const uint64_t *moving)
{
	int first = 1;

	printf("{\"name\":");
	json_str(p->name);
	printf(",\"pool_id\":%u,\"geometry\":", p->pool_id);
	json_geometry(&p->geometry);
	printf(",\"token_bytes\":%lu,\"sessions\":%u,\"session_quota_tokens\":%lu,\"eviction\":",
	       (unsigned long)p->token_bytes, p->sessions, (unsigned long)p->session_quota_tokens);
	json_str(p->eviction);
	printf(",\"tiers\":[");
	for (int t = 0; t < KVP_TIER_MAX; t++) {
		const struct kvp_tier_status *s = &p->tiers[t];

		if (!s->present)
			continue;
		printf("%s{\"tier\":\"%s\",\"backend\":\"%s\",\"numa_node\":%d,"
		       "\"total_tokens\":%lu,\"free_tokens\":%lu,\"leased_tokens\":%lu,"
		       "\"cached_tokens\":%lu,\"evictable_tokens\":%lu,\"protected_tokens\":%lu,"
		       "\"moving_tokens\":%lu,\"evicted_tokens\":%lu}",
		       first ? "" : ",", kvp_tier_name(t), kvp_backend_name((int)s->backend),
		       s->numa_node, (unsigned long)s->total_tokens, (unsigned long)s->free_tokens,
		       (unsigned long)s->leased_tokens, (unsigned long)s->cached_tokens,
		       (unsigned long)s->evictable_tokens, (unsigned long)s->protected_tokens,
		       (unsigned long)moving[t], (unsigned long)s->evicted_tokens);
		first = 0;
	}
	printf("],\"cache\":{\"nodes\":%lu,\"hit_tokens\":%lu,\"queried_tokens\":%lu,"
	       "\"demoted_tokens\":%lu,\"promoted_tokens\":%lu},"
	       "\"allocs\":%lu,\"frees\":%lu,\"alloc_failures\":%lu,\"counters\":",
	       (unsigned long)p->nodes, (unsigned long)p->hit_tokens,
	       (unsigned long)p->queried_tokens, (unsigned long)p->demoted_tokens,
	       (unsigned long)p->promoted_tokens, (unsigned long)p->allocs, (unsigned long)p->frees,
	       (unsigned long)p->alloc_failures);
	json_counters(p->counters, p->n_counters);
	printf("}");
}

static void text_pool(const struct kvp_pool_status *p, const uint64_t *moving)
{
	const struct kvp_geometry *g = &p->geometry;

	printf("pool %s (id %u): %u layers, %u kv heads, head dim %u, %s, %u tokens/page, "
	       "%lu B/token, %u sessions, eviction %s\n",
	       p->name, p->pool_id, g->layers, g->kv_heads, g->head_dim,
	       kvp_dtype_name((int)g->dtype), g->page_tokens, (unsigned long)p->token_bytes,
	       p->sessions, p->eviction);
	printf("  %-7s %-6s %12s %12s %12s %12s %12s %12s %12s\n", "tier", "backend", "total",
	       "free", "leased", "cached", "moving", "evictable", "protected");
	for (int t = 0; t < KVP_TIER_MAX; t++) {
		const struct kvp_tier_status *s = &p->tiers[t];

		if (!s->present)
			continue;
		printf("  %-7s %-6s %12lu %12lu %12lu %12lu %12lu %12lu %12lu\n", kvp_tier_name(t),
		       kvp_backend_name((int)s->backend), (unsigned long)s->total_tokens,
		       (unsigned long)s->free_tokens, (unsigned long)s->leased_tokens,
		       (unsigned long)s->cached_tokens, (unsigned long)moving[t],
		       (unsigned long)s->evictable_tokens, (unsigned long)s->protected_tokens);
	}
}

static struct kvp_status *get_status(struct kvp_client *c, int *rc)
{
	struct kvp_status *s = calloc(1, sizeof(*s));
	struct kvp_error e;

	if (!s) {
		ctl_fail(&e, KVP_E_NOMEM, ENOMEM, "out of memory");
		*rc = report(&e);
		return NULL;
	}
	s->struct_size = sizeof(*s);
	if (kvp_client_status(c, s, &e) < 0) {
		free(s);
		*rc = report(&e);
		return NULL;
	}
	return s;
}

static int cmd_status(struct kvp_client *c, int pools_only)
{
	struct kvp_status *s;
	int r;

	if (!(s = get_status(c, &r)))
		return r;
	if (g_json) {
		printf("{\"daemon_version\":");
		json_str(s->daemon_version);
		printf(",\"pid\":%d,\"uptime_ms\":%lu,\"sessions\":%u,\"draining\":%s,\"pools\":[",
		       s->pid, (unsigned long)s->uptime_ms, s->sessions,
		       s->draining ? "true" : "false");
		for (uint32_t i = 0; i < s->n_pools; i++) {
			if (i)
				putchar(',');
			json_pool(&s->pools[i], s->moving_tokens[i]);
		}
		printf("],\"counters\":{");
		json_counter_list(s->counters, s->n_counters, 1);
		json_counter_list(s->more_counters, s->n_more_counters, !s->n_counters);
		printf("}}\n");
	} else {
		if (!pools_only)
			printf("kvpoold %s (pid %d), up %.1f s, %u sessions%s, %u pools\n",
			       s->daemon_version, s->pid, (double)s->uptime_ms / 1e3, s->sessions,
			       s->draining ? ", draining" : "", s->n_pools);
		for (uint32_t i = 0; i < s->n_pools; i++) {
			text_pool(&s->pools[i], s->moving_tokens[i]);
			if (!pools_only)
				text_counters("    ", s->pools[i].counters, s->pools[i].n_counters);
		}
		if (!pools_only) {
			printf("daemon counters:\n");
			text_counters("    ", s->counters, s->n_counters);
			text_counters("    ", s->more_counters, s->n_more_counters);
		}
	}
	free(s);
	return EXIT_OK;
}

/* Calls a listing until its array holds every entry. Returns the count (entries in *out, free
 * it) or a negative code with e filled. */
typedef int (*list_fn)(struct kvp_client *c, const void *arg, void *entries, uint32_t cap,
		       struct kvp_error *e);

static int list_all(struct kvp_client *c, list_fn fn, const void *arg, size_t size, void **out,
		    struct kvp_error *e)
{
	uint32_t cap = 64;

	for (;;) {
		void *v = calloc(cap, size);
		int n;

		if (!v)
			return ctl_fail(e, KVP_E_NOMEM, ENOMEM, "out of memory");
		*(size_t *)v = size;
		n = fn(c, arg, v, cap, e);
		if (n < 0 || (uint32_t)n <= cap) {
			if (n < 0)
				free(v);
			else
				*out = v;
			return n;
		}
		free(v);
		cap = (uint32_t)n;
	}
}

static int sessions_fn(struct kvp_client *c, const void *arg, void *entries, uint32_t cap,
		       struct kvp_error *e)
{
	(void)arg;
	return kvp_session_list(c, entries, cap, e);
}

static int cache_fn(struct kvp_client *c, const void *arg, void *entries, uint32_t cap,
		    struct kvp_error *e)
{
	return kvp_cache_list(c, arg, entries, cap, e);
}

static int reload_fn(struct kvp_client *c, const void *arg, void *entries, uint32_t cap,
		     struct kvp_error *e)
{
	(void)arg;
	return kvp_admin_reload(c, entries, cap, e);
}

static int cmd_sessions(struct kvp_client *c)
{
	struct kvp_session_info *v;
	struct kvp_error e;
	int n = list_all(c, sessions_fn, NULL, sizeof(*v), (void **)&v, &e);

	if (n < 0)
		return report(&e);
	if (g_json)
		printf("{\"sessions\":[");
	else
		printf("%8s %8s %6s %-20s %12s %12s %7s %6s %10s\n", "session", "pid", "uid",
		       "name", "leased", "locked", "leases", "locks", "age_s");
	for (int i = 0; i < n; i++) {
		const struct kvp_session_info *s = &v[i];

		if (g_json) {
			printf("%s{\"session_id\":%lu,\"pid\":%d,\"uid\":%u,\"gid\":%u,\"name\":",
			       i ? "," : "", (unsigned long)s->session_id, s->pid, s->uid, s->gid);
			json_str(s->name);
			printf(",\"leased_tokens\":%lu,\"locked_tokens\":%lu,\"leases\":%u,"
			       "\"locks\":%u,\"age_ms\":%lu,\"idle_ms\":%lu}",
			       (unsigned long)s->leased_tokens, (unsigned long)s->locked_tokens,
			       s->leases, s->locks, (unsigned long)s->age_ms,
			       (unsigned long)s->idle_ms);
		} else {
			printf("%8lu %8d %6u %-20.20s %12lu %12lu %7u %6u %10.1f\n",
			       (unsigned long)s->session_id, s->pid, s->uid, s->name,
			       (unsigned long)s->leased_tokens, (unsigned long)s->locked_tokens,
			       s->leases, s->locks, (double)s->age_ms / 1e3);
		}
	}
	if (g_json)
		printf("]}\n");
	free(v);
	return EXIT_OK;
}

/* A daemon counter, or -1 when the daemon has none of that name. */
static int64_t daemon_counter(const struct kvp_status *s, const char *name)
{
	for (uint32_t i = 0; i < s->n_counters; i++)
		if (strcmp(s->counters[i].name, name) == 0)
			return (int64_t)s->counters[i].value;
	for (uint32_t i = 0; i < s->n_more_counters; i++)
		if (strcmp(s->more_counters[i].name, name) == 0)
			return (int64_t)s->more_counters[i].value;
	return -1;
}

/* The disk tier's line of `kvpoolctl cache` (all pools' disks together), when there is one. */
static void disk_line(const struct kvp_status *s)
{
	static const char *const names[] = { "disk_pages",
					     "disk_bytes",
					     "disk_capacity_pages",
					     "disk_read_pages",
					     "disk_written_pages",
					     "disk_write_dropped",
					     "disk_queue_depth",
					     "disk_corrupt_pages",
					     "disk_io_errors",
					     "disk_adopted_pages",
					     "disk_adopted_from_log",
					     "disk_log_bytes",
					     "disk_write_inplace" };
	int64_t v[sizeof(names) / sizeof(names[0])];

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if ((v[i] = daemon_counter(s, names[i])) < 0)
			return;
	if (g_json) {
		printf(",\"disk\":{");
		for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
			printf("%s\"%s\":%ld", i ? "," : "", names[i] + 5, (long)v[i]);
		printf("}");
		return;
	}
	printf("disk tier: %ld of %ld pages (%ld bytes), %ld read, %ld written (%ld in place), %ld "
	       "dropped, queue depth %ld, %ld corrupt, %ld I/O errors; %ld adopted at start (%ld "
	       "pools from their log, the rest from the slot headers), %ld bytes of log\n",
	       (long)v[0], (long)v[2], (long)v[1], (long)v[3], (long)v[4], (long)v[12], (long)v[5],
	       (long)v[6], (long)v[7], (long)v[8], (long)v[9], (long)v[10], (long)v[11]);
}

static int cmd_cache(struct kvp_client *c, const char *pool)
{
	struct kvp_cache_prefix *top;
	struct kvp_status *s;
	struct kvp_error e;
	const char *first = NULL;
	int n, r;

	/* the top prefixes first: they say whether the pool exists */
	n = list_all(c, cache_fn, pool ? pool : "", sizeof(*top), (void **)&top, &e);
	if (n < 0)
		return report(&e);
	if (!(s = get_status(c, &r))) {
		free(top);
		return r;
	}
	if (g_json)
		printf("{\"pools\":[");
	for (uint32_t i = 0, k = 0; i < s->n_pools; i++) {
		const struct kvp_pool_status *p = &s->pools[i];

		if (pool && pool[0] && strcmp(pool, p->name) != 0)
			continue;
		if (!first)
			first = p->name;
		if (g_json) {
			if (k++)
				putchar(',');
			json_pool(p, s->moving_tokens[i]);
			continue;
		}
		text_pool(p, s->moving_tokens[i]);
		printf("  prefix cache: %lu nodes, hit %lu of %lu queried tokens (%.1f%%), "
		       "%lu demoted, %lu promoted\n",
		       (unsigned long)p->nodes, (unsigned long)p->hit_tokens,
		       (unsigned long)p->queried_tokens,
		       p->queried_tokens ? 100.0 * (double)p->hit_tokens / (double)p->queried_tokens
					 : 0.0,
		       (unsigned long)p->demoted_tokens, (unsigned long)p->promoted_tokens);
	}
	if (g_json)
		printf("]");
	disk_line(s);
	if (g_json) {
		printf(",\"top\":[");
		for (int i = 0; i < n; i++)
			printf("%s{\"tokens\":%lu,\"hits\":%lu,\"namespace\":%lu,\"kind\":\"%s\"}",
			       i ? "," : "", (unsigned long)top[i].tokens,
			       (unsigned long)top[i].hits, (unsigned long)top[i].ns,
			       top[i].keyed ? "keys" : "tokens");
		printf("]}\n");
	} else if (n) {
		printf("top cached pages of pool %s:\n  %10s %10s %10s %6s\n", first ? first : "?",
		       "tokens", "hits", "namespace", "kind");
		for (int i = 0; i < n; i++)
			printf("  %10lu %10lu %10lu %6s\n", (unsigned long)top[i].tokens,
			       (unsigned long)top[i].hits, (unsigned long)top[i].ns,
			       top[i].keyed ? "keys" : "tokens");
	}
	free(top);
	free(s);
	return EXIT_OK;
}

static int cmd_reload(struct kvp_client *c)
{
	struct kvp_reload_item *v;
	struct kvp_error e;
	int refused = 0, n = list_all(c, reload_fn, NULL, sizeof(*v), (void **)&v, &e);

	if (n < 0)
		return report(&e);
	for (int i = 0; i < n; i++)
		refused += v[i].refused ? 1 : 0;
	if (g_json) {
		printf("{\"reload\":\"%s\",\"changes\":[", refused ? "refused" : "done");
		for (int i = 0, k = 0; i < n; i++) {
			if (v[i].refused)
				continue;
			printf("%s", k++ ? "," : "");
			json_str(v[i].text);
		}
		printf("],\"refused\":[");
		for (int i = 0, k = 0; i < n; i++) {
			if (!v[i].refused)
				continue;
			printf("%s", k++ ? "," : "");
			json_str(v[i].text);
		}
		printf("]}\n");
	} else if (refused) {
		printf("reload refused, nothing applied:\n");
		for (int i = 0; i < n; i++)
			printf("  %s %s\n", v[i].refused ? "refused:" : "not applied:", v[i].text);
	} else {
		printf("reload done%s\n", n ? ":" : ": nothing changed");
		for (int i = 0; i < n; i++)
			printf("  changed: %s\n", v[i].text);
	}
	free(v);
	return refused ? EXIT_REFUSED : EXIT_OK;
}

static int cmd_metrics(struct kvp_client *c)
{
	struct kvp_error e;
	size_t len = 1 << 16;

	for (;;) {
		char *buf = malloc(len);
		int r;

		if (!buf) {
			ctl_fail(&e, KVP_E_NOMEM, ENOMEM, "out of memory");
			return report(&e);
		}
		r = kvp_client_metrics(c, buf, len, &e);
		if (r == -KVP_E_BUFFER && len < (64u << 20)) {
			free(buf);
			len *= 4;
			continue;
		}
		if (r < 0) {
			free(buf);
			return report(&e);
		}
		if (g_json) {
			printf("{\"text\":");
			json_str(buf);
			printf("}\n");
		} else {
			fputs(buf, stdout);
		}
		free(buf);
		return EXIT_OK;
	}
}

/* drain [--deadline DURATION] | drain --cancel (main checked the flags before connecting). */
static int cmd_drain(struct kvp_client *c, int argc, char **argv)
{
	struct kvp_error e;
	uint64_t ms = 30000;
	bool cancel = false;

	if (drain_args(argc, argv, &ms, &cancel) < 0)
		return EXIT_USAGE;
	if (cancel) {
		int was = kvp_admin_drain_cancel(c, &e);

		if (was < 0)
			return report(&e);
		printf(g_json ? "{\"draining\":false,\"was_draining\":%s}\n" : "%s\n",
		       g_json ? (was ? "true" : "false")
			      : (was ? "drain cancelled: new leases and connections are taken again"
				     : "kvpoold was not draining"));
		return EXIT_OK;
	}
	if (kvp_admin_drain(c, (uint32_t)ms, &e) < 0)
		return report(&e);
	printf(g_json ? "{\"draining\":true,\"deadline_ms\":%lu}\n" : "draining, deadline %lu ms\n",
	       (unsigned long)ms);
	return EXIT_OK;
}

static int cmd_simple(struct kvp_client *c, int argc, char **argv)
{
	const char *cmd = argv[0];
	struct kvp_error e;
	uint64_t n = 0;

	if (strcmp(cmd, "ping") == 0) {
		if (kvp_client_ping(c, &e) < 0)
			return report(&e);
		printf(g_json ? "{\"ok\":true}\n" : "pong\n");
		return EXIT_OK;
	}
	if (strcmp(cmd, "evict") == 0) {
		int tier = KVP_TIER_DEVICE;
		char *end;
		unsigned long long tokens;

		if (argc < 3)
			return EXIT_USAGE;
		tokens = strtoull(argv[2], &end, 10);
		if (*end || !tokens)
			return EXIT_USAGE;
		if (argc >= 5 && strcmp(argv[3], "--tier") == 0)
			tier = strcmp(argv[4], "host") == 0 ? KVP_TIER_HOST : KVP_TIER_DEVICE;
		if (kvp_admin_evict(c, argv[1], tier, tokens, &n, &e) < 0)
			return report(&e);
		printf(g_json ? "{\"evicted_tokens\":%lu}\n" : "evicted %lu tokens\n",
		       (unsigned long)n);
		return EXIT_OK;
	}
	if (strcmp(cmd, "flush") == 0) {
		if (argc < 2)
			return EXIT_USAGE;
		if (kvp_admin_flush(c, argv[1], &n, &e) < 0)
			return report(&e);
		printf(g_json ? "{\"evicted_tokens\":%lu}\n" : "flushed %lu tokens\n",
		       (unsigned long)n);
		return EXIT_OK;
	}
	if (strcmp(cmd, "drain") == 0)
		return cmd_drain(c, argc, argv);
	if (strcmp(cmd, "reload") == 0)
		return cmd_reload(c);
	if (strcmp(cmd, "metrics") == 0)
		return cmd_metrics(c);
	return -1;
}

int kvp_check_config(const char *path, int json); /* checkconfig.c */

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	const char *sock = NULL;
	struct kvp_client *c;
	struct kvp_error e;
	int o, r;

	while ((o = getopt_long(argc, argv, "+s:jh", opts, NULL)) != -1) {
		switch (o) {
		case 's': sock = optarg; break;
		case 'j': g_json = 1; break;
		case 'h': usage(stdout); return EXIT_OK;
		default: usage(stderr); return EXIT_USAGE;
		}
	}
	argc -= optind;
	argv += optind;
	/* --json may also follow the command. */
	for (int i = 0; i < argc; i++) {
		if (strcmp(argv[i], "--json") == 0 || strcmp(argv[i], "-j") == 0) {
			g_json = 1;
			memmove(&argv[i], &argv[i + 1], sizeof(char *) * (size_t)(argc - i - 1));
			argc--;
			i--;
		}
	}
	if (argc < 1) {
		usage(stderr);
		return EXIT_USAGE;
	}
	if (strcmp(argv[0], "check-config") == 0) {
		if (argc < 2) {
			usage(stderr);
			return EXIT_USAGE;
		}
		return kvp_check_config(argv[1], g_json);
	}
	if (strcmp(argv[0], "events") == 0)
		return kvp_ctl_events(argc, argv, g_json);
	if (strcmp(argv[0], "help") == 0) {
		usage(stdout);
		return EXIT_OK;
	}
	if (strcmp(argv[0], "drain") == 0) {
		uint64_t ms;
		bool cancel;

		if (drain_args(argc, argv, &ms, &cancel) < 0)
			return EXIT_USAGE;
	}
	c = kvp_client_connect(sock, "kvpoolctl", &e);
	if (!c)
		return report(&e);
	if (strcmp(argv[0], "status") == 0)
		r = cmd_status(c, 0);
	else if (strcmp(argv[0], "pools") == 0)
		r = cmd_status(c, 1);
	else if (strcmp(argv[0], "sessions") == 0)
		r = cmd_sessions(c);
	else if (strcmp(argv[0], "cache") == 0)
		r = cmd_cache(c, argc > 1 ? argv[1] : NULL);
	else if (strcmp(argv[0], "top") == 0)
		r = kvp_ctl_top(c, argc, argv);
	else
		r = cmd_simple(c, argc, argv);
	kvp_client_close(c);
	if (r < 0) {
		fprintf(stderr, "kvpoolctl: unknown command '%s'\n", argv[0]);
		usage(stderr);
		return EXIT_USAGE;
	}
	if (r == EXIT_USAGE)
		usage(stderr);
	return r;
}
