//! Completion queues: a ring of mlx5 CQE64 entries plus the running count WAIT compares with.

use super::pu::PuSet;
use super::spin::SpinLock;
use super::CacheLine;
use crate::nic::{CompChannel, Completion};
use crate::types::Cqn;
use crate::wqe::{Cqe, Syndrome, CQE_SIZE};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

struct CqRing {
    cqes: Box<[[u8; CQE_SIZE]]>,
    wr_ids: Box<[u64]>,
    /// Entries written into the ring (lost ones excluded).
    produced: u64,
    consumed: u64,
    /// Armed by `req_notify`: the next push signals this channel and disarms.
    notify: Option<CompChannel>,
}

/// One completion queue. Any processing unit (or a peer's) may produce into it; the host polls.
pub(crate) struct CqShared {
    pub(crate) cqn: Cqn,
    depth: u64,
    ignore_overrun: bool,
    /// Taken for a few instructions per push or poll (see `spin`).
    ring: SpinLock<CqRing>,
    /// Completions produced since creation: what WAIT counts. Written under `ring`'s lock;
    /// on its own cache line, since waiters on other threads read it constantly.
    produced: CacheLine<AtomicU64>,
    overrun: AtomicBool,
    /// Bit i set: a queue on PU i has waited on this CQ, so PU i is told of new completions.
    waiters: AtomicU64,
    pus: Arc<PuSet>,
    /// Queue pairs using this CQ (destroy refuses while nonzero).
    pub(crate) users: AtomicU64,
}

impl CqShared {
    pub(crate) fn new(cqn: Cqn, depth: u32, ignore_overrun: bool, pus: Arc<PuSet>) -> CqShared {
        let depth = u64::from(depth.max(1).next_power_of_two());
        CqShared {
            cqn,
            depth,
            ignore_overrun,
            ring: SpinLock::new(CqRing {
                cqes: vec![[0u8; CQE_SIZE]; depth as usize].into_boxed_slice(),
                wr_ids: vec![0u64; depth as usize].into_boxed_slice(),
                produced: 0,
                consumed: 0,
                notify: None,
            }),
            produced: CacheLine(AtomicU64::new(0)),
            overrun: AtomicBool::new(false),
            waiters: AtomicU64::new(0),
            pus,
            users: AtomicU64::new(0),
        }
    }

    /// Completions produced so far.
    #[inline]
    pub(crate) fn produced(&self) -> u64 {
        self.produced.0.load(Ordering::Acquire)
    }

    /// Remember that a queue on `pu` waits for this CQ. The caller re-reads `produced()`
    /// afterwards. No wake-up is lost: a PU's bit is set once, under the ring's lock, and
    /// then stays, so every push either ran its critical section before the bit was set (and
    /// the caller's re-read, which follows the lock, sees its count) or after (and its
    /// `wake`, which follows the lock, sees the bit). That is why `push` needs no
    /// sequentially consistent store.
    #[inline]
    pub(crate) fn add_waiter(&self, pu: usize) {
        let bit = 1u64 << pu;
        if self.waiters.load(Ordering::Relaxed) & bit == 0 {
            let _ring = self.ring.lock();
            self.waiters.fetch_or(bit, Ordering::Relaxed);
        }
    }

    /// Arm the CQ: its next completion signals `channel`. Under the ring's lock, as `push`
    /// checks it, so a completion either comes after the arming (and signals) or before it
    /// (and whoever armed sees it when they poll or read the count next).
    pub(crate) fn req_notify(&self, channel: &CompChannel) {
        let old = self.ring.lock().notify.replace(channel.clone());
        // Dropped after the lock (it may be the last reference).
        drop(old);
    }

    /// Add a completion.
    pub(crate) fn push(&self, cqe: Cqe, wr_id: u64) {
        self.push_from(cqe, wr_id, None);
    }

