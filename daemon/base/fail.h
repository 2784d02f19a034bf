/* fail.h - the daemon's typed failure: a code, a message and one detail, filled where the
 * failure is found (pool, session) and turned into a wire Status by reply.c. The codes carry
 * the wire Code's numbers (reply.c asserts each), so this header needs no generated types. */
#pragma once
#include <stdint.h>

enum kvp_err {
	KVP_ERR_NONE = 0,
	KVP_ERR_OUT_OF_CAPACITY = 1,
	KVP_ERR_HOST_BUDGET_EXCEEDED = 2,
	KVP_ERR_QUOTA_EXCEEDED = 3,
	KVP_ERR_NO_SUCH_POOL = 4,
	KVP_ERR_GEOMETRY_MISMATCH = 5,
	KVP_ERR_NOT_FOUND = 6,
	KVP_ERR_INVALID_ARGUMENT = 7,
	KVP_ERR_PERMISSION_DENIED = 8,
	KVP_ERR_PROTOCOL = 9,
	KVP_ERR_VERSION = 10,
	KVP_ERR_SHUTTING_DOWN = 11,
	KVP_ERR_LIMIT_EXCEEDED = 12,
	KVP_ERR_UNAVAILABLE = 13,
	KVP_ERR_INTERNAL = 14,
	KVP_ERR_RESTARTED = 15, /* kvpoold restarted under the call (the client's own answer) */
	KVP_ERR_MAX,
};

enum kvp_fail_detail {
	KVP_FAIL_NONE = 0,
	KVP_FAIL_CAPACITY,
	KVP_FAIL_BUDGET,
	KVP_FAIL_QUOTA,
	KVP_FAIL_GEOMETRY,
	KVP_FAIL_LIMIT,
	KVP_FAIL_DETAIL_MAX,
};

struct kvp_geom {
	uint32_t layers, kv_heads, head_dim, dtype, page_tokens;
};

struct kvp_fail {
	enum kvp_err code;
	char msg[384];
	enum kvp_fail_detail detail;
	struct {
		int tier;
		uint64_t requested, free, evictable, protected_, leased, total;
		uint64_t reserved; /* of leased: booked to sessions' page reserves */
	} cap;
	struct {
		uint64_t quota, held, requested;
	} quota;
	struct {
		uint64_t requested, available;
		int limit, numa_node;
		char pool[64];
	} budget;
	struct {
		struct kvp_geom expected, actual;
	} geom;
	struct {
		char what[48];
		uint64_t limit;
	} limit;
};

/* A fresh failure: no code, no message, no detail. Cheaper than zeroing all of it (the hot path
 * of every call starts with one); every detail setter fills all fields of its detail. */
static inline void kvp_fail_init(struct kvp_fail *f)
{
	f->code = KVP_ERR_NONE;
	f->msg[0] = '\0';
	f->detail = KVP_FAIL_NONE;
}

/* Sets code and message (detail untouched) and returns -code, so callers can
 * `return kvp_fail(f, KVP_ERR_NOT_FOUND, "lease %lu ...", id);`. f may be NULL. */
int kvp_fail(struct kvp_fail *f, enum kvp_err code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* LIMIT_EXCEEDED with its detail. */
int kvp_fail_limit(struct kvp_fail *f, const char *what, uint64_t limit);
