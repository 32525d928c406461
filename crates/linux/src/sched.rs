//! The `sched:sched_switch` tracepoint on every CPU: exact per-CPU
//! scheduling for vm-stat. The raw payload is decoded with the field offsets
//! of the tracepoint's `format` file, never with hard-coded offsets.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use perf_event_open_sys::bindings as sys;
use perf_event_open_sys::ioctls;

use crate::recorder::{new_attr, sys_open};
use crate::ring::Ring;
use crate::sys::{online_cpus, page_size, perf_event_paranoid};
use crate::LinuxError;

const TRACEPOINT: &str = "sched:sched_switch";

/// A task name as the kernel stores it (`char[16]`), without allocation.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct TaskComm {
    bytes: [u8; 16],
    len: u8,
}

impl TaskComm {
    /// The empty name.
    pub const EMPTY: TaskComm = TaskComm {
        bytes: [0; 16],
        len: 0,
    };

    /// From a NUL-padded kernel buffer (at most 16 bytes are kept).
    pub fn from_bytes(b: &[u8]) -> TaskComm {
        let end = b.iter().position(|&c| c == 0).unwrap_or(b.len()).min(16);
        let mut bytes = [0u8; 16];
        bytes[..end].copy_from_slice(&b[..end]);
        TaskComm {
            bytes,
            len: end as u8,
        }
    }

    /// The name; invalid UTF-8 is cut at the first bad byte.
    pub fn as_str(&self) -> &str {
        let b = &self.bytes[..self.len as usize];
        match std::str::from_utf8(b) {
            Ok(s) => s,
            Err(e) => std::str::from_utf8(&b[..e.valid_up_to()]).unwrap_or_default(),
        }
    }
}

impl std::fmt::Debug for TaskComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.as_str())
    }
}

impl std::fmt::Display for TaskComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One context switch on one CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedSwitch {
    pub cpu: u32,
    /// CLOCK_MONOTONIC nanoseconds.
    pub time: u64,
    pub prev_pid: u32,
    pub prev_comm: TaskComm,
    /// Kernel task state of the task switched out (0 = runnable, preempted).
    pub prev_state: u64,
    pub next_pid: u32,
    pub next_comm: TaskComm,
}

/// One `field:` line of a tracepoint `format` file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Field {
    pub offset: usize,
    pub size: usize,
}

impl Field {
    /// This field's bytes in a raw payload; `None` if it is too short.
    pub(crate) fn bytes(self, raw: &[u8]) -> Option<&[u8]> {
        raw.get(self.offset..self.offset.checked_add(self.size)?)
    }

    /// This field as an unsigned integer of its size (1, 2, 4 or 8 bytes).
    pub(crate) fn int(self, raw: &[u8]) -> Option<u64> {
        let b = self.bytes(raw)?;
        Some(match self.size {
            1 => u64::from(b[0]),
            2 => u64::from(u16::from_ne_bytes(b.try_into().ok()?)),
            4 => u64::from(u32::from_ne_bytes(b.try_into().ok()?)),
            8 => u64::from_ne_bytes(b.try_into().ok()?),
            _ => return None,
        })
    }
}

/// Find `name`'s offset and size in a tracepoint `format` text.
pub(crate) fn format_field(format: &str, name: &str) -> Option<Field> {
    for line in format.lines() {
        let mut decl = None;
        let mut offset = None;
        let mut size = None;
        for part in line.split(';') {
            let part = part.trim();
            if let Some(d) = part.strip_prefix("field:") {
                decl = Some(d);
            } else if let Some(o) = part.strip_prefix("offset:") {
                offset = o.trim().parse().ok();
            } else if let Some(s) = part.strip_prefix("size:") {
                size = s.trim().parse().ok();
            }
        }
        // The declaration ends with the name, optionally followed by [N].
        let Some(decl) = decl else { continue };
        let last = decl.rsplit(' ').next().unwrap_or(decl);
        let ident = last.split('[').next().unwrap_or(last);
        if ident == name {
            return Some(Field {
                offset: offset?,
                size: size?,
            });
        }
    }
    None
}

