#!/usr/bin/env bash
# Set-up, then the whole test suite: formatting, lints, unit, host (root),
# lab (QEMU) and fuzz-smoke tests. A test that cannot make its check logs
# "SKIP: <reason>" (crates/testkit); under CI ($CI set) that is a failure,
# and every run ends with a tally of the skips by reason.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

export VMSCOPE_AGENT="$PWD/target/x86_64-unknown-linux-gnu/release/vmscope-agent"
# One guest image cache for every lab test of this run.
export VMSCOPE_CACHE="${VMSCOPE_CACHE:-$PWD/target/vmscope-cache}"

mkdir -p target
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy -D warnings"
cargo clippy --workspace --all-targets --quiet -- -D warnings
export VMSCOPE_SKIP_LOG="$PWD/target/skips.log"
: > "$VMSCOPE_SKIP_LOG"
tally() {
  echo "== skipped checks (target/skips.log)"
  if [ -s "$VMSCOPE_SKIP_LOG" ]; then
    cut -f1,3 "$VMSCOPE_SKIP_LOG" | sort | uniq -c | sort -rn
  else
    echo "none"
  fi
}
side=""
finish() {
  # The whole group: the shell, cargo and every rustc under it.
  if [ -n "$side" ]; then kill -- "-$side" 2>/dev/null || kill "$side" 2>/dev/null || true; fi
  tally
}
trap finish EXIT
echo "== cargo test: build (release, so tests reuse the set-up build)"
cargo test --workspace --release --no-run --quiet
# What the steps after the tests need is built while they run, at nice 19:
# the fuzz targets (their own workspace and target directory, sanitizer
# flags) and cargo-deb for the package. The lab tests leave a CPU idle for
# much of their time (guests booting, waits of fixed length), and a nice-19
# task gets about 1.5 % of a CPU a test's task also wants; built before the
# tests instead, beside clippy and the test build, they took about 2 of
# the set-up's minutes.
echo "== fuzz targets and cargo-deb: building in the background (target/side-build.log)"
# One job at a time and the idle I/O class, so that it takes little
# memory and disk bandwidth from the tests either; a process group of its
# own (setsid), which finish() stops whole. A session is an autogroup
# too (kernel.sched_autogroup_enabled), and nice orders tasks only within
# their autogroup: at the autogroup's own nice of 0 the build weighed as
# much as a whole VM (QEMU is a session of its own), and took a third of
# a CPU two lab VMs were pinned to. Its autogroup is set to nice 19 from
# inside, once setsid has made it.
CARGO_BUILD_JOBS=1 setsid nice -n 19 ionice -c 3 bash -c '
  if [ -w /proc/self/autogroup ]; then echo 19 > /proc/self/autogroup || true; fi
  if [ -x scripts/fuzz-smoke.sh ]; then FUZZ_BUILD_ONLY=1 scripts/fuzz-smoke.sh; fi
  command -v cargo-deb >/dev/null 2>&1 || cargo install cargo-deb --locked --version 3.8.0 --quiet
' >target/side-build.log 2>&1 &
side=$!
echo "== cargo test: run"
test_rc=0
cargo test --workspace --release --no-fail-fast -- --test-threads=2 || test_rc=$?
[ "$test_rc" = 0 ] || exit "$test_rc"
side_rc=0
wait "$side" || side_rc=$?
side=""
# Its outcome is said by the steps that use it (the fuzz smoke rebuilds, or
# runs its fallback, when this build failed).
echo "fuzz targets and cargo-deb: $(tail -n 1 target/side-build.log) (exit $side_rc)"
echo "== Debian package (build, lintian, install, check, purge)"
scripts/deb-test.sh
if [ -x scripts/fuzz-smoke.sh ]; then
  echo "== fuzz smoke"
  scripts/fuzz-smoke.sh
fi
