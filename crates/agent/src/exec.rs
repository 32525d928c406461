//! Running a command for the host (only with `--allow-exec`): no shell, its
//! own process group, stdin fed from the request, stdout and stderr captured
//! up to a bound, killed (whole group, SIGKILL) when the timeout expires.
//! Runs on a worker thread; the event loop is never blocked by it.

use std::io::{Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use vmscope_protocol::{ErrorKind, Response};

/// How long to keep collecting output after the program exited, for
/// descendants that still hold its pipes.
const DRAIN_GRACE: Duration = Duration::from_millis(500);

#[derive(Default)]
struct Capture {
    data: Vec<u8>,
    truncated: bool,
    done: bool,
}

fn reader(mut src: impl Read + Send + 'static, limit: usize) -> Arc<Mutex<Capture>> {
    let cap = Arc::new(Mutex::new(Capture::default()));
    let out = Arc::clone(&cap);
    thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        loop {
            let n = match src.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if let Ok(mut c) = out.lock() {
                let room = limit.saturating_sub(c.data.len());
                if n > room {
                    c.truncated = true;
                }
                c.data.extend_from_slice(&buf[..n.min(room)]);
            }
        }
        if let Ok(mut c) = out.lock() {
            c.done = true;
        }
    });
    cap
}

fn take(cap: &Arc<Mutex<Capture>>) -> (Vec<u8>, bool, bool) {
    match cap.lock() {
        Ok(mut c) => (std::mem::take(&mut c.data), c.truncated, c.done),
        Err(_) => (Vec::new(), true, true),
    }
}

fn finished(cap: Option<&Arc<Mutex<Capture>>>) -> bool {
    match cap {
        Some(c) => c.lock().map(|c| c.done).unwrap_or(true),
        None => true,
    }
}

/// Runs `argv` and returns the response to send (an `ExecResult`, or an
/// `Error` when the program cannot be started).
/// `max_output` bounds each of stdout and stderr.
pub fn run(
    argv: &[String],
    stdin: Option<Vec<u8>>,
    timeout: Duration,
    max_output: usize,
) -> Response {
    let Some((prog, args)) = argv.split_first() else {
        return Response::Error {
            kind: ErrorKind::BadRequest,
            message: "argv is empty".into(),
        };
    };
    let mut cmd = Command::new(prog);
    cmd.args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            return Response::Error {
                kind: ErrorKind::Io,
                message: format!("cannot run `{prog}`: {e}"),
            }
        }
    };
    let pid = child.id() as libc::pid_t;
    if let (Some(mut w), Some(input)) = (child.stdin.take(), stdin) {
        thread::spawn(move || {
            let _ = w.write_all(&input);
        });
    }
    let out = child.stdout.take().map(|s| reader(s, max_output));
    let err = child.stderr.take().map(|s| reader(s, max_output));
    let deadline = Instant::now() + timeout;
    let mut timed_out = false;
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break Some(st),
            Ok(None) => {}
            Err(_) => break None,
        }
        if Instant::now() >= deadline {
            timed_out = true;
            // SAFETY: signals the process group this agent created for the child.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
            break child.wait().ok();
        }
        thread::sleep(Duration::from_millis(5));
    };
    // Let the readers finish; descendants may keep the pipes open.
    let drain_end = Instant::now() + DRAIN_GRACE;
    while Instant::now() < drain_end && !(finished(out.as_ref()) && finished(err.as_ref())) {
        thread::sleep(Duration::from_millis(2));
    }
    let (stdout, t1, _) = out.as_ref().map(take).unwrap_or_default();
    let (stderr, t2, _) = err.as_ref().map(take).unwrap_or_default();
    let exit_code = match status {
        Some(st) => st
            .code()
            .or_else(|| st.signal().map(|s| 128 + s))
            .unwrap_or(-1),
        None => -1,
    };
    Response::ExecResult {
        exit_code,
        stdout,
        stderr,
        truncated: t1 || t2,
        timed_out,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmscope_protocol::MAX_EXEC_OUTPUT;

    fn argv(a: &[&str]) -> Vec<String> {
        a.iter().map(std::string::ToString::to_string).collect()
    }

    #[test]
    fn captures_output_and_status() {
        match run(
            &argv(&["sh", "-c", "echo out; echo err >&2; exit 3"]),
            None,
            Duration::from_secs(10),
            MAX_EXEC_OUTPUT,
        ) {
            Response::ExecResult {
                exit_code,
                stdout,
                stderr,
                truncated,
                timed_out,
            } => {
                assert_eq!(exit_code, 3);
                assert_eq!(stdout, b"out\n");
                assert_eq!(stderr, b"err\n");
                assert!(!truncated && !timed_out);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn stdin_is_fed() {
        match run(
            &argv(&["cat"]),
            Some(b"abc".to_vec()),
            Duration::from_secs(10),
            MAX_EXEC_OUTPUT,
        ) {
            Response::ExecResult { stdout, .. } => assert_eq!(stdout, b"abc"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn timeout_kills_the_group() {
        let t0 = Instant::now();
        match run(
            &argv(&["sh", "-c", "sleep 30 & sleep 30"]),
            None,
            Duration::from_millis(300),
            MAX_EXEC_OUTPUT,
        ) {
            Response::ExecResult {
                exit_code,
                timed_out,
                ..
            } => {
                assert!(timed_out);
                assert_eq!(exit_code, 128 + libc::SIGKILL);
            }
            other => panic!("{other:?}"),
        }
        // Not a timing: a group left alive would hold the output open for
        // the 30 s of its sleeps.
        assert!(t0.elapsed() < Duration::from_secs(25));
    }

    #[test]
    fn output_is_bounded() {
        let n = MAX_EXEC_OUTPUT + 1000;
        match run(
            &argv(&["head", "-c", &n.to_string(), "/dev/zero"]),
            None,
            Duration::from_secs(30),
            MAX_EXEC_OUTPUT,
        ) {
            Response::ExecResult {
                stdout,
                truncated,
                exit_code,
                ..
            } => {
                assert_eq!(exit_code, 0);
                assert_eq!(stdout.len(), MAX_EXEC_OUTPUT);
                assert!(truncated);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn missing_program_is_an_io_error() {
        match run(
            &argv(&["/nonexistent/prog"]),
            None,
            Duration::from_secs(1),
            MAX_EXEC_OUTPUT,
        ) {
            Response::Error { kind, message } => {
                assert_eq!(kind, ErrorKind::Io);
                assert!(message.contains("/nonexistent/prog"));
            }
            other => panic!("{other:?}"),
        }
    }
}
