//! libvirt as an optional source: a domain's name, UUID and state, and the
//! counters QEMU keeps (block requests and bytes, interface packets and
//! bytes, vCPU times) read through libvirt when libvirtd holds the VM's QMP
//! monitor (QEMU serves one client per monitor socket, so vmscope cannot
//! ask QEMU itself).
//!
//! The interface is `virsh`, libvirt's documented command-line client:
//! `virsh domstats --raw` prints the same typed parameters as
//! `virConnectGetAllDomainStats` (libvirt's bulk statistics API) as
//! `key=value` lines, and `virsh domuuid` / `domstate` are stable
//! commands. The alternative, the `virt` crate (the libvirt project's Rust
//! bindings), links libvirt.so at build time: a vmscope built with it
//! would need libvirt-dev to build and libvirt0 to start, also on hosts
//! that have no libvirt. Running `virsh` keeps libvirt a run-time option:
//! absent, it is one line on stderr and every VM is still discovered from
//! `/proc`. Its cost is one process per query (a few ms), paid once per
//! interval by `account`, not per sample.
//!
//! The connection URI is `$LIBVIRT_DEFAULT_URI` when set (virsh's own
//! rule), else `qemu:///system`.

use crate::{DiscoverError, Vm};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A VM as libvirt knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LibvirtDomain {
    /// libvirt's domain name.
    pub name: String,
    pub uuid: String,
    /// `running`, `paused`, `shut off`, … (`virsh domstate`'s words).
    pub state: String,
    /// The connection it was found on.
    pub uri: String,
}

/// QEMU's counters of one domain, as libvirt reads them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DomainStats {
    /// `state.state`, in [`state_name`]'s words.
    pub state: String,
    /// Per disk target (`vda`): (requests: reads + writes + flushes, bytes).
    pub block: Vec<(String, u64, u64)>,
    /// Per interface (`vnet0`): (packets rx + tx, bytes rx + tx).
    pub net: Vec<(String, u64, u64)>,
    /// Per vCPU index: run time in ns.
    pub vcpu_ns: Vec<(u32, u64)>,
}

/// A libvirt connection through `virsh`.
#[derive(Debug, Clone)]
pub struct Libvirt {
    pub uri: String,
    pub timeout: Duration,
    program: String,
}

impl Libvirt {
    /// The connection virsh would use, with `timeout` on every call.
    pub fn from_env(timeout: Duration) -> Libvirt {
        let uri = std::env::var("LIBVIRT_DEFAULT_URI")
            .ok()
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| "qemu:///system".into());
        Libvirt::new(&uri, timeout)
    }

    pub fn new(uri: &str, timeout: Duration) -> Libvirt {
        Libvirt {
            uri: uri.into(),
            timeout,
            program: "virsh".into(),
        }
    }

    /// Use another client binary (tests).
    pub fn with_program(mut self, program: &str) -> Libvirt {
        self.program = program.into();
        self
    }

    /// Every domain on the connection, active or not; fails with one line
    /// when libvirt is not installed, libvirtd is not running or refuses.
    pub fn domains(&self) -> Result<Vec<LibvirtDomain>, DiscoverError> {
        let states = parse_domstats(&self.virsh(&["domstats", "--raw", "--state"])?);
        if states.is_empty() {
            return Ok(Vec::new());
        }
        // One virsh process for every UUID: `domuuid 'a'; domuuid 'b'`.
        let script: Vec<String> = states
            .keys()
            .map(|n| format!("domuuid {}", quote(n)))
            .collect();
        let uuids = self.virsh(&[&script.join("; ")])?;
        let uuids: Vec<&str> = uuids.lines().filter(|l| !l.trim().is_empty()).collect();
        Ok(states
            .into_iter()
            .zip(uuids)
            .map(|((name, kv), uuid)| LibvirtDomain {
                state: state_name(kv.get("state.state").map_or("", String::as_str)).into(),
                name,
                uuid: uuid.trim().into(),
                uri: self.uri.clone(),
            })
            .collect())
    }

    /// QEMU's counters of the domain `name`.
    pub fn stats(&self, name: &str) -> Result<DomainStats, DiscoverError> {
        let out = self.virsh(&[
            "domstats",
            "--raw",
            "--state",
            "--vcpu",
            "--block",
            "--interface",
            name,
        ])?;
        let mut all = parse_domstats(&out);
        let kv = all.remove(name).ok_or_else(|| DiscoverError::Libvirt {
            uri: self.uri.clone(),
            message: format!("domstats printed nothing for domain '{name}'"),
        })?;
        Ok(stats_of(&kv))
    }

    /// Run `virsh -c URI -q ARGS` within the timeout; its stdout, or its
    /// first error line.
    fn virsh(&self, args: &[&str]) -> Result<String, DiscoverError> {
        let err = |message: String| DiscoverError::Libvirt {
            uri: self.uri.clone(),
            message,
        };
        let mut child = Command::new(&self.program)
            .args(["-c", &self.uri, "-q"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => err(format!(
                    "{} is not installed (apt-get install libvirt-clients)",
                    self.program
                )),
                _ => err(format!("cannot run {}: {e}", self.program)),
            })?;
        // Readers in threads: a full pipe must not stall the child.
        let mut so = child.stdout.take().expect("piped");
        let mut se = child.stderr.take().expect("piped");
        let out = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = so.read_to_string(&mut s);
            s
        });
        let errt = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = se.read_to_string(&mut s);
            s
        });
        let start = Instant::now();
        let status = loop {
            match child.try_wait() {
                Ok(Some(s)) => break s,
                Ok(None) if start.elapsed() < self.timeout => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Ok(None) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(err(format!(
                        "{} {} did not answer within {:.1} s",
                        self.program,
                        args.first().unwrap_or(&""),
                        self.timeout.as_secs_f64()
                    )));
                }
                Err(e) => return Err(err(format!("waiting for {}: {e}", self.program))),
            }
        };
        let stdout = out.join().unwrap_or_default();
        let stderr = errt.join().unwrap_or_default();
        if status.success() {
            Ok(stdout)
        } else {
            Err(err(first_error(&stderr).unwrap_or_else(|| {
                format!("{} exited with {status}", self.program)
            })))
        }
    }
}

