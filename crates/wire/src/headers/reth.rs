//! RDMA Extended Transport Header (IBA 9.3.3, 16 bytes): virtual address, R_Key,
//! DMA length.

use super::header_view;
use crate::field::{be32, be64, Field};
use crate::{Error, Result, Rkey};

mod field {
    use super::Field;
    pub const VA: Field = 0..8;
    pub const RKEY: Field = 8..12;
    pub const DMA_LEN: Field = 12..16;
}

header_view!(
    /// A view of a RETH.
    Reth,
    16
);

impl<T: AsRef<[u8]>> Reth<T> {
    /// Remote virtual address.
    pub fn va(&self) -> u64 {
        be64(&self.buffer.as_ref()[field::VA])
    }
    /// Remote key.
    pub fn rkey(&self) -> Rkey {
        Rkey(be32(&self.buffer.as_ref()[field::RKEY]))
    }
    /// Length of the whole RDMA operation in bytes.
    pub fn dma_len(&self) -> u32 {
        be32(&self.buffer.as_ref()[field::DMA_LEN])
    }
}

/// The RETH's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RethRepr {
    /// Remote virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: Rkey,
    /// Length of the whole operation.
    pub dma_len: u32,
}

impl RethRepr {
    /// Reads the fields of a RETH.
    pub fn parse<T: AsRef<[u8]>>(h: &Reth<T>) -> RethRepr {
        RethRepr {
            va: h.va(),
            rkey: h.rkey(),
            dma_len: h.dma_len(),
        }
    }

    /// Writes the RETH into the first 16 bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        let b = buf.get_mut(..16).ok_or(Error::BufferTooSmall)?;
        b[field::VA].copy_from_slice(&self.va.to_be_bytes());
        b[field::RKEY].copy_from_slice(&self.rkey.0.to_be_bytes());
        b[field::DMA_LEN].copy_from_slice(&self.dma_len.to_be_bytes());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VECTOR: [u8; 16] = [
        0x00, 0x00, 0x7f, 0x12, 0x34, 0x56, 0x78, 0x00, // VA
        0xde, 0xad, 0xbe, 0xef, // R_Key
        0x00, 0x01, 0x00, 0x00, // DMA length 65536
    ];

    #[test]
    fn round_trip_vector() {
        let h = Reth::new_checked(&VECTOR[..]).unwrap();
        let r = RethRepr::parse(&h);
        assert_eq!(
            r,
            RethRepr {
                va: 0x7f12_3456_7800,
                rkey: Rkey(0xdead_beef),
                dma_len: 65536
            }
        );
        let mut out = [0u8; 16];
        r.emit(&mut out).unwrap();
        assert_eq!(out, VECTOR);
        assert_eq!(Reth::new_checked(&VECTOR[..15]), Err(Error::Truncated));
    }
}
