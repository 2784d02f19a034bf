/* config_keys.c - the keys of kvpoold.conf: one table per section, one row per key (name, type,
 * bounds, default, field, whether a reload applies it to a running pool). The INI handler
 * (config.c) goes through the table of the section it is in; the row's type picks the parser
 * (config_values.c), and a key whose value is more than a type names its own. Checks that span
 * several keys run once the whole file is read, in config.c. */
#include "config_parse.h"
#include "names.h"

#include <errno.h>
#include <stddef.h>
#include <string.h>
#include <syslog.h>

#define N_ROWS(a) (sizeof(a) / sizeof((a)[0]))

/* ---- names as written in the file ---- */

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
static const char *const g_disk_mode_names[KVP_DISK_MODE_MAX] = {
	[KVP_DISK_OFF] = "off",
	[KVP_DISK_WRITE_BACK] = "write-back",
	[KVP_DISK_WRITE_THROUGH] = "write-through",
};
static const char *const g_onoff_names[] = { "off", "on" };
static const char *const g_eviction_names[KVP_EVICT_MAX] = {
	[KVP_EVICT_LRU] = "lru",
	[KVP_EVICT_LFU] = "lfu",
};
/* log_level: the names, and the syslog level of each */
static const char *const g_log_level_names[] = {
	"err", "error", "warning", "warn", "notice", "info", "debug",
};
static const int g_log_levels[] = {
	LOG_ERR, LOG_ERR, LOG_WARNING, LOG_WARNING, LOG_NOTICE, LOG_INFO, LOG_DEBUG,
};
_Static_assert(N_ROWS(g_log_level_names) == N_ROWS(g_log_levels), "a level for each name");

/* ---- the tables ---- */

#define FIELD(T, f) .off = offsetof(T, f), .size = sizeof(((T *)0)->f)
#define AUX(T, f) .aux = offsetof(T, f), .aux_size = sizeof(((T *)0)->f)
#define NAMES(a) .names = (a), .n_names = (int)N_ROWS(a)
#define DAEMON(f) FIELD(struct kvp_conf, f)
#define REMOTE(f) FIELD(struct kvp_remote_conf, f)
#define POOL(f) FIELD(struct kvp_pool_conf, f)
#define EVENTS(f) FIELD(struct kvp_conf_events, f)

/* Rows: name, type, min, max, default, then the field and the rest by name. Reloads: reload.c
 * takes the [daemon] keys of the file; [remote] keys and the pool keys without KEY_RELOAD must
 * stay as they are (kvp_conf_remote_same, reload.c's same_pool_shape). */
static const struct key_def g_daemon_keys[] = {
	{ "socket", KEY_PATH, .def_str = KVP_ROOT_SOCKET, DAEMON(socket) },
	{ "allowed_users", KEY_USERS, DAEMON(allowed_uids), AUX(struct kvp_conf, n_allowed_uids) },
	{ "allowed_groups", KEY_GROUPS, DAEMON(allowed_gids),
	  AUX(struct kvp_conf, n_allowed_gids) },
	{ "admin_groups", KEY_GROUPS, DAEMON(admin_gids), AUX(struct kvp_conf, n_admin_gids) },
	{ "keepalive_ms", KEY_MS, 100, 86400000, 10000, DAEMON(keepalive_ms) },
	{ "log_level", KEY_ENUM, .def = LOG_INFO, DAEMON(log_level), NAMES(g_log_level_names),
	  .values = g_log_levels, .expect = "err, warning, notice, info or debug" },
	{ "metrics_listen", KEY_FN, DAEMON(metrics_listen), .fn = kvp_conf_parse_metrics_listen },
	{ "metrics_allow", KEY_FN, DAEMON(metrics_allow), AUX(struct kvp_conf, n_metrics_allow),
	  .fn = kvp_conf_parse_metrics_allow },
	{ "metrics_peer_connections", KEY_UINT, 1, 1024, 4, DAEMON(metrics_peer_connections) },
	{ "metrics_idle_s", KEY_S, 1, 3600, 2, DAEMON(metrics_idle_s) },
	{ "max_sessions", KEY_UINT, 1, 65536, 1024, DAEMON(max_sessions) },
	{ "max_leases_per_session", KEY_UINT, 1, 1u << 20, 4096, DAEMON(max_leases_per_session) },
	{ "max_locks_per_session", KEY_UINT, 1, 1u << 20, 4096, DAEMON(max_locks_per_session) },
	/* at most libkvpool's KVP_PAGE_KEYS_MAX: more keys do not fit in one frame */
	{ "max_keys_per_call", KEY_UINT, 1, 65536, 65536, DAEMON(max_keys_per_call) },
	{ "max_key_bytes", KEY_UINT, 1, 64, 64, DAEMON(max_key_bytes) },
	{ "hello_timeout_ms", KEY_UINT, 100, 600000, 2000, DAEMON(hello_timeout_ms) },
	{ "max_prehello", KEY_UINT, 1, 65536, 256, DAEMON(max_prehello) },
	{ "max_sessions_per_uid", KEY_UINT, 0, 65536, 256, DAEMON(max_sessions_per_uid) },
	{ "admin_sessions", KEY_UINT, 0, 65536, 16, DAEMON(admin_sessions) },
	/* Bytes ("64M", "1G", a plain number), 0 = sized from max_sessions; tokens mean nothing
	 * here. */
	{ "buffer_budget", KEY_BYTES, 1u << 20, UINT64_MAX, 0, DAEMON(buffer_budget),
	  .expect = "0 or a byte size of at least 1M (\"64M\")", .flags = KEY_ZERO_OK },
	{ "reserve_max_pages", KEY_UINT, 0, 32768, 256, DAEMON(reserve_max_pages) },
	{ "reserve_free_percent", KEY_UINT, 1, 100, 25, DAEMON(reserve_free_percent) },
	{ "resume_grace_ms", KEY_UINT, 0, 3600000, 10000, DAEMON(resume_grace_ms) },
	{ "snapshot_interval_ms", KEY_UINT, 0, 3600000, 1000, DAEMON(snapshot_interval_ms) },
};

