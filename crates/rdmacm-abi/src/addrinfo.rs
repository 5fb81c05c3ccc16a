//! `rdma_getaddrinfo` / `rdma_freeaddrinfo`, as rdma-core 44's librdmacm (addrinfo.c)
//! behaves: the node and service go through the system's `getaddrinfo` with hints translated
//! from the rdma hints (RAI_PASSIVE → AI_PASSIVE, RAI_NUMERICHOST → AI_NUMERICHOST, family,
//! QP type → socket type, port space → protocol), and the *first* result becomes the one
//! `rdma_addrinfo`: its address is the source for a passive lookup and the destination
//! otherwise, its QP type and port space come from the hints or else from the socket type and
//! protocol. With `RAI_FAMILY` and family `AF_IB` (and `RAI_NUMERICHOST`) an IPv6 result is
//! turned into a `sockaddr_ib` with the port space's service ID.
//!
//! Returns 0; -1 with `errno` (EINVAL, ENOMEM, ENODEV when there is no RDMA device); or the
//! `getaddrinfo` error code (`EAI_*`) unchanged, as `rdma_getaddrinfo(3)` says.
//!
//! Not done: rdma-core also asks an ibacm daemon for an IB route (`ai_route`) on the active
//! side when one runs; RoCE needs none, so `ai_route` and `ai_connect` stay empty.
//!
//! Everything handed to the program is allocated with the C allocator, as rdma-core's is.

use core::ffi::{c_char, c_int, c_void};
use core::ptr;

use softverbs_stub_support::Zeroed;

use crate::abi::*;
use crate::devices;
use crate::errno::set_errno;

/// `ERR(e)`: -1 with `errno = e`.
fn err(e: c_int) -> c_int {
    set_errno(e);
    -1
}

/// `struct addrinfo` hints from rdma hints (rdma-core's `ucma_convert_to_ai`).
fn to_ai_hints(rai: &rdma_addrinfo) -> libc::addrinfo {
    // SAFETY: `addrinfo` is plain data; all-zero is its documented "no hints" value.
    let mut ai: libc::addrinfo = unsafe { core::mem::zeroed() };
    if rai.ai_flags & RAI_PASSIVE != 0 {
        ai.ai_flags = libc::AI_PASSIVE;
    }
    if rai.ai_flags & RAI_NUMERICHOST != 0 {
        ai.ai_flags |= libc::AI_NUMERICHOST;
    }
    if rai.ai_family != AF_IB {
        ai.ai_family = rai.ai_family;
    }
    ai.ai_socktype = match rai.ai_qp_type {
        IBV_QPT_RC | IBV_QPT_UC | IBV_QPT_XRC_SEND | IBV_QPT_XRC_RECV => libc::SOCK_STREAM,
        IBV_QPT_UD => libc::SOCK_DGRAM,
        _ => 0,
    };
    ai.ai_protocol = match rai.ai_port_space {
        RDMA_PS_TCP => libc::IPPROTO_TCP,
        RDMA_PS_IPOIB | RDMA_PS_UDP => libc::IPPROTO_UDP,
        RDMA_PS_IB if ai.ai_socktype == libc::SOCK_STREAM => libc::IPPROTO_TCP,
        RDMA_PS_IB if ai.ai_socktype == libc::SOCK_DGRAM => libc::IPPROTO_UDP,
        _ => 0,
    };
    ai
}

/// A malloc'ed copy of `len` bytes of address at `src` (rdma-core's `ucma_copy_addr`).
///
/// # Safety
/// `src` points to at least `len` readable bytes.
unsafe fn copy_addr(
    dst: &mut *mut sockaddr,
    dst_len: &mut socklen_t,
    src: *const sockaddr,
    len: socklen_t,
) -> c_int {
    // SAFETY: malloc has no preconditions; checked for NULL.
    let p = unsafe { libc::malloc(len as usize) }.cast::<sockaddr>();
    if p.is_null() {
        return err(libc::ENOMEM);
    }
    // SAFETY: `src` has `len` readable bytes (caller), `p` has `len` writable ones.
    unsafe { ptr::copy_nonoverlapping(src.cast::<u8>(), p.cast::<u8>(), len as usize) };
    *dst = p;
    *dst_len = len;
    0
}

