//! The post path of the same-host path: a list of WRs is resolved under one device
//! lock (which WRs from its head may be placed now, where their local bytes are),
//! their bytes move without the device lock, then the list is posted under one more:
//! placed, held for placement behind WRITEs and READs that went by UDP
//! (`engine/placed.rs`: the post never waits for them), or the usual way. Held WRs are
//! placed later by whichever thread pumps the completion that lets them go
//! ([`SameHost::place_held`]). Placement runs under the placement lock: accesses of
//! this device never overlap (the fence relies on it), and `quiesce_local` waits for
//! READs landing in local memory.

use super::table::{self, OwnTable};
use super::{lock, vm, EngineAccess, QpLink, SameHost};
use softverbs_engine::{AccessFlags, Payload, PlacedTarget, QpHandle, SendWr};
use std::sync::atomic::Ordering;
use std::sync::MutexGuard;

thread_local! {
    /// How many placement locks this thread holds (0 or 1).
    static PLACING: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    /// Completion-channel hooks a pump under this thread's placement lock left to run
    /// once it lets go ([`run_hook_unless_placing`]).
    static DEFERRED_HOOKS: std::cell::RefCell<Vec<crate::events::EventHook>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `hook` now, or, when this thread holds the placement lock (a pump under a post),
/// as soon as it lets go: a hook may post, and posting takes that lock.
pub(crate) fn run_hook_unless_placing(hook: crate::events::EventHook) {
    if PLACING.with(|p| p.get()) == 0 {
        hook();
    } else {
        DEFERRED_HOOKS.with(|d| d.borrow_mut().push(hook));
    }
}

/// The placement lock, held.
struct PlaceGuard<'a>(Option<MutexGuard<'a, PlaceState>>);

impl Drop for PlaceGuard<'_> {
    fn drop(&mut self) {
        drop(self.0.take());
        if PLACING.with(|p| {
            p.set(p.get().saturating_sub(1));
            p.get() == 0
        }) {
            let hooks = DEFERRED_HOOKS.with(|d| std::mem::take(&mut *d.borrow_mut()));
            for hook in hooks {
                hook();
            }
        }
    }
}

impl std::ops::Deref for PlaceGuard<'_> {
    type Target = PlaceState;
    fn deref(&self) -> &PlaceState {
        self.0.as_ref().expect("held until drop")
    }
}

impl std::ops::DerefMut for PlaceGuard<'_> {
    fn deref_mut(&mut self) -> &mut PlaceState {
        self.0.as_mut().expect("held until drop")
    }
}

/// A count written after a placed write's bytes, in the same copy
/// ([`SameHost::post_write_from`]): a stream's "bytes placed" word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WordAfter {
    /// The peer's address of the word (the count; its check follows it).
    pub remote_addr: u64,
    /// Its R_Key.
    pub rkey: u32,
    /// The count.
    pub value: u64,
    /// What follows the count, written after it (`softverbs_sock::placed_word_check`).
    pub check: u64,
}

/// Bytes of a [`WordAfter`] in the peer's memory (the count and its check).
const WORD_AFTER_LEN: usize = 16;

/// The buffers of placement, reused.
#[derive(Default)]
pub(super) struct PlaceState {
    /// A WRITE's local pieces, or where a READ lands (address, length).
    pieces: Vec<(u64, usize)>,
    /// A WRITE's inline bytes.
    bounce: Vec<u8>,
    /// Held WRs being placed.
    held: Vec<softverbs_engine::HeldWr>,
    /// A list's WR i has its pieces at `pieces[spans[i]]` (`resolve_list`).
    spans: Vec<std::ops::Range<usize>>,
    /// One WR's pieces on their way into `pieces`.
    scratch: Vec<(u64, usize)>,
}

