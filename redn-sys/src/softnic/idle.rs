//! Work a PU does in its idle rounds besides rescanning its queues: the seam through which a
//! RoCE endpoint lets the PU of its connected QPs take packets off the socket itself while
//! it is awake, so that a request's placement, its receive completion and the WAIT that
//! counts it run on one thread with no hand-off from a receive thread.
//!
//! The PU calls [`IdleWork::poll`] in each round that found no queue work and
//! [`IdleWork::parking`] before it parks, so the work goes back to whoever serves it while
//! no PU is awake (the endpoint's receive thread, blocked in the kernel).

use std::sync::{Arc, Mutex};

/// What a poll of idle work did, least to most: any but `Nothing` counts as progress (the PU
/// stays awake).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Found {
    /// Nothing was ready.
    Nothing,
    /// Work that leaves the PU's queues nothing new: data placed in memory, a reply sent, a
    /// datagram dropped. A host-driven call returns at once, so that the app sees what landed
    /// (`host_driven::rounds`).
    Placed,
    /// Work that may give the queues something to run: a completion a WAIT may count, a
    /// response a requester takes, a QP put in error. The queues are scanned again.
    QueueWork,
}

/// Something a PU polls while it is awake and idle.
pub(crate) trait IdleWork: Send + Sync {
    /// Do what is ready now, without blocking; what that was.
    fn poll(&self) -> Found;
    /// The PU is about to park: stop counting on it until its next [`Self::poll`].
    fn parking(&self);
}

/// One PU's idle work.
type WorkList = Vec<Arc<dyn IdleWork>>;

/// Per PU, the idle work registered for it.
pub(crate) struct IdleHooks {
    per_pu: Box<[Mutex<WorkList>]>,
}

impl IdleHooks {
    pub(crate) fn new(pus: usize) -> IdleHooks {
        IdleHooks {
            per_pu: (0..pus).map(|_| Mutex::new(Vec::new())).collect(),
        }
    }

    fn list(&self, pu: usize) -> std::sync::MutexGuard<'_, WorkList> {
        self.per_pu[pu % self.per_pu.len()]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// PU `pu`'s idle work now (the PU takes a copy when told its queues changed).
    pub(crate) fn of(&self, pu: usize) -> WorkList {
        self.list(pu).clone()
    }

    /// Add `work` to PU `pu`'s list (the caller then tells the PU its list changed).
    pub(crate) fn add(&self, pu: usize, work: Arc<dyn IdleWork>) {
        self.list(pu).push(work);
    }

    /// Take `work` off PU `pu`'s list.
    pub(crate) fn remove(&self, pu: usize, work: &Arc<dyn IdleWork>) {
        self.list(pu).retain(|w| !Arc::ptr_eq(w, work));
    }
}
