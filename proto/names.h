/* names.h - the names both sides print for wire values (tiers, backends, dtypes) and the socket
 * path both sides default to, kept once so the daemon, the library and the CLI never disagree. */
#pragma once
#include <stddef.h>

#define KVP_ROOT_SOCKET "/run/kvpool/kvpoold.sock"

/* "device", "host"; "?" for other values. */
const char *kvp_names_tier(int tier);
/* "none", "sim", "cuda", "memfd" (the wire Backend); "?" for other values. */
const char *kvp_names_backend(int backend);
/* "none", "fp16", "bf16", "fp8", "fp32" (the wire Dtype: 0 none, 1 fp16, 2 bf16, 3 fp8,
 * 4 fp32); "?" for other values. */
const char *kvp_names_dtype(int dtype);
/* The socket path used when none is given: $KVPOOL_SOCKET, else KVP_ROOT_SOCKET for root (or
 * without $XDG_RUNTIME_DIR), else $XDG_RUNTIME_DIR/kvpool/kvpoold.sock. Returns 0, or
 * -ENAMETOOLONG when it does not fit in len (buf then holds nothing useful). */
int kvp_names_default_socket(char *buf, size_t len);
