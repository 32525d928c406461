//! Issue 36: the README, the guides in docs/ and bench/README.md show only
//! commands, subcommands and flags that exist, every link stays inside the
//! repository and resolves, the README keeps its shape (the two commands
//! first, at most 300 lines), each guide opens with its question and ends
//! with what to look at next, and every `vmscope ... --help` example and man
//! page matches the binary.
//!
//! An example is any `vmscope ...` command in a fenced `sh`/`bash` block, any
//! line of another block that starts with a `$ ` prompt, any inline code span
//! that starts with `vmscope `, and every line of a help text's closing
//! "Examples:". Its `--help` form (the subcommand path followed by `--help`)
//! must succeed, and each flag it shows must be in that help.

mod common;
use common::*;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// README.md, docs/*.md and bench/README.md.
fn doc_files() -> Vec<PathBuf> {
    let root = repo();
    let mut files = vec![root.join("README.md"), root.join("bench/README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

fn rel(p: &Path) -> String {
    p.strip_prefix(repo()).unwrap_or(p).display().to_string()
}

/// One command line found in a document: where, and its text.
struct Example {
    place: String,
    text: String,
}

/// The command lines of a markdown file (see the module docs).
fn examples_in_markdown(path: &Path) -> Vec<Example> {
    let text = std::fs::read_to_string(path).unwrap();
    examples_in_text(&text)
        .into_iter()
        .map(|e| Example {
            place: format!("{}:{}", rel(path), e.place),
            text: e.text,
        })
        .collect()
}

/// The command lines of markdown text; `place` is the line number.
fn examples_in_text(text: &str) -> Vec<Example> {
    let mut out = Vec::new();
    let mut fence: Option<String> = None;
    let mut pending: Option<String> = None;
    for (i, line) in text.lines().enumerate() {
        let place = (i + 1).to_string();
        let trimmed = line.trim_start();
        if let Some(rest) = trimmed.strip_prefix("```") {
            fence = match fence {
                Some(_) => None,
                None => Some(rest.trim().to_string()),
            };
            continue;
        }
        match fence.as_deref() {
            Some("sh" | "bash" | "shell") => {
                let continues = pending.is_some();
                let joined = pending.take().unwrap_or_default() + line;
                if let Some(head) = joined.strip_suffix('\\') {
                    pending = Some(head.to_string() + " ");
                } else {
                    out.push(Example {
                        place: if continues {
                            place + " (continued)"
                        } else {
                            place
                        },
                        text: joined,
                    });
                }
            }
            Some(_) => {
                if let Some(cmd) = trimmed.strip_prefix("$ ") {
                    out.push(Example {
                        place,
                        text: cmd.to_string(),
                    });
                }
            }
            None => {
                for span in inline_code(line) {
                    if span.starts_with("vmscope ") {
                        // `a\|b` in a table cell lists alternatives: take the first.
                        let text = span
                            .split(' ')
                            .map(|w| w.split("\\|").next().unwrap())
                            .collect::<Vec<_>>()
                            .join(" ");
                        out.push(Example {
                            place: place.clone(),
                            text,
                        });
                    }
                }
            }
        }
    }
    out
}

/// The inline code spans of a line of prose (single backticks).
fn inline_code(line: &str) -> Vec<String> {
    let mut spans = Vec::new();
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        let after = &rest[start + 1..];
        let Some(end) = after.find('`') else { break };
        spans.push(after[..end].to_string());
        rest = &after[end + 1..];
    }
    spans
}

/// Words of a shell line, quotes removed, with the operators that end a
/// simple command (`|`, `&&`, `;`, `&`, redirections, `$(`) as their own words.
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut quote: Option<char> = None;
    let mut chars = line.chars().peekable();
    let flush = |cur: &mut String, words: &mut Vec<String>| {
        if !cur.is_empty() {
            words.push(std::mem::take(cur));
        }
    };
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (None, '\'' | '"') => quote = Some(c),
            (None, '#') if cur.is_empty() => break,
            (None, ' ' | '\t') => flush(&mut cur, &mut words),
            (None, '|' | ';' | '&' | '<' | '>' | '(' | ')') => {
                flush(&mut cur, &mut words);
                words.push(c.to_string());
            }
            (None, '$') if chars.peek() == Some(&'(') => {
                flush(&mut cur, &mut words);
                words.push("$(".into());
                chars.next();
            }
            (Some(_) | None, c) => cur.push(c),
        }
    }
    flush(&mut cur, &mut words);
    words
}

