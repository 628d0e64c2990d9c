//! Where code that reasons about time reads it: the system's monotonic clock in the product,
//! a clock the test moves by hand in the tests of that logic, so that their expectations are
//! exact rather than "about this long on an idle machine".
//!
//! Code takes a clock as a generic parameter (`impl Clock`, by value: a test lends its clock
//! as `&clock`), never as a trait object: with [`SystemClock`], a zero-sized type, reading the
//! time compiles to the one `Instant::now()` call it replaces, passing the clock costs
//! nothing, and a path that does not read the time pays nothing.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A source of the current time.
pub trait Clock {
    /// Now, by this clock; never earlier than a time it returned before.
    fn now(&self) -> Instant;
}

/// A clock lent to code that takes one by value (which a zero-sized clock costs nothing).
impl<C: Clock + ?Sized> Clock for &C {
    #[inline(always)]
    fn now(&self) -> Instant {
        (**self).now()
    }
}

/// The system's monotonic clock ([`Instant::now`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    #[inline(always)]
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that stands still until the test moves it (shareable between threads).
///
/// It starts at an arbitrary instant, [`ManualClock::origin`]; tests name times as offsets
/// from it ([`ManualClock::at`]).
#[derive(Debug)]
pub struct ManualClock {
    origin: Instant,
    now: Mutex<Instant>,
}

impl ManualClock {
    /// A clock standing at its origin.
    pub fn new() -> ManualClock {
        let origin = Instant::now();
        ManualClock {
            origin,
            now: Mutex::new(origin),
        }
    }

    /// The instant the clock started at.
    pub fn origin(&self) -> Instant {
        self.origin
    }

    /// The instant `since` after the origin.
    pub fn at(&self, since: Duration) -> Instant {
        self.origin + since
    }

    /// Move the clock forward by `d`.
    pub fn advance(&self, d: Duration) {
        *self.now.lock().unwrap_or_else(|e| e.into_inner()) += d;
    }

    /// Move the clock to `since` after its origin. Panics if that is earlier than now: a
    /// monotonic clock does not go back.
    pub fn set(&self, since: Duration) {
        let mut now = self.now.lock().unwrap_or_else(|e| e.into_inner());
        let t = self.origin + since;
        assert!(t >= *now, "a monotonic clock does not go back");
        *now = t;
    }
}

impl Default for ManualClock {
    fn default() -> ManualClock {
        ManualClock::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        *self.now.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_told() {
        let c = ManualClock::new();
        assert_eq!(c.now(), c.origin());
        assert_eq!(c.now(), c.origin());
        c.advance(Duration::from_nanos(7));
        assert_eq!(c.now(), c.at(Duration::from_nanos(7)));
        c.set(Duration::from_secs(2));
        assert_eq!(c.now() - c.origin(), Duration::from_secs(2));
    }

    #[test]
    #[should_panic(expected = "does not go back")]
    fn a_manual_clock_does_not_go_back() {
        let c = ManualClock::new();
        c.advance(Duration::from_secs(1));
        c.set(Duration::from_millis(999));
    }

    #[test]
    fn the_system_clock_is_monotonic() {
        let a = SystemClock.now();
        assert!(SystemClock.now() >= a);
    }
}
