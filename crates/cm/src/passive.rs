//! The passive side: a REQ finds its listener, becomes a new id and a
//! CONNECT_REQUEST; accept sends the REP, reject a REJ; the RTU establishes (CM.md
//! 3.3, 4.3, 4.4).

use crate::bind::{covers, normalize_ip};
use crate::cm::{Cm, TimerKey};
use crate::conn::{ConnPath, IbConn, IbState, Outstanding};
use crate::error::CmError;
use crate::event::{CmEvent, CmEventKind, ConnEventParam, EventParam, EventStatus};
use crate::handle::CmIdHandle;
use crate::id::{IdRecord, Route};
use crate::qp::{device_gid, Continuation};
use crate::time::{cm_timeout, Instant};
use crate::types::{ConnParam, IbMtu, IdState, PortSpace, QpType};
use softverbs_wire::cm::{
    CmMadRepr, CmMessage, CmaHeader, CmaHeaderRepr, MraRepr, MraTarget, RejReason, RejRepr,
    RejectedMessage, RepRepr, ReqRepr, RtuRepr, ServiceId, CMA_HEADER_LEN,
};
use std::net::SocketAddr;

/// What an accepted REP will say, kept while the driver readies the QP.
#[derive(Debug, Clone)]
pub(crate) struct AcceptPlan {
    pub id: CmIdHandle,
    pub local_id: u32,
    pub rep: RepRepr,
}

/// Why a request found no listener to take it.
pub(crate) enum NoListener {
    /// Nobody listens on the service ID (REJ 8 / SIDR status 1).
    NoService,
    /// Someone listens on the port, but the request does not fit (REJ 28 / SIDR
    /// status 2): not rdma_cm's header, another address, another QP type.
    Refused,
}

impl Cm {
    /// The listener that takes a request for `service_id` of QP type `qp_type`
    /// whose rdma_cm header is `private_data` (CM.md 4.3): a listener bound to the
    /// header's destination address wins over a wildcard one.
    pub(crate) fn find_listener(
        &self,
        service_id: u64,
        qp_type: QpType,
        private_data: &[u8],
    ) -> Result<(CmIdHandle, CmaHeaderRepr, PortSpace, u16), NoListener> {
        let (ps, port) = ServiceId(service_id)
            .rdma_cm_port()
            .ok_or(NoListener::NoService)?;
        let on_port: Vec<(CmIdHandle, &IdRecord)> = self
            .ids
            .iter()
            .filter(|(_, r)| {
                r.state == IdState::Listen
                    && r.ps == ps
                    && r.local.is_some_and(|l| l.port() == port)
                    && r.pending_reservation.is_none()
            })
            .collect();
        if on_port.is_empty() {
            return Err(NoListener::NoService);
        }
        let header = CmaHeader::new_checked(private_data)
            .ok()
            .and_then(|h| CmaHeaderRepr::parse(&h).ok())
            .ok_or(NoListener::Refused)?;
        let dst = normalize_ip(header.dst_ip);
        let fits = |r: &IdRecord| {
            r.qp_type == qp_type && r.local.is_some_and(|l| covers(l.ip(), &r.options, dst))
        };
        let specific = on_port
            .iter()
            .find(|(_, r)| fits(r) && r.local.is_some_and(|l| !l.ip().is_unspecified()));
        let any = on_port.iter().find(|(_, r)| fits(r));
        let (id, _) = specific.or(any).ok_or(NoListener::Refused)?;
        Ok((*id, header, ps, port))
    }

    /// Whether the listener has room for one more unanswered request.
    pub(crate) fn backlog_has_room(&self, listener: CmIdHandle) -> bool {
        self.ids
            .get(listener)
            .and_then(|r| r.backlog)
            .is_some_and(|(backlog, pending)| pending < backlog)
    }

    /// Counts a new unanswered request against its listener.
    pub(crate) fn backlog_take(&mut self, listener: CmIdHandle) {
        if let Some((_, pending)) = self.ids.get_mut(listener).and_then(|r| r.backlog.as_mut()) {
            *pending += 1;
        }
    }

    /// The request of `child` is answered (or gone): its listener has room again.
    pub(crate) fn backlog_release(&mut self, child: CmIdHandle) {
        let Some(rec) = self.ids.get_mut(child) else {
            return;
        };
        if !std::mem::take(&mut rec.pending_request) {
            return;
        }
        let Some(parent) = rec.parent else {
            return;
        };
        if let Some((_, pending)) = self.ids.get_mut(parent).and_then(|r| r.backlog.as_mut()) {
            *pending = pending.saturating_sub(1);
        }
    }

