//! Issue 17 on a real libvirtd: a transient libvirt domain (TCG here) made
//! from the lab's guest image, with the agent channel declared exactly as
//! docs/profile-vm.md's libvirt section shows (libvirt binds the socket and passes
//! it to QEMU as an inherited descriptor; the port is declared in JSON).
//! The test starts `virtlogd` and `libvirtd` itself when none answers (no
//! service manager here) and stops what it started; it destroys its domain
//! however it ends. Then:
//! - `vms` shows libvirt's domain name, UUID and state, and finds the
//!   agent's socket path;
//! - a plain `record -a` profiles the domain *active*, the guest's demo
//!   functions in order (alpha > beta > gamma);
//! - `account` reads the domain's disk requests from QEMU's counters
//!   through libvirt (`disk_source` = `libvirt`) while libvirtd holds the
//!   QMP monitor, and counts the guest's reads;
//! - `stat` splits its two vCPUs; `serve` exports its vCPU counters under
//!   its libvirt name;
//! - with libvirt unreachable (a URI to no socket), `vms` says so in one
//!   line and still lists the VM from /proc;
//! - with its agent stopped, a plain `record -a` keeps it passive and
//!   states the fallback reason;
//! - paused by libvirt, `vms` shows it paused;
//! - a libvirt lab (`lab up --libvirt`, one small VM): `virsh list` shows
//!   its domain, `vms` lists it under its libvirt name, its agent answers
//!   `lab exec`, `lab status` says it is a libvirt domain, a second `lab
//!   up` says the lab is up, and `lab down` leaves no domain, no socket in
//!   /run/vmscope and no run directory.
//!
//! Skips with a printed reason without root, QEMU, libvirt or the agent.
//!
//! Without libvirt (a paused QEMU is enough): an agent socket vmscope may
//! not connect to (root-owned, mode 0700; `top` run as `nobody` with only
//! CAP_PERFMON, since root passes every permission check) leaves the VM
//! listed, passive, its reason saying permission was denied on that path.

mod common;

use common::Reap;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const VMSCOPE: &str = env!("CARGO_BIN_EXE_vmscope");
const URI: &str = "qemu:///system";

fn virsh(args: &[&str]) -> Output {
    vmscope_lab::libvirt::virsh(URI, args).expect("run virsh")
}

/// The transient domain, destroyed on drop.
struct Domain(String);

impl Drop for Domain {
    fn drop(&mut self) {
        let _ = virsh(&["destroy", &self.0]);
    }
}

/// The `<channel>` a user adds to an existing domain's `<devices>`: the
/// libvirt section of docs/profile-vm.md shows this text (a unit test below
/// checks it).
fn channel_xml(socket: &Path) -> String {
    vmscope_discover::agent_channel::libvirt_xml(socket)
}

fn domain_xml(name: &str, kernel: &Path, initrd: &Path, disk: &Path, socket: &Path) -> String {
    format!(
        "<domain type='qemu'>
  <name>{name}</name>
  <memory unit='MiB'>256</memory>
  <vcpu>2</vcpu>
  <os>
    <type arch='x86_64' machine='pc'>hvm</type>
    <kernel>{kernel}</kernel>
    <initrd>{initrd}</initrd>
    <cmdline>console=ttyS0 panic=-1 quiet vmscope_name={name}</cmdline>
  </os>
  <features><acpi/><apic/></features>
  <cpu mode='custom' match='exact'><model fallback='allow'>qemu64</model></cpu>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>destroy</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <disk type='file' device='disk'>
      <driver name='qemu' type='raw' cache='none' io='threads'/>
      <source file='{disk}'/>
      <target dev='vda' bus='virtio'/>
    </disk>
    <serial type='pty'><target port='0'/></serial>
{channel}    <memballoon model='none'/>
  </devices>
</domain>
",
        kernel = kernel.display(),
        initrd = initrd.display(),
        disk = disk.display(),
        channel = channel_xml(socket)
            .lines()
            .map(|l| format!("    {l}\n"))
            .collect::<String>(),
    )
}

