#!/usr/bin/env bash
# run.sh BUILDDIR - kvpool under real systemd: boots Debian 12's systemd (252) in a container
# (systemd-nspawn), installs the build there (`meson install --destdir`) as a package would,
# and tests the units for real: sysusers and tmpfiles, socket activation on the first connect,
# READY and STATUS, the socket's permissions, `systemctl reload` that succeeds and one that
# fails (the old config stays), restarts with an engine holding a prefix and a lease, kill -9
# and a stopped (SIGSTOP) daemon restarted by systemd (Restart=on-failure, WatchdogSec=), a
# clean `systemctl stop`, and the `systemd-analyze security` exposure score against
# tests/system/security-score.
#
# The container's root is made once with debootstrap (Debian's packages: systemd, dbus and the
# runtime libraries kvpoold links) and kept as a tarball in $KVP_SYSROOT_CACHE (default
# /var/tmp/kvpool-sysroot); each run unpacks a fresh copy, boots it and tears it down at the
# end, also on failure. A restart keeps the cache (kvpoold hands its pools to systemd's fd
# store): the engine's next match hits the same bytes, its lease and mappings stay its own. A
# broken config's reload must leave kvpoold on its old config and `systemctl reload` exit
# non-zero (ExecReload= is kvpoolctl reload, which waits for the reload's result).
#
# Exit: 0 every test passed (or skipped), 1 a test failed, 2 usage, 77 the container cannot be
# made or booted here (the reason printed: not root, no systemd-nspawn or debootstrap, no
# Debian mirror, no boot).
#   KVP_SYSROOT_CACHE=DIR    where the root tarball is kept
#   KVP_DEBIAN_MIRROR=URL    debootstrap's mirror (default http://deb.debian.org/debian)
#   KVP_SYSTEM_KEEP=1        leave the container's root in place (its path is printed)
# shellcheck disable=SC2016 # single-quoted programs for the container's sh and awk
set -uo pipefail

