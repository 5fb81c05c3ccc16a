//! Service ID resolution for UD ids (IBA 12.11, CM.md 2.7, 4.4 "UD"): the active side
//! asks with a SIDR_REQ and learns the QPN and Q_Key from the SIDR_REP; the passive
//! side hands the request to its listener as a CONNECT_REQUEST.
//!
//! Unlike Linux, the passive side remembers the answer it sent for the requester's
//! whole retry window, so a SIDR_REQ retransmitted because the SIDR_REP was lost gets
//! the same answer instead of becoming a second CONNECT_REQUEST.

use crate::cm::{Cm, TimerKey};
use crate::error::CmError;
use crate::event::{CmEvent, CmEventKind, EventParam, EventStatus, UdEventParam};
use crate::handle::CmIdHandle;
use crate::passive::NoListener;
use crate::qp::device_gid;
use crate::time::{cm_timeout, Instant};
use crate::types::{AhAttr, ConnParam, IdState, QpType, RDMA_UDP_QKEY};
use core::time::Duration;
use softverbs_wire::cm::{
    CmMadRepr, CmMessage, ServiceId, SidrRepRepr, SidrReqRepr, SidrStatus, CMA_HEADER_LEN,
};
use softverbs_wire::headers::bth::DEFAULT_PKEY;
use softverbs_wire::Qpn;
use std::net::SocketAddr;

/// Bytes of user private data a SIDR_REQ carries after the rdma_cm header.
pub const SIDR_REQ_USER_DATA_LEN: usize = 180;
/// Bytes of private data a SIDR_REP carries.
pub const SIDR_REP_USER_DATA_LEN: usize = 136;

/// An outstanding SIDR_REQ.
#[derive(Debug, Clone)]
pub(crate) struct SidrOut {
    pub owner: CmIdHandle,
    pub dst: SocketAddr,
    pub mad: CmMadRepr,
    pub retries_left: u8,
    pub timeout: Duration,
    pub service_id: u64,
}

/// A SIDR_REQ received: who handles it, and the answer once sent.
#[derive(Debug, Clone)]
pub(crate) struct SidrIn {
    pub child: Option<CmIdHandle>,
    pub tid: u64,
    pub service_id: u64,
    pub reply: Option<CmMadRepr>,
}

impl Cm {
    /// How long the requester may keep retransmitting a SIDR_REQ.
    fn sidr_window(&self) -> Duration {
        cm_timeout(self.config.cm_response_timeout) * (u32::from(self.config.max_cm_retries) + 1)
    }

    pub(crate) fn send_sidr_req(
        &mut self,
        now: Instant,
        id: CmIdHandle,
        param: ConnParam,
    ) -> Result<(), CmError> {
        if param.private_data.len() > SIDR_REQ_USER_DATA_LEN {
            return Err(CmError::PrivateDataTooLong {
                max: SIDR_REQ_USER_DATA_LEN,
                len: param.private_data.len(),
            });
        }
        let (header, peer) = self.cma_header(id)?;
        let ps = self.id(id)?.ps;
        let request_id = self.new_comm_id();
        let tid = self.new_tid(request_id);
        let mut private_data = header.to_vec();
        private_data.extend_from_slice(&param.private_data);
        let service_id = ServiceId::rdma_cm(ps, peer.port()).0;
        let mad = CmMadRepr {
            transaction_id: tid,
            attribute_modifier: 0,
            message: CmMessage::SidrReq(SidrReqRepr {
                request_id,
                pkey: DEFAULT_PKEY,
                service_id,
                private_data,
            }),
        };
        // Linux: SIDR waits one CM response timeout per try (4096 ms), 15 retries.
        let timeout = cm_timeout(self.config.cm_response_timeout);
        self.sidr_out.insert(
            request_id,
            SidrOut {
                owner: id,
                dst: peer,
                mad: mad.clone(),
                retries_left: self.config.max_cm_retries,
                timeout,
                service_id,
            },
        );
        self.send(peer, &mad);
        self.timers
            .set(TimerKey::SidrOut(request_id), now + timeout);
        let rec = self.id_mut(id)?;
        rec.sidr_out = Some(request_id);
        rec.state = IdState::Connect;
        Ok(())
    }

