//! The host's side of an active VM: its agent, connected through the
//! protocol client and driven as a [`GuestProfiler`] by the recorder
//! (profiling), or asked for the guest's kernel symbols (passive VMs).

use crate::guest::{GuestDelta, GuestProfiler, GuestRow};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;
use vmscope_model::{Context, EventSpec, SampleRate};
use vmscope_protocol::{AgentClient, AgentHello, ProfileConfig, ProfileDelta, ProtocolError};

/// One VM's agent, connected.
pub struct AgentProfiler {
    domain: String,
    client: AgentClient<UnixStream>,
    hello: AgentHello,
    /// Overhead budget sent with `profile_start`, parts per million.
    budget_ppm: Option<u32>,
    /// Rows of a poll whose later messages (`more`) did not come in time:
    /// kept for the late answer, so a slow agent's rows are not lost.
    held: Option<ProfileDelta>,
}

/// Why a VM's agent could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// Neither the VM's broker nor its channel could be reached (the VM is
    /// gone, the socket is stale, or the broker did not start).
    #[error("{0}")]
    Channel(#[from] vmscope_broker::BrokerError),
    /// The socket accepted but no hello came back in time.
    #[error("no hello on {socket} within {timeout:?}: {source}")]
    NoHello {
        socket: String,
        timeout: Duration,
        #[source]
        source: ProtocolError,
    },
}

impl AgentProfiler {
    /// Connect through the VM's broker (started when none runs, so other
    /// host tools can use the agent at the same time) and say hello; fails
    /// fast when nothing answers.
    pub fn connect(
        domain: &str,
        socket: &Path,
        timeout: Duration,
    ) -> Result<AgentProfiler, ConnectError> {
        let name = socket.display().to_string();
        let launcher = vmscope_broker::launcher();
        let stream = vmscope_broker::connect(socket, launcher.as_deref(), timeout)?;
        let (client, hello) =
            AgentClient::connect(stream, timeout).map_err(|source| ConnectError::NoHello {
                socket: name,
                timeout,
                source,
            })?;
        Ok(AgentProfiler {
            held: None,
            budget_ppm: None,
            domain: domain.to_string(),
            client,
            hello,
        })
    }

    /// A poll's answer and what the agent still holds (`more`: bounded
    /// messages, at most 16 more), added to rows held from a poll whose
    /// later messages were late. A timeout keeps what came for the late rest.
    fn drain(&mut self, got: ProfileDelta, timeout: Duration) -> Result<GuestDelta, ProtocolError> {
        let mut d = match self.held.take() {
            Some(mut held) => {
                held.absorb(got);
                held
            }
            None => got,
        };
        let mut rounds = 0;
        while d.more && rounds < 16 {
            match self.client.profile_poll(timeout) {
                Ok(next) => d.absorb(next),
                Err(e) => {
                    self.held = Some(d);
                    return Err(e);
                }
            }
            rounds += 1;
        }
        Ok(convert(d))
    }

    /// What the agent said in its hello (protocol version, capabilities).
    pub fn hello(&self) -> &AgentHello {
        &self.hello
    }

    /// The guest's kallsyms text (for passive VMs and guest-kernel samples).
    pub fn kallsyms(&mut self, timeout: Duration) -> Result<String, ProtocolError> {
        self.client.kallsyms(timeout).map(|(t, _)| t)
    }
}

fn convert(delta: ProfileDelta) -> GuestDelta {
    let rows = delta
        .rows
        .into_iter()
        .filter_map(|r| {
            // The protocol crate validated the row; anything but the two
            // guest contexts is dropped rather than trusted.
            let context = match r.context.as_str() {
                "guest-user" => Context::GuestUser,
                "guest-kernel" => Context::GuestKernel,
                _ => return None,
            };
            Some(GuestRow {
                event: r.event,
                context,
                process: r.process,
                image: r.image,
                symbol: r.symbol,
                stack: r.stack,
                cpu: r.cpu,
                samples: r.samples,
                period: r.period,
            })
        })
        .collect();
    GuestDelta {
        rows,
        lost: delta.lost,
        cost: delta.cost.map(|c| vmscope_model::budget::CostStep {
            cost_s: c.cost_ns as f64 / 1e9,
            capacity_s: c.capacity_ns as f64 / 1e9,
            rate_hz: c.rate_hz,
        }),
    }
}

impl GuestProfiler for AgentProfiler {
    fn domain(&self) -> &str {
        &self.domain
    }

