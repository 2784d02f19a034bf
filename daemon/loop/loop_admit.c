/* loop_admit.c - admission (the rules are admit.h's, fed the counts the loop keeps): new
 * connections accepted or refused, with the peer's credentials, groups and pidfd; calls and
 * input refused before they are served; accept's backoff when descriptors run out. */
#include "loop_admit.h"

#include <errno.h>
#include <linux/sockios.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "admit.h"
#include "fault.h"
#include "log.h"
#include "loop_cqe.h"
#include "loop_ring.h"
#include "session.h"

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif

#define PIDFD_LOG_MS 60000	   /* at most one log line per interval about failed pidfds */
#define ACCEPT_BACKOFF_MS 50	   /* accept waits this long after EMFILE, doubling, */
#define ACCEPT_BACKOFF_MAX_MS 1000 /* up to this */

/* The counts admission rules look at (admit.h). */
static struct kvp_admit_counts admit_counts(const struct server *sv)
{
	return (struct kvp_admit_counts){
		.prehello = sv->n_prehello,
		.sessions = sv->n_greeted,
		.fds_used = sv->fds_other + sv->conn_fds,
		.fd_limit = sv->fd_limit,
		.buf_bytes = sv->buf_bytes,
	};
}

static bool over_budget(const struct server *sv)
{
	return sv->buf_bytes >= kvp_admit_buffer_budget(&sv->d->conf);
}

/* Whether p waits on the buffer budget: past it, a connection with replies queued is neither
 * served nor read until they drain. */
bool kvp_loop_admit_budget_hold(const struct server *sv, const struct peer *p)
{
	return p->c.out_bytes && over_budget(sv);
}

/* Replies with descriptors p's peer may not have read yet: those queued, and those sent while
 * its socket still holds unread bytes (every one of them then, to be safe: SIOCOUTQ counts
 * memory, not which reply). Descriptors in flight count against kvpoold's RLIMIT_NOFILE. */
static uint32_t fd_replies_in_flight(struct peer *p)
{
	uint32_t n = 0;
	int unread = 0;

	for (struct obuf *o = p->oq_head; o; o = o->next)
		n += o->nfds && o->off == 0;
	if (p->fd_replies && ioctl(p->fd, SIOCOUTQ, &unread) == 0 && unread == 0)
		p->fd_replies = 0;
	return n + p->fd_replies;
}

/* Whether req gives back what its session holds (Free, Release, Detach): never refused for the
 * buffer budget, its reply is small. */
static bool gives_back(const Kvpool__Request *req)
{
	return req->call_case == KVPOOL__REQUEST__CALL_FREE ||
	       req->call_case == KVPOOL__REQUEST__CALL_RELEASE ||
	       req->call_case == KVPOOL__REQUEST__CALL_DETACH;
}

/* Admission of one call before it is dispatched: a Hello past max_sessions (admin slots kept),
 * an Attach past the descriptors in flight of its connection, a call of a non-admin past the
 * buffer budget (unless it gives back). Returns true with f filled (and *close set for a
 * refused Hello) when req is refused: nothing of it is done. */
bool kvp_loop_admit_call(struct server *sv, struct peer *p, const Kvpool__Request *req,
			 struct kvp_fail *f, bool *close)
{
	struct kvp_admit_counts n = admit_counts(sv);
	struct kvp_daemon *d = sv->d;
	uint64_t now = kvp_now_ms();

	if (!p->admin && !gives_back(req) && over_budget(sv)) {
		kvp_admit_buffer(&d->conf, &n, 1, f);
		d->st.refused_buffers++;
		kvp_log_limited(&sv->log_refuse, now, LOG_WARNING,
				"refused a call of pid %d uid %u: %s", (int)p->sess->pid,
				(unsigned)p->sess->uid, f->msg);
		return true;
	}
	if (req->call_case == KVPOOL__REQUEST__CALL_HELLO && !p->greeted_counted &&
	    kvp_admit_hello(&d->conf, &n, p->admin, f) != KVP_ADMIT_OK) {
		d->st.refused_sessions++;
		d->st.connections_refused++;
		*close = true;
		kvp_log_limited(&sv->log_refuse, now, LOG_WARNING,
				"refused the Hello of pid %d uid %u: %s", (int)p->sess->pid,
				(unsigned)p->sess->uid, f->msg);
		return true;
	}
	if (req->call_case == KVPOOL__REQUEST__CALL_ATTACH &&
	    fd_replies_in_flight(p) >= KVP_ATTACH_FDS_INFLIGHT) {
		kvp_fail_limit(f, "Attach replies in flight", KVP_ATTACH_FDS_INFLIGHT);
		kvp_fail(f, KVP_ERR_LIMIT_EXCEEDED,
			 "%u Attach replies with descriptors are not read yet: read them first",
			 KVP_ATTACH_FDS_INFLIGHT);
		d->st.refused_attach_fds++;
		kvp_log_limited(&sv->log_refuse, now, LOG_NOTICE,
				"refused an Attach of session %lu (pid %d): %s",
				(unsigned long)p->sess->id, (int)p->sess->pid, f->msg);
		return true;
	}
	return false;
}

