/* copy.c - copy_buffer_runs(): the byte runs of a page transfer between an engine's KV tensors
 * and a pool's mapped pages, all in one call, with every run checked against its buffers.
 *
 * The engine adapters move KV pages as many runs of a few KiB to a few MiB (one run per page,
 * layer and K/V where the layouts differ). A Python loop over them, or one numpy copy per
 * tensor, pays a call per run and uses ordinary stores; here the runs are checked once against
 * the buffers' bounds, then copied with the GIL released over a few threads: the transfer is cut
 * into pieces by bytes, each thread takes the next piece left (a thread the scheduler holds back
 * on a busy machine does not hold up the others' share), and copies it with the kernels' run copy
 * (kvp_copy_runs_cpu_part; module.c's copy_runs of raw addresses calls kvp_copy_runs_cpu): a
 * transfer larger than the caches is written with streaming stores.
 *
 * A layer-wise load is one call in groups (ends, done): every layer's runs, each layer a group.
 * The threads are started once for all of them, and the caller's thread, between its pieces,
 * calls done(g) with the GIL for each group whose bytes have all landed, in order, so the engine
 * can run layer g while the threads copy the layers after it.
 */
#include "module.h"

#include <pthread.h>
#include <stdatomic.h>

#include "kv_copy.h"

#define KVPY_COPY_MAX_BUFFERS 4096
#define KVPY_COPY_MAX_THREADS 16
/* a thread takes at least this many bytes */
#define KVPY_COPY_THREAD_MIN (1u << 20)
/* the transfer is cut in about this many pieces a thread, at least KVPY_COPY_THREAD_MIN each */
#define KVPY_COPY_PIECES 8
#define KVPY_RUN_FIELDS 5 /* dst buffer, dst offset, src buffer, src offset, bytes */
/* a transfer copied in groups (ends, done) is cut in pieces of at most this many bytes, so a
 * group that lands is reported within about one piece's copy */
#define KVPY_COPY_GROUP_PIECE (2u << 20)
#define KVPY_COPY_MAX_GROUPS 65536

struct run {
	char *dst;
	const char *src;
	size_t n;
};

/* A transfer its threads share: pieces of piece bytes (the last one shorter), each taken by the
 * next thread free, so a thread the scheduler holds back leaves its pieces to the others.
 *
 * In groups (n_groups > 0): group g is the bytes [gend[g - 1], gend[g]) (gend[-1] = 0), left[g]
 * counts its bytes not copied yet, and the caller's thread reports each group that has landed,
 * in order (done, called with the GIL); stop ends the taking of pieces when a report fails. */
struct work {
	const struct run *runs;
	const size_t *at; /* at[i]: the bytes of runs before run i; at[n_runs]: total */
	size_t n_runs, total, piece, n_pieces;
	atomic_size_t next;
	size_t n_groups;
	const size_t *gend;
	atomic_size_t *left;
	atomic_int stop;
};

/* Piece [from, to) has landed: its bytes come off the groups it covers. */
static void groups_landed(struct work *w, size_t from, size_t to)
{
	size_t lo = 0, hi = w->n_groups;

	while (lo < hi) { /* the first group that ends after from */
		size_t mid = lo + (hi - lo) / 2;

		if (w->gend[mid] <= from)
			lo = mid + 1;
		else
			hi = mid;
	}
	for (size_t g = lo; g < w->n_groups && from < to; g++) {
		size_t e = w->gend[g] < to ? w->gend[g] : to;

		if (e > from)
			atomic_fetch_sub_explicit(&w->left[g], e - from, memory_order_release);
		from = e;
	}
}

/* The runs of piece [from, to) of the transfer as the kernels' lists (dst, src, len); their
 * count. */
static size_t piece_runs(const struct work *w, size_t from, size_t to, uint64_t *dst, uint64_t *src,
			 uint64_t *len)
{
	size_t lo = 0, hi = w->n_runs, k = 0;

	while (lo < hi) { /* the first run that ends after from */
		size_t mid = lo + (hi - lo) / 2;

		if (w->at[mid + 1] <= from)
			lo = mid + 1;
		else
			hi = mid;
	}
	for (size_t i = lo; i < w->n_runs && w->at[i] < to; i++) {
		size_t a = from > w->at[i] ? from - w->at[i] : 0;
		size_t b = (to < w->at[i + 1] ? to : w->at[i + 1]) - w->at[i];

		if (a < b) {
			dst[k] = (uint64_t)(uintptr_t)(w->runs[i].dst + a);
			src[k] = (uint64_t)(uintptr_t)(w->runs[i].src + a);
			len[k++] = b - a;
		}
	}
	return k;
}

