/* config.h - kvpoold configuration: the INI file format, its defaults and pool geometry. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#define KVP_MAX_POOLS 16
#define KVP_POOL_NAME_MAX 64 /* names are 1..63 characters of [A-Za-z0-9._-] */
#define KVP_MAX_IDS 32	     /* entries per allowed_users / allowed_groups / admin_groups */
#define KVP_SOCKET_PATH_MAX 108
#define KVP_LISTEN_MAX 64
#define KVP_NUMA_NODE_AUTO (-1)
#define KVP_MAX_NS_OWNERS 16 /* namespace.N keys per pool */

enum kvp_conf_dtype {
	KVP_CONF_DTYPE_FP16,
	KVP_CONF_DTYPE_BF16,
	KVP_CONF_DTYPE_FP8,
	KVP_CONF_DTYPE_FP32,
	KVP_CONF_DTYPE_MAX,
};

enum kvp_device_kind {
	KVP_DEVICE_NONE,
	KVP_DEVICE_SIM,
	KVP_DEVICE_CUDA,
	KVP_DEVICE_KIND_MAX,
};

enum kvp_tristate {
	KVP_OFF,
	KVP_TRY,
	KVP_ON,
	KVP_TRISTATE_MAX,
};

enum kvp_eviction {
	KVP_EVICT_LRU,
	KVP_EVICT_LFU,
	KVP_EVICT_MAX,
};

/* remote = of a pool: what its pages do with the [remote] store. */
enum kvp_remote_mode {
	KVP_REMOTE_OFF,		  /* nothing leaves the node */
	KVP_REMOTE_SPILL,	  /* host pages about to be evicted are written out first */
	KVP_REMOTE_WRITE_THROUGH, /* inserted pages are written once they are in the host tier */
	KVP_REMOTE_MODE_MAX,
};

/* disk = of a pool: whether its host pages about to be evicted go to its disk tier first. */
enum kvp_disk_mode {
	KVP_DISK_OFF,		/* no disk tier */
	KVP_DISK_WRITE_BACK,	/* host pages about to be evicted are written to disk_path */
	KVP_DISK_WRITE_THROUGH, /* every page cached in the host tier is written to disk_path */
	KVP_DISK_MODE_MAX,
};
#define KVP_DISK_PATH_MAX 256

#define KVP_REMOTE_SEEDS_MAX 200 /* "host:port,host:port" normalized, with its NUL */
#define KVP_REMOTE_SEEDS_COUNT 16

/* The [remote] section: the Redis Cluster every pool with remote != off shares. Defaults
 * (section given): connect 1000 ms, command 500 ms, match 20 ms and 64 pages, 64 MiB in
 * flight, TTL 86400 s (0 = keys never expire). seeds is required in the section. */
#define KVP_REMOTE_CONNS_MAX 16
#define KVP_CRED_SRC_MAX 192 /* "file:PATH" or "credential:NAME", with its NUL */
#define KVP_ACL_USER_MAX 64

/* The [events] section: KV events for routers (daemon/events/). endpoint: the PUB socket's
 * (required); replay_endpoint: the ROUTER's ("" = no replay); topic: every message's first frame;
 * source: the ownership field of page events (default "kvpool@" and the host name); buffer_steps
 * and buffer_bytes: the replay ring (default 10000 batches, 64M); hwm: the PUB socket's high-water
 * mark in batches (default 10000); batch_us: how long events may wait to be published together
 * (default 1000; 0: at the end of each loop turn). */
#define KVP_EVENTS_ENDPOINT_MAX 128
#define KVP_EVENTS_NAME_MAX 128
struct kvp_conf_events {
	int enabled; /* the section was given */
	char endpoint[KVP_EVENTS_ENDPOINT_MAX];
	char replay_endpoint[KVP_EVENTS_ENDPOINT_MAX];
	char topic[KVP_EVENTS_NAME_MAX];
	char source[KVP_EVENTS_NAME_MAX];
	uint32_t buffer_steps;
	uint64_t buffer_bytes;
	uint32_t hwm;
	uint32_t
		batch_us; /* a batch is published once its first event is this old (0: each turn) */
};

