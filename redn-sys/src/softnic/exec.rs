//! The send-queue executor: fetches WQE bytes from ring memory and runs them.
//!
//! One [`SqExec`] per queue pair, owned by the queue's processing unit, so the consumer index,
//! the prefetch snapshots and the key caches need no locks. Faithful points:
//! - WQEs are read from the ring as bytes, so an RDMA WRITE, READ scatter or CAS that landed in
//!   the ring before the WQE was fetched changes what runs;
//! - fetching stops at the doorbell (unmanaged) or enabled index (managed), and may run ahead of
//!   execution by the configured prefetch depth: a WQE patched after it was prefetched runs as
//!   it was fetched (stale), as on ConnectX;
//! - operations of one queue complete in order before the next starts, so a FENCE is always
//!   satisfied here (ConnectX needs it; programs must still set it, the verifier checks that).

use super::cq::CqShared;
use super::qp::{QpShared, Ring};
use super::rate::Limiter;
use super::transport::{AtomicOp, InProcess, Nak, Transport};
use super::Shared;
use crate::mem::KeyCache;
use crate::nic::QpCounters;
use crate::types::{Access, Cqn, Qpn, Rkey, VirtAddr};
use crate::wqe::{
    bbs_for_ds, off, Cqe, CqeOpcode, Opcode, RemoteAddr, Syndrome, BB_SIZE, INLINE_FLAG, MAX_DS,
    MAX_WQE_BYTES, SEG_SIZE,
};
use crate::QpState;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// Largest message one WQE may move. ConnectX allows 1 GiB; the softnic stages payloads in
/// memory, so it caps them lower and fails bigger ones with a local length error.
pub const MAX_MESSAGE: u64 = 16 << 20;

pub(crate) enum RunOutcome {
    /// At least one WQE ran (or was flushed).
    Progress,
    /// Nothing to do until something notifies the PU.
    Idle,
    /// Nothing to do before this time (rate limit).
    RetryAt(Instant),
}

enum Step {
    /// Ran; the WQE occupied this many BBs.
    Done(u64),
    /// Not runnable yet (not fully enabled, WAIT not satisfied, receiver not ready).
    Blocked,
    /// Rate limited until then.
    Retry(Instant),
    /// Failed: error completion, QP to error.
    Fault(Syndrome, u64),
}

/// Snapshot ring slot `index` into its place in `snap` (a power-of-two ring of BBs).
#[inline(always)]
fn fetch_block(ring: &Ring, snap: &mut [[u8; BB_SIZE]], index: u64) {
    let mask = snap.len() as u64 - 1;
    ring.buffer
        .read_block(ring.entry_off(index), &mut snap[(index & mask) as usize]);
}

const OP_NOP: u8 = Opcode::Nop as u8;
const OP_WRITE: u8 = Opcode::RdmaWrite as u8;
const OP_READ: u8 = Opcode::RdmaRead as u8;
const OP_WAIT: u8 = Opcode::Wait as u8;
const OP_CAS: u8 = Opcode::AtomicCs as u8;
const OP_FAA: u8 = Opcode::AtomicFa as u8;
const OP_MASKED_CAS: u8 = Opcode::AtomicMaskedCs as u8;
const OP_MASKED_FAA: u8 = Opcode::AtomicMaskedFa as u8;
const OP_SEND_EN: u8 = Opcode::SendEn as u8;
const OP_RECV_EN: u8 = Opcode::RecvEn as u8;

#[inline]
fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

#[inline]
fn be64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}

/// Small caches of the queues and CQs that WAIT / SEND_EN / RECV_EN name, invalidated when
/// the NIC's object generation moves.
#[derive(Default)]
struct ObjCache {
    generation: u64,
    qps: Vec<Arc<QpShared>>,
    cqs: Vec<Arc<CqShared>>,
}

impl ObjCache {
    #[inline(always)]
    fn sync(&mut self, nic: &Shared) {
        let g = nic.objects_generation();
        if g != self.generation {
            self.qps.clear();
            self.cqs.clear();
            self.generation = g;
        }
    }

    #[inline(always)]
    fn qp(&mut self, nic: &Shared, qpn: Qpn) -> Option<&Arc<QpShared>> {
        self.sync(nic);
        if let Some(i) = self.qps.iter().position(|q| q.qpn == qpn) {
            return Some(&self.qps[i]);
        }
        let q = nic.qp(qpn).ok()?;
        if self.qps.len() >= 8 {
            self.qps.remove(0);
        }
        self.qps.push(q);
        self.qps.last()
    }

    #[inline(always)]
    fn cq(&mut self, nic: &Shared, cqn: Cqn) -> Option<&Arc<CqShared>> {
        self.sync(nic);
        if let Some(i) = self.cqs.iter().position(|c| c.cqn == cqn) {
            return Some(&self.cqs[i]);
        }
        let c = nic.cq(cqn).ok()?;
        if self.cqs.len() >= 8 {
            self.cqs.remove(0);
        }
        self.cqs.push(c);
        self.cqs.last()
    }
}

