//! Median and p99 of sample sets.

use std::time::Duration;

/// The median and 99th percentile of a sample set (NaN for no samples).
#[derive(Clone, Copy, Debug)]
pub struct Stats {
    /// The median.
    pub median: f64,
    /// The 99th percentile (nearest rank).
    pub p99: f64,
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            median: f64::NAN,
            p99: f64::NAN,
        }
    }
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    // The nearest rank, ceil(q * n), clamped to 1..=n: q is in 0..=1, so it is a whole
    // number from 0 to n, which a usize holds.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// The median and p99 of `v`.
pub fn stats(v: &[f64]) -> Stats {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    Stats {
        median: percentile(&s, 0.5),
        p99: percentile(&s, 0.99),
    }
}

/// The median of `v` (NaN for none).
pub fn median(v: &[f64]) -> f64 {
    stats(v).median
}

/// The smallest sample (of rates: the slowest repetition); infinity for none.
pub fn min(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::INFINITY, f64::min)
}

/// `d` in nanoseconds.
pub fn ns(d: Duration) -> f64 {
    d.as_secs_f64() * 1e9
}
