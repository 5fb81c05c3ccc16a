//! Address handles: `ibv_create_ah`, `ibv_destroy_ah`, `ibv_init_ah_from_wc` and
//! `ibv_create_ah_from_wc`, and the UD send operation built from `wr.ud`.
//!
//! A softverbs address handle is a device's UDP endpoint ([`softverbs::AddressHandle`]). An
//! `ibv_ah_attr` with `is_global` names it by GID (the RoCEv2 GID of its endpoint, see
//! [`softverbs::addressing`]); without a GRH, `dlid` names a device on this host, as
//! `ibv_modify_qp` does for a connected QP's address vector.
//!
//! Replies (`ibv_init_ah_from_wc`): the 40 bytes in front of a UD receive hold what a RoCEv2
//! device delivers there — for IPv4 the IPv4 header in the last 20 bytes (the first 20 zero),
//! for IPv6 the IPv6 header — as rdma-core parses it. The IP header carries the sender's
//! address but not its UDP port; the completion's `slid` is the sender's LID, which names
//! its endpoint (a loopback device at 4791, or a port on the sender's address), so the reply
//! GID is built from the header's source address and `wc->slid`.
//!
//! An AH holds its PD (counted in `SoftPd::ahs`): `ibv_dealloc_pd` refuses with EBUSY while
//! it exists, as rdma-core does.

use core::ffi::c_int;
use core::ptr;
use core::sync::atomic::Ordering;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::abi::*;
use crate::ctx::soft;
use crate::stubs::{ret_null, set_errno};
use softverbs::{AddressHandle, Gid, Qpn, SendOp};

/// What an `ibv_ah *` points at.
#[repr(C)]
pub struct SoftAh {
    /// Must be first.
    pub ah: ibv_ah,
    /// Where datagrams sent through this AH go.
    pub inner: AddressHandle,
}

/// The address an `ibv_ah_attr` names, or None if it names none softverbs can reach.
fn resolve(ctx: &softverbs::Context, a: &ibv_ah_attr) -> Option<AddressHandle> {
    // softverbs devices have port 1 only, and one GID (index 0).
    if a.port_num != 1 {
        return None;
    }
    if a.is_global != 0 {
        // SAFETY: every bit pattern of the union is a valid byte array.
        let raw = unsafe { a.grh.dgid.raw };
        if raw == [0; 16] || a.grh.sgid_index != 0 {
            return None;
        }
        Some(AddressHandle::from_gid(Gid(raw)))
    } else {
        // LID 0 is reserved and LIDs from 0xc000 are multicast (IBA 4.1.3), which softverbs
        // reaches through multicast GIDs only.
        if a.dlid == 0 || a.dlid >= 0xc000 {
            return None;
        }
        AddressHandle::from_lid(ctx, a.dlid)
    }
}

/// `ibv_create_ah`: NULL with errno EINVAL for an address softverbs cannot reach.
///
/// # Safety
/// `pd` from `ibv_alloc_pd`; `attr` valid for reads.
pub unsafe extern "C" fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    if pd.is_null() || attr.is_null() {
        return ret_null(libc::EINVAL);
    }
    // SAFETY: `pd` is a live `ibv_pd` per the contract; its context is a live context.
    let context = unsafe { (*pd).context };
    // SAFETY: as above.
    let Some(s) = (unsafe { soft(context) }) else {
        return ret_null(libc::EINVAL);
    };
    // SAFETY: `attr` is valid for reads per the contract.
    let Some(inner) = resolve(&s.ctx, unsafe { &*attr }) else {
        return ret_null(libc::EINVAL);
    };
    let mut ah = ibv_ah::zeroed();
    ah.context = context;
    ah.pd = pd;
    // SAFETY: `pd` came from `ibv_alloc_pd` per the contract.
    let p = unsafe { &*pd.cast::<crate::verbs::SoftPd>() };
    p.ahs.fetch_add(1, Ordering::AcqRel);
    Box::into_raw(Box::new(SoftAh { ah, inner })).cast()
}

