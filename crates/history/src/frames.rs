//! An interval's document as stored: its numbers rounded to 4 decimals
//! ([`compact`]), deflated, with the document before it as deflate's preset
//! dictionary, and every [`KEY_EVERY`]th one (a key document) with the
//! segment's first (segments whose meta says `frames_dictionary` =
//! `previous/60`; older ones, `first`, take the first for every later one).
//! Consecutive `top` documents differ mostly in their numbers: on the
//! frames of a 1-VM history (`bench/history`, 737 bytes each as JSON) each
//! took 111 bytes with the first as dictionary, 83 with the previous one,
//! and 47 with the previous one and the numbers rounded.
//!
//! Reading a document means inflating the ones from its key document on,
//! at most [`KEY_EVERY`] of a few hundred bytes each; a damaged one takes
//! the rest of its group with it, and the reader skips that segment.

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

/// The meta key and value of segments that store frames so.
pub const META: (&str, &str) = ("frames_dictionary", "previous/60");
/// The value of segments whose later documents all take the first one.
pub const META_FIRST: &str = "first";
/// Every this many documents one takes the segment's first as dictionary.
pub const KEY_EVERY: usize = 60;

/// The dictionary of document `i` of a segment (0-based, in the order
/// written) under [`META`]: none for the first, the `first` for a key
/// document, else the one before (`prev`).
pub fn dictionary_of<'a>(
    i: usize,
    first: Option<&'a [u8]>,
    prev: Option<&'a [u8]>,
) -> Option<&'a [u8]> {
    if i == 0 {
        None
    } else if i.is_multiple_of(KEY_EVERY) {
        first
    } else {
        prev
    }
}

/// `doc` (JSON) with every number that has a fraction or an exponent
/// rounded to 4 decimals, strings left alone; what is not JSON is
/// returned as it is. Live `top` prints these to a tenth: the digits past
/// the fourth cost a history most of its document bytes and say nothing.
/// A scan of the bytes, not a parse into `serde_json::Value`: that would
/// reorder the keys (no `preserve_order` here) and the document would no
/// longer be the one live `top --batch` printed.
pub fn compact(doc: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(doc.len());
    let mut i = 0;
    while i < doc.len() {
        let c = doc[i];
        if c == b'"' {
            // A string, escapes included, copied as it is.
            let start = i;
            i += 1;
            while i < doc.len() && doc[i] != b'"' {
                i += if doc[i] == b'\\' { 2 } else { 1 };
            }
            i = (i + 1).min(doc.len());
            out.extend_from_slice(&doc[start..i]);
        } else if c == b'-' || c.is_ascii_digit() {
            let start = i;
            while i < doc.len() && matches!(doc[i], b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E')
            {
                i += 1;
            }
            let tok = &doc[start..i];
            let fractional = tok.iter().any(|b| matches!(b, b'.' | b'e' | b'E'));
            match std::str::from_utf8(tok)
                .ok()
                .and_then(|t| t.parse::<f64>().ok())
            {
                Some(v) if fractional && v.is_finite() => {
                    let r = format!("{v:.4}");
                    let r = r.trim_end_matches('0').trim_end_matches('.');
                    out.extend_from_slice(if r == "-0" { b"0" } else { r.as_bytes() });
                }
                _ => out.extend_from_slice(tok),
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// `doc` deflated (raw deflate), with `dict` as the preset dictionary.
pub fn deflate(doc: &[u8], dict: Option<&[u8]>) -> std::io::Result<Vec<u8>> {
    let mut c = Compress::new(Compression::default(), false);
    if let Some(d) = dict {
        c.set_dictionary(d).map_err(std::io::Error::other)?;
    }
    let mut out = Vec::with_capacity(doc.len() / 2 + 64);
    loop {
        let done = c.total_in() as usize;
        if out.len() == out.capacity() {
            out.reserve(out.capacity().max(1024));
        }
        match c
            .compress_vec(&doc[done..], &mut out, FlushCompress::Finish)
            .map_err(std::io::Error::other)?
        {
            Status::StreamEnd => return Ok(out),
            Status::Ok | Status::BufError => {}
        }
    }
}

/// The document of `blob` ([`deflate`] with the same `dict`); at most
/// `limit` bytes of it (a damaged blob must not inflate without bound).
pub fn inflate(blob: &[u8], dict: Option<&[u8]>, limit: usize) -> std::io::Result<Vec<u8>> {
    let mut d = Decompress::new(false);
    if let Some(x) = dict {
        d.set_dictionary(x).map_err(std::io::Error::other)?;
    }
    let mut out = Vec::with_capacity(blob.len() * 4 + 64);
    loop {
        let done = d.total_in() as usize;
        if out.len() == out.capacity() {
            if out.len() >= limit {
                return Err(std::io::Error::other("a document inflates past its bound"));
            }
            out.reserve(out.capacity().max(1024));
        }
        let before = (d.total_in(), d.total_out());
        match d
            .decompress_vec(&blob[done..], &mut out, FlushDecompress::Finish)
            .map_err(std::io::Error::other)?
        {
            Status::StreamEnd => return Ok(out),
            Status::Ok | Status::BufError => {
                if (d.total_in(), d.total_out()) == before && out.len() < out.capacity() {
                    return Err(std::io::Error::other(
                        "a document ends before its stream does",
                    ));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_rounded_and_strings_kept() {
        let doc = br#"{"a":12.345678,"b":-0.00001,"c":[1,2.5,3e-7,1796209502.00017],"s":"x 1.23456 \" 9.87654","n":-3}"#;
        assert_eq!(
            String::from_utf8(compact(doc)).unwrap(),
            r#"{"a":12.3457,"b":0,"c":[1,2.5,0,1796209502.0002],"s":"x 1.23456 \" 9.87654","n":-3}"#
        );
        assert_eq!(compact(b"not json 1.234567"), b"not json 1.2346");
        let (f, p): (&[u8], &[u8]) = (b"first", b"prev");
        assert_eq!(dictionary_of(0, Some(f), Some(p)), None);
        assert_eq!(dictionary_of(1, Some(f), Some(p)), Some(p));
        assert_eq!(dictionary_of(KEY_EVERY, Some(f), Some(p)), Some(f));
        assert_eq!(dictionary_of(KEY_EVERY + 1, Some(f), Some(p)), Some(p));
    }

    #[test]
    fn documents_round_trip_with_and_without_the_dictionary() {
        let first =
            br#"{"domains":[{"name":"vm0","cpu_pct":12.5,"functions":["a","b"]}]}"#.repeat(20);
        let next =
            br#"{"domains":[{"name":"vm0","cpu_pct":13.5,"functions":["a","b"]}]}"#.repeat(20);
        let plain = deflate(&next, None).unwrap();
        let with = deflate(&next, Some(&first)).unwrap();
        assert!(
            with.len() < plain.len(),
            "{} vs {}",
            with.len(),
            plain.len()
        );
        assert_eq!(inflate(&plain, None, 1 << 20).unwrap(), next);
        assert_eq!(inflate(&with, Some(&first), 1 << 20).unwrap(), next);
        // Without its dictionary, or cut short, or over its bound: an error.
        assert!(inflate(&with, None, 1 << 20).is_err());
        assert!(inflate(&with[..with.len() / 2], Some(&first), 1 << 20).is_err());
        assert!(inflate(&plain, None, 16).is_err());
        assert_eq!(
            inflate(&deflate(b"", None).unwrap(), None, 16).unwrap(),
            b""
        );
    }
}
