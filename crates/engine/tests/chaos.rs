//! Chaos property tests: random two-way workloads mixing every RC opcode, posted
//! from both ends at once over a simulated network that loses, duplicates,
//! reorders and corrupts datagrams.
//!
//! Every case checks, for both ends:
//! - every posted WR completes exactly once, with success, and the send CQ
//!   shows the signaled ones in post order;
//! - receive completions come in post order, each for the message it should
//!   carry (opcode, length, immediate, solicited bit, source QP);
//! - after the run each registered buffer equals a model of what the workload
//!   must have done to it, byte for byte: SEND data scattered into the receive
//!   SGEs, WRITE data at its remote address and nowhere else, READ data equal
//!   to the remote source, atomic results and the atomically updated words;
//! - FETCH_ADDs use distinct powers of two per counter word and return the
//!   exact running sum, so each took effect exactly once;
//! - the run ends within the simulator's limits, and once settled nothing
//!   more is completed;
//! - beside the main RC pair (most cases), SRQ, UC and UD streams run from both
//!   ends, checked byte for byte too (see `chaos/side.rs`), and the main QPs may
//!   have a finite rnr_retry while the network duplicates RNR NAKs.
//!
//! The proptest cases are fixed ([`CASES`] and [`MODERATE_CASES`], fixed RNG
//! seeds, no persistence) so CI runs the same workloads every time.
//! To investigate: `CHAOS_CASES` / `CHAOS_SEED` override both; the ignored
//! test `replay` reruns one case (`CHAOS_CASE=seed,n_a,n_b,loss`, as proptest
//! prints it) and `explore` runs many and lists every failure
//! (`CHAOS_MAX_LOSS_PERMILLE` bounds the loss, `CHAOS_GO_BACK_N=1` turns
//! selective repeat off); `CHAOS_LOG=<lines>` adds a
//! packet log of both ends (and the datagrams the network lost) to a failure's
//! report; `CHAOS_STATS=1` prints each case's network and engine counters.
//!
//! Loss is independent per datagram and both ways, and IBA caps retry_cnt at 7:
//! an atomic or READ needs its own request and its own response through in one
//! of 8 attempts, so at 15-20 % loss (about 1/3 of attempts failing) a long
//! workload now and then ends in RETRY_EXC_ERR although every part of the
//! engine did its job. Exploring 10 000 random cases at 0-20 % loss found 59
//! such failures (all at loss above 11 %, 55 of them READs or atomics), each a
//! genuine run of losses in the packet log; 8 000 cases at 0-12 % loss found
//! none. Hence the second property below: many more cases at up to 10 % loss.

mod common;
#[path = "chaos/side.rs"]
mod side;

use common::*;
use proptest::prelude::*;
use proptest::test_runner::RngSeed;
use softverbs_engine::*;
use softverbs_sim::{Fate, Faults, Limits, Sim, SimError};
use std::time::Duration;

/// Proptest cases of [`chaos_workloads`] (loss up to 20 %).
const CASES: u32 = 24;

/// Proptest cases of [`chaos_workloads_moderate_loss`] (loss up to 10 %).
const MODERATE_CASES: u32 = 256;

/// Bytes of every buffer that SENDs, WRITEs and READs take their data from.
const SRC_LEN: usize = 32 * 1024;

/// A number from the environment (to explore beyond the fixed CI cases), or
/// `default`.
fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn chaos_limits() -> Limits {
    Limits::new(3_000_000, Duration::from_secs(600))
}

// ----- a small deterministic generator (splitmix64) -----

struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x5d1c_e0f7_a3b2_9e41)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        debug_assert!(lo <= hi);
        lo + self.next() % (hi - lo + 1)
    }

    fn chance(&mut self, p: f64) -> bool {
        ((self.next() >> 11) as f64 / (1u64 << 53) as f64) < p
    }

    fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }

    /// Splits `len` into `parts` lengths (some may be zero).
    fn split(&mut self, len: u32, parts: usize) -> Vec<u32> {
        if parts == 0 {
            return Vec::new();
        }
        let mut cuts: Vec<u32> = (0..parts - 1)
            .map(|_| self.range(0, u64::from(len)) as u32)
            .collect();
        cuts.push(0);
        cuts.push(len);
        cuts.sort_unstable();
        cuts.windows(2).map(|w| w[1] - w[0]).collect()
    }

    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.range(0, i as u64) as usize;
            v.swap(i, j);
        }
    }
}

// ----- a case and its workload -----

/// Everything that varies between cases besides the workload itself.
#[derive(Debug, Clone)]
struct Case {
    seed: u64,
    /// WRs posted by A and by B.
    n: [usize; 2],
    faults: Faults,
    mtu: Mtu,
    cap: QpCap,
    sq_sig_all: bool,
    max_rd_atomic: u8,
    timeout: u8,
    min_rnr_timer: u8,
    /// Probability that a receive WQE is only posted after a random delay.
    late_recv: f64,
    psn: [u32; 2],
    /// RNR retries of the main RC QPs (7: forever).
    rnr_retry: u8,
    /// SRQ, UC and UD streams beside the main workload.
    side: Option<side::SidePlan>,
    /// Selective repeat on both engines (off: plain IBA go-back-N).
    selective_repeat: bool,
}

impl Case {
    /// A case whose parameters all derive from `seed`.
    fn random(seed: u64, loss: f64, n_a: usize, n_b: usize) -> Case {
        let mut r = Rng::new(seed.rotate_left(17) ^ 0xc0ffee);
        let mtus = [
            Mtu::Mtu256,
            Mtu::Mtu512,
            Mtu::Mtu1024,
            Mtu::Mtu2048,
            Mtu::Mtu4096,
        ];
        let depth = |r: &mut Rng| {
            if r.chance(0.2) {
                r.range(1, 4) as u32
            } else {
                r.range(5, 64) as u32
            }
        };
        let psn = |r: &mut Rng| {
            if r.chance(0.5) {
                0xff_ffff - r.range(0, 64) as u32
            } else {
                r.range(0, 0xff_ffff) as u32
            }
        };
        let rd = r.range(1, 16) as u8;
        Case {
            seed,
            n: [n_a, n_b],
            faults: Faults::chaos(loss),
            mtu: mtus[r.range(0, 4) as usize],
            cap: QpCap {
                max_send_wr: depth(&mut r),
                max_recv_wr: depth(&mut r),
                max_send_sge: r.range(1, 5) as u32,
                max_recv_sge: r.range(1, 5) as u32,
                max_inline_data: [0, 16, 64, 256, 512][r.range(0, 4) as usize],
            },
            sq_sig_all: r.chance(0.8),
            max_rd_atomic: rd,
            timeout: r.range(8, 14) as u8,
            min_rnr_timer: r.range(1, 8) as u8,
            late_recv: [0.0, 0.1, 0.5][r.range(0, 2) as usize],
            psn: [psn(&mut r), psn(&mut r)],
            rnr_retry: 7,
            side: None,
            selective_repeat: true,
        }
    }

