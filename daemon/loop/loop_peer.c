/* loop_peer.c - a connection's life and its output queue: replies packed into the queue,
 * flushing, closing (its session returned at once) and freeing (once nothing refers to it),
 * and the input and reply buffers counted in the buffer budget. */
#include "loop_peer.h"

#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fault.h"
#include "log.h"
#include "loop_ring.h"
#include "session.h"

#define FAIL_FLUSH_MS 1000 /* a connection closed for an error has this long to read why */

/* The input buffer's memory, counted again after it grew or shrank. */
void kvp_loop_peer_account_input(struct server *sv, struct peer *p)
{
	sv->buf_bytes = sv->buf_bytes - p->in_acct + p->in.cap;
	p->in_acct = p->in.cap;
}

void kvp_loop_peer_free_obuf(struct server *sv, struct obuf *o)
{
	sv->buf_bytes -= OBUF_BYTES(o);
	free(o);
}

void kvp_loop_peer_free(struct server *sv, struct peer *p)
{
	struct obuf *o, *n;

	for (o = p->oq_head; o; o = n) {
		n = o->next;
		kvp_loop_peer_free_obuf(sv, o);
	}
	if (p->spare)
		kvp_loop_peer_free_obuf(sv, p->spare);
	kvp_frame_buf_release(&p->in);
	kvp_loop_peer_account_input(sv, p);
	if (p->pidfd >= 0) {
		close(p->pidfd);
		sv->conn_fds--;
	}
	close(p->fd);
	sv->conn_fds--;
	if (p->prev)
		p->prev->next = p->next;
	else
		sv->conns = p->next;
	if (p->next)
		p->next->prev = p->prev;
	sv->nconns--;
	free(p);
}

/* Frees a closing connection once nothing refers to it: no operation in flight, not on the
 * ready list, not being served (a receive and a close can complete in the same batch). */
void kvp_loop_peer_maybe_free(struct server *sv, struct peer *p)
{
	if (conn_freeable(&p->c))
		kvp_loop_peer_free(sv, p);
}

/* Ends a connection: its session (leases, locks) is returned at once; the memory goes when
 * the last hold is released. */
void kvp_loop_peer_close(struct server *sv, struct peer *p, const char *why)
{
	if (conn_closing(&p->c))
		return;
	conn_set_state(&p->c, CONN_CLOSING);
	if (p->greeted_counted)
		sv->n_greeted--;
	else
		sv->n_prehello--;
	if (p->sess) {
		if (why)
			log_info("session %lu ('%s' pid %d): %s", (unsigned long)p->sess->id,
				 p->sess->name, (int)p->sess->pid, why);
		/* Stopping: a session that may resume after the restart stays, without its
		 * connection, until the books are written (kvp_snap_write_all). */
		if (!(sv->stopping && p->sess->hello && sv->d->conf.resume_grace_ms))
			kvp_session_destroy(sv->d, p->sess);
		p->sess = NULL;
	}
	shutdown(p->fd, SHUT_RDWR);
	kvp_loop_ring_cancel_pidfd(sv, p);
	kvp_loop_peer_maybe_free(sv, p);
}

/* After the last reply is queued: nothing more is read; the connection closes once it is
 * sent (by deadline_ms when nonzero). */
void kvp_loop_peer_flush(struct peer *p, uint64_t deadline_ms)
{
	if (p->c.state == CONN_FLUSHING || conn_set_state(&p->c, CONN_FLUSHING) == 0)
		if (deadline_ms)
			conn_flush_deadline(&p->c, deadline_ms);
}

/* Room for a frame of len bytes at the tail of p's queue: the tail buffer when the frame fits
 * and neither carries descriptors, else a new buffer. NULL on ENOMEM. */
static struct obuf *queue_room(struct server *sv, struct peer *p, size_t len, int nfds)
{
	struct obuf *o = p->oq_tail;

	if (o && !o->nfds && !nfds && o->cap - o->len >= len)
		return o;
	if (kvp_fault_hit(KVP_FAULT_REPLY_QUEUE))
		return NULL;
	if (p->spare && len <= OBUF_CAP) {
		o = p->spare;
		p->spare = NULL;
	} else {
		o = malloc(sizeof(*o) + (len > OBUF_CAP ? len : OBUF_CAP));
		if (!o)
			return NULL;
		sv->buf_bytes += sizeof(*o) + (len > OBUF_CAP ? len : OBUF_CAP);
	}
	o->next = NULL;
	o->len = o->off = 0;
	o->cap = len > OBUF_CAP ? len : OBUF_CAP;
	o->nfds = 0;
	if (p->oq_tail)
		p->oq_tail->next = o;
	else
		p->oq_head = o;
	p->oq_tail = o;
	return o;
}

/* Packs a reply straight into p's queue; a reply too large for one frame becomes an INTERNAL
 * status. */
