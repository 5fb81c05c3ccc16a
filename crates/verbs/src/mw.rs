//! Memory windows (IBA 10.6.7): remote access to a part of a registered region,
//! granted and revoked without re-registering it.

use crate::error::ResourceError;
use crate::pd::{Mr, Pd, PdInner, StableBuffer};
use crate::qp::Qp;
use softverbs_engine::{AccessFlags, BindMwError, MwBindInfo, MwHandle, MwType, Rkey, SendOp};
use std::sync::Arc;

/// A memory window. Type 1 windows are bound with [`Qp::bind_mw`]; type 2
/// windows by posting [`Mw::bind_op`] and unbound by [`Mw::local_inv_op`] or a
/// peer's SEND with Invalidate.
pub struct Mw {
    pd: Arc<PdInner>,
    handle: MwHandle,
    kind: MwType,
    /// The rkey the window had when allocated (type 2 binds pick new key bytes
    /// from it).
    initial_rkey: u32,
}

impl std::fmt::Debug for Mw {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mw")
            .field("kind", &self.kind)
            .field("rkey", &self.initial_rkey)
            .finish()
    }
}

impl Drop for Mw {
    fn drop(&mut self) {
        let _ = self.pd.ctx.read(|st| st.engine.dealloc_mw(self.handle));
    }
}

impl Pd {
    /// Allocates an unbound memory window.
    pub fn alloc_mw(&self, kind: MwType) -> Result<Mw, ResourceError> {
        let info = self
            .inner
            .ctx
            .read(|st| st.engine.alloc_mw(self.inner.pd, kind))??;
        Ok(Mw {
            pd: Arc::clone(&self.inner),
            handle: info.handle,
            kind,
            initial_rkey: info.rkey,
        })
    }
}

impl Mw {
    /// Type 1 or 2.
    pub fn kind(&self) -> MwType {
        self.kind
    }

    /// The rkey it was allocated with.
    pub fn initial_rkey(&self) -> u32 {
        self.initial_rkey
    }

    /// The engine handle.
    pub fn handle(&self) -> MwHandle {
        self.handle
    }

    /// A work request operation that binds this type 2 window to `len` bytes at
    /// `offset` of `mr` with `access`, under `rkey` (the caller picks its low
    /// byte, as `ibv_inc_rkey` does).
    pub fn bind_op<T: StableBuffer>(
        &self,
        mr: &Mr<T>,
        offset: usize,
        len: u64,
        access: AccessFlags,
        rkey: u32,
    ) -> SendOp {
        let info = MwBindInfo {
            mr: mr.handle(),
            addr: mr.addr() + offset as u64,
            length: len,
            access,
        };
        SendOp::BindMw {
            mw: self.handle,
            rkey: Rkey(rkey),
            info,
        }
    }

    /// A work request operation that invalidates `rkey` (a bound type 2 window).
    pub fn local_inv_op(rkey: u32) -> SendOp {
        SendOp::LocalInv { rkey: Rkey(rkey) }
    }
}

impl Qp {
    /// Binds a type 1 window to `len` bytes at `offset` of `mr` with `access`
    /// (IBA 10.6.7.2.1); returns the window's new rkey. The bind completes on
    /// the send queue in order, always signaled (WcOpcode::BindMw).
    pub fn bind_mw<T: StableBuffer>(
        &self,
        mw: &Mw,
        wr_id: u64,
        mr: &Mr<T>,
        offset: usize,
        len: u64,
        access: AccessFlags,
    ) -> Result<u32, BindMwError> {
        let info = MwBindInfo {
            mr: mr.handle(),
            addr: mr.addr() + offset as u64,
            length: len,
            access,
        };
        let flags = softverbs_engine::SendFlags::SIGNALED;
        self.with_engine(|engine, qp| engine.bind_mw(qp, mw.handle, wr_id, flags, info))?
            .map(|r| r.0)
    }

    /// Binds a type 1 window as described by `info` (a region from
    /// [`Pd::reg_mr_raw`](crate::Pd::reg_mr_raw), by [`RawMr::handle`](crate::RawMr::handle)),
    /// with the caller's `flags` (`ibv_bind_mw`: signaled or not); returns the window's new
    /// rkey. As [`Qp::bind_mw`] otherwise.
    pub fn bind_mw_raw(
        &self,
        mw: &Mw,
        wr_id: u64,
        flags: softverbs_engine::SendFlags,
        info: MwBindInfo,
    ) -> Result<u32, BindMwError> {
        self.with_engine(|engine, qp| engine.bind_mw(qp, mw.handle, wr_id, flags, info))?
            .map(|r| r.0)
    }
}
