#!/usr/bin/env bash
# gpu-check.sh MODE [--build DIR] - builds, carries and runs kvpool's GPU checks: the gpu suite,
# the CUDA benchmark rows, the Python views, kill -9 reclaim cycles and restarts (the cuda
# tier's fd through the fd store, SIGTERM with a cuda pool), on a machine with a GPU that has
# no package registry and no Debian -dev libraries (nvcc, meson, ninja, python3 there).
#
# Modes
#   --prepare  (here, on the build machine) builds DIR (default build-gpu) for release with
#              -Dcuda=enabled (and -Dwerror=false: gcc -O3 warns where the debug build does
#              not), copies the shared libraries its binaries link that a bare machine lacks
#              (liburing, libnuma, libprotobuf-c, libinih, libmicrohttpd, libcunit, libsystemd
#              and what those pull in) into DIR/libs (the C++ runtime apart, in
#              DIR/libs-cxx, used only when the device's own does not do), writes
#              DIR/gpu-bundle.txt, then runs the bundle check below. The build dir is the bundle.
#   --device   (on the GPU machine) every step for real; a GPU is expected, so a test that exits
#              77 (no GPU) counts as FAIL.
#   --dry-run  (here, CI) the same steps, stopping where a GPU is needed: each GPU step checks its
#              binaries exist and their libraries resolve, runs them (on a machine without a GPU
#              they must exit 77, or skip their CUDA rows) and reports "SKIP: dry run, no GPU".
#              It writes nothing into DIR: when DIR was not prepared (no DIR/libs), the libraries
#              are collected into $OUT/libs and the bundle check runs on DIR + those, so CI checks
#              the same collection and size figure --prepare would give without a release
#              build (too slow for a 2-minute test on 2 cores). A build without CUDA: exit 77.
#
# --libs LIBS (with --device or --dry-run) checks and uses the libraries in LIBS (and LIBS-cxx)
# instead of DIR/libs: the dry-run test uses it to see a bundle that lacks one library fail.
#
# Every step has its own timeout and the whole run a deadline (KVP_GPU_CHECK_SECONDS, 450 s:
# under 8 minutes with the transfers); a failing step does not stop the others. Written under
# $OUT (a fresh temporary folder when unset): gpu-check.log (everything), steps/NAME.log (each
# step's output), summary.txt (one PASS/FAIL/SKIP line per step, then the key figures),
# bench-results.json (the benchmark rows, as scripts/bench.sh writes them). Exit status: 0 when
# no step failed, 1 otherwise, 2 on bad usage, 77 for --dry-run on a build without CUDA.
#
# On the device, with the `run` tool (at most 8 carried ignored paths, 64 MiB in all; the
# prepared build-gpu measured 29 MiB: 17 MiB of build (only the binaries the steps run, see
# device_bins), 10 MiB in libs, 2.2 MiB in libs-cxx; --prepare prints the figure and fails over
# 64 MiB):
#   here:   bash scripts/gpu-check.sh --prepare
#   device: run(carry=["build-gpu"], command="bash scripts/gpu-check.sh --device", timeout_s=540)
# then read $OUT/summary.txt first, the step logs for what failed. Nothing is rebuilt there: the
# test binaries run directly from the carried build with the environment meson gives them
# (KVPOOLD, KVPOOLCTL, KVPOOL_LOADGEN, KVP_SRCDIR) and LD_LIBRARY_PATH=build-gpu/libs, so meson
# never reconfigures. The Python step imports kvpool from DIR/python or python/ and runs
# tests/python with pytest when both are there; it reports SKIP with the reason otherwise. The
# vllm-copy step measures kvpool.vllm's copies (tests/python/test_vllm_cuda.py: the rows
# vllm.cuda.store and vllm.cuda.load against cudaMemcpyAsync of the same bytes, each ratio at
# least 0.9 or the step fails) where torch with CUDA imports on the device, and reports SKIP
# with the reason otherwise. --prepare puts the kvpool package (the stable-ABI wheel of this
# tree, for the device's python3) in DIR/python-pkg, which the Python steps import first. The
# vllm-kv-memory step runs test_vllm_cuda.py's test_kv_memory_in_cuda_tier: vLLM's KV cache
# buffer allocated from a run lease of a cuda device tier (kvpool.vllm_mem), its bytes in the
# run's pages; a skip there (no torch with CUDA) is a SKIP with the reason, a skip of the test
# itself a FAIL.
# The sglang step runs tests/python/test_sglang_cuda.py (KvpoolLinker on CUDA KV pools, the
# platform plugin on a cuda device tier) where torch with CUDA and sglang import, SKIP with the
# reason otherwise.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
root=$PWD
mode=
dir=build-gpu
libs_opt=
while [ $# -gt 0 ]; do
	case $1 in
	--prepare | --device | --dry-run) mode=${1#--} ;;
	--build) dir=${2:?--build needs a folder}; shift ;;
	--build=*) dir=${1#--build=} ;;
	--libs) libs_opt=${2:?--libs needs a folder}; shift ;;
	-h | --help) sed -n '2,48p' "$0"; exit 0 ;;
	*) echo "gpu-check.sh: unknown argument $1" >&2; exit 2 ;;
	esac
	shift