    /// Add a completion from PU `from.1` of the set `from.0`, if the caller is a PU that
    /// knows which it is: waking the PUs that wait on this CQ then skips the caller's own
    /// without a thread-local lookup (`PuSet::notify_from`).
    // Inlined: the executor's completion path builds `cqe` from a few registers, and inline
    // it encodes them straight into the ring instead of through a struct in memory.
    #[inline(always)]
    pub(crate) fn push_from(&self, mut cqe: Cqe, wr_id: u64, from: Option<(&PuSet, usize)>) {
        let notify = {
            let mut r = self.ring.lock();
            let full = r.produced - r.consumed == self.depth;
            if full && !self.ignore_overrun {
                // The entry is lost, as on hardware; the poller learns of it.
                self.overrun.store(true, Ordering::Release);
            } else {
                if full {
                    // Only waited on: the oldest entry gives way.
                    r.consumed += 1;
                }
                let slot = (r.produced & (self.depth - 1)) as usize;
                // The owner bit flips each pass over the ring (depth is a power of two, so
                // this is bit log2(depth) of the count: no division on the hot path).
                cqe.owner = r.produced & self.depth != 0;
                cqe.encode_into(&mut r.cqes[slot]);
                r.wr_ids[slot] = wr_id;
                r.produced += 1;
            }
            // Every completion counts for WAIT, whether or not the ring had room for it.
            let total = self.produced.0.load(Ordering::Relaxed) + 1;
            self.produced.0.store(total, Ordering::Release);
            r.notify.take()
        };
        // Most pushes wake nobody: the call is only made when someone waits.
        if notify.is_some() || self.waiters.load(Ordering::Relaxed) != 0 {
            self.wake(notify, from);
        }
    }

    /// Tell the PUs waiting on this CQ to look again (it was destroyed).
    pub(crate) fn wake_waiters(&self) {
        self.wake(None, None);
    }

    /// Tell the PUs waiting on this CQ, and the channel it was armed for, if any. Called
    /// after the ring's lock is released: see `add_waiter` for why a relaxed load sees every
    /// bit it must.
    #[inline(never)]
    fn wake(&self, notify: Option<CompChannel>, from: Option<(&PuSet, usize)>) {
        if let Some(channel) = notify {
            channel.signal(self.cqn);
        }
        let mut m = self.waiters.load(Ordering::Relaxed);
        while m != 0 {
            let pu = m.trailing_zeros() as usize;
            match from {
                Some((set, me)) => self.pus.notify_from(pu, set, me),
                None => self.pus.notify(pu),
            }
            m &= m - 1;
        }
    }

    /// Take up to `max` completions. `Err` once if completions were lost to overrun.
    pub(crate) fn poll(&self, max: usize, out: &mut Vec<Completion>) -> Result<usize, ()> {
        if self.overrun.swap(false, Ordering::AcqRel) {
            return Err(());
        }
        // Room first, so the loop below never allocates while it holds the lock.
        out.reserve(max.min(self.depth as usize));
        let mut r = self.ring.lock();
        let mut n = 0;
        while n < max && r.consumed < r.produced {
            let slot = (r.consumed & (self.depth - 1)) as usize;
            if let Some(cqe) = Cqe::decode(&r.cqes[slot]) {
                out.push(completion_of(cqe, r.wr_ids[slot]));
                n += 1;
            }
            r.consumed += 1;
        }
        Ok(n)
    }
}

fn completion_of(cqe: Cqe, wr_id: u64) -> Completion {
    use crate::wqe::CqeOpcode::*;
    let status = if cqe.opcode.is_error() {
        Err(Syndrome::from_u8(cqe.syndrome).unwrap_or(Syndrome::LocalQpOperation))
    } else {
        Ok(())
    };
    Completion {
        wr_id,
        qpn: cqe.qpn,
        opcode: cqe.opcode,
        status,
        byte_len: cqe.byte_cnt,
        imm: matches!(cqe.opcode, RespWriteImm | RespSendImm).then_some(cqe.imm),
        cqe,
    }
}

#[cfg(test)]
mod tests {
    use super::{CqShared, PuSet};
    use crate::types::{Cqn, Qpn};
    use crate::wqe::{Cqe, CqeOpcode};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    fn cq(depth: u32, ignore_overrun: bool) -> CqShared {
        CqShared::new(Cqn(1), depth, ignore_overrun, Arc::new(PuSet::new(1)))
    }