/// `ibv_destroy_ah`.
///
/// # Safety
/// `ah` from `ibv_create_ah`, not yet destroyed.
pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    if ah.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: `ah` came from Box::into_raw in `ibv_create_ah`.
    let b = unsafe { Box::from_raw(ah.cast::<SoftAh>()) };
    // SAFETY: a PD outlives its AHs (`ibv_dealloc_pd` refuses while they exist).
    let p = unsafe { &*b.ah.pd.cast::<crate::verbs::SoftPd>() };
    p.ahs.fetch_sub(1, Ordering::AcqRel);
    0
}

/// The address behind an `ibv_ah *` (None for NULL).
///
/// # Safety
/// `ah` is NULL or from `ibv_create_ah` and not destroyed.
pub(crate) unsafe fn lookup(ah: *mut ibv_ah) -> Option<AddressHandle> {
    // SAFETY: per the contract `ah` is the first field of a live `SoftAh`.
    (!ah.is_null()).then(|| unsafe { (*ah.cast::<SoftAh>()).inner })
}

/// The UD SEND that `wr.ud` (or `ibv_wr_set_ud_addr`) describes: to `remote_qpn` behind `ah`
/// with `remote_qkey` (a Q_Key with the top bit set means the QP's own, IBA 10.2.4), with
/// immediate data `imm` (network order). None for a NULL AH.
///
/// # Safety
/// `ah` is NULL or from `ibv_create_ah` and not destroyed.
pub(crate) unsafe fn ud_send_op(
    ah: *mut ibv_ah,
    remote_qpn: u32,
    remote_qkey: u32,
    imm: Option<u32>,
) -> Option<SendOp> {
    // SAFETY: forwarded contract.
    let a = unsafe { lookup(ah) }?;
    Some(a.send(Qpn::new(remote_qpn), remote_qkey, imm))
}

/// The operation of a send WR posted on a UD QP: SEND or SEND_WITH_IMM to `wr.ud`; None for
/// any other opcode or a NULL AH.
///
/// # Safety
/// `w.wr.ud.ah` is NULL or from `ibv_create_ah` and not destroyed.
pub(crate) unsafe fn ud_op(w: &ibv_send_wr) -> Option<SendOp> {
    let imm = match w.opcode {
        IBV_WR_SEND => None,
        // SAFETY: plain data; SEND_WITH_IMM selects `imm_data`.
        IBV_WR_SEND_WITH_IMM => Some(unsafe { w.imm.imm_data }),
        _ => return None,
    };
    // SAFETY: on a UD QP `wr.ud` is the member the caller fills (plain data).
    let ud = unsafe { w.wr.ud };
    // SAFETY: forwarded contract.
    unsafe { ud_send_op(ud.ah, ud.remote_qpn, ud.remote_qkey, imm) }
}