/* The next piece no thread has taken, as [*from, *to); 0 when none is left or the transfer
 * was stopped. */
static int take_piece(struct work *w, size_t *from, size_t *to)
{
	size_t p;

	if (atomic_load_explicit(&w->stop, memory_order_relaxed) ||
	    (p = atomic_fetch_add(&w->next, 1)) >= w->n_pieces)
		return 0;
	*from = p * w->piece;
	*to = *from + w->piece < w->total ? *from + w->piece : w->total;
	return 1;
}

/* Copies piece [from, to) with the kernels' run copy (streaming stores when the whole transfer
 * is 4 MiB or more: kvp_copy_runs_cpu_part), v: room for the lists of n_runs + 1 runs (NULL:
 * memcpy run by run), and takes its bytes off the groups. */
static void copy_piece(struct work *w, uint64_t *v, size_t from, size_t to)
{
	size_t m = w->n_runs + 1;

	if (v) {
		size_t k = piece_runs(w, from, to, v, v + m, v + 2 * m);

		kvp_copy_runs_cpu_part(v, v + m, v + 2 * m, k, w->total);
	} else {
		for (size_t i = 0; i < w->n_runs; i++) {
			size_t a = from > w->at[i] ? from - w->at[i] : 0;
			size_t e = to < w->at[i + 1] ? to : w->at[i + 1];

			if (w->at[i] + a < e)
				memcpy(w->runs[i].dst + a, w->runs[i].src + a, e - w->at[i] - a);
		}
	}
	if (w->n_groups)
		groups_landed(w, from, to);
}

/* A thread: pieces until none is left. */
static void *work_run(void *arg)
{
	struct work *w = arg;
	uint64_t *v = malloc(sizeof(uint64_t) * 3 * (w->n_runs + 1));
	size_t from, to;

	while (take_piece(w, &from, &to))
		copy_piece(w, v, from, to);
	free(v);
	return NULL;
}

/* The caller's side of a transfer in groups: done(g) (with the GIL) for each group from *next
 * on that has landed, in order, up to the first that has not. Returns 0, or -1 with the
 * exception of a done that failed (w->stop set). */
static int report_groups(struct work *w, size_t *next, PyObject *done, PyThreadState **ts)
{
	while (*next < w->n_groups &&
	       atomic_load_explicit(&w->left[*next], memory_order_acquire) == 0) {
		PyObject *r;

		PyEval_RestoreThread(*ts);
		r = PyObject_CallFunction(done, "n", (Py_ssize_t)*next);
		Py_XDECREF(r);
		*ts = PyEval_SaveThread();
		if (!r) {
			atomic_store(&w->stop, 1);
			return -1;
		}
		(*next)++;
	}
	return 0;
}

/* Copies the runs over threads threads (fewer when they would get under THREAD_MIN bytes
 * each), in pieces the threads take in turn; the caller's thread is one of them, and one that
 * cannot be started leaves its pieces to the others. at: n_runs + 1 offsets (see struct
 * work). Called without the GIL (*ts: the caller's thread state). In groups (gend, n_groups >
 * 0, left: each group's bytes, counted down as they land), done(g) is called for each group as it
 * lands, in order: the caller's thread reports between its pieces, and the rest once the others are
 * joined. Returns 0, or -1 with the exception of a done that failed (no piece is taken after it).
 */
