//! Latency, on the first QP.
//!
//! - write: like ib_write_lat, each side RDMA-WRITEs the other's buffer (every WRITE
//!   signaled, its completion polled before the next step) and polls the last byte of
//!   its own for the iteration's tag; the client reports half of each round trip.
//! - send: like ib_send_lat, a SEND ping-pong, each SEND signaled and its completion
//!   polled before the next step; half of each round trip.
//! - read, atomic: one operation at a time, the time to its completion.

use super::{QpEnd, Side, Step, INLINE_MAX, RX_DEPTH};
use crate::conn::{check_wc, Spin};
use crate::progress::Progress;
use crate::{Op, Result};
use softverbs::{Payload, Rkey, SendFlags, SendOp, SendWr, WcOpcode, WorkCompletion};
use std::sync::atomic::{fence, Ordering};
use std::time::Instant;

/// The byte iteration `i` leaves at the end of the peer's buffer: never the same
/// for consecutive iterations, never 0 (the reset value).
fn tag(i: u64) -> u8 {
    (i % 255) as u8 + 1
}

fn usec(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e6
}

/// Polls the last byte the peer writes until it carries `want`.
fn wait_byte(e: &QpEnd, offset: usize, want: u8) -> Result<()> {
    let mut spin = Spin::new();
    let mut b = [0u8];
    loop {
        // The engine writes the buffer from another thread, as a NIC would by
        // DMA; the fence keeps the compiler from caching the byte across rounds.
        fence(Ordering::Acquire);
        e.mr.read(offset, &mut b);
        if b[0] == want {
            return Ok(());
        }
        spin.idle("waiting for the peer's RDMA WRITE")?;
    }
}

/// Clears the polled byte before a WRITE latency run.
pub fn write_prepare(side: &Side, size: u32) {
    side.qps[0].mr.write(size as usize - 1, &[0]);
}

/// Polls the CQ until the WRITE with `wr_id` completed. ib_write_lat does the same
/// after every post (perftest's `run_iter_lat_write`: every WRITE signaled, the send
/// CQ polled until its completion before the process spins on memory), so for most of
/// a round trip each side has a thread polling its CQ, which receives the peer's WRITE
/// itself instead of leaving it to the progress thread.
fn wait_write_done(side: &Side, wr_id: u64) -> Result<()> {
    let mut wcs = [WorkCompletion::default(); 4];
    let mut spin = Spin::new();
    loop {
        let n = side.cq.poll(&mut wcs);
        for wc in &wcs[..n] {
            check_wc(wc)?;
            if wc.wr_id == wr_id {
                return Ok(());
            }
        }
        if n > 0 {
            spin.progress();
        } else {
            spin.idle_polled("waiting for the WRITE's completion")?;
        }
    }
}

/// One side of the WRITE ping-pong; the client returns the samples. Each iteration, as
/// ib_write_lat's: wait for the peer's byte (the server), post one signaled WRITE (inline
/// when it fits), poll the CQ for its completion, wait for the peer's byte (the client).
pub fn write_lat(
    side: &Side,
    step: &Step,
    client: bool,
    progress: &mut Progress,
) -> Result<Vec<f64>> {
    let e = &side.qps[0];
    let size = step.size as usize;
    let last = size - 1;
    let src = side.region;
    let inline = step.size <= INLINE_MAX;
    let mut data = vec![0u8; if inline { size } else { 0 }];
    let sges = [e.mr.sge(src, step.size)];
    let op = SendOp::RdmaWrite {
        remote_addr: e.remote.vaddr,
        rkey: Rkey(e.remote.rkey),
    };
    let iters = step.iters as u64;
    let mut samples = Vec::with_capacity(if client { iters as usize } else { 0 });
    for i in 0..iters {
        let t = tag(i);
        if !client {
            wait_byte(e, last, t)?;
        }
        let t0 = Instant::now();
        let payload = if inline {
            data[last] = t;
            Payload::Inline(&data)
        } else {
            e.mr.write(src + last, &[t]);
            Payload::Sges(&sges)
        };
        e.qp.post_send(&SendWr {
            wr_id: i,
            op,
            payload,
            flags: SendFlags::SIGNALED,
        })?;
        wait_write_done(side, i)?;
        if client {
            wait_byte(e, last, t)?;
            samples.push(usec(t0) / 2.0);
            progress.update(i + 1, iters);
        }
    }
    Ok(samples)
}

/// Receives posted before a SEND ping-pong: ib_send_lat's default rx_depth (512), at most
/// one per iteration.
fn lat_rx(iters: u64) -> u64 {
    (RX_DEPTH as u64).min(iters)
}

/// Posts the first receives of a SEND ping-pong.
pub fn send_prepare(side: &Side, size: u32, iters: u32) -> Result<()> {
    let e = &side.qps[0];
    let sge = [e.mr.sge(0, size + e.recv_extra())];
    for i in 0..lat_rx(iters as u64) {
        e.qp.post_recv(i, &sge)?;
    }
    Ok(())
}

