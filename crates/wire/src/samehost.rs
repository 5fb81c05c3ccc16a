//! The same-host handshake on the wire (issue 16; the driver's side is the `softverbs`
//! crate's `samehost` module): a softverbs extension datagram sent on a QP's path,
//! device to device, that RoCEv2 peers which are not softverbs never have to
//! understand.
//!
//! It is a BTH with a manufacturer-specific opcode ([`OPCODE`]; IBA 9.2, table 38:
//! opcodes 111xxxxx) to the peer's QPN, then a softverbs body (magic "SVSH",
//! version, kind, the sender's QPN, pid, PD id, the address and value of its nonce
//! word, its QP's access flags, the path of its memory-region table), then four zero bytes where an ICRC
//! would be. A softverbs device takes it off the wire before the engine sees it; any
//! other RoCEv2 receiver drops it (unknown opcode, bad ICRC). A device sends one only
//! for an RC or UC QP whose peer could be on this host, when the QP reaches RTR
//! (and again, a few times, while unanswered: the driver's `samehost/retry.rs`).
//!
//! - `Offer`: "I am softverbs process `pid`, here is my table; you may place into my
//!   QP's memory". The receiver checks it (its QP is RC, connected to the sender's
//!   QPN at the datagram's source; the probe: `process_vm_readv` of the nonce word
//!   in the sender gives the value its table file holds), maps the sender's table,
//!   lets its responder accept placed WRITEs, and answers `Accept` with its own
//!   details. A receiver that cannot or will not answers `Decline`.
//! - `Accept`: the sender of the offer checks the answer the same way, maps the
//!   peer's table and starts placing.
//!
//! So a device places into a peer only after the peer mapped its table and knows to
//! wait for its accesses at deregistration (the driver's `samehost/table.rs`).

use crate::Qpn;

/// The BTH opcode of the handshake (manufacturer specific).
pub const OPCODE: u8 = 0xF5;
const MAGIC: &[u8; 4] = b"SVSH";
const VERSION: u8 = 1;
const BTH_LEN: usize = 12;
const FIXED: usize = BTH_LEN + 4 + 1 + 1 + 2 + 4 + 4 + 8 + 8 + 8 + 4;
/// Longest table path carried.
pub const MAX_PATH: usize = 512;

/// What a handshake datagram says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// "You may use the same-host path into my QP."
    Offer,
    /// The offer was checked and taken.
    Accept,
    /// The offer cannot be taken (the reason is logged at the receiver).
    Decline,
}

impl Kind {
    fn code(self) -> u8 {
        match self {
            Kind::Offer => 1,
            Kind::Accept => 2,
            Kind::Decline => 3,
        }
    }
    fn from_code(c: u8) -> Option<Kind> {
        match c {
            1 => Some(Kind::Offer),
            2 => Some(Kind::Accept),
            3 => Some(Kind::Decline),
            _ => None,
        }
    }
}

/// A handshake datagram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// What it says.
    pub kind: Kind,
    /// The receiver's QP.
    pub dest_qpn: Qpn,
    /// The sender's QP.
    pub src_qpn: Qpn,
    /// The sender's process.
    pub pid: u32,
    /// The sender QP's PD id.
    pub pd: u64,
    /// The sender QP's access flags (`qp_access_flags`: which remote operations it
    /// lets its peer execute).
    pub qp_access: u32,
    /// Where the sender's nonce word is in its address space, and its value.
    pub nonce_addr: u64,
    /// The nonce.
    pub nonce: u64,
    /// The sender's memory-region table file.
    pub table: String,
}

/// Why a datagram is not a handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HelloError {
    /// Too short, or not ours (opcode, magic).
    #[error("not a softverbs same-host handshake")]
    NotHello,
    /// Ours, but of a version or kind this build does not know, or malformed.
    #[error("malformed same-host handshake")]
    Malformed,
}

/// Whether `data` looks like a handshake (cheap; the receive path asks for every
/// datagram).
#[inline]
pub fn is_hello(data: &[u8]) -> bool {
    data.len() >= FIXED && data[0] == OPCODE && &data[BTH_LEN..BTH_LEN + 4] == MAGIC
}

