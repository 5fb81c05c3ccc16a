//! The same-host path's engine share (`engine/placed.rs`): WRITEs and READs whose
//! bytes the driver moved before posting them. Here the test plays the driver: it
//! copies the bytes between the two engines' buffers itself, then posts placed.

mod common;
use common::*;
use softverbs_engine::*;

fn same_host(p: &mut Pair) {
    for end in [End::A, End::B] {
        let qp = p.side(end).qp;
        p.engine(end).set_same_host(qp, true).unwrap();
    }
}

/// What the driver does for a WRITE: gather A's bytes, put them at B.
fn place_write(p: &mut Pair, wr: &SendWr<'_>, b_offset: usize) {
    let qp = p.a.qp;
    let mut bytes = Vec::new();
    assert!(p.engine(End::A).gather_for_placement(qp, wr, &mut bytes));
    p.b.buf[b_offset..b_offset + bytes.len()].copy_from_slice(&bytes);
}

#[test]
fn placed_write_with_imm_is_one_packet_and_completes_at_the_target_with_its_length() {
    let mut p = Pair::lossless();
    same_host(&mut p);
    let qp = p.a.qp;
    assert!(p.engine(End::A).placement_ready(qp));
    p.fill(End::A, 0, 40_000, 3);
    p.post_recv(End::B, 7, &[]).unwrap();
    let sge = p.sge(End::A, 0, 40_000);
    let (remote_addr, rkey) = (p.addr(End::B, 1000), p.rkey(End::B));
    let wr = SendWr::new(
        1,
        SendOp::RdmaWriteWithImm {
            remote_addr,
            rkey,
            imm: 0x1234_5678,
        },
        std::slice::from_ref(&sge),
    );
    place_write(&mut p, &wr, 1000);
    let before = p.sim.stats().delivered;
    p.engine(End::A).post_send_placed(qp, &wr).unwrap();
    p.run_until_cqes(End::B, 0, 1).unwrap();
    p.run_until_send_cqes(End::A, 1).unwrap();
    // One request and one ACK, not 40 packets of 1 KiB.
    assert_eq!(p.sim.stats().delivered - before, 2);
    let r = p.poll_recv(End::B);
    assert_eq!(r[0].status, WcStatus::Success);
    assert_eq!(r[0].opcode, WcOpcode::RecvRdmaWithImm);
    assert_eq!(r[0].byte_len, 40_000);
    assert_eq!(p.poll_send(End::A)[0].status, WcStatus::Success);
    assert_eq!(p.bytes(End::A, 0, 40_000), p.bytes(End::B, 1000, 40_000));
}

/// What the driver does for a READ: find where it lands at A, put B's bytes there.
fn place_read(p: &mut Pair, wr: &SendWr<'_>, b_offset: usize) {
    let qp = p.a.qp;
    let mut sinks = Vec::new();
    assert!(p.engine(End::A).placement_sink(qp, wr, &mut sinks));
    let base = p.addr(End::A, 0);
    let mut from = b_offset;
    for (addr, len) in sinks {
        let at = (addr - base) as usize;
        let bytes = p.bytes(End::B, from, len).to_vec();
        p.a.buf[at..at + len].copy_from_slice(&bytes);
        from += len;
    }
}

