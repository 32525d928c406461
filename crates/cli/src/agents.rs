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
