//! A writer of small perf.data files for tests.
//!
//! `linux-perf-data` only reads, so tests that need records no real recording
//! here produces (guest-mode samples, build-id MMAP2, lost records, piped
//! format) build them with [`PerfDataBuilder`]:
//!
//! ```
//! use vmscope_perfdata::testutil::{MmapSpec, PerfDataBuilder, SampleSpec};
//! use vmscope_model::CpuMode;
//! let bytes = PerfDataBuilder::new()
//!     .comm(42, 42, "qemu")
//!     .mmap(MmapSpec::file(42, 0x40_0000, 0x1000, 0, "/usr/bin/qemu"))
//!     .sample(SampleSpec { pid: 42, tid: 43, ip: 0xffff_ffff_8100_0000, mode: CpuMode::GuestKernel, ..SampleSpec::default() })
//!     .to_bytes();
//! assert_eq!(&bytes[..8], b"PERFILE2");
//! ```
//!
//! The file has one attr (default `cpu-clock`, period 1,000,000) with
//! `sample_type` IP|TID|TIME|CPU|PERIOD|CALLCHAIN and `sample_id_all`, little
//! endian, records in the order they were added.

use std::io;
use std::path::Path;
use vmscope_model::CpuMode;

const SAMPLE_TYPE: u64 = 1 | 2 | 4 | (1 << 5) | (1 << 7) | (1 << 8);
const ATTR_SIZE: usize = 128;
const FLAG_MMAP: u64 = 1 << 8;
const FLAG_COMM: u64 = 1 << 9;
const FLAG_FREQ: u64 = 1 << 10;
const FLAG_SAMPLE_ID_ALL: u64 = 1 << 18;
const FLAG_BUILD_ID: u64 = 1 << 34;
const MISC_COMM_EXEC: u16 = 1 << 13;
const MISC_MMAP_DATA: u16 = 1 << 13;
const MISC_MMAP_BUILD_ID: u16 = 1 << 14;
const MISC_BUILD_ID_SIZE: u16 = 1 << 15;

/// One sample. `callchain` is raw (leaf first, context markers allowed);
/// when empty the written chain is just `ip`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SampleSpec {
    pub pid: u32,
    pub tid: u32,
    pub cpu: u32,
    pub time: u64,
    pub ip: u64,
    pub period: u64,
    pub mode: CpuMode,
    pub callchain: Vec<u64>,
}

impl Default for SampleSpec {
    fn default() -> SampleSpec {
        SampleSpec {
            pid: 1,
            tid: 1,
            cpu: 0,
            time: 0,
            ip: 0,
            period: 1_000_000,
            mode: CpuMode::User,
            callchain: Vec::new(),
        }
    }
}

/// One mapping, written as MMAP or (with `mmap2`) MMAP2.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MmapSpec {
    /// `u32::MAX` writes perf's kernel pid -1.
    pub pid: u32,
    pub tid: u32,
    pub start: u64,
    pub len: u64,
    pub pgoff: u64,
    pub path: String,
    pub executable: bool,
    pub mode: CpuMode,
    pub mmap2: bool,
    /// Written into an MMAP2 record (implies `mmap2`).
    pub build_id: Option<Vec<u8>>,
}

impl MmapSpec {
    /// An executable file mapping of a user process, as an MMAP record.
    pub fn file(pid: u32, start: u64, len: u64, pgoff: u64, path: &str) -> MmapSpec {
        MmapSpec {
            pid,
            tid: pid,
            start,
            len,
            pgoff,
            path: path.to_string(),
            executable: true,
            mode: CpuMode::User,
            mmap2: false,
            build_id: None,
        }
    }
}