    /// A new id for a request that `listener` takes.
    pub(crate) fn new_child(
        &mut self,
        listener: CmIdHandle,
        qp_type: QpType,
        header: &CmaHeaderRepr,
        ps: PortSpace,
        port: u16,
    ) -> CmIdHandle {
        let options = self
            .ids
            .get(listener)
            .map(|r| r.options)
            .unwrap_or_default();
        let mut rec = IdRecord::new(ps, qp_type);
        rec.state = IdState::Connect;
        rec.local = Some(SocketAddr::new(normalize_ip(header.dst_ip), port));
        rec.peer = Some(SocketAddr::new(
            normalize_ip(header.src_ip),
            header.src_port,
        ));
        rec.parent = Some(listener);
        rec.pending_request = true;
        rec.options = options;
        let child = self.ids.insert(rec);
        self.backlog_take(listener);
        child
    }

    fn reject_req(&mut self, src: SocketAddr, tid: u64, remote_comm_id: u32, reason: RejReason) {
        let rej = RejRepr {
            local_comm_id: 0,
            remote_comm_id,
            message_rejected: RejectedMessage::Req,
            reason,
            ari: Vec::new(),
            private_data: Vec::new(),
        };
        self.send(
            src,
            &CmMadRepr {
                transaction_id: tid,
                attribute_modifier: 0,
                message: CmMessage::Rej(rej),
            },
        );
    }

    /// A REQ arrived, at the device or at a rendezvous socket.
    pub(crate) fn on_req(&mut self, now: Instant, src: SocketAddr, tid: u64, req: ReqRepr) {
        // Duplicates first (CM.md 3.4): the same remote ID and CA GUID.
        if let Some(&local_id) = self.by_remote.get(&(req.local_comm_id, req.local_ca_guid)) {
            self.counters.duplicates += 1;
            self.duplicate_req(local_id, src, tid, req.local_comm_id);
            return;
        }
        // Stale: a new REQ from a QP a live connection of ours already talks to.
        if req.local_qpn.value() != 0 {
            if let Some(&old) = self.by_remote_qp.get(&(req.local_qpn, req.local_ca_guid)) {
                self.counters.stale += 1;
                self.reject_req(src, tid, req.local_comm_id, RejReason::STALE_CONNECTION);
                self.disconnect_stale(now, old);
                return;
            }
        }
        // rdma_cm takes RC requests only (no UC, RD or XRC).
        let rc = req.transport_service_type == 0 && req.extended_transport_type == 0;
        let found = if rc {
            self.find_listener(req.service_id, QpType::Rc, &req.private_data)
        } else {
            match self.find_listener(req.service_id, QpType::Rc, &req.private_data) {
                Err(NoListener::NoService) => Err(NoListener::NoService),
                _ => Err(NoListener::Refused),
            }
        };
        let (listener, header, ps, port) = match found {
            Ok(l) => l,
            Err(NoListener::NoService) => {
                return self.reject_req(src, tid, req.local_comm_id, RejReason::INVALID_SERVICE_ID)
            }
            Err(NoListener::Refused) => {
                return self.reject_req(src, tid, req.local_comm_id, RejReason::CONSUMER_DEFINED)
            }
        };
        let Some(mtu) = IbMtu::from_code(req.path_mtu) else {
            return self.reject_req(src, tid, req.local_comm_id, RejReason::INVALID_MTU);
        };
        if !self.backlog_has_room(listener) {
            // No REJ: the requester retries and may find room later (Linux ucma).
            self.counters.backlog_drops += 1;
            return;
        }
        let child = self.new_child(listener, QpType::Rc, &header, ps, port);
        let local_id = self.new_comm_id();
        let local_psn = self.new_psn();
        let path = req.primary_path;
        let conn = IbConn {
            local_id,
            remote_id: req.local_comm_id,
            remote_guid: req.local_ca_guid,
            owner: Some(child),
            state: IbState::ReqRcvd,
            active: false,
            peer: src,
            peer_is_device: true,
            tid,
            dreq_tid: 0,
            local_qpn: softverbs_wire::Qpn::new(0),
            remote_qpn: req.local_qpn,
            local_psn,
            remote_psn: req.starting_psn,
            // The request speaks from the active side (CM.md 2.2 receiver notes).
            responder_resources: req.initiator_depth,
            initiator_depth: req.responder_resources,
            retry_count: req.retry_count,
            rnr_retry: req.rnr_retry_count,
            path: ConnPath {
                local_gid: device_gid(self.config.device),
                remote_gid: path.local_gid,
                mtu,
                hop_limit: path.hop_limit,
                traffic_class: path.traffic_class,
                flow_label: path.flow_label,
                sl: path.sl,
            },
            qp_timeout: path.local_ack_timeout,
            response_timeout: cm_timeout(req.local_cm_response_timeout),
            max_retries: req.max_cm_retries,
            outstanding: None,
            last_reply: None,
            reply_param: None,
        };
        self.conns.insert(local_id, conn);
        self.by_remote
            .insert((req.local_comm_id, req.local_ca_guid), local_id);
        if req.local_qpn.value() != 0 {
            self.by_remote_qp
                .insert((req.local_qpn, req.local_ca_guid), local_id);
        }
        if let Some(rec) = self.ids.get_mut(child) {
            rec.conn = Some(local_id);
            rec.route = Some(Route {
                mtu,
                hop_limit: path.hop_limit,
                resolved: true,
            });
        }
        let user = req
            .private_data
            .get(CMA_HEADER_LEN..)
            .unwrap_or(&[])
            .to_vec();
        self.push_event(CmEvent {
            id: child,
            listen_id: Some(listener),
            kind: CmEventKind::ConnectRequest,
            status: EventStatus::Ok,
            param: EventParam::Conn(ConnEventParam {
                private_data: user,
                responder_resources: req.initiator_depth,
                initiator_depth: req.responder_resources,
                flow_control: req.end_to_end_flow_control,
                retry_count: req.retry_count,
                rnr_retry_count: req.rnr_retry_count,
                srq: req.srq,
                qp_num: req.local_qpn,
            }),
        });
    }

