/* loop_notice.c - pressure notices (pressure.h) pushed to the sessions that asked for them:
 * frames with id 0 that answer no call, sent once the previous ones were read. */
#include "loop_notice.h"

#include <linux/sockios.h>
#include <sys/ioctl.h>

#include "dispatch.h"
#include "loop_peer.h"
#include "loop_ring.h"
#include "pressure.h"

/* Whether p's peer has read the last pressure notice sent to it: all of it sent, and what
 * waits unread in the socket (SIOCOUTQ: the newest bytes, counted with their buffers'
 * overhead, so never fewer than they are) fits in what was sent after it. */
static bool notice_read(struct peer *p)
{
	int unread = 0;

	if (!p->notice_mark)
		return true;
	if (p->sent_total < p->notice_mark || ioctl(p->fd, SIOCOUTQ, &unread) < 0 || unread < 0 ||
	    (uint64_t)unread > p->sent_total - p->notice_mark)
		return false;
	p->notice_mark = 0;
	return true;
}

/* Pressure notices (pressure.h) owed to sessions, pushed as Responses with id 0. A session's
 * notices go once it has read the previous ones, so one that never reads holds one batch in
 * its socket and the rest pending in kvpoold (one per pool and tier, replaced by newer
 * states); nothing else changes for it (it is neither paused nor timed out). Looked at when a
 * tier's state changed or a session subscribed, and on the tick while some are pending. */
void kvp_loop_notice_push(struct server *sv, bool tick)
{
	struct kvp_daemon *d = sv->d;
	bool pending = false, serving;
	uint64_t now;

	if (sv->stopping || !kvp_pressure_scan(d, tick))
		return;
	now = kvp_now_ms();
	for (struct peer *p = sv->conns, *n; p; p = n) {
		n = p->next;
		if (!p->sess || p->c.state != CONN_OPEN || p->close_why ||
		    !kvp_pressure_owed(d, p->sess))
			continue;
		if (!notice_read(p)) {
			pending = true;
			continue;
		}
		/* a reply that cannot be queued closes p, or from kvp_loop_pool_events marks it
		 * (close_why); p may be the connection being served (an allocation's notices go out
		 * before it evicts: kvp_loop_pool_events) */
		serving = conn_held(&p->c, CONN_HOLD_SERVE);
		conn_hold(&p->c, CONN_HOLD_SERVE);
		while (p->sess && !p->close_why) {
			struct kvp_reply r;
			int rc;

			kvp_reply_init(&r, 0);
			rc = kvp_pressure_next(d, p->sess, now, &r);
			if (rc > 0) {
				kvp_loop_peer_reply(sv, p, &r);
				p->notice_mark = p->queued_total;
			}
			kvp_reply_release(&r);
			if (rc <= 0)
				break;
		}
		if (p->sess && kvp_pressure_owed(d, p->sess))
			pending = true; /* its pool's rate limit: the tick tries again */
		if (serving)
			continue; /* its server sends, releases and frees it */
		kvp_loop_ring_arm_send(sv, p);
		conn_release(&p->c, CONN_HOLD_SERVE);
		if (conn_closing(&p->c))
			kvp_loop_peer_maybe_free(sv, p);
	}
	kvp_pressure_walked(d, pending);
}

/* An allocation took more pages than were free (the pool's short_ event): when that put its
 * tier under pressure, the notices are queued now, ahead of the allocation's reply, with the
 * figures from before it evicted or failed. No connection closes here: the call's connection
 * is still being served (and its session used), so one whose notice cannot be queued is
 * closed by kvp_loop_peer_close_owed once the loop is back at its top. Landed demotions (the
 * moved event) retry the waiting Allocs, which may take pages in their turn: a few rounds. */
void kvp_loop_pool_events(struct server *sv)
{
	struct kvp_daemon *d = sv->d;

	for (int round = 0; round < 4; round++) {
		bool any = false, notices = false, moved = false;

		for (uint32_t i = 0; i < d->n_pools; i++) {
			struct kvpd_pool *p = d->pools[i];
			struct kvp_pool_events ev;

			if (!p || !kvp_pool_events_take(p, &ev))
				continue;
			any = true;
			moved |= ev.moved;
			for (int t = 0; t < KVP_TIER_ID_MAX; t++)
				if ((ev.short_ & (1u << t)) && kvp_pressure_short(d, p, t, &ev))
					notices = true;
		}
		if (!any)
			return;
		if (notices) {
			sv->hold_closes++;
			kvp_loop_notice_push(sv, false);
			sv->hold_closes--;
			kvp_pressure_figures_done(d);
		}
		if (moved) /* every waiting Alloc: one whose pool has nothing in flight ends */
			kvp_rpc_alloc_retry(d);
	}
}
