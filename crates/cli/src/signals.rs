//! How commands stop on a signal, one way for all: SIGINT (Ctrl-C), SIGTERM
//! and SIGHUP set one flag that long-running commands check (`record`
//! finishes its session, `stat` and `account` end after the current
//! interval, `lab up` tears down what it made, `serve` exits). A second
//! signal while the first is being handled ends the process at once with
//! the signal's default action.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, OnceLock};

/// The signals that ask a command to stop.
pub const STOP_SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// The number of the first stop signal received (0: none yet).
static FLAG: OnceLock<Arc<AtomicI32>> = OnceLock::new();
/// The same as a plain bool, for code that takes an `&AtomicBool`.
static STOPPED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(sig: libc::c_int) {
    // Only atomics here: async-signal-safe.
    if let Some(f) = FLAG.get() {
        if f.swap(sig, Ordering::SeqCst) != 0 {
            // SAFETY: restoring the default action and re-raising are both
            // async-signal-safe.
            unsafe {
                libc::signal(sig, libc::SIG_DFL);
                libc::raise(sig);
            }
        }
    }
    STOPPED.store(true, Ordering::SeqCst);
}

/// Install the handlers (once) and return the shared flag: 0 until a stop
/// signal arrives, then its number.
pub fn install() -> Arc<AtomicI32> {
    let flag = FLAG.get_or_init(|| Arc::new(AtomicI32::new(0))).clone();
    for sig in STOP_SIGNALS {
        // SAFETY: a handler that only touches atomics. SA_RESTART: reads
        // on agent sockets and the like carry on instead of failing with
        // EINTR; every loop that must stop polls the flag.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as libc::sighandler_t;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&raw mut sa.sa_mask);
            libc::sigaction(sig, &raw const sa, std::ptr::null_mut());
        }
    }
    flag
}

/// The flag as a bool, for [`vmscope_engine::record::record`].
pub fn stopped() -> &'static AtomicBool {
    &STOPPED
}

/// After a loop that a stop signal may have ended: say so on stderr.
pub fn say_stopped(what: &str, intervals: u64) {
    if let Some(s) = received() {
        eprintln!(
            "{what}: stopped by {} after {intervals} interval(s)",
            name(s)
        );
    }
}

/// The signal received so far, if any.
pub fn received() -> Option<i32> {
    match FLAG.get().map_or(0, |f| f.load(Ordering::SeqCst)) {
        0 => None,
        s => Some(s),
    }
}

/// A command stopped by a signal before it could do its work; `main`
/// exits with 128 + the signal.
#[derive(Debug)]
pub struct Interrupted {
    pub signal: i32,
    pub during: &'static str,
}

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "interrupted by {} while {}",
            name(self.signal),
            self.during
        )
    }
}

impl std::error::Error for Interrupted {}

/// `Err(Interrupted)` if a stop signal has arrived.
pub fn check(during: &'static str) -> Result<(), Interrupted> {
    match received() {
        Some(signal) => Err(Interrupted { signal, during }),
        None => Ok(()),
    }
}

/// "SIGTERM", "SIGINT (Ctrl-C)", ...
pub fn name(sig: i32) -> String {
    vmscope_lab::cancel::signal_name(sig)
}
