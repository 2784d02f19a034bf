#!/usr/bin/env bash
# bench.sh [--quick] - builds kvpool (release, in build-bench or $KVP_BENCH_BUILDDIR), runs the
# benchmarks of tests/bench, adds the redis-server column to the RPC throughput rows, prints one
# table and writes bench-results.json in the repo root: a list of rows with name, params,
# machine, baseline, baseline_what, value, unit, ratio (= value / baseline), target, note.
# Every baseline is measured in the same process or the same script run as kvpool's figure.
# The Python rows (tests/python/bench_kvpool.py) run in the venv $KVP_VENV (default .venv) with
# the kvpool package installed there (scripts/pytest.sh does it); without it, or without torch
# for the gather row, they are written as skipped with the reason. The engine plug-ins' rows
# (tests/python/bench_engines.py, bench_sglang.py) run in $KVP_ENGINE_VENV (default
# .venv-engines) the same way.
#   --quick  smoke run of every row (about 30 s; CI runs it)
# Fails only when a benchmark errors (exit status, failed verification); never on speed.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
quick=0
for a in "$@"; do
	case $a in
	--quick) quick=1 ;;
	-h | --help) sed -n '2,12p' "$0"; exit 0 ;;
	*) echo "bench.sh: unknown argument $a" >&2; exit 2 ;;
	esac
done
dir=${KVP_BENCH_BUILDDIR:-build-bench}
start=$(date +%s.%N)
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

[ -d /usr/local/cuda/bin ] && export PATH="$PATH:/usr/local/cuda/bin"
# an existing build dir is switched to release (and tests on) only when it is not already
if [ -f "$dir/build.ninja" ] && ! python3 - "$dir/meson-info/intro-buildoptions.json" <<'PY'
import json, sys
o = {x["name"]: x["value"] for x in json.load(open(sys.argv[1]))}
sys.exit(0 if o.get("buildtype") == "release" and o.get("tests") is True else 1)
PY
then
	meson configure "$dir" -Dbuildtype=release -Dtests=true >/dev/null || exit 1
fi
bash scripts/build.sh "$dir" -Dbuildtype=release || { echo "bench.sh: build failed" >&2; exit 1; }

