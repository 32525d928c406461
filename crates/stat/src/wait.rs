//! Who took a VM's CPU: the time each followed thread (vCPU threads and a
//! VM's own I/O threads) was runnable but not running, charged to what ran
//! on the CPU it waited for. Built from the scheduler's events in time order
//! ([`vmscope_linux::SchedEventRecorder`]); pure, so the rules are
//! unit-tested on hand-built event streams.
//!
//! The rules follow the kernel's `sched_info` bookkeeping, whose sum is
//! `run_delay` in `/proc/PID/task/TID/schedstat`
//! (docs/architecture.md §5.1):
//! - a wait starts when the task is put on a runqueue: a wake-up
//!   (`sched_wakeup`, `sched_wakeup_new`, whose `target_cpu` is the
//!   runqueue) or a switch-out that leaves it runnable (`prev_state` R or
//!   R+: preempted or yielding, see [`still_runnable`]); a switch-out in
//!   any other state ends its time on the runqueue without a wait;
//! - while it waits, each stretch is charged to the task running on that
//!   CPU (`idle` when the idle task ran: wake-up latency);
//! - a migration while waiting ends the stretch on the old CPU and starts
//!   one on the new CPU; the kernel adds the wait so far to `run_delay` at
//!   that moment (`sched_info_dequeue`), and so is it committed here;
//! - the wait ends when the task is switched in.
//!
//! A wait is counted in the interval it ends in (or migrates in), as the
//! kernel's counter is, so each interval's split adds up to the `run_delay`
//! difference of the same thread over the same interval. A wait whose
//! start was not seen (before the recorder started, or lost in a ring gap)
//! is not counted (`unstarted`); one whose end was lost (the task is seen
//! switched out while it was thought waiting) is dropped (`lost_waits`).

use std::collections::{HashMap, HashSet};
use vmscope_linux::sched_events::still_runnable;
use vmscope_linux::{SchedEvent, TaskComm};

/// What ran instead: a task (thread id and name), the idle task, or one
/// of the buckets below.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Culprit {
    pub tid: u32,
    pub comm: TaskComm,
}

impl Culprit {
    /// Task `tid` named `comm`; every CPU's idle task (tid 0, `swapper/N`)
    /// is [`Culprit::IDLE`].
    pub fn task(tid: u32, comm: TaskComm) -> Culprit {
        if tid == 0 {
            Culprit::IDLE
        } else {
            Culprit { tid, comm }
        }
    }

    /// The idle task (tid 0): nothing ran, the waiter was not picked up yet.
    pub const IDLE: Culprit = Culprit {
        tid: 0,
        comm: TaskComm::EMPTY,
    };
    /// More distinct culprits than [`MAX_CULPRITS`] for one thread.
    pub const OTHER: Culprit = Culprit {
        tid: u32::MAX,
        comm: TaskComm::EMPTY,
    };
    /// A CPU whose running task was not seen yet (before its first switch).
    pub const UNKNOWN: Culprit = Culprit {
        tid: u32::MAX - 1,
        comm: TaskComm::EMPTY,
    };
}

/// Distinct culprits kept per thread and interval; the rest are summed in
/// [`Culprit::OTHER`] and counted in [`ThreadWait::folded`].
pub const MAX_CULPRITS: usize = 64;

/// Distinct culprits beyond [`MAX_CULPRITS`] whose thread ids are kept per
/// thread and interval to count them (the count stops there: 64 KiB of ids
/// for a thread that waited behind that many tasks in one interval).
pub const FOLDED_COUNTED: usize = 16_384;

/// One thread's waits committed in an interval.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ThreadWait {
    /// Nanoseconds runnable but not running, by culprit.
    pub by_culprit: HashMap<Culprit, u64>,
    /// Waits ended (switched in) or moved (migrated).
    pub waits: u64,
    /// Charges folded into [`Culprit::OTHER`] (culprits beyond the bound).
    pub folded: u64,
    /// The distinct culprits folded into [`Culprit::OTHER`], by thread id
    /// (at most [`FOLDED_COUNTED`]; charges the eBPF programs made to
    /// `other` themselves name no thread and are not in it).
    pub folded_tids: HashSet<u32>,
}

