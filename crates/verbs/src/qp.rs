//! Queue pairs: a builder for creation, typed attributes per transition, posting.

use crate::context::ContextInner;
use crate::cq::{Cq, CqInner};
use crate::device::Inherited;
use crate::driver::State;
use crate::error::{McastError, ModifyQpError, PostError, ResourceError};
use crate::events::Source;
use crate::gid::Gid;
use crate::pd::{Pd, PdInner};
use softverbs_engine::{
    AccessFlags, Mtu, QpAttr, QpAttrMask, QpCap, QpHandle, QpInitAttr, QpState, QpType, Qpn,
    RecvWr, SendWr, Sge,
};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Builds a QP.
#[derive(Debug, Clone)]
pub struct QpBuilder {
    pd: Pd,
    send_cq: Cq,
    recv_cq: Cq,
    qp_type: QpType,
    cap: QpCap,
    sq_sig_all: bool,
    srq: Option<crate::srq::Srq>,
}

impl QpBuilder {
    /// An RC QP on `pd` with `cq` for both queues and default capacities.
    pub fn new(pd: &Pd, cq: &Cq) -> QpBuilder {
        QpBuilder {
            pd: pd.clone(),
            send_cq: cq.clone(),
            recv_cq: cq.clone(),
            qp_type: QpType::Rc,
            cap: QpCap::default(),
            sq_sig_all: false,
            srq: None,
        }
    }
    /// A separate receive CQ.
    pub fn recv_cq(mut self, cq: &Cq) -> Self {
        self.recv_cq = cq.clone();
        self
    }
    /// Transport type.
    pub fn qp_type(mut self, t: QpType) -> Self {
        self.qp_type = t;
        self
    }
    /// Queue capacities.
    pub fn cap(mut self, cap: QpCap) -> Self {
        self.cap = cap;
        self
    }
    /// Take receives from a shared receive queue (RC and UD).
    pub fn srq(mut self, srq: &crate::srq::Srq) -> Self {
        self.srq = Some(srq.clone());
        self
    }
    /// Signal every send WR.
    pub fn sq_sig_all(mut self, on: bool) -> Self {
        self.sq_sig_all = on;
        self
    }
    /// Whether the QP will take receives from an SRQ.
    pub(crate) fn has_srq(&self) -> bool {
        self.srq.is_some()
    }
    /// Creates the QP (in RESET).
    pub fn build(self) -> Result<Qp, ResourceError> {
        let ctx = &self.pd.inner.ctx;
        let init = QpInitAttr {
            pd: self.pd.inner.pd,
            send_cq: self.send_cq.inner.cq,
            recv_cq: self.recv_cq.inner.cq,
            qp_type: self.qp_type,
            cap: self.cap,
            sq_sig_all: self.sq_sig_all,
        };
        let (qp, qpn) = ctx.read(|st| -> Result<(QpHandle, Qpn), ResourceError> {
            let made = match &self.srq {
                None => st.engine.create_qp(init)?,
                Some(srq) => st.engine.create_qp_with_srq(init, srq.inner.srq)?,
            };
            ctx.adopt(st, Source::Qp(made.0));
            Ok(made)
        })??;
        Ok(Qp {
            ctx: Arc::clone(ctx),
            qp,
            qpn,
            qp_type: self.qp_type,
            _pd: Arc::clone(&self.pd.inner),
            _send_cq: Arc::clone(&self.send_cq.inner),
            _recv_cq: Arc::clone(&self.recv_cq.inner),
            _srq: self.srq.map(|s| s.inner),
        })
    }
}

/// Where a connected QP's peer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteQp {
    /// The peer device's UDP endpoint (from its GID or LID).
    pub addr: SocketAddr,
    /// The peer QP's number.
    pub qpn: Qpn,
    /// The PSN the peer starts sending with.
    pub psn: u32,
}

impl RemoteQp {
    /// A peer named by GID.
    pub fn from_gid(gid: Gid, qpn: Qpn, psn: u32) -> RemoteQp {
        RemoteQp {
            addr: gid.to_socket_addr(),
            qpn,
            psn,
        }
    }
}

/// Attributes of RESET → INIT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InitAttr {
    /// Remote operations allowed on this QP.
    pub access: AccessFlags,
}

/// Attributes of INIT → RTR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtrAttr {
    /// The peer.
    pub remote: RemoteQp,
    /// Path MTU.
    pub mtu: Mtu,
    /// READ/atomics accepted outstanding.
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer code.
    pub min_rnr_timer: u8,
}

