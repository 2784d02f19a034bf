/* fdsup.c - the fd store and socket activation supervisor of the restart tests (fdsup.h). */
#include "fdsup.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

static int bind_unix(const char *path, int type)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);

	if (fd < 0)
		return -errno;
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    (type == SOCK_STREAM && listen(fd, 128) < 0)) {
		int e = -errno;

		close(fd);
		return e;
	}
	return fd;
}

int h_fdsup_init(struct h_fdsup *s)
{
	memset(s, 0, sizeof(*s));
	s->nfd = s->lfd = -1;
	snprintf(s->dir, sizeof(s->dir), "/tmp/kvpool-test-fdsup-XXXXXX");
	if (!mkdtemp(s->dir))
		return -errno;
	snprintf(s->sock, sizeof(s->sock), "%s/s.sock", s->dir);
	snprintf(s->notify, sizeof(s->notify), "%s/notify", s->dir);
	snprintf(s->cfg, sizeof(s->cfg), "%s/kvpoold.conf", s->dir);
	snprintf(s->log, sizeof(s->log), "%s/log", s->dir);
	s->nfd = bind_unix(s->notify, SOCK_DGRAM);
	s->lfd = bind_unix(s->sock, SOCK_STREAM);
	return s->nfd < 0 ? s->nfd : s->lfd < 0 ? s->lfd : 0;
}

int h_fdsup_config(struct h_fdsup *s, const char *text)
{
	return h_write_file(s->cfg, text);
}

static void drop_name(struct h_fdsup *s, const char *name)
{
	for (int i = 0; i < s->n; i++)
		if (s->st[i].fd >= 0 && !strcmp(s->st[i].name, name)) {
			close(s->st[i].fd);
			s->st[i].fd = -1;
		}
}

static void keep(struct h_fdsup *s, int fd, const char *name)
{
	struct stat a, b;

	if (fstat(fd, &a) < 0) {
		close(fd);
		return;
	}
	for (int i = 0; i < s->n; i++)
		if (s->st[i].fd >= 0 && fstat(s->st[i].fd, &b) == 0 && a.st_ino == b.st_ino &&
		    a.st_dev == b.st_dev) {
			close(fd); /* the same file again: kept once */
			return;
		}
	for (int i = 0; i < s->n; i++) /* a free slot first */
		if (s->st[i].fd < 0) {
			s->st[i].fd = fd;
			snprintf(s->st[i].name, sizeof(s->st[i].name), "%s", name);
			return;
		}
	if (s->n == H_FDSUP_MAX) {
		close(fd);
		return;
	}
	s->st[s->n].fd = fd;
	snprintf(s->st[s->n].name, sizeof(s->st[s->n].name), "%s", name);
	s->n++;
}

void h_fdsup_drain(struct h_fdsup *s)
{
	for (;;) {
		char buf[512];
		union {
			struct cmsghdr h;
			char b[CMSG_SPACE(sizeof(int) * 8)];
		} cm;
		struct iovec iov = { buf, sizeof(buf) - 1 };
		struct msghdr mh = { .msg_iov = &iov,
				     .msg_iovlen = 1,
				     .msg_control = cm.b,
				     .msg_controllen = sizeof(cm.b) };
		int fds[8], nfds = 0;
		ssize_t k = recvmsg(s->nfd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
		char *nm;

		if (k < 0)
			return;
		buf[k] = 0;
		for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
			if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
				int n = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));

				for (int i = 0; i < n && nfds < 8; i++)
					memcpy(&fds[nfds++], CMSG_DATA(c) + i * sizeof(int),
					       sizeof(int));
			}
		nm = strstr(buf, "FDNAME=");
		if (nm) {
			nm += 7;
			nm[strcspn(nm, "\n")] = 0;
		}
		if (nm && strstr(buf, "FDSTOREREMOVE=1"))
			drop_name(s, nm);
		for (int i = 0; i < nfds; i++) {
			if (strstr(buf, "FDSTORE=1") && nm)
				keep(s, fds[i], nm);
			else
				close(fds[i]);
		}
	}
}

int h_fdsup_log_count(const struct h_fdsup *s, const char *str)
{
	FILE *f = fopen(s->log, "r");
	char line[1024];
	int n = 0;

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		n += strstr(line, str) != NULL;
	fclose(f);
	return n;
}

int h_fdsup_fd(const struct h_fdsup *s, const char *name_part)
{
	for (int i = 0; i < s->n; i++)
		if (s->st[i].fd >= 0 && strstr(s->st[i].name, name_part))
			return s->st[i].fd;
	return -1;
}

pid_t h_fdsup_start(struct h_fdsup *s)
{
	uint64_t end;
	pid_t pid, parent;

	h_fdsup_drain(s);
	parent = getpid();
	pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		char names[2048] = "kvpoold.socket", num[16];
		int n = 1, lo = 100, lf;

		/* dies with its test: a test killed at its timeout leaves no daemon behind */
		if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != parent)
			_exit(126);

		/* out of the way first (the targets may be taken), then 3, 4, ... */
		dup2(s->lfd, lo);
		for (int i = 0; i < s->n; i++)
			if (s->st[i].fd >= 0 && !s->no_store)
				dup2(s->st[i].fd, lo + 1 + i);
		dup2(lo, 3);
		for (int i = 0; i < s->n; i++) {
			if (s->st[i].fd < 0 || s->no_store)
				continue;
			dup2(lo + 1 + i, 3 + n);
			strcat(names, ":");
			strcat(names, s->st[i].name);
			n++;
		}
		for (int fd = lo; fd <= lo + H_FDSUP_MAX; fd++)
			close(fd);
		snprintf(num, sizeof(num), "%d", n);
		setenv("LISTEN_FDS", num, 1);
		setenv("LISTEN_FDNAMES", names, 1);
		snprintf(num, sizeof(num), "%d", (int)getpid());
		setenv("LISTEN_PID", num, 1);
		setenv("NOTIFY_SOCKET", s->notify, 1);
		lf = open(s->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
		if (lf >= 0) { /* not the caller's stdout: a pipe read to its end waits on it */
			dup2(lf, 1);
			dup2(lf, 2);
		}
		execl(h_kvpoold(), "kvpoold", "--config", s->cfg, "--socket", s->sock,
		      (char *)NULL);
		_exit(127);
	}
	s->starts++;
	end = h_now_ms() + (uint64_t)(s->start_ms > 0 ? s->start_ms : 10000);
	while (h_fdsup_log_count(s, "kvpoold ready") < s->starts) {
		int st;

		if (waitpid(pid, &st, WNOHANG) == pid)
			return -1;
		if (h_now_ms() >= end) {
			kill(pid, SIGKILL);
			waitpid(pid, &st, 0);
			return -1;
		}
		usleep(2000);
	}
	return pid;
}

int h_fdsup_stop(struct h_fdsup *s, pid_t pid, int sig)
{
	int st;

	if (pid <= 0)
		return -1;
	kill(pid, sig);
	if (waitpid(pid, &st, 0) != pid)
		return -1;
	h_fdsup_drain(s);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

void h_fdsup_fini(struct h_fdsup *s)
{
	for (int i = 0; i < s->n; i++)
		if (s->st[i].fd >= 0)
			close(s->st[i].fd);
	if (s->nfd >= 0)
		close(s->nfd);
	if (s->lfd >= 0)
		close(s->lfd);
	if (getenv("KVP_KEEP"))
		fprintf(stderr, "kept %s\n", s->dir);
	else
		h_dir_remove(s->dir);
}
