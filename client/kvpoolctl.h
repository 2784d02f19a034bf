/* kvpoolctl.h - the kvpoolctl commands that live in files of their own. Each returns an exit
 * status (0 success, 1 refused, 2 usage, 3 no kvpoold or no publisher reachable). */
#pragma once
#include "kvpool.h"

/* kvpoolctl events ENDPOINT [--topic T] [--replay ENDPOINT [--from SEQ | --snapshot]]
 * [--count N] [--timeout MS]: kvpoold's KV events as readable lines (json: one object a line). */
int kvp_ctl_events(int argc, char **argv, int json);
/* kvpoolctl top [--interval MS] [--count N]: pools, tiers, hit rates and the busiest sessions,
 * refreshed in place on a terminal; printed once when stdout is not one (or --count 1). */
int kvp_ctl_top(struct kvp_client *c, int argc, char **argv);
