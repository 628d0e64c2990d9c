//! Per-QP token buckets: one on WQEs, one on payload bytes.

use crate::nic::RateLimit;
use std::time::{Duration, Instant};

/// One bucket. Tokens may go negative by one operation's cost, so a message larger than the
/// burst still passes and the long-run rate stays exact; the clock is read only when the
/// bucket runs dry, which keeps the limiter off the hot path of an unthrottled queue.
#[derive(Debug, Clone)]
struct Bucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl Bucket {
    fn new(rate: u64, now: Instant) -> Bucket {
        let rate = rate as f64;
        // One millisecond of traffic, at least one unit: small enough to keep the short-term
        // rate honest, large enough that the PU is not woken for every WQE.
        let burst = (rate / 1000.0).max(1.0);
        Bucket {
            rate,
            burst,
            tokens: burst,
            last: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + dt * self.rate).min(self.burst);
        self.last = now;
    }

    /// When the bucket will be positive again, if it is not now.
    fn ready_at(&self) -> Option<Instant> {
        (self.tokens <= 0.0)
            .then(|| self.last + Duration::from_secs_f64((-self.tokens + 1e-9) / self.rate))
    }
}

/// The limiter of one queue.
#[derive(Debug, Clone, Default)]
pub(crate) struct Limiter {
    wqes: Option<Bucket>,
    bytes: Option<Bucket>,
    /// Either bucket is there (kept apart: every visit of a queue asks, and testing the two
    /// options costs ten instructions).
    active: bool,
}

impl Limiter {
    pub(crate) fn new(limit: RateLimit) -> Limiter {
        let now = Instant::now();
        let wqes = (limit.wqes_per_sec > 0).then(|| Bucket::new(limit.wqes_per_sec, now));
        let bytes = (limit.bytes_per_sec > 0).then(|| Bucket::new(limit.bytes_per_sec, now));
        let active = wqes.is_some() || bytes.is_some();
        Limiter {
            wqes,
            bytes,
            active,
        }
    }

    #[inline(always)]
    pub(crate) fn is_active(&self) -> bool {
        self.active
    }

    /// Take one WQE of `bytes` payload, or say when to try again.
    pub(crate) fn admit(&mut self, bytes: u64) -> Result<(), Instant> {
        let mut wait = None;
        for (b, _) in [(&mut self.wqes, 1u64), (&mut self.bytes, bytes)] {
            if let Some(b) = b {
                if b.tokens <= 0.0 {
                    b.refill(Instant::now());
                }
                if let Some(t) = b.ready_at() {
                    wait = Some(wait.map_or(t, |w: Instant| w.max(t)));
                }
            }
        }
        if let Some(t) = wait {
            return Err(t);
        }
        if let Some(b) = &mut self.wqes {
            b.tokens -= 1.0;
        }
        if let Some(b) = &mut self.bytes {
            b.tokens -= bytes as f64;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unlimited_is_inactive() {
        assert!(!Limiter::new(RateLimit::default()).is_active());
    }

    #[test]
    fn dry_bucket_names_a_future_time() {
        let mut l = Limiter::new(RateLimit {
            wqes_per_sec: 1000,
            bytes_per_sec: 0,
        });
        // A one-WQE burst; the bucket may go one WQE into debt, then it must refuse.
        assert!(l.admit(0).is_ok());
        assert!(l.admit(0).is_ok());
        let t = l.admit(0).unwrap_err();
        assert!(t > Instant::now());
        assert!(t < Instant::now() + Duration::from_millis(5));
    }

    #[test]
    fn large_messages_pass_and_pay_their_debt() {
        let mut l = Limiter::new(RateLimit {
            wqes_per_sec: 0,
            bytes_per_sec: 1_000_000,
        });
        assert!(l.admit(1 << 20).is_ok());
        let t = l.admit(1).unwrap_err();
        assert!(t > Instant::now() + Duration::from_millis(900));
    }
}
