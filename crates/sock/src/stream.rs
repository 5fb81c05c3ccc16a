//! One rsocket stream connection's accounting, sans-IO (CM reference §5.3, §5.4).
//!
//! The driver owns the QP, the CQ and three registered regions: the receive ring (`rbuf`,
//! remote-writable), the target area (remote-writable: two grant slots of 16 bytes, then the
//! iomap slots of 24 bytes) and the send ring (`sbuf`). The core decides what to post and
//! where; the driver posts it with the `wr_id` the core gave, and reports completions back:
//!
//! * [`StreamCore::start_data`] → one RDMA WRITE WITH IMM of stream data (or, coalescing,
//!   a plain RDMA WRITE that [`StreamCore::poll_announcement`] or a later write announces);
//! * [`StreamCore::poll_ctrl`] → credit grants, shutdown/disconnect, keep-alives;
//! * [`StreamCore::poll_iomap`] / [`StreamCore::start_riowrite`] → riomap publication and
//!   riowrite;
//! * [`StreamCore::handle_send_completion`] / [`StreamCore::handle_recv`] → completions;
//! * [`StreamCore::recv_chunk`] / [`StreamCore::consume`] → where received bytes are.
//!
//! Every quantity a peer controls (message lengths, grant counts, slot indexes) is checked
//! before it moves an offset, so a hostile or broken peer ends the connection with a
//! [`ProtocolError`] instead of making the driver read outside its ring.

use crate::conn_data::{ConnData, PlacedWordAd, CONN_FLAG_IOMAP};
use crate::msg::{Ctrl, Msg, MAX_DATA_LEN};
use crate::sge::{IomapEntry, RsSge, SgeOrder, IOMAP_ENTRY_LEN, RS_SGE_LEN};
use std::collections::VecDeque;
use std::time::Duration;

/// Grant slots in the target SGL array (`RS_SGL_SIZE`).
pub const SGL_SLOTS: usize = 2;
/// Send queue entries kept for control messages; at most this many are outstanding
/// (`RS_QP_CTRL_SIZE`).
pub const CTRL_SLOTS: u32 = 4;
/// A data write starts only with this much send ring free (`RS_SNDLOWAT`).
pub const SNDLOWAT: u32 = 2048;
/// The largest data write (`RS_MAX_TRANSFER`); one call's writes start at 2048 bytes and
/// double up to it (`RS_OLAP_START_SIZE`).
pub const MAX_TRANSFER: u32 = 65536;
const OLAP_START: u32 = 2048;
/// Bytes of the target area before the iomap slots (the two grant slots).
pub const TARGET_AREA_HEAD: usize = SGL_SLOTS * RS_SGE_LEN;
/// Bytes of the "bytes placed" word after the iomap slots ([`StreamCore::set_placed_word`]):
/// the writer's cumulative count, then its [`placed_word_check`] written after it (native
/// order; same host).
pub const PLACED_WORD_LEN: usize = 16;

/// The second half of the "bytes placed" word: a mix of the count (a bijection in which
/// every output bit depends on every input bit: the SplitMix64 finalizer's constants, of a
/// salted count so that the zeroed word is no valid pair). The kernel's copy may store an
/// 8-byte value in any order, so a reader may find either half torn, or the count of one
/// write beside the check of another; because the check is written after the count and
/// read before it, a pair whose check matches its count is a count that was wholly
/// written, with its bytes before it (a torn or mismatched pair matches only by a
/// 2^-64 accident), where two plain copies of the count could be torn alike.
pub fn placed_word_check(count: u64) -> u64 {
    let mut x = count ^ 0x5356_7077_6f72_6421; // "SVpword!"
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The word's count as a reader found it (the check read first, then the count, each
/// followed by an Acquire fence), or `None` when the halves do not match (a write in
/// progress: the next look sees it whole).
pub fn placed_word_count(count: u64, check: u64) -> Option<u64> {
    (placed_word_check(count) == check).then_some(count)
}

const QP_MIN: u16 = 16;
const QP_MAX: u16 = 0xFFFE;
const RECV_FLAG: u64 = 1 << 63;

/// Sizes of one connection (rsocket.c's defaults, 384-entry queues, 64 bytes inline, no
/// iomap, but 4 MiB rings where rsocket.c has 128 KiB: see [`DEFAULT_RING`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Send queue entries (4 of them are kept for control messages).
    pub sq_size: u16,
    /// Receive queue entries: the credits this side grants.
    pub rq_size: u16,
    /// Receive ring bytes (granted to the peer a half at a time).
    pub rbuf_size: u32,
    /// Send ring bytes.
    pub sbuf_size: u32,
    /// Data writes up to this size are posted inline (no send ring copy).
    pub inline_size: u32,
    /// iomap slots this side offers the peer.
    pub iomap_size: u16,
}

/// The default ring size. rsocket.c's 128 KiB suits an RNIC, where a grant's round trip
/// costs a few microseconds; here it costs a wake-up of each process, and a sender that
/// may run at most one ring ahead of its reader waits for it every half ring (measured
/// with iperf3 through librspreload on loopback: 1 MiB rings move about 3-4 times what
/// 128 KiB ones do; `softverbs rstream` on a loaded 2-core host, 4 MiB rings about 1.4-2
/// times what 1 MiB ones do, docs/sockets.md, session 12). Linux TCP grows a bulk
/// connection's buffers to as much (`tcp_rmem`'s 6 MiB, `tcp_wmem`'s 4 MiB). A ring is
/// ordinary memory, touched only as far as data reaches; `SO_SNDBUF`/`SO_RCVBUF` (or
/// [`Config`]) still choose any size.
pub const DEFAULT_RING: u32 = 4 << 20;

impl Default for Config {
    fn default() -> Self {
        Config {
            sq_size: 384,
            rq_size: 384,
            rbuf_size: DEFAULT_RING,
            sbuf_size: DEFAULT_RING,
            inline_size: 64,
            iomap_size: 0,
        }
    }
}

/// Why a [`Config`] cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The receive ring must hold two halves of at least one byte, and even.
    #[error("receive ring of {0} bytes: it must be even and at least 2")]
    RecvRing(u32),
    /// The send ring must hold at least one low-water mark.
    #[error("send ring of {0} bytes: at least {SNDLOWAT} needed")]
    SendRing(u32),
}

