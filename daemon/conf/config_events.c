/* config_events.c - the text keys of the [events] section: ZeroMQ endpoints (tcp://, ipc://,
 * inproc://) and the topic and source names, checked here so that a bad one is a config error at
 * its line rather than a failure to bind at start. */
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