/// Attributes of RTR → RTS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtsAttr {
    /// First PSN to send.
    pub sq_psn: u32,
    /// Local ACK timeout code (4.096 µs × 2^timeout).
    pub timeout: u8,
    /// Transport retries.
    pub retry_cnt: u8,
    /// RNR retries (7 = infinite).
    pub rnr_retry: u8,
    /// READ/atomics outstanding as requester.
    pub max_rd_atomic: u8,
}

impl Default for RtsAttr {
    fn default() -> Self {
        RtsAttr {
            sq_psn: 0,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 16,
        }
    }
}

/// A queue pair.
pub struct Qp {
    ctx: Arc<ContextInner>,
    qp: QpHandle,
    qpn: Qpn,
    qp_type: QpType,
    _pd: Arc<PdInner>,
    _send_cq: Arc<CqInner>,
    _recv_cq: Arc<CqInner>,
    _srq: Option<Arc<crate::srq::SrqInner>>,
}

impl std::fmt::Debug for Qp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qp").field("qpn", &self.qpn).finish()
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        let ctx = &self.ctx;
        if let Ok(d) = ctx.device.driver() {
            d.same_host.forget_qp(self.qp);
        }
        let groups = ctx.with(|st| {
            ctx.disown(st, Source::Qp(self.qp));
            st.engine
                .destroy_qp(self.qp)
                .ok()
                .map(|()| st.engine.mcast_groups())
        });
        ctx.forget(Source::Qp(self.qp));
        if let (Ok(Some(wanted)), Ok(d)) = (groups, ctx.device.driver()) {
            // It left its multicast groups: the device may leave them too.
            let _ = d.sync_groups(&wanted);
        }
    }
}

/// Request packets an RC QP must have unacknowledged for a posted READ or atomic to wait
/// for the next batch (see [`Poster::post_send`]): their ACKs, coalesced per batch the
/// target reads, come within a round trip and pump the engine. A WRITE or SEND waits above
/// `Config::post_join_above`, 8 by default like this; 2 halves the lone sends of
/// ib_write_bw at 4 KiB, which starts every round of posts from a drained QP (a
/// completion every 100 WRs of 128, the ACK of the 100th covering the rest), without a
/// bandwidth gain shown (docs/udp-bandwidth.md, session 17); for READs 2 lost:
/// ib_read_bw at 4 KiB in 4 of 4 pairs (469 against 390 MB/s, medians, load 5).
const POST_READ_JOINS_NEXT_BATCH_ABOVE: u32 = 8;

/// The largest send WR that waits for the next batch: one packet at the largest MTU. A
/// larger one makes a batch of its own (a 64 KiB WRITE: 16 packets, one GSO send of
/// 15 and one of 1), and holding it back left a stream of them with fewer packets in
/// flight: ib_write_bw at 64 KiB lost some 12 % (2 pairs, load 4).
const POST_JOINS_NEXT_BATCH_MAX_LEN: usize = 4096;

/// Posts work requests to one QP under one device lock: see [`Qp::post_sends`].
pub struct Poster<'a> {
    st: &'a mut State,
    qp: QpHandle,
    /// A post may have produced something to send or deliver (the engine is pumped).
    produced: bool,
    /// Send WRs that posted fine and may leave their packets to the next batch.
    joined_batch: u64,
    /// Send WRs posted.
    sends: u64,
    /// `Config::post_join_above`.
    join_above: u32,
}

