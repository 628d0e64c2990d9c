//! Time stamps of the events of cross-PU hand-offs, for finding where a step's time goes
//! (`chain_profile --cross`, `docs/softnic-performance.md`, "Cross-PU hand-offs").
//!
//! Compiled in only with the feature `handoff-trace` (benchmark builds: `cargo build
//! --release -p redn-bench --features handoff-trace`); without it [`stamp`] is empty and
//! [`take`] returns nothing. Why not `perf`: its hardware counters are not available on
//! our VMs, and a hand-off's parts are tens of nanoseconds each, on two threads.
//!
//! Each thread that stamps writes its own log (a time stamp counter read and two plain
//! stores, ~10 ns), so the tracer adds no shared cache line to what it measures; the logs are
//! read after the run ([`take`]), while nothing stamps.

/// What happened. Stamped by the thread that did it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum HandoffEvent {
    /// A SEND_EN is about to move the enabled index of a queue on another PU (stamped just
    /// before the publication, so that it comes before what the other PU stamps on seeing it).
    Enabled = 1,
    /// A queue's visit found WQEs to run (before it runs them).
    Found = 2,
    /// A completion is being counted (stamped just before the count's store, as `Enabled`).
    Completed = 3,
    /// A WAIT passed.
    WaitPassed = 4,
    /// A WAIT was found short of its count.
    WaitBlocked = 5,
}

// Only the recording build and the tests read stamps back.
#[cfg(any(feature = "handoff-trace", test))]
impl HandoffEvent {
    fn from_u8(v: u8) -> Option<HandoffEvent> {
        Some(match v {
            1 => HandoffEvent::Enabled,
            2 => HandoffEvent::Found,
            3 => HandoffEvent::Completed,
            4 => HandoffEvent::WaitPassed,
            5 => HandoffEvent::WaitBlocked,
            _ => return None,
        })
    }
}

/// Record `event` with the time stamp counter, in the calling thread's log.
#[inline(always)]
pub fn stamp(event: HandoffEvent) {
    #[cfg(feature = "handoff-trace")]
    on::stamp(event);
    #[cfg(not(feature = "handoff-trace"))]
    let _ = event;
}

/// The clock [`stamp`] reads (time stamp counter ticks on x86-64, nanoseconds from an
/// arbitrary origin elsewhere): read it with `Instant` before and after a run to convert.
pub fn clock() -> u64 {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        // SAFETY: RDTSC reads a counter; it touches no memory and every x86-64 CPU has it.
        #[allow(unused_unsafe)]
        unsafe {
            std::arch::x86_64::_rdtsc()
        }
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    {
        use std::sync::OnceLock;
        use std::time::Instant;
        static ORIGIN: OnceLock<Instant> = OnceLock::new();
        let origin = *ORIGIN.get_or_init(Instant::now);
        u64::try_from(origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// Take every thread's log so far (emptying them): one list per thread that stamped, each
/// `(clock, event)` in the order stamped. Call it while nothing stamps (between runs): a
/// stamp made meanwhile may be lost.
pub fn take() -> Vec<Vec<(u64, HandoffEvent)>> {
    #[cfg(feature = "handoff-trace")]
    return on::take();
    #[cfg(not(feature = "handoff-trace"))]
    Vec::new()
}

/// Whether this build records anything (the feature `handoff-trace`).
pub const ENABLED: bool = cfg!(feature = "handoff-trace");

/// Pack a stamp into one word: the clock's low 56 bits and the event.
#[cfg(any(feature = "handoff-trace", test))]
fn pack(t: u64, event: HandoffEvent) -> u64 {
    (t << 8) | event as u64
}

/// Unpack a word [`pack`] made.
#[cfg(any(feature = "handoff-trace", test))]
fn unpack(w: u64) -> Option<(u64, HandoffEvent)> {
    HandoffEvent::from_u8(w.to_le_bytes()[0]).map(|e| (w >> 8, e))
}

#[cfg(feature = "handoff-trace")]
mod on {
    use super::{clock, pack, unpack, HandoffEvent};
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    /// Stamps one thread keeps before it drops the newest (8 MiB a thread).
    const CAPACITY: usize = 1 << 20;

    /// One thread's stamps; written by that thread alone, read by [`take`].
    struct Log {
        words: Box<[AtomicU64]>,
        len: AtomicUsize,
    }

    static LOGS: Mutex<Vec<Arc<Log>>> = Mutex::new(Vec::new());

    thread_local! {
        static MINE: Arc<Log> = {
            let log = Arc::new(Log {
                words: (0..CAPACITY).map(|_| AtomicU64::new(0)).collect(),
                len: AtomicUsize::new(0),
            });
            LOGS.lock().unwrap_or_else(|e| e.into_inner()).push(Arc::clone(&log));
            log
        };
    }

    #[inline(always)]
    pub(super) fn stamp(event: HandoffEvent) {
        let t = clock();
        MINE.with(|log| {
            let n = log.len.load(Ordering::Relaxed);
            if let Some(w) = log.words.get(n) {
                w.store(pack(t, event), Ordering::Relaxed);
                log.len.store(n + 1, Ordering::Release);
            }
        });
    }

    pub(super) fn take() -> Vec<Vec<(u64, HandoffEvent)>> {
        let logs = LOGS.lock().unwrap_or_else(|e| e.into_inner());
        logs.iter()
            .map(|log| {
                let n = log.len.swap(0, Ordering::Acquire);
                log.words[..n]
                    .iter()
                    .filter_map(|w| unpack(w.load(Ordering::Relaxed)))
                    .collect::<Vec<_>>()
            })
            .filter(|v| !v.is_empty())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamp_packs_and_unpacks_to_its_clock_and_event() {
        let t = 0x00ab_cdef_0123_4567;
        assert_eq!(
            unpack(pack(t, HandoffEvent::Completed)),
            Some((t, HandoffEvent::Completed))
        );
        assert_eq!(unpack(0x1234_5600), None, "event 0 is no event");
    }

    /// With the feature, a thread's stamps come back in order, once; without it, nothing.
    #[test]
    fn stamps_come_back_in_order_once_if_compiled_in() {
        std::thread::spawn(|| {
            stamp(HandoffEvent::Enabled);
            stamp(HandoffEvent::WaitPassed);
        })
        .join()
        .expect("stamping thread");
        let logs = take();
        let ours: Vec<_> = logs
            .iter()
            .filter(|l| l.len() == 2)
            .map(|l| l.iter().map(|&(_, e)| e).collect::<Vec<_>>())
            .collect();
        if ENABLED {
            assert!(ours.contains(&vec![HandoffEvent::Enabled, HandoffEvent::WaitPassed]));
        } else {
            assert!(logs.is_empty());
        }
    }
}
