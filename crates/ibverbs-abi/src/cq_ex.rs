//! Extended CQs: the `create_cq_ex` op (reached through the header inline
//! `ibv_create_cq_ex`) and the `ibv_cq_ex` polling ops (`ibv_start_poll`, `ibv_next_poll`,
//! `ibv_end_poll`, `ibv_wc_read_*`, all header inlines jumping through the struct).
//!
//! Every CQ is a [`SoftCq`] whose first field is an `ibv_cq_ex` with these ops set, whether
//! it was made by `ibv_create_cq` or `create_cq_ex`, so `ibv_cq_ex_to_cq` (a cast) and the
//! `ibv_cq` calls (`ibv_poll_cq`, `ibv_req_notify_cq`, comp channels, `ibv_destroy_cq`) work
//! on both.
//!
//! Between `start_poll` and `end_poll` the current completion lives in the CQ's
//! [`PollState`]; `start_poll`/`next_poll` also store its `status` and `wr_id` in the
//! `ibv_cq_ex`, which the header inlines read directly.
//!
//! Completion timestamps (`IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`) are `CLOCK_MONOTONIC`
//! nanoseconds taken when the completion is polled; `query_device_ex` reports
//! `hca_core_clock` = [`HCA_CORE_CLOCK_KHZ`] (1 GHz: one tick per ns) and a full 64-bit
//! `completion_timestamp_mask`. The wall-clock variant is `CLOCK_REALTIME` nanoseconds.

use core::ffi::{c_int, c_uint};
use core::ptr;
use std::sync::{Mutex, MutexGuard};

use crate::abi::*;
use crate::stubs::ret_null;
use crate::verbs::{create_cq_common, wc_to_c, SoftCq};

/// `IBV_WC_EX_WITH_BYTE_LEN`
pub const IBV_WC_EX_WITH_BYTE_LEN: u64 = 1 << 0;
/// `IBV_WC_EX_WITH_IMM`
pub const IBV_WC_EX_WITH_IMM: u64 = 1 << 1;
/// `IBV_WC_EX_WITH_QP_NUM`
pub const IBV_WC_EX_WITH_QP_NUM: u64 = 1 << 2;
/// `IBV_WC_EX_WITH_SRC_QP`
pub const IBV_WC_EX_WITH_SRC_QP: u64 = 1 << 3;
/// `IBV_WC_EX_WITH_SLID`
pub const IBV_WC_EX_WITH_SLID: u64 = 1 << 4;
/// `IBV_WC_EX_WITH_SL`
pub const IBV_WC_EX_WITH_SL: u64 = 1 << 5;
/// `IBV_WC_EX_WITH_DLID_PATH_BITS`
pub const IBV_WC_EX_WITH_DLID_PATH_BITS: u64 = 1 << 6;
/// `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`
pub const IBV_WC_EX_WITH_COMPLETION_TIMESTAMP: u64 = 1 << 7;
/// `IBV_WC_EX_WITH_CVLAN` (unsupported)
pub const IBV_WC_EX_WITH_CVLAN: u64 = 1 << 8;
/// `IBV_WC_EX_WITH_FLOW_TAG` (unsupported)
pub const IBV_WC_EX_WITH_FLOW_TAG: u64 = 1 << 9;
/// `IBV_WC_EX_WITH_TM_INFO` (unsupported)
pub const IBV_WC_EX_WITH_TM_INFO: u64 = 1 << 10;
/// `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK`
pub const IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK: u64 = 1 << 11;

/// `IBV_WC_STANDARD_FLAGS`: what `ibv_wc` carries; the flags of a CQ from `ibv_create_cq`.
pub const STANDARD_WC_FLAGS: u64 = IBV_WC_EX_WITH_BYTE_LEN
    | IBV_WC_EX_WITH_IMM
    | IBV_WC_EX_WITH_QP_NUM
    | IBV_WC_EX_WITH_SRC_QP
    | IBV_WC_EX_WITH_SLID
    | IBV_WC_EX_WITH_SL
    | IBV_WC_EX_WITH_DLID_PATH_BITS;

