/* module.c - the _kvpool module: its globals, the exception classes (kvpool.Error and a
 * subclass for every enum kvp_code) and raising them from a struct kvp_error, the struct
 * sequences (Geometry, Event, PressureNotice), the module functions (connect, decode_pressure,
 * default_socket, copy_runs, copy_runs_cuda, set_torch_allocator: torch_alloc.c) and
 * PyInit__kvpool, which makes the types of client.c, pool.c, lease.c, match.c and view.c from
 * their specs. module.h says what the files share.
 */
#include "module.h"

#include <errno.h>

#include "kv_copy.h"

/* ---- module globals (one interpreter; created once at import) ---- */
static PyObject *g_error;		   /* kvpool.Error */
static PyObject *g_code_exc[KVP_CODE_MAX]; /* subclass per enum kvp_code, NULL for gaps */
PyObject *g_client_busy;		   /* kvpool.ClientBusy */
static PyObject *g_geometry_type;	   /* kvpool.Geometry (a struct sequence) */
PyObject *g_event_type;			   /* kvpool.Event (a struct sequence) */
PyObject *g_pressure_type;		   /* kvpool.PressureNotice (a struct sequence) */
PyObject *g_frombuffer, *g_uint32;	   /* numpy.frombuffer and numpy.uint32, or NULL */
PyObject *g_asarray;			   /* numpy.asarray, or NULL */
PyObject *g_array_type;			   /* array.array */
PyObject *g_client_type, *g_pool_type, *g_lease_type, *g_match_type, *g_view_type;

const char *const g_dtype_names[KVP_DTYPE_MAX] = { "none", "fp16", "bf16", "fp8", "fp32" };
const unsigned g_dtype_bytes[KVP_DTYPE_MAX] = { 0, 2, 2, 1, 4 };

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
PyObject *str_from(const char *s)
{
	return PyUnicode_DecodeUTF8(s, (Py_ssize_t)strlen(s), "replace");
}

static int set_attr_str(PyObject *o, const char *name, const char *s)
{
	return set_attr_steal(o, name, str_from(s));
}

PyObject *geometry_to_py(const struct kvp_geometry *g)
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
PyObject *raise_kvp(const struct kvp_error *e)
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

PyObject *alloc_obj(PyObject *type)
{
	allocfunc a = (allocfunc)PyType_GetSlot((PyTypeObject *)type, Py_tp_alloc);

	return a((PyTypeObject *)type, 0);
}

void free_obj(PyObject *self)
{
	PyTypeObject *tp = Py_TYPE(self);
	freefunc f = (freefunc)PyType_GetSlot(tp, Py_tp_free);

	f(self);
	Py_DECREF(tp);
}

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

/* Gets o's buffer as a C-contiguous vector of 8-byte integers (numpy uint64 or int64, array
 * 'Q'); 0, or -1 with TypeError set. */
