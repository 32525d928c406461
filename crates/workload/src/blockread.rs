//! Block reads at a fixed size, optionally with O_DIRECT: the I/O side of
//! cherkasova2005's experiments (`dd bs=512` vs `bs=4k` on a raw device).
//!
//! busybox `dd iflag=direct` reads into an unaligned heap buffer; the kernel
//! refuses that with EINVAL and busybox quietly falls back to buffered reads,
//! so a 512-byte "direct" dd becomes a handful of large readahead requests
//! (66 requests for 8 MiB when measured). This reader keeps the buffer
//! aligned to 4 KiB so each block really is one request on the virtual disk.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::time::Instant;

/// Alignment of the read buffer: enough for every logical block size.
const ALIGN: usize = 4096;

/// What to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockRead {
    /// Bytes per read (a multiple of 512 with `direct`).
    pub block_size: usize,
    /// Reads to do; fewer when the end of the file comes first.
    pub count: u64,
    /// Blocks to skip at the start.
    pub skip: u64,
    /// Open with O_DIRECT (bypass the page cache).
    pub direct: bool,
}

/// What was read.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockReadStats {
    /// Full blocks read.
    pub full: u64,
    /// Short reads (the last, at the end of the file).
    pub partial: u64,
    pub bytes: u64,
    pub seconds: f64,
}

impl BlockReadStats {
    /// Reads per second.
    pub fn reads_per_s(&self) -> f64 {
        (self.full + self.partial) as f64 / self.seconds.max(1e-9)
    }
}

/// A zeroed heap buffer with [`ALIGN`] alignment, freed on drop.
struct Aligned {
    ptr: *mut u8,
    layout: Layout,
}

impl Aligned {
    fn new(len: usize) -> io::Result<Aligned> {
        let layout = Layout::from_size_align(len.max(1), ALIGN)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(io::Error::new(
                io::ErrorKind::OutOfMemory,
                format!("cannot allocate a {len}-byte buffer"),
            ));
        }
        Ok(Aligned { ptr, layout })
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: ptr points to layout.size() initialized (zeroed) bytes
        // owned by self, and &mut self makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.layout.size()) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: ptr was allocated with this layout and is freed once.
        unsafe { dealloc(self.ptr, self.layout) }
    }
}

/// Reads `spec.count` blocks of `spec.block_size` from `path`, one
/// positioned read each, and discards them. Errors name the file and, for
/// O_DIRECT, what the kernel wants.
pub fn read_blocks(path: &Path, spec: &BlockRead) -> io::Result<BlockReadStats> {
    let bs = spec.block_size;
    if bs == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "block size must be above 0",
        ));
    }
    if spec.direct && !bs.is_multiple_of(512) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("O_DIRECT reads need a block size that is a multiple of 512, not {bs}"),
        ));
    }
    let mut opts = OpenOptions::new();
    opts.read(true);
    if spec.direct {
        opts.custom_flags(libc::O_DIRECT);
    }
    let file = opts
        .open(path)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot open {}: {e}", path.display())))?;
    let mut buf = Aligned::new(bs)?;
    let buf = buf.as_mut_slice();
    let mut stats = BlockReadStats {
        full: 0,
        partial: 0,
        bytes: 0,
        seconds: 0.0,
    };
    let t0 = Instant::now();
    let mut offset = spec.skip.saturating_mul(bs as u64);
    while stats.full + stats.partial < spec.count {
        let n = match file.read_at(buf, offset) {
            Ok(n) => n,
            // A signal before any byte: the same read again.
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if spec.direct && e.raw_os_error() == Some(libc::EINVAL) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!(
                        "{}: O_DIRECT read of {bs} bytes at offset {offset} refused ({e}); \
                         the block size must be a multiple of the device's logical block size",
                        path.display()
                    ),
                ))
            }
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("{}: read at offset {offset}: {e}", path.display()),
                ))
            }
        };
        if n == 0 {
            break;
        }
        if n == bs {
            stats.full += 1;
        } else {
            stats.partial += 1;
        }
        stats.bytes += n as u64;
        offset += n as u64;
        if n < bs {
            break;
        }
    }
    stats.seconds = t0.elapsed().as_secs_f64();
    Ok(stats)
}

/// Parses a dd-style size: a number with an optional suffix `c` (1), `w`
/// (2), `b` (512), `k`/`K`/`KiB` (1024), `kB` (1000), `M`/`MiB`, `MB`, `G`/`GiB`, `GB`.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| {
        format!("`{text}` is not a size (a number with an optional suffix such as 512, 4k, 1M)")
    })?;
    let mult: u64 = match suffix {
        "" | "c" => 1,
        "w" => 2,
        "b" => 512,
        "k" | "K" | "KiB" => 1 << 10,
        "kB" | "KB" => 1000,
        "M" | "MiB" => 1 << 20,
        "MB" => 1_000_000,
        "G" | "GiB" => 1 << 30,
        "GB" => 1_000_000_000,
        other => return Err(format!("unknown size suffix `{other}` in `{text}`")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("`{text}` is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512").unwrap(), 512);
        assert_eq!(parse_size("4k").unwrap(), 4096);
        assert_eq!(parse_size("1b").unwrap(), 512);
        assert_eq!(parse_size("2kB").unwrap(), 2000);
        assert_eq!(parse_size("1M").unwrap(), 1 << 20);
        assert!(parse_size("4q").unwrap_err().contains("suffix"));
        assert!(parse_size("x").is_err());
        assert!(parse_size("99999999999999G")
            .unwrap_err()
            .contains("too large"));
    }

    #[test]
    fn reads_blocks_and_stops_at_the_end() {
        let (path, mut file) = temp_file();
        file.write_all(&[7u8; 10_000]).unwrap();
        let spec = BlockRead {
            block_size: 4096,
            count: 10,
            skip: 0,
            direct: false,
        };
        let s = read_blocks(&path, &spec).unwrap();
        assert_eq!((s.full, s.partial, s.bytes), (2, 1, 10_000));
        let s = read_blocks(
            &path,
            &BlockRead {
                skip: 1,
                count: 1,
                ..spec.clone()
            },
        )
        .unwrap();
        assert_eq!((s.full, s.partial, s.bytes), (1, 0, 4096));
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn direct_needs_sector_multiples_and_names_the_file() {
        let e = read_blocks(
            Path::new("/nonexistent/dev"),
            &BlockRead {
                block_size: 4096,
                count: 1,
                skip: 0,
                direct: true,
            },
        )
        .unwrap_err();
        assert!(e.to_string().contains("/nonexistent/dev"), "{e}");
        let e = read_blocks(
            Path::new("/dev/null"),
            &BlockRead {
                block_size: 100,
                count: 1,
                skip: 0,
                direct: true,
            },
        )
        .unwrap_err();
        assert!(e.to_string().contains("multiple of 512"), "{e}");
    }

    fn temp_file() -> (std::path::PathBuf, std::fs::File) {
        let p = std::env::temp_dir().join(format!("vmscope-blockread-{}", std::process::id()));
        let f = std::fs::File::create(&p).unwrap();
        (p, f)
    }
}
