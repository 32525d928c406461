//! Exit records from the kernel's taskstats netlink family: the CPU time a
//! task used between the last time someone read its `schedstat` and its
//! exit, which no file under /proc still holds once it is gone.
//!
//! The listener registers for exits on every CPU
//! (`TASKSTATS_CMD_ATTR_REGISTER_CPUMASK`, needs CAP_NET_ADMIN) and reads
//! the `TASKSTATS_CMD_NEW` messages the kernel multicasts to it, without
//! blocking. Each exiting thread gives one `TASKSTATS_TYPE_AGGR_PID` with
//! its tid and a `struct taskstats`; the whole process also gives an
//! `AGGR_TGID`, skipped here. Written by hand (a netlink socket, a
//! generic-netlink family lookup and the attribute walk are ~150 lines);
//! the netlink crates on offer bring an async runtime or lack taskstats.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::sched::u64_at;
use crate::LinuxError;

const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;
const TASKSTATS_CMD_GET: u8 = 1;
const TASKSTATS_CMD_NEW: u8 = 2;
const TASKSTATS_CMD_ATTR_REGISTER_CPUMASK: u16 = 3;
const TASKSTATS_TYPE_PID: u16 = 1;
const TASKSTATS_TYPE_STATS: u16 = 3;
const TASKSTATS_TYPE_AGGR_PID: u16 = 4;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const NLMSG_ERROR: u16 = 2;
const NLA_F_MASK: u16 = !(0x8000 | 0x4000);

/// Offsets in `struct taskstats` (include/uapi/linux/taskstats.h; stable
/// since version 1, fields are only ever appended).
const TS_CPU_RUN_REAL: usize = 64;
const TS_CPU_RUN_VIRTUAL: usize = 72;
const TS_COMM: usize = 80;
const TS_COMM_LEN: usize = 32;

/// One thread's exit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskExit {
    pub tid: u32,
    pub comm: String,
    /// The scheduler's run time of the thread (`se.sum_exec_runtime`, the
    /// first field of `schedstat`), nanoseconds: taskstats' "virtual" CPU.
    /// The kernel takes it at the start of `do_exit`, so the exit's own
    /// teardown (unmapping memory, closing files) is not in it; a
    /// `schedstat` read from outside during that teardown can be higher
    /// (CI saw 4 ms more for a 314 ms shell).
    pub run_ns: u64,
    /// utime + stime in nanoseconds (tick based): taskstats' "real" CPU.
    pub cputime_ns: u64,
}

/// A taskstats exit listener on every CPU.
pub struct ExitListener {
    fd: OwnedFd,
    family: u16,
    buf: Vec<u8>,
    /// Exit messages the socket had no room for (ENOBUFS).
    overruns: u64,
    /// Exits that arrived while waiting for the registration's answer.
    pending: Vec<TaskExit>,
}

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

fn attr(out: &mut Vec<u8>, ty: u16, payload: &[u8]) {
    out.extend_from_slice(&((4 + payload.len()) as u16).to_ne_bytes());
    out.extend_from_slice(&ty.to_ne_bytes());
    out.extend_from_slice(payload);
    out.resize(align4(out.len()), 0);
}

fn genl_msg(family: u16, cmd: u8, seq: u32, attrs: &[u8]) -> Vec<u8> {
    genl_msg_flags(family, cmd, seq, attrs, NLM_F_REQUEST)
}

