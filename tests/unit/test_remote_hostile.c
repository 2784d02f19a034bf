/* test_remote_hostile.c - the Redis Cluster layer against a node that lies: fake nodes on
 * loopback sockets, driven in the test's own poll loop, answer CLUSTER SLOTS, GET and the rest
 * with what a real node never sends (slot ranges out of bounds, a value or an array far larger
 * than the command can return, a reply nobody asked for, redirects to made-up addresses). The
 * client refuses each (a typed failure, counted, the node's connection closed), never loops or
 * allocates on a number from the wire, and keeps following a real slot migration. A case that
 * could spin runs in a child process the test kills after a few seconds. */
#include <CUnit/Basic.h>
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "remote.h"
#include "remote_cluster.h"
#include "secret.h"
#include "suite.h"

#define CONNS_MAX 16
#define ARGS_MAX 8
#define STREAM_CAP (1u << 20) /* filler bytes a fake node sends after a reply's head, at most */

struct fconn {
	int fd;
	char in[1 << 16];
	size_t inlen;
	const char *fill; /* sent over and over after the reply, up to STREAM_CAP */
	size_t filllen, filled;
};

struct fake;
/* Writes the reply to argv into out (at most cap bytes) and returns its length; may set
 * c->fill for a stream after it. */
typedef size_t fake_answer_fn(struct fake *f, struct fconn *c, int argc, const char **argv,
			      const size_t *alen, char *out, size_t cap);

struct fake {
	char ip[16];
	int lfd, port;
	struct fconn c[CONNS_MAX];
	int nc;
	int accepted, closed; /* connections taken, and seen closed by the client */
	fake_answer_fn *answer;
	const char *unsolicited; /* sent to each new connection before anything is asked */
	int phase;		 /* the test's: what the node answers now */
	int slots_port;		 /* the port CLUSTER SLOTS names as every slot's master */
	int gets;
};

static void fake_init(struct fake *f, fake_answer_fn *answer)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t alen = sizeof(a);

	memset(f, 0, sizeof(*f));
	snprintf(f->ip, sizeof(f->ip), "127.0.0.1");
	f->answer = answer;
	f->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	CU_ASSERT_FATAL(f->lfd >= 0);
	CU_ASSERT_FATAL(bind(f->lfd, (struct sockaddr *)&a, sizeof(a)) == 0);
	CU_ASSERT_FATAL(listen(f->lfd, 16) == 0);
	CU_ASSERT_FATAL(getsockname(f->lfd, (struct sockaddr *)&a, &alen) == 0);
	f->port = ntohs(a.sin_port);
	f->slots_port = f->port;
}

static void fake_close(struct fake *f, int i)
{
	close(f->c[i].fd);
	f->c[i] = f->c[--f->nc];
	f->closed++;
}

static void fake_free(struct fake *f)
{
	while (f->nc)
		fake_close(f, 0);
	close(f->lfd);
}

/* Sends what the socket takes of p; -1 once the client closed the connection. */
static ssize_t fake_send(struct fconn *c, const void *p, size_t n)
{
	ssize_t w = send(c->fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);

	if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
		return 0;
	return w;
}

/* One command of c->in ("*N\r\n$L\r\n...\r\n" ...): its arguments, and the bytes it took; 0
 * while incomplete. */
static size_t cmd_parse(struct fconn *c, int *argc, const char **argv, size_t *alen)
{
	char *p = c->in, *e = c->in + c->inlen, *q;
	long n;

	if (p == e || *p != '*' || !(q = memchr(p, '\n', (size_t)(e - p))))
		return 0;
	n = strtol(p + 1, NULL, 10);
	p = q + 1;
	*argc = 0;
	for (long i = 0; i < n; i++) {
		long len;

		if (p >= e || *p != '$' || !(q = memchr(p, '\n', (size_t)(e - p))))
			return 0;
		len = strtol(p + 1, NULL, 10);
		p = q + 1;
		if (e - p < len + 2)
			return 0;
		if (*argc < ARGS_MAX) {
			argv[*argc] = p;
			alen[(*argc)++] = (size_t)len;
		}
		p += len + 2;
	}
	return (size_t)(p - c->in);
}