    fn start(
        &mut self,
        events: &[EventSpec],
        callchain: bool,
        timeout: Duration,
    ) -> Result<(), ProtocolError> {
        let frequency = events
            .iter()
            .find_map(|e| match e.rate {
                SampleRate::Frequency(f) => Some(f),
                SampleRate::Period(_) => None,
            })
            .unwrap_or(vmscope_model::DEFAULT_FREQUENCY);
        let config = ProfileConfig {
            events: events
                .iter()
                .map(|e| match e.rate {
                    SampleRate::Period(p) => format!("{}:{p}", e.kind.name()),
                    SampleRate::Frequency(_) => e.kind.name(),
                })
                .collect(),
            frequency,
            callchain,
            budget_ppm: self.budget_ppm,
        };
        self.client.profile_start(&config, timeout).map(|_| ())
    }

    fn set_overhead_budget(&mut self, budget: Option<f64>) {
        self.budget_ppm = budget.map(|b| ((b * 1e6).round() as u32).clamp(1, 999_999));
    }

    fn poll(&mut self, timeout: Duration) -> Result<GuestDelta, ProtocolError> {
        let first = self.client.profile_poll(timeout)?;
        self.drain(first, timeout)
    }

    fn poll_late(&mut self, timeout: Duration) -> Result<GuestDelta, ProtocolError> {
        let late = self.client.profile_poll_late(timeout)?;
        self.drain(late, timeout)
    }

