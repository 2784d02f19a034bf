/* metrics_http.h - the optional Prometheus endpoint (metrics_listen = HOST:PORT or unix:PATH),
 * served by libmicrohttpd's own thread from a snapshot the event loop publishes; the loop's
 * state is never read from another thread. Its access rule: TCP peers from metrics_allow
 * (loopback when none is given), loopback peers by the uid owning their socket held to
 * kvpoold's socket rule (allowed_users / allowed_groups, the socket's mode); unix peers root,
 * kvpoold's uid and admin_groups; at most metrics_peer_connections connections of one peer, closed
 * after metrics_idle_s idle. */
#pragma once
#include <stdbool.h>

#include "config.h"

struct kvp_metrics_http;

/* Starts serving GET /metrics as conf says ("127.0.0.1:9464", "[::1]:9464",
 * "unix:/run/kvpool/metrics.sock"); sock: kvpoold's own socket path, whose users rule and mode
 * loopback TCP peers are held to (NULL or "": loopback peers are refused). NULL with a logged
 * reason when the address is bad, it
 * cannot be bound, or kvpoold was built without libmicrohttpd. */
struct kvp_metrics_http *kvp_metrics_http_start(const struct kvp_conf *conf, const char *sock);
/* Replaces the snapshot (text is copied) and the access rule (conf's admin_groups,
 * metrics_allow, metrics_peer_connections: a reload applies them). */
void kvp_metrics_http_publish(struct kvp_metrics_http *m, const char *text,
			      const struct kvp_conf *conf);
/* Accepts NULL. */
void kvp_metrics_http_stop(struct kvp_metrics_http *m);
