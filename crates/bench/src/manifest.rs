//! The manifest every result row carries: what the number was measured on
//! (kernel, CPU model, QEMU version, vmscope version, command line) and,
//! added by each experiment, the configuration's environment (disk
//! backing, QEMU cache and aio modes, accelerator, guest kernel).

use serde::Serialize;
use std::collections::BTreeMap;

/// Key/value facts, sorted by key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Manifest(pub BTreeMap<String, String>);

impl Manifest {
    /// The host's facts: `kernel`, `cpu_model`, `cpus`, `memory_bytes`,
    /// `qemu` (version, when QEMU is installed), `vmscope` and
    /// `command_line`.
    pub fn host(command_line: &str) -> Manifest {
        let mut m = Manifest::default();
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        m.set("kernel", read("/proc/sys/kernel/osrelease").trim());
        let cpuinfo = read("/proc/cpuinfo");
        m.set(
            "cpu_model",
            &cpu_model(&cpuinfo).unwrap_or_else(|| "unknown".into()),
        );
        m.set(
            "cpus",
            &std::thread::available_parallelism()
                .map(std::num::NonZero::get)
                .unwrap_or(1)
                .to_string(),
        );
        if let Some(kib) = read("/proc/meminfo")
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        {
            m.set("memory_bytes", &(kib * 1024).to_string());
        }
        if let Ok(q) = vmscope_lab::qemu::qemu_binary() {
            m.set("qemu", &vmscope_lab::qemu::qemu_version(&q));
        }
        m.set("vmscope", env!("CARGO_PKG_VERSION"));
        m.set("command_line", command_line);
        m
    }

    pub fn set(&mut self, key: &str, value: &str) {
        self.0.insert(key.to_string(), value.to_string());
    }

    /// A copy with more facts.
    pub fn with(&self, more: &[(&str, String)]) -> Manifest {
        let mut m = self.clone();
        for (k, v) in more {
            m.set(k, v);
        }
        m
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }
}

/// `model name` of the first CPU in `/proc/cpuinfo` text.
pub fn cpu_model(cpuinfo: &str) -> Option<String> {
    cpuinfo.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == "model name").then(|| v.trim().to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_facts() {
        let m = Manifest::host("vmscope bench io");
        assert!(!m.get("kernel").unwrap().is_empty());
        assert_eq!(m.get("command_line"), Some("vmscope bench io"));
        assert!(m.get("cpus").unwrap().parse::<usize>().unwrap() >= 1);
        let m2 = m.with(&[("cache", "none".into())]);
        assert_eq!(m2.get("cache"), Some("none"));
        assert_eq!(m.get("cache"), None);
        assert_eq!(
            cpu_model("processor\t: 0\nmodel name\t: AMD EPYC 7B13\n").as_deref(),
            Some("AMD EPYC 7B13")
        );
    }
}
