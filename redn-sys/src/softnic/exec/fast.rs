//! The one-BB fast path: `Core::run_fast` runs consecutive one-BB WQEs (NOPs, WAITs,
//! enables, one-segment WRITEs and READs and atomics to an in-process peer) inline, with the
//! same fetches, prefetches, checks, effects, counters and completions as the reference
//! (`reference`), and hands anything else to `Core::execute`. Also here, as the one
//! multi-BB WQE with a fast path: `execute`'s replay of a byte-reversing READ it resolved
//! before (`Core::fast_read`, a recycled loop's count).
//!
//! Invariants: for every WQE it accepts, its effect is `execute`'s; it reports no error of
//! its own (a refused WQE goes to `execute`, which reports it; only an atomic the responder
//! already refused is reported here, with the responder's status, as `execute` would); it
//! stops at the first WQE of more than one BB. A resolved move (a snapshot's, or the
//! byte-reversing READ's) is replayed only for the same bytes and while both key caches'
//! epochs are what they were when it was resolved.

use super::handover::run_nop;
use super::*;

impl Core {
    /// The fast path: runs consecutive one-BB WQEs with the same fetch, prefetch, checks,
    /// effects, counters and completions as [`Self::step`]. NOPs, WAITs, SEND_ENs, RECV_ENs,
    /// and RDMA WRITEs and READs with one data segment and atomics to an in-process peer run
    /// inline; any other one-BB WQE, and any of those that a check refuses, goes through
    /// [`Self::execute`] (so every error is produced in one place). It stops at the first
    /// multi-BB WQE, leaving it to `step`. Returns how many WQEs ran (or failed), and true if
    /// the queue cannot go on now (a WAIT not reached, a receiver not ready, a fault).
    ///
    /// Why: this is most of what RedN chains and the host's data path execute, and the
    /// general path's staging, dispatch and dynamic transport call cost more than the
    /// operation itself (see docs/architecture.md, "Softnic fast path"). Inlined into `visit`:
    /// one stack frame for both saves ~60 instructions a call, which a chain that switches
    /// queues every WQE or two pays each time.
    ///
    /// `LEAN`: see [`Self::visit`].
    #[inline(always)]
    pub(super) fn run_fast<const LEAN: bool>(
        &mut self,
        f: &mut Fetcher,
        limit: u64,
        budget: usize,
        mut siblings: Option<&mut Siblings>,
    ) -> (usize, bool) {
        let wqe_checks = self.wqe_checks;
        let start = self.ci;
        let mut ci = start;
        // Every WQE here is one BB, so the budget is a bound on the index.
        let end = limit.min(start + budget as u64);
        let mut stop = false;
        let mut fault = None;
        let geo = &f.geo;
        // The fetcher's parts, borrowed apart, and its index in a local, so the loop keeps
        // them in registers; the index is written back below.
        let words = f.geo.ring(f.ring.words());
        let snap = &mut f.snap;
        let warmed = &mut f.warmed;
        let direct = f.direct.as_deref();
        let mut fetched = f.fetched;
        // Set after a WQE that ran from a hot slot: the ones after it are likely hot too, and
        // `run_hot`'s small loop runs them (it returns at once if they are not).
        let mut hot_next = false;
        while ci < end {
            // Hot slots run without a look at their fence: not while a response is late.
            if !LEAN && hot_next && self.late.is_empty() {
                hot_next = false;
                if let Some(peer) = direct {
                    let keys = (&self.local_keys, &*self.nic.keys, &self.remote_keys);
                    let (next, n) =
                        run_hot(words, *geo, snap, &mut fetched, peer, keys, ci, end, limit);
                    ci = next;
                    self.add_fast_counts(n);
                    if ci >= end {
                        break;
                    }
                }
            }
            // Keep the ring and snapshots warm ahead of a long visit (a visit warms only at its
            // start; one can run `BURST` WQEs): without this each WQE past the first
            // `WARM_AHEAD` waited for its ring line, which the host wrote on its core
            // (docs/softnic-performance.md, "Session 37").
            if !LEAN && *warmed <= ci + WARM_AHEAD / 2 {
                warm_published(words, geo, snap, warmed, ci, limit.min(ci + WARM_AHEAD));
            }
            let Some(slot) = fetch_one_bb(words, geo, snap, &mut fetched, ci, limit) else {
                break;
            };
            let e = &snap[slot];
            let ds = e.bytes[off::DS] & MAX_DS;
            let w = &e.bytes;
            let opcode = w[off::OPCODE];
            let signaled = signaled(w);
            self.land_before(w);
            // Each arm that runs its WQE counts it, completes it if signaled and goes on to
            // the next; a WQE that falls out of the match (a check refused it, or the fast
            // path does not run it) goes to `execute`, which reports any error.
            if !wqe_checks || self.wqe_is_ours(w, ci) {
                match opcode {
                    OP_NOP if ds >= 1 => {
                        if signaled && !self.late.is_empty() {
                            // As `complete`: late responses land before the completion.
                            self.land();
                        }
                        hot_next |= run_nop(&self.qp, snap, slot, ci, signaled, wqe_checks);
                        ci += 1;
                        continue;
                    }
                    // A READ whose response lands late goes to `execute`, which defers it.
                    OP_WRITE | OP_READ
                        if !LEAN && ds == 3 && !(self.late_landing && opcode == OP_READ) =>
                    {
                        let write = opcode == OP_WRITE;
                        let was_hot = snap.hot(slot) != HOT_NONE;
                        if let Some(peer) = direct {
                            let (e, flags) = snap.parts(slot);
                            if let Some(len) = self.fast_move(peer, e, flags, write, signaled) {
                                if signaled {
                                    // At most MAX_MESSAGE (16 MiB).
                                    let byte_cnt = if write { 0 } else { small32(idx(len)) };
                                    self.complete(ci, 1, opcode, byte_cnt);
                                } else {
                                    hot_next = was_hot;
                                }
                                ci += 1;
                                continue;
                            }
                        }
                    }
                    // A local refusal falls through to `execute`; the responder's refusal is
                    // final (it has acted on it: its queue pair went to error).
                    OP_CAS | OP_FAA | OP_MASKED_CAS | OP_MASKED_FAA
                        if !LEAN
                            && !self.late_landing
                            && ds >= if opcode == OP_MASKED_CAS { 4 } else { 3 } =>
                    {
                        match self.fast_atomic(direct, w) {
                            Some(Ok(())) => {
                                if signaled {
                                    self.complete(ci, 1, opcode, 8);
                                }
                                ci += 1;
                                continue;
                            }
                            Some(Err(syndrome)) => {
                                self.wqe[..BB_SIZE].copy_from_slice(w);
                                fault = Some((syndrome, 1));
                                break;
                            }
                            None => {}
                        }
                    }
                    OP_WAIT | OP_SEND_EN | OP_RECV_EN if ds >= 2 => {
                        if !LEAN
                            && opcode == OP_WAIT
                            && self
                                .enabled_here
                                .is_some_and(|(_, cq)| cq.0 == Be32::read(w, off::WAIT_OBJ).get())
                        {
                            if let Some(s) = siblings.as_deref_mut() {
                                let f = (&mut fetched, &mut *warmed);
                                let at = (ci, end, limit);
                                let next = if wqe_checks {
                                    self.run_doorbell_steps::<true>(s, words, geo, snap, f, at)
                                } else {
                                    self.run_doorbell_steps::<false>(s, words, geo, snap, f, at)
                                };
                                if let Some(next) = next {
                                    ci = next;
                                    continue;
                                }
                            }
                        }
                        // Not handed over, or the WAIT still does not pass: as any other.
                        match self.fast_control(&snap[slot].bytes, ci) {
                            Control::Ran => {
                                if signaled {
                                    self.complete(ci, 1, opcode, 0);
                                }
                                ci += 1;
                                continue;
                            }
                            Control::Refused => {}
                            Control::Blocked => {
                                // A completion another awake PU is about to produce for
                                // this visit's SEND_EN: wait here for it (`enabled_away`).
                                if !LEAN {
                                    // The spin's idle time warms what the next steps touch
                                    // (a visit warms only at its start).
                                    let to = limit.min(ci + WARM_AHEAD);
                                    let window = (words, geo, &*snap, &mut *warmed, ci, to);
                                    if self.spin_for_away(&snap[slot].bytes, window) {
                                        continue;
                                    }
                                }
                                stop = true;
                                break;
                            }
                        }
                    }
                    _ => {}
                }
            }
            if LEAN {
                // Left to the queue's ordinary visit (see `visit`).
                break;
            }
            // The general path's decoder, checks and operations, on this WQE.
            self.wqe[..BB_SIZE].copy_from_slice(&snap[slot].bytes);
            match self.execute(ci, 1) {
                Step::Done(_) => {}
                Step::Blocked => {
                    stop = true;
                    break;
                }
                // Only a rate-limited queue is retried, and those do not come here.
                Step::Retry(_) => break,
                Step::Fault(syndrome, bbs) => {
                    fault = Some((syndrome, bbs));
                    break;
                }
            }
            ci += 1;
        }
        // A queue enabled and not handed over runs in the PU's round, as any other.
        self.enabled_here = None;
        self.enabled_away = 0;
        if self.qp.managed_send {
            // What the next SEND_EN will enable, hinted now (see `warm`): a managed queue
            // fetches nothing past its enabled index, so without this its next WQE's line,
            // written by the host, would be fetched after the enable, in the hand-off.
            warm_enabled(words, geo, snap, &self.qp.sq_wr_ids, ci + WARM_ENABLED);
        }
        f.fetched = fetched;
        self.ci = ci;
        let done = idx(ci - start);
        if let Some((syndrome, bbs)) = fault {
            self.fault(f, syndrome, bbs);
            return (done + 1, true);
        }
        (done, stop)
    }