/// The `AF_IB` address for an IPv6 result (rdma-core's `ucma_convert_in6`): the IPv6 address
/// as the GID, P_Key 0xFFFF, and the service ID of port space `ps` and the result's port.
fn to_sockaddr_ib(ps: c_int, sin6: &sockaddr_in6) -> sockaddr_ib {
    let port = u16::from_be(sin6.sin6_port);
    let mut sib = sockaddr_ib::zeroed();
    sib.sib_family = AF_IB as u16;
    sib.sib_pkey = 0xFFFF_u16.to_be();
    sib.sib_flowinfo = sin6.sin6_flowinfo;
    sib.sib_addr.ib_u.uib_addr8 = sin6.sin6_addr.s6_addr;
    // rdma-core's ucma_set_sid: the service ID is (port space << 16) + port; the mask covers
    // the port space when there is one, and the port when it is nonzero.
    sib.sib_sid = (((ps as u64) << 16) + port as u64).to_be();
    let mut mask = 0u64;
    if ps != 0 {
        mask = RDMA_IB_IP_PS_MASK;
    }
    if port != 0 {
        mask |= RDMA_IB_IP_PORT_MASK;
    }
    sib.sib_sid_mask = mask.to_be();
    sib.sib_scope_id = sin6.sin6_scope_id as u64;
    sib
}

/// Stores the result's address as `rai`'s source or destination (converted to `AF_IB` when
/// the hints ask for it).
///
/// # Safety
/// `ai.ai_addr` points to `ai.ai_addrlen` readable bytes.
unsafe fn store_addr(
    addr: &mut *mut sockaddr,
    len: &mut socklen_t,
    family: &mut c_int,
    hints: &rdma_addrinfo,
    ps: c_int,
    ai: &libc::addrinfo,
) -> c_int {
    let want_ib = hints.ai_flags & RAI_FAMILY != 0
        && hints.ai_family == AF_IB
        && hints.ai_flags & RAI_NUMERICHOST != 0;
    if !want_ib {
        *family = ai.ai_family;
        // SAFETY: the caller's guarantee.
        return unsafe { copy_addr(addr, len, ai.ai_addr, ai.ai_addrlen) };
    }
    // rdma-core converts whatever came back as if it were IPv6; only an IPv6 result can be
    // (reading an IPv4 one that way would read past it).
    if ai.ai_family != libc::AF_INET6 || (ai.ai_addrlen as usize) < size_of::<sockaddr_in6>() {
        return err(libc::EINVAL);
    }
    *family = AF_IB;
    // SAFETY: an AF_INET6 result of at least that size is a `sockaddr_in6`.
    let sin6 = unsafe { ptr::read_unaligned(ai.ai_addr.cast::<sockaddr_in6>()) };
    let sib = to_sockaddr_ib(ps, &sin6);
    let sib_ptr: *const sockaddr_ib = &sib;
    // SAFETY: `sib` is a whole `sockaddr_ib` on the stack.
    unsafe {
        copy_addr(
            addr,
            len,
            sib_ptr.cast(),
            size_of::<sockaddr_ib>() as socklen_t,
        )
    }
}

/// Fills `rai` from the first `getaddrinfo` result (rdma-core's `ucma_convert_to_rai`).
///
/// # Safety
/// `ai` is a result of `getaddrinfo`.
unsafe fn from_ai(rai: &mut rdma_addrinfo, hints: &rdma_addrinfo, ai: &libc::addrinfo) -> c_int {
    rai.ai_qp_type = if hints.ai_qp_type != 0 {
        hints.ai_qp_type
    } else {
        match ai.ai_socktype {
            libc::SOCK_STREAM => IBV_QPT_RC,
            libc::SOCK_DGRAM => IBV_QPT_UD,
            _ => 0,
        }
    };
    rai.ai_port_space = if hints.ai_port_space != 0 {
        hints.ai_port_space
    } else {
        match ai.ai_protocol {
            libc::IPPROTO_TCP => RDMA_PS_TCP,
            libc::IPPROTO_UDP => RDMA_PS_UDP,
            _ => 0,
        }
    };
    let canon = if ai.ai_canonname.is_null() {
        ptr::null_mut()
    } else {
        // SAFETY: a non-NULL canonical name is a NUL-terminated string.
        unsafe { libc::strdup(ai.ai_canonname) }
    };
    let ps = rai.ai_port_space;
    if ai.ai_flags & libc::AI_PASSIVE != 0 {
        rai.ai_flags = RAI_PASSIVE;
        rai.ai_src_canonname = canon;
        // SAFETY: `ai` is a getaddrinfo result (caller).
        unsafe {
            store_addr(
                &mut rai.ai_src_addr,
                &mut rai.ai_src_len,
                &mut rai.ai_family,
                hints,
                ps,
                ai,
            )
        }
    } else {
        rai.ai_dst_canonname = canon;
        // SAFETY: as above.
        unsafe {
            store_addr(
                &mut rai.ai_dst_addr,
                &mut rai.ai_dst_len,
                &mut rai.ai_family,
                hints,
                ps,
                ai,
            )
        }
    }
}

