#!/usr/bin/env bash
# install_smoke.sh BUILDDIR - `meson install` into a scratch root, then an engine program builds
# with `pkg-config --cflags --libs kvpool` against the installed header and library only, and
# pings a kvpoold started from the installed binary. Also checks the library exports nothing
# but the public API.
set -euo pipefail
build=$1
root=$(mktemp -d /tmp/kvpool-install-XXXXXX)
trap 'kill ${pid:-} 2>/dev/null || true; rm -rf "$root"' EXIT
meson install -C "$build" --destdir "$root" >/dev/null
pcdir=$(dirname "$(find "$root" -name kvpool.pc | head -1)")
export PKG_CONFIG_PATH=$pcdir PKG_CONFIG_SYSROOT_DIR=$root
cat >"$root/engine.c" <<'C'
#include <kvpool.h>
#include <stdio.h>
int main(int argc, char **argv)
{
	struct kvp_error e;
	struct kvp_client *c = kvp_client_connect(argc > 1 ? argv[1] : NULL, "engine", &e);
	struct kvp_pool *p;
	uint32_t pages[4];
	uint64_t lease;

	if (!c) {
		fprintf(stderr, "engine: %s: %s\n", kvp_code_name(e.code), e.message);
		return 1;
	}
	p = kvp_pool_attach(c, "default", NULL, &e);
	if (!p || kvp_lease_alloc(p, KVP_TIER_DEVICE, 4, &lease, pages, &e) < 0 ||
	    kvp_lease_free(p, lease, NULL, 0, &e) < 0) {
		fprintf(stderr, "engine: %s: %s\n", kvp_code_name(e.code), e.message);
		return 1;
	}
	printf("engine: leased and freed 4 pages of pool default through the installed libkvpool\n");
	kvp_client_close(c);
	return 0;
}
C
libdir=$(dirname "$(find "$root" -name 'libkvpool.so.1' | head -1)")
san=()
# A sanitized build's library needs a sanitized program around it.
readelf -d "$libdir/libkvpool.so.1" | grep -q libasan && san=(-fsanitize=address,undefined)
# shellcheck disable=SC2046
cc -std=c11 -Wall -Werror "${san[@]}" -o "$root/engine" "$root/engine.c" \
	$(pkg-config --cflags --libs kvpool)
bad=$(nm -D --defined-only "$libdir/libkvpool.so.1" | awk '$2 ~ /[TDBR]/ && $3 !~ /^kvp_/ { print $3 }')
if [ -n "$bad" ]; then
	echo "libkvpool exports non-API symbols: $bad"
	exit 1
fi
# Every export carries a version node of the API (the release that added it).
unversioned=$(objdump -T "$libdir/libkvpool.so.1" |
	awk '$NF ~ /^kvp_/ && $(NF-1) != "KVPOOL_0.2" && $(NF-1) != "KVPOOL_0.3" { print $NF }')
if [ -n "$unversioned" ]; then
	echo "libkvpool exports symbols outside KVPOOL_0.2 and KVPOOL_0.3: $unversioned"
	exit 1
fi
[ "$(pkg-config --modversion kvpool)" = 0.3.0 ] || { echo "kvpool.pc is not version 0.3.0"; exit 1; }
bin=$(dirname "$(find "$root" -name kvpoold -type f | head -1)")
"$bin/kvpoold" --socket "$root/s.sock" --log-level warning &
pid=$!
for _ in $(seq 100); do "$bin/kvpoolctl" --socket "$root/s.sock" ping >/dev/null 2>&1 && break; sleep 0.1; done
LD_LIBRARY_PATH=$libdir "$root/engine" "$root/s.sock"