pub(crate) struct SqExec {
    qp: Arc<QpShared>,
    nic: Arc<Shared>,
    /// Consumer index: first BB of the next WQE to run.
    ci: u64,
    /// BBs below this have been fetched into `snap`.
    fetched: u64,
    snap: Box<[[u8; BB_SIZE]]>,
    /// How many BBs past the current WQE may be fetched early.
    depth: u64,
    local_keys: KeyCache,
    remote_keys: KeyCache,
    peer: Option<Arc<dyn Transport>>,
    objs: ObjCache,
    limiter: Limiter,
    rate_generation: u64,
    batch: QpCounters,
    /// Opcodes counted in `batch` (bit per opcode), and whether anything else was.
    batch_ops: u32,
    batch_dirty: bool,
    stalled_at: u64,
    delayed_at: u64,
    scratch: Vec<u8>,
    wqe: [u8; MAX_WQE_BYTES],
    /// `SoftNicConfig::wqe_checks`, read once.
    wqe_checks: bool,
    /// `peer` when it is in this process, for the fast path to reach without a dynamic call.
    direct: Option<Arc<InProcess>>,
}

impl SqExec {
    pub(crate) fn new(qp: Arc<QpShared>, nic: Arc<Shared>) -> SqExec {
        let entries = qp.sq.entries;
        let depth = nic.config.prefetch.depth(entries);
        let cap = (depth + crate::wqe::MAX_WQE_BBS as u64).next_power_of_two();
        let wqe_checks = nic.config.wqe_checks;
        SqExec {
            snap: vec![[0u8; BB_SIZE]; cap as usize].into_boxed_slice(),
            depth,
            qp,
            nic,
            ci: 0,
            fetched: 0,
            local_keys: KeyCache::new(),
            remote_keys: KeyCache::new(),
            peer: None,
            objs: ObjCache::default(),
            limiter: Limiter::default(),
            rate_generation: 0,
            batch: QpCounters::default(),
            batch_ops: 0,
            batch_dirty: false,
            stalled_at: u64::MAX,
            delayed_at: u64::MAX,
            scratch: Vec::new(),
            wqe: [0u8; MAX_WQE_BYTES],
            wqe_checks,
            direct: None,
        }
    }

    pub(crate) fn is_destroyed(&self) -> bool {
        self.qp.destroyed.load(Ordering::Acquire)
    }

    /// The index fetching may not pass.
    #[inline]
    fn limit(&self) -> u64 {
        if self.qp.managed_send {
            self.qp.enabled.load(Ordering::Acquire)
        } else {
            self.qp.doorbell.load(Ordering::Acquire)
        }
    }

    #[inline(always)]
    fn fetch(&mut self, index: u64) {
        fetch_block(&self.qp.sq, &mut self.snap, index);
    }

    /// Run up to `budget` WQEs.
    pub(crate) fn run(&mut self, budget: usize) -> RunOutcome {
        match self.qp.state() {
            QpState::Init => return RunOutcome::Idle,
            QpState::Error => {
                return if self.flush() {
                    RunOutcome::Progress
                } else {
                    RunOutcome::Idle
                }
            }
            QpState::ReadyToSend => {}
        }
        if self.peer.is_none() {
            self.peer = self
                .qp
                .peer
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            self.direct = self.peer.clone().and_then(|p| p.in_process_arc());
        }
        let g = self.qp.rate_generation.load(Ordering::Acquire);
        if g != self.rate_generation {
            self.rate_generation = g;
            self.limiter = Limiter::new(*self.qp.rate.lock().unwrap_or_else(|e| e.into_inner()));
        }
        let mut limit = self.limit();
        let mut done = 0;
        let mut outcome = RunOutcome::Idle;
        // A rate-limited queue takes the general path, which admits each WQE.
        let fast = !self.limiter.is_active();
        while done < budget {
            if self.ci >= limit {
                limit = self.limit();
                if self.ci >= limit {
                    break;
                }
            }
            if fast {
                let (n, blocked) = self.run_fast(limit, budget - done);
                done += n;
                if blocked {
                    break;
                }
                if done >= budget || self.ci >= limit {
                    continue;
                }
            }
            match self.step(limit) {
                Step::Done(bbs) => {
                    self.ci += bbs;
                    done += 1;
                }
                Step::Blocked => break,
                Step::Retry(t) => {
                    outcome = RunOutcome::RetryAt(t);
                    break;
                }
                Step::Fault(syndrome, bbs) => {
                    self.fault(syndrome, bbs);
                    done += 1;
                    break;
                }
            }
        }
        if done > 0 {
            // Counters first: whoever sees a WQE consumed sees it counted.
            self.flush_counters();
            self.qp.consumed.store(self.ci, Ordering::Release);
            return RunOutcome::Progress;
        }
        self.flush_counters();
        outcome
    }

