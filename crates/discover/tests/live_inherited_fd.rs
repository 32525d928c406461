//! The agent channel as libvirt gives it, on a real QEMU: the test binds
//! the Unix socket itself and starts a paused QEMU (TCG) with the socket
//! inherited as a descriptor (`-chardev socket,id=c0,fd=N,server=on,
//! wait=off`) and the `vmscope.agent` port declared in JSON, as libvirt
//! writes it; discovery on the real /proc finds the socket's path, and
//! QEMU accepts a connection on it. A socket bound to an abstract name has
//! no path: the channel is reported unreachable, saying why. Skips, saying
//! why, when qemu-system-x86_64 is not installed.

use std::os::fd::{AsRawFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use vmscope_discover::{discover, AgentChannel, DiscoverOptions, Vm};

const QEMU: &str = "qemu-system-x86_64";
/// The descriptor number QEMU gets the socket as (libvirt's are in the 20s-30s).
const CHILD_FD: RawFd = 28;

/// Kills the QEMU this test started (by its pid) however the test ends.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn have_qemu() -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(QEMU).is_file()))
}

/// A paused QEMU named `name` with `listener` inherited as [`CHILD_FD`].
fn start(name: &str, listener: &UnixListener) -> Guard {
    let fd = listener.as_raw_fd();
    let mut cmd = Command::new(QEMU);
    cmd.args(["-name", &format!("guest={name},debug-threads=on"), "-S"])
        .args(["-accel", "tcg", "-m", "64", "-display", "none", "-nodefaults"])
        .args(["-monitor", "none", "-serial", "none"])
        .args([
            "-device",
            r#"{"driver":"virtio-serial-pci","id":"virtio-serial0"}"#,
            "-chardev",
            &format!("socket,id=charchannel0,fd={CHILD_FD},server=on,wait=off"),
            "-device",
            r#"{"driver":"virtserialport","bus":"virtio-serial0.0","nr":1,"chardev":"charchannel0","id":"channel0","name":"vmscope.agent"}"#,
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: dup2 is async-signal-safe; it runs in the child between fork
    // and exec, and the copy it makes has FD_CLOEXEC cleared.
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(fd, CHILD_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Guard(cmd.spawn().expect("start qemu"))
}

/// Discovery's view of `pid`, once QEMU has started its vCPU thread.
fn discovered(guard: &mut Guard) -> Vm {
    let pid = guard.0.id();
    let start = Instant::now();
    loop {
        if let Ok(Some(status)) = guard.0.try_wait() {
            let mut err = String::new();
            if let Some(mut e) = guard.0.stderr.take() {
                use std::io::Read;
                let _ = e.read_to_string(&mut err);
            }
            panic!("qemu exited early: {status}: {err}");
        }
        let vms = discover(&DiscoverOptions {
            proc_root: "/proc".into(),
            query_qmp: false,
            qmp_timeout: Duration::from_secs(1),
        })
        .expect("discover");
        if let Some(vm) = vms.into_iter().find(|v| v.pid == pid) {
            if !vm.vcpus.is_empty() {
                return vm;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "qemu did not start"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn live_agent_channel_on_an_inherited_descriptor() {
    if !have_qemu() {
        vmscope_testkit::skip(&format!(
            "{QEMU} is not installed (apt-get install qemu-system-x86)"
        ));
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let sock: PathBuf = dir.path().join("libvirt-fd.sock");
    let listener = UnixListener::bind(&sock).expect("bind");
    let mut guard = start("libvirt-fd", &listener);
    // Only QEMU listens from now on, as with libvirtd.
    drop(listener);
    let vm = discovered(&mut guard);
    assert_eq!(vm.name, "libvirt-fd");
    assert_eq!(
        vm.agent,
        AgentChannel::Socket(sock.clone()),
        "{:?}",
        vm.warnings
    );
    // The path discovery found is QEMU's end of the port: it accepts.
    UnixStream::connect(vm.agent.socket().expect("socket"))
        .expect("QEMU accepts a connection on the discovered path");
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", vm.pid)).expect("cmdline");
    assert!(!String::from_utf8_lossy(&cmdline).contains(sock.to_str().expect("utf-8")));
}

#[test]
fn live_abstract_socket_is_unreachable_with_the_reason() {
    if !have_qemu() {
        vmscope_testkit::skip(&format!(
            "{QEMU} is not installed (apt-get install qemu-system-x86)"
        ));
        return;
    }
    let name = format!("vmscope-libvirt-test-{}", std::process::id());
    let addr = SocketAddr::from_abstract_name(name.as_bytes()).expect("abstract name");
    let listener = UnixListener::bind_addr(&addr).expect("bind abstract");
    let mut guard = start("libvirt-abstract", &listener);
    let vm = discovered(&mut guard);
    drop(listener);
    let AgentChannel::Unreachable(why) = &vm.agent else {
        panic!("{:?}", vm.agent)
    };
    assert!(
        why.starts_with(&format!(
            "the vmscope.agent channel exists but cannot be reached: its chardev is QEMU's inherited descriptor {CHILD_FD}, socket inode "
        )) && why.contains("bound to no path")
            && why.contains(&format!("/proc/{}/net/unix", vm.pid)),
        "{why}"
    );
}
