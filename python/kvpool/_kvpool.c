/* _kvpool.c - the CPython extension under the kvpool package: Client, Pool, Lease, Match and
 * View types over libkvpool, typed exceptions for every enum kvp_code, and zero-copy views of
 * the tier memory (DLPack 1.x with version negotiation, the unversioned capsule as fallback,
 * and the buffer protocol for CPU-mapped tiers).
 *
 * Built for the stable ABI (abi3, CPython >= 3.11: Py_buffer and the buffer slots entered the
 * limited API in 3.11). Every call into libkvpool is made from this file. Calls that wait on
 * the daemon release the GIL. A Client, like struct kvp_client, is not thread-safe: a second
 * thread entering a client that is in a call gets kvpool.ClientBusy instead of a corrupted
 * handle.
 */
#ifndef Py_LIMITED_API
#define Py_LIMITED_API 0x030B0000
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <poll.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvp_config.h"
#include "kvpool.h"

/* ---- DLPack (https://dmlc.github.io/dlpack), the structs of dlpack.h v1.1 ---- */
enum { kDLCPU = 1, kDLCUDA = 2 };
enum { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4, kDLFloat8_e4m3fn = 10 };

typedef struct {
	int32_t device_type;
	int32_t device_id;
} DLDevice;

typedef struct {
	uint8_t code;
	uint8_t bits;
	uint16_t lanes;
} DLDataType;

typedef struct {
	void *data;
	DLDevice device;
	int32_t ndim;
	DLDataType dtype;
	int64_t *shape;
	int64_t *strides;
	uint64_t byte_offset;
} DLTensor;

