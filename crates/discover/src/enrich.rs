//! Merging what a VM's QMP monitor says into the `/proc` view:
//! `query-cpus-fast` (authoritative vCPU thread ids; `query-cpus` on QEMU
//! before 2.12), `query-kvm` (accelerator), `query-iothreads` (I/O thread
//! ids) and `query-block` (disks as they are now). Any failure leaves the
//! `/proc` view as it was and adds a warning.

use crate::qmp::Qmp;
use crate::{host_view, Accel, Disk, DiskSource, ThreadKind, Vm, VmThread, VCPUS_UNKNOWN};
use serde_json::Value;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;
use vmscope_linux::procfs::ProcRoot;

/// Query the VM's monitor and merge the answers into `vm`.
pub(crate) fn with_qmp(vm: &mut Vm, proc: &ProcRoot, timeout: Duration) {
    let Some(sock) = vm.qmp.clone() else { return };
    let mut q = match Qmp::connect(&sock, timeout) {
        Ok(q) => q,
        Err(first) => {
            // The socket may live in another mount namespace.
            let alt = host_view(proc, vm.pid, &sock);
            if let Some(Ok(q)) = (alt != sock).then(|| Qmp::connect(&alt, timeout)) {
                q
            } else {
                vm.warnings.push(format!("QMP not used: {first}"));
                return;
            }
        }
    };
    vm.qmp_used = true;

    match crate::qmp::vcpu_threads(&mut q) {
        Ok(cpus) => apply_cpus(vm, &cpus),
        Err(e) => vm.warnings.push(format!("QMP: {e}")),
    }
    match q.execute("query-kvm", None) {
        Ok(v) => {
            vm.accel = if v.get("enabled").and_then(Value::as_bool) == Some(true) {
                Accel::Kvm
            } else {
                Accel::Tcg
            };
        }
        Err(e) => vm.warnings.push(format!("QMP: {e}")),
    }
    match q.execute("query-iothreads", None) {
        Ok(v) => apply_iothreads(vm, &v),
        Err(e) => vm.warnings.push(format!("QMP: {e}")),
    }
    match q.execute("query-block", None) {
        Ok(v) => merge_disks(&mut vm.disks, &v),
        Err(e) => vm.warnings.push(format!("QMP: {e}")),
    }
}

/// QMP's vCPU threads replace the ones the names suggested.
pub(crate) fn apply_cpus(vm: &mut Vm, cpus: &[(u32, u32)]) {
    if cpus.is_empty() {
        return;
    }
    let name_of = |vm: &Vm, tid: u32| {
        vm.vcpus
            .iter()
            .chain(vm.io_threads.iter())
            .find(|t| t.tid == tid)
            .map(|t| t.name.clone())
    };
    let mut by_tid: Vec<(u32, Vec<u32>)> = Vec::new();
    for &(idx, tid) in cpus {
        match by_tid.iter_mut().find(|(t, _)| *t == tid) {
            Some((_, idxs)) => idxs.push(idx),
            None => by_tid.push((tid, vec![idx])),
        }
    }
    let mut vcpus: Vec<VmThread> = by_tid
        .iter()
        .map(|(tid, idxs)| VmThread {
            tid: *tid,
            // One thread for several vCPUs: single-threaded TCG.
            index: (idxs.len() == 1).then(|| idxs[0]),
            name: name_of(vm, *tid).unwrap_or_else(|| format!("CPU {}", idxs[0])),
            kind: ThreadKind::Vcpu,
        })
        .collect();
    vcpus.sort_by_key(|t| (t.index, t.tid));
    let named: HashSet<(u32, Option<u32>)> = vm.vcpus.iter().map(|t| (t.tid, t.index)).collect();
    let from_qmp: HashSet<(u32, Option<u32>)> = vcpus.iter().map(|t| (t.tid, t.index)).collect();
    if !named.is_empty() && named != from_qmp {
        vm.warnings
            .push("vCPU threads by name differ from QMP query-cpus-fast; QMP's are used".into());
    }
    let tids: HashSet<u32> = vcpus.iter().map(|t| t.tid).collect();
    let mut others: Vec<VmThread> = std::mem::take(&mut vm.vcpus)
        .into_iter()
        .filter(|t| !tids.contains(&t.tid))
        .map(|mut t| {
            t.kind = ThreadKind::Other;
            t.index = None;
            t
        })
        .collect();
    others.extend(
        std::mem::take(&mut vm.io_threads)
            .into_iter()
            .filter(|t| !tids.contains(&t.tid)),
    );
    for t in &mut others {
        if t.kind == ThreadKind::Unknown {
            t.kind = ThreadKind::Other;
        }
    }
    others.sort_by_key(|t| t.tid);
    vm.io_threads = others;
    vm.vcpus = vcpus;
    vm.warnings.retain(|w| !w.starts_with(VCPUS_UNKNOWN));
}