fn vms_json(env: &[(&str, &str)]) -> (Vec<Value>, String) {
    let out = Command::new(VMSCOPE)
        .args(["vms", "--no-qmp", "--format", "json"])
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        serde_json::from_slice(&out.stdout).unwrap(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs `argv` in the guest through the VM's broker.
fn guest_exec(socket: &Path, argv: &[&str], timeout: Duration) -> String {
    let stream = vmscope_broker::connect(socket, Some(Path::new(VMSCOPE)), Duration::from_secs(10))
        .expect("broker");
    let (mut client, _) =
        vmscope_protocol::AgentClient::connect(stream, Duration::from_secs(10)).expect("hello");
    let argv: Vec<String> = argv.iter().map(|s| (*s).to_string()).collect();
    let out = client.exec(&argv, timeout).expect("exec");
    assert_eq!(
        out.exit_code,
        0,
        "{argv:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn libvirt_channel_xml_is_the_guides() {
    let guide = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/profile-vm.md"),
    )
    .unwrap();
    let xml = channel_xml(Path::new("/run/vmscope/NAME.sock"));
    assert!(guide.contains(&xml), "docs/profile-vm.md lacks:\n{xml}");
}

/// The two tests watch the whole host; one at a time.
static HOST: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Kills a daemonized QEMU (by its pid file) when dropped.
struct Qemu(PathBuf);

impl Drop for Qemu {
    fn drop(&mut self) {
        if let Some(p) = std::fs::read_to_string(&self.0)
            .ok()
            .and_then(|p| p.trim().parse::<u32>().ok())
        {
            let _ = vmscope_lab::state::kill_process(p);
        }
    }
}

#[test]
fn denied_agent_socket_is_named_with_its_path() {
    let _host = HOST
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if !vmscope_testkit::is_root() {
        vmscope_testkit::skip("needs root (to start QEMU and drop to nobody)");
        return;
    }
    for (tool, pkg) in [
        ("qemu-system-x86_64", "qemu-system-x86"),
        ("setpriv", "util-linux"),
    ] {
        if vmscope_lab::util::which(tool).is_none() {
            vmscope_testkit::skip(&format!("{tool} not installed (apt-get install {pkg})"));
            return;
        }
    }
    let dir = tempfile::Builder::new().prefix("lvdeny").tempdir().unwrap();
    let name = format!("libvirt-deny{}", std::process::id());
    let socket = dir.path().join("agent.sock");
    let pidfile = dir.path().join("qemu.pid");
    // Paused (-S): the guest never runs; only its channel matters.
    common::run_ok(
        Command::new("qemu-system-x86_64")
            .args(["-name", &format!("guest={name},debug-threads=on")])
            .args([
                "-S",
                "-M",
                "pc",
                "-accel",
                "tcg",
                "-nodefaults",
                "-display",
                "none",
            ])
            .args(["-m", "64", "-device", "virtio-serial-pci", "-chardev"])
            .arg(format!(
                "socket,id=ag,path={},server=on,wait=off",
                socket.display()
            ))
            .args(["-device", "virtserialport,chardev=ag,name=vmscope.agent"])
            .arg("-pidfile")
            .arg(&pidfile)
            .arg("-daemonize"),
    );
    let _qemu = Qemu(pidfile);
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    let out = common::run_ok(
        Command::new("setpriv")
            .args([
                "--reuid=nobody",
                "--regid=nogroup",
                "--clear-groups",
                "--inh-caps=+perfmon",
                "--ambient-caps=+perfmon",
            ])
            .arg(VMSCOPE)
            .args(["top", "-b", "-n", "1", "--format", "json"])
            .current_dir("/"),
    );
    let doc: Value = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .next_back()
        .expect("a JSON document");
    let vm = doc["domains"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == name.as_str())
        .unwrap_or_else(|| panic!("{name} not listed: {doc}"));
    let why = vm["reason"].as_str().unwrap_or_default();
    eprintln!("{name} as nobody: {why}");
    assert_eq!(vm["role"], "passive", "{vm}");
    assert!(
        why.starts_with(&format!(
            "passive: the vmscope.agent channel exists but permission was denied: {} (",
            socket.display()
        )),
        "{why}"
    );
}

#[test]
fn libvirt_domain_is_profiled_accounted_and_listed() {
    let _host = HOST
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let env = need_lab!("lv");
    for tool in ["virsh", "libvirtd", "virtlogd"] {
        if vmscope_lab::util::which(tool).is_none() {
            vmscope_testkit::skip(&format!(
                "{tool} not installed (apt-get install libvirt-daemon-system libvirt-clients)"
            ));
            return;
        }
    }
    let daemons = match vmscope_lab::libvirt::Daemons::ensure(URI) {
        Ok(d) => d,
        Err(why) => {
            vmscope_testkit::skip(&why);
            return;
        }
    };
    // The lab's guest image, copied where libvirt may relabel it.
    let img = common::run_ok(
        Command::new(VMSCOPE)
            .args(["lab", "image", "--format", "json", "--cache-dir"])
            .arg(&env.cache)
            .arg("--agent")
            .arg(&env.agent),
    );
    let img: Value = serde_json::from_slice(&img.stdout).unwrap();
    let dir = tempfile::Builder::new()
        .prefix("lv")
        .tempdir_in(&env.run)
        .unwrap();
    let name = format!("libvirt-t{}", std::process::id());
    let kernel = dir.path().join("vmlinuz");
    let initrd = dir.path().join("initrd.cpio");
    std::fs::copy(img["kernel"].as_str().unwrap(), &kernel).unwrap();
    std::fs::copy(img["initrd"].as_str().unwrap(), &initrd).unwrap();
    let disk = dir.path().join("disk.img");
    std::fs::File::create(&disk)
        .and_then(|f| f.set_len(64 << 20))
        .unwrap();
    std::fs::create_dir_all("/run/vmscope").unwrap();
    let socket = PathBuf::from(format!("/run/vmscope/{name}.sock"));
    let xml = dir.path().join("domain.xml");
    std::fs::write(&xml, domain_xml(&name, &kernel, &initrd, &disk, &socket)).unwrap();
    let out = virsh(&["create", xml.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "virsh create: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _domain = Domain(name.clone());
    let uuid = String::from_utf8(virsh(&["domuuid", &name]).stdout)
        .unwrap()
        .trim()
        .to_string();

    // vms: libvirt's name, UUID and state; the agent's socket path.
    let (vms, _) = vms_json(&[]);
    let vm = vms
        .iter()
        .find(|v| v["name"] == name.as_str())
        .unwrap_or_else(|| panic!("{name} not in {vms:#?}"));
    assert_eq!(vm["libvirt"]["name"], name.as_str(), "{vm}");
    assert_eq!(vm["libvirt"]["uuid"], uuid.as_str(), "{vm}");
    assert_eq!(vm["libvirt"]["state"], "running", "{vm}");
    assert_eq!(vm["agent"]["state"], "socket", "{vm}");
    assert_eq!(vm["agent"]["detail"], socket.to_str().unwrap(), "{vm}");
    let cmdline: Vec<&str> = vm["cmdline"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(
        !cmdline.iter().any(|a| a.contains(socket.to_str().unwrap())),
        "libvirt passed the socket by descriptor, not by path: {cmdline:?}"
    );

    // libvirt unreachable: one line, the VM still listed from /proc.
    let (vms, err) = vms_json(&[(
        "LIBVIRT_DEFAULT_URI",
        "qemu:///system?socket=/nonexistent/libvirt-sock",
    )]);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0]
            .starts_with("vmscope: libvirt (qemu:///system?socket=/nonexistent/libvirt-sock): ")
            && lines[0].contains("VMs are discovered from /proc"),
        "{err}"
    );
    let vm = vms.iter().find(|v| v["name"] == name.as_str()).unwrap();
    assert!(vm.get("libvirt").is_none(), "{vm}");

    // Wait for the agent (the guest boots under TCG).
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let ok = vmscope_broker::connect(&socket, Some(Path::new(VMSCOPE)), Duration::from_secs(5))
            .ok()
            .and_then(|s| vmscope_protocol::AgentClient::connect(s, Duration::from_secs(5)).ok())
            .is_some();
        if ok {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the guest's agent never answered"
        );
        std::thread::sleep(Duration::from_secs(1));
    }

    // A plain `record -a` while the demo runs in the guest.
    guest_exec(
        &socket,
        &[
            "sh",
            "-c",
            "vmscope-agent demo -t 2 -d 14 >/dev/null 2>&1 &",
        ],
        Duration::from_secs(10),
    );
    let db = dir.path().join("rec.db");
    common::run_ok(
        Command::new(VMSCOPE)
            .args(["record", "-a", "-d", "4", "-o"])
            .arg(&db),
    );
    let meta = common::report_json(
        &db,
        &["--by", "domain,symbol", "--domain", &name, "--limit", "200"],
    );
    let dom = meta["domains"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == name.as_str())
        .unwrap_or_else(|| panic!("{name} not in {}", meta["domains"]));
    assert_eq!(dom["role"], "active", "{dom}");
    let rows = common::rows(&meta);
    let count = |sym: &str| -> u64 {
        rows.iter()
            .filter(|(k, _, _)| k.ends_with(sym))
            .map(|(_, n, _)| n)
            .sum()
    };
    let (a, b, g) = (
        count("vmscope_demo_alpha"),
        count("vmscope_demo_beta"),
        count("vmscope_demo_gamma"),
    );
    eprintln!("{name} under record -a: alpha {a}, beta {b}, gamma {g} samples");
    assert!(a > b && b > g && g > 0, "alpha {a}, beta {b}, gamma {g}");

    // stat: the domain's two vCPUs, each its own cell.
    let out = common::run_ok(
        Command::new(VMSCOPE).args(["stat", "-i", "1s", "-n", "3", "--format", "json"]),
    );
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let legend = lines
        .iter()
        .rev()
        .find(|l| l["type"] == "legend")
        .and_then(|l| l["legend"].as_str())
        .expect("a legend");
    let id = legend
        .split_whitespace()
        .find_map(|w| w.strip_suffix(&format!("={name}")))
        .and_then(|d| d.strip_prefix('d'))
        .and_then(|d| d.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("{name} not in legend {legend}"));
    let mut vcpu_labels: Vec<String> = lines
        .iter()
        .filter(|l| l["type"] == "cpu")
        .flat_map(|l| l["cells"].as_array().unwrap().clone())
        .filter(|c| c["domain"].as_u64() == Some(id) && c["kind"]["vcpu"].is_u64())
        .map(|c| c["label"].as_str().unwrap().to_string())
        .collect();
    vcpu_labels.sort();
    vcpu_labels.dedup();
    assert_eq!(
        vcpu_labels,
        [format!("d{id}-0"), format!("d{id}-1")],
        "{legend}"
    );

    // serve: the domain's counters under its libvirt name.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let serve = Reap(
        Command::new(VMSCOPE)
            .args(["serve", "--listen", &addr])
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let want = format!("vmscope_vcpu_run_seconds_total{{domain=\"{name}\",vcpu=\"1\"}}");
    let found = (0..100).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        http_get(&addr, "/metrics").is_some_and(|m| m.contains(&want))
    });
    assert!(found, "serve never showed {want}");
    drop(serve);

    // account: disk requests from QEMU's counters through libvirtd.
    std::thread::sleep(Duration::from_secs(4)); // the demo ends
    guest_exec(
        &socket,
        &[
            "sh",
            "-c",
            "(sleep 2; vmscope-agent dd if=/dev/vda bs=4k count=3000 iflag=direct) >/dev/null 2>&1 &",
        ],
        Duration::from_secs(10),
    );
    let out = common::run_ok(
        Command::new(VMSCOPE).args(["account", "-i", "2s", "-n", "3", "--format", "json"]),
    );
    let mut disk_ops = 0;
    for v in account_rows(&out.stdout, &name) {
        assert_eq!(v["disk_source"], "libvirt", "{v}");
        disk_ops += v["disk_ops"].as_u64().unwrap();
    }
    let stats = String::from_utf8(virsh(&["domstats", "--raw", "--block", &name]).stdout).unwrap();
    eprintln!(
        "{name}: account counted {disk_ops} disk requests from libvirt; libvirt now: {}",
        stats.replace('\n', " ")
    );
    assert!(
        disk_ops >= 3000,
        "{disk_ops} disk requests for 3000 O_DIRECT reads"
    );

    // The agent stopped (SIGSTOP: the guest's init would restart a killed
    // one): a plain `record -a` keeps the domain passive and says why.
    guest_exec(
        &socket,
        &[
            "sh",
            "-c",
            "(sleep 1; killall -STOP vmscope-agent) >/dev/null 2>&1 &",
        ],
        Duration::from_secs(10),
    );
    std::thread::sleep(Duration::from_secs(3));
    let db = dir.path().join("stopped.db");
    let out = common::run_ok(
        Command::new(VMSCOPE)
            .args(["record", "-a", "-d", "2", "-o"])
            .arg(&db),
    );
    let report = common::report_json(&db, &["--by", "domain"]);
    let why = report["meta"][format!("agent_{name}")]
        .as_str()
        .unwrap_or_else(|| panic!("no fallback reason for {name}: {}", report["meta"]))
        .to_string();
    eprintln!("{name} with its agent stopped: {why}");
    assert!(
        why.starts_with("passive: its agent did not answer"),
        "{why}"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(&name),
        "record said nothing about {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Paused by libvirt: `vms` shows libvirt's state, the VM stays listed.
    let out = virsh(&["suspend", &name]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (vms, _) = vms_json(&[]);
    let vm = vms.iter().find(|v| v["name"] == name.as_str()).unwrap();
    assert_eq!(vm["libvirt"]["state"], "paused", "{vm}");
    drop(_domain);

    let libvirtd = daemons
        .started()
        .iter()
        .find(|(n, _)| n == "libvirtd")
        .map(|(_, p)| *p);
    libvirt_lab(&env, dir.path(), libvirtd);
}

/// `lab down` of the test's lab when dropped.
struct LabDown<'a>(&'a common::LabEnv, String);

impl Drop for LabDown<'_> {
    fn drop(&mut self) {
        let _ = lab_cmd(self.0, &["down", &self.1]).output();
    }
}

