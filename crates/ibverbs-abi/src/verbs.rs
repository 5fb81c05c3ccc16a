//! Protection domains, memory regions, completion channels and queues, queue pairs, and the
//! hot-path ops (`post_send`, `post_recv`, `poll_cq`, `req_notify_cq`) reached through
//! `ibv_context.ops`.
//!
//! Each C object is the first field of a boxed `#[repr(C)]` wrapper holding its softverbs
//! object, so the `ibv_*` pointer handed to C converts back to the wrapper.

use core::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use crate::abi::*;
use crate::ctx::{live, soft, usable, with_objects};
use crate::stubs::{ret_null, set_errno};
use softverbs::error::{PostError, RegMrError, ResourceError};
use softverbs::{
    AccessFlags, CqHandle, Mtu, Payload, QpAttr, QpAttrMask, QpCap, QpState, QpType, Rkey,
    SendFlags, SendOp, SendWr, Sge, WcOpcode, WorkCompletion,
};

/// What an `ibv_pd *` points at.
#[repr(C)]
pub struct SoftPd {
    /// Must be first.
    pub pd: ibv_pd,
    /// The softverbs PD.
    pub inner: softverbs::Pd,
    /// The address handles on this PD. softverbs AHs are plain addresses the engine does
    /// not track, so they are counted here; the engine counts MRs, MWs, QPs and SRQs.
    pub(crate) ahs: AtomicU32,
}

/// What an `ibv_mr *` points at.
#[repr(C)]
pub struct SoftMr {
    /// Must be first.
    pub mr: ibv_mr,
    /// The registration.
    pub inner: softverbs::RawMr,
}

/// What an `ibv_comp_channel *` points at.
#[repr(C)]
pub struct SoftChannel {
    /// Must be first.
    pub ch: ibv_comp_channel,
    /// The softverbs channel.
    pub inner: softverbs::CompletionChannel,
    /// The CQs reporting to it, to turn an event's CQ handle back into its `ibv_cq *`.
    cqs: Mutex<Vec<(CqHandle, usize)>>,
}

/// What an `ibv_cq *` (and, for every CQ, the same `ibv_cq_ex *`) points at.
#[repr(C)]
pub struct SoftCq {
    /// Must be first. An `ibv_cq_ex` begins with the `ibv_cq` fields, so `ibv_cq_ex_to_cq`
    /// (a cast) and the `ibv_cq` ops work on every CQ.
    pub cq: ibv_cq_ex,
    /// The softverbs CQ.
    pub inner: softverbs::Cq,
    /// The extended-poll state (`start_poll` .. `end_poll`), see `crate::cq_ex`.
    pub(crate) ex: crate::cq_ex::PollState,
}

/// What an `ibv_qp *` (and, for every QP, the same `ibv_qp_ex *`) points at.
#[repr(C)]
pub struct SoftQp {
    /// Must be first. An `ibv_qp_ex` begins with an `ibv_qp` (`qp.qp_base`); its `wr_*` ops
    /// are set only for QPs created by `create_qp_ex` with send_ops_flags (`crate::ex`).
    pub qp: ibv_qp_ex,
    /// The `ibv_qp_ex` post-send state (`wr_start` .. `wr_complete`), see `crate::ex`.
    pub(crate) ex: crate::ex::WrState,
    /// The softverbs QP.
    pub inner: softverbs::Qp,
    /// `sq_sig_all` as created.
    sq_sig_all: c_int,
    /// SGEs a send / receive work request may carry (`num_sge` is checked against them
    /// before `sg_list` is read).
    pub(crate) max_send_sge: u32,
    pub(crate) max_recv_sge: u32,
}

/// The errno the kernel answers for a resource the engine refused: ENOMEM when a limit is
/// reached (as the kernel's allocators), EBUSY, EOPNOTSUPP, EINVAL for bad arguments.
pub(crate) fn resource_errno(e: &ResourceError) -> c_int {
    match e {
        ResourceError::LimitReached => libc::ENOMEM,
        ResourceError::Busy => libc::EBUSY,
        ResourceError::Unsupported(_) => libc::EOPNOTSUPP,
        ResourceError::UnknownObject | ResourceError::InvalidArgument(_) => libc::EINVAL,
    }
}

/// The most SGEs a work request can carry on this device (`max_sge`): translations use a
/// stack array of this size.
pub(crate) const MAX_SGE: usize = 32;

/// The wrapper behind a C object pointer (NULL stays None).
///
/// # Safety
/// `p` is NULL or points at the first field of a live `T` created here.
pub(crate) unsafe fn wrap<'a, C, T>(p: *mut C) -> Option<&'a T> {
    // SAFETY: per the contract the object is the first field of a `#[repr(C)]` `T`.
    (!p.is_null()).then(|| unsafe { &*p.cast::<T>() })
}

/// Installs the hot-path ops on a new context.
pub(crate) fn install_ops(ops: &mut ibv_context_ops) {
    ops.poll_cq = Some(poll_cq);
    ops.req_notify_cq = Some(req_notify_cq);
    ops.post_send = Some(post_send);
    ops.post_recv = Some(post_recv);
    ops.post_srq_recv = Some(crate::srq::post_srq_recv);
}

/// `ibv_alloc_pd`.
///
/// # Safety
/// `context` from `ibv_open_device`.
pub unsafe extern "C" fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd {
    // SAFETY: per the contract.
    let s = match unsafe { live(context) } {
        Ok(s) => s,
        Err(e) => return ret_null(e),
    };
    let inner = match s.ctx.alloc_pd() {
        Ok(pd) => pd,
        Err(e) => return ret_null(resource_errno(&e)),
    };
    let mut pd = ibv_pd::zeroed();
    pd.context = context;
    Box::into_raw(Box::new(SoftPd {
        pd,
        inner,
        ahs: AtomicU32::new(0),
    }))
    .cast()
}

/// `ibv_dealloc_pd`.
///
/// # Safety
/// `pd` from `ibv_alloc_pd`, not yet deallocated.
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    if pd.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: `pd` came from `ibv_alloc_pd` per the contract.
    let p = unsafe { &*pd.cast::<SoftPd>() };
    // SAFETY: a PD's context is live while the PD is.
    if let Err(e) = unsafe { usable(p.pd.context) } {
        return e;
    }
    // As rdma-core's (the kernel refuses): not while anything uses the PD.
    if p.inner.in_use() || p.ahs.load(Ordering::Acquire) != 0 {
        return libc::EBUSY;
    }
    // SAFETY: `pd` came from Box::into_raw in `ibv_alloc_pd`.
    drop(unsafe { Box::from_raw(pd.cast::<SoftPd>()) });
    0
}

