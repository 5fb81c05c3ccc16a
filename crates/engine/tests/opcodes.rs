//! Every opcode's happy path over a lossless network: single- and multi-packet
//! messages (including exact multiples of the MTU and empty ones) at several
//! MTUs, scatter/gather lists on both sides, inline data, signaled and
//! unsignaled work requests, the solicited bit, completion order, fences, the
//! max_rd_atomic limit, and both ends sending at once.

mod common;
use common::*;
use softverbs_engine::*;
use softverbs_sim::Faults;
use softverbs_wire::{OpKind, RocePacket};

/// Fills message buffers with bytes that do not repeat with any short period
/// (unlike `Pair::fill`, whose pattern repeats every 256 bytes and so cannot see
/// a packet placed at the wrong multiple of the MTU).
trait Pattern {
    fn pattern(&mut self, end: End, offset: usize, len: usize, seed: u8);
}

impl Pattern for Pair {
    fn pattern(&mut self, end: End, offset: usize, len: usize, seed: u8) {
        let salt = u32::from(seed).wrapping_mul(0x85eb_ca6b);
        for (i, b) in self.side_mut(end).buf[offset..offset + len]
            .iter_mut()
            .enumerate()
        {
            *b = ((i as u32 ^ salt).wrapping_mul(0x9e37_79b1) >> 24) as u8;
        }
    }
}

const MTUS: [Mtu; 3] = [Mtu::Mtu256, Mtu::Mtu1024, Mtu::Mtu4096];
/// Where a message is taken from at its source.
const SRC: usize = 0;
/// Where a message is placed at its destination.
const DST: usize = 32 * 1024;
/// Bytes after (or between) placed data that must stay untouched.
const GUARD: usize = 64;
const SENTINEL: u8 = 0xe7;

/// A lossless pair whose send PSNs both start just before the 24-bit wrap, so
/// every multi-packet exchange crosses it.
fn pair_with(opts: PairOpts) -> Pair {
    Pair::new(
        7,
        Faults::none(),
        PairOpts {
            psn_a: 0xff_fffc,
            ..opts
        },
    )
}

fn pair(mtu: Mtu) -> Pair {
    pair_with(PairOpts {
        mtu,
        ..PairOpts::default()
    })
}

/// Message lengths to try at a path MTU of `mtu` bytes: empty, one byte, one
/// packet short of full, exactly one MTU, just over, exact multiples and a
/// ragged multi-packet length (with pad bytes).
fn lengths(mtu: u32) -> [u32; 8] {
    [0, 1, mtu - 1, mtu, mtu + 1, 2 * mtu, 3 * mtu, 3 * mtu + 5]
}

/// Packets a message of `len` bytes takes at `mtu`.
fn packets(len: u32, mtu: Mtu) -> u64 {
    u64::from(len.div_ceil(mtu.bytes()).max(1))
}

fn other(end: End) -> End {
    match end {
        End::A => End::B,
        End::B => End::A,
    }
}

/// Sets `len` bytes at `offset` of `end`'s buffer, and `GUARD` bytes after them,
/// to the sentinel.
fn clear(p: &mut Pair, end: End, offset: usize, len: usize) {
    p.side_mut(end).buf[offset..offset + len + GUARD].fill(SENTINEL);
}

fn assert_untouched(p: &Pair, end: End, offset: usize, len: usize, ctx: &str) {
    assert!(
        p.bytes(end, offset, len).iter().all(|&b| b == SENTINEL),
        "{ctx}: bytes {offset}..{} of {end:?} were written",
        offset + len
    );
}

/// A single SGE over the `len` bytes at `offset`, or none for an empty message.
fn sges(p: &Pair, end: End, offset: usize, len: u32) -> Vec<Sge> {
    if len == 0 {
        Vec::new()
    } else {
        vec![p.sge(end, offset, len)]
    }
}

/// Runs the network until nothing is left to happen; returns how many packets
/// A and B sent meanwhile.
fn settle_counting(p: &mut Pair) -> (u64, u64) {
    let a0 = p.engine(End::A).counters().tx_packets;
    let b0 = p.engine(End::B).counters().tx_packets;
    p.settle();
    let a1 = p.engine(End::A).counters().tx_packets;
    let b1 = p.engine(End::B).counters().tx_packets;
    (a1 - a0, b1 - b0)
}

fn one(wcs: Vec<WorkCompletion>, ctx: &str) -> WorkCompletion {
    assert_eq!(wcs.len(), 1, "{ctx}: expected one completion, got {wcs:?}");
    wcs[0]
}

/// A successful send-queue completion of `wr_id` on `end`'s QP.
fn assert_send_wc(p: &Pair, end: End, wc: &WorkCompletion, wr_id: u64, op: WcOpcode, ctx: &str) {
    assert_eq!(wc.status, WcStatus::Success, "{ctx}: {wc:?}");
    assert_eq!(wc.wr_id, wr_id, "{ctx}: {wc:?}");
    assert_eq!(wc.opcode, op, "{ctx}: {wc:?}");
    assert_eq!(wc.qp_num, p.side(end).qpn, "{ctx}: {wc:?}");
}

/// A successful receive completion of `wr_id` on `end`'s QP for a message of
/// `len` bytes from the other end.
fn assert_recv_wc(
    p: &Pair,
    end: End,
    wc: &WorkCompletion,
    wr_id: u64,
    op: WcOpcode,
    len: u32,
    ctx: &str,
) {
    assert_eq!(wc.status, WcStatus::Success, "{ctx}: {wc:?}");
    assert_eq!(wc.wr_id, wr_id, "{ctx}: {wc:?}");
    assert_eq!(wc.opcode, op, "{ctx}: {wc:?}");
    assert_eq!(wc.byte_len, len, "{ctx}: {wc:?}");
    assert_eq!(wc.qp_num, p.side(end).qpn, "{ctx}: {wc:?}");
    assert_eq!(wc.src_qp, p.side(other(end)).qpn, "{ctx}: {wc:?}");
}

/// Sends `len` bytes from A's `SRC` into a receive posted at B's `DST` with
/// `op` (a SEND flavour) and checks the packets, both completions and the data.
/// Returns the receive completion for opcode-specific checks.
fn send_message(
    p: &mut Pair,
    wr_id: u64,
    len: u32,
    op: SendOp,
    flags: SendFlags,
    ctx: &str,
) -> WorkCompletion {
    let mtu = p.opts.mtu;
    p.pattern(End::A, SRC, len as usize, wr_id as u8);
    clear(p, End::B, DST, 16 * 1024);
    let rsge = p.sge(End::B, DST, 16 * 1024);
    p.post_recv(End::B, 1000 + wr_id, &[rsge]).unwrap();
    let s = sges(p, End::A, SRC, len);
    p.post_send(
        End::A,
        &SendWr {
            wr_id,
            op,
            payload: Payload::Sges(&s),
            flags,
        },
    )
    .unwrap();
    let (a_tx, _) = settle_counting(p);
    assert_eq!(a_tx, packets(len, mtu), "{ctx}: request packets sent");
    let swc = one(p.poll_send(End::A), ctx);
    assert_send_wc(p, End::A, &swc, wr_id, WcOpcode::Send, ctx);
    let rwc = one(p.poll_recv(End::B), ctx);
    assert_recv_wc(p, End::B, &rwc, 1000 + wr_id, WcOpcode::Recv, len, ctx);
    let len = len as usize;
    assert_eq!(
        p.bytes(End::B, DST, len),
        p.bytes(End::A, SRC, len),
        "{ctx}: data"
    );
    assert_untouched(p, End::B, DST + len, GUARD, ctx);
    rwc
}

#[test]
fn send_every_length_at_every_mtu() {
    for mtu in MTUS {
        let mut p = pair(mtu);
        for (i, len) in lengths(mtu.bytes()).into_iter().enumerate() {
            let ctx = format!("SEND of {len} bytes at MTU {}", mtu.bytes());
            let wc = send_message(
                &mut p,
                i as u64,
                len,
                SendOp::Send,
                SendFlags::SIGNALED,
                &ctx,
            );
            assert_eq!(wc.imm_data, None, "{ctx}");
            assert_eq!(wc.invalidated_rkey, None, "{ctx}");
            assert!(!wc.solicited, "{ctx}");
        }
    }
}

