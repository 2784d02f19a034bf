/* fdstore.c - handing pool memory to the service manager's fd store and taking it back
 * (fdstore.h). The notify protocol is written here (a datagram with SCM_RIGHTS), so it works
 * with or without libsystemd. */
#include "fdstore.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "log.h"

struct stored {
	int fd;	  /* -1 once handed out */
	int orig; /* the fd number passed */
	char name[256];
};

static struct stored g_st[KVP_FDSTORE_MAX];
static int g_n;

int kvp_fdstore_take(void)
{
	const char *fds = getenv("LISTEN_FDS"), *pid = getenv("LISTEN_PID");
	const char *names = getenv("LISTEN_FDNAMES");
	const char *tok;
	int n, taken = 0;

	if (!fds || !pid || !names || strtol(pid, NULL, 10) != getpid())
		return 0;
	n = (int)strtol(fds, NULL, 10);
	tok = names;
	for (int i = 0; i < n && tok; i++) {
		const char *colon = strchr(tok, ':');
		size_t len = colon ? (size_t)(colon - tok) : strlen(tok);

		if (len > 4 && len < sizeof(g_st[0].name) && !strncmp(tok, "kvp.", 4) &&
		    g_n < KVP_FDSTORE_MAX) {
			struct stored *s = &g_st[g_n++];

			memcpy(s->name, tok, len);
			s->name[len] = 0;
			s->fd = s->orig = 3 + i;
			fcntl(s->fd, F_SETFD, FD_CLOEXEC);
			taken++;
		}
		tok = colon ? colon + 1 : NULL;
	}
	if (taken)
		log_info("fd store: %d fds handed back by the service manager", taken);
	return taken;
}

bool kvp_fdstore_owns(int fd)
{
	for (int i = 0; i < g_n; i++)
		if (g_st[i].orig == fd)
			return true;
	return false;
}

int kvp_fdstore_get(const char *name)
{
	for (int i = 0; i < g_n; i++) {
		if (g_st[i].fd >= 0 && !strcmp(g_st[i].name, name)) {
			int fd = g_st[i].fd;

			g_st[i].fd = -1;
			return fd;
		}
	}
	return -1;
}

int kvp_fdstore_peek(const char *name)
{
	for (int i = 0; i < g_n; i++)
		if (g_st[i].fd >= 0 && !strcmp(g_st[i].name, name))
			return g_st[i].fd;
	return -1;
}

/* One datagram to $NOTIFY_SOCKET with fd (or none). */
static int notify_send(const char *msg, int fd)
{
	const char *path = getenv("NOTIFY_SOCKET");
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int))];
	} cm;
	struct iovec iov = { .iov_base = (void *)msg, .iov_len = strlen(msg) };
	struct msghdr mh = { .msg_name = &sa, .msg_iov = &iov, .msg_iovlen = 1 };
	socklen_t salen;
	size_t len;
	int s, r = 0;

	if (!path || !*path)
		return -ENOTCONN;
	len = strlen(path);
	if (len >= sizeof(sa.sun_path) || (path[0] != '/' && path[0] != '@'))
		return -EINVAL;
	memcpy(sa.sun_path, path, len);
	if (path[0] == '@')
		sa.sun_path[0] = 0;
	salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len + (path[0] == '/'));
	mh.msg_namelen = salen;
	if (fd >= 0) {
		memset(&cm, 0, sizeof(cm));
		mh.msg_control = cm.buf;
		mh.msg_controllen = sizeof(cm.buf);
		cm.h.cmsg_level = SOL_SOCKET;
		cm.h.cmsg_type = SCM_RIGHTS;
		cm.h.cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(&cm.h), &fd, sizeof(int));
	}
	s = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (s < 0)
		return -errno;
	if (sendmsg(s, &mh, MSG_NOSIGNAL) < 0)
		r = -errno;
	close(s);
	return r;
}

int kvp_fdstore_put(const char *name, int fd)
{
	char msg[320];

	snprintf(msg, sizeof(msg), "FDSTORE=1\nFDNAME=%s", name);
	return notify_send(msg, fd);
}

int kvp_fdstore_remove(const char *name)
{
	char msg[320];

	snprintf(msg, sizeof(msg), "FDSTOREREMOVE=1\nFDNAME=%s", name);
	return notify_send(msg, -1);
}

int kvp_fdstore_release_rest(void)
{
	int n = 0;

	for (int i = 0; i < g_n; i++) {
		if (g_st[i].fd < 0)
			continue;
		log_notice("fd store: '%s' belongs to no configured pool: released", g_st[i].name);
		kvp_fdstore_remove(g_st[i].name);
		close(g_st[i].fd);
		g_st[i].fd = -1;
		n++;
	}
	return n;
}

void kvp_fdstore_name(char *out, size_t cap, const char *pool, const char *what)
{
	size_t o;

	o = (size_t)snprintf(out, cap, "kvp.%s.%s", pool, what);
	if (o >= cap)
		o = cap - 1;
	for (size_t i = 0; i < o; i++) {
		unsigned char c = (unsigned char)out[i];

		if (c < 0x21 || c > 0x7e || c == ':')
			out[i] = '_';
	}
}
