#!/usr/bin/env bash
# The Debian package end to end, as root on Debian 12 (scripts/test.sh runs
# it after the cargo tests): build it (packaging/build-deb.sh), lintian (no
# errors), install it with apt (dependencies resolved), then check from the
# installed files: `vmscope --version` names the commit and a session stores
# the same string; vmscope finds its own symbols in /usr/lib/debug;
# `man -w vmscope-record`; bash completion of `vmscope re<TAB>`; the serve
# unit verifies, and its ExecStart line, run with /etc/default/vmscope and
# only the unit's capabilities, answers /metrics with a QEMU's vCPU, QMP disk
# and softirq series; `lab image` packs the installed agent. Then purge, and
# nothing of the package is left.
#
# Everything from install to purge holds /tmp/vmscope-heavy.lock: serve reads
# every process and opens perf events, and the package is installed system-wide.
set -euo pipefail
cd "$(dirname "$0")/.."

[ "$(id -u)" = 0 ] || { echo "deb-test: run as root (it installs a package)" >&2; exit 2; }
fail() { echo "deb-test: FAIL: $*" >&2; exit 1; }
step() { echo "== deb: $*"; }

step "build"
deb=$(packaging/build-deb.sh | tail -n 1)
[ -f "$deb" ] || fail "packaging/build-deb.sh gave no package ($deb)"
built_version=$(target/release/vmscope --version)
echo "$deb ($(du -h "$deb" | cut -f1)), $built_version"

step "lintian"
# --fail-on error: warnings are printed, errors fail the test.
lintian_rc=0
lintian --fail-on error "$deb" >/tmp/vmscope-deb-lintian.$$ 2>&1 || lintian_rc=$?
grep -v "running with root privileges" /tmp/vmscope-deb-lintian.$$ || true
rm -f /tmp/vmscope-deb-lintian.$$
[ "$lintian_rc" = 0 ] || fail "lintian reports errors (above)"
echo "lintian: no errors"

work=$(mktemp -d /tmp/vmscope-deb-test.XXXXXX)
qemu_pid=""
serve_pid=""
installed=""
kept_cache=""
cleanup() {
  [ -n "$serve_pid" ] && kill "$serve_pid" 2>/dev/null || true
  [ -n "$qemu_pid" ] && kill "$qemu_pid" 2>/dev/null || true
  if [ -n "$installed" ] && dpkg-query -W -f='${Status}' vmscope 2>/dev/null | grep -q "install ok"; then
    DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq vmscope >/dev/null 2>&1 || true
  fi
  [ -n "$kept_cache" ] && [ -d "$kept_cache" ] && mv "$kept_cache" /var/cache/vmscope
  rm -rf "$work"
}
trap cleanup EXIT

exec 9>/tmp/vmscope-heavy.lock
waited=$SECONDS
flock 9
waited=$((SECONDS - waited))

if dpkg-query -W -f='${Status}' vmscope 2>/dev/null | grep -q "ok installed"; then
  # Someone's real installation (and their /etc/default/vmscope): leave it.
  echo "SKIP: install/check/purge: a vmscope package is installed here ($(dpkg-query -W -f='${Version}' vmscope)); this test would replace and purge it"
  exit 0
fi
# Purge removes the lab image cache /var/cache/vmscope: keep one that a
# checkout's lab made before this test, and put it back at the end.
if [ -e /var/cache/vmscope ]; then
  kept_cache=/var/cache/vmscope.deb-test-kept.$$
  mv /var/cache/vmscope "$kept_cache"
fi

step "apt-get install $deb"
installed=yes
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$(realpath "$deb")" >"$work/apt.log" 2>&1 ||
  { cat "$work/apt.log"; fail "apt-get install failed"; }
dpkg -L vmscope | sort >"$work/files"
echo "$(grep -c . "$work/files") paths installed"