    /// The fast path's one-segment WRITE or READ to an in-process peer, from its snapshot
    /// `e` (`flags`, its [`Snaps::flags`]): through what was resolved from these bytes if
    /// that still holds, else checked and resolved (and kept in `e`, hot if unsignaled and
    /// WQE checks are off). Returns the bytes moved, or None if `execute` must run it (it
    /// reports the refusal).
    // Out of line: a hot slot's repeats run in `run_hot`, and kept out, this arm no longer
    // weighs on the register allocation of the fast path's loop (control chains run there).
    #[inline(never)]
    pub(super) fn fast_move(
        &mut self,
        peer: &InProcess,
        e: &mut Snapshot,
        flags: &mut u8,
        write: bool,
        signaled: bool,
    ) -> Option<u64> {
        let keys = &self.nic.keys;
        if *flags & DERIVED != 0
            && e.mv.holds(
                self.local_keys.current_epoch(keys),
                peer.live_epoch(&self.remote_keys),
            )
        {
            if let Some((l, r)) = e.mv.buffers(&self.local_keys, &self.remote_keys) {
                e.replay_move(l, r, write);
                self.count_move(write, e.mv.len as u64);
                return Some(e.mv.len as u64);
            }
        }
        let w = &e.bytes;
        let seg = 2 * SEG_SIZE;
        let len = Be32::read(w, seg + off::SEG_BYTE_COUNT).get();
        if len & INLINE_FLAG != 0 || u64::from(len) > MAX_MESSAGE {
            return None;
        }
        let len = u64::from(len);
        let lkey = Be32::read(w, seg + off::SEG_LKEY).get();
        let addr = VirtAddr(Be64::read(w, seg + off::SEG_ADDR).get());
        let (local_need, remote_need) = if write {
            (Access::NONE, Access::REMOTE_WRITE)
        } else {
            (Access::LOCAL_WRITE, Access::REMOTE_READ)
        };
        let local = (lkey, addr, local_need);
        let remote = (remote_of(w), remote_need);
        let resolved = self.resolve_move(peer, local, remote, len, |local, far| {
            if write {
                far.copy_from(local);
            } else {
                local.copy_from(far);
            }
        })?;
        if let Some(mv) = resolved {
            let hot = match (signaled || self.wqe_checks, write) {
                (true, _) => HOT_NONE,
                (false, true) => HOT_WRITE,
                (false, false) => HOT_READ,
            };
            *flags = derived_flags(hot);
            *e = Snapshot {
                bytes: e.bytes,
                mv,
                line: len == 64 && (mv.local_off | mv.remote_off) % 8 == 0,
            };
        }
        self.count_move(write, len);
        Some(len)
    }

