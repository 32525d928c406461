//! Per-task run time summed in the kernel: a small eBPF program on the
//! `sched:sched_switch` tracepoint adds each closed slice to a hash map
//! keyed by (CPU, tid), and vm-stat drains that map once per interval. The
//! cost to vmscope then follows how many distinct tasks ran, not how many
//! switches happened (no record per switch is copied out) nor how many
//! threads exist (no `/proc` file per thread is read).
//!
//! Hand-assembled (51 instructions, [`program`]) and loaded with the bpf(2)
//! system call, attached with `perf_event_open(PERF_TYPE_TRACEPOINT)` and
//! `PERF_EVENT_IOC_SET_BPF`: this machine has no C-to-BPF compiler and the
//! BPF loader crates on offer need one (or a prebuilt object) at build
//! time; a program this small is shorter to write and review as
//! instructions than the toolchain it would pull in. Field offsets come
//! from the tracepoint's `format` file, as for the ring reader.
//!
//! Maps:
//! - `cur` (array, one slot per possible CPU): when the running task's
//!   slice began (CLOCK_MONOTONIC ns, 0 = no switch seen yet), its tid, and
//!   how many switches did not chain (their `prev_pid` was not the task
//!   last switched in: a switch the program did not see) and how many
//!   slices were dropped because `acc` was full;
//! - `acc` (hash, (cpu, tid) → ns): run time of slices closed since the
//!   last drain (`BPF_MAP_LOOKUP_AND_DELETE_BATCH`).
//!
//! A slice is keyed by the task `cur` says was switched in, not by the
//! tracepoint's `prev_pid`: after a switch the program missed the two
//! differ, and keying by `cur` keeps the reader's carried credit and the
//! closed slice on the same key (the gap goes to one task, never twice).
//! The program adds the closed slice to `acc` before it moves `cur` on, so
//! a reader that sees `cur` move knows the slice is in `acc`. The running
//! slice at a boundary is credited by the reader up to the boundary and
//! carried ([`Carry`]): its part already credited is taken off when it
//! closes. [`account`] is that bookkeeping, pure and tested on hand-built
//! drains.
//!
//! Limits: a slice added while the reader deletes its element in the same
//! instant can be lost (the program holds a pointer to the element for a
//! few instructions); `acc` holds [`acc_entries`] (cpu, tid) pairs per
//! interval, and slices of pairs beyond that are dropped (and counted). The program runs
//! in the switching task's context: its cost is the kernel's, not
//! vmscope's (with `kernel.bpf_stats_enabled=1`, `run_time_ns` in the
//! program's fdinfo shows it).

use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use perf_event_open_sys::bindings as sys;
use perf_event_open_sys::ioctls;

use crate::recorder::{new_attr, sys_open};
use crate::sched::{format_field, read_file, tracepoint_dir, tracepoint_id};
use crate::LinuxError;

const TRACEPOINT: &str = "sched:sched_switch";

/// Nanoseconds per (cpu, tid); tid 0 is idle.
pub type CpuTidTimes = HashMap<(u32, u32), u64>;

/// (cpu, tid) pairs the hash map holds between two drains: 256 per CPU,
/// at least 16384. The drain walks every bucket, so a larger map costs
/// every interval (65536 entries: a quarter of stat's CPU at 100 ms with
/// 514 threads); slices that find it full are counted as dropped.
pub fn acc_entries(cpu_slots: u32) -> u32 {
    (256 * cpu_slots).next_power_of_two().max(16384)
}

// bpf(2) commands, map and program types, helpers (include/uapi/linux/bpf.h).
const BPF_MAP_CREATE: i64 = 0;
#[cfg(test)]
const BPF_MAP_LOOKUP_ELEM: i64 = 1;
const BPF_PROG_LOAD: i64 = 5;
const BPF_MAP_LOOKUP_AND_DELETE_ELEM: i64 = 21;
const BPF_MAP_LOOKUP_BATCH: i64 = 24;
const BPF_MAP_LOOKUP_AND_DELETE_BATCH: i64 = 25;
const BPF_MAP_TYPE_HASH: u32 = 1;
const BPF_MAP_TYPE_ARRAY: u32 = 2;
const BPF_PROG_TYPE_TRACEPOINT: u32 = 5;
const HELPER_MAP_LOOKUP_ELEM: i32 = 1;
const HELPER_MAP_UPDATE_ELEM: i32 = 2;
const HELPER_KTIME_GET_NS: i32 = 5;
const HELPER_GET_SMP_PROCESSOR_ID: i32 = 8;

