/* fault.h - failure injection for tests. KVPOOLD_FAULTS="site:N[:MAX][,...]" makes every Nth
 * pass through a site (at most MAX times) fail the way its allocation or system call can fail,
 * so the tests can show that each failure ends as a typed error or a closed connection while
 * kvpoold serves everyone else and leaks nothing. Sites count passes, not calls: a lease's
 * creation passes "lease" twice (the lease, its page list), so "lease:2" fails every Alloc.
 * Pool creation passes no site. Unset (always, outside tests), a site costs one branch. */
#pragma once
#include <stdbool.h>
#include <stddef.h>

enum kvp_fault_site {
	KVP_FAULT_REPLY_QUEUE, /* "reply_queue": the buffer for a connection's replies */
	KVP_FAULT_REPLY_ALLOC, /* "reply_alloc": a piece of a reply (the call fails INTERNAL) */
	KVP_FAULT_PIDFD,   /* "pidfd": a new peer's pidfd, both ways (SO_PEERPIDFD, pidfd_open) */
	KVP_FAULT_CONN,	   /* "conn": the state of an accepted connection */
	KVP_FAULT_SESSION, /* "session": a new peer's session */
	KVP_FAULT_INPUT,   /* "input": adding received bytes to a connection's input */
	KVP_FAULT_DECODE,  /* "decode": a decoded request's spill beyond the arena */
	KVP_FAULT_LEASE,   /* "lease": a lease and its page list */
	KVP_FAULT_IDMAP,   /* "idmap": growing a session's lease or lock table */
	KVP_FAULT_LOCK,	   /* "lock": the lock a Match takes */
	KVP_FAULT_PREFIX,  /* "prefix": prefix-tree memory, an Insert's page list */
	KVP_FAULT_PEER_PIDFD, /* "peer_pidfd": SO_PEERPIDFD alone (pidfd_open is the fallback) */
	KVP_FAULT_SQE,	      /* "sqe": a submission queue entry (the ring is full) */
	KVP_FAULT_ACCEPT,     /* "accept": an accepted socket, failed as EMFILE (and closed) */
	KVP_FAULT_NOTICE,     /* "notice": queueing a pressure notice (as reply_queue fails) */
	KVP_FAULT_SNAPSHOT,   /* "snapshot": growing a pool's books' memfd (ENOMEM) */
	KVP_FAULT_DISK_IO,    /* "disk_io": a disk tier read or write completes with EIO */
	KVP_FAULT_SITES,
};

/* p = KVP_FAULT_OR(site, malloc(n)): NULL, without calling the allocator, when this pass
 * through site fails. */
#define KVP_FAULT_OR(site, alloc) (kvp_fault_hit(site) ? NULL : (alloc))

/* Reads KVPOOLD_FAULTS. Returns 0, or -1 with a message in err for a malformed value. */
int kvp_fault_init(char *err, size_t errlen);
/* Whether KVPOOLD_FAULTS armed any site. */
bool kvp_fault_armed(void);
/* Whether this pass through site s fails. */
bool kvp_fault_hit(enum kvp_fault_site s);
