/* units.h - durations and byte counts as people write and read them, kept once so kvpoold's
 * config, kvpoolctl's flags and both sides' messages agree. */
#pragma once
#include <stddef.h>
#include <stdint.h>

/* Parses a duration: decimal digits, then optional spaces and a unit: "ms", "s", "m" or "h"
 * ("250ms", "30s", "5 m", "1h"). A bare number counts bare_unit_ms milliseconds each (1 for
 * keys and flags named in ms, 1000 for those in seconds). Writes milliseconds to *out_ms.
 * Returns 0, -EINVAL when s is not a duration (empty, a sign, a fraction, an unknown unit), or
 * -ERANGE when it is more than max_ms (also when the digits overflow); *out_ms is untouched on
 * failure. */
int kvp_units_duration_ms(const char *s, uint64_t bare_unit_ms, uint64_t max_ms, uint64_t *out_ms);

/* A byte count for people: "%.2f GB" (10^9) from 0.10 GB up, below that "%.1f MiB", "%.1f KiB"
 * or "%u B", so a small pool never reads "0.00 GB". Returns snprintf's count. */
int kvp_units_bytes(uint64_t bytes, char *buf, size_t len);
