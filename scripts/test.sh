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
trap tally EXIT
echo "== cargo test (release, so tests reuse the set-up build)"
cargo test --workspace --release --no-fail-fast -- --test-threads=2
echo "== Debian package (build, lintian, install, check, purge)"
scripts/deb-test.sh
if [ -x scripts/fuzz-smoke.sh ]; then
  echo "== fuzz smoke"
  scripts/fuzz-smoke.sh
fi
