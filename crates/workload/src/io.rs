//! The dd-equivalent I/O engine of `vmscope bench io`, run in-process on
//! the host and as `vmscope-agent io` / `vmscope-agent dd` inside guests (one
//! engine for both, so the two sides measure alike).
//!
//! A run is giacobbi2011's dd: `count` sequential positioned writes or reads
//! of `block_size` bytes each, one system call per block, from `offset` on.
//! Modes ([`Mode`]): buffered write with a final `fdatasync` inside the
//! timed part (dd `conv=fdatasync`), buffered write without it, O_DIRECT
//! write and read, and buffered read (the caller drops the caches first:
//! [`drop_caches`]). A run reports the bytes moved, its wall time and the
//! CPU time of the thread that ran it (`getrusage(RUSAGE_THREAD)`).
//!
//! O_DIRECT needs the buffer, the offsets and the block size aligned to
//! the device's logical block size: the buffer here is aligned to 4 KiB
//! (or the file system's own O_DIRECT memory alignment, if larger), and
//! [`inspect`] tells the caller the alignment offsets need. busybox
//! `dd iflag=direct` reads into an unaligned heap buffer; the kernel
//! refuses that with EINVAL and busybox quietly falls back to buffered
//! reads (66 requests for 8 MiB of "direct" 512-byte reads when measured),
//! which is why the guest runs this engine and not busybox dd.
//!
//! [`inspect`] also says what a target is before anything touches it: its
//! size, whether a file system on it (or on one of its partitions) is
//! mounted, whether it holds a partition table or a file system signature,
//! the free space for a file to grow into. The safety rules built on that
//! live with the callers (`vmscope_bench::io`), which check every target
//! before the first byte is written.

use serde::{Deserialize, Serialize};
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Smallest alignment of the I/O buffer: enough for every logical block size.
const ALIGN: usize = 4096;

/// Errors of the engine; each names the file and what was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum IoError {
    /// The run was asked for something it cannot do (before any I/O).
    #[error("{path}: {message}")]
    Invalid { path: String, message: String },
    /// Opening the target failed.
    #[error("cannot open {path}: {source}")]
    Open { path: String, source: io::Error },
    /// A read, write or sync failed part-way.
    #[error("{path}: {op} at offset {offset}: {source}{hint}")]
    Io {
        path: String,
        op: &'static str,
        offset: u64,
        source: io::Error,
        hint: String,
    },
}

impl IoError {
    fn invalid(path: &Path, message: impl Into<String>) -> IoError {
        IoError::Invalid {
            path: path.display().to_string(),
            message: message.into(),
        }
    }
}

/// What a run does. Names as on the command line (`direct-read`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Buffered writes, then `fdatasync` inside the timed part: giacobbi's
    /// "Write 1GB" (dd `conv=fdatasync`).
    BufferedWrite,
    /// Buffered writes only: what lands in the page cache (plain dd).
    BufferedWriteNosync,
    /// O_DIRECT writes (dd `oflag=direct`).
    DirectWrite,
    /// O_DIRECT reads (dd `iflag=direct`).
    DirectRead,
    /// Buffered reads; the caller drops the page cache before the run.
    BufferedRead,
}

