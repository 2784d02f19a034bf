/* metrics_http.c - GET /metrics over HTTP through libmicrohttpd, held to an access rule: TCP
 * peers only from metrics_allow (loopback when none is given), and a loopback peer only when its
 * uid may use kvpoold's socket (the uid owning the peer's socket, from /proc/net/tcp: root,
 * or allowed_users / allowed_groups when given, and the socket's mode and its folder's); a unix
 * socket (metrics_listen = unix:PATH) only for root, kvpoold's uid and admin_groups (the
 * endpoint shows every pool); at most metrics_peer_connections connections of one peer
 * (address, or uid), each closed after metrics_idle_s idle. */
#include "metrics_http.h"

#include <stdlib.h>

#include "kvp_config.h"
#include "log.h"

#if KVP_HAVE_MHD
#include <arpa/inet.h>
#include <errno.h>
#include <grp.h>
#include <libgen.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define CONN_MAX 128 /* connections in all */
#define UIDS_MAX 64  /* unix peers counted apart; past it they share one count */

struct peer_count {
	uid_t uid;
	uint32_t n;
};

struct kvp_metrics_http {
	struct MHD_Daemon *mhd;
	pthread_mutex_t lock;
	char *text;
	/* the access rule: the loop's copy of the config, refreshed at each publish */
	struct kvp_net allow[KVP_METRICS_ALLOW_MAX];
	uint32_t n_allow;
	gid_t admin_gids[KVP_MAX_IDS];
	uint32_t n_admin_gids;
	uint32_t per_peer;
	uid_t self;
	/* kvpoold's own socket and its users rule, which loopback TCP peers are held to */
	char sock[KVP_SOCKET_PATH_MAX];
	uint32_t allowed_uids[KVP_MAX_IDS], n_allowed_uids;
	uint32_t allowed_gids[KVP_MAX_IDS], n_allowed_gids;
	int unix_fd; /* the unix endpoint's socket; -1: TCP */
	char unix_path[KVP_LISTEN_MAX];
	struct peer_count uids[UIDS_MAX + 1]; /* open connections of each unix peer's uid */
	uint32_t n_uids;
};

/* libmicrohttpd's messages (a connection refused past a limit, ...): one line per 5 s at most,
 * with a count of the rest, so that a peer opening connections cannot flood the log. Called on
 * the endpoint's one thread (and at its start). */