/// `query-iothreads`: `[{"id": "iothread1", "thread-id": 1234}, ...]`.
pub(crate) fn apply_iothreads(vm: &mut Vm, v: &Value) {
    for it in v.as_array().into_iter().flatten() {
        let Some(tid) = it.get("thread-id").and_then(Value::as_u64) else {
            continue;
        };
        if let Some(t) = vm.io_threads.iter_mut().find(|t| u64::from(t.tid) == tid) {
            t.kind = ThreadKind::IoThread;
            if !t.name.starts_with("IO ") {
                if let Some(id) = it.get("id").and_then(Value::as_str) {
                    t.name = format!("IO {id}");
                }
            }
        }
    }
}

/// The cache mode `query-block` describes with three flags.
fn cache_mode(c: &Value) -> Option<String> {
    let flag = |k: &str| c.get(k).and_then(Value::as_bool);
    let (wb, direct, no_flush) = (flag("writeback")?, flag("direct")?, flag("no-flush")?);
    Some(
        match (no_flush, direct, wb) {
            (true, _, _) => "unsafe",
            (false, true, true) => "none",
            (false, true, false) => "directsync",
            (false, false, true) => "writeback",
            (false, false, false) => "writethrough",
        }
        .into(),
    )
}

/// `query-block`: each device with a medium updates the disk it matches
/// (same drive id, node name or file) or is added.
pub(crate) fn merge_disks(disks: &mut Vec<Disk>, v: &Value) {
    for dev in v.as_array().into_iter().flatten() {
        let Some(ins) = dev.get("inserted") else {
            continue;
        };
        let s = |v: &Value, k: &str| {
            v.get(k)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
        };
        let device = s(dev, "device");
        let node = s(ins, "node-name");
        let file = s(ins, "file").map(|f| json_filename(&f));
        let mut backing = Vec::new();
        let mut img = ins.get("image").and_then(|i| i.get("backing-image"));
        while let Some(b) = img {
            if let Some(f) = s(b, "filename") {
                backing.push(json_filename(&f));
            }
            img = b.get("backing-image");
        }
        if backing.is_empty() {
            if let Some(f) = s(ins, "backing_file") {
                backing.push(json_filename(&f));
            }
        }
        let matches = |d: &Disk| {
            (d.id.is_some() && (d.id == device || d.id == node))
                || (file.is_some() && d.file == file)
        };
        let disk = if let Some(i) = disks.iter().position(matches) {
            disks[i].source = DiskSource::Both;
            &mut disks[i]
        } else {
            disks.push(Disk {
                id: device.clone().or_else(|| node.clone()),
                file: None,
                backing: Vec::new(),
                format: None,
                protocol: None,
                cache: None,
                aio: None,
                readonly: false,
                source: DiskSource::Qmp,
            });
            let last = disks.len() - 1;
            &mut disks[last]
        };
        if file.is_some() {
            disk.file = file;
        }
        if let Some(f) = s(ins, "drv") {
            disk.format = Some(f);
        }
        if let Some(ro) = ins.get("ro").and_then(Value::as_bool) {
            disk.readonly = ro;
        }
        if let Some(c) = ins.get("cache").and_then(cache_mode) {
            disk.cache = Some(c);
        }
        if !backing.is_empty() {
            disk.backing = backing;
        }
    }
}

