//! Selective repeat between softverbs peers: what goes on the wire, the
//! requester's scoreboard of packets the responder holds, and the responder's
//! record of packets it placed ahead of the expected PSN.
//!
//! # Negotiation (wire compatibility)
//!
//! IBA has RC go back N: a responder drops every packet after a lost one and the
//! requester resends them all (IBA 9.7.5.1.1, 9.7.5.2.5). Between two softverbs
//! peers that both have it on, the responder keeps the later packets it can place
//! and says so, and the requester resends only what is missing.
//!
//! It is negotiated in the seven reserved bits of the BTH after AckReq (Resv7),
//! which IBA transmits as zero and receivers ignore (Wireshark shows them as
//! "Reserved (7 bits)"; packets keep their length and format):
//!
//! - A requester with selective repeat on sets Resv7 on its requests to
//!   1 + the packet's index within its message (capped, [`UNKNOWN_DISTANCE`]).
//!   It stops as soon as an answer comes back with Resv7 zero: the peer is not a
//!   softverbs peer with selective repeat, and from then on every packet is plain
//!   IBA, and the requester plain go-back-N. So a foreign peer sees the bits on
//!   the requests of its first round trip only, and ignores them.
//! - A responder with selective repeat on that receives such a request answers
//!   that requester with Resv7 set on every answer ([`ANSWER`]), and only then
//!   keeps packets ahead of the expected PSN and reports them in selective
//!   acknowledgements ([`SACK_SEEN`], [`sack_run`]): RC Acknowledge packets that
//!   are plain cumulative ACKs (BTH PSN = expected PSN - 1) whose AETH MSN field
//!   carries the PSN the report is about (a packet seen but not kept, or the
//!   first of a run of kept ones, Resv7 giving the run's length). Packets ahead
//!   that could not be kept are asked for again the same way, once the expected
//!   PSN reaches them: one report names the newest of them as seen and not kept,
//!   so the requester resends the holes up to it and nothing after it (never a
//!   sequence NAK, which would send it back over everything in flight). They go only to a requester that
//!   offered, so no foreign peer ever has to read them; read as plain IBA they
//!   are still a correct cumulative ACK.
//! - A responder that does not offer it (a foreign one, or softverbs with it off)
//!   never sets Resv7, and never keeps packets ahead.
//!
//! # What it relaxes, and why delivery stays exactly once and in order
//!
//! The responder places SEND and RDMA WRITE data of packets that arrive after a
//! gap (IBA 9.7.5.1.1 would drop them and NAK the gap): a WRITE's middle or last
//! packet at its RETH's address plus (distance from the first packet) x MTU,
//! a SEND's at that offset in the receive WQE its message takes — the one in
//! progress, or the next one for a message starting at the expected PSN. This is
//! iWARP's rule (RFC 5041 section 5, RFC 5040 section 5.5): data may be *placed*
//! out of order, but nothing is *delivered* out of order. Every packet kept is
//! committed exactly once, when the expected PSN reaches it: the opcode sequence,
//! receive WQE, invalidation, MSN and ACK steps run then, in PSN order, so
//! completions, MSNs and ACKs are exactly those of the in-order run. Placement
//! runs the same R_Key, access, bounds and length checks as in order, so nothing
//! lands outside what the requester was allowed to write; a duplicate of a kept
//! packet is dropped, never placed twice; READs and atomics are never executed
//! ahead. The one visible difference: when an earlier request fails and the QP
//! goes to ERR, data of later SENDs or WRITEs may already be in their buffers
//! (their WQEs complete in error, whose buffer contents IBA leaves undefined,
//! 10.8.5).

use softverbs_wire::{Psn, Rkey};

/// PSNs past the expected one a responder may keep, and the requester's
/// scoreboard covers.
pub(crate) const WINDOW: u32 = 256;

/// Resv7 on an answer from a responder doing selective repeat.
pub(crate) const ANSWER: u8 = 1;
/// Resv7 of a selective ACK: the packet whose PSN is in the MSN field arrived
/// but could not be kept (it must be resent).
pub(crate) const SACK_SEEN: u8 = 2;
/// Resv7 of a selective ACK of a held run: `SACK_SEEN + n` says the `n` packets
/// from the PSN in the MSN field on are held (1 <= n <= [`MAX_RUN`]).
pub(crate) const MAX_RUN: u32 = 125;