if [ $# -ne 1 ]; then
	echo "usage: $0 BUILDDIR" >&2
	exit 2
fi
build=$(cd "$1" 2>/dev/null && pwd) || { echo "run.sh: no build directory $1" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
cache=${KVP_SYSROOT_CACHE:-/var/tmp/kvpool-sysroot}
mirror=${KVP_DEBIAN_MIRROR:-http://deb.debian.org/debian}
t0=$SECONDS

skip_all() {
	echo "SKIP: $*"
	exit 77
}

[ "$(id -u)" = 0 ] || skip_all "needs root (systemd-nspawn, debootstrap)"
for c in systemd-nspawn debootstrap nsenter flock; do
	command -v "$c" >/dev/null ||
		skip_all "$c not found (Debian packages systemd-container, debootstrap, util-linux)"
done
for f in daemon/kvpoold client/kvpoolctl client/kvpool-loadgen \
	tests/system/kvpool-system-engine; do
	[ -x "$build/$f" ] || { echo "run.sh: $build/$f is not built" >&2; exit 1; }
done

# ---- the root: debootstrap once, a tarball after ----
pkgs=systemd,systemd-sysv,dbus,liburing2,libnuma1,libprotobuf-c1,libinih1,libsystemd0
pkgs+=,libmicrohttpd12,libhiredis0.14,libnettle8,libzmq5,libmsgpackc2,libstdc++6,procps
key=$(printf '%s %s' bookworm "$pkgs" | sha256sum | cut -c1-12)
tarball=$cache/bookworm-$key.tar
mkdir -p "$cache" || skip_all "cannot create $cache"
make_root() {
	local dir=$cache/debootstrap.$$
	local log=$cache/debootstrap.log

	echo "== system: making the container root (debootstrap bookworm, once; log $log)"
	rm -rf "$dir"
	if ! debootstrap --variant=minbase --include="$pkgs" bookworm "$dir" "$mirror" \
		>"$log" 2>&1; then
		tail -5 "$log"
		rm -rf "$dir"
		return 1
	fi
	# Roots of other package lists are not used again.
	rm -f "$cache"/bookworm-*.tar
	tar -C "$dir" -cf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball"
	local r=$?
	rm -rf "$dir"
	return $r
}
(
	flock 9
	[ -f "$tarball" ] || make_root
) 9>"$cache/.lock" || skip_all "could not make the container root with debootstrap from $mirror"

work=$(mktemp -d /var/tmp/kvpool-system.XXXXXX)
root=$work/root
nspawn_pid=
leader=
teardown() {
	local rc=$?

	trap '' INT TERM HUP # nothing cuts the teardown short

	if [ -n "$nspawn_pid" ] && kill -0 "$nspawn_pid" 2>/dev/null; then
		# nspawn asks the container's systemd to power off; SIGKILL if that hangs.
		kill -TERM "$nspawn_pid" 2>/dev/null
		for _ in $(seq 100); do
			kill -0 "$nspawn_pid" 2>/dev/null || break
			sleep 0.1
		done
		kill -KILL "$nspawn_pid" 2>/dev/null
		wait "$nspawn_pid" 2>/dev/null
	fi
	if [ "${KVP_SYSTEM_KEEP:-0}" = 1 ]; then
		echo "== system: container root kept in $root"
	elif grep -q " $work" /proc/self/mounts; then
		echo "== system: $work still has mounts, not removed"
	else
		rm -rf "$work"
	fi
	exit "$rc"
}
trap teardown EXIT
trap 'echo "run.sh: interrupted"; exit 1' INT TERM HUP

mkdir "$root"
tar -C "$root" -xf "$tarball" || { echo "run.sh: cannot unpack $tarball" >&2; exit 1; }

# ---- install kvpool as a package would ----
meson install -C "$build" --destdir "$root" --no-rebuild --quiet >"$work/install.log" 2>&1 || {
	cat "$work/install.log"
	echo "run.sh: meson install failed" >&2
	exit 1
}
install -m 0755 "$build/tests/system/kvpool-system-engine" "$root/usr/local/bin/"
chroot "$root" ldconfig
# Libraries the build links that Debian's runtime packages above do not bring (a CUDA runtime
# found on this machine): copied from here.
for b in kvpoold kvpoolctl kvpool-loadgen kvpool-system-engine; do
	bin=$(find "$root/usr" -name "$b" -type f -perm -u+x | head -1)
	[ -n "$bin" ] || { echo "run.sh: $b was not installed" >&2; exit 1; }
	for lib in $(chroot "$root" ldd "${bin#"$root"}" | awk '/not found/ { print $1 }'); do
		src=$(ldd "$build/daemon/kvpoold" "$build/client/kvpoolctl" 2>/dev/null |
			awk -v l="$lib" '$1 == l && $3 ~ /^\// { print $3; exit }')
		[ -n "$src" ] || { echo "run.sh: $b needs $lib, found nowhere" >&2; exit 1; }
		cp -L "$src" "$root/usr/local/lib/"
	done
done
chroot "$root" ldconfig
unit=$(find "$root/lib/systemd/system" "$root/usr/lib/systemd/system" \
	"$root/usr/local/lib/systemd/system" -name kvpoold.service 2>/dev/null | head -1)
[ -n "$unit" ] || { echo "run.sh: kvpoold.service was not installed" >&2; exit 1; }
conf=$(sed -n 's/^ExecStart=.*--config \([^ ]*\).*/\1/p' "$unit")
[ -f "$root$conf" ] || { echo "run.sh: $conf (ExecStart's config) was not installed" >&2; exit 1; }
cp "$root$conf" "$work/kvpoold.conf.good"
# Enabled as a package's postinst would: the socket listens from boot on.
systemctl --root="$root" enable kvpoold.socket >/dev/null 2>&1 ||
	{ echo "run.sh: systemctl --root enable kvpoold.socket failed" >&2; exit 1; }
# A machine id of its own, so the boot is not a first boot (which would apply the presets and
# enable kvpoold.service itself, not only its socket).
tr -d - </proc/sys/kernel/random/uuid >"$root/etc/machine-id"
echo "== system: root unpacked and kvpool installed in $((SECONDS - t0)) s"

# ---- boot ----
# On a host with cgroup v1 controllers (a legacy or hybrid /sys/fs/cgroup) the container gets
# the legacy hierarchy too; on a cgroup2-only host nspawn's own choice holds. CAP_IPC_LOCK: the
# unit grants it (mlock of the host tier), as a real machine's bounding set allows; nspawn
# drops it by default.
unified=0
[ "$(stat -fc %T /sys/fs/cgroup 2>/dev/null)" = cgroup2fs ] && unified=1
SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=$unified systemd-nspawn --register=no --keep-unit --quiet \
	--machine="kvpool-system-$$" \
	--capability=CAP_IPC_LOCK --console=passive -D "$root" -b >"$work/console.log" 2>&1 &
nspawn_pid=$!
for _ in $(seq 300); do
	for c in $(cat "/proc/$nspawn_pid/task/$nspawn_pid/children" 2>/dev/null); do
		grep -qP '^NSpid:\t[0-9]+\t1$' "/proc/$c/status" 2>/dev/null && leader=$c
	done
	[ -n "$leader" ] && break
	kill -0 "$nspawn_pid" 2>/dev/null || break
	sleep 0.1
done
if [ -z "$leader" ]; then
	tail -20 "$work/console.log"
	skip_all "the container did not start (systemd-nspawn failed)"
fi
# Commands in the container, with its own environment (nothing of this shell's leaks in).
ct() {
	nsenter -t "$leader" -a -- env -i LANG=C.UTF-8 \
		PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$@"
}
# "offline" until the manager's private bus socket is up, then --wait waits for the boot.
state=
for _ in $(seq 300); do
	state=$(timeout 60 nsenter -t "$leader" -a -- systemctl is-system-running --wait 2>&1)
	case "$state" in
	running | degraded | maintenance | stopping) break ;;
	esac
	kill -0 "$nspawn_pid" 2>/dev/null || break
	sleep 0.1
done
case "$state" in
running | degraded) ;;
*)
	tail -20 "$work/console.log"
	skip_all "the container's systemd did not boot (state: ${state:-none})"
	;;
