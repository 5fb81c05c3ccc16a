//! Hostile datagrams into a connected engine: no input may panic, hang, or touch
//! memory outside the registered region.
//!
//! The input is a list of datagrams, each `[len: u16 le][bytes]`. Engine B skips
//! ICRC verification so fuzzed headers reach the transport; each datagram arrives
//! from A's address, and between datagrams the two engines exchange whatever they
//! want to send and their timers run, so answers and retransmissions happen too. The
//! first empty datagram destroys B's QP instead: what follows reaches a closed QP,
//! which re-acknowledges duplicates (src/closed.rs).
//!
//! B has two RC QPs connected to two of A's: the first with its own receive queue,
//! the second on a shared receive queue that A sends multi-packet SENDs to. B's first
//! QP has a READ, a WRITE and a SEND of its own outstanding, so fuzzed ACKs, NAKs,
//! RNR NAKs and READ responses meet a requester with work in flight. That QP has the
//! same-host path (`engine/placed.rs`): its responder also takes header-only placed
//! WRITEs, and a WRITE and a READ of its own are held behind those requests; whenever
//! the engine reports them ready, the test plays the driver and settles them, placed
//! or released to go by UDP in turn.
#![no_main]

use libfuzzer_sys::fuzz_target;
use softverbs_engine::*;
use std::net::SocketAddr;
use std::time::Duration;

const GUARD: usize = 4096;
const REGION: usize = 16384;
const PATTERN: u8 = 0xa5;

fn connect(e: &mut Engine, qp: QpHandle, peer: SocketAddr, peer_qpn: Qpn) {
    let now = Instant::ZERO;
    let access = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
    let mut a = QpAttr {
        qp_state: QpState::Init,
        qp_access_flags: access,
        ..QpAttr::default()
    };
    e.modify_qp(
        qp,
        &a,
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS,
        now,
    )
    .unwrap();
    a = QpAttr {
        qp_state: QpState::Rtr,
        path_mtu: Mtu::Mtu256,
        dest_qp_num: peer_qpn.value(),
        rq_psn: 0,
        max_dest_rd_atomic: 2,
        min_rnr_timer: 1,
        av: Some(peer),
        ..QpAttr::default()
    };
    let rtr = QpAttrMask::STATE
        | QpAttrMask::AV
        | QpAttrMask::PATH_MTU
        | QpAttrMask::DEST_QPN
        | QpAttrMask::RQ_PSN
        | QpAttrMask::MAX_DEST_RD_ATOMIC
        | QpAttrMask::MIN_RNR_TIMER;
    e.modify_qp(qp, &a, rtr, now).unwrap();
    a = QpAttr {
        qp_state: QpState::Rts,
        sq_psn: 0,
        timeout: 10,
        retry_cnt: 2,
        rnr_retry: 2,
        max_rd_atomic: 2,
        ..a
    };
    let rts = QpAttrMask::STATE
        | QpAttrMask::SQ_PSN
        | QpAttrMask::TIMEOUT
        | QpAttrMask::RETRY_CNT
        | QpAttrMask::RNR_RETRY
        | QpAttrMask::MAX_QP_RD_ATOMIC;
    e.modify_qp(qp, &a, rts, now).unwrap();
}

struct End {
    engine: Engine,
    qps: [QpHandle; 2],
    qpns: [Qpn; 2],
    mr: MrInfo,
    srq: Option<SrqHandle>,
}

