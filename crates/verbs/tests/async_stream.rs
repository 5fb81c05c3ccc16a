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

/// CM events as a tokio stream: a listener's channel yields the connect request.
#[tokio::test(flavor = "current_thread")]
async fn cm_events_arrive_as_a_stream() {
    use softverbs::cm::{CmEventKind, CmId, EventChannel, PortSpace};
    let server = Device::with_config("stream-s", Config::default())
        .open()
        .unwrap();
    let channel = EventChannel::new(&server).unwrap();
    let listener = CmId::new(&channel, PortSpace::Tcp).unwrap();
    listener.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    listener.listen(1).unwrap();
    let at = listener.local_addr().unwrap();
    let mut stream = channel.stream().unwrap();
    let client = Device::with_config("stream-c", Config::default())
        .open()
        .unwrap();
    let cch = EventChannel::new(&client).unwrap();
    let id = CmId::new(&cch, PortSpace::Tcp).unwrap();
    id.resolve_addr(None, at, std::time::Duration::from_secs(5))
        .unwrap();
    let mut cstream = cch.stream().unwrap();
    let ev = poll_fn(|cx| Pin::new(&mut cstream).poll_next(cx))
        .await
        .unwrap();
    assert_eq!(ev.kind(), CmEventKind::AddrResolved);
    id.resolve_route().unwrap();
    let ev = poll_fn(|cx| Pin::new(&mut cstream).poll_next(cx))
        .await
        .unwrap();
    assert_eq!(ev.kind(), CmEventKind::RouteResolved);
    id.connect(None).unwrap();
    let mut ev = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        poll_fn(|cx| Pin::new(&mut stream).poll_next(cx)),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(ev.kind(), CmEventKind::ConnectRequest);
    let request = ev.take_request().unwrap();
    request.reject(b"no").unwrap();
    let ev = poll_fn(|cx| Pin::new(&mut cstream).poll_next(cx))
        .await
        .unwrap();
    assert_eq!(ev.kind(), CmEventKind::Rejected);
}