    /// Check a move of `len` bytes between `local` (lkey, address, the rights it needs) and
    /// `remote` at the in-process `peer` (address, rights) as `execute` checks it, and run
    /// it with `run(local window, remote window)`. None if a check refused (nothing ran:
    /// `execute` then runs the WQE and reports the refusal); otherwise where the windows
    /// are, to replay the move with the same bytes, if both key caches were current (else
    /// None: it ran, but cannot be replayed).
    #[inline(always)]
    fn resolve_move(
        &mut self,
        peer: &InProcess,
        local: (u32, VirtAddr, Access),
        remote: (RemoteAddr, Access),
        len: u64,
        run: impl FnOnce(&Span, &Span),
    ) -> Option<Option<ResolvedMove>> {
        let keys = &self.nic.keys;
        let (lkey, addr, local_need) = local;
        let local_region = self.local_keys.find(keys, lkey).ok()?;
        let near = self
            .local_keys
            .region_at(local_region)?
            .window(self.qp.pd, addr, len, local_need)?;
        let (remote_region, far) =
            peer.remote_window(&mut self.remote_keys, remote.0, len, remote.1)?;
        run(&near, &far);
        let (local_off, remote_off) = (near.off, far.off);
        let local_epoch = self.local_keys.current_epoch(keys);
        let remote_epoch = peer.live_epoch(&self.remote_keys);
        // Resolved under caches that were current: good for next time.
        Some(
            (local_epoch != KeyCache::STALE && remote_epoch != KeyCache::STALE).then(|| {
                ResolvedMove {
                    local_epoch,
                    remote_epoch,
                    // Entries of key caches, which hold 8.
                    local_region: small32(local_region),
                    remote_region: small32(remote_region),
                    local_off,
                    remote_off,
                    len: idx(len),
                }
            }),
        )
    }

