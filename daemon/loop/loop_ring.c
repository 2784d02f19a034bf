/* loop_ring.c - the loop's io_uring: its setup (the ring, the provided-buffer ring receives
 * select from, the request arena, the signalfd), the SQEs, and arming and cancelling each
 * operation the loop keeps in flight. When no SQE is to be had (the ring is full), the
 * operation is retried next turn: a connection's goes through the ready list, the server's
 * own through kvp_loop_ring_rearm. */
#include "loop_ring.h"

#include <errno.h>
#include <liburing.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>

#include "fault.h"
#include "disk_tier.h"
#include "log.h"
#include "loop_admit.h"
#include "work.h"
#include "kvp_config.h"
#if KVP_HAVE_REMOTE
#include "remote.h"
#endif

#define RING_ENTRIES 1024
#define BUF_GROUP 7
#define NBUFS 256
#define TICK_MS 100
#define UPKEEP_MS 5		/* sessions' page reserves are looked at this often */
#define ARENA_BYTES (64u << 10) /* a decoded request beyond this spills to malloc */

/* An SQE for src, or NULL when the ring is full even after a submit (then sv->retry is set:
 * the caller leaves its operation unarmed and it is tried again next turn). */
static struct io_uring_sqe *get_sqe(struct server *sv)
{
	struct io_uring_sqe *sqe = NULL;

	if (!kvp_fault_hit(KVP_FAULT_SQE)) {
		sqe = io_uring_get_sqe(&sv->ring);
		if (!sqe) {
			io_uring_submit(&sv->ring);
			sqe = io_uring_get_sqe(&sv->ring);
		}
	}
	if (!sqe)
		sv->retry = true;
	return sqe;
}

static void arm_accept(struct server *sv)
{
	struct io_uring_sqe *sqe;

	if (sv->accept_armed || sv->listen_fd < 0 || sv->stopping)
		return;
	if (sv->accept_retry_ms && kvp_now_ms() < sv->accept_retry_ms)
		return; /* backing off after running out of descriptors: the tick tries again */
	sqe = get_sqe(sv);
	if (!sqe)
		return;
	io_uring_prep_multishot_accept(sqe, sv->listen_fd, NULL, NULL, SOCK_CLOEXEC);
	io_uring_sqe_set_data(sqe, &sv->accept_src);
	sv->accept_armed = true;
}

void kvp_loop_ring_cancel_accept(struct server *sv)
{
	struct io_uring_sqe *sqe;

	if (!sv->accept_armed || sv->accept_cancel_sent)
		return;
	sqe = get_sqe(sv);
	if (!sqe)
		return;
	io_uring_prep_cancel64(sqe, (uint64_t)(uintptr_t)&sv->accept_src, 0);
	io_uring_sqe_set_data(sqe, &sv->ignore_src);
	sv->accept_cancel_sent = true;
}

void kvp_loop_ring_arm_signal(struct server *sv)
{
	struct io_uring_sqe *sqe;

	if (sv->signal_armed)
		return;
	sqe = get_sqe(sv);
	if (!sqe)
		return;
	io_uring_prep_read(sqe, sv->sig_fd, &sv->si, sizeof(sv->si), 0);
	io_uring_sqe_set_data(sqe, &sv->signal_src);
	sv->signal_armed = true;
}

void kvp_loop_ring_arm_timer(struct server *sv)
{
	struct io_uring_sqe *sqe;

	if (sv->timer_armed)
		return;
	sqe = get_sqe(sv);
	if (!sqe)
		return;
	sv->tick.tv_sec = 0;
	sv->tick.tv_nsec = TICK_MS * 1000000L;
	io_uring_prep_timeout(sqe, &sv->tick, 0, 0);
	io_uring_sqe_set_data(sqe, &sv->timer_src);
	sv->timer_armed = true;
}

/* The reserves' timer: armed while some session has a page reserve. */
void kvp_loop_ring_arm_upkeep(struct server *sv)
{
	struct io_uring_sqe *sqe;

	if (sv->upkeep_armed || !sv->d->n_reserves || sv->stopping)
		return;
	sqe = get_sqe(sv);
	if (!sqe)
		return;
	sv->upkeep_ts.tv_sec = 0;
	sv->upkeep_ts.tv_nsec = UPKEEP_MS * 1000000L;
	io_uring_prep_timeout(sqe, &sv->upkeep_ts, 0, 0);
	io_uring_sqe_set_data(sqe, &sv->upkeep_src);
	sv->upkeep_armed = true;
}

/* The remote tier's one fd: readable when a cluster socket or its timer is (remote.h). */
void kvp_loop_ring_arm_remote(struct server *sv)
{
#if KVP_HAVE_REMOTE
	struct io_uring_sqe *sqe;

	if (sv->remote_armed || !sv->d->remote)
		return;
	sqe = get_sqe(sv);
	if (!sqe)
		return;
	io_uring_prep_poll_add(sqe, kvp_remote_fd(sv->d->remote), POLLIN);
	io_uring_sqe_set_data(sqe, &sv->remote_src);
	sv->remote_armed = true;
#else
	(void)sv;
#endif
}

