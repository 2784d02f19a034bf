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
if ! "$py" -c "$mods" 2>/dev/null; then
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
(cd tests/python && "$py" -m pytest -q -rs -p no:cacheprovider .) 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
echo "pytest.sh: $(grep -E '^(=+ )?[0-9]+ (passed|failed|skipped|error)' "$log" | tail -1 | tr -d '=')"
rm -f "$log"
exit "$rc"