    fn push(cq: &CqShared, i: u64) {
        let cqe = Cqe {
            opcode: CqeOpcode::Req,
            qpn: Qpn(7),
            send_opcode: 0,
            wqe_counter: i as u16,
            byte_cnt: i as u32,
            imm: 0,
            syndrome: 0,
            vendor_syndrome: 0,
            owner: false,
        };
        cq.push(cqe, i);
    }

    fn poll(cq: &CqShared, max: usize) -> Result<Vec<u64>, ()> {
        let mut out = Vec::new();
        cq.poll(max, &mut out)?;
        for c in &out {
            // Each entry read back whole: its fields belong to the same completion.
            assert_eq!(u64::from(c.cqe.wqe_counter), c.wr_id & 0xffff);
            assert_eq!(u64::from(c.byte_len), c.wr_id);
        }
        Ok(out.iter().map(|c| c.wr_id).collect())
    }

    /// Entries come back in order over several passes of a small ring (the owner bit flips
    /// each pass), and a poll of an empty ring, new or drained, finds nothing.
    #[test]
    fn polls_in_order_across_passes() {
        let q = cq(4, false);
        assert_eq!(poll(&q, 8), Ok(vec![]));
        let mut next = 0;
        for round in 0..5u64 {
            for _ in 0..=round % 4 {
                push(&q, next);
                next += 1;
            }
            let want: Vec<u64> = (next - 1 - round % 4..next).collect();
            // Taken in two polls when there are several: the second goes on where the first
            // stopped.
            let mut got = poll(&q, 1).expect("no overrun");
            got.extend(poll(&q, 8).expect("no overrun"));
            assert_eq!(got, want, "round {round}");
            assert_eq!(poll(&q, 8), Ok(vec![]));
        }
        assert_eq!(q.produced(), next);
    }

    /// A ring that fills loses what does not fit, says so once, and keeps what it had.
    #[test]
    fn overrun_is_reported_once_and_keeps_the_entries() {
        let q = cq(4, false);
        for i in 0..6 {
            push(&q, i);
        }
        assert_eq!(q.produced(), 6, "every completion counts for WAIT");
        assert_eq!(poll(&q, 8), Err(()));
        assert_eq!(poll(&q, 8), Ok(vec![0, 1, 2, 3]));
        push(&q, 6);
        assert_eq!(poll(&q, 8), Ok(vec![6]));
    }

    /// A CQ that is only waited on overwrites its oldest entries; a poll then takes the
    /// last ring's worth, in order.
    #[test]
    fn an_overwritten_ring_is_polled_from_what_is_left() {
        let q = cq(4, true);
        for i in 0..11 {
            push(&q, i);
        }
        assert_eq!(poll(&q, 16), Ok(vec![7, 8, 9, 10]));
        assert_eq!(poll(&q, 16), Ok(vec![]));
        push(&q, 11);
        assert_eq!(poll(&q, 16), Ok(vec![11]));
    }

    /// A producer and a poller on two threads, the producer never more than a ring ahead:
    /// every entry arrives once, whole and in order, across many passes, and whatever the
    /// count says was produced can be polled at once.
    #[test]
    fn a_concurrent_poller_sees_every_entry_in_order() {
        let n: u64 = if cfg!(miri) { 300 } else { 200_000 };
        let q = Arc::new(cq(16, false));
        let taken = Arc::new(AtomicU64::new(0));
        let producer = {
            let (q, taken) = (Arc::clone(&q), Arc::clone(&taken));
            std::thread::spawn(move || {
                for i in 0..n {
                    while i - taken.load(Ordering::Acquire) >= 16 {
                        std::thread::yield_now();
                    }
                    push(&q, i);
                }
            })
        };
        let mut next = 0;
        while next < n {
            let counted = q.produced();
            let got = poll(&q, 16).expect("never more than a ring ahead");
            assert!(
                next + got.len() as u64 >= counted,
                "the count said {counted}, but only {} were there to poll",
                next + got.len() as u64
            );
            for id in got {
                assert_eq!(id, next);
                next += 1;
            }
            taken.store(next, Ordering::Release);
            if next < n {
                std::thread::yield_now();
            }
        }
        producer.join().expect("producer");
        assert_eq!(q.produced(), n);
    }
}
