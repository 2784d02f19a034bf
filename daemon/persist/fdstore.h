/* fdstore.h - the service manager's fd store: kvpoold hands it the memory of its pools
 * (FDSTORE=1 with FDNAME= over $NOTIFY_SOCKET, fds by SCM_RIGHTS) and takes them back at the
 * next start from LISTEN_FDS / LISTEN_FDNAMES (names starting "kvp."), beside the activation
 * socket. systemd does this with FileDescriptorStoreMax= set; a supervisor may do the same. */
#pragma once
#include <stdbool.h>
#include <stddef.h>

#define KVP_FDSTORE_MAX 64

/* Takes every fd passed (LISTEN_PID == this pid) whose name starts with "kvp." into the
 * table, before socket activation looks at the others (kvp_activation_fd skips them). Leaves
 * the environment as it is. Returns how many were taken. */
int kvp_fdstore_take(void);
/* Whether fd was taken by kvp_fdstore_take (still held or handed out). */
bool kvp_fdstore_owns(int fd);
/* The taken fd named name, handed to the caller (who then owns it), or -1. */
int kvp_fdstore_get(const char *name);
/* The taken fd named name still in the table (it stays there), or -1. */
int kvp_fdstore_peek(const char *name);
/* Hands fd (kept open by the caller) to the fd store under name. 0; -ENOTCONN without
 * $NOTIFY_SOCKET (not supervised: nothing is kept); or a negative errno. */
int kvp_fdstore_put(const char *name, int fd);
/* Asks the fd store to drop every fd named name (FDSTOREREMOVE=1). 0 or negative errno. */
int kvp_fdstore_remove(const char *name);
/* Closes, and removes from the store, every taken fd no one got (a pool no longer
 * configured). Returns how many. */
int kvp_fdstore_release_rest(void);
/* The fd name of what ("host", "device", "meta") of pool: "kvp.<pool>.<what>", the pool's
 * name with every character an fd name may not hold (control characters, ':', non-ASCII)
 * written as '_'. */
void kvp_fdstore_name(char *out, size_t cap, const char *pool, const char *what);