step "vmscope --version"
v=$(cd "$work" && /usr/bin/vmscope --version)
echo "$v"
# The commit and state of the binary's sources, as crates/cli/build.rs names them.
if head=$(git rev-parse --short=12 HEAD 2>/dev/null); then
  if [ -z "$(git --no-optional-locks status --porcelain --untracked-files=no -- \
    Cargo.toml Cargo.lock labs 'crates/*/Cargo.toml' 'crates/*/build.rs' 'crates/*/src')" ]; then
    state=clean
  else
    state=dirty
  fi
  want_build="commit $head, $state"
else
  want_build="unknown commit"
fi
[[ "$v" =~ ^vmscope\ [0-9]+\.[0-9]+\.[0-9]+\ \((.*)\)$ ]] || fail "version '$v' is not 'vmscope X.Y.Z (...)'"
[ "${BASH_REMATCH[1]}" = "$want_build" ] || fail "version '$v' does not say '$want_build'"
[ "$v" = "$built_version" ] || fail "installed '$v' is not the build '$built_version'"

step "a session stores the version; vmscope finds its own symbols in /usr/lib/debug"
(cd "$work" && /usr/bin/vmscope record -F 499 -o demo.db -- /usr/bin/vmscope demo -d 1) 2>"$work/record.err" ||
  { cat "$work/record.err"; fail "record of the installed demo failed"; }
stored=$(sqlite3 "$work/demo.db" "select value from meta where key = 'vmscope_version'")
[ "vmscope $stored" = "$v" ] || fail "session's vmscope_version '$stored' is not '$v'"
/usr/bin/vmscope report --by symbol --format csv "$work/demo.db" >"$work/demo.csv"
for f in vmscope_demo_alpha vmscope_demo_beta vmscope_demo_gamma; do
  grep -q "$f" "$work/demo.csv" || { head "$work/demo.csv"; fail "$f not symbolized (debug file not found?)"; }
done
echo "vmscope_version = $stored; demo functions symbolized from the stripped binary"

