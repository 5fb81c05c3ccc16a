mod common;
use common::*;
use softverbs_engine::*;
use softverbs_sim::Faults;

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

/// The device offers 64 READs or atomics in flight per QP (`EngineConfig::max_qp_rd_atom`,
/// what `ibv_query_device` reports and perftest's ib_read_bw takes as its outstanding
/// count), and a requester given that many keeps them all in flight: 64 one-packet READs
/// leave before the first response can come back, and all complete with the right bytes.
/// With 16 (the value before session 16), 4 KiB READs waited a round trip per 16; over
/// loopback ib_read_bw at 4 KiB then ran at 538-619 MB/s against 882-1098 with 64.
#[test]
fn sixty_four_one_packet_reads_are_in_flight_at_once() {
    const READS: usize = 64;
    const LEN: usize = 1024;
    let config = EngineConfig::new(ADDR_A.parse().unwrap());
    assert_eq!(config.max_qp_rd_atom, READS as u8);
    let opts = PairOpts {
        buf_len: 2 * READS * LEN,
        cap: QpCap {
            max_send_wr: 2 * READS as u32,
            ..PairOpts::default().cap
        },
        max_rd_atomic: READS as u8,
        max_dest_rd_atomic: READS as u8,
        sq_sig_all: true,
        ..PairOpts::default()
    };
    let faults = Faults {
        delay: std::time::Duration::from_millis(1),
        ..Faults::none()
    };
    let mut p = Pair::new(3, faults, opts);
    p.fill(End::B, 0, READS * LEN, 9);
    let rkey = p.rkey(End::B);
    for i in 0..READS {
        let remote_addr = p.addr(End::B, i * LEN);
        let sge = p.sge(End::A, (READS + i) * LEN, LEN as u32);
        p.post_send(
            End::A,
            &SendWr::new(i as u64, SendOp::RdmaRead { remote_addr, rkey }, &[sge]),
        )
        .unwrap();
    }
    // Half a round trip: the requests are out, no response is back.
    p.sim
        .run_for(std::time::Duration::from_micros(1500), limits())
        .unwrap();
    assert_eq!(p.engine(End::A).counters().rx_packets, 0);
    assert_eq!(
        p.engine(End::A).counters().tx_packets,
        READS as u64,
        "every READ request left at once"
    );
    p.run_until_send_cqes(End::A, READS).unwrap();
    assert!(p
        .poll_send(End::A)
        .iter()
        .all(|w| w.status == WcStatus::Success));
    assert_eq!(
        p.bytes(End::A, READS * LEN, READS * LEN),
        p.bytes(End::B, 0, READS * LEN)
    );
}