static void mhd_log(void *cls, const char *fmt, va_list ap)
{
	static struct kvp_log_limit limit = { .interval_ms = 5000 };
	struct timespec ts;
	char line[256];
	size_t n;

	(void)cls;
	vsnprintf(line, sizeof(line), fmt, ap);
	n = strlen(line);
	while (n && (line[n - 1] == '\n' || line[n - 1] == '\r'))
		line[--n] = '\0';
	clock_gettime(CLOCK_MONOTONIC, &ts);
	kvp_log_limited(&limit, (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000 + 1,
			LOG_WARNING, "metrics endpoint: %s", line);
}

/* What MHD keeps per connection (its socket context): the uid counted, or refused. */
struct conn_ctx {
	int refused;
	int counted;
	uid_t uid;
};

static bool net_has(const struct kvp_net *n, const uint8_t *a, int v6)
{
	uint32_t full = n->bits / 8, rest = n->bits % 8;

	if (n->v6 != v6 || memcmp(n->addr, a, full))
		return false;
	return !rest || ((n->addr[full] ^ a[full]) & (uint8_t)(0xff << (8 - rest))) == 0;
}

/* Whether a TCP peer's address is allowed: metrics_allow, or loopback when none is given. */
static bool addr_allowed(struct kvp_metrics_http *m, const struct sockaddr *sa)
{
	static const struct kvp_net loop4 = { { 127 }, 8, 0 };
	static const struct kvp_net loop6 = { { [15] = 1 }, 128, 1 };
	uint8_t a[16] = { 0 };
	bool ok = false;
	int v6;

	if (sa->sa_family == AF_INET) {
		memcpy(a, &((const struct sockaddr_in *)sa)->sin_addr, 4);
		v6 = 0;
	} else if (sa->sa_family == AF_INET6) {
		const uint8_t *b = ((const struct sockaddr_in6 *)sa)->sin6_addr.s6_addr;
		static const uint8_t mapped[12] = { [10] = 0xff, [11] = 0xff };

		v6 = memcmp(b, mapped, 12) != 0; /* ::ffff:a.b.c.d is an IPv4 peer */
		memcpy(a, v6 ? b : b + 12, v6 ? 16 : 4);
	} else {
		return sa->sa_family == AF_UNIX; /* held to the uid rule once connected */
	}
	pthread_mutex_lock(&m->lock);
	if (!m->n_allow)
		ok = net_has(&loop4, a, v6) || net_has(&loop6, a, v6);
	for (uint32_t i = 0; i < m->n_allow && !ok; i++)
		ok = net_has(&m->allow[i], a, v6);
	pthread_mutex_unlock(&m->lock);
	return ok;
}

static enum MHD_Result accept_policy(void *cls, const struct sockaddr *addr, socklen_t addrlen)
{
	(void)addrlen;
	return addr && addr_allowed(cls, addr) ? MHD_YES : MHD_NO;
}

/* Whether a unix peer (uid, gid, groups) may read every pool's figures: root, kvpoold's uid,
 * members of admin_groups. Called with m->lock held. */
static bool uid_allowed(const struct kvp_metrics_http *m, uid_t uid, gid_t gid, const gid_t *g,
			int ng)
{
	if (uid == 0 || uid == m->self)
		return true;
	for (uint32_t i = 0; i < m->n_admin_gids; i++) {
		if (m->admin_gids[i] == gid)
			return true;
		for (int j = 0; j < ng; j++)
			if (g[j] == m->admin_gids[i])
				return true;
	}
	return false;
}

static struct peer_count *uid_slot(struct kvp_metrics_http *m, uid_t uid)
{
	for (uint32_t i = 0; i < m->n_uids; i++)
		if (m->uids[i].uid == uid)
			return &m->uids[i];
	if (m->n_uids < UIDS_MAX) {
		m->uids[m->n_uids] = (struct peer_count){ uid, 0 };
		return &m->uids[m->n_uids++];
	}
	return &m->uids[UIDS_MAX]; /* the rest share one */
}

/* A unix peer as its connection starts: refused (the rule, or its uid's connections past
 * metrics_peer_connections) or counted. */
static void unix_peer_start(struct kvp_metrics_http *m, int fd, struct conn_ctx *c)
{
	struct ucred cr;
	socklen_t len = sizeof(cr);
	gid_t g[KVP_MAX_IDS * 4];
	socklen_t glen = sizeof(g);
	int ng = 0;
	struct peer_count *pc;

	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0) {
		c->refused = 1;
		return;
	}
	if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, g, &glen) == 0)
		ng = (int)(glen / sizeof(g[0]));
	pthread_mutex_lock(&m->lock);
	if (!uid_allowed(m, cr.uid, cr.gid, g, ng)) {
		c->refused = 1;
	} else if ((pc = uid_slot(m, cr.uid))->n >= m->per_peer) {
		c->refused = 1;
	} else {
		pc->n++;
		c->counted = 1;
		c->uid = cr.uid;
	}
	pthread_mutex_unlock(&m->lock);
}

/* Whether sa is a loopback address (127/8, ::1, ::ffff:127/104). */
static bool loopback(const struct sockaddr *sa)
{
	if (sa->sa_family == AF_INET)
		return ((const uint8_t *)&((const struct sockaddr_in *)sa)->sin_addr)[0] == 127;
	if (sa->sa_family == AF_INET6) {
		const uint8_t *b = ((const struct sockaddr_in6 *)sa)->sin6_addr.s6_addr;
		static const uint8_t one[16] = { [15] = 1 },
				     mapped[12] = { [10] = 0xff, [11] = 0xff };

		return !memcmp(b, one, 16) || (!memcmp(b, mapped, 12) && b[12] == 127);
	}
	return false;
}

