//! The doorbell hand-over: in a doorbell-ordered chain (SEND_EN of a queue on this PU, then
//! a WAIT on its CQ) the master runs the enabled queue at once instead of leaving it to the
//! PU's next round (`Siblings`, `Core::run_doorbell_steps`, `SqExec::run_enabled`).
//!
//! Also here, because it is that step's NOP run from the other side: a PU's round runs a
//! queue that another PU enabled for one signaled NOP the same way (`SqExec::run_lone_nop`,
//! a cross-PU chain's step).
//!
//! Invariants: both queues are on this PU, so no other thread runs either; the enabled
//! queue's WQEs run as its own visit would run them (the same fetches, counts and
//! completions, in the same order); anything but the step's NOPs, WAITs and SEND_ENs goes
//! to the ordinary visit.

use super::*;

/// [`SqExec::run_enabled`]'s fetch of the WQE at `ci` when it is fetched right before it
/// runs with nothing to prefetch behind it (a doorbell step's) and is a signaled one-BB NOP:
/// only its first 16 bytes, and into no snapshot; true if so. ConnectX reads a WQE's `ds`
/// segments, and a NOP's past the control segment do nothing; and a snapshot is never read
/// for a WQE that has run unless something was derived from it (compared at the slot's
/// next fetch), which a slot fetched this way is not: so the slot keeps its old bytes, and
/// its next fetch copies them whole. False for anything else, which `fetch_one_bb` then
/// fetches whole, reading the ring again: what runs is what that fetch finds. Why: a
/// doorbell step's enabled queue runs one such NOP; copying 16 bytes of it instead of 64
/// took ~10% off a step (`softnic_bench`, interleaved runs), and storing none spares the
/// step a write to a snapshot line (the snapshots are 128 bytes a ring slot, so each step
/// would write a line of its own).
#[inline(always)]
pub(super) fn fetch_signaled_nop(
    words: &[AtomicU64],
    geo: &Geometry,
    snap: &mut Snaps,
    fetched: &mut u64,
    ci: u64,
    limit: u64,
) -> bool {
    let slot = idx(ci) & (snap.len() - 1);
    if *fetched > ci || (geo.reach > 1 && limit > ci + 1) || snap.derived(slot) {
        return false;
    }
    let src = geo.slot(words, ci);
    let mut head = [0u8; SEG_SIZE];
    head[..8].copy_from_slice(&src[0].load(Ordering::Relaxed).to_ne_bytes());
    head[8..].copy_from_slice(&src[1].load(Ordering::Relaxed).to_ne_bytes());
    let ds = head[off::DS] & MAX_DS;
    if head[off::OPCODE] != OP_NOP || !(1..=BB_SEGS).contains(&ds) || !signaled(&head) {
        return false;
    }
    *fetched = ci + 1;
    true
}

/// Count and complete the signaled one-BB NOP at `ci` of queue `qp` (fetched by
/// [`fetch_signaled_nop`], or whole). Inline (not `Core::complete`): this is a doorbell
/// step's one completion. The caller has landed any late response (see `Core::late`).
#[inline(always)]
pub(super) fn run_signaled_nop(qp: &QpShared, ci: u64) {
    qp.count_wqes(OP_NOP, 1);
    qp.retire(ci, ci + 1, CqeOpcode::Req, OP_NOP, 0, 0);
}

/// Run the one-BB NOP at `ci` of queue `qp`, fetched whole into snapshot `slot`: what every
/// path that runs a NOP does (the fast path, the doorbell hand-over; `run_hot` re-runs only
/// slots marked here, and the general path's `execute` runs a NOP as nothing at all). A NOP
/// does nothing but complete (ConnectX), so: count it, complete it if `signaled` (see
/// [`run_signaled_nop`]), and otherwise mark its slot hot, so that `run_hot` re-runs it
/// without decoding while its bytes stay the same; not with WQE checks on (`checks`), which
/// look at each WQE's index, and a re-run would not. True if the unsignaled slot was hot
/// already: the fast path's cue to go on in `run_hot`.
#[inline(always)]
pub(super) fn run_nop(
    qp: &QpShared,
    snap: &mut Snaps,
    slot: usize,
    ci: u64,
    signaled: bool,
    checks: bool,
) -> bool {
    if signaled {
        run_signaled_nop(qp, ci);
        return false;
    }
    qp.count_wqes(OP_NOP, 1);
    mark_unsignaled_nop(snap, slot, checks)
}

