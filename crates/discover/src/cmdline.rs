//! The QEMU command line: which options take an argument, QEMU's
//! `key=value` option syntax (implied first key, `,,` for a literal comma,
//! bare `flag` and `noflag`), libvirt's JSON option values, and what they say
//! about a VM: name, uuid, accelerator, disks (`-drive`, `-blockdev` in both
//! forms, `-hda`.., bare image), tap NICs (`-netdev`/`-net`/`-nic`), I/O
//! threads (`-object iothread`) and the QMP monitor (`-qmp`, or `-chardev` +
//! `-mon mode=control`).
//!
//! Pure: no file is read here. Relative paths stay relative; the caller
//! resolves them against the process's working directory.

use crate::vm::{Accel, Disk, DiskSource};
use serde_json::{Map, Value};
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

/// What the command line says about a VM.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QemuCmdline {
    /// `-name NAME` / `-name guest=NAME,...`.
    pub name: Option<String>,
    /// `-name ...,debug-threads=on`: QEMU names its threads (`CPU n/KVM`).
    pub debug_threads: bool,
    /// `-uuid`.
    pub uuid: Option<String>,
    /// Accelerators asked for, in order of preference (`-accel` options,
    /// `-enable-kvm`, `-machine accel=kvm:tcg`).
    pub accels: Vec<String>,
    pub disks: Vec<Disk>,
    pub taps: Vec<TapSpec>,
    /// Ids of `-object iothread` objects.
    pub iothreads: Vec<String>,
    /// The first QMP monitor on a Unix socket.
    pub monitor: Option<SocketSpec>,
    /// The agent's channel ([`crate::agent_channel`]): `Some(Ok)` for a
    /// socket chardev, `Some(Err(why))` when the port is declared on a
    /// chardev that is not a Unix socket (or not declared at all).
    pub agent: Option<Result<SocketSpec, String>>,
}

/// A tap NIC backend: `-netdev tap,...` or `-netdev bridge,...` (whose tap
/// the bridge helper creates and passes as a descriptor).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TapSpec {
    pub id: Option<String>,
    /// `ifname=` (may be a pattern like `tap%d`, which the kernel fills in).
    pub ifname: Option<String>,
    /// `fd=N` or `fds=N:M:...`: tap descriptors QEMU inherited.
    pub fds: Vec<u32>,
}

/// Where a socket chardev (the QMP monitor, the agent's channel) listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SocketSpec {
    /// A Unix socket path (possibly relative to QEMU's working directory).
    Path(PathBuf),
    /// A listening socket QEMU inherited as this descriptor (libvirt passes
    /// `-chardev socket,id=charmonitor,fd=N,server=on`).
    Fd(u32),
}

/// Options that take no argument. Every other option takes exactly one.
const NO_ARG: &[&str] = &[
    "S",
    "s",
    "nographic",
    "enable-kvm",
    "no-kvm",
    "no-user-config",
    "nodefaults",
    "nodefconfig",
    "no-reboot",
    "no-shutdown",
    "daemonize",
    "snapshot",
    "no-hpet",
    "no-acpi",
    "full-screen",
    "no-fd-bootchk",
    "no-frame",
    "alt-grab",
    "ctrl-grab",
    "no-quit",
    "only-migratable",
    "preconfig",
    "curses",
    "portrait",
    "win2k-hack",
    "rtc-td-hack",
    "no-kvm-irqchip",
    "no-kvm-pit",
    "no-kvm-pit-reinjection",
    "usb",
    "enable-fips",
    "xen-attach",
    "version",
    "help",
    "h",
    "semihosting",
    "enable-sync-profile",
    "old-param",
    "singlestep",
    "no-graphic",
];

