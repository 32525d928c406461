//! QEMU processes of a lab: the binary, a detached launch (own session, so
//! the lab process can exit or die without taking the VM along), waiting for
//! the QMP socket (the client is discovery's, [`vmscope_discover::qmp`]),
//! the VM's thread ids and pinning with `sched_setaffinity`.

use crate::error::{LabError, Result};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use vmscope_discover::qmp::{self, Qmp};
use vmscope_discover::threads;
use vmscope_linux::ProcRoot;

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
/// failed to exec); its pid comes from QEMU's `-pidfile`. With `cpus`, QEMU
/// starts pinned to them, so every thread it creates (vCPUs and I/O
/// threads until they are pinned on their own, the `call_rcu` thread, the
/// `worker` pool threads it starts at any time) inherits the emulator's
/// CPUs, as libvirt's emulator pinning does.
pub fn spawn_detached(vm: &str, argv: &[String], log: &Path, cpus: &[usize]) -> Result<()> {
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
    let pin_to = cpu_set(cpus);
    // SAFETY: only async-signal-safe calls (sched_setaffinity, close_range,
    // setsid, fork, _exit) between fork and exec, on a set prepared before
    // the fork.
    unsafe {
        cmd.pre_exec(move || {
            if let Some(set) = &pin_to {
                if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            // Descriptors the caller inherited (a lock held by `flock`, a
            // test harness's pipes) must not live on in a VM that outlives
            // the caller: every descriptor above stderr closes at exec.
            libc::syscall(
                libc::SYS_close_range,
                3u32,
                u32::MAX,
                libc::CLOSE_RANGE_CLOEXEC,
            );
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

/// A CPU set of `cpus`; `None` for none.
fn cpu_set(cpus: &[usize]) -> Option<libc::cpu_set_t> {
    if cpus.is_empty() {
        return None;
    }
    // SAFETY: cpu_set_t is plain data; CPU_SET stays within CPU_SETSIZE.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus {
            if c < libc::CPU_SETSIZE as usize {
                libc::CPU_SET(c, &mut set);
            }
        }
        Some(set)
    }
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

/// Thread ids of a running VM.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VmThreads {
    pub vcpus: Vec<u32>,
    pub iothreads: Vec<(String, u32)>,
}

/// vCPU and I/O thread ids from QMP; the vCPUs from the thread names when
/// QMP lists none.
pub fn query_threads(vm: &str, pid: u32, qmp: &mut Qmp) -> Result<VmThreads> {
    let err = |source| LabError::Qmp {
        vm: vm.to_string(),
        source,
    };
    let mut vcpus: Vec<u32> = qmp::vcpu_threads(qmp)
        .map_err(err)?
        .into_iter()
        .map(|(_, tid)| tid)
        .collect();
    if vcpus.is_empty() {
        vcpus = threads::vcpu_tids_by_name(&ProcRoot::system().threads(pid));
    }
    Ok(VmThreads {
        vcpus,
        iothreads: qmp::iothreads(qmp).map_err(err)?,
    })
}

/// Wait until QEMU's QMP socket answers; fails early with QEMU's own error
/// when the process is gone.
pub fn wait_qmp(
    vm: &str,
    socket: &Path,
    pidfile: &Path,
    log: &Path,
    timeout: Duration,
    cancel: &crate::cancel::Cancel,
) -> Result<(Qmp, u32)> {
    let start = Instant::now();
    let mut pid: Option<u32> = None;
    loop {
        cancel.check(&format!("waiting for VM {vm}'s QEMU to start"))?;
        if pid.is_none() {
            pid = std::fs::read_to_string(pidfile)
                .ok()
                .and_then(|s| s.trim().parse().ok());
        }
        if let Some(p) = pid {
            if socket.exists() {
                if let Ok(q) = Qmp::connect(socket, Duration::from_secs(5)) {
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
}
