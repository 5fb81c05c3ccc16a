//! `softverbs mcast`: UD multicast between processes. `--recv GROUP` attaches a
//! UD QP to the group, prints `attached <MGID>` and prints each message it
//! receives; `--send GROUP MESSAGE` sends one UD SEND to the group (QPN
//! 0xFFFFFF), or `--repeat` of them. GROUP is an IPv4 multicast address with an
//! optional UDP port (4791 when omitted); its MGID is `0:0:0:0:PORT:ffff:a.b.c.d`
//! (the RoCEv2 `::ffff:a.b.c.d` for port 4791).
//!
//! With `--cm` the join goes through the connection manager, as rdma_cm programs (mckey)
//! do it: a UD id of the UDP port space is bound to an address (`--bind`, default the
//! device's), its QP is made by the id, and `rdma_join_multicast` (send-only for
//! `--send`) makes the host a member of the group and attaches the QP; MULTICAST_JOIN
//! hands out the group's address, QPN 0xFFFFFF and the Q_Key (0x01234567) to send with.
//! GROUP is then an address alone: rdma_cm groups live at the RoCEv2 port.

use crate::{fail, Result};
use clap::Args;
use softverbs::cm::{CmEventKind, CmId, EventChannel, EventParam, EventStatus, PortSpace};
use softverbs::{
    AccessFlags, AddressHandle, Gid, Qp, QpBuilder, QpCap, QpType, Qpn, RtsAttr, SendWr, WcStatus,
};
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The Q_Key rdma_cm gives multicast joins on RDMA_PS_UDP (librdmacm's
/// RDMA_UDP_QKEY).
const DEFAULT_QKEY: u32 = 0x0123_4567;

/// Receives kept posted.
const RX: usize = 64;

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
    /// Send MESSAGE to GROUP (ADDR[:PORT]).
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
    /// The Q_Key (0x01234567 as rdma_cm's UDP port space uses; with --cm always that).
    #[arg(long, default_value_t = DEFAULT_QKEY, conflicts_with = "cm")]
    qkey: u32,
    /// Send the message this many times (with --send): multicast is unreliable, so a
    /// sender that must reach every receiver on a lossy path repeats itself.
    #[arg(long, default_value_t = 1)]
    repeat: u32,
    /// Milliseconds between repeated messages.
    #[arg(long, default_value_t = 20)]
    interval: u64,
    /// Join through the connection manager (rdma_join_multicast on a UD id), as mckey does.
    #[arg(long)]
    cm: bool,
    /// With --cm: the rdma_cm address the id binds to [default: the device's address].
    #[arg(long, value_name = "ADDR", requires = "cm")]
    bind: Option<IpAddr>,
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
        .cap(qp_cap())
        .build()?;
    qp.ud_to_init(qkey)?;
    qp.ud_to_rtr()?;
    qp.to_rts(RtsAttr::default())?;
    Ok(qp)
}

fn qp_cap() -> QpCap {
    QpCap {
        max_send_wr: 4,
        max_recv_wr: RX as u32,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    }
}

/// Where the messages go and with which Q_Key.
#[derive(Debug, Clone, Copy)]
struct Target {
    ah: AddressHandle,
    qkey: u32,
}

/// A group joined through the connection manager: the id (leaving on drop) and its QP.
struct CmJoin {
    id: CmId,
    group: IpAddr,
    qp: Arc<Qp>,
    target: Target,
}

