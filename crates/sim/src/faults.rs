//! What the simulated network does to datagrams: loss, duplication, reordering,
//! corruption and delay.

use core::fmt;
use core::time::Duration;
use rand::Rng;

/// How a link treats the datagrams crossing it.
///
/// Every probability is drawn independently per datagram from the simulator's
/// seeded generator, so a run is reproducible from its seed.
///
/// - `loss`: the datagram vanishes.
/// - `reorder`: the datagram gets an extra random delay of up to
///   `reorder_delay`, so datagrams sent after it can overtake it.
/// - `corrupt`: 1 to 3 distinct random bits anywhere in the datagram are
///   flipped (a receiver's ICRC check must catch it).
/// - `duplicate`: a second copy arrives up to `duplicate_delay` after the
///   first. Each copy is corrupted (or not) independently.
///
/// Every datagram that is not lost takes `delay` plus a uniformly random
/// `0..=jitter` to arrive.
///
/// Two optional models make losses and timing more like a real path:
///
/// - `burst`: losses come in bursts (a Gilbert-Elliott channel): the link is
///   in a good state, where it loses `loss`, or a bad one, where it loses
///   [`Burst::loss`]; it moves between them by chance, per datagram.
/// - `rate`: the link carries `rate` bytes per second, one datagram after the
///   other: a datagram waits for those before it to be serialised, then takes
///   its own length at that rate, then `delay`. With `queue_limit`, a datagram
///   that finds more than that many bytes waiting is dropped (a full queue).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Faults {
    /// Probability (0..=1) that a datagram is dropped.
    pub loss: f64,
    /// Probability (0..=1) that a datagram is delivered twice.
    pub duplicate: f64,
    /// Probability (0..=1) that a datagram is held back by an extra delay.
    pub reorder: f64,
    /// Probability (0..=1) that a delivered copy has 1..=3 bits flipped.
    pub corrupt: f64,
    /// Base one-way delay.
    pub delay: Duration,
    /// Largest random delay added to `delay` (uniform in `0..=jitter`).
    pub jitter: Duration,
    /// Largest extra delay a reordered datagram gets (uniform in `1ns..=reorder_delay`).
    pub reorder_delay: Duration,
    /// Largest gap between a datagram and its duplicate (uniform in `1ns..=duplicate_delay`).
    pub duplicate_delay: Duration,
    /// Bursty loss (a Gilbert-Elliott channel), if any.
    pub burst: Option<Burst>,
    /// Link rate in bytes per second (0: infinite, every datagram leaves at once).
    pub rate: u64,
    /// Bytes the link's queue holds, the datagram being serialised included: one
    /// that would take it past this is dropped (0: no limit). Only meaningful
    /// with a `rate`.
    pub queue_limit: usize,
}

/// A Gilbert-Elliott loss model: the good state loses [`Faults::loss`], the bad
/// state `loss`; before each datagram the link moves from good to bad with
/// probability `enter` and from bad to good with probability `leave`. The mean
/// burst is `1 / leave` datagrams long.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Burst {
    /// Probability (0..=1) of moving from the good to the bad state.
    pub enter: f64,
    /// Probability (0..=1) of moving from the bad to the good state.
    pub leave: f64,
    /// Probability (0..=1) that a datagram is lost in the bad state.
    pub loss: f64,
}

impl Burst {
    /// The long-run share of datagrams lost, with `good_loss` in the good state.
    pub fn mean_loss(&self, good_loss: f64) -> f64 {
        let bad_share = if self.enter + self.leave > 0.0 {
            self.enter / (self.enter + self.leave)
        } else {
            0.0
        };
        bad_share * self.loss + (1.0 - bad_share) * good_loss
    }
}

/// The base one-way delay of the presets.
pub const DEFAULT_DELAY: Duration = Duration::from_micros(10);
/// The largest extra delay of a reordered datagram in the presets.
pub const DEFAULT_REORDER_DELAY: Duration = Duration::from_micros(50);
/// The largest gap between a datagram and its duplicate in the presets.
pub const DEFAULT_DUPLICATE_DELAY: Duration = Duration::from_micros(20);
/// The jitter of [`Faults::chaos`].
pub const CHAOS_JITTER: Duration = Duration::from_micros(5);