impl Mode {
    /// Every mode, in the order tables and charts show them.
    pub const ALL: [Mode; 5] = [
        Mode::BufferedWrite,
        Mode::BufferedWriteNosync,
        Mode::DirectWrite,
        Mode::DirectRead,
        Mode::BufferedRead,
    ];

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Mode::BufferedWrite => "buffered-write",
            Mode::BufferedWriteNosync => "buffered-write-nosync",
            Mode::DirectWrite => "direct-write",
            Mode::DirectRead => "direct-read",
            Mode::BufferedRead => "buffered-read",
        }
    }

    /// What the mode does, in dd's words.
    pub fn describe(self) -> &'static str {
        match self {
            Mode::BufferedWrite => "buffered write + final fdatasync (dd conv=fdatasync)",
            Mode::BufferedWriteNosync => "buffered write, no final sync (dd)",
            Mode::DirectWrite => "O_DIRECT write (dd oflag=direct)",
            Mode::DirectRead => "O_DIRECT read (dd iflag=direct)",
            Mode::BufferedRead => "buffered read after dropping caches (dd)",
        }
    }

    pub fn parse(s: &str) -> Option<Mode> {
        Mode::ALL.into_iter().find(|m| m.name() == s)
    }

    pub fn writes(self) -> bool {
        matches!(
            self,
            Mode::BufferedWrite | Mode::BufferedWriteNosync | Mode::DirectWrite
        )
    }

    pub fn direct(self) -> bool {
        matches!(self, Mode::DirectWrite | Mode::DirectRead)
    }

    /// Whether the timed part ends with `fdatasync`.
    pub fn syncs(self) -> bool {
        self == Mode::BufferedWrite
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IoSpec {
    pub path: PathBuf,
    pub mode: Mode,
    /// Bytes per system call.
    pub block_size: u64,
    /// System calls (blocks); a read stops early at the end of the file.
    pub count: u64,
    /// Byte offset of the first block.
    pub offset: u64,
    /// Create the file if it is missing (dd `of=`); `bench io` never does.
    pub create: bool,
}

/// What a run did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IoRun {
    pub path: String,
    pub mode: Mode,
    pub block_size: u64,
    pub offset: u64,
    /// Full blocks moved.
    pub blocks: u64,
    /// Short reads (the last one, at the end of the file).
    pub partial: u64,
    pub bytes: u64,
    /// Wall time of the I/O, the final sync included (open and close not).
    pub wall_s: f64,
    /// The part of `wall_s` spent in the final `fdatasync`.
    pub sync_s: f64,
    /// CPU time of the thread that ran the I/O, over the same span.
    pub user_s: f64,
    pub sys_s: f64,
}

impl IoRun {
    /// Throughput in bytes per second (base unit).
    pub fn bytes_per_s(&self) -> f64 {
        self.bytes as f64 / self.wall_s.max(1e-9)
    }

    /// The engine's own CPU seconds (user + system).
    pub fn cpu_s(&self) -> f64 {
        self.user_s + self.sys_s
    }
}

/// A zeroed heap buffer with at least [`ALIGN`] alignment, freed on drop.
struct Aligned {
    ptr: *mut u8,
    layout: Layout,
}

