/* units.c - duration parsing and byte-count formatting (units.h). */
#include "units.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

int kvp_units_duration_ms(const char *s, uint64_t bare_unit_ms, uint64_t max_ms, uint64_t *out_ms)
{
	static const struct {
		const char *name;
		uint64_t ms;
	} units[] = { { "ms", 1 }, { "s", 1000 }, { "m", 60000 }, { "h", 3600000 } };
	uint64_t x = 0, unit = bare_unit_ms;
	bool big = false;
	const char *p = s;

	if (!s || *p < '0' || *p > '9' || !bare_unit_ms)
		return -EINVAL;
	for (; *p >= '0' && *p <= '9'; p++) {
		if (x > (UINT64_MAX - (uint64_t)(*p - '0')) / 10)
			big = true; /* still read the rest: "99999999999999999999xs" is -EINVAL */
		else
			x = x * 10 + (uint64_t)(*p - '0');
	}
	while (*p == ' ' || *p == '\t')
		p++;
	if (*p) {
		size_t i, n = sizeof(units) / sizeof(units[0]);

		for (i = 0; i < n && strcmp(p, units[i].name) != 0; i++)
			;
		if (i == n)
			return -EINVAL;
		unit = units[i].ms;
	}
	if (big || x > max_ms / unit)
		return -ERANGE;
	*out_ms = x * unit;
	return 0;
}

int kvp_units_bytes(uint64_t bytes, char *buf, size_t len)
{
	if (bytes >= 100000000ull)
		return snprintf(buf, len, "%.2f GB", (double)bytes / 1e9);
	if (bytes >= (1ull << 20))
		return snprintf(buf, len, "%.1f MiB", (double)bytes / (double)(1ull << 20));
	if (bytes >= (1ull << 10))
		return snprintf(buf, len, "%.1f KiB", (double)bytes / (double)(1ull << 10));
	return snprintf(buf, len, "%u B", (unsigned)bytes);
}