impl Config {
    /// Queue sizes clamped to what rsocket.c allows ([16, 0xFFFE]; the send queue must also
    /// leave entries after the control slots), the rings checked.
    pub fn normalized(mut self) -> Result<Config, ConfigError> {
        self.sq_size = self.sq_size.clamp(QP_MIN, QP_MAX);
        self.rq_size = self.rq_size.clamp(QP_MIN, QP_MAX);
        if self.rbuf_size < 2 || self.rbuf_size % 2 != 0 {
            return Err(ConfigError::RecvRing(self.rbuf_size));
        }
        if self.sbuf_size < SNDLOWAT {
            return Err(ConfigError::SendRing(self.sbuf_size));
        }
        Ok(self)
    }

    /// Bytes of the target area (grant slots and iomap slots).
    pub fn target_area_len(&self) -> usize {
        TARGET_AREA_HEAD + usize::from(self.iomap_size) * IOMAP_ENTRY_LEN
    }

    /// Where the "bytes placed" word is in a target area registered with
    /// [`PLACED_WORD_LEN`] bytes more than [`Self::target_area_len`] (8-byte aligned when
    /// the area is: the slots are 16 and 24 bytes).
    pub fn placed_word_offset(&self) -> usize {
        self.target_area_len()
    }
}

/// Where this side's remote-writable regions are (the driver registered them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalRegions {
    /// Address of the receive ring.
    pub rbuf_addr: u64,
    /// Its rkey.
    pub rbuf_rkey: u32,
    /// Address of the target area.
    pub target_addr: u64,
    /// Its rkey.
    pub target_rkey: u32,
}

/// The kind of a send work request, encoded in its `wr_id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WrKind {
    /// Stream data of this many bytes.
    Data(u32),
    /// riowrite data of this many bytes.
    RioWrite(u32),
    /// An iomap entry publication.
    Iomap,
    /// A control slot message (credits, shutdown, disconnect, keep-alive).
    Ctrl(Msg),
    /// Stream data of this many bytes placed by a plain RDMA WRITE, announced later
    /// (see [`StreamCore::set_coalescing`]).
    HeldData(u32),
    /// The WRITE WITH IMM that announces held data (it rewrites their last byte).
    Announce,
}

impl WrKind {
    fn to_wr_id(self) -> u64 {
        let (tag, value) = match self {
            WrKind::Data(n) => (0u64, n),
            WrKind::RioWrite(n) => (1, n),
            WrKind::Iomap => (2, 0),
            WrKind::Ctrl(m) => (3, m.to_imm()),
            WrKind::HeldData(n) => (4, n),
            WrKind::Announce => (5, 0),
        };
        (tag << 32) | u64::from(value)
    }

    fn from_wr_id(wr_id: u64) -> Option<WrKind> {
        let value = wr_id as u32;
        Some(match wr_id >> 32 {
            0 => WrKind::Data(value),
            1 => WrKind::RioWrite(value),
            2 => WrKind::Iomap,
            3 => WrKind::Ctrl(Msg::from_imm(value)),
            4 => WrKind::HeldData(value),
            5 => WrKind::Announce,
            _ => return None,
        })
    }
}

/// Where the bytes of a data write come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendStage {
    /// Posted inline straight from the caller's buffer.
    Inline,
    /// Copied into the send ring: `len` bytes at `offset`, then (when the ring wraps) the
    /// rest at offset 0.
    Ring {
        /// Send ring offset of the first piece.
        offset: u32,
        /// Bytes of the first piece.
        first: u32,
        /// Bytes of the second piece, at ring offset 0 (0: none).
        second: u32,
    },
}

/// An RDMA write (with immediate when `imm` is set) to post.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataWrite {
    /// The work request id.
    pub wr_id: u64,
    /// Bytes to write.
    pub len: u32,
    /// Remote address.
    pub remote_addr: u64,
    /// Remote key.
    pub rkey: u32,
    /// Immediate value (`None`: a plain RDMA WRITE, riowrite).
    pub imm: Option<u32>,
    /// Where the bytes come from.
    pub stage: SendStage,
}

/// A control-slot write to post: RDMA WRITE WITH IMM (or a plain 0-length RDMA WRITE for a
/// keep-alive) of `payload` (empty or an in-band descriptor), posted inline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CtrlWrite {
    /// The work request id.
    pub wr_id: u64,
    /// Remote address (0 for 0-length messages).
    pub remote_addr: u64,
    /// Remote key (0 for 0-length messages).
    pub rkey: u32,
    /// Immediate value; `None` for a keep-alive (plain write).
    pub imm: Option<u32>,
    /// Bytes to write (0, 16 or 24).
    pub payload: Vec<u8>,
}

/// Received bytes, contiguous in the receive ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvChunk {
    /// Offset in the receive ring.
    pub offset: u32,
    /// Bytes available there.
    pub len: u32,
}

/// Which directions `shutdown` ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shutdown {
    /// No more reading.
    Read,
    /// No more writing (the peer reads EOF).
    Write,
    /// Both.
    Both,
}

/// A peer broke the protocol, or the transport failed; the connection is over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// A data message larger than the buffer room granted to the peer.
    #[error("the peer wrote {len} bytes with only {room} granted")]
    DataBeyondGrant {
        /// The message's length.
        len: u32,
        /// Room it had.
        room: u64,
    },
    /// More data messages outstanding than receive credits granted.
    #[error("the peer sent more messages than it had credits for")]
    TooManyMessages,
    /// A message arrived without immediate data (SEND-based messaging is iWARP's mode,
    /// not spoken here).
    #[error("a message without immediate data (SEND-based rsockets are not supported)")]
    NoImmediate,
    /// An iomap slot index beyond the slots offered.
    #[error("iomap slot {0} is beyond the slots offered")]
    IomapIndex(u32),
    /// The driver passed a target area shorter than the configuration's.
    #[error("the target area given is too short")]
    TargetArea,
    /// A work request completed in error (EIO).
    #[error("a work request completed in error")]
    Transport,
    /// A completion with a work request id this core never issued.
    #[error("unknown work request id {0:#x}")]
    UnknownWr(u64),
}

/// Splits one send call into writes: 2048 bytes first, doubling up to [`MAX_TRANSFER`].
#[derive(Debug, Clone, Copy)]
pub struct SendChunks {
    olen: u32,
}

impl Default for SendChunks {
    fn default() -> Self {
        SendChunks { olen: OLAP_START }
    }
}

impl SendChunks {
    /// The size to ask for next with `left` bytes still to send.
    pub fn next(&mut self, left: usize) -> u32 {
        if (self.olen as usize) < left {
            let n = self.olen;
            if self.olen < MAX_TRANSFER {
                self.olen <<= 1;
            }
            n
        } else {
            left as u32
        }
    }
}

