//! Active VMs in a recording (docs/architecture.md §4, coordinated profiling): the
//! recorder drives each VM's agent through [`GuestProfiler`], one thread per
//! VM, so a slow or dead agent never stalls the host's rings. Like Xenoprof,
//! sampling starts only when every active agent is ready (the barrier) and
//! stops on the initiator's word.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use vmscope_model::{Context, EventSpec};
use vmscope_protocol::ProtocolError;

/// One row an agent measured in its guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestRow {
    /// Index into the session's events (agents get the same list).
    pub event: u32,
    /// `GuestUser` or `GuestKernel`.
    pub context: Context,
    pub process: String,
    pub image: String,
    pub symbol: String,
    pub stack: String,
    /// Guest CPU (vCPU index), where the agent says.
    pub cpu: Option<u32>,
    pub samples: u64,
    pub period: u64,
}

/// What an agent measured since the last poll.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GuestDelta {
    pub rows: Vec<GuestRow>,
    pub lost: u64,
    /// What profiling cost the guest over the delta, from agents that
    /// measure it.
    pub cost: Option<vmscope_model::budget::CostStep>,
}

/// The host's handle on one active VM's agent.
pub trait GuestProfiler: Send {
    /// The VM's domain name.
    fn domain(&self) -> &str;
    /// Arm sampling in the guest; returns once the agent says it is ready.
    fn start(
        &mut self,
        events: &[EventSpec],
        callchain: bool,
        timeout: Duration,
    ) -> Result<(), ProtocolError>;
    /// Rows measured since the last call.
    fn poll(&mut self, timeout: Duration) -> Result<GuestDelta, ProtocolError>;
    /// After a poll timed out: wait up to `timeout` more for its answer (a
    /// busy guest answers late; its rows are not lost). By default there is
    /// no late answer.
    fn poll_late(&mut self, _timeout: Duration) -> Result<GuestDelta, ProtocolError> {
        Err(ProtocolError::Timeout {
            what: "agent response".into(),
        })
    }
    /// Stop sampling; the last rows.
    fn stop(&mut self, timeout: Duration) -> Result<GuestDelta, ProtocolError>;
    /// Ask the guest to keep its profiling within `budget` (a fraction of
    /// its CPU) from the next [`GuestProfiler::start`]; `None`: a fixed rate.
    fn set_overhead_budget(&mut self, _budget: Option<f64>) {}
}

/// Messages from a VM's thread to the recorder.
#[derive(Debug)]
pub enum GuestEvent {
    Delta {
        domain: Arc<str>,
        delta: GuestDelta,
    },
    /// The agent stopped answering or the VM died; `at` is seconds since start.
    Lost {
        domain: Arc<str>,
        at: f64,
        why: ProtocolError,
    },
    Stopped {
        domain: Arc<str>,
    },
    /// A poll was answered only after [`POLL_TIMEOUT`] (sent when a VM's
    /// wait is longer than any before); its rows came late, none lost.
    Late {
        domain: Arc<str>,
        waited: Duration,
    },
}

/// How long a poll of an agent waits before it is counted late (and how
/// long the last exchange at stop may take).
pub const POLL_TIMEOUT: Duration = Duration::from_secs(5);
/// A poll's answer is waited for in steps of this long, looking at the stop
/// flag between them.
const POLL_STEP: Duration = Duration::from_secs(1);
/// How long a late poll is waited for before the agent counts as lost. An
/// emulated guest whose one vCPU runs a busy workload, three profiling
/// sessions and a file transfer took over 5 s to answer a poll; a poll
/// given up then lost every guest row of the recording.
pub const AGENT_SILENCE: Duration = Duration::from_secs(30);
/// Once the recording stops, how much longer a late poll is waited for.
pub const STOP_GRACE: Duration = Duration::from_secs(5);

/// Outcome of the readiness barrier for one VM.
pub struct Armed {
    pub domain: Arc<str>,
    pub result: Result<Box<dyn GuestProfiler>, (Box<dyn GuestProfiler>, ProtocolError)>,
}