/* The disk tier's eventfd: readable when a disk read or write completed (disk_tier.h). */
void kvp_loop_ring_arm_disk(struct server *sv)
{
	struct io_uring_sqe *sqe;

	if (sv->disk_armed || !sv->d->dt)
		return;
	sqe = get_sqe(sv);
	if (!sqe)
		return;
	io_uring_prep_poll_add(sqe, kvp_dt_fd(sv->d->dt), POLLIN);
	io_uring_sqe_set_data(sqe, &sv->disk_src);
	sv->disk_armed = true;
}

void kvp_loop_ring_arm_work(struct server *sv)
{
	struct io_uring_sqe *sqe;

	if (sv->work_armed || !sv->work)
		return;
	sqe = get_sqe(sv);
	if (!sqe)
		return;
	io_uring_prep_read(sqe, kvp_work_fd(sv->work), &sv->work_count, sizeof(sv->work_count), 0);
	io_uring_sqe_set_data(sqe, &sv->work_src);
	sv->work_armed = true;
}

/* Puts p on the ready list: it is looked at again next turn (served, re-armed, or freed). */
void kvp_loop_ring_ready(struct server *sv, struct peer *p)
{
	if (conn_held(&p->c, CONN_HOLD_READY))
		return;
	conn_hold(&p->c, CONN_HOLD_READY);
	p->ready_next = sv->ready;
	sv->ready = p;
}

void kvp_loop_ring_arm_recv(struct server *sv, struct peer *p)
{
	struct io_uring_sqe *sqe;

	if (!conn_may_recv(&p->c) || sv->stopping)
		return;
	/* Backpressure: while complete frames wait to be served, nothing more is read (they
	 * are served first, a turn budget at a time). */
	if (kvp_frame_ready(&p->in) || kvp_loop_admit_budget_hold(sv, p))
		return;
	sqe = get_sqe(sv);
	if (!sqe) {
		kvp_loop_ring_ready(sv, p);
		return;
	}
	io_uring_prep_recv(sqe, p->fd, NULL, BUFSZ, 0);
	sqe->flags |= IOSQE_BUFFER_SELECT;
	sqe->buf_group = BUF_GROUP;
	io_uring_sqe_set_data(sqe, &p->recv_src);
	conn_hold(&p->c, CONN_HOLD_RECV);
}

void kvp_loop_ring_arm_pidfd(struct server *sv, struct peer *p)
{
	struct io_uring_sqe *sqe;

	if (p->pidfd < 0 || conn_held(&p->c, CONN_HOLD_PIDFD) || conn_closing(&p->c))
		return;
	sqe = get_sqe(sv);
	if (!sqe) {
		kvp_loop_ring_ready(sv, p);
		return;
	}
	io_uring_prep_poll_add(sqe, p->pidfd, POLLIN);
	io_uring_sqe_set_data(sqe, &p->pid_src);
	conn_hold(&p->c, CONN_HOLD_PIDFD);
}

/* One send for as many queued replies as fit in KVP_SEND_IOV (a plain send for one buffer, else
 * sendmsg); a reply that carries descriptors goes alone, so they travel with its first byte. */
void kvp_loop_ring_arm_send(struct server *sv, struct peer *p)
{
	struct obuf *o = p->oq_head;
	struct io_uring_sqe *sqe;
	size_t n = 0;

	if (conn_held(&p->c, CONN_HOLD_SEND) || !o || conn_closing(&p->c))
		return;
	sqe = get_sqe(sv);
	if (!sqe) {
		kvp_loop_ring_ready(sv, p);
		return;
	}
	memset(&p->msg, 0, sizeof(p->msg));
	if (o->nfds && o->off == 0) {
		struct cmsghdr *cm;

		p->msg.msg_control = p->cmsg.buf;
		p->msg.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)o->nfds);
		cm = CMSG_FIRSTHDR(&p->msg);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)o->nfds);
		memcpy(CMSG_DATA(cm), o->fds, sizeof(int) * (size_t)o->nfds);
		p->iov[n].iov_base = o->data;
		p->iov[n++].iov_len = o->len;
	} else {
		for (; o && n < KVP_SEND_IOV && !(o->nfds && o->off == 0); o = o->next) {
			p->iov[n].iov_base = o->data + o->off;
			p->iov[n++].iov_len = o->len - o->off;
		}
	}
	if (n == 1 && !p->msg.msg_control) { /* the common case: no msghdr for the kernel to read */
		io_uring_prep_send(sqe, p->fd, p->iov[0].iov_base, p->iov[0].iov_len, MSG_NOSIGNAL);
	} else {
		p->msg.msg_iov = p->iov;
		p->msg.msg_iovlen = n;
		io_uring_prep_sendmsg(sqe, p->fd, &p->msg, MSG_NOSIGNAL);
	}
	io_uring_sqe_set_data(sqe, &p->send_src);
	conn_hold(&p->c, CONN_HOLD_SEND);
}

