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
//! privilege but may be taken). See [`Gid::is_multicast`]. The type is the wire crate's
//! (`softverbs_wire::Gid`): one definition for the engine, the cm and the API.

pub use softverbs_wire::gid::{Gid, ROCE_PORT};

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;

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
