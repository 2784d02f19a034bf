/* config.c - loads kvpoold.conf (INI, parsed by libinih) into struct kvp_conf.
 *
 * libinih does the parsing. It reads through our line reader, which counts lines (so every
 * error names file:line), refuses over-long lines instead of letting inih split them, notes
 * section headers (so a repeated section is seen even when it has no keys, and names longer
 * than the 49 characters inih keeps are whole) and notes indented lines (inih reads those as
 * continuation lines, which this format does not take). Parsing stops at the first error.
 * Everything goes into a temporary that is copied out only when the whole file is valid. */
#include "config.h"
#include "names.h"
#include "units.h"

#include <ctype.h>
#include <errno.h>
#include <grp.h>
#include <ini.h>
#include <inttypes.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>
#include <unistd.h>

#define SECT_MAX 128
#define KEY_BITS 32
#define PAGES_MAX ((uint64_t)UINT32_MAX - 1)

static const char g_embedded[] =
	"; Built-in configuration of kvpoold: one small simulated pool that runs anywhere.\n"
	"[pool.default]\n"
	"layers = 4\n"
	"kv_heads = 2\n"
	"head_dim = 64\n"
	"dtype = fp16\n"
	"page_tokens = 16\n"
	"device = sim\n"
	"device_capacity = 128M\n"
	"host_capacity = 128M\n"
	"numa_node = auto\n"
	"hugepages = off\n"
	"mlock = try\n"
	"session_quota = 0\n"
	"eviction = lru\n";

enum sect_kind {
	SECT_NONE,
	SECT_DAEMON,
	SECT_POOL,
	SECT_REMOTE,
};

/* A capacity as written: resolved to pages once the pool's geometry is known. */
struct cap {
	uint64_t value;
	bool tokens;
	int line; /* 0 = not given */
	char text[32];
};

/* Parse-time bookkeeping of one pool. */
struct pool_state {
	int line; /* of the [pool.NAME] header */
	uint32_t seen;
	int key_line[KEY_BITS];
	struct cap device_cap;
	struct cap host_cap;
	bool device_given;
};

struct parse {
	struct kvp_conf conf;
	struct pool_state ps[KVP_MAX_POOLS];
	const char *origin;

	/* line source: a FILE or a string */
	FILE *file;
	const char *str;
	int lineno;
	bool indented;
	int read_err; /* negative errno of a failed read */

	/* current section */
	enum sect_kind kind;
	char sect[SECT_MAX];
	struct kvp_pool_conf *pool;
	struct pool_state *pst;
	bool daemon_seen;
	uint32_t daemon_seen_keys;
	int daemon_key_line[KEY_BITS];
	int remote_line; /* of the [remote] header; 0 = none */
	uint32_t remote_seen_keys;
	int remote_key_line[KEY_BITS];
	char last_key[64];

	/* first error */
	int err_line; /* 0 with err_set: an error without a line */
	bool err_set;
	char err[384];
};

typedef void (*setter_fn)(struct parse *s, const char *key, const char *val);

struct key_def {
	const char *name;
	setter_fn set;
};

/* ---- errors ---- */

