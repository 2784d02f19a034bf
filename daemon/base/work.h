/* work.h - a worker thread for blocking work (memfd creation, prefault, mlock, waits for
 * demotion copies) that must not stall the event loop. The loop queues a job; the worker runs it;
 * the loop is told through an eventfd it reads as a loop source, and then runs the job's completion
 * on its own thread. A job owns whatever it builds until its completion hands it over: the worker
 * never touches the daemon's state. */
#pragma once
#include <stdbool.h>

struct kvp_job {
	/* On the worker thread. */
	void (*run)(struct kvp_job *j);
	/* On the loop thread, once run returned (cancelled: run never ran, kvpoold is stopping). */
	void (*done)(struct kvp_job *j, bool cancelled);
	struct kvp_job *next; /* the worker's */
};

struct kvp_work;

/* Starts the worker thread. NULL with errno set on failure. */
struct kvp_work *kvp_work_start(void);
/* The eventfd that becomes readable (an 8-byte count) when jobs have finished. */
int kvp_work_fd(const struct kvp_work *w);
/* Queues j. 0, or -ESHUTDOWN after kvp_work_stop began. */
int kvp_work_submit(struct kvp_work *w, struct kvp_job *j);
/* Runs the completion of every finished job, on the calling (loop) thread. Returns how many. */
int kvp_work_reap(struct kvp_work *w);
/* Jobs queued or running, not yet reaped. */
int kvp_work_pending(const struct kvp_work *w);
/* Waits for the running job, cancels the queued ones, runs every completion, joins the thread
 * and frees w. Accepts NULL. */
void kvp_work_stop(struct kvp_work *w);
