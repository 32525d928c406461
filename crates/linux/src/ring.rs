//! One perf_event mmap ring buffer: mapping it, and draining the records
//! between `data_tail` and `data_head` (acquire on head, release on tail),
//! including records that wrap around the end of the data area.

use std::io;
use std::os::fd::RawFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use perf_event_open_sys::bindings::perf_event_mmap_page;

/// A mapped ring: one metadata page followed by `2^n` data pages.
pub(crate) struct Ring {
    base: NonNull<u8>,
    map_len: usize,
    data_offset: usize,
    data_size: usize,
}

// SAFETY: the mapping is owned by this value alone; the kernel is the only
// other writer and synchronizes through data_head/data_tail.
unsafe impl Send for Ring {}

impl Ring {
    /// Map `data_pages` (a power of two) data pages of the perf fd `fd`.
    pub(crate) fn map(fd: RawFd, data_pages: usize, page_size: usize) -> io::Result<Ring> {
        let map_len = (data_pages + 1) * page_size;
        // SAFETY: plain shared mapping of a perf fd; the result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = NonNull::new(p as *mut u8).ok_or_else(|| io::Error::other("mmap gave NULL"))?;
        let page = base.as_ptr() as *const perf_event_mmap_page;
        // SAFETY: the first page is the metadata page; these fields are
        // written once by the kernel before mmap returns.
        let (off, size) = unsafe {
            (
                std::ptr::read_volatile(std::ptr::addr_of!((*page).data_offset)),
                std::ptr::read_volatile(std::ptr::addr_of!((*page).data_size)),
            )
        };
        let expected = data_pages * page_size;
        // Kernels before 4.1 leave data_offset/data_size at 0.
        let (data_offset, data_size) = if size == 0 {
            (page_size, expected)
        } else {
            (off as usize, size as usize)
        };
        if data_offset + data_size > map_len || !data_size.is_power_of_two() {
            // SAFETY: unmapping what was just mapped.
            unsafe { libc::munmap(p, map_len) };
            return Err(io::Error::other(
                "kernel reported an inconsistent ring layout",
            ));
        }
        Ok(Ring {
            base,
            map_len,
            data_offset,
            data_size,
        })
    }

    fn page(&self) -> *mut perf_event_mmap_page {
        self.base.as_ptr() as *mut perf_event_mmap_page
    }

    /// True when the kernel has written records not yet drained.
    pub(crate) fn has_data(&self) -> bool {
        let (head, tail) = self.positions();
        head != tail
    }

    fn positions(&self) -> (u64, u64) {
        // SAFETY: data_head/data_tail are naturally aligned u64s in the
        // metadata page, shared with the kernel; access is atomic.
        unsafe {
            let head = AtomicU64::from_ptr(std::ptr::addr_of_mut!((*self.page()).data_head))
                .load(Ordering::Acquire);
            let tail = AtomicU64::from_ptr(std::ptr::addr_of_mut!((*self.page()).data_tail))
                .load(Ordering::Relaxed);
            (head, tail)
        }
    }

    /// Call `f` with every complete record (header included) now in the
    /// ring, then hand the space back to the kernel. Records that wrap are
    /// copied into `scratch`; the others are passed in place. Every slice is
    /// 8-byte aligned.
    pub(crate) fn drain(&mut self, scratch: &mut Vec<u64>, f: impl FnMut(&[u8])) {
        self.consume(|seg1, seg2| drain_segments(seg1, seg2, scratch, f));
    }

    /// Call `f` with the readable bytes as they are (whole records; two
    /// slices when they wrap the ring's end), then hand the space back to
    /// the kernel.
    pub(crate) fn drain_bytes(&mut self, mut f: impl FnMut(&[u8])) {
        self.consume(|seg1, seg2| {
            for seg in [seg1, seg2] {
                if !seg.is_empty() {
                    f(seg);
                }
            }
        });
    }

