//! A simulated network of softverbs hosts, each a cm (and, where a test needs the
//! QP, an engine) behind a small driver that does what the real one will: hands QP1
//! datagrams to the cm and the rest to the engine, opens rendezvous sockets, answers
//! the cm's requests, and reports ICMP "port unreachable" for datagrams to ports
//! nobody holds.
//!
//! It runs on `softverbs-sim` (virtual clock, seeded faults): every socket is a sim
//! node, a host's device and its rendezvous sockets share the host. On top of the
//! sim's random faults a host can drop, duplicate or delay its own outgoing CM
//! messages by type, for the scenarios that need one exact loss.
#![allow(dead_code)]

use softverbs_cm::*;
use softverbs_engine as engine;
use softverbs_engine::{Engine, EngineConfig, Node, Transmit};
use softverbs_sim::{Fate, Faults, Limits, NodeId, Sim, SimError};
use softverbs_wire::cm::datagram::CmDatagram;
use softverbs_wire::cm::{AttributeId, CmMadRepr, CmMessage};
use std::cell::RefCell;
use std::collections::{HashMap, HashSet, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;
use std::time::Duration;

pub type HostRef = Rc<RefCell<Host>>;

/// What a host's filter does with one of its outgoing CM messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    Drop,
    /// Send it twice.
    Duplicate,
    /// Hold it back this long (later messages overtake it).
    Delay(Duration),
    /// Send it now, and a copy this much later.
    Echo(Duration),
}

pub type Filter = Box<dyn FnMut(&CmMessage, SocketAddr) -> Verdict>;
pub type Hook = Box<dyn FnMut(&mut Cm, CmInstant, &CmEvent)>;
pub type CmInstant = softverbs_cm::Instant;

pub fn cm_now(now: engine::Instant) -> CmInstant {
    CmInstant::from_nanos(now.as_nanos())
}

fn engine_time(t: CmInstant) -> engine::Instant {
    engine::Instant::from_nanos(t.as_nanos())
}

/// Verbs objects of a host that runs an engine.
pub struct Verbs {
    pub engine: Engine,
    pub pd: engine::PdHandle,
    pub cq: engine::CqHandle,
    pub mr: engine::MrInfo,
    /// The registered buffer; boxed so it never moves, dropped after the engine.
    pub buf: Box<[u8]>,
    pub qps: HashMap<Qpn, engine::QpHandle>,
}

impl Verbs {
    fn new(device: SocketAddr) -> Verbs {
        let mut engine = Engine::new(EngineConfig::new(device));
        let pd = engine.alloc_pd().unwrap();
        let cq = engine.create_cq(256).unwrap();
        let mut buf = vec![0u8; 4096].into_boxed_slice();
        let access = engine::AccessFlags::LOCAL_WRITE
            | engine::AccessFlags::REMOTE_WRITE
            | engine::AccessFlags::REMOTE_READ;
        // SAFETY: `buf` is heap memory that never moves; `Verbs` keeps it, and drops
        // it after the engine (field order), so it outlives every use.
        let mr = unsafe { engine.reg_mr(pd, buf.as_mut_ptr(), buf.len(), access) }.unwrap();
        Verbs {
            engine,
            pd,
            cq,
            mr,
            buf,
            qps: HashMap::new(),
        }
    }

    /// A new RC QP in RESET.
    pub fn create_rc_qp(&mut self) -> Qpn {
        let (qp, qpn) = self
            .engine
            .create_qp(engine::QpInitAttr {
                pd: self.pd,
                send_cq: self.cq,
                recv_cq: self.cq,
                qp_type: engine::QpType::Rc,
                cap: engine::QpCap::default(),
                sq_sig_all: false,
            })
            .unwrap();
        let qpn = Qpn::new(qpn.value());
        self.qps.insert(qpn, qp);
        qpn
    }

    pub fn qp_state(&self, qpn: Qpn) -> engine::QpState {
        let qp = self.qps[&qpn];
        self.engine.query_qp(qp).unwrap().0.qp_state
    }