export KVPOOLD=$root/$dir/daemon/kvpoold
export KVPOOLCTL=$root/$dir/client/kvpoolctl
export KVPOOL_LOADGEN=$root/$dir/client/kvpool-loadgen
tmp=$(mktemp -d /tmp/kvpool-bench-XXXXXX)
redis_pid=
cleanup() {
	if [ -n "$redis_pid" ]; then
		kill "$redis_pid" 2>/dev/null
		wait "$redis_pid" 2>/dev/null
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT

qarg=
[ "$quick" = 1 ] && qarg=--quick
rows=$tmp/rows.jsonl
: >"$rows"
failed=0
for b in bench_rpc_latency bench_rpc_throughput bench_prefix bench_keys bench_pages bench_copy bench_cuda_pool \
	bench_e2e bench_reserve bench_restart bench_remote bench_disk; do
	t0=$(date +%s.%N)
	if [ "$b" = bench_remote ] && [ ! -x "$dir/tests/bench/$b" ]; then
		echo "== $b skipped: not built (no hiredis)" >&2 # its rows need the remote tier
		continue
	fi
	if "$dir/tests/bench/$b" $qarg >"$tmp/$b.out" 2>"$tmp/$b.err"; then
		printf '== %-22s ok (%s s)\n' "$b" "$(since "$t0")" >&2
	else
		echo "== $b FAILED (exit $?):" >&2
		cat "$tmp/$b.err" >&2
		failed=1
	fi
	grep '^{' "$tmp/$b.out" >>"$rows"
done

# ---- the Python package's rows, in the venv
venv=${KVP_VENV:-.venv}
t0=$(date +%s.%N)
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import kvpool, numpy" 2>"$tmp/py.err"; then
	if "$venv/bin/python" tests/python/bench_kvpool.py $qarg >"$tmp/py.out" 2>"$tmp/py.err"; then
		printf '== %-22s ok (%s s)\n' bench_kvpool.py "$(since "$t0")" >&2
	else
		echo "== bench_kvpool.py FAILED (exit $?):" >&2
		cat "$tmp/py.err" >&2
		failed=1
	fi
	grep '^{' "$tmp/py.out" >>"$rows"
else
	why="no venv at $venv with the kvpool package and numpy (scripts/pytest.sh makes it)"
	echo "== bench_kvpool.py skipped: $why" >&2
	python3 - "$why" >>"$rows" <<'PY'
import json, os, sys
for name, unit, target in (("python.alloc_free", "us", "ratio <= 1.2"),
                           ("python.match_1m_tokens", "tokens/s", "ratio >= 0.8"),
                           ("python.gather_4096", "GB/s", "ratio >= 0.7")):
    print(json.dumps({"name": name, "params": {},
                      "machine": {"nproc": os.cpu_count(), "kernel": os.uname().release},
                      "baseline": None, "baseline_what": "", "value": None, "unit": unit,
                      "ratio": None, "target": target, "note": "skipped: " + sys.argv[1]}))
PY
fi

# ---- the engine plug-ins' rows (tests/python/bench_engines.py, bench_sglang.py), in the
# engine venv (KVP_ENGINE_VENV, default .venv-engines, made by scripts/pytest.sh); each one
# writes its rows as skipped, with the reason, when it cannot import its engine
evenv=${KVP_ENGINE_VENV:-.venv-engines}
epy=python3
[ -x "$evenv/bin/python" ] && epy=$evenv/bin/python
for pb in tests/python/bench_engines.py tests/python/bench_sglang.py; do
	[ -f "$pb" ] || continue
	n=$(basename "$pb")
	t0=$(date +%s.%N)
	if "$epy" "$pb" $qarg >"$tmp/$n.out" 2>"$tmp/$n.err"; then
		printf '== %-22s ok (%s s)\n' "$n" "$(since "$t0")" >&2
	else
		echo "== $n FAILED (exit $?):" >&2
		cat "$tmp/$n.err" >&2
		failed=1
	fi
	grep '^{' "$tmp/$n.out" >>"$rows"
done

# ---- redis-server on a unix socket, driven by redis-benchmark (-t incr), same clients and
# pipeline as the Ping rows. Its client is one redis-benchmark process (event loop, N
# connections): the vs_redis rows set it against kvpool's N client processes (the issue's
# comparison), the vs_redis_evloop rows against kvpool driven in that same shape.
redis_ok=1
if ! command -v redis-server >/dev/null || ! command -v redis-benchmark >/dev/null ||
	! command -v redis-cli >/dev/null; then
	sudo_=
	[ "$(id -u)" != 0 ] && sudo_=sudo
	echo "== installing redis-server redis-tools" >&2
	$sudo_ apt-get install -y redis-server redis-tools >"$tmp/apt.log" 2>&1 ||
		{ $sudo_ apt-get update >>"$tmp/apt.log" 2>&1 &&
			$sudo_ apt-get install -y redis-server redis-tools >>"$tmp/apt.log" 2>&1; } ||
		redis_ok=0
fi
redis_rows=$tmp/redis.txt
: >"$redis_rows"
if [ "$redis_ok" = 1 ]; then
	redis-server --port 0 --unixsocket "$tmp/redis.sock" --unixsocketperm 700 --save '' \
		--appendonly no --daemonize no --dir "$tmp" >"$tmp/redis.log" 2>&1 &
	redis_pid=$!
	for _ in $(seq 100); do redis-cli -s "$tmp/redis.sock" ping >/dev/null 2>&1 && break; sleep 0.05; done
	redis-cli -s "$tmp/redis.sock" ping >/dev/null 2>&1 || redis_ok=0
fi
# best of redis_reps runs, as the Ping rows are best of N windows
if [ "$quick" = 1 ]; then
	clients="1 4" n1=20000 n16=200000 redis_reps=1
else
	clients="1 4 16 64" n1=60000 n16=600000 redis_reps=3
fi
if [ "$redis_ok" = 1 ]; then
	for c in $clients; do
		for d in 1 16; do
			n=$n1
			[ "$d" = 16 ] && n=$n16
			best=
			for _ in $(seq "$redis_reps"); do
				out=$(redis-benchmark -s "$tmp/redis.sock" -c "$c" -P "$d" -t incr -n "$n" \
					--csv 2>/dev/null) ||
					{ echo "== redis-benchmark -c $c -P $d FAILED" >&2; failed=1; continue; }
				rps=$(printf '%s\n' "$out" | awk -F'"' '$2 == "INCR" {print $4}')
				best=$(awk -v a="${best:-0}" -v b="${rps:-0}" 'BEGIN { print (b > a ? b : a) }')
			done
			[ -n "$best" ] && echo "$c $d $n $best $redis_reps" >>"$redis_rows"
		done
	done
	redis_version=$(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p')
	kill "$redis_pid" 2>/dev/null
	wait "$redis_pid" 2>/dev/null
	redis_pid=
else
	echo "== redis not available: the redis rows are marked skipped" >&2
	redis_version=
fi

python3 - "$rows" "$redis_rows" "$root/bench-results.json" "$quick" "$redis_ok" "${redis_version:-}" \
	"$(since "$start")" <<'PY'
import json, os, sys
rows_path, redis_path, out_path, quick, redis_ok, redis_version, elapsed = sys.argv[1:8]
rows = [json.loads(l) for l in open(rows_path) if l.strip()]
machine = {"nproc": os.cpu_count(), "kernel": os.uname().release}
redis = {}
for l in open(redis_path):
    c, d, n, rps, reps = l.split()
    redis[(int(c), int(d))] = (int(n), float(rps), int(reps))
extra = {}
for r in rows:
    kind = r["name"].split(".")[2] if r["name"].startswith("rpc.throughput.") else None
    if kind not in ("ping", "ping_evloop"):
        continue
    c, d = r["params"]["clients"], r["params"]["pipeline"]
    n, rps, reps = redis.get((c, d), (None, None, None))
    evloop = kind == "ping_evloop"
    row = {"name": "rpc.throughput.%s.c%d.d%d" % ("vs_redis_evloop" if evloop else "vs_redis", c, d),
           "params": {"clients": c, "pipeline": d, "redis_requests": n, "best_of": reps,
                      "redis_version": redis_version, "command": "INCR",
                      "redis_client": "one redis-benchmark process, %d connections" % c,
                      "kvpool_client": ("one process, %d connections, epoll (bench_rpc_throughput)"
                                        if evloop else "%d processes (bench_rpc_throughput)") % c},
           "machine": r["machine"], "baseline": rps,
           "baseline_what": "redis-server on a unix socket, redis-benchmark -t incr -c %d -P %d (requests/s)" % (c, d),
           "value": r["value"], "unit": "calls/s",
           "ratio": (r["value"] / rps) if rps and r["value"] is not None else None,
           "target": "ratio >= 2.00",
           "note": "" if rps else "skipped: redis-server/redis-benchmark not available"}
    extra[r["name"]] = row
out = []
for r in rows:
    out.append(r)
    if r["name"] in extra:
        out.append(extra[r["name"]])
json.dump(out, open(out_path, "w"), indent=1)

def num(v):
    if v is None:
        return "-"
    a = abs(v)
    if a >= 1e9:
        return "%.3gG" % (v / 1e9)
    if a >= 1e6:
        return "%.3gM" % (v / 1e6)
    if a >= 1e4:
        return "%.3gk" % (v / 1e3)
    return "%.4g" % v

def params(p):
    def flat(k, v):
        if isinstance(v, dict):
            return ",".join(flat(k + "." + kk, vv) for kk, vv in v.items())
        return "%s=%s" % (k, json.dumps(v) if isinstance(v, str) else v)
    return " ".join(flat(k, v) for k, v in p.items())

print()
print("kvpool benchmarks%s: machine nproc=%s kernel=%s (%d rows, %.1f s, results in %s)" % (
    " (--quick)" if quick == "1" else "", machine["nproc"], machine["kernel"], len(out),
    float(elapsed), os.path.relpath(out_path)))
print("ratio = kvpool / baseline; every baseline is measured in the same run")
hdr = "%-42s %12s %12s %-18s %8s  %s" % ("name", "kvpool", "baseline", "unit", "ratio", "target")
print(hdr)
print("-" * len(hdr))
for r in out:
    print("%-42s %12s %12s %-18s %8s  %s" % (
        r["name"], num(r["value"]), num(r["baseline"]), r["unit"][:18],
        "-" if r["ratio"] is None else "%.3f" % r["ratio"], r["target"]))
    print("    params: %s" % params(r["params"]))
    print("    baseline: %s%s" % (r["baseline_what"], ("; " + r["note"]) if r["note"] else ""))
PY
[ $? = 0 ] || failed=1
echo "bench.sh: $([ $failed = 0 ] && echo ok || echo FAILED) in $(since "$start") s"
exit $failed
