//! A WRITE stream to a peer process that stops running now and then (issue 16, session
//! 10): on a loaded host a process waits milliseconds for a CPU, nothing is lost, and
//! what arrives meanwhile waits in its socket buffer. This test binary runs itself as
//! the peer (`peer_process`, doing nothing unless `STOPPED_PEER` is set) and stops it
//! with SIGSTOP while the stream runs.

use softverbs::*;
use std::io::{BufRead, Write};
use std::net::SocketAddr;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;
use common::*;

const WAIT: Duration = Duration::from_secs(20);
const MSG: u32 = 65536;
/// WRITEs outstanding: as `perf write` (perftest's tx_depth 128), more than the device
/// window (1024 packets) holds.
const DEPTH: u32 = 128;
/// Times the peer is stopped per attempt.
const STOPS: u32 = 40;

fn rts(qp: &Qp, addr: SocketAddr, qpn: u32, psns: (u32, u32)) {
    qp.to_init(InitAttr {
        access: all_access(),
    })
    .unwrap();
    qp.to_rtr(RtrAttr {
        remote: RemoteQp {
            addr,
            qpn: Qpn::new(qpn),
            psn: psns.1,
        },
        mtu: Mtu::Mtu4096,
        max_dest_rd_atomic: 16,
        min_rnr_timer: 1,
    })
    .unwrap();
    qp.to_rts(RtsAttr {
        sq_psn: psns.0,
        ..RtsAttr::default()
    })
    .unwrap();
}

/// The peer: a QP and a 1 MiB region the requester writes into; its application
/// does nothing (as `ib_write_bw`'s server), so only its progress thread answers.
#[test]
fn peer_process() {
    if std::env::var_os("STOPPED_PEER").is_none() {
        return;
    }
    let me = end(Config::default());
    println!(
        "@@ {} {} {} {}",
        me.ctx.local_addr(),
        me.qp.qpn().value(),
        me.mr.addr(),
        me.mr.rkey()
    );
    std::io::stdout().flush().unwrap();
    let mut lines = std::io::stdin().lock().lines();
    let peer = lines.next().unwrap().unwrap();
    let mut it = peer.split_whitespace();
    let addr: SocketAddr = it.next().unwrap().parse().unwrap();
    let qpn: u32 = it.next().unwrap().parse().unwrap();
    rts(&me.qp, addr, qpn, (200, 100));
    println!("@@ connected");
    std::io::stdout().flush().unwrap();
    // Until the requester says so (or goes away).
    let _ = lines.next();
}

/// The peer process; dropping it lets it run again, then [`TestChild`] ends it.
struct Peer(TestChild);

impl Peer {
    fn spawn() -> Peer {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args(["peer_process", "--exact", "--nocapture", "--test-threads=1"])
            .env("STOPPED_PEER", "1");
        Peer(TestChild::spawn(&mut cmd, WAIT))
    }

    fn hear(&self) -> String {
        self.0.hear("the peer answers")
    }

    fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill with the pid of our own child, not yet waited for.
        unsafe { libc::kill(self.0.child.id() as libc::pid_t, sig) };
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.signal(libc::SIGCONT);
    }
}

/// One attempt: a stream of 64 KiB WRITEs, [`DEPTH`] outstanding, while the peer is stopped
/// for 10 ms `stops` times; returns the requester's engine counters.
fn stream_with_stops(stops: u32) -> Counters {
    let mut peer = Peer::spawn();
    let hello = peer.hear();
    let f: Vec<&str> = hello.split_whitespace().collect();
    let (addr, qpn): (SocketAddr, u32) = (f[0].parse().unwrap(), f[1].parse().unwrap());
    let (remote_addr, rkey): (u64, u32) = (f[2].parse().unwrap(), f[3].parse().unwrap());
    let me = end(Config::default());
    rts(&me.qp, addr, qpn, (100, 200));
    peer.0
        .say(&format!("{} {}", me.ctx.local_addr(), me.qp.qpn().value()));
    assert_eq!(peer.hear(), "connected");

    let done = Arc::new(AtomicBool::new(false));
    let pid = peer.0.child.id() as libc::pid_t;
    let stopper = {
        let done = done.clone();
        std::thread::spawn(move || {
            for _ in 0..stops {
                std::thread::sleep(Duration::from_millis(20));
                // SAFETY: kill with the pid of a child the test still holds.
                unsafe { libc::kill(pid, libc::SIGSTOP) };
                std::thread::sleep(Duration::from_millis(10));
                // SAFETY: as above.
                unsafe { libc::kill(pid, libc::SIGCONT) };
            }
            done.store(true, Ordering::Relaxed);
        })
    };
    let mut outstanding = 0u32;
    let mut id = 0u64;
    let mut wcs = [WorkCompletion::default(); 32];
    let deadline = Instant::now() + WAIT;
    while !done.load(Ordering::Relaxed) || outstanding > 0 {
        assert!(Instant::now() < deadline, "the stream did not end");
        while outstanding < DEPTH && !done.load(Ordering::Relaxed) {
            let local = (id % 16) as usize * MSG as usize;
            let sges = [me.mr.sge(local, MSG)];
            let wr = SendWr::new(
                id,
                SendOp::RdmaWrite {
                    remote_addr: remote_addr + local as u64,
                    rkey: Rkey(rkey),
                },
                &sges,
            );
            me.qp.post_send(&wr).unwrap();
            id += 1;
            outstanding += 1;
        }
        let n = me.cq.poll(&mut wcs);
        for wc in &wcs[..n] {
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        }
        outstanding -= n as u32;
    }
    stopper.join().unwrap();
    me.ctx.counters()
}

/// While the peer is stopped the requester's early timer expires (a tail-loss probe,
/// then the oldest packet alone); when it runs again it reads its backlog a
/// `recvmmsg` batch at a time and answers each, so the first answers acknowledge only
/// part of what was sent before the timeout. With a softverbs peer those are no sign
/// of loss: nothing more than the probes and the oldest packets goes again. Before,
/// the first partial answer sent the requester back over everything still waiting in
/// the peer's socket buffer (measured here: 2-10x the timeouts). Best of three
/// attempts (a loaded host stops the peer, or the requester, besides).
#[test]
fn a_peer_stopped_mid_stream_is_sent_again_no_more_than_the_timeouts_send() {
    let _counted = counted();
    let mut tries = Vec::new();
    for _ in 0..3 {
        let c = stream_with_stops(STOPS);
        let timeouts = c.tail_loss_probes + c.early_retransmits + c.ack_timeouts;
        eprintln!(
            "{} resent, {} probes, {} early, {} IBTA, {} found spurious",
            c.retransmitted_packets,
            c.tail_loss_probes,
            c.early_retransmits,
            c.ack_timeouts,
            c.spurious_timeouts
        );
        tries.push((c.retransmitted_packets, timeouts, c.early_retransmits));
        if c.early_retransmits > 0 && c.retransmitted_packets <= timeouts + timeouts / 4 {
            return;
        }
    }
    panic!("(resent, timeouts, early retransmissions) per attempt: {tries:?}");
}