typedef struct DLManagedTensor {
	DLTensor dl_tensor;
	void *manager_ctx;
	void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;

typedef struct {
	uint32_t major;
	uint32_t minor;
} DLPackVersion;

typedef struct DLManagedTensorVersioned {
	DLPackVersion version;
	void *manager_ctx;
	void (*deleter)(struct DLManagedTensorVersioned *self);
	uint64_t flags;
	DLTensor dl_tensor;
} DLManagedTensorVersioned;

#define KVPY_MAX_DIMS 6

/* ---- module globals (one interpreter; created once at import) ---- */
static PyObject *g_error;		   /* kvpool.Error */
static PyObject *g_code_exc[KVP_CODE_MAX]; /* subclass per enum kvp_code, NULL for gaps */
static PyObject *g_client_busy;		   /* kvpool.ClientBusy */
static PyObject *g_geometry_type;	   /* kvpool.Geometry (a struct sequence) */
static PyObject *g_event_type;		   /* kvpool.Event (a struct sequence) */
static PyObject *g_pressure_type;	   /* kvpool.PressureNotice (a struct sequence) */
static PyObject *g_frombuffer, *g_uint32;  /* numpy.frombuffer and numpy.uint32, or NULL */
static PyObject *g_asarray;		   /* numpy.asarray, or NULL */
static PyObject *g_array_type;		   /* array.array */
static PyObject *g_client_type, *g_pool_type, *g_lease_type, *g_match_type, *g_view_type;

static const char *const g_dtype_names[KVP_DTYPE_MAX] = { "none", "fp16", "bf16", "fp8", "fp32" };
static const unsigned g_dtype_bytes[KVP_DTYPE_MAX] = { 0, 2, 2, 1, 4 };

/* ---- errors ---- */
static const struct {
	int code;
	const char *name;
	const char *doc;
} g_exc_table[] = {
	{ KVP_E_OUT_OF_CAPACITY, "OutOfCapacity",
	  "No room in a tier even after evicting: tier, requested_tokens, free_tokens, "
	  "evictable_tokens, protected_tokens, leased_tokens, total_tokens (and reserved_tokens, "
	  "of leased those in sessions' page reserves) say why." },
	{ KVP_E_HOST_BUDGET_EXCEEDED, "HostBudgetExceeded",
	  "Host memory budget exceeded: requested_bytes, available_bytes, limit, numa_node, pool." },
	{ KVP_E_QUOTA_EXCEEDED, "QuotaExceeded",
	  "The session's token quota: quota_tokens, held_tokens, requested_tokens." },
	{ KVP_E_NO_SUCH_POOL, "NoSuchPool", "The daemon has no pool of that name." },
	{ KVP_E_GEOMETRY_MISMATCH, "GeometryMismatch",
	  "The pool's geometry differs from the expected one: expected, actual (Geometry)." },
	{ KVP_E_NOT_FOUND, "NotFound", "No such lease, page or lock of this session." },
	{ KVP_E_INVALID_ARGUMENT, "InvalidArgument", "The daemon refused an argument." },
	{ KVP_E_PERMISSION_DENIED, "PermissionDenied", "The call needs rights this user lacks." },
	{ KVP_E_PROTOCOL, "ProtocolError", "A malformed or unexpected message." },
	{ KVP_E_VERSION, "VersionMismatch",
	  "Client and daemon speak different protocol versions." },
	{ KVP_E_SHUTTING_DOWN, "ShuttingDown", "The daemon is draining: no new leases." },
	{ KVP_E_LIMIT_EXCEEDED, "LimitExceeded", "A per-session or daemon limit: what, limit." },
	{ KVP_E_UNAVAILABLE, "Unavailable",
	  "The resource is pinned by another session's lock (read the host pages instead)." },
	{ KVP_E_INTERNAL, "Internal", "An internal daemon error." },
	{ KVP_E_RESTARTED, "Restarted",
	  "kvpoold restarted while the call was in flight: retry it (the client reconnects)." },
	{ KVP_E_NO_DAEMON, "NoDaemon", "No kvpoold answers on the socket: errno says why." },
	{ KVP_E_TRANSPORT, "TransportError",
	  "The connection failed or closed mid-call (errno says why); close the client." },
	{ KVP_E_NOMEM, "OutOfMemory", "libkvpool could not allocate memory." },
	{ KVP_E_MAP, "MapError", "Mapping a tier's memory failed: errno and message say why." },
	{ KVP_E_BUFFER, "BufferTooSmall", "A reply did not fit the buffer given for it." },
	{ KVP_E_FORKED, "Forked",
	  "The client was connected by another process (this one was forked from it): its "
	  "session is that process's. Connect a client of this process's own." },
};

/* Sets o.name to x and drops the reference to x; -1 (with the exception set) when x is NULL. */
static int set_attr_steal(PyObject *o, const char *name, PyObject *x)
{
	int r;

	if (!x)
		return -1;
	r = PyObject_SetAttrString(o, name, x);
	Py_DECREF(x);
	return r;
}

static int set_attr_u64(PyObject *o, const char *name, uint64_t v)
{
	return set_attr_steal(o, name, PyLong_FromUnsignedLongLong(v));
}

/* A string from the daemon or libkvpool as str: bytes that are not UTF-8 become U+FFFD, so a
 * message or name from a misbehaving peer still makes a typed error rather than a
 * UnicodeDecodeError. */
static PyObject *str_from(const char *s)
{
	return PyUnicode_DecodeUTF8(s, (Py_ssize_t)strlen(s), "replace");
}

static int set_attr_str(PyObject *o, const char *name, const char *s)
{
	return set_attr_steal(o, name, str_from(s));
}

static PyObject *geometry_to_py(const struct kvp_geometry *g)
{
	PyObject *t = PyStructSequence_New((PyTypeObject *)g_geometry_type);
	const char *dt = g->dtype < KVP_DTYPE_MAX ? g_dtype_names[g->dtype] : "unknown";
	PyObject *v[5];

	if (!t)
		return NULL;
	v[0] = PyLong_FromUnsignedLong(g->layers);
	v[1] = PyLong_FromUnsignedLong(g->kv_heads);
	v[2] = PyLong_FromUnsignedLong(g->head_dim);
	v[3] = PyUnicode_FromString(dt);
	v[4] = PyLong_FromUnsignedLong(g->page_tokens);
	for (int i = 0; i < 5; i++) {
		if (!v[i]) {
			for (int j = i + 1; j < 5; j++)
				Py_XDECREF(v[j]);
			Py_DECREF(t);
			return NULL;
		}
		PyStructSequence_SetItem(t, i, v[i]);
	}
	return t;
}

/* Sets the exception for a failed libkvpool call (the subclass of its code, the detail as
 * attributes) and returns NULL. */
static PyObject *raise_kvp(const struct kvp_error *e)
{
	int code = e->code;
	PyObject *cls =
		code > 0 && code < KVP_CODE_MAX && g_code_exc[code] ? g_code_exc[code] : g_error;
	PyObject *msg = str_from(e->message[0] ? e->message : kvp_code_name(code));
	PyObject *exc = msg ? PyObject_CallFunctionObjArgs(cls, msg, NULL) : NULL;
	int r = 0;

	Py_XDECREF(msg);
	if (!exc)
		return NULL;
	r |= set_attr_u64(exc, "code", (uint64_t)code);
	r |= set_attr_str(exc, "name", kvp_code_name(code));
	r |= set_attr_str(exc, "message", e->message);
	if (code == KVP_E_NO_DAEMON || code == KVP_E_TRANSPORT || code == KVP_E_MAP)
		r |= set_attr_u64(exc, "errno", (uint64_t)e->sys_errno);
	switch (e->detail) {
	case KVP_DETAIL_CAPACITY:
		r |= set_attr_str(exc, "tier", kvp_tier_name((int)e->capacity.tier));
		r |= set_attr_u64(exc, "requested_tokens", e->capacity.requested_tokens);
		r |= set_attr_u64(exc, "free_tokens", e->capacity.free_tokens);
		r |= set_attr_u64(exc, "evictable_tokens", e->capacity.evictable_tokens);
		r |= set_attr_u64(exc, "protected_tokens", e->capacity.protected_tokens);
		r |= set_attr_u64(exc, "leased_tokens", e->capacity.leased_tokens);
		r |= set_attr_u64(exc, "total_tokens", e->capacity.total_tokens);
		r |= set_attr_u64(exc, "reserved_tokens", e->capacity_reserved_tokens);
		break;
	case KVP_DETAIL_BUDGET:
		r |= set_attr_u64(exc, "requested_bytes", e->budget.requested_bytes);
		r |= set_attr_u64(exc, "available_bytes", e->budget.available_bytes);
		r |= set_attr_str(exc, "limit", kvp_limit_name((int)e->budget.limit));
		r |= set_attr_u64(exc, "numa_node", (uint64_t)(int64_t)e->budget.numa_node);
		r |= set_attr_str(exc, "pool", e->budget.pool);
		break;
	case KVP_DETAIL_QUOTA:
		r |= set_attr_u64(exc, "quota_tokens", e->quota.quota_tokens);
		r |= set_attr_u64(exc, "held_tokens", e->quota.held_tokens);
		r |= set_attr_u64(exc, "requested_tokens", e->quota.requested_tokens);
		break;
	case KVP_DETAIL_GEOMETRY: {
		PyObject *a = geometry_to_py(&e->geometry.expected);
		PyObject *b = geometry_to_py(&e->geometry.actual);

		if (!a || !b)
			r = -1;
		else
			r |= PyObject_SetAttrString(exc, "expected", a) |
			     PyObject_SetAttrString(exc, "actual", b);
		Py_XDECREF(a);
		Py_XDECREF(b);
		break;
	}
	case KVP_DETAIL_LIMIT:
		r |= set_attr_str(exc, "what", e->limit.what);
		r |= set_attr_u64(exc, "limit", e->limit.limit);
		break;
	default: break;
	}
	if (r) {
		Py_DECREF(exc);
		return NULL;
	}
	PyErr_SetObject(cls, exc);
	Py_DECREF(exc);
	return NULL;
}

/* ---- argument conversion ---- */
static int tier_from(PyObject *o, const char *what, int *tier)
{
	if (PyUnicode_Check(o)) {
		if (PyUnicode_CompareWithASCIIString(o, "device") == 0)
			*tier = KVP_TIER_DEVICE;
		else if (PyUnicode_CompareWithASCIIString(o, "host") == 0)
			*tier = KVP_TIER_HOST;
		else
			goto bad;
		return 0;
	}
	if (PyLong_Check(o)) {
		long v = PyLong_AsLong(o);

		if (v == -1 && PyErr_Occurred())
			return -1;
		if (v < 0 || v >= KVP_TIER_MAX)
			goto bad;
		*tier = (int)v;
		return 0;
	}
	PyErr_Format(PyExc_TypeError, "%s must be 'device' or 'host'", what);
	return -1;
bad:
	PyErr_Format(PyExc_ValueError, "%s must be 'device' or 'host', not %R", what, o);
	return -1;
}

/* An integer argument as a new int reference (anything with __index__: numpy ints too), or
 * NULL with TypeError naming it. */
static PyObject *int_arg(PyObject *o, const char *what)
{
	if (PyBool_Check(o) || (!PyLong_Check(o) && !PyIndex_Check(o))) {
		PyErr_Format(PyExc_TypeError, "%s must be an int", what);
		return NULL;
	}
	return PyNumber_Index(o);
}

/* arg as an unsigned int of at most max: a TypeError when it is no int, a ValueError (out of
 * range, the message naming what) when it is negative or above max. */
static int uint_arg(PyObject *arg, const char *what, unsigned long long max,
		    unsigned long long *out)
{
	PyObject *o = int_arg(arg, what);
	unsigned long long v;

	if (!o)
		return -1;
	v = PyLong_AsUnsignedLongLong(o);
	if ((v == (unsigned long long)-1 && PyErr_Occurred()) || v > max) {
		PyErr_Clear();
		if (max == UINT32_MAX)
			PyErr_Format(PyExc_ValueError, "%s must be in 0..%u, not %R", what,
				     UINT32_MAX, o);
		else
			PyErr_Format(PyExc_ValueError,
				     "%s must be a non-negative 64-bit int, not %R", what, o);
		Py_DECREF(o);
		return -1;
	}
	Py_DECREF(o);
	*out = v;
	return 0;
}

static int u32_arg(PyObject *arg, const char *what, uint32_t *out)
{
	unsigned long long v;

	if (uint_arg(arg, what, UINT32_MAX, &v))
		return -1;
	*out = (uint32_t)v;
	return 0;
}

static int u64_arg(PyObject *arg, const char *what, uint64_t *out)
{
	unsigned long long v;

	if (uint_arg(arg, what, UINT64_MAX, &v))
		return -1;
	*out = (uint64_t)v;
	return 0;
}

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

static void u32list_done(struct u32list *l)
{
	if (l->has_view)
		PyBuffer_Release(&l->view);
	PyMem_Free(l->owned);
	memset(l, 0, sizeof(*l));
}

static int u32_range(long long v, const char *what, Py_ssize_t i)
{
	if (v < 0 || v > (long long)UINT32_MAX) {
		PyErr_Format(PyExc_ValueError, "%s[%zd] = %lld is not in 0..%u", what, i, v,
			     UINT32_MAX);
		return -1;
	}
	return 0;
}

static int u32list_from_seq(PyObject *o, const char *what, struct u32list *l)
{
	int is_list = PyList_Check(o);
	Py_ssize_t n = is_list ? PyList_Size(o) : PyTuple_Size(o);

	l->owned = PyMem_Malloc(n > 0 ? (size_t)n * sizeof(uint32_t) : 1);
	if (!l->owned) {
		PyErr_NoMemory();
		return -1;
	}
	for (Py_ssize_t i = 0; i < n; i++) {
		PyObject *it = is_list ? PyList_GetItem(o, i) : PyTuple_GetItem(o, i);
		long long v;

		if (PyLong_CheckExact(it)) {
			v = PyLong_AsLongLong(it);
		} else if (!PyBool_Check(it) && PyIndex_Check(it)) {
			PyObject *x = PyNumber_Index(it);

			if (!x)
				return -1;
			v = PyLong_AsLongLong(x);
			Py_DECREF(x);
		} else {
			PyErr_Format(PyExc_TypeError, "%s[%zd] must be an int", what, i);
			return -1;
		}
		if (v == -1 && PyErr_Occurred()) {
			PyErr_Clear();
			v = -1;
		}
		if (u32_range(v, what, i))
			return -1;
		l->owned[i] = (uint32_t)v;
	}
	l->v = l->owned;
	l->n = n;
	return 0;
}

#define CONVERT_FROM(T)                                                                            \
	do {                                                                                       \
		const T *src = (const T *)l->view.buf;                                             \
		for (Py_ssize_t i = 0; i < n; i++) {                                               \
			if (u32_range((long long)src[i], what, i))                                 \
				return -1;                                                         \
			l->owned[i] = (uint32_t)src[i];                                            \
		}                                                                                  \
	} while (0)

static int u32list_from_buffer(PyObject *o, const char *what, struct u32list *l)
{
	const char *fmt;
	Py_ssize_t n, isz;
	char c;
	int sign;

	if (PyObject_GetBuffer(o, &l->view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
		PyErr_Clear();
		PyErr_Format(PyExc_ValueError, "%s must be a C-contiguous buffer of integers",
			     what);
		return -1;
	}
	l->has_view = 1;
	if (l->view.ndim > 1) {
		PyErr_Format(PyExc_ValueError, "%s must be one-dimensional, not %d-dimensional",
			     what, l->view.ndim);
		return -1;
	}
	fmt = l->view.format ? l->view.format : "B";
	if (*fmt == '@' || *fmt == '=' || *fmt == '<')
		fmt++;
	c = fmt[0];
	isz = l->view.itemsize;
	if (!c || fmt[1] || !strchr("bBhHiIlLqQnN", c)) {
		PyErr_Format(PyExc_TypeError, "%s must hold integers, not items of format '%s'",
			     what, l->view.format ? l->view.format : "B");
		return -1;
	}
	sign = c >= 'a' && c <= 'z';
	n = isz ? l->view.len / isz : 0;
	if (!sign && isz == 4 && ((uintptr_t)l->view.buf & 3) == 0) {
		l->v = l->view.buf;
		l->n = n;
		return 0;
	}
	l->owned = PyMem_Malloc(n > 0 ? (size_t)n * sizeof(uint32_t) : 1);
	if (!l->owned) {
		PyErr_NoMemory();
		return -1;
	}
	if (sign && isz == 1)
		CONVERT_FROM(int8_t);
	else if (sign && isz == 2)
		CONVERT_FROM(int16_t);
	else if (sign && isz == 4)
		CONVERT_FROM(int32_t);
	else if (sign && isz == 8)
		CONVERT_FROM(int64_t);
	else if (isz == 1)
		CONVERT_FROM(uint8_t);
	else if (isz == 2)
		CONVERT_FROM(uint16_t);
	else if (isz == 4)
		memcpy(l->owned, l->view.buf, (size_t)n * 4);
	else if (isz == 8)
		CONVERT_FROM(uint64_t);
	else {
		PyErr_Format(PyExc_TypeError, "%s: integers of %zd bytes are not supported", what,
			     isz);
		return -1;
	}
	l->v = l->owned;
	l->n = n;
	return 0;
}

static int u32list_from(PyObject *o, const char *what, struct u32list *l)
{
	int r;

	memset(l, 0, sizeof(*l));
	if (PyList_Check(o) || PyTuple_Check(o))
		r = u32list_from_seq(o, what, l);
	else if (PyObject_CheckBuffer(o))
		r = u32list_from_buffer(o, what, l);
	else if (g_asarray && !PyUnicode_Check(o) &&
		 (PyObject_HasAttrString(o, "__array__") ||
		  PyObject_HasAttrString(o, "__array_interface__"))) {
		PyObject *a = PyObject_CallFunctionObjArgs(g_asarray, o, NULL);

		if (!a)
			return -1;
		r = u32list_from_buffer(a, what, l);
		Py_DECREF(a);
	} else {
		PyErr_Format(PyExc_TypeError,
			     "%s must be a list or a buffer of integers (array, numpy array, CPU "
			     "tensor)",
			     what);
		return -1;
	}
	if (r == 0 && l->n > (Py_ssize_t)UINT32_MAX) {
		PyErr_Format(PyExc_ValueError, "%s has more than %u entries", what, UINT32_MAX);
		r = -1;
	}
	if (r)
		u32list_done(l);
	return r;
}

/* Page ids out: a numpy uint32 array when numpy imports, else array('I'). */
static PyObject *pages_out(const uint32_t *p, size_t n)
{
	PyObject *ba =
		PyByteArray_FromStringAndSize((const char *)p, (Py_ssize_t)(n * sizeof(uint32_t)));
	PyObject *r;

	if (!ba)
		return NULL;
	if (g_frombuffer)
		r = PyObject_CallFunctionObjArgs(g_frombuffer, ba, g_uint32, NULL);
	else
		r = PyObject_CallFunction(g_array_type, "sO", "I", ba);
	Py_DECREF(ba);
	return r;
}

/* ---- Client ---- */
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

typedef struct {
	PyObject_HEAD struct kvp_mapping *map; /* one reference (see mapping lifetime) */
	PyObject *pool_name;
	void *data;
	int tier, ndim, dtype;
	DLDevice device;
	Py_ssize_t shape[KVPY_MAX_DIMS];
	Py_ssize_t strides[KVPY_MAX_DIMS]; /* bytes */
	Py_ssize_t itemsize, nbytes;
} ViewObject;

static PyObject *alloc_obj(PyObject *type)
{
	allocfunc a = (allocfunc)PyType_GetSlot((PyTypeObject *)type, Py_tp_alloc);

	return a((PyTypeObject *)type, 0);
}

static void free_obj(PyObject *self)
{
	PyTypeObject *tp = Py_TYPE(self);
	freefunc f = (freefunc)PyType_GetSlot(tp, Py_tp_free);

	f(self);
	Py_DECREF(tp);
}

/* Enters a call on the client: refuses a closed client and a second thread. Returns the
 * handle, or NULL with the exception set. Leave with client_leave. */
static struct kvp_client *client_enter(ClientObject *self)
{
	if (self->closed || !self->c) {
		PyErr_SetString(PyExc_ValueError, "the kvpool client is closed");
		return NULL;
	}
	if (self->busy) {
		PyErr_SetString(
			g_client_busy,
			"this kvpool Client is in a call on another thread: a Client is not "
			"thread-safe, use one per thread or a lock of your own");
		return NULL;
	}
	self->busy = 1;
	return self->c;
}

static void client_leave(ClientObject *self)
{
	self->busy = 0;
}

#define KVPY_WAIT(stmt)                                                                            \
	do {                                                                                       \
		Py_BEGIN_ALLOW_THREADS stmt;                                                       \
		Py_END_ALLOW_THREADS                                                               \
	} while (0)

static void client_close_now(ClientObject *self)
{
	/* kvp_client_close frees every pool handle still attached */
	for (struct PoolObject *po = self->pools; po; po = po->next)
		po->p = NULL;
	kvp_client_close(self->c);
	self->c = NULL;
}

static void pool_detach_now(PoolObject *self);

/* ==== Mapping lifetime ====
 * The one place that decides when a pool's tier memory may be unmapped. A view holds one
 * reference to its tier's struct kvp_mapping (and nothing else of the pool: not the Pool, not
 * the Client); every DLPack capsule, tensor or buffer exported from it holds the view. So
 * Pool.detach() and Client.close() happen at once whatever views live (the session's leases
 * and locks go back, the session ends) and the memory under a view stays mapped until the
 * last view and whatever was made from it go: then kvp_mapping_unref unmaps it. The
 * references may be dropped from any thread (a DLPack deleter runs where the consumer frees).
 */
static struct kvp_mapping *mapping_hold(struct kvp_pool *p, int tier)
{
	return kvp_pool_tier_mapping(p, tier);
}

static void mapping_drop(struct kvp_mapping *m)
{
	kvp_mapping_unref(m);
}
/* ==== end of mapping lifetime ==== */

static PyObject *client_close(ClientObject *self, PyObject *unused)
{
	(void)unused;
	if (self->busy) {
		PyErr_SetString(g_client_busy, "close() while a call is in flight on another "
					       "thread");
		return NULL;
	}
	self->closed = 1;
	if (self->c)
		client_close_now(self);
	Py_RETURN_NONE;
}

static void client_dealloc(ClientObject *self)
{
	if (self->c)
		kvp_client_close(self->c);
	free_obj((PyObject *)self);
}

static PyObject *client_enter_ctx(PyObject *self, PyObject *unused)
{
	(void)unused;
	return Py_NewRef(self);
}

static PyObject *client_exit_ctx(ClientObject *self, PyObject *args)
{
	(void)args;
	return client_close(self, NULL);
}

static PyObject *client_ping(ClientObject *self, PyObject *unused)
{
	struct kvp_client *c = client_enter(self);
	struct kvp_error err;
	int r;

	(void)unused;
	if (!c)
		return NULL;
	KVPY_WAIT(r = kvp_client_ping(c, &err));
	client_leave(self);
	if (r < 0)
		return raise_kvp(&err);
	Py_RETURN_NONE;
}

static int dict_steal(PyObject *d, const char *k, PyObject *v)
{
	int r;

	if (!v)
		return -1;
	r = PyDict_SetItemString(d, k, v);
	Py_DECREF(v);
	return r;
}

static int dict_set_u64(PyObject *d, const char *k, uint64_t v)
{
	return dict_steal(d, k, PyLong_FromUnsignedLongLong(v));
}

static int dict_set_str(PyObject *d, const char *k, const char *v)
{
	return dict_steal(d, k, str_from(v));
}

static PyObject *tier_status_to_py(const struct kvp_tier_status *t)
{
	PyObject *d = PyDict_New();

	if (!d)
		return NULL;
	if (dict_set_str(d, "backend", kvp_backend_name((int)t->backend)) ||
	    dict_set_u64(d, "total_tokens", t->total_tokens) ||
	    dict_set_u64(d, "free_tokens", t->free_tokens) ||
	    dict_set_u64(d, "leased_tokens", t->leased_tokens) ||
	    dict_set_u64(d, "cached_tokens", t->cached_tokens) ||
	    dict_set_u64(d, "evictable_tokens", t->evictable_tokens) ||
	    dict_set_u64(d, "protected_tokens", t->protected_tokens)) {
		Py_DECREF(d);
		return NULL;
	}
	return d;
}

static PyObject *pool_status_to_py(const struct kvp_pool_status *ps)
{
	PyObject *d = PyDict_New(), *tiers = NULL;

	if (!d)
		return NULL;
	if (dict_set_str(d, "name", ps->name) || dict_set_u64(d, "pool_id", ps->pool_id) ||
	    dict_steal(d, "geometry", geometry_to_py(&ps->geometry)) ||
	    dict_set_u64(d, "hit_tokens", ps->hit_tokens) ||
	    dict_set_u64(d, "queried_tokens", ps->queried_tokens))
		goto fail;
	tiers = PyDict_New();
	if (!tiers)
		goto fail;
	for (int t = 0; t < KVP_TIER_MAX; t++)
		if (ps->tiers[t].present &&
		    dict_steal(tiers, kvp_tier_name(t), tier_status_to_py(&ps->tiers[t])))
			goto fail;
	if (dict_steal(d, "tiers", tiers))
		goto fail_d;
	return d;
fail:
	Py_XDECREF(tiers);
fail_d:
	Py_DECREF(d);
	return NULL;
}

static PyObject *client_status(ClientObject *self, PyObject *unused)
{
	struct kvp_client *c = client_enter(self);
	struct kvp_status *st;
	struct kvp_error err;
	PyObject *d = NULL, *pools;
	int r;

	(void)unused;
	if (!c)
		return NULL;
	st = PyMem_Malloc(sizeof(*st));
	if (!st) {
		client_leave(self);
		return PyErr_NoMemory();
	}
	memset(st, 0, sizeof(*st));
	st->struct_size = sizeof(*st);
	KVPY_WAIT(r = kvp_client_status(c, st, &err));
	client_leave(self);
	if (r < 0) {
		PyMem_Free(st);
		return raise_kvp(&err);
	}
	d = PyDict_New();
	pools = PyList_New(0);
	if (!d || !pools || dict_set_str(d, "daemon_version", st->daemon_version) ||
	    dict_set_u64(d, "uptime_ms", st->uptime_ms) ||
	    dict_set_u64(d, "sessions", st->sessions))
		goto fail;
	for (uint32_t i = 0; i < st->n_pools && i < KVP_STATUS_MAX_POOLS; i++) {
		PyObject *p = pool_status_to_py(&st->pools[i]);

		if (!p || PyList_Append(pools, p)) {
			Py_XDECREF(p);
			goto fail;
		}
		Py_DECREF(p);
	}
	PyMem_Free(st);
	if (dict_steal(d, "pools", pools)) {
		Py_DECREF(d);
		return NULL;
	}
	return d;
fail:
	PyMem_Free(st);
	Py_XDECREF(pools);
	Py_XDECREF(d);
	return NULL;
}

static int geometry_field(PyObject *src, const char *name, uint32_t *out)
{
	PyObject *v;
	int r = 0;

	if (PyDict_Check(src)) {
		v = PyDict_GetItemString(src, name);
		Py_XINCREF(v);
	} else {
		v = PyObject_GetAttrString(src, name);
		if (!v) {
			if (!PyErr_ExceptionMatches(PyExc_AttributeError))
				return -1;
			PyErr_Clear();
		}
	}
	if (!v || v == Py_None) {
		*out = 0;
	} else if (strcmp(name, "dtype") == 0 && PyUnicode_Check(v)) {
		*out = KVP_DTYPE_MAX;
		for (int i = 1; i < KVP_DTYPE_MAX; i++)
			if (PyUnicode_CompareWithASCIIString(v, g_dtype_names[i]) == 0)
				*out = (uint32_t)i;
		if (*out == KVP_DTYPE_MAX) {
			PyErr_Format(PyExc_ValueError,
				     "expect.dtype must be fp16, bf16, fp8 or fp32, not %R", v);
			r = -1;
		}
	} else {
		char what[48];

		snprintf(what, sizeof(what), "expect.%s", name);
		r = u32_arg(v, what, out);
	}
	Py_XDECREF(v);
	return r;
}

static PyObject *client_attach(ClientObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "pool", "expect", NULL };
	PyObject *expect = Py_None;
	const char *name;
	struct kvp_geometry g = { 0 }, *gp = NULL;
	struct kvp_client *c;
	struct kvp_error err;
	struct kvp_pool *p;
	PoolObject *po;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "s|O:attach", kwlist, &name, &expect))
		return NULL;
	if (expect != Py_None) {
		if (geometry_field(expect, "layers", &g.layers) ||
		    geometry_field(expect, "kv_heads", &g.kv_heads) ||
		    geometry_field(expect, "head_dim", &g.head_dim) ||
		    geometry_field(expect, "dtype", &g.dtype) ||
		    geometry_field(expect, "page_tokens", &g.page_tokens))
			return NULL;
		gp = &g;
	}
	/* The daemon keeps one attachment per session and pool: a second attach through this
	 * client hands back the Pool object that holds it. */
	for (po = self->pools; po && !self->closed; po = po->next) {
		if (po->detached || !po->p || PyUnicode_CompareWithASCIIString(po->name, name))
			continue;
		if (gp && ((g.layers && g.layers != po->g.layers) ||
			   (g.kv_heads && g.kv_heads != po->g.kv_heads) ||
			   (g.head_dim && g.head_dim != po->g.head_dim) ||
			   (g.dtype && g.dtype != po->g.dtype) ||
			   (g.page_tokens && g.page_tokens != po->g.page_tokens))) {
			memset(&err, 0, sizeof(err));
			err.code = KVP_E_GEOMETRY_MISMATCH;
			snprintf(err.message, sizeof(err.message),
				 "pool %s: geometry differs from the expected one", name);
			err.detail = KVP_DETAIL_GEOMETRY;
			err.geometry.expected = g;
			err.geometry.actual = po->g;
			return raise_kvp(&err);
		}
		return Py_NewRef((PyObject *)po);
	}
	c = client_enter(self);
	if (!c)
		return NULL;
	KVPY_WAIT(p = kvp_pool_attach(c, name, gp, &err));
	client_leave(self);
	if (!p)
		return raise_kvp(&err);
	po = (PoolObject *)alloc_obj(g_pool_type);
	if (!po) {
		kvp_pool_detach(p, NULL);
		return NULL;
	}
	po->client = (ClientObject *)Py_NewRef((PyObject *)self);
	po->p = p;
	kvp_pool_geometry(p, &po->g);
	po->next = self->pools;
	self->pools = po;
	po->name = PyUnicode_FromString(name);
	if (!po->name) {
		Py_DECREF((PyObject *)po);
		return NULL;
	}
	return (PyObject *)po;
}