/* Removes the poll of p's pidfd (its completion then releases the hold); retried next turn
 * when no SQE is to be had. */
void kvp_loop_ring_cancel_pidfd(struct server *sv, struct peer *p)
{
	struct io_uring_sqe *sqe;

	if (!conn_held(&p->c, CONN_HOLD_PIDFD) || p->pid_cancel_sent)
		return;
	sqe = get_sqe(sv);
	if (!sqe) {
		kvp_loop_ring_ready(sv, p);
		return;
	}
	io_uring_prep_poll_remove(sqe, (uint64_t)(uintptr_t)&p->pid_src);
	io_uring_sqe_set_data(sqe, &sv->ignore_src);
	p->pid_cancel_sent = true;
}

static bool decode_spill_fails(void)
{
	return kvp_fault_hit(KVP_FAULT_DECODE);
}

void kvp_loop_ring_recycle(struct server *sv, unsigned bid)
{
	io_uring_buf_ring_add(sv->br, sv->bufs + (size_t)bid * BUFSZ, BUFSZ, (unsigned short)bid,
			      io_uring_buf_ring_mask(NBUFS), 0);
	io_uring_buf_ring_advance(sv->br, 1);
}

int kvp_loop_ring_setup(struct server *sv)
{
	struct io_uring_params params = { 0 };
	sigset_t mask;
	int r;

	/* Only this thread touches the ring, so completions can wait until it asks for them
	 * (DEFER_TASKRUN, 6.1+): no task-work interrupts while it serves. Older kernels refuse the
	 * flags; then cooperative task work (5.19+), then none. */
	{
		static const unsigned tries[] = {
			IORING_SETUP_SUBMIT_ALL | IORING_SETUP_SINGLE_ISSUER |
				IORING_SETUP_DEFER_TASKRUN,
			IORING_SETUP_SUBMIT_ALL | IORING_SETUP_COOP_TASKRUN,
			0,
		};

		for (size_t i = 0; i < sizeof(tries) / sizeof(tries[0]); i++) {
			memset(&params, 0, sizeof(params));
			params.flags = tries[i];
			r = io_uring_queue_init_params(RING_ENTRIES, &sv->ring, &params);
			if (r != -EINVAL)
				break;
		}
	}
	if (r < 0) {
		log_err("io_uring_queue_init: %s (is io_uring disabled on this kernel?)",
			strerror(-r));
		return r;
	}
	sv->bufs = aligned_alloc(4096, (size_t)NBUFS * BUFSZ);
	if (!sv->bufs || kvp_arena_init(&sv->arena, ARENA_BYTES) < 0)
		return -ENOMEM;
	sv->arena.deny = decode_spill_fails;
	{
		struct io_uring_buf_reg reg = { 0 };
		size_t sz = sizeof(struct io_uring_buf) * NBUFS;
		void *mem = aligned_alloc(4096, (sz + 4095) / 4096 * 4096);

		if (!mem)
			return -ENOMEM;
		sv->br = mem;
		io_uring_buf_ring_init(sv->br);
		reg.ring_addr = (uint64_t)(uintptr_t)mem;
		reg.ring_entries = NBUFS;
		reg.bgid = BUF_GROUP;
		r = io_uring_register_buf_ring(&sv->ring, &reg, 0);
		if (r < 0) {
			log_err("io_uring_register_buf_ring: %s (kernel 5.19 or later needed)",
				strerror(-r));
			return r;
		}
		for (unsigned i = 0; i < NBUFS; i++)
			io_uring_buf_ring_add(sv->br, sv->bufs + (size_t)i * BUFSZ, BUFSZ,
					      (unsigned short)i, io_uring_buf_ring_mask(NBUFS),
					      (int)i);
		io_uring_buf_ring_advance(sv->br, NBUFS);
	}
	/* From here the loop owns them (main.c's handler ended start-up on SIGTERM/SIGINT and
	 * blocked SIGHUP, which waits if it came). */
	kvp_signals_block(&mask);
	sv->sig_fd = signalfd(-1, &mask, SFD_CLOEXEC);
	if (sv->sig_fd < 0)
		return -errno;
	return 0;
}

/* The server's own operations, re-armed when a completion or a full ring left them unarmed. */
void kvp_loop_ring_rearm(struct server *sv)
{
	if (sv->stopping)
		kvp_loop_ring_cancel_accept(sv);
	else
		arm_accept(sv);
	kvp_loop_ring_arm_signal(sv);
	kvp_loop_ring_arm_timer(sv);
	kvp_loop_ring_arm_upkeep(sv);
	kvp_loop_ring_arm_work(sv);
	kvp_loop_ring_arm_remote(sv);
	kvp_loop_ring_arm_disk(sv);
}
