//! The embedded object and loading a chosen subset of its programs:
//! maps sized before loading, programs not asked for left out (so the
//! verifier checks only what runs), libbpf's messages kept for the error
//! line instead of printed.

use crate::BpfError;
use libbpf_rs::{Link, MapCore, MapHandle, Object, ObjectBuilder};
use std::sync::Mutex;

/// The scheduler programs, as clang built them.
pub static SCHED: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/sched.bpf.o"));

/// Every program in [`SCHED`], by name.
pub const PROGRAMS: &[&str] = &["switch_times", "switch_waits", "migrate_waits"];

/// libbpf's last messages (it prints the verifier's log on a failed load).
static MESSAGES: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn keep_message(_level: libbpf_rs::PrintLevel, msg: String) {
    if let Ok(mut m) = MESSAGES.lock() {
        if m.len() >= 64 {
            m.remove(0);
        }
        m.push(msg.trim_end().to_string());
    }
}

/// The most telling of libbpf's last messages: the verifier's last line
/// or libbpf's own error.
fn last_message() -> String {
    let m = MESSAGES.lock().map(|m| m.clone()).unwrap_or_default();
    let lines: Vec<&str> = m.iter().flat_map(|s| s.lines()).map(str::trim).collect();
    // The verifier's verdict: the last line of its log before the
    // statistics and the end marker.
    if let Some(end) = lines
        .iter()
        .rposition(|l| l.starts_with("-- END PROG LOAD LOG --"))
    {
        if let Some(l) = lines[..end]
            .iter()
            .rev()
            .find(|l| !l.is_empty() && !l.starts_with("processed "))
        {
            return (*l).to_string();
        }
    }
    // Else libbpf's own reason (a relocation it could not make), not its
    // closing "failed to load object" line.
    lines
        .iter()
        .rev()
        .find(|l| !l.is_empty() && !l.contains("failed to load object"))
        .copied()
        .unwrap_or("")
        .to_string()
}

/// Loaded programs with their links; the maps are reached by name.
pub struct Loaded {
    obj: Object,
    links: Vec<Link>,
}

impl Loaded {
    /// An owned handle of map `name`.
    pub fn map(&self, name: &str) -> Result<MapHandle, BpfError> {
        let m = self
            .obj
            .maps()
            .find(|m| m.name() == name)
            .ok_or_else(|| BpfError::Load {
                what: format!("the eBPF map {name}"),
                msg: "not in the object".into(),
            })?;
        MapHandle::try_from(&m).map_err(|source| BpfError::Map {
            what: "duplicating a map's descriptor",
            source,
        })
    }

    /// The programs' ids (their fdinfo and `bpftool prog show id N` give
    /// `run_time_ns` when `kernel.bpf_stats_enabled` is 1).
    pub fn program_ids(&self) -> Vec<u32> {
        use std::os::fd::AsFd;
        self.obj
            .progs()
            .filter_map(|p| libbpf_rs::Program::id_from_fd(p.as_fd()).ok())
            .collect()
    }

    /// How many programs are attached.
    pub fn attached(&self) -> usize {
        self.links.len()
    }
}

/// Load `programs` of [`SCHED`] with the maps in `sizes` resized, and
/// attach them. `what` names them in the error.
pub fn load(what: &str, programs: &[&str], sizes: &[(&str, u32)]) -> Result<Loaded, BpfError> {
    libbpf_rs::set_print(Some((libbpf_rs::PrintLevel::Warn, keep_message)));
    if let Ok(mut m) = MESSAGES.lock() {
        m.clear();
    }
    let fail = |step: &str, e: libbpf_rs::Error| {
        let last = last_message();
        let denied = matches!(e.kind(), libbpf_rs::ErrorKind::PermissionDenied);
        BpfError::Load {
            what: format!("{what}: {step}"),
            msg: if denied {
                "not permitted (root, or CAP_BPF with CAP_PERFMON, is needed)".into()
            } else if last.is_empty() {
                e.to_string()
            } else {
                format!("{e} ({last})")
            },
        }
    };
    let mut open = ObjectBuilder::default()
        .open_memory(SCHED)
        .map_err(|e| fail("opening the eBPF object", e))?;
    for mut p in open.progs_mut() {
        let want = p.name().to_str().is_some_and(|n| programs.contains(&n));
        p.set_autoload(want);
    }
    for mut m in open.maps_mut() {
        if let Some(&(_, n)) = sizes.iter().find(|(name, _)| m.name() == *name) {
            m.set_max_entries(n).map_err(|e| fail("sizing a map", e))?;
        }
    }
    let obj = open
        .load()
        .map_err(|e| fail("loading the eBPF programs", e))?;
    let mut links = Vec::new();
    for p in obj.progs_mut() {
        if !p.name().to_str().is_some_and(|n| programs.contains(&n)) {
            continue;
        }
        let link = p
            .attach()
            .map_err(|e| fail("attaching an eBPF program", e))?;
        links.push(link);
    }
    visit_each_cpu();
    Ok(Loaded { obj, links })
}