static PyObject *client_evict(ClientObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "pool", "tokens", "tier", NULL };
	PyObject *tokens_o, *tier_o = NULL;
	const char *pool;
	uint64_t tokens, evicted = 0;
	int tier = KVP_TIER_DEVICE, r;
	struct kvp_client *c;
	struct kvp_error err;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "sO|O:evict", kwlist, &pool, &tokens_o, &tier_o))
		return NULL;
	if (u64_arg(tokens_o, "tokens", &tokens) || (tier_o && tier_from(tier_o, "tier", &tier)))
		return NULL;
	c = client_enter(self);
	if (!c)
		return NULL;
	KVPY_WAIT(r = kvp_admin_evict(c, pool, tier, tokens, &evicted, &err));
	client_leave(self);
	if (r < 0)
		return raise_kvp(&err);
	return PyLong_FromUnsignedLongLong(evicted);
}

static PyObject *client_flush(ClientObject *self, PyObject *args)
{
	const char *pool;
	uint64_t evicted = 0;
	struct kvp_client *c;
	struct kvp_error err;
	int r;

	if (!PyArg_ParseTuple(args, "s:flush", &pool))
		return NULL;
	c = client_enter(self);
	if (!c)
		return NULL;
	KVPY_WAIT(r = kvp_admin_flush(c, pool, &evicted, &err));
	client_leave(self);
	if (r < 0)
		return raise_kvp(&err);
	return PyLong_FromUnsignedLongLong(evicted);
}

static PyObject *client_set_timeout(ClientObject *self, PyObject *arg)
{
	struct kvp_client *c;
	uint32_t ms;
	int r;

	if (u32_arg(arg, "ms", &ms))
		return NULL;
	c = client_enter(self);
	if (!c)
		return NULL;
	r = kvp_client_set_timeout(c, ms);
	client_leave(self);
	if (r < 0) {
		PyErr_SetString(PyExc_ValueError, "ms: kvp_client_set_timeout refused it");
		return NULL;
	}
	Py_RETURN_NONE;
}

static PyObject *client_get_closed(ClientObject *self, void *unused)
{
	(void)unused;
	return PyBool_FromLong(self->closed || !self->c);
}

static PyObject *client_get_session_id(ClientObject *self, void *unused)
{
	(void)unused;
	if (!self->c) {
		PyErr_SetString(PyExc_ValueError, "the kvpool client is closed");
		return NULL;
	}
	return PyLong_FromUnsignedLongLong(kvp_client_session_id(self->c));
}

static PyObject *client_get_daemon_version(ClientObject *self, void *unused)
{
	(void)unused;
	if (!self->c) {
		PyErr_SetString(PyExc_ValueError, "the kvpool client is closed");
		return NULL;
	}
	return PyUnicode_FromString(kvp_client_daemon_version(self->c));
}

/* ---- events: frames the daemon pushes unasked ---- */
#define KVPY_EVENT_PAYLOAD 65536 /* bytes of an event's frame handed to Python */

static PyObject *client_event_fd(ClientObject *self, PyObject *unused)
{
	struct kvp_client *c = client_enter(self);
	struct kvp_error err;
	int fd;

	(void)unused;
	if (!c)
		return NULL;
	fd = kvp_client_event_fd(c);
	client_leave(self);
	if (fd < 0) {
		memset(&err, 0, sizeof(err));
		err.code = -fd;
		snprintf(err.message, sizeof(err.message), "kvp_client_event_fd: %s",
			 kvp_code_name(-fd));
		return raise_kvp(&err);
	}
	return PyLong_FromLong(fd);
}

static PyObject *event_to_py(const struct kvp_event *ev, const uint8_t *buf)
{
	PyObject *e = PyStructSequence_New((PyTypeObject *)g_event_type);
	size_t n = ev->payload_len < ev->payload_cap ? ev->payload_len : ev->payload_cap;
	PyObject *v[6];

	if (!e)
		return NULL;
	v[0] = PyLong_FromUnsignedLong(ev->type);
	v[1] = PyLong_FromLong(ev->code);
	v[2] = PyLong_FromUnsignedLongLong(ev->id);
	v[3] = PyLong_FromUnsignedLongLong(ev->dropped);
	v[4] = PyBytes_FromStringAndSize((const char *)buf, (Py_ssize_t)n);
	v[5] = PyLong_FromSize_t(ev->payload_len);
	for (int i = 0; i < 6; i++) {
		if (!v[i]) {
			for (int j = i; j < 6; j++)
				Py_XDECREF(v[j]);
			Py_DECREF(e);
			return NULL;
		}
		PyStructSequence_SetItem(e, i, v[i]);
	}
	return e;
}

static PyObject *client_next_event(ClientObject *self, PyObject *unused)
{
	struct kvp_client *c = client_enter(self);
	struct kvp_event ev = { .struct_size = sizeof(ev), .payload_cap = KVPY_EVENT_PAYLOAD };
	struct kvp_error err;
	PyObject *r;
	int rc;

	(void)unused;
	if (!c)
		return NULL;
	ev.payload = PyMem_Malloc(KVPY_EVENT_PAYLOAD);
	if (!ev.payload) {
		client_leave(self);
		return PyErr_NoMemory();
	}
	rc = kvp_client_event_next(c, &ev, &err); /* never blocks */
	client_leave(self);
	if (rc == -KVP_E_AGAIN)
		r = Py_NewRef(Py_None);
	else if (rc < 0)
		r = raise_kvp(&err);
	else
		r = event_to_py(&ev, ev.payload);
	PyMem_Free(ev.payload);
	return r;
}

static PyObject *client_events(ClientObject *self, PyObject *unused)
{
	PyObject *next, *it;

	(void)unused;
	if (self->closed || !self->c) {
		PyErr_SetString(PyExc_ValueError, "the kvpool client is closed");
		return NULL;
	}
	next = PyObject_GetAttrString((PyObject *)self, "next_event");
	if (!next)
		return NULL;
	it = PyCallIter_New(next, Py_None);
	Py_DECREF(next);
	return it;
}

/* ---- pressure notices: pushed events of type KVP_EVENT_PRESSURE ---- */
#define KVPY_PRESSURE_FIELDS 11

static double now_mono(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static PyObject *pressure_to_py(const struct kvp_pressure *n)
{
	PyObject *e = PyStructSequence_New((PyTypeObject *)g_pressure_type);
	PyObject *v[KVPY_PRESSURE_FIELDS];

	if (!e)
		return NULL;
	v[0] = PyUnicode_FromString(n->pool);
	v[1] = PyLong_FromUnsignedLong(n->pool_id);
	v[2] = PyUnicode_FromString(kvp_tier_name((int)n->tier));
	v[3] = PyBool_FromLong(n->recovered);
	v[4] = PyLong_FromUnsignedLongLong(n->free_tokens);
	v[5] = PyLong_FromUnsignedLongLong(n->evictable_tokens);
	v[6] = PyLong_FromUnsignedLongLong(n->reserved_tokens);
	v[7] = PyLong_FromUnsignedLongLong(n->watermark_tokens);
	v[8] = PyLong_FromUnsignedLongLong(n->total_tokens);
	v[9] = PyLong_FromUnsignedLong(n->coalesced);
	v[10] = PyLong_FromUnsignedLongLong(n->seq);
	for (int i = 0; i < KVPY_PRESSURE_FIELDS; i++) {
		if (!v[i]) {
			for (int j = i; j < KVPY_PRESSURE_FIELDS; j++)
				Py_XDECREF(v[j]);
			Py_DECREF(e);
			return NULL;
		}
		PyStructSequence_SetItem(e, i, v[i]);
	}
	return e;
}

/* Appends to list the pressure notices queued in c now (other events are dropped). 0, or -1
 * with an exception set. */
static int drain_pressure(struct kvp_client *c, uint8_t *buf, PyObject *list)
{
	for (;;) {
		struct kvp_event ev = { .struct_size = sizeof(ev),
					.payload = buf,
					.payload_cap = KVPY_EVENT_PAYLOAD };
		struct kvp_pressure n = { .struct_size = sizeof(n) };
		struct kvp_error err;
		PyObject *o;
		int rc = kvp_client_event_next(c, &ev, &err);

		if (rc == -KVP_E_AGAIN)
			return 0;
		if (rc < 0) {
			raise_kvp(&err);
			return -1;
		}
		if (ev.type != KVP_EVENT_PRESSURE)
			continue;
		if (kvp_pressure_decode(&ev, &n, &err) < 0) {
			raise_kvp(&err);
			return -1;
		}
		o = pressure_to_py(&n);
		if (!o || PyList_Append(list, o) < 0) {
			Py_XDECREF(o);
			return -1;
		}
		Py_DECREF(o);
	}
}

static PyObject *client_pressure_notices(ClientObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "timeout", NULL };
	double timeout = 0.0, end;
	struct kvp_client *c;
	PyObject *list, *it = NULL;
	uint8_t *buf;
	int fd;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|d:pressure_notices", kwlist, &timeout))
		return NULL;
	if (!(timeout >= 0)) {
		PyErr_SetString(PyExc_ValueError, "timeout must be >= 0");
		return NULL;
	}
	if (!(list = PyList_New(0)))
		return NULL;
	if (!(buf = PyMem_Malloc(KVPY_EVENT_PAYLOAD))) {
		Py_DECREF(list);
		return PyErr_NoMemory();
	}
	c = client_enter(self);
	if (!c)
		goto out;
	end = now_mono() + timeout;
	fd = kvp_client_event_fd(c);
	for (;;) {
		struct pollfd pf = { .fd = fd, .events = POLLIN };
		double left;

		if (drain_pressure(c, buf, list) < 0) {
			client_leave(self);
			goto out;
		}
		left = end - now_mono();
		if (PyList_Size(list) || left <= 0 || fd < 0)
			break;
		KVPY_WAIT(poll(&pf, 1, (int)(left * 1000.0) + 1));
	}
	client_leave(self);
	it = PyObject_GetIter(list);
out:
	PyMem_Free(buf);
	Py_DECREF(list);
	return it;
}

static PyMethodDef client_methods[] = {
	{ "close", (PyCFunction)client_close, METH_NOARGS,
	  "close()\n--\n\nCloses the connection: the daemon returns every lease and lock of the "
	  "session at once. Views taken from its pools keep their memory mapped until they "
	  "go." },
	{ "ping", (PyCFunction)client_ping, METH_NOARGS, "ping()\n--\n\nOne round trip." },
	{ "event_fd", (PyCFunction)client_event_fd, METH_NOARGS,
	  "event_fd()\n--\n\nA descriptor to poll for reading (owned by the client: do not read "
	  "or close it): readable when an event the daemon pushed unasked is queued or bytes from "
	  "the daemon wait. When it polls readable, drain events() (or next_event() until None), "
	  "then poll again. TransportError when the connection was lost." },
	{ "next_event", (PyCFunction)client_next_event, METH_NOARGS,
	  "next_event()\n--\n\nThe oldest queued event as a kvpool.Event (type, code, id, "
	  "dropped, payload, payload_len), None when none is queued. Never blocks; TransportError "
	  "once the connection failed and the queue is empty." },
	{ "events", (PyCFunction)client_events, METH_NOARGS,
	  "events()\n--\n\nAn iterator over the events queued now (next_event() until None)." },
	{ "pressure_notices", (PyCFunction)(void (*)(void))client_pressure_notices,
	  METH_VARARGS | METH_KEYWORDS,
	  "pressure_notices(timeout=0.0)\n--\n\nAn iterator over the pressure notices queued "
	  "now as kvpool.PressureNotice, after waiting up to `timeout` seconds (GIL released) for "
	  "the first. Pools attached by a client connected with pressure_notices=True get them; "
	  "events of other kinds are taken and dropped (events() shows every kind)." },
	{ "status", (PyCFunction)client_status, METH_NOARGS,
	  "status()\n--\n\nThe daemon's status as a dict: daemon_version, uptime_ms, sessions and "
	  "pools (name, pool_id, geometry, tiers with token counts, hit/queried tokens)." },
	{ "attach", (PyCFunction)(void (*)(void))client_attach, METH_VARARGS | METH_KEYWORDS,
	  "attach(pool, expect=None)\n--\n\nAttaches to pool `pool` and maps its tiers. `expect`"
	  " (a Geometry, a dict or any object with those attributes; missing or 0 fields match "
	  "anything) must match the pool's geometry, else GeometryMismatch. The daemon keeps one "
	  "attachment per session and pool: attaching again through the same client returns the "
	  "same Pool object while it is attached." },
	{ "evict", (PyCFunction)(void (*)(void))client_evict, METH_VARARGS | METH_KEYWORDS,
	  "evict(pool, tokens, tier='device')\n--\n\nEvicts up to `tokens` cached tokens from a "
	  "tier of pool `pool` (admin). Returns the tokens evicted." },
	{ "flush", (PyCFunction)client_flush, METH_VARARGS,
	  "flush(pool)\n--\n\nDrops every unlocked cached prefix of pool `pool` (admin). Returns "
	  "the tokens evicted." },
	{ "set_timeout", (PyCFunction)client_set_timeout, METH_O,
	  "set_timeout(ms)\n--\n\nReceive timeout of every call (0: wait forever). A call that "
	  "times out raises TransportError and the client must be closed." },
	{ "__enter__", client_enter_ctx, METH_NOARGS, "Returns the client." },
	{ "__exit__", (PyCFunction)client_exit_ctx, METH_VARARGS, "Closes the client." },
	{ NULL, NULL, 0, NULL }
};

static PyGetSetDef client_getset[] = { { "closed", (getter)client_get_closed, NULL,
					 "Whether close() was called.", NULL },
				       { "session_id", (getter)client_get_session_id, NULL,
					 "The daemon's id of this session.", NULL },
				       { "daemon_version", (getter)client_get_daemon_version, NULL,
					 "The daemon's version string.", NULL },
				       { NULL, NULL, NULL, NULL, NULL } };

static PyType_Slot client_slots[] = {
	{ Py_tp_doc, "A connection to kvpoold (kvpool.connect makes one). Not thread-safe: use "
		     "one per thread; a second thread entering a busy client gets ClientBusy." },
	{ Py_tp_dealloc, client_dealloc },
	{ Py_tp_methods, client_methods },
	{ Py_tp_getset, client_getset },
	{ 0, NULL }
};

