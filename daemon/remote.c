/* remote.c - drives a Redis Cluster client (remote_cluster.c) from the io_uring loop through
 * one epoll fd holding the client's sockets and a timerfd for its next deadline (remote.h). */
#include "remote.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include "remote_cluster.h"

#define TIMER_TAG (-1) /* epoll data of the timerfd */

struct reg {
	int fd;
	uint32_t events; /* EPOLLIN / EPOLLOUT as registered */
};

struct kvp_remote {
	struct kvp_remote_conf conf;
	struct kvp_rc *rc;
	int epfd, tfd;
	uint64_t gen;	     /* kvp_rc_fds_gen() the set was built from */
	int synced;	     /* gen is valid */
	int64_t deadline_ms; /* the timer's deadline on kvp_rc_now_ms(); -1: disarmed */
	int64_t alarm_ms;    /* kvp_remote_set_alarm's; -1: none */
	struct reg regs[KVP_RC_NODES_MAX];
	int nregs;
};

static uint32_t to_epoll(short ev)
{
	return (ev & POLLIN ? EPOLLIN : 0) | (ev & POLLOUT ? EPOLLOUT : 0);
}

static short to_poll(uint32_t ev)
{
	return (short)((ev & EPOLLIN ? POLLIN : 0) | (ev & EPOLLOUT ? POLLOUT : 0) |
		       (ev & EPOLLERR ? POLLERR : 0) | (ev & EPOLLHUP ? POLLHUP : 0));
}

struct kvp_remote *kvp_remote_new(const struct kvp_remote_conf *conf)
{
	struct kvp_rc_config cfg = {
		.seeds = conf->seeds,
		.connect_timeout_ms = conf->connect_timeout_ms,
		.op_timeout_ms = conf->command_timeout_ms,
		.max_inflight_bytes = conf->max_inflight_bytes,
	};
	struct epoll_event ev = { .events = EPOLLIN, .data.fd = TIMER_TAG };
	struct kvp_remote *r;
	int e;

	if (!conf->enabled || !conf->seeds[0]) {
		errno = EINVAL;
		return NULL;
	}
	r = calloc(1, sizeof(*r));
	if (!r)
		return NULL;
	r->conf = *conf;
	r->epfd = epoll_create1(EPOLL_CLOEXEC);
	r->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
	r->deadline_ms = -1;
	r->alarm_ms = -1;
	if (r->epfd < 0 || r->tfd < 0 || epoll_ctl(r->epfd, EPOLL_CTL_ADD, r->tfd, &ev) < 0)
		goto fail;
	r->rc = kvp_rc_new(&cfg);
	if (!r->rc) {
		errno = errno == ENOMEM ? ENOMEM : EINVAL;
		goto fail;
	}
	kvp_remote_sync(r);
	return r;
fail:
	e = errno;
	if (r->epfd >= 0)
		close(r->epfd);
	if (r->tfd >= 0)
		close(r->tfd);
	free(r);
	errno = e;
	return NULL;
}

void kvp_remote_free(struct kvp_remote *r)
{
	if (!r)
		return;
	kvp_rc_free(r->rc);
	close(r->epfd);
	close(r->tfd);
	free(r);
}

int kvp_remote_fd(const struct kvp_remote *r)
{
	return r->epfd;
}

struct kvp_rc *kvp_remote_rc(struct kvp_remote *r)
{
	return r->rc;
}

const struct kvp_remote_conf *kvp_remote_conf(const struct kvp_remote *r)
{
	return &r->conf;
}

void kvp_remote_stats_read(const struct kvp_remote *r, struct kvp_remote_stats *out)
{
	const struct kvp_rc_stats *s = kvp_rc_stats(r->rc);

	out->ok = s->status[KVP_RC_OK];
	out->hits = s->status[KVP_RC_HIT];
	out->misses = s->status[KVP_RC_MISS];
	out->timeouts = s->status[KVP_RC_ETIMEOUT];
	out->node_down = s->status[KVP_RC_ENODE_DOWN];
	out->no_master = s->status[KVP_RC_ENO_MASTER];
	out->redirect_limit = s->status[KVP_RC_EREDIRECTS];
	out->protocol_errors = s->status[KVP_RC_EPROTOCOL];
	out->closed = s->status[KVP_RC_ECLOSED];
	out->moved = s->moved;
	out->ask = s->ask;
	out->slot_map_loads = s->refreshes;
	out->slot_map_timeouts = s->refresh_timeouts;
	out->connects = s->connects;
	out->disconnects = s->disconnects;
	out->rejected = s->rejected;
	out->sent_bytes = s->sent_bytes;
	out->recv_bytes = s->recv_bytes;
	out->inflight_ops = kvp_rc_inflight(r->rc, &out->inflight_bytes);
}

