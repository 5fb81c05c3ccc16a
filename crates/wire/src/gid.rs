//! GIDs as RoCEv2 and softverbs use them: a 128-bit port address that, for RoCEv2, is
//! an IP address (IBA Annex A17.3: IPv4 addresses in the IPv4-mapped IPv6 form).
//!
//! A softverbs device is a UDP endpoint, so its GID also carries the UDP port when it
//! is not the RoCEv2 port 4791: an IPv4 device at port P != 4791 has the GID
//! `0:0:0:0:P:ffff:a.b.c.d` (bytes 8-9, zero in the standard form, hold P). IPv6
//! devices use their address and port 4791. This is the rule `softverbs::Gid` follows;
//! the connection manager writes these GIDs into REQs.

use core::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The RoCEv2 UDP destination port (IANA).
pub const ROCE_PORT: u16 = 4791;

/// A 128-bit global identifier, in wire order.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The all-zero GID (no address).
    pub const ZERO: Gid = Gid([0; 16]);

    /// The standard RoCEv2 GID of an IP address: `::ffff:a.b.c.d` for IPv4, the
    /// address itself for IPv6.
    pub fn from_ip(ip: IpAddr) -> Gid {
        match ip {
            IpAddr::V4(v4) => Gid(v4.to_ipv6_mapped().octets()),
            IpAddr::V6(v6) => Gid(v6.octets()),
        }
    }

    /// The GID of a device listening at `addr`, or `None` for an IPv6 address with
    /// a port other than 4791 (which a GID cannot carry).
    pub fn from_socket_addr(addr: SocketAddr) -> Option<Gid> {
        match addr.ip() {
            IpAddr::V4(ip) => {
                let mut g = Gid::from_ip(IpAddr::V4(ip)).0;
                if addr.port() != ROCE_PORT {
                    g[8..10].copy_from_slice(&addr.port().to_be_bytes());
                }
                Some(Gid(g))
            }
            IpAddr::V6(_) => (addr.port() == ROCE_PORT).then(|| Gid::from_ip(addr.ip())),
        }
    }

    /// The UDP endpoint this GID names (port 4791 unless the GID carries another).
    pub fn to_socket_addr(&self) -> SocketAddr {
        let g = &self.0;
        if g[..8] == [0; 8] && g[10..12] == [0xff, 0xff] {
            let port = u16::from_be_bytes([g[8], g[9]]);
            let port = if port == 0 { ROCE_PORT } else { port };
            SocketAddr::new(IpAddr::V4(Ipv4Addr::new(g[12], g[13], g[14], g[15])), port)
        } else {
            SocketAddr::new(IpAddr::V6(Ipv6Addr::from(*g)), ROCE_PORT)
        }
    }

    /// The IP address this GID names.
    pub fn ip(&self) -> IpAddr {
        self.to_socket_addr().ip()
    }

    /// Whether this GID names an IP multicast group (an IPv4 multicast address in the
    /// IPv4-mapped form, or an IPv6 `ff00::/8` address).
    pub fn is_multicast(&self) -> bool {
        self.ip().is_multicast()
    }

    /// The subnet prefix (bytes 0-7) in network order.
    pub fn subnet_prefix(&self) -> u64 {
        u64::from_be_bytes(self.0[..8].try_into().unwrap_or([0; 8]))
    }

    /// The interface id (bytes 8-15) in network order.
    pub fn interface_id(&self) -> u64 {
        u64::from_be_bytes(self.0[8..].try_into().unwrap_or([0; 8]))
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({self})")
    }
}

impl fmt::Display for Gid {
    /// The colon-separated form `ibv_devinfo` prints.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, pair) in self.0.chunks(2).enumerate() {
            if i > 0 {
                f.write_str(":")?;
            }
            write!(f, "{:02x}{:02x}", pair[0], pair[1])?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standard_and_port_carrying_forms() {
        let g = Gid::from_socket_addr("192.0.2.7:4791".parse().unwrap()).unwrap();
        assert_eq!(g.to_string(), "0000:0000:0000:0000:0000:ffff:c000:0207");
        assert_eq!(g, Gid::from_ip("192.0.2.7".parse().unwrap()));
        let a: SocketAddr = "127.0.0.1:23456".parse().unwrap();
        let g = Gid::from_socket_addr(a).unwrap();
        assert_eq!(g.to_socket_addr(), a);
        assert_eq!(g.ip(), a.ip());
        assert_eq!(&g.0[8..10], &23456u16.to_be_bytes());
    }

    #[test]
    fn ipv6() {
        let a: SocketAddr = "[2001:db8::5]:4791".parse().unwrap();
        assert_eq!(Gid::from_socket_addr(a).unwrap().to_socket_addr(), a);
        assert!(Gid::from_socket_addr("[2001:db8::5]:5000".parse().unwrap()).is_none());
    }
}
