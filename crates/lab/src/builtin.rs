//! The labs built into the binary, by name: the repository's `labs/*.toml`
//! (`one-vm`, the default of `lab up`; menon2005's `guest-same-cpu` and
//! `guest-separate-cpu`; theurer2006's `scale-vms` and `scale-vcpus`;
//! giacobbi2011's `storage-quad`; cherkasova2005's `io-charging`). Every
//! command that takes a lab (`lab up`, `bench * --lab`) takes a spec file or
//! one of these names, through [`load`].

use crate::error::{LabError, Result};
use crate::spec::LabSpec;
use std::path::Path;

/// Built-in specs, by name, with what each is for.
pub const BUILT_IN: [(&str, &str, &str); 7] = [
    (
        "one-vm",
        "one VM (vm0) of two vCPUs with a user-mode NIC (the default of lab up)",
        include_str!("../../../labs/one-vm.toml"),
    ),
    (
        "guest-same-cpu",
        "menon2005: one one-vCPU VM, its vCPU and QEMU on one host CPU (bench net, web)",
        include_str!("../../../labs/guest-same-cpu.toml"),
    ),
    (
        "guest-separate-cpu",
        "menon2005: the same VM, vCPU and QEMU on separate host CPUs (bench net, web)",
        include_str!("../../../labs/guest-separate-cpu.toml"),
    ),
    (
        "scale-vms",
        "theurer2006: one-vCPU VMs for the VM-count sweep (bench scale)",
        include_str!("../../../labs/scale-vms.toml"),
    ),
    (
        "scale-vcpus",
        "theurer2006: one VM for the vCPU-count sweep (bench scale)",
        include_str!("../../../labs/scale-vcpus.toml"),
    ),
    (
        "storage-quad",
        "giacobbi2011: one VM on a raw file, a qcow2 file, a raw block device and an LVM volume (bench io)",
        include_str!("../../../labs/storage-quad.toml"),
    ),
    (
        "io-charging",
        "cherkasova2005: VMs doing network and disk I/O for the charging of shared I/O (account)",
        include_str!("../../../labs/io-charging.toml"),
    ),
];

/// The names of the built-in labs, comma-separated.
pub fn names() -> String {
    BUILT_IN.map(|(n, _, _)| n).join(", ")
}

/// One line per built-in lab (`name  what it is`), for `--help` texts.
pub fn list() -> String {
    let w = BUILT_IN.iter().map(|(n, _, _)| n.len()).max().unwrap_or(0);
    BUILT_IN
        .iter()
        .map(|(n, what, _)| format!("  {n:<w$}  {what}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The built-in spec `name`, if there is one.
pub fn get(name: &str) -> Option<Result<LabSpec>> {
    BUILT_IN
        .iter()
        .find(|(n, _, _)| *n == name)
        .map(|(n, _, text)| LabSpec::parse(text, Path::new(&format!("(built-in) labs/{n}.toml"))))
}

/// The lab `arg` names: a spec file when one exists at that path, else a
/// built-in name; renamed to `name` when given (`--lab-name`).
pub fn load(arg: &str, name: Option<&str>) -> Result<LabSpec> {
    // What looks like a path is read as one (and a missing file said as
    // such); a bare name is a built-in lab unless a file of that name is
    // here.
    let path_like = arg.contains('/') || arg.ends_with(".toml");
    let mut spec = if path_like || Path::new(arg).exists() {
        LabSpec::from_file(Path::new(arg))?
    } else if let Some(s) = get(arg) {
        s?
    } else {
        return Err(LabError::NoSuchSpec {
            arg: arg.to_string(),
            builtin: names(),
        });
    };
    if let Some(n) = name {
        if !crate::names::valid_name(n) {
            return Err(LabError::BadName {
                name: n.to_string(),
            });
        }
        spec.name = n.to_string();
    }
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_built_in_parses_under_its_own_name() {
        for (n, _, _) in BUILT_IN {
            let s = load(n, None).unwrap();
            assert_eq!(s.name, n);
        }
        assert_eq!(
            load("guest-same-cpu", Some("netbench-x")).unwrap().name,
            "netbench-x"
        );
        let e = load("nope", None).unwrap_err().to_string();
        assert!(e.contains("nope") && e.contains("guest-same-cpu"), "{e}");
        assert!(load("storage-quad", Some("bad name")).is_err());
        assert!(list().lines().count() == BUILT_IN.len());
    }

    #[test]
    fn storage_quad_has_four_backends() {
        let s = load("storage-quad", None).unwrap();
        let disks = &s.vms[0].disks;
        let kinds: Vec<String> = disks
            .iter()
            .map(|d| format!("{:?}-{}", d.backend, d.format.as_str()))
            .collect();
        assert_eq!(kinds, ["File-raw", "File-qcow2", "Block-raw", "Lvm-raw"]);
        assert!(disks.iter().all(|d| d.cache == "none"));
        assert!(disks.last().unwrap().optional);
    }
}
