//! Immediate Data (IBA 9.3.6) and Invalidate Extended Transport Header (IBA 9.3.7):
//! each a single 4-byte field.
//!
//! Immediate data is opaque to the transport; verbs hands it to the application in
//! network byte order, so softverbs keeps it as the raw big-endian word.

use super::header_view;
use crate::field::be32;
use crate::Rkey;

header_view!(
    /// A view of an ImmDt header.
    ImmDt,
    4
);

impl<T: AsRef<[u8]>> ImmDt<T> {
    /// The immediate data as a big-endian number.
    pub fn imm(&self) -> u32 {
        be32(self.buffer.as_ref())
    }
}

header_view!(
    /// A view of an IETH.
    Ieth,
    4
);

impl<T: AsRef<[u8]>> Ieth<T> {
    /// The R_Key to invalidate.
    pub fn rkey(&self) -> Rkey {
        Rkey(be32(self.buffer.as_ref()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;

    #[test]
    fn vectors() {
        let v = [0xca, 0xfe, 0xba, 0xbe];
        assert_eq!(ImmDt::new_checked(&v[..]).unwrap().imm(), 0xcafe_babe);
        assert_eq!(Ieth::new_checked(&v[..]).unwrap().rkey(), Rkey(0xcafe_babe));
        assert_eq!(ImmDt::new_checked(&v[..3]), Err(Error::Truncated));
        assert_eq!(Ieth::new_checked(&v[..3]), Err(Error::Truncated));
    }
}