impl Hello {
    /// The datagram.
    pub fn emit(&self) -> Vec<u8> {
        let path = self.table.as_bytes();
        let path = &path[..path.len().min(MAX_PATH)];
        let mut b = Vec::with_capacity(FIXED + path.len() + 4);
        // BTH: opcode, flags (SE 0, M 0, pad 0, TVer 0), P_Key default, reserved,
        // dest QP, AckReq 0, PSN 0.
        b.push(OPCODE);
        b.push(0);
        b.extend_from_slice(&0xffffu16.to_be_bytes());
        b.push(0);
        b.extend_from_slice(&self.dest_qpn.value().to_be_bytes()[1..]);
        b.extend_from_slice(&[0, 0, 0, 0]);
        b.extend_from_slice(MAGIC);
        b.push(VERSION);
        b.push(self.kind.code());
        b.extend_from_slice(&(path.len() as u16).to_be_bytes());
        b.extend_from_slice(&self.src_qpn.value().to_be_bytes());
        b.extend_from_slice(&self.pid.to_be_bytes());
        b.extend_from_slice(&self.pd.to_be_bytes());
        b.extend_from_slice(&self.nonce_addr.to_be_bytes());
        b.extend_from_slice(&self.nonce.to_be_bytes());
        b.extend_from_slice(&self.qp_access.to_be_bytes());
        b.extend_from_slice(path);
        b.extend_from_slice(&[0; 4]);
        b
    }

    /// Parses a datagram.
    pub fn parse(data: &[u8]) -> Result<Hello, HelloError> {
        if !is_hello(data) {
            return Err(HelloError::NotHello);
        }
        let be32 =
            |at: usize| u32::from_be_bytes([data[at], data[at + 1], data[at + 2], data[at + 3]]);
        let be64 = |at: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&data[at..at + 8]);
            u64::from_be_bytes(w)
        };
        let at = BTH_LEN + 4;
        if data[at] != VERSION {
            return Err(HelloError::Malformed);
        }
        let kind = Kind::from_code(data[at + 1]).ok_or(HelloError::Malformed)?;
        let path_len = usize::from(u16::from_be_bytes([data[at + 2], data[at + 3]]));
        if path_len > MAX_PATH || data.len() != FIXED + path_len + 4 {
            return Err(HelloError::Malformed);
        }
        let src_qpn = be32(at + 4);
        if src_qpn > 0xff_ffff {
            return Err(HelloError::Malformed);
        }
        let table = std::str::from_utf8(&data[FIXED..FIXED + path_len])
            .map_err(|_| HelloError::Malformed)?
            .to_string();
        Ok(Hello {
            kind,
            dest_qpn: Qpn::new(be32(4) & 0xff_ffff),
            src_qpn: Qpn::new(src_qpn),
            pid: be32(at + 8),
            pd: be64(at + 12),
            nonce_addr: be64(at + 20),
            nonce: be64(at + 28),
            qp_access: be32(at + 36),
            table,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Hello {
        Hello {
            kind: Kind::Offer,
            dest_qpn: Qpn::new(0x12_3456),
            src_qpn: Qpn::new(0xab_cdef),
            pid: 4242,
            pd: 0x1_0000_0002,
            nonce_addr: 0x7fff_0000_1020,
            nonce: 0xdead_beef_0bad_f00d,
            qp_access: 0x0e,
            table: "/run/user/1000/softverbs/127.83.0.1-4791.mrt".into(),
        }
    }

    #[test]
    fn round_trips_and_rejects_what_is_not_one() {
        let h = sample();
        let b = h.emit();
        assert!(is_hello(&b));
        assert_eq!(Hello::parse(&b), Ok(h.clone()));
        // The BTH names the destination QP where any RoCEv2 receiver looks for it.
        assert_eq!(&b[5..8], &[0x12, 0x34, 0x56]);
        assert_eq!(b[0], OPCODE);
        for cut in 0..b.len() {
            assert!(Hello::parse(&b[..cut]).is_err(), "cut {cut}");
        }
        let mut bad = b.clone();
        bad[BTH_LEN + 4] = 9; // version
        assert_eq!(Hello::parse(&bad), Err(HelloError::Malformed));
        let mut bad = b.clone();
        bad[BTH_LEN + 5] = 0; // kind
        assert_eq!(Hello::parse(&bad), Err(HelloError::Malformed));
        let mut bad = b.clone();
        bad[BTH_LEN] = b'X';
        assert_eq!(Hello::parse(&bad), Err(HelloError::NotHello));
        let mut long = b.clone();
        long.push(0);
        assert_eq!(Hello::parse(&long), Err(HelloError::Malformed));
    }

    #[test]
    fn a_roce_packet_is_not_a_hello() {
        // RDMA WRITE Only (opcode 0x0A) with a body that happens to say SVSH.
        let mut b = sample().emit();
        b[0] = 0x0a;
        assert!(!is_hello(&b));
    }
}