impl Faults {
    /// A perfect link: nothing lost, duplicated, reordered or corrupted; every
    /// datagram takes exactly [`DEFAULT_DELAY`].
    pub const fn none() -> Self {
        Faults {
            loss: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            corrupt: 0.0,
            delay: DEFAULT_DELAY,
            jitter: Duration::ZERO,
            reorder_delay: DEFAULT_REORDER_DELAY,
            duplicate_delay: DEFAULT_DUPLICATE_DELAY,
            burst: None,
            rate: 0,
            queue_limit: 0,
        }
    }

    /// A link that only loses datagrams, with probability `loss`.
    pub const fn lossy(loss: f64) -> Self {
        Faults {
            loss,
            ..Faults::none()
        }
    }

    /// A hostile link: probability `loss` of loss, plus 5 % duplication,
    /// 5 % reordering, 1 % corruption and [`CHAOS_JITTER`] of jitter.
    pub const fn chaos(loss: f64) -> Self {
        Faults {
            loss,
            duplicate: 0.05,
            reorder: 0.05,
            corrupt: 0.01,
            jitter: CHAOS_JITTER,
            ..Faults::none()
        }
    }

    /// The same faults with loss probability `p`.
    pub const fn with_loss(self, p: f64) -> Self {
        Faults { loss: p, ..self }
    }

    /// The same faults with duplication probability `p`.
    pub const fn with_duplicate(self, p: f64) -> Self {
        Faults {
            duplicate: p,
            ..self
        }
    }

    /// The same faults with reordering probability `p`.
    pub const fn with_reorder(self, p: f64) -> Self {
        Faults { reorder: p, ..self }
    }

    /// The same faults with corruption probability `p`.
    pub const fn with_corrupt(self, p: f64) -> Self {
        Faults { corrupt: p, ..self }
    }

    /// The same faults with base one-way delay `delay`.
    pub const fn with_delay(self, delay: Duration) -> Self {
        Faults { delay, ..self }
    }

    /// The same faults with jitter `jitter`.
    pub const fn with_jitter(self, jitter: Duration) -> Self {
        Faults { jitter, ..self }
    }

    /// The same faults with losses in bursts (see [`Burst`]).
    pub const fn with_burst(self, burst: Burst) -> Self {
        Faults {
            burst: Some(burst),
            ..self
        }
    }

    /// The same faults on a link of `rate` bytes per second that drops datagrams
    /// finding more than `queue_limit` bytes waiting (0: no limit).
    pub const fn with_rate(self, rate: u64, queue_limit: usize) -> Self {
        Faults {
            rate,
            queue_limit,
            ..self
        }
    }

    /// Checks that every probability lies in `0..=1`.
    pub fn validate(&self) -> Result<(), InvalidFaults> {
        let fields = [
            ("loss", self.loss),
            ("duplicate", self.duplicate),
            ("reorder", self.reorder),
            ("corrupt", self.corrupt),
            ("burst.enter", self.burst.map_or(0.0, |b| b.enter)),
            ("burst.leave", self.burst.map_or(0.0, |b| b.leave)),
            ("burst.loss", self.burst.map_or(0.0, |b| b.loss)),
        ];
        for (field, value) in fields {
            if !(0.0..=1.0).contains(&value) {
                return Err(InvalidFaults { field, value });
            }
        }
        Ok(())
    }
}

impl Default for Faults {
    /// [`Faults::none`].
    fn default() -> Self {
        Faults::none()
    }
}

/// A [`Faults`] probability outside `0..=1` (or NaN).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct InvalidFaults {
    /// The name of the offending field.
    pub field: &'static str,
    /// Its value.
    pub value: f64,
}

impl fmt::Display for InvalidFaults {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "fault probability `{}` is {}, not within 0..=1",
            self.field, self.value
        )
    }
}

impl std::error::Error for InvalidFaults {}

/// Draws `true` with probability `p` (already validated to lie in `0..=1`).
///
/// Draws nothing from `rng` when `p` is zero, so turning a fault off does not
/// shift the random stream of links where it is on.
pub(crate) fn chance<R: Rng>(rng: &mut R, p: f64) -> bool {
    p > 0.0 && rng.gen_bool(p)
}

