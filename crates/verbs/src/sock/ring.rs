//! [`RingMemory`]: the memory of a stream's receive ring, backed by transparent huge
//! pages where the kernel offers them.
//!
//! A same-host peer writes every message into the ring with `process_vm_writev`, and the
//! kernel pins the ring's pages for each call (`pin_user_pages_remote`): with 4 KiB pages
//! that is a page-table walk per page, 16 per 64 KiB message, which cost more than the
//! copy itself (`perf record` of `rstream -S 65536`: pinning 17 % of the writer's
//! process, the copy 10 %). A 2 MiB page is pinned with one walk per call, and the copy
//! takes fewer TLB misses. So a ring of at least [`HUGE_MIN`] bytes is its own anonymous
//! mapping, aligned to 2 MiB and rounded up to a multiple of it, advised `MADV_HUGEPAGE`
//! (the kernel's default THP mode is `madvise`,
//! `Documentation/admin-guide/mm/transhuge.rst`). Its pages are the kernel's zero pages
//! until written: a huge page is faulted in by the first write into its 2 MiB (the
//! peer's first `process_vm_writev` faults it in the same way), so a connection that
//! never moves data costs no memory. A smaller ring is a plain zeroed allocation. Without
//! THP the advice fails quietly and the ring is on 4 KiB pages.

use std::alloc::Layout;
use std::ptr::NonNull;

/// A transparent huge page on x86-64 and aarch64 with 4 KiB base pages.
pub(crate) const HUGE_PAGE: usize = 2 << 20;
/// Rings from this size up go on huge pages (the rounding wastes at most half).
pub(crate) const HUGE_MIN: usize = 1 << 20;
const PAGE: usize = 4096;

/// Zeroed memory for a receive ring of `len` bytes (see the module).
pub(crate) struct RingMemory {
    ptr: NonNull<u8>,
    len: usize,
    backing: Backing,
}

/// Where a ring's bytes live.
enum Backing {
    /// An anonymous mapping of this many bytes (2 MiB aligned), unmapped on drop.
    Mapped(usize),
    /// The global allocator's.
    Heap(Layout),
}

// SAFETY: the memory is owned exclusively and has no thread affinity.
unsafe impl Send for RingMemory {}
// SAFETY: a shared reference gives no access to the bytes (the `Mr` holding the ring
// reads them as it reads a `Vec<u8>`'s); it is as shareable as a `Vec<u8>`.
unsafe impl Sync for RingMemory {}

impl RingMemory {
    /// `len` zeroed bytes, on huge pages when `len >= HUGE_MIN` (where THP is available).
    pub(crate) fn new(len: usize) -> RingMemory {
        if len >= HUGE_MIN {
            let size = len.div_ceil(HUGE_PAGE) * HUGE_PAGE;
            if let Some(ptr) = map_aligned(size) {
                return RingMemory {
                    ptr,
                    len,
                    backing: Backing::Mapped(size),
                };
            }
        }
        let layout = Layout::from_size_align(len.max(1), PAGE).expect("ring size fits a layout");
        // SAFETY: the layout has nonzero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(p).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        RingMemory {
            ptr,
            len,
            backing: Backing::Heap(layout),
        }
    }

    /// Where the ring starts.
    #[cfg(test)]
    fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }
}

/// A private anonymous mapping of `size` bytes (a multiple of [`HUGE_PAGE`]) that starts
/// on a huge-page boundary, advised `MADV_HUGEPAGE`; `None` if the kernel refuses the
/// mapping (the caller falls back to the heap).
fn map_aligned(size: usize) -> Option<NonNull<u8>> {
    // One huge page more than asked for, so that an aligned start lies inside; the slop
    // before and after it is unmapped.
    let span = size.checked_add(HUGE_PAGE)?;
    // SAFETY: a fresh anonymous mapping at an address the kernel chooses; no existing
    // memory is touched.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            span,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return None;
    }
    let start = p as usize;
    let aligned = start.next_multiple_of(HUGE_PAGE);
    let (head, tail) = (aligned - start, span - (aligned - start) - size);
    // SAFETY: both ranges lie inside the mapping just made and outside the part kept.
    unsafe {
        if head > 0 {
            libc::munmap(p, head);
        }
        if tail > 0 {
            libc::munmap((aligned + size) as *mut libc::c_void, tail);
        }
    }
    // SAFETY: advice on the mapping kept; it changes no contents.
    if unsafe { libc::madvise(aligned as *mut libc::c_void, size, libc::MADV_HUGEPAGE) } != 0 {
        tracing::debug!(
            "rsocket ring: MADV_HUGEPAGE refused ({}), 4 KiB pages",
            std::io::Error::last_os_error()
        );
    }
    NonNull::new(aligned as *mut u8)
}