static int copy_all(const struct run *runs, const size_t *at, size_t n_runs, size_t total,
		    int threads, const size_t *gend, atomic_size_t *left, size_t n_groups,
		    PyObject *done, PyThreadState **ts)
{
	pthread_t tid[KVPY_COPY_MAX_THREADS];
	int started[KVPY_COPY_MAX_THREADS] = { 0 };
	struct work w = { .runs = runs,
			  .at = at,
			  .n_runs = n_runs,
			  .total = total,
			  .n_groups = n_groups,
			  .gend = gend,
			  .left = left };
	size_t next_report = 0, from, to;
	uint64_t *v;
	int rc;

	if ((size_t)threads > total / KVPY_COPY_THREAD_MIN)
		threads = (int)(total / KVPY_COPY_THREAD_MIN);
	if (threads < 1)
		threads = 1;
	w.piece = total / ((size_t)threads * KVPY_COPY_PIECES);
	if (w.piece < KVPY_COPY_THREAD_MIN)
		w.piece = KVPY_COPY_THREAD_MIN;
	if (n_groups && w.piece > KVPY_COPY_GROUP_PIECE)
		w.piece = KVPY_COPY_GROUP_PIECE;
	w.piece = (w.piece + 63) & ~(size_t)63; /* whole 64-byte steps of the streamed copy */
	w.n_pieces = total ? (total + w.piece - 1) / w.piece : 0;
	atomic_init(&w.next, 0);
	atomic_init(&w.stop, 0);
	for (int k = 1; k < threads; k++)
		started[k] = pthread_create(&tid[k], NULL, work_run, &w) == 0;
	/* the caller's pieces, the groups landed (none without groups) reported between them,
	 * leading empty groups first */
	v = malloc(sizeof(uint64_t) * 3 * (n_runs + 1));
	rc = report_groups(&w, &next_report, done, ts);
	while (!rc && take_piece(&w, &from, &to)) {
		copy_piece(&w, v, from, to);
		rc = report_groups(&w, &next_report, done, ts);
	}
	free(v);
	for (int k = 1; k < threads; k++) {
		if (started[k])
			pthread_join(tid[k], NULL);
	}
	return rc ? rc : report_groups(&w, &next_report, done, ts);
}

/* Gets a buffer of each item of seq (writable ones for dst) into *out, an array of as many as
 * seq holds (PyMem_Free it). Returns the count, or -1 with an exception set (nothing held). */
static Py_ssize_t get_buffers(PyObject *seq, Py_buffer **out, int writable, const char *what)
{
	PyObject *items =
		PySequence_Tuple(seq); /* the items as they are now, however seq changes */
	Py_ssize_t n;

	*out = NULL;
	if (!items)
		return -1;
	n = PyTuple_Size(items);
	if (n == 0 || n > KVPY_COPY_MAX_BUFFERS) {
		PyErr_Format(PyExc_ValueError, "copy_buffer_runs: %s: 1 to %d buffers, not %zd",
			     what, KVPY_COPY_MAX_BUFFERS, n);
		Py_DECREF(items);
		return -1;
	}
	*out = PyMem_Calloc((size_t)n, sizeof(**out));
	if (!*out) {
		PyErr_NoMemory();
		Py_DECREF(items);
		return -1;
	}
	for (Py_ssize_t i = 0; i < n; i++) {
		if (PyObject_GetBuffer(PyTuple_GetItem(items, i), &(*out)[i],
				       writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0) {
			for (Py_ssize_t j = 0; j < i; j++)
				PyBuffer_Release(&(*out)[j]);
			PyMem_Free(*out);
			*out = NULL;
			Py_DECREF(items);
			return -1;
		}
	}
	Py_DECREF(items);
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
			     Py_ssize_t ns, size_t *n_runs, size_t **at, size_t *total)
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
	*at = PyMem_Malloc((n + 1) * sizeof(**at));
	if (!runs || !*at) {
		PyMem_Free(runs);
		PyMem_Free(*at);
		*at = NULL;
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
			PyMem_Free(*at);
			*at = NULL;
			return NULL;
		}
		(*at)[i] = *total;
		runs[i] = (struct run){ .dst = (char *)dst[v[0]].buf + v[1],
					.src = (const char *)src[v[2]].buf + v[3],
					.n = (size_t)v[4] };
		*total += (size_t)v[4];
	}
	(*at)[n] = *total;
	*n_runs = n;
	return runs;
}

/* The byte ends of the groups of ends_obj (a sequence of run counts: group g is runs
 * [ends[g - 1], ends[g]), ends[-1] = 0, ascending, the last one n_runs) into *gend, and each
 * group's bytes into its counter in *left (PyMem_Free both). Returns the number of groups, or -1
 * with an exception set. */
