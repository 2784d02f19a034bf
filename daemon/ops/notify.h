/* notify.h - systemd glue: sd_notify states and socket activation. Works without libsystemd
 * (the protocols are small); uses it when built with it. */
#pragma once
#include <stdint.h>

/* Sends state to $NOTIFY_SOCKET; no-op when unset. Returns 0 or negative errno. */
int kvp_notify(const char *state);
/* Watchdog interval in ms from $WATCHDOG_USEC (for this pid), 0 when none. */
uint64_t kvp_watchdog_ms(void);
/* Socket activation fds looked at; more are closed. */
#define KVP_ACTIVATION_MAX 16
/* The control socket passed by socket activation (LISTEN_FDS/LISTEN_PID), or -1. Every fd
 * passed is looked at: each listening unix stream socket is kept with its LISTEN_FDNAMES name
 * (kvp_activation_fds), every other fd is closed with a log line. The control socket is the
 * one named "kvpoold.sock", "kvpoold" or "kvpoold.socket" (without names, or with none of them,
 * the first kept); each other kept fd is logged once. */
int kvp_activation_fd(void);

struct kvp_activation {
	int fd;
	char name[64]; /* from LISTEN_FDNAMES; "" without */
};
/* The listeners kept by kvp_activation_fd, the control socket among them, in the order passed:
 * sets *fds, returns the count. */
int kvp_activation_fds(const struct kvp_activation **fds);
/* The kept listener named name, or -1. */
int kvp_activation_find(const char *name);
/* Closes every kept listener but the control socket (its server closes it). */
void kvp_activation_close(void);
