/* tier.h - the memory behind a tier: a sealed memfd (host tier, sim device tier) or CUDA
 * device memory exported as a POSIX fd. Both travel to clients with SCM_RIGHTS. */
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "fail.h"

enum kvp_tristate_opt { KVP_OPT_OFF = 0, KVP_OPT_TRY = 1, KVP_OPT_ON = 2 };

struct kvp_tier_mem {
	int backend; /* Kvpool__Backend */
	int fd;      /* -1 when absent */
	void *base;  /* daemon's mapping; for cuda the device address */
	uint64_t bytes;
	int numa_node; /* -1 when not bound */
	int cuda_device;
	bool huge, locked;
	uint64_t cuda_handle; /* CUmemGenericAllocationHandle, cuda only */
	uint64_t cuda_granularity;
	bool host_registered; /* host tier registered with CUDA for the transfer kernels */
	void *gpu_view;       /* registered host tier: its address for the GPU's kernels */
	uint8_t cuda_uuid[16];
	bool has_uuid;
};

/* Seams for tests and for machines without NUMA: set before creating tiers. */
struct kvp_tier_env {
	bool numa; /* bind with libnuma when available */
};

/* Creates a sealed (shrink, grow, seal) shared memfd of `bytes`, maps it, binds it to
 * numa_node (>= 0), locks it per `mlock` and pre-faults it. hugepages/mlock: enum
 * kvp_tristate_opt; TRY falls back and writes the reason to note (may be NULL).
 * Returns 0 or a negative Code with f filled (INTERNAL, HOST_BUDGET_EXCEEDED for a failed
 * lock under ON). */
int kvp_tier_memfd_create(struct kvp_tier_mem *t, const char *name, uint64_t bytes, int numa_node,
			  int hugepages, int mlock, char *note, size_t notelen, struct kvp_fail *f);
/* The sim device tier: a memfd like the host tier, never locked, never huge. */
int kvp_tier_sim_create(struct kvp_tier_mem *t, const char *name, uint64_t bytes, int numa_node,
			struct kvp_fail *f);
/* CUDA device tier via the driver's virtual memory API; UNAVAILABLE with the reason when the
 * build or the machine has no CUDA. */
int kvp_tier_cuda_create(struct kvp_tier_mem *t, int device, uint64_t bytes, struct kvp_fail *f);
void kvp_tier_cuda_destroy(struct kvp_tier_mem *t);
/* Registers a host tier with CUDA (mapped) so the transfer kernels reach it. 0 or -EIO. */
int kvp_tier_cuda_register_host(struct kvp_tier_mem *host);
void kvp_tier_cuda_unregister_host(struct kvp_tier_mem *host);
/* Accepts a zeroed or destroyed tier. */
void kvp_tier_mem_destroy(struct kvp_tier_mem *t);
