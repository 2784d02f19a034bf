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
 * passed is looked at: the one named "kvpoold.sock", "kvpoold" or "kvpoold.socket" in
 * LISTEN_FDNAMES (without names, or with none of them, the first) that is a listening unix
 * stream socket is kept; the others are closed, each with a log line. */
int kvp_activation_fd(void);
