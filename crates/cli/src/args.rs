//! Value parsers shared by every command's options, written once: counts,
//! rates, times and limits that must be positive say so ("must be a positive
//! number of seconds, not -1") instead of clap's "unexpected argument '-1'"
//! and a tip that does not work. Options using them also set
//! `allow_negative_numbers`, so a negative value reaches the parser.

use std::path::{Path, PathBuf};

fn whole(s: &str, what: &str) -> Result<i128, String> {
    s.trim()
        .parse::<i128>()
        .map_err(|_| format!("must be a positive {what}, not '{s}'"))
}

macro_rules! positive_int {
    ($name:ident, $t:ty, $what:literal) => {
        #[doc = concat!("A positive ", $what, ".")]
        pub fn $name(s: &str) -> Result<$t, String> {
            let v = whole(s, $what)?;
            if v <= 0 {
                return Err(format!("must be a positive {}, not {s}", $what));
            }
            <$t>::try_from(v).map_err(|_| format!("{s} is too large for a {}", $what))
        }
    };
}

positive_int!(hertz, u64, "frequency in Hz");
positive_int!(rows, usize, "number of rows");
positive_int!(threads, usize, "number of threads");
positive_int!(pid, u32, "process id");
positive_int!(whole_seconds, u64, "whole number of seconds");
positive_int!(window, usize, "number of intervals");
positive_int!(culprits, usize, "number of culprits");

/// Ring size in pages: 0 (the default size) or a positive power of two.
pub fn pages(s: &str) -> Result<usize, String> {
    let v = whole(s, "number of pages (a power of two)")?;
    if v < 0 {
        return Err(format!(
            "must be a positive number of pages (a power of two), not {s}"
        ));
    }
    usize::try_from(v).map_err(|_| format!("{s} pages is too large"))
}

/// A number of intervals: 0 or more.
pub fn intervals(s: &str) -> Result<u64, String> {
    let v = whole(s, "number of intervals")?;
    if v < 0 {
        return Err(format!("must be a positive number of intervals, not {s}"));
    }
    u64::try_from(v).map_err(|_| format!("{s} intervals is too large"))
}

/// A positive, finite number of seconds (fractions allowed).
pub fn seconds(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("must be a positive number of seconds, not '{s}'"))?;
    if !(v > 0.0 && v.is_finite()) {
        return Err(format!("must be a positive number of seconds, not {s}"));
    }
    Ok(v)
}

/// A percentage, 0 to 100.
pub fn percent(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("must be a percentage between 0 and 100, not '{s}'"))?;
    if !(0.0..=100.0).contains(&v) {
        return Err(format!("must be a percentage between 0 and 100, not {s}"));
    }
    Ok(v)
}

/// `--kallsyms FILE`: a readable kallsyms, checked before anything starts
/// (a bad file would otherwise leave kernel samples as raw addresses with
/// only a note in the report). An empty file is a deliberate "no kernel
/// symbols" and is accepted.
/// `-o -`: standard output, as `import -` reads standard input.
pub fn is_stdout(p: &Path) -> bool {
    p.as_os_str() == "-"
}

pub fn check_kallsyms(path: &Path) -> anyhow::Result<()> {
    let k = vmscope_symbols::Kallsyms::from_path(path)
        .map_err(|e| anyhow::anyhow!("--kallsyms: {e}"))?;
    if k.is_restricted() {
        anyhow::bail!(
            "--kallsyms {}: every address is zero (a copy of /proc/kallsyms made without root); copy it as root",
            path.display()
        );
    }
    Ok(())
}

/// `--symfs DIR`: an existing directory.
pub fn check_symfs(dir: &Path) -> anyhow::Result<()> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => anyhow::bail!("--symfs {}: not a directory", dir.display()),
        Err(e) => anyhow::bail!("--symfs {}: {e}", dir.display()),
    }
}

/// `--shared-io PID`: processes that exist now.
pub fn check_pids(option: &str, pids: &[u32]) -> anyhow::Result<()> {
    for p in pids {
        if !PathBuf::from(format!("/proc/{p}")).exists() {
            anyhow::bail!("{option} {p}: no such process");
        }
    }
    Ok(())
}

