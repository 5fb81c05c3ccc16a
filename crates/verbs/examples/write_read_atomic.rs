//! RDMA WRITE, READ and atomics between two devices in one process.
//!
//! The "server" side registers memory and does nothing else: its progress thread
//! executes the one-sided operations. Run with
//! `cargo run -p softverbs --example write_read_atomic`.

use softverbs::*;
use std::time::Duration;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let access = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    let open = || -> Result<_, Box<dyn std::error::Error>> {
        let ctx = Device::with_config("softverbs0", Config::default()).open()?;
        let pd = ctx.alloc_pd()?;
        let cq = ctx.create_cq(64, None)?;
        let qp = QpBuilder::new(&pd, &cq).build()?;
        let mr = pd.reg_mr(PageAligned::new(1 << 16), access)?;
        Ok((ctx, pd, cq, qp, mr))
    };
    let (client_ctx, _client_pd, client_cq, client_qp, client_mr) = open()?;
    let (server_ctx, _server_pd, _server_cq, server_qp, server_mr) = open()?;

    // Out of band, each side learns the other's GID, QPN and first PSN.
    for (qp, peer_ctx, peer_qp, (my_psn, peer_psn)) in [
        (&client_qp, &server_ctx, &server_qp, (1, 2)),
        (&server_qp, &client_ctx, &client_qp, (2, 1)),
    ] {
        qp.to_init(InitAttr { access })?;
        let remote = RemoteQp::from_gid(peer_ctx.gid(), peer_qp.qpn(), peer_psn);
        qp.to_rtr(RtrAttr {
            remote,
            mtu: Mtu::Mtu4096,
            max_dest_rd_atomic: 16,
            min_rnr_timer: 12,
        })?;
        qp.to_rts(RtsAttr {
            sq_psn: my_psn,
            ..RtsAttr::default()
        })?;
    }
    println!(
        "client {} qpn {}  ->  server {} qpn {}",
        client_ctx.gid(),
        client_qp.qpn(),
        server_ctx.gid(),
        server_qp.qpn()
    );

    let remote = |offset: u64| server_mr.addr() + offset;
    let rkey = Rkey(server_mr.rkey());
    let wait = |n: usize| -> Result<(), Box<dyn std::error::Error>> {
        for wc in client_cq.wait_for(n, Duration::from_secs(10)) {
            if wc.status != WcStatus::Success {
                return Err(format!("work request {} failed: {:?}", wc.wr_id, wc.status).into());
            }
        }
        Ok(())
    };

    // WRITE a greeting into the server's memory.
    let greeting = b"hello from the client, written by RDMA";
    client_mr.write(0, greeting);
    let sges = [client_mr.sge(0, greeting.len() as u32)];
    client_qp.post_send(&SendWr::new(
        1,
        SendOp::RdmaWrite {
            remote_addr: remote(0),
            rkey,
        },
        &sges,
    ))?;
    wait(1)?;
    let mut seen = vec![0u8; greeting.len()];
    server_mr.read(0, &mut seen);
    println!(
        "server memory now holds: {:?}",
        String::from_utf8_lossy(&seen)
    );

    // READ it back into another part of the client's buffer.
    let sges = [client_mr.sge(4096, greeting.len() as u32)];
    client_qp.post_send(&SendWr::new(
        2,
        SendOp::RdmaRead {
            remote_addr: remote(0),
            rkey,
        },
        &sges,
    ))?;
    wait(1)?;
    let mut back = vec![0u8; greeting.len()];
    client_mr.read(4096, &mut back);
    assert_eq!(&back, greeting);
    println!("read back: {:?}", String::from_utf8_lossy(&back));

    // Atomics on a counter in the server's memory.
    server_mr.write(8192, &100u64.to_ne_bytes());
    let result = [client_mr.sge(8192, 8)];
    client_qp.post_send(&SendWr::new(
        3,
        SendOp::AtomicFetchAdd {
            remote_addr: remote(8192),
            rkey,
            add: 5,
        },
        &result,
    ))?;
    wait(1)?;
    let mut old = [0u8; 8];
    client_mr.read(8192, &mut old);
    println!("fetch_add(5): old value {}", u64::from_ne_bytes(old));
    let op = SendOp::AtomicCmpSwap {
        remote_addr: remote(8192),
        rkey,
        compare: 105,
        swap: 7,
    };
    client_qp.post_send(&SendWr::new(4, op, &result))?;
    wait(1)?;
    client_mr.read(8192, &mut old);
    let mut now = [0u8; 8];
    server_mr.read(8192, &mut now);
    println!(
        "cmp_swap(105 -> 7): old value {}, counter now {}",
        u64::from_ne_bytes(old),
        u64::from_ne_bytes(now)
    );
    assert_eq!(u64::from_ne_bytes(now), 7);
    Ok(())
}