#[test]
fn placed_read_lands_its_bytes_and_completes() {
    let mut p = Pair::lossless();
    same_host(&mut p);
    p.fill(End::B, 0, 9000, 5);
    let data = p.bytes(End::B, 0, 9000).to_vec();
    // Two SGEs: the bytes land straight in both pieces, in order.
    let sges = [p.sge(End::A, 100, 5000), p.sge(End::A, 20_000, 4000)];
    let (remote_addr, rkey) = (p.addr(End::B, 0), p.rkey(End::B));
    let wr = SendWr::new(2, SendOp::RdmaRead { remote_addr, rkey }, &sges);
    let qp = p.a.qp;
    let mut sinks = Vec::new();
    assert!(p.engine(End::A).placement_sink(qp, &wr, &mut sinks));
    assert_eq!(
        sinks,
        vec![(p.addr(End::A, 100), 5000), (p.addr(End::A, 20_000), 4000)]
    );
    place_read(&mut p, &wr, 0);
    let before = p.sim.stats().delivered;
    p.engine(End::A).post_send_placed(qp, &wr).unwrap();
    p.run_until_send_cqes(End::A, 1).unwrap();
    // Carried out locally: nothing went on the wire.
    assert_eq!(p.sim.stats().delivered, before);
    let s = p.poll_send(End::A);
    assert_eq!((s[0].status, s[0].byte_len), (WcStatus::Success, 9000));
    assert_eq!(p.bytes(End::A, 100, 5000), &data[..5000]);
    assert_eq!(p.bytes(End::A, 20_000, 4000), &data[5000..]);
}

#[test]
fn a_placed_read_lands_only_where_local_writes_are_allowed() {
    // A READ's local SGEs need LOCAL_WRITE: without it (or with a bad
    // key) the driver gets no place to put the bytes, and the UDP path reports it.
    let opts = PairOpts {
        mr_access: AccessFlags::REMOTE_READ,
        ..PairOpts::default()
    };
    let mut p = Pair::new(1, softverbs_sim::Faults::none(), opts);
    same_host(&mut p);
    let qp = p.a.qp;
    let (remote_addr, rkey) = (p.addr(End::B, 0), p.rkey(End::B));
    let sge = p.sge(End::A, 0, 64);
    let wr = SendWr::new(
        1,
        SendOp::RdmaRead { remote_addr, rkey },
        std::slice::from_ref(&sge),
    );
    let mut sinks = vec![(1, 1)];
    assert!(!p.engine(End::A).placement_sink(qp, &wr, &mut sinks));
    assert!(sinks.is_empty());
    let mut bad = sge;
    bad.lkey ^= 0x100;
    let wr = SendWr::new(
        1,
        SendOp::RdmaRead { remote_addr, rkey },
        std::slice::from_ref(&bad),
    );
    assert!(!p.engine(End::A).placement_sink(qp, &wr, &mut sinks));
    // Inline data is no place for a READ.
    let inline = SendWr {
        wr_id: 1,
        op: SendOp::RdmaRead { remote_addr, rkey },
        payload: Payload::Inline(&[0; 8]),
        flags: SendFlags::EMPTY,
    };
    assert_eq!(
        p.engine(End::A).post_send_placed(qp, &inline),
        Err(PostError::InvalidOpcode)
    );
}

#[test]
fn a_placed_read_whose_region_went_away_fails_with_a_local_protection_error() {
    let mut p = Pair::lossless();
    same_host(&mut p);
    let qp = p.a.qp;
    let (remote_addr, rkey) = (p.addr(End::B, 0), p.rkey(End::B));
    // A placed inline WRITE with immediate ahead (a packet, acknowledged later) keeps
    // the READ from running at once.
    p.post_recv(End::B, 7, &[]).unwrap();
    let write = SendWr {
        wr_id: 1,
        op: SendOp::RdmaWriteWithImm {
            remote_addr,
            rkey,
            imm: 3,
        },
        payload: Payload::Inline(&[7; 8]),
        flags: SendFlags::INLINE | SendFlags::SIGNALED,
    };
    p.engine(End::A).post_send_placed(qp, &write).unwrap();
    let sge = p.sge(End::A, 0, 4096);
    let wr = SendWr::new(
        2,
        SendOp::RdmaRead { remote_addr, rkey },
        std::slice::from_ref(&sge),
    );
    place_read(&mut p, &wr, 0);
    p.engine(End::A).post_send_placed(qp, &wr).unwrap();
    let mr = p.a.mr.handle;
    p.engine(End::A).dereg_mr(mr).unwrap();
    p.run_until_send_cqes(End::A, 2).unwrap();
    let s = p.poll_send(End::A);
    let got: Vec<_> = s.iter().map(|w| (w.wr_id, w.status)).collect();
    // The failure moves the QP to ERR, which flushes the WRITE still unacknowledged
    // before it (IBA 10.8.3.3), as a failed local operation does.
    assert_eq!(
        got,
        vec![(1, WcStatus::WrFlushErr), (2, WcStatus::LocProtErr)]
    );
    assert_eq!(p.qp_state(End::A), QpState::Err);
}

