//! Protection domains and memory regions: keys, access rights, bounds.

use crate::memory::MemorySpan;
use crate::slab::{RawHandle, Slab};
use crate::types::{AccessFlags, PdHandle};

/// A protection domain counts what uses it so it cannot be freed from under them.
pub(crate) struct Pd {
    pub users: u32,
}

/// A registered memory region.
pub(crate) struct Mr {
    pub pd: PdHandle,
    pub span: MemorySpan,
    pub access: AccessFlags,
    /// The low byte of lkey and rkey; it changes on every registration so that a key
    /// of a deregistered region never names the next region in the same slot.
    pub key_byte: u8,
    /// Whether a peer may invalidate the rkey with SEND with Invalidate (memory
    /// registered for remote invalidation, as fast-registered regions and type 2
    /// memory windows are).
    pub remote_invalidate: bool,
    /// Set once invalidated: the keys no longer resolve.
    pub invalidated: bool,
}

/// Why a key did not resolve to memory the caller may touch. Each maps to the
/// completion status or NAK the spec names for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyError {
    /// No region has this key, or it was invalidated.
    InvalidKey,
    /// The region belongs to another protection domain.
    WrongPd,
    /// The region lacks the access right.
    AccessDenied,
    /// The range is not inside the region.
    OutOfBounds,
}

/// A checked range of registered memory.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MemRef {
    pub span: MemorySpan,
    pub offset: usize,
    pub len: usize,
}

impl MemRef {
    pub fn read(&self, at: usize, out: &mut [u8]) -> bool {
        at + out.len() <= self.len && self.span.read(self.offset + at, out)
    }

    pub fn write(&self, at: usize, data: &[u8]) -> bool {
        at + data.len() <= self.len && self.span.write(self.offset + at, data)
    }

    /// Atomic compare and swap of the 8-byte word this reference covers.
    pub fn compare_swap(&self, compare: u64, swap: u64) -> Option<u64> {
        (self.len == 8).then_some(())?;
        self.span.compare_swap(self.offset, compare, swap)
    }

    /// Atomic fetch and add on the 8-byte word this reference covers.
    pub fn fetch_add(&self, add: u64) -> Option<u64> {
        (self.len == 8).then_some(())?;
        self.span.fetch_add(self.offset, add)
    }
}

/// The memory region table. Keys are `slot index << 8 | key byte`; slot 0 is
/// never used, so no key is 0 (which some applications treat as unset).
///
/// Memory windows share the key space: their keys have bit 31
/// ([`crate::mw::MW_KEY_BIT`]) set and index `windows`; region slot indices stay
/// below 2^23 so a region key never has it. See `mw.rs`.
pub(crate) struct MrTable {
    pub(crate) slab: Slab<Mr>,
    pub(crate) next_key_byte: u8,
    /// Memory windows (IBA 10.6.7).
    pub(crate) windows: Slab<crate::mw::Mw>,
    /// Per window slot: the last key byte its previous window handed out, so
    /// the next window there starts past it.
    pub(crate) window_last_key: Vec<u8>,
}

impl MrTable {
    pub fn new(limit: usize) -> Self {
        MrTable {
            slab: Slab::new(limit.min((1 << 23) - 1), 1),
            next_key_byte: 0,
            windows: Slab::new(limit.min((1 << 23) - 1), 1),
            window_last_key: Vec::new(),
        }
    }

    pub fn insert(&mut self, mut mr: Mr) -> Option<(RawHandle, u32)> {
        mr.key_byte = self.next_key_byte;
        self.next_key_byte = self.next_key_byte.wrapping_add(1);
        let key_byte = mr.key_byte;
        let h = self.slab.insert(mr)?;
        Some((h, (h.index << 8) | u32::from(key_byte)))
    }

    pub fn remove(&mut self, h: RawHandle) -> Option<Mr> {
        self.slab.remove(h)
    }

    /// The live region a key names.
    pub fn by_key_mut(&mut self, key: u32) -> Option<&mut Mr> {
        let (h, _) = self.slab.get_by_index(key >> 8)?;
        let mr = self.slab.get_mut(h)?;
        (u32::from(mr.key_byte) == key & 0xff && !mr.invalidated).then_some(mr)
    }

    /// Resolves `key` for `len` bytes at `addr` in `pd`, requiring `access`.
    /// Checks in the order IBA 10.6.3.1 and 9.7.5.1.x list: key, PD, access, bounds.
    pub fn resolve(
        &self,
        key: u32,
        pd: PdHandle,
        addr: u64,
        len: usize,
        access: AccessFlags,
    ) -> Result<MemRef, KeyError> {
        let (_, mr) = self
            .slab
            .get_by_index(key >> 8)
            .ok_or(KeyError::InvalidKey)?;
        if u32::from(mr.key_byte) != key & 0xff || mr.invalidated {
            return Err(KeyError::InvalidKey);
        }
        if mr.pd != pd {
            return Err(KeyError::WrongPd);
        }
        if !mr.access.contains(access) {
            return Err(KeyError::AccessDenied);
        }
        let start = addr
            .checked_sub(mr.span.addr())
            .ok_or(KeyError::OutOfBounds)?;
        let start = usize::try_from(start).map_err(|_| KeyError::OutOfBounds)?;
        let end = start.checked_add(len).ok_or(KeyError::OutOfBounds)?;
        if end > mr.span.len() {
            return Err(KeyError::OutOfBounds);
        }
        Ok(MemRef {
            span: mr.span,
            offset: start,
            len,
        })
    }
}
