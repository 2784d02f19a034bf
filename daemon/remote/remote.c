/* remote.c - the remote tier's I/O thread: it owns a Redis Cluster client (remote_cluster.c)
 * and everything that waits on sockets; the loop trades queue entries with it (remote.h).
 *
 * An entry is allocated once by the submitting loop, carries the operation's bytes to the
 * thread (the submission queue; a SET's value is written to the socket from the entry), comes
 * back with its status and a GET's value (the completion queue; a page's verified here) and is
 * freed by the loop after its callback. The thread is woken by an eventfd
 * (kvp_remote_sync) and wakes the loop through another one, in an epoll set with the alarm's
 * timerfd: the loop's one fd. The in-flight bounds are kept on the loop's side, at submission,
 * so that a refusal is immediate and the thread's client never refuses.
 *
 * The loop never blocks on the thread: both queues are lock-free stacks (a push is a
 * compare-and-swap, the other side takes the whole stack with one exchange and reverses it),
 * and the figures are copied under a mutex the loop only tries (a busy one leaves it the copy
 * of its last turn). A thread preempted while holding a lock on a loaded machine would
 * otherwise hold up an Alloc. */
#include "remote.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/stat.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include "crc32c.h"

#define TIMER_TAG 1 /* epoll data of the timerfd */
#define DONE_TAG 2  /* of the completion eventfd */
#define MAX_OPS 4096
/* SET completions (spills, write-through: nothing waits on them but the in-flight books) reach
 * the loop at most this late, in batches, instead of waking it for each; at once when they
 * free SET_WAKE_BYTES of the bounds. */
#define SET_ACK_MS 50
/* SETs the loop queues do not wake the thread until SET_WAKE_BYTES of them wait: while SETs
 * come, the thread looks for them every SET_WAKE_MS by itself (for SET_ACTIVE_MS after the
 * last; past that it sleeps, says so, and the next SET wakes it). Small pages spilled one Alloc
 * at a time would otherwise cost a wake-up of the thread, and writes to the Redis masters,
 * right after every Alloc, while the engine's next calls arrive; now the loop's share of a
 * spill is its copy. Anything else queued wakes the thread at the end of the loop's turn. */
#define SET_WAKE_MS 20
#define SET_ACTIVE_MS 1000
#define SET_WAKE_BYTES (256u << 10) /* a page-sized value goes at once */

/* Entries of at least BIG_MIN data bytes (page values) are kept for reuse, up to BIG_KEEP of
 * them: fresh ones that size come from mmap or a trimmed heap, and copying a page into one
 * faulted in every page of it, each time. */
#define BIG_MIN (64u << 10)
#define BIG_KEEP 32

/* Cluster clients the thread runs, each with its own connection to every master; an operation
 * goes to the one its key's slot picks (so operations on one key keep their order; an EXISTS
 * of many keys goes by its first). Redis writes a connection at most 64 KiB per event-loop turn
 * (writeToClient's NET_MAX_WRITES_PER_EVENT): with page-sized values pipelined on one
 * connection it ran one epoll_wait per GET (perf trace), against one per 12 for 16 connections,
 * and 16 GETs of 256 KiB in flight went at 1.9-2.9 GB/s over one connection, 2.8-3.4 over 16
 * (one master on loopback, 2 cores). The figures (connects, ...) add up all of them. */
#define RC_CONNS KVP_REMOTE_CONNS_MAX /* the most: conf.connections are made */

enum q_kind { Q_SET, Q_PAGE, Q_GETPAGE, Q_DEL, Q_EXISTS };

/* A GET's value: the big ones are read into these by the cluster client itself (its buf_get),
 * small ones copied by the thread; the big ones go back to it after the callback (the spare
 * stack) and are used again: a fresh buffer per value, freed on the other thread, made the
 * allocator trim its heap and fault every page of the next one in (fetch at half speed). */
struct vbuf {
	struct vbuf *next;
	size_t cap;
	uint8_t data[];
};

struct q_ent {
	struct q_ent *next;
	struct kvp_remote *r;
	size_t cap; /* data bytes allocated */
	enum q_kind kind;
	kvp_rc_cb *cb;
	kvp_rc_multi_cb *mcb;
	kvp_remote_page_cb *pcb;
	void *arg;
	uint64_t acct; /* bytes booked against max_inflight_bytes */
	uint32_t nops; /* operations booked (n for EXISTS) */
	uint32_t ttl;
	struct kvp_rc *rc;   /* the client it went to */
	struct kvp_rv_fp fp; /* Q_PAGE, Q_GETPAGE */
	uint64_t page_bytes; /* Q_GETPAGE: the size a value's payload must have */
	size_t klen, hlen, vlen, n;
	/* completion */
	enum kvp_rc_status st;
	int verr;		      /* Q_GETPAGE: kvp_rv_decode's verdict on a hit */
	void *val;		      /* a GET hit's value (in vb); Q_GETPAGE: its payload */
	size_t len;		      /* its length */
	enum kvp_rc_status *sts;      /* EXISTS: n statuses (malloc) */
	struct vbuf *vb;	      /* val\'s buffer */
	uint32_t crc;		      /* Q_PAGE: the payload's CRC32C, taken while copying it */
	uint8_t hdr[KVP_RV_HDR_SIZE]; /* Q_PAGE: the header, written by the thread */
	/* Q_SET / Q_PAGE / Q_GETPAGE / Q_DEL: key, then hdr (Q_SET), then value (the
	 * cluster client writes it to the socket from here); Q_EXISTS: n key lengths (size_t), then
	 * the keys */
	uint8_t data[];
};