esac
echo "== system: systemd $(ct systemctl --version | awk 'NR == 1 { print $2 }') booted in" \
	"$((SECONDS - t0)) s ($state)"
[ "$state" = degraded ] && ct systemctl --failed --no-pager

# ---- tests ----
npass=0 nfail=0 nskip=0
failed=()
pass() {
	echo "PASS: $cur${*:+: $*}"
	npass=$((npass + 1))
}
fail() {
	echo "FAIL: $cur: $*"
	nfail=$((nfail + 1))
	failed+=("$cur")
	ct journalctl -u kvpoold.service -u kvpoold.socket --no-pager -n 30 -o short-monotonic |
		sed 's/^/    journal: /'
}
skip() {
	echo "SKIP: $cur: $*"
	nskip=$((nskip + 1))
}
prop() { ct systemctl show -p "$1" --value "${2:-kvpoold.service}"; }
main_pid() { prop MainPID; }
# wait_for SECONDS COMMAND...: polls every 0.1 s until COMMAND succeeds.
wait_for() {
	local n=$(($1 * 10))
	shift
	while [ "$n" -gt 0 ]; do
		"$@" && return 0
		sleep 0.1
		n=$((n - 1))
	done
	return 1
}
is_running() { [ "$(prop ActiveState)/$(prop SubState)" = active/running ]; }
pid_changed() { # old pid
	local p
	p=$(main_pid)
	[ "$p" != 0 ] && [ "$p" != "$1" ] && is_running
}
put_conf() { ct tee "$conf" >/dev/null; }
# journal_has PATTERN: a line of kvpoold.service's journal matches (grep reads it all: an early
# exit would fail the pipe).
journal_has() { ct journalctl -u kvpoold.service --no-pager | grep -i -- "$1" >/dev/null; }
ctl() { ct kvpoolctl "$@"; }
echo "== system: kvpoold $(ct kvpoold --version 2>&1 | head -1)"

cur="units load cleanly"
# systemd logs "FILE:LINE: ..." for each line of a unit it ignores or does not understand.
warn=$(ct journalctl -b --no-pager -o cat | grep -E 'kvpoold\.(service|socket)(\.d/[^:]*)?:[0-9]+:')
if [ "$(prop LoadState)" != loaded ] || [ "$(prop LoadState kvpoold.socket)" != loaded ]; then
	fail "LoadState $(prop LoadState) / $(prop LoadState kvpoold.socket)"
elif [ -n "$warn" ]; then
	fail "systemd complained: $warn"
else
	pass "kvpoold.service and kvpoold.socket loaded, no warnings"
fi

cur="sysusers and tmpfiles"
uid=$(ct getent passwd kvpool | cut -d: -f3)
gid=$(ct getent group kvpool | cut -d: -f3)
if [ -z "$uid" ] || [ -z "$gid" ]; then
	fail "no user or group kvpool (systemd-sysusers)"
