#!/usr/bin/env bash
# fuzz.sh [SECONDS] - builds the libFuzzer targets with clang (ASan+UBSan) and runs each for
# SECONDS (default 60) from the seed corpus in tests/fuzz/corpus. A crash fails the script and
# leaves the input in build-fuzz/crash-*: add it to the corpus as a regression case.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
KVP_WITH_FUZZ=1 bash scripts/deps.sh
if [ ! -f build-fuzz/build.ninja ]; then
	CC=clang meson setup build-fuzz -Dfuzz=true -Dcuda=disabled -Db_lundef=false >/dev/null
fi
targets="tests/fuzz/fuzz_dispatch tests/fuzz/fuzz_config tests/fuzz/fuzz_codec"
# shellcheck disable=SC2086
ninja -C build-fuzz $targets >/dev/null || ninja -C build-fuzz $targets
work=$(mktemp -d /tmp/kvpool-fuzz-XXXXXX)
trap 'rm -rf "$work"' EXIT
for t in dispatch config codec; do
	corpus=frame
	[ "$t" = config ] && corpus=config
	[ "$t" = codec ] && corpus=codec
	mkdir -p "$work/$t"
	cp tests/fuzz/corpus/$corpus/* "$work/$t/"
	echo "== fuzz_$t for ${secs}s"
	build-fuzz/tests/fuzz/fuzz_$t -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
		-artifact_prefix=build-fuzz/crash-$t- -print_final_stats=1 "$work/$t" \
		tests/fuzz/corpus/$corpus 2>&1 | grep -E "^(#[0-9]+ +DONE|stat::number_of_executed_units|stat::peak_rss|==.*ERROR|SUMMARY)" || true
	if ls build-fuzz/crash-$t-* >/dev/null 2>&1; then
		echo "fuzz_$t: CRASH (inputs in build-fuzz/crash-$t-*)"
		exit 1
	fi
done
echo "fuzz: no crash"