/// `--vm NAME=ROLE` arguments (record, top).
pub fn vm_roles(args: &[String]) -> anyhow::Result<Vec<(String, vmscope_model::Role)>> {
    let mut roles = Vec::new();
    for r in args {
        let (name, role) = r
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--vm {r}: expected NAME=active|passive|unmonitored"))?;
        let role = match vmscope_model::Role::parse(role) {
            Some(
                x @ (vmscope_model::Role::Active
                | vmscope_model::Role::Passive
                | vmscope_model::Role::Unmonitored),
            ) => x,
            _ => anyhow::bail!("--vm {r}: role must be active, passive or unmonitored"),
        };
        roles.push((name.to_string(), role));
    }
    Ok(roles)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The parsers by name, so a test can run each on the same bad values.
    type Check = fn(&str) -> Result<(), String>;

    const ALL_POSITIVE: &[(&str, Check)] = &[
        ("hertz", |s| hertz(s).map(drop)),
        ("rows", |s| rows(s).map(drop)),
        ("threads", |s| threads(s).map(drop)),
        ("pid", |s| pid(s).map(drop)),
        ("whole_seconds", |s| whole_seconds(s).map(drop)),
        ("seconds", |s| seconds(s).map(drop)),
    ];

    #[test]
    fn negative_zero_and_junk_say_what_is_expected() {
        for (name, p) in ALL_POSITIVE {
            for bad in ["-1", "0", "-0.5", "abc", ""] {
                let e = p(bad).expect_err(&format!("{name} accepted {bad}"));
                assert!(e.starts_with("must be a positive"), "{name} {bad}: {e}");
            }
            assert!(p("7").is_ok(), "{name}");
        }
        assert_eq!(seconds("0.25").unwrap(), 0.25);
        for bad in ["NaN", "inf", "-inf"] {
            assert!(seconds(bad).is_err(), "{bad}");
        }
        assert_eq!(pages("0").unwrap(), 0);
        assert!(pages("-4").unwrap_err().contains("positive"));
        assert_eq!(intervals("0").unwrap(), 0);
        assert!(percent("-5").unwrap_err().contains("between 0 and 100"));
        assert!(percent("NaN").is_err());
        assert!(rows("99999999999999999999999")
            .unwrap_err()
            .contains("too large"));
    }
}

/// When a recording's host kernel and binary addresses get their names
/// (`--symbolize`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SymbolizeWhen {
    /// At the session's first read (`report`, `compare`), once, on this
    /// host: the recording reads no symbol tables.
    Later,
    /// While recording: the session is complete when written (to be read
    /// on another host, or after the binaries are gone).
    Now,
}

impl SymbolizeWhen {
    pub fn defer(self) -> bool {
        self == SymbolizeWhen::Later
    }
}

/// Open the session at `path` for reading, first resolving the symbols its
/// recording left for the first read (`record --symbolize later`), with a
/// spinner and a line saying what that took (and, when it was done in a
/// temporary copy, why). The returned guard keeps such a copy until the
/// session is no longer read.
pub fn open_session(
    path: &Path,
) -> anyhow::Result<(vmscope_store::Session, Option<tempfile::TempPath>)> {
    let pb = indicatif::ProgressBar::new_spinner();
    pb.set_draw_target(indicatif::ProgressDrawTarget::stderr());
    let r = vmscope_engine::symbolize::open_for_reading(path, &mut |m| {
        pb.enable_steady_tick(std::time::Duration::from_millis(120));
        pb.set_message(m.to_string());
    });
    pb.finish_and_clear();
    let r = r?;
    if let Some(res) = &r.resolved {
        let place = match &r.copy {
            None => format!("stored in {}", path.display()),
            Some((why, _)) => format!(
                "in a temporary copy, since {why}; to keep them, copy the session to a \
                 writable place and read it there once, or record with --symbolize now"
            ),
        };
        eprintln!(
            "vmscope: resolved the symbols the recording left for the first read: {} frames, \
             {} stacks, {} rows, {} files with build-ids, {:.2} s ({place})",
            res.frames, res.stacks, res.rows, res.files, res.seconds,
        );
    }
    Ok((r.session, r.copy.map(|(_, t)| t)))
}