#[test]
fn send_with_imm_every_length_at_every_mtu() {
    for mtu in MTUS {
        let mut p = pair(mtu);
        for (i, len) in lengths(mtu.bytes()).into_iter().enumerate() {
            let ctx = format!("SEND_WITH_IMM of {len} bytes at MTU {}", mtu.bytes());
            let imm = 0xdead_0000 | (i as u32) << 8 | mtu.bytes() >> 8;
            let wc = send_message(
                &mut p,
                i as u64,
                len,
                SendOp::SendWithImm { imm },
                SendFlags::SIGNALED,
                &ctx,
            );
            assert_eq!(wc.opcode, WcOpcode::Recv, "{ctx}");
            assert_eq!(wc.imm_data, Some(imm), "{ctx}");
            assert_eq!(wc.invalidated_rkey, None, "{ctx}");
        }
    }
}

/// Registers `len` bytes at `offset` of `end`'s buffer so that the peer may
/// invalidate the rkey with SEND with Invalidate.
fn reg_invalidatable(p: &mut Pair, end: End, offset: usize, len: usize) -> MrInfo {
    let pd = p.side(end).pd;
    let buf = &mut p.side_mut(end).buf;
    assert!(offset + len <= buf.len());
    // SAFETY: in bounds (checked above) of the side's boxed buffer.
    let addr = unsafe { buf.as_mut_ptr().add(offset) };
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    // SAFETY: the range lies in the side's boxed buffer, which never moves and
    // outlives the engine (the pair drops the simulator first).
    unsafe {
        p.engine(end)
            .reg_mr_remote_invalidate(pd, addr, len, access)
            .unwrap()
    }
}

/// RDMA WRITEs `len` bytes from A's `src` to B at `remote_addr` with `rkey`;
/// returns A's completion.
fn write_to(
    p: &mut Pair,
    wr_id: u64,
    src: usize,
    len: u32,
    remote_addr: u64,
    rkey: Rkey,
) -> WorkCompletion {
    let s = sges(p, End::A, src, len);
    p.post_send(
        End::A,
        &SendWr::new(wr_id, SendOp::RdmaWrite { remote_addr, rkey }, &s),
    )
    .unwrap();
    p.settle();
    one(p.poll_send(End::A), "WRITE")
}

#[test]
fn send_with_invalidate_every_length_at_every_mtu() {
    const REGION: usize = 56 * 1024;
    for mtu in MTUS {
        let mut p = pair(mtu);
        let lens = lengths(mtu.bytes());
        let mut last = None;
        for (i, len) in lens.into_iter().enumerate() {
            let ctx = format!("SEND_WITH_INV of {len} bytes at MTU {}", mtu.bytes());
            let mr = reg_invalidatable(&mut p, End::B, REGION, 1024);
            // The region works before it is invalidated.
            p.pattern(End::A, 20_000, 16, 0x40 + i as u8);
            let wc = write_to(&mut p, 500 + i as u64, 20_000, 16, mr.addr, Rkey(mr.rkey));
            assert_send_wc(&p, End::A, &wc, 500 + i as u64, WcOpcode::RdmaWrite, &ctx);
            assert_eq!(p.bytes(End::B, REGION, 16), p.bytes(End::A, 20_000, 16));

            let wc = send_message(
                &mut p,
                i as u64,
                len,
                SendOp::SendWithInv {
                    rkey: Rkey(mr.rkey),
                },
                SendFlags::SIGNALED,
                &ctx,
            );
            assert_eq!(wc.opcode, WcOpcode::Recv, "{ctx}");
            assert_eq!(wc.invalidated_rkey, Some(Rkey(mr.rkey)), "{ctx}");
            assert_eq!(wc.imm_data, None, "{ctx}");
            last = Some(mr);
        }
        // Afterwards the invalidated rkey no longer works, though the memory is
        // still registered under B's other region.
        let mr = last.unwrap();
        let before = p.bytes(End::B, REGION, 16).to_vec();
        p.pattern(End::A, 20_000, 16, 0x99);
        let wc = write_to(&mut p, 900, 20_000, 16, mr.addr, Rkey(mr.rkey));
        assert_eq!(wc.status, WcStatus::RemAccessErr, "{wc:?}");
        assert_eq!(wc.wr_id, 900);
        assert_eq!(p.bytes(End::B, REGION, 16), &before[..], "nothing written");
        assert_eq!(p.qp_state(End::A), QpState::Err);
    }
}

/// RDMA WRITE (with or without immediate) of `len` bytes from A's `SRC` to B's
/// `DST`; checks packets, the completion and the data. Returns B's receive
/// completions.
fn write_message(
    p: &mut Pair,
    wr_id: u64,
    len: u32,
    imm: Option<u32>,
    ctx: &str,
) -> Vec<WorkCompletion> {
    let mtu = p.opts.mtu;
    p.pattern(End::A, SRC, len as usize, wr_id as u8 ^ 0x5a);
    clear(p, End::B, DST, len as usize);
    let remote_addr = p.addr(End::B, DST);
    let rkey = p.rkey(End::B);
    let op = match imm {
        None => SendOp::RdmaWrite { remote_addr, rkey },
        Some(imm) => SendOp::RdmaWriteWithImm {
            remote_addr,
            rkey,
            imm,
        },
    };
    let s = sges(p, End::A, SRC, len);
    p.post_send(End::A, &SendWr::new(wr_id, op, &s)).unwrap();
    let (a_tx, _) = settle_counting(p);
    assert_eq!(a_tx, packets(len, mtu), "{ctx}: request packets sent");
    let swc = one(p.poll_send(End::A), ctx);
    assert_send_wc(p, End::A, &swc, wr_id, WcOpcode::RdmaWrite, ctx);
    let len = len as usize;
    assert_eq!(
        p.bytes(End::B, DST, len),
        p.bytes(End::A, SRC, len),
        "{ctx}: data"
    );
    assert_untouched(p, End::B, DST + len, GUARD, ctx);
    p.poll_recv(End::B)
}

#[test]
fn rdma_write_every_length_at_every_mtu() {
    for mtu in MTUS {
        let mut p = pair(mtu);
        // A receive WQE waits throughout: plain WRITEs must not consume it.
        let rsge = p.sge(End::B, 60_000, 100);
        p.post_recv(End::B, 4242, &[rsge]).unwrap();
        for (i, len) in lengths(mtu.bytes()).into_iter().enumerate() {
            let ctx = format!("RDMA_WRITE of {len} bytes at MTU {}", mtu.bytes());
            let recvs = write_message(&mut p, i as u64, len, None, &ctx);
            assert!(recvs.is_empty(), "{ctx}: {recvs:?}");
        }
        p.post_send(End::A, &SendWr::new(77, SendOp::Send, &[]))
            .unwrap();
        p.settle();
        let wc = one(p.poll_recv(End::B), "SEND");
        assert_eq!(
            (wc.wr_id, wc.status),
            (4242, WcStatus::Success),
            "the WRITEs left the receive WQE in place"
        );
    }
}

#[test]
fn rdma_write_with_imm_every_length_at_every_mtu() {
    for mtu in MTUS {
        let mut p = pair(mtu);
        for (i, len) in lengths(mtu.bytes()).into_iter().enumerate() {
            let ctx = format!("RDMA_WRITE_WITH_IMM of {len} bytes at MTU {}", mtu.bytes());
            // Alternate a receive with no SGE and one with a buffer that must stay
            // untouched: the data goes where the RETH says.
            let rbuf = 60_000;
            clear(&mut p, End::B, rbuf, 256);
            let rsges = if i % 2 == 0 {
                Vec::new()
            } else {
                vec![p.sge(End::B, rbuf, 256)]
            };
            p.post_recv(End::B, 2000 + i as u64, &rsges).unwrap();
            let imm = 0x0102_0304u32.wrapping_mul(i as u32 + 1);
            let recvs = write_message(&mut p, i as u64, len, Some(imm), &ctx);
            let wc = one(recvs, &ctx);
            assert_recv_wc(
                &p,
                End::B,
                &wc,
                2000 + i as u64,
                WcOpcode::RecvRdmaWithImm,
                len,
                &ctx,
            );
            assert_eq!(wc.imm_data, Some(imm), "{ctx}");
            assert_eq!(wc.invalidated_rkey, None, "{ctx}");
            assert_untouched(&p, End::B, rbuf, 256, &ctx);
        }
    }
}

