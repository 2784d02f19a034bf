#!/usr/bin/env bash
# soak.sh - 16 engine processes (8 lease, 8 shared-prefix under memory pressure) for
# KVP_SOAK_SECONDS (default 60) at full speed against one kvpoold on a unix socket. Checks:
# kvpoold's RSS flat after warm-up (growth <= 5% + 4 MiB), every byte verified, the tier
# invariant and no leased page left afterwards; reports the client-observed p99 latency.
set -euo pipefail
secs=${KVP_SOAK_SECONDS:-60}
warm=$((secs / 4))
dir=$(mktemp -d /tmp/kvpool-soak-XXXXXX)
export KVPOOL_SOCKET=$dir/kvpoold.sock
"$KVPOOLD" --log-level notice 2>"$dir/log" &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -rf "$dir"' EXIT
for _ in $(seq 100); do "$KVPOOLCTL" ping >/dev/null 2>&1 && break; sleep 0.1; done
rss() { awk '/^VmRSS:/ { print $2 }' "/proc/$pid/status"; }

"$KVPOOL_LOADGEN" --procs 8 --seconds "$secs" --json >"$dir/lease.json" &
l1=$!
"$KVPOOL_LOADGEN" --procs 8 --seconds "$secs" --workload shared-prefix --families 16 \
	--conversations 16 --turns 12 --json >"$dir/prefix.json" &
l2=$!
sleep "$warm"
rss_warm=$(rss)
samples="$rss_warm"
for _ in $(seq $(((secs - warm) / 5))); do
	sleep 5
	kill -0 $pid 2>/dev/null || { echo "soak: kvpoold died"; cat "$dir/log"; exit 1; }
	samples="$samples $(rss)"
done
rc=0
wait $l1 || rc=1
wait $l2 || rc=1
rss_end=$(rss)
"$KVPOOLCTL" status --json >"$dir/status.json"
python3 - "$dir" "$rss_warm" "$rss_end" "$secs" "$samples" "$rc" <<'PY'
import json, sys
d, warm, end, secs, samples, rc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], int(sys.argv[6])
lease = json.load(open(d + "/lease.json"))
prefix = json.load(open(d + "/prefix.json"))
status = json.load(open(d + "/status.json"))
ok = rc == 0
for name, r in (("lease", lease), ("shared-prefix", prefix)):
    print(f"soak {name}: {r['requests']} requests ({r['requests_per_s']:.0f}/s), "
          f"{r['bytes_verified'] / 2**30:.1f} GiB verified, {r['mismatches']} mismatches, "
          f"rpc p50 <= {r['rpc_p50_us']:.0f} us, p99 <= {r['rpc_p99_us']:.0f} us, errors {r['errors']}")
    ok &= r["mismatches"] == 0 and r["failed_procs"] == 0
for p in status["pools"]:
    for t in p["tiers"]:
        inv = t["free_tokens"] + t["leased_tokens"] + t["cached_tokens"] == t["total_tokens"]
        print(f"soak tier {p['name']}/{t['tier']}: free {t['free_tokens']} leased {t['leased_tokens']} "
              f"cached {t['cached_tokens']} total {t['total_tokens']} invariant {'holds' if inv else 'BROKEN'}")
        ok &= inv and t["leased_tokens"] == 0
growth = end - warm
limit = warm * 0.05 + 4096
print(f"soak kvpoold RSS (KiB) after {secs} s: warm-up {warm}, end {end}, growth {growth} "
      f"(limit {limit:.0f}); samples {samples}")
ok &= growth <= limit
print("soak:", "ok" if ok else "FAILED")
sys.exit(0 if ok else 1)
PY
