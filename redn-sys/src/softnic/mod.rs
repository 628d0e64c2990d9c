//! The softnic: a software RDMA NIC that executes mlx5 WQE bytes straight out of ring memory.
//!
//! It is the product's default backend, not a mock. It models what RedN programs depend on:
//! rings of 64-byte basic blocks in registered memory with ever-growing indices; managed
//! queues that only SEND_EN / RECV_EN advance; WAIT on completion counts; WQE prefetch (so a
//! self-modifying chain without doorbell ordering runs stale WQEs, as on hardware); processing
//! units that run queues in parallel; full key / PD / bounds / rights checks with error
//! completions, error state and flush; per-QP token-bucket rate limits and counters.
//!
//! Queue pairs connect within one softnic ([`SoftNic::connect`], loopback included) or across
//! two softnic instances of one process ([`SoftNic::connect_pair`]); the transport sits behind
//! a seam so a network transport can follow.

// Module order is dependency order: each imports only modules listed before it.
mod affinity;
mod cache_line;
mod config;
mod cq;
mod events;
mod exec;
pub mod handoff_trace;
mod idle;
mod in_process;
mod pu;
mod qp;
mod rate;
pub mod roce;
mod shared;
mod spin;
mod transport;
mod wake;
// After `pu` and `shared`, whose round it runs.
mod host_driven;

pub use affinity::{allowed_cpus, pin_calling_thread, MAX_CPUS};
pub use config::{Prefetch, SoftNicConfig};
pub use cq::completion_clock_ns;
pub use exec::MAX_MESSAGE;

use crate::conv::idx;
use crate::mem::{KeyTable, SharedBuffer};
use crate::nic::{
    AsyncEvent, CompChannel, Completion, CqConfig, MrInfo, Nic, ObjectCounts, QpConfig, QpCounters,
    QpInfo, RateLimit, RingInfo, RingPlacement,
};
use crate::types::{Access, Cqn, Lkey, Pdn, Qpn};
use crate::wqe::{
    bbs_for_ds, encode_recv, encode_wqe_into, wqe_index, Sge, WorkRequest, BB_SIZE, MAX_WQE_BYTES,
    SEG_SIZE,
};
use crate::{Error, QpState, Result};
use cache_line::CacheLine;
use cq::CqShared;
use events::AsyncEvents;
use in_process::InProcess;
use qp::{QpShared, Ring};
use shared::{ObjectMap, Shared};
use std::collections::HashSet;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use wake::PuSet;

/// The first QP number handed out, and again after the last: QPs 0 and 1 are InfiniBand's
/// management QPs (SMI, GSI), and the softnic has always begun well past them.
const FIRST_QPN: u32 = 0x100;
/// The first CQ number handed out.
const FIRST_CQN: u32 = 0x80;

/// A software RDMA NIC. Dropping it stops its processing units.
#[must_use = "dropping the softnic stops its processing units"]
pub struct SoftNic {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    /// The PUs' state when the calling threads run them (`host_driven`); None with PU
    /// threads.
    host: Option<host_driven::HostDriven>,
}

impl std::fmt::Debug for SoftNic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftNic")
            .field("name", &self.shared.config.name)
            .field("pus", &self.shared.config.pus)
            .field("prefetch", &self.shared.config.prefetch)
            .finish()
    }
}

fn check_pow2(what: &'static str, v: u32, max: u32) -> Result<()> {
    if v == 0 || !v.is_power_of_two() || v > max {
        return Err(Error::InvalidConfig {
            what,
            detail: format!("{v} is not a power of two in 1..={max}"),
        });
    }
    Ok(())
}

impl SoftNic {
    /// Largest send ring, in BBs (4 MiB of WQEs).
    pub const MAX_SQ_BBS: u32 = 1 << 16;
    /// Largest receive ring, in slots.
    pub const MAX_RQ_SLOTS: u32 = 1 << 16;
    /// Most scatter entries per receive.
    pub const MAX_RQ_SGES: u32 = 64;