    /// A REQ again (CM.md 3.4): still deciding: an MRA so the requester waits (rdma_cm's
    /// delayed MRA); in timewait: REJ "stale connection"; otherwise the REP timer
    /// does the talking.
    fn duplicate_req(&mut self, local_id: u32, src: SocketAddr, tid: u64, remote_comm_id: u32) {
        let service_timeout = self.config.mra_service_timeout;
        let Some(conn) = self.conns.get_mut(&local_id) else {
            return;
        };
        match conn.state {
            IbState::ReqRcvd | IbState::MraReqSent => {
                let mra = CmMadRepr {
                    transaction_id: conn.tid,
                    attribute_modifier: 0,
                    message: CmMessage::Mra(MraRepr {
                        local_comm_id: conn.local_id,
                        remote_comm_id: conn.remote_id,
                        message_mraed: MraTarget::Req,
                        service_timeout,
                        private_data: Vec::new(),
                    }),
                };
                conn.state = IbState::MraReqSent;
                conn.last_reply = Some(mra.clone());
                let peer = conn.peer;
                self.send(peer, &mra);
            }
            IbState::Timewait => {
                self.reject_req(src, tid, remote_comm_id, RejReason::STALE_CONNECTION)
            }
            _ => {}
        }
    }

    /// Accepts a connection request (`rdma_accept`) on the id a CONNECT_REQUEST
    /// created: RC sends a REP (after the driver moved a managed QP to RTR and RTS),
    /// UD a SIDR_REP. `None` stands for librdmacm's NULL parameter.
    pub fn accept(
        &mut self,
        now: Instant,
        id: CmIdHandle,
        param: Option<ConnParam>,
    ) -> Result<(), CmError> {
        let rec = self.id(id)?;
        if rec.qp_type == QpType::Ud {
            return self.sidr_answer(id, param, true);
        }
        let state = rec.state;
        let local_id = rec.conn.ok_or(CmError::InvalidState {
            op: "accept",
            state,
        })?;
        let conn = self
            .conns
            .get(&local_id)
            .filter(|c| !c.active && matches!(c.state, IbState::ReqRcvd | IbState::MraReqSent))
            .ok_or(CmError::InvalidState {
                op: "accept",
                state,
            })?;
        let param = param.unwrap_or(ConnParam {
            responder_resources: 255,
            initiator_depth: 255,
            flow_control: true,
            rnr_retry_count: 7,
            ..ConnParam::default()
        });
        if param.private_data.len() > crate::active::REP_USER_DATA_LEN {
            return Err(CmError::PrivateDataTooLong {
                max: crate::active::REP_USER_DATA_LEN,
                len: param.private_data.len(),
            });
        }
        // 255 (or no parameter) means: what the peer asked for, within the device.
        let pick = |v: u8, asked: u8, max: u8| if v == 255 { asked.min(max) } else { v };
        let responder_resources = pick(
            param.responder_resources,
            conn.responder_resources,
            self.config.max_responder_resources,
        );
        let initiator_depth = pick(
            param.initiator_depth,
            conn.initiator_depth,
            self.config.max_initiator_depth,
        );
        if responder_resources > self.config.max_responder_resources
            || initiator_depth > self.config.max_initiator_depth
        {
            return Err(CmError::InvalidArgument(
                "responder resources or initiator depth above the device's",
            ));
        }
        let (qpn, srq, managed) = match rec.qp {
            Some(qp) => (qp.qpn, qp.srq, qp.managed),
            None => (
                param.qp_num.unwrap_or(softverbs_wire::Qpn::new(0)),
                param.srq,
                false,
            ),
        };
        let rep = RepRepr {
            local_comm_id: local_id,
            remote_comm_id: conn.remote_id,
            local_qkey: 0,
            local_qpn: qpn,
            vendor_id: 0,
            local_eecn: 0,
            starting_psn: conn.local_psn,
            responder_resources,
            initiator_depth,
            target_ack_delay: self.config.ca_ack_delay,
            failover_accepted: 0,
            end_to_end_flow_control: param.flow_control,
            rnr_retry_count: param.rnr_retry_count.min(7),
            srq,
            local_ca_guid: self.config.node_guid,
            private_data: param.private_data.clone(),
        };
        if let Some(conn) = self.conns.get_mut(&local_id) {
            conn.responder_resources = responder_resources;
            conn.initiator_depth = initiator_depth;
            conn.local_qpn = qpn;
        }
        let plan = AcceptPlan { id, local_id, rep };
        if managed {
            let steps = self.connect_transitions(id)?;
            self.request_qp(now, id, qpn, steps, Continuation::Accept(plan));
        } else {
            self.accept_qp_ready(now, plan, true);
        }
        Ok(())
    }

