//! Two engines joined by the simulated network, each with a PD, CQs, one RC QP
//! connected to the other and a registered buffer — the harness every protocol
//! test starts from.
#![allow(dead_code)]

use softverbs_engine::*;
use softverbs_sim::{Faults, Limits, NodeId, Sim, SimError};
use std::net::SocketAddr;
use std::time::Duration;

/// Which end of the pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    A,
    B,
}

/// Options for building a pair.
#[derive(Debug, Clone)]
pub struct PairOpts {
    pub mtu: Mtu,
    pub buf_len: usize,
    pub cap: QpCap,
    pub cqe: u32,
    pub mr_access: AccessFlags,
    pub qp_access: AccessFlags,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub min_rnr_timer: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub sq_sig_all: bool,
    /// RC (default) or UC.
    pub qp_type: QpType,
    pub psn_a: u32,
    pub psn_b: u32,
    /// Selective repeat on both engines (`EngineConfig::selective_repeat`).
    pub selective_repeat: bool,
}

impl Default for PairOpts {
    fn default() -> Self {
        let all = AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC;
        PairOpts {
            mtu: Mtu::Mtu1024,
            buf_len: 1 << 16,
            cap: QpCap {
                max_send_wr: 64,
                max_recv_wr: 64,
                max_send_sge: 4,
                max_recv_sge: 4,
                max_inline_data: 128,
            },
            cqe: 1024,
            mr_access: all,
            qp_access: AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            max_rd_atomic: 4,
            max_dest_rd_atomic: 4,
            sq_sig_all: false,
            qp_type: QpType::Rc,
            psn_a: 0x10,
            psn_b: 0xff_fff0, // close to the wrap, so every test crosses it
            selective_repeat: true,
        }
    }
}

/// One end: its objects and registered buffer.
pub struct Side {
    pub node: NodeId,
    pub pd: PdHandle,
    pub send_cq: CqHandle,
    pub recv_cq: CqHandle,
    pub qp: QpHandle,
    pub qpn: Qpn,
    pub mr: MrInfo,
    /// The registered buffer. Boxed so it never moves; it outlives the engine's
    /// use of it because `Pair` drops `sim` first.
    pub buf: Box<[u8]>,
}

pub struct Pair {
    pub sim: Sim<Engine>,
    pub a: Side,
    pub b: Side,
    pub opts: PairOpts,
}

pub const ADDR_A: &str = "10.0.0.1:4791";
pub const ADDR_B: &str = "10.0.0.2:4791";

pub fn limits() -> Limits {
    Limits {
        max_steps: 2_000_000,
        max_time: Duration::from_secs(600),
    }
}

fn make_side(sim: &mut Sim<Engine>, addr: SocketAddr, opts: &PairOpts) -> Side {
    let config = EngineConfig {
        selective_repeat: opts.selective_repeat,
        ..EngineConfig::new(addr)
    };
    let node = sim.add_node(Engine::new(config));
    let e = sim.node_mut(node);
    let pd = e.alloc_pd().unwrap();
    let send_cq = e.create_cq(opts.cqe).unwrap();
    let recv_cq = e.create_cq(opts.cqe).unwrap();
    let (qp, qpn) = e
        .create_qp(QpInitAttr {
            pd,
            send_cq,
            recv_cq,
            qp_type: opts.qp_type,
            cap: opts.cap,
            sq_sig_all: opts.sq_sig_all,
        })
        .unwrap();
    let mut buf = vec![0u8; opts.buf_len].into_boxed_slice();
    // SAFETY: `buf` is heap memory that never moves and is kept in the `Side`,
    // which lives as long as the `Pair` and hence the engine.
    let mr = unsafe { e.reg_mr(pd, buf.as_mut_ptr(), buf.len(), opts.mr_access) }.unwrap();
    Side {
        node,
        pd,
        send_cq,
        recv_cq,
        qp,
        qpn,
        mr,
        buf,
    }
}

/// Moves a QP through INIT, RTR and RTS towards `peer`.
pub fn connect(
    e: &mut Engine,
    qp: QpHandle,
    peer: SocketAddr,
    peer_qpn: Qpn,
    rq_psn: u32,
    sq_psn: u32,
    opts: &PairOpts,
) {
    let now = Instant::ZERO;
    let init = QpAttr {
        qp_state: QpState::Init,
        qp_access_flags: opts.qp_access,
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
        path_mtu: opts.mtu,
        dest_qp_num: peer_qpn.value(),
        rq_psn,
        max_dest_rd_atomic: opts.max_dest_rd_atomic,
        min_rnr_timer: opts.min_rnr_timer,
        av: Some(peer),
        ..QpAttr::default()
    };
    let uc = opts.qp_type == QpType::Uc;
    let mut mask = QpAttrMask::STATE
        | QpAttrMask::AV
        | QpAttrMask::PATH_MTU
        | QpAttrMask::DEST_QPN
        | QpAttrMask::RQ_PSN;
    if !uc {
        mask |= QpAttrMask::MAX_DEST_RD_ATOMIC | QpAttrMask::MIN_RNR_TIMER;
    }
    e.modify_qp(qp, &rtr, mask, now).unwrap();
    let rts = QpAttr {
        qp_state: QpState::Rts,
        sq_psn,
        timeout: opts.timeout,
        retry_cnt: opts.retry_cnt,
        rnr_retry: opts.rnr_retry,
        max_rd_atomic: opts.max_rd_atomic,
        ..QpAttr::default()
    };
    let mut mask = QpAttrMask::STATE | QpAttrMask::SQ_PSN;
    if !uc {
        mask |= QpAttrMask::TIMEOUT
            | QpAttrMask::RETRY_CNT
            | QpAttrMask::RNR_RETRY
            | QpAttrMask::MAX_QP_RD_ATOMIC;
    }
    e.modify_qp(qp, &rts, mask, now).unwrap();
}

