/* convert.c - argument conversion of the _kvpool types: tiers, unsigned ints of 32 and 64 bits,
 * and lists of uint32 (tokens, page ids) from lists, tuples, buffers and array-likes; and page
 * ids handed back as a numpy uint32 array or array('I').
 */
#include "module.h"

int tier_from(PyObject *o, const char *what, int *tier)
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

int u32_arg(PyObject *arg, const char *what, uint32_t *out)
{
	unsigned long long v;

	if (uint_arg(arg, what, UINT32_MAX, &v))
		return -1;
	*out = (uint32_t)v;
	return 0;
}

int u64_arg(PyObject *arg, const char *what, uint64_t *out)
{
	unsigned long long v;

	if (uint_arg(arg, what, UINT64_MAX, &v))
		return -1;
	*out = (uint64_t)v;
	return 0;
}

void u32list_done(struct u32list *l)
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

int u32list_from(PyObject *o, const char *what, struct u32list *l)
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
PyObject *pages_out(const uint32_t *p, size_t n)
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