static void reject(struct server *sv, int fd, const struct kvp_fail *f)
{
	struct kvp_reply r;
	uint8_t *buf;
	size_t len;

	kvp_reply_init(&r, 0);
	kvp_reply_fail(&r, f);
	/* A fresh socket's buffer is empty: this small send cannot block. */
	if (kvp_frame_pack(&r.resp.base, &buf, &len) == 0) {
		if (send(fd, buf, len, MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
			log_debug("reject: send: %s", strerror(errno));
		free(buf);
	}
	kvp_reply_release(&r);
	close(fd);
	sv->d->st.connections_refused++;
}

/* Every supplementary group of the peer (SO_PEERGROUPS, grown until they fit): *out is groups
 * when they fit in it, else malloc'ed. Returns the count, or a negative errno. */
static int peer_groups(int fd, gid_t *groups, int ngroups, gid_t **out)
{
	socklen_t len = (socklen_t)(sizeof(gid_t) * (size_t)ngroups);
	gid_t *g = groups;

	for (;;) {
		socklen_t got = len;

		if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, g, &got) == 0) {
			*out = g;
			return (int)(got / sizeof(gid_t));
		}
		if (errno != ERANGE || got <= len) {
			int e = -errno;

			if (g != groups)
				free(g);
			return e;
		}
		if (g != groups)
			free(g);
		len = got;
		g = malloc(len);
		if (!g)
			return -ENOMEM;
	}
}

/* A failed pidfd: the peer's exit is not tracked (only keep-alive reclaims its session).
 * Counted; logged at most once per PIDFD_LOG_MS. */
void kvp_loop_admit_pidfd_failed(struct server *sv, pid_t pid, int err)
{
	uint64_t now = kvp_now_ms();

	sv->d->st.pidfd_failures++;
	sv->pidfd_unlogged++;
	if (sv->pidfd_log_ms && now - sv->pidfd_log_ms < PIDFD_LOG_MS)
		return;
	log_warn("no pidfd for pid %d (%s): its exit is not tracked, only keep-alive reclaims its "
		 "session (%lu peers so far without one)",
		 (int)pid, strerror(err), (unsigned long)sv->d->st.pidfd_failures);
	sv->pidfd_log_ms = now ? now : 1;
	sv->pidfd_unlogged = 0;
}

/* The peer's pidfd: SO_PEERPIDFD names the process that connected even when its pid was reused
 * since; pidfd_open of the SO_PEERCRED pid is the fallback for kernels without it. -ESRCH when
 * SO_PEERPIDFD says that process is gone already (pidfd_open could then find another process
 * under its pid); -1 when neither way gives a pidfd (counted and logged). */
static int peer_pidfd(struct server *sv, int fd, pid_t pid)
{
	int pfd = -1, err;

	if (kvp_fault_hit(KVP_FAULT_PIDFD)) {
		kvp_loop_admit_pidfd_failed(sv, pid, EMFILE);
		return -1;
	}
	if (!sv->no_peerpidfd) {
		socklen_t len = sizeof(pfd);

		if (kvp_fault_hit(KVP_FAULT_PEER_PIDFD))
			errno = ENOPROTOOPT;
		else if (getsockopt(fd, SOL_SOCKET, SO_PEERPIDFD, &pfd, &len) == 0 && pfd >= 0)
			return pfd;
		if (errno == ESRCH)
			return -ESRCH;
		if (errno == ENOPROTOOPT) {
			log_info("SO_PEERPIDFD not supported here: peers' pidfds come from "
				 "pidfd_open after accept");
			sv->no_peerpidfd = true;
		} else {
			log_debug("SO_PEERPIDFD of pid %d: %s: trying pidfd_open", (int)pid,
				  strerror(errno));
		}
	}
	pfd = (int)syscall(SYS_pidfd_open, pid, 0);
	if (pfd >= 0)
		return pfd;
	err = errno;
	if (err == ESRCH) /* the peer is gone already: nothing of it to serve */
		return -ESRCH;
	kvp_loop_admit_pidfd_failed(sv, pid, err);
	return -1;
}

