//! `vmscope top`: the host and every VM at a glance, refreshed every
//! interval: per domain its CPU, its vCPUs' run / steal / halted shares,
//! the I/O CPU it is charged and the samples it lost; under each one its
//! top functions from a rolling profile (a VM's own guest functions when its
//! agent profiles it).
//!
//! This crate owns what a frame holds ([`Frame`]), how it is drawn in a
//! terminal (ratatui) and what the keys do ([`View`]), and how it is written
//! for scripts ([`write_text`], [`write_json`]: one document per interval,
//! like `top -b`). Where the numbers come from is the caller's
//! ([`FrameSource`]); [`live::LiveTop`] measures this host.

mod draw;
pub mod live;

pub use draw::{draw, MIN_HEIGHT, MIN_WIDTH};

use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::io::Write;
use vmscope_model::text::{visible, visible_cut, NAME_WIDTH};

/// Why `top` stopped.
#[derive(Debug, thiserror::Error)]
pub enum TopError {
    /// The terminal could not be used.
    #[error("terminal: {0}")]
    Terminal(#[from] std::io::Error),
    /// The numbers could not be measured.
    #[error("{0}")]
    Source(String),
}

/// One interval of the whole host.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Frame {
    /// Seconds since `top` started (in a replay: since the replayed
    /// range's start).
    pub time_s: f64,
    /// Wall-clock end of the interval, RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
    pub interval_s: f64,
    pub hostname: String,
    pub cpus: u32,
    /// Busy share of the host's capacity, percent.
    pub host_busy_pct: f64,
    /// The host first, then each VM.
    pub domains: Vec<DomainView>,
    /// What happened in the interval (VMs that started or exited, ...).
    pub notes: Vec<String>,
}

/// One domain in one interval.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DomainView {
    /// `host` or the VM's name.
    pub name: String,
    /// `host`, `active`, `passive` or `unmonitored`.
    pub role: String,
    /// CPU the domain used, percent of one host CPU (like top): for a VM its
    /// vCPUs, its own threads and its share of shared I/O; for the host
    /// everything else.
    pub cpu_pct: f64,
    pub vcpus: u32,
    /// Each vCPU state, percent of the interval, averaged over the vCPUs.
    pub run_pct: f64,
    pub steal_pct: f64,
    pub halted_pct: f64,
    /// Host CPU for the VM's I/O (its own threads and its charge for shared
    /// work), percent of one host CPU.
    pub io_cpu_pct: f64,
    /// I/O operations per second (tap packets, disk requests).
    pub io_ops_per_s: f64,
    /// Samples lost in the interval (rings, or the VM's agent).
    pub lost: u64,
    /// Why a VM is not profiled actively, when it is not.
    pub reason: Option<String>,
    /// What its vCPUs waited behind, biggest first: each culprit's part of
    /// `steal_pct` (empty without wait attribution, and in histories
    /// recorded before it existed).
    #[serde(default)]
    pub waited_behind: Vec<WaitView>,
    /// Top functions of the rolling profile, biggest first.
    pub functions: Vec<FunctionView>,
}

/// One culprit of a VM's steal.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct WaitView {
    /// `d2 web vCPU 0`, `host backup (pid 812)`, `idle`, ...
    pub culprit: String,
    /// Its part of the VM's steal, percent of the interval averaged over
    /// the vCPUs (as `steal_pct`).
    pub steal_pct: f64,
}

/// One function of a domain's rolling profile.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FunctionView {
    pub context: String,
    pub process: String,
    pub symbol: String,
    /// Samples in the window.
    pub samples: u64,
    /// Share of the domain's samples in the window, percent.
    pub pct: f64,
}

/// Where frames come from.
pub trait FrameSource {
    /// The next frame, after waiting for the interval.
    fn next_frame(&mut self) -> Result<Frame, TopError>;
}

/// What the domain table is sorted by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SortKey {
    Cpu,
    Steal,
    Io,
    Name,
}

impl SortKey {
    fn next(self) -> SortKey {
        match self {
            SortKey::Cpu => SortKey::Steal,
            SortKey::Steal => SortKey::Io,
            SortKey::Io => SortKey::Name,
            SortKey::Name => SortKey::Cpu,
        }
    }

    /// The header label.
    pub fn label(self) -> &'static str {
        match self {
            SortKey::Cpu => "CPU",
            SortKey::Steal => "steal",
            SortKey::Io => "I/O",
            SortKey::Name => "name",
        }
    }
}

