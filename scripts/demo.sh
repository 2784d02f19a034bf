#!/usr/bin/env bash
# demo.sh - the main job: builds kvpool, starts kvpoold on its embedded default config, runs
# kvpool-loadgen (engine processes leasing slots and writing/verifying K/V bytes in the shared
# pages, then a shared-prefix workload across processes), and prints kvpoolctl status.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
bash scripts/build.sh build

run=$(mktemp -d /tmp/kvpool-demo-XXXXXX)
export KVPOOL_SOCKET=$run/kvpoold.sock
cleanup() {
	if [ -n "${pid:-}" ]; then
		kill "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	fi
	rm -rf "$run"
}
trap cleanup EXIT

build/daemon/kvpoold --log-level notice 2>"$run/kvpoold.log" &
pid=$!
for _ in $(seq 100); do
	build/client/kvpoolctl ping >/dev/null 2>&1 && break
	sleep 0.1
done
echo "--- kvpoold (embedded default config) on $KVPOOL_SOCKET"
cat "$run/kvpoold.log"
echo "--- kvpool-loadgen: 4 engine processes, lease workload"
build/client/kvpool-loadgen --procs 4 --seconds 5
echo "--- kvpool-loadgen: 4 engine processes, shared-prefix workload larger than the device tier"
echo "    (16 system prompts x 16 conversations x 12 turns: cold prefixes are demoted to host"
echo "    pages and promoted back on a hit; every matched byte is checked against its writer)"
build/client/kvpool-loadgen --procs 4 --seconds 5 --workload shared-prefix --families 16 \
	--conversations 16 --turns 12
echo "--- kvpoolctl status"
build/client/kvpoolctl status
echo "--- kvpoolctl cache"
build/client/kvpoolctl cache
kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
pid=
echo "--- kvpoold exited with status $rc"
exit $rc
