/* kvpool.h - libkvpool, the client library of kvpool.
 *
 * An engine process connects to kvpoold, attaches to a pool, maps the pool's tier memory
 * directly (memfd host pages, sim device pages, or CUDA device memory imported from a POSIX
 * fd), leases token slots, publishes finished prefixes to the shared prefix cache and matches
 * them later. No KV byte passes through the daemon.
 *
 * Conventions
 * - Every int-returning function returns 0 (or a count) on success and a negative enum
 *   kvp_code on failure (-KVP_E_OUT_OF_CAPACITY, ...). When `err` is not NULL it receives the
 *   code, a message for operators and the typed detail the daemon sent; callers switch on
 *   err->code and the detail fields, never on the message.
 * - Constructors return NULL on failure and fill `err`.
 * - Output parameters are untouched on failure.
 * - Threads: a struct kvp_client (and the pools attached through it) is not thread-safe.
 *   Use one client per thread, or serialise calls on a shared one with a lock of your own.
 *   A struct kvp_mapping's references may be taken and dropped from any thread.
 * - Structs the library fills or reads that may grow start with `size_t struct_size`, which
 *   the caller sets to sizeof(the struct it was compiled with): the library reads and writes
 *   only that many bytes, so a newer library serves an older caller. A struct_size smaller
 *   than the struct's first version is -KVP_E_INVALID_ARGUMENT.
 * - Names are kvp_<object>_<verb>: kvp_client_*, kvp_pool_*, kvp_mapping_*, kvp_lease_*,
 *   kvp_cache_*, kvp_session_*, kvp_admin_*.
 * - Plain C types only, so the library can be called through ctypes or cffi.
 * - Symbol versions (libkvpool.map, one node per release): the calls of 0.2 are in KVPOOL_0.2;
 *   those added in 0.3, marked "(0.3)" below, in KVPOOL_0.3.
 */
#ifndef KVPOOL_H
#define KVPOOL_H

#include <stddef.h>
#include <stdint.h>

#include "kvpool_caps.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVP_PROTOCOL_VERSION 1

/* Codes 0..14 are the daemon's (the wire's Code; a newer daemon may send others below 100, an
 * out-of-range one is reported as KVP_E_PROTOCOL); 100.. are raised by the library itself. */
enum kvp_code {
	KVP_OK = 0,
	KVP_E_OUT_OF_CAPACITY = 1,
	KVP_E_HOST_BUDGET_EXCEEDED = 2,
	KVP_E_QUOTA_EXCEEDED = 3,
	KVP_E_NO_SUCH_POOL = 4,
	KVP_E_GEOMETRY_MISMATCH = 5,
	KVP_E_NOT_FOUND = 6,
	KVP_E_INVALID_ARGUMENT = 7,
	KVP_E_PERMISSION_DENIED = 8,
	KVP_E_PROTOCOL = 9,
	KVP_E_VERSION = 10,
	KVP_E_SHUTTING_DOWN = 11,
	KVP_E_LIMIT_EXCEEDED = 12,
	KVP_E_UNAVAILABLE = 13,
	KVP_E_INTERNAL = 14,
	/* kvpoold restarted while the call was in flight: retry it (the library reconnects and
	 * resumes the session; see kvp_client_opts.reconnect_ms). */
	KVP_E_RESTARTED = 15,
	KVP_E_NO_DAEMON = 100, /* connect failed: sys_errno says why */
	KVP_E_TRANSPORT = 101, /* the connection failed or closed mid-call: sys_errno says why */
	KVP_E_NOMEM = 102,
	KVP_E_MAP = 103,    /* mapping a tier's memory failed: sys_errno or message say why */
	KVP_E_BUFFER = 104, /* a caller buffer is too small for the reply */
	KVP_E_AGAIN = 105,  /* nothing waits now (kvp_client_event_next): poll and retry */
	/* The client was connected by another process: this one was forked from it since. Its
	 * session, leases and locks are the connecting process's; a child connects its own
	 * client (kvp_client_close of the inherited one is safe: it sends nothing). */
	KVP_E_FORKED = 106,
	KVP_CODE_MAX
};

enum kvp_tier { KVP_TIER_DEVICE = 0, KVP_TIER_HOST = 1, KVP_TIER_MAX };
enum kvp_backend {
	KVP_BACKEND_NONE = 0,
	KVP_BACKEND_SIM = 1,
	KVP_BACKEND_CUDA = 2,
	KVP_BACKEND_MEMFD = 3,
	KVP_BACKEND_MAX
};
enum kvp_dtype {
	KVP_DTYPE_NONE = 0,
	KVP_DTYPE_FP16 = 1,
	KVP_DTYPE_BF16 = 2,
	KVP_DTYPE_FP8 = 3,
	KVP_DTYPE_FP32 = 4,
	KVP_DTYPE_MAX
};
/* Which host memory limit binds in a HOST_BUDGET_EXCEEDED. */
enum kvp_limit {
	KVP_LIMIT_NONE = 0,
	KVP_LIMIT_MEM_AVAILABLE,
	KVP_LIMIT_NUMA_NODE_FREE,
	KVP_LIMIT_CGROUP_MEMORY_MAX,
	KVP_LIMIT_RLIMIT_MEMLOCK,
	KVP_LIMIT_HUGEPAGES_FREE,
	KVP_LIMIT_MAX
};
enum kvp_detail {
	KVP_DETAIL_NONE = 0,
	KVP_DETAIL_CAPACITY,
	KVP_DETAIL_BUDGET,
	KVP_DETAIL_QUOTA,
	KVP_DETAIL_GEOMETRY,
	KVP_DETAIL_LIMIT,
	KVP_DETAIL_MAX
};

