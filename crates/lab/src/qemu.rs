//! QEMU: the command line of a lab VM, a detached launch (own session, so
//! the lab process can exit or die without taking the VM along), a minimal
//! QMP client, the VM's thread ids (vCPUs from `query-cpus-fast`, I/O threads
//! from `query-iothreads`, checked against `/proc/PID/task/*/comm`) and
//! pinning with `sched_setaffinity`.

use crate::error::{LabError, Result};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Longest usable `sun_path`.
pub const MAX_SOCKET_PATH: usize = 107;

/// The QEMU binary, or an error naming the package.
pub fn qemu_binary() -> Result<PathBuf> {
    crate::util::require_tool("qemu-system-x86_64", "qemu-system-x86")
}

/// `qemu-system-x86_64 --version`, first line's version number.
pub fn qemu_version(bin: &Path) -> String {
    Command::new(bin)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .and_then(|l| l.split_whitespace().nth(3).map(str::to_string))
        })
        .unwrap_or_else(|| "unknown".to_string())
}

/// Start `argv` (argv\[0\] = QEMU) detached: a new session, reparented to init
/// by a double fork, stdout and stderr to `log`. Returns once QEMU runs (or
/// failed to exec); its pid comes from QEMU's `-pidfile`.
pub fn spawn_detached(vm: &str, argv: &[String], log: &Path) -> Result<()> {
    let (prog, args) = argv.split_first().ok_or_else(|| LabError::Vm {
        vm: vm.to_string(),
        message: "empty QEMU command".into(),
    })?;
    let out = std::fs::File::create(log).map_err(|e| LabError::io("create", log, e))?;
    let err = out.try_clone().map_err(|e| LabError::io("open", log, e))?;
    let mut cmd = Command::new(prog);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err));
    // SAFETY: only async-signal-safe calls (setsid, fork, _exit) between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            match libc::fork() {
                -1 => Err(std::io::Error::last_os_error()),
                0 => Ok(()),
                _ => libc::_exit(0),
            }
        });
    }
    let mut child = cmd.spawn().map_err(|e| LabError::Vm {
        vm: vm.to_string(),
        message: format!("cannot start {prog}: {e}"),
    })?;
    // Reap the intermediate process.
    let _ = child.wait();
    Ok(())
}

/// A connected QMP session.
pub struct Qmp {
    vm: String,
    socket: PathBuf,
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Qmp {
    /// Connect, read the greeting and negotiate capabilities.
    pub fn connect(vm: &str, socket: &Path, timeout: Duration) -> Result<Qmp> {
        let err = |m: String| LabError::Qmp {
            vm: vm.to_string(),
            socket: socket.to_path_buf(),
            message: m,
        };
        let stream = UnixStream::connect(socket).map_err(|e| err(e.to_string()))?;
        stream
            .set_read_timeout(Some(timeout))
            .map_err(|e| err(e.to_string()))?;
        let writer = stream.try_clone().map_err(|e| err(e.to_string()))?;
        let mut q = Qmp {
            vm: vm.to_string(),
            socket: socket.to_path_buf(),
            reader: BufReader::new(stream),
            writer,
        };
        let greeting = q.read_msg()?;
        if greeting.get("QMP").is_none() {
            return Err(err(format!("unexpected greeting {greeting}")));
        }
        q.execute("qmp_capabilities", None)?;
        Ok(q)
    }

    fn err(&self, m: impl Into<String>) -> LabError {
        LabError::Qmp {
            vm: self.vm.clone(),
            socket: self.socket.clone(),
            message: m.into(),
        }
    }

    fn read_msg(&mut self) -> Result<Value> {
        let mut line = String::new();
        let n = self
            .reader
            .read_line(&mut line)
            .map_err(|e| self.err(format!("read: {e}")))?;
        if n == 0 {
            return Err(self.err("QEMU closed the connection"));
        }
        serde_json::from_str(&line).map_err(|e| self.err(format!("bad JSON {line:?}: {e}")))
    }

    /// Run a command; returns its `return` value. Events are skipped.
    pub fn execute(&mut self, command: &str, arguments: Option<Value>) -> Result<Value> {
        let mut msg = json!({ "execute": command });
        if let Some(a) = arguments {
            msg["arguments"] = a;
        }
        let mut text = msg.to_string();
        text.push('\n');
        self.writer
            .write_all(text.as_bytes())
            .map_err(|e| self.err(format!("write: {e}")))?;
        loop {
            let v = self.read_msg()?;
            if let Some(r) = v.get("return") {
                return Ok(r.clone());
            }
            if let Some(e) = v.get("error") {
                return Err(self.err(format!("{command}: {e}")));
            }
        }
    }
}

/// Thread ids of a running VM.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VmThreads {
    pub vcpus: Vec<u32>,
    pub iothreads: Vec<(String, u32)>,
}

/// vCPU and I/O thread ids from QMP.
pub fn query_threads(qmp: &mut Qmp) -> Result<VmThreads> {
    let cpus = qmp.execute("query-cpus-fast", None)?;
    let mut vcpus: Vec<(u64, u32)> = cpus
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|c| {
                    Some((
                        c.get("cpu-index")?.as_u64()?,
                        u32::try_from(c.get("thread-id")?.as_u64()?).ok()?,
                    ))
                })
                .collect()
        })
        .unwrap_or_default();
    vcpus.sort_unstable();
    let io = qmp.execute("query-iothreads", None)?;
    let iothreads = io
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|t| {
                    Some((
                        t.get("id")?.as_str()?.to_string(),
                        u32::try_from(t.get("thread-id")?.as_u64()?).ok()?,
                    ))
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(VmThreads {
        vcpus: vcpus.into_iter().map(|v| v.1).collect(),
        iothreads,
    })
}

