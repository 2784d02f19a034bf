#!/usr/bin/env bash
# remote_daemon.sh - kvpoold with a [remote] section, run by redis_cluster.sh (KVP_REDIS_PORTS,
# KVP_REDIS_DIR): node A points at the real 3-master loopback cluster and connects to every
# master (remote_connects, remote_slot_map_loads in kvpoolctl status and metrics); node B points
# at a port nothing listens on and serves all the same; a reload that changes the remote tier
# is refused there. Both stop cleanly (exit 0). Everything on 127.0.0.1, in a temporary
# directory removed on exit.
set -uo pipefail
: "${KVPOOLD:?}" "${KVPOOLCTL:?}" "${KVP_REDIS_PORTS:?}"
IFS=, read -r p1 p2 p3 <<<"$KVP_REDIS_PORTS"
tmp=$(mktemp -d /tmp/kvp-remote-daemon.XXXXXX)
(umask 077; head -c 32 /dev/urandom >"$tmp/secret")
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
	rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; for f in "$tmp"/*.log; do echo "== $f"; cat "$f"; done; exit 1; }

conf() { # NAME SEEDS
	cat >"$tmp/$1.conf" <<CONF
[daemon]
socket = $tmp/$1.sock
[remote]
seeds = $2
connect_timeout_ms = 500
command_timeout_ms = 500
connections = 5
secret = file:$tmp/secret
[pool.p]
layers = 2
kv_heads = 1
head_dim = 8
dtype = fp16
page_tokens = 4
host_capacity = 1M
mlock = off
remote = spill
CONF
}
# A port nobody listens on: bound, then closed.
dead=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
conf a "127.0.0.1:$p2"
conf b "127.0.0.1:$dead"
for n in a b; do
	"$KVPOOLD" --config "$tmp/$n.conf" --socket "$tmp/$n.sock" >"$tmp/$n.log" 2>&1 &
	pids+=($!)
done
status() { # NODE: kvpoolctl status --json
	timeout 5 "$KVPOOLCTL" --socket "$tmp/$1.sock" --json status
}
counter() { # NODE NAME
	status "$1" | python3 -c '
import json, sys
s = json.load(sys.stdin)
print(s["counters"].get(sys.argv[1], -1))' "$2"
}
ok=0
for _ in $(seq 100); do
	[ "$(counter a remote_slot_map_loads 2>/dev/null)" -ge 1 ] 2>/dev/null &&
		[ "$(counter a remote_connects)" -ge 15 ] && ok=1 && break
	sleep 0.1
done
[ $ok = 1 ] || fail "node A never loaded the slot map and connected 5 times to each of the 3 masters"
sleep 0.3
[ "$(counter a remote_connects)" = 15 ] ||
	fail "node A made $(counter a remote_connects) connections, not 5 to each of 3 masters"
[ "$(counter a remote_disconnects)" = 0 ] || fail "node A lost a connection"
metrics=$(timeout 5 "$KVPOOLCTL" --socket "$tmp/a.sock" metrics) || fail "no metrics from node A"
grep -Eq '^kvpool_remote_connects_total ([3-9]|[1-9][0-9]+)$' <<<"$metrics" ||
	fail "metrics of node A lack kvpool_remote_connects_total >= 3"
grep -q '^# TYPE kvpool_remote_inflight_bytes gauge' <<<"$metrics" ||
	fail "metrics of node A lack the kvpool_remote_inflight_bytes gauge"
# B: nothing to connect to, yet it answers, and says so in its counters.
for _ in $(seq 50); do status b >/dev/null 2>&1 && break; sleep 0.1; done
[ "$(counter b remote_connects)" = 0 ] || fail "node B connected to a dead port"
[ "$(counter b remote_slot_map_loads)" = 0 ] || fail "node B loaded a slot map from nothing"
timeout 5 "$KVPOOLCTL" --socket "$tmp/b.sock" ping >/dev/null || fail "node B does not answer"
# A reload that changes the remote tier is refused (a restart is needed), one that does not
# is applied.
sed -i 's/^remote = spill$/remote = write-through/' "$tmp/b.conf"
out=$(timeout 10 "$KVPOOLCTL" --socket "$tmp/b.sock" reload 2>&1)
rc=$?
[ $rc = 1 ] || fail "reload changing remote = answered $rc: $out"
grep -q "remote mode changes; restart kvpoold" <<<"$out" || fail "reload refusal says: $out"
sed -i 's/^remote = write-through$/remote = spill/; s/^ttl_s = .*//; /^\[remote\]/a ttl_s = 60' "$tmp/b.conf"
out=$(timeout 10 "$KVPOOLCTL" --socket "$tmp/b.sock" reload 2>&1) && fail "reload changing ttl_s passed: $out"
sed -i '/^ttl_s = 60$/d' "$tmp/b.conf"
timeout 10 "$KVPOOLCTL" --socket "$tmp/b.sock" reload >/dev/null 2>&1 || fail "unchanged reload refused"
for i in 0 1; do
	kill -TERM "${pids[$i]}"
	wait "${pids[$i]}" || fail "node $i exited with $?"
done
pids=()
grep -q "remote tier: Redis Cluster seeds 127.0.0.1:$p2" "$tmp/a.log" || fail "no start line"
echo "ok: node A connected to the cluster, node B served without one"
