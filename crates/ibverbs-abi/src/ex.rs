//! Extended QPs: the `create_qp_ex` op (reached through the header inline
//! `ibv_create_qp_ex`), `ibv_qp_to_qp_ex`, and the `ibv_qp_ex` post-send API (`ibv_wr_*`,
//! header inlines jumping through the `ibv_qp_ex` ops).
//!
//! Every QP is a [`SoftQp`] whose first field is an `ibv_qp_ex`. As in rdma-core, the `wr_*`
//! ops are set, and `ibv_qp_to_qp_ex` returns the `ibv_qp_ex`, only for QPs created by
//! `create_qp_ex` with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`; for others it returns NULL.
//! (`ibv_qp_ex.comp_mask` stays 0, as rdma-core providers leave it.)
//!
//! # Semantics (as rdma-core's mlx5 provider)
//!
//! - The application writes `qpx->wr_id` and `qpx->wr_flags` before each builder
//!   (`wr_send`, `wr_rdma_write`, ...), which starts a new work request; the setters
//!   (`wr_set_sge*`, `wr_set_inline_data*`, `wr_set_ud_addr`) complete the latest one.
//!   Inline data is copied when set, so the caller's buffer may be reused at once.
//! - Work requests between `wr_start` and `wr_complete` are batched; `wr_complete` posts them
//!   all, `wr_abort` discards them.
//! - At creation, `send_ops_flags` outside what the QP type supports fail with EOPNOTSUPP.
//!   Like mlx5, every builder the QP type supports works afterwards, whether or not its flag
//!   was requested. Every pointer is set; what the QP type cannot do (RDMA READ on UC,
//!   `wr_set_ud_addr` on RC/UC, TSO, XRC, atomic write) records EOPNOTSUPP.
//! - Errors: a builder or setter that fails (unsupported op, setter without a work request,
//!   a builder outside `wr_start`) records its errno; `wr_complete` then posts **nothing** of
//!   the batch and returns the first recorded errno (mlx5 rolls the whole batch back the same
//!   way). Errors the engine finds while posting (queue full: ENOMEM; anything else it
//!   rejects: EINVAL) leave the work requests before the failing one posted and that one
//!   and all after it not posted; `wr_complete` returns the errno.

use core::ffi::{c_int, c_uint, c_void};
use core::ptr;
use std::sync::{Mutex, MutexGuard};

use crate::abi::*;
use crate::stubs::{ret_null, set_errno};
use crate::verbs::{create_qp_common, post_errno, SoftQp};
use softverbs::{Payload, Rkey, SendFlags, SendOp, SendWr, Sge};

/// `IBV_QP_CREATE_*` flags accepted in `create_flags`: none.
const SUPPORTED_CREATE_FLAGS: u32 = 0;

/// The `comp_mask` bits `create_qp_ex` accepts.
const SUPPORTED_INIT_ATTR_MASK: u32 =
    IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;

const RC_OPS: u64 = IBV_QP_EX_WITH_SEND
    | IBV_QP_EX_WITH_SEND_WITH_INV
    | IBV_QP_EX_WITH_SEND_WITH_IMM
    | IBV_QP_EX_WITH_RDMA_WRITE
    | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
    | IBV_QP_EX_WITH_RDMA_READ
    | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
    | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD
    | IBV_QP_EX_WITH_LOCAL_INV
    | IBV_QP_EX_WITH_BIND_MW;
const UC_OPS: u64 = IBV_QP_EX_WITH_SEND
    | IBV_QP_EX_WITH_SEND_WITH_INV
    | IBV_QP_EX_WITH_SEND_WITH_IMM
    | IBV_QP_EX_WITH_RDMA_WRITE
    | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
    | IBV_QP_EX_WITH_LOCAL_INV
    | IBV_QP_EX_WITH_BIND_MW;
const UD_OPS: u64 = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
const ATOMIC_OPS: u64 = IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;