/// [`run_nop`]'s marking of the unsignaled NOP in snapshot `slot`: hot unless WQE checks are
/// on (`checks`), so that `run_hot` may re-run it. True if it was hot already. Apart so that
/// the rule a hot slot relies on (hot only with WQE checks off: see the `hot` module) has a
/// test of its own.
#[inline(always)]
fn mark_unsignaled_nop(snap: &mut Snaps, slot: usize, checks: bool) -> bool {
    let hot = snap.hot(slot) != HOT_NONE;
    if !hot && !checks {
        snap.set_derived(slot, HOT_NOP);
    }
    hot
}

/// WQEs a queue runs when another on its PU hands over to it (see [`Siblings`]).
pub(super) const HANDOFF_BUDGET: usize = 64;

/// The other queues of the PU that is running one: when that queue has enabled one of them
/// (SEND_EN) and comes to a WAIT on the enabled queue's send CQ, the executor runs the
/// enabled queue right away instead of leaving it to the PU's next round.
/// Why: in a doorbell-ordered chain that WAIT is the next WQE after every SEND_EN, so
/// otherwise every step blocks, returns to the PU loop and comes back (two queue visits and
/// a blocked WAIT a step). The enabled queue would run next on this PU anyway; this is the
/// interleaving a NIC that switches at once gives. Only before such a WAIT, so a queue that
/// enables another many times between other WQEs (RedN's `if`) still lets it run its batch
/// in one visit; and one level only: a queue run this way does not hand over in turn.
pub(crate) struct Siblings<'a> {
    pub(crate) queues: &'a mut [Option<Box<SqExec>>],
}

impl Siblings<'_> {
    /// Where queue `qpn` is among these (looked for at `hint` first, where it was last time).
    #[inline(always)]
    pub(super) fn find(&self, qpn: Qpn, hint: usize) -> Option<usize> {
        match self.queues.get(hint) {
            Some(Some(q)) if q.qpn() == qpn => Some(hint),
            _ => self
                .queues
                .iter()
                .position(|q| q.as_ref().is_some_and(|q| q.qpn() == qpn)),
        }
    }
}

impl SqExec {
    /// Run up to `budget` WQEs of a queue another on its PU hands over to (see
    /// [`Siblings`]): straight into the executor's lean visit, without the quiet check (the
    /// queue was just enabled, so that would only find that it has work).
    #[inline(always)]
    pub(super) fn run_handed_over(&mut self, budget: usize) -> RunOutcome {
        let outcome = self.core.visit::<true>(&mut self.fetcher, budget, None);
        self.core.land_at_visit_end();
        self.quiet = matches!(outcome, RunOutcome::Idle);
        outcome
    }

