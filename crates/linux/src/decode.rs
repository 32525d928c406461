//! Decoding of the raw ring records this crate asks the kernel for (the
//! fixed sample layout of [`SAMPLE_TYPE`], with `sample_id_all`) into
//! [`vmscope_model::Record`]s, each paired with its timestamp for sorting.

use std::sync::Arc;

use perf_event_open_sys::bindings as sys;
use vmscope_model::{split_callchain_into, CpuMode, Record, SampleRecord};

/// sample_type of every event: IDENTIFIER first, so the id is at a fixed
/// offset in samples and last in the `sample_id_all` trailer.
pub(crate) const SAMPLE_TYPE: u64 = (sys::PERF_SAMPLE_IDENTIFIER
    | sys::PERF_SAMPLE_IP
    | sys::PERF_SAMPLE_TID
    | sys::PERF_SAMPLE_TIME
    | sys::PERF_SAMPLE_CPU
    | sys::PERF_SAMPLE_PERIOD) as u64;

/// Size of the `sample_id_all` trailer for [`SAMPLE_TYPE`]: TID, TIME, CPU,
/// IDENTIFIER (ID, STREAM_ID are not requested).
const TRAILER: usize = 32;

const MISC_COMM_EXEC: u16 = sys::PERF_RECORD_MISC_COMM_EXEC as u16;
const MISC_MMAP_BUILD_ID: u16 = sys::PERF_RECORD_MISC_MMAP_BUILD_ID as u16;

/// Turns raw records into model records.
#[derive(Debug, Default)]
pub(crate) struct Decoder {
    /// PERF_SAMPLE_CALLCHAIN requested.
    pub callchain: bool,
    /// (kernel event id, index in the session's event list), sorted by id.
    ids: Vec<(u64, u32)>,
    /// Set while every id maps to the same event: no lookup needed.
    only: Option<u32>,
    /// Chain vectors to reuse ([`Decoder::recycle`]).
    chains: std::cell::RefCell<Vec<Vec<(CpuMode, u64)>>>,
}

/// Chain vectors kept for reuse, at most (about a second of samples at
/// -F 4000 on 16 CPUs).
const CHAIN_POOL: usize = 1 << 16;

#[inline]
fn u64_at(b: &[u8], off: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(b.get(off..off + 8)?.try_into().ok()?))
}

#[inline]
fn u16_at(b: &[u8], off: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(off..off + 2)?.try_into().ok()?))
}

#[inline]
fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(off..off + 4)?.try_into().ok()?))
}

/// A NUL-terminated string in `b`, lossily decoded.
fn c_str(b: &[u8]) -> Arc<str> {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    match std::str::from_utf8(&b[..end]) {
        Ok(s) => Arc::from(s),
        Err(_) => Arc::from(String::from_utf8_lossy(&b[..end]).as_ref()),
    }
}

/// The `sample_id_all` trailer fields.
struct Trailer {
    time: u64,
    cpu: u32,
}

fn trailer(rec: &[u8]) -> Option<Trailer> {
    let t = rec.len().checked_sub(TRAILER)?;
    Some(Trailer {
        time: u64_at(rec, t + 8)?,
        cpu: u32_at(rec, t + 16)?,
    })
}

impl Decoder {
    pub(crate) fn new(callchain: bool) -> Decoder {
        Decoder {
            callchain,
            ids: Vec::new(),
            only: None,
            chains: std::cell::RefCell::new(Vec::new()),
        }
    }

    /// Emptied chain vectors of converted samples, reused by the next
    /// samples: a recorder's converter runs on another thread, and every
    /// chain allocated here and freed there was a cross-thread free (glibc's
    /// slowest kind) per sample.
    pub(crate) fn recycle(&mut self, chains: impl IntoIterator<Item = Vec<(CpuMode, u64)>>) {
        let pool = self.chains.get_mut();
        for c in chains {
            if pool.len() >= CHAIN_POOL {
                break;
            }
            pool.push(c);
        }
    }

    /// The same ids and layout, no chain vectors (for another thread).
    pub(crate) fn config(&self) -> Decoder {
        Decoder {
            callchain: self.callchain,
            ids: self.ids.clone(),
            only: self.only,
            chains: Default::default(),
        }
    }

