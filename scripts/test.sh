#!/usr/bin/env bash
# test.sh - installs what is missing, builds kvpool with -Werror and runs every suite (unit,
# integration, fault, gpu, remote), then the whole suite again under ASan+UBSan. GPU tests exit 77
# (skipped) on machines without a GPU. Then the Python package's tests (scripts/pytest.sh in
# .venv: pytest's own passed/failed/skipped counts join the total), a 60 s soak of 16 processes,
# each libFuzzer target for 60 s, the CUDA driver glue's race test under ThreadSanitizer, the
# format check (scripts/format.sh --check) and a --quick run of every benchmark (each counts as
# one check). Ends with one line:
# "N passed, N failed, N skipped". Between the soak and the fuzz run: the units under real
# systemd (tests/system/run.sh: Debian 12's systemd booted in a systemd-nspawn container, the
# build installed in it; the container's root is made once with debootstrap and cached in
# /var/tmp/kvpool-sysroot), one check; skipped, with the reason, where the container cannot
# be made or booted (not root, no Debian mirror, no systemd-nspawn).
#   KVP_NO_SANITIZE=1  skip the sanitizer pass
#   KVP_NO_PYTHON=1    skip the Python tests (KVP_VENV, KVP_PY_TORCH: see scripts/pytest.sh)
#   KVP_NO_FUZZ=1      skip the fuzz run        KVP_FUZZ_SECONDS=N  per target (default 60)
#   KVP_NO_BENCH=1     skip the benchmark smoke run
#   KVP_NO_SOAK=1      skip the soak run        KVP_SOAK_SECONDS=N  (default 60)
#   KVP_NO_SYSTEM=1    skip the real-systemd stage (KVP_SYSROOT_CACHE: see tests/system/run.sh)
#   KVP_NO_FORMAT=1    skip the format check
#   KVP_NO_TSAN=1      skip the ThreadSanitizer run of the CUDA driver glue's race test
#                      (build-tsan: only tests/test_cuda_drv is built; needs nvcc, else skipped)
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh || exit 1

pass=0 fail=0 skip=0
run_suite() { # builddir label [meson options]
	local dir=$1 label=$2
	shift 2
	echo "== $label: build ($dir)"
	if ! bash scripts/build.sh "$dir" -Dwerror=true "$@"; then
		echo "== $label: BUILD FAILED"
		fail=$((fail + 1))
		return
	fi
	echo "== $label: tests"
	meson test -C "$dir" --print-errorlogs --num-processes 2 \
		--suite unit --suite integration --suite fault --suite gpu --suite remote
	read -r p f s < <(python3 - "$dir/meson-logs/testlog.json" <<'PY'
import json, sys
p = f = s = 0
for line in open(sys.argv[1]):
    r = json.loads(line)["result"]
    if r in ("OK", "EXPECTEDFAIL"): p += 1
    elif r == "SKIP": s += 1
    else: f += 1
print(p, f, s)
PY
)
	echo "== $label: $p passed, $f failed, $s skipped"
	pass=$((pass + p)) fail=$((fail + f)) skip=$((skip + s))
}

run_suite build-test "tests"
if [ "${KVP_NO_SANITIZE:-0}" != 1 ]; then
	run_suite build-asan "tests under ASan+UBSan" -Db_sanitize=address,undefined \
		-Dc_args=-fno-sanitize-recover=all -Dc_link_args=-fno-sanitize-recover=all \
		-Dcuda=disabled
fi
# The Python tests: pytest's counts are added; exit 77 (no PyPI for a missing package) is one
# skipped stage, its reason printed by pytest.sh.
if [ "${KVP_NO_PYTHON:-0}" != 1 ]; then
	echo "== python tests (scripts/pytest.sh)"
	pylog=$(mktemp)
	KVP_BUILDDIR=build-test bash scripts/pytest.sh 2>&1 | tee "$pylog"
	rc=${PIPESTATUS[0]}
	sum=$(grep '^pytest.sh: ' "$pylog" | tail -1)
	if [ "$rc" = 77 ]; then
		echo "== python tests: skipped (${sum#pytest.sh: skipped: })"
		skip=$((skip + 1))
	else
		read -r p f s < <(printf '%s\n' "$sum" | awk '{
			for (i = 2; i <= NF; i++) {
				n = $(i - 1) + 0
				if ($i ~ /^passed/) p += n
				else if ($i ~ /^(failed|error)/) f += n
				else if ($i ~ /^skipped/) s += n
			}
		} END { print p + 0, f + 0, s + 0 }')
		# a failing run that counted nothing (build, install) is one failure
		[ "$rc" != 0 ] && [ "$f" = 0 ] && f=1
		echo "== python tests: $p passed, $f failed, $s skipped"
		pass=$((pass + p)) fail=$((fail + f)) skip=$((skip + s))
	fi
	rm -f "$pylog"
fi
extra() { # label command...: exit 0 passed, 77 skipped (the command printed why), else failed
	local label=$1 rc
	shift
	echo "== $label"
	"$@"
	rc=$?
	if [ "$rc" = 0 ]; then
		echo "== $label: ok"
		pass=$((pass + 1))
	elif [ "$rc" = 77 ]; then
		echo "== $label: skipped"
		skip=$((skip + 1))
	else
		echo "== $label: FAILED"
		fail=$((fail + 1))
	fi
}
[ "${KVP_NO_SOAK:-0}" != 1 ] && extra "soak (${KVP_SOAK_SECONDS:-60} s, 16 processes)" \
	meson test -C build-test --suite soak -v
[ "${KVP_NO_SYSTEM:-0}" != 1 ] && extra "system (real systemd)" \
	bash tests/system/run.sh build-test
[ "${KVP_NO_FUZZ:-0}" != 1 ] && extra "fuzz (${KVP_FUZZ_SECONDS:-60} s per target)" \
	bash scripts/fuzz.sh "${KVP_FUZZ_SECONDS:-60}"
# The CUDA driver glue's loaded-state race shows only under ThreadSanitizer: build that one test
# there (nvcc is needed to configure with -Dcuda=enabled) and run it.
tsan_cuda_drv() {
	[ -f build-tsan/build.ninja ] ||
		meson setup build-tsan -Db_sanitize=thread -Dcuda=enabled -Dpython=disabled \
			-Dremote=disabled -Dwerror=true >/dev/null || return 1
	ninja -C build-tsan tests/test_cuda_drv >/dev/null || return 1
	TSAN_OPTIONS=halt_on_error=1 build-tsan/tests/test_cuda_drv
}
if [ "${KVP_NO_TSAN:-0}" != 1 ]; then
	if PATH="$PATH:/usr/local/cuda/bin" command -v nvcc >/dev/null; then
		PATH="$PATH:/usr/local/cuda/bin" extra "cuda_drv under ThreadSanitizer" tsan_cuda_drv
	else
		echo "== cuda_drv under ThreadSanitizer: skipped (no nvcc)"
		skip=$((skip + 1))
	fi
fi
[ "${KVP_NO_FORMAT:-0}" != 1 ] && extra "format (.clang-format)" bash scripts/format.sh --check
[ "${KVP_NO_BENCH:-0}" != 1 ] && extra "benchmarks --quick" bash scripts/bench.sh --quick
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