step "man pages"
if grep -qs '^path-exclude.*/usr/share/man' /etc/dpkg/dpkg.cfg.d/*; then
  echo "SKIP: dpkg here drops /usr/share/man (path-exclude in /etc/dpkg/dpkg.cfg.d), so no page is installed"
else
  page=$(man -w vmscope-record) || fail "man -w vmscope-record finds nothing"
  echo "vmscope-record: $page"
  [ "$page" = /usr/share/man/man1/vmscope-record.1.gz ] || fail "vmscope-record page at $page"
  # One page per subcommand, nested ones too, as --help lists them.
  subs=$(/usr/bin/vmscope --help | awk '/^Commands:/{on=1;next} on&&/^  [a-z]/{print $1} on&&/^$/{exit}' | grep -vx help)
  for s in $subs; do man -w "vmscope-$s" >/dev/null || fail "no man page vmscope-$s"; done
  for s in $(/usr/bin/vmscope lab --help | awk '/^Commands:/{on=1;next} on&&/^  [a-z]/{print $1} on&&/^$/{exit}' | grep -vx help); do
    man -w "vmscope-lab-$s" >/dev/null || fail "no man page vmscope-lab-$s"
  done
  MANWIDTH=200 man vmscope-record 2>/dev/null | grep -q -- "--all-cpus" || fail "vmscope-record(1) lacks --all-cpus"
  echo "$(echo $subs | wc -w) subcommand pages + lab's, all found"
fi

step "shell completions"
comp=$(bash --norc --noprofile -c '
  source /usr/share/bash-completion/completions/vmscope
  complete -p vmscope
  COMP_WORDS=(vmscope re); COMP_CWORD=1; COMP_LINE="vmscope re"; COMP_POINT=${#COMP_LINE}
  _vmscope vmscope re vmscope
  echo "re<TAB>: ${COMPREPLY[*]}"
  COMP_WORDS=(vmscope record --all); COMP_CWORD=2; COMP_LINE="vmscope record --all"; COMP_POINT=${#COMP_LINE}
  _vmscope vmscope --all record
  echo "record --all<TAB>: ${COMPREPLY[*]}"')
echo "$comp"
grep -q -- "-F _vmscope vmscope$" <<<"$comp" || fail "complete -p vmscope: no -F _vmscope"
grep -qx "re<TAB>: record report" <<<"$comp" || fail "vmscope re<TAB> did not complete to record report"
grep -qx "record --all<TAB>: --all-cpus" <<<"$comp" || fail "vmscope record --all<TAB> did not complete to --all-cpus"
head -n 1 /usr/share/zsh/vendor-completions/_vmscope | grep -q "^#compdef vmscope" || fail "zsh completion header"
grep -q "complete -c vmscope" /usr/share/fish/vendor_completions.d/vmscope.fish || fail "fish completion"

step "systemd unit"
unit=/usr/lib/systemd/system/vmscope-serve.service
if command -v systemd-analyze >/dev/null 2>&1; then
  systemd-analyze verify "$unit" || fail "systemd-analyze verify $unit"
  systemd-analyze security --offline=yes "$unit" 2>/dev/null | tail -n 1
else
  echo "SKIP: systemd-analyze verify (systemd is not installed here)"
fi
key() { sed -n "s/^$1=//p" "$unit" | tail -n 1; }
exec_start=$(key ExecStart)
env_file=$(key EnvironmentFile); env_file=${env_file#-}
caps=$(key AmbientCapabilities)
[ "$(key CapabilityBoundingSet)" = "$caps" ] || fail "bounding set and ambient capabilities differ"
[ "$(key NoNewPrivileges)" = yes ] || fail "NoNewPrivileges is not yes"
[ -f "$env_file" ] || fail "EnvironmentFile $env_file not installed"
# --profile starts a broker per VM under /run/vmscope/brokers: the unit must
# make it writable (ProtectSystem=strict), or every VM turns passive.
grep -qw 'vmscope/brokers' <<<"$(key RuntimeDirectory)" ||
  fail "the unit does not make /run/vmscope/brokers writable (RuntimeDirectory)"
[ "$(key RuntimeDirectoryPreserve)" = yes ] ||
  fail "RuntimeDirectoryPreserve is not yes (lab state under /run/vmscope would go with the service)"
echo "ExecStart=$exec_start; EnvironmentFile=$env_file; capabilities: $caps"
setpriv_caps=$(for c in $caps; do c=${c#CAP_}; printf ',+%s' "${c,,}"; done)

# A VM the way libvirt runs one: QEMU as another user (nobody), its QMP
# socket in a directory only that user may enter, one virtio disk.
vmdir="$work/vm"
mkdir -p "$vmdir"; chmod 711 "$work"; chown 65534:65534 "$vmdir"; chmod 700 "$vmdir"
truncate -s 8M "$vmdir/disk.raw"; chown 65534:65534 "$vmdir/disk.raw"
setpriv --reuid=65534 --regid=65534 --clear-groups \
  qemu-system-x86_64 -name deb-test-vm,debug-threads=on -accel tcg -m 64 -display none \
  -qmp "unix:$vmdir/qmp.sock,server=on,wait=off" -drive "file=$vmdir/disk.raw,format=raw,if=virtio,id=d0" \
  -daemonize -pidfile "$vmdir/qemu.pid" || fail "could not start QEMU"
qemu_pid=$(cat "$vmdir/qemu.pid")
# What sys-kernel-tracing.mount (Wants= of the unit) does at boot.
mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing

step "serve: the unit's ExecStart with $env_file, as root with only its capabilities"
# systemd splits an unquoted $VAR of ExecStart on whitespace, as sh does.
env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
  setpriv --bounding-set=-all$setpriv_caps --inh-caps=-all$setpriv_caps --ambient-caps=-all$setpriv_caps --no-new-privs -- \
  sh -c "set -a; . '$env_file'; set +a; exec $exec_start" >"$work/serve.log" 2>&1 &
serve_pid=$!
opts=$(sh -c ". '$env_file'; echo \"\$VMSCOPE_SERVE_OPTS\"")
listen=$(sed -n 's/.*--listen[= ]\([^ ]*\).*/\1/p' <<<"$opts")
[ -n "$listen" ] || fail "no --listen in $env_file ($opts)"
for _ in $(seq 50); do
  curl -sf "http://$listen/metrics" >/dev/null 2>&1 && break
  kill -0 "$serve_pid" 2>/dev/null || { cat "$work/serve.log"; fail "serve exited"; }
  sleep 0.2
