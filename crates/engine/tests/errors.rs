//! Every NAK and error-completion path of the RC transport.
//!
//! For each error the requester's completion status is checked, then that the
//! requester QP is in ERR and every later work request is flushed (WR_FLUSH_ERR,
//! in post order), then the responder's QP state, async event and counters, and
//! that no memory changed that the failed request may not touch.
//!
//! Most tests run a lossless [`Pair`] through the simulator. The PSN-sequence and
//! duplicate tests drive the engines by hand instead: they take the datagrams an
//! engine wants to send and hand them (or copies, or not) to the other engine, so
//! the exact packets are known.

mod common;

use common::*;
use softverbs_engine::timers;
use softverbs_engine::*;
use softverbs_sim::Faults;
use softverbs_wire::{AethSyndrome, NakCode, Opcode, RocePacket};
use std::net::SocketAddr;
use std::time::Duration;

// ----- helpers -----

/// `(wr_id, status)` of each completion.
fn st(wcs: &[WorkCompletion]) -> Vec<(u64, WcStatus)> {
    wcs.iter().map(|w| (w.wr_id, w.status)).collect()
}

fn events(p: &mut Pair, end: End) -> Vec<AsyncEvent> {
    let mut out = Vec::new();
    while let Some(e) = p.engine(end).poll_event() {
        out.push(e);
    }
    out
}

fn counters(p: &mut Pair, end: End) -> Counters {
    p.engine(end).counters()
}

fn other(end: End) -> End {
    match end {
        End::A => End::B,
        End::B => End::A,
    }
}

/// Registers `len` bytes at `offset` of an end's buffer as another region of `pd`.
fn reg(
    p: &mut Pair,
    end: End,
    pd: PdHandle,
    offset: usize,
    len: usize,
    access: AccessFlags,
) -> MrInfo {
    let side = p.side_mut(end);
    assert!(offset + len <= side.buf.len());
    // SAFETY: the range lies inside the side's boxed buffer, which never moves and
    // outlives the engine (`Pair` drops `sim` before the sides).
    let ptr = unsafe { side.buf.as_mut_ptr().add(offset) };
    let node = side.node;
    // SAFETY: as above.
    unsafe { p.sim.node_mut(node).reg_mr(pd, ptr, len, access) }.unwrap()
}

fn all_access() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC
}

/// Asserts two memory images are equal, naming the first differing byte.
fn assert_mem(label: &str, what: &str, got: &[u8], want: &[u8]) {
    assert_eq!(got.len(), want.len());
    if let Some(i) = got.iter().zip(want).position(|(g, w)| g != w) {
        panic!(
            "{label}: {what} changed at byte {i}: {:#04x}, expected {:#04x}",
            got[i], want[i]
        );
    }
}

fn inline_send(wr_id: u64, data: &[u8]) -> SendWr<'_> {
    SendWr {
        wr_id,
        op: SendOp::Send,
        payload: Payload::Inline(data),
        flags: SendFlags::SIGNALED,
    }
}

/// The datagrams an engine wants to send now (taken, not delivered).
fn drain(p: &mut Pair, end: End) -> Vec<Vec<u8>> {
    let now = p.sim.now();
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let mut out = Vec::new();
    while let Some(t) = p.engine(end).poll_transmit(now, &mut buf) {
        t.seal(&mut buf, 0); // as a driver sending it alone would
        out.push(buf[..t.len].to_vec());
    }
    out
}

/// Hands `pkt` to `to` as if it came from the other end.
fn deliver(p: &mut Pair, to: End, pkt: &[u8]) {
    let src: SocketAddr = p.sim.addr(p.side(other(to)).node);
    let now = p.sim.now();
    p.engine(to).handle_datagram(now, src, pkt);
}

fn parse(pkt: &[u8]) -> RocePacket<&[u8]> {
    RocePacket::new_checked(pkt).expect("the engine emits well-formed packets")
}

fn psn_of(pkt: &[u8]) -> u32 {
    parse(pkt).bth().psn().value()
}

fn syndrome_of(pkt: &[u8]) -> Option<AethSyndrome> {
    parse(pkt)
        .aeth()
        .map(|a| AethSyndrome::from_byte(a.syndrome()).unwrap())
}

// Layout of the buffers (64 KiB each).
/// Source of the WRITEs the requester issues.
const SRC: usize = 0;
/// Where READs land at the requester.
const READ_DST: usize = 1024;
/// Where atomic results land at the requester.
const ATOMIC_DST: usize = 2048;
/// Where the "good" request before the bad one lands at the responder.
const GOOD: usize = 60_000;
/// A second region registered on the responder for key/bounds tests.
const REG_OFF: usize = 16_384;
const REG_LEN: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Write,
    Read,
    CmpSwap,
    FetchAdd,
}

const ALL_OPS: [Op; 4] = [Op::Write, Op::Read, Op::CmpSwap, Op::FetchAdd];

impl Op {
    fn needs(self) -> AccessFlags {
        match self {
            Op::Write => AccessFlags::REMOTE_WRITE,
            Op::Read => AccessFlags::REMOTE_READ,
            Op::CmpSwap | Op::FetchAdd => AccessFlags::REMOTE_ATOMIC,
        }
    }

    fn is_atomic(self) -> bool {
        matches!(self, Op::CmpSwap | Op::FetchAdd)
    }
}

/// A remote operation from A on `va`/`rkey` at B, with its local SGE.
fn remote(p: &Pair, op: Op, va: u64, rkey: Rkey) -> (SendOp, Sge) {
    match op {
        Op::Write => (
            SendOp::RdmaWrite {
                remote_addr: va,
                rkey,
            },
            p.sge(End::A, SRC, 64),
        ),
        Op::Read => (
            SendOp::RdmaRead {
                remote_addr: va,
                rkey,
            },
            p.sge(End::A, READ_DST, 64),
        ),
        Op::CmpSwap => (
            SendOp::AtomicCmpSwap {
                remote_addr: va,
                rkey,
                compare: 0,
                swap: 0x1111_2222_3333_4444,
            },
            p.sge(End::A, ATOMIC_DST, 8),
        ),
        Op::FetchAdd => (
            SendOp::AtomicFetchAdd {
                remote_addr: va,
                rkey,
                add: 1,
            },
            p.sge(End::A, ATOMIC_DST, 8),
        ),
    }
}

/// Runs one remote error: A posts a good request (1), the bad one (2), a WRITE (3)
/// and a SEND (4). Checks everything the spec says about the outcome and returns
/// B's receive completions for the caller to check. `later` is how many packets
/// of the bad request follow the one the responder refuses; `scratch` is a range
/// of B's buffer whose contents the failure leaves undefined (a receive buffer
/// a failed SEND was partly placed in).
fn nak_case(
    p: &mut Pair,
    label: &str,
    bad: SendWr<'_>,
    status: WcStatus,
    event: fn(QpHandle) -> AsyncEvent,
) -> Vec<WorkCompletion> {
    nak_case_multi(p, label, bad, 0, 0..0, status, event)
}

fn nak_case_multi(
    p: &mut Pair,
    label: &str,
    bad: SendWr<'_>,
    later: u64,
    scratch: std::ops::Range<usize>,
    status: WcStatus,
    event: fn(QpHandle) -> AsyncEvent,
) -> Vec<WorkCompletion> {
    let len_a = p.a.buf.len();
    let len_b = p.b.buf.len();
    p.fill(End::A, 0, len_a, 0x11);
    p.fill(End::B, 0, len_b, 0x77);
    let before_a = p.a.buf.to_vec();
    let before_b = p.b.buf.to_vec();

    // The good request before the bad one: a WRITE, or a READ where the QP does
    // not allow WRITEs.
    let use_read = !p.opts.qp_access.contains(AccessFlags::REMOTE_WRITE);
    let rkey = p.rkey(End::B);
    let good_va = p.addr(End::B, GOOD);
    let (good_op, good_sge) = if use_read {
        (
            SendOp::RdmaRead {
                remote_addr: good_va,
                rkey,
            },
            p.sge(End::A, 8192, 64),
        )
    } else {
        (
            SendOp::RdmaWrite {
                remote_addr: good_va,
                rkey,
            },
            p.sge(End::A, SRC, 64),
        )
    };
    p.post_send(End::A, &SendWr::new(1, good_op, &[good_sge]))
        .unwrap();
    assert_eq!(bad.wr_id, 2);
    p.post_send(End::A, &bad).unwrap();
    let after_sge = p.sge(End::A, SRC, 64);
    let after_va = p.addr(End::B, GOOD + 1000);
    p.post_send(
        End::A,
        &SendWr::new(
            3,
            SendOp::RdmaWrite {
                remote_addr: after_va,
                rkey,
            },
            &[after_sge],
        ),
    )
    .unwrap();
    p.post_send(End::A, &inline_send(4, b"after the error"))
        .unwrap();

    p.run_until_send_cqes(End::A, 4)
        .unwrap_or_else(|e| panic!("{label}: {e:?}"));
    p.settle();
    let wcs = p.poll_send(End::A);
    assert_eq!(
        st(&wcs),
        vec![
            (1, WcStatus::Success),
            (2, status),
            (3, WcStatus::WrFlushErr),
            (4, WcStatus::WrFlushErr)
        ],
        "{label}"
    );
    assert_eq!(p.qp_state(End::A), QpState::Err, "{label}: requester state");
    assert_eq!(p.qp_state(End::B), QpState::Err, "{label}: responder state");
    let qp_b = p.b.qp;
    assert_eq!(
        events(p, End::B),
        vec![event(qp_b)],
        "{label}: responder event"
    );
    assert_eq!(events(p, End::A), vec![], "{label}: requester events");
    let (ca, cb) = (counters(p, End::A), counters(p, End::B));
    assert_eq!(cb.nak_error_sent, 1, "{label}: {cb:?}");
    assert_eq!(ca.nak_error_received, 1, "{label}: {ca:?}");
    // The rest of the bad request, and requests 3 and 4, reached a responder
    // already in ERR.
    assert_eq!(cb.drop_bad_state, later + 2, "{label}: {cb:?}");
    assert_eq!(cb.nak_seq_sent + cb.rnr_nak_sent, 0, "{label}: {cb:?}");

    // Only the good request touched memory.
    let mut want_a = before_a;
    let mut want_b = before_b;
    if use_read {
        want_a[8192..8192 + 64].copy_from_slice(&want_b[GOOD..GOOD + 64]);
    } else {
        want_b[GOOD..GOOD + 64].copy_from_slice(&want_a[SRC..SRC + 64]);
    }
    want_b[scratch.clone()].copy_from_slice(&p.b.buf[scratch]);
    assert_mem(label, "requester memory", &p.a.buf, &want_a);
    assert_mem(label, "responder memory", &p.b.buf, &want_b);

    // Posting to a QP in ERR completes at once with a flush error.
    p.post_send(End::A, &inline_send(5, b"late")).unwrap();
    assert_eq!(
        st(&p.poll_send(End::A)),
        vec![(5, WcStatus::WrFlushErr)],
        "{label}"
    );
    p.poll_recv(End::B)
}