/// Resv7 of a selective ACK of a run of `n` held packets.
#[inline]
pub(crate) fn sack_run(n: u32) -> u8 {
    SACK_SEEN + n.clamp(1, MAX_RUN) as u8
}
/// The largest message-relative index an offer carries; larger ones are sent as
/// this, meaning "unknown" (such packets are not kept ahead).
pub(crate) const UNKNOWN_DISTANCE: u32 = 126;

/// Resv7 of a request offering selective repeat: 1 + the packet's index in its
/// message.
#[inline]
pub(crate) fn offer(index: u32) -> u8 {
    1 + index.min(UNKNOWN_DISTANCE) as u8
}

/// The index within its message an offering request carries, if known.
#[inline]
pub(crate) fn offered_index(resv7: u8) -> Option<u32> {
    match u32::from(resv7) {
        0 => None,
        v if v > UNKNOWN_DISTANCE => None,
        v => Some(v - 1),
    }
}

/// What the requester knows of its peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Peer {
    /// No answer yet: requests offer selective repeat.
    #[default]
    Unknown,
    /// Answers carry Resv7: the peer keeps packets ahead.
    Selective,
    /// An answer came without Resv7: plain IBA go-back-N from now on.
    Plain,
}

/// The requester's scoreboard: which PSNs in `[una, una + WINDOW)` the responder
/// reported it holds.
#[derive(Debug, Clone, Default)]
pub(crate) struct Scoreboard {
    pub peer: Peer,
    held: [u64; (WINDOW / 64) as usize],
    /// Bits set in `held`: none on the lossless path, where acknowledging then
    /// has nothing to clear.
    count: u32,
    /// Selective walks have covered the holes before this PSN.
    pub walked_to: Psn,
}

impl Scoreboard {
    #[inline]
    fn bit(psn: Psn) -> (usize, u64) {
        let i = psn.value() % WINDOW;
        ((i / 64) as usize, 1 << (i % 64))
    }

    /// Whether the responder holds `psn` (only meaningful within the window
    /// from una).
    #[inline]
    pub fn holds(&self, una: Psn, psn: Psn) -> bool {
        if self.peer != Peer::Selective || una.distance_to(psn) >= WINDOW {
            return false;
        }
        let (w, b) = Self::bit(psn);
        self.held[w] & b != 0
    }

    /// Whether `psn`'s bit is set, whatever the peer (the requester also marks
    /// READ responses it placed ahead).
    #[inline]
    pub fn has(&self, psn: Psn) -> bool {
        let (w, b) = Self::bit(psn);
        self.held[w] & b != 0
    }

    /// Whether no PSN is marked (the lossless path): every [`Scoreboard::has`] is
    /// false then, and scans for held PSNs can be skipped.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Whether any of the `n` PSNs from `from` on is marked (no scan on the lossless
    /// path, where nothing is).
    #[inline]
    pub fn has_any(&self, from: Psn, n: u32) -> bool {
        !self.is_empty() && (0..n).any(|k| self.has(from.add(k)))
    }

    pub fn set_held(&mut self, psn: Psn) {
        let (w, b) = Self::bit(psn);
        self.count += u32::from(self.held[w] & b == 0);
        self.held[w] |= b;
    }

    /// The responder no longer holds `psn` for us (it refused it when it came to
    /// commit it).
    pub fn clear_held(&mut self, psn: Psn) {
        let (w, b) = Self::bit(psn);
        self.count -= u32::from(self.held[w] & b != 0);
        self.held[w] &= !b;
    }

    /// una moved from `from` to `to`: their bits are free for later PSNs.
    #[inline]
    pub fn acked(&mut self, from: Psn, to: Psn) {
        if self.count == 0 {
            return;
        }
        let n = from.distance_to(to);
        if n >= WINDOW {
            self.held = [0; (WINDOW / 64) as usize];
            self.count = 0;
            return;
        }
        for k in 0..n {
            self.clear_held(from.add(k));
        }
    }

    /// Forgets everything held (the PSNs start over).
    pub fn clear(&mut self, una: Psn) {
        self.held = [0; (WINDOW / 64) as usize];
        self.count = 0;
        self.walked_to = una;
    }
}