struct kvp_geometry {
	uint32_t layers;
	uint32_t kv_heads;
	uint32_t head_dim;
	uint32_t dtype; /* enum kvp_dtype */
	uint32_t page_tokens;
};

struct kvp_error {
	int code;      /* enum kvp_code */
	int sys_errno; /* for KVP_E_NO_DAEMON, KVP_E_TRANSPORT, KVP_E_MAP */
	char message[512];
	int detail; /* enum kvp_detail: which of the structs below is filled */
	struct {
		uint32_t tier; /* enum kvp_tier */
		uint64_t requested_tokens, free_tokens, evictable_tokens, protected_tokens;
		uint64_t leased_tokens, total_tokens;
	} capacity;
	struct {
		uint64_t requested_bytes, available_bytes;
		uint32_t limit; /* enum kvp_limit */
		int32_t numa_node;
		char pool[64];
	} budget;
	struct {
		uint64_t quota_tokens, held_tokens, requested_tokens;
	} quota;
	struct {
		struct kvp_geometry expected, actual;
	} geometry;
	struct {
		char what[64];
		uint64_t limit;
	} limit;
	/* 0.3: of capacity.leased_tokens, those booked to sessions' page reserves (what kvpoold
	 * could not take back from them before refusing). */
	uint64_t capacity_reserved_tokens;
	uint64_t reserved[15]; /* room for details a later version adds, without an ABI change */
};

/* Static names: of a code ("OUT_OF_CAPACITY", the sign ignored), a limit, a tier ("device",
 * "host"), a backend ("sim", "cuda", "memfd", "none"), a dtype ("fp16", ...); "UNKNOWN" or "?"
 * for values out of range. */
const char *kvp_code_name(int code);
const char *kvp_limit_name(int limit);
const char *kvp_tier_name(int tier);
const char *kvp_backend_name(int backend);
const char *kvp_dtype_name(int dtype);

/* ---- connection ---- */
struct kvp_client;

/* Writes the socket path a client uses when none is given: $KVPOOL_SOCKET, else
 * /run/kvpool/kvpoold.sock for root, else $XDG_RUNTIME_DIR/kvpool/kvpoold.sock.
 * Returns buf, or NULL when it does not fit in len. */
const char *kvp_client_default_socket(char *buf, size_t len);

struct kvp_client_opts {
	size_t struct_size;
	const char *name;		/* shown by `kvpoolctl sessions`; NULL: "" */
	uint64_t capabilities;		/* KVP_CAP_* offered (kvp_client_connect: KVP_CAP_ALL) */
	uint64_t required_capabilities; /* KVP_CAP_* the daemon must agree to, else KVP_E_VERSION */
	uint32_t timeout_ms;		/* as kvp_client_set_timeout, applied from Hello on */
	uint64_t flags; /* 0.3: KVP_CLIENT_F_*; read only when struct_size reaches it */
	/* When the connection is lost and a restarted kvpoold (a new instance) answers within
	 * this many ms, the library reconnects, resumes the session with its token (leases and
	 * locks come back within the daemon's resume grace), re-attaches every pool (a tier
	 * whose memory is the same file keeps its mapping; otherwise it is mapped anew) and the
	 * call in flight returns -KVP_E_RESTARTED. Retries back off from 10 to 250 ms; when none
	 * answers in time the call returns -KVP_E_TRANSPORT and so do the later ones (one try per
	 * lost connection: close the client and connect anew). 0: 3000; KVP_RECONNECT_NEVER: a
	 * lost connection stays lost. Read only when struct_size reaches it. */
	uint32_t reconnect_ms;
};
#define KVP_RECONNECT_NEVER UINT32_MAX
/* Every kvp_pool_attach of the client asks for pressure notices (granted when KVP_CAP_EVENTS
 * is agreed; kvp_pool_pressure_notices tells). */
#define KVP_CLIENT_F_PRESSURE (UINT64_C(1) << 0)
/* Connects to path (NULL: kvp_client_default_socket) and says Hello. A path that does not fit
 * a unix socket address is refused (KVP_E_INVALID_ARGUMENT), never truncated. Returns the
 * client, or NULL with err filled (KVP_E_NO_DAEMON, KVP_E_VERSION, KVP_E_PERMISSION_DENIED,
 * KVP_E_TRANSPORT, KVP_E_INVALID_ARGUMENT, ...). */