#[test]
fn placement_waits_for_earlier_packet_borne_requests() {
    let mut p = Pair::lossless();
    same_host(&mut p);
    let qp = p.a.qp;
    p.post_recv(End::B, 1, &[p.sge(End::B, 0, 64)]).unwrap();
    let sge = p.sge(End::A, 0, 64);
    p.post_send(End::A, &SendWr::new(1, SendOp::Send, &[sge]))
        .unwrap();
    // The SEND is not acknowledged yet: a WRITE must not overtake it.
    assert!(!p.engine(End::A).placement_ready(qp));
    let wr = SendWr::new(
        2,
        SendOp::RdmaWrite {
            remote_addr: p.addr(End::B, 100),
            rkey: p.rkey(End::B),
        },
        std::slice::from_ref(&sge),
    );
    assert_eq!(
        p.engine(End::A).post_send_placed(qp, &wr),
        Err(PostError::InvalidOpcode)
    );
    p.run_until_send_cqes(End::A, 1).unwrap();
    assert!(p.engine(End::A).placement_ready(qp));
    // Placed WRs do not hold later placements back.
    place_write(&mut p, &wr, 100);
    p.engine(End::A).post_send_placed(qp, &wr).unwrap();
    assert!(p.engine(End::A).placement_ready(qp));
    // Only RC QPs with the path take placed work.
    p.engine(End::A).set_same_host(qp, false).unwrap();
    assert!(!p.engine(End::A).placement_ready(qp));
}

#[test]
fn responder_still_checks_a_placed_write_with_imms_range() {
    // A placed WRITE with immediate naming memory the target may not write is refused
    // there too (the driver checks the published table first; this is the second check).
    let mut p = Pair::lossless();
    same_host(&mut p);
    let qp = p.a.qp;
    p.post_recv(End::B, 7, &[]).unwrap();
    let sge = p.sge(End::A, 0, 4096);
    let wr = SendWr::new(
        3,
        SendOp::RdmaWriteWithImm {
            remote_addr: p.addr(End::B, p.opts.buf_len - 100),
            rkey: p.rkey(End::B),
            imm: 1,
        },
        std::slice::from_ref(&sge),
    );
    p.engine(End::A).post_send_placed(qp, &wr).unwrap();
    p.run_until_send_cqes(End::A, 1).unwrap();
    assert_eq!(p.poll_send(End::A)[0].status, WcStatus::RemAccessErr);
    assert_eq!(p.qp_state(End::A), QpState::Err);
}

#[test]
fn a_header_only_write_to_a_qp_without_the_path_is_a_length_error() {
    // Only the peer that negotiated the path may send them.
    let mut p = Pair::lossless();
    let qp = p.a.qp;
    p.engine(End::A).set_same_host(qp, true).unwrap(); // B did not agree
    p.post_recv(End::B, 7, &[]).unwrap();
    let sge = p.sge(End::A, 0, 4096);
    let wr = SendWr::new(
        4,
        SendOp::RdmaWriteWithImm {
            remote_addr: p.addr(End::B, 0),
            rkey: p.rkey(End::B),
            imm: 2,
        },
        std::slice::from_ref(&sge),
    );
    p.engine(End::A).post_send_placed(qp, &wr).unwrap();
    p.run_until_send_cqes(End::A, 1).unwrap();
    assert_eq!(p.poll_send(End::A)[0].status, WcStatus::RemInvReqErr);
}

