//! The active side: address and route resolution, connect (REQ), and what comes back
//! (REP, MRA of the REQ, REJ of the REQ), up to the RTU (CM.md 3.2, 4.4).

use crate::bind::normalize;
use crate::cm::{Cm, Pending, TimerKey};
use crate::conn::{ConnPath, IbConn, IbState, Outstanding};
use crate::error::CmError;
use crate::event::{CmEventKind, ConnEventParam, EventParam, EventStatus};
use crate::handle::CmIdHandle;
use crate::id::Route;
use crate::qp::{device_gid, Continuation};
use crate::request::{DriverRequest, RequestToken};
use crate::time::{ack_timeout, cm_timeout, Instant};
use crate::types::{ConnParam, IdState, PathRecord, QpType, ResolveError, ResolvedAddr};
use core::time::Duration;
use softverbs_wire::cm::{
    CmMadRepr, CmMessage, CmaHeaderRepr, MraRepr, MraTarget, PathRepr, RejReason, RejRepr,
    RejectedMessage, RepRepr, ReqRepr, RtuRepr, ServiceId, CMA_HEADER_LEN,
};
use softverbs_wire::headers::bth::DEFAULT_PKEY;
use softverbs_wire::{Gid, Qpn};
use std::net::{IpAddr, SocketAddr};

/// Bytes of user private data a REQ carries after the rdma_cm header (92 - 36).
pub const REQ_USER_DATA_LEN: usize = 56;
/// Bytes of private data a REP carries.
pub const REP_USER_DATA_LEN: usize = 196;
/// Bytes of private data a REJ carries.
pub const REJ_USER_DATA_LEN: usize = 148;

/// The RoCEv2 flow label of a path between two rdma_cm ports (CM.md 4.7).
pub(crate) fn flow_label(src_port: u16, dst_port: u16) -> u32 {
    (u32::from(src_port) * 31 + u32::from(dst_port)) & 0xf_ffff
}

/// A connection parameter that may say 255 ("the device's most"): 255 gives `max`,
/// more than `max` is refused.
fn resolve_depth(value: u8, max: u8) -> Result<u8, CmError> {
    match value {
        255 => Ok(max),
        v if v > max => Err(CmError::InvalidArgument(
            "responder resources or initiator depth above the device's",
        )),
        v => Ok(v),
    }
}