    /// The case with what the plain one lacks, drawn from its seed too (from a
    /// generator of its own, so the plain case's parameters and workload stay as
    /// they are): finite RNR retry counts, and SRQ, UC and UD streams beside it.
    ///
    /// With a finite rnr_retry the RNR timer outlasts the latest a receive is
    /// released (3 ms), so one wait per message is enough whatever the loss, and a
    /// duplicated RNR NAK arrives within the wait (it must cost no retry).
    fn with_extras(mut self) -> Case {
        let mut r = Rng::new(self.seed ^ 0xe87a_5000);
        if r.chance(0.5) {
            self.rnr_retry = r.range(1, 6) as u8;
            self.min_rnr_timer = r.range(17, 18) as u8; // 3.84 or 5.12 ms
        }
        if r.chance(0.7) {
            self.side = Some(side::SidePlan {
                srq_pairs: r.range(0, 3) as usize,
                uc_ud: r.chance(0.5),
                messages: r.range(4, 24) as usize,
                seed: r.next(),
            });
        }
        self
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Send,
    SendImm,
    Write,
    WriteImm,
    Read,
    Cas,
    Faa,
}

impl Kind {
    const ALL: [Kind; 7] = [
        Kind::Send,
        Kind::SendImm,
        Kind::Write,
        Kind::WriteImm,
        Kind::Read,
        Kind::Cas,
        Kind::Faa,
    ];

    fn carries_data(self) -> bool {
        matches!(
            self,
            Kind::Send | Kind::SendImm | Kind::Write | Kind::WriteImm
        )
    }

    fn consumes_recv(self) -> bool {
        matches!(self, Kind::Send | Kind::SendImm | Kind::WriteImm)
    }

    fn wc_opcode(self) -> WcOpcode {
        match self {
            Kind::Send | Kind::SendImm => WcOpcode::Send,
            Kind::Write | Kind::WriteImm => WcOpcode::RdmaWrite,
            Kind::Read => WcOpcode::RdmaRead,
            Kind::Cas => WcOpcode::CompSwap,
            Kind::Faa => WcOpcode::FetchAdd,
        }
    }
}

/// Regions of each end's buffer. Offsets within a region are handed out while
/// the workload is generated; the regions are laid out afterwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Region {
    /// Source bytes of SENDs, WRITEs and READs (never written).
    Src,
    /// Atomic targets: the compare-and-swap word, then the counter words.
    Atom,
    /// Where the peer's WRITEs land.
    Wdst,
    /// Where this end's READ and atomic results land.
    Rdst,
    /// This end's receive buffers.
    Recv,
}

/// An offset inside a region of one end's buffer.
#[derive(Debug, Clone, Copy)]
struct Loc {
    region: Region,
    off: usize,
}

/// One planned send WR.
#[derive(Debug, Clone)]
struct SendPlan {
    kind: Kind,
    len: u32,
    flags: SendFlags,
    inline: bool,
    /// Local SGEs.
    local: Vec<(Loc, u32)>,
    /// Remote target (WRITE destination, READ source, atomic word).
    remote: Loc,
    imm: u32,
    compare: u64,
    swap_add: u64,
    /// The old value an atomic must return.
    old: u64,
    /// SEND/WRITE: the message; READ: what must be read.
    data: Vec<u8>,
}

/// One planned receive WQE.
#[derive(Debug, Clone)]
struct RecvPlan {
    sges: Vec<(Loc, u32)>,
    /// What consumes it.
    kind: Kind,
    len: u32,
    imm: u32,
    solicited: bool,
    /// SEND data (scattered into `sges`).
    data: Vec<u8>,
    /// Virtual time before which it is not posted.
    release: Instant,
}

#[derive(Default)]
struct Bump {
    next: usize,
}

impl Bump {
    fn take(&mut self, len: usize, gap: usize) -> usize {
        let at = self.next;
        self.next += len + gap;
        at
    }
}

/// Everything one end does and has done to it.
struct EndPlan {
    sends: Vec<SendPlan>,
    recvs: Vec<RecvPlan>,
    /// Initial value of the compare-and-swap word and its final value.
    cas_init: u64,
    cas_final: u64,
    /// Initial and final values of the counter words.
    counters_init: Vec<u64>,
    counters_final: Vec<u64>,
    bumps: [Bump; 3], // Wdst, Rdst, Recv
    src: Vec<u8>,
    /// Region base offsets, once laid out.
    base: [usize; 5],
}

impl EndPlan {
    fn bump(&mut self, region: Region) -> &mut Bump {
        match region {
            Region::Wdst => &mut self.bumps[0],
            Region::Rdst => &mut self.bumps[1],
            Region::Recv => &mut self.bumps[2],
            _ => unreachable!(),
        }
    }

    fn offset(&self, loc: Loc) -> usize {
        let i = match loc.region {
            Region::Src => 0,
            Region::Atom => 1,
            Region::Wdst => 2,
            Region::Rdst => 3,
            Region::Recv => 4,
        };
        self.base[i] + loc.off
    }

    fn atom_len(&self) -> usize {
        8 * (1 + self.counters_init.len())
    }
}

struct Workload {
    ends: [EndPlan; 2],
    buf_len: usize,
}

fn pick_len(r: &mut Rng, mtu: u32) -> u32 {
    let max = 3 * mtu;
    match r.range(0, 9) {
        0 => 0,
        1 => r.range(1, 8) as u32,
        2 => mtu - 1,
        3 => mtu,
        4 => mtu + 1,
        5 => 2 * mtu,
        6 => max,
        _ => r.range(0, u64::from(max)) as u32,
    }
}

/// Places pieces of the given lengths inside a fresh slot of `region`, in a
/// random order, and returns them in SGE order.
fn place(r: &mut Rng, end: &mut EndPlan, region: Region, lens: &[u32]) -> Vec<(Loc, u32)> {
    let total: usize = lens.iter().map(|&l| l as usize).sum();
    let gap = r.range(0, 8) as usize;
    let slot = end.bump(region).take(total, gap);
    let mut order: Vec<usize> = (0..lens.len()).collect();
    r.shuffle(&mut order);
    let mut at = vec![0usize; lens.len()];
    let mut off = slot;
    for &i in &order {
        at[i] = off;
        off += lens[i] as usize;
    }
    lens.iter()
        .zip(at)
        .map(|(&len, off)| (Loc { region, off }, len))
        .collect()
}

fn sge_count(r: &mut Rng, len: u32, max: u32) -> usize {
    if len == 0 && r.chance(0.5) {
        0
    } else {
        r.range(1, u64::from(max)) as usize
    }
}