    /// Publish the batched counters.
    #[inline]
    fn flush_counters(&mut self) {
        if !self.batch_dirty {
            return;
        }
        self.qp.counters.add(&self.batch, self.batch_ops);
        // Zero only what was used: clearing the whole 300-byte batch is a memset per burst.
        let mut ops = self.batch_ops;
        while ops != 0 {
            self.batch.wqes[ops.trailing_zeros() as usize] = 0;
            ops &= ops - 1;
        }
        let b = &mut self.batch;
        (
            b.bytes,
            b.errors,
            b.wait_stalls,
            b.rate_limit_delays,
            b.rnr_waits,
        ) = (0, 0, 0, 0, 0);
        self.batch_ops = 0;
        self.batch_dirty = false;
    }

    /// True if the control segment names this queue and this index (the check ConnectX makes
    /// unless told otherwise; RedN's chains need it off, see `SoftNicConfig::wqe_checks`).
    #[inline]
    fn wqe_is_ours(&self, w: &[u8], ci: u64) -> bool {
        be32(w, off::QPN) >> 8 == self.qp.qpn.0
            && u16::from_be_bytes([w[off::WQE_INDEX], w[off::WQE_INDEX + 1]]) == ci as u16
    }

    /// The fast path: runs consecutive one-BB WQEs with the same fetch, prefetch, checks,
    /// effects, counters and completions as [`Self::step`]. NOPs, WAITs, SEND_ENs, RECV_ENs,
    /// and RDMA WRITEs and READs with one data segment and atomics to an in-process peer run
    /// inline; any
    /// other one-BB WQE, and any of those that a check refuses, goes through
    /// [`Self::execute`] (so every error is produced in one place). It stops at the first
    /// multi-BB WQE, leaving it to `step`. Returns how many WQEs ran (or failed), and true if
    /// the queue cannot go on now (a WAIT not reached, a receiver not ready, a fault).
    ///
    /// Why: this is most of what RedN chains and the host's data path execute, and the
    /// general path's staging, dispatch and dynamic transport call cost more than the
    /// operation itself (see docs/architecture.md, "Softnic fast path").
    #[inline(never)]
    fn run_fast(&mut self, limit: u64, budget: usize) -> (usize, bool) {
        // Moved out for the loop (no reference count traffic) and put back at the end.
        let direct_peer = self.direct.take();
        let direct = direct_peer.as_deref();
        // The snapshots too: the loop then keeps their address in a register.
        let mut snap = std::mem::take(&mut self.snap);
        let mask = snap.len() as u64 - 1;
        let pd = self.qp.pd;
        let (mut ci, mut fetched) = (self.ci, self.fetched);
        let mut done = 0;
        let mut stop = false;
        // Counts kept in registers, moved into `batch` before anything that publishes it.
        let (mut nops, mut writes, mut reads, mut bytes) = (0u64, 0u64, 0u64, 0u64);
        while done < budget && ci < limit {
            if fetched <= ci {
                fetched = ci;
                fetch_block(&self.qp.sq, &mut snap, ci);
                fetched += 1;
            }
            let slot = (ci & mask) as usize;
            let ds = snap[slot][off::DS] & MAX_DS;
            if usize::from(ds) * SEG_SIZE > BB_SIZE {
                break;
            }
            // Prefetch exactly as `step` does: up to `depth` BBs past this one.
            let ahead = (ci + 1 + self.depth).min(limit).min(ci + mask + 1);
            while fetched < ahead {
                fetch_block(&self.qp.sq, &mut snap, fetched);
                fetched += 1;
            }
            let w = &snap[slot];
            let opcode = w[off::OPCODE];
            let signaled = w[off::FM_CE_SE] & 0x0c == 0x08;
            let checked = !self.wqe_checks || self.wqe_is_ours(w, ci);
            // Some((payload bytes, CQE byte count)) if it ran inline; None: `execute` runs it.
            let inline: Option<(u64, u32)> = match opcode {
                _ if !checked => None,
                OP_NOP if ds >= 1 => {
                    nops += 1;
                    Some((0, 0))
                }
                OP_WRITE | OP_READ if ds == 3 => (|| {
                    let seg = 2 * SEG_SIZE;
                    let len = be32(w, seg + off::SEG_BYTE_COUNT);
                    let peer = direct?;
                    if len & INLINE_FLAG != 0 || u64::from(len) > MAX_MESSAGE {
                        return None;
                    }
                    let len = u64::from(len);
                    let lkey = be32(w, seg + off::SEG_LKEY);
                    let addr = VirtAddr(be64(w, seg + off::SEG_ADDR));
                    let remote = remote_of(w);
                    let write = opcode == OP_WRITE;
                    let (local_need, remote_need) = if write {
                        (Access::NONE, Access::REMOTE_WRITE)
                    } else {
                        (Access::LOCAL_WRITE, Access::REMOTE_READ)
                    };
                    let local = self.local_keys.get(&self.nic.keys, lkey).ok()?;
                    let local = local.window(pd, addr, len, local_need)?;
                    let far =
                        peer.remote_window(&mut self.remote_keys, remote, len, remote_need)?;
                    if write {
                        far.copy_from(&local);
                        writes += 1;
                        Some((len, 0))
                    } else {
                        local.copy_from(&far);
                        reads += 1;
                        Some((len, len as u32))
                    }
                })(),
                OP_CAS | OP_FAA | OP_MASKED_CAS | OP_MASKED_FAA
                    if ds >= if opcode == OP_MASKED_CAS { 4 } else { 3 } =>
                {
                    (|| {
                        let peer = direct?;
                        let op = Opcode::from_u8(opcode)?;
                        let (atomic, result_seg) = atomic_of(w, op);
                        // The result's local window is checked before the remote atomic, as
                        // the general path does, so a refusal leaves the target untouched.
                        let result = if usize::from(ds) > result_seg {
                            let seg = result_seg * SEG_SIZE;
                            let lkey = be32(w, seg + off::SEG_LKEY);
                            let addr = VirtAddr(be64(w, seg + off::SEG_ADDR));
                            let region = self.local_keys.get(&self.nic.keys, lkey).ok()?;
                            Some(region.window(pd, addr, 8, Access::LOCAL_WRITE)?)
                        } else {
                            None
                        };
                        let old = peer
                            .atomic(&mut self.remote_keys, remote_of(w), atomic)
                            .ok()?;
                        if let Some(r) = result {
                            // ConnectX returns the old value big-endian (ATOMIC_BE_REPLY).
                            r.write(&old.to_be_bytes());
                        }
                        self.count_wqes(opcode, 1);
                        Some((8, 8))
                    })()
                }
                OP_WAIT | OP_SEND_EN | OP_RECV_EN if ds >= 2 => {
                    let obj = be32(w, off::WAIT_OBJ);
                    let pi = be32(w, off::WAIT_PI);
                    let ran = if opcode == OP_WAIT {
                        match self.wait(ci, Cqn(obj), pi) {
                            Ok(true) => true,
                            Ok(false) => {
                                stop = true;
                                break;
                            }
                            Err(_) => false,
                        }
                    } else {
                        let target = Qpn(obj & crate::types::MAX_QPN);
                        self.enable(opcode == OP_SEND_EN, target, pi).is_ok()
                    };
                    ran.then(|| {
                        self.count_wqes(opcode, 1);
                        (0, 0)
                    })
                }
                _ => None,
            };
            match inline {
                Some((len, byte_cnt)) => {
                    bytes += len;
                    if signaled {
                        self.add_fast_counts([nops, writes, reads], bytes);
                        (nops, writes, reads, bytes) = (0, 0, 0, 0);
                        self.complete(ci, 1, opcode, byte_cnt);
                    }
                }
                None => {
                    // The general path's decoder, checks and operations, on this WQE.
                    self.add_fast_counts([nops, writes, reads], bytes);
                    (nops, writes, reads, bytes) = (0, 0, 0, 0);
                    let w = snap[slot];
                    self.wqe[..BB_SIZE].copy_from_slice(&w);
                    match self.execute(ci, 1) {
                        Step::Done(_) => {}
                        Step::Blocked => {
                            stop = true;
                            break;
                        }
                        // Only a rate-limited queue is retried, and those do not come here.
                        Step::Retry(_) => break,
                        Step::Fault(syndrome, bbs) => {
                            (self.ci, self.fetched) = (ci, fetched);
                            self.direct = direct_peer;
                            self.snap = snap;
                            self.fault(syndrome, bbs);
                            return (done + 1, true);
                        }
                    }
                }
            }
            ci += 1;
            done += 1;
        }
        self.add_fast_counts([nops, writes, reads], bytes);
        self.ci = ci;
        self.fetched = fetched;
        self.direct = direct_peer;
        self.snap = snap;
        (done, stop)
    }

