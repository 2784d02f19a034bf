#!/usr/bin/env bash
# redis_cluster.sh TEST - starts a 3-master Redis Cluster on loopback (three free ports, a
# temporary directory), waits for cluster_state:ok, runs TEST with KVP_REDIS_PORTS=p1,p2,p3 and
# KVP_REDIS_DIR set (TEST may kill and restart a node: DIR/PORT/redis.conf), then stops every
# node and removes the directory, whatever happened. Exits 77 without redis-server/redis-cli.
# With KVP_REDIS_ACL=1 the nodes refuse every command before AUTH (the default user off) and
# know one ACL user, kvpool, whose password is in DIR/password (mode 0600).
set -uo pipefail
test_bin=$1
for p in redis-server redis-cli; do
	command -v "$p" >/dev/null || { echo "skip: $p not installed (Debian: redis-server redis-tools)"; exit 77; }
done
dir=$(mktemp -d /tmp/kvp-redis.XXXXXX)
ports=()
cleanup() {
	for p in "${ports[@]}"; do
		pid=$(cat "$dir/$p/redis.pid" 2>/dev/null) && kill -9 "$pid" 2>/dev/null
	done
	[ "${KVP_KEEP_LOGS:-0}" = 1 ] && { echo "logs kept in $dir"; return; }
	rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# Three ports whose cluster bus ports (port + 10000) are free as well.
read -r -a ports < <(python3 - <<'PY'
import random, socket
def free(p):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p)); return True
    except OSError:
        return False
    finally:
        s.close()
out = []
while len(out) < 3:
    p = random.randint(20000, 29999)
    if p not in out and free(p) and free(p + 10000):
        out.append(p)
print(*out)
PY
)
acl=()
if [ "${KVP_REDIS_ACL:-0}" = 1 ]; then
	(umask 077; head -c 18 /dev/urandom | base64 | tr -d '/+=' >"$dir/password")
	export REDISCLI_AUTH
	REDISCLI_AUTH=$(cat "$dir/password")
	acl=(--user kvpool)
fi
rcli() { redis-cli "${acl[@]}" --no-auth-warning "$@"; }
for p in "${ports[@]}"; do
	mkdir -p "$dir/$p"
	cat >"$dir/$p/redis.conf" <<CONF
port $p
bind 127.0.0.1
dir $dir/$p
daemonize yes
pidfile $dir/$p/redis.pid
logfile $dir/$p/redis.log
cluster-enabled yes
cluster-config-file nodes.conf
cluster-node-timeout 2000
cluster-require-full-coverage no
enable-debug-command local
save ""
appendonly no
CONF
	if [ ${#acl[@]} -gt 0 ]; then
		printf 'user default off\nuser kvpool on >%s ~* &* +@all\n' "$REDISCLI_AUTH" \
			>>"$dir/$p/redis.conf"
	fi
	redis-server "$dir/$p/redis.conf" || { echo "redis-server failed on port $p"; exit 1; }
done
for p in "${ports[@]}"; do
	for _ in $(seq 100); do
		rcli -p "$p" ping 2>/dev/null | grep -q PONG && break
		sleep 0.1
	done
done
timeout 60 redis-cli "${acl[@]}" --no-auth-warning --cluster create "${ports[@]/#/127.0.0.1:}" --cluster-replicas 0 \
	--cluster-yes >"$dir/create.log" 2>&1 || { cat "$dir/create.log"; exit 1; }
ok=0
for _ in $(seq 200); do
	ok=1
	for p in "${ports[@]}"; do
		rcli -p "$p" cluster info | grep -q 'cluster_state:ok' || ok=0
	done
	[ $ok = 1 ] && break
	sleep 0.1
done
[ $ok = 1 ] || { echo "cluster never reached cluster_state:ok"; exit 1; }
export KVP_REDIS_DIR=$dir
KVP_REDIS_PORTS=$(IFS=,; echo "${ports[*]}")
export KVP_REDIS_PORTS
timeout 240 "$test_bin"
