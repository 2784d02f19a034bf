#!/usr/bin/env bash
# pytest.sh - runs the kvpool Python tests (tests/python) in two venvs and prints one summary
# line of pytest's counts. Creates the venv (with the python3 first on PATH) when missing,
# installs numpy, pytest and meson-python from PyPI, builds kvpoold (scripts/build.sh), builds
# the package's wheel once, installs it in both venvs and runs pytest: the engine plug-in tests
# in the engine venv, the rest in the main one. Exits 77 (skipped) with the reason when PyPI cannot be
# reached for a package that is missing.
#   KVP_VENV=DIR         the venv (default .venv)
#   KVP_BUILDDIR=DIR     the meson build folder kvpoold and kvpoolctl come from (default build)
#   KVP_PY_TORCH=0       do not install torch and transformers (pinned below): their tests
#                        then skip and say why. PyPI's torch for x86_64 Linux is the CUDA build
#                        (with the CUDA wheels it pulls, about 5.5 GiB in the venv); it runs on
#                        the CPU all the same.
#   KVP_PY_SETUP_ARGS    meson options for the package build (e.g. -Dcuda=disabled)
#   KVP_ENGINE_VENV=DIR  the venv of the engine plug-in tests (test_sglang.py, test_vllm*.py,
#                        test_events.py: vLLM's KVEventBatch decoder;
#                        default .venv-engines): SGLang's host pools and vLLM's block hashing
#                        import the engines' model configs, which need transformers 5, while
#                        kvpool.transformers is tested with the pin above. It holds torch (the
#                        same pin, from PyPI: download.pytorch.org's CPU wheels are not
#                        reachable everywhere), transformers 5 (pinned below), sglang and vllm
#                        (pinned, --no-deps) and the modules their host pool, storage and
#                        offloading modules import (pinned, --no-deps). About 6.8 GiB; a fresh
#                        one takes about 3 to 5 minutes to install (mostly torch's CUDA wheels).
#                        test_transformers.py runs in both venvs: kvpool.transformers on
#                        transformers 4.57.1 and 5.
#   KVP_ENGINE_NEW_VENV=DIR  the venv of the engines' newest releases (default
#                        .venv-engines-new): where PyPI's newest vllm or sglang is newer than
#                        the pin, it is installed there with --no-deps (about 0.6 GiB, half a
#                        minute), the venv seeing the engine venv's packages through a .pth,
#                        and that engine's plug-in tests run there too; a release that does
#                        not install or import is skipped with the reason
#   KVP_PY_ENGINES=0     no engine venv: the engine tests run in KVP_VENV, where they skip and
#                        say why
# The summary line adds all runs' counts.
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

PATH=$sys_path bash scripts/build.sh "$builddir" -Dwerror=true || { echo "pytest.sh: build failed"; exit 1; }
setup_args=()
for a in ${KVP_PY_SETUP_ARGS:-}; do
	setup_args+=("-Csetup-args=$a")
done
# one wheel of the package for both venvs (the same python3); the build requirements are in
# the venv already: no second download per run
whl=$(mktemp -d)
trap 'rm -rf "$whl"' EXIT
pip wheel -q --no-deps --no-build-isolation -w "$whl" "${setup_args[@]}" . ||
	{ echo "pytest.sh: building the kvpool wheel failed"; exit 1; }
pip install --force-reinstall --no-deps "$whl"/kvpool-*.whl ||
	{ echo "pytest.sh: pip install kvpool failed"; exit 1; }

