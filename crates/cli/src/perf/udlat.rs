//! SEND latency over UD, which survives loss.
//!
//! UD has no acknowledgement and no retry (IBA Vol 1 9.8.4): in a ping-pong, one lost
//! ping or pong leaves both ends waiting for a message that will never come
//! (ib_send_lat on UD then waits until it is killed). Here:
//!
//! - every ping carries the run's tag and its iteration number in its immediate data,
//!   and the server answers each ping of this run with a pong carrying the same
//!   immediate data, so the client knows which ping a pong answers;
//! - a client with no answer after [`RESEND`] sends the ping again, and keeps no
//!   sample for that round trip (its time includes the wait); a late or duplicated
//!   pong of an earlier iteration is taken and ignored;
//! - the server answers until the client's `FIN` on the control connection (it
//!   cannot know whether its last pong arrived), then both ends reset their QPs, so
//!   the next run starts with none of this run's receives posted (as `ud` does).
//!
//! The client reports how many pings it sent again.

use super::ud::{retire_receives, serve_until_fin};
use super::{Side, Step, INLINE_MAX};
use crate::conn::{check_wc, Ctrl, Spin};
use crate::progress::Progress;
use crate::{fail, Result};
use softverbs::{Payload, SendFlags, SendWr, WcOpcode, WorkCompletion};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Receives kept posted on each side.
const RX: u64 = 64;
/// Without an answer for this long the client pings again: hundreds of loopback round
/// trips, short enough that a lost message costs little.
const RESEND: Duration = Duration::from_millis(20);
/// The GRH area at the start of every UD receive buffer.
const GRH: u32 = 40;

/// A ping's (and its pong's) immediate data: the run's tag (16 bits), then the low
/// 16 bits of the iteration.
fn ping_imm(tag: u32, iteration: u64) -> u32 {
    (tag & 0xffff) << 16 | (iteration & 0xffff) as u32
}

/// What the client measured.
pub struct UdLat {
    /// Half round trips of the iterations answered at the first ping, in µs.
    pub samples: Vec<f64>,
    /// Pings sent again.
    pub resent: u64,
}

/// One side's datagrams: posts pings or pongs from the second region, reposts
/// receives, counts sends in flight.
struct Pinger<'a> {
    side: &'a Side,
    data: Vec<u8>,
    size: u32,
    in_flight: u64,
    wcs: [WorkCompletion; 16],
}

