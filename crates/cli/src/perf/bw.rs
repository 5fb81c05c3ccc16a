//! Bandwidth: keep `tx_depth` work requests outstanding on every QP, signal one in
//! `cq_mod`, and divide the bytes moved by the time from the first post to the
//! last completion.

use super::{ud, Plan, Side, Step, RX_DEPTH};
use crate::conn::{check_wc, Spin};
use crate::progress::Progress;
use crate::stats::peak_rate;
use crate::{fail, Op, Result};
use softverbs::{Payload, Rkey, SendFlags, SendOp, SendWr, Sge, WorkCompletion};
use std::collections::HashMap;
use std::time::Instant;

/// perftest's MB.
const MB: f64 = (1u64 << 20) as f64;

pub struct BwResult {
    /// Messages per QP.
    pub iters: u64,
    pub peak_mbs: f64,
    pub avg_mbs: f64,
    pub msg_rate_mpps: f64,
    pub seconds: f64,
    /// UD: the messages that arrived (all QPs); the rest were lost.
    pub received: Option<u64>,
}

/// The work request a QP repeats.
fn op_for(side: &Side, q: usize, op: Op) -> SendOp {
    let r = &side.qps[q].remote;
    match op {
        Op::Write => SendOp::RdmaWrite {
            remote_addr: r.vaddr,
            rkey: Rkey(r.rkey),
        },
        Op::Read => SendOp::RdmaRead {
            remote_addr: r.vaddr,
            rkey: Rkey(r.rkey),
        },
        Op::Send => side.qps[q].send_op(),
        Op::Atomic => SendOp::AtomicFetchAdd {
            remote_addr: r.vaddr,
            rkey: Rkey(r.rkey),
            add: 1,
        },
    }
}

/// Samples kept by a run of a given duration (it may be long: the memory it
/// uses must not grow with it; 16 KiB, touched as the run goes).
const TIMED_SAMPLES: u32 = 1024;

/// The client's side: posts and measures. A run of a given duration posts
/// until the time is up, then up to the next signaled WR, and waits for that.
/// SENDs over UD go by [`ud::client_run`] (tagged with `tag`).
pub fn bw_client(
    side: &Side,
    op: Op,
    step: &Step,
    plan: &Plan,
    tag: u32,
    progress: &mut Progress,
) -> Result<BwResult> {
    if op == Op::Send && side.qps.iter().any(|e| e.ud.is_some()) {
        return ud_bw_client(side, step, plan, tag, progress);
    }
    let nq = side.qps.len();
    let timed = step.duration;
    // Per QP; a timed run learns it when the time is up.
    let mut iters = if timed.is_some() {
        u64::MAX
    } else {
        step.iters as u64
    };
    let depth = plan.tx_depth.min(side.max_send_wr) as u64;
    let cq_mod = (plan.cq_mod as u64).clamp(1, depth);
    let len = if op == Op::Atomic { 8 } else { step.size };
    let sges: Vec<[Sge; 1]> = side
        .qps
        .iter()
        .map(|e| [e.mr.sge(side.region, len)])
        .collect();
    let ops: Vec<SendOp> = (0..nq).map(|q| op_for(side, q, op)).collect();
    let index: HashMap<u32, usize> = side
        .qps
        .iter()
        .enumerate()
        .map(|(i, e)| (e.qp.qpn().value(), i))
        .collect();
    let mut total = iters.saturating_mul(nq as u64);
    let mut posted = vec![0u64; nq];
    let mut done = vec![0u64; nq];
    let mut total_done = 0u64;
    let mut wrs: Vec<SendWr<'_>> = Vec::with_capacity(depth as usize);
    let mut wcs = [WorkCompletion::default(); 64];
    // A timed run samples at most every `interval` seconds.
    let (interval, cap) = match timed {
        Some(d) => (
            (d.as_secs_f64() / TIMED_SAMPLES as f64).max(1e-3),
            TIMED_SAMPLES as usize + 2,
        ),
        None => (0.0, (total / cq_mod + nq as u64 + 2) as usize),
    };
    let mut samples: Vec<(f64, u64)> = Vec::with_capacity(cap);
    let mut spin = Spin::new();
    let start = Instant::now();
    let deadline = timed.map(|d| start + d);
    samples.push((0.0, 0));
    while total_done < total {
        if let Some(end) = deadline {
            if iters == u64::MAX && Instant::now() >= end {
                // Stop at a signaled WR: the next multiple of cq_mod at or
                // after what the QP furthest ahead posted.
                let furthest = posted.iter().copied().max().unwrap_or(0);
                iters = furthest.div_ceil(cq_mod).max(1) * cq_mod;
                // If all that is already done, the run would end before its
                // deadline: go on for one more period, so it lasts the duration.
                if iters == furthest && posted.iter().zip(&done).all(|(p, d)| p == d) {
                    iters += cq_mod;
                }
                total = iters * nq as u64;
            }
        }
        let mut posted_any = false;
        for q in 0..nq {
            let room = depth - (posted[q] - done[q]);
            let n = room.min(iters - posted[q]);
            // Post in batches of at least one moderation period, as slots free
            // up; waiting is safe while a signaled WR is outstanding (any
            // cq_mod consecutive WRs include one).
            let outstanding = posted[q] - done[q];
            if n == 0 || (n < cq_mod && posted[q] + n < iters && outstanding >= cq_mod) {
                continue;
            }
            wrs.clear();
            for k in 1..=n {
                let id = posted[q] + k;
                let flags = if id % cq_mod == 0 || id == iters {
                    SendFlags::SIGNALED
                } else {
                    SendFlags::EMPTY
                };
                wrs.push(SendWr {
                    wr_id: id,
                    op: ops[q],
                    payload: Payload::Sges(&sges[q]),
                    flags,
                });
            }
            if let Err((i, e)) = side.qps[q].qp.post_send_list(&wrs) {
                fail!("post_send failed after {} WRs: {e}", posted[q] + i as u64);
            }
            posted[q] += n;
            posted_any = true;
        }
        let k = side.cq.poll(&mut wcs);
        for wc in &wcs[..k] {
            check_wc(wc)?;
            let Some(&q) = index.get(&wc.qp_num.value()) else {
                fail!("completion for unknown QP {:#x}", wc.qp_num.value());
            };
            // Completions of a QP come in order; the signaled one retires all
            // earlier unsignaled ones.
            total_done += wc.wr_id - done[q];
            done[q] = wc.wr_id;
        }
        if k > 0 {
            let now = start.elapsed().as_secs_f64();
            let last = samples.last().map_or(0.0, |s| s.0);
            if timed.is_none() || total_done >= total || now - last >= interval {
                samples.push((now, total_done));
            }
            spin.progress();
            match timed {
                Some(d) => progress.update(
                    start.elapsed().min(d).as_millis() as u64,
                    d.as_millis() as u64,
                ),
                None => progress.update(total_done, total),
            }
        } else if !posted_any {
            spin.idle("waiting for send completions")?;
        }
    }
    let seconds = samples.last().map_or(0.0, |s| s.0).max(1e-9);
    let bytes_per_msg = len as f64;
    let msgs = total as f64;
    // Peak: the best stretch covering a sixteenth of the run (at least one
    // moderation period per QP).
    let window = (total / 16).max(cq_mod * nq as u64).min(total);
    let peak_msgs = peak_rate(&samples, window).max(msgs / seconds);
    Ok(BwResult {
        iters,
        peak_mbs: peak_msgs * bytes_per_msg / MB,
        avg_mbs: msgs * bytes_per_msg / seconds / MB,
        msg_rate_mpps: msgs / seconds / 1e6,
        seconds,
        received: None,
    })
}

