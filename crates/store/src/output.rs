//! Output safety (docs/architecture.md §7.1): every file a vmscope command
//! writes goes through this module, so no command can clobber what is not
//! its own.
//!
//! - [`check_output`] decides whether a path may be written: it must be
//!   absent, or a regular file that the kind of output may replace (a
//!   session replaces only an empty file or a vmscope session; any other
//!   artifact replaces only an empty file or one vmscope wrote: its
//!   [`MARK_XATTR`] extended attribute still matches its content, or it
//!   carries [`MARKER`] (SVG, HTML) or a PNG text chunk naming vmscope as
//!   its software). `force` lifts the content rule, never
//!   the file-type rule: devices, FIFOs, sockets and directories are refused
//!   always (renaming over `/dev/null` destroys the device node, and a
//!   session cannot live in a pipe). The output may never be one of the
//!   command's inputs, compared by device and inode, not by name. A symbolic
//!   link is followed: the file it points to is replaced, the link stays.
//! - [`SessionOutput`] writes a session atomically: it takes the one-writer
//!   lock (`TARGET.lock`, an `flock` holding the writer's pid and command
//!   line) before anything is touched, writes `TARGET.partial` (readable
//!   while it grows, and kept when a recorder is killed or the disk fills),
//!   and on success checkpoints the WAL and renames the partial over the
//!   target, so the previous session stays intact until the new one is
//!   complete.
//! - [`AtomicFile`] (and [`write_artifact`]) writes any other output to a
//!   temporary file beside the target and renames it on success.
//! - [`partial_note`] and [`writer_of`] tell a reader that a recording into
//!   a session is under way or was cut short.

use crate::{Result, SessionWriter, StoreError};
use rusqlite::{Connection, OpenFlags};
use std::fs::{File, Metadata, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// What a command writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputKind {
    /// A vmscope session (SQLite): replaces only an empty file or a session.
    Session,
    /// Any other file (SVG, HTML, pprof, CSV, JSON, text, PNG): replaces an
    /// empty file or one vmscope wrote (see the module docs).
    Artifact,
}

/// How an output may be written.
#[derive(Debug, Clone, Default)]
pub struct OutputOptions {
    /// `--force`: replace a regular file whatever it holds. Never lets a
    /// device, FIFO, socket or directory be replaced, nor an input.
    pub force: bool,
    /// Files the command reads: the output may not be one of them.
    pub inputs: Vec<PathBuf>,
}

impl OutputOptions {
    /// Options with `force` and the given inputs.
    pub fn new(force: bool, inputs: &[&Path]) -> OutputOptions {
        OutputOptions {
            force,
            inputs: inputs.iter().map(|p| p.to_path_buf()).collect(),
        }
    }
}

/// What an existing regular file holds, as far as replacing it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Content {
    Empty,
    Session,
    /// An SQLite database without vmscope's tables.
    OtherSqlite,
    PerfData,
    Elf,
    /// A file with an execute bit (a script, say).
    Executable,
    /// A report, chart or profile vmscope wrote (its mark, below).
    Artifact,
    Text,
    Binary,
}

impl Content {
    /// "a text file", "a perf.data file", ...
    pub fn describe(self) -> &'static str {
        match self {
            Content::Empty => "an empty file",
            Content::Session => "a vmscope session",
            Content::OtherSqlite => "an SQLite database that is not a vmscope session",
            Content::PerfData => "a perf.data file",
            Content::Elf => "an ELF binary",
            Content::Executable => "an executable file",
            Content::Artifact => "a file vmscope wrote",
            Content::Text => "a text file",
            Content::Binary => "a binary file",
        }
    }

    fn replaceable_by(self, kind: OutputKind) -> bool {
        match kind {
            OutputKind::Session => matches!(self, Content::Empty | Content::Session),
            OutputKind::Artifact => matches!(self, Content::Empty | Content::Artifact),
        }
    }
}

/// An output path that passed [`check_output`].
#[derive(Debug, Clone)]
pub struct CheckedOutput {
    /// The path as the user gave it (for messages).
    pub given: PathBuf,
    /// Where the file is written: `given` with symbolic links followed.
    pub path: PathBuf,
    /// What the existing file holds, if there is one.
    pub replaces: Option<Content>,
    /// Permission bits of the existing file (kept by the replacement).
    mode: Option<u32>,
}

fn refused(given: &Path, reason: impl Into<String>) -> StoreError {
    StoreError::OutputRefused {
        path: given.to_path_buf(),
        reason: reason.into(),
    }
}

