/* config.c - loads kvpoold.conf (INI, parsed by libinih) into struct kvp_conf.
 *
 * libinih does the parsing. It reads through our line reader, which counts lines (so every
 * error names file:line), refuses over-long lines instead of letting inih split them, notes
 * section headers (so a repeated section is seen even when it has no keys, and names longer
 * than the 49 characters inih keeps are whole) and notes indented lines (inih reads those as
 * continuation lines, which this format does not take). Parsing stops at the first error.
 * Everything goes into a temporary that is copied out only when the whole file is valid.
 * The keys of each section are rows of a table (config_keys.c); their values are read by one
 * parser per type (config_values.c). */
#include "config.h"
#include "config_parse.h"

#include <ctype.h>
#include <errno.h>
#include <ini.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
void kvp_conf_key_fail(struct parse *s, const char *key, const char *fmt, ...)
{
	char msg[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	fail_at(s, s->lineno, "key '%s' in [%s]: %s", key, s->sect, msg);
}

/* ---- sections ---- */

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
	if (strcmp(s->sect, "events") == 0) {
		if (s->events_line) {
			fail_at(s, s->lineno, "[events] appears twice (first at line %d)",
				s->events_line);
			return;
		}
		s->events_line = s->lineno;
		s->conf.events.enabled = 1;
		s->kind = SECT_EVENTS;
		return;
	}
	if (strncmp(s->sect, "pool.", 5) != 0) {
		fail_at(s, s->lineno,
			"unknown section [%s]: expected [daemon], [remote], [events] or [pool.NAME]",
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
	kvp_pool_conf_defaults(s->pool);
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

	if (kvp_conf_key_set(s, name, value) == -ENOENT) {
		fail_at(s, s->lineno, "unknown key '%s' in [%s]", name, s->sect);
		return 0;
	}
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

/* The disk tier's keys: disk != off needs disk_path, disk_capacity and a host tier; disk_offset
 * is a multiple of 4 KiB (direct I/O); the disk tier takes the evicted host pages that remote =
 * spill would. Pools on one path need disjoint regions: the budget check (budget_disk.c) says
 * so, as it says whether a region fits. */
static int check_disk(struct parse *s, uint32_t idx)
{
	struct kvp_pool_conf *p = &s->conf.pools[idx];
	struct pool_state *ps = &s->ps[idx];
	int line = ps->key_line[kvp_conf_key_index(SECT_POOL, "disk")];

	if (resolve_cap(s, p, "disk_capacity", &ps->disk_cap, &p->disk_pages) < 0)
		return -EINVAL;
	if (p->disk == KVP_DISK_OFF)
		return 0;
	if (!p->disk_path[0] || !p->disk_pages) {
		fail_at(s, line,
			"key 'disk' in [pool.%s]: disk = %s needs disk_path and a nonzero "
			"disk_capacity",
			p->name, kvp_disk_mode_name(p->disk));
		return -EINVAL;
	}
	if (!p->host_pages) {
		fail_at(s, line,
			"key 'disk' in [pool.%s]: disk = %s needs a host tier (host_capacity)",
			p->name, kvp_disk_mode_name(p->disk));
		return -EINVAL;
	}
	if (p->remote == KVP_REMOTE_SPILL) {
		fail_at(s, line,
			"key 'disk' in [pool.%s]: the disk tier takes the host pages about to be "
			"evicted; with it, remote = spill has nothing left to write (use remote = "
			"write-through, or disk = off)",
			p->name);
		return -EINVAL;
	}
	if (p->disk_offset % 4096) {
		fail_at(s, ps->key_line[kvp_conf_key_index(SECT_POOL, "disk_offset")],
			"key 'disk_offset' in [pool.%s]: %lu is not a multiple of 4096 (the disk "
			"is read and written with direct I/O)",
			p->name, (unsigned long)p->disk_offset);
		return -EINVAL;
	}
	if (p->disk == KVP_DISK_WRITE_THROUGH && p->disk_pages < p->host_pages) {
		fail_at(s, ps->key_line[kvp_conf_key_index(SECT_POOL, "disk_capacity")],
			"key 'disk_capacity' in [pool.%s]: disk = write-through writes every page "
			"the host tier caches: the disk tier needs room for at least the host tier's "
			"%lu pages, not %lu",
			p->name, (unsigned long)p->host_pages, (unsigned long)p->disk_pages);
		return -EINVAL;
	}
	return 0;
}

static int check_pool(struct parse *s, uint32_t idx)
{
	struct kvp_pool_conf *p = &s->conf.pools[idx];
	struct pool_state *ps = &s->ps[idx];
	const char *dev = kvp_device_kind_name(p->device);
	const char *missing = kvp_conf_key_missing(SECT_POOL, ps->seen);
	int remote_line = ps->key_line[kvp_conf_key_index(SECT_POOL, "remote")];

	if (missing) {
		fail_at(s, ps->line, "[pool.%s]: missing required key '%s'", p->name, missing);
		return -EINVAL;
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
		fail_at(s, remote_line,
			"key 'remote' in [pool.%s]: remote = %s needs a [remote] section with "
			"seeds",
			p->name, kvp_remote_mode_name(p->remote));
		return -EINVAL;
	}
	if (ps->key_line[kvp_conf_key_index(SECT_POOL, "events")] && p->events &&
	    !s->conf.events.enabled) {
		fail_at(s, ps->key_line[kvp_conf_key_index(SECT_POOL, "events")],
			"key 'events' in [pool.%s]: events = on needs an [events] section with an "
			"endpoint",
			p->name);
		return -EINVAL;
	}
	if (p->remote != KVP_REMOTE_OFF && !p->host_pages) {
		fail_at(s, remote_line,
			"key 'remote' in [pool.%s]: remote = %s needs a host tier (host_capacity)",
			p->name, kvp_remote_mode_name(p->remote));
		return -EINVAL;
	}
	return check_disk(s, idx);
}

static int check_all(struct parse *s)
{
	const char *missing = kvp_conf_key_missing(SECT_REMOTE, s->remote_seen_keys);

	if (s->conf.n_pools == 0) {
		fail_at(s, 0, "no [pool.NAME] section: at least one pool is required");
		return -EINVAL;
	}
	if (s->remote_line && missing) {
		fail_at(s, s->remote_line, "[remote]: missing required key '%s'", missing);
		return -EINVAL;
	}
	missing = kvp_conf_key_missing(SECT_EVENTS, s->events_seen_keys);
	if (s->events_line && missing) {
		fail_at(s, s->events_line, "[events]: missing required key '%s'", missing);
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

const struct kvp_ns_owner *kvp_pool_conf_ns_owner(const struct kvp_pool_conf *p, uint64_t ns)
{
	for (uint32_t i = 0; i < p->n_ns_owners; i++)
		if (p->ns_owners[i].ns == ns)
			return &p->ns_owners[i];
	return NULL;
}

/* ---- geometry and names ---- */

static const uint32_t g_dtype_sizes[KVP_CONF_DTYPE_MAX] = {
	[KVP_CONF_DTYPE_FP16] = 2,
	[KVP_CONF_DTYPE_BF16] = 2,
	[KVP_CONF_DTYPE_FP8] = 1,
	[KVP_CONF_DTYPE_FP32] = 4,
};

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

int kvp_conf_remote_same(const struct kvp_conf *a, const struct kvp_conf *b)
{
	const struct kvp_remote_conf *x = &a->remote, *y = &b->remote;

	if (x->enabled != y->enabled || strcmp(x->seeds, y->seeds) ||
	    x->connect_timeout_ms != y->connect_timeout_ms ||
	    x->command_timeout_ms != y->command_timeout_ms ||
	    x->match_timeout_ms != y->match_timeout_ms ||
	    x->match_max_pages != y->match_max_pages ||
	    x->max_inflight_bytes != y->max_inflight_bytes || x->ttl_s != y->ttl_s ||
	    x->rewrite_after_s != y->rewrite_after_s || x->connections != y->connections ||
	    strcmp(x->user, y->user) || strcmp(x->password, y->password) ||
	    strcmp(x->secret, y->secret))
		return 0;
	for (uint32_t i = 0; i < b->n_pools; i++)
		if (b->pools[i].remote != (i < a->n_pools ? a->pools[i].remote : KVP_REMOTE_OFF))
			return 0;
	return 1;
}
