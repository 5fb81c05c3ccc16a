//! Atomic Acknowledge Extended Transport Header (IBA 9.5.3, 8 bytes): the value the
//! remote location held before the atomic operation.

use super::header_view;
use crate::field::be64;
use crate::{Error, Result};

header_view!(
    /// A view of an AtomicAckETH.
    AtomicAckEth,
    8
);

impl<T: AsRef<[u8]>> AtomicAckEth<T> {
    /// Original remote data.
    pub fn orig(&self) -> u64 {
        be64(self.buffer.as_ref())
    }
}

/// The AtomicAckETH's field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtomicAckEthRepr {
    /// Original remote data.
    pub orig: u64,
}

impl AtomicAckEthRepr {
    /// Reads the field.
    pub fn parse<T: AsRef<[u8]>>(h: &AtomicAckEth<T>) -> AtomicAckEthRepr {
        AtomicAckEthRepr { orig: h.orig() }
    }

    /// Writes the header into the first 8 bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        buf.get_mut(..8)
            .ok_or(Error::BufferTooSmall)?
            .copy_from_slice(&self.orig.to_be_bytes());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_vector() {
        let v = [0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef];
        let r = AtomicAckEthRepr::parse(&AtomicAckEth::new_checked(&v[..]).unwrap());
        assert_eq!(r.orig, 0x0123_4567_89ab_cdef);
        let mut out = [0u8; 8];
        r.emit(&mut out).unwrap();
        assert_eq!(out, v);
        assert_eq!(AtomicAckEth::new_checked(&v[..7]), Err(Error::Truncated));
    }
}
