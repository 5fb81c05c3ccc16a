//! Real-socket robustness: a dead peer, hostile datagrams, completion channels.

use softverbs::*;
use softverbs_wire::icrc::{fill, IcrcContext};
use softverbs_wire::{BthRepr, Opcode, PacketRepr, Psn, RethRepr};
use std::net::UdpSocket;
use std::time::{Duration, Instant};

struct End {
    ctx: Context,
    _pd: Pd,
    cq: Cq,
    qp: Qp,
    mr: Mr<Vec<u8>>,
}

fn all_access() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC
}

fn end(channel: bool) -> (End, Option<CompletionChannel>) {
    let ctx = Device::with_config("test", Config::default())
        .open()
        .unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let ch = channel.then(|| ctx.create_comp_channel().unwrap());
    let cq = ctx.create_cq(256, ch.as_ref()).unwrap();
    let qp = QpBuilder::new(&pd, &cq).build().unwrap();
    let mr = pd.reg_mr(vec![0u8; 1 << 16], all_access()).unwrap();
    (
        End {
            ctx,
            _pd: pd,
            cq,
            qp,
            mr,
        },
        ch,
    )
}

fn connect(x: &End, y: &End, timeout: u8, retry_cnt: u8) {
    for (me, peer) in [(x, y), (y, x)] {
        me.qp
            .to_init(InitAttr {
                access: all_access(),
            })
            .unwrap();
        let remote = RemoteQp::from_gid(peer.ctx.gid(), peer.qp.qpn(), 0);
        me.qp
            .to_rtr(RtrAttr {
                remote,
                mtu: Mtu::Mtu1024,
                max_dest_rd_atomic: 4,
                min_rnr_timer: 1,
            })
            .unwrap();
        me.qp
            .to_rts(RtsAttr {
                sq_psn: 0,
                timeout,
                retry_cnt,
                rnr_retry: 7,
                max_rd_atomic: 4,
            })
            .unwrap();
    }
}

#[test]
fn dead_peer_gives_retry_exceeded_then_flush() {
    let (a, _) = end(false);
    let (b, _) = end(false);
    connect(&a, &b, 10, 3); // 4.2 ms local ACK timeout, 3 retries
    drop(b); // the peer's device closes: nothing answers any more
    let rkey = Rkey(0x1234);
    for i in 0..3 {
        let sges = [a.mr.sge(0, 100)];
        a.qp.post_send(&SendWr::new(
            i,
            SendOp::RdmaWrite {
                remote_addr: 0x1000,
                rkey,
            },
            &sges,
        ))
        .unwrap();
    }
    let start = Instant::now();
    let wcs = a.cq.wait_for(3, Duration::from_secs(20));
    let statuses: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(
        statuses,
        vec![
            (0, WcStatus::RetryExcErr),
            (1, WcStatus::WrFlushErr),
            (2, WcStatus::WrFlushErr)
        ]
    );
    assert!(start.elapsed() < Duration::from_secs(10));
    assert_eq!(a.qp.query().qp_state, QpState::Err);
    assert_eq!(a.ctx.counters().ack_timeouts, 4);
}

fn packet(opcode: Opcode, dest: Qpn, psn: u32, reth: Option<RethRepr>, payload: &[u8]) -> Vec<u8> {
    let mut repr = PacketRepr::new(BthRepr::new(opcode, dest, Psn::new(psn)), payload);
    repr.reth = reth;
    let mut buf = vec![0u8; repr.buffer_len()];
    repr.emit(&mut buf).unwrap();
    buf
}

/// A QP on `e` connected to a plain UDP socket posing as the peer (QPN 0x99).
fn qp_facing(e: &End, peer: std::net::SocketAddr, pd: &Pd) -> Qp {
    let qp = QpBuilder::new(pd, &e.cq).build().unwrap();
    qp.to_init(InitAttr {
        access: all_access(),
    })
    .unwrap();
    let remote = RemoteQp {
        addr: peer,
        qpn: Qpn::new(0x99),
        psn: 0,
    };
    qp.to_rtr(RtrAttr {
        remote,
        mtu: Mtu::Mtu1024,
        max_dest_rd_atomic: 4,
        min_rnr_timer: 1,
    })
    .unwrap();
    qp.to_rts(RtsAttr::default()).unwrap();
    qp
}

