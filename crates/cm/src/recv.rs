//! Received datagrams: the QP1 checks, the ICRC, the MAD, then the message's handler.

use crate::cm::Cm;
use crate::config::IcrcCheck;
use crate::time::Instant;
use softverbs_wire::cm::datagram::CmDatagram;
use softverbs_wire::cm::{CmMadRepr, CmMessage};
use softverbs_wire::icrc::IcrcContext;
use std::net::SocketAddr;

impl Cm {
    /// A datagram to QP1 arrived from `src` at the local endpoint `dst` (the device,
    /// or a rendezvous socket; with a wildcard socket the driver learns the address
    /// from IP_PKTINFO, since the ICRC covers it). Anything that is not a well-formed
    /// CM MAD for a state that takes it is counted and dropped.
    pub fn handle_datagram(&mut self, now: Instant, src: SocketAddr, dst: SocketAddr, data: &[u8]) {
        self.counters.rx_datagrams += 1;
        let Ok(d) = CmDatagram::new_checked(data) else {
            self.counters.drop_malformed += 1;
            return;
        };
        match self.config.icrc {
            IcrcCheck::Skip => {}
            check => {
                if !d.icrc_ok(&IcrcContext::new(src, dst)) {
                    if check == IcrcCheck::Enforce {
                        self.counters.drop_icrc += 1;
                        return;
                    }
                    self.counters.icrc_mismatch_accepted += 1;
                }
            }
        }
        let Ok(mad) = CmMadRepr::parse(&d.mad()) else {
            self.counters.drop_not_cm += 1;
            return;
        };
        let src = crate::bind::normalize(src);
        let tid = mad.transaction_id;
        match mad.message {
            CmMessage::Req(m) => self.on_req(now, src, tid, m),
            CmMessage::Mra(m) => {
                if self.sent_by_peer(m.remote_comm_id, src) {
                    self.on_mra(now, m)
                }
            }
            CmMessage::Rej(m) => {
                // A REJ of a REQ may come from the listener's device rather than the
                // rendezvous address the REQ went to: the source is only checked
                // once the peer's device is known.
                if self.sent_by_peer(m.remote_comm_id, src) {
                    self.on_rej(now, m)
                }
            }
            CmMessage::Rep(m) => self.on_rep(now, src, tid, m),
            CmMessage::Rtu(m) => {
                if self.sent_by_peer(m.remote_comm_id, src) {
                    self.on_rtu(now, m)
                }
            }
            CmMessage::Dreq(m) => {
                if self.sent_by_peer(m.remote_comm_id, src) {
                    self.on_dreq(now, src, tid, m)
                }
            }
            CmMessage::Drep(m) => {
                if self.sent_by_peer(m.remote_comm_id, src) {
                    self.on_drep(now, m)
                }
            }
            CmMessage::SidrReq(m) => self.on_sidr_req(now, src, tid, m),
            CmMessage::SidrRep(m) => self.on_sidr_rep(now, src, m),
        }
    }

    /// Whether a message for connection `local_id` comes from that connection's
    /// peer, as far as known: the same IP address as its device once the device is
    /// known (peers' UDP source ports are not checked: RoCE does not fix them).
    /// Messages for unknown connections pass, for their handler to deal with.
    fn sent_by_peer(&mut self, local_id: u32, src: SocketAddr) -> bool {
        let Some(conn) = self.conns.get(&local_id) else {
            return true;
        };
        if !conn.peer_is_device || crate::bind::normalize(conn.peer).ip() == src.ip() {
            return true;
        }
        self.counters.drop_wrong_source += 1;
        false
    }
}