/// Contexts the function lists can be filtered to, in key order.
pub const CONTEXTS: [&str; 8] = [
    "guest-user",
    "guest-kernel",
    "guest",
    "vmm-user",
    "vmm-kernel",
    "host-user",
    "host-kernel",
    "idle",
];

/// What a key did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Continue,
    Quit,
}

/// How the user is looking at the frames: sort, filters, expanded
/// domains, selection, pause.
#[derive(Debug, Clone, PartialEq)]
pub struct View {
    pub sort: SortKey,
    /// Only this VM (and the host), when set.
    pub only: Option<String>,
    /// Only functions of this context, when set.
    pub context: Option<String>,
    /// Domains whose functions are shown.
    pub expanded: HashSet<String>,
    /// Index of the selected domain in the shown order.
    pub selected: usize,
    pub paused: bool,
    /// Functions shown per expanded domain.
    pub functions: usize,
    /// In a replay: where in the range the shown frame is (`12/600`).
    pub replay: Option<String>,
}

impl Default for View {
    fn default() -> Self {
        View {
            sort: SortKey::Cpu,
            only: None,
            context: None,
            expanded: HashSet::new(),
            selected: 0,
            paused: false,
            functions: 5,
            replay: None,
        }
    }
}

impl View {
    /// The domains in the order and selection shown: the host first, then
    /// the VMs by the sort key.
    pub fn order<'a>(&self, frame: &'a Frame) -> Vec<&'a DomainView> {
        let mut vms: Vec<&DomainView> = frame
            .domains
            .iter()
            .filter(|d| d.role != "host")
            .filter(|d| self.only.as_ref().is_none_or(|o| &d.name == o))
            .collect();
        let desc = |a: f64, b: f64| b.partial_cmp(&a).unwrap_or(std::cmp::Ordering::Equal);
        vms.sort_by(|a, b| {
            match self.sort {
                SortKey::Cpu => desc(a.cpu_pct, b.cpu_pct),
                SortKey::Steal => desc(a.steal_pct, b.steal_pct),
                SortKey::Io => desc(a.io_cpu_pct, b.io_cpu_pct),
                SortKey::Name => a.name.cmp(&b.name),
            }
            .then_with(|| a.name.cmp(&b.name))
        });
        frame
            .domains
            .iter()
            .filter(|d| d.role == "host")
            .chain(vms)
            .collect()
    }

    /// The functions of `d` shown under it (context filter applied).
    pub fn functions_of<'a>(&self, d: &'a DomainView) -> Vec<&'a FunctionView> {
        d.functions
            .iter()
            .filter(|f| self.context.as_ref().is_none_or(|c| &f.context == c))
            .take(self.functions)
            .collect()
    }

    /// Apply one key: `q` quits; `s` sorts by the next key; `f` cycles
    /// the VM filter; `c` cycles the context filter; `e` or Enter expands
    /// or collapses the selected domain, `a` expands or collapses all;
    /// Up/Down (`k`/`j`) move the selection; `p` or space pauses.
    pub fn key(&mut self, key: char, frame: &Frame) -> Action {
        let order: Vec<String> = self.order(frame).iter().map(|d| d.name.clone()).collect();
        match key {
            'q' => return Action::Quit,
            's' => self.sort = self.sort.next(),
            'f' => {
                let vms: Vec<&str> = frame
                    .domains
                    .iter()
                    .filter(|d| d.role != "host")
                    .map(|d| d.name.as_str())
                    .collect();
                self.only = match &self.only {
                    None => vms.first().map(|s| (*s).to_string()),
                    Some(cur) => vms
                        .iter()
                        .position(|v| v == cur)
                        .and_then(|i| vms.get(i + 1))
                        .map(|s| (*s).to_string()),
                };
                self.selected = 0;
            }
            'c' => {
                self.context = match &self.context {
                    None => Some(CONTEXTS[0].to_string()),
                    Some(cur) => CONTEXTS
                        .iter()
                        .position(|c| c == cur)
                        .and_then(|i| CONTEXTS.get(i + 1))
                        .map(|s| (*s).to_string()),
                };
            }
            'e' | '\n' => {
                if let Some(name) = order.get(self.selected) {
                    if !self.expanded.remove(name) {
                        self.expanded.insert(name.clone());
                    }
                }
            }
            'a' => {
                if self.expanded.len() >= order.len() {
                    self.expanded.clear();
                } else {
                    self.expanded = order.iter().cloned().collect();
                }
            }
            'j' => self.selected = (self.selected + 1).min(order.len().saturating_sub(1)),
            'k' => self.selected = self.selected.saturating_sub(1),
            'p' | ' ' => self.paused = !self.paused,
            _ => {}
        }
        Action::Continue
    }
}