done
[ -n "$mode" ] || { echo "gpu-check.sh: give --prepare, --device or --dry-run" >&2; exit 2; }
case $dir in /*) ;; *) dir=$root/$dir ;; esac

if [ -z "${OUT:-}" ]; then
	OUT=$(mktemp -d /tmp/kvpool-gpu-check-XXXXXX)
fi
mkdir -p "$OUT/steps"
log_file=$OUT/gpu-check.log
summary=$OUT/summary.txt
figures=$OUT/figures.txt
: >"$log_file"
: >"$summary"
: >"$figures"
start=$(date +%s)
deadline=$((start + ${KVP_GPU_CHECK_SECONDS:-450}))
failed=0
limit_bytes=$((64 << 20))

log() { printf '%s\n' "$*" | tee -a "$log_file" >&2; }
figure() { printf '%s\n' "$*" >>"$figures"; log "   figure: $*"; }

# verdict STEP PASS|FAIL|SKIP DETAIL
verdict() {
	printf '%-4s  %-22s %5ss  %s\n' "$2" "$1" "$(($(date +%s) - step_t0))" "$3" >>"$summary"
	log "== $1: $2${3:+: $3}"
	[ "$2" = FAIL ] && failed=1
	return 0
}

# budget WANT: seconds a step may take (WANT, less when the deadline is near; 0: none left)
budget() {
	local left=$((deadline - $(date +%s) - 5))
	[ "$left" -lt 5 ] && { echo 0; return; }
	[ "$1" -lt "$left" ] && echo "$1" || echo "$left"
}

# begin STEP: starts a step; its output goes to steps/STEP.log and the main log
begin() {
	step=$1
	step_t0=$(date +%s)
	step_log=$OUT/steps/$1.log
	: >"$step_log"
	log "== $1 ($(date -u +%H:%M:%S))"
}

# tee_step CMD...: runs CMD with its output in the step log and the main log
tee_step() { "$@" 2>&1 | tee -a "$step_log" >>"$log_file"; return "${PIPESTATUS[0]}"; }

# ---- the bundle: which libraries travel, and the checks --------------------------------------

# glibc's own libraries: every Linux machine has them (the device's are checked by ldd)
is_glibc() {
	case $1 in
	linux-vdso.so* | linux-gate.so* | ld-linux*.so* | libc.so.* | libm.so.* | libdl.so.* | \
		libpthread.so.* | librt.so.* | libresolv.so.* | libutil.so.* | libanl.so.* | \
		libmvec.so.*) return 0 ;;
	esac
	return 1
}
is_cxx() { case $1 in libstdc++.so.* | libgcc_s.so.*) return 0 ;; esac; return 1; }

# The ELF files of the build that run on the device: executables and shared libraries.
# buildtype: DIR's meson buildtype (release, debugoptimized, ...), "?" when unknown
buildtype() {
	python3 -c 'import json, sys
for o in json.load(open(sys.argv[1])):
    if o["name"] == "buildtype": print(o["value"])' "$dir/meson-info/intro-buildoptions.json" \
		2>/dev/null || echo "?"
}

elf_files() {
	find "$dir" \( -name '*.p' -o -name 'meson-*' -o -name libs -o -name libs-cxx \) -prune -o \
		-type f \( -perm -u+x -o -name '*.so*' \) -print |
		while read -r f; do
			[ "$(head -c 4 "$f" | od -An -c | tr -d ' ')" = '177ELF' ] && echo "$f"
		done
}

# collect_libs DEST DEST_CXX: copies every library the ELF files resolve to outside the build
# folder, except glibc's, under the name ldd gives (the soname)
collect_libs() {
	local dest=$1 dest_cxx=$2 name path
	mkdir -p "$dest" "$dest_cxx"
	elf_files | while read -r f; do ldd "$f" 2>/dev/null; done |
		awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' | sort -u |
		while read -r name path; do
			is_glibc "$name" && continue
			case $path in "$dir"/*) continue ;; esac
			if is_cxx "$name"; then
				cp -L "$path" "$dest_cxx/$name"
			else
				cp -L "$path" "$dest/$name"
			fi
		done
}

libpath=
# bundle_check LIBS LIBS_CXX: every ELF resolves with LD_LIBRARY_PATH=LIBS (plus LIBS_CXX when
# needed), each non-glibc library from the bundle or the build (here) and nothing missing; the
# glibc version the binaries need; the size of what travels. Sets libpath.
bundle_check() {
	local libs=$1 cxx=$2 bad=0 n=0 missing=0 outside=0 size need have f out name path
	local -a elfs
	mapfile -t elfs < <(elf_files)
	if [ ! -d "$libs" ] || [ -z "$(ls -A "$libs")" ]; then
		verdict bundle FAIL "no libraries in $libs (run --prepare here first)"
		return
	fi
	libpath=$libs
	# the machine's own C++ runtime first; the bundled one when something is then missing
	for f in "${elfs[@]}"; do
		if LD_LIBRARY_PATH=$libpath ldd "$f" 2>&1 | grep -q 'not found'; then
			libpath=$libs:$cxx
			break
		fi
	done
	for f in "${elfs[@]}"; do
		n=$((n + 1))
		out=$(LD_LIBRARY_PATH=$libpath ldd "$f" 2>&1)
		if printf '%s\n' "$out" | grep -q 'not found'; then
			printf '%s\n' "$out" | grep 'not found' | sed "s|^|  ${f#"$dir"/}: |" >>"$step_log"
			missing=$((missing + 1))
			continue
		fi
		# here the system has every library too: ldd must find the bundled copy first
		[ "$mode" = device ] && continue
		printf '%s\n' "$out" | awk '$2 == "=>" { print $1, $3 }' >"$OUT/resolved.txt"
		: >"$OUT/outside.txt"
		while read -r name path; do
			is_glibc "$name" && continue
			[ "$libpath" = "$libs" ] && is_cxx "$name" && continue
			case $path in
			"$libs"/* | "$cxx"/* | "$dir"/*) ;;
			*) echo "  ${f#"$dir"/}: $name from $path, not from the bundle" >>"$OUT/outside.txt" ;;
			esac
		done <"$OUT/resolved.txt"
		if [ -s "$OUT/outside.txt" ]; then
			cat "$OUT/outside.txt" >>"$step_log"
			outside=$((outside + 1))
		fi
	done
	need=$(grep -aoh 'GLIBC_2\.[0-9]*' "${elfs[@]}" | sort -uV | tail -1)
	have=$(ldd --version 2>&1 | head -1 | awk '{ print $NF }')
	# what travels: the build without its object folders (*.p, removed by --prepare: nothing
	# is rebuilt on the device), plus the libraries when they lie outside it
	case $libs in
	"$dir"/*) size=$(du -scb --exclude='*.p' "$dir" | tail -1 | cut -f1) ;;
	*) size=$(du -scb --exclude='*.p' "$dir" "$libs" "$cxx" 2>/dev/null | tail -1 | cut -f1) ;;
	esac
	figure "bundle: $n ELF files; ${libs#"$root"/}: $(ls "$libs" | tr '\n' ' ')" \
		"$([ "$libpath" != "$libs" ] && echo "; with ${cxx#"$root"/}: $(ls "$cxx" | tr '\n' ' ')")"
	figure "bundle size: $((size / 1048576)) MiB ($size bytes; limit $limit_bytes)"
	figure "glibc: the binaries need ${need:-?}, this machine has ${have:-?}"
	[ "$missing" = 0 ] || bad=1
	[ "$outside" = 0 ] || bad=1
	if [ "$size" -gt "$limit_bytes" ]; then
		# a dry run on a debug build (-g, every test binary) overstates what --prepare's
		# release build carries; --prepare and --device enforce the limit
		if [ "$mode" = dry-run ] && [ "$(buildtype)" != release ]; then
			figure "bundle size: over the limit in this $(buildtype) build; enforced at --prepare"
		else
			bad=1
		fi
	fi
	size=$((size / 1048576))
	if [ "$bad" = 0 ]; then
		verdict bundle PASS \
			"$n ELF files resolve with LD_LIBRARY_PATH=${libpath//"$root"\//}; $size MiB"
	else
		verdict bundle FAIL "$missing ELF files with missing libraries, $outside resolving" \
			"outside the bundle, $size MiB (limit 64): see steps/bundle.log"
	fi
}

# ---- modes -----------------------------------------------------------------------------------

have_cuda() { grep -q '^#define KVP_HAVE_CUDA 1' "$dir/kvp_config.h" 2>/dev/null; }
# the test and bench binaries the device steps below run (--prepare carries only these)
device_bins="tests/test_kv_copy_cuda tests/test_cuda_tier tests/test_cuda_pool"
device_bins="$device_bins tests/test_cuda_reclaim tests/test_cuda_restart"
device_bins="$device_bins tests/bench/bench_copy tests/bench/bench_cuda_pool"

log "gpu-check.sh --$mode: build $dir, output $OUT, $(date -u +%FT%TZ)"
log "   $(uname -srm); commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"

if [ "$mode" = prepare ]; then
	begin build
	[ -d /usr/local/cuda/bin ] && export PATH="$PATH:/usr/local/cuda/bin"
	if [ -f "$dir/build.ninja" ]; then
		tee_step meson configure "$dir" -Dbuildtype=release -Dcuda=enabled -Dtests=true \
			-Dwerror=false
	fi
	if tee_step bash scripts/build.sh "$dir" -Dbuildtype=release -Dcuda=enabled -Dtests=true \
		-Dwerror=false &&
		have_cuda; then
		verdict build PASS "release build with CUDA in ${dir#"$root"/}"
	else
		verdict build FAIL "see steps/build.log"
		cat "$summary"
		exit 1
	fi
	begin bundle
	find "$dir" -name '*.p' -type d -prune -exec rm -rf {} +
	# only the test and bench binaries the device steps run travel (about 1 MiB each, some
	# 70 of them: together past the 64 MiB a carry takes)
	find "$dir/tests" -type f \( -name 'test_*' -o -name 'bench_*' -o -name '*.a' -o \
		-name 'kvpool-system-*' \) | while read -r f; do
		case " $device_bins " in *" ${f#"$dir"/} "*) ;; *) rm -f "$f" ;; esac
	done
	# the kvpool package as the device's python3 (3.12, with torch) imports it: the stable-ABI
	# wheel of this tree (the venv's meson-python; the system meson builds a 3.11-only
	# extension), unpacked into DIR/python-pkg, which the python and vllm-copy steps import
	# first; its extension's libraries travel in DIR/libs like the rest
	rm -rf "$dir/python-pkg"
	whl=$(mktemp -d)
	if [ -x .venv/bin/python ] && .venv/bin/python -c 'import mesonpy' 2>/dev/null &&
		PATH=$root/.venv/bin:$PATH tee_step .venv/bin/python -m pip \
			--disable-pip-version-check -q wheel --no-deps --no-build-isolation \
			-Csetup-args=-Dbuildtype=release -w "$whl" . &&
		python3 -m zipfile -e "$whl"/kvpool-*.whl "$dir/python-pkg"; then
		find "$dir/python-pkg" -maxdepth 1 -name '*.dist-info' -exec rm -rf {} +
		log "   the kvpool package: $(ls "$whl") in ${dir#"$root"/}/python-pkg"
	else
		rm -rf "$dir/python-pkg"
		log "   no kvpool wheel (.venv with meson-python missing, or the wheel build failed):" \
			"the python and vllm-copy steps will skip on the device"
	fi
	rm -rf "$whl"
	rm -rf "$dir/libs" "$dir/libs-cxx"
	collect_libs "$dir/libs" "$dir/libs-cxx"
	{
		echo "kvpool GPU bundle: $(date -u +%FT%TZ), commit $(git rev-parse HEAD 2>/dev/null)"
		echo "built on: $(uname -srm), $(ldd --version | head -1)"
		echo "libs: $(ls "$dir/libs" | tr '\n' ' ')"
		echo "libs-cxx: $(ls "$dir/libs-cxx" | tr '\n' ' ')"
	} >"$dir/gpu-bundle.txt"
	bundle_check "$dir/libs" "$dir/libs-cxx"
	cat "$summary" "$figures"
	rel=${dir#"$root"/}
	opt=
	[ "$rel" = build-gpu ] || opt=" --build $rel"
	echo "device: run(carry=[\"$rel\"], command=\"bash scripts/gpu-check.sh --device$opt\"," \
		"timeout_s=540)"
	exit $failed
fi

# ---- the steps (--device, --dry-run) -----------------------------------------------------------

begin bundle
if [ ! -d "$dir" ]; then
	verdict bundle FAIL "no build folder $dir"
elif ! have_cuda; then
	verdict bundle SKIP "$dir was built without CUDA (nvcc absent or -Dcuda=disabled)"
	cat "$summary"
	[ "$mode" = dry-run ] && exit 77
	exit 1
elif [ -n "$libs_opt" ]; then
	bundle_check "$libs_opt" "$libs_opt-cxx"
elif [ -d "$dir/libs" ]; then
	bundle_check "$dir/libs" "$dir/libs-cxx"
elif [ "$mode" = dry-run ]; then
	log "   ${dir#"$root"/} was not prepared: collecting its libraries into $OUT/libs"
	collect_libs "$OUT/libs" "$OUT/libs-cxx"
	bundle_check "$OUT/libs" "$OUT/libs-cxx"
else
	verdict bundle FAIL "$dir/libs missing: run scripts/gpu-check.sh --prepare before carrying"
fi
export LD_LIBRARY_PATH=${libpath:+$libpath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}
export KVPOOLD=$dir/daemon/kvpoold KVPOOLCTL=$dir/client/kvpoolctl
export KVPOOL_LOADGEN=$dir/client/kvpool-loadgen KVP_SRCDIR=$root
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
# a carried tree may lose the executable bits
for f in "$KVPOOLD" "$KVPOOLCTL" "$KVPOOL_LOADGEN" "$dir"/tests/test_* \
	"$dir"/tests/bench/bench_*; do
	[ -f "$f" ] && [ ! -x "$f" ] && chmod u+x "$f"
done

begin gpu-info
if command -v nvidia-smi >/dev/null 2>&1; then
	tee_step timeout 30 nvidia-smi
	q=name,driver_version,memory.total,memory.used,pcie.link.gen.max,pcie.link.gen.current
	q=$q,pcie.link.width.max,pcie.link.width.current
	info=$(timeout 30 nvidia-smi --query-gpu=$q --format=csv,noheader 2>&1)
	printf '%s\n' "$info" >>"$step_log"
	figure "gpu: $q = $info"
	verdict gpu-info PASS "$(printf '%s' "$info" | head -1)"
else
	verdict gpu-info SKIP \
		"nvidia-smi not installed$([ "$mode" = dry-run ] && echo '; dry run, no GPU')"
fi
log "   io_uring_disabled=$(cat /proc/sys/kernel/io_uring_disabled 2>/dev/null || echo '?')" \
	"memlock=$(ulimit -l) nproc=$(nproc)"

# check_bin PATH: exists, is executable, its libraries resolve (a FAIL verdict otherwise)
check_bin() {
	if [ ! -x "$1" ]; then
		verdict "$step" FAIL "${1#"$root"/} missing"
		return 1
	fi
	if ldd "$1" 2>&1 | grep -q 'not found'; then
		ldd "$1" >>"$step_log" 2>&1
		verdict "$step" FAIL "${1#"$root"/}: libraries missing (steps/$step.log)"
		return 1
	fi
	return 0
}

# cunit_counts LOG: "N tests, N passed, N failed" from CUnit's run summary, or the SKIP line
cunit_counts() {
	awk '$1 == "tests" && NF >= 5 { t = $2; p = $4; f = $5 }
	     /^SKIP:/ { s = $0 }
	     END { if (t != "") printf "%s tests, %s passed, %s failed", t, p, f
		   else if (s) print s }' "$1"
}

# gpu_test NAME SECS: one test binary of the gpu suite
gpu_test() {
	local bin=$dir/tests/$1 t rc counts
	begin "$1"
	check_bin "$bin" || return
	t=$(budget "$2")
	[ "$t" = 0 ] && { verdict "$1" FAIL "no time left before the deadline"; return; }
	(cd "$dir/tests" && tee_step timeout -k 5 "$t" "$bin")
	rc=$?
	counts=$(cunit_counts "$step_log")
	case $mode/$rc in
	dry-run/0) verdict "$1" SKIP "dry run, but it passed: a GPU is here ($counts)" ;;
	device/0) verdict "$1" PASS "${counts:-exit 0}" ;;
	dry-run/77) verdict "$1" SKIP "dry run, no GPU (ran, exit 77: $counts)" ;;
	device/77) verdict "$1" FAIL "skipped on the device, a GPU was expected: $counts" ;;
	*/124 | */137) verdict "$1" FAIL "timed out after ${t}s ($counts)" ;;
	*) verdict "$1" FAIL "exit $rc ($counts)" ;;
	esac
	figure "$1: exit $rc, ${counts:-no summary}"
}