# the engine venv: transformers 5, the engines' interface code without their dependency trees
# (which pin other torch builds), only the modules the tested modules import
transformers5_pin="transformers==5.19.0"
engine_pkgs="sglang==0.5.23 vllm==0.33.0 orjson==3.13.0 psutil==7.2.2 pybase64==1.5.1
	pillow==13.0.0 starlette==1.10.0 anyio==4.16.0 sniffio==1.3.1 msgspec==0.23.0
	pydantic==2.14.4 pydantic_core==2.50.5 typing-inspection==0.4.5 annotated-types==0.8.0
	pyzmq==27.3.0 ipython==9.18.1 traitlets==5.16.1 aiohttp==3.14.5 multidict==7.2.1
	attrs==26.1.0 yarl==1.25.1 propcache==0.5.4 aiohappyeyeballs==2.7.1 aiosignal==1.4.0
	frozenlist==1.8.0 cbor2==6.3.0 requests==2.34.2 urllib3==2.8.0 idna==3.20
	charset-normalizer==3.5.3 certifi==2026.10.19.post1 dill==0.4.1 apache-tvm-ffi==0.1.11
	sentencepiece==0.2.3 compressed-tensors==0.20.1 gguf==0.19.0 torchvision==0.29.2
	loguru==0.7.3 openai==3.57.0 openai-harmony==0.0.8 cachetools==8.0.2 cloudpickle==3.1.3
	uvloop==0.23.0 py-cpuinfo==9.0.0 prometheus_client==0.26.0 xgrammar==0.2.9
	fastapi==0.136.3 partial-json-parser==0.2.1.1.post7 llguidance==1.9.1 einops==0.8.2"
engine_mods="import pytest, numpy, torch, transformers
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
from sglang.srt.mem_cache.storage import backend_factory
from vllm.v1.core import kv_cache_utils
from vllm.v1.kv_offload.factory import OffloadingSpecFactory
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import OffloadingConnector
import vllm.model_executor.models.llama"
# the engine plug-ins' tests (engine venv only), and the tests run in both venvs
engine_tests="test_sglang.py test_sglang_linker.py test_sglang_platform.py
	test_sglang_plugin.py test_sglang_cuda.py test_vllm.py test_vllm_scheduler.py
	test_vllm_below.py test_vllm_connector.py test_events.py test_sglang_below.py"
both_tests="test_transformers.py"
epy=""
if [ "${KVP_PY_ENGINES:-1}" = 1 ]; then
	evenv=${KVP_ENGINE_VENV:-.venv-engines}
	if [ ! -x "$evenv/bin/python" ]; then
		python3 -m venv "$evenv" || { echo "pytest.sh: python3 -m venv $evenv failed"; exit 1; }
	fi
	epy="$(realpath "$evenv")/bin/python"
	epip() { "$epy" -m pip --disable-pip-version-check -q "$@"; }
	# shellcheck disable=SC2086
	if ! (cd /tmp && "$epy" -W ignore -c "$engine_mods") >/dev/null 2>&1 ||
		! py=$epy pins_ok $torch_pin $transformers5_pin; then
		t0=$(date +%s)
		# shellcheck disable=SC2086
		if epip install pytest numpy $torch_pin $transformers5_pin &&
			epip install --no-deps $engine_pkgs; then
			echo "pytest.sh: engine venv $evenv installed in $(($(date +%s) - t0)) s"
		else
			echo "pytest.sh: installing the engine venv failed"
			exit 1
		fi
	fi
	epip install --force-reinstall --no-deps "$whl"/kvpool-*.whl ||
		{ echo "pytest.sh: pip install kvpool in $evenv failed"; exit 1; }
fi

