/* reload.h - putting a configuration into effect: the budget check, pool creation, and the
 * reload (SIGHUP, the Reload call). A reload runs in two halves: the worker re-reads the file,
 * checks it against a copy of the running configuration and creates the new pools (memfd,
 * prefault, mlock: slow, blocking) while the loop keeps serving; the loop then applies the
 * result. main.c uses the first two at start-up; loop.c starts reloads. */
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "daemon.h"
#include "work.h"

/* Budget check of every pool of c against what the machine has free now; logs a refusal.
 * 0, -ENOMEM when it does not fit, -EINVAL for a NUMA node that does not exist, or the
 * negative errno of reading the machine's limits. */
int kvp_daemon_check_budget(const struct kvp_conf *c);
/* Creates pool number id of pc and logs its shape. NULL, with the reason logged (and written to
 * why, when not NULL), on failure. */
struct kvpd_pool *kvp_daemon_create_pool(const struct kvp_pool_conf *pc, uint32_t id, char *why,
					 size_t whylen);

/* Starts a reload of d->config_path on w. finished(ctx) runs on the loop thread once the
 * result is applied (or refused). The Reload calls waiting then (d->defers.reload_waiting)
 * are this reload's: each is answered, through its ticket, with what changed, or, when a
 * part cannot be applied (a new pool that cannot be created), with nothing applied: the
 * refused parts and the changes the file would have made; or with the typed failure of a
 * file refused whole; a call that arrives while it
 * runs waits for the next reload, which reads the file after it. Returns 0 when the reload
 * job was queued, 1 when there is nothing to do (embedded config: logged), or a negative
 * errno (nothing queued); in both the waiting calls are answered at once. */
int kvp_reload_start(struct kvp_daemon *d, struct kvp_work *w, void (*finished)(void *ctx),
		     void *ctx);
