//! The BTH opcode table, held as data (IBA 9.2.1 table 38 and 9.3, RoCEv2 CNP from
//! Annex A17.9.2).
//!
//! Each supported opcode has one [`OpcodeInfo`] row saying which extension headers
//! follow the BTH, whether a payload follows them, and what the packet means.
//! Everything else in softverbs asks this table instead of matching on opcodes.

use core::fmt;

/// Which transport service an opcode belongs to (the top three bits of the opcode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Reliable Connected (opcode prefix 000).
    Rc,
    /// Unreliable Connected (prefix 001).
    Uc,
    /// Unreliable Datagram (prefix 011).
    Ud,
    /// RoCEv2 congestion notification packet (opcode 0x81, prefix 100).
    Cnp,
}

/// What kind of operation a packet belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// SEND (plain, with immediate or with invalidate).
    Send,
    /// RDMA WRITE (plain or with immediate).
    RdmaWrite,
    /// RDMA READ request.
    RdmaReadRequest,
    /// RDMA READ response.
    RdmaReadResponse,
    /// ACKNOWLEDGE (ACK, RNR NAK or NAK).
    Acknowledge,
    /// ATOMIC ACKNOWLEDGE.
    AtomicAcknowledge,
    /// ATOMIC compare and swap.
    CompareSwap,
    /// ATOMIC fetch and add.
    FetchAdd,
    /// Congestion notification.
    Cnp,
}

/// Where a packet sits within its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Position {
    /// First packet of a multi-packet message.
    First,
    /// Neither first nor last.
    Middle,
    /// Last packet of a multi-packet message.
    Last,
    /// The whole message in one packet.
    Only,
}

impl Position {
    /// Whether the packet starts a message.
    pub const fn starts_message(self) -> bool {
        matches!(self, Position::First | Position::Only)
    }

    /// Whether the packet ends a message.
    pub const fn ends_message(self) -> bool {
        matches!(self, Position::Last | Position::Only)
    }
}

/// A set of extension headers, in the order they follow the BTH.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct HeaderSet(u8);

impl HeaderSet {
    /// No extension header.
    pub const NONE: HeaderSet = HeaderSet(0);
    /// Datagram extended transport header (8 bytes, UD).
    pub const DETH: HeaderSet = HeaderSet(1 << 0);
    /// RDMA extended transport header (16 bytes).
    pub const RETH: HeaderSet = HeaderSet(1 << 1);
    /// Atomic extended transport header (28 bytes).
    pub const ATOMIC_ETH: HeaderSet = HeaderSet(1 << 2);
    /// ACK extended transport header (4 bytes).
    pub const AETH: HeaderSet = HeaderSet(1 << 3);
    /// Atomic ACK extended transport header (8 bytes).
    pub const ATOMIC_ACK_ETH: HeaderSet = HeaderSet(1 << 4);
    /// Immediate data (4 bytes).
    pub const IMMDT: HeaderSet = HeaderSet(1 << 5);
    /// Invalidate extended transport header (4 bytes).
    pub const IETH: HeaderSet = HeaderSet(1 << 6);

    /// Every header in wire order, with its length in bytes.
    pub const ORDER: [(HeaderSet, usize); 7] = [
        (HeaderSet::DETH, 8),
        (HeaderSet::RETH, 16),
        (HeaderSet::ATOMIC_ETH, 28),
        (HeaderSet::AETH, 4),
        (HeaderSet::ATOMIC_ACK_ETH, 8),
        (HeaderSet::IMMDT, 4),
        (HeaderSet::IETH, 4),
    ];

    /// The union of two sets.
    pub const fn with(self, other: HeaderSet) -> HeaderSet {
        HeaderSet(self.0 | other.0)
    }

    /// Whether every header of `other` is in `self`.
    pub const fn contains(self, other: HeaderSet) -> bool {
        self.0 & other.0 == other.0
    }

    /// Total length in bytes of the headers in the set.
    pub const fn len(self) -> usize {
        let mut total = 0;
        let mut i = 0;
        while i < Self::ORDER.len() {
            if self.contains(Self::ORDER[i].0) {
                total += Self::ORDER[i].1;
            }
            i += 1;
        }
        total
    }

