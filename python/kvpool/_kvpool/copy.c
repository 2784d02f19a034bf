/* copy.c - copy_buffer_runs(): the byte runs of a page transfer between an engine's KV tensors
 * and a pool's mapped pages, all in one call, with every run checked against its buffers.
 *
 * The engine adapters move KV pages as many runs of a few KiB to a few MiB (one run per page,
 * layer and K/V where the layouts differ). A Python loop over them, or one numpy copy per
 * tensor, pays a call per run and uses ordinary stores; here the runs are checked once against
 * the buffers' bounds, then copied with the GIL released, split by bytes over a few threads,
 * each share by the kernels' run copy (kvp_copy_runs_cpu, which module.c's copy_runs of raw
 * addresses calls too): a share larger than the caches is written with streaming stores.
 */
#include "module.h"

#include <pthread.h>

#include "kv_copy.h"

#define KVPY_COPY_MAX_BUFFERS 4096
#define KVPY_COPY_MAX_THREADS 16
/* a thread takes at least this many bytes */
#define KVPY_COPY_THREAD_MIN (1u << 20)
#define KVPY_RUN_FIELDS 5 /* dst buffer, dst offset, src buffer, src offset, bytes */

struct run {
	char *dst;
	const char *src;
	size_t n;
};

struct part {
	const struct run *runs;
	size_t n_runs;
	size_t from, to; /* bytes of the whole transfer this thread copies */
};

/* A thread's share: the byte range [from, to) of the transfer, cut from the runs and copied by
 * the kernels' run copy (kvp_copy_runs_cpu: streaming stores for a share of 4 MiB or more). */
static void *part_run(void *arg)
{
	const struct part *p = arg;
	uint64_t *v = malloc(sizeof(uint64_t) * 3 * (p->n_runs + 1));
	uint64_t *dst = v, *src = v ? v + p->n_runs : NULL, *len = v ? v + 2 * p->n_runs : NULL;
	size_t at = 0, k = 0;

	for (size_t i = 0; i < p->n_runs && at < p->to; i++) {
		const struct run *r = &p->runs[i];
		size_t lo = p->from > at ? p->from - at : 0;
		size_t hi = p->to - at < r->n ? p->to - at : r->n;

		if (lo < hi && v) {
			dst[k] = (uint64_t)(uintptr_t)(r->dst + lo);
			src[k] = (uint64_t)(uintptr_t)(r->src + lo);
			len[k++] = hi - lo;
		} else if (lo < hi) { /* no memory for the lists: run by run */
			memcpy(r->dst + lo, r->src + lo, hi - lo);
		}
		at += r->n;
	}
	if (k)
		kvp_copy_runs_cpu(dst, src, len, k);
	free(v);
	return NULL;
}

/* Copies the runs over threads threads (fewer when they would get under THREAD_MIN bytes
 * each); a thread that cannot be started leaves its part to the caller's thread. */
static void copy_all(const struct run *runs, size_t n_runs, size_t total, int threads)
{
	struct part parts[KVPY_COPY_MAX_THREADS];
	pthread_t tid[KVPY_COPY_MAX_THREADS];
	int started[KVPY_COPY_MAX_THREADS] = { 0 };

	if ((size_t)threads > total / KVPY_COPY_THREAD_MIN)
		threads = (int)(total / KVPY_COPY_THREAD_MIN);
	if (threads < 1)
		threads = 1;
	for (int k = 0; k < threads; k++) {
		parts[k] = (struct part){
			.runs = runs,
			.n_runs = n_runs,
			.from = total / (size_t)threads * (size_t)k,
			.to = k == threads - 1 ? total : total / (size_t)threads * (size_t)(k + 1),
		};
	}
	for (int k = 1; k < threads; k++)
		started[k] = pthread_create(&tid[k], NULL, part_run, &parts[k]) == 0;
	part_run(&parts[0]);
	for (int k = 1; k < threads; k++) {
		if (started[k])
			pthread_join(tid[k], NULL);
		else
			part_run(&parts[k]);
	}
}

/* Gets a buffer of each item of seq (writable ones for dst). Returns the count, or -1 with an
 * exception set (the buffers got so far released). */
static Py_ssize_t get_buffers(PyObject *seq, Py_buffer *out, int writable, const char *what)
{
	Py_ssize_t n = PySequence_Size(seq);

	if (n < 0)
		return -1;
	if (n == 0 || n > KVPY_COPY_MAX_BUFFERS) {
		PyErr_Format(PyExc_ValueError, "copy_buffer_runs: %s: 1 to %d buffers, not %zd",
			     what, KVPY_COPY_MAX_BUFFERS, n);
		return -1;
	}
	for (Py_ssize_t i = 0; i < n; i++) {
		PyObject *o = PySequence_GetItem(seq, i);
		int r;

		if (!o) {
			r = -1;
		} else {
			r = PyObject_GetBuffer(o, &out[i],
					       writable ? PyBUF_WRITABLE : PyBUF_SIMPLE);
			Py_DECREF(o);
		}
		if (r < 0) {
			for (Py_ssize_t j = 0; j < i; j++)
				PyBuffer_Release(&out[j]);
			return -1;
		}
	}
	return n;
}

