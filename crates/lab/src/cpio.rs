//! A small writer of `newc` cpio archives (the initramfs format).
//!
//! Written here rather than running `cpio -o -H newc` because the archive
//! must be reproducible (fixed mtimes, inode numbers and owners, so the
//! image's content hash is stable), must hold device nodes and root-owned
//! files without staging a tree on disk as root, and is also produced at
//! `lab up` time for the per-VM overlay of extra files (the kernel unpacks
//! concatenated archives in order, later entries winning).

/// Kinds of archive entries.
#[derive(Debug, Clone)]
enum Kind {
    Dir,
    File(Vec<u8>),
    Symlink(String),
    CharDev(u32, u32),
}

/// An in-memory newc archive.
#[derive(Debug, Default, Clone)]
pub struct Cpio {
    entries: Vec<(String, u32, Kind)>,
}

impl Cpio {
    pub fn new() -> Self {
        Self::default()
    }

    /// A directory; `path` without a leading slash.
    pub fn dir(&mut self, path: &str, mode: u32) -> &mut Self {
        self.entries.push((clean(path), mode & 0o7777, Kind::Dir));
        self
    }

    /// A regular file.
    pub fn file(&mut self, path: &str, mode: u32, data: Vec<u8>) -> &mut Self {
        self.entries
            .push((clean(path), mode & 0o7777, Kind::File(data)));
        self
    }

    /// A symbolic link.
    pub fn symlink(&mut self, path: &str, target: &str) -> &mut Self {
        self.entries
            .push((clean(path), 0o777, Kind::Symlink(target.to_string())));
        self
    }

    /// A character device node.
    pub fn char_dev(&mut self, path: &str, mode: u32, major: u32, minor: u32) -> &mut Self {
        self.entries
            .push((clean(path), mode & 0o7777, Kind::CharDev(major, minor)));
        self
    }

    /// Add every missing parent directory of `path` (mode 0755).
    pub fn parents(&mut self, path: &str) -> &mut Self {
        let p = clean(path);
        let mut acc = String::new();
        let parts: Vec<&str> = p.split('/').collect();
        for part in &parts[..parts.len().saturating_sub(1)] {
            if !acc.is_empty() {
                acc.push('/');
            }
            acc.push_str(part);
            if !self.entries.iter().any(|(n, _, _)| *n == acc) {
                self.dir(&acc.clone(), 0o755);
            }
        }
        self
    }

    /// Serialize, ending with the `TRAILER!!!` entry.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for (i, (name, perm, kind)) in self.entries.iter().enumerate() {
            let (ftype, data, rdev): (u32, &[u8], (u32, u32)) = match kind {
                Kind::Dir => (0o040000, &[], (0, 0)),
                Kind::File(d) => (0o100000, d, (0, 0)),
                Kind::Symlink(t) => (0o120000, t.as_bytes(), (0, 0)),
                Kind::CharDev(a, b) => (0o020000, &[], (*a, *b)),
            };
            let nlink = if matches!(kind, Kind::Dir) { 2 } else { 1 };
            header(
                &mut out,
                i as u32 + 1,
                ftype | perm,
                nlink,
                data.len(),
                rdev,
                name,
            );
            out.extend_from_slice(data);
            pad4(&mut out);
        }
        header(&mut out, 0, 0, 1, 0, (0, 0), "TRAILER!!!");
        out
    }
}

fn clean(path: &str) -> String {
    path.trim_start_matches('/')
        .trim_end_matches('/')
        .to_string()
}

fn pad4(out: &mut Vec<u8>) {
    while out.len() % 4 != 0 {
        out.push(0);
    }
}

fn header(
    out: &mut Vec<u8>,
    ino: u32,
    mode: u32,
    nlink: u32,
    size: usize,
    rdev: (u32, u32),
    name: &str,
) {
    let fields = [
        ino,
        mode,
        0, // uid
        0, // gid
        nlink,
        0, // mtime
        size as u32,
        0, // devmajor
        0, // devminor
        rdev.0,
        rdev.1,
        name.len() as u32 + 1,
        0, // check
    ];
    out.extend_from_slice(b"070701");
    for f in fields {
        out.extend_from_slice(format!("{f:08x}").as_bytes());
    }
    out.extend_from_slice(name.as_bytes());
    out.push(0);
    pad4(out);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_newc() {
        let mut c = Cpio::new();
        c.dir("/bin", 0o755).file("bin/x", 0o755, b"hello".to_vec());
        let b = c.to_bytes();
        assert_eq!(&b[..6], b"070701");
        assert_eq!(b.len() % 4, 0);
        // Second header starts 4-aligned after "bin\0" (110 + 4 = 114 -> 116).
        assert_eq!(&b[116..122], b"070701");
        assert!(b.windows(10).any(|w| w == b"TRAILER!!!"));
        assert!(b.windows(5).any(|w| w == b"hello"));
    }

    #[test]
    fn parents_are_added_once() {
        let mut c = Cpio::new();
        c.parents("/a/b/c/file").parents("a/b/other");
        let names: Vec<_> = c.entries.iter().map(|e| e.0.clone()).collect();
        assert_eq!(names, vec!["a", "a/b", "a/b/c"]);
    }

    #[test]
    fn cpio_tool_reads_it() {
        let Some(cpio) = crate::util::which("cpio") else {
            vmscope_testkit::skip("cpio not installed (apt-get install cpio)");
            return;
        };
        let mut c = Cpio::new();
        c.dir("d", 0o755)
            .file("d/f", 0o640, b"data\n".to_vec())
            .symlink("d/l", "f")
            .char_dev("console", 0o600, 5, 1);
        let dir = tempfile::tempdir().unwrap();
        let arc = dir.path().join("a.cpio");
        std::fs::write(&arc, c.to_bytes()).unwrap();
        let out = std::process::Command::new(cpio)
            .args(["-t", "-v", "-F"])
            .arg(&arc)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let listing = String::from_utf8_lossy(&out.stdout);
        assert!(listing.contains("d/f"), "{listing}");
        assert!(listing.contains("-rw-r-----"), "{listing}");
        assert!(listing.contains("d/l -> f"), "{listing}");
        assert!(listing.contains("crw-------"), "{listing}");
    }
}
