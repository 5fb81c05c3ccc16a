//! Multicast joins (`rdma_join_multicast`, CM.md 4.6): on RoCE no MAD is involved; the
//! driver joins the IP group (IGMP) and attaches the QP, and the cm reports the
//! group's address vector, QPN 0xFFFFFF and the UDP Q_Key.

use crate::cm::{Cm, Pending};
use crate::error::CmError;
use crate::event::{CmEventKind, EventParam, EventStatus, UdEventParam};
use crate::handle::CmIdHandle;
use crate::id::Join;
use crate::qp::device_gid;
use crate::request::{DriverRequest, RequestToken};
use crate::time::Instant;
use crate::types::{AhAttr, IdState, QpType, RDMA_UDP_QKEY};
use softverbs_wire::Qpn;
use std::net::{IpAddr, SocketAddr};

impl Cm {
    /// Joins IPv4 multicast group `group` on the id's local address; `send_only`
    /// joins take no membership. MULTICAST_JOIN (or MULTICAST_ERROR) follows once the
    /// driver answered; `context` comes back in it. The id must be a bound or
    /// resolved UD id. IPv6 groups are not supported (nor are they by Linux with
    /// RoCEv2 GIDs).
    pub fn join_multicast(
        &mut self,
        _now: Instant,
        id: CmIdHandle,
        group: IpAddr,
        send_only: bool,
        context: u64,
    ) -> Result<(), CmError> {
        let group = crate::bind::normalize_ip(group);
        let rec = self.id(id)?;
        if !matches!(
            rec.state,
            IdState::AddrBound | IdState::AddrResolved | IdState::RouteResolved
        ) {
            return Err(CmError::InvalidState {
                op: "join_multicast",
                state: rec.state,
            });
        }
        if rec.qp_type != QpType::Ud {
            return Err(CmError::InvalidArgument("multicast needs a UD id"));
        }
        if !group.is_multicast() {
            return Err(CmError::InvalidArgument("not a multicast address"));
        }
        if group.is_ipv6() {
            return Err(CmError::Unsupported("IPv6 multicast"));
        }
        if rec.joins.iter().any(|j| j.group == group) {
            return Err(CmError::AddrInUse);
        }
        let local_ip = rec.local.map(|l| l.ip()).ok_or(CmError::InvalidState {
            op: "join_multicast",
            state: rec.state,
        })?;
        let attach = rec.qp.filter(|q| q.managed && !send_only).map(|q| q.qpn);
        let token = self.token();
        self.pending.insert(token, Pending::Join(id));
        self.id_mut(id)?.joins.push(Join {
            group,
            send_only,
            context,
            joined: None,
            attach,
            token,
        });
        self.push_request(DriverRequest::JoinGroup {
            token,
            id,
            group,
            local_ip,
            send_only,
            attach,
        });
        Ok(())
    }

    /// The driver's answer to a [`DriverRequest::JoinGroup`]: the group's UDP
    /// endpoint (its port is the one the group's members share), or a failure.
    pub fn handle_group_joined(
        &mut self,
        _now: Instant,
        token: RequestToken,
        result: Result<SocketAddr, ()>,
    ) {
        let Some(Pending::Join(id)) = self.pending.remove(&token) else {
            return;
        };
        let join = self
            .ids
            .get_mut(id)
            .and_then(|rec| rec.joins.iter_mut().find(|j| j.token == token));
        let Some(join) = join else {
            // Left (or destroyed) before the answer: undo a join that happened.
            if let Ok(group) = result {
                self.push_request(DriverRequest::LeaveGroup {
                    id,
                    group,
                    send_only: false,
                    detach: None,
                });
            }
            return;
        };
        match result {
            Ok(addr) => {
                join.joined = Some(addr);
                let context = join.context;
                let ah = AhAttr {
                    dgid: device_gid(addr),
                    dest: addr,
                    sgid_index: 0,
                    // CM.md 4.6: hop limit 64 for RoCEv2 over IPv4.
                    hop_limit: 64,
                    traffic_class: 0,
                    flow_label: 0,
                    sl: 0,
                    static_rate: 0,
                    dlid: 0,
                    port_num: 1,
                    is_global: true,
                };
                self.event(
                    id,
                    CmEventKind::MulticastJoin,
                    EventStatus::Ok,
                    EventParam::Multicast {
                        group: addr,
                        context,
                        ud: UdEventParam {
                            private_data: Vec::new(),
                            ah: Some(ah),
                            qp_num: Qpn::MULTICAST,
                            qkey: RDMA_UDP_QKEY,
                        },
                    },
                );
            }
            Err(()) => {
                if let Some(rec) = self.ids.get_mut(id) {
                    rec.joins.retain(|j| j.token != token);
                }
                self.event(
                    id,
                    CmEventKind::MulticastError,
                    EventStatus::JoinFailed,
                    EventParam::None,
                );
            }
        }
    }

    /// Leaves a group (`rdma_leave_multicast`).
    pub fn leave_multicast(&mut self, id: CmIdHandle, group: IpAddr) -> Result<(), CmError> {
        let group = crate::bind::normalize_ip(group);
        let rec = self.id_mut(id)?;
        let at = rec
            .joins
            .iter()
            .position(|j| j.group == group)
            .ok_or(CmError::InvalidArgument("the id did not join that group"))?;
        let join = rec.joins.remove(at);
        match join.joined {
            Some(addr) => self.push_request(DriverRequest::LeaveGroup {
                id,
                group: addr,
                send_only: join.send_only,
                detach: join.attach,
            }),
            None => {
                // Still pending: the answer finds no join and undoes it.
            }
        }
        Ok(())
    }
}
