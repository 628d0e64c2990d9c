//! The send-queue executor: fetches WQE bytes from ring memory and runs them.
//!
//! One [`SqExec`] per queue pair, owned by the queue's processing unit, so the consumer index,
//! the prefetch snapshots and the key caches need no locks. Faithful points:
//! - WQEs are read from the ring as bytes, so an RDMA WRITE, READ scatter or CAS that landed in
//!   the ring before the WQE was fetched changes what runs;
//! - fetching stops at the doorbell (unmanaged) or enabled index (managed), and may run ahead of
//!   execution by the configured prefetch depth: a WQE patched after it was prefetched runs as
//!   it was fetched (stale), as on ConnectX;
//! - operations of one queue run in order; with `Prefetch::Adversarial` the responses of
//!   unsignaled READs and atomics land late (after later unfenced WQEs of the queue ran), and
//!   a fenced WQE waits for them, as on ConnectX (see `Core::late`); otherwise they land at
//!   once.
//!
//! This module owns the executor's state (`SqExec`, `Core`) and a queue's visit (`Core::run`
//! and `visit`: pick up the peer and rate, run the fast path, hand what it leaves to the
//! general executor). Its parts, each with the invariant it relies on in its own comment:
//! - `fetch`: fetch and prefetch from the ring into snapshots;
//! - `reference`: the general executor, the definition of what a WQE does;
//! - `fast`: the one-BB fast path;
//! - `handover`: the doorbell hand-over between queues of one PU;
//! - `hot`: the re-run of unchanged hot slots;
//! - `objects`: the cache of the queues and CQs that WAIT and the enables name.
//!
//! Invariant of the whole: with `SoftNicConfig::fast_paths` off only `reference` runs WQEs,
//! and every fast path ends where it would (`tests/differential.rs`).

use super::cache_line::prefetch_line;
use super::config::Prefetch;
use super::cq::{CqShared, WARM_CQES};
use super::handoff_trace::{stamp, HandoffEvent};
use super::in_process::InProcess;
use super::qp::{bump, QpShared, Ring};
use super::rate::Limiter;
use super::shared::Shared;
use super::transport::{Ask, AtomicOp, Nak, Transport};
use crate::clock::{Clock, SystemClock};
use crate::conv::{idx, low32, small32};
use crate::mem::{KeyCache, KeyTable, SharedBuffer, Span};
use crate::types::{Access, Cqn, Qpn, Rkey, VirtAddr, MAX_QPN};
use crate::wqe::{
    bbs_for_ds, off, wqe_index, CqeOpcode, Opcode, RemoteAddr, Syndrome, WqeFlags, BB_SIZE,
    INLINE_FLAG, MAX_DS, MAX_WQE_BYTES, SEG_SIZE,
};
use crate::QpState;
use redn_program::endian::{Be16, Be32, Be64};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

mod fast;
mod fetch;
mod handover;
mod hot;
mod objects;
mod reference;

use fast::ReversedRead;
use fetch::*;
pub(crate) use handover::Siblings;
use hot::*;
use objects::*;
use reference::*;

/// Largest message one WQE may move. ConnectX allows 1 GiB; the softnic stages payloads in
/// memory, so it caps them lower and fails bigger ones with a local length error.
pub const MAX_MESSAGE: u64 = 16 << 20;

/// Segments in one basic block: the most a WQE the fast path runs may have.
const BB_SEGS: u8 = 4;
const _: () = assert!(BB_SEGS as usize * SEG_SIZE == BB_SIZE);

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

/// Where a queue's last run stopped: a WAIT at `ci` for CQ `cqn` (entry `cq_index` of the
/// object cache) to reach `count`.
#[derive(Clone, Copy)]
struct Parked {
    ci: u64,
    cq_index: usize,
    cqn: Cqn,
    count: u32,
}

/// True if the control segment's completion-mode bits (byte `FM_CE_SE` of `w`) ask for a
/// completion (`WqeFlags::signaled`: CE 2, always, or 3, CQE and EQE).
#[inline(always)]
fn signaled(w: &[u8]) -> bool {
    WqeFlags(w[off::FM_CE_SE]).signaled()
}

/// True if the control segment `w` is fenced: it waits for earlier READs and atomics of its
/// queue (`WqeFlags::waits_for_responses`).
#[inline(always)]
fn fenced(w: &[u8]) -> bool {
    WqeFlags(w[off::FM_CE_SE]).waits_for_responses()
}

/// Bits of a CQ index that WAIT compares: ConnectX compares CQ indices modulo 2^24 (DPDK's
/// `MLX5_CQ_INDEX_WIDTH`; its rearm queue's WAIT targets wrap at 24 bits).
const CQ_INDEX_BITS: u32 = 24;

