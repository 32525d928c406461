//! Event specifications: `name[:period]` parsing and the perf_event type/config
//! each name maps to (docs/architecture.md §2).

use serde::{Deserialize, Serialize};

/// What to count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EventKind {
    CpuClock,
    TaskClock,
    ContextSwitches,
    PageFaults,
    Cycles,
    Instructions,
    CacheMisses,
    LlcLoadMisses,
    DtlbLoadMisses,
    ItlbLoadMisses,
    BranchMisses,
    /// Raw PMU event `rNNNN` (hex config).
    Raw(u64),
}

/// perf_event_attr.type values (linux/perf_event.h).
pub const PERF_TYPE_HARDWARE: u32 = 0;
pub const PERF_TYPE_SOFTWARE: u32 = 1;
pub const PERF_TYPE_TRACEPOINT: u32 = 2;
pub const PERF_TYPE_HW_CACHE: u32 = 3;
pub const PERF_TYPE_RAW: u32 = 4;

const fn hw_cache(cache: u64, op: u64, result: u64) -> u64 {
    cache | (op << 8) | (result << 16)
}
// PERF_COUNT_HW_CACHE_{LL=2,DTLB=3,ITLB=4}, OP_READ=0, RESULT_MISS=1
const LL_READ_MISS: u64 = hw_cache(2, 0, 1);
const DTLB_READ_MISS: u64 = hw_cache(3, 0, 1);
const ITLB_READ_MISS: u64 = hw_cache(4, 0, 1);

impl EventKind {
    /// Every named event, for `--help` and error messages.
    pub const NAMED: [EventKind; 11] = [
        EventKind::CpuClock,
        EventKind::TaskClock,
        EventKind::ContextSwitches,
        EventKind::PageFaults,
        EventKind::Cycles,
        EventKind::Instructions,
        EventKind::CacheMisses,
        EventKind::LlcLoadMisses,
        EventKind::DtlbLoadMisses,
        EventKind::ItlbLoadMisses,
        EventKind::BranchMisses,
    ];

    pub fn name(self) -> String {
        match self {
            EventKind::CpuClock => "cpu-clock".into(),
            EventKind::TaskClock => "task-clock".into(),
            EventKind::ContextSwitches => "context-switches".into(),
            EventKind::PageFaults => "page-faults".into(),
            EventKind::Cycles => "cycles".into(),
            EventKind::Instructions => "instructions".into(),
            EventKind::CacheMisses => "cache-misses".into(),
            EventKind::LlcLoadMisses => "LLC-load-misses".into(),
            EventKind::DtlbLoadMisses => "dTLB-load-misses".into(),
            EventKind::ItlbLoadMisses => "iTLB-load-misses".into(),
            EventKind::BranchMisses => "branch-misses".into(),
            EventKind::Raw(c) => format!("r{c:x}"),
        }
    }

    pub fn parse_name(s: &str) -> Option<EventKind> {
        if let Some(hex) = s.strip_prefix('r') {
            if !hex.is_empty() && hex.chars().all(|c| c.is_ascii_hexdigit()) {
                return u64::from_str_radix(hex, 16).ok().map(EventKind::Raw);
            }
        }
        let aliases: &[(&str, EventKind)] = &[
            ("cpu-clock", EventKind::CpuClock),
            ("task-clock", EventKind::TaskClock),
            ("context-switches", EventKind::ContextSwitches),
            ("cs", EventKind::ContextSwitches),
            ("page-faults", EventKind::PageFaults),
            ("faults", EventKind::PageFaults),
            ("cycles", EventKind::Cycles),
            ("cpu-cycles", EventKind::Cycles),
            ("instructions", EventKind::Instructions),
            ("cache-misses", EventKind::CacheMisses),
            ("llc-load-misses", EventKind::LlcLoadMisses),
            ("dtlb-load-misses", EventKind::DtlbLoadMisses),
            ("itlb-load-misses", EventKind::ItlbLoadMisses),
            ("branch-misses", EventKind::BranchMisses),
        ];
        let lower = s.to_ascii_lowercase();
        aliases.iter().find(|(n, _)| *n == lower).map(|(_, k)| *k)
    }

    /// True when the event needs a hardware PMU.
    pub fn is_hardware(self) -> bool {
        !matches!(
            self,
            EventKind::CpuClock
                | EventKind::TaskClock
                | EventKind::ContextSwitches
                | EventKind::PageFaults
        )
    }

    /// True for time-based events whose period is in nanoseconds.
    pub fn is_clock(self) -> bool {
        matches!(self, EventKind::CpuClock | EventKind::TaskClock)
    }

    /// (perf_event_attr.type, perf_event_attr.config).
    pub fn perf_type_config(self) -> (u32, u64) {
        match self {
            EventKind::CpuClock => (PERF_TYPE_SOFTWARE, 0),
            EventKind::TaskClock => (PERF_TYPE_SOFTWARE, 1),
            EventKind::PageFaults => (PERF_TYPE_SOFTWARE, 2),
            EventKind::ContextSwitches => (PERF_TYPE_SOFTWARE, 3),
            EventKind::Cycles => (PERF_TYPE_HARDWARE, 0),
            EventKind::Instructions => (PERF_TYPE_HARDWARE, 1),
            EventKind::CacheMisses => (PERF_TYPE_HARDWARE, 3),
            EventKind::BranchMisses => (PERF_TYPE_HARDWARE, 5),
            EventKind::LlcLoadMisses => (PERF_TYPE_HW_CACHE, LL_READ_MISS),
            EventKind::DtlbLoadMisses => (PERF_TYPE_HW_CACHE, DTLB_READ_MISS),
            EventKind::ItlbLoadMisses => (PERF_TYPE_HW_CACHE, ITLB_READ_MISS),
            EventKind::Raw(c) => (PERF_TYPE_RAW, c),
        }
    }

