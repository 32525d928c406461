//! Lab tests with real QEMU VMs (TCG here, KVM where the probe finds it
//! usable), driven through the built `vmscope` binary: boot a two-VM lab,
//! talk to both agents, copy and run a static program, list the VMs, tear
//! down and check that nothing is left; kill `lab up` half-way and check that
//! `lab down` still removes everything. Bad specs fail before anything starts.
//!
//! Every test that needs root, QEMU, busybox-static or the static guest
//! agent prints `SKIP: <reason>` when they are missing (a failure under CI). One guest
//! image is shared by all tests (cache under the target directory, built once
//! under a file lock).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const VMSCOPE: &str = env!("CARGO_BIN_EXE_vmscope");

/// Lab tests boot VMs; on a 2-CPU machine one lab at a time is plenty.
static SERIAL: Mutex<()> = Mutex::new(());

use common::{leftovers, write_spec, LabEnv as Env};

fn vmscope(env: &Env, args: &[&str]) -> Command {
    let mut c = Command::new(VMSCOPE);
    // Global options first: everything after `--` belongs to the guest command.
    c.arg("lab")
        .arg("--cache-dir")
        .arg(&env.cache)
        .arg("--run-dir")
        .arg(&env.run)
        .args(args)
        .env("VMSCOPE_AGENT", &env.agent)
        .stdin(Stdio::null());
    c
}

/// Tears the lab down if a test fails half-way.
struct DownOnDrop<'a>(&'a Env, &'a str);

impl Drop for DownOnDrop<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let _ = vmscope(self.0, &["down", self.1]).output();
        }
    }
}

