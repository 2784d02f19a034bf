/* config_values.c - how kvpoold.conf's values are read: one parser per type of value (integers
 * in bounds, durations, sizes, tokens, percents, names, paths, user and group lists), reached
 * through a key's row (config_keys.c), and the parse functions of the keys whose values are more
 * than a type (metrics_listen, metrics_allow, seeds, user, password, secret, dtype, device,
 * namespace.N, remote_scope). */
#include "config_parse.h"
#include "units.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <grp.h>
#include <inttypes.h>
#include <pwd.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
		kvp_conf_key_fail(s, key, "expected a %s integer, got '%s'",
				  min > 0 ? "positive" : "non-negative", v);
		return r;
	}
	if (r < 0 || x < min || x > max) {
		kvp_conf_key_fail(s, key,
				  "expected an integer in %" PRIu64 "..%" PRIu64 ", got '%s'", min,
				  max, v);
		return -ERANGE;
	}
	*out = x;
	return 0;
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
		kvp_conf_key_fail(
			s, key,
			"expected a duration: a whole number of %s, or one with a unit (ms, s, "
			"m, h), got '%s'",
			unit, v);
		return -EINVAL;
	}
	if (r < 0 || ms / bare_ms < min) {
		kvp_conf_key_fail(s, key,
				  "expected a duration in %" PRIu64 "..%" PRIu64 " %s, got '%s'",
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
		kvp_conf_key_fail(s, key, "expected %s, got '%s'", expect, v);
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
		kvp_conf_key_fail(s, key, "'%s' does not fit in 64 bits", v);
		return r;
	}
	if (r < 0) {
		kvp_conf_key_fail(
			s, key,
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
			kvp_conf_key_fail(s, key, "out of memory looking up '%s'", tok);
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
			kvp_conf_key_fail(s, key, "unknown %s '%s'", group ? "group" : "user", tok);
			return -EINVAL;
		}
		kvp_conf_key_fail(s, key, "cannot look up %s '%s': %s", group ? "group" : "user",
				  tok, strerror(r));
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
		kvp_conf_key_fail(s, key, "entry longer than %zu characters", cap - 1);
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
		kvp_conf_key_fail(s, key, "'%s' is not a valid %s id", tok,
				  group ? "group" : "user");
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
			kvp_conf_key_fail(s, key, "more than %d entries", KVP_MAX_IDS);
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

/* Tokens: "64", "64t" or "64 tokens". Returns 0, -EINVAL, -ERANGE. */
static int parse_tokens(struct parse *s, const char *key, const char *v, uint64_t *out)
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
		kvp_conf_key_fail(s, key, "'%s' does not fit in 64 bits", v);
		return r;
	}
	if (r < 0) {
		kvp_conf_key_fail(s, key, "expected a non-negative integer, got '%s'", v);
		return r;
	}
	*out = x;
	return 0;
}

/* pressure_watermark = 10% (of each tier's pages, 0 .. 100, decimals allowed) or tokens ("4096t",
 * "4096 tokens", "4096"); 0 = none. One goes into *pct_out or *tokens, the other becomes 0. */
static void parse_pct_tokens(struct parse *s, const char *key, const char *v, double *pct_out,
			     uint64_t *tokens)
{
	size_t n = strlen(v);

	if (n && v[n - 1] == '%') {
		char num[32], *end;
		double pct;

		if (n - 1 >= sizeof(num) || !isdigit((unsigned char)v[0])) {
			kvp_conf_key_fail(
				s, key,
				"expected a percent like 10%% or tokens like 4096t, got '%s'", v);
			return;
		}
		memcpy(num, v, n - 1);
		num[n - 1] = '\0';
		pct = strtod(num, &end);
		if (*end || !(pct >= 0 && pct <= 100)) {
			kvp_conf_key_fail(s, key, "expected a percent in 0..100%%, got '%s'", v);
			return;
		}
		*pct_out = pct;
		*tokens = 0;
		return;
	}
	parse_tokens(s, key, v, tokens);
	*pct_out = 0;
}

/* ---- keys whose values are more than their type ---- */