impl ThreadWait {
    pub fn total_ns(&self) -> u64 {
        self.by_culprit.values().sum()
    }

    pub(crate) fn add(&mut self, c: Culprit, ns: u64) {
        if ns == 0 {
            return;
        }
        // MAX_CULPRITS named culprits besides OTHER, whatever order they
        // come in (a merge walks a hash map: OTHER counted in the bound
        // made 64 or 65 entries by chance).
        let named =
            self.by_culprit.len() - usize::from(self.by_culprit.contains_key(&Culprit::OTHER));
        let c = if c == Culprit::OTHER || self.by_culprit.contains_key(&c) || named < MAX_CULPRITS {
            c
        } else {
            self.folded += 1;
            self.count_folded(c.tid);
            Culprit::OTHER
        };
        *self.by_culprit.entry(c).or_default() += ns;
    }

    fn count_folded(&mut self, tid: u32) {
        if self.folded_tids.len() < FOLDED_COUNTED {
            self.folded_tids.insert(tid);
        }
    }
}

/// Events that did not chain as the rules expect, since the timeline
/// started (a lossy ring or a lost record shows here).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WaitAnomalies {
    /// Switch-ins of a followed thread whose wait start was not seen.
    pub unstarted: u64,
    /// Waits dropped because the thread was seen running before their end.
    pub lost_waits: u64,
    /// Switches whose outgoing task was not the one last switched in there.
    pub unchained: u64,
    /// Switch-ins on another CPU than the one the wait was charged on (a
    /// migration not seen).
    pub misplaced: u64,
}

#[derive(Debug, Clone)]
struct Waiter {
    cpu: u32,
    /// Charged up to this time.
    charged_to: u64,
    pending: ThreadWait,
}

/// The scheduling timeline of every CPU and the waits of followed threads.
#[derive(Debug, Default)]
pub struct WaitTimeline {
    followed: HashSet<u32>,
    /// Per CPU: the task switched in last.
    running: HashMap<u32, Culprit>,
    waiting: HashMap<u32, Waiter>,
    /// Per CPU: followed threads waiting there.
    queued: HashMap<u32, Vec<u32>>,
    committed: HashMap<u32, ThreadWait>,
    anomalies: WaitAnomalies,
    /// Followed threads seen running (to tell a wake-up of a running task,
    /// which does not queue it, from one that does).
    on_cpu: HashSet<u32>,
    last_time: u64,
}

impl WaitTimeline {
    pub fn new() -> WaitTimeline {
        WaitTimeline::default()
    }

    /// The threads to follow from now on; waits of threads no longer
    /// followed are forgotten.
    pub fn follow(&mut self, tids: impl IntoIterator<Item = u32>) {
        self.followed = tids.into_iter().filter(|&t| t != 0).collect();
        let gone: Vec<u32> = self
            .waiting
            .keys()
            .filter(|t| !self.followed.contains(t))
            .copied()
            .collect();
        for t in gone {
            self.unqueue(t);
        }
        self.on_cpu.retain(|t| self.followed.contains(t));
    }

    pub fn anomalies(&self) -> WaitAnomalies {
        self.anomalies
    }

    /// Followed threads waiting now.
    pub fn waiting_now(&self) -> usize {
        self.waiting.len()
    }

    /// The waits committed since the previous call, by thread.
    pub fn take(&mut self) -> HashMap<u32, ThreadWait> {
        std::mem::take(&mut self.committed)
    }

    fn unqueue(&mut self, tid: u32) -> Option<Waiter> {
        let w = self.waiting.remove(&tid)?;
        if let Some(q) = self.queued.get_mut(&w.cpu) {
            if let Some(i) = q.iter().position(|&t| t == tid) {
                q.swap_remove(i);
            }
        }
        Some(w)
    }

    fn enqueue(&mut self, tid: u32, cpu: u32, time: u64) {
        if self.waiting.contains_key(&tid) {
            return;
        }
        self.waiting.insert(
            tid,
            Waiter {
                cpu,
                charged_to: time,
                pending: ThreadWait::default(),
            },
        );
        self.queued.entry(cpu).or_default().push(tid);
    }

