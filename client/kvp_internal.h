/* kvp_internal.h - libkvpool internals shared with kvpoolctl and kvpool-loadgen (linked
 * statically): the raw call path that hands back the decoded Response. Not installed. */
#pragma once
#include "frame.h"
#include "kvpool.h"
#include "kvpool.pb-c.h"

#define KVP_EXPORT __attribute__((visibility("default")))
#define KVP_CLIENT_MAX_FDS 8

/* Sends req (its id is assigned here) and waits for its Response. On success returns 0 and
 * *resp (free with kvpool__response__free_unpacked); descriptors that came with it are
 * stored in fds (room for KVP_CLIENT_MAX_FDS, *nfds set; caller owns them), or closed when fds
 * is NULL. On failure returns a negative code with err filled, *resp untouched. */
int kvp__call(struct kvp_client *c, Kvpool__Request *req, Kvpool__Response **resp, int *fds,
	      int *nfds, struct kvp_error *err);
/* Fills err from a Status. */
void kvp__status_to_error(const Kvpool__Status *st, struct kvp_error *err);
/* Sets err to a library-side code; returns -code. */
int kvp__fail(struct kvp_error *err, int code, int sys_errno, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
/* The connected socket, for tests that send raw bytes. */
int kvp__client_fd(const struct kvp_client *c);