impl Aligned {
    fn new(len: usize, align: usize) -> io::Result<Aligned> {
        let layout = Layout::from_size_align(len.max(1), align.max(ALIGN))
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(io::Error::new(
                io::ErrorKind::OutOfMemory,
                format!("cannot allocate a {len}-byte buffer"),
            ));
        }
        // Touch every page now, in order (as fio does when it fills its
        // buffers): the first O_DIRECT request pays no page faults, and
        // pages faulted in sequence tend to be physically adjacent, so a
        // 1 MiB request fits a virtio disk's segment limit (254 on the lab's
        // guests) as one request instead of two; untouched, the split
        // varied from run to run.
        // SAFETY: ptr holds layout.size() bytes we own.
        unsafe { std::ptr::write_bytes(ptr, 0, layout.size()) };
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

/// CPU time of the calling thread (user, system), seconds.
pub fn thread_cpu() -> (f64, f64) {
    // SAFETY: getrusage writes into the zeroed struct we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_THREAD with a valid out pointer has no other preconditions.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &raw mut ru) };
    if rc != 0 {
        return (0.0, 0.0);
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    (tv(ru.ru_utime), tv(ru.ru_stime))
}

/// Largest block size a run accepts (dd's own limit is far higher; one
/// buffer of this size is allocated per run).
pub const MAX_BLOCK_SIZE: u64 = 64 << 20;

/// Runs `spec`: `count` positioned writes or reads of `block_size` bytes.
/// Errors name the file; an O_DIRECT EINVAL says what the kernel wants.
pub fn run(spec: &IoSpec) -> Result<IoRun, IoError> {
    let path = spec.path.as_path();
    let bs = spec.block_size;
    if bs == 0 || bs > MAX_BLOCK_SIZE {
        return Err(IoError::invalid(
            path,
            format!("block size {bs} is outside 1 byte..64 MiB"),
        ));
    }
    if spec.mode.direct() && (!bs.is_multiple_of(512) || !spec.offset.is_multiple_of(512)) {
        return Err(IoError::invalid(
            path,
            format!(
                "O_DIRECT needs a block size and offset that are multiples of the logical \
                 block size (512 or more), not bs {bs} at offset {}",
                spec.offset
            ),
        ));
    }
    let mut opts = OpenOptions::new();
    if spec.mode.writes() {
        opts.write(true).create(spec.create);
    } else {
        opts.read(true);
    }
    if spec.mode.direct() {
        opts.custom_flags(libc::O_DIRECT);
    }
    let file = opts.open(path).map_err(|source| IoError::Open {
        path: path.display().to_string(),
        source,
    })?;
    let mem_align = dio_mem_align(&file).unwrap_or(ALIGN as u64) as usize;
    let mut buf = Aligned::new(bs as usize, mem_align).map_err(|source| IoError::Io {
        path: path.display().to_string(),
        op: "allocate",
        offset: 0,
        source,
        hint: String::new(),
    })?;
    let buf = buf.as_mut_slice();
    let mut out = IoRun {
        path: path.display().to_string(),
        mode: spec.mode,
        block_size: bs,
        offset: spec.offset,
        blocks: 0,
        partial: 0,
        bytes: 0,
        wall_s: 0.0,
        sync_s: 0.0,
        user_s: 0.0,
        sys_s: 0.0,
    };
    let io_err = |op: &'static str, offset: u64, source: io::Error| {
        let hint = if spec.mode.direct() && source.raw_os_error() == Some(libc::EINVAL) {
            format!(
                "; O_DIRECT was refused: the block size ({bs}) and offsets must be multiples \
                 of the device's logical block size"
            )
        } else {
            String::new()
        };
        IoError::Io {
            path: path.display().to_string(),
            op,
            offset,
            source,
            hint,
        }
    };
    let (u0, s0) = thread_cpu();
    let t0 = Instant::now();
    let mut offset = spec.offset;
    if spec.mode.writes() {
        for _ in 0..spec.count {
            let mut done = 0usize;
            while done < buf.len() {
                match file.write_at(&buf[done..], offset + done as u64) {
                    Ok(0) => {
                        return Err(io_err(
                            "write",
                            offset + done as u64,
                            io::Error::new(
                                io::ErrorKind::WriteZero,
                                "wrote 0 bytes (device full?)",
                            ),
                        ))
                    }
                    Ok(n) => done += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(io_err("write", offset + done as u64, e)),
                }
            }
            out.blocks += 1;
            out.bytes += bs;
            offset += bs;
        }
        if spec.mode.syncs() {
            let ts = Instant::now();
            file.sync_data()
                .map_err(|e| io_err("fdatasync", offset, e))?;
            out.sync_s = ts.elapsed().as_secs_f64();
        }
    } else {
        while out.blocks + out.partial < spec.count {
            let n = match file.read_at(buf, offset) {
                Ok(n) => n,
                // A signal before any byte: the same read again.
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(io_err("read", offset, e)),
            };
            if n == 0 {
                break;
            }
            if n as u64 == bs {
                out.blocks += 1;
            } else {
                out.partial += 1;
            }
            out.bytes += n as u64;
            offset += n as u64;
            if (n as u64) < bs {
                break;
            }
        }
    }
    out.wall_s = t0.elapsed().as_secs_f64();
    let (u1, s1) = thread_cpu();
    out.user_s = (u1 - u0).max(0.0);
    out.sys_s = (s1 - s0).max(0.0);
    Ok(out)
}

/// The memory alignment O_DIRECT wants for this open file (statx
/// `STATX_DIOALIGN`, Linux 6.1+), if the kernel says.
fn dio_mem_align(file: &File) -> Option<u64> {
    use std::os::fd::AsRawFd;
    statx_dio(file.as_raw_fd()).map(|(mem, _)| mem)
}

/// `(memory alignment, offset alignment)` for O_DIRECT from statx.
fn statx_dio(fd: i32) -> Option<(u64, u64)> {
    // SAFETY: statx writes into the zeroed struct we own; the empty path
    // with AT_EMPTY_PATH makes it describe the open descriptor.
    let mut sx: libc::statx = unsafe { std::mem::zeroed() };
    let rc = unsafe {
        libc::statx(
            fd,
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            &raw mut sx,
        )
    };
    if rc != 0 || sx.stx_mask & libc::STATX_DIOALIGN == 0 || sx.stx_dio_offset_align == 0 {
        return None;
    }
    Some((
        u64::from(sx.stx_dio_mem_align),
        u64::from(sx.stx_dio_offset_align),
    ))
}

/// Writes zeros over `[offset, offset + len)` in 1 MiB blocks and syncs,
/// so later reads hit allocated blocks (not holes of a sparse file) and
/// later writes do not allocate. Untimed preparation, not a measurement.
pub fn fill(path: &Path, offset: u64, len: u64) -> Result<IoRun, IoError> {
    const CHUNK: u64 = 1 << 20;
    let full = len / CHUNK;
    let mut total = run(&IoSpec {
        path: path.to_path_buf(),
        mode: Mode::BufferedWrite,
        block_size: CHUNK,
        count: full,
        offset,
        create: false,
    })?;
    let rest = len % CHUNK;
    if rest > 0 {
        let r = run(&IoSpec {
            path: path.to_path_buf(),
            mode: Mode::BufferedWrite,
            block_size: rest,
            count: 1,
            offset: offset + full * CHUNK,
            create: false,
        })?;
        total.bytes += r.bytes;
        total.wall_s += r.wall_s;
    }
    Ok(total)
}

/// `sync`, then drop the page cache, dentries and inodes
/// (`/proc/sys/vm/drop_caches` = 3). Needs root.
pub fn drop_caches() -> io::Result<()> {
    drop_caches_at(Path::new("/proc"))
}

/// [`drop_caches`] with another proc root (tests).
pub fn drop_caches_at(proc_root: &Path) -> io::Result<()> {
    // SAFETY: sync has no preconditions.
    unsafe { libc::sync() };
    let p = proc_root.join("sys/vm/drop_caches");
    std::fs::write(&p, b"3\n")
        .map_err(|e| io::Error::new(e.kind(), format!("cannot write {}: {e}", p.display())))
}

/// What a target is, found without writing to it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TargetInfo {
    pub path: String,
    pub exists: bool,
    /// `file`, `block`, `directory` or `other`.
    pub kind: String,
    /// Bytes (a file's length, a device's capacity).
    pub size: u64,
    /// Alignment O_DIRECT needs for offsets and block sizes.
    pub logical_block: u64,
    /// Bytes a file has allocated (holes excluded).
    pub allocated: u64,
    /// Free bytes on the file system holding a file (for its holes to fill).
    pub free: Option<u64>,
    /// Why the target must not be written at all: a mounted file system on
    /// it or one of its partitions, swap, a holder (LVM, RAID), a mount point.
    pub in_use: Option<String>,
    /// A partition table or file system signature found on it.
    pub signature: Option<String>,
    /// For files: the file system type and device holding them.
    pub fs_type: Option<String>,
    pub fs_device: Option<String>,
    /// For block devices: `major:minor`.
    pub devno: Option<String>,
    /// For loop devices: the backing file.
    pub loop_backing: Option<String>,
    /// Why it could not be opened for reading, if it could not.
    pub open_error: Option<String>,
}