/// A placed WRITE without immediate is done when its bytes landed: no packet, no ACK
/// to wait for; it completes in order, and a SEND posted after it is received after
/// its bytes are there.
#[test]
fn a_placed_write_completes_locally_and_a_later_send_follows_it() {
    let mut p = Pair::lossless();
    same_host(&mut p);
    let qp = p.a.qp;
    p.fill(End::A, 0, 8192, 4);
    let (remote_addr, rkey) = (p.addr(End::B, 0), p.rkey(End::B));
    let sge = p.sge(End::A, 0, 8192);
    let wr = SendWr::new(
        1,
        SendOp::RdmaWrite { remote_addr, rkey },
        std::slice::from_ref(&sge),
    );
    place_write(&mut p, &wr, 0);
    let before = p.sim.stats().delivered;
    p.engine(End::A).post_send_placed(qp, &wr).unwrap();
    // Done at once: its completion is there before any packet moved.
    let s = p.poll_send(End::A);
    assert_eq!(
        s.iter()
            .map(|w| (w.wr_id, w.status, w.opcode))
            .collect::<Vec<_>>(),
        vec![(1, WcStatus::Success, WcOpcode::RdmaWrite)]
    );
    p.settle();
    assert_eq!(p.sim.stats().delivered, before, "nothing on the wire");
    // Still placement-ready: nothing is outstanding.
    assert!(p.engine(End::A).placement_ready(qp));
    let rsge = p.sge(End::B, 16_384, 64);
    p.post_recv(End::B, 9, &[rsge]).unwrap();
    let small = p.sge(End::A, 0, 64);
    p.post_send(End::A, &SendWr::new(2, SendOp::Send, &[small]))
        .unwrap();
    p.run_until_cqes(End::B, 0, 1).unwrap();
    assert_eq!(p.poll_recv(End::B)[0].status, WcStatus::Success);
    assert_eq!(p.bytes(End::B, 0, 8192), p.bytes(End::A, 0, 8192));
}

/// The driver publishes whether a QP accepts placed WRITEs: the engine reports every
/// change, its entering ERR included.
#[test]
fn acceptance_changes_are_reported_for_the_driver_to_publish() {
    let mut p = Pair::lossless();
    let qp = p.b.qp;
    while p.engine(End::B).poll_placed_change().is_some() {}
    assert!(!p.engine(End::B).accepts_placed(qp));
    p.engine(End::B).set_accepts_placed(qp, true).unwrap();
    assert_eq!(p.engine(End::B).poll_placed_change(), Some(qp));
    assert!(p.engine(End::B).accepts_placed(qp));
    let attr = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    p.engine(End::B)
        .modify_qp(qp, &attr, QpAttrMask::STATE, Instant::ZERO)
        .unwrap();
    assert_eq!(p.engine(End::B).poll_placed_change(), Some(qp));
    assert!(!p.engine(End::B).accepts_placed(qp));
}

#[test]
fn placed_writes_survive_loss_in_order() {
    for seed in 1..=4 {
        let mut p = Pair::new(seed, softverbs_sim::Faults::lossy(0.2), PairOpts::default());
        same_host(&mut p);
        let qp = p.a.qp;
        p.fill(End::A, 0, 32_768, seed as u8);
        for i in 0..8u64 {
            let sge = p.sge(End::A, i as usize * 4096, 4096);
            let wr = SendWr::new(
                i,
                SendOp::RdmaWrite {
                    remote_addr: p.addr(End::B, i as usize * 4096),
                    rkey: p.rkey(End::B),
                },
                std::slice::from_ref(&sge),
            );
            place_write(&mut p, &wr, i as usize * 4096);
            p.engine(End::A).post_send_placed(qp, &wr).unwrap();
        }
        p.run_until_send_cqes(End::A, 8).unwrap();
        let s = p.poll_send(End::A);
        let got: Vec<_> = s.iter().map(|w| (w.wr_id, w.status)).collect();
        let want: Vec<_> = (0..8).map(|i| (i, WcStatus::Success)).collect();
        assert_eq!(got, want, "seed {seed}");
        p.settle();
        assert_eq!(p.bytes(End::A, 0, 32_768), p.bytes(End::B, 0, 32_768));
    }
}

