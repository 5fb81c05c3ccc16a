//! RC ping-pong: two devices in one process bounce a message back and forth with
//! SEND/RECV, like `ibv_rc_pingpong`. Run with
//! `cargo run --release -p softverbs --example rc_pingpong -- [SIZE] [ITERS]`.

use softverbs::*;
use std::time::{Duration, Instant};

struct Side {
    ctx: Context,
    _pd: Pd,
    cq: Cq,
    qp: Qp,
    mr: Mr<Vec<u8>>,
}

fn side(size: usize) -> Result<Side, Box<dyn std::error::Error>> {
    let ctx = Device::with_config("softverbs0", Config::default()).open()?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(16, None)?;
    let qp = QpBuilder::new(&pd, &cq).build()?;
    let mr = pd.reg_mr(vec![0u8; size.max(1)], AccessFlags::LOCAL_WRITE)?;
    Ok(Side {
        ctx,
        _pd: pd,
        cq,
        qp,
        mr,
    })
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let size: usize = args.next().map_or(Ok(4096), |s| s.parse())?;
    let iters: u32 = args.next().map_or(Ok(1000), |s| s.parse())?;
    let (a, b) = (side(size)?, side(size)?);
    for (me, peer, psns) in [(&a, &b, (10, 20)), (&b, &a, (20, 10))] {
        me.qp.to_init(InitAttr {
            access: AccessFlags::EMPTY,
        })?;
        let remote = RemoteQp::from_gid(peer.ctx.gid(), peer.qp.qpn(), psns.1);
        me.qp.to_rtr(RtrAttr {
            remote,
            mtu: Mtu::Mtu4096,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
        })?;
        me.qp.to_rts(RtsAttr {
            sq_psn: psns.0,
            ..RtsAttr::default()
        })?;
    }
    let len = size as u32;
    let start = Instant::now();
    for i in 0..iters {
        // Ping: a -> b, then pong: b -> a.
        for (from, to) in [(&a, &b), (&b, &a)] {
            to.qp.post_recv(u64::from(i), &[to.mr.sge(0, len)])?;
            let sges = [from.mr.sge(0, len)];
            from.qp
                .post_send(&SendWr::new(u64::from(i), SendOp::Send, &sges))?;
            for cq in [&to.cq, &from.cq] {
                let wc = cq.wait_for(1, Duration::from_secs(10));
                if wc.first().map(|w| w.status) != Some(WcStatus::Success) {
                    return Err(format!("iteration {i}: {wc:?}").into());
                }
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let bytes = 2.0 * f64::from(iters) * size as f64;
    println!(
        "{} bytes in {secs:.2} seconds = {:.2} Mbit/sec",
        bytes as u64,
        bytes * 8.0 / secs / 1e6
    );
    println!(
        "{iters} iters in {secs:.2} seconds = {:.2} usec/iter",
        secs * 1e6 / f64::from(iters)
    );
    Ok(())
}
