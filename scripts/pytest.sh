#!/usr/bin/env bash
# pytest.sh - runs the kvpool Python tests (tests/python) in a venv and prints pytest's summary
# line. Creates the venv (with the python3 first on PATH) when missing, installs numpy, pytest
# and meson-python from PyPI, builds kvpoold (scripts/build.sh), installs the package with
# `pip install .` and runs pytest. Exits 77 (skipped) with the reason when PyPI cannot be
# reached for a package that is missing.
#   KVP_VENV=DIR         the venv (default .venv)
#   KVP_BUILDDIR=DIR     the meson build folder kvpoold and kvpoolctl come from (default build)
#   KVP_PY_TORCH=0       do not install torch and transformers (pinned below): their tests
#                        then skip and say why. PyPI's torch for x86_64 Linux is the CUDA build
#                        (with the CUDA wheels it pulls, about 5.5 GiB in the venv); it runs on
#                        the CPU all the same.
#   KVP_PY_SETUP_ARGS    meson options for the package build (e.g. -Dcuda=disabled)
#   KVP_PY_SGLANG=0      do not install sglang (pinned below, --no-deps, with the modules its
#                        storage interface imports; a 39 MB wheel, 222 MB installed):
#                        test_sglang.py then skips and says why
#   KVP_PY_VLLM=0        do not install vllm (pinned below, --no-deps, with the modules its
#                        offloading interface imports; a 336 MB wheel, 877 MB installed, no
#                        CUDA library needed to import it): test_vllm.py then skips
set -uo pipefail
cd "$(dirname "$0")/.."
venv=${KVP_VENV:-.venv}
builddir=${KVP_BUILDDIR:-build}
torch_pin="torch==2.15.0"
transformers_pin="transformers==4.57.1"

if [ ! -x "$venv/bin/python" ]; then
	python3 -m venv "$venv" || { echo "pytest.sh: python3 -m venv $venv failed"; exit 1; }
fi
py="$(realpath "$venv")/bin/python"
# meson-python runs the venv's meson and ninja (the system's may be older than it needs); the
# C build of kvpoold stays with the system's meson, as scripts/test.sh builds it
sys_path=$PATH
export PATH="$(dirname "$py"):$PATH"
pip() { "$py" -m pip --disable-pip-version-check -q "$@"; }

need="numpy pytest meson-python meson ninja"
mods="import numpy, pytest, mesonpy"
if [ "${KVP_PY_TORCH:-1}" = 1 ]; then
	need="$need $torch_pin $transformers_pin"
	mods="$mods, torch, transformers"
fi
# an existing venv passes only with the pinned versions: another torch or transformers than
# the one kvpool.transformers is tested with is replaced by the pin
pins_ok() {
	"$py" - "$@" <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, version
for pin in sys.argv[1:]:
    name, want = pin.split("==")
    try:
        have = version(name)
    except PackageNotFoundError:
        have = None
    # a local build tag (torch 2.15.0+cpu) is the same release
    if have is None or have.split("+")[0] != want:
        print(f"pytest.sh: {name} {have or 'missing'} in the venv, pinned {want}")
        sys.exit(1)
PY
}
pins=""
[ "${KVP_PY_TORCH:-1}" = 1 ] && pins="$torch_pin $transformers_pin"
# shellcheck disable=SC2086
if ! "$py" -c "$mods" 2>/dev/null || ! pins_ok $pins; then
	if ! "$py" - <<'PY'
import sys, urllib.request
try:
    urllib.request.urlopen("https://pypi.org/simple/pip/", timeout=20).read(1)
except Exception as e:
    print(f"pytest.sh: skipped: PyPI cannot be reached ({e}) to install the test packages")
    sys.exit(1)
PY
	then
		exit 77
	fi
	# shellcheck disable=SC2086
	pip install $need || { echo "pytest.sh: pip install $need failed"; exit 1; }
fi

# the engines' interface code, pinned, without their dependency trees (which pin CUDA torch
# builds and a transformers that kvpool.transformers is not tested with): only the modules
# their storage/offloading interfaces import
sglang_pin="sglang==0.5.23"
sglang_deps="orjson==3.13.0 psutil==7.2.2 pybase64==1.5.1 pillow==13.0.0 starlette==1.10.0
	anyio==4.16.0 msgspec==0.23.0 pydantic==2.14.4 pydantic_core==2.50.5
	typing-inspection==0.4.5 annotated-types==0.8.0 pyzmq==27.3.0 ipython==9.18.1
	traitlets==5.16.1 aiohttp==3.14.5 multidict==7.2.1 attrs==26.1.0 yarl==1.25.1
	propcache==0.5.4 aiohappyeyeballs==2.7.1 aiosignal==1.4.0 frozenlist==1.8.0"
vllm_pin="vllm==0.33.0"
vllm_deps="cbor2==6.3.0 annotated-types==0.8.0 pydantic==2.14.4 pydantic_core==2.50.5
	typing-inspection==0.4.5 msgspec==0.23.0 pyzmq==27.3.0"
engines=""
if [ "${KVP_PY_SGLANG:-1}" = 1 ] && ! "$py" -c "import sglang.srt.mem_cache.hicache_storage" \
	2>/dev/null && ! "$py" -m pip show -q sglang >/dev/null 2>&1; then
	engines="$engines $sglang_pin $sglang_deps"
fi
if [ "${KVP_PY_VLLM:-1}" = 1 ] && ! "$py" -m pip show -q vllm >/dev/null 2>&1; then
	engines="$engines $vllm_pin $vllm_deps"
fi
if [ -n "$engines" ]; then
	t0=$(date +%s)
	# shellcheck disable=SC2086
	if pip install --no-deps $engines; then
		echo "pytest.sh: engine packages installed in $(($(date +%s) - t0)) s"
	else
		echo "pytest.sh: installing the engine packages failed: their tests skip"
	fi
fi

PATH=$sys_path bash scripts/build.sh "$builddir" -Dwerror=true || { echo "pytest.sh: build failed"; exit 1; }
setup_args=()
for a in ${KVP_PY_SETUP_ARGS:-}; do
	setup_args+=("-Csetup-args=$a")
done
# the build requirements are in the venv already: no second download per run
pip install --no-build-isolation "${setup_args[@]}" . ||
	{ echo "pytest.sh: pip install . failed"; exit 1; }

export KVPOOLD="$PWD/$builddir/daemon/kvpoold" KVPOOLCTL="$PWD/$builddir/client/kvpoolctl"
# run from tests/python so the import finds the installed package, not python/kvpool
log=$(mktemp)
(cd tests/python && "$py" -m pytest -q -rfEs -p no:cacheprovider .) 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
echo "pytest.sh: $(grep -E '^(=+ )?[0-9]+ (passed|failed|skipped|error)' "$log" | tail -1 | tr -d '=')"
rm -f "$log"
exit "$rc"