struct kvp_client *kvp_client_connect_opts(const char *path, const struct kvp_client_opts *opts,
					   struct kvp_error *err);
/* kvp_client_connect_opts with name, every capability offered and none required. */
struct kvp_client *kvp_client_connect(const char *path, const char *name, struct kvp_error *err);
/* Closes the connection; the daemon returns every lease and lock of the session. Detaches
 * every pool still attached (a struct kvp_mapping still referenced stays mapped). Accepts
 * NULL. */
void kvp_client_close(struct kvp_client *c);
uint64_t kvp_client_session_id(const struct kvp_client *c);
/* Daemon version string as sent in the Hello reply. */
const char *kvp_client_daemon_version(const struct kvp_client *c);
/* The capabilities both sides agreed to in Hello (0 from a daemon that knows none). */
uint64_t kvp_client_capabilities(const struct kvp_client *c);
/* Sets a receive timeout for every call (0 = wait forever, the default). Returns 0 or
 * -KVP_E_INVALID_ARGUMENT. A call that times out returns -KVP_E_TRANSPORT (sys_errno EAGAIN)
 * and the client must then be closed. */
int kvp_client_set_timeout(struct kvp_client *c, uint32_t ms);

/* Round trip. Returns 0 or a negative code. */
int kvp_client_ping(struct kvp_client *c, struct kvp_error *err);

/* ---- events: frames the daemon sends unasked ----
 * A frame that answers no call of this client (id 0 carrying a result, or an id the client
 * never used) is queued as an event (at most KVP_CLIENT_MAX_EVENTS; later ones are dropped and
 * counted); descriptors arriving with it are closed. A reply to a call given up earlier is
 * discarded with its descriptors. Calls never return an event's frame. */
#define KVP_CLIENT_MAX_EVENTS 64
struct kvp_event {
	size_t struct_size;
	uint32_t type;	    /* the Response's result field number (kvpool.proto), 0 for none */
	int32_t code;	    /* the frame's status code (0: OK) */
	uint64_t id;	    /* the frame's id (0: pushed) */
	uint64_t dropped;   /* events dropped for a full queue since the last one taken */
	void *payload;	    /* caller's buffer for the frame's protobuf Response, or NULL */
	size_t payload_cap; /* its size */
	size_t payload_len; /* set: the frame's size; min(payload_len, payload_cap) were copied */
};
/* A descriptor to poll for POLLIN (owned by the client, do not close or read it): readable
 * when an event is queued or bytes from the daemon wait in the socket. When it polls readable,
 * call kvp_client_event_next until it returns -KVP_E_AGAIN, then poll again (a call made
 * meanwhile may have queued events: poll readable again tells). Returns the fd, or
 * -KVP_E_TRANSPORT when the connection was lost, -KVP_E_NOMEM. */
int kvp_client_event_fd(struct kvp_client *c);
/* Reads what waits in the socket without blocking, then takes the oldest queued event into
 * ev (struct_size, payload and payload_cap set by the caller). Returns 0, -KVP_E_AGAIN when
 * none is queued, -KVP_E_INVALID_ARGUMENT, or -KVP_E_TRANSPORT (the connection failed; queued
 * events are still handed out first). */
int kvp_client_event_next(struct kvp_client *c, struct kvp_event *ev, struct kvp_error *err);

/* ---- pressure notices (0.3): an event pushed for a pool attached with KVP_CLIENT_F_PRESSURE ----
 * One comes when a tier's free pages fall below the pool's pressure_watermark (recovered 0),
 * before the daemon has to evict for lack of free pages, and one when they are back at or
 * above it (recovered 1). The daemon sends at most one per pool every pressure_interval_ms and
 * holds at most one per pool and tier unsent: a newer state replaces it (coalesced counts
 * those replaced), so a client that is slow to read sees the latest state, never a backlog. */
#define KVP_EVENT_PRESSURE 60 /* kvp_event.type of a pressure notice */
struct kvp_pressure {
	size_t struct_size;
	uint32_t pool_id;
	uint32_t tier;	    /* enum kvp_tier */
	uint32_t recovered; /* 0: below the watermark now; 1: back at or above it */
	uint32_t coalesced; /* earlier states of this tier replaced before they were sent */
	uint64_t free_tokens, evictable_tokens;
	uint64_t reserved_tokens; /* in clients' page reserves, unused (0 without reserves) */
	uint64_t watermark_tokens, total_tokens;
	uint64_t seq; /* the tier's pressure changes so far: a gap means states were coalesced */
	char pool[64];
};
/* (0.3) Decodes an event taken by kvp_client_event_next (its whole payload copied: payload_len <=
 * payload_cap) into out (out->struct_size set by the caller). Returns 0, -KVP_E_INVALID_ARGUMENT
 * (not a pressure notice, or a struct too small), -KVP_E_BUFFER (the payload was cut short) or
 * -KVP_E_PROTOCOL (not a valid notice). */
int kvp_pressure_decode(const struct kvp_event *ev, struct kvp_pressure *out,
			struct kvp_error *err);