#[test]
fn rdma_read_every_length_at_every_mtu() {
    for mtu in MTUS {
        let mut p = pair(mtu);
        for (i, len) in lengths(mtu.bytes()).into_iter().enumerate() {
            let ctx = format!("RDMA_READ of {len} bytes at MTU {}", mtu.bytes());
            let wr_id = i as u64;
            p.pattern(End::B, SRC, len as usize, 0x33 ^ i as u8);
            clear(&mut p, End::A, DST, len as usize);
            let remote_addr = p.addr(End::B, SRC);
            let rkey = p.rkey(End::B);
            let s = sges(&p, End::A, DST, len);
            p.post_send(
                End::A,
                &SendWr::new(wr_id, SendOp::RdmaRead { remote_addr, rkey }, &s),
            )
            .unwrap();
            let (a_tx, b_tx) = settle_counting(&mut p);
            assert_eq!(a_tx, 1, "{ctx}: one request");
            assert_eq!(b_tx, packets(len, mtu), "{ctx}: response packets");
            let wc = one(p.poll_send(End::A), &ctx);
            assert_send_wc(&p, End::A, &wc, wr_id, WcOpcode::RdmaRead, &ctx);
            assert_eq!(wc.byte_len, len, "{ctx}");
            let len = len as usize;
            assert_eq!(
                p.bytes(End::A, DST, len),
                p.bytes(End::B, SRC, len),
                "{ctx}"
            );
            assert_untouched(&p, End::A, DST + len, GUARD, &ctx);
            assert!(p.poll_recv(End::B).is_empty());
        }
    }
}

/// The first offset at or after `offset` of `end`'s buffer whose address is
/// 8-byte aligned.
fn aligned(p: &Pair, end: End, offset: usize) -> usize {
    let addr = p.addr(end, offset);
    offset + ((8 - addr % 8) % 8) as usize
}

fn word(p: &Pair, end: End, offset: usize) -> u64 {
    u64::from_ne_bytes(p.bytes(end, offset, 8).try_into().unwrap())
}

fn set_word(p: &mut Pair, end: End, offset: usize, v: u64) {
    p.side_mut(end).buf[offset..offset + 8].copy_from_slice(&v.to_ne_bytes());
}

/// Runs one atomic from A against B's word at `remote`; the old value lands at
/// A's `local`. Returns the old value as A received it.
fn atomic(p: &mut Pair, wr_id: u64, op: SendOp, local: usize, ctx: &str) -> u64 {
    clear(p, End::A, local - GUARD, GUARD + 8);
    let sge = p.sge(End::A, local, 8);
    p.post_send(End::A, &SendWr::new(wr_id, op, &[sge]))
        .unwrap();
    let (a_tx, b_tx) = settle_counting(p);
    assert_eq!((a_tx, b_tx), (1, 1), "{ctx}: one request, one atomic ACK");
    let wc = one(p.poll_send(End::A), ctx);
    let expected = match op {
        SendOp::AtomicCmpSwap { .. } => WcOpcode::CompSwap,
        _ => WcOpcode::FetchAdd,
    };
    assert_send_wc(p, End::A, &wc, wr_id, expected, ctx);
    assert_eq!(wc.byte_len, 8, "{ctx}");
    assert_untouched(p, End::A, local - GUARD, GUARD, ctx);
    assert_untouched(p, End::A, local + 8, GUARD, ctx);
    word(p, End::A, local)
}

#[test]
fn atomics_compare_swap_and_fetch_add() {
    for mtu in MTUS {
        let mut p = pair(mtu);
        let r = aligned(&p, End::B, 40 * 1024);
        // The local buffer need not be aligned; try both.
        let locals = [aligned(&p, End::A, 40 * 1024), 44 * 1024 + 3];
        let rkey = p.rkey(End::B);
        let remote_addr = p.addr(End::B, r);
        clear(&mut p, End::B, r - GUARD, GUARD + 8);
        let mut expect_remote = 0x0123_4567_89ab_cdef_u64;
        set_word(&mut p, End::B, r, expect_remote);
        let mut wr_id = 0;
        for local in locals {
            let ctx = format!("MTU {}, local offset {local}", mtu.bytes());

            // Compare and swap, values equal: swapped.
            let swap = !expect_remote ^ 0x5555;
            wr_id += 1;
            let old = atomic(
                &mut p,
                wr_id,
                SendOp::AtomicCmpSwap {
                    remote_addr,
                    rkey,
                    compare: expect_remote,
                    swap,
                },
                local,
                &format!("{ctx}: CAS match"),
            );
            assert_eq!(old, expect_remote, "{ctx}: CAS returns the old value");
            expect_remote = swap;
            assert_eq!(word(&p, End::B, r), expect_remote, "{ctx}: CAS swapped");

            // Compare and swap, values differ: nothing changes.
            wr_id += 1;
            let old = atomic(
                &mut p,
                wr_id,
                SendOp::AtomicCmpSwap {
                    remote_addr,
                    rkey,
                    compare: expect_remote.wrapping_add(1),
                    swap: 42,
                },
                local,
                &format!("{ctx}: CAS mismatch"),
            );
            assert_eq!(old, expect_remote, "{ctx}: CAS mismatch returns the value");
            assert_eq!(word(&p, End::B, r), expect_remote, "{ctx}: not swapped");

            // Fetch and add.
            wr_id += 1;
            let old = atomic(
                &mut p,
                wr_id,
                SendOp::AtomicFetchAdd {
                    remote_addr,
                    rkey,
                    add: 0x1_0000_0001,
                },
                local,
                &format!("{ctx}: FAA"),
            );
            assert_eq!(old, expect_remote, "{ctx}: FAA returns the old value");
            expect_remote = expect_remote.wrapping_add(0x1_0000_0001);
            assert_eq!(word(&p, End::B, r), expect_remote, "{ctx}: added");

            // Fetch and add wraps modulo 2^64.
            set_word(&mut p, End::B, r, u64::MAX - 1);
            wr_id += 1;
            let old = atomic(
                &mut p,
                wr_id,
                SendOp::AtomicFetchAdd {
                    remote_addr,
                    rkey,
                    add: 3,
                },
                local,
                &format!("{ctx}: FAA wrap"),
            );
            assert_eq!(old, u64::MAX - 1, "{ctx}");
            expect_remote = 1;
            assert_eq!(word(&p, End::B, r), expect_remote, "{ctx}: wrapped");
            assert_untouched(&p, End::B, r - GUARD, GUARD, &ctx);
            assert_untouched(&p, End::B, r + 8, GUARD, &ctx);
        }
    }
}

/// `lens` laid out one after another from `base`, `GUARD` bytes apart.
fn layout(base: usize, lens: &[u32]) -> Vec<(usize, u32)> {
    let mut at = base;
    lens.iter()
        .map(|&l| {
            let piece = (at, l);
            at += l as usize + GUARD;
            piece
        })
        .collect()
}

fn sge_list(p: &Pair, end: End, pieces: &[(usize, u32)]) -> Vec<Sge> {
    pieces.iter().map(|&(o, l)| p.sge(end, o, l)).collect()
}

/// The bytes of `pieces` of `end`'s buffer, concatenated, up to `len` bytes.
fn gathered(p: &Pair, end: End, pieces: &[(usize, u32)], len: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for &(o, l) in pieces {
        out.extend_from_slice(p.bytes(end, o, l as usize));
    }
    out.truncate(len);
    out
}

fn clear_pieces(p: &mut Pair, end: End, pieces: &[(usize, u32)]) {
    for &(o, l) in pieces {
        clear(p, end, o, l as usize);
    }
}

/// Checks that only the first `len` bytes of the scatter list were written.
fn assert_scattered_only(p: &Pair, end: End, pieces: &[(usize, u32)], len: usize, ctx: &str) {
    let mut left = len;
    for &(o, l) in pieces {
        let used = left.min(l as usize);
        assert_untouched(p, end, o + used, l as usize - used + GUARD, ctx);
        left -= used;
    }
}

