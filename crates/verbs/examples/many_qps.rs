//! Memory of one context holding many connected RC QPs (default 1024), for the
//! benchmark script: prints resident memory before and after, from /proc.
//! `cargo run --release -p softverbs --example many_qps -- [N]`

use softverbs::*;

fn rss_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: usize = std::env::args().nth(1).map_or(Ok(1024), |s| s.parse())?;
    let before = rss_kib("VmRSS:");
    let a = Device::with_config("a", Config::default()).open()?;
    let b = Device::with_config("b", Config::default()).open()?;
    let (pa, pb) = (a.alloc_pd()?, b.alloc_pd()?);
    let (ca, cb) = (a.create_cq(4096, None)?, b.create_cq(4096, None)?);
    // perftest-like queue sizes: 128 send, 512 receive, 1 SGE, no inline.
    let cap = QpCap {
        max_send_wr: 128,
        max_recv_wr: 512,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let opened = rss_kib("VmRSS:");
    let mut qps = Vec::with_capacity(n);
    for _ in 0..n {
        let qa = QpBuilder::new(&pa, &ca).cap(cap).build()?;
        let qb = QpBuilder::new(&pb, &cb).cap(cap).build()?;
        for (me, peer_ctx, peer) in [(&qa, &b, &qb), (&qb, &a, &qa)] {
            me.to_init(InitAttr {
                access: AccessFlags::REMOTE_WRITE,
            })?;
            let remote = RemoteQp::from_gid(peer_ctx.gid(), peer.qpn(), 0);
            me.to_rtr(RtrAttr {
                remote,
                mtu: Mtu::Mtu4096,
                max_dest_rd_atomic: 16,
                min_rnr_timer: 12,
            })?;
            me.to_rts(RtsAttr::default())?;
        }
        qps.push((qa, qb));
    }
    let after = rss_kib("VmRSS:");
    // Both contexts live in this process: each holds n QPs, so halve the growth.
    let per_context_kib = (after - opened) / 2;
    println!("qps_per_context={n}");
    println!("rss_before_open_kib={before}");
    println!("rss_contexts_open_kib={opened}");
    println!("rss_with_qps_kib={after}");
    println!("per_context_for_{n}_qps_kib={per_context_kib}");
    println!("per_qp_bytes={}", per_context_kib * 1024 / n as u64);
    Ok(())
}