/// (tid, comm) of every thread of `pid`.
pub fn threads_of(pid: u32) -> Vec<(u32, String)> {
    let dir = format!("/proc/{pid}/task");
    let Ok(rd) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut out: Vec<(u32, String)> = rd
        .flatten()
        .filter_map(|e| {
            let tid: u32 = e.file_name().to_str()?.parse().ok()?;
            let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
            Some((tid, comm.trim().to_string()))
        })
        .collect();
    out.sort_unstable();
    out
}

/// vCPU thread ids from thread names `CPU n/TCG` or `CPU n/KVM` (index order).
pub fn vcpu_tids_by_name(pid: u32) -> Vec<u32> {
    let mut v: Vec<(u32, u32)> = threads_of(pid)
        .into_iter()
        .filter_map(|(tid, comm)| {
            let rest = comm.strip_prefix("CPU ")?;
            let (n, accel) = rest.split_once('/')?;
            (accel == "TCG" || accel == "KVM").then_some(())?;
            Some((n.parse().ok()?, tid))
        })
        .collect();
    v.sort_unstable();
    v.into_iter().map(|x| x.1).collect()
}

/// Pin thread `tid` to `cpus`.
pub fn pin(tid: u32, cpus: &[usize]) -> std::io::Result<()> {
    // SAFETY: cpu_set_t is plain data; CPU_SET stays within CPU_SETSIZE.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus {
            if c < libc::CPU_SETSIZE as usize {
                libc::CPU_SET(c, &mut set);
            }
        }
        if libc::sched_setaffinity(
            tid as libc::pid_t,
            std::mem::size_of::<libc::cpu_set_t>(),
            &set,
        ) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// CPUs thread `tid` may run on.
pub fn affinity(tid: u32) -> std::io::Result<Vec<usize>> {
    // SAFETY: as in `pin`.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(
            tid as libc::pid_t,
            std::mem::size_of::<libc::cpu_set_t>(),
            &mut set,
        ) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
        Ok((0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect())
    }
}

/// Wait until QEMU's QMP socket answers; fails early with QEMU's own error
/// when the process is gone.
pub fn wait_qmp(
    vm: &str,
    socket: &Path,
    pidfile: &Path,
    log: &Path,
    timeout: Duration,
) -> Result<(Qmp, u32)> {
    let start = Instant::now();
    let mut pid: Option<u32> = None;
    loop {
        if pid.is_none() {
            pid = std::fs::read_to_string(pidfile)
                .ok()
                .and_then(|s| s.trim().parse().ok());
        }
        if let Some(p) = pid {
            if socket.exists() {
                if let Ok(q) = Qmp::connect(vm, socket, Duration::from_secs(5)) {
                    return Ok((q, p));
                }
            }
            if !crate::state::alive(p) {
                return Err(LabError::Vm {
                    vm: vm.to_string(),
                    message: format!("QEMU exited at start: {}", log_tail(log, 5)),
                });
            }
        }
        if start.elapsed() > timeout {
            let tail = log_tail(log, 5);
            return Err(LabError::Vm {
                vm: vm.to_string(),
                message: if tail.is_empty() {
                    format!(
                        "QEMU did not open its QMP socket {} within {timeout:?}",
                        socket.display()
                    )
                } else {
                    format!("QEMU did not start within {timeout:?}: {tail}")
                },
            });
        }
        // A QEMU that failed before writing its pidfile leaves only its log.
        if pid.is_none() && start.elapsed() > Duration::from_millis(1500) {
            let tail = log_tail(log, 5);
            if !tail.is_empty()
                && crate::state::find_processes(&socket.display().to_string()).is_empty()
            {
                return Err(LabError::Vm {
                    vm: vm.to_string(),
                    message: format!("QEMU failed to start: {tail}"),
                });
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Last `n` non-empty lines of a log file, joined with " | ".
pub fn log_tail(path: &Path, n: usize) -> String {
    let text = std::fs::read(path).unwrap_or_default();
    let text = String::from_utf8_lossy(&text);
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.trim().is_empty())
        .collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_tail_takes_last_lines() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("l");
        std::fs::write(&p, "a\n\nb\nc\n").unwrap();
        assert_eq!(log_tail(&p, 2), "b | c");
        assert_eq!(log_tail(&dir.path().join("none"), 2), "");
    }

    #[test]
    fn pins_and_reads_back_own_thread() {
        let cpus = crate::spec::allowed_cpus();
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::syscall(libc::SYS_gettid) } as u32;
        let before = affinity(tid).unwrap();
        pin(tid, &cpus[..1]).unwrap();
        assert_eq!(affinity(tid).unwrap(), cpus[..1].to_vec());
        pin(tid, &before).unwrap();
    }

    #[test]
    fn own_threads_are_listed() {
        let t = threads_of(std::process::id());
        assert!(!t.is_empty());
        assert!(vcpu_tids_by_name(std::process::id()).is_empty());
    }
}