done
sleep 1
curl -sf "http://$listen/metrics" >"$work/metrics" || { cat "$work/serve.log"; fail "no answer on http://$listen/metrics"; }
capeff=$(sed -n 's/^CapEff:\s*//p' "/proc/$serve_pid/status")
echo "serve pid $serve_pid on $listen: uid $(sed -n 's/^Uid:\s*\([0-9]*\).*/\1/p' /proc/$serve_pid/status), effective capabilities $(capsh --decode="$capeff" | cut -d= -f2)"
want=$(for c in $caps; do echo "${c,,}"; done | sort | paste -sd,)
have=$(capsh --decode="$capeff" | cut -d= -f2 | tr ',' '\n' | sort | paste -sd,)
[ "$have" = "$want" ] || fail "serve ran with capabilities $have, not the unit's $want"
grep -c '^vmscope_' "$work/metrics" | sed 's/^/series: /'
for series in \
  'vmscope_vcpu_run_seconds_total{domain="deb-test-vm",vcpu="0"}' \
  'vmscope_domain_io_operations_total{domain="deb-test-vm",device="disk:d0"}' \
  'vmscope_host_softirq_seconds_total{vector='; do
  grep -qF "$series" "$work/metrics" || { grep '^vmscope_' "$work/metrics" | head -20; fail "/metrics lacks $series"; }
done
run_s=$(grep -F 'vmscope_vcpu_run_seconds_total{domain="deb-test-vm",vcpu="0"}' "$work/metrics" | awk '{print $2}')
awk -v r="$run_s" 'BEGIN{exit !(r > 0)}' || fail "deb-test-vm vCPU 0 ran $run_s s"
echo "deb-test-vm vCPU 0 ran $run_s s; disk:d0 counted over QMP; softirq from tracepoints"
kill "$serve_pid"; wait "$serve_pid" 2>/dev/null || true; serve_pid=""

step "serve --profile with the unit's capabilities names kernel functions, and says when it cannot"
# With the unit's set (CAP_SYSLOG among it) /proc/kallsyms shows addresses;
# without CAP_SYSLOG, under kernel.perf_event_paranoid=2 and
# kernel.kptr_restrict=1 (Debian's defaults), it does not: serve must say so
# on stderr and in /metrics rather than serve raw addresses silently.
old_kptr=$(cat /proc/sys/kernel/kptr_restrict); old_paranoid=$(cat /proc/sys/kernel/perf_event_paranoid)
echo 1 > /proc/sys/kernel/kptr_restrict; echo 2 > /proc/sys/kernel/perf_event_paranoid
profile_metrics() { # $1: capabilities for setpriv, $2: output file
  env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
    setpriv --bounding-set=-all$1 --inh-caps=-all$1 --ambient-caps=-all$1 --no-new-privs -- \
    /usr/bin/vmscope serve --listen 127.0.0.1:0 --profile >"$2.log" 2>&1 &
  serve_pid=$!
  local url=""
  for _ in $(seq 100); do
    url=$(sed -n 's/^vmscope serve: \(http:.*\/metrics\)$/\1/p' "$2.log" | head -n 1)
    [ -n "$url" ] && curl -sf "$url" >"$2" 2>/dev/null && break
    kill -0 "$serve_pid" 2>/dev/null || break
    sleep 0.2
  done
  kill "$serve_pid" 2>/dev/null; wait "$serve_pid" 2>/dev/null || true; serve_pid=""
}
profile_metrics "$setpriv_caps" "$work/profile-unit"
no_syslog=$(sed 's/,+syslog//' <<<"$setpriv_caps")
profile_metrics "$no_syslog" "$work/profile-nosyslog"
echo "$old_kptr" > /proc/sys/kernel/kptr_restrict; echo "$old_paranoid" > /proc/sys/kernel/perf_event_paranoid
grep -qx 'vmscope_profile_kernel_symbols 1' "$work/profile-unit" ||
  { cat "$work/profile-unit.log"; grep vmscope_profile "$work/profile-unit"; fail "serve --profile with the unit's capabilities cannot name kernel functions"; }