static PyType_Spec client_spec = { "kvpool.Client", sizeof(ClientObject), 0,
				   Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
				   client_slots };

/* ---- Pool ---- */
/* The pool handle for a call, or NULL with ValueError when detached or closed. */
static struct kvp_pool *pool_handle(PoolObject *self)
{
	if (self->detached || !self->p || !self->client->c || self->client->closed) {
		PyErr_SetString(PyExc_ValueError,
				"the kvpool pool is detached or its client closed");
		return NULL;
	}
	return self->p;
}

static void pool_detach_now(PoolObject *self)
{
	ClientObject *c = self->client;
	struct kvp_pool *p = self->p;

	/* The client's close frees every handle; with another thread in a call, leave it to it. */
	if (!p || !c->c || c->busy)
		return;
	self->p = NULL;
	c->busy = 1;
	KVPY_WAIT(kvp_pool_detach(p, NULL));
	c->busy = 0;
}

static void pool_dealloc(PoolObject *self)
{
	PoolObject **pp;

	pool_detach_now(self);
	for (pp = self->client ? &self->client->pools : NULL; pp && *pp; pp = &(*pp)->next)
		if (*pp == self) {
			*pp = self->next;
			break;
		}
	Py_XDECREF(self->name);
	Py_XDECREF((PyObject *)self->client);
	free_obj((PyObject *)self);
}

static PyObject *pool_detach(PoolObject *self, PyObject *unused)
{
	ClientObject *c = self->client;
	struct kvp_pool *p;
	struct kvp_error err;
	int r;

	(void)unused;
	if (self->detached || !self->p || !c->c)
		Py_RETURN_NONE;
	if (!client_enter(c))
		return NULL;
	self->detached = 1;
	p = self->p;
	self->p = NULL;
	KVPY_WAIT(r = kvp_pool_detach(p, &err));
	client_leave(c);
	if (r < 0)
		return raise_kvp(&err);
	Py_RETURN_NONE;
}

static PyObject *pool_exit_ctx(PoolObject *self, PyObject *args)
{
	(void)args;
	return pool_detach(self, NULL);
}

static PyObject *pool_get_geometry(PoolObject *self, void *unused)
{
	(void)unused;
	return geometry_to_py(&self->g);
}

static PyObject *pool_get_name(PoolObject *self, void *unused)
{
	(void)unused;
	return Py_NewRef(self->name);
}

static PyObject *pool_get_detached(PoolObject *self, void *unused)
{
	(void)unused;
	return PyBool_FromLong(self->detached || !self->p);
}

static PyObject *pool_get_client(PoolObject *self, void *unused)
{
	(void)unused;
	return Py_NewRef((PyObject *)self->client);
}

static PyObject *pool_get_id(PoolObject *self, void *unused)
{
	struct kvp_pool *p = pool_handle(self);

	(void)unused;
	return p ? PyLong_FromUnsignedLong(kvp_pool_id(p)) : NULL;
}

static PyObject *pool_get_page_bytes(PoolObject *self, void *unused)
{
	struct kvp_pool *p = pool_handle(self);

	(void)unused;
	return p ? PyLong_FromUnsignedLongLong(kvp_pool_page_bytes(p)) : NULL;
}

static PyObject *pool_get_row_bytes(PoolObject *self, void *unused)
{
	struct kvp_pool *p = pool_handle(self);

	(void)unused;
	return p ? PyLong_FromUnsignedLongLong(kvp_pool_row_bytes(p)) : NULL;
}

static PyObject *pool_get_pressure_notices(PoolObject *self, void *unused)
{
	struct kvp_pool *p = pool_handle(self);

	(void)unused;
	return p ? PyBool_FromLong(kvp_pool_pressure_notices(p)) : NULL;
}

static PyObject *pool_pressure_watermark(PoolObject *self, PyObject *arg)
{
	struct kvp_pool *p = pool_handle(self);
	int tier;

	if (!p || tier_from(arg, "tier", &tier))
		return NULL;
	return PyLong_FromUnsignedLongLong(kvp_pool_pressure_watermark(p, tier));
}

static PyObject *pool_tier_pages(PoolObject *self, PyObject *arg)
{
	struct kvp_pool *p = pool_handle(self);
	int tier;

	if (!p || tier_from(arg, "tier", &tier))
		return NULL;
	return PyLong_FromUnsignedLong(kvp_pool_tier_pages(p, tier));
}

static PyObject *pool_tier_bytes(PoolObject *self, PyObject *arg)
{
	struct kvp_pool *p = pool_handle(self);
	int tier;

	if (!p || tier_from(arg, "tier", &tier))
		return NULL;
	return PyLong_FromUnsignedLongLong(kvp_pool_tier_bytes(p, tier));
}

static PyObject *pool_tier_backend(PoolObject *self, PyObject *arg)
{
	struct kvp_pool *p = pool_handle(self);
	int tier;

	if (!p || tier_from(arg, "tier", &tier))
		return NULL;
	return PyUnicode_FromString(kvp_backend_name(kvp_pool_tier_backend(p, tier)));
}

static PyObject *pool_tier_cuda_device(PoolObject *self, PyObject *arg)
{
	struct kvp_pool *p = pool_handle(self);
	int tier;

	if (!p || tier_from(arg, "tier", &tier))
		return NULL;
	return PyLong_FromLong(kvp_pool_tier_cuda_device(p, tier));
}

static PyObject *pool_pages_for(PoolObject *self, PyObject *arg)
{
	struct kvp_pool *p = pool_handle(self);
	uint64_t tokens;

	if (!p || u64_arg(arg, "tokens", &tokens))
		return NULL;
	return PyLong_FromUnsignedLong(kvp_pool_pages_for(p, tokens));
}

static PyObject *pool_slot_address(PoolObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "tier", "layer", "kv", "page", "tok", NULL };
	PyObject *tier_o, *layer_o, *kv_o, *page_o, *tok_o = NULL;
	uint32_t layer, kv, page, tok = 0;
	struct kvp_pool *p = pool_handle(self);
	int tier;
	void *a;

	if (!p || !PyArg_ParseTupleAndKeywords(args, kw, "OOOO|O:slot_address", kwlist, &tier_o,
					       &layer_o, &kv_o, &page_o, &tok_o))
		return NULL;
	if (tier_from(tier_o, "tier", &tier) || u32_arg(layer_o, "layer", &layer) ||
	    u32_arg(kv_o, "kv", &kv) || u32_arg(page_o, "page", &page) ||
	    (tok_o && u32_arg(tok_o, "tok", &tok)))
		return NULL;
	a = kvp_pool_slot_addr(p, tier, layer, kv, page, tok);
	if (!a) {
		PyErr_SetString(PyExc_ValueError,
				"slot_address: out of range, or the tier is not mapped");
		return NULL;
	}
	return PyLong_FromVoidPtr(a);
}

static PyObject *lease_new(PoolObject *pool, int tier, uint64_t id, uint32_t *pages, uint32_t n)
{
	LeaseObject *l = (LeaseObject *)alloc_obj(g_lease_type);

	if (!l)
		return NULL;
	l->pool = (PoolObject *)Py_NewRef((PyObject *)pool);
	l->tier = tier;
	l->id = id;
	l->pages = pages;
	l->n = l->cap = n;
	return (PyObject *)l;
}

static PyObject *pool_alloc(PoolObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "npages", "tier", NULL };
	PyObject *n_o, *tier_o = NULL, *lease;
	struct kvp_pool *p = pool_handle(self);
	struct kvp_error err;
	uint64_t id = 0;
	uint32_t n, *pages;
	int tier = KVP_TIER_DEVICE, r;

	if (!p || !PyArg_ParseTupleAndKeywords(args, kw, "O|O:alloc", kwlist, &n_o, &tier_o))
		return NULL;
	if (u32_arg(n_o, "npages", &n) || (tier_o && tier_from(tier_o, "tier", &tier)))
		return NULL;
	pages = PyMem_Malloc(n ? (size_t)n * sizeof(uint32_t) : 1);
	if (!pages)
		return PyErr_NoMemory();
	if (!client_enter(self->client)) {
		PyMem_Free(pages);
		return NULL;
	}
	KVPY_WAIT(r = kvp_lease_alloc(p, tier, n, &id, pages, &err));
	client_leave(self->client);
	if (r < 0) {
		PyMem_Free(pages);
		return raise_kvp(&err);
	}
	lease = lease_new(self, tier, id, pages, n);
	if (!lease)
		PyMem_Free(pages);
	return lease;
}

static int u32_key_cmp(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return x < y ? -1 : x > y;
}

/* Drops pages[0 .. n) from the lease's page list (those the cache took or freed). */
static int lease_drop_pages(LeaseObject *l, const uint32_t *pages, uint32_t n)
{
	uint32_t *sorted, k = 0;

	if (!n)
		return 0;
	sorted = PyMem_Malloc((size_t)n * sizeof(uint32_t));
	if (!sorted) {
		PyErr_NoMemory();
		return -1;
	}
	memcpy(sorted, pages, (size_t)n * sizeof(uint32_t));
	qsort(sorted, n, sizeof(uint32_t), u32_key_cmp);
	for (uint32_t i = 0; i < l->n; i++)
		if (!bsearch(&l->pages[i], sorted, n, sizeof(uint32_t), u32_key_cmp))
			l->pages[k++] = l->pages[i];
	l->n = k;
	PyMem_Free(sorted);
	return 0;
}

/* Drops the first n pages the cache took or freed from the lease's page list: its head when
 * the call used the lease's own pages (own), else pages[0 .. n) wherever they stand. */
static int lease_drop_used(LeaseObject *l, int own, const uint32_t *pages, uint32_t n)
{
	if (!own)
		return lease_drop_pages(l, pages, n);
	memmove(l->pages, l->pages + n, (size_t)(l->n - n) * sizeof(uint32_t));
	l->n -= n;
	return 0;
}

/* The live kvpool.Lease of this Pool object that o is, or NULL with an exception set. */
static LeaseObject *lease_arg(PoolObject *self, PyObject *o)
{
	LeaseObject *l;

	if (!PyObject_TypeCheck(o, (PyTypeObject *)g_lease_type)) {
		PyErr_SetString(PyExc_TypeError, "lease must be a kvpool.Lease");
		return NULL;
	}
	l = (LeaseObject *)o;
	if (l->pool != self) {
		PyErr_SetString(PyExc_ValueError, "lease belongs to another Pool object");
		return NULL;
	}
	if (l->ended) {
		PyErr_SetString(PyExc_ValueError, "lease has ended");
		return NULL;
	}
	return l;
}

static PyObject *pool_insert(PoolObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "lease", "tokens", "cached_pages", "namespace", "pages", NULL };
	PyObject *lease_o, *tokens_o, *cp_o = NULL, *ns_o = NULL, *pages_o = Py_None;
	struct kvp_pool *p = pool_handle(self);
	struct u32list tokens, pages = { 0 };
	const uint32_t *pv;
	uint32_t cached = 0, npages, whole;
	uint64_t ns = 0, new_tokens = 0;
	struct kvp_error err;
	LeaseObject *l;
	int r;

	if (!p || !PyArg_ParseTupleAndKeywords(args, kw, "OO|OOO:insert", kwlist, &lease_o,
					       &tokens_o, &cp_o, &ns_o, &pages_o))
		return NULL;
	l = lease_arg(self, lease_o);
	if (!l)
		return NULL;
	if ((cp_o && u32_arg(cp_o, "cached_pages", &cached)) ||
	    (ns_o && u64_arg(ns_o, "namespace", &ns)))
		return NULL;
	if (u32list_from(tokens_o, "tokens", &tokens))
		return NULL;
	if (pages_o != Py_None) {
		if (u32list_from(pages_o, "pages", &pages)) {
			u32list_done(&tokens);
			return NULL;
		}
		pv = pages.v;
		npages = (uint32_t)pages.n;
	} else {
		/* the lease's pages, as many as the tokens past the cached pages need */
		uint32_t need = kvp_pool_pages_for(p, (uint64_t)tokens.n);

		need = need > cached ? need - cached : 0;
		pv = l->pages;
		npages = need < l->n ? need : l->n;
	}
	if (!client_enter(self->client)) {
		u32list_done(&tokens);
		u32list_done(&pages);
		return NULL;
	}
	KVPY_WAIT(r = kvp_cache_insert(p, l->id, ns, tokens.v, (uint32_t)tokens.n, cached, pv,
				       npages, &new_tokens, &err));
	client_leave(self->client);
	if (r == 0) {
		/* whole pages left the lease (cached, or freed as duplicates); the tail stays */
		whole = (uint32_t)((uint64_t)tokens.n / self->g.page_tokens);
		whole = whole > cached ? whole - cached : 0;
		if (whole > npages)
			whole = npages;
		if (lease_drop_used(l, pages_o == Py_None, pv, whole))
			r = 1; /* out of memory, set */
	}
	u32list_done(&tokens);
	u32list_done(&pages);
	if (r > 0)
		return NULL;
	if (r < 0)
		return raise_kvp(&err);
	return PyLong_FromUnsignedLongLong(new_tokens);
}

/* The device and host page lists of a match of at most cap pages: 0, or -1 with both NULL and
 * MemoryError set. */
static int match_bufs(uint32_t cap, uint32_t **dev, uint32_t **host)
{
	*dev = PyMem_Malloc((size_t)cap * sizeof(uint32_t));
	*host = PyMem_Malloc((size_t)cap * sizeof(uint32_t));
	if (*dev && *host)
		return 0;
	PyMem_Free(*dev);
	PyMem_Free(*host);
	*dev = *host = NULL;
	PyErr_NoMemory();
	return -1;
}

/* A kvpool.Match of a cache match: it takes dev and host (freed here when it cannot be made,
 * and the match's lock released). */
static PyObject *match_new(PoolObject *self, struct kvp_pool *p, uint64_t tokens, uint64_t lock_id,
			   uint32_t *dev, uint32_t *host, uint32_t n_device, uint32_t n_host)
{
	MatchObject *mo = (MatchObject *)alloc_obj(g_match_type);

	if (!mo) {
		if (lock_id && client_enter(self->client)) {
			KVPY_WAIT(kvp_cache_release(p, lock_id, NULL));
			client_leave(self->client);
		}
		PyMem_Free(dev);
		PyMem_Free(host);
		return NULL;
	}
	mo->pool = (PoolObject *)Py_NewRef((PyObject *)self);
	mo->tokens = tokens;
	mo->lock_id = lock_id;
	mo->device_pages = dev;
	mo->host_pages = host;
	mo->n_device = n_device;
	mo->n_host = n_host;
	return (PyObject *)mo;
}

static PyObject *pool_match(PoolObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "tokens", "namespace", "lock", "local_only", NULL };
	PyObject *tokens_o, *ns_o = NULL, *mo;
	struct kvp_pool *p = pool_handle(self);
	struct u32list tokens;
	struct kvp_match_result m = { .struct_size = sizeof(m) };
	struct kvp_error err;
	uint32_t *dev, *host, cap;
	uint64_t ns = 0;
	int lock = 1, local_only = 0, r;

	if (!p || !PyArg_ParseTupleAndKeywords(args, kw, "O|Opp:match", kwlist, &tokens_o, &ns_o,
					       &lock, &local_only))
		return NULL;
	if (ns_o && u64_arg(ns_o, "namespace", &ns))
		return NULL;
	if (u32list_from(tokens_o, "tokens", &tokens))
		return NULL;
	cap = (uint32_t)((uint64_t)tokens.n / self->g.page_tokens) + 1;
	if (match_bufs(cap, &dev, &host)) {
		u32list_done(&tokens);
		return NULL;
	}
	if (!client_enter(self->client)) {
		r = -1;
	} else {
		KVPY_WAIT(r = kvp_cache_match(p, ns, tokens.v, (uint32_t)tokens.n,
					      lock | (local_only ? KVP_MATCH_LOCAL_ONLY : 0), &m,
					      dev, host, cap, &err));
		client_leave(self->client);
		if (r < 0)
			raise_kvp(&err);
	}
	u32list_done(&tokens);
	if (r < 0)
		goto fail;
	mo = match_new(self, p, m.matched_tokens, m.lock_id, dev, host, m.n_device, m.n_host);
	if (mo)
		((MatchObject *)mo)->remote_pages = m.remote_pages;
	return mo;