static void fake_conn_ready(struct fake *f, int i, short revents)
{
	struct fconn *c = &f->c[i];
	static char out[1 << 16];

	if (revents & (POLLIN | POLLHUP | POLLERR)) {
		ssize_t got = read(c->fd, c->in + c->inlen, sizeof(c->in) - c->inlen);
		const char *argv[ARGS_MAX];
		size_t alen[ARGS_MAX], used;
		int argc;

		if (got <= 0) {
			fake_close(f, i);
			return;
		}
		c->inlen += (size_t)got;
		while ((used = cmd_parse(c, &argc, argv, alen))) {
			size_t n = f->answer(f, c, argc, argv, alen, out, sizeof(out));

			if (n && fake_send(c, out, n) < 0) {
				fake_close(f, i);
				return;
			}
			memmove(c->in, c->in + used, c->inlen - used);
			c->inlen -= used;
		}
	}
	while (c->fill && c->filled < STREAM_CAP) {
		ssize_t w = fake_send(c, c->fill, c->filllen);

		if (w < 0) {
			fake_close(f, i);
			return;
		}
		if (!w)
			break;
		c->filled += (size_t)w;
	}
}

static void fake_accept(struct fake *f)
{
	int fd = accept4(f->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);

	if (fd < 0)
		return;
	if (f->nc == CONNS_MAX) {
		close(fd);
		return;
	}
	memset(&f->c[f->nc], 0, sizeof(f->c[0]));
	f->c[f->nc].fd = fd;
	f->accepted++;
	if (f->unsolicited)
		fake_send(&f->c[f->nc], f->unsolicited, strlen(f->unsolicited));
	f->nc++;
}

/* Runs the client and the fake nodes for up to ms, until done(arg) says so. */
static void drive(struct kvp_rc *rc, struct fake **fk, int nf, int ms, int (*done)(void *),
		  void *arg)
{
	uint64_t end = kvp_rc_now_ms() + (uint64_t)ms;

	while (kvp_rc_now_ms() < end && !(done && done(arg))) {
		struct pollfd p[KVP_RC_NODES_MAX + 4 * (1 + CONNS_MAX)];
		int n = kvp_rc_fds(rc, p, KVP_RC_NODES_MAX), k = n, t = kvp_rc_next_timeout_ms(rc);

		if (n > KVP_RC_NODES_MAX)
			n = k = KVP_RC_NODES_MAX;
		for (int j = 0; j < nf; j++) {
			p[k++] = (struct pollfd){ .fd = fk[j]->lfd, .events = POLLIN };
			for (int i = 0; i < fk[j]->nc; i++)
				p[k++] = (struct pollfd){
					.fd = fk[j]->c[i].fd,
					.events = (short)(POLLIN | (fk[j]->c[i].fill ? POLLOUT : 0))
				};
		}
		if (poll(p, (nfds_t)k, t < 0 || t > 10 ? 10 : t) > 0) {
			for (int i = 0; i < n; i++)
				if (p[i].revents)
					kvp_rc_on_ready(rc, p[i].fd, p[i].revents);
			for (int j = 0, at = n; j < nf; j++) {
				int nc = fk[j]->nc;

				if (p[at++].revents)
					fake_accept(fk[j]);
				/* from the last: a closed one is replaced by the last */
				for (int i = nc - 1; i >= 0; i--)
					if (i < fk[j]->nc && p[at + i].revents)
						fake_conn_ready(fk[j], i, p[at + i].revents);
				at += nc;
			}
		}
		kvp_rc_tick(rc, kvp_rc_now_ms());
	}
}

static int argis(const char *a, size_t n, const char *s)
{
	return n == strlen(s) && !strncasecmp(a, s, n);
}

/* "every slot on port": one range, 0..16383, its master 127.0.0.1:port. */
static size_t slots_all(char *out, size_t cap, int port)
{
	return (size_t)
		snprintf(out, cap,
			 "*1\r\n*3\r\n:0\r\n:16383\r\n*3\r\n$9\r\n127.0.0.1\r\n:%d\r\n$2\r\nid\r\n",
			 port);
}

/* ---- replies that are none: the slot map ---- */