elif [ "$uid" -ge 1000 ]; then
	fail "user kvpool has uid $uid, not a system uid"
elif ! ct getent group kvpool-admin >/dev/null; then
	fail "no group kvpool-admin"
elif [ "$(ct stat -c '%U:%G %a' /run/kvpool)" != "kvpool:kvpool 750" ]; then
	# (kvpoold.socket would make it root's: the owner says tmpfiles did, at boot)
	fail "/run/kvpool is $(ct stat -c '%U:%G %a' /run/kvpool), not kvpool:kvpool 750"
elif [ "$(prop Result systemd-sysusers.service)" != success ] ||
	[ "$(prop Result systemd-tmpfiles-setup.service)" != success ]; then
	fail "systemd-sysusers or systemd-tmpfiles-setup did not succeed"
elif ! ct systemd-tmpfiles --cat-config | grep '^d /run/kvpool ' >/dev/null; then
	fail "kvpool's tmpfiles.d entry is not in systemd-tmpfiles --cat-config"
else
	pass "uid $uid, gid $gid, /run/kvpool kvpool:kvpool 0750"
fi

cur="socket activation"
sock=/run/kvpool/kvpoold.sock
if [ "$(prop ActiveState kvpoold.socket)" != active ]; then
	fail "kvpoold.socket is $(prop ActiveState kvpoold.socket) after boot"
elif [ "$(prop ActiveState)" != inactive ] || [ "$(main_pid)" != 0 ]; then
	fail "kvpoold.service is $(prop ActiveState) before any client connected"
elif [ "$(ct stat -c '%F %U:%G %a' $sock)" != "socket kvpool:kvpool 660" ]; then
	fail "$sock is $(ct stat -c '%F %U:%G %a' $sock)"
elif ! out=$(ctl ping 2>&1); then
	fail "kvpoolctl ping through the socket: $out"
elif ! is_running; then
	fail "kvpoold.service is $(prop ActiveState)/$(prop SubState) after the first connect"
elif [ "$(ct awk '/^Uid:/ { print $2 }' "/proc/$(main_pid)/status")" != "$uid" ]; then
	fail "kvpoold does not run as user kvpool"
else
	pass "started by the first connect, pid $(main_pid), user kvpool"
fi

cur="READY and STATUS"
status_ok() { prop StatusText | grep -E '^[0-9]+ pools, [0-9]+ sessions, ' >/dev/null; }
if [ "$(prop Type)" != notify ]; then
	fail "Type=$(prop Type), not notify"
elif ! is_running; then
	fail "not running (READY=1 not received?)"
elif ! wait_for 7 status_ok; then
	fail "StatusText is '$(prop StatusText)'"
else
	pass "StatusText: $(prop StatusText)"
fi

cur="socket permissions"
nobody=(setpriv --reuid=65534 --regid=65534)
if ct "${nobody[@]}" --clear-groups kvpoolctl --socket $sock ping >/dev/null 2>&1; then
	fail "a user outside group kvpool reached kvpoold"
elif ! out=$(ct "${nobody[@]}" --groups="$gid" kvpoolctl --socket $sock ping 2>&1); then
	fail "a member of group kvpool could not ping: $out"
else
	pass "group kvpool may connect, others may not"
fi

cur="security exposure"
limit=$(grep -v '^#' "$here/security-score" | tr -d ' \n')
if ! out=$(ct systemd-analyze security --no-pager kvpoold.service 2>&1); then
	fail "systemd-analyze security failed: $(tail -3 <<<"$out")"
else
	score=$(sed -n 's/.*Overall exposure level for kvpoold.service: \([0-9.]*\).*/\1/p' \
		<<<"$out")
	echo "    systemd-analyze security: $(grep 'Overall exposure' <<<"$out")"
	if [ -z "$score" ]; then
		fail "no exposure level in: $(tail -3 <<<"$out")"
	elif awk -v s="$score" -v l="$limit" 'BEGIN { exit !(s > l) }'; then
		grep '✗' <<<"$out" | sed 's/^/    /'
		fail "exposure $score is above $limit (tests/system/security-score)"
	else
		pass "exposure $score <= $limit"
	fi
fi

