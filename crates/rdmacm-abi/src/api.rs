//! The rdma_cm functions (`<rdma/rdma_cma.h>`) behind the exports.
//!
//! Event channels, ids (create, destroy, migrate, synchronous ids), events (get, ack),
//! devices, address lookup, ports, ECE, and every call of the connection manager (bind,
//! resolve, listen, connect, accept, reject, disconnect, multicast, options, QPs, endpoints)
//! through the private table of softverbs' libibverbs. When the loaded libibverbs.so.1 has no
//! connection manager (it is not softverbs'), the calls that need it check their id and fail
//! with `ENOSYS`, after saying once on stderr what is missing.
//!
//! Every pointer librdmacm handed out is checked against the live objects before use: an
//! unknown, NULL or destroyed id, channel or event is `EINVAL`, never a crash.

use core::ffi::{c_char, c_int, c_void, CStr};
use core::ptr;
use std::sync::Arc;

use softverbs_private_abi::{CmHandle, CmOps};

use crate::abi::*;
use crate::channel::Channel;
use crate::errno::{errno, ret, ret_ptr, Errno};
use crate::event::{ack, hand_out};
use crate::id::{qp_type_of, Id, CHANNELS, IDS};
use crate::mcast::Group;
use crate::{addrinfo, cm, devices, qp};

/// The live id at `id`.
fn lookup(id: *const rdma_cm_id) -> Result<Arc<Id>, Errno> {
    IDS.get(id).ok_or(libc::EINVAL)
}

/// The live channel at `channel`, which must not be another id's private one.
fn lookup_channel(channel: *const rdma_event_channel) -> Result<Arc<Channel>, Errno> {
    match CHANNELS.get(channel) {
        Some(c) if !c.private => Ok(c),
        _ => Err(libc::EINVAL),
    }
}

// ---------------------------------------------------------------------------------------------
// Event channels and events
// ---------------------------------------------------------------------------------------------

/// `rdma_create_event_channel`: NULL with `errno` (ENODEV without a device) on failure.
pub extern "C" fn rdma_create_event_channel() -> *mut rdma_event_channel {
    ret_ptr((|| {
        devices::init()?;
        let channel = Channel::new(false)?;
        CHANNELS.insert(&channel);
        Ok(channel.c_ptr())
    })())
}

/// `rdma_destroy_event_channel`. A channel ids still use stays open until the last of them
/// is destroyed or migrated; an unknown pointer, or a synchronous id's channel, is ignored.
///
/// # Safety
/// None beyond the C prototype: the pointer is looked up, not dereferenced.
pub unsafe extern "C" fn rdma_destroy_event_channel(channel: *mut rdma_event_channel) {
    if lookup_channel(channel).is_ok() {
        CHANNELS.remove(channel);
    }
}

/// `rdma_get_cm_event`: waits for the next event on `channel` (`EAGAIN` at once when the fd
/// is `O_NONBLOCK` and none is queued).
///
/// # Safety
/// `event` is NULL or writable.
pub unsafe extern "C" fn rdma_get_cm_event(
    channel: *mut rdma_event_channel,
    event: *mut *mut rdma_cm_event,
) -> c_int {
    ret((|| {
        devices::init()?;
        if event.is_null() {
            return Err(libc::EINVAL);
        }
        let channel = CHANNELS.get(channel).ok_or(libc::EINVAL)?;
        let taken = fetch(&channel)?;
        // SAFETY: `event` is writable (caller), checked non-NULL.
        unsafe { *event = taken };
        Ok(())
    })())
}

/// `rdma_ack_cm_event`: `EINVAL` for NULL or a pointer that is not an unacknowledged event.
///
/// # Safety
/// None beyond the C prototype: the pointer is looked up, not dereferenced.
pub unsafe extern "C" fn rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int {
    ret(ack(event))
}

/// `rdma_event_str`: the event's name as rdma-core spells it.
pub extern "C" fn rdma_event_str(event: c_int) -> *const c_char {
    let s: &'static CStr = match event {
        RDMA_CM_EVENT_ADDR_RESOLVED => c"RDMA_CM_EVENT_ADDR_RESOLVED",
        RDMA_CM_EVENT_ADDR_ERROR => c"RDMA_CM_EVENT_ADDR_ERROR",
        RDMA_CM_EVENT_ROUTE_RESOLVED => c"RDMA_CM_EVENT_ROUTE_RESOLVED",
        RDMA_CM_EVENT_ROUTE_ERROR => c"RDMA_CM_EVENT_ROUTE_ERROR",
        RDMA_CM_EVENT_CONNECT_REQUEST => c"RDMA_CM_EVENT_CONNECT_REQUEST",
        RDMA_CM_EVENT_CONNECT_RESPONSE => c"RDMA_CM_EVENT_CONNECT_RESPONSE",
        RDMA_CM_EVENT_CONNECT_ERROR => c"RDMA_CM_EVENT_CONNECT_ERROR",
        RDMA_CM_EVENT_UNREACHABLE => c"RDMA_CM_EVENT_UNREACHABLE",
        RDMA_CM_EVENT_REJECTED => c"RDMA_CM_EVENT_REJECTED",
        RDMA_CM_EVENT_ESTABLISHED => c"RDMA_CM_EVENT_ESTABLISHED",
        RDMA_CM_EVENT_DISCONNECTED => c"RDMA_CM_EVENT_DISCONNECTED",
        RDMA_CM_EVENT_DEVICE_REMOVAL => c"RDMA_CM_EVENT_DEVICE_REMOVAL",
        RDMA_CM_EVENT_MULTICAST_JOIN => c"RDMA_CM_EVENT_MULTICAST_JOIN",
        RDMA_CM_EVENT_MULTICAST_ERROR => c"RDMA_CM_EVENT_MULTICAST_ERROR",
        RDMA_CM_EVENT_ADDR_CHANGE => c"RDMA_CM_EVENT_ADDR_CHANGE",
        RDMA_CM_EVENT_TIMEWAIT_EXIT => c"RDMA_CM_EVENT_TIMEWAIT_EXIT",
        _ => c"UNKNOWN EVENT",
    };
    s.as_ptr()
}

