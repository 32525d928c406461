//! Records synthesized from a (rooted) `/proc` tree: the names, threads and
//! executable mappings of processes that existed before recording started, so
//! their samples resolve like those of processes seen starting.

use super::{parse_maps_line, ProcRoot};
use std::sync::Arc;
use vmscope_model::Record;

/// perf's name for anonymous executable memory.
const ANON_PATH: &str = "//anon";

/// Comm and Mmap records for the processes and threads under `proc`.
/// `pids = None` takes every process. Per process: one `Comm` per thread
/// (`exec = false`), then one `Mmap` per executable mapping
/// (`executable = true`, anonymous ones named `//anon`). Records carry
/// `time = 0`: they describe state from before the first recorded event.
/// Processes that vanish while being read are skipped.
pub fn synthesize_from_proc(proc: &ProcRoot, pids: Option<&[u32]>) -> Vec<Record> {
    let mut list: Vec<u32> = match pids {
        Some(p) => p.to_vec(),
        None => proc.pids().unwrap_or_default(),
    };
    list.sort_unstable();
    list.dedup();
    let mut out = Vec::new();
    for pid in list {
        synthesize_process(proc, pid, &mut out);
    }
    out
}

fn synthesize_process(proc: &ProcRoot, pid: u32, out: &mut Vec<Record>) {
    let Ok(pcomm) = proc.comm(pid) else {
        return;
    };
    let pcomm: Arc<str> = Arc::from(pcomm);
    let mut tids = proc.tids(pid).unwrap_or_default();
    if !tids.contains(&pid) {
        tids.insert(0, pid);
    }
    for tid in tids {
        let comm = if tid == pid {
            pcomm.clone()
        } else {
            match proc.thread_comm(pid, tid) {
                Ok(c) => Arc::from(c),
                Err(_) => continue,
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
    if let Ok(maps) = proc.maps(pid) {
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
