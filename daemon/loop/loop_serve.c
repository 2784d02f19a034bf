/* loop_serve.c - serving a connection: its complete frames decoded, admitted, dispatched and
 * answered, a turn budget at a time; deferred replies delivered; connections taken off the
 * ready list. */
#include "loop_serve.h"

#include <time.h>

#include "dispatch.h"
#include "log.h"
#include "loop_admit.h"
#include "loop_notice.h"
#include "loop_peer.h"
#include "loop_ring.h"
#include "reserve.h"

static uint64_t ms_of(const struct timespec *t)
{
	return (uint64_t)t->tv_sec * 1000 + (uint64_t)t->tv_nsec / 1000000;
}

static double elapsed_us(const struct timespec *a, const struct timespec *b)
{
	return (double)(b->tv_sec - a->tv_sec) * 1e6 + (double)(b->tv_nsec - a->tv_nsec) / 1e3;
}

/* After a turn: which of the client's deadlines run. While complete requests wait (kvpoold is
 * behind) neither the half-frame clock nor the keep-alive runs; the half-frame clock runs only
 * while kvpoold reads and holds part of a frame, from the last frame served (served: this turn
 * served one). A large input buffer is given back once drained. */
static void note_input(struct server *sv, struct peer *p, bool served, uint64_t now)
{
	bool waiting = kvp_frame_ready(&p->in) || kvp_loop_admit_budget_hold(sv, p);

	conn_backlog(&p->c, waiting);
	if (served) /* the stream moves: whatever part of a frame is held is a new one */
		conn_input_note(&p->c, false, now);
	conn_input_note(&p->c, !waiting && !conn_paused(&p->c) && kvp_frame_pending(&p->in), now);
	if (p->in.cap > IN_KEEP && kvp_frame_pending(&p->in) <= IN_KEEP / 4) {
		kvp_frame_buf_shrink(&p->in, 0);
		kvp_loop_peer_account_input(sv, p);
	}
}

/* Serves p's complete frames, up to its budget. Each request is decoded into the server's
 * arena, dispatched and its reply packed into p's queue; the time from the end of one to the
 * end of the next (decode, dispatch, pack: one clock read per request) is the call's
 * server-side latency. */
static void serve_frames_budget(struct server *sv, struct peer *p)
{
	struct timespec prev, now;
	bool served = false;

	clock_gettime(CLOCK_MONOTONIC, &prev);
	now = prev;
	conn_turn_begin(&p->c);
	while (conn_serving(&p->c) && !conn_paused(&p->c) && !p->close_why &&
	       !kvp_loop_admit_budget_hold(sv, p)) {
		const uint8_t *payload;
		Kvpool__Request *req;
		struct kvp_reply r;
		struct kvp_fail f = { 0 };
		bool refused_close = false;
		uint32_t len;
		int n, code;

		if (!conn_turn_take(&p->c)) {
			kvp_loop_ring_ready(sv, p); /* more next turn, after everyone else */
			break;
		}
		n = kvp_frame_next(&p->in, &payload, &len);
		if (n < 0) {
			kvp_loop_peer_protocol_error(sv, p, "frame larger than the maximum");
			return;
		}
		if (n == 0)
			break;
		sv->d->st.frames_in++;
		req = kvp_frame_decode_request_in(&sv->arena, payload, len);
		if (!req) {
			bool oom = sv->arena.oom;

			kvp_arena_reset(&sv->arena);
			if (oom) /* the request may be fine; its id is not known */
				kvp_loop_peer_fail_close(sv, p, KVP_ERR_INTERNAL,
							 "out of memory decoding a request");
			else
				kvp_loop_peer_protocol_error(sv, p, "frame is not a valid Request");
			return;
		}
		if (!served)
			p->sess->last_ms = ms_of(&prev); /* a call is activity, from its start */
		kvp_reply_init(&r, req->id);
		if (kvp_loop_admit_call(sv, p, req, &f, &refused_close)) {
			kvp_reply_fail(&r, &f);
			code = (int)f.code;
			r.close_after = refused_close;
		} else {
			code = kvp_dispatch_frame(sv->d, p->sess, req, payload, len, &r);
		}
		if (p->c.state == CONN_HANDSHAKE && p->sess->hello) {
			conn_set_state(&p->c, CONN_OPEN);
			p->greeted_counted = true;
			sv->n_prehello--;
			sv->n_greeted++;
		}
		kvp_loop_pool_events(sv); /* its notices go ahead of its reply */
		if (code != KVP_DEFERRED) /* else kvp_loop_serve_deferred sends it later */
			kvp_loop_peer_reply(sv, p, &r);
		kvp_reply_release(&r);
		clock_gettime(CLOCK_MONOTONIC, &now);
		if (code != KVP_DEFERRED)
			kvp_rpc_observe(&sv->d->rpc, (int)req->call_case, code,
					elapsed_us(&prev, &now));
		kvp_arena_reset(&sv->arena);
		prev = now;
		served = true;
	}
	if (served && p->sess) {
		p->sess->last_ms = ms_of(&now);
		conn_activity(&p->c, ms_of(&now));
	}
	note_input(sv, p, served, kvp_now_ms());
}