/// QMP reports complex block graphs as `json:{...}` pseudo-filenames; the
/// innermost `filename` is the file.
fn json_filename(f: &str) -> PathBuf {
    fn find(v: &Value) -> Option<&str> {
        if let Some(s) = v.get("filename").and_then(Value::as_str) {
            return Some(s);
        }
        v.get("file").and_then(find)
    }
    if let Some(j) = f.strip_prefix("json:") {
        if let Ok(v) = serde_json::from_str::<Value>(j) {
            if let Some(s) = find(&v) {
                return Path::new(s).to_path_buf();
            }
        }
    }
    PathBuf::from(f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn t(tid: u32, name: &str, kind: ThreadKind) -> VmThread {
        VmThread {
            tid,
            index: None,
            name: name.into(),
            kind,
        }
    }

    fn unnamed_vm() -> Vm {
        Vm {
            name: "plain".into(),
            pid: 10,
            uuid: None,
            exe: None,
            accel: Accel::Unknown,
            vcpus: vec![],
            io_threads: vec![
                t(10, "qemu-system-x86", ThreadKind::MainLoop),
                t(11, "qemu-system-x86", ThreadKind::Unknown),
                t(12, "qemu-system-x86", ThreadKind::Unknown),
                t(13, "qemu-system-x86", ThreadKind::Unknown),
                t(14, "qemu-system-x86", ThreadKind::Unknown),
            ],
            vhost: vec![],
            disks: vec![],
            taps: vec![],
            qmp: None,
            qmp_used: true,
            agent: Default::default(),
            libvirt: None,
            cmdline: vec![],
            warnings: vec![format!("{VCPUS_UNKNOWN} x")],
        }
    }

    #[test]
    fn qmp_names_vcpus_of_an_unnamed_qemu() {
        let mut vm = unnamed_vm();
        apply_cpus(&mut vm, &[(0, 13), (1, 14)]);
        assert_eq!(
            vm.vcpus
                .iter()
                .map(|t| (t.tid, t.index))
                .collect::<Vec<_>>(),
            [(13, Some(0)), (14, Some(1))]
        );
        assert!(vm.io_threads.iter().all(|t| t.kind != ThreadKind::Unknown));
        assert_eq!(vm.io_threads.len(), 3);
        assert!(vm.warnings.is_empty(), "{:?}", vm.warnings);
        apply_iothreads(&mut vm, &json!([{"id": "iothread1", "thread-id": 12}]));
        let io = vm
            .io_threads
            .iter()
            .find(|t| t.tid == 12)
            .expect("iothread");
        assert_eq!(
            (io.kind, io.name.as_str()),
            (ThreadKind::IoThread, "IO iothread1")
        );
        let roles: Vec<_> = vm.tids().collect();
        assert_eq!(roles.len(), 5);
    }

    #[test]
    fn single_threaded_tcg_is_one_vcpu_thread() {
        let mut vm = unnamed_vm();
        apply_cpus(&mut vm, &[(0, 11), (1, 11)]);
        assert_eq!(vm.vcpus.len(), 1);
        assert_eq!(vm.vcpus[0].index, None);
    }

    #[test]
    fn query_block_updates_and_adds() {
        let mut disks = vec![Disk {
            id: Some("libvirt-2-format".into()),
            file: Some("/l/top.qcow2".into()),
            backing: vec![],
            format: Some("qcow2".into()),
            protocol: Some("file".into()),
            cache: None,
            aio: Some("native".into()),
            readonly: false,
            source: DiskSource::Cmdline,
        }];
        let v = json!([
            {"device": "", "qdev": "/machine/peripheral/virtio-disk0/virtio-backend",
             "inserted": {"node-name": "libvirt-2-format", "file": "/l/top.qcow2", "drv": "qcow2", "ro": false,
                          "cache": {"writeback": true, "direct": true, "no-flush": false},
                          "image": {"filename": "/l/top.qcow2", "backing-image": {"filename": "/l/base.qcow2"}}}},
            {"device": "ide1-cd0", "locked": false},
            {"device": "virtio1", "inserted": {"node-name": "#block1", "file": "json:{\"driver\": \"qcow2\", \"file\": {\"driver\": \"file\", \"filename\": \"/hot/x.qcow2\"}}", "drv": "qcow2", "ro": true,
                          "cache": {"writeback": false, "direct": false, "no-flush": false}}}
        ]);
        merge_disks(&mut disks, &v);
        assert_eq!(disks.len(), 2);
        assert_eq!(disks[0].source, DiskSource::Both);
        assert_eq!(disks[0].cache.as_deref(), Some("none"));
        assert_eq!(disks[0].aio.as_deref(), Some("native"));
        assert_eq!(disks[0].backing, vec![PathBuf::from("/l/base.qcow2")]);
        assert_eq!(disks[1].source, DiskSource::Qmp);
        assert_eq!(disks[1].id.as_deref(), Some("virtio1"));
        assert_eq!(disks[1].file, Some(PathBuf::from("/hot/x.qcow2")));
        assert_eq!(disks[1].cache.as_deref(), Some("writethrough"));
        assert!(disks[1].readonly);
    }
}