#define KVP_STATUS_MAX_POOLS 16
#define KVP_STATUS_MAX_COUNTERS 32
#define KVP_STATUS_MORE_COUNTERS 64
struct kvp_counter {
	char name[48];
	uint64_t value;
};
struct kvp_tier_status {
	uint32_t present;
	uint32_t backend; /* enum kvp_backend */
	uint64_t total_tokens, free_tokens, leased_tokens, cached_tokens;
	uint64_t evictable_tokens, protected_tokens;
	int32_t numa_node;
	uint64_t evicted_tokens;
};
struct kvp_pool_status {
	char name[64];
	uint32_t pool_id;
	struct kvp_geometry geometry;
	struct kvp_tier_status tiers[KVP_TIER_MAX];
	uint64_t hit_tokens, queried_tokens;
	uint64_t token_bytes;
	uint32_t sessions;
	uint64_t session_quota_tokens;
	char eviction[16];
	uint64_t nodes, demoted_tokens, promoted_tokens;
	uint64_t allocs, frees, alloc_failures;
	uint32_t n_counters; /* the pool's counters, in the daemon's order */
	struct kvp_counter counters[KVP_STATUS_MAX_COUNTERS];
};
struct kvp_status {
	size_t struct_size;
	char daemon_version[32];
	uint64_t uptime_ms;
	uint32_t sessions;
	int32_t pid;
	uint32_t draining;
	uint32_t n_pools; /* pools beyond KVP_STATUS_MAX_POOLS are not listed */
	struct kvp_pool_status pools[KVP_STATUS_MAX_POOLS];
	uint32_t n_counters; /* the daemon's counters */
	struct kvp_counter counters[KVP_STATUS_MAX_COUNTERS];
	/* 0.3: per pool (as pools[]) and tier, tokens reserved as the destinations of demotion
	 * copies still in flight (neither free, leased nor cached: free + leased + cached +
	 * moving == total). Written only when struct_size reaches it. */
	uint64_t moving_tokens[KVP_STATUS_MAX_POOLS][KVP_TIER_MAX];
	/* 0.3: the daemon's counters past the first KVP_STATUS_MAX_COUNTERS (the remote tier's,
	 * when kvpoold has one), in the daemon's order. Written only when struct_size reaches it.
	 */
	uint32_t n_more_counters;
	struct kvp_counter more_counters[KVP_STATUS_MORE_COUNTERS];
};
/* Daemon status into out (out->struct_size set). Returns 0 or a negative code. */
int kvp_client_status(struct kvp_client *c, struct kvp_status *out, struct kvp_error *err);
/* Prometheus text exposition into buf (NUL-terminated). Returns the length, or a negative
 * code (KVP_E_BUFFER when len is too small). */
int kvp_client_metrics(struct kvp_client *c, char *buf, size_t len, struct kvp_error *err);

/* Listings fill an array of entries: the caller sets entries[0].struct_size, which is the
 * array's stride, and the library sets it in every entry written. They return the number of
 * entries the daemon listed (entries[0..min(count, cap)) written), or a negative code. */
struct kvp_session_info {
	size_t struct_size;
	uint64_t session_id;
	int32_t pid;
	uint32_t uid, gid;
	char name[64];
	uint64_t leased_tokens, locked_tokens;
	uint32_t leases, locks;
	uint64_t age_ms, idle_ms;
};
/* The connected sessions. */
int kvp_session_list(struct kvp_client *c, struct kvp_session_info *entries, uint32_t cap,
		     struct kvp_error *err);

/* ---- pools ---- */
struct kvp_pool;
struct kvp_mapping;

/* Attaches to pool `name` and maps its tiers. expected may be NULL; otherwise every nonzero
 * field must equal the pool's (else KVP_E_GEOMETRY_MISMATCH with both geometries in err).
 * Device tiers of backend cuda are imported with the CUDA driver API when libkvpool was built
 * with CUDA (else kvp_pool_tier_base returns NULL and kvp_pool_tier_fd gives the fd).
 * Returns the pool or NULL (KVP_E_NO_SUCH_POOL, KVP_E_GEOMETRY_MISMATCH, KVP_E_MAP, ...). */
struct kvp_pool *kvp_pool_attach(struct kvp_client *c, const char *name,
				 const struct kvp_geometry *expected, struct kvp_error *err);
/* Attach options (0.3). */
struct kvp_pool_opts {
	size_t struct_size;
	const struct kvp_geometry *expected; /* as kvp_pool_attach's; NULL: any */
	/* A page reserve per tier (enum kvp_tier), 0: none. kvpoold grants up to its
	 * reserve_max_pages, the session quota and a share of the free pages; the pages count as
	 * leased by the session. While the reserve can serve, kvp_lease_alloc and kvp_lease_free
	 * of up to that many pages make no system call: the lease gets a local id (bit 63 set)
	 * that kvpoold learns when a call first names it (kvp_cache_insert, kvp_lease_extend or
	 * kvp_lease_free past the reserve), pipelined before that call. Refills and returns are
	 * sent without waiting. Under memory pressure kvpoold takes back what the reserve holds
	 * unused; an Alloc it cannot serve goes to kvpoold as without a reserve. */
	uint32_t reserve_pages[KVP_TIER_MAX];
};
/* (0.3) kvp_pool_attach with options (opts may be NULL). Returns as kvp_pool_attach. */
struct kvp_pool *kvp_pool_attach_opts(struct kvp_client *c, const char *name,
				      const struct kvp_pool_opts *opts, struct kvp_error *err);
