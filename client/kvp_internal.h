/* kvp_internal.h - libkvpool internals shared by its files (libkvpool_*.c) and with the tests
 * (linked statically): the library's objects, the raw call path that hands back the decoded
 * Response. Not installed; kvpoolctl and kvpool-loadgen use only kvpool.h. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>
#include <sys/un.h>

#include "frame.h"
#include "kv_copy.h"
#include "kvp_config.h"
#include "kvpool.h"
#include "kvpool.pb-c.h"
#if KVP_HAVE_CUDA
#include "cuda_drv.h"
#endif

#define KVP_EXPORT __attribute__((visibility("default")))
#define KVP_CLIENT_MAX_FDS 8
/* Requests one client may have outstanding at once. */
#define KVP_CLIENT_MAX_PENDING 16

/* The first-version (0.2) sizes of the public structs that carry struct_size: the end of the
 * last 0.2 field, rounded up to the struct's alignment as sizeof was. They stay fixed when the
 * structs grow; a caller's struct_size below one is -KVP_E_INVALID_ARGUMENT. */
#define KVP__SIZE_UPTO(type, field)                                                                \
	((offsetof(type, field) + sizeof(((type *)0)->field) + _Alignof(size_t) - 1) &             \
	 ~(_Alignof(size_t) - 1))
#define KVP_CLIENT_OPTS_SIZE_V02 KVP__SIZE_UPTO(struct kvp_client_opts, timeout_ms)
#define KVP_EVENT_SIZE_V02 KVP__SIZE_UPTO(struct kvp_event, payload_len)
#define KVP_STATUS_SIZE_V02 KVP__SIZE_UPTO(struct kvp_status, counters)
#define KVP_SESSION_INFO_SIZE_V02 KVP__SIZE_UPTO(struct kvp_session_info, idle_ms)
#define KVP_MATCH_RESULT_SIZE_V02 KVP__SIZE_UPTO(struct kvp_match_result, lock_id)
#define KVP_CACHE_PREFIX_SIZE_V02 KVP__SIZE_UPTO(struct kvp_cache_prefix, ns)
#define KVP_RELOAD_ITEM_SIZE_V02 KVP__SIZE_UPTO(struct kvp_reload_item, text)
#define KVP_INSERT_KEYS_RESULT_SIZE_V02 KVP__SIZE_UPTO(struct kvp_insert_keys_result, lease_pages)
#define KVP_MATCH_KEYS_RESULT_SIZE_V02 KVP__SIZE_UPTO(struct kvp_match_keys_result, lock_id)
/* Structs first in 0.3. */
#define KVP_PRESSURE_SIZE_V03 KVP__SIZE_UPTO(struct kvp_pressure, pool)
#define KVP_POOL_OPTS_SIZE_V03 KVP__SIZE_UPTO(struct kvp_pool_opts, reserve_pages)

/* Copies the struct the library filled (full, this version's `size` bytes) to the caller's
 * (its struct_size set): min(struct_size, size) bytes, struct_size kept; the caller's bytes
 * past size are untouched. */
static inline void kvp__struct_out(void *out, const void *full, size_t size)
{
	size_t n = *(const size_t *)out;

	memcpy(out, full, n < size ? n : size);
	*(size_t *)out = n;
}

/* Copies a match reply's page lists to the caller's arrays (an empty repeated field arrives as
 * NULL, so nothing is copied from it). */
static inline void kvp__pages_out(uint32_t *device_pages, const uint32_t *dev, size_t n_dev,
				  uint32_t *host_pages, const uint32_t *host, size_t n_host)
{
	if (n_dev)
		memcpy(device_pages, dev, sizeof(uint32_t) * n_dev);
	if (n_host)
		memcpy(host_pages, host, sizeof(uint32_t) * n_host);
}

/* Reads the caller's struct (struct_size set) into full (this version's `size` bytes):
 * min(struct_size, size) bytes, the rest zeroed. */
/* The `lock` argument of the match calls: only a value made of KVP_MATCH_* bits is read as
 * flags; any other value keeps its old meaning, a plain boolean (so -1 or 0xffffffff from a
 * binding locks and does not turn local-only on). */
static inline void kvp__match_flags(int lock, protobuf_c_boolean *lock_out,
				    protobuf_c_boolean *local_only)
{
	unsigned v = (unsigned)lock;

	if (v & ~(unsigned)(KVP_MATCH_LOCK | KVP_MATCH_LOCAL_ONLY)) {
		*lock_out = 1;
		*local_only = 0;
		return;
	}
	*lock_out = (v & KVP_MATCH_LOCK) != 0;
	*local_only = (v & KVP_MATCH_LOCAL_ONLY) != 0;
}

static inline void kvp__struct_in(void *full, const void *in, size_t size)
{
	size_t n = *(const size_t *)in;

	memset(full, 0, size);
	memcpy(full, in, n < size ? n : size);
}

