/* client.c - kvpool.Client, a connection to kvpoold (kvpool.connect makes one): calls entered
 * one thread at a time (client_enter, client_leave), ping, status, attach (making Pool objects),
 * the admin calls evict and flush, and the events and pressure notices the daemon pushes.
 */
#include <poll.h>
#include <time.h>

#include "module.h"

/* Enters a call on the client: refuses a closed client and a second thread. Returns the
 * handle, or NULL with the exception set. Leave with client_leave. */
struct kvp_client *client_enter(ClientObject *self)
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

void client_leave(ClientObject *self)
{
	self->busy = 0;
}

static void client_close_now(ClientObject *self)
{
	/* kvp_client_close frees every pool handle still attached */
	for (struct PoolObject *po = self->pools; po; po = po->next)
		po->p = NULL;
	kvp_client_close(self->c);
	self->c = NULL;
}

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

PyObject *client_enter_ctx(PyObject *self, PyObject *unused)
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
	    dict_set_u64(d, "protected_tokens", t->protected_tokens) ||
	    dict_steal(d, "numa_node", PyLong_FromLong(t->numa_node))) {
		Py_DECREF(d);
		return NULL;
	}
	return d;
}

static PyObject *pool_status_to_py(const struct kvp_pool_status *ps)
{
	PyObject *d = PyDict_New(), *tiers = NULL, *counters;

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
	/* the pool's counters by name, with the node's room for its host tier when the daemon
	 * read it (host_room_bytes, host_room_limit: a kvp_limit_name) */
	counters = PyDict_New();
	if (!counters)
		goto fail_d;
	for (uint32_t i = 0; i < ps->n_counters && i < KVP_STATUS_MAX_COUNTERS; i++) {
		const struct kvp_counter *k = &ps->counters[i];
		int r = strcmp(k->name, "host_room_limit") == 0
				? dict_set_str(counters, k->name, kvp_limit_name((int)k->value))
				: dict_set_u64(counters, k->name, k->value);

		if (r)
			goto fail_c;
	}
	if (dict_steal(d, "counters", counters))
		goto fail_d;
	return d;
fail:
	Py_XDECREF(tiers);
	goto fail_d;
fail_c:
	Py_DECREF(counters);
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

static double now_mono(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

PyObject *pressure_to_py(const struct kvp_pressure *n)
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
	  "pools (name, pool_id, geometry, tiers with token counts and numa_node, hit/queried "
	  "tokens, counters by name: with a host tier, host_room_bytes and host_room_limit, "
	  "what the node still gives that tier and the limit that binds)." },
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

PyType_Spec client_spec = { "kvpool.Client", sizeof(ClientObject), 0,
			    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION, client_slots };
