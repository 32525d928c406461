//! Build script of the `vmscope` binary: names the build for `--version` and
//! for the `vmscope_version` key of every session.
//!
//! Sets `VMSCOPE_BUILD` to `commit <12 hex digits>, clean|dirty`, read from
//! git, or to `unknown commit` when the sources are not a git checkout of
//! this workspace (a release tarball, a source package): then nothing here
//! may fail the build. `VMSCOPE_BUILD_COMMIT` in the environment overrides
//! git (for builders that know the commit but have no `.git`).
//!
//! Git is called as a command on purpose: it is the one tool that knows
//! worktrees, packed refs and the index format, and it is always present
//! where a `.git` is; a git library crate would add a C build for three
//! lines of output.
//!
//! "dirty" means the binary's sources differ from the commit: tracked files
//! under [`sources`] (every crate's manifest, build script and `src/`, the
//! workspace manifest and lock file, `labs/` which `lab up` embeds).
//! Untracked files do not count, as with `git describe --dirty`. The script
//! reruns when HEAD, the branch, the index or any of those paths changes, so
//! the flag is exact for every build; an edit to README.md or scripts/ alone
//! changes neither the binary nor its version.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    println!("cargo:rerun-if-env-changed=VMSCOPE_BUILD_COMMIT");
    let build = match std::env::var("VMSCOPE_BUILD_COMMIT") {
        Ok(c) if !c.trim().is_empty() => format!("commit {}", c.trim()),
        _ => from_git(&manifest).unwrap_or_else(|| "unknown commit".to_string()),
    };
    println!("cargo:rustc-env=VMSCOPE_BUILD={build}");
}

/// `commit <hash>, clean|dirty`, or None when `manifest` is not inside a git
/// checkout that tracks this crate.
fn from_git(manifest: &Path) -> Option<String> {
    // The crate's own build.rs must be tracked: a tarball unpacked inside some
    // other repository must not take that repository's commit.
    git(manifest, &["ls-files", "--error-unmatch", "build.rs"])?;
    let hash = git(manifest, &["rev-parse", "--short=12", "HEAD"])?;
    let top = PathBuf::from(git(manifest, &["rev-parse", "--show-toplevel"])?);
    let sources = sources(&top);
    let mut status = vec![
        "--no-optional-locks",
        "status",
        "--porcelain",
        "--untracked-files=no",
        "--",
    ];
    status.extend(sources.iter().filter_map(|p| p.to_str()));
    let dirty = git(&top, &status)?;
    watch(manifest, &sources);
    Some(format!(
        "commit {hash}, {}",
        if dirty.is_empty() { "clean" } else { "dirty" }
    ))
}

/// The paths the binary is built from. Whole crate directories are not
/// listed: cargo follows symlinks when it scans a directory, and test
/// fixtures hold symlinks to / (a copied /proc/PID/cwd).
fn sources(top: &Path) -> Vec<PathBuf> {
    let mut out = vec![
        top.join("Cargo.toml"),
        top.join("Cargo.lock"),
        top.join("labs"),
    ];
    if let Ok(dir) = std::fs::read_dir(top.join("crates")) {
        let mut crates: Vec<PathBuf> = dir.flatten().map(|e| e.path()).collect();
        crates.sort();
        for krate in crates {
            for p in ["Cargo.toml", "build.rs", "src"] {
                out.push(krate.join(p));
            }
        }
    }
    out.retain(|p| p.exists());
    out
}

/// Rerun when the commit, the index or the sources change.
fn watch(manifest: &Path, sources: &[PathBuf]) {
    let mut paths: Vec<PathBuf> = sources.to_vec();
    if let Some(d) = git(manifest, &["rev-parse", "--absolute-git-dir"]) {
        let d = PathBuf::from(d);
        paths.push(d.join("HEAD"));
        paths.push(d.join("index"));
    }
    if let Some(d) = git(manifest, &["rev-parse", "--git-common-dir"]) {
        let d = manifest.join(d);
        paths.push(d.join("packed-refs"));
        if let Some(r) = git(manifest, &["symbolic-ref", "-q", "HEAD"]) {
            paths.push(d.join(r));
        }
    }
    for p in paths.iter().filter(|p| p.exists()) {
        println!("cargo:rerun-if-changed={}", p.display());
    }
}

/// Run git in `dir`; its trimmed stdout when it succeeds. The checkout is
/// trusted whoever owns it (`safe.directory`): this build compiles and runs
/// its code anyway, and a root build of a user's checkout must still name
/// its commit.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(["-c", "safe.directory=*", "-C"])
        .arg(dir)
        .args(args)
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}