impl Cm {
    /// Starts address resolution (`rdma_resolve_addr`): `dst` is the peer's IP
    /// address and rdma_cm port; `src`, if given, the local IP to use. The driver is
    /// asked for the route ([`DriverRequest::ResolveAddr`]); ADDR_RESOLVED or
    /// ADDR_ERROR follows, ADDR_ERROR with [`EventStatus::TimedOut`] if no answer
    /// comes within `timeout`. An unbound id is bound to an ephemeral port.
    pub fn resolve_addr(
        &mut self,
        now: Instant,
        id: CmIdHandle,
        src: Option<IpAddr>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> Result<(), CmError> {
        let dst = normalize(dst);
        let rec = self.id(id)?;
        if !matches!(rec.state, IdState::Idle | IdState::AddrBound) {
            return Err(CmError::InvalidState {
                op: "resolve_addr",
                state: rec.state,
            });
        }
        if dst.ip().is_unspecified() {
            return Err(CmError::InvalidArgument(
                "destination is a wildcard address",
            ));
        }
        if let Some(local) = rec.local {
            if local.ip().is_ipv4() != dst.ip().is_ipv4() && !local.ip().is_unspecified() {
                return Err(CmError::InvalidArgument(
                    "source and destination families differ",
                ));
            }
        }
        self.bind_implicitly(id, src, dst.ip())?;
        let token = self.token();
        let rec = self.id_mut(id)?;
        let src = rec.local.map(|l| l.ip()).filter(|ip| !ip.is_unspecified());
        rec.peer = Some(dst);
        rec.state = IdState::AddrQuery;
        rec.addr_token = Some(token);
        self.pending.insert(token, Pending::Resolve(id));
        self.timers.set(TimerKey::Resolve(token), now + timeout);
        self.push_request(DriverRequest::ResolveAddr {
            token,
            id,
            src,
            dst: dst.ip(),
        });
        Ok(())
    }

    /// The driver's answer to a [`DriverRequest::ResolveAddr`]. Late answers (after
    /// the timeout, or for a destroyed id) are ignored.
    pub fn handle_addr_resolved(
        &mut self,
        _now: Instant,
        token: RequestToken,
        result: Result<ResolvedAddr, ResolveError>,
    ) {
        let Some(Pending::Resolve(id)) = self.pending.remove(&token) else {
            return;
        };
        self.timers.cancel(TimerKey::Resolve(token));
        let Some(rec) = self.ids.get_mut(id) else {
            return;
        };
        if rec.state != IdState::AddrQuery || rec.addr_token != Some(token) {
            return;
        }
        rec.addr_token = None;
        let dst_v4 = rec.peer.is_some_and(|p| p.ip().is_ipv4());
        let result = result.and_then(|r| {
            let src = crate::bind::normalize_ip(r.src_ip);
            if src.is_ipv4() != dst_v4 || src.is_unspecified() {
                Err(ResolveError::AddressNotAvailable)
            } else {
                Ok(ResolvedAddr { src_ip: src, ..r })
            }
        });
        match result {
            Ok(r) => {
                if let Some(local) = rec.local.as_mut() {
                    if local.ip().is_unspecified() {
                        local.set_ip(r.src_ip);
                    }
                }
                rec.route = Some(Route {
                    mtu: r.mtu,
                    hop_limit: r.hop_limit,
                    resolved: false,
                });
                rec.state = IdState::AddrResolved;
                self.event(
                    id,
                    CmEventKind::AddrResolved,
                    EventStatus::Ok,
                    EventParam::None,
                );
            }
            Err(e) => {
                rec.state = if rec.local.is_some() {
                    IdState::AddrBound
                } else {
                    IdState::Idle
                };
                rec.peer = None;
                self.event(
                    id,
                    CmEventKind::AddrError,
                    EventStatus::Resolve(e),
                    EventParam::None,
                );
            }
        }
    }

    pub(crate) fn resolve_timeout(&mut self, token: RequestToken) {
        let Some(Pending::Resolve(id)) = self.pending.remove(&token) else {
            return;
        };
        let Some(rec) = self.ids.get_mut(id) else {
            return;
        };
        if rec.state != IdState::AddrQuery || rec.addr_token != Some(token) {
            return;
        }
        rec.addr_token = None;
        rec.peer = None;
        rec.state = IdState::AddrBound;
        self.event(
            id,
            CmEventKind::AddrError,
            EventStatus::TimedOut,
            EventParam::None,
        );
    }

    /// Resolves the route (`rdma_resolve_route`). On RoCE the route is what address
    /// resolution found, so ROUTE_RESOLVED is queued at once.
    pub fn resolve_route(&mut self, id: CmIdHandle) -> Result<(), CmError> {
        let rec = self.id_mut(id)?;
        if rec.state != IdState::AddrResolved {
            return Err(CmError::InvalidState {
                op: "resolve_route",
                state: rec.state,
            });
        }
        if let Some(r) = rec.route.as_mut() {
            r.resolved = true;
        }
        rec.state = IdState::RouteResolved;
        self.event(
            id,
            CmEventKind::RouteResolved,
            EventStatus::Ok,
            EventParam::None,
        );
        Ok(())
    }

    /// The packet life time of the id's paths: 18 on RoCE, or one less than the
    /// ACK-timeout option (Linux `rdma_set_ack_timeout`).
    pub(crate) fn packet_life_time(&self, options: &crate::types::IdOptions) -> u8 {
        options
            .ack_timeout
            .map_or(self.config.packet_life_time, |t| t.saturating_sub(1))
    }

    /// The id's resolved path (`id->route.path_rec`), once address resolution is done.
    pub fn route(&self, id: CmIdHandle) -> Result<Option<PathRecord>, CmError> {
        let rec = self.id(id)?;
        let (Some(route), Some(local), Some(peer)) = (rec.route, rec.local, rec.peer) else {
            return Ok(None);
        };
        let dgid = rec
            .conn
            .and_then(|c| self.conns.get(&c))
            .filter(|c| c.peer_is_device)
            .map_or(Gid::from_ip(peer.ip()), |c| device_gid(c.peer));
        Ok(Some(PathRecord {
            sgid: device_gid(self.config.device),
            dgid,
            pkey: DEFAULT_PKEY,
            mtu: route.mtu,
            hop_limit: route.hop_limit,
            traffic_class: rec.options.tos,
            flow_label: flow_label(local.port(), peer.port()),
            sl: 0,
            rate: 0,
            packet_life_time: self.packet_life_time(&rec.options),
        }))
    }

    /// Connects (`rdma_connect`): an RC id sends a REQ, a UD id a SIDR_REQ, to the
    /// peer's rendezvous address (its IP and rdma_cm port). `None` stands for
    /// librdmacm's NULL parameter: the device's most READs/atomics, 7 retries.
    pub fn connect(
        &mut self,
        now: Instant,
        id: CmIdHandle,
        param: Option<ConnParam>,
    ) -> Result<(), CmError> {
        let rec = self.id(id)?;
        if rec.state != IdState::RouteResolved {
            return Err(CmError::InvalidState {
                op: "connect",
                state: rec.state,
            });
        }
        let param = param.unwrap_or(ConnParam {
            responder_resources: 255,
            initiator_depth: 255,
            flow_control: true,
            retry_count: 7,
            rnr_retry_count: 7,
            ..ConnParam::default()
        });
        match rec.qp_type {
            QpType::Rc => self.send_req(now, id, param),
            QpType::Ud => self.send_sidr_req(now, id, param),
        }
    }

    /// The rdma_cm header for a request from the id.
    pub(crate) fn cma_header(
        &self,
        id: CmIdHandle,
    ) -> Result<([u8; CMA_HEADER_LEN], SocketAddr), CmError> {
        let rec = self.id(id)?;
        let (Some(local), Some(peer)) = (rec.local, rec.peer) else {
            return Err(CmError::InvalidState {
                op: "connect without addresses",
                state: rec.state,
            });
        };
        let mut h = [0u8; CMA_HEADER_LEN];
        CmaHeaderRepr {
            src_ip: local.ip(),
            src_port: local.port(),
            dst_ip: peer.ip(),
        }
        .emit(&mut h)
        .map_err(|_| CmError::InvalidArgument("source and destination families differ"))?;
        Ok((h, peer))
    }

    fn send_req(&mut self, now: Instant, id: CmIdHandle, param: ConnParam) -> Result<(), CmError> {
        if param.private_data.len() > REQ_USER_DATA_LEN {
            return Err(CmError::PrivateDataTooLong {
                max: REQ_USER_DATA_LEN,
                len: param.private_data.len(),
            });
        }
        let responder_resources = resolve_depth(
            param.responder_resources,
            self.config.max_responder_resources,
        )?;
        let initiator_depth =
            resolve_depth(param.initiator_depth, self.config.max_initiator_depth)?;
        let (header, peer) = self.cma_header(id)?;
        let rec = self.id(id)?;
        let route = rec.route.ok_or(CmError::InvalidState {
            op: "connect before route resolution",
            state: rec.state,
        })?;
        let local = rec.local.ok_or(CmError::UnknownId)?;
        let (qpn, srq) = match rec.qp {
            Some(qp) => (qp.qpn, qp.srq),
            None => (param.qp_num.unwrap_or(Qpn::new(0)), param.srq),
        };
        let options = rec.options;
        let ps = rec.ps;
        let plt = self.packet_life_time(&options);
        let local_ack_timeout = options
            .ack_timeout
            .unwrap_or_else(|| ack_timeout(self.config.ca_ack_delay, plt));
        let path = ConnPath {
            local_gid: device_gid(self.config.device),
            remote_gid: Gid::from_ip(peer.ip()),
            mtu: route.mtu,
            hop_limit: route.hop_limit,
            traffic_class: options.tos,
            flow_label: flow_label(local.port(), peer.port()),
            sl: 0,
        };
        let local_id = self.new_comm_id();
        let tid = self.new_tid(local_id);
        let local_psn = self.new_psn();
        let mut private_data = header.to_vec();
        private_data.extend_from_slice(&param.private_data);
        // RoCEv2 paths leave the subnet: LIDs 0xFFFF and no "subnet local" when the
        // hop limit exceeds 1 (Linux cm_format_req).
        let routed = route.hop_limit > 1;
        let req = ReqRepr {
            local_comm_id: local_id,
            vendor_id: 0,
            service_id: ServiceId::rdma_cm(ps, peer.port()).0,
            local_ca_guid: self.config.node_guid,
            local_qkey: 0,
            local_qpn: qpn,
            responder_resources,
            local_eecn: 0,
            initiator_depth,
            remote_eecn: 0,
            remote_cm_response_timeout: self.config.cm_response_timeout,
            transport_service_type: 0,
            end_to_end_flow_control: param.flow_control,
            starting_psn: local_psn,
            local_cm_response_timeout: self.config.cm_response_timeout,
            retry_count: param.retry_count.min(7),
            pkey: DEFAULT_PKEY,
            path_mtu: route.mtu.code(),
            rdc_exists: false,
            rnr_retry_count: param.rnr_retry_count.min(7),
            max_cm_retries: self.config.max_cm_retries,
            srq,
            extended_transport_type: 0,
            primary_path: PathRepr {
                local_lid: if routed { 0xffff } else { 0 },
                remote_lid: if routed { 0xffff } else { 0 },
                local_gid: path.local_gid,
                remote_gid: path.remote_gid,
                flow_label: path.flow_label,
                packet_rate: 0,
                traffic_class: path.traffic_class,
                hop_limit: path.hop_limit,
                sl: 0,
                subnet_local: !routed,
                local_ack_timeout,
            },
            alternate_path: PathRepr::default(),
            sap_supported: false,
            private_data,
        };
        let mad = CmMadRepr {
            transaction_id: tid,
            attribute_modifier: 0,
            message: CmMessage::Req(req),
        };
        // CM.md 3.2: each try waits two packet life times plus the peer's response
        // time (6144 ms with rdma_cm's values).
        let response_timeout = cm_timeout(plt) * 2 + cm_timeout(self.config.cm_response_timeout);
        let conn = IbConn {
            local_id,
            remote_id: 0,
            remote_guid: 0,
            owner: Some(id),
            state: IbState::ReqSent,
            active: true,
            peer,
            peer_is_device: false,
            tid,
            dreq_tid: 0,
            local_qpn: qpn,
            remote_qpn: Qpn::new(0),
            local_psn,
            remote_psn: softverbs_wire::Psn::new(0),
            responder_resources,
            initiator_depth,
            retry_count: param.retry_count.min(7),
            rnr_retry: param.rnr_retry_count.min(7),
            path,
            qp_timeout: local_ack_timeout,
            response_timeout,
            max_retries: self.config.max_cm_retries,
            outstanding: Some(Outstanding {
                mad: mad.clone(),
                retries_left: self.config.max_cm_retries,
                timeout: response_timeout,
                linger_left: 0,
            }),
            last_reply: None,
            reply_param: None,
        };
        self.conns.insert(local_id, conn);
        self.send(peer, &mad);
        self.timers
            .set(TimerKey::Conn(local_id), now + response_timeout);
        let rec = self.id_mut(id)?;
        rec.conn = Some(local_id);
        rec.state = IdState::Connect;
        rec.connect_error = false;
        Ok(())
    }

    /// A REP arrived (CM.md 3.2.3, duplicates 3.4).
    pub(crate) fn on_rep(&mut self, now: Instant, src: SocketAddr, tid: u64, rep: RepRepr) {
        let Some(conn) = self.conns.get(&rep.remote_comm_id) else {
            self.counters.drop_unmatched += 1;
            return;
        };
        if !conn.active {
            self.counters.drop_unmatched += 1;
            return;
        }
        let local_id = conn.local_id;
        match conn.state {
            IbState::ReqSent | IbState::MraReqRcvd => {}
            IbState::RepRcvd | IbState::MraRepSent | IbState::Established => {
                if conn.remote_id != rep.local_comm_id {
                    self.counters.drop_unmatched += 1;
                    return;
                }
                self.counters.duplicates += 1;
                self.duplicate_rep(local_id);
                return;
            }
            _ => {
                self.counters.drop_unmatched += 1;
                return;
            }
        }
        // A REP from a QP that a live connection of ours already talks to is stale
        // (CM.md 3.4): refuse it and close the old one.
        if let Some(&old) = self.by_remote_qp.get(&(rep.local_qpn, rep.local_ca_guid)) {
            if old != local_id && rep.local_qpn.value() != 0 {
                self.counters.stale += 1;
                let rej = RejRepr {
                    local_comm_id: local_id,
                    remote_comm_id: rep.local_comm_id,
                    message_rejected: RejectedMessage::Rep,
                    reason: RejReason::STALE_CONNECTION,
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
                self.disconnect_stale(now, old);
                return;
            }
        }
        let plt = self.packet_life_time(
            &conn
                .owner
                .and_then(|o| self.ids.get(o))
                .map(|r| r.options)
                .unwrap_or_default(),
        );
        let ack_option = conn
            .owner
            .and_then(|o| self.ids.get(o))
            .and_then(|r| r.options.ack_timeout);
        self.timers.cancel(TimerKey::Conn(local_id));
        let param = ConnEventParam {
            private_data: rep.private_data.clone(),
            responder_resources: rep.initiator_depth,
            initiator_depth: rep.responder_resources,
            flow_control: rep.end_to_end_flow_control,
            retry_count: 0,
            rnr_retry_count: rep.rnr_retry_count,
            srq: rep.srq,
            qp_num: rep.local_qpn,
        };
        let Some(conn) = self.conns.get_mut(&local_id) else {
            return;
        };
        conn.remote_id = rep.local_comm_id;
        conn.remote_guid = rep.local_ca_guid;
        conn.remote_qpn = rep.local_qpn;
        conn.remote_psn = rep.starting_psn;
        // The REP speaks from the passive side: its responder resources are what this
        // side may issue, its initiator depth what this side must accept.
        conn.initiator_depth = rep.responder_resources;
        conn.responder_resources = rep.initiator_depth;
        conn.rnr_retry = rep.rnr_retry_count;
        conn.qp_timeout = ack_option.unwrap_or_else(|| ack_timeout(rep.target_ack_delay, plt));
        conn.peer = src;
        conn.peer_is_device = true;
        conn.outstanding = None;
        conn.state = IbState::RepRcvd;
        conn.reply_param = Some(param.clone());
        let owner = conn.owner;
        self.by_remote_qp
            .insert((rep.local_qpn, rep.local_ca_guid), local_id);
        let Some(id) = owner else {
            return;
        };
        match self.ids.get(id).and_then(|r| r.qp).filter(|q| q.managed) {
            Some(qp) => match self.connect_transitions(id) {
                Ok(steps) => {
                    self.request_qp(
                        now,
                        id,
                        qp.qpn,
                        steps,
                        Continuation::Complete { id, local_id },
                    );
                }
                Err(_) => self.reply_qp_ready(now, id, local_id, false),
            },
            None => self.event(
                id,
                CmEventKind::ConnectResponse,
                EventStatus::Ok,
                EventParam::Conn(param),
            ),
        }
    }

    /// A REP again: the peer missed our answer (CM.md 3.4). Established: the RTU
    /// again; still readying the QP: an MRA so it waits.
    fn duplicate_rep(&mut self, local_id: u32) {
        let service_timeout = self.config.mra_service_timeout;
        let Some(conn) = self.conns.get_mut(&local_id) else {
            return;
        };
        let resend = match conn.state {
            IbState::RepRcvd => {
                let mra = CmMadRepr {
                    transaction_id: conn.tid,
                    attribute_modifier: 0,
                    message: CmMessage::Mra(MraRepr {
                        local_comm_id: conn.local_id,
                        remote_comm_id: conn.remote_id,
                        message_mraed: MraTarget::Rep,
                        service_timeout,
                        private_data: Vec::new(),
                    }),
                };
                conn.state = IbState::MraRepSent;
                conn.last_reply = Some(mra.clone());
                Some(mra)
            }
            IbState::MraRepSent | IbState::Established => conn.last_reply.clone(),
            _ => None,
        };
        let peer = conn.peer;
        if let Some(mad) = resend {
            self.send(peer, &mad);
        }
    }

    /// The QP is ready (or is not) after a REP: RTU and ESTABLISHED, or REJ and
    /// CONNECT_ERROR (what librdmacm does when it cannot move the QP).
    pub(crate) fn reply_qp_ready(&mut self, now: Instant, id: CmIdHandle, local_id: u32, ok: bool) {
        let Some(conn) = self.conns.get(&local_id) else {
            return;
        };
        if conn.owner != Some(id) || !matches!(conn.state, IbState::RepRcvd | IbState::MraRepSent) {
            return;
        }
        if ok {
            let param = conn.reply_param.clone().unwrap_or_default();
            self.send_rtu(local_id);
            self.event(
                id,
                CmEventKind::Established,
                EventStatus::Ok,
                EventParam::Conn(param),
            );
        } else {
            self.send_rej(
                local_id,
                RejectedMessage::Rep,
                RejReason::CONSUMER_DEFINED,
                &[],
            );
            self.enter_timewait(now, local_id);
            if let Some(rec) = self.ids.get_mut(id) {
                rec.connect_error = true;
            }
            self.event(
                id,
                CmEventKind::ConnectError,
                EventStatus::QpTransitionFailed,
                EventParam::None,
            );
        }
    }

    fn send_rtu(&mut self, local_id: u32) {
        let Some(conn) = self.conns.get_mut(&local_id) else {
            return;
        };
        let rtu = CmMadRepr {
            transaction_id: conn.tid,
            attribute_modifier: 0,
            message: CmMessage::Rtu(RtuRepr {
                local_comm_id: conn.local_id,
                remote_comm_id: conn.remote_id,
                private_data: Vec::new(),
            }),
        };
        conn.state = IbState::Established;
        conn.last_reply = Some(rtu.clone());
        let peer = conn.peer;
        self.send(peer, &rtu);
    }

    /// Sends the RTU for an id that got CONNECT_RESPONSE (`rdma_establish`), once the
    /// application has readied its QP. No event follows.
    pub fn establish(&mut self, _now: Instant, id: CmIdHandle) -> Result<(), CmError> {
        let rec = self.id(id)?;
        let state = rec.state;
        let Some(local_id) = rec.conn else {
            return Err(CmError::InvalidState {
                op: "establish",
                state,
            });
        };
        match self.conns.get(&local_id).map(|c| (c.active, c.state)) {
            Some((true, IbState::RepRcvd | IbState::MraRepSent)) => {
                self.send_rtu(local_id);
                Ok(())
            }
            _ => Err(CmError::InvalidState {
                op: "establish",
                state,
            }),
        }
    }

    /// An MRA arrived: the peer needs longer (CM.md 3.2.2, 3.3.4).
    pub(crate) fn on_mra(&mut self, now: Instant, mra: MraRepr) {
        let Some(conn) = self.conns.get_mut(&mra.remote_comm_id) else {
            self.counters.drop_unmatched += 1;
            return;
        };
        let expected = match mra.message_mraed {
            // Linux finds an MRA of a REQ by the remote ID alone (the REQ's sender
            // does not know the peer's ID yet).
            MraTarget::Req => {
                conn.active && matches!(conn.state, IbState::ReqSent | IbState::MraReqRcvd)
            }
            MraTarget::Rep => {
                !conn.active
                    && conn.remote_id == mra.local_comm_id
                    && matches!(conn.state, IbState::RepSent | IbState::MraRepRcvd)
            }
            MraTarget::Lap => false,
        };
        if !expected {
            self.counters.drop_unmatched += 1;
            return;
        }
        conn.state = match mra.message_mraed {
            MraTarget::Req => IbState::MraReqRcvd,
            _ => IbState::MraRepRcvd,
        };
        // The outstanding message's wait becomes the peer's service time plus a
        // packet life time (Linux cm_mra_handler); its retries are kept.
        let wait = cm_timeout(mra.service_timeout) + cm_timeout(self.config.packet_life_time);
        let local_id = conn.local_id;
        self.timers.set(TimerKey::Conn(local_id), now + wait);
    }
}