impl QemuCmdline {
    /// Parse `argv` (including `argv[0]`).
    pub fn parse(argv: &[String]) -> QemuCmdline {
        let mut c = QemuCmdline::default();
        let mut blockdevs: Vec<Map<String, Value>> = Vec::new();
        let mut chardevs: HashMap<String, SocketSpec> = HashMap::new();
        let mut control_mons: Vec<String> = Vec::new();
        let mut agent_chardev: Option<String> = None;
        let mut other_chardevs: HashMap<String, String> = HashMap::new();
        let mut qmp: Option<SocketSpec> = None;
        let mut i = 1;
        while i < argv.len() {
            let arg = &argv[i];
            i += 1;
            let Some(opt) = arg.strip_prefix('-').filter(|o| !o.is_empty()) else {
                // A bare argument is a disk image (`qemu-system-x86_64 disk.img`).
                c.disks.push(simple_disk(arg, false));
                continue;
            };
            let opt = opt.strip_prefix('-').unwrap_or(opt);
            if NO_ARG.contains(&opt) {
                match opt {
                    "enable-kvm" => c.accels.push("kvm".into()),
                    "no-kvm" => c.accels.push("tcg".into()),
                    _ => {}
                }
                continue;
            }
            let Some(val) = argv.get(i) else { break };
            i += 1;
            match opt {
                "name" => {
                    let o = Opts::parse(val, "guest");
                    c.name = o.get("guest").filter(|n| !n.is_empty());
                    c.debug_threads = o.flag("debug-threads");
                }
                "uuid" => c.uuid = Some(val.clone()),
                "accel" => {
                    if let Some(a) = Opts::parse(val, "accel").get("accel") {
                        c.accels.extend(a.split(':').map(str::to_string));
                    }
                }
                "machine" | "M" => {
                    if let Some(a) = Opts::parse(val, "type").get("accel") {
                        c.accels.extend(a.split(':').map(str::to_string));
                    }
                }
                "drive" => {
                    if let Some(d) = drive_disk(&Opts::parse(val, "")) {
                        c.disks.push(d);
                    }
                }
                "blockdev" => blockdevs.push(Opts::parse(val, "").to_json()),
                "hda" | "hdb" | "hdc" | "hdd" => c.disks.push(simple_disk(val, false)),
                "cdrom" => c.disks.push(simple_disk(val, true)),
                "netdev" | "net" | "nic" => {
                    if let Some(t) = tap_spec(&Opts::parse(val, "type")) {
                        c.taps.push(t);
                    }
                }
                "object" => {
                    let o = Opts::parse(val, "qom-type");
                    if o.get("qom-type").as_deref() == Some("iothread") {
                        if let Some(id) = o.get("id") {
                            c.iothreads.push(id);
                        }
                    }
                }
                "qmp" | "qmp-pretty" if qmp.is_none() => qmp = legacy_chardev_unix(val),
                "chardev" => {
                    let o = Opts::parse(val, "backend");
                    let backend = o.get("backend").or_else(|| o.get("type"));
                    let backend = backend.unwrap_or_default();
                    if let (Some(id), "socket") = (o.get("id"), backend.as_str()) {
                        if let Some(s) = crate::agent_channel::chardev_socket(&o) {
                            chardevs.insert(id, s);
                        }
                    } else if let Some(id) = o.get("id") {
                        other_chardevs.insert(id, backend);
                    }
                }
                "device" => {
                    if let Some(ch) =
                        crate::agent_channel::chardev_of_port(&Opts::parse(val, "driver"))
                    {
                        agent_chardev.get_or_insert(ch);
                    }
                }
                "mon" => {
                    let o = Opts::parse(val, "chardev");
                    if o.get("mode").as_deref() == Some("control") {
                        if let Some(ch) = o.get("chardev") {
                            control_mons.push(ch);
                        }
                    }
                }
                _ => {}
            }
        }
        c.disks.extend(blockdev_disks(&blockdevs));
        c.monitor = qmp.or_else(|| control_mons.iter().find_map(|id| chardevs.get(id).cloned()));
        c.agent = agent_chardev.map(|id| match chardevs.get(&id) {
            Some(s) => Ok(s.clone()),
            None => Err(match other_chardevs.get(&id) {
                Some(b) => format!("its chardev '{id}' is a '{b}' backend, not a Unix socket"),
                None => format!("its chardev '{id}' is not on the command line"),
            }),
        });
        c
    }

    /// The accelerator the command line settles on, if it does: one choice,
    /// or QEMU's default when none is given (TCG for `qemu-system-*`, KVM
    /// for the `qemu-kvm` / `kvm` builds). A fallback list (`kvm:tcg`) is
    /// `Unknown` until thread names or QMP say which one started.
    pub fn accel(&self, binary: &str) -> Accel {
        let known = |a: &str| match a {
            "kvm" => Accel::Kvm,
            "tcg" => Accel::Tcg,
            _ => Accel::Unknown,
        };
        let mut distinct: Vec<&str> = Vec::new();
        for a in &self.accels {
            if !distinct.contains(&a.as_str()) {
                distinct.push(a);
            }
        }
        match distinct.as_slice() {
            [] if binary == "qemu-kvm" || binary == "kvm" => Accel::Kvm,
            [] => Accel::Tcg,
            [one] => known(one),
            _ => Accel::Unknown,
        }
    }
}

