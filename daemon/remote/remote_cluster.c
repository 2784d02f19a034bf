/* remote_cluster.c - Redis Cluster on hiredis's async contexts, driven through fd readiness
 * and timeouts by whoever owns the loop (see remote_cluster.h).
 *
 * Each node has at most one connection. Operations are formatted once (so a redirect resends
 * the same bytes), sent to the slot's master and kept in a FIFO per node: replies come back in
 * order, so the head of the FIFO is the oldest and its deadline is the node's timeout. A node
 * that times out or drops is closed, its pending operations fail, and until it reconnects
 * (exponential backoff) operations for its slots fail at once. Failures found at submission
 * wait in a queue that kvp_rc_tick() drains, so no callback runs inside a submission.
 *
 * Once a node is connected, its socket's data path is this file's: hiredis writes once per
 * event and moves what is left of its output buffer to the front after each partial write,
 * and reads 16 KiB per event through a copy; page-sized values (256 KiB) made that a dozen
 * events, copies and memmoves per value. Here writes go until the socket is full from an
 * offset into the buffer (compacted only when the written part outgrows the rest), and reads
 * go straight into the reply reader's buffer, READ_CHUNK at a time (or exactly the rest of a
 * large value, so that nothing is left to move after it), until the socket is empty.
 * kvp_rc_set_ref's values are not copied at all: the output stream is hiredis's buffer with
 * the caller's values between its bytes, written with writev. A large GET value is read from
 * the socket straight into a buffer of the owner's (buf_get) that the callback may keep. hiredis
 * keeps the connect, the reply parsing and the callbacks in order. */
#include "remote_cluster.h"

#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <hiredis/sds.h>

/* Runs the callbacks of the replies the reader holds. Exported by libhiredis (async.c, 0.14
 * and 1.x) and called by its own read handler, though async.h does not declare it. */
void redisProcessCallbacks(redisAsyncContext *ac);

enum rc_kind { OP_SET, OP_GET, OP_EXISTS, OP_DEL };
enum rc_state { N_IDLE, N_CONNECTING, N_UP, N_DOWN };

struct rc_group {
	kvp_rc_multi_cb *cb;
	void *arg;
	size_t n, left;
	enum kvp_rc_status st[];
};

struct rc_node;

struct rc_op {
	struct rc_op *next, *prev;
	struct kvp_rc *rc;
	struct rc_node *node; /* whose FIFO it is in; NULL in the fail queue */
	enum rc_kind kind;
	enum kvp_rc_status fail_st;
	kvp_rc_cb *cb;
	void *arg;
	struct rc_group *grp;
	size_t idx;
	uint32_t redirects;
	uint16_t slot;
	uint64_t deadline;
	uint64_t maxlen; /* OP_GET: the longest value taken */
	/* A redirect to a node the slot map did not name, waiting in the redirect queue for the
	 * map asked after it (refresh number rseq): followed if that map names it. */
	char rhost[64];
	int rport, rask;
	uint64_t rseq;
	size_t acct; /* bytes counted in flight (the whole command, value included) */
	int noval;   /* a SET whose value went straight into hiredis's buffer: not resendable */
	/* A SET whose value is the caller's (kvp_rc_set_ref): cmd[0, headlen) goes through hiredis,
	 * then ext[0, extlen) is written from where it is, then cmd[headlen, cmdlen). */
	const void *ext;
	size_t extlen, headlen;
	size_t cmdlen;
	char cmd[];
};

struct rc_list {
	struct rc_op *head, *tail;
};

/* A value written from the caller's memory: its bytes follow the byte of the output buffer at
 * stream position `at` (positions count output-buffer bytes only, from the connection's start). */
struct rc_ext {
	uint64_t at;
	const void *p;
	size_t len;
};

struct rc_node {
	struct kvp_rc *rc;
	char host[64];
	int port;
	int seed;
	enum rc_state state;
	redisAsyncContext *ac;
	short events;
	uint32_t fails; /* consecutive failures; 0: never failed since last up */
	uint64_t retry_at, connect_deadline;
	enum kvp_rc_status drop_st; /* what the pending operations fail with when it closes */
	struct rc_list fifo;
	/* Operations held back while the output stream is full (OBUF_CAP), and SETs of the
	 * caller's values while the connection is not up yet. */
	struct rc_list held;
	int broken; /* its output stream lost a command halfway (out of memory): dropped at tick */
	size_t out_off;	 /* bytes at the front of hiredis's output buffer already written */
	uint64_t ob_pos; /* stream position of the output buffer's first byte */
	/* Values to be written between output-buffer bytes, oldest first (a ring). */
	struct rc_ext *ext;
	uint32_t ext_cap, ext_head, ext_n;
	size_t ext_done;    /* bytes of the oldest one written */
	uint64_t ext_bytes; /* bytes of them all */
	/* A large GET value read straight from the socket into a buffer of the owner's (buf_get),
	 * while the reader holds a zero-length bulk in its place (see node_read). */
	void *stash;
	size_t stash_len, stash_have;
	int probe;  /* the last reply read was stashed: read the next one's length line alone */
	int mapped; /* a master in the slot map now */
	int bad;    /* sent a reply that is none (a lie): dropped at once outside its callbacks */
	uint32_t objs; /* objects made for the reply being read (CLUSTER SLOTS) */
};

/* Unwritten bytes past which operations wait in `held` (copied) instead of joining the output
 * buffer. Writes from an offset make a long buffer cheap (hiredis's own moved the rest of it
 * after each partial write), and a SET that cannot join it costs a second copy of its value,
 * but a buffer larger than the CPU's L2 cache is copied into and written out of memory: 1 MiB
 * spilled 256 KiB pages at about 1.5x the rate of 16 MiB here (2 MiB of L2 a core). */
#define OBUF_CAP (1u << 20)
#define READ_CHUNK (128u << 10) /* room made in the reader's buffer for each read */
#define IO_PER_EVENT (4u << 20) /* bytes read (or written) per event at most: fairness */
#define IOV_N 64		/* pieces per writev */

/* What a reply may hold besides what its command answers (see item_fits). */
#define LINE_MAX_BYTES 4096	/* a status, an error, an integer, a length line */
#define VALUE_MAX (64ull << 20) /* a GET's value by default (max_value 0) */
#define SLOTS_STR_MAX 256	/* a host, a node id, a metadata string of CLUSTER SLOTS */
#define SLOTS_RANGE_MAX (2 + KVP_RC_NODES_MAX) /* start, end, master, replicas */
#define SLOTS_NODE_MAX 8		       /* a node: address, port, id, metadata */
#define SLOTS_META_MAX 16		       /* a node's metadata: names and values */
#define SLOTS_OBJS_MAX (1u << 18)	       /* objects one CLUSTER SLOTS reply makes at most */

struct kvp_rc {
	struct kvp_rc_config cfg;
	struct rc_node *nodes[KVP_RC_NODES_MAX];
	int nnodes;
	int8_t slots[KVP_RC_SLOTS]; /* node index, -1: no master */
	int loaded;
	int refresh_wanted, refresh_inflight;
	uint64_t refresh_at;	      /* periodic */
	uint64_t refresh_gate;	      /* earliest next refresh (rate limit) */
	struct rc_node *refresh_node; /* the node asked for CLUSTER SLOTS while one is in flight */
	uint64_t refresh_deadline;    /* when that node is dropped for not answering */
	unsigned rr;
	uint64_t now;
	uint64_t gen;
	int closing;
	uint32_t inflight;
	uint64_t inflight_bytes;
	struct rc_reply *cur; /* the GET hit whose callback runs (kvp_rc_take_value) */
	struct rc_list failq;
	struct rc_list redirq; /* redirects waiting for a slot map (rc_op.rseq) */
	uint64_t refresh_seq;  /* CLUSTER SLOTS sent */
	struct kvp_rc_stats stats;
};

#define REFRESH_MIN_MS 100

static const char *const status_names[KVP_RC_STATUS_MAX] = {
	[KVP_RC_OK] = "ok",
	[KVP_RC_HIT] = "hit",
	[KVP_RC_MISS] = "miss",
	[KVP_RC_ETIMEOUT] = "timeout",
	[KVP_RC_ENODE_DOWN] = "node down",
	[KVP_RC_ENO_MASTER] = "no master for slot",
	[KVP_RC_EREDIRECTS] = "redirect limit",
	[KVP_RC_EPROTOCOL] = "protocol",
	[KVP_RC_ECLOSED] = "closed",
};

const char *kvp_rc_strstatus(enum kvp_rc_status st)
{
	return (unsigned)st < KVP_RC_STATUS_MAX ? status_names[st] : "unknown";
}

uint64_t kvp_rc_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static uint16_t crc16_table[256];

/* Filled before main so that threads never race on it. */
__attribute__((constructor)) static void crc16_table_init(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint16_t crc = (uint16_t)(i << 8);

		for (int k = 0; k < 8; k++)
			crc = crc & 0x8000 ? (uint16_t)(crc << 1 ^ 0x1021) : (uint16_t)(crc << 1);
		crc16_table[i] = crc;
	}
}

uint16_t kvp_rc_crc16(const void *p, size_t n)
{
	const uint8_t *b = p;
	uint16_t crc = 0;

	while (n--)
		crc = (uint16_t)(crc << 8 ^ crc16_table[(crc >> 8 ^ *b++) & 0xff]);
	return crc;
}

