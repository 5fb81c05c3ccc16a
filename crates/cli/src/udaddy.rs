//! `softverbs udaddy`: UD datagrams to a service found through the connection manager, as
//! rdmacm-utils' udaddy does.
//!
//! The server listens at an rdma_cm address of the UDP port space (default port 7174). The
//! client resolves the address and route, creates a UD QP, and resolves the service (SIDR:
//! `rdma_connect` on a UD id), which answers with the server's QPN, Q_Key and address; it
//! does so for each of `--connections` ids. Then, per connection, COUNT messages of SIZE
//! bytes go out as UD SENDs with immediate data (the sender's QPN, as udaddy sends it); the
//! server learns each sender from the completion (`ibv_create_ah_from_wc`) and echoes the
//! message back. Unlike udaddy, which waits forever for a datagram that was lost, the client
//! sends a message again when its echo does not come within [`RETRY`], so a lossy path
//! costs time, not the run. A last `bye` message (sequence number 0xFFFFFFFF) per
//! connection tells the server it may leave once every connection said it and nothing
//! arrived for [`LINGER`] (an echo of `bye` that was lost is asked for again meanwhile).
//!
//! A message: sequence number (BE32), connection index (BE32), then a pattern.

use crate::conn::check_wc;
use crate::{fail, Result};
use clap::Args;
use softverbs::cm::{
    CmEventKind, CmId, ConnParam, EventChannel, EventParam, EventStatus, PortSpace, RDMA_UDP_QKEY,
};
use softverbs::{
    AccessFlags, AddressHandle, Context, Cq, Mr, PageAligned, Pd, Qp, QpCap, Qpn, SendWr, WcStatus,
    WorkCompletion,
};
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long the client waits for an echo before sending the message again.
pub const RETRY: Duration = Duration::from_millis(100);
/// How often a message is sent before the client gives up.
const TRIES: u32 = 100;
/// How long the server stays after the last `bye`, answering what still comes.
pub const LINGER: Duration = Duration::from_secs(1);
/// How long address, route and service resolution may take (CM retries included).
const STEP: Duration = Duration::from_secs(60);
/// The sequence number of the last message.
const BYE: u32 = u32::MAX;
/// Receives kept posted per QP.
const RX: usize = 16;
/// Bytes in front of a UD receive: the GRH area.
const GRH: usize = 40;
/// Most connections (a server refuses more).
const MAX_PEERS: usize = 256;
/// The work request id of every send (receives carry connection and slot).
const SEND_ID: u64 = u64::MAX;

#[derive(Args, Debug)]
pub struct UdaddyArgs {
    /// Run the server.
    #[arg(short, long, conflicts_with = "client")]
    server: bool,
    /// Run the client.
    #[arg(short, long)]
    client: bool,
    /// Address: the server's (client), or where to listen (server; default: every address).
    #[arg(short, long)]
    addr: Option<String>,
    /// rdma_cm port (UDP port space).
    #[arg(short, long, default_value_t = 7174)]
    port: u16,
    /// Messages per connection.
    #[arg(short = 'C', long, default_value_t = 10)]
    count: u32,
    /// Message size in bytes (8 up to the path MTU).
    #[arg(short = 'S', long, default_value_t = 100)]
    size: u32,
    /// Connections: UD ids, each resolving the service and sending from a QP of its own.
    #[arg(short = 'n', long, default_value_t = 1)]
    connections: u32,
    /// Check every echo against the message sent.
    #[arg(short = 'V', long)]
    validate: bool,
    /// Print each connection and message.
    #[arg(short, long)]
    verbose: bool,
}

/// Message `seq` of connection `conn`, `size` bytes.
fn message(seq: u32, conn: u32, size: usize) -> Vec<u8> {
    let mut m = Vec::with_capacity(size);
    m.extend_from_slice(&seq.to_be_bytes());
    m.extend_from_slice(&conn.to_be_bytes());
    let mut c = (seq.wrapping_add(conn) % 94) as u8;
    while m.len() < size {
        m.push(b'!' + c);
        c = (c + 1) % 94;
    }
    m.truncate(size);
    m
}

fn header(m: &[u8]) -> Option<(u32, u32)> {
    let seq = u32::from_be_bytes(m.get(..4)?.try_into().ok()?);
    let conn = u32::from_be_bytes(m.get(4..8)?.try_into().ok()?);
    Some((seq, conn))
}

/// One UD QP with its buffer: a send slot, then [`RX`] receive slots of GRH + `size`.
struct Endpoint {
    id: CmId,
    qp: Arc<Qp>,
    mr: Mr<PageAligned>,
    size: usize,
}