    /// Start a softnic with `config.pus` processing units.
    pub fn new(config: SoftNicConfig) -> Result<SoftNic> {
        if config.pus == 0 || config.pus > 64 {
            return Err(Error::InvalidConfig {
                what: "softnic processing units",
                detail: format!("{} is outside 1..=64", config.pus),
            });
        }
        affinity::check(&config.pu_cpus)?;
        pu::read_cores();
        let pus = Arc::new(PuSet::new(config.pus));
        let shared = Arc::new(Shared {
            config,
            keys: Arc::new(KeyTable::new()),
            pds: Mutex::new(HashSet::new()),
            cqs: RwLock::new(ObjectMap::default()),
            qps: RwLock::new(ObjectMap::default()),
            objects_generation: CacheLine(AtomicU64::new(0)),
            next_pdn: AtomicU32::new(1),
            next_qpn: AtomicU32::new(FIRST_QPN),
            next_cqn: AtomicU32::new(FIRST_CQN),
            incoming: (0..pus.len()).map(|_| Mutex::new(Vec::new())).collect(),
            pus: Arc::clone(&pus),
            events: Arc::new(AsyncEvents::default()),
            idle: idle::IdleHooks::new(pus.len()),
        });
        let mut threads = Vec::new();
        if shared.config.host_driven {
            let host = Some(host_driven::HostDriven::new(pus.len()));
            return Ok(SoftNic {
                shared,
                threads,
                host,
            });
        }
        let mut pinned = Ok(());
        for i in 0..pus.len() {
            let p = Arc::clone(&pus);
            let w = Arc::downgrade(&shared);
            let name = format!("{}-pu{i}", shared.config.name);
            let t = std::thread::Builder::new()
                .name(name)
                .spawn(move || pu::run(i, p, w))
                .map_err(|e| Error::InvalidConfig {
                    what: "processing unit thread",
                    detail: e.to_string(),
                })?;
            let cpus = &shared.config.pu_cpus;
            if pinned.is_ok() && !cpus.is_empty() {
                pinned = affinity::pin(&t, cpus[i % cpus.len()]);
            }
            threads.push(t);
        }
        let nic = SoftNic {
            shared,
            threads,
            host: None,
        };
        // A PU that could not be pinned: dropping `nic` stops and joins every PU thread.
        pinned?;
        Ok(nic)
    }

    /// A softnic with default settings and `pus` processing units.
    pub fn with_pus(pus: usize) -> Result<SoftNic> {
        SoftNic::new(SoftNicConfig {
            pus,
            ..SoftNicConfig::default()
        })
    }

    /// Its settings.
    pub fn config(&self) -> &SoftNicConfig {
        &self.shared.config
    }

    /// The pacing queue pair `qp` was last given ([`Nic::set_rate_limit`]; unlimited if
    /// never), as `ibv_query_qp(3)` reports a QP's attributes back.
    ///
    /// # Errors
    /// `NoSuchQp` for a queue pair this NIC does not have.
    pub fn rate_limit(&self, qp: Qpn) -> Result<RateLimit> {
        let q = self.shared.qp(qp)?;
        let limit = *q.rate.lock().unwrap_or_else(|e| e.into_inner());
        Ok(limit)
    }

    /// Run the PUs' rounds now on a host-driven softnic ([`SoftNicConfig::host_driven`]);
    /// nothing on one with PU threads. For an app that waits without another call into the
    /// softnic, say for the word an answering WRITE lands (a CQ poll runs them too).
    pub fn progress(&self) {
        self.drive();
    }

