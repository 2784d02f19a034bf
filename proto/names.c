/* names.c - wire value names and the default socket path, shared by kvpoold and libkvpool. */
#include "names.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "kvpool.pb-c.h"

const char *kvp_names_tier(int tier)
{
	static const char *const n[] = { "device", "host" };

	_Static_assert(KVPOOL__TIER__DEVICE == 0 && KVPOOL__TIER__HOST == 1, "tier order");
	return tier >= 0 && tier < (int)(sizeof(n) / sizeof(n[0])) ? n[tier] : "?";
}

const char *kvp_names_backend(int backend)
{
	static const char *const n[] = { "none", "sim", "cuda", "memfd" };

	_Static_assert(KVPOOL__BACKEND__SIM == 1 && KVPOOL__BACKEND__CUDA == 2 &&
			       KVPOOL__BACKEND__MEMFD == 3,
		       "backend order");
	return backend >= 0 && backend < (int)(sizeof(n) / sizeof(n[0])) ? n[backend] : "?";
}

const char *kvp_names_dtype(int dtype)
{
	static const char *const n[] = { "none", "fp16", "bf16", "fp8", "fp32" };

	_Static_assert(KVPOOL__DTYPE__FP16 == 1 && KVPOOL__DTYPE__BF16 == 2 &&
			       KVPOOL__DTYPE__FP8 == 3 && KVPOOL__DTYPE__FP32 == 4,
		       "dtype order");
	return dtype >= 0 && dtype < (int)(sizeof(n) / sizeof(n[0])) ? n[dtype] : "?";
}

int kvp_names_default_socket(char *buf, size_t len)
{
	const char *env = getenv("KVPOOL_SOCKET"), *xdg = getenv("XDG_RUNTIME_DIR");
	int n;

	if (env && env[0])
		n = snprintf(buf, len, "%s", env);
	else if (geteuid() == 0 || !xdg || !xdg[0])
		n = snprintf(buf, len, "%s", KVP_ROOT_SOCKET);
	else
		n = snprintf(buf, len, "%s/kvpool/kvpoold.sock", xdg);
	return n >= 0 && (size_t)n < len ? 0 : -ENAMETOOLONG;
}
