//! The object cache: the queues and CQs that WAIT, SEND_EN and RECV_EN name, kept per queue
//! so the hot paths compare plain numbers instead of taking the NIC's table locks.
//!
//! Invariant: every entry is dropped when the NIC's object generation moves (an object was
//! destroyed), so a cached object is one that still exists under that number.

use super::*;

/// Small caches of the queues and CQs that WAIT / SEND_EN / RECV_EN name, invalidated when
/// the NIC's object generation moves. Numbers are kept beside the objects so a hit compares
/// plain integers without following pointers.
#[derive(Default)]
pub(super) struct ObjCache {
    pub(super) generation: u64,
    pub(super) qps: Vec<(u32, Arc<QpShared>)>,
    pub(super) cqs: Vec<(u32, Arc<CqShared>)>,
}

/// Entries each of [`ObjCache`]'s lists keeps (programs name few queues and CQs).
pub(super) const OBJ_CACHE_SIZE: usize = 8;

impl ObjCache {
    #[inline(always)]
    pub(super) fn sync(&mut self, nic: &Shared) {
        let g = nic.objects_generation();
        if g != self.generation {
            self.qps.clear();
            self.cqs.clear();
            self.generation = g;
        }
    }

    #[inline(always)]
    pub(super) fn qp(&mut self, nic: &Shared, qpn: Qpn) -> Option<&Arc<QpShared>> {
        self.sync(nic);
        let (_, qp) = find_or_remember(&mut self.qps, qpn.0, || nic.qp(qpn).ok())?;
        Some(qp)
    }

    /// The CQ numbered `cqn`, and its index in the cache (see [`ObjCache::cq_at`]).
    #[inline(always)]
    pub(super) fn cq(&mut self, nic: &Shared, cqn: Cqn) -> Option<(usize, &Arc<CqShared>)> {
        self.sync(nic);
        find_or_remember(&mut self.cqs, cqn.0, || nic.cq(cqn).ok())
    }

    /// The CQ at index `i` if it is still `cqn` and no object has been destroyed since the
    /// cache last synced (cheaper than [`ObjCache::cq`]: no search).
    #[inline(always)]
    pub(super) fn cq_at(&self, nic: &Shared, i: usize, cqn: Cqn) -> Option<&CqShared> {
        if nic.objects_generation() != self.generation {
            return None;
        }
        match self.cqs.get(i) {
            Some((n, cq)) if *n == cqn.0 => Some(cq),
            _ => None,
        }
    }
}

/// Object `n` in one of [`ObjCache`]'s lists and its index there; on a miss, `load` it and
/// add it (None if there is no such object).
#[inline(always)]
pub(super) fn find_or_remember<T>(
    list: &mut Vec<(u32, Arc<T>)>,
    n: u32,
    load: impl FnOnce() -> Option<Arc<T>>,
) -> Option<(usize, &Arc<T>)> {
    let i = match list.iter().position(|(m, _)| *m == n) {
        Some(i) => i,
        None => remember(list, n, load()?),
    };
    Some((i, &list[i].1))
}

/// Add an object to one of [`ObjCache`]'s lists, dropping the oldest when full; its index.
#[cold]
pub(super) fn remember<T>(list: &mut Vec<(u32, Arc<T>)>, n: u32, obj: Arc<T>) -> usize {
    if list.len() >= OBJ_CACHE_SIZE {
        list.remove(0);
    }
    list.push((n, obj));
    list.len() - 1
}