/// Where the sched_switch fields are in the raw payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SwitchLayout {
    prev_comm: Field,
    prev_pid: Field,
    prev_state: Field,
    next_comm: Field,
    next_pid: Field,
}

impl SwitchLayout {
    pub(crate) fn from_format(format: &str) -> Result<SwitchLayout, LinuxError> {
        let f = |name: &str| {
            format_field(format, name).ok_or_else(|| LinuxError::Tracepoint {
                name: TRACEPOINT.into(),
                msg: format!("its format has no field '{name}'"),
            })
        };
        Ok(SwitchLayout {
            prev_comm: f("prev_comm")?,
            prev_pid: f("prev_pid")?,
            prev_state: f("prev_state")?,
            next_comm: f("next_comm")?,
            next_pid: f("next_pid")?,
        })
    }

    /// Decode a raw payload; `None` if it is shorter than the format says.
    pub(crate) fn decode(&self, raw: &[u8], cpu: u32, time: u64) -> Option<SchedSwitch> {
        let bytes = |f: Field| f.bytes(raw);
        let int = |f: Field| f.int(raw);
        Some(SchedSwitch {
            cpu,
            time,
            prev_pid: int(self.prev_pid)? as u32,
            prev_comm: TaskComm::from_bytes(bytes(self.prev_comm)?),
            prev_state: int(self.prev_state)?,
            next_pid: int(self.next_pid)? as u32,
            next_comm: TaskComm::from_bytes(bytes(self.next_comm)?),
        })
    }
}