/// The column headings of [`domain_line`].
pub fn domain_header() -> String {
    format!(
        "{:<16} {:<11} {:>7} {:>5} {:>6} {:>7} {:>7} {:>8} {:>9} {:>6}  {}",
        "DOMAIN",
        "ROLE",
        "CPU%",
        "VCPUS",
        "RUN%",
        "STEAL%",
        "HALT%",
        "I/O CPU%",
        "I/O OPS/s",
        "LOST",
        "STOLEN BY"
    )
}

/// One domain as a table line (the host has no vCPU or I/O columns).
pub fn domain_line(d: &DomainView) -> String {
    let vm = d.role != "host";
    let pct = |v: f64| {
        if vm {
            format!("{v:.1}")
        } else {
            "-".into()
        }
    };
    format!(
        "{:<16} {:<11} {:>7.1} {:>5} {:>6} {:>7} {:>7} {:>8} {:>9} {:>6}  {}",
        visible_cut(&d.name, NAME_WIDTH),
        d.role,
        d.cpu_pct,
        if vm { d.vcpus.to_string() } else { "-".into() },
        pct(d.run_pct),
        pct(d.steal_pct),
        pct(d.halted_pct),
        pct(d.io_cpu_pct),
        if vm {
            format!("{:.0}", d.io_ops_per_s)
        } else {
            "-".into()
        },
        d.lost,
        main_culprit(d)
    )
}

/// Steal below this share of the interval names no culprit.
const CULPRIT_SHOWN_PCT: f64 = 0.5;

/// The main culprit of a VM's steal and its share of it: `d2 web vCPU 0 (97%)`.
fn main_culprit(d: &DomainView) -> String {
    let total: f64 = d.waited_behind.iter().map(|w| w.steal_pct).sum();
    match d.waited_behind.first() {
        Some(w) if total >= CULPRIT_SHOWN_PCT => format!(
            "{} ({:.0}%)",
            visible_cut(&w.culprit, NAME_WIDTH + 8),
            100.0 * w.steal_pct / total
        ),
        _ => "-".into(),
    }
}

/// The split of a VM's steal under its row: its main culprits, one line
/// each, and the rest summed.
pub fn wait_lines(d: &DomainView) -> Vec<String> {
    let total: f64 = d.waited_behind.iter().map(|w| w.steal_pct).sum();
    if total < CULPRIT_SHOWN_PCT {
        return Vec::new();
    }
    let mut lines: Vec<String> = d
        .waited_behind
        .iter()
        .take(WAIT_LINES)
        .map(|w| {
            format!(
                "    {:>5.1} %  steal behind {}",
                w.steal_pct,
                visible(&w.culprit)
            )
        })
        .collect();
    if d.waited_behind.len() > WAIT_LINES {
        let rest = &d.waited_behind[WAIT_LINES..];
        lines.push(format!(
            "    {:>5.1} %  steal behind {} more",
            rest.iter().map(|w| w.steal_pct).sum::<f64>(),
            rest.len()
        ));
    }
    lines
}

/// Culprits listed under a VM; the rest are one line (JSON has them all).
pub const WAIT_LINES: usize = 5;

/// One function under its domain.
pub fn function_line(f: &FunctionView) -> String {
    format!(
        "    {:>5.1} %  {:<12} {:<16} {}",
        f.pct,
        f.context,
        visible_cut(&f.process, NAME_WIDTH),
        visible(&f.symbol)
    )
}

/// A frame as text, every domain with its functions (the batch layout).
pub fn write_text(frame: &Frame, view: &View, out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(
        out,
        "vmscope top - {} - {:.1} s, {} CPUs, host busy {:.1} %, interval {:.2} s",
        visible(&frame.hostname),
        frame.time_s,
        frame.cpus,
        frame.host_busy_pct,
        frame.interval_s
    )?;
    writeln!(out, "{}", domain_header())?;
    for d in view.order(frame) {
        writeln!(out, "{}", domain_line(d))?;
        if let Some(r) = &d.reason {
            writeln!(out, "    ({})", visible(r))?;
        }
        for w in wait_lines(d) {
            writeln!(out, "{w}")?;
        }
        for f in view.functions_of(d) {
            writeln!(out, "{}", function_line(f))?;
        }
    }
    for n in &frame.notes {
        writeln!(out, "note: {}", visible(n))?;
    }
    writeln!(out)
}

