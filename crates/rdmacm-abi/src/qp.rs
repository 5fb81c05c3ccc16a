//! The verbs objects librdmacm makes for an id (`rdma_create_qp`, `rdma_create_qp_ex`,
//! `rdma_create_srq`, `rdma_create_srq_ex`, and their destroy calls), as rdma-core 44's
//! cma.c makes them: through libibverbs' public verbs on the id's device context, with
//! completion channels and CQs of its own when the program gives none.
//!
//! One difference in who does what: rdma-core's librdmacm moves the QP through INIT (and,
//! for UD, RTR and RTS) itself with `ibv_modify_qp`, and later RTR and RTS around the
//! connection exchange. Here the QP is tied to the id in the connection manager as a
//! *managed* QP, which makes exactly those transitions at the same moments (INIT now,
//! before this returns, so a failure is this call's), and `id->qp->state` is kept current
//! (`cm::sync_qp_state`). softverbs has no XRC: XRC QPs and SRQs fail with `EOPNOTSUPP`.

use core::ffi::c_int;
use core::ptr;
use std::sync::Arc;

use softverbs_stub_support::Zeroed;

use crate::abi::*;
use crate::cm::{check, sync_qp_state, twin};
use crate::errno::{errno, Errno};
use crate::ibverbs::{create_qp_ex_op, libibverbs, Verbs};
use crate::id::Id;

/// rdma-core's `ucma_destroy_cqs`: destroys the CQs and completion channels librdmacm made
/// for the id (never the program's own, which it does not store in the id).
pub fn destroy_cqs(c: &mut rdma_cm_id) {
    let Ok(verbs) = libibverbs() else { return };
    if c.qp_type == IBV_QPT_XRC_RECV && !c.srq.is_null() {
        return;
    }
    if !c.recv_cq.is_null() {
        // SAFETY: CQs librdmacm created on the id's context, destroyed once.
        unsafe {
            (verbs.destroy_cq)(c.recv_cq);
            if !c.send_cq.is_null() && c.send_cq != c.recv_cq {
                (verbs.destroy_cq)(c.send_cq);
            }
        }
        c.send_cq = ptr::null_mut();
        c.recv_cq = ptr::null_mut();
    }
    if !c.recv_cq_channel.is_null() {
        // SAFETY: as above, completion channels.
        unsafe {
            (verbs.destroy_comp_channel)(c.recv_cq_channel);
            if !c.send_cq_channel.is_null() && c.send_cq_channel != c.recv_cq_channel {
                (verbs.destroy_comp_channel)(c.send_cq_channel);
            }
        }
        c.send_cq_channel = ptr::null_mut();
        c.recv_cq_channel = ptr::null_mut();
    }
}

/// One completion channel and a CQ of `size` entries on it, for the id.
fn cq_with_channel(
    verbs: &Verbs,
    c: &rdma_cm_id,
    id: *mut rdma_cm_id,
    size: u32,
) -> Result<(*mut ibv_comp_channel, *mut ibv_cq), Errno> {
    // SAFETY: the id's live device context.
    let channel = unsafe { (verbs.create_comp_channel)(c.verbs) };
    if channel.is_null() {
        return Err(errno());
    }
    let cqe = c_int::try_from(size).unwrap_or(c_int::MAX);
    // SAFETY: as above; the CQ's context is the id, as rdma-core gives it.
    let cq = unsafe { (verbs.create_cq)(c.verbs, cqe, id.cast(), channel, 0) };
    if cq.is_null() {
        let e = errno();
        // SAFETY: the channel made just above, unused.
        unsafe { (verbs.destroy_comp_channel)(channel) };
        return Err(e);
    }
    Ok((channel, cq))
}

/// rdma-core's `ucma_create_cqs`: a receive and a send CQ, each with its own completion
/// channel, for the sizes that are nonzero.
fn create_cqs(id: &Arc<Id>, send_size: u32, recv_size: u32) -> Result<(), Errno> {
    let verbs = libibverbs().map_err(|_| libc::ENODEV)?;
    // SAFETY: the live id's C struct, accessed as rdma-core accesses it.
    let c = unsafe { &mut *id.c() };
    let made = (|| {
        if recv_size != 0 {
            let (ch, cq) = cq_with_channel(verbs, c, id.c_ptr(), recv_size)?;
            c.recv_cq_channel = ch;
            c.recv_cq = cq;
        }
        if send_size != 0 {
            let (ch, cq) = cq_with_channel(verbs, c, id.c_ptr(), send_size)?;
            c.send_cq_channel = ch;
            c.send_cq = cq;
        }
        Ok(())
    })();
    if made.is_err() {
        destroy_cqs(c);
    }
    made
}