static const char *g_slots; /* what the fake answers CLUSTER SLOTS with */

static size_t answer_slots(struct fake *f, struct fconn *c, int argc, const char **argv,
			   const size_t *alen, char *out, size_t cap)
{
	(void)f;
	(void)c;
	if (argc == 2 && argis(argv[0], alen[0], "CLUSTER"))
		return (size_t)snprintf(out, cap, "%s", g_slots);
	return (size_t)snprintf(out, cap, "-ERR not here\r\n");
}

static int two_closed(void *arg)
{
	return ((struct fake *)arg)->closed >= 2;
}

/* In a child: the client against a fake seed that answers CLUSTER SLOTS with reply. Exits 0
 * when the reply was refused (counted, the node dropped and asked again, no map) within 3 s. */
static void slots_child(const char *reply, const char *unsolicited)
{
	struct kvp_rc_config cfg = { .op_timeout_ms = 3000, .backoff_min_ms = 10 };
	struct fake f, *fk[1] = { &f };
	struct kvp_rc *rc;
	char seeds[64];
	int fail = 0;

	g_slots = reply;
	fake_init(&f, answer_slots);
	f.unsolicited = unsolicited;
	snprintf(seeds, sizeof(seeds), "127.0.0.1:%d", f.port);
	cfg.seeds = seeds;
	rc = kvp_rc_new(&cfg);
	if (!rc)
		_exit(10);
	drive(rc, fk, 1, 3000, two_closed, &f);
	if (f.closed < 2) /* refused, dropped, connected again, refused again */
		fail = 11;
	else if (kvp_rc_stats(rc)->refreshes != 0 || kvp_rc_ready(rc))
		fail = 12;
	else if (kvp_rc_stats(rc)->bad_replies < 2)
		fail = 13;
	else if (kvp_rc_stats(rc)->refresh_timeouts != 0) /* refused, not waited for */
		fail = 14;
	kvp_rc_free(rc);
	fake_free(&f);
	_exit(fail);
}

/* Runs slots_child in a child killed after 6 s: its exit status, or -1 when it had to be
 * killed (it spun) or died of a signal. */
static int slots_case(const char *reply, const char *unsolicited)
{
	pid_t pid = fork();
	int st;

	CU_ASSERT_FATAL(pid >= 0);
	if (!pid)
		slots_child(reply, unsolicited);
	for (int i = 0; i < 600; i++) {
		if (waitpid(pid, &st, WNOHANG) == pid)
			return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
		usleep(10000);
	}
	kill(pid, SIGKILL);
	waitpid(pid, &st, 0);
	return -1;
}

#define NODE_OK(port) "*3\r\n$9\r\n127.0.0.1\r\n:" port "\r\n$2\r\nid\r\n"

/* CLUSTER SLOTS replies that are none: each refused whole, counted, the node dropped; the first
 * made the I/O thread count from -9.2e18 to the range's end. */
static void test_rc_slots_reply_out_of_range_refused(void)
{
	static const char *const bad[] = {
		/* a range start of -9223372036854775807 */
		"*1\r\n*3\r\n:-9223372036854775807\r\n:5\r\n" NODE_OK("7000"),
		"*1\r\n*3\r\n:-1\r\n:5\r\n" NODE_OK("7000"),
		"*1\r\n*3\r\n:0\r\n:16384\r\n" NODE_OK("7000"), /* past the last slot */
		"*1\r\n*3\r\n:0\r\n:9223372036854775807\r\n" NODE_OK("7000"),
		"*1\r\n*3\r\n:100\r\n:99\r\n" NODE_OK("7000"),	 /* start after end */
		"*1\r\n*3\r\n:0\r\n:16383\r\n" NODE_OK("0"),	 /* port 0 */
		"*1\r\n*3\r\n:0\r\n:16383\r\n" NODE_OK("65536"), /* port past 65535 */
		"*1\r\n*3\r\n:0\r\n:16383\r\n" NODE_OK("-7000"),
		"*1\r\n*2\r\n:0\r\n:16383\r\n",			     /* no master */
		"*1\r\n*3\r\n$1\r\n0\r\n:16383\r\n" NODE_OK("7000"), /* a string for a slot */
		"*16385\r\n",					     /* more ranges than slots */
		"*1\r\n*3\r\n:0\r\n:16383\r\n*3\r\n$100000\r\n",     /* a host of 100000 bytes */
		"*1\r\n*3\r\n:0\r\n:16383\r\n*3\r\n*1\r\n*1\r\n*1\r\n:1\r\n", /* nested deeper */
		"*1\r\n*3\r\n:0\r\n:16383\r\n*4\r\n$9\r\n127.0.0.1\r\n:7000\r\n$2\r\nid\r\n*1\r\n*1\r\n"
		":1\r\n", /* an array in a node's metadata */
		":1\r\n", /* not an array */
		"+OK\r\n",
	};

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		int st = slots_case(bad[i], NULL);

		if (st != 0)
			fprintf(stderr, "\n  CLUSTER SLOTS reply %zu: child status %d\n", i, st);
		CU_ASSERT_EQUAL(st, 0);
	}
}

