/* log.h - one line per event on stderr, with syslog priority prefixes for journald. */
#pragma once
#include <stdint.h>
#include <syslog.h>

extern int g_log_level;

/* Parses "err", "warning", "notice", "info", "debug" (or a number 0..7). -EINVAL otherwise. */
int kvp_log_level_parse(const char *s);
void kvp_log(int prio, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_err(...) kvp_log(LOG_ERR, __VA_ARGS__)
#define log_warn(...) kvp_log(LOG_WARNING, __VA_ARGS__)
#define log_notice(...) kvp_log(LOG_NOTICE, __VA_ARGS__)
#define log_info(...) kvp_log(LOG_INFO, __VA_ARGS__)
#define log_debug(...) kvp_log(LOG_DEBUG, __VA_ARGS__)

/* A repeated log line, at most one per interval: the first event of an interval is logged at
 * once; the ones after it are counted, and the next line logged (or kvp_log_limit_flush once
 * the interval is over) says how many were left out. Zero-initialised with interval_ms set. */
struct kvp_log_limit {
	uint64_t interval_ms;
	uint64_t last_ms;    /* when the last line was written; 0: never */
	uint64_t suppressed; /* events since then not logged */
	int prio;	     /* of the last event */
	char last[256];	     /* its text, repeated by the flush */
};

/* Lines left out by every limiter so far (for the metrics). */
extern uint64_t g_log_suppressed;

/* Logs fmt at prio through l, at time now (ms, nonzero). */
void kvp_log_limited(struct kvp_log_limit *l, uint64_t now, int prio, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
/* Once l's interval is over with events left out: one line with their count and the last of
 * them. Called from the loop's tick. */
void kvp_log_limit_flush(struct kvp_log_limit *l, uint64_t now);