unsigned kvp_rc_slot(const void *key, size_t len)
{
	const char *k = key, *open = memchr(k, '{', len);

	if (open) {
		size_t off = (size_t)(open - k) + 1;
		const char *close = memchr(open + 1, '}', len - off);

		if (close && close > open + 1)
			return kvp_rc_crc16(open + 1, (size_t)(close - open - 1)) &
			       (KVP_RC_SLOTS - 1);
	}
	return kvp_rc_crc16(k, len) & (KVP_RC_SLOTS - 1);
}

static void list_add(struct rc_list *l, struct rc_op *op)
{
	op->next = NULL;
	op->prev = l->tail;
	if (l->tail)
		l->tail->next = op;
	else
		l->head = op;
	l->tail = op;
}

static void list_del(struct rc_list *l, struct rc_op *op)
{
	if (op->prev)
		op->prev->next = op->next;
	else
		l->head = op->next;
	if (op->next)
		op->next->prev = op->prev;
	else
		l->tail = op->prev;
	op->next = op->prev = NULL;
}

/* Completes op (already out of every list) and frees it. */
static void op_finish(struct rc_op *op, enum kvp_rc_status st, const void *val, size_t len)
{
	struct kvp_rc *rc = op->rc;
	struct rc_group *g = op->grp;

	rc->inflight--;
	rc->inflight_bytes -= op->acct;
	rc->stats.status[st]++;
	if (st == KVP_RC_HIT && op->kind == OP_GET)
		rc->stats.recv_bytes += len;
	if (g) {
		g->st[op->idx] = st;
		if (!--g->left) {
			g->cb(g->arg, g->n, g->st);
			free(g);
		}
	} else {
		op->cb(op->arg, st, val, len);
	}
	free(op);
}

static void op_fail_later(struct kvp_rc *rc, struct rc_op *op, enum kvp_rc_status st)
{
	op->node = NULL;
	op->fail_st = st;
	list_add(&rc->failq, op);
}

static void drain_failq(struct kvp_rc *rc)
{
	struct rc_op *op;

	while ((op = rc->failq.head)) {
		list_del(&rc->failq, op);
		op_finish(op, op->fail_st, NULL, 0);
	}
}

/* Bytes of the node's output buffer not written yet. */
static size_t obuf_pending(const struct rc_node *n)
{
	return sdslen(n->ac->c.obuf) - n->out_off;
}

/* Bytes of the node's output stream not written yet: the buffer's and the values'. */
static uint64_t out_pending(const struct rc_node *n)
{
	return obuf_pending(n) + n->ext_bytes - n->ext_done;
}

static struct rc_ext *ext_at(const struct rc_node *n, uint32_t i)
{
	return &n->ext[(n->ext_head + i) & (n->ext_cap - 1)];
}

/* Queues len bytes at p to be written after what the output buffer holds now. -ENOMEM. */
static int ext_push(struct rc_node *n, const void *p, size_t len)
{
	if (n->ext_n == n->ext_cap) {
		uint32_t cap = n->ext_cap ? 2 * n->ext_cap : 64;
		struct rc_ext *e = malloc(sizeof(*e) * cap);

		if (!e)
			return -ENOMEM;
		for (uint32_t i = 0; i < n->ext_n; i++)
			e[i] = *ext_at(n, i);
		free(n->ext);
		n->ext = e;
		n->ext_cap = cap;
		n->ext_head = 0;
	}
	*ext_at(n, n->ext_n++) = (struct rc_ext){ n->ob_pos + sdslen(n->ac->c.obuf), p, len };
	n->ext_bytes += len;
	return 0;
}

/* Forgets the output stream's values (the connection is gone). */
static void ext_clear(struct rc_node *n)
{
	n->ext_head = n->ext_n = 0;
	n->ext_done = 0;
	n->ext_bytes = 0;
	n->ob_pos = 0;
}

/* Drops the written front of the output buffer (before hiredis itself looks at it). */
static void obuf_compact(struct rc_node *n)
{
	redisContext *c = &n->ac->c;

	if (!n->out_off)
		return;
	n->ob_pos += n->out_off;
	if (n->out_off == sdslen(c->obuf))
		sdsclear(c->obuf); /* keeps the allocation */
	else
		sdsrange(c->obuf, (ssize_t)n->out_off, -1);
	n->out_off = 0;
}

/* hiredis event hooks: record what the connection waits for; the owner polls it. */
static void ev_set(void *priv, short add, short del)
{
	struct rc_node *n = priv;
	short ev = (short)((n->events | add) & ~del);

	if (ev != n->events) {
		n->events = ev;
		n->rc->gen++;
	}
}

static void ev_add_read(void *priv)
{
	ev_set(priv, POLLIN, 0);
}

static void ev_del_read(void *priv)
{
	ev_set(priv, 0, POLLIN);
}

static void ev_add_write(void *priv)
{
	ev_set(priv, POLLOUT, 0);
}

static void ev_del_write(void *priv)
{
	ev_set(priv, 0, POLLOUT);
}

static void node_failed(struct rc_node *n)
{
	struct kvp_rc *rc = n->rc;
	uint64_t delay;

	if (n->state == N_UP)
		rc->stats.disconnects++;
	n->fails++;
	delay = (uint64_t)rc->cfg.backoff_min_ms << (n->fails < 16 ? n->fails - 1 : 15);
	if (delay > rc->cfg.backoff_max_ms)
		delay = rc->cfg.backoff_max_ms;
	n->state = N_DOWN;
	n->retry_at = rc->now + delay;
	rc->refresh_wanted = 1;
}

/* Called by hiredis when the context goes away, whoever freed it. */
static void ev_cleanup(void *priv)
{
	struct rc_node *n = priv;
	struct rc_op *op;

	while ((op = n->held.head)) { /* never sent: they fail as the sent ones did */
		list_del(&n->held, op);
		op_fail_later(n->rc, op, n->drop_st);
	}
	n->ac = NULL;
	n->events = 0;
	n->out_off = 0;
	ext_clear(n);
	if (n->stash)
		n->rc->cfg.buf_put(n->rc->cfg.buf_ctx, n->stash);
	n->stash = NULL;
	n->rc->gen++;
	if (n->state == N_UP || n->state == N_CONNECTING)
		node_failed(n);
}

static void on_connect(const redisAsyncContext *ac, int status)
{
	struct rc_node *n = ac->data;

	if (status != REDIS_OK)
		return; /* hiredis frees the context: ev_cleanup marks the node down */
	n->state = N_UP;
	n->fails = 0;
	n->rc->stats.connects++;
	n->rc->refresh_wanted = 1;
}

/* AUTH's answer: anything but +OK closes the connection (outside the callbacks, drop_bad); the
 * commands sent behind it were refused by the node too. */
static void auth_reply(redisAsyncContext *ac, void *reply, void *priv)
{
	struct rc_node *n = priv;
	const redisReply *r = reply;

	(void)ac;
	if (!r) /* the connection went away */
		return;
	if (r->type != REDIS_REPLY_STATUS) {
		n->rc->stats.auth_failures++;
		n->bad = 1;
	}
}

static void on_disconnect(const redisAsyncContext *ac, int status)
{
	(void)ac;
	(void)status; /* ev_cleanup follows */
}

/* Reply objects: hiredis's own, but a GET's value of at least KVP_RC_BUF_MIN bytes lands in a
 * buffer of the owner's (buf_get), which the GET's callback may keep (kvp_rc_take_value) instead
 * of copying it again. Every object of a connection is made here, so freeing knows which. */
struct rc_reply {
	redisReply r;
	struct kvp_rc *rc;
	int owned; /* r.str came from buf_get */
};

static void reply_free(void *p)
{
	struct rc_reply *o = p;

	if (!o)
		return;
	switch (o->r.type) {
	case REDIS_REPLY_ARRAY:
		for (size_t i = 0; o->r.element && i < o->r.elements; i++)
			reply_free(o->r.element[i]);
		free(o->r.element);
		break;
	case REDIS_REPLY_STRING:
	case REDIS_REPLY_STATUS:
	case REDIS_REPLY_ERROR:
		if (o->owned && o->r.str)
			o->rc->cfg.buf_put(o->rc->cfg.buf_ctx, o->r.str);
		else
			free(o->r.str);
		break;
	default: break;
	}
	free(o);
}

static void op_reply(redisAsyncContext *ac, void *r, void *priv);
static void slots_reply(redisAsyncContext *ac, void *reply, void *priv);

/* What the reply being read may be, by the command it answers: the oldest one hiredis holds a
 * callback for (none: only an error, which hiredis takes as the connection's). */
enum rc_shape { SH_NONE, SH_STATUS, SH_INT, SH_GET, SH_SLOTS };

static enum rc_shape node_shape(const struct rc_node *n, uint64_t *maxlen)
{
	const redisCallback *cb = n->ac ? n->ac->replies.head : NULL;
	const struct rc_op *op;

	if (!cb)
		return SH_NONE;
	if (cb->fn == slots_reply)
		return SH_SLOTS;
	if (cb->fn != op_reply) /* ASKING */
		return SH_STATUS;
	op = cb->privdata;
	switch (op->kind) {
	case OP_GET: *maxlen = op->maxlen; return SH_GET;
	case OP_SET: return SH_STATUS;
	default: return SH_INT; /* EXISTS and DEL of one key: 0 or 1 */
	}
}