impl Endpoint {
    fn slot(&self) -> usize {
        GRH + self.size
    }

    fn rx_at(&self, slot: usize) -> usize {
        self.size + slot * self.slot()
    }

    /// Posts receive `slot`; its work request id carries the endpoint's index.
    fn post_recv(&self, index: usize, slot: usize) -> Result<()> {
        let wr_id = ((index as u64) << 16) | slot as u64;
        self.qp
            .post_recv(wr_id, &[self.mr.sge(self.rx_at(slot), self.slot() as u32)])?;
        Ok(())
    }

    /// Sends `bytes` (at most `size`) to `qpn` behind `ah`, with this QP's number as
    /// immediate data, and waits for the send to complete.
    fn send(
        &self,
        cq: &Cq,
        ah: AddressHandle,
        qpn: Qpn,
        bytes: &[u8],
        early: &mut Vec<WorkCompletion>,
    ) -> Result<()> {
        self.mr.write(0, bytes);
        let sge = [self.mr.sge(0, bytes.len() as u32)];
        let op = ah.send(qpn, RDMA_UDP_QKEY, Some(self.qp.qpn().value().to_be()));
        self.qp.post_send(&SendWr::new(SEND_ID, op, &sge))?;
        let end = Instant::now() + STEP;
        loop {
            let mut wc = [WorkCompletion::default(); 1];
            if cq.poll(&mut wc) == 1 {
                if wc[0].wr_id == SEND_ID {
                    check_wc(&wc[0])?;
                    return Ok(());
                }
                early.push(wc[0]);
                continue;
            }
            if Instant::now() > end {
                fail!("a UD send did not complete");
            }
            std::thread::yield_now();
        }
    }
}

fn resources(ctx: &Context, entries: u32) -> Result<(Pd, Cq)> {
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(entries, None)?;
    Ok((pd, cq))
}

