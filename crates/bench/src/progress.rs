//! The progress bar of long benchmarks (indicatif, on stderr). It draws
//! only when stderr is a terminal, so piped and JSON runs stay clean;
//! [`Progress::note`] prints a line above the bar (or plainly to stderr).

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::time::Duration;

pub struct Progress {
    bar: ProgressBar,
    quiet: bool,
}

impl Progress {
    /// A bar of `len` steps; `quiet` hides the bar and the notes.
    pub fn new(len: u64, quiet: bool) -> Progress {
        let bar = ProgressBar::with_draw_target(
            Some(len),
            if quiet {
                ProgressDrawTarget::hidden()
            } else {
                ProgressDrawTarget::stderr()
            },
        );
        if let Ok(style) = ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} runs (eta {eta}) {msg}",
        ) {
            bar.set_style(style);
        }
        bar.enable_steady_tick(Duration::from_millis(250));
        Progress { bar, quiet }
    }

    pub fn set_message(&self, msg: String) {
        self.bar.set_message(msg);
    }

    /// One step done.
    pub fn inc(&self) {
        self.bar.inc(1);
    }

    /// At least `remaining` more steps are coming.
    pub fn expect_more(&self, remaining: u64) {
        let want = self.bar.position() + remaining;
        if self.bar.length().is_none_or(|l| l < want) {
            self.bar.set_length(want);
        }
    }

    /// A line for the user, above the bar.
    pub fn note(&self, msg: &str) {
        if self.quiet {
            return;
        }
        if self.bar.is_hidden() {
            eprintln!("{msg}");
        } else {
            self.bar.println(msg);
        }
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.bar.finish_and_clear();
    }
}
