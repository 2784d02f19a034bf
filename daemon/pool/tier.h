/* tier.h - the memory behind a tier, reached through one operations table per backend: host
 * memfd (tier_memfd.c), sim (tier_sim.c: a memfd standing in for a GPU) and cuda (tier_cuda.c:
 * CUDA device memory exported as a POSIX fd). The fds travel to clients with SCM_RIGHTS. pool.c
 * reaches tiers only through the table; no backend calls another.
 *
 * No wire types here: backends are enum kvp_backend_kind (numbered like the wire's Backend, which
 * pool.c asserts) and failures are enum kvp_tier_error with a message (pool.c maps them onto wire
 * codes). */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kv_copy.h"

enum kvp_backend_kind {
	KVP_BACKEND_KIND_NONE = 0,
	KVP_BACKEND_KIND_SIM = 1,
	KVP_BACKEND_KIND_CUDA = 2,
	KVP_BACKEND_KIND_MEMFD = 3,
	KVP_BACKEND_KIND_MAX,
};

enum kvp_tristate_opt { KVP_OPT_OFF = 0, KVP_OPT_TRY = 1, KVP_OPT_ON = 2 };

enum kvp_tier_error {
	KVP_TIER_OK = 0,
	KVP_TIER_E_INTERNAL,	/* a system call failed (memfd, mmap, seals) */
	KVP_TIER_E_BUDGET,	/* hugepages or mlock = on and the kernel refused */
	KVP_TIER_E_UNAVAILABLE, /* the backend is missing from this build or this machine */
	KVP_TIER_E_INVALID,	/* bad arguments: no bytes, no fd, no such backend operation */
	KVP_TIER_E_BAD_FD,	/* adopt: the fd is not memory of this backend */
	KVP_TIER_E_SIZE,	/* adopt: the fd's size is not the tier's */
	KVP_TIER_E_SEALS,	/* adopt: the fd is not sealed against shrinking and growing */
	KVP_TIER_E_MAX,
};

/* A tier failure: the code and one line for an operator. */
struct kvp_tier_fail {
	enum kvp_tier_error code;
	char msg[320];
};

/* What a tier is to be. */
struct kvp_tier_spec {
	const char *name; /* "pool:tier", for the memfd's name and for messages */
	uint64_t bytes;	  /* create: at least this (rounded up to huge pages or the GPU's
			   * granularity); adopt: exactly the size create gave the tier */
	int numa_node;	  /* bind to this node; -1: leave unbound */
	int cuda_device;  /* cuda: device ordinal */
	enum kvp_tristate_opt hugepages, mlock; /* memfd only: sim is never huge nor locked */
};

struct kvp_tier_ops;

struct kvp_tier_mem {
	const struct kvp_tier_ops *ops; /* NULL until created or adopted */
	enum kvp_backend_kind backend;
	int fd;	    /* -1 when absent */
	void *base; /* daemon's mapping; for cuda the device address */
	uint64_t bytes;
	int numa_node; /* -1 when not bound */
	int cuda_device;
	bool huge, locked;
	uint64_t cuda_handle; /* CUmemGenericAllocationHandle, cuda only */
	uint64_t cuda_granularity;
	uint8_t cuda_uuid[16];
	bool has_uuid;
};

/* Page transfers between one device tier and one host tier; opaque, owned by the device tier's
 * backend. */
struct kvp_tier_copy;
/* One copy in flight (copy_start): waited for off the loop thread; opaque, the backend's. */
struct kvp_tier_flight;

/*
 * One backend. Every int-returning operation returns 0, or -code of enum kvp_tier_error with tf
 * filled (tf may be NULL), except copy, copy_wait, copy_start and flight_wait, which return a
 * negative errno. On failure the tier is left as kvp_tier_mem_init made it.
 */