/// A tracepoint's directory (`events/SYSTEM/NAME`) under tracefs:
/// /sys/kernel/tracing, else /sys/kernel/debug/tracing; mounts tracefs on
/// /sys/kernel/tracing when neither has it (as perf does). `name` is
/// `system:event`.
pub(crate) fn tracepoint_dir(name: &str) -> Result<PathBuf, LinuxError> {
    let rel = format!("events/{}", name.replacen(':', "/", 1));
    let roots = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];
    let find = || {
        roots
            .iter()
            .map(|r| Path::new(r).join(&rel))
            .find(|d| d.join("id").is_file())
    };
    if let Some(d) = find() {
        return Ok(d);
    }
    let mounted = Path::new("/sys/kernel/tracing/events").is_dir()
        || Path::new("/sys/kernel/debug/tracing/events").is_dir();
    if !mounted {
        // SAFETY: constant NUL-terminated strings; mount fails cleanly if not allowed.
        let rc = unsafe {
            libc::mount(
                c"nodev".as_ptr(),
                c"/sys/kernel/tracing".as_ptr(),
                c"tracefs".as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        if rc == 0 {
            if let Some(d) = find() {
                return Ok(d);
            }
        } else {
            return Err(LinuxError::Tracepoint {
                name: name.into(),
                msg: "tracefs is not mounted and could not be mounted: run `mount -t tracefs nodev /sys/kernel/tracing` as root".into(),
            });
        }
    }
    Err(LinuxError::Tracepoint {
        name: name.into(),
        msg: format!("this kernel has no {rel} under tracefs"),
    })
}

/// The tracepoint id in `dir/id`.
pub(crate) fn tracepoint_id(dir: &Path) -> Result<u64, LinuxError> {
    let id_text = read_file(dir.join("id"))?;
    id_text.trim().parse().map_err(|_| LinuxError::Parse {
        path: dir.join("id"),
        msg: format!("'{}' is not a tracepoint id", id_text.trim()),
    })
}

/// Opens tracepoint `id` (named `name` in errors) on `cpu`, disabled,
/// sampling every hit with TID, TIME (CLOCK_MONOTONIC), CPU and RAW, waking
/// readers at `wakeup_bytes`. `opened` is how many fds are already open
/// (for the too-many-files error).
pub(crate) fn open_tracepoint(
    name: &str,
    id: u64,
    cpu: u32,
    wakeup_bytes: u32,
    opened: usize,
) -> Result<OwnedFd, LinuxError> {
    let mut attr = new_attr(sys::PERF_TYPE_TRACEPOINT, id);
    attr.sample_type = SWITCH_SAMPLE_TYPE;
    attr.__bindgen_anon_1.sample_period = 1;
    attr.set_disabled(1);
    attr.set_sample_id_all(1);
    attr.set_use_clockid(1);
    attr.clockid = libc::CLOCK_MONOTONIC;
    attr.set_watermark(1);
    attr.__bindgen_anon_2.wakeup_watermark = wakeup_bytes;
    sys_open(&mut attr, -1, cpu as i32).map_err(|e| match e.raw_os_error() {
        Some(libc::EACCES | libc::EPERM) => LinuxError::PermissionDenied {
            event: name.into(),
            target: "all CPUs".into(),
            errno: if e.raw_os_error() == Some(libc::EACCES) {
                "EACCES"
            } else {
                "EPERM"
            },
            paranoid: perf_event_paranoid(),
        },
        Some(libc::EMFILE | libc::ENFILE) => LinuxError::TooManyFiles { opened },
        _ => LinuxError::Open {
            event: name.into(),
            target: "all CPUs".into(),
            cpu,
            source: e,
        },
    })
}

/// Data pages per ring for `ring_pages` as in [`crate::RingOptions`]
/// (0 = 1 MiB), checked to be a power of two.
pub(crate) fn ring_data_pages(ring_pages: usize, page: usize) -> Result<usize, LinuxError> {
    if ring_pages != 0 && !ring_pages.is_power_of_two() {
        return Err(LinuxError::Options(format!(
            "ring_pages must be a power of two, not {ring_pages}"
        )));
    }
    Ok(match ring_pages {
        0 => ((1 << 20) / page).max(1),
        n => n,
    })
}

pub(crate) fn read_file(path: PathBuf) -> Result<String, LinuxError> {
    std::fs::read_to_string(&path).map_err(|source| LinuxError::Read { path, source })
}

/// sched_switch on every online CPU, one ring per CPU.
pub struct SchedSwitchRecorder {
    cpus: Vec<u32>,
    fds: Vec<OwnedFd>,
    rings: Vec<Ring>,
    pollfds: Vec<libc::pollfd>,
    layout: SwitchLayout,
    scratch: Vec<u64>,
    lost: u64,
}

/// PERF_SAMPLE_TID | TIME | CPU | RAW: body = pid, tid, time, cpu, res,
/// raw size (u32), raw data.
pub(crate) const SWITCH_SAMPLE_TYPE: u64 =
    (sys::PERF_SAMPLE_TID | sys::PERF_SAMPLE_TIME | sys::PERF_SAMPLE_CPU | sys::PERF_SAMPLE_RAW)
        as u64;
/// `sample_id_all` trailer for that sample type: TID, TIME, CPU.
pub(crate) const SWITCH_TRAILER: usize = 24;

impl SchedSwitchRecorder {
    /// Open the tracepoint on every online CPU, disabled. `ring_pages` as in
    /// [`crate::RingOptions`] (0 = 1 MiB per CPU).
    pub fn open(ring_pages: usize) -> Result<SchedSwitchRecorder, LinuxError> {
        let page = page_size();
        let data_pages = ring_data_pages(ring_pages, page)?;
        let dir = tracepoint_dir(TRACEPOINT)?;
        let id = tracepoint_id(&dir)?;
        let layout = SwitchLayout::from_format(&read_file(dir.join("format"))?)?;
        let cpus = online_cpus(Path::new("/sys"))?;
        let mut rec = SchedSwitchRecorder {
            cpus: cpus.clone(),
            fds: Vec::new(),
            rings: Vec::new(),
            pollfds: Vec::new(),
            layout,
            scratch: Vec::new(),
            lost: 0,
        };
        for &cpu in &cpus {
            let fd = open_tracepoint(
                TRACEPOINT,
                id,
                cpu,
                (data_pages * page / 2) as u32,
                rec.fds.len(),
            )?;
            let ring = map_ring(&fd, cpu, data_pages, page)?;
            rec.pollfds.push(libc::pollfd {
                fd: fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
            rec.rings.push(ring);
            rec.fds.push(fd);
        }
        Ok(rec)
    }

    fn ioctl_all(
        &self,
        what: &'static str,
        f: unsafe fn(i32, u32) -> i32,
    ) -> Result<(), LinuxError> {
        crate::sys::ioctl_all(&self.fds, what, f)
    }

    pub fn enable(&mut self) -> Result<(), LinuxError> {
        self.ioctl_all("PERF_EVENT_IOC_ENABLE", ioctls::ENABLE)
    }

    pub fn disable(&mut self) -> Result<(), LinuxError> {
        self.ioctl_all("PERF_EVENT_IOC_DISABLE", ioctls::DISABLE)
    }

    /// Wait up to `timeout` for a ring to be half full, then drain every ring
    /// and append the switches to `out`, sorted by time within this call
    /// (each CPU's switches are always in order).
    pub fn read(
        &mut self,
        timeout: Duration,
        out: &mut Vec<SchedSwitch>,
    ) -> Result<(), LinuxError> {
        crate::sys::poll_fds(&mut self.pollfds, timeout, "poll on sched_switch rings")?;
        let start = out.len();
        let SchedSwitchRecorder {
            rings,
            layout,
            scratch,
            lost,
            ..
        } = self;
        for ring in rings.iter_mut() {
            ring.drain(scratch, |rec| decode_switch(rec, layout, out, lost));
        }
        out[start..].sort_by_key(|s| s.time);
        Ok(())
    }

    pub fn cpus(&self) -> &[u32] {
        &self.cpus
    }

    /// Switch records the kernel dropped (ring overflow).
    pub fn lost(&self) -> u64 {
        self.lost
    }
}

pub(crate) fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(off..off + 4)?.try_into().ok()?))
}

