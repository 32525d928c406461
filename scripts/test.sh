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

# The fuzz targets (their own workspace and target directory, built with
# sanitizer flags) build while formatting, lints and the test build run:
# those leave a CPU idle for much of their time (long chains of crates
# that wait for each other, links one at a time). Nothing timed runs
# beside it: the tests start once it is done.
mkdir -p target
fuzz_build=""
if [ -x scripts/fuzz-smoke.sh ]; then
  echo "== fuzz targets: building in the background (target/fuzz-build.log)"
  FUZZ_BUILD_ONLY=1 scripts/fuzz-smoke.sh >target/fuzz-build.log 2>&1 &
  fuzz_build=$!
fi
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
finish() {
  if [ -n "$fuzz_build" ]; then kill "$fuzz_build" 2>/dev/null || true; fi
  tally
}
trap finish EXIT
echo "== cargo test: build (release, so tests reuse the set-up build)"
cargo test --workspace --release --no-run --quiet
if [ -n "$fuzz_build" ]; then
  fuzz_rc=0
  wait "$fuzz_build" || fuzz_rc=$?
  fuzz_build=""
  # Its outcome is said by the fuzz smoke below (which rebuilds, or runs
  # its fallback, when this build failed).
  echo "fuzz targets: $(tail -n 1 target/fuzz-build.log) (exit $fuzz_rc)"
fi
echo "== cargo test: run"
cargo test --workspace --release --no-fail-fast -- --test-threads=2
echo "== Debian package (build, lintian, install, check, purge)"
scripts/deb-test.sh
if [ -x scripts/fuzz-smoke.sh ]; then
  echo "== fuzz smoke"
  scripts/fuzz-smoke.sh
fi