struct kvp_remote_conf {
	int enabled;			  /* the section was given */
	char seeds[KVP_REMOTE_SEEDS_MAX]; /* comma-separated host:port, no spaces */
	uint32_t n_seeds;
	uint32_t connect_timeout_ms;
	uint32_t command_timeout_ms; /* a node whose oldest command waits longer is dropped */
	uint32_t match_timeout_ms;   /* a Match waits at most this long for the existence query */
	uint32_t match_max_pages;    /* pages after the local ones one Match asks about */
	uint64_t max_inflight_bytes; /* spilled / written bytes not yet acknowledged */
	uint32_t ttl_s;
	/* Write-through writes content it wrote before again once this long passed (the cluster
	 * may have lost it: a failover without replica, eviction, a flush) */
	uint32_t rewrite_after_s;
	/* Connections to each master (1..KVP_REMOTE_CONNS_MAX): operations spread over them by
	 * their key's slot, since Redis writes a connection at most 64 KiB per event-loop turn */
	uint32_t connections;
	/* Redis ACL user ("" = the default user) and where its password is read from
	 * ("file:PATH" or "credential:NAME", a systemd credential in $CREDENTIALS_DIRECTORY;
	 * "" = no AUTH); never the password itself */
	char user[KVP_ACL_USER_MAX];
	char password[KVP_CRED_SRC_MAX];
	/* Where the deployment's MAC secret is read from (required, as password) */
	char secret[KVP_CRED_SRC_MAX];
};

/* The metrics endpoint's TCP access rule: peers in one of these networks (metrics_allow). */
#define KVP_METRICS_ALLOW_MAX 16
struct kvp_net {
	uint8_t addr[16]; /* IPv4 in the first 4 bytes */
	uint8_t bits;
	uint8_t v6;
};

/* One namespace.N key of a pool: only these users and groups (and root) insert or match in
 * namespace ns. */
struct kvp_ns_owner {
	uint64_t ns;
	uint32_t uids[KVP_MAX_IDS];
	uint32_t n_uids;
	uint32_t gids[KVP_MAX_IDS];
	uint32_t n_gids;
};

/* One [pool.NAME] section. Capacities are resolved to whole pages at load time:
 * bytes -> floor(bytes / page_bytes), tokens -> ceil(tokens / page_tokens).
 * A tier with 0 pages does not exist. Both counts are <= UINT32_MAX - 1.
 * Defaults of the optional keys: device none, numa_node auto, hugepages off, mlock try,
 * session_quota 0, eviction lru, no per-pool access lists (every admitted user may attach), no
 * owned namespaces. Quotas are in tokens ("64t" or "64"); 0 = none. */
