//! Opened devices: `ibv_open_device` and the queries on an `ibv_context`.
//!
//! Each context is a [`SoftContext`]: a `verbs_context` (whose last field is the
//! `ibv_context` handed to C, so the header inlines find the extended ops right before it)
//! followed by the [`softverbs::Context`] doing the work.

use core::ffi::{c_char, c_int, c_uint, c_void};
use core::mem::offset_of;
use core::ptr;

use std::collections::HashMap;
use std::sync::Mutex;

use crate::abi::*;
use crate::device;
use crate::stubs::{ret_null, set_errno};

/// What an `ibv_context *` from `ibv_open_device` points into.
#[repr(C)]
pub struct SoftContext {
    /// Must be the first field; its `context` is the `ibv_context` C sees.
    pub vctx: verbs_context,
    /// The opened softverbs device.
    pub ctx: softverbs::Context,
    /// The context's QPs, CQs and SRQs by engine handle, for async events.
    pub(crate) objects: Mutex<ObjectIndex>,
}

/// The C objects of one context (their wrappers' addresses) by engine handle, so an async
/// event can name the `ibv_qp` / `ibv_cq` / `ibv_srq` it is about. Objects are listed
/// while they live: created, then listed; unlisted, then freed.
#[derive(Default)]
pub(crate) struct ObjectIndex {
    pub qps: HashMap<softverbs::QpHandle, usize>,
    pub cqs: HashMap<softverbs::CqHandle, usize>,
    pub srqs: HashMap<softverbs::SrqHandle, usize>,
}

/// Updates the object index of `context` (a live context; NULL does nothing).
pub(crate) fn with_objects(context: *mut ibv_context, f: impl FnOnce(&mut ObjectIndex)) {
    // SAFETY: objects of a context are created and destroyed while it is open.
    if let Some(s) = unsafe { soft(context) } {
        f(&mut s.objects.lock().unwrap_or_else(|e| e.into_inner()));
    }
}

/// The [`SoftContext`] around `ctx`, or None for NULL.
///
/// # Safety
/// `ctx` is NULL or came from `ibv_open_device` and was not closed.
pub unsafe fn soft<'a>(ctx: *mut ibv_context) -> Option<&'a SoftContext> {
    if ctx.is_null() {
        return None;
    }
    // SAFETY: per the contract `ctx` is the `context` field of a live `SoftContext`'s
    // `verbs_context`, which is its first field.
    Some(unsafe {
        &*ctx
            .byte_sub(offset_of!(verbs_context, context))
            .cast::<SoftContext>()
    })
}

fn mtu_to_c(m: softverbs::Mtu) -> c_int {
    match m {
        softverbs::Mtu::Mtu256 => IBV_MTU_256,
        softverbs::Mtu::Mtu512 => IBV_MTU_512,
        softverbs::Mtu::Mtu1024 => IBV_MTU_1024,
        softverbs::Mtu::Mtu2048 => IBV_MTU_2048,
        softverbs::Mtu::Mtu4096 => IBV_MTU_4096,
    }
}

fn clamp(v: u32) -> c_int {
    c_int::try_from(v).unwrap_or(c_int::MAX)
}

extern "C" fn close_xrcd(_: *mut ibv_xrcd) -> c_int {
    libc::EOPNOTSUPP
}