// ---------------------------------------------------------------------------------------------
// Ids
// ---------------------------------------------------------------------------------------------

/// `rdma_create_id`: a new id on `channel` (synchronous, with a private channel, when NULL)
/// for port space `ps` (`EINVAL` for others; the QP type follows from it).
///
/// # Safety
/// `id` is NULL or writable.
pub unsafe extern "C" fn rdma_create_id(
    channel: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: c_int,
) -> c_int {
    ret((|| {
        if id.is_null() {
            return Err(libc::EINVAL);
        }
        let qp_type = qp_type_of(ps)?;
        devices::init()?;
        let channel = match channel.is_null() {
            true => None,
            false => Some(lookup_channel(channel)?),
        };
        let new = Id::create(channel, context, ps, qp_type)?;
        if let Err(e) = cm::attach(&new) {
            new.destroy();
            return Err(e);
        }
        // SAFETY: `id` is writable (caller), checked non-NULL.
        unsafe { *id = new.c_ptr() };
        Ok(())
    })())
}

/// `rdma_destroy_id`: drops the id's queued events and waits until the program has
/// acknowledged those it got.
///
/// # Safety
/// None beyond the C prototype: the pointer is looked up before use.
pub unsafe extern "C" fn rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    ret(lookup(id).map(|id| {
        cm::forget(&id);
        id.destroy();
    }))
}

/// `rdma_migrate_id`: moves the id (with its queued events) to `channel`, or to a new
/// private channel when NULL (`EINVAL` if it already is synchronous).
///
/// # Safety
/// None beyond the C prototype: the pointers are looked up before use.
pub unsafe extern "C" fn rdma_migrate_id(
    id: *mut rdma_cm_id,
    channel: *mut rdma_event_channel,
) -> c_int {
    ret((|| {
        let id = lookup(id)?;
        let to = match channel.is_null() {
            true => None,
            false => Some(lookup_channel(channel)?),
        };
        id.migrate(to)
    })())
}

/// rdma-core's `ucma_get_port`: the port of a socket address, network order (for `AF_IB`,
/// the low 16 bits of the service ID).
fn port_of(addr: &rdma_sockaddr) -> u16 {
    // SAFETY: every member of the union is plain data; the family says which one is meant,
    // and each is no bigger than the `sockaddr_storage` member.
    unsafe {
        match addr.addr.sa_family as c_int {
            libc::AF_INET => addr.sin.sin_port,
            libc::AF_INET6 => addr.sin6.sin6_port,
            AF_IB => {
                let sib = ptr::read_unaligned((&raw const addr.storage).cast::<sockaddr_ib>());
                (u64::from_be(sib.sib_sid) as u16).to_be()
            }
            _ => 0,
        }
    }
}

/// The port of one of an id's addresses (0 for an unknown id).
fn id_port(id: *mut rdma_cm_id, which: impl Fn(&rdma_addr) -> &rdma_sockaddr) -> u16 {
    let Ok(id) = lookup(id) else { return 0 };
    // SAFETY: a plain copy of the live id's route addresses.
    let addr = unsafe { (*id.c()).route.addr };
    port_of(which(&addr))
}

/// `rdma_get_src_port`: the local port, network order.
///
/// # Safety
/// None beyond the C prototype.
pub unsafe extern "C" fn rdma_get_src_port(id: *mut rdma_cm_id) -> u16 {
    id_port(id, |a| &a.src)
}

/// `rdma_get_dst_port`: the peer's port, network order.
///
/// # Safety
/// None beyond the C prototype.
pub unsafe extern "C" fn rdma_get_dst_port(id: *mut rdma_cm_id) -> u16 {
    id_port(id, |a| &a.dst)
}

/// `rdma_set_local_ece`: stores the options to offer (`EINVAL` once the id has a QP, or for a
/// zero vendor id or nonzero `comp_mask`, as rdma-core checks).
///
/// # Safety
/// `ece` is NULL or readable.
pub unsafe extern "C" fn rdma_set_local_ece(id: *mut rdma_cm_id, ece: *mut ibv_ece) -> c_int {
    ret((|| {
        let id = lookup(id)?;
        // SAFETY: NULL or readable (caller); plain read of our C struct's `qp`.
        let (ece, has_qp) = unsafe { (ece.as_ref(), !(*id.c()).qp.is_null()) };
        match ece {
            Some(e) if !has_qp && e.vendor_id != 0 && e.comp_mask == 0 => {
                id.set_local_ece(ibv_ece {
                    vendor_id: e.vendor_id,
                    options: e.options,
                    comp_mask: 0,
                });
                Ok(())
            }
            _ => Err(libc::EINVAL),
        }
    })())
}