/// One BPF instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Insn {
    pub code: u8,
    pub dst: u8,
    pub src: u8,
    pub off: i16,
    pub imm: i32,
}

impl Insn {
    const fn new(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
        Insn {
            code,
            dst,
            src,
            off,
            imm,
        }
    }
    /// The kernel's 8-byte encoding.
    pub fn encode(self) -> u64 {
        let b = [
            self.code,
            (self.src << 4) | (self.dst & 0xf),
            self.off.to_le_bytes()[0],
            self.off.to_le_bytes()[1],
        ];
        let lo = u32::from_le_bytes(b);
        u64::from(lo) | (u64::from(self.imm as u32) << 32)
    }
}

// Opcodes (class | op | source/size).
const MOV64_X: u8 = 0xbf;
const MOV64_K: u8 = 0xb7;
const ADD64_K: u8 = 0x07;
const SUB64_X: u8 = 0x1f;
const LDX_W: u8 = 0x61;
const LDX_DW: u8 = 0x79;
const STX_W: u8 = 0x63;
const STX_DW: u8 = 0x7b;
const ATOMIC_DW: u8 = 0xdb;
const ATOMIC_ADD: i32 = 0x00;
const JEQ_K: u8 = 0x15;
const JEQ_X: u8 = 0x1d;
const JA: u8 = 0x05;
const CALL: u8 = 0x85;
const EXIT: u8 = 0x95;
const LD_IMM64: u8 = 0x18;
const PSEUDO_MAP_FD: u8 = 1;

const R0: u8 = 0;
const R1: u8 = 1;
const R2: u8 = 2;
const R3: u8 = 3;
const R4: u8 = 4;
const R6: u8 = 6;
const R7: u8 = 7;
const R8: u8 = 8;
const R9: u8 = 9;
const FP: u8 = 10;

fn ld_map(dst: u8, fd: i32) -> [Insn; 2] {
    [
        Insn::new(LD_IMM64, dst, PSEUDO_MAP_FD, 0, fd),
        Insn::new(0, 0, 0, 0, 0),
    ]
}

