//! Which bound addresses clash, and which listener a request's address picks (CM.md
//! 4.3; Linux `cma_check_port`, `cma_match_private_data`).

use crate::types::IdOptions;
use std::net::{IpAddr, SocketAddr};

/// An IPv4-mapped IPv6 address as the IPv4 address it is; anything else unchanged.
pub(crate) fn normalize_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// `addr` with its IP normalized.
pub(crate) fn normalize(addr: SocketAddr) -> SocketAddr {
    SocketAddr::new(normalize_ip(addr.ip()), addr.port())
}

/// Whether a wildcard or specific bound IP `bound` (with its options) covers a
/// request for `ip`: a wildcard covers its own family, and an IPv6 wildcard without
/// the AF-only option covers IPv4 too; a specific address covers itself.
pub(crate) fn covers(bound: IpAddr, options: &IdOptions, ip: IpAddr) -> bool {
    let (bound, ip) = (normalize_ip(bound), normalize_ip(ip));
    if !bound.is_unspecified() {
        return bound == ip;
    }
    match (bound, ip) {
        (IpAddr::V4(_), IpAddr::V4(_)) | (IpAddr::V6(_), IpAddr::V6(_)) => true,
        (IpAddr::V6(_), IpAddr::V4(_)) => !options.afonly,
        (IpAddr::V4(_), IpAddr::V6(_)) => false,
    }
}

/// Whether two ids bound to the same port in the same port space clash: one of them
/// is a wildcard covering the other's family, or the addresses are equal (Linux
/// `cma_check_port`); two ids that both allow reuse and neither listens never clash.
pub(crate) fn clash(
    a: IpAddr,
    a_options: &IdOptions,
    a_listens: bool,
    b: IpAddr,
    b_options: &IdOptions,
    b_listens: bool,
) -> bool {
    if a_options.reuse_addr && b_options.reuse_addr && !a_listens && !b_listens {
        return false;
    }
    let (na, nb) = (normalize_ip(a), normalize_ip(b));
    if na.is_unspecified() || nb.is_unspecified() {
        return covers(na, a_options, nb)
            || covers(nb, b_options, na)
            || (na.is_unspecified() && nb.is_unspecified() && na.is_ipv4() == nb.is_ipv4());
    }
    na == nb
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn wildcards_and_families() {
        let o = IdOptions::default();
        let afonly = IdOptions { afonly: true, ..o };
        assert!(covers(ip("0.0.0.0"), &o, ip("10.0.0.1")));
        assert!(!covers(ip("0.0.0.0"), &o, ip("::1")));
        assert!(covers(ip("::"), &o, ip("10.0.0.1")));
        assert!(!covers(ip("::"), &afonly, ip("10.0.0.1")));
        assert!(covers(ip("::ffff:10.0.0.1"), &o, ip("10.0.0.1")));
        assert!(!covers(ip("10.0.0.2"), &o, ip("10.0.0.1")));
    }

    #[test]
    fn clashes() {
        let o = IdOptions::default();
        let reuse = IdOptions {
            reuse_addr: true,
            ..o
        };
        assert!(clash(ip("127.0.0.1"), &o, true, ip("127.0.0.1"), &o, true));
        assert!(clash(ip("0.0.0.0"), &o, true, ip("127.0.0.1"), &o, false));
        assert!(!clash(ip("127.0.0.2"), &o, true, ip("127.0.0.1"), &o, true));
        assert!(clash(ip("::"), &o, true, ip("0.0.0.0"), &o, true));
        assert!(!clash(ip("::1"), &o, true, ip("127.0.0.1"), &o, true));
        assert!(!clash(
            ip("127.0.0.1"),
            &reuse,
            false,
            ip("127.0.0.1"),
            &reuse,
            false
        ));
        assert!(clash(
            ip("127.0.0.1"),
            &reuse,
            true,
            ip("127.0.0.1"),
            &reuse,
            false
        ));
    }
}