/// A parsed option value: libvirt's JSON form or QEMU's `key=value` form.
#[derive(Debug, Clone)]
pub enum Opts {
    Json(Map<String, Value>),
    KeyVal(Vec<(String, Option<String>)>),
}

impl Opts {
    /// Parse an option value; `implied` names the key of a leading element
    /// without `=` (`-netdev tap,...` → `type=tap`), "" for none.
    pub fn parse(s: &str, implied: &str) -> Opts {
        if s.trim_start().starts_with('{') {
            if let Ok(Value::Object(m)) = serde_json::from_str(s) {
                return Opts::Json(m);
            }
        }
        Opts::KeyVal(parse_keyval(s, implied))
    }

    /// The value of `key` as a string (JSON numbers and booleans too; a bare
    /// `key` is `on`, a bare `nokey` is `off`). The last occurrence wins,
    /// as in QEMU.
    pub fn get(&self, key: &str) -> Option<String> {
        match self {
            Opts::Json(m) => scalar(m.get(key)?),
            Opts::KeyVal(kv) => kv.iter().rev().find_map(|(k, v)| match v {
                Some(v) if k == key => Some(v.clone()),
                None if k == key => Some("on".into()),
                None if k.strip_prefix("no") == Some(key) => Some("off".into()),
                _ => None,
            }),
        }
    }

    pub fn flag(&self, key: &str) -> bool {
        self.get(key).is_some_and(|v| truthy(&v))
    }

    /// As a JSON object; dotted keys (`file.filename=x`) become nested
    /// objects, as QEMU's keyval parser reads them.
    pub fn to_json(&self) -> Map<String, Value> {
        match self {
            Opts::Json(m) => m.clone(),
            Opts::KeyVal(kv) => {
                let mut root = Map::new();
                for (k, v) in kv {
                    let v = Value::String(v.clone().unwrap_or_else(|| "on".into()));
                    insert_dotted(&mut root, k, v);
                }
                root
            }
        }
    }
}

fn insert_dotted(obj: &mut Map<String, Value>, key: &str, v: Value) {
    match key.split_once('.') {
        None => {
            obj.insert(key.to_string(), v);
        }
        Some((head, rest)) => {
            let slot = obj
                .entry(head.to_string())
                .or_insert_with(|| Value::Object(Map::new()));
            if !slot.is_object() {
                // `file=node,file.x=y` is contradictory; keep the reference.
                return;
            }
            if let Value::Object(child) = slot {
                insert_dotted(child, rest, v);
            }
        }
    }
}

/// QEMU's `key=value,...` syntax: `,,` is a literal comma; an element
/// without `=` is the implied key's value when first, else a bare flag.
pub fn parse_keyval(s: &str, implied: &str) -> Vec<(String, Option<String>)> {
    let mut elems = Vec::new();
    let mut cur = String::new();
    let mut chars = s.chars().peekable();
    while let Some(ch) = chars.next() {
        if ch == ',' {
            if chars.peek() == Some(&',') {
                chars.next();
                cur.push(',');
            } else {
                elems.push(std::mem::take(&mut cur));
            }
        } else {
            cur.push(ch);
        }
    }
    elems.push(cur);
    let mut out = Vec::new();
    for (n, e) in elems.into_iter().enumerate() {
        if e.is_empty() {
            continue;
        }
        match e.split_once('=') {
            Some((k, v)) => out.push((k.to_string(), Some(v.to_string()))),
            None if n == 0 && !implied.is_empty() => out.push((implied.to_string(), Some(e))),
            None => out.push((e, None)),
        }
    }
    out
}

/// `on`, `yes`, `true`, `y`, `1`.
pub fn truthy(v: &str) -> bool {
    matches!(v, "on" | "yes" | "true" | "y" | "1")
}

fn scalar(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(if *b { "on" } else { "off" }.into()),
        _ => None,
    }
}

fn jstr<'a>(m: &'a Map<String, Value>, key: &str) -> Option<&'a str> {
    m.get(key).and_then(Value::as_str)
}

