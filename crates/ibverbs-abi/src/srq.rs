//! Shared receive queues: `ibv_create_srq`, `ibv_destroy_srq`, `ibv_modify_srq`,
//! `ibv_query_srq` and the `post_srq_recv` op the `ibv_post_srq_recv` inline calls.
//!
//! QPs take an SRQ through `ibv_qp_init_attr.srq` (`crate::verbs::create_qp_common`), which
//! counts them here so `ibv_destroy_srq` fails with EBUSY while any QP uses the SRQ.
//! `ibv_create_srq_ex` (XRC) stays unsupported.

use core::ffi::c_int;

use crate::abi::*;
use crate::stubs::ret_null;
use crate::verbs::SoftPd;

/// `IBV_SRQ_MAX_WR` of `enum ibv_srq_attr_mask`: resize the SRQ.
pub const IBV_SRQ_MAX_WR: c_int = 1 << 0;
/// `IBV_SRQ_LIMIT` of `enum ibv_srq_attr_mask`: arm the limit event.
pub const IBV_SRQ_LIMIT: c_int = 1 << 1;

/// What an `ibv_srq *` points at.
#[repr(C)]
pub struct SoftSrq {
    /// Must be first.
    pub srq: ibv_srq,
    /// The softverbs SRQ.
    pub inner: softverbs::Srq,
    /// SGEs a receive may carry.
    max_sge: u32,
}

fn resource_errno(e: softverbs::error::ResourceError) -> c_int {
    crate::verbs::resource_errno(&e)
}

/// The wrapper behind an `ibv_srq *` (NULL stays None).
///
/// # Safety
/// `srq` is NULL or from `ibv_create_srq` and not destroyed.
pub(crate) unsafe fn wrap_srq<'a>(srq: *mut ibv_srq) -> Option<&'a SoftSrq> {
    // SAFETY: per the contract `srq` is the first field of a live `#[repr(C)]` SoftSrq.
    unsafe { crate::verbs::wrap(srq) }
}

/// `ibv_create_srq`: writes the capacities granted back into `srq_init_attr.attr`.
///
/// # Safety
/// `pd` from `ibv_alloc_pd`; `srq_init_attr` valid for reads and writes.
pub unsafe extern "C" fn ibv_create_srq(
    pd: *mut ibv_pd,
    srq_init_attr: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    if pd.is_null() || srq_init_attr.is_null() {
        return ret_null(libc::EINVAL);
    }
    // SAFETY: `pd` came from `ibv_alloc_pd`: the first field of a live SoftPd.
    let p = unsafe { &*pd.cast::<SoftPd>() };
    // SAFETY: a PD's context is live while the PD is.
    if let Err(e) = unsafe { crate::ctx::usable(p.pd.context) } {
        return ret_null(e);
    }
    // SAFETY: valid per the contract.
    let init = unsafe { &mut *srq_init_attr };
    let max_wr = init.attr.max_wr.max(1);
    let max_sge = init.attr.max_sge.max(1);
    if init.attr.srq_limit > max_wr {
        return ret_null(libc::EINVAL);
    }
    let inner = match p.inner.create_srq(max_wr, max_sge) {
        Ok(s) => s,
        Err(e) => return ret_null(resource_errno(e)),
    };
    if init.attr.srq_limit != 0 {
        if let Err(e) = inner.arm_limit(init.attr.srq_limit) {
            return ret_null(resource_errno(e));
        }
    }
    init.attr.max_wr = max_wr;
    init.attr.max_sge = max_sge;
    let mut srq = ibv_srq::zeroed();
    srq.context = p.pd.context;
    srq.srq_context = init.srq_context;
    srq.pd = pd;
    let handle = inner.handle();
    let raw = Box::into_raw(Box::new(SoftSrq {
        srq,
        inner,
        max_sge,
    }));
    crate::ctx::with_objects(p.pd.context, |o| {
        o.srqs.insert(handle, raw as usize);
    });
    raw.cast()
}