#define INFLIGHT_MIN (64ull << 10)
#define INFLIGHT_MAX (64ull << 30)

/* The defaults are those of a given [remote] section (config.h). */
static const struct key_def g_remote_keys[] = {
	{ "seeds", KEY_FN, REMOTE(seeds), .fn = kvp_conf_parse_seeds, .flags = KEY_REQUIRED },
	{ "connect_timeout_ms", KEY_MS, 1, 60000, 1000, REMOTE(connect_timeout_ms) },
	{ "command_timeout_ms", KEY_MS, 1, 60000, 500, REMOTE(command_timeout_ms) },
	{ "match_timeout_ms", KEY_MS, 1, 10000, 20, REMOTE(match_timeout_ms) },
	{ "match_max_pages", KEY_UINT, 1, 4096, 64, REMOTE(match_max_pages) },
	{ "max_inflight_bytes", KEY_BYTES, INFLIGHT_MIN, INFLIGHT_MAX, 64ll << 20,
	  REMOTE(max_inflight_bytes), .expect = "bytes in 64K..64G (256M)" },
	{ "ttl_s", KEY_S, 0, INT32_MAX, 86400, REMOTE(ttl_s) },
	{ "rewrite_after_s", KEY_S, 1, INT32_MAX, 3600, REMOTE(rewrite_after_s) },
	{ "connections", KEY_UINT, 1, KVP_REMOTE_CONNS_MAX, KVP_REMOTE_CONNS_MAX,
	  REMOTE(connections) },
	{ "user", KEY_FN, REMOTE(user), .fn = kvp_conf_parse_acl_user },
	{ "password", KEY_FN, REMOTE(password), .fn = kvp_conf_parse_password },
	{ "secret", KEY_FN, REMOTE(secret), .fn = kvp_conf_parse_secret, .flags = KEY_REQUIRED },
};

/* The defaults are those of a given [events] section (config.h). */
static const struct key_def g_events_keys[] = {
	{ "endpoint", KEY_FN, EVENTS(endpoint), .fn = kvp_conf_parse_events_endpoint,
	  .flags = KEY_REQUIRED },
	{ "replay_endpoint", KEY_FN, EVENTS(replay_endpoint),
	  .fn = kvp_conf_parse_events_endpoint },
	{ "topic", KEY_FN, EVENTS(topic), .fn = kvp_conf_parse_events_text },
	{ "source", KEY_FN, EVENTS(source), .fn = kvp_conf_parse_events_text },
	{ "buffer_steps", KEY_UINT, 1, 1u << 20, 10000, EVENTS(buffer_steps) },
	{ "buffer_bytes", KEY_BYTES, 64u << 10, 64ull << 30, 64ll << 20, EVENTS(buffer_bytes),
	  .expect = "bytes in 64K..64G (64M)" },
	{ "hwm", KEY_UINT, 1, 1u << 20, 10000, EVENTS(hwm) },
	{ "batch_us", KEY_UINT, 0, 1000000, 1000, EVENTS(batch_us) },
};