fn jtrue(m: &Map<String, Value>, key: &str) -> bool {
    match m.get(key) {
        Some(Value::Bool(b)) => *b,
        Some(Value::String(s)) => truthy(s),
        _ => false,
    }
}

fn simple_disk(path: &str, readonly: bool) -> Disk {
    Disk {
        id: None,
        file: Some(path.into()),
        backing: Vec::new(),
        format: None,
        protocol: None,
        cache: None,
        aio: None,
        readonly,
        source: DiskSource::Cmdline,
    }
}

/// `-drive file=...,format=...,cache=...,aio=...,readonly=on,id=...`; the
/// file may be a `json:{...}` pseudo-filename or given as `file.filename=`.
fn drive_disk(o: &Opts) -> Option<Disk> {
    let tree = o.to_json();
    let mut d = simple_disk("", false);
    d.file = None;
    match tree.get("file") {
        Some(Value::String(f)) if f.starts_with("json:") => {
            let Ok(Value::Object(node)) = serde_json::from_str::<Value>(&f["json:".len()..]) else {
                return None;
            };
            let g = BlockGraph::new(std::slice::from_ref(&node));
            g.fill(&node, &mut d);
        }
        Some(Value::String(f)) if !f.is_empty() => d.file = Some(f.into()),
        Some(Value::Object(node)) => BlockGraph::new(&[]).fill(node, &mut d),
        _ => return None,
    }
    d.id = o.get("id");
    if let Some(f) = o.get("format") {
        d.format = Some(f);
    }
    if let Some(c) = o.get("cache") {
        d.cache = Some(c);
    }
    if let Some(a) = o.get("aio") {
        d.aio = Some(a);
    }
    d.readonly |=
        o.flag("readonly") || o.flag("read-only") || o.get("media").as_deref() == Some("cdrom");
    Some(d)
}

/// Block drivers that reach storage themselves (no `file` child).
const PROTOCOLS: &[&str] = &[
    "file",
    "host_device",
    "host_cdrom",
    "nbd",
    "rbd",
    "iscsi",
    "nfs",
    "ssh",
    "gluster",
    "http",
    "https",
    "ftp",
    "ftps",
    "nvme",
    "null-co",
    "null-aio",
    "vvfat",
    "io_uring",
    "nvme-io_uring",
    "virtio-blk-vhost-user",
    "virtio-blk-vfio-pci",
];

/// Block drivers that pass I/O to their `file` child (not image formats).
const FILTERS: &[&str] = &[
    "throttle",
    "copy-on-read",
    "blkdebug",
    "blkverify",
    "blklogwrites",
    "preallocate",
    "compress",
    "copy-before-write",
    "snapshot-access",
    "raw-offset",
];

/// `-blockdev` nodes by node name, to follow `file` and `backing`
/// references (strings) and inline children (objects).
struct BlockGraph<'a> {
    nodes: HashMap<&'a str, &'a Map<String, Value>>,
}

