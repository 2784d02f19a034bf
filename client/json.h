/* json.h - the one JSON string escaper of the client tools (kvpoolctl, its check-config, and
 * kvpool-loadgen). */
#pragma once
#include <stdio.h>

/* Writes s (NULL: "") to f as a JSON string, quotes included: '"' and '\\' escaped, control
 * characters as \u00XX. */
void kvp_json_str(FILE *f, const char *s);
