//! Closing: DREQ / DREP, timewait, retransmission timeouts, and what destroying an
//! id sends (CM.md 3.2.6, 3.3.5, 3.5).

use crate::cm::{Cm, Pending, TimerKey};
use crate::conn::{IbState, Outstanding};
use crate::error::CmError;
use crate::event::{CmEventKind, EventParam, EventStatus};
use crate::handle::CmIdHandle;
use crate::request::DriverRequest;
use crate::time::{cm_timeout, Instant};
use crate::types::{IdState, QpType};
use softverbs_wire::cm::{
    CmMadRepr, CmMessage, DrepRepr, DreqRepr, RejReason, RejectedMessage, SidrStatus,
};
use std::net::SocketAddr;
use std::time::Duration;

/// Copies of an unanswered DREQ sent, [`Cm::linger_interval`] apart, once its id is
/// destroyed (see [`Cm::lingering`]): with 2 % loss all four tries are lost once in 6
/// million disconnects.
const LINGER_COPIES: u8 = 3;

/// The longest wait between lingering copies. Two packet life times are the path's
/// round trip bound, but rdma_cm's default life time (18, about 1 s) is meant for
/// fabrics; the paths softverbs runs on answer in well under a millisecond, and the
/// copies are there to beat loss, not to wait for an answer (which the peer's
/// application gives, whenever it calls `rdma_disconnect`: rsockets' peer only on its
/// next call). A destroy held for 4 x 2 s would be worse than the hazard; so at most
/// 4 x 10 ms = 40 ms.
const LINGER_INTERVAL_CAP: Duration = Duration::from_millis(10);

impl Cm {
    /// Disconnects (`rdma_disconnect`): a managed QP is moved to ERR, then a DREQ
    /// goes out (or the DREP, if the peer's DREQ came first). Disconnecting twice is
    /// not an error.
    pub fn disconnect(&mut self, now: Instant, id: CmIdHandle) -> Result<(), CmError> {
        let rec = self.id(id)?;
        let state = rec.state;
        if rec.qp_type == QpType::Ud {
            return Err(CmError::InvalidState {
                op: "disconnect a UD id",
                state,
            });
        }
        let local_id = rec.conn.ok_or(CmError::InvalidState {
            op: "disconnect",
            state,
        })?;
        let conn_state =
            self.conns
                .get(&local_id)
                .map(|c| c.state)
                .ok_or(CmError::InvalidState {
                    op: "disconnect",
                    state,
                })?;
        match conn_state {
            IbState::Established
            | IbState::RepSent
            | IbState::MraRepRcvd
            | IbState::RepRcvd
            | IbState::MraRepSent => {
                self.qp_to_error(now, id);
                self.send_dreq(now, local_id);
            }
            IbState::DreqRcvd => {
                self.qp_to_error(now, id);
                self.send_drep(now, local_id);
            }
            IbState::DreqSent | IbState::Timewait => {}
            IbState::ReqSent | IbState::MraReqRcvd | IbState::ReqRcvd | IbState::MraReqSent => {
                return Err(CmError::InvalidState {
                    op: "disconnect before the connection is set up",
                    state,
                })
            }
        }
        Ok(())
    }

    fn send_dreq(&mut self, now: Instant, local_id: u32) {
        let tid = self.new_tid(local_id);
        let Some(conn) = self.conns.get_mut(&local_id) else {
            return;
        };
        let dreq = CmMadRepr {
            transaction_id: tid,
            attribute_modifier: 0,
            message: CmMessage::Dreq(DreqRepr {
                local_comm_id: local_id,
                remote_comm_id: conn.remote_id,
                remote_qpn: conn.remote_qpn,
                private_data: Vec::new(),
            }),
        };
        conn.dreq_tid = tid;
        conn.state = IbState::DreqSent;
        conn.outstanding = Some(Outstanding {
            mad: dreq.clone(),
            retries_left: conn.max_retries,
            timeout: conn.response_timeout,
            linger_left: 0,
        });
        let (peer, timeout) = (conn.peer, conn.response_timeout);
        self.send(peer, &dreq);
        self.timers.set(TimerKey::Conn(local_id), now + timeout);
    }