/* The uid owning the TCP socket at address peer connected to self: a loopback peer's socket is
 * this host's, listed in /proc/net/tcp (tcp6) with its owner. -1 when it is not found. The
 * kernel prints each 32-bit word of an address as a native-endian hex number, ports as host
 * numbers. */
static int64_t tcp_peer_uid(const struct sockaddr_storage *peer,
			    const struct sockaddr_storage *self)
{
	bool v6 = peer->ss_family == AF_INET6;
	uint32_t pa[4] = { 0 }, sa[4] = { 0 };
	unsigned pp, sp;
	char line[512];
	int64_t uid = -1;
	FILE *f;

	if (v6) {
		const struct sockaddr_in6 *p6 = (const void *)peer, *s6 = (const void *)self;

		memcpy(pa, &p6->sin6_addr, 16);
		memcpy(sa, &s6->sin6_addr, 16);
		pp = ntohs(p6->sin6_port);
		sp = ntohs(s6->sin6_port);
	} else {
		const struct sockaddr_in *p4 = (const void *)peer, *s4 = (const void *)self;

		memcpy(pa, &p4->sin_addr, 4);
		memcpy(sa, &s4->sin_addr, 4);
		pp = ntohs(p4->sin_port);
		sp = ntohs(s4->sin_port);
	}
	if (!(f = fopen(v6 ? "/proc/net/tcp6" : "/proc/net/tcp", "re")))
		return -1;
	while (uid < 0 && fgets(line, sizeof(line), f)) {
		unsigned la[4] = { 0 }, ra[4] = { 0 }, lp, rp;
		unsigned long u;
		int n = v6 ? sscanf(line,
				    " %*u: %8X%8X%8X%8X:%X %8X%8X%8X%8X:%X %*X %*X:%*X %*X:%*X "
				    "%*X %lu",
				    &la[0], &la[1], &la[2], &la[3], &lp, &ra[0], &ra[1], &ra[2],
				    &ra[3], &rp, &u)
			   : sscanf(line, " %*u: %X:%X %X:%X %*X %*X:%*X %*X:%*X %*X %lu", &la[0],
				    &lp, &ra[0], &rp, &u);

		if (n != (v6 ? 11 : 5) || lp != pp || rp != sp)
			continue;
		if (!memcmp(la, pa, sizeof(la)) && !memcmp(ra, sa, sizeof(ra)))
			uid = (int64_t)u;
	}
	fclose(f);
	return uid;
}

/* Whether uid, with its groups, has the access bits of st (owner, group or other). */
static bool mode_lets(const struct stat *st, uid_t uid, const gid_t *g, int ng, mode_t u, mode_t gr,
		      mode_t o)
{
	if (uid == st->st_uid)
		return st->st_mode & u;
	for (int i = 0; i < ng; i++)
		if (g[i] == st->st_gid)
			return st->st_mode & gr;
	return st->st_mode & o;
}

static bool in_ids(uint32_t id, const uint32_t *list, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		if (list[i] == id)
			return true;
	return false;
}

/* Whether uid may use kvpoold's socket: root; otherwise allowed_users / allowed_groups when
 * given, and write access to the socket and search access to its folder by their modes. */
