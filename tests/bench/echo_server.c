/* echo_server.c - a minimal io_uring echo server for bench_rpc_throughput: same unix socket
 * framing as kvpoold (4-byte little-endian length + payload), echoes every complete frame back.
 * One thread, one ring; per connection one recv and at most one send in flight. The ceiling a
 * framed io_uring server on this socket reaches with no work per request. */
#include "echo_server.h"

#include <errno.h>
#include <liburing.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAXC 1024
#define INCAP (64u << 10)
#define OUTCAP (1u << 20)

enum { OP_ACCEPT = 1, OP_RECV, OP_SEND };

struct econn {
	int fd;
	int recv_armed, send_armed, dead;
	uint8_t *in, *out;
	size_t in_len, out_off, out_len;
};

static struct econn g_conns[MAXC];

static uint64_t ud(int op, int idx)
{
	return (uint64_t)idx << 8 | (uint64_t)op;
}

static struct io_uring_sqe *sqe_get(struct io_uring *r)
{
	struct io_uring_sqe *s = io_uring_get_sqe(r);

	if (!s) {
		io_uring_submit(r);
		s = io_uring_get_sqe(r);
	}
	return s;
}

static void arm_recv(struct io_uring *r, int i)
{
	struct econn *c = &g_conns[i];
	struct io_uring_sqe *s = sqe_get(r);

	io_uring_prep_recv(s, c->fd, c->in + c->in_len, INCAP - c->in_len, 0);
	io_uring_sqe_set_data64(s, ud(OP_RECV, i));
	c->recv_armed = 1;
}

static void arm_send(struct io_uring *r, int i)
{
	struct econn *c = &g_conns[i];
	struct io_uring_sqe *s = sqe_get(r);

	io_uring_prep_send(s, c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
	io_uring_sqe_set_data64(s, ud(OP_SEND, i));
	c->send_armed = 1;
}

static void arm_accept(struct io_uring *r, int lfd)
{
	struct io_uring_sqe *s = sqe_get(r);

	io_uring_prep_accept(s, lfd, NULL, NULL, SOCK_CLOEXEC);
	io_uring_sqe_set_data64(s, ud(OP_ACCEPT, 0));
}

static void conn_close(int i)
{
	struct econn *c = &g_conns[i];

	c->dead = 1;
	if (!c->recv_armed && !c->send_armed && c->fd >= 0) {
		close(c->fd);
		c->fd = -1;
	}
}

static int on_recv(struct io_uring *r, int i, int res)
{
	struct econn *c = &g_conns[i];
	size_t off = 0;

	c->recv_armed = 0;
	if (res <= 0 || c->dead) {
		conn_close(i);
		return 0;
	}
	c->in_len += (size_t)res;
	while (c->in_len - off >= 4) {
		const uint8_t *h = c->in + off;
		uint32_t len = (uint32_t)h[0] | (uint32_t)h[1] << 8 | (uint32_t)h[2] << 16 |
			       (uint32_t)h[3] << 24;

		if (len > INCAP - 4)
			return -1; /* the framing says the peer is broken */
		if (c->in_len - off - 4 < len)
			break;
		off += 4 + (size_t)len;
	}
	if (off) {
		if (!c->send_armed && c->out_off == c->out_len)
			c->out_off = c->out_len = 0;
		if (c->out_len + off > OUTCAP)
			return -1; /* cannot happen with bounded pipelines */
		memcpy(c->out + c->out_len, c->in, off);
		c->out_len += off;
		memmove(c->in, c->in + off, c->in_len - off);
		c->in_len -= off;
		if (!c->send_armed)
			arm_send(r, i);
	}
	arm_recv(r, i);
	return 0;
}

static void on_send(struct io_uring *r, int i, int res)
{
	struct econn *c = &g_conns[i];

	c->send_armed = 0;
	if (res <= 0 || c->dead) {
		conn_close(i);
		return;
	}
	c->out_off += (size_t)res;
	if (c->out_off == c->out_len)
		c->out_off = c->out_len = 0;
	else
		arm_send(r, i);
}

int echo_server_run(int lfd)
{
	struct io_uring ring;

	if (io_uring_queue_init(1024, &ring, 0) < 0)
		return -1;
	for (int i = 0; i < MAXC; i++)
		g_conns[i].fd = -1;
	arm_accept(&ring, lfd);
	for (;;) {
		struct io_uring_cqe *cqe;
		unsigned head, n = 0;

		if (io_uring_submit_and_wait(&ring, 1) < 0 && errno != EINTR)
			return -1;
		io_uring_for_each_cqe(&ring, head, cqe)
		{
			uint64_t d = io_uring_cqe_get_data64(cqe);
			int op = (int)(d & 0xff), i = (int)(d >> 8), res = cqe->res;

			n++;
			if (op == OP_ACCEPT) {
				int k;

				if (res >= 0) {
					for (k = 0; k < MAXC && g_conns[k].fd >= 0; k++)
						;
					if (k == MAXC) {
						close(res);
					} else {
						struct econn *c = &g_conns[k];

						if (!c->in)
							c->in = malloc(INCAP);
						if (!c->out)
							c->out = malloc(OUTCAP);
						if (!c->in || !c->out)
							return -1;
						c->fd = res;
						c->dead = 0;
						c->in_len = c->out_off = c->out_len = 0;
						arm_recv(&ring, k);
					}
				}
				arm_accept(&ring, lfd);
			} else if (op == OP_RECV) {
				if (on_recv(&ring, i, res) < 0)
					return -1;
			} else if (op == OP_SEND) {
				on_send(&ring, i, res);
			}
		}
		io_uring_cq_advance(&ring, n);
	}
}