#[test]
fn a_placed_read_completes_after_the_writes_before_it() {
    let mut p = Pair::lossless();
    same_host(&mut p);
    let qp = p.a.qp;
    p.fill(End::A, 0, 4096, 8);
    let sge = p.sge(End::A, 0, 4096);
    let (remote_addr, rkey) = (p.addr(End::B, 0), p.rkey(End::B));
    // With immediate: a packet whose ACK the READ's completion must wait for.
    p.post_recv(End::B, 7, &[]).unwrap();
    let wr = SendWr::new(
        1,
        SendOp::RdmaWriteWithImm {
            remote_addr,
            rkey,
            imm: 4,
        },
        std::slice::from_ref(&sge),
    );
    place_write(&mut p, &wr, 0);
    p.engine(End::A).post_send_placed(qp, &wr).unwrap();
    let rsge = p.sge(End::A, 8192, 4096);
    let rd = SendWr::new(
        2,
        SendOp::RdmaRead { remote_addr, rkey },
        std::slice::from_ref(&rsge),
    );
    place_read(&mut p, &rd, 0);
    p.engine(End::A).post_send_placed(qp, &rd).unwrap();
    // The READ is done, but completes only after the WRITE before it.
    assert!(p.poll_send(End::A).is_empty());
    p.run_until_send_cqes(End::A, 2).unwrap();
    let s = p.poll_send(End::A);
    let got: Vec<_> = s.iter().map(|w| (w.wr_id, w.status, w.opcode)).collect();
    assert_eq!(
        got,
        vec![
            (1, WcStatus::Success, WcOpcode::RdmaWrite),
            (2, WcStatus::Success, WcOpcode::RdmaRead)
        ]
    );
    assert_eq!(s[1].byte_len, 4096);
    assert_eq!(p.bytes(End::A, 8192, 4096), p.bytes(End::A, 0, 4096));
}

/// A post may wait for WRITEs and READs that went by UDP (they need nothing of the peer
/// application) before placing, but not for a SEND (it may wait for a receive).
#[test]
fn placement_may_wait_for_one_sided_udp_requests_only() {
    let mut p = Pair::lossless();
    same_host(&mut p);
    let qp = p.a.qp;
    assert!(!p.engine(End::A).placement_waits_for_one_sided(qp));
    let (remote_addr, rkey) = (p.addr(End::B, 0), p.rkey(End::B));
    let sge = p.sge(End::A, 0, 4096);
    p.post_send(
        End::A,
        &SendWr::new(1, SendOp::RdmaRead { remote_addr, rkey }, &[sge]),
    )
    .unwrap();
    assert!(!p.engine(End::A).placement_ready(qp));
    assert!(p.engine(End::A).placement_waits_for_one_sided(qp));
    p.post_send(End::A, &SendWr::new(2, SendOp::Send, &[sge]))
        .unwrap();
    assert!(!p.engine(End::A).placement_waits_for_one_sided(qp));
    p.post_recv(End::B, 1, &[p.sge(End::B, 8192, 4096)])
        .unwrap();
    p.run_until_send_cqes(End::A, 2).unwrap();
    assert!(!p.engine(End::A).placement_waits_for_one_sided(qp));
    assert!(p.engine(End::A).placement_ready(qp));
}

/// The driver's share for held WQEs: moves the bytes of every held WQE that may be
/// placed now (WRITE: from A's pieces or inline copy into B; READ: from B into A's
/// pieces) and settles each, in order. Returns how many were placed.
fn place_held(p: &mut Pair, b_base: u64) -> usize {
    let qp = p.a.qp;
    let mut ready = Vec::new();
    p.engine(End::A).held_ready(qp, &mut ready);
    let a_base = p.addr(End::A, 0);
    let mut placed = 0;
    for h in ready {
        let at_b = (h.target.remote_addr - b_base) as usize;
        let (mut pieces, mut bounce) = (Vec::new(), Vec::new());
        if h.target.write {
            assert!(p
                .engine(End::A)
                .held_source(qp, h.seq, &mut pieces, &mut bounce));
            let mut bytes = bounce;
            for (addr, len) in pieces {
                let at = (addr - a_base) as usize;
                bytes.extend_from_slice(&p.a.buf[at..at + len]);
            }
            p.b.buf[at_b..at_b + bytes.len()].copy_from_slice(&bytes);
        } else {
            assert!(p.engine(End::A).held_sink(qp, h.seq, &mut pieces));
            let mut from = at_b;
            for (addr, len) in pieces {
                let at = (addr - a_base) as usize;
                let bytes = p.bytes(End::B, from, len).to_vec();
                p.a.buf[at..at + len].copy_from_slice(&bytes);
                from += len;
            }
        }
        if p.engine(End::A).settle_held(qp, h.seq, true) {
            placed += 1;
        }
    }
    placed
}