/// A request packet the responder placed ahead of the expected PSN, kept to be
/// committed in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Held {
    pub psn: Psn,
    pub opcode: softverbs_wire::Opcode,
    pub len: u32,
    pub imm: Option<u32>,
    pub ieth: Option<Rkey>,
    pub ack_req: bool,
    pub solicited: bool,
}

/// An RDMA WRITE whose first packet arrived ahead of the expected PSN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AheadWrite {
    pub first: Psn,
    pub va: u64,
    pub rkey: Rkey,
    pub dma_len: u32,
}

/// A message some packet of which arrived ahead of the expected PSN: where it
/// starts, and once known where it ends and whether it takes a receive WQE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AheadMessage {
    pub first: Psn,
    pub last: Option<Psn>,
    pub takes_wqe: Option<bool>,
    /// The highest PSN seen of a packet of it that does not end it.
    pub open_at: Option<Psn>,
}

/// Most messages ahead tracked at once.
const AHEAD_MESSAGES: usize = 64;

/// Most WRITEs whose first packet may be kept ahead at once.
const AHEAD_WRITES: usize = 64;

/// What a responder keeps for the packets it placed ahead of the expected PSN
/// (selective repeat), for one QP. No payload is ever kept: a packet held ahead
/// was already placed in the registered memory it targets, so what a lossy or
/// hostile requester can make the responder keep is this bookkeeping, allocated
/// once when the requester first offers selective repeat and bounded by the
/// `MAX_` constants whatever arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HeldAhead {
    /// Packets held ahead, to be committed in PSN order.
    pub packets: u32,
    /// WRITEs whose first packet (and RETH) was kept ahead.
    pub writes: u32,
    /// Messages some packet of which arrived ahead.
    pub messages: u32,
    /// Bytes allocated for all of it.
    pub bytes: usize,
}

impl HeldAhead {
    /// Most packets held ahead: the PSNs past the expected one a responder keeps.
    pub const MAX_PACKETS: u32 = WINDOW;
    /// Most WRITEs with a first packet kept ahead.
    pub const MAX_WRITES: u32 = AHEAD_WRITES as u32;
    /// Most messages tracked ahead.
    pub const MAX_MESSAGES: u32 = AHEAD_MESSAGES as u32;
    /// The bytes all of that takes.
    pub const MAX_BYTES: usize = WINDOW as usize * core::mem::size_of::<Option<Held>>()
        + AHEAD_WRITES * core::mem::size_of::<AheadWrite>()
        + AHEAD_MESSAGES * core::mem::size_of::<AheadMessage>();
}

/// The responder's side: active once the requester offered; then the packets it
/// holds ahead, in a ring indexed by PSN.
#[derive(Debug, Default)]
pub(crate) struct Reorder {
    pub active: bool,
    slots: Vec<Option<Held>>,
    writes: Vec<AheadWrite>,
    messages: Vec<AheadMessage>,
    /// Packets held now.
    pub count: u32,
}

impl Reorder {
    /// The requester offered selective repeat: from now on packets ahead may be
    /// kept. Sizes the ring once, so the data path does not allocate.
    pub fn activate(&mut self) {
        if !self.active {
            self.active = true;
            self.slots = vec![None; WINDOW as usize];
            self.writes = Vec::with_capacity(AHEAD_WRITES);
            self.messages = Vec::with_capacity(AHEAD_MESSAGES);
        }
    }

    /// What a packet `psn` that arrived ahead says of its message (which starts
    /// at `first`): where it ends, if this is its last packet, and whether it
    /// takes a receive WQE, if that is known now. Messages that ended before
    /// `epsn` are forgotten to make room (see [`Reorder::entry`]).
    ///
    /// A message's end is also inferred from its neighbours, whether the packets
    /// were kept or not: a packet that does not end its message two PSNs before
    /// another message's first one means the PSN between is its message's last
    /// (it belongs to that message, and the next starts after it). Without this a
    /// SEND whose last packet was lost leaves the receive WQEs of every message
    /// after it unknown, and all their packets dropped until the hole is filled.
    pub fn note_message(
        &mut self,
        epsn: Psn,
        in_progress: Option<Psn>,
        psn: Psn,
        first: Psn,
        last: Option<Psn>,
        takes_wqe: Option<bool>,
    ) {
        let Some(i) = self.entry(epsn, in_progress, first) else {
            return;
        };
        let entry = &mut self.messages[i];
        entry.last = entry.last.or(last);
        entry.takes_wqe = entry.takes_wqe.or(takes_wqe);
        if last.is_none() && entry.open_at.is_none_or(|o| o.before(psn)) {
            entry.open_at = Some(psn);
        }
        if last.is_none() && self.message(psn.add(2)).is_some() {
            self.messages[i].last = Some(psn.next());
        }
        if psn == first {
            let before = psn.sub(2);
            if let Some(m) = self
                .messages
                .iter_mut()
                .find(|m| m.last.is_none() && m.open_at == Some(before))
            {
                m.last = Some(before.next());
            }
        }
    }

