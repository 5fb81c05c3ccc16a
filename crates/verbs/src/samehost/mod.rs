//! The same-host path: RDMA WRITE and READ between two softverbs processes on one
//! host move straight between their registered memory with `process_vm_writev` /
//! `process_vm_readv`, with no copy through UDP and no work by the target's CPU (a
//! WRITE with immediate excepted: one header-only packet brings its completion).
//!
//! - `table`: each device publishes its memory regions in a shared file that peers
//!   map read-only; deregistration fences peers' accesses (why it is sound: there).
//! - `hello`: the handshake on a QP's path, when an RC or UC QP enters RTR: pid,
//!   table, and a probe (`process_vm_readv` of a nonce) that proves the peer shares
//!   our PID namespace and the kernel lets us read it (the peer may be in another
//!   network namespace of this kernel: only the probe decides).
//! - `retry`: an offer that got no answer is resent (sans-IO timers).
//! - `post`: the post path: check the peer QP's word and region entry, move the bytes
//!   (a READ's straight into the local region), post the WR *placed* (the engine's
//!   `engine/placed.rs`: order, completions, why ordering holds), or held behind
//!   WRITEs and READs by UDP and placed once they completed.
//! - here: what the driver keeps (its table, the peers' tables, which QPs place into
//!   which peer, which of ours accept placed work) and the handshake's handling.
//!
//! `SOFTVERBS_SAME_HOST=0` turns it off, `1` warns when a QP cannot have it. Counters:
//! `same_host_*` in `softverbs stat`, with one `same_host_qp_<qpn>` line per QP that
//! uses the path.

pub use softverbs_wire::samehost as hello;
mod post;
pub(crate) use post::{run_hook_unless_placing, WordAfter};
pub mod retry;
pub mod table;
pub mod vm;

use crate::config::SameHostMode;
use hello::{Hello, Kind};
use post::PlaceState;
use retry::OfferTimers;
use softverbs_engine::{AccessFlags, Engine, Instant, QpHandle, QpState};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use table::{Entry, OwnTable, PeerTable};

/// Counters of the path.
#[derive(Debug, Default)]
pub struct SameHostCounters {
    /// QPs that took the path.
    pub qps: AtomicU64,
    /// RDMA WRITEs placed.
    pub writes: AtomicU64,
    /// Bytes they moved.
    pub bytes_written: AtomicU64,
    /// RDMA READs placed.
    pub reads: AtomicU64,
    /// Bytes they moved.
    pub bytes_read: AtomicU64,
    /// WRITEs and READs on a same-host QP that went by UDP: an earlier request was
    /// still unacknowledged (ordering), or the bytes could not be moved.
    pub fallbacks: AtomicU64,
    /// Of those: the peer's table refused the key, PD, access or range (the UDP
    /// path's responder then gives the status IBA defines).
    pub refusals: AtomicU64,
    /// Handshakes that failed their probe or table check.
    pub probe_failures: AtomicU64,
    /// Deregistrations that waited for a peer's access under way.
    pub dereg_waits: AtomicU64,
    /// Offers sent again because no answer came (`retry.rs`).
    pub offers_resent: AtomicU64,
    /// WRITEs and READs held in the send queue until the WRITEs and READs by UDP
    /// ahead of them completed (`engine/placed.rs`), rather than sent by UDP.
    pub held: AtomicU64,
    /// Posts on QPs with the path: a list of WRs (`ibv_post_send` with a chain) counts
    /// once, as it takes the placement and device locks once.
    pub posts: AtomicU64,
}

/// A QP that places into its peer.
#[derive(Clone)]
struct QpLink {
    peer: Arc<PeerTable>,
    /// The peer QP's PD id: regions of other PDs are refused.
    remote_pd: u64,
    /// The peer's QP: its word in the peer's table says whether it accepts placed
    /// work from ours now and which operations it enables (its responder refuses the
    /// others, IBA 10.2.4.2 qp_access_flags; the engine's check 3).
    remote_qpn: u32,
    /// Our QP.
    qpn: u32,
}

