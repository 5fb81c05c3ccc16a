//! The rdma_cm functions (`<rdma/rdma_cma.h>`) behind the exports.
//!
//! Done for real: event channels, ids (create, destroy, migrate, synchronous ids), events
//! (get, ack), devices, address lookup, ports, ECE options, destroying the verbs objects an
//! id holds, `rdma_event_str`. The calls that need the connection manager (bind, resolve,
//! listen, connect, accept, ...) check their id and fail with `ENOSYS`: after saying once on
//! stderr what is missing when the loaded libibverbs.so.1 has no connection manager, and
//! because this library does not drive it yet when it has one.
//!
//! Every pointer librdmacm handed out is checked against the live objects before use: an
//! unknown, NULL or destroyed id, channel or event is `EINVAL`, never a crash.

use core::ffi::{c_char, c_int, c_void, CStr};
use core::ptr;
use std::sync::Arc;

use crate::abi::*;
use crate::channel::Channel;
use crate::errno::{ret, ret_ptr, Errno};
use crate::event::{ack, hand_out};
use crate::ibverbs::{cm_ops, libibverbs};
use crate::id::{qp_type_of, Id, CHANNELS, IDS};
use crate::{addrinfo, cm, devices};

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
        let taken = channel.take(|e| e.owner.count_reported())?;
        // SAFETY: `event` is writable (caller), checked non-NULL.
        unsafe { *event = hand_out(taken) };
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
// The verbs objects an id holds
// ---------------------------------------------------------------------------------------------

