//! What the measuring programs of `bench/` share: a small option parser, the
//! process's CPU time, and a loop that runs an operation for a given time.
//!
//! The programs (`src/bin/`) print `key=value` lines on stdout so the scripts
//! read them with one `awk`; anything else goes to stderr.

use std::str::FromStr;
use std::time::{Duration, Instant};

/// An error that ends a program with a message and exit status 1.
#[derive(Debug)]
pub struct Error(pub String);

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Error {
        Error(e.to_string())
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// Builds an [`Error`] from a format string.
#[macro_export]
macro_rules! error {
    ($($t:tt)*) => { $crate::Error(format!($($t)*)) };
}

/// `--name value` options, taken one by one; whatever is left is refused.
#[derive(Debug)]
pub struct Options {
    args: Vec<String>,
}

impl Options {
    pub fn new(args: impl IntoIterator<Item = String>) -> Options {
        Options {
            args: args.into_iter().collect(),
        }
    }

    /// Whether the bare flag `name` is present (and takes it out).
    pub fn flag(&mut self, name: &str) -> bool {
        match self.args.iter().position(|a| a == name) {
            Some(i) => {
                self.args.remove(i);
                true
            }
            None => false,
        }
    }

    /// The value after `name`, parsed, or `default` when `name` is absent.
    pub fn value<T: FromStr>(&mut self, name: &str, default: T) -> Result<T> {
        let Some(i) = self.args.iter().position(|a| a == name) else {
            return Ok(default);
        };
        if i + 1 >= self.args.len() {
            return Err(error!("{name} needs a value"));
        }
        let v = self.args.remove(i + 1);
        self.args.remove(i);
        v.parse()
            .map_err(|_| error!("{name}: cannot use {v:?} as a value"))
    }

    /// Fails on anything not taken yet.
    pub fn finish(self) -> Result<()> {
        match self.args.first() {
            None => Ok(()),
            Some(a) => Err(error!("unknown argument {a:?} (try --help)")),
        }
    }
}

/// A duration in seconds as given on the command line (`0.5`, `3`).
pub fn seconds(secs: f64) -> Result<Duration> {
    if !(secs.is_finite() && secs > 0.0 && secs <= 3600.0) {
        return Err(error!("a duration must be between 0 and 3600 seconds"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// User plus system CPU seconds this process has used so far (all its threads).
pub fn cpu_seconds() -> f64 {
    // SAFETY: getrusage writes one rusage into the zeroed struct we own;
    // all-zero is a valid rusage.
    let usage = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        u
    };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// How many times an operation ran and for how long.
#[derive(Debug, Clone, Copy)]
pub struct Timed {
    pub iterations: u64,
    pub elapsed: Duration,
}

impl Timed {
    /// Bytes per second in units of 10^9, for `bytes` moved per iteration.
    pub fn gb_per_sec(&self, bytes: usize) -> f64 {
        self.iterations as f64 * bytes as f64 / self.elapsed.as_secs_f64() / 1e9
    }
}

/// Runs `op` over and over for `warmup` (not counted), then for at least `span`;
/// the clock is read once per 64 calls so it costs next to nothing.
pub fn run_for(
    warmup: Duration,
    span: Duration,
    mut op: impl FnMut() -> Result<()>,
) -> Result<Timed> {
    let until = Instant::now() + warmup;
    while Instant::now() < until {
        for _ in 0..64 {
            op()?;
        }
    }
    let start = Instant::now();
    let mut iterations = 0u64;
    loop {
        for _ in 0..64 {
            op()?;
        }
        iterations += 64;
        let elapsed = start.elapsed();
        if elapsed >= span {
            return Ok(Timed {
                iterations,
                elapsed,
            });
        }
    }
}

/// The byte at `i` of the pattern numbered `round`: different for every round
/// and position, so a copy that did not happen (or landed shifted) shows.
pub fn pattern_byte(round: u64, i: usize) -> u8 {
    (round
        .wrapping_mul(131)
        .wrapping_add(i as u64 * 7 + i as u64 / 251)
        % 251) as u8
}

/// Fills `buf` with pattern `round`.
pub fn fill_pattern(buf: &mut [u8], round: u64) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = pattern_byte(round, i);
    }
}

/// Whether `buf` holds pattern `round`.
pub fn holds_pattern(buf: &[u8], round: u64) -> bool {
    buf.iter()
        .enumerate()
        .all(|(i, &b)| b == pattern_byte(round, i))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(s: &str) -> Options {
        Options::new(s.split_whitespace().map(String::from))
    }

    #[test]
    fn options_take_values_flags_and_refuse_the_rest() {
        let mut o = opts("--size 4096 --quiet --secs 0.5");
        assert!(o.flag("--quiet"));
        assert!(!o.flag("--loud"));
        assert_eq!(o.value("--size", 1usize).unwrap(), 4096);
        assert_eq!(o.value("--secs", 1.0f64).unwrap(), 0.5);
        assert_eq!(o.value("--segments", 15u32).unwrap(), 15);
        o.finish().unwrap();

        let mut o = opts("--size");
        assert!(o
            .value("--size", 1usize)
            .unwrap_err()
            .0
            .contains("needs a value"));
        let mut o = opts("--size big");
        assert!(o.value("--size", 1usize).unwrap_err().0.contains("\"big\""));
        let e = opts("--what 3").finish().unwrap_err();
        assert!(e.0.contains("--what"), "{e}");
    }

    #[test]
    fn durations_are_bounded() {
        assert!(seconds(0.0).is_err());
        assert!(seconds(-1.0).is_err());
        assert!(seconds(f64::NAN).is_err());
        assert!(seconds(1e9).is_err());
        assert_eq!(seconds(0.25).unwrap(), Duration::from_millis(250));
    }

    #[test]
    fn patterns_differ_between_rounds_and_detect_a_shift() {
        let mut a = vec![0u8; 4096];
        fill_pattern(&mut a, 3);
        assert!(holds_pattern(&a, 3));
        assert!(!holds_pattern(&a, 4));
        // The same bytes one position later are not the pattern.
        let shifted: Vec<u8> = std::iter::once(0)
            .chain(a[..4095].iter().copied())
            .collect();
        assert!(!holds_pattern(&shifted, 3));
    }

    #[test]
    fn run_for_counts_whole_batches_and_stops_on_error() {
        let mut n = 0u64;
        let t = run_for(Duration::ZERO, Duration::from_millis(1), || {
            n += 1;
            Ok(())
        })
        .unwrap();
        assert_eq!(t.iterations % 64, 0);
        assert_eq!(t.iterations, n);
        assert!(t.gb_per_sec(1) > 0.0);

        let mut left = 10;
        let e = run_for(Duration::ZERO, Duration::from_secs(60), || {
            left -= 1;
            if left == 0 {
                Err(error!("stop"))
            } else {
                Ok(())
            }
        })
        .unwrap_err();
        assert_eq!(e.0, "stop");
    }
}
