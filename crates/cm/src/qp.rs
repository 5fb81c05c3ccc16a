//! QP attributes rdma_cm hands out (`rdma_init_qp_attr`, CM.md 3.6) and the QP
//! transitions librdmacm performs for the QPs it created, as requests to the driver.

use crate::cm::{Cm, Pending};
use crate::conn::IbConn;
use crate::error::CmError;
use crate::handle::CmIdHandle;
use crate::request::{DriverRequest, RequestToken};
use crate::time::Instant;
use crate::types::{
    AhAttr, QpAttrMask, QpAttrs, QpState, QpType, ACCESS_REMOTE_ATOMIC, ACCESS_REMOTE_READ,
    ACCESS_REMOTE_WRITE, RDMA_UDP_QKEY,
};
use softverbs_wire::{Gid, Psn, Qpn};
use std::net::SocketAddr;

/// What happens once the driver has moved a QP.
#[derive(Debug, Clone)]
pub(crate) enum Continuation {
    /// Nothing depends on it.
    None,
    /// Passive RC accept: send the REP.
    Accept(crate::passive::AcceptPlan),
    /// Active RC: the REP arrived; send the RTU and report ESTABLISHED.
    Complete { id: CmIdHandle, local_id: u32 },
}

/// The GID softverbs writes for a device endpoint (the port goes in the GID when it
/// is not 4791; an IPv6 device off 4791 cannot say its port, so it gets its address).
pub(crate) fn device_gid(addr: SocketAddr) -> Gid {
    Gid::from_socket_addr(addr).unwrap_or_else(|| Gid::from_ip(addr.ip()))
}

/// The address vector towards a connection's peer device.
pub(crate) fn conn_ah(conn: &IbConn) -> AhAttr {
    AhAttr {
        dgid: device_gid(conn.peer),
        dest: conn.peer,
        sgid_index: 0,
        hop_limit: conn.path.hop_limit,
        traffic_class: conn.path.traffic_class,
        flow_label: conn.path.flow_label,
        sl: conn.path.sl,
        static_rate: 0,
        dlid: 0,
        port_num: 1,
        is_global: true,
    }
}

fn access_for(responder_resources: u8) -> u32 {
    // Linux ib_cm_init_qp_attr: READ and atomics only when the responder takes them.
    if responder_resources > 0 {
        ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ | ACCESS_REMOTE_ATOMIC
    } else {
        ACCESS_REMOTE_WRITE
    }
}

impl Cm {
    /// The attributes for moving the id's QP to `state` (`rdma_init_qp_attr`):
    /// INIT at any time (RC access flags 0 until a connection exists); RTR and RTS of
    /// an RC id once the peer's QPN and PSN are known (the passive side after the
    /// request, the active side after the reply); UD RTR/RTS need nothing.
    pub fn init_qp_attr(&self, id: CmIdHandle, state: QpState) -> Result<QpAttrs, CmError> {
        let rec = self.id(id)?;
        let mut a = QpAttrs::state_only(state);
        let conn = rec.conn.and_then(|c| self.conns.get(&c));
        match (rec.qp_type, state) {
            (_, QpState::Err) => {}
            (QpType::Ud, QpState::Init) => {
                a.mask = a.mask | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY;
                a.qkey = RDMA_UDP_QKEY;
            }
            (QpType::Ud, QpState::Rtr) => {}
            (QpType::Ud, QpState::Rts) => {
                a.mask = a.mask | QpAttrMask::SQ_PSN;
                a.sq_psn = Psn::new(0);
            }
            (QpType::Rc, QpState::Init) => {
                a.mask =
                    a.mask | QpAttrMask::ACCESS_FLAGS | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT;
                a.access_flags = conn.map_or(0, |c| access_for(c.responder_resources));
            }
            (QpType::Rc, QpState::Rtr | QpState::Rts) => {
                let c = conn
                    .filter(|c| c.remote_id != 0)
                    .ok_or(CmError::InvalidState {
                        op: "RTR/RTS attributes before the peer answered",
                        state: rec.state,
                    })?;
                if state == QpState::Rtr {
                    a.mask = a.mask
                        | QpAttrMask::AV
                        | QpAttrMask::PATH_MTU
                        | QpAttrMask::DEST_QPN
                        | QpAttrMask::RQ_PSN
                        | QpAttrMask::MAX_DEST_RD_ATOMIC
                        | QpAttrMask::MIN_RNR_TIMER;
                    a.ah = Some(conn_ah(c));
                    a.path_mtu = c.path.mtu;
                    a.dest_qpn = c.remote_qpn;
                    a.rq_psn = c.local_psn;
                    a.max_dest_rd_atomic = c.responder_resources;
                    a.min_rnr_timer = 0;
                } else {
                    a.mask = a.mask
                        | QpAttrMask::TIMEOUT
                        | QpAttrMask::RETRY_CNT
                        | QpAttrMask::RNR_RETRY
                        | QpAttrMask::SQ_PSN
                        | QpAttrMask::MAX_QP_RD_ATOMIC;
                    a.timeout = c.qp_timeout;
                    a.retry_cnt = c.retry_count;
                    a.rnr_retry = c.rnr_retry;
                    a.sq_psn = c.remote_psn;
                    a.max_rd_atomic = c.initiator_depth;
                }
            }
        }
        Ok(a)
    }