/// Fill each VM's [`Vm::libvirt`] from `domains` (of one connection or
/// several): by UUID (libvirt passes `-uuid`), else by name when exactly
/// one domain has it. Two VMs never take the same domain's record, and a
/// VM never takes another connection's domain of the same name. Returns
/// how many VMs matched.
pub fn annotate(vms: &mut [Vm], domains: &[LibvirtDomain]) -> usize {
    let mut n = 0;
    for vm in vms.iter_mut() {
        let by_uuid = vm
            .uuid
            .as_deref()
            .and_then(|u| domains.iter().find(|d| d.uuid.eq_ignore_ascii_case(u)));
        let hit = by_uuid.or_else(|| {
            let base = vm.name.split('@').next().unwrap_or(&vm.name);
            // A name alone only when no UUID contradicts it, and only when
            // one domain has it: two connections (qemu:///system and a
            // user's qemu:///session) may each have a domain of that name.
            let mut named = domains.iter().filter(|d| d.name == base);
            match (named.next(), named.next()) {
                (Some(d), None) if vm.uuid.is_none() => Some(d),
                _ => None,
            }
        });
        if let Some(d) = hit {
            vm.libvirt = Some(d.clone());
            n += 1;
        }
    }
    n
}

/// Ask libvirt (the URI of [`Libvirt::from_env`]) which domains `vms` are
/// and fill [`Vm::libvirt`]. Returns the one line a user should read when
/// libvirt could not be asked and that matters: libvirt is installed but
/// not answering, or a VM looks libvirt-managed. A host without libvirt
/// and without libvirt's VMs hears nothing.
pub fn annotate_from_env(vms: &mut [Vm], timeout: Duration) -> Option<String> {
    let lv = Libvirt::from_env(timeout);
    match lv.domains() {
        Ok(domains) => {
            annotate(vms, &domains);
            None
        }
        Err(e) => {
            let absent = matches!(&e, DiscoverError::Libvirt { message, .. } if message.contains("is not installed"));
            (!absent || vms.iter().any(looks_libvirt_managed)).then(|| {
                format!("{e}; VMs are discovered from /proc without libvirt's names, states and counters")
            })
        }
    }
}

/// True when the VM's command line shows libvirt started it (its monitor
/// or master key lives in libvirt's directories).
pub fn looks_libvirt_managed(vm: &Vm) -> bool {
    vm.cmdline
        .iter()
        .any(|a| a.contains("/libvirt/qemu/") || a.contains("\"id\":\"masterKey0\""))
}