/// Follow symbolic links of the last component (at most 40, like the kernel).
fn resolve_links(given: &Path) -> Result<PathBuf> {
    let mut p = given.to_path_buf();
    for _ in 0..40 {
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                let target = std::fs::read_link(&p)
                    .map_err(|e| refused(given, format!("is a link that cannot be read: {e}")))?;
                p = if target.is_absolute() {
                    target
                } else {
                    p.parent().unwrap_or(Path::new("")).join(target)
                };
            }
            _ => return Ok(p),
        }
    }
    Err(refused(given, "too many levels of symbolic links"))
}

fn parent_of(p: &Path) -> &Path {
    match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// What kind of non-regular file `m` is, if it is one.
pub fn special_kind(m: &Metadata) -> Option<&'static str> {
    let t = m.file_type();
    if t.is_dir() {
        Some("a directory")
    } else if t.is_char_device() {
        Some("a character device")
    } else if t.is_block_device() {
        Some("a block device")
    } else if t.is_fifo() {
        Some("a FIFO (named pipe)")
    } else if t.is_socket() {
        Some("a socket")
    } else if !t.is_file() {
        Some("not a regular file")
    } else {
        None
    }
}

/// Classify an existing regular file by its first bytes.
pub fn classify(path: &Path, m: &Metadata) -> Content {
    if m.len() == 0 {
        return Content::Empty;
    }
    let mut head = vec![0u8; 4096];
    let n = File::open(path)
        .and_then(|mut f| {
            let mut n = 0;
            while n < head.len() {
                match f.read(&mut head[n..])? {
                    0 => break,
                    k => n += k,
                }
            }
            Ok(n)
        })
        .unwrap_or(0);
    let head = &head[..n];
    if head.starts_with(b"SQLite format 3\0") {
        return if is_vmscope_session(path) {
            Content::Session
        } else {
            Content::OtherSqlite
        };
    }
    if head.starts_with(b"PERFILE2")
        || head.starts_with(b"2ELIFREP")
        || head.starts_with(b"PERFFILE")
    {
        // One vmscope wrote (`perf record` run by a benchmark, marked when
        // it ended) and nobody changed since is its artifact.
        return if has_mark(path) == Mark::Valid {
            Content::Artifact
        } else {
            Content::PerfData
        };
    }
    if head.starts_with(b"\x7fELF") {
        return Content::Elf;
    }
    if m.permissions().mode() & 0o111 != 0 {
        return Content::Executable;
    }
    if has_mark(path) == Mark::Valid || carries_marker(head) {
        return Content::Artifact;
    }
    let text = !head.contains(&0)
        && match std::str::from_utf8(head) {
            Ok(_) => true,
            // A multi-byte character cut by the 4 KiB window is still text.
            Err(e) => e.error_len().is_none() && head.len() - e.valid_up_to() < 4,
        };
    if text {
        Content::Text
    } else {
        Content::Binary
    }
}

/// The extended attribute that marks a file vmscope wrote as an artifact:
/// `v1 LENGTH CRC32` of its content as written. A file whose content no
/// longer matches (edited since) is the user's, and is not replaced
/// without `--force`.
pub const MARK_XATTR: &str = "user.vmscope.output";

/// The text SVG and HTML outputs carry near their start, so that they are
/// known as vmscope's where a file system keeps no extended attributes (or
/// a copy lost them): `<!-- generated by vmscope ... -->`.
pub const MARKER: &str = "generated by vmscope";

/// The PNG text chunk (keyword `Software`) bench charts carry.
pub const PNG_SOFTWARE: &str = "vmscope";

/// Whether the first bytes of a file carry vmscope's marker: the comment of
/// SVG and HTML outputs, or the `Software` text chunk of a PNG chart.
fn carries_marker(head: &[u8]) -> bool {
    let find = |needle: &[u8]| head.windows(needle.len()).any(|w| w == needle);
    if head.starts_with(b"\x89PNG\r\n\x1a\n") {
        let mut chunk = b"Software\0".to_vec();
        chunk.extend_from_slice(PNG_SOFTWARE.as_bytes());
        return find(&chunk);
    }
    find(format!("<!-- {MARKER}").as_bytes())
}

/// What a file's mark says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mark {
    /// Marked, and the content is what vmscope wrote.
    Valid,
    /// Marked, but changed since (or not marked).
    Absent,
    /// The file system keeps no extended attributes.
    Unsupported,
}

/// Length and CRC-32 of a file's content.
fn content_sum(path: &Path) -> std::io::Result<(u64, u32)> {
    let mut f = File::open(path)?;
    let mut h = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut len = 0u64;
    loop {
        match f.read(&mut buf)? {
            0 => break,
            n => {
                h.update(&buf[..n]);
                len += n as u64;
            }
        }
    }
    Ok((len, h.finalize()))
}

fn mark_text(len: u64, crc: u32) -> String {
    format!("v1 {len} {crc:08x}")
}