static void release_buffers(Py_buffer *b, Py_ssize_t n)
{
	for (Py_ssize_t i = 0; i < n; i++)
		PyBuffer_Release(&b[i]);
}

/* The runs of the int64 table rb ([n, 5]) checked against the buffers; NULL with an exception
 * set. */
static struct run *make_runs(const Py_buffer *rb, Py_buffer *dst, Py_ssize_t nd, Py_buffer *src,
			     Py_ssize_t ns, size_t *n_runs, size_t *total)
{
	const char *f = rb->format ? rb->format : "B";
	size_t n;
	struct run *runs;

	if (*f == '<' || *f == '=' || *f == '@')
		f++;
	if (rb->itemsize != 8 || (strcmp(f, "q") && strcmp(f, "l")) ||
	    rb->len % (KVPY_RUN_FIELDS * 8)) {
		PyErr_SetString(
			PyExc_ValueError,
			"copy_buffer_runs: runs must be int64 rows of (dst buffer, dst offset, src "
			"buffer, src offset, bytes)");
		return NULL;
	}
	n = (size_t)rb->len / (KVPY_RUN_FIELDS * 8);
	runs = PyMem_Malloc((n ? n : 1) * sizeof(*runs));
	if (!runs) {
		PyErr_NoMemory();
		return NULL;
	}
	*total = 0;
	for (size_t i = 0; i < n; i++) {
		int64_t v[KVPY_RUN_FIELDS];

		memcpy(v, (const char *)rb->buf + i * sizeof(v), sizeof(v));
		if (v[0] < 0 || v[0] >= nd || v[2] < 0 || v[2] >= ns || v[1] < 0 || v[3] < 0 ||
		    v[4] < 0 || v[1] > dst[v[0]].len - v[4] || v[3] > src[v[2]].len - v[4]) {
			PyErr_Format(
				PyExc_ValueError,
				"copy_buffer_runs: run %zu (%lld, %lld, %lld, %lld, %lld) is outside "
				"its buffers",
				i, (long long)v[0], (long long)v[1], (long long)v[2],
				(long long)v[3], (long long)v[4]);
			PyMem_Free(runs);
			return NULL;
		}
		runs[i] = (struct run){ .dst = (char *)dst[v[0]].buf + v[1],
					.src = (const char *)src[v[2]].buf + v[3],
					.n = (size_t)v[4] };
		*total += (size_t)v[4];
	}
	*n_runs = n;
	return runs;
}

PyObject *kvpy_copy_buffer_runs(PyObject *mod, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "dst", "src", "runs", "threads", NULL };
	PyObject *dsts, *srcs, *runs_obj;
	int threads = 1;
	Py_buffer *dst = NULL, *src = NULL, rb;
	Py_ssize_t nd = 0, ns = 0;
	struct run *runs = NULL;
	size_t n_runs = 0, total = 0;
	PyObject *ret = NULL;

	(void)mod;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|i", kwlist, &dsts, &srcs, &runs_obj,
					 &threads))
		return NULL;
	if (threads < 1 || threads > KVPY_COPY_MAX_THREADS)
		return PyErr_Format(PyExc_ValueError,
				    "copy_buffer_runs: threads must be 1 to %d, not %d",
				    KVPY_COPY_MAX_THREADS, threads);
	dst = PyMem_Calloc(KVPY_COPY_MAX_BUFFERS, sizeof(*dst));
	src = PyMem_Calloc(KVPY_COPY_MAX_BUFFERS, sizeof(*src));
	if (!dst || !src) {
		PyErr_NoMemory();
		goto out;
	}
	if (PyObject_GetBuffer(runs_obj, &rb, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
		goto out;
	if ((nd = get_buffers(dsts, dst, 1, "dst")) < 0 ||
	    (ns = get_buffers(srcs, src, 0, "src")) < 0) {
		nd = nd < 0 ? 0 : nd;
		ns = 0;
		PyBuffer_Release(&rb);
		goto out;
	}
	runs = make_runs(&rb, dst, nd, src, ns, &n_runs, &total);
	PyBuffer_Release(&rb);
	if (!runs)
		goto out;
	KVPY_WAIT(copy_all(runs, n_runs, total, threads));
	ret = PyLong_FromSize_t(total);
out:
	PyMem_Free(runs);
	if (dst)
		release_buffers(dst, nd);
	if (src)
		release_buffers(src, ns);
	PyMem_Free(dst);
	PyMem_Free(src);
	return ret;
}