impl<'a> BlockGraph<'a> {
    fn new(nodes: &'a [Map<String, Value>]) -> BlockGraph<'a> {
        BlockGraph {
            nodes: nodes
                .iter()
                .filter_map(|n| Some((jstr(n, "node-name")?, n)))
                .collect(),
        }
    }

    fn child(&self, node: &'a Map<String, Value>, key: &str) -> Option<&'a Map<String, Value>> {
        match node.get(key)? {
            Value::String(r) => self.nodes.get(r.as_str()).copied(),
            Value::Object(o) => Some(o),
            _ => None,
        }
    }

    /// Fill `d` from the chain starting at `top`: format, protocol, file,
    /// cache, aio, and the backing chain.
    fn fill(&self, top: &'a Map<String, Value>, d: &mut Disk) {
        d.readonly |= jtrue(top, "read-only");
        let mut cur = top;
        let mut format_node = None;
        for _ in 0..32 {
            if let Some(Value::Object(c)) = cur.get("cache") {
                let direct = jtrue(c, "direct");
                let no_flush = jtrue(c, "no-flush");
                d.cache = Some(
                    if no_flush {
                        "unsafe"
                    } else if direct {
                        "none"
                    } else {
                        "writeback"
                    }
                    .into(),
                );
            }
            if let Some(a) = jstr(cur, "aio") {
                d.aio = Some(a.into());
            }
            let driver = jstr(cur, "driver").unwrap_or("");
            let next = self.child(cur, "file");
            if PROTOCOLS.contains(&driver) || next.is_none() {
                if !driver.is_empty() {
                    d.protocol = Some(driver.into());
                }
                d.file = jstr(cur, "filename")
                    .or_else(|| jstr(cur, "path"))
                    .map(PathBuf::from);
                break;
            }
            if !FILTERS.contains(&driver) && format_node.is_none() {
                d.format = Some(driver.into());
                format_node = Some(cur);
            }
            match next {
                Some(n) => cur = n,
                None => break,
            }
        }
        // Backing chain: each format node's `backing` (null means none).
        let mut b = format_node;
        for _ in 0..32 {
            let Some(node) = b.and_then(|n| self.child(n, "backing")) else {
                break;
            };
            let mut bd = simple_disk("", false);
            bd.file = None;
            self.fill_file_only(node, &mut bd);
            if let Some(f) = bd.file {
                d.backing.push(f);
            }
            b = Some(node);
        }
    }

    fn fill_file_only(&self, node: &'a Map<String, Value>, d: &mut Disk) {
        let mut cur = node;
        for _ in 0..32 {
            let driver = jstr(cur, "driver").unwrap_or("");
            match self.child(cur, "file") {
                Some(n) if !PROTOCOLS.contains(&driver) => cur = n,
                _ => {
                    d.file = jstr(cur, "filename").map(PathBuf::from);
                    return;
                }
            }
        }
    }
}

/// Disks from `-blockdev` nodes: one per top node (a node no other node
/// references as `file` or `backing`).
fn blockdev_disks(nodes: &[Map<String, Value>]) -> Vec<Disk> {
    fn refs<'a>(node: &'a Map<String, Value>, out: &mut HashSet<&'a str>) {
        for key in ["file", "backing", "data-file"] {
            match node.get(key) {
                Some(Value::String(r)) => {
                    out.insert(r);
                }
                Some(Value::Object(o)) => refs(o, out),
                _ => {}
            }
        }
    }
    let g = BlockGraph::new(nodes);
    let mut referenced = HashSet::new();
    for n in nodes {
        refs(n, &mut referenced);
    }
    nodes
        .iter()
        .filter(|n| !jstr(n, "node-name").is_some_and(|name| referenced.contains(name)))
        .map(|n| {
            let mut d = simple_disk("", false);
            d.file = None;
            d.id = jstr(n, "node-name").map(str::to_string);
            g.fill(n, &mut d);
            d
        })
        .collect()
}

/// A tap NIC from `-netdev`/`-net`/`-nic` (`tap` or `bridge` types).
fn tap_spec(o: &Opts) -> Option<TapSpec> {
    let ty = o.get("type")?;
    if ty != "tap" && ty != "bridge" {
        return None;
    }
    let mut fds: Vec<u32> = Vec::new();
    if let Some(fd) = o.get("fd").and_then(|f| f.parse().ok()) {
        fds.push(fd);
    }
    if let Some(list) = o.get("fds") {
        fds.extend(list.split(':').filter_map(|f| f.parse::<u32>().ok()));
    }
    Some(TapSpec {
        id: o.get("id"),
        ifname: o.get("ifname").filter(|n| !n.is_empty()),
        fds,
    })
}

/// `-qmp unix:PATH,server=on,wait=off` (also `unix:path=PATH`).
fn legacy_chardev_unix(val: &str) -> Option<SocketSpec> {
    let o = Opts::parse(val, "spec");
    let spec = o.get("spec")?;
    let rest = spec.strip_prefix("unix:")?;
    let path = rest.strip_prefix("path=").unwrap_or(rest);
    (!path.is_empty()).then(|| SocketSpec::Path(path.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &[&str]) -> Vec<String> {
        s.iter().map(std::string::ToString::to_string).collect()
    }

    #[test]
    fn keyval_escapes_flags_and_implied_key() {
        let kv = parse_keyval("tap,ifname=a,,b,script=no,vhost", "type");
        assert_eq!(
            kv,
            vec![
                ("type".into(), Some("tap".into())),
                ("ifname".into(), Some("a,b".into())),
                ("script".into(), Some("no".into())),
                ("vhost".into(), None),
            ]
        );
        let o = Opts::KeyVal(parse_keyval("unix:/x,server,nowait", "spec"));
        assert_eq!(o.get("server").as_deref(), Some("on"));
        assert_eq!(o.get("wait").as_deref(), Some("off"));
        assert_eq!(o.get("spec").as_deref(), Some("unix:/x"));
    }

    #[test]
    fn name_forms() {
        for (v, name, dbg) in [
            (
                "guest=instance-0001,debug-threads=on",
                "instance-0001",
                true,
            ),
            ("vm1,debug-threads=on", "vm1", true),
            ("vm1", "vm1", false),
            ("a,,b,process=qemu-a", "a,b", false),
        ] {
            let c = QemuCmdline::parse(&argv(&["qemu-system-x86_64", "-name", v]));
            assert_eq!(c.name.as_deref(), Some(name), "{v}");
            assert_eq!(c.debug_threads, dbg, "{v}");
        }
        let c = QemuCmdline::parse(&argv(&["qemu-system-x86_64", "--name", "x"]));
        assert_eq!(c.name.as_deref(), Some("x"));
    }

    #[test]
    fn accel_forms() {
        let acc = |args: &[&str], bin: &str| {
            let mut a = vec!["qemu-system-x86_64"];
            a.extend_from_slice(args);
            QemuCmdline::parse(&argv(&a)).accel(bin)
        };
        assert_eq!(
            acc(&["-accel", "tcg,thread=multi"], "qemu-system-x86_64"),
            Accel::Tcg
        );
        assert_eq!(acc(&["-accel", "kvm"], "qemu-system-x86_64"), Accel::Kvm);
        assert_eq!(
            acc(&["-enable-kvm", "-m", "64"], "qemu-system-x86_64"),
            Accel::Kvm
        );
        assert_eq!(
            acc(&["-machine", "pc,accel=kvm"], "qemu-system-x86_64"),
            Accel::Kvm
        );
        assert_eq!(
            acc(&["-M", "q35,accel=kvm:tcg"], "qemu-system-x86_64"),
            Accel::Unknown
        );
        assert_eq!(
            acc(&["-accel", "kvm", "-accel", "tcg"], "x"),
            Accel::Unknown
        );
        assert_eq!(acc(&["-accel", "kvm", "-enable-kvm"], "x"), Accel::Kvm);
        assert_eq!(acc(&[], "qemu-system-x86_64"), Accel::Tcg);
        assert_eq!(acc(&[], "qemu-kvm"), Accel::Kvm);
        assert_eq!(acc(&["-accel", "hvf"], "x"), Accel::Unknown);
    }

    #[test]
    fn drive_forms() {
        let c = QemuCmdline::parse(&argv(&[
            "qemu-system-x86_64",
            "-drive",
            "file=/img/a,,b.raw,format=raw,if=virtio,cache=none,aio=native,id=d0",
            "-drive",
            "if=none,id=cd0,media=cdrom",
            "-drive",
            r#"file=json:{"driver":"qcow2",,"file":{"driver":"file",,"filename":"/img/j.qcow2"}},if=none,id=d1,readonly=on"#,
            "-cdrom",
            "/iso/x.iso",
            "-S",
            "/img/bare.img",
        ]));
        assert_eq!(c.disks.len(), 4, "{:#?}", c.disks);
        let d = &c.disks[0];
        assert_eq!(d.file, Some(PathBuf::from("/img/a,b.raw")));
        assert_eq!(d.id.as_deref(), Some("d0"));
        assert_eq!(d.format.as_deref(), Some("raw"));
        assert_eq!(d.cache.as_deref(), Some("none"));
        assert_eq!(d.aio.as_deref(), Some("native"));
        assert!(!d.readonly);
        let j = &c.disks[1];
        assert_eq!(j.file, Some(PathBuf::from("/img/j.qcow2")));
        assert_eq!(j.format.as_deref(), Some("qcow2"));
        assert_eq!(j.protocol.as_deref(), Some("file"));
        assert!(j.readonly);
        assert_eq!(c.disks[2].file, Some(PathBuf::from("/iso/x.iso")));
        assert!(c.disks[2].readonly);
        assert_eq!(c.disks[3].file, Some(PathBuf::from("/img/bare.img")));
    }

    #[test]
    fn blockdev_json_chain_and_keyval() {
        let c = QemuCmdline::parse(&argv(&[
            "qemu-system-x86_64",
            "-blockdev",
            r#"{"driver":"file","filename":"/l/base.qcow2","node-name":"libvirt-3-storage","auto-read-only":true,"discard":"unmap"}"#,
            "-blockdev",
            r#"{"node-name":"libvirt-3-format","read-only":true,"driver":"qcow2","file":"libvirt-3-storage","backing":null}"#,
            "-blockdev",
            r#"{"driver":"file","filename":"/l/top.qcow2","node-name":"libvirt-2-storage","aio":"native","cache":{"direct":true,"no-flush":false}}"#,
            "-blockdev",
            r#"{"node-name":"libvirt-2-format","read-only":false,"cache":{"direct":true,"no-flush":false},"driver":"qcow2","file":"libvirt-2-storage","backing":"libvirt-3-format"}"#,
            "-blockdev",
            "driver=qcow2,node-name=data0,file.driver=file,file.filename=/srv/d,,1.qcow2,read-only=on",
            "-blockdev",
            r#"{"driver":"nbd","server":{"type":"inet","host":"h","port":"10809"},"export":"e","node-name":"net0"}"#,
        ]));
        assert_eq!(c.disks.len(), 3, "{:#?}", c.disks);
        let top = &c.disks[0];
        assert_eq!(top.id.as_deref(), Some("libvirt-2-format"));
        assert_eq!(top.file, Some(PathBuf::from("/l/top.qcow2")));
        assert_eq!(top.backing, vec![PathBuf::from("/l/base.qcow2")]);
        assert_eq!(top.format.as_deref(), Some("qcow2"));
        assert_eq!(top.cache.as_deref(), Some("none"));
        assert_eq!(top.aio.as_deref(), Some("native"));
        assert!(!top.readonly);
        let kv = &c.disks[1];
        assert_eq!(kv.file, Some(PathBuf::from("/srv/d,1.qcow2")));
        assert_eq!(kv.format.as_deref(), Some("qcow2"));
        assert!(kv.readonly);
        let nbd = &c.disks[2];
        assert_eq!(nbd.protocol.as_deref(), Some("nbd"));
        assert_eq!(nbd.file, None);
    }

    #[test]
    fn taps_iothreads_and_monitors() {
        let c = QemuCmdline::parse(&argv(&[
            "qemu-system-x86_64",
            "-netdev",
            r#"{"type":"tap","fd":"30","vhost":true,"vhostfd":"32","id":"hostnet0"}"#,
            "-netdev",
            "tap,fds=33:34,id=hostnet1",
            "-netdev",
            "tap,id=n2,ifname=tap-x,script=no,downscript=no",
            "-netdev",
            "user,id=n3",
            "-nic",
            "bridge,br=br0",
            "-object",
            r#"{"qom-type":"iothread","id":"iothread1"}"#,
            "-object",
            "iothread,id=iothread2",
            "-chardev",
            "socket,id=charmonitor,fd=29,server=on,wait=off",
            "-mon",
            "chardev=charmonitor,id=monitor,mode=control",
        ]));
        assert_eq!(c.taps.len(), 4);
        assert_eq!(c.taps[0].fds, vec![30]);
        assert_eq!(c.taps[0].id.as_deref(), Some("hostnet0"));
        assert_eq!(c.taps[1].fds, vec![33, 34]);
        assert_eq!(c.taps[2].ifname.as_deref(), Some("tap-x"));
        assert!(c.taps[3].fds.is_empty() && c.taps[3].ifname.is_none());
        assert_eq!(c.iothreads, vec!["iothread1", "iothread2"]);
        assert_eq!(c.monitor, Some(SocketSpec::Fd(29)));

        let q = |v: &str| QemuCmdline::parse(&argv(&["q", "-qmp", v])).monitor;
        assert_eq!(
            q("unix:/run/q.sock,server,nowait"),
            Some(SocketSpec::Path("/run/q.sock".into()))
        );
        assert_eq!(
            q("unix:/t/qmp.sock,server=on,wait=off"),
            Some(SocketSpec::Path("/t/qmp.sock".into()))
        );
        assert_eq!(q("tcp:localhost:4444,server"), None);
        let c = QemuCmdline::parse(&argv(&[
            "q",
            "-chardev",
            "socket,id=m,path=/p/m.sock,server=on,wait=off",
            "-mon",
            "chardev=m,mode=readline",
            "-chardev",
            "socket,id=m2,path=/p/qmp.sock,server=on,wait=off",
            "-mon",
            "chardev=m2,mode=control",
        ]));
        assert_eq!(c.monitor, Some(SocketSpec::Path("/p/qmp.sock".into())));
    }
}
