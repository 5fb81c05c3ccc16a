//! Memory windows: the `alloc_mw`, `dealloc_mw` and `bind_mw` ops of `ibv_context.ops`
//! (reached through the header inlines `ibv_alloc_mw`, `ibv_dealloc_mw`, `ibv_bind_mw`), and
//! the translation of an `ibv_mw_bind_info` that `ibv_wr_bind_mw` (`crate::ex`) and
//! `IBV_WR_BIND_MW` share.
//!
//! Type 1 windows are bound with `ibv_bind_mw`, which picks the new rkey and stores it in
//! `mw->rkey`; type 2 windows are bound by a posted work request carrying the rkey the
//! application chose (`ibv_inc_rkey`), which, as with rdma-core's providers, leaves
//! `mw->rkey` to the application. A window holds its PD: `ibv_dealloc_pd` fails with EBUSY
//! while windows exist.
//!
//! Limitation: unbinding a type 1 window (`length` 0) needs the region in `bind_info.mr`;
//! with a NULL `mr` it fails with EOPNOTSUPP (the engine names a region in every bind).

use core::ffi::c_int;
use core::ptr;

use crate::abi::*;
use crate::stubs::ret_null;
use crate::verbs::{SoftMr, SoftPd, SoftQp};
use softverbs::{AccessFlags, MwBindInfo, MwHandle, MwType, Rkey, SendFlags, SendOp};

/// What an `ibv_mw *` points at.
#[repr(C)]
pub struct SoftMw {
    /// Must be first.
    pub mw: ibv_mw,
    /// The softverbs window.
    pub inner: softverbs::Mw,
}

/// The rights a window may grant (`IBV_ACCESS_REMOTE_{WRITE,READ,ATOMIC}`).
const MW_RIGHTS: u32 = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

/// Installs the memory-window ops on a new context.
pub(crate) fn install_mw_ops(ops: &mut ibv_context_ops) {
    ops.alloc_mw = Some(alloc_mw);
    ops.dealloc_mw = Some(dealloc_mw);
    ops.bind_mw = Some(bind_mw);
}

/// The engine's description of a bind.
///
/// # Safety
/// `info.mr` is NULL or a live MR of this library.
pub(crate) unsafe fn bind_info(info: &ibv_mw_bind_info) -> Result<MwBindInfo, c_int> {
    if info.mw_access_flags & IBV_ACCESS_ZERO_BASED != 0 {
        return Err(libc::EINVAL);
    }
    if info.mw_access_flags & !(MW_RIGHTS | IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND) != 0 {
        return Err(libc::EINVAL);
    }
    if info.mr.is_null() {
        return Err(if info.addr == 0 && info.length == 0 {
            libc::EOPNOTSUPP
        } else {
            libc::EINVAL
        });
    }
    // SAFETY: per the contract `info.mr` is the first field of a live `SoftMr`.
    let mr = unsafe { &(*info.mr.cast::<SoftMr>()).inner };
    Ok(MwBindInfo {
        mr: mr.handle(),
        addr: info.addr,
        length: info.length,
        access: AccessFlags(info.mw_access_flags & MW_RIGHTS),
    })
}

/// The window behind `mw`: handle and type.
///
/// # Safety
/// `mw` is NULL or from `alloc_mw` and not deallocated.
unsafe fn window(mw: *mut ibv_mw) -> Option<(MwHandle, MwType)> {
    // SAFETY: per the contract `mw` is the first field of a live `SoftMw`.
    (!mw.is_null()).then(|| unsafe {
        let m = &(*mw.cast::<SoftMw>()).inner;
        (m.handle(), m.kind())
    })
}

/// The operation of a type 2 bind work request (`ibv_wr_bind_mw`, `IBV_WR_BIND_MW`):
/// `mw` bound as `info` says under the new `rkey`. EINVAL for a type 1 window (those are
/// bound with `ibv_bind_mw`), a NULL window, or an invalid `info`.
///
/// # Safety
/// `mw` NULL or from `alloc_mw`; `info` NULL or valid, its MR NULL or live.
pub(crate) unsafe fn bind_op(
    mw: *mut ibv_mw,
    rkey: u32,
    info: *const ibv_mw_bind_info,
) -> Result<SendOp, c_int> {
    // SAFETY: per the contract.
    let Some((handle, kind)) = (unsafe { window(mw) }) else {
        return Err(libc::EINVAL);
    };
    if kind != MwType::Type2 || info.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: `info` is valid per the contract.
    let info = unsafe { bind_info(&*info) }?;
    Ok(SendOp::BindMw {
        mw: handle,
        rkey: Rkey(rkey),
        info,
    })
}

/// The `alloc_mw` op (`ibv_alloc_mw`).
unsafe extern "C" fn alloc_mw(pd: *mut ibv_pd, ty: c_int) -> *mut ibv_mw {
    let kind = match ty {
        IBV_MW_TYPE_1 => MwType::Type1,
        IBV_MW_TYPE_2 => MwType::Type2,
        _ => {
            return ret_null(libc::EINVAL);
        }
    };
    if pd.is_null() {
        return ret_null(libc::EINVAL);
    }
    // SAFETY: the inline passes a PD of this library: the first field of a live `SoftPd`.
    let p = unsafe { &*pd.cast::<SoftPd>() };
    let inner = match p.inner.alloc_mw(kind) {
        Ok(m) => m,
        Err(_) => {
            return ret_null(libc::ENOMEM);
        }
    };
    let mut mw = ibv_mw::zeroed();
    mw.context = p.pd.context;
    mw.pd = pd;
    mw.rkey = inner.initial_rkey();
    mw.handle = inner.initial_rkey();
    mw.type_ = ty;
    Box::into_raw(Box::new(SoftMw { mw, inner })).cast()
}

/// The `dealloc_mw` op (`ibv_dealloc_mw`): the window's rkey stops working at once.
unsafe extern "C" fn dealloc_mw(mw: *mut ibv_mw) -> c_int {
    if mw.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: `mw` came from Box::into_raw in `alloc_mw` and is freed once.
    drop(unsafe { Box::from_raw(mw.cast::<SoftMw>()) });
    0
}

/// The `bind_mw` op (`ibv_bind_mw`, type 1 windows): posts the bind on `qp` and stores the
/// window's new rkey in `mw->rkey`.
unsafe extern "C" fn bind_mw(qp: *mut ibv_qp, mw: *mut ibv_mw, bind: *mut ibv_mw_bind) -> c_int {
    if qp.is_null() || mw.is_null() || bind.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: the inline passes live objects of this library and a valid `ibv_mw_bind`.
    let (q, m, b) = unsafe {
        (
            &(*qp.cast::<SoftQp>()).inner,
            &(*mw.cast::<SoftMw>()).inner,
            &*bind,
        )
    };
    if m.kind() != MwType::Type1 {
        return libc::EINVAL;
    }
    // SAFETY: `bind_info.mr` is NULL or a live MR (verbs contract).
    let info = match unsafe { bind_info(&b.bind_info) } {
        Ok(i) => i,
        Err(e) => return e,
    };
    match q.bind_mw_raw(m, b.wr_id, SendFlags(b.send_flags & 0x7), info) {
        Ok(rkey) => {
            // SAFETY: `mw` is live; C reads `rkey` directly and no Rust reference to the
            // `ibv_mw` exists (only to the window behind it).
            unsafe { ptr::addr_of_mut!((*mw).rkey).write(rkey) };
            0
        }
        Err(softverbs::BindMwError::Post(softverbs::error::PostError::QueueFull)) => libc::ENOMEM,
        Err(_) => libc::EINVAL,
    }
}
