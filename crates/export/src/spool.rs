//! The queue of one exporter's requests, oldest first.
//!
//! A request that is sent at its first try never touches the disk. One
//! that has to wait (its receiver is down, slow or failing, or requests
//! before it still wait) is written to the spool directory, when there is
//! one (`--export-spool DIR`: a directory per exporter, one file per
//! request, `<seq>.req`, named in sending order and written to a temporary
//! name first, then renamed), and stays there until its receiver takes it:
//! `serve` started again sends what a previous run left, first. Without a
//! directory the queue is kept in memory and lost when `serve` stops.
//!
//! The queue is bounded (`--export-spool-max` bytes of request bodies):
//! past it the oldest requests are dropped, and counted, so the newest
//! data is the data kept. A spool file that cannot be written (a full
//! disk) keeps its request in memory, still bounded, and says so; one
//! that cannot be read back is dropped and counted.

use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::io::Write;
use std::path::{Path, PathBuf};

/// One HTTP request an exporter sends (the body POSTed to its URL).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// Appended to the exporter's URL after `?`; empty for none.
    pub query: String,
    pub content_type: String,
    pub content_encoding: Option<String>,
    /// Other headers this request needs.
    pub headers: Vec<(String, String)>,
    #[serde(skip)]
    pub body: Vec<u8>,
    /// What it carries, for log lines (`window 3 of vm/web`).
    pub what: String,
}

#[cfg(test)]
impl Request {
    pub(crate) fn test(body: &[u8]) -> Request {
        Request {
            query: String::new(),
            content_type: "application/octet-stream".into(),
            content_encoding: None,
            headers: Vec::new(),
            body: body.to_vec(),
            what: "a test request".into(),
        }
    }
}

struct Item {
    seq: u64,
    size: u64,
    /// Kept in memory until written (or when it cannot be).
    mem: Option<Request>,
    /// Its spool file, once written.
    file: Option<PathBuf>,
    /// It has waited: written to the spool or, without a directory,
    /// marked as waiting in memory.
    spooled: bool,
}

/// The queue.
pub struct Spool {
    dir: Option<PathBuf>,
    max_bytes: u64,
    items: VecDeque<Item>,
    bytes: u64,
    next_seq: u64,
}

/// What a change to the queue did besides itself.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Effects {
    /// Requests newly written to the spool (or marked waiting).
    pub spooled: u64,
    /// Requests dropped: the oldest past the bound, or unreadable.
    pub dropped: u64,
    /// A spool file that could not be written or read, with why.
    pub problem: Option<String>,
}

const SUFFIX: &str = ".req";