cur="reload"
pid=$(main_pid)
{
	cat "$work/kvpoold.conf.good"
	printf '\n[pool.reloaded]\nlayers = 2\nkv_heads = 1\nhead_dim = 64\ndtype = fp16\n'
	printf 'page_tokens = 16\ndevice = none\nhost_capacity = 4M\n'
} >"$work/kvpoold.conf.more"
has_pool() { ctl pools 2>/dev/null | grep -w reloaded >/dev/null; }
put_conf <"$work/kvpoold.conf.more"
if ! out=$(ct systemctl reload kvpoold.service 2>&1); then
	fail "systemctl reload failed on a valid config: $out"
elif ! wait_for 10 has_pool; then
	fail "the new pool did not appear after the reload"
elif [ "$(main_pid)" != "$pid" ] || ! is_running; then
	fail "kvpoold restarted or stopped on reload"
else
	pass "a pool added, same pid $pid"
fi

cur="reload of a broken config"
exec_reload=$(prop ExecReload)
sed '0,/^\[daemon\]/s//[daemon]\nno_such_key = 1/' "$work/kvpoold.conf.more" | put_conf
ct systemctl reload kvpoold.service >"$work/reload.out" 2>&1
rrc=$?
sleep 1
if [ "$(main_pid)" != "$pid" ] || ! is_running; then
	fail "kvpoold did not keep running on its old config (pid $(main_pid))"
elif ! has_pool || ! ctl ping >/dev/null; then
	fail "the old config's pools are gone after a refused reload"
elif ! journal_has no_such_key; then
	fail "no log line names the refused key"
elif [ $rrc != 0 ]; then
	pass "systemctl reload exited $rrc, kvpoold kept its old config"
else
	fail "systemctl reload exited 0 on a broken config (ExecReload=$exec_reload)"
fi
put_conf <"$work/kvpoold.conf.good"
ct systemctl reload kvpoold.service >/dev/null 2>&1

# An engine that publishes a prefix and holds a lease, driven through a pipe.
engine_start() {
	coproc ENGINE { nsenter -t "$leader" -a -- kvpool-system-engine --seed 7 --pages 8 hold 2>&1; }
	engine_in=${ENGINE[1]} engine_out=${ENGINE[0]} engine_pid=$ENGINE_PID
	read -r -t 20 line <&"$engine_out"
	echo "    engine: $line"
	[[ $line == ready* ]]
}
engine_cmd() { # command; sets $line
	line=
	echo "$1" >&"$engine_in" && read -r -t 30 line <&"$engine_out"
	echo "    engine: ${line:-no answer}"
	[[ $line == ok* ]]
}
engine_stop() {
	[ -n "${engine_pid:-}" ] || return 0
	{ echo quit >&"$engine_in"; } 2>/dev/null
	exec {engine_in}>&-
	wait "$engine_pid" 2>/dev/null
	engine_pid=
}
verify() { # a new engine: the seed's prefix hits with the right bytes, or misses
	out=$(ct kvpool-system-engine --seed 7 --pages 8 verify 2>&1)
	local rc=$?
	echo "    verify: $out"
	return $rc
}

cur="engine publishes and holds a lease"
if ! engine_start; then
	fail "the engine did not start: $line"
elif ! engine_cmd check; then
	fail "check before any restart: $line"
else
	pass
fi

cur="systemctl restart with an engine attached"
pid=$(main_pid)
ct systemctl reset-failed kvpoold.service
if ! out=$(ct systemctl restart kvpoold.service 2>&1); then
	fail "systemctl restart failed: $out"
elif ! wait_for 10 pid_changed "$pid"; then
	fail "kvpoold is not running again with a new pid"
elif engine_cmd check; then
	pass "the engine continued: $line"
else
	fail "the engine did not continue: $line"
fi
engine_stop

cur="20 restarts under kvpool-loadgen"
{
	ct kvpool-loadgen --pool example --workload shared-prefix --procs 2 --seconds 30 --json \
		>"$work/loadgen.json" 2>"$work/loadgen.err" &
	lg=$!
	sleep 2
	restarts=0
	for _ in $(seq 20); do
		pid=$(main_pid)
		ct systemctl reset-failed kvpoold.service
		ct systemctl restart kvpoold.service || break
		wait_for 10 pid_changed "$pid" || break
		restarts=$((restarts + 1))
		sleep 0.5
	done
	wait "$lg"
	lrc=$?
	mism=$(grep -o '"mismatches": *[0-9]*' "$work/loadgen.json" | grep -o '[0-9]*$')
	if [ $restarts != 20 ]; then
		fail "only $restarts restarts succeeded"
	elif [ "${mism:-x}" != 0 ]; then
		fail "mismatches: ${mism:-no summary}; $(tail -3 "$work/loadgen.err")"
	elif [ $lrc != 0 ]; then
		fail "kvpool-loadgen exited $lrc: $(tail -3 "$work/loadgen.err")"
	else
		pass "20 restarts, 0 mismatches"
	fi
}