/// The `send_ops_flags` a QP type supports (as mlx5: the same sets per type).
fn supported_ops(qp_type: c_int) -> u64 {
    match qp_type {
        IBV_QPT_RC => RC_OPS,
        IBV_QPT_UC => UC_OPS,
        IBV_QPT_UD => UD_OPS,
        _ => 0,
    }
}

/// The `IBV_QP_EX_WITH_*` flag of an operation, to check it against the QP type.
fn op_flag(op: &SendOp) -> u64 {
    match op {
        SendOp::Send => IBV_QP_EX_WITH_SEND,
        SendOp::SendWithImm { .. } => IBV_QP_EX_WITH_SEND_WITH_IMM,
        SendOp::SendWithInv { .. } => IBV_QP_EX_WITH_SEND_WITH_INV,
        SendOp::RdmaWrite { .. } => IBV_QP_EX_WITH_RDMA_WRITE,
        SendOp::RdmaWriteWithImm { .. } => IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM,
        SendOp::RdmaRead { .. } => IBV_QP_EX_WITH_RDMA_READ,
        SendOp::AtomicCmpSwap { .. } => IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP,
        SendOp::AtomicFetchAdd { .. } => IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD,
        SendOp::LocalInv { .. } => IBV_QP_EX_WITH_LOCAL_INV,
        SendOp::BindMw { .. } => IBV_QP_EX_WITH_BIND_MW,
        SendOp::UdSend { .. } => IBV_QP_EX_WITH_SEND,
    }
}

/// Where a pending work request's data is, in its batch's buffers.
#[derive(Clone, Copy)]
enum Data {
    None,
    /// `batch.sges[start..start + len]`
    Sges(usize, usize),
    /// `batch.inline[start..start + len]`
    Inline(usize, usize),
}

/// The destination a UD work request got from `wr_set_ud_addr`.
#[derive(Clone, Copy)]
struct UdAddr {
    ah: *mut ibv_ah,
    remote_qpn: u32,
    remote_qkey: u32,
}

/// One work request built since `wr_start`.
#[derive(Clone, Copy)]
struct Pending {
    wr_id: u64,
    flags: c_uint,
    /// As the builder recorded it; on UD QPs a `Send`/`SendWithImm` becomes a UD send to
    /// the `wr_set_ud_addr` destination at `wr_complete`.
    op: SendOp,
    data: Data,
    ud: Option<UdAddr>,
}

/// The batch between `wr_start` and `wr_complete`/`wr_abort`. The buffers keep their
/// capacity from batch to batch.
#[derive(Default)]
struct Batch {
    started: bool,
    /// The first errno a builder or setter recorded (0: none).
    err: c_int,
    wrs: Vec<Pending>,
    sges: Vec<Sge>,
    inline: Vec<u8>,
}

impl Batch {
    fn fail(&mut self, e: c_int) {
        if self.err == 0 {
            self.err = e;
        }
    }

    fn clear(&mut self) {
        self.started = false;
        self.err = 0;
        self.wrs.clear();
        self.sges.clear();
        self.inline.clear();
    }

    /// The latest work request, for a setter (records EINVAL when there is none).
    fn last(&mut self) -> Option<&mut Pending> {
        if self.wrs.is_empty() {
            self.fail(libc::EINVAL);
        }
        self.wrs.last_mut()
    }
}

// SAFETY: the only non-Send field is the `ibv_ah` pointer a UD work request carries; it is
// plain data here, dereferenced only by `ud_send_op` on the thread posting the batch, and
// the application keeps the AH alive while work requests use it (verbs contract).
unsafe impl Send for Batch {}

/// The `ibv_qp_ex` post-send state of a QP.
pub struct WrState {
    /// The `send_ops_flags` of a QP created through `create_qp_ex` with
    /// `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`; None otherwise.
    send_ops: Option<u64>,
    /// The batch. A mutex, although verbs has the application serialise `wr_start` ..
    /// `wr_complete` per QP, so that misuse cannot be a data race.
    batch: Mutex<Batch>,
    /// The QP's `max_send_sge`: `wr_set_sge_list` checks `num_sge` before reading the list.
    max_sge: u32,
}

