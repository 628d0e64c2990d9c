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
