//! The one place where registered memory is touched.
//!
//! Registered memory belongs to the application: the engine reads and writes it on
//! behalf of the wire, the way a NIC does DMA. Every access goes through
//! [`MemorySpan`], whose methods check bounds before touching a byte, so the rest of
//! the engine is safe code.

use std::sync::atomic::{AtomicU64, Ordering};

/// A registered range of caller memory.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MemorySpan {
    addr: usize,
    len: usize,
}

// SAFETY: a span is a promise, made by the caller of `MemorySpan::new`, that the
// memory stays valid for reads and writes from any thread while it is registered;
// it carries no thread-affine state.
unsafe impl Send for MemorySpan {}

impl MemorySpan {
    /// # Safety
    /// `addr..addr + len` must be valid for reads and writes, from any thread, for as
    /// long as the span (or any copy of it) is used, i.e. until the memory region
    /// holding it is deregistered. Others may access the memory concurrently, as
    /// they may with memory a NIC is allowed to DMA into; the bytes they see are then
    /// unspecified, but no access leaves the range.
    pub unsafe fn new(addr: *mut u8, len: usize) -> Self {
        MemorySpan {
            addr: addr as usize,
            len,
        }
    }

    /// The first address.
    pub fn addr(&self) -> u64 {
        self.addr as u64
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Pointer to `offset`, if `offset..offset + n` lies inside the span.
    fn ptr(&self, offset: usize, n: usize) -> Option<*mut u8> {
        let end = offset.checked_add(n)?;
        if end > self.len {
            return None;
        }
        Some((self.addr + offset) as *mut u8)
    }

    /// Copies `out.len()` bytes starting at `offset` into `out`.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> bool {
        let Some(src) = self.ptr(offset, out.len()) else {
            return false;
        };
        // SAFETY: the range is inside the span (checked above), which `new`'s caller
        // promised valid for reads; `out` is a distinct Rust buffer, so they do not
        // overlap.
        unsafe { crate::copy::copy_bytes(src, out.as_mut_ptr(), out.len()) };
        true
    }

    /// Copies `data` into the span starting at `offset`.
    pub fn write(&self, offset: usize, data: &[u8]) -> bool {
        let Some(dst) = self.ptr(offset, data.len()) else {
            return false;
        };
        // SAFETY: the range is inside the span (checked above), valid for writes by
        // `new`'s contract; `data` is a Rust slice the engine owns or borrowed from a
        // received datagram, never registered memory, so they do not overlap.
        unsafe { crate::copy::copy_bytes(data.as_ptr(), dst, data.len()) };
        true
    }

    fn atomic(&self, offset: usize) -> Option<&AtomicU64> {
        let p = self.ptr(offset, 8)?;
        if p as usize % 8 != 0 {
            return None;
        }
        // SAFETY: `p` is 8-byte aligned and 8 bytes of it lie inside the span, valid
        // for reads and writes by `new`'s contract. Accessing it through an AtomicU64
        // makes concurrent remote atomics on the same word linearisable.
        Some(unsafe { AtomicU64::from_ptr(p as *mut u64) })
    }

    /// Atomic compare-and-swap of the aligned 64-bit word at `offset`; returns the
    /// value it held before. `None` when out of range or misaligned.
    pub fn compare_swap(&self, offset: usize, compare: u64, swap: u64) -> Option<u64> {
        let word = self.atomic(offset)?;
        Some(
            match word.compare_exchange(compare, swap, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(v) | Err(v) => v,
            },
        )
    }

    /// Atomic fetch-and-add on the aligned 64-bit word at `offset`; returns the value
    /// it held before.
    pub fn fetch_add(&self, offset: usize, add: u64) -> Option<u64> {
        Some(self.atomic(offset)?.fetch_add(add, Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_enforced() {
        let mut buf = vec![0u64; 4];
        // SAFETY: `buf` outlives `span` and is not otherwise used meanwhile.
        let span = unsafe { MemorySpan::new(buf.as_mut_ptr().cast(), 32) };
        assert!(span.write(30, &[1, 2]));
        assert!(!span.write(31, &[1, 2]));
        assert!(!span.write(usize::MAX, &[1]));
        let mut out = [0u8; 2];
        assert!(span.read(30, &mut out));
        assert_eq!(out, [1, 2]);
        assert!(!span.read(32, &mut out[..1]));
        assert_eq!(span.fetch_add(8, 5), Some(0));
        assert_eq!(span.compare_swap(8, 5, 9), Some(5));
        assert_eq!(span.compare_swap(8, 5, 1), Some(9));
        assert_eq!(span.fetch_add(4, 1), None, "misaligned");
        assert_eq!(span.fetch_add(32, 1), None, "out of range");
        let _ = span;
        assert_eq!(buf[1], 9);
    }
}
