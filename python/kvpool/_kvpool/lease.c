/* lease.c - kvpool.Lease, pages leased from a pool (Pool.alloc makes one): its page list, which
 * Pool.insert and insert_keys shorten as pages move into the cache, extend, and free (the
 * whole lease when it ends or is collected).
 */
#include "module.h"

PyObject *lease_new(PoolObject *pool, int tier, uint64_t id, uint32_t *pages, uint32_t n)
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
int lease_drop_used(LeaseObject *l, int own, const uint32_t *pages, uint32_t n)
{
	if (!own)
		return lease_drop_pages(l, pages, n);
	memmove(l->pages, l->pages + n, (size_t)(l->n - n) * sizeof(uint32_t));
	l->n -= n;
	return 0;
}

/* The live kvpool.Lease of this Pool object that o is, or NULL with an exception set. */
LeaseObject *lease_arg(PoolObject *self, PyObject *o)
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

PyType_Spec lease_spec = { "kvpool.Lease", sizeof(LeaseObject), 0,
			   Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION, lease_slots };
