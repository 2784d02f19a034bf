/* fault.c - failure injection for tests (fault.h). */
#include "fault.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const g_names[KVP_FAULT_SITES] = {
	[KVP_FAULT_REPLY_QUEUE] = "reply_queue",
	[KVP_FAULT_REPLY_ALLOC] = "reply_alloc",
	[KVP_FAULT_PIDFD] = "pidfd",
};
static unsigned long g_every[KVP_FAULT_SITES], g_passes[KVP_FAULT_SITES], g_left[KVP_FAULT_SITES];
static bool g_armed;

int kvp_fault_init(char *err, size_t errlen)
{
	const char *v = getenv("KVPOOLD_FAULTS");
	char buf[256], *save = NULL;

	memset(g_every, 0, sizeof(g_every));
	memset(g_passes, 0, sizeof(g_passes));
	memset(g_left, 0, sizeof(g_left));
	g_armed = false;
	if (!v || !*v)
		return 0;
	if (strlen(v) >= sizeof(buf)) {
		snprintf(err, errlen, "KVPOOLD_FAULTS: longer than %zu bytes", sizeof(buf) - 1);
		return -1;
	}
	strcpy(buf, v);
	for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		char *colon = strchr(tok, ':'), *end;
		unsigned long n, max = (unsigned long)-1;
		int s;

		if (!colon) {
			snprintf(err, errlen, "KVPOOLD_FAULTS: '%s' is not site:N", tok);
			return -1;
		}
		*colon = '\0';
		for (s = 0; s < KVP_FAULT_SITES && strcmp(g_names[s], tok); s++)
			;
		errno = 0;
		n = strtoul(colon + 1, &end, 10);
		if (*end == ':' && end[1] && end[1] != '-')
			max = strtoul(end + 1, &end, 10);
		if (s == KVP_FAULT_SITES || errno || *end || !n || !max || colon[1] == '-') {
			snprintf(err, errlen,
				 "KVPOOLD_FAULTS: '%s:%s': want site:N[:MAX], site one of reply_queue, "
				 "reply_alloc, pidfd, N and MAX positive numbers",
				 tok, colon + 1);
			return -1;
		}
		g_every[s] = n;
		g_left[s] = max;
		g_armed = true;
	}
	return 0;
}

bool kvp_fault_hit(enum kvp_fault_site s)
{
	if (!g_armed || !g_every[s] || !g_left[s] || ++g_passes[s] % g_every[s])
		return false;
	g_left[s]--;
	return true;
}
