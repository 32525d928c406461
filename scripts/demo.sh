#!/usr/bin/env bash
# Set-up, then the main job: boot the default lab (labs/one-vm.toml), profile
# the host and the VM for a few seconds while the demo workload runs in the
# guest, print the report, tear the lab down.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export VMSCOPE_AGENT="$PWD/target/x86_64-unknown-linux-gnu/release/vmscope-agent"
V=target/release/vmscope
OUT=${OUT:-vmscope.db}
SECONDS_TO_RECORD=${SECONDS_TO_RECORD:-5}

if $V lab --help >/dev/null 2>&1 && $V lab up labs/one-vm.toml; then
  trap '$V lab down one-vm >/dev/null 2>&1 || true' EXIT
  # The guest runs the demo workload while the host records every CPU.
  $V lab exec one-vm -- /bin/vmscope-agent demo -d $((SECONDS_TO_RECORD + 2)) >/dev/null &
  sleep 1
  $V record -a -g -d "$SECONDS_TO_RECORD" -o "$OUT"
  wait || true
  $V report "$OUT" --by domain,context
  $V report "$OUT" --limit 25
  $V lab down one-vm
  trap - EXIT
else
  echo "demo: the lab could not start; profiling the host under the built-in demo workload instead" >&2
  $V record -a -g -d "$SECONDS_TO_RECORD" -o "$OUT" -- $V demo -d "$SECONDS_TO_RECORD"
  $V report "$OUT" --by context
  $V report "$OUT" --limit 25
fi
