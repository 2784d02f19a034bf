/* log.h - one line per event on stderr, with syslog priority prefixes for journald. */
#pragma once
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
