//! The session plan: which VMs a recording covers, in which role, and why.
//! Discovery finds every QEMU VM on the host; each VM the user did not name
//! is active where its agent answers and passive elsewhere, and every VM
//! that ends up passive or unmonitored carries the reason (and, where there
//! is one, the fix) into the session and onto stderr. `record`, and any
//! other command that profiles VMs, builds its plan here instead of
//! deciding roles itself.

use crate::agent::{AgentProfiler, ConnectError};
use crate::guest::GuestProfiler;
use crate::EngineError;
use std::time::Duration;
use vmscope_discover::{discover, thread_map, Accel, AgentChannel, DiscoverOptions, Vm};
use vmscope_model::{Domain, Role, ThreadMap};
use vmscope_protocol::ProtocolError;
use vmscope_symbols::Kallsyms;

/// Every VM on this host as record and import need it.
pub struct VmMap {
    /// Threads of each VM, for attribution.
    pub threads: ThreadMap,
    /// VM domains with a detail line for the session.
    pub domains: Vec<(Domain, String)>,
    /// Extra session metadata (VM count, accelerators, discovery problems).
    pub meta: Vec<(String, String)>,
    /// The discovered VMs themselves.
    pub vms: Vec<Vm>,
}

/// Discover the VMs. Problems never stop a recording: they become a note.
pub fn vm_map(opts: &DiscoverOptions) -> VmMap {
    let vms = match discover(opts) {
        Ok(v) => v,
        Err(e) => {
            return VmMap {
                threads: ThreadMap::new(),
                domains: Vec::new(),
                meta: vec![("vm_discovery".into(), format!("failed: {e}"))],
                vms: Vec::new(),
            }
        }
    };
    let threads = thread_map(&vms);
    let mut accels: Vec<String> = Vec::new();
    let domains = vms
        .iter()
        .map(|vm| {
            let accel = vm.accel.as_str().to_string();
            if !accels.contains(&accel) {
                accels.push(accel.clone());
            }
            let detail = format!(
                "{} vCPU thread(s), {} I/O thread(s), accelerator {}{}",
                vm.vcpus.len(),
                vm.io_threads.len(),
                accel,
                if accel == "tcg" {
                    " (guest code is translated: samples in QEMU's [anon] code are the guest's)"
                } else {
                    ""
                }
            );
            (
                Domain {
                    name: vm.name.clone(),
                    role: Role::Passive,
                    pid: Some(vm.pid),
                },
                detail,
            )
        })
        .collect();
    let mut meta = vec![("vms".to_string(), vms.len().to_string())];
    if !accels.is_empty() {
        meta.push(("accel".into(), accels.join(",")));
    }
    VmMap {
        threads,
        domains,
        meta,
        vms,
    }
}

/// What the user asked of the VMs.
#[derive(Default)]
pub struct PlanRequest {
    /// Roles asked for by name (`--vm NAME=ROLE`).
    pub roles: Vec<(String, Role)>,
    /// Guest kernel symbols given as files, per VM.
    pub guest_kallsyms: Vec<(String, Kallsyms)>,
    /// How long an agent has to say hello.
    pub hello_timeout: Duration,
    /// Fail instead of falling back when a VM cannot be active.
    pub strict: bool,
    pub discover: DiscoverOptions,
}

/// One VM's part in the session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmPlan {
    pub name: String,
    pub role: Role,
    /// Why the VM is not active, when it is not.
    pub reason: Option<String>,
    /// The command or change that would make it active, where there is one.
    pub fix: Option<String>,
}

impl VmPlan {
    /// `passive: REASON (fix: FIX)`, the text stored with the session.
    pub fn describe(&self) -> String {
        let mut s = self.role.as_str().to_string();
        match &self.reason {
            Some(r) => s.push_str(&format!(": {r}")),
            None if self.role != Role::Active => s.push_str(" (as asked)"),
            None => {}
        }
        if let Some(f) = &self.fix {
            s.push_str(&format!(" (fix: {f})"));
        }
        s
    }
}