    /// Whether the set is empty.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Byte offset of `header` after the BTH, if it is in the set.
    pub const fn offset_of(self, header: HeaderSet) -> Option<usize> {
        if !self.contains(header) || header.0.count_ones() != 1 {
            return None;
        }
        let mut offset = 0;
        let mut i = 0;
        while i < Self::ORDER.len() {
            if Self::ORDER[i].0 .0 == header.0 {
                return Some(offset);
            }
            if self.contains(Self::ORDER[i].0) {
                offset += Self::ORDER[i].1;
            }
            i += 1;
        }
        None
    }
}

impl fmt::Debug for HeaderSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const NAMES: [&str; 7] = [
            "DETH",
            "RETH",
            "AtomicETH",
            "AETH",
            "AtomicAckETH",
            "ImmDt",
            "IETH",
        ];
        let mut list = f.debug_set();
        for (i, (h, _)) in Self::ORDER.iter().enumerate() {
            if self.contains(*h) {
                list.entry(&format_args!("{}", NAMES[i]));
            }
        }
        list.finish()
    }
}

/// One row of the opcode table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpcodeInfo {
    /// The opcode this row describes.
    pub opcode: Opcode,
    /// The name IBA gives it.
    pub name: &'static str,
    /// Transport service.
    pub transport: Transport,
    /// Operation.
    pub kind: OpKind,
    /// Place within the message.
    pub position: Position,
    /// Extension headers that follow the BTH, in wire order.
    pub headers: HeaderSet,
    /// Whether a payload may follow the headers.
    pub has_payload: bool,
    /// Whether the packet is sent by a requester (false: by a responder).
    pub is_request: bool,
    /// Whether the message consumes a receive WQE at the responder.
    pub needs_recv_wqe: bool,
}

impl OpcodeInfo {
    /// Whether the message carries immediate data.
    pub const fn has_immediate(&self) -> bool {
        self.headers.contains(HeaderSet::IMMDT)
    }

    /// Whether the message carries an rkey to invalidate.
    pub const fn has_invalidate(&self) -> bool {
        self.headers.contains(HeaderSet::IETH)
    }
}

macro_rules! opcodes {
    ($( $variant:ident = $value:literal, $name:literal, $transport:ident, $kind:ident, $pos:ident,
        [$($hdr:ident)|*], payload: $payload:literal, request: $req:literal, recv_wqe: $wqe:literal; )*) => {
        /// A BTH opcode softverbs implements.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum Opcode {
            $(
                #[doc = $name]
                $variant = $value,
            )*
        }

        /// The opcode table: one row per supported opcode, in opcode order.
        pub static OPCODE_TABLE: &[OpcodeInfo] = &[
            $(
                OpcodeInfo {
                    opcode: Opcode::$variant,
                    name: $name,
                    transport: Transport::$transport,
                    kind: OpKind::$kind,
                    position: Position::$pos,
                    headers: HeaderSet::NONE $(.with(HeaderSet::$hdr))*,
                    has_payload: $payload,
                    is_request: $req,
                    needs_recv_wqe: $wqe,
                },
            )*
        ];

        impl Opcode {
            /// The opcode with this wire value, if softverbs implements it.
            pub const fn from_u8(value: u8) -> Option<Opcode> {
                match value {
                    $( $value => Some(Opcode::$variant), )*
                    _ => None,
                }
            }
        }
    };
}

