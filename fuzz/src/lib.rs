//! Bodies of the fuzz targets, shared by the libFuzzer binaries in
//! `fuzz_targets/` and the plain smoke loop in `tests/smoke.rs` (which runs
//! without libFuzzer or a nightly toolchain).
//!
//! Each body feeds arbitrary input to one parser and exercises every query
//! on what it returns; the only failure is a panic (or a sanitizer report).
//! Parsers whose fuzz entry point lives in their own crate (`frames`,
//! `perfdata`) are called as they are.

use vmscope_symbols::{ElfSymbols, Kallsyms};

/// Addresses worth probing: fixed edges plus words taken from the input.
fn probes(data: &[u8]) -> Vec<u64> {
    let mut v = vec![
        0,
        1,
        0xfff,
        0x1000,
        u64::MAX,
        u64::MAX - 1,
        0xffff_ffff_8100_0000,
    ];
    for chunk in data.chunks(8).take(16) {
        let mut w = [0u8; 8];
        w[..chunk.len()].copy_from_slice(chunk);
        v.push(u64::from_le_bytes(w));
    }
    v
}

/// `Kallsyms::parse` on UTF-8 input, then lookups.
pub fn kallsyms(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(k) = Kallsyms::parse(text) else {
        return;
    };
    let _ = (k.len(), k.is_empty(), k.is_restricted());
    let _ = k.modules().count();
    let starts: Vec<u64> = k.iter().map(|s| s.start).take(256).collect();
    for s in starts {
        for a in [s, s.wrapping_add(1), s.wrapping_sub(1)] {
            if let Some(sym) = k.lookup(a) {
                assert!(sym.start <= a, "symbol above the address");
            }
        }
    }
    for a in probes(data) {
        if let Some(sym) = k.lookup(a) {
            assert!(sym.start <= a, "symbol above the address");
        }
    }
}

/// `ElfSymbols::parse` on arbitrary bytes, then every query.
pub fn elf(data: &[u8]) {
    let Ok(e) = ElfSymbols::parse(data) else {
        return;
    };
    let _ = (
        e.build_id(),
        e.debuglink(),
        e.has_symtab(),
        e.len(),
        e.is_empty(),
    );
    let ranges: Vec<(u64, u64)> = e.iter().map(|(s, end, _)| (s, end)).take(256).collect();
    for (start, end) in ranges {
        assert!(start <= end, "symbol ends before it starts");
        let _ = e.lookup_vaddr(start);
        let _ = e.lookup_vaddr(end.wrapping_sub(1));
    }
    for a in probes(data) {
        let _ = e.lookup_vaddr(a);
        let _ = e.lookup_file_offset(a);
        let _ = e.file_offset_to_vaddr(a);
    }
}

/// The agent protocol's frame and message decoders (requests and
/// responses), fed in input-chosen pieces and whole; the decoder's own
/// entry point checks that it never buffers more than it was given.
pub fn frames(data: &[u8]) {
    vmscope_protocol::fuzz_decode(data);
}

/// A whole perf.data import (header, attrs, feature sections, records in
/// the file and piped formats) from memory; errors are fine, panics are not.
pub fn perfdata(data: &[u8]) {
    let _ = vmscope_perfdata::import_reader(std::io::Cursor::new(data), "fuzz", &mut |_| {});
}

/// The varint blocks of a session a deferring recording wrote (its rows,
/// stacks and frames; sessions are files people hand each other): the
/// first byte picks the kind, the rest is the block. Decoding never
/// panics, and whatever decodes encodes to a block that decodes the same.
pub fn blocks(data: &[u8]) {
    use vmscope_model::deferred::blocks as b;
    let Some((&kind, block)) = data.split_first() else {
        return;
    };
    match kind % 3 {
        0 => {
            if let Some(v) = b::decode_rows(block) {
                assert_eq!(b::decode_rows(&b::encode_rows(&v)).as_ref(), Some(&v));
            }
        }
        1 => {
            if let Some(v) = b::decode_stacks(block) {
                let e = b::encode_stacks(v.iter().map(|(i, f)| (*i, f.as_slice())));
                assert_eq!(b::decode_stacks(&e).as_ref(), Some(&v));
            }
        }
        _ => {
            if let Some(v) = b::decode_frames(block) {
                assert_eq!(b::decode_frames(&b::encode_frames(&v)).as_ref(), Some(&v));
            }
        }
    }
}
