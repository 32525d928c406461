//! Commands in lab VMs for every benchmark: one agent connection per [`Guest`] (through the VM's broker,
//! so recordings and other tools use the VM at the same time), reopened
//! when it breaks; a QEMU that is gone is told apart from a command that
//! failed ([`VmFailure`]); [`Guest::spawn`] runs a long command on its own
//! connection and thread while the caller does the other side's work;
//! [`Guest::install`] copies a host program and the libraries it loads
//! into the guest (peer tools such as iperf3).

use serde::de::DeserializeOwned;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;
use vmscope_lab::VmState;
use vmscope_protocol::AgentClient;

/// Why a VM command failed.
#[derive(Debug, Clone, PartialEq)]
pub enum VmFailure {
    /// The VM's QEMU is gone: every later point of the VM fails too.
    Dead(String),
    /// This command failed; the VM still runs.
    Failed(String),
}

impl std::fmt::Display for VmFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            VmFailure::Dead(m) | VmFailure::Failed(m) => f.write_str(m),
        }
    }
}

/// The agent's path inside lab guests.
pub use vmscope_lab::image::GUEST_AGENT_PATH as AGENT;

/// What a guest command printed.
#[derive(Debug, Clone, Default)]
pub struct Output {
    pub stdout: String,
    pub stderr: String,
}

/// One lab VM's agent.
pub struct Guest {
    vm: VmState,
    client: Option<AgentClient<UnixStream>>,
}

impl Guest {
    pub fn new(vm: &VmState) -> Guest {
        Guest {
            vm: vm.clone(),
            client: None,
        }
    }

    pub fn vm(&self) -> &VmState {
        &self.vm
    }

    pub fn name(&self) -> &str {
        &self.vm.name
    }

    /// Why the VM counts as dead, when its QEMU is gone.
    pub fn dead(&self) -> Option<String> {
        (!vmscope_lab::vm_running(&self.vm)).then(|| {
            format!(
                "VM {} stopped (QEMU pid {} is gone)",
                self.vm.name,
                self.vm
                    .pid
                    .map(|p| p.to_string())
                    .unwrap_or_else(|| "?".into())
            )
        })
    }

    fn client(&mut self) -> Result<&mut AgentClient<UnixStream>, String> {
        if self.client.is_none() {
            let (c, _) = vmscope_lab::connect_agent(&self.vm, Duration::from_secs(20))
                .map_err(|e| e.to_string())?;
            self.client = Some(c);
        }
        Ok(self.client.as_mut().expect("connected above"))
    }

    /// Closes this guest's connection, so a command spawned on a
    /// connection of its own ([`Guest::spawn`]) or another program (an
    /// active recorder) gets the agent even through a broker that serves
    /// one client at a time.
    pub fn disconnect(&mut self) {
        self.client = None;
    }

    /// Runs `argv` in the guest; a non-zero exit, a timeout or a broken
    /// channel is an error naming the command.
    pub fn exec(&mut self, argv: &[String], timeout: Duration) -> Result<Output, VmFailure> {
        let mut last = String::new();
        for _attempt in 0..2 {
            if let Some(d) = self.dead() {
                return Err(VmFailure::Dead(d));
            }
            let out = match self.client() {
                Ok(c) => c.exec_with_limit(argv, None, timeout, Some(4 << 20)),
                Err(e) => {
                    last = e;
                    continue;
                }
            };
            match out {
                Ok(o) if o.timed_out => {
                    return Err(VmFailure::Failed(format!(
                        "VM {}: `{}` killed after {} s",
                        self.vm.name,
                        argv.join(" "),
                        timeout.as_secs()
                    )))
                }
                Ok(o) if o.exit_code != 0 => {
                    return Err(self.dead().map(VmFailure::Dead).unwrap_or_else(|| {
                        VmFailure::Failed(format!(
                            "VM {}: `{}` exited {}: {}",
                            self.vm.name,
                            argv.join(" "),
                            o.exit_code,
                            String::from_utf8_lossy(&o.stderr).trim()
                        ))
                    }))
                }
                Ok(o) => {
                    return Ok(Output {
                        stdout: String::from_utf8_lossy(&o.stdout).to_string(),
                        stderr: String::from_utf8_lossy(&o.stderr).to_string(),
                    })
                }
                Err(e) => {
                    self.client = None;
                    last = e.to_string();
                }
            }
        }
        Err(self
            .dead()
            .map(VmFailure::Dead)
            .unwrap_or_else(|| VmFailure::Failed(format!("VM {}: {last}", self.vm.name))))
    }