/// The program: `prev_off` and `next_off` are the byte offsets of
/// `prev_pid` and `next_pid` (4-byte `pid_t`) in the tracepoint record.
/// `cur` values: since (u64), tid (u32), pad, unchained switches (u64),
/// slices dropped because `acc` was full (u64).
/// Stack: fp-4 cpu (key of `cur`), fp-16 (cpu, tid) key of `acc`, fp-24
/// the slice's nanoseconds.
pub fn program(cur_fd: i32, acc_fd: i32, prev_off: i16, next_off: i16) -> Vec<Insn> {
    let mut p = Vec::with_capacity(51);
    let i = Insn::new;
    p.extend([
        i(MOV64_X, R6, R1, 0, 0),                      // 0  r6 = ctx
        i(CALL, 0, 0, 0, HELPER_KTIME_GET_NS),         // 1
        i(MOV64_X, R7, R0, 0, 0),                      // 2  r7 = now
        i(CALL, 0, 0, 0, HELPER_GET_SMP_PROCESSOR_ID), // 3
        i(MOV64_X, R8, R0, 0, 0),                      // 4  r8 = cpu
        i(STX_W, FP, R8, -4, 0),                       // 5  key = cpu
    ]);
    p.extend(ld_map(R1, cur_fd)); //                       6-7
    p.extend([
        i(MOV64_X, R2, FP, 0, 0),                 // 8
        i(ADD64_K, R2, 0, 0, -4),                 // 9
        i(CALL, 0, 0, 0, HELPER_MAP_LOOKUP_ELEM), // 10
        i(JEQ_K, R0, 0, 37, 0),                   // 11 no slot -> 49
        i(MOV64_X, R9, R0, 0, 0),                 // 12 r9 = &cur[cpu]
        i(LDX_DW, R1, R9, 0, 0),                  // 13 r1 = since
        i(JEQ_K, R1, 0, 31, 0),                   // 14 first switch -> 46
        i(MOV64_X, R2, R7, 0, 0),                 // 15
        i(SUB64_X, R2, R1, 0, 0),                 // 16 r2 = now - since
        i(STX_DW, FP, R2, -24, 0),                // 17
        i(LDX_W, R1, R9, 8, 0),                   // 18 r1 = cur.tid
        i(STX_W, FP, R8, -16, 0),                 // 19 key.cpu
        i(STX_W, FP, R1, -12, 0),                 // 20 key.tid
    ]);
    p.extend(ld_map(R1, acc_fd)); //                       21-22
    p.extend([
        i(MOV64_X, R2, FP, 0, 0),                 // 23
        i(ADD64_K, R2, 0, 0, -16),                // 24
        i(CALL, 0, 0, 0, HELPER_MAP_LOOKUP_ELEM), // 25
        i(JEQ_K, R0, 0, 3, 0),                    // 26 new key -> 30
        i(LDX_DW, R1, FP, -24, 0),                // 27
        i(ATOMIC_DW, R0, R1, 0, ATOMIC_ADD),      // 28 *val += slice
        i(JA, 0, 0, 11, 0),                       // 29 -> 41
    ]);
    p.extend(ld_map(R1, acc_fd)); //                       30-31
    p.extend([
        i(MOV64_X, R2, FP, 0, 0),                 // 32
        i(ADD64_K, R2, 0, 0, -16),                // 33
        i(MOV64_X, R3, FP, 0, 0),                 // 34
        i(ADD64_K, R3, 0, 0, -24),                // 35
        i(MOV64_K, R4, 0, 0, 0),                  // 36 BPF_ANY
        i(CALL, 0, 0, 0, HELPER_MAP_UPDATE_ELEM), // 37
        i(JEQ_K, R0, 0, 2, 0),                    // 38 inserted -> 41
        i(MOV64_K, R1, 0, 0, 1),                  // 39
        i(ATOMIC_DW, R9, R1, 24, ATOMIC_ADD),     // 40 cur.dropped += 1
        i(LDX_W, R1, R6, prev_off, 0),            // 41 r1 = prev_pid
        i(LDX_W, R2, R9, 8, 0),                   // 42 r2 = cur.tid
        i(JEQ_X, R1, R2, 2, 0),                   // 43 chained -> 46
        i(MOV64_K, R1, 0, 0, 1),                  // 44
        i(ATOMIC_DW, R9, R1, 16, ATOMIC_ADD),     // 45 cur.holes += 1
        i(STX_DW, R9, R7, 0, 0),                  // 46 cur.since = now
        i(LDX_W, R1, R6, next_off, 0),            // 47
        i(STX_W, R9, R1, 8, 0),                   // 48 cur.tid = next_pid
        // 1: the kernel hands the record on to the tracepoint's perf
        // events (0 would hide it from every other reader on the host).
        i(MOV64_K, R0, 0, 0, 1), //                          49
        i(EXIT, 0, 0, 0, 0),     //                          50
    ]);
    p
}

fn bpf(cmd: i64, attr: &mut [u64]) -> std::io::Result<i64> {
    // SAFETY: attr is a zero-padded bpf_attr of the command's layout, as
    // large as the kernel reads (size passed); pointers in it point into
    // buffers the caller keeps alive across the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr.as_mut_ptr(),
            std::mem::size_of_val(attr),
        )
    };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn fd_of(r: i64) -> OwnedFd {
    // SAFETY: the kernel just returned this new descriptor to us.
    unsafe { OwnedFd::from_raw_fd(r as i32) }
}

fn sys_err(what: &'static str) -> impl FnOnce(std::io::Error) -> LinuxError {
    move |source| LinuxError::Sys { what, source }
}

fn pack(lo: u32, hi: u32) -> u64 {
    u64::from(lo) | (u64::from(hi) << 32)
}

