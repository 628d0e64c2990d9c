//! The softnic's object tables: what its handle, its PUs and its queues all reach.

use super::cache_line::CacheLine;
use super::config::SoftNicConfig;
use super::cq::CqShared;
use super::events::AsyncEvents;
use super::qp::QpShared;
use super::wake::PuSet;
use crate::mem::KeyTable;
use crate::types::{Cqn, Qpn, MAX_QPN};
use crate::{Error, Result};
use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

/// A table keyed by object number (QPN, CQN). Its hash is one multiplication, not SipHash:
/// every post and every received packet looks one up (SipHash was ~100 instructions of a
/// packet's ~1,500), and hash flooding needs inserts, which only the softnic's own object
/// creation makes, of numbers it hands out itself; a packet's QPN is only looked up.
pub(crate) type ObjectMap<V> = HashMap<u32, V, BuildHasherDefault<ObjectHasher>>;

/// [`ObjectMap`]'s hasher: Fibonacci hashing of the object number, which spreads
/// consecutive numbers over both the low bits (the bucket) and the high bits (the control
/// byte) of the hash.
#[derive(Default)]
pub(crate) struct ObjectHasher(u64);

impl Hasher for ObjectHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only u32 keys are hashed here; any other input still hashes, a byte at a time.
        for &b in bytes {
            self.write_u32(u32::from(b));
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.0 = (u64::from(n) ^ self.0).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// State shared by the softnic's handle, its PUs and its queues.
pub(crate) struct Shared {
    pub(crate) config: SoftNicConfig,
    pub(crate) keys: Arc<KeyTable>,
    pub(crate) pds: Mutex<HashSet<u32>>,
    pub(crate) cqs: RwLock<ObjectMap<Arc<CqShared>>>,
    pub(crate) qps: RwLock<ObjectMap<Arc<QpShared>>>,
    /// On its own cache line: PUs read it for every WAIT and SEND_EN, while hosts polling a
    /// CQ's count write the neighbouring lock words.
    pub(crate) objects_generation: CacheLine<AtomicU64>,
    pub(crate) next_pdn: AtomicU32,
    pub(crate) next_qpn: AtomicU32,
    pub(crate) next_cqn: AtomicU32,
    pub(crate) pus: Arc<PuSet>,
    /// Per PU, the queues created for it that it has not taken into its list yet.
    pub(crate) incoming: Box<[Mutex<Vec<Arc<QpShared>>>]>,
    /// Asynchronous events for the owner (`Nic::get_async_event`).
    pub(crate) events: Arc<AsyncEvents>,
    /// Per PU, what it polls while idle (a RoCE endpoint's socket).
    pub(crate) idle: super::idle::IdleHooks,
}

/// The next free QP or CQ number of `table` after the last one `counter` handed out:
/// numbers run from `first` to [`MAX_QPN`] (24 bits, as the NIC's) and then from `first`
/// again, skipping those in use; None if every one is. In turn, as Linux's rxe hands out QP
/// numbers (`xa_alloc_cyclic` in `__rxe_add_to_pool`, `rxe_pool.c`), so a number freed
/// comes back only after every other one has been handed out since: anything still naming
/// the old object by number (a WQE of a queue being torn down, a datagram in flight) has
/// long gone by then. Counting up forever instead ran out after 2^24 objects (an hour of a
/// remote client's hellos, three queues each), and every install failed from then on.
pub(crate) fn next_number<V>(
    counter: &AtomicU32,
    first: u32,
    table: &RwLock<ObjectMap<V>>,
) -> Option<u32> {
    let in_use = table.read().unwrap_or_else(|e| e.into_inner());
    for _ in first..=MAX_QPN {
        let step = |n: u32| Some(if n >= MAX_QPN { first } else { n + 1 });
        // The closure always gives a value: the update cannot fail.
        let n = counter
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, step)
            .unwrap_or(first);
        if !in_use.contains_key(&n) {
            return Some(n);
        }
    }
    None
}

impl Shared {
    pub(crate) fn objects_generation(&self) -> u64 {
        self.objects_generation.0.load(Ordering::Acquire)
    }

    pub(crate) fn qp(&self, qpn: Qpn) -> Result<Arc<QpShared>> {
        self.qps
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&qpn.0)
            .cloned()
            .ok_or(Error::NoSuchQp(qpn))
    }

    /// Run `f` on a queue pair without cloning its Arc: hosts poll these, and an Arc clone
    /// writes the reference count that shares a cache line with fields the PU reads.
    pub(crate) fn with_qp<T>(&self, qpn: Qpn, f: impl FnOnce(&QpShared) -> T) -> Result<T> {
        with_object(&self.qps, qpn.0, f).ok_or(Error::NoSuchQp(qpn))
    }

    /// Run `f` on a CQ without cloning its Arc, as `with_qp` does for queue pairs: hosts
    /// poll these, and an Arc clone writes the reference count, which shares a cache line
    /// with the CQ's fields.
    pub(crate) fn with_cq<T>(&self, cqn: Cqn, f: impl FnOnce(&CqShared) -> T) -> Result<T> {
        with_object(&self.cqs, cqn.0, f).ok_or(Error::NoSuchCq(cqn))
    }

    /// Hand a new queue to its PU.
    pub(crate) fn adopt(&self, qp: Arc<QpShared>) {
        let pu = qp.pu;
        self.incoming[pu]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(qp);
        self.pus.mark_changed(pu);
    }

    pub(crate) fn cq(&self, cqn: Cqn) -> Result<Arc<CqShared>> {
        self.cqs
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&cqn.0)
            .cloned()
            .ok_or(Error::NoSuchCq(cqn))
    }
}

