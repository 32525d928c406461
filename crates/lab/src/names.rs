//! Host resource names derived from a lab's name: bridge, taps, LVM volumes,
//! the default tap subnet. Linux interface names are at most 15 bytes, so a
//! lab name is shortened to 7 characters; long names keep their first three
//! characters plus a hash of the whole name, so two labs never collide in
//! practice and the names stay recognisable in `ip link`.

use crate::util::sha256_hex;

/// Longest Linux interface name (IFNAMSIZ - 1).
pub const IFNAME_MAX: usize = 15;

/// Characters of the short lab name.
const SHORT_LEN: usize = 7;

/// Whether `name` is acceptable as a lab or VM name: 1-32 characters of
/// `[A-Za-z0-9_-]`, starting with a letter or digit.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 32
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric())
}

/// The short form of a lab name used in interface names (≤ 7 characters).
pub fn short(lab: &str) -> String {
    let clean: String = lab
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect();
    if clean.len() <= SHORT_LEN && clean == lab {
        return clean;
    }
    let hash = sha256_hex(lab.as_bytes());
    let head: String = clean.chars().take(3).collect();
    format!("{head}{}", &hash[..SHORT_LEN - head.len()])
}

/// The bridge a lab creates for its tap NICs: `vmsbr-<short>`.
pub fn bridge(lab: &str) -> String {
    format!("vmsbr-{}", short(lab))
}

/// The tap of the lab's `n`-th tap NIC: `vmst-<short>-<n>`.
pub fn tap(lab: &str, n: usize) -> String {
    format!("vmst-{}-{n}", short(lab))
}

/// Default /24 subnet of the lab's bridge: `10.77.X.0/24`, X from the name.
pub fn default_subnet_octet(lab: &str) -> u8 {
    let hash = sha256_hex(lab.as_bytes());
    let v = u8::from_str_radix(&hash[..2], 16).unwrap_or(0);
    1 + v % 250
}

/// Name of an LVM logical volume the lab creates: `vmscope-<short>-<vm>-<n>`.
pub fn lv(lab: &str, vm: &str, n: usize) -> String {
    format!("vmscope-{}-{vm}-{n}", short(lab))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_names_stay_readable() {
        assert!(short("one-vm").starts_with("one"));
        assert_eq!(short("one-vm").len(), 7);
        assert_eq!(short("lab1"), "lab1");
        assert_eq!(bridge("lab1"), "vmsbr-lab1");
        assert_eq!(tap("lab1", 3), "vmst-lab1-3");
    }

    #[test]
    fn names_fit_ifnamsiz() {
        for lab in [
            "a",
            "one-vm",
            "guest-same-cpu",
            "storage-quad",
            "an-extremely-long-lab-name-xxxxx",
            "UPPER",
        ] {
            assert!(bridge(lab).len() <= IFNAME_MAX, "{}", bridge(lab));
            for n in 0..100 {
                assert!(tap(lab, n).len() <= IFNAME_MAX, "{}", tap(lab, n));
            }
            assert!(short(lab).len() <= 7);
            assert!(short(lab)
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()));
        }
    }

    #[test]
    fn different_labs_get_different_names() {
        let labs = [
            "guest-same-cpu",
            "guest-separate-cpu",
            "scale-vms",
            "scale-vcpus",
            "one-vm",
            "storage-quad",
            "lab",
            "Lab",
        ];
        let mut seen = std::collections::HashSet::new();
        for l in labs {
            assert!(seen.insert(bridge(l)), "collision for {l}");
        }
        // Shared prefixes still differ.
        assert_ne!(short("guest-same-cpu"), short("guest-separate-cpu"));
    }

    #[test]
    fn name_validation() {
        assert!(valid_name("vm0"));
        assert!(valid_name("one-vm_2"));
        assert!(!valid_name(""));
        assert!(!valid_name("-x"));
        assert!(!valid_name("a b"));
        assert!(!valid_name("a/b"));
        assert!(!valid_name(&"x".repeat(33)));
    }

    #[test]
    fn subnet_octet_in_range() {
        for l in ["a", "b", "one-vm", "scale-vms"] {
            let o = default_subnet_octet(l);
            assert!((1..=250).contains(&o));
        }
    }
}