/// `ibv_open_device`.
///
/// # Safety
/// `device` is NULL or a device from `ibv_get_device_list`.
pub unsafe extern "C" fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context {
    let Some(dev) = device::lookup(device) else {
        return ret_null(libc::EINVAL);
    };
    let opened = softverbs::Device::list()
        .map_err(|e| e.to_string())
        .and_then(|mut l| l.remove(0).open().map_err(|e| e.to_string()));
    let ctx = match opened {
        Ok(c) => c,
        Err(e) => {
            eprintln!("softverbs: cannot open softverbs0: {e}");
            return ret_null(libc::ENODEV);
        }
    };
    let mut vctx = verbs_context::zeroed();
    vctx.query_port = Some(query_port_ex);
    vctx.query_device_ex = Some(query_device_ex);
    vctx.close_xrcd = Some(close_xrcd);
    vctx.create_cq_ex = Some(crate::cq_ex::create_cq_ex);
    vctx.create_qp_ex = Some(crate::ex::create_qp_ex);
    vctx.sz = size_of::<verbs_context>();
    vctx.context.device = ptr::from_ref(&dev.ibv).cast_mut();
    vctx.context.ops._compat_query_device = Some(ibv_query_device);
    crate::verbs::install_ops(&mut vctx.context.ops);
    crate::mw::install_mw_ops(&mut vctx.context.ops);
    vctx.context.cmd_fd = -1;
    vctx.context.async_fd = ctx.async_fd();
    vctx.context.num_comp_vectors = 1;
    vctx.context.abi_compat = VERBS_ABI_IS_EXTENDED;
    let soft = Box::into_raw(Box::new(SoftContext {
        vctx,
        ctx,
        objects: Mutex::new(ObjectIndex::default()),
    }));
    // SAFETY: `soft` is a fresh, valid allocation.
    unsafe { &raw mut (*soft).vctx.context }
}

/// `ibv_close_device`.
///
/// # Safety
/// `context` is NULL or came from `ibv_open_device` and was not closed.
pub unsafe extern "C" fn ibv_close_device(context: *mut ibv_context) -> c_int {
    // SAFETY: per the contract.
    let Some(s) = (unsafe { soft(context) }) else {
        return libc::EINVAL;
    };
    // SAFETY: `s` was created by Box::into_raw in `ibv_open_device` and is freed once.
    drop(unsafe { Box::from_raw(ptr::from_ref(s).cast_mut()) });
    0
}

fn device_attr(s: &SoftContext) -> ibv_device_attr {
    let d = s.ctx.query_device();
    let mut a = ibv_device_attr::zeroed();
    for (dst, &b) in a.fw_ver.iter_mut().zip(b"softverbs 0.1.0") {
        *dst = b as c_char;
    }
    a.node_guid = d.node_guid.to_be();
    a.sys_image_guid = d.node_guid.to_be();
    a.max_mr_size = d.max_mr_size;
    a.page_size_cap = 0x1000;
    a.max_qp = clamp(d.max_qp);
    a.max_qp_wr = clamp(d.max_qp_wr);
    a.max_sge = clamp(d.max_sge);
    a.max_sge_rd = clamp(d.max_sge);
    a.max_cq = clamp(d.max_cq);
    a.max_cqe = clamp(d.max_cqe);
    a.max_mr = clamp(d.max_mr);
    a.max_pd = clamp(d.max_pd);
    a.max_qp_rd_atom = c_int::from(d.max_qp_rd_atom);
    a.max_res_rd_atom = c_int::from(d.max_qp_rd_atom);
    a.max_qp_init_rd_atom = c_int::from(d.max_qp_init_rd_atom);
    a.atomic_cap = if d.atomic_cap_hca {
        IBV_ATOMIC_HCA
    } else {
        IBV_ATOMIC_NONE
    };
    a.max_ah = c_int::MAX;
    a.max_pkeys = 1;
    a.local_ca_ack_delay = 15;
    a.phys_port_cnt = d.phys_port_cnt;
    a
}

/// `ibv_query_device`.
///
/// # Safety
/// `context` from `ibv_open_device`; `attr` valid for writing an `ibv_device_attr`.
pub unsafe extern "C" fn ibv_query_device(
    context: *mut ibv_context,
    attr: *mut ibv_device_attr,
) -> c_int {
    // SAFETY: per the contract.
    let Some(s) = (unsafe { soft(context) }) else {
        return libc::EINVAL;
    };
    if attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: `attr` is writable per the contract.
    unsafe { attr.write(device_attr(s)) };
    0
}

