/* loop_cqe.c - the loop's completion handlers (src.h): a connection's receive, send and pidfd
 * poll, the signalfd, the worker's eventfd, the reserves' timer, the remote tier's fd, and
 * cancellations. Accept's is loop_admit.c's, the tick's loop_tick.c's. */
#include "loop_cqe.h"

#include <errno.h>
#include <signal.h>
#include <string.h>

#include "fault.h"
#include "log.h"
#include "loop_admit.h"
#include "loop_notice.h"
#include "loop_peer.h"
#include "loop_ring.h"
#include "reserve.h"
#include "work.h"
#include "disk_tier.h"
#include "kvp_config.h"
#if KVP_HAVE_REMOTE
#include "remote.h"
#include "remote_tier.h"
#endif

/* Refills and drains of the sessions' reserves that their clients did not ask for (a client
 * that allocates from its ring makes no call): every session in turn, from where the last
 * walk stopped, while the turn's page budget lasts. A session the budget left cannot pay for
 * starts the next walk (with the whole budget, which pays for any one session). */
void kvp_loop_cqe_upkeep(void *loop, struct kvp_src *src, const struct io_uring_cqe *cqe)
{
	struct server *sv = loop;
	struct kvp_daemon *d = sv->d;
	uint32_t budget = KVP_RESERVE_TURN_PAGES;
	struct kvp_session *s, *from = d->sessions;

	(void)src;
	(void)cqe;
	sv->upkeep_armed = false;
	for (s = d->sessions; s && sv->upkeep_from; s = s->next)
		if (s->id == sv->upkeep_from) {
			from = s;
			break;
		}
	sv->upkeep_from = 0;
	for (s = from; s;) {
		if (!kvp_reserve_upkeep(d, s, &budget)) {
			sv->upkeep_from = s->id;
			break;
		}
		s = s->next ? s->next : d->sessions;
		if (s == from)
			break;
		if (!budget) {
			sv->upkeep_from = s->id;
			break;
		}
	}
	kvp_loop_ring_arm_upkeep(sv);
}

void kvp_loop_cqe_remote(void *loop, struct kvp_src *src, const struct io_uring_cqe *cqe)
{
	struct server *sv = loop;

	(void)src;
	sv->remote_armed = false;
	if (cqe->res < 0 && cqe->res != -ECANCELED)
		log_warn("remote tier poll: %s", strerror(-cqe->res));
	sv->remote_ready = true; /* kvp_loop_cqe_remote_run, after the connections with input */
}

/* The remote tier's socket work of this turn, after the requests that arrived with it were
 * answered: a local call waits for no network I/O that is merely ready at the same time. */
void kvp_loop_cqe_remote_run(struct server *sv)
{
	if (!sv->remote_ready)
		return;
	sv->remote_ready = false;
#if KVP_HAVE_REMOTE
	if (sv->d->remote) {
		kvp_remote_on_ready(sv->d->remote);
		kvp_rt_expire(sv->d);
	}
#endif
	kvp_loop_ring_arm_remote(sv);
}

void kvp_loop_cqe_disk(void *loop, struct kvp_src *src, const struct io_uring_cqe *cqe)
{
	struct server *sv = loop;

	(void)src;
	sv->disk_armed = false;
	if (cqe->res < 0 && cqe->res != -ECANCELED)
		log_warn("disk tier poll: %s", strerror(-cqe->res));
	sv->disk_ready = true; /* kvp_loop_cqe_disk_run, after the connections with input */
}

/* The disk tier's completions of this turn (Fetches answered), after the requests that arrived
 * with them were served. */
void kvp_loop_cqe_disk_run(struct server *sv)
{
	if (!sv->disk_ready)
		return;
	sv->disk_ready = false;
	kvp_dt_run(sv->d->dt, sv->d->pools, sv->d->n_pools);
	kvp_loop_ring_arm_disk(sv);
}

void kvp_loop_cqe_recv(void *loop, struct kvp_src *src, const struct io_uring_cqe *cqe)
{
	struct server *sv = loop;
	struct peer *p = src->owner;
	int res = cqe->res;

	conn_release(&p->c, CONN_HOLD_RECV);
	if (cqe->flags & IORING_CQE_F_BUFFER) {
		unsigned bid = cqe->flags >> IORING_CQE_BUFFER_SHIFT;
		int r = 0;

		if (res > 0 && conn_serving(&p->c) &&
		    kvp_loop_admit_input_refused(sv, p, (size_t)res))
			r = -ENOSPC;
		else if (res > 0 && conn_serving(&p->c))
			r = kvp_fault_hit(KVP_FAULT_INPUT)
				    ? -ENOMEM
				    : kvp_frame_buf_append(&p->in, sv->bufs + (size_t)bid * BUFSZ,
							   (size_t)res);
		kvp_loop_peer_account_input(sv, p);
		if (r == -EMSGSIZE)
			kvp_loop_peer_protocol_error(sv, p, "frame larger than the maximum");
		else if (r == -ENOSPC)
			kvp_loop_peer_fail_close(
				sv, p, KVP_ERR_LIMIT_EXCEEDED,
				"the input does not fit in kvpoold's buffer budget");
		else if (r < 0)
			kvp_loop_peer_fail_close(sv, p, KVP_ERR_INTERNAL,
						 "out of memory for the connection's input");
		kvp_loop_ring_recycle(sv, bid);
	}
	if (conn_closing(&p->c)) {
		kvp_loop_peer_maybe_free(sv, p);
		return;
	}
	if (res == -ENOBUFS) {
		kvp_loop_ring_ready(sv, p); /* re-armed next turn, once buffers came back */
		return;
	}
	if (res <= 0) {
		kvp_loop_peer_close(sv, p,
				    res == 0 ? "client closed the connection" : "receive failed");
		return;
	}
	kvp_loop_ring_ready(sv, p);
}