/* The admission rules for a new connection (admit.h): descriptors, pre-Hello connections, the
 * uid's connections. 0, or -1 with f filled (counted and logged, at most a line per interval). */
static int admit_connection(struct server *sv, const struct ucred *cred, bool admin,
			    struct kvp_fail *f)
{
	struct kvp_admit_counts n = admit_counts(sv);
	struct kvp_daemon_stats *st = &sv->d->st;

	n.fds_used++; /* the accepted socket */
	for (struct peer *q = sv->conns; q; q = q->next)
		n.uid_conns += !conn_closing(&q->c) && q->sess && q->sess->uid == cred->uid;
	switch (kvp_admit_connect(&sv->d->conf, &n, admin, cred->uid, f)) {
	case KVP_ADMIT_OK: return 0;
	case KVP_ADMIT_FDS: st->refused_fds++; break;
	case KVP_ADMIT_PREHELLO: st->refused_prehello++; break;
	default: st->refused_uid++; break;
	}
	kvp_log_limited(&sv->log_refuse, kvp_now_ms(), LOG_WARNING,
			"refused connection of pid %d uid %u%s: %s", (int)cred->pid,
			(unsigned)cred->uid, admin ? " (admin)" : "", f->msg);
	return -1;
}

static void on_accept(struct server *sv, int fd)
{
	struct ucred cred;
	socklen_t clen = sizeof(cred);
	gid_t groups_buf[64], *groups = groups_buf;
	struct kvp_fail f = { 0 };
	struct peer *p;
	bool admin = false;
	int ngroups, r, pidfd;

	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) < 0) {
		log_warn("accept: SO_PEERCRED: %s", strerror(errno));
		close(fd);
		return;
	}
	ngroups = peer_groups(fd, groups_buf, 64, &groups);
	if (ngroups < 0) {
		log_warn("accept: pid %d: SO_PEERGROUPS: %s: its supplementary groups do not count",
			 (int)cred.pid, strerror(-ngroups));
		groups = groups_buf;
		ngroups = 0;
	}
	if (sv->stopping) { /* a drain refuses non-admins at Hello (kvp_rpc_hello) */
		kvp_fail(&f, KVP_ERR_SHUTTING_DOWN, "kvpoold is shutting down");
		r = -1;
	} else {
		r = kvp_daemon_admit(sv->d, cred.pid, cred.uid, cred.gid, groups, ngroups, &admin,
				     &f);
		if (r < 0)
			kvp_log_limited(&sv->log_refuse, kvp_now_ms(), LOG_NOTICE,
					"refused connection of pid %d uid %u: not allowed",
					(int)cred.pid, (unsigned)cred.uid);
	}
	if (r == 0 && admit_connection(sv, &cred, admin, &f) < 0)
		r = -1;
	if (r < 0) {
		reject(sv, fd, &f);
		goto out;
	}
	/* The session belongs to the peer process: when it exits, even with the socket still
	 * open in a forked child, everything it held returns. */
	pidfd = peer_pidfd(sv, fd, cred.pid);
	if (pidfd == -ESRCH) {
		log_info("pid %d exited before its connection was accepted", (int)cred.pid);
		close(fd);
		goto out;
	}
	p = KVP_FAULT_OR(KVP_FAULT_CONN, calloc(1, sizeof(*p)));
	if (!p) {
		log_warn("refused connection of pid %d: out of memory", (int)cred.pid);
		kvp_fail(&f, KVP_ERR_INTERNAL, "out of memory");
		goto refuse;
	}
	p->sess = kvp_session_new(sv->d, cred.pid, cred.uid, cred.gid, admin, &f);
	if (!p->sess) {
		free(p);
		kvp_log_limited(&sv->log_refuse, kvp_now_ms(), LOG_WARNING,
				"refused connection of pid %d: %s", (int)cred.pid, f.msg);
		goto refuse;
	}
	if (kvp_session_set_groups(p->sess, groups, ngroups) < 0) {
		kvp_session_destroy(sv->d, p->sess);
		free(p);
		log_warn("refused connection of pid %d: out of memory", (int)cred.pid);
		kvp_fail(&f, KVP_ERR_INTERNAL, "out of memory");
		goto refuse;
	}
	p->fd = fd;
	p->pidfd = pidfd;
	p->admin = admin;
	sv->conn_fds += 1 + (pidfd >= 0);
	sv->n_prehello++;
	conn_init(&p->c, &sv->lim, kvp_now_ms());
	conn_watch_exit(&p->c, pidfd >= 0);
	kvp_src_init(&p->recv_src, KVP_SRC_RECV, kvp_loop_cqe_recv, p);
	kvp_src_init(&p->send_src, KVP_SRC_SEND, kvp_loop_cqe_send, p);
	kvp_src_init(&p->pid_src, KVP_SRC_PIDFD, kvp_loop_cqe_pidfd, p);
	kvp_frame_buf_init(&p->in);
	p->next = sv->conns;
	if (sv->conns)
		sv->conns->prev = p;
	sv->conns = p;
	sv->nconns++;
	kvp_loop_ring_arm_recv(sv, p);
	kvp_loop_ring_arm_pidfd(sv, p);
	goto out;
