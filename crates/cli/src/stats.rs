//! Summary statistics of latency samples and bandwidth runs.

/// Latency summary in microseconds (the columns of perftest's ib_*_lat).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatStats {
    pub min: f64,
    pub max: f64,
    /// The median.
    pub typical: f64,
    pub avg: f64,
    pub stdev: f64,
    pub p99: f64,
    pub p999: f64,
}

/// Nearest-rank percentile of sorted samples (`p` in 0..=1).
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Summarises samples (sorts them).
pub fn lat_stats(samples: &mut [f64]) -> LatStats {
    samples.sort_by(|a, b| a.total_cmp(b));
    let n = samples.len().max(1) as f64;
    let avg = samples.iter().sum::<f64>() / n;
    let var = samples.iter().map(|x| (x - avg) * (x - avg)).sum::<f64>() / n;
    LatStats {
        min: samples.first().copied().unwrap_or(0.0),
        max: samples.last().copied().unwrap_or(0.0),
        typical: percentile(samples, 0.5),
        avg,
        stdev: var.sqrt(),
        p99: percentile(samples, 0.99),
        p999: percentile(samples, 0.999),
    }
}

/// The best rate over any stretch covering at least `window` messages, from
/// `(seconds since start, messages completed)` samples in time order.
pub fn peak_rate(samples: &[(f64, u64)], window: u64) -> f64 {
    let mut best = 0.0f64;
    let mut j = 0;
    for k in 1..samples.len() {
        let (tk, ck) = samples[k];
        // Move the window start as far right as the window allows.
        while j + 1 < k && ck - samples[j + 1].1 >= window {
            j += 1;
        }
        let (tj, cj) = samples[j];
        if ck - cj >= window && tk > tj {
            best = best.max((ck - cj) as f64 / (tk - tj));
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_summary() {
        let mut s: Vec<f64> = (1..=1000).map(|x| x as f64).collect();
        s.reverse();
        let st = lat_stats(&mut s);
        assert_eq!((st.min, st.max, st.typical), (1.0, 1000.0, 500.0));
        assert_eq!((st.p99, st.p999), (990.0, 999.0));
        assert!((st.avg - 500.5).abs() < 1e-9);
        assert!((st.stdev - 288.675).abs() < 1e-2);
        let one = lat_stats(&mut [3.0]);
        assert_eq!((one.min, one.p999, one.stdev), (3.0, 3.0, 0.0));
    }

    #[test]
    fn peak_finds_the_fast_stretch() {
        // 10 messages per second, then 100 per second for one second.
        let mut s = vec![(0.0, 0)];
        for i in 1..=10 {
            s.push((i as f64, i * 10));
        }
        s.push((11.0, 200));
        let p = peak_rate(&s, 50);
        assert!((p - 100.0).abs() < 1e-9, "{p}");
        assert_eq!(peak_rate(&s, 1000), 0.0);
    }
}
