//! What the network and web benchmarks share about lab networking and
//! their verdicts: a lab VM's address on its tap NIC, the host's address
//! on the lab bridge, the one message that says why user networking
//! cannot carry a test (with the spec change that fixes it), and the
//! yes/no [`Check`] lines with their numbers (table and JSON).

use std::io::Write;
use std::net::IpAddr;
use vmscope_lab::{LabState, VmState};

/// The host's address on the lab's bridge.
pub fn host_ip(st: &LabState) -> Option<IpAddr> {
    st.bridge_address
        .as_deref()
        .and_then(|a| a.split('/').next())
        .and_then(|a| a.parse().ok())
}

/// The guest's address on its first tap NIC.
pub fn tap_ip(vm: &VmState) -> Option<IpAddr> {
    vm.nics
        .iter()
        .filter(|n| n.kind == "tap")
        .find_map(|n| n.guest_ip.as_deref().and_then(|a| a.parse().ok()))
}

/// Why VM `vm` of lab `lab` cannot carry a host<->guest test, and the fix.
pub fn no_tap(vm: &str, lab: &str) -> String {
    format!(
        "VM {vm} of lab {lab} has no tap NIC (user networking cannot carry the test: \
         the host cannot reach the guest); give it `[[vm.nic]] kind = \"tap\"` in its spec"
    )
}

/// A yes/no line with its numbers.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Check {
    pub claim: String,
    pub holds: bool,
    pub detail: String,
    /// The compared means' ratio.
    pub ratio: f64,
    /// Why this host cannot show the claim (the comparison is confounded):
    /// the verdict is then `n/a`, whatever the numbers say.
    pub caveat: Option<String>,
}

impl Check {
    /// `yes: CLAIM (DETAIL)`, or `n/a: CLAIM (DETAIL; CAVEAT)`.
    pub fn line(&self) -> String {
        match &self.caveat {
            Some(c) => format!("n/a: {} ({}; {c})", self.claim, self.detail),
            None => format!("{}: {} ({})", self.verdict(), self.claim, self.detail),
        }
    }

    /// `yes`, `no`, or `n/a` when the host cannot show the claim.
    pub fn verdict(&self) -> &'static str {
        match (&self.caveat, self.holds) {
            (Some(_), _) => "n/a",
            (None, true) => "yes",
            (None, false) => "no",
        }
    }

    /// The JSON line of the check.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "type": "check", "claim": self.claim, "holds": self.holds,
            "verdict": self.verdict(), "detail": self.detail,
            "ratio": self.ratio, "caveat": self.caveat,
        })
    }
}

/// The lines after a benchmark's table: its checks, the charts written
/// and the notes.
pub fn print_tail(
    out: &mut dyn Write,
    checks: &[Check],
    charts: &[std::path::PathBuf],
    notes: &[String],
) -> std::io::Result<()> {
    print_checks(out, checks)?;
    for c in charts {
        writeln!(out, "chart: {}", c.display())?;
    }
    for n in notes {
        writeln!(out, "note: {n}")?;
    }
    Ok(())
}

/// Every check's line.
pub fn print_checks(out: &mut dyn Write, checks: &[Check]) -> std::io::Result<()> {
    for c in checks {
        writeln!(out, "{}", c.line())?;
    }
    Ok(())
}