#[test]
fn scatter_gather_lists() {
    for mtu in MTUS {
        let m = mtu.bytes();
        let mut p = pair(mtu);
        // Pieces whose boundaries fall inside packets, not on MTU boundaries.
        let send_lens = [m / 2 + 3, m + 7, 2 * m - 5, 11];
        let total: u32 = send_lens.iter().sum();
        let recv_lens = [m - 1, 17, 2 * m + 9, m];
        let src = layout(SRC, &send_lens);
        let dst = layout(DST, &recv_lens);
        for (i, &(o, l)) in src.iter().enumerate() {
            p.pattern(End::A, o, l as usize, 11 * i as u8 + 1);
        }

        // SEND: gathered from four SGEs, scattered into four.
        let ctx = format!("SEND with SGE lists at MTU {m}");
        clear_pieces(&mut p, End::B, &dst);
        let rs = sge_list(&p, End::B, &dst);
        p.post_recv(End::B, 10, &rs).unwrap();
        let ss = sge_list(&p, End::A, &src);
        p.post_send(End::A, &SendWr::new(1, SendOp::Send, &ss))
            .unwrap();
        let (a_tx, _) = settle_counting(&mut p);
        assert_eq!(a_tx, packets(total, mtu), "{ctx}");
        let wc = one(p.poll_send(End::A), &ctx);
        assert_send_wc(&p, End::A, &wc, 1, WcOpcode::Send, &ctx);
        let wc = one(p.poll_recv(End::B), &ctx);
        assert_recv_wc(&p, End::B, &wc, 10, WcOpcode::Recv, total, &ctx);
        let sent = gathered(&p, End::A, &src, total as usize);
        assert_eq!(sent.len(), total as usize);
        assert_eq!(gathered(&p, End::B, &dst, total as usize), sent, "{ctx}");
        assert_scattered_only(&p, End::B, &dst, total as usize, &ctx);

        // RDMA WRITE: gathered from four SGEs, lands contiguously.
        let ctx = format!("RDMA_WRITE with an SGE list at MTU {m}");
        let at = 0;
        clear(&mut p, End::B, at, total as usize);
        let remote_addr = p.addr(End::B, at);
        let rkey = p.rkey(End::B);
        p.post_send(
            End::A,
            &SendWr::new(2, SendOp::RdmaWrite { remote_addr, rkey }, &ss),
        )
        .unwrap();
        let (a_tx, _) = settle_counting(&mut p);
        assert_eq!(a_tx, packets(total, mtu), "{ctx}");
        let wc = one(p.poll_send(End::A), &ctx);
        assert_send_wc(&p, End::A, &wc, 2, WcOpcode::RdmaWrite, &ctx);
        assert_eq!(p.bytes(End::B, at, total as usize), &sent[..], "{ctx}");
        assert_untouched(&p, End::B, at + total as usize, GUARD, &ctx);

        // RDMA READ: contiguous at B, scattered into four SGEs at A.
        let ctx = format!("RDMA_READ with an SGE list at MTU {m}");
        let from = 15_000;
        p.pattern(End::B, from, total as usize, 0x77);
        let into = layout(DST, &recv_lens);
        clear_pieces(&mut p, End::A, &into);
        let ls = sge_list(&p, End::A, &into);
        let remote_addr = p.addr(End::B, from);
        p.post_send(
            End::A,
            &SendWr::new(3, SendOp::RdmaRead { remote_addr, rkey }, &ls),
        )
        .unwrap();
        let (_, b_tx) = settle_counting(&mut p);
        let read_len: u32 = recv_lens.iter().sum();
        assert_eq!(b_tx, packets(read_len, mtu), "{ctx}");
        let wc = one(p.poll_send(End::A), &ctx);
        assert_send_wc(&p, End::A, &wc, 3, WcOpcode::RdmaRead, &ctx);
        assert_eq!(wc.byte_len, read_len, "{ctx}");
        assert_eq!(
            gathered(&p, End::A, &into, read_len as usize),
            p.bytes(End::B, from, read_len as usize),
            "{ctx}"
        );
        assert_scattered_only(&p, End::A, &into, read_len as usize, &ctx);
    }
}

#[test]
fn inline_data() {
    let mtu = Mtu::Mtu256;
    let mut opts = PairOpts {
        mtu,
        ..PairOpts::default()
    };
    opts.cap.max_inline_data = 512;
    let mut p = pair_with(opts);
    let remote_addr = p.addr(End::B, DST);
    let rkey = p.rkey(End::B);
    let mut wr_id = 0;
    for len in [0u32, 1, 255, 256, 257, 512] {
        let ops = [
            ("SEND", SendOp::Send),
            ("SEND_WITH_IMM", SendOp::SendWithImm { imm: len ^ 0xabcd }),
            ("RDMA_WRITE", SendOp::RdmaWrite { remote_addr, rkey }),
            (
                "RDMA_WRITE_WITH_IMM",
                SendOp::RdmaWriteWithImm {
                    remote_addr,
                    rkey,
                    imm: len ^ 0x1234,
                },
            ),
        ];
        for (name, op) in ops {
            wr_id += 1;
            let ctx = format!("inline {name} of {len} bytes");
            let original: Vec<u8> = (0..len)
                .map(|i| ((i ^ wr_id as u32).wrapping_mul(0x9e37_79b1) >> 24) as u8)
                .collect();
            let mut data = original.clone();
            clear(&mut p, End::B, DST, len as usize);
            let consumes_recv = !matches!(op, SendOp::RdmaWrite { .. });
            if consumes_recv {
                let rs = sges(&p, End::B, DST, 1024);
                p.post_recv(End::B, 100 + wr_id, &rs).unwrap();
            }
            p.post_send(
                End::A,
                &SendWr {
                    wr_id,
                    op,
                    payload: Payload::Inline(&data),
                    flags: SendFlags::SIGNALED,
                },
            )
            .unwrap();
            // The data was copied when posted.
            data.fill(0);
            let (a_tx, _) = settle_counting(&mut p);
            assert_eq!(a_tx, packets(len, mtu), "{ctx}");
            let swc = one(p.poll_send(End::A), &ctx);
            let expected = match op {
                SendOp::Send | SendOp::SendWithImm { .. } => WcOpcode::Send,
                _ => WcOpcode::RdmaWrite,
            };
            assert_send_wc(&p, End::A, &swc, wr_id, expected, &ctx);
            assert_eq!(p.bytes(End::B, DST, len as usize), &original[..], "{ctx}");
            assert_untouched(&p, End::B, DST + len as usize, GUARD, &ctx);
            let recvs = p.poll_recv(End::B);
            if consumes_recv {
                let rwc = one(recvs, &ctx);
                let rop = if matches!(op, SendOp::RdmaWriteWithImm { .. }) {
                    WcOpcode::RecvRdmaWithImm
                } else {
                    WcOpcode::Recv
                };
                assert_recv_wc(&p, End::B, &rwc, 100 + wr_id, rop, len, &ctx);
                let imm = match op {
                    SendOp::SendWithImm { imm } | SendOp::RdmaWriteWithImm { imm, .. } => Some(imm),
                    _ => None,
                };
                assert_eq!(rwc.imm_data, imm, "{ctx}");
            } else {
                assert!(recvs.is_empty(), "{ctx}");
            }
        }
    }
    // One byte more than max_inline_data is refused at post time.
    let data = [0u8; 513];
    let err = p.post_send(
        End::A,
        &SendWr {
            wr_id: 9999,
            op: SendOp::Send,
            payload: Payload::Inline(&data),
            flags: SendFlags::SIGNALED,
        },
    );
    assert_eq!(err, Err(PostError::InlineTooLong));
}

/// Posts a small RDMA WRITE from A with `flags`.
fn post_write(p: &mut Pair, wr_id: u64, flags: SendFlags) {
    let remote_addr = p.addr(End::B, DST + (wr_id as usize % 64) * 16);
    let rkey = p.rkey(End::B);
    let s = [p.sge(End::A, SRC + (wr_id as usize % 64) * 16, 16)];
    p.post_send(
        End::A,
        &SendWr {
            wr_id,
            op: SendOp::RdmaWrite { remote_addr, rkey },
            payload: Payload::Sges(&s),
            flags,
        },
    )
    .unwrap();
}