/// Run `f` on object `n` of `table` under its read lock, without cloning its Arc (see
/// `Shared::with_qp`); None if there is no such object.
pub(crate) fn with_object<O, T>(
    table: &RwLock<ObjectMap<Arc<O>>>,
    n: u32,
    f: impl FnOnce(&O) -> T,
) -> Option<T> {
    table
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .get(&n)
        .map(|o| f(o))
}

#[cfg(test)]
mod tests {
    use super::{next_number, ObjectHasher, ObjectMap};
    use crate::nic::{CqConfig, Nic, QpConfig};
    use crate::softnic::{SoftNic, SoftNicConfig};
    use crate::types::MAX_QPN;
    use std::hash::{BuildHasher, BuildHasherDefault};
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::RwLock;

    /// Numbers come in turn up to the 24-bit limit and then from the first again, skipping
    /// those in use; with every one in use, none.
    #[test]
    fn numbers_wrap_past_the_last_and_skip_those_in_use() {
        let table: RwLock<ObjectMap<()>> = RwLock::new(ObjectMap::default());
        let counter = AtomicU32::new(MAX_QPN - 1);
        table.write().unwrap().insert(MAX_QPN, ());
        table.write().unwrap().insert(0x101, ());
        let mut got = Vec::new();
        for _ in 0..3 {
            got.push(next_number(&counter, 0x100, &table).unwrap());
        }
        assert_eq!(got, [MAX_QPN - 1, 0x100, 0x102]);
        // A table holding every number from 0xffff00 on, a counter inside that range.
        let full: RwLock<ObjectMap<()>> =
            RwLock::new((0x00ff_ff00..=MAX_QPN).map(|n| (n, ())).collect());
        let counter = AtomicU32::new(0x00ff_ff80);
        assert_eq!(next_number(&counter, 0x00ff_ff00, &full), None);
        full.write().unwrap().remove(&0x00ff_ff10);
        assert_eq!(next_number(&counter, 0x00ff_ff00, &full), Some(0x00ff_ff10));
    }

    /// A softnic's QP and CQ numbers come back round once the 24 bits are used up, so
    /// queues can be made and destroyed for ever; the numbers of queues still alive are
    /// never handed out again (before, every create failed once 2^24 numbers had gone).
    #[test]
    fn queue_numbers_are_reused_after_a_full_turn_never_while_in_use() {
        let nic = SoftNic::new(SoftNicConfig::new("numbers")).unwrap();
        let pd = nic.alloc_pd().unwrap();
        let kept_cq = nic.create_cq(CqConfig::new(4)).unwrap();
        let kept_qp = nic.create_qp(QpConfig::new(pd, kept_cq)).unwrap().qpn;
        nic.shared.next_cqn.store(MAX_QPN, Ordering::Relaxed);
        nic.shared.next_qpn.store(MAX_QPN, Ordering::Relaxed);
        let (mut cqs, mut qps) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            let cq = nic.create_cq(CqConfig::new(4)).unwrap();
            let qp = nic.create_qp(QpConfig::new(pd, cq)).unwrap().qpn;
            nic.destroy_qp(qp).unwrap();
            nic.destroy_cq(cq).unwrap();
            cqs.push(cq.0);
            qps.push(qp.0);
        }
        assert_eq!(cqs, [MAX_QPN, kept_cq.0 + 1, kept_cq.0 + 2], "CQ numbers");
        assert_eq!(qps, [MAX_QPN, kept_qp.0 + 1, kept_qp.0 + 2], "QP numbers");
    }

    /// Consecutive object numbers, as the softnic hands them out, land apart in both the
    /// bucket bits and the control-byte bits of the hash; keys of other types hash by
    /// their bytes; a table of them finds every one.
    #[test]
    fn object_numbers_spread_and_are_found() {
        let build = BuildHasherDefault::<ObjectHasher>::default();
        let hashes: Vec<u64> = (1u32..=64).map(|n| build.hash_one(n)).collect();
        let low: std::collections::HashSet<u64> = hashes.iter().map(|h| h & 63).collect();
        let top: std::collections::HashSet<u64> = hashes.iter().map(|h| h >> 57).collect();
        assert!(low.len() > 32, "bucket bits: {} distinct of 64", low.len());
        assert!(top.len() > 32, "control bits: {} distinct of 64", top.len());
        assert_ne!(build.hash_one(1u64), build.hash_one(2u64));
        assert_ne!(build.hash_one("ab"), build.hash_one("ba"));
        let mut map = ObjectMap::default();
        for n in 0..10_000u32 {
            map.insert(n * 7, n);
        }
        assert!((0..10_000u32).all(|n| map.get(&(n * 7)) == Some(&n)));
        assert_eq!(map.get(&1), None);
    }
}