impl Workload {
    fn generate(case: &Case) -> Workload {
        let mut r = Rng::new(case.seed);
        let mtu = case.mtu.bytes();
        let new_end = |r: &mut Rng| {
            let mut src = vec![0u8; SRC_LEN];
            r.fill(&mut src);
            let cas_init = r.next();
            EndPlan {
                sends: Vec::new(),
                recvs: Vec::new(),
                cas_init,
                cas_final: cas_init,
                counters_init: Vec::new(),
                counters_final: Vec::new(),
                bumps: Default::default(),
                src,
                base: [0; 5],
            }
        };
        let mut ends = [new_end(&mut r), new_end(&mut r)];
        let mut faa_count = [0usize; 2];
        let max_inline = case.cap.max_inline_data;
        for s in 0..2 {
            let p = 1 - s;
            // Unsignaled WRs in a row: a send queue slot is free only once a later
            // signaled completion was polled, so (as on hardware) a run of
            // max_send_wr unsignaled WRs would never free its slots.
            let mut unsignaled_run = 0;
            for i in 0..case.n[s] {
                let kind = Kind::ALL[r.range(0, 6) as usize];
                let len = match kind {
                    Kind::Cas | Kind::Faa => 8,
                    _ => pick_len(&mut r, mtu),
                };
                let mut flags = SendFlags::EMPTY;
                let last = i + 1 == case.n[s];
                if r.chance(0.5) || (!case.sq_sig_all && last) {
                    flags |= SendFlags::SIGNALED;
                }
                if !case.sq_sig_all && unsignaled_run + 1 >= case.cap.max_send_wr {
                    flags |= SendFlags::SIGNALED;
                }
                if flags.contains(SendFlags::SIGNALED) {
                    unsignaled_run = 0;
                } else {
                    unsignaled_run += 1;
                }
                if r.chance(0.15) {
                    flags |= SendFlags::FENCE;
                }
                if kind.consumes_recv() && r.chance(0.3) {
                    flags |= SendFlags::SOLICITED;
                }
                let inline = kind.carries_data() && len <= max_inline && r.chance(0.4);
                let mut plan = SendPlan {
                    kind,
                    len,
                    flags,
                    inline,
                    local: Vec::new(),
                    remote: Loc {
                        region: Region::Src,
                        off: 0,
                    },
                    imm: r.next() as u32,
                    compare: 0,
                    swap_add: 0,
                    old: 0,
                    data: Vec::new(),
                };
                match kind {
                    Kind::Send | Kind::SendImm | Kind::Write | Kind::WriteImm => {
                        if inline {
                            let off = r.range(0, (SRC_LEN - len as usize) as u64) as usize;
                            plan.data = ends[s].src[off..off + len as usize].to_vec();
                        } else {
                            let parts = sge_count(&mut r, len, case.cap.max_send_sge);
                            for piece in r.split(len, parts) {
                                let off = r.range(0, (SRC_LEN - piece as usize) as u64) as usize;
                                plan.data
                                    .extend_from_slice(&ends[s].src[off..off + piece as usize]);
                                plan.local.push((
                                    Loc {
                                        region: Region::Src,
                                        off,
                                    },
                                    piece,
                                ));
                            }
                        }
                        if matches!(kind, Kind::Write | Kind::WriteImm) {
                            let gap = r.range(0, 8) as usize;
                            let off = ends[p].bump(Region::Wdst).take(len as usize, gap);
                            plan.remote = Loc {
                                region: Region::Wdst,
                                off,
                            };
                        }
                    }
                    Kind::Read => {
                        let parts = sge_count(&mut r, len, case.cap.max_send_sge);
                        let lens = r.split(len, parts);
                        plan.local = place(&mut r, &mut ends[s], Region::Rdst, &lens);
                        let off = r.range(0, (SRC_LEN - len as usize) as u64) as usize;
                        plan.remote = Loc {
                            region: Region::Src,
                            off,
                        };
                        plan.data = ends[p].src[off..off + len as usize].to_vec();
                    }
                    Kind::Cas => {
                        plan.local = place(&mut r, &mut ends[s], Region::Rdst, &[8]);
                        plan.remote = Loc {
                            region: Region::Atom,
                            off: 0,
                        };
                        let cur = ends[p].cas_final;
                        plan.compare = if r.chance(0.7) {
                            cur
                        } else {
                            cur ^ (1 << r.range(0, 63))
                        };
                        plan.swap_add = r.next();
                        plan.old = cur;
                        if plan.compare == cur {
                            ends[p].cas_final = plan.swap_add;
                        }
                    }
                    Kind::Faa => {
                        plan.local = place(&mut r, &mut ends[s], Region::Rdst, &[8]);
                        let k = faa_count[p];
                        faa_count[p] += 1;
                        let word = k / 64;
                        if word == ends[p].counters_init.len() {
                            let init = r.next();
                            ends[p].counters_init.push(init);
                            ends[p].counters_final.push(init);
                        }
                        plan.remote = Loc {
                            region: Region::Atom,
                            off: 8 * (1 + word),
                        };
                        plan.swap_add = 1 << (k % 64);
                        plan.old = ends[p].counters_final[word];
                        ends[p].counters_final[word] = plan.old.wrapping_add(plan.swap_add);
                    }
                }
                if kind.consumes_recv() {
                    let capacity = if kind == Kind::WriteImm {
                        r.range(0, 64) as u32
                    } else if r.chance(0.3) {
                        len
                    } else {
                        len + r.range(1, 64) as u32
                    };
                    let parts = sge_count(&mut r, capacity, case.cap.max_recv_sge);
                    let lens = r.split(capacity, parts);
                    let sges = place(&mut r, &mut ends[p], Region::Recv, &lens);
                    let release = if r.chance(case.late_recv) {
                        Instant::from_nanos(r.range(0, 3_000_000))
                    } else {
                        Instant::ZERO
                    };
                    ends[p].recvs.push(RecvPlan {
                        sges,
                        kind,
                        len,
                        imm: plan.imm,
                        solicited: flags.contains(SendFlags::SOLICITED),
                        data: if kind == Kind::WriteImm {
                            Vec::new()
                        } else {
                            plan.data.clone()
                        },
                        release,
                    });
                }
                ends[s].sends.push(plan);
            }
        }
        // Lay out each end's buffer: Src, Atom, Wdst, Rdst, Recv, 8-byte aligned.
        let mut buf_len = 0;
        for end in &mut ends {
            let lens = [
                SRC_LEN,
                end.atom_len(),
                end.bumps[0].next,
                end.bumps[1].next,
                end.bumps[2].next,
            ];
            let mut at = 0;
            for (i, len) in lens.into_iter().enumerate() {
                end.base[i] = at;
                at = (at + len + 64).next_multiple_of(8);
            }
            buf_len = buf_len.max(at);
        }
        Workload { ends, buf_len }
    }

    /// The initial contents of an end's buffer.
    fn initial_image(&self, end: usize, seed: u64) -> Vec<u8> {
        let e = &self.ends[end];
        let mut img = vec![0u8; self.buf_len];
        Rng::new(seed ^ (0xabcd + end as u64)).fill(&mut img);
        img[..SRC_LEN].copy_from_slice(&e.src);
        let atom = e.base[1];
        img[atom..atom + 8].copy_from_slice(&e.cas_init.to_ne_bytes());
        for (i, v) in e.counters_init.iter().enumerate() {
            let at = atom + 8 * (1 + i);
            img[at..at + 8].copy_from_slice(&v.to_ne_bytes());
        }
        img
    }