/// Make every online CPU switch once, now that the programs are attached:
/// a thread moved onto each CPU in turn. A CPU that runs one task without a
/// switch (a busy vCPU alone on its CPU, a build job) would otherwise give
/// the programs nothing to start from for as long as that task runs:
/// `switch_times` would not know what runs there (the CPU's whole time
/// missing, seen here as one CPU covered 4 % by its slices beside a nice-19
/// compiler) and `switch_waits` would have no logged switch to split a
/// wait on that CPU by. The thread is the caller's and lasts a moment, so
/// the caller's own affinity is left as it was; a CPU it may not run on
/// (a cpuset) is skipped. It runs at the top real-time priority: as an
/// ordinary thread it waited up to a second for a CPU held by a real-time
/// busy loop (the kernel's throttling lets others in 50 ms a second).
fn visit_each_cpu() {
    let cpus = vmscope_linux::online_cpus(std::path::Path::new("/sys")).unwrap_or_default();
    let visitor = std::thread::spawn(move || {
        // SAFETY: sched_param is plain data; the call changes this thread
        // only (pid 0), and a refusal leaves it an ordinary thread.
        unsafe {
            let p = libc::sched_param {
                sched_priority: libc::sched_get_priority_max(libc::SCHED_FIFO),
            };
            libc::sched_setscheduler(0, libc::SCHED_FIFO, &p);
        }
        for cpu in cpus {
            // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET
            // writes within it for cpu < CPU_SETSIZE (checked);
            // sched_setaffinity(0, ..) reads the set for this thread only.
            unsafe {
                if cpu as usize >= libc::CPU_SETSIZE as usize {
                    continue;
                }
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(cpu as usize, &mut set);
                // Returns once this thread runs on `cpu` (the move is
                // done by the time the call returns): that CPU switched.
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
            }
        }
    });
    let _ = visitor.join();
}

/// The highest possible CPU + 1 (`/sys/devices/system/cpu/possible`): the
/// per-CPU maps' size.
pub fn cpu_slots() -> u32 {
    std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|s| vmscope_linux::parse_cpu_list(&s).ok())
        .and_then(|v| v.into_iter().max())
        .map_or(1, |m| m + 1)
}

/// Whether the kernel reads hash map `map` in batches (Linux 5.6 and
/// later): checked at open, since a failed batch read ends libbpf-rs's
/// iterator as if the map were empty.
pub fn check_batch_reads(map: &MapHandle, what: &str) -> Result<(), BpfError> {
    use std::os::fd::{AsFd, AsRawFd};
    let key = vec![0u8; map.key_size() as usize];
    let value = vec![0u8; map.value_size() as usize];
    let (mut keys, mut values, mut next) = (key.clone(), value, key);
    let mut count: u32 = 1;
    // SAFETY: the buffers hold `count` keys and values of the map's sizes
    // and a key for the batch position; the descriptor is open (borrowed
    // from `map`); a null `in_batch` starts at the beginning, null options
    // are the defaults.
    let r = unsafe {
        libbpf_sys::bpf_map_lookup_batch(
            map.as_fd().as_raw_fd(),
            std::ptr::null_mut(),
            next.as_mut_ptr().cast(),
            keys.as_mut_ptr().cast(),
            values.as_mut_ptr().cast(),
            &mut count,
            std::ptr::null(),
        )
    };
    // 0, or -ENOENT at the end of the map (an empty one): supported.
    if r == 0 || r == -libc::ENOENT {
        return Ok(());
    }
    Err(BpfError::Load {
        what: what.to_string(),
        msg: format!(
            "the kernel does not read eBPF hash maps in batches ({})",
            std::io::Error::from_raw_os_error(-r)
        ),
    })
}
