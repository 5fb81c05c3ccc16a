//! `softverbs_private_cm@@SOFTVERBS_PRIVATE_1`: the connection manager of the process's
//! device, as the C table (`softverbs_private_abi::CmOps`) softverbs' `librdmacm.so.1`
//! drives. Why the two libraries meet here, and the rules each side keeps, are in
//! `docs/c-programs.md` ("How librdmacm reaches the device").
//!
//! Every entry maps one to one onto a [`ConnectionManager`] call on the device every
//! context of this library shares (one process, one device), so QPs librdmacm creates
//! through the public verbs are found by number. Errors become negative errno values here
//! and only here, as the kernel's ucma would answer them.

use core::ffi::{c_int, c_void};
use core::ptr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::sync::{Arc, Mutex};

use softverbs::cm::{
    CmError, CmEvent, CmEventKind, CmEventSink, CmIdHandle, CmQpState, CmQpType, ConnParam,
    ConnectionManager, EventParam, EventStatus, IdOptions, PathRecord, PortSpace, QpAttrs,
    QpBinding, RejReason, ResolveError,
};
use softverbs::Qpn;
use softverbs_private_abi::{
    self as pabi, AddrInfo, AddressVector, CmHandle, CmOps, EventSink, UdParam, ABI_VERSION,
    OPS_SIZE,
};

use crate::abi::*;
use crate::marshall::ibv_sa_path_rec;

// ---------------------------------------------------------------------------------------------
// The manager and errors
// ---------------------------------------------------------------------------------------------

/// The connection manager of the process's device, opened with the first id.
static MANAGER: Mutex<Option<ConnectionManager>> = Mutex::new(None);

/// The process's connection manager; a device opened before a `fork()` is the parent's,
/// so the child opens its own.
pub(crate) fn manager() -> Result<ConnectionManager, c_int> {
    let mut m = MANAGER.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(cm) = m.as_ref().filter(|cm| !cm.context().inherited()) {
        return Ok(cm.clone());
    }
    let ctx = softverbs::Device::list()
        .ok()
        .and_then(|mut l| (!l.is_empty()).then(|| l.remove(0)))
        .and_then(|d| d.open().ok())
        .ok_or(libc::ENODEV)?;
    let cm = ConnectionManager::new(&ctx);
    *m = Some(cm.clone());
    Ok(cm)
}

/// The errno the kernel's ucma answers for what the connection manager refused.
fn errno_of(e: &CmError) -> c_int {
    use softverbs::cm::CmError as E;
    match e {
        E::Cm(c) => match c {
            softverbs_cm::CmError::AddrInUse => libc::EADDRINUSE,
            softverbs_cm::CmError::NoFreePort => libc::EADDRNOTAVAIL,
            softverbs_cm::CmError::Unsupported(_) => libc::EOPNOTSUPP,
            _ => libc::EINVAL,
        },
        E::Bind { source, .. } => source.raw_os_error().unwrap_or(libc::EINVAL),
        E::Io(source) => source.raw_os_error().unwrap_or(libc::EIO),
        E::Inherited(_) => libc::EIO,
        E::Resource(_) => libc::ENOMEM,
        _ => libc::EINVAL,
    }
}

/// 0, or the negative errno of what failed.
fn status(r: Result<(), c_int>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => -e,
    }
}

/// Runs `f` on the manager for the id `raw` names.
fn on_id(
    raw: CmHandle,
    f: impl FnOnce(&ConnectionManager, CmIdHandle) -> Result<(), CmError>,
) -> Result<(), c_int> {
    let id = CmIdHandle::from_raw(raw).ok_or(libc::EINVAL)?;
    let cm = manager()?;
    f(&cm, id).map_err(|e| errno_of(&e))
}

// ---------------------------------------------------------------------------------------------
// Addresses
// ---------------------------------------------------------------------------------------------