    /// A doorbell step's common case of [`Self::run_enabled`]: the queue was enabled for
    /// exactly one WQE, a signaled one-BB NOP, with nothing to prefetch behind it; run it
    /// and return true. False, having run nothing, for anything else (an error to flush,
    /// another WQE, or nothing enabled below `limit`), which `run_enabled` then runs.
    /// `words` and `geo` are this queue's ring (`Geometry::ring`) and geometry, sliced
    /// once by the caller for all its steps; `limit`, an enabled index the queue has had (it
    /// only grows, so fetching below it is allowed). The caller has found
    /// [`Core::plain_config`] true since this queue last ran anything else. `qp` is this
    /// queue's shared state, as the caller holds it (so that a step need not reach it through
    /// the queue). Why apart: `run_enabled`'s set-up (its loop's bounds, the ring's slicing,
    /// its tail) was a fifth of a step.
    #[inline(always)]
    pub(super) fn run_enabled_nop(
        &mut self,
        qp: &QpShared,
        words: &[AtomicU64],
        geo: &Geometry,
        limit: u64,
    ) -> bool {
        let c = &mut self.core;
        let ci = c.ci;
        debug_assert!(std::ptr::eq(qp, &*c.qp));
        // Not `c.plain_config()`: a rate the host sets while the loop runs makes it false,
        // and the loop looks again only at the master's next visit, by design (see
        // `run_doorbell_steps`).
        debug_assert!(qp.managed_send && limit <= c.limit());
        if ci >= limit || qp.state() != QpState::ReadyToSend {
            return false;
        }
        warm_enabled_nop(words, geo, &qp.sq_wr_ids, ci + WARM_ENABLED);
        let f = &mut self.fetcher;
        if !fetch_signaled_nop(words, geo, &mut f.snap, &mut f.fetched, ci, limit) {
            return false;
        }
        // `retire` publishes the consumed index, as `Core::ran` would. (`quiet` is left to
        // the caller: see `Core::run_doorbell_steps`.)
        run_signaled_nop(qp, ci);
        c.ci = ci + 1;
        true
    }

    /// The PU round's visit of a managed queue that another PU enabled for exactly one
    /// WQE, a signaled one-BB NOP with nothing to prefetch behind it (a cross-PU
    /// doorbell-ordered chain's step): run it as [`Self::run_enabled_nop`] runs a same-PU
    /// step's (fetched as its first 16 bytes, into no snapshot, counted and completed) and
    /// return true; false, having run nothing, for anything else, which the ordinary visit
    /// then runs. Why: that NOP's completion is what the other PU is waiting for, and the
    /// ordinary visit's set-up (its checks, the fast path's loop state and tail) and the
    /// snapshot's store were most of the time between the target PU finding the enable
    /// and counting the completion (`chain_profile --cross`, docs/softnic-performance.md,
    /// "Counting a hand-off's line transfers"). Only with the fast paths on, no WQE checks
    /// or rate ([`Core::plain_config`]) and no late response to land.
    #[inline(always)]
    pub(super) fn run_lone_nop(&mut self) -> bool {
        let c = &mut self.core;
        if !c.qp.managed_send || !c.fast_paths || !c.late.is_empty() || !c.plain_config() {
            return false;
        }
        let qp: &QpShared = &c.qp;
        let ci = c.ci;
        let limit = qp.enabled.get();
        if ci >= limit || qp.state() != QpState::ReadyToSend {
            return false;
        }
        let f = &mut self.fetcher;
        let words = f.geo.ring(f.ring.words());
        if !fetch_signaled_nop(words, &f.geo, &mut f.snap, &mut f.fetched, ci, limit) {
            return false;
        }
        stamp(HandoffEvent::Found);
        // `retire` publishes the consumed index, as `Core::ran` would.
        run_signaled_nop(qp, ci);
        // After the completion, which another PU is waiting for: the hint is for later.
        warm_enabled_nop(words, &f.geo, &qp.sq_wr_ids, ci + 1 + WARM_ENABLED);
        c.ci = ci + 1;
        // The next visit's cheap check is exact, and in a chain the next round comes
        // before the next enable: let it be only that check.
        self.quiet = true;
        true
    }

