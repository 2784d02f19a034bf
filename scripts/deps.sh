#!/usr/bin/env bash
# deps.sh - installs the Debian packages kvpool builds and tests with, when missing.
# Runs apt-get as root (or through sudo). Prints what it installs.
set -euo pipefail

pkgs=(meson ninja-build pkg-config gcc python3 liburing-dev libnuma-dev libprotobuf-c-dev
	protobuf-c-compiler libcunit1-dev libinih-dev libsystemd-dev libmicrohttpd-dev systemd
	libhiredis-dev nettle-dev)
# the Python package's extension and the test venv (scripts/pytest.sh): Debian's python3
# headers and venv module; a python3 of another origin first on PATH brings its own
if [ "${KVP_NO_PYTHON:-0}" != 1 ]; then
	pkgs+=(python3-dev python3-venv)
fi
# scripts/format.sh (test.sh's format check)
if [ "${KVP_NO_FORMAT:-0}" != 1 ]; then
	pkgs+=(clang-format)
fi
# tests/system/run.sh (test.sh's real-systemd stage): a container booted with systemd
if [ "${KVP_NO_SYSTEM:-0}" != 1 ]; then
	pkgs+=(systemd-container debootstrap)
fi
# scripts/fuzz.sh (test.sh's fuzz run: libFuzzer needs clang) unless KVP_NO_FUZZ=1
if [ "${KVP_NO_FUZZ:-0}" != 1 ] || [ "${KVP_WITH_FUZZ:-0}" = 1 ]; then
	pkgs+=(clang libclang-rt-14-dev)
fi
# the remote suite (a real Redis Cluster on loopback) unless KVP_NO_REDIS=1: a new user's test
# run covers what CI covers
if [ "${KVP_NO_REDIS:-0}" != 1 ] || [ "${KVP_WITH_REDIS:-0}" = 1 ]; then
	pkgs+=(redis-server redis-tools)
fi
# the disk tier's tests and bench (test_disk_devices: mkfs.ext4, losetup; bench_disk: fio)
pkgs+=(e2fsprogs util-linux mount fio)

missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "kvpool: installing ${missing[*]}"
sudo=()
if [ "$(id -u)" != 0 ]; then
	command -v sudo >/dev/null || { echo "kvpool: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
	sudo=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