/// UD: figures from the messages that arrived, over the longer of the sender's and the
/// receiver's time (a receiver that fell behind is still draining its socket when the
/// sender is done).
fn ud_bw_client(
    side: &Side,
    step: &Step,
    plan: &Plan,
    tag: u32,
    progress: &mut Progress,
) -> Result<BwResult> {
    let r = ud::client_run(side, step, plan, tag, progress)?;
    let iters = step.iters as u64;
    let total = iters * side.qps.len() as u64;
    let seconds = r.sender_seconds.max(r.receiver_seconds).max(1e-9);
    let msgs = r.received as f64;
    let delivered = msgs / total.max(1) as f64;
    // The sender's best stretch, scaled by the share that arrived.
    let cq_mod = plan.cq_mod.max(1) as u64;
    let peak = (ud::peak_msgs(&r, total, cq_mod) * delivered).max(msgs / seconds);
    let bytes = step.size as f64;
    Ok(BwResult {
        iters,
        peak_mbs: peak * bytes / MB,
        avg_mbs: msgs * bytes / seconds / MB,
        msg_rate_mpps: msgs / seconds / 1e6,
        seconds,
        received: Some(r.received),
    })
}

/// A SEND receiver's preparation: receives posted on every QP. Returns how many
/// each QP has posted.
pub fn recv_prepare(side: &Side, step: &Step) -> Result<Vec<u64>> {
    let first = (RX_DEPTH as u64).min(step.iters as u64);
    let mut posted = Vec::with_capacity(side.qps.len());
    for e in &side.qps {
        let sge = [e.mr.sge(0, step.size + e.recv_extra())];
        for i in 0..first {
            e.qp.post_recv(i, &sge)?;
        }
        posted.push(first);
    }
    Ok(posted)
}

/// A SEND receiver: reposts receives until every message arrived.
pub fn recv_server(side: &Side, step: &Step, posted: &mut [u64]) -> Result<()> {
    let iters = step.iters as u64;
    let total = iters * side.qps.len() as u64;
    let index: HashMap<u32, usize> = side
        .qps
        .iter()
        .enumerate()
        .map(|(i, e)| (e.qp.qpn().value(), i))
        .collect();
    let mut got = 0u64;
    let mut wcs = [WorkCompletion::default(); 64];
    let mut spin = Spin::new();
    while got < total {
        let k = side.cq.poll(&mut wcs);
        for wc in &wcs[..k] {
            check_wc(wc)?;
            let Some(&q) = index.get(&wc.qp_num.value()) else {
                fail!("completion for unknown QP {:#x}", wc.qp_num.value());
            };
            got += 1;
            if posted[q] < iters {
                let e = &side.qps[q];
                e.qp.post_recv(posted[q], &[e.mr.sge(0, step.size + e.recv_extra())])?;
                posted[q] += 1;
            }
        }
        if k > 0 {
            spin.progress();
        } else {
            spin.idle("receiving SENDs")?;
        }
    }
    Ok(())
}