/// `virsh domstats --raw` output → per domain, key → value.
pub fn parse_domstats(s: &str) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut out: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let mut cur: Option<String> = None;
    for line in s.lines() {
        if let Some(rest) = line.strip_prefix("Domain: ") {
            let name = rest.trim().trim_matches('\'').to_string();
            out.entry(name.clone()).or_default();
            cur = Some(name);
        } else if let (Some(name), Some((k, v))) = (&cur, line.trim().split_once('=')) {
            out.get_mut(name)
                .expect("entry made above")
                .insert(k.to_string(), v.to_string());
        }
    }
    out
}

/// The counters of one domain's `key=value` map.
pub fn stats_of(kv: &BTreeMap<String, String>) -> DomainStats {
    let n = |k: &str| kv.get(k).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    let count = |k: &str| n(&format!("{k}.count"));
    let mut st = DomainStats {
        state: state_name(kv.get("state.state").map_or("", String::as_str)).into(),
        ..DomainStats::default()
    };
    for i in 0..count("block") {
        let p = format!("block.{i}");
        let name = kv
            .get(&format!("{p}.name"))
            .cloned()
            .unwrap_or_else(|| format!("#{i}"));
        st.block.push((
            name,
            n(&format!("{p}.rd.reqs")) + n(&format!("{p}.wr.reqs")) + n(&format!("{p}.fl.reqs")),
            n(&format!("{p}.rd.bytes")) + n(&format!("{p}.wr.bytes")),
        ));
    }
    for i in 0..count("net") {
        let p = format!("net.{i}");
        let name = kv
            .get(&format!("{p}.name"))
            .cloned()
            .unwrap_or_else(|| format!("#{i}"));
        st.net.push((
            name,
            n(&format!("{p}.rx.pkts")) + n(&format!("{p}.tx.pkts")),
            n(&format!("{p}.rx.bytes")) + n(&format!("{p}.tx.bytes")),
        ));
    }
    for i in 0..n("vcpu.maximum").max(n("vcpu.current")) {
        if let Some(t) = kv.get(&format!("vcpu.{i}.time")) {
            if let (Ok(t), Ok(i)) = (t.parse(), u32::try_from(i)) {
                st.vcpu_ns.push((i, t));
            }
        }
    }
    st
}

/// `virDomainState` numbers in `virsh domstate`'s words.
pub fn state_name(n: &str) -> &'static str {
    match n {
        "0" => "no state",
        "1" => "running",
        "2" => "blocked",
        "3" => "paused",
        "4" => "shutdown",
        "5" => "shut off",
        "6" => "crashed",
        "7" => "pmsuspended",
        _ => "unknown",
    }
}

/// The first `error: …` line virsh printed, without the prefix, joined
/// with the next one (virsh says what failed, then why).
fn first_error(stderr: &str) -> Option<String> {
    let lines: Vec<&str> = stderr
        .lines()
        .map(|l| l.trim().trim_start_matches("error: ").trim())
        .filter(|l| !l.is_empty())
        .collect();
    match lines.as_slice() {
        [] => None,
        [one] => Some((*one).to_string()),
        [a, b, ..] => Some(format!("{a}: {b}")),
    }
}

/// A name as one virsh shell word.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOMSTATS: &str = "Domain: 'libvirt-a'
  state.state=1
  state.reason=1
  vcpu.current=2
  vcpu.maximum=2
  vcpu.0.state=1
  vcpu.0.time=1500000000
  vcpu.0.wait=0
  vcpu.1.state=1
  vcpu.1.time=700000000
  net.count=1
  net.0.name=vnet3
  net.0.rx.bytes=1000
  net.0.rx.pkts=10
  net.0.tx.bytes=500
  net.0.tx.pkts=5
  block.count=2
  block.0.name=vda
  block.0.rd.reqs=120
  block.0.rd.bytes=491520
  block.0.wr.reqs=30
  block.0.wr.bytes=122880
  block.0.fl.reqs=2
  block.1.name=hdc
  block.1.rd.reqs=0

Domain: 'libvirt-b'
  state.state=3
  state.reason=1