static bool may_use_socket(struct kvp_metrics_http *m, uid_t uid)
{
	char sock[KVP_SOCKET_PATH_MAX], dir[KVP_SOCKET_PATH_MAX], buf[4096];
	struct passwd pw, *pwp = NULL;
	gid_t g[256];
	int ng = 0;
	struct stat st, dt;
	bool ok;

	if (uid == 0)
		return true;
	if (getpwuid_r(uid, &pw, buf, sizeof(buf), &pwp) == 0 && pwp) {
		ng = (int)(sizeof(g) / sizeof(g[0]));
		if (getgrouplist(pwp->pw_name, pwp->pw_gid, g, &ng) < 0)
			ng = (int)(sizeof(g) / sizeof(g[0]));
	}
	pthread_mutex_lock(&m->lock);
	memcpy(sock, m->sock, sizeof(sock));
	ok = !m->n_allowed_uids && !m->n_allowed_gids;
	ok = ok || in_ids(uid, m->allowed_uids, m->n_allowed_uids);
	for (int i = 0; i < ng && !ok; i++)
		ok = in_ids(g[i], m->allowed_gids, m->n_allowed_gids);
	pthread_mutex_unlock(&m->lock);
	if (!ok || !sock[0])
		return false;
	memcpy(dir, sock, sizeof(dir));
	if (stat(sock, &st) < 0 || stat(dirname(dir), &dt) < 0)
		return false;
	return mode_lets(&st, uid, g, ng, S_IWUSR, S_IWGRP, S_IWOTH) &&
	       mode_lets(&dt, uid, g, ng, S_IXUSR, S_IXGRP, S_IXOTH);
}

/* A loopback TCP peer as its connection starts: refused unless the uid owning its socket may
 * use kvpoold's socket (a uid refused there gets no figures here either). */
static void loopback_peer_start(struct kvp_metrics_http *m, struct MHD_Connection *conn, int fd,
				struct conn_ctx *c)
{
	const union MHD_ConnectionInfo *ai =
		MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
	struct sockaddr_storage peer = { 0 }, self = { 0 };
	socklen_t len = sizeof(self);
	int64_t uid;

	if (!ai || !ai->client_addr || !loopback(ai->client_addr))
		return; /* an address metrics_allow lets in: no uid to hold it to */
	memcpy(&peer, ai->client_addr,
	       ai->client_addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
						      : sizeof(struct sockaddr_in));
	if (getsockname(fd, (struct sockaddr *)&self, &len) < 0 ||
	    self.ss_family != peer.ss_family || (uid = tcp_peer_uid(&peer, &self)) < 0 ||
	    !may_use_socket(m, (uid_t)uid))
		c->refused = 1;
}

static void notify(void *cls, struct MHD_Connection *conn, void **socket_context,
		   enum MHD_ConnectionNotificationCode toe)
{
	struct kvp_metrics_http *m = cls;
	struct conn_ctx *c = *socket_context;

	if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
		const union MHD_ConnectionInfo *ci =
			MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);

		c = calloc(1, sizeof(*c));
		*socket_context = c;
		if (!c || !ci) {
			if (ci)
				shutdown(ci->connect_fd, SHUT_RDWR);
			return;
		}
		if (m->unix_fd >= 0)
			unix_peer_start(m, ci->connect_fd, c);
		else
			loopback_peer_start(m, conn, ci->connect_fd, c);
		if (c->refused) /* nothing is read from it: closed at once */
			shutdown(ci->connect_fd, SHUT_RDWR);
		return;
	}
	if (!c)
		return;
	if (c->counted) {
		pthread_mutex_lock(&m->lock);
		uid_slot(m, c->uid)->n--;
		pthread_mutex_unlock(&m->lock);
	}
	free(c);
	*socket_context = NULL;
}

static enum MHD_Result serve(void *cls, struct MHD_Connection *conn, const char *url,
			     const char *method, const char *version, const char *upload,
			     size_t *upload_size, void **state)
{
	struct kvp_metrics_http *m = cls;
	const union MHD_ConnectionInfo *ci =
		MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
	const struct conn_ctx *c = ci ? ci->socket_context : NULL;
	struct MHD_Response *resp;
	enum MHD_Result r;
	unsigned status = MHD_HTTP_OK;
	char *body;

	(void)version;
	(void)upload;
	(void)upload_size;
	(void)state;
	if (!c || c->refused) {
		body = strdup("kvpoold: not for this peer\n");
		status = MHD_HTTP_FORBIDDEN;
	} else if (strcmp(method, "GET") != 0) {
		body = strdup("only GET\n");
		status = MHD_HTTP_METHOD_NOT_ALLOWED;
	} else if (strcmp(url, "/metrics") != 0) {
		body = strdup("kvpoold: metrics are at /metrics\n");
		status = MHD_HTTP_NOT_FOUND;
	} else {
		pthread_mutex_lock(&m->lock);
		body = strdup(m->text ? m->text : "");
		pthread_mutex_unlock(&m->lock);
	}
	if (!body)
		return MHD_NO;
	resp = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
	if (!resp) {
		free(body);
		return MHD_NO;
	}
	MHD_add_response_header(resp, "Content-Type", "text/plain; version=0.0.4; charset=utf-8");
	r = MHD_queue_response(conn, status, resp);
	MHD_destroy_response(resp);
	return r;
}