fn run_ok(env: &Env, args: &[&str]) -> Output {
    let out = vmscope(env, args).output().expect("run vmscope");
    assert!(
        out.status.success(),
        "vmscope lab {args:?} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A static C program: prints its argument and exits 7.
fn static_program(dir: &Path) -> Option<PathBuf> {
    let gcc = vmscope_lab::util::which("gcc")?;
    let src = dir.join("hello.c");
    std::fs::write(
        &src,
        "#include <stdio.h>\nint main(int c, char **v) { printf(\"hello from %s\\n\", c > 1 ? v[1] : \"?\"); return 7; }\n",
    )
    .ok()?;
    let bin = dir.join("hello");
    let st = Command::new(gcc)
        .args(["-static", "-O1", "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
        .ok()?;
    st.success().then_some(bin)
}

#[test]
fn two_vm_lab_boots_runs_and_leaves_nothing() {
    let env = need_lab!("lr");
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let lab = "ci-two";
    let _ = vmscope(&env, &["down", lab]).output();
    let _guard = DownOnDrop(&env, lab);
    let tmp = tempfile::tempdir().unwrap();
    let spec = write_spec(
        tmp.path(),
        lab,
        r#"# Test lab: two small VMs, tap NICs on the lab bridge, a loop-device disk.
name = "ci-two"
accel = "auto"

[[vm]]
name = "t0"
vcpus = 1
memory_mib = 160
pin_vcpus = [0]
[[vm.nic]]
kind = "user"
[[vm.nic]]
kind = "tap"
[[vm.disk]]
backend = "block"
size_mib = 16
cache = "none"
aio = "native"

[[vm]]
name = "t1"
vcpus = 1
memory_mib = 160
iothreads = 1
pin_emulator = [1]
pin_io = [0]
[[vm.nic]]
kind = "tap"
[[vm.disk]]
backend = "file"
format = "qcow2"
size_mib = 16
iothread = 0
"#,
    );
    let start = Instant::now();
    let out = run_ok(
        &env,
        &[
            "up",
            spec.to_str().unwrap(),
            "--format",
            "json",
            "--hello-timeout",
            "120",
        ],
    );
    let up_secs = start.elapsed().as_secs_f64();
    eprintln!(
        "lab up: {up_secs:.1} s\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let states: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("lab up --format json");
    let st = &states[0];
    assert_eq!(st["name"], lab);
    assert!(
        st["accel"] == "tcg" || st["accel"] == "kvm",
        "{}",
        st["accel"]
    );
    assert!(!st["accel_reason"].as_str().unwrap_or("").is_empty());
    let vms = st["vms"].as_array().unwrap();
    assert_eq!(vms.len(), 2);
    for vm in vms {
        assert!(vm["hello"]["kernel"].as_str().is_some(), "no hello: {vm}");
        assert_eq!(vm["running"], true);
        assert_eq!(vm["vcpu_tids"].as_array().unwrap().len(), 1);
    }

    // The library view other crates use: state, pids, agents.
    let state = vmscope_lab::load_state_in(&env.run, lab).unwrap();
    for vm in &state.vms {
        assert!(vmscope_lab::vm_running(vm), "VM {} not running", vm.name);
        let (mut client, hello) = vmscope_lab::connect_agent(vm, Duration::from_secs(20)).unwrap();
        assert_eq!(hello.hostname, vm.name);
        let rtt = client.ping(Duration::from_secs(10)).unwrap();
        eprintln!("VM {}: ping {rtt:?}", vm.name);
        let pid = vm.pid.unwrap();
        // With emulator pinning, every thread but the vCPUs and the
        // lab's I/O threads (the main loop, call_rcu, the worker pool, the
        // monitor's thread) is on the emulator's CPUs, and the I/O threads
        // on theirs.
        if !vm.pin_emulator.is_empty() {
            let mut seen = 0;
            for (tid, comm) in vmscope_linux::ProcRoot::system().threads(pid) {
                let cpus = vmscope_lab::qemu::affinity(tid).unwrap();
                if comm.starts_with("CPU ") {
                    continue;
                }
                // Only the lab's own I/O threads are pinned to pin_io;
                // QEMU's monitor thread (`IO mon_iothread`) stays with
                // the emulator.
                let want = if vm.iothread_tids.iter().any(|(_, t)| *t == tid) {
                    &vm.pin_io
                } else {
                    seen += 1;
                    &vm.pin_emulator
                };
                assert_eq!(&cpus, want, "VM {} thread {tid} ({comm})", vm.name);
            }
            assert!(seen >= 2, "main loop and call_rcu at least: {seen}");
        }
        // vCPU threads are named `CPU n/TCG|KVM` (debug-threads=on).
        for (i, tid) in vm.vcpu_tids.iter().enumerate() {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")).unwrap();
            assert!(
                comm.trim() == format!("CPU {i}/TCG") || comm.trim() == format!("CPU {i}/KVM"),
                "tid {tid} is {comm:?}"
            );
        }
    }
    // Pinning: t0's vCPU runs on host CPU 0 only.
    let t0 = state.vm("t0").unwrap();
    assert!(t0.pinned);
    assert_eq!(
        vmscope_lab::qemu::affinity(t0.vcpu_tids[0]).unwrap(),
        vec![0]
    );
    let t1 = state.vm("t1").unwrap();
    assert_eq!(t1.iothread_tids.len(), 1);
    let pid1 = t1.pid.unwrap();
    let io_comm =
        std::fs::read_to_string(format!("/proc/{pid1}/task/{}/comm", t1.iothread_tids[0].1))
            .unwrap();
    assert_eq!(io_comm.trim(), "IO iothread0");

    // lab status.
    let out = run_ok(&env, &["status", lab, "--format", "json"]);
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(s[0]["vms"][1]["running"], true);
    let out = run_ok(&env, &["status"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("t0") && text.contains("running"), "{text}");

    // lab exec, and the two guests reach each other over the bridge.
    let out = run_ok(&env, &["exec", "t0", "--", "uname", "-r"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("cloud-amd64"));
    let t1_ip = t1.nics[0].guest_ip.clone().unwrap();
    run_ok(
        &env,
        &["exec", "t0", "--", "ping", "-c", "1", "-W", "5", &t1_ip],
    );
    let out = run_ok(
        &env,
        &[
            "exec",
            "t1",
            "--",
            "sh",
            "-c",
            "ls /dev/vda && cat /proc/cmdline",
        ],
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("vmscope_name=t1"));
    let out = vmscope(&env, &["exec", "t1", "--", "false"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "exit code of the guest command");

    // lab cp + exec of a static test program.
    match static_program(tmp.path()) {
        Some(bin) => {
            run_ok(&env, &["cp", bin.to_str().unwrap(), "t0:/root/hello"]);
            let out = vmscope(&env, &["exec", "t0", "--", "/root/hello", "lab"])
                .output()
                .unwrap();
            assert_eq!(String::from_utf8_lossy(&out.stdout), "hello from lab\n");
            assert_eq!(out.status.code(), Some(7));
        }
        None => vmscope_testkit::skip(
            "gcc -static unavailable (apt-get install gcc libc6-dev); the cp + exec of a compiled program is not checked",
        ),
    }

    // lab console --dump shows the guest's boot.
    let out = run_ok(&env, &["console", "t1", "--dump"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains(vmscope_lab::image::READY_MARKER));

    // `vmscope vms` sees both VMs with the same vCPU threads.
    let out = Command::new(VMSCOPE)
        .args(["vms", "--format", "json"])
        .output()
        .unwrap();
    if out.status.success() {
        let text = String::from_utf8_lossy(&out.stdout);
        for vm in &state.vms {
            assert!(
                text.contains(&format!("\"{}\"", vm.name)),
                "vms misses {}: {text}",
                vm.name
            );
            for tid in &vm.vcpu_tids {
                assert!(
                    text.contains(&tid.to_string()),
                    "vms misses vCPU tid {tid} of {}",
                    vm.name
                );
            }
        }
    } else {
        eprintln!(
            "note: vmscope vms failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // Tear down; nothing may be left.
    let out = run_ok(&env, &["down", lab]);
    eprintln!("{}", String::from_utf8_lossy(&out.stdout));
    assert_eq!(leftovers(&env, lab), Vec::<String>::new());
    // A second down says the lab is not up.
    let out = vmscope(&env, &["down", lab]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not up"));
}

#[test]
fn killed_lab_up_is_cleaned_by_down() {
    let env = need_lab!("lr");
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let lab = "ci-kill";
    let _ = vmscope(&env, &["down", lab]).output();
    let _guard = DownOnDrop(&env, lab);
    let tmp = tempfile::tempdir().unwrap();
    let spec = write_spec(
        tmp.path(),
        lab,
        r#"name = "ci-kill"
accel = "tcg"

[[vm]]
name = "k0"
vcpus = 1
memory_mib = 128
[[vm.nic]]
kind = "tap"
[[vm.disk]]
backend = "block"
size_mib = 8
"#,
    );
    let mut child = vmscope(&env, &["up", spec.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Wait until QEMU runs (its pid is recorded), then SIGKILL `lab up`.
    let state_file = env.run.join(lab).join("state.json");
    let deadline = Instant::now() + Duration::from_secs(120);
    let qemu_pid = loop {
        assert!(Instant::now() < deadline, "QEMU never started");
        if let Ok(st) = vmscope_lab::state::LabState::load(&state_file) {
            if let Some(pid) = st.vms.first().and_then(|v| v.pid) {
                break pid;
            }
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("lab up ended before QEMU started: {status}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    child.kill().unwrap(); // SIGKILL
    let _ = child.wait();
    // QEMU runs on in its own session; the half-made lab is on the host.
    assert!(vmscope_lab::state::alive(qemu_pid), "QEMU died with lab up");
    assert!(!leftovers(&env, lab).is_empty());

    let out = run_ok(&env, &["down", lab]);
    eprintln!("{}", String::from_utf8_lossy(&out.stdout));
    assert_eq!(leftovers(&env, lab), Vec::<String>::new());
    assert!(!vmscope_lab::state::alive(qemu_pid));
}

/// Issue 32 item 4 (sweep rows lb3, lb8, lbd1, lb6): while `lab up` of a
/// lab works, a second `lab up` of the same spec and a `lab down` fail at
/// once naming it, and the lab it brings up is whole; a `lab up` whose QEMU
/// dies while it boots fails with exit 2 and one error line, removes
/// everything, and keeps the VMs' logs.
#[test]
fn one_lab_up_at_a_time_and_a_vm_that_dies_fails_it() {
    let env = need_lab!("lr");
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let lab = "ci-lock";
    let _ = vmscope(&env, &["down", lab]).output();
    let _guard = DownOnDrop(&env, lab);
    let tmp = tempfile::tempdir().unwrap();
    let spec = write_spec(
        tmp.path(),
        lab,
        "name = \"ci-lock\"\naccel = \"tcg\"\n\n[[vm]]\nname = \"l0\"\nvcpus = 1\nmemory_mib = 128\n",
    );
    let first = vmscope(&env, &["up", spec.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = common::Reap(first);
    let lock = env.run.join(format!("{lab}.lock"));
    let deadline = Instant::now() + Duration::from_secs(60);
    while !lock.exists() {
        assert!(Instant::now() < deadline, "lab up never took its lock");
        std::thread::sleep(Duration::from_millis(20));
    }
    let holder = format!("by process {}", first.0.id());
    for args in [vec!["up", spec.to_str().unwrap()], vec!["down", lab]] {
        let out = vmscope(&env, &args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "lab {args:?}: {err}");
        assert!(
            err.contains("is being brought up or torn down") && err.contains(&holder),
            "lab {args:?}: {err}"
        );
    }
    let status = first.0.wait().unwrap();
    assert!(status.success(), "the first lab up failed");
    run_ok(&env, &["exec", "l0", "--", "true"]);
    run_ok(&env, &["down", lab]);
    assert_eq!(leftovers(&env, lab), Vec::<String>::new());
    assert!(!lock.exists(), "the lab's lock file stayed");

    // Two VMs; the second's QEMU is killed as soon as it runs.
    let lab = "ci-dies";
    let _ = vmscope(&env, &["down", lab]).output();
    let _guard = DownOnDrop(&env, lab);
    let spec = write_spec(
        tmp.path(),
        lab,
        "name = \"ci-dies\"\naccel = \"tcg\"\n\n[[vm]]\nname = \"d0\"\nmemory_mib = 128\n\n[[vm]]\nname = \"d1\"\nmemory_mib = 128\n",
    );
    let up = vmscope(&env, &["up", spec.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let state_file = env.run.join(lab).join("state.json");
    let deadline = Instant::now() + Duration::from_secs(120);
    let victim = loop {
        assert!(Instant::now() < deadline, "QEMU of d1 never started");
        if let Ok(st) = vmscope_lab::state::LabState::load(&state_file) {
            if let Some(pid) = st.vms.iter().find(|v| v.name == "d1").and_then(|v| v.pid) {
                break pid;
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    // SAFETY: signals the lab's QEMU, found by its pid in the state file.
    unsafe { libc::kill(victim as i32, libc::SIGKILL) };
    let out = up.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "lab up whose VM died: {err}");
    assert_eq!(
        err.lines()
            .filter(|l| l.starts_with("vmscope: error:"))
            .count(),
        1,
        "{err}"
    );
    assert!(err.contains("everything it made was removed"), "{err}");
    assert_eq!(leftovers(&env, lab), Vec::<String>::new());
    // What the VMs had logged by then (d0's boot messages, often) is kept,
    // and the error says where.
    let kept = env.run.join(format!("{lab}.failed"));
    if kept.exists() {
        assert!(
            std::fs::read_dir(&kept).unwrap().count() > 0,
            "{} is empty",
            kept.display()
        );
        assert!(err.contains(&kept.display().to_string()), "{err}");
    }
    let _ = std::fs::remove_dir_all(&kept);
}

#[test]
fn bad_specs_fail_before_anything_starts() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let cases = [
        ("zero", "name = \"bad\"\n\n[[vm]]\nname = \"a\"\nvcpus = 0\n", "zero.toml:5: vm[0].vcpus:"),
        ("unknown", "name = \"bad\"\n[[vm]]\nname = \"a\"\nmemory = 64\n", "unknown.toml:4: memory: unknown field"),
        ("pin", "name = \"bad\"\n[[vm]]\nname = \"a\"\npin_vcpus = [4095]\n", "pin.toml:4: vm[0].pin_vcpus: host CPU 4095"),
        (
            "kernel",
            "name = \"bad\"\nkernel = \"/nonexistent/vmlinuz\"\ninitrd = \"/nonexistent/initrd\"\n[[vm]]\nname = \"a\"\n",
            "kernel.toml:2: kernel: /nonexistent/vmlinuz does not exist",
        ),
        (
            "disk",
            "name = \"bad\"\n[[vm]]\nname = \"a\"\n[[vm.disk]]\nbackend = \"file\"\npath = \"/nonexistent.img\"\n",
            "disk.toml:6: vm[0].disk[0].path: disk image /nonexistent.img does not exist",
        ),
    ];
    for (name, text, want) in cases {
        let spec = write_spec(tmp.path(), name, text);
        let out = Command::new(VMSCOPE)
            .args(["lab", "up"])
            .arg(&spec)
            .arg("--run-dir")
            .arg(&run)
            .arg("--cache-dir")
            .arg(tmp.path().join("cache"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert!(err.contains(want), "{name}: want {want:?} in {err:?}");
        assert!(!run.join("bad").exists(), "{name}: something was started");
    }
}

#[test]
fn not_root_is_refused_before_anything_starts() {
    if !vmscope_testkit::require_root("dropping to an unprivileged user") {
        return;
    }
    let Some(setpriv) = vmscope_testkit::which("setpriv") else {
        vmscope_testkit::skip("setpriv not installed (apt-get install util-linux)");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let spec = write_spec(
        tmp.path(),
        "tapspec",
        "name = \"noroot\"\n[[vm]]\nname = \"a\"\n[[vm.nic]]\nkind = \"tap\"\n",
    );
    let mut perms = std::fs::metadata(tmp.path()).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(tmp.path(), perms).unwrap();
    let out = Command::new(setpriv)
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            VMSCOPE,
            "lab",
            "up",
        ])
        .arg(&spec)
        .arg("--run-dir")
        .arg(tmp.path().join("run"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    if err.contains("Permission denied") && !err.contains("vmscope") {
        vmscope_testkit::skip(&format!(
            "the vmscope binary is not reachable for an unprivileged user: {err}"
        ));
        return;
    }
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("needs root") && err.contains("tapspec.toml"),
        "{err}"
    );
    assert!(!tmp.path().join("run").exists());
}