/* host:port, or empty: no HTTP endpoint. */
void kvp_conf_parse_metrics_listen(struct parse *s, const char *key, const char *v)
{
	const char *colon = strrchr(v, ':');
	size_t hostlen = colon ? (size_t)(colon - v) : 0;
	uint64_t port;
	bool ok;

	if (!*v) {
		s->conf.metrics_listen[0] = '\0';
		return;
	}
	/* unix:PATH: a unix socket, its peers held to the admin rule (metrics_http.c) */
	if (strncmp(v, "unix:", 5) == 0) {
		if (v[5] != '/' || strlen(v) >= sizeof(s->conf.metrics_listen))
			kvp_conf_key_fail(s, key,
					  "expected unix:PATH with an absolute path, at most %zu "
					  "characters in all, got '%s'",
					  sizeof(s->conf.metrics_listen) - 1, v);
		else
			snprintf(s->conf.metrics_listen, sizeof(s->conf.metrics_listen), "%s", v);
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
		kvp_conf_key_fail(s, key,
				  "expected host:port of at most %zu characters (127.0.0.1:9464, "
				  "[::1]:9464), got '%s'",
				  sizeof(s->conf.metrics_listen) - 1, v);
		return;
	}
	snprintf(s->conf.metrics_listen, sizeof(s->conf.metrics_listen), "%s", v);
}

/* metrics_allow = 127.0.0.1, 10.0.0.0/8, ::1, fd00::/8: IPv4 or IPv6 addresses, each with an
 * optional prefix length (none: the whole address), at most KVP_METRICS_ALLOW_MAX. */
void kvp_conf_parse_metrics_allow(struct parse *s, const char *key, const char *v)
{
	struct kvp_conf *c = &s->conf;
	char tok[64];
	int rc;

	c->n_metrics_allow = 0;
	while ((rc = next_entry(s, key, &v, tok, sizeof(tok))) > 0) {
		struct kvp_net *n = &c->metrics_allow[c->n_metrics_allow];
		char *slash = strchr(tok, '/');
		uint64_t bits;
		int max;

		if (c->n_metrics_allow == KVP_METRICS_ALLOW_MAX) {
			kvp_conf_key_fail(s, key, "more than %d entries", KVP_METRICS_ALLOW_MAX);
			return;
		}
		memset(n, 0, sizeof(*n));
		if (slash)
			*slash = '\0';
		if (inet_pton(AF_INET, tok, n->addr) == 1) {
			max = 32;
		} else if (inet_pton(AF_INET6, tok, n->addr) == 1) {
			max = 128;
			n->v6 = 1;
		} else {
			kvp_conf_key_fail(s, key, "'%s' is not an IPv4 or IPv6 address", tok);
			return;
		}
		bits = (uint64_t)max;
		if (slash && (parse_u64(slash + 1, NULL, &bits) < 0 || bits > (uint64_t)max)) {
			kvp_conf_key_fail(s, key, "'/%s' is not a prefix length of 0..%d",
					  slash + 1, max);
			return;
		}
		n->bits = (uint8_t)bits;
		c->n_metrics_allow++;
	}
	if (rc == 0 && !c->n_metrics_allow)
		kvp_conf_key_fail(s, key, "expected addresses or networks (127.0.0.1, 10.0.0.0/8)");
}

/* user = NAME: a Redis ACL user name (printable ASCII, no spaces). */
void kvp_conf_parse_acl_user(struct parse *s, const char *key, const char *v)
{
	size_t n = strlen(v);

	for (size_t i = 0; i < n; i++)
		if (v[i] <= ' ' || v[i] > '~')
			n = 0;
	if (!n || n >= sizeof(s->conf.remote.user)) {
		kvp_conf_key_fail(s, key,
				  "expected a Redis ACL user name of 1..%zu printable characters, "
				  "got '%s'",
				  sizeof(s->conf.remote.user) - 1, v);
		return;
	}
	snprintf(s->conf.remote.user, sizeof(s->conf.remote.user), "%s", v);
}

/* A secret's source: file:PATH (absolute) or credential:NAME (a systemd credential: a file
 * name in $CREDENTIALS_DIRECTORY). The secret itself is never written in the file. */
static void parse_cred(struct parse *s, const char *key, const char *v, char *field, size_t size)
{
	const char *name = strncmp(v, "credential:", 11) == 0 ? v + 11 : NULL;
	bool ok = strlen(v) < size;

	if (strncmp(v, "file:", 5) == 0)
		ok = ok && v[5] == '/';
	else if (name)
		ok = ok && *name && !strchr(name, '/') && strcmp(name, ".") && strcmp(name, "..");
	else
		ok = false;
	if (!ok) {
		kvp_conf_key_fail(s, key,
				  "expected file:PATH (absolute) or credential:NAME (a systemd "
				  "credential), at most %zu characters: the secret itself is never "
				  "written here",
				  size - 1);
		return;
	}
	snprintf(field, size, "%s", v);
}

void kvp_conf_parse_password(struct parse *s, const char *key, const char *v)
{
	parse_cred(s, key, v, s->conf.remote.password, sizeof(s->conf.remote.password));
}

