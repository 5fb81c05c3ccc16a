mod common;
use common::*;
use softverbs_engine::*;

#[test]
fn send_and_write_and_read() {
    let mut p = Pair::lossless();
    p.fill(End::A, 0, 5000, 7);
    let rsge = p.sge(End::B, 0, 8192);
    p.post_recv(End::B, 1, &[rsge]).unwrap();
    let sge = p.sge(End::A, 0, 5000);
    p.post_send(End::A, &SendWr::new(10, SendOp::Send, &[sge]))
        .unwrap();
    p.run_until_cqes(End::B, 0, 1).unwrap();
    p.run_until_send_cqes(End::A, 1).unwrap();
    let r = p.poll_recv(End::B);
    assert_eq!(r[0].status, WcStatus::Success);
    assert_eq!(r[0].byte_len, 5000);
    assert_eq!(p.bytes(End::A, 0, 5000), p.bytes(End::B, 0, 5000));
    let s = p.poll_send(End::A);
    assert_eq!((s[0].wr_id, s[0].status), (10, WcStatus::Success));

    // RDMA WRITE then READ back.
    p.fill(End::A, 10000, 3000, 9);
    let sge = p.sge(End::A, 10000, 3000);
    let remote_addr = p.addr(End::B, 20000);
    let rkey = p.rkey(End::B);
    p.post_send(
        End::A,
        &SendWr::new(11, SendOp::RdmaWrite { remote_addr, rkey }, &[sge]),
    )
    .unwrap();
    let sge = p.sge(End::A, 30000, 3000);
    p.post_send(
        End::A,
        &SendWr::new(12, SendOp::RdmaRead { remote_addr, rkey }, &[sge]),
    )
    .unwrap();
    p.run_until_send_cqes(End::A, 2).unwrap();
    let s = p.poll_send(End::A);
    assert_eq!(
        s.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(11, WcStatus::Success), (12, WcStatus::Success)]
    );
    assert_eq!(p.bytes(End::B, 20000, 3000), p.bytes(End::A, 10000, 3000));
    assert_eq!(p.bytes(End::A, 30000, 3000), p.bytes(End::A, 10000, 3000));
}