/// A remote error for every operation kind, with the address and key `target`
/// computes on a fresh pair.
fn remote_error_matrix(
    name: &str,
    opts: PairOpts,
    status: WcStatus,
    event: fn(QpHandle) -> AsyncEvent,
    mut target: impl FnMut(&mut Pair, Op) -> (u64, Rkey),
    ops: &[Op],
) {
    for &op in ops {
        let label = format!("{name} / {op:?}");
        let mut p = Pair::new(3, Faults::none(), opts.clone());
        let (va, rkey) = target(&mut p, op);
        let (bop, sge) = remote(&p, op, va, rkey);
        let recvs = nak_case(&mut p, &label, SendWr::new(2, bop, &[sge]), status, event);
        assert!(recvs.is_empty(), "{label}: {recvs:?}");
    }
}

fn access_error(name: &str, target: impl FnMut(&mut Pair, Op) -> (u64, Rkey)) {
    remote_error_matrix(
        name,
        PairOpts::default(),
        WcStatus::RemAccessErr,
        AsyncEvent::QpAccessError,
        target,
        &ALL_OPS,
    );
}

/// A region of B at [`REG_OFF`] with every access right.
fn second_region(p: &mut Pair) -> MrInfo {
    let pd = p.b.pd;
    reg(p, End::B, pd, REG_OFF, REG_LEN, all_access())
}

// ----- remote access errors (NAK Remote Access Error) -----

#[test]
fn rem_access_invalid_rkey_unknown_slot() {
    access_error("rkey naming no region", |p, _| {
        (p.addr(End::B, 0), Rkey(p.b.mr.rkey ^ 0x0000_4200))
    });
}

#[test]
fn rem_access_invalid_rkey_wrong_key_byte() {
    access_error("rkey with a stale key byte", |p, _| {
        (p.addr(End::B, 0), Rkey(p.b.mr.rkey ^ 0x5a))
    });
}

#[test]
fn rem_access_rkey_of_another_pd() {
    access_error("rkey of another PD", |p, _| {
        let pd2 = p.engine(End::B).alloc_pd().unwrap();
        let mr = reg(p, End::B, pd2, REG_OFF, REG_LEN, all_access());
        (mr.addr, Rkey(mr.rkey))
    });
}

#[test]
fn rem_access_region_lacks_the_right() {
    access_error("region without the remote right", |p, op| {
        let pd = p.b.pd;
        // LOCAL_WRITE stays: REMOTE_WRITE and REMOTE_ATOMIC need it.
        let access = all_access().without(op.needs());
        let mr = reg(p, End::B, pd, REG_OFF, REG_LEN, access);
        (mr.addr + 64, Rkey(mr.rkey))
    });
}

#[test]
fn rem_access_starts_before_region() {
    access_error("range starting before the region", |p, _| {
        let mr = second_region(p);
        (mr.addr - 8, Rkey(mr.rkey))
    });
}

#[test]
fn rem_access_ends_past_region() {
    access_error("range ending past the region", |p, op| {
        let mr = second_region(p);
        let va = if op.is_atomic() {
            // The first (aligned) word after the region.
            mr.addr + REG_LEN as u64
        } else {
            mr.addr + REG_LEN as u64 - 32
        };
        (va, Rkey(mr.rkey))
    });
}

#[test]
fn rem_access_address_plus_length_overflows() {
    access_error("address + length wraps", |p, _| {
        let mr = second_region(p);
        (u64::MAX - 7, Rkey(mr.rkey))
    });
}

#[test]
fn rem_access_deregistered_region() {
    access_error("deregistered region", |p, _| {
        let mr = second_region(p);
        p.engine(End::B).dereg_mr(mr.handle).unwrap();
        (mr.addr, Rkey(mr.rkey))
    });
}

#[test]
fn rem_access_multi_packet_write_past_region_writes_nothing() {
    // 3 packets; only the first carries the RETH, whose length covers all.
    let mut p = Pair::lossless();
    let mr = second_region(&mut p);
    let va = mr.addr + REG_LEN as u64 - 2048;
    let sges = [p.sge(End::A, SRC, 3000)];
    let wr = SendWr::new(
        2,
        SendOp::RdmaWrite {
            remote_addr: va,
            rkey: Rkey(mr.rkey),
        },
        &sges,
    );
    let recvs = nak_case_multi(
        &mut p,
        "3-packet WRITE past the region",
        wr,
        2,
        0..0,
        WcStatus::RemAccessErr,
        AsyncEvent::QpAccessError,
    );
    assert!(recvs.is_empty());
}

// ----- invalid requests (NAK Invalid Request) -----

#[test]
fn rem_inv_req_qp_lacks_remote_write() {
    let opts = PairOpts {
        qp_access: AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC,
        ..PairOpts::default()
    };
    remote_error_matrix(
        "QP without REMOTE_WRITE",
        opts,
        WcStatus::RemInvReqErr,
        AsyncEvent::QpRequestError,
        |p, _| (p.addr(End::B, 0), p.rkey(End::B)),
        &[Op::Write],
    );
}

#[test]
fn rem_inv_req_qp_lacks_remote_read() {
    let opts = PairOpts {
        qp_access: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC,
        ..PairOpts::default()
    };
    remote_error_matrix(
        "QP without REMOTE_READ",
        opts,
        WcStatus::RemInvReqErr,
        AsyncEvent::QpRequestError,
        |p, _| (p.addr(End::B, 0), p.rkey(End::B)),
        &[Op::Read],
    );
}

#[test]
fn rem_inv_req_qp_lacks_remote_atomic() {
    let opts = PairOpts {
        qp_access: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        ..PairOpts::default()
    };
    remote_error_matrix(
        "QP without REMOTE_ATOMIC",
        opts,
        WcStatus::RemInvReqErr,
        AsyncEvent::QpRequestError,
        |p, _| (p.addr(End::B, 0), p.rkey(End::B)),
        &[Op::CmpSwap, Op::FetchAdd],
    );
}

#[test]
fn rem_inv_req_misaligned_atomic() {
    for misalign in [1u64, 4, 7] {
        remote_error_matrix(
            &format!("atomic at 8n+{misalign}"),
            PairOpts::default(),
            WcStatus::RemInvReqErr,
            AsyncEvent::QpRequestError,
            |p, _| (p.addr(End::B, 256) + misalign, p.rkey(End::B)),
            &[Op::CmpSwap, Op::FetchAdd],
        );
    }
}

#[test]
fn rem_inv_req_read_and_atomic_without_responder_resources() {
    let opts = PairOpts {
        max_dest_rd_atomic: 0,
        ..PairOpts::default()
    };
    remote_error_matrix(
        "max_dest_rd_atomic = 0",
        opts,
        WcStatus::RemInvReqErr,
        AsyncEvent::QpRequestError,
        |p, _| (p.addr(End::B, 256), p.rkey(End::B)),
        &[Op::Read, Op::CmpSwap, Op::FetchAdd],
    );
}

/// A SEND longer than the receive buffer: the receive completes LOC_LEN_ERR, the
/// requester REM_INV_REQ_ERR; the next receive is flushed.
fn send_too_long(label: &str, recv_len: u32, send_len: u32, later: u64) {
    let mut p = Pair::lossless();
    let r0 = p.sge(End::B, 30_000, recv_len);
    let r1 = p.sge(End::B, 40_000, 8192);
    p.post_recv(End::B, 100, &[r0]).unwrap();
    p.post_recv(End::B, 101, &[r1]).unwrap();
    let sge = p.sge(End::A, SRC, send_len);
    let recvs = nak_case_multi(
        &mut p,
        label,
        SendWr::new(2, SendOp::Send, &[sge]),
        later,
        30_000..30_000 + recv_len as usize,
        WcStatus::RemInvReqErr,
        AsyncEvent::QpRequestError,
    );
    assert_eq!(
        st(&recvs),
        vec![(100, WcStatus::LocLenErr), (101, WcStatus::WrFlushErr)],
        "{label}"
    );
}