    /// `sh -c SCRIPT` in the guest.
    pub fn sh(&mut self, script: &str, timeout: Duration) -> Result<Output, VmFailure> {
        self.exec(
            &["sh".to_string(), "-c".to_string(), script.to_string()],
            timeout,
        )
    }

    /// Runs `argv` and parses the one JSON line it prints; returns the value
    /// and the line.
    pub fn exec_json<T: DeserializeOwned>(
        &mut self,
        argv: &[String],
        timeout: Duration,
    ) -> Result<(T, String), VmFailure> {
        let o = self.exec(argv, timeout)?;
        let line = o.stdout.trim().to_string();
        serde_json::from_str(&line)
            .map(|v| (v, line.clone()))
            .map_err(|e| {
                VmFailure::Failed(format!(
                    "VM {}: `{}` printed no JSON line ({e}): {line:.200} (is the guest agent \
                     older than this vmscope?)",
                    self.vm.name,
                    argv.join(" ")
                ))
            })
    }

    /// Runs `argv` on a connection and thread of its own (the caller drives
    /// the other side meanwhile); join the handle for its result.
    pub fn spawn_json<T: DeserializeOwned + Send + 'static>(
        &self,
        argv: Vec<String>,
        timeout: Duration,
    ) -> std::thread::JoinHandle<Result<(T, String), VmFailure>> {
        let mut g = Guest::new(&self.vm);
        std::thread::spawn(move || g.exec_json(&argv, timeout))
    }

    /// Like [`Guest::spawn_json`], for commands whose output is not JSON.
    pub fn spawn(
        &self,
        argv: Vec<String>,
        timeout: Duration,
    ) -> std::thread::JoinHandle<Result<Output, VmFailure>> {
        let mut g = Guest::new(&self.vm);
        std::thread::spawn(move || g.exec(&argv, timeout))
    }

    /// TCP ports listening in the guest (`/proc/net/tcp{,6}`).
    pub fn listening(&mut self) -> Result<Vec<u16>, VmFailure> {
        let o = self.sh(
            "cat /proc/net/tcp /proc/net/tcp6 2>/dev/null",
            Duration::from_secs(30),
        )?;
        // The two files' texts concatenated: their header lines are skipped
        // as non-LISTEN rows.
        Ok(vmscope_workload::net::listening(&o.stdout))
    }

    /// Waits until `port` listens in the guest, up to `timeout`.
    pub fn wait_listening(&mut self, port: u16, timeout: Duration) -> Result<(), VmFailure> {
        self.wait_listening_while(port, timeout, || None)
    }

    /// Like [`Guest::wait_listening`], giving up early with the error
    /// `gone` returns (the server that was to listen exited).
    pub fn wait_listening_while(
        &mut self,
        port: u16,
        timeout: Duration,
        mut gone: impl FnMut() -> Option<VmFailure>,
    ) -> Result<(), VmFailure> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if self.listening()?.contains(&port) {
                return Ok(());
            }
            if let Some(e) = gone() {
                return Err(e);
            }
            if std::time::Instant::now() >= deadline {
                return Err(VmFailure::Failed(format!(
                    "VM {}: nothing listens on port {port} after {} s",
                    self.vm.name,
                    timeout.as_secs()
                )));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The CPU time (utime + stime, guest clock ticks at 100 Hz) of the
    /// agent process serving this connection, seconds: the parent of the
    /// shell the agent starts.
    pub fn agent_cpu_s(&mut self) -> Result<f64, VmFailure> {
        let o = self.sh("cat /proc/$PPID/stat", Duration::from_secs(30))?;
        let c = vmscope_linux::procfs::parse_process_cpu(o.stdout.trim(), Path::new("stat"))
            .map_err(|e| VmFailure::Failed(format!("VM {}: agent stat: {e}", self.vm.name)))?;
        // Guest kernels tick at USER_HZ = 100 for /proc (every Linux on x86).
        Ok((c.utime + c.stime) as f64 / 100.0)
    }

    /// Copies the host program `exe` and every library it loads (`ldd`) to
    /// the same paths in the guest, unless an identical copy is there.
    /// Returns the files copied.
    pub fn install(&mut self, exe: &Path) -> Result<Vec<PathBuf>, VmFailure> {
        let mut files = vec![exe.to_path_buf()];
        files.extend(libraries(exe).map_err(VmFailure::Failed)?);
        let mut copied = Vec::new();
        for f in files {
            let data = std::fs::read(&f).map_err(|e| {
                VmFailure::Failed(format!("reading {} to copy it: {e}", f.display()))
            })?;
            let guest = f.display().to_string();
            let want = {
                let mut h = vmscope_lab::util::Sha256::new();
                h.update(&data);
                h.hex()
            };
            let have = self
                .sh(
                    &format!("sha256sum {guest} 2>/dev/null || true"),
                    Duration::from_secs(60),
                )?
                .stdout;
            if have.split_whitespace().next() == Some(want.as_str()) {
                continue;
            }
            if let Some(dir) = f.parent() {
                self.sh(
                    &format!("mkdir -p {}", dir.display()),
                    Duration::from_secs(30),
                )?;
            }
            // The dynamic loader must be executable too (the kernel opens
            // a program's interpreter for execution).
            let mode = 0o755;
            let r = match self.client() {
                Ok(c) => c
                    .put_file(&data, &guest, mode, Duration::from_secs(600))
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e),
            };
            if let Err(e) = r {
                self.client = None;
                return Err(self.dead().map(VmFailure::Dead).unwrap_or_else(|| {
                    VmFailure::Failed(format!("VM {}: copying {guest}: {e}", self.vm.name))
                }));
            }
            copied.push(f);
        }
        Ok(copied)
    }
}