impl Poster<'_> {
    /// Posts one send WR (as `ibv_post_send` does for one element of its list).
    ///
    /// A call that posts a single WR of at most one packet
    /// ([`POST_JOINS_NEXT_BATCH_MAX_LEN`]) to an RC QP in RTS with more than
    /// `Config::post_join_above` (a WRITE or SEND; 8 by default) or
    /// [`POST_READ_JOINS_NEXT_BATCH_ABOVE`] (a READ or atomic) request packets
    /// unacknowledged sends nothing by
    /// itself: the WR's packet leaves with the next batch, which the next ACK's reader (a
    /// polling thread or the progress thread) sends when it pumps the engine, and at
    /// least one ACK is due without a hold (the peer holds at most one). Such posts come
    /// back to back from programs that post one WR per `ibv_post_send`, as perftest
    /// does: sending each at once cost ib_write_bw at 4 KiB one send call per 2.2-2.5
    /// packets against `softverbs perf`'s 20 (lists of 64), 0.47x its bandwidth
    /// (docs/udp-bandwidth.md, session 16). A list of WRs is a batch already and goes at
    /// once; a ping-pong never has that many packets in flight, so no latency changes.
    pub fn post_send(&mut self, wr: &SendWr<'_>) -> Result<(), PostError> {
        crate::trace::stamp(crate::trace::Step::PostEntered);
        let r = self.st.engine.post_send(self.qp, wr);
        crate::trace::stamp(crate::trace::Step::EnginePosted);
        let joins_above = if wr.op.is_read_or_atomic() {
            POST_READ_JOINS_NEXT_BATCH_ABOVE
        } else {
            self.join_above
        };
        let joins_next_batch = r.is_ok()
            && wr.payload.len() <= POST_JOINS_NEXT_BATCH_MAX_LEN
            && self.st.engine.qp_state(self.qp) == Some(QpState::Rts)
            && self
                .st
                .engine
                .qp_outstanding(self.qp)
                .is_some_and(|n| n > joins_above);
        self.sends += 1;
        if joins_next_batch {
            self.joined_batch += 1;
        } else {
            self.produced = true;
        }
        r
    }

    /// Posts one receive WR. In RTR and RTS it produces nothing to send and no event
    /// (a responder that NAKed for want of one waits for the requester's retry); in the
    /// error state it completes at once as flushed (its CQ's channel may fire), so any
    /// state but those two pumps.
    pub fn post_recv(&mut self, wr_id: u64, sges: &[Sge]) -> Result<(), PostError> {
        let r = self.st.engine.post_recv(self.qp, &RecvWr { wr_id, sges });
        if !matches!(
            self.st.engine.qp_state(self.qp),
            Some(QpState::Rtr | QpState::Rts)
        ) {
            self.produced = true;
        }
        r
    }
}

