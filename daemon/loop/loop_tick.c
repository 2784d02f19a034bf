/* loop_tick.c - the periodic tick: connections' deadlines, sessions a reload evicted, the
 * descriptor count, rate-limited logs, snapshots, the end of a drain, the watchdog, metrics,
 * eviction summaries, pending notices and the status line. */
#include "loop_tick.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>

#include "log.h"
#include "loop_notice.h"
#include "loop_peer.h"
#include "loop_ring.h"
#include "metrics.h"
#include "metrics_http.h"
#include "notify.h"
#include "snapshot.h"

#define FDCOUNT_MS 1000 /* kvpoold's own descriptors are counted again this often */

void kvp_loop_tick_status(struct server *sv)
{
	char buf[256];
	uint64_t total = 0, used = 0;

	for (uint32_t i = 0; i < sv->d->n_pools; i++) {
		for (int t = 0; t < KVP_TIER_ID_MAX; t++) {
			struct kvp_tier_counts c;

			kvp_pool_counts(sv->d->pools[i], t, &c);
			total += c.total;
			used += c.leased + c.cached + c.moving;
		}
	}
	snprintf(buf, sizeof(buf), "STATUS=%u pools, %u sessions, %.1f%% of pages in use%s%s",
		 sv->d->n_pools, sv->d->n_sessions,
		 total ? 100.0 * (double)used / (double)total : 0.0,
		 sv->d->draining ? ", draining" : "", sv->reload_busy ? ", reloading" : "");
	kvp_notify(buf);
}

/* kvpoold's descriptors other than its connections' (pools, the ring, reloads, metrics, the
 * remote tier), counted in /proc/self/fd. Kept as it was when they cannot be counted. */
void kvp_loop_tick_count_fds(struct server *sv, uint64_t now)
{
	DIR *dir = opendir("/proc/self/fd");
	uint64_t n = 0;
	struct dirent *e;

	sv->last_fdcount_ms = now;
	if (!dir)
		return;
	while ((e = readdir(dir)))
		n += e->d_name[0] != '.';
	closedir(dir);
	n = n ? n - 1 : 0; /* the directory's own */
	sv->fds_other = n > sv->conn_fds ? n - sv->conn_fds : 0;
}

void kvp_loop_tick(void *loop, struct kvp_src *src, const struct io_uring_cqe *cqe)
{
	struct server *sv = loop;
	struct kvp_daemon *d = sv->d;
	uint64_t now = kvp_now_ms();

	(void)src;
	(void)cqe;
	sv->timer_armed = false;
	sv->lim.keepalive_ms = d->conf.keepalive_ms; /* a reload may change it */
	sv->lim.handshake_ms = d->conf.hello_timeout_ms;
	for (struct peer *p = sv->conns, *n; p; p = n) {
		enum conn_expiry e;

		n = p->next;
		if (p->sess && p->sess->evicted) { /* a reload took its access away */
			kvp_loop_peer_close(sv, p, p->sess->evict_reason);
			continue;
		}
		e = conn_expiry(&p->c, now);
		if (e == CONN_LIVE) {
			/* Frames held back by the buffer budget: looked at again. */
			if (!conn_closing(&p->c) && kvp_frame_ready(&p->in))
				kvp_loop_ring_ready(sv, p);
			continue;
		}
		if (e == CONN_EXPIRED_PARTIAL)
			d->st.protocol_errors++;
		else if (e == CONN_EXPIRED_KEEPALIVE || e == CONN_EXPIRED_UNREAD)
			d->st.sessions_reclaimed++;
		if (e == CONN_EXPIRED_HANDSHAKE) {
			d->st.hello_timeouts++;
			kvp_log_limited(&sv->log_hello, now, LOG_INFO,
					"connection of pid %d uid %u: %s: closed",
					p->sess ? (int)p->sess->pid : -1,
					p->sess ? (unsigned)p->sess->uid : 0u,
					conn_expiry_reason(e));
			kvp_loop_peer_close(sv, p, NULL);
			continue;
		}
		kvp_loop_peer_close(sv, p, conn_expiry_reason(e));
	}
	if (now - sv->last_fdcount_ms >= FDCOUNT_MS)
		kvp_loop_tick_count_fds(sv, now);
	kvp_log_limit_flush(&sv->log_accept, now);
	kvp_log_limit_flush(&sv->log_refuse, now);
	kvp_log_limit_flush(&sv->log_send, now);
	kvp_log_limit_flush(&sv->log_hello, now);
	d->st.log_suppressed = g_log_suppressed;
	kvp_snap_tick(d, now);
	if (d->draining && !sv->stopping && (d->n_sessions == 0 || now >= d->drain_deadline_ms))
		kvp_loop_stop(sv, d->n_sessions ? "drain deadline reached"
						: "drained: no sessions left");
	if (sv->watchdog_ms && now - sv->last_watchdog_ms >= sv->watchdog_ms / 2) {
		kvp_notify("WATCHDOG=1");
		sv->last_watchdog_ms = now;
	}
	if (sv->http && now - sv->last_metrics_ms >= 1000) {
		char *text = kvp_metrics_render(d);

		if (text)
			kvp_metrics_http_publish(sv->http, text, &d->conf);
		free(text);
		sv->last_metrics_ms = now;
	}
	if (now - sv->last_summary_ms >= KVP_SUMMARY_MS) {
		for (uint32_t i = 0; i < d->n_pools; i++)
			kvp_pool_log_summary(d->pools[i], now - sv->last_summary_ms);
		sv->last_summary_ms = now;
	}
	kvp_loop_notice_push(sv, true);
	if (now - sv->last_status_ms >= 5000) {
		kvp_loop_tick_status(sv);
		sv->last_status_ms = now;
	}
	kvp_loop_ring_arm_timer(sv);
}
