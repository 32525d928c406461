//! What a query of a session reads and groups by: the [`View`] (host
//! rows, agent rows, or both merged with each active VM's scale) as an SQL
//! row source, restricted to a [`Slice`] of time and CPUs, and the
//! [`Field`]s a report groups and filters by. The reader
//! ([`crate::Session`]) runs the queries.

/// Which measurements a query reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum View {
    /// The global profile: host samples, with each active VM's guest rows
    /// replaced by its agent's rows scaled to the guest time the host
    /// measured (so the profile adds up to what the physical CPUs did).
    /// Where its agent measured nothing (a scale of 0: no rows in these
    /// seconds, as in a 2 s export window between two of its batches),
    /// the VM keeps the host's guest rows instead of losing its time.
    #[default]
    Merged,
    /// Only what the host's rings measured.
    Host,
    /// Only what agents measured inside their guests, unscaled.
    Agent,
}

/// A time and CPU slice of a session (`report --time`, `--cpu`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Slice {
    /// First and last whole second since the start, inclusive.
    pub seconds: Option<(u32, u32)>,
    /// Host CPUs. Agents' rows carry guest CPUs (vCPUs), so they are not
    /// filtered by this: in the merged view they are scaled to the guest
    /// time the host measured on these CPUs.
    pub cpus: Option<Vec<u32>>,
}

impl Slice {
    pub fn is_all(&self) -> bool {
        self.seconds.is_none() && self.cpus.is_none()
    }

    /// SQL condition on a table aliased `alias` (numbers only: no user text).
    fn condition(&self, alias: &str, with_cpu: bool) -> String {
        let mut c = vec!["1".to_string()];
        if let Some((a, b)) = self.seconds {
            c.push(format!("{alias}.second BETWEEN {a} AND {b}"));
        }
        if let (true, Some(cpus)) = (with_cpu, &self.cpus) {
            let list: Vec<String> = cpus.iter().map(u32::to_string).collect();
            c.push(format!("{alias}.cpu IN ({})", list.join(",")));
        }
        c.join(" AND ")
    }
}

/// Columns every row source has, in this order.
const COLUMNS: &str =
    "event, domain, context, process, image, symbol, stack, srcline, second, cpu, samples, period";

const GUEST_CONTEXTS: &str = "('guest', 'guest-user', 'guest-kernel')";

impl View {
    /// The row source restricted to a slice. In the merged view the scale
    /// of each active VM is recomputed for the slice: the guest time the
    /// host measured in it over the agent's busy time in it.
    pub(crate) fn source_in(self, slice: &Slice) -> String {
        let host = slice.condition("s", true);
        let agent = slice.condition("a", false);
        match self {
            View::Host if slice.is_all() => "samples".into(),
            View::Agent if slice.is_all() => "agent_samples".into(),
            View::Host => format!("(SELECT {COLUMNS} FROM samples s WHERE {host})"),
            View::Agent => format!("(SELECT {COLUMNS} FROM agent_samples a WHERE {agent})"),
            View::Merged => {
                let factors = if slice.is_all() {
                    "SELECT domain, event, factor FROM domain_scale".to_string()
                } else {
                    format!(
                        "SELECT d.domain, d.event, \
                           (SELECT SUM(s.period) FROM samples s WHERE s.domain = d.domain AND s.event = d.event \
                              AND s.context IN {GUEST_CONTEXTS} AND {host}) * 1.0 / \
                           (SELECT SUM(a.period) FROM agent_samples a WHERE a.domain = d.domain AND a.event = d.event \
                              AND a.process != 'swapper' AND {agent}) AS factor \
                         FROM domain_scale d"
                    )
                };
                format!(
                    "(WITH f AS ({factors}) \
                      SELECT {COLUMNS} FROM samples s \
                      WHERE {host} AND NOT (s.context IN {GUEST_CONTEXTS} AND EXISTS \
                        (SELECT 1 FROM f WHERE f.domain = s.domain AND f.event = s.event AND f.factor > 0)) \
                      UNION ALL \
                      SELECT a.event, a.domain, a.context, a.process, a.image, a.symbol, a.stack, a.srcline, \
                        a.second, a.cpu, a.samples, CAST(ROUND(a.period * f.factor) AS INTEGER) AS period \
                      FROM agent_samples a JOIN f ON f.domain = a.domain AND f.event = a.event \
                      WHERE a.process != 'swapper' AND f.factor > 0 AND {agent})"
                )
            }
        }
    }
}

/// Columns a report can group by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Field {
    Domain,
    Context,
    Process,
    Image,
    Symbol,
    /// Source file and line (DWARF).
    Srcline,
    /// The CPU (`-1` where the source did not record it).
    Cpu,
}

impl Field {
    pub fn parse(s: &str) -> Option<Field> {
        match s.trim() {
            "domain" | "vm" => Some(Field::Domain),
            "context" | "ctx" => Some(Field::Context),
            "process" | "comm" => Some(Field::Process),
            "image" | "dso" => Some(Field::Image),
            "symbol" | "sym" => Some(Field::Symbol),
            "srcline" => Some(Field::Srcline),
            "cpu" => Some(Field::Cpu),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Field::Domain => "domain",
            Field::Context => "context",
            Field::Process => "process",
            Field::Image => "image",
            Field::Symbol => "symbol",
            Field::Srcline => "srcline",
            Field::Cpu => "cpu",
        }
    }
    /// SQL expression a report groups by. The context view splits kernel
    /// modules from the core kernel (menon2005 Table 1: kernel / driver).
    pub(crate) fn select_expr(self) -> &'static str {
        match self {
            Field::Context => {
                "(context || CASE WHEN context IN ('host-kernel','vmm-kernel','guest-kernel') \
                 AND image LIKE '[%]' AND image NOT IN ('[kernel.kallsyms]','[guest.kernel.kallsyms]') \
                 THEN ' (modules)' ELSE '' END)"
            }
            Field::Cpu => "CAST(cpu AS TEXT)",
            _ => self.name(),
        }
    }
    /// Column a filter compares with.
    pub(crate) fn column(self) -> &'static str {
        self.name()
    }
}