/// Makes the QP of `id` and its buffer, with every receive posted.
fn endpoint(id: CmId, pd: &Pd, cq: &Cq, size: usize, index: usize) -> Result<Endpoint> {
    let qp = id.create_qp(
        pd,
        cq,
        QpCap {
            max_send_wr: 4,
            max_recv_wr: RX as u32,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
    )?;
    let mr = pd.reg_mr(
        PageAligned::new(size + RX * (GRH + size)),
        AccessFlags::LOCAL_WRITE,
    )?;
    let e = Endpoint { id, qp, mr, size };
    for slot in 0..RX {
        e.post_recv(index, slot)?;
    }
    Ok(e)
}

fn resolve(host: &str, port: u16) -> Result<SocketAddr> {
    match (host, port).to_socket_addrs()?.next() {
        Some(a) => Ok(a),
        None => fail!("{host} has no address"),
    }
}

pub fn run(a: &UdaddyArgs) -> Result<()> {
    if !a.server && !a.client {
        fail!("give -s (server) or -c (client)");
    }
    if a.size < 8 {
        fail!("messages are at least 8 bytes (sequence number and connection)");
    }
    if a.connections == 0 || a.connections as usize > MAX_PEERS {
        fail!("--connections must be 1 to {MAX_PEERS}");
    }
    let ctx = crate::conn::open_device(None, None)?;
    let mtu = ctx.query_port(1)?.active_mtu.bytes();
    if a.size > mtu {
        fail!(
            "a UD message is at most one MTU ({mtu} bytes); {} asked",
            a.size
        );
    }
    if a.server {
        server(a, &ctx)
    } else {
        client(a, &ctx)
    }
}

/// The next event, which must be `want` with status OK.
fn expect(channel: &EventChannel, want: CmEventKind, what: &str) -> Result<softverbs::cm::Event> {
    let Some(ev) = channel.get_event_timeout(STEP) else {
        fail!("{what}: nothing within {STEP:?}");
    };
    if ev.kind() != want || ev.status() != EventStatus::Ok {
        fail!("{what}: {:?} (status {:?})", ev.kind(), ev.status());
    }
    Ok(ev)
}

/// A connection of the client: its endpoint and the service's QP behind its address.
struct Link {
    ep: Endpoint,
    ah: AddressHandle,
    qpn: Qpn,
}

fn client(a: &UdaddyArgs, ctx: &Context) -> Result<()> {
    let Some(host) = &a.addr else {
        fail!("the client needs the server's address (-a)");
    };
    let dst = resolve(host, a.port)?;
    let size = a.size as usize;
    let n = a.connections as usize;
    let (pd, cq) = resources(ctx, (n * (RX + 4)) as u32 + 8)?;
    let channel = EventChannel::new(ctx)?;
    let mut links = Vec::with_capacity(n);
    for c in 0..n {
        let id = CmId::new(&channel, PortSpace::Udp)?;
        id.resolve_addr(None, dst, STEP)?;
        expect(&channel, CmEventKind::AddrResolved, "resolving the address")?;
        id.resolve_route()?;
        expect(&channel, CmEventKind::RouteResolved, "resolving the route")?;
        let ep = endpoint(id, &pd, &cq, size, c)?;
        ep.id.connect(Some(ConnParam {
            private_data: format!("udaddy connection {c}").into_bytes(),
            ..ConnParam::default()
        }))?;
        let ev = channel.get_event_timeout(STEP);
        let Some(ev) = ev else {
            fail!("no answer from the UD service at {dst} within {STEP:?}");
        };
        let (ah, qpn) = match (ev.kind(), ev.param()) {
            (CmEventKind::Established, EventParam::Ud(p)) if p.ah.is_some() => {
                if p.qkey != RDMA_UDP_QKEY {
                    fail!("the service answered with Q_Key {:#x}", p.qkey);
                }
                let ah = p.ah.map(|ah| ah.dest).unwrap_or(dst);
                (AddressHandle::from_addr(ah), p.qp_num)
            }
            (CmEventKind::Unreachable, _) => {
                fail!("UD service at {dst} unreachable (status {:?})", ev.status())
            }
            (kind, _) => fail!(
                "resolving the UD service: {kind:?} (status {:?})",
                ev.status()
            ),
        };
        if a.verbose {
            println!(
                "connection {c}: service {dst} is QP {} at {}",
                qpn.value(),
                ah.addr()
            );
        }
        links.push(Link { ep, ah, qpn });
    }
    let mut retransmitted = 0u64;
    let mut early = Vec::new();
    for seq in (0..a.count).chain([BYE]) {
        for (c, link) in links.iter().enumerate() {
            let msg = message(seq, c as u32, size);
            let echo = exchange(&cq, &links, c, &msg, &mut early, &mut retransmitted)?;
            if a.validate && seq != BYE && echo != msg {
                fail!("connection {c}: the echo of message {seq} differs from it");
            }
            if a.verbose && seq != BYE {
                println!(
                    "connection {c}: message {seq} echoed by QP {}",
                    link.qpn.value()
                );
            }
        }
    }
    println!(
        "udaddy client: {} message(s) echoed on {n} connection(s), {retransmitted} sent again",
        u64::from(a.count) * n as u64
    );
    Ok(())
}

/// Sends `msg` on connection `c` until its echo comes back; returns the echo.
fn exchange(
    cq: &Cq,
    links: &[Link],
    c: usize,
    msg: &[u8],
    early: &mut Vec<WorkCompletion>,
    retransmitted: &mut u64,
) -> Result<Vec<u8>> {
    let link = &links[c];
    let want = header(msg);
    for attempt in 0..TRIES {
        if attempt > 0 {
            *retransmitted += 1;
        }
        link.ep.send(cq, link.ah, link.qpn, msg, early)?;
        let end = Instant::now() + RETRY;
        loop {
            let wc = match early.pop() {
                Some(wc) => Some(wc),
                None => {
                    let mut wc = [WorkCompletion::default(); 1];
                    (cq.poll(&mut wc) == 1).then_some(wc[0])
                }
            };
            let Some(wc) = wc else {
                if Instant::now() > end {
                    break;
                }
                std::thread::sleep(Duration::from_micros(50));
                continue;
            };
            check_wc(&wc)?;
            if wc.wr_id == SEND_ID {
                continue;
            }
            let (index, slot) = ((wc.wr_id >> 16) as usize, (wc.wr_id & 0xffff) as usize);
            let Some(from) = links.get(index) else {
                fail!("completion for unknown work request {:#x}", wc.wr_id);
            };
            let len = (wc.byte_len as usize).saturating_sub(GRH);
            let mut got = vec![0u8; len];
            from.ep.mr.read(from.ep.rx_at(slot) + GRH, &mut got);
            from.ep.post_recv(index, slot)?;
            // An echo of an earlier try (or of another connection's message) is stale.
            if index == c && header(&got) == want {
                return Ok(got);
            }
        }
    }
    fail!(
        "connection {c}: no echo after {TRIES} tries of {} ms",
        RETRY.as_millis()
    )
}

/// A connection the server accepted.
struct Peer {
    ep: Endpoint,
    said_bye: bool,
}

fn server(a: &UdaddyArgs, ctx: &Context) -> Result<()> {
    let channel = EventChannel::new(ctx)?;
    let listener = CmId::new(&channel, PortSpace::Udp)?;
    match &a.addr {
        Some(h) => listener.bind(resolve(h, a.port)?)?,
        // Every address: IPv6 and IPv4 (IPv4 only where there is no IPv6).
        None => match listener.bind(SocketAddr::new(IpAddr::from([0u16; 8]), a.port)) {
            Err(softverbs::cm::CmError::Bind { .. }) => {
                listener.bind(SocketAddr::new(IpAddr::from([0u8; 4]), a.port))?
            }
            r => r?,
        },
    }
    listener.listen(16)?;
    if a.verbose {
        eprintln!(
            "udaddy server: UD service at {}",
            listener.local_addr().map_or("?".into(), |a| a.to_string())
        );
    }
    let size = mtu_size(ctx)?;
    let (pd, cq) = resources(ctx, (MAX_PEERS * (RX + 4)) as u32)?;
    let mut peers: Vec<Peer> = Vec::new();
    let mut last = Instant::now();
    let mut echoed = 0u64;
    let mut early = Vec::new();
    loop {
        let mut busy = false;
        while let Some(mut ev) = channel.try_get_event() {
            busy = true;
            if ev.kind() != CmEventKind::ConnectRequest {
                continue;
            }
            let Some(id) = ev.take_request() else {
                continue;
            };
            if peers.len() >= MAX_PEERS {
                id.reject(b"too many connections")?;
                continue;
            }
            let ep = endpoint(id, &pd, &cq, size, peers.len())?;
            ep.id.accept(None)?;
            if a.verbose {
                println!(
                    "connection {}: request from {}",
                    peers.len(),
                    ep.id.peer_addr().map_or("?".into(), |a| a.to_string())
                );
            }
            peers.push(Peer {
                ep,
                said_bye: false,
            });
        }
        let mut wc = [WorkCompletion::default(); 1];
        let got = match early.pop() {
            Some(w) => Some(w),
            None => (cq.poll(&mut wc) == 1).then_some(wc[0]),
        };
        if let Some(wc) = got {
            busy = true;
            if wc.wr_id != SEND_ID {
                echo(&cq, &mut peers, &wc, &mut early, a.verbose)?;
                echoed += 1;
                last = Instant::now();
            }
        }
        if !peers.is_empty() && peers.iter().all(|p| p.said_bye) && last.elapsed() > LINGER {
            break;
        }
        if !busy {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    if a.verbose {
        eprintln!(
            "udaddy server: {} connection(s), {echoed} datagram(s) echoed",
            peers.len()
        );
    }
    Ok(())
}

/// The largest message the server takes: the port's MTU.
fn mtu_size(ctx: &Context) -> Result<usize> {
    Ok(ctx.query_port(1)?.active_mtu.bytes() as usize)
}

/// Echoes a received datagram to where it came from and reposts its receive.
fn echo(
    cq: &Cq,
    peers: &mut [Peer],
    wc: &WorkCompletion,
    early: &mut Vec<WorkCompletion>,
    verbose: bool,
) -> Result<()> {
    let (index, slot) = ((wc.wr_id >> 16) as usize, (wc.wr_id & 0xffff) as usize);
    let Some(peer) = peers.get_mut(index) else {
        fail!("completion for unknown work request {:#x}", wc.wr_id);
    };
    if wc.status != WcStatus::Success {
        fail!("a receive failed: {:?}", wc.status);
    }
    let ep = &peer.ep;
    let len = (wc.byte_len as usize).saturating_sub(GRH).min(ep.size);
    let mut msg = vec![0u8; len];
    ep.mr.read(ep.rx_at(slot) + GRH, &mut msg);
    ep.post_recv(index, slot)?;
    let Some(ah) = AddressHandle::from_wc(wc) else {
        fail!("a UD receive without its sender");
    };
    // udaddy's immediate data is the sender's QPN; the completion names it too.
    let qpn = match wc.imm_data {
        Some(imm) => Qpn::new(u32::from_be(imm)),
        None => wc.src_qp,
    };
    if qpn != wc.src_qp {
        fail!(
            "immediate data {:#x} is not the sender's QPN {:#x}",
            qpn.value(),
            wc.src_qp.value()
        );
    }
    ep.send(cq, ah, qpn, &msg, early)?;
    if let Some((seq, _)) = header(&msg) {
        if seq == BYE {
            peer.said_bye = true;
        } else if verbose {
            println!("connection {index}: echoed message {seq}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_carry_sequence_and_connection() {
        let m = message(7, 2, 100);
        assert_eq!(m.len(), 100);
        assert_eq!(header(&m), Some((7, 2)));
        assert_ne!(message(8, 2, 100), m);
        assert_eq!(header(&message(BYE, 0, 8)), Some((BYE, 0)));
        assert_eq!(header(&m[..7]), None);
    }
}
