//! The memory-region table a device publishes for its same-host peers, in a shared
//! file they map read-only, and the fence that keeps them out of deregistered memory.
//!
//! # Layout
//!
//! A file of 64-bit little-endian words (`<stats dir>/<address>-<port>.mrt`, mode
//! 0600: only processes of the same user, the ones the kernel lets read our memory
//! anyway, can open it). Header words: magic, capacity, pid, `accessing`, nonce, the
//! bulk writer's CPU (`crate::sock::apart`: a hint, zero in tables of older builds). Then
//! [`SLOTS`] entries of [`ENTRY_WORDS`] words, entry `i` for the memory region whose
//! key has slot index `i` (key >> 8): seq (a seqlock: odd while the owner rewrites
//! the entry), rkey (0: empty), base, length, access flags, PD id, generation.
//! Regions whose slot index is past the table, and memory windows, are not
//! published: operations on them take the UDP path. Then [`QP_SLOTS`] words, word `i`
//! for the QP whose QPN has slot index `i` (its low 14 bits, unique among a device's
//! live QPs): zero, or the QP's acceptance of placed WRITEs (bit 63), its access flags
//! (bits 48-55), the QPN it is connected to (bits 24-47) and its own QPN (bits 0-23).
//! A peer completes a placed WRITE itself only while it reads there that the QP it is
//! connected to accepts them from it and allows remote writes (`engine/placed.rs`).
//!
//! # The deregistration fence, and why it is sound
//!
//! A requester moves bytes to or from a peer only inside an *access*: it makes its own
//! table's `accessing` word odd (SeqCst read-modify-write, then a SeqCst fence), reads
//! the peer's entry, checks it, moves the bytes, and makes `accessing` even again
//! (Release). Accesses of one device never overlap (the driver holds its placement
//! lock), so `accessing` is odd exactly while one is under way.
//!
//! Deregistration withdraws the entry (rkey 0, generation + 1), issues a SeqCst fence,
//! and then, for every peer that negotiated the path with this device (only those have
//! been told where the table is), reads the peer's `accessing` word and, if it is odd,
//! waits until it changes (or the peer process is gone). Only then is the region
//! removed from the engine and `ibv_dereg_mr` returns.
//!
//! This is the store-buffering (Dekker) pattern with SeqCst fences on both sides: the
//! owner stores (withdraw) then loads (`accessing`); the requester stores (`accessing`
//! odd) then loads (the entry). In every execution at least one of the two loads sees
//! the other side's store: either the requester sees the entry withdrawn and moves
//! nothing, or the owner sees the access under way and waits for its end. An access
//! that starts after the owner's load must see the withdrawal. So after the fence no
//! peer is moving bytes with the old entry, and none will. Shared memory between
//! processes is the same coherent memory the atomics' model describes.
//!
//! A peer has an access under way for the length of one `process_vm_writev`/`readv`;
//! a peer that died with its word odd is skipped (its pid no longer exists).

use softverbs_engine::AccessFlags;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, AtomicU64, Ordering};

/// Entries in a table: memory regions whose key's slot index is below this are
/// published.
pub const SLOTS: usize = 16384;
const HEADER_WORDS: usize = 8;
const ENTRY_WORDS: usize = 8;
/// QP words in a table (a QPN's slot index has 14 bits: the engine's QPN layout).
pub const QP_SLOTS: usize = 16384;
const QP_WORDS_AT: usize = HEADER_WORDS + SLOTS * ENTRY_WORDS;
const WORDS: usize = QP_WORDS_AT + QP_SLOTS;
const BYTES: usize = WORDS * 8;
/// Memory window keys have this bit set (the engine's `mw.rs`); windows are not
/// published.
const MW_KEY_BIT: u32 = 1 << 31;
const MAGIC: u64 = u64::from_le_bytes(*b"SVMRT\x002\x00");