impl Drop for RingMemory {
    fn drop(&mut self) {
        match self.backing {
            // SAFETY: mapped in `new` with this size; nothing refers to it any more.
            Backing::Mapped(size) => unsafe {
                libc::munmap(self.ptr.as_ptr().cast(), size);
            },
            // SAFETY: allocated in `new` with this layout.
            Backing::Heap(layout) => unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) },
        }
    }
}

// SAFETY: the memory never moves and is only freed on drop; `len` is within it.
unsafe impl crate::pd::StableBuffer for RingMemory {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    fn len(&self) -> usize {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel's THP mode, the bracketed word of
    /// `/sys/kernel/mm/transparent_hugepage/enabled` (`None`: no THP).
    fn thp_mode() -> Option<String> {
        let s = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").ok()?;
        let start = s.find('[')? + 1;
        let end = s[start..].find(']')? + start;
        Some(s[start..end].to_string())
    }

    /// `AnonHugePages` (kB) of the mapping of this process that holds `addr`.
    fn anon_huge_kb(addr: usize) -> u64 {
        let smaps = std::fs::read_to_string("/proc/self/smaps").expect("smaps");
        let mut inside = false;
        for line in smaps.lines() {
            let first = line.split_whitespace().next().unwrap_or("");
            if let Some((lo, hi)) = first.split_once('-') {
                if let (Ok(lo), Ok(hi)) =
                    (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
                {
                    inside = (lo..hi).contains(&addr);
                    continue;
                }
            }
            if inside {
                if let Some(kb) = line.strip_prefix("AnonHugePages:") {
                    return kb.trim().trim_end_matches("kB").trim().parse().unwrap_or(0);
                }
            }
        }
        0
    }

    #[test]
    fn a_large_ring_lies_on_huge_pages() {
        match thp_mode().as_deref() {
            Some("always" | "madvise") => {}
            other => {
                eprintln!("skipped: transparent huge pages are {other:?}");
                return;
            }
        }
        // A huge page may be missing when memory is fragmented: one of a few rings will do.
        let mut rings: Vec<RingMemory> = (0..4).map(|_| RingMemory::new(HUGE_MIN)).collect();
        // Untouched, a ring holds no memory.
        let untouched: Vec<u64> = rings.iter().map(|r| anon_huge_kb(r.addr())).collect();
        assert_eq!(untouched, [0; 4]);
        for r in &mut rings {
            let p = crate::pd::StableBuffer::as_mut_ptr(r);
            // SAFETY: the ring owns at least one byte at `p`.
            unsafe { p.write(1) };
        }
        let huge: Vec<u64> = rings.iter().map(|r| anon_huge_kb(r.addr())).collect();
        for r in &rings {
            assert_eq!(r.addr() % HUGE_PAGE, 0);
            assert_eq!(crate::pd::StableBuffer::len(r), HUGE_MIN);
        }
        assert!(
            huge.iter().any(|&kb| kb >= (HUGE_PAGE / 1024) as u64),
            "AnonHugePages of the rings' mappings: {huge:?} kB"
        );
    }

    #[test]
    fn a_small_ring_is_neither_rounded_nor_dirty() {
        let mut r = RingMemory::new(128 << 10);
        assert!(matches!(r.backing, Backing::Heap(l) if l.size() == 128 << 10));
        assert_eq!(r.addr() % PAGE, 0);
        let p = crate::pd::StableBuffer::as_mut_ptr(&mut r);
        // SAFETY: the ring owns 128 KiB at `p`.
        let bytes = unsafe { std::slice::from_raw_parts(p, 128 << 10) };
        assert!(bytes.iter().all(|&b| b == 0));
    }
}