void kvp_loop_peer_reply(struct server *sv, struct peer *p, struct kvp_reply *r)
{
	struct kvp_frame_plan plan;
	size_t len = kvp_frame_plan(&plan, &r->resp.base);
	struct obuf *o;

	if (p->close_why)
		return; /* its stream already lacks a frame: it closes at the top of the loop */
	if (len > KVP_FRAME_HDR + KVP_FRAME_MAX) {
		struct kvp_fail f = { 0 };
		uint64_t id = r->resp.id;

		kvp_reply_release(r);
		kvp_reply_init(r, id);
		kvp_fail(&f, KVP_ERR_INTERNAL, "reply does not fit in one frame");
		kvp_reply_fail(r, &f);
		len = kvp_frame_plan(&plan, &r->resp.base);
	}
	if (r->resp.result_case == KVPOOL__RESPONSE__RESULT_PRESSURE &&
	    kvp_fault_hit(KVP_FAULT_NOTICE))
		o = NULL; /* tests: this notice cannot be queued */
	else
		o = queue_room(sv, p, len, r->nfds);
	if (!o && sv->hold_closes) {
		p->close_why = "out of memory queueing a reply";
		sv->closes_owed = true;
		return;
	}
	if (!o) {
		kvp_loop_peer_close(sv, p, "out of memory queueing a reply");
		return;
	}
	o->len += kvp_frame_pack_plan(&plan, o->data + o->len);
	o->nfds = r->nfds;
	o->req_id = r->resp.id;
	memcpy(o->fds, r->fds, sizeof(int) * (size_t)r->nfds);
	conn_outq_add(&p->c, len, kvp_now_ms());
	p->queued_total += len;
	sv->d->st.frames_out++;
	if (r->close_after)
		kvp_loop_peer_flush(p, 0);
}

/* Closes the connections marked while they could not be (close_why). Called where nothing up
 * the stack uses a session or a connection. A close may end other sessions' work: the walk
 * starts again after each. */
void kvp_loop_peer_close_owed(struct server *sv)
{
	while (sv->closes_owed) {
		const char *why;
		struct peer *p;

		sv->closes_owed = false;
		for (p = sv->conns; p && !p->close_why; p = p->next)
			;
		if (!p)
			break;
		sv->closes_owed = true;
		why = p->close_why;
		p->close_why = NULL;
		kvp_loop_peer_close(sv, p, why); /* p may be freed now */
	}
}

/* A typed status with id 0 (the request could not be read, so it belongs to no call), then the
 * connection ends. p stays allocated until the caller is done with it (it checks the state). */
void kvp_loop_peer_fail_close(struct server *sv, struct peer *p, int code, const char *what)
{
	struct kvp_reply r;
	struct kvp_fail f = { 0 };
	bool serving = conn_held(&p->c, CONN_HOLD_SERVE);

	conn_hold(&p->c, CONN_HOLD_SERVE);
	log_warn("connection of pid %d: %s: closing it", p->sess ? (int)p->sess->pid : -1, what);
	kvp_reply_init(&r, 0);
	kvp_fail(&f, code, "%s", what);
	kvp_reply_fail(&r, &f);
	r.close_after = true;
	kvp_loop_peer_reply(sv, p, &r);
	kvp_reply_release(&r);
	kvp_loop_peer_flush(p, kvp_now_ms() + FAIL_FLUSH_MS);
	kvp_loop_ring_arm_send(sv, p);
	p->in.len = p->in.off = 0; /* nothing more is read from this stream */
	if (!serving)
		conn_release(&p->c, CONN_HOLD_SERVE);
}

void kvp_loop_peer_protocol_error(struct server *sv, struct peer *p, const char *what)
{
	sv->d->st.protocol_errors++;
	kvp_loop_peer_fail_close(sv, p, KVP_ERR_PROTOCOL, what);
}

/* The reply at the head of p's queue carries descriptors the kernel would not pass
 * (ETOOMANYREFS: too many of kvpoold's descriptors are in flight; EMFILE, ENFILE): that call
 * alone fails, LIMIT_EXCEEDED in place of its reply; the connection goes on. Returns false
 * when no error reply could be made (then the connection closes). */
bool kvp_loop_peer_fd_reply_refused(struct server *sv, struct peer *p)
{
	struct obuf *o = p->oq_head, *e;
	struct kvp_reply r;
	struct kvp_fail f = { 0 };
	struct kvp_frame_plan plan;
	size_t len;

	kvp_reply_init(&r, o->req_id);
	kvp_fail_limit(&f, "descriptors in flight", sv->fd_limit);
	kvp_fail(&f, KVP_ERR_LIMIT_EXCEEDED,
		 "the pool's memory descriptors cannot be passed now: too many of kvpoold's "
		 "descriptors are in flight to clients that have not read them; try again");
	kvp_reply_fail(&r, &f);
	len = kvp_frame_plan(&plan, &r.resp.base);
	e = malloc(sizeof(*e) + len);
	if (!e) {
		kvp_reply_release(&r);
		return false;
	}
	e->cap = len;
	e->len = kvp_frame_pack_plan(&plan, e->data);
	e->off = 0;
	e->nfds = 0;
	e->req_id = o->req_id;
	e->next = o->next;
	kvp_reply_release(&r);
	sv->buf_bytes += OBUF_BYTES(e);
	p->oq_head = e;
	if (p->oq_tail == o)
		p->oq_tail = e;
	conn_outq_add(&p->c, e->len, kvp_now_ms()); /* before: the queue never looks empty */
	conn_outq_sent(&p->c, o->len);
	kvp_loop_peer_free_obuf(sv, o);
	sv->d->st.refused_attach_fds++;
	kvp_log_limited(&sv->log_send, kvp_now_ms(), LOG_WARNING,
			"session %lu (pid %d): an Attach reply's descriptors could not be passed: "
			"answered LIMIT_EXCEEDED",
			p->sess ? (unsigned long)p->sess->id : 0UL,
			p->sess ? (int)p->sess->pid : -1);
	return true;
}