/// `ibv_reg_mr_iova2`: the optional access bits are ignored; `iova` must equal `addr`.
/// As the kernel does: EFAULT for a range that is not mapped, or read-only while the access
/// flags let the region be written; EINVAL for length 0; ENOMEM past the device's cap on
/// registered bytes (`SOFTVERBS_MAX_MR_BYTES`).
///
/// # Safety
/// `pd` from `ibv_alloc_pd`; `addr..addr+length` stays valid until `ibv_dereg_mr`.
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_uint,
) -> *mut ibv_mr {
    // SAFETY: per the contract.
    let Some(p) = (unsafe { wrap::<_, SoftPd>(pd) }) else {
        return ret_null(libc::EINVAL);
    };
    if iova != addr as u64 || access & (IBV_ACCESS_ZERO_BASED | IBV_ACCESS_ON_DEMAND) != 0 {
        return ret_null(libc::EOPNOTSUPP);
    }
    // SAFETY: a PD's context is live while the PD is.
    if let Err(e) = unsafe { usable(p.pd.context) } {
        return ret_null(e);
    }
    let flags = AccessFlags(access & 0x1f);
    // SAFETY: the caller keeps the memory valid until `ibv_dereg_mr` (verbs contract).
    let inner = match unsafe { p.inner.reg_mr_raw(addr.cast(), length, flags) } {
        Ok(m) => m,
        Err(e) => {
            return ret_null(match e {
                RegMrError::Fault { .. } => libc::EFAULT,
                RegMrError::TooMuch { .. } => libc::ENOMEM,
                RegMrError::Resource(r) => resource_errno(&r),
                RegMrError::Inherited(_) => libc::EIO,
            })
        }
    };
    let mut mr = ibv_mr::zeroed();
    mr.context = p.pd.context;
    mr.pd = pd;
    mr.addr = addr;
    mr.length = length;
    mr.lkey = inner.lkey();
    mr.rkey = inner.rkey();
    mr.handle = inner.lkey();
    Box::into_raw(Box::new(SoftMr { mr, inner })).cast()
}

/// `ibv_reg_mr@@IBVERBS_1.1`.
///
/// # Safety
/// As `ibv_reg_mr_iova2`.
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: forwarded contract.
    unsafe { ibv_reg_mr_iova2(pd, addr, length, addr as u64, access as c_uint) }
}

/// `ibv_reg_mr_iova`.
///
/// # Safety
/// As `ibv_reg_mr_iova2`.
pub unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: forwarded contract.
    unsafe { ibv_reg_mr_iova2(pd, addr, length, iova, access as c_uint) }
}

/// `ibv_dereg_mr`.
///
/// # Safety
/// `mr` from `ibv_reg_mr*`, not yet deregistered.
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    if mr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: `mr` is live per the contract, and so is its context.
    if let Err(e) = unsafe { usable((*mr).context) } {
        return e;
    }
    // SAFETY: `mr` came from Box::into_raw in `ibv_reg_mr_iova2`.
    drop(unsafe { Box::from_raw(mr.cast::<SoftMr>()) });
    0
}

/// `ibv_create_comp_channel`.
///
/// # Safety
/// `context` from `ibv_open_device`.
pub unsafe extern "C" fn ibv_create_comp_channel(
    context: *mut ibv_context,
) -> *mut ibv_comp_channel {
    // SAFETY: per the contract.
    let s = match unsafe { live(context) } {
        Ok(s) => s,
        Err(e) => return ret_null(e),
    };
    let inner = match s.ctx.create_comp_channel() {
        Ok(c) => c,
        Err(e) => return ret_null(e.raw_os_error().unwrap_or(libc::ENOMEM)),
    };
    let mut ch = ibv_comp_channel::zeroed();
    ch.context = context;
    ch.fd = inner.fd();
    let b = SoftChannel {
        ch,
        inner,
        cqs: Mutex::new(Vec::new()),
    };
    Box::into_raw(Box::new(b)).cast()
}

/// `ibv_destroy_comp_channel`: EBUSY while CQs still use it.
///
/// # Safety
/// `channel` from `ibv_create_comp_channel`, not yet destroyed.
pub unsafe extern "C" fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int {
    // SAFETY: per the contract.
    let Some(c) = (unsafe { wrap::<_, SoftChannel>(channel) }) else {
        return libc::EINVAL;
    };
    if !c.cqs.lock().unwrap_or_else(|e| e.into_inner()).is_empty() {
        return libc::EBUSY;
    }
    // SAFETY: `channel` came from Box::into_raw in `ibv_create_comp_channel`.
    drop(unsafe { Box::from_raw(channel.cast::<SoftChannel>()) });
    0
}

/// `ibv_create_cq`: EINVAL for a `comp_vector` not below `num_comp_vectors`.
///
/// # Safety
/// `context` from `ibv_open_device`; `channel` NULL or from `ibv_create_comp_channel`.
pub unsafe extern "C" fn ibv_create_cq(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    let Ok(n) = u32::try_from(cqe) else {
        return ret_null(libc::EINVAL);
    };
    // SAFETY: forwarded contract.
    unsafe {
        create_cq_common(
            context,
            n,
            cq_context,
            channel,
            comp_vector,
            crate::cq_ex::STANDARD_WC_FLAGS,
        )
    }
}

/// Creates a CQ for `ibv_create_cq` and `create_cq_ex` alike (every CQ is an `ibv_cq_ex`
/// with its polling ops set); `wc_flags` are the `IBV_WC_EX_WITH_*` flags, already checked.
/// NULL with errno set on failure.
///
/// # Safety
/// As `ibv_create_cq`.
pub(crate) unsafe fn create_cq_common(
    context: *mut ibv_context,
    n: u32,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
    wc_flags: u64,
) -> *mut ibv_cq {
    // SAFETY: per the contract.
    let s = match unsafe { live(context) } {
        Ok(s) => s,
        Err(e) => return ret_null(e),
    };
    let Ok(cqe) = c_int::try_from(n) else {
        return ret_null(libc::EINVAL);
    };
    // The kernel refuses a completion vector the device does not have.
    if comp_vector < 0 || comp_vector >= s.vctx.context.num_comp_vectors {
        return ret_null(libc::EINVAL);
    }
    // SAFETY: per the contract.
    let ch = unsafe { wrap::<_, SoftChannel>(channel) };
    let inner = match s.ctx.create_cq(n.max(1), ch.map(|c| &c.inner)) {
        Ok(c) => c,
        Err(e) => return ret_null(resource_errno(&e)),
    };
    let mut cq = ibv_cq_ex::zeroed();
    cq.context = context;
    cq.channel = channel;
    cq.cq_context = cq_context;
    cq.cqe = cqe;
    crate::cq_ex::install_cq_ex_ops(&mut cq);
    let handle = inner.handle();
    let raw = Box::into_raw(Box::new(SoftCq {
        cq,
        inner,
        ex: crate::cq_ex::PollState::new(wc_flags),
    }));
    with_objects(context, |o| {
        o.cqs.insert(handle, raw as usize);
    });
    if let Some(c) = ch {
        let mut l = c.cqs.lock().unwrap_or_else(|e| e.into_inner());
        l.push((handle, raw as usize));
    }
    raw.cast()
}

/// `ibv_destroy_cq`: EBUSY while QPs use it; otherwise no event of it is delivered from
/// now on, and the call waits until every completion event reported for it was
/// acknowledged with `ibv_ack_cq_events` (and every async event with
/// `ibv_ack_async_event`), as ibv_get_cq_event(3) says.
///
/// # Safety
/// `cq` from `ibv_create_cq`, not yet destroyed.
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    // SAFETY: per the contract.
    let Some(c) = (unsafe { wrap::<_, SoftCq>(cq) }) else {
        return libc::EINVAL;
    };
    // SAFETY: a CQ's context is live while the CQ is.
    if let Err(e) = unsafe { usable(c.cq.context) } {
        return e;
    }
    // Not while QPs use it, as rdma-core's.
    if c.inner.in_use() {
        return libc::EBUSY;
    }
    c.inner.close_events();
    c.inner.wait_events_acked();
    let handle = c.inner.handle();
    with_objects(c.cq.context, |o| {
        o.cqs.remove(&handle);
    });
    // SAFETY: the channel outlives its CQs (destroy_comp_channel refuses while any exist).
    if let Some(ch) = unsafe { wrap::<_, SoftChannel>(c.cq.channel) } {
        let mut l = ch.cqs.lock().unwrap_or_else(|e| e.into_inner());
        l.retain(|&(_, p)| p != cq as usize);
    }
    // SAFETY: `cq` came from Box::into_raw in `ibv_create_cq`.
    drop(unsafe { Box::from_raw(cq.cast::<SoftCq>()) });
    0
}