/// An engine with two RC QPs; the second takes its receives from an SRQ when
/// `with_srq`.
fn end(addr: SocketAddr, icrc: IcrcPolicy, memory: &mut [u8], with_srq: bool) -> End {
    let mut cfg = EngineConfig::new(addr);
    cfg.icrc = icrc;
    let mut engine = Engine::new(cfg);
    let pd = engine.alloc_pd().unwrap();
    let cq = engine.create_cq(64).unwrap();
    let cap = QpCap {
        max_send_wr: 8,
        max_recv_wr: 8,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 16,
    };
    let init = QpInitAttr {
        pd,
        send_cq: cq,
        recv_cq: cq,
        qp_type: QpType::Rc,
        cap,
        sq_sig_all: true,
    };
    let (qp0, qpn0) = engine.create_qp(init).unwrap();
    let srq = with_srq.then(|| {
        engine
            .create_srq(
                pd,
                SrqInitAttr {
                    max_wr: 4,
                    max_sge: 2,
                    srq_limit: 2,
                },
            )
            .unwrap()
    });
    let (qp1, qpn1) = match srq {
        Some(srq) => engine.create_qp_with_srq(init, srq).unwrap(),
        None => engine.create_qp(init).unwrap(),
    };
    let all = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    // SAFETY: `memory` outlives the engine (both live for one fuzz iteration, the
    // engine is dropped first) and is not otherwise touched while it runs.
    let mr = unsafe { engine.reg_mr(pd, memory.as_mut_ptr(), memory.len(), all) }.unwrap();
    End {
        engine,
        qps: [qp0, qp1],
        qpns: [qpn0, qpn1],
        mr,
        srq,
    }
}

impl End {
    fn sge(&self, offset: u64, length: u32) -> Sge {
        Sge {
            addr: self.mr.addr + offset,
            length,
            lkey: self.mr.lkey,
        }
    }
}