    /// What an end's buffer must hold once everything completed.
    fn expected_image(&self, end: usize, initial: &[u8]) -> Vec<u8> {
        let e = &self.ends[end];
        let peer = &self.ends[1 - end];
        let mut img = initial.to_vec();
        let scatter = |img: &mut Vec<u8>, sges: &[(Loc, u32)], data: &[u8]| {
            let mut done = 0usize;
            for &(loc, len) in sges {
                let n = (len as usize).min(data.len() - done);
                let at = e.offset(loc);
                img[at..at + n].copy_from_slice(&data[done..done + n]);
                done += n;
            }
            assert_eq!(done, data.len(), "model: message larger than its buffers");
        };
        // The peer's WRITEs.
        for w in &peer.sends {
            if matches!(w.kind, Kind::Write | Kind::WriteImm) {
                let at = e.offset(w.remote);
                img[at..at + w.len as usize].copy_from_slice(&w.data);
            }
        }
        // This end's READ and atomic results.
        for w in &e.sends {
            match w.kind {
                Kind::Read => scatter(&mut img, &w.local, &w.data),
                Kind::Cas | Kind::Faa => scatter(&mut img, &w.local, &w.old.to_ne_bytes()),
                _ => {}
            }
        }
        // Received SENDs.
        for rv in &e.recvs {
            scatter(&mut img, &rv.sges, &rv.data);
        }
        // Atomic words.
        let atom = e.base[1];
        img[atom..atom + 8].copy_from_slice(&e.cas_final.to_ne_bytes());
        for (i, v) in e.counters_final.iter().enumerate() {
            let at = atom + 8 * (1 + i);
            img[at..at + 8].copy_from_slice(&v.to_ne_bytes());
        }
        img
    }
}

// ----- driving a pair through a workload -----

/// What the driver needs of one end.
#[derive(Clone, Copy)]
struct EndIds {
    node: softverbs_sim::NodeId,
    qp: QpHandle,
    qpn: Qpn,
    send_cq: CqHandle,
    recv_cq: CqHandle,
    addr: u64,
    lkey: u32,
    rkey: Rkey,
}

/// Progress of one end.
#[derive(Default, Debug)]
struct Progress {
    /// Send WRs posted.
    posted: usize,
    /// Index into the signaled WRs of the next send completion expected.
    send_seen: usize,
    recv_posted: usize,
    recv_seen: usize,
}

struct Driver<'w> {
    w: &'w Workload,
    ids: [EndIds; 2],
    /// Per end: indices of the WRs that produce a send completion.
    signaled: [Vec<usize>; 2],
    progress: [Progress; 2],
    /// Receives may be posted once virtual time reaches their release time.
    release_all: bool,
    rng: Rng,
    failure: Option<String>,
}

impl<'w> Driver<'w> {
    fn new(w: &'w Workload, ids: [EndIds; 2], case: &Case) -> Self {
        let signaled = [0, 1].map(|s| {
            w.ends[s]
                .sends
                .iter()
                .enumerate()
                .filter(|(_, p)| case.sq_sig_all || p.flags.contains(SendFlags::SIGNALED))
                .map(|(i, _)| i)
                .collect()
        });
        Driver {
            w,
            ids,
            signaled,
            progress: Default::default(),
            release_all: false,
            rng: Rng::new(case.seed ^ 0x0d15_ea5e),
            failure: None,
        }
    }

    fn done(&self) -> bool {
        (0..2).all(|s| {
            let p = &self.progress[s];
            let e = &self.w.ends[s];
            p.posted == e.sends.len()
                && p.send_seen == self.signaled[s].len()
                && p.recv_seen == e.recvs.len()
        })
    }

    fn has_unreleased_recvs(&self) -> bool {
        (0..2).any(|s| self.progress[s].recv_posted < self.w.ends[s].recvs.len())
    }

    fn sges(&self, s: usize, list: &[(Loc, u32)]) -> Vec<Sge> {
        let (end, ids) = (&self.w.ends[s], &self.ids[s]);
        list.iter()
            .map(|&(loc, length)| Sge {
                addr: ids.addr + end.offset(loc) as u64,
                length,
                lkey: ids.lkey,
            })
            .collect()
    }

    /// Called before every simulator step: checks completions, posts work.
    /// Returns whether the run is over (done, or failed).
    fn tick(&mut self, sim: &mut Sim<Probe>) -> bool {
        for s in 0..2 {
            if let Err(msg) = self.tick_end(sim, s) {
                self.failure = Some(format!(
                    "end {}: {msg}\nprogress {:?}\nnow {:?}",
                    ["A", "B"][s],
                    self.progress,
                    sim.now(),
                ));
                return true;
            }
        }
        self.done()
    }