    pub fn poll(&mut self) -> Vec<engine::WorkCompletion> {
        let mut batch = [engine::WorkCompletion::default(); 16];
        let n = self.engine.poll_cq(self.cq, &mut batch).unwrap();
        batch[..n].to_vec()
    }

    fn modify(&mut self, now: engine::Instant, qpn: Qpn, steps: &[QpAttrs]) -> Result<(), ()> {
        let qp = *self.qps.get(&qpn).ok_or(())?;
        for s in steps {
            let (attr, mask) = to_engine(s);
            self.engine
                .modify_qp(qp, &attr, mask, now)
                .map_err(|_| ())?;
        }
        Ok(())
    }
}

/// The cm's QP attributes as the engine takes them (bit values are ibverbs' in both).
pub fn to_engine(a: &QpAttrs) -> (engine::QpAttr, engine::QpAttrMask) {
    let state = match a.state {
        QpState::Init => engine::QpState::Init,
        QpState::Rtr => engine::QpState::Rtr,
        QpState::Rts => engine::QpState::Rts,
        QpState::Err => engine::QpState::Err,
    };
    let mtu = engine::Mtu::from_bytes(a.path_mtu.bytes()).unwrap();
    let attr = engine::QpAttr {
        qp_state: state,
        path_mtu: mtu,
        qkey: a.qkey,
        rq_psn: a.rq_psn.value(),
        sq_psn: a.sq_psn.value(),
        dest_qp_num: a.dest_qpn.value(),
        qp_access_flags: engine::AccessFlags(a.access_flags),
        av: a.ah.map(|ah| ah.dest),
        pkey_index: a.pkey_index,
        max_rd_atomic: a.max_rd_atomic,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        port_num: a.port_num,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
        ..engine::QpAttr::default()
    };
    (attr, engine::QpAttrMask(a.mask.0))
}

/// One host: a device with its cm (and engine), and the driver's bookkeeping.
pub struct Host {
    pub device: SocketAddr,
    pub cm: Cm,
    pub verbs: Option<Verbs>,
    /// Every event, in order.
    pub events: Vec<CmEvent>,
    /// When each event arrived.
    pub event_times: Vec<CmInstant>,
    /// The reason of every REJ sent.
    pub rej_reasons: Vec<RejReason>,
    /// Every request the cm made of the driver, in order.
    pub requests: Vec<DriverRequest>,
    /// Every CM message sent (after the filter), by type.
    pub sent: Vec<AttributeId>,
    /// Destinations whose address resolution is never answered.
    pub blackhole: HashSet<IpAddr>,
    /// Answer every QP transition with a failure.
    pub fail_qp: bool,
    /// Answer every multicast join with a failure (as a refused IP_ADD_MEMBERSHIP).
    pub fail_join: bool,
    pub filter: Option<Filter>,
    pub hook: Option<Hook>,
    out: VecDeque<(SocketAddr, Vec<u8>)>,
    delayed: Vec<(engine::Instant, SocketAddr, Vec<u8>)>,
    released: Vec<SocketAddr>,
}

impl Host {
    fn new(device: SocketAddr, seed: u64, with_engine: bool) -> Host {
        let config = CmConfig::new(device, CmConfig::guid_for(device), seed);
        Host {
            device,
            cm: Cm::new(config),
            verbs: with_engine.then(|| Verbs::new(device)),
            events: Vec::new(),
            event_times: Vec::new(),
            rej_reasons: Vec::new(),
            requests: Vec::new(),
            sent: Vec::new(),
            blackhole: HashSet::new(),
            fail_qp: false,
            fail_join: false,
            filter: None,
            hook: None,
            out: VecDeque::new(),
            delayed: Vec::new(),
            released: Vec::new(),
        }
    }

    /// A datagram arrived at local endpoint `at`.
    fn receive(&mut self, now: engine::Instant, src: SocketAddr, at: SocketAddr, data: &[u8]) {
        let to_qp1 = data.len() >= 8 && data[5..8] == [0, 0, 1];
        if to_qp1 {
            self.cm.handle_datagram(cm_now(now), src, at, data);
        } else if let Some(v) = self.verbs.as_mut() {
            v.engine.handle_datagram(now, src, data);
        }
        self.drive(now);
    }

