/* metrics.h - the Prometheus text exposition of kvpoold's stats tables (stats.h). */
#pragma once
#include "daemon.h"
#include "stats.h"

/* The daemon-wide figures of KVP_DAEMON_FIGURES, read now. */
void kvp_daemon_figures(const struct kvp_daemon *d, struct kvp_daemon_figures *out);
/* Renders the Prometheus text exposition of d into a malloc'ed string; NULL on ENOMEM. Every
 * family of the stats tables appears once, with its HELP and TYPE lines. */
char *kvp_metrics_render(const struct kvp_daemon *d);
/* The same with the series of pool i only where show[i] (show NULL: every pool); the
 * daemon-wide families stay. The Metrics RPC of a non-admin shows the pools it may attach. */
char *kvp_metrics_render_pools(const struct kvp_daemon *d, const bool *show);