fail:
	PyMem_Free(dev);
	PyMem_Free(host);
	return NULL;
}

static PyObject *view_new(PoolObject *pool, int tier, void *data, int ndim,
			  const Py_ssize_t *shape);

static PyObject *pool_kv(PoolObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "tier", "layer", "kv", NULL };
	PyObject *tier_o, *layer_o, *kv_o;
	uint32_t layer, kv;
	struct kvp_pool *p = pool_handle(self);
	Py_ssize_t shape[3];
	void *a;
	int tier;

	if (!p ||
	    !PyArg_ParseTupleAndKeywords(args, kw, "OOO:kv", kwlist, &tier_o, &layer_o, &kv_o))
		return NULL;
	if (tier_from(tier_o, "tier", &tier) || u32_arg(layer_o, "layer", &layer) ||
	    u32_arg(kv_o, "kv", &kv))
		return NULL;
	if (tier != KVP_TIER_DEVICE) {
		PyErr_SetString(PyExc_ValueError, "kv(): the host tier is page-first, not a plane "
						  "per layer: use host_pages_view()");
		return NULL;
	}
	if (layer >= self->g.layers || kv > 1) {
		PyErr_Format(PyExc_ValueError, "kv(): layer must be < %u and kv 0 (K) or 1 (V)",
			     self->g.layers);
		return NULL;
	}
	if (!kvp_pool_tier_pages(p, tier)) {
		PyErr_SetString(PyExc_ValueError, "kv(): the pool has no device tier");
		return NULL;
	}
	a = kvp_pool_slot_addr(p, tier, layer, kv, 0, 0);
	if (!a) {
		PyErr_SetString(PyExc_ValueError,
				"kv(): the device tier is not mapped in this process (a cuda tier "
				"needs libkvpool built with CUDA)");
		return NULL;
	}
	shape[0] = (Py_ssize_t)kvp_pool_tier_pages(p, tier) * self->g.page_tokens;
	shape[1] = self->g.kv_heads;
	shape[2] = self->g.head_dim;
	return view_new(self, tier, a, 3, shape);
}

static PyObject *pool_host_pages_view(PoolObject *self, PyObject *unused)
{
	struct kvp_pool *p = pool_handle(self);
	Py_ssize_t shape[6];
	void *a;

	(void)unused;
	if (!p)
		return NULL;
	a = kvp_pool_tier_base(p, KVP_TIER_HOST);
	if (!a || !kvp_pool_tier_pages(p, KVP_TIER_HOST)) {
		PyErr_SetString(PyExc_ValueError,
				"host_pages_view(): the pool has no mapped host tier");
		return NULL;
	}
	shape[0] = kvp_pool_tier_pages(p, KVP_TIER_HOST);
	shape[1] = self->g.layers;
	shape[2] = 2;
	shape[3] = self->g.page_tokens;
	shape[4] = self->g.kv_heads;
	shape[5] = self->g.head_dim;
	return view_new(self, KVP_TIER_HOST, a, 6, shape);
}

/* hash-keyed pages: defined in their block near the end of the file */
static PyObject *pool_insert_keys(PoolObject *self, PyObject *args, PyObject *kw);
static PyObject *pool_match_keys(PoolObject *self, PyObject *args, PyObject *kw);
static PyObject *pool_exists_keys(PoolObject *self, PyObject *args, PyObject *kw);
static PyObject *pool_fetch(PoolObject *self, PyObject *args, PyObject *kw);
static PyObject *pool_fetch_keys(PoolObject *self, PyObject *args, PyObject *kw);

static PyMethodDef pool_methods[] = {
	{ "detach", (PyCFunction)pool_detach, METH_NOARGS,
	  "detach()\n--\n\nDetaches: the session's leases in this pool are freed and its locks "
	  "released at once. Views taken from it keep their memory mapped until they go." },
	{ "tier_pages", (PyCFunction)pool_tier_pages, METH_O,
	  "tier_pages(tier)\n--\n\nPages in the tier ('device' or 'host'); 0 when absent." },
	{ "tier_bytes", (PyCFunction)pool_tier_bytes, METH_O,
	  "tier_bytes(tier)\n--\n\nBytes of the tier's mapping." },
	{ "tier_backend", (PyCFunction)pool_tier_backend, METH_O,
	  "tier_backend(tier)\n--\n\nThe tier's backend: 'sim', 'cuda', 'memfd' or 'none'." },
	{ "tier_cuda_device", (PyCFunction)pool_tier_cuda_device, METH_O,
	  "tier_cuda_device(tier)\n--\n\nThis process's CUDA device number of a cuda tier, -1 "
	  "for others." },
	{ "pressure_watermark", (PyCFunction)pool_pressure_watermark, METH_O,
	  "pressure_watermark(tier)\n--\n\nThe tier's pressure watermark in tokens as the daemon "
	  "said at attach (0: none)." },
	{ "pages_for", (PyCFunction)pool_pages_for, METH_O,
	  "pages_for(tokens)\n--\n\nPages needed for `tokens` tokens." },
	{ "slot_address", (PyCFunction)(void (*)(void))pool_slot_address,
	  METH_VARARGS | METH_KEYWORDS,
	  "slot_address(tier, layer, kv, page, tok=0)\n--\n\nThe address of one row (K: kv=0, V: "
	  "kv=1) in this process, as kvp_pool_slot_addr gives it." },
	{ "alloc", (PyCFunction)(void (*)(void))pool_alloc, METH_VARARGS | METH_KEYWORDS,
	  "alloc(npages, tier='device')\n--\n\nLeases `npages` pages, evicting cold prefixes when "
	  "free pages are short. Returns a Lease; OutOfCapacity says why when it cannot." },
	{ "insert", (PyCFunction)(void (*)(void))pool_insert, METH_VARARGS | METH_KEYWORDS,
	  "insert(lease, tokens, cached_pages=0, namespace=0, pages=None)\n--\n\nPublishes "
	  "`tokens`: the first `cached_pages` whole pages are ones matched earlier, the lease's "
	  "pages (or `pages`) hold the rest in order. Whole pages move into the cache, the tail "
	  "stays in the lease. The pages' writes must be complete. Returns the newly cached "
	  "tokens." },
	{ "match", (PyCFunction)(void (*)(void))pool_match, METH_VARARGS | METH_KEYWORDS,
	  "match(tokens, namespace=0, lock=True, local_only=False)\n--\n\nThe longest cached "
	  "prefix of `tokens`, locked against eviction when `lock`. Returns a Match; its "
	  "remote_pages counts the pages after it that kvpoold's remote tier holds (fetch() brings "
	  "them), unless `local_only`, which asks the remote tier nothing (remote_pages 0)." },
	{ "fetch", (PyCFunction)(void (*)(void))pool_fetch, METH_VARARGS | METH_KEYWORDS,
	  "fetch(tokens, namespace=0, lock=True)\n--\n\nBrings the pages of `tokens` after the "
	  "locally cached ones that kvpoold's remote tier holds into host pages and the cache, then "
	  "answers as match() does: a Match (locked when `lock`) whose fetched_pages were read now "
	  "and missed_pages asked for and not had (a miss, a fault or a bad value: never an error). "
	  "Raises Unavailable when kvpoold has no remote tier built in." },
	{ "kv", (PyCFunction)(void (*)(void))pool_kv, METH_VARARGS | METH_KEYWORDS,
	  "kv(tier, layer, kv)\n--\n\nA zero-copy View of one layer's K (kv=0) or V (kv=1) plane "
	  "of the device tier: shape [slots, kv_heads, head_dim], slot = page * page_tokens + "
	  "offset." },
	{ "host_pages_view", (PyCFunction)pool_host_pages_view, METH_NOARGS,
	  "host_pages_view()\n--\n\nA zero-copy View of the host tier: shape [pages, layers, 2, "
	  "page_tokens, kv_heads, head_dim]." },
	{ "insert_keys", (PyCFunction)(void (*)(void))pool_insert_keys,
	  METH_VARARGS | METH_KEYWORDS,
	  "insert_keys(lease, keys, cached_keys=0, namespace=0, pages=None)\n--\n\nPublishes the "
	  "chain `keys` (a sequence of bytes, 1 to 64 bytes each) in a hash-keyed namespace: the "
	  "first `cached_keys` are ones matched earlier, the lease's pages (or `pages`) hold the "
	  "rest in order. Returns a dict: new_pages, dup_pages, done_keys, lease_pages." },
	{ "match_keys", (PyCFunction)(void (*)(void))pool_match_keys, METH_VARARGS | METH_KEYWORDS,
	  "match_keys(keys, namespace=0, lock=True, local_only=False)\n--\n\nThe longest leading run of `keys` "
	  "cached, locked against eviction when `lock`. Returns a Match (tokens = matched pages "
	  "* page_tokens); remote_pages and `local_only` as in match()." },
	{ "fetch_keys", (PyCFunction)(void (*)(void))pool_fetch_keys, METH_VARARGS | METH_KEYWORDS,
	  "fetch_keys(keys, namespace=0, lock=True)\n--\n\nfetch() for a hash-keyed namespace: "
	  "brings the keys after the locally cached ones that the remote tier holds, then answers "
	  "as match_keys() does (a Match with fetched_pages and missed_pages)." },
	{ "exists_keys", (PyCFunction)(void (*)(void))pool_exists_keys,
	  METH_VARARGS | METH_KEYWORDS,
	  "exists_keys(keys, namespace=0)\n--\n\nThe count of leading `keys` cached (no lock)." },
	{ "__enter__", client_enter_ctx, METH_NOARGS, "Returns the pool." },
	{ "__exit__", (PyCFunction)pool_exit_ctx, METH_VARARGS, "Detaches the pool." },
	{ NULL, NULL, 0, NULL }
};

static PyGetSetDef pool_getset[] = {
	{ "geometry", (getter)pool_get_geometry, NULL,
	  "The pool's Geometry (layers, kv_heads, head_dim, dtype, page_tokens).", NULL },
	{ "name", (getter)pool_get_name, NULL, "The pool's name.", NULL },
	{ "id", (getter)pool_get_id, NULL, "The daemon's id of the pool.", NULL },
	{ "client", (getter)pool_get_client, NULL, "The Client this pool was attached through.",
	  NULL },
	{ "detached", (getter)pool_get_detached, NULL, "Whether detach() was called.", NULL },
	{ "page_bytes", (getter)pool_get_page_bytes, NULL,
	  "Bytes of one page in the host layout (all layers, K and V).", NULL },
	{ "row_bytes", (getter)pool_get_row_bytes, NULL,
	  "Bytes of one token of one layer of K (or V).", NULL },
	{ "pressure_notices", (getter)pool_get_pressure_notices, NULL,
	  "Whether the daemon sends pressure notices for this pool.", NULL },
	{ NULL, NULL, NULL, NULL, NULL }
};

static PyType_Slot pool_slots[] = {
	{ Py_tp_doc, "A pool attached through a Client (Client.attach makes one)." },
	{ Py_tp_dealloc, pool_dealloc },
	{ Py_tp_methods, pool_methods },
	{ Py_tp_getset, pool_getset },
	{ 0, NULL }
};

static PyType_Spec pool_spec = { "kvpool.Pool", sizeof(PoolObject), 0,
				 Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
				 pool_slots };

/* ---- Lease ---- */
static void lease_dealloc(LeaseObject *self)
{
	struct kvp_pool *p = self->pool->p;
	ClientObject *c = self->pool->client;

	/* an unreleased lease goes back now when the client can take a call */
	if (!self->ended && p && !self->pool->detached && c->c && !c->closed && !c->busy) {
		c->busy = 1;
		KVPY_WAIT(kvp_lease_free(p, self->id, NULL, 0, NULL));
		c->busy = 0;
	}
	PyMem_Free(self->pages);
	Py_XDECREF((PyObject *)self->pool);
	free_obj((PyObject *)self);
}

static PyObject *lease_get_pages(LeaseObject *self, void *unused)
{
	(void)unused;
	return pages_out(self->pages, self->n);
}

static PyObject *lease_get_id(LeaseObject *self, void *unused)
{
	(void)unused;
	return PyLong_FromUnsignedLongLong(self->id);
}

static PyObject *lease_get_tier(LeaseObject *self, void *unused)
{
	(void)unused;
	return PyUnicode_FromString(kvp_tier_name(self->tier));
}

static PyObject *lease_get_ended(LeaseObject *self, void *unused)
{
	(void)unused;
	return PyBool_FromLong(self->ended);
}

static int lease_live(LeaseObject *self)
{
	if (self->ended) {
		PyErr_SetString(PyExc_ValueError, "the lease has ended");
		return 0;
	}
	return 1;
}

static PyObject *lease_extend(LeaseObject *self, PyObject *arg)
{
	struct kvp_pool *p = pool_handle(self->pool);
	struct kvp_error err;
	uint32_t n, *np;
	int r;

	if (!p || !lease_live(self) || u32_arg(arg, "npages", &n))
		return NULL;
	if ((uint64_t)self->n + n > UINT32_MAX) {
		PyErr_SetString(PyExc_ValueError, "npages: the lease would exceed 2^32 pages");
		return NULL;
	}
	if (self->n + n > self->cap) {
		uint32_t cap = self->n + n;

		np = PyMem_Realloc(self->pages, (size_t)cap * sizeof(uint32_t) + 1);
		if (!np)
			return PyErr_NoMemory();
		self->pages = np;
		self->cap = cap;
	}
	if (!client_enter(self->pool->client))
		return NULL;
	KVPY_WAIT(r = kvp_lease_extend(p, self->id, n, self->pages + self->n, &err));
	client_leave(self->pool->client);
	if (r < 0)
		return raise_kvp(&err);
	self->n += n;
	return pages_out(self->pages + self->n - n, n);
}

static PyObject *lease_free(LeaseObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "pages", NULL };
	PyObject *pages_o = Py_None;
	struct kvp_pool *p;
	struct u32list pages = { 0 };
	struct kvp_error err;
	int r;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:free", kwlist, &pages_o))
		return NULL;
	if (self->ended)
		return PyLong_FromLong(0);
	p = self->pool->p;
	if (!p || self->pool->detached || !self->pool->client->c || self->pool->client->closed) {
		/* the lease went (or goes, with the last view) with the pool or the session */
		self->ended = 1;
		self->n = 0;
		return PyLong_FromLong(0);
	}
	if (pages_o != Py_None) {
		if (u32list_from(pages_o, "pages", &pages))
			return NULL;
		if (pages.n == 0) {
			u32list_done(&pages);
			return PyLong_FromUnsignedLong(self->n);
		}
	}
	if (!client_enter(self->pool->client)) {
		u32list_done(&pages);
		return NULL;
	}
	KVPY_WAIT(r = kvp_lease_free(p, self->id, pages.v, (uint32_t)pages.n, &err));
	client_leave(self->pool->client);
	if (r >= 0) {
		if (pages_o == Py_None || r == 0) {
			self->ended = 1;
			self->n = 0;
		} else {
			uint32_t k = 0;

			for (uint32_t i = 0; i < self->n; i++) {
				int gone = 0;

				for (Py_ssize_t j = 0; j < pages.n && !gone; j++)
					gone = pages.v[j] == self->pages[i];
				if (!gone)
					self->pages[k++] = self->pages[i];
			}
			self->n = k;
		}
	}
	u32list_done(&pages);
	if (r < 0)
		return raise_kvp(&err);
	return PyLong_FromLong(r);
}