fn c_path(path: &Path) -> Option<std::ffi::CString> {
    std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).ok()
}

/// Read a file's mark and check it against the content.
fn has_mark(path: &Path) -> Mark {
    let (Some(p), Ok(name)) = (c_path(path), std::ffi::CString::new(MARK_XATTR)) else {
        return Mark::Absent;
    };
    let mut buf = [0u8; 64];
    // SAFETY: valid C strings and a buffer of the given length.
    let n = unsafe {
        libc::getxattr(
            p.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        return match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::ENOTSUP) => Mark::Unsupported,
            _ => Mark::Absent,
        };
    }
    let stored = &buf[..n as usize];
    match content_sum(path) {
        Ok((len, crc)) if stored == mark_text(len, crc).as_bytes() => Mark::Valid,
        _ => Mark::Absent,
    }
}

/// Mark `path` (just written, not yet renamed) as an artifact of vmscope.
/// Best effort: a file system without extended attributes keeps no mark,
/// and then only outputs that carry [`MARKER`] are known as vmscope's.
fn set_mark(path: &Path) {
    let (Some(p), Ok(name), Ok((len, crc))) = (
        c_path(path),
        std::ffi::CString::new(MARK_XATTR),
        content_sum(path),
    ) else {
        return;
    };
    let v = mark_text(len, crc);
    // SAFETY: valid C strings and a buffer of the given length.
    unsafe {
        libc::setxattr(p.as_ptr(), name.as_ptr(), v.as_ptr().cast(), v.len(), 0);
    }
}

/// Mark a file that vmscope had written another way (a child process's
/// log, `perf record`'s perf.data in a benchmark) as its own, so that a
/// later run may replace it while it is unchanged. Best effort.
pub fn mark(path: &Path) {
    set_mark(path);
}

/// Whether an SQLite file has vmscope's tables. Opened read-write (as
/// `report` does) so that closing the last connection removes the `-wal`
/// and `-shm` files a read-only connection would leave behind.
fn is_vmscope_session(path: &Path) -> bool {
    let Ok(conn) = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .or_else(|_| {
        Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
    }) else {
        return false;
    };
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap_or(0);
    let meta: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'meta'",
            [],
            |r| r.get(0),
        )
        .unwrap_or(0);
    version > 0 && meta == 1
}

fn same_file(a: &Metadata, b: &Metadata) -> bool {
    a.dev() == b.dev() && a.ino() == b.ino()
}

/// Whether `path` is the same file as one of `inputs`.
fn is_input<'a>(m: &Metadata, inputs: &'a [PathBuf]) -> Option<&'a PathBuf> {
    inputs
        .iter()
        .find(|i| std::fs::metadata(i).is_ok_and(|im| same_file(m, &im)))
}

/// Decide whether `given` may be written as `kind`; see the module docs.
pub fn check_output(given: &Path, kind: OutputKind, opts: &OutputOptions) -> Result<CheckedOutput> {
    if given.as_os_str().is_empty() {
        return Err(refused(Path::new("''"), "is not a path: give a file name"));
    }
    // What the kernel says the path is, links followed as open(2) follows
    // them: `/dev/stdout` of a command in a pipeline is a pipe, reached
    // through `/proc/self/fd/1`, whose link text (`pipe:[123]`) names no
    // file that could be resolved by hand.
    if let Ok(m) = std::fs::metadata(given) {
        if let Some(what) = special_kind(&m) {
            return Err(refused(
                given,
                format!("is {what}; vmscope writes only regular files (give a file path)"),
            ));
        }
    }
    let path = resolve_links(given)?;
    let dir = parent_of(&path);
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(refused(
                given,
                format!("is in {}, which is not a directory", dir.display()),
            ))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(refused(
                given,
                format!("is in {}, which does not exist", dir.display()),
            ))
        }
        Err(e) => return Err(refused(given, format!("is in {}: {e}", dir.display()))),
    }
    let m = match std::fs::metadata(&path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(CheckedOutput {
                given: given.to_path_buf(),
                path,
                replaces: None,
                mode: None,
            })
        }
        Err(e) => return Err(refused(given, format!("cannot be examined: {e}"))),
    };
    if let Some(what) = special_kind(&m) {
        return Err(refused(
            given,
            format!("is {what}; vmscope writes only regular files (give a file path)"),
        ));
    }
    if let Some(input) = is_input(&m, &opts.inputs) {
        return Err(refused(
            given,
            if input.as_path() == given {
                "is also this command's input; give another output path".to_string()
            } else {
                format!(
                    "is the same file as the input {}; give another output path",
                    input.display()
                )
            },
        ));
    }
    let content = classify(&path, &m);
    if !content.replaceable_by(kind) && !opts.force {
        let what = match kind {
            OutputKind::Session => "not a vmscope session",
            OutputKind::Artifact => "not a file vmscope made",
        };
        // Why an earlier output of a format without a marker (CSV,
        // collapsed stacks, pprof) is not known here.
        let why = if kind == OutputKind::Artifact
            && matches!(content, Content::Text | Content::Binary)
            && has_mark(&path) == Mark::Unsupported
        {
            " (this file system keeps no extended attributes, where vmscope marks what it wrote)"
        } else {
            ""
        };
        return Err(refused(
            given,
            format!(
                "is {}, {what}{why}; refusing to replace it (give another output path, or --force to replace it)",
                content.describe()
            ),
        ));
    }
    Ok(CheckedOutput {
        given: given.to_path_buf(),
        path,
        replaces: Some(content),
        mode: Some(m.permissions().mode() & 0o7777),
    })
}

