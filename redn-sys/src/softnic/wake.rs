//! Waking processing units: the park flags and thread handles through which anything that
//! may give a PU work (a doorbell, a SEND_EN, a completion a WAIT counts, a receive a blocked
//! SEND waits for, a queue handed over) tells it so. Queues and CQs hold the [`PuSet`] to wake
//! the PU they belong to; the PU's own loop lives in `pu`.
//!
//! **A PU that is awake is not told anything.** It rescans its queues every round, and a
//! queue's visit reads the very words a hand-off writes (the enabled index a SEND_EN moves,
//! the CQ count a WAIT compares, the doorbell), so it finds the work through the one cache
//! line the hand-off wrote. Writing a per-PU event word as well (as an earlier version did:
//! a locked add on a line the spinning PU reads every round) moved that line to the
//! notifier's core and back on every hand-off, two more line transfers each way
//! (`docs/softnic-performance.md`, "Cross-PU hand-offs"). A notifier only reads the target's
//! `sleeping` flag, which stays in both cores' caches while the target is awake.
//!
//! Parking is a Dekker handshake on that flag: the PU sets `sleeping`, fences, and scans all
//! its queues once more before it parks; a notifier publishes its work, fences, and reads
//! `sleeping`. One of the two sees the other's write: either the PU's last scan finds the
//! work, or the notifier sees the flag and unparks the thread (an unpark that comes before
//! the park makes the park return at once).

use super::cache_line::CacheLine;
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::OnceLock;
use std::thread::Thread;

thread_local! {
    /// The PU this thread is (set set, index), so a PU does not notify itself: it rescans
    /// after any progress anyway.
    static CURRENT: std::cell::Cell<(usize, usize)> = const { std::cell::Cell::new((0, usize::MAX)) };
}
/// How one PU is woken. Each on a cache line of its own: a PU writes its own flags when it
/// parks and wakes, and must not take its neighbour's line with them.
pub(crate) struct PuNotify {
    /// Set from just before the PU's last scan until it is awake again: a notifier that
    /// sees it unparks the thread.
    pub(crate) sleeping: AtomicBool,
    pub(crate) thread: OnceLock<Thread>,
    /// A queue was handed over or destroyed: the PU updates its list (checked once per round
    /// rather than every queue's `destroyed` flag).
    pub(crate) changed: AtomicBool,
}

/// The PUs of one softnic, as seen by those who need to wake them.
pub(crate) struct PuSet {
    pub(crate) pus: Box<[CacheLine<PuNotify>]>,
    pub(crate) shutdown: AtomicBool,
}

impl PuSet {
    pub(crate) fn new(n: usize) -> PuSet {
        PuSet {
            pus: (0..n)
                .map(|_| {
                    CacheLine(PuNotify {
                        sleeping: AtomicBool::new(false),
                        thread: OnceLock::new(),
                        changed: AtomicBool::new(false),
                    })
                })
                .collect(),
            shutdown: AtomicBool::new(false),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.pus.len()
    }

    /// Tell PU `pu` that something changed (after publishing what changed).
    #[inline]
    pub(crate) fn notify(&self, pu: usize) {
        if CURRENT.with(|c| c.get()) == (self as *const PuSet as usize, pu) {
            return;
        }
        self.notify_other(pu);
    }

    /// As [`Self::notify`], from PU `from` of `from_set`: a caller that knows which PU it
    /// runs on skips the thread-local lookup (a call, on the executor's hot path).
    #[inline(always)]
    pub(crate) fn notify_from(&self, pu: usize, from_set: &PuSet, from: usize) {
        if !(std::ptr::eq(self, from_set) && pu == from) {
            self.notify_other(pu);
        }
    }

    /// Tell PU `pu`, which is not the calling thread, that something changed: unpark it if
    /// it is parking, nothing else (see the module's comment).
    #[inline]
    fn notify_other(&self, pu: usize) {
        let p = &self.pus[pu].0;
        // Orders the caller's publication before the read of `sleeping` (the notifier's
        // half of the handshake; the PU's is in `PuNotify::prepare_to_park`).
        fence(Ordering::SeqCst);
        if p.sleeping.load(Ordering::Relaxed) {
            self.unpark(p);
        }
    }

    /// The system call of a wake-up, out of the notifier's inlined path.
    #[cold]
    #[inline(never)]
    fn unpark(&self, p: &PuNotify) {
        if let Some(t) = p.thread.get() {
            t.unpark();
        }
    }

    pub(crate) fn notify_all(&self) {
        for i in 0..self.pus.len() {
            self.notify(i);
        }
    }

    /// Tell PU `pu` that its list of queues changed: one was handed to it or destroyed
    /// (after marking it so).
    pub(crate) fn mark_changed(&self, pu: usize) {
        self.pus[pu].0.changed.store(true, Ordering::Release);
        self.notify(pu);
    }
}

impl PuNotify {
    /// The PU's half of the parking handshake: after this, a notifier that published work
    /// and missed it in the PU's next scan unparks the thread.
    pub(crate) fn prepare_to_park(&self) {
        self.sleeping.store(true, Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }

    /// Awake again (or the park was called off): notifiers stop unparking.
    pub(crate) fn awake(&self) {
        self.sleeping.store(false, Ordering::Relaxed);
    }
}

/// Mark the calling thread as PU `index` of `pus`, so that it does not notify itself.
pub(crate) fn enter(pus: &PuSet, index: usize) {
    CURRENT.with(|c| c.set((pus as *const PuSet as usize, index)));
}
