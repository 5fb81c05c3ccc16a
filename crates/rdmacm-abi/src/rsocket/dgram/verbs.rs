//! The UD QP under a datagram rsocket, made and driven through the public verbs of the
//! process's libibverbs.so.1 (resolved at their rdma-core 44 version nodes, as
//! [`crate::ibverbs`] does; the fast-path verbs through `ibv_context.ops`, as the header
//! inlines do).
//!
//! One registered buffer holds `sq_size` send slots of [`SLOT_SIZE`] bytes, then `rq_size`
//! receive slots of a 40-byte GRH area and [`SLOT_SIZE`] bytes. Work request ids name the
//! slot: receive ids have the top bit set.

use core::ffi::{c_int, c_void, CStr};
use std::collections::HashMap;
use std::sync::OnceLock;

use softverbs_sock::dgram::{DgramSizes, SLOT_SIZE};

use crate::abi::{ibv_comp_channel, ibv_context, ibv_cq, ibv_pd, ibv_qp, ibv_qp_cap};
use crate::abi::{ibv_qp_init_attr, IBV_QPT_UD, RDMA_UDP_QKEY};
use crate::devices;
use crate::errno::{errno, Errno};
use crate::ibverbs::{libibverbs, Handle, Verbs};

/// Bytes of the GRH area in front of every UD receive.
pub const GRH_LEN: usize = 40;
/// Bytes of one receive slot.
const RECV_SLOT: usize = GRH_LEN + SLOT_SIZE;
/// Marks a receive work request id.
const RECV_FLAG: u64 = 1 << 63;

/// `struct ibv_sge`
#[repr(C)]
struct Sge {
    addr: u64,
    length: u32,
    lkey: u32,
}

/// `struct ibv_send_wr` (128 bytes) with its `wr.ud` member spelled out.
#[repr(C)]
struct SendWr {
    wr_id: u64,
    next: *mut SendWr,
    sg_list: *mut Sge,
    num_sge: c_int,
    opcode: c_int,
    send_flags: u32,
    imm_data: u32,
    ud_ah: *mut c_void,
    ud_remote_qpn: u32,
    ud_remote_qkey: u32,
    wr_rest: [u64; 2],
    qp_type: u32,
    _pad: u32,
    tail: [u64; 6],
}

/// `struct ibv_recv_wr` (32 bytes).
#[repr(C)]
struct RecvWr {
    wr_id: u64,
    next: *mut RecvWr,
    sg_list: *mut Sge,
    num_sge: c_int,
}

/// `struct ibv_wc` (48 bytes).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct Wc {
    pub wr_id: u64,
    pub status: u32,
    pub opcode: u32,
    vendor_err: u32,
    pub byte_len: u32,
    imm_data: u32,
    qp_num: u32,
    src_qp: u32,
    wc_flags: u32,
    pkey_index: u16,
    slid: u16,
    sl: u8,
    dlid_path_bits: u8,
}

/// `struct ibv_ah_attr` (32 bytes) with its `struct ibv_global_route` inline.
#[repr(C, align(8))]
struct AhAttr {
    dgid: [u8; 16],
    flow_label: u32,
    sgid_index: u8,
    hop_limit: u8,
    traffic_class: u8,
    _pad: u8,
    dlid: u16,
    sl: u8,
    src_path_bits: u8,
    static_rate: u8,
    is_global: u8,
    port_num: u8,
    _pad2: u8,
}

/// `struct ibv_qp_attr` (144 bytes), written field by field at rdma-core 44's offsets.
#[repr(C, align(8))]
struct QpAttr([u8; 144]);

impl QpAttr {
    const STATE: usize = 0;
    const QKEY: usize = 16;
    const SQ_PSN: usize = 24;
    const PKEY_INDEX: usize = 120;
    const PORT_NUM: usize = 129;

    fn put_u32(&mut self, at: usize, v: u32) {
        self.0[at..at + 4].copy_from_slice(&v.to_ne_bytes());
    }
}

