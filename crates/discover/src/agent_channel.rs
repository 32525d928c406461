//! The agent's channel, in one place: the QEMU arguments that give a VM the
//! `vmscope.agent` virtio-serial port on a Unix socket (what the lab starts
//! VMs with), the libvirt `<channel>` element that does the same for a
//! libvirt domain, and recognizing the port on a QEMU command line written
//! by anyone (key=value or JSON `-device` options; the socket as `path=` or
//! as an inherited `fd=N`, which discovery resolves through `/proc`).
//! The port's name itself belongs to the protocol ([`AGENT_PORT`]).

use crate::cmdline::{Opts, SocketSpec};
use std::path::Path;
pub use vmscope_protocol::AGENT_PORT;

/// QEMU id of the virtio-serial controller the lab adds.
const SERIAL_ID: &str = "vser0";
/// QEMU id of the agent's socket chardev in lab VMs.
const CHARDEV_ID: &str = "agent0";

/// QEMU arguments for the agent channel on the Unix socket `socket` (QEMU
/// listens; the host's tools connect).
pub fn qemu_args(socket: &Path) -> Vec<String> {
    vec![
        "-device".into(),
        format!("virtio-serial-pci,id={SERIAL_ID}"),
        "-chardev".into(),
        format!(
            "socket,id={CHARDEV_ID},path={},server=on,wait=off",
            socket.display()
        ),
        "-device".into(),
        format!("virtserialport,bus={SERIAL_ID}.0,chardev={CHARDEV_ID},name={AGENT_PORT}"),
    ]
}

/// The `<channel>` element a libvirt domain needs for the same port (put it
/// inside `<devices>`): libvirt binds the socket at `socket`.
pub fn libvirt_xml(socket: &Path) -> String {
    format!(
        "<channel type='unix'>\n  <source mode='bind' path='{}'/>\n  <target type='virtio' name='{AGENT_PORT}'/>\n</channel>\n",
        socket.display()
    )
}

/// The chardev id of a `-device` option when it is the agent's port
/// (`virtserialport` named [`AGENT_PORT`]), in either option syntax.
pub(crate) fn chardev_of_port(dev: &Opts) -> Option<String> {
    (dev.get("driver").as_deref() == Some("virtserialport")
        && dev.get("name").as_deref() == Some(AGENT_PORT))
    .then(|| dev.get("chardev"))
    .flatten()
}