# 1. the gpu suite
gpu_test test_kv_copy_cuda 120
gpu_test test_cuda_tier 120
gpu_test test_cuda_pool 120

# 2. the CUDA benchmark rows
begin bench
rows=$OUT/bench-rows.jsonl
: >"$rows"
bench_ok=1
qarg=
[ "$mode" = dry-run ] && qarg=--quick
for b in bench_copy bench_cuda_pool; do
	bin=$dir/tests/bench/$b
	check_bin "$bin" || { bench_ok=0; continue; }
	t=$(budget 150)
	[ "$t" = 0 ] && { bench_ok=0; log "   $b: no time left"; continue; }
	(cd "$dir/tests/bench" &&
		timeout -k 5 "$t" "$bin" $qarg >"$OUT/steps/$b.out" 2>"$OUT/steps/$b.err")
	rc=$?
	cat "$OUT/steps/$b.out" "$OUT/steps/$b.err" >>"$step_log"
	grep '^{' "$OUT/steps/$b.out" >>"$rows"
	if [ "$rc" != 0 ]; then
		log "   $b: exit $rc: $(tail -3 "$OUT/steps/$b.err")"
		bench_ok=0
	fi
done
{ echo '['; paste -sd, "$rows"; echo ']'; } >"$OUT/bench-results.json"
cuda_row='"name":"\(copy\.[a-z]*\.cuda\|pool\.[a-z_]*\.cuda\)'
ncuda=$(grep -c "$cuda_row" "$rows")
nskipped=$(grep "$cuda_row" "$rows" | grep -c '"note":"skipped')
if command -v python3 >/dev/null 2>&1; then
	python3 - "$rows" >>"$figures" <<'PY' || bench_ok=0
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    if ".cuda" not in r["name"]:
        continue
    f = lambda v: "-" if v is None else "%.4g" % v
    print("bench %-26s %10s %-8s baseline %10s ratio %6s  (%s)%s" % (
        r["name"], f(r["value"]), r["unit"], f(r["baseline"]), f(r["ratio"]), r["target"],
        ("  " + r["note"]) if r["note"] else ""))