fn lab_cmd(env: &common::LabEnv, args: &[&str]) -> Command {
    let mut c = Command::new(VMSCOPE);
    c.arg("lab")
        .arg("--run-dir")
        .arg(&env.run)
        .arg("--cache-dir")
        .arg(&env.cache)
        .args(args)
        .env("VMSCOPE_AGENT", &env.agent)
        .stdin(Stdio::null());
    c
}

/// Issue 17 item 3: the lab's VMs as transient libvirt domains.
fn libvirt_lab(env: &common::LabEnv, dir: &Path, libvirtd: Option<u32>) {
    let lab = format!("libvirt-l{}", std::process::id());
    let domain = format!("{lab}-vm0");
    let spec = common::write_spec(
        dir,
        &lab,
        &format!(
            "name = \"{lab}\"\naccel = \"tcg\"\n[[vm]]\nname = \"vm0\"\nvcpus = 1\nmemory_mib = 256\n\
             [[vm.nic]]\nkind = \"user\"\n[[vm.disk]]\nbackend = \"file\"\nsize_mib = 16\n"
        ),
    );
    let spec = spec.to_str().unwrap();
    let _down = LabDown(env, lab.clone());
    let t = Instant::now();
    common::run_ok(&mut lab_cmd(env, &["up", "--libvirt", "-q", spec]));
    eprintln!(
        "lab {lab} up under libvirt in {:.1} s",
        t.elapsed().as_secs_f64()
    );

    let listed = String::from_utf8(virsh(&["list", "--name"]).stdout).unwrap();
    assert!(listed.lines().any(|l| l.trim() == domain), "{listed}");
    let (vms, _) = vms_json(&[]);
    let vm = vms
        .iter()
        .find(|v| v["name"] == domain.as_str())
        .unwrap_or_else(|| panic!("{domain} not in {vms:#?}"));
    assert_eq!(vm["libvirt"]["name"], domain.as_str(), "{vm}");
    assert_eq!(vm["libvirt"]["state"], "running", "{vm}");
    let socket = vmscope_lab::libvirt::agent_socket(&domain);
    assert_eq!(vm["agent"]["detail"], socket.to_str().unwrap(), "{vm}");

    // The agent answers through the lab.
    let out = common::run_ok(&mut lab_cmd(
        env,
        &["exec", "vm0", "--lab", &lab, "--", "cat", "/proc/cmdline"],
    ));
    let cmdline = String::from_utf8_lossy(&out.stdout);
    assert!(cmdline.contains("vmscope_name=vm0"), "{cmdline}");

    // libvirtd stops answering mid-session (SIGSTOP on the libvirtd this
    // test started): `account` says so once and goes on with /proc.
    match libvirtd {
        Some(pid) => libvirtd_stops_mid_account(&domain, pid),
        None => {
            eprintln!("note: libvirtd was not started by this test; not stopping it mid-session");
        }
    }

    // The state says libvirt; a second `up` says the lab is up.
    let out = common::run_ok(&mut lab_cmd(env, &["status", &lab, "--format", "json"]));
    let st: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(st[0]["manager"], "libvirt", "{st}");
    assert_eq!(st[0]["vms"][0]["libvirt"]["name"], domain.as_str(), "{st}");
    assert_eq!(st[0]["vms"][0]["running"], true, "{st}");
    let out = common::run_ok(&mut lab_cmd(env, &["status", &lab]));
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains(&format!("VMs are libvirt domains: {domain} ({URI})")),
        "{table}"
    );
    let out = lab_cmd(env, &["up", "--libvirt", "-q", spec])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains(&format!("lab '{lab}' is already up")), "{err}");

    // Down: no domain (transient: destroyed is undefined), no socket, no files.
    let out = common::run_ok(&mut lab_cmd(env, &["down", &lab]));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains(&format!("removed libvirt domain {domain}")),
        "{said}"
    );
    assert!(
        !virsh(&["dominfo", &domain]).status.success(),
        "{domain} still defined"
    );
    assert!(!socket.exists(), "{} left behind", socket.display());
    assert_eq!(common::leftovers(env, &lab), Vec::<String>::new());
}