/// `TARGET.partial`: where a session is written until it is complete.
pub fn partial_path(target: &Path) -> PathBuf {
    suffixed(target, ".partial")
}

/// `TARGET.lock`: the one-writer lock of a session file.
pub fn lock_path(target: &Path) -> PathBuf {
    suffixed(target, ".lock")
}

fn suffixed(p: &Path, suffix: &str) -> PathBuf {
    let mut s = p.as_os_str().to_os_string();
    s.push(suffix);
    PathBuf::from(s)
}

fn remove_if_present(p: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(p) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Remove a session file and its `-wal` / `-shm` / `-reserve` companions.
fn remove_session_files(p: &Path) {
    for s in ["", "-wal", "-shm", crate::RESERVE_SUFFIX] {
        let _ = remove_if_present(&suffixed(p, s));
    }
}

fn fsync_dir(dir: &Path) {
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

/// The process holding the write lock of session `target`, from the
/// kernel's lock table (`/proc/locks`), so asking never disturbs a writer:
/// (pid, its command line as written in the lock file).
pub fn writer_of(target: &Path) -> Option<(u32, String)> {
    let lock = lock_path(&resolve_links(target).unwrap_or_else(|_| target.to_path_buf()));
    let h = vmscope_linux::files::holder(&lock)?;
    Some((h.pid?, h.command))
}

/// A sentence for a reader of `target` about a recording into it that is
/// under way or was cut short, if there is one.
pub fn partial_note(target: &Path) -> Option<String> {
    let real = resolve_links(target).unwrap_or_else(|_| target.to_path_buf());
    let partial = partial_path(&real);
    let pm = std::fs::metadata(&partial).ok()?;
    if !pm.is_file() || pm.len() == 0 {
        return None;
    }
    if let Some((pid, cmd)) = writer_of(target) {
        let cmd = if cmd.is_empty() {
            String::new()
        } else {
            format!(": {cmd}")
        };
        return Some(format!(
            "a recording into {} is under way (process {pid}{cmd}); what it has stored so far is in {}",
            target.display(),
            partial.display()
        ));
    }
    // A partial older than the session is left from before it; say so only
    // when it is the newer of the two (or the session is missing).
    if let Ok(tm) = std::fs::metadata(&real) {
        if tm.modified().ok() >= pm.modified().ok() {
            return None;
        }
    }
    Some(format!(
        "a partial recording (its writer was killed or failed) is in {}",
        partial.display()
    ))
}

/// The one-writer lock of a session: `flock` on `TARGET.lock`, which holds
/// the writer's pid and command line. Removed when dropped.
#[derive(Debug)]
pub struct WriterLock {
    _lock: vmscope_linux::files::PidLock,
}

impl WriterLock {
    /// Take the lock of session `target` (shown as `given`) or fail at once
    /// naming the process that holds it.
    pub fn acquire(target: &Path, given: &Path, command_line: &str) -> Result<WriterLock> {
        let path = lock_path(target);
        match vmscope_linux::files::PidLock::acquire(&path, command_line) {
            Ok(lock) => Ok(WriterLock { _lock: lock }),
            Err(Ok(holder)) => Err(StoreError::Locked {
                path: given.to_path_buf(),
                pid: holder.pid,
                command: holder.command,
            }),
            Err(Err(source)) => Err(StoreError::NotWritable { path, source }),
        }
    }
}

/// A session being written: the checked target, its lock and its partial
/// file. Create it before starting anything, write through
/// [`SessionOutput::create_writer`], and [`SessionOutput::commit`] on success.
/// Dropped without a commit, it removes the partial file unless
/// [`SessionOutput::keep_partial`] asked to keep it (a recording that
/// stored samples and then failed).
#[derive(Debug)]
pub struct SessionOutput {
    checked: CheckedOutput,
    partial: PathBuf,
    force: bool,
    replaced_partial: bool,
    keep_partial: bool,
    committed: bool,
    lock: Option<WriterLock>,
}

impl SessionOutput {
    /// Check `given` as a session output, take its lock (naming
    /// `command_line` as the writer) and make sure its partial file can be
    /// written.
    pub fn prepare(
        given: &Path,
        opts: &OutputOptions,
        command_line: &str,
    ) -> Result<SessionOutput> {
        let checked = check_output(given, OutputKind::Session, opts)?;
        let lock = WriterLock::acquire(&checked.path, given, command_line)?;
        let partial = partial_path(&checked.path);
        let mut replaced_partial = false;
        match std::fs::symlink_metadata(&partial) {
            Ok(m) => {
                let shown = partial.as_path();
                if let Some(what) =
                    special_kind(&m).or(m.file_type().is_symlink().then_some("a symbolic link"))
                {
                    return Err(refused(
                        shown,
                        format!("is {what}, in the way of the session being written"),
                    ));
                }
                if is_input(&m, &opts.inputs).is_some() {
                    return Err(refused(
                        shown,
                        "is this command's input and the name its output is written under first; give another output path",
                    ));
                }
                let c = classify(&partial, &m);
                if !c.replaceable_by(OutputKind::Session) && !opts.force {
                    return Err(refused(
                        shown,
                        format!(
                            "is {}, in the way of the session being written; refusing to replace it (move it, or --force)",
                            c.describe()
                        ),
                    ));
                }
                replaced_partial = c == Content::Session;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // Probe now, so an unwritable directory fails before
                // anything starts, naming the output.
                OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&partial)
                    .map_err(|source| StoreError::NotWritable {
                        path: given.to_path_buf(),
                        source,
                    })?;
                let _ = std::fs::remove_file(&partial);
            }
            Err(source) => {
                return Err(StoreError::NotWritable {
                    path: partial,
                    source,
                })
            }
        }
        Ok(SessionOutput {
            checked,
            partial,
            force: opts.force,
            replaced_partial,
            keep_partial: false,
            committed: false,
            lock: Some(lock),
        })
    }

    /// The output as the user gave it.
    pub fn target(&self) -> &Path {
        &self.checked.given
    }

    /// Where the session is written until it is complete.
    pub fn partial(&self) -> &Path {
        &self.partial
    }

    /// What the target holds now, if it exists.
    pub fn replaces(&self) -> Option<Content> {
        self.checked.replaces
    }

    /// Whether a partial session left by an earlier, unfinished writer is
    /// about to be replaced (worth a line to the user).
    pub fn replaces_partial(&self) -> bool {
        self.replaced_partial
    }

    /// Keep the partial file if the write fails from now on (it holds data
    /// worth reading).
    pub fn keep_partial(&mut self, keep: bool) {
        self.keep_partial = keep;
    }

    /// Start the partial session (replacing an earlier partial file).
    pub fn create_writer(&mut self) -> Result<SessionWriter> {
        SessionWriter::create(&self.partial)
    }

    /// Finish `writer` (marking a clean stop or not), fold its WAL into the
    /// file and put it in place of the target. Returns the target path.
    pub fn commit(mut self, writer: SessionWriter, clean: bool) -> Result<PathBuf> {
        writer.close(clean)?;
        // Whatever appeared at the target meanwhile must still be ours to
        // replace; if not, the complete session stays in the partial file.
        self.keep_partial = true;
        check_output(
            &self.checked.given,
            OutputKind::Session,
            &OutputOptions {
                force: self.force,
                inputs: Vec::new(),
            },
        )?;
        let partial = self.partial.clone();
        let target = self.checked.path.clone();
        if let Some(mode) = self.checked.mode {
            let _ = std::fs::set_permissions(&partial, std::fs::Permissions::from_mode(mode));
        }
        File::open(&partial)
            .and_then(|f| f.sync_all())
            .map_err(|source| StoreError::NotWritable {
                path: partial.clone(),
                source,
            })?;
        // A WAL of the old target must not be applied to the new file.
        for s in ["-wal", "-shm"] {
            let p = suffixed(&target, s);
            remove_if_present(&p).map_err(|source| StoreError::NotWritable { path: p, source })?;
        }
        std::fs::rename(&partial, &target).map_err(|source| StoreError::NotWritable {
            path: self.checked.given.clone(),
            source,
        })?;
        // The WAL was checkpointed and emptied: companions left by a reader
        // that had the partial open hold nothing.
        for s in ["-wal", "-shm"] {
            let _ = remove_if_present(&suffixed(&partial, s));
        }
        fsync_dir(parent_of(&target));
        self.committed = true;
        Ok(self.checked.given.clone())
    }
}

impl Drop for SessionOutput {
    fn drop(&mut self) {
        if !self.committed && !self.keep_partial {
            remove_session_files(&self.partial);
        }
        // The lock goes last, after the files are in their final state.
        self.lock.take();
    }
}

/// A non-session output written to a temporary file beside the target and
/// renamed over it by [`AtomicFile::commit`]; dropped without a commit, the
/// temporary file is removed and the target is untouched.
#[derive(Debug)]
pub struct AtomicFile {
    checked: CheckedOutput,
    tmp: PathBuf,
    file: Option<File>,
}

impl AtomicFile {
    /// Check `given` as an [`OutputKind::Artifact`] and open a temporary file beside it.
    pub fn create(given: &Path, opts: &OutputOptions) -> Result<AtomicFile> {
        let checked = check_output(given, OutputKind::Artifact, opts)?;
        let name = checked
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = parent_of(&checked.path).join(format!(".{name}.{}.tmp", std::process::id()));
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(checked.mode.unwrap_or(0o666))
            .open(&tmp)
            .map_err(|source| StoreError::NotWritable {
                path: given.to_path_buf(),
                source,
            })?;
        Ok(AtomicFile {
            checked,
            tmp,
            file: Some(file),
        })
    }

    /// The file to write to.
    pub fn file(&mut self) -> &mut File {
        self.file.as_mut().expect("AtomicFile used after commit")
    }

    /// Flush, sync and rename over the target. Returns the target as given.
    pub fn commit(mut self) -> Result<PathBuf> {
        let file = self.file.take().expect("AtomicFile committed twice");
        let err = |source| StoreError::NotWritable {
            path: self.checked.given.clone(),
            source,
        };
        file.sync_all().map_err(err)?;
        drop(file);
        set_mark(&self.tmp);
        if let Some(mode) = self.checked.mode {
            let _ = std::fs::set_permissions(&self.tmp, std::fs::Permissions::from_mode(mode));
        }
        std::fs::rename(&self.tmp, &self.checked.path).map_err(err)?;
        fsync_dir(parent_of(&self.checked.path));
        Ok(self.checked.given.clone())
    }
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.file().write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.file().flush()
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if self.file.take().is_some() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Write `bytes` to `given` as an artifact, atomically.
pub fn write_artifact(given: &Path, opts: &OutputOptions, bytes: &[u8]) -> Result<PathBuf> {
    let mut f = AtomicFile::create(given, opts)?;
    f.write_all(bytes)
        .map_err(|source| StoreError::NotWritable {
            path: given.to_path_buf(),
            source,
        })?;
    f.commit()
}

/// "tmpfs at /mnt/tiny, 0 B free of 1.0 MiB": the file system holding `path`.
pub fn describe_fs(path: &Path) -> String {
    let dir = parent_of(path);
    let abs = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let mut best: Option<(String, String)> = None;
    if let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") {
        for line in info.lines() {
            // id parent maj:min root mountpoint opts ... - fstype source superopts
            let f: Vec<&str> = line.split_whitespace().collect();
            let Some(dash) = f.iter().position(|x| *x == "-") else {
                continue;
            };
            let (Some(mp), Some(fs)) = (f.get(4), f.get(dash + 1)) else {
                continue;
            };
            let mp = mp.replace("\\040", " ");
            if abs.starts_with(&mp) && best.as_ref().is_none_or(|b| mp.len() >= b.0.len()) {
                best = Some((mp, (*fs).to_string()));
            }
        }
    }
    let (mount, fstype) = best.unwrap_or_else(|| ("?".into(), "?".into()));
    let mut s = format!("{fstype} mounted at {mount}");
    if let Some((free, total)) = space(&abs) {
        s.push_str(&format!(", {} free of {}", bytes(free), bytes(total)));
    }
    s
}

fn space(dir: &Path) -> Option<(u64, u64)> {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: statvfs fills the zeroed struct from a valid C string path.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &raw mut st) } != 0 {
        return None;
    }
    let unit = st.f_frsize;
    Some((st.f_bavail * unit, st.f_blocks * unit))
}

