//! Kernel module dependencies of the guest kernel: read `depends=` from each
//! module's `.modinfo` section (with `modinfo -F depends` when kmod is
//! installed, else by parsing the ELF section with the `object` crate) and
//! turn it into an `insmod` order, dependencies first.

use crate::error::{LabError, Result};
use object::{Object, ObjectSection};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Modules the lab guest needs for virtio disks, NICs and the agent channel.
pub const WANTED: [&str; 4] = ["virtio_pci", "virtio_blk", "virtio_net", "virtio_console"];

/// Module names use `_` and `-` interchangeably; normalise to `_`.
pub fn normalize(name: &str) -> String {
    name.replace('-', "_")
}

/// The `depends=` list of the `.modinfo` section of ELF bytes.
pub fn depends_from_elf(data: &[u8]) -> std::result::Result<Vec<String>, String> {
    let file = object::File::parse(data).map_err(|e| format!("not an ELF module: {e}"))?;
    let section = file
        .section_by_name(".modinfo")
        .ok_or_else(|| "no .modinfo section".to_string())?;
    let bytes = section
        .data()
        .map_err(|e| format!(".modinfo unreadable: {e}"))?;
    Ok(depends_from_modinfo(bytes))
}

/// The `depends=` list from raw `.modinfo` contents (NUL-separated `key=value`).
pub fn depends_from_modinfo(bytes: &[u8]) -> Vec<String> {
    bytes
        .split(|&b| b == 0)
        .filter_map(|kv| kv.strip_prefix(b"depends="))
        .flat_map(|v| {
            String::from_utf8_lossy(v)
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(normalize)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Dependencies of one `.ko` file, via `modinfo` if present, else the ELF.
pub fn depends_of(ko: &Path) -> Result<Vec<String>> {
    if let Some(modinfo) = crate::util::which("modinfo") {
        if let Ok(out) = std::process::Command::new(modinfo)
            .args(["-F", "depends"])
            .arg(ko)
            .output()
        {
            if out.status.success() {
                return Ok(String::from_utf8_lossy(&out.stdout)
                    .split([',', '\n'])
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(normalize)
                    .collect());
            }
        }
    }
    let data = std::fs::read(ko).map_err(|e| LabError::io("read module", ko, e))?;
    depends_from_elf(&data).map_err(|e| LabError::Image(format!("{}: {e}", ko.display())))
}

/// Index every `*.ko` under `dir` by normalised module name.
pub fn index_modules(dir: &Path) -> Result<BTreeMap<String, PathBuf>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let rd = std::fs::read_dir(&d).map_err(|e| LabError::io("read directory", &d, e))?;
        for e in rd.flatten() {
            let p = e.path();
            let Ok(ft) = e.file_type() else { continue };
            if ft.is_dir() {
                stack.push(p);
            } else if let Some(name) = p.file_name().and_then(|n| n.to_str()) {
                if let Some(stem) = name.strip_suffix(".ko") {
                    out.insert(normalize(stem), p.clone());
                }
            }
        }
    }
    Ok(out)
}

/// Load order for `wanted` given a dependency lookup: every module after all
/// of its dependencies, each once, in a stable order (dependencies in the
/// order they are listed, roots in the order asked). A cycle or a missing
/// module is an error naming it.
pub fn load_order<F>(wanted: &[&str], mut deps: F) -> std::result::Result<Vec<String>, String>
where
    F: FnMut(&str) -> std::result::Result<Vec<String>, String>,
{
    fn visit<F>(
        m: &str,
        deps: &mut F,
        done: &mut BTreeSet<String>,
        active: &mut Vec<String>,
        out: &mut Vec<String>,
    ) -> std::result::Result<(), String>
    where
        F: FnMut(&str) -> std::result::Result<Vec<String>, String>,
    {
        if done.contains(m) {
            return Ok(());
        }
        if active.iter().any(|a| a == m) {
            return Err(format!(
                "module dependency cycle: {} -> {m}",
                active.join(" -> ")
            ));
        }
        active.push(m.to_string());
        for d in deps(m)? {
            visit(&d, deps, done, active, out)?;
        }
        active.pop();
        done.insert(m.to_string());
        out.push(m.to_string());
        Ok(())
    }
    let mut done = BTreeSet::new();
    let mut out = Vec::new();
    for w in wanted {
        visit(
            &normalize(w),
            &mut deps,
            &mut done,
            &mut Vec::new(),
            &mut out,
        )?;
    }
    Ok(out)
}

/// The `.ko` files to load, in order, for [`WANTED`] from a module tree.
pub fn resolve(tree: &Path) -> Result<Vec<(String, PathBuf)>> {
    let index = index_modules(tree)?;
    let order = load_order(&WANTED, |m| {
        let ko = index.get(m).ok_or_else(|| {
            format!(
                "module {m} not found under {} (is it built in? compressed?)",
                tree.display()
            )
        })?;
        depends_of(ko).map_err(|e| e.to_string())
    })
    .map_err(LabError::Image)?;
    order
        .into_iter()
        .map(|m| {
            let p = index
                .get(&m)
                .cloned()
                .ok_or_else(|| LabError::Image(format!("module {m} not found")))?;
            Ok((m, p))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_depends_from_modinfo_bytes() {
        let raw = b"license=GPL\0depends=virtio,virtio_ring\0name=virtio_net\0\0\0";
        assert_eq!(depends_from_modinfo(raw), vec!["virtio", "virtio_ring"]);
        assert!(depends_from_modinfo(b"depends=\0name=virtio_ring\0").is_empty());
        assert_eq!(
            depends_from_modinfo(b"depends=net-failover\0"),
            vec!["net_failover"]
        );
    }

    /// The dependencies of the Debian 6.1 cloud kernel's virtio modules.
    fn debian_deps(m: &str) -> std::result::Result<Vec<String>, String> {
        let d: &[&str] = match m {
            "virtio_ring"
            | "virtio"
            | "failover"
            | "virtio_pci_legacy_dev"
            | "virtio_pci_modern_dev" => &[],
            "virtio_pci" => &[
                "virtio_pci_legacy_dev",
                "virtio_pci_modern_dev",
                "virtio",
                "virtio_ring",
            ],
            "virtio_blk" | "virtio_console" => &["virtio", "virtio_ring"],
            "net_failover" => &["failover"],
            "virtio_net" => &["net_failover", "virtio", "virtio_ring"],
            other => return Err(format!("unknown {other}")),
        };
        Ok(d.iter().map(std::string::ToString::to_string).collect())
    }

    #[test]
    fn order_puts_dependencies_first() {
        let order = load_order(&WANTED, debian_deps).unwrap();
        assert_eq!(
            order,
            vec![
                "virtio_pci_legacy_dev",
                "virtio_pci_modern_dev",
                "virtio",
                "virtio_ring",
                "virtio_pci",
                "virtio_blk",
                "failover",
                "net_failover",
                "virtio_net",
                "virtio_console"
            ]
        );
        for (i, m) in order.iter().enumerate() {
            for d in debian_deps(m).unwrap() {
                let j = order.iter().position(|x| *x == d).unwrap();
                assert!(j < i, "{d} must load before {m}");
            }
        }
    }

    #[test]
    fn cycle_and_missing_are_errors() {
        let e = load_order(&["a"], |m| {
            Ok(match m {
                "a" => vec!["b".to_string()],
                _ => vec!["a".to_string()],
            })
        })
        .unwrap_err();
        assert!(e.contains("cycle"), "{e}");
        let e = load_order(&["virtio_pci", "nope"], debian_deps).unwrap_err();
        assert!(e.contains("nope"));
    }

    #[test]
    fn reads_modinfo_from_a_real_elf() {
        // Build a relocatable ELF with a .modinfo section using the system
        // assembler, when one is present.
        let Some(cc) = crate::util::which("cc").or_else(|| crate::util::which("gcc")) else {
            vmscope_testkit::skip("no C compiler to build an ELF fixture (apt-get install gcc)");
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("m.c");
        std::fs::write(
            &src,
            "__attribute__((section(\".modinfo\"), used)) static const char a[] = \"depends=virtio,virtio_ring\";\n\
             __attribute__((section(\".modinfo\"), used)) static const char b[] = \"name=fake\";\n",
        )
        .unwrap();
        let obj = dir.path().join("m.ko");
        let st = std::process::Command::new(cc)
            .arg("-c")
            .arg(&src)
            .arg("-o")
            .arg(&obj)
            .status()
            .unwrap();
        assert!(st.success());
        let data = std::fs::read(&obj).unwrap();
        assert_eq!(
            depends_from_elf(&data).unwrap(),
            vec!["virtio", "virtio_ring"]
        );
    }
}

#[cfg(test)]
mod real_kernel {
    use super::*;

    /// With a guest kernel already unpacked in an image cache, the ELF
    /// reader and `modinfo` agree, and the resolved order loads every
    /// dependency first.
    #[test]
    fn elf_reader_agrees_with_modinfo_on_the_guest_kernel() {
        let caches: Vec<PathBuf> = std::env::var_os("VMSCOPE_CACHE")
            .map(PathBuf::from)
            .into_iter()
            .chain([Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/tmp/lab-cache")])
            .collect();
        let find = || {
            caches.iter().find_map(|c| {
                let rd = std::fs::read_dir(c.join("kernels")).ok()?;
                rd.flatten().find_map(|e| {
                    let m = e.path().join("root/lib/modules");
                    std::fs::read_dir(&m)
                        .ok()?
                        .flatten()
                        .next()
                        .map(|r| r.path())
                })
            })
        };
        // Build the guest image (it unpacks the kernel) when no test did yet.
        let tree = find().or_else(|| {
            let built = crate::image::build_image(&crate::image::ImageOptions {
                cache_dir: caches[0].clone(),
                agent: None,
                kernel_package: None,
                ..Default::default()
            });
            if let Err(e) = built {
                vmscope_testkit::skip(&format!(
                    "no unpacked guest kernel and the guest image cannot be built here: {e}"
                ));
            }
            find()
        });
        let Some(tree) = tree else {
            return;
        };
        let order = resolve(&tree).unwrap();
        let names: Vec<&str> = order.iter().map(|o| o.0.as_str()).collect();
        for w in WANTED {
            assert!(names.contains(&w), "{w} missing from {names:?}");
        }
        for (i, (name, ko)) in order.iter().enumerate() {
            let from_elf = depends_from_elf(&std::fs::read(ko).unwrap()).unwrap();
            if crate::util::which("modinfo").is_some() {
                assert_eq!(from_elf, depends_of(ko).unwrap(), "{name}");
            }
            for d in from_elf {
                let j = names.iter().position(|n| *n == d).unwrap();
                assert!(j < i, "{d} must load before {name}");
            }
        }
    }
}
