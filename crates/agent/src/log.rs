//! Minimal logging: one line per event, with a wall-clock timestamp, to
//! `--log FILE` (appended) or stderr. Never to the agent channel.

use std::fs::File;
use std::io::Write;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

static SINK: Mutex<Option<File>> = Mutex::new(None);

/// Sends log lines to `file` instead of stderr.
pub fn set_file(file: File) {
    if let Ok(mut s) = SINK.lock() {
        *s = Some(file);
    }
}

/// Writes one log line.
pub fn line(msg: std::fmt::Arguments<'_>) {
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let text = format!(
        "{}.{:03} vmscope-agent: {}\n",
        t.as_secs(),
        t.subsec_millis(),
        msg
    );
    if let Ok(mut s) = SINK.lock() {
        if let Some(f) = s.as_mut() {
            let _ = f.write_all(text.as_bytes());
            return;
        }
    }
    let _ = std::io::stderr().write_all(text.as_bytes());
}

/// `log!("fmt", args…)`: one log line.
#[macro_export]
macro_rules! log {
    ($($arg:tt)*) => { $crate::log::line(format_args!($($arg)*)) };
}