#[test]
fn unsignaled_work_requests_complete_silently() {
    let mut p = pair(Mtu::Mtu1024);
    p.pattern(End::A, SRC, 2048, 3);
    // Alternate signaled and unsignaled WRs of every kind.
    let remote_addr = p.addr(End::B, DST);
    let rkey = p.rkey(End::B);
    let word = aligned(&p, End::B, 50_000);
    let word_addr = p.addr(End::B, word);
    let ops = [
        SendOp::Send,
        SendOp::RdmaWrite { remote_addr, rkey },
        SendOp::RdmaRead { remote_addr, rkey },
        SendOp::SendWithImm { imm: 5 },
        SendOp::AtomicFetchAdd {
            remote_addr: word_addr,
            rkey,
            add: 1,
        },
        SendOp::RdmaWriteWithImm {
            remote_addr,
            rkey,
            imm: 6,
        },
        SendOp::AtomicCmpSwap {
            remote_addr: word_addr,
            rkey,
            compare: 0,
            swap: 0,
        },
        SendOp::Send,
    ];
    for i in 0..ops.len() as u64 {
        let rs = [p.sge(End::B, 40_000, 2048)];
        p.post_recv(End::B, 100 + i, &rs).unwrap();
    }
    for (i, op) in ops.iter().enumerate() {
        let len = if op.is_atomic() { 8 } else { 1500 };
        let local = if op.is_read_or_atomic() { 20_000 } else { SRC };
        let s = [p.sge(End::A, local, len)];
        let flags = if i % 2 == 0 {
            SendFlags::SIGNALED
        } else {
            SendFlags::EMPTY
        };
        p.post_send(
            End::A,
            &SendWr {
                wr_id: i as u64,
                op: *op,
                payload: Payload::Sges(&s),
                flags,
            },
        )
        .unwrap();
    }
    p.settle();
    let wcs = p.poll_send(End::A);
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        (0..ops.len() as u64)
            .step_by(2)
            .map(|i| (i, WcStatus::Success))
            .collect::<Vec<_>>(),
        "only the signaled WRs complete, in order"
    );
    // Receives always complete: SEND, SEND_WITH_IMM, WRITE_WITH_IMM, SEND.
    let recvs = p.poll_recv(End::B);
    assert_eq!(
        recvs
            .iter()
            .map(|w| (w.wr_id, w.opcode))
            .collect::<Vec<_>>(),
        vec![
            (100, WcOpcode::Recv),
            (101, WcOpcode::Recv),
            (102, WcOpcode::RecvRdmaWithImm),
            (103, WcOpcode::Recv),
        ]
    );

    // Unsignaled WRs free their slots once a later signaled completion is polled:
    // many times the send queue's depth go through with one signaled WR at the end
    // of each batch. (The last WR above is unsignaled and holds its slot until
    // the first batch's completion is polled, so batches leave one slot for it.)
    let depth = u64::from(p.opts.cap.max_send_wr);
    let mut wr_id = 1000;
    for batch in 0..5 {
        for _ in 0..depth - 2 {
            post_write(&mut p, wr_id, SendFlags::EMPTY);
            wr_id += 1;
        }
        post_write(&mut p, wr_id, SendFlags::SIGNALED);
        p.settle();
        let wcs = p.poll_send(End::A);
        assert_eq!(
            wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
            vec![(wr_id, WcStatus::Success)],
            "batch {batch}"
        );
        wr_id += 1;
    }
    // Entirely unsignaled: nothing at all.
    for _ in 0..depth {
        post_write(&mut p, wr_id, SendFlags::EMPTY);
        wr_id += 1;
    }
    p.settle();
    assert!(p.poll_send(End::A).is_empty());
    assert_eq!(p.bytes(End::B, DST, 1024), p.bytes(End::A, SRC, 1024));
}

#[test]
fn sq_sig_all_signals_every_work_request() {
    let mut p = pair_with(PairOpts {
        sq_sig_all: true,
        ..PairOpts::default()
    });
    p.pattern(End::A, SRC, 4096, 9);
    let remote_addr = p.addr(End::B, DST);
    let rkey = p.rkey(End::B);
    let r = aligned(&p, End::B, 50_000);
    let word_addr = p.addr(End::B, r);
    let rs = [p.sge(End::B, 40_000, 4096)];
    p.post_recv(End::B, 50, &rs).unwrap();
    let s = [p.sge(End::A, SRC, 3000)];
    let d = [p.sge(End::A, 20_000, 3000)];
    let w = [p.sge(End::A, 30_000, 8)];
    let wrs = [
        (SendOp::Send, &s[..], WcOpcode::Send, None),
        (
            SendOp::RdmaWrite { remote_addr, rkey },
            &s[..],
            WcOpcode::RdmaWrite,
            None,
        ),
        (
            SendOp::RdmaRead { remote_addr, rkey },
            &d[..],
            WcOpcode::RdmaRead,
            Some(3000),
        ),
        (
            SendOp::AtomicFetchAdd {
                remote_addr: word_addr,
                rkey,
                add: 2,
            },
            &w[..],
            WcOpcode::FetchAdd,
            Some(8),
        ),
    ];
    for (i, (op, sg, _, _)) in wrs.iter().enumerate() {
        p.post_send(
            End::A,
            &SendWr {
                wr_id: i as u64,
                op: *op,
                payload: Payload::Sges(sg),
                flags: SendFlags::EMPTY,
            },
        )
        .unwrap();
    }
    p.settle();
    let wcs = p.poll_send(End::A);
    assert_eq!(wcs.len(), wrs.len(), "{wcs:?}");
    for (i, (wc, (_, _, op, len))) in wcs.iter().zip(wrs.iter()).enumerate() {
        assert_send_wc(&p, End::A, wc, i as u64, *op, "sq_sig_all");
        if let Some(len) = len {
            assert_eq!(wc.byte_len, *len);
        }
    }
    assert_eq!(p.bytes(End::A, 20_000, 3000), p.bytes(End::A, SRC, 3000));
}

#[test]
fn solicited_flag_reaches_the_receive_completion() {
    let mtu = Mtu::Mtu256;
    let mut p = pair(mtu);
    let remote_addr = p.addr(End::B, DST);
    let rkey = p.rkey(End::B);
    let rcq = p.b.recv_cq;
    let cases = [
        ("SEND", SendOp::Send, false, 100),
        ("SEND", SendOp::Send, true, 100),
        ("multi-packet SEND", SendOp::Send, false, 1000),
        ("multi-packet SEND", SendOp::Send, true, 1000),
        ("SEND_WITH_IMM", SendOp::SendWithImm { imm: 1 }, true, 700),
        ("SEND_WITH_IMM", SendOp::SendWithImm { imm: 2 }, false, 0),
        (
            "RDMA_WRITE_WITH_IMM",
            SendOp::RdmaWriteWithImm {
                remote_addr,
                rkey,
                imm: 3,
            },
            true,
            600,
        ),
        (
            "RDMA_WRITE_WITH_IMM",
            SendOp::RdmaWriteWithImm {
                remote_addr,
                rkey,
                imm: 4,
            },
            false,
            600,
        ),
    ];
    for (i, (name, op, solicited, len)) in cases.into_iter().enumerate() {
        let ctx = format!("{name} of {len} bytes, solicited {solicited}");
        // Armed for solicited completions only: a notification exactly when the
        // message was solicited.
        p.engine(End::B).req_notify_cq(rcq, true).unwrap();
        let rs = [p.sge(End::B, 40_000, 2048)];
        p.post_recv(End::B, i as u64, &rs).unwrap();
        let s = sges(&p, End::A, SRC, len);
        let mut flags = SendFlags::SIGNALED;
        if solicited {
            flags |= SendFlags::SOLICITED;
        }
        p.post_send(
            End::A,
            &SendWr {
                wr_id: i as u64,
                op,
                payload: Payload::Sges(&s),
                flags,
            },
        )
        .unwrap();
        p.settle();
        let swc = one(p.poll_send(End::A), &ctx);
        assert_eq!(swc.status, WcStatus::Success, "{ctx}");
        let rwc = one(p.poll_recv(End::B), &ctx);
        assert_eq!(rwc.status, WcStatus::Success, "{ctx}");
        assert_eq!(rwc.byte_len, len, "{ctx}");
        assert_eq!(rwc.solicited, solicited, "{ctx}");
        let note = p.engine(End::B).poll_cq_notification();
        assert_eq!(note, solicited.then_some(rcq), "{ctx}");
        assert_eq!(p.engine(End::B).poll_cq_notification(), None, "{ctx}");
    }
}

/// Arming a CQ that already holds a completion of the armed kind, not yet polled, notifies
/// at once (an RNIC arms against its consumer index); UCX polls its CQs empty, arms them and
/// sleeps, so a completion landing between its poll and its arm must still wake it.
#[test]
fn arming_over_a_waiting_completion_notifies_at_once() {
    let mut p = pair(Mtu::Mtu1024);
    let rcq = p.b.recv_cq;
    let send = |p: &mut Pair, i: u64, solicited: bool| {
        let rs = [p.sge(End::B, 40_000, 2048)];
        p.post_recv(End::B, i, &rs).unwrap();
        let s = sges(p, End::A, SRC, 100);
        let mut flags = SendFlags::SIGNALED;
        if solicited {
            flags |= SendFlags::SOLICITED;
        }
        let wr = SendWr {
            wr_id: i,
            op: SendOp::Send,
            payload: Payload::Sges(&s),
            flags,
        };
        p.post_send(End::A, &wr).unwrap();
        p.settle();
        one(p.poll_send(End::A), "send");
    };
    // An unsolicited completion waits, unpolled: arming for any completion fires now.
    send(&mut p, 1, false);
    assert_eq!(p.engine(End::B).poll_cq_notification(), None);
    p.engine(End::B).req_notify_cq(rcq, false).unwrap();
    assert_eq!(p.engine(End::B).poll_cq_notification(), Some(rcq));
    // One shot: the next completion finds the CQ disarmed.
    send(&mut p, 2, false);
    assert_eq!(p.engine(End::B).poll_cq_notification(), None);
    // Armed for solicited completions only, the two unsolicited ones waiting do not fire
    // it; a solicited one arriving then does.
    p.engine(End::B).req_notify_cq(rcq, true).unwrap();
    assert_eq!(p.engine(End::B).poll_cq_notification(), None);
    send(&mut p, 3, true);
    assert_eq!(p.engine(End::B).poll_cq_notification(), Some(rcq));
    // And a solicited one waiting fires a solicited-only arm at once.
    p.engine(End::B).req_notify_cq(rcq, true).unwrap();
    assert_eq!(p.engine(End::B).poll_cq_notification(), Some(rcq));
    // Polled empty, the CQ stays armed until the next completion.
    assert_eq!(p.poll_recv(End::B).len(), 3);
    p.engine(End::B).req_notify_cq(rcq, false).unwrap();
    assert_eq!(p.engine(End::B).poll_cq_notification(), None);
    send(&mut p, 4, false);
    assert_eq!(p.engine(End::B).poll_cq_notification(), Some(rcq));
    assert_eq!(p.engine(End::B).poll_cq_notification(), None);
}

