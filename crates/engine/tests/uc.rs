//! UC queue pairs (IBA 9.8): no acknowledgements; a lost packet drops the
//! message it belongs to, silently, and the next message is received normally.

mod common;
use common::*;
use softverbs_engine::*;
use softverbs_sim::Faults;

fn uc_opts(mtu: Mtu) -> PairOpts {
    PairOpts {
        qp_type: QpType::Uc,
        mtu,
        qp_access: AccessFlags::REMOTE_WRITE,
        buf_len: 1 << 20,
        cap: QpCap {
            max_send_wr: 128,
            max_recv_wr: 128,
            max_send_sge: 2,
            max_recv_sge: 2,
            max_inline_data: 64,
        },
        sq_sig_all: true,
        ..PairOpts::default()
    }
}

/// Message `k` of `len` bytes: its index in the first 4 bytes, then a pattern.
fn message(k: u32, len: usize) -> Vec<u8> {
    let mut m: Vec<u8> = (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).wrapping_add(k) as u8)
        .collect();
    m[..4].copy_from_slice(&k.to_le_bytes());
    m
}

#[test]
fn send_and_write_without_acks() {
    let mut p = Pair::new(1, Faults::none(), uc_opts(Mtu::Mtu1024));
    let m = message(7, 5000);
    p.side_mut(End::A).buf[..5000].copy_from_slice(&m);
    let rsge = p.sge(End::B, 0, 8192);
    p.post_recv(End::B, 1, &[rsge]).unwrap();
    p.post_recv(End::B, 2, &[rsge]).unwrap();
    let sge = p.sge(End::A, 0, 5000);
    p.post_send(End::A, &SendWr::new(10, SendOp::Send, &[sge]))
        .unwrap();
    let (remote_addr, rkey) = (p.addr(End::B, 100_000), p.rkey(End::B));
    p.post_send(
        End::A,
        &SendWr::new(11, SendOp::RdmaWrite { remote_addr, rkey }, &[sge]),
    )
    .unwrap();
    let op = SendOp::RdmaWriteWithImm {
        remote_addr: p.addr(End::B, 200_000),
        rkey,
        imm: 0xabcd,
    };
    p.post_send(End::A, &SendWr::new(12, op, &[sge])).unwrap();
    p.settle();
    let s = p.poll_send(End::A);
    assert_eq!(
        s.iter()
            .map(|w| (w.wr_id, w.status, w.opcode))
            .collect::<Vec<_>>(),
        vec![
            (10, WcStatus::Success, WcOpcode::Send),
            (11, WcStatus::Success, WcOpcode::RdmaWrite),
            (12, WcStatus::Success, WcOpcode::RdmaWrite)
        ]
    );
    let r = p.poll_recv(End::B);
    assert_eq!(r.len(), 2);
    assert_eq!(
        (r[0].wr_id, r[0].opcode, r[0].byte_len),
        (1, WcOpcode::Recv, 5000)
    );
    assert_eq!(
        (r[1].wr_id, r[1].opcode, r[1].imm_data),
        (2, WcOpcode::RecvRdmaWithImm, Some(0xabcd))
    );
    assert_eq!(p.bytes(End::B, 0, 5000), &m[..]);
    assert_eq!(p.bytes(End::B, 100_000, 5000), &m[..]);
    assert_eq!(p.bytes(End::B, 200_000, 5000), &m[..]);
    // The responder never sent a packet: UC has no ACK.
    assert_eq!(p.engine(End::B).counters().tx_packets, 0);
    assert_eq!(p.engine(End::A).counters().rx_packets, 0);
}