fn map_create(
    kind: u32,
    key: u32,
    value: u32,
    entries: u32,
    what: &'static str,
) -> Result<OwnedFd, LinuxError> {
    let mut a = [0u64; 16];
    a[0] = pack(kind, key);
    a[1] = pack(value, entries);
    bpf(BPF_MAP_CREATE, &mut a)
        .map(fd_of)
        .map_err(sys_err(what))
}

/// A running slice credited up to the last boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Carry {
    /// When the slice began.
    pub since: u64,
    pub tid: u32,
    /// Its part before the last boundary (credited, or before the first
    /// interval): taken off when the closed slice arrives in `acc`.
    pub excluded: u64,
}

/// `cur` of one CPU: when its running task's slice began (0 = unknown) and
/// the task.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Running {
    pub since: u64,
    pub tid: u32,
}

/// One interval's bookkeeping: `drained` are the closed slices read from
/// `acc` ((cpu, tid), ns), `before` and `after` each CPU's `cur` read just
/// before and after the drain, `late(cpu, tid)` drains that one key again
/// (called for a carried slice that closed while the drain ran, so it is
/// in `acc` now), `t0`/`t1` the boundaries. Returns ns per (cpu, tid) in
/// `[t0, t1]`, tid 0 being idle.
pub fn account(
    carry: &mut HashMap<u32, Carry>,
    drained: &[((u32, u32), u64)],
    before: &[(u32, Running)],
    after: &[(u32, Running)],
    t0: u64,
    t1: u64,
    mut late: impl FnMut(u32, u32) -> Option<u64>,
) -> CpuTidTimes {
    let mut times = CpuTidTimes::new();
    for &(k, ns) in drained {
        *times.entry(k).or_default() += ns;
    }
    let before: HashMap<u32, Running> = before.iter().copied().collect();
    for &(cpu, now) in after {
        if let Some(c) = carry.remove(&cpu) {
            if now.since == c.since {
                // Still running: credit up to the boundary.
                let end = t1.max(c.since);
                *times.entry((cpu, c.tid)).or_default() +=
                    (end - c.since).saturating_sub(c.excluded);
                carry.insert(
                    cpu,
                    Carry {
                        excluded: end - c.since,
                        ..c
                    },
                );
                continue;
            }
            if before.get(&cpu).is_some_and(|b| b.since == c.since) {
                if let Some(ns) = late(cpu, c.tid) {
                    *times.entry((cpu, c.tid)).or_default() += ns;
                }
            }
            if let Some(ns) = times.get_mut(&(cpu, c.tid)) {
                *ns = ns.saturating_sub(c.excluded);
            }
        }
        if now.since != 0 && now.since <= t1 {
            *times.entry((cpu, now.tid)).or_default() += t1 - now.since.max(t0);
            carry.insert(
                cpu,
                Carry {
                    since: now.since,
                    tid: now.tid,
                    excluded: t1 - now.since,
                },
            );
        }
    }
    times
}

/// The loaded and attached program with its maps.
pub struct BpfSwitchTimes {
    /// The tracepoint's perf event the program is attached to (one for
    /// every CPU: the program runs on each hit of the tracepoint).
    _event: OwnedFd,
    prog: OwnedFd,
    cur: OwnedFd,
    acc: OwnedFd,
    slots: u32,
    cpus: Vec<u32>,
    keys: Vec<u64>,
    vals: Vec<u64>,
    cur_keys: Vec<u32>,
    cur_vals: Vec<[u64; 4]>,
    entries: u32,
    dropped: u64,
    dropped_now: u64,
    holes: u64,
    holes_now: u64,
    carry: HashMap<u32, Carry>,
    t0: u64,
}