struct q_list {
	struct q_ent *head, *tail;
};

/* A lock-free stack of entries, newest first; one side pushes, the other takes it whole. */
typedef _Atomic(struct q_ent *) q_stack;

struct kvp_remote {
	struct kvp_remote_conf conf;
	struct kvp_rv_mac mac;	  /* the deployment's secret: values' MACs (the thread's) */
	_Atomic uint64_t bad_mac; /* values refused for their MAC */
	int epfd, tfd, done_fd, wake_fd;
	int64_t alarm_ms; /* kvp_remote_set_alarm's; -1: none */
	pthread_t thread;
	int started;
	/* the loop's side only */
	uint32_t inflight;
	uint64_t inflight_bytes, rejected;
	int queued;		     /* entries appended since the last wake-up */
	struct q_ent *big[BIG_KEEP]; /* entries kept for reuse */
	int nbig;
	int queued_urgent;		/* one of them is not a SET */
	uint64_t queued_bytes;		/* their bytes */
	int64_t timer_ms;		/* what the timerfd is armed for; -1: off */
	struct kvp_rc_stats stats_seen; /* the loop's copy of rc_stats */
	/* shared */
	q_stack subq, doneq;
	_Atomic(struct vbuf *) vspare; /* big value buffers the loop is done with */
	atomic_int stop;
	atomic_int done_signalled; /* the done eventfd was written, not drained since */
	atomic_int rc_ready;
	atomic_int dormant; /* the thread sleeps without looking for SETs */
	pthread_mutex_t mu; /* rc_stats */
	struct kvp_rc_stats rc_stats;
	/* the thread's side only */
	struct kvp_rc *rcs[RC_CONNS];
	int nconns;		/* conf.connections */
	struct q_list finished; /* completions of this turn, published at its end */
	struct vbuf *vfree;	/* the thread\'s spare value buffers */
	int nvfree;
	/* The longest value a GET of a page asked for may have (header and page bytes): spare
	 * buffers larger than that are freed, not kept (a value's size comes from the wire). */
	uint64_t vkeep;
	uint64_t set_until;	      /* it looks for SETs every SET_WAKE_MS until then */
	struct kvp_rc_stats th_stats; /* the last published */
	int urgent;		      /* one of them is not a SET: the loop is woken now */
	int ready_known;	      /* rc_ready was computed once */
	uint64_t ack_bytes;	      /* of the SET completions held */
	uint64_t ack_at; /* SET completions held since: the loop is woken by then; 0: none */
};

static void q_add(struct q_list *l, struct q_ent *e)
{
	e->next = NULL;
	if (l->tail)
		l->tail->next = e;
	else
		l->head = e;
	l->tail = e;
}

static void q_join(struct q_list *to, struct q_list *from)
{
	if (!from->head)
		return;
	if (to->tail)
		to->tail->next = from->head;
	else
		to->head = from->head;
	to->tail = from->tail;
	from->head = from->tail = NULL;
}

static void stack_push_chain(q_stack *s, struct q_ent *newest, struct q_ent *oldest)
{
	struct q_ent *old = atomic_load_explicit(s, memory_order_relaxed);

	do
		oldest->next = old;
	while (!atomic_compare_exchange_weak_explicit(s, &old, newest, memory_order_seq_cst,
						      memory_order_relaxed));
}

/* Takes the whole stack, oldest first. */
static struct q_list stack_take(q_stack *s)
{
	struct q_ent *e = atomic_exchange_explicit(s, NULL, memory_order_acquire), *next;
	struct q_list l = { NULL, e };

	for (; e; e = next) { /* reversed */
		next = e->next;
		e->next = l.head;
		l.head = e;
	}
	return l;
}

static void efd_write(int fd)
{
	uint64_t one = 1;

	while (write(fd, &one, sizeof(one)) < 0 && errno == EINTR)
		;
}

static void efd_drain(int fd)
{
	uint64_t v;

	while (read(fd, &v, sizeof(v)) == sizeof(v))
		;
}

/* ---- the thread ---- */

/* Keeps vb as a spare (BIG_KEEP of them at most, none larger than a page value) or frees it. */
static void th_vbuf_keep(struct kvp_remote *r, struct vbuf *vb)
{
	if (vb->cap >= BIG_MIN && vb->cap <= ((r->vkeep + 4095) & ~(uint64_t)4095) &&
	    r->nvfree < BIG_KEEP) {
		vb->next = r->vfree;
		r->vfree = vb;
		r->nvfree++;
	} else {
		free(vb);
	}
}

/* A buffer for a value of len bytes: a spare one that fits, else a new one. NULL: ENOMEM. */
static struct vbuf *th_vbuf(struct kvp_remote *r, size_t len)
{
	struct vbuf **pp, *vb;
	size_t cap;

	if (len >= BIG_MIN) {
		if (!r->vfree) { /* what the loop gave back; more than it keeps are freed */
			vb = atomic_exchange_explicit(&r->vspare, NULL, memory_order_acquire);
			while (vb) {
				struct vbuf *next = vb->next;

				th_vbuf_keep(r, vb);
				vb = next;
			}
		}
		for (pp = &r->vfree; (vb = *pp); pp = &vb->next)
			if (vb->cap >= len) {
				*pp = vb->next;
				r->nvfree--;
				return vb;
			}
	}
	cap = len >= BIG_MIN ? (len + 4095) & ~(size_t)4095 : len + 1;
	vb = malloc(sizeof(*vb) + cap);
	if (vb)
		vb->cap = cap;
	return vb;
}

