//! `softverbs pingpong --cm`: the RC ping-pong with the QPs connected through the connection
//! manager instead of a TCP exchange of QP numbers (as perftest's `-R`): the server listens
//! at rdma_cm port `--port` (TCP port space), the client connects to HOST:PORT, then ITERS
//! SEND/RECV exchanges of SIZE bytes, every byte checked with `--validate`; the client
//! disconnects.

use crate::conn::check_wc;
use crate::pingpong::{check_pattern, fill_pattern};
use crate::{fail, PingpongArgs, Result};
use softverbs::cm::{ConnParam, RcConnection, RcListener, RcOptions};
use softverbs::{
    AccessFlags, Config, Cq, Device, PageAligned, QpCap, SendOp, SendWr, WorkCompletion,
};
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

const STEP: Duration = Duration::from_secs(30);

/// Waits for the completion of work request `want` (1: the send, 2: the receive); one
/// of the other kind that comes first is remembered in `early`.
fn wait(cq: &Cq, want: u64, early: &mut [bool; 3]) -> Result<()> {
    let mut wc = [WorkCompletion::default(); 1];
    let end = Instant::now() + STEP;
    loop {
        if std::mem::take(&mut early[want as usize]) {
            return Ok(());
        }
        if cq.poll(&mut wc) == 1 {
            check_wc(&wc[0])?;
            if wc[0].wr_id == want {
                return Ok(());
            }
            early[(wc[0].wr_id as usize).min(2)] = true;
            continue;
        }
        if Instant::now() > end {
            fail!("no completion within {STEP:?}");
        }
        std::hint::spin_loop();
    }
}

pub fn run(a: &PingpongArgs) -> Result<()> {
    if a.ud || a.uc || a.srq {
        fail!("--cm connects RC QPs (the TCP port space)");
    }
    let size = a.size.unwrap_or(4096) as usize;
    if size == 0 {
        fail!("the message size must be at least 1 byte");
    }
    let ctx = Device::with_config("softverbs0", Config::from_env()?).open()?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(16, None)?;
    let mr = pd.reg_mr(PageAligned::new(2 * size), AccessFlags::LOCAL_WRITE)?;
    let opts = RcOptions {
        cap: QpCap {
            max_send_wr: 2,
            max_recv_wr: 2,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        param: Some(ConnParam {
            responder_resources: 0,
            initiator_depth: 0,
            retry_count: 7,
            rnr_retry_count: 7,
            ..ConnParam::default()
        }),
        timeout: STEP,
    };
    let server = a.server || a.host.is_none();
    let (tx, rx) = (0usize, size);
    // A receive is always posted before the peer can send, the first before the REQ or
    // REP goes out (else the SEND would wait out an RNR NAK timer).
    let first_recv = |qp: &softverbs::Qp| qp.post_recv(2, &[mr.sge(rx, size as u32)]);
    let conn: RcConnection = if server {
        let listener = RcListener::bind(&ctx, SocketAddr::from(([0, 0, 0, 0], a.port)), 1)?;
        eprintln!("waiting for a client on rdma_cm port {}", a.port);
        let (id, data) = listener.get_request(Duration::from_secs(3600))?;
        softverbs::cm::accept_request_with(id, data, &pd, &cq, &opts, first_recv)?
    } else {
        let host = a.host.as_deref().unwrap_or("127.0.0.1");
        let Some(dst) = (host, a.port).to_socket_addrs()?.next() else {
            fail!("{host} has no address");
        };
        softverbs::cm::connect_rc_with(&pd, &cq, dst, &opts, first_recv)?
    };
    let qp = &conn.qp;
    let mut buf = vec![0u8; size];
    let start = Instant::now();
    let mut early = [false; 3];
    for iter in 0..a.iters {
        if !server {
            send(a, &mr, qp, &cq, &mut buf, iter, false, tx, &mut early)?;
        }
        wait(&cq, 2, &mut early)?;
        if a.validate {
            mr.read(rx, &mut buf);
            check_pattern(&buf, iter, !server)?;
        }
        if iter + 1 < a.iters {
            qp.post_recv(2, &[mr.sge(rx, size as u32)])?;
        }
        if server {
            send(a, &mr, qp, &cq, &mut buf, iter, true, tx, &mut early)?;
        }
    }
    let took = start.elapsed();
    if !server {
        let bytes = 2 * size as u64 * u64::from(a.iters);
        println!(
            "{bytes} bytes in {:.2} seconds = {:.2} Mbit/sec",
            took.as_secs_f64(),
            bytes as f64 * 8.0 / took.as_secs_f64() / 1e6
        );
        println!(
            "{} iters in {:.2} seconds = {:.2} usec/iter",
            a.iters,
            took.as_secs_f64(),
            took.as_secs_f64() * 1e6 / f64::from(a.iters.max(1))
        );
        conn.disconnect(STEP)?;
    } else {
        conn.wait_disconnected(STEP)?;
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn send(
    a: &PingpongArgs,
    mr: &softverbs::Mr<PageAligned>,
    qp: &softverbs::Qp,
    cq: &Cq,
    buf: &mut [u8],
    iter: u32,
    from_server: bool,
    at: usize,
    early: &mut [bool; 3],
) -> Result<()> {
    if a.validate {
        fill_pattern(buf, iter, from_server);
        mr.write(at, buf);
    }
    let sge = [mr.sge(at, buf.len() as u32)];
    qp.post_send(&SendWr::new(1, SendOp::Send, &sge))?;
    wait(cq, 1, early)
}