    /// Move the fast path's counts into the batch.
    #[inline]
    fn add_fast_counts(&mut self, counts: [u64; 3], bytes: u64) {
        if counts == [0; 3] && bytes == 0 {
            return;
        }
        for (op, n) in [OP_NOP, OP_WRITE, OP_READ].into_iter().zip(counts) {
            if n != 0 {
                self.count_wqes(op, n);
            }
        }
        self.batch.bytes += bytes;
    }

    /// Count `n` WQEs of `opcode` in the batch.
    #[inline(always)]
    fn count_wqes(&mut self, opcode: u8, n: u64) {
        let op = opcode & 31;
        self.batch.wqes[usize::from(op)] += n;
        self.batch_ops |= 1 << op;
        self.batch_dirty = true;
    }

    /// Fetch (as far as allowed) and run the WQE at `ci`.
    #[inline]
    fn step(&mut self, limit: u64) -> Step {
        let ci = self.ci;
        let mask = self.snap.len() as u64 - 1;
        if self.fetched <= ci {
            self.fetched = ci;
            self.fetch(ci);
            self.fetched = ci + 1;
        }
        let bbs = bbs_for_ds(self.snap[(ci & mask) as usize][off::DS]) as u64;
        if ci + bbs > limit {
            return Step::Blocked;
        }
        let ahead = (ci + bbs + self.depth).min(limit).min(ci + mask + 1);
        while self.fetched < ahead.max(ci + bbs) {
            let j = self.fetched;
            self.fetch(j);
            self.fetched = j + 1;
        }
        for i in 0..bbs {
            let s = &self.snap[((ci + i) & mask) as usize];
            let at = i as usize * BB_SIZE;
            self.wqe[at..at + BB_SIZE].copy_from_slice(s);
        }
        self.execute(ci, bbs)
    }

