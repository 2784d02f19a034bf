/* config_parse.h - what the three files of the kvpoold.conf loader share: config.c (the line
 * reader, sections, whole-file checks and errors), config_keys.c (one table of keys per section)
 * and config_values.c (one parser per type of value, and the parse functions of the keys whose
 * values are more than a type). Internal to kvp_conf. */
#pragma once
#include "config.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define SECT_MAX 128
#define KEY_BITS 32

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
	struct cap disk_cap;
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

/* ---- the rows of the key tables (config_keys.c) ---- */

/* How a key's value is read: each type is one case of kvp_conf_key_parse(). Integer and enum
 * fields are written by their size (4 or 8 bytes). */
enum key_type {
	KEY_UINT,	/* a decimal integer in min..max */
	KEY_MS,		/* a duration (units.h) in min..max ms; a bare number counts ms */
	KEY_S,		/* a duration in min..max s; a bare number counts seconds */
	KEY_BYTES,	/* bytes (K/M/G/T, powers of 1024) in min..max; else "expected <expect>" */
	KEY_TOKENS,	/* tokens: "64", "64t" or "64 tokens" */
	KEY_PCT_TOKENS, /* a percent into the field (a double) or tokens into aux (a uint64_t) */
	KEY_ENUM,	/* one of names: its index, or values[index]; else "expected <expect>" */
	KEY_AUTO,	/* "auto" (-1) or a decimal integer in min..max; else "expected <expect>" */
	KEY_PATH,	/* an absolute path that fits the field */
	KEY_USERS,	/* user ids or names into the field (uint32_t[]), the count into aux */
	KEY_GROUPS,	/* groups, as KEY_USERS */
	KEY_CAP,	/* bytes or tokens into struct pool_state; pages in check_pool */
	KEY_FN,		/* its own fn */
};

enum {
	KEY_REQUIRED = 1 << 0, /* a section without the key is refused */
	KEY_PREFIX = 1 << 1,   /* name is a prefix (namespace.N); fn checks repeats itself */
	KEY_ZERO_OK = 1 << 2,  /* KEY_BYTES: 0 is taken too */
	KEY_RELOAD = 1 << 3,   /* a reload applies it to a running pool (copy_access) */
};

typedef void (*key_fn)(struct parse *s, const char *key, const char *v);

struct key_def {
	const char *name;
	enum key_type type;
	uint64_t min, max;	  /* inclusive bounds */
	int64_t def;		  /* default of an integer or enum field */
	const char *def_str;	  /* default of a string field */
	size_t off, size;	  /* the field in the section's struct (or pool_state) */
	size_t aux, aux_size;	  /* a second field: a list's count, a watermark's tokens */
	const char *const *names; /* KEY_ENUM */
	const int *values;	  /* KEY_ENUM: the value of each name; NULL: its index */
	int n_names;		  /* KEY_ENUM */
	const char *expect;	  /* KEY_BYTES, KEY_ENUM, KEY_AUTO: what an error names */
	key_fn fn;		  /* KEY_FN */
	unsigned flags;		  /* KEY_REQUIRED, KEY_PREFIX, KEY_ZERO_OK, KEY_RELOAD */
};

/* Writes x into an integer field of size bytes (4 or 8). */
static inline void kvp_conf_store(void *field, size_t size, uint64_t x)
{
	uint32_t y = (uint32_t)x;

	if (size == sizeof(y))
		memcpy(field, &y, sizeof(y));
	else
		memcpy(field, &x, sizeof(x));
}

/* ---- config.c ---- */

/* An error about key in the current section, at the current line. */
void kvp_conf_key_fail(struct parse *s, const char *key, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* ---- config_keys.c ---- */

/* Parses name = value of the current section (s->kind, not SECT_NONE) through its table.
 * Returns -ENOENT, s untouched, when the section has no such key; else 0, with s failed when the
 * key is repeated or its value is bad. */
int kvp_conf_key_set(struct parse *s, const char *name, const char *value);
/* The first required key of a kind's section that seen (its bits by row) lacks, or NULL. */
const char *kvp_conf_key_missing(enum sect_kind kind, uint32_t seen);
/* The row of name in a kind's table (its bit in seen, its key_line), or -1. */
int kvp_conf_key_index(enum sect_kind kind, const char *name);
/* Fills p with the defaults of a [pool.NAME] section's keys, and zeroes the rest. */
void kvp_pool_conf_defaults(struct kvp_pool_conf *p);

/* ---- config_values.c ---- */

/* Parses v, the value of key, by row k's type into its field of the current section; a bad
 * value fails s. */
void kvp_conf_key_parse(struct parse *s, const struct key_def *k, const char *key, const char *v);
/* The KEY_FN rows' parse functions. */
void kvp_conf_parse_metrics_listen(struct parse *s, const char *key, const char *v);
void kvp_conf_parse_seeds(struct parse *s, const char *key, const char *v);
void kvp_conf_parse_dtype(struct parse *s, const char *key, const char *v);
void kvp_conf_parse_device(struct parse *s, const char *key, const char *v);
void kvp_conf_parse_namespace(struct parse *s, const char *key, const char *v);
void kvp_conf_parse_metrics_allow(struct parse *s, const char *key, const char *v);
void kvp_conf_parse_acl_user(struct parse *s, const char *key, const char *v);
void kvp_conf_parse_password(struct parse *s, const char *key, const char *v);
void kvp_conf_parse_secret(struct parse *s, const char *key, const char *v);
void kvp_conf_parse_remote_scope(struct parse *s, const char *key, const char *v);
