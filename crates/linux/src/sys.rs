//! Small rooted readers of system facts (online CPUs, perf sysctls) and the
//! clock that perf records are stamped with.

use crate::LinuxError;
use std::path::Path;

/// CPU numbers a CPU list may hold: below 65 536 (Linux builds for at most
/// 8 192 CPUs), so that a hostile list such as `0-4294967295` (from a copied
/// `/sys` tree under `--sys-root`) is refused instead of expanding to 16 GiB.
pub const MAX_CPUS: u32 = 1 << 16;

/// Parse a kernel CPU list such as `0-3,5,7-8` (trailing newline allowed).
pub fn parse_cpu_list(s: &str) -> Result<Vec<u32>, String> {
    let mut cpus = Vec::new();
    let s = s.trim();
    if s.is_empty() {
        return Err("empty CPU list".into());
    }
    // Names in messages are cut: the list itself may be megabytes long.
    let shown: String = if s.chars().count() > 64 {
        s.chars().take(63).chain(['…']).collect()
    } else {
        s.to_string()
    };
    let s_shown = shown.as_str();
    for part in s.split(',') {
        let part = part.trim();
        let num = |t: &str| {
            let n = t
                .trim()
                .parse::<u32>()
                .map_err(|_| format!("bad CPU number '{}' in '{s_shown}'", t.trim()))?;
            if n >= MAX_CPUS {
                return Err(format!(
                    "CPU number {n} in '{s_shown}' is not below {MAX_CPUS} (the most CPUs a CPU list may name)"
                ));
            }
            Ok(n)
        };
        if cpus.len() > MAX_CPUS as usize {
            return Err(format!(
                "'{s_shown}' names more than {MAX_CPUS} CPUs (the most a CPU list may name)"
            ));
        }
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                if a > b {
                    return Err(format!("bad CPU range '{a}-{b}' in '{s_shown}'"));
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(num(part)?),
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

/// Whether the running kernel was built with `CONFIG_IRQ_TIME_ACCOUNTING`
/// (softirq and hardirq time kept out of tasks' run time and counted
/// exactly in `/proc/stat`), from `/proc/config.gz` or
/// `/boot/config-RELEASE`; `None` when neither is readable. The kernel can
/// still turn it off at boot (`tsc=unstable`, `nosched_irqtime`), which no
/// file shows.
pub fn irq_time_accounting() -> Option<bool> {
    use std::io::Read;
    let text = std::fs::read("/proc/config.gz")
        .ok()
        .and_then(|gz| {
            let mut s = String::new();
            flate2::read::GzDecoder::new(gz.as_slice())
                .read_to_string(&mut s)
                .ok()
                .map(|_| s)
        })
        .or_else(|| {
            let release = crate::ProcRoot::system().sysctl("kernel.osrelease").ok()?;
            std::fs::read_to_string(format!("/boot/config-{release}")).ok()
        })?;
    Some(config_flag(&text, "CONFIG_IRQ_TIME_ACCOUNTING"))
}

/// True for `NAME=y`; false for `# NAME is not set`, `=m` or a config that
/// does not mention it.
pub fn config_flag(config: &str, name: &str) -> bool {
    config.lines().any(|line| {
        line.strip_prefix(name)
            .and_then(|r| r.strip_prefix('='))
            .is_some_and(|v| v.trim() == "y")
    })
}

/// Packet and byte counters of a network interface.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NetStats {
    pub rx_packets: u64,
    pub tx_packets: u64,
    pub rx_bytes: u64,
    pub tx_bytes: u64,
}

/// `<sys_root>/class/net/DEV/statistics/*`.
pub fn net_stats(sys_root: &Path, dev: &str) -> Result<NetStats, LinuxError> {
    let dir = sys_root.join("class/net").join(dev).join("statistics");
    let get = |name: &str| -> Result<u64, LinuxError> {
        let path = dir.join(name);
        let text = crate::files::read_bounded_string(&path, crate::files::SMALL_FILE).map_err(
            |source| LinuxError::Read {
                path: path.clone(),
                source,
            },
        )?;
        text.trim().parse().map_err(|_| LinuxError::Parse {
            msg: format!("'{}' is not a counter", text.trim()),
            path,
        })
    };
    Ok(NetStats {
        rx_packets: get("rx_packets")?,
        tx_packets: get("tx_packets")?,
        rx_bytes: get("rx_bytes")?,
        tx_bytes: get("tx_bytes")?,
    })
}

/// Online CPUs from `<sys_root>/devices/system/cpu/online` (e.g. `0-3,5`).
pub fn online_cpus(sys_root: &Path) -> Result<Vec<u32>, LinuxError> {
    let path = sys_root.join("devices/system/cpu/online");
    let text =
        crate::files::read_bounded_string(&path, crate::files::SMALL_FILE).map_err(|source| {
            LinuxError::Read {
                path: path.clone(),
                source,
            }
        })?;
    parse_cpu_list(&text).map_err(|msg| LinuxError::Parse { path, msg })
}

/// This boot's id (`/proc/sys/kernel/random/boot_id`), empty if unreadable:
/// what a kernel address, a module's place or a kept measurement holds for.
pub fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// `CLOCK_MONOTONIC` in nanoseconds: the clock every record's `time` uses.
pub fn clock_monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// Current `kernel.perf_event_paranoid`, as text, or `unknown`.
pub(crate) fn perf_event_paranoid() -> String {
    crate::ProcRoot::system()
        .sysctl("kernel.perf_event_paranoid")
        .unwrap_or_else(|_| "unknown".into())
}

/// Current `kernel.perf_event_max_sample_rate`, if readable.
pub(crate) fn perf_event_max_sample_rate() -> Option<u64> {
    crate::ProcRoot::system()
        .sysctl("kernel.perf_event_max_sample_rate")
        .ok()?
        .parse()
        .ok()
}

pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if v > 0 {
        v as usize
    } else {
        4096
    }
}

/// Run a no-argument perf ioctl (ENABLE, DISABLE) on every fd; the first
/// failure is returned as `what` with the OS error.
pub(crate) fn ioctl_all(
    fds: &[std::os::fd::OwnedFd],
    what: &'static str,
    f: unsafe fn(i32, u32) -> i32,
) -> Result<(), LinuxError> {
    use std::os::fd::AsRawFd;
    for fd in fds {
        // SAFETY: fd is an open perf fd; ENABLE/DISABLE take no pointer.
        if unsafe { f(fd.as_raw_fd(), 0) } < 0 {
            return Err(LinuxError::Sys {
                what,
                source: std::io::Error::last_os_error(),
            });
        }
    }
    Ok(())
}

/// poll(2) on the rings' fds for up to `timeout`; EINTR is not an error
/// (the caller drains the rings either way).
pub(crate) fn poll_fds(
    pollfds: &mut [libc::pollfd],
    timeout: std::time::Duration,
    what: &'static str,
) -> Result<(), LinuxError> {
    // Rounded up: a wait of 0.4 ms is 1 ms, not a poll that returns at
    // once (a caller waiting for a deadline would spin until it).
    let ms = timeout.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
    // SAFETY: pollfds is a valid pollfd array; negative fds are ignored.
    let n = unsafe { libc::poll(pollfds.as_mut_ptr(), pollfds.len() as libc::nfds_t, ms) };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(LinuxError::Sys { what, source: e });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_flags() {
        let c = "CONFIG_A=y\n# CONFIG_IRQ_TIME_ACCOUNTING is not set\nCONFIG_B=m\n";
        assert!(!config_flag(c, "CONFIG_IRQ_TIME_ACCOUNTING"));
        assert!(config_flag(c, "CONFIG_A"));
        assert!(!config_flag(c, "CONFIG_B"));
        assert!(config_flag(
            "CONFIG_IRQ_TIME_ACCOUNTING=y\n",
            "CONFIG_IRQ_TIME_ACCOUNTING"
        ));
        // A name that only starts the same way is another option.
        assert!(!config_flag("CONFIG_AB=y\n", "CONFIG_A"));
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0-3,5\n").unwrap(), vec![0, 1, 2, 3, 5]);
        assert_eq!(parse_cpu_list("0").unwrap(), vec![0]);
        assert_eq!(parse_cpu_list("7-8,0,2").unwrap(), vec![0, 2, 7, 8]);
        assert!(parse_cpu_list("").is_err());
        assert!(parse_cpu_list("3-1").is_err());
        assert!(parse_cpu_list("0-x").unwrap_err().contains("'x'"));
        // Bounded: a hostile range is refused, not expanded.
        let e = parse_cpu_list("0-4294967295").unwrap_err();
        assert!(e.contains("4294967295") && e.contains("65536"), "{e}");
        assert_eq!(parse_cpu_list("65535").unwrap(), vec![65535]);
        let many = (0..70_000).map(|_| "1").collect::<Vec<_>>().join(",");
        let e = parse_cpu_list(&many).unwrap_err();
        assert!(e.contains("more than 65536") && e.len() < 200, "{e}");
    }

    #[test]
    fn online_cpus_reads_rooted_file() {
        let dir = tempfile::tempdir().unwrap();
        let cpu = dir.path().join("devices/system/cpu");
        std::fs::create_dir_all(&cpu).unwrap();
        std::fs::write(cpu.join("online"), "0-1,4-5\n").unwrap();
        assert_eq!(online_cpus(dir.path()).unwrap(), vec![0, 1, 4, 5]);
        std::fs::write(cpu.join("online"), "junk\n").unwrap();
        let e = online_cpus(dir.path()).unwrap_err().to_string();
        assert!(e.contains("devices/system/cpu/online"), "{e}");
        let missing = online_cpus(&dir.path().join("nope")).unwrap_err();
        assert!(matches!(missing, LinuxError::Read { .. }));
    }

    #[test]
    fn monotonic_clock_advances() {
        let a = clock_monotonic_ns();
        let b = clock_monotonic_ns();
        assert!(a > 0 && b >= a);
    }
}
