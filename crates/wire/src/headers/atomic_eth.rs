//! Atomic Extended Transport Header (IBA 9.3.4, 28 bytes): virtual address, R_Key,
//! swap (or add) data, compare data.

use super::header_view;
use crate::field::{be32, be64, Field};
use crate::{Error, Result, Rkey};

mod field {
    use super::Field;
    pub const VA: Field = 0..8;
    pub const RKEY: Field = 8..12;
    pub const SWAP_ADD: Field = 12..20;
    pub const COMPARE: Field = 20..28;
}

header_view!(
    /// A view of an AtomicETH.
    AtomicEth,
    28
);

impl<T: AsRef<[u8]>> AtomicEth<T> {
    /// Remote virtual address (must be 8-byte aligned).
    pub fn va(&self) -> u64 {
        be64(&self.buffer.as_ref()[field::VA])
    }
    /// Remote key.
    pub fn rkey(&self) -> Rkey {
        Rkey(be32(&self.buffer.as_ref()[field::RKEY]))
    }
    /// Swap value (CmpSwap) or addend (FetchAdd).
    pub fn swap_add(&self) -> u64 {
        be64(&self.buffer.as_ref()[field::SWAP_ADD])
    }
    /// Compare value (CmpSwap only).
    pub fn compare(&self) -> u64 {
        be64(&self.buffer.as_ref()[field::COMPARE])
    }
}

/// The AtomicETH's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtomicEthRepr {
    /// Remote virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: Rkey,
    /// Swap value or addend.
    pub swap_add: u64,
    /// Compare value.
    pub compare: u64,
}

impl AtomicEthRepr {
    /// Reads the fields.
    pub fn parse<T: AsRef<[u8]>>(h: &AtomicEth<T>) -> AtomicEthRepr {
        AtomicEthRepr {
            va: h.va(),
            rkey: h.rkey(),
            swap_add: h.swap_add(),
            compare: h.compare(),
        }
    }

    /// Writes the header into the first 28 bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        let b = buf.get_mut(..28).ok_or(Error::BufferTooSmall)?;
        b[field::VA].copy_from_slice(&self.va.to_be_bytes());
        b[field::RKEY].copy_from_slice(&self.rkey.0.to_be_bytes());
        b[field::SWAP_ADD].copy_from_slice(&self.swap_add.to_be_bytes());
        b[field::COMPARE].copy_from_slice(&self.compare.to_be_bytes());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VECTOR: [u8; 28] = [
        0, 0, 0, 0, 0x10, 0, 0, 0x08, // VA
        0x00, 0x00, 0x01, 0x02, // R_Key
        0, 0, 0, 0, 0, 0, 0, 0x2a, // swap/add 42
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe, // compare
    ];

    #[test]
    fn round_trip_vector() {
        let r = AtomicEthRepr::parse(&AtomicEth::new_checked(&VECTOR[..]).unwrap());
        assert_eq!(
            r,
            AtomicEthRepr {
                va: 0x1000_0008,
                rkey: Rkey(0x102),
                swap_add: 42,
                compare: u64::MAX - 1
            }
        );
        let mut out = [0u8; 28];
        r.emit(&mut out).unwrap();
        assert_eq!(out, VECTOR);
        assert_eq!(AtomicEth::new_checked(&VECTOR[..27]), Err(Error::Truncated));
    }
}
