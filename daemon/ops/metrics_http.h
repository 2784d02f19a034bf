/* metrics_http.h - the optional Prometheus endpoint (metrics_listen = HOST:PORT), served by
 * libmicrohttpd's own thread from a snapshot the event loop publishes; the loop's state is
 * never read from another thread. */
#pragma once
#include <stdbool.h>

struct kvp_metrics_http;

/* Starts serving GET /metrics on listen ("127.0.0.1:9464"). NULL with a logged reason when the
 * address is bad, the port is taken, or kvpoold was built without libmicrohttpd. */
struct kvp_metrics_http *kvp_metrics_http_start(const char *listen);
/* Replaces the snapshot (text is copied). */
void kvp_metrics_http_publish(struct kvp_metrics_http *m, const char *text);
/* Accepts NULL. */
void kvp_metrics_http_stop(struct kvp_metrics_http *m);
