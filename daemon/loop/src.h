/* src.h - loop sources: what an io_uring completion belongs to. Every SQE kvpoold submits
 * carries a pointer to a struct kvp_src as its user_data; the loop calls that source's handler
 * with the completion. A new kind of fd (a worker's eventfd, a remote store's socket) is one
 * more source with its handler, not a new case in the loop. */
#pragma once
#include <liburing.h>

enum kvp_src_kind {
	KVP_SRC_ACCEPT, /* multishot accept on the listening socket */
	KVP_SRC_SIGNAL, /* a read of the signalfd */
	KVP_SRC_TIMER,	/* the tick timeout */
	KVP_SRC_WORK,	/* a read of the worker's completion eventfd */
	KVP_SRC_RECV,	/* a connection's receive */
	KVP_SRC_SEND,	/* a connection's send */
	KVP_SRC_PIDFD,	/* a poll of a connection's peer pidfd */
	KVP_SRC_REMOTE, /* a poll of the remote tier's epoll fd (remote.h) */
	KVP_SRC_DISK,	/* a poll of the disk tier's eventfd (disk_tier.h) */
	KVP_SRC_IGNORE, /* cancellations: their completions carry nothing */
	KVP_SRC_MAX,
};

struct kvp_src;
/* Called on the loop thread for each completion of an SQE that carried src. loop is the loop
 * that submitted it. */
typedef void kvp_src_fn(void *loop, struct kvp_src *src, const struct io_uring_cqe *cqe);

struct kvp_src {
	enum kvp_src_kind kind;
	kvp_src_fn *fn;
	void *owner; /* the server or connection the handler acts on */
};

static inline void kvp_src_init(struct kvp_src *s, enum kvp_src_kind kind, kvp_src_fn *fn,
				void *owner)
{
	s->kind = kind;
	s->fn = fn;
	s->owner = owner;
}
