//! UD bandwidth: pacing and the end of a run.
//!
//! UD is unreliable: a datagram that finds no receive posted, or that the network
//! drops, is gone, and nobody is told (IBA Vol 1 9.8.4: the UD service has no
//! acknowledgement and no retry). ib_send_bw on UD lets the sender run at the pace of
//! its send completions, so a receiver that falls behind loses most of the run on a
//! loopback, and a receiver waiting for a message count may wait forever. Here:
//!
//! - every data SEND carries the run's *tag* in its immediate data, so a straggler of an
//!   earlier run is never counted in a later one;
//! - the server reposts each receive as it completes, and answers every *checkpoint*
//!   (a SEND whose immediate data holds [`MARKER`], the tag and a checkpoint number:
//!   immediate data is the one part of a datagram the receiver reads with the
//!   completion, before a later datagram can reuse the buffer) with the tag, the number, how many data messages it received on that QP, and the
//!   time from the first to the last data message it received on any QP. It reposts
//!   before it answers, and a checkpoint follows the data on the same path, so an
//!   answered checkpoint means every message sent before it was taken or lost;
//! - the client sends a checkpoint every [`CHECKPOINT_EVERY`] messages per QP and never
//!   has more than [`WINDOW`] messages (half the server's receive queue) sent after the
//!   last answered one: the window the server's receive queue advertises, so the
//!   receiver is not overrun. A checkpoint or its answer may be lost too: without an
//!   answer for [`RETRY`] the client sends a new checkpoint;
//! - the run ends when the checkpoint sent after the last message is answered; the
//!   server answers until the client says `FIN` on the control connection (it cannot
//!   know whether its answer arrived);
//! - then both ends reset their QPs (RESET empties the receive queue without
//!   completions) and bring them back to RTS, so the next run starts with none of this
//!   run's receives posted.
//!
//! The client reports messages received and lost, and bandwidth from what arrived over
//! the longer of its own time (first post to last send completion) and the server's.

use super::{Plan, Side, Step, RX_DEPTH};
use crate::conn::Ctrl;
use crate::conn::{check_wc, Spin, STALL};
use crate::progress::Progress;
use crate::stats::peak_rate;
use crate::{fail, Result};
use softverbs::{Payload, SendFlags, SendWr, Sge, WcOpcode, WorkCompletion};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Set in the immediate data of a checkpoint (clear in a data SEND's, which is the tag);
/// below it, the tag (16 bits) and the checkpoint's number (15 bits).
pub const MARKER: u32 = 1 << 31;
const NUMBER_BITS: u32 = 15;
const NUMBER_MASK: u32 = (1 << NUMBER_BITS) - 1;
/// Messages a QP may have sent after its last answered checkpoint.
const WINDOW: u64 = RX_DEPTH as u64 / 2;
/// A checkpoint every this many messages keeps the window moving.
const CHECKPOINT_EVERY: u64 = WINDOW / 4;
/// Checkpoints remembered while unanswered (older ones are given up).
const PENDING_MAX: usize = 64;
/// Without an answer for this long the client sends a new checkpoint: many loopback
/// round trips, yet short enough that a lost one costs little.
const RETRY: Duration = Duration::from_millis(20);
/// The GRH area at the start of every UD receive buffer.
const GRH: usize = 40;
/// An answer: the tag (BE32), the checkpoint's number (BE32), the data messages
/// received on the QP (BE64), the nanoseconds from the first to the last data message
/// received (BE64).
const ANSWER_LEN: usize = 24;
/// The client's receives for answers: this many slots per QP of this many bytes each.
const ANSWER_SLOTS: u64 = 16;
const SLOT: usize = 128;
/// Work request ids: data SENDs are 1, 2, ...; a checkpoint's is this bit and the
/// number of data messages posted before it; the server's answers use this one.
const CHECKPOINT_WR: u64 = 1 << 63;
const ANSWER_WR: u64 = u64::MAX;

/// The tag of the `run`-th measurement of a session (both ends count them); 16 bits.
pub fn tag(run: u32) -> u32 {
    run.wrapping_add(1) & 0xffff
}

/// A checkpoint's immediate data.
fn checkpoint_imm(tag: u32, number: u32) -> u32 {
    MARKER | (tag & 0xffff) << NUMBER_BITS | (number & NUMBER_MASK)
}

fn qp_index(side: &Side) -> HashMap<u32, usize> {
    side.qps
        .iter()
        .enumerate()
        .map(|(i, e)| (e.qp.qpn().value(), i))
        .collect()
}

fn is_recv(wc: &WorkCompletion) -> bool {
    matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm)
}

