#!/usr/bin/env bash
# Runs every fuzz target (fuzz/fuzz_targets/*.rs) under libFuzzer, with
# AddressSanitizer and debug assertions, for a fixed number of executions
# and exits non-zero if any target crashes. Ends with a summary line:
# "fuzz: N passed, M failed".
#
#   FUZZ_RUNS=20000   executions per target
#   FUZZ_SMOKE_LOOP=1 skip libFuzzer and run the smoke loop below
#   FUZZ_BUILD_ONLY=1 build the targets and stop (scripts/test.sh builds
#                     them while other work runs, then runs them)
#
# The targets are built by cargo with the flags cargo-fuzz 0.13 passes
# (`cargo fuzz build -v` prints them), not by cargo-fuzz itself: installing
# it from source was 47 s of every CI run on a clean machine, for a build
# this script can start directly. The build is at opt-level 1: measured in
# CPU seconds (user + sys) on this 2-CPU machine, release + ASan took 316 s
# to build and 5 s for 20000 runs of the five targets; opt-level 1 + ASan
# 198 s and 7 s; a debug build 109 s and 60 s. bench/fuzz-long keeps
# cargo-fuzz's optimised build for its long runs.
#
# If a libFuzzer build is impossible, the libFuzzer-free smoke loop
# (`cargo test --release` in fuzz/: seeds plus deterministic mutations,
# no sanitizers) runs instead, with the reason printed.
# Crashing inputs are saved under fuzz/artifacts/<target>/.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

RUNS=${FUZZ_RUNS:-20000}
if ! command -v cargo >/dev/null 2>&1 && [ -f "$HOME/.cargo/env" ]; then
  . "$HOME/.cargo/env"
fi

TARGETS=()
for f in fuzz_targets/*.rs; do
  TARGETS+=("$(basename "$f" .rs)")
done

fallback() {
  echo "fuzz: $1; running the libFuzzer-free smoke loop instead (cargo test --release, SMOKE_RUNS=$RUNS)"
  local log rc=0
  log=$(mktemp)
  SMOKE_RUNS=$RUNS cargo test --release -- --test-threads=2 >"$log" 2>&1 || rc=$?
  local passed failed
  passed=$(grep -o '^test [a-z_]*_smoke \.\.\. ok' "$log" | wc -l || true)
  failed=$(grep -o '^test [a-z_]*_smoke \.\.\. FAILED' "$log" | wc -l || true)
  if [ "$rc" != 0 ]; then
    cat "$log"
    [ "$failed" -gt 0 ] || failed=1
  fi
  rm -f "$log"
  echo "fuzz: $passed passed, $failed failed (smoke loop)"
  [ "$rc" = 0 ]
  exit
}

if [ "${FUZZ_SMOKE_LOOP:-0}" = 1 ]; then
  fallback "FUZZ_SMOKE_LOOP=1"
fi
export RUSTC_BOOTSTRAP=1 # sanitizer flags on the stable toolchain
export CARGO_PROFILE_RELEASE_OPT_LEVEL=1
FLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4"
FLAGS+=" -Cllvm-args=-sanitizer-coverage-inline-8bit-counters"
FLAGS+=" -Cllvm-args=-sanitizer-coverage-pc-table"
FLAGS+=" -Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing"
FLAGS+=" -Cllvm-args=-simplifycfg-branch-fold-threshold=0 -Zsanitizer=address"
FLAGS+=" -Cllvm-args=-sanitizer-coverage-stack-depth -Cdebug-assertions"
FLAGS+=" -Ccodegen-units=16"
TRIPLE=x86_64-unknown-linux-gnu
BIN=target/$TRIPLE/release
echo "fuzz: building ${#TARGETS[@]} targets (${TARGETS[*]})"
start=$SECONDS
if ! RUSTFLAGS="$FLAGS" cargo build --release --target "$TRIPLE" --bins \
  >/tmp/fuzz-build.$$.log 2>&1; then
  tail -20 /tmp/fuzz-build.$$.log
  rm -f /tmp/fuzz-build.$$.log
  fallback "the libFuzzer build failed"
fi
rm -f /tmp/fuzz-build.$$.log
echo "fuzz: build took $((SECONDS - start)) s"
if [ "${FUZZ_BUILD_ONLY:-0}" = 1 ]; then
  exit 0
fi

WORK=$(mktemp -d /tmp/fuzz-smoke.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
passed=0
failed=0
for t in "${TARGETS[@]}"; do
  mkdir -p "$WORK/$t" "artifacts/$t"
  t0=$SECONDS
  # A scratch corpus first, so what libFuzzer finds does not land among the
  # committed seeds.
  if ASAN_OPTIONS=detect_odr_violation=0 "$BIN/$t" "$WORK/$t" "corpus/$t" \
    -artifact_prefix="artifacts/$t/" -runs="$RUNS" -max_len=65536 \
    -rss_limit_mb=2048 -print_final_stats=0 >"$WORK/$t.log" 2>&1; then
    passed=$((passed + 1))
    echo "fuzz: $t: $RUNS runs, no crash ($((SECONDS - t0)) s)"
  else
    failed=$((failed + 1))
    echo "fuzz: $t: FAILED after $((SECONDS - t0)) s; last lines of its log:"
    tail -40 "$WORK/$t.log"
    ls -1 "artifacts/$t" | sed "s|^|fuzz:   saved input: fuzz/artifacts/$t/|"
  fi
done
echo "fuzz: $passed passed, $failed failed"
[ "$failed" = 0 ]