/// `struct ibv_mr`: librdmacm reads `lkey`.
#[repr(C)]
struct Mr {
    context: *mut ibv_context,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    handle: u32,
    lkey: u32,
    rkey: u32,
}

/// `struct ibv_comp_channel`: librdmacm reads `fd`.
#[repr(C)]
struct CompChannel {
    context: *mut ibv_context,
    fd: c_int,
    refcnt: c_int,
}

// `enum ibv_qp_state`, `enum ibv_qp_attr_mask`, `enum ibv_wr_opcode`, `enum ibv_send_flags`.
const IBV_QPS_INIT: u32 = 1;
const IBV_QPS_RTR: u32 = 2;
const IBV_QPS_RTS: u32 = 3;
const IBV_QP_STATE: c_int = 1 << 0;
const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
const IBV_QP_PORT: c_int = 1 << 5;
const IBV_QP_QKEY: c_int = 1 << 6;
const IBV_QP_SQ_PSN: c_int = 1 << 16;
const IBV_WR_SEND: c_int = 2;
const IBV_SEND_SIGNALED: u32 = 1 << 1;
const IBV_ACCESS_LOCAL_WRITE: c_int = 1;

/// Offsets of the fast-path ops in `struct ibv_context` (rdma-core 44; the header inlines
/// `ibv_poll_cq`, `ibv_req_notify_cq`, `ibv_post_send`, `ibv_post_recv` call through them).
const OPS_POLL_CQ: usize = 96;
const OPS_REQ_NOTIFY_CQ: usize = 104;
const OPS_POST_SEND: usize = 208;
const OPS_POST_RECV: usize = 216;

type PollCqFn = unsafe extern "C" fn(*mut ibv_cq, c_int, *mut Wc) -> c_int;
type ReqNotifyFn = unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int;
type PostSendFn = unsafe extern "C" fn(*mut ibv_qp, *mut SendWr, *mut *mut SendWr) -> c_int;
type PostRecvFn = unsafe extern "C" fn(*mut ibv_qp, *mut RecvWr, *mut *mut RecvWr) -> c_int;

/// The verbs beyond [`Verbs`] a datagram rsocket calls.
struct DgramVerbs {
    reg_mr: unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut Mr,
    dereg_mr: unsafe extern "C" fn(*mut Mr) -> c_int,
    modify_qp: unsafe extern "C" fn(*mut ibv_qp, *mut QpAttr, c_int) -> c_int,
    create_ah: unsafe extern "C" fn(*mut ibv_pd, *mut AhAttr) -> *mut c_void,
    destroy_ah: unsafe extern "C" fn(*mut c_void) -> c_int,
    query_gid: unsafe extern "C" fn(*mut ibv_context, u8, c_int, *mut [u8; 16]) -> c_int,
    get_cq_event:
        unsafe extern "C" fn(*mut ibv_comp_channel, *mut *mut ibv_cq, *mut *mut c_void) -> c_int,
    ack_cq_events: unsafe extern "C" fn(*mut ibv_cq, u32),
}

/// Looks `name@IBVERBS_1.1` up, as a function pointer of type `T`.
///
/// # Safety
/// `T` is the function pointer type of that symbol's C prototype.
unsafe fn symbol<T: Copy>(h: Handle, name: &CStr) -> Result<T, String> {
    let p = h.symbol(name, c"IBVERBS_1.1");
    if p.is_null() {
        return Err(format!("it has no {}@IBVERBS_1.1", name.to_string_lossy()));
    }
    debug_assert_eq!(size_of::<T>(), size_of::<*mut c_void>());
    // SAFETY: a function pointer of the symbol's own prototype (caller), pointer-sized.
    Ok(unsafe { core::mem::transmute_copy::<*mut c_void, T>(&p) })
}