/// rdma-core's `ucma_destroy_cqs`: destroys the CQs and completion channels librdmacm made
/// for the id (never the program's own, which it does not store in the id).
fn destroy_cqs(c: &mut rdma_cm_id) {
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

/// `rdma_destroy_qp`: destroys the id's QP and the CQs librdmacm made for it.
///
/// # Safety
/// None beyond the C prototype: the id is looked up before use.
pub unsafe extern "C" fn rdma_destroy_qp(id: *mut rdma_cm_id) {
    let (Ok(id), Ok(verbs)) = (lookup(id), libibverbs()) else {
        return;
    };
    // SAFETY: the live id's C struct, accessed as rdma-core accesses it.
    let c = unsafe { &mut *id.c() };
    if !c.qp.is_null() {
        // SAFETY: the id's QP, destroyed once (the field is cleared).
        unsafe { (verbs.destroy_qp)(c.qp) };
        c.qp = ptr::null_mut();
    }
    destroy_cqs(c);
}

/// `rdma_destroy_srq`: destroys the id's SRQ and the CQs librdmacm made for it.
///
/// # Safety
/// None beyond the C prototype: the id is looked up before use.
pub unsafe extern "C" fn rdma_destroy_srq(id: *mut rdma_cm_id) {
    let (Ok(id), Ok(verbs)) = (lookup(id), libibverbs()) else {
        return;
    };
    // SAFETY: as in `rdma_destroy_qp`.
    let c = unsafe { &mut *id.c() };
    if !c.srq.is_null() {
        // SAFETY: the id's SRQ, destroyed once (the field is cleared).
        unsafe { (verbs.destroy_srq)(c.srq) };
        c.srq = ptr::null_mut();
    }
    destroy_cqs(c);
}

/// `rdma_destroy_ep`: the id's QP, SRQ, then the id.
///
/// # Safety
/// None beyond the C prototype: the id is looked up before use.
pub unsafe extern "C" fn rdma_destroy_ep(id: *mut rdma_cm_id) {
    // SAFETY: each looks the id up itself.
    unsafe {
        rdma_destroy_qp(id);
        rdma_destroy_srq(id);
        rdma_destroy_id(id);
    }
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
// What needs the connection manager
// ---------------------------------------------------------------------------------------------

/// A call on `id` that needs the connection manager: `EINVAL` for an unknown id, else
/// `ENOSYS` (with the reason on stderr, once, when there is no connection manager).
fn needs_cm(id: *const rdma_cm_id) -> c_int {
    ret((|| {
        lookup(id)?;
        cm_ops()?;
        Err(libc::ENOSYS)
    })())
}

/// Declares rdma_cm functions that need the connection manager: each checks its id and
/// fails as [`needs_cm`] says.
macro_rules! cm_calls {
    ($( $(#[$doc:meta])* fn $name:ident($id:ident: $idty:ty $(, $arg:ident: $ty:ty)*); )*) => {$(
        $(#[$doc])*
        ///
        /// # Safety
        /// None beyond the C prototype: the id is looked up, nothing else is read.
        pub unsafe extern "C" fn $name($id: $idty $(, $arg: $ty)*) -> c_int {
            $( let _ = $arg; )*
            needs_cm($id)
        }
    )*};
}

cm_calls! {
    /// `rdma_bind_addr`
    fn rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut sockaddr);
    /// `rdma_resolve_addr`
    fn rdma_resolve_addr(
        id: *mut rdma_cm_id, src: *mut sockaddr, dst: *mut sockaddr, timeout_ms: c_int);
    /// `rdma_resolve_route`
    fn rdma_resolve_route(id: *mut rdma_cm_id, timeout_ms: c_int);
    /// `rdma_create_qp` (the QP's first transitions need the connection manager's attributes)
    fn rdma_create_qp(id: *mut rdma_cm_id, pd: *mut ibv_pd, attr: *mut c_void);
    /// `rdma_create_qp_ex`
    fn rdma_create_qp_ex(id: *mut rdma_cm_id, attr: *mut c_void);
    /// `rdma_create_srq`
    fn rdma_create_srq(id: *mut rdma_cm_id, pd: *mut ibv_pd, attr: *mut c_void);
    /// `rdma_create_srq_ex`
    fn rdma_create_srq_ex(id: *mut rdma_cm_id, attr: *mut c_void);
    /// `rdma_connect`
    fn rdma_connect(id: *mut rdma_cm_id, param: *mut rdma_conn_param);
    /// `rdma_establish`
    fn rdma_establish(id: *mut rdma_cm_id);
    /// `rdma_listen`
    fn rdma_listen(id: *mut rdma_cm_id, backlog: c_int);
    /// `rdma_get_request`
    fn rdma_get_request(listen: *mut rdma_cm_id, id: *mut *mut rdma_cm_id);
    /// `rdma_accept`
    fn rdma_accept(id: *mut rdma_cm_id, param: *mut rdma_conn_param);
    /// `rdma_reject`
    fn rdma_reject(id: *mut rdma_cm_id, data: *const c_void, len: u8);
    /// `rdma_reject_ece`
    fn rdma_reject_ece(id: *mut rdma_cm_id, data: *const c_void, len: u8);
    /// `rdma_notify`
    fn rdma_notify(id: *mut rdma_cm_id, event: c_int);
    /// `rdma_disconnect`
    fn rdma_disconnect(id: *mut rdma_cm_id);
    /// `rdma_join_multicast`
    fn rdma_join_multicast(id: *mut rdma_cm_id, addr: *mut sockaddr, context: *mut c_void);
    /// `rdma_join_multicast_ex`
    fn rdma_join_multicast_ex(
        id: *mut rdma_cm_id, attr: *mut rdma_cm_join_mc_attr_ex, context: *mut c_void);
    /// `rdma_leave_multicast`
    fn rdma_leave_multicast(id: *mut rdma_cm_id, addr: *mut sockaddr);
    /// `rdma_set_option`
    fn rdma_set_option(
        id: *mut rdma_cm_id, level: c_int, optname: c_int, optval: *mut c_void, optlen: usize);
    /// `rdma_init_qp_attr`
    fn rdma_init_qp_attr(id: *mut rdma_cm_id, attr: *mut c_void, mask: *mut c_int);
}

/// `rdma_create_ep`: needs the connection manager (to bind or resolve the new id).
///
/// # Safety
/// None beyond the C prototype: nothing is read through the pointers.
pub unsafe extern "C" fn rdma_create_ep(
    id: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    _pd: *mut ibv_pd,
    _qp_init_attr: *mut c_void,
) -> c_int {
    ret((|| {
        if id.is_null() || res.is_null() {
            return Err(libc::EINVAL);
        }
        cm_ops()?;
        Err(libc::ENOSYS)
    })())
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