/* Serves a connection's complete frames (up to its budget), then sends the replies of the
 * turn together. A connection closed meanwhile (a reply that could not be queued) is freed
 * here, not under the code still using it. Returns false when p is closing: the caller must
 * not touch it any more. */
bool kvp_loop_serve(struct server *sv, struct peer *p)
{
	conn_hold(&p->c, CONN_HOLD_SERVE);
	serve_frames_budget(sv, p);
	if (p->sess && !p->close_why && sv->d->n_reserves) {
		uint32_t budget = KVP_RESERVE_TURN_PAGES; /* pays for any one session */

		kvp_reserve_upkeep(sv->d, p->sess, &budget);
	}
	kvp_loop_ring_arm_send(sv, p);
	conn_release(&p->c, CONN_HOLD_SERVE);
	if (conn_closing(&p->c)) {
		kvp_loop_peer_maybe_free(sv, p);
		return false;
	}
	return true;
}

/* A deferred reply (defer.h) is ready: it goes to the connection of its session, if that
 * session is still served; its latency runs from the call's arrival. */
bool kvp_loop_serve_deferred(void *ctx, const struct kvp_defer *t, struct kvp_reply *r, int code)
{
	struct server *sv = ctx;
	struct timespec now;
	struct peer *p;

	for (p = sv->conns; p; p = p->next)
		if (p->sess && p->sess->id == t->session_id)
			break;
	if (!p || conn_closing(&p->c)) {
		log_info("deferred reply to request %lu of session %lu dropped: the session ended",
			 (unsigned long)t->req_id, (unsigned long)t->session_id);
		return false;
	}
	clock_gettime(CLOCK_MONOTONIC, &now);
	kvp_rpc_observe(&sv->d->rpc, t->call_case, code, elapsed_us(&t->started, &now));
	conn_hold(&p->c, CONN_HOLD_SERVE); /* a reply that cannot be queued closes p */
	kvp_loop_peer_reply(sv, p, r);
	kvp_loop_ring_arm_send(sv, p);
	conn_release(&p->c, CONN_HOLD_SERVE);
	if (conn_closing(&p->c))
		kvp_loop_peer_maybe_free(sv, p);
	return true;
}

/* A connection taken off the ready list: served and re-armed, or, closing, freed once nothing
 * refers to it. An operation that found no SQE last turn is tried again here. */
void kvp_loop_serve_look_again(struct server *sv, struct peer *p)
{
	conn_release(&p->c, CONN_HOLD_READY);
	if (conn_closing(&p->c)) {
		kvp_loop_ring_cancel_pidfd(sv, p);
		kvp_loop_peer_maybe_free(sv, p);
		return;
	}
	if (sv->stopping)
		kvp_loop_ring_arm_send(sv, p); /* only what was answered before the stop leaves */
	else if (!kvp_loop_serve(sv, p))
		return;
	kvp_loop_ring_arm_recv(sv, p);
	kvp_loop_ring_arm_pidfd(sv, p);
}