/// True once a CQ that has produced `produced` completions satisfies a WAIT for `count`:
/// more than `count` completions, read modulo 2^24 ([`CQ_INDEX_BITS`]) as a count up to
/// 2^23 behind or ahead, as the hardware compares them.
#[inline(always)]
fn wait_passed(produced: u64, count: u32) -> bool {
    let mask = (1u32 << CQ_INDEX_BITS) - 1;
    let d = low32(produced).wrapping_sub(count) & mask;
    d != 0 && d <= mask >> 1
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

pub(crate) struct SqExec {
    core: Core,
    fetcher: Fetcher,
    /// The next visit first checks cheaply whether there is anything to do
    /// (`Core::nothing_to_do`): set after a visit that did nothing, or that ran the one WQE
    /// the queue was enabled for (`run_lone_nop`).
    quiet: bool,
}

/// Everything of the executor but the ring reader, so the two can be borrowed apart.
struct Core {
    qp: Arc<QpShared>,
    nic: Arc<Shared>,
    /// Consumer index: first BB of the next WQE to run.
    ci: u64,
    local_keys: KeyCache,
    remote_keys: KeyCache,
    peer: Option<Arc<dyn Transport>>,
    /// `peer` if it is in this process (as `Fetcher::direct`): what the fast paths move
    /// through.
    direct: Option<Arc<InProcess>>,
    /// The byte-reversing READ this queue last resolved (see `Core::fast_read`). Boxed:
    /// inline, its 168 bytes moved the fields every visit touches, and the one-BB `if`
    /// took ~37 more instructions (callgrind).
    reversed: Box<ReversedRead>,
    objs: ObjCache,
    limiter: Limiter,
    rate_generation: u64,
    stalled_at: u64,
    /// The WAIT the queue was found blocked on twice running (see `wait`): until the queue
    /// has moved past it, a visit first checks that CQ's count and, if still short, returns
    /// at once (`nothing_to_do`). Why: a PU visits every queue it owns each round, and a
    /// manager's idle clients sit on WAITs.
    parked: Option<Parked>,
    /// A queue on this PU that the last SEND_EN enabled, with its send CQ: the fast path
    /// hands over to it before a WAIT on that CQ (see [`Siblings`]).
    enabled_here: Option<(Qpn, Cqn)>,
    /// Bit `cqn % 64` set: this visit enabled a queue on another PU that was awake, whose
    /// send CQ this is. A WAIT the fast path finds blocked on such a CQ spins for its
    /// count (`pu::spin_for`) instead of returning to the PU loop: the completion is a
    /// cross-PU round trip away (a doorbell-ordered chain's step). A mask rather than one
    /// CQ, so a master that enables two queues and waits on each (a parallel probe) spins
    /// for both; a CQ that only shares a bit spins at most the bound.
    enabled_away: u64,
    /// Where the last queue handed over to was among the PU's queues (searched there first).
    handoff_hint: usize,
    delayed_at: u64,
    scratch: Vec<u8>,
    wqe: [u8; MAX_WQE_BYTES],
    /// `SoftNicConfig::wqe_checks`, read once.
    wqe_checks: bool,
    /// READ and atomic responses land late (`Prefetch::Adversarial`): see [`Core::late`].
    late_landing: bool,
    /// `SoftNicConfig::fast_paths`, read once: off, every WQE runs through `step`.
    fast_paths: bool,
    /// Responses of this queue's unsignaled READs and atomics that have not landed yet, in
    /// order: (lkey, address, bytes), each already checked for local write. ConnectX may
    /// run later WQEs of the queue before an RDMA READ's or atomic's response has landed
    /// unless they carry the fence flag; with `late_landing` the softnic lands them late:
    /// before a fenced WQE runs, before any completion of this queue (a completion says
    /// everything before it is done), before an error is reported, and when the queue stops
    /// (before a WAIT, which may block; at a SEND with no receive; with nothing more
    /// enabled or posted): the response does arrive. Each of those is a point in the
    /// queue's own WQE sequence, so where responses land does not depend on how the
    /// executor split the queue's run into visits, or on which path ran it. Empty
    /// otherwise.
    late: Vec<(u32, VirtAddr, Vec<u8>)>,
    /// The peer posts WRITEs and SENDs (`Transport::windowed`, a RoCE connection): the
    /// queue runs on the general path only, which keeps `posted` (see `Core::settle`).
    windowed: bool,
    /// WQEs whose messages the windowed peer has taken and not yet settled, oldest first:
    /// their completions (or errors) are written when their outcomes come, in order.
    posted: std::collections::VecDeque<Posted>,
}

/// A WQE whose message a windowed peer has taken: what its completion needs.
#[derive(Clone, Copy)]
struct Posted {
    ci: u64,
    bbs: u64,
    opcode: u8,
    signaled: bool,
}

/// What the fast path's WAIT / SEND_EN / RECV_EN did.
enum Control {
    Ran,
    /// Not runnable now (a WAIT's count not reached).
    Blocked,
    /// A check refused it: `execute` runs it and reports the error.
    Refused,
}

/// Why an operation did not complete.
enum Fail {
    /// Try again later (no receive at the peer).
    NotReady,
    /// Try again later: the windowed peer's window is full ([`Nak::WindowFull`]).
    WindowFull,
    /// Error completion with this syndrome.
    Syndrome(Syndrome),
}

impl From<Nak> for Fail {
    fn from(n: Nak) -> Fail {
        match n {
            Nak::ReceiverNotReady => Fail::NotReady,
            Nak::WindowFull => Fail::WindowFull,
            other => Fail::Syndrome(other.syndrome()),
        }
    }
}

impl SqExec {
    pub(crate) fn new(qp: Arc<QpShared>, nic: Arc<Shared>) -> SqExec {
        let depth = nic.config.prefetch.depth(qp.sq.entries);
        SqExec {
            fetcher: Fetcher::new(&qp.sq, depth, nic.config.wqe_checks),
            core: Core::new(qp, nic),
            quiet: false,
        }
    }

    pub(crate) fn is_destroyed(&self) -> bool {
        self.core.qp.destroyed.load(Ordering::Acquire)
    }

    /// Run up to `budget` WQEs. Kept a function of its own (a call per queue per PU round)
    /// so that profilers can count inside it: `callgrind --toggle-collect` on this name is how
    /// the per-WQE instruction counts in docs and notes are taken.
    ///
    /// `siblings` are the PU's other queues (this one taken out), which a doorbell-ordered
    /// chain hands over to (see [`Siblings`]).
    #[inline(never)]
    pub(crate) fn run(&mut self, budget: usize, siblings: Option<&mut Siblings>) -> RunOutcome {
        // A queue that had nothing to do last time is checked cheaply first (most of a
        // manager's queues, most of the time); a busy one goes straight on.
        if self.quiet && self.core.nothing_to_do() {
            return RunOutcome::Idle;
        }
        if self.run_lone_nop() {
            return RunOutcome::Progress;
        }
        let outcome = self.core.run(&mut self.fetcher, budget, siblings);
        self.core.land_at_visit_end();
        self.quiet = matches!(outcome, RunOutcome::Idle);
        outcome
    }

    pub(crate) fn qpn(&self) -> Qpn {
        self.core.qp.qpn
    }
}

impl Core {
    fn new(qp: Arc<QpShared>, nic: Arc<Shared>) -> Core {
        let wqe_checks = nic.config.wqe_checks;
        let late_landing = nic.config.prefetch == Prefetch::Adversarial;
        let fast_paths = nic.config.fast_paths;
        Core {
            qp,
            nic,
            ci: 0,
            local_keys: KeyCache::new(),
            remote_keys: KeyCache::new(),
            peer: None,
            direct: None,
            reversed: Box::new(ReversedRead::NONE),
            objs: ObjCache::default(),
            limiter: Limiter::default(),
            rate_generation: 0,
            stalled_at: u64::MAX,
            parked: None,
            enabled_here: None,
            enabled_away: 0,
            handoff_hint: 0,
            delayed_at: u64::MAX,
            scratch: Vec::new(),
            wqe: [0u8; MAX_WQE_BYTES],
            wqe_checks,
            late_landing,
            late: Vec::new(),
            fast_paths,
            windowed: false,
            posted: std::collections::VecDeque::new(),
        }
    }

    /// The index fetching may not pass.
    #[inline]
    fn limit(&self) -> u64 {
        if self.qp.managed_send {
            self.qp.enabled.get()
        } else {
            self.qp.doorbell.load(Ordering::Acquire)
        }
    }

    /// True if the queue may run WQEs without the full visit's care: [`Self::plain_config`]
    /// and no error to flush (`SqExec::run_enabled` and `SqExec::run_enabled_nop` run only
    /// then).
    #[inline(always)]
    fn runs_plain(&self) -> bool {
        self.plain_config() && self.qp.state() == QpState::ReadyToSend
    }

    /// The part of [`Self::runs_plain`] that only a reconfiguration changes: no WQE checks,
    /// no rate, and no rate change to pick up.
    #[inline(always)]
    fn plain_config(&self) -> bool {
        !self.wqe_checks
            && !self.windowed
            && !self.limiter.is_active()
            && self.qp.rate_generation.load(Ordering::Acquire) == self.rate_generation
    }

    /// True if a visit has nothing to do: nothing posted (or enabled) past what has run, no
    /// error to flush and no message awaiting its outcome from a windowed peer, or parked on a WAIT still short of its count. Most of a manager's
    /// queues, most of the time: checked in a small function of its own, before the
    /// executor's set-up (`run` is out of line).
    #[inline(always)]
    fn nothing_to_do(&mut self) -> bool {
        let state = self.qp.state();
        // Messages posted to a windowed peer wait for outcomes that may arrive at any turn
        // (their queue never waits for them: `settle_at_rest`).
        (self.ci >= self.limit() && state != QpState::Error && self.posted.is_empty())
            || self.still_parked(state)
    }

    /// True if the queue is parked on a WAIT (see `parked`) that is still short of its count
    /// and nothing else needs the queue's attention (`state` is ready to send: an error must
    /// be flushed). Clears the parking otherwise.
    #[inline(always)]
    fn still_parked(&mut self, state: QpState) -> bool {
        let Some(p) = self.parked else {
            return false;
        };
        if p.ci == self.ci && state == QpState::ReadyToSend {
            if let Some(cq) = self.objs.cq_at(&self.nic, p.cq_index, p.cqn) {
                if !wait_passed(cq.produced(), p.count) {
                    return true;
                }
            }
        }
        self.parked = None;
        false
    }

    /// Run up to `budget` WQEs. Out of line: a quiet queue's visit (`SqExec::run`) that finds
    /// nothing to do then pays none of its set-up (~20 instructions an idle queue, ~45 a
    /// parked one, against ~60 and ~210 inline; a busy queue pays ~12 for the call).
    ///
    /// The common visit is one pass of the fast path; whatever it leaves (a multi-BB WQE, a
    /// rate-limited queue) goes on in [`Self::run_general`]. Why apart: a doorbell-ordered
    /// chain's queue is visited once per WQE it runs, so this function's set-up and tear-down
    /// are paid per WQE, and the general loop's state need not be set up for a visit that
    /// never uses it (measured alone, the split saved only a few instructions; it is what
    /// lets the lean hand-over visit below share this code).
    #[inline(never)]
    fn run(
        &mut self,
        f: &mut Fetcher,
        budget: usize,
        siblings: Option<&mut Siblings>,
    ) -> RunOutcome {
        self.visit::<false>(f, budget, siblings)
    }

    /// The body of [`Self::run`], and with `LEAN` the visit of a queue handed over to (see
    /// [`Siblings`]): a pass of the fast path that runs only the WQEs chains step through,
    /// NOPs, WAITs, SEND_ENs and RECV_ENs, with no hot loop (`run_hot`) and no hand-over of
    /// its own; at any other WQE the ordinary visit (`run`, without siblings) takes over.
    /// Why a variant: such a visit typically runs the one WQE a SEND_EN just enabled, so its
    /// cost is mostly the set-up of the fast path's loop, which without the moves, atomics,
    /// general path and hot loop is ~35 instructions smaller. A doorbell step's NOPs do not
    /// come here (`SqExec::run_enabled` runs them); what else a handed-over queue holds does.
    /// Hot slots are still marked, for the queue's ordinary visits.
    #[inline(always)]
    fn visit<const LEAN: bool>(
        &mut self,
        f: &mut Fetcher,
        budget: usize,
        mut siblings: Option<&mut Siblings>,
    ) -> RunOutcome {
        match self.qp.state() {
            QpState::Init => return RunOutcome::Idle,
            QpState::Error => {
                return if self.flush(f) {
                    RunOutcome::Progress
                } else {
                    RunOutcome::Idle
                }
            }
            QpState::ReadyToSend => {}
        }
        let limit = self.limit();
        if self.ci >= limit {
            if self.posted.is_empty() {
                return RunOutcome::Idle;
            }
            // Messages posted to a windowed peer are outstanding: take their outcomes,
            // and let the transport's timers run.
            return self.settle_at_rest(RunOutcome::Idle);
        }
        stamp(HandoffEvent::Found);
        self.refresh(f);
        f.warm_ahead(self.ci, limit);
        // A rate-limited queue takes the general path, which admits each WQE; so does every
        // queue with the fast paths off, and one whose peer posts (its completions wait for
        // ACKs: see `posted`), which settles what it posted when it runs out of work.
        if self.windowed {
            let outcome = self.run_general(f, budget, 0, siblings);
            return self.settle_at_rest(outcome);
        }
        if self.limiter.is_active() || !self.fast_paths {
            return self.run_general(f, budget, 0, siblings);
        }
        let (done, blocked) = self.run_fast::<LEAN>(f, limit, budget, siblings.as_deref_mut());
        if !blocked && done < budget && self.ci < limit {
            if LEAN {
                // Stopped at a WQE the lean pass does not run: the ordinary visit goes on.
                let rest = self.run(f, budget - done, None);
                return self.ran(done, rest);
            }
            // Stopped at a WQE of more than one BB.
            return self.run_general(f, budget, done, siblings);
        }
        self.ran(done, RunOutcome::Idle)
    }

    /// Pick up what changed since the last visit: the peer (connected after the queue was
    /// created) and the rate limit.
    #[inline(always)]
    fn refresh(&mut self, f: &mut Fetcher) {
        if self.peer.is_none() {
            self.peer = self
                .qp
                .peer
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            self.direct = self
                .peer
                .clone()
                .and_then(|p| p.into_any().downcast::<InProcess>().ok());
            f.direct.clone_from(&self.direct);
            self.windowed = self.peer.as_ref().is_some_and(|p| p.windowed());
        }
        let g = self.qp.rate_generation.load(Ordering::Acquire);
        if g != self.rate_generation {
            self.rate_generation = g;
            let limit = *self.qp.rate.lock().unwrap_or_else(|e| e.into_inner());
            self.limiter = Limiter::new(limit, SystemClock.now());
        }
    }

    /// The end of a visit that ran `done` WQEs (`outcome` if none).
    #[inline(always)]
    fn ran(&mut self, done: usize, outcome: RunOutcome) -> RunOutcome {
        if done > 0 {
            // WQEs are counted as they run, so whoever sees one consumed sees it counted.
            self.qp.consumed.store(self.ci, Ordering::Release);
            return RunOutcome::Progress;
        }
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a queue's own PU writes as it runs (its consumed index, its counters) shares no
    /// cache line with what another PU reads or writes when it enables the queue (its
    /// identity, PU, CQ, destroyed flag, enabled index): such sharing would add a line
    /// transfer to every cross-PU hand-off.
    #[test]
    fn a_queues_pu_written_words_share_no_line_with_what_enablers_touch() {
        use std::mem::{offset_of, size_of};
        let line = |at: usize, len: usize| (at / 64)..=((at + len - 1) / 64);
        let written = [
            line(offset_of!(QpShared, consumed), 8),
            line(
                offset_of!(QpShared, counters),
                size_of::<super::super::qp::SharedCounters>(),
            ),
        ];
        let read = [
            ("qpn", line(offset_of!(QpShared, qpn), 4)),
            ("pu", line(offset_of!(QpShared, pu), 8)),
            ("pus", line(offset_of!(QpShared, pus), 8)),
            ("managed_send", line(offset_of!(QpShared, managed_send), 1)),
            ("destroyed", line(offset_of!(QpShared, destroyed), 1)),
            ("send_cq", line(offset_of!(QpShared, send_cq), 8)),
            (
                "enabled",
                line(
                    offset_of!(QpShared, enabled),
                    size_of::<super::super::qp::EnabledIndex>(),
                ),
            ),
        ];
        for w in &written {
            for (name, r) in &read {
                let overlap = w.start() <= r.end() && r.start() <= w.end();
                assert!(!overlap, "{name} (lines {r:?}) shares a line with {w:?}");
            }
        }
    }

    #[test]
    fn wait_compares_cq_indices_modulo_2_pow_24() {
        // More than `count` completions, within 2^23 either way.
        assert!(!wait_passed(5, 5));
        assert!(wait_passed(6, 5));
        assert!(!wait_passed(4, 5));
        // Only the low 24 bits of either side count.
        assert!(wait_passed((1 << 24) + 6, 5));
        assert!(wait_passed(6, 0xff00_0005));
        assert!(!wait_passed(1 << 24, 0));
        // Past the CQ index's wrap: produced 2^24 + 3 satisfies a WAIT for 2^24 - 2.
        assert!(wait_passed((1 << 24) + 3, (1 << 24) - 2));
        assert!(
            !wait_passed((1 << 24) - 2, 3),
            "ahead of the count, across the wrap"
        );
        // Half the range: 2^23 - 1 ahead passes, 2^23 reads as behind.
        assert!(wait_passed((1 << 23) - 1, 0));
        assert!(!wait_passed(1 << 23, 0));
    }
}