/* (0.3) Pages of tier granted to the pool's reserve; 0 when none was asked or granted, or when
 * it ended (kvpoold found its rings corrupt). */
uint32_t kvp_pool_reserve_pages(const struct kvp_pool *p, int tier);
/* Detaches: the session's leases in this pool are freed, its locks released, and the pool's
 * references to its mappings dropped (memory still referenced through kvp_pool_tier_mapping
 * stays mapped until the last kvp_mapping_unref). Returns 0 or a negative code; the handle is
 * freed either way. Accepts NULL. */
int kvp_pool_detach(struct kvp_pool *p, struct kvp_error *err);

uint32_t kvp_pool_id(const struct kvp_pool *p);
void kvp_pool_geometry(const struct kvp_pool *p, struct kvp_geometry *out);
/* Pages in the tier; 0 when the pool has no such tier. */
uint32_t kvp_pool_tier_pages(const struct kvp_pool *p, int tier);
int kvp_pool_tier_backend(const struct kvp_pool *p, int tier);
/* This process's CUDA device number for a cuda tier's GPU, found by the GPU's UUID, so it holds
 * under any CUDA_VISIBLE_DEVICES that shows the GPU; -1 for other tiers. From a daemon that
 * sends no UUID, the daemon's own number. */
int kvp_pool_tier_cuda_device(const struct kvp_pool *p, int tier);
/* The tier's mapping in this process (a device pointer for cuda), NULL when absent or unmapped.
 * Valid while the pool is attached; take a kvp_pool_tier_mapping to keep it longer. */
void *kvp_pool_tier_base(const struct kvp_pool *p, int tier);
/* The tier's memory fd as received (owned by the mapping), -1 when absent. */
int kvp_pool_tier_fd(const struct kvp_pool *p, int tier);
uint64_t kvp_pool_tier_bytes(const struct kvp_pool *p, int tier);
/* (0.3) 1 when the daemon sends pressure notices for p (asked with KVP_CLIENT_F_PRESSURE and
 * granted), else 0. */
int kvp_pool_pressure_notices(const struct kvp_pool *p);
/* (0.3) The tier's pressure watermark in tokens as the daemon said at attach (0: none). */
uint64_t kvp_pool_pressure_watermark(const struct kvp_pool *p, int tier);
/* Bytes of one token of one layer of K (or V); of one page in the host layout (all layers). */
uint64_t kvp_pool_row_bytes(const struct kvp_pool *p);
uint64_t kvp_pool_page_bytes(const struct kvp_pool *p);
/* Pages needed for `tokens` tokens, UINT32_MAX when that is more than a uint32_t counts (no
 * lease holds that many); 0 for a pool without page_tokens. */
uint32_t kvp_pool_pages_for(const struct kvp_pool *p, uint64_t tokens);
/* Byte offset in the tier of (layer, kv = 0 for K / 1 for V, page, token offset in the page);
 * UINT64_MAX when out of range. Device tier layer-first [layer][k|v][slot][head][dim], host
 * tier page-first [page][layer][k|v][page_tokens][head][dim]. */
uint64_t kvp_pool_slot_offset(const struct kvp_pool *p, int tier, uint32_t layer, uint32_t kv,
			      uint32_t page, uint32_t tok);
/* The address of that row: kvp_pool_tier_base + kvp_pool_slot_offset, NULL when unmapped or
 * out of range. */
void *kvp_pool_slot_addr(const struct kvp_pool *p, int tier, uint32_t layer, uint32_t kv,
			 uint32_t page, uint32_t tok);

/* ---- mappings: a tier's memory, reference-counted ----
 * The pool holds one reference to each tier's mapping and drops it at detach (or client
 * close); the memory is unmapped (cuda: released) and its fd closed when the last reference
 * goes, so a view taken over the memory may outlive the pool handle and the connection. */
/* Takes a reference to the tier's mapping. Returns it, or NULL when the pool has no such tier
 * or it is not mapped in this process (a cuda tier without CUDA support). */
struct kvp_mapping *kvp_pool_tier_mapping(struct kvp_pool *p, int tier);
/* Takes one more reference; returns m. */
struct kvp_mapping *kvp_mapping_ref(struct kvp_mapping *m);
/* Drops a reference; the last one unmaps. Accepts NULL. */
void kvp_mapping_unref(struct kvp_mapping *m);
void *kvp_mapping_base(const struct kvp_mapping *m); /* a device pointer for cuda */
uint64_t kvp_mapping_bytes(const struct kvp_mapping *m);
int kvp_mapping_tier(const struct kvp_mapping *m);
int kvp_mapping_backend(const struct kvp_mapping *m);
/* As kvp_pool_tier_cuda_device; -1 unless cuda. */
int kvp_mapping_cuda_device(const struct kvp_mapping *m);