impl WrState {
    /// State for a QP created with `send_ops` (None: not through the `ibv_qp_ex` API) and
    /// `max_sge` SGEs per work request.
    pub fn new(send_ops: Option<u64>, max_sge: u32) -> WrState {
        WrState {
            send_ops,
            batch: Mutex::new(Batch::default()),
            max_sge,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Batch> {
        self.batch.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Sets the `wr_*` ops of a new QP created with `send_ops_flags` (already checked against
/// its type). Every pointer is set: what the type cannot do records EOPNOTSUPP.
pub(crate) fn install_qp_ex_ops(qp: &mut ibv_qp_ex) {
    qp.wr_atomic_cmp_swp = Some(wr_atomic_cmp_swp);
    qp.wr_atomic_fetch_add = Some(wr_atomic_fetch_add);
    qp.wr_bind_mw = Some(wr_bind_mw);
    qp.wr_local_inv = Some(wr_local_inv);
    qp.wr_rdma_read = Some(wr_rdma_read);
    qp.wr_rdma_write = Some(wr_rdma_write);
    qp.wr_rdma_write_imm = Some(wr_rdma_write_imm);
    qp.wr_send = Some(wr_send);
    qp.wr_send_imm = Some(wr_send_imm);
    qp.wr_send_inv = Some(wr_send_inv);
    qp.wr_send_tso = Some(wr_send_tso);
    qp.wr_set_ud_addr = Some(wr_set_ud_addr);
    qp.wr_set_xrc_srqn = Some(wr_set_xrc_srqn);
    qp.wr_set_inline_data = Some(wr_set_inline_data);
    qp.wr_set_inline_data_list = Some(wr_set_inline_data_list);
    qp.wr_set_sge = Some(wr_set_sge);
    qp.wr_set_sge_list = Some(wr_set_sge_list);
    qp.wr_start = Some(wr_start);
    qp.wr_complete = Some(wr_complete);
    qp.wr_abort = Some(wr_abort);
    qp.wr_atomic_write = Some(wr_atomic_write);
}

/// The `create_qp_ex` op of `verbs_context`: PD required; CREATE_FLAGS (0 only) and
/// SEND_OPS_FLAGS supported; other extensions fail with EOPNOTSUPP. Creation itself is
/// `ibv_create_qp`'s (`create_qp_common`).
///
/// # Safety
/// `context` from `ibv_open_device`; `attr` NULL or valid, its PD and CQs from this library.
pub(crate) unsafe extern "C" fn create_qp_ex(
    context: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    if attr.is_null() {
        return ret_null(libc::EINVAL);
    }
    // SAFETY: `attr` is valid per the contract.
    let a = unsafe { &*attr };
    if a.comp_mask & IBV_QP_INIT_ATTR_PD == 0 || a.pd.is_null() {
        return ret_null(libc::EINVAL);
    }
    // SAFETY: `a.pd` is a PD of this library per the contract.
    if unsafe { (*a.pd).context } != context {
        return ret_null(libc::EINVAL);
    }
    if a.comp_mask & !SUPPORTED_INIT_ATTR_MASK != 0 {
        return ret_null(libc::EOPNOTSUPP);
    }
    if a.comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS != 0
        && a.create_flags & !SUPPORTED_CREATE_FLAGS != 0
    {
        return ret_null(libc::EOPNOTSUPP);
    }
    let send_ops = if a.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0 {
        let ops = a.send_ops_flags;
        if ops & !supported_ops(a.qp_type) != 0 {
            return ret_null(libc::EOPNOTSUPP);
        }
        // SAFETY: the context is live (it owns the PD).
        let atomics = unsafe { crate::ctx::soft(context) }
            .is_some_and(|s| s.ctx.query_device().atomic_cap_hca);
        if ops & ATOMIC_OPS != 0 && !atomics {
            return ret_null(libc::EOPNOTSUPP);
        }
        Some(ops)
    } else {
        None
    };
    // SAFETY: `ibv_qp_init_attr_ex` begins with the fields of `ibv_qp_init_attr` (checked by
    // the layout test), which is all `create_qp_common` reads and writes (`cap`, field by
    // field: `comp_mask` lies in the base struct's tail padding).
    unsafe { create_qp_common(a.pd, attr.cast(), send_ops) }
}

/// `ibv_qp_to_qp_ex@@IBVERBS_1.6`: the `ibv_qp_ex` of a QP created with send_ops_flags,
/// else NULL (as rdma-core).
///
/// # Safety
/// `qp` NULL or from this library, not destroyed.
pub unsafe extern "C" fn ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    let x = qp.cast::<ibv_qp_ex>();
    // SAFETY: per the contract.
    match unsafe { parts(x) } {
        Some((_, st)) if st.send_ops.is_some() => x,
        _ => {
            set_errno(libc::EOPNOTSUPP);
            ptr::null_mut()
        }
    }
}

/// The parts of the [`SoftQp`] behind `qp` the `wr_*` ops use, without a reference to its
/// `ibv_qp_ex` (whose `wr_id`/`wr_flags` the application writes).
///
/// # Safety
/// `qp` is NULL or a live QP from this library.
unsafe fn parts<'a>(qp: *mut ibv_qp_ex) -> Option<(&'a softverbs::Qp, &'a WrState)> {
    if qp.is_null() {
        return None;
    }
    let s = qp.cast::<SoftQp>();
    // SAFETY: per the contract `qp` is the first field of a live `SoftQp`; only the
    // `inner` and `ex` fields are borrowed.
    Some(unsafe { (&(*s).inner, &(*s).ex) })
}

/// Runs `f` on the batch of `qp` (nothing for NULL).
///
/// # Safety
/// `qp` is NULL or a live QP from this library.
unsafe fn with_batch(qp: *mut ibv_qp_ex, f: impl FnOnce(&mut Batch)) {
    // SAFETY: per the contract.
    if let Some((_, st)) = unsafe { parts(qp) } {
        f(&mut st.lock());
    }
}

/// A builder: starts a work request with the `wr_id`/`wr_flags` the application wrote.
///
/// # Safety
/// `qp` is NULL or a live QP from this library.
unsafe fn build(qp: *mut ibv_qp_ex, op: Result<SendOp, c_int>) {
    if qp.is_null() {
        return;
    }
    // SAFETY: `qp` is live; the application wrote these fields before calling the builder
    // and does not write them concurrently (verbs contract).
    let (wr_id, flags, qp_type) = unsafe {
        (
            ptr::addr_of!((*qp).wr_id).read(),
            ptr::addr_of!((*qp).wr_flags).read(),
            ptr::addr_of!((*qp).qp_base.qp_type).read(),
        )
    };
    // SAFETY: per the contract.
    unsafe {
        with_batch(qp, |b| {
            if !b.started {
                b.fail(libc::EINVAL);
            }
            let op = match op {
                Ok(o) => o,
                Err(e) => {
                    b.fail(e);
                    return;
                }
            };
            if op_flag(&op) & supported_ops(qp_type) == 0 {
                b.fail(libc::EOPNOTSUPP);
                return;
            }
            b.wrs.push(Pending {
                wr_id,
                flags,
                op,
                data: Data::None,
                ud: None,
            });
        })
    }
}

unsafe extern "C" fn wr_send(qp: *mut ibv_qp_ex) {
    // SAFETY: the inline passes a QP of this library.
    unsafe { build(qp, Ok(SendOp::Send)) }
}

unsafe extern "C" fn wr_send_imm(qp: *mut ibv_qp_ex, imm_data: u32) {
    // SAFETY: the inline passes a QP of this library.
    unsafe { build(qp, Ok(SendOp::SendWithImm { imm: imm_data })) }
}

unsafe extern "C" fn wr_send_inv(qp: *mut ibv_qp_ex, invalidate_rkey: u32) {
    let op = SendOp::SendWithInv {
        rkey: Rkey(invalidate_rkey),
    };
    // SAFETY: the inline passes a QP of this library.
    unsafe { build(qp, Ok(op)) }
}

unsafe extern "C" fn wr_rdma_write(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    let op = SendOp::RdmaWrite {
        remote_addr,
        rkey: Rkey(rkey),
    };
    // SAFETY: the inline passes a QP of this library.
    unsafe { build(qp, Ok(op)) }
}

unsafe extern "C" fn wr_rdma_write_imm(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, imm: u32) {
    let op = SendOp::RdmaWriteWithImm {
        remote_addr,
        rkey: Rkey(rkey),
        imm,
    };
    // SAFETY: the inline passes a QP of this library.
    unsafe { build(qp, Ok(op)) }
}

unsafe extern "C" fn wr_rdma_read(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    let op = SendOp::RdmaRead {
        remote_addr,
        rkey: Rkey(rkey),
    };
    // SAFETY: the inline passes a QP of this library.
    unsafe { build(qp, Ok(op)) }
}

unsafe extern "C" fn wr_atomic_cmp_swp(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    compare: u64,
    swap: u64,
) {
    let op = SendOp::AtomicCmpSwap {
        remote_addr,
        rkey: Rkey(rkey),
        compare,
        swap,
    };
    // SAFETY: the inline passes a QP of this library.
    unsafe { build(qp, Ok(op)) }
}

unsafe extern "C" fn wr_atomic_fetch_add(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    add: u64,
) {
    let op = SendOp::AtomicFetchAdd {
        remote_addr,
        rkey: Rkey(rkey),
        add,
    };
    // SAFETY: the inline passes a QP of this library.
    unsafe { build(qp, Ok(op)) }
}

unsafe extern "C" fn wr_local_inv(qp: *mut ibv_qp_ex, invalidate_rkey: u32) {
    let op = SendOp::LocalInv {
        rkey: Rkey(invalidate_rkey),
    };
    // SAFETY: the inline passes a QP of this library.
    unsafe { build(qp, Ok(op)) }
}

/// `wr_bind_mw`: binds a type 2 window under the new `rkey` (EINVAL for type 1 windows,
/// which `ibv_bind_mw` binds). `mw->rkey` is left to the application, as in rdma-core.
unsafe extern "C" fn wr_bind_mw(
    qp: *mut ibv_qp_ex,
    mw: *mut ibv_mw,
    rkey: u32,
    info: *const ibv_mw_bind_info,
) {
    // SAFETY: the application passes a window from `ibv_alloc_mw` and a valid bind info
    // whose MR is NULL or live (verbs contract).
    let op = unsafe { crate::mw::bind_op(mw, rkey, info) };
    // SAFETY: the inline passes a QP of this library.
    unsafe { build(qp, op) }
}

/// `wr_send_tso`: raw packet QPs only; unsupported.
unsafe extern "C" fn wr_send_tso(qp: *mut ibv_qp_ex, _hdr: *mut c_void, _hdr_sz: u16, _mss: u16) {
    // SAFETY: the inline passes a QP of this library.
    unsafe { build(qp, Err(libc::EOPNOTSUPP)) }
}

/// `wr_atomic_write`: unsupported.
unsafe extern "C" fn wr_atomic_write(
    qp: *mut ibv_qp_ex,
    _rkey: u32,
    _remote_addr: u64,
    _data: *const c_void,
) {
    // SAFETY: the inline passes a QP of this library.
    unsafe { build(qp, Err(libc::EOPNOTSUPP)) }
}

/// `wr_set_xrc_srqn`: no XRC; unsupported.
unsafe extern "C" fn wr_set_xrc_srqn(qp: *mut ibv_qp_ex, _remote_srqn: u32) {
    // SAFETY: the inline passes a QP of this library.
    unsafe { with_batch(qp, |b| b.fail(libc::EOPNOTSUPP)) }
}

/// `wr_set_ud_addr`: UD QPs only (EOPNOTSUPP on others); the AH is translated at
/// `wr_complete`.
unsafe extern "C" fn wr_set_ud_addr(
    qp: *mut ibv_qp_ex,
    ah: *mut ibv_ah,
    remote_qpn: u32,
    remote_qkey: u32,
) {
    if qp.is_null() {
        return;
    }
    // SAFETY: `qp` is a live QP of this library (the inline passes one).
    let ud = unsafe { ptr::addr_of!((*qp).qp_base.qp_type).read() } == IBV_QPT_UD;
    // SAFETY: as above.
    unsafe {
        with_batch(qp, |b| {
            if !ud {
                b.fail(libc::EOPNOTSUPP);
            } else if let Some(w) = b.last() {
                w.ud = Some(UdAddr {
                    ah,
                    remote_qpn,
                    remote_qkey,
                });
            }
        })
    }
}

/// Sets the latest work request's data to the SGEs `list` (zero-length ones dropped, as
/// mlx5 does).
fn set_sges(b: &mut Batch, list: &[ibv_sge]) {
    let start = b.sges.len();
    let n = list.iter().filter(|s| s.length != 0).count();
    if b.last().is_none() {
        return;
    }
    b.sges
        .extend(list.iter().filter(|s| s.length != 0).map(|s| Sge {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey,
        }));
    if let Some(w) = b.wrs.last_mut() {
        w.data = Data::Sges(start, n);
    }
}

unsafe extern "C" fn wr_set_sge(qp: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    let sge = ibv_sge { addr, length, lkey };
    // SAFETY: the inline passes a QP of this library.
    unsafe { with_batch(qp, |b| set_sges(b, &[sge])) }
}

unsafe extern "C" fn wr_set_sge_list(qp: *mut ibv_qp_ex, num_sge: usize, sg_list: *const ibv_sge) {
    // SAFETY: the inline passes a QP of this library.
    let max = unsafe { parts(qp) }.map_or(0, |(_, st)| st.max_sge as usize);
    let list = if num_sge == 0 {
        &[][..]
    } else if sg_list.is_null() || num_sge > max {
        // num_sge is checked before the list is read.
        // SAFETY: the inline passes a QP of this library.
        unsafe { with_batch(qp, |b| b.fail(libc::EINVAL)) };
        return;
    } else {
        // SAFETY: the caller's list holds `num_sge` entries (verbs contract).
        unsafe { core::slice::from_raw_parts(sg_list, num_sge) }
    };
    // SAFETY: the inline passes a QP of this library.
    unsafe { with_batch(qp, |b| set_sges(b, list)) }
}

/// Sets the latest work request's data to a copy of `bufs` (concatenated).
///
/// # Safety
/// Each `(addr, len)` is readable for `len` bytes (or `len == 0`).
unsafe fn set_inline(b: &mut Batch, bufs: &[(*const u8, usize)]) {
    if b.last().is_none() {
        return;
    }
    let start = b.inline.len();
    for &(p, n) in bufs {
        if n == 0 {
            continue;
        }
        if p.is_null() {
            b.fail(libc::EINVAL);
            return;
        }
        // SAFETY: per the contract.
        b.inline
            .extend_from_slice(unsafe { core::slice::from_raw_parts(p, n) });
    }
    let len = b.inline.len() - start;
    if let Some(w) = b.wrs.last_mut() {
        w.data = Data::Inline(start, len);
    }
}

unsafe extern "C" fn wr_set_inline_data(qp: *mut ibv_qp_ex, addr: *mut c_void, length: usize) {
    // SAFETY: the inline passes a QP of this library; the caller's buffer holds `length`
    // bytes (verbs contract).
    unsafe { with_batch(qp, |b| set_inline(b, &[(addr.cast_const().cast(), length)])) }
}

unsafe extern "C" fn wr_set_inline_data_list(
    qp: *mut ibv_qp_ex,
    num_buf: usize,
    buf_list: *const ibv_data_buf,
) {
    let list = if num_buf == 0 {
        &[][..]
    } else if buf_list.is_null() {
        // SAFETY: the inline passes a QP of this library.
        unsafe { with_batch(qp, |b| b.fail(libc::EINVAL)) };
        return;
    } else {
        // SAFETY: the caller's list holds `num_buf` entries (verbs contract).
        unsafe { core::slice::from_raw_parts(buf_list, num_buf) }
    };
    let bufs: Vec<(*const u8, usize)> = list
        .iter()
        .map(|d| (d.addr.cast_const().cast(), d.length))
        .collect();
    // SAFETY: the inline passes a QP of this library; each buffer holds its `length` bytes
    // (verbs contract).
    unsafe { with_batch(qp, |b| set_inline(b, &bufs)) }
}

unsafe extern "C" fn wr_start(qp: *mut ibv_qp_ex) {
    // SAFETY: the inline passes a QP of this library.
    unsafe {
        with_batch(qp, |b| {
            b.clear();
            b.started = true;
        })
    }
}

unsafe extern "C" fn wr_abort(qp: *mut ibv_qp_ex) {
    // SAFETY: the inline passes a QP of this library.
    unsafe { with_batch(qp, Batch::clear) }
}

/// UD translation of a `Send`/`SendWithImm` with its `wr_set_ud_addr` destination, the
/// same way `ibv_post_send` translates `wr.ud` (`crate::ah::ud_send_op`): EINVAL without a
/// destination or for a NULL AH.
fn ud_send_op(op: SendOp, ud: Option<UdAddr>) -> Result<SendOp, c_int> {
    let Some(ud) = ud else {
        return Err(libc::EINVAL);
    };
    let imm = match op {
        SendOp::Send => None,
        SendOp::SendWithImm { imm } => Some(imm),
        _ => return Err(libc::EOPNOTSUPP),
    };
    // SAFETY: the application keeps the AH it passed to `wr_set_ud_addr` alive until the
    // work request completes (verbs contract), so it is live at `wr_complete`.
    unsafe { crate::ah::ud_send_op(ud.ah, ud.remote_qpn, ud.remote_qkey, imm) }.ok_or(libc::EINVAL)
}

/// `wr_complete`: posts the batch (see the module documentation for errors).
unsafe extern "C" fn wr_complete(qp: *mut ibv_qp_ex) -> c_int {
    // SAFETY: the inline passes a QP of this library.
    let Some((inner, st)) = (unsafe { parts(qp) }) else {
        return libc::EINVAL;
    };
    // SAFETY: `qp` is live.
    let ud = unsafe { ptr::addr_of!((*qp).qp_base.qp_type).read() } == IBV_QPT_UD;
    let mut b = st.lock();
    if !b.started {
        b.clear();
        return libc::EINVAL;
    }
    if b.err != 0 {
        let e = b.err;
        b.clear();
        return e;
    }
    let ops: Result<Vec<SendOp>, c_int> = b
        .wrs
        .iter()
        .map(|p| if ud { ud_send_op(p.op, p.ud) } else { Ok(p.op) })
        .collect();
    let ops = match ops {
        Ok(o) => o,
        Err(e) => {
            b.clear();
            return e;
        }
    };
    let mut wrs = Vec::with_capacity(ops.len());
    for (p, &op) in b.wrs.iter().zip(&ops) {
        let payload = match p.data {
            Data::None => Payload::Sges(&[]),
            Data::Sges(s, n) => Payload::Sges(&b.sges[s..s + n]),
            Data::Inline(s, n) => Payload::Inline(&b.inline[s..s + n]),
        };
        wrs.push(SendWr {
            wr_id: p.wr_id,
            op,
            payload,
            flags: SendFlags(p.flags & 0x7),
        });
    }
    let r = if wrs.is_empty() {
        Ok(())
    } else {
        inner.post_send_list(&wrs)
    };
    drop(wrs);
    b.clear();
    match r {
        Ok(()) => 0,
        Err((_, e)) => post_errno(e),
    }
}