/// `rdma_get_remote_ece`: the peer's options (zero: softverbs' CM negotiates none).
///
/// # Safety
/// `ece` is NULL or writable.
pub unsafe extern "C" fn rdma_get_remote_ece(id: *mut rdma_cm_id, ece: *mut ibv_ece) -> c_int {
    ret((|| {
        let id = lookup(id)?;
        // SAFETY: plain read of our C struct's `qp`.
        if ece.is_null() || unsafe { !(*id.c()).qp.is_null() } {
            return Err(libc::EINVAL);
        }
        let remote = id.remote_ece();
        // SAFETY: writable (caller), checked non-NULL.
        unsafe {
            (*ece).vendor_id = remote.vendor_id;
            (*ece).options = remote.options;
            (*ece).comp_mask = 0;
        }
        Ok(())
    })())
}

// ---------------------------------------------------------------------------------------------
// Devices and addresses
// ---------------------------------------------------------------------------------------------

/// `rdma_get_devices`.
///
/// # Safety
/// `num_devices` is NULL or writable.
pub unsafe extern "C" fn rdma_get_devices(num_devices: *mut c_int) -> *mut *mut ibv_context {
    // SAFETY: the caller's guarantee.
    unsafe { devices::get_devices(num_devices) }
}

/// `rdma_free_devices`.
///
/// # Safety
/// `list` is NULL or a list from `rdma_get_devices`, not yet freed.
pub unsafe extern "C" fn rdma_free_devices(list: *mut *mut ibv_context) {
    // SAFETY: the caller's guarantee.
    unsafe { devices::free_devices(list) }
}

/// `rdma_getaddrinfo`.
///
/// # Safety
/// As `addrinfo::getaddrinfo`.
pub unsafe extern "C" fn rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    // SAFETY: the caller's guarantees are this function's.
    unsafe { addrinfo::getaddrinfo(node, service, hints, res) }
}

/// `rdma_freeaddrinfo`.
///
/// # Safety
/// As `addrinfo::freeaddrinfo`.
pub unsafe extern "C" fn rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    // SAFETY: the caller's guarantees are this function's.
    unsafe { addrinfo::freeaddrinfo(res) }
}

// ---------------------------------------------------------------------------------------------
// Connection management
// ---------------------------------------------------------------------------------------------

/// rdma-core's `ucma_addrlen`: the size of the socket address `addr` points to, by family
/// (0 for NULL or a family rdma_cm does not take).
///
/// # Safety
/// `addr` is NULL or points to at least a `sockaddr`'s family.
unsafe fn addrlen(addr: *const sockaddr) -> usize {
    if addr.is_null() {
        return 0;
    }
    // SAFETY: the caller's guarantee.
    match c_int::from(unsafe { (*addr).sa_family }) {
        libc::AF_INET => size_of::<sockaddr_in>(),
        libc::AF_INET6 => size_of::<sockaddr_in6>(),
        AF_IB => size_of::<sockaddr_ib>(),
        _ => 0,
    }
}

/// Takes the next event of `channel` for the program, doing first what rdma-core's
/// librdmacm does when an event is read (`cm::on_fetch`), and skipping those it swallows.
fn fetch(channel: &Channel) -> Result<*mut rdma_cm_event, Errno> {
    loop {
        let mut event = channel.take(|e| e.reported())?;
        match cm::on_fetch(&mut event) {
            cm::Fetched::Keep => return Ok(hand_out(event)),
            cm::Fetched::Swallow => event.completed(),
        }
    }
}

/// rdma-core's `ucma_complete`: for a synchronous id, waits for the event the call just
/// made caused, keeps it in `id->event` (acknowledging the one held before), and fails as
/// it says: `ECONNREFUSED` for REJECTED, else the event's status as an errno.
fn complete(id: &Arc<Id>) -> Result<(), Errno> {
    if !id.is_sync() {
        return Ok(());
    }
    // SAFETY: plain read and write of our own C struct's field.
    let held = unsafe { core::mem::replace(&mut (*id.c()).event, ptr::null_mut()) };
    if !held.is_null() {
        let _ = ack(held);
    }
    let event = fetch(&id.channel())?;
    // SAFETY: as above; `event` was just handed out and is not acknowledged.
    let (kind, status) = unsafe {
        (*id.c()).event = event;
        ((*event).event, (*event).status)
    };
    match status {
        0 => Ok(()),
        _ if kind == RDMA_CM_EVENT_REJECTED => Err(libc::ECONNREFUSED),
        s => Err(s.abs()),
    }
}

/// Runs a table call on the id's twin.
fn call(id: &Id, f: impl FnOnce(&CmOps, CmHandle) -> c_int) -> Result<(), Errno> {
    let (ops, handle) = cm::twin(id)?;
    cm::check(f(ops, handle))
}

/// `rdma_bind_addr`: binds the id (port 0: an ephemeral one); `EADDRINUSE` when another id,
/// in this process or another, holds the address and port.
///
/// # Safety
/// `addr` is NULL or a socket address of its family's size.
pub unsafe extern "C" fn rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut sockaddr) -> c_int {
    ret((|| {
        let id = lookup(id)?;
        // SAFETY: the caller's guarantee.
        let len = unsafe { addrlen(addr) };
        if len == 0 {
            return Err(libc::EINVAL);
        }
        // SAFETY: a table call with the caller's address of `len` bytes.
        call(&id, |ops, h| unsafe {
            (ops.bind_addr)(h, addr, len as socklen_t)
        })?;
        cm::query_route(&id)
    })())
}

