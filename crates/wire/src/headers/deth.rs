//! Datagram Extended Transport Header (IBA 9.3.2, 8 bytes): Q_Key, reserved byte,
//! source QP.

use super::header_view;
use crate::field::{be24, be32, put_be24};
use crate::{Error, Qkey, Qpn, Result};

header_view!(
    /// A view of a DETH.
    Deth,
    8
);

impl<T: AsRef<[u8]>> Deth<T> {
    /// Queue key.
    pub fn qkey(&self) -> Qkey {
        Qkey(be32(&self.buffer.as_ref()[0..4]))
    }
    /// Source QP.
    pub fn src_qp(&self) -> Qpn {
        Qpn::new(be24(&self.buffer.as_ref()[5..8]))
    }
}

/// The DETH's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DethRepr {
    /// Queue key.
    pub qkey: Qkey,
    /// Source QP.
    pub src_qp: Qpn,
}

impl DethRepr {
    /// Reads the fields.
    pub fn parse<T: AsRef<[u8]>>(h: &Deth<T>) -> DethRepr {
        DethRepr {
            qkey: h.qkey(),
            src_qp: h.src_qp(),
        }
    }

    /// Writes the header into the first 8 bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        let b = buf.get_mut(..8).ok_or(Error::BufferTooSmall)?;
        b[0..4].copy_from_slice(&self.qkey.0.to_be_bytes());
        b[4] = 0;
        put_be24(&mut b[5..8], self.src_qp.value());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_vector() {
        let v = [0x11, 0x11, 0x11, 0x11, 0x00, 0x00, 0x00, 0x2a];
        let r = DethRepr::parse(&Deth::new_checked(&v[..]).unwrap());
        assert_eq!(
            r,
            DethRepr {
                qkey: Qkey(0x1111_1111),
                src_qp: Qpn::new(42)
            }
        );
        let mut out = [0xffu8; 8];
        r.emit(&mut out).unwrap();
        assert_eq!(out, v);
        assert_eq!(Deth::new_checked(&v[..7]), Err(Error::Truncated));
    }
}