/* The cluster client's buffers for large values (kvp_rc_config.buf_get / buf_put). */
static void *th_buf_get(void *ctx, size_t len)
{
	struct vbuf *vb = th_vbuf(ctx, len);

	return vb ? vb->data : NULL;
}

static void th_vbuf_put(struct kvp_remote *r, struct vbuf *vb)
{
	th_vbuf_keep(r, vb);
}

static void th_buf_put(void *ctx, void *buf)
{
	th_vbuf_put(ctx, (struct vbuf *)((uint8_t *)buf - offsetof(struct vbuf, data)));
}

static void th_done(void *arg, enum kvp_rc_status st, const void *val, size_t len)
{
	struct q_ent *e = arg;
	struct kvp_remote *r = e->r;

	e->st = st;
	if (e->kind != Q_SET && e->kind != Q_PAGE)
		r->urgent = 1;
	else if ((r->ack_bytes += e->acct) >= SET_WAKE_BYTES)
		r->urgent = 1;
	if (st == KVP_RC_HIT && e->kind == Q_GETPAGE) {
		void *b = kvp_rc_take_value(e->rc); /* read straight into one of ours */

		if (b) {
			e->vb = (struct vbuf *)((uint8_t *)b - offsetof(struct vbuf, data));
		} else if ((e->vb = th_vbuf(r, len))) {
			memcpy(e->vb->data, val, len);
		} else {
			e->st = KVP_RC_EPROTOCOL; /* out of memory: a failure, not a value */
			q_add(&r->finished, e);
			return;
		}
		e->val = e->vb->data;
		e->len = len;
	}
	if (e->st == KVP_RC_HIT && e->kind == Q_GETPAGE) {
		/* Header and checksum here, off the loop: it only copies verified bytes. */
		const void *pl;
		uint64_t n;

		e->verr = kvp_rv_decode(&e->fp, &r->mac, e->data, e->klen, e->page_bytes, e->val,
					e->len, &pl, &n);
		if (e->verr == -KVP_RV_EMAC)
			atomic_fetch_add_explicit(&r->bad_mac, 1, memory_order_relaxed);
		if (e->verr == 0) {
			e->val = (void *)pl;
			e->len = n;
		} else {
			th_vbuf_put(r, e->vb);
			e->vb = NULL;
			e->val = NULL;
			e->len = 0;
		}
	}
	q_add(&r->finished, e);
}

static void th_multi_done(void *arg, size_t n, const enum kvp_rc_status *st)
{
	struct q_ent *e = arg;

	e->sts = malloc(sizeof(*e->sts) * (n ? n : 1));
	if (e->sts)
		memcpy(e->sts, st, sizeof(*e->sts) * n);
	e->st = KVP_RC_OK;
	e->r->urgent = 1;
	q_add(&e->r->finished, e);
}

/* The length of an EXISTS entry's first key. */
static size_t first_klen(const struct q_ent *e)
{
	size_t len;

	memcpy(&len, e->data, sizeof(len)); /* data is not aligned */
	return len;
}

/* Hands e to its client; a refusal completes it at once (the bounds are the loop's, so only
 * ENOMEM is expected). */
static void th_submit(struct kvp_remote *r, struct q_ent *e)
{
	const uint8_t *key = e->data;
	int rc;

	if (e->kind == Q_EXISTS) /* its first key picks: n keys go out on one connection */
		e->rc = r->rcs[kvp_rc_slot(key + sizeof(size_t) * e->n, first_klen(e)) %
			       (uint32_t)r->nconns];
	else
		e->rc = r->rcs[kvp_rc_slot(key, e->klen) % (uint32_t)r->nconns];
	switch (e->kind) {
	case Q_SET: /* a large value is written from the entry (it lives until its completion
		     * is taken), not copied again. Small ones are copied: written from the entries,
		     * 32 KiB pages spilled into a sleeping master raised the spilling node's Alloc
		     * p99 from about 1x to 2-3x a node without a remote tier (bench_remote's
		     * remote.slow_master.alloc_p99), for a reason not found yet. */
		rc = (e->vlen >= BIG_MIN ? kvp_rc_set_ref
					 : kvp_rc_set)(e->rc, key, e->klen, key + e->klen, e->hlen,
						       key + e->klen + e->hlen, e->vlen, e->ttl,
						       th_done, e);
		break;
	case Q_PAGE:
		kvp_rv_header_crc(&e->fp, e->vlen, e->crc, e->hdr);
		kvp_rv_seal(&r->mac, key, e->klen, e->hdr, key + e->klen, e->vlen);
		rc = (e->vlen >= BIG_MIN ? kvp_rc_set_ref
					 : kvp_rc_set)(e->rc, key, e->klen, e->hdr, sizeof(e->hdr),
						       key + e->klen, e->vlen, e->ttl, th_done, e);
		break;
	case Q_GETPAGE: {
		/* A value longer than a page's is refused as it is announced, before it is read. */
		uint64_t max = e->page_bytes ? KVP_RV_HDR_SIZE + e->page_bytes : 0;

		if (max > r->vkeep)
			r->vkeep = max;
		rc = kvp_rc_get_max(e->rc, key, e->klen, max, th_done, e);
		break;
	}
	case Q_DEL: rc = kvp_rc_del(e->rc, key, e->klen, th_done, e); break;
	default: {
		size_t *lens = malloc(sizeof(*lens) * e->n);
		const void **keys = malloc(sizeof(*keys) * e->n);
		const uint8_t *k = e->data + sizeof(size_t) * e->n;

		rc = -ENOMEM;
		if (keys && lens) {
			memcpy(lens, e->data, sizeof(size_t) * e->n); /* data is not aligned */
			for (size_t i = 0; i < e->n; i++) {
				keys[i] = k;
				k += lens[i];
			}
			rc = kvp_rc_exists_many(e->rc, e->n, keys, lens, th_multi_done, e);
		}
		free(keys);
		free(lens);
		if (rc < 0) {
			e->sts = calloc(e->n, sizeof(*e->sts));
			for (size_t i = 0; e->sts && i < e->n; i++)
				e->sts[i] = KVP_RC_EPROTOCOL;
			r->urgent = 1;
			q_add(&r->finished, e);
		}
		return;
	}
	}
	if (rc < 0)
		th_done(e, KVP_RC_EPROTOCOL, NULL, 0);
}

