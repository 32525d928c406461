//! Per-CPU and per-VM CPU accounting of a virtualization host:
//! - [`vmstat`]: vm-stat (Theurer 2006): each host CPU's busy % split by VM
//!   vCPU, from `sched:sched_switch` or a `schedstat` fallback;
//! - [`account`]: Cherkasova 2005 on KVM/QEMU: vCPU run / steal / halt,
//!   direct and shared I/O CPU per VM, its I/O operations, reconciliation;
//! - [`metrics`]: the same as Prometheus counters for `serve`;
//! - [`math`]: the pure arithmetic (rates, shares, charging, reconciling);
//! - [`fit`]: sched_switch slices fitted to `schedstat` and `/proc/stat`;
//! - [`tracker`]: the VMs followed across intervals, with stable `dN`
//!   numbers and their threads;
//! - [`wait`]: each followed thread's runnable-not-running time charged to
//!   what ran instead, from the scheduler's events;
//! - [`render`]: text (the vm-stat layout), JSON lines and CSV;
//! - [`session`]: intervals kept in a session file (`stat -o`, `account -o`).

pub mod account;
mod error;
pub mod fit;
mod libvirt_io;
pub mod math;
pub mod metrics;
pub mod render;
pub mod session;
pub mod tracker;
pub mod vmstat;
pub mod wait;
pub mod wait_source;

pub use error::StatError;

/// An interval as the command line gives it: `100ms`, `1s`, `2.5s`, `1`
/// (seconds when no unit).
pub fn parse_interval(s: &str) -> Result<std::time::Duration, String> {
    let s = s.trim();
    let (num, scale) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = s.strip_suffix("us") {
        (n, 1e-6)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else {
        (s, 1.0)
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not an interval (e.g. 100ms, 1s)"))?;
    let secs = v * scale;
    if !(0.01..=3600.0).contains(&secs) {
        return Err(format!("interval {s} out of range (10ms to 1h)"));
    }
    Ok(std::time::Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    #[test]
    fn intervals() {
        use std::time::Duration;
        assert_eq!(
            super::parse_interval("100ms"),
            Ok(Duration::from_millis(100))
        );
        assert_eq!(super::parse_interval("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(super::parse_interval("2"), Ok(Duration::from_secs(2)));
        assert!(super::parse_interval("1ms").is_err());
        assert!(super::parse_interval("x").is_err());
    }
}