/// The socket address C passed: `AF_INET` or `AF_INET6` (`EAFNOSUPPORT` for others,
/// `AF_IB` included: softverbs speaks RoCE, whose rdma_cm addresses are IP addresses).
///
/// # Safety
/// `addr` is NULL or readable for `len` bytes.
pub(crate) unsafe fn socket_addr(
    addr: *const libc::sockaddr,
    len: libc::socklen_t,
) -> Result<SocketAddr, c_int> {
    if addr.is_null() {
        return Err(libc::EINVAL);
    }
    let len = len as usize;
    // SAFETY: at least the family is readable (every sockaddr starts with it).
    let family = c_int::from(unsafe { (*addr).sa_family });
    match family {
        libc::AF_INET if len >= size_of::<libc::sockaddr_in>() => {
            // SAFETY: readable for a whole sockaddr_in (checked length).
            let sin = unsafe { ptr::read_unaligned(addr.cast::<libc::sockaddr_in>()) };
            Ok(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 if len >= size_of::<libc::sockaddr_in6>() => {
            // SAFETY: readable for a whole sockaddr_in6 (checked length).
            let sin6 = unsafe { ptr::read_unaligned(addr.cast::<libc::sockaddr_in6>()) };
            Ok(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        libc::AF_INET | libc::AF_INET6 => Err(libc::EINVAL),
        _ => Err(libc::EAFNOSUPPORT),
    }
}

/// `addr` as a `sockaddr_storage` (all zero for none).
pub(crate) fn storage(addr: Option<SocketAddr>) -> libc::sockaddr_storage {
    // SAFETY: all-zero is a valid sockaddr_storage (family AF_UNSPEC).
    let mut s: libc::sockaddr_storage = unsafe { core::mem::zeroed() };
    match addr {
        Some(SocketAddr::V4(a)) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*a.ip()).to_be(),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: a sockaddr_in fits in a sockaddr_storage.
            unsafe { ptr::write_unaligned((&raw mut s).cast(), sin) };
        }
        Some(SocketAddr::V6(a)) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: a sockaddr_in6 fits in a sockaddr_storage.
            unsafe { ptr::write_unaligned((&raw mut s).cast(), sin6) };
        }
        None => {}
    }
    s
}

/// The GID rdma_cm shows for an IP address (`id->route.addr.addr.ibaddr`): the
/// IPv4-mapped form for IPv4, the address itself for IPv6.
fn ip_gid(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// The node GUID `ibv_get_device_guid` reports for the device (network order).
fn device_guid() -> u64 {
    crate::device::list()
        .first()
        // SAFETY: device list entries are leaked, immutable `SoftDevice`s.
        .map_or(0, |&d| unsafe { (*d).guid }.to_be())
}

// ---------------------------------------------------------------------------------------------
// Events
// ---------------------------------------------------------------------------------------------

/// `enum rdma_cm_event_type`.
fn event_number(kind: CmEventKind) -> u32 {
    match kind {
        CmEventKind::AddrResolved => 0,
        CmEventKind::AddrError => 1,
        CmEventKind::RouteResolved => 2,
        CmEventKind::RouteError => 3,
        CmEventKind::ConnectRequest => 4,
        CmEventKind::ConnectResponse => 5,
        CmEventKind::ConnectError => 6,
        CmEventKind::Unreachable => 7,
        CmEventKind::Rejected => 8,
        CmEventKind::Established => 9,
        CmEventKind::Disconnected => 10,
        CmEventKind::DeviceRemoval => 11,
        CmEventKind::MulticastJoin => 12,
        CmEventKind::MulticastError => 13,
        CmEventKind::AddrChange => 14,
        CmEventKind::TimewaitExit => 15,
    }
}

/// `event->status` as rdma_cm reports it: 0, a negative errno, the REJ reason of a
/// REJECTED, the SIDR status of a UD UNREACHABLE.
fn status_number(s: EventStatus) -> i32 {
    match s {
        EventStatus::Ok => 0,
        EventStatus::TimedOut => -libc::ETIMEDOUT,
        EventStatus::Rejected(r) => i32::from(r.0),
        EventStatus::Sidr(s) => i32::from(s.0),
        EventStatus::Resolve(ResolveError::HostUnreachable) => -libc::EHOSTUNREACH,
        EventStatus::Resolve(ResolveError::NetworkUnreachable) => -libc::ENETUNREACH,
        EventStatus::Resolve(ResolveError::AddressNotAvailable) => -libc::EADDRNOTAVAIL,
        EventStatus::Resolve(_) => -libc::ENODEV,
        EventStatus::QpTransitionFailed | EventStatus::JoinFailed => -libc::EINVAL,
    }
}

fn address_vector(ah: &softverbs::cm::AhAttr) -> AddressVector {
    AddressVector {
        dgid: ah.dgid.0,
        flow_label: ah.flow_label,
        dlid: ah.dlid,
        sgid_index: ah.sgid_index,
        hop_limit: ah.hop_limit,
        traffic_class: ah.traffic_class,
        sl: ah.sl,
        static_rate: ah.static_rate,
        is_global: u8::from(ah.is_global),
        port_num: ah.port_num,
    }
}

fn ud_param(ud: &softverbs::cm::UdEventParam) -> UdParam {
    UdParam {
        qp_num: ud.qp_num.value(),
        qkey: ud.qkey,
        ah: ud.ah.as_ref().map_or(zero_av(), address_vector),
    }
}

fn zero_av() -> AddressVector {
    AddressVector {
        dgid: [0; 16],
        flow_label: 0,
        dlid: 0,
        sgid_index: 0,
        hop_limit: 0,
        traffic_class: 0,
        sl: 0,
        static_rate: 0,
        is_global: 0,
        port_num: 0,
    }
}

fn zero_conn() -> pabi::ConnParam {
    pabi::ConnParam {
        private_data: ptr::null(),
        private_data_len: 0,
        responder_resources: 0,
        initiator_depth: 0,
        flow_control: 0,
        retry_count: 0,
        rnr_retry_count: 0,
        srq: 0,
        qp_num: 0,
    }
}

/// The C event for `ev`; its pointers borrow from `ev`.
fn c_event(ev: &CmEvent) -> pabi::CmEvent {
    let mut c = pabi::CmEvent {
        event: event_number(ev.kind),
        status: status_number(ev.status),
        id: ev.id.to_raw(),
        conn: zero_conn(),
        ud: UdParam {
            qp_num: 0,
            qkey: 0,
            ah: zero_av(),
        },
        mc_context: ptr::null_mut(),
    };
    match &ev.param {
        EventParam::None => {}
        EventParam::Conn(p) => {
            c.conn = pabi::ConnParam {
                private_data: p.private_data.as_ptr(),
                private_data_len: p.private_data.len() as u32,
                responder_resources: p.responder_resources,
                initiator_depth: p.initiator_depth,
                flow_control: u8::from(p.flow_control),
                retry_count: p.retry_count,
                rnr_retry_count: p.rnr_retry_count,
                srq: u8::from(p.srq),
                qp_num: p.qp_num.value(),
            };
        }
        EventParam::Ud(u) => {
            c.conn.private_data = u.private_data.as_ptr();
            c.conn.private_data_len = u.private_data.len() as u32;
            c.ud = ud_param(u);
        }
        EventParam::Multicast { context, ud, .. } => {
            c.ud = ud_param(ud);
            c.mc_context = *context as usize as *mut c_void;
        }
    }
    c
}

/// librdmacm's `{deliver, cookie}` as a sink of the connection manager.
struct CSink(EventSink);

impl CmEventSink for CSink {
    fn deliver(&self, ev: &CmEvent) -> Option<Arc<dyn CmEventSink>> {
        let c = c_event(ev);
        // SAFETY: the callback and cookie librdmacm gave with the id; the event and the
        // bytes it points to live for the call, as the private ABI promises.
        let next = unsafe { (self.0.deliver)(self.0.cookie, &c) };
        (ev.kind == CmEventKind::ConnectRequest && !next.is_null()).then(|| {
            Arc::new(CSink(EventSink {
                deliver: self.0.deliver,
                cookie: next,
            })) as Arc<dyn CmEventSink>
        })
    }
}

// ---------------------------------------------------------------------------------------------
// The table
// ---------------------------------------------------------------------------------------------

unsafe extern "C" fn create_id(
    ps: c_int,
    qp_type: c_int,
    sink: EventSink,
    id: *mut CmHandle,
) -> c_int {
    status((|| {
        if id.is_null() {
            return Err(libc::EINVAL);
        }
        let ps = u16::try_from(ps)
            .ok()
            .and_then(PortSpace::from_value)
            .ok_or(libc::EINVAL)?;
        let qp_type = match qp_type {
            IBV_QPT_UD => CmQpType::Ud,
            // XRC ids connect as RC does; their QPs are refused where they are made
            // (EOPNOTSUPP), as softverbs has no XRC.
            IBV_QPT_RC | IBV_QPT_XRC_SEND | IBV_QPT_XRC_RECV => CmQpType::Rc,
            _ => return Err(libc::EINVAL),
        };
        let cm = manager()?;
        let handle = cm
            .create_id(ps, qp_type, Arc::new(CSink(sink)))
            .map_err(|e| errno_of(&e))?;
        // SAFETY: writable (checked non-NULL; the caller's buffer).
        unsafe { *id = handle.to_raw() };
        Ok(())
    })())
}

unsafe extern "C" fn destroy_id(id: CmHandle) -> c_int {
    status(on_id(id, |cm, id| cm.destroy_id(id)))
}

unsafe extern "C" fn bind_addr(
    id: CmHandle,
    addr: *const libc::sockaddr,
    len: libc::socklen_t,
) -> c_int {
    // SAFETY: the caller's buffer, `len` bytes.
    let addr = match unsafe { socket_addr(addr, len) } {
        Ok(a) => a,
        Err(e) => return -e,
    };
    status(on_id(id, |cm, id| cm.bind_addr(id, addr)))
}

unsafe extern "C" fn resolve_addr(
    id: CmHandle,
    src: *const libc::sockaddr,
    src_len: libc::socklen_t,
    dst: *const libc::sockaddr,
    dst_len: libc::socklen_t,
    timeout_ms: c_int,
) -> c_int {
    status((|| {
        // SAFETY: the caller's buffers.
        let dst = unsafe { socket_addr(dst, dst_len) }?;
        let src = match src.is_null() {
            true => None,
            // SAFETY: as above.
            false => Some(unsafe { socket_addr(src, src_len) }?),
        };
        let timeout = std::time::Duration::from_millis(u64::try_from(timeout_ms).unwrap_or(0));
        on_id(id, |cm, id| {
            // The kernel binds an idle id to the source address first, port included
            // (rdma_resolve_addr -> cma_bind_addr).
            if let Some(src) = src {
                if cm.state(id)? == softverbs::cm::IdState::Idle {
                    cm.bind_addr(id, src)?;
                }
            }
            cm.resolve_addr(id, None, dst, timeout)
        })
    })())
}

unsafe extern "C" fn resolve_route(id: CmHandle, _timeout_ms: c_int) -> c_int {
    status(on_id(id, |cm, id| cm.resolve_route(id)))
}

unsafe extern "C" fn query_addr(id: CmHandle, out: *mut AddrInfo) -> c_int {
    status((|| {
        if out.is_null() {
            return Err(libc::EINVAL);
        }
        let mut info = None;
        on_id(id, |cm, id| {
            info = Some((cm.local_addr(id)?, cm.peer_addr(id)?, cm.route(id)?));
            Ok(())
        })?;
        let (local, peer, route) = info.expect("filled on success");
        // The id has a device once it is bound to a specific address (or resolved, or
        // made by a request): a wildcard listener has none, as with the kernel.
        let has_device = local.is_some_and(|l| !l.ip().is_unspecified());
        let sgid = route.map(|r| r.sgid.0).or_else(|| {
            has_device.then(|| {
                manager()
                    .ok()
                    .and_then(|cm| cm.context().query_gid(1, 0).ok())
                    .map_or([0; 16], |g| g.0)
            })
        });
        let dgid = route
            .map(|r| r.dgid.0)
            .or_else(|| peer.map(|p| ip_gid(p.ip())));
        let a = AddrInfo {
            src: storage(local),
            dst: storage(peer),
            sgid: sgid.unwrap_or([0; 16]),
            dgid: dgid.unwrap_or([0; 16]),
            pkey: 0xffff_u16.to_be(),
            port_num: if has_device { 1 } else { 0 },
            node_guid: if has_device { device_guid() } else { 0 },
        };
        // SAFETY: writable (checked non-NULL; the caller's buffer).
        unsafe { out.write(a) };
        Ok(())
    })())
}

/// The path record rdma_cm shows in `id->route.path_rec` (CM.md 4.7), in rdma-core's
/// layout: LIDs, P_Key and flow label in network order, selectors "exactly" (2).
fn path_rec(r: &PathRecord) -> ibv_sa_path_rec {
    ibv_sa_path_rec {
        dgid: ibv_gid { raw: r.dgid.0 },
        sgid: ibv_gid { raw: r.sgid.0 },
        dlid: 0,
        slid: 0,
        raw_traffic: 0,
        flow_label: r.flow_label.to_be(),
        hop_limit: r.hop_limit,
        traffic_class: r.traffic_class,
        reversible: 1,
        numb_path: 1,
        pkey: r.pkey.to_be(),
        sl: r.sl,
        mtu_selector: 2,
        mtu: r.mtu.code(),
        rate_selector: 2,
        rate: r.rate,
        packet_life_time_selector: 2,
        packet_life_time: r.packet_life_time,
        preference: 0,
    }
}

unsafe extern "C" fn query_route(id: CmHandle, paths: *mut c_void, num_paths: *mut c_int) -> c_int {
    status((|| {
        if num_paths.is_null() {
            return Err(libc::EINVAL);
        }
        let mut route = None;
        on_id(id, |cm, id| {
            route = cm.route(id)?;
            Ok(())
        })?;
        // SAFETY: readable and writable (checked non-NULL; the caller's int).
        let room = unsafe { *num_paths };
        match route {
            Some(r) => {
                if room >= 1 && !paths.is_null() {
                    // SAFETY: room for `room` >= 1 path records (the caller's buffer).
                    unsafe {
                        paths
                            .cast::<ibv_sa_path_rec>()
                            .write_unaligned(path_rec(&r))
                    };
                }
                // SAFETY: as above.
                unsafe { *num_paths = 1 };
            }
            // SAFETY: as above.
            None => unsafe { *num_paths = 0 },
        }
        Ok(())
    })())
}

unsafe extern "C" fn set_qp(id: CmHandle, qp_num: u32, srq: u8, managed: u8) -> c_int {
    status(on_id(id, |cm, id| {
        cm.set_qp(
            id,
            QpBinding {
                qpn: Qpn::new(qp_num),
                srq: srq != 0,
                managed: managed != 0,
            },
        )
    }))
}

unsafe extern "C" fn clear_qp(id: CmHandle) -> c_int {
    status(on_id(id, |cm, id| cm.clear_qp(id)))
}

unsafe extern "C" fn listen(id: CmHandle, backlog: c_int) -> c_int {
    status(on_id(id, |cm, id| cm.listen(id, backlog)))
}

/// The connection parameters C passed (NULL: `None`, librdmacm's defaults).
///
/// # Safety
/// `param` is NULL or readable, its private data readable for its length.
unsafe fn conn_param(param: *const pabi::ConnParam) -> Option<ConnParam> {
    // SAFETY: the caller's guarantee.
    let p = unsafe { param.as_ref() }?;
    let private_data = if p.private_data.is_null() || p.private_data_len == 0 {
        Vec::new()
    } else {
        // SAFETY: the caller's guarantee.
        unsafe { core::slice::from_raw_parts(p.private_data, p.private_data_len as usize) }.to_vec()
    };
    Some(ConnParam {
        private_data,
        responder_resources: p.responder_resources,
        initiator_depth: p.initiator_depth,
        flow_control: p.flow_control != 0,
        retry_count: p.retry_count,
        rnr_retry_count: p.rnr_retry_count,
        srq: p.srq != 0,
        qp_num: (p.qp_num != 0).then(|| Qpn::new(p.qp_num)),
    })
}

unsafe extern "C" fn connect(id: CmHandle, param: *const pabi::ConnParam) -> c_int {
    // SAFETY: the caller's guarantee.
    let param = unsafe { conn_param(param) };
    status(on_id(id, |cm, id| cm.connect(id, param)))
}

unsafe extern "C" fn accept(id: CmHandle, param: *const pabi::ConnParam) -> c_int {
    // SAFETY: the caller's guarantee.
    let param = unsafe { conn_param(param) };
    status(on_id(id, |cm, id| cm.accept(id, param)))
}

unsafe extern "C" fn reject(id: CmHandle, data: *const u8, len: u8, reason: u8) -> c_int {
    let data = if data.is_null() || len == 0 {
        &[][..]
    } else {
        // SAFETY: readable for `len` bytes (the caller's buffer).
        unsafe { core::slice::from_raw_parts(data, usize::from(len)) }
    };
    // Reason 0 is rdma_reject's: the kernel sends "consumer defined" (28).
    let reason = match reason {
        0 => RejReason::CONSUMER_DEFINED,
        r => RejReason(u16::from(r)),
    };
    status(on_id(id, |cm, id| cm.reject_with_reason(id, data, reason)))
}

unsafe extern "C" fn establish(id: CmHandle) -> c_int {
    status(on_id(id, |cm, id| cm.establish(id)))
}

unsafe extern "C" fn disconnect(id: CmHandle) -> c_int {
    status(on_id(id, |cm, id| cm.disconnect(id)))
}

/// Writes the connection manager's attributes for one transition into rdma-core's
/// `struct ibv_qp_attr`, as the kernel's answer to `rdma_init_qp_attr` fills it.
fn fill_qp_attr(a: &QpAttrs, out: &mut ibv_qp_attr) {
    let state = out.qp_state;
    *out = ibv_qp_attr::zeroed();
    out.qp_state = state;
    out.qp_access_flags = a.access_flags;
    out.pkey_index = a.pkey_index;
    out.port_num = a.port_num;
    out.qkey = a.qkey;
    out.path_mtu = c_int::from(a.path_mtu.code());
    out.dest_qp_num = a.dest_qpn.value();
    out.rq_psn = a.rq_psn.value();
    out.sq_psn = a.sq_psn.value();
    out.max_dest_rd_atomic = a.max_dest_rd_atomic;
    out.max_rd_atomic = a.max_rd_atomic;
    out.min_rnr_timer = a.min_rnr_timer;
    out.timeout = a.timeout;
    out.retry_cnt = a.retry_cnt;
    out.rnr_retry = a.rnr_retry;
    if let Some(ah) = &a.ah {
        let av = address_vector(ah);
        out.ah_attr.grh.dgid = ibv_gid { raw: av.dgid };
        out.ah_attr.grh.flow_label = av.flow_label;
        out.ah_attr.grh.sgid_index = av.sgid_index;
        out.ah_attr.grh.hop_limit = av.hop_limit;
        out.ah_attr.grh.traffic_class = av.traffic_class;
        out.ah_attr.dlid = av.dlid;
        out.ah_attr.sl = av.sl;
        out.ah_attr.static_rate = av.static_rate;
        out.ah_attr.is_global = av.is_global;
        out.ah_attr.port_num = av.port_num;
    }
}

unsafe extern "C" fn init_qp_attr(id: CmHandle, attr: *mut c_void, mask: *mut c_int) -> c_int {
    status((|| {
        if attr.is_null() || mask.is_null() {
            return Err(libc::EINVAL);
        }
        let attr = attr.cast::<ibv_qp_attr>();
        // SAFETY: a whole `struct ibv_qp_attr` (the caller's buffer).
        let state = match unsafe { (*attr).qp_state } {
            IBV_QPS_INIT => CmQpState::Init,
            IBV_QPS_RTR => CmQpState::Rtr,
            IBV_QPS_RTS => CmQpState::Rts,
            IBV_QPS_ERR => CmQpState::Err,
            _ => return Err(libc::EINVAL),
        };
        let mut got = None;
        on_id(id, |cm, id| {
            got = Some(cm.init_qp_attr(id, state)?);
            Ok(())
        })?;
        let a = got.expect("filled on success");
        // SAFETY: as above, and `mask` is writable (checked non-NULL).
        unsafe {
            fill_qp_attr(&a, &mut *attr);
            *mask = a.mask.0 as c_int;
        }
        Ok(())
    })())
}

unsafe extern "C" fn notify(id: CmHandle, event: c_int) -> c_int {
    if event != IBV_EVENT_COMM_EST {
        // The kernel's ib_cm_notify knows only COMM_EST among the events a consumer passes.
        return -libc::EINVAL;
    }
    status(on_id(id, |cm, id| cm.notify_established(id)))
}

unsafe extern "C" fn join_multicast(
    id: CmHandle,
    addr: *const libc::sockaddr,
    len: libc::socklen_t,
    join_flags: u32,
    context: *mut c_void,
) -> c_int {
    status((|| {
        // SAFETY: the caller's buffer.
        let group = unsafe { socket_addr(addr, len) }?.ip();
        let send_only = match join_flags {
            0 => false,
            1 => true,
            _ => return Err(libc::EINVAL),
        };
        on_id(id, |cm, id| {
            cm.join_multicast(id, group, send_only, context as usize as u64)
        })
    })())
}

unsafe extern "C" fn leave_multicast(
    id: CmHandle,
    addr: *const libc::sockaddr,
    len: libc::socklen_t,
) -> c_int {
    status((|| {
        // SAFETY: the caller's buffer.
        let group = unsafe { socket_addr(addr, len) }?.ip();
        on_id(id, |cm, id| cm.leave_multicast(id, group))
    })())
}

/// `RDMA_OPTION_ID` options and their C types (the kernel's ucma checks `optlen`).
const OPTION_ID: c_int = 0;
const OPTION_IB: c_int = 1;
const OPTION_ID_TOS: c_int = 0;
const OPTION_ID_REUSEADDR: c_int = 1;
const OPTION_ID_AFONLY: c_int = 2;
const OPTION_ID_ACK_TIMEOUT: c_int = 3;
const OPTION_IB_PATH: c_int = 1;

unsafe extern "C" fn set_option(
    id: CmHandle,
    level: c_int,
    optname: c_int,
    optval: *const c_void,
    optlen: usize,
) -> c_int {
    status((|| {
        if optval.is_null() {
            return Err(libc::EINVAL);
        }
        let byte = || match optlen {
            // SAFETY: one readable byte (the caller's buffer, length checked).
            1 => Ok(unsafe { *optval.cast::<u8>() }),
            _ => Err(libc::EINVAL),
        };
        let int = || match optlen {
            // SAFETY: one readable int (the caller's buffer, length checked).
            4 => Ok(unsafe { ptr::read_unaligned(optval.cast::<c_int>()) }),
            _ => Err(libc::EINVAL),
        };
        let change: Box<dyn FnOnce(&mut IdOptions)> = match (level, optname) {
            (OPTION_ID, OPTION_ID_TOS) => {
                let v = byte()?;
                Box::new(move |o| o.tos = v)
            }
            (OPTION_ID, OPTION_ID_REUSEADDR) => {
                let v = int()? != 0;
                Box::new(move |o| o.reuse_addr = v)
            }
            (OPTION_ID, OPTION_ID_AFONLY) => {
                let v = int()? != 0;
                Box::new(move |o| o.afonly = v)
            }
            (OPTION_ID, OPTION_ID_ACK_TIMEOUT) => {
                let v = byte()?;
                Box::new(move |o| o.ack_timeout = Some(v.min(31)))
            }
            // Path records from an SA or ibacm: RoCE routes are resolved by softverbs.
            (OPTION_IB, OPTION_IB_PATH) => return Err(libc::EOPNOTSUPP),
            _ => return Err(libc::ENOSYS),
        };
        on_id(id, |cm, id| {
            let mut options = cm.options(id)?;
            change(&mut options);
            cm.set_options(id, options)
        })
    })())
}

/// The table `softverbs_private_cm` hands out.
static OPS: CmOps = CmOps {
    abi_version: ABI_VERSION,
    size: OPS_SIZE as u32,
    create_id,
    destroy_id,
    bind_addr,
    resolve_addr,
    resolve_route,
    query_addr,
    query_route,
    set_qp,
    clear_qp,
    listen,
    connect,
    accept,
    reject,
    establish,
    disconnect,
    init_qp_attr,
    notify,
    join_multicast,
    leave_multicast,
    set_option,
    stream: &crate::private_sock::STREAM_OPS,
};

/// `const struct softverbs_cm_ops *softverbs_private_cm(uint32_t abi_version)`: the
/// table when this library implements `abi_version`, else NULL.
pub extern "C" fn softverbs_private_cm(abi_version: u32) -> *const CmOps {
    if abi_version == ABI_VERSION {
        &OPS
    } else {
        ptr::null()
    }
}