    pub(crate) fn add_id(&mut self, id: u64, event: u32) {
        let pos = self.ids.partition_point(|&(i, _)| i < id);
        self.ids.insert(pos, (id, event));
        self.only = match (self.ids.len(), self.only) {
            (1, _) => Some(event),
            (_, Some(e)) if e == event => Some(e),
            _ => None,
        };
    }

    fn event_of(&self, id: u64) -> Option<u32> {
        if let Some(e) = self.only {
            return Some(e);
        }
        self.ids
            .binary_search_by_key(&id, |&(i, _)| i)
            .ok()
            .map(|p| self.ids[p].1)
    }

    /// Decode one record (header included). Malformed or uninteresting
    /// records are skipped. Lost counts are added to `lost`.
    pub(crate) fn decode(&self, rec: &[u8], out: &mut Vec<(u64, Record)>, lost: &mut u64) {
        let (Some(ty), Some(misc)) = (u32_at(rec, 0), rec.get(4..6)) else {
            return;
        };
        let misc = u16::from_ne_bytes([misc[0], misc[1]]);
        let body = 8;
        let decoded = match ty {
            sys::PERF_RECORD_SAMPLE => self.sample(rec, misc),
            sys::PERF_RECORD_MMAP2 => mmap2(rec, misc),
            sys::PERF_RECORD_MMAP => mmap1(rec),
            sys::PERF_RECORD_COMM => (|| {
                let t = trailer(rec)?;
                let end = rec.len() - TRAILER;
                Some((
                    t.time,
                    Record::Comm {
                        pid: u32_at(rec, body)?,
                        tid: u32_at(rec, body + 4)?,
                        comm: c_str(rec.get(body + 8..end)?),
                        exec: misc & MISC_COMM_EXEC != 0,
                        time: t.time,
                    },
                ))
            })(),
            sys::PERF_RECORD_FORK | sys::PERF_RECORD_EXIT => (|| {
                let pid = u32_at(rec, body)?;
                let ppid = u32_at(rec, body + 4)?;
                let tid = u32_at(rec, body + 8)?;
                let ptid = u32_at(rec, body + 12)?;
                let time = u64_at(rec, body + 16)?;
                Some((
                    time,
                    if ty == sys::PERF_RECORD_FORK {
                        Record::Fork {
                            pid,
                            ppid,
                            tid,
                            ptid,
                            time,
                        }
                    } else {
                        Record::Exit { pid, tid, time }
                    },
                ))
            })(),
            sys::PERF_RECORD_KSYMBOL => (|| {
                // { u64 addr; u32 len; u16 ksym_type; u16 flags; char name[]; }
                let t = trailer(rec)?;
                let addr = u64_at(rec, body)?;
                let len = u32_at(rec, body + 8)?;
                let kind = u16_at(rec, body + 12)?;
                let flags = u16_at(rec, body + 14)?;
                let end = rec.len().checked_sub(TRAILER)?;
                Some((
                    t.time,
                    Record::Ksymbol {
                        addr,
                        len: u64::from(len),
                        name: c_str(rec.get(body + 16..end)?),
                        bpf: u32::from(kind) == sys::PERF_RECORD_KSYMBOL_TYPE_BPF,
                        unregister: u32::from(flags) & sys::PERF_RECORD_KSYMBOL_FLAGS_UNREGISTER
                            != 0,
                        time: t.time,
                    },
                ))
            })(),
            sys::PERF_RECORD_LOST => (|| {
                let t = trailer(rec)?;
                let count = u64_at(rec, body + 8)?;
                *lost += count;
                Some((
                    t.time,
                    Record::Lost {
                        cpu: Some(t.cpu),
                        count,
                    },
                ))
            })(),
            sys::PERF_RECORD_LOST_SAMPLES => (|| {
                let t = trailer(rec)?;
                let count = u64_at(rec, body)?;
                *lost += count;
                Some((
                    t.time,
                    Record::Lost {
                        cpu: Some(t.cpu),
                        count,
                    },
                ))
            })(),
            _ => None,
        };
        if let Some(d) = decoded {
            out.push(d);
        }
    }

