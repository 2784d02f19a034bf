/* fault.h - failure injection for tests. KVPOOLD_FAULTS="site:N[:MAX][,...]" makes every Nth
 * pass through a site (at most MAX times) fail the way its allocation or system call can fail,
 * so the tests can show that each failure ends as a typed error or a closed connection while
 * kvpoold serves everyone else and leaks nothing. Unset (always, outside tests), a site costs
 * one branch. */
#pragma once
#include <stdbool.h>
#include <stddef.h>

enum kvp_fault_site {
	KVP_FAULT_REPLY_QUEUE, /* "reply_queue": the buffer for a connection's replies */
	KVP_FAULT_REPLY_ALLOC, /* "reply_alloc": a piece of a reply (the call fails INTERNAL) */
	KVP_FAULT_PIDFD,       /* "pidfd": pidfd_open of a new peer */
	KVP_FAULT_SITES,
};

/* Reads KVPOOLD_FAULTS. Returns 0, or -1 with a message in err for a malformed value. */
int kvp_fault_init(char *err, size_t errlen);
/* Whether this pass through site s fails. */
bool kvp_fault_hit(enum kvp_fault_site s);