    /// What the driver does after every call into the cm: answer its requests, hand
    /// its events to the test's hook, queue its datagrams.
    pub fn drive(&mut self, now: engine::Instant) {
        let t = cm_now(now);
        loop {
            let mut busy = false;
            while let Some(r) = self.cm.poll_request() {
                busy = true;
                self.requests.push(r.clone());
                match r {
                    DriverRequest::ResolveAddr { token, dst, .. } => {
                        if !self.blackhole.contains(&dst) {
                            let answer = ResolvedAddr {
                                src_ip: self.device.ip(),
                                mtu: IbMtu::Mtu1024,
                                hop_limit: 64,
                            };
                            self.cm.handle_addr_resolved(t, token, Ok(answer));
                        }
                    }
                    DriverRequest::ModifyQp {
                        token, qpn, steps, ..
                    } => {
                        let result = if self.fail_qp {
                            Err(())
                        } else {
                            match self.verbs.as_mut() {
                                Some(v) => v.modify(now, qpn, &steps),
                                None => Ok(()),
                            }
                        };
                        self.cm.handle_qp_modified(t, token, result);
                    }
                    DriverRequest::JoinGroup { token, group, .. } => {
                        let result = if self.fail_join {
                            Err(())
                        } else {
                            Ok(SocketAddr::new(group, 4791))
                        };
                        self.cm.handle_group_joined(t, token, result);
                    }
                    DriverRequest::LeaveGroup { .. } => {}
                    DriverRequest::ReleasePort { addr } => self.released.push(addr),
                }
            }
            while let Some(e) = self.cm.poll_event() {
                busy = true;
                if let Some(hook) = self.hook.as_mut() {
                    hook(&mut self.cm, t, &e);
                }
                self.events.push(e);
                self.event_times.push(t);
            }
            if !busy {
                break;
            }
        }
        let mut buf = [0u8; 512];
        while let Some(tx) = self.cm.poll_transmit(&mut buf) {
            assert_eq!(tx.src, self.device, "the cm sends from the device");
            let bytes = buf[..tx.len].to_vec();
            let mad = CmDatagram::new_checked(&bytes[..])
                .and_then(|d| CmMadRepr::parse(&d.mad()))
                .expect("the cm sends well-formed CM datagrams");
            let verdict = match self.filter.as_mut() {
                Some(f) => f(&mad.message, tx.dst),
                None => Verdict::Pass,
            };
            let kind = mad.message.attribute_id();
            match verdict {
                Verdict::Pass => self.out.push_back((tx.dst, bytes)),
                Verdict::Drop => {}
                Verdict::Duplicate => {
                    self.out.push_back((tx.dst, bytes.clone()));
                    self.out.push_back((tx.dst, bytes));
                }
                Verdict::Delay(d) => self.delayed.push((now + d, tx.dst, bytes)),
                Verdict::Echo(d) => {
                    self.out.push_back((tx.dst, bytes.clone()));
                    self.delayed.push((now + d, tx.dst, bytes));
                }
            }
            if verdict != Verdict::Drop {
                self.sent.push(kind);
                if let CmMessage::Rej(r) = &mad.message {
                    self.rej_reasons.push(r.reason);
                }
            }
        }
    }

    fn release_delayed(&mut self, now: engine::Instant) {
        let (due, later): (Vec<_>, Vec<_>) = self.delayed.drain(..).partition(|d| d.0 <= now);
        self.delayed = later;
        self.out.extend(due.into_iter().map(|(_, dst, b)| (dst, b)));
    }

    /// Events of `kind`.
    pub fn events_of(&self, kind: CmEventKind) -> Vec<&CmEvent> {
        self.events.iter().filter(|e| e.kind == kind).collect()
    }

