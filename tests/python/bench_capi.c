/* bench_capi.c - the C API baselines of the Python benchmarks (bench_kvpool.py): what
 * Pool.alloc(1) + Lease.free() and Pool.match make kvpoold do, through libkvpool in one C loop,
 * in the same process and against the same kvpoold as the Python figures. A test-only
 * extension: tests/python/meson.build builds it in the build tree beside kvpoold, the kvpool
 * package does not ship it. Each call connects a session of its own, attaches the pool, times
 * the loop alone (the GIL released), then detaches and closes.
 */
#ifndef Py_LIMITED_API
#define Py_LIMITED_API 0x030B0000
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>
#include <time.h>

#include "kvpool.h"

#define CAPI_WAIT(stmt)                                                                            \
	do {                                                                                       \
		Py_BEGIN_ALLOW_THREADS stmt;                                                       \
		Py_END_ALLOW_THREADS                                                               \
	} while (0)

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Sets RuntimeError from a failed libkvpool call and returns NULL. */
static PyObject *raise_err(const char *call, const struct kvp_error *err)
{
	PyErr_Format(PyExc_RuntimeError, "%s: %s: %s", call, kvp_code_name(err->code),
		     err->message);
	return NULL;
}

static struct kvp_pool *session_attach(const char *sock, const char *name, struct kvp_client **c,
				       struct kvp_error *err)
{
	struct kvp_pool *p;

	*c = kvp_client_connect(sock, "bench_capi", err);
	if (!*c)
		return NULL;
	p = kvp_pool_attach(*c, name, NULL, err);
	if (!p) {
		kvp_client_close(*c);
		*c = NULL;
	}
	return p;
}

/* A session of this module's own on pool `name` of the kvpoold at sock: the pool, *c its
 * client; NULL with the exception set. Close it with session_close. */
static struct kvp_pool *session_open(const char *sock, const char *name, struct kvp_client **c)
{
	struct kvp_error err;
	struct kvp_pool *p;

	CAPI_WAIT(p = session_attach(sock, name, c, &err));
	if (!p)
		raise_err("connect and attach", &err);
	return p;
}

static void session_close(struct kvp_client *c, struct kvp_pool *p)
{
	CAPI_WAIT(kvp_pool_detach(p, NULL); kvp_client_close(c));
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

static PyObject *capi_alloc_free(PyObject *mod, PyObject *args)
{
	const char *sock, *name;
	unsigned int n;
	struct kvp_client *c;
	struct kvp_pool *p;
	struct kvp_error err;
	double t0, t1;
	int r;

	(void)mod;
	if (!PyArg_ParseTuple(args, "ssI:alloc_free", &sock, &name, &n))
		return NULL;
	p = session_open(sock, name, &c);
	if (!p)
		return NULL;
	t0 = now_s();
	CAPI_WAIT(r = c_alloc_free_loop(p, n, &err));
	t1 = now_s();
	session_close(c, p);
	if (r < 0)
		return raise_err("kvp_lease_alloc/kvp_lease_free", &err);
	return PyFloat_FromDouble(t1 - t0);
}

/* Whether b holds native uint32 (numpy.uint32, array('I')). */
static int is_u32(const Py_buffer *b)
{
	const char *f = b->format ? b->format : "B";

	if (*f == '@' || *f == '=')
		f++;
	return b->itemsize == 4 && strcmp(f, "I") == 0;
}

static int c_match_loop(struct kvp_pool *p, const uint32_t *tokens, uint32_t ntokens,
			unsigned int n, struct kvp_match_result *m, uint32_t *dev, uint32_t *host,
			uint32_t cap, struct kvp_error *err)
{
	int r = 0;

	for (unsigned int i = 0; i < n && r >= 0; i++)
		r = kvp_cache_match(p, 0, tokens, ntokens, 0, m, dev, host, cap, err);
	return r;
}

static PyObject *capi_match(PyObject *mod, PyObject *args)
{
	const char *sock, *name;
	PyObject *tokens_o;
	unsigned int n;
	struct kvp_client *c;
	struct kvp_pool *p;
	struct kvp_geometry g;
	struct kvp_match_result m = { .struct_size = sizeof(m) };
	struct kvp_error err;
	Py_buffer tokens;
	uint32_t *dev, *host, cap, ntokens;
	double t0 = 0, t1 = 0;
	int r = -1;

	(void)mod;
	if (!PyArg_ParseTuple(args, "ssOI:match", &sock, &name, &tokens_o, &n))
		return NULL;
	if (PyObject_GetBuffer(tokens_o, &tokens, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
		return NULL;
	if (!is_u32(&tokens)) {
		PyBuffer_Release(&tokens);
		PyErr_SetString(PyExc_TypeError, "tokens must be a C-contiguous buffer of uint32");
		return NULL;
	}
	ntokens = (uint32_t)(tokens.len / 4);
	p = session_open(sock, name, &c);
	if (!p) {
		PyBuffer_Release(&tokens);
		return NULL;
	}
	kvp_pool_geometry(p, &g);
	cap = ntokens / g.page_tokens + 1;
	dev = PyMem_Malloc((size_t)cap * sizeof(uint32_t));
	host = PyMem_Malloc((size_t)cap * sizeof(uint32_t));
	if (!dev || !host) {
		PyErr_NoMemory();
	} else {
		t0 = now_s();
		CAPI_WAIT(r = c_match_loop(p, tokens.buf, ntokens, n, &m, dev, host, cap, &err));
		t1 = now_s();
		if (r < 0)
			raise_err("kvp_cache_match", &err);
	}
	session_close(c, p);
	PyBuffer_Release(&tokens);
	PyMem_Free(dev);
	PyMem_Free(host);
	return r < 0 ? NULL : Py_BuildValue("(dK)", t1 - t0, (unsigned long long)m.matched_tokens);
}

static PyMethodDef capi_methods[] = {
	{ "alloc_free", capi_alloc_free, METH_VARARGS,
	  "alloc_free(socket, pool, n)\n--\n\nn Alloc(1 page) + Free round trips through the C "
	  "API in one C loop, on a session of its own; returns the seconds taken." },
	{ "match", capi_match, METH_VARARGS,
	  "match(socket, pool, tokens, n)\n--\n\nn unlocked matches of tokens (a uint32 buffer) "
	  "through the C API in one C loop, on a session of its own; returns (seconds taken, "
	  "tokens the last one matched)." },
	{ NULL, NULL, 0, NULL }
};

static struct PyModuleDef capi_module = {
	PyModuleDef_HEAD_INIT,
	"bench_capi",
	"The C API baselines of bench_kvpool.py (a test-only extension).",
	-1,
	capi_methods,
	NULL,
	NULL,
	NULL,
	NULL
};

PyMODINIT_FUNC PyInit_bench_capi(void)
{
	return PyModule_Create(&capi_module);
}