impl BpfSwitchTimes {
    /// Load the program and attach it to `sched:sched_switch`. Fails with
    /// a one-line reason when bpf(2) or the tracepoint is unavailable
    /// (unprivileged, no BPF, old kernel without batch map operations).
    pub fn open() -> Result<BpfSwitchTimes, LinuxError> {
        let dir = tracepoint_dir(TRACEPOINT)?;
        let id = tracepoint_id(&dir)?;
        let format = read_file(dir.join("format"))?;
        let off = |name: &str| -> Result<i16, LinuxError> {
            let f = format_field(&format, name).filter(|f| f.size == 4);
            f.and_then(|f| i16::try_from(f.offset).ok())
                .ok_or_else(|| LinuxError::Tracepoint {
                    name: TRACEPOINT.into(),
                    msg: format!("its format has no 4-byte field '{name}'"),
                })
        };
        let (prev_off, next_off) = (off("prev_pid")?, off("next_pid")?);
        let possible = read_file(Path::new("/sys/devices/system/cpu/possible").to_path_buf())?;
        let slots = crate::sys::parse_cpu_list(&possible)
            .ok()
            .and_then(|v| v.into_iter().max())
            .map_or(1, |m| m + 1);
        let cpus = crate::sys::online_cpus(Path::new("/sys"))?;
        let cur = map_create(
            BPF_MAP_TYPE_ARRAY,
            4,
            32,
            slots,
            "bpf(BPF_MAP_CREATE) of the per-CPU slice map",
        )?;
        let entries = acc_entries(slots);
        let acc = map_create(
            BPF_MAP_TYPE_HASH,
            8,
            8,
            entries,
            "bpf(BPF_MAP_CREATE) of the run-time map",
        )?;
        let insns: Vec<u64> = program(cur.as_raw_fd(), acc.as_raw_fd(), prev_off, next_off)
            .into_iter()
            .map(Insn::encode)
            .collect();
        let license = c"Dual MIT/GPL";
        let mut log = vec![0u8; 64 * 1024];
        let mut a = [0u64; 16];
        a[0] = pack(BPF_PROG_TYPE_TRACEPOINT, insns.len() as u32);
        a[1] = insns.as_ptr() as u64;
        a[2] = license.as_ptr() as u64;
        let load = |a: &mut [u64; 16]| bpf(BPF_PROG_LOAD, a);
        let prog = match load(&mut a) {
            Ok(fd) => fd_of(fd),
            Err(e) => {
                // Again with the verifier's log, for the error line.
                a[3] = pack(1, log.len() as u32);
                a[4] = log.as_mut_ptr() as u64;
                let _ = load(&mut a);
                let text = String::from_utf8_lossy(&log);
                let text = text.trim_end_matches('\0').trim();
                let last = text.lines().last().unwrap_or("");
                return Err(LinuxError::Tracepoint {
                    name: TRACEPOINT.into(),
                    msg: format!("loading the eBPF program failed: {e}; verifier: {last}"),
                });
            }
        };
        let mut attr = new_attr(sys::PERF_TYPE_TRACEPOINT, id);
        attr.set_disabled(1);
        let event = sys_open(&mut attr, -1, cpus.first().copied().unwrap_or(0) as i32).map_err(
            |source| LinuxError::Open {
                event: TRACEPOINT.into(),
                target: "the eBPF program".into(),
                cpu: 0,
                source,
            },
        )?;
        // SAFETY: valid perf fd and program fd.
        if unsafe { ioctls::SET_BPF(event.as_raw_fd(), prog.as_raw_fd() as u32) } < 0 {
            return Err(sys_err("PERF_EVENT_IOC_SET_BPF")(
                std::io::Error::last_os_error(),
            ));
        }
        // SAFETY: valid perf fd.
        if unsafe { ioctls::ENABLE(event.as_raw_fd(), 0) } < 0 {
            return Err(sys_err("PERF_EVENT_IOC_ENABLE")(
                std::io::Error::last_os_error(),
            ));
        }
        let mut me = BpfSwitchTimes {
            _event: event,
            prog,
            cur,
            acc,
            slots,
            cpus,
            keys: vec![0; entries as usize],
            vals: vec![0; entries as usize],
            cur_keys: vec![0; slots as usize],
            cur_vals: vec![[0; 4]; slots as usize],
            entries,
            dropped: 0,
            dropped_now: 0,
            holes: 0,
            holes_now: 0,
            carry: HashMap::new(),
            t0: crate::clock_monotonic_ns(),
        };
        // Batch reads are checked here so a kernel without them falls back
        // at start, not at the first interval.
        me.running()?;
        me.holes = me.holes_now;
        me.dropped = me.dropped_now;
        me.t0 = crate::clock_monotonic_ns();
        Ok(me)
    }

