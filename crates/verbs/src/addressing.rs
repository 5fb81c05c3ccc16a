//! How a softverbs device is addressed: its UDP endpoint, GID and LID.
//!
//! A device is one UDP endpoint (IP address, UDP port). Its GID is the endpoint in RoCEv2
//! form ([`Gid::from_socket_addr`]): at UDP port 4791 the standard IPv4-mapped
//! `::ffff:a.b.c.d`, which is what peers rebuild from the source address of a packet; at
//! any other port the port rides in GID bytes 8-9.
//!
//! # Where a device listens
//!
//! - Nothing configured: the device takes a loopback address of this process's own,
//!   `127.83.H.L` at UDP 4791, so its GID is standard and every process on the host has a
//!   different one. `H.L` is picked at random among [`LOOPBACK_LIDS`]; an address another
//!   process holds (bind fails) makes it try another. If none can be had (say, something
//!   holds `0.0.0.0:4791`), it falls back to `127.0.0.1` at a free port in 20000-49151.
//! - `SOFTVERBS_ADDR` alone: that address at 4791 if free, else at a free port in
//!   20000-49151 (several processes sharing one non-loopback address: the port-in-GID form).
//! - `SOFTVERBS_PORT` alone: `127.0.0.1` at that port; both: exactly that endpoint.
//!
//! # LIDs
//!
//! Programs that address peers by LID alone (no GRH) reach devices on the same host. A LID
//! (16 bits, unicast 1..=0xBFFF) names an endpoint:
//!
//! - `1..=0x0FFF` ([`LOOPBACK_LIDS`]): the loopback device `127.83.(LID >> 8).(LID & 0xff)`
//!   at UDP 4791.
//! - `0x1000..=0xBFFF`: the device at UDP port LID on the *base address*: the configured
//!   `SOFTVERBS_ADDR`, else `127.0.0.1` (port 4791 is LID 0x12B7).
//!
//! A device's own LID is the one that names it ([`lid_of`]); a device that no LID can name
//! (a port outside 4096-49151) has LID 0 and is reached by GID only.

use crate::gid::{Gid, ROCE_PORT};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::ops::RangeInclusive;

/// LIDs that name loopback devices `127.83.H.L:4791`.
pub const LOOPBACK_LIDS: RangeInclusive<u16> = 1..=0x0fff;
/// LIDs that name a UDP port on the base address.
pub const PORT_LIDS: RangeInclusive<u16> = 0x1000..=0xbfff;
/// The first two bytes of every loopback device address.
pub const LOOPBACK_NET: [u8; 2] = [127, 83];
/// Ports a device falls back to when its preferred endpoint is taken.
pub const FALLBACK_PORTS: RangeInclusive<u16> = 20000..=49151;

/// The loopback device address a LID of [`LOOPBACK_LIDS`] names.
pub fn loopback_addr(lid: u16) -> Option<SocketAddr> {
    LOOPBACK_LIDS.contains(&lid).then(|| {
        let [h, l] = lid.to_be_bytes();
        let [a, b] = LOOPBACK_NET;
        SocketAddr::new(IpAddr::V4(Ipv4Addr::new(a, b, h, l)), ROCE_PORT)
    })
}

/// The LID that names the device at `addr` (0: none does).
pub fn lid_of(addr: SocketAddr) -> u16 {
    if let IpAddr::V4(ip) = addr.ip() {
        let o = ip.octets();
        if o[..2] == LOOPBACK_NET && addr.port() == ROCE_PORT {
            let lid = u16::from_be_bytes([o[2], o[3]]);
            if LOOPBACK_LIDS.contains(&lid) {
                return lid;
            }
        }
    }
    if PORT_LIDS.contains(&addr.port()) {
        addr.port()
    } else {
        0
    }
}

/// The endpoint `lid` names for a device whose base address is `base` (see the module
/// documentation); `None` for LIDs that name nothing (0, multicast and reserved LIDs).
pub fn resolve_lid(lid: u16, base: IpAddr) -> Option<SocketAddr> {
    loopback_addr(lid).or_else(|| PORT_LIDS.contains(&lid).then(|| SocketAddr::new(base, lid)))
}

/// The base address LIDs of the port range resolve against: the configured address, else
/// 127.0.0.1.
pub fn base_addr(configured: Option<IpAddr>) -> IpAddr {
    configured.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
}

/// The GID of `addr` (all zero for an IPv6 endpoint off port 4791, which no GID names).
pub fn gid_of(addr: SocketAddr) -> Gid {
    Gid::from_socket_addr(addr).unwrap_or_default()
}

/// A small pseudo-random sequence for picking addresses and ports, different in every
/// process and call.
struct Picker(u64);

impl Picker {
    fn new() -> Picker {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Picker((u64::from(std::process::id()) << 32 ^ t) | 1)
    }

    fn next_in(&mut self, range: &RangeInclusive<u16>) -> u16 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let r = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32;
        let span = u64::from(range.end() - range.start()) + 1;
        range.start() + (r % span) as u16
    }
}

/// How many loopback addresses (then fallback ports) a device tries before it gives up.
const ATTEMPTS: usize = 64;

