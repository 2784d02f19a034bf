/* fail.h - the daemon's typed failure: a wire Code, a message and one detail, filled where
 * the failure is found (pool, session) and turned into a Status by dispatch. */
#pragma once
#include <stdint.h>

#include "kvpool.pb-c.h"

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
	Kvpool__Code code;
	char msg[384];
	enum kvp_fail_detail detail;
	struct {
		int tier;
		uint64_t requested, free, evictable, protected_, leased, total;
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
	f->code = KVPOOL__CODE__OK;
	f->msg[0] = '\0';
	f->detail = KVP_FAIL_NONE;
}

/* Sets code and message (detail untouched) and returns -code, so callers can
 * `return kvp_fail(f, KVPOOL__CODE__NOT_FOUND, "lease %lu ...", id);`. f may be NULL. */
int kvp_fail(struct kvp_fail *f, Kvpool__Code code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* LIMIT_EXCEEDED with its detail. */
int kvp_fail_limit(struct kvp_fail *f, const char *what, uint64_t limit);