/// One line of `/proc/self/mountinfo`.
#[derive(Debug, Clone, PartialEq)]
pub struct Mount {
    pub devno: (u32, u32),
    pub mount_point: String,
    pub fs_type: String,
    pub source: String,
}

/// Parses `/proc/self/mountinfo` text (octal escapes in paths decoded).
pub fn parse_mountinfo(text: &str) -> Vec<Mount> {
    let unescape = |s: &str| -> String {
        let b = s.as_bytes();
        let mut out = Vec::with_capacity(b.len());
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(u8::is_ascii_digit) {
                let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
                out.push(v);
                i += 4;
            } else {
                out.push(b[i]);
                i += 1;
            }
        }
        String::from_utf8_lossy(&out).into_owned()
    };
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let (maj, min) = f.get(2)?.split_once(':')?;
            let sep = f.iter().position(|x| *x == "-")?;
            Some(Mount {
                devno: (maj.parse().ok()?, min.parse().ok()?),
                mount_point: unescape(f.get(4)?),
                fs_type: f.get(sep + 1)?.to_string(),
                source: unescape(f.get(sep + 2)?),
            })
        })
        .collect()
}

fn major_minor(dev: u64) -> (u32, u32) {
    (libc::major(dev), libc::minor(dev))
}

/// Looks at `path` without writing to it. A missing path is not an error:
/// `exists` is false.
pub fn inspect(path: &Path) -> TargetInfo {
    inspect_at(path, Path::new("/proc"), Path::new("/sys"))
}