impl DgramVerbs {
    fn resolve() -> Result<DgramVerbs, String> {
        let h = Handle::open("libibverbs.so.1")?;
        // SAFETY: each type is the prototype verbs.h gives the symbol.
        unsafe {
            Ok(DgramVerbs {
                reg_mr: symbol(h, c"ibv_reg_mr")?,
                dereg_mr: symbol(h, c"ibv_dereg_mr")?,
                modify_qp: symbol(h, c"ibv_modify_qp")?,
                create_ah: symbol(h, c"ibv_create_ah")?,
                destroy_ah: symbol(h, c"ibv_destroy_ah")?,
                query_gid: symbol(h, c"ibv_query_gid")?,
                get_cq_event: symbol(h, c"ibv_get_cq_event")?,
                ack_cq_events: symbol(h, c"ibv_ack_cq_events")?,
            })
        }
    }
}

/// Both verb tables, or `ENODEV` (after librdmacm said once why, for the first).
fn verbs() -> Result<(&'static Verbs, &'static DgramVerbs), Errno> {
    static DGRAM: OnceLock<Result<DgramVerbs, String>> = OnceLock::new();
    let base = libibverbs().map_err(|why| {
        crate::ibverbs::explain_no_device();
        let _ = why;
        libc::ENODEV
    })?;
    let dgram = DGRAM
        .get_or_init(DgramVerbs::resolve)
        .as_ref()
        .map_err(|_| libc::ENODEV)?;
    Ok((base, dgram))
}

/// Reads the function pointer at `offset` in `context`.
///
/// # Safety
/// `context` is a live `struct ibv_context`; `offset` is one of the `OPS_*` offsets and `T`
/// that op's prototype.
unsafe fn op<T: Copy>(context: *mut ibv_context, offset: usize) -> T {
    // SAFETY: the op lies within the context (caller); libibverbs fills every fast-path op.
    unsafe { context.cast::<u8>().add(offset).cast::<T>().read() }
}

/// A UD QP with its CQ, completion channel, registered slots and address handles.
pub struct UdQp {
    base: &'static Verbs,
    v: &'static DgramVerbs,
    context: *mut ibv_context,
    pd: *mut ibv_pd,
    channel: *mut ibv_comp_channel,
    cq: *mut ibv_cq,
    qp: *mut ibv_qp,
    mr: *mut Mr,
    buf: Box<[u8]>,
    sizes: DgramSizes,
    gid: [u8; 16],
    qpn: u32,
    ahs: HashMap<[u8; 16], *mut c_void>,
    unacked_events: u32,
}

// SAFETY: the verbs objects are libibverbs' and usable from any thread (verbs are
// thread-safe); the buffer is owned. A `UdQp` is only used under its socket's lock.
unsafe impl Send for UdQp {}

impl UdQp {
    /// Makes the QP (moved to RTS, Q_Key `RDMA_UDP_QKEY`) on the process's device, with
    /// every receive slot posted.
    pub fn create(sizes: DgramSizes) -> Result<UdQp, Errno> {
        let (base, v) = verbs()?;
        let context = *devices::contexts()?.first().ok_or(libc::ENODEV)?;
        let pd = devices::acquire(context)?;
        let buf_len = sizes.sq_size as usize * SLOT_SIZE + sizes.rq_size as usize * RECV_SLOT;
        let mut qp = UdQp {
            base,
            v,
            context,
            pd,
            channel: core::ptr::null_mut(),
            cq: core::ptr::null_mut(),
            qp: core::ptr::null_mut(),
            mr: core::ptr::null_mut(),
            buf: vec![0u8; buf_len].into_boxed_slice(),
            sizes,
            gid: [0; 16],
            qpn: 0,
            ahs: HashMap::new(),
            unacked_events: 0,
        };
        qp.build()?;
        Ok(qp)
    }