opcodes! {
    // Reliable Connected (IBA 9.2.1, opcodes 000xxxxx).
    RcSendFirst = 0x00, "RC SEND First", Rc, Send, First, [], payload: true, request: true, recv_wqe: true;
    RcSendMiddle = 0x01, "RC SEND Middle", Rc, Send, Middle, [], payload: true, request: true, recv_wqe: true;
    RcSendLast = 0x02, "RC SEND Last", Rc, Send, Last, [], payload: true, request: true, recv_wqe: true;
    RcSendLastImm = 0x03, "RC SEND Last with Immediate", Rc, Send, Last, [IMMDT], payload: true, request: true, recv_wqe: true;
    RcSendOnly = 0x04, "RC SEND Only", Rc, Send, Only, [], payload: true, request: true, recv_wqe: true;
    RcSendOnlyImm = 0x05, "RC SEND Only with Immediate", Rc, Send, Only, [IMMDT], payload: true, request: true, recv_wqe: true;
    RcWriteFirst = 0x06, "RC RDMA WRITE First", Rc, RdmaWrite, First, [RETH], payload: true, request: true, recv_wqe: false;
    RcWriteMiddle = 0x07, "RC RDMA WRITE Middle", Rc, RdmaWrite, Middle, [], payload: true, request: true, recv_wqe: false;
    RcWriteLast = 0x08, "RC RDMA WRITE Last", Rc, RdmaWrite, Last, [], payload: true, request: true, recv_wqe: false;
    RcWriteLastImm = 0x09, "RC RDMA WRITE Last with Immediate", Rc, RdmaWrite, Last, [IMMDT], payload: true, request: true, recv_wqe: true;
    RcWriteOnly = 0x0a, "RC RDMA WRITE Only", Rc, RdmaWrite, Only, [RETH], payload: true, request: true, recv_wqe: false;
    RcWriteOnlyImm = 0x0b, "RC RDMA WRITE Only with Immediate", Rc, RdmaWrite, Only, [RETH | IMMDT], payload: true, request: true, recv_wqe: true;
    RcReadRequest = 0x0c, "RC RDMA READ Request", Rc, RdmaReadRequest, Only, [RETH], payload: false, request: true, recv_wqe: false;
    RcReadResponseFirst = 0x0d, "RC RDMA READ Response First", Rc, RdmaReadResponse, First, [AETH], payload: true, request: false, recv_wqe: false;
    RcReadResponseMiddle = 0x0e, "RC RDMA READ Response Middle", Rc, RdmaReadResponse, Middle, [], payload: true, request: false, recv_wqe: false;
    RcReadResponseLast = 0x0f, "RC RDMA READ Response Last", Rc, RdmaReadResponse, Last, [AETH], payload: true, request: false, recv_wqe: false;
    RcReadResponseOnly = 0x10, "RC RDMA READ Response Only", Rc, RdmaReadResponse, Only, [AETH], payload: true, request: false, recv_wqe: false;
    RcAcknowledge = 0x11, "RC Acknowledge", Rc, Acknowledge, Only, [AETH], payload: false, request: false, recv_wqe: false;
    RcAtomicAcknowledge = 0x12, "RC ATOMIC Acknowledge", Rc, AtomicAcknowledge, Only, [AETH | ATOMIC_ACK_ETH], payload: false, request: false, recv_wqe: false;
    RcCompareSwap = 0x13, "RC CmpSwap", Rc, CompareSwap, Only, [ATOMIC_ETH], payload: false, request: true, recv_wqe: false;
    RcFetchAdd = 0x14, "RC FetchAdd", Rc, FetchAdd, Only, [ATOMIC_ETH], payload: false, request: true, recv_wqe: false;
    RcSendLastInv = 0x16, "RC SEND Last with Invalidate", Rc, Send, Last, [IETH], payload: true, request: true, recv_wqe: true;
    RcSendOnlyInv = 0x17, "RC SEND Only with Invalidate", Rc, Send, Only, [IETH], payload: true, request: true, recv_wqe: true;
    // Unreliable Connected (opcodes 001xxxxx).
    UcSendFirst = 0x20, "UC SEND First", Uc, Send, First, [], payload: true, request: true, recv_wqe: true;
    UcSendMiddle = 0x21, "UC SEND Middle", Uc, Send, Middle, [], payload: true, request: true, recv_wqe: true;
    UcSendLast = 0x22, "UC SEND Last", Uc, Send, Last, [], payload: true, request: true, recv_wqe: true;
    UcSendLastImm = 0x23, "UC SEND Last with Immediate", Uc, Send, Last, [IMMDT], payload: true, request: true, recv_wqe: true;
    UcSendOnly = 0x24, "UC SEND Only", Uc, Send, Only, [], payload: true, request: true, recv_wqe: true;
    UcSendOnlyImm = 0x25, "UC SEND Only with Immediate", Uc, Send, Only, [IMMDT], payload: true, request: true, recv_wqe: true;
    UcWriteFirst = 0x26, "UC RDMA WRITE First", Uc, RdmaWrite, First, [RETH], payload: true, request: true, recv_wqe: false;
    UcWriteMiddle = 0x27, "UC RDMA WRITE Middle", Uc, RdmaWrite, Middle, [], payload: true, request: true, recv_wqe: false;
    UcWriteLast = 0x28, "UC RDMA WRITE Last", Uc, RdmaWrite, Last, [], payload: true, request: true, recv_wqe: false;
    UcWriteLastImm = 0x29, "UC RDMA WRITE Last with Immediate", Uc, RdmaWrite, Last, [IMMDT], payload: true, request: true, recv_wqe: true;
    UcWriteOnly = 0x2a, "UC RDMA WRITE Only", Uc, RdmaWrite, Only, [RETH], payload: true, request: true, recv_wqe: false;
    UcWriteOnlyImm = 0x2b, "UC RDMA WRITE Only with Immediate", Uc, RdmaWrite, Only, [RETH | IMMDT], payload: true, request: true, recv_wqe: true;
    // Unreliable Datagram (opcodes 011xxxxx).
    UdSendOnly = 0x64, "UD SEND Only", Ud, Send, Only, [DETH], payload: true, request: true, recv_wqe: true;
    UdSendOnlyImm = 0x65, "UD SEND Only with Immediate", Ud, Send, Only, [DETH | IMMDT], payload: true, request: true, recv_wqe: true;
    // RoCEv2 congestion notification packet (Annex A17.9.2): BTH plus 16 reserved bytes.
    Cnp = 0x81, "CNP", Cnp, Cnp, Only, [], payload: true, request: false, recv_wqe: false;
}

