#!/usr/bin/env bash
# Runs every fuzz target (fuzz/fuzz_targets/*.rs) under libFuzzer, with
# AddressSanitizer and debug assertions, for a fixed number of executions and exits non-zero if any target crashes. Ends with a
# summary line: "fuzz: N passed, M failed".
#
#   FUZZ_RUNS=20000   executions per target
#   FUZZ_SMOKE_LOOP=1 skip libFuzzer and run the smoke loop below
#
# cargo-fuzz is installed (cargo install --locked) when missing. If it cannot
# be installed or a libFuzzer build is impossible, the libFuzzer-free smoke
# loop (`cargo test --release` in fuzz/: seeds plus deterministic mutations,
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
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz: installing cargo-fuzz"
  if ! cargo install cargo-fuzz --locked --quiet >/dev/null 2>&1; then
    fallback "cargo-fuzz could not be installed"
  fi
fi

export RUSTC_BOOTSTRAP=1 # sanitizer flags on the stable toolchain
echo "fuzz: building ${#TARGETS[@]} targets (${TARGETS[*]})"
start=$SECONDS
# Debug assertions on (cargo-fuzz's default), 16 codegen units: a build
# several times faster than one unit, for a few per cent of speed.
if ! cargo fuzz build --codegen-units 16 >/tmp/fuzz-build.$$.log 2>&1; then
  tail -20 /tmp/fuzz-build.$$.log
  rm -f /tmp/fuzz-build.$$.log
  fallback "the libFuzzer build failed"
fi
rm -f /tmp/fuzz-build.$$.log
echo "fuzz: build took $((SECONDS - start)) s"

WORK=$(mktemp -d /tmp/fuzz-smoke.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
passed=0
failed=0
for t in "${TARGETS[@]}"; do
  mkdir -p "$WORK/$t" "artifacts/$t"
  t0=$SECONDS
  # A scratch corpus first, so what libFuzzer finds does not land among the
  # committed seeds.
  if cargo fuzz run --codegen-units 16 "$t" "$WORK/$t" "corpus/$t" -- \
    -runs="$RUNS" -max_len=65536 -rss_limit_mb=2048 -print_final_stats=0 \
    >"$WORK/$t.log" 2>&1; then
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