/// Builds a perf.data file record by record.
#[derive(Debug, Clone)]
pub struct PerfDataBuilder {
    type_: u32,
    config: u64,
    period_or_freq: u64,
    freq: bool,
    name: Option<String>,
    hostname: Option<String>,
    build_ids: Vec<(String, Vec<u8>, CpuMode)>,
    now: u64,
    data: Vec<u8>,
    ids: Vec<u64>,
    /// An MMAP2 record with a build id was added: the attr asks for them
    /// (`perf record --buildid-mmap`), as the kernel requires.
    build_id_mmaps: bool,
}

impl Default for PerfDataBuilder {
    fn default() -> Self {
        PerfDataBuilder::new()
    }
}

fn pad8(v: &mut Vec<u8>, s: &str) {
    v.extend_from_slice(s.as_bytes());
    v.push(0);
    v.resize(v.len().next_multiple_of(8), 0);
}

fn misc_of(mode: CpuMode) -> u16 {
    mode.to_misc()
}

impl PerfDataBuilder {
    pub fn new() -> PerfDataBuilder {
        PerfDataBuilder {
            type_: 1,
            config: 0,
            period_or_freq: 1_000_000,
            freq: false,
            name: None,
            hostname: None,
            build_ids: Vec::new(),
            now: 0,
            data: Vec::new(),
            ids: vec![1],
            build_id_mmaps: false,
        }
    }

    /// The event: perf_event_attr type, config and fixed sample period.
    pub fn event(mut self, type_: u32, config: u64, period: u64) -> Self {
        self.type_ = type_;
        self.config = config;
        self.period_or_freq = period;
        self.freq = false;
        self
    }

    /// Sample by frequency instead of period.
    pub fn frequency(mut self, hz: u64) -> Self {
        self.period_or_freq = hz;
        self.freq = true;
        self
    }

    /// Write an EVENT_DESC feature naming the event.
    pub fn event_name(mut self, name: &str) -> Self {
        self.name = Some(name.to_string());
        self
    }

    /// Write a HOSTNAME feature.
    pub fn hostname(mut self, name: &str) -> Self {
        self.hostname = Some(name.to_string());
        self
    }

    /// Add an entry to the BUILD_ID feature.
    pub fn build_id(mut self, path: &str, id: &[u8], mode: CpuMode) -> Self {
        self.build_ids.push((path.to_string(), id.to_vec(), mode));
        self
    }

    /// Timestamp of the following non-sample records.
    pub fn time(mut self, t: u64) -> Self {
        self.now = t;
        self
    }

    fn record(&mut self, type_: u32, misc: u16, body: &[u8], pid: u32, tid: u32) {
        // sample_id for TID|TIME|CPU: pid, tid, time, cpu, res.
        let size = 8 + body.len() + 24;
        let size = u16::try_from(size).unwrap_or(u16::MAX);
        self.data.extend_from_slice(&type_.to_le_bytes());
        self.data.extend_from_slice(&misc.to_le_bytes());
        self.data.extend_from_slice(&size.to_le_bytes());
        self.data.extend_from_slice(body);
        self.data.extend_from_slice(&pid.to_le_bytes());
        self.data.extend_from_slice(&tid.to_le_bytes());
        self.data.extend_from_slice(&self.now.to_le_bytes());
        self.data.extend_from_slice(&0u64.to_le_bytes());
    }

    /// A COMM record (not from exec).
    pub fn comm(self, pid: u32, tid: u32, name: &str) -> Self {
        self.comm_impl(pid, tid, name, false)
    }

    /// A COMM record from exec (`PERF_RECORD_MISC_COMM_EXEC`).
    pub fn comm_exec(self, pid: u32, tid: u32, name: &str) -> Self {
        self.comm_impl(pid, tid, name, true)
    }

    fn comm_impl(mut self, pid: u32, tid: u32, name: &str, exec: bool) -> Self {
        let mut b = Vec::new();
        b.extend_from_slice(&pid.to_le_bytes());
        b.extend_from_slice(&tid.to_le_bytes());
        pad8(&mut b, name);
        let misc = if exec { MISC_COMM_EXEC } else { 0 };
        self.record(3, misc, &b, pid, tid);
        self
    }