    fn execute(&mut self, ci: u64, bbs: u64) -> Step {
        let w = &self.wqe;
        let opcode_byte = w[off::OPCODE];
        let ds = usize::from(w[off::DS] & 0x3f);
        let flags = w[off::FM_CE_SE];
        let Some(opcode) = Opcode::from_u8(opcode_byte) else {
            return Step::Fault(Syndrome::LocalQpOperation, bbs);
        };
        if self.wqe_checks && !self.wqe_is_ours(w, ci) {
            return Step::Fault(Syndrome::LocalQpOperation, bbs);
        }
        let need = match opcode {
            Opcode::Nop | Opcode::Send | Opcode::SendImm => 1,
            Opcode::AtomicCs | Opcode::AtomicFa | Opcode::AtomicMaskedFa => 3,
            Opcode::AtomicMaskedCs => 4,
            _ => 2,
        };
        if ds < need {
            return Step::Fault(Syndrome::LocalQpOperation, bbs);
        }

        if self.limiter.is_active() {
            let bytes = match opcode {
                Opcode::RdmaWrite | Opcode::RdmaWriteImm | Opcode::RdmaRead => {
                    payload_len(w, 2, ds)
                }
                Opcode::Send | Opcode::SendImm => payload_len(w, 1, ds),
                o if o.is_atomic() => 8,
                _ => 0,
            };
            if let Err(t) = self.limiter.admit(bytes) {
                if self.delayed_at != ci {
                    self.delayed_at = ci;
                    self.batch.rate_limit_delays += 1;
                    self.batch_dirty = true;
                }
                return Step::Retry(t);
            }
        }

        let result = match opcode {
            Opcode::Nop => Ok(0),
            Opcode::RdmaWrite | Opcode::RdmaWriteImm => self.op_write(opcode, ds),
            Opcode::Send | Opcode::SendImm => self.op_send(opcode, ds),
            Opcode::RdmaRead => self.op_read(ds),
            Opcode::AtomicCs
            | Opcode::AtomicFa
            | Opcode::AtomicMaskedCs
            | Opcode::AtomicMaskedFa => self.op_atomic(opcode, ds),
            Opcode::Wait => match self.op_wait(ci) {
                Ok(true) => Ok(0),
                Ok(false) => return Step::Blocked,
                Err(s) => Err(s),
            },
            Opcode::SendEn | Opcode::RecvEn => self.op_enable(opcode),
        };
        match result {
            Ok(bytes) => {
                self.count_wqes(opcode_byte, 1);
                self.batch.bytes += bytes;
                if flags & 0x0c == 0x08 {
                    let byte_cnt = match opcode {
                        Opcode::RdmaRead => bytes as u32,
                        o if o.is_atomic() => 8,
                        _ => 0,
                    };
                    self.complete(ci, bbs, opcode_byte, byte_cnt);
                }
                Step::Done(bbs)
            }
            Err(Fail::NotReady) => {
                self.batch.rnr_waits += 1;
                self.batch_dirty = true;
                Step::Blocked
            }
            Err(Fail::Syndrome(s)) => Step::Fault(s, bbs),
        }
    }

    /// Completion for the WQE of `bbs` BBs at `ci`.
    fn complete(&mut self, ci: u64, bbs: u64, opcode: u8, byte_cnt: u32) {
        // Whoever sees the completion must see the WQE counted, and its ring space free (a
        // host reuses the slots of completed WQEs at once).
        self.flush_counters();
        self.retire(ci, ci + bbs, CqeOpcode::Req, opcode, byte_cnt, 0);
    }

    /// Publish that the ring is consumed up to `next` and push the send CQE of the WQE at
    /// `ci`, in that order: a host that sees the completion may reuse the slots at once. The
    /// wr_id is read first, before the host can overwrite it.
    fn retire(
        &self,
        ci: u64,
        next: u64,
        opcode: CqeOpcode,
        send_opcode: u8,
        byte_cnt: u32,
        syndrome: u8,
    ) {
        let wr_id = self.wr_id(ci);
        self.qp.consumed.store(next, Ordering::Release);
        self.qp.send_cq.push(
            Cqe {
                opcode,
                qpn: self.qp.qpn,
                send_opcode,
                wqe_counter: ci as u16,
                byte_cnt,
                imm: 0,
                syndrome,
                vendor_syndrome: 0,
                owner: false,
            },
            wr_id,
        );
    }