/* ---- the library's objects ---- */
/* One tier's memory in this process; freed with its last reference. */
struct kvp_mapping {
	int refs; /* atomic */
	int tier;
	int backend;
	int fd;
	int cuda_device;
	void *base;
	uint64_t bytes;
#if KVP_HAVE_CUDA
	struct kvp_cuda_mem cm;
#endif
};

struct kvp_tier_map {
	int present;
	uint32_t pages;
	struct kvp_mapping *m; /* the pool's reference */
};

struct kvp_pool {
	struct kvp_client *c;
	uint32_t id;
	char name[64];
	struct kvp_geometry g;
	struct kvp_copy_geom cg;
	uint64_t page_bytes;
	struct kvp_tier_map tier[KVP_TIER_MAX];
	int pressure;			    /* notices granted at attach */
	uint64_t pressure_wm[KVP_TIER_MAX]; /* tokens */
	struct kvp_resv *resv;		    /* the page reserve, NULL when none */
	struct kvp_pool *next;
};

/* A request sent and not yet answered. */
struct pending {
	uint64_t id; /* 0: the slot is free */
	bool done;
	Kvpool__Response *resp;
	int fds[KVP_CLIENT_MAX_FDS];
	int nfds;
};

struct queued_event {
	uint32_t type;
	int32_t code;
	uint64_t id;
	uint64_t dropped;
	uint8_t *bytes;
	size_t len;
};

struct kvp_client {
	int fd;
	int efd;  /* eventfd, readable while events are queued (-1 until kvp_client_event_fd) */
	int epfd; /* epoll over efd and fd: what kvp_client_event_fd hands out */
	uint64_t next_id;
	uint64_t session_id;
	uint64_t caps;
	uint64_t flags; /* KVP_CLIENT_F_* */
	char daemon_version[32];
	struct kvp_frame_buf in;
	int rxfds[KVP_CLIENT_MAX_FDS]; /* received, for the next frame completed */
	int nrxfds;
	struct pending pend[KVP_CLIENT_MAX_PENDING];
	Kvpool__Response *notice; /* a refusal of the connection (id 0, no result) */
	struct queued_event ev[KVP_CLIENT_MAX_EVENTS];
	unsigned ev_head, ev_n;
	uint64_t ev_dropped;
	struct kvp_pool *pools;
	/* Restarts: where and how to say Hello again, the session's token, the daemon's
	 * instance. */
	struct sockaddr_un sa;
	char name[64];
	uint64_t offer, required;
	uint32_t timeout_ms, reconnect_ms, grace_ms;
	uint8_t token[16];
	size_t token_len;
	uint64_t instance;
	bool reconnecting;
	bool retry;	     /* the connection was lost and no reconnect was tried since */
	pid_t pid;	     /* the process that connected: the session is its own */
	unsigned long forks; /* g_forks then */
};

/* ---- the call path (libkvpool_transport.c) ---- */
/* Declares req + the call message, fills the oneof. */
#define CALL_SETUP(req, field, CASE, Type, INIT)                                                   \
	Kvpool__Request req = KVPOOL__REQUEST__INIT;                                               \
	Type field = INIT;                                                                         \
	req.call_case = KVPOOL__REQUEST__CALL_##CASE;                                              \
	req.field = &field
#define RESULT(CASE) KVPOOL__RESPONSE__RESULT_##CASE
/* Sends req (its id is assigned here), waits for the reply of that id (frames of other ids go
 * to the event queue or are discarded, see kvpool.h) and checks it: a failed status becomes
 * its typed code, a result other than `want` (a KVPOOL__RESPONSE__RESULT_*; 0 accepts any) is
 * KVP_E_PROTOCOL. On success returns 0 and *resp (free with kvpool__response__free_unpacked);
 * descriptors that came with it are stored in fds (room for KVP_CLIENT_MAX_FDS, *nfds set;
 * caller owns them), or closed when fds is NULL. On failure returns a negative code with err
 * filled, *resp untouched, the descriptors closed. */
int kvp__rpc(struct kvp_client *c, Kvpool__Request *req, int want, Kvpool__Response **resp,
	     int *fds, int *nfds, struct kvp_error *err);
/* Sends req (id assigned here) without waiting: its reply is discarded when it arrives. Reads
 * (without blocking) what waits in the socket first, so replies never pile up. 0 or a
 * negative code. */
int kvp__rpc_send(struct kvp_client *c, Kvpool__Request *req, struct kvp_error *err);
/* kvp__rpc for calls whose reply carries nothing: the reply is freed. 0 or a negative code. */
int kvp__rpc_void(struct kvp_client *c, Kvpool__Request *req, int want, struct kvp_error *err);
/* The connected socket, for tests that send raw bytes. */
int kvp__client_fd(const struct kvp_client *c);
/* Closes the descriptors of fds[0..n) that are not -1. */
void kvp__close_fds(int *fds, int n);
/* Frees a request's reply and descriptors, and the slot. */
void kvp__pending_clear(struct pending *pd);

/* ---- errors (libkvpool_error.c) ---- */
/* The enum kvp_code (positive) of a failed Status: its code when within the daemon's range,
 * else KVP_E_PROTOCOL. */