/* The turn's completions and figures go to the loop. Its fd is written once until drained,
 * at once when a completion other than a SET's waits or nothing else is in flight (the last of
 * a burst), else SET_ACK_MS after the first SET's. */
static void th_publish(struct kvp_remote *r, uint64_t now)
{
	struct kvp_rc_stats sum;
	const struct kvp_rc_stats *st;
	int signal = 0;

	if (r->finished.head && !r->urgent && !r->ack_at)
		r->ack_at = now + SET_ACK_MS;
	if (r->finished.head) {
		struct q_ent *newest = NULL, *oldest = r->finished.head, *e, *next;

		for (e = r->finished.head; e;
		     e = next) { /* newest first, as the stack keeps them */
			next = e->next;
			e->next = newest;
			newest = e;
		}
		r->finished.head = r->finished.tail = NULL;
		stack_push_chain(&r->doneq, newest, oldest);
	}
	if (atomic_load_explicit(&r->doneq, memory_order_relaxed) && !r->urgent &&
	    !atomic_load_explicit(&r->subq, memory_order_relaxed)) {
		uint32_t busy = 0; /* nothing left in flight to batch the held ones with: now */

		for (int c = 0; c < r->nconns && !busy; c++)
			busy = kvp_rc_inflight(r->rcs[c], NULL);
		r->urgent = !busy;
	}
	if (atomic_load_explicit(&r->doneq, memory_order_relaxed) &&
	    (r->urgent || (r->ack_at && now >= r->ack_at))) {
		signal = !atomic_exchange(&r->done_signalled, 1);
		r->urgent = 0;
		r->ack_at = 0;
		r->ack_bytes = 0;
	} else if (!atomic_load_explicit(&r->doneq, memory_order_relaxed)) {
		r->urgent = 0; /* the loop took them meanwhile */
		r->ack_at = 0;
		r->ack_bytes = 0;
	}
	if (signal)
		efd_write(r->done_fd);
	/* The clients' figures, summed (every field a counter). */
	memset(&sum, 0, sizeof(sum));
	for (int c = 0; c < r->nconns; c++) {
		const uint64_t *v = (const uint64_t *)kvp_rc_stats(r->rcs[c]);
		uint64_t *to = (uint64_t *)&sum;

		for (size_t i = 0; i < sizeof(sum) / sizeof(uint64_t); i++)
			to[i] += v[i];
	}
	st = &sum;
	/* Readiness walks every slot: again only when connections or the map changed. */
	if (!r->ready_known || st->connects != r->th_stats.connects ||
	    st->disconnects != r->th_stats.disconnects || st->refreshes != r->th_stats.refreshes ||
	    st->moved != r->th_stats.moved) {
		int ready = 1;

		for (int c = 0; c < r->nconns && ready; c++)
			ready = kvp_rc_ready(r->rcs[c]);
		atomic_store(&r->rc_ready, ready);
		r->ready_known = 1;
	}
	if (memcmp(st, &r->th_stats, sizeof(*st))) {
		r->th_stats = *st;
		pthread_mutex_lock(&r->mu);
		r->rc_stats = *st;
		pthread_mutex_unlock(&r->mu);
	}
}