    fn send_drep(&mut self, now: Instant, local_id: u32) {
        let Some(conn) = self.conns.get_mut(&local_id) else {
            return;
        };
        let drep = CmMadRepr {
            transaction_id: conn.dreq_tid,
            attribute_modifier: 0,
            message: CmMessage::Drep(DrepRepr {
                local_comm_id: local_id,
                remote_comm_id: conn.remote_id,
                private_data: Vec::new(),
            }),
        };
        conn.last_reply = Some(drep.clone());
        let peer = conn.peer;
        self.send(peer, &drep);
        self.enter_timewait(now, local_id);
    }

    /// Moves a connection to timewait: it answers stray DREQs and REQs for a while,
    /// then goes (TIMEWAIT_EXIT). The wait is the QP's ACK timeout (CM.md 3.5).
    pub(crate) fn enter_timewait(&mut self, now: Instant, local_id: u32) {
        let Some(conn) = self.conns.get_mut(&local_id) else {
            return;
        };
        conn.state = IbState::Timewait;
        conn.outstanding = None;
        let wait = cm_timeout(conn.qp_timeout);
        let key = (conn.remote_qpn, conn.remote_guid);
        if self.by_remote_qp.get(&key) == Some(&local_id) {
            self.by_remote_qp.remove(&key);
        }
        self.timers.set(TimerKey::Conn(local_id), now + wait);
    }

    /// Forgets a connection and its index entries.
    pub(crate) fn remove_conn(&mut self, local_id: u32) {
        self.timers.cancel(TimerKey::Conn(local_id));
        let Some(conn) = self.conns.remove(&local_id) else {
            return;
        };
        let by_qp = (conn.remote_qpn, conn.remote_guid);
        if self.by_remote_qp.get(&by_qp) == Some(&local_id) {
            self.by_remote_qp.remove(&by_qp);
        }
        let by_id = (conn.remote_id, conn.remote_guid);
        if self.by_remote.get(&by_id) == Some(&local_id) {
            self.by_remote.remove(&by_id);
        }
    }

    /// A stale connection found by a new REQ or REP: close it with a DREQ (CM.md
    /// 3.4), or forget it if it is not up yet.
    pub(crate) fn disconnect_stale(&mut self, now: Instant, local_id: u32) {
        let Some(conn) = self.conns.get(&local_id) else {
            return;
        };
        match conn.state {
            IbState::Established
            | IbState::RepSent
            | IbState::MraRepRcvd
            | IbState::RepRcvd
            | IbState::MraRepSent => {
                if let Some(id) = conn.owner {
                    self.qp_to_error(now, id);
                }
                self.send_dreq(now, local_id);
            }
            _ => {}
        }
    }

    /// Reports DISCONNECTED to the connection's id, once (the id moves to
    /// Disconnect), unless the id already had a CONNECT_ERROR.
    pub(crate) fn disconnected(&mut self, local_id: u32, status: EventStatus) {
        let Some(id) = self.conns.get(&local_id).and_then(|c| c.owner) else {
            return;
        };
        let Some(rec) = self.ids.get_mut(id) else {
            return;
        };
        if rec.state != IdState::Connect || rec.connect_error {
            return;
        }
        rec.state = IdState::Disconnect;
        self.event(id, CmEventKind::Disconnected, status, EventParam::None);
    }