/// Start every agent in parallel and wait for all of them (the barrier).
pub fn arm_all(
    guests: Vec<Box<dyn GuestProfiler>>,
    events: &[EventSpec],
    callchain: bool,
    timeout: Duration,
) -> Vec<Armed> {
    let handles: Vec<_> = guests
        .into_iter()
        .map(|mut g| {
            let events = events.to_vec();
            std::thread::spawn(move || {
                let domain: Arc<str> = g.domain().into();
                let result = match g.start(&events, callchain, timeout) {
                    Ok(()) => Ok(g),
                    Err(e) => Err((g, e)),
                };
                Armed { domain, result }
            })
        })
        .collect();
    handles.into_iter().filter_map(|h| h.join().ok()).collect()
}

/// Under an overhead budget, the longest time between two polls of an
/// agent whose rate holds ([`GuestPollers::spawn_stretching`]): rows then
/// reach the host in batches of up to this long (booked in the second they
/// arrive in), and a cost that grows is seen within this long.
pub const BUDGET_LONGEST_POLL: Duration = Duration::from_secs(4);

/// The polling threads of the armed VMs.
pub struct GuestPollers {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    pub events: Receiver<GuestEvent>,
}

impl GuestPollers {
    /// One thread per VM polls every `every` until [`GuestPollers::stop`].
    pub fn spawn(
        guests: Vec<Box<dyn GuestProfiler>>,
        every: Duration,
        t0: Instant,
    ) -> GuestPollers {
        GuestPollers::spawn_stretching(guests, every, every, t0)
    }

    /// As [`GuestPollers::spawn`], and while an agent under an overhead
    /// budget keeps its rate (two deltas in a row with the same rate), the
    /// time to its next poll doubles, up to `longest`; a changed rate (or a
    /// delta without a cost) brings it back to `every`. Each poll is an
    /// exchange over the emulated virtio-serial port, which costs the
    /// guest's vCPUs more than the agent measures of itself
    /// (bench/coordinated-overhead), so a budget governs how often it
    /// happens too. The agent steps its rate once per poll, and every
    /// delta's cost carries the rate in force over it, so the stored rate
    /// over time stays exact, in longer steps.
    pub fn spawn_stretching(
        guests: Vec<Box<dyn GuestProfiler>>,
        every: Duration,
        longest: Duration,
        t0: Instant,
    ) -> GuestPollers {
        let longest = longest.max(every);
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = channel();
        let threads = guests
            .into_iter()
            .map(|g| {
                let stop = stop.clone();
                let tx: Sender<GuestEvent> = tx.clone();
                std::thread::spawn(move || poll_loop(g, stop, tx, (every, longest), t0))
            })
            .collect();
        GuestPollers {
            stop,
            threads,
            events: rx,
        }
    }