/// `ibv_get_cq_event`: the next completion event of the channel, waiting for one as
/// rdma-core's `read()` of the channel fd does: 0, or -1 keeping that wait's errno (`EAGAIN`
/// when the application made the fd `O_NONBLOCK` and nothing is pending, `EINTR` when a
/// signal interrupted it). Each event must be acknowledged with `ibv_ack_cq_events`.
///
/// # Safety
/// `channel` from `ibv_create_comp_channel`; `cq`, `cq_context` writable.
pub unsafe extern "C" fn ibv_get_cq_event(
    channel: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    // SAFETY: per the contract.
    let Some(c) = (unsafe { wrap::<_, SoftChannel>(channel) }) else {
        set_errno(libc::EINVAL);
        return -1;
    };
    // SAFETY: a channel's context is live while the channel is.
    if let Err(e) = unsafe { usable(c.ch.context) } {
        set_errno(e);
        return -1;
    }
    loop {
        let h = match c.inner.get_event() {
            Ok(h) => h,
            Err(e) => {
                set_errno(e.raw_os_error().unwrap_or(libc::EIO));
                return -1;
            }
        };
        // The event was counted as reported when it was taken, so the CQ cannot be
        // destroyed (and is listed on its channel) until it is acknowledged.
        let found = c
            .cqs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|&&(x, _)| x == h)
            .map(|&(_, p)| p as *mut SoftCq);
        let Some(p) = found else {
            continue;
        };
        // SAFETY: `p` is a live SoftCq (see above); the out pointers are writable per the
        // contract.
        unsafe {
            if !cq.is_null() {
                cq.write(p.cast());
            }
            if !cq_context.is_null() {
                cq_context.write((*p).cq.cq_context);
            }
        }
        return 0;
    }
}

/// `ibv_ack_cq_events`: acknowledges `nevents` events of `cq` (`ibv_destroy_cq` waits for
/// them).
///
/// # Safety
/// `cq` from `ibv_create_cq`.
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: c_uint) {
    // SAFETY: per the contract `cq` is NULL or a live CQ.
    if let Some(c) = unsafe { wrap::<_, SoftCq>(cq) } {
        c.inner.ack_events(nevents);
    }
}

/// A softverbs completion as an `ibv_wc` (also the current completion of `crate::cq_ex`).
pub(crate) fn wc_to_c(w: &WorkCompletion) -> ibv_wc {
    let mut c = ibv_wc::zeroed();
    c.wr_id = w.wr_id;
    c.status = w.status as c_int;
    c.opcode = match w.opcode {
        WcOpcode::Send => IBV_WC_SEND,
        WcOpcode::RdmaWrite => IBV_WC_RDMA_WRITE,
        WcOpcode::RdmaRead => IBV_WC_RDMA_READ,
        WcOpcode::CompSwap => IBV_WC_COMP_SWAP,
        WcOpcode::FetchAdd => IBV_WC_FETCH_ADD,
        WcOpcode::BindMw => IBV_WC_BIND_MW,
        WcOpcode::LocalInv => IBV_WC_LOCAL_INV,
        WcOpcode::Recv => IBV_WC_RECV,
        WcOpcode::RecvRdmaWithImm => IBV_WC_RECV_RDMA_WITH_IMM,
    };
    c.byte_len = w.byte_len;
    if let Some(src) = w.src_addr.filter(|_| w.grh) {
        // A UD receive: the sender's LID (which names its endpoint on this host), and the
        // network header type in `sl` the way RoCE providers report it to user space (mlx5's
        // L3 header type, which UCX reads: 2 = IPv4, 1 = IPv6).
        c.slid = softverbs::addressing::lid_of(src);
        c.sl = if src.ip().to_canonical().is_ipv4() {
            2
        } else {
            1
        };
    }
    if let Some(imm) = w.imm_data {
        c.imm.imm_data = imm;
        c.wc_flags |= IBV_WC_WITH_IMM;
    } else if let Some(r) = w.invalidated_rkey {
        c.imm.invalidated_rkey = r.0;
        c.wc_flags |= IBV_WC_WITH_INV;
    }
    if w.grh {
        c.wc_flags |= IBV_WC_GRH;
    }
    c.qp_num = w.qp_num.value();
    c.src_qp = w.src_qp.value();
    c
}

/// The `poll_cq` op.
unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    // SAFETY: the inline passes a CQ from `ibv_create_cq`.
    let Some(c) = (unsafe { wrap::<_, SoftCq>(cq) }) else {
        return -1;
    };
    // SAFETY: a CQ's context is live while the CQ is.
    if unsafe { usable(c.cq.context) }.is_err() {
        return -1;
    }
    let want = usize::try_from(n).unwrap_or(0);
    if want > 0 && wc.is_null() {
        return -1;
    }
    let mut buf = [WorkCompletion::default(); 16];
    let mut done = 0;
    while done < want {
        let k = c.inner.poll(&mut buf[..(want - done).min(16)]);
        for w in &buf[..k] {
            // SAFETY: the caller's array holds `n` entries and `done < n`.
            unsafe { wc.add(done).write(wc_to_c(w)) };
            done += 1;
        }
        if k < 16 {
            break;
        }
    }
    c_int::try_from(done).unwrap_or(c_int::MAX)
}

/// The `req_notify_cq` op.
unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    // SAFETY: the inline passes a CQ from `ibv_create_cq`.
    let Some(c) = (unsafe { wrap::<_, SoftCq>(cq) }) else {
        return libc::EINVAL;
    };
    // SAFETY: a CQ's context is live while the CQ is.
    if let Err(e) = unsafe { usable(c.cq.context) } {
        return e;
    }
    match c.inner.req_notify(solicited_only != 0) {
        Ok(()) => 0,
        Err(_) => libc::EINVAL,
    }
}

fn qp_type_from_c(t: c_int) -> Option<QpType> {
    match t {
        IBV_QPT_RC => Some(QpType::Rc),
        IBV_QPT_UC => Some(QpType::Uc),
        IBV_QPT_UD => Some(QpType::Ud),
        _ => None,
    }
}

fn qp_type_to_c(t: QpType) -> c_int {
    match t {
        QpType::Rc => IBV_QPT_RC,
        QpType::Uc => IBV_QPT_UC,
        QpType::Ud => IBV_QPT_UD,
    }
}