/* ---- leases ---- */
/* Leases npages pages of `tier`, evicting cold cached prefixes when free pages are short.
 * Writes the lease id and the page ids (room for npages). Returns 0 or a negative code:
 * KVP_E_OUT_OF_CAPACITY (err->capacity says what was asked, free, evictable, protected),
 * KVP_E_QUOTA_EXCEEDED (err->quota), KVP_E_INVALID_ARGUMENT, KVP_E_LIMIT_EXCEEDED,
 * KVP_E_PROTOCOL (a reply with another page count: the lease is freed). */
int kvp_lease_alloc(struct kvp_pool *p, int tier, uint32_t npages, uint64_t *lease_id,
		    uint32_t *pages, struct kvp_error *err);
/* (0.3) A run lease: npages consecutive pages of `tier`, the first a multiple of align (>= 1;
 * e.g. the pages that make the tier's bytes of the run whole GPU mapping granules), so the run
 * can be mapped as one contiguous buffer. Free pages only: cached prefixes are not evicted for
 * a run. Writes the lease id and the first page (the run is first .. first + npages - 1).
 * Returns 0 or a negative code: KVP_E_OUT_OF_CAPACITY (no such run of free pages; the message
 * says so), KVP_E_QUOTA_EXCEEDED, KVP_E_INVALID_ARGUMENT (align 0, no such tier),
 * KVP_E_LIMIT_EXCEEDED, KVP_E_PROTOCOL (a reply that is no run of npages: the lease is freed).
 * It ends like any lease: kvp_lease_free, or the session's end. */
int kvp_lease_alloc_run(struct kvp_pool *p, int tier, uint32_t npages, uint32_t align,
			uint64_t *lease_id, uint32_t *first, struct kvp_error *err);
/* Adds npages pages to a lease; writes the new ids (room for npages). */
int kvp_lease_extend(struct kvp_pool *p, uint64_t lease_id, uint32_t npages, uint32_t *pages,
		     struct kvp_error *err);
/* Returns n pages of a lease (n == 0: all of them, and the lease ends). Returns the pages
 * left in the lease, or a negative code (KVP_E_NOT_FOUND for a lease or page that is not
 * this session's). */
int kvp_lease_free(struct kvp_pool *p, uint64_t lease_id, const uint32_t *pages, uint32_t n,
		   struct kvp_error *err);

/* ---- prefix cache ---- */
/* Publishes tokens[0..ntokens). The first cached_pages whole pages of the sequence are ones the
 * caller matched earlier (and holds a lock on, or accepts to lose); pages[0..npages) are lease
 * pages holding the rest: pages[i] holds tokens [(cached_pages + i) * page_tokens, ...).
 * Whole pages move from the lease into the cache; pages whose prefix was already cached are
 * freed; the unaligned tail page stays in the lease. If a matched page was evicted meanwhile,
 * nothing past it is cached and those lease pages stay in the lease.
 * ns: namespace (0 = default; e.g. a LoRA adapter id): namespaces never share pages.
 * The pages' bytes must be complete before the call: on a cuda tier, synchronize the streams
 * that wrote them. From the call on, other engines may read them and the daemon may demote them.
 * Writes the number of newly cached tokens to *new_tokens (may be NULL). Returns 0 or a
 * negative code. */
int kvp_cache_insert(struct kvp_pool *p, uint64_t lease_id, uint64_t ns, const uint32_t *tokens,
		     uint32_t ntokens, uint32_t cached_pages, const uint32_t *pages,
		     uint32_t npages, uint64_t *new_tokens, struct kvp_error *err);

struct kvp_match_result {
	size_t struct_size;
	uint64_t matched_tokens;
	uint32_t n_device; /* leading device-resident pages written to device_pages */
	uint32_t n_host;   /* host-only continuation written to host_pages */
	uint64_t lock_id;  /* nonzero when locked: release with kvp_cache_release */
	/* Pages after the matched ones that the daemon's remote tier holds (kvp_cache_fetch
	 * brings them in); 0 without a remote tier. Written when struct_size covers it. */
	uint32_t remote_pages;
};
/* Flags of kvp_cache_match's and kvp_cache_match_keys's `lock` argument (0 and 1 keep their
 * meaning): KVP_MATCH_LOCK pins the match; KVP_MATCH_LOCAL_ONLY asks the daemon's remote tier
 * nothing, so remote_pages stays 0 and the answer never waits on the network. A value with any
 * other bit set (-1, say) is read as before: lock, remote tier asked. */
#define KVP_MATCH_LOCK 0x1
#define KVP_MATCH_LOCAL_ONLY 0x100
/* Longest cached prefix of tokens. With lock (KVP_MATCH_LOCK, or any nonzero value not made
 * of KVP_MATCH_* bits), pins the matched pages until kvp_cache_release or the session
 * ends; KVP_MATCH_LOCAL_ONLY in lock: no remote existence query. device_pages and host_pages
 * need room for cap entries each (ntokens / page_tokens suffices). m->struct_size set by the
 * caller. Returns 0 or a negative code (KVP_E_BUFFER: cap too small, the lock is given back). */