/// [`inspect`] with other proc and sys roots (tests).
pub fn inspect_at(path: &Path, proc_root: &Path, sys_root: &Path) -> TargetInfo {
    let mut info = TargetInfo {
        path: path.display().to_string(),
        logical_block: 512,
        ..Default::default()
    };
    let Ok(meta) = std::fs::metadata(path) else {
        info.kind = "missing".into();
        return info;
    };
    info.exists = true;
    let mounts = std::fs::read_to_string(proc_root.join("self/mountinfo"))
        .map(|t| parse_mountinfo(&t))
        .unwrap_or_default();
    let ft = meta.file_type();
    if ft.is_dir() {
        info.kind = "directory".into();
        let canon = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        if let Some(m) = mounts
            .iter()
            .find(|m| Path::new(&m.mount_point) == canon.as_path())
        {
            info.in_use = Some(format!(
                "a mounted file system ({} on {}, {})",
                m.source, m.mount_point, m.fs_type
            ));
        }
        return info;
    }
    if ft.is_file() {
        info.kind = "file".into();
        info.size = meta.len();
        info.allocated = meta.blocks() * 512;
        let dev = major_minor(meta.dev());
        if let Some(m) = mounts.iter().find(|m| m.devno == dev) {
            info.fs_type = Some(m.fs_type.clone());
            info.fs_device = Some(m.source.clone());
        }
        info.free = free_bytes(path);
        let opened = File::open(path);
        if let Err(e) = &opened {
            info.open_error = Some(e.to_string());
        }
        if let Ok(f) = opened {
            use std::os::fd::AsRawFd;
            if let Some((_, off)) = statx_dio(f.as_raw_fd()) {
                info.logical_block = off;
            } else if let Some(lbs) = sysfs_logical_block(sys_root, dev) {
                info.logical_block = lbs;
            }
        }
        info.signature = read_head(path).and_then(|h| signature(&h));
        return info;
    }
    if ft.is_block_device() {
        info.kind = "block".into();
        let dev = major_minor(meta.rdev());
        info.devno = Some(format!("{}:{}", dev.0, dev.1));
        let opened = File::open(path);
        if let Err(e) = &opened {
            info.open_error = Some(e.to_string());
        }
        if let Ok(mut f) = opened {
            use std::os::fd::AsRawFd;
            info.size = f.seek(SeekFrom::End(0)).unwrap_or(0);
            let mut lbs: libc::c_int = 0;
            // SAFETY: BLKSSZGET writes one int through the pointer we own.
            let rc = unsafe { libc::ioctl(f.as_raw_fd(), libc::BLKSSZGET, &mut lbs) };
            if rc == 0 && lbs > 0 {
                info.logical_block = lbs as u64;
            } else if let Some(l) = sysfs_logical_block(sys_root, dev) {
                info.logical_block = l;
            }
        }
        info.in_use = device_in_use(path, dev, &mounts, proc_root, sys_root);
        info.signature = read_head(path).and_then(|h| signature(&h));
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        info.loop_backing = std::fs::read_to_string(
            sys_root.join(format!("dev/block/{}:{}/loop/backing_file", dev.0, dev.1)),
        )
        .ok()
        .map(|s| s.trim().to_string())
        .or_else(|| {
            std::fs::read_to_string(sys_root.join(format!("block/{name}/loop/backing_file")))
                .ok()
                .map(|s| s.trim().to_string())
        });
        return info;
    }
    info.kind = "other".into();
    info
}

/// Bytes an ordinary writer can still allocate on the file system of
/// `path` (`f_bavail`: blocks reserved for root are not counted on).
fn free_bytes(path: &Path) -> Option<u64> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs writes into the zeroed struct we own; c is a valid C string.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::statvfs(c.as_ptr(), &raw mut s) };
    (rc == 0).then(|| s.f_bavail as u64 * s.f_frsize as u64)
}

