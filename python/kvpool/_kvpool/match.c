/* match.c - kvpool.Match, a matched cached prefix (Pool.match, match_keys, fetch and
 * fetch_keys make one): its device and host pages, load() to promote host pages, and the
 * lock released by release(), the context manager or collection.
 */
#include "module.h"

/* The device and host page lists of a match of at most cap pages: 0, or -1 with both NULL and
 * MemoryError set. */
int match_bufs(uint32_t cap, uint32_t **dev, uint32_t **host)
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
PyObject *match_new(PoolObject *self, struct kvp_pool *p, uint64_t tokens, uint64_t lock_id,
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

PyType_Spec match_spec = { "kvpool.Match", sizeof(MatchObject), 0,
			   Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION, match_slots };
