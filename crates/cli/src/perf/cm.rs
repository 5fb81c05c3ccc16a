//! `softverbs perf --cm`: the ends meet through the connection manager, as perftest's `-R`.
//!
//! The server listens at rdma_cm port PORT (TCP port space). The client connects a control
//! connection there and the text protocol of [`super`] runs over it ([`crate::cmlink`]);
//! after the server's `OK` the client connects every test QP with a connection of its own:
//! RC QPs through REQ / REP / RTU to the same listener, UD QPs (`--ud`) by resolving the
//! server's UD service at rdma_cm port PORT of the UDP port space (SIDR). The QPs' numbers,
//! PSNs and states are the connection manager's; what else each end needs to know about
//! the other's QP rides in the private data of the REQ / SIDR_REQ and REP / SIDR_REP:
//!
//! ```text
//! 0  "SVP1"       4  QP index (BE32)   8  rkey (BE32)   12 buffer address (BE64)
//! 20 QPN (BE32: UD only, else 0)       24 device IPv6 or IPv4-mapped address (16)
//! 40 device UDP port (BE16)            42 bytes, within the REQ's 56
//! ```

use super::{Plan, QpEnd, Side, UdPeer};
use crate::conn::QpInfo;
use crate::{fail, Op, Result};
use softverbs::cm::{
    CmEventKind, CmId, ConnParam, Event, EventChannel, EventParam, EventStatus, PortSpace,
    RcListener, RcOptions,
};
use softverbs::{AddressHandle, Gid, QpCap, QpType, Qpn};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

/// How long one connection step may take (CM retries under loss included).
pub const STEP: Duration = Duration::from_secs(60);

const MAGIC: &[u8; 4] = b"SVP1";
const BLOB_LEN: usize = 42;

/// What one end tells the other about one of its QPs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Blob {
    pub index: u32,
    pub rkey: u32,
    pub vaddr: u64,
    pub qpn: u32,
    pub device: SocketAddr,
}

impl Blob {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(BLOB_LEN);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&self.index.to_be_bytes());
        b.extend_from_slice(&self.rkey.to_be_bytes());
        b.extend_from_slice(&self.vaddr.to_be_bytes());
        b.extend_from_slice(&self.qpn.to_be_bytes());
        let ip = match self.device.ip() {
            IpAddr::V4(v4) => v4.to_ipv6_mapped(),
            IpAddr::V6(v6) => v6,
        };
        b.extend_from_slice(&ip.octets());
        b.extend_from_slice(&self.device.port().to_be_bytes());
        b
    }

    /// Parses the first [`BLOB_LEN`] bytes of private data (the CM pads it).
    pub fn decode(data: &[u8]) -> Result<Blob> {
        if data.len() < BLOB_LEN || &data[..4] != MAGIC {
            fail!("the peer's connection request does not come from softverbs perf --cm");
        }
        let be32 =
            |at: usize| u32::from_be_bytes([data[at], data[at + 1], data[at + 2], data[at + 3]]);
        let mut v = [0u8; 8];
        v.copy_from_slice(&data[12..20]);
        let mut ip = [0u8; 16];
        ip.copy_from_slice(&data[24..40]);
        let ip = std::net::Ipv6Addr::from(ip).to_canonical();
        Ok(Blob {
            index: be32(4),
            rkey: be32(8),
            vaddr: u64::from_be_bytes(v),
            qpn: be32(20),
            device: SocketAddr::new(ip, u16::from_be_bytes([data[40], data[41]])),
        })
    }
}

/// What keeps a test QP's connection alive (held for its `Drop`, which disconnects).
#[allow(dead_code)]
pub enum Hold {
    /// An RC connection (dropping it disconnects).
    Rc(softverbs::cm::RcConnection),
    /// A UD id (SIDR keeps no connection; the id owns the QP).
    Ud(CmId),
}

/// The connection parameters of a test QP: READ and atomic tests ask for as many
/// outstanding operations as the device allows, the others for none (as perftest `-R`).
fn options(plan: &Plan, cap: QpCap, private_data: Vec<u8>) -> RcOptions {
    let depth = if matches!(plan.op, Op::Read | Op::Atomic) {
        255
    } else {
        0
    };
    RcOptions {
        cap,
        param: Some(ConnParam {
            private_data,
            responder_resources: depth,
            initiator_depth: depth,
            retry_count: 7,
            rnr_retry_count: 7,
            ..ConnParam::default()
        }),
        timeout: STEP,
    }
}

/// The next event on `channel`, which must be `want` with status OK.
fn expect(channel: &EventChannel, want: CmEventKind, what: &str) -> Result<Event> {
    let Some(ev) = channel.get_event_timeout(STEP) else {
        fail!("{what}: no {want:?} within {STEP:?}");
    };
    if ev.kind() != want || ev.status() != EventStatus::Ok {
        fail!("{what}: {:?} (status {:?})", ev.kind(), ev.status());
    }
    Ok(ev)
}

/// The peer's QP as the report shows it, from the QP's own attributes and the blob.
fn remote_info(e: &QpEnd, blob: &Blob) -> QpInfo {
    let attr = e.qp.query();
    QpInfo {
        lid: 0,
        qpn: if blob.qpn != 0 {
            blob.qpn
        } else {
            attr.dest_qp_num
        },
        psn: attr.rq_psn,
        rkey: blob.rkey,
        vaddr: blob.vaddr,
        gid: Gid::from_socket_addr(blob.device).unwrap_or_default(),
    }
}

