/* log.c - stderr logging with <N> priority prefixes (sd-daemon(3) style). */
#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int g_log_level = LOG_INFO;

int kvp_log_level_parse(const char *s)
{
	static const char *const names[] = { "emerg",	"alert",  "crit", "err",
					     "warning", "notice", "info", "debug" };
	char *end;
	long v;

	for (int i = 0; i < 8; i++)
		if (strcmp(s, names[i]) == 0)
			return i;
	if (strcmp(s, "error") == 0)
		return LOG_ERR;
	if (strcmp(s, "warn") == 0)
		return LOG_WARNING;
	v = strtol(s, &end, 10);
	if (*s && !*end && v >= 0 && v <= 7)
		return (int)v;
	return -EINVAL;
}

void kvp_log(int prio, const char *fmt, ...)
{
	char line[1024];
	va_list ap;
	int n;

	if (prio > g_log_level)
		return;
	n = snprintf(line, sizeof(line), "<%d>", prio);
	va_start(ap, fmt);
	vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	/* One write per line so lines of concurrent processes do not interleave. */
	n = (int)strlen(line);
	line[n++] = '\n';
	fwrite(line, 1, (size_t)n, stderr);
	fflush(stderr);
}

uint64_t g_log_suppressed;

static void limit_emit(struct kvp_log_limit *l, uint64_t now)
{
	if (l->suppressed)
		kvp_log(l->prio, "%s (and %lu more like it in the last %lu ms)", l->last,
			(unsigned long)l->suppressed, (unsigned long)(now - l->last_ms));
	else
		kvp_log(l->prio, "%s", l->last);
	l->suppressed = 0;
	l->last_ms = now ? now : 1;
}

void kvp_log_limited(struct kvp_log_limit *l, uint64_t now, int prio, const char *fmt, ...)
{
	va_list ap;

	if (prio > g_log_level)
		return;
	va_start(ap, fmt);
	vsnprintf(l->last, sizeof(l->last), fmt, ap);
	va_end(ap);
	l->prio = prio;
	if (l->last_ms && now - l->last_ms < l->interval_ms) {
		l->suppressed++;
		g_log_suppressed++;
		return;
	}
	limit_emit(l, now);
}

void kvp_log_limit_flush(struct kvp_log_limit *l, uint64_t now)
{
	if (l->suppressed && now - l->last_ms >= l->interval_ms)
		limit_emit(l, now);
}
