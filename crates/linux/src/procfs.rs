//! Records synthesized from a (rooted) `/proc` tree: the names, threads and
//! executable mappings of processes that existed before recording started, so
//! their samples resolve like those of processes seen starting.

use std::path::Path;
use std::sync::Arc;
use vmscope_model::Record;

/// perf's name for anonymous executable memory.
const ANON_PATH: &str = "//anon";

/// Comm and Mmap records for the processes and threads under `proc_root`
/// (normally `/proc`). `pids = None` takes every process. Per process: one
/// `Comm` per thread (`exec = false`), then one `Mmap` per executable mapping
/// (`executable = true`, anonymous ones named `//anon`). Records carry
/// `time = 0`: they describe state from before the first recorded event.
/// Processes that vanish while being read are skipped.
pub fn synthesize_from_proc(proc_root: &Path, pids: Option<&[u32]>) -> Vec<Record> {
    let mut list: Vec<u32> = match pids {
        Some(p) => p.to_vec(),
        None => match std::fs::read_dir(proc_root) {
            Ok(rd) => rd
                .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
                .collect(),
            Err(_) => Vec::new(),
        },
    };
    list.sort_unstable();
    list.dedup();
    let mut out = Vec::new();
    for pid in list {
        synthesize_process(proc_root, pid, &mut out);
    }
    out
}

fn read_comm(path: &Path) -> Option<Arc<str>> {
    let s = std::fs::read_to_string(path).ok()?;
    Some(Arc::from(s.trim_end_matches('\n')))
}

fn synthesize_process(proc_root: &Path, pid: u32, out: &mut Vec<Record>) {
    let dir = proc_root.join(pid.to_string());
    let Some(pcomm) = read_comm(&dir.join("comm")) else {
        return;
    };
    let mut tids: Vec<u32> = std::fs::read_dir(dir.join("task"))
        .map(|rd| {
            rd.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
                .collect()
        })
        .unwrap_or_default();
    tids.sort_unstable();
    if !tids.contains(&pid) {
        tids.insert(0, pid);
    }
    for tid in tids {
        let comm = if tid == pid {
            pcomm.clone()
        } else {
            match read_comm(&dir.join("task").join(tid.to_string()).join("comm")) {
                Some(c) => c,
                None => continue,
            }
        };
        out.push(Record::Comm {
            pid,
            tid,
            comm,
            exec: false,
            time: 0,
        });
    }
    if let Ok(maps) = std::fs::read_to_string(dir.join("maps")) {
        for line in maps.lines() {
            if let Some(m) = parse_maps_line(line) {
                if !m.exec || m.path == "[vsyscall]" {
                    continue;
                }
                let path: Arc<str> = if m.path.is_empty() {
                    Arc::from(ANON_PATH)
                } else {
                    Arc::from(m.path)
                };
                out.push(Record::Mmap {
                    pid,
                    tid: pid,
                    start: m.start,
                    len: m.end.saturating_sub(m.start),
                    pgoff: m.offset,
                    path,
                    build_id: None,
                    executable: true,
                    time: 0,
                });
            }
        }
    }
}

/// One line of `/proc/PID/maps`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct MapsLine<'a> {
    pub start: u64,
    pub end: u64,
    pub exec: bool,
    pub offset: u64,
    pub path: &'a str,
}

/// Parse `start-end perms offset dev inode [path]`; the path may contain
/// spaces and is everything after the inode column.
pub(crate) fn parse_maps_line(line: &str) -> Option<MapsLine<'_>> {
    let mut rest = line;
    let mut field = || {
        let t = rest.trim_start_matches(' ');
        let end = t.find(' ').unwrap_or(t.len());
        let (f, r) = t.split_at(end);
        rest = r;
        f
    };
    let range = field();
    let perms = field();
    let offset = field();
    let _dev = field();
    let _inode = field();
    let path = rest.trim_start_matches(' ');
    let (s, e) = range.split_once('-')?;
    Some(MapsLine {
        start: u64::from_str_radix(s, 16).ok()?,
        end: u64::from_str_radix(e, 16).ok()?,
        exec: perms.as_bytes().get(2) == Some(&b'x'),
        offset: u64::from_str_radix(offset, 16).ok()?,
        path,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines() {
        let l = parse_maps_line(
            "55d0c0a00000-55d0c0a21000 r-xp 00002000 08:01 1234      /usr/bin/my prog",
        )
        .unwrap();
        assert_eq!(
            l,
            MapsLine {
                start: 0x55d0c0a00000,
                end: 0x55d0c0a21000,
                exec: true,
                offset: 0x2000,
                path: "/usr/bin/my prog"
            }
        );
        let anon = parse_maps_line("7f0000000000-7f0000001000 rwxp 00000000 00:00 0 ").unwrap();
        assert!(anon.exec);
        assert_eq!(anon.path, "");
        let data = parse_maps_line("7f0000000000-7f0000001000 rw-p 00000000 00:00 0").unwrap();
        assert!(!data.exec);
        assert!(parse_maps_line("garbage").is_none());
        assert!(parse_maps_line("").is_none());
    }
}