/// The vmscope invocations of a shell line: the words after `vmscope`
/// (any path ending in /vmscope) up to the end of its simple command.
fn vmscope_invocations(line: &str) -> Vec<Vec<String>> {
    let words = shell_words(line);
    let is_op = |w: &str| matches!(w, "|" | ";" | "&" | "<" | ">" | "(" | ")" | "$(");
    let mut out = Vec::new();
    let mut i = 0;
    while i < words.len() {
        let w = &words[i];
        let is_vmscope = w == "vmscope" || w.ends_with("/vmscope");
        // Only in command position: the start of the line or after an operator,
        // past environment assignments and wrappers.
        let command_position = {
            let mut j = i;
            loop {
                if j == 0 {
                    break true;
                }
                let prev = &words[j - 1];
                if is_op(prev) {
                    break true;
                }
                if prev.contains('=') && !prev.starts_with('-')
                    || matches!(prev.as_str(), "sudo" | "exec" | "nice" | "time" | "env")
                {
                    j -= 1;
                    continue;
                }
                break false;
            }
        };
        if is_vmscope && command_position {
            let args: Vec<String> = words[i + 1..]
                .iter()
                .take_while(|w| !is_op(w))
                .cloned()
                .collect();
            i += 1 + args.len();
            out.push(args);
        } else {
            i += 1;
        }
    }
    out
}

/// `vmscope PATH --help`, cached per path.
struct Helps {
    cache: HashMap<Vec<String>, Result<String, String>>,
}

impl Helps {
    fn get(&mut self, path: &[String]) -> Result<String, String> {
        self.cache
            .entry(path.to_vec())
            .or_insert_with(|| {
                let out = vmscope().args(path).arg("--help").output().unwrap();
                if out.status.success() {
                    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
                } else {
                    Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
                }
            })
            .clone()
    }
}

/// The subcommand names a help lists under "Commands:".
fn subcommands(help: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut inside = false;
    for line in help.lines() {
        if line == "Commands:" {
            inside = true;
        } else if inside {
            if !line.starts_with("  ") {
                break;
            }
            if let Some(name) = line.split_whitespace().next() {
                names.push(name.to_string());
            }
        }
    }
    names
}

/// Whether a help text lists this flag (`--name`, or `-x` as a short one).
fn help_has_flag(help: &str, flag: &str) -> bool {
    help.lines().any(|l| {
        let l = l.trim_start();
        if !l.starts_with('-') {
            return false;
        }
        l.split([',', ' ', '='])
            .take_while(|w| w.starts_with('-') || w.is_empty())
            .any(|w| w == flag)
    })
}

/// A word that stands for any subcommand or value in prose ("NAME", "<cmd>").
fn placeholder(w: &str) -> bool {
    w.starts_with('<') || w == "..." || w.chars().all(|c| c.is_ascii_uppercase() || c == '_')
}

/// Commands `main` takes before clap, in no help: the package build's
/// generator and the agent broker other vmscope processes start.
const INTERNAL: [&str; 2] = ["__generate", "__agent-broker"];

/// Checks one invocation; an error names what does not exist.
fn check(helps: &mut Helps, args: &[String]) -> Result<(), String> {
    let mut path: Vec<String> = Vec::new();
    let mut help = helps.get(&path)?;
    for w in args {
        if w == "--" {
            break;
        }
        if let Some(long) = w.strip_prefix("--") {
            let flag = format!("--{}", long.split('=').next().unwrap());
            if !help_has_flag(&help, &flag) {
                return Err(format!("`vmscope {}` has no {flag}", path.join(" ")));
            }
            continue;
        }
        if let Some(short) = w.strip_prefix('-') {
            // "-" (standard input) and negative numbers are values.
            if let Some(c) = short.chars().next().filter(char::is_ascii_alphabetic) {
                let flag = format!("-{c}");
                if !help_has_flag(&help, &flag) {
                    return Err(format!("`vmscope {}` has no {flag}", path.join(" ")));
                }
            }
            continue;
        }
        let subs = subcommands(&help);
        if subs.is_empty() {
            continue; // an argument of a command without subcommands
        }
        if placeholder(w) || (path.is_empty() && INTERNAL.contains(&w.as_str())) {
            return Ok(());
        }
        if !subs.iter().any(|s| s == w) {
            return Err(format!(
                "`vmscope {}` has no subcommand {w:?} (it has: {})",
                path.join(" "),
                subs.join(", ")
            ));
        }
        path.push(w.clone());
        help = helps.get(&path)?;
    }
    Ok(())
}