/// `rdma_resolve_addr`: ADDR_RESOLVED (or ADDR_ERROR) follows; a synchronous id waits for
/// it.
///
/// # Safety
/// `src` is NULL or a socket address; `dst` a socket address.
pub unsafe extern "C" fn rdma_resolve_addr(
    id: *mut rdma_cm_id,
    src: *mut sockaddr,
    dst: *mut sockaddr,
    timeout_ms: c_int,
) -> c_int {
    ret((|| {
        let id = lookup(id)?;
        // SAFETY: the caller's guarantee.
        let (dst_len, src_len) = unsafe { (addrlen(dst), addrlen(src)) };
        if dst_len == 0 || (!src.is_null() && src_len == 0) {
            return Err(libc::EINVAL);
        }
        call(&id, |ops, h| {
            // SAFETY: a table call with the caller's addresses.
            unsafe {
                (ops.resolve_addr)(
                    h,
                    src,
                    src_len as socklen_t,
                    dst,
                    dst_len as socklen_t,
                    timeout_ms,
                )
            }
        })?;
        // SAFETY: `dst_len` readable bytes into the id's destination storage (as rdma-core
        // copies them), which is larger than any of them.
        unsafe {
            ptr::copy_nonoverlapping(
                dst.cast::<u8>(),
                (&raw mut (*id.c()).route.addr.dst.storage).cast::<u8>(),
                dst_len.min(size_of::<sockaddr_storage>()),
            );
        }
        complete(&id)
    })())
}

/// `rdma_resolve_route`: ROUTE_RESOLVED follows (on RoCE the route is what address
/// resolution found; there is no SA or ibacm to ask).
///
/// # Safety
/// None beyond the C prototype: the id is looked up.
pub unsafe extern "C" fn rdma_resolve_route(id: *mut rdma_cm_id, timeout_ms: c_int) -> c_int {
    ret((|| {
        let id = lookup(id)?;
        // SAFETY: a table call on the id's twin.
        call(&id, |ops, h| unsafe { (ops.resolve_route)(h, timeout_ms) })?;
        complete(&id)
    })())
}

/// `rdma_listen`: listens on the bound address (an unbound id: the IPv4 wildcard and an
/// ephemeral port).
///
/// # Safety
/// None beyond the C prototype: the id is looked up.
pub unsafe extern "C" fn rdma_listen(id: *mut rdma_cm_id, backlog: c_int) -> c_int {
    ret((|| {
        let id = lookup(id)?;
        // SAFETY: a table call on the id's twin.
        call(&id, |ops, h| unsafe { (ops.listen)(h, backlog) })?;
        cm::query_route(&id)
    })())
}

/// rdma-core's `ucma_valid_param` (what it checks itself; the connection manager checks
/// the READ/atomic depths against the device, `EINVAL` too).
fn valid_param(c: &rdma_cm_id, param: *const rdma_conn_param) -> Result<(), Errno> {
    if c.ps == RDMA_PS_TCP && c.qp.is_null() && param.is_null() {
        return Err(libc::EINVAL);
    }
    Ok(())
}

/// The connection parameters rdma-core's `ucma_copy_conn_param_to_kern` passes on: the
/// program's, or for NULL 7 retries and no flow control; READ/atomic depths as given or 255
/// (the device's most, or on accept what the peer asked for within it).
///
/// # Safety
/// `param` is NULL or readable, its private data readable for its length.
unsafe fn kernel_param(
    param: *const rdma_conn_param,
    qp_num: u32,
    srq: u8,
    data: &mut Vec<u8>,
) -> softverbs_private_abi::ConnParam {
    // SAFETY: the caller's guarantee.
    let p = unsafe { param.as_ref() };
    if let Some(p) = p.filter(|p| !p.private_data.is_null() && p.private_data_len != 0) {
        // SAFETY: the caller's guarantee.
        data.extend_from_slice(unsafe {
            core::slice::from_raw_parts(
                p.private_data.cast::<u8>(),
                usize::from(p.private_data_len),
            )
        });
    }
    softverbs_private_abi::ConnParam {
        private_data: data.as_ptr(),
        private_data_len: data.len() as u32,
        responder_resources: p.map_or(RDMA_MAX_RESP_RES, |p| p.responder_resources),
        initiator_depth: p.map_or(RDMA_MAX_INIT_DEPTH, |p| p.initiator_depth),
        flow_control: p.map_or(0, |p| p.flow_control),
        retry_count: p.map_or(7, |p| p.retry_count),
        rnr_retry_count: p.map_or(7, |p| p.rnr_retry_count),
        srq,
        qp_num,
    }
}

/// `rdma_connect`: REQ (RC) or SIDR_REQ (UD); ESTABLISHED, REJECTED, UNREACHABLE or
/// CONNECT_RESPONSE (for an id whose QP the program made) follows.
///
/// # Safety
/// `param` is NULL or a valid `rdma_conn_param`.
pub unsafe extern "C" fn rdma_connect(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    ret((|| {
        let id = lookup(id)?;
        // SAFETY: plain reads of the live id's C struct (and its QP, from libibverbs).
        let (qp_num, srq) = unsafe {
            let c = &*id.c();
            valid_param(c, param)?;
            match c.qp.is_null() {
                false => ((*c.qp).qp_num, u8::from(!(*c.qp).srq.is_null())),
                true => match param.as_ref() {
                    Some(p) => (p.qp_num, p.srq),
                    None => (0, 0),
                },
            }
        };
        let mut data = id.take_connect_data();
        // SAFETY: the caller's guarantee.
        let p = unsafe { kernel_param(param, qp_num, srq, &mut data) };
        // SAFETY: a table call; `p` and the bytes it points to live across it.
        call(&id, |ops, h| unsafe { (ops.connect)(h, &p) })?;
        complete(&id)
    })())
}