fn be32(b: &[u8]) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[..4]);
    u32::from_be_bytes(w)
}

fn be64(b: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[..8]);
    u64::from_be_bytes(w)
}

/// What a UD run measured.
pub struct UdResult {
    /// From the first post to the last send completion, as the sender saw it.
    pub sender_seconds: f64,
    /// From the first to the last data message received, as the server saw it.
    pub receiver_seconds: f64,
    /// (seconds, data SENDs completed) along the way, for the peak.
    pub samples: Vec<(f64, u64)>,
    /// Data messages the server received, all QPs.
    pub received: u64,
}

/// One QP of the sender.
#[derive(Default)]
struct Sender {
    posted: u64,
    /// Data SENDs known complete (a signaled one, or a checkpoint, retires those before).
    done: u64,
    /// Messages the server accounted for: those sent before its last answered checkpoint.
    resolved: u64,
    /// Unanswered checkpoints: (number, messages sent before it).
    pending: VecDeque<(u32, u64)>,
    next_checkpoint: u32,
    /// Messages sent before the last checkpoint.
    checkpoint_at: u64,
    last_checkpoint: Option<Instant>,
    /// A checkpoint's SEND has not completed yet (one at a time keeps a slot free).
    checkpoint_in_flight: bool,
    received: u64,
    last_answer: Option<Instant>,
}