/// Where a `socket` chardev listens: `path=` / `fd=` (QEMU's key=value
/// and flat JSON forms), or a nested `addr` object as QMP's
/// `chardev-add` writes it (`{"type":"unix","path":…}` or
/// `{"type":"fd","str":"N"}`, with or without a `data` wrapper), which
/// JSON option values may carry where QEMU accepts them.
pub(crate) fn chardev_socket(o: &Opts) -> Option<SocketSpec> {
    if let Some(p) = o.get("path") {
        return Some(SocketSpec::Path(p.into()));
    }
    if let Some(fd) = o.get("fd").and_then(|f| f.parse().ok()) {
        return Some(SocketSpec::Fd(fd));
    }
    let Opts::Json(m) = o else { return None };
    let addr = m.get("addr")?.as_object()?;
    let inner = addr.get("data").and_then(|d| d.as_object()).unwrap_or(addr);
    let s = |k: &str| inner.get(k).and_then(|v| v.as_str());
    match addr.get("type").and_then(|t| t.as_str()) {
        Some("unix") => s("path").map(|p| SocketSpec::Path(p.into())),
        Some("fd") => s("str").and_then(|f| f.parse().ok()).map(SocketSpec::Fd),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmdline::QemuCmdline;

    fn parse(args: &[&str]) -> QemuCmdline {
        let argv: Vec<String> = std::iter::once("qemu-system-x86_64")
            .chain(args.iter().copied())
            .map(str::to_string)
            .collect();
        QemuCmdline::parse(&argv)
    }

    #[test]
    fn the_lab_arguments_parse_back() {
        let args = qemu_args(Path::new("/run/vmscope/labs/x/vm0/agent.sock"));
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        assert_eq!(
            parse(&refs).agent,
            Some(Ok(SocketSpec::Path(
                "/run/vmscope/labs/x/vm0/agent.sock".into()
            )))
        );
    }

    #[test]
    fn libvirt_json_devices_and_inherited_fds() {
        let c = parse(&[
            "-chardev",
            "socket,id=charchannel0,fd=28,server=on,wait=off",
            "-device",
            r#"{"driver":"virtserialport","bus":"virtio-serial0.0","nr":1,"chardev":"charchannel0","id":"channel0","name":"vmscope.agent"}"#,
        ]);
        assert_eq!(c.agent, Some(Ok(SocketSpec::Fd(28))));
        let c = parse(&[
            "-chardev",
            r#"{"backend":"socket","id":"c1","path":"/run/a.sock","server":true}"#,
            "-device",
            "virtserialport,chardev=c1,name=vmscope.agent",
        ]);
        assert!(c.agent.is_some());
    }

    #[test]
    fn the_issue_s_libvirt_command_line_and_nested_json_addresses() {
        // As libvirt 9 writes it for `<channel type='unix'><source mode='bind' .../>`.
        let c = parse(&[
            "-device",
            r#"{"driver":"virtio-serial-pci","id":"virtio-serial0","bus":"pci.2","addr":"0x0"}"#,
            "-chardev",
            "socket,id=charchannel0,fd=28,server=on,wait=off",
            "-device",
            r#"{"driver":"virtserialport","bus":"virtio-serial0.0","nr":1,"chardev":"charchannel0","id":"channel0","name":"vmscope.agent"}"#,
        ]);
        assert_eq!(c.agent, Some(Ok(SocketSpec::Fd(28))));
        let c = parse(&[
            "-chardev",
            r#"{"id":"c2","backend":"socket","addr":{"type":"unix","data":{"path":"/run/n.sock"}},"server":true}"#,
            "-device",
            "virtserialport,chardev=c2,name=vmscope.agent",
        ]);
        assert_eq!(c.agent, Some(Ok(SocketSpec::Path("/run/n.sock".into()))));
        let c = parse(&[
            "-chardev",
            r#"{"id":"c3","type":"socket","addr":{"type":"fd","str":"41"}}"#,
            "-device",
            r#"{"driver":"virtserialport","chardev":"c3","name":"vmscope.agent"}"#,
        ]);
        assert_eq!(c.agent, Some(Ok(SocketSpec::Fd(41))));
        // key=value with `,,` in the path.
        let c = parse(&[
            "-chardev",
            "socket,id=c4,path=/run/a,,b.sock,server=on,wait=off",
            "-device",
            "virtserialport,chardev=c4,name=vmscope.agent",
        ]);
        assert_eq!(c.agent, Some(Ok(SocketSpec::Path("/run/a,b.sock".into()))));
    }

    #[test]
    fn other_ports_and_odd_chardevs() {
        let c = parse(&[
            "-chardev",
            "socket,id=c,path=/x",
            "-device",
            "virtserialport,chardev=c,name=org.qemu.guest_agent.0",
        ]);
        assert_eq!(c.agent, None);
        let c = parse(&[
            "-chardev",
            "pty,id=c",
            "-device",
            "virtserialport,chardev=c,name=vmscope.agent",
        ]);
        let why = c.agent.unwrap().unwrap_err();
        assert!(why.contains("'pty'"), "{why}");
        let c = parse(&["-device", "virtserialport,chardev=gone,name=vmscope.agent"]);
        assert!(c
            .agent
            .unwrap()
            .unwrap_err()
            .contains("not on the command line"));
    }

    #[test]
    fn libvirt_xml_names_the_port_and_socket() {
        let x = libvirt_xml(Path::new("/run/vmscope/web.sock"));
        assert!(x.contains("name='vmscope.agent'") && x.contains("path='/run/vmscope/web.sock'"));
    }
}
