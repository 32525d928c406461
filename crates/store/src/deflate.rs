//! Deflate with a preset dictionary, and its inverse bounded: how the
//! flight recorder keeps what repeats from one interval to the next small
//! (its `top` documents, `vmscope_history::frames`, and its blocks of
//! profile rows, crate::blocks). The dictionary is the item before: the
//! reader must hold it to inflate.

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

thread_local! {
    /// One compressor per thread, reset for each document: a new one
    /// allocates and zeroes its window and tables (about 256 KiB), which
    /// was a fifth of the recorder's deflate time every interval.
    static COMPRESS: std::cell::RefCell<Compress> =
        std::cell::RefCell::new(Compress::new(Compression::default(), false));
}

/// `doc` deflated (raw deflate), with `dict` as the preset dictionary.
pub fn deflate(doc: &[u8], dict: Option<&[u8]>) -> std::io::Result<Vec<u8>> {
    COMPRESS.with(|c| {
        let mut c = c.borrow_mut();
        c.reset();
        deflate_with(&mut c, doc, dict)
    })
}

fn deflate_with(c: &mut Compress, doc: &[u8], dict: Option<&[u8]>) -> std::io::Result<Vec<u8>> {
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
