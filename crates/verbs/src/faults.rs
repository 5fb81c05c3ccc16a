//! Fault injection on the datagrams a device sends (SOFTVERBS_FAULTS), for tests of
//! real sockets under loss.

use crate::config::FaultConfig;

/// What to do with one outgoing datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Send it.
    Send,
    /// Drop it.
    Drop,
    /// Send it twice.
    Duplicate,
    /// Flip bit `bit` of byte `byte % len` and send it.
    Corrupt { byte: usize, bit: u8 },
    /// Hold it and send it after the next datagram.
    Reorder,
}

/// A seeded fault generator (xorshift64*: small, fast, reproducible).
pub struct FaultInjector {
    cfg: FaultConfig,
    state: u64,
}

impl FaultInjector {
    pub fn new(cfg: FaultConfig) -> Self {
        FaultInjector {
            cfg,
            state: cfg.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1,
        }
    }

    fn next(&mut self) -> u64 {
        let mut x = self.state;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.state = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && ((self.next() >> 11) as f64 / (1u64 << 53) as f64) < p
    }

    /// Decides a datagram's fate.
    pub fn decide(&mut self) -> Fate {
        if self.chance(self.cfg.loss) {
            Fate::Drop
        } else if self.chance(self.cfg.corrupt) {
            let r = self.next();
            Fate::Corrupt {
                byte: (r >> 8) as usize,
                bit: (r & 7) as u8,
            }
        } else if self.chance(self.cfg.duplicate) {
            Fate::Duplicate
        } else if self.chance(self.cfg.reorder) {
            Fate::Reorder
        } else {
            Fate::Send
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_roughly_honoured_and_reproducible() {
        let cfg = FaultConfig {
            loss: 0.1,
            duplicate: 0.0,
            reorder: 0.0,
            corrupt: 0.0,
            seed: 3,
        };
        let mut a = FaultInjector::new(cfg);
        let mut b = FaultInjector::new(cfg);
        let fates: Vec<Fate> = (0..10_000).map(|_| a.decide()).collect();
        assert_eq!(fates, (0..10_000).map(|_| b.decide()).collect::<Vec<_>>());
        let drops = fates.iter().filter(|f| **f == Fate::Drop).count();
        assert!((800..1200).contains(&drops), "{drops}");
        let mut none = FaultInjector::new(FaultConfig::default());
        assert!((0..1000).all(|_| none.decide() == Fate::Send));
    }
}