/// What the driver keeps for the path.
pub(crate) struct SameHost {
    pub mode: SameHostMode,
    table: Option<OwnTable>,
    /// Peers' tables, by path: every process that may access our memory (it was
    /// accepted by, or accepted, one of our QPs) is here, for the fence.
    peers: Mutex<HashMap<String, Arc<PeerTable>>>,
    qps: Mutex<HashMap<QpHandle, QpLink>>,
    /// QPs whose held WRs may be placed now, reported by the engine and not yet
    /// handled ([`SameHost::place_held`]).
    held_ready: Mutex<Vec<QpHandle>>,
    /// Our QPs whose acceptance is published in our table (their QPNs).
    published_qps: Mutex<HashMap<QpHandle, u32>>,
    /// Offers made per QP, and their resend timers (`retry.rs`).
    offers: Mutex<OfferTimers<QpHandle>>,
    /// Handshake datagrams still to drop (fault injection for tests).
    hello_drops: AtomicU32,
    /// Held while WRs are placed: accesses of this device never overlap (the fence
    /// relies on it), and a local region a READ's bytes are landing in is not
    /// deregistered before they are in ([`SameHost::quiesce_local`]); the buffers
    /// placement uses.
    place: Mutex<PlaceState>,
    ptrace_granted: AtomicBool,
    pub counters: SameHostCounters,
}

/// Runs a closure on the engine under the device lock, then sends what it made.
pub(crate) type WithEngine<'a> = &'a dyn Fn(&mut dyn FnMut(&mut Engine));

/// The engine of the device, under its lock.
pub(crate) trait EngineAccess {
    /// Runs `f` on the engine, then sends what it made and delivers its events.
    fn with(&self, f: &mut dyn FnMut(&mut Engine));
    /// Runs `f` on the engine for a look only (nothing to send).
    fn read(&self, f: &mut dyn FnMut(&mut Engine));
}

/// A handshake datagram to send, and where.
pub(crate) struct Outgoing {
    pub to: SocketAddr,
    pub datagram: Vec<u8>,
    /// An offer (of this QP): sent only if a softverbs device at `to` published a
    /// table on this host ([`peer_may_be_softverbs`]); then its resend timer is armed
    /// ([`SameHost::offer_sent`]).
    pub offer: Option<QpHandle>,
}

/// Whether this process runs under valgrind (its preload libraries are in
/// `LD_PRELOAD`).
fn under_valgrind() -> bool {
    std::env::var_os("LD_PRELOAD").is_some_and(|p| p.to_string_lossy().contains("/vgpreload_"))
}

/// The file a device at `addr` publishes its memory-region table in.
fn table_path(addr: SocketAddr) -> std::path::PathBuf {
    crate::published::stats_dir().join(format!("{}-{}.mrt", addr.ip(), addr.port()))
}