pub(crate) fn u64_at(b: &[u8], off: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(b.get(off..off + 8)?.try_into().ok()?))
}

/// A ring record of a tracepoint opened by [`open_tracepoint`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TpRecord<'a> {
    /// A sample: the task it hit, when, where, and the raw payload.
    Sample {
        tid: u32,
        time: u64,
        cpu: u32,
        raw: &'a [u8],
    },
    /// The kernel dropped this many records here.
    Lost(u64),
}

/// Split a ring record of [`SWITCH_SAMPLE_TYPE`] (body: pid, tid, time,
/// cpu, res, raw size, raw); `None` for other or short records.
pub(crate) fn tp_record(rec: &[u8]) -> Option<TpRecord<'_>> {
    match u32_at(rec, 0)? {
        sys::PERF_RECORD_SAMPLE => {
            let size = u32_at(rec, 32)? as usize;
            Some(TpRecord::Sample {
                tid: u32_at(rec, 12)?,
                time: u64_at(rec, 16)?,
                cpu: u32_at(rec, 24)?,
                raw: rec.get(36..36usize.checked_add(size)?)?,
            })
        }
        sys::PERF_RECORD_LOST if rec.len() >= 24 + SWITCH_TRAILER => {
            Some(TpRecord::Lost(u64_at(rec, 16).unwrap_or(0)))
        }
        _ => None,
    }
}

/// Maps the ring of perf fd `fd` on `cpu`.
pub(crate) fn map_ring(
    fd: &OwnedFd,
    cpu: u32,
    data_pages: usize,
    page: usize,
) -> Result<Ring, LinuxError> {
    Ring::map(fd.as_raw_fd(), data_pages, page).map_err(|source| LinuxError::Mmap {
        cpu,
        bytes: (data_pages + 1) * page,
        source,
    })
}

/// One ring record: a sched_switch sample or a LOST record.
pub(crate) fn decode_switch(
    rec: &[u8],
    layout: &SwitchLayout,
    out: &mut Vec<SchedSwitch>,
    lost: &mut u64,
) {
    match tp_record(rec) {
        Some(TpRecord::Sample { time, cpu, raw, .. }) => {
            if let Some(s) = layout.decode(raw, cpu, time) {
                out.push(s);
            }
        }
        Some(TpRecord::Lost(n)) => *lost += n,
        None => {}
    }
}