PY
fi
if [ "$bench_ok" = 0 ] || [ "$ncuda" -lt 6 ]; then
	verdict bench FAIL \
		"$ncuda CUDA rows (6 expected), a benchmark failed or timed out: steps/bench.log"
elif [ "$mode" = dry-run ]; then
	verdict bench SKIP "dry run, no GPU ($ncuda CUDA rows, $nskipped skipped; bench-results.json)"
elif [ "$nskipped" != 0 ]; then
	verdict bench FAIL "$nskipped of $ncuda CUDA rows skipped on the device: steps/bench.log"
else
	verdict bench PASS "$ncuda CUDA rows in bench-results.json (figures below)"
fi

# 4. kill -9 reclaim cycles (before the Python step: it matters more)
smi_mem() {
	command -v nvidia-smi >/dev/null 2>&1 || return 0
	figure "nvidia-smi $1: used, total = $(timeout 20 nvidia-smi \
		--query-gpu=memory.used,memory.total --format=csv,noheader 2>&1 | tr '\n' ' ')"
	{
		echo "== $1"
		timeout 20 nvidia-smi --query-compute-apps=pid,process_name,used_memory \
			--format=csv,noheader 2>&1
	} >>"$OUT/steps/nvidia-smi.log"
}
smi_mem "before the reclaim cycles"
gpu_test test_cuda_reclaim 240
smi_mem "after the reclaim cycles"
grep -o '[0-9]* cycles: kvpoold fds.*' "$OUT/steps/test_cuda_reclaim.log" |
	while read -r l; do figure "reclaim: $l"; done