/// rdma-core's inline `ibv_create_qp_ex`: `ibv_create_qp` when only the PD is given, else
/// the context's extended op.
///
/// # Safety
/// `attr` is a valid `ibv_qp_init_attr_ex` whose PD is on `context`.
unsafe fn ibv_create_qp_ex(
    verbs: &Verbs,
    context: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> Result<*mut ibv_qp, Errno> {
    // SAFETY: the caller's guarantee.
    let a = unsafe { &mut *attr };
    let qp = if a.comp_mask == IBV_QP_INIT_ATTR_PD {
        // SAFETY: an `ibv_qp_init_attr_ex` begins with an `ibv_qp_init_attr`.
        unsafe { (verbs.create_qp)(a.pd, attr.cast()) }
    } else {
        // SAFETY: the context is live (the caller's guarantee).
        let Some(op) = (unsafe { create_qp_ex_op(context) }) else {
            return Err(libc::EOPNOTSUPP);
        };
        // SAFETY: the op of that context, called with a valid attribute struct.
        unsafe { op(context, attr) }
    };
    if qp.is_null() {
        Err(errno())
    } else {
        Ok(qp)
    }
}

/// `rdma_create_qp_ex`.
///
/// # Safety
/// `attr` is NULL or a valid `ibv_qp_init_attr_ex` (its objects from libibverbs).
pub unsafe fn create_qp_ex(id: &Arc<Id>, attr: *mut ibv_qp_init_attr_ex) -> Result<(), Errno> {
    let verbs = libibverbs().map_err(|_| libc::ENODEV)?;
    // SAFETY: the caller's guarantee.
    let a = unsafe { attr.as_mut() }.ok_or(libc::EINVAL)?;
    // SAFETY: the live id's C struct.
    let c = unsafe { &mut *id.c() };
    if !c.qp.is_null() {
        return Err(libc::EINVAL);
    }
    if matches!(a.qp_type, IBV_QPT_XRC_SEND | IBV_QPT_XRC_RECV)
        || matches!(c.qp_type, IBV_QPT_XRC_SEND | IBV_QPT_XRC_RECV)
    {
        // rdma-core would open the device's XRC domain here; softverbs has none.
        return Err(libc::EOPNOTSUPP);
    }
    if c.verbs.is_null() {
        // rdma-core dereferences the missing device; a clear error instead.
        return Err(libc::EINVAL);
    }
    let (ops, handle) = twin(id)?;
    if a.comp_mask & IBV_QP_INIT_ATTR_PD == 0 || a.pd.is_null() {
        a.comp_mask |= IBV_QP_INIT_ATTR_PD;
        a.pd = c.pd;
    // SAFETY: a PD from libibverbs (the caller's guarantee) starts with its context.
    } else if unsafe { (*a.pd).context } != c.verbs {
        return Err(libc::EINVAL);
    }
    if a.pd.is_null() {
        return Err(libc::EINVAL);
    }
    if (!c.recv_cq.is_null() && !a.recv_cq.is_null() && c.recv_cq != a.recv_cq)
        || (!c.send_cq.is_null() && !a.send_cq.is_null() && c.send_cq != a.send_cq)
    {
        return Err(libc::EINVAL);
    }
    let send_size = match a.send_cq.is_null() && c.send_cq.is_null() {
        true => a.cap.max_send_wr,
        false => 0,
    };
    let recv_size = match a.recv_cq.is_null() && c.recv_cq.is_null() {
        true => a.cap.max_recv_wr,
        false => 0,
    };
    create_cqs(id, send_size, recv_size)?;
    if a.send_cq.is_null() {
        a.send_cq = c.send_cq;
    }
    if a.recv_cq.is_null() {
        a.recv_cq = c.recv_cq;
    }
    if !c.srq.is_null() && a.srq.is_null() {
        a.srq = c.srq;
    }
    // SAFETY: the attributes are valid and the PD is on the id's context (checked above).
    let qp = match unsafe { ibv_create_qp_ex(verbs, c.verbs, a) } {
        Ok(qp) => qp,
        Err(e) => {
            destroy_cqs(c);
            return Err(e);
        }
    };
    // SAFETY: a QP libibverbs just made.
    let (qp_num, srq) = unsafe { ((*qp).qp_num, u8::from(!(*qp).srq.is_null())) };
    // SAFETY: a table call on the id's twin.
    if let Err(e) = check(unsafe { (ops.set_qp)(handle, qp_num, srq, 1) }) {
        // SAFETY: the QP made above, untied, destroyed once.
        unsafe { (verbs.destroy_qp)(qp) };
        destroy_cqs(c);
        return Err(e);
    }
    // SAFETY: as above.
    c.pd = unsafe { (*qp).pd };
    c.qp = qp;
    sync_qp_state(id);
    Ok(())
}

/// `rdma_create_qp`: `rdma_create_qp_ex` with the PD given (or the id's).
///
/// # Safety
/// `attr` is NULL or a valid `ibv_qp_init_attr`; `pd` NULL or a PD from libibverbs.
pub unsafe fn create_qp(
    id: &Arc<Id>,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> Result<(), Errno> {
    // SAFETY: the caller's guarantee.
    let a = unsafe { attr.as_mut() }.ok_or(libc::EINVAL)?;
    let mut ex = ibv_qp_init_attr_ex::zeroed();
    ex.qp_context = a.qp_context;
    ex.send_cq = a.send_cq;
    ex.recv_cq = a.recv_cq;
    ex.srq = a.srq;
    ex.cap = a.cap;
    ex.qp_type = a.qp_type;
    ex.sq_sig_all = a.sq_sig_all;
    ex.comp_mask = IBV_QP_INIT_ATTR_PD;
    ex.pd = match pd.is_null() {
        // SAFETY: plain read of our own C struct's field.
        true => unsafe { (*id.c()).pd },
        false => pd,
    };
    // SAFETY: a valid attribute struct on this stack frame.
    let r = unsafe { create_qp_ex(id, &mut ex) };
    // As rdma-core, the (possibly adjusted) attributes go back to the caller.
    a.send_cq = ex.send_cq;
    a.recv_cq = ex.recv_cq;
    a.srq = ex.srq;
    a.cap = ex.cap;
    r
}

/// `rdma_destroy_qp`: unties the QP from the id in the connection manager, destroys it and
/// the CQs librdmacm made for it.
pub fn destroy_qp(id: &Arc<Id>) {
    let Ok(verbs) = libibverbs() else { return };
    // SAFETY: the live id's C struct, accessed as rdma-core accesses it.
    let c = unsafe { &mut *id.c() };
    if !c.qp.is_null() {
        if let Ok((ops, handle)) = twin(id) {
            // SAFETY: a table call on the id's twin; whatever it says, the QP goes.
            let _ = unsafe { (ops.clear_qp)(handle) };
        }
        // SAFETY: the id's QP, destroyed once (the field is cleared).
        unsafe { (verbs.destroy_qp)(c.qp) };
        c.qp = ptr::null_mut();
    }
    destroy_cqs(c);
}

/// `rdma_create_srq_ex`: basic SRQs (`EOPNOTSUPP` for XRC and tag matching, which softverbs
/// does not have).
///
/// # Safety
/// `attr` is NULL or a valid `ibv_srq_init_attr_ex`.
pub unsafe fn create_srq_ex(id: &Arc<Id>, attr: *mut ibv_srq_init_attr_ex) -> Result<(), Errno> {
    let verbs = libibverbs().map_err(|_| libc::ENODEV)?;
    // SAFETY: the caller's guarantee.
    let a = unsafe { attr.as_mut() }.ok_or(libc::EINVAL)?;
    if a.comp_mask & IBV_SRQ_INIT_ATTR_TYPE == 0 {
        return Err(libc::EINVAL);
    }
    // SAFETY: the live id's C struct.
    let c = unsafe { &mut *id.c() };
    if a.comp_mask & IBV_SRQ_INIT_ATTR_PD == 0 || a.pd.is_null() {
        a.pd = c.pd;
        a.comp_mask |= IBV_SRQ_INIT_ATTR_PD;
    }
    let extras = !(IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD);
    if a.srq_type != IBV_SRQT_BASIC || a.comp_mask & extras != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    if a.pd.is_null() {
        return Err(libc::EINVAL);
    }
    let mut basic = ibv_srq_init_attr {
        srq_context: a.srq_context,
        attr: a.attr,
    };
    // SAFETY: a PD from libibverbs and a valid attribute struct.
    let srq = unsafe { (verbs.create_srq)(a.pd, &mut basic) };
    if srq.is_null() {
        let e = errno();
        destroy_cqs(c);
        return Err(e);
    }
    a.attr = basic.attr;
    if c.pd.is_null() {
        c.pd = a.pd;
    }
    c.srq = srq;
    Ok(())
}

/// `rdma_create_srq`.
///
/// # Safety
/// `attr` is NULL or a valid `ibv_srq_init_attr`; `pd` NULL or a PD from libibverbs.
pub unsafe fn create_srq(
    id: &Arc<Id>,
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> Result<(), Errno> {
    // SAFETY: the caller's guarantee.
    let a = unsafe { attr.as_mut() }.ok_or(libc::EINVAL)?;
    let mut ex = ibv_srq_init_attr_ex::zeroed();
    ex.srq_context = a.srq_context;
    ex.attr = a.attr;
    ex.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD;
    // SAFETY: plain read of our own C struct's field.
    ex.srq_type = match unsafe { (*id.c()).qp_type } {
        IBV_QPT_XRC_RECV => IBV_SRQT_XRC,
        _ => IBV_SRQT_BASIC,
    };
    ex.pd = pd;
    // SAFETY: a valid attribute struct on this stack frame.
    let r = unsafe { create_srq_ex(id, &mut ex) };
    a.attr = ex.attr;
    r
}

/// `rdma_destroy_srq`: destroys the id's SRQ and the CQs librdmacm made for it.
pub fn destroy_srq(id: &Arc<Id>) {
    let Ok(verbs) = libibverbs() else { return };
    // SAFETY: the live id's C struct.
    let c = unsafe { &mut *id.c() };
    if !c.srq.is_null() {
        // SAFETY: the id's SRQ, destroyed once (the field is cleared).
        unsafe { (verbs.destroy_srq)(c.srq) };
        c.srq = ptr::null_mut();
    }
    destroy_cqs(c);
}