    fn tick_end(&mut self, sim: &mut Sim<Probe>, s: usize) -> Result<(), String> {
        let ids = self.ids[s];
        let peer = self.ids[1 - s];
        let now = sim.now();
        let end = &self.w.ends[s];
        let mut batch = [WorkCompletion::default(); 16];

        // Send completions: signaled WRs, in post order, each once, successful.
        loop {
            let n = sim
                .node_mut(ids.node)
                .e
                .poll_cq(ids.send_cq, &mut batch)
                .unwrap();
            for wc in &batch[..n] {
                let p = &mut self.progress[s];
                let Some(&i) = self.signaled[s].get(p.send_seen) else {
                    return Err(format!("unexpected extra send completion {wc:?}"));
                };
                let plan = &end.sends[i];
                let want = WorkCompletion {
                    wr_id: i as u64,
                    status: WcStatus::Success,
                    opcode: plan.kind.wc_opcode(),
                    byte_len: match plan.kind {
                        Kind::Read => plan.len,
                        Kind::Cas | Kind::Faa => 8,
                        _ => 0,
                    },
                    qp_num: ids.qpn,
                    ..WorkCompletion::default()
                };
                if *wc != want {
                    return Err(format!(
                        "send completion #{} is {wc:?}, expected {want:?} for {:?} {} bytes",
                        p.send_seen, plan.kind, plan.len
                    ));
                }
                if i >= p.posted {
                    return Err(format!("completion for WR {i} not yet posted"));
                }
                p.send_seen += 1;
            }
            if n < batch.len() {
                break;
            }
        }

        // Receive completions: in post order, each for the right message.
        loop {
            let n = sim
                .node_mut(ids.node)
                .e
                .poll_cq(ids.recv_cq, &mut batch)
                .unwrap();
            for wc in &batch[..n] {
                let p = &mut self.progress[s];
                let k = p.recv_seen;
                let Some(rv) = end.recvs.get(k) else {
                    return Err(format!("unexpected extra receive completion {wc:?}"));
                };
                let want = WorkCompletion {
                    wr_id: k as u64,
                    status: WcStatus::Success,
                    opcode: if rv.kind == Kind::WriteImm {
                        WcOpcode::RecvRdmaWithImm
                    } else {
                        WcOpcode::Recv
                    },
                    byte_len: rv.len,
                    imm_data: (rv.kind != Kind::Send).then_some(rv.imm),
                    invalidated_rkey: None,
                    qp_num: ids.qpn,
                    src_qp: peer.qpn,
                    solicited: rv.solicited,
                    src_addr: None,
                    grh: false,
                };
                if *wc != want || k >= p.recv_posted {
                    return Err(format!(
                        "receive completion #{k} is {wc:?}, expected {want:?} (posted {})",
                        p.recv_posted
                    ));
                }
                p.recv_seen += 1;
            }
            if n < batch.len() {
                break;
            }
        }

        // Post receives that are due, as far as the RQ has room.
        while self.progress[s].recv_posted < end.recvs.len() {
            let k = self.progress[s].recv_posted;
            let rv = &end.recvs[k];
            if !self.release_all && rv.release > now {
                break;
            }
            let sges = self.sges(s, &rv.sges);
            match sim.node_mut(ids.node).e.post_recv(
                ids.qp,
                &RecvWr {
                    wr_id: k as u64,
                    sges: &sges,
                },
            ) {
                Ok(()) => self.progress[s].recv_posted += 1,
                Err(PostError::QueueFull) => break,
                Err(e) => return Err(format!("post_recv #{k}: {e}")),
            }
        }

        // Post a burst of send WRs, as far as the SQ has room.
        let burst = self.rng.range(1, 8);
        for _ in 0..burst {
            let i = self.progress[s].posted;
            let Some(plan) = end.sends.get(i) else {
                break;
            };
            let sges = self.sges(s, &plan.local);
            let remote_addr = peer.addr + self.w.ends[1 - s].offset(plan.remote) as u64;
            let rkey = peer.rkey;
            let op = match plan.kind {
                Kind::Send => SendOp::Send,
                Kind::SendImm => SendOp::SendWithImm { imm: plan.imm },
                Kind::Write => SendOp::RdmaWrite { remote_addr, rkey },
                Kind::WriteImm => SendOp::RdmaWriteWithImm {
                    remote_addr,
                    rkey,
                    imm: plan.imm,
                },
                Kind::Read => SendOp::RdmaRead { remote_addr, rkey },
                Kind::Cas => SendOp::AtomicCmpSwap {
                    remote_addr,
                    rkey,
                    compare: plan.compare,
                    swap: plan.swap_add,
                },
                Kind::Faa => SendOp::AtomicFetchAdd {
                    remote_addr,
                    rkey,
                    add: plan.swap_add,
                },
            };
            let payload = if plan.inline {
                Payload::Inline(&plan.data)
            } else {
                Payload::Sges(&sges)
            };
            let wr = SendWr {
                wr_id: i as u64,
                op,
                payload,
                flags: plan.flags,
            };
            match sim.node_mut(ids.node).e.post_send(ids.qp, &wr) {
                Ok(()) => self.progress[s].posted += 1,
                Err(PostError::QueueFull) => break,
                Err(e) => return Err(format!("post_send #{i} ({:?}): {e}", plan.kind)),
            }
        }
        Ok(())
    }
}

/// An engine as a simulator node that can keep a log of the packets it
/// receives and sends (set `CHAOS_LOG=1` to print it when a case fails).
struct Probe {
    e: Engine,
    name: &'static str,
    log: Option<Vec<String>>,
}

impl Probe {
    fn note(&mut self, now: Instant, dir: &str, data: &[u8]) {
        let Some(log) = &mut self.log else { return };
        let line = match softverbs_wire::RocePacket::new_checked(data) {
            Ok(pkt) => {
                let bth = pkt.bth();
                let aeth = pkt
                    .aeth()
                    .map(|a| {
                        format!(
                            " aeth={:?} msn={}",
                            softverbs_wire::AethSyndrome::from_byte(a.syndrome()),
                            a.msn()
                        )
                    })
                    .unwrap_or_default();
                let reth = pkt
                    .reth()
                    .map(|r| format!(" reth(va={:#x} len={})", r.va(), r.dma_len()))
                    .unwrap_or_default();
                format!(
                    "{:>12} {} {dir} {} psn={:#08x}{}{aeth}{reth} payload={}",
                    now.as_nanos(),
                    self.name,
                    pkt.info().name,
                    bth.psn().value(),
                    if bth.ack_req() { " A" } else { "" },
                    pkt.payload().len()
                )
            }
            Err(_) => format!("{:>12} {} {dir} malformed", now.as_nanos(), self.name),
        };
        log.push(line);
    }
}

impl Node for Probe {
    fn local_addr(&self) -> std::net::SocketAddr {
        self.e.local_addr()
    }
    fn handle_datagram(&mut self, now: Instant, src: std::net::SocketAddr, data: &[u8]) {
        let before = self.e.counters();
        self.e.handle_datagram(now, src, data);
        if self.log.is_some() {
            let after = self.e.counters();
            let dir = if after.rx_packets != before.rx_packets {
                "<-"
            } else if after.drop_icrc != before.drop_icrc {
                "<-[dropped: ICRC]"
            } else {
                "<-[dropped]"
            };
            self.note(now, dir, data);
        }
    }
    fn handle_timeout(&mut self, now: Instant) {
        if let Some(log) = &mut self.log {
            log.push(format!("{:>12} {} timeout", now.as_nanos(), self.name));
        }
        self.e.handle_timeout(now)
    }
    fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        let t = Node::poll_transmit(&mut self.e, now, buf)?;
        self.note(now, "->", &buf[..t.len]);
        Some(t)
    }
    fn poll_timeout(&self) -> Option<Instant> {
        self.e.poll_timeout()
    }
}

/// Two connected engines for one case, and their buffers.
struct Net {
    /// Declared before the buffers so the engines go first.
    sim: Sim<Probe>,
    ids: [EndIds; 2],
    bufs: [Box<[u8]>; 2],
    side: Option<side::Side>,
}