/// Exchanges what the two engines want to send, for a bounded while.
fn talk(a: &mut End, b: &mut End, addrs: [SocketAddr; 2], now: Instant, buf: &mut [u8]) {
    for _ in 0..32 {
        let mut moved = false;
        if let Some(t) = a.engine.poll_transmit(now, buf) {
            t.seal(buf, 0);
            b.engine.handle_datagram(now, addrs[0], &buf[..t.len]);
            moved = true;
        }
        if let Some(t) = b.engine.poll_transmit(now, buf) {
            t.seal(buf, 0);
            a.engine.handle_datagram(now, addrs[1], &buf[..t.len]);
            moved = true;
        }
        if !moved {
            break;
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let addr_a: SocketAddr = "10.0.0.1:4791".parse().unwrap();
    let addr_b: SocketAddr = "10.0.0.2:4791".parse().unwrap();
    let mut mem_a = vec![0u8; REGION];
    let mut mem_b = vec![PATTERN; GUARD + REGION + GUARD];
    {
        let mut a = end(addr_a, IcrcPolicy::Enforce, &mut mem_a, false);
        let mut b = end(
            addr_b,
            IcrcPolicy::Skip,
            &mut mem_b[GUARD..GUARD + REGION],
            true,
        );
        for k in 0..2 {
            connect(&mut a.engine, a.qps[k], addr_b, b.qpns[k]);
            connect(&mut b.engine, b.qps[k], addr_a, a.qpns[k]);
        }
        // Receives on both sides, so SENDs get somewhere: B's first QP and its SRQ,
        // A's first QP.
        let srq = b.srq.unwrap();
        for i in 0..4 {
            let own = [b.sge(1024 * i, 1024)];
            let _ = b.engine.post_recv(
                b.qps[0],
                &RecvWr {
                    wr_id: i,
                    sges: &own,
                },
            );
            let at = 4096 + 2048 * i;
            let shared = [b.sge(at, 1000), b.sge(at + 1000, 1048)];
            let _ = b.engine.post_srq_recv(
                srq,
                &RecvWr {
                    wr_id: i,
                    sges: &shared,
                },
            );
            let own = [a.sge(1024 * i, 1024)];
            let _ = a.engine.post_recv(
                a.qps[0],
                &RecvWr {
                    wr_id: i,
                    sges: &own,
                },
            );
        }
        // Legitimate requests in flight from A: a WRITE to B's first QP, a
        // three-packet SEND to B's SRQ QP. And from B's first QP a READ, a WRITE and
        // a SEND, so that fuzzed answers meet a requester with work outstanding.
        let (a_rkey, b_rkey) = (Rkey(a.mr.rkey), Rkey(b.mr.rkey));
        let requests = [
            (
                0usize,
                1u64,
                SendOp::RdmaWrite {
                    remote_addr: b.mr.addr + 100,
                    rkey: b_rkey,
                },
                0u64,
                600u32,
            ),
            (1, 2, SendOp::Send, 0, 700),
        ];
        for (k, wr_id, op, offset, len) in requests {
            let sges = [a.sge(offset, len)];
            let _ = a.engine.post_send(a.qps[k], &SendWr::new(wr_id, op, &sges));
        }
        let requests = [
            (
                3u64,
                SendOp::RdmaRead {
                    remote_addr: a.mr.addr + 2000,
                    rkey: a_rkey,
                },
                9000u64,
                700u32,
            ),
            (
                4,
                SendOp::RdmaWrite {
                    remote_addr: a.mr.addr + 5000,
                    rkey: a_rkey,
                },
                0,
                300,
            ),
            (5, SendOp::Send, 0, 200),
        ];
        for (wr_id, op, offset, len) in requests {
            let sges = [b.sge(offset, len)];
            let _ = b.engine.post_send(b.qps[0], &SendWr::new(wr_id, op, &sges));
        }
        b.engine.set_same_host(b.qps[0], true).unwrap();
        let held = [
            (
                6u64,
                SendOp::RdmaWrite {
                    remote_addr: a.mr.addr + 6000,
                    rkey: a_rkey,
                },
            ),
            (
                7,
                SendOp::RdmaRead {
                    remote_addr: a.mr.addr + 7000,
                    rkey: a_rkey,
                },
            ),
        ];
        for (wr_id, op) in held {
            let sges = [b.sge(12_000 + 500 * wr_id, 400)];
            let _ = b
                .engine
                .post_send_held(b.qps[0], &SendWr::new(wr_id, op, &sges));
        }
        let (mut ready, mut pieces, mut bounce) = (Vec::new(), Vec::new(), Vec::new());
        let mut settled = 0u32;

        // B's answer queues are sized once and never grow (qp/responder/answers.rs).
        let answer_room: Vec<_> = b
            .qps
            .iter()
            .map(|&qp| b.engine.qp_answer_queue(qp).map(|q| q.capacity))
            .collect();
        let mut now = Instant::ZERO;
        let mut buf = vec![0u8; MAX_DATAGRAM];
        let mut rest = data;
        let mut rounds = 0;
        let mut b_open = true;
        while rest.len() >= 2 && rounds < 64 {
            rounds += 1;
            let len = usize::from(u16::from_le_bytes([rest[0], rest[1]])).min(rest.len() - 2);
            let (datagram, tail) = rest[2..].split_at(len);
            rest = tail;
            if datagram.is_empty() && b_open {
                b.engine.destroy_qp(b.qps[0]).unwrap();
                b_open = false;
            } else {
                b.engine.handle_datagram(now, addr_a, datagram);
            }
            for (k, &qp) in b.qps.iter().enumerate() {
                if let (Some(q), Some(room)) = (b.engine.qp_answer_queue(qp), answer_room[k]) {
                    assert_eq!(q.capacity, room, "B's answer queue grew: {q:?}");
                }
            }
            // Let the two talk for a bounded while.
            talk(&mut a, &mut b, [addr_a, addr_b], now, &mut buf);
            now += Duration::from_millis(1);
            a.engine.handle_timeout(now);
            b.engine.handle_timeout(now);
            while a.engine.poll_event().is_some() || b.engine.poll_event().is_some() {}
            while let Some(qp) = b.engine.poll_held_ready() {
                b.engine.held_ready(qp, &mut ready);
                for h in &ready {
                    let _ = if h.target.write {
                        b.engine.held_source(qp, h.seq, &mut pieces, &mut bounce)
                    } else {
                        b.engine.held_sink(qp, h.seq, &mut pieces)
                    };
                    settled += 1;
                    b.engine.settle_held(qp, h.seq, settled % 2 == 1);
                }
            }
        }
    }
    // Nothing outside B's registered region was written.
    assert!(
        mem_b[..GUARD].iter().all(|&x| x == PATTERN),
        "write below the region"
    );
    assert!(
        mem_b[GUARD + REGION..].iter().all(|&x| x == PATTERN),
        "write above the region"
    );
});