    /// Charge every thread waiting on `cpu` up to `time` to `culprit`.
    fn charge_cpu(&mut self, cpu: u32, time: u64, culprit: Culprit) {
        let Some(q) = self.queued.get(&cpu) else {
            return;
        };
        for tid in q {
            if let Some(w) = self.waiting.get_mut(tid) {
                w.pending.add(culprit, time.saturating_sub(w.charged_to));
                w.charged_to = w.charged_to.max(time);
            }
        }
    }

    fn commit(&mut self, tid: u32, w: Waiter) {
        let c = self.committed.entry(tid).or_default();
        for (k, ns) in w.pending.by_culprit {
            c.add(k, ns);
        }
        c.folded += w.pending.folded;
        for t in w.pending.folded_tids {
            c.count_folded(t);
        }
        c.waits += 1;
    }

    /// Apply one event (events must come in time order; one earlier than
    /// the last is taken at the last one's time).
    pub fn push(&mut self, e: &SchedEvent) {
        let time = e.time().max(self.last_time);
        self.last_time = time;
        match *e {
            SchedEvent::Switch(s) => {
                let prev = Culprit::task(s.prev_pid, s.prev_comm);
                if let Some(r) = self.running.get(&s.cpu) {
                    if r.tid != s.prev_pid {
                        self.anomalies.unchained += 1;
                    }
                }
                self.charge_cpu(s.cpu, time, prev);
                if self.followed.contains(&s.prev_pid) {
                    self.on_cpu.remove(&s.prev_pid);
                    // Thought waiting but it was running: its switch-in
                    // was lost, and the wait cannot be told from the run.
                    if self.unqueue(s.prev_pid).is_some() {
                        self.anomalies.lost_waits += 1;
                    }
                    if still_runnable(s.prev_state) {
                        self.enqueue(s.prev_pid, s.cpu, time);
                    }
                }
                if self.followed.contains(&s.next_pid) {
                    match self.unqueue(s.next_pid) {
                        Some(w) => {
                            if w.cpu != s.cpu {
                                self.anomalies.misplaced += 1;
                            }
                            self.commit(s.next_pid, w);
                        }
                        None => self.anomalies.unstarted += 1,
                    }
                    self.on_cpu.insert(s.next_pid);
                }
                self.running
                    .insert(s.cpu, Culprit::task(s.next_pid, s.next_comm));
            }
            SchedEvent::Wakeup {
                pid, target_cpu, ..
            } => {
                // A wake-up of a task still on its CPU (it had not gone to
                // sleep yet) does not queue it.
                if self.followed.contains(&pid) && !self.on_cpu.contains(&pid) {
                    self.enqueue(pid, target_cpu, time);
                }
            }
            SchedEvent::Migrate {
                pid,
                orig_cpu,
                dest_cpu,
                ..
            } => {
                if let Some(w) = self.waiting.get(&pid) {
                    let cpu = w.cpu;
                    if cpu != orig_cpu {
                        self.anomalies.misplaced += 1;
                    }
                    let culprit = self.running.get(&cpu).copied().unwrap_or(Culprit::UNKNOWN);
                    self.charge_one(pid, time, culprit);
                    if let Some(w) = self.unqueue(pid) {
                        self.commit(pid, w);
                    }
                    self.enqueue(pid, dest_cpu, time);
                }
            }
        }
    }

    fn charge_one(&mut self, tid: u32, time: u64, culprit: Culprit) {
        if let Some(w) = self.waiting.get_mut(&tid) {
            w.pending.add(culprit, time.saturating_sub(w.charged_to));
            w.charged_to = w.charged_to.max(time);
        }
    }
}

/// One culprit of a VM's waiting in an interval, as reports show it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct WaitShare {
    /// `vm` (another VM's thread), `same-vm` (another thread of the VM
    /// that waited), `host` (a host task), `idle` (no task ran: wake-up
    /// latency), `other` (culprits beyond the bound, summed), `unknown` (a
    /// CPU whose running task was not seen yet).
    pub kind: &'static str,
    /// The culprit's domain number (`dN`; 0 for the host, idle and the
    /// buckets).
    pub culprit_domain: u32,
    /// The culprit's VM name, or `host`.
    pub culprit_vm: String,
    /// `vCPU N`, `I/O COMM` (a VM's other thread), `COMM (pid TID)` (a host
    /// task), `idle`, `other` or `unknown`.
    pub culprit: String,
    pub seconds: f64,
    /// `other` only: how many distinct culprits it sums (threads' bounds
    /// of [`FOLDED_COUNTED`] each; eBPF charges to `other` not counted).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub culprits: Option<u64>,
}

