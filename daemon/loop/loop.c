/* loop.c - kvpoold's io_uring event loop.
 *
 * One thread owns all state. Every SQE carries a loop source (src.h): multishot accept on the
 * listening socket; per connection at most one recv (buffer-selected from a shared
 * provided-buffer ring), one send and one poll of the peer's pidfd; a read of the signalfd; a
 * timeout that ticks the deadline and watchdog checks; a read of the worker's eventfd (work.h)
 * that completes jobs such as a reload's pool creation off this thread. A connection's state,
 * budget and deadlines are conn.c's: it gets its turn budget of frames per turn and is not
 * read while its output queue is full, so a client that pipelines without reading stalls only
 * itself. When no SQE is to be had (the ring is full), the operation is retried next turn. A
 * call whose handler defers its answer (defer.h: a Reload waiting for its pools) is answered
 * by kvp_loop_serve_deferred when the work completes, to its session's connection if still
 * open.
 *
 * This file runs the loop and stops it; the loop's state is loop_server.h's, and each concern
 * has its file: loop_ring.c (the ring, arming and cancelling operations), loop_peer.c (a
 * connection's life and output queue), loop_admit.c (admission, credentials and pidfds),
 * loop_serve.c (serving frames), loop_notice.c (pushed pressure notices), loop_cqe.c (the
 * completion handlers) and loop_tick.c (the periodic tick). */
#include "loop.h"

#include <errno.h>
#include <liburing.h>
#include <malloc.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "admit.h"
#include "dispatch.h"
#include "log.h"
#include "loop_admit.h"
#include "loop_cqe.h"
#include "loop_notice.h"
#include "loop_peer.h"
#include "loop_ring.h"
#include "loop_serve.h"
#include "loop_server.h"
#include "loop_tick.h"
#include "metrics_http.h"
#include "notify.h"
#include "reload.h"
#include "session.h"
#include "snapshot.h"
#include "work.h"
#include "disk_tier.h"
#include "kvp_config.h"
#if KVP_HAVE_REMOTE
#include "remote.h"
#include "remote_tier.h"
#endif

#define REPEAT_LOG_MS 5000 /* at most one line per interval of each repeated event */

void kvp_loop_stop(struct server *sv, const char *why)
{
	if (sv->stopping)
		return;
	log_notice("stopping: %s", why);
	kvp_notify("STOPPING=1");
	sv->stopping = sv->d->stopping = true;
	sv->stop_deadline_ms = kvp_now_ms() + KVP_STOP_FLUSH_MS;
	kvp_loop_ring_cancel_accept(sv);
	/* Answer every complete request already received, then close after the flush. */
	for (struct peer *p = sv->conns, *n; p; p = n) {
		n = p->next;
		if (conn_closing(&p->c) || !kvp_loop_serve(sv, p))
			continue;
		kvp_loop_peer_flush(p, 0);
		if (!p->oq_head)
			kvp_loop_peer_close(sv, p, "kvpoold is stopping");
	}
}

static void reload_finished(void *ctx)
{
	struct server *sv = ctx;

	sv->reload_busy = false;
	kvp_loop_tick_status(sv);
}

void kvp_signals_block(sigset_t *mask)
{
	sigemptyset(mask);
	sigaddset(mask, SIGTERM);
	sigaddset(mask, SIGINT);
	sigaddset(mask, SIGHUP);
	sigprocmask(SIG_BLOCK, mask, NULL);
}

