/* notify.h - systemd glue: sd_notify states and socket activation. Works without libsystemd
 * (the protocols are small); uses it when built with it. */
#pragma once
#include <stdint.h>

/* Sends state to $NOTIFY_SOCKET; no-op when unset. Returns 0 or negative errno. */
int kvp_notify(const char *state);
/* Watchdog interval in ms from $WATCHDOG_USEC (for this pid), 0 when none. */
uint64_t kvp_watchdog_ms(void);
/* The listening socket passed by socket activation (LISTEN_FDS/LISTEN_PID), or -1. */
int kvp_activation_fd(void);
