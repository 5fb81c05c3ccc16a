//! RDMA WRITE throughput and memory of the engine.
//!
//! Two engines joined by a minimal lossless loop in this file (no simulator: the
//! datagrams one engine's `poll_transmit` writes into one reused buffer are sealed
//! and go straight into the other's `handle_datagram`), 64 KiB RDMA WRITEs at MTU 4096,
//! 16 WRITEs outstanding. Criterion measures bytes per second with the receiver
//! enforcing the ICRC and skipping it; packets per second are printed too.
//!
//! Memory, measured in the same binary with a counting global allocator:
//! - allocations per packet in steady state (must be 0);
//! - heap bytes an idle RC QP costs beyond its queues;
//! - heap in use while the same workload runs through the simulator at 20 %
//!   loss, for 1x and 4x the data: what is kept for retransmission must not
//!   grow with the amount of data.
//!
//! Run: `cargo bench -p softverbs-engine --bench rdma_write`.

use criterion::{Criterion, Throughput};
use softverbs_engine::{
    AccessFlags, CqHandle, Engine, EngineConfig, IcrcPolicy, Instant, Mtu, QpAttr, QpAttrMask,
    QpCap, QpHandle, QpInitAttr, QpState, QpType, Qpn, Rkey, SendFlags, SendOp, SendWr, Sge,
    WcStatus, WorkCompletion, MAX_DATAGRAM,
};
use softverbs_sim::{Faults, Limits, Sim};
use std::alloc::{GlobalAlloc, Layout, System};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

// ----- a counting allocator -----

/// Wraps the system allocator and counts allocations, bytes, heap in use and
/// its peak.
struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static ALLOC_BYTES: AtomicU64 = AtomicU64::new(0);
static IN_USE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn note_alloc(size: usize) {
    ALLOCS.fetch_add(1, Relaxed);
    ALLOC_BYTES.fetch_add(size as u64, Relaxed);
    let now = IN_USE.fetch_add(size, Relaxed) + size;
    PEAK.fetch_max(now, Relaxed);
}

// SAFETY: every method forwards to `System` with the caller's arguments, so the
// `GlobalAlloc` contract is `System`'s; the counters only observe.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged; the caller upholds `alloc`'s contract.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            note_alloc(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            note_alloc(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator, i.e. from `System`, with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        IN_USE.fetch_sub(layout.size(), Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from `System` with `layout`; the caller upholds the
        // rest of `realloc`'s contract.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            IN_USE.fetch_sub(layout.size(), Relaxed);
            note_alloc(new_size);
        }
        p
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocs() -> u64 {
    ALLOCS.load(Relaxed)
}

fn in_use() -> usize {
    IN_USE.load(Relaxed)
}

// ----- setup -----

const MSG: u32 = 64 * 1024;
const WINDOW: usize = 16;
const MTU: Mtu = Mtu::Mtu4096;

fn addr(i: u8) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, i], 4791))
}

/// One end: its engine objects and registered buffer.
#[derive(Clone, Copy)]
struct End {
    qp: QpHandle,
    qpn: Qpn,
    send_cq: CqHandle,
    addr: u64,
    lkey: u32,
    rkey: Rkey,
}

fn cap_default() -> QpCap {
    QpCap {
        max_send_wr: 64,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    }
}

/// Creates a PD, CQs, a QP and a registered buffer of `buf_len` bytes (leaked:
/// it must outlive the engine, and benchmarks make few).
fn make_end(e: &mut Engine, cap: QpCap, buf_len: usize) -> End {
    let pd = e.alloc_pd().unwrap();
    let send_cq = e.create_cq(1024).unwrap();
    let recv_cq = e.create_cq(1024).unwrap();
    let (qp, qpn) = e
        .create_qp(QpInitAttr {
            pd,
            send_cq,
            recv_cq,
            qp_type: QpType::Rc,
            cap,
            sq_sig_all: true,
        })
        .unwrap();
    let buf: &'static mut [u8] = Box::leak(vec![7u8; buf_len].into_boxed_slice());
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    // SAFETY: the buffer is leaked, so it stays valid for as long as any engine.
    let mr = unsafe { e.reg_mr(pd, buf.as_mut_ptr(), buf.len(), access) }.unwrap();
    End {
        qp,
        qpn,
        send_cq,
        addr: mr.addr,
        lkey: mr.lkey,
        rkey: Rkey(mr.rkey),
    }
}