#[test]
fn a_lost_packet_drops_its_message_and_the_next_one_arrives() {
    for seed in [1u64, 2, 3, 4] {
        let mut p = Pair::new(seed, Faults::lossy(0.1), uc_opts(Mtu::Mtu1024));
        const N: u32 = 60;
        const LEN: usize = 2500; // 3 packets per message
        for k in 0..N {
            let m = message(k, LEN);
            p.side_mut(End::A).buf[k as usize * 4096..][..LEN].copy_from_slice(&m);
        }
        for k in 0..N {
            let rsge = p.sge(End::B, k as usize * 4096, 4096);
            p.post_recv(End::B, u64::from(k), &[rsge]).unwrap();
        }
        for k in 0..N {
            let sge = p.sge(End::A, k as usize * 4096, LEN as u32);
            p.post_send(End::A, &SendWr::new(u64::from(k), SendOp::Send, &[sge]))
                .unwrap();
        }
        p.settle();
        // The sender completes every WR successfully: it cannot know of losses.
        let s = p.poll_send(End::A);
        assert_eq!(s.len(), N as usize);
        assert!(s
            .iter()
            .enumerate()
            .all(|(i, w)| w.wr_id == i as u64 && w.status == WcStatus::Success));
        // Every message received is whole and in order; a lost one leaves no trace
        // and does not use up a receive WQE.
        let r = p.poll_recv(End::B);
        assert!(
            !r.is_empty() && r.len() < N as usize,
            "seed {seed}: some lost, some received ({})",
            r.len()
        );
        let mut last = None;
        for (i, wc) in r.iter().enumerate() {
            assert_eq!(
                (wc.wr_id, wc.status, wc.byte_len),
                (i as u64, WcStatus::Success, LEN as u32),
                "seed {seed}"
            );
            let got = p.bytes(End::B, i * 4096, LEN).to_vec();
            let k = u32::from_le_bytes(got[..4].try_into().unwrap());
            assert_eq!(got, message(k, LEN), "seed {seed}: message {k} intact");
            assert!(last.is_none_or(|l| k > l), "seed {seed}: in order");
            last = Some(k);
        }
        assert!(p.engine(End::B).counters().drop_out_of_sequence > 0);
        // The receives not used are still posted: moving to ERR flushes exactly them.
        let qp = p.side(End::B).qp;
        p.engine(End::B)
            .modify_qp(
                qp,
                &QpAttr {
                    qp_state: QpState::Err,
                    ..QpAttr::default()
                },
                QpAttrMask::STATE,
                Instant::ZERO,
            )
            .unwrap();
        let flushed = p.poll_recv(End::B);
        assert_eq!(flushed.len() + r.len(), N as usize);
        assert!(flushed.iter().all(|w| w.status == WcStatus::WrFlushErr));
    }
}

#[test]
fn write_with_immediate_completes_only_for_whole_messages() {
    let mut p = Pair::new(9, Faults::lossy(0.15), uc_opts(Mtu::Mtu256));
    const N: u32 = 40;
    const LEN: usize = 1000; // 4 packets
    for k in 0..N {
        let m = message(k, LEN);
        p.side_mut(End::A).buf[k as usize * 1024..][..LEN].copy_from_slice(&m);
        let rsge = p.sge(End::B, 0, 0);
        p.post_recv(End::B, u64::from(k), &[rsge]).unwrap();
    }
    let rkey = p.rkey(End::B);
    for k in 0..N {
        let sge = p.sge(End::A, k as usize * 1024, LEN as u32);
        let op = SendOp::RdmaWriteWithImm {
            remote_addr: p.addr(End::B, 500_000 + k as usize * 1024),
            rkey,
            imm: k,
        };
        p.post_send(End::A, &SendWr::new(u64::from(k), op, &[sge]))
            .unwrap();
    }
    p.settle();
    assert_eq!(p.poll_send(End::A).len(), N as usize);
    let r = p.poll_recv(End::B);
    assert!(!r.is_empty() && r.len() < N as usize, "{}", r.len());
    for wc in &r {
        let k = wc.imm_data.unwrap();
        assert_eq!(
            (wc.opcode, wc.byte_len),
            (WcOpcode::RecvRdmaWithImm, LEN as u32)
        );
        assert_eq!(
            p.bytes(End::B, 500_000 + k as usize * 1024, LEN),
            &message(k, LEN)[..],
            "message {k} whole"
        );
    }
}

#[test]
fn read_and_atomics_are_not_uc_operations() {
    let mut p = Pair::new(1, Faults::none(), uc_opts(Mtu::Mtu1024));
    let (remote_addr, rkey) = (p.addr(End::B, 0), p.rkey(End::B));
    let sge = p.sge(End::A, 0, 8);
    for op in [
        SendOp::RdmaRead { remote_addr, rkey },
        SendOp::AtomicFetchAdd {
            remote_addr,
            rkey,
            add: 1,
        },
        SendOp::AtomicCmpSwap {
            remote_addr,
            rkey,
            compare: 0,
            swap: 1,
        },
    ] {
        assert_eq!(
            p.post_send(End::A, &SendWr::new(1, op, &[sge])),
            Err(PostError::InvalidOpcode)
        );
    }
    p.settle();
    assert!(p.poll_send(End::A).is_empty());
}