// Header words.
const H_MAGIC: usize = 0;
const H_CAPACITY: usize = 1;
const H_PID: usize = 2;
const H_ACCESSING: usize = 3;
const H_NONCE: usize = 4;
const H_BULK_WRITER: usize = 5;

// Entry words.
const E_SEQ: usize = 0;
const E_RKEY: usize = 1;
const E_BASE: usize = 2;
const E_LEN: usize = 3;
const E_ACCESS: usize = 4;
const E_PD: usize = 5;
const E_GENERATION: usize = 6;

/// A shared mapping of a table file, seen as 64-bit atomic words.
struct Mapping {
    ptr: *mut AtomicU64,
}

// SAFETY: the mapping is plain shared memory accessed only through atomics; it is
// unmapped once, on drop.
unsafe impl Send for Mapping {}
// SAFETY: as above: every access is an atomic operation.
unsafe impl Sync for Mapping {}

impl Mapping {
    fn map(file: &File, writable: bool) -> io::Result<Mapping> {
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: a fresh shared mapping of `BYTES` bytes of an open file; the kernel
        // picks the address, so nothing of ours is replaced.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                BYTES,
                prot,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping { ptr: p.cast() })
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        assert!(i < WORDS);
        // SAFETY: `i` is inside the mapping (checked), which is page aligned and lives
        // as long as `self`; AtomicU64 has u64's layout. A read-only mapping is only
        // ever loaded from (only `OwnTable`, which maps writable, stores).
        unsafe { &*self.ptr.add(i) }
    }

    fn entry(&self, slot: usize, field: usize) -> &AtomicU64 {
        self.word(HEADER_WORDS + slot * ENTRY_WORDS + field)
    }

    fn qp_word(&self, qpn: u32) -> &AtomicU64 {
        self.word(QP_WORDS_AT + (qpn as usize & (QP_SLOTS - 1)))
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `map` mapped; no reference into it outlives self.
        unsafe { libc::munmap(self.ptr.cast(), BYTES) };
    }
}

/// One published memory region, as a peer reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// Its R_Key.
    pub rkey: u32,
    /// First address, in the owner's address space.
    pub base: u64,
    /// Length in bytes.
    pub len: u64,
    /// Access rights.
    pub access: AccessFlags,
    /// The owner's PD id ([`softverbs_engine::PdHandle::id`]).
    pub pd: u64,
    /// Bumped every time the slot is withdrawn.
    pub generation: u64,
}

/// Why the same-host path refused an access (it then takes the UDP path, whose
/// responder gives the status IBA defines).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The peer QP does not accept placed work from ours now, or does not enable
    /// the operation.
    #[error("the peer QP does not accept this operation by the same-host path now")]
    QpRefuses,
    /// No published region has this key (never published, withdrawn, or not
    /// publishable).
    #[error("no published region has this R_Key")]
    UnknownKey,
    /// The region belongs to another PD than the peer QP's.
    #[error("the region is in another protection domain")]
    WrongPd,
    /// The region lacks the access right.
    #[error("the region does not allow this access")]
    AccessDenied,
    /// The range is not inside the region.
    #[error("the range is outside the region")]
    OutOfBounds,
}

impl Entry {
    /// Checks an access of `len` bytes at `addr` needing `access`, by a QP in PD `pd`,
    /// in the order IBA 10.6.3.1 and the responder use: key, PD, access, bounds.
    pub fn check(
        &self,
        pd: u64,
        addr: u64,
        len: usize,
        access: AccessFlags,
    ) -> Result<(), Refusal> {
        if self.pd != pd {
            return Err(Refusal::WrongPd);
        }
        if !self.access.contains(access) {
            return Err(Refusal::AccessDenied);
        }
        let start = addr.checked_sub(self.base).ok_or(Refusal::OutOfBounds)?;
        let end = start.checked_add(len as u64).ok_or(Refusal::OutOfBounds)?;
        if end > self.len {
            return Err(Refusal::OutOfBounds);
        }
        Ok(())
    }
}

