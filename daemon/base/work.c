/* work.c - the worker thread (work.h). */
#include "work.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "log.h"

struct kvp_work {
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t wake;
	struct kvp_job *queue, *queue_tail; /* to run, in order */
	struct kvp_job *done;		    /* finished, completion not run yet */
	bool stop;
	int efd;
	int pending; /* loop thread only: submitted, not reaped */
};

static void *worker(void *arg)
{
	struct kvp_work *w = arg;

	pthread_mutex_lock(&w->lock);
	for (;;) {
		struct kvp_job *j;
		uint64_t one = 1;

		while (!w->queue && !w->stop)
			pthread_cond_wait(&w->wake, &w->lock);
		if (!w->queue)
			break;
		j = w->queue;
		w->queue = j->next;
		if (!w->queue)
			w->queue_tail = NULL;
		pthread_mutex_unlock(&w->lock);
		j->run(j);
		pthread_mutex_lock(&w->lock);
		j->next = w->done;
		w->done = j;
		if (write(w->efd, &one, sizeof(one)) < 0)
			log_warn("worker: eventfd write failed");
		if (w->stop)
			break;
	}
	pthread_mutex_unlock(&w->lock);
	return NULL;
}

struct kvp_work *kvp_work_start(void)
{
	struct kvp_work *w = calloc(1, sizeof(*w));
	int r;

	if (!w)
		return NULL;
	w->efd = eventfd(0, EFD_CLOEXEC);
	if (w->efd < 0) {
		free(w);
		return NULL;
	}
	pthread_mutex_init(&w->lock, NULL);
	pthread_cond_init(&w->wake, NULL);
	r = pthread_create(&w->thread, NULL, worker, w);
	if (r) {
		close(w->efd);
		pthread_cond_destroy(&w->wake);
		pthread_mutex_destroy(&w->lock);
		free(w);
		errno = r;
		return NULL;
	}
	return w;
}

int kvp_work_fd(const struct kvp_work *w)
{
	return w->efd;
}

int kvp_work_submit(struct kvp_work *w, struct kvp_job *j)
{
	pthread_mutex_lock(&w->lock);
	if (w->stop) {
		pthread_mutex_unlock(&w->lock);
		return -ESHUTDOWN;
	}
	j->next = NULL;
	if (w->queue_tail)
		w->queue_tail->next = j;
	else
		w->queue = j;
	w->queue_tail = j;
	w->pending++;
	pthread_cond_signal(&w->wake);
	pthread_mutex_unlock(&w->lock);
	return 0;
}

/* Completions in the order the jobs finished. */
static int finish(struct kvp_work *w, struct kvp_job *done, bool cancelled)
{
	struct kvp_job *rev = NULL, *n;
	int count = 0;

	for (; done; done = n) {
		n = done->next;
		done->next = rev;
		rev = done;
	}
	for (; rev; rev = n) {
		n = rev->next;
		w->pending--;
		count++;
		rev->done(rev, cancelled);
	}
	return count;
}

int kvp_work_reap(struct kvp_work *w)
{
	struct kvp_job *done;

	pthread_mutex_lock(&w->lock);
	done = w->done;
	w->done = NULL;
	pthread_mutex_unlock(&w->lock);
	return finish(w, done, false);
}

int kvp_work_pending(const struct kvp_work *w)
{
	return w->pending;
}

void kvp_work_stop(struct kvp_work *w)
{
	struct kvp_job *queued, *done;

	if (!w)
		return;
	pthread_mutex_lock(&w->lock);
	w->stop = true;
	queued = w->queue;
	w->queue = w->queue_tail = NULL;
	pthread_cond_signal(&w->wake);
	pthread_mutex_unlock(&w->lock);
	pthread_join(w->thread, NULL);
	done = w->done;
	w->done = NULL;
	finish(w, done, false);
	/* Queued jobs never ran: reverse twice keeps their order. */
	{
		struct kvp_job *rev = NULL, *n;

		for (; queued; queued = n) {
			n = queued->next;
			queued->next = rev;
			rev = queued;
		}
		finish(w, rev, true);
	}
	close(w->efd);
	pthread_cond_destroy(&w->wake);
	pthread_mutex_destroy(&w->lock);
	free(w);
}