impl Spool {
    /// A queue in `dir` (created; requests a previous run left are queued
    /// first) or in memory.
    pub fn open(dir: Option<&Path>, max_bytes: u64) -> Result<Spool, std::io::Error> {
        let mut s = Spool {
            dir: dir.map(Path::to_path_buf),
            max_bytes,
            items: VecDeque::new(),
            bytes: 0,
            next_seq: 1,
        };
        let Some(dir) = dir else { return Ok(s) };
        std::fs::create_dir_all(dir)?;
        let mut found: Vec<(u64, PathBuf, u64)> = Vec::new();
        for e in std::fs::read_dir(dir)? {
            let e = e?;
            let name = e.file_name().to_string_lossy().into_owned();
            if name.ends_with(".tmp") {
                // A write cut short: never renamed, never complete.
                let _ = std::fs::remove_file(e.path());
                continue;
            }
            let Some(seq) = name
                .strip_suffix(SUFFIX)
                .and_then(|n| n.parse::<u64>().ok())
            else {
                continue;
            };
            let size = e.metadata()?.len();
            found.push((seq, e.path(), size));
        }
        found.sort();
        for (seq, path, size) in found {
            s.bytes += size;
            s.next_seq = s.next_seq.max(seq + 1);
            s.items.push_back(Item {
                seq,
                size,
                mem: None,
                file: Some(path),
                spooled: true,
            });
        }
        Ok(s)
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Bytes queued.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether requests are kept on disk.
    pub fn on_disk(&self) -> bool {
        self.dir.is_some()
    }

    /// Queue a request; `wait` when it will not be tried at once (it is
    /// spooled now).
    pub fn push(&mut self, req: Request, wait: bool) -> Effects {
        let size = req.body.len() as u64;
        let seq = self.next_seq;
        self.next_seq += 1;
        self.bytes += size;
        self.items.push_back(Item {
            seq,
            size,
            mem: Some(req),
            file: None,
            spooled: false,
        });
        let mut fx = Effects::default();
        if wait {
            self.spool_last(&mut fx);
        }
        self.bound(&mut fx);
        fx
    }

    /// Spool every request not yet spooled (the first try failed).
    pub fn spool_all(&mut self) -> Effects {
        let mut fx = Effects::default();
        for i in 0..self.items.len() {
            self.spool_at(i, &mut fx);
        }
        fx
    }

    fn spool_last(&mut self, fx: &mut Effects) {
        if let Some(i) = self.items.len().checked_sub(1) {
            self.spool_at(i, fx);
        }
    }

    fn spool_at(&mut self, i: usize, fx: &mut Effects) {
        let dir = self.dir.clone();
        let item = &mut self.items[i];
        if item.spooled {
            return;
        }
        item.spooled = true;
        fx.spooled += 1;
        let (Some(dir), Some(req)) = (dir, item.mem.as_ref()) else {
            return;
        };
        let path = dir.join(format!("{:020}{SUFFIX}", item.seq));
        match write_file(&path, req) {
            Ok(()) => {
                item.file = Some(path);
                item.mem = None;
            }
            Err(e) => {
                fx.problem = Some(format!(
                    "cannot write {}: {e}: keeping it in memory (at most --export-spool-max)",
                    path.display()
                ));
            }
        }
    }

    /// Drop the oldest while over the bound (the newest always stays).
    fn bound(&mut self, fx: &mut Effects) {
        while self.bytes > self.max_bytes && self.items.len() > 1 {
            self.pop_front();
            fx.dropped += 1;
        }
    }

    /// The oldest request; `Err` with why when its spool file cannot be
    /// read back (it is then dropped: call again for the next).
    pub fn front(&mut self) -> Option<Result<Request, String>> {
        let item = self.items.front()?;
        if let Some(r) = &item.mem {
            return Some(Ok(r.clone()));
        }
        let path = item.file.clone()?;
        match read_file(&path) {
            Ok(r) => Some(Ok(r)),
            Err(e) => {
                self.pop_front();
                Some(Err(format!("{}: {e}: dropped", path.display())))
            }
        }
    }

    /// Remove the oldest (sent, or given up).
    pub fn pop_front(&mut self) {
        if let Some(item) = self.items.pop_front() {
            self.bytes = self.bytes.saturating_sub(item.size);
            if let Some(f) = item.file {
                let _ = std::fs::remove_file(f);
            }
        }
    }
}

fn write_file(path: &Path, req: &Request) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        let head = serde_json::to_vec(req).map_err(std::io::Error::other)?;
        f.write_all(&head)?;
        f.write_all(b"\n")?;
        f.write_all(&req.body)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

fn read_file(path: &Path) -> std::io::Result<Request> {
    let data = std::fs::read(path)?;
    let nl = data
        .iter()
        .position(|&b| b == b'\n')
        .ok_or_else(|| std::io::Error::other("not a spool file (no header line)"))?;
    let mut r: Request = serde_json::from_slice(&data[..nl])
        .map_err(|e| std::io::Error::other(format!("not a spool file: {e}")))?;
    r.body = data[nl + 1..].to_vec();
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiting_requests_outlive_the_process_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Spool::open(Some(dir.path()), 1 << 20).unwrap();
        // Sent at once: never written.
        assert_eq!(s.push(Request::test(b"a"), false), Effects::default());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        // The first try failed: spooled.
        assert_eq!(s.spool_all().spooled, 1);
        assert_eq!(s.push(Request::test(b"b"), true).spooled, 1);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
        drop(s);
        let mut s = Spool::open(Some(dir.path()), 1 << 20).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s.front().unwrap().unwrap().body, b"a");
        s.pop_front();
        // New requests go behind the old ones.
        s.push(Request::test(b"c"), true);
        assert_eq!(s.front().unwrap().unwrap().body, b"b");
        s.pop_front();
        assert_eq!(s.front().unwrap().unwrap().body, b"c");
        s.pop_front();
        assert!(s.is_empty());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn past_the_bound_the_oldest_go() {
        let mut s = Spool::open(None, 10).unwrap();
        let mut dropped = 0;
        for b in [b"0123", b"4567", b"89ab", b"cdef"] {
            dropped += s.push(Request::test(b), true).dropped;
        }
        assert_eq!(dropped, 2);
        assert_eq!(s.bytes(), 8);
        assert_eq!(s.front().unwrap().unwrap().body, b"89ab");
        // One larger than the bound stays alone.
        assert_eq!(s.push(Request::test(&[0; 64]), true).dropped, 2);
        assert_eq!(s.len(), 1);
    }

    #[test]
    fn unreadable_files_are_dropped_and_cut_writes_removed() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("00000000000000000001.req"), b"garbage").unwrap();
        std::fs::write(dir.path().join("00000000000000000002.tmp"), b"half").unwrap();
        let mut s = Spool::open(Some(dir.path()), 1 << 20).unwrap();
        assert_eq!(s.len(), 1);
        assert!(s.front().unwrap().unwrap_err().contains("not a spool file"));
        assert!(s.is_empty());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_full_disk_keeps_requests_in_memory() {
        // /dev/full: every write fails with ENOSPC. A directory whose
        // files cannot be created stands for it here.
        let dir = tempfile::tempdir().unwrap();
        let mut s = Spool::open(Some(dir.path()), 1 << 20).unwrap();
        std::fs::remove_dir(dir.path()).unwrap();
        let fx = s.push(Request::test(b"x"), true);
        assert_eq!(fx.spooled, 1);
        assert!(fx.problem.unwrap().contains("keeping it in memory"));
        assert_eq!(s.front().unwrap().unwrap().body, b"x");
    }
}