# 5. restarts: the device tier's exported fd through the fd store (tests/lib/fdsup.c plays
# systemd), SIGTERM to a kvpoold with a cuda pool (exit 0 once serving)
gpu_test test_cuda_restart 120
grep -E '^(cuda tier through the fd store|SIGTERM .*: exit|SIGTERM with a cuda pool)' \
	"$OUT/steps/test_cuda_restart.log" | while read -r l; do figure "restart: $l"; done

# 6. the Python views
begin python
pyp=$dir/python-pkg:$dir/python:$root/python${PYTHONPATH:+:$PYTHONPATH}
if ! command -v python3 >/dev/null 2>&1; then
	verdict python SKIP "python3 not installed"
else
	py=$(PYTHONPATH=$pyp timeout 60 python3 -c 'import kvpool; print(kvpool.__file__)' 2>&1)
	rc=$?
	printf '%s\n' "$py" >>"$step_log"
	if [ "$rc" != 0 ]; then
		verdict python SKIP "the kvpool Python package is absent: $(printf '%s' "$py" | tail -1)"
	elif [ "$mode" = dry-run ]; then
		verdict python SKIP "dry run, no GPU (kvpool imports from $py)"
	elif [ ! -d "$root/tests/python" ]; then
		verdict python FAIL "kvpool imports from $py but tests/python is missing"
	elif ! python3 -c 'import pytest' >/dev/null 2>&1; then
		verdict python SKIP "pytest not installed (kvpool imports from $py)"
	else
		t=$(budget 150)
		if [ "$t" = 0 ]; then
			verdict python FAIL "no time left before the deadline"
		else
			PYTHONPATH=$pyp tee_step timeout -k 5 "$t" python3 -m pytest -q -rs tests/python
			rc=$?
			res=$(grep -E '[0-9]+ (passed|failed|skipped|error)' "$step_log" | tail -1)
			figure "python: exit $rc, $res"
			if [ "$rc" = 0 ] && ! printf '%s' "$res" | grep -q skipped; then
				verdict python PASS "$res"
			else
				verdict python FAIL "exit $rc: $res (steps/python.log)"
			fi
		fi
	fi