/// `queue/logical_block_size` of a device or of the disk a partition is on.
fn sysfs_logical_block(sys_root: &Path, dev: (u32, u32)) -> Option<u64> {
    let base = sys_root.join(format!("dev/block/{}:{}", dev.0, dev.1));
    for p in [
        base.join("queue/logical_block_size"),
        base.join("../queue/logical_block_size"),
    ] {
        if let Some(v) = std::fs::read_to_string(&p)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            return Some(v);
        }
    }
    None
}

/// Why a block device must not be written: a mounted file system on it or
/// on one of its partitions, swap on it, or a holder (device-mapper, RAID).
fn device_in_use(
    path: &Path,
    dev: (u32, u32),
    mounts: &[Mount],
    proc_root: &Path,
    sys_root: &Path,
) -> Option<String> {
    let base = sys_root.join(format!("dev/block/{}:{}", dev.0, dev.1));
    // The device and its partitions (subdirectories with a `partition` file).
    let mut devs = vec![dev];
    if let Ok(rd) = std::fs::read_dir(&base) {
        for e in rd.flatten() {
            if e.path().join("partition").is_file() {
                if let Some((a, b)) =
                    std::fs::read_to_string(e.path().join("dev"))
                        .ok()
                        .and_then(|s| {
                            let (a, b) = s.trim().split_once(':')?;
                            Some((a.parse().ok()?, b.parse().ok()?))
                        })
                {
                    devs.push((a, b));
                }
            }
        }
    }
    let canon = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    for m in mounts {
        // Only absolute sources name devices (`proc`, `tmpfs` would resolve
        // against the working directory).
        let same_source = m.source.starts_with('/')
            && std::fs::canonicalize(&m.source).is_ok_and(|s| {
                s == canon
                    || std::fs::metadata(&s)
                        .ok()
                        .filter(|md| md.file_type().is_block_device())
                        .is_some_and(|md| devs.contains(&major_minor(md.rdev())))
            });
        if devs.contains(&m.devno) || same_source {
            return Some(format!(
                "a mounted file system ({} on {}, {})",
                m.source, m.mount_point, m.fs_type
            ));
        }
    }
    if let Ok(swaps) = std::fs::read_to_string(proc_root.join("swaps")) {
        for l in swaps.lines().skip(1) {
            if let Some(p) = l.split_whitespace().next() {
                if std::fs::canonicalize(p).is_ok_and(|s| s == canon) {
                    return Some("active swap".into());
                }
            }
        }
    }
    if let Ok(rd) = std::fs::read_dir(base.join("holders")) {
        let holders: Vec<String> = rd
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        if !holders.is_empty() {
            return Some(format!("held by {}", holders.join(", ")));
        }
    }
    None
}

/// Bytes of a target's head that [`signature`] looks at.
pub const HEAD_BYTES: usize = 65_600 + 8;

fn read_head(path: &Path) -> Option<Vec<u8>> {
    let mut f = File::open(path).ok()?;
    let mut buf = vec![0u8; HEAD_BYTES];
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    buf.truncate(n);
    Some(buf)
}

/// A partition table or file system signature at the start of a device or
/// image, as blkid would name it; `None` for zeros or unknown data.
pub fn signature(head: &[u8]) -> Option<String> {
    let at = |off: usize, magic: &[u8]| head.get(off..off + magic.len()) == Some(magic);
    if at(512, b"EFI PART") {
        return Some("a GPT partition table".into());
    }
    if at(0, b"QFI\xfb") {
        return Some("a qcow2 image".into());
    }
    if at(0, b"LUKS\xba\xbe") {
        return Some("a LUKS header".into());
    }
    if at(512, b"LABELONE") || at(24, b"LVM2 001") {
        return Some("an LVM physical volume".into());
    }
    if at(1080, &[0x53, 0xef]) {
        return Some("an ext2/3/4 file system".into());
    }
    if at(0, b"XFSB") {
        return Some("an XFS file system".into());
    }
    if at(65_600, b"_BHRfS_M") {
        return Some("a btrfs file system".into());
    }
    if at(4086, b"SWAPSPACE2") || at(4086, b"SWAP-SPACE") {
        return Some("a swap area".into());
    }
    if at(0, b"hsqs") {
        return Some("a squashfs file system".into());
    }
    if at(32_769, b"CD001") {
        return Some("an ISO 9660 file system".into());
    }
    if at(510, &[0x55, 0xaa]) {
        if at(54, b"FAT") || at(82, b"FAT32") {
            return Some("a FAT file system".into());
        }
        if at(3, b"NTFS    ") {
            return Some("an NTFS file system".into());
        }
        return Some("an MBR partition table".into());
    }
    None
}