    /// [`Nic::post_send`] to queue pair `q`, without running the queues.
    fn post_send_to(&self, q: &QpShared, wrs: &[WorkRequest]) -> Result<()> {
        let qp = q.qpn;
        let mut guard = q.post.lock().unwrap_or_else(|e| e.into_inner());
        let one: &mut [u8; MAX_WQE_BYTES] = &mut guard;
        let pi = q.posted.load(Ordering::Acquire);
        let consumed = q.consumed.load(Ordering::Acquire);
        // Encode everything first: a bad request posts nothing. Only the encoded bytes are
        // staged (64 per one-BB WQE, where an `EncodedWqe` holds the 1 KiB maximum); a lone
        // WQE, the common post, is written from where it was encoded, with no allocation.
        let lone = wrs.len() == 1;
        let mut many: Vec<u8> = Vec::new();
        let mut at = pi;
        for wr in wrs {
            let bbs = bbs_for_ds(encode_wqe_into(wr, qp, wqe_index(at), one)?);
            at += bbs as u64;
            if !lone {
                many.extend_from_slice(&one[..bbs * BB_SIZE]);
            }
        }
        let staged: &[u8] = if lone {
            &one[..idx(at - pi) * BB_SIZE]
        } else {
            &many
        };
        if at - consumed > q.sq.entries {
            return Err(Error::QueueFull {
                qpn: qp,
                queue: "send",
                capacity: q.sq.entries,
            });
        }
        for (i, bb) in staged.chunks_exact(BB_SIZE).enumerate() {
            let bb: &[u8; BB_SIZE] = bb.try_into().expect("chunks of one BB");
            q.sq.buffer.write_block(q.sq.entry_off(pi + i as u64), bb);
        }
        // Each WQE's wr_id goes with its first slot; its size is in its own control segment.
        let slot_mask = q.sq.entries - 1;
        let mut first = pi;
        for wr in wrs {
            q.sq_wr_ids[idx(first & slot_mask)].store(wr.wr_id, Ordering::Relaxed);
            first += bbs_for_ds(staged[idx(first - pi) * BB_SIZE + crate::wqe::off::DS]) as u64;
        }
        q.posted.store(at, Ordering::Release);
        // Only posts write it, and they hold the post lock: no locked add needed.
        let posts = &q.counters.host_posts;
        posts.store(
            posts.load(Ordering::Relaxed) + wrs.len() as u64,
            Ordering::Relaxed,
        );
        if !q.managed_send {
            q.doorbell.fetch_max(at, Ordering::AcqRel);
        }
        // A host-driven softnic has no PU thread to tell (the notice was a fence on every
        // post's path): the caller's `drive` runs the queues.
        if self.host.is_none() {
            q.pus.notify(q.pu);
        }
        Ok(())
    }

    /// [`Self::progress`], after each call that may give the queues work.
    #[inline]
    fn drive(&self) {
        if let Some(h) = &self.host {
            h.drive(&self.shared);
        }
    }

    /// Connect queue pair `a` of softnic `nic_a` with `b` of `nic_b` (in-process transport).
    pub fn connect_pair(nic_a: &SoftNic, a: Qpn, nic_b: &SoftNic, b: Qpn) -> Result<()> {
        let qa = nic_a.shared.qp(a)?;
        let qb = nic_b.shared.qp(b)?;
        for q in [&qa, &qb] {
            let st = q.state();
            // Nothing is set before both are checked, so a loopback QP passes twice.
            if st != QpState::Init || q.peer.lock().unwrap_or_else(|e| e.into_inner()).is_some() {
                return Err(Error::QpState {
                    qpn: q.qpn,
                    state: st,
                    what: "connect",
                    needed: "INIT and not yet connected",
                });
            }
        }
        *qa.peer.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(InProcess {
            target: Arc::clone(&qb),
            keys: Arc::clone(&nic_b.shared.keys),
        }));
        let _ = qb.requester.set(Arc::downgrade(&qa));
        if !Arc::ptr_eq(&qa, &qb) {
            *qb.peer.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(InProcess {
                target: Arc::clone(&qa),
                keys: Arc::clone(&nic_a.shared.keys),
            }));
            let _ = qa.requester.set(Arc::downgrade(&qb));
        }
        for q in [&qa, &qb] {
            q.set_ready();
            q.pus.notify(q.pu);
        }
        Ok(())
    }

    /// Every registered region's key and extent (for listings and audits).
    pub fn regions(&self) -> Vec<MrInfo> {
        self.shared.keys.regions().iter().map(MrInfo::of).collect()
    }

    /// The PU a queue pair runs on.
    pub fn qp_pu(&self, qp: Qpn) -> Result<usize> {
        Ok(self.shared.qp(qp)?.pu)
    }

    fn alloc_ring(
        placement: Option<RingPlacement>,
        entries: u64,
        stride: usize,
        what: &'static str,
    ) -> Result<Ring> {
        let bytes = idx(entries) * stride;
        let (buffer, offset) = match placement {
            Some(p) => {
                if p.offset % BB_SIZE != 0 || !p.buffer.contains(p.offset, bytes) {
                    return Err(Error::InvalidConfig {
                        what,
                        detail: format!(
                            "ring of {bytes} bytes at offset {} does not fit a 64-byte aligned \
                             window of the {}-byte buffer",
                            p.offset,
                            p.buffer.len()
                        ),
                    });
                }
                (p.buffer, p.offset)
            }
            None => (SharedBuffer::new(bytes), 0),
        };
        Ok(Ring {
            buffer,
            offset,
            entries,
            stride,
        })
    }

    fn ring_info(r: &Ring) -> RingInfo {
        RingInfo {
            buffer: Arc::clone(&r.buffer),
            offset: r.offset,
            // At most MAX_SQ_BBS / MAX_RQ_SLOTS (2^16) entries of at most 1 KiB.
            entries: u32::try_from(r.entries).expect("a ring has at most 2^16 entries"),
            stride: u32::try_from(r.stride).expect("a ring entry is at most 1 KiB"),
            addr: crate::types::VirtAddr(r.buffer.addr().0 + r.offset as u64),
        }
    }

    fn bump_objects(&self) {
        self.shared
            .objects_generation
            .0
            .fetch_add(1, Ordering::AcqRel);
    }
}