fi

# 7. kvpool.vllm's copies between CUDA block tensors and registered host pages: the rows
# vllm.cuda.store and vllm.cuda.load (tests/python/test_vllm_cuda.py; torch on the device)
begin vllm-copy
pyp=$dir/python-pkg:$dir/python:$root/python${PYTHONPATH:+:$PYTHONPATH}
if [ "$mode" = dry-run ]; then
	verdict vllm-copy SKIP "dry run, no GPU"
elif ! command -v python3 >/dev/null 2>&1; then
	verdict vllm-copy SKIP "python3 not installed"
elif ! why=$(cd "$root/tests/python" && PYTHONPATH=$pyp timeout 120 python3 -c '
import torch, kvpool.vllm_copy
assert torch.cuda.is_available(), "torch sees no CUDA device"' 2>&1); then
	verdict vllm-copy SKIP "torch with CUDA or kvpool does not import: $(printf '%s' "$why" |
		tail -1)"
else
	t=$(budget 120)
	if [ "$t" = 0 ]; then
		verdict vllm-copy FAIL "no time left before the deadline"
	else
		(cd "$root/tests/python" && PYTHONPATH=$pyp timeout -k 5 "$t" python3 \
			test_vllm_cuda.py >"$OUT/steps/vllm-copy.out" 2>"$OUT/steps/vllm-copy.err")
		rc=$?
		cat "$OUT/steps/vllm-copy.out" "$OUT/steps/vllm-copy.err" >>"$step_log"
		grep '^{' "$OUT/steps/vllm-copy.out" >>"$rows"
		{ echo '['; paste -sd, "$rows"; echo ']'; } >"$OUT/bench-results.json"
		n=$(grep -c '"name": "vllm\.cuda\.' "$OUT/steps/vllm-copy.out")
		# the target: each row at least 0.9 of cudaMemcpyAsync of the same bytes
		low=$(python3 - "$OUT/steps/vllm-copy.out" "$figures" <<'PY'
import json, sys
low = []
with open(sys.argv[2], "a") as fig:
    for l in open(sys.argv[1]):
        if l.startswith("{"):
            r = json.loads(l)
            f = lambda v: "-" if v is None else "%.4g" % v
            print("bench %-26s %10s %-8s baseline %10s ratio %6s  (%s)" % (
                r["name"], f(r["value"]), r["unit"], f(r["baseline"]), f(r["ratio"]),
                r["target"]), file=fig)
            if r["ratio"] is None or r["ratio"] < 0.9:
                low.append("%s %s" % (r["name"], f(r["ratio"])))
print(", ".join(low))
PY
		)
		if [ "$rc" = 0 ] && [ "$n" = 2 ] && [ -z "$low" ]; then
			verdict vllm-copy PASS "2 rows, each ratio >= 0.9 of cudaMemcpyAsync (figures below)"
		elif [ "$rc" = 0 ] && [ "$n" = 2 ]; then
			verdict vllm-copy FAIL "below 0.9 of cudaMemcpyAsync: $low (steps/vllm-copy.log)"
		else
			verdict vllm-copy FAIL "exit $rc, $n of 2 rows (steps/vllm-copy.log)"
		fi
	fi
