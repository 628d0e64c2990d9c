//! Host-driven softnics ([`SoftNicConfig::host_driven`](super::SoftNicConfig::host_driven)):
//! no PU threads; the app thread's own calls run the PUs' rounds, as a DPDK poll-mode driver
//! or rxe's requester task runs in its caller's context. A round is the PU thread's round
//! (`pu::PuQueues`: the same executor, the same RoCE endpoint code), so a host-driven
//! softnic has no second copy of any WQE's semantics.
//!
//! Why: a RoCE round trip between two processes on a small machine is a rotation of the
//! busy threads on its cores. A client whose PU is a thread of its own puts three on the
//! path (its host, its PU, the server's PU) where a raw UDP ping-pong has two; host-driven,
//! the client's host is its PU (`docs/softnic-performance.md`, "The RoCEv2 round trip").
//!
//! One caller at a time runs the rounds (a try-lock); a call that finds them running leaves
//! a request (`wanted`) that the running caller serves before it lets go, so no call's
//! doorbell waits for a later call. What the queues are handed between calls (a completion
//! a WAIT counts, a datagram for the RoCE endpoint) waits for the next call: an app that
//! stops calling stops its queues, and its endpoint's receive thread serves the socket for
//! it (see `roce::endpoint`, the host's lease).

use super::pu::PuQueues;
use super::shared::Shared;
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::{Arc, Mutex, TryLockError};

/// Rounds one call runs at most while they make progress: a queue that always has work (a
/// recycled loop) must not keep the caller forever; its next call goes on.
const MAX_ROUNDS: usize = 64;

/// The PUs' state of a host-driven softnic, run by whichever app thread calls in.
pub(crate) struct HostDriven {
    /// Some call wants the rounds run: set before the try-lock, so that a caller holding
    /// the lock runs them once more for a caller that could not take it.
    wanted: AtomicBool,
    pus: Mutex<Vec<PuQueues>>,
}

impl HostDriven {
    pub(crate) fn new(pus: usize) -> HostDriven {
        HostDriven {
            wanted: AtomicBool::new(false),
            pus: Mutex::new((0..pus).map(|_| PuQueues::default()).collect()),
        }
    }

    /// Run every PU's rounds until none makes progress (at most [`MAX_ROUNDS`] each), or
    /// leave that to the caller running them now.
    pub(crate) fn drive(&self, shared: &Arc<Shared>) {
        self.wanted.store(true, Ordering::Relaxed);
        loop {
            // The caller's half of a store-load handshake with the holder's release below:
            // either this try-lock sees the lock free or the holder sees `wanted`.
            fence(Ordering::SeqCst);
            let mut pus = match self.pus.try_lock() {
                Ok(g) => g,
                Err(TryLockError::Poisoned(e)) => e.into_inner(),
                Err(TryLockError::WouldBlock) => return,
            };
            while self.wanted.swap(false, Ordering::AcqRel) {
                for (index, pu) in pus.iter_mut().enumerate() {
                    rounds(index, pu, shared);
                }
            }
            drop(pus);
            fence(Ordering::SeqCst);
            if !self.wanted.load(Ordering::Relaxed) {
                return;
            }
        }
    }
}

/// PU `index`'s rounds: its queues, then (when they had nothing, and on the last round)
/// its idle work, until a round does nothing.
fn rounds(index: usize, pu: &mut PuQueues, shared: &Arc<Shared>) {
    let notice = &shared.pus.pus[index].0.changed;
    for round in 0..MAX_ROUNDS {
        if notice.load(Ordering::Relaxed) && notice.swap(false, Ordering::AcqRel) {
            pu.take_changes(index, shared);
        }
        // A rate-limited queue's deadline needs no timer here: the app's next call looks
        // again.
        let (mut progress, _deadline) = pu.scan();
        if !progress || round + 1 == MAX_ROUNDS {
            progress |= pu.poll_idle();
        }
        if !progress {
            return;
        }
    }
}
