//! Opened devices: `ibv_open_device` and the queries on an `ibv_context`.
//!
//! Each context is a [`SoftContext`]: a `verbs_context` (whose last field is the
//! `ibv_context` handed to C, so the header inlines find the extended ops right before it)
//! followed by the [`softverbs::Context`] doing the work. Every context of a process shares
//! the process's one softverbs device (endpoint, GID, LID, QPN space, progress thread), as
//! contexts of one RNIC share its port; each has its own objects, async event fd and
//! `cmd_fd`.
//!
//! After `fork()` the child's inherited contexts are dead: every call on them or their
//! objects fails with `EIO` (NULL and errno `EIO` for calls returning objects) without
//! touching the parent's device; the child opens a device of its own (`softverbs::fork`).

use core::ffi::{c_char, c_int, c_uint, c_void};
use core::mem::offset_of;
use core::ptr;

use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
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
    /// `ibv_context.cmd_fd`: softverbs has no kernel command channel, but programs dup and
    /// close this fd (and pass it to `ibv_import_device`), so it is a real one of its own.
    pub(crate) cmd_fd: OwnedFd,
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

/// The [`SoftContext`] around `ctx` if it can be used: `Err(EINVAL)` for NULL, `Err(EIO)`
/// for a context inherited across `fork()`.
///
/// # Safety
/// As [`soft`].
pub unsafe fn live<'a>(ctx: *mut ibv_context) -> Result<&'a SoftContext, c_int> {
    // SAFETY: forwarded contract.
    match unsafe { soft(ctx) } {
        None => Err(libc::EINVAL),
        Some(s) if s.ctx.inherited() => Err(libc::EIO),
        Some(s) => Ok(s),
    }
}

/// `Err(EIO)` when `ctx` (the context of an object) was inherited across `fork()`; NULL
/// passes (the callers check their object).
///
/// # Safety
/// As [`soft`].
pub(crate) unsafe fn usable(ctx: *mut ibv_context) -> Result<(), c_int> {
    // SAFETY: forwarded contract.
    match unsafe { soft(ctx) } {
        Some(s) if s.ctx.inherited() => Err(libc::EIO),
        _ => Ok(()),
    }
}