fn cap_to_c(c: QpCap) -> ibv_qp_cap {
    ibv_qp_cap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

/// `ibv_create_qp` (RC, UC and UD; with `attr.srq`, receives come from that SRQ).
///
/// # Safety
/// `pd` from `ibv_alloc_pd`; `attr` valid, its CQs from `ibv_create_cq`.
pub unsafe extern "C" fn ibv_create_qp(
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    // SAFETY: forwarded contract.
    unsafe { create_qp_common(pd, attr, None) }
}

/// Creates a QP for `ibv_create_qp` and `create_qp_ex` alike; `send_ops` is the
/// `send_ops_flags` when `create_qp_ex` was asked for them (installs the `ibv_qp_ex` ops).
/// NULL with errno set on failure. `attr` may be an `ibv_qp_init_attr_ex`, whose `comp_mask`
/// lies in `ibv_qp_init_attr`'s tail padding: write its fields, never `*attr` as a whole.
///
/// # Safety
/// As `ibv_create_qp`.
pub(crate) unsafe fn create_qp_common(
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
    send_ops: Option<u64>,
) -> *mut ibv_qp {
    // SAFETY: per the contract.
    let Some(p) = (unsafe { wrap::<_, SoftPd>(pd) }) else {
        return ret_null(libc::EINVAL);
    };
    // SAFETY: a PD's context is live while the PD is.
    if let Err(e) = unsafe { usable(p.pd.context) } {
        return ret_null(e);
    }
    if attr.is_null() {
        return ret_null(libc::EINVAL);
    }
    // SAFETY: `attr` is valid per the contract.
    let a = unsafe { &mut *attr };
    // SAFETY: `attr.srq` is NULL or an SRQ from `ibv_create_srq` per the contract.
    let srq = unsafe { crate::srq::wrap_srq(a.srq) };
    let Some(ty) = qp_type_from_c(a.qp_type) else {
        return ret_null(libc::EOPNOTSUPP);
    };
    // SAFETY: the CQs come from `ibv_create_cq` per the contract.
    let (Some(scq), Some(rcq)) =
        (unsafe { (wrap::<_, SoftCq>(a.send_cq), wrap::<_, SoftCq>(a.recv_cq)) })
    else {
        return ret_null(libc::EINVAL);
    };
    let cap = QpCap {
        max_send_wr: a.cap.max_send_wr.max(1),
        max_recv_wr: a.cap.max_recv_wr.max(1),
        max_send_sge: a.cap.max_send_sge.max(1),
        max_recv_sge: a.cap.max_recv_sge.max(1),
        max_inline_data: a.cap.max_inline_data,
    };
    let mut builder = softverbs::QpBuilder::new(&p.inner, &scq.inner)
        .recv_cq(&rcq.inner)
        .qp_type(ty)
        .cap(cap)
        .sq_sig_all(a.sq_sig_all != 0);
    if let Some(s) = srq {
        builder = builder.srq(&s.inner);
    }
    let inner = match builder.build() {
        Ok(q) => q,
        Err(e) => return ret_null(resource_errno(&e)),
    };
    a.cap = cap_to_c(cap);
    if srq.is_some() {
        // Receives come from the SRQ: the QP has no receive queue of its own.
        a.cap.max_recv_wr = 0;
        a.cap.max_recv_sge = 0;
    }
    let mut qpx = ibv_qp_ex::zeroed();
    let qp = &mut qpx.qp_base;
    qp.context = p.pd.context;
    qp.qp_context = a.qp_context;
    qp.pd = pd;
    qp.send_cq = a.send_cq;
    qp.recv_cq = a.recv_cq;
    qp.srq = a.srq;
    qp.qp_num = inner.qpn().value();
    qp.handle = qp.qp_num;
    qp.state = IBV_QPS_RESET;
    qp.qp_type = a.qp_type;
    if send_ops.is_some() {
        crate::ex::install_qp_ex_ops(&mut qpx);
    }
    let handle = inner.handle();
    let b = SoftQp {
        qp: qpx,
        ex: crate::ex::WrState::new(send_ops, cap.max_send_sge),
        inner,
        sq_sig_all: a.sq_sig_all,
        max_send_sge: cap.max_send_sge,
        max_recv_sge: if srq.is_some() { 0 } else { cap.max_recv_sge },
    };
    let raw = Box::into_raw(Box::new(b));
    with_objects(p.pd.context, |o| {
        o.qps.insert(handle, raw as usize);
    });
    raw.cast()
}

/// `ibv_destroy_qp`: no event of the QP is delivered from now on, and the call waits until
/// every async event reported for it was acknowledged (ibv_get_async_event(3)).
///
/// # Safety
/// `qp` from `ibv_create_qp`, not yet destroyed.
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    if qp.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: `qp` is live per the contract, and so is its context.
    if let Err(e) = unsafe { usable((*qp).context) } {
        return e;
    }
    // SAFETY: `qp` came from Box::into_raw in `ibv_create_qp`.
    let b = unsafe { Box::from_raw(qp.cast::<SoftQp>()) };
    b.inner.close_events();
    b.inner.wait_events_acked();
    let handle = b.inner.handle();
    with_objects(b.qp.qp_base.context, |o| {
        o.qps.remove(&handle);
    });
    // Destroying the softverbs QP releases its PD, CQs and SRQ in the engine.
    drop(b);
    0
}

/// Attaches (or detaches) a QP to the multicast group a C GID names; 0 or an errno value.
///
/// # Safety
/// `qp` from `ibv_create_qp`; `gid` NULL or readable.
unsafe fn mcast(qp: *mut ibv_qp, gid: *const ibv_gid, attach: bool) -> c_int {
    // SAFETY: per the contract.
    let Some(q) = (unsafe { wrap::<_, SoftQp>(qp) }) else {
        return libc::EINVAL;
    };
    if gid.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: readable per the contract; every bit pattern is a valid byte array.
    let g = softverbs::Gid(unsafe { (*gid).raw });
    let r = if attach {
        q.inner.attach_mcast(g)
    } else {
        q.inner.detach_mcast(g)
    };
    match r {
        Ok(()) => 0,
        // Past the device's multicast limits: ENOMEM, as rxe answers.
        Err(softverbs::error::McastError::Resource(e)) => resource_errno(&e),
        Err(softverbs::error::McastError::Join { source, .. }) => {
            source.raw_os_error().unwrap_or(libc::EINVAL)
        }
        Err(softverbs::error::McastError::Inherited(_)) => libc::EIO,
    }
}

/// `ibv_attach_mcast`: a UD QP joins the multicast group `gid` (a RoCEv2 multicast GID,
/// `::ffff:239.x.y.z`, the group's UDP port in bytes 8-9 as for unicast GIDs); `lid` is
/// ignored, as on RoCE. 0 or an errno value.
///
/// # Safety
/// `qp` from `ibv_create_qp`; `gid` readable.
pub unsafe extern "C" fn ibv_attach_mcast(
    qp: *mut ibv_qp,
    gid: *const ibv_gid,
    _lid: u16,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { mcast(qp, gid, true) }
}

/// `ibv_detach_mcast`: 0 or an errno value (EINVAL when not attached).
///
/// # Safety
/// As `ibv_attach_mcast`.
pub unsafe extern "C" fn ibv_detach_mcast(
    qp: *mut ibv_qp,
    gid: *const ibv_gid,
    _lid: u16,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { mcast(qp, gid, false) }
}

fn state_from_c(s: c_int) -> Option<QpState> {
    Some(match s {
        0 => QpState::Reset,
        1 => QpState::Init,
        2 => QpState::Rtr,
        3 => QpState::Rts,
        4 => QpState::Sqd,
        5 => QpState::Sqe,
        6 => QpState::Err,
        _ => return None,
    })
}

fn state_to_c(s: QpState) -> c_int {
    match s {
        QpState::Reset => 0,
        QpState::Init => 1,
        QpState::Rtr => 2,
        QpState::Rts => 3,
        QpState::Sqd => 4,
        QpState::Sqe => 5,
        QpState::Err => 6,
    }
}

fn mtu_from_c(m: c_int) -> Option<Mtu> {
    Some(match m {
        IBV_MTU_256 => Mtu::Mtu256,
        IBV_MTU_512 => Mtu::Mtu512,
        IBV_MTU_1024 => Mtu::Mtu1024,
        IBV_MTU_2048 => Mtu::Mtu2048,
        IBV_MTU_4096 => Mtu::Mtu4096,
        _ => return None,
    })
}