/// The client's side of a UD SEND bandwidth run.
pub fn client_run(
    side: &Side,
    step: &Step,
    plan: &Plan,
    tag: u32,
    progress: &mut Progress,
) -> Result<UdResult> {
    let nq = side.qps.len();
    let index = qp_index(side);
    let iters = step.iters as u64;
    // One slot of the send queue is kept for a checkpoint.
    let depth = (plan.tx_depth.min(side.max_send_wr) as u64)
        .min(side.max_send_wr as u64 - 1)
        .max(1);
    let cq_mod = (plan.cq_mod as u64).clamp(1, depth);
    let total = iters * nq as u64;
    let mut ops = Vec::with_capacity(nq);
    let mut sges: Vec<[Sge; 1]> = Vec::with_capacity(nq);
    for e in &side.qps {
        let Some(peer) = e.ud else {
            fail!("a UD run on a QP with no UD peer");
        };
        ops.push((peer, peer.ah.send(peer.qpn, peer.qkey, Some(tag))));
        sges.push([e.mr.sge(side.region, step.size)]);
        for slot in 0..ANSWER_SLOTS {
            e.qp.post_recv(slot, &[e.mr.sge(slot as usize * SLOT, SLOT as u32)])?;
        }
    }
    let mut qs: Vec<Sender> = (0..nq).map(|_| Sender::default()).collect();
    let mut finished = 0;
    let mut span_ns = 0u64;
    let mut total_done = 0u64;
    let mut sender_seconds = 0.0;
    let mut wrs: Vec<SendWr<'_>> = Vec::with_capacity(depth as usize);
    let mut wcs = [WorkCompletion::default(); 64];
    let mut samples = vec![(0.0, 0u64)];
    let mut spin = Spin::new();
    let start = Instant::now();
    while finished < nq {
        let now = Instant::now();
        let mut posted_any = false;
        for (q, s) in qs.iter_mut().enumerate() {
            let e = &side.qps[q];
            // Data, within the window and the send queue.
            let limit = iters.min(s.resolved + WINDOW);
            let room = depth - (s.posted - s.done);
            let n = room.min(limit - s.posted);
            let outstanding = s.posted - s.done;
            // Post in batches of a moderation period while a signaled WR is out.
            if n > 0 && (n >= cq_mod || s.posted + n == limit || outstanding < cq_mod) {
                wrs.clear();
                for k in 1..=n {
                    let id = s.posted + k;
                    let flags = if id % cq_mod == 0 || id == iters {
                        SendFlags::SIGNALED
                    } else {
                        SendFlags::EMPTY
                    };
                    wrs.push(SendWr {
                        wr_id: id,
                        op: ops[q].1,
                        payload: Payload::Sges(&sges[q]),
                        flags,
                    });
                }
                if let Err((i, err)) = e.qp.post_send_list(&wrs) {
                    fail!("post_send failed after {} WRs: {err}", s.posted + i as u64);
                }
                s.posted += n;
                posted_any = true;
            }
            // A checkpoint: every CHECKPOINT_EVERY messages, after the last one, or
            // again when nothing was answered for RETRY.
            let all_resolved = s.resolved == iters;
            let quiet = s
                .last_answer
                .max(s.last_checkpoint)
                .is_none_or(|t| now - t >= RETRY);
            let due = s.posted - s.checkpoint_at >= CHECKPOINT_EVERY
                || (s.posted == iters && s.checkpoint_at < iters)
                || (!s.pending.is_empty() && quiet);
            if !all_resolved && due && !s.checkpoint_in_flight {
                let number = s.next_checkpoint & NUMBER_MASK;
                s.next_checkpoint = s.next_checkpoint.wrapping_add(1);
                let peer = ops[q].0;
                e.qp.post_send(&SendWr {
                    wr_id: CHECKPOINT_WR | s.posted,
                    op: peer
                        .ah
                        .send(peer.qpn, peer.qkey, Some(checkpoint_imm(tag, number))),
                    payload: Payload::Inline(&[]),
                    flags: SendFlags::SIGNALED,
                })?;
                if s.pending.len() == PENDING_MAX {
                    s.pending.pop_front();
                }
                s.pending.push_back((number, s.posted));
                s.checkpoint_at = s.posted;
                s.last_checkpoint = Some(now);
                s.checkpoint_in_flight = true;
                posted_any = true;
            }
        }
        let k = side.cq.poll(&mut wcs);
        for wc in &wcs[..k] {
            check_wc(wc)?;
            let Some(&q) = index.get(&wc.qp_num.value()) else {
                fail!("completion for unknown QP {:#x}", wc.qp_num.value());
            };
            let s = &mut qs[q];
            if !is_recv(wc) {
                // Completions of a QP come in order: this one retires all before it.
                if wc.wr_id & CHECKPOINT_WR != 0 {
                    s.checkpoint_in_flight = false;
                }
                let upto = (wc.wr_id & !CHECKPOINT_WR).max(s.done);
                total_done += upto - s.done;
                s.done = upto;
                if total_done == total && sender_seconds == 0.0 {
                    sender_seconds = start.elapsed().as_secs_f64();
                }
                continue;
            }
            let e = &side.qps[q];
            let slot = wc.wr_id as usize % ANSWER_SLOTS as usize;
            let mut answer = [0u8; ANSWER_LEN];
            let ok = wc.byte_len as usize >= GRH + ANSWER_LEN
                && e.mr.read(slot * SLOT + GRH, &mut answer)
                && be32(&answer) == tag;
            e.qp.post_recv(wc.wr_id, &[e.mr.sge(slot * SLOT, SLOT as u32)])?;
            if !ok {
                continue; // another run's answer
            }
            let number = be32(&answer[4..]);
            let Some(i) = s.pending.iter().position(|&(n, _)| n == number) else {
                continue; // a repeat, or a checkpoint given up
            };
            // Answers may overtake each other; the newest one says the most.
            let at = s.pending[i].1;
            s.pending.drain(..=i);
            let was_done = s.resolved == iters;
            s.resolved = s.resolved.max(at);
            s.received = s.received.max(be64(&answer[8..]));
            span_ns = span_ns.max(be64(&answer[16..]));
            s.last_answer = Some(Instant::now());
            if s.resolved == iters && !was_done {
                finished += 1;
            }
        }
        if k > 0 {
            spin.progress();
            if samples.last().is_some_and(|&(_, n)| n < total_done) {
                samples.push((start.elapsed().as_secs_f64(), total_done));
                progress.update(total_done, total);
            }
        } else if !posted_any {
            spin.idle("waiting for the server's answers")?;
        }
        // Checkpoints keep going out while the server is silent: give up after STALL.
        let heard = qs
            .iter()
            .filter_map(|s| s.last_answer)
            .max()
            .unwrap_or(start);
        if heard.elapsed() > STALL {
            fail!(
                "the server answered no checkpoint for {} s (UD run, {} of {nq} QP(s) done)",
                STALL.as_secs(),
                finished
            );
        }
    }
    // The last checkpoints' SENDs complete here, not in the next run.
    while qs.iter().any(|s| s.checkpoint_in_flight) {
        let k = side.cq.poll(&mut wcs);
        for wc in &wcs[..k] {
            check_wc(wc)?;
            if let Some(&q) = index.get(&wc.qp_num.value()) {
                if !is_recv(wc) && wc.wr_id & CHECKPOINT_WR != 0 {
                    qs[q].checkpoint_in_flight = false;
                }
            }
        }
        if k > 0 {
            spin.progress();
        } else {
            spin.idle("waiting for the last checkpoint's completion")?;
        }
    }
    retire_receives(side)?;
    if sender_seconds == 0.0 {
        sender_seconds = start.elapsed().as_secs_f64();
    }
    Ok(UdResult {
        sender_seconds,
        receiver_seconds: span_ns as f64 * 1e-9,
        samples,
        received: qs.iter().map(|s| s.received).sum(),
    })
}

