//! The softnic's object tables: what its handle, its PUs and its queues all reach.

use super::cache_line::CacheLine;
use super::config::SoftNicConfig;
use super::cq::CqShared;
use super::events::AsyncEvents;
use super::qp::QpShared;
use super::wake::PuSet;
use crate::mem::KeyTable;
use crate::types::{Cqn, Qpn};
use crate::{Error, Result};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

/// State shared by the softnic's handle, its PUs and its queues.
pub(crate) struct Shared {
    pub(crate) config: SoftNicConfig,
    pub(crate) keys: Arc<KeyTable>,
    pub(crate) pds: Mutex<HashSet<u32>>,
    pub(crate) cqs: RwLock<HashMap<u32, Arc<CqShared>>>,
    pub(crate) qps: RwLock<HashMap<u32, Arc<QpShared>>>,
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
    table: &RwLock<HashMap<u32, Arc<O>>>,
    n: u32,
    f: impl FnOnce(&O) -> T,
) -> Option<T> {
    table
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .get(&n)
        .map(|o| f(o))
}