refuse:
	if (pidfd >= 0)
		close(pidfd);
	reject(sv, fd, &f);
out:
	if (groups != groups_buf)
		free(groups);
}

void kvp_loop_admit_accept(void *loop, struct kvp_src *src, const struct io_uring_cqe *cqe)
{
	struct server *sv = loop;
	int res = cqe->res;

	(void)src;
	if (!(cqe->flags & IORING_CQE_F_MORE)) {
		sv->accept_armed = false;
		sv->accept_cancel_sent = false;
	}
	if (res >= 0 && kvp_fault_hit(KVP_FAULT_ACCEPT)) {
		close(res);
		res = -EMFILE;
	}
	if (res >= 0) {
		sv->accept_backoff_ms = 0;
		on_accept(sv, res);
		return;
	}
	if (res == -ECANCELED)
		return;
	sv->d->st.accept_errors++;
	if (res == -EMFILE || res == -ENFILE || res == -ENOBUFS || res == -ENOMEM) {
		/* Out of descriptors or memory: accepting again at once would fail the same way,
		 * forever. Wait, doubling the wait, and let the tick arm it again. */
		uint64_t now = kvp_now_ms();

		sv->accept_backoff_ms =
			sv->accept_backoff_ms ? 2 * sv->accept_backoff_ms : ACCEPT_BACKOFF_MS;
		if (sv->accept_backoff_ms > ACCEPT_BACKOFF_MAX_MS)
			sv->accept_backoff_ms = ACCEPT_BACKOFF_MAX_MS;
		sv->accept_retry_ms = now + sv->accept_backoff_ms;
		if (sv->accept_armed)
			kvp_loop_ring_cancel_accept(sv);
		kvp_log_limited(&sv->log_accept, now, LOG_WARNING,
				"accept: %s: trying again in %lu ms", strerror(-res),
				(unsigned long)sv->accept_backoff_ms);
		return;
	}
	kvp_log_limited(&sv->log_accept, kvp_now_ms(), LOG_WARNING, "accept: %s", strerror(-res));
}

/* Whether n more input bytes would grow p's input buffer past IN_KEEP and the buffer budget
 * (admins excepted): the frame is then refused and the connection closed (its id is not known
 * yet, so no call can be answered). */
bool kvp_loop_admit_input_refused(struct server *sv, struct peer *p, size_t n)
{
	size_t need = kvp_frame_pending(&p->in) + n;
	struct kvp_admit_counts c = admit_counts(sv);
	struct kvp_fail f = { 0 };

	if (p->admin || need <= IN_KEEP || need <= p->in.cap)
		return false;
	if (kvp_admit_buffer(&sv->d->conf, &c, need - p->in.cap, &f) == 0)
		return false;
	sv->d->st.refused_buffers++;
	kvp_log_limited(&sv->log_refuse, kvp_now_ms(), LOG_WARNING,
			"input of session %lu (pid %d) refused: %s", (unsigned long)p->sess->id,
			(int)p->sess->pid, f.msg);
	return true;
}