fn mtu_to_c(m: Mtu) -> c_int {
    match m {
        Mtu::Mtu256 => IBV_MTU_256,
        Mtu::Mtu512 => IBV_MTU_512,
        Mtu::Mtu1024 => IBV_MTU_1024,
        Mtu::Mtu2048 => IBV_MTU_2048,
        Mtu::Mtu4096 => IBV_MTU_4096,
    }
}

/// `ibv_modify_qp`: 0 or an errno value.
///
/// # Safety
/// `qp` from `ibv_create_qp`; `attr` valid.
pub unsafe extern "C" fn ibv_modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
) -> c_int {
    // SAFETY: per the contract.
    let Some(q) = (unsafe { wrap::<_, SoftQp>(qp) }) else {
        return libc::EINVAL;
    };
    // SAFETY: a QP's context is live while the QP is.
    if let Err(e) = unsafe { usable(q.qp.qp_base.context) } {
        return e;
    }
    if attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: `attr` is valid per the contract.
    let a = unsafe { &*attr };
    let mask = QpAttrMask(mask as u32);
    let mut r = QpAttr::default();
    if mask.contains(QpAttrMask::STATE) {
        let Some(s) = state_from_c(a.qp_state) else {
            return libc::EINVAL;
        };
        r.qp_state = s;
    }
    if mask.contains(QpAttrMask::CUR_STATE) {
        let Some(s) = state_from_c(a.cur_qp_state) else {
            return libc::EINVAL;
        };
        r.cur_qp_state = s;
    }
    if mask.contains(QpAttrMask::PATH_MTU) {
        let Some(m) = mtu_from_c(a.path_mtu) else {
            return libc::EINVAL;
        };
        r.path_mtu = m;
    }
    if mask.contains(QpAttrMask::AV) {
        let ah = &a.ah_attr;
        r.av = Some(if ah.is_global != 0 {
            // SAFETY: every bit pattern of the union is a valid byte array.
            softverbs::Gid(unsafe { ah.grh.dgid.raw }).to_socket_addr()
        } else {
            // SAFETY: the QP's context is a live context from `ibv_open_device`.
            match unsafe { soft(q.qp.qp_base.context) }.and_then(|s| s.ctx.lid_to_addr(ah.dlid)) {
                Some(addr) => addr,
                None => return libc::EINVAL,
            }
        });
    }
    r.qkey = a.qkey;
    r.rq_psn = a.rq_psn;
    r.sq_psn = a.sq_psn;
    r.dest_qp_num = a.dest_qp_num;
    r.qp_access_flags = AccessFlags(a.qp_access_flags & 0x1f);
    r.pkey_index = a.pkey_index;
    r.en_sqd_async_notify = a.en_sqd_async_notify != 0;
    r.max_rd_atomic = a.max_rd_atomic;
    r.max_dest_rd_atomic = a.max_dest_rd_atomic;
    r.min_rnr_timer = a.min_rnr_timer;
    r.port_num = a.port_num;
    r.timeout = a.timeout;
    r.retry_cnt = a.retry_cnt;
    r.rnr_retry = a.rnr_retry;
    match q.inner.modify(&r, mask) {
        Ok(()) => {
            if mask.contains(QpAttrMask::STATE) {
                // SAFETY: `qp` is live; C reads `state` directly, nothing else writes it.
                unsafe { (*qp).state = a.qp_state };
            }
            0
        }
        Err(_) => libc::EINVAL,
    }
}

/// `ibv_query_qp`: fills all of `attr` and `init_attr` whatever the mask.
///
/// # Safety
/// `qp` from `ibv_create_qp`; `attr` and `init_attr` writable.
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _mask: c_int,
    init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    // SAFETY: per the contract.
    let Some(q) = (unsafe { wrap::<_, SoftQp>(qp) }) else {
        return libc::EINVAL;
    };
    if attr.is_null() || init_attr.is_null() {
        return libc::EINVAL;
    }
    let r = q.inner.query();
    let mut a = ibv_qp_attr::zeroed();
    a.qp_state = state_to_c(r.qp_state);
    a.cur_qp_state = a.qp_state;
    a.path_mtu = mtu_to_c(r.path_mtu);
    a.qkey = r.qkey;
    a.rq_psn = r.rq_psn;
    a.sq_psn = r.sq_psn;
    a.dest_qp_num = r.dest_qp_num;
    a.qp_access_flags = r.qp_access_flags.0;
    a.cap = cap_to_c(r.cap);
    a.pkey_index = r.pkey_index;
    a.en_sqd_async_notify = u8::from(r.en_sqd_async_notify);
    a.sq_draining = u8::from(r.sq_draining);
    a.max_rd_atomic = r.max_rd_atomic;
    a.max_dest_rd_atomic = r.max_dest_rd_atomic;
    a.min_rnr_timer = r.min_rnr_timer;
    a.port_num = r.port_num;
    a.timeout = r.timeout;
    a.retry_cnt = r.retry_cnt;
    a.rnr_retry = r.rnr_retry;
    if let Some(softverbs::Gid(g)) = r.av.and_then(softverbs::Gid::from_socket_addr) {
        a.ah_attr.is_global = 1;
        a.ah_attr.grh.dgid = ibv_gid { raw: g };
        a.ah_attr.port_num = 1;
    }
    let mut i = ibv_qp_init_attr::zeroed();
    i.qp_context = q.qp.qp_base.qp_context;
    i.send_cq = q.qp.qp_base.send_cq;
    i.recv_cq = q.qp.qp_base.recv_cq;
    i.srq = q.qp.qp_base.srq;
    i.cap = a.cap;
    i.qp_type = qp_type_to_c(q.inner.qp_type());
    i.sq_sig_all = q.sq_sig_all;
    // SAFETY: both are writable per the contract.
    unsafe {
        attr.write(a);
        init_attr.write(i);
    }
    0
}

pub(crate) fn post_errno(e: PostError) -> c_int {
    match e {
        PostError::QueueFull => libc::ENOMEM,
        _ => libc::EINVAL,
    }
}

/// The SGEs of a C list, checked against `max` (the queue's `max_*_sge`) before `sg_list`
/// is read, copied into `buf`: EINVAL for a negative or too large `num_sge`, or a NULL
/// list with entries. No allocation.
///
/// # Safety
/// `sg` holds `n` entries when `0 < n <= max`.
pub(crate) unsafe fn sges(
    sg: *const ibv_sge,
    n: c_int,
    max: u32,
    buf: &mut [Sge],
) -> Result<&[Sge], c_int> {
    let n = usize::try_from(n).map_err(|_| libc::EINVAL)?;
    if n > max as usize || n > MAX_SGE || n > buf.len() {
        return Err(libc::EINVAL);
    }
    if n == 0 {
        return Ok(&buf[..0]);
    }
    if sg.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: per the contract (n was checked first).
    let list = unsafe { core::slice::from_raw_parts(sg, n) };
    for (d, e) in buf.iter_mut().zip(list) {
        *d = Sge {
            addr: e.addr,
            length: e.length,
            lkey: e.lkey,
        };
    }
    Ok(&buf[..n])
}