struct kvp_tier_ops {
	const char *name; /* kvp_names_backend(kind), for messages (test_tier checks) */
	enum kvp_backend_kind kind;
	/* New memory of at least s->bytes, mapped, bound, locked and pre-faulted as s asks; TRY
	 * options that fell back write the reason to note (may be NULL). */
	int (*create)(struct kvp_tier_mem *t, const struct kvp_tier_spec *s, char *note,
		      size_t notelen, struct kvp_tier_fail *tf);
	/* Takes over memory another create made (an fd handed back after a restart): checks its
	 * size (exactly s->bytes) and, for memfds, its seals, maps it; never pre-faults or zeroes
	 * it. On success the tier owns fd; on failure fd is still the caller's. */
	int (*adopt)(struct kvp_tier_mem *t, int fd, const struct kvp_tier_spec *s,
		     struct kvp_tier_fail *tf);
	/* Unmaps and frees; accepts a tier that kvp_tier_mem_init made or destroy left. */
	void (*destroy)(struct kvp_tier_mem *t);
	/* Device backends only (NULL otherwise): transfers between this tier (dev) and a host tier
	 * under geometry g (copied). dev and host must outlive the context. */
	int (*copy_open)(struct kvp_tier_mem *dev, struct kvp_tier_mem *host,
			 const struct kvp_copy_geom *g, struct kvp_tier_copy **out,
			 struct kvp_tier_fail *tf);
	/* Starts copying n pages: src ids in the source tier, dst ids in the destination (demote:
	 * device -> host). The ids are checked (kvp_copy_batch_check) before anything moves.
	 * 0 or a negative errno. The bytes are in place once copy_wait returns 0. */
	int (*copy)(struct kvp_tier_copy *c, enum kvp_copy_dir dir, const uint32_t *src,
		    const uint32_t *dst, uint32_t n);
	/* Waits for every copy started on c. 0 or a negative errno. */
	int (*copy_wait)(struct kvp_tier_copy *c);
	/* Waits for outstanding copies and frees c. Accepts NULL. Flights of c are freed first. */
	void (*copy_close)(struct kvp_tier_copy *c);
	/* Optional (NULL: copies are synchronous, copy then copy_wait). Starts the copy as copy
	 * does and returns 1 with *out set when the bytes land later: the caller waits with
	 * flight_wait (on a worker thread, once) and then frees with flight_free (on the thread
	 * that uses c). Returns 0 with *out NULL when the bytes are already in place, or a
	 * negative errno (nothing in flight). cuda: a CUDA event after the copy's kernel; sim:
	 * synchronous unless KVPOOLD_COPY_DELAY_MS (tests) is set, then the CPU kernel runs in
	 * flight_wait after that delay. */
	int (*copy_start)(struct kvp_tier_copy *c, enum kvp_copy_dir dir, const uint32_t *src,
			  const uint32_t *dst, uint32_t n, struct kvp_tier_flight **out);
	/* Blocks until f's bytes are in place. 0 or a negative errno. Touches nothing but f's
	 * source and destination pages, so it may run on another thread than c's user. */
	int (*flight_wait)(struct kvp_tier_flight *f);
	/* Frees f. When flight_wait never ran, the destination may hold anything afterwards
	 * (the copy is abandoned or waited for): treat it as a failed copy. Nothing of f's
	 * touches the pages once this returns. */
	void (*flight_free)(struct kvp_tier_flight *f);
};

extern const struct kvp_tier_ops kvp_tier_memfd_ops;
extern const struct kvp_tier_ops kvp_tier_sim_ops;
extern const struct kvp_tier_ops kvp_tier_cuda_ops;

/* The backend of that kind; NULL for NONE or an unknown kind. */
const struct kvp_tier_ops *kvp_tier_ops_of(enum kvp_backend_kind kind);

/* An empty tier: no backend, fd -1, unbound, no device. */
void kvp_tier_mem_init(struct kvp_tier_mem *t);
/* Destroys through the tier's backend and leaves it as kvp_tier_mem_init does. Accepts an empty
 * or destroyed tier. */
void kvp_tier_mem_destroy(struct kvp_tier_mem *t);

/* For backends: fills tf (may be NULL) and returns -code. */
int kvp_tier_err(struct kvp_tier_fail *tf, enum kvp_tier_error code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