/// The `wc_flags` `create_cq_ex` accepts; others fail with EOPNOTSUPP.
pub const SUPPORTED_WC_FLAGS: u64 = STANDARD_WC_FLAGS
    | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP
    | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK;

/// `IBV_CQ_INIT_ATTR_MASK_FLAGS`
const IBV_CQ_INIT_ATTR_MASK_FLAGS: u32 = 1 << 0;
/// `IBV_CQ_INIT_ATTR_MASK_PD` (parent domains: unsupported)
const IBV_CQ_INIT_ATTR_MASK_PD: u32 = 1 << 1;
/// `IBV_CREATE_CQ_ATTR_SINGLE_THREADED`: a hint, accepted and ignored.
const IBV_CREATE_CQ_ATTR_SINGLE_THREADED: u32 = 1 << 0;

/// `hca_core_clock` reported by `query_device_ex`, in kHz: completion timestamps count
/// nanoseconds of `CLOCK_MONOTONIC`, i.e. a 1 GHz clock.
pub const HCA_CORE_CLOCK_KHZ: u64 = 1_000_000;

/// The completion being read between `start_poll` and `end_poll`.
struct Current {
    wc: ibv_wc,
    /// `CLOCK_MONOTONIC` ns when polled (0 unless the CQ asked for timestamps).
    ts: u64,
    /// `CLOCK_REALTIME` ns when polled (0 unless the CQ asked for wall-clock timestamps).
    wallclock: u64,
}

/// The extended-poll state of a CQ.
pub struct PollState {
    /// The `IBV_WC_EX_WITH_*` flags the CQ was created with.
    wc_flags: u64,
    /// The current completion. A mutex, although verbs has the application serialise
    /// `start_poll` .. `end_poll` per CQ, so that misuse cannot be a data race.
    cur: Mutex<Current>,
}