/// The peak of a UD run: the sender's best stretch covering a sixteenth of it.
pub fn peak_msgs(r: &UdResult, total: u64, cq_mod: u64) -> f64 {
    peak_rate(&r.samples, (total / 16).max(cq_mod).min(total))
}

/// The server's preparation: a full receive queue on every QP, each receive the
/// whole first region (any message of the session fits).
pub fn server_prepare(side: &Side) -> Result<()> {
    for e in &side.qps {
        let sge = [e.mr.sge(0, side.region as u32)];
        for i in 0..RX_DEPTH as u64 {
            e.qp.post_recv(i, &sge)?;
        }
    }
    Ok(())
}

/// The server: counts this run's data messages, reposting every receive, and answers
/// checkpoints until `fin` (the client's FIN) is set; then leaves no receive posted.
pub fn server_receive(side: &Side, tag: u32, fin: &AtomicBool) -> Result<()> {
    let nq = side.qps.len();
    let index = qp_index(side);
    let recv_len = side.region as u32;
    let mut got = vec![0u64; nq];
    // First and last data message of the run.
    let mut first: Option<Instant> = None;
    let mut last_ns = 0u64;
    let mut answers_out = vec![0u32; nq];
    let max_answers = side.max_send_wr.saturating_sub(1).max(1);
    let mut wcs = [WorkCompletion::default(); 64];
    let mut spin = Spin::new();
    loop {
        let k = side.cq.poll(&mut wcs);
        for wc in &wcs[..k] {
            check_wc(wc)?;
            let Some(&q) = index.get(&wc.qp_num.value()) else {
                fail!("completion for unknown QP {:#x}", wc.qp_num.value());
            };
            if !is_recv(wc) {
                answers_out[q] = answers_out[q].saturating_sub(1);
                continue;
            }
            let e = &side.qps[q];
            e.qp.post_recv(wc.wr_id, &[e.mr.sge(0, recv_len)])?;
            match wc.imm_data {
                Some(imm) if imm == tag => {
                    got[q] += 1;
                    let start = *first.get_or_insert_with(Instant::now);
                    last_ns = start.elapsed().as_nanos().try_into().unwrap_or(u64::MAX);
                }
                // A full send queue drops this answer; the client asks again.
                Some(imm)
                    if imm & !NUMBER_MASK == checkpoint_imm(tag, 0)
                        && answers_out[q] < max_answers =>
                {
                    let Some(peer) = e.ud else {
                        fail!("QP {q} is not a UD QP");
                    };
                    let mut answer = [0u8; ANSWER_LEN];
                    answer[..4].copy_from_slice(&tag.to_be_bytes());
                    answer[4..8].copy_from_slice(&(imm & NUMBER_MASK).to_be_bytes());
                    answer[8..16].copy_from_slice(&got[q].to_be_bytes());
                    answer[16..].copy_from_slice(&last_ns.to_be_bytes());
                    e.qp.post_send(&SendWr {
                        wr_id: ANSWER_WR,
                        op: peer.ah.send(peer.qpn, peer.qkey, None),
                        payload: Payload::Inline(&answer),
                        flags: SendFlags::SIGNALED,
                    })?;
                    answers_out[q] += 1;
                }
                // Another run's datagram, or a checkpoint we have no room to answer.
                _ => {}
            }
        }
        if k > 0 {
            spin.progress();
        } else if fin.load(Ordering::Acquire) {
            break;
        } else {
            spin.idle("receiving SENDs")?;
        }
    }
    // Answers still in flight complete here, not in the next run.
    while answers_out.iter().any(|&n| n > 0) {
        let k = side.cq.poll(&mut wcs);
        for wc in &wcs[..k] {
            check_wc(wc)?;
            if let Some(&q) = index.get(&wc.qp_num.value()) {
                if !is_recv(wc) {
                    answers_out[q] = answers_out[q].saturating_sub(1);
                }
            }
        }
        if k > 0 {
            spin.progress();
        } else {
            spin.idle("waiting for the last answer's completion")?;
        }
    }
    retire_receives(side)
}