    fn sample(&self, rec: &[u8], misc: u16) -> Option<(u64, Record)> {
        let id = u64_at(rec, 8)?;
        let event = self.event_of(id)?;
        let ip = u64_at(rec, 16)?;
        let pid = u32_at(rec, 24)?;
        let tid = u32_at(rec, 28)?;
        let time = u64_at(rec, 32)?;
        let cpu = u32_at(rec, 40)?;
        let period = u64_at(rec, 48)?;
        let mode = CpuMode::from_misc(misc);
        let callchain = if self.callchain {
            let nr = usize::try_from(u64_at(rec, 56)?).ok()?;
            let bytes = rec.get(64..64usize.checked_add(nr.checked_mul(8)?)?)?;
            // SAFETY: any bit pattern is a valid u64; align_to reports any
            // misaligned head, which is handled by the copying path.
            let (pre, ips, post) = unsafe { bytes.align_to::<u64>() };
            let mut chain = self.chains.borrow_mut().pop().unwrap_or_default();
            chain.clear();
            if pre.is_empty() && post.is_empty() {
                split_callchain_into(ips, mode, &mut chain);
            } else {
                let ips: Vec<u64> = bytes
                    .chunks_exact(8)
                    .filter_map(|c| c.try_into().ok().map(u64::from_ne_bytes))
                    .collect();
                split_callchain_into(&ips, mode, &mut chain);
            }
            chain
        } else {
            Vec::new()
        };
        Some((
            time,
            Record::Sample(SampleRecord {
                event,
                ip,
                pid,
                tid,
                cpu,
                time,
                mode,
                period,
                callchain,
            }),
        ))
    }
}

/// Kernel pid -1 (kernel and module maps) becomes `u32::MAX`.
fn mmap_pid(pid: u32) -> u32 {
    if pid as i32 == -1 {
        u32::MAX
    } else {
        pid
    }
}

/// PERF_RECORD_MMAP2: pid, tid, addr, len, pgoff, {maj, min, ino,
/// ino_generation | build_id_size, reserved, build_id[20]}, prot, flags,
/// filename.
fn mmap2(rec: &[u8], misc: u16) -> Option<(u64, Record)> {
    let t = trailer(rec)?;
    let pid = mmap_pid(u32_at(rec, 8)?);
    let tid = u32_at(rec, 12)?;
    let start = u64_at(rec, 16)?;
    let len = u64_at(rec, 24)?;
    let pgoff = u64_at(rec, 32)?;
    let build_id = if misc & MISC_MMAP_BUILD_ID != 0 {
        let n = (*rec.get(40)? as usize).min(20);
        Some(Arc::from(rec.get(44..44 + n)?))
    } else {
        None
    };
    let prot = u32_at(rec, 64)?;
    let path = c_str(rec.get(72..rec.len() - TRAILER)?);
    Some((
        t.time,
        Record::Mmap {
            pid,
            tid,
            start,
            len,
            pgoff,
            path,
            build_id,
            executable: prot & libc::PROT_EXEC as u32 != 0,
            time: t.time,
        },
    ))
}