/// `account` over a libvirt domain while libvirtd is stopped half-way:
/// QEMU's counters through libvirt first, then one note naming libvirt,
/// then /proc's counts; every interval still lists the domain.
fn libvirtd_stops_mid_account(domain: &str, libvirtd: u32) {
    let child = Command::new(VMSCOPE)
        .args(["account", "-i", "1s", "-n", "5", "--format", "json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    // SAFETY: signals to the libvirtd this test started.
    unsafe { libc::kill(libvirtd as i32, libc::SIGSTOP) };
    let out = child.wait_with_output();
    unsafe { libc::kill(libvirtd as i32, libc::SIGCONT) };
    let out = out.unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut sources = Vec::new();
    let mut notes = Vec::new();
    for v in account_rows(&out.stdout, domain) {
        sources.push(v["disk_source"].as_str().unwrap().to_string());
        notes.extend(
            v["notes"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|n| n.as_str())
                .filter(|n| n.contains("libvirt") || n.contains("virsh"))
                .map(str::to_string),
        );
    }
    eprintln!("{domain}: disk sources with libvirtd stopped half-way: {sources:?}; {notes:?}");
    assert_eq!(sources.len(), 5, "{sources:?}");
    assert_eq!(sources[0], "libvirt", "{sources:?}");
    assert_eq!(sources.last().unwrap(), "proc-io", "{sources:?}");
    assert_eq!(notes.len(), 1, "{notes:?}");
}

fn http_get(addr: &str, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    body.split_once("\r\n\r\n").map(|(_, b)| b.to_string())
}

/// VM `name`'s row of every interval `account --format json` printed.
fn account_rows(stdout: &[u8], name: &str) -> Vec<Value> {
    String::from_utf8_lossy(stdout)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|iv| iv["type"] != "header")
        .map(|iv| {
            iv["vms"]
                .as_array()
                .unwrap()
                .iter()
                .find(|v| v["name"] == name)
                .cloned()
                .unwrap_or_else(|| panic!("{name} not in {iv}"))
        })
        .collect()
}