void kvp_conf_parse_secret(struct parse *s, const char *key, const char *v)
{
	parse_cred(s, key, v, s->conf.remote.secret, sizeof(s->conf.remote.secret));
}

/* remote_scope = NAME: 1..63 characters of [A-Za-z0-9._-], as pool names. */
void kvp_conf_parse_remote_scope(struct parse *s, const char *key, const char *v)
{
	size_t n = strlen(v);

	for (size_t i = 0; i < n; i++)
		if (!isalnum((unsigned char)v[i]) && !strchr("._-", v[i]))
			n = 0;
	if (!n || n >= sizeof(s->pool->remote_scope)) {
		kvp_conf_key_fail(s, key, "expected 1..%zu characters of [A-Za-z0-9._-], got '%s'",
				  sizeof(s->pool->remote_scope) - 1, v);
		return;
	}
	snprintf(s->pool->remote_scope, sizeof(s->pool->remote_scope), "%s", v);
}

/* "host:port[, host:port...]": each host a name or IPv4 address (no ':'), each port 1..65535,
 * at most KVP_REMOTE_SEEDS_COUNT. Stored normalized: comma-separated, no spaces. */
void kvp_conf_parse_seeds(struct parse *s, const char *key, const char *v)
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
			kvp_conf_key_fail(s, key, "expected host:port, got '%.*s'", (int)len, tok);
			return;
		}
		for (size_t i = 0; i < hostlen; i++) {
			unsigned char c = (unsigned char)tok[i];

			if (!isalnum(c) && c != '.' && c != '-' && c != '_') {
				kvp_conf_key_fail(s, key,
						  "bad host in '%.*s': a name or IPv4 address "
						  "(A-Z a-z 0-9 . - _)",
						  (int)len, tok);
				return;
			}
		}
		memcpy(num, colon + 1, len - hostlen - 1);
		num[len - hostlen - 1] = '\0';
		if (parse_u64(num, NULL, &port) < 0 || port < 1 || port > 65535) {
			kvp_conf_key_fail(s, key, "bad port in '%.*s': expected 1..65535", (int)len,
					  tok);
			return;
		}
		if (++count > KVP_REMOTE_SEEDS_COUNT) {
			kvp_conf_key_fail(s, key, "more than %d seeds", KVP_REMOTE_SEEDS_COUNT);
			return;
		}
		if (n + len + (n > 0) >= sizeof(out)) {
			kvp_conf_key_fail(s, key, "longer than %zu characters", sizeof(out) - 1);
			return;
		}
		if (n > 0)
			out[n++] = ',';
		memcpy(out + n, tok, len);
		n += len;
	}
	if (count == 0) {
		kvp_conf_key_fail(s, key, "expected at least one host:port (127.0.0.1:7000)");
		return;
	}
	out[n] = '\0';
	memcpy(r->seeds, out, n + 1);
	r->n_seeds = count;
}

/* The names are the wire's (names.h), which kvp_conf_dtype_name() gives. */
void kvp_conf_parse_dtype(struct parse *s, const char *key, const char *v)
{
	const char *names[KVP_CONF_DTYPE_MAX];
	int i;

	for (int d = 0; d < KVP_CONF_DTYPE_MAX; d++)
		names[d] = kvp_conf_dtype_name((enum kvp_conf_dtype)d);
	i = parse_enum(s, key, v, names, KVP_CONF_DTYPE_MAX, "fp16, bf16, fp8 or fp32");

	if (i >= 0)
		s->pool->dtype = (enum kvp_conf_dtype)i;
}

/* cuda:N, cuda (cuda:0), sim or none; the capacity checks want to know it was given. */
void kvp_conf_parse_device(struct parse *s, const char *key, const char *v)
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
		kvp_conf_key_fail(s, key, "expected cuda:N, sim or none, got '%s'", v);
		return;
	}
	s->pst->device_given = true;
}