    /// The transitions a managed QP gets when it is tied to the id.
    pub(crate) fn create_transitions(&self, id: CmIdHandle) -> Result<Vec<QpAttrs>, CmError> {
        Ok(match self.id(id)?.qp_type {
            QpType::Rc => vec![self.init_qp_attr(id, QpState::Init)?],
            QpType::Ud => vec![
                self.init_qp_attr(id, QpState::Init)?,
                self.init_qp_attr(id, QpState::Rtr)?,
                self.init_qp_attr(id, QpState::Rts)?,
            ],
        })
    }

    /// INIT (again, now with the connection's access flags), RTR, RTS: what
    /// librdmacm does before accepting and after a reply.
    pub(crate) fn connect_transitions(&self, id: CmIdHandle) -> Result<Vec<QpAttrs>, CmError> {
        Ok(vec![
            self.init_qp_attr(id, QpState::Init)?,
            self.init_qp_attr(id, QpState::Rtr)?,
            self.init_qp_attr(id, QpState::Rts)?,
        ])
    }

    /// Asks the driver to move `qpn`; `then` runs on its answer.
    pub(crate) fn request_qp(
        &mut self,
        _now: Instant,
        id: CmIdHandle,
        qpn: Qpn,
        steps: Vec<QpAttrs>,
        then: Continuation,
    ) -> RequestToken {
        let token = self.token();
        self.pending.insert(token, Pending::Qp(then));
        self.push_request(DriverRequest::ModifyQp {
            token,
            id,
            qpn,
            steps,
        });
        token
    }

    /// Moves the id's managed QP to ERR (disconnect, reject received), if it has one.
    pub(crate) fn qp_to_error(&mut self, now: Instant, id: CmIdHandle) {
        let Some(qp) = self.ids.get(id).and_then(|r| r.qp).filter(|q| q.managed) else {
            return;
        };
        self.request_qp(
            now,
            id,
            qp.qpn,
            vec![QpAttrs::state_only(QpState::Err)],
            Continuation::None,
        );
    }

    /// The driver's answer to a [`DriverRequest::ModifyQp`]: `Ok` once every step
    /// worked, `Err` at the first that failed. Unknown tokens are ignored.
    pub fn handle_qp_modified(
        &mut self,
        now: Instant,
        token: RequestToken,
        result: Result<(), ()>,
    ) {
        let Some(Pending::Qp(then)) = self.pending.remove(&token) else {
            return;
        };
        match then {
            Continuation::None => {}
            Continuation::Accept(plan) => self.accept_qp_ready(now, plan, result.is_ok()),
            Continuation::Complete { id, local_id } => {
                self.reply_qp_ready(now, id, local_id, result.is_ok())
            }
        }
    }
}
