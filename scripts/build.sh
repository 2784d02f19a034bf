#!/usr/bin/env bash
# build.sh [BUILDDIR] [meson options...] - configures (once) and builds kvpool.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}
shift || true
# meson finds nvcc (CUDA tier and kernels) when the toolkit's bin is on PATH.
[ -d /usr/local/cuda/bin ] && export PATH="$PATH:/usr/local/cuda/bin"
if [ ! -f "$dir/build.ninja" ]; then
	meson setup "$dir" "$@" >/dev/null || meson setup "$dir" "$@"
fi
ninja -C "$dir" >/dev/null || ninja -C "$dir"
