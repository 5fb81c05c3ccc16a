//! Side traffic: streams of SEND_WITH_IMMs that run in the same simulated network as
//! a chaos case's main RC workload, from both ends at once, each checked against what
//! was sent, byte for byte.
//!
//! - Several RC QP pairs whose receiving QPs share the end's SRQ; messages of up to
//!   three MTUs, so packets of different QPs' messages interleave on the wire while
//!   each holds an SRQ WQE. Every message must arrive exactly once, in order per QP,
//!   into an SRQ WQE no other message used, and nothing else in the receive buffer
//!   may change.
//! - A UC pair: multi-packet messages, lost ones dropped whole. Every completion
//!   carries one sent message exactly (UC does not detect duplicates, IBA 9.8.3: a
//!   duplicated message may complete twice, as on rxe).
//! - A UD pair: one-packet datagrams after a 40-byte GRH area; a completion carries a
//!   sent message exactly (the network may lose or duplicate datagrams).
//!
//! Every send WR of every stream completes exactly once, successfully, in post
//! order. The immediate data names the message: `flow << 16 | index`.

use softverbs_engine::*;
use softverbs_sim::{NodeId, Sim};
use softverbs_wire::Qkey;
use std::collections::HashSet;
use std::net::SocketAddr;

use crate::common::{connect, PairOpts};
use crate::{Probe, Rng};

const QKEY: u32 = 0x5eed_0001;

/// What a case runs beside its main workload.
#[derive(Debug, Clone, Copy)]
pub struct SidePlan {
    /// RC QP pairs per direction whose receivers share an SRQ.
    pub srq_pairs: usize,
    /// Whether a UC pair and a UD pair run too.
    pub uc_ud: bool,
    /// Messages per stream.
    pub messages: usize,
    pub seed: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    SrqRc,
    Uc,
    Ud,
}

/// One stream: a sending QP on one end, a receiving QP on the other.
struct Stream {
    kind: Kind,
    from: usize,
    send_qp: QpHandle,
    send_qpn: Qpn,
    recv_qp: QpHandle,
    recv_qpn: Qpn,
    /// Where (the receiver's address and QPN) UD datagrams go.
    ud_dest: Option<(SocketAddr, Qpn)>,
    /// Message `i` lies at `src[i]` of the sender's source region, `lens[i]` bytes.
    src: Vec<usize>,
    lens: Vec<u32>,
    posted: usize,
    send_seen: usize,
    /// Messages received (RC: the next one expected).
    received: usize,
    /// Own receive queue (UC, UD): WQEs posted, each in its own slot of the
    /// receiver's buffer from `slot_base` on.
    recvs_posted: usize,
    slot_base: usize,
}

/// One end's side objects and buffers.
struct SideEnd {
    node: NodeId,
    send_cq: CqHandle,
    recv_cq: CqHandle,
    srq: Option<SrqHandle>,
    mr: MrInfo,
    /// Source bytes of every message this end sends (never written).
    src: Box<[u8]>,
    src_mr: MrInfo,
    /// Receive slots, each `slot` bytes.
    recv: Box<[u8]>,
    initial_recv: Vec<u8>,
    /// SRQ WQEs posted (one per slot, slots `0..srq_slots`).
    srq_posted: usize,
    srq_slots: usize,
    /// Slots whose message arrived: (slot, bytes written from its start).
    written: Vec<(usize, usize)>,
    /// Slots of UC receive WQEs: their contents beyond a message are undefined.
    uc_slots: std::ops::Range<usize>,
    seen_srq_wqes: HashSet<u64>,
}

pub struct Side {
    ends: Vec<SideEnd>,
    streams: Vec<Stream>,
    slot: usize,
}

fn all_access() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC
}

/// Registers a boxed buffer.
fn reg(e: &mut Engine, pd: PdHandle, buf: &mut [u8]) -> MrInfo {
    // SAFETY: the buffer is a boxed slice kept in `Side`, which the caller drops
    // after the simulator and so after the engine.
    unsafe { e.reg_mr(pd, buf.as_mut_ptr(), buf.len(), all_access()) }.unwrap()
}

