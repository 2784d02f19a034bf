/* notify.c - sd_notify(3) and sd_listen_fds(3) equivalents. */
#include "notify.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "kvp_config.h"
#include "log.h"
#include "fdstore.h"
#if KVP_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

int kvp_notify(const char *state)
{
#if KVP_HAVE_SYSTEMD
	int r = sd_notify(0, state);

	return r < 0 ? r : 0;
#else
	const char *path = getenv("NOTIFY_SOCKET");
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	socklen_t len;
	int fd, r = 0;

	if (!path || !path[0])
		return 0;
	if (strlen(path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	strcpy(sa.sun_path, path);
	if (sa.sun_path[0] == '@')
		sa.sun_path[0] = 0;
	len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen(path));
	fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (sendto(fd, state, strlen(state), MSG_NOSIGNAL, (struct sockaddr *)&sa, len) < 0)
		r = -errno;
	close(fd);
	return r;
#endif
}

uint64_t kvp_watchdog_ms(void)
{
	const char *usec = getenv("WATCHDOG_USEC"), *pid = getenv("WATCHDOG_PID");

	if (!usec)
		return 0;
	if (pid && strtol(pid, NULL, 10) != getpid())
		return 0;
	return strtoull(usec, NULL, 10) / 1000;
}

/* Whether fd is a listening unix stream socket: the only kind kvpoold serves. */
static bool is_unix_listener(int fd, const char **why)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof(int), alen = sizeof(ss);
	int type = 0, acc = 0;

	if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) < 0) {
		*why = errno == ENOTSOCK ? "not a socket" : "not a usable fd";
		return false;
	}
	len = sizeof(int);
	if (type != SOCK_STREAM) {
		*why = "not a stream socket";
		return false;
	}
	if (getsockname(fd, (struct sockaddr *)&ss, &alen) < 0 || ss.ss_family != AF_UNIX) {
		*why = "not a unix socket";
		return false;
	}
	if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &len) < 0 || !acc) {
		*why = "not listening";
		return false;
	}
	return true;
}

static bool control_name(const char *name)
{
	return strcmp(name, "kvpoold.sock") == 0 || strcmp(name, "kvpoold") == 0 ||
	       strcmp(name, "kvpoold.socket") == 0;
}

/* Every listener socket activation passed, kept with its name (kvp_activation_fds). */
static struct kvp_activation g_act[KVP_ACTIVATION_MAX];
static int g_act_n, g_act_control = -1;

int kvp_activation_fds(const struct kvp_activation **fds)
{
	*fds = g_act;
	return g_act_n;
}

int kvp_activation_find(const char *name)
{
	for (int i = 0; i < g_act_n; i++)
		if (strcmp(g_act[i].name, name) == 0)
			return g_act[i].fd;
	return -1;
}

void kvp_activation_close(void)
{
	for (int i = 0; i < g_act_n; i++)
		if (g_act[i].fd != g_act_control)
			close(g_act[i].fd);
	g_act_n = 0;
	g_act_control = -1;
}

int kvp_activation_fd(void)
{
	const char *fds = getenv("LISTEN_FDS"), *pid = getenv("LISTEN_PID");
	const char *names = getenv("LISTEN_FDNAMES");
	char namebuf[1024], *tok;
	char fdname[KVP_ACTIVATION_MAX][64];
	int n, chosen = -1, first_ok = -1, stored = 0;

	if (!fds || !pid || strtol(pid, NULL, 10) != getpid() || strtol(fds, NULL, 10) < 1)
		return -1;
	n = (int)strtol(fds, NULL, 10);
	if (n > KVP_ACTIVATION_MAX) {
		log_warn("socket activation: %d fds passed, only the first %d are looked at", n,
			 KVP_ACTIVATION_MAX);
		for (int i = KVP_ACTIVATION_MAX; i < n; i++)
			close(3 + i);
		n = KVP_ACTIVATION_MAX;
	}
	/* LISTEN_FDNAMES: colon-separated, one name per fd, in order. */
	memset(fdname, 0, sizeof(fdname));
	snprintf(namebuf, sizeof(namebuf), "%s", names ? names : "");
	tok = namebuf;
	for (int i = 0; names && i < n; i++) {
		char *colon = strchr(tok, ':');

		if (colon)
			*colon = 0;
		snprintf(fdname[i], sizeof(fdname[i]), "%.63s", tok);
		if (!colon)
			break;
		tok = colon + 1;
	}
	for (int i = 0; i < n; i++) {
		const char *why = NULL;
		int fd = 3 + i;

		if (kvp_fdstore_owns(fd)) { /* pool memory handed back: fdstore.c holds it */
			stored++;
			continue;
		}
		fcntl(fd, F_SETFD, FD_CLOEXEC);
		if (!is_unix_listener(fd, &why)) {
			log_warn("socket activation: fd %d ('%s') is %s: closed", fd,
				 fdname[i][0] ? fdname[i] : "unnamed", why);
			close(fd);
			continue;
		}
		if (first_ok < 0)
			first_ok = fd;
		if (chosen < 0 && names && control_name(fdname[i]))
			chosen = fd;
		g_act[g_act_n].fd = fd;
		memcpy(g_act[g_act_n].name, fdname[i], sizeof(g_act[g_act_n].name));
		g_act_n++;
	}
	/* Without names (or with none ours) the first unix listener is the control socket. */
	if (chosen < 0)
		chosen = first_ok;
	g_act_control = chosen;
	/* The other listeners stay open under their names for the features that serve them;
	 * kvp_activation_close closes them at exit. */
	for (int i = 0; i < g_act_n; i++)
		if (g_act[i].fd != chosen)
			log_info("socket activation: fd %d ('%s') kept (not the control socket)",
				 g_act[i].fd, g_act[i].name[0] ? g_act[i].name : "unnamed");
	if (chosen >= 0)
		log_info("socket activation: serving fd %d ('%s')", chosen,
			 fdname[chosen - 3][0] ? fdname[chosen - 3] : "unnamed");
	else if (n > stored)
		log_err("socket activation: none of the %d fds passed is a listening unix socket",
			n - stored);
	unsetenv("LISTEN_FDS");
	unsetenv("LISTEN_PID");
	unsetenv("LISTEN_FDNAMES");
	return chosen;
}
