/* fault.c - failure injection for tests (fault.h). */
#include "fault.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

static const char *const g_names[KVP_FAULT_SITES] = {
	[KVP_FAULT_REPLY_QUEUE] = "reply_queue",
	[KVP_FAULT_REPLY_ALLOC] = "reply_alloc",
	[KVP_FAULT_PIDFD] = "pidfd",
	[KVP_FAULT_CONN] = "conn",
	[KVP_FAULT_SESSION] = "session",
	[KVP_FAULT_INPUT] = "input",
	[KVP_FAULT_DECODE] = "decode",
	[KVP_FAULT_LEASE] = "lease",
	[KVP_FAULT_IDMAP] = "idmap",
	[KVP_FAULT_LOCK] = "lock",
	[KVP_FAULT_PREFIX] = "prefix",
	[KVP_FAULT_PEER_PIDFD] = "peer_pidfd",
	[KVP_FAULT_SQE] = "sqe",
	[KVP_FAULT_ACCEPT] = "accept",
	[KVP_FAULT_NOTICE] = "notice",
	[KVP_FAULT_SNAPSHOT] = "snapshot",
	[KVP_FAULT_DISK_IO] = "disk_io",
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
			char sites[160] = "";

			for (int i = 0; i < KVP_FAULT_SITES; i++)
				snprintf(sites + strlen(sites), sizeof(sites) - strlen(sites),
					 "%s%s", i ? ", " : "", g_names[i]);
			snprintf(
				err, errlen,
				"KVPOOLD_FAULTS: '%s:%s': want site:N[:MAX], site one of %s; N and "
				"MAX positive numbers",
				tok, colon + 1, sites);
			return -1;
		}
		g_every[s] = n;
		g_left[s] = max;
		g_armed = true;
	}
	return 0;
}

bool kvp_fault_armed(void)
{
	return g_armed;
}

bool kvp_fault_hit(enum kvp_fault_site s)
{
	if (!g_armed || !g_every[s] || !g_left[s] || ++g_passes[s] % g_every[s])
		return false;
	g_left[s]--;
	log_debug("failure injection: %s fails (pass %lu)", g_names[s], g_passes[s]);
	return true;
}
