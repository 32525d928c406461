//! Sizes and rates, kept straight (giacobbi2011 §1.2): sizes parse like
//! dd (`k`, `M`, `G` are powers of 1024; `kB`, `MB`, `GB` powers of 1000;
//! `KiB`, `MiB`, `GiB` also accepted), rows store bytes and bytes/s, and
//! printed rates say MiB/s (2^20 bytes/s) or MB/s (10^6 bytes/s), never
//! a bare "M".

pub use vmscope_workload::io::parse_size;

/// Bytes per MiB and per MB.
pub const MIB: f64 = 1_048_576.0;
pub const MB: f64 = 1_000_000.0;
pub const GIB: f64 = 1_073_741_824.0;

/// bytes/s → MiB/s.
pub fn mib_s(bytes_per_s: f64) -> f64 {
    bytes_per_s / MIB
}

/// bytes/s → MB/s.
pub fn mb_s(bytes_per_s: f64) -> f64 {
    bytes_per_s / MB
}

/// A list of sizes: comma-separated sizes or ranges `A..B`, where a range
/// is every power of two from A to B (both powers of two). Sorted, without
/// duplicates. `what` names the option in errors.
pub fn parse_size_list(text: &str, what: &str) -> Result<Vec<u64>, String> {
    let mut out = Vec::new();
    for item in text.split(',').map(str::trim) {
        if item.is_empty() {
            return Err(format!("{what} `{text}` has an empty item"));
        }
        if let Some((a, b)) = item.split_once("..") {
            let a = parse_size(a).map_err(|e| format!("{what}: {e}"))?;
            let b = parse_size(b).map_err(|e| format!("{what}: {e}"))?;
            if !a.is_power_of_two() || !b.is_power_of_two() {
                return Err(format!(
                    "{what} range `{item}` must run between powers of two (such as 512..1M)"
                ));
            }
            if a > b {
                return Err(format!("{what} range `{item}` runs backwards"));
            }
            let mut x = a;
            while x <= b {
                out.push(x);
                x *= 2;
            }
        } else {
            let n = parse_size(item).map_err(|e| format!("{what}: {e}"))?;
            if n == 0 {
                return Err(format!("{what} `{item}` is zero"));
            }
            out.push(n);
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// Bytes as the largest exact IEC unit: `512 B`, `4 KiB`, `1 MiB`, `1 GiB`
/// (or plain bytes when no unit divides them).
pub fn iec(bytes: u64) -> String {
    for (shift, unit) in [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{} {unit}", bytes >> shift);
        }
    }
    format!("{bytes} B")
}

/// The paper's compact labels for axes and table rows: `512`, `4ki`,
/// `1Mi`, `16Gi`.
pub fn short_iec(bytes: u64) -> String {
    for (shift, unit) in [(40, "Ti"), (30, "Gi"), (20, "Mi"), (10, "ki")] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_and_ranges() {
        assert_eq!(
            parse_size_list("512..4k", "--bs").unwrap(),
            vec![512, 1024, 2048, 4096]
        );
        assert_eq!(
            parse_size_list("1M, 4k,4k,64k", "--bs").unwrap(),
            vec![4096, 65536, 1 << 20]
        );
        assert_eq!(parse_size_list("1G", "--size").unwrap(), vec![1 << 30]);
        assert_eq!(parse_size_list("1M..16G", "--size").unwrap().len(), 15);
        for (bad, why) in [
            ("", "empty"),
            ("1M..4k", "backwards"),
            ("3k..1M", "powers of two"),
            ("0", "zero"),
            ("4x", "suffix"),
            ("4k,,8k", "empty"),
        ] {
            let e = parse_size_list(bad, "--bs").unwrap_err();
            assert!(e.contains(why) && e.contains("--bs"), "{bad}: {e}");
        }
    }

    #[test]
    fn labels_and_rates() {
        assert_eq!(iec(512), "512 B");
        assert_eq!(iec(4096), "4 KiB");
        assert_eq!(iec(1 << 20), "1 MiB");
        assert_eq!(iec(3 << 30), "3 GiB");
        assert_eq!(iec(1500), "1500 B");
        assert_eq!(short_iec(512), "512");
        assert_eq!(short_iec(1024), "1ki");
        assert_eq!(short_iec(1 << 20), "1Mi");
        assert!((mib_s(1_048_576.0) - 1.0).abs() < 1e-12);
        assert!((mb_s(1_048_576.0) - 1.048576).abs() < 1e-12);
    }
}