int kvp__status_code(const Kvpool__Status *st);
/* Fills err (may be NULL) from a failed Status; returns the negative code. */
int kvp__status_to_error(const Kvpool__Status *st, struct kvp_error *err);
/* Sets err to a library-side code; returns -code. */
int kvp__fail(struct kvp_error *err, int code, int sys_errno, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
/* The wire's geometry as the API's (all zero when m is NULL). */
void kvp__geom_from(struct kvp_geometry *g, const Kvpool__Geometry *m);

/* ---- the connection (libkvpool_client.c, libkvpool_reconnect.c) ---- */
/* 0, or -KVP_E_FORKED (err filled) when the calling process is not the one that connected c
 * (getpid); _fast compares a count of forks kept by pthread_atfork instead: no system call,
 * but blind to a child made with a raw clone. */
int kvp__forked(const struct kvp_client *c, struct kvp_error *err);
int kvp__forked_fast(const struct kvp_client *c, struct kvp_error *err);
/* After a lost connection: Hello again to a restarted kvpoold, resuming the session, and every
 * pool attached again. 0 or -1. */
int kvp__reconnect(struct kvp_client *c);

/* ---- pools and mappings (libkvpool_pool.c, libkvpool_mapping.c) ---- */
/* The client a pool was attached through. */
struct kvp_client *kvp__pool_client(const struct kvp_pool *p);
/* Drops the pool's reserve and its references to the tier mappings. */
void kvp__pool_unmap(struct kvp_pool *p);
/* Maps one tier of an Attach reply into p (takes fd, mapped or not). 0 or a negative code. */
int kvp__map_tier(struct kvp_pool *p, const Kvpool__TierInfo *ti, int fd, struct kvp_error *err);

/* ---- hash keys (libkvpool_keys.c) ---- */
/* The keys as the wire's bytes fields in *out (free with free()), checked against the most any
 * kvpoold accepts (KVP_PAGE_KEYS_MAX keys, KVP_PAGE_KEY_BYTES_MAX bytes a key) and against one
 * frame; the daemon's own max_keys_per_call / max_key_bytes may be lower. 0 or a negative code:
 * KVP_E_LIMIT_EXCEEDED past a limit, KVP_E_INVALID_ARGUMENT for an empty key
 * (libkvpool_keys.c; the keyed calls and Fetch share it). */
int kvp__wire_keys(const struct kvp_page_key *keys, uint32_t n, ProtobufCBinaryData **out,
		   struct kvp_error *err);

/* ---- the page reserve (libkvpool_reserve.c) ---- */
struct kvp_resv;
struct kvp_resv_stats {
	uint64_t allocs, frees; /* served from the rings */
	uint64_t misses;	/* Allocs the fill ring could not serve */
	uint64_t calls, binds;	/* Reserve calls sent; local leases bound */
};
/* Maps the reserve region of an Attach reply (takes fd). 0 or a negative code. */
int kvp__resv_open(struct kvp_client *c, uint32_t pool_id, int fd, uint64_t bytes, uint32_t slots,
		   const uint32_t *granted, size_t ngranted, struct kvp_resv **out,
		   struct kvp_error *err);
/* Accepts NULL. */
void kvp__resv_close(struct kvp_resv *rv);
/* Pages granted in tier, 0 when none or the reserve ended. */
uint32_t kvp__resv_granted(const struct kvp_resv *rv, int tier);
/* From the rings: 1 when served (lease id local), 0 when the call must go to kvpoold. */
int kvp__resv_alloc(struct kvp_resv *rv, int tier, uint32_t npages, uint64_t *lease_id,
		    uint32_t *pages);
int kvp__resv_extend(struct kvp_resv *rv, uint64_t lease_id, uint32_t npages, uint32_t *pages);
/* 1 when served (*left set), 0 when lease_id is not a local lease (or the return ring has no
 * room: bind, then call), or a negative code (KVP_E_NOT_FOUND). */
int kvp__resv_free(struct kvp_resv *rv, uint64_t lease_id, const uint32_t *pages, uint32_t n,
		   uint32_t *left, struct kvp_error *err);
/* When lease_id is a local lease: pipelines a Reserve call binding it (kvpoold knows it by the
 * next call) and forgets it. 0 or a negative code. */
int kvp__resv_bind(struct kvp_resv *rv, uint64_t lease_id, struct kvp_error *err);
/* A Reserve call waited for (refill and drain now). 0 or a negative code. */
int kvp__resv_sync(struct kvp_resv *rv, struct kvp_error *err);
/* The region (for tests that write into it) and figures; NULL / zeros without a reserve. */
void *kvp__resv_region(const struct kvp_resv *rv, size_t *bytes, uint32_t *slots);
void kvp__resv_stats(const struct kvp_resv *rv, struct kvp_resv_stats *out);
/* The pool's reserve, NULL when none. */
struct kvp_resv *kvp__pool_resv(const struct kvp_pool *p);