const QP_ACCEPTS: u64 = 1 << 63;
const QPN_MASK: u64 = 0xff_ffff;

/// A QP's word: it accepts placed WRITEs from `dest_qpn`, with `access`.
fn qp_word(qpn: u32, dest_qpn: u32, access: AccessFlags) -> u64 {
    QP_ACCEPTS
        | (u64::from(access.0 & 0xff) << 48)
        | ((u64::from(dest_qpn) & QPN_MASK) << 24)
        | (u64::from(qpn) & QPN_MASK)
}

fn slot_of(rkey: u32) -> Option<usize> {
    let slot = (rkey >> 8) as usize;
    (rkey & MW_KEY_BIT == 0 && rkey != 0 && slot < SLOTS).then_some(slot)
}

/// This device's own table: it publishes and withdraws regions, and marks its own
/// accesses to peers.
pub struct OwnTable {
    map: Mapping,
    path: PathBuf,
}

impl OwnTable {
    /// Creates (or replaces) the table file at `path`.
    pub fn create(path: &Path) -> io::Result<OwnTable> {
        use std::os::unix::fs::OpenOptionsExt;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let _ = std::fs::remove_file(path);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)?;
        file.set_len(BYTES as u64)?;
        let map = Mapping::map(&file, true)?;
        map.word(H_CAPACITY).store(SLOTS as u64, Ordering::Relaxed);
        map.word(H_PID)
            .store(u64::from(std::process::id()), Ordering::Relaxed);
        map.word(H_NONCE).store(random_nonce(), Ordering::Relaxed);
        map.word(H_MAGIC).store(MAGIC, Ordering::Release);
        Ok(OwnTable {
            map,
            path: path.to_path_buf(),
        })
    }

    /// Publishes where this process's bulk stream writer last ran
    /// (`crate::sock::apart`'s word): a hint for its peers, no fence.
    pub fn set_bulk_writer(&self, word: u64) {
        self.map.word(H_BULK_WRITER).store(word, Ordering::Relaxed);
    }

    /// Where the table file is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The address, in this process, of the nonce word, and its value: a peer that
    /// reads the same value there with `process_vm_readv` and in the file has proved
    /// that our pid is its pid for us, and that the kernel lets it read our memory.
    pub fn nonce(&self) -> (u64, u64) {
        let w = self.map.word(H_NONCE);
        (w as *const AtomicU64 as u64, w.load(Ordering::Relaxed))
    }

    /// Publishes a region; `false` if its key cannot be published (a memory window's,
    /// or a slot past the table).
    pub fn publish(&self, e: &Entry) -> bool {
        let Some(slot) = slot_of(e.rkey) else {
            return false;
        };
        self.write_entry(slot, |m| {
            m.entry(slot, E_BASE).store(e.base, Ordering::Relaxed);
            m.entry(slot, E_LEN).store(e.len, Ordering::Relaxed);
            m.entry(slot, E_ACCESS)
                .store(u64::from(e.access.0), Ordering::Relaxed);
            m.entry(slot, E_PD).store(e.pd, Ordering::Relaxed);
            m.entry(slot, E_RKEY)
                .store(u64::from(e.rkey), Ordering::Relaxed);
        });
        true
    }

    /// Withdraws the region with `rkey`, if published, and issues the owner's SeqCst
    /// fence (see the module comment). Call [`OwnTable::wait_for_peers`] next.
    pub fn withdraw(&self, rkey: u32) {
        if let Some(slot) = slot_of(rkey) {
            if self.map.entry(slot, E_RKEY).load(Ordering::Relaxed) == u64::from(rkey) {
                self.write_entry(slot, |m| {
                    m.entry(slot, E_RKEY).store(0, Ordering::Relaxed);
                    m.entry(slot, E_GENERATION).fetch_add(1, Ordering::Relaxed);
                });
            }
        }
        fence(Ordering::SeqCst);
    }

    /// Waits until none of `peers` is inside an access it may have begun before the
    /// last [`OwnTable::withdraw`]; returns how many had one under way.
    pub fn wait_for_peers<'a>(&self, peers: impl IntoIterator<Item = &'a PeerTable>) -> usize {
        let mut waited = 0;
        for p in peers {
            let v = p.map.word(H_ACCESSING).load(Ordering::SeqCst);
            if v % 2 == 0 {
                continue;
            }
            waited += 1;
            let mut spins = 0u32;
            while p.map.word(H_ACCESSING).load(Ordering::SeqCst) == v && p.alive() {
                spins += 1;
                if spins < 64 {
                    std::hint::spin_loop();
                } else {
                    std::thread::sleep(std::time::Duration::from_micros(20));
                }
            }
        }
        waited
    }

    /// Marks this device's access to a peer's memory (see the module comment): the
    /// access lasts while the guard lives. The caller makes sure accesses of this
    /// table never overlap.
    pub fn begin_access(&self) -> AccessGuard<'_> {
        let w = self.map.word(H_ACCESSING);
        w.fetch_add(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        AccessGuard(w)
    }

    /// Publishes that QP `qpn` accepts placed WRITEs from its peer `dest_qpn` with
    /// `access` (its qp_access_flags).
    pub fn publish_qp(&self, qpn: u32, dest_qpn: u32, access: AccessFlags) {
        self.map
            .qp_word(qpn)
            .store(qp_word(qpn, dest_qpn, access), Ordering::SeqCst);
    }

    /// Withdraws QP `qpn`'s acceptance (if its word is still its own).
    pub fn withdraw_qp(&self, qpn: u32) {
        let w = self.map.qp_word(qpn);
        let v = w.load(Ordering::Relaxed);
        if v & QPN_MASK == u64::from(qpn) & QPN_MASK {
            w.store(0, Ordering::SeqCst);
        }
    }

    /// Seqlock write of one entry (one writer per slot: the region holding the slot).
    fn write_entry(&self, slot: usize, f: impl FnOnce(&Mapping)) {
        let seq = self.map.entry(slot, E_SEQ);
        seq.fetch_add(1, Ordering::Relaxed);
        fence(Ordering::Release);
        f(&self.map);
        seq.fetch_add(1, Ordering::Release);
    }
}