    /// A DREQ arrived (CM.md 3.5; duplicates 3.4).
    pub(crate) fn on_dreq(&mut self, now: Instant, src: SocketAddr, tid: u64, dreq: DreqRepr) {
        let found = self
            .conns
            .get(&dreq.remote_comm_id)
            .filter(|c| c.remote_id == dreq.local_comm_id)
            .map(|c| (c.state, c.local_qpn, c.owner));
        let Some((state, local_qpn, owner)) = found else {
            // Unknown connection: answer anyway so the peer can finish (CM.md 3.4).
            self.counters.drop_unmatched += 1;
            let drep = CmMadRepr {
                transaction_id: tid,
                attribute_modifier: 0,
                message: CmMessage::Drep(DrepRepr {
                    local_comm_id: dreq.remote_comm_id,
                    remote_comm_id: dreq.local_comm_id,
                    private_data: Vec::new(),
                }),
            };
            self.send(src, &drep);
            return;
        };
        if dreq.remote_qpn != local_qpn {
            // Linux ignores a DREQ that names another QP.
            self.counters.drop_unmatched += 1;
            return;
        }
        let local_id = dreq.remote_comm_id;
        match state {
            IbState::Established
            | IbState::RepSent
            | IbState::MraRepRcvd
            | IbState::RepRcvd
            | IbState::MraRepSent => {
                self.timers.cancel(TimerKey::Conn(local_id));
                if let Some(conn) = self.conns.get_mut(&local_id) {
                    conn.outstanding = None;
                    conn.dreq_tid = tid;
                    conn.state = IbState::DreqRcvd;
                }
                if owner.is_none() {
                    // Nobody is left to answer: do it now.
                    self.send_drep(now, local_id);
                } else {
                    self.disconnected(local_id, EventStatus::Ok);
                }
            }
            IbState::DreqSent => {
                // Crossing DREQs: both sides asked, so both answer and wait out the
                // timewait (IBA 12.9.6 "DREQ sent" + "DREQ received").
                self.timers.cancel(TimerKey::Conn(local_id));
                if let Some(conn) = self.conns.get_mut(&local_id) {
                    conn.dreq_tid = tid;
                }
                self.send_drep(now, local_id);
                self.disconnected(local_id, EventStatus::Ok);
            }
            IbState::DreqRcvd => self.counters.duplicates += 1,
            IbState::Timewait => {
                self.counters.duplicates += 1;
                let drep = CmMadRepr {
                    transaction_id: tid,
                    attribute_modifier: 0,
                    message: CmMessage::Drep(DrepRepr {
                        local_comm_id: local_id,
                        remote_comm_id: dreq.local_comm_id,
                        private_data: Vec::new(),
                    }),
                };
                self.send(src, &drep);
            }
            _ => self.counters.drop_unmatched += 1,
        }
    }

    /// A DREP arrived.
    pub(crate) fn on_drep(&mut self, now: Instant, drep: DrepRepr) {
        let state = self
            .conns
            .get(&drep.remote_comm_id)
            .filter(|c| c.remote_id == drep.local_comm_id)
            .map(|c| c.state);
        match state {
            Some(IbState::DreqSent) => {
                let local_id = drep.remote_comm_id;
                self.timers.cancel(TimerKey::Conn(local_id));
                self.enter_timewait(now, local_id);
                self.disconnected(local_id, EventStatus::Ok);
            }
            Some(IbState::Timewait) => self.counters.duplicates += 1,
            _ => self.counters.drop_unmatched += 1,
        }
    }