/// The `query_device_ex` op (also reached by the header inline `ibv_query_device_ex`).
unsafe extern "C" fn query_device_ex(
    context: *mut ibv_context,
    _input: *const c_void,
    attr: *mut ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    // SAFETY: the caller passes a context from `ibv_open_device`.
    let Some(s) = (unsafe { soft(context) }) else {
        return libc::EINVAL;
    };
    if attr.is_null() || attr_size < size_of::<ibv_device_attr>() {
        return libc::EINVAL;
    }
    let mut ex = ibv_device_attr_ex::zeroed();
    ex.orig_attr = device_attr(s);
    ex.phys_port_cnt_ex = u32::from(ex.orig_attr.phys_port_cnt);
    // Completion timestamps are CLOCK_MONOTONIC ns (crate::cq_ex): a 1 GHz, 64-bit clock.
    ex.completion_timestamp_mask = u64::MAX;
    ex.hca_core_clock = crate::cq_ex::HCA_CORE_CLOCK_KHZ;
    let n = attr_size.min(size_of::<ibv_device_attr_ex>());
    // SAFETY: the caller's buffer holds `attr_size >= n` bytes.
    unsafe { ptr::copy_nonoverlapping(ptr::from_ref(&ex).cast::<u8>(), attr.cast::<u8>(), n) };
    0
}

/// `int ibv_query_device_ex(ctx, input, attr)` as an exported symbol (the header's inline
/// calls the op; this covers programs that call the symbol).
///
/// # Safety
/// As the op: `attr` holds a full `ibv_device_attr_ex`.
pub unsafe extern "C" fn ibv_query_device_ex(
    context: *mut ibv_context,
    input: *const c_void,
    attr: *mut ibv_device_attr_ex,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { query_device_ex(context, input, attr, size_of::<ibv_device_attr_ex>()) }
}

fn port_attr(s: &SoftContext, port: u8) -> Option<ibv_port_attr> {
    let p = s.ctx.query_port(port).ok()?;
    let mut a = ibv_port_attr::zeroed();
    a.state = IBV_PORT_ACTIVE;
    a.max_mtu = mtu_to_c(p.max_mtu);
    a.active_mtu = mtu_to_c(p.active_mtu);
    a.gid_tbl_len = clamp(p.gid_tbl_len);
    a.port_cap_flags = 1 << 26; // IBV_PORT_IP_BASED_GIDS
    a.max_msg_sz = s.ctx.query_device().max_msg_size;
    a.pkey_tbl_len = 1;
    a.lid = p.lid;
    a.active_width = 1; // 1x
    a.active_speed = 32; // 25 Gb/s (EDR)
    a.phys_state = 5; // LinkUp
    a.link_layer = IBV_LINK_LAYER_ETHERNET;
    Some(a)
}

/// The extended `query_port` op: fills `min(port_attr_len, 52)` bytes.
unsafe extern "C" fn query_port_ex(
    context: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
    attr_len: usize,
) -> c_int {
    // SAFETY: the caller passes a context from `ibv_open_device`.
    let Some(s) = (unsafe { soft(context) }) else {
        return libc::EINVAL;
    };
    let Some(a) = port_attr(s, port) else {
        return libc::EINVAL;
    };
    if attr.is_null() {
        return libc::EINVAL;
    }
    let n = attr_len.min(size_of::<ibv_port_attr>());
    // SAFETY: the caller's buffer holds `attr_len >= n` bytes.
    unsafe { ptr::copy_nonoverlapping(ptr::from_ref(&a).cast::<u8>(), attr.cast::<u8>(), n) };
    0
}

/// `ibv_query_port@@IBVERBS_1.1`: the old 48-byte `ibv_port_attr`.
///
/// # Safety
/// `context` from `ibv_open_device`; `attr` writable for 48 bytes.
pub unsafe extern "C" fn ibv_query_port(
    context: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { query_port_ex(context, port, attr, COMPAT_PORT_ATTR_SIZE) }
}