static void *th_main(void *arg)
{
	struct kvp_remote *r = arg;
	struct pollfd p[1 + RC_CONNS * KVP_RC_NODES_MAX];
	int8_t owner[1 + RC_CONNS * KVP_RC_NODES_MAX]; /* which client a pollfd is of */

	for (;;) {
		int n = 0, t = -1, stop;
		struct q_list sub;

		for (int c = 0; c < r->nconns; c++) {
			int k = kvp_rc_fds(r->rcs[c], p + 1 + n, KVP_RC_NODES_MAX), tc;

			k = k > KVP_RC_NODES_MAX ? KVP_RC_NODES_MAX : k;
			for (int i = 0; i < k; i++)
				owner[1 + n + i] = (int8_t)c;
			n += k;
			tc = kvp_rc_next_timeout_ms(r->rcs[c]);
			if (tc >= 0 && (t < 0 || tc < t))
				t = tc;
		}
		p[0] = (struct pollfd){ .fd = r->wake_fd, .events = POLLIN };
		if (r->ack_at) {
			uint64_t now = kvp_rc_now_ms();
			int a = r->ack_at > now ? (int)(r->ack_at - now) : 0;

			t = t < 0 || a < t ? a : t;
		}
		if (kvp_rc_now_ms() < r->set_until)
			t = t < 0 || t > SET_WAKE_MS ? SET_WAKE_MS : t;
		else { /* the loop wakes it for the next SET; one pushed meanwhile is seen here */
			atomic_store(&r->dormant, 1);
			if (atomic_load(&r->subq))
				t = 0;
		}
		if (poll(p, (nfds_t)n + 1, t) < 0 && errno != EINTR)
			p[0].revents = 0;
		if (p[0].revents)
			efd_drain(r->wake_fd);
		stop = atomic_load(&r->stop);
		sub = stack_take(&r->subq);
		if (sub.head)
			r->set_until = kvp_rc_now_ms() + SET_ACTIVE_MS;
		for (struct q_ent *e = sub.head, *next; e; e = next) {
			next = e->next;
			th_submit(r, e);
		}
		for (int i = 1; i <= n; i++)
			if (p[i].revents)
				kvp_rc_on_ready(r->rcs[owner[i]], p[i].fd, p[i].revents);
		for (int c = 0; c < r->nconns; c++)
			kvp_rc_tick(r->rcs[c], kvp_rc_now_ms());
		if (stop)
			break;
		th_publish(r, kvp_rc_now_ms());
	}
	for (int c = 0; c < r->nconns; c++) { /* what is in flight completes, closed */
		kvp_rc_free(r->rcs[c]);
		r->rcs[c] = NULL;
	}
	return NULL; /* the joiner takes r->finished */
}

/* ---- the loop's side ---- */

/* One line on stderr, as kvpoold's log writes them (this library links without the log). */
static void cred_log(const char *what, const char *src, const char *why)
{
	fprintf(stderr, "<3>remote tier: %s %s: %s\n", what, src, why);
	fflush(stderr);
}

int kvp_remote_cred_read(const char *src, void *out, size_t cap, size_t *len)
{
	char path[4096];
	const char *dir;
	struct stat st;
	ssize_t n;
	size_t got = 0;
	int fd, e;

	if (strncmp(src, "file:", 5) == 0) {
		snprintf(path, sizeof(path), "%s", src + 5);
	} else if (strncmp(src, "credential:", 11) == 0) {
		dir = getenv("CREDENTIALS_DIRECTORY");
		if (!dir || !*dir)
			return -ENOENT;
		if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir, src + 11) >= sizeof(path))
			return -ENAMETOOLONG;
	} else {
		return -EINVAL;
	}
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &st) < 0) {
		e = -errno;
		close(fd);
		return e;
	}
	if (!S_ISREG(st.st_mode)) {
		close(fd);
		return -EINVAL;
	}
	if (st.st_mode & (S_IROTH | S_IWOTH)) { /* every local user could read (or change) it */
		close(fd);
		return -EPERM;
	}
	while (got < cap && (n = read(fd, (char *)out + got, cap - got)) != 0) {
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			e = -errno;
			close(fd);
			return e;
		}
		got += (size_t)n;
	}
	close(fd);
	if (got == cap)
		return -EFBIG;
	/* one line end, as `echo` and editors leave it */
	if (got && ((char *)out)[got - 1] == '\n')
		got--;
	if (got && ((char *)out)[got - 1] == '\r')
		got--;
	*len = got;
	return 0;
}

/* Why kvp_remote_cred_read refused, in words. */
static const char *cred_why(int err)
{
	switch (err) {
	case -EPERM: return "readable or writable by every user: make it 0400 or 0440";
	case -ENOENT: return "not found (credential: is $CREDENTIALS_DIRECTORY set?)";
	case -EFBIG: return "longer than 4 KiB";
	case -EINVAL: return "not a regular file";
	default: return strerror(-err);
	}
}

struct kvp_remote *kvp_remote_new(const struct kvp_remote_conf *conf)
{
	/* The bounds are kept at submission (kvp_remote_*): the client itself never refuses. */
	struct kvp_rc_config cfg = {
		.seeds = conf->seeds,
		.connect_timeout_ms = conf->connect_timeout_ms,
		.op_timeout_ms = conf->command_timeout_ms,
		.max_inflight_cmds = UINT32_MAX / 2,
		.max_inflight_bytes = UINT64_MAX / 2,
		.buf_get = th_buf_get,
		.buf_put = th_buf_put,
	};
	struct epoll_event ev = { .events = EPOLLIN, .data.u32 = TIMER_TAG };
	struct kvp_remote *r;
	uint8_t secret[4096];
	char password[4097];
	size_t len = 0;
	int e;