fn genl_msg_flags(family: u16, cmd: u8, seq: u32, attrs: &[u8], flags: u16) -> Vec<u8> {
    let len = 16 + 4 + attrs.len();
    let mut m = Vec::with_capacity(len);
    m.extend_from_slice(&(len as u32).to_ne_bytes());
    m.extend_from_slice(&family.to_ne_bytes());
    m.extend_from_slice(&flags.to_ne_bytes());
    m.extend_from_slice(&seq.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.extend_from_slice(&[cmd, 1, 0, 0]);
    m.extend_from_slice(attrs);
    m
}

/// The attributes of a payload: (type without flags, payload).
pub(crate) fn attrs(mut b: &[u8]) -> Vec<(u16, &[u8])> {
    let mut out = Vec::new();
    while b.len() >= 4 {
        let len = u16::from_ne_bytes([b[0], b[1]]) as usize;
        let ty = u16::from_ne_bytes([b[2], b[3]]) & NLA_F_MASK;
        if len < 4 || len > b.len() {
            break;
        }
        out.push((ty, &b[4..len]));
        b = &b[align4(len).min(b.len())..];
    }
    out
}

/// The netlink messages in one datagram: (type, payload after nlmsghdr).
pub(crate) fn messages(mut b: &[u8]) -> Vec<(u16, &[u8])> {
    let mut out = Vec::new();
    while b.len() >= 16 {
        let len = u32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as usize;
        let ty = u16::from_ne_bytes([b[4], b[5]]);
        if len < 16 || len > b.len() {
            break;
        }
        out.push((ty, &b[16..len]));
        b = &b[align4(len).min(b.len())..];
    }
    out
}

/// Thread exits in one generic-netlink payload (genlmsghdr + attributes).
pub(crate) fn parse_exits(genl: &[u8], out: &mut Vec<TaskExit>) {
    if genl.len() < 4 || genl[0] != TASKSTATS_CMD_NEW {
        return;
    }
    for (ty, nested) in attrs(&genl[4..]) {
        if ty != TASKSTATS_TYPE_AGGR_PID {
            continue;
        }
        let mut tid = None;
        let mut stats = None;
        for (t, p) in attrs(nested) {
            match t {
                TASKSTATS_TYPE_PID if p.len() >= 4 => {
                    tid = Some(u32::from_ne_bytes([p[0], p[1], p[2], p[3]]));
                }
                TASKSTATS_TYPE_STATS => stats = Some(p),
                _ => {}
            }
        }
        let (Some(tid), Some(s)) = (tid, stats) else {
            continue;
        };
        let (Some(run_ns), Some(cputime_ns)) =
            (u64_at(s, TS_CPU_RUN_VIRTUAL), u64_at(s, TS_CPU_RUN_REAL))
        else {
            continue;
        };
        let comm = s
            .get(TS_COMM..TS_COMM + TS_COMM_LEN)
            .map(|c| {
                let end = c.iter().position(|&x| x == 0).unwrap_or(c.len());
                String::from_utf8_lossy(&c[..end]).into_owned()
            })
            .unwrap_or_default();
        out.push(TaskExit {
            tid,
            comm,
            run_ns,
            cputime_ns,
        });
    }
}

impl ExitListener {
    /// Open a listener for exits on `cpus` (the online CPUs).
    pub fn open(cpus: &[u32]) -> Result<ExitListener, LinuxError> {
        let sys = |what: &'static str| LinuxError::Sys {
            what,
            source: std::io::Error::last_os_error(),
        };
        // SAFETY: plain socket(2); the result is checked.
        let raw = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_GENERIC,
            )
        };
        if raw < 0 {
            return Err(sys("socket(AF_NETLINK, NETLINK_GENERIC)"));
        }
        // SAFETY: raw is a new fd owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // Room for bursts of exits between two reads.
        let size: libc::c_int = 4 << 20;
        // SAFETY: valid fd and option pointer/length. Failure leaves the default.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVBUF,
                &raw const size as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
        // SAFETY: zeroed sockaddr_nl is valid; family set below.
        let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        sa.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        // SAFETY: sa is a valid sockaddr_nl of the given size.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                &raw const sa as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(sys("bind(netlink)"));
        }
        let mut l = ExitListener {
            fd,
            family: 0,
            buf: vec![0u8; 64 << 10],
            overruns: 0,
            pending: Vec::new(),
        };
        // The family id of "TASKSTATS".
        let mut a = Vec::new();
        attr(&mut a, CTRL_ATTR_FAMILY_NAME, b"TASKSTATS\0");
        l.send(&genl_msg(GENL_ID_CTRL, CTRL_CMD_GETFAMILY, 1, &a))?;
        let n = l.recv(true)?;
        let mut family = None;
        for (ty, payload) in messages(&l.buf[..n]) {
            if ty == NLMSG_ERROR {
                return Err(LinuxError::Options(
                    "the kernel has no taskstats netlink family (CONFIG_TASKSTATS)".into(),
                ));
            }
            if payload.len() >= 4 {
                for (t, p) in attrs(&payload[4..]) {
                    if t == CTRL_ATTR_FAMILY_ID && p.len() >= 2 {
                        family = Some(u16::from_ne_bytes([p[0], p[1]]));
                    }
                }
            }
        }
        l.family = family.ok_or_else(|| {
            LinuxError::Options("no taskstats family id in the kernel's answer".into())
        })?;
        // Register for exits on every CPU.
        let mask = cpus
            .iter()
            .map(std::string::ToString::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let mut a = Vec::new();
        let mut m = mask.into_bytes();
        m.push(0);
        attr(&mut a, TASKSTATS_CMD_ATTR_REGISTER_CPUMASK, &m);
        l.send(&genl_msg_flags(
            l.family,
            TASKSTATS_CMD_GET,
            2,
            &a,
            NLM_F_REQUEST | NLM_F_ACK,
        ))?;
        // The answer (an ack or an error); exits may come first.
        loop {
            let n = l.recv(true)?;
            let buf = std::mem::take(&mut l.buf);
            let mut answer = None;
            for (ty, payload) in messages(&buf[..n]) {
                if ty == NLMSG_ERROR && payload.len() >= 4 {
                    answer = Some(i32::from_ne_bytes([
                        payload[0], payload[1], payload[2], payload[3],
                    ]));
                } else if ty == l.family {
                    parse_exits(payload, &mut l.pending);
                }
            }
            l.buf = buf;
            match answer {
                Some(0) => return Ok(l),
                Some(e) => {
                    return Err(LinuxError::Sys {
                        what: "registering for taskstats exit records (needs CAP_NET_ADMIN)",
                        source: std::io::Error::from_raw_os_error(-e),
                    })
                }
                None => continue,
            }
        }
    }

    fn send(&self, msg: &[u8]) -> Result<(), LinuxError> {
        // SAFETY: zeroed sockaddr_nl addresses the kernel (pid 0).
        let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        sa.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        // SAFETY: msg and sa are valid for the given lengths.
        let rc = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                msg.as_ptr() as *const libc::c_void,
                msg.len(),
                0,
                &raw const sa as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(LinuxError::Sys {
                what: "sendto(taskstats netlink)",
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(())
    }

    /// One datagram into `buf`; 0 when none is waiting (`block` false).
    fn recv(&mut self, block: bool) -> Result<usize, LinuxError> {
        loop {
            // SAFETY: buf is valid for its length.
            let n = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    self.buf.as_mut_ptr() as *mut libc::c_void,
                    self.buf.len(),
                    if block { 0 } else { libc::MSG_DONTWAIT },
                )
            };
            if n >= 0 {
                return Ok(n as usize);
            }
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) => return Ok(0),
                Some(libc::ENOBUFS) => {
                    self.overruns += 1;
                    continue;
                }
                _ => {
                    return Err(LinuxError::Sys {
                        what: "recv(taskstats netlink)",
                        source: e,
                    })
                }
            }
        }
    }

    /// Every exit waiting on the socket, appended to `out`. Never blocks.
    pub fn drain(&mut self, out: &mut Vec<TaskExit>) -> Result<(), LinuxError> {
        out.append(&mut self.pending);
        loop {
            let n = self.recv(false)?;
            if n == 0 {
                return Ok(());
            }
            let buf = std::mem::take(&mut self.buf);
            for (ty, payload) in messages(&buf[..n]) {
                if ty == self.family {
                    parse_exits(payload, out);
                }
            }
            self.buf = buf;
        }
    }

    /// Times the socket overflowed (exits lost).
    pub fn overruns(&self) -> u64 {
        self.overruns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exit_msg(tid: u32, run: u64, real: u64, comm: &str) -> Vec<u8> {
        let mut stats = vec![0u8; 400];
        stats[0..2].copy_from_slice(&14u16.to_ne_bytes());
        stats[TS_CPU_RUN_REAL..TS_CPU_RUN_REAL + 8].copy_from_slice(&real.to_ne_bytes());
        stats[TS_CPU_RUN_VIRTUAL..TS_CPU_RUN_VIRTUAL + 8].copy_from_slice(&run.to_ne_bytes());
        stats[TS_COMM..TS_COMM + comm.len()].copy_from_slice(comm.as_bytes());
        let mut nested = Vec::new();
        attr(&mut nested, TASKSTATS_TYPE_PID, &tid.to_ne_bytes());
        attr(&mut nested, TASKSTATS_TYPE_STATS, &stats);
        let mut top = Vec::new();
        attr(&mut top, TASKSTATS_TYPE_AGGR_PID, &nested);
        // The process-wide record that follows a group exit: skipped.
        let mut tg = Vec::new();
        attr(&mut tg, 2, &tid.to_ne_bytes());
        attr(&mut tg, TASKSTATS_TYPE_STATS, &stats);
        attr(&mut top, 5, &tg);
        genl_msg(0x17, TASKSTATS_CMD_NEW, 0, &top)
    }

    #[test]
    fn parses_exit_messages() {
        let mut dgram = exit_msg(4242, 1_500_000, 1_000_000, "worker");
        dgram.extend(exit_msg(4243, 7, 0, "x"));
        let msgs = messages(&dgram);
        assert_eq!(msgs.len(), 2);
        let mut out = Vec::new();
        for (ty, p) in msgs {
            assert_eq!(ty, 0x17);
            parse_exits(p, &mut out);
        }
        assert_eq!(
            out[0],
            TaskExit {
                tid: 4242,
                comm: "worker".into(),
                run_ns: 1_500_000,
                cputime_ns: 1_000_000
            }
        );
        assert_eq!(out[1].tid, 4243);
        assert_eq!(out.len(), 2);
    }

    #[test]
    fn truncated_messages_are_skipped() {
        let m = exit_msg(1, 2, 3, "t");
        for cut in 0..m.len() {
            let mut out = Vec::new();
            for (_, p) in messages(&m[..cut]) {
                parse_exits(p, &mut out);
            }
            assert!(out.len() <= 1);
        }
        // An attribute whose length runs past the end.
        let mut bad = m.clone();
        bad[20..22].copy_from_slice(&60000u16.to_ne_bytes());
        let mut out = Vec::new();
        for (_, p) in messages(&bad) {
            parse_exits(p, &mut out);
        }
        assert!(out.is_empty());
    }
}