/* namespace.N = user:alice, group:gpu, user:1000 (the key's N: a namespace number). */
void kvp_conf_parse_namespace(struct parse *s, const char *key, const char *v)
{
	struct kvp_pool_conf *p = s->pool;
	struct kvp_ns_owner *o;
	char tok[256];
	uint64_t ns;
	int rc = 0;

	if (parse_u64(key + strlen("namespace."), NULL, &ns) < 0) {
		kvp_conf_key_fail(s, key, "expected namespace.N with N a namespace number");
		return;
	}
	for (uint32_t i = 0; i < p->n_ns_owners; i++) {
		if (p->ns_owners[i].ns == ns) {
			kvp_conf_key_fail(s, key, "namespace %" PRIu64 " is bound twice", ns);
			return;
		}
	}
	if (p->n_ns_owners == KVP_MAX_NS_OWNERS) {
		kvp_conf_key_fail(s, key, "more than %d namespace.N keys", KVP_MAX_NS_OWNERS);
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
			kvp_conf_key_fail(s, key,
					  "expected user:NAME or group:NAME entries, got '%s'",
					  tok);
			return;
		}
		ids = group ? o->gids : o->uids;
		n = group ? &o->n_gids : &o->n_uids;
		if (*n == KVP_MAX_IDS) {
			kvp_conf_key_fail(s, key, "more than %d %s entries", KVP_MAX_IDS,
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
		kvp_conf_key_fail(s, key, "no owner: give user:NAME or group:NAME entries");
		return;
	}
	p->n_ns_owners++;
}

/* ---- one parser per type ---- */

/* KEY_BYTES: a size in k's bounds (or 0 with KEY_ZERO_OK); tokens mean nothing here. */
static void parse_bytes(struct parse *s, const struct key_def *k, const char *key, const char *v,
			char *field)
{
	struct cap c = { 0 };

	if (parse_cap(s, key, v, &c) < 0)
		return;
	if (c.tokens ||
	    ((c.value || !(k->flags & KEY_ZERO_OK)) && (c.value < k->min || c.value > k->max))) {
		kvp_conf_key_fail(s, key, "expected %s, got '%s'", k->expect, v);
		return;
	}
	kvp_conf_store(field, k->size, c.value);
}

/* KEY_AUTO: "auto" (-1) or a number in k's bounds. */
static void parse_auto(struct parse *s, const struct key_def *k, const char *key, const char *v,
		       char *field)
{
	uint64_t x;

	if (strcmp(v, "auto") == 0) {
		kvp_conf_store(field, k->size, (uint64_t)-1);
		return;
	}
	if (parse_u64(v, NULL, &x) < 0 || x < k->min || x > k->max) {
		kvp_conf_key_fail(s, key, "expected %s, got '%s'", k->expect, v);
		return;
	}
	kvp_conf_store(field, k->size, x);
}

/* KEY_PATH: an absolute path that fits the field. */
static void parse_path(struct parse *s, const struct key_def *k, const char *key, const char *v,
		       char *field)
{
	if (v[0] != '/' || strlen(v) >= k->size) {
		kvp_conf_key_fail(s, key,
				  "expected an absolute path of at most %zu characters, got '%s'",
				  k->size - 1, v);
		return;
	}
	snprintf(field, k->size, "%s", v);
}

void kvp_conf_key_parse(struct parse *s, const struct key_def *k, const char *key, const char *v)
{
	char *base = s->kind == SECT_DAEMON   ? (char *)&s->conf
		     : s->kind == SECT_REMOTE ? (char *)&s->conf.remote
		     : s->kind == SECT_EVENTS ? (char *)&s->conf.events
					      : (char *)s->pool;
	char *field = base + k->off;
	uint64_t x;
	uint32_t u;
	int i;

	switch (k->type) {
	case KEY_UINT:
		if (parse_range(s, key, v, k->min, k->max, &x) == 0)
			kvp_conf_store(field, k->size, x);
		break;
	case KEY_MS:
	case KEY_S:
		if (parse_duration(s, key, v, k->type == KEY_S ? 1000 : 1, k->min, k->max, &u) == 0)
			kvp_conf_store(field, k->size, u);
		break;
	case KEY_BYTES: parse_bytes(s, k, key, v, field); break;
	case KEY_TOKENS:
		if (parse_tokens(s, key, v, &x) == 0)
			kvp_conf_store(field, k->size, x);
		break;
	case KEY_PCT_TOKENS:
		parse_pct_tokens(s, key, v, (double *)field, (uint64_t *)(base + k->aux));
		break;
	case KEY_ENUM:
		i = parse_enum(s, key, v, k->names, k->n_names, k->expect);
		if (i >= 0)
			kvp_conf_store(field, k->size,
				       (uint64_t)(int64_t)(k->values ? k->values[i] : i));
		break;
	case KEY_AUTO: parse_auto(s, k, key, v, field); break;
	case KEY_PATH: parse_path(s, k, key, v, field); break;
	case KEY_USERS:
	case KEY_GROUPS:
		parse_ids(s, key, v, k->type == KEY_GROUPS, (uint32_t *)field,
			  (uint32_t *)(base + k->aux));
		break;
	case KEY_CAP: parse_cap(s, key, v, (struct cap *)((char *)s->pst + k->off)); break;
	case KEY_FN: k->fn(s, key, v); break;
	}
}
