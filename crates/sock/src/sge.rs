//! The in-band descriptors one side writes into the other's target area by RDMA: an
//! `rs_sge` (16 bytes: addr u64, key u32, length u32) granting a receive half-buffer, and an
//! iomap entry (24 bytes: offset u64, then an `rs_sge`) publishing a riomap'd region.
//!
//! In the connection data they are big-endian; written by RDMA they are in the *receiver's*
//! byte order (CM reference §5.2): the writer swaps iff the peer's NET flag differs from its
//! own. [`SgeOrder`] says which order a given copy uses.

/// Bytes of an `rs_sge`.
pub const RS_SGE_LEN: usize = 16;
/// Bytes of an iomap entry.
pub const IOMAP_ENTRY_LEN: usize = 24;

/// The byte order of an in-band descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SgeOrder {
    /// Little-endian (a receiver without the NET flag).
    Little,
    /// Big-endian (a receiver with the NET flag).
    Big,
}

impl SgeOrder {
    /// The order a peer with `big_endian` (its NET flag) reads.
    pub fn of_peer(big_endian: bool) -> SgeOrder {
        if big_endian {
            SgeOrder::Big
        } else {
            SgeOrder::Little
        }
    }

    fn u64(self, b: &[u8]) -> u64 {
        let a: [u8; 8] = b[..8].try_into().expect("8 bytes");
        match self {
            SgeOrder::Little => u64::from_le_bytes(a),
            SgeOrder::Big => u64::from_be_bytes(a),
        }
    }

    fn u32(self, b: &[u8]) -> u32 {
        let a: [u8; 4] = b[..4].try_into().expect("4 bytes");
        match self {
            SgeOrder::Little => u32::from_le_bytes(a),
            SgeOrder::Big => u32::from_be_bytes(a),
        }
    }

    fn put_u64(self, b: &mut [u8], v: u64) {
        b[..8].copy_from_slice(&match self {
            SgeOrder::Little => v.to_le_bytes(),
            SgeOrder::Big => v.to_be_bytes(),
        });
    }

    fn put_u32(self, b: &mut [u8], v: u32) {
        b[..4].copy_from_slice(&match self {
            SgeOrder::Little => v.to_le_bytes(),
            SgeOrder::Big => v.to_be_bytes(),
        });
    }
}

/// A remote region: address, rkey, length (`struct rs_sge`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RsSge {
    /// Start address in the owner's address space.
    pub addr: u64,
    /// Its rkey.
    pub key: u32,
    /// Its length in bytes (for the target SGL in the connection data: the slot count).
    pub length: u32,
}

impl RsSge {
    /// Reads 16 bytes in `order`; `None` when fewer are given.
    pub fn read(bytes: &[u8], order: SgeOrder) -> Option<RsSge> {
        let b = bytes.get(..RS_SGE_LEN)?;
        Some(RsSge {
            addr: order.u64(&b[0..8]),
            key: order.u32(&b[8..12]),
            length: order.u32(&b[12..16]),
        })
    }

    /// The 16 bytes in `order`.
    pub fn to_bytes(&self, order: SgeOrder) -> [u8; RS_SGE_LEN] {
        let mut b = [0u8; RS_SGE_LEN];
        order.put_u64(&mut b[0..8], self.addr);
        order.put_u32(&mut b[8..12], self.key);
        order.put_u32(&mut b[12..16], self.length);
        b
    }

    pub(crate) fn from_be(b: &[u8]) -> RsSge {
        RsSge::read(b, SgeOrder::Big).expect("16 bytes")
    }

    pub(crate) fn write_be(&self, out: &mut [u8]) {
        out.copy_from_slice(&self.to_bytes(SgeOrder::Big));
    }
}

/// One iomap slot: writes at `offset` (in the mapping's own numbering) land in `sge`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IomapEntry {
    /// The offset riowrite callers name for the start of the region.
    pub offset: u64,
    /// Where the region is and its rkey and length.
    pub sge: RsSge,
}

impl IomapEntry {
    /// Reads 24 bytes in `order`; `None` when fewer are given.
    pub fn read(bytes: &[u8], order: SgeOrder) -> Option<IomapEntry> {
        let b = bytes.get(..IOMAP_ENTRY_LEN)?;
        Some(IomapEntry {
            offset: order.u64(&b[0..8]),
            sge: RsSge::read(&b[8..], order)?,
        })
    }

    /// The 24 bytes in `order`.
    pub fn to_bytes(&self, order: SgeOrder) -> [u8; IOMAP_ENTRY_LEN] {
        let mut b = [0u8; IOMAP_ENTRY_LEN];
        order.put_u64(&mut b[0..8], self.offset);
        b[8..].copy_from_slice(&self.sge.to_bytes(order));
        b
    }

    /// Where a write of `len` bytes at mapping offset `offset` goes, and how much of it fits
    /// before the end of this entry; `None` when `offset` is outside it, or the entry (a
    /// peer's, so anything) would wrap around the address space.
    pub fn locate(&self, offset: u64, len: u64) -> Option<(u64, u64)> {
        let rel = offset.checked_sub(self.offset)?;
        let room = u64::from(self.sge.length).checked_sub(rel)?;
        if room == 0 {
            return None;
        }
        let addr = self.sge.addr.checked_add(rel)?;
        let fits = room.min(len);
        addr.checked_add(fits)?;
        Some((addr, fits))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_round_trip_and_differ() {
        let s = RsSge {
            addr: 0x0102_0304_0506_0708,
            key: 0x1122_3344,
            length: 0x8000,
        };
        let le = s.to_bytes(SgeOrder::Little);
        let be = s.to_bytes(SgeOrder::Big);
        assert_eq!(le[0], 0x08);
        assert_eq!(be[0], 0x01);
        assert_eq!(RsSge::read(&le, SgeOrder::Little), Some(s));
        assert_eq!(RsSge::read(&be, SgeOrder::Big), Some(s));
        assert_eq!(RsSge::read(&be[..15], SgeOrder::Big), None);
        let e = IomapEntry {
            offset: 4096,
            sge: s,
        };
        assert_eq!(
            IomapEntry::read(&e.to_bytes(SgeOrder::Big), SgeOrder::Big),
            Some(e)
        );
    }

    #[test]
    fn locate_stays_inside_the_entry() {
        let e = IomapEntry {
            offset: 1000,
            sge: RsSge {
                addr: 0x10000,
                key: 7,
                length: 100,
            },
        };
        assert_eq!(e.locate(999, 1), None);
        assert_eq!(e.locate(1000, 10), Some((0x10000, 10)));
        assert_eq!(e.locate(1090, 50), Some((0x10000 + 90, 10)));
        assert_eq!(e.locate(1100, 1), None);
        assert_eq!(e.locate(u64::MAX, 1), None);
        // A hostile entry at the top of the address space does not wrap (found by fuzzing).
        let top = IomapEntry {
            offset: 0,
            sge: RsSge {
                addr: u64::MAX - 10,
                key: 1,
                length: 100,
            },
        };
        assert_eq!(top.locate(20, 1), None);
        assert_eq!(top.locate(0, 100), None);
    }
}