/* Whether an item of a reply fits what n's command answers: its type, its depth in the reply
 * (0: the reply itself), its index in its array, and v: a string's bytes, an array's
 * elements, an integer's value. CLUSTER SLOTS: [[start, end, [address, port, id, [metadata]],
 * replicas as the master...], ...], start and end slots, the ports 0..65535 (the master's are
 * checked 1..65535 with the map, slots_parse). */
static int item_fits(const struct rc_node *n, int type, int depth, int idx, long long v)
{
	uint64_t maxlen = 0;
	enum rc_shape sh = node_shape(n, &maxlen);

	if (depth == 0) {
		if (type == REDIS_REPLY_ERROR)
			return v <= LINE_MAX_BYTES;
		switch (sh) {
		case SH_NONE: return 0;
		case SH_STATUS: return type == REDIS_REPLY_STATUS && v <= LINE_MAX_BYTES;
		case SH_INT: return type == REDIS_REPLY_INTEGER && (v == 0 || v == 1);
		case SH_GET:
			return type == REDIS_REPLY_NIL ||
			       (type == REDIS_REPLY_STRING && v >= 0 && (uint64_t)v <= maxlen);
		case SH_SLOTS: return type == REDIS_REPLY_ARRAY && v >= 0 && v <= KVP_RC_SLOTS;
		}
		return 0;
	}
	if (sh != SH_SLOTS || v < 0)
		return 0;
	/* depth 1: a range; 2: in a range (start, end, then nodes); 3: in a node; 4: in a node's
	 * metadata */
	switch (depth) {
	case 1: return type == REDIS_REPLY_ARRAY && v <= SLOTS_RANGE_MAX;
	case 2:
		if (type == REDIS_REPLY_INTEGER)
			return idx < 2 && v < KVP_RC_SLOTS;
		return type == REDIS_REPLY_ARRAY && idx >= 2 && v <= SLOTS_NODE_MAX;
	case 3:
		if (type == REDIS_REPLY_INTEGER)
			return idx == 1 && v <= 65535;
		if (type == REDIS_REPLY_STRING)
			return idx != 1 && v <= SLOTS_STR_MAX;
		return type == REDIS_REPLY_ARRAY && idx >= 3 && v <= SLOTS_META_MAX;
	case 4: return type == REDIS_REPLY_STRING && v <= SLOTS_STR_MAX;
	}
	return 0;
}

static int task_depth(const redisReadTask *task)
{
	int d = 0;

	for (; task->parent; task = task->parent)
		d++;
	return d;
}

/* Whether the reader may make an object for task (item_fits, and a CLUSTER SLOTS reply's
 * objects bounded); when not, the reply is refused: the reader fails (a NULL object), hiredis
 * closes the connection and its commands fail with KVP_RC_EPROTOCOL. */
static int item_take(const redisReadTask *task, int type, long long v)
{
	struct rc_node *n = task->privdata;
	int depth = task_depth(task);

	if (depth == 0)
		n->objs = 0;
	if (item_fits(n, type, depth, task->idx, v) && ++n->objs <= SLOTS_OBJS_MAX)
		return 1;
	n->rc->stats.bad_replies++;
	n->drop_st = KVP_RC_EPROTOCOL;
	return 0;
}

static long long len_ll(size_t len)
{
	return len > (size_t)LLONG_MAX ? LLONG_MAX : (long long)len;
}

static struct rc_reply *reply_new(const redisReadTask *task, int type)
{
	struct rc_reply *o = calloc(1, sizeof(*o));

	if (!o)
		return NULL;
	o->r.type = type;
	o->rc = ((struct rc_node *)task->privdata)->rc;
	if (task->parent) {
		redisReply *parent = task->parent->obj;

		parent->element[task->idx] = &o->r;
	}
	return o;
}

static void *reply_string(const redisReadTask *task, char *str, size_t len)
{
	struct rc_reply *o;
	struct rc_node *n = task->privdata;
	struct kvp_rc *rc = n->rc;
	char *b = NULL;

	if (!item_take(task, task->type, len_ll(len)))
		return NULL;
	o = reply_new(task, task->type);
	if (!o)
		return NULL;
	if (n->stash && n->stash_have == n->stash_len && task->type == REDIS_REPLY_STRING &&
	    !task->parent && !len) { /* the zero-length stand-in for the value node_read took */
		o->r.str = n->stash;
		o->r.len = n->stash_len;
		o->owned = 1;
		n->stash = NULL;
		return o;
	}
	if (rc && rc->cfg.buf_get && task->type == REDIS_REPLY_STRING && !task->parent &&
	    len >= KVP_RC_BUF_MIN && (b = rc->cfg.buf_get(rc->cfg.buf_ctx, len)))
		o->owned = 1;
	else if ((b = malloc(len + 1)))
		b[len] = '\0';
	if (!b) {
		if (task->parent) /* the parent frees it, or hiredis frees a lone one */
			return NULL;
		free(o);
		return NULL;
	}
	memcpy(b, str, len);
	o->r.str = b;
	o->r.len = len;
	return o;
}

static void *reply_array(const redisReadTask *task, int elements)
{
	struct rc_reply *o;

	if (!item_take(task, REDIS_REPLY_ARRAY, elements))
		return NULL;
	o = reply_new(task, REDIS_REPLY_ARRAY);
	if (o && elements > 0 && !(o->r.element = calloc((size_t)elements, sizeof(void *)))) {
		if (!task->parent)
			free(o);
		return NULL;
	}
	if (o)
		o->r.elements = (size_t)(elements > 0 ? elements : 0);
	return o;
}

static void *reply_integer(const redisReadTask *task, long long v)
{
	struct rc_reply *o;

	if (!item_take(task, REDIS_REPLY_INTEGER, v))
		return NULL;
	o = reply_new(task, REDIS_REPLY_INTEGER);
	if (o)
		o->r.integer = v;
	return o;
}

static void *reply_nil(const redisReadTask *task)
{
	if (!item_take(task, REDIS_REPLY_NIL, 0))
		return NULL;
	return reply_new(task, REDIS_REPLY_NIL);
}

static redisReplyObjectFunctions reply_fns = {
	.createString = reply_string,
	.createArray = reply_array,
	.createInteger = reply_integer,
	.createNil = reply_nil,
	.freeObject = reply_free,
};

static void node_connect(struct kvp_rc *rc, struct rc_node *n)
{
	redisAsyncContext *ac = redisAsyncConnect(n->host, n->port);

	if (!ac || ac->err) {
		if (ac)
			redisAsyncFree(ac);
		n->state = N_CONNECTING; /* so that node_failed counts it */
		node_failed(n);
		return;
	}
	ac->c.reader->maxbuf = 0; /* keep the read buffer: page-sized replies would regrow it */
	ac->c.reader->fn = &reply_fns;
	ac->c.reader->privdata = n;
	n->ac = ac;
	n->out_off = 0;
	ext_clear(n);
	n->state = N_CONNECTING;
	n->bad = 0;
	n->connect_deadline = rc->now + rc->cfg.connect_timeout_ms;
	n->drop_st = KVP_RC_ENODE_DOWN;
	ac->data = n;
	ac->ev.data = n;
	ac->ev.addRead = ev_add_read;
	ac->ev.delRead = ev_del_read;
	ac->ev.addWrite = ev_add_write;
	ac->ev.delWrite = ev_del_write;
	ac->ev.cleanup = ev_cleanup;
	redisAsyncSetDisconnectCallback(ac, on_disconnect);
	redisAsyncSetConnectCallback(ac, on_connect); /* arms the write event */
	/* AUTH first in the stream: every command after it runs as the ACL user. */
	if (rc->cfg.password &&
	    (rc->cfg.user ? redisAsyncCommand(ac, auth_reply, n, "AUTH %b %b", rc->cfg.user,
					      strlen(rc->cfg.user), rc->cfg.password,
					      strlen(rc->cfg.password))
			  : redisAsyncCommand(ac, auth_reply, n, "AUTH %b", rc->cfg.password,
					      strlen(rc->cfg.password))) != REDIS_OK)
		n->bad = 1;
	rc->gen++;
}

/* Closes the node's connection: its pending operations complete with st. Never call it from
 * inside this node's own hiredis callbacks. */
static void node_drop(struct rc_node *n, enum kvp_rc_status st)
{
	redisAsyncContext *ac = n->ac;

	if (!ac)
		return;
	n->drop_st = st;
	redisAsyncFree(ac); /* replies NULL to every pending callback, then ev_cleanup */
	n->drop_st = KVP_RC_ENODE_DOWN;
}

/* Whether host:port can name a node: 1..63 printable bytes (no space), a port 1..65535. */
static int addr_ok(const char *host, size_t hlen, long port)
{
	if (!hlen || hlen >= sizeof(((struct rc_node *)0)->host) || port <= 0 || port > 65535)
		return 0;
	for (size_t i = 0; i < hlen; i++)
		if (host[i] <= ' ' || host[i] > '~')
			return 0;
	return 1;
}

/* The node for host:port in the table, or NULL. */
static struct rc_node *node_find(const struct kvp_rc *rc, const char *host, size_t hlen, int port)
{
	for (int i = 0; i < rc->nnodes; i++) {
		struct rc_node *n = rc->nodes[i];

		if (n->port == port && strlen(n->host) == hlen && !memcmp(n->host, host, hlen))
			return n;
	}
	return NULL;
}

/* The node for host:port, created (idle) when new; NULL for a bad address or when the table is
 * full. Only the seeds and CLUSTER SLOTS add nodes (slots_reply prunes the others first). */