#[test]
fn completions_follow_post_order() {
    let mtu = Mtu::Mtu1024;
    let mut p = pair(mtu);
    let rkey = p.rkey(End::B);
    let wo = aligned(&p, End::B, 60_000);
    let word_addr = p.addr(End::B, wo);
    set_word(&mut p, End::B, wo, 10);
    p.pattern(End::A, SRC, 8000, 1);
    p.pattern(End::B, 20_000, 8000, 2);
    for i in 0..3 {
        let rs = [p.sge(End::B, 40_000 + i * 6000, 6000)];
        p.post_recv(End::B, 100 + i as u64, &rs).unwrap();
    }
    let s3000 = [p.sge(End::A, SRC, 3000)];
    let s100 = [p.sge(End::A, 3000, 100)];
    let s5000 = [p.sge(End::A, 3100, 4900)];
    let read1 = [p.sge(End::A, 20_000, 2500)];
    let atom1 = [p.sge(End::A, 30_000, 8)];
    let atom2 = [p.sge(End::A, 30_008, 8)];
    let read2: [Sge; 0] = [];
    let wrs: Vec<(SendOp, &[Sge], WcOpcode, Option<u32>)> = vec![
        (SendOp::Send, &s3000[..], WcOpcode::Send, None),
        (
            SendOp::RdmaRead {
                remote_addr: p.addr(End::B, 20_000),
                rkey,
            },
            &read1[..],
            WcOpcode::RdmaRead,
            Some(2500),
        ),
        (
            SendOp::RdmaWrite {
                remote_addr: p.addr(End::B, 30_000),
                rkey,
            },
            &s100[..],
            WcOpcode::RdmaWrite,
            None,
        ),
        (
            SendOp::AtomicCmpSwap {
                remote_addr: word_addr,
                rkey,
                compare: 10,
                swap: 20,
            },
            &atom1[..],
            WcOpcode::CompSwap,
            Some(8),
        ),
        (
            SendOp::SendWithImm { imm: 77 },
            &read2[..],
            WcOpcode::Send,
            None,
        ),
        (
            SendOp::AtomicFetchAdd {
                remote_addr: word_addr,
                rkey,
                add: 5,
            },
            &atom2[..],
            WcOpcode::FetchAdd,
            Some(8),
        ),
        (
            SendOp::RdmaWriteWithImm {
                remote_addr: p.addr(End::B, 31_000),
                rkey,
                imm: 88,
            },
            &s5000[..],
            WcOpcode::RdmaWrite,
            None,
        ),
        (
            SendOp::RdmaRead {
                remote_addr: p.addr(End::B, 20_000),
                rkey,
            },
            &read2[..],
            WcOpcode::RdmaRead,
            Some(0),
        ),
    ];
    for (i, (op, sg, _, _)) in wrs.iter().enumerate() {
        p.post_send(End::A, &SendWr::new(i as u64, *op, sg))
            .unwrap();
    }
    p.settle();
    let wcs = p.poll_send(End::A);
    assert_eq!(wcs.len(), wrs.len(), "{wcs:?}");
    for (i, (wc, (_, _, op, len))) in wcs.iter().zip(wrs.iter()).enumerate() {
        assert_send_wc(&p, End::A, wc, i as u64, *op, &format!("WR {i}"));
        if let Some(len) = len {
            assert_eq!(wc.byte_len, *len, "WR {i}");
        }
    }
    let recvs = p.poll_recv(End::B);
    assert_eq!(recvs.len(), 3, "{recvs:?}");
    assert_recv_wc(&p, End::B, &recvs[0], 100, WcOpcode::Recv, 3000, "SEND");
    assert_recv_wc(
        &p,
        End::B,
        &recvs[1],
        101,
        WcOpcode::Recv,
        0,
        "SEND_WITH_IMM",
    );
    assert_eq!(recvs[1].imm_data, Some(77));
    assert_recv_wc(
        &p,
        End::B,
        &recvs[2],
        102,
        WcOpcode::RecvRdmaWithImm,
        4900,
        "WRITE_WITH_IMM",
    );
    assert_eq!(recvs[2].imm_data, Some(88));
    // Data and atomic results.
    assert_eq!(p.bytes(End::B, 40_000, 3000), p.bytes(End::A, SRC, 3000));
    assert_eq!(p.bytes(End::A, 20_000, 2500), p.bytes(End::B, 20_000, 2500));
    assert_eq!(p.bytes(End::B, 30_000, 100), p.bytes(End::A, 3000, 100));
    assert_eq!(p.bytes(End::B, 31_000, 4900), p.bytes(End::A, 3100, 4900));
    assert_eq!(word(&p, End::A, 30_000), 10);
    assert_eq!(word(&p, End::A, 30_008), 20);
    assert_eq!(word(&p, End::B, wo), 25);
}

/// What the hand-driven network saw.
#[derive(Debug, Clone, Copy)]
struct Seen {
    from: End,
    kind: OpKind,
    ends_message: bool,
    psn: Psn,
    /// RETH DMA length of a READ request.
    read_len: Option<u32>,
}

/// Drives the two engines by hand instead of through the simulator, in rounds:
/// everything A has to send is handed to B, then everything B has to send is
/// handed to A, until neither has anything. The clock stands still (nothing is
/// lost, so no timer needs to fire). Returns every packet in the order handed
/// over.
fn pump(p: &mut Pair) -> Vec<Seen> {
    let now = p.sim.now();
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let mut seen = Vec::new();
    loop {
        let mut moved = false;
        for from in [End::A, End::B] {
            let to = other(from);
            let src = p.sim.addr(p.side(from).node);
            let dst = p.sim.addr(p.side(to).node);
            let mut batch = Vec::new();
            while let Some(t) = p.engine(from).poll_transmit(now, &mut buf) {
                assert_eq!(t.dst, dst);
                t.seal(&mut buf, 0); // as a driver sending it alone would
                batch.push(buf[..t.len].to_vec());
            }
            for d in &batch {
                let pkt = RocePacket::new_checked(&d[..]).expect("well-formed packet");
                let info = pkt.info();
                seen.push(Seen {
                    from,
                    kind: info.kind,
                    ends_message: info.position.ends_message(),
                    psn: pkt.bth().psn(),
                    read_len: if info.kind == OpKind::RdmaReadRequest {
                        pkt.reth().map(|r| r.dma_len())
                    } else {
                        None
                    },
                });
                p.engine(to).handle_datagram(now, src, d);
            }
            moved |= !batch.is_empty();
        }
        if !moved {
            return seen;
        }
    }
}