    /// The QP is ready for an accept: send the REP and wait for the RTU.
    pub(crate) fn accept_qp_ready(&mut self, now: Instant, plan: AcceptPlan, ok: bool) {
        if !ok {
            // rdma_accept fails; the request stays, to be rejected or destroyed.
            return;
        }
        let Some(conn) = self.conns.get_mut(&plan.local_id) else {
            return;
        };
        if conn.owner != Some(plan.id)
            || !matches!(conn.state, IbState::ReqRcvd | IbState::MraReqSent)
        {
            return;
        }
        let mad = CmMadRepr {
            transaction_id: conn.tid,
            attribute_modifier: 0,
            message: CmMessage::Rep(plan.rep),
        };
        conn.state = IbState::RepSent;
        conn.outstanding = Some(Outstanding {
            mad: mad.clone(),
            retries_left: conn.max_retries,
            timeout: conn.response_timeout,
            linger_left: 0,
        });
        let (peer, timeout) = (conn.peer, conn.response_timeout);
        self.send(peer, &mad);
        self.timers
            .set(TimerKey::Conn(plan.local_id), now + timeout);
        self.backlog_release(plan.id);
    }

    /// Rejects a connection request (`rdma_reject`): REJ "consumer defined" with
    /// `private_data` (at most 148 bytes) for RC, SIDR_REP "rejected" (at most 136)
    /// for UD.
    pub fn reject(
        &mut self,
        now: Instant,
        id: CmIdHandle,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        self.reject_with_reason(now, id, private_data, RejReason::CONSUMER_DEFINED)
    }