/// Bytes in binary units: "988.0 KiB".
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Size of a session file with its WAL: what it had grown to.
pub(crate) fn session_bytes(p: &Path) -> u64 {
    ["", "-wal"]
        .iter()
        .filter_map(|s| std::fs::metadata(suffixed(p, s)).ok())
        .map(|m| m.len())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Session;

    fn session(path: &Path) {
        let w = SessionWriter::create(path).unwrap();
        w.close(true).unwrap();
    }

    fn refusal(r: Result<CheckedOutput>) -> String {
        match r {
            Err(e @ StoreError::OutputRefused { .. }) => e.to_string(),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn what_may_be_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let none = OutputOptions::default();
        let force = OutputOptions::new(true, &[]);
        let s = d.join("s.db");
        session(&s);
        let text = d.join("notes.txt");
        std::fs::write(&text, "notes\n").unwrap();
        let empty = d.join("empty");
        std::fs::write(&empty, "").unwrap();
        let perf = d.join("perf.data");
        std::fs::write(&perf, b"PERFILE2\x68\0\0\0\0\0\0\0").unwrap();
        let bin = d.join("bin");
        std::fs::write(&bin, [0u8, 1, 2, 255, 254]).unwrap();

        assert!(check_output(&d.join("new.db"), OutputKind::Session, &none)
            .unwrap()
            .replaces
            .is_none());
        assert_eq!(
            check_output(&s, OutputKind::Session, &none)
                .unwrap()
                .replaces,
            Some(Content::Session)
        );
        assert_eq!(
            check_output(&empty, OutputKind::Session, &none)
                .unwrap()
                .replaces,
            Some(Content::Empty)
        );
        let e = refusal(check_output(&text, OutputKind::Session, &none));
        assert!(e.contains("is a text file") && e.contains("--force"), "{e}");
        assert!(check_output(&text, OutputKind::Session, &force).is_ok());
        assert!(refusal(check_output(&perf, OutputKind::Session, &none)).contains("perf.data"));
        // Artifacts replace only what vmscope wrote: not the user's text or
        // binaries, never sessions or perf.data.
        let e = refusal(check_output(&text, OutputKind::Artifact, &none));
        assert!(
            e.contains("not a file vmscope made") && e.contains("--force"),
            "{e}"
        );
        assert!(refusal(check_output(&bin, OutputKind::Artifact, &none)).contains("binary"));
        assert!(check_output(&text, OutputKind::Artifact, &force).is_ok());
        assert_eq!(
            check_output(&empty, OutputKind::Artifact, &none)
                .unwrap()
                .replaces,
            Some(Content::Empty)
        );
        assert!(refusal(check_output(&s, OutputKind::Artifact, &none)).contains("vmscope session"));
        assert!(refusal(check_output(&perf, OutputKind::Artifact, &none)).contains("perf.data"));
        // Never a device or a directory, --force or not.
        for special in [Path::new("/dev/null"), d] {
            for o in [&none, &force] {
                let e = refusal(check_output(special, OutputKind::Artifact, o));
                assert!(e.contains("writes only regular files"), "{e}");
            }
        }
        // Never an input, by inode: a hard link is the same file.
        let link = d.join("hard");
        std::fs::hard_link(&text, &link).unwrap();
        let o = OutputOptions::new(true, &[&text]);
        assert!(refusal(check_output(&link, OutputKind::Artifact, &o))
            .contains("same file as the input"));
        // A missing directory is named.
        let e = refusal(check_output(&d.join("no/x.db"), OutputKind::Session, &none));
        assert!(e.contains("which does not exist"), "{e}");
    }

    #[test]
    fn a_symbolic_link_is_followed_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real.db");
        session(&real);
        let link = dir.path().join("link.db");
        std::os::unix::fs::symlink("real.db", &link).unwrap();
        let mut out = SessionOutput::prepare(&link, &OutputOptions::default(), "t").unwrap();
        assert_eq!(out.partial(), dir.path().join("real.db.partial"));
        let w = out.create_writer().unwrap();
        w.set_meta("marker", "new").unwrap();
        out.commit(w, true).unwrap();
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(
            Session::open(&real).unwrap().meta().unwrap()["marker"],
            "new"
        );
    }

    #[test]
    fn a_session_is_replaced_only_when_committed() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("s.db");
        let w = SessionWriter::create(&target).unwrap();
        w.set_meta("marker", "old").unwrap();
        w.close(true).unwrap();
        let old = std::fs::read(&target).unwrap();

        // Dropped without a commit: the target stays, the partial goes.
        {
            let mut out = SessionOutput::prepare(&target, &OutputOptions::default(), "t").unwrap();
            let w = out.create_writer().unwrap();
            w.set_meta("marker", "new").unwrap();
            assert!(out.partial().exists());
        }
        assert_eq!(std::fs::read(&target).unwrap(), old);
        assert!(!partial_path(&target).exists());
        assert!(!lock_path(&target).exists());

        // Kept on request, readable, and named to a reader of the target.
        {
            let mut out = SessionOutput::prepare(&target, &OutputOptions::default(), "t").unwrap();
            let w = out.create_writer().unwrap();
            w.set_meta("marker", "partial").unwrap();
            out.keep_partial(true);
        }
        assert_eq!(std::fs::read(&target).unwrap(), old);
        let p = partial_path(&target);
        assert_eq!(
            Session::open(&p).unwrap().meta().unwrap()["marker"],
            "partial"
        );
        let note = partial_note(&target).expect("a note about the partial file");
        assert!(note.contains("s.db.partial"), "{note}");

        // Committed: replaced, no WAL files, no partial, no lock.
        let mut out = SessionOutput::prepare(&target, &OutputOptions::default(), "t").unwrap();
        assert!(out.replaces_partial());
        let w = out.create_writer().unwrap();
        w.set_meta("marker", "new").unwrap();
        out.commit(w, true).unwrap();
        assert_eq!(
            Session::open(&target).unwrap().meta().unwrap()["marker"],
            "new"
        );
        for f in [
            "s.db-wal",
            "s.db-shm",
            "s.db.partial",
            "s.db.partial-wal",
            "s.db.lock",
        ] {
            assert!(!dir.path().join(f).exists(), "{f} left");
        }
        assert!(partial_note(&target).is_none());
    }

    #[test]
    fn one_writer_at_a_time_and_the_other_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("s.db");
        let first = SessionOutput::prepare(&target, &OutputOptions::default(), "vmscope record -a")
            .unwrap();
        let e = SessionOutput::prepare(&target, &OutputOptions::default(), "second").unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains(&format!(
                "process {} (vmscope record -a)",
                std::process::id()
            )),
            "{msg}"
        );
        assert_eq!(writer_of(&target).map(|w| w.0), Some(std::process::id()));
        drop(first);
        assert!(writer_of(&target).is_none());
        assert!(SessionOutput::prepare(&target, &OutputOptions::default(), "third").is_ok());
    }

    #[test]
    fn artifacts_are_written_whole_or_not_at_all() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("flame.svg");
        write_artifact(&p, &OutputOptions::default(), b"old").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        {
            let mut f = AtomicFile::create(&p, &OutputOptions::default()).unwrap();
            f.write_all(b"half").unwrap();
        }
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "old");
        write_artifact(&p, &OutputOptions::default(), b"new").unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "new");
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "a temporary file stayed"
        );
    }

    /// Issue 32 item 2: what vmscope wrote is known by its mark (or, in SVG,
    /// HTML and PNG, by its marker); the same bytes written by anyone else,
    /// or a vmscope output edited since, are not.
    #[test]
    fn earlier_outputs_are_known_positively() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let none = OutputOptions::default();
        let csv = d.join("r.csv");
        write_artifact(&csv, &none, b"domain,samples\nhost,3\n").unwrap();
        match has_mark(&csv) {
            Mark::Unsupported => {
                eprintln!("SKIP: {} keeps no extended attributes", d.display());
                return;
            }
            m => assert_eq!(m, Mark::Valid),
        }
        assert_eq!(
            check_output(&csv, OutputKind::Artifact, &none)
                .unwrap()
                .replaces,
            Some(Content::Artifact)
        );
        // The same bytes written by someone else carry no mark.
        let copy = d.join("copy.csv");
        std::fs::write(&copy, b"domain,samples\nhost,3\n").unwrap();
        assert!(refusal(check_output(&copy, OutputKind::Artifact, &none)).contains("text file"));
        // Edited since it was written: the user's now.
        std::fs::OpenOptions::new()
            .append(true)
            .open(&csv)
            .unwrap()
            .write_all(b"my note\n")
            .unwrap();
        assert!(refusal(check_output(&csv, OutputKind::Artifact, &none)).contains("text file"));
        // A session output never replaces an artifact.
        write_artifact(&csv, &OutputOptions::new(true, &[]), b"x").unwrap();
        assert!(check_output(&csv, OutputKind::Session, &none).is_err());
        // Markers in SVG, HTML and PNG, without any attribute.
        let svg = d.join("f.svg");
        std::fs::write(
            &svg,
            format!("<?xml version=\"1.0\"?>\n<!-- {MARKER} 0.1.0 -->\n<svg/>"),
        )
        .unwrap();
        assert_eq!(
            check_output(&svg, OutputKind::Artifact, &none)
                .unwrap()
                .replaces,
            Some(Content::Artifact)
        );
        let png = d.join("c.png");
        let mut bytes = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
        bytes.extend_from_slice(&[0; 17]);
        bytes.extend_from_slice(b"\0\0\0\x10tEXtSoftware\0vmscope");
        std::fs::write(&png, &bytes).unwrap();
        assert_eq!(
            check_output(&png, OutputKind::Artifact, &none)
                .unwrap()
                .replaces,
            Some(Content::Artifact)
        );
        // A link to the user's file is refused for what it points to.
        let notes = d.join("notes.txt");
        std::fs::write(&notes, "keep\n").unwrap();
        let link = d.join("link.csv");
        std::os::unix::fs::symlink("notes.txt", &link).unwrap();
        assert!(refusal(check_output(&link, OutputKind::Artifact, &none)).contains("text file"));
        assert_eq!(std::fs::read_to_string(&notes).unwrap(), "keep\n");
    }
}