impl Net {
    fn new(case: &Case, buf_len: usize, log: bool) -> Net {
        let opts = PairOpts {
            mtu: case.mtu,
            buf_len,
            cap: case.cap,
            cqe: 4096,
            timeout: case.timeout,
            retry_cnt: 7,
            rnr_retry: case.rnr_retry,
            min_rnr_timer: case.min_rnr_timer,
            max_rd_atomic: case.max_rd_atomic,
            max_dest_rd_atomic: case.max_rd_atomic,
            sq_sig_all: case.sq_sig_all,
            psn_a: case.psn[0],
            psn_b: case.psn[1],
            ..PairOpts::default()
        };
        let mut sim = Sim::new(case.seed, case.faults);
        sim.set_tracing(log);
        let addrs: [std::net::SocketAddr; 2] = [ADDR_A.parse().unwrap(), ADDR_B.parse().unwrap()];
        let mut bufs = [0, 1].map(|_| vec![0u8; buf_len].into_boxed_slice());
        let mut ids = Vec::new();
        for (i, buf) in bufs.iter_mut().enumerate() {
            let config = EngineConfig {
                selective_repeat: case.selective_repeat,
                ..EngineConfig::new(addrs[i])
            };
            let mut e = Engine::new(config);
            let pd = e.alloc_pd().unwrap();
            let send_cq = e.create_cq(opts.cqe).unwrap();
            let recv_cq = e.create_cq(opts.cqe).unwrap();
            let (qp, qpn) = e
                .create_qp(QpInitAttr {
                    pd,
                    send_cq,
                    recv_cq,
                    qp_type: QpType::Rc,
                    cap: opts.cap,
                    sq_sig_all: opts.sq_sig_all,
                })
                .unwrap();
            // SAFETY: the buffer is heap memory that never moves and lives in
            // `Net::bufs`, which is dropped after `Net::sim` and so the engine.
            let mr = unsafe { e.reg_mr(pd, buf.as_mut_ptr(), buf.len(), opts.mr_access) }.unwrap();
            assert_eq!(mr.addr % 8, 0, "buffer must be 8-byte aligned");
            let node = sim.add_node(Probe {
                e,
                name: ["A", "B"][i],
                log: log.then(Vec::new),
            });
            ids.push(EndIds {
                node,
                qp,
                qpn,
                send_cq,
                recv_cq,
                addr: mr.addr,
                lkey: mr.lkey,
                rkey: Rkey(mr.rkey),
            });
        }
        let ids: [EndIds; 2] = [ids[0], ids[1]];
        let psn = [opts.psn_a, opts.psn_b];
        for i in 0..2 {
            let peer = 1 - i;
            connect(
                &mut sim.node_mut(ids[i].node).e,
                ids[i].qp,
                addrs[peer],
                ids[peer].qpn,
                psn[peer],
                psn[i],
                &opts,
            );
        }
        let side = case.side.map(|plan| {
            let nodes = [ids[0].node, ids[1].node];
            side::Side::new(&mut sim, nodes, addrs, plan, &opts)
        });
        Net {
            sim,
            ids,
            bufs,
            side,
        }
    }

    fn engine(&mut self, s: usize) -> &mut Engine {
        &mut self.sim.node_mut(self.ids[s].node).e
    }

    fn report(&self) -> String {
        let mut out = format!(
            "srtt A {:?} B {:?}\n",
            self.sim.node(self.ids[0].node).e.qp_srtt(self.ids[0].qp),
            self.sim.node(self.ids[1].node).e.qp_srtt(self.ids[1].qp)
        );
        out += &format!(
            "net {:?}\nA {:?}\nB {:?}",
            self.sim.stats(),
            self.sim.node(self.ids[0].node).e.counters(),
            self.sim.node(self.ids[1].node).e.counters()
        );
        if std::env::var_os("CHAOS_LOG").is_some() {
            out.push_str("\n--- datagrams lost on the network ---");
            for t in self.sim.trace().iter().filter(|t| t.fate == Fate::Lost) {
                let from = ["A", "B"][t.from.index()];
                out.push_str(&format!(
                    "\n{:>12} {from} lost {} bytes",
                    t.at.as_nanos(),
                    t.len
                ));
            }
        }
        for id in &self.ids {
            if let Some(log) = &self.sim.node(id.node).log {
                // CHAOS_LOG=<n> keeps the last n lines (default 400).
                let keep = std::env::var("CHAOS_LOG")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(400);
                let from = log.len().saturating_sub(keep);
                out.push_str(&format!("\n--- last {} log lines ---\n", log.len() - from));
                out.push_str(&log[from..].join("\n"));
            }
        }
        out
    }
}

/// Runs one case; panics with a description of the first violation.
fn run_case(case: &Case) {
    let w = Workload::generate(case);
    let log = std::env::var_os("CHAOS_LOG").is_some();
    let mut net = Net::new(case, w.buf_len, log);
    let initial = [w.initial_image(0, case.seed), w.initial_image(1, case.seed)];
    for (buf, img) in net.bufs.iter_mut().zip(&initial) {
        buf.copy_from_slice(img);
    }
    let ids = net.ids;
    let side_sources = net.side.as_ref().map(side::Side::sources);
    let mut driver = Driver::new(&w, ids, case);
    let result = loop {
        let Net { sim, side, .. } = &mut net;
        let run = sim.run_until(chaos_limits(), |sim| {
            let main_over = driver.tick(sim);
            let Some(side) = side.as_mut() else {
                return main_over;
            };
            if driver.failure.is_some() {
                return true;
            }
            if let Err(msg) = side.tick(sim) {
                driver.failure = Some(msg);
                return true;
            }
            main_over && side.done()
        });
        match run {
            // Nothing left to happen but receives not yet due: post them now.
            Err(SimError::Idle { .. }) if !driver.release_all && driver.has_unreleased_recvs() => {
                driver.release_all = true;
            }
            other => break other,
        }
    };
    if let Some(failure) = &driver.failure {
        panic!("{case:?}\n{failure}\n{}", net.report());
    }
    if let Err(e) = result {
        panic!(
            "{case:?}\nrun did not finish: {e}\nprogress {:?}\n{}",
            driver.progress,
            net.report()
        );
    }
    if std::env::var_os("CHAOS_STATS").is_some() {
        eprintln!(
            "case seed={} n={:?} loss={:.3} mtu={} sig_all={}: {:?} now={:?} A={:?} B={:?}",
            case.seed,
            case.n,
            case.faults.loss,
            case.mtu.bytes(),
            case.sq_sig_all,
            net.sim.stats(),
            net.sim.now(),
            net.sim.node(ids[0].node).e.counters(),
            net.sim.node(ids[1].node).e.counters()
        );
    }
    // Let every retransmission and late duplicate play out: nothing may complete
    // a second time.
    if let Err(e) = net.sim.run_until_idle(chaos_limits()) {
        panic!("{case:?}\nnetwork does not settle: {e}\n{}", net.report());
    }
    if let (Some(side), Some(sources)) = (net.side.as_mut(), &side_sources) {
        // Late UC/UD arrivals are checked like the others; nothing else may complete.
        let checked = side
            .tick(&mut net.sim)
            .and_then(|()| side.check_memory(sources));
        if let Err(msg) = checked {
            panic!("{case:?}\nafter the run: {msg}\n{}", net.report());
        }
    }
    for (s, id) in ids.iter().enumerate() {
        let (qp, scq, rcq) = (id.qp, id.send_cq, id.recv_cq);
        let e = net.engine(s);
        assert_eq!(
            e.query_qp(qp).unwrap().0.qp_state,
            QpState::Rts,
            "{case:?}: end {s}"
        );
        let (extra_send, extra_recv) = (e.cq_len(scq).unwrap(), e.cq_len(rcq).unwrap());
        assert!(
            extra_send == 0 && extra_recv == 0,
            "{case:?}: end {s} completed again after the run: {extra_send} send, {extra_recv} recv"
        );
    }
    for (s, initial) in initial.iter().enumerate() {
        let expected = w.expected_image(s, initial);
        let actual = &net.bufs[s][..];
        if actual != expected.as_slice() {
            let first = actual
                .iter()
                .zip(&expected)
                .position(|(a, b)| a != b)
                .unwrap();
            let e = &w.ends[s];
            panic!(
                "{case:?}\nend {s}'s buffer differs from the model first at offset {first} \
                 (regions at {:?}: src, atom, wdst, rdst, recv): got {:?}, expected {:?}",
                e.base,
                &actual[first..(first + 16).min(actual.len())],
                &expected[first..(first + 16).min(expected.len())],
            );
        }
    }
}