impl Side {
    /// Creates the side objects on both nodes, connects them and plans the messages.
    pub fn new(
        sim: &mut Sim<Probe>,
        nodes: [NodeId; 2],
        addrs: [SocketAddr; 2],
        plan: SidePlan,
        opts: &PairOpts,
    ) -> Side {
        let mut r = Rng::new(plan.seed ^ 0x51de);
        let mtu = opts.mtu.bytes();
        let slot = 3 * mtu as usize + 64 + 40;
        let per_end = plan.srq_pairs + 2 * usize::from(plan.uc_ud);
        // Per end: the streams it sends, their messages, where they come from.
        let mut lens: Vec<Vec<Vec<u32>>> = vec![Vec::new(), Vec::new()];
        for l in lens.iter_mut() {
            for k in 0..per_end {
                let ud = plan.uc_ud && k == per_end - 1;
                let max = if ud { mtu } else { 3 * mtu };
                l.push(
                    (0..plan.messages)
                        .map(|_| match r.range(0, 3) {
                            0 => max,
                            1 => r.range(1, 8) as u32,
                            _ => r.range(0, u64::from(max)) as u32,
                        })
                        .collect(),
                );
            }
        }
        let src_len = per_end * plan.messages * 3 * mtu as usize + 64;
        let srq_slots = plan.srq_pairs * plan.messages;
        // A UC and a UD stream into each end, two WQEs per message (room for
        // duplicates): UC slots first, then UD.
        let own_slots = 2 * plan.messages;
        let uc_slots = srq_slots..srq_slots + if plan.uc_ud { own_slots } else { 0 };
        let recv_len = (srq_slots + if plan.uc_ud { 2 * own_slots } else { 0 }) * slot;
        let mut ends = Vec::new();
        let mut pds = Vec::new();
        for (i, &node) in nodes.iter().enumerate() {
            let e = &mut sim.node_mut(node).e;
            let pd = e.alloc_pd().unwrap();
            let send_cq = e.create_cq(4096).unwrap();
            let recv_cq = e.create_cq(4096).unwrap();
            let srq = (plan.srq_pairs > 0).then(|| {
                let max_wr = 1 + r.range(1, 2 * plan.srq_pairs as u64) as u32;
                e.create_srq(
                    pd,
                    SrqInitAttr {
                        max_wr,
                        max_sge: 3,
                        srq_limit: 0,
                    },
                )
                .unwrap()
            });
            let mut src = vec![0u8; src_len].into_boxed_slice();
            r.fill(&mut src);
            let mut recv = vec![0u8; recv_len.max(1)].into_boxed_slice();
            Rng::new(plan.seed ^ i as u64).fill(&mut recv);
            let src_mr = reg(e, pd, &mut src);
            let mr = reg(e, pd, &mut recv);
            ends.push(SideEnd {
                node,
                send_cq,
                recv_cq,
                srq,
                mr,
                initial_recv: recv.to_vec(),
                src,
                src_mr,
                recv,
                srq_posted: 0,
                srq_slots,
                written: Vec::new(),
                uc_slots: uc_slots.clone(),
                seen_srq_wqes: HashSet::new(),
            });
            pds.push(pd);
        }
        let mut streams = Vec::new();
        for from in 0..2 {
            let to = 1 - from;
            let mut at = 0usize;
            for (k, lens) in lens[from].iter().enumerate() {
                let kind = match (plan.uc_ud, per_end - k) {
                    (true, 1) => Kind::Ud,
                    (true, 2) => Kind::Uc,
                    _ => Kind::SrqRc,
                };
                let src = lens
                    .iter()
                    .map(|&l| {
                        let here = at;
                        at += l as usize;
                        here
                    })
                    .collect();
                let (qt, cap, slot_base) = match kind {
                    Kind::SrqRc => (QpType::Rc, 1, 0),
                    Kind::Uc => (QpType::Uc, own_slots as u32, srq_slots),
                    Kind::Ud => (QpType::Ud, own_slots as u32, srq_slots + own_slots),
                };
                let mut make = |side: usize| {
                    let end = &ends[side];
                    let init = QpInitAttr {
                        pd: pds[side],
                        send_cq: end.send_cq,
                        recv_cq: end.recv_cq,
                        qp_type: qt,
                        cap: QpCap {
                            max_send_wr: 1 + r.range(0, 8) as u32,
                            max_recv_wr: cap,
                            max_send_sge: 3,
                            max_recv_sge: 3,
                            max_inline_data: 0,
                        },
                        sq_sig_all: true,
                    };
                    let e = &mut sim.node_mut(end.node).e;
                    match (kind, end.srq) {
                        (Kind::SrqRc, Some(srq)) if side == to => {
                            e.create_qp_with_srq(init, srq).unwrap()
                        }
                        _ => e.create_qp(init).unwrap(),
                    }
                };
                let (send_qp, send_qpn) = make(from);
                let (recv_qp, recv_qpn) = make(to);
                let psn = [r.range(0, 0xff_ffff) as u32, r.range(0, 0xff_ffff) as u32];
                let mut ud_dest = None;
                match kind {
                    Kind::SrqRc | Kind::Uc => {
                        let o = PairOpts {
                            qp_type: qt,
                            ..opts.clone()
                        };
                        let (s, d) = (ends[from].node, ends[to].node);
                        connect(
                            &mut sim.node_mut(s).e,
                            send_qp,
                            addrs[to],
                            recv_qpn,
                            psn[1],
                            psn[0],
                            &o,
                        );
                        connect(
                            &mut sim.node_mut(d).e,
                            recv_qp,
                            addrs[from],
                            send_qpn,
                            psn[0],
                            psn[1],
                            &o,
                        );
                    }
                    Kind::Ud => {
                        for (side, qp) in [(from, send_qp), (to, recv_qp)] {
                            ud_ready(&mut sim.node_mut(ends[side].node).e, qp, psn[0]);
                        }
                        ud_dest = Some((addrs[to], recv_qpn));
                    }
                }
                streams.push(Stream {
                    kind,
                    from,
                    send_qp,
                    send_qpn,
                    recv_qp,
                    recv_qpn,
                    ud_dest,
                    src,
                    lens: lens.clone(),
                    posted: 0,
                    send_seen: 0,
                    received: 0,
                    recvs_posted: 0,
                    slot_base,
                });
            }
        }
        Side {
            ends,
            streams,
            slot,
        }
    }