/// Sets up a READ of B's region X into A, then a WRITE (fenced or not) of new
/// data from A into X; returns the packets seen.
fn read_then_write(fence: bool) -> (Pair, Vec<Seen>, Vec<u8>) {
    let mtu = Mtu::Mtu256;
    let mut p = pair(mtu);
    let len = 3 * mtu.bytes() + 10;
    let x = 20_000;
    p.pattern(End::B, x, len as usize, 0x10);
    let original = p.bytes(End::B, x, len as usize).to_vec();
    p.pattern(End::A, SRC, len as usize, 0x80);
    clear(&mut p, End::A, DST, len as usize);
    let remote_addr = p.addr(End::B, x);
    let rkey = p.rkey(End::B);
    let d = [p.sge(End::A, DST, len)];
    let s = [p.sge(End::A, SRC, len)];
    p.post_send(
        End::A,
        &SendWr::new(1, SendOp::RdmaRead { remote_addr, rkey }, &d),
    )
    .unwrap();
    let mut flags = SendFlags::SIGNALED;
    if fence {
        flags |= SendFlags::FENCE;
    }
    p.post_send(
        End::A,
        &SendWr {
            wr_id: 2,
            op: SendOp::RdmaWrite { remote_addr, rkey },
            payload: Payload::Sges(&s),
            flags,
        },
    )
    .unwrap();
    let seen = pump(&mut p);
    let wcs = p.poll_send(End::A);
    assert_eq!(
        wcs.iter()
            .map(|w| (w.wr_id, w.status, w.opcode))
            .collect::<Vec<_>>(),
        vec![
            (1, WcStatus::Success, WcOpcode::RdmaRead),
            (2, WcStatus::Success, WcOpcode::RdmaWrite)
        ]
    );
    assert_eq!(
        p.bytes(End::B, x, len as usize),
        p.bytes(End::A, SRC, len as usize),
        "the WRITE landed"
    );
    (p, seen, original)
}

fn first_write_and_last_read_response(seen: &[Seen]) -> (usize, usize) {
    let first_write = seen
        .iter()
        .position(|s| s.from == End::A && s.kind == OpKind::RdmaWrite)
        .expect("a WRITE packet");
    let last_resp = seen
        .iter()
        .position(|s| s.from == End::B && s.kind == OpKind::RdmaReadResponse && s.ends_message)
        .expect("the READ's last response");
    (first_write, last_resp)
}

#[test]
fn fence_holds_a_write_until_the_read_before_it_completes() {
    let (p, seen, original) = read_then_write(true);
    let (first_write, last_resp) = first_write_and_last_read_response(&seen);
    assert!(
        last_resp < first_write,
        "fenced WRITE went out at packet {first_write}, before the READ's last response \
         at {last_resp}: {seen:?}"
    );
    // So the READ saw X as it was before the WRITE.
    assert_eq!(p.bytes(End::A, DST, original.len()), &original[..]);

    // Without the fence the requester does not wait (the hand-driven network
    // delivers the WRITE to B before B answers the READ): this shows the check
    // above can tell the difference.
    let (_, seen, _) = read_then_write(false);
    let (first_write, last_resp) = first_write_and_last_read_response(&seen);
    assert!(first_write < last_resp, "{seen:?}");
}

#[test]
fn fence_waits_for_an_atomic_too() {
    let mut p = pair(Mtu::Mtu1024);
    let w = aligned(&p, End::B, 20_000);
    set_word(&mut p, End::B, w, 1000);
    let remote_addr = p.addr(End::B, w);
    let rkey = p.rkey(End::B);
    let l = [p.sge(End::A, 30_000, 8)];
    p.post_send(
        End::A,
        &SendWr::new(
            1,
            SendOp::AtomicFetchAdd {
                remote_addr,
                rkey,
                add: 1,
            },
            &l,
        ),
    )
    .unwrap();
    // A fenced SEND after it.
    let rs = [p.sge(End::B, DST, 64)];
    p.post_recv(End::B, 5, &rs).unwrap();
    p.post_send(
        End::A,
        &SendWr {
            wr_id: 2,
            op: SendOp::Send,
            payload: Payload::Sges(&[]),
            flags: SendFlags::SIGNALED | SendFlags::FENCE,
        },
    )
    .unwrap();
    let seen = pump(&mut p);
    let ack = seen
        .iter()
        .position(|s| s.from == End::B && s.kind == OpKind::AtomicAcknowledge)
        .expect("atomic ACK");
    let send = seen
        .iter()
        .position(|s| s.from == End::A && s.kind == OpKind::Send)
        .expect("SEND");
    assert!(ack < send, "{seen:?}");
    let wcs = p.poll_send(End::A);
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert_eq!(word(&p, End::A, 30_000), 1000);
    assert_eq!(word(&p, End::B, w), 1001);
}

/// The most READs and atomics outstanding at once in `seen` (from the request
/// leaving A until its last response leaving B).
fn max_outstanding(seen: &[Seen], mtu: Mtu) -> usize {
    let mut outstanding: Vec<Psn> = Vec::new(); // last PSN of each
    let mut max = 0;
    for s in seen {
        match (s.from, s.kind) {
            (End::A, OpKind::RdmaReadRequest) => {
                let n = s.read_len.unwrap().div_ceil(mtu.bytes()).max(1);
                outstanding.push(s.psn.add(n - 1));
            }
            (End::A, OpKind::CompareSwap | OpKind::FetchAdd) => outstanding.push(s.psn),
            (End::B, OpKind::RdmaReadResponse) if s.ends_message => {
                let before = outstanding.len();
                outstanding.retain(|&last| last != s.psn);
                assert_eq!(outstanding.len() + 1, before, "unexpected response {s:?}");
            }
            (End::B, OpKind::AtomicAcknowledge) => {
                let before = outstanding.len();
                outstanding.retain(|&last| last != s.psn);
                assert_eq!(outstanding.len() + 1, before, "unexpected response {s:?}");
            }
            _ => {}
        }
        max = max.max(outstanding.len());
    }
    assert!(outstanding.is_empty(), "unanswered: {outstanding:?}");
    max
}

#[test]
fn max_rd_atomic_one_keeps_one_read_outstanding() {
    let mtu = Mtu::Mtu256;
    let mut p = pair_with(PairOpts {
        mtu,
        max_rd_atomic: 1,
        ..PairOpts::default()
    });
    let lens = [1u32, 300, 1000, 256, 0, 700, 64, 2000];
    p.pattern(End::B, 20_000, 4096, 0x21);
    let remote_addr = p.addr(End::B, 20_000);
    let rkey = p.rkey(End::B);
    let mut at = DST;
    let mut dsts = Vec::new();
    for (i, &len) in lens.iter().enumerate() {
        clear(&mut p, End::A, at, len as usize);
        let d = sges(&p, End::A, at, len);
        p.post_send(
            End::A,
            &SendWr::new(
                i as u64,
                SendOp::RdmaRead {
                    remote_addr: remote_addr + 8 * i as u64,
                    rkey,
                },
                &d,
            ),
        )
        .unwrap();
        dsts.push(at);
        at += len as usize + GUARD;
    }
    let seen = pump(&mut p);
    let requests = seen
        .iter()
        .filter(|s| s.kind == OpKind::RdmaReadRequest)
        .count();
    assert_eq!(requests, lens.len(), "one request per READ, none resent");
    assert_eq!(max_outstanding(&seen, mtu), 1, "{seen:?}");
    let wcs = p.poll_send(End::A);
    assert_eq!(wcs.len(), lens.len());
    for (i, wc) in wcs.iter().enumerate() {
        assert_send_wc(&p, End::A, wc, i as u64, WcOpcode::RdmaRead, "READ");
        assert_eq!(wc.byte_len, lens[i]);
        let len = lens[i] as usize;
        assert_eq!(
            p.bytes(End::A, dsts[i], len),
            p.bytes(End::B, 20_000 + 8 * i, len),
            "READ {i}"
        );
        assert_untouched(&p, End::A, dsts[i] + len, GUARD, "READ");
    }
}

#[test]
fn max_rd_atomic_three_with_reads_and_atomics() {
    let mtu = Mtu::Mtu1024;
    let mut p = pair_with(PairOpts {
        mtu,
        max_rd_atomic: 3,
        ..PairOpts::default()
    });
    p.pattern(End::B, 20_000, 8192, 0x31);
    let w = aligned(&p, End::B, 40_000);
    set_word(&mut p, End::B, w, 0);
    let word_addr = p.addr(End::B, w);
    let remote_addr = p.addr(End::B, 20_000);
    let rkey = p.rkey(End::B);
    for i in 0..10u64 {
        let op = match i % 3 {
            0 => SendOp::AtomicFetchAdd {
                remote_addr: word_addr,
                rkey,
                add: 1,
            },
            _ => SendOp::RdmaRead { remote_addr, rkey },
        };
        let len = if i % 3 == 0 { 8 } else { 2500 };
        let d = [p.sge(End::A, DST + 3000 * i as usize, len)];
        p.post_send(End::A, &SendWr::new(i, op, &d)).unwrap();
    }
    let seen = pump(&mut p);
    assert_eq!(max_outstanding(&seen, mtu), 3, "{seen:?}");
    let wcs = p.poll_send(End::A);
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        (0..10).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>()
    );
    // The four fetch-and-adds ran once each, in order.
    assert_eq!(word(&p, End::B, w), 4);
    for (n, i) in [0usize, 3, 6, 9].into_iter().enumerate() {
        assert_eq!(word(&p, End::A, DST + 3000 * i), n as u64);
    }
    for i in [1usize, 2, 4, 5, 7, 8] {
        assert_eq!(
            p.bytes(End::A, DST + 3000 * i, 2500),
            p.bytes(End::B, 20_000, 2500)
        );
    }
}