    /// Tell every agent to stop and wait for the last rows.
    pub fn stop(mut self) -> Receiver<GuestEvent> {
        self.stop.store(true, Ordering::Release);
        for t in &self.threads {
            t.thread().unpark();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        self.events
    }
}

fn poll_loop(
    mut g: Box<dyn GuestProfiler>,
    stop: Arc<AtomicBool>,
    tx: Sender<GuestEvent>,
    (every, longest): (Duration, Duration),
    t0: Instant,
) {
    let domain: Arc<str> = g.domain().into();
    let timeout = POLL_TIMEOUT;
    let mut told_late = timeout;
    let mut interval = every;
    let mut last_rate: Option<u64> = None;
    loop {
        // Parked until the next poll or until `stop` unparks it: one
        // wake-up per poll. (A 20 ms sleep loop here woke each VM's thread
        // 50 times a second, a cost that grew with the number of VMs:
        // bench/many-vms.)
        let deadline = Instant::now() + interval;
        while !stop.load(Ordering::Acquire) {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            std::thread::park_timeout(deadline - now);
        }
        if stop.load(Ordering::Acquire) {
            match g.stop(timeout) {
                Ok(delta) => {
                    let _ = tx.send(GuestEvent::Delta {
                        domain: domain.clone(),
                        delta,
                    });
                    let _ = tx.send(GuestEvent::Stopped { domain });
                }
                Err(why) => {
                    let _ = tx.send(GuestEvent::Lost {
                        domain,
                        at: t0.elapsed().as_secs_f64(),
                        why,
                    });
                }
            }
            return;
        }
        let asked = Instant::now();
        let mut got = g.poll(POLL_STEP);
        if matches!(got, Err(ProtocolError::Timeout { .. })) {
            got = wait_late(&mut *g, &stop, asked);
            if got.is_ok() && asked.elapsed() > told_late {
                told_late = asked.elapsed();
                let _ = tx.send(GuestEvent::Late {
                    domain: domain.clone(),
                    waited: told_late,
                });
            }
        }
        match got {
            Ok(delta) => {
                let rate = delta.cost.as_ref().map(|c| c.rate_hz);
                interval = next_interval(interval, every, longest, last_rate, rate);
                last_rate = rate;
                if tx
                    .send(GuestEvent::Delta {
                        domain: domain.clone(),
                        delta,
                    })
                    .is_err()
                {
                    return;
                }
            }
            Err(why) => {
                let _ = tx.send(GuestEvent::Lost {
                    domain,
                    at: t0.elapsed().as_secs_f64(),
                    why,
                });
                return;
            }
        }
    }
}

/// A poll asked at `asked` that was not answered within a step: its answer
/// waited for in steps, up to [`AGENT_SILENCE`] since it was asked, or
/// [`STOP_GRACE`] once `stop` is set.
fn wait_late(
    g: &mut dyn GuestProfiler,
    stop: &AtomicBool,
    asked: Instant,
) -> Result<GuestDelta, ProtocolError> {
    let mut stopped_at: Option<Instant> = None;
    loop {
        if stopped_at.is_none() && stop.load(Ordering::Acquire) {
            stopped_at = Some(Instant::now());
        }
        let limit = match stopped_at {
            Some(t) => (t + STOP_GRACE).min(asked + AGENT_SILENCE),
            None => asked + AGENT_SILENCE,
        };
        let left = limit.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ProtocolError::Timeout {
                what: format!(
                    "an answer to a poll ({:.0} s without one)",
                    asked.elapsed().as_secs_f64()
                ),
            });
        }
        match g.poll_late(left.min(POLL_STEP)) {
            Err(ProtocolError::Timeout { .. }) => continue,
            other => return other,
        }
    }
}

