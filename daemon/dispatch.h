/* dispatch.h - RPC dispatch: a table indexed by the Request's oneof case. */
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "daemon.h"
#include "kvpool.pb-c.h"

#define KVP_REPLY_MAX_FDS 4

/* Bytes of reply pieces held inside struct kvp_reply: the messages of every small reply. */
#define KVP_REPLY_INLINE 1024

/* A reply under construction: every allocation it makes is freed by kvp_reply_release. */
struct kvp_reply {
	Kvpool__Response resp;
	Kvpool__Status status;
	void **allocs;
	size_t nallocs, capallocs;
	int fds[KVP_REPLY_MAX_FDS]; /* borrowed (the pools own them): sent, never closed */
	int nfds;
	bool close_after; /* the connection ends once this reply is sent */
	/* kvp_reply_alloc serves small pieces from here, malloc only beyond it. A reply is
	 * never copied: pointers into it point here. Stays last (init does not clear it). */
	size_t inl_used;
	_Alignas(max_align_t) unsigned char inl[KVP_REPLY_INLINE];
};

void kvp_reply_init(struct kvp_reply *r, uint64_t id);
void kvp_reply_release(struct kvp_reply *r);
/* Zeroed memory that lives as long as the reply; NULL on ENOMEM. */
void *kvp_reply_alloc(struct kvp_reply *r, size_t n);
/* Fills r->status from a typed failure. */
void kvp_reply_fail(struct kvp_reply *r, const struct kvp_fail *f);

/* Serves one decoded request of session s into r (never fails: errors become a Status).
 * Returns the Code of the answer. */
int kvp_dispatch(struct kvp_daemon *d, struct kvp_session *s, const Kvpool__Request *req,
		 struct kvp_reply *r);
/* Renders the Prometheus text exposition of d into a malloc'ed string (metrics.c). */
char *kvp_metrics_render(const struct kvp_daemon *d);