/// The state of one side of the SEND ping-pong: completions seen, receives posted.
struct SendPingPong<'a> {
    side: &'a Side,
    e: &'a QpEnd,
    recv_sge: [softverbs::Sge; 1],
    iters: u64,
    recvs: u64,
    recvs_posted: u64,
    sends_done: u64,
}

impl SendPingPong<'_> {
    /// Polls one completion, as ib_send_lat does (`ibv_poll_cq(cq, 1, ..)`). A receive's
    /// buffer goes back to the receive queue at once while more messages are to come,
    /// as perftest's `run_iter_lat_send` reposts it right after polling it.
    fn poll_one(&mut self) -> Result<bool> {
        let mut wc = [WorkCompletion::default(); 1];
        if self.side.cq.poll(&mut wc) == 0 {
            return Ok(false);
        }
        check_wc(&wc[0])?;
        if wc[0].opcode == WcOpcode::Recv {
            self.recvs += 1;
            if self.recvs_posted < self.iters {
                self.e.qp.post_recv(self.recvs_posted, &self.recv_sge)?;
                self.recvs_posted += 1;
            }
        } else {
            self.sends_done += 1;
        }
        Ok(true)
    }

    /// Polls until `done` holds.
    fn poll_until(&mut self, done: impl Fn(&Self) -> bool, what: &str) -> Result<()> {
        let mut spin = Spin::new();
        while !done(self) {
            if self.poll_one()? {
                spin.progress();
            } else {
                spin.idle_polled(what)?;
            }
        }
        Ok(())
    }
}

/// One side of the SEND ping-pong; the client returns the samples. Each iteration, as
/// ib_send_lat's (perftest's `run_iter_lat_send` with its latency defaults: send queue
/// depth 1, so CQ moderation 1): wait for the peer's SEND (the server), post one
/// signaled SEND (inline when it fits), poll until its completion, wait for the peer's
/// SEND (the client). A receive is reposted as soon as it is polled. The one difference
/// left: both kinds of completion come to one CQ, where ib_send_lat has a CQ for each.
pub fn send_lat(
    side: &Side,
    step: &Step,
    client: bool,
    progress: &mut Progress,
) -> Result<Vec<f64>> {
    let e = &side.qps[0];
    let iters = step.iters as u64;
    let inline = step.size <= INLINE_MAX;
    let data = vec![0u8; if inline { step.size as usize } else { 0 }];
    let sges = [e.mr.sge(side.region, step.size)];
    let send_op = e.send_op();
    let mut pp = SendPingPong {
        side,
        e,
        recv_sge: [e.mr.sge(0, step.size + e.recv_extra())],
        iters,
        recvs: 0,
        recvs_posted: lat_rx(iters),
        sends_done: 0,
    };
    let mut samples = Vec::with_capacity(if client { iters as usize } else { 0 });
    for i in 0..iters {
        if !client {
            pp.poll_until(|p| p.recvs > i, "waiting for the peer's SEND")?;
        }
        let t0 = Instant::now();
        let payload = if inline {
            Payload::Inline(&data)
        } else {
            Payload::Sges(&sges)
        };
        e.qp.post_send(&SendWr {
            wr_id: i,
            op: send_op,
            payload,
            flags: SendFlags::SIGNALED,
        })?;
        pp.poll_until(|p| p.sends_done > i, "waiting for the SEND's completion")?;
        if client {
            pp.poll_until(|p| p.recvs > i, "waiting for the peer's SEND")?;
            samples.push(usec(t0) / 2.0);
            progress.update(i + 1, iters);
        }
    }
    Ok(samples)
}

/// READ or atomic latency: one at a time, each to its completion.
pub fn rdma_lat(side: &Side, op: Op, step: &Step, progress: &mut Progress) -> Result<Vec<f64>> {
    let e = &side.qps[0];
    let iters = step.iters as u64;
    let len = if op == Op::Atomic { 8 } else { step.size };
    let sges = [e.mr.sge(side.region, len)];
    let remote_addr = e.remote.vaddr;
    let rkey = Rkey(e.remote.rkey);
    let sop = match op {
        Op::Atomic => SendOp::AtomicFetchAdd {
            remote_addr,
            rkey,
            add: 1,
        },
        _ => SendOp::RdmaRead { remote_addr, rkey },
    };
    let mut wcs = [WorkCompletion::default(); 4];
    let mut samples = Vec::with_capacity(iters as usize);
    for i in 0..iters {
        let t0 = Instant::now();
        e.qp.post_send(&SendWr::new(i, sop, &sges))?;
        let mut spin = Spin::new();
        loop {
            let n = side.cq.poll(&mut wcs);
            if n > 0 {
                for wc in &wcs[..n] {
                    check_wc(wc)?;
                }
                break;
            }
            spin.idle_polled("waiting for the completion")?;
        }
        samples.push(usec(t0));
        progress.update(i + 1, iters);
    }
    Ok(samples)
}