/// The plan of a profiling session.
pub struct SessionPlan {
    pub threads: ThreadMap,
    /// Every VM's domain, with its planned role.
    pub domains: Vec<(Domain, String)>,
    pub meta: Vec<(String, String)>,
    pub vms: Vec<VmPlan>,
    /// Connected agents of the VMs planned active.
    pub guests: Vec<Box<dyn GuestProfiler>>,
    /// Guest kernel symbols per VM (files, or fetched from passive VMs' agents).
    pub guest_kallsyms: Vec<(String, Kallsyms)>,
    /// VMs counted as one line each.
    pub unmonitored: Vec<String>,
}

impl SessionPlan {
    /// The VMs that ended up passive or unmonitored without being asked to
    /// be, with their reasons: what a user should be told.
    pub fn fallbacks(&self) -> impl Iterator<Item = &VmPlan> {
        self.vms.iter().filter(|v| v.reason.is_some())
    }
}

const FIX_NO_CHANNEL: &str = "give the VM the vmscope.agent virtio-serial port (docs/protocol.md §6) and run vmscope-agent in the guest";
const FIX_UNREACHABLE: &str = "give the channel a Unix socket bound to a path (libvirt: <source mode='bind' path='/run/vmscope/NAME.sock'/>, docs/protocol.md §6)";
const FIX_DENIED: &str = "run vmscope as root, or as the user that owns the socket (or give this user write access to it and its directories)";
const FIX_NO_ANSWER: &str =
    "check that vmscope-agent runs in the guest (systemctl status vmscope-agent)";
const FIX_OLD_AGENT: &str =
    "install this vmscope's vmscope-agent in the guest (/usr/lib/vmscope/vmscope-agent)";

/// Decide every VM's role and connect the agents of the active ones.
pub fn plan_session(req: PlanRequest) -> Result<SessionPlan, EngineError> {
    let VmMap {
        threads,
        mut domains,
        mut meta,
        vms,
    } = vm_map(&req.discover);
    for (name, role) in &req.roles {
        if !vms.iter().any(|v| &v.name == name) {
            return Err(EngineError::NoSuchVm {
                name: name.clone(),
                role: role.as_str(),
                found: vms.iter().map(|v| v.name.clone()).collect(),
            });
        }
    }
    let mut guest_kallsyms = req.guest_kallsyms;
    let mut guests: Vec<Box<dyn GuestProfiler>> = Vec::new();
    let mut plans = Vec::new();
    let mut unmonitored = Vec::new();
    for vm in &vms {
        let wanted = req
            .roles
            .iter()
            .rev()
            .find(|(n, _)| n == &vm.name)
            .map(|(_, r)| *r);
        let mut plan = VmPlan {
            name: vm.name.clone(),
            role: Role::Passive,
            reason: None,
            fix: None,
        };
        match wanted {
            Some(Role::Unmonitored) => {
                plan.role = Role::Unmonitored;
                unmonitored.push(vm.name.clone());
            }
            Some(Role::Passive) => {
                // A passive VM's guest-mode samples (KVM) resolve with its own
                // kernel symbols: from its agent when one answers (no sampling).
                if vm.accel == Accel::Kvm && !guest_kallsyms.iter().any(|(n, _)| n == &vm.name) {
                    if let Some(k) = fetch_kallsyms(vm, req.hello_timeout, &mut meta) {
                        guest_kallsyms.push((vm.name.clone(), k));
                    }
                }
            }
            _ => {
                let must = wanted == Some(Role::Active) || req.strict;
                match connect(vm, req.hello_timeout) {
                    Ok(agent) => {
                        plan.role = Role::Active;
                        guests.push(Box::new(agent));
                    }
                    Err((reason, fix)) if must => {
                        return Err(EngineError::NotActive {
                            vm: vm.name.clone(),
                            why: match fix {
                                Some(f) => format!("{reason}; {f}"),
                                None => reason,
                            },
                        })
                    }
                    Err((reason, fix)) => {
                        plan.reason = Some(reason);
                        plan.fix = fix;
                    }
                }
            }
        }
        if let Some(d) = domains.iter_mut().find(|(d, _)| d.name == vm.name) {
            d.0.role = plan.role;
        }
        if plan.role != Role::Active {
            meta.push((format!("agent_{}", vm.name), plan.describe()));
        }
        plans.push(plan);
    }
    Ok(SessionPlan {
        threads,
        domains,
        meta,
        vms: plans,
        guests,
        guest_kallsyms,
        unmonitored,
    })
}