struct kvp_pool_conf {
	char name[KVP_POOL_NAME_MAX];
	uint32_t layers;
	uint32_t kv_heads;
	uint32_t head_dim;
	uint32_t page_tokens;
	enum kvp_conf_dtype dtype;
	enum kvp_device_kind device;
	int cuda_device; /* N of cuda:N; 0 unless device == KVP_DEVICE_CUDA */
	uint64_t device_pages;
	uint64_t host_pages;
	int numa_node; /* KVP_NUMA_NODE_AUTO or a node number */
	enum kvp_tristate hugepages;
	enum kvp_tristate mlock;
	uint64_t session_quota_tokens; /* leased + locked tokens of one session; 0 = no quota */
	uint64_t session_lock_quota_tokens; /* locked tokens of one session; 0 = none */
	uint64_t uid_quota_tokens; /* leased + locked tokens of all of one uid's sessions */
	enum kvp_eviction eviction;
	/* allowed_users / allowed_groups of the pool: empty = every admitted user may attach. */
	uint32_t allowed_uids[KVP_MAX_IDS];
	uint32_t n_allowed_uids;
	uint32_t allowed_gids[KVP_MAX_IDS];
	uint32_t n_allowed_gids;
	struct kvp_ns_owner ns_owners[KVP_MAX_NS_OWNERS];
	uint32_t n_ns_owners;
	enum kvp_remote_mode remote; /* default off; not off needs a [remote] section */
	uint32_t events; /* 1 (default): the pool's pages are published when [events] is given */
	/* Pools share remote content only within one scope: "" = the pool's name */
	char remote_scope[KVP_POOL_NAME_MAX];
	/* pressure_watermark: free pages of a tier below this start pressure notices; a percent
	 * of each tier ("10%") or tokens ("4096t", "4096"); 0 = none (the default). A reload may
	 * change it and pressure_interval_ms (default 100: at least this between two notices of
	 * the pool to one session). */
	double pressure_watermark_pct;
	uint64_t pressure_watermark_tokens;
	uint32_t pressure_interval_ms;
	/* The disk tier (disk != off): a file on a local filesystem or a block device, holding
	 * disk_pages pages (disk_capacity in bytes or tokens, resolved as the other capacities);
	 * each page takes its bytes rounded up to 4 KiB plus a 4 KiB header there, and the log of
	 * its map follows the pages. disk_offset: where the pool's region starts on disk_path
	 * (bytes, a multiple of 4 KiB): pools whose regions do not overlap share one file or block
	 * device. */
	enum kvp_disk_mode disk;
	char disk_path[KVP_DISK_PATH_MAX];
	uint64_t disk_pages;
	uint64_t disk_offset;
	/* disk_queue_depth: the disk tier's reads and writes in flight at most (1 .. 1024,
	 * default 64). */
	uint32_t disk_queue_depth;
};

struct kvp_conf {
	char socket[KVP_SOCKET_PATH_MAX]; /* absolute path */
	/* Empty lists mean the key was not given: access is then left to the socket's mode. */
	uint32_t allowed_uids[KVP_MAX_IDS];
	uint32_t n_allowed_uids;
	uint32_t allowed_gids[KVP_MAX_IDS];
	uint32_t n_allowed_gids;
	uint32_t admin_gids[KVP_MAX_IDS];
	uint32_t n_admin_gids;
	uint32_t keepalive_ms;
	int log_level;			     /* syslog LOG_ERR .. LOG_DEBUG */
	char metrics_listen[KVP_LISTEN_MAX]; /* "host:port", "unix:PATH", "" = no endpoint */
	/* TCP peers the endpoint serves (none given: loopback only), connections of one peer at
	 * most, seconds an idle connection stays open */
	struct kvp_net metrics_allow[KVP_METRICS_ALLOW_MAX];
	uint32_t n_metrics_allow;
	uint32_t metrics_peer_connections;
	uint32_t metrics_idle_s;
	uint32_t max_sessions;
	uint32_t max_leases_per_session;
	uint32_t max_locks_per_session;
	uint32_t max_keys_per_call; /* hash-keyed calls: keys in one call */
	uint32_t max_key_bytes;	    /* hash-keyed calls: bytes of one key, 1 .. 64 */
	/* Admission (admit.h): connections that have not said Hello close after hello_timeout_ms
	 * and are at most max_prehello; one uid holds at most max_sessions_per_uid connections
	 * (0 = no limit); admin_sessions of max_sessions and of max_prehello are kept for admins;
	 * reply and input buffers of all connections together stay within buffer_budget bytes
	 * (0 = sized from max_sessions). */
	uint32_t hello_timeout_ms;
	uint32_t max_prehello;
	uint32_t max_sessions_per_uid;
	uint32_t admin_sessions;
	uint64_t buffer_budget;
	/* Page reserves a session may ask for at Attach: pages per tier (0 = none granted), and
	 * the share of a tier's free pages one fill may take. Defaults 256 and 25. */
	uint32_t reserve_max_pages;
	uint32_t reserve_free_percent;
	struct kvp_pool_conf pools[KVP_MAX_POOLS];
	uint32_t n_pools;
	struct kvp_remote_conf remote;
	struct kvp_conf_events events;
	/* Restarts (snapshot.c): how long after a start sessions of the previous kvpoold may
	 * resume (0: never), and how often the books are checkpointed for a crash (0: only at a
	 * clean stop). */
	uint32_t resume_grace_ms;
	uint32_t snapshot_interval_ms;
};