    fn wr_id(&self, ci: u64) -> u64 {
        self.qp.sq_wr_ids[(ci & (self.qp.sq.entries - 1)) as usize].load(Ordering::Relaxed)
    }

    /// Gather the payload described by data (or inline) segments `from..ds` into `scratch`.
    fn gather(&mut self, from: usize, ds: usize) -> Result<usize, Fail> {
        let w = &self.wqe;
        if from < ds && be32(w, from * SEG_SIZE) & INLINE_FLAG != 0 {
            let len = (be32(w, from * SEG_SIZE) & !INLINE_FLAG) as usize;
            let at = from * SEG_SIZE + 4;
            if at + len > ds * SEG_SIZE {
                return Err(Fail::Syndrome(Syndrome::LocalLength));
            }
            if self.scratch.len() < len {
                self.scratch.resize(len, 0);
            }
            self.scratch[..len].copy_from_slice(&w[at..at + len]);
            return Ok(len);
        }
        let total = payload_len(w, from, ds);
        if total > MAX_MESSAGE {
            return Err(Fail::Syndrome(Syndrome::LocalLength));
        }
        if self.scratch.len() < total as usize {
            self.scratch.resize(total as usize, 0);
        }
        let mut at = 0usize;
        for s in from..ds {
            let seg = s * SEG_SIZE;
            let len = be32(w, seg + off::SEG_BYTE_COUNT) as usize;
            if len == 0 {
                continue;
            }
            let lkey = be32(w, seg + off::SEG_LKEY);
            let addr = VirtAddr(be64(w, seg + off::SEG_ADDR));
            let span = self
                .local_keys
                .get(&self.nic.keys, lkey)
                .and_then(|r| r.check(self.qp.pd, addr, len as u64, Access::NONE))
                .map_err(|_| Fail::Syndrome(Syndrome::LocalProtection))?;
            span.read(&mut self.scratch[at..at + len]);
            at += len;
        }
        Ok(at)
    }

    fn op_write(&mut self, opcode: Opcode, ds: usize) -> Result<u64, Fail> {
        let remote = remote_of(&self.wqe);
        let imm = (opcode == Opcode::RdmaWriteImm).then(|| be32(&self.wqe, off::IMM));
        if ds == 3 && be32(&self.wqe, 2 * SEG_SIZE) & INLINE_FLAG == 0 {
            // One data segment: copy region to region, no staging.
            let seg = 2 * SEG_SIZE;
            let len = u64::from(be32(&self.wqe, seg + off::SEG_BYTE_COUNT));
            let lkey = be32(&self.wqe, seg + off::SEG_LKEY);
            let addr = VirtAddr(be64(&self.wqe, seg + off::SEG_ADDR));
            if len > MAX_MESSAGE {
                return Err(Fail::Syndrome(Syndrome::LocalLength));
            }
            let src = self
                .local_keys
                .get(&self.nic.keys, lkey)
                .and_then(|r| r.check(self.qp.pd, addr, len, Access::NONE))
                .map_err(|_| Fail::Syndrome(Syndrome::LocalProtection))?;
            let peer = self
                .peer
                .as_ref()
                .ok_or(Fail::Syndrome(Syndrome::TransportRetryExceeded))?;
            peer.write_from(&mut self.remote_keys, remote, &src, imm)
                .map_err(Fail::from)?;
            return Ok(len);
        }
        let len = self.gather(2, ds)?;
        let peer = self
            .peer
            .as_ref()
            .ok_or(Fail::Syndrome(Syndrome::TransportRetryExceeded))?;
        peer.write(&mut self.remote_keys, remote, &self.scratch[..len], imm)
            .map_err(Fail::from)?;
        Ok(len as u64)
    }

    fn op_send(&mut self, opcode: Opcode, ds: usize) -> Result<u64, Fail> {
        let imm = (opcode == Opcode::SendImm).then(|| be32(&self.wqe, off::IMM));
        let len = self.gather(1, ds)?;
        let peer = self
            .peer
            .as_ref()
            .ok_or(Fail::Syndrome(Syndrome::TransportRetryExceeded))?;
        peer.send(&mut self.remote_keys, &self.scratch[..len], imm)
            .map_err(Fail::from)?;
        Ok(len as u64)
    }

    /// Check that the local segment `seg` may receive `len` bytes.
    fn check_local_write(&mut self, seg: usize, len: u64) -> Result<(), Fail> {
        let w = &self.wqe;
        let lkey = be32(w, seg + off::SEG_LKEY);
        let addr = VirtAddr(be64(w, seg + off::SEG_ADDR));
        self.local_keys
            .get(&self.nic.keys, lkey)
            .and_then(|r| r.check(self.qp.pd, addr, len, Access::LOCAL_WRITE))
            .map(|_| ())
            .map_err(|_| Fail::Syndrome(Syndrome::LocalProtection))
    }