    pub(crate) fn sidr_timeout(&mut self, now: Instant, request_id: u32) {
        let Some(out) = self.sidr_out.get_mut(&request_id) else {
            return;
        };
        if out.retries_left > 0 {
            out.retries_left -= 1;
            let (dst, mad, timeout) = (out.dst, out.mad.clone(), out.timeout);
            self.counters.retransmits += 1;
            self.send(dst, &mad);
            self.timers
                .set(TimerKey::SidrOut(request_id), now + timeout);
            return;
        }
        let owner = out.owner;
        self.sidr_out.remove(&request_id);
        self.sidr_failed(owner, EventStatus::TimedOut, Vec::new());
    }

    fn sidr_failed(&mut self, owner: CmIdHandle, status: EventStatus, private_data: Vec<u8>) {
        if let Some(rec) = self.ids.get_mut(owner) {
            rec.sidr_out = None;
        }
        self.event(
            owner,
            CmEventKind::Unreachable,
            status,
            EventParam::Ud(UdEventParam {
                private_data,
                ah: None,
                qp_num: Qpn::new(0),
                qkey: 0,
            }),
        );
    }

    /// SIDR requests to `dst` fail: nobody listens there.
    pub(crate) fn sidr_unreachable(&mut self, _now: Instant, dst: SocketAddr) {
        let failed: Vec<(u32, CmIdHandle)> = self
            .sidr_out
            .iter()
            .filter(|(_, o)| crate::bind::normalize(o.dst) == dst)
            .map(|(rid, o)| (*rid, o.owner))
            .collect();
        for (request_id, owner) in failed {
            self.sidr_out.remove(&request_id);
            self.timers.cancel(TimerKey::SidrOut(request_id));
            self.sidr_failed(
                owner,
                EventStatus::Sidr(SidrStatus::SERVICE_ID_NOT_SUPPORTED),
                vec![0; SIDR_REP_USER_DATA_LEN],
            );
        }
    }

    /// A SIDR_REP arrived: ESTABLISHED with the peer's QPN, Q_Key and address, or
    /// UNREACHABLE with the status.
    pub(crate) fn on_sidr_rep(&mut self, _now: Instant, src: SocketAddr, rep: SidrRepRepr) {
        let matches = self
            .sidr_out
            .get(&rep.request_id)
            .is_some_and(|o| o.service_id == rep.service_id);
        if !matches {
            self.counters.drop_unmatched += 1;
            return;
        }
        let Some(out) = self.sidr_out.remove(&rep.request_id) else {
            return;
        };
        self.timers.cancel(TimerKey::SidrOut(rep.request_id));
        if rep.status != SidrStatus::SUCCESS {
            return self.sidr_failed(out.owner, EventStatus::Sidr(rep.status), rep.private_data);
        }
        let Some(rec) = self.ids.get_mut(out.owner) else {
            return;
        };
        rec.sidr_out = None;
        let (hop_limit, tos) = (rec.route.map_or(64, |r| r.hop_limit), rec.options.tos);
        let flow_label = match (rec.local, rec.peer) {
            (Some(l), Some(p)) => crate::active::flow_label(l.port(), p.port()),
            _ => 0,
        };
        // The answer came from the peer's device: that is where datagrams go.
        let ah = AhAttr {
            dgid: device_gid(src),
            dest: src,
            sgid_index: 0,
            hop_limit,
            traffic_class: tos,
            flow_label,
            sl: 0,
            static_rate: 0,
            dlid: 0,
            port_num: 1,
            is_global: true,
        };
        self.event(
            out.owner,
            CmEventKind::Established,
            EventStatus::Ok,
            EventParam::Ud(UdEventParam {
                private_data: rep.private_data,
                ah: Some(ah),
                qp_num: rep.qpn,
                qkey: rep.qkey,
            }),
        );
    }

