//! An interval's document as stored: its numbers rounded to [`DECIMALS`] decimals
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

/// The meta key and value of segments that store frames so.
pub const META: (&str, &str) = ("frames_dictionary", "previous/60");
/// The value of segments whose later documents all take the first one.
pub const META_FIRST: &str = "first";
/// Decimals a document's numbers keep. Live `top` shows a tenth; on the
/// documents of a 1-VM history (`bench/history`) each took 54 bytes with
/// 4 decimals and 40 with 2 (deflated against the one before).
pub const DECIMALS: usize = 2;
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
/// rounded to [`DECIMALS`] decimals, strings left alone; what is not JSON is
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
                    let r = format!("{v:.*}", DECIMALS);
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

pub use vmscope_store::deflate::{deflate, inflate};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_rounded_and_strings_kept() {
        let doc = br#"{"a":12.345678,"b":-0.00001,"c":[1,2.5,3e-7,1796209502.00017],"s":"x 1.23456 \" 9.87654","n":-3}"#;
        assert_eq!(
            String::from_utf8(compact(doc)).unwrap(),
            r#"{"a":12.35,"b":0,"c":[1,2.5,0,1796209502],"s":"x 1.23456 \" 9.87654","n":-3}"#
        );
        assert_eq!(compact(b"not json 1.234567"), b"not json 1.23");
        let (f, p): (&[u8], &[u8]) = (b"first", b"prev");
        assert_eq!(dictionary_of(0, Some(f), Some(p)), None);
        assert_eq!(dictionary_of(1, Some(f), Some(p)), Some(p));
        assert_eq!(dictionary_of(KEY_EVERY, Some(f), Some(p)), Some(f));
        assert_eq!(dictionary_of(KEY_EVERY + 1, Some(f), Some(p)), Some(p));
    }
}
