/* pool.c - kvpool.Pool, a pool attached through a Client: its geometry and tiers, leasing
 * pages (Lease objects), publishing and matching token prefixes and hash-keyed page chains
 * (Match objects), fetching from the remote tier, and zero-copy views of its tiers (View
 * objects).
 */
#include "module.h"

/* The pool handle for a call, or NULL with ValueError when detached or closed. */
struct kvp_pool *pool_handle(PoolObject *self)
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

static PyObject *pool_tier_fd(PoolObject *self, PyObject *arg)
{
	struct kvp_pool *p = pool_handle(self);
	int tier;

	if (!p || tier_from(arg, "tier", &tier))
		return NULL;
	return PyLong_FromLong(kvp_pool_tier_fd(p, tier));
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

static PyObject *pool_alloc(PoolObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "npages", "tier", "run_align", NULL };
	PyObject *n_o, *tier_o = NULL, *align_o = NULL, *lease;
	struct kvp_pool *p = pool_handle(self);
	struct kvp_error err;
	uint32_t n, *pages, align = 0, first = 0;
	uint64_t id = 0;
	int tier = KVP_TIER_DEVICE, r;

	if (!p ||
	    !PyArg_ParseTupleAndKeywords(args, kw, "O|OO:alloc", kwlist, &n_o, &tier_o, &align_o))
		return NULL;
	if (u32_arg(n_o, "npages", &n) || (tier_o && tier_from(tier_o, "tier", &tier)) ||
	    (align_o && u32_arg(align_o, "run_align", &align)))
		return NULL;
	pages = PyMem_Malloc(n ? (size_t)n * sizeof(uint32_t) : 1);
	if (!pages)
		return PyErr_NoMemory();
	if (!client_enter(self->client)) {
		PyMem_Free(pages);
		return NULL;
	}
	if (align) {
		KVPY_WAIT(r = kvp_lease_alloc_run(p, tier, n, align, &id, &first, &err));
		for (uint32_t i = 0; r == 0 && i < n; i++)
			pages[i] = first + i;
	} else {
		KVPY_WAIT(r = kvp_lease_alloc(p, tier, n, &id, pages, &err));
	}
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

static PyMethodDef pool_methods[] = {
	{ "detach", (PyCFunction)pool_detach, METH_NOARGS,
	  "detach()\n--\n\nDetaches: the session's leases in this pool are freed and its locks "
	  "released at once. Views taken from it keep their memory mapped until they go." },
	{ "tier_pages", (PyCFunction)pool_tier_pages, METH_O,
	  "tier_pages(tier)\n--\n\nPages in the tier ('device' or 'host'); 0 when absent." },
	{ "tier_bytes", (PyCFunction)pool_tier_bytes, METH_O,
	  "tier_bytes(tier)\n--\n\nBytes of the tier's mapping." },
	{ "tier_fd", (PyCFunction)pool_tier_fd, METH_O,
	  "tier_fd(tier)\n--\n\nThe tier's memory fd as kvpoold sent it (a memfd, or a cuda "
	  "tier's exported POSIX fd), owned by the pool's mapping: do not close it; -1 when "
	  "absent." },
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
	  "alloc(npages, tier='device', run_align=0)\n--\n\nLeases `npages` pages, evicting cold "
	  "prefixes when free pages are short. Returns a Lease; OutOfCapacity says why when it "
	  "cannot. With run_align > 0, a run lease: consecutive free pages (no eviction), the "
	  "first a multiple of run_align (the tier's bytes of the run can be mapped as one "
	  "buffer: kvpool.vllm_mem)." },
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

PyType_Spec pool_spec = { "kvpool.Pool", sizeof(PoolObject), 0,
			  Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION, pool_slots };
