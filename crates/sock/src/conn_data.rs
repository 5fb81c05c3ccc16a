//! The 40-byte connection private data (`rs_conn_data`) each side sends in its REQ or REP.
//!
//! Layout (CM reference §5.1; fixed fields big-endian):
//!
//! ```text
//!  0  version (1)          1  flags (bit0 NET: big-endian host, bit1 IOMAP)
//!  2  credits (BE16)       4  reserved (3 bytes)   7  target_iomap_size (8-bit scale)
//!  8  target_sgl.addr (BE64)   16 target_sgl.key (BE32)   20 target_sgl.length (BE32)
//! 24  data_buf.addr (BE64)     32 data_buf.key (BE32)     36 data_buf.length (BE32)
//! ```

use crate::sge::RsSge;

/// Length of the connection data.
pub const CONN_DATA_LEN: usize = 40;
/// The only protocol version rsockets speaks; a peer refuses anything else.
pub const RS_VERSION: u8 = 1;
/// Flag: the sender is a big-endian host (its in-band SGEs are written big-endian to it).
pub const CONN_FLAG_NET: u8 = 1 << 0;
/// Flag: an iomap array follows the target SGL array (rdma-core always sets it).
pub const CONN_FLAG_IOMAP: u8 = 1 << 1;

/// Why connection data was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnDataError {
    /// Fewer than 40 bytes.
    #[error("connection data is {0} bytes, 40 needed")]
    Truncated(usize),
    /// A version other than 1 (rdma-core rejects the connection, ENOTSUP).
    #[error("rsocket protocol version {0} is not supported (only 1)")]
    Version(u8),
    /// The target SGL array does not have the two slots the protocol uses.
    #[error("the peer's target SGL has {0} slots, 2 expected")]
    SglSlots(u32),
    /// The peer's receive half-buffer is empty.
    #[error("the peer advertises an empty receive buffer")]
    EmptyBuffer,
    /// The peer grants no credits.
    #[error("the peer grants no credits")]
    NoCredits,
}

/// The 8-bit "scaled" encoding of the iomap size: values up to 128 as they are, larger ones
/// as `0x80 | (v >> 8)` (rsocket.c `rs_value_to_scale`, bits = 8).
pub fn iomap_size_to_scale(value: u16) -> u8 {
    if value <= 128 {
        value as u8
    } else {
        0x80 | (value >> 8) as u8
    }
}

/// The inverse of [`iomap_size_to_scale`] (`rs_scale_to_value`).
pub fn iomap_size_from_scale(scale: u8) -> u16 {
    if scale <= 128 {
        u16::from(scale)
    } else {
        u16::from(scale & 0x7f) << 8
    }
}

/// The connection data, parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnData {
    /// Flags ([`CONN_FLAG_NET`], [`CONN_FLAG_IOMAP`]); unknown bits are kept.
    pub flags: u8,
    /// The sender's receive queue size: how many messages it can take before it grants more.
    pub credits: u16,
    /// How many iomap slots follow the sender's target SGL array.
    pub target_iomap_size: u16,
    /// The sender's target SGL array: where the peer writes buffer grants (`length` is the
    /// number of slots, 2).
    pub target_sgl: RsSge,
    /// The first half of the sender's receive buffer: where the peer's first data goes.
    pub data_buf: RsSge,
}

impl ConnData {
    /// The in-band SGEs of a sender with these flags are big-endian.
    pub fn is_big_endian(&self) -> bool {
        self.flags & CONN_FLAG_NET != 0
    }

    /// The iomap array (slots of 24 bytes) follows the target SGL array.
    pub fn has_iomap(&self) -> bool {
        self.flags & CONN_FLAG_IOMAP != 0
    }

    /// Parses the first 40 bytes of `bytes` (what follows is ignored: a REQ carries up to
    /// 56 bytes of private data, a REP more) and checks what the protocol needs.
    pub fn parse(bytes: &[u8]) -> Result<ConnData, ConnDataError> {
        let b: &[u8; CONN_DATA_LEN] = bytes
            .get(..CONN_DATA_LEN)
            .and_then(|b| b.try_into().ok())
            .ok_or(ConnDataError::Truncated(bytes.len()))?;
        if b[0] != RS_VERSION {
            return Err(ConnDataError::Version(b[0]));
        }
        let data = ConnData {
            flags: b[1],
            credits: u16::from_be_bytes([b[2], b[3]]),
            target_iomap_size: iomap_size_from_scale(b[7]),
            target_sgl: RsSge::from_be(&b[8..24]),
            data_buf: RsSge::from_be(&b[24..40]),
        };
        if data.target_sgl.length != 2 {
            return Err(ConnDataError::SglSlots(data.target_sgl.length));
        }
        if data.data_buf.length == 0 {
            return Err(ConnDataError::EmptyBuffer);
        }
        if data.credits == 0 {
            return Err(ConnDataError::NoCredits);
        }
        Ok(data)
    }

    /// The 40 bytes on the wire.
    pub fn to_bytes(&self) -> [u8; CONN_DATA_LEN] {
        let mut b = [0u8; CONN_DATA_LEN];
        b[0] = RS_VERSION;
        b[1] = self.flags;
        b[2..4].copy_from_slice(&self.credits.to_be_bytes());
        b[7] = iomap_size_to_scale(self.target_iomap_size);
        self.target_sgl.write_be(&mut b[8..24]);
        self.data_buf.write_be(&mut b[24..40]);
        b
    }
}