/// Translates and posts one send WR through `poster` (the device lock is held).
///
/// # Safety
/// `w` is a valid `ibv_send_wr` whose SGEs (and inline data) are readable.
unsafe fn post_one(q: &SoftQp, poster: &mut softverbs::Poster<'_>, w: &ibv_send_wr) -> c_int {
    // SAFETY: forwarded.
    unsafe { translate_send(q, w, &mut |wr| poster.post_send(wr)) }
}

/// Translates one send WR and hands it to `post`.
///
/// # Safety
/// `w` is a valid `ibv_send_wr` whose SGEs (and inline data) are readable.
unsafe fn translate_send(
    q: &SoftQp,
    w: &ibv_send_wr,
    post: &mut dyn FnMut(&SendWr<'_>) -> Result<(), PostError>,
) -> c_int {
    let mut buf = [Sge::default(); MAX_SGE];
    let mut parts: [&[u8]; MAX_SGE] = [&[]; MAX_SGE];
    // SAFETY: forwarded.
    match unsafe { translate(q, w, &mut buf, &mut parts) } {
        Ok(wr) => match post(&wr) {
            Ok(()) => 0,
            Err(e) => post_errno(e),
        },
        Err(e) => e,
    }
}

/// Translates one send WR into a [`SendWr`] whose SGEs are copied into `buf` and whose
/// inline pieces (with IBV_SEND_INLINE) are listed in `parts`; both must have room for
/// `w.num_sge` entries (else EINVAL). The errno of a WR that cannot be posted.
///
/// # Safety
/// `w` is a valid `ibv_send_wr` whose SGEs (and inline data) are readable for `'b`.
unsafe fn translate<'a, 'b: 'a>(
    q: &SoftQp,
    w: &ibv_send_wr,
    buf: &'a mut [Sge],
    parts: &'a mut [&'b [u8]],
) -> Result<SendWr<'a>, c_int> {
    // num_sge first: nothing of `sg_list` is read past what the QP can take.
    // SAFETY: per the contract.
    let list = unsafe { sges(w.sg_list, w.num_sge, q.max_send_sge, buf) }?;
    // SAFETY: the union members read are the ones the opcode selects (plain data); a UD
    // WR's AH is NULL or from `ibv_create_ah`, a BIND_MW WR's window and MR are NULL or live
    // (verbs contract).
    let op = unsafe {
        match w.opcode {
            // A UD QP sends datagrams to `wr.ud` (its AH from `ibv_create_ah`).
            _ if q.inner.qp_type() == QpType::Ud => match crate::ah::ud_op(w) {
                Some(op) => op,
                None => return Err(libc::EINVAL),
            },
            IBV_WR_SEND => SendOp::Send,
            IBV_WR_SEND_WITH_IMM => SendOp::SendWithImm {
                imm: w.imm.imm_data,
            },
            IBV_WR_SEND_WITH_INV => SendOp::SendWithInv {
                rkey: Rkey(w.imm.invalidate_rkey),
            },
            IBV_WR_RDMA_WRITE => SendOp::RdmaWrite {
                remote_addr: w.wr.rdma.remote_addr,
                rkey: Rkey(w.wr.rdma.rkey),
            },
            IBV_WR_RDMA_WRITE_WITH_IMM => SendOp::RdmaWriteWithImm {
                remote_addr: w.wr.rdma.remote_addr,
                rkey: Rkey(w.wr.rdma.rkey),
                imm: w.imm.imm_data,
            },
            IBV_WR_RDMA_READ => SendOp::RdmaRead {
                remote_addr: w.wr.rdma.remote_addr,
                rkey: Rkey(w.wr.rdma.rkey),
            },
            IBV_WR_ATOMIC_CMP_AND_SWP => SendOp::AtomicCmpSwap {
                remote_addr: w.wr.atomic.remote_addr,
                rkey: Rkey(w.wr.atomic.rkey),
                compare: w.wr.atomic.compare_add,
                swap: w.wr.atomic.swap,
            },
            IBV_WR_ATOMIC_FETCH_AND_ADD => SendOp::AtomicFetchAdd {
                remote_addr: w.wr.atomic.remote_addr,
                rkey: Rkey(w.wr.atomic.rkey),
                add: w.wr.atomic.compare_add,
            },
            IBV_WR_LOCAL_INV => SendOp::LocalInv {
                rkey: Rkey(w.imm.invalidate_rkey),
            },
            // A type 2 window bound by a work request (`crate::mw`).
            IBV_WR_BIND_MW => {
                let b = &w.bind_mw_tso.bind_mw;
                crate::mw::bind_op(b.mw, b.rkey, &b.bind_info)?
            }
            _ => return Err(libc::EINVAL),
        }
    };
    let payload = if w.send_flags & IBV_SEND_INLINE != 0 {
        // Inline: the engine copies the pieces straight into the send queue, once.
        for (part, s) in parts.iter_mut().zip(list) {
            let n = s.length as usize;
            if n > 0 {
                if s.addr == 0 {
                    return Err(libc::EINVAL);
                }
                // SAFETY: with IBV_SEND_INLINE the SGE addresses are readable by the
                // caller's contract, lkeys ignored.
                *part = unsafe { core::slice::from_raw_parts(s.addr as usize as *const u8, n) };
            }
        }
        let parts: &'a [&'b [u8]] = parts;
        Payload::InlineParts(&parts[..list.len()])
    } else {
        Payload::Sges(list)
    };
    Ok(SendWr {
        wr_id: w.wr_id,
        op,
        payload,
        flags: SendFlags(w.send_flags & 0x7),
    })
}

/// Posts a C list of send WRs as one list on a QP with the same-host path
/// ([`softverbs::Qp::post_send_list`]: one placement lock, one device lock, one
/// transmission, as the UDP path's list): the WRs are translated first, up to the first
/// that cannot be (the ones before it are posted, as rdma-core's providers do); on error
/// `*bad_wr` is the first WR not posted.
///
/// # Safety
/// `wr` is a valid list whose SGEs and inline data are readable; `bad_wr` NULL or
/// writable.
unsafe fn post_send_list_same_host(
    q: &SoftQp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    // Room for every WR's SGEs (a WR whose num_sge is out of range gets none: its
    // translation fails).
    let max = q.max_send_sge as usize;
    let slots_of = |w: &ibv_send_wr| usize::try_from(w.num_sge).ok().filter(|&n| n <= max);
    let (mut count, mut slots) = (0usize, 0usize);
    let mut cur = wr;
    while !cur.is_null() {
        // SAFETY: `cur` is a valid WR of the caller's list.
        let w = unsafe { &*cur };
        slots += slots_of(w).unwrap_or(0);
        count += 1;
        cur = w.next;
    }
    let mut sge_store = vec![Sge::default(); slots];
    let mut part_store: Vec<&[u8]> = vec![&[]; slots];
    let mut wrs: Vec<SendWr<'_>> = Vec::with_capacity(count);
    let (mut sge_rest, mut part_rest) = (&mut sge_store[..], &mut part_store[..]);
    let mut refused = None;
    cur = wr;
    while !cur.is_null() {
        // SAFETY: `cur` is a valid WR of the caller's list.
        let w = unsafe { &*cur };
        let n = slots_of(w).unwrap_or(0);
        let (sge_buf, rest) = core::mem::take(&mut sge_rest).split_at_mut(n);
        sge_rest = rest;
        let (part_buf, rest) = core::mem::take(&mut part_rest).split_at_mut(n);
        part_rest = rest;
        // SAFETY: its SGEs and inline data are readable (verbs contract).
        match unsafe { translate(q, w, sge_buf, part_buf) } {
            Ok(t) => wrs.push(t),
            Err(e) => {
                refused = Some((e, cur));
                break;
            }
        }
        cur = w.next;
    }
    let posted = if wrs.is_empty() {
        Ok(())
    } else {
        q.inner.post_send_list(&wrs)
    };
    let (rc, bad) = match (posted, refused) {
        (Ok(()), None) => return 0,
        (Ok(()), Some((e, at))) => (e, at),
        (Err((i, e)), _) => {
            let mut at = wr;
            for _ in 0..i {
                // SAFETY: `at` is a valid WR of the caller's list, before the i-th.
                at = unsafe { (*at).next };
            }
            (post_errno(e), at)
        }
    };
    if !bad_wr.is_null() {
        // SAFETY: `bad_wr` is writable per the verbs contract.
        unsafe { bad_wr.write(bad) };
    }
    rc
}