/// `rdma_getaddrinfo`.
///
/// # Safety
/// C arguments: `node`/`service` NULL or NUL-terminated, `hints` NULL or a valid struct
/// whose address pointers cover their lengths, `res` writable (when the call succeeds).
pub unsafe fn getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    if node.is_null() && service.is_null() && hints.is_null() {
        return err(libc::EINVAL);
    }
    if res.is_null() {
        return err(libc::EINVAL);
    }
    if let Err(e) = devices::init() {
        return err(e);
    }
    // SAFETY: calloc has no preconditions; checked for NULL.
    let rai = unsafe { libc::calloc(1, size_of::<rdma_addrinfo>()) }.cast::<rdma_addrinfo>();
    if rai.is_null() {
        return err(libc::ENOMEM);
    }
    let no_hints = rdma_addrinfo::zeroed();
    // SAFETY: the caller passes NULL or a valid struct.
    let given = unsafe { hints.as_ref() };
    let h = given.unwrap_or(&no_hints);
    // SAFETY: `rai` is a fresh, zeroed allocation.
    let r = unsafe { &mut *rai };
    let mut ret = 0;
    if !node.is_null() || !service.is_null() {
        let ai_hints = given.map(to_ai_hints);
        let mut ai: *mut libc::addrinfo = ptr::null_mut();
        // SAFETY: C strings or NULL (caller); hints NULL or a local struct; `ai` writable.
        ret = unsafe {
            libc::getaddrinfo(
                node,
                service,
                ai_hints.as_ref().map_or(ptr::null(), |h| h as *const _),
                &mut ai,
            )
        };
        if ret == 0 {
            // SAFETY: getaddrinfo succeeded: `ai` is its first result.
            ret = unsafe { from_ai(r, h, &*ai) };
            // SAFETY: the list came from getaddrinfo and is freed once.
            unsafe { libc::freeaddrinfo(ai) };
        }
    } else {
        r.ai_flags = h.ai_flags;
        r.ai_family = h.ai_family;
        r.ai_qp_type = h.ai_qp_type;
        r.ai_port_space = h.ai_port_space;
        if h.ai_dst_len != 0 {
            // SAFETY: the hints' address covers its length (caller).
            ret = unsafe {
                copy_addr(
                    &mut r.ai_dst_addr,
                    &mut r.ai_dst_len,
                    h.ai_dst_addr,
                    h.ai_dst_len,
                )
            };
        }
    }
    if ret == 0 && r.ai_src_len == 0 && h.ai_src_len != 0 {
        // SAFETY: as above.
        ret = unsafe {
            copy_addr(
                &mut r.ai_src_addr,
                &mut r.ai_src_len,
                h.ai_src_addr,
                h.ai_src_len,
            )
        };
    }
    if ret != 0 {
        // SAFETY: `rai` and what it points to were allocated here.
        unsafe { freeaddrinfo(rai) };
        return ret;
    }
    // SAFETY: `res` is writable (checked non-NULL; caller).
    unsafe { *res = rai };
    0
}

/// `rdma_freeaddrinfo`: frees a list from `rdma_getaddrinfo`.
///
/// # Safety
/// `res` is NULL or a list `rdma_getaddrinfo` returned, not yet freed.
pub unsafe fn freeaddrinfo(mut res: *mut rdma_addrinfo) {
    while !res.is_null() {
        let rai = res;
        // SAFETY: a live list node (caller).
        let r = unsafe { &*rai };
        res = r.ai_next;
        for p in [
            r.ai_connect,
            r.ai_route,
            r.ai_src_canonname.cast::<c_void>(),
            r.ai_dst_canonname.cast(),
            r.ai_src_addr.cast(),
            r.ai_dst_addr.cast(),
            rai.cast(),
        ] {
            // SAFETY: each was allocated with the C allocator (or is NULL).
            unsafe { libc::free(p) };
        }
    }
}