fi

# 8. vLLM's KV cache buffer in a cuda device tier (kvpool.vllm_mem, as KvpoolConnector's
# get_mem_pool_context uses it): tests/python/test_vllm_cuda.py::test_kv_memory_in_cuda_tier
# (torch on the device; vLLM itself is not needed)
begin vllm-kv-memory
if [ "$mode" = dry-run ]; then
	verdict vllm-kv-memory SKIP "dry run, no GPU"
elif ! command -v python3 >/dev/null 2>&1; then
	verdict vllm-kv-memory SKIP "python3 not installed"
elif ! why=$(cd "$root/tests/python" && PYTHONPATH=$pyp timeout 120 python3 -c '
import torch, kvpool.vllm_mem
assert torch.cuda.is_available(), "torch sees no CUDA device"' 2>&1); then
	verdict vllm-kv-memory SKIP "torch with CUDA or kvpool does not import: $(printf '%s' "$why" |
		tail -1)"
elif ! python3 -c 'import pytest' >/dev/null 2>&1; then
	verdict vllm-kv-memory SKIP "pytest not installed"
else
	t=$(budget 120)
	if [ "$t" = 0 ]; then
		verdict vllm-kv-memory FAIL "no time left before the deadline"
	else
		(cd "$root/tests/python" && PYTHONPATH=$pyp tee_step timeout -k 5 "$t" python3 -m \
			pytest -q -rs -s -p no:cacheprovider test_vllm_cuda.py -k kv_memory)
		rc=$?
		res=$(grep -E '[0-9]+ (passed|failed|skipped|error)' "$step_log" | tail -1)
		grep -o 'kv memory: .*' "$step_log" | while read -r l; do figure "$l"; done
		if [ "$rc" = 0 ] && printf '%s' "$res" | grep -q '1 passed' &&
			! printf '%s' "$res" | grep -q skipped; then
			verdict vllm-kv-memory PASS "$res"
		else
			verdict vllm-kv-memory FAIL "exit $rc: $res (steps/vllm-kv-memory.log)"
		fi
	fi