    fn write_local(&mut self, seg: usize, data: &[u8]) {
        let w = &self.wqe;
        let lkey = be32(w, seg + off::SEG_LKEY);
        let addr = VirtAddr(be64(w, seg + off::SEG_ADDR));
        if let Ok(span) = self
            .local_keys
            .get(&self.nic.keys, lkey)
            .and_then(|r| r.check(self.qp.pd, addr, data.len() as u64, Access::LOCAL_WRITE))
        {
            span.write(data);
        }
    }

    fn op_read(&mut self, ds: usize) -> Result<u64, Fail> {
        let remote = remote_of(&self.wqe);
        let total = payload_len(&self.wqe, 2, ds);
        if total > MAX_MESSAGE {
            return Err(Fail::Syndrome(Syndrome::LocalLength));
        }
        if ds == 3 {
            // One scatter entry: copy region to region, no staging.
            let seg = 2 * SEG_SIZE;
            let lkey = be32(&self.wqe, seg + off::SEG_LKEY);
            let addr = VirtAddr(be64(&self.wqe, seg + off::SEG_ADDR));
            let dst = self
                .local_keys
                .get(&self.nic.keys, lkey)
                .and_then(|r| r.check(self.qp.pd, addr, total, Access::LOCAL_WRITE))
                .map_err(|_| Fail::Syndrome(Syndrome::LocalProtection))?;
            let peer = self
                .peer
                .as_ref()
                .ok_or(Fail::Syndrome(Syndrome::TransportRetryExceeded))?;
            peer.read_into(&mut self.remote_keys, remote, &dst)
                .map_err(Fail::from)?;
            return Ok(total);
        }
        for s in 2..ds {
            let len = u64::from(be32(&self.wqe, s * SEG_SIZE));
            if len != 0 {
                self.check_local_write(s * SEG_SIZE, len)?;
            }
        }
        let total = total as usize;
        if self.scratch.len() < total {
            self.scratch.resize(total, 0);
        }
        let peer = self
            .peer
            .as_ref()
            .ok_or(Fail::Syndrome(Syndrome::TransportRetryExceeded))?;
        peer.read(&mut self.remote_keys, remote, &mut self.scratch[..total])
            .map_err(Fail::from)?;
        let mut at = 0;
        let data = std::mem::take(&mut self.scratch);
        for s in 2..ds {
            let len = be32(&self.wqe, s * SEG_SIZE) as usize;
            if len != 0 {
                self.write_local(s * SEG_SIZE, &data[at..at + len]);
                at += len;
            }
        }
        self.scratch = data;
        Ok(total as u64)
    }

    fn op_atomic(&mut self, opcode: Opcode, ds: usize) -> Result<u64, Fail> {
        let remote = remote_of(&self.wqe);
        let (op, result_seg) = atomic_of(&self.wqe, opcode);
        let result = (ds > result_seg).then_some(result_seg * SEG_SIZE);
        if let Some(seg) = result {
            self.check_local_write(seg, 8)?;
        }
        let peer = self
            .peer
            .as_ref()
            .ok_or(Fail::Syndrome(Syndrome::TransportRetryExceeded))?;
        let old = peer
            .atomic(&mut self.remote_keys, remote, op)
            .map_err(Fail::from)?;
        if let Some(seg) = result {
            // ConnectX returns the old value big-endian (ATOMIC_BE_REPLY); so do we.
            self.write_local(seg, &old.to_be_bytes());
        }
        Ok(8)
    }

    /// True if the WAIT is satisfied.
    fn op_wait(&mut self, ci: u64) -> Result<bool, Fail> {
        let cqn = Cqn(be32(&self.wqe, off::WAIT_OBJ));
        let pi = be32(&self.wqe, off::WAIT_PI);
        self.wait(ci, cqn, pi)
    }

    /// WAIT(cqn, pi) at `ci`: true if the CQ has produced more than `pi` completions; if not,
    /// registers this PU to be told of the next one and counts the stall (once per WQE).
    #[inline(always)]
    fn wait(&mut self, ci: u64, cqn: Cqn, pi: u32) -> Result<bool, Fail> {
        let pu = self.qp.pu;
        let cq = self
            .objs
            .cq(&self.nic, cqn)
            .ok_or(Fail::Syndrome(Syndrome::LocalQpOperation))?;
        let passed = |produced: u64| (produced as u32).wrapping_sub(pi) as i32 > 0;
        if passed(cq.produced()) {
            return Ok(true);
        }
        cq.add_waiter(pu);
        if passed(cq.produced()) {
            return Ok(true);
        }
        if self.stalled_at != ci {
            self.stalled_at = ci;
            self.batch.wait_stalls += 1;
            self.batch_dirty = true;
        }
        Ok(false)
    }