    /// `execute`'s RDMA READ with the fast paths on. A byte-reversing READ (one-byte scatter
    /// entries at descending consecutive addresses under one key, `Builder::advance_count`'s:
    /// how a recycled loop turns a counter into its next enable's big-endian count) is
    /// replayed from where its windows were when it last ran with the same segments; the
    /// first time it is checked and resolved here. Anything else, and anything a check
    /// refuses, runs as [`Self::op_read`], which reports the refusal.
    ///
    /// Why: a recycled loop runs such a READ every round on each of its queues, and the
    /// general path's staging and per-entry decoding, key look-ups and checks were about
    /// half a round's instructions (docs/softnic-performance.md, "The recycled loop's
    /// READ"). It is two BBs, so the one-BB fast path and its hot slots do not take it.
    pub(super) fn fast_read(&mut self, ds: usize) -> Result<u64, Fail> {
        // Taken out for the call (and put back): a moved `Arc`, not a counted clone.
        let Some(peer) = self.direct.take() else {
            return self.op_read(ds);
        };
        let done = self.reversed_read(&peer, ds);
        self.direct = Some(peer);
        match done {
            Some(len) => Ok(len),
            None => self.op_read(ds),
        }
    }

    /// [`Self::fast_read`]'s byte-reversing READ: the bytes moved, or None if this is not
    /// one, or a check refused it (nothing ran).
    fn reversed_read(&mut self, peer: &InProcess, ds: usize) -> Option<u64> {
        // At least two entries; at most two BBs; a late response lands through `op_read`.
        if self.late_landing || !(4..=REVERSED_MAX_DS).contains(&ds) {
            return None;
        }
        let segs = &self.wqe[SEG_SIZE..ds * SEG_SIZE];
        let kept = &self.reversed;
        if kept.ds == ds && kept.segs[..segs.len()] == *segs {
            let keys = &self.nic.keys;
            let now = (
                self.local_keys.current_epoch(keys),
                peer.live_epoch(&self.remote_keys),
            );
            if kept.mv.holds(now.0, now.1) {
                if let Some((l, r)) = kept.mv.buffers(&self.local_keys, &self.remote_keys) {
                    let (near, far) = kept.mv.spans(l, r);
                    reverse_into(&near, &far);
                    return Some(kept.mv.len as u64);
                }
            }
        }
        let run = ds - 2;
        if self.reversed_run(2, ds) != run {
            return None;
        }
        let (lkey, lowest) = self.run_window(2 * SEG_SIZE, run);
        let local = (lkey, lowest, Access::LOCAL_WRITE);
        let remote = (remote_of(&self.wqe), Access::REMOTE_READ);
        let resolved = self.resolve_move(peer, local, remote, run as u64, reverse_into)?;
        self.reversed.ds = 0;
        if let Some(mv) = resolved {
            let n = (ds - 1) * SEG_SIZE;
            self.reversed.segs[..n].copy_from_slice(&self.wqe[SEG_SIZE..ds * SEG_SIZE]);
            self.reversed.ds = ds;
            self.reversed.mv = mv;
        }
        Some(run as u64)
    }

    /// The fast path's one-BB atomic to an in-process peer, counted; None if `execute` must
    /// run it (nothing was asked of the peer), `Some(Err)` with the syndrome of the
    /// responder's refusal.
    #[inline(never)]
    pub(super) fn fast_atomic(
        &mut self,
        peer: Option<&InProcess>,
        w: &[u8; BB_SIZE],
    ) -> Option<Result<(), Syndrome>> {
        let peer = peer?;
        let opcode = w[off::OPCODE];
        let ds = usize::from(w[off::DS] & MAX_DS);
        let op = Opcode::from_u8(opcode)?;
        let (atomic, result_seg) = atomic_of(w, op);
        // The result's local window is checked before the remote atomic, as the general path
        // does, so a refusal leaves the target untouched.
        let result = if ds > result_seg {
            let seg = result_seg * SEG_SIZE;
            let lkey = Be32::read(w, seg + off::SEG_LKEY).get();
            let addr = VirtAddr(Be64::read(w, seg + off::SEG_ADDR).get());
            let region = self.local_keys.get(&self.nic.keys, lkey).ok()?;
            Some(region.window(self.qp.pd, addr, 8, Access::LOCAL_WRITE)?)
        } else {
            None
        };
        let old = match peer.atomic(&mut self.remote_keys, remote_of(w), atomic) {
            Ok(old) => old,
            // An atomic is never "receiver not ready".
            Err(nak) => return Some(Err(nak.syndrome())),
        };
        if let Some(r) = result {
            r.write(&atomic_reply(&self.qp, old));
        }
        self.qp.count_wqes(opcode, 1);
        bump(&self.qp.counters.bytes, 8);
        Some(Ok(()))
    }