static struct rc_node *node_get(struct kvp_rc *rc, const char *host, size_t hlen, int port)
{
	struct rc_node *n;

	if (!addr_ok(host, hlen, port))
		return NULL;
	if ((n = node_find(rc, host, hlen, port)))
		return n;
	if (rc->nnodes == KVP_RC_NODES_MAX || !(n = calloc(1, sizeof(*n))))
		return NULL;
	n->rc = rc;
	memcpy(n->host, host, hlen);
	n->port = port;
	n->state = N_IDLE;
	n->drop_st = KVP_RC_ENODE_DOWN;
	rc->nodes[rc->nnodes++] = n;
	return n;
}

static int node_index(const struct kvp_rc *rc, const struct rc_node *n)
{
	for (int i = 0; i < rc->nnodes; i++)
		if (rc->nodes[i] == n)
			return i;
	return -1;
}

/* Appends op's command to n's output stream (hiredis books its reply). -1 when hiredis refused
 * it (nothing appended). */
static int node_append(struct rc_node *n, struct rc_op *op)
{
	sds b;

	if (redisAsyncFormattedCommand(n->ac, op_reply, op, op->cmd, op->headlen) != REDIS_OK)
		return -1;
	if (op->ext) {
		/* A command cut halfway (out of memory) loses the stream: dropped at tick. */
		if (ext_push(n, op->ext, op->extlen) < 0 ||
		    !(b = sdscatlen(n->ac->c.obuf, op->cmd + op->headlen,
				    op->cmdlen - op->headlen)))
			n->broken = 1;
		else
			n->ac->c.obuf = b;
	}
	return 0;
}

/* Sends op to n (ASKING first when asking); failures go to the fail queue. */
static void op_send(struct kvp_rc *rc, struct rc_op *op, struct rc_node *n, int asking)
{
	if (rc->closing) {
		op_fail_later(rc, op, KVP_RC_ECLOSED);
		return;
	}
	if (!n) {
		op_fail_later(rc, op, KVP_RC_ENO_MASTER);
		return;
	}
	if (n->state == N_IDLE)
		node_connect(rc, n);
	if (!n->ac || !(n->state == N_UP || (n->state == N_CONNECTING && !n->fails))) {
		op_fail_later(rc, op, KVP_RC_ENODE_DOWN);
		return;
	}
	if (asking && op->ext && n->state != N_UP) {
		op_fail_later(rc, op, KVP_RC_ENODE_DOWN);
		return;
	}
	if (asking && redisAsyncCommand(n->ac, NULL, NULL, "ASKING") != REDIS_OK) {
		op_fail_later(rc, op, KVP_RC_ENODE_DOWN);
		return;
	}
	op->deadline = rc->now + rc->cfg.op_timeout_ms;
	/* A value of the caller's waits for the connection: until it is up, hiredis writes the
	 * output buffer itself, which knows nothing of it. Whatever comes after a held operation
	 * waits behind it, connected or not, so that one key's operations keep their order. */
	if (!asking && (n->held.head || (n->state == N_UP && out_pending(n) >= OBUF_CAP) ||
			(op->ext && n->state != N_UP))) {
		op->node = n;
		list_add(&n->held, op);
		return;
	}
	if (node_append(n, op) < 0) {
		op_fail_later(rc, op, KVP_RC_ENODE_DOWN);
		return;
	}
	op->node = n;
	list_add(&n->fifo, op);
}

/* Hands held operations to hiredis while its output buffer has room. */
static void node_pump(struct kvp_rc *rc, struct rc_node *n)
{
	struct rc_op *op;

	while ((op = n->held.head) && n->ac && n->state == N_UP && out_pending(n) < OBUF_CAP) {
		list_del(&n->held, op);
		if (node_append(n, op) < 0) {
			op_fail_later(rc, op, KVP_RC_ENODE_DOWN);
			continue;
		}
		list_add(&n->fifo, op);
	}
}

/* "MOVED 3999 127.0.0.1:6381" / "ASK ...": the slot and the target's address into op's rhost
 * and rport. -1 for anything else (a slot out of range or not op's, a bad address). */
static int parse_redirect(struct rc_op *op, const char *s)
{
	const char *sp = strchr(s, ' '), *addr, *colon;
	char *end;
	unsigned long sl;
	long port;

	if (!sp || sp[1] < '0' || sp[1] > '9')
		return -1;
	errno = 0;
	sl = strtoul(sp + 1, &end, 10);
	if (errno || *end != ' ' || sl != op->slot)
		return -1;
	addr = end + 1;
	colon = strrchr(addr, ':');
	if (!colon || colon[1] < '0' || colon[1] > '9')
		return -1;
	port = strtol(colon + 1, &end, 10);
	if (*end || !addr_ok(addr, (size_t)(colon - addr), port))
		return -1;
	memcpy(op->rhost, addr, (size_t)(colon - addr));
	op->rhost[colon - addr] = '\0';
	op->rport = (int)port;
	return 0;
}

/* The node op's redirect names, when it is a master of the slot map now; else NULL. */
static struct rc_node *redirect_target(const struct kvp_rc *rc, const struct rc_op *op)
{
	struct rc_node *to = node_find(rc, op->rhost, strlen(op->rhost), op->rport);

	return to && to->mapped ? to : NULL;
}

/* Sends op on to to, a master of the slot map (ASKING first for an ASK). */
static void redirect_follow(struct kvp_rc *rc, struct rc_op *op, struct rc_node *to, int ask)
{
	if (ask) {
		rc->stats.ask++;
	} else {
		rc->stats.moved++;
		rc->slots[op->slot] = (int8_t)node_index(rc, to);
		rc->refresh_wanted = 1;
	}
	op_send(rc, op, to, ask);
}

/* A MOVED or ASK from n. To a master of the map it is followed at once; to another address op
 * waits for the map asked after now, which follows it if it names that address (a slot moved
 * to a node the map did not have yet), or refuses it (redirect_settle): an address out of a
 * reply is never added to the node table, which only the seeds and CLUSTER SLOTS fill. */
static void op_redirect(struct kvp_rc *rc, struct rc_node *n, struct rc_op *op, const char *err,
			int ask)
{
	struct rc_node *to;

	/* A SET sent without a copy of its value (kvp_rc_set's straight into the output buffer)
	 * cannot follow a redirect (the slot moved: a spill lost, counted as a redirect failure);
	 * one of the caller's values (kvp_rc_set_ref) is still there and can. */
	if (++op->redirects > rc->cfg.max_redirects || op->noval) {
		op_finish(op, KVP_RC_EREDIRECTS, NULL, 0);
		return;
	}
	if (parse_redirect(op, err) < 0) { /* a lie: the node is dropped */
		rc->stats.bad_replies++;
		n->bad = 1;
		op_finish(op, KVP_RC_EPROTOCOL, NULL, 0);
		return;
	}
	to = redirect_target(rc, op);
	if (to) {
		redirect_follow(rc, op, to, ask);
		return;
	}
	op->rask = ask;
	op->rseq = rc->refresh_seq + 1;
	op->deadline = rc->now + rc->cfg.op_timeout_ms;
	list_add(&rc->redirq, op);
	rc->refresh_wanted = 1;
}

/* After a slot map loaded: the redirects that waited for it are followed when it names their
 * target as a master, refused (KVP_RC_EREDIRECTS, bad_redirects) when not. */
static void redirect_settle(struct kvp_rc *rc)
{
	struct rc_op *op, *next;

	for (op = rc->redirq.head; op; op = next) {
		struct rc_node *to;

		next = op->next;
		if (op->rseq > rc->refresh_seq)
			continue;
		list_del(&rc->redirq, op);
		to = redirect_target(rc, op);
		if (to) {
			redirect_follow(rc, op, to, op->rask);
		} else {
			rc->stats.bad_redirects++;
			op_fail_later(rc, op, KVP_RC_EREDIRECTS);
		}
	}
}

static void op_reply(redisAsyncContext *ac, void *reply, void *priv)
{
	struct rc_op *op = priv;
	struct rc_node *n = op->node;
	struct kvp_rc *rc = op->rc;
	redisReply *r = reply;

	(void)ac;
	list_del(&n->fifo, op);
	op->node = NULL;
	if (!r) {
		op_finish(op, n->drop_st, NULL, 0);
		return;
	}
	if (r->type == REDIS_REPLY_ERROR) {
		if (!strncmp(r->str, "MOVED ", 6))
			op_redirect(rc, n, op, r->str, 0);
		else if (!strncmp(r->str, "ASK ", 4))
			op_redirect(rc, n, op, r->str, 1);
		else if (!strncmp(r->str, "CLUSTERDOWN", 11))
			op_finish(op, KVP_RC_ENO_MASTER, NULL, 0);
		else
			op_finish(op, KVP_RC_EPROTOCOL, NULL, 0);
		return;
	}
	switch (op->kind) {
	case OP_SET:
		if (r->type == REDIS_REPLY_STATUS && !strcmp(r->str, "OK"))
			op_finish(op, KVP_RC_OK, NULL, 0);
		else
			op_finish(op, KVP_RC_EPROTOCOL, NULL, 0);
		break;
	case OP_GET:
		if (r->type == REDIS_REPLY_STRING) {
			rc->cur = (struct rc_reply *)r; /* every reply object is one (reply_fns) */
			op_finish(op, KVP_RC_HIT, r->str, r->len);
			rc->cur = NULL;
		} else if (r->type == REDIS_REPLY_NIL)
			op_finish(op, KVP_RC_MISS, NULL, 0);
		else
			op_finish(op, KVP_RC_EPROTOCOL, NULL, 0);
		break;
	case OP_EXISTS:
	case OP_DEL:
		if (r->type != REDIS_REPLY_INTEGER)
			op_finish(op, KVP_RC_EPROTOCOL, NULL, 0);
		else if (!r->integer)
			op_finish(op, KVP_RC_MISS, NULL, 0);
		else
			op_finish(op, op->kind == OP_DEL ? KVP_RC_OK : KVP_RC_HIT, NULL, 0);
		break;
	}
}