    fn stop(&mut self, timeout: Duration) -> Result<GuestDelta, ProtocolError> {
        self.client.profile_stop(timeout).map(convert)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guest::{arm_all, GuestEvent, GuestPollers};
    use std::io::{Read, Write};
    use std::os::unix::net::UnixListener;
    use std::path::PathBuf;
    use std::time::Instant;
    use vmscope_protocol::{encode_response, AgentHello, Decoder, Request, Response};

    #[derive(Clone, Copy, PartialEq)]
    enum Misbehave {
        None,
        GarbageOnStart,
        GarbageOnPoll,
        SilentOnPoll,
        /// The first poll answered after 5.5 s: a busy guest.
        SlowFirstPoll,
    }

    /// One row of `samples` samples of `symbol`, as the fake agent answers.
    fn data(symbol: &str, samples: u64, last: bool) -> Response {
        Response::ProfileData {
            seq: 1,
            rows: vec![vmscope_protocol::ProfileRow {
                event: 0,
                context: "guest-user".into(),
                process: "app".into(),
                image: "/bin/app".into(),
                symbol: symbol.into(),
                stack: String::new(),
                cpu: Some(0),
                samples,
                period: 1_000_000,
            }],
            samples,
            lost: 0,
            t_ns: 2,
            more: false,
            last,
            cost: None,
        }
    }

    /// A guest agent played by a thread over a real Unix socket: correct
    /// protocol until the chosen misbehaviour.
    fn fake_agent(dir: &std::path::Path, name: &str, how: Misbehave) -> PathBuf {
        let path = dir.join(format!("{name}.sock"));
        let listener = UnixListener::bind(&path).unwrap();
        std::thread::spawn(move || {
            let Ok((mut s, _)) = listener.accept() else {
                return;
            };
            let mut dec = Decoder::new();
            let mut slowed = false;
            let mut buf = [0u8; 65536];
            loop {
                let n = match s.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                dec.push(&buf[..n]);
                while let Ok(Some(env)) = dec.next_request() {
                    let resp = match env.msg {
                        Request::Hello { nonce, .. } => Response::Hello(AgentHello {
                            protocol: vmscope_protocol::PROTOCOL_VERSION,
                            agent_version: "test".into(),
                            kernel: "6.1".into(),
                            hostname: "fake".into(),
                            cpus: 1,
                            mem_bytes: 1 << 28,
                            capabilities: vec!["profile".into()],
                            nonce,
                        }),
                        Request::ProfileStart { .. } if how == Misbehave::GarbageOnStart => {
                            let _ = s.write_all(&[0xff; 4096]);
                            continue;
                        }
                        Request::ProfileStart { events, .. } => Response::ProfileReady {
                            cpus: 1,
                            events,
                            t_ns: 1,
                        },
                        Request::ProfilePoll {} if how == Misbehave::GarbageOnPoll => {
                            // A frame header claiming a huge body, then noise.
                            let mut junk = b"VMS1".to_vec();
                            junk.extend_from_slice(&[0x7f; 60]);
                            let _ = s.write_all(&junk);
                            continue;
                        }
                        Request::ProfilePoll {} if how == Misbehave::SilentOnPoll => continue,
                        Request::ProfilePoll {} if how == Misbehave::SlowFirstPoll && !slowed => {
                            slowed = true;
                            std::thread::sleep(Duration::from_millis(5500));
                            data("late", 7, false)
                        }
                        Request::ProfilePoll {} | Request::ProfileStop {} => {
                            let last = matches!(env.msg, Request::ProfileStop {});
                            data("work", 1, last)
                        }
                        _ => continue,
                    };
                    let bytes = encode_response(env.id, &resp).unwrap();
                    if s.write_all(&bytes).is_err() {
                        return;
                    }
                }
            }
        });
        path
    }

    #[test]
    fn a_guest_sending_garbage_is_dropped_and_the_others_go_on() {
        let dir = tempfile::tempdir().unwrap();
        let mut guests: Vec<Box<dyn GuestProfiler>> = Vec::new();
        for (name, how) in [
            ("good", Misbehave::None),
            ("badstart", Misbehave::GarbageOnStart),
            ("badpoll", Misbehave::GarbageOnPoll),
            ("silent", Misbehave::SilentOnPoll),
        ] {
            let sock = fake_agent(dir.path(), name, how);
            guests.push(Box::new(
                AgentProfiler::connect(name, &sock, Duration::from_secs(5)).unwrap(),
            ));
        }
        let ev = vec![EventSpec::parse("cpu-clock", 1000).unwrap()];
        let armed = arm_all(guests, &ev, false, Duration::from_secs(2));
        let mut ready = Vec::new();
        for a in armed {
            match a.result {
                Ok(g) => ready.push(g),
                Err((_, why)) => {
                    assert_eq!(&*a.domain, "badstart");
                    assert!(!why.to_string().is_empty());
                }
            }
        }
        assert_eq!(ready.len(), 3);
        let t0 = Instant::now();
        let pollers = GuestPollers::spawn(ready, Duration::from_millis(50), t0);
        std::thread::sleep(Duration::from_millis(1500));
        let events: Vec<GuestEvent> = pollers.stop().try_iter().collect();
        let lost: Vec<(String, String)> = events
            .iter()
            .filter_map(|e| match e {
                GuestEvent::Lost { domain, why, .. } => Some((domain.to_string(), why.to_string())),
                _ => None,
            })
            .collect();
        let names: Vec<&str> = lost.iter().map(|l| l.0.as_str()).collect();
        assert!(names.contains(&"badpoll"), "{lost:?}");
        assert!(names.contains(&"silent"), "{lost:?}");
        assert!(!names.contains(&"good"), "{lost:?}");
        let good_rows: usize = events
            .iter()
            .filter_map(|e| match e {
                GuestEvent::Delta { domain, delta } if &**domain == "good" => {
                    Some(delta.rows.len())
                }
                _ => None,
            })
            .sum();
        assert!(
            good_rows >= 5,
            "the good agent kept streaming: {good_rows} rows"
        );
    }

    #[test]
    fn a_slow_agent_is_waited_for_and_its_late_rows_kept() {
        let dir = tempfile::tempdir().unwrap();
        let sock = fake_agent(dir.path(), "slow", Misbehave::SlowFirstPoll);
        let g = AgentProfiler::connect("slow", &sock, Duration::from_secs(5)).unwrap();
        let ev = vec![EventSpec::parse("cpu-clock", 1000).unwrap()];
        let armed = arm_all(vec![Box::new(g)], &ev, false, Duration::from_secs(2));
        let ready: Vec<_> = armed.into_iter().filter_map(|a| a.result.ok()).collect();
        assert_eq!(ready.len(), 1);
        let pollers = GuestPollers::spawn(ready, Duration::from_millis(50), Instant::now());
        std::thread::sleep(Duration::from_millis(6500));
        let events: Vec<GuestEvent> = pollers.stop().try_iter().collect();
        assert!(
            !events.iter().any(|e| matches!(e, GuestEvent::Lost { .. })),
            "{events:?}"
        );
        let late_rows: u64 = events
            .iter()
            .filter_map(|e| match e {
                GuestEvent::Delta { delta, .. } => Some(
                    delta
                        .rows
                        .iter()
                        .filter(|r| r.symbol == "late")
                        .map(|r| r.samples)
                        .sum::<u64>(),
                ),
                _ => None,
            })
            .sum();
        assert_eq!(late_rows, 7, "{events:?}");
        let waited = events.iter().find_map(|e| match e {
            GuestEvent::Late { waited, .. } => Some(*waited),
            _ => None,
        });
        assert!(
            waited.is_some_and(|w| w >= Duration::from_millis(5400)),
            "{waited:?}"
        );
        assert!(events
            .iter()
            .any(|e| matches!(e, GuestEvent::Stopped { .. })));
    }
}
