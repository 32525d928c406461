//! Helpers every test crate of vmscope shares, so each check is written
//! once: whether we run as root, whether a tool is installed, and how a test
//! that cannot make its check says so.
//!
//! A skip is never silent: [`skip`] prints `SKIP: reason` (visible with
//! `--nocapture`) and appends the reason to the file named by
//! `$VMSCOPE_SKIP_LOG`, which `scripts/test.sh` tallies at the end of a run.
//! Under CI (`$CI` set) a skip fails the test instead: CI installs everything
//! the suite needs, so a skip there means a set-up step is missing. Checks
//! this kind of machine can never make (a hardware PMU, KVM guest-mode
//! samples) use [`skip_platform`], which is logged but never fails.

pub mod pki;
pub mod receiver;

use std::io::Write;
use std::path::PathBuf;

/// Whether the tests run as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The first `tool` on `$PATH`.
pub fn which(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(tool))
            .find(|f| is_executable(f))
    })
}

fn is_executable(p: &std::path::Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Whether `tool` is on `$PATH`.
pub fn have(tool: &str) -> bool {
    which(tool).is_some()
}

fn log(kind: &str, reason: &str) {
    eprintln!("SKIP: {reason}");
    if let Some(path) = std::env::var_os("VMSCOPE_SKIP_LOG") {
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let test = std::thread::current()
                .name()
                .unwrap_or("unnamed test")
                .to_string();
            let _ = writeln!(f, "{kind}\t{test}\t{reason}");
        }
    }
}

/// This test cannot make its check here (`reason` says why and how to fix
/// it). Under CI this fails the test.
#[track_caller]
pub fn skip(reason: &str) {
    log("skip", reason);
    if std::env::var_os("CI").is_some_and(|v| !v.is_empty()) {
        panic!("SKIP under CI is a failure (CI installs everything the suite needs): {reason}");
    }
}

/// A check this kind of machine can never make (no hardware PMU, no KVM
/// guest-mode samples): logged, never a failure.
pub fn skip_platform(reason: &str) {
    log("platform", reason);
}

/// True when root; else skips with the reason `what` needs root.
#[track_caller]
pub fn require_root(what: &str) -> bool {
    if is_root() {
        return true;
    }
    skip(&format!("{what} needs root"));
    false
}

/// True when every `(tool, Debian package)` is installed; else skips
/// naming the first missing one and its package.
#[track_caller]
pub fn require_tools(tools: &[(&str, &str)]) -> bool {
    for (tool, package) in tools {
        if !have(tool) {
            skip(&format!(
                "'{tool}' is not installed (apt-get install {package}; scripts/setup.sh installs it)"
            ));
            return false;
        }
    }
    true
}

/// The file offset of `addr` in the running test binary, from
/// `/proc/self/maps` (`None` when no mapping holds it).
pub fn own_file_offset(addr: u64) -> Option<u64> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        let (range, _, off) = (f.next()?, f.next()?, f.next()?);
        let (lo, hi) = range.split_once('-')?;
        let (lo, hi) = (
            u64::from_str_radix(lo, 16).ok()?,
            u64::from_str_radix(hi, 16).ok()?,
        );
        let off = u64::from_str_radix(off, 16).ok()?;
        (addr >= lo && addr < hi).then(|| addr - lo + off)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_shell_and_not_a_made_up_tool() {
        assert!(have("sh"));
        assert!(!have("vmscope-no-such-tool-xyz"));
        assert!(which("sh").unwrap().is_absolute());
    }
}
