//! One export interval of the rolling recording, as the profile exporters
//! are given it, and who recorded it.

use vmscope_report::pprof::Profile;

/// The host the profiles come from: what tells one host's `vm0` from
/// another's in a fleet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostIdentity {
    /// The host name (`/proc/sys/kernel/hostname`).
    pub name: String,
    /// The machine id (`/etc/machine-id`), empty when there is none.
    pub id: String,
}

impl HostIdentity {
    /// This host's name and machine id.
    pub fn of_this_host() -> HostIdentity {
        let read = |p: &str| {
            std::fs::read_to_string(p)
                .map(|s| s.trim().to_string())
                .unwrap_or_default()
        };
        let mut name = read("/proc/sys/kernel/hostname");
        if name.is_empty() {
            name = "localhost".into();
        }
        let mut id = read("/etc/machine-id");
        if id.is_empty() {
            id = read("/var/lib/dbus/machine-id");
        }
        HostIdentity { name, id }
    }
}

/// A VM as the exporters label it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmIdentity {
    /// Its name (the `vm` label of the profile's samples).
    pub name: String,
    /// QEMU's `-uuid` (libvirt always passes one), when it has one.
    pub uuid: Option<String>,
}

/// What one profiler cost in a window.
#[derive(Debug, Clone, PartialEq)]
pub struct WindowCost {
    /// `host`, or the VM's name.
    pub domain: String,
    /// CPU the profiler used, s.
    pub cost_s: f64,
    /// CPU time of what it observed (the base of its budget), s.
    pub observed_s: f64,
    /// Its sampling rate at the window's end, Hz.
    pub rate_hz: u64,
}

/// One export interval: the pprof of those seconds in the merged view
/// (labels `vm`, `context`, `process`, `vcpu`, `cpu`, as
/// `vmscope report --format pprof` writes them).
#[derive(Debug, Clone)]
pub struct ProfileWindow {
    /// Counts windows from 1 since `serve` started; the exporters' ids.
    pub seq: u64,
    pub start_unix_nanos: u64,
    pub duration_nanos: u64,
    pub profile: Profile,
    pub host: HostIdentity,
    pub vms: Vec<VmIdentity>,
    pub costs: Vec<WindowCost>,
}

impl ProfileWindow {
    /// The UUID of the VM named `name`.
    pub fn uuid_of(&self, name: &str) -> Option<&str> {
        self.vms
            .iter()
            .find(|v| v.name == name)
            .and_then(|v| v.uuid.as_deref())
    }

    /// The index of the sample value that is the event count (CPU time in
    /// ns for clock events): the profile's default sample type.
    pub fn value_index(&self) -> usize {
        let p = &self.profile;
        p.sample_type
            .iter()
            .position(|t| t.r#type == p.default_sample_type)
            .unwrap_or(1.min(p.sample_type.len().saturating_sub(1)))
    }

    /// The string of a pprof label key or value.
    pub fn string(&self, i: i64) -> &str {
        usize::try_from(i)
            .ok()
            .and_then(|i| self.profile.string_table.get(i))
            .map_or("", String::as_str)
    }

    /// The domains with samples, in first-seen order (`host` and VMs).
    pub fn domains(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for s in &self.profile.sample {
            let d = self.label(s, "vm").unwrap_or("host");
            if !out.iter().any(|o| o == d) {
                out.push(d.to_string());
            }
        }
        out
    }

    /// A sample's string label.
    pub fn label<'a>(&'a self, s: &vmscope_report::pprof::Sample, key: &str) -> Option<&'a str> {
        s.label
            .iter()
            .find(|l| self.string(l.key) == key && l.str != 0)
            .map(|l| self.string(l.str))
    }

    /// A sample's numeric label.
    pub fn num_label(&self, s: &vmscope_report::pprof::Sample, key: &str) -> Option<i64> {
        s.label
            .iter()
            .find(|l| self.string(l.key) == key && l.str == 0)
            .map(|l| l.num)
    }

    /// The window's end, Unix seconds (rounded up).
    pub fn end_unix_secs(&self) -> u64 {
        (self.start_unix_nanos + self.duration_nanos).div_ceil(1_000_000_000)
    }
}

/// The service name of a domain in Pyroscope and OTLP: `vm/NAME` for a VM,
/// `host` for the host's own work.
pub fn service_name(domain: &str) -> String {
    if domain == vmscope_model::HOST_DOMAIN {
        domain.to_string()
    } else {
        format!("vm/{domain}")
    }
}