    /// Whether every stream sent everything and every RC message arrived.
    pub fn done(&self) -> bool {
        self.streams.iter().all(|s| {
            s.send_seen == s.lens.len() && (s.kind != Kind::SrqRc || s.received == s.lens.len())
        })
    }

    /// One driver tick: checks completions, posts receives and sends.
    pub fn tick(&mut self, sim: &mut Sim<Probe>) -> Result<(), String> {
        for end in 0..2 {
            self.poll_sends(sim, end)?;
            self.poll_recvs(sim, end)?;
            self.post(sim, end)?;
        }
        Ok(())
    }

    fn poll_sends(&mut self, sim: &mut Sim<Probe>, end: usize) -> Result<(), String> {
        let mut batch = [WorkCompletion::default(); 16];
        let (node, cq) = (self.ends[end].node, self.ends[end].send_cq);
        loop {
            let n = sim.node_mut(node).e.poll_cq(cq, &mut batch).unwrap();
            for wc in &batch[..n] {
                let Some(s) = self
                    .streams
                    .iter_mut()
                    .find(|s| s.from == end && s.send_qpn == wc.qp_num)
                else {
                    return Err(format!("side: send completion of no stream: {wc:?}"));
                };
                let want = (s.send_seen as u64, WcStatus::Success, WcOpcode::Send);
                if (wc.wr_id, wc.status, wc.opcode) != want || s.send_seen >= s.posted {
                    return Err(format!(
                        "side {:?} stream: send completion {wc:?}, expected {want:?} (posted {})",
                        s.kind, s.posted
                    ));
                }
                s.send_seen += 1;
            }
            if n < batch.len() {
                return Ok(());
            }
        }
    }

