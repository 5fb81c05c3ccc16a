//! GIDs that name softverbs devices.
//!
//! A device is a UDP endpoint; its GID encodes the IP address and the UDP port so a
//! peer handed the GID out of band can reach it. With port 4791 an IPv4 device's
//! GID is the standard IPv4-mapped RoCEv2 GID `::ffff:a.b.c.d`. Other ports go in
//! bytes 8-9, which are zero in the standard mapping: `0:0:0:0:PORT:ffff:a.b.c.d`.
//! IPv6 devices use the address itself as GID and must listen on port 4791.
//!
//! Multicast GIDs (MGIDs) map the same way: `::ffff:239.1.2.3` is the RoCEv2
//! MGID of IPv4 group 239.1.2.3 (port 4791, as `rdma_join_multicast` makes
//! it), and `0:0:0:0:PORT:ffff:239.1.2.3` the group 239.1.2.3 on UDP port PORT,
//! which lets groups on one host use other ports than 4791 (which needs no
//! privilege but may be taken). See [`Gid::is_multicast`].

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The RoCEv2 UDP destination port (IANA).
pub const ROCE_PORT: u16 = 4791;

/// A 128-bit global identifier.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The GID of a device listening at `addr`, or `None` for an IPv6 address with
    /// a port other than 4791 (which a GID cannot carry).
    pub fn from_socket_addr(addr: SocketAddr) -> Option<Gid> {
        match addr.ip() {
            IpAddr::V4(ip) => {
                let mut g = [0u8; 16];
                if addr.port() != ROCE_PORT {
                    g[8..10].copy_from_slice(&addr.port().to_be_bytes());
                }
                g[10] = 0xff;
                g[11] = 0xff;
                g[12..].copy_from_slice(&ip.octets());
                Some(Gid(g))
            }
            IpAddr::V6(ip) => (addr.port() == ROCE_PORT).then_some(Gid(ip.octets())),
        }
    }

    /// The UDP endpoint this GID names.
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

    /// Whether this GID names an IP multicast group (an IPv4 multicast address
    /// in the IPv4-mapped form, or an IPv6 `ff00::/8` address).
    pub fn is_multicast(&self) -> bool {
        self.to_socket_addr().ip().is_multicast()
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
    fn standard_roce_gid() {
        let g = Gid::from_socket_addr("192.0.2.7:4791".parse().unwrap()).unwrap();
        assert_eq!(g.to_string(), "0000:0000:0000:0000:0000:ffff:c000:0207");
        assert_eq!(g.to_socket_addr(), "192.0.2.7:4791".parse().unwrap());
    }

    #[test]
    fn port_is_carried() {
        let a: SocketAddr = "127.0.0.1:23456".parse().unwrap();
        let g = Gid::from_socket_addr(a).unwrap();
        assert_eq!(g.to_socket_addr(), a);
        assert_ne!(g.interface_id(), 0);
    }

    #[test]
    fn multicast() {
        let g = Gid::from_socket_addr("239.1.2.3:4791".parse().unwrap()).unwrap();
        assert_eq!(g.to_string(), "0000:0000:0000:0000:0000:ffff:ef01:0203");
        assert!(g.is_multicast());
        let a: SocketAddr = "239.1.2.3:30000".parse().unwrap();
        assert_eq!(Gid::from_socket_addr(a).unwrap().to_socket_addr(), a);
        assert!(!Gid::from_socket_addr("127.0.0.1:4791".parse().unwrap())
            .unwrap()
            .is_multicast());
    }

    #[test]
    fn ipv6() {
        let a: SocketAddr = "[2001:db8::5]:4791".parse().unwrap();
        assert_eq!(Gid::from_socket_addr(a).unwrap().to_socket_addr(), a);
        assert!(Gid::from_socket_addr("[2001:db8::5]:5000".parse().unwrap()).is_none());
    }
}