/// A sample record as the kernel writes it for [`SWITCH_SAMPLE_TYPE`].
#[cfg(test)]
pub(crate) fn sample_record(tid: u32, raw: &[u8], cpu: u32, time: u64) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&tid.to_ne_bytes());
    body.extend_from_slice(&tid.to_ne_bytes());
    body.extend_from_slice(&time.to_ne_bytes());
    body.extend_from_slice(&cpu.to_ne_bytes());
    body.extend_from_slice(&0u32.to_ne_bytes());
    body.extend_from_slice(&(raw.len() as u32).to_ne_bytes());
    body.extend_from_slice(raw);
    body.resize(body.len().div_ceil(8) * 8, 0);
    let mut rec = Vec::new();
    rec.extend_from_slice(&sys::PERF_RECORD_SAMPLE.to_ne_bytes());
    rec.extend_from_slice(&0u16.to_ne_bytes());
    rec.extend_from_slice(&((body.len() + 8) as u16).to_ne_bytes());
    rec.extend(body);
    rec
}

#[cfg(test)]
mod tests {
    use super::*;

    const FORMAT: &str = include_str!("../tests/fixtures/tracing/sched_switch_format");

    #[test]
    fn fields_from_the_format_file() {
        assert_eq!(
            format_field(FORMAT, "prev_comm"),
            Some(Field {
                offset: 8,
                size: 16
            })
        );
        assert_eq!(
            format_field(FORMAT, "prev_state"),
            Some(Field {
                offset: 32,
                size: 8
            })
        );
        assert_eq!(
            format_field(FORMAT, "next_pid"),
            Some(Field {
                offset: 56,
                size: 4
            })
        );
        assert_eq!(
            format_field(FORMAT, "common_pid").map(|f| f.offset),
            Some(4)
        );
        assert_eq!(format_field(FORMAT, "comm"), None);
        let e = SwitchLayout::from_format("format:\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("sched:sched_switch") && e.contains("prev_comm"),
            "{e}"
        );
    }

    fn sample(raw: &[u8], cpu: u32, time: u64) -> Vec<u8> {
        sample_record(5, raw, cpu, time)
    }

    #[test]
    fn raw_payload_decodes_with_format_offsets() {
        let layout = SwitchLayout::from_format(FORMAT).unwrap();
        let mut raw = vec![0u8; 64];
        raw[8..11].copy_from_slice(b"foo");
        raw[24..28].copy_from_slice(&1234i32.to_ne_bytes());
        raw[32..40].copy_from_slice(&1i64.to_ne_bytes());
        raw[40..56].copy_from_slice(b"CPU 0/TCG\0\0\0\0\0\0\0");
        raw[56..60].copy_from_slice(&77i32.to_ne_bytes());
        let mut out = Vec::new();
        let mut lost = 0;
        decode_switch(&sample(&raw, 1, 99), &layout, &mut out, &mut lost);
        assert_eq!(out.len(), 1);
        let s = out[0];
        assert_eq!(
            (s.cpu, s.time, s.prev_pid, s.prev_state, s.next_pid),
            (1, 99, 1234, 1, 77)
        );
        assert_eq!(s.prev_comm.as_str(), "foo");
        assert_eq!(s.next_comm.to_string(), "CPU 0/TCG");
        // A payload shorter than the format: dropped, no panic.
        decode_switch(&sample(&raw[..40], 1, 100), &layout, &mut out, &mut lost);
        assert_eq!(out.len(), 1);
        // A different layout (older kernel: 4-byte prev_state at 28).
        let old = FORMAT.replace(
            "long prev_state;\toffset:32;\tsize:8",
            "long prev_state;\toffset:28;\tsize:4",
        );
        let l2 = SwitchLayout::from_format(&old).unwrap();
        let mut raw2 = raw.clone();
        raw2[28..32].copy_from_slice(&2u32.to_ne_bytes());
        decode_switch(&sample(&raw2, 0, 5), &l2, &mut out, &mut lost);
        assert_eq!(out[1].prev_state, 2);
    }

    #[test]
    fn task_comm_is_bounded() {
        let c = TaskComm::from_bytes(b"0123456789abcdefXYZ");
        assert_eq!(c.as_str(), "0123456789abcdef");
        assert_eq!(TaskComm::from_bytes(b"a\xffb").as_str(), "a");
        assert_eq!(TaskComm::from_bytes(b"").as_str(), "");
    }
}