/// Parses a dd-style size: a number with an optional suffix `c` (1), `w`
/// (2), `b` (512), `k`/`K`/`KiB` (1024), `kB` (1000), `M`/`MiB`, `MB`,
/// `G`/`GiB`, `GB`, `T`/`TiB`, `TB`.
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
        "k" | "K" | "KiB" | "Ki" => 1 << 10,
        "kB" | "KB" => 1000,
        "M" | "MiB" | "Mi" => 1 << 20,
        "MB" => 1_000_000,
        "G" | "GiB" | "Gi" => 1 << 30,
        "GB" => 1_000_000_000,
        "T" | "TiB" | "Ti" => 1 << 40,
        "TB" => 1_000_000_000_000,
        other => return Err(format!("unknown size suffix `{other}` in `{text}`")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("`{text}` is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512").unwrap(), 512);
        assert_eq!(parse_size("4k").unwrap(), 4096);
        assert_eq!(parse_size("4KiB").unwrap(), 4096);
        assert_eq!(parse_size("1b").unwrap(), 512);
        assert_eq!(parse_size("2kB").unwrap(), 2000);
        assert_eq!(parse_size("1M").unwrap(), 1 << 20);
        assert_eq!(parse_size("16G").unwrap(), 16 << 30);
        assert!(parse_size("4q").unwrap_err().contains("suffix"));
        assert!(parse_size("x").is_err());
        assert!(parse_size("99999999999999G")
            .unwrap_err()
            .contains("too large"));
    }

    #[test]
    fn modes_round_trip() {
        for m in Mode::ALL {
            assert_eq!(Mode::parse(m.name()), Some(m));
            let j = serde_json::to_string(&m).unwrap();
            assert_eq!(j, format!("\"{}\"", m.name()));
        }
        assert!(Mode::BufferedWrite.syncs() && !Mode::BufferedWriteNosync.syncs());
        assert!(Mode::DirectRead.direct() && !Mode::DirectRead.writes());
        assert_eq!(Mode::parse("read"), None);
    }

    fn temp(name: &str, len: usize) -> PathBuf {
        let p = std::env::temp_dir().join(format!("vmscope-io-{name}-{}", std::process::id()));
        std::fs::write(&p, vec![7u8; len]).unwrap();
        p
    }

    #[test]
    fn writes_then_reads_blocks_and_stops_at_the_end() {
        let path = temp("rw", 10_000);
        let w = run(&IoSpec {
            path: path.clone(),
            mode: Mode::BufferedWrite,
            block_size: 4096,
            count: 3,
            offset: 0,
            create: false,
        })
        .unwrap();
        assert_eq!((w.blocks, w.bytes), (3, 12_288));
        assert!(w.wall_s >= w.sync_s && w.sync_s >= 0.0);
        // Zeros were written over the 7s, and the file grew to 3 blocks.
        let data = std::fs::read(&path).unwrap();
        assert_eq!(data.len(), 12_288);
        assert!(data.iter().all(|&b| b == 0));
        std::fs::write(&path, vec![1u8; 10_000]).unwrap();
        let r = run(&IoSpec {
            path: path.clone(),
            mode: Mode::BufferedRead,
            block_size: 4096,
            count: 10,
            offset: 0,
            create: false,
        })
        .unwrap();
        assert_eq!((r.blocks, r.partial, r.bytes), (2, 1, 10_000));
        let r = run(&IoSpec {
            path: path.clone(),
            mode: Mode::BufferedRead,
            block_size: 4096,
            count: 1,
            offset: 4096,
            create: false,
        })
        .unwrap();
        assert_eq!((r.blocks, r.partial, r.bytes), (1, 0, 4096));
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn direct_io_round_trips_on_a_real_file() {
        // O_DIRECT works on the file systems tests run on (ext4, xfs, tmpfs
        // on new kernels); where it does not, the error must say so.
        let path = temp("direct", 1 << 20);
        let spec = |mode| IoSpec {
            path: path.clone(),
            mode,
            block_size: 64 << 10,
            count: 16,
            offset: 0,
            create: false,
        };
        match run(&spec(Mode::DirectWrite)) {
            Ok(w) => {
                assert_eq!(w.bytes, 1 << 20);
                let r = run(&spec(Mode::DirectRead)).unwrap();
                assert_eq!((r.blocks, r.bytes), (16, 1 << 20));
                assert!(r.cpu_s() >= 0.0 && r.bytes_per_s() > 0.0);
            }
            Err(e) => assert!(e.to_string().contains(&path.display().to_string()), "{e}"),
        }
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn bad_runs_name_the_file() {
        let e = run(&IoSpec {
            path: PathBuf::from("/nonexistent/dev"),
            mode: Mode::DirectRead,
            block_size: 4096,
            count: 1,
            offset: 0,
            create: false,
        })
        .unwrap_err();
        assert!(e.to_string().contains("/nonexistent/dev"), "{e}");
        let e = run(&IoSpec {
            path: PathBuf::from("/dev/null"),
            mode: Mode::DirectRead,
            block_size: 100,
            count: 1,
            offset: 0,
            create: false,
        })
        .unwrap_err();
        assert!(e.to_string().contains("multiples"), "{e}");
        let e = run(&IoSpec {
            path: PathBuf::from("/dev/null"),
            mode: Mode::BufferedRead,
            block_size: 0,
            count: 1,
            offset: 0,
            create: false,
        })
        .unwrap_err();
        assert!(e.to_string().contains("block size"), "{e}");
    }

    #[test]
    fn fill_writes_the_region() {
        let path = temp("fill", 0);
        // A sparse 3.5 MiB file: fill allocates it.
        File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(3 * (1 << 20) + 512 * 1024)
            .unwrap();
        let r = fill(&path, 0, 3 * (1 << 20) + 512 * 1024).unwrap();
        assert_eq!(r.bytes, 3 * (1 << 20) + 512 * 1024);
        let i = inspect(&path);
        assert!(i.allocated >= i.size, "{i:?}");
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn signatures() {
        let mut h = vec![0u8; HEAD_BYTES];
        assert_eq!(signature(&h), None);
        h[510] = 0x55;
        h[511] = 0xaa;
        assert_eq!(signature(&h).unwrap(), "an MBR partition table");
        h[512..520].copy_from_slice(b"EFI PART");
        assert_eq!(signature(&h).unwrap(), "a GPT partition table");
        let mut e = vec![0u8; 2048];
        e[1080] = 0x53;
        e[1081] = 0xef;
        assert!(signature(&e).unwrap().contains("ext2/3/4"));
        assert!(signature(b"QFI\xfb....").unwrap().contains("qcow2"));
        assert_eq!(signature(&[]), None);
    }

    #[test]
    fn mountinfo_lines() {
        let m = parse_mountinfo(
            "22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n\
             30 22 0:26 / /mnt/with\\040space rw - tmpfs tmpfs rw,size=1024k\n\
             garbage\n",
        );
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].devno, (254, 0));
        assert_eq!(m[0].fs_type, "ext4");
        assert_eq!(m[0].source, "/dev/vda");
        assert_eq!(m[1].mount_point, "/mnt/with space");
    }

    #[test]
    fn inspect_files_directories_and_missing_paths() {
        let path = temp("inspect", 8192);
        let i = inspect(&path);
        assert!(i.exists);
        assert_eq!((i.kind.as_str(), i.size), ("file", 8192));
        assert!(i.logical_block >= 512 && i.logical_block.is_power_of_two());
        assert!(i.free.is_some() && i.fs_type.is_some(), "{i:?}");
        assert_eq!(i.signature, None);
        std::fs::remove_file(&path).unwrap();
        let i = inspect(&path);
        assert!(!i.exists);
        assert_eq!(i.kind, "missing");
        // `/` is a directory and a mount point.
        let i = inspect(Path::new("/"));
        assert_eq!(i.kind, "directory");
        assert!(i.in_use.unwrap_or_default().contains("mounted"));
    }

    #[test]
    fn thread_cpu_moves() {
        let (u0, s0) = thread_cpu();
        let mut x = 0u64;
        let t = Instant::now();
        while t.elapsed().as_millis() < 30 {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let (u1, s1) = thread_cpu();
        assert!(u1 + s1 > u0 + s0);
    }
}