    /// The program's descriptor (its fdinfo shows `run_time_ns` when
    /// `kernel.bpf_stats_enabled` is 1).
    pub fn prog_fd(&self) -> i32 {
        self.prog.as_raw_fd()
    }

    /// The end of the last interval (CLOCK_MONOTONIC ns).
    pub fn t0(&self) -> u64 {
        self.t0
    }

    /// `cur` of every online CPU, in one batch read.
    fn running(&mut self) -> Result<Vec<(u32, Running)>, LinuxError> {
        let mut out_batch = 0u64;
        let mut a = [0u64; 8];
        a[1] = (&raw mut out_batch) as u64;
        a[2] = self.cur_keys.as_mut_ptr() as u64;
        a[3] = self.cur_vals.as_mut_ptr() as u64;
        a[4] = pack(self.slots, self.cur.as_raw_fd() as u32);
        let n = match bpf(BPF_MAP_LOOKUP_BATCH, &mut a) {
            Ok(_) => a[4] as u32,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => a[4] as u32,
            Err(e) => {
                return Err(sys_err(
                    "bpf(BPF_MAP_LOOKUP_BATCH) of the per-CPU slice map",
                )(e))
            }
        };
        let mut out = Vec::with_capacity(self.cpus.len());
        let mut holes = 0;
        let mut dropped = 0;
        for i in 0..n as usize {
            let cpu = self.cur_keys[i];
            holes += self.cur_vals[i][2];
            dropped += self.cur_vals[i][3];
            if self.cpus.contains(&cpu) {
                let [since, tid, _, _] = self.cur_vals[i];
                out.push((
                    cpu,
                    Running {
                        since,
                        tid: tid as u32,
                    },
                ));
            }
        }
        self.holes_now = holes;
        self.dropped_now = dropped;
        Ok(out)
    }

    /// Drain `acc` into `out` ((cpu, tid), ns).
    fn drain(&mut self, out: &mut Vec<((u32, u32), u64)>) -> Result<(), LinuxError> {
        let mut in_batch = 0u64;
        let mut out_batch = 0u64;
        let mut first = true;
        loop {
            let mut a = [0u64; 8];
            a[0] = if first { 0 } else { (&raw mut in_batch) as u64 };
            a[1] = (&raw mut out_batch) as u64;
            a[2] = self.keys.as_mut_ptr() as u64;
            a[3] = self.vals.as_mut_ptr() as u64;
            a[4] = pack(self.entries, self.acc.as_raw_fd() as u32);
            let r = bpf(BPF_MAP_LOOKUP_AND_DELETE_BATCH, &mut a);
            let n = a[4] as u32 as usize;
            for i in 0..n {
                let k = self.keys[i];
                out.push(((k as u32, (k >> 32) as u32), self.vals[i]));
            }
            match r {
                Ok(_) if n > 0 => {
                    in_batch = out_batch;
                    first = false;
                }
                Ok(_) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(()),
                Err(e) => {
                    return Err(sys_err(
                        "bpf(BPF_MAP_LOOKUP_AND_DELETE_BATCH) of the run-time map",
                    )(e))
                }
            }
        }
    }

    fn take_one(&self, cpu: u32, tid: u32) -> Option<u64> {
        let mut key = pack(cpu, tid);
        let mut val = 0u64;
        let mut a = [0u64; 4];
        a[0] = u64::from(self.acc.as_raw_fd() as u32);
        a[1] = (&raw mut key) as u64;
        a[2] = (&raw mut val) as u64;
        let r = bpf(BPF_MAP_LOOKUP_AND_DELETE_ELEM, &mut a)
            .ok()
            .map(|_| val);
        // Keep `key` alive (and read) until after the call.
        std::hint::black_box(&key);
        r
    }

    /// Switches since the previous call whose `prev_pid` was not the task
    /// the program last saw switched in on that CPU (a switch it missed;
    /// the gap went to that task).
    pub fn take_unchained(&mut self) -> u64 {
        let n = self.holes_now.saturating_sub(self.holes);
        self.holes = self.holes_now;
        n
    }

