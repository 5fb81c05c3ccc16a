//! Time as the connection manager sees it: instants handed in by the caller, and the
//! IBA timer encodings the CM messages carry.
//!
//! The cm reads no clock. The driver converts its clock into [`Instant`] (the engine's
//! instant has the same representation: nanoseconds since an epoch the caller
//! picks); the simulator advances a virtual one.

use core::ops::{Add, Sub};
use core::time::Duration;

/// A point in time, in nanoseconds since an epoch chosen by the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Instant(u64);

impl Instant {
    /// The epoch itself.
    pub const ZERO: Instant = Instant(0);

    /// An instant `nanos` nanoseconds after the epoch.
    pub const fn from_nanos(nanos: u64) -> Self {
        Instant(nanos)
    }

    /// Nanoseconds since the epoch.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;
    fn add(self, rhs: Duration) -> Instant {
        let nanos = u64::try_from(rhs.as_nanos()).unwrap_or(u64::MAX);
        Instant(self.0.saturating_add(nanos))
    }
}

impl Sub<Instant> for Instant {
    type Output = Duration;
    fn sub(self, rhs: Instant) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(rhs.0))
    }
}

/// A CM timeout field (CM response timeout, service timeout, packet life time,
/// local ACK timeout) as a duration, the way Linux converts it: 4.096 us * 2^n is
/// rounded to 2^(n-8) ms, and anything below 2^8 becomes 1 ms (CM.md 2.8).
pub fn cm_timeout(code: u8) -> Duration {
    let code = code.min(31);
    Duration::from_millis(1u64 << code.saturating_sub(8))
}

/// The QP local ACK timeout a CM hands out for a path with `packet_life_time`
/// towards a CA whose ACK delay is `ca_ack_delay` (Linux `cm_ack_timeout`; CM.md
/// 3.5): about twice the packet life time, but no less than the ACK delay.
pub fn ack_timeout(ca_ack_delay: u8, packet_life_time: u8) -> u8 {
    let t = packet_life_time + 1;
    let t = if t >= ca_ack_delay {
        t + u8::from(ca_ack_delay >= t - 1)
    } else {
        ca_ack_delay + u8::from(t >= ca_ack_delay.saturating_sub(1))
    };
    t.min(31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linux_conversions() {
        assert_eq!(cm_timeout(18), Duration::from_millis(1024));
        assert_eq!(cm_timeout(20), Duration::from_millis(4096));
        assert_eq!(cm_timeout(24), Duration::from_millis(65536));
        assert_eq!(cm_timeout(3), Duration::from_millis(1));
        assert_eq!(ack_timeout(15, 18), 19);
        assert_eq!(ack_timeout(16, 18), 19);
        assert_eq!(ack_timeout(19, 18), 20);
        assert_eq!(ack_timeout(25, 18), 25);
        assert_eq!(ack_timeout(0, 30), 31);
        let t = Instant::from_nanos(5) + Duration::from_nanos(7);
        assert_eq!(t.as_nanos(), 12);
        assert_eq!(t - Instant::from_nanos(2), Duration::from_nanos(10));
        assert_eq!(Instant::ZERO - t, Duration::ZERO);
    }
}
