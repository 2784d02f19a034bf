#!/usr/bin/env bash
# format.sh [--check] - formats every C, CUDA and header file git tracks with the root
# .clang-format (clang-format from Debian 12, version 14). --check changes nothing and fails,
# listing the files, when one is not formatted.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || {
	echo "format.sh: clang-format missing: install the Debian package clang-format" >&2
	exit 1
}
mapfile -t files < <(git ls-files '*.c' '*.h' '*.cu')
if [ "${1:-}" = --check ]; then
	bad=()
	for f in "${files[@]}"; do
		clang-format "$f" | cmp -s - "$f" || bad+=("$f")
	done
	if [ ${#bad[@]} -gt 0 ]; then
		echo "format.sh: not formatted (run scripts/format.sh): ${bad[*]}" >&2
		exit 1
	fi
	echo "format.sh: ${#files[@]} files formatted"
	exit 0
fi
clang-format -i "${files[@]}"