#[test]
fn responder_errors_drop_the_message_silently() {
    let mut p = Pair::new(1, Faults::none(), uc_opts(Mtu::Mtu1024));
    p.fill(End::B, 0, 4096, 3);
    let before = p.bytes(End::B, 0, 4096).to_vec();
    let sge = p.sge(End::A, 0, 100);
    // No receive posted: no RNR on UC, the message is just dropped.
    p.post_send(End::A, &SendWr::new(1, SendOp::Send, &[sge]))
        .unwrap();
    // A WRITE with a bad rkey: dropped, nothing written, no NAK.
    let bad = Rkey(p.rkey(End::B).0 ^ 0x100);
    p.post_send(
        End::A,
        &SendWr::new(
            2,
            SendOp::RdmaWrite {
                remote_addr: p.addr(End::B, 0),
                rkey: bad,
            },
            &[sge],
        ),
    )
    .unwrap();
    p.settle();
    assert_eq!(
        p.poll_send(End::A)
            .iter()
            .map(|w| w.status)
            .collect::<Vec<_>>(),
        vec![WcStatus::Success; 2]
    );
    let c = p.engine(End::B).counters();
    assert_eq!(
        (
            c.uc_messages_dropped,
            c.tx_packets,
            c.nak_error_sent,
            c.rnr_nak_sent
        ),
        (2, 0, 0, 0)
    );
    assert_eq!(p.bytes(End::B, 0, 4096), &before[..]);
    assert_eq!(p.qp_state(End::B), QpState::Rts);
    // The next message is received normally.
    let rsge = p.sge(End::B, 8192, 200);
    p.post_recv(End::B, 9, &[rsge]).unwrap();
    p.post_send(End::A, &SendWr::new(3, SendOp::Send, &[sge]))
        .unwrap();
    p.settle();
    assert_eq!(
        p.poll_recv(End::B)
            .iter()
            .map(|w| (w.wr_id, w.byte_len))
            .collect::<Vec<_>>(),
        vec![(9, 100)]
    );
}

#[test]
fn a_local_error_stops_only_the_send_queue() {
    let mut p = Pair::new(1, Faults::none(), uc_opts(Mtu::Mtu1024));
    let good = p.sge(End::A, 0, 64);
    let bad = Sge {
        lkey: good.lkey ^ 0x100,
        ..good
    };
    p.post_send(End::A, &SendWr::new(1, SendOp::Send, &[bad]))
        .unwrap();
    p.post_send(End::A, &SendWr::new(2, SendOp::Send, &[good]))
        .unwrap();
    p.settle();
    let s = p.poll_send(End::A);
    assert_eq!(
        s.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(1, WcStatus::LocProtErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(p.qp_state(End::A), QpState::Sqe);
    // Posting in SQE flushes at once.
    p.post_send(End::A, &SendWr::new(3, SendOp::Send, &[good]))
        .unwrap();
    assert_eq!(p.poll_send(End::A)[0].status, WcStatus::WrFlushErr);
    // The receive side still works in SQE.
    let rsge = p.sge(End::A, 4096, 64);
    p.post_recv(End::A, 7, &[rsge]).unwrap();
    let bsge = p.sge(End::B, 0, 64);
    p.post_send(End::B, &SendWr::new(1, SendOp::Send, &[bsge]))
        .unwrap();
    p.settle();
    assert_eq!(
        p.poll_recv(End::A)
            .iter()
            .map(|w| (w.wr_id, w.status))
            .collect::<Vec<_>>(),
        vec![(7, WcStatus::Success)]
    );
    // SQE -> RTS recovers the send queue (IBA 10.3.1).
    let qp = p.side(End::A).qp;
    p.engine(End::A)
        .modify_qp(
            qp,
            &QpAttr {
                qp_state: QpState::Rts,
                ..QpAttr::default()
            },
            QpAttrMask::STATE,
            Instant::ZERO,
        )
        .unwrap();
    let rsge = p.sge(End::B, 4096, 64);
    p.post_recv(End::B, 8, &[rsge]).unwrap();
    p.post_send(End::A, &SendWr::new(4, SendOp::Send, &[good]))
        .unwrap();
    p.settle();
    assert_eq!(p.poll_send(End::A)[0].status, WcStatus::Success);
    assert_eq!(p.poll_recv(End::B)[0].wr_id, 8);
}