    /// A connection's timer fired: retransmit, give up, or leave timewait.
    pub(crate) fn conn_timeout(&mut self, now: Instant, local_id: u32) {
        let Some(conn) = self.conns.get_mut(&local_id) else {
            return;
        };
        if conn.state == IbState::Timewait {
            let owner = conn.owner;
            self.remove_conn(local_id);
            let Some(id) = owner else {
                return;
            };
            let Some(rec) = self.ids.get_mut(id) else {
                return;
            };
            if rec.conn == Some(local_id) {
                rec.conn = None;
            }
            if rec.state == IdState::Disconnect {
                self.event(
                    id,
                    CmEventKind::TimewaitExit,
                    EventStatus::Ok,
                    EventParam::None,
                );
            }
            return;
        }
        let Some(out) = conn.outstanding.as_mut() else {
            return;
        };
        if out.linger_left > 0 {
            // A lingering DREQ (Cm::start_linger): a copy, or the end of the linger and
            // back to the DREQ's own retransmissions.
            out.linger_left -= 1;
            let (mad, peer, timeout) = (out.mad.clone(), conn.peer, out.timeout);
            if out.linger_left == 0 {
                self.timers.set(TimerKey::Conn(local_id), now + timeout);
                return;
            }
            self.counters.retransmits += 1;
            self.send(peer, &mad);
            let interval = self.linger_interval();
            self.timers.set(TimerKey::Conn(local_id), now + interval);
            return;
        }
        if out.retries_left > 0 {
            out.retries_left -= 1;
            let (mad, peer) = (out.mad.clone(), conn.peer);
            // After an MRA's longer wait, tries go back to the usual timeout.
            let timeout = out.timeout;
            if conn.state == IbState::MraReqRcvd {
                conn.state = IbState::ReqSent;
            } else if conn.state == IbState::MraRepRcvd {
                conn.state = IbState::RepSent;
            }
            self.counters.retransmits += 1;
            self.send(peer, &mad);
            self.timers.set(TimerKey::Conn(local_id), now + timeout);
            return;
        }
        let (state, owner) = (conn.state, conn.owner);
        match state {
            IbState::ReqSent | IbState::MraReqRcvd | IbState::RepSent | IbState::MraRepRcvd => {
                // REQ or REP unanswered: the connection fails (CM.md 3.2.6, 3.3.5).
                self.remove_conn(local_id);
                if let Some(id) = owner {
                    let live = self.ids.get_mut(id).map(|rec| {
                        rec.conn = None;
                        rec.connect_error
                    });
                    if live == Some(false) {
                        self.backlog_release(id);
                        self.event(
                            id,
                            CmEventKind::Unreachable,
                            EventStatus::TimedOut,
                            EventParam::None,
                        );
                    }
                }
            }
            IbState::DreqSent => {
                self.enter_timewait(now, local_id);
                self.disconnected(local_id, EventStatus::TimedOut);
            }
            _ => {}
        }
    }

    /// Destroys the id (`rdma_destroy_id`). Its connection is closed the way Linux
    /// closes it (CM.md 3.5): an established one gets a DREQ, one with the peer's
    /// DREQ pending a DREP, an unanswered REQ a REJ "timeout", a request being set up
    /// a REJ "consumer defined". The connection then lives on without the id until
    /// it is done; a DREQ still unanswered lingers (see [`Cm::lingering`]). Queued
    /// events of the id are dropped.
    pub fn destroy_id(&mut self, now: Instant, id: CmIdHandle) -> Result<(), CmError> {
        self.id(id)?;
        self.backlog_release(id);
        let rec = self.ids.remove(id).ok_or(CmError::UnknownId)?;
        if let Some(addr) = rec.reservation {
            self.release(addr);
        }
        if let Some(token) = rec.addr_token {
            self.pending.remove(&token);
            self.timers.cancel(TimerKey::Resolve(token));
        }
        for join in &rec.joins {
            match join.joined {
                Some(group) => self.push_request(DriverRequest::LeaveGroup {
                    id,
                    group,
                    send_only: join.send_only,
                    detach: join.attach,
                }),
                // The join's answer finds no join and leaves the group again.
                None => {
                    self.pending.insert(join.token, Pending::Join(id));
                }
            }
        }
        if let Some(request_id) = rec.sidr_out {
            self.sidr_out.remove(&request_id);
            self.timers.cancel(TimerKey::SidrOut(request_id));
        }
        if let Some(key) = rec.sidr_in {
            self.sidr_reply(key, SidrStatus::REJECTED, None, &[]);
        }
        if let Some(local_id) = rec.conn {
            self.orphan_conn(now, local_id);
        }
        self.drop_events_of(id);
        Ok(())
    }

    /// Destroys every id still alive, each as [`Cm::destroy_id`] does; returns them.
    ///
    /// For a process that exits with ids it never destroyed. Linux destroys them when
    /// the process's rdma_cm file closes (`ucma_close` destroys each of its ids, and
    /// `cm_destroy_id` sends an established connection's DREQ), so the peer of a program
    /// that just returns from `main` still sees DISCONNECTED. This cm lives in the
    /// process, so the driver calls this from an exit hook instead.
    pub fn destroy_all(&mut self, now: Instant) -> Vec<CmIdHandle> {
        let ids: Vec<CmIdHandle> = self.ids.iter().map(|(id, _)| id).collect();
        for &id in &ids {
            // Cannot fail: each id was alive a moment ago, under the same `&mut self`.
            let _ = self.destroy_id(now, id);
        }
        ids
    }