/// `ibv_destroy_srq`: EBUSY while QPs use the SRQ; otherwise no event of it is delivered
/// from now on, and the call waits until every async event reported for it was
/// acknowledged.
///
/// # Safety
/// `srq` from `ibv_create_srq`, not yet destroyed.
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    // SAFETY: per the contract.
    let Some(s) = (unsafe { wrap_srq(srq) }) else {
        return libc::EINVAL;
    };
    // SAFETY: an SRQ's context is live while the SRQ is.
    if let Err(e) = unsafe { crate::ctx::usable(s.srq.context) } {
        return e;
    }
    if s.inner.in_use() {
        return libc::EBUSY;
    }
    s.inner.close_events();
    s.inner.wait_events_acked();
    let handle = s.inner.handle();
    crate::ctx::with_objects(s.srq.context, |o| {
        o.srqs.remove(&handle);
    });
    // SAFETY: `srq` came from Box::into_raw in `ibv_create_srq` and is no longer listed.
    drop(unsafe { Box::from_raw(srq.cast::<SoftSrq>()) });
    0
}

/// `ibv_modify_srq`: `IBV_SRQ_LIMIT` arms the limit event (0 disarms); `IBV_SRQ_MAX_WR` is
/// accepted only for the current capacity (softverbs cannot resize an SRQ: EOPNOTSUPP).
/// 0 or an errno value.
///
/// # Safety
/// `srq` from `ibv_create_srq`; `attr` valid for reads.
pub unsafe extern "C" fn ibv_modify_srq(
    srq: *mut ibv_srq,
    attr: *mut ibv_srq_attr,
    mask: c_int,
) -> c_int {
    // SAFETY: per the contract.
    let Some(s) = (unsafe { wrap_srq(srq) }) else {
        return libc::EINVAL;
    };
    if attr.is_null() || mask & !(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT) != 0 {
        return libc::EINVAL;
    }
    // SAFETY: valid for reads per the contract.
    let a = unsafe { *attr };
    let cur = match s.inner.query() {
        Ok(c) => c,
        Err(e) => return resource_errno(e),
    };
    if mask & IBV_SRQ_MAX_WR != 0 && a.max_wr != cur.max_wr {
        return libc::EOPNOTSUPP;
    }
    if mask & IBV_SRQ_LIMIT != 0 {
        if let Err(e) = s.inner.arm_limit(a.srq_limit) {
            return resource_errno(e);
        }
    }
    0
}

/// `ibv_query_srq`: 0 or an errno value.
///
/// # Safety
/// `srq` from `ibv_create_srq`; `srq_attr` writable.
pub unsafe extern "C" fn ibv_query_srq(srq: *mut ibv_srq, srq_attr: *mut ibv_srq_attr) -> c_int {
    // SAFETY: per the contract.
    let Some(s) = (unsafe { wrap_srq(srq) }) else {
        return libc::EINVAL;
    };
    if srq_attr.is_null() {
        return libc::EINVAL;
    }
    match s.inner.query() {
        Ok(q) => {
            // SAFETY: writable per the contract.
            unsafe {
                srq_attr.write(ibv_srq_attr {
                    max_wr: q.max_wr,
                    max_sge: q.max_sge,
                    srq_limit: q.srq_limit,
                })
            };
            0
        }
        Err(e) => resource_errno(e),
    }
}