    /// Everything after the PD; on failure `Drop` frees what was made.
    fn build(&mut self) -> Result<(), Errno> {
        let fail = |p: bool| {
            if p {
                Err(errno_or(libc::ENOMEM))
            } else {
                Ok(())
            }
        };
        // SAFETY (all calls below): the context and PD are live (opened and acquired
        // above); every pointer passed points to a live local or to `self.buf`, which is
        // registered and outlives the MR.
        unsafe {
            if (self.v.query_gid)(self.context, 1, 0, &mut self.gid) != 0 {
                return Err(errno_or(libc::ENODEV));
            }
            self.channel = (self.base.create_comp_channel)(self.context);
            fail(self.channel.is_null())?;
            let fd = (*self.channel.cast::<CompChannel>()).fd;
            let flags = libc::fcntl(fd, libc::F_GETFL);
            libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
            let depth = (self.sizes.sq_size + self.sizes.rq_size) as c_int;
            self.cq =
                (self.base.create_cq)(self.context, depth, core::ptr::null_mut(), self.channel, 0);
            fail(self.cq.is_null())?;
            self.mr = (self.v.reg_mr)(
                self.pd,
                self.buf.as_mut_ptr().cast(),
                self.buf.len(),
                IBV_ACCESS_LOCAL_WRITE,
            );
            fail(self.mr.is_null())?;
            let mut init = ibv_qp_init_attr {
                qp_context: core::ptr::null_mut(),
                send_cq: self.cq,
                recv_cq: self.cq,
                srq: core::ptr::null_mut(),
                cap: ibv_qp_cap {
                    max_send_wr: self.sizes.sq_size,
                    max_recv_wr: self.sizes.rq_size,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                qp_type: IBV_QPT_UD,
                sq_sig_all: 1,
            };
            self.qp = (self.base.create_qp)(self.pd, &mut init);
            fail(self.qp.is_null())?;
            self.qpn = (*self.qp).qp_num;
            let mut attr = QpAttr([0; 144]);
            attr.put_u32(QpAttr::STATE, IBV_QPS_INIT);
            attr.put_u32(QpAttr::QKEY, RDMA_UDP_QKEY);
            attr.0[QpAttr::PKEY_INDEX] = 0;
            attr.0[QpAttr::PORT_NUM] = 1;
            self.modify(
                &mut attr,
                IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY,
            )?;
            let mut attr = QpAttr([0; 144]);
            attr.put_u32(QpAttr::STATE, IBV_QPS_RTR);
            self.modify(&mut attr, IBV_QP_STATE)?;
            let mut attr = QpAttr([0; 144]);
            attr.put_u32(QpAttr::STATE, IBV_QPS_RTS);
            attr.put_u32(QpAttr::SQ_PSN, 0);
            self.modify(&mut attr, IBV_QP_STATE | IBV_QP_SQ_PSN)?;
        }
        for slot in 0..self.sizes.rq_size {
            self.post_recv(slot)?;
        }
        // Armed from the start, so the first completion wakes a waiter (rsocket.c's
        // rs_create_cq does the same).
        self.arm();
        Ok(())
    }

    /// `ibv_modify_qp`
    fn modify(&mut self, attr: &mut QpAttr, mask: c_int) -> Result<(), Errno> {
        // SAFETY: a live QP and a 144-byte attribute block.
        match unsafe { (self.v.modify_qp)(self.qp, attr, mask) } {
            0 => Ok(()),
            e => Err(e),
        }
    }

    /// Its QP number.
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// Its device's GID.
    pub fn gid(&self) -> [u8; 16] {
        self.gid
    }

    /// The completion channel's descriptor (readable when the armed CQ got a completion).
    pub fn channel_fd(&self) -> c_int {
        // SAFETY: a live channel, whose `fd` field librdmacm may read.
        unsafe { (*self.channel.cast::<CompChannel>()).fd }
    }

    /// Send slot `slot`'s bytes.
    pub fn send_slot(&mut self, slot: u32) -> &mut [u8] {
        let at = slot as usize * SLOT_SIZE;
        &mut self.buf[at..at + SLOT_SIZE]
    }

    /// The UD payload (past the GRH area) of receive slot `slot` after a completion of
    /// `byte_len` bytes (GRH area included); empty when the length is not one the slot can
    /// hold.
    pub fn recv_payload(&self, slot: u32, byte_len: u32) -> &[u8] {
        let at = self.sizes.sq_size as usize * SLOT_SIZE + slot as usize * RECV_SLOT;
        let len = (byte_len as usize).clamp(GRH_LEN, RECV_SLOT);
        &self.buf[at + GRH_LEN..at + len]
    }

    /// Posts receive slot `slot` again.
    pub fn post_recv(&mut self, slot: u32) -> Result<(), Errno> {
        if slot >= self.sizes.rq_size {
            return Err(libc::EINVAL);
        }
        let at = self.sizes.sq_size as usize * SLOT_SIZE + slot as usize * RECV_SLOT;
        let mut sge = Sge {
            addr: self.buf[at..].as_ptr() as u64,
            length: RECV_SLOT as u32,
            // SAFETY: a live MR.
            lkey: unsafe { (*self.mr).lkey },
        };
        let mut wr = RecvWr {
            wr_id: RECV_FLAG | u64::from(slot),
            next: core::ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        let mut bad = core::ptr::null_mut();
        // SAFETY: the op of a live context, given a live QP and a work request that points
        // to a registered slot of `self.buf`.
        let r = unsafe {
            let post: PostRecvFn = op(self.context, OPS_POST_RECV);
            post(self.qp, &mut wr, &mut bad)
        };
        if r == 0 {
            Ok(())
        } else {
            Err(r)
        }
    }

    /// The address handle for device `gid`, made on first use.
    fn ah(&mut self, gid: [u8; 16]) -> Result<*mut c_void, Errno> {
        if let Some(&ah) = self.ahs.get(&gid) {
            return Ok(ah);
        }
        let mut attr = AhAttr {
            dgid: gid,
            flow_label: 0,
            sgid_index: 0,
            hop_limit: 64,
            traffic_class: 0,
            _pad: 0,
            dlid: 0,
            sl: 0,
            src_path_bits: 0,
            static_rate: 0,
            is_global: 1,
            port_num: 1,
            _pad2: 0,
        };
        // SAFETY: a live PD and a 32-byte attribute block.
        let ah = unsafe { (self.v.create_ah)(self.pd, &mut attr) };
        if ah.is_null() {
            return Err(errno_or(libc::EHOSTUNREACH));
        }
        self.ahs.insert(gid, ah);
        Ok(ah)
    }

    /// Posts send slot `slot`'s first `len` bytes as a UD SEND to QP `qpn` on device `gid`.
    pub fn post_send(
        &mut self,
        slot: u32,
        len: usize,
        gid: [u8; 16],
        qpn: u32,
    ) -> Result<(), Errno> {
        if slot >= self.sizes.sq_size || len > SLOT_SIZE {
            return Err(libc::EINVAL);
        }
        let ah = self.ah(gid)?;
        let mut sge = Sge {
            addr: self.buf[slot as usize * SLOT_SIZE..].as_ptr() as u64,
            length: len as u32,
            // SAFETY: a live MR.
            lkey: unsafe { (*self.mr).lkey },
        };
        let mut wr = SendWr {
            wr_id: u64::from(slot),
            next: core::ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
            opcode: IBV_WR_SEND,
            send_flags: IBV_SEND_SIGNALED,
            imm_data: 0,
            ud_ah: ah,
            ud_remote_qpn: qpn,
            ud_remote_qkey: RDMA_UDP_QKEY,
            wr_rest: [0; 2],
            qp_type: 0,
            _pad: 0,
            tail: [0; 6],
        };
        let mut bad = core::ptr::null_mut();
        // SAFETY: the op of a live context, given a live QP, a live AH and a work request
        // that points to a registered slot of `self.buf`.
        let r = unsafe {
            let post: PostSendFn = op(self.context, OPS_POST_SEND);
            post(self.qp, &mut wr, &mut bad)
        };
        if r == 0 {
            Ok(())
        } else {
            Err(r)
        }
    }

    /// Polls up to `wcs.len()` completions into `out`; returns how many.
    pub fn poll(&mut self, wcs: &mut [Wc], out: &mut Vec<Completion>) -> usize {
        // SAFETY: the op of a live context, given a live CQ and room for `wcs.len()`.
        let n = unsafe {
            let poll: PollCqFn = op(self.context, OPS_POLL_CQ);
            poll(self.cq, wcs.len() as c_int, wcs.as_mut_ptr())
        };
        let n = n.max(0) as usize;
        out.extend(wcs[..n].iter().map(|wc| {
            let slot = (wc.wr_id & !RECV_FLAG) as u32;
            let ok = wc.status == 0;
            if wc.wr_id & RECV_FLAG != 0 {
                Completion::Recv {
                    slot,
                    byte_len: ok.then_some(wc.byte_len),
                }
            } else {
                Completion::Send { slot }
            }
        }));
        n
    }

    /// Asks for an event on the next completion (`ibv_req_notify_cq`).
    pub fn arm(&mut self) {
        // SAFETY: the op of a live context, given a live CQ.
        unsafe {
            let notify: ReqNotifyFn = op(self.context, OPS_REQ_NOTIFY_CQ);
            notify(self.cq, 0);
        }
    }

    /// Takes every pending completion event off the (non-blocking) channel and acknowledges
    /// them.
    pub fn drain_events(&mut self) {
        loop {
            let mut cq = core::ptr::null_mut();
            let mut ctx = core::ptr::null_mut();
            // SAFETY: a live channel made non-blocking; out-pointers to locals.
            if unsafe { (self.v.get_cq_event)(self.channel, &mut cq, &mut ctx) } != 0 {
                break;
            }
            self.unacked_events += 1;
        }
        if self.unacked_events > 0 {
            // SAFETY: a live CQ and the number of events taken from it.
            unsafe { (self.v.ack_cq_events)(self.cq, self.unacked_events) };
            self.unacked_events = 0;
        }
    }
}

/// One completion.
pub enum Completion {
    /// A receive in `slot` finished: `byte_len` (GRH area included) when it succeeded.
    Recv { slot: u32, byte_len: Option<u32> },
    /// A send from `slot` finished (either way).
    Send { slot: u32 },
}

/// This thread's errno, or `fallback` when a verb left it 0.
fn errno_or(fallback: Errno) -> Errno {
    match errno() {
        0 => fallback,
        e => e,
    }
}

impl Drop for UdQp {
    fn drop(&mut self) {
        // SAFETY: each object was made here, is destroyed once, children first.
        unsafe {
            if !self.qp.is_null() {
                (self.base.destroy_qp)(self.qp);
            }
            for (_, ah) in self.ahs.drain() {
                (self.v.destroy_ah)(ah);
            }
            if !self.mr.is_null() {
                (self.v.dereg_mr)(self.mr);
            }
            if !self.cq.is_null() {
                self.drain_events();
                (self.base.destroy_cq)(self.cq);
            }
            if !self.channel.is_null() {
                (self.base.destroy_comp_channel)(self.channel);
            }
        }
        devices::release(self.context);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The mirrors' sizes and the offsets used, as rdma-core 44's headers lay them out
    /// (the project's struct-layout reference; tests/layout.rs checks the shared ones
    /// against the installed headers).
    #[test]
    fn mirrors_match_rdma_core_44() {
        assert_eq!(size_of::<SendWr>(), 128);
        assert_eq!(core::mem::offset_of!(SendWr, ud_ah), 40);
        assert_eq!(core::mem::offset_of!(SendWr, ud_remote_qkey), 52);
        assert_eq!(core::mem::offset_of!(SendWr, qp_type), 72);
        assert_eq!(size_of::<RecvWr>(), 32);
        assert_eq!(size_of::<Wc>(), 48);
        assert_eq!(core::mem::offset_of!(Wc, byte_len), 20);
        assert_eq!(size_of::<AhAttr>(), 32);
        assert_eq!(core::mem::offset_of!(AhAttr, dlid), 24);
        assert_eq!(core::mem::offset_of!(AhAttr, is_global), 29);
        assert_eq!(core::mem::offset_of!(AhAttr, port_num), 30);
        assert_eq!(size_of::<QpAttr>(), 144);
        assert_eq!(core::mem::offset_of!(Mr, lkey), 36);
        assert_eq!(core::mem::offset_of!(CompChannel, fd), 8);
        assert_eq!(size_of::<Sge>(), 16);
    }
}