#[test]
fn rem_inv_req_send_longer_than_receive() {
    send_too_long("1-packet SEND, 200 into 100", 100, 200, 0);
}

#[test]
fn rem_inv_req_multi_packet_send_longer_than_receive() {
    // The first packet fits, the second does not; the third finds the QP in ERR.
    send_too_long("3-packet SEND, 3000 into 1500", 1500, 3000, 1);
}

#[test]
fn rem_inv_req_send_with_invalidate_of_ordinary_rkey() {
    for which in [
        "ordinary region",
        "no region",
        "other PD, remote-invalidatable",
    ] {
        let label = format!("SEND with Invalidate: {which}");
        let mut p = Pair::lossless();
        let rkey = match which {
            "ordinary region" => p.rkey(End::B),
            "no region" => Rkey(0x00ab_cd00),
            _ => {
                let pd2 = p.engine(End::B).alloc_pd().unwrap();
                let ptr = p.b.buf[REG_OFF..].as_mut_ptr();
                // SAFETY: inside B's boxed buffer, which outlives the engine.
                let mr = unsafe {
                    p.engine(End::B)
                        .reg_mr_remote_invalidate(pd2, ptr, REG_LEN, all_access())
                }
                .unwrap();
                Rkey(mr.rkey)
            }
        };
        let r0 = p.sge(End::B, 30_000, 4096);
        let r1 = p.sge(End::B, 40_000, 4096);
        p.post_recv(End::B, 100, &[r0]).unwrap();
        p.post_recv(End::B, 101, &[r1]).unwrap();
        let sge = p.sge(End::A, SRC, 64);
        let recvs = nak_case(
            &mut p,
            &label,
            SendWr::new(2, SendOp::SendWithInv { rkey }, &[sge]),
            WcStatus::RemInvReqErr,
            AsyncEvent::QpRequestError,
        );
        assert_eq!(recvs.len(), 2, "{label}: {recvs:?}");
        assert_eq!(recvs[0].wr_id, 100, "{label}");
        assert_ne!(recvs[0].status, WcStatus::Success, "{label}");
        assert_eq!(recvs[0].invalidated_rkey, None, "{label}");
        assert_eq!(recvs[1].wr_id, 101, "{label}");
        assert_eq!(recvs[1].status, WcStatus::WrFlushErr, "{label}");
    }
}

