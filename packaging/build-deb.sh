#!/usr/bin/env bash
# Build the vmscope Debian package: target/debian/vmscope_<version>-1_amd64.deb.
#
#   packaging/build-deb.sh            # build (release), stage, package; prints the .deb path
#
# Needs cargo-deb (installed here with `cargo install` when missing),
# dpkg-dev (dpkg-shlibdeps for the dependencies) and binutils (objcopy, strip).
# Steps: build vmscope and the static guest agent exactly as scripts/setup.sh
# does; let the new binary write its man pages and completions from its own
# clap definitions (`vmscope __generate`), so they match `--help`; stage them
# with the stripped agent and a changelog entry under
# target/release/packaging/; then `cargo deb --no-build` packs the assets
# listed in crates/cli/Cargo.toml ([package.metadata.deb]).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo-deb >/dev/null 2>&1; then
  echo "build-deb: installing cargo-deb"
  cargo install cargo-deb --locked --version 3.8.0 --quiet
fi

echo "build-deb: building vmscope and the static guest agent (release)"
cargo build --release --workspace --bins --quiet  # as scripts/setup.sh: the same features, nothing rebuilt
CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS="-C target-feature=+crt-static -C force-frame-pointers=yes" \
  cargo build --release -p vmscope-agent --target x86_64-unknown-linux-gnu --quiet

target=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
[ -d "$target" ] || { echo "build-deb: cannot find cargo's target directory" >&2; exit 2; }
stage="$target/release/packaging"
rm -rf "$stage"
mkdir -p "$stage"

vmscope="$target/release/vmscope"
"$vmscope" __generate man "$stage/man" >/dev/null
gzip -9n "$stage"/man/*.1
"$vmscope" __generate completions "$stage/completions" >/dev/null

# The static agent; cargo-deb strips it like vmscope (below).
cp "$target/x86_64-unknown-linux-gnu/release/vmscope-agent" "$stage/vmscope-agent"

# One changelog entry naming the exact build, dated by the commit (stable
# across rebuilds of one commit).
version=$(cargo pkgid -p vmscope-cli | sed 's/.*[@#]//')
build=$("$vmscope" --version)
when=$(git log -1 --format=%cD 2>/dev/null || date -R)
cat > "$stage/changelog.Debian" <<EOF
vmscope (${version}-1) unstable; urgency=medium

  * Package built from ${build#vmscope }.

 -- vmscope developers <vmscope@vmscope.invalid>  ${when}
EOF
gzip -9n "$stage/changelog.Debian"

echo "build-deb: packaging"
# Debian binaries are stripped (lintian refuses others): the debug info
# (line tables and symbols) of vmscope and of the agent goes to
# /usr/lib/debug/.build-id/ in the same package, where vmscope's symbolizer
# finds it, e.g. when it profiles itself (`vmscope record -- vmscope demo`).
deb=$(cargo deb -p vmscope-cli --no-build --quiet --separate-debug-symbols --compress-debug-symbols=zlib --output "$target/debian/")
echo "$deb"