/// One connection's protocol state.
#[derive(Debug)]
pub struct StreamCore {
    cfg: Config,
    local: LocalRegions,
    peer_order: SgeOrder,
    // Where grants to the peer go (its target SGL array) and its iomap array.
    remote_sgl: RsSge,
    remote_iomap: Option<RsSge>,
    // Grants from the peer: where our data goes.
    target_sgl: [RsSge; SGL_SLOTS],
    target_sge: usize,
    next_grant_in: usize,
    // Our next grant slot at the peer.
    remote_sge: usize,
    sseq_no: u16,
    sseq_comp: u16,
    rseq_no: u16,
    rseq_comp: u16,
    ctrl_seqno: u32,
    ctrl_max_seqno: u32,
    sqe_avail: u32,
    sbuf_bytes_avail: u32,
    sbuf_head: u32,
    rbuf_offset: u32,
    rbuf_free_offset: u32,
    rbuf_bytes_avail: u32,
    rmsg: VecDeque<u32>,
    pending_bytes: u64,
    pending_ctrl: Option<Ctrl>,
    connected: bool,
    readable: bool,
    writable: bool,
    error: Option<ProtocolError>,
    // riomap: the peer's published regions (our iomap array), ours waiting to be sent.
    peer_iomap: Vec<Option<IomapEntry>>,
    iomap_queue: VecDeque<(u32, IomapEntry)>,
    keepalive: Option<(Duration, Duration)>,
    // Notification coalescing (`set_coalescing`): data WRITE WITH IMMs posted and not
    // completed (the announcement counted from its reservation), bytes placed by plain
    // WRITEs and not announced yet, and where the last of them went.
    coalescing: bool,
    imm_in_flight: u32,
    announce_reserved: bool,
    held: u32,
    held_tail: Option<(u64, u32, u8)>,
    // Early grants (`set_early_grants`): the peer's first receive half (a grant is one of
    // its two halves), how many grants were taken from the target area before their SGL
    // message arrived, and the slot a message's grant was just read from (to clear).
    early_grants: bool,
    peer_buf: RsSge,
    grants_taken_early: u32,
    slot_to_clear: Option<usize>,
    // The "bytes placed" word (`set_placed_word`). Writer: where the peer's word is, and
    // the data bytes of every write started. Reader: whether this side offered one, the
    // bytes of every DATA message received, of those read before their message arrived
    // and not yet matched by one (only while no message is queued), the word's value as
    // last noted, and what the driver's counters have not taken yet.
    peer_word: Option<PlacedWordAd>,
    data_sent: u64,
    word_offered: bool,
    announced: u64,
    ahead: u64,
    placed: u64,
    ahead_stats: AheadStats,
}

/// What the "bytes placed" word told a reader since the last
/// [`StreamCore::take_ahead_stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AheadStats {
    /// Bytes read before their DATA message arrived.
    pub bytes: u64,
    /// DATA messages every byte of which was read before they arrived.
    pub whole_messages: u64,
    /// DATA messages that arrived with bytes still to read (learned from the message).
    pub announced_messages: u64,
}

/// Held bytes to announce: one WRITE WITH IMM (op DATA, `imm`) that writes `byte` again at
/// `remote_addr` (the last byte held, already there: [`StreamCore::note_held_tail_byte`]),
/// posted inline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Announcement {
    /// The work request id.
    pub wr_id: u64,
    /// Where the last held byte went.
    pub remote_addr: u64,
    /// Its remote key.
    pub rkey: u32,
    /// The immediate value: DATA of every held byte.
    pub imm: u32,
    /// The byte to write.
    pub byte: u8,
}