/* Fills c with the daemon defaults and no pools: socket /run/kvpool/kvpoold.sock,
 * keepalive 10000 ms, log level info, no metrics endpoint, 1024 sessions,
 * 4096 leases and 4096 locks per session, 65536 keys per call of up to 64 bytes each,
 * hello_timeout_ms 2000, 256 pre-Hello connections, 256 connections per uid, 16 admin sessions,
 * buffer_budget 0 (sized from max_sessions). */
void kvp_conf_defaults(struct kvp_conf *c);

/* The three loaders start from kvp_conf_defaults(), apply the INI text and check it whole.
 * On success they return 0 and overwrite *c. On failure *c is untouched, one line naming
 * origin, line and key ("kvpoold.conf:14: key 'page_tokens' in [pool.x]: ...") is written to
 * err (when errlen > 0) and they return -EINVAL (bad content), -ENOMEM, or for
 * kvp_conf_load_file the negative errno of opening or reading the file.
 * Unknown sections and keys are errors. Lines hold at most 199 characters (inih's buffer). */
int kvp_conf_load_file(struct kvp_conf *c, const char *path, char *err, size_t errlen);
/* origin names the text in messages; NULL means "<string>". */
int kvp_conf_load_string(struct kvp_conf *c, const char *text, const char *origin, char *err,
			 size_t errlen);
/* Loads the built-in configuration (one sim pool "default", ~128 MiB per tier) with origin
 * "<embedded>". Returns as kvp_conf_load_string. */
int kvp_conf_load_embedded(struct kvp_conf *c, char *err, size_t errlen);
/* The INI text kvp_conf_load_embedded() loads. */
const char *kvp_conf_embedded_text(void);

/* Bytes of one token of KV: layers * 2 (K and V) * kv_heads * head_dim * dtype size. */
uint64_t kvp_conf_token_bytes(const struct kvp_pool_conf *p);
/* Bytes of one page: token bytes * page_tokens. */
uint64_t kvp_conf_page_bytes(const struct kvp_pool_conf *p);
/* Bytes of one element of dtype d; 0 for an out-of-range d. */
uint32_t kvp_dtype_size(enum kvp_conf_dtype d);

/* Copies what a reload may change in a running pool (quotas, access lists, owned namespaces,
 * pressure notices: the pool keys config_keys.c marks KEY_RELOAD) from src to dst. */
void kvp_pool_conf_copy_access(struct kvp_pool_conf *dst, const struct kvp_pool_conf *src);
/* The namespace.N entry of ns in p, or NULL when ns is shared. */
const struct kvp_ns_owner *kvp_pool_conf_ns_owner(const struct kvp_pool_conf *p, uint64_t ns);

/* Names as written in the file ("bf16", "sim", "try", "lru"); "?" for out-of-range values. */
const char *kvp_conf_dtype_name(enum kvp_conf_dtype d);
const char *kvp_device_kind_name(enum kvp_device_kind k);
const char *kvp_tristate_name(enum kvp_tristate t);
const char *kvp_eviction_name(enum kvp_eviction e);
const char *kvp_remote_mode_name(enum kvp_remote_mode m); /* "off", "spill", "write-through" */
const char *kvp_disk_mode_name(enum kvp_disk_mode m);	  /* "off", "write-back", "write-through" */

/* Whether b configures the remote tier as a does: the same [remote] section, each pool of b
 * with the mode of a's pool at its index (off for pools a does not have). */
int kvp_conf_remote_same(const struct kvp_conf *a, const struct kvp_conf *b);
/* Whether b configures KV events as a does: the same [events] section (or none in both), and
 * each pool of a the same events key in b (a pool b adds may say either). 1 or 0. */
int kvp_conf_events_same(const struct kvp_conf *a, const struct kvp_conf *b);
