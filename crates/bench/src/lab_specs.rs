//! The labs the network, scaling and overhead benchmarks bring up with
//! `--lab`: a spec file, or one of the repository's `labs/*.toml` built
//! into the binary by name (menon2005's `guest-same-cpu` and
//! `guest-separate-cpu`, theurer2006's `scale-vms` and `scale-vcpus`, and
//! `storage-quad` of `bench io`). Bringing up, reusing and tearing down is
//! [`crate::io::labs::LabSession`]'s.

use crate::BenchError;
use std::path::Path;
use vmscope_lab::LabSpec;

/// Built-in specs, by name.
pub const BUILT_IN: [(&str, &str); 5] = [
    (
        "guest-same-cpu",
        include_str!("../../../labs/guest-same-cpu.toml"),
    ),
    (
        "guest-separate-cpu",
        include_str!("../../../labs/guest-separate-cpu.toml"),
    ),
    ("scale-vms", include_str!("../../../labs/scale-vms.toml")),
    (
        "scale-vcpus",
        include_str!("../../../labs/scale-vcpus.toml"),
    ),
    (
        "storage-quad",
        include_str!("../../../labs/storage-quad.toml"),
    ),
];

/// The spec named by `--lab` (a file or a built-in name), renamed to
/// `name` when given.
pub fn load(arg: &str, name: Option<&str>) -> Result<LabSpec, BenchError> {
    let mut spec = if Path::new(arg).is_file() {
        LabSpec::from_file(Path::new(arg))?
    } else if let Some((n, text)) = BUILT_IN.iter().find(|(n, _)| *n == arg) {
        LabSpec::parse(text, Path::new(&format!("(built-in) labs/{n}.toml")))?
    } else {
        return Err(BenchError::bad(format!(
            "--lab {arg}: no such spec file, and not a built-in lab ({})",
            BUILT_IN.map(|(n, _)| n).join(", ")
        )));
    };
    if let Some(n) = name {
        if !vmscope_lab::names::valid_name(n) {
            return Err(BenchError::bad(format!(
                "--lab-name {n}: lab names are letters, digits, '-' and '_', start with a letter or digit, at most 32 characters"
            )));
        }
        spec.name = n.to_string();
    }
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_built_in_parses_and_a_bad_name_is_said() {
        for (n, _) in BUILT_IN {
            let s = load(n, None).unwrap();
            assert_eq!(s.name, n);
        }
        assert_eq!(
            load("guest-same-cpu", Some("netbench-x")).unwrap().name,
            "netbench-x"
        );
        let e = load("nope", None).unwrap_err().to_string();
        assert!(e.contains("nope") && e.contains("guest-same-cpu"), "{e}");
    }
}