impl StreamCore {
    /// A connection's core before the peer's data is known; `cfg` must be normalized.
    pub fn new(cfg: Config, local: LocalRegions) -> StreamCore {
        StreamCore {
            cfg,
            local,
            peer_order: SgeOrder::Little,
            remote_sgl: RsSge::default(),
            remote_iomap: None,
            target_sgl: [RsSge::default(); SGL_SLOTS],
            target_sge: 0,
            next_grant_in: 1,
            remote_sge: 1,
            sseq_no: 0,
            sseq_comp: 0,
            rseq_no: 0,
            rseq_comp: cfg.rq_size >> 1,
            ctrl_seqno: 0,
            ctrl_max_seqno: CTRL_SLOTS,
            sqe_avail: u32::from(cfg.sq_size) - CTRL_SLOTS,
            sbuf_bytes_avail: cfg.sbuf_size,
            sbuf_head: 0,
            rbuf_offset: 0,
            rbuf_free_offset: cfg.rbuf_size >> 1,
            rbuf_bytes_avail: cfg.rbuf_size >> 1,
            rmsg: VecDeque::new(),
            pending_bytes: 0,
            pending_ctrl: None,
            connected: false,
            readable: false,
            writable: false,
            error: None,
            peer_iomap: vec![None; usize::from(cfg.iomap_size)],
            iomap_queue: VecDeque::new(),
            keepalive: None,
            coalescing: false,
            imm_in_flight: 0,
            announce_reserved: false,
            held: 0,
            held_tail: None,
            early_grants: false,
            peer_buf: RsSge::default(),
            grants_taken_early: 0,
            slot_to_clear: None,
            peer_word: None,
            data_sent: 0,
            word_offered: false,
            announced: 0,
            ahead: 0,
            placed: 0,
            ahead_stats: AheadStats::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// What this side advertises in its REQ or REP (`rs_format_conn_data`): a little-endian
    /// host (no NET flag), the iomap flag, credits = receive queue size, the first receive
    /// half as the peer's first target.
    pub fn conn_data(&self) -> ConnData {
        let net = if cfg!(target_endian = "big") {
            crate::conn_data::CONN_FLAG_NET
        } else {
            0
        };
        ConnData {
            flags: CONN_FLAG_IOMAP | net,
            credits: self.cfg.rq_size,
            target_iomap_size: self.cfg.iomap_size,
            target_sgl: RsSge {
                addr: self.local.target_addr,
                key: self.local.target_rkey,
                length: SGL_SLOTS as u32,
            },
            data_buf: RsSge {
                addr: self.local.rbuf_addr,
                key: self.local.rbuf_rkey,
                length: self.cfg.rbuf_size >> 1,
            },
        }
    }

    /// The connection is up, with the peer's connection data (`rs_save_conn_data`).
    pub fn handle_connected(&mut self, peer: &ConnData) {
        self.peer_order = SgeOrder::of_peer(peer.is_big_endian());
        self.remote_sgl = peer.target_sgl;
        self.remote_sge = 1;
        self.remote_iomap = peer.has_iomap().then(|| RsSge {
            addr: peer.target_sgl.addr.wrapping_add(TARGET_AREA_HEAD as u64),
            key: peer.target_sgl.key,
            length: u32::from(peer.target_iomap_size),
        });
        self.target_sgl = [peer.data_buf, RsSge::default()];
        self.peer_buf = peer.data_buf;
        self.target_sge = 0;
        self.next_grant_in = 1;
        self.sseq_comp = peer.credits;
        self.connected = true;
        self.readable = true;
        self.writable = true;
    }

    /// The connection manager reported the connection gone (DISCONNECTED, a DREQ).
    pub fn handle_disconnected(&mut self) {
        self.set_disconnected();
    }

    fn set_disconnected(&mut self) {
        self.connected = false;
        self.readable = false;
        self.writable = false;
    }

    fn fail(&mut self, e: ProtocolError) -> ProtocolError {
        if self.error.is_none() {
            self.error = Some(e);
        }
        self.set_disconnected();
        e
    }

    /// Connected (no disconnect sent or received, no error).
    pub fn is_connected(&self) -> bool {
        self.connected
    }

    /// Data may still arrive (no EOF yet).
    pub fn is_readable(&self) -> bool {
        self.readable
    }

    /// This side may still send.
    pub fn is_writable(&self) -> bool {
        self.writable
    }

    /// The error that ended the connection, if one did.
    pub fn error(&self) -> Option<ProtocolError> {
        self.error
    }

    /// Received bytes not yet consumed (announced, or placed as the word says).
    pub fn available(&self) -> u64 {
        self.pending_bytes + self.ahead_available()
    }

    /// A read would not block: data is there, or the stream is at EOF (`rs_conn_have_rdata`).
    pub fn read_ready(&self) -> bool {
        !self.rmsg.is_empty() || !self.readable || self.ahead_available() > 0
    }

    /// A data write can start now (`rs_can_send`): a send queue entry, the low-water mark
    /// of send ring, a credit, and room in the current grant.
    pub fn can_send(&self) -> bool {
        self.writable
            && self.sqe_avail > 0
            && self.sbuf_bytes_avail >= SNDLOWAT
            && self.sseq_no != self.sseq_comp
            && self.target_sgl[self.target_sge].length != 0
    }

    /// A write would not block: it can start, or the stream is no longer writable (the write
    /// then fails at once) (`rs_conn_can_send`).
    pub fn write_ready(&self) -> bool {
        self.can_send() || !self.writable
    }

    /// Every posted send has completed (or the connection is gone)
    /// (`rs_conn_all_sends_done`).
    pub fn all_sends_done(&self) -> bool {
        (self.ctrl_max_seqno - self.ctrl_seqno) + self.sqe_avail == u32::from(self.cfg.sq_size)
            || !self.connected
    }

    /// Posted work requests not yet completed.
    pub fn outstanding_sends(&self) -> u32 {
        u32::from(self.cfg.sq_size) - (self.ctrl_max_seqno - self.ctrl_seqno) - self.sqe_avail
    }

    fn ctrl_avail(&self) -> bool {
        self.ctrl_seqno != self.ctrl_max_seqno
    }

    /// Starts one data write of at most `want` bytes (see [`SendChunks`]; the immediate
    /// value describes at most [`MAX_DATA_LEN`]): `None` when none can start now
    /// ([`Self::can_send`] is false) or `want` is 0.
    ///
    /// With coalescing on ([`Self::set_coalescing`]) and a data WRITE WITH IMM still in
    /// flight, the write is a plain RDMA WRITE (`imm` `None`, [`WrKind::HeldData`]) whose
    /// bytes a later [`Self::poll_announcement`] announces; the first such write reserves
    /// the announcement's credit and send queue entry.
    pub fn start_data(&mut self, want: u32) -> Option<DataWrite> {
        if want == 0 || !self.can_send() {
            return None;
        }
        // Held bytes whose announcement is due (nothing announced in flight but its own
        // reservation): this write announces them with its own bytes, in its immediate,
        // where a separate announcement would cost a write and a datagram more.
        let merge = self.announce_reserved
            && self.imm_in_flight == 1
            && u64::from(self.held) + u64::from(want.min(MAX_DATA_LEN)) <= u64::from(MAX_DATA_LEN);
        // (A first held write needs a second entry, for its announcement; without one it
        // goes announced, as nothing is held yet.)
        let hold = !merge
            && self.coalescing
            && self.imm_in_flight > 0
            && (self.announce_reserved || self.sqe_avail >= 2);
        let target = &mut self.target_sgl[self.target_sge];
        let len = want
            .min(self.sbuf_bytes_avail)
            .min(target.length)
            .min(MAX_DATA_LEN);
        self.data_sent += u64::from(len);
        let (remote_addr, rkey) = (target.addr, target.key);
        target.addr = target.addr.wrapping_add(u64::from(len));
        target.length -= len;
        if target.length == 0 {
            self.target_sge = (self.target_sge + 1) % SGL_SLOTS;
        }
        self.sqe_avail -= 1;
        let stage = self.stage(len);
        if merge {
            // The reservation's credit, entry and count in flight are this write's.
            self.sqe_avail += 1;
            let total = self.held + len;
            self.held = 0;
            self.held_tail = None;
            self.announce_reserved = false;
            return Some(DataWrite {
                wr_id: WrKind::Data(len).to_wr_id(),
                len,
                remote_addr,
                rkey,
                imm: Some(Msg::Data(total).to_imm()),
                stage,
            });
        }
        if hold {
            if !self.announce_reserved {
                // The announcement's credit and entry, taken now so that it can always go.
                self.announce_reserved = true;
                self.sseq_no = self.sseq_no.wrapping_add(1);
                self.sqe_avail -= 1;
                self.imm_in_flight += 1;
            }
            self.held += len;
            let last = remote_addr.wrapping_add(u64::from(len) - 1);
            self.held_tail = Some((last, rkey, 0));
            return Some(DataWrite {
                wr_id: WrKind::HeldData(len).to_wr_id(),
                len,
                remote_addr,
                rkey,
                imm: None,
                stage,
            });
        }
        self.sseq_no = self.sseq_no.wrapping_add(1);
        self.imm_in_flight += 1;
        Some(DataWrite {
            wr_id: WrKind::Data(len).to_wr_id(),
            len,
            remote_addr,
            rkey,
            imm: Some(Msg::Data(len).to_imm()),
            stage,
        })
    }

    /// Notification coalescing, as Linux TCP's autocork: while a data WRITE WITH IMM is
    /// in flight, later data goes by plain RDMA WRITEs into the same grant and ONE later
    /// WRITE WITH IMM announces them all ([`Self::poll_announcement`]). A receiver takes
    /// a DATA message's length from its immediate and reads that many bytes on from its
    /// ring offset (rsocket.c's `rs_poll_cq` and `rrecv` never look at the completion's
    /// byte count), so the wire stays rsockets'. Worth it where a plain WRITE costs no
    /// packet (the same-host path); turning it off announces nothing held by itself.
    pub fn set_coalescing(&mut self, on: bool) {
        self.coalescing = on;
    }

    /// The length of the peer's receive half, the room one of its grants gives (its ring's
    /// half, from its connection data; 0 before connecting).
    pub fn peer_grant_len(&self) -> u32 {
        self.peer_buf.length
    }

    /// Bytes placed by plain writes and not announced yet.
    pub fn held_bytes(&self) -> u32 {
        self.held
    }

    /// The last byte of the latest held write (the announcement writes it again).
    pub fn note_held_tail_byte(&mut self, byte: u8) {
        if let Some(tail) = &mut self.held_tail {
            tail.2 = byte;
        }
    }

    /// The next data write would be held (coalescing on, a data WRITE WITH IMM in flight).
    pub fn would_hold(&self) -> bool {
        self.coalescing && self.imm_in_flight > 0
    }

    /// A held write reserved an announcement that is not posted yet.
    pub fn announcement_reserved(&self) -> bool {
        self.announce_reserved
    }

    /// The WRITE WITH IMM announcing the held bytes, when there are any and either `now`
    /// or every data WRITE WITH IMM posted before has completed. Its credit and send
    /// queue entry were reserved by the first held write; post it after every held write
    /// (their bytes must be in place before the peer sees its completion).
    pub fn poll_announcement(&mut self, now: bool) -> Option<Announcement> {
        if !self.announce_reserved || self.held == 0 {
            return None;
        }
        // The reservation itself counts one in `imm_in_flight`.
        if !now && self.imm_in_flight > 1 {
            return None;
        }
        let (remote_addr, rkey, byte) = self.held_tail?;
        let imm = Msg::Data(self.held).to_imm();
        self.held = 0;
        self.held_tail = None;
        self.announce_reserved = false;
        Some(Announcement {
            wr_id: WrKind::Announce.to_wr_id(),
            remote_addr,
            rkey,
            imm,
            byte,
        })
    }

    /// The data write `w` ([`Self::start_data`]) goes without its send ring bytes: the
    /// same-host path copies the caller's bytes straight into the peer's ring when it is
    /// posted, so they need no staging until its completion (which comes only with the
    /// peer's ACK: a writer whose ring bytes came back only then waited for ACKs, a
    /// datagram round trip through both processes, as well as for the reader's grants).
    /// Returns the `wr_id` to post it with instead (its completion then gives back no
    /// bytes); call right after `start_data`, before anything else is staged, and
    /// [`Self::restage`] if the write must go by packets after all.
    pub fn unstage(&mut self, w: &DataWrite) -> u64 {
        let SendStage::Ring { offset, .. } = w.stage else {
            return w.wr_id;
        };
        self.sbuf_bytes_avail += w.len;
        self.sbuf_head = offset;
        match WrKind::from_wr_id(w.wr_id) {
            Some(WrKind::Data(_)) => WrKind::Data(0).to_wr_id(),
            Some(WrKind::HeldData(_)) => WrKind::HeldData(0).to_wr_id(),
            Some(WrKind::RioWrite(_)) => WrKind::RioWrite(0).to_wr_id(),
            _ => w.wr_id,
        }
    }

    /// Undoes [`Self::unstage`]: `w` takes its send ring bytes again (its own `wr_id`).
    pub fn restage(&mut self, w: &DataWrite) {
        if let SendStage::Ring { .. } = w.stage {
            let _ = self.stage(w.len);
        }
    }

    /// Takes `len` bytes of send ring (or none when inline) and says where they are.
    fn stage(&mut self, len: u32) -> SendStage {
        self.sbuf_bytes_avail -= len;
        if len <= self.cfg.inline_size {
            return SendStage::Inline;
        }
        let offset = self.sbuf_head;
        let to_end = self.cfg.sbuf_size - offset;
        let first = len.min(to_end);
        let second = len - first;
        self.sbuf_head = if second > 0 {
            second
        } else {
            (offset + first) % self.cfg.sbuf_size
        };
        SendStage::Ring {
            offset,
            first,
            second,
        }
    }

    /// The next control-slot write, if one is due and a control slot is free: a pending
    /// shutdown/disconnect first, then a credit update (`rs_update_credits`).
    pub fn poll_ctrl(&mut self) -> Option<CtrlWrite> {
        if !self.connected || !self.ctrl_avail() {
            return None;
        }
        if let Some(ctrl) = self.pending_ctrl.take() {
            self.ctrl_seqno += 1;
            let msg = Msg::Ctrl(ctrl);
            return Some(CtrlWrite {
                wr_id: WrKind::Ctrl(msg).to_wr_id(),
                remote_addr: 0,
                rkey: 0,
                imm: Some(msg.to_imm()),
                payload: Vec::new(),
            });
        }
        let half = self.cfg.rbuf_size >> 1;
        let give = self.rbuf_bytes_avail >= half
            || (self.rseq_no.wrapping_sub(self.rseq_comp) as i16) >= 0;
        if !give {
            return None;
        }
        // rs_send_credits.
        self.ctrl_seqno += 1;
        self.rseq_comp = self.rseq_no.wrapping_add(self.cfg.rq_size >> 1);
        let limit = u32::from(self.rseq_no.wrapping_add(self.cfg.rq_size));
        let msg = Msg::Sgl(limit);
        if self.rbuf_bytes_avail >= half {
            let grant = RsSge {
                addr: self
                    .local
                    .rbuf_addr
                    .wrapping_add(u64::from(self.rbuf_free_offset)),
                key: self.local.rbuf_rkey,
                length: half,
            };
            let remote_addr = self
                .remote_sgl
                .addr
                .wrapping_add((self.remote_sge * RS_SGE_LEN) as u64);
            self.rbuf_bytes_avail -= half;
            self.rbuf_free_offset += half;
            if self.rbuf_free_offset >= self.cfg.rbuf_size {
                self.rbuf_free_offset = 0;
            }
            self.remote_sge = (self.remote_sge + 1) % SGL_SLOTS;
            Some(CtrlWrite {
                wr_id: WrKind::Ctrl(msg).to_wr_id(),
                remote_addr,
                rkey: self.remote_sgl.key,
                imm: Some(msg.to_imm()),
                payload: grant.to_bytes(self.peer_order).to_vec(),
            })
        } else {
            Some(CtrlWrite {
                wr_id: WrKind::Ctrl(msg).to_wr_id(),
                remote_addr: 0,
                rkey: 0,
                imm: Some(msg.to_imm()),
                payload: Vec::new(),
            })
        }
    }

    /// Ends one or both directions (`rshutdown`): queues the control message the peer must
    /// see (SHUTDOWN when this side still reads, else DISCONNECT); [`Self::poll_ctrl`] emits
    /// it.
    pub fn shutdown(&mut self, how: Shutdown) {
        let after = match how {
            Shutdown::Read => (false, self.writable),
            Shutdown::Write => (self.readable, false),
            Shutdown::Both => (false, false),
        };
        if !self.connected || after == (self.readable, self.writable) {
            // Already shut that way: nothing new to tell the peer.
            return;
        }
        let ctrl = match how {
            Shutdown::Both => {
                self.readable = false;
                self.writable = false;
                Ctrl::Disconnect
            }
            Shutdown::Write => {
                self.writable = false;
                if self.readable {
                    Ctrl::Shutdown
                } else {
                    Ctrl::Disconnect
                }
            }
            Shutdown::Read => {
                self.readable = false;
                if self.writable {
                    return;
                }
                Ctrl::Disconnect
            }
        };
        // A DISCONNECT supersedes a SHUTDOWN not yet sent.
        self.pending_ctrl = Some(match (self.pending_ctrl, ctrl) {
            (Some(Ctrl::Disconnect), _) => Ctrl::Disconnect,
            (_, c) => c,
        });
    }

    /// Turns keep-alives on (`Some(interval)`, from `now`) or off.
    pub fn set_keepalive(&mut self, interval: Option<Duration>, now: Duration) {
        self.keepalive = interval.map(|i| (i, now + i));
    }

    /// When the next keep-alive is due.
    pub fn next_keepalive(&self) -> Option<Duration> {
        self.keepalive.map(|(_, due)| due)
    }

    /// A keep-alive (a 0-length plain RDMA WRITE, which the peer never sees complete; its
    /// purpose is that the RC transport notices a dead peer) when one is due at `now` and a
    /// control slot is free.
    pub fn poll_keepalive(&mut self, now: Duration) -> Option<CtrlWrite> {
        let (interval, due) = self.keepalive?;
        if now < due || !self.connected || !self.ctrl_avail() {
            return None;
        }
        self.keepalive = Some((interval, now + interval));
        self.ctrl_seqno += 1;
        Some(CtrlWrite {
            wr_id: WrKind::Ctrl(Msg::Ctrl(Ctrl::Keepalive)).to_wr_id(),
            remote_addr: 0,
            rkey: 0,
            imm: None,
            payload: Vec::new(),
        })
    }

    /// A send work request completed (`ok`: successfully).
    pub fn handle_send_completion(&mut self, wr_id: u64, ok: bool) -> Result<(), ProtocolError> {
        let kind = WrKind::from_wr_id(wr_id).ok_or(ProtocolError::UnknownWr(wr_id))?;
        match kind {
            WrKind::Ctrl(msg) => {
                self.ctrl_max_seqno += 1;
                if msg == Msg::Ctrl(Ctrl::Disconnect) {
                    self.set_disconnected();
                }
            }
            WrKind::Iomap => {
                self.sqe_avail += 1;
                self.sbuf_bytes_avail += IOMAP_ENTRY_LEN as u32;
            }
            WrKind::Data(n) => {
                self.sqe_avail += 1;
                self.sbuf_bytes_avail += n;
                self.imm_in_flight = self.imm_in_flight.saturating_sub(1);
            }
            WrKind::HeldData(n) | WrKind::RioWrite(n) => {
                self.sqe_avail += 1;
                self.sbuf_bytes_avail += n;
            }
            WrKind::Announce => {
                self.sqe_avail += 1;
                self.imm_in_flight = self.imm_in_flight.saturating_sub(1);
            }
        }
        if !ok && self.connected {
            return Err(self.fail(ProtocolError::Transport));
        }
        Ok(())
    }

    /// The `wr_id` to post receives with (receives take no buffer: every message is an RDMA
    /// WRITE WITH IMM, which only consumes the entry).
    pub fn recv_wr_id(&self) -> u64 {
        RECV_FLAG
    }

    /// Whether a completion's `wr_id` is a receive's.
    pub fn is_recv_wr_id(wr_id: u64) -> bool {
        wr_id & RECV_FLAG != 0
    }

    /// A receive completed successfully with `imm` (`None` when the message carried none)
    /// and `byte_len` bytes written. `target_area` is the current content of this side's
    /// target area ([`Config::target_area_len`] bytes); it is read only for buffer grants
    /// and iomap entries, so it may be empty for other messages. The driver reposts a
    /// receive for each completion while [`Self::is_connected`].
    pub fn handle_recv(
        &mut self,
        imm: Option<u32>,
        byte_len: u32,
        target_area: &[u8],
    ) -> Result<(), ProtocolError> {
        let Some(imm) = imm else {
            return Err(self.fail(ProtocolError::NoImmediate));
        };
        match Msg::from_imm(imm) {
            Msg::Sgl(limit) => {
                if byte_len as usize >= RS_SGE_LEN && self.grants_taken_early > 0 {
                    // Its grant was taken from the target area already (and its slot
                    // cleared; it may hold the next grant by now).
                    self.grants_taken_early -= 1;
                } else if byte_len as usize >= RS_SGE_LEN {
                    let at = self.next_grant_in * RS_SGE_LEN;
                    let Some(grant) = target_area.get(at..at + RS_SGE_LEN).and_then(|b| {
                        RsSge::read(b, SgeOrder::of_peer(cfg!(target_endian = "big")))
                    }) else {
                        return Err(self.fail(ProtocolError::TargetArea));
                    };
                    self.target_sgl[self.next_grant_in] = grant;
                    if self.early_grants {
                        self.slot_to_clear = Some(at);
                    }
                    self.next_grant_in = (self.next_grant_in + 1) % SGL_SLOTS;
                }
                self.sseq_comp = limit as u16;
            }
            Msg::IomapSgl(index) => {
                if index >= u32::from(self.cfg.iomap_size) {
                    return Err(self.fail(ProtocolError::IomapIndex(index)));
                }
                let at = TARGET_AREA_HEAD + index as usize * IOMAP_ENTRY_LEN;
                let Some(entry) = target_area.get(at..).and_then(|b| {
                    IomapEntry::read(b, SgeOrder::of_peer(cfg!(target_endian = "big")))
                }) else {
                    return Err(self.fail(ProtocolError::TargetArea));
                };
                self.peer_iomap[index as usize] = Some(entry);
            }
            Msg::Ctrl(Ctrl::Disconnect) => self.set_disconnected(),
            Msg::Ctrl(Ctrl::Shutdown) => {
                if self.writable {
                    self.readable = false;
                } else {
                    self.set_disconnected();
                }
            }
            Msg::Ctrl(_) | Msg::Write(_) => {}
            Msg::Data(len) => {
                // Bytes read ahead of their message (the "bytes placed" word) are its
                // first bytes: their room was given back when they were read.
                let ahead = self.ahead.min(u64::from(len)) as u32;
                let rest = len - ahead;
                // The peer may only fill what was granted and not yet read back.
                let granted = u64::from(self.cfg.rbuf_size - self.rbuf_bytes_avail);
                let room = granted - self.pending_bytes.min(granted);
                if u64::from(rest) > room {
                    return Err(self.fail(ProtocolError::DataBeyondGrant { len, room }));
                }
                if rest > 0 && self.rmsg.len() >= usize::from(self.cfg.rq_size) {
                    return Err(self.fail(ProtocolError::TooManyMessages));
                }
                self.announced += u64::from(len);
                self.ahead -= u64::from(ahead);
                if rest == 0 {
                    // Nothing (more) to read: account it as read at once, its credit
                    // with it.
                    if len > 0 {
                        self.ahead_stats.whole_messages += 1;
                    }
                    self.rseq_no = self.rseq_no.wrapping_add(1);
                    return Ok(());
                }
                if self.word_offered {
                    self.ahead_stats.announced_messages += 1;
                }
                self.rmsg.push_back(rest);
                self.pending_bytes += u64::from(rest);
            }
        }
        Ok(())
    }

    /// Early grants: the reader writes a buffer grant into this side's target area
    /// (an RDMA WRITE WITH IMM of the SGE, `rs_send_credits`) before its message can
    /// complete here; on the same-host path the bytes are in place a datagram's
    /// delivery and a wake-up earlier. With this on, a writer waiting for room may take
    /// the grant from the area as soon as it is there ([`Self::awaited_grant_slot`],
    /// [`Self::take_grant_from_area`]); its SGL message, when it arrives, then only
    /// updates the credits. Every slot a grant was taken from is cleared by the driver
    /// ([`Self::take_slot_to_clear`]), so a slot holds either nothing or a grant not
    /// taken yet: the reader writes the slot again only for the grant after next, which
    /// it can give only once the writer used the one taken. Nothing changes on the wire.
    pub fn set_early_grants(&mut self, on: bool) {
        self.early_grants = on;
    }

    /// [`Self::set_early_grants`] is on.
    pub fn early_grants_on(&self) -> bool {
        self.early_grants
    }

    /// Where in the target area the next grant will be written (its slot's offset), when
    /// early grants are on and the connection is up.
    pub fn awaited_grant_slot(&self) -> Option<usize> {
        (self.early_grants && self.connected).then_some(self.next_grant_in * RS_SGE_LEN)
    }

    /// Takes the grant in `slot` (the [`RS_SGE_LEN`] bytes of the target area at
    /// [`Self::awaited_grant_slot`]) when it is one: a whole receive half of the peer's,
    /// with the peer's key (what `rs_send_credits` grants; a torn or empty slot never
    /// matches). `true` when taken: the driver clears the slot.
    pub fn take_grant_from_area(&mut self, slot: &[u8]) -> bool {
        if !self.early_grants || !self.connected {
            return false;
        }
        let Some(grant) = RsSge::read(slot, SgeOrder::of_peer(cfg!(target_endian = "big"))) else {
            return false;
        };
        let base = self.peer_buf.addr;
        let half = self.peer_buf.length;
        let whole_half = grant.key == self.peer_buf.key
            && grant.length == half
            && half != 0
            && (grant.addr == base || grant.addr == base.wrapping_add(u64::from(half)));
        if !whole_half {
            return false;
        }
        self.target_sgl[self.next_grant_in] = grant;
        self.next_grant_in = (self.next_grant_in + 1) % SGL_SLOTS;
        self.grants_taken_early += 1;
        true
    }

    /// The target area offset of a slot whose grant a message just delivered, to clear
    /// (early grants only).
    pub fn take_slot_to_clear(&mut self) -> Option<usize> {
        self.slot_to_clear.take()
    }

    /// A receive completed in error: the queue was flushed (the QP left RTS). Nothing is
    /// lost that was not already the peer's to resend; the connection is over.
    pub fn handle_recv_flush(&mut self) {
        self.set_disconnected();
    }

    /// Where the next received bytes are (contiguous, up to the end of the ring): the
    /// first queued message's, else bytes the "bytes placed" word says are there.
    pub fn recv_chunk(&self) -> Option<RecvChunk> {
        let head = match self.rmsg.front() {
            Some(&len) => len,
            None => u32::try_from(self.ahead_available()).unwrap_or(u32::MAX),
        };
        if head == 0 {
            return None;
        }
        let to_end = self.cfg.rbuf_size - self.rbuf_offset;
        Some(RecvChunk {
            offset: self.rbuf_offset,
            len: head.min(to_end),
        })
    }

    /// The "bytes placed" word, reader's side: this side offered a word (its target area
    /// holds [`PLACED_WORD_LEN`] bytes more, at [`Config::placed_word_offset`], and the
    /// peer was told where: [`PlacedWordAd`]), so the driver may pass its value to
    /// [`Self::note_placed`]. A same-host writer writes its cumulative count of data
    /// bytes there in the same `process_vm_writev` as the bytes, after them; bytes up to
    /// it may be read before their DATA message arrives ("ahead": the message, when it
    /// comes, covers them first, and one read wholly ahead gives its credit back at
    /// once). Messages stay the only source of truth for credits, EOF and errors.
    pub fn set_placed_word(&mut self, on: bool) {
        self.word_offered = on;
    }

    /// [`Self::set_placed_word`] is on.
    pub fn placed_word_offered(&self) -> bool {
        self.word_offered
    }

    /// The reader found `word` in its "bytes placed" word (its check matched:
    /// [`placed_word_count`]). A value below what is known changes nothing; one beyond
    /// the room granted and not read back (a broken peer) is ignored. Whether it was
    /// taken.
    pub fn note_placed(&mut self, word: u64) -> bool {
        if !self.word_offered || word <= self.placed {
            return false;
        }
        let consumed = self.announced - self.pending_bytes + self.ahead;
        let granted = u64::from(self.cfg.rbuf_size - self.rbuf_bytes_avail);
        if word > consumed + granted {
            return false;
        }
        self.placed = word;
        true
    }

    /// Bytes the word says are placed beyond what was read, while no message is queued
    /// (queued messages are read first; their bytes come before these).
    fn ahead_available(&self) -> u64 {
        if !self.rmsg.is_empty() || !self.word_offered {
            return 0;
        }
        self.placed.saturating_sub(self.announced + self.ahead)
    }

    /// What the word told since the last call (for the driver's counters).
    pub fn take_ahead_stats(&mut self) -> AheadStats {
        std::mem::take(&mut self.ahead_stats)
    }

    /// The "bytes placed" word, writer's side: where the peer's word is (from its
    /// connection data's extension, [`PlacedWordAd`]), or `None` (an rdma-core peer, or
    /// one with the word off).
    pub fn set_peer_placed_word(&mut self, ad: Option<PlacedWordAd>) {
        self.peer_word = ad;
    }

    /// For the data write `w` just started ([`Self::start_data`]): the peer's word
    /// (address, key) and the count to write into it after `w`'s bytes, in the same
    /// same-host copy (never before them). `None` for other writes or without a word.
    pub fn placed_word_after(&self, w: &DataWrite) -> Option<(u64, u32, u64)> {
        let ad = self.peer_word?;
        match WrKind::from_wr_id(w.wr_id)? {
            WrKind::Data(_) | WrKind::HeldData(_) => Some((ad.addr, ad.key, self.data_sent)),
            _ => None,
        }
    }

    /// Where the received bytes are, in order, up to `max` of them: one contiguous chunk
    /// per message piece (a message split where the ring wraps gives two), across every
    /// queued message. For `MSG_PEEK`, which rsocket.c's `rs_peek` serves from all the
    /// messages queued, leaving them in place.
    pub fn peek_chunks(&self, max: usize) -> Vec<RecvChunk> {
        let mut chunks = Vec::new();
        let mut left = u64::try_from(max).unwrap_or(u64::MAX);
        let mut offset = self.rbuf_offset;
        let ahead = u32::try_from(self.ahead_available()).unwrap_or(u32::MAX);
        let placed_only = (self.rmsg.is_empty() && ahead > 0).then_some(ahead);
        for &msg in self.rmsg.iter().chain(placed_only.iter()) {
            let mut len = u64::from(msg).min(left) as u32;
            left -= u64::from(len);
            while len > 0 {
                let n = len.min(self.cfg.rbuf_size - offset);
                chunks.push(RecvChunk { offset, len: n });
                len -= n;
                offset += n;
                if offset == self.cfg.rbuf_size {
                    offset = 0;
                }
            }
            if left == 0 {
                break;
            }
        }
        chunks
    }

    /// The caller read `n` bytes from [`Self::recv_chunk`] (at most its `len`).
    pub fn consume(&mut self, n: u32) {
        let Some(chunk) = self.recv_chunk() else {
            return;
        };
        let n = n.min(chunk.len);
        if let Some(head) = self.rmsg.front_mut() {
            *head -= n;
            if *head == 0 {
                self.rmsg.pop_front();
                self.rseq_no = self.rseq_no.wrapping_add(1);
            }
            self.pending_bytes -= u64::from(n);
        } else {
            // Ahead of their message: it will count them when it arrives.
            self.ahead += u64::from(n);
            self.ahead_stats.bytes += u64::from(n);
        }
        self.rbuf_bytes_avail += n;
        self.rbuf_offset += n;
        if self.rbuf_offset == self.cfg.rbuf_size {
            self.rbuf_offset = 0;
        }
    }

    /// Publishes a local region to the peer's iomap slot `index` (riomap): sent by
    /// [`Self::poll_iomap`] when a data write could go. `false` when `index` is beyond the
    /// slots the peer offers.
    pub fn queue_iomap(&mut self, index: u32, entry: IomapEntry) -> bool {
        match self.remote_iomap {
            Some(area) if index < area.length => {
                self.iomap_queue.push_back((index, entry));
                true
            }
            _ => false,
        }
    }

    /// Slots the peer offers for riomap.
    pub fn peer_iomap_slots(&self) -> u32 {
        self.remote_iomap.map_or(0, |a| a.length)
    }

    /// iomap publications waiting.
    pub fn iomap_pending(&self) -> bool {
        !self.iomap_queue.is_empty()
    }

    /// The next iomap publication (`rs_write_iomap`): an RDMA WRITE WITH IMM of the 24-byte
    /// entry into the peer's slot; it takes a data credit, so only when a data write could
    /// start.
    pub fn poll_iomap(&mut self) -> Option<CtrlWrite> {
        if !self.can_send() {
            return None;
        }
        let area = self.remote_iomap?;
        let (index, entry) = self.iomap_queue.pop_front()?;
        self.sseq_no = self.sseq_no.wrapping_add(1);
        self.sqe_avail -= 1;
        self.sbuf_bytes_avail -= IOMAP_ENTRY_LEN as u32;
        let msg = Msg::IomapSgl(index);
        Some(CtrlWrite {
            wr_id: WrKind::Iomap.to_wr_id(),
            remote_addr: area
                .addr
                .wrapping_add(u64::from(index) * IOMAP_ENTRY_LEN as u64),
            rkey: area.key,
            imm: Some(msg.to_imm()),
            payload: entry.to_bytes(self.peer_order).to_vec(),
        })
    }

    /// The peer's published region covering `offset`, if any.
    pub fn peer_iomap_entry(&self, offset: u64) -> Option<IomapEntry> {
        self.peer_iomap
            .iter()
            .flatten()
            .find(|e| e.locate(offset, 1).is_some())
            .copied()
    }

    /// Starts one riowrite of at most `want` bytes at the peer's mapping offset `offset`
    /// (`riowrite`): a plain RDMA WRITE into the covering iomap entry, cut at its end. `None`
    /// when no write can start now or nothing covers `offset` (check with
    /// [`Self::peer_iomap_entry`]).
    pub fn start_riowrite(&mut self, offset: u64, want: u32) -> Option<DataWrite> {
        if want == 0 || !self.can_send() {
            return None;
        }
        let entry = self.peer_iomap_entry(offset)?;
        let (remote_addr, fits) = entry.locate(offset, u64::from(want))?;
        let len = (fits as u32).min(self.sbuf_bytes_avail);
        self.sqe_avail -= 1;
        let stage = self.stage(len);
        Some(DataWrite {
            wr_id: WrKind::RioWrite(len).to_wr_id(),
            len,
            remote_addr,
            rkey: entry.sge.key,
            imm: None,
            stage,
        })
    }
}

#[cfg(test)]
mod tests;