    /// How many events of `kind` arrived for `id`.
    pub fn count(&self, id: CmIdHandle, kind: CmEventKind) -> usize {
        self.events
            .iter()
            .filter(|e| e.id == id && e.kind == kind)
            .count()
    }

    /// When the first event of `kind` for `id` arrived.
    pub fn time_of(&self, id: CmIdHandle, kind: CmEventKind) -> Option<CmInstant> {
        self.events
            .iter()
            .zip(&self.event_times)
            .find(|(e, _)| e.id == id && e.kind == kind)
            .map(|(_, t)| *t)
    }

    /// How many CM messages of `kind` this host sent.
    pub fn sent_count(&self, kind: AttributeId) -> usize {
        self.sent.iter().filter(|k| **k == kind).count()
    }
}

/// A sim node: a host's device socket, or one of its rendezvous sockets.
pub enum Endpoint {
    Device(HostRef),
    Rendezvous {
        addr: SocketAddr,
        owner: Rc<RefCell<Option<HostRef>>>,
        devices: Rc<RefCell<HashMap<SocketAddr, HostRef>>>,
    },
}

impl Node for Endpoint {
    fn local_addr(&self) -> SocketAddr {
        match self {
            Endpoint::Device(h) => h.borrow().device,
            Endpoint::Rendezvous { addr, .. } => *addr,
        }
    }

    fn handle_datagram(&mut self, now: engine::Instant, src: SocketAddr, data: &[u8]) {
        match self {
            Endpoint::Device(h) => {
                let at = h.borrow().device;
                h.borrow_mut().receive(now, src, at, data);
            }
            Endpoint::Rendezvous {
                addr,
                owner,
                devices,
            } => {
                let owner = owner.borrow().clone();
                match owner {
                    Some(h) => h.borrow_mut().receive(now, src, *addr, data),
                    None => {
                        // Closed port: the sender's kernel reports ICMP unreachable.
                        let sender = devices.borrow().get(&src).cloned();
                        if let Some(h) = sender {
                            let mut h = h.borrow_mut();
                            h.cm.handle_unreachable(cm_now(now), *addr);
                            h.drive(now);
                        }
                    }
                }
            }
        }
    }

    fn handle_timeout(&mut self, now: engine::Instant) {
        if let Endpoint::Device(h) = self {
            let mut h = h.borrow_mut();
            h.cm.handle_timeout(cm_now(now));
            if let Some(v) = h.verbs.as_mut() {
                v.engine.handle_timeout(now);
            }
            h.release_delayed(now);
            h.drive(now);
        }
    }

    fn poll_transmit(&mut self, now: engine::Instant, buf: &mut [u8]) -> Option<Transmit> {
        let Endpoint::Device(h) = self else {
            return None;
        };
        let mut h = h.borrow_mut();
        h.release_delayed(now);
        if let Some((dst, bytes)) = h.out.pop_front() {
            buf[..bytes.len()].copy_from_slice(&bytes);
            return Some(Transmit {
                src: h.device,
                dst,
                len: bytes.len(),
            });
        }
        // The engine emits packets unsealed; each goes out alone (IPv4 ID 0).
        let t = h.verbs.as_mut()?.engine.poll_transmit(now, buf)?;
        t.seal(buf, 0);
        Some(t)
    }

    fn poll_timeout(&self) -> Option<engine::Instant> {
        let Endpoint::Device(h) = self else {
            return None;
        };
        let h = h.borrow();
        let cm = h.cm.poll_timeout().map(engine_time);
        let eng = h.verbs.as_ref().and_then(|v| v.engine.poll_timeout());
        let delayed = h.delayed.iter().map(|d| d.0).min();
        [cm, eng, delayed].into_iter().flatten().min()
    }
}

/// The network.
pub struct Net {
    pub sim: Sim<Endpoint>,
    devices: Rc<RefCell<HashMap<SocketAddr, HostRef>>>,
    by_node: HashMap<NodeId, HostRef>,
    rendezvous: HashMap<SocketAddr, Rc<RefCell<Option<HostRef>>>>,
    seed: u64,
}