impl Drop for OwnTable {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// An access to a peer's memory under way (see [`OwnTable::begin_access`]).
pub struct AccessGuard<'a>(&'a AtomicU64);

impl Drop for AccessGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::Release);
    }
}

/// A peer's table, mapped read-only.
pub struct PeerTable {
    map: Mapping,
    pid: u32,
}

/// Why a peer's table could not be used.
#[derive(Debug, thiserror::Error)]
pub enum OpenTableError {
    /// The file could not be opened or mapped.
    #[error("cannot map the peer's table: {0}")]
    Io(#[from] io::Error),
    /// The file is not a table of the peer that offered it.
    #[error("not a softverbs memory-region table of pid {0}")]
    NotTheirs(u32),
}

impl PeerTable {
    /// Maps the table at `path`, which must be `pid`'s.
    pub fn open(path: &Path, pid: u32) -> Result<PeerTable, OpenTableError> {
        let file = File::open(path)?;
        if file.metadata()?.len() < BYTES as u64 {
            return Err(OpenTableError::NotTheirs(pid));
        }
        let map = Mapping::map(&file, false)?;
        let ok = map.word(H_MAGIC).load(Ordering::Acquire) == MAGIC
            && map.word(H_CAPACITY).load(Ordering::Relaxed) == SLOTS as u64
            && map.word(H_PID).load(Ordering::Relaxed) == u64::from(pid);
        if !ok {
            return Err(OpenTableError::NotTheirs(pid));
        }
        Ok(PeerTable { map, pid })
    }