/// A WRITE posted behind a WRITE that went by UDP is held, not sent: nothing after it
/// leaves either; once the UDP WRITE completes the QP is reported, the held WRs are
/// placed, and everything completes in post order.
#[test]
fn a_write_behind_a_udp_write_is_held_then_placed_in_order() {
    let mut p = Pair::lossless();
    let qp = p.a.qp;
    p.fill(End::A, 0, 12_288, 7);
    let b0 = p.addr(End::B, 0);
    let rkey = p.rkey(End::B);
    let write = |id: u64, off: usize, sge: &Sge| {
        let op = SendOp::RdmaWrite {
            remote_addr: b0 + off as u64,
            rkey,
        };
        (id, op, *sge)
    };
    // Posted before the path is up: by UDP.
    let s1 = p.sge(End::A, 0, 4096);
    let (id, op, sge) = write(1, 0, &s1);
    p.post_send(End::A, &SendWr::new(id, op, &[sge])).unwrap();
    same_host(&mut p);
    assert!(p.engine(End::A).placement_waits_for_one_sided(qp));
    let s2 = p.sge(End::A, 4096, 4096);
    let (id, op, sge) = write(2, 4096, &s2);
    let held = SendWr::new(id, op, std::slice::from_ref(&sge));
    assert!(p.engine(End::A).should_hold(qp, &held));
    p.engine(End::A).post_send_held(qp, &held).unwrap();
    // A SEND after it waits behind it; a READ after it is held too.
    p.post_recv(End::B, 9, &[p.sge(End::B, 20_000, 64)])
        .unwrap();
    let small = p.sge(End::A, 0, 64);
    p.post_send(End::A, &SendWr::new(3, SendOp::Send, &[small]))
        .unwrap();
    let s4 = p.sge(End::A, 8192, 4096);
    let rd = SendWr::new(
        4,
        SendOp::RdmaRead {
            remote_addr: b0 + 30_000,
            rkey,
        },
        std::slice::from_ref(&s4),
    );
    assert!(p.engine(End::A).should_hold(qp, &rd));
    p.engine(End::A).post_send_held(qp, &rd).unwrap();
    // Nothing to place before the UDP WRITE completes.
    let mut ready = Vec::new();
    p.engine(End::A).held_ready(qp, &mut ready);
    assert!(ready.is_empty());
    assert_eq!(p.engine(End::A).poll_held_ready(), None);
    p.run_until_send_cqes(End::A, 1).unwrap();
    p.settle();
    // Only the first WRITE went: the SEND behind the held WRITE did not.
    assert!(p.poll_recv(End::B).is_empty());
    let s = p.poll_send(End::A);
    assert_eq!(
        (s.len(), s[0].wr_id, s[0].status),
        (1, 1, WcStatus::Success)
    );
    assert_eq!(p.engine(End::A).poll_held_ready(), Some(qp));
    assert_eq!(p.engine(End::A).poll_held_ready(), None);
    p.engine(End::A).held_ready(qp, &mut ready);
    assert_eq!(ready.iter().map(|h| h.seq).collect::<Vec<_>>(), [1]);
    assert_eq!(place_held(&mut p, b0), 1);
    // The SEND follows the placed WRITE; the READ is held behind the SEND.
    p.run_until_cqes(End::B, 0, 1).unwrap();
    p.run_until_send_cqes(End::A, 2).unwrap();
    assert_eq!(p.bytes(End::B, 4096, 4096), p.bytes(End::A, 4096, 4096));
    p.settle();
    assert_eq!(p.engine(End::A).poll_held_ready(), Some(qp));
    p.fill(End::B, 30_000, 4096, 9);
    assert_eq!(place_held(&mut p, b0), 1);
    p.run_until_send_cqes(End::A, 3).unwrap();
    let ids: Vec<(u64, WcStatus)> = p
        .poll_send(End::A)
        .iter()
        .map(|w| (w.wr_id, w.status))
        .collect();
    assert_eq!(
        ids,
        [
            (2, WcStatus::Success),
            (3, WcStatus::Success),
            (4, WcStatus::Success)
        ]
    );
    assert_eq!(p.bytes(End::A, 8192, 4096), p.bytes(End::B, 30_000, 4096));
}

