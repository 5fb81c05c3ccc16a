//! Hostile datagrams into a connected engine: no input may panic, hang, or touch
//! memory outside the registered region.
//!
//! The input is a list of datagrams, each `[len: u16 le][bytes]`. Engine B skips
//! ICRC verification so fuzzed headers reach the transport; each datagram arrives
//! from A's address, and between datagrams the two engines exchange whatever they
//! want to send and their timers run, so answers and retransmissions happen too. The
//! first empty datagram destroys B's QP instead: what follows reaches a closed QP,
//! which re-acknowledges duplicates (src/closed.rs).
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
    qp: QpHandle,
    qpn: Qpn,
    mr: MrInfo,
}

fn end(addr: SocketAddr, icrc: IcrcPolicy, memory: &mut [u8]) -> End {
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
    let (qp, qpn) = engine
        .create_qp(QpInitAttr {
            pd,
            send_cq: cq,
            recv_cq: cq,
            qp_type: QpType::Rc,
            cap,
            sq_sig_all: true,
        })
        .unwrap();
    let all = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    // SAFETY: `memory` outlives the engine (both live for one fuzz iteration, the
    // engine is dropped first) and is not otherwise touched while it runs.
    let mr = unsafe { engine.reg_mr(pd, memory.as_mut_ptr(), memory.len(), all) }.unwrap();
    End {
        engine,
        qp,
        qpn,
        mr,
    }
}

fuzz_target!(|data: &[u8]| {
    let addr_a: SocketAddr = "10.0.0.1:4791".parse().unwrap();
    let addr_b: SocketAddr = "10.0.0.2:4791".parse().unwrap();
    let mut mem_a = vec![0u8; REGION];
    let mut mem_b = vec![PATTERN; GUARD + REGION + GUARD];
    {
        let mut a = end(addr_a, IcrcPolicy::Enforce, &mut mem_a);
        let mut b = end(addr_b, IcrcPolicy::Skip, &mut mem_b[GUARD..GUARD + REGION]);
        connect(&mut a.engine, a.qp, addr_b, b.qpn);
        connect(&mut b.engine, b.qp, addr_a, a.qpn);
        // Give both sides receives so SENDs get somewhere.
        for i in 0..4 {
            let sge = Sge {
                addr: b.mr.addr + 1024 * i,
                length: 1024,
                lkey: b.mr.lkey,
            };
            let _ = b.engine.post_recv(
                b.qp,
                &RecvWr {
                    wr_id: i,
                    sges: &[sge],
                },
            );
            let sge = Sge {
                addr: a.mr.addr + 1024 * i,
                length: 1024,
                lkey: a.mr.lkey,
            };
            let _ = a.engine.post_recv(
                a.qp,
                &RecvWr {
                    wr_id: i,
                    sges: &[sge],
                },
            );
        }
        // And one legitimate request in flight from A.
        let sges = [Sge {
            addr: a.mr.addr,
            length: 600,
            lkey: a.mr.lkey,
        }];
        let wr = SendWr::new(
            1,
            SendOp::RdmaWrite {
                remote_addr: b.mr.addr + 100,
                rkey: Rkey(b.mr.rkey),
            },
            &sges,
        );
        let _ = a.engine.post_send(a.qp, &wr);

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
                b.engine.destroy_qp(b.qp).unwrap();
                b_open = false;
            } else {
                b.engine.handle_datagram(now, addr_a, datagram);
            }
            // Let the two talk for a bounded while.
            for _ in 0..32 {
                let mut moved = false;
                if let Some(t) = a.engine.poll_transmit(now, &mut buf) {
                    t.seal(&mut buf, 0);
                    b.engine.handle_datagram(now, addr_a, &buf[..t.len]);
                    moved = true;
                }
                if let Some(t) = b.engine.poll_transmit(now, &mut buf) {
                    t.seal(&mut buf, 0);
                    a.engine.handle_datagram(now, addr_b, &buf[..t.len]);
                    moved = true;
                }
                if !moved {
                    break;
                }
            }
            now += Duration::from_millis(1);
            a.engine.handle_timeout(now);
            b.engine.handle_timeout(now);
            while a.engine.poll_event().is_some() || b.engine.poll_event().is_some() {}
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
