//! How a UD bandwidth run ends.
//!
//! UD is unreliable: a datagram that finds no receive posted, or that the network
//! drops, is gone, and nobody is told (IBA Vol 1 9.8.4: the UD service has no
//! acknowledgement and no retry). So, as ib_send_bw does on UD, the sender paces itself by
//! its own send completions only, the receiver reposts each receive as it completes, and
//! when the receiver falls behind, datagrams are lost. The receiver therefore cannot wait
//! for a message count; instead the run ends with an exchange of its own:
//!
//! - every data SEND carries the run's *tag* in its immediate data, so a straggler of an
//!   earlier run is never counted in a later one;
//! - after its last data SEND completed, the client sends an *end-of-test marker* (the
//!   tag with [`MARKER`] set) on every QP, and repeats it every [`MARKER_RETRY`] until
//!   that QP's answer arrives: the tag, how many data messages the server received on
//!   the QP, and the time from the first to the last data message the server received
//!   on any QP. Marker and answer are datagrams too and may be lost; the marker follows the
//!   data on the same path, so the count it draws covers everything that arrived;
//! - the server answers every marker it gets until the client says `FIN` on the control
//!   connection (the client does once every QP was answered), since it cannot know
//!   whether its answer arrived;
//! - then the server resets its QPs (RESET empties the receive queue without
//!   completions) and brings them back to RTS, so the next run starts with none of this
//!   run's receives left posted.
//!
//! The client reports messages received and lost, and bandwidth from what arrived, over
//! the longer of its own time (first post to last send completion) and the server's (a
//! receiver that fell behind is still draining its socket when the sender is done).

use super::{Side, RX_DEPTH};
use crate::conn::{check_wc, Spin, STALL};
use crate::{fail, Result};
use softverbs::{Payload, SendFlags, SendWr, WcOpcode, WorkCompletion};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Set in the immediate data of an end-of-test marker (clear in a data SEND's).
pub const MARKER: u32 = 1 << 31;
/// How long the client waits for an answer before it sends the marker again: many
/// loopback round trips, yet short enough that a lost marker costs little.
const MARKER_RETRY: Duration = Duration::from_millis(20);
/// The GRH area at the start of every UD receive buffer.
const GRH: usize = 40;
/// An answer: the tag (BE32), the data messages received on the QP (BE64), the
/// nanoseconds from the first to the last data message received (BE64).
const ANSWER_LEN: usize = 20;
/// Work request ids of the exchange (data SENDs use 1, 2, ...).
const MARKER_WR: u64 = u64::MAX;
const ANSWER_WR: u64 = u64::MAX - 1;

/// The tag of the `run`-th measurement of a session (both ends count them).
pub fn tag(run: u32) -> u32 {
    (run.wrapping_add(1)) & !MARKER
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

/// What the server says at the end of a run.
pub struct Received {
    /// Data messages received, per QP.
    pub per_qp: Vec<u64>,
    /// From the first to the last data message received (any QP).
    pub seconds: f64,
}

/// The client, after its last data SEND completed: markers until every QP is answered.
pub fn client_end(side: &Side, tag: u32) -> Result<Received> {
    let nq = side.qps.len();
    let index = qp_index(side);
    // The whole first region: any datagram fits, so none completes in error.
    let recv_len = side.region as u32;
    for e in &side.qps {
        e.qp.post_recv(ANSWER_WR, &[e.mr.sge(0, recv_len)])?;
    }
    let marker = (tag | MARKER).to_be_bytes();
    let mut received: Vec<Option<u64>> = vec![None; nq];
    let mut span_ns = 0u64;
    let mut marker_out = vec![false; nq];
    let mut answered = 0;
    let started = Instant::now();
    let mut next_try = started;
    let mut wcs = [WorkCompletion::default(); 16];
    let mut spin = Spin::new();
    while answered < nq {
        let now = Instant::now();
        if now >= next_try {
            if now - started > STALL {
                fail!(
                    "the server answered no end-of-test marker on {} of {nq} QP(s) for {} s",
                    nq - answered,
                    STALL.as_secs()
                );
            }
            for (q, e) in side.qps.iter().enumerate() {
                // One marker in flight per QP keeps the send queue from filling.
                if received[q].is_some() || marker_out[q] {
                    continue;
                }
                let Some(peer) = e.ud else {
                    fail!("QP {q} is not a UD QP");
                };
                e.qp.post_send(&SendWr {
                    wr_id: MARKER_WR,
                    op: peer.ah.send(peer.qpn, peer.qkey, Some(tag | MARKER)),
                    payload: Payload::Inline(&marker),
                    flags: SendFlags::SIGNALED,
                })?;
                marker_out[q] = true;
            }
            next_try = now + MARKER_RETRY;
        }
        let k = side.cq.poll(&mut wcs);
        for wc in &wcs[..k] {
            check_wc(wc)?;
            let Some(&q) = index.get(&wc.qp_num.value()) else {
                fail!("completion for unknown QP {:#x}", wc.qp_num.value());
            };
            if !is_recv(wc) {
                marker_out[q] = false;
                continue;
            }
            let e = &side.qps[q];
            let mut answer = [0u8; ANSWER_LEN];
            let fits = wc.byte_len as usize >= GRH + ANSWER_LEN;
            let ours = fits
                && e.mr.read(GRH, &mut answer)
                && answer[..4] == tag.to_be_bytes()
                && received[q].is_none();
            if ours {
                let word = |at: usize| {
                    let mut w = [0u8; 8];
                    w.copy_from_slice(&answer[at..at + 8]);
                    u64::from_be_bytes(w)
                };
                received[q] = Some(word(4));
                span_ns = span_ns.max(word(12));
                answered += 1;
            } else {
                // Not this run's answer (a repeat, or a straggler): wait for the next.
                e.qp.post_recv(ANSWER_WR, &[e.mr.sge(0, recv_len)])?;
            }
        }
        if k > 0 {
            spin.progress();
        } else {
            spin.idle("waiting for the end-of-test answer")?;
        }
    }
    // Markers still in flight complete here, not in the next run.
    while marker_out.iter().any(|&m| m) {
        let k = side.cq.poll(&mut wcs);
        for wc in &wcs[..k] {
            check_wc(wc)?;
            if let Some(&q) = index.get(&wc.qp_num.value()) {
                if !is_recv(wc) {
                    marker_out[q] = false;
                }
            }
        }
        if k > 0 {
            spin.progress();
        } else {
            spin.idle("waiting for the last marker's completion")?;
        }
    }
    Ok(Received {
        per_qp: received.into_iter().map(|r| r.unwrap_or(0)).collect(),
        seconds: span_ns as f64 * 1e-9,
    })
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
/// markers until `fin` (the client's FIN) is set; then leaves no receive posted.
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
                Some(imm) if imm == tag | MARKER && answers_out[q] < max_answers => {
                    let Some(peer) = e.ud else {
                        fail!("QP {q} is not a UD QP");
                    };
                    let mut answer = [0u8; ANSWER_LEN];
                    answer[..4].copy_from_slice(&tag.to_be_bytes());
                    answer[4..12].copy_from_slice(&got[q].to_be_bytes());
                    answer[12..].copy_from_slice(&last_ns.to_be_bytes());
                    e.qp.post_send(&SendWr {
                        wr_id: ANSWER_WR,
                        op: peer.ah.send(peer.qpn, peer.qkey, None),
                        payload: Payload::Inline(&answer),
                        flags: SendFlags::SIGNALED,
                    })?;
                    answers_out[q] += 1;
                }
                // Another run's datagram, or a marker we have no room to answer.
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
fn retire_receives(side: &Side) -> Result<()> {
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