/* Whether a CLUSTER SLOTS reply is one, whole: an array of ranges [start, end, master,
 * replicas...], 0 <= start <= end < 16384, the master [address, port, ...] with a port
 * 1..65535 (the reader checked the rest of its shape and bounds as it read it, item_fits). */
static int slots_valid(const redisReply *r)
{
	if (r->type != REDIS_REPLY_ARRAY || r->elements > KVP_RC_SLOTS)
		return 0;
	for (size_t i = 0; i < r->elements; i++) {
		const redisReply *e = r->element[i], *m;

		if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
		    e->elements > SLOTS_RANGE_MAX || e->element[0]->type != REDIS_REPLY_INTEGER ||
		    e->element[1]->type != REDIS_REPLY_INTEGER)
			return 0;
		if (e->element[0]->integer < 0 || e->element[0]->integer > e->element[1]->integer ||
		    e->element[1]->integer >= KVP_RC_SLOTS)
			return 0;
		m = e->element[2];
		if (m->type != REDIS_REPLY_ARRAY || m->elements < 2 ||
		    m->element[0]->type != REDIS_REPLY_STRING ||
		    m->element[1]->type != REDIS_REPLY_INTEGER || m->element[1]->integer < 1 ||
		    m->element[1]->integer > 65535)
			return 0;
	}
	return 1;
}

/* A range's master address (the node asked when the reply leaves it empty: it does not know
 * its own). */
static void slots_master(const redisReply *e, const struct rc_node *asked, const char **host,
			 size_t *hlen, int *port)
{
	const redisReply *m = e->element[2];

	*host = m->element[0]->str;
	*hlen = m->element[0]->len;
	if (!*hlen) {
		*host = asked->host;
		*hlen = strlen(asked->host);
	}
	*port = (int)m->element[1]->integer;
}

/* Forgets the nodes the map in r does not name as masters, but the seeds, the node asked
 * (inside whose callback this runs) and those with operations on them (pruned at a later
 * map): the table holds the seeds and the masters of the last map. */
static void slots_prune(struct kvp_rc *rc, const redisReply *r, const struct rc_node *asked)
{
	int k = 0;

	for (int i = 0; i < rc->nnodes; i++) {
		struct rc_node *n = rc->nodes[i];
		int named = n->seed || n == asked || n->fifo.head || n->held.head;

		for (size_t j = 0; j < r->elements && !named; j++) {
			const char *host;
			size_t hlen;
			int port;

			slots_master(r->element[j], asked, &host, &hlen, &port);
			named = port == n->port && hlen == strlen(n->host) &&
				!memcmp(host, n->host, hlen);
		}
		if (named) {
			rc->nodes[k++] = n;
			continue;
		}
		node_drop(n, KVP_RC_ENODE_DOWN); /* nothing on it: no callback runs */
		free(n->ext);
		free(n);
	}
	rc->nnodes = k;
}

/* CLUSTER SLOTS: [[start, end, [host, port, id, ...], replicas...], ...]. A reply that is not
 * one (slots_valid) is refused whole: counted, the node dropped, the map asked of another. */
static void slots_reply(redisAsyncContext *ac, void *reply, void *priv)
{
	struct kvp_rc *rc = priv;
	struct rc_node *asked = ac->data;
	redisReply *r = reply;
	int8_t map[KVP_RC_SLOTS];
	struct {
		char host[64];
		int port;
	} old[KVP_RC_NODES_MAX];
	int changed = !rc->loaded, full = 0;

	rc->refresh_inflight = 0;
	rc->refresh_node = NULL;
	/* No reply (the node dropped), or an error (a node loading, one not in a cluster): the map
	 * is asked of another node. */
	if (!r || r->type == REDIS_REPLY_ERROR) {
		rc->refresh_wanted = 1;
		return;
	}
	if (!slots_valid(r)) {
		rc->stats.bad_replies++;
		asked->bad = 1;
		rc->refresh_wanted = 1;
		return;
	}
	for (int i = 0; i < rc->nnodes; i++) { /* the map before, by address: indices move */
		memcpy(old[i].host, rc->nodes[i]->host, sizeof(old[i].host));
		old[i].port = rc->nodes[i]->port;
	}
	slots_prune(rc, r, asked);
	for (int i = 0; i < rc->nnodes; i++)
		rc->nodes[i]->mapped = 0;
	memset(map, -1, sizeof(map));
	for (size_t i = 0; i < r->elements; i++) {
		redisReply *e = r->element[i];
		struct rc_node *n;
		const char *host;
		size_t hlen;
		int port;

		slots_master(e, asked, &host, &hlen, &port);
		n = node_get(rc, host, hlen, port);
		if (!n) {
			full |= addr_ok(host, hlen, port);
			continue;
		}
		n->mapped = 1;
		for (long long s = e->element[0]->integer; s <= e->element[1]->integer; s++)
			map[s] = (int8_t)node_index(rc, n);
		if (n->state == N_IDLE)
			node_connect(rc, n);
	}
	for (int s = 0; s < KVP_RC_SLOTS && !changed; s++) {
		const struct rc_node *n = map[s] >= 0 ? rc->nodes[map[s]] : NULL;
		int o = rc->slots[s];

		changed = (o < 0) != !n ||
			  (n && (old[o].port != n->port || strcmp(old[o].host, n->host)));
	}
	if (changed)
		rc->stats.map_changes++;
	memcpy(rc->slots, map, sizeof(map));
	rc->loaded = 1;
	rc->refresh_wanted = full; /* a node the table had no room for: after the next pruning */
	rc->refresh_at = rc->now + rc->cfg.refresh_ms;
	rc->stats.refreshes++;
	redirect_settle(rc);
	if (rc->redirq.head) /* waiting for a map asked after this one */
		rc->refresh_wanted = 1;
}

static struct rc_node *any_up(struct kvp_rc *rc)
{
	for (int i = 0; i < rc->nnodes; i++) {
		struct rc_node *n = rc->nodes[(rc->rr + (unsigned)i) % (unsigned)rc->nnodes];

		if (n->state == N_UP) {
			rc->rr++;
			return n;
		}
	}
	return NULL;
}

static int refresh_due(const struct kvp_rc *rc, uint64_t *at)
{
	if (rc->refresh_inflight)
		return 0;
	if (rc->refresh_wanted)
		*at = rc->refresh_gate;
	else
		*at = rc->refresh_at;
	return 1;
}

static void maybe_refresh(struct kvp_rc *rc)
{
	struct rc_node *n;
	uint64_t at;

	if (!refresh_due(rc, &at) || rc->now < at || !(n = any_up(rc)))
		return;
	if (redisAsyncCommand(n->ac, slots_reply, rc, "CLUSTER SLOTS") != REDIS_OK)
		return;
	rc->refresh_seq++;
	rc->refresh_inflight = 1;
	rc->refresh_node = n;
	rc->refresh_deadline = rc->now + rc->cfg.op_timeout_ms;
	rc->refresh_gate = rc->now + REFRESH_MIN_MS;
	rc->refresh_at = rc->now + rc->cfg.refresh_ms;
}

struct kvp_rc *kvp_rc_new(const struct kvp_rc_config *cfg)
{
	struct kvp_rc *rc;
	const char *s;

	if (!cfg || !cfg->seeds || !*cfg->seeds || !(rc = calloc(1, sizeof(*rc))))
		return NULL;
	rc->cfg = *cfg;
	rc->cfg.seeds = NULL;
	rc->cfg.user = cfg->user && cfg->password ? strdup(cfg->user) : NULL;
	rc->cfg.password = cfg->password ? strdup(cfg->password) : NULL;
	if ((cfg->user && cfg->password && !rc->cfg.user) || (cfg->password && !rc->cfg.password))
		goto fail;
#define DEF(f, v)                                                                                  \
	if (!rc->cfg.f)                                                                            \
	rc->cfg.f = (v)
	DEF(connect_timeout_ms, 1000);
	DEF(op_timeout_ms, 1000);
	DEF(backoff_min_ms, 50);
	DEF(backoff_max_ms, 2000);
	DEF(refresh_ms, 10000);
	DEF(max_redirects, 5);
	DEF(max_inflight_cmds, 4096);
	DEF(max_inflight_bytes, 256ull << 20);
	DEF(max_value, VALUE_MAX);
#undef DEF
	memset(rc->slots, -1, sizeof(rc->slots));
	rc->now = kvp_rc_now_ms();
	rc->refresh_wanted = 1;
	for (s = cfg->seeds; *s;) {
		size_t len = strcspn(s, ",");
		const char *colon = memchr(s, ':', len);
		struct rc_node *n;
		char *end;
		long port;

		if (!colon)
			goto fail;
		port = strtol(colon + 1, &end, 10);
		if (end != s + len || !(n = node_get(rc, s, (size_t)(colon - s), (int)port)))
			goto fail;
		n->seed = 1;
		s += len;
		if (*s == ',' && !*++s)
			goto fail;
	}
	for (int i = 0; i < rc->nnodes; i++)
		node_connect(rc, rc->nodes[i]);
	return rc;
fail:
	kvp_rc_free(rc);
	return NULL;
}