static void fail_at(struct parse *s, int line, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void fail_at(struct parse *s, int line, const char *fmt, ...)
{
	va_list ap;

	if (s->err_set)
		return;
	s->err_set = true;
	s->err_line = line;
	va_start(ap, fmt);
	vsnprintf(s->err, sizeof(s->err), fmt, ap);
	va_end(ap);
}

/* An error about key in the current section, at the current line. */
static void key_fail(struct parse *s, const char *key, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void key_fail(struct parse *s, const char *key, const char *fmt, ...)
{
	char msg[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	fail_at(s, s->lineno, "key '%s' in [%s]: %s", key, s->sect, msg);
}

/* ---- value parsers ---- */

/* Decimal digits only: no sign, no spaces, no base prefix. Returns 0, -EINVAL, -ERANGE. */
static int parse_u64(const char *v, const char **end, uint64_t *out)
{
	uint64_t x = 0;
	const char *p = v;

	if (!isdigit((unsigned char)*p))
		return -EINVAL;
	for (; isdigit((unsigned char)*p); p++) {
		if (x > (UINT64_MAX - (uint64_t)(*p - '0')) / 10)
			return -ERANGE;
		x = x * 10 + (uint64_t)(*p - '0');
	}
	if (end)
		*end = p;
	else if (*p)
		return -EINVAL;
	*out = x;
	return 0;
}

static int parse_range(struct parse *s, const char *key, const char *v, uint64_t min, uint64_t max,
		       uint64_t *out)
{
	uint64_t x;
	int r = parse_u64(v, NULL, &x);

	if (r == -EINVAL) {
		key_fail(s, key, "expected a %s integer, got '%s'",
			 min > 0 ? "positive" : "non-negative", v);
		return r;
	}
	if (r < 0 || x < min || x > max) {
		key_fail(s, key, "expected an integer in %" PRIu64 "..%" PRIu64 ", got '%s'", min,
			 max, v);
		return -ERANGE;
	}
	*out = x;
	return 0;
}

static int parse_u32(struct parse *s, const char *key, const char *v, uint32_t min, uint32_t max,
		     uint32_t *out)
{
	uint64_t x;
	int r = parse_range(s, key, v, min, max, &x);

	if (r == 0)
		*out = (uint32_t)x;
	return r;
}

/* A duration key (units.h): "30s", "250ms", "5m", "1h"; a bare number counts bare_ms
 * milliseconds (the unit the key's name ends in). *out gets it in that unit, which must then be
 * whole. */
static int parse_duration(struct parse *s, const char *key, const char *v, uint64_t bare_ms,
			  uint64_t min, uint64_t max, uint32_t *out)
{
	const char *unit = bare_ms == 1000 ? "s" : "ms";
	uint64_t ms;
	int r = kvp_units_duration_ms(v, bare_ms, max * bare_ms, &ms);

	if (r == -EINVAL || (r == 0 && ms % bare_ms)) {
		key_fail(s, key,
			 "expected a duration: a whole number of %s, or one with a unit (ms, s, "
			 "m, h), got '%s'",
			 unit, v);
		return -EINVAL;
	}
	if (r < 0 || ms / bare_ms < min) {
		key_fail(s, key, "expected a duration in %" PRIu64 "..%" PRIu64 " %s, got '%s'",
			 min, max, unit, v);
		return -ERANGE;
	}
	*out = (uint32_t)(ms / bare_ms);
	return 0;
}

/* Returns the index of v in names[0..n), or -1. */
static int lookup(const char *const *names, int n, const char *v)
{
	for (int i = 0; i < n; i++)
		if (names[i] && strcmp(names[i], v) == 0)
			return i;
	return -1;
}

static int parse_enum(struct parse *s, const char *key, const char *v, const char *const *names,
		      int n, const char *expect)
{
	int i = lookup(names, n, v);

	if (i < 0)
		key_fail(s, key, "expected %s, got '%s'", expect, v);
	return i;
}

/* "40G", "512M", "1T", "300000t", "300000 tokens". K/M/G/T are powers of 1024; a lowercase
 * 't' means tokens. */
static int parse_cap(struct parse *s, const char *key, const char *v, struct cap *c)
{
	static const struct {
		const char *suffix;
		unsigned shift;
		bool tokens;
	} units[] = {
		{ "", 0, false },     { "K", 10, false },    { "k", 10, false },
		{ "KiB", 10, false }, { "M", 20, false },    { "m", 20, false },
		{ "MiB", 20, false }, { "G", 30, false },    { "g", 30, false },
		{ "GiB", 30, false }, { "T", 40, false },    { "TiB", 40, false },
		{ "t", 0, true },     { "tokens", 0, true },
	};
	const char *end;
	uint64_t x;
	int r = parse_u64(v, &end, &x);

	if (r == 0) {
		while (*end == ' ' || *end == '\t')
			end++;
		r = -EINVAL;
		for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
			if (strcmp(end, units[i].suffix) != 0)
				continue;
			if (units[i].shift && x > (UINT64_MAX >> units[i].shift)) {
				r = -ERANGE;
				break;
			}
			c->value = x << units[i].shift;
			c->tokens = units[i].tokens;
			r = 0;
			break;
		}
	}
	if (r == -ERANGE) {
		key_fail(s, key, "'%s' does not fit in 64 bits", v);
		return r;
	}
	if (r < 0) {
		key_fail(s, key,
			 "expected bytes with an optional K/M/G/T suffix (powers of 1024) or "
			 "tokens like 300000t, got '%s'",
			 v);
		return r;
	}
	c->line = s->lineno;
	snprintf(c->text, sizeof(c->text), "%s", v);
	return 0;
}

static int resolve_name(struct parse *s, const char *key, const char *tok, bool group, uint32_t *id)
{
	long hint = sysconf(group ? _SC_GETGR_R_SIZE_MAX : _SC_GETPW_R_SIZE_MAX);
	size_t len = hint > 0 ? (size_t)hint : 1024;
	int r;

	for (;;) {
		char *buf = malloc(len);
		struct passwd pw, *pwp = NULL;
		struct group gr, *grp = NULL;

		if (!buf) {
			key_fail(s, key, "out of memory looking up '%s'", tok);
			return -ENOMEM;
		}
		if (group) {
			r = getgrnam_r(tok, &gr, buf, len, &grp);
			if (r == 0 && grp)
				*id = (uint32_t)grp->gr_gid;
		} else {
			r = getpwnam_r(tok, &pw, buf, len, &pwp);
			if (r == 0 && pwp)
				*id = (uint32_t)pwp->pw_uid;
		}
		free(buf);
		if (r == ERANGE && len < (1u << 20)) {
			len *= 2;
			continue;
		}
		if (r == EINTR)
			continue;
		if (r == 0 && (grp || pwp))
			return 0;
		/* glibc reports "no such entry" as 0 with a NULL result, some NSS modules as
		 * ENOENT or ESRCH. */
		if (r == 0 || r == ENOENT || r == ESRCH) {
			key_fail(s, key, "unknown %s '%s'", group ? "group" : "user", tok);
			return -EINVAL;
		}
		key_fail(s, key, "cannot look up %s '%s': %s", group ? "group" : "user", tok,
			 strerror(r));
		return -r;
	}
}

/* Takes the next entry of a list separated by spaces or commas from *v into tok (cap bytes):
 * 1, 0 at the end of the list, or -1 (the key failed) when the entry does not fit. */
static int next_entry(struct parse *s, const char *key, const char **v, char *tok, size_t cap)
{
	size_t len = 0;

	while (**v && (len = strcspn(*v, " \t,")) == 0)
		(*v)++;
	if (!**v)
		return 0;
	if (len >= cap) {
		key_fail(s, key, "entry longer than %zu characters", cap - 1);
		return -1;
	}
	memcpy(tok, *v, len);
	tok[len] = '\0';
	*v += len;
	return 1;
}

/* One id entry: a number, or a user (group) name to look up. 0, or <0 (the key failed). */
static int parse_id(struct parse *s, const char *key, const char *tok, bool group, uint32_t *id)
{
	uint64_t num;

	if (!isdigit((unsigned char)tok[0]))
		return resolve_name(s, key, tok, group, id);
	if (parse_u64(tok, NULL, &num) < 0 || num >= UINT32_MAX) {
		key_fail(s, key, "'%s' is not a valid %s id", tok, group ? "group" : "user");
		return -EINVAL;
	}
	*id = (uint32_t)num;
	return 0;
}

/* Ids or names, separated by spaces or commas. */
static void parse_ids(struct parse *s, const char *key, const char *v, bool group, uint32_t *ids,
		      uint32_t *n)
{
	uint32_t count = 0;
	char tok[256];
	int rc;

	while ((rc = next_entry(s, key, &v, tok, sizeof(tok))) > 0) {
		if (count == KVP_MAX_IDS) {
			key_fail(s, key, "more than %d entries", KVP_MAX_IDS);
			return;
		}
		if (parse_id(s, key, tok, group, &ids[count]) < 0)
			return;
		count++;
	}
	if (rc < 0)
		return;
	*n = count;
}

/* ---- [daemon] keys ---- */

static void set_socket(struct parse *s, const char *key, const char *v)
{
	if (v[0] != '/' || strlen(v) >= sizeof(s->conf.socket)) {
		key_fail(s, key, "expected an absolute path of at most %zu characters, got '%s'",
			 sizeof(s->conf.socket) - 1, v);
		return;
	}
	snprintf(s->conf.socket, sizeof(s->conf.socket), "%s", v);
}

static void set_allowed_users(struct parse *s, const char *key, const char *v)
{
	parse_ids(s, key, v, false, s->conf.allowed_uids, &s->conf.n_allowed_uids);
}

static void set_allowed_groups(struct parse *s, const char *key, const char *v)
{
	parse_ids(s, key, v, true, s->conf.allowed_gids, &s->conf.n_allowed_gids);
}

static void set_admin_groups(struct parse *s, const char *key, const char *v)
{
	parse_ids(s, key, v, true, s->conf.admin_gids, &s->conf.n_admin_gids);
}

static void set_keepalive(struct parse *s, const char *key, const char *v)
{
	parse_duration(s, key, v, 1, 100, 86400000, &s->conf.keepalive_ms);
}

static void set_log_level(struct parse *s, const char *key, const char *v)
{
	static const struct {
		const char *name;
		int level;
	} levels[] = {
		{ "err", LOG_ERR },	 { "error", LOG_ERR },	   { "warning", LOG_WARNING },
		{ "warn", LOG_WARNING }, { "notice", LOG_NOTICE }, { "info", LOG_INFO },
		{ "debug", LOG_DEBUG },
	};

	for (size_t i = 0; i < sizeof(levels) / sizeof(levels[0]); i++) {
		if (strcmp(v, levels[i].name) == 0) {
			s->conf.log_level = levels[i].level;
			return;
		}
	}
	key_fail(s, key, "expected err, warning, notice, info or debug, got '%s'", v);
}

static void set_metrics_listen(struct parse *s, const char *key, const char *v)
{
	const char *colon = strrchr(v, ':');
	size_t hostlen = colon ? (size_t)(colon - v) : 0;
	uint64_t port;
	bool ok;

	if (!*v) {
		s->conf.metrics_listen[0] = '\0';
		return;
	}
	ok = colon && hostlen > 0 && strlen(v) < sizeof(s->conf.metrics_listen) &&
	     parse_u64(colon + 1, NULL, &port) == 0 && port >= 1 && port <= 65535;
	/* An IPv6 host is bracketed: [::1]:9464 */
	if (ok && v[0] == '[')
		ok = hostlen > 2 && v[hostlen - 1] == ']';
	else if (ok)
		ok = memchr(v, ':', hostlen) == NULL && memchr(v, ']', hostlen) == NULL;
	if (!ok) {
		key_fail(s, key,
			 "expected host:port of at most %zu characters (127.0.0.1:9464, "
			 "[::1]:9464), got '%s'",
			 sizeof(s->conf.metrics_listen) - 1, v);
		return;
	}
	snprintf(s->conf.metrics_listen, sizeof(s->conf.metrics_listen), "%s", v);
}

static void set_max_sessions(struct parse *s, const char *key, const char *v)
{
	parse_u32(s, key, v, 1, 65536, &s->conf.max_sessions);
}

static void set_max_leases(struct parse *s, const char *key, const char *v)
{
	parse_u32(s, key, v, 1, 1u << 20, &s->conf.max_leases_per_session);
}

static void set_max_locks(struct parse *s, const char *key, const char *v)
{
	parse_u32(s, key, v, 1, 1u << 20, &s->conf.max_locks_per_session);
}

static void set_max_keys(struct parse *s, const char *key, const char *v)
{
	/* at most libkvpool's KVP_PAGE_KEYS_MAX: more keys do not fit in one frame */
	parse_u32(s, key, v, 1, 65536, &s->conf.max_keys_per_call);
}

static void set_max_key_bytes(struct parse *s, const char *key, const char *v)
{
	parse_u32(s, key, v, 1, 64, &s->conf.max_key_bytes);
}

static void set_hello_timeout(struct parse *s, const char *key, const char *v)
{
	parse_u32(s, key, v, 100, 600000, &s->conf.hello_timeout_ms);
}

static void set_max_prehello(struct parse *s, const char *key, const char *v)
{
	parse_u32(s, key, v, 1, 65536, &s->conf.max_prehello);
}

static void set_max_per_uid(struct parse *s, const char *key, const char *v)
{
	parse_u32(s, key, v, 0, 65536, &s->conf.max_sessions_per_uid);
}

static void set_admin_sessions(struct parse *s, const char *key, const char *v)
{
	parse_u32(s, key, v, 0, 65536, &s->conf.admin_sessions);
}

/* Bytes ("64M", "1G", a plain number), 0 = sized from max_sessions; tokens mean nothing here. */
static void set_buffer_budget(struct parse *s, const char *key, const char *v)
{
	struct cap c = { 0 };

	if (parse_cap(s, key, v, &c) < 0)
		return;
	if (c.tokens || (c.value && c.value < (1u << 20))) {
		key_fail(s, key, "expected 0 or a byte size of at least 1M (\"64M\"), got '%s'", v);
		return;
	}
	s->conf.buffer_budget = c.value;
}

static void set_reserve_max_pages(struct parse *s, const char *key, const char *v)
{
	parse_u32(s, key, v, 0, 32768, &s->conf.reserve_max_pages);
}

static void set_reserve_free_percent(struct parse *s, const char *key, const char *v)
{
	parse_u32(s, key, v, 1, 100, &s->conf.reserve_free_percent);
}

static void set_resume_grace(struct parse *s, const char *key, const char *v)
{
	parse_u32(s, key, v, 0, 3600000, &s->conf.resume_grace_ms);
}

static void set_snapshot_interval(struct parse *s, const char *key, const char *v)
{
	parse_u32(s, key, v, 0, 3600000, &s->conf.snapshot_interval_ms);
}

static const struct key_def g_daemon_keys[] = {
	{ "socket", set_socket },
	{ "allowed_users", set_allowed_users },
	{ "allowed_groups", set_allowed_groups },
	{ "admin_groups", set_admin_groups },
	{ "keepalive_ms", set_keepalive },
	{ "log_level", set_log_level },
	{ "metrics_listen", set_metrics_listen },
	{ "max_sessions", set_max_sessions },
	{ "max_leases_per_session", set_max_leases },
	{ "max_locks_per_session", set_max_locks },
	{ "max_keys_per_call", set_max_keys },
	{ "max_key_bytes", set_max_key_bytes },
	{ "hello_timeout_ms", set_hello_timeout },
	{ "max_prehello", set_max_prehello },
	{ "max_sessions_per_uid", set_max_per_uid },
	{ "admin_sessions", set_admin_sessions },
	{ "buffer_budget", set_buffer_budget },
	{ "reserve_max_pages", set_reserve_max_pages },
	{ "reserve_free_percent", set_reserve_free_percent },
	{ "resume_grace_ms", set_resume_grace },
	{ "snapshot_interval_ms", set_snapshot_interval },
};

/* ---- [remote] keys ---- */

/* "host:port[, host:port...]": each host a name or IPv4 address (no ':'), each port 1..65535,
 * at most KVP_REMOTE_SEEDS_COUNT. Stored normalized: comma-separated, no spaces. */
static void set_seeds(struct parse *s, const char *key, const char *v)
{
	struct kvp_remote_conf *r = &s->conf.remote;
	char out[KVP_REMOTE_SEEDS_MAX];
	size_t n = 0;
	uint32_t count = 0;
	const char *p = v;

	while (*p) {
		const char *tok, *colon;
		size_t len, hostlen;
		uint64_t port;
		char num[8];

		while (*p == ' ' || *p == '\t' || *p == ',')
			p++;
		if (!*p)
			break;
		tok = p;
		len = strcspn(p, " \t,");
		p += len;
		colon = memchr(tok, ':', len);
		hostlen = colon ? (size_t)(colon - tok) : 0;
		if (!colon || hostlen == 0 || len - hostlen - 1 == 0 ||
		    len - hostlen - 1 >= sizeof(num)) {
			key_fail(s, key, "expected host:port, got '%.*s'", (int)len, tok);
			return;
		}
		for (size_t i = 0; i < hostlen; i++) {
			unsigned char c = (unsigned char)tok[i];

			if (!isalnum(c) && c != '.' && c != '-' && c != '_') {
				key_fail(s, key,
					 "bad host in '%.*s': a name or IPv4 address "
					 "(A-Z a-z 0-9 . - _)",
					 (int)len, tok);
				return;
			}
		}
		memcpy(num, colon + 1, len - hostlen - 1);
		num[len - hostlen - 1] = '\0';
		if (parse_u64(num, NULL, &port) < 0 || port < 1 || port > 65535) {
			key_fail(s, key, "bad port in '%.*s': expected 1..65535", (int)len, tok);
			return;
		}
		if (++count > KVP_REMOTE_SEEDS_COUNT) {
			key_fail(s, key, "more than %d seeds", KVP_REMOTE_SEEDS_COUNT);
			return;
		}
		if (n + len + (n > 0) >= sizeof(out)) {
			key_fail(s, key, "longer than %zu characters", sizeof(out) - 1);
			return;
		}
		if (n > 0)
			out[n++] = ',';
		memcpy(out + n, tok, len);
		n += len;
	}
	if (count == 0) {
		key_fail(s, key, "expected at least one host:port (127.0.0.1:7000)");
		return;
	}
	out[n] = '\0';
	memcpy(r->seeds, out, n + 1);
	r->n_seeds = count;
}

static void set_connect_timeout(struct parse *s, const char *key, const char *v)
{
	parse_duration(s, key, v, 1, 1, 60000, &s->conf.remote.connect_timeout_ms);
}

static void set_command_timeout(struct parse *s, const char *key, const char *v)
{
	parse_duration(s, key, v, 1, 1, 60000, &s->conf.remote.command_timeout_ms);
}

static void set_match_timeout(struct parse *s, const char *key, const char *v)
{
	parse_duration(s, key, v, 1, 1, 10000, &s->conf.remote.match_timeout_ms);
}

static void set_match_pages(struct parse *s, const char *key, const char *v)
{
	parse_u32(s, key, v, 1, 4096, &s->conf.remote.match_max_pages);
}

#define INFLIGHT_MIN (64ull << 10)
#define INFLIGHT_MAX (64ull << 30)

static void set_max_inflight(struct parse *s, const char *key, const char *v)
{
	struct cap c;

	if (parse_cap(s, key, v, &c) < 0)
		return;
	if (c.tokens || c.value < INFLIGHT_MIN || c.value > INFLIGHT_MAX) {
		key_fail(s, key, "expected bytes in 64K..64G (256M), got '%s'", v);
		return;
	}
	s->conf.remote.max_inflight_bytes = c.value;
}

static void set_ttl(struct parse *s, const char *key, const char *v)
{
	parse_duration(s, key, v, 1000, 0, INT32_MAX, &s->conf.remote.ttl_s);
}

static void set_rewrite_after(struct parse *s, const char *key, const char *v)
{
	parse_duration(s, key, v, 1000, 1, INT32_MAX, &s->conf.remote.rewrite_after_s);
}

static void set_connections(struct parse *s, const char *key, const char *v)
{
	parse_u32(s, key, v, 1, KVP_REMOTE_CONNS_MAX, &s->conf.remote.connections);
}

/* seeds is required; keep it first. */
static const struct key_def g_remote_keys[] = {
	{ "seeds", set_seeds },
	{ "connect_timeout_ms", set_connect_timeout },
	{ "command_timeout_ms", set_command_timeout },
	{ "match_timeout_ms", set_match_timeout },
	{ "match_max_pages", set_match_pages },
	{ "max_inflight_bytes", set_max_inflight },
	{ "ttl_s", set_ttl },
	{ "rewrite_after_s", set_rewrite_after },
	{ "connections", set_connections },
};

static void remote_defaults(struct kvp_remote_conf *r)
{
	memset(r, 0, sizeof(*r));
	r->connect_timeout_ms = 1000;
	r->command_timeout_ms = 500;
	r->match_timeout_ms = 20;
	r->match_max_pages = 64;
	r->max_inflight_bytes = 64ull << 20;
	r->ttl_s = 86400;
	r->rewrite_after_s = 3600;
	r->connections = KVP_REMOTE_CONNS_MAX;
}

/* ---- [pool.NAME] keys ---- */

static const uint32_t g_dtype_sizes[KVP_CONF_DTYPE_MAX] = {
	[KVP_CONF_DTYPE_FP16] = 2,
	[KVP_CONF_DTYPE_BF16] = 2,
	[KVP_CONF_DTYPE_FP8] = 1,
	[KVP_CONF_DTYPE_FP32] = 4,
};
static const char *const g_device_names[KVP_DEVICE_KIND_MAX] = {
	[KVP_DEVICE_NONE] = "none",
	[KVP_DEVICE_SIM] = "sim",
	[KVP_DEVICE_CUDA] = "cuda",
};
static const char *const g_tristate_names[KVP_TRISTATE_MAX] = {
	[KVP_OFF] = "off",
	[KVP_TRY] = "try",
	[KVP_ON] = "on",
};
static const char *const g_remote_mode_names[KVP_REMOTE_MODE_MAX] = {
	[KVP_REMOTE_OFF] = "off",
	[KVP_REMOTE_SPILL] = "spill",
	[KVP_REMOTE_WRITE_THROUGH] = "write-through",
};
static const char *const g_eviction_names[KVP_EVICT_MAX] = {
	[KVP_EVICT_LRU] = "lru",
	[KVP_EVICT_LFU] = "lfu",
};

static void set_layers(struct parse *s, const char *key, const char *v)
{
	parse_u32(s, key, v, 1, 1024, &s->pool->layers);
}

static void set_kv_heads(struct parse *s, const char *key, const char *v)
{
	parse_u32(s, key, v, 1, 1024, &s->pool->kv_heads);
}

static void set_head_dim(struct parse *s, const char *key, const char *v)
{
	parse_u32(s, key, v, 1, 4096, &s->pool->head_dim);
}

static void set_page_tokens(struct parse *s, const char *key, const char *v)
{
	parse_u32(s, key, v, 1, 1024, &s->pool->page_tokens);
}

static void set_dtype(struct parse *s, const char *key, const char *v)
{
	const char *names[KVP_CONF_DTYPE_MAX];
	int i;

	for (int d = 0; d < KVP_CONF_DTYPE_MAX; d++)
		names[d] = kvp_conf_dtype_name((enum kvp_conf_dtype)d);
	i = parse_enum(s, key, v, names, KVP_CONF_DTYPE_MAX, "fp16, bf16, fp8 or fp32");

	if (i >= 0)
		s->pool->dtype = (enum kvp_conf_dtype)i;
}

static void set_device(struct parse *s, const char *key, const char *v)
{
	uint64_t n = 0;

	if (strcmp(v, "none") == 0) {
		s->pool->device = KVP_DEVICE_NONE;
	} else if (strcmp(v, "sim") == 0) {
		s->pool->device = KVP_DEVICE_SIM;
	} else if (strcmp(v, "cuda") == 0 ||
		   (strncmp(v, "cuda:", 5) == 0 && parse_u64(v + 5, NULL, &n) == 0 && n < 1024)) {
		s->pool->device = KVP_DEVICE_CUDA;
		s->pool->cuda_device = (int)n;
	} else {
		key_fail(s, key, "expected cuda:N, sim or none, got '%s'", v);
		return;
	}
	s->pst->device_given = true;
}

static void set_device_capacity(struct parse *s, const char *key, const char *v)
{
	parse_cap(s, key, v, &s->pst->device_cap);
}

static void set_host_capacity(struct parse *s, const char *key, const char *v)
{
	parse_cap(s, key, v, &s->pst->host_cap);
}

static void set_numa_node(struct parse *s, const char *key, const char *v)
{
	uint64_t n;

	if (strcmp(v, "auto") == 0) {
		s->pool->numa_node = KVP_NUMA_NODE_AUTO;
		return;
	}
	if (parse_u64(v, NULL, &n) < 0 || n > 1023) {
		key_fail(s, key, "expected auto or a node number in 0..1023, got '%s'", v);
		return;
	}
	s->pool->numa_node = (int)n;
}

static void set_hugepages(struct parse *s, const char *key, const char *v)
{
	int i = parse_enum(s, key, v, g_tristate_names, KVP_TRISTATE_MAX, "off, try or on");

	if (i >= 0)
		s->pool->hugepages = (enum kvp_tristate)i;
}

static void set_mlock(struct parse *s, const char *key, const char *v)
{
	int i = parse_enum(s, key, v, g_tristate_names, KVP_TRISTATE_MAX, "off, try or on");

	if (i >= 0)
		s->pool->mlock = (enum kvp_tristate)i;
}

/* Tokens: "64", "64t" or "64 tokens". */
static void parse_tokens(struct parse *s, const char *key, const char *v, uint64_t *out)
{
	const char *end;
	uint64_t x;
	int r = parse_u64(v, &end, &x);

	if (r == 0) {
		while (*end == ' ' || *end == '\t')
			end++;
		if (*end && strcmp(end, "t") != 0 && strcmp(end, "tokens") != 0)
			r = -EINVAL;
	}
	if (r == -ERANGE) {
		key_fail(s, key, "'%s' does not fit in 64 bits", v);
		return;
	}
	if (r < 0) {
		key_fail(s, key, "expected a non-negative integer, got '%s'", v);
		return;
	}
	*out = x;
}

static void set_session_quota(struct parse *s, const char *key, const char *v)
{
	parse_tokens(s, key, v, &s->pool->session_quota_tokens);
}

static void set_session_lock_quota(struct parse *s, const char *key, const char *v)
{
	parse_tokens(s, key, v, &s->pool->session_lock_quota_tokens);
}

static void set_uid_quota(struct parse *s, const char *key, const char *v)
{
	parse_tokens(s, key, v, &s->pool->uid_quota_tokens);
}

static void set_pool_allowed_users(struct parse *s, const char *key, const char *v)
{
	parse_ids(s, key, v, false, s->pool->allowed_uids, &s->pool->n_allowed_uids);
}

static void set_pool_allowed_groups(struct parse *s, const char *key, const char *v)
{
	parse_ids(s, key, v, true, s->pool->allowed_gids, &s->pool->n_allowed_gids);
}

/* namespace.N = user:alice, group:gpu, user:1000 (the key's N: a namespace number). */
static void set_namespace(struct parse *s, const char *key, const char *v)
{
	struct kvp_pool_conf *p = s->pool;
	struct kvp_ns_owner *o;
	char tok[256];
	uint64_t ns;
	int rc = 0;

	if (parse_u64(key + strlen("namespace."), NULL, &ns) < 0) {
		key_fail(s, key, "expected namespace.N with N a namespace number");
		return;
	}
	for (uint32_t i = 0; i < p->n_ns_owners; i++) {
		if (p->ns_owners[i].ns == ns) {
			key_fail(s, key, "namespace %" PRIu64 " is bound twice", ns);
			return;
		}
	}
	if (p->n_ns_owners == KVP_MAX_NS_OWNERS) {
		key_fail(s, key, "more than %d namespace.N keys", KVP_MAX_NS_OWNERS);
		return;
	}
	o = &p->ns_owners[p->n_ns_owners];
	memset(o, 0, sizeof(*o));
	o->ns = ns;
	while (!s->err_set && (rc = next_entry(s, key, &v, tok, sizeof(tok))) > 0) {
		bool group;
		const char *name;
		uint32_t *ids, *n;

		if (strncmp(tok, "user:", 5) == 0) {
			group = false;
			name = tok + 5;
		} else if (strncmp(tok, "group:", 6) == 0) {
			group = true;
			name = tok + 6;
		} else {
			key_fail(s, key, "expected user:NAME or group:NAME entries, got '%s'", tok);
			return;
		}
		ids = group ? o->gids : o->uids;
		n = group ? &o->n_gids : &o->n_uids;
		if (*n == KVP_MAX_IDS) {
			key_fail(s, key, "more than %d %s entries", KVP_MAX_IDS,
				 group ? "group" : "user");
			return;
		}
		if (parse_id(s, key, name, group, &ids[*n]) < 0)
			return;
		(*n)++;
	}
	if (rc < 0 || s->err_set)
		return;
	if (!o->n_uids && !o->n_gids) {
		key_fail(s, key, "no owner: give user:NAME or group:NAME entries");
		return;
	}
	p->n_ns_owners++;
}

static void set_eviction(struct parse *s, const char *key, const char *v)
{
	int i = parse_enum(s, key, v, g_eviction_names, KVP_EVICT_MAX, "lru or lfu");

	if (i >= 0)
		s->pool->eviction = (enum kvp_eviction)i;
}

/* pressure_watermark = 10% (of each tier's pages, 0 .. 100, decimals allowed) or tokens ("4096t",
 * "4096 tokens", "4096"); 0 = none. */
static void set_pressure_watermark(struct parse *s, const char *key, const char *v)
{
	size_t n = strlen(v);

	if (n && v[n - 1] == '%') {
		char num[32], *end;
		double pct;

		if (n - 1 >= sizeof(num) || !isdigit((unsigned char)v[0])) {
			key_fail(s, key,
				 "expected a percent like 10%% or tokens like 4096t, got '%s'", v);
			return;
		}
		memcpy(num, v, n - 1);
		num[n - 1] = '\0';
		pct = strtod(num, &end);
		if (*end || !(pct >= 0 && pct <= 100)) {
			key_fail(s, key, "expected a percent in 0..100%%, got '%s'", v);
			return;
		}
		s->pool->pressure_watermark_pct = pct;
		s->pool->pressure_watermark_tokens = 0;
		return;
	}
	parse_tokens(s, key, v, &s->pool->pressure_watermark_tokens);
	s->pool->pressure_watermark_pct = 0;
}

static void set_pressure_interval(struct parse *s, const char *key, const char *v)
{
	parse_u32(s, key, v, 0, 3600000, &s->pool->pressure_interval_ms);
}

static void set_remote(struct parse *s, const char *key, const char *v)
{
	int i = parse_enum(s, key, v, g_remote_mode_names, KVP_REMOTE_MODE_MAX,
			   "off, spill or write-through");

	if (i >= 0)
		s->pool->remote = (enum kvp_remote_mode)i;
}

/* The first five are required; keep them first and in this order. */
enum { POOL_REQUIRED = 5 };
static const struct key_def g_pool_keys[] = {
	{ "layers", set_layers },
	{ "kv_heads", set_kv_heads },
	{ "head_dim", set_head_dim },
	{ "dtype", set_dtype },
	{ "page_tokens", set_page_tokens },
	{ "device", set_device },
	{ "device_capacity", set_device_capacity },
	{ "host_capacity", set_host_capacity },
	{ "numa_node", set_numa_node },
	{ "hugepages", set_hugepages },
	{ "mlock", set_mlock },
	{ "session_quota", set_session_quota },
	{ "eviction", set_eviction },
	{ "session_lock_quota", set_session_lock_quota },
	{ "uid_quota", set_uid_quota },
	{ "allowed_users", set_pool_allowed_users },
	{ "allowed_groups", set_pool_allowed_groups },
	{ "pressure_watermark", set_pressure_watermark },
	{ "pressure_interval_ms", set_pressure_interval },
	{ "remote", set_remote },
};
enum { POOL_KEY_REMOTE = sizeof(g_pool_keys) / sizeof(g_pool_keys[0]) - 1 };

_Static_assert(sizeof(g_pool_keys) / sizeof(g_pool_keys[0]) <= KEY_BITS, "too many pool keys");
_Static_assert(sizeof(g_daemon_keys) / sizeof(g_daemon_keys[0]) <= KEY_BITS, "too many keys");
_Static_assert(sizeof(g_remote_keys) / sizeof(g_remote_keys[0]) <= KEY_BITS, "too many keys");

/* ---- sections ---- */

static void pool_defaults(struct kvp_pool_conf *p)
{
	memset(p, 0, sizeof(*p));
	p->dtype = KVP_CONF_DTYPE_FP16;
	p->device = KVP_DEVICE_NONE;
	p->numa_node = KVP_NUMA_NODE_AUTO;
	p->hugepages = KVP_OFF;
	p->mlock = KVP_TRY;
	p->eviction = KVP_EVICT_LRU;
	p->pressure_interval_ms = 100;
}

static bool pool_name_ok(const char *name)
{
	size_t len = strlen(name);

	if (len == 0 || len >= KVP_POOL_NAME_MAX)
		return false;
	for (const char *p = name; *p; p++)
		if (!isalnum((unsigned char)*p) && *p != '.' && *p != '_' && *p != '-')
			return false;
	return true;
}

static void section_begin(struct parse *s, const char *name, size_t len)
{
	const char *pname;

	s->kind = SECT_NONE;
	s->pool = NULL;
	s->pst = NULL;
	s->last_key[0] = '\0';
	if (len >= sizeof(s->sect)) {
		fail_at(s, s->lineno, "section name longer than %zu characters",
			sizeof(s->sect) - 1);
		return;
	}
	memcpy(s->sect, name, len);
	s->sect[len] = '\0';

	if (strcmp(s->sect, "daemon") == 0) {
		if (s->daemon_seen) {
			fail_at(s, s->lineno, "[daemon] appears twice");
			return;
		}
		s->daemon_seen = true;
		s->kind = SECT_DAEMON;
		return;
	}
	if (strcmp(s->sect, "remote") == 0) {
		if (s->remote_line) {
			fail_at(s, s->lineno, "[remote] appears twice (first at line %d)",
				s->remote_line);
			return;
		}
		s->remote_line = s->lineno;
		s->conf.remote.enabled = 1;
		s->kind = SECT_REMOTE;
		return;
	}
	if (strncmp(s->sect, "pool.", 5) != 0) {
		fail_at(s, s->lineno,
			"unknown section [%s]: expected [daemon], [remote] or [pool.NAME]",
			s->sect);
		return;
	}
	pname = s->sect + 5;
	if (!pool_name_ok(pname)) {
		fail_at(s, s->lineno,
			"[%s]: bad pool name '%s': use 1..%d characters of A-Z a-z 0-9 . _ -",
			s->sect, pname, KVP_POOL_NAME_MAX - 1);
		return;
	}
	for (uint32_t i = 0; i < s->conf.n_pools; i++) {
		if (strcmp(s->conf.pools[i].name, pname) == 0) {
			fail_at(s, s->lineno, "[%s]: duplicate pool name (first at line %d)",
				s->sect, s->ps[i].line);
			return;
		}
	}
	if (s->conf.n_pools == KVP_MAX_POOLS) {
		fail_at(s, s->lineno, "[%s]: more than %d pools", s->sect, KVP_MAX_POOLS);
		return;
	}
	s->pool = &s->conf.pools[s->conf.n_pools];
	s->pst = &s->ps[s->conf.n_pools];
	s->conf.n_pools++;
	pool_defaults(s->pool);
	snprintf(s->pool->name, sizeof(s->pool->name), "%s", pname);
	s->pst->line = s->lineno;
	s->kind = SECT_POOL;
}

/* ---- the line reader inih reads through ---- */

static int src_getc(struct parse *s)
{
	if (s->file)
		return getc(s->file);
	if (!*s->str)
		return EOF;
	return (unsigned char)*s->str++;
}

static int src_peek(struct parse *s)
{
	int c;

	if (!s->file)
		return *s->str ? (unsigned char)*s->str : EOF;
	c = getc(s->file);
	if (c != EOF)
		ungetc(c, s->file);
	return c;
}

/* Notes what inih will make of the line just read: whether it is indented and whether it
 * opens a section. Mirrors inih's own tests (lskip, '[', the first ']' not inside an inline
 * comment) so both agree on where sections begin. */
static void note_line(struct parse *s, char *line)
{
	char *p = line;
	char *q;
	bool was_space = false;

	if (s->lineno == 1 && (unsigned char)p[0] == 0xEF && (unsigned char)p[1] == 0xBB &&
	    (unsigned char)p[2] == 0xBF)
		p += 3;
	q = p;
	while (*q && isspace((unsigned char)*q))
		q++;
	s->indented = q > p && *q;
	if (*q != '[')
		return;
	/* inih reads an indented line after a key as that key's continuation. */
	if (s->indented && s->last_key[0])
		return;
	for (p = q + 1; *p && *p != ']' && !(was_space && *p == ';'); p++)
		was_space = isspace((unsigned char)*p);
	if (*p == ']')
		section_begin(s, q + 1, (size_t)(p - q - 1));
}

static char *read_line(char *buf, int num, void *stream)
{
	struct parse *s = stream;
	int n = 0;
	int c = EOF;

	if (s->err_set || num < 2)
		return NULL;
	errno = 0;
	while (n < num - 1) {
		c = src_getc(s);
		if (c == EOF)
			break;
		if (c == '\0') {
			fail_at(s, s->lineno + 1, "line contains a NUL byte");
			return NULL;
		}
		buf[n++] = (char)c;
		if (c == '\n')
			break;
	}
	if (n == 0) {
		if (s->file && ferror(s->file))
			s->read_err = errno ? -errno : -EIO;
		return NULL;
	}
	buf[n] = '\0';
	s->lineno++;
	/* A full buffer: fine at the end of input or of the line, else the line is too long. */
	if (buf[n - 1] != '\n' && c != EOF) {
		c = src_peek(s);
		if (c == '\n') {
			src_getc(s);
		} else if (c != EOF) {
			fail_at(s, s->lineno, "line longer than %d characters", num - 1);
			return NULL;
		}
	}
	note_line(s, buf);
	return buf;
}

/* ---- the inih handler ---- */

static int on_key(void *user, const char *section, const char *name, const char *value)
{
	struct parse *s = user;
	const struct key_def *keys;
	uint32_t *seen;
	int *lines;
	size_t n;
	int i;

	if (s->err_set)
		return 0;
	if (s->kind == SECT_NONE) {
		fail_at(s, s->lineno, "key '%s' outside any section", name);
		return 0;
	}
	/* inih keeps 49 characters of a section name; ours is whole. */
	if (strncmp(section, s->sect, strlen(section)) != 0) {
		fail_at(s, s->lineno, "cannot follow section [%s]", section);
		return 0;
	}
	/* After a key, inih hands an indented line over as a continuation of that key. */
	if (s->indented && s->last_key[0]) {
		fail_at(s, s->lineno,
			"key '%s' in [%s]: an indented line continues the previous value, which "
			"this file does not allow; remove the leading whitespace",
			s->last_key, s->sect);
		return 0;
	}
	snprintf(s->last_key, sizeof(s->last_key), "%s", name);

	if (s->kind == SECT_DAEMON) {
		keys = g_daemon_keys;
		n = sizeof(g_daemon_keys) / sizeof(g_daemon_keys[0]);
		seen = &s->daemon_seen_keys;
		lines = s->daemon_key_line;
	} else if (s->kind == SECT_REMOTE) {
		keys = g_remote_keys;
		n = sizeof(g_remote_keys) / sizeof(g_remote_keys[0]);
		seen = &s->remote_seen_keys;
		lines = s->remote_key_line;
	} else {
		keys = g_pool_keys;
		n = sizeof(g_pool_keys) / sizeof(g_pool_keys[0]);
		seen = &s->pst->seen;
		lines = s->pst->key_line;
	}
	/* namespace.N keys of a pool: their own duplicate check (set_namespace). */
	if (s->kind == SECT_POOL && strncmp(name, "namespace.", 10) == 0) {
		set_namespace(s, name, value);
		return s->err_set ? 0 : 1;
	}
	for (i = 0; i < (int)n; i++)
		if (strcmp(keys[i].name, name) == 0)
			break;
	if (i == (int)n) {
		fail_at(s, s->lineno, "unknown key '%s' in [%s]", name, s->sect);
		return 0;
	}
	if (*seen & (1u << i)) {
		key_fail(s, name, "given twice (first at line %d)", lines[i]);
		return 0;
	}
	*seen |= 1u << i;
	lines[i] = s->lineno;
	keys[i].set(s, name, value);
	return s->err_set ? 0 : 1;
}

/* ---- whole-file checks ---- */

static int resolve_cap(struct parse *s, const struct kvp_pool_conf *p, const char *key,
		       const struct cap *c, uint64_t *pages)
{
	uint64_t page_bytes = kvp_conf_page_bytes(p);
	uint64_t n, bytes;

	if (!c->line || c->value == 0) {
		*pages = 0;
		return 0;
	}
	n = c->tokens ? c->value / p->page_tokens + (c->value % p->page_tokens != 0)
		      : c->value / page_bytes;
	if (n == 0) {
		fail_at(s, c->line,
			"key '%s' in [pool.%s]: '%s' is less than one page (%" PRIu64 " bytes)",
			key, p->name, c->text, page_bytes);
		return -EINVAL;
	}
	if (n > PAGES_MAX || __builtin_mul_overflow(n, page_bytes, &bytes) || bytes > INT64_MAX) {
		fail_at(s, c->line,
			"key '%s' in [pool.%s]: '%s' is too large: %" PRIu64 " pages of %" PRIu64
			" bytes, at most %" PRIu64 " pages and 2^63 bytes",
			key, p->name, c->text, n, page_bytes, PAGES_MAX);
		return -EINVAL;
	}
	*pages = n;
	return 0;
}

static int check_pool(struct parse *s, uint32_t idx)
{
	struct kvp_pool_conf *p = &s->conf.pools[idx];
	struct pool_state *ps = &s->ps[idx];
	const char *dev = kvp_device_kind_name(p->device);

	for (int i = 0; i < POOL_REQUIRED; i++) {
		if (!(ps->seen & (1u << i))) {
			fail_at(s, ps->line, "[pool.%s]: missing required key '%s'", p->name,
				g_pool_keys[i].name);
			return -EINVAL;
		}
	}
	if (resolve_cap(s, p, "device_capacity", &ps->device_cap, &p->device_pages) < 0 ||
	    resolve_cap(s, p, "host_capacity", &ps->host_cap, &p->host_pages) < 0)
		return -EINVAL;
	if (p->device == KVP_DEVICE_NONE && p->device_pages) {
		fail_at(s, ps->device_cap.line,
			"key 'device_capacity' in [pool.%s]: the pool has no device (device = none%s); "
			"set device = cuda:N or sim, or remove the key",
			p->name, ps->device_given ? "" : ", the default");
		return -EINVAL;
	}
	if (p->device != KVP_DEVICE_NONE && !p->device_pages) {
		fail_at(s, ps->line, "[pool.%s]: device = %s needs a nonzero device_capacity",
			p->name, dev);
		return -EINVAL;
	}
	if (p->device == KVP_DEVICE_NONE && !p->host_pages) {
		fail_at(s, ps->line,
			"[pool.%s]: no capacity: a pool without a device (device = none) needs a "
			"nonzero host_capacity",
			p->name);
		return -EINVAL;
	}
	if (p->remote != KVP_REMOTE_OFF && !s->conf.remote.enabled) {
		fail_at(s, ps->key_line[POOL_KEY_REMOTE],
			"key 'remote' in [pool.%s]: remote = %s needs a [remote] section with "
			"seeds",
			p->name, kvp_remote_mode_name(p->remote));
		return -EINVAL;
	}
	if (p->remote != KVP_REMOTE_OFF && !p->host_pages) {
		fail_at(s, ps->key_line[POOL_KEY_REMOTE],
			"key 'remote' in [pool.%s]: remote = %s needs a host tier (host_capacity)",
			p->name, kvp_remote_mode_name(p->remote));
		return -EINVAL;
	}
	return 0;
}

static int check_all(struct parse *s)
{
	if (s->conf.n_pools == 0) {
		fail_at(s, 0, "no [pool.NAME] section: at least one pool is required");
		return -EINVAL;
	}
	if (s->remote_line && !(s->remote_seen_keys & 1u)) {
		fail_at(s, s->remote_line, "[remote]: missing required key 'seeds'");
		return -EINVAL;
	}
	for (uint32_t i = 0; i < s->conf.n_pools; i++)
		if (check_pool(s, i) < 0)
			return -EINVAL;
	return 0;
}

/* ---- loading ---- */

/* Writes "origin:line: message" (line > 0) or "origin: message" to err. */
static void write_err(const struct parse *s, char *err, size_t errlen, int line, const char *fmt,
		      ...) __attribute__((format(printf, 5, 6)));
static void write_err(const struct parse *s, char *err, size_t errlen, int line, const char *fmt,
		      ...)
{
	char msg[512];
	va_list ap;

	if (!err || errlen == 0)
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (line > 0)
		snprintf(err, errlen, "%s:%d: %s", s->origin, line, msg);
	else
		snprintf(err, errlen, "%s: %s", s->origin, msg);
}

/* Runs inih over the source set up in s and checks the result. Returns 0 or -errno. */
static int run_parse(struct parse *s, char *err, size_t errlen)
{
	int ret = ini_parse_stream(read_line, s, on_key, s);

	/* inih returns the first line it or on_key() refused; ours may be a later one. */
	if (ret > 0 && (!s->err_set || ret < s->err_line)) {
		write_err(s, err, errlen, ret,
			  "syntax error: expected [section], key = value or a comment");
		return -EINVAL;
	}
	if (ret < 0 && !s->err_set) {
		write_err(s, err, errlen, 0, "parser error %d", ret);
		return ret == -2 ? -ENOMEM : -EIO;
	}
	if (s->read_err) {
		write_err(s, err, errlen, 0, "read error: %s", strerror(-s->read_err));
		return s->read_err;
	}
	if (!s->err_set)
		check_all(s);
	if (s->err_set) {
		write_err(s, err, errlen, s->err_line, "%s", s->err);
		return -EINVAL;
	}
	return 0;
}

static struct parse *parse_new(const char *origin)
{
	struct parse *s = calloc(1, sizeof(*s));

	if (!s)
		return NULL;
	kvp_conf_defaults(&s->conf);
	s->origin = origin;
	return s;
}

void kvp_conf_defaults(struct kvp_conf *c)
{
	memset(c, 0, sizeof(*c));
	snprintf(c->socket, sizeof(c->socket), "%s", KVP_ROOT_SOCKET);
	c->keepalive_ms = 10000;
	c->log_level = LOG_INFO;
	c->max_sessions = 1024;
	c->max_leases_per_session = 4096;
	c->max_locks_per_session = 4096;
	c->max_keys_per_call = 65536;
	c->max_key_bytes = 64;
	c->hello_timeout_ms = 2000;
	c->max_prehello = 256;
	c->max_sessions_per_uid = 256;
	c->admin_sessions = 16;
	c->reserve_max_pages = 256;
	c->reserve_free_percent = 25;
	c->resume_grace_ms = 10000;
	c->snapshot_interval_ms = 1000;
	remote_defaults(&c->remote);
}

int kvp_conf_load_string(struct kvp_conf *c, const char *text, const char *origin, char *err,
			 size_t errlen)
{
	struct parse *s;
	int r;

	if (!origin)
		origin = "<string>";
	if (!c || !text) {
		if (err && errlen)
			snprintf(err, errlen, "%s: no configuration text", origin);
		return -EINVAL;
	}
	s = parse_new(origin);
	if (!s) {
		if (err && errlen)
			snprintf(err, errlen, "%s: out of memory", origin);
		return -ENOMEM;
	}
	s->str = text;
	r = run_parse(s, err, errlen);
	if (r == 0)
		*c = s->conf;
	free(s);
	return r;
}

int kvp_conf_load_file(struct kvp_conf *c, const char *path, char *err, size_t errlen)
{
	struct parse *s;
	FILE *f;
	int r;

	if (!c || !path) {
		if (err && errlen)
			snprintf(err, errlen, "no configuration file given");
		return -EINVAL;
	}
	f = fopen(path, "re");
	if (!f) {
		r = -errno;
		if (err && errlen)
			snprintf(err, errlen, "%s: cannot open: %s", path, strerror(-r));
		return r;
	}
	s = parse_new(path);
	if (!s) {
		fclose(f);
		if (err && errlen)
			snprintf(err, errlen, "%s: out of memory", path);
		return -ENOMEM;
	}
	s->file = f;
	r = run_parse(s, err, errlen);
	if (r == 0)
		*c = s->conf;
	free(s);
	fclose(f);
	return r;
}

int kvp_conf_load_embedded(struct kvp_conf *c, char *err, size_t errlen)
{
	return kvp_conf_load_string(c, g_embedded, "<embedded>", err, errlen);
}

const char *kvp_conf_embedded_text(void)
{
	return g_embedded;
}

void kvp_pool_conf_copy_access(struct kvp_pool_conf *dst, const struct kvp_pool_conf *src)
{
	dst->session_quota_tokens = src->session_quota_tokens;
	dst->session_lock_quota_tokens = src->session_lock_quota_tokens;
	dst->uid_quota_tokens = src->uid_quota_tokens;
	memcpy(dst->allowed_uids, src->allowed_uids, sizeof(dst->allowed_uids));
	dst->n_allowed_uids = src->n_allowed_uids;
	memcpy(dst->allowed_gids, src->allowed_gids, sizeof(dst->allowed_gids));
	dst->n_allowed_gids = src->n_allowed_gids;
	memcpy(dst->ns_owners, src->ns_owners, sizeof(dst->ns_owners));
	dst->n_ns_owners = src->n_ns_owners;
	dst->pressure_watermark_pct = src->pressure_watermark_pct;
	dst->pressure_watermark_tokens = src->pressure_watermark_tokens;
	dst->pressure_interval_ms = src->pressure_interval_ms;
}

const struct kvp_ns_owner *kvp_pool_conf_ns_owner(const struct kvp_pool_conf *p, uint64_t ns)
{
	for (uint32_t i = 0; i < p->n_ns_owners; i++)
		if (p->ns_owners[i].ns == ns)
			return &p->ns_owners[i];
	return NULL;
}

/* ---- geometry and names ---- */

uint32_t kvp_dtype_size(enum kvp_conf_dtype d)
{
	return (unsigned)d < KVP_CONF_DTYPE_MAX ? g_dtype_sizes[d] : 0;
}

uint64_t kvp_conf_token_bytes(const struct kvp_pool_conf *p)
{
	return (uint64_t)p->layers * 2 * p->kv_heads * p->head_dim * kvp_dtype_size(p->dtype);
}

uint64_t kvp_conf_page_bytes(const struct kvp_pool_conf *p)
{
	return kvp_conf_token_bytes(p) * p->page_tokens;
}

const char *kvp_conf_dtype_name(enum kvp_conf_dtype d)
{
	/* the wire's numbering (names.h) is the config's plus one: 0 is "none" there */
	return (unsigned)d < KVP_CONF_DTYPE_MAX ? kvp_names_dtype((int)d + 1) : "?";
}

const char *kvp_device_kind_name(enum kvp_device_kind k)
{
	return (unsigned)k < KVP_DEVICE_KIND_MAX ? g_device_names[k] : "?";
}

const char *kvp_tristate_name(enum kvp_tristate t)
{
	return (unsigned)t < KVP_TRISTATE_MAX ? g_tristate_names[t] : "?";
}

const char *kvp_eviction_name(enum kvp_eviction e)
{
	return (unsigned)e < KVP_EVICT_MAX ? g_eviction_names[e] : "?";
}

const char *kvp_remote_mode_name(enum kvp_remote_mode m)
{
	return (unsigned)m < KVP_REMOTE_MODE_MAX ? g_remote_mode_names[m] : "?";
}

int kvp_conf_remote_same(const struct kvp_conf *a, const struct kvp_conf *b)
{
	const struct kvp_remote_conf *x = &a->remote, *y = &b->remote;

	if (x->enabled != y->enabled || strcmp(x->seeds, y->seeds) ||
	    x->connect_timeout_ms != y->connect_timeout_ms ||
	    x->command_timeout_ms != y->command_timeout_ms ||
	    x->match_timeout_ms != y->match_timeout_ms ||
	    x->match_max_pages != y->match_max_pages ||
	    x->max_inflight_bytes != y->max_inflight_bytes || x->ttl_s != y->ttl_s ||
	    x->rewrite_after_s != y->rewrite_after_s || x->connections != y->connections)
		return 0;
	for (uint32_t i = 0; i < b->n_pools; i++)
		if (b->pools[i].remote != (i < a->n_pools ? a->pools[i].remote : KVP_REMOTE_OFF))
			return 0;
	return 1;
}