    /// Run what a queue on this PU was just enabled for, in a doorbell-ordered chain's step
    /// (see [`Core::run_doorbell_steps`]): its one-BB NOPs here, in a loop that does only
    /// that, and whatever else through the handed-over visit. Why: such a step runs one
    /// WQE of this queue, and the handed-over visit's set-up (checks, the fast path's loop
    /// state, its tear-down) was most of a step's cost. The NOPs run as the fast path runs
    /// them: fetched and prefetched alike, counted, completed if signaled, marked hot if not.
    #[inline(always)]
    pub(super) fn run_enabled(&mut self) {
        let c = &mut self.core;
        if !c.runs_plain() {
            // Checks, a rate, an error to flush or a rate to pick up: the full visit.
            self.run_handed_over(HANDOFF_BUDGET);
            return;
        }
        let limit = c.limit();
        let start = c.ci;
        let end = limit.min(start + HANDOFF_BUDGET as u64);
        let Fetcher {
            ring,
            snap,
            geo,
            fetched,
            ..
        } = &mut self.fetcher;
        let words = geo.ring(ring.words());
        warm(words, geo, start + WARM_ENABLED);
        let mut ci = start;
        while ci < end {
            if fetch_signaled_nop(words, geo, snap, fetched, ci, limit) {
                run_signaled_nop(&c.qp, ci);
                ci += 1;
                continue;
            }
            let Some(slot) = fetch_one_bb(words, geo, snap, fetched, ci, limit) else {
                break;
            };
            let e = &snap[slot];
            if e.bytes[off::OPCODE] != OP_NOP || e.bytes[off::DS] & MAX_DS == 0 {
                break;
            }
            // No WQE checks here (`runs_plain`), and nothing lands late.
            let signaled = signaled(&e.bytes);
            run_nop(&c.qp, snap, slot, ci, signaled, false);
            ci += 1;
        }
        c.ci = ci;
        let done = idx(ci - start);
        if done > 0 {
            // As `Core::ran`: whoever sees a WQE consumed sees it counted.
            c.qp.consumed.store(ci, Ordering::Release);
            self.quiet = false;
        }
        if ci < end {
            // Stopped at a WQE this loop does not run: the handed-over visit goes on.
            self.run_handed_over(HANDOFF_BUDGET - done);
            if done > 0 {
                self.quiet = false;
            }
        } else if done == 0 {
            self.quiet = true;
        }
    }
}

