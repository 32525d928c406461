//! The host's side of active VMs: finds each VM's agent channel from its
//! QEMU command line (`-chardev socket,id=X,path=P` + `-device
//! virtserialport,chardev=X,name=vmscope.agent`) and drives the agent's
//! profiling through the protocol client, for the engine's recorder.

use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;
use vmscope_discover::cmdline::parse_keyval;
use vmscope_engine::guest::{GuestDelta, GuestProfiler, GuestRow};
use vmscope_model::{Context, EventSpec, SampleRate};
use vmscope_protocol::{AgentClient, ProfileConfig, ProfileDelta};

/// The agent's port name the lab and the shipped unit use.
pub const AGENT_PORT: &str = "vmscope.agent";

/// The host socket of a VM's `vmscope.agent` port, from QEMU's argv.
pub fn agent_socket(cmdline: &[String]) -> Option<PathBuf> {
    let opt_after = |flag: &str| -> Vec<&str> {
        cmdline
            .windows(2)
            .filter(|w| w[0] == flag || w[0] == format!("-{flag}"))
            .map(|w| w[1].as_str())
            .collect()
    };
    let value = |kv: &[(String, Option<String>)], k: &str| -> Option<String> {
        kv.iter()
            .rev()
            .find(|(key, _)| key == k)
            .and_then(|(_, v)| v.clone())
    };
    let chardev = opt_after("-device").into_iter().find_map(|d| {
        let kv = parse_keyval(d, "driver");
        (value(&kv, "driver").as_deref() == Some("virtserialport")
            && value(&kv, "name").as_deref() == Some(AGENT_PORT))
        .then(|| value(&kv, "chardev"))
        .flatten()
    })?;
    opt_after("-chardev").into_iter().find_map(|c| {
        let kv = parse_keyval(c, "backend");
        (value(&kv, "backend").as_deref() == Some("socket")
            && value(&kv, "id").as_deref() == Some(chardev.as_str()))
        .then(|| value(&kv, "path").map(PathBuf::from))
        .flatten()
    })
}

/// One active VM's agent.
pub struct AgentProfiler {
    domain: String,
    client: AgentClient<UnixStream>,
}

impl AgentProfiler {
    /// Connect and say hello (fails fast when nothing answers).
    pub fn connect(
        domain: &str,
        socket: &PathBuf,
        timeout: Duration,
    ) -> Result<AgentProfiler, String> {
        let stream = UnixStream::connect(socket)
            .map_err(|e| format!("cannot connect to {}: {e}", socket.display()))?;
        let (client, _hello) = AgentClient::connect(stream, timeout)
            .map_err(|e| format!("no hello on {}: {e}", socket.display()))?;
        Ok(AgentProfiler {
            domain: domain.to_string(),
            client,
        })
    }

    /// The guest's kallsyms text (for passive VMs and guest-kernel samples).
    pub fn kallsyms(&mut self, timeout: Duration) -> Result<String, String> {
        self.client
            .kallsyms(timeout)
            .map(|(t, _)| t)
            .map_err(|e| e.to_string())
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
                samples: r.samples,
                period: r.period,
            })
        })
        .collect();
    GuestDelta {
        rows,
        lost: delta.lost,
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
    ) -> Result<(), String> {
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
        };
        self.client
            .profile_start(&config, timeout)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    fn poll(&mut self, timeout: Duration) -> Result<GuestDelta, String> {
        let mut d = self
            .client
            .profile_poll(timeout)
            .map_err(|e| e.to_string())?;
        // Drain what the agent still holds (bounded messages).
        let mut rounds = 0;
        while d.more && rounds < 16 {
            let next = self
                .client
                .profile_poll(timeout)
                .map_err(|e| e.to_string())?;
            d.rows.extend(next.rows);
            d.lost += next.lost;
            d.more = next.more;
            rounds += 1;
        }
        Ok(convert(d))
    }

    fn stop(&mut self, timeout: Duration) -> Result<GuestDelta, String> {
        self.client
            .profile_stop(timeout)
            .map(convert)
            .map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::net::UnixListener;
    use std::time::Instant;
    use vmscope_engine::guest::{arm_all, GuestEvent, GuestPollers};
    use vmscope_protocol::{encode_response, AgentHello, Decoder, Request, Response};

    #[derive(Clone, Copy, PartialEq)]
    enum Misbehave {
        None,
        GarbageOnStart,
        GarbageOnPoll,
        SilentOnPoll,
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
                        Request::ProfilePoll {} | Request::ProfileStop {} => {
                            let last = matches!(env.msg, Request::ProfileStop {});
                            Response::ProfileData {
                                seq: 1,
                                rows: vec![vmscope_protocol::ProfileRow {
                                    event: 0,
                                    context: "guest-user".into(),
                                    process: "app".into(),
                                    image: "/bin/app".into(),
                                    symbol: "work".into(),
                                    stack: String::new(),
                                    samples: 1,
                                    period: 1_000_000,
                                }],
                                samples: 1,
                                lost: 0,
                                t_ns: 2,
                                more: false,
                                last,
                            }
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
                    assert!(!why.is_empty());
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
                GuestEvent::Lost { domain, why, .. } => Some((domain.to_string(), why.clone())),
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
    fn finds_the_agent_socket_in_lab_and_libvirt_style_cmdlines() {
        let argv: Vec<String> = [
            "qemu-system-x86_64",
            "-name",
            "vm0,debug-threads=on",
            "-chardev",
            "socket,id=vmscope0,path=/run/vmscope/labs/x/vm0/agent.sock,server=on,wait=off",
            "-device",
            "virtio-serial-pci",
            "-device",
            "virtserialport,chardev=vmscope0,name=vmscope.agent",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(
            agent_socket(&argv),
            Some(PathBuf::from("/run/vmscope/labs/x/vm0/agent.sock"))
        );
        let other: Vec<String> = [
            "qemu",
            "-chardev",
            "socket,id=c,path=/x",
            "-device",
            "virtserialport,chardev=c,name=org.qemu.guest_agent.0",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(agent_socket(&other), None);
    }
}