    /// Rejects a connection request with an RC REJ of reason `reason`: what
    /// `rdma_reject_ece` does with reason 35 ("vendor option not supported"). UD
    /// requests get SIDR_REP "rejected" whatever the reason, as with Linux.
    pub fn reject_with_reason(
        &mut self,
        now: Instant,
        id: CmIdHandle,
        private_data: &[u8],
        reason: RejReason,
    ) -> Result<(), CmError> {
        let rec = self.id(id)?;
        if rec.qp_type == QpType::Ud {
            return self.sidr_answer(
                id,
                Some(ConnParam {
                    private_data: private_data.to_vec(),
                    ..ConnParam::default()
                }),
                false,
            );
        }
        if private_data.len() > crate::active::REJ_USER_DATA_LEN {
            return Err(CmError::PrivateDataTooLong {
                max: crate::active::REJ_USER_DATA_LEN,
                len: private_data.len(),
            });
        }
        let state = rec.state;
        let local_id = rec.conn.ok_or(CmError::InvalidState {
            op: "reject",
            state,
        })?;
        let conn_state =
            self.conns
                .get(&local_id)
                .map(|c| c.state)
                .ok_or(CmError::InvalidState {
                    op: "reject",
                    state,
                })?;
        let which = match conn_state {
            IbState::ReqRcvd | IbState::MraReqSent => RejectedMessage::Req,
            IbState::RepRcvd | IbState::MraRepSent => RejectedMessage::Rep,
            IbState::RepSent | IbState::MraRepRcvd => RejectedMessage::Other,
            _ => {
                return Err(CmError::InvalidState {
                    op: "reject",
                    state,
                })
            }
        };
        self.send_rej(local_id, which, reason, private_data);
        if which == RejectedMessage::Req {
            // Linux leaves a refused request's ID empty and forgets the connection.
            self.remove_conn(local_id);
            if let Some(rec) = self.ids.get_mut(id) {
                rec.conn = None;
            }
        } else {
            self.enter_timewait(now, local_id);
        }
        self.backlog_release(id);
        Ok(())
    }

    /// An RTU arrived: the passive side is established (CM.md 3.3.3).
    pub(crate) fn on_rtu(&mut self, now: Instant, rtu: RtuRepr) {
        let Some(conn) = self.conns.get(&rtu.remote_comm_id) else {
            self.counters.drop_unmatched += 1;
            return;
        };
        if conn.active || conn.remote_id != rtu.local_comm_id {
            self.counters.drop_unmatched += 1;
            return;
        }
        match conn.state {
            IbState::RepSent | IbState::MraRepRcvd => {
                self.passive_established(now, rtu.remote_comm_id)
            }
            IbState::Established => self.counters.duplicates += 1,
            _ => self.counters.drop_unmatched += 1,
        }
    }

    fn passive_established(&mut self, _now: Instant, local_id: u32) {
        self.timers.cancel(TimerKey::Conn(local_id));
        let Some(conn) = self.conns.get_mut(&local_id) else {
            return;
        };
        conn.state = IbState::Established;
        conn.outstanding = None;
        if let Some(id) = conn.owner {
            self.event(
                id,
                CmEventKind::Established,
                EventStatus::Ok,
                EventParam::Conn(ConnEventParam::default()),
            );
        }
    }

    /// The QP saw its first packet from the peer while the RTU is still missing
    /// (IBV_EVENT_COMM_EST; `rdma_notify`): the passive side counts the connection
    /// as established, as the RTU would have made it (IBA 12.9.6, Linux
    /// `ib_cm_notify`). Later a late RTU is a duplicate.
    pub fn notify_established(&mut self, now: Instant, id: CmIdHandle) -> Result<(), CmError> {
        let rec = self.id(id)?;
        let state = rec.state;
        let local_id = rec.conn.ok_or(CmError::InvalidState {
            op: "notify",
            state,
        })?;
        match self.conns.get(&local_id).map(|c| c.state) {
            Some(IbState::RepSent | IbState::MraRepRcvd) => {
                self.passive_established(now, local_id);
                Ok(())
            }
            Some(IbState::Established) => Ok(()),
            _ => Err(CmError::InvalidState {
                op: "notify",
                state,
            }),
        }
    }

    /// Sends a REJ on connection `local_id`.
    pub(crate) fn send_rej(
        &mut self,
        local_id: u32,
        which: RejectedMessage,
        reason: RejReason,
        private_data: &[u8],
    ) {
        let Some(conn) = self.conns.get(&local_id) else {
            return;
        };
        let ari = if reason == RejReason::TIMEOUT {
            self.config.node_guid.to_be_bytes().to_vec()
        } else {
            Vec::new()
        };
        let rej = CmMadRepr {
            transaction_id: conn.tid,
            attribute_modifier: 0,
            message: CmMessage::Rej(RejRepr {
                local_comm_id: if which == RejectedMessage::Req && !conn.active {
                    0
                } else {
                    local_id
                },
                remote_comm_id: conn.remote_id,
                message_rejected: which,
                reason,
                ari,
                private_data: private_data.to_vec(),
            }),
        };
        let peer = conn.peer;
        self.send(peer, &rej);
    }