void kvp_rc_free(struct kvp_rc *rc)
{
	if (!rc)
		return;
	rc->closing = 1;
	for (int i = 0; i < rc->nnodes; i++) {
		rc->nodes[i]->state = N_IDLE; /* no backoff bookkeeping on the way out */
		node_drop(rc->nodes[i], KVP_RC_ECLOSED);
	}
	while (rc->redirq.head) {
		struct rc_op *op = rc->redirq.head;

		list_del(&rc->redirq, op);
		op_fail_later(rc, op, KVP_RC_ECLOSED);
	}
	drain_failq(rc);
	for (int i = 0; i < rc->nnodes; i++) {
		free(rc->nodes[i]->ext);
		free(rc->nodes[i]);
	}
	if (rc->cfg.password)
		explicit_bzero((char *)rc->cfg.password, strlen(rc->cfg.password));
	free((char *)rc->cfg.password);
	free((char *)rc->cfg.user);
	free(rc);
}

/* "*argc\r\n" then "$len\r\n<bytes>\r\n" per argument, the last argument's bytes in up to
 * two parts (header, value). */
static struct rc_op *op_new(struct kvp_rc *rc, enum rc_kind kind, const void *key, size_t klen,
			    const void *hdr, size_t hlen, const void *val, size_t vlen,
			    uint32_t ttl)
{
	static const char *const names[] = { "SET", "GET", "EXISTS", "DEL" };
	const char *name = names[kind];
	char ttlbuf[16];
	int argc = kind == OP_SET ? (ttl ? 5 : 3) : 2;
	size_t cap = 192 + klen + hlen + vlen, len; /* 192: every length line, EX and NUL */
	struct rc_op *op;
	char *p;

	if (!klen)
		return NULL;
	op = malloc(sizeof(*op) + cap);
	if (!op)
		return NULL;
	memset(op, 0, sizeof(*op));
	op->rc = rc;
	op->kind = kind;
	op->slot = (uint16_t)kvp_rc_slot(key, klen);
	p = op->cmd;
	p += sprintf(p, "*%d\r\n$%zu\r\n%s\r\n$%zu\r\n", argc, strlen(name), name, klen);
	memcpy(p, key, klen);
	p += klen;
	p += sprintf(p, "\r\n");
	if (kind == OP_SET) {
		p += sprintf(p, "$%zu\r\n", hlen + vlen);
		if (hlen)
			memcpy(p, hdr, hlen);
		p += hlen;
		if (vlen)
			memcpy(p, val, vlen);
		p += vlen;
		p += sprintf(p, "\r\n");
		if (ttl) {
			len = (size_t)snprintf(ttlbuf, sizeof(ttlbuf), "%u", ttl);
			p += sprintf(p, "$2\r\nEX\r\n$%zu\r\n%s\r\n", len, ttlbuf);
		}
	}
	op->cmdlen = (size_t)(p - op->cmd);
	op->headlen = op->cmdlen;
	op->acct = op->cmdlen;
	return op;
}

static int room(struct kvp_rc *rc, uint32_t cmds, uint64_t bytes)
{
	if (rc->inflight + cmds > rc->cfg.max_inflight_cmds ||
	    rc->inflight_bytes + bytes > rc->cfg.max_inflight_bytes) {
		rc->stats.rejected++;
		return 0;
	}
	return 1;
}

static void op_submit(struct kvp_rc *rc, struct rc_op *op)
{
	int8_t i = rc->slots[op->slot];

	rc->inflight++;
	rc->inflight_bytes += op->acct;
	op_send(rc, op, i >= 0 ? rc->nodes[i] : NULL, 0);
}

/* A SET to a connected master with room in its output buffer: the command's head goes through
 * hiredis (which books the reply's callback), then the value and the rest are appended to the
 * same output buffer, so the value is copied once (into that buffer), not also into the op.
 * Returns 1 when sent so, 0 when the ordinary path must take it. */
static int set_direct(struct kvp_rc *rc, const void *key, size_t klen, const void *hdr, size_t hlen,
		      const void *val, size_t vlen, uint32_t ttl, kvp_rc_cb *cb, void *arg)
{
	unsigned slot = kvp_rc_slot(key, klen);
	int8_t i = rc->slots[slot];
	struct rc_node *n = i >= 0 ? rc->nodes[i] : NULL;
	char tail[64];
	size_t tlen;
	struct rc_op *op;
	const void *part[3] = { hdr, val, tail };
	size_t plen[3] = { hlen, vlen, 0 };
	sds b, nb;
	int ok = 1;

	if (rc->closing || !n || n->state != N_UP || !n->ac || n->held.head ||
	    out_pending(n) >= OBUF_CAP || vlen < 4096)
		return 0;
	op = malloc(sizeof(*op) + 96 + klen);
	if (!op)
		return 0;
	memset(op, 0, sizeof(*op));
	op->rc = rc;
	op->kind = OP_SET;
	op->slot = (uint16_t)slot;
	op->noval = 1;
	op->cb = cb;
	op->arg = arg;
	op->cmdlen = (size_t)sprintf(op->cmd, "*%d\r\n$3\r\nSET\r\n$%zu\r\n", ttl ? 5 : 3, klen);
	memcpy(op->cmd + op->cmdlen, key, klen);
	op->cmdlen += klen;
	op->cmdlen += (size_t)sprintf(op->cmd + op->cmdlen, "\r\n$%zu\r\n", hlen + vlen);
	tlen = (size_t)sprintf(tail, "\r\n");
	if (ttl) {
		char t[16];
		int tl = snprintf(t, sizeof(t), "%u", ttl);

		tlen += (size_t)sprintf(tail + tlen, "$2\r\nEX\r\n$%d\r\n%s\r\n", tl, t);
	}
	op->acct = op->cmdlen + hlen + vlen + tlen;
	op->headlen = op->cmdlen;
	if (redisAsyncFormattedCommand(n->ac, op_reply, op, op->cmd, op->cmdlen) != REDIS_OK) {
		free(op);
		return 0;
	}
	plen[2] = tlen;
	b = n->ac->c.obuf;
	for (int k = 0; k < 3 && ok; k++) {
		if (!plen[k])
			continue;
		nb = sdscatlen(b, part[k], plen[k]);
		if (nb)
			b = nb;
		else
			ok = 0;
	}
	n->ac->c.obuf = b;
	rc->inflight++;
	rc->inflight_bytes += op->acct;
	rc->stats.sent_bytes += hlen + vlen;
	op->node = n;
	op->deadline = rc->now + rc->cfg.op_timeout_ms;
	list_add(&n->fifo, op);
	if (!ok) /* out of memory halfway through a command: the stream is lost */
		n->broken = 1;
	return 1;
}

static int submit_one(struct kvp_rc *rc, enum rc_kind kind, const void *key, size_t klen,
		      const void *hdr, size_t hlen, const void *val, size_t vlen, uint32_t ttl,
		      uint64_t maxlen, kvp_rc_cb *cb, void *arg)
{
	struct rc_op *op;

	if (!klen || !cb)
		return -EINVAL;
	rc->now = kvp_rc_now_ms();
	if (!room(rc, 1, klen + hlen + vlen + 64))
		return -EAGAIN;
	if (kind == OP_SET && set_direct(rc, key, klen, hdr, hlen, val, vlen, ttl, cb, arg))
		return 0;
	op = op_new(rc, kind, key, klen, hdr, hlen, val, vlen, ttl);
	if (!op)
		return -ENOMEM;
	op->cb = cb;
	op->arg = arg;
	op->maxlen = maxlen;
	if (kind == OP_SET)
		rc->stats.sent_bytes += hlen + vlen;
	op_submit(rc, op);
	return 0;
}

int kvp_rc_set(struct kvp_rc *rc, const void *key, size_t klen, const void *hdr, size_t hlen,
	       const void *val, size_t vlen, uint32_t ttl_s, kvp_rc_cb *cb, void *arg)
{
	return submit_one(rc, OP_SET, key, klen, hdr, hlen, val, vlen, ttl_s, 0, cb, arg);
}

/* The command's head (up to the value's length line, then hdr) and its tail ("\r\n", EX) in
 * op->cmd, the value left where the caller has it: the socket takes it from there (writev). */