/// Connect to a VM's agent, or say why not (and what would fix it).
fn connect(vm: &Vm, timeout: Duration) -> Result<AgentProfiler, (String, Option<String>)> {
    match &vm.agent {
        AgentChannel::None => Err((
            format!(
                "no '{}' channel on its QEMU command line",
                vmscope_discover::agent_channel::AGENT_PORT
            ),
            Some(FIX_NO_CHANNEL.to_string()),
        )),
        AgentChannel::Unreachable(why) => Err((why.clone(), Some(FIX_UNREACHABLE.into()))),
        AgentChannel::Socket(sock) => {
            AgentProfiler::connect(&vm.name, sock, timeout).map_err(|e| connect_reason(&e, timeout))
        }
    }
}

/// Why connecting failed, in words a user acts on, and the fix.
fn connect_reason(e: &ConnectError, timeout: Duration) -> (String, Option<String>) {
    match e {
        ConnectError::Channel(vmscope_broker::BrokerError::Io { path, source, .. })
            if source.kind() == std::io::ErrorKind::PermissionDenied =>
        {
            (
                format!(
                    "the {} channel exists but permission was denied: {} ({source})",
                    vmscope_discover::agent_channel::AGENT_PORT,
                    path.display()
                ),
                Some(FIX_DENIED.into()),
            )
        }
        ConnectError::Channel(e) => (
            format!("its agent's channel cannot be reached ({e})"),
            Some("check that the VM is running".into()),
        ),
        ConnectError::NoHello {
            source: ProtocolError::VersionMismatch { agent, min, .. },
            ..
        } => (
            format!("its agent speaks protocol {agent}, older than this vmscope's minimum {min}"),
            Some(FIX_OLD_AGENT.into()),
        ),
        ConnectError::NoHello {
            source: ProtocolError::Timeout { .. },
            ..
        } => (
            format!(
                "its agent did not answer within {:.0} s",
                timeout.as_secs_f64()
            ),
            Some(FIX_NO_ANSWER.into()),
        ),
        ConnectError::NoHello { .. } => (
            format!("its agent did not answer ({e})"),
            Some(FIX_NO_ANSWER.into()),
        ),
    }
}

/// Why an agent that said hello did not start profiling, and the fix.
pub fn arm_reason(e: &ProtocolError, timeout: Duration) -> (String, Option<String>) {
    use vmscope_protocol::ErrorKind;
    match e {
        ProtocolError::Remote { kind, message } => match kind {
            ErrorKind::Busy => (
                format!("its agent is busy ({message})"),
                Some("wait for the other profiling sessions of this VM to end, or install this vmscope's agent in the guest (several sessions at once)".into()),
            ),
            ErrorKind::Denied => (
                format!("its agent refused profiling ({message})"),
                Some("run vmscope-agent as root in the guest, or set kernel.perf_event_paranoid = -1 there".into()),
            ),
            ErrorKind::UnsupportedEvent => (
                format!("the guest cannot sample the event ({message})"),
                Some("record with an event the guest has (cpu-clock works everywhere)".into()),
            ),
            ErrorKind::Unsupported => (
                format!("its agent cannot profile ({message})"),
                Some(FIX_OLD_AGENT.into()),
            ),
            _ => (format!("its agent failed to start profiling ({e})"), None),
        },
        ProtocolError::Timeout { .. } => (
            format!(
                "its agent was not ready to profile within {:.0} s",
                timeout.as_secs_f64()
            ),
            Some("raise --barrier-timeout, or check the guest's load".into()),
        ),
        _ => (format!("its agent failed to start profiling ({e})"), None),
    }
}

