/* metrics_http.c - GET /metrics over HTTP through libmicrohttpd. */
#include "metrics_http.h"

#include <stdlib.h>

#include "kvp_config.h"
#include "log.h"

#if KVP_HAVE_MHD
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

struct kvp_metrics_http {
	struct MHD_Daemon *mhd;
	pthread_mutex_t lock;
	char *text;
};

static enum MHD_Result serve(void *cls, struct MHD_Connection *conn, const char *url,
			     const char *method, const char *version, const char *upload,
			     size_t *upload_size, void **state)
{
	struct kvp_metrics_http *m = cls;
	struct MHD_Response *resp;
	enum MHD_Result r;
	unsigned status = MHD_HTTP_OK;
	char *body;

	(void)version;
	(void)upload;
	(void)upload_size;
	(void)state;
	if (strcmp(method, "GET") != 0) {
		body = strdup("only GET\n");
		status = MHD_HTTP_METHOD_NOT_ALLOWED;
	} else if (strcmp(url, "/metrics") != 0) {
		body = strdup("kvpoold: metrics are at /metrics\n");
		status = MHD_HTTP_NOT_FOUND;
	} else {
		pthread_mutex_lock(&m->lock);
		body = strdup(m->text ? m->text : "");
		pthread_mutex_unlock(&m->lock);
	}
	if (!body)
		return MHD_NO;
	resp = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
	if (!resp) {
		free(body);
		return MHD_NO;
	}
	MHD_add_response_header(resp, "Content-Type", "text/plain; version=0.0.4; charset=utf-8");
	r = MHD_queue_response(conn, status, resp);
	MHD_destroy_response(resp);
	return r;
}

struct kvp_metrics_http *kvp_metrics_http_start(const char *listen)
{
	struct sockaddr_in sa = { .sin_family = AF_INET };
	struct kvp_metrics_http *m;
	char host[64];
	const char *colon = strrchr(listen, ':');
	long port;

	if (!colon || (size_t)(colon - listen) >= sizeof(host)) {
		log_err("metrics_listen '%s': expected HOST:PORT", listen);
		return NULL;
	}
	memcpy(host, listen, (size_t)(colon - listen));
	host[colon - listen] = 0;
	port = strtol(colon + 1, NULL, 10);
	if (port <= 0 || port > 65535 || inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
		log_err("metrics_listen '%s': expected an IPv4 address and a port", listen);
		return NULL;
	}
	sa.sin_port = htons((uint16_t)port);
	m = calloc(1, sizeof(*m));
	if (!m)
		return NULL;
	pthread_mutex_init(&m->lock, NULL);
	m->mhd = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG, 0, NULL,
				  NULL, serve, m, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
				  MHD_OPTION_CONNECTION_LIMIT, 16u, MHD_OPTION_CONNECTION_TIMEOUT,
				  10u, MHD_OPTION_END);
	if (!m->mhd) {
		log_err("metrics_listen %s: cannot serve HTTP there (port taken?)", listen);
		pthread_mutex_destroy(&m->lock);
		free(m);
		return NULL;
	}
	log_info("metrics served at http://%s/metrics", listen);
	return m;
}

void kvp_metrics_http_publish(struct kvp_metrics_http *m, const char *text)
{
	char *copy = strdup(text), *old;

	if (!copy)
		return;
	pthread_mutex_lock(&m->lock);
	old = m->text;
	m->text = copy;
	pthread_mutex_unlock(&m->lock);
	free(old);
}

void kvp_metrics_http_stop(struct kvp_metrics_http *m)
{
	if (!m)
		return;
	MHD_stop_daemon(m->mhd);
	pthread_mutex_destroy(&m->lock);
	free(m->text);
	free(m);
}

#else

struct kvp_metrics_http *kvp_metrics_http_start(const char *listen)
{
	log_err("metrics_listen %s: this kvpoold was built without libmicrohttpd", listen);
	return NULL;
}

void kvp_metrics_http_publish(struct kvp_metrics_http *m, const char *text)
{
	(void)m;
	(void)text;
}

void kvp_metrics_http_stop(struct kvp_metrics_http *m)
{
	(void)m;
}

#endif