static PyObject *lease_exit_ctx(LeaseObject *self, PyObject *args)
{
	PyObject *r, *empty;

	(void)args;
	if (self->ended || !self->pool->p || self->pool->detached || !self->pool->client->c ||
	    self->pool->client->closed)
		Py_RETURN_NONE; /* the daemon took the lease back with the pool or the session */
	empty = PyTuple_New(0);
	if (!empty)
		return NULL;
	r = lease_free(self, empty, NULL);
	Py_DECREF(empty);
	if (!r)
		return NULL;
	Py_DECREF(r);
	Py_RETURN_NONE;
}

static PyMethodDef lease_methods[] = {
	{ "extend", (PyCFunction)lease_extend, METH_O,
	  "extend(npages)\n--\n\nAdds `npages` pages to the lease; returns the new page ids." },
	{ "free", (PyCFunction)(void (*)(void))lease_free, METH_VARARGS | METH_KEYWORDS,
	  "free(pages=None)\n--\n\nReturns `pages` of the lease (None: all of them, and the lease "
	  "ends). Returns the pages left. After Pool.detach() or Client.close() the lease has "
	  "gone with them: it ends and 0 is returned." },
	{ "__enter__", client_enter_ctx, METH_NOARGS, "Returns the lease." },
	{ "__exit__", (PyCFunction)lease_exit_ctx, METH_VARARGS, "Frees the whole lease." },
	{ NULL, NULL, 0, NULL }
};

static PyGetSetDef lease_getset[] = {
	{ "id", (getter)lease_get_id, NULL, "The daemon's lease id.", NULL },
	{ "pages", (getter)lease_get_pages, NULL, "The lease's page ids, in order.", NULL },
	{ "tier", (getter)lease_get_tier, NULL, "The tier the pages are in.", NULL },
	{ "ended", (getter)lease_get_ended, NULL, "Whether the lease was freed whole.", NULL },
	{ NULL, NULL, NULL, NULL, NULL }
};

static PyType_Slot lease_slots[] = {
	{ Py_tp_doc, "Pages leased from a pool (Pool.alloc makes one); the context manager frees "
		     "them." },
	{ Py_tp_dealloc, lease_dealloc },
	{ Py_tp_methods, lease_methods },
	{ Py_tp_getset, lease_getset },
	{ 0, NULL }
};

static PyType_Spec lease_spec = { "kvpool.Lease", sizeof(LeaseObject), 0,
				  Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
				  lease_slots };

/* ---- Match ---- */
static void match_dealloc(MatchObject *self)
{
	struct kvp_pool *p = self->pool->p;
	ClientObject *c = self->pool->client;

	if (self->lock_id && p && !self->pool->detached && c->c && !c->closed && !c->busy) {
		c->busy = 1;
		KVPY_WAIT(kvp_cache_release(p, self->lock_id, NULL));
		c->busy = 0;
	}
	PyMem_Free(self->device_pages);
	PyMem_Free(self->host_pages);
	Py_XDECREF((PyObject *)self->pool);
	free_obj((PyObject *)self);
}

static PyObject *match_release(MatchObject *self, PyObject *unused)
{
	struct kvp_pool *p;
	struct kvp_error err;
	int r;

	(void)unused;
	if (!self->lock_id)
		Py_RETURN_NONE;
	p = self->pool->p;
	if (!p || self->pool->detached || !self->pool->client->c || self->pool->client->closed) {
		self->lock_id = 0; /* went with the pool or the session */
		Py_RETURN_NONE;
	}
	if (!client_enter(self->pool->client))
		return NULL;
	KVPY_WAIT(r = kvp_cache_release(p, self->lock_id, &err));
	client_leave(self->pool->client);
	if (r < 0)
		return raise_kvp(&err);
	self->lock_id = 0;
	Py_RETURN_NONE;
}

static PyObject *match_load(MatchObject *self, PyObject *unused)
{
	struct kvp_pool *p = pool_handle(self->pool);
	struct kvp_error err;
	uint32_t cap = self->n_device + self->n_host, *dev;
	int r;

	(void)unused;
	if (!p)
		return NULL;
	if (!self->lock_id) {
		PyErr_SetString(PyExc_ValueError, "load() needs a locked match (lock=True)");
		return NULL;
	}
	dev = PyMem_Malloc((size_t)cap * sizeof(uint32_t) + 1);
	if (!dev)
		return PyErr_NoMemory();
	if (!client_enter(self->pool->client)) {
		PyMem_Free(dev);
		return NULL;
	}
	KVPY_WAIT(r = kvp_cache_load(p, self->lock_id, dev, cap, &err));
	client_leave(self->pool->client);
	if (r < 0) {
		PyMem_Free(dev);
		return raise_kvp(&err);
	}
	PyMem_Free(self->device_pages);
	self->device_pages = dev;
	self->n_device = (uint32_t)r;
	self->n_host = 0;
	return pages_out(dev, (size_t)r);
}

static PyObject *match_exit_ctx(MatchObject *self, PyObject *args)
{
	(void)args;
	return match_release(self, NULL);
}

static PyObject *match_get_tokens(MatchObject *self, void *unused)
{
	(void)unused;
	return PyLong_FromUnsignedLongLong(self->tokens);
}

static PyObject *match_get_lock_id(MatchObject *self, void *unused)
{
	(void)unused;
	return PyLong_FromUnsignedLongLong(self->lock_id);
}

static PyObject *match_get_device_pages(MatchObject *self, void *unused)
{
	(void)unused;
	return pages_out(self->device_pages, self->n_device);
}

static PyObject *match_get_host_pages(MatchObject *self, void *unused)
{
	(void)unused;
	return pages_out(self->host_pages, self->n_host);
}

static PyObject *match_get_remote_pages(MatchObject *self, void *unused)
{
	(void)unused;
	return PyLong_FromUnsignedLong(self->remote_pages);
}

static PyObject *match_get_fetched_pages(MatchObject *self, void *unused)
{
	(void)unused;
	return PyLong_FromUnsignedLong(self->fetched_pages);
}

static PyObject *match_get_missed_pages(MatchObject *self, void *unused)
{
	(void)unused;
	return PyLong_FromUnsignedLong(self->missed_pages);
}

static PyMethodDef match_methods[] = {
	{ "load", (PyCFunction)match_load, METH_NOARGS,
	  "load()\n--\n\nPromotes the host-only pages of the locked match to device pages and "
	  "returns the device page ids of the whole path (device_pages then holds them, "
	  "host_pages is empty). Unavailable when another session's lock pins the host pages." },
	{ "release", (PyCFunction)match_release, METH_NOARGS,
	  "release()\n--\n\nReleases the lock (no-op when not locked or already released)." },
	{ "__enter__", client_enter_ctx, METH_NOARGS, "Returns the match." },
	{ "__exit__", (PyCFunction)match_exit_ctx, METH_VARARGS, "Releases the lock." },
	{ NULL, NULL, 0, NULL }
};

static PyGetSetDef match_getset[] = {
	{ "tokens", (getter)match_get_tokens, NULL, "Matched tokens (whole pages).", NULL },
	{ "lock_id", (getter)match_get_lock_id, NULL, "The lock's id, 0 when not locked.", NULL },
	{ "device_pages", (getter)match_get_device_pages, NULL,
	  "Leading device-resident pages of the match.", NULL },
	{ "host_pages", (getter)match_get_host_pages, NULL,
	  "Host-only continuation after device_pages.", NULL },
	{ "remote_pages", (getter)match_get_remote_pages, NULL,
	  "match(): pages after the matched ones that the remote tier holds (0 without one, or "
	  "with local_only).",
	  NULL },
	{ "fetched_pages", (getter)match_get_fetched_pages, NULL,
	  "fetch(): pages read from the remote tier and cached by that call.", NULL },
	{ "missed_pages", (getter)match_get_missed_pages, NULL,
	  "fetch(): pages asked for and not had (a miss, a fault or a bad value).", NULL },
	{ NULL, NULL, NULL, NULL, NULL }
};

static PyType_Slot match_slots[] = {
	{ Py_tp_doc, "A matched cached prefix (Pool.match makes one); the context manager "
		     "releases its lock." },
	{ Py_tp_dealloc, match_dealloc },
	{ Py_tp_methods, match_methods },
	{ Py_tp_getset, match_getset },
	{ 0, NULL }
};

static PyType_Spec match_spec = { "kvpool.Match", sizeof(MatchObject), 0,
				  Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
				  match_slots };

/* ---- View ---- */
static PyObject *view_new(PoolObject *pool, int tier, void *data, int ndim, const Py_ssize_t *shape)
{
	ViewObject *v = (ViewObject *)alloc_obj(g_view_type);
	int dt = (int)pool->g.dtype;
	Py_ssize_t st;

	if (!v)
		return NULL;
	v->pool_name = Py_NewRef(pool->name);
	v->map = mapping_hold(pool->p, tier);
	if (!v->map) {
		Py_DECREF((PyObject *)v);
		PyErr_SetString(PyExc_ValueError, "the tier is not mapped in this process");
		return NULL;
	}
	v->data = data;
	v->tier = tier;
	v->ndim = ndim;
	v->dtype = dt;
	v->itemsize = dt > 0 && dt < KVP_DTYPE_MAX ? g_dtype_bytes[dt] : 1;
	if (kvp_pool_tier_backend(pool->p, tier) == KVP_BACKEND_CUDA) {
		v->device.device_type = kDLCUDA;
		v->device.device_id = kvp_pool_tier_cuda_device(pool->p, tier);
	} else {
		v->device.device_type = kDLCPU;
		v->device.device_id = 0;
	}
	st = v->itemsize;
	for (int i = ndim - 1; i >= 0; i--) {
		v->shape[i] = shape[i];
		v->strides[i] = st;
		st *= shape[i];
	}
	v->nbytes = st;
	return (PyObject *)v;
}

static void view_dealloc(ViewObject *self)
{
	mapping_drop(self->map);
	Py_XDECREF(self->pool_name);
	free_obj((PyObject *)self);
}

/* What a capsule's tensor owns: the tensor, its shape and strides, and a view reference. */
struct kvpy_export {
	union {
		DLManagedTensor u;
		DLManagedTensorVersioned v;
	} t;
	int64_t shape[KVPY_MAX_DIMS], strides[KVPY_MAX_DIMS];
	PyObject *owner;
};

static void export_release(struct kvpy_export *x)
{
	PyGILState_STATE s;

	if (!Py_IsInitialized())
		return; /* the interpreter is gone: leave the memory to the process's end */
	s = PyGILState_Ensure();
	Py_XDECREF(x->owner);
	free(x);
	PyGILState_Release(s);
}

static void deleter_unversioned(DLManagedTensor *m)
{
	export_release(m->manager_ctx);
}

static void deleter_versioned(DLManagedTensorVersioned *m)
{
	export_release(m->manager_ctx);
}

static void capsule_free_unversioned(PyObject *cap)
{
	PyObject *t, *v, *tb;
	DLManagedTensor *m;

	if (PyCapsule_IsValid(cap, "used_dltensor"))
		return;
	PyErr_Fetch(&t, &v, &tb);
	m = PyCapsule_GetPointer(cap, "dltensor");
	if (m && m->deleter)
		m->deleter(m);
	else if (!m)
		PyErr_WriteUnraisable(cap);
	PyErr_Restore(t, v, tb);
}

static void capsule_free_versioned(PyObject *cap)
{
	PyObject *t, *v, *tb;
	DLManagedTensorVersioned *m;

	if (PyCapsule_IsValid(cap, "used_dltensor_versioned"))
		return;
	PyErr_Fetch(&t, &v, &tb);
	m = PyCapsule_GetPointer(cap, "dltensor_versioned");
	if (m && m->deleter)
		m->deleter(m);
	else if (!m)
		PyErr_WriteUnraisable(cap);
	PyErr_Restore(t, v, tb);
}

static DLDataType view_dl_dtype(const ViewObject *self, int fp8_code)
{
	DLDataType d = { kDLUInt, 8, 1 };

	switch (self->dtype) {
	case KVP_DTYPE_FP16: d.code = kDLFloat, d.bits = 16; break;
	case KVP_DTYPE_BF16: d.code = kDLBfloat, d.bits = 16; break;
	case KVP_DTYPE_FP32: d.code = kDLFloat, d.bits = 32; break;
	case KVP_DTYPE_FP8: d.code = (uint8_t)fp8_code, d.bits = 8; break;
	}
	return d;
}

/* Parses a (major, minor) tuple; -1 with an exception on a malformed one. */
static int parse_version(PyObject *o, long *major, long *minor)
{
	if (!PyTuple_Check(o) || PyTuple_Size(o) != 2) {
		PyErr_SetString(PyExc_TypeError, "max_version must be a (major, minor) tuple");
		return -1;
	}
	*major = PyLong_AsLong(PyTuple_GetItem(o, 0));
	*minor = PyLong_AsLong(PyTuple_GetItem(o, 1));
	return PyErr_Occurred() ? -1 : 0;
}

static PyObject *view_dlpack(ViewObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "stream", "max_version", "dl_device", "copy", NULL };
	PyObject *stream = Py_None, *max_version = Py_None, *dl_device = Py_None, *copy = Py_None;
	struct kvpy_export *x;
	long major = 0, minor = 0;
	DLTensor *t;
	PyObject *cap;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|$OOOO:__dlpack__", kwlist, &stream,
					 &max_version, &dl_device, &copy))
		return NULL;
	(void)stream; /* the pages have no pending work on any stream of ours */
	if (max_version != Py_None && parse_version(max_version, &major, &minor))
		return NULL;
	if (copy == Py_True) {
		PyErr_SetString(PyExc_BufferError, "kvpool views are zero-copy: copy=True refused");
		return NULL;
	}
	if (dl_device != Py_None) {
		long dt, id;

		if (parse_version(dl_device, &dt, &id)) {
			PyErr_Clear();
			PyErr_SetString(PyExc_TypeError, "dl_device must be a (type, id) tuple");
			return NULL;
		}
		if (dt != self->device.device_type || id != self->device.device_id) {
			PyErr_SetString(PyExc_BufferError,
					"dl_device differs from the view's device (no copies)");
			return NULL;
		}
	}
	x = calloc(1, sizeof(*x));
	if (!x)
		return PyErr_NoMemory();
	for (int i = 0; i < self->ndim; i++) {
		x->shape[i] = self->shape[i];
		x->strides[i] = self->strides[i] / self->itemsize;
	}
	x->owner = Py_NewRef((PyObject *)self);
	if (major >= 1) {
		t = &x->t.v.dl_tensor;
		x->t.v.version.major = 1;
		/* 1.1 (fp8 codes) for any consumer that reads 1.1 or a later version */
		x->t.v.version.minor = major > 1 || minor >= 1 ? 1 : 0;
		x->t.v.manager_ctx = x;
		x->t.v.deleter = deleter_versioned;
		x->t.v.flags = 0;
		t->dtype = view_dl_dtype(self, x->t.v.version.minor ? kDLFloat8_e4m3fn : kDLUInt);
	} else {
		t = &x->t.u.dl_tensor;
		x->t.u.manager_ctx = x;
		x->t.u.deleter = deleter_unversioned;
		t->dtype = view_dl_dtype(self, kDLUInt);
	}
	t->data = self->data;
	t->device = self->device;
	t->ndim = self->ndim;
	t->shape = x->shape;
	t->strides = x->strides;
	t->byte_offset = 0;
	if (major >= 1)
		cap = PyCapsule_New(&x->t.v, "dltensor_versioned", capsule_free_versioned);
	else
		cap = PyCapsule_New(&x->t.u, "dltensor", capsule_free_unversioned);
	if (!cap) {
		Py_DECREF(x->owner);
		free(x);
	}
	return cap;
}

