#!/usr/bin/env bash
# Set-up for vmscope on a Debian 12 host, as root: installs the packages the
# tool, its lab and its tests use, then builds vmscope and the static guest
# agent in release mode. Idempotent: a second run only rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

# What the tests need besides vmscope, built beside the main build (below):
# - the OpenTelemetry Collector that the export tests send OTLP profiles to
#   (OTLP receiver with the profiles feature gate, file exporter), built
#   from the collector's own Go modules (tools/otelcol) once and kept in
#   target/; rebuilt only when its sources change. The module and build
#   caches (~/go/pkg/mod, ~/.cache/go-build) make a rebuild after a fresh
#   clone a link;
# - `go tool pprof`, which the pprof tests run: Go 1.24 and later ship it
#   as source, built (and cached) at its first use.
side_builds() {
  local GO otelcol
  GO=$(command -v go || echo /usr/local/go/bin/go)
  otelcol="$(realpath -m "${CARGO_TARGET_DIR:-target}")/otelcol-vmscope"
  if [ ! -x "$otelcol" ] || [ tools/otelcol/go.sum -nt "$otelcol" ] \
     || [ tools/otelcol/main.go -nt "$otelcol" ]; then
    echo "setup: building the OpenTelemetry Collector for the export tests (tools/otelcol)"
    mkdir -p "$(dirname "$otelcol")"
    if ! (cd tools/otelcol && "$GO" build -trimpath -ldflags=-s -o "$otelcol" .); then
      echo "setup: building tools/otelcol failed (Go 1.26 and the Go module proxy are needed): the OTLP export tests will skip" >&2
    fi
  fi
  "$GO" tool pprof -h >/dev/null 2>&1 || echo "setup: go tool pprof does not build: the pprof tests will skip" >&2
}
side_pid=""
side_log="$(realpath -m "${CARGO_TARGET_DIR:-target}")/setup-side.log"
start_side_builds() {
  [ -n "$side_pid" ] && return
  mkdir -p "$(dirname "$side_log")"
  echo "setup: building the Collector and go tool pprof in the background ($side_log)"
  nice -n 19 bash -c "$(declare -f side_builds); side_builds" >"$side_log" 2>&1 &
  side_pid=$!
}
wait_side_builds() {
  start_side_builds
  local rc=0
  wait "$side_pid" || rc=$?
  cat "$side_log"
  if [ "$rc" != 0 ]; then
    echo "setup: a side build failed (exit $rc, above)" >&2
    exit "$rc"
  fi
}

PKGS=(
  linux-perf          # the peer for record/report/import comparisons
  qemu-system-x86     # lab VMs (TCG here, KVM where it works)
  qemu-utils          # qemu-img for qcow2/raw disk images
  busybox-static      # guest userland
  cpio                # guest initramfs
  kmod                # modinfo: guest module order
  iproute2            # taps and bridges for lab NICs
  sysstat             # pidstat, the peer for stat
  prometheus          # scrapes `vmscope serve` in the stat tests; remote-write receiver in the export tests
  victoria-metrics    # remote-write receiver (plain and HTTPS) in the export tests
  fio iperf3 httperf  # benchmark peers
  sqlite3             # sessions are readable with the sqlite3 CLI
  time                # GNU time: wall, CPU and peak RSS for bench/vs-perf
  util-linux          # losetup, setpriv
  procps              # pkill
  gcc g++ binutils libc6-dev  # ELF fixtures and programs copied into guests by the tests
  clang libelf-dev pkg-config  # the eBPF programs (crates/bpf): clang -target bpf, libbpf built against libelf
  tmux                # vmscope top is tested in a real terminal
  dpkg-dev lintian    # the .deb: dpkg-shlibdeps for its dependencies, lintian checks it
  man-db curl libcap2-bin  # package test: man -w, /metrics, capsh
  chromium            # headless browser that loads `report --format html` in the tests
  libvirt-daemon-system libvirt-clients  # libvirtd + virsh: the libvirt tests (crates/cli/tests/libvirt.rs)
)
# `go tool pprof` reads `report --format pprof` in the tests: Debian's Go
# where no Go is installed already.
if ! command -v go >/dev/null 2>&1 && [ ! -x /usr/local/go/bin/go ]; then
  PKGS+=(golang-go)
fi
# Go and cargo are there already on most machines: the side builds start
# before the packages install (mostly waiting on the network and the disk).
if command -v cargo >/dev/null 2>&1 && { command -v go >/dev/null 2>&1 || [ -x /usr/local/go/bin/go ]; }; then
  start_side_builds
fi
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  if [ "$(id -u)" != 0 ]; then
    echo "setup: run as root (apt-get install needs it)" >&2
    exit 2
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Lab VMs with tap NICs need /dev/net/tun; some containers lack the node
# although the kernel has the driver.
if [ ! -e /dev/net/tun ] && [ "$(id -u)" = 0 ]; then
  mkdir -p /dev/net && mknod /dev/net/tun c 10 200 && chmod 666 /dev/net/tun \
    || echo "setup: /dev/net/tun is missing and cannot be created: lab tests with tap NICs will fail" >&2
fi

if ! command -v cargo >/dev/null 2>&1; then
  [ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
fi
command -v cargo >/dev/null 2>&1 || { echo "setup: cargo (Rust) is required" >&2; exit 2; }

start_side_builds
echo "setup: building vmscope (release)"
cargo build --release --workspace --bins --quiet
echo "setup: building the static guest agent"
CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS="-C target-feature=+crt-static -C force-frame-pointers=yes" \
  cargo build --release -p vmscope-agent --target x86_64-unknown-linux-gnu --quiet
# The side builds run in the background at nice 19 while the main build
# runs, so they take the CPU time it leaves idle (a chain of crates that
# wait for each other, the links) rather than time of their own: about
# 4 minutes of a clean machine's set-up otherwise.
wait_side_builds
echo "setup: done: target/release/vmscope, target/x86_64-unknown-linux-gnu/release/vmscope-agent"