static Py_ssize_t make_groups(PyObject *ends_obj, const size_t *at, size_t n_runs, size_t **gend,
			      atomic_size_t **left)
{
	PyObject *ends = PySequence_Tuple(ends_obj);
	Py_ssize_t n, prev = 0;

	*gend = NULL;
	*left = NULL;
	if (!ends)
		return -1;
	n = PyTuple_Size(ends);
	if (n < 1 || n > KVPY_COPY_MAX_GROUPS) {
		PyErr_Format(PyExc_ValueError, "copy_buffer_runs: ends: 1 to %d groups, not %zd",
			     KVPY_COPY_MAX_GROUPS, n);
		goto fail;
	}
	*gend = PyMem_Malloc((size_t)n * sizeof(**gend));
	*left = PyMem_Malloc((size_t)n * sizeof(**left));
	if (!*gend || !*left) {
		PyErr_NoMemory();
		goto fail;
	}
	for (Py_ssize_t g = 0; g < n; g++) {
		Py_ssize_t e = PyLong_AsSsize_t(PyTuple_GetItem(ends, g));

		if (e == -1 && PyErr_Occurred())
			goto fail;
		if (e < prev || (size_t)e > n_runs || (g == n - 1 && (size_t)e != n_runs)) {
			PyErr_Format(PyExc_ValueError,
				     "copy_buffer_runs: ends must ascend from 0 to the %zu runs; "
				     "end %zd is %zd",
				     n_runs, g, e);
			goto fail;
		}
		(*gend)[g] = at[e];
		atomic_init(&(*left)[g], at[e] - at[prev]);
		prev = e;
	}
	Py_DECREF(ends);
	return n;
fail:
	Py_DECREF(ends);
	PyMem_Free(*gend);
	PyMem_Free(*left);
	*gend = NULL;
	*left = NULL;
	return -1;
}

PyObject *kvpy_copy_buffer_runs(PyObject *mod, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "dst", "src", "runs", "threads", "ends", "done", NULL };
	PyObject *dsts, *srcs, *runs_obj, *ends_obj = Py_None, *done = Py_None;
	int threads = 1, rc;
	Py_buffer *dst = NULL, *src = NULL, rb;
	Py_ssize_t nd = 0, ns = 0, n_groups = 0;
	struct run *runs = NULL;
	size_t n_runs = 0, total = 0, *at = NULL, *gend = NULL;
	atomic_size_t *left = NULL;
	PyThreadState *ts;
	PyObject *ret = NULL;

	(void)mod;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|i$OO", kwlist, &dsts, &srcs, &runs_obj,
					 &threads, &ends_obj, &done))
		return NULL;
	if (threads < 1 || threads > KVPY_COPY_MAX_THREADS)
		return PyErr_Format(PyExc_ValueError,
				    "copy_buffer_runs: threads must be 1 to %d, not %d",
				    KVPY_COPY_MAX_THREADS, threads);
	if ((ends_obj == Py_None) != (done == Py_None) ||
	    (done != Py_None && !PyCallable_Check(done))) {
		PyErr_SetString(PyExc_TypeError,
				"copy_buffer_runs: ends and done come together, done a callable");
		return NULL;
	}
	if (PyObject_GetBuffer(runs_obj, &rb, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
		goto out;
	if ((nd = get_buffers(dsts, &dst, 1, "dst")) < 0 ||
	    (ns = get_buffers(srcs, &src, 0, "src")) < 0) {
		nd = nd < 0 ? 0 : nd;
		ns = 0;
		PyBuffer_Release(&rb);
		goto out;
	}
	runs = make_runs(&rb, dst, nd, src, ns, &n_runs, &at, &total);
	PyBuffer_Release(&rb);
	if (!runs)
		goto out;
	if (ends_obj != Py_None && (n_groups = make_groups(ends_obj, at, n_runs, &gend, &left)) < 0)
		goto out;
	ts = PyEval_SaveThread();
	rc = copy_all(runs, at, n_runs, total, threads, gend, left, (size_t)n_groups, done, &ts);
	PyEval_RestoreThread(ts);
	if (rc == 0)
		ret = PyLong_FromSize_t(total);
out:
	PyMem_Free(runs);
	PyMem_Free(at);
	PyMem_Free(gend);
	PyMem_Free(left);
	if (dst)
		release_buffers(dst, nd);
	if (src)
		release_buffers(src, ns);
	PyMem_Free(dst);
	PyMem_Free(src);
	return ret;
}