	if (!conf->enabled || !conf->seeds[0]) {
		errno = EINVAL;
		return NULL;
	}
	/* The secret and the password are read here, never from the config text itself. */
	if (!conf->secret[0]) {
		cred_log("secret", "", "none configured (secret = file:PATH or credential:NAME)");
		errno = EINVAL;
		return NULL;
	}
	if ((e = kvp_remote_cred_read(conf->secret, secret, sizeof(secret), &len)) < 0 ||
	    len < KVP_RV_SECRET_MIN) {
		cred_log("secret", conf->secret,
			 e < 0 ? cred_why(e) : "shorter than 16 bytes (e.g. 32 random bytes)");
		explicit_bzero(secret, sizeof(secret));
		errno = e < 0 ? -e : EINVAL;
		return NULL;
	}
	if (conf->password[0]) {
		size_t plen = 0;

		if ((e = kvp_remote_cred_read(conf->password, password, sizeof(password) - 1,
					      &plen)) < 0 ||
		    !plen) {
			cred_log("password", conf->password, e < 0 ? cred_why(e) : "empty");
			explicit_bzero(secret, sizeof(secret));
			errno = e < 0 ? -e : EINVAL;
			return NULL;
		}
		password[plen] = 0;
		cfg.password = password;
		cfg.user = conf->user[0] ? conf->user : NULL;
	}
	r = calloc(1, sizeof(*r));
	if (!r) {
		explicit_bzero(secret, sizeof(secret));
		explicit_bzero(password, sizeof(password));
		return NULL;
	}
	e = kvp_rv_mac_init(&r->mac, secret, len);
	explicit_bzero(secret, sizeof(secret));
	if (e < 0) {
		explicit_bzero(password, sizeof(password));
		free(r);
		errno = -e;
		return NULL;
	}
	r->conf = *conf;
	r->nconns = conf->connections >= 1 && conf->connections <= RC_CONNS ? (int)conf->connections
									    : RC_CONNS;
	cfg.buf_ctx = r;
	r->alarm_ms = -1;
	r->timer_ms = -1;
	r->epfd = epoll_create1(EPOLL_CLOEXEC);
	r->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
	r->done_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	r->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (r->epfd < 0 || r->tfd < 0 || r->done_fd < 0 || r->wake_fd < 0 ||
	    epoll_ctl(r->epfd, EPOLL_CTL_ADD, r->tfd, &ev) < 0)
		goto fail;
	ev.data.u32 = DONE_TAG;
	if (epoll_ctl(r->epfd, EPOLL_CTL_ADD, r->done_fd, &ev) < 0)
		goto fail;
	for (int c = 0; c < r->nconns; c++)
		if (!(r->rcs[c] = kvp_rc_new(&cfg))) {
			errno = errno == ENOMEM ? ENOMEM : EINVAL;
			goto fail;
		}
	explicit_bzero(password, sizeof(password)); /* the clients hold copies */
	pthread_mutex_init(&r->mu, NULL);
	if ((e = pthread_create(&r->thread, NULL, th_main, r)) != 0) {
		pthread_mutex_destroy(&r->mu);
		errno = e;
		goto fail;
	}
	r->started = 1;
	return r;
fail:
	e = errno;
	explicit_bzero(password, sizeof(password));
	for (int c = 0; c < r->nconns; c++)
		kvp_rc_free(r->rcs[c]);
	if (r->epfd >= 0)
		close(r->epfd);
	if (r->tfd >= 0)
		close(r->tfd);
	if (r->done_fd >= 0)
		close(r->done_fd);
	if (r->wake_fd >= 0)
		close(r->wake_fd);
	free(r);
	errno = e;
	return NULL;
}

/* Runs e's callback and frees it. */
static void ent_complete(struct kvp_remote *r, struct q_ent *e)
{
	r->inflight -= e->nops;
	r->inflight_bytes -= e->acct;
	if (e->kind == Q_EXISTS) {
		if (!e->sts) { /* the statuses could not be kept */
			enum kvp_rc_status *st = calloc(e->n, sizeof(*st));

			for (size_t i = 0; st && i < e->n; i++)
				st[i] = e->st == KVP_RC_OK ? KVP_RC_EPROTOCOL : e->st;
			e->sts = st;
		}
		if (e->sts)
			e->mcb(e->arg, e->n, e->sts);
		free(e->sts);
	} else {
		if (e->kind == Q_GETPAGE)
			e->pcb(e->arg, e->st, e->verr, e->val, e->len);
		else
			e->cb(e->arg, e->st, e->val, e->len);
		if (e->vb && e->vb->cap >= BIG_MIN) {
			struct vbuf *old = atomic_load_explicit(&r->vspare, memory_order_relaxed);

			do
				e->vb->next = old;
			while (!atomic_compare_exchange_weak_explicit(&r->vspare, &old, e->vb,
								      memory_order_release,
								      memory_order_relaxed));
		} else {
			free(e->vb);
		}
	}
	if (e->cap >= BIG_MIN && r->nbig < BIG_KEEP)
		r->big[r->nbig++] = e;
	else
		free(e);
}

void kvp_remote_free(struct kvp_remote *r)
{
	struct q_list left;

	if (!r)
		return;
	atomic_store(&r->stop, 1);
	efd_write(r->wake_fd);
	pthread_join(r->thread, NULL);
	/* What the thread published, then what it finished last (closed), then what it never
	 * took. */
	{
		struct q_list unsent = stack_take(&r->subq);

		left = stack_take(&r->doneq);
		q_join(&left, &r->finished);
		for (struct q_ent *e = unsent.head; e; e = e->next)
			e->st = KVP_RC_ECLOSED;
		q_join(&left, &unsent);
	}
	for (struct q_ent *e = left.head, *next; e; e = next) {
		next = e->next;
		if (e->kind == Q_EXISTS && !e->sts && e->st == KVP_RC_ECLOSED) {
			e->sts = calloc(e->n, sizeof(*e->sts));
			for (size_t i = 0; e->sts && i < e->n; i++)
				e->sts[i] = KVP_RC_ECLOSED;
		}
		ent_complete(r, e);
	}
	while (r->nbig)
		free(r->big[--r->nbig]);
	for (struct vbuf *vb = r->vfree, *next; vb; vb = next) {
		next = vb->next;
		free(vb);
	}
	for (struct vbuf *vb = atomic_load(&r->vspare), *next; vb; vb = next) {
		next = vb->next;
		free(vb);
	}
	pthread_mutex_destroy(&r->mu);
	close(r->epfd);
	close(r->tfd);
	close(r->done_fd);
	close(r->wake_fd);
	explicit_bzero(&r->mac, sizeof(r->mac));
	free(r);
}