/// Bytes of the softverbs-only extension that may follow the 40 bytes of connection data
/// ([`PlacedWordAd`]): a REQ's private data holds 56 bytes on rdma_cm's TCP port space,
/// so 40 + 16 fit.
pub const PLACED_WORD_AD_LEN: usize = 16;
/// Tags the extension (ASCII "SVpw"): a peer that sends only the 40 bytes leaves zeros (or
/// nothing) there, which never match.
const PLACED_WORD_MAGIC: [u8; 4] = *b"SVpw";

/// Where a softverbs peer's "bytes placed" word is (`StreamCore::set_placed_word`): 16
/// bytes of its registered target area, after the iomap slots, into which a same-host
/// writer writes its cumulative count of data bytes, then a check of it, after the bytes.
/// Advertised in the 16 bytes after the connection data, which rdma-core's rsockets never
/// read (`rs_save_conn_data` looks at the 40 only), so its wire is unchanged.
///
/// Layout: `"SVpw"`, key (BE32), address (BE64).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlacedWordAd {
    /// Address of the word (its count; the check follows).
    pub addr: u64,
    /// Its rkey (the target area's).
    pub key: u32,
}

impl PlacedWordAd {
    /// The 16 bytes that follow the connection data.
    pub fn to_bytes(&self) -> [u8; PLACED_WORD_AD_LEN] {
        let mut b = [0u8; PLACED_WORD_AD_LEN];
        b[..4].copy_from_slice(&PLACED_WORD_MAGIC);
        b[4..8].copy_from_slice(&self.key.to_be_bytes());
        b[8..16].copy_from_slice(&self.addr.to_be_bytes());
        b
    }

    /// The extension in a peer's private data (the whole of it, connection data first),
    /// if the peer sent one.
    pub fn parse(private_data: &[u8]) -> Option<PlacedWordAd> {
        let b = private_data.get(CONN_DATA_LEN..CONN_DATA_LEN + PLACED_WORD_AD_LEN)?;
        if b[..4] != PLACED_WORD_MAGIC {
            return None;
        }
        Some(PlacedWordAd {
            key: u32::from_be_bytes(b[4..8].try_into().ok()?),
            addr: u64::from_be_bytes(b[8..16].try_into().ok()?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ConnData {
        ConnData {
            flags: CONN_FLAG_IOMAP,
            credits: 384,
            target_iomap_size: 1,
            target_sgl: RsSge {
                addr: 0x7f00_1234_5000,
                key: 0x0102_0304,
                length: 2,
            },
            data_buf: RsSge {
                addr: 0x7f00_aaaa_0000,
                key: 0x0a0b_0c0d,
                length: 65536,
            },
        }
    }

    #[test]
    fn byte_layout_matches_the_reference() {
        let b = sample().to_bytes();
        assert_eq!(
            b,
            [
                1, 2, 0x01, 0x80, 0, 0, 0, 1, // version, flags, credits, reserved, iomap
                0, 0, 0x7f, 0, 0x12, 0x34, 0x50, 0, 1, 2, 3, 4, 0, 0, 0, 2, // target_sgl
                0, 0, 0x7f, 0, 0xaa, 0xaa, 0, 0, 0x0a, 0x0b, 0x0c, 0x0d, 0, 1, 0,
                0, // data_buf
            ]
        );
        assert_eq!(ConnData::parse(&b), Ok(sample()));
    }

    #[test]
    fn refuses_what_the_protocol_cannot_use() {
        let good = sample().to_bytes();
        assert_eq!(
            ConnData::parse(&good[..39]),
            Err(ConnDataError::Truncated(39))
        );
        let mut b = good;
        b[0] = 2;
        assert_eq!(ConnData::parse(&b), Err(ConnDataError::Version(2)));
        let mut b = good;
        b[23] = 3;
        assert_eq!(ConnData::parse(&b), Err(ConnDataError::SglSlots(3)));
        let mut b = good;
        b[36..40].fill(0);
        assert_eq!(ConnData::parse(&b), Err(ConnDataError::EmptyBuffer));
        let mut b = good;
        b[2..4].fill(0);
        assert_eq!(ConnData::parse(&b), Err(ConnDataError::NoCredits));
        // Trailing bytes (the rest of a REQ's private data) are ignored.
        let mut long = good.to_vec();
        long.extend_from_slice(&[0xee; 16]);
        assert_eq!(ConnData::parse(&long), Ok(sample()));
    }

    #[test]
    fn iomap_scale_round_trips_what_it_can_represent() {
        for v in 0..=128u16 {
            assert_eq!(iomap_size_from_scale(iomap_size_to_scale(v)), v);
        }
        assert_eq!(iomap_size_to_scale(256), 0x81);
        assert_eq!(iomap_size_from_scale(0x81), 256);
        // Larger values lose their low byte, as in rsocket.c.
        assert_eq!(iomap_size_from_scale(iomap_size_to_scale(0x1234)), 0x1200);
    }

    #[test]
    fn the_placed_word_extension_is_found_only_when_sent() {
        let ad = PlacedWordAd {
            addr: 0x7f00_1234_5020,
            key: 0x0102_0304,
        };
        let mut data = sample().to_bytes().to_vec();
        // rdma-core's 40 bytes alone, or padded with zeros as a REQ's private data is.
        assert_eq!(PlacedWordAd::parse(&data), None);
        data.resize(56, 0);
        assert_eq!(PlacedWordAd::parse(&data), None);
        data.truncate(40);
        data.extend_from_slice(&ad.to_bytes());
        assert_eq!(data.len(), 56);
        assert_eq!(PlacedWordAd::parse(&data), Some(ad));
        // The connection data before it reads as ever.
        assert_eq!(ConnData::parse(&data), Ok(sample()));
        assert_eq!(PlacedWordAd::parse(&data[..55]), None);
        data[41] ^= 1;
        assert_eq!(PlacedWordAd::parse(&data), None);
    }
}