impl Qp {
    /// The transport type.
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }

    /// The QP number.
    pub fn qpn(&self) -> Qpn {
        self.qpn
    }

    /// Any transition with raw attributes and mask (IBA table rules apply).
    pub fn modify(&self, attr: &QpAttr, mask: QpAttrMask) -> Result<(), ModifyQpError> {
        let now = self.ctx.device.info().now();
        self.ctx
            .with(|st| st.engine.modify_qp(self.qp, attr, mask, now))?
    }

    /// RESET → INIT.
    pub fn to_init(&self, a: InitAttr) -> Result<(), ModifyQpError> {
        let attr = QpAttr {
            qp_state: QpState::Init,
            qp_access_flags: a.access,
            port_num: 1,
            ..QpAttr::default()
        };
        self.modify(
            &attr,
            QpAttrMask::STATE
                | QpAttrMask::PKEY_INDEX
                | QpAttrMask::PORT
                | QpAttrMask::ACCESS_FLAGS,
        )
    }

    /// INIT → RTR.
    pub fn to_rtr(&self, a: RtrAttr) -> Result<(), ModifyQpError> {
        let attr = QpAttr {
            qp_state: QpState::Rtr,
            path_mtu: a.mtu,
            dest_qp_num: a.remote.qpn.value(),
            rq_psn: a.remote.psn,
            max_dest_rd_atomic: a.max_dest_rd_atomic,
            min_rnr_timer: a.min_rnr_timer,
            av: Some(a.remote.addr),
            ..QpAttr::default()
        };
        let mut mask = QpAttrMask::STATE
            | QpAttrMask::AV
            | QpAttrMask::PATH_MTU
            | QpAttrMask::DEST_QPN
            | QpAttrMask::RQ_PSN;
        // UC has no READ/atomic responder resources and no RNR (IBA table 91).
        if self.qp_type == QpType::Rc {
            mask |= QpAttrMask::MAX_DEST_RD_ATOMIC | QpAttrMask::MIN_RNR_TIMER;
        }
        self.modify(&attr, mask)
    }

    /// RESET → INIT for a UD QP: datagrams it receives must carry `qkey`.
    pub fn ud_to_init(&self, qkey: u32) -> Result<(), ModifyQpError> {
        let attr = QpAttr {
            qp_state: QpState::Init,
            qkey,
            port_num: 1,
            ..QpAttr::default()
        };
        self.modify(
            &attr,
            QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY,
        )
    }

    /// INIT → RTR for a UD QP (no peer: it takes datagrams from anyone).
    pub fn ud_to_rtr(&self) -> Result<(), ModifyQpError> {
        self.modify(
            &QpAttr {
                qp_state: QpState::Rtr,
                ..QpAttr::default()
            },
            QpAttrMask::STATE,
        )
    }

    /// RTR → RTS.
    pub fn to_rts(&self, a: RtsAttr) -> Result<(), ModifyQpError> {
        let attr = QpAttr {
            qp_state: QpState::Rts,
            sq_psn: a.sq_psn,
            timeout: a.timeout,
            retry_cnt: a.retry_cnt,
            rnr_retry: a.rnr_retry,
            max_rd_atomic: a.max_rd_atomic,
            ..QpAttr::default()
        };
        let mut mask = QpAttrMask::STATE | QpAttrMask::SQ_PSN;
        // UC is unacknowledged: no timeout, retries or READ/atomic limits.
        if self.qp_type == QpType::Rc {
            mask |= QpAttrMask::TIMEOUT
                | QpAttrMask::RETRY_CNT
                | QpAttrMask::RNR_RETRY
                | QpAttrMask::MAX_QP_RD_ATOMIC;
        }
        self.modify(&attr, mask)
    }

    /// RTS → SQD: no new work starts; what was started completes. With
    /// `notify`, [`softverbs_engine::AsyncEvent::SqDrained`] arrives when the send
    /// queue has drained.
    pub fn to_sqd(&self, notify: bool) -> Result<(), ModifyQpError> {
        let attr = QpAttr {
            qp_state: QpState::Sqd,
            en_sqd_async_notify: notify,
            ..QpAttr::default()
        };
        self.modify(&attr, QpAttrMask::STATE | QpAttrMask::EN_SQD_ASYNC_NOTIFY)
    }

    /// SQD → RTS: the send queue resumes.
    pub fn sqd_to_rts(&self) -> Result<(), ModifyQpError> {
        self.modify(
            &QpAttr {
                qp_state: QpState::Rts,
                ..QpAttr::default()
            },
            QpAttrMask::STATE,
        )
    }

    /// Any state → RESET: queues are emptied without completions.
    pub fn to_reset(&self) -> Result<(), ModifyQpError> {
        self.modify(
            &QpAttr {
                qp_state: QpState::Reset,
                ..QpAttr::default()
            },
            QpAttrMask::STATE,
        )
    }

    /// Any state → ERR: outstanding work is flushed.
    pub fn to_error(&self) -> Result<(), ModifyQpError> {
        self.modify(
            &QpAttr {
                qp_state: QpState::Err,
                ..QpAttr::default()
            },
            QpAttrMask::STATE,
        )
    }

    /// Current attributes.
    pub fn query(&self) -> QpAttr {
        self.ctx
            .read(|st| st.engine.query_qp(self.qp).map(|(a, _)| a))
            .ok()
            .flatten()
            .unwrap_or_default()
    }

    /// Posts a send WR and transmits what it produced right away. On a QP with the
    /// same-host path (`crate::samehost`), an RDMA WRITE's or READ's bytes move at once.
    pub fn post_send(&self, wr: &SendWr<'_>) -> Result<(), PostError> {
        if let Some(r) = self.post_same_host(std::slice::from_ref(wr)) {
            return r.map_err(|(_, e)| e);
        }
        self.post_sends(|p| p.post_send(wr))?
    }

    /// Posts `wr` the usual way, its bytes in its packets, even where the QP has the
    /// same-host path (`crate::samehost`): for a small RDMA WRITE WITH IMM, whose
    /// placement would cost a `process_vm_writev` besides the header-only packet it
    /// sends anyway. Later WRITEs and READs go by UDP (or are held) until it is
    /// acknowledged, as after any packet-borne request (ordering, `engine/placed.rs`).
    pub(crate) fn post_send_in_packet(&self, wr: &SendWr<'_>) -> Result<(), PostError> {
        self.post_sends(|p| p.post_send(wr))?
    }

    /// Posts several send WRs; stops at the first that fails (index, error).
    pub fn post_send_list(&self, wrs: &[SendWr<'_>]) -> Result<(), (usize, PostError)> {
        if let Some(r) = self.post_same_host(wrs) {
            return r;
        }
        self.post_sends(|p| {
            for (i, wr) in wrs.iter().enumerate() {
                p.post_send(wr).map_err(|e| (i, e))?;
            }
            Ok(())
        })
        .map_err(|e| (0usize, PostError::from(e)))?
    }

    /// Whether this QP moves its RDMA WRITEs and READs by the same-host path
    /// (`crate::samehost`): its peer is a softverbs process on this host that accepted
    /// it. The handshake runs when the QP enters RTR, so this turns true shortly after.
    pub fn uses_same_host(&self) -> bool {
        self.places()
    }

    /// Where the same-host peer's bulk stream writer last ran (`crate::sock::apart`), if
    /// this QP places into it.
    pub(crate) fn peer_bulk_writer(&self) -> Option<u64> {
        let d = self.ctx.device.driver().ok()?;
        d.same_host.peer_bulk_writer(self.qp)
    }

    /// Whether this QP has the same-host path now.
    fn places(&self) -> bool {
        self.ctx
            .device
            .driver()
            .is_ok_and(|d| d.same_host.places(self.qp))
    }

    /// Posts the RDMA WRITE `wr` by the same-host path with its bytes taken from
    /// `source` rather than its payload (`SameHost::post_write_from`): `None` when the
    /// QP has no path or the write cannot be placed now (nothing was posted; post `wr`
    /// the usual way, its payload holding the bytes).
    /// With `word`, the same copy writes that count after the bytes (a stream's "bytes
    /// placed" word).
    pub(crate) fn post_write_from(
        &self,
        wr: &SendWr<'_>,
        source: &[&[u8]],
        word: Option<crate::samehost::WordAfter>,
    ) -> Option<Result<(), PostError>> {
        let d = self.ctx.device.driver().ok()?;
        d.same_host.post_write_from(self.qp, wr, source, word, &**d)
    }

    /// Posts `wrs` by the same-host path if the QP has it (`crate::samehost`).
    fn post_same_host(&self, wrs: &[SendWr<'_>]) -> Option<Result<(), (usize, PostError)>> {
        let d = self.ctx.device.driver().ok()?;
        if !d.same_host.places(self.qp) {
            return None;
        }
        d.same_host.post_list(self.qp, wrs, &**d)
    }

    /// Runs `f`, which posts work requests through the [`Poster`], under one device lock,
    /// then transmits everything they produced at once: a list of N work requests costs
    /// one lock, one pump of the engine and one batch of `sendmmsg`, not N.
    pub fn post_sends<R>(&self, f: impl FnOnce(&mut Poster<'_>) -> R) -> Result<R, Inherited> {
        // A thread back from its poll loop (see `PollStreak`).
        let driver = self.ctx.device.driver().ok();
        if let Some(d) = driver {
            d.note_post();
        }
        let mut joined_batch = 0;
        let r = self.ctx.device.with_pump_if(|st| {
            let mut poster = Poster {
                st,
                qp: self.qp,
                produced: false,
                joined_batch: 0,
                sends: 0,
                join_above: driver.map_or(POST_READ_JOINS_NEXT_BATCH_ABOVE, |d| d.post_join_above),
            };
            let r = f(&mut poster);
            if poster.sends > 1 {
                // A list: a batch of its own.
                poster.produced = true;
                poster.joined_batch = 0;
            }
            joined_batch = poster.joined_batch;
            (r, poster.produced)
        });
        if let (Some(d), 1..) = (driver, joined_batch) {
            d.counters
                .posts_joined_batch
                .fetch_add(joined_batch, Ordering::Relaxed);
        }
        r
    }

    /// Posts a receive WR.
    pub fn post_recv(&self, wr_id: u64, sges: &[Sge]) -> Result<(), PostError> {
        self.post_sends(|p| p.post_recv(wr_id, sges))?
    }

    /// Stops this QP's asynchronous events: pending ones are dropped and no new one is
    /// delivered (the first step of destroying it).
    pub fn close_events(&self) {
        self.ctx.events.close(Source::Qp(self.qp));
    }

    /// Waits until every asynchronous event of this QP handed out was acknowledged (as
    /// `ibv_destroy_qp` does).
    pub fn wait_events_acked(&self) {
        self.ctx.events.wait_acked(Source::Qp(self.qp));
    }

    /// Attaches this UD QP to the multicast group `gid` names
    /// (`ibv_attach_mcast`; see [`Gid`] for how an MGID maps to an IPv4 group
    /// address and UDP port). The device joins the group, so UD SENDs to QPN
    /// [`Qpn::MULTICAST`] at an [`AddressHandle`] for `gid`, from any device on
    /// this host (or beyond, as far as IP multicast goes), reach every QP
    /// attached to it, each consuming one of its own receive WRs.
    ///
    /// The device joins at most `max_mcast_grp` groups, with at most
    /// `max_mcast_qp_attach` QPs each ([`crate::DeviceAttr`]); beyond, `LimitReached`.
    pub fn attach_mcast(&self, gid: Gid) -> Result<(), McastError> {
        use crate::context::{MAX_MCAST_GRP, MAX_MCAST_QP_ATTACH, MAX_TOTAL_MCAST_QP_ATTACH};
        let group = gid.to_socket_addr();
        let d = self.ctx.device.driver()?;
        let wanted = self
            .ctx
            .read(|st| -> Result<Vec<SocketAddr>, ResourceError> {
                let all: Vec<(SocketAddr, QpHandle)> = st.engine.mcast_attachments().collect();
                if !all.contains(&(group, self.qp)) {
                    let groups = st.engine.mcast_groups();
                    let members = all.iter().filter(|(g, _)| *g == group).count();
                    if (!groups.contains(&group) && groups.len() >= MAX_MCAST_GRP as usize)
                        || members >= MAX_MCAST_QP_ATTACH as usize
                        || all.len() >= MAX_TOTAL_MCAST_QP_ATTACH as usize
                    {
                        return Err(ResourceError::LimitReached);
                    }
                }
                st.engine.attach_mcast(self.qp, group)?;
                Ok(st.engine.mcast_groups())
            })??;
        if let Err(source) = d.sync_groups(&wanted) {
            // Only a group new to this device can fail to join: undo.
            let wanted = self.ctx.read(|st| {
                let _ = st.engine.detach_mcast(self.qp, group);
                st.engine.mcast_groups()
            })?;
            let _ = d.sync_groups(&wanted);
            return Err(McastError::Join { group, source });
        }
        Ok(())
    }

    /// Detaches this QP from the group `gid` names (`ibv_detach_mcast`); the
    /// device leaves the group when no QP of it is attached any more.
    pub fn detach_mcast(&self, gid: Gid) -> Result<(), McastError> {
        let d = self.ctx.device.driver()?;
        let wanted = self
            .ctx
            .read(|st| -> Result<Vec<SocketAddr>, ResourceError> {
                st.engine.detach_mcast(self.qp, gid.to_socket_addr())?;
                Ok(st.engine.mcast_groups())
            })??;
        let _ = d.sync_groups(&wanted);
        Ok(())
    }

    /// The engine handle.
    pub fn handle(&self) -> QpHandle {
        self.qp
    }

    /// Runs `f` on the engine with this QP's handle, then sends what it produced.
    pub(crate) fn with_engine<R>(
        &self,
        f: impl FnOnce(&mut softverbs_engine::Engine, QpHandle) -> R,
    ) -> Result<R, Inherited> {
        self.ctx.with(|st| f(&mut st.engine, self.qp))
    }
}

/// Where a UD datagram goes: a device's UDP endpoint (IBA 11.2.2: an address
/// handle; here from a GID, a LID on this host, or a received completion).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddressHandle {
    addr: SocketAddr,
}

impl AddressHandle {
    /// The device a GID names.
    pub fn from_gid(gid: Gid) -> AddressHandle {
        AddressHandle {
            addr: gid.to_socket_addr(),
        }
    }

    /// The device at this UDP endpoint.
    pub fn from_addr(addr: SocketAddr) -> AddressHandle {
        AddressHandle { addr }
    }

    /// The device on this host with LID `lid`, as seen from `ctx` (`None`: the LID names
    /// no device; see `crate::addressing`).
    pub fn from_lid(ctx: &crate::Context, lid: u16) -> Option<AddressHandle> {
        ctx.lid_to_addr(lid).map(|addr| AddressHandle { addr })
    }

    /// The sender of a received UD message, to reply to (`ibv_create_ah_from_wc`);
    /// `None` for completions that are not UD receives.
    pub fn from_wc(wc: &softverbs_engine::WorkCompletion) -> Option<AddressHandle> {
        wc.src_addr.map(|addr| AddressHandle { addr })
    }

    /// The destination's UDP endpoint.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A UD SEND to `remote_qpn` behind this address with `remote_qkey`.
    pub fn send(
        &self,
        remote_qpn: Qpn,
        remote_qkey: u32,
        imm: Option<u32>,
    ) -> softverbs_engine::SendOp {
        softverbs_engine::SendOp::UdSend {
            dest: self.addr,
            remote_qpn,
            remote_qkey: softverbs_wire::Qkey(remote_qkey),
            imm,
        }
    }
}
