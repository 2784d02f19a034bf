/* below.h - what rpc/'s Match and Fetch ask of a tier below host (the remote tier,
 * remote_tier.h): how many pages after the local ones it holds, and to read them into host
 * pages. A tier answers through callbacks, on the loop thread, and never waits. */
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "index.h" /* struct kvp_key */

/* Pages [from, from + n) of a call in namespace ns: of a token call's tokens (whole pages from
 * page 0, so the page keys chain from the first page), or of a key call's keys[0 ..]. */
struct kvp_below_run {
	uint64_t ns;
	int keyed;
	const uint32_t *tokens;
	const struct kvp_key *keys;
	uint32_t from, n;
};

/* A query's answer: the run's leading pages the tier holds (0 when it timed out). */
typedef void (*kvp_below_held_fn)(void *arg, uint32_t held);
/* A read of page i of the run ended: its bytes are in its host page when ok. */
typedef void (*kvp_below_read_fn)(void *arg, uint32_t i, bool ok);
