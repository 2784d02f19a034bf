/* fdsup.h - a test supervisor that plays systemd's fd store and socket activation for kvpoold:
 * it owns the NOTIFY_SOCKET (a datagram socket) and keeps the fds sent with FDSTORE=1 and
 * FDNAME= (once per file, as systemd drops duplicates; FDSTOREREMOVE=1 drops a name), owns the
 * listening control socket, and starts each kvpoold with the activation socket first and the
 * stored fds after it in LISTEN_FDS / LISTEN_FDNAMES / LISTEN_PID (sd_listen_fds_with_names). */
#pragma once
#include <stdbool.h>
#include <sys/types.h>

#define H_FDSUP_MAX 16

struct h_fdsup {
	char dir[64], sock[100], notify[100], cfg[100], log[100];
	int nfd, lfd; /* the notify socket, the activation socket */
	struct {
		int fd;
		char name[128];
	} st[H_FDSUP_MAX];
	int n, starts;
	bool no_store; /* start kvpoold without the stored fds (a restart that loses them) */
	int start_ms;  /* how long h_fdsup_start waits for "kvpoold ready" (0: 10 s) */
};

/* A temporary folder with the two sockets. 0 or -errno. */
int h_fdsup_init(struct h_fdsup *s);
/* Writes text as the kvpoold config. 0 or -errno. */
int h_fdsup_config(struct h_fdsup *s, const char *text);
/* Starts kvpoold (stdout and stderr appended to s->log) and waits until it logs "kvpoold
 * ready" (s->start_ms, 10 s when 0). Its pid, or -1: it exited, or it was not ready in time and
 * was killed (-9) and reaped, so nothing it made (a tier of many GiB) outlives the call. */
pid_t h_fdsup_start(struct h_fdsup *s);
/* Sends sig to pid, reaps it and takes what it stored. Its exit status (128 + signal when a
 * signal ended it), -1 when pid is not a process. */
int h_fdsup_stop(struct h_fdsup *s, pid_t pid, int sig);
/* Takes the FDSTORE / FDSTOREREMOVE messages waiting. */
void h_fdsup_drain(struct h_fdsup *s);
/* The stored fd named name, or -1. */
int h_fdsup_fd(const struct h_fdsup *s, const char *name_part);
/* Lines of kvpoold's log that hold str. */
int h_fdsup_log_count(const struct h_fdsup *s, const char *str);
/* Closes everything and removes the folder (kept, and named, with $KVP_KEEP set). */
void h_fdsup_fini(struct h_fdsup *s);