int kvp_remote_fd(const struct kvp_remote *r)
{
	return r->epfd;
}

const struct kvp_remote_conf *kvp_remote_conf(const struct kvp_remote *r)
{
	return &r->conf;
}

void kvp_remote_stats_read(const struct kvp_remote *r, struct kvp_remote_stats *out)
{
	struct kvp_remote *m = (struct kvp_remote *)r; /* the mutex and its copy */
	struct kvp_rc_stats s;

	if (pthread_mutex_trylock(&m->mu) == 0) { /* busy: last turn's copy */
		m->stats_seen = r->rc_stats;
		pthread_mutex_unlock(&m->mu);
	}
	s = r->stats_seen;
	out->ok = s.status[KVP_RC_OK];
	out->hits = s.status[KVP_RC_HIT];
	out->misses = s.status[KVP_RC_MISS];
	out->timeouts = s.status[KVP_RC_ETIMEOUT];
	out->node_down = s.status[KVP_RC_ENODE_DOWN];
	out->no_master = s.status[KVP_RC_ENO_MASTER];
	out->redirect_limit = s.status[KVP_RC_EREDIRECTS];
	out->protocol_errors = s.status[KVP_RC_EPROTOCOL];
	out->closed = s.status[KVP_RC_ECLOSED];
	out->moved = s.moved;
	out->ask = s.ask;
	out->slot_map_loads = s.refreshes;
	out->slot_map_changes = s.map_changes;
	out->slot_map_timeouts = s.refresh_timeouts;
	out->connects = s.connects;
	out->disconnects = s.disconnects;
	out->bad_replies = s.bad_replies;
	out->bad_redirects = s.bad_redirects;
	out->auth_failures = s.auth_failures;
	out->bad_mac = atomic_load_explicit(&r->bad_mac, memory_order_relaxed);
	out->rejected = r->rejected;
	out->sent_bytes = s.sent_bytes;
	out->recv_bytes = s.recv_bytes;
	out->inflight_ops = r->inflight;
	out->inflight_bytes = r->inflight_bytes;
}

int kvp_remote_ready(const struct kvp_remote *r)
{
	return atomic_load(&((struct kvp_remote *)r)->rc_ready);
}

/* Arms the timerfd for the owner's alarm. */
static void sync_timer(struct kvp_remote *r)
{
	int64_t at = r->alarm_ms;
	struct itimerspec its = { 0 };

	if (at == r->timer_ms)
		return;
	r->timer_ms = at;
	if (at >= 0) {
		/* An absolute CLOCK_MONOTONIC time (the clock kvp_rc_now_ms() reads); 0 would
		 * disarm, so "now" is 1 ns. */
		its.it_value.tv_sec = at / 1000;
		its.it_value.tv_nsec = (at % 1000) * 1000000L;
		if (!its.it_value.tv_sec && !its.it_value.tv_nsec)
			its.it_value.tv_nsec = 1;
	}
	timerfd_settime(r->tfd, TFD_TIMER_ABSTIME, &its, NULL);
}

void kvp_remote_set_alarm(struct kvp_remote *r, int64_t at_ms)
{
	r->alarm_ms = at_ms;
	sync_timer(r); /* a system call only when the timer's time changes */
}

/* Whether the thread is to be woken now for what was queued. */
static int wake_due(const struct kvp_remote *r)
{
	return r->queued && (r->queued_urgent || r->queued_bytes >= SET_WAKE_BYTES ||
			     atomic_load(&r->dormant)); /* after the push: see th_main */
}

void kvp_remote_sync(struct kvp_remote *r)
{
	if (wake_due(r)) {
		r->queued = r->queued_urgent = 0;
		r->queued_bytes = 0;
		atomic_store(&r->dormant, 0);
		efd_write(r->wake_fd);
	}
}

int kvp_remote_pending(const struct kvp_remote *r)
{
	return wake_due(r);
}

void kvp_remote_on_ready(struct kvp_remote *r)
{
	struct q_list done;
	uint64_t ticks;

	if (r->timer_ms >= 0 && read(r->tfd, &ticks, sizeof(ticks)) == sizeof(ticks)) {
		r->timer_ms = -1; /* fired: armed again below or by the owner's next alarm */
		if (r->alarm_ms >= 0 && (int64_t)kvp_rc_now_ms() >= r->alarm_ms)
			r->alarm_ms = -1; /* the owner sets the next one */
	}
	/* Drained whatever the flag says: a write that landed after the last take must not leave
	 * the fd readable with nothing queued. */
	efd_drain(r->done_fd);
	atomic_store(&r->done_signalled, 0); /* before the take: a later push signals again */
	done = stack_take(&r->doneq);
	for (struct q_ent *e = done.head, *next; e; e = next) {
		next = e->next;
		ent_complete(r, e);
	}
	kvp_remote_sync(r); /* the queued SETs' wake-up, when that was the timer */
}

/* An entry of `bytes` data bytes for nops operations booking acct bytes, or NULL: -EAGAIN
 * (counted) past the bounds, -ENOMEM. */