    /// The index of the message starting at `first`, added if there is room.
    /// When the table is full, messages the expected PSN has passed make room:
    /// every message starting before it but the one in progress (the one
    /// starting at `in_progress`), whether its end was seen or not (a message
    /// whose last packet never came ahead would otherwise stay for good, and a
    /// long lossy stream fill the table, leaving nothing placeable ahead).
    fn entry(&mut self, epsn: Psn, in_progress: Option<Psn>, first: Psn) -> Option<usize> {
        if let Some(i) = self.messages.iter().position(|m| m.first == first) {
            return Some(i);
        }
        if self.messages.len() >= AHEAD_MESSAGES {
            self.messages
                .retain(|m| Some(m.first) == in_progress || epsn.distance_to(m.first) < WINDOW);
        }
        if self.messages.len() >= AHEAD_MESSAGES {
            return None;
        }
        self.messages.push(AheadMessage {
            first,
            last: None,
            takes_wqe: None,
            open_at: None,
        });
        Some(self.messages.len() - 1)
    }

    /// The message starting at `first`, if a packet of it arrived ahead.
    pub fn message(&self, first: Psn) -> Option<AheadMessage> {
        self.messages.iter().find(|m| m.first == first).copied()
    }

    #[inline]
    fn slot(psn: Psn) -> usize {
        (psn.value() % WINDOW) as usize
    }

    /// The packet held at `psn`, if any.
    #[inline]
    pub fn get(&self, psn: Psn) -> Option<Held> {
        if self.count == 0 {
            return None;
        }
        self.slots[Self::slot(psn)].filter(|h| h.psn == psn)
    }

    pub fn hold(&mut self, h: Held) {
        let slot = &mut self.slots[Self::slot(h.psn)];
        if slot.is_none() {
            self.count += 1;
        }
        *slot = Some(h);
    }

    /// The run of held packets that ends at `last`, at most [`MAX_RUN`] long:
    /// its first PSN and length (0 if `last` is not held).
    pub fn run_ending_at(&self, last: Psn) -> (Psn, u32) {
        let mut n = 0;
        while n < MAX_RUN && self.get(last.sub(n)).is_some() {
            n += 1;
        }
        (last.sub(n).next(), n)
    }

    /// Takes the packet held at `psn` (to commit it).
    pub fn take(&mut self, psn: Psn) -> Option<Held> {
        let h = self.get(psn)?;
        self.slots[Self::slot(psn)] = None;
        self.count -= 1;
        Some(h)
    }

    /// The WRITE whose first packet is `first`, if kept.
    pub fn write_from(&self, first: Psn) -> Option<AheadWrite> {
        self.writes.iter().find(|w| w.first == first).copied()
    }

    /// Remembers a WRITE whose first packet was kept; false if there is no room.
    pub fn add_write(&mut self, w: AheadWrite) -> bool {
        if self.write_from(w.first).is_some() {
            return true;
        }
        if self.writes.len() >= AHEAD_WRITES {
            return false;
        }
        self.writes.push(w);
        true
    }

    /// The WRITE starting at `first` was committed as far as its first packet:
    /// it is the message in progress now.
    pub fn drop_write(&mut self, first: Psn) {
        self.writes.retain(|w| w.first != first);
    }

    /// What is held now, and the memory it takes.
    pub fn usage(&self) -> HeldAhead {
        HeldAhead {
            packets: self.count,
            writes: self.writes.len() as u32,
            messages: self.messages.len() as u32,
            bytes: self.slots.capacity() * core::mem::size_of::<Option<Held>>()
                + self.writes.capacity() * core::mem::size_of::<AheadWrite>()
                + self.messages.capacity() * core::mem::size_of::<AheadMessage>(),
        }
    }

