//! Median and p99 of sample sets.

use std::time::Duration;

#[derive(Clone, Copy, Debug)]
pub struct Stats {
    pub median: f64,
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
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

pub fn stats(v: &[f64]) -> Stats {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    Stats {
        median: percentile(&s, 0.5),
        p99: percentile(&s, 0.99),
    }
}

pub fn median(v: &[f64]) -> f64 {
    stats(v).median
}

/// The smallest sample (of rates: the slowest repetition); infinity for none.
pub fn min(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::INFINITY, f64::min)
}

pub fn ns(d: Duration) -> f64 {
    d.as_secs_f64() * 1e9
}