/* Registers fd for events: MOD when known, ADD otherwise; a closed fd leaves the epoll set
 * by itself, and its number may come back as a new socket, so each falls back on the other. */
static void reg_set(struct kvp_remote *r, int fd, uint32_t events, int known)
{
	struct epoll_event ev = { .events = events, .data.fd = fd };

	if (known && epoll_ctl(r->epfd, EPOLL_CTL_MOD, fd, &ev) == 0)
		return;
	if (epoll_ctl(r->epfd, EPOLL_CTL_ADD, fd, &ev) < 0 && errno == EEXIST)
		epoll_ctl(r->epfd, EPOLL_CTL_MOD, fd, &ev);
}

static void sync_fds(struct kvp_remote *r)
{
	struct pollfd p[KVP_RC_NODES_MAX];
	struct reg next[KVP_RC_NODES_MAX];
	int n = kvp_rc_fds(r->rc, p, KVP_RC_NODES_MAX);

	if (n > KVP_RC_NODES_MAX)
		n = KVP_RC_NODES_MAX;
	for (int i = 0; i < n; i++) {
		uint32_t ev = to_epoll(p[i].events);
		int known = 0;

		for (int j = 0; j < r->nregs; j++) {
			if (r->regs[j].fd != p[i].fd)
				continue;
			known = 1;
			if (r->regs[j].events != ev)
				reg_set(r, p[i].fd, ev, 1);
			r->regs[j].fd = -1; /* kept */
			break;
		}
		if (!known)
			reg_set(r, p[i].fd, ev, 0);
		next[i] = (struct reg){ p[i].fd, ev };
	}
	/* Those no longer wanted; a closed one is gone already (ENOENT / EBADF are fine). */
	for (int j = 0; j < r->nregs; j++)
		if (r->regs[j].fd >= 0)
			epoll_ctl(r->epfd, EPOLL_CTL_DEL, r->regs[j].fd, NULL);
	memcpy(r->regs, next, (size_t)n * sizeof(next[0]));
	r->nregs = n;
}

static void sync_timer(struct kvp_remote *r)
{
	int t = kvp_rc_next_timeout_ms(r->rc);
	int64_t deadline = t < 0 ? -1 : (int64_t)kvp_rc_now_ms() + t;
	struct itimerspec its = { 0 };

	if (r->alarm_ms >= 0 && (deadline < 0 || r->alarm_ms < deadline))
		deadline = r->alarm_ms;

	/* Re-armed only when the deadline moves (a millisecond either way is the same). */
	if (deadline == r->deadline_ms ||
	    (deadline >= 0 && r->deadline_ms >= 0 && deadline >= r->deadline_ms - 1 &&
	     deadline <= r->deadline_ms + 1))
		return;
	r->deadline_ms = deadline;
	if (deadline >= 0) {
		/* An absolute CLOCK_MONOTONIC time (the clock kvp_rc_now_ms() reads); 0 would
		 * disarm, so "now" is 1 ns. */
		its.it_value.tv_sec = deadline / 1000;
		its.it_value.tv_nsec = (deadline % 1000) * 1000000L;
		if (!its.it_value.tv_sec && !its.it_value.tv_nsec)
			its.it_value.tv_nsec = 1;
	}
	timerfd_settime(r->tfd, TFD_TIMER_ABSTIME, &its, NULL);
}

void kvp_remote_set_alarm(struct kvp_remote *r, int64_t at_ms)
{
	r->alarm_ms = at_ms;
	sync_timer(r);
}

void kvp_remote_sync(struct kvp_remote *r)
{
	uint64_t gen = kvp_rc_fds_gen(r->rc);

	if (!r->synced || gen != r->gen) {
		sync_fds(r);
		r->gen = gen;
		r->synced = 1;
	}
	sync_timer(r);
}

void kvp_remote_on_ready(struct kvp_remote *r)
{
	struct epoll_event evs[KVP_RC_NODES_MAX + 1];
	int n = epoll_wait(r->epfd, evs, KVP_RC_NODES_MAX + 1, 0);

	for (int i = 0; i < n; i++) {
		if (evs[i].data.fd == TIMER_TAG) {
			uint64_t ticks;

			while (read(r->tfd, &ticks, sizeof(ticks)) == sizeof(ticks))
				;
			r->deadline_ms = -1; /* fired: the next sync arms it again */
			continue;
		}
		kvp_rc_on_ready(r->rc, evs[i].data.fd, to_poll(evs[i].events));
		/* An fd may have closed and reopened in that call: later events of the same
		 * batch for an fd the client no longer has are ignored by the client. */
	}
	kvp_rc_tick(r->rc, kvp_rc_now_ms());
	kvp_remote_sync(r);
}