    /// For the fast path's WAIT `w`, found blocked: if this visit enabled a queue on another
    /// awake PU whose send CQ `w` waits on (`enabled_away`), spin until the WAIT passes
    /// (true) or the bound passes (false; see `pu::spin_for`). The WAIT then runs as any
    /// other: this only decides when its count is read again.
    ///
    /// `window`: this queue's ring and snapshots, how far they are warmed and the BBs to
    /// warm ([`warm_published`]) before it spins: the master of a cross-PU chain stays in
    /// one visit for up to `BURST` WQEs, and only its start warmed them.
    #[inline(never)]
    pub(super) fn spin_for_away(
        &mut self,
        w: &[u8; BB_SIZE],
        window: (&[AtomicU64], &Geometry, &Snaps, &mut u64, u64, u64),
    ) -> bool {
        let cqn = Be32::read(w, off::WAIT_OBJ).get();
        if self.enabled_away & (1 << (cqn % 64)) == 0 {
            return false;
        }
        let (words, geo, snap, warmed, from, to) = window;
        warm_published(words, geo, snap, warmed, from, to);
        let count = Be32::read(w, off::WAIT_PI).get();
        let Some((_, cq)) = self.objs.cq(&self.nic, Cqn(cqn)) else {
            return false;
        };
        let (pus, pu) = (&self.qp.pus, self.qp.pu);
        crate::softnic::pu::spin_for(pus, pu, || wait_passed(cq.produced(), count))
    }

    /// The fast path's WAIT, SEND_EN or RECV_EN at `ci`, counted if it ran.
    #[inline(always)]
    pub(super) fn fast_control(&mut self, w: &[u8; BB_SIZE], ci: u64) -> Control {
        let opcode = w[off::OPCODE];
        let obj = Be32::read(w, off::WAIT_OBJ).get();
        let pi = Be32::read(w, off::WAIT_PI).get();
        let ran = if opcode == OP_WAIT {
            match self.wait(ci, Cqn(obj), pi) {
                Ok(true) => true,
                Ok(false) => return Control::Blocked,
                Err(_) => false,
            }
        } else {
            let target = Qpn(obj & MAX_QPN);
            self.enable(opcode == OP_SEND_EN, target, pi).is_ok()
        };
        if ran {
            self.qp.count_wqes(opcode, 1);
            Control::Ran
        } else {
            Control::Refused
        }
    }

    /// Count a WRITE (`write`) or READ of `len` bytes.
    #[inline(always)]
    pub(super) fn count_move(&mut self, write: bool, len: u64) {
        self.qp
            .count_wqes(if write { OP_WRITE } else { OP_READ }, 1);
        bump(&self.qp.counters.bytes, len);
    }
}

/// The most segments a byte-reversing READ [`Core::fast_read`] replays may have: two BBs'.
const REVERSED_MAX_DS: usize = 2 * BB_SEGS as usize;

/// The byte-reversing READ a queue last resolved ([`Core::fast_read`]).
pub(super) struct ReversedRead {
    /// Its segments past the control segment (the remote address and the scatter entries),
    /// the first `ds - 1`.
    segs: [u8; (REVERSED_MAX_DS - 1) * SEG_SIZE],
    /// Its segment count; 0: nothing kept.
    ds: usize,
    mv: ResolvedMove,
}

impl ReversedRead {
    pub(super) const NONE: ReversedRead = ReversedRead {
        segs: [0; (REVERSED_MAX_DS - 1) * SEG_SIZE],
        ds: 0,
        mv: ResolvedMove::NONE,
    };
}

/// A byte-reversing READ's move: the bytes of `far` into `near`, last first (both as long,
/// at most a [`ReversedRead`]'s entries).
fn reverse_into(near: &Span, far: &Span) {
    let mut bytes = [0u8; REVERSED_MAX_DS];
    let bytes = &mut bytes[..far.len];
    far.read(bytes);
    bytes.reverse();
    near.write(bytes);
}