    /// An MMAP or MMAP2 record.
    pub fn mmap(self, m: MmapSpec) -> Self {
        self.mmap_with(m, None)
    }

    /// An MMAP2 record as the kernel writes it for a session that did not
    /// ask for build ids while another session on the host did: the
    /// `PERF_RECORD_MISC_MMAP_BUILD_ID` bit set (the kernel sets it on the
    /// record it shares among listeners and never clears it) over the
    /// device/inode layout: `maj`, minor 0, `ino`, generation 0.
    pub fn mmap2_leaked_build_id_bit(self, m: MmapSpec, maj: u32, ino: u64) -> Self {
        let mut field = [0u8; 24];
        field[0..4].copy_from_slice(&maj.to_le_bytes());
        field[8..16].copy_from_slice(&ino.to_le_bytes());
        self.mmap_with(
            MmapSpec {
                mmap2: true,
                build_id: None,
                ..m
            },
            Some(field),
        )
    }

    /// `leaked`: the 24 bytes after pgoff, written with the build-id bit.
    fn mmap_with(mut self, m: MmapSpec, leaked: Option<[u8; 24]>) -> Self {
        let mut b = Vec::new();
        b.extend_from_slice(&m.pid.to_le_bytes());
        b.extend_from_slice(&m.tid.to_le_bytes());
        b.extend_from_slice(&m.start.to_le_bytes());
        b.extend_from_slice(&m.len.to_le_bytes());
        b.extend_from_slice(&m.pgoff.to_le_bytes());
        let mut misc = misc_of(m.mode);
        if m.mmap2 || m.build_id.is_some() {
            if let Some(field) = leaked {
                misc |= MISC_MMAP_BUILD_ID;
                b.extend_from_slice(&field);
            } else if let Some(id) = &m.build_id {
                self.build_id_mmaps = true;
                misc |= MISC_MMAP_BUILD_ID;
                let mut field = [0u8; 24];
                let n = id.len().min(20);
                field[0] = n as u8;
                field[4..4 + n].copy_from_slice(&id[..n]);
                b.extend_from_slice(&field);
            } else {
                b.extend_from_slice(&[0u8; 24]); // maj, min, ino, ino_generation
            }
            let prot: u32 = if m.executable { 1 | 4 } else { 1 };
            b.extend_from_slice(&prot.to_le_bytes());
            b.extend_from_slice(&2u32.to_le_bytes()); // MAP_PRIVATE
            pad8(&mut b, &m.path);
            self.record(10, misc, &b, m.pid, m.tid);
        } else {
            if !m.executable {
                misc |= MISC_MMAP_DATA;
            }
            pad8(&mut b, &m.path);
            self.record(1, misc, &b, m.pid, m.tid);
        }
        self
    }

