//! `softverbs pingpong`: RC SEND/RECV ping-pong, like ibv_rc_pingpong.
//!
//! The server listens on a TCP port; the client connects and sends its
//! `lid:qpn:psn:gid`; the server connects its QP and answers with its own; the
//! client connects. Then the client sends a message, the server answers with
//! one, ITERS times. A TCP `done` exchange at the end keeps both devices alive
//! until both have all their acknowledgements.

use crate::conn::{
    all_access, check_wc, open_device, parse_mtu, random_psn, rtr_rts, Ctrl, QpInfo, Spin,
};
use crate::{fail, PingpongArgs, Result};
use softverbs::{
    PageAligned, QpBuilder, QpCap, SendFlags, SendOp, SendWr, WcOpcode, WorkCompletion,
};
use std::time::{Duration, Instant};

/// Receives kept posted.
const RX_DEPTH: u32 = 16;
/// Sends the send queue holds.
const TX_DEPTH: u32 = 16;

/// Byte `j` of message `iter` sent by the client (`from_server` false) or the
/// server: changes with all three, so a stale or misplaced byte shows.
pub fn pattern_byte(iter: u32, j: usize, from_server: bool) -> u8 {
    let j = j as u32;
    let x = iter
        .wrapping_mul(0x9e37_79b1)
        .wrapping_add(j.wrapping_mul(0x85eb_ca77))
        ^ (j >> 8)
        ^ if from_server { 0x5a5a_5a5a } else { 0 };
    (x ^ (x >> 13) ^ (x >> 24)) as u8
}

pub fn fill_pattern(buf: &mut [u8], iter: u32, from_server: bool) {
    for (j, b) in buf.iter_mut().enumerate() {
        *b = pattern_byte(iter, j, from_server);
    }
}

pub fn check_pattern(buf: &[u8], iter: u32, from_server: bool) -> Result<()> {
    for (j, &b) in buf.iter().enumerate() {
        let want = pattern_byte(iter, j, from_server);
        if b != want {
            fail!("validation failed: message {iter}, byte {j} is {b:#04x}, expected {want:#04x}");
        }
    }
    Ok(())
}

/// The Q_Key UD ping-pong uses on both sides (as ibv_ud_pingpong does, a fixed one).
const UD_QKEY: u32 = 0x1111_1111;

/// ibv_ud_pingpong's default message size.
const UD_SIZE: u32 = 2048;

pub fn run(a: &PingpongArgs) -> Result<()> {
    if a.cm {
        return crate::cmpingpong::run(a);
    }
    // The path MTU of RC and UC QPs; UD QPs have none (the port's MTU bounds a datagram).
    let mtu = parse_mtu(a.mtu.unwrap_or(1024))?;
    if a.size == Some(0) {
        fail!("the message size must be at least 1 byte");
    }
    let mut ctrl = match &a.host {
        Some(host) if !a.server => Ctrl::connect(host, a.port, Duration::from_secs(10), || None)?,
        _ => {
            eprintln!("waiting for a client on TCP port {}", a.port);
            Ctrl::accept(a.port)?
        }
    };
    let result = session(a, &mut ctrl, mtu);
    if let Err(e) = &result {
        ctrl.send_error(&e.to_string());
    }
    result
}

