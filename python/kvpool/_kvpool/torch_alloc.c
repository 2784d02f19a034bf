/* torch_alloc.c - the malloc and free that torch's CUDAPluggableAllocator loads from this module
 * by name (kvp_torch_malloc, kvp_torch_free: exported, beside PyInit__kvpool), and
 * set_torch_allocator, which names the Python callables they call (kvpool.vllm_mem: a run lease
 * of a pool's cuda device tier, mapped as one buffer). Without callables set, malloc answers
 * NULL (torch raises its out-of-memory error) and free does nothing.
 */
#include "module.h"

#include <sys/types.h>

static PyObject *g_torch_malloc, *g_torch_free; /* the callables, or NULL */

PyObject *torch_set_allocator(PyObject *mod, PyObject *args)
{
	PyObject *m, *f;

	(void)mod;
	if (!PyArg_ParseTuple(args, "OO:set_torch_allocator", &m, &f))
		return NULL;
	if ((m != Py_None && !PyCallable_Check(m)) || (f != Py_None && !PyCallable_Check(f))) {
		PyErr_SetString(PyExc_TypeError,
				"set_torch_allocator(): malloc and free must be callables or None");
		return NULL;
	}
	Py_XDECREF(g_torch_malloc);
	Py_XDECREF(g_torch_free);
	g_torch_malloc = m == Py_None ? NULL : (Py_INCREF(m), m);
	g_torch_free = f == Py_None ? NULL : (Py_INCREF(f), f);
	Py_RETURN_NONE;
}

/* torch's signature: void *(ssize_t size, int device, cudaStream_t stream). An exception of the
 * callable is reported as unraisable and answers NULL. */
__attribute__((visibility("default"))) void *kvp_torch_malloc(ssize_t size, int device,
							      void *stream)
{
	PyGILState_STATE g = PyGILState_Ensure();
	void *ptr = NULL;
	PyObject *r;

	if (g_torch_malloc) {
		r = PyObject_CallFunction(g_torch_malloc, "niK", (Py_ssize_t)size, device,
					  (unsigned long long)(uintptr_t)stream);
		if (r && r != Py_None)
			ptr = PyLong_AsVoidPtr(r);
		Py_XDECREF(r);
		if (PyErr_Occurred()) {
			PyErr_WriteUnraisable(g_torch_malloc);
			ptr = NULL;
		}
	}
	PyGILState_Release(g);
	return ptr;
}

/* torch's signature: void (void *ptr, ssize_t size, int device, cudaStream_t stream). */
__attribute__((visibility("default"))) void kvp_torch_free(void *ptr, ssize_t size, int device,
							   void *stream)
{
	PyGILState_STATE g = PyGILState_Ensure();
	PyObject *r;

	if (g_torch_free) {
		r = PyObject_CallFunction(g_torch_free, "KniK", (unsigned long long)(uintptr_t)ptr,
					  (Py_ssize_t)size, device,
					  (unsigned long long)(uintptr_t)stream);
		Py_XDECREF(r);
		if (PyErr_Occurred())
			PyErr_WriteUnraisable(g_torch_free);
	}
	PyGILState_Release(g);
}