static struct q_ent *ent_new(struct kvp_remote *r, enum q_kind kind, size_t bytes, uint32_t nops,
			     uint64_t acct, int *err)
{
	struct q_ent *e;

	if (r->inflight + nops > MAX_OPS || r->inflight_bytes + acct > r->conf.max_inflight_bytes) {
		r->rejected++;
		*err = -EAGAIN;
		return NULL;
	}
	e = NULL;
	if (bytes >= BIG_MIN)
		for (int i = r->nbig - 1; i >= 0 && !e; i--)
			if (r->big[i]->cap >= bytes) {
				e = r->big[i];
				r->big[i] = r->big[--r->nbig];
			}
	if (!e) {
		size_t cap = bytes >= BIG_MIN ? (bytes + 4095) & ~(size_t)4095 : bytes;

		e = malloc(sizeof(*e) + cap);
		if (!e) {
			*err = -ENOMEM;
			return NULL;
		}
		bytes = cap;
	} else {
		bytes = e->cap;
	}
	memset(e, 0, sizeof(*e));
	e->cap = bytes;
	e->r = r;
	e->kind = kind;
	e->nops = nops;
	e->acct = acct;
	return e;
}

static void ent_queue(struct kvp_remote *r, struct q_ent *e)
{
	r->inflight += e->nops;
	r->inflight_bytes += e->acct;
	stack_push_chain(&r->subq, e, e);
	r->queued = 1;
	r->queued_urgent |= e->kind != Q_SET && e->kind != Q_PAGE;
	r->queued_bytes += e->acct;
}

static int submit_kv(struct kvp_remote *r, enum q_kind kind, const void *key, size_t klen,
		     const void *hdr, size_t hlen, const void *val, size_t vlen, uint32_t ttl,
		     kvp_rc_cb *cb, void *arg)
{
	struct q_ent *e;
	int err = 0;

	if (!klen || !cb)
		return -EINVAL;
	e = ent_new(r, kind, klen + hlen + vlen, 1, klen + hlen + vlen + 64, &err);
	if (!e)
		return err;
	e->cb = cb;
	e->arg = arg;
	e->klen = klen;
	e->hlen = hlen;
	e->vlen = vlen;
	e->ttl = ttl;
	memcpy(e->data, key, klen);
	if (hlen)
		memcpy(e->data + klen, hdr, hlen);
	if (vlen)
		memcpy(e->data + klen + hlen, val, vlen);
	ent_queue(r, e);
	return 0;
}

int kvp_remote_set(struct kvp_remote *r, const void *key, size_t klen, const void *hdr, size_t hlen,
		   const void *val, size_t vlen, uint32_t ttl_s, kvp_rc_cb *cb, void *arg)
{
	return submit_kv(r, Q_SET, key, klen, hdr, hlen, val, vlen, ttl_s, cb, arg);
}

int kvp_remote_put_page(struct kvp_remote *r, const struct kvp_rv_fp *fp, const void *key,
			size_t klen, const void *page, size_t n, uint32_t ttl_s, kvp_rc_cb *cb,
			void *arg)
{
	struct q_ent *e;
	int err = 0;

	if (!klen || !cb)
		return -EINVAL;
	e = ent_new(r, Q_PAGE, klen + n, 1, klen + KVP_RV_HDR_SIZE + n + 64, &err);
	if (!e)
		return err;
	e->cb = cb;
	e->arg = arg;
	e->fp = *fp;
	e->klen = klen;
	e->vlen = n;
	e->ttl = ttl_s;
	memcpy(e->data, key, klen);
	/* the copy and its checksum in one pass */
	e->crc = kvp_crc32c_copy(e->data + klen, page, n);
	ent_queue(r, e);
	return 0;
}

int kvp_remote_get_page(struct kvp_remote *r, const struct kvp_rv_fp *fp, uint64_t page_bytes,
			const void *key, size_t klen, kvp_remote_page_cb *cb, void *arg)
{
	struct q_ent *e;
	int err = 0;

	if (!klen || !cb)
		return -EINVAL;
	e = ent_new(r, Q_GETPAGE, klen, 1, klen + 64, &err);
	if (!e)
		return err;
	e->pcb = cb;
	e->arg = arg;
	e->fp = *fp;
	e->page_bytes = page_bytes;
	e->klen = klen;
	memcpy(e->data, key, klen);
	ent_queue(r, e);
	return 0;
}

int kvp_remote_del(struct kvp_remote *r, const void *key, size_t klen, kvp_rc_cb *cb, void *arg)
{
	return submit_kv(r, Q_DEL, key, klen, NULL, 0, NULL, 0, 0, cb, arg);
}

int kvp_remote_exists_many(struct kvp_remote *r, size_t n, const void *const *keys,
			   const size_t *klens, kvp_rc_multi_cb *cb, void *arg)
{
	size_t bytes = 0, at;
	struct q_ent *e;
	int err = 0;

	if (!n || !cb || n > MAX_OPS)
		return -EINVAL;
	for (size_t i = 0; i < n; i++) {
		if (!klens[i])
			return -EINVAL;
		bytes += klens[i];
	}
	e = ent_new(r, Q_EXISTS, sizeof(size_t) * n + bytes, (uint32_t)n, bytes + 64 * n, &err);
	if (!e)
		return err;
	e->mcb = cb;
	e->arg = arg;
	e->n = n;
	memcpy(e->data, klens, sizeof(size_t) * n);
	at = sizeof(size_t) * n;
	for (size_t i = 0; i < n; i++) {
		memcpy(e->data + at, keys[i], klens[i]);
		at += klens[i];
	}
	ent_queue(r, e);
	return 0;
}
