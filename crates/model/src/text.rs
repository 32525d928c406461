//! Names from outside made safe to print (docs/architecture.md §2).
//!
//! A VM's name comes from whoever started it (QEMU and libvirt accept any
//! bytes), a process name from whatever runs in a guest: neither may steer
//! the terminal of the administrator who reads vmscope's text output, nor
//! split one line into two. [`visible`] shows every control character as a
//! visible escape (`\e`, `\n`, `\t`, `\x07`, `\u{202e}`), as `ps` shows them
//! as `?` but without losing which byte it was; [`visible_cut`] also cuts a
//! name to a width for tables (machine formats, JSON and CSV, keep the whole
//! name and quote it by their own rules). Bytes that were not UTF-8 arrive
//! here already as U+FFFD (the readers decode names lossily).

use std::borrow::Cow;
use std::fmt::Write;

/// Whether `c` would act on a terminal instead of printing: C0 and C1
/// controls, DEL, and the Unicode format characters that reorder or hide
/// text (bidirectional overrides and isolates, zero-width characters).
pub fn is_control(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{200b}'..='\u{200f}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2060}'..='\u{2064}'
                | '\u{2066}'..='\u{2069}'
                | '\u{feff}'
        )
}

fn escape_into(out: &mut String, c: char) {
    match c {
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        '\x1b' => out.push_str("\\e"),
        c if (c as u32) < 0x100 => {
            let _ = write!(out, "\\x{:02x}", c as u32);
        }
        c => {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        }
    }
}

/// `s` with every control character shown as an escape; borrowed when
/// there is none.
pub fn visible(s: &str) -> Cow<'_, str> {
    if !s.chars().any(is_control) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if is_control(c) {
            escape_into(&mut out, c);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// [`visible`], cut to at most `max` characters (counting escapes as they
/// print) with `…` as the last one when anything was left out.
pub fn visible_cut(s: &str, max: usize) -> Cow<'_, str> {
    let v = visible(s);
    if v.chars().count() <= max {
        return v;
    }
    let keep = max.saturating_sub(1);
    let mut out: String = v.chars().take(keep).collect();
    out.push('…');
    Cow::Owned(out)
}

/// How wide a VM or process name may be in a table column before it is cut
/// (the JSON output has the whole name).
pub const NAME_WIDTH: usize = 48;

/// A label value of the Prometheus text and OpenMetrics formats: `\`, `"`
/// and line feed escaped as `\\`, `\"` and `\n`, as both formats require
/// (anything else, other control characters included, is allowed).
pub fn label_value(s: &str) -> Cow<'_, str> {
    if !s.contains(['\\', '"', '\n']) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 4);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// A CSV field for text that came from outside: [`visible`] (a CSV read on
/// a terminal is a text output too), then quoted as RFC 4180 says when it
/// holds a comma, a quote or a leading or trailing space.
pub fn csv_field(s: &str) -> Cow<'_, str> {
    let v = visible(s);
    if !v.contains([',', '"']) && !v.starts_with(' ') && !v.ends_with(' ') {
        return v;
    }
    Cow::Owned(format!("\"{}\"", v.replace('"', "\"\"")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names_are_borrowed() {
        assert!(matches!(visible("vm-db 1"), Cow::Borrowed("vm-db 1")));
        assert!(matches!(label_value("vm0"), Cow::Borrowed("vm0")));
    }

    #[test]
    fn control_characters_become_escapes() {
        let hostile = "pz\x1b]2;PWNED\x07\x1b[31mRED\nNEXT\tx\u{9b}y\u{202e}z\u{7f}";
        let v = visible(hostile);
        assert_eq!(
            v,
            "pz\\e]2;PWNED\\x07\\e[31mRED\\nNEXT\\tx\\x9by\\u{202e}z\\x7f"
        );
        assert!(!v.chars().any(is_control), "{v}");
        // Quotes, backslashes and replacement characters print as they are.
        assert_eq!(visible("a\"b\\c\u{fffd}"), "a\"b\\c\u{fffd}");
    }

    #[test]
    fn long_names_are_cut_with_an_ellipsis() {
        let long = "x".repeat(5000);
        let cut = visible_cut(&long, NAME_WIDTH);
        assert_eq!(cut.chars().count(), NAME_WIDTH);
        assert!(cut.ends_with('…'));
        assert_eq!(visible_cut("short", NAME_WIDTH), "short");
        // Escapes count as they print.
        let cut = visible_cut("\n\n\n\n", 5);
        assert_eq!(cut, "\\n\\n…");
    }

    #[test]
    fn csv_fields_are_visible_and_quoted() {
        assert_eq!(csv_field("vm0"), "vm0");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"hi\"\n"), "\"say \"\"hi\"\"\\n\"");
    }

    #[test]
    fn label_values_escape_what_the_exposition_formats_require() {
        assert_eq!(label_value("a\"b\\c\nd\te"), "a\\\"b\\\\c\\nd\te");
    }
}