/// A deterministic proptest configuration: a fixed number of cases from a fixed
/// seed (both overridable from the environment to explore), no persistence.
fn config(cases: u32, seed: u64) -> ProptestConfig {
    ProptestConfig {
        cases: env_or("CHAOS_CASES", cases.into()) as u32,
        rng_seed: RngSeed::Fixed(env_or("CHAOS_SEED", seed)),
        failure_persistence: None,
        max_shrink_iters: 64,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config(CASES, 0x50f7_7e2b_5c4a_0500))]

    /// Random workloads from both ends at once, over a network losing up to 20 %
    /// of datagrams (plus duplication, reordering, corruption).
    #[test]
    fn chaos_workloads(
        seed in any::<u64>(),
        n_a in 0usize..=200,
        n_b in 0usize..=200,
        loss in 0.0f64..=0.2,
    ) {
        run_case(&Case::random(seed, loss, n_a, n_b).with_extras());
    }
}

proptest! {
    #![proptest_config(config(MODERATE_CASES, 0x0d0e_5a11_c4a0_5001))]

    /// Many more random workloads at up to 10 % loss, where exhausting
    /// retry_cnt = 7 is practically impossible (see the module docs).
    #[test]
    fn chaos_workloads_moderate_loss(
        seed in any::<u64>(),
        n_a in 0usize..=200,
        n_b in 0usize..=200,
        loss in 0.0f64..=0.1,
    ) {
        run_case(&Case::random(seed, loss, n_a, n_b).with_extras());
    }
}

// ----- hand-picked cases -----

#[test]
fn chaos_lossless_mixed() {
    let mut case = Case::random(1, 0.0, 120, 120);
    case.faults = Faults::none();
    run_case(&case);
}

fn heavy_case(seed: u64) -> Case {
    let mut case = Case::random(seed, 0.2, 150, 150);
    case.mtu = Mtu::Mtu256;
    case.cap = QpCap {
        max_send_wr: 2,
        max_recv_wr: 1,
        max_send_sge: 3,
        max_recv_sge: 3,
        max_inline_data: 64,
    };
    case.late_recv = 0.5;
    case
}

/// 20 % loss, MTU 256, queues of one or two WRs and late receives: every WR
/// waits for the one before, so this meets the most loss recoveries per WR.
/// (About 4 % of seeds of this configuration legitimately end in RETRY_EXC_ERR,
/// e.g. seed 2, where one WRITE is lost 7 times in a row and then its ACK; see
/// the module docs.)
#[test]
fn chaos_heavy_loss_mtu256_tiny_queues() {
    run_case(&heavy_case(3));
}

/// Unsignaled WRs, MTU 4096, deep queues. (Also the regression case of a NAK
/// or RNR NAK rewinding past an atomic still lacking its response: the atomic
/// was then only resent on ACK timeouts and exhausted retry_cnt.)
#[test]
fn chaos_unsignaled_mtu4096_deep_queues() {
    let mut case = Case::random(3, 0.1, 200, 200);
    case.mtu = Mtu::Mtu4096;
    case.sq_sig_all = false;
    case.cap.max_send_wr = 64;
    case.cap.max_recv_wr = 64;
    run_case(&case);
}

#[test]
fn chaos_one_outstanding_read_atomic() {
    let mut case = Case::random(4, 0.15, 200, 200);
    case.max_rd_atomic = 1;
    case.mtu = Mtu::Mtu1024;
    run_case(&case);
}

#[test]
fn chaos_one_way_with_rnr() {
    let mut case = Case::random(5, 0.2, 200, 0);
    case.late_recv = 0.5;
    case.cap.max_recv_wr = 3;
    run_case(&case);
}

/// Everything beside the main workload at once, at 20 % loss with duplication: three
/// RC QPs per direction on each end's SRQ with multi-packet SENDs, a UC and a UD
/// stream, and a finite RNR retry count with late receives.
#[test]
fn chaos_srq_uc_ud_and_finite_rnr_retry_at_20_percent_loss() {
    let mut case = Case::random(6, 0.2, 120, 120);
    case.mtu = Mtu::Mtu1024;
    case.late_recv = 0.5;
    case.rnr_retry = 2;
    case.min_rnr_timer = 17;
    case.side = Some(side::SidePlan {
        srq_pairs: 3,
        uc_ud: true,
        messages: 24,
        seed: 6,
    });
    run_case(&case);
}

// ----- loss levels (issue 15): both recovery modes -----

/// Bursts of loss: mean burst 4 datagrams lost with probability 0.8, entered
/// before 1.25 % of datagrams (about 5 % lost overall), on top of the chaos
/// link's duplication, reordering and corruption.
fn bursty() -> Faults {
    Faults::chaos(0.0).with_burst(softverbs_sim::Burst {
        enter: 0.0125,
        leave: 0.25,
        loss: 0.8,
    })
}

fn loss_levels(selective_repeat: bool) {
    for (i, loss) in [0.01, 0.05, 0.2, 0.3].into_iter().enumerate() {
        let mut case = Case::random(1500 + i as u64, loss, 150, 150).with_extras();
        case.selective_repeat = selective_repeat;
        run_case(&case);
    }
    let mut case = Case::random(1510, 0.0, 150, 150).with_extras();
    case.faults = bursty();
    case.selective_repeat = selective_repeat;
    run_case(&case);
}

/// Every opcode from both ends at 1, 5, 20 and 30 % loss and in bursts, with
/// duplication, reordering and corruption: exactly once, in order, data intact,
/// with selective repeat between the two engines.
#[test]
fn chaos_loss_levels_selective_repeat() {
    loss_levels(true);
}

/// The same with selective repeat off: plain IBA go-back-N (as with a peer
/// that is not softverbs), helped only by the early timer.
#[test]
fn chaos_loss_levels_go_back_n() {
    loss_levels(false);
}

// ----- bulk transfer under pure loss -----