impl SameHost {
    /// Posts `wrs` on a QP with the path, in order: each RDMA WRITE or READ whose bytes
    /// can move now is placed; the others (and every WR after the first of them) are
    /// posted the usual way, a WRITE or READ behind WRITEs and READs by UDP held for
    /// placement (`engine/placed.rs`: the post never waits for them); all together,
    /// under one device lock (one transmission). `None`: the QP has no path; post the
    /// usual way. On error, the index of the first WR not posted (nothing of it or
    /// after it moved, unless another thread filled the send queue meanwhile).
    pub fn post_list(
        &self,
        qp: QpHandle,
        wrs: &[SendWr<'_>],
        engine: &dyn EngineAccess,
    ) -> Option<Result<(), (usize, softverbs_engine::PostError)>> {
        let table = self.table.as_ref()?;
        let link = self.link(qp)?;
        self.counters.posts.fetch_add(1, Ordering::Relaxed);
        let mut guard = self.lock_place();
        let st = &mut *guard;
        // Under one device lock: how many WRs from the head of the list may be placed
        // (the send queue takes them, nothing packet-borne is outstanding) and where
        // their local bytes are.
        let resolved = self.resolve_list(qp, wrs, st, engine);
        // Their bytes move in order, up to the first that cannot: it goes the usual
        // way, and so do the later ones of the list: their bytes must not land before
        // it executes (ordering, `engine/placed.rs`).
        let mut moved = 0;
        for (wr, span) in wrs.iter().zip(&st.spans).take(resolved) {
            let Some(target) = PlacedTarget::of(wr) else {
                break;
            };
            if !self.move_bytes(table, &link, &target, &st.pieces[span.clone()], &[], None) {
                break;
            }
            moved += 1;
        }
        // Posted under the placement lock too: another thread's placements cannot
        // take the send queue slots these were counted on.
        let r = self.flush(qp, wrs, moved, engine);
        drop(guard);
        self.place_held(engine);
        Some(r)
    }

    /// How many WRs from the head of `wrs` may be placed now, under one device lock:
    /// RDMA WRITEs and READs with bytes to move that the send queue takes, while
    /// placement is ready, whose local memory resolves (`place_one`'s checks): their
    /// pieces go in `st.pieces`, WR i's at `st.spans[i]` (a WRITE's inline data is
    /// this process's memory too).
    fn resolve_list(
        &self,
        qp: QpHandle,
        wrs: &[SendWr<'_>],
        st: &mut PlaceState,
        engine: &dyn EngineAccess,
    ) -> usize {
        let PlaceState {
            pieces,
            spans,
            scratch,
            ..
        } = st;
        pieces.clear();
        spans.clear();
        engine.read(&mut |e| {
            let room = e.placement_room(qp);
            for wr in wrs.iter().take(room) {
                let Some(target) = PlacedTarget::of(wr).filter(|t| t.len > 0) else {
                    return;
                };
                let start = pieces.len();
                let ok = match &wr.payload {
                    Payload::Inline(d) if target.write => {
                        pieces.push((d.as_ptr() as u64, d.len()));
                        true
                    }
                    Payload::InlineParts(parts) if target.write => {
                        pieces.extend(
                            parts
                                .iter()
                                .filter(|p| !p.is_empty())
                                .map(|p| (p.as_ptr() as u64, p.len())),
                        );
                        true
                    }
                    Payload::Inline(_) | Payload::InlineParts(_) => false,
                    Payload::Sges(_) => {
                        let found = if target.write {
                            e.placement_source(qp, wr, scratch)
                        } else {
                            e.placement_sink(qp, wr, scratch)
                        };
                        pieces.append(scratch);
                        found
                    }
                };
                if !ok {
                    pieces.truncate(start);
                    return;
                }
                spans.push(start..pieces.len());
            }
        });
        st.spans.len()
    }

    /// Takes the placement lock; while this thread holds it, the held WRs a pump
    /// reports are left for it to place once it lets go ([`SameHost::place_held`]).
    fn lock_place(&self) -> PlaceGuard<'_> {
        let guard = lock(&self.place);
        PLACING.with(|p| p.set(p.get() + 1));
        PlaceGuard(Some(guard))
    }

    /// A copy of `qp`'s link (outside the lock, for the copy that follows), if it has one.
    fn link(&self, qp: QpHandle) -> Option<QpLink> {
        lock(&self.qps).get(&qp).cloned()
    }

    /// Posts the RDMA WRITE (with or without immediate) `wr` placed, its bytes taken from
    /// `source` (memory of the caller, in order) instead of its payload, which then only
    /// gives the length: a stream writes from its caller's buffer without staging the
    /// bytes in its registered send ring first. `None` when the QP has no path, or the
    /// write cannot be placed now: then nothing was posted, and the caller posts `wr`
    /// the usual way with its payload holding the bytes (which may have reached the
    /// peer's memory already: the usual write then carries the same bytes over them,
    /// into a range the peer granted and does not read before the write's completion).
    ///
    /// With `word`, the same copy then writes `word.value` and then `word.check` into the
    /// peer's memory at `word.remote_addr` (two 8-byte ranges, after the bytes: a stream's
    /// "bytes placed" word), when the peer's table allows it there; otherwise the bytes go
    /// alone.
    pub fn post_write_from(
        &self,
        qp: QpHandle,
        wr: &SendWr<'_>,
        source: &[&[u8]],
        word: Option<WordAfter>,
        engine: &dyn EngineAccess,
    ) -> Option<Result<(), softverbs_engine::PostError>> {
        let table = self.table.as_ref()?;
        let target = PlacedTarget::of(wr)?;
        if !target.write || source.iter().map(|s| s.len()).sum::<usize>() != target.len {
            return None;
        }
        let link = self.link(qp)?;
        self.counters.posts.fetch_add(1, Ordering::Relaxed);
        let mut st = self.lock_place();
        if !self.place_one(table, &link, qp, wr, Some(source), word, &mut st, engine) {
            return None;
        }
        let c = &self.counters;
        let mut result = None;
        engine.with(&mut |e| {
            // Another WR may have gone the usual way since the check: then this one must
            // too, after it (ordering), from its payload.
            if !e.placement_ready(qp) {
                return;
            }
            result = Some(e.post_send_placed(qp, wr));
        });
        // Not posted (`None`): the caller posts it the usual way, counted there.
        if let Some(Ok(())) = result {
            c.writes.fetch_add(1, Ordering::Relaxed);
            c.bytes_written
                .fetch_add(target.len as u64, Ordering::Relaxed);
        }
        drop(st);
        self.place_held(engine);
        result
    }

    /// Moves the bytes of `wr` if it is an RDMA WRITE or READ that can be placed now;
    /// whether it was. A WRITE's bytes come from `source` when given, else from its
    /// payload. The system calls happen here, without the device lock (a READ lands
    /// straight in the local registered memory its SGEs name).
    #[allow(clippy::too_many_arguments)]
    fn place_one(
        &self,
        table: &OwnTable,
        link: &QpLink,
        qp: QpHandle,
        wr: &SendWr<'_>,
        source: Option<&[&[u8]]>,
        word: Option<WordAfter>,
        st: &mut PlaceState,
        engine: &dyn EngineAccess,
    ) -> bool {
        let Some(target) = PlacedTarget::of(wr) else {
            return false;
        };
        if target.len == 0 {
            return false;
        }
        // Inline data is this process's memory too: no need to copy it first.
        let source = source.or(match &wr.payload {
            Payload::Inline(d) => Some(std::slice::from_ref(d)),
            Payload::InlineParts(parts) => Some(*parts),
            Payload::Sges(_) => None,
        });
        // The send queue must take it (bytes never move for a WR that is not posted),
        // nothing packet-borne may be outstanding before it (ordering), and its local
        // memory must resolve: where a WRITE's bytes come from, where a READ's land.
        let mut ok = false;
        engine.read(&mut |e| {
            ok = e.placement_room(qp) > 0
                && if target.write {
                    source.is_some()
                        || e.placement_source(qp, wr, &mut st.pieces)
                        || e.gather_for_placement(qp, wr, &mut st.bounce)
                } else {
                    e.placement_sink(qp, wr, &mut st.pieces)
                };
        });
        if let (true, Some(pieces)) = (target.write, source) {
            st.pieces.clear();
            st.pieces.extend(
                pieces
                    .iter()
                    .filter(|p| !p.is_empty())
                    .map(|p| (p.as_ptr() as u64, p.len())),
            );
        }
        // (A WR not placed is counted where it is posted.)
        ok && self.move_bytes(table, link, &target, &st.pieces, &st.bounce, word)
    }

    /// Checks `target` against the peer's table and QP word and moves its bytes: a
    /// WRITE's from `st.pieces` (or `st.bounce` when there are none), a READ's into
    /// `st.pieces`. Whether they all moved. Without the device lock.
    fn move_bytes(
        &self,
        table: &OwnTable,
        link: &QpLink,
        target: &PlacedTarget,
        pieces: &[(u64, usize)],
        bounce: &[u8],
        word: Option<WordAfter>,
    ) -> bool {
        let c = &self.counters;
        let need = if target.write {
            AccessFlags::REMOTE_WRITE
        } else {
            AccessFlags::REMOTE_READ
        };
        {
            let _access = table.begin_access();
            let peer = &link.peer;
            // The peer QP must accept placed work from ours now (not in ERR, say) and
            // enable the operation, or UDP, where its responder answers as IBA says.
            let entry = if peer.qp_accepts(link.remote_qpn, link.qpn, need) {
                peer.lookup(target.rkey)
            } else {
                Err(table::Refusal::QpRefuses)
            };
            match entry.and_then(|e| e.check(link.remote_pd, target.remote_addr, target.len, need))
            {
                Err(_) => {
                    c.refusals.fetch_add(1, Ordering::Relaxed);
                    false
                }
                Ok(()) if target.write && !pieces.is_empty() => {
                    // The word's count, then its check, after the bytes, where the peer's
                    // table lets this QP write them (else the bytes go alone).
                    let word = word.filter(|w| {
                        pieces.len() + 2 <= vm::MAX_PIECES
                            && peer
                                .lookup(w.rkey)
                                .and_then(|e| {
                                    e.check(link.remote_pd, w.remote_addr, WORD_AFTER_LEN, need)
                                })
                                .is_ok()
                    });
                    match word {
                        None => {
                            vm::write_gather(peer.pid(), target.remote_addr, pieces).ok()
                                == Some(target.len)
                        }
                        Some(w) => {
                            let (value, check) = (w.value.to_ne_bytes(), w.check.to_ne_bytes());
                            let mut sources = [(0, 0); vm::MAX_PIECES];
                            let n = pieces.len();
                            sources[..n].copy_from_slice(pieces);
                            // Three remote ranges, each its own copy in the kernel, in
                            // order: the bytes, the count, its check.
                            sources[n] = (value.as_ptr() as u64, 8);
                            sources[n + 1] = (check.as_ptr() as u64, 8);
                            let remotes = [
                                (target.remote_addr, target.len),
                                (w.remote_addr, 8),
                                (w.remote_addr + 8, 8),
                            ];
                            vm::write_gather_to(peer.pid(), &remotes, &sources[..n + 2]).ok()
                                == Some(target.len + WORD_AFTER_LEN)
                        }
                    }
                }
                Ok(()) if target.write => {
                    vm::write_to(peer.pid(), target.remote_addr, bounce).ok() == Some(target.len)
                }
                // Straight into the local region (`quiesce_local` keeps it registered
                // until the bytes are in).
                Ok(()) => {
                    vm::read_scatter(peer.pid(), target.remote_addr, pieces).ok()
                        == Some(target.len)
                }
            }
            // A READ that failed part way may have changed some of its local bytes:
            // they are the READ's to write, and the UDP path writes them again.
        }
    }

    /// The engine reported QPs whose held WRs may be placed now (call without the
    /// device lock): they are placed by this thread, unless it holds the placement
    /// lock (a pump under a post), which then places them when it lets go.
    pub fn held_ready(&self, qps: &[QpHandle], engine: &dyn EngineAccess) {
        // (Only a device with a table has QPs with the path, and so held WRs.)
        if self.table.is_none() {
            return;
        }
        lock(&self.held_ready).extend_from_slice(qps);
        if PLACING.with(|p| p.get()) == 0 {
            self.place_held(engine);
        }
    }

    /// Places the held WRs of the QPs reported ready ([`Engine::poll_held_ready`]), in
    /// order: each WRITE's or READ's bytes move as a post's would, then it is
    /// settled, placed, or (its bytes could not move) released to go by UDP and fail
    /// there as IBA says; the held WRs behind it then wait for it. Call without the
    /// device lock or the placement lock.
    pub fn place_held(&self, engine: &dyn EngineAccess) {
        let Some(table) = self.table.as_ref() else {
            return;
        };
        loop {
            let qps = std::mem::take(&mut *lock(&self.held_ready));
            if qps.is_empty() {
                return;
            }
            let mut guard = self.lock_place();
            let st = &mut *guard;
            for qp in qps {
                let link = self.link(qp);
                let mut ready = std::mem::take(&mut st.held);
                engine.read(&mut |e| e.held_ready(qp, &mut ready));
                // Moved in order until one cannot: it goes by UDP, and the ones
                // after it wait for it.
                let mut moved = 0;
                for h in &ready {
                    let mut ok = false;
                    engine.read(&mut |e| {
                        ok = if h.target.write {
                            e.held_source(qp, h.seq, &mut st.pieces, &mut st.bounce)
                        } else {
                            e.held_sink(qp, h.seq, &mut st.pieces)
                        };
                    });
                    let ok = ok
                        && link.as_ref().is_some_and(|l| {
                            self.move_bytes(table, l, &h.target, &st.pieces, &st.bounce, None)
                        });
                    if !ok {
                        break;
                    }
                    moved += 1;
                }
                let c = &self.counters;
                if !ready.is_empty() {
                    engine.with(&mut |e| {
                        for (i, h) in ready.iter().enumerate().take(moved + 1) {
                            let placed = e.settle_held(qp, h.seq, i < moved);
                            let len = h.target.len as u64;
                            match (placed, h.target.write) {
                                (false, _) => c.fallbacks.fetch_add(1, Ordering::Relaxed),
                                (true, true) => {
                                    c.bytes_written.fetch_add(len, Ordering::Relaxed);
                                    c.writes.fetch_add(1, Ordering::Relaxed)
                                }
                                (true, false) => {
                                    c.bytes_read.fetch_add(len, Ordering::Relaxed);
                                    c.reads.fetch_add(1, Ordering::Relaxed)
                                }
                            };
                        }
                    });
                }
                st.held = ready;
            }
            drop(guard);
        }
    }

    /// Posts `wrs`, in order, under one device lock (one transmission for the whole
    /// list): the first `moved` placed (their bytes moved), the others held or the
    /// usual way.
    fn flush(
        &self,
        qp: QpHandle,
        wrs: &[SendWr<'_>],
        moved: usize,
        engine: &dyn EngineAccess,
    ) -> Result<(), (usize, softverbs_engine::PostError)> {
        if wrs.is_empty() {
            return Ok(());
        }
        let mut result = Ok(());
        let c = &self.counters;
        engine.with(&mut |e| {
            for (i, wr) in wrs.iter().enumerate() {
                // Another thread may have posted meanwhile: then the usual way (the
                // bytes moved already; moving them again is harmless).
                let placed = i < moved && e.placement_ready(qp);
                let held = !placed && e.should_hold(qp, wr);
                let r = if placed {
                    e.post_send_placed(qp, wr)
                } else if held {
                    e.post_send_held(qp, wr)
                } else {
                    e.post_send(qp, wr)
                };
                if let Err(err) = r {
                    result = Err((i, err));
                    return;
                }
                let Some(t) = PlacedTarget::of(wr).filter(|t| t.len > 0) else {
                    continue;
                };
                let len = t.len as u64;
                match (placed, t.write) {
                    // Counted again when it is settled.
                    _ if held => {
                        c.held.fetch_add(1, Ordering::Relaxed);
                    }
                    (false, _) => {
                        c.fallbacks.fetch_add(1, Ordering::Relaxed);
                    }
                    (true, true) => {
                        c.writes.fetch_add(1, Ordering::Relaxed);
                        c.bytes_written.fetch_add(len, Ordering::Relaxed);
                    }
                    (true, false) => {
                        c.reads.fetch_add(1, Ordering::Relaxed);
                        c.bytes_read.fetch_add(len, Ordering::Relaxed);
                    }
                }
            }
        });
        result
    }
}