/// Whether a send WR list holds an RDMA WRITE or READ (what the same-host path places).
///
/// # Safety
/// `wr` is NULL or a valid `ibv_send_wr` list.
unsafe fn has_rdma_write_or_read(mut wr: *const ibv_send_wr) -> bool {
    while !wr.is_null() {
        // SAFETY: a valid element of the list.
        let w = unsafe { &*wr };
        if matches!(
            w.opcode,
            IBV_WR_RDMA_WRITE | IBV_WR_RDMA_WRITE_WITH_IMM | IBV_WR_RDMA_READ
        ) {
            return true;
        }
        wr = w.next;
    }
    false
}

/// The `post_send` op: the whole list under one device lock, then one transmission of
/// everything it produced; stops at the first WR refused (`*bad_wr`).
unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    // SAFETY: the inline passes a QP from `ibv_create_qp`.
    let Some(q) = (unsafe { wrap::<_, SoftQp>(qp) }) else {
        return libc::EINVAL;
    };
    let mut bad = wr;
    // SAFETY: `wr` is the caller's valid list (verbs contract).
    if q.inner.uses_same_host() && unsafe { has_rdma_write_or_read(wr) } {
        // So each RDMA WRITE or READ may take the same-host path (`softverbs::samehost`).
        // SAFETY: forwarded from the caller (verbs contract).
        return unsafe { post_send_list_same_host(q, wr, bad_wr) };
    }
    let posted = q.inner.post_sends(|poster| {
        let mut cur = wr;
        while !cur.is_null() {
            // SAFETY: `cur` is a valid WR of the caller's list.
            let w = unsafe { &*cur };
            // SAFETY: its SGEs and inline data are readable (verbs contract).
            let rc = unsafe { post_one(q, poster, w) };
            if rc != 0 {
                bad = cur;
                return rc;
            }
            cur = w.next;
        }
        0
    });
    let rc = posted.unwrap_or(libc::EIO);
    if rc != 0 && !bad_wr.is_null() {
        // SAFETY: `bad_wr` is writable per the verbs contract.
        unsafe { bad_wr.write(bad) };
    }
    rc
}

/// The `post_recv` op: the whole list under one device lock.
unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: the inline passes a QP from `ibv_create_qp`.
    let Some(q) = (unsafe { wrap::<_, SoftQp>(qp) }) else {
        return libc::EINVAL;
    };
    let posted = q.inner.post_sends(|poster| {
        // SAFETY: the list comes from the caller as the verbs contract says.
        unsafe { post_recv_list(wr, q.max_recv_sge, |id, sg| poster.post_recv(id, sg)) }
    });
    // SAFETY: `bad_wr` is NULL or writable per the verbs contract.
    unsafe { finish_recv_list(posted, wr, bad_wr) }
}

/// Posts a C list of receive WRs with `post` (under the device lock), checking each
/// `num_sge` against `max_sge` before its SGEs are read; stops at the first refused: its
/// errno and the WR. Shared by the QP and SRQ `post_recv` ops.
///
/// # Safety
/// `wr` is NULL or a valid list whose SGE lists are readable.
pub(crate) unsafe fn post_recv_list(
    wr: *mut ibv_recv_wr,
    max_sge: u32,
    mut post: impl FnMut(u64, &[Sge]) -> Result<(), PostError>,
) -> Result<(), (c_int, *mut ibv_recv_wr)> {
    let mut cur = wr;
    let mut buf = [Sge::default(); MAX_SGE];
    while !cur.is_null() {
        // SAFETY: `cur` is a valid WR of the caller's list, its SGE list readable.
        let w = unsafe { &*cur };
        // SAFETY: as above; num_sge is checked before the list is read.
        let list =
            unsafe { sges(w.sg_list, w.num_sge, max_sge, &mut buf) }.map_err(|e| (e, cur))?;
        post(w.wr_id, list).map_err(|e| (post_errno(e), cur))?;
        cur = w.next;
    }
    Ok(())
}