    /// A REJ arrived (CM.md 2.4 lookup, 3.2.5, Linux `cm_rej_handler`).
    pub(crate) fn on_rej(&mut self, now: Instant, rej: RejRepr) {
        let local_id = if rej.reason == RejReason::TIMEOUT && rej.ari.len() >= 8 {
            // The active side gave up: found by its ID and the GUID in the ARI.
            let mut guid = [0u8; 8];
            guid.copy_from_slice(&rej.ari[..8]);
            self.by_remote
                .get(&(rej.local_comm_id, u64::from_be_bytes(guid)))
                .copied()
        } else if rej.message_rejected == RejectedMessage::Req {
            self.conns
                .get(&rej.remote_comm_id)
                .filter(|c| c.active)
                .map(|c| c.local_id)
        } else {
            self.conns
                .get(&rej.remote_comm_id)
                .filter(|c| c.remote_id == rej.local_comm_id)
                .map(|c| c.local_id)
        };
        let Some(local_id) = local_id else {
            self.counters.drop_unmatched += 1;
            return;
        };
        let Some(conn) = self.conns.get(&local_id) else {
            return;
        };
        let (state, owner) = (conn.state, conn.owner);
        self.timers.cancel(TimerKey::Conn(local_id));
        match state {
            IbState::ReqSent
            | IbState::MraReqRcvd
            | IbState::RepSent
            | IbState::MraRepRcvd
            | IbState::ReqRcvd
            | IbState::MraReqSent => {
                if rej.reason == RejReason::STALE_CONNECTION {
                    self.enter_timewait(now, local_id);
                } else {
                    self.remove_conn(local_id);
                    if let Some(rec) = owner.and_then(|o| self.ids.get_mut(o)) {
                        rec.conn = None;
                    }
                }
            }
            IbState::DreqSent | IbState::RepRcvd | IbState::MraRepSent | IbState::Established => {
                self.enter_timewait(now, local_id)
            }
            IbState::DreqRcvd | IbState::Timewait => {
                self.counters.drop_unmatched += 1;
                return;
            }
        }
        let Some(id) = owner else {
            return;
        };
        let swallowed = self.ids.get(id).is_none_or(|r| r.connect_error);
        if let Some(rec) = self.ids.get(id) {
            if rec.pending_request {
                self.backlog_release(id);
            }
        }
        if swallowed {
            return;
        }
        // librdmacm moves the QP to ERR on REJECTED.
        self.qp_to_error(now, id);
        self.event(
            id,
            CmEventKind::Rejected,
            EventStatus::Rejected(rej.reason),
            EventParam::Conn(ConnEventParam {
                private_data: rej.private_data,
                ..ConnEventParam::default()
            }),
        );
    }

    /// The destination of an outstanding request is not listening (the driver saw
    /// ICMP port unreachable for it): the request fails at once with REJECTED
    /// "invalid service ID" (RC) or UNREACHABLE "service ID not supported" (UD), as
    /// if the peer had answered that — perftest's retrying client relies on a fast
    /// failure. Of requests, only those still waiting for their first answer are
    /// affected; a DREQ waiting for its DREP completes the disconnect.
    pub fn handle_unreachable(&mut self, now: Instant, dst: SocketAddr) {
        let dst = crate::bind::normalize(dst);
        let failed: Vec<u32> = self
            .conns
            .values()
            .filter(|c| {
                c.active
                    && !c.peer_is_device
                    && matches!(c.state, IbState::ReqSent | IbState::MraReqRcvd)
                    && crate::bind::normalize(c.peer) == dst
            })
            .map(|c| c.local_id)
            .collect();
        for local_id in failed {
            let rej = RejRepr {
                local_comm_id: 0,
                remote_comm_id: local_id,
                message_rejected: RejectedMessage::Req,
                reason: RejReason::INVALID_SERVICE_ID,
                ari: Vec::new(),
                private_data: vec![0; crate::active::REJ_USER_DATA_LEN],
            };
            self.on_rej(now, rej);
        }
        // A DREQ whose peer's socket is closed: the peer's cm went with it (here the
        // cm lives in the process, and a process that answered a DREQ may exit before
        // its DREP is out or while it is lost), so nothing will ever answer the DREQ
        // sent again. The disconnect completes now, as the DREQ's timeout would
        // after all its tries (IBA 12.9.6 "DREQ sent"), minutes later.
        let gone: Vec<u32> = self
            .conns
            .values()
            .filter(|c| c.state == IbState::DreqSent && crate::bind::normalize(c.peer) == dst)
            .map(|c| c.local_id)
            .collect();
        for local_id in gone {
            self.enter_timewait(now, local_id);
            self.disconnected(local_id, EventStatus::TimedOut);
        }
        self.sidr_unreachable(now, dst);
    }
}