/// A frame as one JSON document on one line.
pub fn write_json(frame: &Frame, out: &mut dyn Write) -> std::io::Result<()> {
    serde_json::to_writer(&mut *out, frame)?;
    writeln!(out)
}

/// Run the interactive view until `q` (or Ctrl-C, Escape, or `stop` set by
/// a signal handler: SIGTERM must give the terminal back as `q` does):
/// frames come from `source` on a thread of their own (it waits for each
/// interval), keys are read meanwhile, so the view answers within ~100 ms.
pub fn run_interactive(
    mut source: Box<dyn FrameSource + Send>,
    stop: &std::sync::atomic::AtomicBool,
) -> Result<(), TopError> {
    use crossterm::event::{self, Event, KeyEventKind};
    use std::sync::mpsc::{channel, TryRecvError};
    let (tx, rx) = channel::<Result<Frame, TopError>>();
    std::thread::Builder::new()
        .name("top-frames".into())
        .spawn(move || loop {
            let f = source.next_frame();
            let failed = f.is_err();
            if tx.send(f).is_err() || failed {
                return;
            }
        })?;
    // The first frame before the screen is taken, so an error prints plainly.
    let mut frame = rx
        .recv()
        .map_err(|_| TopError::Source("no first frame".into()))??;
    let mut view = View::default();
    view.expanded
        .extend(frame.domains.iter().map(|d| d.name.clone()));
    let mut terminal = ratatui::init();
    let result = (|| -> Result<(), TopError> {
        loop {
            if stop.load(std::sync::atomic::Ordering::SeqCst) {
                return Ok(());
            }
            terminal.draw(|f| draw(f, &frame, &view))?;
            if terminal_input(std::time::Duration::from_millis(100))? {
                if let Event::Key(k) = event::read()? {
                    if k.kind != KeyEventKind::Press {
                        continue;
                    }
                    let Some(c) = key_char(&k) else {
                        continue;
                    };
                    if view.key(c, &frame) == Action::Quit {
                        return Ok(());
                    }
                }
            }
            loop {
                match rx.try_recv() {
                    Ok(f) => {
                        let f = f?;
                        if !view.paused {
                            frame = f;
                        }
                    }
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        return Err(TopError::Source("the measurements stopped".into()))
                    }
                }
            }
        }
    })();
    ratatui::restore();
    result
}

/// Replay recorded frames (`top --replay`): the live view's screen and
/// keys on `count` frames in time order, read one at a time by
/// `frame(i)` as they are shown (a caller holds the documents, not 3,600
/// parsed frames of 32 VMs: about 0.1 MiB each), starting at `start`,
/// paused. Left/`b` and Right/`n` step one interval back and forward,
/// `[` `]` one minute, `{` `}` ten minutes, `g`/`G` jump to the
/// first/last frame, `p` or space plays (one frame per recorded
/// interval) or pauses. Every domain starts expanded, and so does one
/// first met later in the range.
pub fn run_replay(
    count: usize,
    frame: &mut dyn FnMut(usize) -> Result<Frame, TopError>,
    start: usize,
    stop: &std::sync::atomic::AtomicBool,
) -> Result<(), TopError> {
    use crossterm::event::{self, Event, KeyCode, KeyEventKind};
    use std::time::{Duration, Instant};
    if count == 0 {
        return Err(TopError::Source("no frames to replay".into()));
    }
    let last = count - 1;
    let mut i = start.min(last);
    let mut view = View {
        paused: true,
        ..View::default()
    };
    let mut seen: HashSet<String> = HashSet::new();
    // The frame on screen, read again only when i moves.
    let mut shown: Option<(usize, Frame)> = None;
    // Frames in a minute, from the recorded interval.
    let per_min = |f: &Frame| (60.0 / f.interval_s.max(0.05)).round().max(1.0) as usize;
    let mut next_play = Instant::now();
    let mut terminal = ratatui::init();
    let result = (|| -> Result<(), TopError> {
        loop {
            if stop.load(std::sync::atomic::Ordering::SeqCst) {
                return Ok(());
            }
            if shown.as_ref().is_none_or(|(j, _)| *j != i) {
                let f = frame(i)?;
                for d in &f.domains {
                    if seen.insert(d.name.clone()) {
                        view.expanded.insert(d.name.clone());
                    }
                }
                shown = Some((i, f));
            }
            let current = &shown.as_ref().expect("read above").1;
            view.replay = Some(format!(
                "{}/{}{}",
                i + 1,
                count,
                if view.paused { " paused" } else { " playing" }
            ));
            terminal.draw(|f| draw(f, current, &view))?;
            if terminal_input(Duration::from_millis(100))? {
                if let Event::Key(k) = event::read()? {
                    if k.kind != KeyEventKind::Press {
                        continue;
                    }
                    let m = per_min(current);
                    let moved = match k.code {
                        KeyCode::Left | KeyCode::Char('b') => Some(i.saturating_sub(1)),
                        KeyCode::Right | KeyCode::Char('n') => Some((i + 1).min(last)),
                        KeyCode::Char('[') | KeyCode::PageUp => Some(i.saturating_sub(m)),
                        KeyCode::Char(']') | KeyCode::PageDown => Some((i + m).min(last)),
                        KeyCode::Char('{') => Some(i.saturating_sub(10 * m)),
                        KeyCode::Char('}') => Some((i + 10 * m).min(last)),
                        KeyCode::Char('g') | KeyCode::Home => Some(0),
                        KeyCode::Char('G') | KeyCode::End => Some(last),
                        _ => None,
                    };
                    if let Some(to) = moved {
                        i = to;
                        continue;
                    }
                    let Some(c) = key_char(&k) else {
                        continue;
                    };
                    if view.key(c, current) == Action::Quit {
                        return Ok(());
                    }
                    next_play = Instant::now();
                }
            }
            if !view.paused && Instant::now() >= next_play {
                let pace = current.interval_s.max(0.05);
                if i < last {
                    i += 1;
                } else {
                    view.paused = true;
                }
                next_play = Instant::now() + Duration::from_secs_f64(pace);
            }
        }
    })();
    ratatui::restore();
    result
}

