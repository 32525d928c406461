//! Files that are not, or no longer, valid perf.data: each must give one
//! clear error line naming the file, never a panic.

use std::io::Cursor;
use std::path::{Path, PathBuf};
use vmscope_perfdata::{import, import_reader, PerfDataError};

fn fixture_bytes() -> Vec<u8> {
    std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../testdata/perf/quipper.perf.data.callgraph-3.8"),
    )
    .unwrap()
}

fn import_bytes(bytes: &[u8]) -> Result<u64, PerfDataError> {
    let mut n = 0;
    import_reader(Cursor::new(bytes), "t.data", &mut |_| n += 1)?;
    Ok(n)
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

fn err_of(path: &Path) -> String {
    let e = import(path, &mut |_| {}).expect_err("must fail");
    let msg = e.to_string();
    assert!(!msg.contains('\n'), "one line: {msg}");
    assert!(msg.starts_with(&path.display().to_string()), "{msg}");
    msg
}

#[test]
fn empty_text_and_elf_files() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "empty.data", b"");
    assert_eq!(
        err_of(&p),
        format!("{}: not a perf.data file (empty file)", p.display())
    );
    let p = write(dir.path(), "text.data", b"hello, this is not perf data\n");
    assert_eq!(
        err_of(&p),
        format!("{}: not a perf.data file (bad magic)", p.display())
    );
    let elf = std::fs::read(std::env::current_exe().unwrap()).unwrap();
    assert_eq!(&elf[..4], b"\x7fELF");
    let p = write(dir.path(), "elf.data", &elf);
    assert_eq!(
        err_of(&p),
        format!("{}: not a perf.data file (bad magic)", p.display())
    );
}

#[test]
fn missing_file_names_the_path() {
    let msg = err_of(Path::new("/nonexistent/perf.data"));
    assert!(msg.contains("I/O error"), "{msg}");
}

#[test]
fn old_format_and_short_magic() {
    let dir = tempfile::tempdir().unwrap();
    let mut v1 = b"PERFFILE".to_vec();
    v1.resize(200, 0);
    let p = write(dir.path(), "v1.data", &v1);
    let msg = err_of(&p);
    assert!(
        msg.contains("unsupported perf.data format: version 1"),
        "{msg}"
    );
    let p = write(dir.path(), "short.data", b"PERF");
    assert_eq!(
        err_of(&p),
        format!(
            "{}: truncated at byte 4 (the file header needs at least 16 bytes)",
            p.display()
        )
    );
}

#[test]
fn truncated_fixture() {
    let full = fixture_bytes();
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            100,
            "truncated at byte 100 (the file header needs 104 bytes)".to_string(),
        ),
        (
            5000,
            "truncated at byte 5000 (data section runs from byte 320 to byte 404520)".to_string(),
        ),
        (
            full.len() / 2,
            format!(
                "truncated at byte {} (data section runs from byte 320 to byte 404520)",
                full.len() / 2
            ),
        ),
        (
            full.len() - 10,
            format!(
                "truncated at byte {} (feature 16 section runs",
                full.len() - 10
            ),
        ),
    ];
    for (len, want) in cases {
        let p = write(dir.path(), &format!("cut{len}.data"), &full[..len]);
        let msg = err_of(&p);
        let want = format!("{}: {want}", p.display());
        assert!(msg.starts_with(&want), "got  {msg}\nwant {want}");
    }
}

/// xorshift64*: deterministic, no extra crate.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// The parser's panics are caught and reported as this message; the layout
/// checks are meant to stop malformed input before it gets there.
const BACKSTOP: &str = "parser rejected malformed records";