    /// A FORK record.
    pub fn fork(mut self, pid: u32, ppid: u32, tid: u32, ptid: u32) -> Self {
        let mut b = Vec::new();
        for v in [pid, ppid, tid, ptid] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&self.now.to_le_bytes());
        self.record(7, 0, &b, pid, tid);
        self
    }

    /// An EXIT record.
    pub fn exit(mut self, pid: u32, tid: u32) -> Self {
        let mut b = Vec::new();
        for v in [pid, pid, tid, tid] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&self.now.to_le_bytes());
        self.record(4, 0, &b, pid, tid);
        self
    }

    /// A LOST record.
    pub fn lost(mut self, count: u64) -> Self {
        let mut b = Vec::new();
        b.extend_from_slice(&self.ids[0].to_le_bytes());
        b.extend_from_slice(&count.to_le_bytes());
        self.record(2, 0, &b, u32::MAX, u32::MAX);
        self
    }

    /// A KSYMBOL record: kernel code at `addr..addr + len` registered (or,
    /// with `unregister`, removed); `bpf`: a BPF program.
    pub fn ksymbol(mut self, addr: u64, len: u32, name: &str, bpf: bool, unregister: bool) -> Self {
        let mut b = Vec::new();
        b.extend_from_slice(&addr.to_le_bytes());
        b.extend_from_slice(&len.to_le_bytes());
        b.extend_from_slice(&u16::from(bpf).to_le_bytes());
        b.extend_from_slice(&u16::from(unregister).to_le_bytes());
        pad8(&mut b, name);
        self.record(17, 0, &b, u32::MAX, u32::MAX);
        self
    }

    /// A LOST_SAMPLES record.
    pub fn lost_samples(mut self, count: u64) -> Self {
        self.record(13, 0, &count.to_le_bytes(), u32::MAX, u32::MAX);
        self
    }

    /// A SAMPLE record.
    pub fn sample(mut self, s: SampleSpec) -> Self {
        self.now = self.now.max(s.time);
        let chain = if s.callchain.is_empty() {
            vec![s.ip]
        } else {
            s.callchain.clone()
        };
        let size = 8 + 8 + 8 + 8 + 8 + 8 + 8 + 8 * chain.len();
        let size = u16::try_from(size).unwrap_or(u16::MAX);
        let d = &mut self.data;
        d.extend_from_slice(&9u32.to_le_bytes());
        d.extend_from_slice(&misc_of(s.mode).to_le_bytes());
        d.extend_from_slice(&size.to_le_bytes());
        d.extend_from_slice(&s.ip.to_le_bytes());
        d.extend_from_slice(&s.pid.to_le_bytes());
        d.extend_from_slice(&s.tid.to_le_bytes());
        d.extend_from_slice(&s.time.to_le_bytes());
        d.extend_from_slice(&s.cpu.to_le_bytes());
        d.extend_from_slice(&0u32.to_le_bytes());
        d.extend_from_slice(&s.period.to_le_bytes());
        d.extend_from_slice(&(chain.len() as u64).to_le_bytes());
        for ip in chain {
            d.extend_from_slice(&ip.to_le_bytes());
        }
        self
    }

    /// The perf_event_attr (128 bytes, PERF_ATTR_SIZE_VER7).
    fn attr(&self) -> Vec<u8> {
        let mut a = Vec::with_capacity(ATTR_SIZE);
        a.extend_from_slice(&self.type_.to_le_bytes());
        a.extend_from_slice(&(ATTR_SIZE as u32).to_le_bytes());
        a.extend_from_slice(&self.config.to_le_bytes());
        a.extend_from_slice(&self.period_or_freq.to_le_bytes());
        a.extend_from_slice(&SAMPLE_TYPE.to_le_bytes());
        a.extend_from_slice(&0u64.to_le_bytes()); // read_format
        let mut flags = FLAG_MMAP | FLAG_COMM | FLAG_SAMPLE_ID_ALL;
        if self.freq {
            flags |= FLAG_FREQ;
        }
        if self.build_id_mmaps {
            flags |= FLAG_BUILD_ID;
        }
        a.extend_from_slice(&flags.to_le_bytes());
        a.resize(ATTR_SIZE, 0);
        a
    }

    fn string_feature(s: &str) -> Vec<u8> {
        let mut body = s.as_bytes().to_vec();
        body.push(0);
        body.resize(body.len().next_multiple_of(64), 0);
        let mut v = (body.len() as u32).to_le_bytes().to_vec();
        v.extend(body);
        v
    }

    fn features(&self) -> Vec<(u32, Vec<u8>)> {
        let mut f = Vec::new();
        if !self.build_ids.is_empty() {
            let mut v = Vec::new();
            for (path, id, mode) in &self.build_ids {
                let mut name = Vec::new();
                pad8(&mut name, path);
                let size = (36 + name.len()) as u16;
                v.extend_from_slice(&2u32.to_le_bytes()); // HEADER_BUILD_ID
                v.extend_from_slice(&(misc_of(*mode) | MISC_BUILD_ID_SIZE).to_le_bytes());
                v.extend_from_slice(&size.to_le_bytes());
                v.extend_from_slice(&(-1i32).to_le_bytes());
                let mut field = [0u8; 24];
                let n = id.len().min(20);
                field[..n].copy_from_slice(&id[..n]);
                field[20] = n as u8;
                v.extend_from_slice(&field);
                v.extend(name);
            }
            f.push((2, v));
        }
        if let Some(h) = &self.hostname {
            f.push((3, Self::string_feature(h)));
        }
        if let Some(n) = &self.name {
            let mut v = Vec::new();
            v.extend_from_slice(&1u32.to_le_bytes());
            v.extend_from_slice(&(ATTR_SIZE as u32).to_le_bytes());
            v.extend(self.attr());
            v.extend_from_slice(&(self.ids.len() as u32).to_le_bytes());
            v.extend(Self::string_feature(n));
            for id in &self.ids {
                v.extend_from_slice(&id.to_le_bytes());
            }
            f.push((12, v));
        }
        f
    }

    /// The file, in perf's seekable format.
    pub fn to_bytes(&self) -> Vec<u8> {
        let attr_entry = ATTR_SIZE + 16;
        let attrs_off = 104u64;
        let ids_off = attrs_off + attr_entry as u64;
        let ids_len = 8 * self.ids.len() as u64;
        let data_off = ids_off + ids_len;
        let data_len = self.data.len() as u64;
        let features = self.features();
        let mut bits = [0u64; 4];
        for (f, _) in &features {
            bits[*f as usize / 64] |= 1 << (f % 64);
        }
        let mut out = Vec::new();
        out.extend_from_slice(b"PERFILE2");
        for v in [
            104,
            attr_entry as u64,
            attrs_off,
            attr_entry as u64,
            data_off,
            data_len,
            0,
            0,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for b in bits {
            out.extend_from_slice(&b.to_le_bytes());
        }
        out.extend(self.attr());
        out.extend_from_slice(&ids_off.to_le_bytes());
        out.extend_from_slice(&ids_len.to_le_bytes());
        for id in &self.ids {
            out.extend_from_slice(&id.to_le_bytes());
        }
        out.extend_from_slice(&self.data);
        let mut off = data_off + data_len + 16 * features.len() as u64;
        for (_, body) in &features {
            out.extend_from_slice(&off.to_le_bytes());
            out.extend_from_slice(&(body.len() as u64).to_le_bytes());
            off += body.len() as u64;
        }
        for (_, body) in features {
            out.extend(body);
        }
        out
    }

    /// The file, in perf's piped format (`perf record -o -`).
    pub fn to_pipe_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(b"PERFILE2");
        out.extend_from_slice(&16u64.to_le_bytes());
        let attr = self.attr();
        let size = (8 + attr.len() + 8 * self.ids.len()) as u16;
        out.extend_from_slice(&64u32.to_le_bytes()); // PERF_RECORD_HEADER_ATTR
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&size.to_le_bytes());
        out.extend(attr);
        for id in &self.ids {
            out.extend_from_slice(&id.to_le_bytes());
        }
        for (feature, body) in self.features() {
            let size = (16 + body.len()) as u16;
            out.extend_from_slice(&80u32.to_le_bytes()); // PERF_RECORD_HEADER_FEATURE
            out.extend_from_slice(&0u16.to_le_bytes());
            out.extend_from_slice(&size.to_le_bytes());
            out.extend_from_slice(&u64::from(feature).to_le_bytes());
            out.extend(body);
        }
        out.extend_from_slice(&self.data);
        out
    }

    /// Write [`PerfDataBuilder::to_bytes`] to `path`.
    pub fn write(&self, path: &Path) -> io::Result<()> {
        std::fs::write(path, self.to_bytes())
    }

    /// Write [`PerfDataBuilder::to_pipe_bytes`] to `path`.
    pub fn write_pipe(&self, path: &Path) -> io::Result<()> {
        std::fs::write(path, self.to_pipe_bytes())
    }
}
