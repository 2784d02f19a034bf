#!/bin/sh
# verify_units.sh - checks the built kvpoold.service and kvpoold.socket with systemd-analyze.
#
# usage: verify_units.sh SERVICE SOCKET [KVPOOLD [KVPOOLCTL]]
#   SERVICE  the configured kvpoold.service (build dir), SOCKET  systemd/kvpoold.socket,
#   KVPOOLD  a kvpoold binary to put in ExecStart= (default: a stub made here; verify only
#            needs an executable at that path), KVPOOLCTL  the same for ExecReload=.
# Exit: 0 clean, 1 any complaint (systemd-analyze warns with status 0, so any output counts),
# 2 usage, 77 skipped when systemd-analyze is not installed.
set -eu

if [ $# -lt 2 ] || [ $# -gt 4 ]; then
	echo "usage: $0 SERVICE SOCKET [KVPOOLD [KVPOOLCTL]]" >&2
	exit 2
fi
service=$1
socket=$2
if ! command -v systemd-analyze >/dev/null 2>&1; then
	echo "SKIP: systemd-analyze not found (Debian package systemd)"
	exit 77
fi
for f in "$service" "$socket"; do
	if [ ! -r "$f" ]; then
		echo "FAIL: cannot read $f" >&2
		exit 1
	fi
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvp-units.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM
mkdir "$tmp/units"

if [ $# -ge 3 ]; then
	bin=$(cd "$(dirname "$3")" && pwd)/$(basename "$3")
else
	bin=$tmp/kvpoold
	printf '#!/bin/sh\nexit 0\n' >"$bin"
	chmod 0755 "$bin"
fi
if [ $# -eq 4 ]; then
	ctl=$(cd "$(dirname "$4")" && pwd)/$(basename "$4")
else
	ctl=$tmp/kvpoolctl
	printf '#!/bin/sh\nexit 0\n' >"$ctl"
	chmod 0755 "$ctl"
fi

fail=0
if grep -n '@[A-Z_]*@' "$service" >&2; then
	echo "FAIL: $service has unsubstituted @VARIABLES@" >&2
	fail=1
fi
if ! grep -q '^ExecStart=/[^ ]*/kvpoold --config /[^ ]*/kvpool/kvpoold.conf$' "$service"; then
	echo "FAIL: $service: ExecStart= is not '<bindir>/kvpoold --config <sysconfdir>/kvpool/kvpoold.conf'" >&2
	fail=1
fi
# A reload goes through kvpoolctl, which says what changed and fails on a refusal (and needs
# no /bin/kill, absent on minimal images).
if ! grep -q '^ExecReload=/[^ ]*/kvpoolctl --socket /run/kvpool/kvpoold.sock reload$' "$service"; then
	echo "FAIL: $service: ExecReload= is not '<bindir>/kvpoolctl --socket /run/kvpool/kvpoold.sock reload'" >&2
	fail=1
fi
# The event loop is io_uring: a seccomp filter would have to be checked to keep it.
if grep -n '^SystemCallFilter=' "$service" >&2; then
	echo "FAIL: $service: SystemCallFilter= may block io_uring_setup/enter/register" >&2
	fail=1
fi

# Same unit names as installed, so the socket finds its service; ExecStart points at $bin.
sed -e "s|^ExecStart=[^ ]*|ExecStart=$bin|" -e "s|^ExecReload=[^ ]*|ExecReload=$ctl|" \
	"$service" >"$tmp/units/kvpoold.service"
cp "$socket" "$tmp/units/kvpoold.socket"

if out=$(cd "$tmp/units" && SYSTEMD_COLORS=0 systemd-analyze verify --man=no \
	./kvpoold.socket ./kvpoold.service 2>&1); then
	rc=0
else
	rc=$?
fi
if [ $rc -ne 0 ] || [ -n "$out" ]; then
	printf '%s\n' "$out" >&2
	echo "FAIL: systemd-analyze verify (status $rc)" >&2
	fail=1
fi
if [ $fail -eq 0 ]; then
	echo "OK: $(systemd-analyze --version | head -n 1): kvpoold.service and kvpoold.socket verify clean"
fi
exit $fail