/// The time to the next poll: doubled (up to `longest`) when the agent's
/// rate stayed the same over two deltas, `every` otherwise.
fn next_interval(
    interval: Duration,
    every: Duration,
    longest: Duration,
    last: Option<u64>,
    now: Option<u64>,
) -> Duration {
    match (last, now) {
        (Some(a), Some(b)) if a == b => (interval * 2).min(longest),
        _ => every,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn polls_stretch_while_the_rate_holds_and_snap_back_when_it_moves() {
        let (e, l) = (Duration::from_millis(500), Duration::from_secs(4));
        let mut i = e;
        let mut last = None;
        let mut seen = Vec::new();
        for rate in [
            Some(125),
            Some(125),
            Some(125),
            Some(125),
            Some(125),
            Some(60),
            Some(60),
            None,
            None,
        ] {
            i = next_interval(i, e, l, last, rate);
            last = rate;
            seen.push(i.as_millis());
        }
        assert_eq!(seen, [500, 1000, 2000, 4000, 4000, 500, 1000, 500, 500]);
        // Without a budget `longest` is `every`: never stretched.
        assert_eq!(next_interval(e, e, e, Some(10), Some(10)), e);
    }

    struct Fake {
        name: String,
        ready: bool,
        polls: u32,
        die_after: Option<u32>,
    }

    impl GuestProfiler for Fake {
        fn domain(&self) -> &str {
            &self.name
        }
        fn start(&mut self, _: &[EventSpec], _: bool, _: Duration) -> Result<(), ProtocolError> {
            if self.ready {
                Ok(())
            } else {
                Err(ProtocolError::Timeout {
                    what: "profile_ready".into(),
                })
            }
        }
        fn poll(&mut self, _: Duration) -> Result<GuestDelta, ProtocolError> {
            self.polls += 1;
            if self.die_after.is_some_and(|n| self.polls > n) {
                return Err(ProtocolError::Io(std::io::ErrorKind::BrokenPipe.into()));
            }
            Ok(GuestDelta {
                cost: None,
                rows: vec![GuestRow {
                    event: 0,
                    context: Context::GuestUser,
                    process: "p".into(),
                    image: "i".into(),
                    symbol: "s".into(),
                    stack: String::new(),
                    cpu: None,
                    samples: 1,
                    period: 10,
                }],
                lost: 0,
            })
        }
        fn stop(&mut self, _: Duration) -> Result<GuestDelta, ProtocolError> {
            Ok(GuestDelta::default())
        }
    }

    fn fake(name: &str, ready: bool, die_after: Option<u32>) -> Box<dyn GuestProfiler> {
        Box::new(Fake {
            name: name.into(),
            ready,
            polls: 0,
            die_after,
        })
    }

    #[test]
    fn barrier_names_the_vm_that_did_not_answer() {
        let armed = arm_all(
            vec![fake("a", true, None), fake("b", false, None)],
            &[],
            false,
            Duration::from_millis(10),
        );
        let failed: Vec<_> = armed
            .iter()
            .filter_map(|a| {
                a.result
                    .as_ref()
                    .err()
                    .map(|(_, e)| (a.domain.to_string(), e.to_string()))
            })
            .collect();
        assert_eq!(
            failed,
            vec![(
                "b".to_string(),
                "timed out waiting for profile_ready".to_string()
            )]
        );
    }

    #[test]
    fn stop_wakes_pollers_parked_until_a_distant_poll() {
        // Polls an hour apart: the threads are parked, and only stop's
        // unpark can end them; no poll happens before the stop.
        let p = GuestPollers::spawn(
            (0..8).map(|i| fake(&format!("v{i}"), true, None)).collect(),
            Duration::from_secs(3600),
            Instant::now(),
        );
        std::thread::sleep(Duration::from_millis(50));
        let (tx, done) = channel();
        std::thread::spawn(move || {
            let _ = tx.send(p.stop().try_iter().collect::<Vec<_>>());
        });
        let events = done
            .recv_timeout(Duration::from_secs(60))
            .expect("stop() did not wake the parked pollers");
        let stopped = events
            .iter()
            .filter(|e| matches!(e, GuestEvent::Stopped { .. }))
            .count();
        let polled_rows = events
            .iter()
            .filter(|e| matches!(e, GuestEvent::Delta { delta, .. } if !delta.rows.is_empty()))
            .count();
        assert_eq!((stopped, polled_rows), (8, 0));
    }

    #[test]
    fn a_dying_agent_is_reported_lost_and_others_go_on() {
        let p = GuestPollers::spawn(
            vec![fake("ok", true, None), fake("dies", true, Some(1))],
            Duration::from_millis(10),
            Instant::now(),
        );
        std::thread::sleep(Duration::from_millis(150));
        let rx = p.stop();
        let events: Vec<GuestEvent> = rx.try_iter().collect();
        assert!(events
            .iter()
            .any(|e| matches!(e, GuestEvent::Lost { domain, .. } if &**domain == "dies")));
        assert!(events
            .iter()
            .any(|e| matches!(e, GuestEvent::Stopped { domain } if &**domain == "ok")));
        let ok_rows = events
            .iter()
            .filter(|e| matches!(e, GuestEvent::Delta { domain, delta } if &**domain == "ok" && !delta.rows.is_empty()))
            .count();
        assert!(ok_rows >= 3, "{ok_rows}");
    }
}
