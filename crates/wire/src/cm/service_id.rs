//! rdma_cm service IDs: how an IP port space and port become a 64-bit IB service ID
//! (IBA Annex A11 "RDMA IP CM Service"; Linux `rdma_get_service_id`).
//!
//! Service ID = (port space << 16) | port. The port spaces TCP (0x0106) and UDP
//! (0x0111) give the Annex A11 pattern 0x0000000001PP_xxxx, PP being the IP protocol
//! number, which Wireshark shows as "IP CM ServiceID".

use core::fmt;

/// An rdma_cm port space (`enum rdma_port_space`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PortSpace {
    /// RDMA_PS_IPOIB: UD over an IPoIB device; refused on RoCE.
    Ipoib,
    /// RDMA_PS_TCP: reliable connections (RC).
    Tcp,
    /// RDMA_PS_UDP: unreliable datagrams (UD, service ID resolution).
    Udp,
    /// RDMA_PS_IB: RC or UD, chosen per id.
    Ib,
}

impl PortSpace {
    /// The port space's number.
    pub const fn value(self) -> u16 {
        match self {
            PortSpace::Ipoib => 0x0002,
            PortSpace::Tcp => 0x0106,
            PortSpace::Udp => 0x0111,
            PortSpace::Ib => 0x013f,
        }
    }

    /// The port space a number names.
    pub const fn from_value(v: u16) -> Option<PortSpace> {
        match v {
            0x0002 => Some(PortSpace::Ipoib),
            0x0106 => Some(PortSpace::Tcp),
            0x0111 => Some(PortSpace::Udp),
            0x013f => Some(PortSpace::Ib),
            _ => None,
        }
    }
}

/// A 64-bit IB service ID.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct ServiceId(pub u64);

impl ServiceId {
    /// The service ID rdma_cm listens on for `port` in `space`.
    pub const fn rdma_cm(space: PortSpace, port: u16) -> ServiceId {
        ServiceId(((space.value() as u64) << 16) | port as u64)
    }

    /// The rdma_cm port space and port this service ID stands for, or `None` if it
    /// is not an rdma_cm service ID (high 32 bits set, or an unknown port space).
    pub const fn rdma_cm_port(self) -> Option<(PortSpace, u16)> {
        if self.0 >> 32 != 0 {
            return None;
        }
        match PortSpace::from_value((self.0 >> 16) as u16) {
            Some(space) => Some((space, self.0 as u16)),
            None => None,
        }
    }
}

impl fmt::Debug for ServiceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ServiceId({:#018x})", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_spaces_and_ports() {
        assert_eq!(
            ServiceId::rdma_cm(PortSpace::Tcp, 7174),
            ServiceId(0x0000_0000_0106_1c06)
        );
        assert_eq!(
            ServiceId(0x0000_0000_0111_1c06).rdma_cm_port(),
            Some((PortSpace::Udp, 7174))
        );
        for ps in [
            PortSpace::Ipoib,
            PortSpace::Tcp,
            PortSpace::Udp,
            PortSpace::Ib,
        ] {
            assert_eq!(PortSpace::from_value(ps.value()), Some(ps));
            assert_eq!(
                ServiceId::rdma_cm(ps, 65535).rdma_cm_port(),
                Some((ps, 65535))
            );
        }
        assert_eq!(ServiceId(0x0001_0000_0106_0001).rdma_cm_port(), None);
        assert_eq!(ServiceId(0x0000_0000_0107_0001).rdma_cm_port(), None);
    }
}