/// A held WR whose bytes cannot move goes by UDP and gets the responder's status; a
/// QP entering ERR flushes held WRs.
#[test]
fn held_wrs_released_go_by_udp_and_flush_on_error() {
    let mut p = Pair::lossless();
    let qp = p.a.qp;
    let b0 = p.addr(End::B, 0);
    let rkey = p.rkey(End::B);
    let sge = p.sge(End::A, 0, 4096);
    let wr = |id: u64, rkey: Rkey| {
        SendWr::new(
            id,
            SendOp::RdmaWrite {
                remote_addr: b0,
                rkey,
            },
            std::slice::from_ref(&sge),
        )
    };
    p.post_send(End::A, &wr(1, rkey)).unwrap();
    same_host(&mut p);
    // A bad R_Key: the driver's table check refuses it; released, the UDP path's
    // responder NAKs it.
    let bad = Rkey(rkey.0 ^ 0x100);
    p.engine(End::A).post_send_held(qp, &wr(2, bad)).unwrap();
    p.engine(End::A).post_send_held(qp, &wr(3, rkey)).unwrap();
    p.run_until_send_cqes(End::A, 1).unwrap();
    assert_eq!(p.engine(End::A).poll_held_ready(), Some(qp));
    let mut ready = Vec::new();
    p.engine(End::A).held_ready(qp, &mut ready);
    assert_eq!(ready.len(), 2);
    assert!(!p.engine(End::A).settle_held(qp, ready[0].seq, false));
    // The next one is behind a WR by UDP now: not placed.
    p.engine(End::A).held_ready(qp, &mut ready);
    assert!(ready.is_empty());
    p.run_until_send_cqes(End::A, 3).unwrap();
    let s: Vec<(u64, WcStatus)> = p
        .poll_send(End::A)
        .iter()
        .map(|w| (w.wr_id, w.status))
        .collect();
    assert_eq!(
        s,
        [
            (1, WcStatus::Success),
            (2, WcStatus::RemAccessErr),
            (3, WcStatus::WrFlushErr)
        ]
    );

    // Held WRs flush when the QP enters ERR before they may be placed.
    let mut p = Pair::lossless();
    let qp = p.a.qp;
    let sge = p.sge(End::A, 0, 4096);
    let w = |id| {
        SendWr::new(
            id,
            SendOp::RdmaWrite {
                remote_addr: b0,
                rkey,
            },
            std::slice::from_ref(&sge),
        )
    };
    p.post_send(End::A, &w(1)).unwrap();
    same_host(&mut p);
    p.engine(End::A).post_send_held(qp, &w(2)).unwrap();
    p.engine(End::A).post_send_held(qp, &w(3)).unwrap();
    let err = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    let now = p.sim.now();
    p.engine(End::A)
        .modify_qp(qp, &err, QpAttrMask::STATE, now)
        .unwrap();
    let s: Vec<(u64, WcStatus)> = p
        .poll_send(End::A)
        .iter()
        .map(|w| (w.wr_id, w.status))
        .collect();
    assert_eq!(
        s,
        [
            (1, WcStatus::WrFlushErr),
            (2, WcStatus::WrFlushErr),
            (3, WcStatus::WrFlushErr)
        ]
    );
    // Settling a flushed WR changes nothing.
    assert!(!p.engine(End::A).settle_held(qp, 1, true));
    assert_eq!(p.engine(End::A).poll_held_ready(), None);
}