/// Why no endpoint could be bound.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// The configured endpoint could not be bound (in use, not a local address...).
    #[error("cannot bind {addr}: {source}")]
    Bind {
        /// The endpoint.
        addr: SocketAddr,
        /// What the kernel said.
        source: std::io::Error,
    },
    /// Every endpoint tried was taken.
    #[error("no free UDP endpoint: {tried} tried, the last {last}: {source}")]
    NoFreeEndpoint {
        /// How many were tried.
        tried: usize,
        /// The last one tried.
        last: SocketAddr,
        /// Why it failed.
        source: std::io::Error,
    },
}

/// Binds the device's socket as the module documentation describes.
pub fn bind(addr: Option<IpAddr>, port: Option<u16>) -> Result<UdpSocket, BindError> {
    let mut picker = Picker::new();
    match (addr, port) {
        (Some(ip), Some(port)) => exact(SocketAddr::new(ip, port)),
        (None, Some(port)) => exact(SocketAddr::new(base_addr(None), port)),
        (Some(ip), None) => {
            UdpSocket::bind(SocketAddr::new(ip, ROCE_PORT)).or_else(|_| any_port(ip, &mut picker))
        }
        (None, None) => {
            let mut tried = 0;
            while tried < ATTEMPTS {
                tried += 1;
                let Some(a) = loopback_addr(picker.next_in(&LOOPBACK_LIDS)) else {
                    continue;
                };
                if let Ok(s) = UdpSocket::bind(a) {
                    return Ok(s);
                }
            }
            any_port(base_addr(None), &mut picker)
        }
    }
}

fn exact(addr: SocketAddr) -> Result<UdpSocket, BindError> {
    UdpSocket::bind(addr).map_err(|source| BindError::Bind { addr, source })
}

/// A free port of [`FALLBACK_PORTS`] on `ip` (the port-in-GID form).
fn any_port(ip: IpAddr, picker: &mut Picker) -> Result<UdpSocket, BindError> {
    let mut last = None;
    for _ in 0..ATTEMPTS {
        let a = SocketAddr::new(ip, picker.next_in(&FALLBACK_PORTS));
        match UdpSocket::bind(a) {
            Ok(s) => return Ok(s),
            Err(e) => last = Some((a, e)),
        }
    }
    let (last, source) = last.expect("ATTEMPTS > 0");
    Err(BindError::NoFreeEndpoint {
        tried: ATTEMPTS,
        last,
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn loopback_lids_map_both_ways() {
        assert_eq!(loopback_addr(1), Some(sa("127.83.0.1:4791")));
        assert_eq!(loopback_addr(0x0abc), Some(sa("127.83.10.188:4791")));
        assert_eq!(loopback_addr(0), None);
        assert_eq!(loopback_addr(0x1000), None);
        for lid in LOOPBACK_LIDS {
            assert_eq!(lid_of(loopback_addr(lid).unwrap()), lid);
        }
        // The standard GID of a loopback device.
        assert_eq!(
            gid_of(sa("127.83.1.2:4791")).to_string(),
            "0000:0000:0000:0000:0000:ffff:7f53:0102"
        );
    }

    #[test]
    fn port_lids_name_the_base_address() {
        let base = IpAddr::from([10, 0, 0, 5]);
        assert_eq!(lid_of(sa("10.0.0.5:4791")), 4791);
        assert_eq!(resolve_lid(4791, base), Some(sa("10.0.0.5:4791")));
        assert_eq!(lid_of(sa("127.0.0.1:23456")), 23456);
        assert_eq!(
            resolve_lid(23456, base_addr(None)),
            Some(sa("127.0.0.1:23456"))
        );
        assert_eq!(resolve_lid(7, base), Some(sa("127.83.0.7:4791")));
        // LIDs that name nothing, and endpoints no LID names.
        assert_eq!(resolve_lid(0, base), None);
        assert_eq!(resolve_lid(0xc000, base), None);
        assert_eq!(resolve_lid(0xffff, base), None);
        assert_eq!(lid_of(sa("127.0.0.1:1000")), 0);
        assert_eq!(lid_of(sa("127.0.0.1:50000")), 0);
        assert_eq!(lid_of(sa("127.83.0.0:4791")), 4791);
    }

    #[test]
    fn default_binding_takes_distinct_loopback_addresses() {
        let a = bind(None, None).unwrap().local_addr().unwrap();
        let b = bind(None, None).unwrap().local_addr().unwrap();
        assert_ne!(a, b);
        for x in [a, b] {
            // Unless every loopback address was taken (then 127.0.0.1 and a free port).
            if x.port() == ROCE_PORT {
                assert!(LOOPBACK_LIDS.contains(&lid_of(x)), "{x}");
            } else {
                assert!(FALLBACK_PORTS.contains(&x.port()), "{x}");
            }
            assert_eq!(resolve_lid(lid_of(x), base_addr(None)), Some(x));
        }
    }

    #[test]
    fn a_taken_address_falls_back_to_a_port() {
        // Whoever holds 127.0.0.1:4791, the second binder gets a fallback port.
        let ip = IpAddr::from([127, 0, 0, 1]);
        let first = bind(Some(ip), None).unwrap();
        let second = bind(Some(ip), None).unwrap();
        let (a, b) = (first.local_addr().unwrap(), second.local_addr().unwrap());
        assert_ne!(a, b);
        assert!(FALLBACK_PORTS.contains(&b.port()), "{b}");
        assert_eq!(resolve_lid(lid_of(b), ip), Some(b));
    }
}
