//! Transport timer values from IBA.

use core::time::Duration;

/// Local ACK timeout: 4.096 µs × 2^`code` (IBA 9.7.6.1.3); code 0 disables the
/// timer (infinite wait).
pub fn ack_timeout(code: u8) -> Option<Duration> {
    if code == 0 {
        return None;
    }
    let code = u32::from(code.min(31));
    Some(Duration::from_nanos(4096u64 << code))
}

/// RNR NAK timer field values (IBA 9.7.5.2.8, table 46), in microseconds.
const RNR_TIMER_MICROS: [u32; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560, 3_840,
    5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840,
    245_760, 327_680, 491_520,
];

/// How long a requester waits after an RNR NAK carrying timer `code`.
pub fn rnr_delay(code: u8) -> Duration {
    Duration::from_micros(u64::from(RNR_TIMER_MICROS[usize::from(code & 0x1f)]))
}

/// An RNR retry count of 7 means retry forever (IBA 9.7.5.2.8).
pub const RNR_RETRY_INFINITE: u8 = 7;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timer_tables() {
        assert_eq!(ack_timeout(0), None);
        assert_eq!(ack_timeout(1), Some(Duration::from_nanos(8192)));
        assert_eq!(ack_timeout(14), Some(Duration::from_nanos(4096 << 14)));
        assert_eq!(
            rnr_delay(0),
            Duration::from_millis(655) + Duration::from_micros(360)
        );
        assert_eq!(rnr_delay(1), Duration::from_micros(10));
        assert_eq!(rnr_delay(12), Duration::from_micros(640));
        assert_eq!(rnr_delay(31), Duration::from_micros(491_520));
        // The table is increasing after entry 0.
        assert!(RNR_TIMER_MICROS[1..].windows(2).all(|w| w[0] < w[1]));
    }
}
