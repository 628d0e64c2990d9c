//! Waking processing units: the event counters, park flags and thread handles through which
//! anything that may give a PU work (a doorbell, a SEND_EN, a completion a WAIT counts, a
//! receive a blocked SEND waits for, a queue handed over) tells it so. Queues and CQs hold
//! the [`PuSet`] to wake the PU they belong to; the PU's own loop lives in `pu`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::thread::Thread;

thread_local! {
    /// The PU this thread is (set set, index), so a PU does not notify itself: it rescans
    /// after any progress anyway.
    static CURRENT: std::cell::Cell<(usize, usize)> = const { std::cell::Cell::new((0, usize::MAX)) };
}
/// How one PU is woken.
pub(crate) struct PuNotify {
    /// Bumped by anything that may give the PU work; it parks only if this did not move.
    pub(crate) events: AtomicU64,
    /// Set while it parks, so a notifier knows to unpark it.
    pub(crate) sleeping: AtomicBool,
    pub(crate) thread: OnceLock<Thread>,
    /// A queue was handed over or destroyed: the PU updates its list (checked once per round
    /// rather than every queue's `destroyed` flag).
    pub(crate) changed: AtomicBool,
}

/// The PUs of one softnic, as seen by those who need to wake them.
pub(crate) struct PuSet {
    pub(crate) pus: Box<[PuNotify]>,
    pub(crate) shutdown: AtomicBool,
}

impl PuSet {
    pub(crate) fn new(n: usize) -> PuSet {
        PuSet {
            pus: (0..n)
                .map(|_| PuNotify {
                    events: AtomicU64::new(0),
                    sleeping: AtomicBool::new(false),
                    thread: OnceLock::new(),
                    changed: AtomicBool::new(false),
                })
                .collect(),
            shutdown: AtomicBool::new(false),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.pus.len()
    }

    /// Tell PU `pu` that something changed.
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

    /// Tell PU `pu`, which is not the calling thread, that something changed.
    #[inline]
    fn notify_other(&self, pu: usize) {
        let p = &self.pus[pu];
        p.events.fetch_add(1, Ordering::SeqCst);
        if p.sleeping.load(Ordering::SeqCst) {
            if let Some(t) = p.thread.get() {
                t.unpark();
            }
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
        self.pus[pu].changed.store(true, Ordering::SeqCst);
        self.notify(pu);
    }
}

/// Mark the calling thread as PU `index` of `pus`, so that it does not notify itself.
pub(crate) fn enter(pus: &PuSet, index: usize) {
    CURRENT.with(|c| c.set((pus as *const PuSet as usize, index)));
}