fi

# 9. kvpool.sglang on CUDA: KvpoolLinker with SGLang's KV pool on the GPU, and the platform
# plugin's KV pool over a cuda device tier (tests/python/test_sglang_cuda.py; torch with CUDA
# and sglang on the device, else SKIP with the reason)
begin sglang
pyp=$dir/python-pkg:$dir/python:$root/python${PYTHONPATH:+:$PYTHONPATH}
if [ "$mode" = dry-run ]; then
	verdict sglang SKIP "dry run, no GPU"
elif ! command -v python3 >/dev/null 2>&1; then
	verdict sglang SKIP "python3 not installed"
elif ! why=$(cd "$root/tests/python" && PYTHONPATH=$pyp timeout 120 python3 -c '
import pytest, torch, kvpool.sglang_linker, kvpool.sglang_platform
assert torch.cuda.is_available(), "torch sees no CUDA device"' 2>&1); then
	verdict sglang SKIP "torch with CUDA, pytest, sglang or kvpool does not import: $(printf \
		'%s' "$why" | tail -1)"
else
	t=$(budget 180)
	if [ "$t" = 0 ]; then
		verdict sglang FAIL "no time left before the deadline"
	else
		kd=$(realpath "$KVPOOLD")
		(cd "$root/tests/python" && PYTHONPATH=$pyp KVPOOLD=$kd \
			tee_step timeout -k 5 "$t" python3 -m pytest -q -rs -p no:cacheprovider \
			test_sglang_cuda.py)
		rc=$?
		res=$(grep -E '[0-9]+ (passed|failed|skipped|error)' "$step_log" | tail -1)
		figure "sglang: exit $rc, $res"
		if [ "$rc" = 0 ] && ! printf '%s' "$res" | grep -q skipped; then
			verdict sglang PASS "$res"
		else
			verdict sglang FAIL "exit $rc: $res (steps/sglang.log)"
		fi
	fi
fi

{
	echo
	echo "key figures:"
	cat "$figures"
	echo
	echo "gpu-check.sh --$mode: $([ $failed = 0 ] && echo ok || echo FAILED)" \
		"in $(($(date +%s) - start)) s"
} >>"$summary"
log ""
tee -a "$log_file" <"$summary"
exit $failed
