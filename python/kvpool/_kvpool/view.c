/* view.c - kvpool.View, a zero-copy view of a pool's tier memory (Pool.kv, host_pages_view):
 * DLPack 1.x capsules with version negotiation and the unversioned capsule as fallback, and
 * the buffer protocol for CPU-mapped tiers. A view keeps its tier's mapping, and nothing else
 * of the pool, alive (see mapping lifetime).
 */
#include "module.h"

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

PyObject *view_new(PoolObject *pool, int tier, void *data, int ndim, const Py_ssize_t *shape)
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

PyType_Spec view_spec = { "kvpool.View", sizeof(ViewObject), 0,
			  Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION, view_slots };