/// INIT, RTR, RTS towards `peer`.
fn connect(e: &mut Engine, qp: QpHandle, peer: SocketAddr, peer_qpn: Qpn, rd_atomic: u8) {
    let now = Instant::ZERO;
    let init = QpAttr {
        qp_state: QpState::Init,
        qp_access_flags: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        ..QpAttr::default()
    };
    e.modify_qp(
        qp,
        &init,
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS,
        now,
    )
    .unwrap();
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        path_mtu: MTU,
        dest_qp_num: peer_qpn.value(),
        rq_psn: 0,
        max_dest_rd_atomic: rd_atomic,
        min_rnr_timer: 1,
        av: Some(peer),
        ..QpAttr::default()
    };
    e.modify_qp(
        qp,
        &rtr,
        QpAttrMask::STATE
            | QpAttrMask::AV
            | QpAttrMask::PATH_MTU
            | QpAttrMask::DEST_QPN
            | QpAttrMask::RQ_PSN
            | QpAttrMask::MAX_DEST_RD_ATOMIC
            | QpAttrMask::MIN_RNR_TIMER,
        now,
    )
    .unwrap();
    let rts = QpAttr {
        qp_state: QpState::Rts,
        sq_psn: 0,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: rd_atomic,
        ..QpAttr::default()
    };
    e.modify_qp(
        qp,
        &rts,
        QpAttrMask::STATE
            | QpAttrMask::SQ_PSN
            | QpAttrMask::TIMEOUT
            | QpAttrMask::RETRY_CNT
            | QpAttrMask::RNR_RETRY
            | QpAttrMask::MAX_QP_RD_ATOMIC,
        now,
    )
    .unwrap();
}

fn engine(i: u8, icrc: IcrcPolicy) -> Engine {
    let mut cfg = EngineConfig::new(addr(i));
    cfg.icrc = icrc;
    Engine::new(cfg)
}

/// Posts WRITE number `n`: 64 KiB from A's buffer into slot `n % WINDOW` of B's.
fn post_write(e: &mut Engine, a: &End, b: &End, n: u64) {
    let sge = Sge {
        addr: a.addr,
        length: MSG,
        lkey: a.lkey,
    };
    let slot = n % WINDOW as u64;
    let wr = SendWr {
        wr_id: n,
        op: SendOp::RdmaWrite {
            remote_addr: b.addr + slot * u64::from(MSG),
            rkey: b.rkey,
        },
        payload: softverbs_engine::Payload::Sges(std::slice::from_ref(&sge)),
        flags: SendFlags::SIGNALED,
    };
    e.post_send(a.qp, &wr).unwrap();
}

// ----- the in-bench network -----

/// Two engines and the loop between them.
struct Loop {
    a: Engine,
    b: Engine,
    ea: End,
    eb: End,
    buf: Vec<u8>,
    clock: std::time::Instant,
    next_wr: u64,
    completed: u64,
    wcs: [WorkCompletion; 32],
}

impl Loop {
    fn new(icrc: IcrcPolicy) -> Loop {
        let mut a = engine(1, icrc);
        let mut b = engine(2, icrc);
        let ea = make_end(&mut a, cap_default(), MSG as usize);
        let eb = make_end(&mut b, cap_default(), MSG as usize * WINDOW);
        connect(&mut a, ea.qp, addr(2), eb.qpn, 1);
        connect(&mut b, eb.qp, addr(1), ea.qpn, 1);
        let mut l = Loop {
            a,
            b,
            ea,
            eb,
            buf: vec![0; MAX_DATAGRAM],
            clock: std::time::Instant::now(),
            next_wr: 0,
            completed: 0,
            wcs: [WorkCompletion::default(); 32],
        };
        for _ in 0..WINDOW {
            l.post();
        }
        l
    }