int kvp_rc_set_ref(struct kvp_rc *rc, const void *key, size_t klen, const void *hdr, size_t hlen,
		   const void *val, size_t vlen, uint32_t ttl_s, kvp_rc_cb *cb, void *arg)
{
	struct rc_op *op;
	char *p;

	if (!klen || !cb)
		return -EINVAL;
	if (!vlen) /* nothing to leave in place */
		return kvp_rc_set(rc, key, klen, hdr, hlen, val, vlen, ttl_s, cb, arg);
	rc->now = kvp_rc_now_ms();
	if (!room(rc, 1, klen + hlen + vlen + 64))
		return -EAGAIN;
	op = malloc(sizeof(*op) + 160 + klen + hlen);
	if (!op)
		return -ENOMEM;
	memset(op, 0, sizeof(*op));
	op->rc = rc;
	op->kind = OP_SET;
	op->slot = (uint16_t)kvp_rc_slot(key, klen);
	op->cb = cb;
	op->arg = arg;
	p = op->cmd;
	p += sprintf(p, "*%d\r\n$3\r\nSET\r\n$%zu\r\n", ttl_s ? 5 : 3, klen);
	memcpy(p, key, klen);
	p += klen;
	p += sprintf(p, "\r\n$%zu\r\n", hlen + vlen);
	if (hlen)
		memcpy(p, hdr, hlen);
	p += hlen;
	op->headlen = (size_t)(p - op->cmd);
	p += sprintf(p, "\r\n");
	if (ttl_s) {
		char t[16];
		int tl = snprintf(t, sizeof(t), "%u", ttl_s);

		p += sprintf(p, "$2\r\nEX\r\n$%d\r\n%s\r\n", tl, t);
	}
	op->cmdlen = (size_t)(p - op->cmd);
	op->ext = val;
	op->extlen = vlen;
	op->acct = op->cmdlen + vlen;
	rc->stats.sent_bytes += hlen + vlen;
	op_submit(rc, op);
	return 0;
}

void *kvp_rc_take_value(struct kvp_rc *rc)
{
	struct rc_reply *o = rc->cur;
	void *b;

	if (!o || !o->owned || !o->r.str)
		return NULL;
	b = o->r.str;
	o->r.str = NULL;
	return b;
}

int kvp_rc_get(struct kvp_rc *rc, const void *key, size_t klen, kvp_rc_cb *cb, void *arg)
{
	return kvp_rc_get_max(rc, key, klen, 0, cb, arg);
}

int kvp_rc_get_max(struct kvp_rc *rc, const void *key, size_t klen, uint64_t max_len, kvp_rc_cb *cb,
		   void *arg)
{
	return submit_one(rc, OP_GET, key, klen, NULL, 0, NULL, 0, 0,
			  max_len ? max_len : rc->cfg.max_value, cb, arg);
}

int kvp_rc_del(struct kvp_rc *rc, const void *key, size_t klen, kvp_rc_cb *cb, void *arg)
{
	return submit_one(rc, OP_DEL, key, klen, NULL, 0, NULL, 0, 0, 0, cb, arg);
}

int kvp_rc_exists_many(struct kvp_rc *rc, size_t n, const void *const *keys, const size_t *klens,
		       kvp_rc_multi_cb *cb, void *arg)
{
	struct rc_group *g;
	struct rc_op **ops;
	uint64_t bytes = 0;

	if (!n || !cb || n > UINT32_MAX)
		return -EINVAL;
	for (size_t i = 0; i < n; i++) {
		if (!klens[i])
			return -EINVAL;
		bytes += klens[i] + 64;
	}
	rc->now = kvp_rc_now_ms();
	if (!room(rc, (uint32_t)n, bytes))
		return -EAGAIN;
	g = malloc(sizeof(*g) + n * sizeof(g->st[0]));
	ops = calloc(n, sizeof(*ops));
	if (!g || !ops)
		goto nomem;
	for (size_t i = 0; i < n; i++) {
		ops[i] = op_new(rc, OP_EXISTS, keys[i], klens[i], NULL, 0, NULL, 0, 0);
		if (!ops[i])
			goto nomem;
		ops[i]->grp = g;
		ops[i]->idx = i;
	}
	g->cb = cb;
	g->arg = arg;
	g->n = g->left = n;
	/* Submitted in key order: each node's commands leave in one write, the replies come back
	 * in that order. */
	for (size_t i = 0; i < n; i++)
		op_submit(rc, ops[i]);
	free(ops);
	return 0;
nomem:
	if (ops)
		for (size_t i = 0; i < n; i++)
			free(ops[i]);
	free(ops);
	free(g);
	return -ENOMEM;
}

int kvp_rc_fds(struct kvp_rc *rc, struct pollfd *pfds, int max)
{
	int k = 0;

	for (int i = 0; i < rc->nnodes; i++) {
		struct rc_node *n = rc->nodes[i];

		if (!n->ac || !n->events)
			continue;
		if (k < max) {
			pfds[k].fd = n->ac->c.fd;
			pfds[k].events = n->events;
			pfds[k].revents = 0;
		}
		k++;
	}
	return k;
}

uint64_t kvp_rc_fds_gen(const struct kvp_rc *rc)
{
	return rc->gen;
}

/* Reads until the socket is empty (or IO_PER_EVENT), straight into the reply reader's buffer,
 * running the callbacks of the replies completed after each read. End of stream, errors and a
 * connection not up yet go to hiredis, which reads again and sees them. */
/* Whether the reader's unparsed bytes are a bulk reply's length line (its '$' read already, or
 * not yet), complete: then its length, where its length digits start and where its payload
 * does, and whether it is a reply of its own (not inside an array). */
static int bulk_at(const redisReader *r, size_t *len, size_t *digits, size_t *at, int *top)
{
	const char *p = r->buf + r->pos, *e = r->buf + r->len, *q;
	size_t v = 0;

	if (r->ridx >= 0 && r->rstack[r->ridx].type == REDIS_REPLY_STRING) {
		*top = r->ridx == 0;
	} else if (p < e && *p == '$') {
		*top = r->ridx <= 0;
		p++;
	} else {
		return 0;
	}
	for (q = p; q < e && q - p < 19 && *q >= '0' && *q <= '9'; q++)
		v = v * 10 + (size_t)(*q - '0');
	if (q == p || q + 1 >= e || q[0] != '\r' || q[1] != '\n')
		return 0;
	*len = v;
	*digits = (size_t)(p - r->buf);
	*at = (size_t)(q + 2 - r->buf);
	return 1;
}

/* Whether what the reader holds unparsed, the start of one reply item that more bytes would
 * complete, may grow: a bulk reply no longer than its command answers (item_fits), anything
 * else (a line, a length line) no longer than LINE_MAX_BYTES. Checked before each read, so a
 * node never makes the buffer grow past what the command answers. */
static int pending_fits(const struct rc_node *n)
{
	const redisReader *r = n->ac->c.reader;
	size_t blen, digits, at;
	int top;

	if (bulk_at(r, &blen, &digits, &at, &top))
		return item_fits(n, REDIS_REPLY_STRING, r->ridx > 0 ? r->ridx : 0,
				 r->ridx > 0 ? r->rstack[r->ridx].idx : 0, len_ll(blen));
	return r->len - r->pos <= LINE_MAX_BYTES;
}

/* Runs the callbacks of the replies the reader completes. A reply the reader refuses (hiredis's
 * own checks, or item_take's) frees the context in there: the commands fail with
 * KVP_RC_EPROTOCOL and the refusal is counted once. */
static void node_process(struct rc_node *n)
{
	struct kvp_rc *rc = n->rc;
	uint64_t bad = rc->stats.bad_replies;

	n->drop_st = KVP_RC_EPROTOCOL;
	redisProcessCallbacks(n->ac);
	if (n->ac)
		n->drop_st = KVP_RC_ENODE_DOWN;
	else if (rc->stats.bad_replies == bad)
		rc->stats.bad_replies++;
}

/* A reply refused before it was read whole: the connection closed, its commands failed. */
static void node_refuse(struct rc_node *n)
{
	n->rc->stats.bad_replies++;
	node_drop(n, KVP_RC_EPROTOCOL);
}

/* Reads until the socket is empty (or IO_PER_EVENT), straight into the reply reader's buffer,
 * running the callbacks of the replies completed after each read. A bulk reply in progress is
 * read to its end and no further (nothing is left for the reader to move to its front after
 * it); a large one of its own, when the owner gave buf_get, goes into such a buffer straight
 * from the socket instead (the stash), the reader left a zero-length bulk in its place, which
 * the value's own "\r\n" completes and reply_string swaps for the stash. End of stream, errors
 * and a connection not up yet go to hiredis, which reads again and sees them. */
static void node_read(struct rc_node *n)
{
	struct kvp_rc *rc = n->rc;
	size_t total = 0;
	int probing = 0;

	while (n->ac && n->state == N_UP && total < IO_PER_EVENT) {
		redisReader *r = n->ac->c.reader;
		size_t want = 0, blen, digits, at;
		ssize_t got;
		int top;
		sds b;

		if (n->stash && n->stash_have < n->stash_len) {
			got = read(n->ac->c.fd, (char *)n->stash + n->stash_have,
				   n->stash_len - n->stash_have);
			if (got < 0 && errno == EINTR)
				continue;
			if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
				return;
			if (got <= 0)
				break;
			n->stash_have += (size_t)got;
			total += (size_t)got;
			continue;
		}
		if (!pending_fits(n)) {
			node_refuse(n);
			return;
		}
		if (bulk_at(r, &blen, &digits, &at, &top) && r->len - at < blen + 2) {
			size_t have = r->len - at;
			void *s;

			want = blen + 2 - have;
			if (top && !n->stash && blen >= KVP_RC_BUF_MIN && have < blen &&
			    rc->cfg.buf_get && (s = rc->cfg.buf_get(rc->cfg.buf_ctx, blen))) {
				memcpy(s, r->buf + at, have);
				sdsIncrLen(r->buf, -(int)(sdslen(r->buf) - digits));
				b = sdscatlen(r->buf, "0\r\n", 3); /* room: it just shrank */
				r->buf = b;
				r->len = sdslen(b);
				n->stash = s;
				n->stash_len = blen;
				n->stash_have = have;
				n->probe = 1;
				probing = 0;
				continue;
			}
		}
		if (probing) /* what the probe read was not a large value */
			n->probe = 0;
		b = sdsMakeRoomFor(r->buf, want > READ_CHUNK ? want : READ_CHUNK);
		if (!b)
			break;
		r->buf = b;
		/* After a stashed value, the next reply's first bytes alone: a large value's
		 * length line and little of the value, which then goes to a stash too (instead of
		 * most of it into the reader's buffer and a copy of that). */
		probing = !want && n->probe && r->pos == r->len;
		got = read(n->ac->c.fd, b + sdslen(b),
			   want >= 4096 ? want
			   : probing	? 64
					: sdsavail(b));
		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return;
		if (got <= 0)
			break;
		sdsIncrLen(b, (int)got);
		r->len = sdslen(b);
		total += (size_t)got;
		node_process(n);
	}
	/* Not while a stash fills (the event limit): hiredis would read its bytes. */
	if (n->ac && !(total >= IO_PER_EVENT && n->stash && n->stash_have < n->stash_len))
		redisAsyncHandleRead(n->ac);
}