# the engines' newest releases on PyPI, where newer than the pins: installed --no-deps into a
# second venv that sees the engine venv's packages (a .pth line after its own), that engine's
# tests run there; each release that cannot be listed, installed or imported is skipped with
# the reason
newest_engines() {
	local nvenv npy eng pin have mods tests ntests="" nlog
	nvenv=${KVP_ENGINE_NEW_VENV:-.venv-engines-new}
	for eng in vllm sglang; do
		# shellcheck disable=SC2086
		pin=$(printf '%s\n' $engine_pkgs | sed -n "s/^$eng==//p")
		have=$("$epy" -m pip --disable-pip-version-check index versions "$eng" 2>/dev/null |
			sed -n "s/^$eng (\(.*\))\$/\1/p")
		if [ -z "$have" ]; then
			echo "pytest.sh: $eng newest release: skipped: PyPI's release list cannot be read"
			continue
		fi
		if [ "$have" = "$pin" ]; then
			echo "pytest.sh: $eng newest release: $pin, the pinned one (tested above)"
			continue
		fi
		if [ ! -x "$nvenv/bin/python" ]; then
			python3 -m venv "$nvenv" || { echo "pytest.sh: python3 -m venv $nvenv failed"; return; }
		fi
		npy="$(realpath "$nvenv")/bin/python"
		purelib='import sysconfig; print(sysconfig.get_path("purelib"))'
		"$epy" -c "$purelib" >"$("$npy" -c "$purelib")/zz-engines.pth" || return
		if [ "$("$npy" -c "from importlib.metadata import version; print(version('$eng'))" \
			2>/dev/null)" != "$have" ]; then
			if ! "$npy" -m pip --disable-pip-version-check -q install --no-deps "$eng==$have" \
				>/dev/null 2>&1; then
				echo "pytest.sh: $eng $have (newest): skipped: pip install --no-deps failed"
				continue
			fi
		fi
		mods=$(printf '%s\n' "$engine_mods" | grep -E "^(from|import) $eng")
		if ! (cd /tmp && "$npy" -W ignore -c "$mods") >/dev/null 2>&1; then
			echo "pytest.sh: $eng $have (newest): skipped: its modules do not import:"
			(cd /tmp && "$npy" -W ignore -c "$mods" 2>&1 | tail -1)
			continue
		fi
		# shellcheck disable=SC2086
		tests=$(printf '%s\n' $engine_tests | grep "^test_$eng" | tr '\n' ' ')
		ntests="$ntests ${tests% }"
		echo "pytest.sh: $eng $have (newest) installed in $nvenv"
	done
	[ -n "$ntests" ] || return
	nlog=$(mktemp)
	echo "pytest.sh: the engines' newest releases in $nvenv:$ntests"
	# shellcheck disable=SC2086
	(cd tests/python && "$npy" -m pytest -q -rfEs -p no:cacheprovider -W ignore $ntests) 2>&1 |
		tee "$nlog"
	erc=${PIPESTATUS[0]}
	[ "$rc" = 0 ] && rc=$erc
	sum="$sum, $(counts "$nlog")"
	rm -f "$nlog"
}

export KVPOOLD="$PWD/$builddir/daemon/kvpoold" KVPOOLCTL="$PWD/$builddir/client/kvpoolctl"
# run from tests/python so the import finds the installed package, not python/kvpool
log=$(mktemp)
ignore=()
if [ -n "$epy" ]; then
	for t in $engine_tests; do
		ignore+=("--ignore=$t")
	done
fi
(cd tests/python && "$py" -m pytest -q -rfEs -p no:cacheprovider "${ignore[@]}" .) 2>&1 |
	tee "$log"
rc=${PIPESTATUS[0]}
counts() { grep -E '^(=+ )?[0-9]+ (passed|failed|skipped|error)' "$1" | tail -1 | tr -d '='; }
sum=$(counts "$log")
if [ -n "$epy" ]; then
	elog=$(mktemp)
	echo "pytest.sh: the engine tests in $evenv"
	# shellcheck disable=SC2086
	(cd tests/python && "$epy" -m pytest -q -rfEs -p no:cacheprovider -W ignore $engine_tests \
		$both_tests) 2>&1 | tee "$elog"
	erc=${PIPESTATUS[0]}
	[ "$rc" = 0 ] && rc=$erc
	sum="$sum, $(counts "$elog")"
	newest_engines
	rm -f "$elog"
fi
# one line of both runs' counts, each kind added up
echo "pytest.sh: $(printf '%s\n' "$sum" | tr ',' '\n' | awk 'NF >= 2 { n[$2] += $1 }
	END { s = ""; for (k in n) s = s (s ? ", " : "") n[k] " " k; print s }')"
rm -f "$log"
exit "$rc"