#[test]
fn both_directions_at_once() {
    for mtu in MTUS {
        let mut p = pair(mtu);
        // Per end: SEND from 0..5000 into the peer's 40_000; WRITE from
        // 8_000..11_000 to the peer's 16_000; READ the peer's 24_000..28_000
        // into 32_000; an atomic on the peer's word near 50_000.
        for (end, seed) in [(End::A, 1u8), (End::B, 2u8)] {
            p.fill(end, 0, 5000, seed);
            p.fill(end, 8000, 3000, seed + 10);
            p.fill(end, 24_000, 4000, seed + 20);
            let w = aligned(&p, end, 50_000);
            set_word(&mut p, end, w, 100 * u64::from(seed));
            let rs = [p.sge(end, 40_000, 4000), p.sge(end, 44_500, 2000)];
            p.post_recv(end, 10, &rs).unwrap();
        }
        for end in [End::A, End::B] {
            let peer = other(end);
            let rkey = p.rkey(peer);
            let s = [p.sge(end, 0, 5000)];
            let wsrc = [p.sge(end, 8000, 3000)];
            let rd = [p.sge(end, 32_000, 4000)];
            let at = [p.sge(end, 60_000, 8)];
            let word_addr = p.addr(peer, aligned(&p, peer, 50_000));
            let wrs = [
                SendWr::new(1, SendOp::Send, &s),
                SendWr::new(
                    2,
                    SendOp::RdmaWrite {
                        remote_addr: p.addr(peer, 16_000),
                        rkey,
                    },
                    &wsrc,
                ),
                SendWr::new(
                    3,
                    SendOp::RdmaRead {
                        remote_addr: p.addr(peer, 24_000),
                        rkey,
                    },
                    &rd,
                ),
                SendWr::new(
                    4,
                    SendOp::AtomicFetchAdd {
                        remote_addr: word_addr,
                        rkey,
                        add: 7,
                    },
                    &at,
                ),
            ];
            for wr in &wrs {
                p.post_send(end, wr).unwrap();
            }
        }
        p.settle();
        for (end, seed) in [(End::A, 1u64), (End::B, 2u64)] {
            let ctx = format!("{end:?} at MTU {}", mtu.bytes());
            let peer = other(end);
            let wcs = p.poll_send(end);
            assert_eq!(wcs.len(), 4, "{ctx}: {wcs:?}");
            let ops = [
                WcOpcode::Send,
                WcOpcode::RdmaWrite,
                WcOpcode::RdmaRead,
                WcOpcode::FetchAdd,
            ];
            for (i, (wc, op)) in wcs.iter().zip(ops).enumerate() {
                assert_send_wc(&p, end, wc, i as u64 + 1, op, &ctx);
            }
            let rwc = one(p.poll_recv(end), &ctx);
            assert_recv_wc(&p, end, &rwc, 10, WcOpcode::Recv, 5000, &ctx);
            // What the peer sent me, scattered over my two SGEs.
            let mut got = p.bytes(end, 40_000, 4000).to_vec();
            got.extend_from_slice(p.bytes(end, 44_500, 1000));
            assert_eq!(&got[..], p.bytes(peer, 0, 5000), "{ctx}: SEND data");
            assert_eq!(
                p.bytes(end, 16_000, 3000),
                p.bytes(peer, 8000, 3000),
                "{ctx}: WRITE"
            );
            assert_eq!(
                p.bytes(end, 32_000, 4000),
                p.bytes(peer, 24_000, 4000),
                "{ctx}: READ"
            );
            let peer_seed = 3 - seed;
            assert_eq!(
                word(&p, end, 60_000),
                100 * peer_seed,
                "{ctx}: FAA old value"
            );
            assert_eq!(
                word(&p, end, aligned(&p, end, 50_000)),
                100 * seed + 7,
                "{ctx}: FAA applied"
            );
        }
    }
}

#[test]
fn long_messages_span_many_ack_requests() {
    // At MTU 256 a 60 000-byte message is 235 packets: several ACK request
    // intervals, and more READ response packets than any other test.
    let mtu = Mtu::Mtu256;
    let mut p = pair(mtu);
    let len = 60_000u32;
    let n = len as usize;
    p.pattern(End::A, 0, n, 1);
    let rs = [p.sge(End::B, 0, len)];
    p.post_recv(End::B, 1, &rs).unwrap();
    let s = [p.sge(End::A, 0, len)];
    p.post_send(End::A, &SendWr::new(1, SendOp::Send, &s))
        .unwrap();
    let (a_tx, _) = settle_counting(&mut p);
    assert_eq!(a_tx, packets(len, mtu));
    let wc = one(p.poll_send(End::A), "SEND");
    assert_send_wc(&p, End::A, &wc, 1, WcOpcode::Send, "SEND");
    let wc = one(p.poll_recv(End::B), "SEND");
    assert_recv_wc(&p, End::B, &wc, 1, WcOpcode::Recv, len, "SEND");
    assert_eq!(p.bytes(End::B, 0, n), p.bytes(End::A, 0, n));

    p.pattern(End::A, 0, n, 2);
    let remote_addr = p.addr(End::B, 0);
    let rkey = p.rkey(End::B);
    p.post_send(
        End::A,
        &SendWr::new(2, SendOp::RdmaWrite { remote_addr, rkey }, &s),
    )
    .unwrap();
    let (a_tx, _) = settle_counting(&mut p);
    assert_eq!(a_tx, packets(len, mtu));
    let wc = one(p.poll_send(End::A), "WRITE");
    assert_send_wc(&p, End::A, &wc, 2, WcOpcode::RdmaWrite, "WRITE");
    assert_eq!(p.bytes(End::B, 0, n), p.bytes(End::A, 0, n));

    p.pattern(End::B, 0, n, 3);
    p.post_send(
        End::A,
        &SendWr::new(3, SendOp::RdmaRead { remote_addr, rkey }, &s),
    )
    .unwrap();
    let (a_tx, b_tx) = settle_counting(&mut p);
    assert_eq!((a_tx, b_tx), (1, packets(len, mtu)));
    let wc = one(p.poll_send(End::A), "READ");
    assert_send_wc(&p, End::A, &wc, 3, WcOpcode::RdmaRead, "READ");
    assert_eq!(wc.byte_len, len);
    assert_eq!(p.bytes(End::A, 0, n), p.bytes(End::B, 0, n));
}

#[test]
fn queues_wrap_around_their_rings() {
    // Several times the depth of both queues, in full batches.
    let mut p = pair(Mtu::Mtu1024);
    let depth = u64::from(p.opts.cap.max_recv_wr);
    assert_eq!(depth, u64::from(p.opts.cap.max_send_wr));
    for round in 0..4u64 {
        for i in 0..depth {
            let rs = [p.sge(End::B, 1000 * i as usize, 1000)];
            p.post_recv(End::B, round * 1000 + i, &rs).unwrap();
        }
        assert_eq!(
            p.post_recv(End::B, 9999, &[]),
            Err(PostError::QueueFull),
            "round {round}"
        );
        p.pattern(End::A, 0, 64 * 1000, round as u8);
        for i in 0..depth {
            let len = 1 + (i * 37 + round) as u32 % 1000;
            let s = [p.sge(End::A, 1000 * i as usize, len)];
            p.post_send(End::A, &SendWr::new(round * 1000 + i, SendOp::Send, &s))
                .unwrap();
        }
        p.settle();
        let sends = p.poll_send(End::A);
        let recvs = p.poll_recv(End::B);
        assert_eq!((sends.len(), recvs.len()), (depth as usize, depth as usize));
        for i in 0..depth {
            let len = 1 + (i * 37 + round) as u32 % 1000;
            let id = round * 1000 + i;
            assert_send_wc(&p, End::A, &sends[i as usize], id, WcOpcode::Send, "ring");
            assert_recv_wc(
                &p,
                End::B,
                &recvs[i as usize],
                id,
                WcOpcode::Recv,
                len,
                "ring",
            );
            let o = 1000 * i as usize;
            assert_eq!(
                p.bytes(End::B, o, len as usize),
                p.bytes(End::A, o, len as usize),
                "round {round}, message {i}"
            );
        }
    }
}