/// `rdma_accept`: REP after the id's QP is moved to RTS (RC; a synchronous id then waits
/// for ESTABLISHED), or SIDR_REP (UD).
///
/// # Safety
/// `param` is NULL or a valid `rdma_conn_param`.
pub unsafe extern "C" fn rdma_accept(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    ret((|| {
        let id = lookup(id)?;
        // SAFETY: plain reads of the live id's C struct (and its QP, from libibverbs).
        let (qp_num, srq, ud) = unsafe {
            let c = &*id.c();
            valid_param(c, param)?;
            let (qp_num, srq) = match (c.qp.is_null(), param.as_ref()) {
                (false, _) => ((*c.qp).qp_num, u8::from(!(*c.qp).srq.is_null())),
                (true, Some(p)) => (p.qp_num, p.srq),
                // rdma-core reads conn_param->qp_num here, through NULL.
                (true, None) => return Err(libc::EINVAL),
            };
            (qp_num, srq, c.qp_type == IBV_QPT_UD)
        };
        let mut data = Vec::new();
        // SAFETY: the caller's guarantee.
        let p = unsafe { kernel_param(param, qp_num, srq, &mut data) };
        // SAFETY: a table call; `p` and the bytes it points to live across it.
        let accepted = call(&id, |ops, h| unsafe { (ops.accept)(h, &p) });
        cm::sync_qp_state(&id);
        accepted?;
        if ud {
            return Ok(());
        }
        complete(&id)
    })())
}

/// `rdma_reject` / `rdma_reject_ece`: REJ (RC) or SIDR_REP "rejected" (UD).
fn reject(id: *mut rdma_cm_id, data: *const c_void, len: u8, reason: u8) -> c_int {
    ret((|| {
        let id = lookup(id)?;
        let (data, len) = match data.is_null() {
            true => (ptr::null(), 0),
            false => (data.cast::<u8>(), len),
        };
        // SAFETY: a table call with the caller's `len` bytes.
        call(&id, |ops, h| unsafe { (ops.reject)(h, data, len, reason) })
    })())
}

/// `rdma_reject`: REJ reason 28, "consumer defined".
///
/// # Safety
/// `data` is NULL or readable for `len` bytes.
pub unsafe extern "C" fn rdma_reject(id: *mut rdma_cm_id, data: *const c_void, len: u8) -> c_int {
    reject(id, data, len, 0)
}

/// `rdma_reject_ece`: REJ reason 35, "vendor option not supported".
///
/// # Safety
/// `data` is NULL or readable for `len` bytes.
pub unsafe extern "C" fn rdma_reject_ece(
    id: *mut rdma_cm_id,
    data: *const c_void,
    len: u8,
) -> c_int {
    reject(id, data, len, 35)
}

/// `rdma_establish`: the RTU after CONNECT_RESPONSE, for an id whose QP the program made
/// and moved itself (`EINVAL` when the id has a QP of `rdma_create_qp`).
///
/// # Safety
/// None beyond the C prototype: the id is looked up.
pub unsafe extern "C" fn rdma_establish(id: *mut rdma_cm_id) -> c_int {
    ret((|| {
        let id = lookup(id)?;
        // SAFETY: plain read of the live id's C struct.
        if unsafe { !(*id.c()).qp.is_null() } {
            return Err(libc::EINVAL);
        }
        // SAFETY: a table call on the id's twin.
        call(&id, |ops, h| unsafe { (ops.establish)(h) })
    })())
}

/// `rdma_notify`: IBV_EVENT_COMM_EST for a passive id whose own QP saw its first packet
/// before the RTU (`EINVAL` for other events, as the kernel answers).
///
/// # Safety
/// None beyond the C prototype: the id is looked up.
pub unsafe extern "C" fn rdma_notify(id: *mut rdma_cm_id, event: c_int) -> c_int {
    ret((|| {
        let id = lookup(id)?;
        // SAFETY: a table call on the id's twin.
        call(&id, |ops, h| unsafe { (ops.notify)(h, event) })
    })())
}

/// `rdma_disconnect`: the id's QP goes to the error state (flushing its work requests) and
/// a DREQ (or the DREP of the peer's DREQ) goes out; DISCONNECTED follows, which a
/// synchronous id waits for. `EINVAL` for an id without a device, as rdma-core.
///
/// # Safety
/// None beyond the C prototype: the id is looked up.
pub unsafe extern "C" fn rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
    ret((|| {
        let id = lookup(id)?;
        // SAFETY: plain read of the live id's C struct.
        if unsafe { (*id.c()).verbs.is_null() } {
            return Err(libc::EINVAL);
        }
        // SAFETY: a table call on the id's twin.
        let r = call(&id, |ops, h| unsafe { (ops.disconnect)(h) });
        cm::sync_qp_state(&id);
        r?;
        complete(&id)
    })())
}

/// `rdma_init_qp_attr`: the attributes (and mask) that move the id's connection QP to
/// `attr->qp_state` (INIT, RTR, RTS or ERR).
///
/// # Safety
/// `attr` is NULL or a whole `struct ibv_qp_attr`; `mask` NULL or writable.
pub unsafe extern "C" fn rdma_init_qp_attr(
    id: *mut rdma_cm_id,
    attr: *mut c_void,
    mask: *mut c_int,
) -> c_int {
    ret((|| {
        let id = lookup(id)?;
        // SAFETY: a table call with the caller's buffers.
        call(&id, |ops, h| unsafe { (ops.init_qp_attr)(h, attr, mask) })
    })())
}

