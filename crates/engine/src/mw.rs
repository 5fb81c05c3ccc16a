//! Memory windows (IBA 10.6.7): remote access rights to part of a memory
//! region, granted and revoked without re-registering.
//!
//! Key space. Windows live in their own table inside [`MrTable`], and their
//! rkeys share the region key space: a window key is
//! `MW_KEY_BIT | slot index << 8 | key byte`, a region key has bit 31 clear (the
//! region table keeps slot indices below 2^23). So one lookup,
//! [`MrTable::resolve_remote`], serves every rkey a peer sends, and a window key
//! never resolves as an lkey ([`MrTable::resolve`] only knows regions).
//!
//! A window is unbound when allocated; while unbound (or invalidated, or once
//! the region it was bound to is deregistered) every access through it is a
//! remote access error. A bind gives it a range `[addr, addr + length)` inside
//! a region and its own access rights, and a new key byte: type 1 windows get
//! one from [`crate::Engine::bind_mw`], type 2 windows the one the consumer
//! put in the bind work request. Type 2 windows are tied to the QP they were
//! bound through (IBA type 2B): only that QP's peer may use or remotely
//! invalidate them.

use crate::mr::{KeyError, MemRef, MrTable};
use crate::slab::RawHandle;
use crate::types::{AccessFlags, MrHandle, MwHandle, PdHandle, QpHandle};
use crate::wc::WcStatus;
use softverbs_wire::Rkey;

/// The bit that marks a key as a memory window's.
pub(crate) const MW_KEY_BIT: u32 = 1 << 31;

/// The rights a window can grant.
const MW_RIGHTS: AccessFlags = AccessFlags(
    AccessFlags::REMOTE_READ.0 | AccessFlags::REMOTE_WRITE.0 | AccessFlags::REMOTE_ATOMIC.0,
);

/// Memory window type (values as `enum ibv_mw_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MwType {
    /// Type 1: bound with [`crate::Engine::bind_mw`], which picks a new rkey; it
    /// may be rebound while bound and cannot be invalidated.
    Type1 = 1,
    /// Type 2: bound with a [`crate::SendOp::BindMw`] work request carrying the
    /// new rkey; invalidated by LOCAL_INV or a peer's SEND with Invalidate.
    Type2 = 2,
}

/// A memory window's handle and current rkey, as returned by `alloc_mw`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MwInfo {
    /// Handle for binding and deallocation.
    pub handle: MwHandle,
    /// Remote key (it changes on every bind).
    pub rkey: u32,
}

/// What a window is bound to (as `struct ibv_mw_bind_info`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MwBindInfo {
    /// The region; it must allow [`AccessFlags::MW_BIND`].
    pub mr: MrHandle,
    /// First address of the window, inside the region.
    pub addr: u64,
    /// Length in bytes (for type 1, 0 unbinds the window).
    pub length: u64,
    /// Rights the window grants: REMOTE_READ, REMOTE_WRITE, REMOTE_ATOMIC.
    pub access: AccessFlags,
}

/// Why [`crate::Engine::bind_mw`] posted nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BindMwError {
    /// The window does not exist.
    #[error("no such memory window")]
    UnknownMw,
    /// `bind_mw` binds type 1 windows; type 2 windows are bound by posting
    /// [`crate::SendOp::BindMw`].
    #[error("not a type 1 memory window")]
    WrongType,
    /// The work request could not be posted.
    #[error(transparent)]
    Post(#[from] crate::engine::PostError),
}

/// A bound window's extent.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Binding {
    mr: RawHandle,
    addr: u64,
    length: u64,
    access: AccessFlags,
    /// Type 2: the QP it was bound through.
    qp: Option<QpHandle>,
}

/// A memory window.
pub(crate) struct Mw {
    pub pd: PdHandle,
    pub kind: MwType,
    /// The low byte of the window's current rkey.
    key_byte: u8,
    /// Type 1: the key byte the latest `bind_mw` handed out (binds may be in
    /// flight on a send queue).
    issued_key_byte: u8,
    binding: Option<Binding>,
}

fn window_key(index: u32, key_byte: u8) -> u32 {
    MW_KEY_BIT | (index << 8) | u32::from(key_byte)
}