impl Drop for SoftNic {
    fn drop(&mut self) {
        self.shared.pus.shutdown.store(true, Ordering::SeqCst);
        self.shared.pus.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        // Break peer cycles so queue memory is freed.
        for q in self
            .shared
            .qps
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
        {
            q.destroyed.store(true, Ordering::Release);
            q.peer.lock().unwrap_or_else(|e| e.into_inner()).take();
        }
    }
}

impl Nic for SoftNic {
    fn name(&self) -> &str {
        &self.shared.config.name
    }

    fn alloc_pd(&self) -> Result<Pdn> {
        let pdn = self.shared.next_pdn.fetch_add(1, Ordering::Relaxed);
        self.shared
            .pds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(pdn);
        Ok(Pdn(pdn))
    }

    fn dealloc_pd(&self, pd: Pdn) -> Result<()> {
        let in_use = self
            .shared
            .qps
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .any(|q| q.pd == pd)
            || self.shared.keys.regions().iter().any(|r| r.pd == pd);
        if in_use {
            return Err(Error::Busy {
                what: format!("protection domain {pd}"),
                by: "queue pairs or memory regions".into(),
            });
        }
        if !self
            .shared
            .pds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&pd.0)
        {
            return Err(Error::NoSuchPd(pd));
        }
        Ok(())
    }

    fn reg_mr(
        &self,
        pd: Pdn,
        buffer: &Arc<SharedBuffer>,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<MrInfo> {
        if !self
            .shared
            .pds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&pd.0)
        {
            return Err(Error::NoSuchPd(pd));
        }
        let r = self.shared.keys.register(pd, buffer, offset, len, access)?;
        Ok(MrInfo::of(&r))
    }

    fn dereg_mr(&self, lkey: Lkey) -> Result<()> {
        self.shared
            .keys
            .deregister(lkey)
            .map(|_| ())
            .ok_or(Error::NoSuchKey(lkey))
    }

    fn create_cq(&self, cfg: CqConfig) -> Result<Cqn> {
        check_pow2("CQ depth", cfg.depth.max(1).next_power_of_two(), 1 << 20)?;
        let cqn = shared::next_number(&self.shared.next_cqn, FIRST_CQN, &self.shared.cqs)
            .ok_or_else(|| Error::InvalidConfig {
                what: "CQ number",
                detail: "every 24-bit CQ number is in use".into(),
            })?;
        let cq = Arc::new(CqShared::new(
            Cqn(cqn),
            cfg,
            Arc::clone(&self.shared.pus),
            Arc::clone(&self.shared.events),
        ));
        let mut cqs = self.shared.cqs.write().unwrap_or_else(|e| e.into_inner());
        // Taken meanwhile only if every other number was handed out since `next_number`.
        if cqs.contains_key(&cqn) {
            return Err(Error::InvalidConfig {
                what: "CQ number",
                detail: format!("{cqn:#x} was taken while the CQ was made"),
            });
        }
        cqs.insert(cqn, cq);
        Ok(Cqn(cqn))
    }

    fn destroy_cq(&self, cq: Cqn) -> Result<()> {
        let c = self.shared.cq(cq)?;
        if c.users.load(Ordering::Acquire) > 0 {
            return Err(Error::Busy {
                what: format!("completion queue {cq}"),
                by: "queue pairs".into(),
            });
        }
        self.shared
            .cqs
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&cq.0);
        self.bump_objects();
        // A queue blocked on a WAIT for this CQ must look again: its WAIT now names no CQ and
        // fails, rather than sleeping until something else wakes its PU.
        c.wake_waiters();
        Ok(())
    }

    fn create_qp(&self, cfg: QpConfig) -> Result<QpInfo> {
        check_pow2("send queue size (BBs)", cfg.sq_bbs, Self::MAX_SQ_BBS)?;
        check_pow2("receive queue size", cfg.rq_slots, Self::MAX_RQ_SLOTS)?;
        check_pow2("receive scatter entries", cfg.rq_sges, Self::MAX_RQ_SGES)?;
        if !self
            .shared
            .pds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&cfg.pd.0)
        {
            return Err(Error::NoSuchPd(cfg.pd));
        }
        let send_cq = self.shared.cq(cfg.send_cq)?;
        let recv_cq = self.shared.cq(cfg.recv_cq)?;
        let qpn = shared::next_number(&self.shared.next_qpn, FIRST_QPN, &self.shared.qps)
            .ok_or_else(|| Error::InvalidConfig {
                what: "QP number",
                detail: "every 24-bit QP number is in use".into(),
            })?;
        let pu = cfg.pu.unwrap_or(qpn as usize) % self.shared.pus.len();
        let sq = Self::alloc_ring(
            cfg.sq_placement,
            u64::from(cfg.sq_bbs),
            BB_SIZE,
            "send queue placement",
        )?;
        let rq = Self::alloc_ring(
            cfg.rq_placement,
            u64::from(cfg.rq_slots),
            cfg.rq_sges as usize * SEG_SIZE,
            "receive queue placement",
        )?;
        send_cq.users.fetch_add(1, Ordering::AcqRel);
        recv_cq.users.fetch_add(1, Ordering::AcqRel);
        let qp = Arc::new(QpShared::new(
            Qpn(qpn),
            cfg.pd,
            pu,
            Arc::clone(&self.shared.pus),
            cfg.managed_send,
            cfg.managed_recv,
            cfg.atomic_be_reply,
            Arc::clone(&self.shared.events),
            sq,
            rq,
            send_cq,
            recv_cq,
        ));
        let info = QpInfo {
            qpn: Qpn(qpn),
            sq: Self::ring_info(&qp.sq),
            rq: Self::ring_info(&qp.rq.ring),
            pu,
        };
        let mut qps = self.shared.qps.write().unwrap_or_else(|e| e.into_inner());
        // Taken meanwhile only if every other number was handed out since `next_number`.
        if qps.contains_key(&qpn) {
            drop(qps);
            qp.send_cq.users.fetch_sub(1, Ordering::AcqRel);
            qp.recv_cq.users.fetch_sub(1, Ordering::AcqRel);
            return Err(Error::InvalidConfig {
                what: "QP number",
                detail: format!("{qpn:#x} was taken while the QP was made"),
            });
        }
        qps.insert(qpn, Arc::clone(&qp));
        drop(qps);
        self.shared.adopt(qp);
        Ok(info)
    }

    fn connect(&self, a: Qpn, b: Qpn) -> Result<()> {
        SoftNic::connect_pair(self, a, self, b)
    }

    fn objects(&self) -> ObjectCounts {
        ObjectCounts {
            pds: self
                .shared
                .pds
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .len(),
            regions: self.shared.keys.live(),
            cqs: self
                .shared
                .cqs
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .len(),
            qps: self
                .shared
                .qps
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .len(),
        }
    }

    fn destroy_qp(&self, qp: Qpn) -> Result<()> {
        let q = self
            .shared
            .qps
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&qp.0)
            .ok_or(Error::NoSuchQp(qp))?;
        q.enter_error();
        q.destroyed.store(true, Ordering::Release);
        let peer = q.peer.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(p) = peer {
            p.detach();
        }
        q.send_cq.users.fetch_sub(1, Ordering::AcqRel);
        q.recv_cq.users.fetch_sub(1, Ordering::AcqRel);
        self.bump_objects();
        q.pus.mark_changed(q.pu);
        Ok(())
    }

    fn post_send(&self, qp: Qpn, wrs: &[WorkRequest]) -> Result<()> {
        // Under the object table's read lock rather than an Arc cloned out of it (two atomic
        // operations a post).
        self.shared.with_qp(qp, |q| self.post_send_to(q, wrs))??;
        self.drive();
        Ok(())
    }

    fn post_recv(&self, qp: Qpn, wr_id: u64, sgl: &[Sge]) -> Result<()> {
        let q = self.shared.qp(qp)?;
        let guard = q.post.lock().unwrap_or_else(|e| e.into_inner());
        let entries = q.rq.ring.stride / SEG_SIZE;
        let bytes = encode_recv(sgl, entries)?;
        let posted = q.rq.posted.load(Ordering::Acquire);
        let consumed = *q.rq.consumer.lock().unwrap_or_else(|e| e.into_inner());
        if posted - consumed >= q.rq.ring.entries {
            return Err(Error::QueueFull {
                qpn: qp,
                queue: "receive",
                capacity: q.rq.ring.entries,
            });
        }
        q.rq.ring.buffer.write(q.rq.ring.entry_off(posted), &bytes);
        q.rq.wr_ids[idx(posted & (q.rq.ring.entries - 1))].store(wr_id, Ordering::Relaxed);
        q.rq.posted.store(posted + 1, Ordering::Release);
        if q.state() == QpState::Error {
            q.flush_recv();
        }
        q.wake_requester();
        drop(guard);
        self.drive();
        Ok(())
    }

    fn ring_doorbell(&self, qp: Qpn, pi: u64) -> Result<()> {
        let q = self.shared.qp(qp)?;
        if !q.managed_send {
            q.doorbell.fetch_max(pi, Ordering::AcqRel);
            q.pus.notify(q.pu);
        }
        self.drive();
        Ok(())
    }

    fn note_posted(&self, qp: Qpn, pi: u64, end: u64, wr_id: u64) -> Result<()> {
        let q = self.shared.qp(qp)?;
        q.sq_wr_ids[idx(pi & (q.sq.entries - 1))].store(wr_id, Ordering::Relaxed);
        q.posted.fetch_max(end, Ordering::AcqRel);
        Ok(())
    }

    fn note_recvs_posted(&self, qp: Qpn, n: u64) -> Result<()> {
        let q = self.shared.qp(qp)?;
        if n > q.rq.ring.entries {
            return Err(Error::QueueFull {
                qpn: qp,
                queue: "receive",
                capacity: q.rq.ring.entries,
            });
        }
        q.rq.posted.fetch_max(n, Ordering::AcqRel);
        q.wake_requester();
        self.drive();
        Ok(())
    }

    fn poll_cq(&self, cq: Cqn, max: usize, out: &mut Vec<Completion>) -> Result<usize> {
        // Hosts spin on this: a poll that finds nothing writes none of the CQ's lines.
        self.drive();
        self.shared
            .with_cq(cq, |c| c.poll(max, out))?
            .map_err(|()| Error::CqOverrun(cq))
    }

    fn cq_produced(&self, cq: Cqn) -> Result<u64> {
        self.drive();
        self.shared.with_cq(cq, CqShared::produced)
    }

    fn req_notify_cq(&self, cq: Cqn, channel: &CompChannel) -> Result<()> {
        self.shared.cq(cq)?.req_notify(channel);
        Ok(())
    }

    fn qp_state(&self, qp: Qpn) -> Result<QpState> {
        self.shared.with_qp(qp, |q| q.state())
    }

    fn get_async_event(&self) -> Option<AsyncEvent> {
        self.shared.events.take()
    }

    fn async_events_lost(&self) -> u64 {
        self.shared.events.lost()
    }

    fn set_qp_error(&self, qp: Qpn) -> Result<()> {
        self.shared.qp(qp)?.enter_error();
        Ok(())
    }

    /// The PU picks the new limit up when it next visits the queue; a queue that a doorbell
    /// chain on the same PU enables step by step, when the master queue's next visit
    /// starts (at most 128 steps later: see `exec::Core::run_doorbell_steps`).
    fn set_rate_limit(&self, qp: Qpn, limit: RateLimit) -> Result<()> {
        let q = self.shared.qp(qp)?;
        *q.rate.lock().unwrap_or_else(|e| e.into_inner()) = limit;
        q.rate_generation.fetch_add(1, Ordering::AcqRel);
        q.pus.notify(q.pu);
        Ok(())
    }

    fn counters(&self, qp: Qpn) -> Result<QpCounters> {
        self.shared.with_qp(qp, |q| q.counters.snapshot())
    }

    fn sq_consumed(&self, qp: Qpn) -> Result<u64> {
        self.shared
            .with_qp(qp, |q| q.consumed.load(Ordering::Acquire))
    }
}