static PyObject *view_dlpack_device(ViewObject *self, PyObject *unused)
{
	(void)unused;
	return Py_BuildValue("(ii)", self->device.device_type, self->device.device_id);
}

static const char *view_format(const ViewObject *self)
{
	switch (self->dtype) {
	case KVP_DTYPE_FP16: return "e";
	case KVP_DTYPE_FP32: return "f";
	case KVP_DTYPE_BF16: return "H"; /* no struct code for bf16: raw 16-bit words */
	default: return "B";		 /* fp8: raw bytes */
	}
}

static int view_c_contiguous(const ViewObject *self)
{
	Py_ssize_t want = self->itemsize;

	for (int i = self->ndim - 1; i >= 0; i--) {
		if (self->shape[i] > 1 && self->strides[i] != want)
			return 0;
		want *= self->shape[i];
	}
	return 1;
}

/* The buffer protocol: the view's shape and strides when asked for (PyBUF_STRIDES); without
 * PyBUF_ND (bytes(), hashlib) the flat bytes, itemsize 1, format "B"; a request that cannot
 * take strides gets the view only when it is C-contiguous, else BufferError. */
static int view_getbuffer(ViewObject *self, Py_buffer *b, int flags)
{
	int nd = (flags & PyBUF_ND) == PyBUF_ND;

	b->obj = NULL;
	if (self->device.device_type != kDLCPU) {
		PyErr_SetString(PyExc_BufferError,
				"the view is in GPU memory: use __dlpack__ (torch.from_dlpack)");
		return -1;
	}
	if ((flags & PyBUF_STRIDES) != PyBUF_STRIDES && !view_c_contiguous(self)) {
		PyErr_SetString(PyExc_BufferError, "the view is not C-contiguous: ask for strides");
		return -1;
	}
	b->buf = self->data;
	b->obj = Py_NewRef((PyObject *)self);
	b->len = self->nbytes;
	b->readonly = 0;
	b->itemsize = nd ? self->itemsize : 1;
	b->format = !(flags & PyBUF_FORMAT) ? NULL : nd ? (char *)view_format(self) : "B";
	b->ndim = nd ? self->ndim : 1;
	b->shape = nd ? self->shape : NULL;
	b->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? self->strides : NULL;
	b->suboffsets = NULL;
	b->internal = NULL;
	return 0;
}

static PyObject *view_tuple(const Py_ssize_t *v, int n)
{
	PyObject *t = PyTuple_New(n);

	if (!t)
		return NULL;
	for (int i = 0; i < n; i++) {
		PyObject *x = PyLong_FromSsize_t(v[i]);

		if (!x) {
			Py_DECREF(t);
			return NULL;
		}
		PyTuple_SetItem(t, i, x);
	}
	return t;
}

static PyObject *view_get_shape(ViewObject *self, void *unused)
{
	(void)unused;
	return view_tuple(self->shape, self->ndim);
}

static PyObject *view_get_strides(ViewObject *self, void *unused)
{
	(void)unused;
	return view_tuple(self->strides, self->ndim);
}

static PyObject *view_get_dtype(ViewObject *self, void *unused)
{
	(void)unused;
	return PyUnicode_FromString(self->dtype > 0 && self->dtype < KVP_DTYPE_MAX
					    ? g_dtype_names[self->dtype]
					    : "unknown");
}

static PyObject *view_get_data_ptr(ViewObject *self, void *unused)
{
	(void)unused;
	return PyLong_FromVoidPtr(self->data);
}

static PyObject *view_get_nbytes(ViewObject *self, void *unused)
{
	(void)unused;
	return PyLong_FromSsize_t(self->nbytes);
}

static PyObject *view_get_tier(ViewObject *self, void *unused)
{
	(void)unused;
	return PyUnicode_FromString(kvp_tier_name(self->tier));
}

static PyObject *view_repr(ViewObject *self)
{
	PyObject *shape = view_get_shape(self, NULL), *r;

	if (!shape)
		return NULL;
	r = PyUnicode_FromFormat("<kvpool.View %s tier of %U, shape %R, %s, %s:%d>",
				 kvp_tier_name(self->tier), self->pool_name, shape,
				 self->dtype > 0 && self->dtype < KVP_DTYPE_MAX
					 ? g_dtype_names[self->dtype]
					 : "unknown",
				 self->device.device_type == kDLCUDA ? "cuda" : "cpu",
				 self->device.device_id);
	Py_DECREF(shape);
	return r;
}

static PyMethodDef view_methods[] = {
	{ "__dlpack__", (PyCFunction)(void (*)(void))view_dlpack, METH_VARARGS | METH_KEYWORDS,
	  "__dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None)\n--\n\nA "
	  "DLPack capsule of the view: 'dltensor_versioned' (DLPack 1.x) when max_version >= "
	  "(1, 0), else 'dltensor'. Never copies." },
	{ "__dlpack_device__", (PyCFunction)view_dlpack_device, METH_NOARGS,
	  "__dlpack_device__()\n--\n\n(device_type, device_id): (1, 0) for CPU-mapped tiers, "
	  "(2, N) for a cuda tier." },
	{ NULL, NULL, 0, NULL }
};

static PyGetSetDef view_getset[] = {
	{ "shape", (getter)view_get_shape, NULL, "Shape of the view.", NULL },
	{ "strides", (getter)view_get_strides, NULL, "Strides in bytes.", NULL },
	{ "dtype", (getter)view_get_dtype, NULL, "Element type: fp16, bf16, fp8 or fp32.", NULL },
	{ "data_ptr", (getter)view_get_data_ptr, NULL, "Address of the first element.", NULL },
	{ "nbytes", (getter)view_get_nbytes, NULL, "Bytes the view spans.", NULL },
	{ "tier", (getter)view_get_tier, NULL, "The tier viewed.", NULL },
	{ NULL, NULL, NULL, NULL, NULL }
};

static PyType_Slot view_slots[] = {
	{ Py_tp_doc, "A zero-copy view of tier memory (Pool.kv, Pool.host_pages_view); keeps the "
		     "mapping alive as long as it or anything made from it lives." },
	{ Py_tp_dealloc, view_dealloc },
	{ Py_tp_methods, view_methods },
	{ Py_tp_getset, view_getset },
	{ Py_tp_repr, view_repr },
	{ Py_bf_getbuffer, view_getbuffer },
	{ 0, NULL }
};

static PyType_Spec view_spec = { "kvpool.View", sizeof(ViewObject), 0,
				 Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
				 view_slots };

/* ---- module ---- */
static PyObject *mod_connect(PyObject *mod, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "socket", "name", "pressure_notices", "reconnect_ms", NULL };
	const char *path = NULL, *name = "python";
	struct kvp_client_opts o = { .struct_size = sizeof(o), .capabilities = KVP_CAP_ALL };
	unsigned int reconnect_ms = 0;
	struct kvp_client *c;
	struct kvp_error err;
	ClientObject *co;
	int pressure = 0;

	(void)mod;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "|zspI:connect", kwlist, &path, &name, &pressure,
					 &reconnect_ms))
		return NULL;
	o.name = name;
	o.flags = pressure ? KVP_CLIENT_F_PRESSURE : 0;
	o.reconnect_ms = reconnect_ms;
	KVPY_WAIT(c = kvp_client_connect_opts(path, &o, &err));
	if (!c)
		return raise_kvp(&err);
	co = (ClientObject *)alloc_obj(g_client_type);
	if (!co) {
		kvp_client_close(c);
		return NULL;
	}
	co->c = c;
	return (PyObject *)co;
}

static PyObject *mod_decode_pressure(PyObject *mod, PyObject *ev_o)
{
	struct kvp_event ev = { .struct_size = sizeof(ev) };
	struct kvp_pressure n = { .struct_size = sizeof(n) };
	struct kvp_error err;
	PyObject *type, *payload, *len;
	char *bytes;
	Py_ssize_t blen;

	(void)mod;
	if (!PyObject_TypeCheck(ev_o, (PyTypeObject *)g_event_type)) {
		PyErr_SetString(PyExc_TypeError, "decode_pressure() takes a kvpool.Event");
		return NULL;
	}
	type = PyStructSequence_GetItem(ev_o, 0);
	payload = PyStructSequence_GetItem(ev_o, 4);
	len = PyStructSequence_GetItem(ev_o, 5);
	if (PyLong_AsUnsignedLong(type) != KVP_EVENT_PRESSURE) {
		if (PyErr_Occurred())
			return NULL;
		Py_RETURN_NONE;
	}
	if (PyBytes_AsStringAndSize(payload, &bytes, &blen) < 0)
		return NULL;
	ev.type = KVP_EVENT_PRESSURE;
	ev.payload = bytes;
	ev.payload_cap = (size_t)blen;
	ev.payload_len = PyLong_AsSize_t(len);
	if (ev.payload_len == (size_t)-1 && PyErr_Occurred())
		return NULL;
	if (kvp_pressure_decode(&ev, &n, &err) < 0)
		return raise_kvp(&err);
	return pressure_to_py(&n);
}

static PyObject *mod_default_socket(PyObject *mod, PyObject *unused)
{
	char buf[256];

	(void)mod, (void)unused;
	if (!kvp_client_default_socket(buf, sizeof(buf)))
		Py_RETURN_NONE;
	return PyUnicode_FromString(buf);
}

/* ---- C API baselines for the Python benchmarks (tests/python/bench_kvpool.py) ---- */
static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int c_alloc_free_loop(struct kvp_pool *p, unsigned int n, struct kvp_error *err)
{
	int r = 0;

	for (unsigned int i = 0; i < n && r >= 0; i++) {
		uint64_t lease;
		uint32_t page;

		r = kvp_lease_alloc(p, KVP_TIER_DEVICE, 1, &lease, &page, err);
		if (r >= 0)
			r = kvp_lease_free(p, lease, NULL, 0, err);
	}
	return r;
}

static PyObject *mod_c_alloc_free(PyObject *mod, PyObject *args)
{
	PoolObject *pool;
	unsigned int n;
	struct kvp_pool *p;
	struct kvp_error err;
	double t0, t1;
	int r;

	(void)mod;
	if (!PyArg_ParseTuple(args, "O!I:_c_alloc_free", (PyTypeObject *)g_pool_type, &pool, &n))
		return NULL;
	p = pool_handle(pool);
	if (!p || !client_enter(pool->client))
		return NULL;
	t0 = now_s();
	KVPY_WAIT(r = c_alloc_free_loop(p, n, &err));
	t1 = now_s();
	client_leave(pool->client);
	if (r < 0)
		return raise_kvp(&err);
	return PyFloat_FromDouble(t1 - t0);
}

static int c_match_loop(struct kvp_pool *p, const struct u32list *tokens, unsigned int n,
			uint32_t *dev, uint32_t *host, uint32_t cap, struct kvp_error *err)
{
	struct kvp_match_result m = { .struct_size = sizeof(m) };
	int r = 0;

	for (unsigned int i = 0; i < n && r >= 0; i++)
		r = kvp_cache_match(p, 0, tokens->v, (uint32_t)tokens->n, 0, &m, dev, host, cap,
				    err);
	return r;
}

static PyObject *mod_c_match(PyObject *mod, PyObject *args)
{
	PyObject *tokens_o;
	PoolObject *pool;
	unsigned int n;
	struct kvp_pool *p;
	struct kvp_error err;
	struct u32list tokens;
	uint32_t *dev, *host, cap;
	double t0 = 0, t1 = 0;
	int r = -1;

	(void)mod;
	if (!PyArg_ParseTuple(args, "O!OI:_c_match", (PyTypeObject *)g_pool_type, &pool, &tokens_o,
			      &n))
		return NULL;
	p = pool_handle(pool);
	if (!p || u32list_from(tokens_o, "tokens", &tokens))
		return NULL;
	cap = (uint32_t)((uint64_t)tokens.n / pool->g.page_tokens) + 1;
	dev = PyMem_Malloc((size_t)cap * sizeof(uint32_t));
	host = PyMem_Malloc((size_t)cap * sizeof(uint32_t));
	if (!dev || !host) {
		PyErr_NoMemory();
	} else if (client_enter(pool->client)) {
		t0 = now_s();
		KVPY_WAIT(r = c_match_loop(p, &tokens, n, dev, host, cap, &err));
		t1 = now_s();
		client_leave(pool->client);
		if (r < 0)
			raise_kvp(&err);
	}
	u32list_done(&tokens);
	PyMem_Free(dev);
	PyMem_Free(host);
	return r < 0 ? NULL : PyFloat_FromDouble(t1 - t0);
}

/* ---- hash-keyed pages ---- */
/* Pool.insert_keys, match_keys and exists_keys over kvp_cache_insert_keys, match_keys and
 * exists_keys. Keys come as a sequence of bytes objects, held in a tuple (strong references)
 * while the call runs without the GIL. */
struct keylist {
	PyObject *tuple;
	struct kvp_page_key *v;
	uint32_t n;
};

static void keylist_done(struct keylist *kl)
{
	Py_XDECREF(kl->tuple);
	PyMem_Free(kl->v);
	memset(kl, 0, sizeof(*kl));
}

static int keylist_from(PyObject *o, struct keylist *kl)
{
	Py_ssize_t n;

	memset(kl, 0, sizeof(*kl));
	if (PyBytes_Check(o) || PyByteArray_Check(o) || PyUnicode_Check(o)) {
		PyErr_SetString(PyExc_TypeError,
				"keys must be a sequence of bytes objects, not one");
		return -1;
	}
	kl->tuple = PySequence_Tuple(o);
	if (!kl->tuple)
		return -1;
	n = PyTuple_Size(kl->tuple);
	if (n < 0 || (uint64_t)n > UINT32_MAX) {
		PyErr_SetString(PyExc_ValueError, "keys: more than 2^32-1 keys");
		goto fail;
	}
	kl->v = PyMem_Malloc(n ? (size_t)n * sizeof(*kl->v) : 1);
	if (!kl->v) {
		PyErr_NoMemory();
		goto fail;
	}
	for (Py_ssize_t i = 0; i < n; i++) {
		PyObject *k = PyTuple_GetItem(kl->tuple, i);
		char *data;
		Py_ssize_t len;

		if (!PyBytes_Check(k)) {
			PyErr_Format(PyExc_TypeError, "keys[%zd] is not bytes", i);
			goto fail;
		}
		if (PyBytes_AsStringAndSize(k, &data, &len) < 0)
			goto fail;
		kl->v[i].data = data;
		kl->v[i].len = (size_t)len;
	}
	kl->n = (uint32_t)n;
	return 0;
fail:
	keylist_done(kl);
	return -1;
}