/* A reply nobody asked for (hiredis aborts the process on one that is not an error): refused,
 * the connection closed, counted. */
static void test_rc_unsolicited_reply_refused(void)
{
	static const char good[] = "*1\r\n*3\r\n:0\r\n:16383\r\n" NODE_OK("1");

	CU_ASSERT_EQUAL(slots_case(good, "+OK\r\n"), 0);
	CU_ASSERT_EQUAL(slots_case(good, ":1\r\n"), 0);
	CU_ASSERT_EQUAL(slots_case(good, "*1\r\n$1\r\nx\r\n"), 0);
}

/* ---- replies larger than the command can return ---- */

struct op {
	int calls;
	enum kvp_rc_status st;
	size_t len;
	uint64_t at; /* when it completed */
};

static void on_op(void *arg, enum kvp_rc_status st, const void *val, size_t len)
{
	struct op *o = arg;

	(void)val;
	o->calls++;
	o->st = st;
	o->len = len;
	o->at = kvp_rc_now_ms();
}

static int op_done(void *arg)
{
	return ((struct op *)arg)->calls > 0;
}

static char g_fill[64 << 10];
static const char *g_get_head; /* what GET is answered with (then g_fill, when set) */
static size_t g_get_fill;      /* filler bytes per write after it; 0: none */

static size_t answer_get(struct fake *f, struct fconn *c, int argc, const char **argv,
			 const size_t *alen, char *out, size_t cap)
{
	if (argc == 2 && argis(argv[0], alen[0], "CLUSTER"))
		return slots_all(out, cap, f->port);
	if (argc == 2 && argis(argv[0], alen[0], "GET")) {
		f->gets++;
		if (g_get_fill) {
			c->fill = g_fill;
			c->filllen = g_get_fill;
		}
		return (size_t)snprintf(out, cap, "%s", g_get_head);
	}
	return (size_t)snprintf(out, cap, "-ERR not here\r\n");
}

static size_t g_buf_max; /* the largest buffer the client asked buf_get for */

static void *buf_get(void *ctx, size_t len)
{
	(void)ctx;
	if (len > g_buf_max)
		g_buf_max = len;
	return len <= (64u << 20) ? malloc(len) : NULL;
}

static void buf_put(void *ctx, void *buf)
{
	(void)ctx;
	free(buf);
}

static int rc_ready(void *arg)
{
	return kvp_rc_ready(arg);
}

/* A GET answered with head (and a stream of filler after it): completes with st. Returns the
 * milliseconds it took. */