impl Core {
    /// A doorbell-ordered chain's steps, from the WAIT at `ci` (fetched, one BB) on the send
    /// CQ of a queue on this PU that the last SEND_EN enabled (`enabled_here`): run that
    /// queue (see [`Siblings`]), and if the WAIT then passes, go on while this queue's next
    /// WQEs are a SEND_EN of that same queue and another WAIT on its CQ, as RedN's
    /// doorbell order repeats them. Returns the index of the first WQE it did not run, or
    /// None if the WAIT at `ci` still does not pass (the fast path then runs it as any other
    /// WAIT, which blocks).
    ///
    /// Why a loop of its own: each step here is three WQEs on two queues; run one WQE at a
    /// time by the fast path, with a visit of the enabled queue between, the loop and visit
    /// set-up cost more than the WQEs (~560 instructions a step). Here the two queues'
    /// state is found once, and each step is the fetches, the checks, the counts and the
    /// completion. It runs the WQEs as the fast path would, in the same order, with the same
    /// fetches and prefetches; anything else (another opcode or queue, WQE checks refusing,
    /// the budget spent, the queue destroyed) ends it, and the fast path takes that WQE.
    ///
    /// `CHECKS`: `SoftNicConfig::wqe_checks` (this queue's, and so the enabled queue's:
    /// they are on one softnic), a constant so that a step does not look at it. `cursor`:
    /// the fast path's fetch and warming indices (`Fetcher::fetched`, `Fetcher::warmed`);
    /// `at`: its `ci`, `end` and `limit`.
    ///
    /// The steps keep this queue's ring and snapshots warm up to [`WARM_AHEAD`] BBs ahead
    /// (refilled when half of that window is used), and each warms the enabled queue's
    /// ring [`WARM_ENABLED`] ahead; the loop's start also warms the
    /// enabled queue's next WQEs and its CQ's next entries, which the steps' own hints
    /// reach only some steps in (see the `fetch` module).
    ///
    /// Only a reconfiguration by the host (a rate set, WQE checks are fixed) changes whether
    /// the enabled queue may run plain ([`Core::plain_config`]): that is looked at when the
    /// loop starts and after the enabled queue ran anything but its step's NOP, so a rate
    /// set meanwhile applies from the master's next visit: at most 128 steps later, as a
    /// visit runs at most 256 of the master's WQEs (`tests/rate_limit.rs`). The enabled
    /// queue's state (an error to flush) and whether it was destroyed are looked at every
    /// step, as the fast path does.
    #[inline(never)]
    pub(super) fn run_doorbell_steps<const CHECKS: bool>(
        &mut self,
        siblings: &mut Siblings,
        words: &[AtomicU64],
        geo: &Geometry,
        snap: &mut Snaps,
        cursor: (&mut u64, &mut u64),
        at: (u64, u64, u64),
    ) -> Option<u64> {
        let (fetched, warmed) = cursor;
        let (mut ci, end, limit) = at;
        debug_assert_eq!(CHECKS, self.wqe_checks);
        // Early rather than late: what runs here (WAITs, SEND_ENs) makes no response to wait
        // for, and may be fenced.
        if !self.late.is_empty() {
            self.land();
        }
        let (qpn, cqn) = self.enabled_here.take()?;
        let at = siblings.find(qpn, self.handoff_hint)?;
        self.handoff_hint = at;
        let q = siblings.queues[at].as_deref_mut()?;
        // The enabled queue's ring, sliced once for the whole loop: through the queue's
        // shared state as this queue's object cache holds it (the SEND_EN found it there),
        // so that the slice does not borrow the queue, which the loop runs.
        let owned;
        let q_qp: &QpShared = match self
            .objs
            .qps
            .iter()
            .find(|(n, t)| *n == qpn.0 && Arc::ptr_eq(t, &q.core.qp))
        {
            Some((_, t)) => t,
            None => {
                owned = Arc::clone(&q.core.qp);
                &owned
            }
        };
        let q_geo = q.fetcher.geo;
        let q_words = q_geo.ring(q_qp.sq.buffer.words());
        for i in 0..WARM_ENABLED {
            warm_enabled_nop(q_words, &q_geo, &q_qp.sq_wr_ids, q.core.ci + i);
        }
        q_qp.send_cq.warm_entries(WARM_CQES);
        let start = ci;
        let mut slot = idx(ci) & (snap.len() - 1);
        // The WQEs run, `start..ci`, are WAITs and SEND_ENs in turn from a WAIT; counted
        // through `counted` when the loop ends (or before a completion of this queue, so
        // that whoever sees it sees them counted): nothing else reads them meanwhile but a
        // host reading counters, which sees them a few steps late at worst.
        let mut counted = start;
        // See above; and the enabled queue's enabled index as this loop last knew it (it is
        // managed: only a SEND_EN enables it; each step's sets it).
        let mut plain = !CHECKS && q.core.plain_config();
        let mut q_limit = q_qp.enabled.get();
        // Each `break` says whether it leaves the queue enabled by the last SEND_EN and not
        // yet handed over to.
        let pending = loop {
            // The WAIT at `ci`: run what it waits for, then compare (the queue holds its send
            // CQ, which cannot be destroyed while the queue exists).
            // In batches: once the window is half used up, warm it full again (a look a
            // step, ~20 instructions fewer than two BBs' hints every step).
            if *warmed <= ci + WARM_AHEAD / 2 {
                warm_published(words, geo, snap, warmed, ci, limit.min(ci + WARM_AHEAD));
            }
            if !(plain && q.run_enabled_nop(q_qp, q_words, &q_geo, q_limit)) {
                q.run_enabled();
                plain = !CHECKS && q.core.plain_config();
            }
            let w = &snap[slot].bytes;
            if !wait_passed(q_qp.send_cq.produced(), Be32::read(w, off::WAIT_PI).get()) {
                break false;
            }
            if signaled(w) {
                self.count_controls(start, &mut counted, ci + 1);
                self.complete_landed(ci, 1, OP_WAIT, 0);
            }
            ci += 1;
            // A SEND_EN of the same queue? (Destroyed, it is the fast path's to refuse.)
            let Some(at) = self.next_control::<CHECKS>(words, geo, snap, fetched, ci, end, limit)
            else {
                break false;
            };
            slot = at;
            let w = &snap[slot].bytes;
            if w[off::OPCODE] != OP_SEND_EN
                || Be32::read(w, off::WAIT_OBJ) & Be32::new(MAX_QPN) != Be32::new(qpn.0)
                || q_qp.destroyed.load(Ordering::Acquire)
            {
                break false;
            }
            // On this PU (a sibling): its own index, no locked exchange.
            let advanced = q_qp.enabled.advance_own(Be32::read(w, off::WAIT_PI).get());
            if signaled(w) {
                self.count_controls(start, &mut counted, ci + 1);
                self.complete_landed(ci, 1, OP_SEND_EN, 0);
            }
            ci += 1;
            let Some(enabled) = advanced else {
                break false;
            };
            q_limit = enabled;
            // And a WAIT on its CQ?
            let Some(at) = self.next_control::<CHECKS>(words, geo, snap, fetched, ci, end, limit)
            else {
                break true;
            };
            slot = at;
            let w = &snap[slot].bytes;
            if w[off::OPCODE] != OP_WAIT || Be32::read(w, off::WAIT_OBJ) != Be32::new(cqn.0) {
                break true;
            }
        };
        self.count_controls(start, &mut counted, ci);
        if ci > start {
            // A WAIT passed, so the queue ran (`run_enabled_nop` leaves this to here: it is
            // only the PU's hint to look at the queue in its next round).
            q.quiet = false;
        }
        if pending {
            self.enabled_here = Some((qpn, cqn));
        }
        (ci > start).then_some(ci)
    }