/// The guest's kallsyms from its agent, if one answers.
fn fetch_kallsyms(
    vm: &Vm,
    timeout: Duration,
    meta: &mut Vec<(String, String)>,
) -> Option<Kallsyms> {
    let sock = vm.agent.socket()?;
    let text = AgentProfiler::connect(&vm.name, sock, timeout)
        .map_err(|e| e.to_string())
        .and_then(|mut a| {
            a.kallsyms(Duration::from_secs(30))
                .map_err(|e| e.to_string())
        });
    match text.map(|t| Kallsyms::parse(&t)) {
        Ok(Ok(k)) => Some(k),
        Ok(Err(e)) => {
            meta.push((
                format!("guest_kallsyms_{}", vm.name),
                format!("its kallsyms do not parse: {e}"),
            ));
            None
        }
        Err(e) => {
            meta.push((
                format!("guest_kallsyms_{}", vm.name),
                format!("no kallsyms from its agent: {e}"),
            ));
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describes_the_role_with_reason_and_fix() {
        let p = VmPlan {
            name: "web".into(),
            role: Role::Passive,
            reason: Some("no 'vmscope.agent' channel on its QEMU command line".into()),
            fix: Some("add it".into()),
        };
        assert_eq!(
            p.describe(),
            "passive: no 'vmscope.agent' channel on its QEMU command line (fix: add it)"
        );
    }

    #[test]
    fn a_denied_channel_says_permission_and_names_the_path() {
        let e = ConnectError::Channel(vmscope_broker::BrokerError::Io {
            what: "cannot connect to",
            path: "/run/vmscope/web.sock".into(),
            source: std::io::Error::from_raw_os_error(libc::EACCES),
        });
        let (why, fix) = connect_reason(&e, Duration::from_secs(3));
        assert!(
            why.starts_with(
                "the vmscope.agent channel exists but permission was denied: /run/vmscope/web.sock ("
            ),
            "{why}"
        );
        assert_eq!(fix.as_deref(), Some(FIX_DENIED));
        // Any other failure to reach the channel keeps its own words.
        let e = ConnectError::Channel(vmscope_broker::BrokerError::Io {
            what: "cannot connect to",
            path: "/run/vmscope/web.sock".into(),
            source: std::io::Error::from_raw_os_error(libc::ENOENT),
        });
        assert!(connect_reason(&e, Duration::from_secs(3))
            .0
            .starts_with("its agent's channel cannot be reached"));
    }

    /// libvirt domains on discovery's fixture tree: a plain `record -a`
    /// plan says of each why it is passive (no agent answers on a fixture
    /// tree), and of the one whose channel cannot be reached, exactly that.
    #[test]
    fn libvirt_channel_reasons_on_the_fixture_tree() {
        let plan = plan_session(PlanRequest {
            discover: DiscoverOptions {
                proc_root: std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("../discover/tests/fixtures/libvirt"),
                query_qmp: false,
                ..DiscoverOptions::default()
            },
            hello_timeout: Duration::from_millis(200),
            ..PlanRequest::default()
        })
        .map_err(|e| e.to_string())
        .unwrap();
        let by = |n: &str| plan.vms.iter().find(|v| v.name == n).unwrap().clone();
        let lost = by("libvirt-lost");
        assert_eq!(lost.role, Role::Passive);
        assert!(lost.describe().starts_with("passive: the vmscope.agent channel exists but cannot be reached: its chardev is QEMU's inherited descriptor 28, socket inode 73028, which is bound to no path in "), "{}", lost.describe());
        assert_eq!(lost.fix.as_deref(), Some(FIX_UNREACHABLE));
        // The resolved path is tried (and is absent on a fixture tree).
        let web = by("libvirt-web");
        assert!(
            web.reason
                .as_deref()
                .unwrap()
                .contains("/run/vmscope/libvirt-web.sock"),
            "{web:?}"
        );
        assert_eq!(plan.fallbacks().count(), 4);
    }

    #[test]
    fn an_unknown_vm_is_named_with_the_ones_that_exist() {
        let dir = tempfile::tempdir().unwrap();
        let e = plan_session(PlanRequest {
            roles: vec![("nosuch".into(), Role::Active)],
            discover: DiscoverOptions {
                proc_root: dir.path().to_path_buf(),
                ..DiscoverOptions::default()
            },
            ..PlanRequest::default()
        })
        .err()
        .unwrap()
        .to_string();
        assert_eq!(
            e,
            "--vm nosuch=active: no VM named 'nosuch' on this host (found: none)"
        );
    }
}