static uint64_t get_hostile(const char *head, size_t fill, uint64_t max_len, enum kvp_rc_status st)
{
	struct kvp_rc_config cfg = { .op_timeout_ms = 2000,
				     .buf_get = buf_get,
				     .buf_put = buf_put };
	struct fake f, *fk[1] = { &f };
	struct op o = { 0 };
	struct kvp_rc *rc;
	char seeds[64];
	uint64_t t0;

	g_get_head = head;
	g_get_fill = fill;
	g_buf_max = 0;
	fake_init(&f, answer_get);
	snprintf(seeds, sizeof(seeds), "127.0.0.1:%d", f.port);
	cfg.seeds = seeds;
	rc = kvp_rc_new(&cfg);
	CU_ASSERT_PTR_NOT_NULL_FATAL(rc);
	drive(rc, fk, 1, 2000, rc_ready, rc);
	CU_ASSERT_FATAL(kvp_rc_ready(rc));
	t0 = kvp_rc_now_ms();
	CU_ASSERT_EQUAL(kvp_rc_get_max(rc, "k", 1, max_len, on_op, &o), 0);
	drive(rc, fk, 1, 4000, op_done, &o);
	CU_ASSERT_EQUAL(o.calls, 1);
	CU_ASSERT_EQUAL(o.st, st);
	if (st == KVP_RC_HIT)
		CU_ASSERT_EQUAL(o.len, 1000);
	if (st == KVP_RC_EPROTOCOL) {
		CU_ASSERT(o.at - t0 < 1000); /* refused as announced, not timed out */
		CU_ASSERT(kvp_rc_stats(rc)->bad_replies >= 1);
		drive(rc, fk, 1, 1000, NULL, NULL);
		CU_ASSERT(f.closed >= 1); /* the node's connection closed */
	}
	CU_ASSERT(g_buf_max <= (64u << 20)); /* nothing sized from the wire past the bound */
	kvp_rc_free(rc);
	fake_free(&f);
	return o.at - t0;
}

/* A GET answered with a bulk announced at about 2 GiB, its bytes streaming in: refused as soon
 * as the length is read (it allocated the announced size and kept the buffer). */
static void test_rc_get_bulk_past_bound_refused(void)
{
	static char head[1024];

	memset(g_fill, 'x', sizeof(g_fill));
	get_hostile("$2147483000\r\n", sizeof(g_fill), 0, KVP_RC_EPROTOCOL);
	get_hostile("$99999999999999999999\r\n", sizeof(g_fill), 0, KVP_RC_EPROTOCOL);
	/* a page value's bound (kvp_rc_get_max): one byte more is refused, the bound itself read */
	get_hostile("$1001\r\n", 1001, 1000, KVP_RC_EPROTOCOL);
	memcpy(head, "$1000\r\n", 7);
	memset(head + 7, 'x', 1000);
	memcpy(head + 1007, "\r\n", 3);
	get_hostile(head, 0, 1000, KVP_RC_HIT);
}

/* A GET answered with an array announcing 2^31-1 elements, then elements: refused at its
 * length line (the heap grew by about 20 bytes per byte sent until the command timed out). */
static void test_rc_array_past_bound_refused(void)
{
	static const char plus[] = "+x\r\n";

	for (size_t i = 0; i + 4 <= sizeof(g_fill); i += 4)
		memcpy(g_fill + i, plus, 4);
	get_hostile("*2147483647\r\n", sizeof(g_fill), 0, KVP_RC_EPROTOCOL);
	get_hostile("*3\r\n", sizeof(g_fill), 0, KVP_RC_EPROTOCOL); /* GET has no array */
	get_hostile(":5\r\n", 0, 0, KVP_RC_EPROTOCOL);		    /* nor an integer */
	/* a line without its end: refused past the longest line, not read on */
	memset(g_fill, 'x', sizeof(g_fill));
	get_hostile("-ERR ", sizeof(g_fill), 0, KVP_RC_EPROTOCOL);
}

/* The driver: a GET of a page takes a value of the page's size (header and page bytes) and no
 * more; a longer one is refused as it is announced, counted in the driver's figures. */
struct pdone {
	int n;
	enum kvp_rc_status st;
};

static void on_page(void *arg, enum kvp_rc_status st, int err, const void *page, size_t n)
{
	struct pdone *d = arg;

	(void)err;
	(void)page;
	(void)n;
	d->n++;
	d->st = st;
}