impl Opcode {
    /// This opcode's row of the table.
    pub fn info(self) -> &'static OpcodeInfo {
        // The table is generated in the same order as the enum, so a linear search
        // over 38 rows is short; keep it simple and obviously right.
        OPCODE_TABLE
            .iter()
            .find(|row| row.opcode == self)
            .expect("every Opcode variant has a table row")
    }

    /// The wire value.
    pub const fn value(self) -> u8 {
        self as u8
    }

    /// Shorthand for `info().transport`.
    pub fn transport(self) -> Transport {
        self.info().transport
    }

    /// The opcode of `kind` at `position` for `transport`, with or without
    /// immediate data / invalidate, if IBA defines one.
    pub fn find(
        transport: Transport,
        kind: OpKind,
        position: Position,
        headers: HeaderSet,
    ) -> Option<Opcode> {
        OPCODE_TABLE
            .iter()
            .find(|row| {
                row.transport == transport
                    && row.kind == kind
                    && row.position == position
                    && row.headers == headers
            })
            .map(|row| row.opcode)
    }
}

/// The CNP carries 16 reserved bytes after the BTH (Annex A17.9.2).
pub const CNP_PAYLOAD_LEN: usize = 16;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_round_trips_every_byte() {
        for value in 0..=255u8 {
            match Opcode::from_u8(value) {
                Some(op) => {
                    assert_eq!(op.value(), value);
                    assert_eq!(op.info().opcode, op);
                }
                None => assert!(!OPCODE_TABLE.iter().any(|r| r.opcode.value() == value)),
            }
        }
        assert_eq!(OPCODE_TABLE.len(), 38);
    }

    #[test]
    fn transport_matches_opcode_prefix() {
        // IBA 9.2.1: the top three bits of the opcode select the transport.
        for row in OPCODE_TABLE {
            let expected = match row.opcode.value() >> 5 {
                0b000 => Transport::Rc,
                0b001 => Transport::Uc,
                0b011 => Transport::Ud,
                0b100 => Transport::Cnp,
                other => panic!("unexpected prefix {other:#b}"),
            };
            assert_eq!(row.transport, expected, "{}", row.name);
        }
    }

    #[test]
    fn header_rules_hold() {
        for row in OPCODE_TABLE {
            let h = row.headers;
            // RETH appears exactly on the first packet of an RDMA WRITE and on READ requests.
            let wants_reth = matches!(
                (row.kind, row.position),
                (OpKind::RdmaWrite, Position::First | Position::Only)
                    | (OpKind::RdmaReadRequest, _)
            );
            assert_eq!(h.contains(HeaderSet::RETH), wants_reth, "{}", row.name);
            // AETH on every response except READ response middle.
            let wants_aeth = !row.is_request
                && row.kind != OpKind::Cnp
                && !(row.kind == OpKind::RdmaReadResponse && row.position == Position::Middle);
            assert_eq!(h.contains(HeaderSet::AETH), wants_aeth, "{}", row.name);
            // Immediate data and invalidate only on the packet that ends a message.
            if h.contains(HeaderSet::IMMDT) || h.contains(HeaderSet::IETH) {
                assert!(row.position.ends_message(), "{}", row.name);
                assert!(row.needs_recv_wqe, "{}", row.name);
            }
            assert!(!(h.contains(HeaderSet::IMMDT) && h.contains(HeaderSet::IETH)));
            // DETH exactly on UD; AtomicETH exactly on atomic requests.
            assert_eq!(
                h.contains(HeaderSet::DETH),
                row.transport == Transport::Ud,
                "{}",
                row.name
            );
            let atomic = matches!(row.kind, OpKind::CompareSwap | OpKind::FetchAdd);
            assert_eq!(h.contains(HeaderSet::ATOMIC_ETH), atomic, "{}", row.name);
            assert_eq!(
                h.contains(HeaderSet::ATOMIC_ACK_ETH),
                row.kind == OpKind::AtomicAcknowledge,
                "{}",
                row.name
            );
            // Payload: everything but READ requests, ACKs and atomics.
            let no_payload = matches!(
                row.kind,
                OpKind::RdmaReadRequest
                    | OpKind::Acknowledge
                    | OpKind::AtomicAcknowledge
                    | OpKind::CompareSwap
                    | OpKind::FetchAdd
            );
            assert_eq!(row.has_payload, !no_payload, "{}", row.name);
            // Only SENDs and WRITE-with-immediate consume a receive WQE.
            let consumes = row.kind == OpKind::Send
                || (row.kind == OpKind::RdmaWrite && h.contains(HeaderSet::IMMDT));
            assert_eq!(row.needs_recv_wqe, consumes, "{}", row.name);
            // Requests vs responses.
            let request = matches!(
                row.kind,
                OpKind::Send
                    | OpKind::RdmaWrite
                    | OpKind::RdmaReadRequest
                    | OpKind::CompareSwap
                    | OpKind::FetchAdd
            );
            assert_eq!(row.is_request, request, "{}", row.name);
            // UC carries only SEND and RDMA WRITE; UD only SEND Only.
            match row.transport {
                Transport::Uc => assert!(matches!(row.kind, OpKind::Send | OpKind::RdmaWrite)),
                Transport::Ud => {
                    assert!(row.kind == OpKind::Send && row.position == Position::Only)
                }
                _ => {}
            }
        }
    }

    #[test]
    fn every_message_shape_is_reachable_by_find() {
        for row in OPCODE_TABLE {
            assert_eq!(
                Opcode::find(row.transport, row.kind, row.position, row.headers),
                Some(row.opcode)
            );
        }
    }

    #[test]
    fn header_offsets_follow_wire_order() {
        let h = HeaderSet::RETH.with(HeaderSet::IMMDT);
        assert_eq!(h.len(), 20);
        assert_eq!(h.offset_of(HeaderSet::RETH), Some(0));
        assert_eq!(h.offset_of(HeaderSet::IMMDT), Some(16));
        let h = HeaderSet::AETH.with(HeaderSet::ATOMIC_ACK_ETH);
        assert_eq!(h.offset_of(HeaderSet::ATOMIC_ACK_ETH), Some(4));
        let h = HeaderSet::DETH.with(HeaderSet::IMMDT);
        assert_eq!(h.offset_of(HeaderSet::IMMDT), Some(8));
        assert_eq!(h.offset_of(HeaderSet::RETH), None);
    }
}
