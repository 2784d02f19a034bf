#!/usr/bin/env bash
# gpu_check_dryrun.sh BUILDDIR - scripts/gpu-check.sh --dry-run against this build (it needs no
# release build: see the script's header): every step is in the summary, the bundle check passed
# (every ELF file resolves its libraries from the collected folder, under 64 MiB), no step
# failed, the GPU steps ran their binaries and stopped where a GPU is needed, bench-results.json
# holds the CUDA rows. Then the same with a library taken out of the bundle: the bundle check
# must fail and say which. Exits 77 when the build has no CUDA.
set -uo pipefail
build=$1
src=${KVP_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
tmp=$(mktemp -d /tmp/kvpool-gpu-dryrun-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() {
	echo "gpu_check_dryrun: $*" >&2
	echo "--- summary:" >&2
	cat "$tmp/out/summary.txt" >&2 2>/dev/null
	exit 1
}

t0=$(date +%s)
OUT=$tmp/out bash "$src/scripts/gpu-check.sh" --dry-run --build "$build" >"$tmp/stdout" \
	2>"$tmp/stderr"
rc=$?
if [ "$rc" = 77 ]; then
	grep -h 'without CUDA' "$tmp/out/summary.txt"
	exit 77
fi
[ "$rc" = 0 ] || fail "exit $rc"
s=$tmp/out/summary.txt
for step in bundle gpu-info test_kv_copy_cuda test_cuda_tier test_cuda_pool bench \
	test_cuda_reclaim test_cuda_restart python vllm-copy vllm-kv-memory sglang; do
	n=$(grep -cE "^(PASS|FAIL|SKIP) +$step " "$s")
	[ "$n" = 1 ] || fail "step $step: $n summary lines"
done
grep -qE '^PASS +bundle ' "$s" || fail "the bundle check did not pass"
grep -qE '^FAIL ' "$s" && fail "a step failed"
grep -q '^bundle size: [0-9]* MiB' "$s" || fail "no bundle size figure"
size=$(sed -n 's/^bundle size: [0-9]* MiB (\([0-9]*\) bytes.*/\1/p' "$s")
[ -n "$size" ] && [ "$size" -gt 0 ] || fail "bundle size $size"
# a debug build (every test binary, -g) may exceed what --prepare's release build carries: the
# script must then say the limit is enforced at --prepare, never pass silently
[ "$size" -le $((64 << 20)) ] || grep -q '^bundle size: over the limit in this .* build; enforced at --prepare' "$s" ||
	fail "bundle size $size over 64 MiB"
for lib in liburing libnuma libprotobuf-c libinih; do
	ls "$tmp/out/libs/$lib".so.* >/dev/null 2>&1 || fail "$lib not collected"
done
# on this machine (no GPU) every GPU binary ran and exited 77; with a GPU they pass
for t in test_kv_copy_cuda test_cuda_tier test_cuda_pool test_cuda_reclaim test_cuda_restart; do
	grep -qE "^SKIP +$t .*(exit 77|a GPU is here)" "$s" || fail "$t did not run to its skip"
done
grep -qE '^SKIP +bench .*6 CUDA rows' "$s" || fail "bench: not 6 CUDA rows"
python3 - "$tmp/out/bench-results.json" <<'PY' || fail "bench-results.json"
import json, sys
rows = json.load(open(sys.argv[1]))
names = {r["name"] for r in rows}
need = {"copy.demote.cuda", "copy.promote.cuda", "copy.demote.cuda_vs_pcie",
        "copy.promote.cuda_vs_pcie", "pool.alloc_free.cuda", "pool.match_release.cuda",
        "copy.demote.cpu", "copy.promote.cpu"}
sys.exit(0 if need <= names else "missing rows: %s" % sorted(need - names))
PY
[ -s "$tmp/out/gpu-check.log" ] || fail "no gpu-check.log"
echo "dry run: $(grep -c '' "$s") summary lines in $(($(date +%s) - t0)) s"
sed -n '1,/^$/p' "$s"

# a bundle without libnuma: the check names what resolves outside it and the run fails
mkdir "$tmp/short"
cp "$tmp/out/libs/"* "$tmp/short/"
rm "$tmp/short/"libnuma.so.*
OUT=$tmp/out2 bash "$src/scripts/gpu-check.sh" --dry-run --build "$build" --libs "$tmp/short" \
	>/dev/null 2>&1
rc=$?
[ "$rc" = 1 ] || fail "a bundle without libnuma: exit $rc, not 1"
grep -qE '^FAIL +bundle ' "$tmp/out2/summary.txt" || fail "a bundle without libnuma passed"
grep -q 'libnuma.so.1 from .*not from the bundle' "$tmp/out2/steps/bundle.log" ||
	fail "the bundle log does not name libnuma"
echo "a bundle without libnuma fails: ok"
