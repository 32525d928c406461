//! Cancelling long lab work: a flag the caller sets (the CLI from its
//! SIGINT/SIGTERM/SIGHUP handler) and the long waits of `lab up` check
//! (image building, the KVM probe, QEMU's QMP socket, the agents' hellos,
//! host commands). A cancelled `up` returns [`LabError::Interrupted`] through
//! the same teardown as any other failure, so it removes what it made.

use crate::error::{LabError, Result};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A shared cancel request: 0 while the work may go on, else the number of
/// the signal that asked it to stop (or [`Cancel::NOT_A_SIGNAL`]).
#[derive(Debug, Clone, Default)]
pub struct Cancel(Arc<AtomicI32>);

impl Cancel {
    /// A request made other than by a signal.
    pub const NOT_A_SIGNAL: i32 = -1;

    /// A flag nobody has set yet.
    pub fn new() -> Cancel {
        Cancel::default()
    }

    /// Share an existing flag (e.g. one a signal handler stores into).
    pub fn from_flag(flag: Arc<AtomicI32>) -> Cancel {
        Cancel(flag)
    }

    /// The flag itself: store a signal number to cancel.
    pub fn flag(&self) -> &Arc<AtomicI32> {
        &self.0
    }

    /// Ask the work to stop, naming the signal (or [`Cancel::NOT_A_SIGNAL`]).
    pub fn request(&self, signal: i32) {
        self.0.store(signal, Ordering::SeqCst);
    }

    /// The signal that asked to stop, if any.
    pub fn requested(&self) -> Option<i32> {
        match self.0.load(Ordering::SeqCst) {
            0 => None,
            s => Some(s),
        }
    }

    /// `Err(Interrupted)` once cancelled; `during` says what was under way.
    pub fn check(&self, during: &str) -> Result<()> {
        match self.requested() {
            Some(signal) => Err(LabError::Interrupted {
                signal,
                during: during.to_string(),
            }),
            None => Ok(()),
        }
    }

    /// Sleep `d`, waking early (with an error) when cancelled.
    pub fn sleep(&self, d: Duration, during: &str) -> Result<()> {
        let end = Instant::now() + d;
        loop {
            self.check(during)?;
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(());
            }
            std::thread::sleep(left.min(Duration::from_millis(50)));
        }
    }
}

/// "SIGTERM" for 15, "signal 40" for what has no common name.
pub fn signal_name(signal: i32) -> String {
    match signal {
        libc::SIGINT => "SIGINT (Ctrl-C)".into(),
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGHUP => "SIGHUP".into(),
        libc::SIGQUIT => "SIGQUIT".into(),
        Cancel::NOT_A_SIGNAL => "a cancel request".into(),
        s => format!("signal {s}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_seen_by_every_clone_and_ends_a_sleep() {
        let c = Cancel::new();
        let d = c.clone();
        assert!(c.check("x").is_ok());
        let t = std::thread::spawn(move || d.sleep(Duration::from_secs(60), "waiting"));
        std::thread::sleep(Duration::from_millis(100));
        c.request(libc::SIGTERM);
        let e = t.join().unwrap().unwrap_err().to_string();
        assert_eq!(e, "interrupted by SIGTERM while waiting");
    }
}