/// A 16-byte id of (host, window, domain) that is the same each time the
/// window is encoded, so a receiver can tell a profile sent twice.
pub fn profile_id(host: &HostIdentity, seq_start_nanos: u64, domain: &str) -> Vec<u8> {
    // Two FNV-1a passes with different offsets: stable across builds,
    // unlike std's hasher.
    let fnv = |seed: u64| {
        let mut h = seed;
        for b in host
            .id
            .bytes()
            .chain(host.name.bytes())
            .chain([0])
            .chain(seq_start_nanos.to_le_bytes())
            .chain(domain.bytes())
        {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h
    };
    let mut id = fnv(0xcbf2_9ce4_8422_2325).to_le_bytes().to_vec();
    id.extend_from_slice(&fnv(0x6c62_272e_07bb_0142).to_le_bytes());
    if id.iter().all(|b| *b == 0) {
        id[0] = 1;
    }
    id
}

#[cfg(test)]
/// A two-domain pprof as `report::pprof` writes one.
pub(crate) fn test_window() -> ProfileWindow {
    use vmscope_report::pprof as pp;
    let strings: Vec<String> = [
        "",
        "cpu-clock_samples",
        "count",
        "cpu",
        "nanoseconds",
        "vm",
        "context",
        "process",
        "vcpu",
        "host",
        "web",
        "kernel",
        "guest-user",
        "nginx",
        "CPU 0/TCG",
        "main",
        "work",
        "/usr/sbin/nginx",
        "cpu",
    ]
    .iter()
    .map(ToString::to_string)
    .collect();
    let s = |t: &str| strings.iter().position(|x| x == t).unwrap() as i64;
    let lab = |k: &str, v: &str| pp::Label {
        key: s(k),
        str: s(v),
        ..pp::Label::default()
    };
    let num = |k: &str, n: i64| pp::Label {
        key: s(k),
        num: n,
        ..pp::Label::default()
    };
    let profile = pp::Profile {
        sample_type: vec![
            pp::ValueType {
                r#type: s("cpu-clock_samples"),
                unit: s("count"),
            },
            pp::ValueType {
                r#type: s("cpu"),
                unit: s("nanoseconds"),
            },
        ],
        default_sample_type: s("cpu"),
        period: 10_101_010,
        function: vec![
            pp::Function {
                id: 1,
                name: s("main"),
                system_name: s("main"),
                ..Default::default()
            },
            pp::Function {
                id: 2,
                name: s("work"),
                system_name: s("work"),
                ..Default::default()
            },
        ],
        mapping: vec![pp::Mapping {
            id: 1,
            filename: s("/usr/sbin/nginx"),
            ..Default::default()
        }],
        location: vec![
            pp::Location {
                id: 1,
                mapping_id: 1,
                line: vec![pp::Line {
                    function_id: 2,
                    line: 7,
                    column: 0,
                }],
                ..Default::default()
            },
            pp::Location {
                id: 2,
                mapping_id: 0,
                line: vec![pp::Line {
                    function_id: 1,
                    line: 0,
                    column: 0,
                }],
                ..Default::default()
            },
        ],
        sample: vec![
            pp::Sample {
                location_id: vec![1, 2],
                value: vec![30, 300_000_000],
                label: vec![
                    lab("vm", "web"),
                    lab("context", "guest-user"),
                    lab("process", "nginx"),
                    num("vcpu", 1),
                ],
            },
            pp::Sample {
                location_id: vec![2],
                value: vec![10, 100_000_000],
                label: vec![
                    lab("vm", "web"),
                    lab("context", "kernel"),
                    lab("process", "CPU 0/TCG"),
                    num("vcpu", 0),
                ],
            },
            // The first row again, in another second of the window.
            pp::Sample {
                location_id: vec![1, 2],
                value: vec![2, 20_000_000],
                label: vec![
                    lab("vm", "web"),
                    lab("context", "guest-user"),
                    lab("process", "nginx"),
                    num("vcpu", 1),
                ],
            },
            pp::Sample {
                location_id: vec![2],
                value: vec![5, 50_000_000],
                label: vec![
                    lab("vm", "host"),
                    lab("context", "kernel"),
                    lab("process", "main"),
                    num("cpu", 1),
                ],
            },
        ],
        string_table: strings.clone(),
        ..pp::Profile::default()
    };
    ProfileWindow {
        seq: 3,
        start_unix_nanos: 1_700_000_000_000_000_000,
        duration_nanos: 60_000_000_000,
        profile,
        host: HostIdentity {
            name: "kvm-7".into(),
            id: "abc123".into(),
        },
        vms: vec![VmIdentity {
            name: "web".into(),
            uuid: Some("5a1d0c0e-0000-4000-8000-000000000001".into()),
        }],
        costs: vec![WindowCost {
            domain: "web".into(),
            cost_s: 0.25,
            observed_s: 60.0,
            rate_hz: 99,
        }],
    }
}