#[test]
fn truncations_and_byte_flips_never_panic() {
    let full = fixture_bytes();
    let mut rng = Rng(0x5eed_1234_abcd_ef01);
    let mut outcomes = [0usize; 2];
    let mut check = |bytes: &[u8]| match import_bytes(bytes) {
        Ok(_) => outcomes[0] += 1,
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.starts_with("t.data: ") && !msg.contains('\n'), "{msg}");
            assert!(!msg.contains(BACKSTOP), "{msg}");
            outcomes[1] += 1;
        }
    };
    for i in 0..200 {
        // Dense near the header and feature sections, spread over the data.
        let len = match i % 4 {
            0 => rng.below(1024),
            1 => full.len() - 1 - rng.below(4096),
            _ => rng.below(full.len()),
        };
        check(&full[..len]);
    }
    for i in 0..300 {
        let mut bytes = full.clone();
        let flips = 1 + rng.below(8);
        for _ in 0..flips {
            // A third of the flips hit the header, attrs and feature table.
            let at = if i % 3 == 0 {
                rng.below(400)
            } else {
                rng.below(bytes.len())
            };
            bytes[at] ^= 1 << rng.below(8);
        }
        check(&bytes);
    }
    // Flips that make record sizes and counts huge.
    for i in 0..100 {
        let mut bytes = full.clone();
        let at = 320 + rng.below(full.len() - 400);
        bytes[at] = if i % 2 == 0 { 0xff } else { 0 };
        bytes[at + 1] = 0xff;
        check(&bytes);
    }
    assert!(outcomes[1] > 0);
    eprintln!("ok: {}, errors: {}", outcomes[0], outcomes[1]);
}

#[test]
fn a_panicking_sink_is_not_swallowed() {
    let full = fixture_bytes();
    let r = std::panic::catch_unwind(|| {
        let _ = import_reader(Cursor::new(&full), "t.data", &mut |_| panic!("sink"));
    });
    assert!(r.is_err());
}

#[test]
fn a_killed_perf_record_is_named_as_such() {
    // What `perf record` leaves when it is SIGKILLed: the header's data size
    // is still 0 and the feature table is garbage past the real data.
    let mut bytes = fixture_bytes();
    bytes[48..56].copy_from_slice(&0u64.to_le_bytes());
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "killed.data", &bytes);
    let msg = err_of(&p);
    assert!(
        msg.contains("did not finish properly") && msg.contains("data size is 0"),
        "{msg}"
    );
}

/// The record framing is checked as the parser reads the data section (the
/// file is read once): a bad record size is still named with its byte,
/// wherever in the data it is (here past the first 256 KiB read, and in
/// the last read).
#[test]
fn bad_record_framing_is_named_with_its_byte() {
    let full = fixture_bytes();
    // The fixture's data section runs from byte 320 to byte 404520.
    let size_at = |bytes: &[u8], pos: usize| u16::from_le_bytes([bytes[pos + 6], bytes[pos + 7]]);
    // Walk to a record deep in the data (past the first 256 KiB read).
    let mut pos = 320usize;
    while pos < 300_000 {
        pos += size_at(&full, pos) as usize;
    }
    let dir = tempfile::tempdir().unwrap();
    for (name, set, want) in [
        (
            "zero.data",
            0u16,
            format!(
                "corrupt perf.data: record at byte {pos} has size 0, less than its 8-byte header"
            ),
        ),
        (
            "huge.data",
            u16::MAX,
            // The last records: one that large runs past the data's end.
            String::new(),
        ),
    ] {
        let mut bytes = full.clone();
        let at = if set == 0 {
            pos
        } else {
            // A record within 64 KiB of the data section's end.
            let mut p = pos;
            while 404_520 - p > 60_000 {
                p += size_at(&full, p) as usize;
            }
            p
        };
        bytes[at + 6..at + 8].copy_from_slice(&set.to_le_bytes());
        let p = write(dir.path(), name, &bytes);
        let msg = err_of(&p);
        let want = if want.is_empty() {
            format!(
                "corrupt perf.data: record at byte {at} needs {} bytes, past the data section's end at byte 404520",
                u16::MAX
            )
        } else {
            want
        };
        assert!(msg.ends_with(&want), "got  {msg}\nwant …{want}");
    }
}