    /// The peer's pid.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The nonce the file holds (compare with what `process_vm_readv` finds).
    pub fn nonce(&self) -> u64 {
        self.map.word(H_NONCE).load(Ordering::Relaxed)
    }

    /// Where the peer's bulk stream writer last ran (`OwnTable::set_bulk_writer`; zero:
    /// never, or an older build).
    pub fn bulk_writer(&self) -> u64 {
        self.map.word(H_BULK_WRITER).load(Ordering::Relaxed)
    }

    /// Whether the peer process still exists.
    pub fn alive(&self) -> bool {
        // SAFETY: kill with signal 0 only checks that the process exists.
        let r = unsafe { libc::kill(self.pid as libc::pid_t, 0) };
        r == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
    }

    /// Whether the peer's QP `qpn` accepts placed WRITEs from our QP `from_qpn` and
    /// allows `access`.
    pub fn qp_accepts(&self, qpn: u32, from_qpn: u32, access: AccessFlags) -> bool {
        let v = self.map.qp_word(qpn).load(Ordering::SeqCst);
        v & QP_ACCEPTS != 0
            && v & QPN_MASK == u64::from(qpn) & QPN_MASK
            && (v >> 24) & QPN_MASK == u64::from(from_qpn) & QPN_MASK
            && AccessFlags(((v >> 48) & 0xff) as u32).contains(access)
    }

    /// The published region with `rkey` (a consistent snapshot of its entry).
    pub fn lookup(&self, rkey: u32) -> Result<Entry, Refusal> {
        let slot = slot_of(rkey).ok_or(Refusal::UnknownKey)?;
        for _ in 0..1000 {
            let seq = self.map.entry(slot, E_SEQ);
            let s1 = seq.load(Ordering::Acquire);
            if s1 % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let get = |f| self.map.entry(slot, f).load(Ordering::Relaxed);
            let e = Entry {
                rkey: get(E_RKEY) as u32,
                base: get(E_BASE),
                len: get(E_LEN),
                access: AccessFlags(get(E_ACCESS) as u32),
                pd: get(E_PD),
                generation: get(E_GENERATION),
            };
            fence(Ordering::Acquire);
            if seq.load(Ordering::Relaxed) != s1 {
                continue;
            }
            return if e.rkey == rkey && get(E_RKEY) != 0 {
                Ok(e)
            } else {
                Err(Refusal::UnknownKey)
            };
        }
        // The owner keeps rewriting the slot: treat as unknown (UDP path).
        Err(Refusal::UnknownKey)
    }
}

fn random_nonce() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: getrandom writes at most `b.len()` bytes into `b`.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n == 8 {
        u64::from_le_bytes(b)
    } else {
        // Good enough to tell files apart; the probe's strength is the pid check.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        (t.as_nanos() as u64) ^ (u64::from(std::process::id()) << 32) | 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    fn tmp(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("svmrt-{}-{name}", std::process::id()))
    }

    fn entry(rkey: u32) -> Entry {
        Entry {
            rkey,
            base: 0x1000,
            len: 4096,
            access: AccessFlags::REMOTE_WRITE,
            pd: 7,
            generation: 0,
        }
    }

