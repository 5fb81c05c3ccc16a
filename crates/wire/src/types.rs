//! Small numeric newtypes of the transport: PSN, QPN, keys.

use core::fmt;

const MASK_24: u32 = 0x00ff_ffff;

/// A 24-bit packet sequence number that wraps (IBA 9.7.1).
///
/// Ordering between PSNs is only meaningful within half the sequence space:
/// [`Psn::before`] treats `a` as earlier than `b` when `b - a` (mod 2^24) lies in
/// `1..2^23`, which is the window IBA uses to tell duplicates from new packets
/// (IBA 9.7.5.1.1).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Psn(u32);

impl Psn {
    /// Half the PSN space: the largest distance at which ordering is defined.
    pub const HALF_SPACE: u32 = 1 << 23;

    /// A PSN from the low 24 bits of `v`.
    pub const fn new(v: u32) -> Self {
        Psn(v & MASK_24)
    }

    /// The PSN as a number in `0..2^24`.
    pub const fn value(self) -> u32 {
        self.0
    }

    /// The PSN `n` after this one, wrapping at 2^24.
    #[must_use]
    pub const fn add(self, n: u32) -> Self {
        Psn(self.0.wrapping_add(n) & MASK_24)
    }

    /// The PSN `n` before this one, wrapping at 2^24.
    #[must_use]
    pub const fn sub(self, n: u32) -> Self {
        Psn(self.0.wrapping_sub(n) & MASK_24)
    }

    /// The next PSN.
    #[must_use]
    pub const fn next(self) -> Self {
        self.add(1)
    }

    /// How far `later` is ahead of `self`, modulo 2^24.
    pub const fn distance_to(self, later: Psn) -> u32 {
        later.0.wrapping_sub(self.0) & MASK_24
    }

    /// Signed distance from `self` to `other` in `-2^23..2^23`.
    pub const fn signed_diff(self, other: Psn) -> i32 {
        // Shift the 24-bit difference into the top of an i32 and back to sign-extend.
        ((other.0.wrapping_sub(self.0) << 8) as i32) >> 8
    }

    /// Whether `self` comes strictly before `other` (within half the space).
    pub const fn before(self, other: Psn) -> bool {
        self.signed_diff(other) > 0
    }

    /// Whether `self` comes strictly after `other` (within half the space).
    pub const fn after(self, other: Psn) -> bool {
        other.before(self)
    }

    /// Whether `self` lies in the `len` PSNs starting at `start`.
    pub const fn in_window(self, start: Psn, len: u32) -> bool {
        start.distance_to(self) < len
    }
}

impl fmt::Debug for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Psn({})", self.0)
    }
}

impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A 24-bit queue pair number.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Qpn(u32);

impl Qpn {
    /// QP1, the general services interface that carries CM MADs.
    pub const GSI: Qpn = Qpn(1);
    /// The multicast QPN (IBA 9.2.3: destination QP 0xFFFFFF means multicast).
    pub const MULTICAST: Qpn = Qpn(MASK_24);

    /// A QPN from the low 24 bits of `v`.
    pub const fn new(v: u32) -> Self {
        Qpn(v & MASK_24)
    }

    /// The QPN as a number.
    pub const fn value(self) -> u32 {
        self.0
    }
}

impl fmt::Debug for Qpn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Qpn({:#x})", self.0)
    }
}

impl fmt::Display for Qpn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// A remote key naming registered memory (or a memory window) to a peer.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Rkey(pub u32);

impl fmt::Debug for Rkey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Rkey({:#010x})", self.0)
    }
}

/// A UD queue key (IBA 10.2.4). Keys with the top bit set are controlled Q_Keys.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Qkey(pub u32);

impl Qkey {
    /// Whether this is a controlled Q_Key (high-order bit set, IBA 10.2.4).
    pub const fn is_controlled(self) -> bool {
        self.0 & 0x8000_0000 != 0
    }
}

impl fmt::Debug for Qkey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Qkey({:#010x})", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn psn_wraps_at_24_bits() {
        assert_eq!(Psn::new(0xff_ffff).next(), Psn::new(0));
        assert_eq!(Psn::new(0).sub(1), Psn::new(0xff_ffff));
        assert_eq!(Psn::new(0x1ff_ffff).value(), 0xff_ffff);
    }

    #[test]
    fn psn_ordering_across_the_wrap() {
        let a = Psn::new(0xff_fff0);
        let b = Psn::new(0x10);
        assert!(a.before(b));
        assert!(b.after(a));
        assert!(!b.before(a));
        assert_eq!(a.signed_diff(b), 0x20);
        assert_eq!(b.signed_diff(a), -0x20);
        assert!(b.in_window(a, 0x21));
        assert!(!b.in_window(a, 0x20));
    }

    #[test]
    fn qkey_controlled_bit() {
        assert!(Qkey(0x8000_0000).is_controlled());
        assert!(!Qkey(0x1111_1111).is_controlled());
    }

    proptest! {
        #[test]
        fn psn_add_then_distance(start in 0u32..(1 << 24), n in 0u32..Psn::HALF_SPACE) {
            let a = Psn::new(start);
            let b = a.add(n);
            prop_assert_eq!(a.distance_to(b), n);
            prop_assert_eq!(a.signed_diff(b), n as i32);
            prop_assert_eq!(b.sub(n), a);
            prop_assert_eq!(a.before(b), n != 0);
        }
    }
}