    fn poll_recvs(&mut self, sim: &mut Sim<Probe>, end: usize) -> Result<(), String> {
        let mut batch = [WorkCompletion::default(); 16];
        let (node, cq) = (self.ends[end].node, self.ends[end].recv_cq);
        loop {
            let n = sim.node_mut(node).e.poll_cq(cq, &mut batch).unwrap();
            for wc in &batch[..n] {
                self.check_recv(end, wc)?;
            }
            if n < batch.len() {
                return Ok(());
            }
        }
    }

    fn check_recv(&mut self, end: usize, wc: &WorkCompletion) -> Result<(), String> {
        let slot = self.slot;
        let Some(k) = self
            .streams
            .iter()
            .position(|s| s.from != end && s.recv_qpn == wc.qp_num)
        else {
            return Err(format!("side: receive completion of no stream: {wc:?}"));
        };
        let s = &self.streams[k];
        let e = &self.ends[end];
        let imm = wc.imm_data.unwrap_or(u32::MAX);
        let (flow, index) = ((imm >> 16) as usize, (imm & 0xffff) as usize);
        if wc.status != WcStatus::Success || flow != k || index >= s.lens.len() {
            return Err(format!(
                "side {:?} stream {k}: bad receive completion {wc:?}",
                s.kind
            ));
        }
        let grh = if s.kind == Kind::Ud { 40 } else { 0 };
        let len = s.lens[index] as usize;
        // RC: in order per QP, each SRQ WQE once. (Each receive WQE, of the SRQ
        // or a QP's own, names its slot.)
        if s.kind == Kind::SrqRc
            && (index != s.received || self.ends[end].seen_srq_wqes.contains(&wc.wr_id))
        {
            return Err(format!(
                "side SRQ stream {k}: message {index} (expected {}) in WQE {} {wc:?}",
                s.received, wc.wr_id
            ));
        }
        let slot_index = wc.wr_id as usize;
        if wc.byte_len as usize != grh + len || wc.grh != (s.kind == Kind::Ud) {
            return Err(format!(
                "side {:?} stream {k}: message {index} of {len} bytes completed as {wc:?}",
                s.kind
            ));
        }
        let want = &self.ends[s.from].src[s.src[index]..s.src[index] + len];
        let at = slot_index * slot;
        let got = &e.recv[at + grh..at + grh + len];
        if got != want {
            let first = got.iter().zip(want).position(|(g, w)| g != w).unwrap();
            return Err(format!(
                "side {:?} stream {k}: message {index} differs at byte {first} ({wc:?})",
                s.kind
            ));
        }
        if s.kind == Kind::SrqRc {
            self.streams[k].received += 1;
            self.ends[end].seen_srq_wqes.insert(wc.wr_id);
        }
        self.ends[end].written.push((slot_index, grh + len));
        Ok(())
    }