/// The errno of a receive list posted with [`post_recv_list`], writing the refused WR to
/// `*bad_wr` (`EIO` on a device inherited across fork, the first WR refused).
///
/// # Safety
/// `bad_wr` is NULL or writable.
pub(crate) unsafe fn finish_recv_list(
    posted: Result<Result<(), (c_int, *mut ibv_recv_wr)>, softverbs::error::Inherited>,
    first: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    let (rc, bad) = match posted {
        Ok(Ok(())) => return 0,
        Ok(Err(refused)) => refused,
        Err(_) => (libc::EIO, first),
    };
    if !bad_wr.is_null() {
        // SAFETY: per the contract.
        unsafe { bad_wr.write(bad) };
    }
    rc
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctx::ibv_close_device;
    use crate::testing::*;
    use core::ptr;

    /// Two RC QPs of one context, brought to RTS with the C calls, exchange a SEND (gathered
    /// from a registered buffer) and an inline SEND with immediate; a completion channel
    /// reports the receive CQ's event.
    #[test]
    fn loopback_send_through_the_c_api() {
        // SAFETY: the whole test drives the C API with valid, live objects in order.
        unsafe {
            let ctx = open();
            let lid = soft(ctx).expect("context").ctx.lid();
            let pd = ibv_alloc_pd(ctx);
            assert!(!pd.is_null());
            let mut buf = vec![0u8; 8192];
            let base = buf.as_mut_ptr();
            // Optional access bits are ignored, not rejected.
            let access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_OPTIONAL_FIRST;
            let mr = ibv_reg_mr_iova2(pd, base.cast(), buf.len(), base as u64, access);
            assert!(!mr.is_null());
            assert_eq!((*mr).addr, base.cast());
            assert_eq!((*mr).length, 8192);
            assert_eq!((*mr).pd, pd);
            let ch = ibv_create_comp_channel(ctx);
            assert!(!ch.is_null() && (*ch).fd >= 0);
            let scq = ibv_create_cq(ctx, 16, ptr::null_mut(), ptr::null_mut(), 0);
            let tag = 0x5eed_usize as *mut c_void;
            let rcq = ibv_create_cq(ctx, 16, tag, ch, 0);
            assert!(!scq.is_null() && !rcq.is_null());
            assert_eq!((*rcq).channel, ch);
            assert_eq!((*rcq).cqe, 16);

            let mut init = ibv_qp_init_attr::zeroed();
            init.send_cq = scq;
            init.recv_cq = rcq;
            init.qp_type = IBV_QPT_RC;
            init.cap.max_send_wr = 8;
            init.cap.max_recv_wr = 8;
            init.cap.max_send_sge = 1;
            init.cap.max_recv_sge = 1;
            init.cap.max_inline_data = 64;
            let a = ibv_create_qp(pd, &mut init);
            let b = ibv_create_qp(pd, &mut init);
            assert!(!a.is_null() && !b.is_null());
            assert_eq!((*a).qp_type, IBV_QPT_RC);
            assert_eq!((*a).state, IBV_QPS_RESET);
            for (qp, peer) in [(a, b), (b, a)] {
                let mut at = ibv_qp_attr::zeroed();
                at.qp_state = IBV_QPS_INIT;
                at.port_num = 1;
                at.qp_access_flags = IBV_ACCESS_LOCAL_WRITE;
                assert_eq!(ibv_modify_qp(qp, &mut at, 1 | 1 << 3 | 1 << 4 | 1 << 5), 0);
                let mut at = ibv_qp_attr::zeroed();
                at.qp_state = IBV_QPS_RTR;
                at.path_mtu = IBV_MTU_1024;
                at.dest_qp_num = (*peer).qp_num;
                at.max_dest_rd_atomic = 1;
                at.min_rnr_timer = 12;
                at.ah_attr.dlid = lid;
                at.ah_attr.port_num = 1;
                let m = 1 | 1 << 7 | 1 << 8 | 1 << 12 | 1 << 15 | 1 << 17 | 1 << 20;
                assert_eq!(ibv_modify_qp(qp, &mut at, m), 0);
                let mut at = ibv_qp_attr::zeroed();
                at.qp_state = IBV_QPS_RTS;
                at.timeout = 14;
                at.retry_cnt = 7;
                at.rnr_retry = 7;
                at.max_rd_atomic = 1;
                let m = 1 | 1 << 9 | 1 << 10 | 1 << 11 | 1 << 13 | 1 << 16;
                assert_eq!(ibv_modify_qp(qp, &mut at, m), 0);
                assert_eq!((*qp).state, IBV_QPS_RTS);
            }
            let mut qa = ibv_qp_attr::zeroed();
            let mut qi = ibv_qp_init_attr::zeroed();
            assert_eq!(ibv_query_qp(a, &mut qa, 0, &mut qi), 0);
            assert_eq!(qa.qp_state, IBV_QPS_RTS);
            assert_eq!(qa.dest_qp_num, (*b).qp_num);
            assert_eq!(qi.send_cq, scq);

            let ops = (*ctx).ops;
            assert_eq!((ops.req_notify_cq.expect("op"))(rcq, 0), 0);
            // Receives on B at offset 4096 and 6144.
            for off in [4096u64, 6144] {
                let mut sge = ibv_sge {
                    addr: base as u64 + off,
                    length: 2048,
                    lkey: (*mr).lkey,
                };
                let mut wr = ibv_recv_wr::zeroed();
                wr.wr_id = off;
                wr.sg_list = &mut sge;
                wr.num_sge = 1;
                let mut bad = ptr::null_mut();
                assert_eq!((ops.post_recv.expect("op"))(b, &mut wr, &mut bad), 0);
            }
            buf[..5].copy_from_slice(b"hello");
            let mut sge = ibv_sge {
                addr: base as u64,
                length: 5,
                lkey: (*mr).lkey,
            };
            let inline = *b"inline!";
            let mut isge = ibv_sge {
                addr: inline.as_ptr() as u64,
                length: 7,
                lkey: 0,
            };
            let mut w2 = ibv_send_wr::zeroed();
            w2.wr_id = 2;
            w2.sg_list = &mut isge;
            w2.num_sge = 1;
            w2.opcode = IBV_WR_SEND_WITH_IMM;
            w2.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
            w2.imm.imm_data = 0x1234_5678_u32.to_be();
            let mut w1 = ibv_send_wr::zeroed();
            w1.wr_id = 1;
            w1.next = &mut w2;
            w1.sg_list = &mut sge;
            w1.num_sge = 1;
            w1.opcode = IBV_WR_SEND;
            w1.send_flags = IBV_SEND_SIGNALED;
            let mut bad = ptr::null_mut();
            assert_eq!((ops.post_send.expect("op"))(a, &mut w1, &mut bad), 0);

            let mut ev_cq = ptr::null_mut();
            let mut ev_ctx = ptr::null_mut();
            assert_eq!(ibv_get_cq_event(ch, &mut ev_cq, &mut ev_ctx), 0);
            assert_eq!((ev_cq, ev_ctx), (rcq, tag));
            ibv_ack_cq_events(rcq, 1);

            for id in [1, 2] {
                let wc = poll_one(ctx, scq);
                assert_eq!((wc.wr_id, wc.status, wc.opcode), (id, 0, IBV_WC_SEND));
            }
            let wc = poll_one(ctx, rcq);
            assert_eq!((wc.wr_id, wc.status, wc.byte_len), (4096, 0, 5));
            assert_eq!(
                (wc.opcode, wc.qp_num, wc.src_qp),
                (IBV_WC_RECV, (*b).qp_num, (*a).qp_num)
            );
            let wc = poll_one(ctx, rcq);
            assert_eq!((wc.wr_id, wc.byte_len), (6144, 7));
            assert_ne!(wc.wc_flags & IBV_WC_WITH_IMM, 0);
            assert_eq!(wc.imm.imm_data, 0x1234_5678_u32.to_be());
            assert_eq!(&buf[4096..4101], b"hello");
            assert_eq!(&buf[6144..6151], b"inline!");

            // SQD with the notification asked for: the SQ_DRAINED event names QP A (after
            // the PORT_ACTIVE raised when the device opened).
            let mut at = ibv_qp_attr::zeroed();
            at.qp_state = IBV_QPS_SQD;
            at.en_sqd_async_notify = 1;
            let m = IBV_QP_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY;
            assert_eq!(ibv_modify_qp(a, &mut at, m), 0);
            let mut ev = core::mem::zeroed::<ibv_async_event>();
            assert_eq!(crate::ctx::ibv_get_async_event(ctx, &mut ev), 0);
            if ev.event_type == IBV_EVENT_PORT_ACTIVE {
                // Raised for the context that brought the device up (the unit tests share
                // the process's device).
                assert_eq!(ev.element.port_num, 1);
                assert_eq!(crate::ctx::ibv_get_async_event(ctx, &mut ev), 0);
            }
            assert_eq!(ev.event_type, IBV_EVENT_SQ_DRAINED);
            assert_eq!(ev.element.qp, a);
            // Destroying the QP waits for this acknowledgement.
            crate::ctx::ibv_ack_async_event(&mut ev);

            // Objects in use cannot go: the PD has an MR and QPs, the CQs have QPs.
            assert_eq!(ibv_dealloc_pd(pd), libc::EBUSY);
            assert_eq!(ibv_destroy_cq(scq), libc::EBUSY);
            assert_eq!(ibv_destroy_cq(rcq), libc::EBUSY);
            assert_eq!(ibv_destroy_comp_channel(ch), libc::EBUSY);
            assert_eq!(ibv_destroy_qp(a), 0);
            assert_eq!(ibv_destroy_cq(scq), libc::EBUSY, "QP B still uses it");
            assert_eq!(ibv_destroy_qp(b), 0);
            assert_eq!(ibv_destroy_cq(scq), 0);
            assert_eq!(ibv_destroy_cq(rcq), 0);
            assert_eq!(ibv_destroy_comp_channel(ch), 0);
            assert_eq!(ibv_dealloc_pd(pd), libc::EBUSY, "the MR still uses it");
            assert_eq!(ibv_dereg_mr(mr), 0);
            assert_eq!(ibv_dealloc_pd(pd), 0);
            assert_eq!(ibv_close_device(ctx), 0);
        }
    }
}