/// PERF_RECORD_MMAP (only if a kernel ignores mmap2): executable unless
/// the kernel flagged it as data.
fn mmap1(rec: &[u8]) -> Option<(u64, Record)> {
    let t = trailer(rec)?;
    let misc = u16::from_ne_bytes(rec.get(4..6)?.try_into().ok()?);
    Some((
        t.time,
        Record::Mmap {
            pid: mmap_pid(u32_at(rec, 8)?),
            tid: u32_at(rec, 12)?,
            start: u64_at(rec, 16)?,
            len: u64_at(rec, 24)?,
            pgoff: u64_at(rec, 32)?,
            path: c_str(rec.get(40..rec.len() - TRAILER)?),
            build_id: None,
            executable: misc & sys::PERF_RECORD_MISC_MMAP_DATA as u16 == 0,
            time: t.time,
        },
    ))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Build a record: header + 8-byte-aligned body.
    pub(crate) fn record(ty: u32, misc: u16, body: &[u8]) -> Vec<u64> {
        let mut b = body.to_vec();
        b.resize(body.len().div_ceil(8) * 8, 0);
        let size = (b.len() + 8) as u16;
        let mut words = vec![u64::from(ty) | u64::from(misc) << 32 | u64::from(size) << 48];
        words.extend(
            b.chunks_exact(8)
                .map(|c| u64::from_ne_bytes(c.try_into().unwrap())),
        );
        words
    }

    fn bytes(w: &[u64]) -> Vec<u8> {
        w.iter().flat_map(|x| x.to_ne_bytes()).collect()
    }

    fn trailer_bytes(pid: u32, tid: u32, time: u64, cpu: u32, id: u64) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&pid.to_ne_bytes());
        v.extend_from_slice(&tid.to_ne_bytes());
        v.extend_from_slice(&time.to_ne_bytes());
        v.extend_from_slice(&cpu.to_ne_bytes());
        v.extend_from_slice(&0u32.to_ne_bytes());
        v.extend_from_slice(&id.to_ne_bytes());
        v
    }

    fn decode_one(d: &Decoder, rec: &[u64]) -> (Option<(u64, Record)>, u64) {
        let mut out = Vec::new();
        let mut lost = 0;
        // Aligned view of the words, as the ring hands them over.
        let b = rec.as_ptr() as *const u8;
        // SAFETY: test-only view of an owned u64 buffer.
        let s = unsafe { std::slice::from_raw_parts(b, rec.len() * 8) };
        d.decode(s, &mut out, &mut lost);
        assert!(out.len() <= 1);
        (out.pop(), lost)
    }

    fn sample_body(id: u64, ip: u64, chain: Option<&[u64]>) -> Vec<u8> {
        let mut words = vec![id, ip, 10 | (11u64 << 32), 5_000, 3, 250_000];
        if let Some(c) = chain {
            words.push(c.len() as u64);
            words.extend_from_slice(c);
        }
        bytes(&words)
    }

    #[test]
    fn samples_map_ids_and_split_callchains() {
        let mut d = Decoder::new(true);
        d.add_id(900, 1);
        d.add_id(100, 0);
        let kernel_marker = (-128i64) as u64;
        let user_marker = (-512i64) as u64;
        let chain = [kernel_marker, 0xffff_ffff_8100_0010, user_marker, 0x401000];
        let rec = record(
            sys::PERF_RECORD_SAMPLE,
            1,
            &sample_body(900, 0xffff_ffff_8100_0010, Some(&chain)),
        );
        let (got, _) = decode_one(&d, &rec);
        let (time, Record::Sample(s)) = got.unwrap() else {
            panic!("not a sample")
        };
        assert_eq!(time, 5_000);
        assert_eq!(
            (s.event, s.pid, s.tid, s.cpu, s.period),
            (1, 10, 11, 3, 250_000)
        );
        assert_eq!(s.mode, CpuMode::Kernel);
        assert_eq!(
            s.callchain,
            vec![
                (CpuMode::Kernel, 0xffff_ffff_8100_0010),
                (CpuMode::User, 0x401000)
            ]
        );
        // Unknown id: skipped, not mis-attributed.
        let rec = record(sys::PERF_RECORD_SAMPLE, 2, &sample_body(5, 1, Some(&[])));
        assert!(decode_one(&d, &rec).0.is_none());
        // Callchain length past the record: skipped.
        let mut body = sample_body(100, 1, Some(&[]));
        body[48..56].copy_from_slice(&1000u64.to_ne_bytes());
        assert!(decode_one(&d, &record(sys::PERF_RECORD_SAMPLE, 2, &body))
            .0
            .is_none());
    }

    #[test]
    fn side_band_records() {
        let d = Decoder::new(false);
        // MMAP2 with a build id.
        let mut b = Vec::new();
        for w in [7u32, 8] {
            b.extend_from_slice(&w.to_ne_bytes());
        }
        for w in [0x400000u64, 0x1000, 0x2000] {
            b.extend_from_slice(&w.to_ne_bytes());
        }
        b.push(20);
        b.extend_from_slice(&[0, 0, 0]);
        b.extend((0..20).map(|i| i as u8));
        b.extend_from_slice(&(libc::PROT_READ | libc::PROT_EXEC).to_ne_bytes());
        b.extend_from_slice(&2u32.to_ne_bytes());
        b.extend_from_slice(b"/usr/bin/dash\0\0\0");
        b.extend(trailer_bytes(7, 8, 42, 1, 100));
        let (got, _) = decode_one(
            &d,
            &record(sys::PERF_RECORD_MMAP2, 2 | MISC_MMAP_BUILD_ID, &b),
        );
        let Some((
            42,
            Record::Mmap {
                pid,
                path,
                build_id,
                executable,
                start,
                len,
                pgoff,
                ..
            },
        )) = got
        else {
            panic!("bad mmap2 {got:?}")
        };
        assert_eq!((pid, start, len, pgoff), (7, 0x400000, 0x1000, 0x2000));
        assert_eq!(&*path, "/usr/bin/dash");
        assert!(executable);
        assert_eq!(build_id.unwrap().len(), 20);

        // COMM from exec.
        let mut b = Vec::new();
        b.extend_from_slice(&7u32.to_ne_bytes());
        b.extend_from_slice(&8u32.to_ne_bytes());
        b.extend_from_slice(b"sh\0\0\0\0\0\0");
        b.extend(trailer_bytes(7, 8, 43, 1, 100));
        let (got, _) = decode_one(&d, &record(sys::PERF_RECORD_COMM, MISC_COMM_EXEC, &b));
        assert_eq!(
            got,
            Some((
                43,
                Record::Comm {
                    pid: 7,
                    tid: 8,
                    comm: Arc::from("sh"),
                    exec: true,
                    time: 43
                }
            ))
        );

        // FORK and EXIT.
        let mut b = Vec::new();
        for w in [9u32, 7, 9, 8] {
            b.extend_from_slice(&w.to_ne_bytes());
        }
        b.extend_from_slice(&44u64.to_ne_bytes());
        b.extend(trailer_bytes(9, 9, 44, 0, 100));
        let fork = decode_one(&d, &record(sys::PERF_RECORD_FORK, 0, &b)).0;
        assert_eq!(
            fork,
            Some((
                44,
                Record::Fork {
                    pid: 9,
                    ppid: 7,
                    tid: 9,
                    ptid: 8,
                    time: 44
                }
            ))
        );
        let exit = decode_one(&d, &record(sys::PERF_RECORD_EXIT, 0, &b)).0;
        assert_eq!(
            exit,
            Some((
                44,
                Record::Exit {
                    pid: 9,
                    tid: 9,
                    time: 44
                }
            ))
        );

        // LOST.
        let mut b = Vec::new();
        b.extend_from_slice(&100u64.to_ne_bytes());
        b.extend_from_slice(&17u64.to_ne_bytes());
        b.extend(trailer_bytes(0, 0, 45, 1, 100));
        let (got, lost) = decode_one(&d, &record(sys::PERF_RECORD_LOST, 0, &b));
        assert_eq!(
            got,
            Some((
                45,
                Record::Lost {
                    cpu: Some(1),
                    count: 17
                }
            ))
        );
        assert_eq!(lost, 17);

        // KSYMBOL: a BPF program registered, then the same range removed.
        for (flags, unregister) in [(0u16, false), (1, true)] {
            let mut b = Vec::new();
            b.extend_from_slice(&0xffff_ffff_c000_1000u64.to_ne_bytes());
            b.extend_from_slice(&0x80u32.to_ne_bytes());
            b.extend_from_slice(&1u16.to_ne_bytes());
            b.extend_from_slice(&flags.to_ne_bytes());
            b.extend_from_slice(b"bpf_prog_6deef7357e7b4530_sd_fw_ingress\0");
            while b.len() % 8 != 0 {
                b.push(0);
            }
            b.extend(trailer_bytes(0, 0, 46, 1, 100));
            let (got, _) = decode_one(&d, &record(sys::PERF_RECORD_KSYMBOL, 0, &b));
            assert_eq!(
                got,
                Some((
                    46,
                    Record::Ksymbol {
                        addr: 0xffff_ffff_c000_1000,
                        len: 0x80,
                        name: Arc::from("bpf_prog_6deef7357e7b4530_sd_fw_ingress"),
                        bpf: true,
                        unregister,
                        time: 46
                    }
                ))
            );
        }

        // Truncated records are ignored, not panicked on.
        assert!(
            decode_one(&d, &record(sys::PERF_RECORD_KSYMBOL, 0, &[0u8; 12]))
                .0
                .is_none()
        );
        let short = record(sys::PERF_RECORD_MMAP2, 0, &[0u8; 8]);
        assert!(decode_one(&d, &short).0.is_none());
        assert!(decode_one(&d, &record(sys::PERF_RECORD_COMM, 0, &[]))
            .0
            .is_none());
    }
}
