//! Per-QP token buckets: one on WQEs, one on payload bytes.
//!
//! The time comes from a [`Clock`] the caller passes: the executor's is the system clock,
//! the tests below move a [`ManualClock`](crate::clock::ManualClock) by hand and expect
//! exact answers.

use crate::clock::Clock;
use crate::nic::RateLimit;
use std::time::{Duration, Instant};

/// The longest wait a dry bucket names, in nanoseconds (an hour). A bucket deeper in debt
/// (a large message on a very low rate) is asked again then and names the next hour: a
/// later answer, never a wrong one, and no `Instant` overflow however deep the debt.
const LONGEST_WAIT_NS: f64 = 3.6e12;

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

    /// When the bucket will be positive again, if it is not now: the first whole nanosecond
    /// after `-tokens / rate` seconds from the last refill (so an `admit` then passes).
    fn ready_at(&self) -> Option<Instant> {
        (self.tokens <= 0.0).then(|| {
            let ns = (-self.tokens * 1e9 / self.rate).min(LONGEST_WAIT_NS);
            // `ns` is at least 0 (tokens <= 0) and at most an hour: the float-to-integer
            // cast saturates anyway, and after floor it is exact.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let whole = ns.floor() as u64;
            self.last + Duration::from_nanos(whole + 1)
        })
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
    /// A limiter for `limit` whose buckets start full at `now`.
    pub(crate) fn new(limit: RateLimit, now: Instant) -> Limiter {
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

    /// Take one WQE of `bytes` payload, or say when to try again: the later of the two
    /// buckets' ready times, as both must be positive. `clock` is read only if a bucket is
    /// dry, and then once; it is taken by value so that the system clock, a zero-sized type,
    /// costs the call no argument (a test passes a reference to its clock).
    pub(crate) fn admit(&mut self, bytes: u64, clock: impl Clock) -> Result<(), Instant> {
        let mut now = None;
        let mut wait = None;
        for b in [&mut self.wqes, &mut self.bytes].into_iter().flatten() {
            if b.tokens <= 0.0 {
                b.refill(*now.get_or_insert_with(|| clock.now()));
            }
            if let Some(t) = b.ready_at() {
                wait = Some(wait.map_or(t, |w: Instant| w.max(t)));
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
    use crate::clock::ManualClock;
    use std::cell::Cell;

    /// A manual clock that counts how often it is read.
    #[derive(Default)]
    struct Counted {
        clock: ManualClock,
        reads: Cell<u32>,
    }

    impl Clock for Counted {
        fn now(&self) -> Instant {
            self.reads.set(self.reads.get() + 1);
            self.clock.now()
        }
    }

    fn limiter(wqes_per_sec: u64, bytes_per_sec: u64, c: &Counted) -> Limiter {
        let limit = RateLimit {
            wqes_per_sec,
            bytes_per_sec,
        };
        Limiter::new(limit, c.clock.now())
    }

    fn ns(n: u64) -> Duration {
        Duration::from_nanos(n)
    }

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn unlimited_is_inactive_and_admits_without_reading_the_clock() {
        let c = Counted::default();
        let mut l = limiter(0, 0, &c);
        assert!(!l.is_active());
        for _ in 0..1000 {
            assert_eq!(l.admit(1 << 20, &c), Ok(()));
        }
        assert_eq!(c.reads.get(), 0);
    }

    #[test]
    fn a_bucket_with_tokens_does_not_read_the_clock() {
        // 4000 WQE/s: a burst of 4.
        let c = Counted::default();
        let mut l = limiter(4000, 0, &c);
        assert!(l.is_active());
        for _ in 0..4 {
            assert_eq!(l.admit(0, &c), Ok(()));
        }
        assert_eq!(c.reads.get(), 0, "the hot path read the clock");
        // Dry: one read, however many buckets are dry.
        assert!(l.admit(0, &c).is_err());
        assert_eq!(c.reads.get(), 1);
        let mut both = limiter(1000, 1000, &c);
        assert_eq!(both.admit(1, &c), Ok(()));
        assert!(both.admit(1, &c).is_err());
        assert_eq!(c.reads.get(), 2, "two dry buckets read the clock twice");
    }

    #[test]
    fn a_burst_is_a_millisecond_of_traffic_and_refills_no_further() {
        // 4000 WQE/s: 4 at once, then the fifth waits until the bucket is positive again, one
        // nanosecond on (an operation may take the bucket into debt by its cost).
        let c = Counted::default();
        let mut l = limiter(4000, 0, &c);
        for _ in 0..4 {
            assert_eq!(l.admit(0, &c), Ok(()));
        }
        assert_eq!(l.admit(0, &c), Err(c.clock.at(ns(1))));
        // A millisecond refills the burst exactly.
        c.clock.set(MS);
        for _ in 0..4 {
            assert_eq!(l.admit(0, &c), Ok(()));
        }
        assert_eq!(l.admit(0, &c), Err(c.clock.at(MS + ns(1))));
        // Ten idle seconds refill no more than the burst.
        c.clock.set(MS + Duration::from_secs(10));
        for _ in 0..4 {
            assert_eq!(l.admit(0, &c), Ok(()));
        }
        assert!(l.admit(0, &c).is_err());
    }

    #[test]
    fn a_rate_below_a_thousand_has_a_burst_of_one() {
        let c = Counted::default();
        let mut l = limiter(10, 0, &c);
        assert_eq!(l.admit(0, &c), Ok(()));
        assert_eq!(l.admit(0, &c), Err(c.clock.at(ns(1))));
    }

    #[test]
    fn a_dry_bucket_names_the_first_nanosecond_it_admits_again() {
        // 1 MB/s: a burst of 1000 bytes; 2000 bytes leave it 1000 in debt, a millisecond.
        let c = Counted::default();
        let mut l = limiter(0, 1_000_000, &c);
        assert_eq!(l.admit(2000, &c), Ok(()));
        let ready = c.clock.at(MS + ns(1));
        assert_eq!(l.admit(1, &c), Err(ready));
        // At the millisecond the bucket is back at zero: not yet.
        c.clock.set(MS);
        assert_eq!(l.admit(1, &c), Err(ready));
        c.clock.set(MS + ns(1));
        assert_eq!(l.admit(1, &c), Ok(()));
    }

    #[test]
    fn a_message_larger_than_the_burst_passes_and_pays_its_debt() {
        // 1 MB/s: a burst of 1000 bytes, and a 1 MiB message still passes at once; the
        // bucket is then 1,047,576 bytes in debt: 1.047576 s at 1 MB/s.
        let c = Counted::default();
        let mut l = limiter(0, 1_000_000, &c);
        assert_eq!(l.admit(1 << 20, &c), Ok(()));
        assert_eq!(l.admit(1, &c), Err(c.clock.at(ns(1_047_576_001))));
        c.clock.set(Duration::from_millis(1047));
        assert_eq!(l.admit(1, &c), Err(c.clock.at(ns(1_047_576_001))));
        c.clock.set(ns(1_047_576_001));
        assert_eq!(l.admit(1, &c), Ok(()));
    }

    #[test]
    fn a_debt_longer_than_an_hour_is_asked_again_after_an_hour() {
        // 1 B/s and a 1 GiB message: 34 years of debt.
        let c = Counted::default();
        let mut l = limiter(0, 1, &c);
        assert_eq!(l.admit(1 << 30, &c), Ok(()));
        let hour = Duration::from_secs(3600);
        assert_eq!(l.admit(1, &c), Err(c.clock.at(hour + ns(1))));
        c.clock.set(hour + ns(1));
        assert_eq!(l.admit(1, &c), Err(c.clock.at(2 * hour + ns(2))));
    }

    #[test]
    fn two_buckets_wait_for_the_later_ready_time() {
        // The byte bucket is the later: 1000 WQE/s and 1000 B/s, both with a burst of one;
        // a 1000-byte WQE leaves the WQE bucket at 0 (positive again in a nanosecond) and
        // the byte bucket 999 in debt (0.999 s).
        let c = Counted::default();
        let mut l = limiter(1000, 1000, &c);
        assert_eq!(l.admit(1000, &c), Ok(()));
        assert_eq!(l.admit(0, &c), Err(c.clock.at(ns(999_000_001))));

        // The WQE bucket is the later: 1 WQE/s and 1000 B/s. One byte at 0 empties both;
        // at 0.5 s both are positive again and a one-byte WQE takes the WQE bucket half a
        // WQE into debt (0.5 s) and the byte bucket to 0 (a nanosecond).
        let c = Counted::default();
        let mut l = limiter(1, 1000, &c);
        assert_eq!(l.admit(1, &c), Ok(()));
        c.clock.set(Duration::from_millis(500));
        assert_eq!(l.admit(1, &c), Ok(()));
        assert_eq!(
            l.admit(1, &c),
            Err(c.clock.at(Duration::from_secs(1) + ns(1)))
        );
    }

    /// Admit as fast as the limiter lets, jumping the clock to each time it names, until
    /// `secs` seconds: the number admitted (at most a million asks).
    fn admitted_in(l: &mut Limiter, bytes: u64, c: &Counted, secs: u64) -> u64 {
        let end = c.clock.at(Duration::from_secs(secs));
        let mut n = 0;
        for _ in 0..1_000_000 {
            match l.admit(bytes, c) {
                Ok(()) => n += 1,
                Err(t) if t > end => return n,
                Err(t) if t > c.clock.now() => c.clock.advance(t - c.clock.now()),
                Err(t) => panic!("asked again at {:?}", t - c.clock.origin()),
            }
        }
        panic!("a million asks and still short of {secs} s");
    }

    #[test]
    fn the_long_run_rate_is_the_rate_plus_one_burst() {
        let c = Counted::default();
        let mut l = limiter(1000, 0, &c);
        assert_eq!(admitted_in(&mut l, 0, &c, 2), 2001);
        let c = Counted::default();
        let mut l = limiter(20_000, 0, &c);
        assert_eq!(admitted_in(&mut l, 0, &c, 1), 20_020);
        // Bytes: 1 MB/s in 1000-byte messages (a burst of one message).
        let c = Counted::default();
        let mut l = limiter(0, 1_000_000, &c);
        assert_eq!(admitted_in(&mut l, 1000, &c, 1), 1001);
    }

    #[test]
    fn a_new_limit_starts_with_a_full_burst_and_none_clears_it() {
        let c = Counted::default();
        let mut l = limiter(4000, 0, &c);
        for _ in 0..4 {
            assert_eq!(l.admit(0, &c), Ok(()));
        }
        assert!(l.admit(0, &c).is_err());
        // The executor replaces its limiter when the host sets a rate: a new rate starts
        // full, no rate (cleared) admits everything.
        l = limiter(4000, 0, &c);
        assert_eq!(l.admit(0, &c), Ok(()));
        l = limiter(0, 0, &c);
        assert!(!l.is_active());
        for _ in 0..100 {
            assert_eq!(l.admit(1 << 30, &c), Ok(()));
        }
    }
}