fn session(a: &PingpongArgs, ctrl: &mut Ctrl, mtu: softverbs::Mtu) -> Result<()> {
    let server = a.server;
    let device_mtu = if a.ud { a.mtu } else { Some(mtu.bytes()) };
    let ctx = open_device(Some(ctrl.local_ip()?), device_mtu)?;
    let port_mtu = ctx.query_port(1)?.active_mtu.bytes();
    let size = match a.size {
        Some(s) => s,
        None if a.ud => UD_SIZE.min(port_mtu),
        None => 4096,
    } as usize;
    let pd = ctx.alloc_pd()?;
    let rx_depth = RX_DEPTH.min(a.iters.max(1));
    let cq = ctx.create_cq(RX_DEPTH + TX_DEPTH + 8, None)?;
    let qp_type = if a.ud {
        softverbs::QpType::Ud
    } else if a.uc {
        softverbs::QpType::Uc
    } else {
        softverbs::QpType::Rc
    };
    // UD receive buffers start with the 40-byte GRH area (ibv_ud_pingpong).
    let grh = if a.ud { 40 } else { 0 };
    if a.ud && size > port_mtu as usize {
        fail!("UD messages are at most one MTU ({port_mtu} bytes)");
    }
    let srq = if a.srq {
        Some(pd.create_srq(RX_DEPTH, 1)?)
    } else {
        None
    };
    let mut builder = QpBuilder::new(&pd, &cq);
    if let Some(srq) = &srq {
        builder = builder.srq(srq);
    }
    let qp = builder
        .qp_type(qp_type)
        .cap(QpCap {
            max_send_wr: TX_DEPTH,
            max_recv_wr: RX_DEPTH,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        })
        .build()?;
    // Slot 0 sends; slots 1..=RX_DEPTH receive.
    let stride = size + grh;
    let mr = pd.reg_mr(
        PageAligned::new(stride * (RX_DEPTH as usize + 1)),
        all_access(),
    )?;
    let slot = |k: u64| (k as usize + 1) * stride;
    // Receives are posted before the peer learns where we are.
    if a.ud {
        qp.ud_to_init(UD_QKEY)?;
    } else {
        qp.to_init(softverbs::InitAttr {
            access: all_access(),
        })?;
    }
    let mut recv_posted = 0u32;
    for k in 0..rx_depth {
        post_recv(
            &qp,
            srq.as_ref(),
            k as u64,
            &[mr.sge(slot(k as u64), stride as u32)],
        )?;
        recv_posted += 1;
    }
    let psn = random_psn(qp.qpn().value());
    let connect = |remote: &QpInfo| -> Result<()> {
        if a.ud {
            qp.ud_to_rtr()?;
            qp.to_rts(softverbs::RtsAttr {
                sq_psn: psn,
                ..Default::default()
            })?;
            Ok(())
        } else {
            rtr_rts(&ctx, &qp, psn, remote, mtu)
        }
    };
    let local = QpInfo {
        lid: ctx.lid(),
        qpn: qp.qpn().value(),
        psn,
        rkey: 0,
        vaddr: 0,
        gid: ctx.gid(),
    };
    let remote = if server {
        let remote = QpInfo::from_pingpong(&ctrl.recv()?)?;
        connect(&remote)?;
        ctrl.send(&local.to_pingpong())?;
        remote
    } else {
        ctrl.send(&local.to_pingpong())?;
        let remote = QpInfo::from_pingpong(&ctrl.recv()?)?;
        connect(&remote)?;
        remote
    };
    for (what, i) in [("local address: ", &local), ("remote address:", &remote)] {
        println!(
            "  {what} LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
            i.lid, i.qpn, i.psn, i.gid
        );
    }

    let op = if a.ud {
        softverbs::AddressHandle::from_gid(remote.gid).send(
            softverbs::Qpn::new(remote.qpn),
            UD_QKEY,
            None,
        )
    } else {
        SendOp::Send
    };
    let mut wcs = [WorkCompletion::default(); 16];
    let mut sends_out = 0u32;
    let mut send_buf = vec![0u8; size];
    let mut recv_buf = vec![0u8; size];
    let start = Instant::now();
    for iter in 0..a.iters {
        if !server {
            send(
                a,
                &qp,
                &mr,
                &mut send_buf,
                iter,
                false,
                size,
                op,
                &mut sends_out,
            )?;
        }
        // Wait for the peer's message of this iteration.
        let mut spin = Spin::new();
        let got = loop {
            let n = cq.poll(&mut wcs);
            let mut got = None;
            for wc in &wcs[..n] {
                check_wc(wc)?;
                if wc.opcode == WcOpcode::Recv {
                    got = Some(*wc);
                } else {
                    sends_out -= 1;
                }
            }
            if let Some(wc) = got {
                break wc;
            }
            if n > 0 {
                spin.progress();
            } else {
                spin.idle("waiting for the peer's message")?;
            }
        };
        if got.byte_len as usize != size + grh {
            fail!(
                "message {iter}: received {} bytes, expected {size}",
                got.byte_len
            );
        }
        if a.validate {
            mr.read(slot(got.wr_id) + grh, &mut recv_buf);
            check_pattern(&recv_buf, iter, !server)?;
        }
        if recv_posted < a.iters {
            post_recv(
                &qp,
                srq.as_ref(),
                got.wr_id,
                &[mr.sge(slot(got.wr_id), stride as u32)],
            )?;
            recv_posted += 1;
        }
        if server {
            send(
                a,
                &qp,
                &mr,
                &mut send_buf,
                iter,
                true,
                size,
                op,
                &mut sends_out,
            )?;
        }
    }
    // Every send acknowledged.
    let mut spin = Spin::new();
    while sends_out > 0 {
        let n = cq.poll(&mut wcs);
        for wc in &wcs[..n] {
            check_wc(wc)?;
            sends_out -= 1;
        }
        if n > 0 {
            spin.progress();
        } else {
            spin.idle("waiting for the last acknowledgements")?;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    // Both ends finished: only now may either close its device.
    if server {
        ctrl.expect("done")?;
        ctrl.send("done")?;
    } else {
        ctrl.send("done")?;
        ctrl.expect("done")?;
    }
    let bytes = size as u64 * a.iters as u64 * 2;
    let secs = secs.max(1e-9);
    println!(
        "{bytes} bytes in {secs:.2} seconds = {:.2} Mbit/sec",
        bytes as f64 * 8.0 / secs / 1e6
    );
    println!(
        "{} iters in {secs:.2} seconds = {:.2} usec/iter",
        a.iters,
        secs * 1e6 / a.iters.max(1) as f64
    );
    if a.validate {
        println!("validated {} messages of {size} bytes", a.iters);
    }
    Ok(())
}

/// Posts a receive to the QP, or to its SRQ when it has one.
fn post_recv(
    qp: &softverbs::Qp,
    srq: Option<&softverbs::Srq>,
    wr_id: u64,
    sges: &[softverbs::Sge],
) -> Result<()> {
    match srq {
        Some(srq) => srq.post_recv(wr_id, sges)?,
        None => qp.post_recv(wr_id, sges)?,
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn send(
    a: &PingpongArgs,
    qp: &softverbs::Qp,
    mr: &softverbs::Mr<PageAligned>,
    buf: &mut [u8],
    iter: u32,
    from_server: bool,
    size: usize,
    op: SendOp,
    sends_out: &mut u32,
) -> Result<()> {
    if a.validate {
        fill_pattern(buf, iter, from_server);
        mr.write(0, buf);
    }
    let sges = [mr.sge(0, size as u32)];
    let wr = SendWr {
        flags: SendFlags::SIGNALED,
        ..SendWr::new(iter as u64, op, &sges)
    };
    qp.post_send(&wr)?;
    *sends_out += 1;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_differ_by_iteration_direction_and_position() {
        let a: Vec<u8> = (0..4096).map(|j| pattern_byte(1, j, false)).collect();
        let b: Vec<u8> = (0..4096).map(|j| pattern_byte(2, j, false)).collect();
        let c: Vec<u8> = (0..4096).map(|j| pattern_byte(1, j, true)).collect();
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert!(a.windows(2).filter(|w| w[0] == w[1]).count() < 100);
        assert!(check_pattern(&a, 1, false).is_ok());
        assert!(check_pattern(&a, 2, false).is_err());
    }
}
