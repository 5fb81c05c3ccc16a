//! Receive dispatch: the checks every unicast datagram passes before a QP sees it.

use super::Engine;
use crate::config::IcrcPolicy;
use crate::node::Route;
use crate::time::Instant;
use crate::types::{QpHandle, QpType};
use softverbs_wire::icrc::{self, IcrcContext};
use softverbs_wire::{headers::bth::DEFAULT_PKEY, RocePacket, Transport};
use std::net::SocketAddr;

impl Engine {
    /// A datagram arrived from `src`.
    pub fn handle_datagram(&mut self, now: Instant, src: SocketAddr, data: &[u8]) {
        self.handle_datagram_with_ipv4_id(now, src, data, 0)
    }

    /// A datagram arrived from `src`; it probably carried IPv4 Identification
    /// `ipv4_id_hint` (segment k of a GRO read carried ID k if the sender's GSO batch
    /// and the GRO read line up). The hint is checked first; otherwise the ID the
    /// packet was sealed with is solved for (see [`icrc::sealed_ipv4_id`]).
    pub fn handle_datagram_with_ipv4_id(
        &mut self,
        now: Instant,
        src: SocketAddr,
        data: &[u8],
        ipv4_id_hint: u16,
    ) {
        // Parsed once; every later step reads this view.
        let Ok(pkt) = RocePacket::new_checked(data) else {
            self.shared.counters.drop_malformed += 1;
            return;
        };
        let route = Route {
            src,
            dst: self.shared.config.local_addr,
        };
        if !self.icrc_accepts(route, ipv4_id_hint, data) {
            return;
        }
        let Some(qp) = self.dispatch_target(src, &pkt) else {
            return;
        };
        let Some(q) = self.qps.get_mut(qp.0) else {
            return;
        };
        self.shared.counters.rx_packets += 1;
        self.shared.counters.rx_bytes += data.len() as u64;
        // IBA 11.6.3: a connected QP in RTR reports its first packet (Communication
        // Established), once per entry into RTR; the CM takes it for a lost RTU.
        if q.state() == crate::types::QpState::Rtr
            && q.init.qp_type != QpType::Ud
            && !q.comm_established
        {
            q.comm_established = true;
            self.shared
                .events
                .push_back(crate::event::AsyncEvent::CommEstablished(qp));
        }
        if pkt.info().is_request {
            q.handle_request(&mut self.shared, &pkt, route);
        } else {
            q.handle_response(&mut self.shared, now, &pkt);
        }
        self.after_activity(qp);
    }

    /// The transport-level checks a well-formed packet with a good ICRC passes before
    /// a QP sees it: not a CNP, P_Key, a live QP of the right transport, from that
    /// QP's peer. Failures are counted and dropped. A request for a destroyed RC QP
    /// may still be re-acknowledged (see `closed.rs`).
    fn dispatch_target(&mut self, src: SocketAddr, pkt: &RocePacket<&[u8]>) -> Option<QpHandle> {
        let counters = &mut self.shared.counters;
        let info = pkt.info();
        if info.transport == Transport::Cnp {
            counters.cnp_received += 1;
            return None;
        }
        let bth = pkt.bth();
        if bth.pkey() & 0x7fff != DEFAULT_PKEY & 0x7fff {
            counters.drop_bad_pkey += 1;
            return None;
        }
        let dest_qp = bth.dest_qp();
        let Some(qp) = self.qp_by_qpn(dest_qp) else {
            let duplicate_for_closed = info.transport == Transport::Rc
                && info.is_request
                && self.closed.handle_request(src, dest_qp, bth.psn());
            if duplicate_for_closed {
                self.shared.counters.closed_qp_acks += 1;
            } else {
                self.shared.counters.drop_unknown_qp += 1;
            }
            return None;
        };
        let q = self.qps.get(qp.0)?;
        let transport_ok = matches!(
            (q.init.qp_type, info.transport),
            (QpType::Rc, Transport::Rc) | (QpType::Uc, Transport::Uc) | (QpType::Ud, Transport::Ud)
        );
        if !transport_ok {
            self.shared.counters.drop_bad_state += 1;
            return None;
        }
        // Connected QPs take packets from their peer only; UD from anyone.
        if q.init.qp_type != QpType::Ud && q.peer() != Some(src) {
            self.shared.counters.drop_wrong_source += 1;
            return None;
        }
        Some(qp)
    }

    /// The ICRC check of a datagram that travelled `route` under the configured
    /// policy; counts mismatches, and `false` means drop it.
    pub(super) fn icrc_accepts(&mut self, route: Route, ipv4_id_hint: u16, data: &[u8]) -> bool {
        let counters = &mut self.shared.counters;
        if self.shared.config.icrc == IcrcPolicy::Skip {
            return true;
        }
        // The ID the datagram probably carried is checked first; failing that, the ID
        // it was sealed with is solved for in the same pass (segment k of a UDP GSO
        // send carries ID k, which a receiver without GRO cannot know). Only IDs a
        // softverbs sender uses are believed.
        let ctx = IcrcContext {
            ipv4_id: ipv4_id_hint,
            ..IcrcContext::new(route.src, route.dst)
        };
        match icrc::sealed_ipv4_id(&ctx, data) {
            Some(id) if id == ipv4_id_hint => return true,
            Some(id) if usize::from(id) < icrc::GSO_MAX_SEGMENTS => {
                counters.icrc_ipv4_id_solved += 1;
                return true;
            }
            _ => {}
        }
        if self.shared.config.icrc == IcrcPolicy::Enforce {
            counters.drop_icrc += 1;
            return false;
        }
        counters.icrc_mismatch_accepted += 1;
        true
    }
}
