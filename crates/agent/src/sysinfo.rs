//! Facts about the guest for the hello: kernel release, hostname, online
//! CPUs, total memory.

use std::path::Path;

/// Kernel release and hostname from uname(2).
pub fn uname() -> (String, String) {
    // SAFETY: utsname is plain old data; uname fills it.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer to a utsname.
    if unsafe { libc::uname(&raw mut u) } != 0 {
        return (String::new(), String::new());
    }
    let field = |f: &[libc::c_char]| {
        let bytes: Vec<u8> = f
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    (field(&u.release), field(&u.nodename))
}

/// Online CPUs (sysconf), at least 1.
pub fn online_cpus() -> u32 {
    // SAFETY: sysconf has no memory effects.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    u32::try_from(n).unwrap_or(1).max(1)
}

/// MemTotal from `<proc>/meminfo`, in bytes; 0 when unreadable.
pub fn mem_total(proc_root: &Path) -> u64 {
    let text = std::fs::read_to_string(proc_root.join("meminfo")).unwrap_or_default();
    parse_mem_total(&text)
}

fn parse_mem_total(text: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|rest| {
            let mut parts = rest.split_whitespace();
            let n: u64 = parts.next()?.parse().ok()?;
            match parts.next() {
                Some("kB") => n.checked_mul(1024),
                None => Some(n),
                Some(_) => None,
            }
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_parsing() {
        assert_eq!(
            parse_mem_total("MemTotal:        2000 kB\nMemFree: 1 kB\n"),
            2_048_000
        );
        assert_eq!(parse_mem_total("MemFree: 1 kB\n"), 0);
        assert_eq!(parse_mem_total("MemTotal: x kB\n"), 0);
    }

    #[test]
    fn live_values_are_plausible() {
        let (release, host) = uname();
        assert!(!release.is_empty());
        assert!(!host.is_empty());
        assert!(online_cpus() >= 1);
        assert!(mem_total(Path::new("/proc")) > 1 << 20);
    }
}