/// A memfd of its own for `cmd_fd`.
fn cmd_fd() -> std::io::Result<OwnedFd> {
    // SAFETY: memfd_create with a static C string name; the result is checked.
    let fd = unsafe { libc::memfd_create(c"softverbs-cmd".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Whether `fd` is the `cmd_fd` of a context open in this process (for `ibv_import_device`).
pub(crate) fn is_cmd_fd(fd: c_int) -> bool {
    let id = |fd: c_int| {
        // SAFETY: fstat into a zeroed stat buffer; the result is checked.
        let mut st: libc::stat = unsafe { core::mem::zeroed() };
        // SAFETY: as above.
        (unsafe { libc::fstat(fd, &mut st) } == 0).then_some((st.st_dev, st.st_ino))
    };
    let Some(me) = id(fd) else {
        return false;
    };
    CMD_FDS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .any(|&f| id(f) == Some(me))
}

/// The `cmd_fd`s of the open contexts.
static CMD_FDS: Mutex<Vec<c_int>> = Mutex::new(Vec::new());

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
    let cmd = match cmd_fd() {
        Ok(f) => f,
        Err(e) => return ret_null(e.raw_os_error().unwrap_or(libc::EMFILE)),
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
    vctx.context.cmd_fd = cmd.as_raw_fd();
    vctx.context.async_fd = ctx.async_fd();
    vctx.context.num_comp_vectors = clamp(ctx.query_device().num_comp_vectors);
    vctx.context.abi_compat = VERBS_ABI_IS_EXTENDED;
    CMD_FDS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(cmd.as_raw_fd());
    let soft = Box::into_raw(Box::new(SoftContext {
        vctx,
        ctx,
        objects: Mutex::new(ObjectIndex::default()),
        cmd_fd: cmd,
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
    let fd = s.cmd_fd.as_raw_fd();
    CMD_FDS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|&f| f != fd);
    // SAFETY: `s` was created by Box::into_raw in `ibv_open_device` and is freed once. An
    // inherited context's device is left alone by its own drop (`softverbs::fork`).
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
    a.vendor_id = d.vendor_id;
    a.vendor_part_id = d.vendor_part_id;
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
    a.max_mcast_grp = clamp(d.max_mcast_grp);
    a.max_mcast_qp_attach = clamp(d.max_mcast_qp_attach);
    a.max_total_mcast_qp_attach = clamp(d.max_total_mcast_qp_attach);
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
    let s = match unsafe { live(context) } {
        Ok(s) => s,
        Err(e) => return e,
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
    let s = match unsafe { live(context) } {
        Ok(s) => s,
        Err(e) => return e,
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
    let s = match unsafe { live(context) } {
        Ok(s) => s,
        Err(e) => return e,
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

/// `ibv_get_async_event`: the next event of this context, waiting for one as rdma-core's
/// `read()` of the async fd does: 0, or -1 keeping that wait's errno (`EAGAIN` when the
/// application made the fd `O_NONBLOCK` and nothing is pending, `EINTR` when a signal
/// interrupted it). The element names a live object: events of destroyed objects are never
/// delivered, and destroying an object waits until its events are acknowledged.
///
/// # Safety
/// `context` from `ibv_open_device`; `event` writable.
pub unsafe extern "C" fn ibv_get_async_event(
    context: *mut ibv_context,
    event: *mut ibv_async_event,
) -> c_int {
    // SAFETY: per the contract.
    let s = match unsafe { live(context) } {
        Ok(s) => s,
        Err(e) => {
            set_errno(e);
            return -1;
        }
    };
    if event.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    use softverbs::AsyncEvent as E;
    loop {
        let ev = match s.ctx.get_async_event() {
            Ok(ev) => ev,
            Err(e) => {
                set_errno(e.raw_os_error().unwrap_or(libc::EIO));
                return -1;
            }
        };
        let ty = match ev {
            E::PortActive => IBV_EVENT_PORT_ACTIVE,
            E::CqError(_) => IBV_EVENT_CQ_ERR,
            E::QpFatal(_) => IBV_EVENT_QP_FATAL,
            E::QpRequestError(_) => IBV_EVENT_QP_REQ_ERR,
            E::QpAccessError(_) => IBV_EVENT_QP_ACCESS_ERR,
            E::SqDrained(_) => IBV_EVENT_SQ_DRAINED,
            E::CommEstablished(_) => IBV_EVENT_COMM_EST,
            E::LastWqeReached(_) => IBV_EVENT_QP_LAST_WQE_REACHED,
            E::SrqLimitReached(_) => IBV_EVENT_SRQ_LIMIT_REACHED,
            #[allow(unreachable_patterns)]
            _ => IBV_EVENT_DEVICE_FATAL,
        };
        // The element names the object the event is about. It is listed: an object is
        // unlisted only after its events were acknowledged (see the destroy calls), and this
        // one was counted as handed out when it was taken from the queue.
        let element = {
            let o = s.objects.lock().unwrap_or_else(|e| e.into_inner());
            match &ev {
                E::PortActive => Some(ibv_async_event_element { port_num: 1 }),
                E::CqError(h) => o.cqs.get(h).map(|&p| ibv_async_event_element {
                    cq: p as *mut ibv_cq,
                }),
                E::SrqLimitReached(h) => o.srqs.get(h).map(|&p| ibv_async_event_element {
                    srq: p as *mut ibv_srq,
                }),
                E::QpFatal(h)
                | E::QpRequestError(h)
                | E::QpAccessError(h)
                | E::SqDrained(h)
                | E::CommEstablished(h)
                | E::LastWqeReached(h) => o.qps.get(h).map(|&p| ibv_async_event_element {
                    qp: p as *mut ibv_qp,
                }),
                #[allow(unreachable_patterns)]
                _ => Some(ibv_async_event_element { port_num: 1 }),
            }
        };
        let Some(element) = element else {
            // Not an object of this library's wrappers (made through the Rust API): skip it.
            s.ctx.ack_async_event(&ev);
            continue;
        };
        // SAFETY: `event` is writable per the contract.
        unsafe {
            event.write(ibv_async_event {
                element,
                event_type: ty,
            });
        }
        return 0;
    }
}

/// `ibv_ack_async_event`: acknowledges an event of a QP, CQ or SRQ, which its destroy call
/// waits for.
///
/// # Safety
/// `event` NULL or an event from `ibv_get_async_event` whose object was not destroyed.
pub unsafe extern "C" fn ibv_ack_async_event(event: *mut ibv_async_event) {
    if event.is_null() {
        return;
    }
    // SAFETY: readable per the contract; the element member read is the one the type sets.
    let ev = unsafe { &*event };
    use softverbs::AsyncEvent as E;
    // SAFETY: the element is a live object of this library per the contract.
    unsafe {
        match ev.event_type {
            IBV_EVENT_CQ_ERR => {
                if let Some(c) = crate::verbs::wrap::<_, crate::verbs::SoftCq>(ev.element.cq) {
                    if let Some(s) = soft(c.cq.context) {
                        s.ctx.ack_async_event(&E::CqError(c.inner.handle()));
                    }
                }
            }
            IBV_EVENT_QP_FATAL
            | IBV_EVENT_QP_REQ_ERR
            | IBV_EVENT_QP_ACCESS_ERR
            | IBV_EVENT_COMM_EST
            | IBV_EVENT_SQ_DRAINED
            | IBV_EVENT_PATH_MIG
            | IBV_EVENT_PATH_MIG_ERR
            | IBV_EVENT_QP_LAST_WQE_REACHED => {
                if let Some(q) = crate::verbs::wrap::<_, crate::verbs::SoftQp>(ev.element.qp) {
                    if let Some(s) = soft(q.qp.qp_base.context) {
                        s.ctx.ack_async_event(&E::QpFatal(q.inner.handle()));
                    }
                }
            }
            IBV_EVENT_SRQ_ERR | IBV_EVENT_SRQ_LIMIT_REACHED => {
                if let Some(r) = crate::srq::wrap_srq(ev.element.srq) {
                    if let Some(s) = soft(r.srq.context) {
                        s.ctx.ack_async_event(&E::SrqLimitReached(r.inner.handle()));
                    }
                }
            }
            _ => {}
        }
    }
}