/* The unwritten output stream as iovecs: output-buffer bytes up to each value's position, the
 * value, ... then the buffer's rest. Returns how many (at most IOV_N). */
static int out_iov(const struct rc_node *n, struct iovec *iov)
{
	char *ob = n->ac->c.obuf;
	uint64_t at = n->ob_pos + n->out_off, end = n->ob_pos + sdslen(ob);
	uint32_t i;
	int k = 0;

	for (i = 0; i < n->ext_n && k + 2 <= IOV_N; i++) {
		const struct rc_ext *x = ext_at(n, i);
		size_t off = i ? 0 : n->ext_done;

		if (x->at > at) {
			iov[k++] = (struct iovec){ ob + (at - n->ob_pos), x->at - at };
			at = x->at;
		}
		iov[k++] = (struct iovec){ (char *)x->p + off, x->len - off };
	}
	if (i < n->ext_n)
		end = ext_at(n, i)->at; /* the buffer's bytes after it wait for it */
	if (at < end && k < IOV_N)
		iov[k++] = (struct iovec){ ob + (at - n->ob_pos), end - at };
	return k;
}

/* Marks w bytes of the output stream written. */
static void out_advance(struct rc_node *n, size_t w)
{
	while (w) {
		uint64_t at = n->ob_pos + n->out_off;
		size_t take;

		if (n->ext_n && ext_at(n, 0)->at == at) {
			struct rc_ext *x = ext_at(n, 0);

			take = x->len - n->ext_done < w ? x->len - n->ext_done : w;
			n->ext_done += take;
			if (n->ext_done == x->len) {
				n->ext_bytes -= x->len;
				n->ext_done = 0;
				n->ext_head = (n->ext_head + 1) & (n->ext_cap - 1);
				n->ext_n--;
			}
		} else {
			uint64_t lim =
				n->ext_n ? ext_at(n, 0)->at : n->ob_pos + sdslen(n->ac->c.obuf);

			take = lim - at < w ? (size_t)(lim - at) : w;
			n->out_off += take;
		}
		w -= take;
	}
}

/* Writes the output stream (the buffer from out_off, the values in between) until the socket
 * is full (or IO_PER_EVENT); compacts the buffer when everything went, or when the written part
 * outgrew the rest (a memmove no longer than what was written). Errors and a connection not up
 * yet go to hiredis (a stream with values in it is dropped at tick instead: hiredis would write
 * its buffer without them). */
static void node_write(struct rc_node *n)
{
	redisContext *c = &n->ac->c;
	struct iovec iov[IOV_N];
	size_t total = 0;

	if (n->state != N_UP) {
		obuf_compact(n);
		redisAsyncHandleWrite(n->ac);
		return;
	}
	while (out_pending(n) && total < IO_PER_EVENT) {
		int k = out_iov(n, iov);
		ssize_t w = k == 1 ? write(c->fd, iov[0].iov_base, iov[0].iov_len)
				   : writev(c->fd, iov, k);

		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			break;
		if (w <= 0) {
			if (n->ext_n) {
				n->broken = 1;
				return;
			}
			obuf_compact(n); /* hiredis writes again, sees the error and disconnects */
			redisAsyncHandleWrite(n->ac);
			return;
		}
		out_advance(n, (size_t)w);
		total += (size_t)w;
	}
	if (!obuf_pending(n) || n->out_off >= obuf_pending(n))
		obuf_compact(n);
	ev_set(n, out_pending(n) ? POLLOUT : 0, out_pending(n) ? 0 : POLLOUT);
}

/* Drops the nodes that sent a reply that is none (a lie found in a callback of theirs). */
static void drop_bad(struct kvp_rc *rc)
{
	for (int i = 0; i < rc->nnodes; i++)
		if (rc->nodes[i]->bad) {
			rc->nodes[i]->bad = 0;
			node_drop(rc->nodes[i], KVP_RC_EPROTOCOL);
		}
}

void kvp_rc_on_ready(struct kvp_rc *rc, int fd, short revents)
{
	rc->now = kvp_rc_now_ms();
	for (int i = 0; i < rc->nnodes; i++) {
		struct rc_node *n = rc->nodes[i];

		if (!n->ac || n->ac->c.fd != fd)
			continue;
		if (revents & (POLLIN | POLLERR | POLLHUP | POLLNVAL))
			node_read(n);
		if (n->ac && (revents & POLLOUT))
			node_write(n);
		node_pump(rc, n);
		if (n->ac && n->state == N_UP && out_pending(n) && !(n->events & POLLOUT))
			ev_set(n, POLLOUT, 0); /* what the pump added */
		break;
	}
	drop_bad(rc);
	maybe_refresh(rc);
	drain_failq(rc);
}

static void at_min(int64_t *best, uint64_t at, uint64_t now)
{
	int64_t d = at > now ? (int64_t)(at - now) : 0;

	if (*best < 0 || d < *best)
		*best = d;
}

int kvp_rc_next_timeout_ms(const struct kvp_rc *rc)
{
	uint64_t now = kvp_rc_now_ms(), at;
	int64_t best = -1;
	int up = 0;

	if (rc->failq.head)
		return 0;
	for (int i = 0; i < rc->nnodes; i++) {
		const struct rc_node *n = rc->nodes[i];

		if (n->state == N_UP)
			up = 1;
		if (n->broken || n->bad)
			return 0;
		if (n->state == N_CONNECTING)
			at_min(&best, n->connect_deadline, now);
		if (n->state == N_DOWN)
			at_min(&best, n->retry_at, now);
		if (n->fifo.head)
			at_min(&best, n->fifo.head->deadline, now);
	}
	if (up && refresh_due(rc, &at))
		at_min(&best, at, now);
	if (rc->redirq.head)
		at_min(&best, rc->redirq.head->deadline, now);
	if (rc->refresh_inflight)
		at_min(&best, rc->refresh_deadline, now);
	return best > 1000000 ? 1000000 : (int)best;
}

void kvp_rc_tick(struct kvp_rc *rc, uint64_t now_ms)
{
	rc->now = now_ms;
	/* A CLUSTER SLOTS the asked node does not answer in time: that node is dropped (its
	 * callback then runs with no reply) and the map is asked of another. */
	if (rc->refresh_inflight && rc->refresh_node && now_ms >= rc->refresh_deadline) {
		rc->stats.refresh_timeouts++;
		node_drop(rc->refresh_node, KVP_RC_ETIMEOUT);
		rc->refresh_inflight = 0;
		rc->refresh_node = NULL;
		rc->refresh_wanted = 1;
	}
	drop_bad(rc);
	/* Redirects whose map did not come in time (all waited op_timeout_ms: oldest first). */
	while (rc->redirq.head && now_ms >= rc->redirq.head->deadline) {
		struct rc_op *op = rc->redirq.head;

		list_del(&rc->redirq, op);
		op_fail_later(rc, op, KVP_RC_ETIMEOUT);
	}
	for (int i = 0; i < rc->nnodes; i++) {
		struct rc_node *n = rc->nodes[i];

		if (n->broken) {
			n->broken = 0;
			node_drop(n, KVP_RC_ENODE_DOWN);
		}
		if (n->state == N_CONNECTING && now_ms >= n->connect_deadline)
			node_drop(n, KVP_RC_ENODE_DOWN);
		else if (n->fifo.head && now_ms >= n->fifo.head->deadline)
			node_drop(n, KVP_RC_ETIMEOUT);
		if (n->state == N_DOWN && now_ms >= n->retry_at)
			node_connect(rc, n);
	}
	maybe_refresh(rc);
	drain_failq(rc);
}

int kvp_rc_ready(const struct kvp_rc *rc)
{
	if (!rc->loaded)
		return 0;
	for (int s = 0; s < KVP_RC_SLOTS; s++)
		if (rc->slots[s] < 0 || rc->nodes[rc->slots[s]]->state != N_UP)
			return 0;
	return 1;
}

uint32_t kvp_rc_inflight(const struct kvp_rc *rc, uint64_t *bytes)
{
	if (bytes)
		*bytes = rc->inflight_bytes;
	return rc->inflight;
}

const struct kvp_rc_stats *kvp_rc_stats(const struct kvp_rc *rc)
{
	return &rc->stats;
}