static const struct key_def g_pool_keys[] = {
	{ "layers", KEY_UINT, 1, 1024, POOL(layers), .flags = KEY_REQUIRED },
	{ "kv_heads", KEY_UINT, 1, 1024, POOL(kv_heads), .flags = KEY_REQUIRED },
	{ "head_dim", KEY_UINT, 1, 4096, POOL(head_dim), .flags = KEY_REQUIRED },
	{ "dtype", KEY_FN, .def = KVP_CONF_DTYPE_FP16, POOL(dtype), .fn = kvp_conf_parse_dtype,
	  .flags = KEY_REQUIRED },
	{ "page_tokens", KEY_UINT, 1, 1024, POOL(page_tokens), .flags = KEY_REQUIRED },
	{ "device", KEY_FN, .def = KVP_DEVICE_NONE, POOL(device), .fn = kvp_conf_parse_device },
	{ "device_capacity", KEY_CAP, FIELD(struct pool_state, device_cap) },
	{ "host_capacity", KEY_CAP, FIELD(struct pool_state, host_cap) },
	{ "numa_node", KEY_AUTO, 0, 1023, KVP_NUMA_NODE_AUTO, POOL(numa_node),
	  .expect = "auto or a node number in 0..1023" },
	{ "hugepages", KEY_ENUM, .def = KVP_OFF, POOL(hugepages), NAMES(g_tristate_names),
	  .expect = "off, try or on" },
	{ "mlock", KEY_ENUM, .def = KVP_TRY, POOL(mlock), NAMES(g_tristate_names),
	  .expect = "off, try or on" },
	{ "session_quota", KEY_TOKENS, POOL(session_quota_tokens), .flags = KEY_RELOAD },
	{ "eviction", KEY_ENUM, .def = KVP_EVICT_LRU, POOL(eviction), NAMES(g_eviction_names),
	  .expect = "lru or lfu" },
	{ "session_lock_quota", KEY_TOKENS, POOL(session_lock_quota_tokens), .flags = KEY_RELOAD },
	{ "uid_quota", KEY_TOKENS, POOL(uid_quota_tokens), .flags = KEY_RELOAD },
	{ "allowed_users", KEY_USERS, POOL(allowed_uids), AUX(struct kvp_pool_conf, n_allowed_uids),
	  .flags = KEY_RELOAD },
	{ "allowed_groups", KEY_GROUPS, POOL(allowed_gids),
	  AUX(struct kvp_pool_conf, n_allowed_gids), .flags = KEY_RELOAD },
	{ "namespace.", KEY_FN, POOL(ns_owners), AUX(struct kvp_pool_conf, n_ns_owners),
	  .fn = kvp_conf_parse_namespace, .flags = KEY_PREFIX | KEY_RELOAD },
	{ "pressure_watermark", KEY_PCT_TOKENS, POOL(pressure_watermark_pct),
	  AUX(struct kvp_pool_conf, pressure_watermark_tokens), .flags = KEY_RELOAD },
	{ "pressure_interval_ms", KEY_UINT, 0, 3600000, 100, POOL(pressure_interval_ms),
	  .flags = KEY_RELOAD },
	{ "remote", KEY_ENUM, .def = KVP_REMOTE_OFF, POOL(remote), NAMES(g_remote_mode_names),
	  .expect = "off, spill or write-through" },
	{ "remote_scope", KEY_FN, POOL(remote_scope), .fn = kvp_conf_parse_remote_scope,
	  .flags = KEY_RELOAD },
	{ "disk", KEY_ENUM, .def = KVP_DISK_OFF, POOL(disk), NAMES(g_disk_mode_names),
	  .expect = "off, write-back or write-through" },
	{ "disk_path", KEY_PATH, POOL(disk_path) },
	{ "disk_capacity", KEY_CAP, FIELD(struct pool_state, disk_cap) },
	{ "disk_offset", KEY_BYTES, 4096, UINT64_MAX / 2, 0, POOL(disk_offset),
	  .expect = "0 or a byte offset (\"64G\"), a multiple of 4K", .flags = KEY_ZERO_OK },
	{ "disk_queue_depth", KEY_UINT, 1, 1024, 64, POOL(disk_queue_depth) },
	{ "events", KEY_ENUM, .def = 1, POOL(events), NAMES(g_onoff_names), .expect = "on or off" },
};

_Static_assert(N_ROWS(g_pool_keys) <= KEY_BITS, "too many pool keys");
_Static_assert(N_ROWS(g_daemon_keys) <= KEY_BITS, "too many keys");
_Static_assert(N_ROWS(g_remote_keys) <= KEY_BITS, "too many keys");
_Static_assert(N_ROWS(g_events_keys) <= KEY_BITS, "too many keys");
_Static_assert(sizeof(enum kvp_conf_dtype) == sizeof(uint32_t) &&
		       sizeof(enum kvp_device_kind) == sizeof(uint32_t) &&
		       sizeof(enum kvp_tristate) == sizeof(uint32_t) &&
		       sizeof(enum kvp_eviction) == sizeof(uint32_t) &&
		       sizeof(enum kvp_remote_mode) == sizeof(uint32_t) &&
		       sizeof(enum kvp_disk_mode) == sizeof(uint32_t),
	       "enum fields are written as 4 bytes");

/* ---- through the tables ---- */

