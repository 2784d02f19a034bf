/* bench.h - helpers shared by the benchmarks in tests/bench: clock, machine line, options and
 * the one-JSON-line-per-row output that scripts/bench.sh aggregates.
 *
 * Every row compares kvpool's figure with a baseline measured in the same process run, so that
 * the ratio means something on noisy machines. Benchmarks report; they never fail on speed. */
#pragma once
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

static inline uint64_t b_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline double b_now_s(void)
{
	return (double)b_now_ns() / 1e9;
}

/* Keeps the compiler from dropping a computation whose result is otherwise unused. */
static inline void b_use(const void *p)
{
	__asm__ __volatile__("" : : "r"(p) : "memory");
}

/* Whether --quick is among the arguments (a short smoke run of every row). */
static inline int b_quick(int argc, char **argv)
{
	for (int i = 1; i < argc; i++)
		if (!strcmp(argv[i], "--quick"))
			return 1;
	return getenv("KVP_BENCH_QUICK") && !strcmp(getenv("KVP_BENCH_QUICK"), "1");
}

/* --only=SUBSTRING: run only the rows whose name contains it (profiling one row); NULL: all. */
static inline const char *b_only(int argc, char **argv)
{
	for (int i = 1; i < argc; i++)
		if (!strncmp(argv[i], "--only=", 7))
			return argv[i] + 7;
	return NULL;
}

static inline int b_wanted(const char *only, const char *name)
{
	return !only || strstr(name, only) != NULL;
}

static inline void b_json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s; s++) {
		if (*s == '"' || *s == '\\')
			fprintf(f, "\\%c", *s);
		else if ((unsigned char)*s < 0x20)
			fprintf(f, "\\u%04x", *s);
		else
			fputc(*s, f);
	}
	fputc('"', f);
}

static inline void b_json_num(FILE *f, double v, int valid)
{
	if (!valid || v != v)
		fputs("null", f);
	else
		fprintf(f, "%.6g", v);
}

/* One result row, printed as one JSON line on stdout:
 *   name, params (a JSON object text, "{}" when none), machine {nproc, kernel},
 *   baseline (number or null) and baseline_what (what it is), value, unit,
 *   ratio = value / baseline (null when either is missing), target (text) and note (text).
 * have_base / have_value say whether baseline / value exist (a skipped row has neither). */
struct b_row {
	const char *name;
	const char *params; /* JSON object text */
	const char *baseline_what;
	double baseline;
	int have_base;
	double value;
	int have_value;
	const char *unit;
	const char *target;
	const char *note;
};

static inline void b_row_print(const struct b_row *r)
{
	struct utsname u;
	int ratio_ok = r->have_base && r->have_value && r->baseline != 0;

	uname(&u);
	printf("{\"name\":");
	b_json_str(stdout, r->name);
	printf(",\"params\":%s,\"machine\":{\"nproc\":%ld,\"kernel\":",
	       r->params ? r->params : "{}", sysconf(_SC_NPROCESSORS_ONLN));
	b_json_str(stdout, u.release);
	printf("},\"baseline\":");
	b_json_num(stdout, r->baseline, r->have_base);
	printf(",\"baseline_what\":");
	b_json_str(stdout, r->baseline_what ? r->baseline_what : "");
	printf(",\"value\":");
	b_json_num(stdout, r->value, r->have_value);
	printf(",\"unit\":");
	b_json_str(stdout, r->unit ? r->unit : "");
	printf(",\"ratio\":");
	b_json_num(stdout, ratio_ok ? r->value / r->baseline : 0, ratio_ok);
	printf(",\"target\":");
	b_json_str(stdout, r->target ? r->target : "");
	printf(",\"note\":");
	b_json_str(stdout, r->note ? r->note : "");
	printf("}\n");
	fflush(stdout);
}

/* snprintf into a static rotating buffer, for params objects. */
static inline const char *b_fmt(const char *fmt, ...)
{
	static char bufs[8][512];
	static int i;
	char *b = bufs[i++ & 7];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(b, sizeof(bufs[0]), fmt, ap);
	va_end(ap);
	return b;
}

static int b_cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* The q-quantile (0..1) of n samples; sorts them. */
static inline uint64_t b_quantile(uint64_t *v, size_t n, double q)
{
	size_t i;

	if (!n)
		return 0;
	qsort(v, n, sizeof(*v), b_cmp_u64);
	i = (size_t)(q * (double)(n - 1) + 0.5);
	return v[i < n ? i : n - 1];
}

/* Fails the benchmark (exit 1): errors are failures, speed never is. */
#define B_DIE(...)                                                                                 \
	do {                                                                                       \
		fprintf(stderr, "bench: " __VA_ARGS__);                                            \
		fputc('\n', stderr);                                                               \
		exit(1);                                                                           \
	} while (0)