impl Side {
    fn blob(&self, index: u32, mr: &softverbs::Mr<softverbs::PageAligned>, qpn: u32) -> Blob {
        Blob {
            index,
            rkey: mr.rkey(),
            vaddr: mr.addr(),
            qpn,
            device: self.ctx.local_addr(),
        }
    }

    /// The client: connects every QP to the server at `dst`.
    pub fn cm_connect(&mut self, plan: &Plan, dst: SocketAddr) -> Result<()> {
        let channel = EventChannel::new(&self.ctx)?;
        for q in 0..plan.qps {
            let mr = self.new_mr(plan)?;
            let (qp, hold, peer, ud) = if plan.ud {
                let id = CmId::new(&channel, PortSpace::Udp)?;
                id.resolve_addr(None, dst, STEP)?;
                expect(&channel, CmEventKind::AddrResolved, "resolving the address")?;
                id.resolve_route()?;
                expect(&channel, CmEventKind::RouteResolved, "resolving the route")?;
                let qp = id.create_qp_with(self.builder(plan, QpType::Ud))?;
                let mine = self.blob(q, &mr, qp.qpn().value());
                id.connect(Some(ConnParam {
                    private_data: mine.encode(),
                    ..ConnParam::default()
                }))?;
                let ev = expect(
                    &channel,
                    CmEventKind::Established,
                    "resolving the UD service",
                )?;
                let EventParam::Ud(p) = ev.param() else {
                    fail!("the UD service resolution carried no address");
                };
                let Some(ah) = p.ah else {
                    fail!("the UD service resolution carried no address");
                };
                let peer = Blob::decode(&p.private_data)?;
                let ud = UdPeer {
                    ah: AddressHandle::from_addr(ah.dest),
                    qpn: p.qp_num,
                    qkey: p.qkey,
                };
                (qp, Hold::Ud(id), peer, Some(ud))
            } else {
                let mine = self.blob(q, &mr, 0);
                let conn = softverbs::cm::connect_rc(
                    &self.pd,
                    &self.cq,
                    dst,
                    &options(plan, self.cap(plan), mine.encode()),
                )
                .map_err(|e| format!("connecting QP {q}: {e}"))?;
                let peer = Blob::decode(&conn.private_data)?;
                (Arc::clone(&conn.qp), Hold::Rc(conn), peer, None)
            };
            if peer.index != q {
                fail!("the server answered QP {q} as QP {}", peer.index);
            }
            self.push_cm(qp, mr, hold, &peer, ud);
        }
        Ok(())
    }

    /// The server: accepts one connection per QP, on `listener` (RC) or on `ud` (a UD id
    /// listening in the UDP port space).
    pub fn cm_accept(
        &mut self,
        plan: &Plan,
        listener: &RcListener,
        ud: Option<&CmId>,
    ) -> Result<()> {
        for q in 0..plan.qps {
            let mr = self.new_mr(plan)?;
            let (qp, hold, peer, udp) = if let Some(ud_listener) = ud {
                let mut ev = expect(
                    ud_listener.channel(),
                    CmEventKind::ConnectRequest,
                    "waiting for a UD service request",
                )?;
                let peer = Blob::decode(ev.private_data())?;
                let Some(id) = ev.take_request() else {
                    fail!("a UD service request without its id");
                };
                let qp = id.create_qp_with(self.builder(plan, QpType::Ud))?;
                let mine = self.blob(q, &mr, qp.qpn().value());
                id.accept(Some(ConnParam {
                    private_data: mine.encode(),
                    ..ConnParam::default()
                }))?;
                let to = UdPeer {
                    ah: AddressHandle::from_addr(peer.device),
                    qpn: Qpn::new(peer.qpn),
                    qkey: softverbs::cm::RDMA_UDP_QKEY,
                };
                (qp, Hold::Ud(id), peer, Some(to))
            } else {
                let (id, data) = listener.get_request(STEP)?;
                let peer = Blob::decode(&data)?;
                let mine = self.blob(q, &mr, 0);
                let conn = softverbs::cm::accept_request(
                    id,
                    data,
                    &self.pd,
                    &self.cq,
                    &options(plan, self.cap(plan), mine.encode()),
                )?;
                (Arc::clone(&conn.qp), Hold::Rc(conn), peer, None)
            };
            if peer.index != q {
                fail!(
                    "the client connected QP {} where QP {q} was due",
                    peer.index
                );
            }
            self.push_cm(qp, mr, hold, &peer, udp);
        }
        Ok(())
    }

    fn push_cm(
        &mut self,
        qp: Arc<softverbs::Qp>,
        mr: softverbs::Mr<softverbs::PageAligned>,
        hold: Hold,
        peer: &Blob,
        ud: Option<UdPeer>,
    ) {
        let psn = qp.query().sq_psn;
        let mut e = QpEnd {
            qp,
            mr,
            psn,
            remote: QpInfo::default(),
            ud,
        };
        e.remote = remote_info(&e, peer);
        self.qps.push(e);
        self.cm.push(hold);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blob_round_trips_and_fits_a_req() {
        for device in ["127.83.1.2:4791", "[::1]:20001"] {
            let b = Blob {
                index: 3,
                rkey: 0xdead_beef,
                vaddr: 0x7f00_1234_5678,
                qpn: 0x12_3456,
                device: device.parse().unwrap(),
            };
            let mut wire = b.encode();
            assert!(wire.len() <= 56, "REQ private data holds 56 bytes");
            wire.resize(56, 0); // as the CM pads it
            assert_eq!(Blob::decode(&wire).unwrap(), b);
        }
        assert!(Blob::decode(b"SVP0").is_err());
        assert!(Blob::decode(&[0u8; 56]).is_err());
    }
}
