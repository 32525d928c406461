//! `vmscope __generate man|completions DIR`: writes the man pages and shell
//! completions from the same clap definitions that `--help` prints, so the
//! package never ships pages that drift from the binary. The Debian package
//! build (`packaging/build-deb.sh`) runs it right after `cargo build`.
//!
//! It is not a clap subcommand of `vmscope`: `main` hands it the arguments
//! before clap parses them, so it appears in no `--help`, man page or
//! completion (clap_complete lists hidden subcommands too).

use anyhow::Context as _;
use clap::{Command, Parser, ValueEnum};
use clap_complete::Shell;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The first argument that selects this command.
pub const NAME: &str = "__generate";

#[derive(Clone, Copy, ValueEnum)]
enum What {
    /// vmscope.1 and one page per subcommand (vmscope-record.1, vmscope-lab-up.1, ...).
    Man,
    /// vmscope.bash, _vmscope (zsh) and vmscope.fish.
    Completions,
}

/// Write vmscope's man pages or shell completions into a directory.
#[derive(Parser)]
#[command(name = "vmscope __generate")]
struct GenerateArgs {
    /// What to write.
    what: What,
    /// Directory to write into (created if missing).
    dir: PathBuf,
}

/// Run with the arguments after `__generate`; `cli` is vmscope's command
/// tree. Errors as every vmscope command reports them: one line, exit code 2.
pub fn main(args: impl Iterator<Item = String>, cli: Command) -> ExitCode {
    match run(args, cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("vmscope: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(args: impl Iterator<Item = String>, cli: Command) -> anyhow::Result<ExitCode> {
    let a = match GenerateArgs::try_parse_from(std::iter::once(NAME.to_string()).chain(args)) {
        Ok(a) => a,
        Err(e) if !e.use_stderr() => {
            e.print()?;
            return Ok(ExitCode::SUCCESS);
        }
        Err(e) => {
            let msg = e.to_string();
            let first = msg.lines().next().unwrap_or("bad arguments");
            anyhow::bail!("{NAME}: {}", first.trim_start_matches("error: "))
        }
    };
    std::fs::create_dir_all(&a.dir).with_context(|| format!("creating {}", a.dir.display()))?;
    let written = match a.what {
        What::Man => man(cli, &a.dir)?,
        What::Completions => completions(cli, &a.dir)?,
    };
    for p in &written {
        println!("{}", p.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// vmscope(1) and a page per (nested) subcommand, named vmscope-SUB[-SUB].1.
fn man(cli: Command, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    clap_mangen::generate_to(cli, dir)
        .with_context(|| format!("writing into {}", dir.display()))?;
    let mut pages: Vec<PathBuf> = list(dir)?
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "1"))
        .collect();
    pages.sort();
    Ok(pages)
}

/// bash, zsh and fish completion scripts.
fn completions(mut cli: Command, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    [Shell::Bash, Shell::Zsh, Shell::Fish]
        .into_iter()
        .map(|shell| {
            clap_complete::generate_to(shell, &mut cli, "vmscope", dir)
                .with_context(|| format!("writing {shell} completions into {}", dir.display()))
        })
        .collect()
}

fn list(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        out.push(e?.path());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cli() -> Command {
        Command::new("vmscope")
            .version("1.2.3 (commit abc, clean)")
            .subcommand(
                Command::new("record")
                    .about("Sample")
                    .arg(clap::arg!(-a --all "All")),
            )
            .subcommand(Command::new("report").about("Print"))
            .subcommand(
                Command::new("lab")
                    .about("Labs")
                    .subcommand(Command::new("up").about("Boot")),
            )
    }

    #[test]
    fn man_pages_per_subcommand() {
        let dir = tempfile::tempdir().unwrap();
        let pages = man(cli(), dir.path()).unwrap();
        let names: Vec<String> = pages
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            [
                "vmscope-lab-up.1",
                "vmscope-lab.1",
                "vmscope-record.1",
                "vmscope-report.1",
                "vmscope.1"
            ]
        );
        let record = std::fs::read_to_string(dir.path().join("vmscope-record.1")).unwrap();
        assert!(record.contains(".TH vmscope-record 1"), "{record}");
        assert!(record.contains("\\-\\-all"), "{record}");
    }

    #[test]
    fn completions_for_three_shells() {
        let dir = tempfile::tempdir().unwrap();
        let files = completions(cli(), dir.path()).unwrap();
        assert_eq!(files.len(), 3);
        let bash = std::fs::read_to_string(dir.path().join("vmscope.bash")).unwrap();
        assert!(bash.contains("complete -F _vmscope"), "{bash}");
        assert!(bash.contains("record"));
        assert!(dir.path().join("_vmscope").is_file());
        assert!(dir.path().join("vmscope.fish").is_file());
    }

    #[test]
    fn bad_arguments_are_an_error() {
        let e = run(["pdf".to_string(), "/tmp".to_string()].into_iter(), cli()).unwrap_err();
        assert!(e.to_string().contains("pdf"), "{e}");
    }
}
