//! `softverbs mcast`: UD multicast between processes. `--recv GROUP` attaches a
//! UD QP to the group, prints `attached <MGID>` and prints each message it
//! receives; `--send GROUP MESSAGE` sends one UD SEND to the group (QPN
//! 0xFFFFFF). GROUP is an IPv4 multicast address with an optional UDP port
//! (4791 when omitted); its MGID is `0:0:0:0:PORT:ffff:a.b.c.d` (the RoCEv2
//! `::ffff:a.b.c.d` for port 4791).

use crate::{fail, Result};
use clap::Args;
use softverbs::{
    AccessFlags, AddressHandle, Gid, Qp, QpBuilder, QpCap, QpType, Qpn, RtsAttr, SendWr, WcStatus,
};
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

/// The Q_Key rdma_cm gives multicast joins on RDMA_PS_UDP (librdmacm's
/// RDMA_UDP_QKEY).
const DEFAULT_QKEY: u32 = 0x0123_4567;

#[derive(Args, Debug)]
pub struct McastArgs {
    /// Attach to GROUP (ADDR[:PORT]) and print the messages received.
    #[arg(
        long,
        value_name = "GROUP",
        conflicts_with = "send",
        required_unless_present = "send"
    )]
    recv: Option<String>,
    /// Send MESSAGE to GROUP (ADDR[:PORT]) once.
    #[arg(long, value_name = "GROUP", requires = "message")]
    send: Option<String>,
    /// The message to send.
    message: Option<String>,
    /// Messages to receive before exiting (with --recv).
    #[arg(short = 'n', long, default_value_t = 1)]
    count: u32,
    /// Give up receiving after this many seconds (exit status 1).
    #[arg(long, default_value_t = 30.0)]
    timeout: f64,
    /// The Q_Key (0x01234567 as rdma_cm's UDP port space uses).
    #[arg(long, default_value_t = DEFAULT_QKEY)]
    qkey: u32,
}

fn parse_group(s: &str) -> Result<Gid> {
    let addr: SocketAddr = match s.parse::<SocketAddr>() {
        Ok(a) => a,
        Err(_) => match s.parse::<IpAddr>() {
            Ok(ip) => SocketAddr::new(ip, softverbs::ROCE_PORT),
            Err(_) => fail!("{s}: not an address[:port]"),
        },
    };
    if !matches!(addr.ip(), IpAddr::V4(ip) if ip.is_multicast()) {
        fail!("{s}: not an IPv4 multicast address (224.0.0.0/4)");
    }
    match Gid::from_socket_addr(addr) {
        Some(g) => Ok(g),
        None => fail!("{s}: no GID for this address"),
    }
}

fn ud_qp(pd: &softverbs::Pd, cq: &softverbs::Cq, qkey: u32) -> Result<Qp> {
    let qp = QpBuilder::new(pd, cq)
        .qp_type(QpType::Ud)
        .cap(QpCap {
            max_send_wr: 4,
            max_recv_wr: 64,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        })
        .build()?;
    qp.ud_to_init(qkey)?;
    qp.ud_to_rtr()?;
    qp.to_rts(RtsAttr::default())?;
    Ok(qp)
}

pub fn run(a: &McastArgs) -> Result<()> {
    let ctx = crate::conn::open_device(None, None)?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(128, None)?;
    let qp = ud_qp(&pd, &cq, a.qkey)?;
    let mtu = ctx.query_port(1)?.active_mtu.bytes() as usize;
    let slot = 40 + mtu;
    let mr = pd.reg_mr(vec![0u8; 64 * slot], AccessFlags::LOCAL_WRITE)?;
    let mut out = std::io::stdout().lock();
    if let Some(send) = &a.send {
        let gid = parse_group(send)?;
        let msg = a.message.as_deref().unwrap_or_default().as_bytes();
        if msg.len() > mtu {
            fail!(
                "the message is {} bytes; UD carries at most one MTU ({mtu})",
                msg.len()
            );
        }
        mr.write(0, msg);
        let sges = [mr.sge(0, msg.len() as u32)];
        let ah = AddressHandle::from_gid(gid);
        qp.post_send(&SendWr::new(
            1,
            ah.send(Qpn::MULTICAST, a.qkey, None),
            &sges,
        ))?;
        let wc = cq.wait_for(1, Duration::from_secs(10));
        match wc.first() {
            Some(w) if w.status == WcStatus::Success => {}
            Some(w) => fail!("send failed: {:?}", w.status),
            None => fail!("send did not complete"),
        }
        writeln!(out, "sent {} bytes to {gid}", msg.len())?;
        return Ok(());
    }
    let Some(recv) = &a.recv else {
        fail!("--recv GROUP or --send GROUP MESSAGE");
    };
    let gid = parse_group(recv)?;
    for i in 0..64u64 {
        qp.post_recv(i, &[mr.sge(i as usize * slot, slot as u32)])?;
    }
    qp.attach_mcast(gid)?;
    writeln!(out, "attached {gid} qpn {}", qp.qpn())?;
    out.flush()?;
    let deadline = Instant::now() + Duration::from_secs_f64(a.timeout.max(0.0));
    let mut got = 0;
    while got < a.count {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            fail!("timed out after {got} of {} messages", a.count);
        }
        for wc in cq.wait_for(1, left.min(Duration::from_millis(100))) {
            if wc.status != WcStatus::Success {
                fail!("receive failed: {:?}", wc.status);
            }
            let len = (wc.byte_len as usize).saturating_sub(40);
            let mut data = vec![0u8; len];
            let at = wc.wr_id as usize * slot;
            mr.read(at + 40, &mut data);
            let from = AddressHandle::from_wc(&wc).map(|ah| ah.addr());
            writeln!(
                out,
                "received {len} bytes from {} qpn {}: {}",
                from.map_or_else(|| "?".into(), |a| a.to_string()),
                wc.src_qp,
                String::from_utf8_lossy(&data)
            )?;
            out.flush()?;
            qp.post_recv(wc.wr_id, &[mr.sge(at, slot as u32)])?;
            got += 1;
        }
    }
    qp.detach_mcast(gid)?;
    Ok(())
}
