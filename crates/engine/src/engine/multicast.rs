//! UD multicast (IBA 10.5.2.3): attachments, and delivery to every member.

use super::{Engine, ResourceError};
use crate::node::Route;
use crate::time::Instant;
use crate::types::{QpHandle, QpType};
use softverbs_wire::{headers::bth::DEFAULT_PKEY, Qpn, RocePacket, Transport};
use std::net::SocketAddr;

impl Engine {
    /// Attaches a UD QP to the multicast group whose datagrams arrive addressed
    /// to `group`, an IP multicast address and UDP port (`ibv_attach_mcast`).
    /// Attaching twice is not an error. The caller (the driver) makes datagrams
    /// sent to `group` reach [`Engine::handle_multicast_datagram`].
    pub fn attach_mcast(&mut self, qp: QpHandle, group: SocketAddr) -> Result<(), ResourceError> {
        let q = self.qps.get(qp.0).ok_or(ResourceError::UnknownObject)?;
        if q.init.qp_type != QpType::Ud {
            return Err(ResourceError::InvalidArgument("multicast needs a UD QP"));
        }
        if !group.ip().is_multicast() {
            return Err(ResourceError::InvalidArgument(
                "not an IP multicast address",
            ));
        }
        if !self.mcast.contains(&(group, qp)) {
            self.mcast.push((group, qp));
        }
        Ok(())
    }

    /// Detaches a QP from a group it is attached to (`ibv_detach_mcast`).
    pub fn detach_mcast(&mut self, qp: QpHandle, group: SocketAddr) -> Result<(), ResourceError> {
        if self.qps.get(qp.0).is_none() {
            return Err(ResourceError::UnknownObject);
        }
        let before = self.mcast.len();
        self.mcast.retain(|&m| m != (group, qp));
        if self.mcast.len() == before {
            return Err(ResourceError::InvalidArgument(
                "QP not attached to the group",
            ));
        }
        Ok(())
    }

    /// Every attachment of a QP to a group.
    pub fn mcast_attachments(&self) -> impl Iterator<Item = (SocketAddr, QpHandle)> + '_ {
        self.mcast.iter().copied()
    }

    /// The groups at least one QP is attached to, each once.
    pub fn mcast_groups(&self) -> Vec<SocketAddr> {
        let mut groups: Vec<SocketAddr> = self.mcast.iter().map(|&(g, _)| g).collect();
        groups.sort_unstable();
        groups.dedup();
        groups
    }

    /// A datagram from `src` arrived addressed to the multicast group `group`
    /// (the driver knows: it read it from that group's socket). It must be a UD
    /// request to the multicast QPN 0xFFFFFF (IBA 9.2.3); its ICRC is checked
    /// with the group as IP destination, as the sender computed it. Every QP
    /// attached to `group` gets it (IBA 10.5.2.3 / 11.3.x): each checks its own
    /// state and Q_Key and consumes its own receive WQE; the GRH area names the
    /// group as destination. Datagrams to QPN 0xFFFFFF that arrive through
    /// [`Engine::handle_datagram`] (unicast) name no QP and are dropped.
    pub fn handle_multicast_datagram(
        &mut self,
        _now: Instant,
        src: SocketAddr,
        group: SocketAddr,
        data: &[u8],
    ) {
        let Ok(pkt) = RocePacket::new_checked(data) else {
            self.shared.counters.drop_malformed += 1;
            return;
        };
        // Multicast datagrams are never sent as GSO segments: ID 0.
        let route = Route { src, dst: group };
        if !self.icrc_accepts(route, 0, data) {
            return;
        }
        let info = pkt.info();
        let bth = pkt.bth();
        if info.transport == Transport::Cnp {
            self.shared.counters.cnp_received += 1;
            return;
        }
        if bth.pkey() & 0x7fff != DEFAULT_PKEY & 0x7fff {
            self.shared.counters.drop_bad_pkey += 1;
            return;
        }
        if info.transport != Transport::Ud || !info.is_request || bth.dest_qp() != Qpn::MULTICAST {
            self.shared.counters.drop_bad_state += 1;
            return;
        }
        let members: Vec<QpHandle> = self
            .mcast
            .iter()
            .filter(|&&(g, _)| g == group)
            .map(|&(_, qp)| qp)
            .collect();
        if members.is_empty() {
            self.shared.counters.drop_unknown_qp += 1;
            return;
        }
        self.shared.counters.rx_packets += 1;
        self.shared.counters.rx_bytes += data.len() as u64;
        for qp in members {
            if let Some(q) = self.qps.get_mut(qp.0) {
                q.handle_request(&mut self.shared, &pkt, route);
            }
            self.after_activity(qp);
        }
    }
}
