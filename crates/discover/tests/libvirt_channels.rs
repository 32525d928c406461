//! The agent channel of libvirt domains on the fixture tree `libvirt`
//! (tests/fixtures/generate.py): libvirt's own command line, the socket
//! passed as an inherited descriptor and the port declared in JSON. The
//! path is found through QEMU's `net/unix`, through the root's `net/unix`
//! when QEMU's cannot be read, and a channel that exists but cannot be
//! reached says which step failed.

use std::path::Path;
use std::time::Duration;
use vmscope_discover::{discover, AgentChannel, DiscoverOptions, Vm};

fn vms() -> Vec<Vm> {
    discover(&DiscoverOptions {
        proc_root: Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/libvirt"),
        query_qmp: false,
        qmp_timeout: Duration::from_millis(100),
    })
    .expect("discover")
}

fn vm(name: &str) -> Vm {
    let all = vms();
    all.iter()
        .find(|v| v.name == name)
        .cloned()
        .unwrap_or_else(|| {
            panic!(
                "no {name} in {:?}",
                all.iter().map(|v| &v.name).collect::<Vec<_>>()
            )
        })
}

#[test]
fn every_libvirt_domain_is_found_with_its_vcpus() {
    let names: Vec<String> = vms().into_iter().map(|v| v.name).collect();
    assert_eq!(
        names,
        ["libvirt-web", "libvirt-db", "libvirt-lost", "libvirt-file"]
    );
    let v = vm("libvirt-web");
    assert_eq!(v.vcpus.len(), 2);
    assert_eq!(
        v.uuid.as_deref(),
        Some("0d9a6b7e-3c1f-4e2a-9b8d-7f6e5d4c3b21")
    );
}

#[test]
fn inherited_fd_resolves_through_qemus_unix_table() {
    let v = vm("libvirt-web");
    assert_eq!(
        v.agent,
        AgentChannel::Socket("/run/vmscope/libvirt-web.sock".into())
    );
    assert_eq!(
        v.qmp.as_deref(),
        Some(Path::new(
            "/var/lib/libvirt/qemu/domain-3-libvirt-web/monitor.sock"
        ))
    );
    assert!(v.warnings.is_empty(), "{:?}", v.warnings);
}

#[test]
fn inherited_fd_resolves_through_the_hosts_unix_table() {
    let v = vm("libvirt-db");
    assert_eq!(
        v.agent,
        AgentChannel::Socket("/run/vmscope/libvirt-db.sock".into())
    );
    assert_eq!(
        v.qmp.as_deref(),
        Some(Path::new(
            "/var/lib/libvirt/qemu/domain-4-libvirt-db/monitor.sock"
        ))
    );
}

#[test]
fn an_unnamed_socket_is_a_channel_that_cannot_be_reached() {
    let v = vm("libvirt-lost");
    let AgentChannel::Unreachable(why) = &v.agent else {
        panic!("{:?}", v.agent)
    };
    assert!(
        why.starts_with("the vmscope.agent channel exists but cannot be reached: its chardev is QEMU's inherited descriptor 28, socket inode 73028, which is bound to no path in "),
        "{why}"
    );
    assert!(
        why.contains("8300/net/unix") && why.contains("unnamed or abstract"),
        "{why}"
    );
    // The monitor of the same VM still resolves.
    assert!(v.qmp.is_some());
}

#[test]
fn a_descriptor_that_is_not_a_socket_is_named() {
    let v = vm("libvirt-file");
    let AgentChannel::Unreachable(why) = &v.agent else {
        panic!("{:?}", v.agent)
    };
    assert!(
        why.contains("descriptor 28, which is not a socket")
            && why.contains("/var/log/libvirt/qemu/libvirt-file.log"),
        "{why}"
    );
    // Its monitor descriptor is absent: a warning, not a failure.
    assert!(v.qmp.is_none());
    assert!(
        v.warnings
            .iter()
            .any(|w| w.starts_with("QMP monitor on inherited descriptor 27, which cannot be read")),
        "{:?}",
        v.warnings
    );
}