int kvp_cache_match(struct kvp_pool *p, uint64_t ns, const uint32_t *tokens, uint32_t ntokens,
		    int lock, struct kvp_match_result *m, uint32_t *device_pages,
		    uint32_t *host_pages, uint32_t cap, struct kvp_error *err);
/* Releases a lock. Returns 0 or a negative code (KVP_E_NOT_FOUND). */
int kvp_cache_release(struct kvp_pool *p, uint64_t lock_id, struct kvp_error *err);
/* Promotes the host-only pages of a locked match to device pages (copied by the daemon's
 * transfer kernels) and writes the device page ids of the whole locked path (room for cap).
 * Returns the number of pages written, or a negative code: KVP_E_OUT_OF_CAPACITY (no device
 * room), KVP_E_UNAVAILABLE (another session's lock pins the same host pages: read them in the
 * host tier, they stay valid while your lock holds). */
int kvp_cache_load(struct kvp_pool *p, uint64_t lock_id, uint32_t *device_pages, uint32_t cap,
		   struct kvp_error *err);

struct kvp_cache_prefix {
	size_t struct_size;
	uint64_t tokens, hits, ns; /* tokens: of the chain through the page (pages * page_tokens) */
	uint64_t keyed;		   /* 1: a page of key calls, 0: of token calls (0.3) */
};
/* The most-hit cached pages of pool `pool`, of both kinds of calls (NULL or "": the first pool), a
 * listing (see kvp_session_list). Returns the count or a negative code (KVP_E_NO_SUCH_POOL). */
int kvp_cache_list(struct kvp_client *c, const char *pool, struct kvp_cache_prefix *entries,
		   uint32_t cap, struct kvp_error *err);

/* ---- administration (root or the admin group) ---- */
/* Evicts up to `tokens` tokens of cached prefixes from a tier of pool `name`. Writes the tokens
 * evicted. Returns 0 or a negative code (KVP_E_PERMISSION_DENIED, KVP_E_NO_SUCH_POOL). */
int kvp_admin_evict(struct kvp_client *c, const char *pool, int tier, uint64_t tokens,
		    uint64_t *evicted, struct kvp_error *err);
/* Drops every unlocked cached prefix of pool `name`. */
int kvp_admin_flush(struct kvp_client *c, const char *pool, uint64_t *evicted,
		    struct kvp_error *err);
/* Stops new leases and new sessions of non-admins (their Hello is KVP_E_SHUTTING_DOWN; admins
 * may still connect); sessions may finish until deadline_ms, then the daemon exits 0. */
int kvp_admin_drain(struct kvp_client *c, uint32_t deadline_ms, struct kvp_error *err);
/* (0.3) Ends a drain: new leases and connections are taken again. Returns 1 when a drain was
 * cancelled, 0 when none was running, or a negative code (KVP_E_PERMISSION_DENIED;
 * KVP_E_SHUTTING_DOWN once the drain has ended and kvpoold is stopping). */
int kvp_admin_drain_cancel(struct kvp_client *c, struct kvp_error *err);

struct kvp_reload_item {
	size_t struct_size;
	uint32_t refused; /* 0: a change made, 1: a change refused */
	char text[256];
};
/* Re-reads the daemon's configuration file (as SIGHUP) and lists what changed and what was
 * refused, a listing (see kvp_session_list): changes first, then refusals. Returns once the
 * reload is applied (new pools created: this may take seconds; a reload already running is
 * waited for, then this one runs), with the count, or a negative code: the reason when the
 * whole file was refused and nothing changed (e.g. -KVP_E_INVALID_ARGUMENT). */
int kvp_admin_reload(struct kvp_client *c, struct kvp_reload_item *entries, uint32_t cap,
		     struct kvp_error *err);

/* ---- hash-keyed pages (0.3) ---- */
/* A namespace's pages may be named by an engine's chain of page keys instead of token ids: each
 * key an opaque string of 1 .. 64 bytes that already folds in its parent (a chained page hash).
 * Token and key pages share a namespace and the pool's one page index: each kind of call matches
 * only its own pages. More keys in one call than the daemon's
 * max_keys_per_call (default and most KVP_PAGE_KEYS_MAX), a key of more than its max_key_bytes
 * (default and most KVP_PAGE_KEY_BYTES_MAX) bytes, or more key bytes than one frame holds
 * answer KVP_E_LIMIT_EXCEEDED (detail: limit, what "keys per call", "bytes per key" or "key
 * bytes per call"; the library refuses past its own maxima before sending); an empty key
 * KVP_E_INVALID_ARGUMENT. Locks from kvp_cache_match_keys are released with kvp_cache_release
 * and promoted with kvp_cache_load like kvp_cache_match's. */
#define KVP_PAGE_KEYS_MAX 65536u
#define KVP_PAGE_KEY_BYTES_MAX 64u
struct kvp_page_key {
	const void *data;
	size_t len;
};