impl<'a> Pinger<'a> {
    /// Posts `RX` receives.
    fn new(side: &'a Side, size: u32) -> Result<Pinger<'a>> {
        let e = &side.qps[0];
        if e.ud.is_none() {
            fail!("UD latency on a QP that is not UD");
        }
        for i in 0..RX {
            e.qp.post_recv(i, &[e.mr.sge(0, size + GRH)])?;
        }
        let inline = size <= INLINE_MAX;
        Ok(Pinger {
            side,
            data: vec![0u8; if inline { size as usize } else { 0 }],
            size,
            in_flight: 0,
            wcs: [WorkCompletion::default(); 16],
        })
    }

    /// Room in the send queue (answers from the peer are taken, not lost, meanwhile).
    fn has_room(&self) -> bool {
        self.in_flight < self.side.max_send_wr as u64 - 1
    }

    fn send(&mut self, imm: u32) -> Result<()> {
        let e = &self.side.qps[0];
        let Some(peer) = e.ud else {
            fail!("UD latency on a QP that is not UD");
        };
        let sges = [e.mr.sge(self.side.region, self.size)];
        let payload = if self.data.is_empty() {
            Payload::Sges(&sges)
        } else {
            Payload::Inline(&self.data)
        };
        e.qp.post_send(&SendWr {
            wr_id: u64::from(imm),
            op: peer.ah.send(peer.qpn, peer.qkey, Some(imm)),
            payload,
            flags: SendFlags::SIGNALED,
        })?;
        self.in_flight += 1;
        Ok(())
    }

    /// One poll: retires send completions, reposts each receive and calls `got` with
    /// its immediate data. Returns how many completions it took.
    fn poll(&mut self, mut got: impl FnMut(u32)) -> Result<usize> {
        let e = &self.side.qps[0];
        let n = self.side.cq.poll(&mut self.wcs);
        for wc in &self.wcs[..n] {
            check_wc(wc)?;
            if wc.opcode == WcOpcode::Recv {
                e.qp.post_recv(wc.wr_id, &[e.mr.sge(0, self.size + GRH)])?;
                if let Some(imm) = wc.imm_data {
                    got(imm);
                }
            } else {
                self.in_flight = self.in_flight.saturating_sub(1);
            }
        }
        Ok(n)
    }

    /// Waits for the last send completions, then resets the QP.
    fn finish(mut self) -> Result<()> {
        let mut spin = Spin::new();
        while self.in_flight > 0 {
            if self.poll(|_| {})? > 0 {
                spin.progress();
            } else {
                spin.idle_polled("waiting for the last SEND completion")?;
            }
        }
        retire_receives(self.side)
    }
}

/// The client: `step.iters` round trips, each answered once.
pub fn client(side: &Side, step: &Step, tag: u32, progress: &mut Progress) -> Result<UdLat> {
    let iters = step.iters as u64;
    let mut p = Pinger::new(side, step.size)?;
    let mut samples = Vec::with_capacity(iters as usize);
    let mut resent = 0u64;
    for i in 0..iters {
        let want = ping_imm(tag, i);
        let t0 = Instant::now();
        let mut sent_at: Option<Instant> = None;
        let mut answered = false;
        let mut clean = true;
        // Progress is an answer: a peer that never answers ends the run after STALL,
        // however many pings go out meanwhile.
        let mut spin = Spin::new();
        while !answered {
            let resend_due = sent_at.is_none_or(|t| t.elapsed() >= RESEND);
            if resend_due && p.has_room() {
                if sent_at.is_some() {
                    resent += 1;
                    clean = false;
                }
                p.send(want)?;
                sent_at = Some(Instant::now());
            }
            p.poll(|imm| answered |= imm == want)?;
            if !answered {
                spin.idle_polled("waiting for the peer's answer")?;
            }
        }
        if clean {
            samples.push(t0.elapsed().as_secs_f64() * 1e6 / 2.0);
        }
        progress.update(i + 1, iters);
    }
    p.finish()?;
    if samples.is_empty() {
        fail!("every round trip needed a ping sent again: no sample");
    }
    Ok(UdLat { samples, resent })
}

/// The server: answers every ping of this run until the client's FIN.
pub fn server(side: &Side, ctrl: &mut Ctrl, step: &Step, tag: u32) -> Result<()> {
    let mut p = Pinger::new(side, step.size)?;
    ctrl.send("GO")?;
    serve_until_fin(ctrl, |fin: &AtomicBool| {
        let mut spin = Spin::new();
        let mut pings = Vec::with_capacity(16);
        loop {
            p.poll(|imm| {
                if imm >> 16 == tag & 0xffff {
                    pings.push(imm);
                }
            })?;
            // A full send queue drops the pong: the client pings again.
            for imm in pings.drain(..) {
                if p.has_room() {
                    p.send(imm)?;
                }
                spin.progress();
            }
            if fin.load(Ordering::Acquire) {
                break;
            }
            spin.idle("waiting for pings")?;
        }
        p.finish()
    })?;
    ctrl.send("DONE")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_immediate_data_names_the_run_and_the_iteration() {
        assert_eq!(ping_imm(0x0001, 0), 0x0001_0000);
        assert_eq!(ping_imm(0x1_abcd, 0x1_2345), 0xabcd_2345);
        assert_ne!(ping_imm(2, 7), ping_imm(3, 7));
    }
}