void kvp_loop_cqe_send(void *loop, struct kvp_src *src, const struct io_uring_cqe *cqe)
{
	struct server *sv = loop;
	struct peer *p = src->owner;
	int res = cqe->res;
	size_t sent = res > 0 ? (size_t)res : 0;

	conn_release(&p->c, CONN_HOLD_SEND);
	if (conn_closing(&p->c)) {
		kvp_loop_peer_maybe_free(sv, p);
		return;
	}
	if ((res == -ETOOMANYREFS || res == -EMFILE || res == -ENFILE) && p->oq_head &&
	    p->oq_head->nfds && p->oq_head->off == 0 && kvp_loop_peer_fd_reply_refused(sv, p)) {
		kvp_loop_ring_arm_send(sv, p);
		return;
	}
	if (res < 0) {
		kvp_log_limited(&sv->log_send, kvp_now_ms(), LOG_INFO,
				"session %lu ('%s' pid %d): send failed (%s): closing it",
				p->sess ? (unsigned long)p->sess->id : 0UL,
				p->sess ? p->sess->name : "", p->sess ? (int)p->sess->pid : -1,
				strerror(-res));
		kvp_loop_peer_close(sv, p, NULL);
		return;
	}
	conn_outq_sent(&p->c, sent);
	p->sent_total += sent;
	if (sent)
		conn_activity(&p->c, kvp_now_ms()); /* the client reads: it is not the one behind */
	while (sent && p->oq_head) {
		struct obuf *o = p->oq_head;
		size_t take = o->len - o->off < sent ? o->len - o->off : sent;

		if (o->nfds && o->off == 0)
			p->fd_replies++;
		o->off += take;
		sent -= take;
		o->nfds = 0; /* descriptors went with the first byte */
		if (o->off < o->len)
			break;
		p->oq_head = o->next;
		if (!p->oq_head)
			p->oq_tail = NULL;
		if (!p->spare && o->cap == OBUF_CAP)
			p->spare = o;
		else
			kvp_loop_peer_free_obuf(sv, o);
	}
	if (p->oq_head) {
		kvp_loop_ring_arm_send(sv, p);
	} else if (p->c.state == CONN_FLUSHING) {
		kvp_loop_peer_close(sv, p, NULL);
		return;
	}
	if (!conn_paused(&p->c)) /* reading resumes when the queue drained below the limit */
		kvp_loop_ring_ready(sv, p);
}

void kvp_loop_cqe_pidfd(void *loop, struct kvp_src *src, const struct io_uring_cqe *cqe)
{
	struct server *sv = loop;
	struct peer *p = src->owner;

	conn_release(&p->c, CONN_HOLD_PIDFD);
	p->pid_cancel_sent = false;
	if (conn_closing(&p->c)) {
		kvp_loop_peer_maybe_free(sv, p);
	} else if (cqe->res > 0) {
		sv->d->st.sessions_reclaimed++;
		kvp_loop_peer_close(sv, p, "client process exited");
	} else {
		/* The poll failed: the exit is no longer watched, so the keep-alive applies. */
		conn_watch_exit(&p->c, false);
		kvp_loop_admit_pidfd_failed(sv, p->sess ? p->sess->pid : -1, -cqe->res);
	}
}

void kvp_loop_cqe_signal(void *loop, struct kvp_src *src, const struct io_uring_cqe *cqe)
{
	struct server *sv = loop;

	(void)src;
	sv->signal_armed = false;
	if (cqe->res == (int)sizeof(sv->si)) {
		switch (sv->si.ssi_signo) {
		case SIGTERM:
		case SIGINT:
			kvp_loop_stop(sv, sv->si.ssi_signo == SIGTERM ? "SIGTERM" : "SIGINT");
			break;
		case SIGHUP: sv->d->reload_requested = true; break;
		default: break;
		}
	}
	kvp_loop_ring_arm_signal(sv);
}

/* The worker finished jobs: their completions run here, on the loop thread. */
void kvp_loop_cqe_work(void *loop, struct kvp_src *src, const struct io_uring_cqe *cqe)
{
	struct server *sv = loop;

	(void)src;
	sv->work_armed = false;
	if (cqe->res < 0 && cqe->res != -ECANCELED)
		log_warn("worker eventfd: %s", strerror(-cqe->res));
	kvp_work_reap(sv->work);
	kvp_loop_pool_events(sv);
	kvp_loop_ring_arm_work(sv);
}

void kvp_loop_cqe_ignore(void *loop, struct kvp_src *src, const struct io_uring_cqe *cqe)
{
	(void)loop;
	(void)src;
	(void)cqe;
}