/// UC QPs take the path too: a placed WRITE completes at once, with no packet; a placed
/// WRITE with immediate is one header-only packet, completing at the target with the
/// RETH's length after the bytes; a SEND after a placed WRITE finds the bytes there.
#[test]
fn uc_qps_place_writes_and_write_with_imm() {
    let opts = PairOpts {
        qp_type: QpType::Uc,
        ..PairOpts::default()
    };
    let mut p = Pair::new(1, softverbs_sim::Faults::none(), opts);
    same_host(&mut p);
    let qp = p.a.qp;
    assert!(p.engine(End::A).placement_ready(qp));
    p.fill(End::A, 0, 20_000, 4);
    let (b0, rkey) = (p.addr(End::B, 0), p.rkey(End::B));
    let sge = p.sge(End::A, 0, 10_000);
    let wr = SendWr::new(
        1,
        SendOp::RdmaWrite {
            remote_addr: b0,
            rkey,
        },
        std::slice::from_ref(&sge),
    );
    place_write(&mut p, &wr, 0);
    let before = p.sim.stats().delivered;
    p.engine(End::A).post_send_placed(qp, &wr).unwrap();
    p.run_until_send_cqes(End::A, 1).unwrap();
    assert_eq!(p.sim.stats().delivered, before, "no packet");
    assert_eq!(p.poll_send(End::A)[0].status, WcStatus::Success);
    assert_eq!(p.bytes(End::B, 0, 10_000), p.bytes(End::A, 0, 10_000));

    p.post_recv(End::B, 7, &[]).unwrap();
    let sge = p.sge(End::A, 10_000, 10_000);
    let wr = SendWr::new(
        2,
        SendOp::RdmaWriteWithImm {
            remote_addr: b0 + 10_000,
            rkey,
            imm: 0x0506_0708,
        },
        std::slice::from_ref(&sge),
    );
    place_write(&mut p, &wr, 10_000);
    let before = p.sim.stats().delivered;
    p.engine(End::A).post_send_placed(qp, &wr).unwrap();
    p.run_until_cqes(End::B, 0, 1).unwrap();
    // One header-only packet (UC: no ACK).
    assert_eq!(p.sim.stats().delivered - before, 1);
    let r = p.poll_recv(End::B);
    assert_eq!(
        (r[0].status, r[0].opcode, r[0].byte_len, r[0].imm_data),
        (
            WcStatus::Success,
            WcOpcode::RecvRdmaWithImm,
            10_000,
            Some(0x0506_0708)
        )
    );
    assert_eq!(
        p.bytes(End::B, 10_000, 10_000),
        p.bytes(End::A, 10_000, 10_000)
    );
}

/// UC has no READ: no place is given for one (its bytes must not move), and its post
/// fails as on UDP.
#[test]
fn a_read_on_a_uc_qp_gets_no_place() {
    let opts = PairOpts {
        qp_type: QpType::Uc,
        ..PairOpts::default()
    };
    let mut p = Pair::new(1, softverbs_sim::Faults::none(), opts);
    same_host(&mut p);
    let qp = p.a.qp;
    let (remote_addr, rkey) = (p.addr(End::B, 0), p.rkey(End::B));
    let sge = p.sge(End::A, 0, 64);
    let rd = SendWr::new(
        1,
        SendOp::RdmaRead { remote_addr, rkey },
        std::slice::from_ref(&sge),
    );
    let mut sinks = Vec::new();
    assert!(!p.engine(End::A).placement_sink(qp, &rd, &mut sinks));
    assert!(!p.engine(End::A).should_hold(qp, &rd));
    assert_eq!(
        p.engine(End::A).post_send_placed(qp, &rd),
        Err(PostError::InvalidOpcode)
    );
}
