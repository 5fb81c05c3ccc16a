//! The rdma_cm private-data header (IBA Annex A11 "IP addressing CM private data";
//! Linux `struct cma_hdr`): the first 36 bytes of a REQ's or SIDR_REQ's private data
//! say which IP addresses and source port the connection is between. The destination
//! port is not here: it is the low 16 bits of the service ID.
//!
//! ```text
//!  0       1       2       3
//! | ver   |IPv|rsv| source port   |
//! | source IP (16 bytes; IPv4 = 12 zero bytes, then the address)  |
//! | destination IP (16 bytes, the same way)                       |
//! ```

use crate::field::{be16, Field};
use crate::{Error, Result};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Length of the header.
pub const CMA_HEADER_LEN: usize = 36;
/// The only header version rdma_cm sends and accepts.
pub const CMA_VERSION: u8 = 0;

mod field {
    use super::Field;
    pub const VERSION: usize = 0;
    /// IP version (7..4), reserved (3..0).
    pub const IP_VERSION: usize = 1;
    pub const SRC_PORT: Field = 2..4;
    pub const SRC_IP: Field = 4..20;
    pub const DST_IP: Field = 20..36;
}

crate::headers::header_view!(
    /// A view of the rdma_cm private-data header.
    CmaHeader,
    CMA_HEADER_LEN
);

impl<T: AsRef<[u8]>> CmaHeader<T> {
    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }
    /// Header version (0; Annex A11 splits it into major and minor nibbles).
    pub fn version(&self) -> u8 {
        self.b()[field::VERSION]
    }
    /// IP version nibble (4 or 6).
    pub fn ip_version(&self) -> u8 {
        self.b()[field::IP_VERSION] >> 4
    }
    /// The active side's source port.
    pub fn src_port(&self) -> u16 {
        be16(&self.b()[field::SRC_PORT])
    }
    /// The 16-byte source address field.
    pub fn src_field(&self) -> &[u8] {
        &self.b()[field::SRC_IP]
    }
    /// The 16-byte destination address field.
    pub fn dst_field(&self) -> &[u8] {
        &self.b()[field::DST_IP]
    }
}

/// The fields of the rdma_cm private-data header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmaHeaderRepr {
    /// The active side's IP address.
    pub src_ip: IpAddr,
    /// The active side's rdma_cm port.
    pub src_port: u16,
    /// The address the active side connects to.
    pub dst_ip: IpAddr,
}

fn ip_from_field(b: &[u8], v6: bool) -> IpAddr {
    if v6 {
        let mut a = [0u8; 16];
        a.copy_from_slice(&b[..16]);
        IpAddr::V6(Ipv6Addr::from(a))
    } else {
        IpAddr::V4(Ipv4Addr::new(b[12], b[13], b[14], b[15]))
    }
}

fn put_ip(b: &mut [u8], ip: IpAddr) {
    match ip {
        IpAddr::V4(a) => {
            b[..12].fill(0);
            b[12..16].copy_from_slice(&a.octets());
        }
        IpAddr::V6(a) => b[..16].copy_from_slice(&a.octets()),
    }
}

impl CmaHeaderRepr {
    /// Reads the header; a version other than 0 or an IP version other than 4 and 6
    /// is an error (Linux then treats the request as not IP-addressed).
    pub fn parse<T: AsRef<[u8]>>(h: &CmaHeader<T>) -> Result<CmaHeaderRepr> {
        if h.version() != CMA_VERSION {
            return Err(Error::InvalidField("CMA header version"));
        }
        let v6 = match h.ip_version() {
            4 => false,
            6 => true,
            _ => return Err(Error::InvalidField("CMA header IP version")),
        };
        Ok(CmaHeaderRepr {
            src_ip: ip_from_field(h.src_field(), v6),
            src_port: h.src_port(),
            dst_ip: ip_from_field(h.dst_field(), v6),
        })
    }

    /// Writes the header into the first 36 bytes of `buf`; both addresses must be of
    /// one family.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        let version = match (self.src_ip, self.dst_ip) {
            (IpAddr::V4(_), IpAddr::V4(_)) => 4,
            (IpAddr::V6(_), IpAddr::V6(_)) => 6,
            _ => return Err(Error::InvalidField("CMA header address families differ")),
        };
        let b = buf.get_mut(..CMA_HEADER_LEN).ok_or(Error::BufferTooSmall)?;
        b[field::VERSION] = CMA_VERSION;
        b[field::IP_VERSION] = version << 4;
        b[field::SRC_PORT].copy_from_slice(&self.src_port.to_be_bytes());
        put_ip(&mut b[field::SRC_IP], self.src_ip);
        put_ip(&mut b[field::DST_IP], self.dst_ip);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cm::vectors;

    #[test]
    fn the_sample_req_header() {
        // REQ private data starts at MAD offset 164.
        let h = CmaHeader::new_checked(&vectors::REQ[164..200]).unwrap();
        let r = CmaHeaderRepr::parse(&h).unwrap();
        assert_eq!(
            r,
            CmaHeaderRepr {
                src_ip: "192.0.2.1".parse().unwrap(),
                src_port: 40000,
                dst_ip: "192.0.2.2".parse().unwrap(),
            }
        );
        let mut out = [0xaau8; 36];
        r.emit(&mut out).unwrap();
        assert_eq!(out[..], vectors::REQ[164..200]);
    }

    #[test]
    fn ipv6_and_refusals() {
        let r = CmaHeaderRepr {
            src_ip: "2001:db8::1".parse().unwrap(),
            src_port: 1,
            dst_ip: "::1".parse().unwrap(),
        };
        let mut out = [0u8; 36];
        r.emit(&mut out).unwrap();
        assert_eq!(out[1], 0x60);
        assert_eq!(
            CmaHeaderRepr::parse(&CmaHeader::new_checked(&out[..]).unwrap()),
            Ok(r)
        );
        out[1] = 0x50;
        assert!(CmaHeaderRepr::parse(&CmaHeader::new_checked(&out[..]).unwrap()).is_err());
        out[1] = 0x60;
        out[0] = 1;
        assert!(CmaHeaderRepr::parse(&CmaHeader::new_checked(&out[..]).unwrap()).is_err());
        let mixed = CmaHeaderRepr {
            dst_ip: "127.0.0.1".parse().unwrap(),
            ..r
        };
        assert!(mixed.emit(&mut out).is_err());
        assert_eq!(CmaHeader::new_checked(&out[..35]), Err(Error::Truncated));
    }
}