#[test]
fn send_with_invalidate_then_the_key_is_dead() {
    let mut p = Pair::lossless();
    let pd = p.b.pd;
    let ptr = p.b.buf[REG_OFF..].as_mut_ptr();
    // SAFETY: inside B's boxed buffer, which outlives the engine.
    let mr = unsafe {
        p.engine(End::B)
            .reg_mr_remote_invalidate(pd, ptr, REG_LEN, all_access())
    }
    .unwrap();
    let rkey = Rkey(mr.rkey);
    // The key works before.
    let sge = p.sge(End::A, SRC, 64);
    p.post_send(
        End::A,
        &SendWr::new(
            1,
            SendOp::RdmaWrite {
                remote_addr: mr.addr,
                rkey,
            },
            &[sge],
        ),
    )
    .unwrap();
    let r0 = p.sge(End::B, 30_000, 4096);
    p.post_recv(End::B, 100, &[r0]).unwrap();
    p.post_send(
        End::A,
        &SendWr::new(2, SendOp::SendWithInv { rkey }, &[sge]),
    )
    .unwrap();
    p.run_until_send_cqes(End::A, 2).unwrap();
    p.run_until_cqes(End::B, 0, 1).unwrap();
    assert_eq!(
        st(&p.poll_send(End::A)),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    let r = p.poll_recv(End::B);
    assert_eq!(st(&r), vec![(100, WcStatus::Success)]);
    assert_eq!(r[0].invalidated_rkey, Some(rkey));
    assert_eq!(r[0].byte_len, 64);
    // Now the key is dead: the same WRITE is a remote access error.
    let recvs = nak_case(
        &mut p,
        "WRITE with an invalidated rkey",
        SendWr::new(
            2,
            SendOp::RdmaWrite {
                remote_addr: mr.addr,
                rkey,
            },
            &[sge],
        ),
        WcStatus::RemAccessErr,
        AsyncEvent::QpAccessError,
    );
    assert!(recvs.is_empty());
}

// ----- remote operational error -----

#[test]
fn rem_op_err_receive_sge_with_invalid_lkey() {
    for which in ["unknown lkey", "region without LOCAL_WRITE"] {
        let label = format!("receive SGE: {which}");
        let mut p = Pair::lossless();
        let lkey = if which == "unknown lkey" {
            0x00de_ad00
        } else {
            let pd = p.b.pd;
            reg(
                &mut p,
                End::B,
                pd,
                REG_OFF,
                REG_LEN,
                AccessFlags::REMOTE_READ,
            )
            .lkey
        };
        let r0 = Sge {
            addr: p.addr(End::B, REG_OFF),
            length: 1024,
            lkey,
        };
        let r1 = p.sge(End::B, 40_000, 4096);
        p.post_recv(End::B, 100, &[r0]).unwrap();
        p.post_recv(End::B, 101, &[r1]).unwrap();
        let sge = p.sge(End::A, SRC, 64);
        let recvs = nak_case(
            &mut p,
            &label,
            SendWr::new(2, SendOp::Send, &[sge]),
            WcStatus::RemOpErr,
            AsyncEvent::QpFatal,
        );
        assert_eq!(
            st(&recvs),
            vec![(100, WcStatus::LocProtErr), (101, WcStatus::WrFlushErr)],
            "{label}"
        );
    }
}

// ----- local errors at the requester -----

/// A WR that fails locally: nothing goes on the wire, the QP goes to ERR, the
/// WRs after it are flushed; the peer notices nothing.
fn local_case(p: &mut Pair, label: &str, bad: SendWr<'_>, status: WcStatus) {
    let len_b = p.b.buf.len();
    p.fill(End::B, 0, len_b, 0x33);
    let before_b = p.b.buf.to_vec();
    assert_eq!(bad.wr_id, 1);
    p.post_send(End::A, &bad).unwrap();
    let sge = p.sge(End::A, SRC, 64);
    let va = p.addr(End::B, GOOD);
    let rkey = p.rkey(End::B);
    p.post_send(
        End::A,
        &SendWr::new(
            2,
            SendOp::RdmaWrite {
                remote_addr: va,
                rkey,
            },
            &[sge],
        ),
    )
    .unwrap();
    p.post_send(End::A, &inline_send(3, b"x")).unwrap();
    // Nothing goes on the wire, so run until idle (`run_until` would report
    // `Idle` from the very step that produced the completions).
    p.settle();
    assert_eq!(
        st(&p.poll_send(End::A)),
        vec![
            (1, status),
            (2, WcStatus::WrFlushErr),
            (3, WcStatus::WrFlushErr)
        ],
        "{label}"
    );
    assert_eq!(p.qp_state(End::A), QpState::Err, "{label}");
    assert_eq!(p.qp_state(End::B), QpState::Rts, "{label}");
    let (ca, cb) = (counters(p, End::A), counters(p, End::B));
    assert_eq!(ca.tx_packets, 0, "{label}: {ca:?}");
    assert_eq!(cb.rx_packets, 0, "{label}: {cb:?}");
    assert_eq!(events(p, End::A), vec![], "{label}");
    assert_eq!(events(p, End::B), vec![], "{label}");
    assert_mem(label, "responder memory", &p.b.buf, &before_b);
    p.post_send(End::A, &inline_send(4, b"late")).unwrap();
    assert_eq!(st(&p.poll_send(End::A)), vec![(4, WcStatus::WrFlushErr)]);
}

#[test]
fn loc_prot_err_bad_lkey() {
    type SgeList = fn(&Pair) -> Vec<Sge>;
    let cases: [(&str, SgeList); 4] = [
        ("unknown lkey", |p| {
            vec![Sge {
                lkey: 0x00ee_ee00,
                ..p.sge(End::A, SRC, 64)
            }]
        }),
        ("stale key byte", |p| {
            vec![Sge {
                lkey: p.a.mr.lkey ^ 0x01,
                ..p.sge(End::A, SRC, 64)
            }]
        }),
        ("second SGE bad", |p| {
            vec![
                p.sge(End::A, SRC, 64),
                Sge {
                    lkey: 0x00ee_ee00,
                    ..p.sge(End::A, 128, 64)
                },
            ]
        }),
        ("SGE past the region", |p| {
            vec![p.sge(End::A, p.a.buf.len() - 32, 64)]
        }),
    ];
    for (name, sges) in cases {
        for write in [false, true] {
            let mut p = Pair::lossless();
            let sges = sges(&p);
            let op = if write {
                SendOp::RdmaWrite {
                    remote_addr: p.addr(End::B, 0),
                    rkey: p.rkey(End::B),
                }
            } else {
                SendOp::Send
            };
            let label = format!("{name} ({op:?})");
            local_case(
                &mut p,
                &label,
                SendWr::new(1, op, &sges),
                WcStatus::LocProtErr,
            );
        }
    }
}

#[test]
fn loc_prot_err_read_or_atomic_into_region_without_local_write() {
    for op in [Op::Read, Op::CmpSwap, Op::FetchAdd] {
        let mut p = Pair::lossless();
        let pd = p.a.pd;
        let ro = reg(&mut p, End::A, pd, 4096, 4096, AccessFlags::REMOTE_READ);
        let (bop, _) = remote(&p, op, p.addr(End::B, 256), p.rkey(End::B));
        let len = if op == Op::Read { 64 } else { 8 };
        let sge = Sge {
            addr: ro.addr,
            length: len,
            lkey: ro.lkey,
        };
        local_case(
            &mut p,
            &format!("{op:?} into a region without LOCAL_WRITE"),
            SendWr::new(1, bop, &[sge]),
            WcStatus::LocProtErr,
        );
    }
}

#[test]
fn loc_len_err_atomic_local_sge_not_8_bytes() {
    for op in [Op::CmpSwap, Op::FetchAdd] {
        for len in [0u32, 4, 16] {
            let mut p = Pair::lossless();
            let (bop, _) = remote(&p, op, p.addr(End::B, 256), p.rkey(End::B));
            let sges = if len == 0 {
                vec![]
            } else {
                vec![p.sge(End::A, ATOMIC_DST, len)]
            };
            local_case(
                &mut p,
                &format!("{op:?} with a {len}-byte result buffer"),
                SendWr::new(1, bop, &sges),
                WcStatus::LocLenErr,
            );
        }
    }
}

#[test]
fn loc_qp_op_err_read_or_atomic_with_max_rd_atomic_0() {
    for op in [Op::Read, Op::CmpSwap, Op::FetchAdd] {
        let opts = PairOpts {
            max_rd_atomic: 0,
            ..PairOpts::default()
        };
        let mut p = Pair::new(5, Faults::none(), opts);
        let (bop, sge) = remote(&p, op, p.addr(End::B, 256), p.rkey(End::B));
        local_case(
            &mut p,
            &format!("{op:?} with max_rd_atomic 0"),
            SendWr::new(1, bop, &[sge]),
            WcStatus::LocQpOpErr,
        );
    }
}

#[test]
fn post_errors_queue_nothing() {
    let mut p = Pair::lossless();
    let rkey = p.rkey(End::B);
    let va = p.addr(End::B, 0);
    let write = SendOp::RdmaWrite {
        remote_addr: va,
        rkey,
    };
    // Too many SGEs (the QP has 4).
    let sges: Vec<Sge> = (0..5).map(|i| p.sge(End::A, i * 64, 64)).collect();
    assert_eq!(
        p.post_send(End::A, &SendWr::new(900, write, &sges)),
        Err(PostError::TooManySge)
    );
    // Inline data beyond max_inline_data (128).
    let long = [7u8; 129];
    assert_eq!(
        p.post_send(End::A, &inline_send(901, &long)),
        Err(PostError::InlineTooLong)
    );
    // Inline READ.
    let read = SendWr {
        wr_id: 902,
        op: SendOp::RdmaRead {
            remote_addr: va,
            rkey,
        },
        payload: Payload::Inline(b"12345678"),
        flags: SendFlags::SIGNALED,
    };
    assert_eq!(p.post_send(End::A, &read), Err(PostError::InvalidOpcode));
    // Receive side: too many SGEs.
    let rsges: Vec<Sge> = (0..5).map(|i| p.sge(End::B, i * 64, 64)).collect();
    assert_eq!(p.post_recv(End::B, 903, &rsges), Err(PostError::TooManySge));
    // Fill the send queue (64 deep), then one more.
    let depth = p.opts.cap.max_send_wr as u64;
    for i in 0..depth {
        let data = [i as u8; 8];
        let wr = SendWr {
            wr_id: i,
            op: SendOp::RdmaWrite {
                remote_addr: va + i * 8,
                rkey,
            },
            payload: Payload::Inline(&data),
            flags: SendFlags::SIGNALED,
        };
        p.post_send(End::A, &wr).unwrap();
    }
    assert_eq!(
        p.post_send(End::A, &inline_send(904, b"one too many")),
        Err(PostError::QueueFull)
    );
    // Fill the receive queue too.
    let rdepth = p.opts.cap.max_recv_wr as u64;
    for i in 0..rdepth {
        let s = p.sge(End::B, 4096, 64);
        p.post_recv(End::B, 1000 + i, &[s]).unwrap();
    }
    let s = p.sge(End::B, 4096, 64);
    assert_eq!(p.post_recv(End::B, 905, &[s]), Err(PostError::QueueFull));

    p.run_until_send_cqes(End::A, depth as usize).unwrap();
    p.settle();
    let wcs = p.poll_send(End::A);
    let want: Vec<(u64, WcStatus)> = (0..depth).map(|i| (i, WcStatus::Success)).collect();
    assert_eq!(st(&wcs), want, "exactly the accepted WRs complete");
    for i in 0..depth as usize {
        assert_eq!(p.bytes(End::B, i * 8, 8), [i as u8; 8]);
    }
    assert_eq!(p.poll_recv(End::B), vec![], "no receive consumed");
    assert_eq!(p.qp_state(End::A), QpState::Rts);
    assert_eq!(p.qp_state(End::B), QpState::Rts);
}

// ----- the peer falls silent: transport retries -----

fn silent_peer(retry_cnt: u8) {
    let timeout = 12;
    let opts = PairOpts {
        retry_cnt,
        timeout,
        ..PairOpts::default()
    };
    let mut p = Pair::new(11, Faults::none(), opts);
    let (a, b) = (p.a.node, p.b.node);
    p.sim.partition(a, b, true);
    let rkey = p.rkey(End::B);
    let va = p.addr(End::B, 0);
    let wsge = p.sge(End::A, SRC, 64);
    let rsge = p.sge(End::A, READ_DST, 64);
    let asge = p.sge(End::A, ATOMIC_DST, 8);
    p.post_send(
        End::A,
        &SendWr::new(
            1,
            SendOp::RdmaWrite {
                remote_addr: va,
                rkey,
            },
            &[wsge],
        ),
    )
    .unwrap();
    p.post_send(End::A, &inline_send(2, b"hello")).unwrap();
    p.post_send(
        End::A,
        &SendWr::new(
            3,
            SendOp::RdmaRead {
                remote_addr: va,
                rkey,
            },
            &[rsge],
        ),
    )
    .unwrap();
    p.post_send(
        End::A,
        &SendWr::new(
            4,
            SendOp::AtomicFetchAdd {
                remote_addr: va,
                rkey,
                add: 1,
            },
            &[asge],
        ),
    )
    .unwrap();
    let start = p.sim.now();
    p.run_until_send_cqes(End::A, 4).unwrap();
    let elapsed = p.sim.now() - start;
    assert_eq!(
        st(&p.poll_send(End::A)),
        vec![
            (1, WcStatus::RetryExcErr),
            (2, WcStatus::WrFlushErr),
            (3, WcStatus::WrFlushErr),
            (4, WcStatus::WrFlushErr)
        ]
    );
    assert_eq!(p.qp_state(End::A), QpState::Err);
    let ca = counters(&mut p, End::A);
    let attempts = u64::from(retry_cnt) + 1;
    assert_eq!(ca.ack_timeouts, attempts, "{ca:?}");
    // Go-back-N: every attempt sends all four requests again. Besides, one
    // tail-loss probe (the newest request again) before anything was measured,
    // in the first attempt: it counts no retry.
    assert_eq!(ca.tail_loss_probes, 1, "{ca:?}");
    assert_eq!(ca.tx_packets, 4 * attempts + 1, "{ca:?}");
    assert_eq!(
        ca.retransmitted_packets,
        4 * u64::from(retry_cnt) + 1,
        "{ca:?}"
    );
    let t = timers::ack_timeout(timeout).unwrap();
    let expected = t * (u32::from(retry_cnt) + 1);
    assert!(
        elapsed >= expected && elapsed < expected + t / 2,
        "elapsed {elapsed:?}, expected about {expected:?}"
    );
    assert_eq!(events(&mut p, End::A), vec![]);
    p.settle();
    let cb = counters(&mut p, End::B);
    assert_eq!(cb.rx_packets, 0);
    assert_eq!(p.qp_state(End::B), QpState::Rts);
    assert_eq!(p.sim.stats().partitioned, 4 * attempts + 1);
}

#[test]
fn retry_exceeded_after_retry_cnt_retries() {
    silent_peer(7);
    silent_peer(3);
}

#[test]
fn retry_exceeded_with_retry_cnt_0() {
    silent_peer(0);
}

#[test]
fn ack_timeout_0_waits_forever() {
    let opts = PairOpts {
        timeout: 0,
        ..PairOpts::default()
    };
    let mut p = Pair::new(12, Faults::none(), opts);
    let (a, b) = (p.a.node, p.b.node);
    p.sim.partition(a, b, true);
    p.post_send(End::A, &inline_send(1, b"into the void"))
        .unwrap();
    p.sim.run_for(Duration::from_secs(60), limits()).unwrap();
    assert_eq!(p.poll_send(End::A), vec![]);
    assert_eq!(counters(&mut p, End::A).ack_timeouts, 0);
    assert_eq!(p.qp_state(End::A), QpState::Rts);
}

#[test]
fn silent_peer_comes_back_before_retries_run_out() {
    let opts = PairOpts {
        retry_cnt: 7,
        timeout: 12,
        ..PairOpts::default()
    };
    let mut p = Pair::new(13, Faults::none(), opts);
    let (a, b) = (p.a.node, p.b.node);
    p.sim.partition(a, b, true);
    let r = p.sge(End::B, 0, 64);
    p.post_recv(End::B, 100, &[r]).unwrap();
    p.post_send(End::A, &inline_send(1, b"patience")).unwrap();
    let t = timers::ack_timeout(12).unwrap();
    // Three timeouts pass, then the network heals.
    p.sim.run_for(t * 3 + t / 2, limits()).unwrap();
    assert_eq!(counters(&mut p, End::A).ack_timeouts, 3);
    p.sim.partition(a, b, false);
    p.run_until_send_cqes(End::A, 1).unwrap();
    assert_eq!(st(&p.poll_send(End::A)), vec![(1, WcStatus::Success)]);
    assert_eq!(st(&p.poll_recv(End::B)), vec![(100, WcStatus::Success)]);
    assert_eq!(p.bytes(End::B, 0, 8), b"patience");
    assert_eq!(counters(&mut p, End::A).ack_timeouts, 4);
}

// ----- receiver not ready -----

#[test]
fn rnr_retry_exceeded() {
    for rnr_retry in [3u8, 0] {
        let min_rnr_timer = 14;
        let opts = PairOpts {
            rnr_retry,
            min_rnr_timer,
            ..PairOpts::default()
        };
        let mut p = Pair::new(21, Faults::none(), opts);
        let len_b = p.b.buf.len();
        p.fill(End::B, 0, len_b, 0x5c);
        let before_b = p.b.buf.to_vec();
        p.post_send(End::A, &inline_send(1, b"nobody listens"))
            .unwrap();
        // A WRITE behind the SEND must not run either.
        let sge = p.sge(End::A, SRC, 64);
        let va = p.addr(End::B, GOOD);
        let rkey = p.rkey(End::B);
        p.post_send(
            End::A,
            &SendWr::new(
                2,
                SendOp::RdmaWrite {
                    remote_addr: va,
                    rkey,
                },
                &[sge],
            ),
        )
        .unwrap();
        let start = p.sim.now();
        p.run_until_send_cqes(End::A, 2).unwrap();
        let elapsed = p.sim.now() - start;
        assert_eq!(
            st(&p.poll_send(End::A)),
            vec![(1, WcStatus::RnrRetryExcErr), (2, WcStatus::WrFlushErr)],
            "rnr_retry {rnr_retry}"
        );
        p.settle();
        let (ca, cb) = (counters(&mut p, End::A), counters(&mut p, End::B));
        let naks = u64::from(rnr_retry) + 1;
        assert_eq!(ca.rnr_nak_received, naks, "{ca:?}");
        assert_eq!(cb.rnr_nak_sent, naks, "{cb:?}");
        assert_eq!(ca.ack_timeouts, 0, "{ca:?}");
        assert_eq!(cb.nak_error_sent, 0, "{cb:?}");
        // Waits of the RNR timer between the NAKs, plus round trips.
        let d = timers::rnr_delay(min_rnr_timer);
        let waits = d * u32::from(rnr_retry);
        assert!(
            elapsed >= waits && elapsed < waits + Duration::from_millis(1),
            "rnr_retry {rnr_retry}: elapsed {elapsed:?}, RNR waits {waits:?}"
        );
        assert_eq!(p.qp_state(End::A), QpState::Err);
        // RNR is not an error at the responder.
        assert_eq!(p.qp_state(End::B), QpState::Rts);
        assert_eq!(events(&mut p, End::B), vec![]);
        assert_eq!(p.poll_recv(End::B), vec![]);
        assert_mem("RNR", "responder memory", &p.b.buf, &before_b);
    }
}

#[test]
fn rnr_timer_follows_min_rnr_timer() {
    // The wait between RNR NAKs is the responder's min_rnr_timer, whatever it is.
    for code in [1u8, 9, 18] {
        let opts = PairOpts {
            rnr_retry: 2,
            min_rnr_timer: code,
            ..PairOpts::default()
        };
        let mut p = Pair::new(22, Faults::none(), opts);
        p.post_send(End::A, &inline_send(1, b"x")).unwrap();
        let start = p.sim.now();
        p.run_until_send_cqes(End::A, 1).unwrap();
        let elapsed = p.sim.now() - start;
        assert_eq!(
            st(&p.poll_send(End::A)),
            vec![(1, WcStatus::RnrRetryExcErr)]
        );
        let waits = timers::rnr_delay(code) * 2;
        // Three round trips of 20 µs on the simulated link.
        let rtts = Duration::from_micros(60);
        assert!(
            elapsed >= waits + rtts && elapsed < waits + rtts + Duration::from_micros(10),
            "code {code}: elapsed {elapsed:?}, expected {:?}",
            waits + rtts
        );
    }
}

#[test]
fn rnr_retry_7_retries_forever_then_succeeds() {
    let min_rnr_timer = 14;
    let opts = PairOpts {
        rnr_retry: 7,
        min_rnr_timer,
        ..PairOpts::default()
    };
    let mut p = Pair::new(23, Faults::none(), opts);
    p.post_send(End::A, &inline_send(1, b"eventually")).unwrap();
    p.sim.run_for(Duration::from_secs(1), limits()).unwrap();
    assert_eq!(p.poll_send(End::A), vec![], "still waiting");
    let ca = counters(&mut p, End::A);
    let per_cycle = timers::rnr_delay(min_rnr_timer) + Duration::from_micros(20);
    let cycles = (Duration::from_secs(1).as_nanos() / per_cycle.as_nanos()) as u64;
    assert!(
        ca.rnr_nak_received + 2 >= cycles && ca.rnr_nak_received <= cycles + 2,
        "{} RNR NAKs in 1 s, expected about {cycles}",
        ca.rnr_nak_received
    );
    assert_eq!(ca.ack_timeouts, 0);
    assert_eq!(p.qp_state(End::A), QpState::Rts);
    let r = p.sge(End::B, 0, 64);
    p.post_recv(End::B, 100, &[r]).unwrap();
    p.run_until_send_cqes(End::A, 1).unwrap();
    assert_eq!(st(&p.poll_send(End::A)), vec![(1, WcStatus::Success)]);
    let rw = p.poll_recv(End::B);
    assert_eq!(st(&rw), vec![(100, WcStatus::Success)]);
    assert_eq!(rw[0].byte_len, 10);
    assert_eq!(p.bytes(End::B, 0, 10), b"eventually");
    assert_eq!(p.qp_state(End::B), QpState::Rts);
}

// ----- PSN sequence error -----

#[test]
fn nak_seq_sent_once_for_a_lost_middle_packet() {
    // Plain IBA go-back-N (selective repeat: see `loss.rs`).
    let mut p = Pair::lossless_go_back_n();
    let n = 16usize;
    let len = n * 1024;
    p.fill(End::A, 0, len, 9);
    let len_b = p.b.buf.len();
    p.fill(End::B, 0, len_b, 0xa5);
    let before_b = p.b.buf.to_vec();
    let sge = p.sge(End::A, 0, len as u32);
    let va = p.addr(End::B, 0);
    let rkey = p.rkey(End::B);
    p.post_send(
        End::A,
        &SendWr::new(
            1,
            SendOp::RdmaWrite {
                remote_addr: va,
                rkey,
            },
            &[sge],
        ),
    )
    .unwrap();
    let pkts = drain(&mut p, End::A);
    assert_eq!(pkts.len(), n);
    let psns: Vec<u32> = pkts.iter().map(|b| psn_of(b)).collect();
    let lost = 3;
    for (i, pkt) in pkts.iter().enumerate() {
        if i != lost {
            deliver(&mut p, End::B, pkt);
        }
    }
    let answers = drain(&mut p, End::B);
    assert_eq!(answers.len(), 1, "one NAK for the whole gap");
    assert_eq!(parse(&answers[0]).opcode(), Opcode::RcAcknowledge);
    assert_eq!(
        psn_of(&answers[0]),
        psns[lost],
        "the NAK names the PSN expected"
    );
    assert_eq!(
        syndrome_of(&answers[0]),
        Some(AethSyndrome::Nak(NakCode::PsnSequenceError))
    );
    let cb = counters(&mut p, End::B);
    assert_eq!(cb.nak_seq_sent, 1, "{cb:?}");
    assert_eq!(cb.drop_out_of_sequence, (n - lost - 2) as u64, "{cb:?}");
    // Nothing after the gap was written.
    assert_eq!(
        p.bytes(End::B, 0, lost * 1024),
        p.bytes(End::A, 0, lost * 1024)
    );
    assert_mem(
        "gap",
        "responder memory after the gap",
        &p.b.buf[lost * 1024..],
        &before_b[lost * 1024..],
    );
    // More out-of-sequence copies: still quiet.
    for pkt in &pkts[lost + 1..] {
        deliver(&mut p, End::B, pkt);
    }
    assert!(drain(&mut p, End::B).is_empty());
    assert_eq!(counters(&mut p, End::B).nak_seq_sent, 1);

    // The requester goes back to the missing packet and resends from there.
    deliver(&mut p, End::A, &answers[0]);
    let resent = drain(&mut p, End::A);
    let resent_psns: Vec<u32> = resent.iter().map(|b| psn_of(b)).collect();
    assert_eq!(resent_psns, psns[lost..].to_vec());
    let ca = counters(&mut p, End::A);
    assert_eq!(ca.nak_seq_received, 1);
    assert_eq!(ca.retransmitted_packets, (n - lost) as u64);
    for pkt in &resent {
        deliver(&mut p, End::B, pkt);
    }
    let acks = drain(&mut p, End::B);
    assert_eq!(acks.len(), 1);
    assert_eq!(psn_of(&acks[0]), psns[n - 1]);
    assert!(syndrome_of(&acks[0]).unwrap().is_ack());
    deliver(&mut p, End::A, &acks[0]);
    assert_eq!(st(&p.poll_send(End::A)), vec![(1, WcStatus::Success)]);
    assert_eq!(p.bytes(End::B, 0, len), p.bytes(End::A, 0, len));
    assert_eq!(counters(&mut p, End::B).nak_seq_sent, 1);
    assert_eq!(p.qp_state(End::A), QpState::Rts);
    assert_eq!(p.qp_state(End::B), QpState::Rts);
}

#[test]
fn lost_middle_packet_on_a_simulated_link_recovers() {
    // The fourth packet of a WRITE is lost; recovery then runs through the
    // simulator (NAK, go-back, ACK), without any ACK timeout. (Plain IBA
    // go-back-N; selective repeat: see `loss.rs`.)
    let mut p = Pair::lossless_go_back_n();
    let len = 16 * 1024;
    p.fill(End::A, 0, len, 3);
    let sge = p.sge(End::A, 0, len as u32);
    let va = p.addr(End::B, 0);
    let rkey = p.rkey(End::B);
    p.post_send(
        End::A,
        &SendWr::new(
            1,
            SendOp::RdmaWrite {
                remote_addr: va,
                rkey,
            },
            &[sge],
        ),
    )
    .unwrap();
    let pkts = drain(&mut p, End::A);
    for (i, pkt) in pkts.iter().enumerate() {
        if i != 3 {
            deliver(&mut p, End::B, pkt);
        }
    }
    p.run_until_send_cqes(End::A, 1).unwrap();
    assert_eq!(st(&p.poll_send(End::A)), vec![(1, WcStatus::Success)]);
    assert_eq!(p.bytes(End::B, 0, len), p.bytes(End::A, 0, len));
    assert_eq!(counters(&mut p, End::B).nak_seq_sent, 1);
    assert_eq!(counters(&mut p, End::A).ack_timeouts, 0);
}

// ----- duplicates -----

#[test]
fn duplicate_fetch_add_replays_the_cached_result() {
    let mut p = Pair::lossless();
    let word = 0x100;
    p.side_mut(End::B).buf[word..word + 8].copy_from_slice(&100u64.to_ne_bytes());
    let va = p.addr(End::B, word);
    let rkey = p.rkey(End::B);
    for (wr_id, add, dst) in [(1u64, 5u64, ATOMIC_DST), (2, 7, ATOMIC_DST + 8)] {
        let sge = p.sge(End::A, dst, 8);
        p.post_send(
            End::A,
            &SendWr::new(
                wr_id,
                SendOp::AtomicFetchAdd {
                    remote_addr: va,
                    rkey,
                    add,
                },
                &[sge],
            ),
        )
        .unwrap();
    }
    let reqs = drain(&mut p, End::A);
    assert_eq!(reqs.len(), 2);
    let read_word = |p: &Pair| u64::from_ne_bytes(p.bytes(End::B, word, 8).try_into().unwrap());
    let orig_of = |pkt: &[u8]| {
        let pkt = parse(pkt);
        assert_eq!(pkt.opcode(), Opcode::RcAtomicAcknowledge);
        pkt.atomic_ack_eth().unwrap().orig()
    };
    for r in &reqs {
        deliver(&mut p, End::B, r);
    }
    let acks = drain(&mut p, End::B);
    assert_eq!(acks.len(), 2);
    assert_eq!(
        acks.iter().map(|a| orig_of(a)).collect::<Vec<_>>(),
        vec![100, 105]
    );
    assert_eq!(read_word(&p), 112);

    // Both requests again, oldest first: replayed from the cache, not executed.
    let mut replays = Vec::new();
    for r in &reqs {
        deliver(&mut p, End::B, r);
        let out = drain(&mut p, End::B);
        assert_eq!(out.len(), 1);
        replays.push(out.into_iter().next().unwrap());
    }
    for (replay, ack) in replays.iter().zip(&acks) {
        assert_eq!(psn_of(replay), psn_of(ack));
        assert_eq!(orig_of(replay), orig_of(ack));
    }
    assert_eq!(read_word(&p), 112, "each FETCH_ADD ran exactly once");
    assert_eq!(counters(&mut p, End::B).duplicate_requests, 2);

    // The requester takes the first answers and ignores the replays.
    for a in acks.iter().chain(&replays) {
        deliver(&mut p, End::A, a);
    }
    assert_eq!(
        st(&p.poll_send(End::A)),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert_eq!(p.bytes(End::A, ATOMIC_DST, 8), 100u64.to_ne_bytes());
    assert_eq!(p.bytes(End::A, ATOMIC_DST + 8, 8), 105u64.to_ne_bytes());
    assert_eq!(p.qp_state(End::A), QpState::Rts);
    assert_eq!(p.qp_state(End::B), QpState::Rts);
}

#[test]
fn duplicate_cmp_swap_is_not_executed_again() {
    let mut p = Pair::lossless();
    let word = 0x200;
    p.side_mut(End::B).buf[word..word + 8].copy_from_slice(&1u64.to_ne_bytes());
    let va = p.addr(End::B, word);
    let rkey = p.rkey(End::B);
    // CAS 1 -> 2, then FETCH_ADD +10 (12), then the CAS again: a re-execution
    // would not swap (12 != 1) but would report 12.
    let s1 = p.sge(End::A, ATOMIC_DST, 8);
    let s2 = p.sge(End::A, ATOMIC_DST + 8, 8);
    p.post_send(
        End::A,
        &SendWr::new(
            1,
            SendOp::AtomicCmpSwap {
                remote_addr: va,
                rkey,
                compare: 1,
                swap: 2,
            },
            &[s1],
        ),
    )
    .unwrap();
    p.post_send(
        End::A,
        &SendWr::new(
            2,
            SendOp::AtomicFetchAdd {
                remote_addr: va,
                rkey,
                add: 10,
            },
            &[s2],
        ),
    )
    .unwrap();
    let reqs = drain(&mut p, End::A);
    for r in &reqs {
        deliver(&mut p, End::B, r);
    }
    let _ = drain(&mut p, End::B);
    deliver(&mut p, End::B, &reqs[0]);
    let replay = drain(&mut p, End::B);
    assert_eq!(replay.len(), 1);
    assert_eq!(parse(&replay[0]).atomic_ack_eth().unwrap().orig(), 1);
    assert_eq!(p.bytes(End::B, word, 8), 12u64.to_ne_bytes());
}

#[test]
fn duplicate_read_request_regenerates_the_responses() {
    let mut p = Pair::lossless();
    p.fill(End::B, 0, 3000, 42);
    let va = p.addr(End::B, 0);
    let rkey = p.rkey(End::B);
    let sge = p.sge(End::A, 8192, 3000);
    p.post_send(
        End::A,
        &SendWr::new(
            1,
            SendOp::RdmaRead {
                remote_addr: va,
                rkey,
            },
            &[sge],
        ),
    )
    .unwrap();
    let req = drain(&mut p, End::A);
    assert_eq!(req.len(), 1);
    deliver(&mut p, End::B, &req[0]);
    let first = drain(&mut p, End::B);
    assert_eq!(first.len(), 3);
    deliver(&mut p, End::B, &req[0]);
    let again = drain(&mut p, End::B);
    assert_eq!(again, first, "the same responses, byte for byte");
    assert_eq!(counters(&mut p, End::B).duplicate_requests, 1);
    for r in first.iter().chain(&again) {
        deliver(&mut p, End::A, r);
    }
    assert_eq!(st(&p.poll_send(End::A)), vec![(1, WcStatus::Success)]);
    assert_eq!(p.bytes(End::A, 8192, 3000), p.bytes(End::B, 0, 3000));
    assert_eq!(counters(&mut p, End::A).drop_out_of_sequence, 3);
    assert_eq!(p.qp_state(End::A), QpState::Rts);
}

#[test]
fn duplicate_send_is_acked_again_not_delivered_twice() {
    let mut p = Pair::lossless();
    for (id, off) in [(100u64, 0usize), (101, 4096)] {
        let s = p.sge(End::B, off, 1024);
        p.post_recv(End::B, id, &[s]).unwrap();
    }
    p.post_send(End::A, &inline_send(1, b"once only")).unwrap();
    let req = drain(&mut p, End::A);
    assert_eq!(req.len(), 1);
    deliver(&mut p, End::B, &req[0]);
    let ack1 = drain(&mut p, End::B);
    deliver(&mut p, End::B, &req[0]);
    let ack2 = drain(&mut p, End::B);
    assert_eq!(ack1.len(), 1);
    assert_eq!(ack2.len(), 1, "the duplicate is ACKed again");
    assert_eq!(psn_of(&ack2[0]), psn_of(&req[0]));
    assert!(syndrome_of(&ack2[0]).unwrap().is_ack());
    assert_eq!(st(&p.poll_recv(End::B)), vec![(100, WcStatus::Success)]);
    assert_eq!(counters(&mut p, End::B).duplicate_requests, 1);
    deliver(&mut p, End::A, &ack1[0]);
    deliver(&mut p, End::A, &ack2[0]);
    assert_eq!(st(&p.poll_send(End::A)), vec![(1, WcStatus::Success)]);
    // The next SEND takes the next receive.
    p.post_send(End::A, &inline_send(2, b"second")).unwrap();
    p.run_until_cqes(End::B, 0, 1).unwrap();
    assert_eq!(st(&p.poll_recv(End::B)), vec![(101, WcStatus::Success)]);
    assert_eq!(p.bytes(End::B, 4096, 6), b"second");
}

#[test]
fn duplicate_write_does_not_overwrite_later_data() {
    let mut p = Pair::lossless();
    let va = p.addr(End::B, 0);
    let rkey = p.rkey(End::B);
    let write = |wr_id, data: &'static [u8]| SendWr {
        wr_id,
        op: SendOp::RdmaWrite {
            remote_addr: va,
            rkey,
        },
        payload: Payload::Inline(data),
        flags: SendFlags::SIGNALED,
    };
    p.post_send(End::A, &write(1, b"old!")).unwrap();
    p.post_send(End::A, &write(2, b"new!")).unwrap();
    let reqs = drain(&mut p, End::A);
    assert_eq!(reqs.len(), 2);
    for r in &reqs {
        deliver(&mut p, End::B, r);
    }
    assert_eq!(p.bytes(End::B, 0, 4), b"new!");
    deliver(&mut p, End::B, &reqs[0]);
    assert_eq!(
        p.bytes(End::B, 0, 4),
        b"new!",
        "a duplicate is not executed"
    );
    let acks = drain(&mut p, End::B);
    assert!(!acks.is_empty());
    assert!(acks.iter().all(|a| syndrome_of(a).unwrap().is_ack()));
    for a in &acks {
        deliver(&mut p, End::A, a);
    }
    assert_eq!(
        st(&p.poll_send(End::A)),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
}

// ----- answers queued before an error NAK -----

#[test]
fn answers_queued_before_an_error_nak_still_go_out() {
    // The responder executes a FETCH_ADD, then NAKs the next request. The atomic
    // ACK was owed before the NAK: the requester must get the original value of a
    // word that did change, not a flush error.
    let mut p = Pair::lossless();
    let word = 0x100;
    p.side_mut(End::B).buf[word..word + 8].copy_from_slice(&40u64.to_ne_bytes());
    let va = p.addr(End::B, word);
    let rkey = p.rkey(End::B);
    let s1 = p.sge(End::A, ATOMIC_DST, 8);
    p.post_send(
        End::A,
        &SendWr::new(
            1,
            SendOp::AtomicFetchAdd {
                remote_addr: va,
                rkey,
                add: 2,
            },
            &[s1],
        ),
    )
    .unwrap();
    let s2 = p.sge(End::A, SRC, 64);
    p.post_send(
        End::A,
        &SendWr::new(
            2,
            SendOp::RdmaWrite {
                remote_addr: va,
                rkey: Rkey(0x00ba_d000),
            },
            &[s2],
        ),
    )
    .unwrap();
    let reqs = drain(&mut p, End::A);
    assert_eq!(reqs.len(), 2);
    // Both arrive before the responder gets to send anything.
    for r in &reqs {
        deliver(&mut p, End::B, r);
    }
    assert_eq!(p.bytes(End::B, word, 8), 42u64.to_ne_bytes());
    let answers = drain(&mut p, End::B);
    let kinds: Vec<(Opcode, u32)> = answers
        .iter()
        .map(|a| (parse(a).opcode(), psn_of(a)))
        .collect();
    assert_eq!(
        kinds,
        vec![
            (Opcode::RcAtomicAcknowledge, psn_of(&reqs[0])),
            (Opcode::RcAcknowledge, psn_of(&reqs[1]))
        ]
    );
    assert_eq!(
        syndrome_of(&answers[1]),
        Some(AethSyndrome::Nak(NakCode::RemoteAccessError))
    );
    for a in &answers {
        deliver(&mut p, End::A, a);
    }
    assert_eq!(
        st(&p.poll_send(End::A)),
        vec![(1, WcStatus::Success), (2, WcStatus::RemAccessErr)]
    );
    assert_eq!(p.bytes(End::A, ATOMIC_DST, 8), 40u64.to_ne_bytes());
}

#[test]
fn stale_duplicate_nak_costs_no_retry() {
    // W1 (PSN p) is lost, W2 (p+1) draws a sequence NAK for p; the requester goes
    // back and W1 is ACKed, so una = p+1 with W2 still unacknowledged. A late copy
    // of the same NAK (the network duplicated it) names p, already acknowledged:
    // it must be ignored — no retransmission, no retry spent. With retry_cnt 1 the
    // one retry left is what saves W2 when its resent copy is lost too.
    let opts = PairOpts {
        retry_cnt: 1,
        timeout: 12,
        selective_repeat: false,
        ..PairOpts::default()
    };
    let mut p = Pair::new(31, Faults::none(), opts);
    let va = p.addr(End::B, 0);
    let rkey = p.rkey(End::B);
    for (wr_id, data) in [(1u64, b"one!"), (2, b"two!")] {
        let wr = SendWr {
            wr_id,
            op: SendOp::RdmaWrite {
                remote_addr: va + (wr_id - 1) * 4,
                rkey,
            },
            payload: Payload::Inline(data),
            flags: SendFlags::SIGNALED,
        };
        p.post_send(End::A, &wr).unwrap();
    }
    let first = drain(&mut p, End::A);
    assert_eq!(first.len(), 2);
    deliver(&mut p, End::B, &first[1]);
    let nak = drain(&mut p, End::B);
    assert_eq!(nak.len(), 1);
    assert_eq!(
        syndrome_of(&nak[0]),
        Some(AethSyndrome::Nak(NakCode::PsnSequenceError))
    );
    deliver(&mut p, End::A, &nak[0]);
    let resent = drain(&mut p, End::A);
    assert_eq!(resent.len(), 2);
    deliver(&mut p, End::B, &resent[0]);
    let ack = drain(&mut p, End::B);
    assert_eq!(ack.len(), 1);
    assert_eq!(psn_of(&ack[0]), psn_of(&first[0]));
    deliver(&mut p, End::A, &ack[0]);
    assert_eq!(st(&p.poll_send(End::A)), vec![(1, WcStatus::Success)]);
    // The stale copy of the NAK.
    let before = counters(&mut p, End::A);
    deliver(&mut p, End::A, &nak[0]);
    assert!(
        drain(&mut p, End::A).is_empty(),
        "a stale NAK made the requester retransmit"
    );
    let after = counters(&mut p, End::A);
    assert_eq!(after.retransmitted_packets, before.retransmitted_packets);
    // W2's resent copy (resent[1]) is lost. The early timer (the RTT is known
    // from W1) sends it again as a tail-loss probe, before any ACK timeout; the
    // retry left is untouched either way, and W2 goes through.
    p.run_until_send_cqes(End::A, 1).unwrap();
    assert_eq!(st(&p.poll_send(End::A)), vec![(2, WcStatus::Success)]);
    assert_eq!(p.bytes(End::B, 0, 8), b"one!two!");
    let ca = counters(&mut p, End::A);
    assert_eq!((ca.ack_timeouts, ca.tail_loss_probes), (0, 1), "{ca:?}");
}

/// A NAK built by hand, as B would send it to A.
fn nak_to_a(p: &Pair, psn: u32, syndrome: AethSyndrome) -> Vec<u8> {
    use softverbs_wire::icrc::{self, IcrcContext};
    use softverbs_wire::{AethRepr, BthRepr, PacketRepr, Psn};
    let mut repr = PacketRepr::new(
        BthRepr::new(Opcode::RcAcknowledge, p.a.qpn, Psn::new(psn)),
        &[],
    );
    repr.aeth = Some(AethRepr { syndrome, msn: 0 });
    let mut buf = vec![0u8; repr.buffer_len()];
    let n = repr.emit(&mut buf).unwrap();
    buf.truncate(n);
    let (src, dst) = (p.sim.addr(p.b.node), p.sim.addr(p.a.node));
    icrc::fill(&IcrcContext::new(src, dst), &mut buf).unwrap();
    buf
}

/// A one-packet inline WRITE of `data` to `offset` of B's buffer.
fn post_inline_write(p: &mut Pair, wr_id: u64, offset: usize, data: &[u8]) {
    let wr = SendWr {
        wr_id,
        op: SendOp::RdmaWrite {
            remote_addr: p.addr(End::B, offset),
            rkey: p.rkey(End::B),
        },
        payload: Payload::Inline(data),
        flags: SendFlags::SIGNALED,
    };
    p.post_send(End::A, &wr).unwrap();
}

/// Fatal NAKs (invalid request, remote access, remote operational) naming a PSN the
/// requester has already seen acknowledged are stale (a delayed duplicate, or spoofed):
/// they are counted and ignored, whether the QP is idle or has work outstanding. Before,
/// such a NAK moved the QP to ERR and failed the oldest outstanding WQE, which did not
/// own the PSN.
#[test]
fn stale_fatal_naks_are_ignored() {
    for code in [
        NakCode::InvalidRequest,
        NakCode::RemoteAccessError,
        NakCode::RemoteOperationalError,
        NakCode::InvalidRdRequest,
    ] {
        let mut p = Pair::lossless();
        let first = p.opts.psn_a;
        post_inline_write(&mut p, 1, 0, b"one!");
        p.run_until_send_cqes(End::A, 1).unwrap();
        assert_eq!(st(&p.poll_send(End::A)), vec![(1, WcStatus::Success)]);
        // Idle: PSN `first` was acknowledged.
        let stale = nak_to_a(&p, first, AethSyndrome::Nak(code));
        let before = counters(&mut p, End::A);
        deliver(&mut p, End::A, &stale);
        assert_eq!(p.qp_state(End::A), QpState::Rts, "{code:?}: idle QP");
        assert_eq!(
            counters(&mut p, End::A).drop_out_of_sequence,
            before.drop_out_of_sequence + 1,
            "{code:?}: a stale NAK is counted"
        );
        // Live: W2 (PSN first + 1) outstanding, held back; the stale NAK again.
        post_inline_write(&mut p, 2, 4, b"two!");
        let held = drain(&mut p, End::A);
        assert_eq!(held.len(), 1);
        deliver(&mut p, End::A, &stale);
        assert_eq!(p.qp_state(End::A), QpState::Rts, "{code:?}: live QP");
        assert!(p.poll_send(End::A).is_empty(), "{code:?}: W2 failed");
        deliver(&mut p, End::B, &held[0]);
        p.run_until_send_cqes(End::A, 1).unwrap();
        assert_eq!(
            st(&p.poll_send(End::A)),
            vec![(2, WcStatus::Success)],
            "{code:?}"
        );
        assert_eq!(p.bytes(End::B, 0, 8), b"one!two!");
        assert!(events(&mut p, End::A).is_empty(), "{code:?}");
    }
}

/// A NAK fails the WQE that owns its PSN, not the oldest outstanding one: with W1 and
/// W2 outstanding, a remote access NAK for W2's PSN completes W1 (the NAK acknowledges
/// everything before its PSN) and fails W2.
#[test]
fn a_fatal_nak_fails_the_wqe_that_owns_its_psn() {
    let mut p = Pair::lossless();
    let first = p.opts.psn_a;
    post_inline_write(&mut p, 1, 0, b"one!");
    post_inline_write(&mut p, 2, 4, b"two!");
    post_inline_write(&mut p, 3, 8, b"six!");
    assert_eq!(drain(&mut p, End::A).len(), 3);
    let nak = nak_to_a(&p, first + 1, AethSyndrome::Nak(NakCode::RemoteAccessError));
    deliver(&mut p, End::A, &nak);
    assert_eq!(
        st(&p.poll_send(End::A)),
        vec![
            (1, WcStatus::Success),
            (2, WcStatus::RemAccessErr),
            (3, WcStatus::WrFlushErr)
        ]
    );
    assert_eq!(p.qp_state(End::A), QpState::Err);
}

/// An RNR NAK that arrives twice (the network duplicated it, or the responder answered
/// a duplicated request twice) while the requester waits out the first is one refusal,
/// not two: with rnr_retry 1 the SEND must still succeed once a receive is posted.
/// Before, the copy consumed the last RNR retry and the SEND failed with
/// RNR_RETRY_EXC_ERR.
#[test]
fn a_duplicated_rnr_nak_costs_one_rnr_retry() {
    let opts = PairOpts {
        rnr_retry: 1,
        min_rnr_timer: 14, // 1.28 ms
        ..PairOpts::default()
    };
    let mut p = Pair::new(41, Faults::none(), opts);
    p.post_send(End::A, &inline_send(1, b"not yet")).unwrap();
    let req = drain(&mut p, End::A);
    assert_eq!(req.len(), 1);
    deliver(&mut p, End::B, &req[0]);
    let rnr = drain(&mut p, End::B);
    assert_eq!(rnr.len(), 1);
    assert!(matches!(
        syndrome_of(&rnr[0]),
        Some(AethSyndrome::RnrNak { .. })
    ));
    deliver(&mut p, End::A, &rnr[0]);
    let before = counters(&mut p, End::A);
    deliver(&mut p, End::A, &rnr[0]);
    assert_eq!(st(&p.poll_send(End::A)), vec![], "the copy failed the SEND");
    assert_eq!(
        counters(&mut p, End::A).drop_out_of_sequence,
        before.drop_out_of_sequence + 1,
        "the copy is counted as stale"
    );
    let r = p.sge(End::B, 0, 64);
    p.post_recv(End::B, 100, &[r]).unwrap();
    p.run_until_send_cqes(End::A, 1).unwrap();
    assert_eq!(st(&p.poll_send(End::A)), vec![(1, WcStatus::Success)]);
    assert_eq!(st(&p.poll_recv(End::B)), vec![(100, WcStatus::Success)]);
    assert_eq!(p.bytes(End::B, 0, 7), b"not yet");
    assert_eq!(p.qp_state(End::A), QpState::Rts);
}

/// Takes up to `n` datagrams an engine wants to send (for engines that have many).
fn take(p: &mut Pair, end: End, n: usize) -> Vec<Vec<u8>> {
    let now = p.sim.now();
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let mut out = Vec::new();
    while out.len() < n {
        let Some(t) = p.engine(end).poll_transmit(now, &mut buf) else {
            break;
        };
        t.seal(&mut buf, 0);
        out.push(buf[..t.len].to_vec());
    }
    out
}

/// A READ's responses take one PSN each; PSN order is only defined within half the PSN
/// space (IBA 9.7.1), so a READ needing 2^23 or more responses (2 GiB at MTU 256) would
/// make its own request look new again to the responder once it ran: its
/// retransmission after a lost first response drew a sequence NAK instead of being
/// answered as a duplicate. The requester refuses such a READ with LOC_LEN_ERR and sends
/// nothing; the responder refuses one from a peer with NAK Invalid Request. The largest
/// READ allowed still recovers from a lost first response. (Both regions are 2 GiB of
/// untouched, lazily zeroed memory: only the packets exchanged here are touched.)
#[test]
fn reads_of_half_the_psn_space_are_refused() {
    const GIB2: usize = 1 << 31;
    let opts = PairOpts {
        mtu: Mtu::Mtu256,
        buf_len: GIB2,
        ..PairOpts::default()
    };
    let mut p = Pair::new(51, Faults::none(), opts);
    let first = p.opts.psn_a;
    let read = |p: &Pair, wr_id: u64, len: u32| {
        let sge = p.sge(End::A, 0, len);
        let op = SendOp::RdmaRead {
            remote_addr: p.addr(End::B, 0),
            rkey: p.rkey(End::B),
        };
        (SendWr::new(wr_id, op, &[]), sge)
    };

    // 2^31 bytes at MTU 256: 2^23 responses.
    let (wr, sge) = read(&p, 1, 1 << 31);
    p.post_send(
        End::A,
        &SendWr {
            payload: Payload::Sges(&[sge]),
            ..wr
        },
    )
    .unwrap();
    let sent = take(&mut p, End::A, 4);
    assert_eq!(sent.len(), 0, "the READ went on the wire");
    assert_eq!(st(&p.poll_send(End::A)), vec![(1, WcStatus::LocLenErr)]);
    assert_eq!(p.qp_state(End::A), QpState::Err);
    assert_eq!(p.qp_state(End::B), QpState::Rts);

    // The same READ from a (hostile) peer: NAK Invalid Request. The request is an
    // accepted READ's with its DMA length raised.
    let mut p = Pair::new(52, Faults::none(), p.opts.clone());
    let (small, small_sge) = read(&p, 1, 256);
    p.post_send(
        End::A,
        &SendWr {
            payload: Payload::Sges(&[small_sge]),
            ..small
        },
    )
    .unwrap();
    let mut req = take(&mut p, End::A, 1).remove(0);
    const RETH_DMA_LEN: usize = 12 + 12; // BTH, then VA and R_Key
    req[RETH_DMA_LEN..RETH_DMA_LEN + 4].copy_from_slice(&(1u32 << 31).to_be_bytes());
    let (src, dst) = (p.sim.addr(p.a.node), p.sim.addr(p.b.node));
    let ctx = softverbs_wire::icrc::IcrcContext::new(src, dst);
    softverbs_wire::icrc::fill(&ctx, &mut req).unwrap();
    deliver(&mut p, End::B, &req);
    let answer = take(&mut p, End::B, 4);
    assert_eq!(answer.len(), 1);
    assert_eq!(
        syndrome_of(&answer[0]),
        Some(AethSyndrome::Nak(NakCode::InvalidRequest))
    );
    assert_eq!(p.qp_state(End::B), QpState::Err);

    // The largest READ allowed: 2^23 - 1 responses. Its first response is lost; the
    // requester asks again from that PSN and the responder answers it as a duplicate.
    let mut p = Pair::new(53, Faults::none(), p.opts.clone());
    let len = ((1u32 << 23) - 1) * 256;
    let (wr, sge) = read(&p, 2, len);
    p.post_send(
        End::A,
        &SendWr {
            payload: Payload::Sges(&[sge]),
            ..wr
        },
    )
    .unwrap();
    let req = take(&mut p, End::A, 4);
    assert_eq!(req.len(), 1);
    deliver(&mut p, End::B, &req[0]);
    let responses = take(&mut p, End::B, 2);
    assert_eq!(psn_of(&responses[1]), first + 1);
    deliver(&mut p, End::A, &responses[1]); // the first is lost
    let again = take(&mut p, End::A, 4);
    assert_eq!(again.len(), 1, "the requester asks again");
    assert_eq!(psn_of(&again[0]), first);
    deliver(&mut p, End::B, &again[0]);
    let cb = counters(&mut p, End::B);
    assert_eq!((cb.duplicate_requests, cb.nak_seq_sent), (1, 0), "{cb:?}");
    assert_eq!(p.qp_state(End::B), QpState::Rts);
}