/// `rdma_set_option`: `RDMA_OPTION_ID_TOS` (u8), `_REUSEADDR` and `_AFONLY` (int, before
/// binding), `_ACK_TIMEOUT` (u8); `EINVAL` for a wrong length; `RDMA_OPTION_IB_PATH`
/// `EOPNOTSUPP` (RoCE routes come from softverbs, not an SA); others `ENOSYS`, as the
/// kernel answers.
///
/// # Safety
/// `optval` is NULL or readable for `optlen` bytes.
pub unsafe extern "C" fn rdma_set_option(
    id: *mut rdma_cm_id,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: usize,
) -> c_int {
    ret((|| {
        let id = lookup(id)?;
        // SAFETY: a table call with the caller's buffer.
        call(&id, |ops, h| unsafe {
            (ops.set_option)(h, level, optname, optval, optlen)
        })
    })())
}

/// Joins `addr` (rdma-core's `rdma_join_multicast2`): MULTICAST_JOIN or MULTICAST_ERROR
/// follows, with the id's QP attached unless the join is send-only.
///
/// # Safety
/// `addr` is readable for `len` bytes.
unsafe fn join(
    id: *mut rdma_cm_id,
    addr: *const sockaddr,
    len: usize,
    flags: u32,
    context: *mut c_void,
) -> Result<(), Errno> {
    let id = lookup(id)?;
    // SAFETY: all-zero is a valid socket address storage (family AF_UNSPEC).
    let mut storage: sockaddr_storage = unsafe { core::mem::zeroed() };
    // SAFETY: `len` readable bytes (the caller's guarantee), at most a storage's.
    unsafe {
        ptr::copy_nonoverlapping(
            addr.cast::<u8>(),
            (&raw mut storage).cast::<u8>(),
            len.min(size_of::<sockaddr_storage>()),
        )
    };
    let group = Group::new(storage, len, flags, context);
    id.add_group(Arc::clone(&group));
    let token = group.token();
    // SAFETY: a table call with the caller's address.
    let joined = call(&id, |ops, h| unsafe {
        (ops.join_multicast)(h, addr, len as socklen_t, flags, token)
    });
    if let Err(e) = joined {
        id.take_group(|g| ptr::eq(g, Arc::as_ptr(&group)));
        group.forget();
        return Err(e);
    }
    complete(&id)
}

/// `rdma_join_multicast`: a full-member join.
///
/// # Safety
/// `addr` is NULL or a socket address of its family's size.
pub unsafe extern "C" fn rdma_join_multicast(
    id: *mut rdma_cm_id,
    addr: *mut sockaddr,
    context: *mut c_void,
) -> c_int {
    ret((|| {
        // SAFETY: the caller's guarantee.
        let len = unsafe { addrlen(addr) };
        if len == 0 {
            return Err(libc::EINVAL);
        }
        // SAFETY: as above.
        unsafe { join(id, addr, len, RDMA_MC_JOIN_FLAG_FULLMEMBER, context) }
    })())
}

/// `rdma_join_multicast_ex`: a join with flags (full member, or send-only full member,
/// which neither makes the host a member of the IP group nor attaches the QP).
///
/// # Safety
/// `attr` is NULL or a valid `rdma_cm_join_mc_attr_ex`.
pub unsafe extern "C" fn rdma_join_multicast_ex(
    id: *mut rdma_cm_id,
    attr: *mut rdma_cm_join_mc_attr_ex,
    context: *mut c_void,
) -> c_int {
    ret((|| {
        // SAFETY: the caller's guarantee.
        let a = unsafe { attr.as_ref() }.ok_or(libc::EINVAL)?;
        if a.comp_mask >= RDMA_CM_JOIN_MC_ATTR_RESERVED {
            return Err(libc::ENOTSUP);
        }
        if a.comp_mask & RDMA_CM_JOIN_MC_ATTR_ADDRESS == 0 {
            return Err(libc::EINVAL);
        }
        if a.comp_mask & RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS == 0
            || a.join_flags >= RDMA_MC_JOIN_FLAG_RESERVED
        {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller's guarantee.
        let len = unsafe { addrlen(a.addr) };
        if len == 0 {
            return Err(libc::EINVAL);
        }
        // SAFETY: as above.
        unsafe { join(id, a.addr, len, a.join_flags, context) }
    })())
}

/// `rdma_leave_multicast`: leaves a group joined with the same address (`EADDRNOTAVAIL`
/// otherwise), after waiting until the program acknowledged the group's events.
///
/// # Safety
/// `addr` is NULL or a socket address of its family's size.
pub unsafe extern "C" fn rdma_leave_multicast(id: *mut rdma_cm_id, addr: *mut sockaddr) -> c_int {
    ret((|| {
        let id = lookup(id)?;
        // SAFETY: the caller's guarantee.
        let len = unsafe { addrlen(addr) };
        if len == 0 {
            return Err(libc::EINVAL);
        }
        // SAFETY: `len` readable bytes (the caller's guarantee).
        let bytes = unsafe { core::slice::from_raw_parts(addr.cast::<u8>(), len) };
        let group = id.take_group(|g| g.is(bytes)).ok_or(libc::EADDRNOTAVAIL)?;
        // SAFETY: a table call with the caller's address.
        let left = call(&id, |ops, h| unsafe {
            (ops.leave_multicast)(h, addr, len as socklen_t)
        });
        if left.is_ok() {
            group.wait_acked();
        }
        group.forget();
        left
    })())
}

/// `rdma_create_qp`: a QP on the id's device (and PD, unless `pd` is given), with CQs of
/// librdmacm's own when `attr` names none; the connection manager moves it (INIT now, RTR
/// and RTS with the connection, ERR on disconnect).
///
/// # Safety
/// `pd` is NULL or a PD from libibverbs; `attr` NULL or a valid `ibv_qp_init_attr`.
pub unsafe extern "C" fn rdma_create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> c_int {
    // SAFETY: the caller's guarantees.
    ret(lookup(id).and_then(|id| unsafe { qp::create_qp(&id, pd, attr) }))
}

/// `rdma_create_qp_ex`.
///
/// # Safety
/// `attr` is NULL or a valid `ibv_qp_init_attr_ex`.
pub unsafe extern "C" fn rdma_create_qp_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_init_attr_ex,
) -> c_int {
    // SAFETY: the caller's guarantee.
    ret(lookup(id).and_then(|id| unsafe { qp::create_qp_ex(&id, attr) }))
}