struct kvp_insert_keys_result {
	size_t struct_size;   /* set by the caller: sizeof(struct kvp_insert_keys_result) */
	uint32_t new_pages;   /* lease pages the cache took */
	uint32_t dup_pages;   /* keys already cached: their lease pages were freed */
	uint32_t done_keys;   /* keys processed; below nkeys when a matched key was evicted since */
	uint32_t lease_pages; /* pages left in the lease */
};
/* Publishes the chain keys[0 .. nkeys) of namespace ns: keys[0 .. cached_keys) are ones the
 * caller matched earlier; pages[0 .. npages) (npages == nkeys - cached_keys) are lease pages
 * holding the rest, pages[i] for keys[cached_keys + i]. Pages taken and duplicates leave the
 * lease; past a matched key evicted meanwhile, pages stay in the lease. The pages' bytes must be
 * complete before the call. Writes *out (may be NULL; out->struct_size set by the caller).
 * Returns 0 or a negative code (KVP_E_NOT_FOUND for a lease or page not the session's). */
int kvp_cache_insert_keys(struct kvp_pool *p, uint64_t lease_id, uint64_t ns,
			  const struct kvp_page_key *keys, uint32_t nkeys, uint32_t cached_keys,
			  const uint32_t *pages, uint32_t npages,
			  struct kvp_insert_keys_result *out, struct kvp_error *err);

struct kvp_match_keys_result {
	size_t struct_size;    /* set by the caller: sizeof(struct kvp_match_keys_result) */
	uint32_t matched_keys; /* n_device + n_host */
	uint32_t n_device;     /* leading device-resident pages written to device_pages */
	uint32_t n_host;       /* host-only continuation written to host_pages */
	uint64_t lock_id;      /* nonzero when locked: release with kvp_cache_release */
	uint32_t remote_pages; /* keys after the matched ones held remotely (when covered) */
};
/* The longest leading run of keys[0 .. nkeys) cached in ns of pool p. With lock, pins the run
 * until kvp_cache_release or the session ends (lock takes the flags of kvp_cache_match:
 * KVP_MATCH_LOCAL_ONLY asks the remote tier nothing). device_pages and host_pages need room for cap
 * entries each (nkeys suffices). Returns 0 or a negative code (KVP_E_BUFFER when cap is short: the
 * lock, if taken, is released). */
int kvp_cache_match_keys(struct kvp_pool *p, uint64_t ns, const struct kvp_page_key *keys,
			 uint32_t nkeys, int lock, struct kvp_match_keys_result *m,
			 uint32_t *device_pages, uint32_t *host_pages, uint32_t cap,
			 struct kvp_error *err);
/* Count of leading keys of keys[0 .. nkeys) cached in ns of pool p (no lock), or a negative
 * code. */
int kvp_cache_exists_keys(struct kvp_pool *p, uint64_t ns, const struct kvp_page_key *keys,
			  uint32_t nkeys, struct kvp_error *err);

/* The remote tier (0.3; a pool with remote = spill or write-through in kvpoold's config). */
struct kvp_fetch_result {
	size_t struct_size;	/* set by the caller: sizeof(struct kvp_fetch_result) */
	uint32_t fetched_pages; /* read from the remote tier and cached by this call */
	uint32_t missed_pages;	/* asked for and not had: a miss, a fault or a bad value */
	uint64_t matched;	/* tokens (kvp_cache_fetch) or keys (_keys) cached now */
	uint32_t n_device;	/* leading device-resident pages written to device_pages */
	uint32_t n_host;	/* host-only continuation written to host_pages */
	uint64_t lock_id;	/* nonzero when locked: release with kvp_cache_release */
};
/* Brings the pages of tokens that follow the locally cached ones and that the remote tier holds
 * into host pages and the prefix cache (up to the daemon's match_max_pages), then answers as
 * kvp_cache_match does (with lock, a lock that kvp_cache_load promotes). Answers once the pages
 * are there or their reads failed; faults of the remote tier are misses, never errors.
 * device_pages and host_pages need room for cap entries each (ntokens / page_tokens
 * suffices). Returns 0 or a negative code (KVP_E_BUFFER: cap too small, the lock is given
 * back; KVP_E_UNAVAILABLE: kvpoold has no remote tier built in). */
int kvp_cache_fetch(struct kvp_pool *p, uint64_t ns, const uint32_t *tokens, uint32_t ntokens,
		    int lock, struct kvp_fetch_result *out, uint32_t *device_pages,
		    uint32_t *host_pages, uint32_t cap, struct kvp_error *err);
/* The same for hash-keyed namespace ns: keys[0 .. nkeys), matched counted in keys. */
int kvp_cache_fetch_keys(struct kvp_pool *p, uint64_t ns, const struct kvp_page_key *keys,
			 uint32_t nkeys, int lock, struct kvp_fetch_result *out,
			 uint32_t *device_pages, uint32_t *host_pages, uint32_t cap,
			 struct kvp_error *err);

#ifdef __cplusplus
}
#endif
#endif