/// The shared libraries `exe` loads, by `ldd` (the dynamic loader
/// included), as absolute host paths.
pub fn libraries(exe: &Path) -> Result<Vec<PathBuf>, String> {
    let out = std::process::Command::new("ldd")
        .arg(exe)
        .output()
        .map_err(|e| {
            format!(
                "running ldd on {}: {e} (Debian package libc-bin)",
                exe.display()
            )
        })?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut libs = Vec::new();
    for l in text.lines() {
        let w: Vec<&str> = l.split_whitespace().collect();
        let lib = match w.iter().position(|x| *x == "=>") {
            Some(i) => w.get(i + 1).copied(),
            None => w.first().copied(),
        };
        if let Some(p) = lib.filter(|p| p.starts_with('/')) {
            let p = PathBuf::from(p);
            if !libs.contains(&p) {
                libs.push(p);
            }
        }
    }
    Ok(libs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libraries_of_a_dynamic_program() {
        let Some(sh) = vmscope_workload_which("ls") else {
            return;
        };
        let libs = libraries(&sh).unwrap();
        assert!(
            libs.iter().any(|l| l.to_string_lossy().contains("libc.so")),
            "{libs:?}"
        );
        assert!(libs.iter().all(|l| l.is_absolute()));
    }

    fn vmscope_workload_which(t: &str) -> Option<PathBuf> {
        std::env::var_os("PATH").and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(t))
                .find(|f| f.is_file())
        })
    }
}