/// `ibv_query_gid`: 0 or -1.
///
/// # Safety
/// `context` from `ibv_open_device`; `gid` writable.
pub unsafe extern "C" fn ibv_query_gid(
    context: *mut ibv_context,
    port: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    // SAFETY: per the contract.
    let Some(s) = (unsafe { soft(context) }) else {
        return -1;
    };
    let Ok(i) = u16::try_from(index) else {
        return -1;
    };
    match s.ctx.query_gid(port, i) {
        Ok(g) if !gid.is_null() => {
            // SAFETY: `gid` is writable per the contract.
            unsafe { gid.write(ibv_gid { raw: g.0 }) };
            0
        }
        _ => -1,
    }
}

/// `ibv_query_pkey`: the default P_Key 0xffff at index 0 (big-endian).
///
/// # Safety
/// `context` from `ibv_open_device`; `pkey` writable.
pub unsafe extern "C" fn ibv_query_pkey(
    context: *mut ibv_context,
    port: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    // SAFETY: per the contract.
    let ok = unsafe { soft(context) }.is_some_and(|s| s.ctx.query_port(port).is_ok());
    if !ok || index != 0 || pkey.is_null() {
        return -1;
    }
    // SAFETY: `pkey` is writable per the contract.
    unsafe { pkey.write(0xffff_u16.to_be()) };
    0
}

/// `ibv_get_pkey_index`: 0 for the default P_Key, else -1.
///
/// # Safety
/// `context` from `ibv_open_device`.
pub unsafe extern "C" fn ibv_get_pkey_index(
    context: *mut ibv_context,
    port: u8,
    pkey: u16,
) -> c_int {
    // SAFETY: per the contract.
    let ok = unsafe { soft(context) }.is_some_and(|s| s.ctx.query_port(port).is_ok());
    if ok && u16::from_be(pkey) & 0x7fff == 0x7fff {
        0
    } else {
        set_errno(libc::ENOENT);
        -1
    }
}

/// `IBV_GID_TYPE_SYSFS_ROCE_V2`
const GID_TYPE_SYSFS_ROCE_V2: c_uint = 1;

/// `int ibv_query_gid_type(ctx, port, index, enum ibv_gid_type_sysfs *type)`: 0 or -1.
///
/// # Safety
/// `context` from `ibv_open_device`; `ty` writable.
pub unsafe extern "C" fn ibv_query_gid_type(
    context: *mut ibv_context,
    port: u8,
    index: c_uint,
    ty: *mut c_uint,
) -> c_int {
    // SAFETY: per the contract.
    let ok = unsafe { soft(context) }
        .is_some_and(|s| u16::try_from(index).is_ok_and(|i| s.ctx.query_gid(port, i).is_ok()));
    if !ok || ty.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: `ty` is writable per the contract.
    unsafe { ty.write(GID_TYPE_SYSFS_ROCE_V2) };
    0
}

fn gid_entry(s: &SoftContext, port: u32, index: u32) -> Option<ibv_gid_entry> {
    let g = s
        .ctx
        .query_gid(u8::try_from(port).ok()?, u16::try_from(index).ok()?)
        .ok()?;
    Some(ibv_gid_entry {
        gid: ibv_gid { raw: g.0 },
        gid_index: index,
        port_num: port,
        gid_type: IBV_GID_TYPE_ROCE_V2 as u32,
        ndev_ifindex: 0,
    })
}

/// `_ibv_query_gid_ex`: 0 or an errno value.
///
/// # Safety
/// `context` from `ibv_open_device`; `entry` writable for `entry_size` bytes.
pub unsafe extern "C" fn _ibv_query_gid_ex(
    context: *mut ibv_context,
    port: u32,
    index: u32,
    entry: *mut ibv_gid_entry,
    _flags: u32,
    entry_size: usize,
) -> c_int {
    // SAFETY: per the contract.
    let Some(s) = (unsafe { soft(context) }) else {
        return libc::EINVAL;
    };
    if entry.is_null() || entry_size < size_of::<ibv_gid_entry>() {
        return libc::EINVAL;
    }
    match gid_entry(s, port, index) {
        Some(e) => {
            // SAFETY: `entry` is writable per the contract.
            unsafe { entry.write(e) };
            0
        }
        None => libc::ENODATA,
    }
}

