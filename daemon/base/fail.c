/* fail.c - typed failures. */
#include "fail.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int kvp_fail(struct kvp_fail *f, enum kvp_err code, const char *fmt, ...)
{
	va_list ap;

	if (f) {
		f->code = code;
		va_start(ap, fmt);
		vsnprintf(f->msg, sizeof(f->msg), fmt, ap);
		va_end(ap);
	}
	return -(int)code;
}

int kvp_fail_limit(struct kvp_fail *f, const char *what, uint64_t limit)
{
	if (f) {
		f->detail = KVP_FAIL_LIMIT;
		snprintf(f->limit.what, sizeof(f->limit.what), "%s", what);
		f->limit.limit = limit;
	}
	return kvp_fail(f, KVP_ERR_LIMIT_EXCEEDED, "too many %s (limit %lu)", what,
			(unsigned long)limit);
}