/* The rule's fields of conf into m (under m->lock). */
static void rule_copy(struct kvp_metrics_http *m, const struct kvp_conf *conf)
{
	memcpy(m->allow, conf->metrics_allow, sizeof(m->allow));
	m->n_allow = conf->n_metrics_allow;
	for (uint32_t i = 0; i < conf->n_admin_gids && i < KVP_MAX_IDS; i++)
		m->admin_gids[i] = conf->admin_gids[i];
	m->n_admin_gids = conf->n_admin_gids;
	m->per_peer = conf->metrics_peer_connections ? conf->metrics_peer_connections : 4;
	memcpy(m->allowed_uids, conf->allowed_uids, sizeof(m->allowed_uids));
	m->n_allowed_uids = conf->n_allowed_uids;
	memcpy(m->allowed_gids, conf->allowed_gids, sizeof(m->allowed_gids));
	m->n_allowed_gids = conf->n_allowed_gids;
}

/* The address of "host:port" / "[v6]:port" into ss. 0 or -1. */
static int parse_tcp(const char *listen, struct sockaddr_storage *ss)
{
	const char *colon = strrchr(listen, ':');
	char host[KVP_LISTEN_MAX];
	size_t hl = colon ? (size_t)(colon - listen) : 0;
	long port = colon ? strtol(colon + 1, NULL, 10) : 0;

	if (!colon || hl >= sizeof(host) || port <= 0 || port > 65535)
		return -1;
	memcpy(host, listen, hl);
	host[hl] = 0;
	memset(ss, 0, sizeof(*ss));
	if (host[0] == '[' && hl > 2 && host[hl - 1] == ']') {
		struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;

		host[hl - 1] = 0;
		s6->sin6_family = AF_INET6;
		s6->sin6_port = htons((uint16_t)port);
		return inet_pton(AF_INET6, host + 1, &s6->sin6_addr) == 1 ? 0 : -1;
	} else {
		struct sockaddr_in *s4 = (struct sockaddr_in *)ss;

		s4->sin_family = AF_INET;
		s4->sin_port = htons((uint16_t)port);
		return inet_pton(AF_INET, host, &s4->sin_addr) == 1 ? 0 : -1;
	}
}

/* The unix endpoint's listening socket at path (a stale socket file replaced). -1 logged. */
static int unix_listen(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct stat st;
	int fd;

	if (strlen(path) >= sizeof(sa.sun_path)) {
		log_err("metrics_listen unix:%s: path too long for a unix socket", path);
		return -1;
	}
	memcpy(sa.sun_path, path, strlen(path));
	if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode))
		unlink(path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	/* everyone may connect; the peer's uid decides (unix_peer_start) */
	if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || chmod(path, 0666) < 0 ||
	    listen(fd, 64) < 0) {
		log_err("metrics_listen unix:%s: %s", path, strerror(errno));
		if (fd >= 0)
			close(fd);
		return -1;
	}
	return fd;
}

struct kvp_metrics_http *kvp_metrics_http_start(const struct kvp_conf *conf, const char *sock)
{
	const char *listen = conf->metrics_listen;
	unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
	struct sockaddr_storage ss;
	struct kvp_metrics_http *m;