pub fn limits() -> Limits {
    Limits::new(2_000_000, Duration::from_secs(3600))
}

impl Net {
    pub fn new(seed: u64, faults: Faults) -> Net {
        let mut sim = Sim::new(seed, faults);
        sim.set_tracing(true);
        Net {
            sim,
            devices: Rc::new(RefCell::new(HashMap::new())),
            by_node: HashMap::new(),
            rendezvous: HashMap::new(),
            seed,
        }
    }

    pub fn lossless(seed: u64) -> Net {
        Net::new(seed, Faults::none())
    }

    /// A host whose device is at `device`.
    pub fn host(&mut self, device: &str) -> HostRef {
        self.add_host(device, false)
    }

    /// A host with an engine beside its cm.
    pub fn host_with_engine(&mut self, device: &str) -> HostRef {
        self.add_host(device, true)
    }

    fn add_host(&mut self, device: &str, with_engine: bool) -> HostRef {
        let device: SocketAddr = device.parse().unwrap();
        let seed = self.seed ^ (self.by_node.len() as u64 + 1).wrapping_mul(0x9e37_79b9);
        let h = Rc::new(RefCell::new(Host::new(device, seed, with_engine)));
        let node = self.sim.add_node(Endpoint::Device(h.clone()));
        self.by_node.insert(node, h.clone());
        self.devices.borrow_mut().insert(device, h.clone());
        h
    }

    pub fn now(&self) -> CmInstant {
        cm_now(self.sim.now())
    }

    /// Does what a driver does with a reservation: binds the rendezvous socket (a new
    /// sim node, or the old one re-opened) unless another host holds it.
    pub fn reserve(
        &mut self,
        host: &HostRef,
        id: CmIdHandle,
        r: Reservation,
    ) -> Result<(), CmError> {
        let Reservation::Needed(addr) = r else {
            return Ok(());
        };
        // A wildcard socket receives at the host's address (the sim routes by exact
        // address, and these hosts have one each).
        let addr = if addr.ip().is_unspecified() {
            SocketAddr::new(host.borrow().device.ip(), addr.port())
        } else {
            addr
        };
        let slot = self.rendezvous.get(&addr).cloned();
        let granted = match slot {
            Some(slot) if slot.borrow().is_some() => false,
            Some(slot) => {
                *slot.borrow_mut() = Some(host.clone());
                true
            }
            None => {
                let slot = Rc::new(RefCell::new(Some(host.clone())));
                self.sim.add_node(Endpoint::Rendezvous {
                    addr,
                    owner: slot.clone(),
                    devices: self.devices.clone(),
                });
                self.rendezvous.insert(addr, slot);
                true
            }
        };
        host.borrow_mut().cm.complete_reservation(id, granted)
    }

    /// `rdma_listen` on a new id bound to `addr`, with its rendezvous socket.
    pub fn listen(
        &mut self,
        host: &HostRef,
        ps: PortSpace,
        qp: QpType,
        addr: &str,
        backlog: i32,
    ) -> Result<CmIdHandle, CmError> {
        let id = host.borrow_mut().cm.create_id(ps, qp)?;
        let r = host.borrow_mut().cm.bind_addr(id, addr.parse().unwrap())?;
        self.reserve(host, id, r)?;
        let r = host.borrow_mut().cm.listen(id, backlog)?;
        self.reserve(host, id, r)?;
        Ok(id)
    }

    /// Calls into a host's cm (as the application would), then lets its driver act.
    pub fn call<T>(&mut self, host: &HostRef, f: impl FnOnce(&mut Cm, CmInstant) -> T) -> T {
        let now = self.sim.now();
        let mut h = host.borrow_mut();
        let out = f(&mut h.cm, cm_now(now));
        h.drive(now);
        out
    }