impl PollState {
    /// State for a CQ created with `wc_flags`.
    pub fn new(wc_flags: u64) -> PollState {
        PollState {
            wc_flags,
            cur: Mutex::new(Current {
                wc: ibv_wc::zeroed(),
                ts: 0,
                wallclock: 0,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Current> {
        self.cur.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Sets the polling ops of a new CQ (every CQ has them).
pub(crate) fn install_cq_ex_ops(cq: &mut ibv_cq_ex) {
    cq.start_poll = Some(start_poll);
    cq.next_poll = Some(next_poll);
    cq.end_poll = Some(end_poll);
    cq.read_opcode = Some(read_opcode);
    cq.read_vendor_err = Some(read_vendor_err);
    cq.read_byte_len = Some(read_byte_len);
    cq.read_imm_data = Some(read_imm_data);
    cq.read_qp_num = Some(read_qp_num);
    cq.read_src_qp = Some(read_src_qp);
    cq.read_wc_flags = Some(read_wc_flags);
    cq.read_slid = Some(read_slid);
    cq.read_sl = Some(read_sl);
    cq.read_dlid_path_bits = Some(read_dlid_path_bits);
    cq.read_completion_ts = Some(read_completion_ts);
    cq.read_cvlan = Some(read_cvlan);
    cq.read_flow_tag = Some(read_flow_tag);
    cq.read_tm_info = Some(read_tm_info);
    cq.read_completion_wallclock_ns = Some(read_completion_wallclock_ns);
}

/// The `create_cq_ex` op of `verbs_context`.
///
/// # Safety
/// `context` from `ibv_open_device`; `attr` NULL or valid; `attr.channel` NULL or from
/// `ibv_create_comp_channel`.
pub(crate) unsafe extern "C" fn create_cq_ex(
    context: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    if attr.is_null() {
        return ret_null(libc::EINVAL);
    }
    // SAFETY: `attr` is valid per the contract.
    let a = unsafe { &*attr };
    let bad = if a.wc_flags & !SUPPORTED_WC_FLAGS != 0
        || a.comp_mask & !(IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD) != 0
        || a.comp_mask & IBV_CQ_INIT_ATTR_MASK_PD != 0 && !a.parent_domain.is_null()
    {
        Some(libc::EOPNOTSUPP)
    } else if a.comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS != 0
        && a.flags & !IBV_CREATE_CQ_ATTR_SINGLE_THREADED != 0
    {
        // IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN and unknown flags.
        Some(libc::EOPNOTSUPP)
    } else {
        None
    };
    if let Some(e) = bad {
        return ret_null(e);
    }
    let Ok(comp_vector) = c_int::try_from(a.comp_vector) else {
        return ret_null(libc::EINVAL);
    };
    // SAFETY: forwarded contract.
    let cq = unsafe {
        create_cq_common(
            context,
            a.cqe,
            a.cq_context,
            a.channel,
            comp_vector,
            a.wc_flags,
        )
    };
    cq.cast()
}

/// The parts of the [`SoftCq`] behind `cq` the polling ops use, without a reference to its
/// `ibv_cq_ex` (whose `status`/`wr_id` they write).
///
/// # Safety
/// `cq` is NULL or a live CQ from this library.
unsafe fn parts<'a>(cq: *mut ibv_cq_ex) -> Option<(&'a softverbs::Cq, &'a PollState)> {
    if cq.is_null() {
        return None;
    }
    let s = cq.cast::<SoftCq>();
    // SAFETY: per the contract `cq` is the first field of a live `SoftCq`; only the
    // `inner` and `ex` fields are borrowed.
    Some(unsafe { (&(*s).inner, &(*s).ex) })
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec to write; the clocks used always exist.
    unsafe { libc::clock_gettime(clock, &mut t) };
    (t.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(t.tv_nsec as u64)
}

/// Takes the next completion into the current one: 0 or ENOENT. `start_poll` (`first`)
/// receives what waits on the socket when the CQ is empty, so an application spinning on
/// `ibv_start_poll` needs no other thread; `next_poll` only takes what is in the CQ already,
/// as hardware does: otherwise it would pull in a completion that raises an armed event
/// and consume it at once, and an application that polls once per event (`ibv_rc_pingpong
/// -t -e`) would then find the CQ empty after that event.
///
/// # Safety
/// `cq` is a live CQ from this library.
unsafe fn advance(cq: *mut ibv_cq_ex, first: bool) -> c_int {
    // SAFETY: per the contract.
    let Some((inner, st)) = (unsafe { parts(cq) }) else {
        return libc::EINVAL;
    };
    let mut one = [softverbs::WorkCompletion::default()];
    let n = if first {
        inner.poll(&mut one)
    } else {
        inner.poll_ready(&mut one)
    };
    if n == 0 {
        return libc::ENOENT;
    }
    let wc = wc_to_c(&one[0]);
    let mut cur = st.lock();
    cur.wc = wc;
    if st.wc_flags & IBV_WC_EX_WITH_COMPLETION_TIMESTAMP != 0 {
        cur.ts = clock_ns(libc::CLOCK_MONOTONIC);
    }
    if st.wc_flags & IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK != 0 {
        cur.wallclock = clock_ns(libc::CLOCK_REALTIME);
    }
    // SAFETY: `cq` is live; the header inlines read `status` and `wr_id` directly, and no
    // Rust reference to these fields exists.
    unsafe {
        ptr::addr_of_mut!((*cq).status).write(wc.status);
        ptr::addr_of_mut!((*cq).wr_id).write(wc.wr_id);
    }
    0
}

/// `start_poll`: 0 with the first completion current, ENOENT when the CQ is empty.
unsafe extern "C" fn start_poll(cq: *mut ibv_cq_ex, attr: *mut ibv_poll_cq_attr) -> c_int {
    // SAFETY: `attr` is NULL or valid per the verbs contract.
    if !attr.is_null() && unsafe { (*attr).comp_mask } != 0 {
        return libc::EINVAL;
    }
    // SAFETY: the inline passes a CQ of this library.
    unsafe { advance(cq, true) }
}

/// `next_poll`: 0 with the next completion current, ENOENT when there is none.
unsafe extern "C" fn next_poll(cq: *mut ibv_cq_ex) -> c_int {
    // SAFETY: the inline passes a CQ of this library.
    unsafe { advance(cq, false) }
}

/// `end_poll`: the completions read are consumed already; nothing to release.
unsafe extern "C" fn end_poll(_cq: *mut ibv_cq_ex) {}

/// Applies `f` to the current completion (a default value for a NULL CQ).
///
/// # Safety
/// `cq` is NULL or a live CQ from this library.
unsafe fn with_cur<T: Default>(cq: *mut ibv_cq_ex, f: impl FnOnce(&Current) -> T) -> T {
    // SAFETY: per the contract.
    match unsafe { parts(cq) } {
        Some((_, st)) => f(&st.lock()),
        None => T::default(),
    }
}

unsafe extern "C" fn read_opcode(cq: *mut ibv_cq_ex) -> c_int {
    // SAFETY: the inline passes a CQ of this library.
    unsafe { with_cur(cq, |c| c.wc.opcode) }
}

unsafe extern "C" fn read_vendor_err(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: the inline passes a CQ of this library.
    unsafe { with_cur(cq, |c| c.wc.vendor_err) }
}

unsafe extern "C" fn read_byte_len(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: the inline passes a CQ of this library.
    unsafe { with_cur(cq, |c| c.wc.byte_len) }
}

/// `read_imm_data` (also `ibv_wc_read_invalidated_rkey`: the same union).
unsafe extern "C" fn read_imm_data(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: the inline passes a CQ of this library; both union members are `u32`.
    unsafe { with_cur(cq, |c| c.wc.imm.imm_data) }
}

unsafe extern "C" fn read_qp_num(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: the inline passes a CQ of this library.
    unsafe { with_cur(cq, |c| c.wc.qp_num) }
}

unsafe extern "C" fn read_src_qp(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: the inline passes a CQ of this library.
    unsafe { with_cur(cq, |c| c.wc.src_qp) }
}

unsafe extern "C" fn read_wc_flags(cq: *mut ibv_cq_ex) -> c_uint {
    // SAFETY: the inline passes a CQ of this library.
    unsafe { with_cur(cq, |c| c.wc.wc_flags) }
}

unsafe extern "C" fn read_slid(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: the inline passes a CQ of this library.
    unsafe { with_cur(cq, |c| u32::from(c.wc.slid)) }
}

unsafe extern "C" fn read_sl(cq: *mut ibv_cq_ex) -> u8 {
    // SAFETY: the inline passes a CQ of this library.
    unsafe { with_cur(cq, |c| c.wc.sl) }
}

unsafe extern "C" fn read_dlid_path_bits(cq: *mut ibv_cq_ex) -> u8 {
    // SAFETY: the inline passes a CQ of this library.
    unsafe { with_cur(cq, |c| c.wc.dlid_path_bits) }
}

unsafe extern "C" fn read_completion_ts(cq: *mut ibv_cq_ex) -> u64 {
    // SAFETY: the inline passes a CQ of this library.
    unsafe { with_cur(cq, |c| c.ts) }
}

unsafe extern "C" fn read_completion_wallclock_ns(cq: *mut ibv_cq_ex) -> u64 {
    // SAFETY: the inline passes a CQ of this library.
    unsafe { with_cur(cq, |c| c.wallclock) }
}

/// `read_cvlan`: no VLANs (the flag is refused at creation).
unsafe extern "C" fn read_cvlan(_cq: *mut ibv_cq_ex) -> u16 {
    0
}

/// `read_flow_tag`: no flow steering (the flag is refused at creation).
unsafe extern "C" fn read_flow_tag(_cq: *mut ibv_cq_ex) -> u32 {
    0
}

/// `struct ibv_wc_tm_info { uint64_t tag; uint32_t priv; }` (16 bytes).
const WC_TM_INFO_SIZE: usize = 16;

/// `read_tm_info`: no tag matching (the flag is refused at creation); reports zeros.
unsafe extern "C" fn read_tm_info(_cq: *mut ibv_cq_ex, info: *mut ibv_wc_tm_info) {
    if !info.is_null() {
        // SAFETY: `info` points at a caller's `struct ibv_wc_tm_info`.
        unsafe { ptr::write_bytes(info.cast::<u8>(), 0, WC_TM_INFO_SIZE) };
    }
}