/// A 1 MiB RDMA WRITE and a READ back of it, over a link losing 20 % of
/// datagrams.
#[test]
fn one_mib_write_and_read_back_at_20_percent_loss() {
    const MIB: usize = 1 << 20;
    let opts = PairOpts {
        mtu: Mtu::Mtu4096,
        buf_len: 2 * MIB,
        ..PairOpts::default()
    };
    let mut p = Pair::new(20, Faults::lossy(0.2), opts);
    let mut r = Rng::new(20);
    r.fill(&mut p.side_mut(End::A).buf[..MIB]);
    let rkey = p.rkey(End::B);
    let remote_addr = p.addr(End::B, MIB / 2);
    let src = p.sge(End::A, 0, MIB as u32);
    p.post_send(
        End::A,
        &SendWr::new(1, SendOp::RdmaWrite { remote_addr, rkey }, &[src]),
    )
    .unwrap();
    let dst = p.sge(End::A, MIB, MIB as u32);
    p.post_send(
        End::A,
        &SendWr::new(2, SendOp::RdmaRead { remote_addr, rkey }, &[dst]),
    )
    .unwrap();
    p.run_until_send_cqes(End::A, 2).unwrap();
    let wcs = p.poll_send(End::A);
    assert_eq!(
        wcs.iter()
            .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len))
            .collect::<Vec<_>>(),
        vec![
            (1, WcStatus::Success, WcOpcode::RdmaWrite, 0),
            (2, WcStatus::Success, WcOpcode::RdmaRead, MIB as u32),
        ]
    );
    assert!(
        p.bytes(End::B, MIB / 2, MIB) == p.bytes(End::A, 0, MIB),
        "WRITE data differs"
    );
    assert!(
        p.bytes(End::A, MIB, MIB) == p.bytes(End::A, 0, MIB),
        "READ data differs"
    );
    // Nothing outside the target was written.
    assert!(p.bytes(End::B, 0, MIB / 2).iter().all(|&b| b == 0));
    assert!(p
        .bytes(End::B, MIB + MIB / 2, MIB / 2)
        .iter()
        .all(|&b| b == 0));
    assert!(p.sim.stats().lost > 0);
    p.settle();
    assert!(p.poll_send(End::A).is_empty());
    assert_eq!(p.qp_state(End::A), QpState::Rts);
    assert_eq!(p.qp_state(End::B), QpState::Rts);
}

/// Replays one proptest case: `CHAOS_CASE=seed,n_a,n_b,loss cargo test -p
/// softverbs-engine --test chaos replay -- --ignored` (add `CHAOS_LOG=1` for a
/// packet log).
#[test]
#[ignore = "replays the case named by CHAOS_CASE"]
fn replay() {
    let spec = std::env::var("CHAOS_CASE").expect("CHAOS_CASE=seed,n_a,n_b,loss");
    let f: Vec<&str> = spec.split(',').map(str::trim).collect();
    let mut case = Case::random(
        f[0].parse().unwrap(),
        f[3].parse().unwrap(),
        f[1].parse().unwrap(),
        f[2].parse().unwrap(),
    )
    .with_extras();
    if std::env::var_os("CHAOS_GO_BACK_N").is_some() {
        case.selective_repeat = false;
    }
    run_case(&case);
}

/// Runs `CHAOS_CASES` random cases from `CHAOS_SEED` and lists every failure
/// (rather than stopping at the first, as proptest does), for exploring.
#[test]
#[ignore = "exploration: CHAOS_CASES=n CHAOS_SEED=s"]
fn explore() {
    let mut r = Rng::new(env_or("CHAOS_SEED", 1));
    let n = env_or("CHAOS_CASES", 100);
    let mut failures = Vec::new();
    std::panic::set_hook(Box::new(|_| {}));
    for _ in 0..n {
        let (seed, n_a, n_b) = (r.next(), r.range(0, 200), r.range(0, 200));
        let max_loss = env_or("CHAOS_MAX_LOSS_PERMILLE", 200);
        let loss = r.range(0, max_loss) as f64 / 1000.0;
        let spec = format!("{seed},{n_a},{n_b},{loss}");
        let mut case = Case::random(seed, loss, n_a as usize, n_b as usize);
        if std::env::var_os("CHAOS_PLAIN").is_none() {
            case = case.with_extras();
        }
        if std::env::var_os("CHAOS_EXPLORE_HEAVY").is_some() {
            case = heavy_case(seed);
        }
        if std::env::var_os("CHAOS_GO_BACK_N").is_some() {
            case.selective_repeat = false;
        }
        if let Err(e) = std::panic::catch_unwind(|| run_case(&case)) {
            let msg = e.downcast_ref::<String>().cloned().unwrap_or_default();
            let first = msg
                .lines()
                .nth(1)
                .unwrap_or("")
                .chars()
                .take(300)
                .collect::<String>();
            failures.push(format!("{spec}: {first}"));
        }
    }
    let _ = std::panic::take_hook();
    for f in &failures {
        println!("{f}");
    }
    println!("{} of {n} cases failed", failures.len());
}

// ----- regressions: cases that found engine bugs -----

/// An atomic's response lost while the next atomic's arrived: the completer
/// took the later one, moved una past the missing one and dropped its replay
/// as out of range; no timer was left (hang).
#[test]
fn regression_out_of_order_atomic_response() {
    run_case(&Case::random(
        35506201906530271,
        0.05756885950116816,
        26,
        199,
    ));
}

/// A READ re-requested after a rewind while its responses were arriving: the
/// send cursor stayed on the READ's first packet behind una, so the requester
/// was never ready again and no timer was armed (hang).
#[test]
fn regression_read_cursor_behind_una() {
    run_case(&Case::random(
        155665799663819552,
        0.1367144165422928,
        159,
        125,
    ));
}

/// A delayed NAK for a PSN acknowledged since moved the send cursor behind una
/// (hang), and such stale NAKs also burned transport retries.
#[test]
fn regression_stale_nak() {
    run_case(&Case::random(12598871721859150625, 0.041, 42, 54));
}

/// Issue 15's chaos cases (`explore`, seeds 7, 8 and 18 of 300 each) that died in
/// RETRY_EXC_ERR at 16-18 % loss once the responder asked for the packets it
/// could not keep with a selective ACK instead of a sequence NAK: a selective
/// walk's resend of the packet at una was lost, and the next report, of a packet
/// sent after that walk, did not resend it (the walk had covered it lately), so
/// it waited for the early timer, and from its first IBTA timeout on went once
/// per timeout until retries ran out. Now such a report shows the resend lost,
/// and the walk it asks for starts at una again.
#[test]
fn regression_lost_resend_of_una_after_a_selective_walk() {
    for (seed, loss, n_a, n_b) in [
        (7597318510828782536, 0.182, 172, 165),
        (1377602821331859014, 0.172, 101, 77),
        (15615662932510151592, 0.162, 135, 88),
    ] {
        run_case(&Case::random(seed, loss, n_a, n_b).with_extras());
    }
}