/// `_ibv_query_gid_table`: number of entries, or a negative errno value.
///
/// # Safety
/// `context` from `ibv_open_device`; `entries` writable for `max_entries` entries.
pub unsafe extern "C" fn _ibv_query_gid_table(
    context: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max_entries: usize,
    _flags: u32,
    entry_size: usize,
) -> isize {
    // SAFETY: per the contract.
    let Some(s) = (unsafe { soft(context) }) else {
        return -(libc::EINVAL as isize);
    };
    if entry_size < size_of::<ibv_gid_entry>() {
        return -(libc::EINVAL as isize);
    }
    let all: Vec<_> = (0..).map_while(|i| gid_entry(s, 1, i)).collect();
    if all.len() > max_entries || entries.is_null() && !all.is_empty() {
        return -(libc::EINVAL as isize);
    }
    for (i, e) in all.iter().enumerate() {
        // SAFETY: `entries` holds `max_entries >= all.len()` entries of `entry_size` bytes.
        unsafe { entries.byte_add(i * entry_size).write(*e) };
    }
    all.len() as isize
}

/// `ibv_get_async_event`: blocks for the next event; 0, or -1 with errno.
///
/// # Safety
/// `context` from `ibv_open_device`; `event` writable.
pub unsafe extern "C" fn ibv_get_async_event(
    context: *mut ibv_context,
    event: *mut ibv_async_event,
) -> c_int {
    // SAFETY: per the contract.
    let Some(s) = (unsafe { soft(context) }) else {
        set_errno(libc::EINVAL);
        return -1;
    };
    if event.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    use softverbs::AsyncEvent as E;
    let ev = s.ctx.get_async_event();
    let ty = match ev {
        E::PortActive => IBV_EVENT_PORT_ACTIVE,
        E::CqError(_) => IBV_EVENT_CQ_ERR,
        E::QpFatal(_) => IBV_EVENT_QP_FATAL,
        E::QpRequestError(_) => IBV_EVENT_QP_REQ_ERR,
        E::QpAccessError(_) => IBV_EVENT_QP_ACCESS_ERR,
        E::SqDrained(_) => IBV_EVENT_SQ_DRAINED,
        E::LastWqeReached(_) => IBV_EVENT_QP_LAST_WQE_REACHED,
        E::SrqLimitReached(_) => IBV_EVENT_SRQ_LIMIT_REACHED,
        #[allow(unreachable_patterns)]
        _ => IBV_EVENT_DEVICE_FATAL,
    };
    // The element names the object the event is about (NULL if it is gone already).
    let element = {
        let o = s.objects.lock().unwrap_or_else(|e| e.into_inner());
        let qp = |h| o.qps.get(h).map_or(ptr::null_mut(), |&p| p as *mut ibv_qp);
        match &ev {
            E::PortActive => ibv_async_event_element { port_num: 1 },
            E::CqError(h) => ibv_async_event_element {
                cq: o.cqs.get(h).map_or(ptr::null_mut(), |&p| p as *mut ibv_cq),
            },
            E::SrqLimitReached(h) => ibv_async_event_element {
                srq: o
                    .srqs
                    .get(h)
                    .map_or(ptr::null_mut(), |&p| p as *mut ibv_srq),
            },
            E::QpFatal(h)
            | E::QpRequestError(h)
            | E::QpAccessError(h)
            | E::SqDrained(h)
            | E::LastWqeReached(h) => ibv_async_event_element { qp: qp(h) },
            #[allow(unreachable_patterns)]
            _ => ibv_async_event_element {
                cq: ptr::null_mut(),
            },
        }
    };
    // SAFETY: `event` is writable per the contract.
    unsafe {
        event.write(ibv_async_event {
            element,
            event_type: ty,
        });
    }
    0
}

/// `ibv_ack_async_event`: nothing to release.
pub extern "C" fn ibv_ack_async_event(_event: *mut ibv_async_event) {}