#[cfg(test)]
mod tests;

/// Whether the terminal has input within `timeout`: an event
/// `crossterm::event::read` returns at once. A terminal that hung up
/// (its window closed, its tmux session killed) is an error, so the view
/// ends: crossterm's own poll reads a hung-up terminal's end of file
/// again and again without returning (a replay left that way spun at a
/// whole CPU for 14 minutes), so the terminal is polled here first and
/// crossterm asked only when it is still there. (A hang-up in the
/// microseconds between that check and crossterm's read is not caught.)
fn terminal_input(timeout: std::time::Duration) -> Result<bool, TopError> {
    use crossterm::event::poll;
    use std::time::Duration;
    // Still there: keys crossterm already holds (several arrive in one
    // read) first.
    terminal_poll(Duration::ZERO)?;
    if poll(Duration::ZERO)? {
        return Ok(true);
    }
    match terminal_poll(timeout)? {
        // Input is there: crossterm parses it.
        Tty::Input => Ok(poll(Duration::ZERO)?),
        Tty::Quiet => Ok(false),
    }
}

/// What the terminal had within a timeout.
enum Tty {
    Input,
    Quiet,
}

/// Whether the terminal (standard input when it is one, else /dev/tty,
/// as crossterm reads) has input within `timeout`; an error once it hung up.
fn terminal_poll(timeout: std::time::Duration) -> Result<Tty, TopError> {
    use std::os::fd::AsRawFd;
    static TTY: std::sync::OnceLock<Option<std::fs::File>> = std::sync::OnceLock::new();
    // SAFETY: isatty only inspects the descriptor.
    let fd = if unsafe { libc::isatty(0) } == 1 {
        0
    } else {
        match TTY.get_or_init(|| std::fs::File::open("/dev/tty").ok()) {
            Some(f) => f.as_raw_fd(),
            None => return Err(TopError::Source("no terminal to read keys from".into())),
        }
    };
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: one valid pollfd for the duration of the call.
    let n = unsafe { libc::poll(&raw mut p, 1, ms) };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        return if e.kind() == std::io::ErrorKind::Interrupted {
            Ok(Tty::Quiet)
        } else {
            Err(e.into())
        };
    }
    if p.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
        return Err(TopError::Source("the terminal hung up".into()));
    }
    Ok(if p.revents & libc::POLLIN != 0 {
        Tty::Input
    } else {
        Tty::Quiet
    })
}

/// The view's key for a terminal key press (the live and the replay screen
/// read the same keys): arrows as j/k, Enter, Esc and Ctrl-C as quit.
fn key_char(k: &crossterm::event::KeyEvent) -> Option<char> {
    use crossterm::event::{KeyCode, KeyModifiers};
    Some(match k.code {
        KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => 'q',
        KeyCode::Char(c) => c,
        KeyCode::Enter => '\n',
        KeyCode::Down => 'j',
        KeyCode::Up => 'k',
        KeyCode::Esc => 'q',
        _ => return None,
    })
}