    /// A SIDR_REQ arrived.
    pub(crate) fn on_sidr_req(
        &mut self,
        now: Instant,
        src: SocketAddr,
        tid: u64,
        req: SidrReqRepr,
    ) {
        let key = (src, req.request_id);
        if let Some(seen) = self.sidr_in.get(&key) {
            self.counters.duplicates += 1;
            if let Some(reply) = seen.reply.clone() {
                self.send(src, &reply);
            }
            return;
        }
        let (listener, header, ps, port) =
            match self.find_listener(req.service_id, QpType::Ud, &req.private_data) {
                Ok(l) => l,
                Err(why) => {
                    let status = match why {
                        NoListener::NoService => SidrStatus::SERVICE_ID_NOT_SUPPORTED,
                        NoListener::Refused => SidrStatus::REJECTED,
                    };
                    self.sidr_in.insert(
                        key,
                        SidrIn {
                            child: None,
                            tid,
                            service_id: req.service_id,
                            reply: None,
                        },
                    );
                    self.timers.set(
                        TimerKey::SidrIn(src, req.request_id),
                        now + self.sidr_window(),
                    );
                    self.sidr_reply(key, status, None, &[]);
                    return;
                }
            };
        if !self.backlog_has_room(listener) {
            self.counters.backlog_drops += 1;
            return;
        }
        let child = self.new_child(listener, QpType::Ud, &header, ps, port);
        if let Some(rec) = self.ids.get_mut(child) {
            rec.sidr_in = Some(key);
        }
        self.sidr_in.insert(
            key,
            SidrIn {
                child: Some(child),
                tid,
                service_id: req.service_id,
                reply: None,
            },
        );
        self.timers.set(
            TimerKey::SidrIn(src, req.request_id),
            now + self.sidr_window(),
        );
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
            param: EventParam::Ud(UdEventParam {
                private_data: user,
                ah: None,
                qp_num: Qpn::new(0),
                qkey: 0,
            }),
        });
    }

    /// Sends the SIDR_REP for request `key` and remembers it for duplicates.
    pub(crate) fn sidr_reply(
        &mut self,
        key: (SocketAddr, u32),
        status: SidrStatus,
        qpn: Option<Qpn>,
        private_data: &[u8],
    ) {
        let Some(seen) = self.sidr_in.get_mut(&key) else {
            return;
        };
        let ok = status == SidrStatus::SUCCESS;
        let reply = CmMadRepr {
            transaction_id: seen.tid,
            attribute_modifier: 0,
            message: CmMessage::SidrRep(SidrRepRepr {
                request_id: key.1,
                status,
                vendor_id: 0,
                qpn: if ok {
                    qpn.unwrap_or(Qpn::new(0))
                } else {
                    Qpn::new(0)
                },
                service_id: seen.service_id,
                qkey: if ok { RDMA_UDP_QKEY } else { 0 },
                info: Vec::new(),
                private_data: private_data.to_vec(),
            }),
        };
        seen.reply = Some(reply.clone());
        seen.child = None;
        self.send(key.0, &reply);
    }

    /// Accepts (`ok`) or rejects a UD connection request.
    pub(crate) fn sidr_answer(
        &mut self,
        id: CmIdHandle,
        param: Option<ConnParam>,
        ok: bool,
    ) -> Result<(), CmError> {
        let rec = self.id(id)?;
        let state = rec.state;
        let key = rec.sidr_in.ok_or(CmError::InvalidState {
            op: if ok { "accept" } else { "reject" },
            state,
        })?;
        let param = param.unwrap_or_default();
        if param.private_data.len() > SIDR_REP_USER_DATA_LEN {
            return Err(CmError::PrivateDataTooLong {
                max: SIDR_REP_USER_DATA_LEN,
                len: param.private_data.len(),
            });
        }
        let qpn = rec.qp.map(|q| q.qpn).or(param.qp_num);
        if ok && qpn.is_none() {
            return Err(CmError::InvalidArgument(
                "accepting a UD request needs a QP",
            ));
        }
        let status = if ok {
            SidrStatus::SUCCESS
        } else {
            SidrStatus::REJECTED
        };
        self.sidr_reply(key, status, qpn, &param.private_data);
        self.backlog_release(id);
        if let Some(rec) = self.ids.get_mut(id) {
            rec.sidr_in = None;
        }
        Ok(())
    }
}