/// Binds a UD id, makes its QP (receives posted by `prepare`) and joins `group`.
fn cm_join(
    ctx: &softverbs::Context,
    pd: &softverbs::Pd,
    cq: &softverbs::Cq,
    a: &McastArgs,
    group: &str,
    send_only: bool,
    prepare: impl FnOnce(&Qp) -> Result<()>,
) -> Result<CmJoin> {
    let group: IpAddr = match group.parse() {
        Ok(ip) => ip,
        Err(_) => fail!("{group}: with --cm a group is an IP address (no port)"),
    };
    let channel = EventChannel::new(ctx)?;
    let id = CmId::new(&channel, PortSpace::Udp)?;
    let bind = a.bind.unwrap_or_else(|| ctx.local_addr().ip());
    id.bind(SocketAddr::new(bind, 0))?;
    let qp = id.create_qp(pd, cq, qp_cap())?;
    prepare(&qp)?;
    if let Err(e) = id.join_multicast(group, send_only) {
        fail!("cannot join {group}: {e}");
    }
    let Some(ev) = channel.get_event_timeout(Duration::from_secs(30)) else {
        fail!("joining {group}: no answer");
    };
    match (ev.kind(), ev.param()) {
        (CmEventKind::MulticastJoin, EventParam::Multicast { group: at, ud, .. })
            if ev.status() == EventStatus::Ok =>
        {
            if ud.qp_num != Qpn::MULTICAST {
                fail!(
                    "the join named QPN {:#x}, not the multicast QPN",
                    ud.qp_num.value()
                );
            }
            let target = Target {
                ah: AddressHandle::from_addr(*at),
                qkey: ud.qkey,
            };
            Ok(CmJoin {
                id,
                group,
                qp,
                target,
            })
        }
        (kind, _) => fail!("joining {group}: {kind:?} (status {:?})", ev.status()),
    }
}

pub fn run(a: &McastArgs) -> Result<()> {
    let ctx = crate::conn::open_device(None, None)?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(128, None)?;
    let mtu = ctx.query_port(1)?.active_mtu.bytes() as usize;
    let slot = 40 + mtu;
    let mr = pd.reg_mr(vec![0u8; RX * slot], AccessFlags::LOCAL_WRITE)?;
    let post_all = |qp: &Qp| -> Result<()> {
        for i in 0..RX as u64 {
            qp.post_recv(i, &[mr.sge(i as usize * slot, slot as u32)])?;
        }
        Ok(())
    };
    let mut out = std::io::stdout().lock();
    if let Some(send) = &a.send {
        let msg = a.message.as_deref().unwrap_or_default().as_bytes();
        if msg.len() > mtu {
            fail!(
                "the message is {} bytes; UD carries at most one MTU ({mtu})",
                msg.len()
            );
        }
        // The join (or the QP) lives until every message went out.
        let (qp, target, _join) = if a.cm {
            let j = cm_join(&ctx, &pd, &cq, a, send, true, |_| Ok(()))?;
            (Arc::clone(&j.qp), j.target, Some(j))
        } else {
            let gid = parse_group(send)?;
            let qp = Arc::new(ud_qp(&pd, &cq, a.qkey)?);
            let t = Target {
                ah: AddressHandle::from_gid(gid),
                qkey: a.qkey,
            };
            (qp, t, None)
        };
        mr.write(0, msg);
        let sges = [mr.sge(0, msg.len() as u32)];
        for i in 0..a.repeat.max(1) {
            if i > 0 {
                std::thread::sleep(Duration::from_millis(a.interval));
            }
            qp.post_send(&SendWr::new(
                u64::from(i),
                target.ah.send(Qpn::MULTICAST, target.qkey, None),
                &sges,
            ))?;
            let wc = cq.wait_for(1, Duration::from_secs(10));
            match wc.first() {
                Some(w) if w.status == WcStatus::Success => {}
                Some(w) => fail!("send failed: {:?}", w.status),
                None => fail!("send did not complete"),
            }
        }
        writeln!(
            out,
            "sent {} bytes to {} ({} time(s))",
            msg.len(),
            target.ah.addr(),
            a.repeat.max(1)
        )?;
        return Ok(());
    }
    let Some(recv) = &a.recv else {
        fail!("--recv GROUP or --send GROUP MESSAGE");
    };
    let (qp, join, gid) = if a.cm {
        let j = cm_join(&ctx, &pd, &cq, a, recv, false, |qp| post_all(qp))?;
        writeln!(
            out,
            "joined {} through the connection manager, qpn {}",
            j.group,
            j.qp.qpn()
        )?;
        (Arc::clone(&j.qp), Some(j), None)
    } else {
        let gid = parse_group(recv)?;
        let qp = ud_qp(&pd, &cq, a.qkey)?;
        post_all(&qp)?;
        qp.attach_mcast(gid)?;
        writeln!(out, "attached {gid} qpn {}", qp.qpn())?;
        (Arc::new(qp), None, Some(gid))
    };
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
    match (join, gid) {
        (Some(j), _) => j.id.leave_multicast(j.group)?,
        (None, Some(gid)) => qp.detach_mcast(gid)?,
        (None, None) => {}
    }
    Ok(())
}