    /// Call `f` with the readable region (two slices where it wraps the
    /// ring's end), then hand it back to the kernel.
    fn consume(&mut self, f: impl FnOnce(&[u8], &[u8])) {
        let (head, tail) = self.positions();
        if head == tail {
            return;
        }
        let size = self.data_size as u64;
        // A head more than one ring ahead would be a kernel bug; clamp.
        let avail = head.wrapping_sub(tail).min(size) as usize;
        let start = (tail % size) as usize;
        let first = avail.min(self.data_size - start);
        // SAFETY: [tail, head) is owned by the reader until data_tail is
        // advanced past it; the kernel does not write there meanwhile.
        let (seg1, seg2) = unsafe {
            let data = self.base.as_ptr().add(self.data_offset);
            (
                std::slice::from_raw_parts(data.add(start), first),
                std::slice::from_raw_parts(data, avail - first),
            )
        };
        f(seg1, seg2);
        // SAFETY: as in positions(); release orders our reads before the
        // kernel may overwrite the space.
        unsafe {
            AtomicU64::from_ptr(std::ptr::addr_of_mut!((*self.page()).data_tail))
                .store(tail.wrapping_add(avail as u64), Ordering::Release);
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: unmapping our own mapping exactly once.
        unsafe { libc::munmap(self.base.as_ptr() as *mut libc::c_void, self.map_len) };
    }
}

/// View a u64 buffer as bytes.
pub(crate) fn as_bytes(v: &[u64]) -> &[u8] {
    // SAFETY: u8 has no invalid bit patterns and a smaller alignment.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, v.len() * 8) }
}

/// View a u64 buffer as bytes (always 8-byte aligned).
pub(crate) fn as_bytes_mut(v: &mut [u64]) -> &mut [u8] {
    // SAFETY: u8 has no invalid bit patterns and a smaller alignment.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, v.len() * 8) }
}

/// Walk the records of the readable bytes `seg1 ++ seg2` (the ring's
/// readable region, split where it wraps). A header with a size below 8 or
/// past the end stops the walk: the rest cannot be framed.
pub(crate) fn drain_segments(
    seg1: &[u8],
    seg2: &[u8],
    scratch: &mut Vec<u64>,
    mut f: impl FnMut(&[u8]),
) {
    let total = seg1.len() + seg2.len();
    let mut pos = 0usize;
    let byte_at = |i: usize| -> u8 {
        if i < seg1.len() {
            seg1[i]
        } else {
            seg2[i - seg1.len()]
        }
    };
    while pos + 8 <= total {
        let size = u16::from_ne_bytes([byte_at(pos + 6), byte_at(pos + 7)]) as usize;
        if size < 8 || pos + size > total {
            break;
        }
        if pos + size <= seg1.len() {
            f(&seg1[pos..pos + size]);
        } else if pos >= seg1.len() {
            let p = pos - seg1.len();
            f(&seg2[p..p + size]);
        } else {
            scratch.clear();
            scratch.resize(size.div_ceil(8), 0);
            let bytes = &mut as_bytes_mut(scratch)[..size];
            let head_len = seg1.len() - pos;
            bytes[..head_len].copy_from_slice(&seg1[pos..]);
            bytes[head_len..].copy_from_slice(&seg2[..size - head_len]);
            f(bytes);
        }
        pos += size;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(ty: u32, size: u16, fill: u8) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&ty.to_ne_bytes());
        v.extend_from_slice(&0u16.to_ne_bytes());
        v.extend_from_slice(&size.to_ne_bytes());
        v.resize((size as usize).max(8), fill);
        v
    }

    #[test]
    fn records_in_place_and_across_the_wrap() {
        let a = rec(9, 16, 0xaa);
        let b = rec(3, 24, 0xbb);
        let c = rec(7, 8, 0);
        // b straddles: 8 bytes in seg1, 16 in seg2.
        let mut seg1 = a.clone();
        seg1.extend_from_slice(&b[..8]);
        let mut seg2 = b[8..].to_vec();
        seg2.extend_from_slice(&c);
        let mut got = Vec::new();
        let mut scratch = Vec::new();
        drain_segments(&seg1, &seg2, &mut scratch, |r| got.push(r.to_vec()));
        assert_eq!(got, vec![a, b, c]);
    }

    #[test]
    fn header_split_by_the_wrap_and_truncated_tail() {
        let a = rec(9, 16, 0x11);
        let seg1 = a[..4].to_vec();
        let mut seg2 = a[4..].to_vec();
        // A truncated record at the end is left alone.
        seg2.extend_from_slice(&rec(9, 32, 0)[..12]);
        let mut got = Vec::new();
        drain_segments(&seg1, &seg2, &mut Vec::new(), |r| got.push(r.to_vec()));
        assert_eq!(got, vec![a]);
        // A zero size stops the walk instead of looping.
        let z = rec(9, 0, 0);
        let mut n = 0;
        drain_segments(&z, &[], &mut Vec::new(), |_| n += 1);
        assert_eq!(n, 0);
    }
}