static const struct key_def *section_keys(enum sect_kind kind, size_t *n)
{
	switch (kind) {
	case SECT_DAEMON: *n = N_ROWS(g_daemon_keys); return g_daemon_keys;
	case SECT_REMOTE: *n = N_ROWS(g_remote_keys); return g_remote_keys;
	case SECT_POOL: *n = N_ROWS(g_pool_keys); return g_pool_keys;
	case SECT_EVENTS: *n = N_ROWS(g_events_keys); return g_events_keys;
	default: *n = 0; return NULL;
	}
}

static bool key_is(const struct key_def *k, const char *name)
{
	if (k->flags & KEY_PREFIX)
		return strncmp(name, k->name, strlen(k->name)) == 0;
	return strcmp(k->name, name) == 0;
}

int kvp_conf_key_set(struct parse *s, const char *name, const char *value)
{
	const struct key_def *keys;
	uint32_t *seen;
	int *lines;
	size_t n;
	int i;

	keys = section_keys(s->kind, &n);
	if (s->kind == SECT_DAEMON) {
		seen = &s->daemon_seen_keys;
		lines = s->daemon_key_line;
	} else if (s->kind == SECT_REMOTE) {
		seen = &s->remote_seen_keys;
		lines = s->remote_key_line;
	} else if (s->kind == SECT_EVENTS) {
		seen = &s->events_seen_keys;
		lines = s->events_key_line;
	} else {
		seen = &s->pst->seen;
		lines = s->pst->key_line;
	}
	for (i = 0; i < (int)n; i++)
		if (key_is(&keys[i], name))
			break;
	if (i == (int)n)
		return -ENOENT;
	/* namespace.N keys of a pool: their own duplicate check (kvp_conf_parse_namespace). */
	if (!(keys[i].flags & KEY_PREFIX)) {
		if (*seen & (1u << i)) {
			kvp_conf_key_fail(s, name, "given twice (first at line %d)", lines[i]);
			return 0;
		}
		*seen |= 1u << i;
		lines[i] = s->lineno;
	}
	kvp_conf_key_parse(s, &keys[i], name, value);
	return 0;
}

const char *kvp_conf_key_missing(enum sect_kind kind, uint32_t seen)
{
	size_t n;
	const struct key_def *keys = section_keys(kind, &n);

	for (size_t i = 0; i < n; i++)
		if ((keys[i].flags & KEY_REQUIRED) && !(seen & (1u << i)))
			return keys[i].name;
	return NULL;
}

int kvp_conf_key_index(enum sect_kind kind, const char *name)
{
	size_t n;
	const struct key_def *keys = section_keys(kind, &n);

	for (size_t i = 0; i < n; i++)
		if (strcmp(keys[i].name, name) == 0)
			return (int)i;
	return -1;
}

/* Writes the default of each row into its field of base; what has no default stays as it is. */
static void apply_defaults(const struct key_def *keys, size_t n, void *base)
{
	for (size_t i = 0; i < n; i++) {
		const struct key_def *k = &keys[i];

		if (k->def_str)
			snprintf((char *)base + k->off, k->size, "%s", k->def_str);
		else if (k->def)
			kvp_conf_store((char *)base + k->off, k->size, (uint64_t)k->def);
	}
}

void kvp_conf_defaults(struct kvp_conf *c)
{
	memset(c, 0, sizeof(*c));
	apply_defaults(g_daemon_keys, N_ROWS(g_daemon_keys), c);
	apply_defaults(g_remote_keys, N_ROWS(g_remote_keys), &c->remote);
	apply_defaults(g_events_keys, N_ROWS(g_events_keys), &c->events);
}

void kvp_pool_conf_defaults(struct kvp_pool_conf *p)
{
	memset(p, 0, sizeof(*p));
	apply_defaults(g_pool_keys, N_ROWS(g_pool_keys), p);
}

void kvp_pool_conf_copy_access(struct kvp_pool_conf *dst, const struct kvp_pool_conf *src)
{
	for (size_t i = 0; i < N_ROWS(g_pool_keys); i++) {
		const struct key_def *k = &g_pool_keys[i];

		if (!(k->flags & KEY_RELOAD))
			continue;
		memcpy((char *)dst + k->off, (const char *)src + k->off, k->size);
		if (k->aux_size)
			memcpy((char *)dst + k->aux, (const char *)src + k->aux, k->aux_size);
	}
}

/* ---- names ---- */

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

const char *kvp_disk_mode_name(enum kvp_disk_mode m)
{
	return (unsigned)m < KVP_DISK_MODE_MAX ? g_disk_mode_names[m] : "?";
}

const char *kvp_remote_mode_name(enum kvp_remote_mode m)
{
	return (unsigned)m < KVP_REMOTE_MODE_MAX ? g_remote_mode_names[m] : "?";
}
