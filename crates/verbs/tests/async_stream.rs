//! Completions as an async stream (feature `tokio`).
#![cfg(feature = "tokio")]

use futures_core::Stream;
use softverbs::*;
use std::future::poll_fn;
use std::pin::Pin;
use std::time::Duration;

async fn next(s: &mut CompletionStream) -> Option<WorkCompletion> {
    poll_fn(|cx| Pin::new(&mut *s).poll_next(cx)).await
}

#[tokio::test(flavor = "current_thread")]
async fn receives_arrive_as_a_stream() {
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let a_ctx = Device::with_config("a", Config::default()).open().unwrap();
    let b_ctx = Device::with_config("b", Config::default()).open().unwrap();
    let (a_pd, b_pd) = (a_ctx.alloc_pd().unwrap(), b_ctx.alloc_pd().unwrap());
    let a_cq = a_ctx.create_cq(64, None).unwrap();
    let mut stream = b_ctx.create_cq_stream(64).unwrap();
    let a_qp = QpBuilder::new(&a_pd, &a_cq).build().unwrap();
    let b_qp = QpBuilder::new(&b_pd, stream.cq()).build().unwrap();
    let a_mr = a_pd.reg_mr(vec![7u8; 4096], access).unwrap();
    let b_mr = b_pd.reg_mr(vec![0u8; 4096], access).unwrap();
    for (qp, peer_ctx, peer_qp) in [(&a_qp, &b_ctx, &b_qp), (&b_qp, &a_ctx, &a_qp)] {
        qp.to_init(InitAttr { access }).unwrap();
        let remote = RemoteQp::from_gid(peer_ctx.gid(), peer_qp.qpn(), 0);
        qp.to_rtr(RtrAttr {
            remote,
            mtu: Mtu::Mtu1024,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 1,
        })
        .unwrap();
        qp.to_rts(RtsAttr::default()).unwrap();
    }
    for i in 0..5 {
        b_qp.post_recv(i, &[b_mr.sge(0, 4096)]).unwrap();
    }
    // Sends arrive later, from another thread, while the task awaits.
    let sender = std::thread::spawn(move || {
        for i in 0..5u64 {
            std::thread::sleep(Duration::from_millis(10));
            let sges = [a_mr.sge(0, 100 + i as u32)];
            a_qp.post_send(&SendWr::new(i, SendOp::Send, &sges))
                .unwrap();
        }
        std::thread::sleep(Duration::from_millis(200));
    });
    for i in 0..5u64 {
        let wc = tokio::time::timeout(Duration::from_secs(10), next(&mut stream))
            .await
            .expect("in time")
            .unwrap();
        assert_eq!(
            (wc.wr_id, wc.status, wc.byte_len),
            (i, WcStatus::Success, 100 + i as u32)
        );
    }
    sender.join().unwrap();
}