/// A uniformly random duration in `0..=max`.
pub(crate) fn up_to<R: Rng>(rng: &mut R, max: Duration) -> Duration {
    let max = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX);
    if max == 0 {
        Duration::ZERO
    } else {
        Duration::from_nanos(rng.gen_range(0..=max))
    }
}

/// A uniformly random duration in `1ns..=max` (exactly 1 ns if `max` is shorter).
pub(crate) fn positive_up_to<R: Rng>(rng: &mut R, max: Duration) -> Duration {
    let max = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX).max(1);
    Duration::from_nanos(rng.gen_range(1..=max))
}

/// Flips 1..=3 distinct random bits of `data` (fewer if it has fewer bits).
/// Returns how many bits were flipped (zero only for an empty datagram).
pub(crate) fn flip_bits<R: Rng>(rng: &mut R, data: &mut [u8]) -> usize {
    let bits = data.len().saturating_mul(8);
    if bits == 0 {
        return 0;
    }
    let count = rng.gen_range(1..=3usize).min(bits);
    let mut chosen = [usize::MAX; 3];
    for slot in 0..count {
        let bit = loop {
            let candidate = rng.gen_range(0..bits);
            if !chosen[..slot].contains(&candidate) {
                break candidate;
            }
        };
        chosen[slot] = bit;
        data[bit / 8] ^= 1 << (bit % 8);
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    #[test]
    fn presets_are_valid() {
        assert_eq!(Faults::none().validate(), Ok(()));
        assert_eq!(Faults::lossy(0.3).validate(), Ok(()));
        assert_eq!(Faults::chaos(0.1).validate(), Ok(()));
        assert_eq!(Faults::default(), Faults::none());
        let chaos = Faults::chaos(0.2);
        assert_eq!(chaos.loss, 0.2);
        assert_eq!(chaos.duplicate, 0.05);
        assert_eq!(chaos.reorder, 0.05);
        assert_eq!(chaos.corrupt, 0.01);
        assert!(chaos.jitter > Duration::ZERO);
    }

    #[test]
    fn out_of_range_probabilities_are_rejected() {
        let err = Faults::lossy(1.5).validate().unwrap_err();
        assert_eq!(err.field, "loss");
        assert!(Faults::none().with_corrupt(-0.1).validate().is_err());
        assert!(Faults::none().with_reorder(f64::NAN).validate().is_err());
        assert!(Faults::none().with_duplicate(1.0).validate().is_ok());
        assert!(err.to_string().contains("loss"));
    }

    #[test]
    fn flip_bits_flips_one_to_three_distinct_bits() {
        let mut rng = SmallRng::seed_from_u64(7);
        let mut seen = [false; 4];
        for len in [1usize, 2, 5, 64, 4224] {
            for _ in 0..200 {
                let original: Vec<u8> = (0..len).map(|i| i as u8).collect();
                let mut data = original.clone();
                let n = flip_bits(&mut rng, &mut data);
                let distance: u32 = original
                    .iter()
                    .zip(&data)
                    .map(|(a, b)| (a ^ b).count_ones())
                    .sum();
                assert!((1..=3).contains(&n));
                assert_eq!(distance as usize, n);
                seen[n] = true;
            }
        }
        assert!(seen[1] && seen[2] && seen[3]);
        assert_eq!(flip_bits(&mut rng, &mut []), 0);
    }

    #[test]
    fn random_durations_stay_in_range() {
        let mut rng = SmallRng::seed_from_u64(1);
        let max = Duration::from_nanos(10);
        for _ in 0..1000 {
            assert!(up_to(&mut rng, max) <= max);
            let d = positive_up_to(&mut rng, max);
            assert!(d >= Duration::from_nanos(1) && d <= max);
        }
        assert_eq!(up_to(&mut rng, Duration::ZERO), Duration::ZERO);
        assert_eq!(
            positive_up_to(&mut rng, Duration::ZERO),
            Duration::from_nanos(1)
        );
        assert!(!chance(&mut rng, 0.0));
        assert!(chance(&mut rng, 1.0));
    }
}