impl MrTable {
    /// A new unbound window; its handle and rkey.
    pub fn alloc_mw(&mut self, pd: PdHandle, kind: MwType) -> Option<(RawHandle, u32)> {
        let h = self.windows.insert(Mw {
            pd,
            kind,
            key_byte: 0,
            issued_key_byte: 0,
            binding: None,
        })?;
        // Start past every key the slot's previous window handed out, so none
        // of those names this window.
        let slot = h.index as usize;
        let key_byte = self
            .window_last_key
            .get(slot)
            .map_or(self.next_key_byte, |k| k.wrapping_add(1));
        if let Some(w) = self.windows.get_mut(h) {
            w.key_byte = key_byte;
            w.issued_key_byte = key_byte;
        }
        Some((h, window_key(h.index, key_byte)))
    }

    pub fn dealloc_mw(&mut self, h: RawHandle) -> Option<Mw> {
        let w = self.windows.remove(h)?;
        let slot = h.index as usize;
        if self.window_last_key.len() <= slot {
            self.window_last_key.resize(slot + 1, 0);
        }
        // Type 1 binds hand keys out ahead of the window's current one.
        let last = if w.kind == MwType::Type1 {
            w.issued_key_byte
        } else {
            w.key_byte
        };
        self.window_last_key[slot] = last;
        Some(w)
    }

    pub fn mw_type(&self, h: MwHandle) -> Option<MwType> {
        self.windows.get(h.0).map(|w| w.kind)
    }

    /// Type 1: the rkey the next bind of the window gets; it is reserved at once.
    pub fn issue_type1_key(&mut self, h: MwHandle) -> Option<u32> {
        let w = self.windows.get_mut(h.0)?;
        (w.kind == MwType::Type1).then_some(())?;
        w.issued_key_byte = w.issued_key_byte.wrapping_add(1);
        Some(window_key(h.0.index, w.issued_key_byte))
    }

    /// Executes a bind work request posted on `qp` (in `qp_pd`). The checks are
    /// IBA 10.6.7.2's (C10-72 to C10-75, o10-37.2.30, o10-37.2.40); any failure
    /// is MW_BIND_ERR and leaves the window as it was.
    pub fn bind_mw(
        &mut self,
        mw: MwHandle,
        rkey: Rkey,
        info: &MwBindInfo,
        qp: QpHandle,
        qp_pd: PdHandle,
    ) -> Result<(), WcStatus> {
        const ERR: WcStatus = WcStatus::MwBindErr;
        let w = self.windows.get(mw.0).ok_or(ERR)?;
        // The key names this window (only its low byte may change).
        if rkey.0 & !0xff != window_key(mw.0.index, 0) {
            return Err(ERR);
        }
        if w.pd != qp_pd {
            return Err(ERR);
        }
        let kind = w.kind;
        if kind == MwType::Type2 && (w.binding.is_some() || info.length == 0) {
            return Err(ERR);
        }
        let binding = if info.length == 0 {
            None // type 1: unbind
        } else {
            let mr = self.slab.get(info.mr.0).ok_or(ERR)?;
            if mr.invalidated || mr.pd != qp_pd || !mr.access.contains(AccessFlags::MW_BIND) {
                return Err(ERR);
            }
            // Remote write and atomic rights need a locally writable region.
            if info
                .access
                .intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
                && !mr.access.contains(AccessFlags::LOCAL_WRITE)
            {
                return Err(ERR);
            }
            let start = mr.span.addr();
            let end = start.checked_add(mr.span.len() as u64).ok_or(ERR)?;
            let wend = info.addr.checked_add(info.length).ok_or(ERR)?;
            if info.addr < start || wend > end {
                return Err(ERR);
            }
            Some(Binding {
                mr: info.mr.0,
                addr: info.addr,
                length: info.length,
                access: AccessFlags(info.access.0 & MW_RIGHTS.0),
                qp: (kind == MwType::Type2).then_some(qp),
            })
        };
        let w = self.windows.get_mut(mw.0).ok_or(ERR)?;
        w.key_byte = rkey.0 as u8;
        w.binding = binding;
        Ok(())
    }

    /// The window a key names, if the key is a window's and current.
    fn window_by_key(&self, key: u32) -> Option<(RawHandle, &Mw)> {
        if key & MW_KEY_BIT == 0 {
            return None;
        }
        let (h, w) = self.windows.get_by_index((key & !MW_KEY_BIT) >> 8)?;
        (u32::from(w.key_byte) == key & 0xff).then_some((h, w))
    }