    /// Count the WQEs [`Self::run_doorbell_steps`] ran from `counted` to `to`, and move
    /// `counted` there: WAITs and SEND_ENs in turn, a WAIT at each even distance from
    /// `start`. Why not a counter of each: two more values for the loop to carry (they
    /// lived on the stack: a load and a store each a step).
    #[inline(always)]
    pub(super) fn count_controls(&self, start: u64, counted: &mut u64, to: u64) {
        let n = to - *counted;
        let waits = if (*counted - start) % 2 == 0 {
            n.div_ceil(2)
        } else {
            n / 2
        };
        if waits != 0 {
            self.qp.count_wqes(OP_WAIT, waits);
        }
        if n > waits {
            self.qp.count_wqes(OP_SEND_EN, n - waits);
        }
        *counted = to;
    }

    /// For [`Self::run_doorbell_steps`]: fetch the WQE at `ci` as the fast path does, and
    /// return its snapshot slot if it is one BB with the two segments of a WAIT or an
    /// enable, and passes the WQE checks if they are on; None if not, or at `end`. A WQE
    /// refused here is not prefetched behind: the fast path, which takes it, does that
    /// before it runs (nothing runs in between, so it is the same fetch). Why: one look
    /// at its `ds` (2..=4) instead of two.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(super) fn next_control<const CHECKS: bool>(
        &self,
        words: &[AtomicU64],
        geo: &Geometry,
        snap: &mut Snaps,
        fetched: &mut u64,
        ci: u64,
        end: u64,
        limit: u64,
    ) -> Option<usize> {
        if ci >= end {
            return None;
        }
        let slot = fetch_at(words, geo, snap, fetched, ci);
        let w = &snap[slot].bytes;
        if !(2..=4).contains(&(w[off::DS] & MAX_DS)) || (CHECKS && !self.wqe_is_ours(w, ci)) {
            return None;
        }
        prefetch_behind(words, geo, snap, fetched, ci, limit);
        Some(slot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redn_program::wqe::{encode_wqe, wqe_index, WorkRequest, WqeFlags, WrOp};

    /// A ring of `entries` one-BB slots at the start of its words, fetched with no prefetch
    /// and with WQE checks off.
    fn ring(entries: usize) -> (Vec<AtomicU64>, Geometry, Snaps) {
        let words = (0..entries * 8).map(|_| AtomicU64::new(0)).collect();
        let geo = Geometry {
            base: 0,
            ring_words: entries * 8,
            ring_mask: u32::try_from(entries - 1).unwrap(),
            depth: 0,
            reach: 1,
            decisive0: u64::MAX,
        };
        (words, geo, Snaps::new(entries))
    }

    /// Write a one-BB NOP of queue 0x11 with `flags` into slot `index` of `words`.
    fn put_nop(words: &[AtomicU64], geo: &Geometry, index: u64, flags: WqeFlags) {
        let nop = WorkRequest {
            wr_id: 0,
            flags,
            op: WrOp::Nop {
                raw_segments: Vec::new(),
            },
        };
        let e = encode_wqe(&nop, Qpn(0x11), wqe_index(index)).unwrap();
        let bytes = &e.bytes()[..BB_SIZE];
        for (w, b) in geo.slot(words, index).iter().zip(bytes.chunks_exact(8)) {
            w.store(u64::from_ne_bytes(b.try_into().unwrap()), Ordering::Relaxed);
        }
    }

    #[test]
    fn an_unsignaled_nop_is_marked_hot_only_with_wqe_checks_off() {
        let mut snap = Snaps::new(4);
        assert!(!mark_unsignaled_nop(&mut snap, 1, false), "not hot before");
        assert_eq!(snap.hot(1), HOT_NOP);
        assert!(
            mark_unsignaled_nop(&mut snap, 1, false),
            "hot the second time"
        );
        assert_eq!(snap.hot(1), HOT_NOP);
        // With WQE checks on, a re-run without them would skip the index check.
        assert!(!mark_unsignaled_nop(&mut snap, 2, true));
        assert_eq!(snap.hot(2), HOT_NONE);
        assert!(!snap.derived(2));
        assert!(!mark_unsignaled_nop(&mut snap, 2, true), "still not hot");
    }

    #[test]
    fn a_signaled_nop_is_taken_from_its_first_bytes_and_the_fetch_index_moves_past_it() {
        let (words, geo, mut snap) = ring(8);
        put_nop(&words, &geo, 5, WqeFlags::SIGNALED);
        let mut fetched = 5;
        assert!(fetch_signaled_nop(
            &words,
            &geo,
            &mut snap,
            &mut fetched,
            5,
            6
        ));
        assert_eq!(fetched, 6, "the fetch index is past the NOP");
        assert_eq!(
            snap[5].bytes, [0; BB_SIZE],
            "nothing copied into its snapshot"
        );
        // Declined, fetch index unmoved: a NOP fetched already, an unsignaled one, one
        // whose slot has something derived from it.
        let mut ahead = 7;
        assert!(!fetch_signaled_nop(
            &words, &geo, &mut snap, &mut ahead, 5, 6
        ));
        assert_eq!(ahead, 7);
        put_nop(&words, &geo, 6, WqeFlags::NONE);
        assert!(!fetch_signaled_nop(
            &words,
            &geo,
            &mut snap,
            &mut fetched,
            6,
            7
        ));
        put_nop(&words, &geo, 6, WqeFlags::SIGNALED);
        snap.set_derived(6, HOT_NOP);
        assert!(!fetch_signaled_nop(
            &words,
            &geo,
            &mut snap,
            &mut fetched,
            6,
            7
        ));
        assert_eq!(fetched, 6);
    }
}