cur="kill -9: systemd restarts kvpoold"
# Publish the prefix again (a restart without the fd store dropped it); it stays cached.
ct kvpool-system-engine --seed 7 --pages 8 hold </dev/null >/dev/null 2>&1
pid=$(main_pid)
n0=$(prop NRestarts)
ct systemctl reset-failed kvpoold.service
ct sh -c 'kill -9 "$1"' sh "$pid"
if ! wait_for 15 pid_changed "$pid"; then
	fail "kvpoold was not restarted (state $(prop ActiveState)/$(prop SubState))"
elif [ "$(prop NRestarts)" -le "$n0" ]; then
	fail "NRestarts did not grow ($n0 -> $(prop NRestarts))"
elif ! verify; then
	fail "an engine saw wrong bytes after the crash"
else
	pass "pid $pid -> $(main_pid), NRestarts $n0 -> $(prop NRestarts), cache ${out%% *}"
fi

cur="watchdog: a stopped kvpoold is killed and restarted"
dropin=/etc/systemd/system/kvpoold.service.d
wd=$(prop WatchdogUSec)
if [ "$wd" = 0 ] || [ "$wd" = infinity ] || [ -z "$wd" ]; then
	fail "the unit sets no WatchdogSec= (WatchdogUSec=$wd)"
else
	# The shipped interval, shortened for the test; no core dump of the SIGABRT.
	ct mkdir -p $dropin
	printf '[Service]\nWatchdogSec=2s\nLimitCORE=0\n' | ct tee $dropin/test.conf >/dev/null
	ct systemctl daemon-reload
	ct systemctl reset-failed kvpoold.service
	ct systemctl restart kvpoold.service
	pid=$(main_pid)
	sleep 5 # past two intervals: kvpoold must be sending WATCHDOG=1
	if [ "$(main_pid)" != "$pid" ] || ! is_running; then
		fail "kvpoold was killed while running (WATCHDOG=1 not sent every 1 s)"
	else
		ct sh -c 'kill -STOP "$1"' sh "$pid"
		if ! wait_for 15 pid_changed "$pid"; then
			fail "the stopped kvpoold was not restarted"
			ct sh -c 'kill -CONT "$1"' sh "$pid"
		elif ! journal_has "failed with result 'watchdog'"; then
			fail "restarted, but not after a watchdog timeout"
		else
			pass "shipped WatchdogSec $wd; stopped pid $pid -> $(main_pid) after a watchdog timeout"
		fi
	fi
	ct rm -rf $dropin
	ct systemctl daemon-reload
	ct systemctl reset-failed kvpoold.service
	ct systemctl restart kvpoold.service
fi

cur="systemctl stop"
ctl ping >/dev/null 2>&1
# systemctl warns that the socket may start the service again: that is the point.
stop() { ct systemctl stop kvpoold.service >"$work/stop.out" 2>&1; }
if ! is_running; then
	fail "kvpoold is not running before the stop"
elif ! stop; then
	fail "systemctl stop failed: $(cat "$work/stop.out")"
elif [ "$(prop Result)" != success ] || [ "$(prop ExecMainStatus)" != 0 ]; then
	fail "Result=$(prop Result), exit status $(prop ExecMainStatus)"
elif [ "$(prop ActiveState kvpoold.socket)" != active ]; then
	fail "kvpoold.socket stopped with the service"
elif ! ctl ping >/dev/null || ! is_running; then
	fail "the socket does not start kvpoold again"
elif ! stop || [ "$(prop Result)" != success ]; then
	fail "the second stop: Result=$(prop Result): $(cat "$work/stop.out")"
else
	pass "Result=$(prop Result), exit status $(prop ExecMainStatus), the socket still listens"
fi

echo "== system: $npass passed, $nfail failed, $nskip skipped in $((SECONDS - t0)) s" \
	"${failed[*]:+(failed: ${failed[*]})}"
[ "$nfail" = 0 ]
