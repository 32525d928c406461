//! Feature sections the parser does not decode the way vmscope needs them:
//! the BUILD_ID table (kept per path, in file order) and the command line.
//! Both are read from the raw section bytes with bounds checks.

use crate::layout::Endian;

/// `PERF_RECORD_MISC_BUILD_ID_SIZE`: byte 20 of the build-id field holds its length.
const MISC_BUILD_ID_SIZE: u16 = 1 << 15;
/// header (8) + pid (4) + build id field (24).
const BUILD_ID_EVENT_FIXED: usize = 36;

/// Decode a BUILD_ID section: one `build_id_event` per DSO perf saw hit.
/// Stops at the first malformed entry.
pub(crate) fn build_ids(s: &[u8], e: Endian) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut pos = 0usize;
    while let (Some(misc), Some(size)) = (e.u16(s, pos + 4), e.u16(s, pos + 6)) {
        let size = usize::from(size);
        let Some(entry) = s.get(pos..pos.saturating_add(size)) else {
            break;
        };
        if size < BUILD_ID_EVENT_FIXED {
            break;
        }
        let field = &entry[12..32];
        let len = if misc & MISC_BUILD_ID_SIZE != 0 {
            usize::from(entry[32]).min(20)
        } else {
            // Old perf did not record the length: drop trailing zero words.
            let mut len = 20;
            while len >= 4 && field[len - 4..len].iter().all(|&b| b == 0) {
                len -= 4;
            }
            len
        };
        let name = &entry[BUILD_ID_EVENT_FIXED..];
        let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
        if len > 0 && !name.is_empty() {
            out.push((
                String::from_utf8_lossy(name).into_owned(),
                field[..len].to_vec(),
            ));
        }
        pos += size;
    }
    out
}

/// Decode a `perf_header_string_list` (CMDLINE). `None` when malformed.
pub(crate) fn string_list(s: &[u8], e: Endian) -> Option<Vec<String>> {
    let n = e.u32(s, 0)? as usize;
    let mut pos = 4usize;
    let mut out = Vec::with_capacity(n.min(s.len() / 4));
    for _ in 0..n {
        let len = e.u32(s, pos)? as usize;
        let bytes = s.get(pos + 4..(pos + 4).checked_add(len)?)?;
        let bytes = &bytes[..bytes.iter().position(|&b| b == 0).unwrap_or(len)];
        out.push(String::from_utf8_lossy(bytes).into_owned());
        pos += 4 + len;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(misc: u16, id: &[u8], path: &str) -> Vec<u8> {
        let mut name = path.as_bytes().to_vec();
        name.resize((path.len() + 1).next_multiple_of(8), 0);
        let size = (BUILD_ID_EVENT_FIXED + name.len()) as u16;
        let mut v = Vec::new();
        v.extend_from_slice(&2u32.to_le_bytes());
        v.extend_from_slice(&misc.to_le_bytes());
        v.extend_from_slice(&size.to_le_bytes());
        v.extend_from_slice(&(-1i32).to_le_bytes());
        let mut field = [0u8; 24];
        field[..id.len()].copy_from_slice(id);
        field[20] = id.len() as u8;
        v.extend_from_slice(&field);
        v.extend_from_slice(&name);
        v
    }

    #[test]
    fn build_ids_with_and_without_size() {
        let mut s = entry(
            MISC_BUILD_ID_SIZE | 1,
            &[1, 2, 3, 4, 5, 6, 7, 8],
            "[kernel.kallsyms]",
        );
        s.extend(entry(2, &[9; 20], "/bin/dash"));
        s.extend_from_slice(&[1, 2, 3]); // garbage tail
        let v = build_ids(&s, Endian::Little);
        assert_eq!(v.len(), 2);
        assert_eq!(
            v[0],
            ("[kernel.kallsyms]".into(), vec![1, 2, 3, 4, 5, 6, 7, 8])
        );
        assert_eq!(v[1].1.len(), 20);
    }

    #[test]
    fn string_lists_are_bounded() {
        let mut s = 2u32.to_le_bytes().to_vec();
        for w in ["perf", "record"] {
            s.extend_from_slice(&8u32.to_le_bytes());
            let mut b = w.as_bytes().to_vec();
            b.resize(8, 0);
            s.extend(b);
        }
        assert_eq!(
            string_list(&s, Endian::Little).unwrap(),
            vec!["perf", "record"]
        );
        assert!(string_list(&u32::MAX.to_le_bytes(), Endian::Little).is_none());
    }
}