#[test]
fn every_command_shown_in_the_docs_exists() {
    let mut helps = Helps {
        cache: HashMap::new(),
    };
    let mut bad = Vec::new();
    let mut checked = 0;
    for file in doc_files() {
        for ex in examples_in_markdown(&file) {
            for args in vmscope_invocations(&ex.text) {
                checked += 1;
                if let Err(e) = check(&mut helps, &args) {
                    bad.push(format!("{}: {}: {e}", ex.place, ex.text.trim()));
                }
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    assert!(
        checked > 100,
        "only {checked} vmscope commands found in the docs"
    );
}

/// Every command path, from the "Commands:" lists of the helps.
fn every_path(helps: &mut Helps) -> Vec<Vec<String>> {
    let mut paths = vec![Vec::new()];
    let mut i = 0;
    while i < paths.len() {
        let help = helps.get(&paths[i]).unwrap();
        for sub in subcommands(&help) {
            if sub != "help" {
                let mut p = paths[i].clone();
                p.push(sub);
                paths.push(p);
            }
        }
        i += 1;
    }
    paths
}

#[test]
fn every_example_in_the_helps_exists() {
    let mut helps = Helps {
        cache: HashMap::new(),
    };
    let mut bad = Vec::new();
    for path in every_path(&mut helps) {
        let help = helps.get(&path).unwrap();
        let examples = help
            .rsplit_once("\nExamples:\n")
            .map(|(_, e)| e.to_string())
            .unwrap_or_default();
        assert!(
            !examples.is_empty(),
            "vmscope {} --help has no examples",
            path.join(" ")
        );
        for line in examples.lines() {
            // The command, without the description after two or more spaces.
            let cmd = line.trim_start().split("  ").next().unwrap();
            for args in vmscope_invocations(cmd) {
                if let Err(e) = check(&mut helps, &args) {
                    bad.push(format!("vmscope {} --help: {cmd}: {e}", path.join(" ")));
                }
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn man_pages_carry_the_examples() {
    let dir = tempfile::tempdir().unwrap();
    run_ok(vmscope().args(["__generate", "man"]).arg(dir.path()));
    let mut helps = Helps {
        cache: HashMap::new(),
    };
    for path in every_path(&mut helps) {
        let name = std::iter::once("vmscope".to_string())
            .chain(path.iter().cloned())
            .collect::<Vec<_>>()
            .join("-");
        let page = std::fs::read_to_string(dir.path().join(format!("{name}.1")))
            .unwrap_or_else(|e| panic!("{name}.1: {e}"));
        // roff escapes every hyphen; compare words without them.
        let plain = page.replace("\\-", "-").replace("\\*(Aq", "'");
        let help = helps.get(&path).unwrap();
        let (_, examples) = help.rsplit_once("\nExamples:\n").unwrap();
        for line in examples.lines() {
            let cmd = line.trim_start().split("  ").next().unwrap();
            assert!(plain.contains(cmd), "{name}.1 lacks the example {cmd:?}");
        }
    }
}

#[test]
fn links_stay_in_the_repository_and_resolve() {
    let mut bad = Vec::new();
    for file in doc_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        for (i, line) in text.lines().enumerate() {
            let place = format!("{}:{}", rel(&file), i + 1);
            for scheme in ["http://", "https://"] {
                for (at, _) in line.match_indices(scheme) {
                    // A named site (a dot in its name) is outside; loopback
                    // and placeholder hosts (`host1:9464`) of examples are not.
                    let host: String = line[at + scheme.len()..]
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '.' || *c == '-')
                        .collect();
                    let numeric = host.chars().all(|c| c.is_ascii_digit() || c == '.');
                    if host.contains('.') && !numeric {
                        bad.push(format!("{place}: a link out of the repository: {line}"));
                    }
                }
            }
            for target in link_targets(line) {
                if target.contains("://") || target.starts_with("mailto:") {
                    bad.push(format!("{place}: a link out of the repository: {target}"));
                    continue;
                }
                let (file_part, anchor) = target.split_once('#').unwrap_or((&target, ""));
                let dest = if file_part.is_empty() {
                    file.clone()
                } else {
                    file.parent().unwrap().join(file_part)
                };
                if !dest.exists() {
                    bad.push(format!("{place}: {target}: no such file"));
                    continue;
                }
                if !anchor.is_empty() && dest.extension().is_some_and(|e| e == "md") {
                    let anchors = heading_anchors(&std::fs::read_to_string(&dest).unwrap());
                    if !anchors.iter().any(|a| a == anchor) {
                        bad.push(format!("{place}: {target}: no heading with that anchor"));
                    }
                }
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// The targets of `[text](target)` and `![alt](target)` in a line.
fn link_targets(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(i) = rest.find("](") {
        let after = &rest[i + 2..];
        let Some(end) = after.find(')') else { break };
        out.push(after[..end].trim().to_string());
        rest = &after[end..];
    }
    out
}

/// The anchors markdown renderers give a file's headings: lower case,
/// punctuation dropped, spaces as hyphens.
fn heading_anchors(text: &str) -> Vec<String> {
    let mut fence = false;
    text.lines()
        .filter(|l| {
            if l.trim_start().starts_with("```") {
                fence = !fence;
            }
            !fence && l.starts_with('#')
        })
        .map(|l| {
            l.trim_start_matches('#')
                .trim()
                .to_lowercase()
                .chars()
                .filter_map(|c| match c {
                    ' ' => Some('-'),
                    c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                    _ => None,
                })
                .collect()
        })
        .collect()
}

#[test]
fn readme_starts_with_the_two_commands_and_stays_short() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(lines <= 300, "README.md has {lines} lines (at most 300)");
    let block: Vec<&str> = readme
        .split("```")
        .nth(1)
        .unwrap()
        .lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .collect();
    assert_eq!(
        block.len(),
        2,
        "the first block holds two commands: {block:?}"
    );
    assert!(block[0].starts_with("scripts/demo.sh"), "{block:?}");
    assert!(block[1].starts_with("scripts/test.sh"), "{block:?}");
    // Root on a fresh machine has no sudo: neither the commands nor the
    // scripts they run may need it.
    for script in ["scripts/demo.sh", "scripts/test.sh", "scripts/setup.sh"] {
        let text = std::fs::read_to_string(repo().join(script)).unwrap();
        let calls_sudo = text
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .any(|l| shell_words(l).iter().any(|w| w == "sudo"));
        assert!(!calls_sudo, "{script} calls sudo");
    }
}

/// The task guides: each opens with the question it answers and ends with
/// what to look at next.
#[test]
fn guides_open_with_a_question_and_end_with_what_next() {
    let docs = repo().join("docs");
    let index = std::fs::read_to_string(docs.join("README.md")).unwrap();
    for guide in [
        "why-slow.md",
        "profile-vm.md",
        "vm-cost.md",
        "live.md",
        "fleet.md",
        "experiments.md",
    ] {
        let text = std::fs::read_to_string(docs.join(guide))
            .unwrap_or_else(|e| panic!("docs/{guide}: {e}"));
        assert!(
            index.contains(&format!("({guide})")),
            "docs/README.md does not link {guide}"
        );
        let first_paragraph = text
            .lines()
            .skip_while(|l| l.starts_with('#') || l.trim().is_empty())
            .take_while(|l| !l.trim().is_empty())
            .collect::<Vec<_>>()
            .join(" ");
        assert!(
            first_paragraph.contains('?'),
            "docs/{guide} does not open with its question: {first_paragraph}"
        );
        let last_heading = text
            .lines()
            .rfind(|l| l.starts_with("## "))
            .unwrap_or_default();
        assert_eq!(
            last_heading, "## What to look at next",
            "docs/{guide} does not end with what to look at next"
        );
    }
}

#[test]
fn the_extractor_reads_shell_lines_as_a_shell_would() {
    assert_eq!(
        vmscope_invocations("sudo VMSCOPE_X=1 vmscope record -a -g -d 5 > out.txt"),
        vec![vec!["record", "-a", "-g", "-d", "5"]]
    );
    assert_eq!(
        vmscope_invocations("vmscope import perf.data && vmscope report   # comment"),
        vec![vec!["import", "perf.data"], vec!["report"]]
    );
    assert_eq!(
        vmscope_invocations("vmscope lab exec vm0 -- sh -c 'vmscope-agent demo &'"),
        vec![vec![
            "lab",
            "exec",
            "vm0",
            "--",
            "sh",
            "-c",
            "vmscope-agent demo &"
        ]]
    );
    assert_eq!(
        vmscope_invocations("perf record -o - -- sleep 5 | target/release/vmscope import -"),
        vec![vec!["import", "-"]]
    );
    assert!(vmscope_invocations("echo vmscope report").is_empty());
    let table = "| `vmscope lab image\\|up` | `vmscope record --vm NAME=active\\|passive` |";
    let found: Vec<String> = examples_in_text(table)
        .into_iter()
        .map(|e| e.text)
        .collect();
    assert_eq!(
        found,
        ["vmscope lab image", "vmscope record --vm NAME=active"]
    );
    assert!(help_has_flag(
        "  -a, --all-cpus\n      --vm <NAME=ROLE>  x",
        "--vm"
    ));
    assert!(help_has_flag("  -a, --all-cpus\n", "-a"));
    assert!(!help_has_flag("  -a, --all-cpus  the --vm flag\n", "--vm"));
}
