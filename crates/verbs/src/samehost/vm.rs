//! `process_vm_readv`/`process_vm_writev`: moving bytes between this process and a
//! peer's registered memory, and the probe that says whether the kernel lets us.

use std::io;

/// The most local pieces one gathered or scattered copy takes.
pub(crate) const MAX_PIECES: usize = 32;

/// An iovec for `len` bytes at `addr` (in this process or the peer's).
fn iovec(addr: u64, len: usize) -> libc::iovec {
    libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: len,
    }
}

/// The iovecs of the local `pieces` (address, length) and their total length; EINVAL
/// for more than [`MAX_PIECES`].
fn piece_iovecs(pieces: &[(u64, usize)]) -> io::Result<([libc::iovec; MAX_PIECES], usize)> {
    if pieces.len() > MAX_PIECES {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let mut iov = [iovec(0, 0); MAX_PIECES];
    let mut total = 0usize;
    for (v, &(addr, len)) in iov.iter_mut().zip(pieces) {
        *v = iovec(addr, len);
        total += len;
    }
    Ok((iov, total))
}

/// What a `process_vm_*` call returned: the count copied, or the error it set.
fn copied(n: isize) -> io::Result<usize> {
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Copies `local` into `len = local.len()` bytes at `remote_addr` in process `pid`;
/// the count copied (short only on a fault part way).
pub fn write_to(pid: u32, remote_addr: u64, local: &[u8]) -> io::Result<usize> {
    write_gather(pid, remote_addr, &[(local.as_ptr() as u64, local.len())])
}

/// Local copies staged at most this long (a thread's staging buffer grows to it); a
/// longer one goes straight, at the short distance's price.
const STAGE_MAX: usize = 1 << 20;

thread_local! {
    /// The staging buffer of [`staged`] copies, and how many this thread made.
    static STAGE: std::cell::RefCell<(Vec<u8>, u64)> = const {
        std::cell::RefCell::new((Vec::new(), 0))
    };
}

/// Copies made on this thread through the staging buffer (for tests).
#[cfg(test)]
fn staged_copies() -> u64 {
    STAGE.with(|s| s.borrow().1)
}

/// Whether the kernel's copy between local `pieces` (address, length), taken in
/// order, and `len` bytes at `remote_addr` would meet a short distance (see
/// `softverbs_engine::copy`: its `rep movsb` runs 3-8x slower than at any other
/// distance here, session 18), `writing` from the pieces to the remote bytes or the
/// other way.
fn meets_short_distance(pieces: &[(u64, usize)], remote_addr: u64, writing: bool) -> bool {
    let mut at = remote_addr;
    pieces.iter().any(|&(addr, len)| {
        let (src, dst) = if writing { (addr, at) } else { (at, addr) };
        at = at.wrapping_add(len as u64);
        softverbs_engine::copy::goes_backward(src as usize, dst as usize, len)
    })
}

/// Runs `copy` with the address of a staging buffer of `len` bytes placed half a page
/// off `remote_addr`'s offset in a page, `None` for a copy longer than [`STAGE_MAX`].
/// Both copies through it are then far from the short distances: between it and the
/// remote bytes (2048), and between it and local pieces that sat 1-63 bytes from their
/// remote place (2049-2111 from them).
fn staged<R>(remote_addr: u64, len: usize, copy: impl FnOnce(u64) -> R) -> Option<R> {
    if len > STAGE_MAX {
        return None;
    }
    STAGE.with(|s| {
        let mut s = s.borrow_mut();
        let (buf, count) = &mut *s;
        if buf.len() < len + 4096 {
            buf.resize(len + 4096, 0);
        }
        let start = softverbs_engine::copy::bytes_to_page_offset(
            buf.as_ptr() as usize,
            remote_addr as usize + 2048,
        );
        *count += 1;
        Some(copy(buf[start..start + len].as_mut_ptr() as u64))
    })
}

/// Copies the local pieces `sources` into the local pieces `sinks`, both taken in order,
/// by the kernel (`process_vm_writev` to this process): a piece unmapped meanwhile is
/// EFAULT or a short count, never a fault in this process, as the copies to and from a
/// peer are. The count copied.
fn copy_within_self(sources: &[(u64, usize)], sinks: &[(u64, usize)]) -> io::Result<usize> {
    let (liov, _) = piece_iovecs(sources)?;
    let (riov, _) = piece_iovecs(sinks)?;
    crate::driver::note_syscall();
    // SAFETY: the kernel reads the source pieces and writes the sink pieces, all memory
    // of this process that the callers keep valid for the call (a staging buffer they
    // borrow, a caller's buffer, registered memory); were one unmapped anyway, the kernel
    // reports EFAULT or a short count.
    let n = unsafe {
        libc::process_vm_writev(
            libc::getpid(),
            liov.as_ptr(),
            sources.len() as libc::c_ulong,
            riov.as_ptr(),
            sinks.len() as libc::c_ulong,
            0,
        )
    };
    copied(n)
}

/// Copies the local pieces `sources` (address, length), in order, to `remote_addr` in
/// process `pid`; the count copied. The pieces are memory of this process the caller
/// keeps valid for the call: registered memory checked against its memory regions under
/// the device lock just before, or a caller's buffer (inline data, a stream's write).
pub fn write_gather(pid: u32, remote_addr: u64, sources: &[(u64, usize)]) -> io::Result<usize> {
    let total = sources.iter().map(|&(_, len)| len).sum();
    write_gather_to(pid, &[(remote_addr, total)], sources)
}

/// [`write_gather`] into several remote ranges `remotes` (address, length), filled in
/// order from the local pieces taken in order: the kernel copies range by range (a
/// stream's bytes first, then its "bytes placed" word, which so never lands before
/// them). The count copied (short on a fault part way: nothing after it was written).
///
/// Pieces a few bytes behind their remote place modulo 4096 are first gathered into a
/// staging buffer ([`meets_short_distance`], [`staged`]), by the kernel as well.
pub fn write_gather_to(
    pid: u32,
    remotes: &[(u64, usize)],
    sources: &[(u64, usize)],
) -> io::Result<usize> {
    let (_, total) = piece_iovecs(sources)?;
    let first = remotes.first().map_or(0, |r| r.0);
    if meets_short_distance(sources, first, true) {
        let staged = staged(first, total, |stage| {
            // (A piece that faulted part way: what was gathered before it goes on, as
            // the kernel's own gather would have sent it.)
            let gathered = copy_within_self(sources, &[(stage, total)])?;
            write_ranges(pid, remotes, &[(stage, gathered)])
        });
        if let Some(result) = staged {
            return result;
        }
    }
    write_ranges(pid, remotes, sources)
}

/// The `process_vm_writev` of [`write_gather_to`].
fn write_ranges(pid: u32, remotes: &[(u64, usize)], sources: &[(u64, usize)]) -> io::Result<usize> {
    let (liov, _) = piece_iovecs(sources)?;
    let (riov, _) = piece_iovecs(remotes)?;
    crate::driver::note_syscall();
    // SAFETY: the kernel only reads the local pieces (a caller's live buffer, or our
    // registered memory: were a piece deregistered and unmapped meanwhile by a racing
    // thread, the kernel reports EFAULT) and writes the remote ranges, each of which
    // the caller checked against the peer's published, fenced region table.
    let n = unsafe {
        libc::process_vm_writev(
            pid as libc::pid_t,
            liov.as_ptr(),
            sources.len() as libc::c_ulong,
            riov.as_ptr(),
            remotes.len() as libc::c_ulong,
            0,
        )
    };
    copied(n)
}

/// Copies `out.len()` bytes at `remote_addr` in process `pid` into `out`; the count
/// copied.
pub fn read_from(pid: u32, remote_addr: u64, out: &mut [u8]) -> io::Result<usize> {
    let liov = iovec(out.as_mut_ptr() as u64, out.len());
    let riov = iovec(remote_addr, out.len());
    crate::driver::note_syscall();
    // SAFETY: the local iovec covers `out`, a buffer we own exclusively, which the
    // kernel writes at most `out.len()` bytes of; the remote side is only read.
    let n = unsafe { libc::process_vm_readv(pid as libc::pid_t, &liov, 1, &riov, 1, 0) };
    copied(n)
}

/// Copies `total` bytes at `remote_addr` in process `pid` into the local pieces
/// `sinks` (address, length), in order; the count copied. The pieces are registered
/// memory of this process that allows local writes, checked against their memory
/// regions under the device lock just before (deregistration waits for this copy:
/// `SameHost::quiesce_local`).
///
/// Sinks a few bytes ahead of their remote place modulo 4096 are filled through a
/// staging buffer ([`meets_short_distance`], [`staged`]), by the kernel as well.
pub fn read_scatter(pid: u32, remote_addr: u64, sinks: &[(u64, usize)]) -> io::Result<usize> {
    let (_, total) = piece_iovecs(sinks)?;
    if meets_short_distance(sinks, remote_addr, false) {
        let staged = staged(remote_addr, total, |stage| {
            let n = read_ranges(pid, remote_addr, &[(stage, total)])?;
            copy_within_self(&[(stage, n)], sinks)
        });
        if let Some(result) = staged {
            return result;
        }
    }
    read_ranges(pid, remote_addr, sinks)
}

/// The `process_vm_readv` of [`read_scatter`].
fn read_ranges(pid: u32, remote_addr: u64, sinks: &[(u64, usize)]) -> io::Result<usize> {
    let (liov, total) = piece_iovecs(sinks)?;
    let riov = iovec(remote_addr, total);
    crate::driver::note_syscall();
    // SAFETY: the kernel writes the local pieces: registered memory of this process
    // whose regions allow local writes, which stay registered until the copy is over
    // (a deregistration waits for it); as a NIC's DMA, the bytes are written behind any
    // Rust reference the application may hold, which the registration allows. Were a
    // piece unmapped anyway, the kernel reports EFAULT. The remote range is only read,
    // and was checked against the peer's published, fenced region table.
    let n = unsafe {
        libc::process_vm_readv(
            pid as libc::pid_t,
            liov.as_ptr(),
            sinks.len() as libc::c_ulong,
            &riov,
            1,
            0,
        )
    };
    copied(n)
}

/// The probe: reads the 8-byte word at `addr` in `pid`. It succeeds only if `pid` is
/// a process of our PID namespace that the kernel lets us read (same user, Yama).
pub fn probe(pid: u32, addr: u64) -> io::Result<u64> {
    let mut w = [0u8; 8];
    let n = read_from(pid, addr, &mut w)?;
    if n != 8 {
        return Err(io::Error::from_raw_os_error(libc::EFAULT));
    }
    Ok(u64::from_ne_bytes(w))
}

/// Where Yama restricts ptrace to descendants (`ptrace_scope` 1), lets any process of
/// ours read this one's memory as a same-host peer must: `PR_SET_PTRACER_ANY`. Other
/// scopes need nothing (0) or cannot be helped (2, 3: the path is not used). Returns
/// whether the grant was made.
pub fn grant_ptrace_if_needed() -> bool {
    let scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok());
    if scope != Some(1) {
        return false;
    }
    // SAFETY: prctl with integer arguments only.
    let r = unsafe {
        libc::prctl(
            libc::PR_SET_PTRACER,
            libc::PR_SET_PTRACER_ANY as libc::c_ulong,
            0,
            0,
            0,
        )
    };
    r == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moves_bytes_in_our_own_process_and_refuses_a_missing_one() {
        let pid = std::process::id();
        let mut dst = vec![0u8; 100];
        let src: Vec<u8> = (0..100).collect();
        assert_eq!(write_to(pid, dst.as_mut_ptr() as u64, &src).unwrap(), 100);
        assert_eq!(dst, src);
        let mut back = vec![0u8; 100];
        assert_eq!(read_from(pid, dst.as_ptr() as u64, &mut back).unwrap(), 100);
        assert_eq!(back, src);
        let pieces = [(src.as_ptr() as u64 + 50, 50), (src.as_ptr() as u64, 50)];
        assert_eq!(
            write_gather(pid, dst.as_mut_ptr() as u64, &pieces).unwrap(),
            100
        );
        assert_eq!(&dst[..50], &src[50..]);
        assert_eq!(&dst[50..], &src[..50]);
        let mut a = vec![0u8; 30];
        let mut b = vec![0u8; 70];
        let sinks = [(a.as_mut_ptr() as u64, 30), (b.as_mut_ptr() as u64, 70)];
        assert_eq!(read_scatter(pid, src.as_ptr() as u64, &sinks).unwrap(), 100);
        assert_eq!((&a[..], &b[..]), (&src[..30], &src[30..]));
        // Two remote ranges filled in order from one gathered source.
        let mut far = vec![0u8; 20];
        let remotes = [
            (dst.as_mut_ptr() as u64, 90),
            (far.as_mut_ptr() as u64 + 4, 10),
        ];
        let pieces = [(src.as_ptr() as u64, 100)];
        assert_eq!(write_gather_to(pid, &remotes, &pieces).unwrap(), 100);
        assert_eq!((&dst[..90], &far[4..14]), (&src[..90], &src[90..]));
        let word = 0x1122_3344_5566_7788u64;
        // (The short distances' staging: `a_copy_a_few_bytes_off_a_page_is_staged`.)
        assert_eq!(probe(pid, &word as *const u64 as u64).unwrap(), word);
        // An unmapped address faults; a pid that does not exist is refused.
        assert!(probe(pid, 8).is_err());
        assert!(probe(i32::MAX as u32, &word as *const u64 as u64).is_err());
    }

    /// A buffer of `len` bytes at `offset` in a page, inside `backing`.
    fn at_offset(backing: &mut Vec<u8>, len: usize, offset: usize) -> *mut u8 {
        backing.resize(len + 8192, 0);
        let base = backing.as_mut_ptr() as usize;
        (base + softverbs_engine::copy::bytes_to_page_offset(base, offset)) as *mut u8
    }

    #[test]
    fn a_copy_a_few_bytes_off_a_page_is_staged() {
        let pid = std::process::id();
        let len = 64 << 10;
        let (mut a, mut b) = (Vec::new(), Vec::new());
        let src: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        for (src_offset, dst_offset, stages) in [
            (0, 16, true),
            (4076, 0, true),
            (100, 163, true),
            (16, 0, false),
            (0, 0, false),
            (0, 2048, false),
            (0, 64, false),
        ] {
            let from = at_offset(&mut a, len, src_offset);
            let to = at_offset(&mut b, len, dst_offset);
            // SAFETY: `from` and `to` each point at `len` bytes inside their own vector.
            unsafe {
                std::ptr::copy_nonoverlapping(src.as_ptr(), from, len);
                std::ptr::write_bytes(to, 0, len);
            }
            let before = staged_copies();
            let pieces = [(from as u64, 1000), (from as u64 + 1000, len - 1000)];
            assert_eq!(write_gather(pid, to as u64, &pieces).unwrap(), len);
            // SAFETY: as above.
            let written = unsafe { std::slice::from_raw_parts(to, len) };
            assert!(written == &src[..], "write {src_offset} -> {dst_offset}");
            assert_eq!(staged_copies() - before, u64::from(stages), "write staged");
            // Read it back the same way round: the sinks at the source's offsets.
            // SAFETY: as above.
            unsafe { std::ptr::write_bytes(from, 0, len) };
            let before = staged_copies();
            let sinks = [(from as u64, 3000), (from as u64 + 3000, len - 3000)];
            assert_eq!(read_scatter(pid, to as u64, &sinks).unwrap(), len);
            // SAFETY: as above.
            let read = unsafe { std::slice::from_raw_parts(from, len) };
            assert!(read == &src[..], "read {dst_offset} -> {src_offset}");
            let reads_short = (src_offset + 4096 - dst_offset) % 4096;
            assert_eq!(
                staged_copies() - before,
                u64::from((1..=63).contains(&reads_short)),
                "read staged"
            );
        }
    }

    /// A local piece that is not mapped, at a distance that stages: the kernel's EFAULT,
    /// as without the staging, not a fault in this process; both directions.
    #[test]
    fn a_staged_copy_of_unmapped_memory_is_an_error_not_a_crash() {
        let pid = std::process::id();
        let len = 8192;
        let mut b = Vec::new();
        let to = at_offset(&mut b, len, 16);
        let unmapped = 4096u64; // the page after the null page: never mapped
        assert!(meets_short_distance(&[(unmapped, len)], to as u64, true));
        let before = staged_copies();
        assert!(write_gather(pid, to as u64, &[(unmapped, len)]).is_err());
        assert!(meets_short_distance(
            &[(unmapped + 32, len)],
            to as u64,
            false
        ));
        assert!(read_scatter(pid, to as u64, &[(unmapped + 32, len)]).is_err());
        assert_eq!(
            staged_copies() - before,
            2,
            "both copies went through the stage"
        );
    }
}
