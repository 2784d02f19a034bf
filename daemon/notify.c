/* notify.c - sd_notify(3) and sd_listen_fds(3) equivalents. */
#include "notify.h"

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "kvp_config.h"
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

int kvp_activation_fd(void)
{
	const char *fds = getenv("LISTEN_FDS"), *pid = getenv("LISTEN_PID");
	int fd = 3;

	if (!fds || !pid || strtol(pid, NULL, 10) != getpid() || strtol(fds, NULL, 10) < 1)
		return -1;
	/* One socket is ours (kvpoold.socket has one ListenStream); extra ones are closed. */
	for (int i = 1; i < atoi(fds); i++)
		close(3 + i);
	fcntl(fd, F_SETFD, FD_CLOEXEC);
	unsetenv("LISTEN_FDS");
	unsetenv("LISTEN_PID");
	unsetenv("LISTEN_FDNAMES");
	return fd;
}