/* Polls the driver's fd and the fake node for up to ms, until *until. */
static void drive_remote(struct kvp_remote *r, struct fake *f, int ms, const int *until)
{
	uint64_t end = kvp_rc_now_ms() + (uint64_t)ms;

	while (!*until && kvp_rc_now_ms() < end) {
		struct pollfd p[2 + CONNS_MAX];
		int k = 0, nc = f->nc;

		p[k++] = (struct pollfd){ .fd = kvp_remote_fd(r), .events = POLLIN };
		p[k++] = (struct pollfd){ .fd = f->lfd, .events = POLLIN };
		for (int i = 0; i < nc; i++)
			p[k++] = (struct pollfd){ .fd = f->c[i].fd,
						  .events = (short)(POLLIN |
								    (f->c[i].fill ? POLLOUT : 0)) };
		if (poll(p, (nfds_t)k, 10) <= 0)
			continue;
		if (p[0].revents)
			kvp_remote_on_ready(r);
		if (p[1].revents)
			fake_accept(f);
		for (int i = nc - 1; i >= 0; i--)
			if (i < f->nc && p[2 + i].revents)
				fake_conn_ready(f, i, p[2 + i].revents);
	}
}

static int remote_ready(struct kvp_remote *r, struct fake *f)
{
	int never = 0;

	for (int i = 0; i < 200 && !kvp_remote_ready(r); i++)
		drive_remote(r, f, 10, &never);
	return kvp_remote_ready(r);
}

static void test_remote_get_page_past_page_refused(void)
{
	static const struct kvp_rv_fp fp = { 4, 2, 64, 1, 16, 0 };
	static char head[64];
	const uint64_t page = 4096;
	struct kvp_remote_conf c = { .enabled = 1,
				     .connect_timeout_ms = 500,
				     .command_timeout_ms = 2000,
				     .max_inflight_bytes = 1 << 20,
				     .connections = 1 };
	struct kvp_remote_stats st = { 0 };
	const char *heads[2] = { head, "$2147483000\r\n" };
	struct kvp_remote *r;
	struct fake f;

	snprintf(head, sizeof(head), "$%llu\r\n", (unsigned long long)(KVP_RV_HDR_SIZE + page + 1));
	memset(g_fill, 'x', sizeof(g_fill));
	g_get_fill = sizeof(g_fill);
	fake_init(&f, answer_get);
	snprintf(c.seeds, sizeof(c.seeds), "127.0.0.1:%d", f.port);
	snprintf(c.secret, sizeof(c.secret), "%s", h_secret_src());
	r = kvp_remote_new(&c);
	CU_ASSERT_PTR_NOT_NULL_FATAL(r);
	for (int i = 0; i < 2; i++) {
		struct pdone d = { 0 };
		uint64_t t0;

		CU_ASSERT_FATAL(remote_ready(r, &f));
		g_get_head = heads[i];
		t0 = kvp_rc_now_ms();
		CU_ASSERT_EQUAL(kvp_remote_get_page(r, &fp, page, "k", 1, on_page, &d), 0);
		kvp_remote_sync(r);
		drive_remote(r, &f, 4000, &d.n);
		CU_ASSERT_EQUAL(d.n, 1);
		CU_ASSERT_EQUAL(d.st, KVP_RC_EPROTOCOL);
		CU_ASSERT(kvp_rc_now_ms() - t0 < 1000); /* refused as announced */
	}
	kvp_remote_stats_read(r, &st);
	CU_ASSERT(st.bad_replies >= 2);
	CU_ASSERT_EQUAL(st.protocol_errors, 2);
	kvp_remote_free(r);
	fake_free(&f);
}

/* ---- redirects to made-up addresses ---- */

#define BOGUS 70 /* more than the node table holds */

/* A: the seed. Phase 0: every slot A's, GET answered MOVED to 127.0.0.<2 + n>:A's port (no
 * node listens there: A is bound to 127.0.0.1). Phase 1: every slot B's, GET on A answered
 * MOVED to B. B: every slot B's, GET a hit. */
static struct fake g_a, g_b;