    /// Slices dropped since the previous call because the map was full
    /// (their time is missing).
    pub fn take_dropped(&mut self) -> u64 {
        let n = self.dropped_now.saturating_sub(self.dropped);
        self.dropped = self.dropped_now;
        n
    }

    /// Run time of every (cpu, tid) from the end of the last interval to
    /// now (tid 0 = idle), and that interval's ends (CLOCK_MONOTONIC ns).
    pub fn collect(&mut self) -> Result<(CpuTidTimes, u64, u64), LinuxError> {
        let before = self.running()?;
        let mut drained = Vec::new();
        self.drain(&mut drained)?;
        let after = self.running()?;
        let t1 = crate::clock_monotonic_ns();
        let t0 = self.t0;
        let mut carry = std::mem::take(&mut self.carry);
        let times = account(&mut carry, &drained, &before, &after, t0, t1, |c, t| {
            self.take_one(c, t)
        });
        self.carry = carry;
        self.t0 = t1;
        Ok((times, t0, t1))
    }
}

/// Whether a single lookup works (used by tests to read `cur` directly).
#[cfg(test)]
fn lookup_u32_key(map: &OwnedFd, key: u32, val: &mut [u8]) -> bool {
    let mut k = key;
    let mut a = [0u64; 4];
    a[0] = u64::from(map.as_raw_fd() as u32);
    a[1] = (&raw mut k) as u64;
    a[2] = val.as_mut_ptr() as u64;
    bpf(BPF_MAP_LOOKUP_ELEM, &mut a).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instructions_encode_as_the_kernel_reads_them() {
        // r2 += -4: opcode 0x07, dst 2, imm -4.
        assert_eq!(
            Insn::new(ADD64_K, R2, 0, 0, -4).encode(),
            0xffff_fffc_0000_0207
        );
        // *(u32 *)(r10 - 4) = r8: src in the high nibble.
        assert_eq!(
            Insn::new(STX_W, FP, R8, -4, 0).encode(),
            0x0000_0000_fffc_8a63
        );
        let p = program(3, 4, 24, 56);
        assert_eq!(p.len(), 51);
        // Every jump lands inside the program, and the map loads carry
        // the descriptors.
        for (pc, insn) in p.iter().enumerate() {
            if matches!(insn.code, JEQ_K | JEQ_X | JA) {
                let to = pc as i64 + 1 + i64::from(insn.off);
                assert!((0..p.len() as i64).contains(&to), "jump at {pc}");
            }
        }
        let maps: Vec<i32> = p
            .iter()
            .filter(|i| i.code == LD_IMM64)
            .map(|i| i.imm)
            .collect();
        assert_eq!(maps, vec![3, 4, 4]);
        assert_eq!(p[41].off, 24);
        assert_eq!(p[47].off, 56);
        assert_eq!(p[50].code, EXIT);
    }

    fn run(since: u64, tid: u32) -> Running {
        Running { since, tid }
    }

    #[test]
    fn slices_running_across_boundaries_are_split() {
        let mut carry = HashMap::new();
        // Interval [1000, 2000]: CPU 0 ran task 7 from 1200 (closed at
        // 1500, 300 ns in acc) and task 9 since 1500; CPU 1 has seen no
        // switch yet.
        let drained = [((0, 7), 300), ((0, 0), 200)];
        let after = [(0, run(1500, 9)), (1, run(0, 0))];
        let t = account(&mut carry, &drained, &after, &after, 1000, 2000, |_, _| {
            None
        });
        assert_eq!(t[&(0, 7)], 300);
        assert_eq!(t[&(0, 9)], 500);
        assert_eq!(t.get(&(1, 0)), None);
        assert_eq!(carry[&0].excluded, 500);
        // [2000, 3000]: task 9 still runs on CPU 0; CPU 1's first switch
        // at 2600 to task 4, its first slice unknown.
        let after = [(0, run(1500, 9)), (1, run(2600, 4))];
        let t = account(&mut carry, &[], &after, &after, 2000, 3000, |_, _| None);
        assert_eq!(t[&(0, 9)], 1000);
        assert_eq!(t[&(1, 4)], 400);
        // [3000, 4000]: task 9 closed at 3300 (its whole 1800 ns slice in
        // acc, 1500 of it credited already), idle since.
        let drained = [((0, 9), 1800)];
        let after = [(0, run(3300, 0)), (1, run(2600, 4))];
        let t = account(&mut carry, &drained, &after, &after, 3000, 4000, |_, _| {
            None
        });
        assert_eq!(t[&(0, 9)], 300);
        assert_eq!(t[&(0, 0)], 700);
        assert_eq!(t[&(1, 4)], 1000);
        let cpu0: u64 = t.iter().filter(|(k, _)| k.0 == 0).map(|(_, v)| v).sum();
        assert_eq!(cpu0, 1000, "a CPU's slices fill the interval");
    }

    #[test]
    fn a_slice_closing_during_the_drain_is_fetched_again() {
        let mut carry = HashMap::from([(
            0,
            Carry {
                since: 500,
                tid: 9,
                excluded: 500,
            },
        )]);
        // Task 9 closed at 1800, after the drain had passed its key.
        let before = [(0, run(500, 9))];
        let after = [(0, run(1800, 3))];
        let mut asked = Vec::new();
        let t = account(&mut carry, &[], &before, &after, 1000, 2000, |c, tid| {
            asked.push((c, tid));
            Some(1300)
        });
        assert_eq!(asked, vec![(0, 9)]);
        assert_eq!(t[&(0, 9)], 800);
        assert_eq!(t[&(0, 3)], 200);
    }

    /// Live: the program loads and runs, each CPU's slices fill the
    /// intervals, and a thread's summed slices agree with its own
    /// `schedstat`. SKIP (printed) without root or BPF.
    #[test]
    fn live_slices_fill_each_cpu_and_match_schedstat() {
        let mut b = match BpfSwitchTimes::open() {
            Ok(b) => b,
            Err(e) => {
                eprintln!("SKIP: eBPF sched_switch program unavailable: {e}");
                return;
            }
        };
        let mut val = [0u8; 32];
        assert!(lookup_u32_key(&b.cur, b.cpus[0], &mut val));
        // A thread that runs about half the time, in bursts.
        let (tx, rx) = std::sync::mpsc::channel();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop2 = stop.clone();
        let worker = std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            tx.send(unsafe { libc::gettid() } as u32).unwrap();
            while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
                let t = std::time::Instant::now();
                while t.elapsed() < std::time::Duration::from_millis(3) {
                    std::hint::spin_loop();
                }
                std::thread::sleep(std::time::Duration::from_millis(3));
            }
        });
        let tid = rx.recv().unwrap();
        let run_ns = || -> u64 {
            let s = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).unwrap();
            s.split_whitespace().next().unwrap().parse().unwrap()
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        let _ = b.collect().unwrap();
        let r0 = run_ns();
        let mut total = HashMap::new();
        let mut mine = 0u64;
        let mut dt = 0;
        for _ in 0..5 {
            std::thread::sleep(std::time::Duration::from_millis(100));
            let (t, t0, t1) = b.collect().unwrap();
            dt += t1 - t0;
            for ((cpu, task), ns) in t {
                *total.entry(cpu).or_insert(0u64) += ns;
                if task == tid {
                    mine += ns;
                }
            }
        }
        let r1 = run_ns();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        worker.join().unwrap();
        let sched = r1 - r0;
        eprintln!(
            "thread {tid}: {:.1} ms by the program, {:.1} ms by schedstat; {} unchained switches",
            mine as f64 / 1e6,
            sched as f64 / 1e6,
            b.take_unchained()
        );
        // The two reads of schedstat are not at the interval ends: a few
        // ms of skew at most.
        assert!(
            mine.abs_diff(sched) < 5_000_000 + sched / 50,
            "program {mine} ns vs schedstat {sched} ns"
        );
        for (cpu, ns) in total {
            let share = ns as f64 / dt as f64;
            eprintln!("CPU {cpu}: slices cover {share:.4} of {dt} ns");
            assert!(
                (0.95..=1.05).contains(&share),
                "CPU {cpu}: slices cover {share:.3} of the time"
            );
        }
    }
}