static int get_u64_buffer(PyObject *o, Py_buffer *b, const char *what)
{
	const char *f;

	if (PyObject_GetBuffer(o, b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
		return -1;
	f = b->format ? b->format : "B";
	if (*f == '<' || *f == '=' || *f == '@')
		f++;
	if (b->itemsize != 8 || b->ndim > 1 || !strchr("QqLl", *f) || f[1]) {
		PyErr_Format(PyExc_TypeError,
			     "copy_runs(): %s must be a vector of 64-bit integers "
			     "(numpy uint64), not format '%s' of %zd-byte items",
			     what, b->format ? b->format : "B", b->itemsize);
		PyBuffer_Release(b);
		return -1;
	}
	return 0;
}

/* copy_runs' and copy_runs_cuda's three lists (dst, src, size): vectors of 64-bit integers of
 * one length. 0 with the three buffers held, or -1 with an exception set and none held. */
static int get_run_lists(PyObject *dst_o, PyObject *src_o, PyObject *size_o, Py_buffer *d,
			 Py_buffer *s, Py_buffer *n, const char *fn)
{
	if (get_u64_buffer(dst_o, d, "dst") < 0)
		return -1;
	if (get_u64_buffer(src_o, s, "src") < 0) {
		PyBuffer_Release(d);
		return -1;
	}
	if (get_u64_buffer(size_o, n, "size") < 0) {
		PyBuffer_Release(d);
		PyBuffer_Release(s);
		return -1;
	}
	if (d->len == n->len && s->len == n->len)
		return 0;
	PyErr_Format(PyExc_ValueError, "%s(): dst, src and size differ in length (%zd, %zd, %zd)",
		     fn, d->len / 8, s->len / 8, n->len / 8);
	PyBuffer_Release(d);
	PyBuffer_Release(s);
	PyBuffer_Release(n);
	return -1;
}

static PyObject *mod_copy_runs(PyObject *mod, PyObject *args)
{
	PyObject *dst_o, *src_o, *size_o;
	Py_buffer d, s, n;
	Py_ssize_t cnt;
	int r;

	(void)mod;
	if (!PyArg_ParseTuple(args, "OOO:copy_runs", &dst_o, &src_o, &size_o) ||
	    get_run_lists(dst_o, src_o, size_o, &d, &s, &n, "copy_runs") < 0)
		return NULL;
	cnt = n.len / 8;
	KVPY_WAIT(r = kvp_copy_runs_cpu(d.buf, s.buf, n.buf, (uint64_t)cnt));
	if (r < 0)
		PyErr_SetString(PyExc_ValueError, "copy_runs(): a NULL run list");
	PyBuffer_Release(&d);
	PyBuffer_Release(&s);
	PyBuffer_Release(&n);
	if (r < 0)
		return NULL;
	return PyLong_FromSsize_t(cnt);
}

#if KVP_HAVE_CUDA
#include "kv_copy_cuda.h"
#endif

static PyObject *mod_copy_runs_cuda(PyObject *mod, PyObject *args)
{
	PyObject *dst_o, *src_o, *size_o;
	unsigned long long stream;
	Py_buffer d, s, n;
	int r = -1;

	(void)mod;
	if (!PyArg_ParseTuple(args, "OOOK:copy_runs_cuda", &dst_o, &src_o, &size_o, &stream) ||
	    get_run_lists(dst_o, src_o, size_o, &d, &s, &n, "copy_runs_cuda") < 0)
		return NULL;
	if (!stream && n.len) {
		PyErr_SetString(PyExc_ValueError,
				"copy_runs_cuda(): a stream of its own is needed, not the default "
				"stream (0)");
	} else {
#if KVP_HAVE_CUDA
		KVPY_WAIT(r = kvp_copy_runs_cuda(d.buf, s.buf, n.buf, (uint64_t)(n.len / 8),
						 (void *)(uintptr_t)stream));
		if (r < 0)
			PyErr_Format(PyExc_RuntimeError,
				     "copy_runs_cuda(): enqueueing the copies failed (%s)",
				     r == -EIO ? "a CUDA error" : "bad lists");
#else
		(void)stream;
		if (!n.len)
			r = 0;
		else
			PyErr_SetString(PyExc_RuntimeError,
					"copy_runs_cuda(): kvpool was built without CUDA");
#endif
	}
	PyBuffer_Release(&d);
	PyBuffer_Release(&s);
	PyBuffer_Release(&n);
	if (r < 0)
		return NULL;
	return PyLong_FromSsize_t(n.len / 8);
}

static PyMethodDef mod_methods[] = {
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
	{ "set_torch_allocator", torch_set_allocator, METH_VARARGS,
	  "set_torch_allocator(malloc, free)\n--\n\nThe callables behind this module's "
	  "kvp_torch_malloc and kvp_torch_free, which torch.cuda.memory.CUDAPluggableAllocator "
	  "loads from it: malloc(size, device, stream) returns an address (0 or None: out of "
	  "memory), free(ptr, size, device, stream). None, None: unset." },
	{ "copy_runs_cuda", mod_copy_runs_cuda, METH_VARARGS,
	  "copy_runs_cuda(dst, src, size, stream)\n--\n\nEnqueues the copies of size[i] bytes "
	  "from src[i] to dst[i] (device memory or host memory registered with CUDA) on the CUDA "
	  "stream `stream` (its handle, not 0), as one cudaMemcpyBatchAsync where CUDA has it; "
	  "the GIL released. The lists are as copy_runs takes them and may be reused on return; "
	  "the addresses are unchecked. Returns the runs enqueued; RuntimeError when CUDA fails "
	  "or kvpool was built without it." },
	{ "copy_runs", mod_copy_runs, METH_VARARGS,
	  "copy_runs(dst, src, size)\n--\n\nCopies size[i] bytes from address src[i] to address "
	  "dst[i] for every i, in order, on the CPU with the GIL released (non-temporal stores "
	  "for a list of 4 MiB or more). The three are vectors of 64-bit integers of one length "
	  "(numpy uint64). The addresses are raw memory the caller owns and keeps alive (tensors, "
	  "a pool's mapped pages): nothing checks them. Returns the runs copied." },
	{ "copy_buffer_runs", (PyCFunction)(void (*)(void))kvpy_copy_buffer_runs,
	  METH_VARARGS | METH_KEYWORDS,
	  "copy_buffer_runs(dst, src, runs, threads=1, *, ends=None, done=None)\n--\n\nCopies "
	  "byte runs between buffers in "
	  "one call, the GIL released: dst and src are sequences of C-contiguous buffers (dst "
	  "writable), runs an int64 array of rows (dst index, dst offset, src index, src "
	  "offset, bytes) that must not overlap. Every run is checked against its buffers "
	  "first (ValueError). Split over up to `threads` threads; a transfer larger than the "
	  "caches uses streaming stores. In groups: ends (ascending run counts, the last one "
	  "every run) cuts the runs into groups, and done(g) is called, with the GIL, once "
	  "every run of group g has landed, in order; an exception from done stops the copy "
	  "(no run is started after it) and is raised. Returns the bytes copied." },
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