static size_t answer_moving(struct fake *f, struct fconn *c, int argc, const char **argv,
			    const size_t *alen, char *out, size_t cap)
{
	(void)c;
	if (argc == 2 && argis(argv[0], alen[0], "CLUSTER"))
		return slots_all(out, cap, g_a.phase ? g_b.port : g_a.port);
	if (argc == 2 && argis(argv[0], alen[0], "GET")) {
		unsigned slot = kvp_rc_slot(argv[1], alen[1]);

		if (f == &g_b)
			return (size_t)snprintf(out, cap, "$5\r\nhello\r\n");
		if (g_a.phase)
			return (size_t)snprintf(out, cap, "-MOVED %u 127.0.0.1:%d\r\n", slot,
						g_b.port);
		return (size_t)snprintf(out, cap, "-MOVED %u 127.0.0.%d:%d\r\n", slot,
					2 + g_a.gets++ % 250, g_a.port);
	}
	return (size_t)snprintf(out, cap, "-ERR not here\r\n");
}

struct many {
	struct op o[BOGUS];
};

static int many_done(void *arg)
{
	struct many *m = arg;

	for (int i = 0; i < BOGUS; i++)
		if (!m->o[i].calls)
			return 0;
	return 1;
}

/* 70 MOVED replies to made-up addresses filled the 64-entry node table for good, and a slot
 * migration to a real node after them was never followed. Now each is refused (not in the
 * map asked again) and counted; the migration is followed. */
static void test_rc_bogus_redirects_refused_migration_followed(void)
{
	struct kvp_rc_config cfg = { .op_timeout_ms = 2000 };
	struct fake *fk[2] = { &g_a, &g_b };
	static struct many m;
	struct op o = { 0 };
	struct kvp_rc *rc;
	char seeds[64], key[32];

	fake_init(&g_a, answer_moving);
	fake_init(&g_b, answer_moving);
	snprintf(seeds, sizeof(seeds), "127.0.0.1:%d", g_a.port);
	cfg.seeds = seeds;
	rc = kvp_rc_new(&cfg);
	CU_ASSERT_PTR_NOT_NULL_FATAL(rc);
	drive(rc, fk, 2, 2000, rc_ready, rc);
	CU_ASSERT_FATAL(kvp_rc_ready(rc));
	memset(&m, 0, sizeof(m));
	for (int i = 0; i < BOGUS; i++) {
		snprintf(key, sizeof(key), "key%d", i);
		CU_ASSERT_EQUAL(kvp_rc_get(rc, key, strlen(key), on_op, &m.o[i]), 0);
	}
	drive(rc, fk, 2, 4000, many_done, &m);
	for (int i = 0; i < BOGUS; i++) {
		CU_ASSERT_EQUAL(m.o[i].calls, 1);
		CU_ASSERT_NOT_EQUAL(m.o[i].st, KVP_RC_HIT);
	}
	CU_ASSERT_EQUAL(kvp_rc_stats(rc)->bad_redirects, BOGUS);
	CU_ASSERT_EQUAL(kvp_rc_stats(rc)->moved, 0);
	/* the slots move to B: A answers MOVED to it, which the map asked again names */
	g_a.phase = 1;
	CU_ASSERT_EQUAL(kvp_rc_get(rc, "key0", 4, on_op, &o), 0);
	drive(rc, fk, 2, 4000, op_done, &o);
	CU_ASSERT_EQUAL(o.calls, 1);
	CU_ASSERT_EQUAL(o.st, KVP_RC_HIT);
	CU_ASSERT_EQUAL(o.len, 5);
	CU_ASSERT(kvp_rc_stats(rc)->moved >= 1);
	/* and B is where the slots are now, without a redirect */
	drive(rc, fk, 2, 2000, rc_ready, rc);
	memset(&o, 0, sizeof(o));
	CU_ASSERT_EQUAL(kvp_rc_get(rc, "key1", 4, on_op, &o), 0);
	drive(rc, fk, 2, 4000, op_done, &o);
	CU_ASSERT_EQUAL(o.st, KVP_RC_HIT);
	kvp_rc_free(rc);
	fake_free(&g_a);
	fake_free(&g_b);
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_rc_slots_reply_out_of_range_refused),
		H_TEST(test_rc_unsolicited_reply_refused),
		H_TEST(test_rc_get_bulk_past_bound_refused),
		H_TEST(test_rc_array_past_bound_refused),
		H_TEST(test_remote_get_page_past_page_refused),
		H_TEST(test_rc_bogus_redirects_refused_migration_followed),
	};

	return H_RUN_SUITE("remote_hostile", NULL, NULL, tests);
}