    /// Executes LOCAL_INV of `rkey` posted on a QP in `qp_pd`: a bound type 2
    /// window becomes unbound, a region registered for remote invalidation
    /// becomes invalid. Anything else fails with LOC_QP_OP_ERR.
    pub fn local_invalidate(&mut self, rkey: Rkey, qp_pd: PdHandle) -> Result<(), WcStatus> {
        const ERR: WcStatus = WcStatus::LocQpOpErr;
        if rkey.0 & MW_KEY_BIT != 0 {
            let (h, w) = self.window_by_key(rkey.0).ok_or(ERR)?;
            if w.kind != MwType::Type2 || w.binding.is_none() || w.pd != qp_pd {
                return Err(ERR);
            }
            if let Some(w) = self.windows.get_mut(h) {
                w.binding = None;
            }
            return Ok(());
        }
        match self.by_key_mut(rkey.0) {
            Some(mr) if mr.remote_invalidate && mr.pd == qp_pd => {
                mr.invalidated = true;
                Ok(())
            }
            _ => Err(ERR),
        }
    }

    /// Whether a peer of `qp` (in `pd`) may invalidate `rkey` with SEND with
    /// Invalidate (IBA 9.4.4.1, 10.6.7.2.5): a region registered for remote
    /// invalidation, or a type 2 window bound through `qp`.
    pub fn may_invalidate_remotely(&mut self, rkey: u32, pd: PdHandle, qp: QpHandle) -> bool {
        if rkey & MW_KEY_BIT != 0 {
            return self.window_by_key(rkey).is_some_and(|(_, w)| {
                w.kind == MwType::Type2 && w.pd == pd && w.binding.is_some_and(|b| b.qp == Some(qp))
            });
        }
        self.by_key_mut(rkey)
            .is_some_and(|mr| mr.remote_invalidate && mr.pd == pd)
    }

    /// Carries out a SEND with Invalidate that [`Self::may_invalidate_remotely`]
    /// allowed.
    pub fn invalidate_remotely(&mut self, rkey: u32) {
        if rkey & MW_KEY_BIT != 0 {
            if let Some((h, _)) = self.window_by_key(rkey) {
                if let Some(w) = self.windows.get_mut(h) {
                    w.binding = None;
                }
            }
        } else if let Some(mr) = self.by_key_mut(rkey) {
            mr.invalidated = true;
        }
    }

    /// Resolves an rkey a peer of `qp` sent: a region's (as [`MrTable::resolve`])
    /// or a bound window's, whose range and rights stand in for the region's
    /// (IBA 10.6.7.3). Checks in the same order: key (the window is bound, its
    /// region still registered and, for type 2, bound through `qp`), PD, access,
    /// bounds.
    pub fn resolve_remote(
        &self,
        key: u32,
        pd: PdHandle,
        qp: QpHandle,
        addr: u64,
        len: usize,
        access: AccessFlags,
    ) -> Result<MemRef, KeyError> {
        if key & MW_KEY_BIT == 0 {
            return self.resolve(key, pd, addr, len, access);
        }
        let (_, w) = self.window_by_key(key).ok_or(KeyError::InvalidKey)?;
        let b = w.binding.ok_or(KeyError::InvalidKey)?;
        if b.qp.is_some_and(|q| q != qp) {
            return Err(KeyError::InvalidKey);
        }
        let mr = self.slab.get(b.mr).ok_or(KeyError::InvalidKey)?;
        if mr.invalidated {
            return Err(KeyError::InvalidKey);
        }
        if w.pd != pd {
            return Err(KeyError::WrongPd);
        }
        if !b.access.contains(access) {
            return Err(KeyError::AccessDenied);
        }
        let start = addr.checked_sub(b.addr).ok_or(KeyError::OutOfBounds)?;
        let end = start.checked_add(len as u64).ok_or(KeyError::OutOfBounds)?;
        if end > b.length {
            return Err(KeyError::OutOfBounds);
        }
        let offset = addr
            .checked_sub(mr.span.addr())
            .and_then(|o| usize::try_from(o).ok())
            .ok_or(KeyError::OutOfBounds)?;
        if offset.checked_add(len).is_none_or(|e| e > mr.span.len()) {
            return Err(KeyError::OutOfBounds);
        }
        Ok(MemRef {
            span: mr.span,
            offset,
            len,
        })
    }
}
