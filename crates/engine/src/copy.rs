//! The byte copy every payload takes into and out of registered memory.
//!
//! A forward copy whose destination lies a few bytes past its source modulo 4096 runs
//! some twenty times slower on this project's measuring host (AMD EPYC with FSRM,
//! glibc 2.36, Linux 6.18): `memmove` of 64 KiB 1.2-2.4 GB/s against 26-39 GB/s at any
//! other distance, 4 KiB alike, 1 KiB not (below the size at which glibc turns to
//! `rep movsb`); `process_vm_writev`, whose kernel copy is `rep movsb` too, 1.0-2.1
//! against 5.2-8.3 GB/s (session 18, a sweep of the distance in steps of 4 bytes: slow
//! from 4 to 28 bytes, not at 0 or from 32 on). Each load then finds a store it has
//! just made with the same low 12 address bits and waits for it (4K aliasing); glibc
//! steps around the case on CPUs it marks for it, not on this one.
//!
//! Which distance a copy gets is decided by where the application's buffer and ours
//! sit in their pages: a receive buffer from the heap, a 4096-byte MTU, a page-aligned
//! memory region. In perftest over the drop-in the target's payload copies took about
//! three times as long as in `softverbs perf` for that reason alone (docs/udp-bandwidth.md,
//! session 18), and `softverbs perf write`'s requester met it in 1.5 % of its copies
//! into send buffers (469 of 32 023 in one run). So [`copy_bytes`]
//! copies those distances backwards, in 32-byte blocks: a load then only meets stores
//! to higher addresses, whose low bits differ (34 GB/s at a 16-byte distance where the
//! forward copy made 2.4).

/// The page size the distances are taken modulo (the low 12 address bits a load and a
/// store are compared by).
pub const PAGE: usize = 4096;

/// How many bytes past `addr` lies the first address at `offset` (modulo [`PAGE`]) in a
/// page: where a buffer starting at `addr` must be entered for its bytes to sit at a
/// chosen place in their pages.
pub fn bytes_to_page_offset(addr: usize, offset: usize) -> usize {
    (offset % PAGE + PAGE - addr % PAGE) % PAGE
}

/// The distances (destination minus source, modulo 4096) that [`copy_bytes`] copies
/// backwards. The slow ones measured are 4-28 bytes; the block loop costs nothing
/// beside them, so the range is taken wider than what was seen.
pub const SHORT_DISTANCES: std::ops::RangeInclusive<usize> = 1..=63;

/// Copies shorter than this go to the platform's copy whatever their distance: glibc
/// copies them with vector loads, which the distance slows much less.
pub const BACKWARD_FROM_LEN: usize = 512;

/// Whether a copy of `len` bytes from `src` to `dst` is one [`copy_bytes`] makes
/// backwards.
pub fn goes_backward(src: usize, dst: usize, len: usize) -> bool {
    len >= BACKWARD_FROM_LEN && SHORT_DISTANCES.contains(&(dst.wrapping_sub(src) % PAGE))
}

/// Copies `len` bytes from `src` to `dst`, as [`std::ptr::copy_nonoverlapping`] does,
/// but backwards where the two sit a few bytes apart modulo 4096 ([`goes_backward`]).
///
/// # Safety
/// As for [`std::ptr::copy_nonoverlapping`]: `src` valid for `len` bytes of reads,
/// `dst` for `len` bytes of writes, the two ranges not overlapping. Neither needs any
/// alignment.
#[inline]
pub unsafe fn copy_bytes(src: *const u8, dst: *mut u8, len: usize) {
    if goes_backward(src as usize, dst as usize, len) {
        // SAFETY: the caller's contract, passed on.
        unsafe { copy_backward(src, dst, len) }
    } else {
        // SAFETY: the caller's contract, passed on.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
    }
}

/// The block loop, from the end. (An ordinary loop the compiler keeps: it does not
/// turn a descending loop of unaligned block copies into a `memcpy` call, checked by
/// the speed measured in session 18. Never inlined, so that the loop every caller runs
/// is the one compiled here, which `benches/copy_distance.rs` measures.)
///
/// # Safety
/// As [`copy_bytes`].
#[inline(never)]
unsafe fn copy_backward(src: *const u8, dst: *mut u8, len: usize) {
    const BLOCK: usize = 32;
    let mut left = len;
    while left >= BLOCK {
        left -= BLOCK;
        // SAFETY: `left..left + BLOCK` lies inside both ranges, which the caller
        // promised valid and disjoint; the block types have alignment 1.
        unsafe {
            let block = std::ptr::read_unaligned(src.add(left).cast::<[u8; BLOCK]>());
            std::ptr::write_unaligned(dst.add(left).cast::<[u8; BLOCK]>(), block);
        }
    }
    // SAFETY: the first `left` bytes of both ranges, as above.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, left) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_long_copies_a_few_bytes_ahead_modulo_a_page_go_backward() {
        assert!(goes_backward(0, 16, 4096));
        assert!(
            goes_backward(4096 * 7 + 4076, 4096 * 9, 65536),
            "20 ahead across pages"
        );
        assert!(goes_backward(100, 100 + 63, 512));
        assert!(!goes_backward(100, 100 + 64, 65536));
        assert!(!goes_backward(0, 0, 65536), "same offset");
        assert!(!goes_backward(16, 0, 65536), "destination behind");
        assert!(!goes_backward(0, 16, 511), "short");
        assert!(!goes_backward(0, 2048, 65536));
    }

    #[test]
    fn the_bytes_to_a_page_offset_land_there() {
        for addr in [0usize, 1, 16, 4095, 4096, 123_456_789] {
            for offset in [0usize, 16, 2048, 4095, 4096 + 7] {
                let skip = bytes_to_page_offset(addr, offset);
                assert!(skip < PAGE);
                assert_eq!((addr + skip) % PAGE, offset % PAGE, "{addr} {offset}");
            }
        }
    }

    #[test]
    fn every_distance_and_length_copies_the_bytes() {
        let src: Vec<u8> = (0..20_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        let mut dst = vec![0u8; 20_000 + 4096 + 64];
        for len in [0, 1, 31, 32, 33, 511, 512, 513, 4095, 4096, 4100, 12_345] {
            for offset in [0, 1, 15, 16, 17, 31, 32, 63, 64, 2048, 4080] {
                let from = &src[3..3 + len];
                dst.fill(0xee);
                let start =
                    bytes_to_page_offset(dst.as_ptr() as usize, from.as_ptr() as usize + offset);
                // SAFETY: `from` holds `len` bytes; `dst[start..]` holds at least
                // `len` (start < 4096, dst is 4096 + 64 longer); distinct vectors.
                unsafe { copy_bytes(from.as_ptr(), dst[start..].as_mut_ptr(), len) };
                assert_eq!(
                    &dst[start..start + len],
                    from,
                    "len {len} distance {offset}"
                );
                assert!(dst[..start].iter().all(|&b| b == 0xee), "wrote before");
                assert!(dst[start + len..].iter().all(|&b| b == 0xee), "wrote after");
            }
        }
    }
}
