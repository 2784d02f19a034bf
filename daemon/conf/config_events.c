/* config_events.c - the text keys of the [events] section: ZeroMQ endpoints (tcp://, ipc://,
 * inproc://) and the topic and source names, checked here so that a bad one is a config error at
 * its line rather than a failure to bind at start; and whether a reload changes KV events. */
#include "config_parse.h"

#include <string.h>

static bool printable(const char *v)
{
	for (const char *p = v; *p; p++)
		if ((unsigned char)*p < 0x20 || *p == 0x7f)
			return false;
	return true;
}

/* endpoint = tcp://HOST:PORT | ipc://PATH | inproc://NAME (replay_endpoint: also "" = none). */
void kvp_conf_parse_events_endpoint(struct parse *s, const char *key, const char *v)
{
	bool replay = strcmp(key, "replay_endpoint") == 0;
	char *field = replay ? s->conf.events.replay_endpoint : s->conf.events.endpoint;
	size_t n = strlen(v);

	if (replay && n == 0) {
		field[0] = '\0';
		return;
	}
	if ((strncmp(v, "tcp://", 6) != 0 && strncmp(v, "ipc://", 6) != 0 &&
	     strncmp(v, "inproc://", 9) != 0) ||
	    !printable(v) || strchr(v, ' ') || n >= KVP_EVENTS_ENDPOINT_MAX ||
	    n <= (v[0] == 'i' && v[1] == 'n' ? 9u : 6u)) {
		kvp_conf_key_fail(s, key,
				  "expected a ZeroMQ endpoint to bind (tcp://*:5557, ipc://PATH or "
				  "inproc://NAME) of at most %d characters, got '%s'",
				  KVP_EVENTS_ENDPOINT_MAX - 1, v);
		return;
	}
	memcpy(field, v, n + 1);
}

/* topic = TEXT (may be empty), source = TEXT: printable, under KVP_EVENTS_NAME_MAX bytes. */
void kvp_conf_parse_events_text(struct parse *s, const char *key, const char *v)
{
	char *field = strcmp(key, "topic") == 0 ? s->conf.events.topic : s->conf.events.source;
	size_t n = strlen(v);

	if (!printable(v) || n >= KVP_EVENTS_NAME_MAX ||
	    (n == 0 && field != s->conf.events.topic)) {
		kvp_conf_key_fail(s, key, "expected %s printable characters, got '%s'",
				  field == s->conf.events.topic ? "0..127" : "1..127", v);
		return;
	}
	memcpy(field, v, n + 1);
}

int kvp_conf_events_same(const struct kvp_conf *a, const struct kvp_conf *b)
{
	const struct kvp_conf_events *x = &a->events, *y = &b->events;

	if (x->enabled != y->enabled || strcmp(x->endpoint, y->endpoint) ||
	    strcmp(x->replay_endpoint, y->replay_endpoint) || strcmp(x->topic, y->topic) ||
	    strcmp(x->source, y->source) || x->buffer_steps != y->buffer_steps ||
	    x->buffer_bytes != y->buffer_bytes || x->hwm != y->hwm || x->batch_us != y->batch_us)
		return 0;
	for (uint32_t i = 0; i < a->n_pools && i < b->n_pools; i++)
		if (a->pools[i].events != b->pools[i].events)
			return 0;
	return 1;
}