    fn post(&mut self) {
        post_write(&mut self.a, &self.ea, &self.eb, self.next_wr);
        self.next_wr += 1;
    }

    fn now(&self) -> Instant {
        Instant::from_nanos(self.clock.elapsed().as_nanos() as u64)
    }

    /// Moves datagrams both ways until neither engine has any to send; returns
    /// how many moved.
    fn pump(&mut self) -> u64 {
        let now = self.now();
        let mut moved = 0;
        for e in [&mut self.a, &mut self.b] {
            if e.poll_timeout().is_some_and(|t| t <= now) {
                e.handle_timeout(now);
            }
        }
        loop {
            let before = moved;
            // Each datagram is sealed as a driver sending it alone would (the
            // engine emits them unsealed).
            while let Some(t) = self.a.poll_transmit(now, &mut self.buf) {
                t.seal(&mut self.buf, 0);
                self.b.handle_datagram(now, addr(1), &self.buf[..t.len]);
                moved += 1;
            }
            while let Some(t) = self.b.poll_transmit(now, &mut self.buf) {
                t.seal(&mut self.buf, 0);
                self.a.handle_datagram(now, addr(2), &self.buf[..t.len]);
                moved += 1;
            }
            if moved == before {
                return moved;
            }
        }
    }

    /// Runs until `n` more WRITEs completed, keeping WINDOW outstanding; returns
    /// the packets moved.
    fn run(&mut self, n: u64) -> u64 {
        let target = self.completed + n;
        let mut packets = 0;
        while self.completed < target {
            packets += self.pump();
            loop {
                let got = self.a.poll_cq(self.ea.send_cq, &mut self.wcs).unwrap();
                for i in 0..got {
                    assert_eq!(self.wcs[i].status, WcStatus::Success);
                    self.completed += 1;
                    self.post();
                }
                if got < self.wcs.len() {
                    break;
                }
            }
        }
        packets
    }
}

// ----- memory -----

/// Allocations per packet in steady state, after a warm-up.
fn alloc_per_packet(icrc: IcrcPolicy, writes: u64) -> (u64, u64) {
    let mut l = Loop::new(icrc);
    l.run(4 * WINDOW as u64); // warm-up
    let before = allocs();
    let packets = l.run(writes);
    (allocs() - before, packets)
}