/// `rdma_destroy_qp`: the id's QP and the CQs librdmacm made for it.
///
/// # Safety
/// None beyond the C prototype: the id is looked up.
pub unsafe extern "C" fn rdma_destroy_qp(id: *mut rdma_cm_id) {
    if let Ok(id) = lookup(id) {
        qp::destroy_qp(&id);
    }
}

/// `rdma_create_srq`.
///
/// # Safety
/// `pd` is NULL or a PD from libibverbs; `attr` NULL or a valid `ibv_srq_init_attr`.
pub unsafe extern "C" fn rdma_create_srq(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> c_int {
    // SAFETY: the caller's guarantees.
    ret(lookup(id).and_then(|id| unsafe { qp::create_srq(&id, pd, attr) }))
}

/// `rdma_create_srq_ex`.
///
/// # Safety
/// `attr` is NULL or a valid `ibv_srq_init_attr_ex`.
pub unsafe extern "C" fn rdma_create_srq_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_srq_init_attr_ex,
) -> c_int {
    // SAFETY: the caller's guarantee.
    ret(lookup(id).and_then(|id| unsafe { qp::create_srq_ex(&id, attr) }))
}

/// `rdma_destroy_srq`: the id's SRQ and the CQs librdmacm made for it.
///
/// # Safety
/// None beyond the C prototype: the id is looked up.
pub unsafe extern "C" fn rdma_destroy_srq(id: *mut rdma_cm_id) {
    if let Ok(id) = lookup(id) {
        qp::destroy_srq(&id);
    }
}

// ---------------------------------------------------------------------------------------------
// Endpoints: rdma_create_ep / rdma_get_request
// ---------------------------------------------------------------------------------------------

/// `rdma_get_request`: on a synchronous listener, waits for the next connection request and
/// returns its new id (holding the request in `id->event`), with the QP the listener's
/// `rdma_create_ep` asked for. `EINVAL` for a listener with a channel.
///
/// # Safety
/// `id` is NULL or writable.
pub unsafe extern "C" fn rdma_get_request(
    listen: *mut rdma_cm_id,
    id: *mut *mut rdma_cm_id,
) -> c_int {
    ret((|| {
        let listener = lookup(listen)?;
        if !listener.is_sync() || id.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: plain read and write of the listener's C struct field.
        let held = unsafe { core::mem::replace(&mut (*listener.c()).event, ptr::null_mut()) };
        if !held.is_null() {
            let _ = ack(held);
        }
        let event = fetch(&listener.channel())?;
        // SAFETY: a fetched, unacknowledged event.
        let (kind, status, new_id) = unsafe { ((*event).event, (*event).status, (*event).id) };
        let hold = |e| {
            // SAFETY: the listener's C struct; the event stays held there, as rdma-core.
            unsafe { (*listener.c()).event = event };
            Err(e)
        };
        if kind == RDMA_CM_EVENT_REJECTED {
            return hold(libc::ECONNREFUSED);
        }
        if status != 0 {
            return hold(status.abs());
        }
        if kind != RDMA_CM_EVENT_CONNECT_REQUEST {
            return hold(libc::EINVAL);
        }
        let child = lookup(new_id)?;
        if let Some(mut attr) = listener.qp_init_attr() {
            // SAFETY: plain read of the listener's PD; the attributes are a local copy.
            let pd = unsafe { (*listener.c()).pd };
            // SAFETY: as above.
            if let Err(e) = unsafe { qp::create_qp(&child, pd, &mut attr) } {
                return hold(e);
            }
        }
        // SAFETY: `id` is writable (checked non-NULL); the new id's C struct holds the
        // request, charged to the listener, until it is acknowledged or the id destroyed.
        unsafe {
            *id = new_id;
            (*new_id).event = event;
        }
        Ok(())
    })())
}