    fn op_enable(&mut self, opcode: Opcode) -> Result<u64, Fail> {
        let target = Qpn(be32(&self.wqe, off::WAIT_OBJ) & crate::types::MAX_QPN);
        let pi = be32(&self.wqe, off::WAIT_PI);
        self.enable(opcode == Opcode::SendEn, target, pi)
    }

    /// SEND_EN (`send`) or RECV_EN: move the managed queue's enabled index to `pi` (it only
    /// moves forward) and wake whoever runs it.
    #[inline(always)]
    fn enable(&mut self, send: bool, target: Qpn, pi: u32) -> Result<u64, Fail> {
        let t = self
            .objs
            .qp(&self.nic, target)
            .ok_or(Fail::Syndrome(Syndrome::LocalQpOperation))?;
        if send {
            if !t.managed_send {
                return Err(Fail::Syndrome(Syndrome::LocalQpOperation));
            }
            if QpShared::advance(&t.enabled, pi) {
                t.pus.notify(t.pu);
            }
        } else {
            if !t.managed_recv {
                return Err(Fail::Syndrome(Syndrome::LocalQpOperation));
            }
            if QpShared::advance(&t.rq.enabled, pi) {
                t.wake_requester();
            }
        }
        Ok(0)
    }

    /// The WQE at `ci` failed: error completion (always, signaled or not), QP to error, and
    /// flush everything behind it.
    fn fault(&mut self, syndrome: Syndrome, bbs: u64) {
        let ci = self.ci;
        self.batch.errors += 1;
        self.batch_dirty = true;
        // Counters first: whoever sees the error completion or state sees the error counted.
        self.flush_counters();
        self.retire(
            ci,
            ci + bbs,
            CqeOpcode::ReqErr,
            self.wqe[off::OPCODE],
            0,
            syndrome as u8,
        );
        self.ci += bbs;
        self.qp.enter_error();
        self.flush();
    }

    /// In the error state: complete every outstanding WQE with a flush error. True if any.
    fn flush(&mut self) -> bool {
        let end = self
            .limit()
            .max(self.qp.posted.load(Ordering::Acquire))
            .min(self.ci + self.qp.sq.entries);
        let mut any = false;
        let mut ctrl = [0u8; SEG_SIZE];
        while self.ci < end {
            let ci = self.ci;
            self.qp.sq.buffer.read(self.qp.sq.entry_off(ci), &mut ctrl);
            self.ci += bbs_for_ds(ctrl[off::DS]) as u64;
            self.retire(
                ci,
                self.ci,
                CqeOpcode::ReqErr,
                ctrl[off::OPCODE],
                0,
                Syndrome::WrFlush as u8,
            );
            any = true;
        }
        self.fetched = self.ci;
        any
    }
}

/// Why an operation did not complete.
enum Fail {
    /// Try again later (no receive at the peer).
    NotReady,
    /// Error completion with this syndrome.
    Syndrome(Syndrome),
}

impl From<Nak> for Fail {
    fn from(n: Nak) -> Fail {
        match n {
            Nak::ReceiverNotReady => Fail::NotReady,
            other => Fail::Syndrome(other.syndrome()),
        }
    }
}

fn remote_of(w: &[u8]) -> RemoteAddr {
    RemoteAddr {
        addr: VirtAddr(be64(w, off::RADDR)),
        rkey: Rkey(be32(w, off::RKEY)),
    }
}

/// The atomic a WQE asks for (operands big-endian at mlx5's offsets) and the data segment
/// that receives the old value, if `ds` reaches it.
#[inline]
fn atomic_of(w: &[u8], opcode: Opcode) -> (AtomicOp, usize) {
    match opcode {
        Opcode::AtomicCs => (
            AtomicOp::CompareSwap {
                swap: be64(w, off::SWAP_ADD),
                compare: be64(w, off::COMPARE),
            },
            3,
        ),
        Opcode::AtomicFa => (
            AtomicOp::FetchAdd {
                add: be64(w, off::SWAP_ADD),
            },
            3,
        ),
        Opcode::AtomicMaskedCs => (
            AtomicOp::MaskedCompareSwap {
                swap: be64(w, 32),
                compare: be64(w, 40),
                swap_mask: be64(w, 48),
                compare_mask: be64(w, 56),
            },
            4,
        ),
        _ => (
            AtomicOp::MaskedFetchAdd {
                add: be64(w, 32),
                field_boundary: be64(w, 40),
            },
            3,
        ),
    }
}

/// Sum of the byte counts of data segments `from..ds` (or the inline length).
fn payload_len(w: &[u8], from: usize, ds: usize) -> u64 {
    if from < ds && be32(w, from * SEG_SIZE) & INLINE_FLAG != 0 {
        return u64::from(be32(w, from * SEG_SIZE) & !INLINE_FLAG);
    }
    (from..ds).map(|s| u64::from(be32(w, s * SEG_SIZE))).sum()
}