/// The `post_srq_recv` op.
pub(crate) unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: the inline passes an SRQ from `ibv_create_srq`.
    let Some(s) = (unsafe { wrap_srq(srq) }) else {
        return libc::EINVAL;
    };
    let posted = s.inner.post_recvs(|poster| {
        // SAFETY: the list comes from the caller as the verbs contract says.
        unsafe { crate::verbs::post_recv_list(wr, s.max_sge, |id, sg| poster.post(id, sg)) }
    });
    // SAFETY: `bad_wr` is NULL or writable per the verbs contract.
    unsafe { crate::verbs::finish_recv_list(posted, wr, bad_wr) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctx::{ibv_close_device, ibv_get_async_event, ibv_open_device, soft};
    use crate::exports::{ibv_free_device_list, ibv_get_device_list};
    use crate::testing::*;
    use crate::verbs::*;
    use core::ffi::c_void;
    use core::ptr;

    /// Brings an RC QP to RTS connected to `peer` on this device.
    ///
    /// # Safety
    /// `qp` and `peer` live QPs of the device with LID `lid`.
    unsafe fn connect(qp: *mut ibv_qp, peer: *mut ibv_qp, lid: u16) {
        // SAFETY: valid QPs and attributes.
        unsafe {
            let mut at = ibv_qp_attr::zeroed();
            at.qp_state = IBV_QPS_INIT;
            at.port_num = 1;
            let m = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
            assert_eq!(ibv_modify_qp(qp, &mut at, m), 0);
            let mut at = ibv_qp_attr::zeroed();
            at.qp_state = IBV_QPS_RTR;
            at.path_mtu = IBV_MTU_1024;
            at.dest_qp_num = (*peer).qp_num;
            at.max_dest_rd_atomic = 1;
            at.min_rnr_timer = 12;
            at.ah_attr.dlid = lid;
            at.ah_attr.port_num = 1;
            let m = IBV_QP_STATE
                | IBV_QP_AV
                | IBV_QP_PATH_MTU
                | IBV_QP_DEST_QPN
                | IBV_QP_RQ_PSN
                | IBV_QP_MAX_DEST_RD_ATOMIC
                | IBV_QP_MIN_RNR_TIMER;
            assert_eq!(ibv_modify_qp(qp, &mut at, m), 0);
            let mut at = ibv_qp_attr::zeroed();
            at.qp_state = IBV_QPS_RTS;
            at.timeout = 14;
            at.retry_cnt = 7;
            at.rnr_retry = 7;
            at.max_rd_atomic = 1;
            let m = IBV_QP_STATE
                | IBV_QP_TIMEOUT
                | IBV_QP_RETRY_CNT
                | IBV_QP_RNR_RETRY
                | IBV_QP_SQ_PSN
                | IBV_QP_MAX_QP_RD_ATOMIC;
            assert_eq!(ibv_modify_qp(qp, &mut at, m), 0);
        }
    }

    /// Two RC QPs take their receives from one SRQ; senders on two other QPs each fill one.
    /// The SRQ limit event fires when the SRQ runs low; the SRQ and its PD refuse to go
    /// while used.
    #[test]
    fn srq_shared_by_two_qps() {
        // SAFETY: the whole test drives the C API with valid, live objects in order.
        unsafe {
            let ctx = open();
            let lid = soft(ctx).expect("context").ctx.lid();
            let pd = ibv_alloc_pd(ctx);
            let mut buf = vec![0u8; 8 * 1024];
            let base = buf.as_mut_ptr();
            let mr = ibv_reg_mr(pd, base.cast(), buf.len(), IBV_ACCESS_LOCAL_WRITE as c_int);
            assert!(!mr.is_null());
            let cq = ibv_create_cq(ctx, 32, ptr::null_mut(), ptr::null_mut(), 0);
            assert!(!cq.is_null());

            // Bad attributes, then a real SRQ.
            let tag = 0xabc_usize as *mut c_void;
            let mut sattr = ibv_srq_init_attr::zeroed();
            sattr.srq_context = tag;
            sattr.attr.max_wr = 4;
            sattr.attr.max_sge = 1;
            sattr.attr.srq_limit = 5;
            assert!(ibv_create_srq(pd, &mut sattr).is_null());
            assert!(ibv_create_srq(ptr::null_mut(), &mut sattr).is_null());
            sattr.attr.srq_limit = 0;
            let srq = ibv_create_srq(pd, &mut sattr);
            assert!(!srq.is_null());
            assert_eq!(
                ((*srq).context, (*srq).pd, (*srq).srq_context),
                (ctx, pd, tag)
            );
            assert_eq!((sattr.attr.max_wr, sattr.attr.max_sge), (4, 1));
            let mut q = ibv_srq_attr {
                max_wr: 0,
                max_sge: 0,
                srq_limit: 9,
            };
            assert_eq!(ibv_query_srq(srq, &mut q), 0);
            assert_eq!((q.max_wr, q.max_sge, q.srq_limit), (4, 1, 0));

            // Receivers r1, r2 on the SRQ; senders s1, s2 connected to them.
            let mut init = ibv_qp_init_attr::zeroed();
            init.send_cq = cq;
            init.recv_cq = cq;
            init.qp_type = IBV_QPT_RC;
            init.cap.max_send_wr = 4;
            init.cap.max_send_sge = 1;
            init.srq = srq;
            let r1 = ibv_create_qp(pd, &mut init);
            let r2 = ibv_create_qp(pd, &mut init);
            assert!(!r1.is_null() && !r2.is_null());
            assert_eq!((*r1).srq, srq);
            let mut qa = ibv_qp_attr::zeroed();
            let mut qi = ibv_qp_init_attr::zeroed();
            assert_eq!(ibv_query_qp(r1, &mut qa, 0, &mut qi), 0);
            assert_eq!(qi.srq, srq);
            // UC cannot use an SRQ.
            init.qp_type = IBV_QPT_UC;
            assert!(ibv_create_qp(pd, &mut init).is_null());
            init.qp_type = IBV_QPT_RC;
            init.srq = ptr::null_mut();
            init.cap.max_recv_wr = 1;
            init.cap.max_recv_sge = 1;
            let s1 = ibv_create_qp(pd, &mut init);
            let s2 = ibv_create_qp(pd, &mut init);
            assert!(!s1.is_null() && !s2.is_null());
            for (a, b) in [(r1, s1), (s1, r1), (r2, s2), (s2, r2)] {
                connect(a, b, lid);
            }

            // Receives go to the SRQ, not to a QP using it.
            let post_srq_recv = (*ctx).ops.post_srq_recv.expect("post_srq_recv op");
            let post_recv = (*ctx).ops.post_recv.expect("op");
            let post_send = (*ctx).ops.post_send.expect("op");
            let mut sges = [0u64, 1024, 2048, 3072].map(|off| ibv_sge {
                addr: base as u64 + off,
                length: 1024,
                lkey: (*mr).lkey,
            });
            let mut wrs = [ibv_recv_wr::zeroed(); 4];
            for (i, w) in wrs.iter_mut().enumerate() {
                w.wr_id = 100 + i as u64;
                w.sg_list = &mut sges[i];
                w.num_sge = 1;
            }
            let mut bad = ptr::null_mut();
            assert_eq!(post_recv(r1, &mut wrs[0], &mut bad), libc::EINVAL);
            // A chain of three receives, then one more.
            wrs[0].next = &mut wrs[1];
            wrs[1].next = &mut wrs[2];
            assert_eq!(post_srq_recv(srq, &mut wrs[0], &mut bad), 0);
            assert_eq!(post_srq_recv(srq, &mut wrs[3], &mut bad), 0);
            // The SRQ is full (max_wr 4).
            wrs[3].wr_id = 999;
            assert_eq!(post_srq_recv(srq, &mut wrs[3], &mut bad), libc::ENOMEM);
            assert_eq!(bad, &mut wrs[3] as *mut _);

            // Arm the limit at 3: the second receive taken fires it. Resizing is refused.
            let mut m = ibv_srq_attr {
                max_wr: 8,
                max_sge: 1,
                srq_limit: 3,
            };
            assert_eq!(
                ibv_modify_srq(srq, &mut m, IBV_SRQ_MAX_WR),
                libc::EOPNOTSUPP
            );
            assert_eq!(ibv_modify_srq(srq, &mut m, 1 << 5), libc::EINVAL);
            m.srq_limit = 5;
            assert_eq!(ibv_modify_srq(srq, &mut m, IBV_SRQ_LIMIT), libc::EINVAL);
            m.srq_limit = 3;
            assert_eq!(ibv_modify_srq(srq, &mut m, IBV_SRQ_LIMIT), 0);
            assert_eq!(ibv_query_srq(srq, &mut q), 0);
            assert_eq!(q.srq_limit, 3);

            // s1 and s2 send one message each from the upper half of the buffer.
            for (i, (qp, msg)) in [(s1, &b"to r1"[..]), (s2, &b"to r2, longer"[..])]
                .into_iter()
                .enumerate()
            {
                let off = 4096 + 1024 * i;
                buf[off..off + msg.len()].copy_from_slice(msg);
                let mut sge = ibv_sge {
                    addr: base as u64 + off as u64,
                    length: msg.len() as u32,
                    lkey: (*mr).lkey,
                };
                let mut wr = ibv_send_wr::zeroed();
                wr.wr_id = i as u64 + 1;
                wr.sg_list = &mut sge;
                wr.num_sge = 1;
                wr.opcode = IBV_WR_SEND;
                wr.send_flags = IBV_SEND_SIGNALED;
                assert_eq!(post_send(qp, &mut wr, &mut ptr::null_mut()), 0);
                // Wait for this message before sending the next: SRQ WQEs go in order.
                let mut seen = Vec::new();
                while seen.len() < 2 {
                    seen.push(poll_one(ctx, cq));
                }
                seen.sort_by_key(|w| w.opcode);
                assert_eq!(
                    (seen[0].wr_id, seen[0].status),
                    (i as u64 + 1, IBV_WC_SUCCESS)
                );
                let r = seen[1];
                assert_eq!((r.status, r.opcode), (IBV_WC_SUCCESS, IBV_WC_RECV));
                assert_eq!(r.wr_id, 100 + i as u64);
                assert_eq!(r.byte_len, msg.len() as u32);
                let (rq, sq) = if i == 0 { (r1, s1) } else { (r2, s2) };
                assert_eq!((r.qp_num, r.src_qp), ((*rq).qp_num, (*sq).qp_num));
                assert_eq!(r.wc_flags & IBV_WC_GRH, 0);
                let at = 1024 * i;
                assert_eq!(&buf[at..at + msg.len()], msg);
            }

            // Two receives left, below the limit of 3: the event names the SRQ and disarms.
            let mut ev = core::mem::zeroed::<ibv_async_event>();
            loop {
                let mut pfd = libc::pollfd {
                    fd: (*ctx).async_fd,
                    events: libc::POLLIN,
                    revents: 0,
                };
                assert_eq!(libc::poll(&mut pfd, 1, 10_000), 1, "no async event");
                assert_eq!(ibv_get_async_event(ctx, &mut ev), 0);
                if ev.event_type == IBV_EVENT_SRQ_LIMIT_REACHED {
                    break;
                }
            }
            assert_eq!(ev.element.srq, srq);
            // Destroying the SRQ waits for this acknowledgement.
            crate::ctx::ibv_ack_async_event(&mut ev);
            assert_eq!(ibv_query_srq(srq, &mut q), 0);
            assert_eq!(q.srq_limit, 0);

            // The SRQ stays while QPs use it; its PD stays while it exists.
            assert_eq!(ibv_destroy_srq(srq), libc::EBUSY);
            assert_eq!(ibv_destroy_qp(r1), 0);
            assert_eq!(ibv_destroy_srq(srq), libc::EBUSY);
            assert_eq!(ibv_destroy_qp(r2), 0);
            assert_eq!(ibv_dealloc_pd(pd), libc::EBUSY);
            assert_eq!(ibv_destroy_srq(srq), 0);
            assert_eq!(ibv_destroy_qp(s1), 0);
            assert_eq!(ibv_destroy_qp(s2), 0);
            assert_eq!(ibv_destroy_cq(cq), 0);
            assert_eq!(ibv_dereg_mr(mr), 0);
            assert_eq!(ibv_dealloc_pd(pd), 0);
            assert_eq!(ibv_close_device(ctx), 0);
        }
    }

    /// UD QPs on an SRQ: each datagram lands after its 40-byte GRH area.
    #[test]
    fn ud_qps_on_an_srq() {
        // SAFETY: the whole test drives the C API with valid, live objects in order.
        unsafe {
            let list = ibv_get_device_list(ptr::null_mut());
            let ctx = ibv_open_device(*list);
            ibv_free_device_list(list);
            let gid = soft(ctx).expect("context").ctx.gid();
            let pd = ibv_alloc_pd(ctx);
            let mut buf = vec![0u8; 4096];
            let base = buf.as_mut_ptr();
            let mr = ibv_reg_mr(pd, base.cast(), buf.len(), IBV_ACCESS_LOCAL_WRITE as c_int);
            let cq = ibv_create_cq(ctx, 16, ptr::null_mut(), ptr::null_mut(), 0);
            let mut sattr = ibv_srq_init_attr::zeroed();
            sattr.attr.max_wr = 8;
            sattr.attr.max_sge = 1;
            let srq = ibv_create_srq(pd, &mut sattr);
            assert!(!srq.is_null());
            let mut qps = [ptr::null_mut(); 2];
            for (i, qp) in qps.iter_mut().enumerate() {
                let mut init = ibv_qp_init_attr::zeroed();
                init.send_cq = cq;
                init.recv_cq = cq;
                init.qp_type = IBV_QPT_UD;
                init.cap.max_send_wr = 2;
                init.cap.max_send_sge = 1;
                init.srq = if i == 0 { srq } else { ptr::null_mut() };
                init.cap.max_recv_wr = 1;
                init.cap.max_recv_sge = 1;
                *qp = ibv_create_qp(pd, &mut init);
                assert!(!qp.is_null());
                let mut at = ibv_qp_attr::zeroed();
                at.qp_state = IBV_QPS_INIT;
                at.port_num = 1;
                at.qkey = 7;
                let m = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY;
                assert_eq!(ibv_modify_qp(*qp, &mut at, m), 0);
                at.qp_state = IBV_QPS_RTR;
                assert_eq!(ibv_modify_qp(*qp, &mut at, IBV_QP_STATE), 0);
                at.qp_state = IBV_QPS_RTS;
                assert_eq!(ibv_modify_qp(*qp, &mut at, IBV_QP_STATE | IBV_QP_SQ_PSN), 0);
            }
            let [rq, sq] = qps;
            let mut sge = ibv_sge {
                addr: base as u64,
                length: 2048,
                lkey: (*mr).lkey,
            };
            let mut rwr = ibv_recv_wr::zeroed();
            rwr.wr_id = 55;
            rwr.sg_list = &mut sge;
            rwr.num_sge = 1;
            let post_srq_recv = (*ctx).ops.post_srq_recv.expect("op");
            assert_eq!(post_srq_recv(srq, &mut rwr, &mut ptr::null_mut()), 0);
            let mut a = ibv_ah_attr::zeroed();
            a.is_global = 1;
            a.grh.dgid = ibv_gid { raw: gid.0 };
            a.port_num = 1;
            let ah = crate::ah::ibv_create_ah(pd, &mut a);
            assert!(!ah.is_null());
            buf[3000..3005].copy_from_slice(b"srqud");
            let mut ssge = ibv_sge {
                addr: base as u64 + 3000,
                length: 5,
                lkey: (*mr).lkey,
            };
            let mut wr = ibv_send_wr::zeroed();
            wr.wr_id = 1;
            wr.sg_list = &mut ssge;
            wr.num_sge = 1;
            wr.opcode = IBV_WR_SEND;
            wr.send_flags = IBV_SEND_SIGNALED;
            wr.wr.ud = ibv_send_wr_ud {
                ah,
                remote_qpn: (*rq).qp_num,
                remote_qkey: 7,
            };
            let post_send = (*ctx).ops.post_send.expect("op");
            assert_eq!(post_send(sq, &mut wr, &mut ptr::null_mut()), 0);
            let mut got = [poll_one(ctx, cq), poll_one(ctx, cq)];
            got.sort_by_key(|w| w.opcode);
            let r = got[1];
            assert_eq!((r.wr_id, r.status, r.byte_len), (55, IBV_WC_SUCCESS, 45));
            assert_eq!((r.qp_num, r.src_qp), ((*rq).qp_num, (*sq).qp_num));
            assert_ne!(r.wc_flags & IBV_WC_GRH, 0);
            assert_eq!(&buf[40..45], b"srqud");
            assert_eq!(crate::ah::ibv_destroy_ah(ah), 0);
            assert_eq!(ibv_destroy_qp(rq), 0);
            assert_eq!(ibv_destroy_qp(sq), 0);
            assert_eq!(ibv_destroy_srq(srq), 0);
            assert_eq!(ibv_destroy_cq(cq), 0);
            assert_eq!(ibv_dereg_mr(mr), 0);
            assert_eq!(ibv_dealloc_pd(pd), 0);
            assert_eq!(ibv_close_device(ctx), 0);
        }
    }
}
