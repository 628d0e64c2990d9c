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
use std::sync::atomic::{fence, AtomicBool, AtomicU32, Ordering};
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
    /// The CPU the PU's thread last found itself on while idle ([`NO_CPU`] before that):
    /// see [`PuSet::shares_cpu`]. Written only when it changes, so the line stays shared.
    cpu: AtomicU32,
}

/// [`PuNotify::cpu`] before the PU has looked.
const NO_CPU: u32 = u32::MAX;

/// The CPU the calling thread runs on now (`sched_getcpu(3)`: from the kernel's per-thread
/// restartable-sequence area or the vDSO, a few nanoseconds), or None if unknown.
pub(crate) fn current_cpu() -> Option<u32> {
    if cfg!(miri) {
        // Miri runs no foreign calls; no CPU known means no PU is seen sharing one.
        return None;
    }
    // SAFETY: `sched_getcpu` takes no arguments and touches no memory of ours; it returns
    // -1 where it is not supported, which `try_from` turns into None.
    u32::try_from(unsafe { libc::sched_getcpu() }).ok()
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
                        cpu: AtomicU32::new(NO_CPU),
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
    /// runs on skips the thread-local lookup (a call, on the executor's hot path). Returns
    /// true if PU `pu` was awake (or is the caller): it finds the work within a round, so an
    /// answer may be worth spinning for (`pu::spin_for`); false if it had to be unparked.
    #[inline(always)]
    pub(crate) fn notify_from(&self, pu: usize, from_set: &PuSet, from: usize) -> bool {
        (std::ptr::eq(self, from_set) && pu == from) || self.notify_other(pu)
    }

    /// Tell PU `pu`, which is not the calling thread, that something changed: unpark it if
    /// it is parking, nothing else (see the module's comment). Returns true if it was awake.
    #[inline]
    fn notify_other(&self, pu: usize) -> bool {
        let p = &self.pus[pu].0;
        // Orders the caller's publication before the read of `sleeping` (the notifier's
        // half of the handshake; the PU's is in `PuNotify::prepare_to_park`).
        fence(Ordering::SeqCst);
        if p.sleeping.load(Ordering::Relaxed) {
            self.unpark(p);
            return false;
        }
        true
    }

    /// The system call of a wake-up, out of the notifier's inlined path.
    #[cold]
    #[inline(never)]
    fn unpark(&self, p: &PuNotify) {
        if let Some(t) = p.thread.get() {
            t.unpark();
        }
    }

    /// Whether another awake PU of this set was last seen on `cpu`, where PU `me` runs
    /// (`cpu` from [`current_cpu`]). Then the two take turns on one core (a busy machine's
    /// scheduler put them there, or there are more threads than cores), and a PU spinning
    /// for work or for an answer holds the core the other needs to produce it: it should
    /// yield instead. A PU's CPU is as of its last idle look ([`PuNotify::note_cpu`]), so
    /// this can be stale by a migration; it only chooses between spinning and yielding.
    pub(crate) fn shares_cpu(&self, me: usize, cpu: u32) -> bool {
        self.pus.iter().enumerate().any(|(i, p)| {
            i != me
                && p.0.cpu.load(Ordering::Relaxed) == cpu
                && !p.0.sleeping.load(Ordering::Relaxed)
        })
    }

    /// Whether an awake PU of this set with a lower index than `me` was last seen on `cpu`,
    /// where `me` runs: then `me` is the one of the two that should move
    /// ([`super::affinity::step_aside`]). Only the higher-numbered PU of a pair moves, so two
    /// PUs that find each other on one CPU do not both move, to the same other CPU.
    pub(crate) fn lower_pu_on(&self, me: usize, cpu: u32) -> bool {
        self.pus[..me.min(self.pus.len())].iter().any(|p| {
            p.0.cpu.load(Ordering::Relaxed) == cpu && !p.0.sleeping.load(Ordering::Relaxed)
        })
    }

    /// The CPUs the awake PUs of this set other than `me` were last seen on: where a PU that
    /// steps aside should not go.
    pub(crate) fn cpus_of_others(&self, me: usize) -> Vec<u32> {
        self.pus
            .iter()
            .enumerate()
            .filter(|&(i, p)| i != me && !p.0.sleeping.load(Ordering::Relaxed))
            .map(|(_, p)| p.0.cpu.load(Ordering::Relaxed))
            .filter(|&c| c != NO_CPU)
            .collect()
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

    /// Record that the PU's thread runs on `cpu` now (see [`PuSet::shares_cpu`]).
    pub(crate) fn note_cpu(&self, cpu: u32) {
        if self.cpu.load(Ordering::Relaxed) != cpu {
            self.cpu.store(cpu, Ordering::Relaxed);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A PU shares a CPU with another of its set only if that one is awake and was last
    /// seen on the same CPU; a PU never counts itself, and one not yet seen counts nowhere.
    #[test]
    fn a_pu_shares_a_cpu_only_with_awake_others_last_seen_there() {
        let set = PuSet::new(3);
        assert!(!set.shares_cpu(0, 4), "no PU has looked yet");
        set.pus[0].0.note_cpu(4);
        assert!(!set.shares_cpu(0, 4), "itself");
        set.pus[1].0.note_cpu(4);
        set.pus[2].0.note_cpu(5);
        assert!(set.shares_cpu(0, 4));
        assert!(set.shares_cpu(1, 4));
        assert!(!set.shares_cpu(2, 5));
        set.pus[1].0.prepare_to_park();
        assert!(!set.shares_cpu(0, 4), "PU 1 is parking");
        set.pus[1].0.awake();
        set.pus[1].0.note_cpu(5);
        assert!(!set.shares_cpu(0, 4), "PU 1 moved away");
        assert!(set.shares_cpu(2, 5));
    }

    /// Of two awake PUs last seen on one CPU only the higher-numbered one is told to move,
    /// and off every CPU the other awake PUs were last seen on; parked PUs and PUs not yet
    /// seen neither crowd a CPU nor are avoided.
    #[test]
    fn only_the_higher_of_two_pus_on_one_cpu_moves_off_the_others_cpus() {
        let set = PuSet::new(4);
        set.pus[0].0.note_cpu(2);
        set.pus[1].0.note_cpu(2);
        set.pus[2].0.note_cpu(7);
        assert!(set.lower_pu_on(1, 2), "PU 0 is on CPU 2 too");
        assert!(
            !set.lower_pu_on(0, 2),
            "PU 0 stays: no lower PU is on CPU 2"
        );
        assert!(!set.lower_pu_on(2, 7), "alone on CPU 7");
        assert!(!set.lower_pu_on(3, 9), "no PU is on CPU 9");
        assert!(set.lower_pu_on(3, 7), "PU 2 is on CPU 7");
        assert_eq!(set.cpus_of_others(1), [2, 7], "PU 3 has not looked");
        assert_eq!(set.cpus_of_others(3), [2, 2, 7]);
        set.pus[0].0.prepare_to_park();
        assert!(!set.lower_pu_on(1, 2), "PU 0 is parking");
        assert_eq!(set.cpus_of_others(3), [2, 7], "a parking PU is not avoided");
        set.pus[0].0.awake();
        assert!(set.lower_pu_on(1, 2), "PU 0 is awake again");
    }
}