/// RESET empties the receive queue without completions (ibv_modify_qp(3)); then back
/// to RTS with the same Q_Key and PSN. Completions of this run still in the CQ (datagrams
/// that arrived after the last poll) are dropped with it.
pub(super) fn retire_receives(side: &Side) -> Result<()> {
    for e in &side.qps {
        let qkey = e.qp.query().qkey;
        e.qp.to_reset()?;
        e.qp.ud_to_init(qkey)?;
        e.qp.ud_to_rtr()?;
        e.qp.to_rts(softverbs::RtsAttr {
            sq_psn: e.psn,
            ..Default::default()
        })?;
    }
    let mut wcs = [WorkCompletion::default(); 64];
    while side.cq.poll(&mut wcs) > 0 {}
    Ok(())
}

/// Runs `serve` on this thread while another waits for the client's `FIN` on the
/// control connection and then sets the flag `serve` watches: a UD server cannot tell
/// from its QP when the client has all it needs.
pub fn serve_until_fin(
    ctrl: &mut Ctrl,
    serve: impl FnOnce(&AtomicBool) -> Result<()>,
) -> Result<()> {
    let fin = AtomicBool::new(false);
    let (fin_result, result) = std::thread::scope(|s| {
        let waiter = s.spawn(|| {
            let r = ctrl.expect("FIN");
            fin.store(true, Ordering::Release);
            r.map_err(|e| e.to_string())
        });
        let result = serve(&fin);
        (waiter.join(), result)
    });
    result?;
    match fin_result {
        Ok(r) => Ok(r?),
        Err(_) => fail!("the control connection's reader panicked"),
    }
}
