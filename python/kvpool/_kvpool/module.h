/* module.h - what the files of the _kvpool extension share, as CPython's Modules/_sqlite/module.h
 * does: the module state (exception classes, types, the numpy helpers), the object structs of
 * Client, Pool, Lease and Match, each type's spec, and the helpers one file defines for others.
 *
 * _kvpool is the CPython extension under the kvpool package: Client, Pool, Lease, Match and
 * View types over libkvpool (client.c, pool.c, lease.c, match.c, view.c, one type each), typed
 * exceptions for every enum kvp_code and the module's init (module.c), argument conversion
 * (convert.c), and zero-copy views of the tier memory (DLPack 1.x with version negotiation, the
 * unversioned capsule as fallback, and the buffer protocol for CPU-mapped tiers).
 *
 * Built for the stable ABI (abi3, CPython >= 3.11: Py_buffer and the buffer slots entered the
 * limited API in 3.11). Every call into libkvpool is made from these files. Calls that wait on
 * the daemon release the GIL. A Client, like struct kvp_client, is not thread-safe: a second
 * thread entering a client that is in a call gets kvpool.ClientBusy instead of a corrupted
 * handle. What the files share stays inside the module (built with hidden visibility): only
 * PyInit__kvpool leaves it.
 */
#pragma once
#ifndef Py_LIMITED_API
#define Py_LIMITED_API 0x030B0000
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvp_config.h"
#include "kvpool.h"

#define KVPY_PRESSURE_FIELDS 11 /* fields of a kvpool.PressureNotice */

#define KVPY_WAIT(stmt)                                                                            \
	do {                                                                                       \
		Py_BEGIN_ALLOW_THREADS stmt;                                                       \
		Py_END_ALLOW_THREADS                                                               \
	} while (0)

/* ---- module state (module.c; one interpreter, created once at import) ---- */
extern PyObject *g_client_busy;		  /* kvpool.ClientBusy */
extern PyObject *g_event_type;		  /* kvpool.Event (a struct sequence) */
extern PyObject *g_pressure_type;	  /* kvpool.PressureNotice (a struct sequence) */
extern PyObject *g_frombuffer, *g_uint32; /* numpy.frombuffer and numpy.uint32, or NULL */
extern PyObject *g_asarray;		  /* numpy.asarray, or NULL */
extern PyObject *g_array_type;		  /* array.array */
extern PyObject *g_client_type, *g_pool_type, *g_lease_type, *g_match_type, *g_view_type;

extern const char *const g_dtype_names[KVP_DTYPE_MAX];
extern const unsigned g_dtype_bytes[KVP_DTYPE_MAX];

/* ---- the objects (View's struct is view.c's own) ---- */
typedef struct {
	PyObject_HEAD struct kvp_client *c; /* NULL once really closed */
	int busy;			    /* a call is in flight (the GIL is released) */
	int closed;			    /* close() was called: no further calls */
	struct PoolObject *pools;	    /* its Pool objects, borrowed: each unlinks itself */
} ClientObject;

typedef struct PoolObject {
	PyObject_HEAD ClientObject *client;
	struct kvp_pool *p; /* NULL once really detached */
	struct kvp_geometry g;
	PyObject *name;
	int detached;		 /* detach() was called */
	struct PoolObject *next; /* the client's list of its Pool objects (borrowed) */
} PoolObject;

typedef struct {
	PyObject_HEAD PoolObject *pool;
	uint64_t id;
	int tier;
	int ended;
	uint32_t *pages;
	uint32_t n, cap;
} LeaseObject;

typedef struct {
	PyObject_HEAD PoolObject *pool;
	uint64_t tokens, lock_id;
	uint32_t *device_pages, *host_pages;
	uint32_t n_device, n_host;
	uint32_t remote_pages;		      /* match: pages after it the remote tier holds */
	uint32_t fetched_pages, missed_pages; /* fetch: read from the remote tier, not had */
} MatchObject;

/* A list of uint32 taken from any buffer of integers (array, numpy, bytes-like), a list or
 * tuple of ints, or (through numpy.asarray) anything array-like such as a CPU tensor. A
 * C-contiguous native uint32 buffer is used in place; anything else is converted in C. */
struct u32list {
	const uint32_t *v;
	Py_ssize_t n;
	uint32_t *owned;
	Py_buffer view;
	int has_view;
};

/* ---- module.c: errors and object allocation ---- */
PyObject *str_from(const char *s);
PyObject *geometry_to_py(const struct kvp_geometry *g);
PyObject *raise_kvp(const struct kvp_error *e);
PyObject *alloc_obj(PyObject *type);
void free_obj(PyObject *self);

/* ---- convert.c: arguments in, page ids out ---- */
int tier_from(PyObject *o, const char *what, int *tier);
int u32_arg(PyObject *arg, const char *what, uint32_t *out);
int u64_arg(PyObject *arg, const char *what, uint64_t *out);
int u32list_from(PyObject *o, const char *what, struct u32list *l);
void u32list_done(struct u32list *l);
PyObject *pages_out(const uint32_t *p, size_t n);

/* ---- client.c ---- */
extern PyType_Spec client_spec;
struct kvp_client *client_enter(ClientObject *self);
void client_leave(ClientObject *self);
PyObject *client_enter_ctx(PyObject *self, PyObject *unused);
PyObject *pressure_to_py(const struct kvp_pressure *n);

/* ---- pool.c ---- */
extern PyType_Spec pool_spec;
struct kvp_pool *pool_handle(PoolObject *self);

/* ---- lease.c ---- */
extern PyType_Spec lease_spec;
/* torch_alloc.c: the module function set_torch_allocator(malloc, free) */
PyObject *torch_set_allocator(PyObject *mod, PyObject *args);
PyObject *lease_new(PoolObject *pool, int tier, uint64_t id, uint32_t *pages, uint32_t n);
LeaseObject *lease_arg(PoolObject *self, PyObject *o);
int lease_drop_used(LeaseObject *l, int own, const uint32_t *pages, uint32_t n);

/* ---- match.c ---- */
extern PyType_Spec match_spec;
int match_bufs(uint32_t cap, uint32_t **dev, uint32_t **host);
PyObject *match_new(PoolObject *self, struct kvp_pool *p, uint64_t tokens, uint64_t lock_id,
		    uint32_t *dev, uint32_t *host, uint32_t n_device, uint32_t n_host);

/* ---- view.c ---- */
extern PyType_Spec view_spec;
PyObject *view_new(PoolObject *pool, int tier, void *data, int ndim, const Py_ssize_t *shape);

/* ---- copy.c ---- */
PyObject *kvpy_copy_buffer_runs(PyObject *mod, PyObject *args, PyObject *kw);