    #[test]
    fn published_regions_are_checked_key_pd_access_bounds() {
        let own = OwnTable::create(&tmp("check")).unwrap();
        let peer = PeerTable::open(own.path(), std::process::id()).unwrap();
        assert_eq!(peer.nonce(), own.nonce().1);
        assert_eq!(peer.lookup(0x105), Err(Refusal::UnknownKey));
        assert!(own.publish(&entry(0x105)));
        let e = peer.lookup(0x105).unwrap();
        assert_eq!(e.check(7, 0x1000, 4096, AccessFlags::REMOTE_WRITE), Ok(()));
        assert_eq!(
            e.check(8, 0x1000, 1, AccessFlags::REMOTE_WRITE),
            Err(Refusal::WrongPd)
        );
        assert_eq!(
            e.check(7, 0x1000, 1, AccessFlags::REMOTE_READ),
            Err(Refusal::AccessDenied)
        );
        assert_eq!(
            e.check(7, 0x1001, 4096, AccessFlags::REMOTE_WRITE),
            Err(Refusal::OutOfBounds)
        );
        assert_eq!(
            e.check(7, 0xfff, 1, AccessFlags::REMOTE_WRITE),
            Err(Refusal::OutOfBounds)
        );
        assert_eq!(
            e.check(7, u64::MAX, 2, AccessFlags::REMOTE_WRITE),
            Err(Refusal::OutOfBounds)
        );
        // Another key byte for the same slot is another (dead) region.
        assert_eq!(peer.lookup(0x106), Err(Refusal::UnknownKey));
        own.withdraw(0x105);
        assert_eq!(peer.lookup(0x105), Err(Refusal::UnknownKey));
        // Memory window keys and slots past the table are never published.
        assert!(!own.publish(&entry(MW_KEY_BIT | 0x100)));
        assert!(!own.publish(&entry((SLOTS as u32) << 8)));
        // QP words: only the QP connected to ours, accepting, with the access.
        let w = AccessFlags::REMOTE_WRITE;
        assert!(!peer.qp_accepts(0x4002, 0x77, w));
        own.publish_qp(0x4002, 0x77, w | AccessFlags::REMOTE_READ);
        assert!(peer.qp_accepts(0x4002, 0x77, w));
        assert!(!peer.qp_accepts(0x4002, 0x78, w), "another peer QP");
        assert!(!peer.qp_accepts(0x8002, 0x77, w), "another QP in the slot");
        assert!(!peer.qp_accepts(0x4002, 0x77, AccessFlags::REMOTE_ATOMIC));
        own.withdraw_qp(0x8002); // not its word
        assert!(peer.qp_accepts(0x4002, 0x77, w));
        own.withdraw_qp(0x4002);
        assert!(!peer.qp_accepts(0x4002, 0x77, w));
        // A table is only accepted as the pid's that wrote it.
        assert!(PeerTable::open(own.path(), 1).is_err());
    }

    /// The fence: an owner withdrawing while a peer thread loops "begin access, look
    /// up, write a marker, end access" never sees a marker written after
    /// `wait_for_peers` returned.
    #[test]
    fn no_access_lands_after_the_fence() {
        let own_a = Arc::new(OwnTable::create(&tmp("fence-a")).unwrap());
        let own_b = Arc::new(OwnTable::create(&tmp("fence-b")).unwrap());
        let pid = std::process::id();
        let b_sees_a = Arc::new(PeerTable::open(own_a.path(), pid).unwrap());
        let a_sees_b = PeerTable::open(own_b.path(), pid).unwrap();
        let landed = Arc::new(AtomicU64::new(0));
        for round in 0..40u32 {
            let rkey = 0x100 | (round & 0xff);
            assert!(own_a.publish(&entry(rkey)));
            let stop = Arc::new(AtomicBool::new(false));
            let writer = {
                let (own_b, landed, stop) =
                    (Arc::clone(&own_b), Arc::clone(&landed), Arc::clone(&stop));
                let b_sees_a = Arc::clone(&b_sees_a);
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let _g = own_b.begin_access();
                        if b_sees_a.lookup(rkey).is_ok() {
                            // A copy takes a while: the window the fence must cover.
                            for _ in 0..5000 {
                                std::hint::spin_loop();
                            }
                            landed.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                })
            };
            std::thread::yield_now();
            own_a.withdraw(rkey);
            own_a.wait_for_peers([&a_sees_b]);
            let after = landed.load(Ordering::SeqCst);
            for _ in 0..50 {
                std::thread::yield_now();
            }
            assert_eq!(landed.load(Ordering::SeqCst), after, "round {round}");
            stop.store(true, Ordering::Relaxed);
            writer.join().unwrap();
        }
    }
}