grep -qx 'vmscope_profile_kernel_symbols 0' "$work/profile-nosyslog" ||
  { cat "$work/profile-nosyslog.log"; fail "serve --profile without CAP_SYSLOG did not say kernel_symbols 0"; }
grep -q 'warning: /proc/kallsyms shows this process no addresses' "$work/profile-nosyslog.log" ||
  { cat "$work/profile-nosyslog.log"; fail "serve --profile without CAP_SYSLOG said nothing on stderr"; }
grep -q 'vmscope_profile_vm_active{domain="deb-test-vm"} 0' "$work/profile-unit" ||
  { grep vmscope_profile "$work/profile-unit"; fail "the VM without an agent is not named as passive"; }
echo "with CAP_SYSLOG: kernel functions named; without: said on stderr and in /metrics; the agentless VM: vmscope_profile_vm_active 0"
kill "$qemu_pid"; qemu_pid=""

step "lab image finds the installed agent"
a=$(/usr/lib/vmscope/vmscope-agent --version) || fail "the installed agent does not run"
ldd /usr/lib/vmscope/vmscope-agent 2>&1 | grep -q "statically linked" || fail "the installed agent is not static"
echo "$a, statically linked"
cache=${VMSCOPE_CACHE:-$PWD/target/vmscope-cache}
mkdir -p "$work/elsewhere"
img=$(cd "$work/elsewhere" && env -u VMSCOPE_AGENT -u CARGO_TARGET_DIR VMSCOPE_CACHE="$cache" \
  /usr/bin/vmscope lab image --format json) || fail "lab image with the installed vmscope failed"
agent=$(sed -n 's/^ *"agent": "\(.*\)",\{0,1\}$/\1/p' <<<"$img")
[ "$agent" = /usr/lib/vmscope/vmscope-agent ] || fail "lab image packed $agent"
echo "agent: $agent"

step "purge"
DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq vmscope >"$work/apt.log" 2>&1 ||
  { cat "$work/apt.log"; fail "apt-get purge failed"; }
if dpkg-query -W -f='${Status}' vmscope 2>/dev/null | grep -q .; then
  [ -z "$(dpkg-query -W -f='${Status}' vmscope 2>/dev/null | grep -v 'not-installed')" ] ||
    fail "dpkg still knows vmscope: $(dpkg-query -W -f='${Status}' vmscope)"
fi
[ -z "$(dpkg -L vmscope 2>/dev/null)" ] || fail "dpkg -L vmscope still lists files"
left=0
while read -r f; do
  # Directories shared with other packages (/usr/bin, /etc/default, ...) stay.
  if [ -e "$f" ] && ! [ -d "$f" ]; then echo "left behind: $f"; left=$((left + 1)); fi
  if [ -d "$f" ] && [[ "$f" == */vmscope || "$f" == */vmscope/* ]]; then echo "left behind: $f/"; left=$((left + 1)); fi
done <"$work/files"
for f in /etc/default/vmscope /var/cache/vmscope /etc/systemd/system/multi-user.target.wants/vmscope-serve.service; do
  [ -e "$f" ] && { echo "left behind: $f"; left=$((left + 1)); }
done
[ "$left" = 0 ] || fail "$left path(s) left after purge"
echo "purged: none of the $(grep -c . "$work/files") paths is left, /etc/default/vmscope removed"
echo "deb-test: ok in $SECONDS s ($waited s of it waiting for /tmp/vmscope-heavy.lock)"