    /// Runs until `done`; unreachable destinations are reported to their senders.
    pub fn run_until(&mut self, mut done: impl FnMut(&Net) -> bool) -> Result<(), SimError> {
        let limits = limits();
        let start = self.sim.now();
        let mut steps = 0u64;
        loop {
            if done(self) {
                return Ok(());
            }
            if steps >= limits.max_steps {
                return Err(SimError::Livelock {
                    steps,
                    now: self.sim.now(),
                });
            }
            if self
                .sim
                .next_event()
                .is_some_and(|t| t - start > limits.max_time)
            {
                return Err(SimError::Deadline {
                    now: self.sim.now(),
                });
            }
            let worked = self.sim.step();
            self.after_step();
            if !worked && !self.has_pending_output() {
                return Err(SimError::Idle {
                    now: self.sim.now(),
                });
            }
            steps += 1;
        }
    }

    fn has_pending_output(&self) -> bool {
        self.by_node.values().any(|h| !h.borrow().out.is_empty())
    }

    /// Runs for `d` of virtual time.
    pub fn run_for(&mut self, d: Duration) {
        let end = self.sim.now() + d;
        loop {
            let next = self.sim.next_event();
            if next.is_none_or(|t| t > end) && !self.has_pending_output() {
                break;
            }
            self.sim.step();
            self.after_step();
        }
        let rest = end - self.sim.now();
        if !rest.is_zero() {
            self.sim.run_for(rest, limits()).unwrap();
            self.after_step();
        }
    }

    /// Runs until nothing is left to happen.
    pub fn settle(&mut self) {
        self.run_until(|net| net.sim.next_event().is_none() && !net.has_pending_output())
            .expect("network settles");
    }

    fn after_step(&mut self) {
        let now = self.sim.now();
        for entry in self.sim.take_trace() {
            if entry.fate != Fate::Undeliverable {
                continue;
            }
            if let Some(h) = self.by_node.get(&entry.from) {
                let mut h = h.borrow_mut();
                h.cm.handle_unreachable(cm_now(now), entry.dst);
                h.drive(now);
            }
        }
        for h in self.by_node.values() {
            let released: Vec<SocketAddr> = std::mem::take(&mut h.borrow_mut().released);
            let ip = h.borrow().device.ip();
            for addr in released {
                let addr = if addr.ip().is_unspecified() {
                    SocketAddr::new(ip, addr.port())
                } else {
                    addr
                };
                if let Some(slot) = self.rendezvous.get(&addr) {
                    *slot.borrow_mut() = None;
                }
            }
        }
    }
}

/// Connects a new RC id of `host` to `peer` (resolve address and route, connect),
/// answering the address events from a hook-free host.
pub fn start_connect(
    net: &mut Net,
    host: &HostRef,
    peer: &str,
    param: Option<ConnParam>,
) -> CmIdHandle {
    let peer: SocketAddr = peer.parse().unwrap();
    let id = net.call(host, |cm, now| {
        let id = cm.create_id(PortSpace::Tcp, QpType::Rc).unwrap();
        cm.resolve_addr(now, id, None, peer, Duration::from_secs(2))
            .unwrap();
        id
    });
    net.call(host, |cm, _| cm.resolve_route(id).unwrap());
    net.call(host, |cm, now| cm.connect(now, id, param).unwrap());
    id
}

/// The id of the last CONNECT_REQUEST a host saw.
pub fn last_request(host: &HostRef) -> CmIdHandle {
    host.borrow()
        .events_of(CmEventKind::ConnectRequest)
        .last()
        .expect("a connect request")
        .id
}

/// A filter that drops the first `n` messages of `kind`.
pub fn drop_first(kind: AttributeId, n: usize) -> Filter {
    let mut left = n;
    Box::new(move |m, _| {
        if m.attribute_id() == kind && left > 0 {
            left -= 1;
            Verdict::Drop
        } else {
            Verdict::Pass
        }
    })
}

/// A filter that gives the first `n` messages of `kind` the verdict `v`.
pub fn first(kind: AttributeId, n: usize, v: Verdict) -> Filter {
    let mut left = n;
    Box::new(move |m, _| {
        if m.attribute_id() == kind && left > 0 {
            left -= 1;
            v
        } else {
            Verdict::Pass
        }
    })
}