int kvp_server_run(struct kvp_daemon *d, int listen_fd, const char *unlink_path)
{
	struct server sv = { 0 };
	int r;

	sv.d = d;
	sv.listen_fd = listen_fd;
	sv.unlink_path = unlink_path;
	sv.sig_fd = -1;
	sv.lim = (struct conn_limits){
		.turn_budget = KVP_TURN_BUDGET,
		.outq_max = KVP_OUTQ_MAX,
		.handshake_ms = d->conf.hello_timeout_ms,
		.partial_ms = KVP_PARTIAL_FRAME_MS,
		.keepalive_ms = d->conf.keepalive_ms,
	};
	sv.log_accept.interval_ms = sv.log_refuse.interval_ms = REPEAT_LOG_MS;
	sv.log_send.interval_ms = sv.log_hello.interval_ms = REPEAT_LOG_MS;
	kvp_src_init(&sv.accept_src, KVP_SRC_ACCEPT, kvp_loop_admit_accept, &sv);
	kvp_src_init(&sv.signal_src, KVP_SRC_SIGNAL, kvp_loop_cqe_signal, &sv);
	kvp_src_init(&sv.timer_src, KVP_SRC_TIMER, kvp_loop_tick, &sv);
	kvp_src_init(&sv.upkeep_src, KVP_SRC_TIMER, kvp_loop_cqe_upkeep, &sv);
	kvp_src_init(&sv.work_src, KVP_SRC_WORK, kvp_loop_cqe_work, &sv);
	kvp_src_init(&sv.remote_src, KVP_SRC_REMOTE, kvp_loop_cqe_remote, &sv);
	kvp_src_init(&sv.disk_src, KVP_SRC_DISK, kvp_loop_cqe_disk, &sv);
	kvp_src_init(&sv.ignore_src, KVP_SRC_IGNORE, kvp_loop_cqe_ignore, &sv);
	d->defers.deliver = kvp_loop_serve_deferred;
	d->defers.ctx = &sv;
	r = kvp_loop_ring_setup(&sv);
	if (r == 0) {
		sv.work = kvp_work_start();
		if (!sv.work) {
			log_err("cannot start the worker thread: %s", strerror(errno));
			r = -1;
		} else {
			kvp_pool_async(sv.work); /* demotions off the loop */
		}
	}
	if (r < 0) {
		if (sv.sig_fd >= 0)
			close(sv.sig_fd);
		free(sv.bufs);
		free(sv.br);
		kvp_arena_release(&sv.arena);
		return 1;
	}
	sv.watchdog_ms = kvp_watchdog_ms();
	sv.last_summary_ms = kvp_now_ms();
	/* Buffers for clients above this come from mmap and go back to the system when freed
	 * (glibc would otherwise raise the threshold after the first large free and keep them). */
	mallopt(M_MMAP_THRESHOLD, 256 << 10);
	sv.fd_limit = kvp_admit_raise_nofile();
	kvp_loop_tick_count_fds(&sv, kvp_now_ms());
	log_info("descriptors: limit %lu, %lu in use, %lu kept in reserve; buffer budget %lu bytes",
		 (unsigned long)sv.fd_limit, (unsigned long)sv.fds_other,
		 (unsigned long)kvp_admit_fd_reserve(sv.fd_limit),
		 (unsigned long)kvp_admit_buffer_budget(&d->conf));
	if (d->conf.metrics_listen[0]) {
		/* kvpoold's own socket (passed or made), whose rule holds loopback peers too */
		struct sockaddr_un sa = { 0 };
		socklen_t sl = sizeof(sa);

		if (getsockname(listen_fd, (struct sockaddr *)&sa, &sl) < 0 || sa.sun_path[0] == 0)
			sa.sun_path[0] = 0;
		sv.http = kvp_metrics_http_start(&d->conf, sa.sun_path);
	}
	kvp_loop_ring_rearm(&sv);
	kvp_notify("READY=1");
	kvp_loop_tick_status(&sv);
	log_notice("kvpoold ready: %u pools, listening", d->n_pools);

	while (!(sv.stopping && (sv.nconns == 0 || kvp_now_ms() > sv.stop_deadline_ms))) {
		struct io_uring_cqe *cqe;
		unsigned head, n = 0;
		struct peer *ready;

		/* With connections still to serve or operations to retry, collect what completed
		 * without waiting (with DEFER_TASKRUN a plain submit would leave completions
		 * unposted). */
		if (sv.ready || sv.retry)
			r = io_uring_submit_and_get_events(&sv.ring);
		else
			r = io_uring_submit_and_wait(&sv.ring, 1);
		sv.retry = false;
		if (r < 0 && r != -EINTR && r != -EBUSY && r != -EAGAIN) {
			log_err("io_uring_submit: %s", strerror(-r));
			sv.exit_code = 1;
			break;
		}
		io_uring_for_each_cqe(&sv.ring, head, cqe)
		{
			struct kvp_src *src = io_uring_cqe_get_data(cqe);

			if (src)
				src->fn(&sv, src, cqe);
			n++;
		}
		io_uring_cq_advance(&sv.ring, n);
		kvp_loop_peer_close_owed(&sv);
		/* Serve the connections that have input, each up to its budget. */
		ready = sv.ready;
		sv.ready = NULL;
		while (ready) {
			struct peer *p = ready;

			ready = p->ready_next;
			kvp_loop_serve_look_again(&sv, p);
		}
		kvp_loop_cqe_remote_run(&sv);
		kvp_loop_cqe_disk_run(&sv);
		kvp_loop_pool_events(&sv); /* of Allocs served off a call (deferred, upkeep) */
		kvp_loop_peer_close_owed(&sv);
		kvp_loop_notice_push(&sv, false);
		if (d->reload_requested && !sv.reload_busy && !sv.stopping) {
			d->reload_requested = false;
			if (kvp_reload_start(d, sv.work, reload_finished, &sv) == 0) {
				sv.reload_busy = true;
				kvp_loop_tick_status(&sv);
			}
		}
		/* The disk writes and reads this turn queued go in one submission per pool. */
		if (d->dt) {
			kvp_dt_bind(d->dt, d->pools, d->n_pools); /* pools a reload created */
			kvp_dt_submit(d->dt);
		}
#if KVP_HAVE_REMOTE
		/* What this turn submitted to the cluster: its fds and deadline, up to date. */
		if (d->remote) {
			kvp_rt_bind(d); /* pools a reload created */
			/* The turn's replies leave before the I/O thread is woken for what the
			 * turn queued (spills of its Allocs): on few cores it may run first. */
			if (kvp_remote_pending(d->remote))
				io_uring_submit(&sv.ring);
			kvp_remote_sync(d->remote);
			kvp_remote_stats_read(d->remote, &d->remote_st);
			kvp_rt_stats_read(d, &d->remote_st);
		}
#endif
		kvp_loop_ring_rearm(&sv);
	}
	/* Past the flush deadline: whatever is left goes now. A reload in progress ends first
	 * (its pools are dropped or join, to be destroyed with the others), then sessions (their
	 * pages return), then the ring (cancelling what is in flight), then the connections. */
	kvp_work_stop(sv.work); /* demotions in flight land (or are cancelled) first */
	kvp_pool_async(NULL);
	kvp_rpc_alloc_retry(d); /* nothing is in flight now: every waiting Alloc ends */
	while (d->defers.reload_waiting) {
		struct kvp_defer *t = d->defers.reload_waiting;
		struct kvp_fail f;

		d->defers.reload_waiting = t->next;
		kvp_fail_init(&f);
		kvp_fail(&f, KVP_ERR_SHUTTING_DOWN, "kvpoold is stopping");
		kvp_defer_fail(&d->defers, t, &f);
	}
	if (d->defers.n) {
		log_err("at exit: %u deferred replies still held", d->defers.n);
		sv.exit_code = 70;
	}
	d->defers.deliver = NULL;
	kvp_snap_write_all(d, true); /* every session still listed may resume */
	for (struct peer *p = sv.conns; p; p = p->next) {
		if (p->sess) {
			kvp_session_destroy(d, p->sess);
			p->sess = NULL;
		}
	}
	io_uring_queue_exit(&sv.ring);
	while (sv.conns)
		kvp_loop_peer_free(&sv, sv.conns);
	if (unlink_path)
		unlink(unlink_path);
	kvp_metrics_http_stop(sv.http);
	close(sv.sig_fd);
	free(sv.bufs);
	free(sv.br);
	kvp_arena_release(&sv.arena);
	log_notice("kvpoold stopped");
	return sv.exit_code;
}