impl Pair {
    /// A connected pair over a network with `faults`, seeded by `seed`.
    pub fn new(seed: u64, faults: Faults, opts: PairOpts) -> Pair {
        let mut sim = Sim::new(seed, faults);
        let (addr_a, addr_b) = (ADDR_A.parse().unwrap(), ADDR_B.parse().unwrap());
        let a = make_side(&mut sim, addr_a, &opts);
        let b = make_side(&mut sim, addr_b, &opts);
        connect(
            sim.node_mut(a.node),
            a.qp,
            addr_b,
            b.qpn,
            opts.psn_b,
            opts.psn_a,
            &opts,
        );
        connect(
            sim.node_mut(b.node),
            b.qp,
            addr_a,
            a.qpn,
            opts.psn_a,
            opts.psn_b,
            &opts,
        );
        Pair { sim, a, b, opts }
    }

    /// A lossless pair with default options.
    pub fn lossless() -> Pair {
        Pair::new(1, Faults::none(), PairOpts::default())
    }

    /// A lossless pair of plain IBA go-back-N engines (selective repeat off), as
    /// with a peer that is not softverbs.
    pub fn lossless_go_back_n() -> Pair {
        let opts = PairOpts {
            selective_repeat: false,
            ..PairOpts::default()
        };
        Pair::new(1, Faults::none(), opts)
    }

    pub fn side(&self, end: End) -> &Side {
        match end {
            End::A => &self.a,
            End::B => &self.b,
        }
    }

    pub fn side_mut(&mut self, end: End) -> &mut Side {
        match end {
            End::A => &mut self.a,
            End::B => &mut self.b,
        }
    }

    pub fn engine(&mut self, end: End) -> &mut Engine {
        let node = self.side(end).node;
        self.sim.node_mut(node)
    }

    /// Address of byte `offset` of an end's registered buffer.
    pub fn addr(&self, end: End, offset: usize) -> u64 {
        self.side(end).mr.addr + offset as u64
    }

    /// An SGE over `len` bytes at `offset` of an end's buffer.
    pub fn sge(&self, end: End, offset: usize, len: u32) -> Sge {
        let s = self.side(end);
        Sge {
            addr: s.mr.addr + offset as u64,
            length: len,
            lkey: s.mr.lkey,
        }
    }

    pub fn rkey(&self, end: End) -> Rkey {
        Rkey(self.side(end).mr.rkey)
    }

    pub fn post_send(&mut self, end: End, wr: &SendWr<'_>) -> Result<(), PostError> {
        let qp = self.side(end).qp;
        self.engine(end).post_send(qp, wr)
    }

    pub fn post_recv(&mut self, end: End, wr_id: u64, sges: &[Sge]) -> Result<(), PostError> {
        let qp = self.side(end).qp;
        self.engine(end).post_recv(qp, &RecvWr { wr_id, sges })
    }

    /// Drains a CQ.
    pub fn poll(&mut self, end: End, cq: CqHandle) -> Vec<WorkCompletion> {
        let mut out = Vec::new();
        let mut batch = [WorkCompletion::default(); 32];
        loop {
            let n = self.engine(end).poll_cq(cq, &mut batch).unwrap();
            out.extend_from_slice(&batch[..n]);
            if n < batch.len() {
                return out;
            }
        }
    }

    pub fn poll_send(&mut self, end: End) -> Vec<WorkCompletion> {
        let cq = self.side(end).send_cq;
        self.poll(end, cq)
    }

    pub fn poll_recv(&mut self, end: End) -> Vec<WorkCompletion> {
        let cq = self.side(end).recv_cq;
        self.poll(end, cq)
    }

    /// Runs until `end`'s send CQ holds at least `n` completions.
    pub fn run_until_send_cqes(&mut self, end: End, n: usize) -> Result<(), SimError> {
        let (node, cq) = (self.side(end).node, self.side(end).send_cq);
        self.sim
            .run_until(limits(), |sim| sim.node(node).cq_len(cq).unwrap() >= n)
            .map(|_| ())
    }

    /// Runs until both CQs of both ends together hold the given counts.
    pub fn run_until_cqes(&mut self, end: End, send: usize, recv: usize) -> Result<(), SimError> {
        let s = self.side(end);
        let (node, scq, rcq) = (s.node, s.send_cq, s.recv_cq);
        self.sim
            .run_until(limits(), |sim| {
                let e = sim.node(node);
                e.cq_len(scq).unwrap() >= send && e.cq_len(rcq).unwrap() >= recv
            })
            .map(|_| ())
    }

    /// Runs until nothing is left to happen.
    pub fn settle(&mut self) {
        self.sim.run_until_idle(limits()).expect("network settles");
    }

    pub fn qp_state(&mut self, end: End) -> QpState {
        let qp = self.side(end).qp;
        self.engine(end).query_qp(qp).unwrap().0.qp_state
    }

    /// Fills `len` bytes at `offset` of an end's buffer with a pattern from `seed`
    /// that does not repeat at any power-of-two period, so data placed at a
    /// wrong MTU-sized offset cannot match by accident.
    pub fn fill(&mut self, end: End, offset: usize, len: usize, seed: u8) {
        let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ u64::from(seed) ^ ((offset as u64) << 8);
        for b in self.side_mut(end).buf[offset..offset + len].iter_mut() {
            // xorshift64*: cheap and aperiodic over any buffer we use.
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            *b = (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 56) as u8;
        }
    }
    pub fn bytes(&self, end: End, offset: usize, len: usize) -> &[u8] {
        &self.side(end).buf[offset..offset + len]
    }
}