#[test]
fn hostile_datagrams_leave_the_device_working() {
    let (a, _) = end(false);
    let (b, _) = end(false);
    connect(&a, &b, 14, 7);
    b.mr.write(0, &[0x5a; 1 << 16]);
    let attacker = UdpSocket::bind("127.0.0.1:0").unwrap();
    attacker
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let from = attacker.local_addr().unwrap();
    let target = b.ctx.local_addr();
    let sealed = |mut p: Vec<u8>| {
        fill(&IcrcContext::new(from, target), &mut p).unwrap();
        p
    };
    let reth = |va: u64, rkey: u32, len: u32| {
        Some(RethRepr {
            va,
            rkey: Rkey(rkey),
            dma_len: len,
        })
    };
    let (addr, rkey, qpn) = (b.mr.addr(), b.mr.rkey(), b.qp.qpn());

    // Garbage, and well-formed packets the device must drop before any QP.
    let mut dropped: Vec<Vec<u8>> = vec![vec![0xff; 3], (0..=255u8).collect(), vec![0u8; 2000]];
    dropped.push(sealed(packet(
        Opcode::RcSendOnly,
        Qpn::new(0x3ff0),
        0,
        None,
        b"x",
    ))); // unknown QPN
    dropped.push(sealed(packet(Opcode::RcSendOnly, qpn, 0, None, b"hello"))); // not the QP's peer
    dropped.push(sealed(packet(
        Opcode::RcWriteOnly,
        qpn,
        0,
        reth(addr, rkey, 4),
        b"evil",
    ))); // not the peer
    let mut bad = sealed(packet(Opcode::RcSendOnly, qpn, 0, None, b"hi"));
    let n = bad.len();
    bad[n - 1] ^= 1; // ICRC
    dropped.push(bad);
    for p in &dropped {
        attacker.send_to(p, target).unwrap();
    }

    // QPs that do face the attacker: each hostile request is answered by the NAK
    // IBA names, and nothing outside the rules touches memory.
    let pd = b._pd.clone();
    let victims: Vec<(Qp, Vec<u8>, u8)> = vec![
        // Wrong PSN: NAK PSN sequence error (0x60), QP stays usable.
        (
            qp_facing(&b, from, &pd),
            packet(
                Opcode::RcWriteOnly,
                Qpn::new(0),
                77,
                reth(addr, rkey, 4),
                b"evil",
            ),
            0x60,
        ),
        // Bad rkey: NAK remote access error (0x62).
        (
            qp_facing(&b, from, &pd),
            packet(
                Opcode::RcWriteOnly,
                Qpn::new(0),
                0,
                reth(addr, rkey ^ 0x100, 4),
                b"evil",
            ),
            0x62,
        ),
        // Past the end of the region: remote access error.
        (
            qp_facing(&b, from, &pd),
            packet(
                Opcode::RcWriteOnly,
                Qpn::new(0),
                0,
                reth(addr + (1 << 16) - 2, rkey, 4),
                b"evil",
            ),
            0x62,
        ),
        // A READ of 2 GiB + 1: NAK invalid request (0x61).
        (
            qp_facing(&b, from, &pd),
            packet(
                Opcode::RcReadRequest,
                Qpn::new(0),
                0,
                reth(addr, rkey, (1 << 31) + 1),
                b"",
            ),
            0x61,
        ),
    ];
    for (qp, pkt, want) in &victims {
        let mut pkt = pkt.clone();
        pkt[5..8].copy_from_slice(&qp.qpn().value().to_be_bytes()[1..]);
        attacker.send_to(&sealed(pkt), target).unwrap();
        let mut buf = [0u8; 256];
        let (len, src) = attacker.recv_from(&mut buf).unwrap();
        assert_eq!(src, target);
        assert_eq!(buf[0], Opcode::RcAcknowledge.value(), "an ACK packet");
        assert_eq!(
            &buf[5..8],
            &[0, 0, 0x99],
            "to the QP the victim is connected to"
        );
        assert_eq!(buf[12], *want, "AETH syndrome");
        assert!(len >= 20);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while b.ctx.counters().drop_malformed < 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let c = b.ctx.counters();
    assert_eq!(c.drop_malformed, 2, "{c:?}");
    assert_eq!(c.drop_icrc, 2, "{c:?}");
    assert_eq!(c.drop_unknown_qp, 1, "{c:?}");
    assert_eq!(c.drop_wrong_source, 2, "{c:?}");
    assert_eq!((c.nak_seq_sent, c.nak_error_sent), (1, 3), "{c:?}");
    assert_eq!(victims[0].0.query().qp_state, QpState::Rts);
    assert!(victims[1..]
        .iter()
        .all(|(qp, _, _)| qp.query().qp_state == QpState::Err));
    // Memory untouched and the real connection still works.
    let mut mem = vec![0u8; 1 << 16];
    b.mr.read(0, &mut mem);
    assert!(mem.iter().all(|&x| x == 0x5a));
    assert_eq!(b.qp.query().qp_state, QpState::Rts);
    a.mr.write(0, b"still alive");
    let sges = [a.mr.sge(0, 11)];
    a.qp.post_send(&SendWr::new(
        1,
        SendOp::RdmaWrite {
            remote_addr: addr,
            rkey: Rkey(rkey),
        },
        &sges,
    ))
    .unwrap();
    assert_eq!(
        a.cq.wait_for(1, Duration::from_secs(10))[0].status,
        WcStatus::Success
    );
    let mut got = [0u8; 11];
    b.mr.read(0, &mut got);
    assert_eq!(&got, b"still alive");
}

#[test]
fn completion_channel_is_a_blocking_pollable_fd() {
    let (a, _) = end(false);
    let (b, ch) = end(true);
    let ch = ch.unwrap();
    connect(&a, &b, 14, 7);
    // Nothing armed, nothing pending: the fd is not readable.
    assert!(ch.get_event_timeout(Duration::from_millis(20)).is_none());
    b.cq.req_notify(false).unwrap();
    b.qp.post_recv(9, &[b.mr.sge(0, 64)]).unwrap();
    let sges = [a.mr.sge(0, 16)];
    a.qp.post_send(&SendWr::new(1, SendOp::Send, &sges))
        .unwrap();
    // A thread blocks on the channel and wakes up for the completion.
    let cq_handle = b.cq.handle();
    let got = std::thread::scope(|s| s.spawn(|| ch.get_event()).join().unwrap());
    assert_eq!(got.unwrap(), cq_handle);
    b.cq.ack_events(1);
    let wcs = b.cq.wait_for(1, Duration::from_secs(5));
    assert_eq!((wcs[0].wr_id, wcs[0].status), (9, WcStatus::Success));
    // Solicited-only: an unsolicited SEND does not fire, a solicited one does.
    b.cq.req_notify(true).unwrap();
    for (id, flags) in [
        (2u64, SendFlags::SIGNALED),
        (3, SendFlags::SIGNALED | SendFlags::SOLICITED),
    ] {
        b.qp.post_recv(id, &[b.mr.sge(0, 64)]).unwrap();
        let mut wr = SendWr::new(id, SendOp::Send, &sges);
        wr.flags = flags;
        a.qp.post_send(&wr).unwrap();
        let wcs = b.cq.wait_for(1, Duration::from_secs(5));
        assert_eq!(wcs[0].wr_id, id);
        let fired = ch.get_event_timeout(Duration::from_millis(50));
        assert_eq!(
            fired.is_some(),
            id == 3,
            "solicited-only notification for wr {id}"
        );
    }
}

#[test]
fn async_events_block_and_poll() {
    let (a, _) = end(false);
    let (b, _) = end(false);
    connect(&a, &b, 14, 7);
    // The port came up when the device opened.
    assert_eq!(b.ctx.get_async_event().unwrap(), AsyncEvent::PortActive);
    // A WRITE with a bad rkey: B's QP raises an access error event.
    let sges = [a.mr.sge(0, 8)];
    let wr = SendWr::new(
        1,
        SendOp::RdmaWrite {
            remote_addr: b.mr.addr(),
            rkey: Rkey(b.mr.rkey() ^ 0x100),
        },
        &sges,
    );
    a.qp.post_send(&wr).unwrap();
    // The async fd becomes readable, and the blocking call returns the event.
    let fd = b.ctx.async_fd();
    let mut pfd = [PollFd {
        fd,
        events: 1,
        revents: 0,
    }];
    // SAFETY: `pfd` is a live array of one pollfd.
    let n = unsafe { poll(pfd.as_mut_ptr(), 1, 10_000) };
    assert_eq!(n, 1, "async fd readable");
    let ev = b.ctx.get_async_event().unwrap();
    assert!(matches!(ev, AsyncEvent::QpAccessError(_)), "{ev:?}");
    b.ctx.ack_async_event(&ev);
    assert_eq!(
        a.cq.wait_for(1, Duration::from_secs(10))[0].status,
        WcStatus::RemAccessErr
    );
}

#[repr(C)]
struct PollFd {
    fd: i32,
    events: i16,
    revents: i16,
}

extern "C" {
    fn poll(fds: *mut PollFd, nfds: u64, timeout: i32) -> i32;
}