    /// Forgets every packet held (the QP left RTS or reset its PSNs).
    pub fn clear(&mut self) {
        for s in &mut self.slots {
            *s = None;
        }
        self.writes.clear();
        self.messages.clear();
        self.count = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offers_carry_the_index_in_the_message() {
        assert_eq!(offer(0), 1);
        assert_eq!(offered_index(1), Some(0));
        assert_eq!(offered_index(offer(125)), Some(125));
        assert_eq!(offered_index(offer(126)), None);
        assert_eq!(offered_index(offer(5000)), None);
        assert_eq!(offered_index(0), None);
        assert_eq!(offer(5000), 127);
    }

    #[test]
    fn scoreboard_tracks_held_psns_from_una() {
        let mut s = Scoreboard {
            peer: Peer::Selective,
            ..Scoreboard::default()
        };
        let una = Psn::new(0xff_fff0);
        s.set_held(una.add(3));
        s.set_held(una.add(255));
        assert!(s.holds(una, una.add(3)));
        assert!(s.holds(una, una.add(255)));
        assert!(!s.holds(una, una.add(4)));
        assert!(!s.holds(una, una.add(256 + 3)), "beyond the window");
        s.acked(una, una.add(4));
        assert!(!s.holds(una.add(4), una.add(4 + 255)), "its bit was freed");
        assert!(s.holds(una.add(4), una.add(255)));
        assert_eq!(s.count, 1, "one held bit left");
        s.set_held(una.add(255));
        assert_eq!(s.count, 1, "set twice, counted once");
        s.acked(una.add(4), una.add(4 + WINDOW));
        assert_eq!(s.count, 0);
        assert!(
            !s.has(una.add(255)),
            "acknowledged past the window: all cleared"
        );
        s.set_held(una.add(300));
        s.peer = Peer::Plain;
        assert!(!s.holds(una.add(4), una.add(255)));
    }

    #[test]
    fn a_message_ends_two_psns_before_the_next_one_starts() {
        let epsn = Psn::new(100);
        // Message at 100: its packet 104 arrived (not its last), 105 was lost; a
        // message starts at 106.
        let mut r = Reorder::default();
        r.activate();
        r.note_message(epsn, None, Psn::new(104), Psn::new(100), None, Some(true));
        assert_eq!(r.message(Psn::new(100)).unwrap().last, None);
        r.note_message(epsn, None, Psn::new(106), Psn::new(106), None, Some(true));
        assert_eq!(r.message(Psn::new(100)).unwrap().last, Some(Psn::new(105)));
        // The same in the other order: the next message's first packet first.
        let mut r = Reorder::default();
        r.activate();
        r.note_message(epsn, None, Psn::new(106), Psn::new(106), None, Some(true));
        r.note_message(epsn, None, Psn::new(104), Psn::new(100), None, Some(true));
        assert_eq!(r.message(Psn::new(100)).unwrap().last, Some(Psn::new(105)));
        // Two PSNs missing before it: nothing is inferred (a whole message may
        // be between).
        let mut r = Reorder::default();
        r.activate();
        r.note_message(epsn, None, Psn::new(103), Psn::new(100), None, Some(true));
        r.note_message(epsn, None, Psn::new(106), Psn::new(106), None, Some(true));
        assert_eq!(r.message(Psn::new(100)).unwrap().last, None);
    }

    #[test]
    fn messages_the_expected_psn_passed_make_room_whether_their_end_was_seen_or_not() {
        let mut r = Reorder::default();
        r.activate();
        // A long stream: messages of 4 PSNs, a middle packet of each seen ahead,
        // never its last.
        for m in 0..AHEAD_MESSAGES as u32 {
            let first = Psn::new(4 * m);
            r.note_message(first, None, first.add(1), first, None, Some(true));
        }
        // Much later, with the message at 1000 in progress.
        let epsn = Psn::new(1002);
        let in_progress = Some(Psn::new(1000));
        r.note_message(
            epsn,
            in_progress,
            Psn::new(1001),
            Psn::new(1000),
            None,
            Some(true),
        );
        r.note_message(
            epsn,
            in_progress,
            Psn::new(1005),
            Psn::new(1004),
            None,
            Some(true),
        );
        assert!(r.message(Psn::new(1004)).is_some(), "room was made");
        assert!(r.message(Psn::new(1000)).is_some(), "in progress: kept");
        assert!(r.message(Psn::new(0)).is_none());
    }
}