    /// The id of connection `local_id` is gone: close what the connection's state
    /// needs closing, and keep it only as long as it owes something.
    fn orphan_conn(&mut self, now: Instant, local_id: u32) {
        let Some(conn) = self.conns.get_mut(&local_id) else {
            return;
        };
        conn.owner = None;
        match conn.state {
            IbState::ReqSent | IbState::MraReqRcvd => {
                self.send_rej(local_id, RejectedMessage::Req, RejReason::TIMEOUT, &[]);
                self.remove_conn(local_id);
            }
            IbState::ReqRcvd | IbState::MraReqSent => {
                self.send_rej(
                    local_id,
                    RejectedMessage::Req,
                    RejReason::CONSUMER_DEFINED,
                    &[],
                );
                self.remove_conn(local_id);
            }
            IbState::RepSent | IbState::MraRepRcvd => {
                self.send_rej(
                    local_id,
                    RejectedMessage::Other,
                    RejReason::CONSUMER_DEFINED,
                    &[],
                );
                self.enter_timewait(now, local_id);
            }
            IbState::RepRcvd | IbState::MraRepSent => {
                self.send_rej(
                    local_id,
                    RejectedMessage::Rep,
                    RejReason::CONSUMER_DEFINED,
                    &[],
                );
                self.enter_timewait(now, local_id);
            }
            IbState::Established => {
                self.send_dreq(now, local_id);
                self.start_linger(now, local_id);
            }
            IbState::DreqRcvd => self.send_drep(now, local_id),
            IbState::DreqSent => self.start_linger(now, local_id),
            IbState::Timewait => {}
        }
    }

    /// The wait between the copies of a lingering DREQ: two packet life times of this
    /// cm's paths, at most [`LINGER_INTERVAL_CAP`] (8.4 ms at life time 10, 10 ms at
    /// the default 18).
    fn linger_interval(&self) -> Duration {
        (cm_timeout(self.config.packet_life_time) * 2).min(LINGER_INTERVAL_CAP)
    }

    /// The id of connection `local_id` was destroyed while its DREQ was unanswered.
    /// This cm lives in the application's process, which usually exits right after
    /// destroying its ids (rping: `rdma_disconnect`, `rdma_destroy_id`, exit), long
    /// before the DREQ's own retransmission (2 packet life times + 4.1 s): a lost DREQ
    /// would leave the peer connected and waiting for DISCONNECTED forever. Linux's
    /// kernel cm does not retry either (its `cm_destroy_id` cancels the DREQ in
    /// DREQ_SENT), so this goes beyond it: the DREQ is sent again [`LINGER_COPIES`]
    /// times at [`Cm::linger_interval`], and [`Cm::lingering`] tells the driver to
    /// hold the destroying caller until the DREP comes or the copies are out.
    fn start_linger(&mut self, now: Instant, local_id: u32) {
        let interval = self.linger_interval();
        let Some(out) = self
            .conns
            .get_mut(&local_id)
            .and_then(|c| c.outstanding.as_mut())
        else {
            return;
        };
        out.linger_left = LINGER_COPIES + 1;
        self.timers.set(TimerKey::Conn(local_id), now + interval);
    }

    /// Whether destroying `id` now would start a linger (see [`Cm::lingering`]): its
    /// connection is up, or its DREQ unanswered.
    pub fn destroy_lingers(&self, id: CmIdHandle) -> bool {
        let conn = self.ids.get(id).and_then(|rec| rec.conn);
        conn.and_then(|local_id| self.conns.get(&local_id))
            .is_some_and(|c| matches!(c.state, IbState::Established | IbState::DreqSent))
    }

    /// Whether a destroyed id's unanswered DREQ is still being sent again (see
    /// [`Cm::destroy_id`]): `rdma_destroy_id` waits while this holds, at most
    /// `(LINGER_COPIES + 1) x linger_interval` (34 ms at packet life time 10,
    /// 40 ms at 18) unless the DREP (or ICMP port unreachable from the peer) ends it
    /// sooner.
    pub fn lingering(&self) -> bool {
        self.conns
            .values()
            .any(|c| c.outstanding.as_ref().is_some_and(|o| o.linger_left > 0))
    }
}