impl WaitShare {
    /// [`WaitShare::label`], with the count of culprits `other` sums
    /// (text output; stored rows keep the label, one name per interval).
    pub fn shown(&self) -> String {
        match self.culprits {
            Some(n) if n > 0 => format!("other ({n} culprits)"),
            _ => self.label(),
        }
    }

    /// `d2 web vCPU 0`, `host backup (pid 812)`, `idle`.
    pub fn label(&self) -> String {
        match self.kind {
            "vm" | "same-vm" => format!(
                "d{} {} {}",
                self.culprit_domain, self.culprit_vm, self.culprit
            ),
            "host" => format!("host {}", self.culprit),
            _ => self.culprit.clone(),
        }
    }
}

/// A followed thread's identity: its VM's domain number and name, and its
/// vCPU index (`None` for the VM's other threads).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadRole {
    pub domain: u32,
    pub vm: String,
    pub vcpu: Option<u32>,
}

/// The waits of `waiters` (threads of domain `own`), summed by culprit and
/// named with `roles`, largest first (ties by label). A host task is named
/// by its process where `process` knows it (thread id → process id and
/// name), else by its own thread name and id.
pub fn shares<'a>(
    waiters: impl IntoIterator<Item = &'a ThreadWait>,
    own: u32,
    roles: &HashMap<u32, ThreadRole>,
    process: &mut dyn FnMut(u32) -> Option<(u32, String)>,
) -> Vec<WaitShare> {
    let mut sum: HashMap<(&'static str, u32, String, String), u64> = HashMap::new();
    let mut folded: HashSet<u32> = HashSet::new();
    for w in waiters {
        folded.extend(&w.folded_tids);
        for (c, &ns) in &w.by_culprit {
            let key = match *c {
                Culprit::IDLE => ("idle", 0, "host".to_string(), "idle".to_string()),
                Culprit::OTHER => ("other", 0, "host".to_string(), "other".to_string()),
                Culprit::UNKNOWN => ("unknown", 0, "host".to_string(), "unknown".to_string()),
                _ => {
                    if let Some(r) = roles.get(&c.tid) {
                        (
                            if r.domain == own { "same-vm" } else { "vm" },
                            r.domain,
                            r.vm.clone(),
                            match r.vcpu {
                                Some(i) => format!("vCPU {i}"),
                                None => format!("I/O {}", c.comm),
                            },
                        )
                    } else {
                        let (pid, name) =
                            process(c.tid).unwrap_or_else(|| (c.tid, c.comm.to_string()));
                        ("host", 0, "host".to_string(), format!("{name} (pid {pid})"))
                    }
                }
            };
            *sum.entry(key).or_default() += ns;
        }
    }
    let mut out: Vec<WaitShare> = sum
        .into_iter()
        .map(
            |((kind, culprit_domain, culprit_vm, culprit), ns)| WaitShare {
                culprits: (kind == "other").then_some(folded.len() as u64),
                kind,
                culprit_domain,
                culprit_vm,
                culprit,
                seconds: ns as f64 / 1e9,
            },
        )
        .collect();
    out.sort_by(|a, b| {
        b.seconds
            .total_cmp(&a.seconds)
            .then_with(|| a.label().cmp(&b.label()))
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmscope_linux::SchedSwitch;

    fn comm(s: &str) -> TaskComm {
        TaskComm::from_bytes(s.as_bytes())
    }

    fn sw(cpu: u32, time: u64, prev: (u32, &str), state: u64, next: (u32, &str)) -> SchedEvent {
        SchedEvent::Switch(SchedSwitch {
            cpu,
            time,
            prev_pid: prev.0,
            prev_comm: comm(prev.1),
            prev_state: state,
            next_pid: next.0,
            next_comm: comm(next.1),
        })
    }

    fn wake(time: u64, pid: u32, cpu: u32) -> SchedEvent {
        SchedEvent::Wakeup {
            time,
            pid,
            target_cpu: cpu,
        }
    }

    fn c(tid: u32, name: &str) -> Culprit {
        Culprit {
            tid,
            comm: comm(name),
        }
    }

    const R_PLUS: u64 = 0x100;
    const S: u64 = 1;

    #[test]
    fn two_vcpus_on_one_cpu_wait_behind_each_other() {
        let mut t = WaitTimeline::new();
        t.follow([10, 20]);
        let (a, b) = ((10, "CPU 0/TCG"), (20, "CPU 0/TCG"));
        // a runs; b wakes on CPU 0 at 100 and waits behind a until 400.
        t.push(&sw(0, 50, (0, "swapper/0"), 0, a));
        t.push(&wake(100, 20, 0));
        t.push(&sw(0, 400, a, R_PLUS, b)); // a preempted: waits behind b
        t.push(&sw(0, 700, b, R_PLUS, a));
        let w = t.take();
        assert_eq!(w[&20].by_culprit[&c(10, "CPU 0/TCG")], 300);
        assert_eq!(w[&20].waits, 1);
        assert_eq!(w[&10].by_culprit[&c(20, "CPU 0/TCG")], 300);
        // b's second wait (since 700) is not over: counted when it ends.
        assert!(t.take().is_empty());
        t.push(&sw(0, 1000, a, S, b)); // a sleeps: no wait for it
        let w = t.take();
        assert_eq!(w[&20].total_ns(), 300);
        assert!(!w.contains_key(&10));
        assert_eq!(t.waiting_now(), 0);
        assert_eq!(t.anomalies().unstarted, 1); // a's first switch-in at 50
    }

    #[test]
    fn a_wait_is_split_across_whoever_ran_and_idle() {
        let mut t = WaitTimeline::new();
        t.follow([10]);
        t.push(&sw(1, 0, (0, "swapper/1"), 0, (500, "backup")));
        t.push(&wake(100, 10, 1));
        t.push(&sw(1, 250, (500, "backup"), R_PLUS, (600, "kworker/1:0")));
        t.push(&sw(1, 300, (600, "kworker/1:0"), S, (0, "swapper/1")));
        // The idle task ran 300..320 before picking the vCPU up.
        t.push(&sw(1, 320, (0, "swapper/1"), 0, (10, "CPU 0/TCG")));
        let w = &t.take()[&10];
        assert_eq!(w.by_culprit[&c(500, "backup")], 150);
        assert_eq!(w.by_culprit[&c(600, "kworker/1:0")], 50);
        assert_eq!(w.by_culprit[&Culprit::IDLE], 20);
        assert_eq!(w.total_ns(), 220);
    }

    #[test]
    fn a_migration_commits_and_moves_the_wait() {
        let mut t = WaitTimeline::new();
        t.follow([10]);
        t.push(&sw(0, 0, (0, "swapper/0"), 0, (500, "hog0")));
        t.push(&sw(1, 0, (0, "swapper/1"), 0, (501, "hog1")));
        t.push(&wake(100, 10, 0));
        t.push(&SchedEvent::Migrate {
            time: 300,
            pid: 10,
            orig_cpu: 0,
            dest_cpu: 1,
        });
        // Committed at the migration, as run_delay is.
        let w = t.take();
        assert_eq!(w[&10].by_culprit[&c(500, "hog0")], 200);
        t.push(&sw(1, 450, (501, "hog1"), R_PLUS, (10, "CPU 0/TCG")));
        let w = t.take();
        assert_eq!(w[&10].by_culprit[&c(501, "hog1")], 150);
        assert_eq!(w[&10].by_culprit.len(), 1);
        assert_eq!(t.anomalies().misplaced, 0);
        // A switch on CPU 0 no longer charges the moved thread.
        t.push(&sw(0, 900, (500, "hog0"), S, (0, "swapper/0")));
        assert!(t.take().is_empty());
    }

    #[test]
    fn wakeups_of_running_threads_and_unfollowed_tasks_are_not_waits() {
        let mut t = WaitTimeline::new();
        t.follow([10]);
        t.push(&sw(0, 0, (0, "swapper/0"), 0, (10, "CPU 0/TCG")));
        t.push(&wake(50, 10, 0)); // still on CPU: not queued
        t.push(&wake(60, 77, 0)); // not followed
        assert_eq!(t.waiting_now(), 0);
        t.push(&sw(0, 100, (10, "CPU 0/TCG"), S, (77, "sh")));
        t.push(&wake(150, 10, 0));
        // No longer followed (its VM went): forgotten, nothing committed.
        t.follow([]);
        t.push(&sw(0, 300, (77, "sh"), S, (10, "CPU 0/TCG")));
        assert!(t.take().is_empty());
    }

    #[test]
    fn a_lost_switch_in_drops_the_wait_and_is_counted() {
        let mut t = WaitTimeline::new();
        t.follow([10]);
        t.push(&sw(0, 0, (0, "swapper/0"), 0, (500, "hog")));
        t.push(&wake(100, 10, 0));
        // The switch hog -> vCPU was lost; the vCPU is seen switched out.
        t.push(&sw(0, 500, (10, "CPU 0/TCG"), S, (500, "hog")));
        assert!(t.take().is_empty());
        let a = t.anomalies();
        assert_eq!((a.lost_waits, a.unchained), (1, 1));
    }

    #[test]
    fn shares_name_vms_threads_host_tasks_and_idle() {
        let mut w = ThreadWait::default();
        w.add(c(20, "CPU 0/TCG"), 3_000_000_000);
        w.add(c(21, "worker"), 1_000_000_000);
        w.add(c(11, "IO iothread0"), 500_000_000);
        w.add(c(812, "backup"), 250_000_000);
        w.add(c(813, "backup-io"), 50_000_000); // a thread of process 812
        w.add(Culprit::IDLE, 125_000_000);
        let mut roles = HashMap::new();
        let role = |domain, vm: &str, vcpu| ThreadRole {
            domain,
            vm: vm.into(),
            vcpu,
        };
        roles.insert(20, role(2, "web", Some(0)));
        roles.insert(21, role(2, "web", None));
        roles.insert(11, role(1, "db", None));
        let mut process = |tid| (tid == 813).then(|| (812, "backup".to_string()));
        let s = shares([&w], 1, &roles, &mut process);
        let labels: Vec<String> = s.iter().map(WaitShare::label).collect();
        assert_eq!(
            labels,
            [
                "d2 web vCPU 0",
                "d2 web I/O worker",
                "d1 db I/O IO iothread0",
                "host backup (pid 812)",
                "idle"
            ]
        );
        let kinds: Vec<&str> = s.iter().map(|x| x.kind).collect();
        assert_eq!(kinds, ["vm", "vm", "same-vm", "host", "idle"]);
        assert_eq!(s[0].seconds, 3.0);
        assert_eq!(s[3].seconds, 0.3);
    }

    #[test]
    fn culprits_are_bounded_per_thread() {
        let mut t = WaitTimeline::new();
        t.follow([10]);
        t.push(&wake(0, 10, 0));
        for i in 0..(MAX_CULPRITS as u32 + 10) {
            let tid = 1000 + i;
            t.push(&sw(
                0,
                u64::from(i) * 10 + 10,
                (tid, "job"),
                S,
                (tid + 1, "job"),
            ));
        }
        t.push(&sw(0, 10_000, (2000, "job"), S, (10, "CPU 0/TCG")));
        let w = &t.take()[&10];
        assert_eq!(w.by_culprit.len(), MAX_CULPRITS + 1);
        assert!(w.folded > 0);
        assert!(w.by_culprit[&Culprit::OTHER] > 0);
        assert_eq!(w.total_ns(), 10_000);
        // 74 jobs and the last one (2000): 64 named, 11 counted in other.
        assert_eq!(w.folded_tids.len(), 11);
        let s = shares([w], 1, &HashMap::new(), &mut |_| None);
        let other = s.iter().find(|x| x.kind == "other").unwrap();
        assert_eq!(other.culprits, Some(11));
        assert_eq!(other.shown(), "other (11 culprits)");
        assert!(s.iter().all(|x| x.kind == "other" || x.culprits.is_none()));
    }
}