    /// Inverse of [`EventKind::perf_type_config`], for imported attrs.
    pub fn from_perf_type_config(ty: u32, config: u64) -> Option<EventKind> {
        if ty == PERF_TYPE_RAW {
            return Some(EventKind::Raw(config));
        }
        EventKind::NAMED
            .into_iter()
            .find(|k| k.perf_type_config() == (ty, config))
    }
}

/// How often to sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SampleRate {
    /// One sample every N events (ns for clock events).
    Period(u64),
    /// Target samples per second per CPU.
    Frequency(u64),
}

/// `name[:period]` as typed by a user.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct EventSpec {
    pub kind: EventKind,
    pub rate: SampleRate,
}

/// Default sampling frequency (Hz), as perf's.
pub const DEFAULT_FREQUENCY: u64 = 4000;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EventError {
    #[error("unknown event '{name}'; known events: {known}, or a raw PMU event rNNNN (hex)")]
    Unknown { name: String, known: String },
    #[error("bad period in event '{spec}': '{period}' is not a positive integer")]
    BadPeriod { spec: String, period: String },
}

impl EventSpec {
    /// Parse `name[:period]`. Without a period, `default_freq` is used.
    pub fn parse(spec: &str, default_freq: u64) -> Result<EventSpec, EventError> {
        let (name, period) = match spec.split_once(':') {
            Some((n, p)) => (n, Some(p)),
            None => (spec, None),
        };
        let kind = EventKind::parse_name(name.trim()).ok_or_else(|| EventError::Unknown {
            name: name.to_string(),
            known: EventKind::NAMED
                .iter()
                .map(|k| k.name())
                .collect::<Vec<_>>()
                .join(", "),
        })?;
        let rate = match period {
            None => SampleRate::Frequency(default_freq),
            Some(p) => match p.trim().parse::<u64>() {
                Ok(v) if v > 0 => SampleRate::Period(v),
                _ => {
                    return Err(EventError::BadPeriod {
                        spec: spec.to_string(),
                        period: p.to_string(),
                    })
                }
            },
        };
        Ok(EventSpec { kind, rate })
    }

    /// `cpu-clock:1000000` or `cpu-clock@999Hz`.
    pub fn display(&self) -> String {
        match self.rate {
            SampleRate::Period(p) => format!("{}:{}", self.kind.name(), p),
            SampleRate::Frequency(f) => format!("{}@{}Hz", self.kind.name(), f),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_periods_and_raw() {
        let e = EventSpec::parse("cycles:100000", 999).unwrap();
        assert_eq!(e.kind, EventKind::Cycles);
        assert_eq!(e.rate, SampleRate::Period(100000));
        let e = EventSpec::parse("cpu-clock", 999).unwrap();
        assert_eq!(e.rate, SampleRate::Frequency(999));
        assert_eq!(
            EventSpec::parse("r01c2", 1).unwrap().kind,
            EventKind::Raw(0x1c2)
        );
        assert_eq!(
            EventSpec::parse("LLC-load-misses", 1).unwrap().kind,
            EventKind::LlcLoadMisses
        );
    }

    #[test]
    fn rejects_unknown_and_bad_period() {
        let err = EventSpec::parse("bogus", 1).unwrap_err();
        assert!(err.to_string().contains("unknown event 'bogus'"));
        assert!(err.to_string().contains("cpu-clock"));
        assert!(matches!(
            EventSpec::parse("cycles:0", 1),
            Err(EventError::BadPeriod { .. })
        ));
        assert!(matches!(
            EventSpec::parse("cycles:x", 1),
            Err(EventError::BadPeriod { .. })
        ));
    }

    #[test]
    fn type_config_round_trips() {
        for k in EventKind::NAMED {
            let (t, c) = k.perf_type_config();
            assert_eq!(EventKind::from_perf_type_config(t, c), Some(k));
        }
        assert!(!EventKind::CpuClock.is_hardware());
        assert!(EventKind::Instructions.is_hardware());
    }
}

/// An event as a session records it: a display name and how it was sampled.
/// Imported perf.data files may carry events vmscope has no [`EventKind`] for
/// (tracepoints, PMU-specific names); those keep perf's name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionEvent {
    pub name: String,
    /// Fixed sample period, when sampling by period.
    pub period: Option<u64>,
    /// Target frequency in Hz, when sampling by frequency.
    pub frequency: Option<u64>,
}

impl From<&EventSpec> for SessionEvent {
    fn from(e: &EventSpec) -> SessionEvent {
        let (period, frequency) = match e.rate {
            SampleRate::Period(p) => (Some(p), None),
            SampleRate::Frequency(f) => (None, Some(f)),
        };
        SessionEvent {
            name: e.kind.name(),
            period,
            frequency,
        }
    }
}
