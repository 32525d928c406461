#!/usr/bin/env bash
# Set-up, then the main job: boot the default lab (labs/one-vm.toml), profile
# the host and the VM for a few seconds while the known-answer demo workload
# runs in the guest, print the report, tear the lab down.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export VMSCOPE_AGENT="$PWD/target/x86_64-unknown-linux-gnu/release/vmscope-agent"
V=$PWD/target/release/vmscope
OUT=${OUT:-vmscope.db}
SECS=${SECS:-5}

echo "== vmscope lab up labs/one-vm.toml"
$V lab up labs/one-vm.toml
trap '$V lab down one-vm >/dev/null 2>&1 || true' EXIT
# The guest runs the 50/30/20 demo workload, detached: the agent channel takes
# one client at a time and the recorder needs it for the guest's profile.
$V lab exec vm0 -- sh -c "/usr/bin/vmscope-agent demo -t 2 -d $((SECS + 6)) </dev/null >/dev/null 2>&1 &"
echo "== vmscope record -a -g -d $SECS --vm vm0=active -o $OUT"
$V record -a -g -d "$SECS" --vm vm0=active -o "$OUT"
echo "== vmscope report $OUT --by domain,context"
$V report "$OUT" --by domain,context
echo "== vmscope report $OUT --domain vm0 --context guest-user --by process,symbol --limit 8"
$V report "$OUT" --domain vm0 --context guest-user --by process,symbol --limit 8
echo "== vmscope report $OUT --limit 15"
$V report "$OUT" --limit 15
echo "== vmscope lab down one-vm"
$V lab down one-vm
trap - EXIT
