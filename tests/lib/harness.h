/* harness.h - test helpers: start a real kvpoold on a temporary socket, run code in real
 * client processes, send raw frames. */
#pragma once
#include "suite.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <CUnit/CUnit.h>

#include "kvpool.pb-c.h"

struct daemon {
	pid_t pid;
	char dir[128];	  /* temporary directory */
	char sock[160];	  /* socket path */
	char log[160];	  /* stderr of the daemon */
	char config[160]; /* config written by the test, "" when embedded */
};

/* Path of the kvpoold binary: $KVPOOLD, else ../daemon/kvpoold relative to the build dir. */
const char *h_kvpoold(void);
/* Path of the kvpoolctl binary: $KVPOOLCTL, else ../client/kvpoolctl. */
const char *h_kvpoolctl(void);
/* Writes text to the file at path (created or truncated). 0, or -1 / EOF on failure. */
int h_write_file(const char *path, const char *text);
/* Writes config text (NULL: none) and starts kvpoold with extra args (NULL-terminated).
 * Waits until it accepts connections (10 s). Returns 0 or -1 (d->log says why). */
int h_daemon_start(struct daemon *d, const char *config, const char *const *args);
/* h_daemon_start with kvpoold's RLIMIT_NOFILE set to nofile, soft and hard (0: inherited),
 * and, when uid is not 0, kvpoold run as uid (group uid, no supplementary groups; its temporary
 * directory is handed to it). */
int h_daemon_start_as(struct daemon *d, const char *config, const char *const *args,
		      unsigned nofile, uid_t uid);
/* Starts kvpoold and waits for it to exit (for start-up failures). Returns its exit status,
 * -1 when it did not exit within 10 s. */
int h_daemon_run_to_exit(struct daemon *d, const char *config, const char *const *args);
/* SIGTERM, then waits up to 10 s. Returns the exit status, -1 on timeout (then SIGKILL). */
int h_daemon_stop(struct daemon *d);
/* Whether the daemon's log contains s. */
bool h_log_contains(const struct daemon *d, const char *s);
/* Stops the daemon when it still runs and removes the temporary directory. */
void h_daemon_cleanup(struct daemon *d);
/* Removes a /tmp/kvpool-test-* directory (kept, and named on stderr, with KVP_KEEP_LOGS). */
void h_dir_remove(const char *dir);
/* Waits up to ms until sock accepts connections: 0, or -1 on timeout or when the child *pid
 * exited first (then *pid = 0). */
int h_wait_accepting(const char *sock, pid_t *pid, int ms);
/* Whether the file at path contains s. */
bool h_file_contains(const char *path, const char *s);
/* Polls up to ms until the file at path contains s. */
bool h_wait_file_contains(const char *path, const char *s, int ms);
/* A suite's cleanup: h_daemon_stop then h_daemon_cleanup; 0 when the daemon exited 0, else -1
 * (a CUnit cleanup failure). */
int h_daemon_finish(struct daemon *d);

/* Waits up to ms for child pid to exit: its exit status (128+signal), or -1 on timeout, after
 * which the child is SIGKILLed and reaped. */
int h_wait_pid(pid_t pid, int ms);

/* Writes back dirty pages and drops the page cache (root only: otherwise it stays, said on
 * stderr when the write fails), so reads that follow come from the disk. */
void h_drop_caches(void);

/* Runs fn(arg) in a forked child; returns its exit status (or 128+signal). */
int h_in_child(int (*fn)(void *arg), void *arg);

/* A raw connection for hostile-input tests. */
int h_raw_connect(const char *sock);
/* Sends a packed request frame. 0 or -errno. */
int h_raw_send_request(int fd, Kvpool__Request *req);
/* Reads one response frame within ms. NULL on EOF, timeout or garbage. */
Kvpool__Response *h_raw_recv(int fd, int ms);
/* Whether the peer closed the connection within ms (reads and discards). */
bool h_raw_closed(int fd, int ms);

/* A fake kvpoold for client tests: listens on sock, forks a child that accepts one connection
 * and exits with script(fd, arg) (90 when no client came within 10 s). Returns 0 with *pid, or
 * -1. */
int h_fake_daemon(const char *sock, int (*script)(int fd, void *arg), void *arg, pid_t *pid);
/* Reads one request frame within ms. NULL on EOF, timeout or garbage. */
Kvpool__Request *h_fake_recv(int fd, int ms);
/* Sends one response frame with nfds (at most 8) descriptors. 0 or -errno. */
int h_fake_send(int fd, Kvpool__Response *resp, const int *fds, int nfds);

/* h_run_suite, H_TEST: suite.h */

/* Milliseconds of the monotonic clock. */
uint64_t h_now_ms(void);