    fn post(&mut self, sim: &mut Sim<Probe>, end: usize) -> Result<(), String> {
        let slot = self.slot;
        let e = &mut self.ends[end];
        let engine = &mut sim.node_mut(e.node).e;
        // SRQ receives, as far as the SRQ has room; each over three SGEs.
        if let Some(srq) = e.srq {
            while e.srq_posted < e.srq_slots {
                let at = e.mr.addr + (e.srq_posted * slot) as u64;
                let third = (slot / 3) as u32;
                let sges = [0, 1, 2].map(|j| Sge {
                    addr: at + u64::from(j * third),
                    length: if j == 2 {
                        slot as u32 - 2 * third
                    } else {
                        third
                    },
                    lkey: e.mr.lkey,
                });
                let wr = RecvWr {
                    wr_id: e.srq_posted as u64,
                    sges: &sges,
                };
                match engine.post_srq_recv(srq, &wr) {
                    Ok(()) => e.srq_posted += 1,
                    Err(PostError::QueueFull) => break,
                    Err(err) => return Err(format!("side: post_srq_recv: {err}")),
                }
            }
        }
        // UC and UD receive queues: all their WQEs up front, each in its own slot.
        for s in self.streams.iter_mut() {
            if s.from == end || s.kind == Kind::SrqRc {
                continue;
            }
            while s.recvs_posted < 2 * s.lens.len() {
                let slot_index = s.slot_base + s.recvs_posted;
                let sge = Sge {
                    addr: e.mr.addr + (slot_index * slot) as u64,
                    length: slot as u32,
                    lkey: e.mr.lkey,
                };
                let wr = RecvWr {
                    wr_id: slot_index as u64,
                    sges: &[sge],
                };
                match engine.post_recv(s.recv_qp, &wr) {
                    Ok(()) => s.recvs_posted += 1,
                    Err(err) => return Err(format!("side: post_recv: {err}")),
                }
            }
        }
        // Sends, as far as each send queue has room.
        for (k, s) in self.streams.iter_mut().enumerate() {
            if s.from != end {
                continue;
            }
            while s.posted < s.lens.len() {
                let i = s.posted;
                let len = s.lens[i];
                let at = e.src_mr.addr + s.src[i] as u64;
                // Up to three SGEs splitting the message.
                let cut = [len / 3, len / 3 + len / 4];
                let sges = [
                    Sge {
                        addr: at,
                        length: cut[0],
                        lkey: e.src_mr.lkey,
                    },
                    Sge {
                        addr: at + u64::from(cut[0]),
                        length: cut[1] - cut[0],
                        lkey: e.src_mr.lkey,
                    },
                    Sge {
                        addr: at + u64::from(cut[1]),
                        length: len - cut[1],
                        lkey: e.src_mr.lkey,
                    },
                ];
                let imm = ((k as u32) << 16) | i as u32;
                let op = match s.ud_dest {
                    Some((dest, remote_qpn)) => SendOp::UdSend {
                        dest,
                        remote_qpn,
                        remote_qkey: Qkey(QKEY),
                        imm: Some(imm),
                    },
                    None => SendOp::SendWithImm { imm },
                };
                match engine.post_send(s.send_qp, &SendWr::new(i as u64, op, &sges)) {
                    Ok(()) => s.posted += 1,
                    Err(PostError::QueueFull) => break,
                    Err(err) => return Err(format!("side {:?}: post_send #{i}: {err}", s.kind)),
                }
            }
        }
        Ok(())
    }

    /// After the run: each end's receive buffer holds the messages that arrived, in
    /// the slots they arrived in, and is otherwise unchanged (UC slots excepted beyond
    /// what arrived: a message dropped midway leaves undefined bytes there); the
    /// source buffers are unchanged.
    pub fn check_memory(&self, initial_src: &[Vec<u8>]) -> Result<(), String> {
        for (i, e) in self.ends.iter().enumerate() {
            if e.src[..] != initial_src[i][..] {
                return Err(format!("side: end {i}'s source buffer changed"));
            }
            let mut want = e.initial_recv.clone();
            for &(slot_index, len) in &e.written {
                let at = slot_index * self.slot;
                want[at..at + len].copy_from_slice(&e.recv[at..at + len]);
            }
            for slot_index in e.uc_slots.clone() {
                let at = slot_index * self.slot;
                want[at..at + self.slot].copy_from_slice(&e.recv[at..at + self.slot]);
            }
            if let Some(at) = e.recv.iter().zip(&want).position(|(g, w)| g != w) {
                return Err(format!(
                    "side: end {i}'s receive buffer changed at {at} (slot {}, byte {}) \
                     outside what arrived",
                    at / self.slot,
                    at % self.slot
                ));
            }
        }
        Ok(())
    }

    /// The source buffers as they are now (before the run).
    pub fn sources(&self) -> Vec<Vec<u8>> {
        self.ends.iter().map(|e| e.src.to_vec()).collect()
    }
}

/// RESET to RTS for a UD QP.
fn ud_ready(e: &mut Engine, qp: QpHandle, sq_psn: u32) {
    let now = Instant::ZERO;
    let init = QpAttr {
        qp_state: QpState::Init,
        qkey: QKEY,
        ..QpAttr::default()
    };
    let mask = QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY;
    e.modify_qp(qp, &init, mask, now).unwrap();
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ..QpAttr::default()
    };
    e.modify_qp(qp, &rtr, QpAttrMask::STATE, now).unwrap();
    let rts = QpAttr {
        qp_state: QpState::Rts,
        sq_psn,
        ..QpAttr::default()
    };
    e.modify_qp(qp, &rts, QpAttrMask::STATE | QpAttrMask::SQ_PSN, now)
        .unwrap();
}