";

    #[test]
    fn domstats_raw_parses_into_counters() {
        let all = parse_domstats(DOMSTATS);
        assert_eq!(all.len(), 2);
        let a = stats_of(&all["libvirt-a"]);
        assert_eq!(a.state, "running");
        assert_eq!(
            a.block,
            [("vda".to_string(), 152, 614400), ("hdc".to_string(), 0, 0)]
        );
        assert_eq!(a.net, [("vnet3".to_string(), 15, 1500)]);
        assert_eq!(a.vcpu_ns, [(0, 1_500_000_000), (1, 700_000_000)]);
        let b = stats_of(&all["libvirt-b"]);
        assert_eq!((b.state.as_str(), b.block.len()), ("paused", 0));
    }

    #[test]
    fn virsh_errors_are_one_line() {
        let e = "error: failed to connect to the hypervisor\nerror: Failed to connect socket to '/var/run/libvirt/libvirt-sock': No such file or directory\n";
        assert_eq!(
            first_error(e).unwrap(),
            "failed to connect to the hypervisor: Failed to connect socket to '/var/run/libvirt/libvirt-sock': No such file or directory"
        );
        assert_eq!(quote("a'b"), "'a'\\''b'");
    }

    fn vm(name: &str, pid: u32, uuid: Option<&str>) -> Vm {
        Vm {
            name: name.into(),
            pid,
            uuid: uuid.map(str::to_string),
            exe: None,
            accel: crate::Accel::Unknown,
            vcpus: Vec::new(),
            io_threads: Vec::new(),
            vhost: Vec::new(),
            disks: Vec::new(),
            taps: Vec::new(),
            qmp: None,
            qmp_used: false,
            agent: crate::AgentChannel::None,
            libvirt: None,
            cmdline: Vec::new(),
            warnings: Vec::new(),
        }
    }

    fn domain(name: &str, uuid: &str, uri: &str) -> LibvirtDomain {
        LibvirtDomain {
            name: name.into(),
            uuid: uuid.into(),
            state: "running".into(),
            uri: uri.into(),
        }
    }

    /// Two domains named `web`, one on qemu:///system and one on a user's
    /// qemu:///session: discovery lists two VMs (`web@PID`), each gets its
    /// own connection's record by UUID; none is merged or swapped.
    #[test]
    fn same_name_on_two_connections_stays_two() {
        const A: &str = "1b4e28ba-2fa1-11d2-883f-0016d3cca427";
        const B: &str = "6fa459ea-ee8a-3ca4-894e-db77e160355e";
        let domains = [
            domain("web", A, "qemu:///system"),
            domain("web", B, "qemu:///session"),
        ];
        let mut vms = vec![vm("web@200", 200, Some(B)), vm("web@100", 100, Some(A))];
        assert_eq!(annotate(&mut vms, &domains), 2);
        let lv = |i: usize| vms[i].libvirt.clone().unwrap();
        assert_eq!(
            (lv(0).uri.as_str(), lv(0).uuid.as_str()),
            ("qemu:///session", B)
        );
        assert_eq!(
            (lv(1).uri.as_str(), lv(1).uuid.as_str()),
            ("qemu:///system", A)
        );
        assert_ne!(vms[0].name, vms[1].name);

        // Only one connection asked (the other's daemon is down): the
        // session's VM keeps no record rather than the system's.
        let mut vms = vec![vm("web@200", 200, Some(B)), vm("web@100", 100, Some(A))];
        assert_eq!(annotate(&mut vms, &domains[..1]), 1);
        assert!(vms[0].libvirt.is_none(), "{:?}", vms[0].libvirt);
        assert_eq!(vms[1].libvirt.as_ref().unwrap().uuid, A);

        // No UUID on the command line and the name on both connections:
        // ambiguous, so neither record is taken.
        let mut vms = vec![vm("web", 300, None)];
        assert_eq!(annotate(&mut vms, &domains), 0);
        // The name on one connection only: taken.
        assert_eq!(annotate(&mut vms, &domains[1..]), 1);
        assert_eq!(vms[0].libvirt.as_ref().unwrap().uri, "qemu:///session");
    }

    #[test]
    fn a_missing_client_says_what_to_install() {
        let e = Libvirt::new("qemu:///system", Duration::from_secs(1))
            .with_program("/nonexistent/virsh")
            .domains()
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "libvirt (qemu:///system): /nonexistent/virsh is not installed (apt-get install libvirt-clients)"
        );
    }
}