static PyObject *pool_insert_keys(PoolObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "lease", "keys", "cached_keys", "namespace", "pages", NULL };
	PyObject *lease_o, *keys_o, *ck_o = NULL, *ns_o = NULL, *pages_o = Py_None;
	struct kvp_pool *p = pool_handle(self);
	struct kvp_insert_keys_result res = { .struct_size = sizeof(res) };
	struct u32list pages = { 0 };
	struct keylist keys;
	struct kvp_error err;
	uint32_t cached = 0, npages, used;
	const uint32_t *pv;
	uint64_t ns = 0;
	LeaseObject *l;
	int r;

	if (!p || !PyArg_ParseTupleAndKeywords(args, kw, "OO|OOO:insert_keys", kwlist, &lease_o,
					       &keys_o, &ck_o, &ns_o, &pages_o))
		return NULL;
	l = lease_arg(self, lease_o);
	if (!l)
		return NULL;
	if ((ck_o && u32_arg(ck_o, "cached_keys", &cached)) ||
	    (ns_o && u64_arg(ns_o, "namespace", &ns)))
		return NULL;
	if (keylist_from(keys_o, &keys))
		return NULL;
	if (cached > keys.n) {
		PyErr_Format(PyExc_ValueError, "cached_keys %u > %u keys", cached, keys.n);
		goto fail;
	}
	if (pages_o != Py_None) {
		if (u32list_from(pages_o, "pages", &pages))
			goto fail;
		pv = pages.v;
		npages = (uint32_t)pages.n;
	} else {
		npages = keys.n - cached;
		if (npages > l->n) {
			PyErr_Format(PyExc_ValueError,
				     "%u keys past cached_keys need %u pages, the lease has %u",
				     npages, npages, l->n);
			goto fail;
		}
		pv = l->pages;
	}
	if (!client_enter(self->client))
		goto fail;
	KVPY_WAIT(r = kvp_cache_insert_keys(p, l->id, ns, keys.v, keys.n, cached, pv, npages, &res,
					    &err));
	client_leave(self->client);
	if (r < 0) {
		raise_kvp(&err);
		goto fail;
	}
	used = res.done_keys > cached ? res.done_keys - cached : 0;
	if (used > npages)
		used = npages;
	if (lease_drop_used(l, pages_o == Py_None, pv, used))
		goto fail;
	keylist_done(&keys);
	u32list_done(&pages);
	return Py_BuildValue("{sIsIsIsI}", "new_pages", res.new_pages, "dup_pages", res.dup_pages,
			     "done_keys", res.done_keys, "lease_pages", res.lease_pages);
fail:
	keylist_done(&keys);
	u32list_done(&pages);
	return NULL;
}

static PyObject *pool_match_keys(PoolObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "keys", "namespace", "lock", "local_only", NULL };
	PyObject *keys_o, *ns_o = NULL, *mo;
	struct kvp_pool *p = pool_handle(self);
	struct kvp_match_keys_result m = { .struct_size = sizeof(m) };
	struct kvp_error err;
	struct keylist keys;
	uint32_t *dev, *host, cap;
	uint64_t ns = 0;
	int lock = 1, local_only = 0, r = -1;

	if (!p || !PyArg_ParseTupleAndKeywords(args, kw, "O|Opp:match_keys", kwlist, &keys_o, &ns_o,
					       &lock, &local_only))
		return NULL;
	if (ns_o && u64_arg(ns_o, "namespace", &ns))
		return NULL;
	if (keylist_from(keys_o, &keys))
		return NULL;
	cap = keys.n ? keys.n : 1;
	if (match_bufs(cap, &dev, &host) == 0 && client_enter(self->client)) {
		KVPY_WAIT(r = kvp_cache_match_keys(p, ns, keys.v, keys.n,
						   lock | (local_only ? KVP_MATCH_LOCAL_ONLY : 0),
						   &m, dev, host, cap, &err));
		client_leave(self->client);
		if (r < 0)
			raise_kvp(&err);
	}
	keylist_done(&keys);
	if (r < 0)
		goto fail;
	mo = match_new(self, p, (uint64_t)m.matched_keys * self->g.page_tokens, m.lock_id, dev,
		       host, m.n_device, m.n_host);
	if (mo)
		((MatchObject *)mo)->remote_pages = m.remote_pages;
	return mo;
fail:
	PyMem_Free(dev);
	PyMem_Free(host);
	return NULL;
}

/* Pool.fetch (keyed 0: tokens) and Pool.fetch_keys (1: keys): kvp_cache_fetch(_keys), answered
 * as a Match with fetched_pages and missed_pages. */
static PyObject *pool_fetch_any(PoolObject *self, PyObject *args, PyObject *kw, int keyed)
{
	static char *kwlist_t[] = { "tokens", "namespace", "lock", NULL };
	static char *kwlist_k[] = { "keys", "namespace", "lock", NULL };
	PyObject *in_o, *ns_o = NULL, *mo;
	struct kvp_pool *p = pool_handle(self);
	struct kvp_fetch_result f = { .struct_size = sizeof(f) };
	struct kvp_error err;
	struct u32list tokens = { 0 };
	struct keylist keys = { 0 };
	uint32_t *dev = NULL, *host = NULL, cap;
	uint64_t ns = 0;
	int lock = 1, r = -1;

	if (!p || !PyArg_ParseTupleAndKeywords(args, kw, keyed ? "O|Op:fetch_keys" : "O|Op:fetch",
					       keyed ? kwlist_k : kwlist_t, &in_o, &ns_o, &lock))
		return NULL;
	if (ns_o && u64_arg(ns_o, "namespace", &ns))
		return NULL;
	if (keyed ? keylist_from(in_o, &keys) : u32list_from(in_o, "tokens", &tokens))
		return NULL;
	cap = keyed ? (keys.n ? keys.n : 1)
		    : (uint32_t)((uint64_t)tokens.n / self->g.page_tokens) + 1;
	if (match_bufs(cap, &dev, &host) == 0 && client_enter(self->client)) {
		if (keyed)
			KVPY_WAIT(r = kvp_cache_fetch_keys(p, ns, keys.v, keys.n, lock, &f, dev,
							   host, cap, &err));
		else
			KVPY_WAIT(r = kvp_cache_fetch(p, ns, tokens.v, (uint32_t)tokens.n, lock, &f,
						      dev, host, cap, &err));
		client_leave(self->client);
		if (r < 0)
			raise_kvp(&err);
	}
	if (keyed)
		keylist_done(&keys);
	else
		u32list_done(&tokens);
	if (r < 0) {
		PyMem_Free(dev);
		PyMem_Free(host);
		return NULL;
	}
	mo = match_new(self, p, keyed ? f.matched * self->g.page_tokens : f.matched, f.lock_id, dev,
		       host, f.n_device, f.n_host);
	if (mo) {
		((MatchObject *)mo)->fetched_pages = f.fetched_pages;
		((MatchObject *)mo)->missed_pages = f.missed_pages;
	}
	return mo;
}

static PyObject *pool_fetch(PoolObject *self, PyObject *args, PyObject *kw)
{
	return pool_fetch_any(self, args, kw, 0);
}

static PyObject *pool_fetch_keys(PoolObject *self, PyObject *args, PyObject *kw)
{
	return pool_fetch_any(self, args, kw, 1);
}

static PyObject *pool_exists_keys(PoolObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "keys", "namespace", NULL };
	PyObject *keys_o, *ns_o = NULL;
	struct kvp_pool *p = pool_handle(self);
	struct kvp_error err;
	struct keylist keys;
	uint64_t ns = 0;
	int r;

	if (!p || !PyArg_ParseTupleAndKeywords(args, kw, "O|O:exists_keys", kwlist, &keys_o, &ns_o))
		return NULL;
	if (ns_o && u64_arg(ns_o, "namespace", &ns))
		return NULL;
	if (keylist_from(keys_o, &keys))
		return NULL;
	if (!client_enter(self->client)) {
		keylist_done(&keys);
		return NULL;
	}
	KVPY_WAIT(r = kvp_cache_exists_keys(p, ns, keys.v, keys.n, &err));
	client_leave(self->client);
	keylist_done(&keys);
	if (r < 0)
		return raise_kvp(&err);
	return PyLong_FromLong(r);
}

static PyMethodDef mod_methods[] = {
	{ "_c_alloc_free", mod_c_alloc_free, METH_VARARGS,
	  "_c_alloc_free(pool, n)\n--\n\nBenchmark baseline: n Alloc(1 page) + Free round trips "
	  "through the C API in one C loop; returns the seconds taken." },
	{ "_c_match", mod_c_match, METH_VARARGS,
	  "_c_match(pool, tokens, n)\n--\n\nBenchmark baseline: n unlocked matches of tokens "
	  "through the C API in one C loop; returns the seconds taken." },
	{ "connect", (PyCFunction)(void (*)(void))mod_connect, METH_VARARGS | METH_KEYWORDS,
	  "connect(socket=None, name='python', pressure_notices=False)\n--\n\nConnects to "
	  "kvpoold at `socket` (None: $KVPOOL_SOCKET, else the default path) and says Hello as "
	  "`name`. With pressure_notices, every attach asks for pressure notices "
	  "(Client.pressure_notices). Returns a Client; NoDaemon when none answers." },
	{ "decode_pressure", mod_decode_pressure, METH_O,
	  "decode_pressure(event)\n--\n\nThe kvpool.PressureNotice an Event carries, None for "
	  "an event of another type." },
	{ "default_socket", mod_default_socket, METH_NOARGS,
	  "default_socket()\n--\n\nThe socket path a client uses when none is given." },
	{ NULL, NULL, 0, NULL }
};

static struct PyModuleDef kvpool_module = {
	PyModuleDef_HEAD_INIT,
	"_kvpool",
	"The C extension under the kvpool package (import kvpool, not this).",
	-1,
	mod_methods,
	NULL,
	NULL,
	NULL,
	NULL
};

static PyStructSequence_Field g_geometry_fields[] = {
	{ "layers", "Transformer layers." },
	{ "kv_heads", "Key/value heads per layer." },
	{ "head_dim", "Dimension of one head." },
	{ "dtype", "Element type: fp16, bf16, fp8 or fp32." },
	{ "page_tokens", "Tokens per page." },
	{ NULL, NULL }
};

static PyStructSequence_Desc g_geometry_desc = {
	"kvpool.Geometry", "A pool's KV layout: layers, kv_heads, head_dim, dtype, page_tokens.",
	g_geometry_fields, 5
};

static PyStructSequence_Field g_event_fields[] = {
	{ "type", "The Response's result field number (kvpool.proto), 0 for none." },
	{ "code", "The frame's status code (0: OK)." },
	{ "id", "The frame's id (0: pushed by the daemon)." },
	{ "dropped", "Events dropped for a full queue since the last one taken." },
	{ "payload", "The frame's protobuf Response (at most 64 KiB of it)." },
	{ "payload_len", "The frame's size in bytes." },
	{ NULL, NULL }
};

static PyStructSequence_Desc g_event_desc = {
	"kvpool.Event", "A frame the daemon sent unasked (Client.next_event, Client.events).",
	g_event_fields, 6
};

static PyStructSequence_Field g_pressure_fields[] = {
	{ "pool", "The pool's name." },
	{ "pool_id", "The daemon's id of the pool." },
	{ "tier", "'device' or 'host'." },
	{ "recovered", "False: free pages fell below the watermark; True: they are back." },
	{ "free_tokens", "Tokens free in the tier when the notice was sent." },
	{ "evictable_tokens", "Tokens of cached prefixes that could be evicted." },
	{ "reserved_tokens", "Tokens in clients' page reserves, unused (0 without reserves)." },
	{ "watermark_tokens", "The tier's watermark in tokens." },
	{ "total_tokens", "Tokens of the tier." },
	{ "coalesced", "Earlier states of this tier replaced before they were sent." },
	{ "seq", "The tier's pressure changes so far." },
	{ NULL, NULL }
};

static PyStructSequence_Desc g_pressure_desc = {
	"kvpool.PressureNotice",
	"A tier's free pages crossed its pressure watermark (Client.pressure_notices).",
	g_pressure_fields, KVPY_PRESSURE_FIELDS
};

static int add_type(PyObject *m, PyType_Spec *spec, PyObject **out)
{
	const char *dot = strrchr(spec->name, '.');

	*out = PyType_FromSpec(spec);
	if (!*out)
		return -1;
	return PyModule_AddObjectRef(m, dot ? dot + 1 : spec->name, *out);
}

static int add_exceptions(PyObject *m)
{
	char qual[64];
	PyObject *code;

	g_error = PyErr_NewExceptionWithDoc(
		"kvpool.Error",
		"Every failure kvpool reports: .code (enum kvp_code), .name and .message; the "
		"subclasses carry the typed detail as attributes.",
		NULL, NULL);
	if (!g_error || PyModule_AddObjectRef(m, "Error", g_error))
		return -1;
	if (PyObject_SetAttrString(g_error, "code", Py_None))
		return -1;
	for (size_t i = 0; i < sizeof(g_exc_table) / sizeof(g_exc_table[0]); i++) {
		PyObject *e;

		snprintf(qual, sizeof(qual), "kvpool.%s", g_exc_table[i].name);
		e = PyErr_NewExceptionWithDoc(qual, g_exc_table[i].doc, g_error, NULL);
		if (!e)
			return -1;
		g_code_exc[g_exc_table[i].code] = e;
		code = PyLong_FromLong(g_exc_table[i].code);
		if (!code || PyObject_SetAttrString(e, "code", code)) {
			Py_XDECREF(code);
			return -1;
		}
		Py_DECREF(code);
		if (PyModule_AddObjectRef(m, g_exc_table[i].name, e))
			return -1;
	}
	g_client_busy = PyErr_NewExceptionWithDoc(
		"kvpool.ClientBusy",
		"A Client was entered by a second thread while in a call: a Client is not "
		"thread-safe.",
		g_error, NULL);
	if (!g_client_busy || PyModule_AddObjectRef(m, "ClientBusy", g_client_busy))
		return -1;
	return 0;
}

/* numpy for page lists and array-likes when it imports, else array('I'). */
static int import_helpers(void)
{
	PyObject *np = PyImport_ImportModule("numpy"), *arr;

	if (np) {
		g_frombuffer = PyObject_GetAttrString(np, "frombuffer");
		g_uint32 = PyObject_GetAttrString(np, "uint32");
		g_asarray = PyObject_GetAttrString(np, "asarray");
		Py_DECREF(np);
		if (!g_frombuffer || !g_uint32 || !g_asarray)
			return -1;
	} else {
		PyErr_Clear();
	}
	arr = PyImport_ImportModule("array");
	if (!arr)
		return -1;
	g_array_type = PyObject_GetAttrString(arr, "array");
	Py_DECREF(arr);
	return g_array_type ? 0 : -1;
}

PyMODINIT_FUNC PyInit__kvpool(void)
{
	PyObject *m = PyModule_Create(&kvpool_module);

	if (!m)
		return NULL;
	g_geometry_type = (PyObject *)PyStructSequence_NewType(&g_geometry_desc);
	g_event_type = (PyObject *)PyStructSequence_NewType(&g_event_desc);
	g_pressure_type = (PyObject *)PyStructSequence_NewType(&g_pressure_desc);
	if (!g_geometry_type || PyModule_AddObjectRef(m, "Geometry", g_geometry_type) ||
	    !g_event_type || PyModule_AddObjectRef(m, "Event", g_event_type) || !g_pressure_type ||
	    PyModule_AddObjectRef(m, "PressureNotice", g_pressure_type) ||
	    PyModule_AddIntConstant(m, "EVENT_PRESSURE", KVP_EVENT_PRESSURE) || add_exceptions(m) ||
	    add_type(m, &client_spec, &g_client_type) || add_type(m, &pool_spec, &g_pool_type) ||
	    add_type(m, &lease_spec, &g_lease_type) || add_type(m, &match_spec, &g_match_type) ||
	    add_type(m, &view_spec, &g_view_type) || import_helpers() ||
	    PyModule_AddStringConstant(m, "__version__", KVP_VERSION) ||
	    PyModule_AddIntConstant(m, "PROTOCOL_VERSION", KVP_PROTOCOL_VERSION) ||
	    PyModule_AddIntConstant(m, "HAVE_CUDA", KVP_HAVE_CUDA)) {
		Py_DECREF(m);
		return NULL;
	}
	return m;
}