/// Whether the peer at `addr` may be a softverbs device of this host: it published a
/// table file. So RoCEv2 peers that are not softverbs (or not on this host) never get
/// an offer. (A device in another network namespace of this kernel sharing our
/// runtime directory qualifies; whether it really is on this host, the probe decides.)
pub(crate) fn peer_may_be_softverbs(addr: SocketAddr) -> bool {
    table_path(addr).exists()
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl SameHost {
    /// The path for a device whose files go by `stem` (`address-port`).
    pub fn new(mode: SameHostMode, stem: &str, drop_first_hellos: u32) -> SameHost {
        let table = match mode {
            SameHostMode::Off => None,
            // Under valgrind, bytes a peer's process_vm_writev puts into our memory
            // look uninitialised to memcheck (it sees only our own writes, as with a
            // NIC's DMA): stay on UDP, where this process writes them itself.
            _ if under_valgrind() => {
                tracing::debug!("running under valgrind: the same-host path is off");
                None
            }
            _ => {
                let path = crate::published::stats_dir().join(format!("{stem}.mrt"));
                match OwnTable::create(&path) {
                    Ok(t) => Some(t),
                    Err(e) => {
                        tracing::warn!(error = %e, path = %path.display(),
                            "cannot create the same-host memory-region table; RDMA WRITE and READ use UDP");
                        None
                    }
                }
            }
        };
        SameHost {
            mode,
            table,
            peers: Mutex::new(HashMap::new()),
            qps: Mutex::new(HashMap::new()),
            published_qps: Mutex::new(HashMap::new()),
            held_ready: Mutex::new(Vec::new()),
            offers: Mutex::new(OfferTimers::default()),
            hello_drops: AtomicU32::new(drop_first_hellos),
            place: Mutex::new(PlaceState::default()),
            ptrace_granted: AtomicBool::new(false),
            counters: SameHostCounters::default(),
        }
    }

    fn enabled(&self) -> bool {
        self.table.is_some()
    }

    /// Publishes a memory region for peers.
    pub fn publish(&self, rkey: u32, base: u64, len: usize, access: AccessFlags, pd: u64) {
        if let Some(t) = &self.table {
            t.publish(&Entry {
                rkey,
                base,
                len: len as u64,
                access,
                pd,
                generation: 0,
            });
        }
    }

    /// Withdraws a region and waits until no peer can still be moving bytes with it
    /// (`table.rs`). Call before the engine forgets the region, without the device lock.
    pub fn withdraw(&self, rkey: u32) {
        let Some(t) = &self.table else { return };
        t.withdraw(rkey);
        let peers: Vec<Arc<PeerTable>> = lock(&self.peers).values().cloned().collect();
        let waited = t.wait_for_peers(peers.iter().map(|p| &**p));
        self.counters
            .dereg_waits
            .fetch_add(waited as u64, Ordering::Relaxed);
    }

    /// Publishes or withdraws a QP's acceptance of placed WRITEs after the engine
    /// reported a change ([`Engine::poll_placed_change`]; call under the device lock,
    /// before anything the change makes leaves).
    pub fn republish_qp(&self, engine: &Engine, qp: QpHandle) {
        let Some(t) = &self.table else { return };
        let mut published = lock(&self.published_qps);
        match (engine.query_qp(qp), engine.qp_num(qp)) {
            (Some((attr, _)), Some(qpn)) if engine.accepts_placed(qp) => {
                t.publish_qp(qpn.value(), attr.dest_qp_num, attr.qp_access_flags);
                published.insert(qp, qpn.value());
            }
            _ => {
                if let Some(qpn) = published.remove(&qp) {
                    t.withdraw_qp(qpn);
                }
            }
        }
    }

    /// Called after a local memory region left the engine, before its deregistration
    /// returns: waits until no READ may still be landing in it. A READ's bytes go
    /// straight into local registered memory, outside the device lock; its SGEs are
    /// checked (under the device lock) and its bytes moved while the placement lock is
    /// held, so once this lock has been taken after the region left the engine, every
    /// READ that found the region has landed and no later one can find it.
    pub fn quiesce_local(&self) {
        if self.table.is_some() {
            drop(lock(&self.place));
        }
    }

    /// The offer for a QP that entered RTR (call under the device lock; send after).
    pub fn offer_for(&self, engine: &Engine, qp: QpHandle) -> Option<Outgoing> {
        self.hello_for(engine, qp, Kind::Offer)
    }

    fn hello_for(&self, engine: &Engine, qp: QpHandle, kind: Kind) -> Option<Outgoing> {
        let t = self.table.as_ref()?;
        let (attr, init) = engine.query_qp(qp)?;
        let to = attr.av?;
        let qpn = engine.qp_num(qp)?;
        if kind == Kind::Offer && !lock(&self.offers).may_offer(qp) {
            return None;
        }
        let (nonce_addr, nonce) = t.nonce();
        let h = Hello {
            kind,
            dest_qpn: softverbs_engine::Qpn::new(attr.dest_qp_num),
            src_qpn: qpn,
            pid: std::process::id(),
            pd: init.pd.id(),
            qp_access: attr.qp_access_flags.0,
            nonce_addr,
            nonce,
            table: t.path().to_string_lossy().into_owned(),
        };
        Some(Outgoing {
            to,
            datagram: h.emit(),
            offer: (kind == Kind::Offer).then_some(qp),
        })
    }

    /// An offer of `qp` left at `now`: its resend timer runs until an answer comes.
    pub fn offer_sent(&self, qp: QpHandle, now: Instant) {
        lock(&self.offers).sent(qp, now);
    }

    /// When the next unanswered offer is due again.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.table.as_ref()?;
        lock(&self.offers).poll_timeout()
    }

    /// The offers due again at `now` (call under the device lock; send after): for QPs
    /// still connected (RTR or RTS) that do not place yet.
    pub fn due_offers(&self, engine: &Engine, now: Instant) -> Vec<Outgoing> {
        let mut out = Vec::new();
        if self.table.is_none() {
            return out;
        }
        loop {
            let Some(qp) = lock(&self.offers).poll_due(now) else {
                break;
            };
            let connected = engine
                .query_qp(qp)
                .is_some_and(|(a, _)| matches!(a.qp_state, QpState::Rtr | QpState::Rts));
            if !connected || self.places(qp) {
                continue;
            }
            if let Some(o) = self.hello_for(engine, qp, Kind::Offer) {
                self.counters.offers_resent.fetch_add(1, Ordering::Relaxed);
                out.push(o);
            }
        }
        out
    }

    /// Whether fault injection drops this handshake datagram.
    pub fn drop_injected(&self) -> bool {
        self.hello_drops
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok()
    }

    /// Before an offer or an answer leaves: a peer must be able to read our memory.
    pub fn grant_ptrace(&self) {
        if !self.ptrace_granted.swap(true, Ordering::Relaxed) && vm::grant_ptrace_if_needed() {
            tracing::debug!("Yama ptrace_scope 1: PR_SET_PTRACER_ANY for same-host peers");
        }
    }

    /// Checks a peer's handshake: the probe reads its nonce, its table file holds the
    /// same one and names its pid. Without the device lock (system calls).
    fn verify(&self, h: &Hello) -> Option<Arc<PeerTable>> {
        if let Some(p) = lock(&self.peers).get(&h.table) {
            if p.pid() == h.pid && p.nonce() == h.nonce {
                return Some(Arc::clone(p));
            }
        }
        let fail = |why: &dyn std::fmt::Display| {
            self.counters.probe_failures.fetch_add(1, Ordering::Relaxed);
            let msg = "same-host path refused; this QP uses UDP";
            if self.mode == SameHostMode::On {
                tracing::warn!(pid = h.pid, %why, "{msg}");
            } else {
                tracing::debug!(pid = h.pid, %why, "{msg}");
            }
            None
        };
        match vm::probe(h.pid, h.nonce_addr) {
            Ok(v) if v == h.nonce => {}
            Ok(_) => return fail(&"the probe read another value (another PID namespace?)"),
            Err(e) => return fail(&format_args!("process_vm_readv probe: {e}")),
        }
        let table = match PeerTable::open(std::path::Path::new(&h.table), h.pid) {
            Ok(t) if t.nonce() == h.nonce => Arc::new(t),
            Ok(_) => return fail(&"the table's nonce differs"),
            Err(e) => return fail(&e),
        };
        lock(&self.peers).insert(h.table.clone(), Arc::clone(&table));
        Some(table)
    }

    /// Handles a handshake datagram from `src`: returns what to send back. Takes the
    /// device lock through `with_engine` for the engine's part only.
    pub fn handle_hello(
        &self,
        src: SocketAddr,
        data: &[u8],
        with_engine: WithEngine<'_>,
    ) -> Vec<Outgoing> {
        let mut out = Vec::new();
        let Ok(h) = Hello::parse(data) else {
            return out;
        };
        // Our QP the datagram is for, if it is connected to the sender's.
        let mut ours = None;
        with_engine(&mut |e| {
            ours = e.qp_by_qpn(h.dest_qpn).filter(|&qp| {
                e.query_qp(qp).is_some_and(|(a, i)| {
                    matches!(
                        i.qp_type,
                        softverbs_engine::QpType::Rc | softverbs_engine::QpType::Uc
                    ) && a.av == Some(src)
                        && a.dest_qp_num == h.src_qpn.value()
                        && matches!(a.qp_state, QpState::Rtr | QpState::Rts)
                })
            });
        });
        let decline = || Outgoing {
            to: src,
            datagram: Hello {
                kind: Kind::Decline,
                dest_qpn: h.src_qpn,
                src_qpn: h.dest_qpn,
                pid: std::process::id(),
                pd: 0,
                qp_access: 0,
                nonce_addr: 0,
                nonce: 0,
                table: String::new(),
            }
            .emit(),
            offer: None,
        };
        match h.kind {
            Kind::Offer => {
                // Not (yet) connected to it: we offer when we get there.
                let Some(qp) = ours else {
                    out.push(decline());
                    return out;
                };
                if !self.enabled() || self.verify(&h).is_none() {
                    out.push(decline());
                    return out;
                }
                self.grant_ptrace();
                let placing = lock(&self.qps).contains_key(&qp);
                with_engine(&mut |e| {
                    if e.set_accepts_placed(qp, true).is_ok() {
                        out.extend(self.hello_for(e, qp, Kind::Accept));
                        // Our own offer may have come before the peer was ready.
                        if !placing {
                            out.extend(self.hello_for(e, qp, Kind::Offer));
                        }
                    }
                });
            }
            Kind::Accept => {
                let Some(qp) = ours else { return out };
                // Answered: whether or not it checks out, offering again would not help.
                lock(&self.offers).settle(qp);
                if !self.enabled() {
                    return out;
                }
                let Some(peer) = self.verify(&h) else {
                    return out;
                };
                let mut ok = false;
                with_engine(&mut |e| ok = e.set_same_host(qp, true).is_ok());
                if ok {
                    let fresh = lock(&self.qps)
                        .insert(
                            qp,
                            QpLink {
                                peer,
                                remote_pd: h.pd,
                                remote_qpn: h.src_qpn.value(),
                                qpn: h.dest_qpn.value(),
                            },
                        )
                        .is_none();
                    if fresh {
                        self.counters.qps.fetch_add(1, Ordering::Relaxed);
                    }
                    tracing::debug!(qpn = h.dest_qpn.value(), peer_pid = h.pid, "same-host path");
                }
            }
            Kind::Decline => {
                // Answered. (A peer that was not connected yet offers itself when it
                // is, and the answer to that offer comes with ours again.)
                if let Some(qp) = ours {
                    lock(&self.offers).settle(qp);
                }
                if self.mode == SameHostMode::On {
                    tracing::warn!(
                        qpn = h.dest_qpn.value(),
                        "the peer declined the same-host path"
                    );
                }
            }
        }
        out
    }

    /// Publishes `word` as this device's bulk writer's place (`crate::sock::apart`).
    pub fn set_bulk_writer(&self, word: u64) {
        if let Some(t) = &self.table {
            t.set_bulk_writer(word);
        }
    }

    /// The bulk writer's place `qp`'s peer published (`crate::sock::apart`), if `qp`
    /// places into it.
    pub fn peer_bulk_writer(&self, qp: QpHandle) -> Option<u64> {
        lock(&self.qps).get(&qp).map(|l| l.peer.bulk_writer())
    }

    /// Whether `qp` places into its peer.
    pub fn places(&self, qp: QpHandle) -> bool {
        self.table.is_some() && lock(&self.qps).contains_key(&qp)
    }

    /// Forgets a destroyed QP.
    pub fn forget_qp(&self, qp: QpHandle) {
        lock(&self.qps).remove(&qp);
        if let (Some(t), Some(qpn)) = (&self.table, lock(&self.published_qps).remove(&qp)) {
            t.withdraw_qp(qpn);
        }
        lock(&self.offers).forget(qp);
    }

    /// Which QPs use the path (their QPNs), for `softverbs stat`.
    pub fn qpns(&self) -> Vec<u32> {
        let mut v: Vec<u32> = lock(&self.qps).values().map(|l| l.qpn).collect();
        v.sort_unstable();
        v
    }

    /// The counter lines for `softverbs stat`.
    pub fn stat_lines(&self) -> Vec<(String, u64)> {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut v = vec![
            ("same_host_qps".to_string(), get(&c.qps)),
            ("same_host_writes".to_string(), get(&c.writes)),
            ("same_host_bytes_written".to_string(), get(&c.bytes_written)),
            ("same_host_reads".to_string(), get(&c.reads)),
            ("same_host_bytes_read".to_string(), get(&c.bytes_read)),
            ("same_host_fallbacks".to_string(), get(&c.fallbacks)),
            ("same_host_refusals".to_string(), get(&c.refusals)),
            (
                "same_host_probe_failures".to_string(),
                get(&c.probe_failures),
            ),
            ("same_host_dereg_waits".to_string(), get(&c.dereg_waits)),
            ("same_host_offers_resent".to_string(), get(&c.offers_resent)),
            ("same_host_held".to_string(), get(&c.held)),
            ("same_host_posts".to_string(), get(&c.posts)),
        ];
        for qpn in self.qpns() {
            v.push((format!("same_host_qp_{qpn:#x}"), 1));
        }
        v
    }
}
