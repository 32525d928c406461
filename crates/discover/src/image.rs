//! Backing files named inside qcow2 image headers, for disks whose command
//! line does not spell out the chain (`-drive file=top.qcow2`).
//!
//! Only the fixed header is read: magic `QFI\xfb`, then at byte 8 the
//! big-endian offset and at byte 16 the length of the backing file name.
//! A relative name is relative to the directory of the image naming it.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

const QCOW_MAGIC: &[u8; 4] = b"QFI\xfb";
/// QEMU refuses backing file names longer than 1023 bytes.
const MAX_NAME: u32 = 1023;
const MAX_DEPTH: usize = 16;

/// The backing file named in a qcow2 header, `None` for other files,
/// unreadable files and images without a backing file.
pub fn qcow2_backing(path: &Path) -> Option<PathBuf> {
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_file() {
        return None;
    }
    let mut f = File::open(path).ok()?;
    let mut hdr = [0u8; 20];
    f.read_exact(&mut hdr).ok()?;
    if &hdr[0..4] != QCOW_MAGIC {
        return None;
    }
    let off = u64::from_be_bytes(hdr[8..16].try_into().ok()?);
    let len = u32::from_be_bytes(hdr[16..20].try_into().ok()?);
    if off == 0 || len == 0 || len > MAX_NAME || off > meta.len() {
        return None;
    }
    f.seek(SeekFrom::Start(off)).ok()?;
    let mut name = vec![0u8; len as usize];
    f.read_exact(&mut name).ok()?;
    let name = String::from_utf8(name).ok()?;
    // Network backing files (`nbd://...`, `json:{...}`) are kept as written.
    let p = PathBuf::from(&name);
    if p.is_absolute() || name.contains(':') {
        return Some(p);
    }
    Some(path.parent().map_or(p.clone(), |d| d.join(&p)))
}

/// The backing chain of an image, nearest first; `open` maps a path as
/// QEMU sees it to one readable here (e.g. through `/proc/PID/root`).
pub fn qcow2_chain(path: &Path, open: impl Fn(&Path) -> PathBuf) -> Vec<PathBuf> {
    let mut chain: Vec<PathBuf> = Vec::new();
    let mut cur = path.to_path_buf();
    while chain.len() < MAX_DEPTH {
        let Some(b) = qcow2_backing(&open(&cur)) else {
            break;
        };
        if chain.contains(&b) || b == path {
            break;
        }
        chain.push(b.clone());
        cur = b;
    }
    chain
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qcow2(path: &Path, backing: Option<&str>) {
        let mut h = vec![0u8; 512];
        h[0..4].copy_from_slice(QCOW_MAGIC);
        h[4..8].copy_from_slice(&3u32.to_be_bytes());
        if let Some(b) = backing {
            h[8..16].copy_from_slice(&112u64.to_be_bytes());
            h[16..20].copy_from_slice(&(b.len() as u32).to_be_bytes());
            h[112..112 + b.len()].copy_from_slice(b.as_bytes());
        }
        std::fs::write(path, h).expect("write image");
    }

    #[test]
    fn follows_relative_and_absolute_backing_names() {
        let d = tempfile::tempdir().expect("tempdir");
        let base = d.path().join("base.qcow2");
        qcow2(&base, None);
        qcow2(&d.path().join("mid.qcow2"), Some("base.qcow2"));
        let mid = d.path().join("mid.qcow2");
        let top = d.path().join("top.qcow2");
        qcow2(&top, Some(mid.to_str().expect("utf8")));
        assert_eq!(
            qcow2_chain(&top, std::path::Path::to_path_buf),
            vec![mid, base]
        );
        // Not a qcow2, missing, and a loop are all harmless.
        let raw = d.path().join("raw.img");
        std::fs::write(&raw, b"plain").expect("write");
        assert!(qcow2_chain(&raw, std::path::Path::to_path_buf).is_empty());
        assert!(qcow2_chain(
            Path::new("/nonexistent.qcow2"),
            std::path::Path::to_path_buf
        )
        .is_empty());
        let lp = d.path().join("loop.qcow2");
        qcow2(&lp, Some("loop.qcow2"));
        assert!(qcow2_chain(&lp, std::path::Path::to_path_buf).is_empty());
    }
}