/// rdma-core's `ucma_passive_ep`: binds, and keeps the PD and QP attributes for
/// `rdma_get_request`.
///
/// # Safety
/// As `rdma_create_ep`.
unsafe fn passive_ep(
    id: &Arc<Id>,
    res: &rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> Result<(), Errno> {
    // SAFETY: the caller's guarantee (`ai_src_addr` of `ai_src_len` bytes).
    cm::check(unsafe { rdma_bind_addr(id.c_ptr(), res.ai_src_addr) }).map_err(|_| errno())?;
    if !pd.is_null() {
        // SAFETY: plain write of the id's C struct field.
        unsafe { (*id.c()).pd = pd };
    }
    // SAFETY: NULL or valid (the caller's guarantee).
    if let Some(a) = unsafe { qp_init_attr.as_ref() } {
        let mut attr = *a;
        attr.qp_type = res.ai_qp_type;
        id.set_qp_init_attr(attr);
    }
    Ok(())
}

/// `rdma_create_ep`: a synchronous id for `res`: bound, for a passive endpoint
/// (`RAI_PASSIVE`); otherwise resolved (address and route, 2 s each) and given a QP when
/// `qp_init_attr` is given.
///
/// # Safety
/// `id` is NULL or writable; `res` NULL or from `rdma_getaddrinfo`; `pd` NULL or a PD from
/// libibverbs; `qp_init_attr` NULL or valid.
pub unsafe extern "C" fn rdma_create_ep(
    id: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    ret((|| {
        // SAFETY: the caller's guarantee.
        let res = unsafe { res.as_ref() }.ok_or(libc::EINVAL)?;
        if id.is_null() {
            return Err(libc::EINVAL);
        }
        qp_type_of(res.ai_port_space)?;
        devices::init()?;
        let new = Id::create(None, ptr::null_mut(), res.ai_port_space, res.ai_qp_type)?;
        if let Err(e) = cm::attach(&new) {
            new.destroy();
            return Err(e);
        }
        let made = (|| {
            if res.ai_flags & RAI_PASSIVE != 0 {
                // SAFETY: the caller's guarantees.
                return unsafe { passive_ep(&new, res, pd, qp_init_attr) };
            }
            // SAFETY: the addresses of `res` (the caller's guarantee).
            let r =
                unsafe { rdma_resolve_addr(new.c_ptr(), res.ai_src_addr, res.ai_dst_addr, 2000) };
            cm::check(r).map_err(|_| errno())?;
            // There is no ibacm: `ai_route` is always empty, so the route is resolved.
            // SAFETY: a live id.
            cm::check(unsafe { rdma_resolve_route(new.c_ptr(), 2000) }).map_err(|_| errno())?;
            // SAFETY: NULL or valid (the caller's guarantee).
            if let Some(a) = unsafe { qp_init_attr.as_mut() } {
                a.qp_type = res.ai_qp_type;
                // SAFETY: as above.
                unsafe { qp::create_qp(&new, pd, a) }?;
            }
            if res.ai_connect_len != 0 && !res.ai_connect.is_null() {
                // SAFETY: `ai_connect_len` readable bytes (the caller's guarantee).
                let data = unsafe {
                    core::slice::from_raw_parts(res.ai_connect.cast::<u8>(), res.ai_connect_len)
                };
                new.set_connect_data(data.to_vec());
            }
            Ok(())
        })();
        if let Err(e) = made {
            // SAFETY: a live id of ours.
            unsafe { rdma_destroy_ep(new.c_ptr()) };
            return Err(e);
        }
        // SAFETY: `id` is writable (checked non-NULL).
        unsafe { *id = new.c_ptr() };
        Ok(())
    })())
}

/// `rdma_destroy_ep`: the id's QP, SRQ, then the id.
///
/// # Safety
/// None beyond the C prototype: the id is looked up.
pub unsafe extern "C" fn rdma_destroy_ep(id: *mut rdma_cm_id) {
    // SAFETY: each looks the id up itself.
    unsafe {
        rdma_destroy_qp(id);
        rdma_destroy_srq(id);
        rdma_destroy_id(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use softverbs_stub_support::Zeroed;

    /// An id whose route addresses are `src` and `dst` (as the connection manager will set
    /// them), and its ports as `rdma_get_src_port` / `rdma_get_dst_port` report them.
    fn ports(src: rdma_sockaddr, dst: rdma_sockaddr) -> (u16, u16) {
        let channel = Channel::new(false).unwrap();
        let id = Id::create(Some(channel), ptr::null_mut(), RDMA_PS_TCP, IBV_QPT_RC).unwrap();
        // SAFETY: plain writes to the live id's C struct, as the library's own code does.
        unsafe {
            (*id.c()).route.addr.src = src;
            (*id.c()).route.addr.dst = dst;
        }
        // SAFETY: a live id.
        let got = unsafe { (rdma_get_src_port(id.c_ptr()), rdma_get_dst_port(id.c_ptr())) };
        id.destroy();
        (u16::from_be(got.0), u16::from_be(got.1))
    }

    #[test]
    fn ports_of_ipv4_ipv6_and_af_ib_addresses() {
        let mut v4 = rdma_sockaddr::zeroed();
        v4.sin.sin_family = libc::AF_INET as u16;
        v4.sin.sin_port = 7471u16.to_be();
        let mut v6 = rdma_sockaddr::zeroed();
        v6.sin6.sin6_family = libc::AF_INET6 as u16;
        v6.sin6.sin6_port = 18515u16.to_be();
        assert_eq!(ports(v4, v6), (7471, 18515));
        let mut ib = rdma_sockaddr::zeroed();
        let mut sib = sockaddr_ib::zeroed();
        sib.sib_family = AF_IB as u16;
        // The port is the low 16 bits of the service ID (here PS_TCP's, port 7174).
        sib.sib_sid = (RDMA_IB_IP_PS_TCP + 7174).to_be();
        // SAFETY: a `sockaddr_ib` fits in the `sockaddr_storage` member.
        unsafe { ptr::write_unaligned((&raw mut ib.storage).cast::<sockaddr_ib>(), sib) };
        let none = rdma_sockaddr::zeroed();
        assert_eq!(ports(ib, none), (7174, 0));
        // An unknown id has no port.
        // SAFETY: the pointer is looked up, never dereferenced.
        assert_eq!(unsafe { rdma_get_src_port(ptr::null_mut()) }, 0);
    }
}