/// Heap bytes of create_qp + connect for a QP with minimal queues, beyond the
/// queues themselves: `(marginal, amortized)` where `marginal` is one more QP in
/// an engine whose QP table has room, and `amortized` averages over many QPs
/// including their share of the QP table (the QP structure itself lives there).
fn idle_qp_bytes() -> (isize, isize, usize) {
    let cap = QpCap {
        max_send_wr: 1,
        max_recv_wr: 1,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let mut e = engine(1, IcrcPolicy::Enforce);
    let pd = e.alloc_pd().unwrap();
    let cq = e.create_cq(16).unwrap();
    let init = QpInitAttr {
        pd,
        send_cq: cq,
        recv_cq: cq,
        qp_type: QpType::Rc,
        cap,
        sq_sig_all: false,
    };
    let one = |e: &mut Engine, i: u32| {
        let (qp, _) = e.create_qp(init).unwrap();
        connect(e, qp, addr(2), Qpn::new(2 + i), 16);
        e.qp_queue_bytes(qp).unwrap()
    };
    // Warm up so that the QP table has room for one more, then measure one.
    let queues = one(&mut e, 0);
    let (probe, _) = e.create_qp(init).unwrap();
    e.destroy_qp(probe).unwrap();
    let before = in_use() as isize;
    let q = one(&mut e, 1);
    let marginal = in_use() as isize - before - q as isize;
    assert_eq!(q, queues);
    // Amortized over N QPs; the table holds N + 2 (QPN 0 and 1) entries, a
    // power of two, so its vector ends exactly full.
    let mut e = engine(1, IcrcPolicy::Enforce);
    let pd = e.alloc_pd().unwrap();
    let cq = e.create_cq(16).unwrap();
    let init = QpInitAttr {
        pd,
        send_cq: cq,
        recv_cq: cq,
        ..init
    };
    const N: usize = 4094;
    let before = in_use() as isize;
    for i in 0..N {
        let (qp, _) = e.create_qp(init).unwrap();
        connect(&mut e, qp, addr(2), Qpn::new(2 + i as u32), 16);
    }
    let amortized = (in_use() as isize - before) / N as isize - queues as isize;
    (marginal, amortized, queues)
}

/// What one simulated run did.
struct SimRun {
    /// Most heap in use during the run.
    peak: usize,
    /// Heap in use when it started.
    baseline: usize,
    sent: u64,
    retransmitted: u64,
    wall: Duration,
}

/// Runs `bytes` of 64 KiB WRITEs (WINDOW outstanding) through the simulator
/// with `faults`.
fn sim_run(bytes: u64, faults: Faults) -> SimRun {
    let mut sim = Sim::new(42, faults);
    let na = sim.add_node(engine(1, IcrcPolicy::Enforce));
    let nb = sim.add_node(engine(2, IcrcPolicy::Enforce));
    let ea = make_end(sim.node_mut(na), cap_default(), MSG as usize);
    let eb = make_end(sim.node_mut(nb), cap_default(), MSG as usize * WINDOW);
    connect(sim.node_mut(na), ea.qp, addr(2), eb.qpn, 1);
    connect(sim.node_mut(nb), eb.qp, addr(1), ea.qpn, 1);
    let writes = bytes / u64::from(MSG);
    let mut next = 0u64;
    let mut done = 0u64;
    let mut wcs = [WorkCompletion::default(); 32];
    let post = |sim: &mut Sim<Engine>, next: &mut u64| {
        if *next < writes {
            post_write(sim.node_mut(na), &ea, &eb, *next);
            *next += 1;
        }
    };
    for _ in 0..WINDOW {
        post(&mut sim, &mut next);
    }
    // Let the first window get going before taking the baseline.
    let _ = sim.run_for(Duration::from_micros(1), Limits::default());
    let baseline = in_use();
    PEAK.store(baseline, Relaxed);
    let start = std::time::Instant::now();
    let limits = Limits::new(u64::MAX, Duration::from_secs(100_000));
    sim.run_until(limits, |sim: &mut Sim<Engine>| {
        loop {
            let n = sim.node_mut(na).poll_cq(ea.send_cq, &mut wcs).unwrap();
            for wc in &wcs[..n] {
                assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
                done += 1;
                post(sim, &mut next);
            }
            if n < wcs.len() {
                break;
            }
        }
        done == writes
    })
    .expect("the lossy run finishes");
    let wall = start.elapsed();
    let peak = PEAK.load(Relaxed);
    let c = sim.node(na).counters();
    SimRun {
        peak,
        baseline,
        sent: c.tx_packets,
        retransmitted: c.retransmitted_packets,
        wall,
    }
}

// ----- throughput -----

/// Nanoseconds the calling thread has run on a CPU (Linux schedstat), if known.
/// On a machine shared with other work, throughput per CPU second is much steadier
/// than per wall-clock second.
fn thread_cpu_ns() -> Option<u64> {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Packets and bytes per second over about `secs` seconds, and bytes per second
/// of CPU time if the system tells.
fn rates(icrc: IcrcPolicy, secs: f64) -> (f64, f64, Option<f64>) {
    let mut l = Loop::new(icrc);
    l.run(4 * WINDOW as u64);
    let start = std::time::Instant::now();
    let cpu_start = thread_cpu_ns();
    let mut packets = 0;
    let mut writes = 0;
    while start.elapsed().as_secs_f64() < secs {
        packets += l.run(WINDOW as u64);
        writes += WINDOW as u64;
    }
    let t = start.elapsed().as_secs_f64();
    let bytes = (writes * u64::from(MSG)) as f64;
    let cpu = cpu_start
        .zip(thread_cpu_ns())
        .map(|(a, b)| bytes / ((b - a) as f64 / 1e9));
    (packets as f64 / t, bytes / t, cpu)
}

fn bench_throughput(c: &mut Criterion) {
    let mut g = c.benchmark_group("rdma_write_64KiB_mtu4096_window16");
    g.throughput(Throughput::Bytes(u64::from(MSG) * WINDOW as u64));
    g.sample_size(20);
    g.warm_up_time(Duration::from_secs(1));
    g.measurement_time(Duration::from_secs(3));
    for (name, icrc) in [
        ("icrc_enforce", IcrcPolicy::Enforce),
        ("icrc_skip", IcrcPolicy::Skip),
    ] {
        let mut l = Loop::new(icrc);
        g.bench_function(name, |bch| bch.iter(|| l.run(WINDOW as u64)));
    }
    g.finish();
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` does not: then run
    // everything once, small.
    let full = std::env::args().any(|a| a == "--bench");
    // A fixed workload only (no timing), for counting instructions:
    // `RDMA_WRITE_FIXED=enforce|skip|both valgrind --tool=callgrind
    // --toggle-collect='rdma_write::Loop::run' target/release/deps/rdma_write-*`.
    if let Ok(which) = std::env::var("RDMA_WRITE_FIXED") {
        let policies: &[IcrcPolicy] = match which.as_str() {
            "enforce" => &[IcrcPolicy::Enforce],
            "skip" => &[IcrcPolicy::Skip],
            _ => &[IcrcPolicy::Enforce, IcrcPolicy::Skip],
        };
        for &icrc in policies {
            let (a, p) = alloc_per_packet(icrc, 256);
            println!("fixed workload, ICRC {icrc:?}: {a} allocations over {p} packets");
        }
        return;
    }
    let scale = if full { 1 } else { 0 };

    println!("softverbs-engine rdma_write: 64 KiB RDMA WRITEs, MTU 4096, {WINDOW} outstanding");
    for (name, icrc) in [("enforce", IcrcPolicy::Enforce), ("skip", IcrcPolicy::Skip)] {
        let (pps, bps, per_cpu) = rates(icrc, if full { 2.0 } else { 0.05 });
        let per_cpu = per_cpu.map_or(String::new(), |b| {
            format!(" ({:.2} GB per CPU second)", b / 1e9)
        });
        println!(
            "throughput (ICRC {name}): {:.2} GB/s, {:.0} packets/s{per_cpu}",
            bps / 1e9,
            pps
        );
    }

    for (name, icrc) in [("enforce", IcrcPolicy::Enforce), ("skip", IcrcPolicy::Skip)] {
        let (allocations, packets) = alloc_per_packet(icrc, 256 << scale);
        println!(
            "alloc/packet (steady state, ICRC {name}): {} ({allocations} allocations over \
             {packets} packets)",
            allocations as f64 / packets as f64
        );
        assert_eq!(allocations, 0, "the data path allocates");
    }

    let (marginal, amortized, queues) = idle_qp_bytes();
    println!(
        "idle RC QP beyond its queues: {marginal} bytes of heap it owns, {amortized} bytes \
         with its QP-table slot (queues: {queues} bytes; max_send_wr=1, max_recv_wr=1, \
         1 SGE, inline 0, max_dest_rd_atomic=16)"
    );

    let base = if full { 16u64 << 20 } else { 1 << 20 };
    let r = sim_run(4 * base, Faults::none());
    println!(
        "throughput through the simulator (lossless, ICRC enforce): {:.2} GB/s, {:.0} packets/s",
        (4 * base) as f64 / r.wall.as_secs_f64() / 1e9,
        r.sent as f64 / r.wall.as_secs_f64()
    );
    for (label, bytes) in [("1x", base), ("4x", 4 * base)] {
        let r = sim_run(bytes, Faults::lossy(0.2));
        println!(
            "heap under 20% loss ({label} = {} MiB written): max in use {} bytes, {} above \
             the start ({} packets sent, {} of them retransmissions)",
            bytes >> 20,
            r.peak,
            r.peak - r.baseline,
            r.sent,
            r.retransmitted
        );
    }

    let mut c = Criterion::default().configure_from_args();
    bench_throughput(&mut c);
    c.final_summary();
}