/// The IP version of a GRH area, as rdma-core's `get_grh_header_version` decides it: 6 when
/// the first nibble says 6 (unless bytes 20.. hold an IPv4 header with a valid checksum),
/// 4 when bytes 20.. hold an IPv4 header, None otherwise.
fn grh_version(g: &[u8; 40]) -> Option<u8> {
    let ip4 = &g[20..];
    if g[0] >> 4 != 6 {
        return (ip4[0] >> 4 == 4).then_some(4);
    }
    if ip4[0] & 0xf != 5 {
        return Some(6);
    }
    let mut sum: u32 = ip4
        .chunks(2)
        .enumerate()
        .filter(|&(i, _)| i != 5)
        .map(|(_, p)| u32::from(u16::from_be_bytes([p[0], p[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    let check = u16::from_be_bytes([ip4[10], ip4[11]]);
    Some(if !(sum as u16) == check { 4 } else { 6 })
}

/// The GID that reaches the device at `ip` whose LID is `slid`: the endpoint the LID names
/// on that address (a port LID), else the RoCEv2 port (loopback devices, and LID 0).
/// IPv6 devices listen on the RoCEv2 port, so their GID is the address itself.
fn reply_gid(ip: IpAddr, slid: u16) -> [u8; 16] {
    let ip = match ip {
        IpAddr::V6(a) => a.to_ipv4_mapped().map_or(IpAddr::V6(a), IpAddr::V4),
        v4 => v4,
    };
    let port = if softverbs::addressing::PORT_LIDS.contains(&slid) {
        slid
    } else {
        softverbs::ROCE_PORT
    };
    match ip {
        IpAddr::V4(_) => Gid::from_socket_addr(SocketAddr::new(ip, port)).map_or([0; 16], |g| g.0),
        IpAddr::V6(a) => a.octets(),
    }
}

/// Fills `attr` from a UD receive completion and its GRH area; Err(errno).
fn init_from_wc(wc: &ibv_wc, grh: Option<&[u8; 40]>, port_num: u8) -> Result<ibv_ah_attr, c_int> {
    let mut a = ibv_ah_attr::zeroed();
    if let Some(g) = grh {
        let flow = u32::from_be_bytes([g[0], g[1], g[2], g[3]]);
        a.grh.flow_label = flow & 0xf_ffff;
    }
    a.dlid = wc.slid;
    a.sl = wc.sl;
    a.src_path_bits = wc.dlid_path_bits;
    a.port_num = port_num;
    if wc.wc_flags & IBV_WC_GRH == 0 {
        return Ok(a);
    }
    let g = grh.ok_or(libc::EINVAL)?;
    a.is_global = 1;
    // softverbs has one GID, index 0: the reply leaves from it.
    a.grh.sgid_index = 0;
    match grh_version(g) {
        Some(4) => {
            let h = &g[20..];
            let src = Ipv4Addr::new(h[12], h[13], h[14], h[15]);
            a.grh.dgid = ibv_gid {
                raw: reply_gid(IpAddr::V4(src), wc.slid),
            };
            a.grh.hop_limit = h[8];
            a.grh.traffic_class = h[1];
        }
        Some(6) => {
            // UDP (RoCEv2) or the IB next header (0x1b, RoCEv1), as rdma-core accepts.
            if g[6] != 17 && g[6] != 0x1b {
                return Err(libc::EPROTONOSUPPORT);
            }
            let mut src = [0u8; 16];
            src.copy_from_slice(&g[8..24]);
            a.grh.dgid = ibv_gid {
                raw: reply_gid(IpAddr::V6(Ipv6Addr::from(src)), wc.slid),
            };
            let flow = u32::from_be_bytes([g[0], g[1], g[2], g[3]]);
            a.grh.hop_limit = g[7];
            a.grh.traffic_class = (flow >> 20) as u8;
        }
        _ => return Err(libc::EPROTONOSUPPORT),
    }
    Ok(a)
}

/// `ibv_init_ah_from_wc`: 0, or -1 with errno.
///
/// # Safety
/// `context` from `ibv_open_device`; `wc` readable; `grh` NULL or 40 readable bytes (the start
/// of the receive buffer); `ah_attr` writable.
pub unsafe extern "C" fn ibv_init_ah_from_wc(
    context: *mut ibv_context,
    port_num: u8,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    ah_attr: *mut ibv_ah_attr,
) -> c_int {
    // SAFETY: per the contract.
    if unsafe { soft(context) }.is_none() || wc.is_null() || ah_attr.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: `grh` is NULL or 40 readable bytes per the contract (an `ibv_grh` is 40 bytes
    // with alignment 4; read unaligned as bytes).
    let g = (!grh.is_null()).then(|| unsafe { grh.cast::<[u8; 40]>().read_unaligned() });
    // SAFETY: `wc` is readable per the contract.
    match init_from_wc(unsafe { &*wc }, g.as_ref(), port_num) {
        Ok(a) => {
            // SAFETY: `ah_attr` is writable per the contract.
            unsafe { ah_attr.write(a) };
            0
        }
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

/// `ibv_create_ah_from_wc`: an AH to reply to the sender of a UD receive.
///
/// # Safety
/// `pd` from `ibv_alloc_pd`; `wc` and `grh` as for `ibv_init_ah_from_wc`.
pub unsafe extern "C" fn ibv_create_ah_from_wc(
    pd: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    port_num: u8,
) -> *mut ibv_ah {
    if pd.is_null() {
        return ret_null(libc::EINVAL);
    }
    let mut attr = ibv_ah_attr::zeroed();
    // SAFETY: `pd` is live, so is its context; the rest is forwarded.
    if unsafe { ibv_init_ah_from_wc((*pd).context, port_num, wc, grh, &mut attr) } != 0 {
        return ptr::null_mut();
    }
    // SAFETY: forwarded contract; `attr` is a valid local.
    unsafe { ibv_create_ah(pd, &mut attr) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctx::ibv_close_device;
    use crate::testing::*;
    use crate::verbs::*;

    /// Creates a UD QP and brings it to RTS as ibv_ud_pingpong does.
    ///
    /// # Safety
    /// `pd` and `cq` live.
    unsafe fn ud_qp(pd: *mut ibv_pd, cq: *mut ibv_cq, qkey: u32) -> *mut ibv_qp {
        // SAFETY: valid objects and attributes.
        unsafe {
            let mut init = ibv_qp_init_attr::zeroed();
            init.send_cq = cq;
            init.recv_cq = cq;
            init.qp_type = IBV_QPT_UD;
            init.cap.max_send_wr = 4;
            init.cap.max_recv_wr = 4;
            init.cap.max_send_sge = 1;
            init.cap.max_recv_sge = 1;
            init.cap.max_inline_data = 64;
            let qp = ibv_create_qp(pd, &mut init);
            assert!(!qp.is_null());
            assert_eq!((*qp).qp_type, IBV_QPT_UD);
            let mut at = ibv_qp_attr::zeroed();
            at.qp_state = IBV_QPS_INIT;
            at.port_num = 1;
            at.qkey = qkey;
            let m = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY;
            assert_eq!(ibv_modify_qp(qp, &mut at, m), 0);
            let mut at = ibv_qp_attr::zeroed();
            at.qp_state = IBV_QPS_RTR;
            assert_eq!(ibv_modify_qp(qp, &mut at, IBV_QP_STATE), 0);
            at.qp_state = IBV_QPS_RTS;
            at.sq_psn = 0x123;
            assert_eq!(ibv_modify_qp(qp, &mut at, IBV_QP_STATE | IBV_QP_SQ_PSN), 0);
            assert_eq!((*qp).state, IBV_QPS_RTS);
            qp
        }
    }

    #[test]
    fn ah_attr_validation() {
        // SAFETY: the test drives the C API with valid, live objects in order.
        unsafe {
            let ctx = open();
            let pd = ibv_alloc_pd(ctx);
            let mut a = ibv_ah_attr::zeroed();
            a.port_num = 1;
            // No GRH and LID 0: nothing to reach.
            assert!(ibv_create_ah(pd, &mut a).is_null());
            assert_eq!(*libc::__errno_location(), libc::EINVAL);
            a.is_global = 1;
            // A zero GID is no address either.
            assert!(ibv_create_ah(pd, &mut a).is_null());
            a.grh.dgid = ibv_gid {
                raw: Gid::from_socket_addr("127.0.0.1:23456".parse().unwrap())
                    .unwrap()
                    .0,
            };
            a.port_num = 2;
            assert!(ibv_create_ah(pd, &mut a).is_null());
            a.port_num = 1;
            let ah = ibv_create_ah(pd, &mut a);
            assert!(!ah.is_null());
            assert_eq!(((*ah).context, (*ah).pd), (ctx, pd));
            assert_eq!(
                lookup(ah).unwrap().addr(),
                "127.0.0.1:23456".parse().unwrap()
            );
            // The PD is busy while the AH exists.
            assert_eq!(ibv_dealloc_pd(pd), libc::EBUSY);
            assert_eq!(ibv_destroy_ah(ah), 0);
            assert_eq!(ibv_dealloc_pd(pd), 0);
            assert_eq!(ibv_close_device(ctx), 0);
        }
    }

    #[test]
    fn grh_parsing() {
        // An IPv4 header from 10.0.0.1 to 10.0.0.2 as rxe (and softverbs) lay it out.
        let mut g = [0u8; 40];
        let h = &mut g[20..];
        h[0] = 0x45;
        h[1] = 0x08;
        h[8] = 64;
        h[9] = 17;
        h[12..16].copy_from_slice(&[10, 0, 0, 1]);
        h[16..20].copy_from_slice(&[10, 0, 0, 2]);
        let mut sum: u32 = h
            .chunks(2)
            .map(|p| u32::from(u16::from_be_bytes([p[0], p[1]])))
            .sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        h[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
        assert_eq!(grh_version(&g), Some(4));
        let mut wc = ibv_wc::zeroed();
        wc.wc_flags = IBV_WC_GRH;
        wc.slid = 23456;
        let a = init_from_wc(&wc, Some(&g), 1).ok().unwrap();
        assert_eq!((a.is_global, a.dlid, a.port_num), (1, 23456, 1));
        assert_eq!((a.grh.hop_limit, a.grh.traffic_class), (64, 8));
        // SAFETY: plain bytes.
        let dgid = Gid(unsafe { a.grh.dgid.raw });
        assert_eq!(dgid.to_socket_addr(), "10.0.0.1:23456".parse().unwrap());
        // Without a LID the sender is taken to listen on the RoCEv2 port.
        wc.slid = 0;
        let a = init_from_wc(&wc, Some(&g), 1).ok().unwrap();
        // SAFETY: plain bytes.
        let dgid = Gid(unsafe { a.grh.dgid.raw });
        assert_eq!(dgid.to_string(), "0000:0000:0000:0000:0000:ffff:0a00:0001");
        // An IPv6 header.
        let mut g = [0u8; 40];
        g[0] = 0x60;
        g[6] = 17;
        g[7] = 5;
        g[8..24].copy_from_slice(&"2001:db8::7".parse::<Ipv6Addr>().unwrap().octets());
        assert_eq!(grh_version(&g), Some(6));
        let a = init_from_wc(&wc, Some(&g), 1).ok().unwrap();
        // SAFETY: plain bytes.
        let dgid = Gid(unsafe { a.grh.dgid.raw });
        assert_eq!(dgid.to_socket_addr(), "[2001:db8::7]:4791".parse().unwrap());
        assert_eq!(a.grh.hop_limit, 5);
        // Neither: refused.
        assert_eq!(
            init_from_wc(&wc, Some(&[0u8; 40]), 1).err(),
            Some(libc::EPROTONOSUPPORT)
        );
        // No GRH: LID only.
        wc.wc_flags = 0;
        wc.slid = 777;
        let a = init_from_wc(&wc, None, 1).ok().unwrap();
        assert_eq!((a.is_global, a.dlid), (0, 777));
    }

    /// Two UD QPs exchange datagrams through address handles: one made from a GID, the reply
    /// through `ibv_create_ah_from_wc` on the first receive; a LID-based AH works too.
    #[test]
    fn ud_send_and_reply_through_ahs() {
        // SAFETY: the whole test drives the C API with valid, live objects in order.
        unsafe {
            let ctx = open();
            let s = soft(ctx).expect("context");
            let (gid, lid) = (s.ctx.gid(), s.ctx.lid());
            let pd = ibv_alloc_pd(ctx);
            let mut buf = vec![0u8; 4 * 4096];
            let base = buf.as_mut_ptr();
            let mr = ibv_reg_mr(pd, base.cast(), buf.len(), IBV_ACCESS_LOCAL_WRITE as c_int);
            assert!(!mr.is_null());
            let cq = ibv_create_cq(ctx, 16, ptr::null_mut(), ptr::null_mut(), 0);
            assert!(!cq.is_null());
            let qkey = 0x1111_1111;
            let a = ud_qp(pd, cq, qkey);
            let b = ud_qp(pd, cq, qkey);
            let ops = (*ctx).ops;
            let post_recv = ops.post_recv.expect("op");
            let post_send = ops.post_send.expect("op");
            // Receives: A at 0 and 4096, B at 8192.
            for (qp, off) in [(a, 0u64), (a, 4096), (b, 8192)] {
                let mut sge = ibv_sge {
                    addr: base as u64 + off,
                    length: 4096,
                    lkey: (*mr).lkey,
                };
                let mut wr = ibv_recv_wr::zeroed();
                wr.wr_id = off;
                wr.sg_list = &mut sge;
                wr.num_sge = 1;
                let mut bad = ptr::null_mut();
                assert_eq!(post_recv(qp, &mut wr, &mut bad), 0);
            }

            // A -> B through a GID AH, with immediate data.
            let mut attr = ibv_ah_attr::zeroed();
            attr.is_global = 1;
            attr.grh.dgid = ibv_gid { raw: gid.0 };
            attr.grh.hop_limit = 1;
            attr.port_num = 1;
            let ah = ibv_create_ah(pd, &mut attr);
            assert!(!ah.is_null());
            let msg = b"datagram to B";
            buf[12288..12288 + msg.len()].copy_from_slice(msg);
            let mut sge = ibv_sge {
                addr: base as u64 + 12288,
                length: msg.len() as u32,
                lkey: (*mr).lkey,
            };
            let mut wr = ibv_send_wr::zeroed();
            wr.wr_id = 7;
            wr.sg_list = &mut sge;
            wr.num_sge = 1;
            wr.opcode = IBV_WR_SEND_WITH_IMM;
            wr.send_flags = IBV_SEND_SIGNALED;
            wr.imm.imm_data = 0xdead_beef_u32.to_be();
            wr.wr.ud = ibv_send_wr_ud {
                ah,
                remote_qpn: (*b).qp_num,
                remote_qkey: qkey,
            };
            let mut bad = ptr::null_mut();
            assert_eq!(post_send(a, &mut wr, &mut bad), 0);
            let mut got = Vec::new();
            while got.len() < 2 {
                got.push(poll_one(ctx, cq));
            }
            got.sort_by_key(|w| w.opcode);
            let (s, r) = (got[0], got[1]);
            assert_eq!(
                (s.wr_id, s.status, s.opcode),
                (7, IBV_WC_SUCCESS, IBV_WC_SEND)
            );
            assert_eq!(
                (r.wr_id, r.status, r.opcode),
                (8192, IBV_WC_SUCCESS, IBV_WC_RECV)
            );
            assert_eq!(r.byte_len, 40 + msg.len() as u32);
            assert_eq!((r.qp_num, r.src_qp), ((*b).qp_num, (*a).qp_num));
            assert_ne!(r.wc_flags & IBV_WC_GRH, 0);
            assert_ne!(r.wc_flags & IBV_WC_WITH_IMM, 0);
            assert_eq!(r.imm.imm_data, 0xdead_beef_u32.to_be());
            // The sender's LID; the network header type where RoCE providers report it
            // (`sl`, 2 = IPv4).
            assert_eq!((r.slid, r.sl), (lid, 2));
            assert_eq!(&buf[8192 + 40..8192 + 40 + msg.len()], msg);
            // The GRH area holds the IPv4 header (both ends are this device).
            assert_eq!(buf[8192 + 20] >> 4, 4);

            // B -> A through an AH made from the receive completion.
            let mut r = r;
            let reply = ibv_create_ah_from_wc(pd, &mut r, base.add(8192).cast(), 1);
            assert!(!reply.is_null());
            assert_eq!(lookup(reply).unwrap().addr(), s_addr(ctx));
            let mut init_attr = ibv_ah_attr::zeroed();
            assert_eq!(
                ibv_init_ah_from_wc(ctx, 1, &mut r, base.add(8192).cast(), &mut init_attr),
                0
            );
            assert_eq!((init_attr.is_global, init_attr.dlid), (1, lid));
            assert_eq!(init_attr.grh.dgid.raw, gid.0);
            let msg = b"reply to A";
            buf[12288..12288 + msg.len()].copy_from_slice(msg);
            sge.length = msg.len() as u32;
            wr.sg_list = &mut sge;
            wr.opcode = IBV_WR_SEND;
            wr.wr_id = 8;
            // The controlled Q_Key (top bit set) sends with B's own Q_Key.
            wr.wr.ud = ibv_send_wr_ud {
                ah: reply,
                remote_qpn: (*a).qp_num,
                remote_qkey: 0x8000_0000,
            };
            assert_eq!(post_send(b, &mut wr, &mut bad), 0);
            let mut got = [poll_one(ctx, cq), poll_one(ctx, cq)];
            got.sort_by_key(|w| w.opcode);
            assert_eq!((got[0].wr_id, got[0].status), (8, IBV_WC_SUCCESS));
            let r = got[1];
            assert_eq!((r.wr_id, r.status, r.byte_len), (0, IBV_WC_SUCCESS, 50));
            assert_eq!((r.qp_num, r.src_qp), ((*a).qp_num, (*b).qp_num));
            assert_eq!(r.wc_flags & IBV_WC_WITH_IMM, 0);
            assert_eq!(&buf[40..50], msg);

            // B -> A again through a LID AH, inline from a buffer outside any MR.
            let mut lattr = ibv_ah_attr::zeroed();
            lattr.dlid = lid;
            lattr.port_num = 1;
            let lah = ibv_create_ah(pd, &mut lattr);
            assert!(!lah.is_null());
            wr.wr.ud.ah = lah;
            wr.wr.ud.remote_qkey = qkey;
            wr.wr_id = 9;
            wr.send_flags |= IBV_SEND_INLINE;
            let imsg = b"inline: UD";
            let mut isge = ibv_sge {
                addr: imsg.as_ptr() as u64,
                length: imsg.len() as u32,
                lkey: 0,
            };
            wr.sg_list = &mut isge;
            assert_eq!(post_send(b, &mut wr, &mut bad), 0);
            let mut got = [poll_one(ctx, cq), poll_one(ctx, cq)];
            got.sort_by_key(|w| w.opcode);
            assert_eq!((got[1].wr_id, got[1].byte_len), (4096, 50));
            assert_eq!(&buf[4096 + 40..4096 + 50], imsg);

            // Only SEND and SEND_WITH_IMM exist on UD; a NULL AH is refused.
            wr.opcode = IBV_WR_RDMA_WRITE;
            assert_eq!(post_send(b, &mut wr, &mut bad), libc::EINVAL);
            assert_eq!(bad, &mut wr as *mut _);
            wr.opcode = IBV_WR_SEND;
            wr.wr.ud.ah = ptr::null_mut();
            assert_eq!(post_send(b, &mut wr, &mut bad), libc::EINVAL);

            for ah in [ah, reply, lah] {
                assert_eq!(ibv_destroy_ah(ah), 0);
            }
            assert_eq!(ibv_destroy_qp(a), 0);
            assert_eq!(ibv_destroy_qp(b), 0);
            assert_eq!(ibv_destroy_cq(cq), 0);
            assert_eq!(ibv_dereg_mr(mr), 0);
            assert_eq!(ibv_dealloc_pd(pd), 0);
            assert_eq!(ibv_close_device(ctx), 0);
        }
    }

    /// The device's own UDP endpoint.
    ///
    /// # Safety
    /// `ctx` live.
    unsafe fn s_addr(ctx: *mut ibv_context) -> SocketAddr {
        // SAFETY: per the contract.
        unsafe { soft(ctx) }.expect("context").ctx.local_addr()
    }

    /// A UD QP joins a multicast group with `ibv_attach_mcast`; a datagram sent to the
    /// group's GID (QPN 0xffffff) reaches it; after `ibv_detach_mcast` a second detach is
    /// refused, and an RC QP cannot attach.
    #[test]
    fn multicast_attach_receive_detach() {
        // SAFETY: the whole test drives the C API with valid, live objects in order.
        unsafe {
            let ctx = open();
            let port = std::net::UdpSocket::bind("127.0.0.1:0")
                .and_then(|s| s.local_addr())
                .expect("free port")
                .port();
            let group: SocketAddr = SocketAddr::from(([239, 7, 7, 7], port));
            let mgid = softverbs::Gid::from_socket_addr(group).expect("group GID");
            assert!(mgid.is_multicast());
            let pd = ibv_alloc_pd(ctx);
            let mut buf = vec![0u8; 8192];
            let base = buf.as_mut_ptr();
            let mr = ibv_reg_mr(pd, base.cast(), buf.len(), IBV_ACCESS_LOCAL_WRITE as c_int);
            let cq = ibv_create_cq(ctx, 16, ptr::null_mut(), ptr::null_mut(), 0);
            let qkey = 0x0123_4567;
            let (member, sender) = (ud_qp(pd, cq, qkey), ud_qp(pd, cq, qkey));
            let gid = ibv_gid { raw: mgid.0 };
            assert_eq!(ibv_attach_mcast(member, &gid, 0), 0);
            let mut sge = ibv_sge {
                addr: base as u64,
                length: 4096,
                lkey: (*mr).lkey,
            };
            let mut rwr = ibv_recv_wr::zeroed();
            rwr.wr_id = 1;
            rwr.sg_list = &mut sge;
            rwr.num_sge = 1;
            let mut bad = ptr::null_mut();
            assert_eq!(
                ((*ctx).ops.post_recv.expect("op"))(member, &mut rwr, &mut bad),
                0
            );

            let mut attr = ibv_ah_attr::zeroed();
            attr.is_global = 1;
            attr.grh.dgid = gid;
            attr.port_num = 1;
            let ah = ibv_create_ah(pd, &mut attr);
            assert!(!ah.is_null());
            let msg = b"to the group";
            buf[4096..4096 + msg.len()].copy_from_slice(msg);
            let mut ssge = ibv_sge {
                addr: base as u64 + 4096,
                length: msg.len() as u32,
                lkey: (*mr).lkey,
            };
            let mut wr = ibv_send_wr::zeroed();
            wr.wr_id = 2;
            wr.sg_list = &mut ssge;
            wr.num_sge = 1;
            wr.opcode = IBV_WR_SEND;
            wr.send_flags = IBV_SEND_SIGNALED;
            wr.wr.ud = ibv_send_wr_ud {
                ah,
                remote_qpn: 0x00ff_ffff,
                remote_qkey: qkey,
            };
            let mut bad = ptr::null_mut();
            assert_eq!(
                ((*ctx).ops.post_send.expect("op"))(sender, &mut wr, &mut bad),
                0
            );
            let mut got = [poll_one(ctx, cq), poll_one(ctx, cq)];
            got.sort_by_key(|w| w.wr_id);
            assert_eq!((got[0].wr_id, got[0].status), (1, IBV_WC_SUCCESS));
            assert_eq!(got[0].opcode, IBV_WC_RECV);
            assert_eq!(got[0].byte_len, 40 + msg.len() as u32);
            assert_eq!(got[0].src_qp, (*sender).qp_num);
            assert_eq!(&buf[40..40 + msg.len()], msg);
            assert_eq!((got[1].wr_id, got[1].status), (2, IBV_WC_SUCCESS));

            assert_eq!(ibv_detach_mcast(member, &gid, 0), 0);
            assert_eq!(ibv_detach_mcast(member, &gid, 0), libc::EINVAL);
            assert_eq!(ibv_attach_mcast(member, ptr::null(), 0), libc::EINVAL);
            let mut init = ibv_qp_init_attr::zeroed();
            init.send_cq = cq;
            init.recv_cq = cq;
            init.qp_type = IBV_QPT_RC;
            let rc = ibv_create_qp(pd, &mut init);
            assert!(!rc.is_null());
            assert_eq!(ibv_attach_mcast(rc, &gid, 0), libc::EINVAL);

            assert_eq!(ibv_destroy_qp(rc), 0);
            assert_eq!(ibv_destroy_ah(ah), 0);
            assert_eq!(ibv_destroy_qp(member), 0);
            assert_eq!(ibv_destroy_qp(sender), 0);
            assert_eq!(ibv_destroy_cq(cq), 0);
            assert_eq!(ibv_dereg_mr(mr), 0);
            assert_eq!(ibv_dealloc_pd(pd), 0);
            assert_eq!(ibv_close_device(ctx), 0);
        }
    }
}
