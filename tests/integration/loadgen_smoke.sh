#!/usr/bin/env bash
# loadgen_smoke.sh - the main job as a test: kvpoold on the embedded default, kvpool-loadgen
# (lease and shared-prefix workloads) verifying every byte, kvpoolctl status --json showing
# the invariant free + leased + cached == total per tier and no page leaked.
set -euo pipefail
dir=$(mktemp -d /tmp/kvpool-smoke-XXXXXX)
export KVPOOL_SOCKET=$dir/kvpoold.sock
"$KVPOOLD" --log-level notice 2>"$dir/log" &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -rf "$dir"' EXIT
for _ in $(seq 100); do "$KVPOOLCTL" ping >/dev/null 2>&1 && break; sleep 0.1; done
"$KVPOOL_LOADGEN" --procs 3 --seconds 2
"$KVPOOL_LOADGEN" --procs 3 --seconds 2 --workload shared-prefix
"$KVPOOLCTL" status --json >"$dir/status.json"
python3 - "$dir/status.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
for p in s["pools"]:
    for t in p["tiers"]:
        assert t["free_tokens"] + t["leased_tokens"] + t["cached_tokens"] == t["total_tokens"], t
        assert t["leased_tokens"] == 0, ("leaked lease", p["name"], t)
print("status ok:", [(p["name"], [(t["tier"], t["backend"], t["cached_tokens"]) for t in p["tiers"]]) for p in s["pools"]])
PY
kill -TERM $pid
wait $pid