	m = calloc(1, sizeof(*m));
	if (!m)
		return NULL;
	m->unix_fd = -1;
	m->self = geteuid();
	snprintf(m->sock, sizeof(m->sock), "%s", sock ? sock : "");
	rule_copy(m, conf);
	if (strncmp(listen, "unix:", 5) == 0) {
		snprintf(m->unix_path, sizeof(m->unix_path), "%s", listen + 5);
		if ((m->unix_fd = unix_listen(m->unix_path)) < 0) {
			free(m);
			return NULL;
		}
	} else if (parse_tcp(listen, &ss) < 0) {
		log_err("metrics_listen '%s': expected HOST:PORT (IPv4, or [IPv6]:PORT) or "
			"unix:PATH",
			listen);
		free(m);
		return NULL;
	} else if (ss.ss_family == AF_INET6) {
		flags |= MHD_USE_IPv6;
	}
	pthread_mutex_init(&m->lock, NULL);
	m->mhd =
		m->unix_fd >= 0
			? MHD_start_daemon(flags, 0, accept_policy, m, serve, m,
					   MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
					   MHD_OPTION_LISTEN_SOCKET, m->unix_fd,
					   MHD_OPTION_CONNECTION_LIMIT, CONN_MAX,
					   MHD_OPTION_CONNECTION_TIMEOUT, conf->metrics_idle_s,
					   MHD_OPTION_NOTIFY_CONNECTION, notify, m, MHD_OPTION_END)
			: MHD_start_daemon(flags, 0, accept_policy, m, serve, m,
					   MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
					   MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
					   MHD_OPTION_CONNECTION_LIMIT, CONN_MAX,
					   MHD_OPTION_PER_IP_CONNECTION_LIMIT, m->per_peer,
					   MHD_OPTION_CONNECTION_TIMEOUT, conf->metrics_idle_s,
					   MHD_OPTION_NOTIFY_CONNECTION, notify, m, MHD_OPTION_END);
	if (!m->mhd) {
		log_err("metrics_listen %s: cannot serve HTTP there (port taken?)", listen);
		if (m->unix_fd >= 0) {
			close(m->unix_fd);
			unlink(m->unix_path);
		}
		pthread_mutex_destroy(&m->lock);
		free(m);
		return NULL;
	}
	if (m->unix_fd >= 0)
		log_info("metrics served at %s (root, kvpoold's user and admin_groups)", listen);
	else
		log_info("metrics served at http://%s/metrics (peers: %s)", listen,
			 m->n_allow ? "metrics_allow" : "loopback");
	return m;
}

void kvp_metrics_http_publish(struct kvp_metrics_http *m, const char *text,
			      const struct kvp_conf *conf)
{
	char *copy = strdup(text), *old;

	if (!copy)
		return;
	pthread_mutex_lock(&m->lock);
	old = m->text;
	m->text = copy;
	rule_copy(m, conf); /* a reload's admin_groups and metrics_allow apply at once */
	pthread_mutex_unlock(&m->lock);
	free(old);
}

void kvp_metrics_http_stop(struct kvp_metrics_http *m)
{
	if (!m)
		return;
	MHD_stop_daemon(m->mhd);
	if (m->unix_fd >= 0) {
		close(m->unix_fd);
		unlink(m->unix_path);
	}
	pthread_mutex_destroy(&m->lock);
	free(m->text);
	free(m);
}

#else

struct kvp_metrics_http *kvp_metrics_http_start(const struct kvp_conf *conf, const char *sock)
{
	(void)sock;
	log_err("metrics_listen %s: this kvpoold was built without libmicrohttpd",
		conf->metrics_listen);
	return NULL;
}

void kvp_metrics_http_publish(struct kvp_metrics_http *m, const char *text,
			      const struct kvp_conf *conf)
{
	(void)m;
	(void)text;
	(void)conf;
}

void kvp_metrics_http_stop(struct kvp_metrics_http *m)
{
	(void)m;
}

#endif
