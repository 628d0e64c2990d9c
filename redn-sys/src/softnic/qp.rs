//! Shared state of a queue pair: what the host, the owning PU and peers all touch.

use super::cache_line::CacheLine;
use super::cq::CqShared;
use super::events::AsyncEvents;
use super::transport::Transport;
use super::wake::PuSet;
use crate::conv::{self, idx, low32};
use crate::mem::SharedBuffer;
use crate::nic::{QpCounters, RateLimit};
use crate::types::{Pdn, Qpn};
use crate::wqe::{wqe_index, Cqe, CqeOpcode, Syndrome};
use crate::QpState;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

/// A ring in shared memory.
pub(crate) struct Ring {
    pub(crate) buffer: Arc<SharedBuffer>,
    pub(crate) offset: usize,
    /// Entries, a power of two.
    pub(crate) entries: u64,
    /// Bytes per entry.
    pub(crate) stride: usize,
}

impl Ring {
    /// Byte offset in the buffer of entry `index` (any absolute index; wraps by masking).
    #[inline]
    pub(crate) fn entry_off(&self, index: u64) -> usize {
        self.offset + idx(index & (self.entries - 1)) * self.stride
    }
}

/// Counters kept as atomics so they can be read while the queue runs. The owning PU is the
/// only writer of the first group and counts as WQEs run with plain loads and stores (no
/// locked instructions on the hot path; the fast path sums runs of NOPs, WRITEs and READs in
/// registers and adds them before any completion); responder-side events, counted
/// by whichever thread serves them, and host posts use read-modify-write.
// Whole cache lines: the queue's PU writes them as it runs, and must not take the line of
// what other PUs read on a hand-off (the queue's identity, its enabled index) with them.
#[derive(Default)]
#[repr(align(64))]
pub(crate) struct SharedCounters {
    pub(crate) wqes: [AtomicU64; 32],
    pub(crate) bytes: AtomicU64,
    pub(crate) errors: AtomicU64,
    pub(crate) wait_stalls: AtomicU64,
    pub(crate) rate_limit_delays: AtomicU64,
    pub(crate) rnr_waits: AtomicU64,
    // Written by other threads:
    pub(crate) responder_errors: AtomicU64,
    pub(crate) recvs: AtomicU64,
    pub(crate) host_posts: AtomicU64,
}

/// Add `d` to a counter that only the calling thread writes.
#[inline(always)]
pub(crate) fn bump(c: &AtomicU64, d: u64) {
    c.store(c.load(Ordering::Relaxed) + d, Ordering::Relaxed);
}

impl SharedCounters {
    pub(crate) fn snapshot(&self) -> QpCounters {
        let mut c = QpCounters::default();
        for (d, s) in c.wqes.iter_mut().zip(self.wqes.iter()) {
            *d = s.load(Ordering::Relaxed);
        }
        c.bytes = self.bytes.load(Ordering::Relaxed);
        c.errors =
            self.errors.load(Ordering::Relaxed) + self.responder_errors.load(Ordering::Relaxed);
        c.wait_stalls = self.wait_stalls.load(Ordering::Relaxed);
        c.rate_limit_delays = self.rate_limit_delays.load(Ordering::Relaxed);
        c.rnr_waits = self.rnr_waits.load(Ordering::Relaxed);
        c.recvs = self.recvs.load(Ordering::Relaxed);
        c.host_posts = self.host_posts.load(Ordering::Relaxed);
        c
    }
}

/// Receive queue state. Consumption happens under `consumer` (the peer's requester, or the
/// flush); posting under the QP's `post` lock.
pub(crate) struct RecvQueue {
    pub(crate) ring: Ring,
    pub(crate) wr_ids: Box<[AtomicU64]>,
    pub(crate) posted: AtomicU64,
    pub(crate) enabled: AtomicU64,
    pub(crate) consumer: Mutex<u64>,
}

/// A managed send queue's enabled index, in parts: the index is the largest. Why parts:
/// SEND_ENs run on the queue's own PU (a doorbell-ordered chain's every step) move `own`,
/// which only that PU's thread writes, with a plain load and store; a shared index would
/// need a locked exchange (~4 ns a step here). SEND_ENs from another PU of the queue's
/// softnic with an index below [`PU_SLOTS`] move that PU's word of `by_pu`, which only it
/// writes, likewise: the word is the hand-off a cross-PU doorbell chain's every step
/// publishes, and a locked exchange there cost ~40-60 ns a round trip more than a plain
/// store between two threads of this VM (docs/softnic-performance.md, "Counting a
/// hand-off's line transfers"). SEND_ENs from anywhere else move `shared`.
// A cache line of its own: the PUs that enable the queue write it, the queue's PU reads
// it every round; nothing else may ride with it (`docs/softnic-performance.md`).
#[derive(Default)]
#[repr(align(64))]
pub(crate) struct EnabledIndex {
    shared: AtomicU64,
    own: AtomicU64,
    /// Word `i`: SEND_ENs from PU `i` of the queue's softnic (not the queue's own PU).
    by_pu: [AtomicU64; PU_SLOTS],
    /// Set once any word of `by_pu` has been written: until then `get` does not read them,
    /// so a queue only its own PU enables pays one load more than two halves did.
    any_by_pu: AtomicBool,
}

/// PUs (the first, by index in their softnic) whose SEND_ENs of a queue on another PU
/// move a word of the queue's enabled index that only they write: as many as fit the
/// index's cache line beside its other parts.
pub(crate) const PU_SLOTS: usize = 5;
const _: () = assert!(std::mem::size_of::<EnabledIndex>() == 64);

impl EnabledIndex {
    /// WQEs below this may be fetched and run.
    #[inline(always)]
    pub(crate) fn get(&self) -> u64 {
        let halves = self
            .shared
            .load(Ordering::Acquire)
            .max(self.own.load(Ordering::Acquire));
        if !self.any_by_pu.load(Ordering::Acquire) {
            return halves;
        }
        self.by_pu
            .iter()
            .fold(halves, |m, w| m.max(w.load(Ordering::Acquire)))
    }

    /// SEND_EN by `by`: advance to the absolute `pi` if that moves the index forward (read
    /// modulo 2^16 relative to where it is now, as [`QpShared::advance`] reads it), in the
    /// part `by` owns. The caller is `by`'s thread: only the PU that runs the queue may pass
    /// [`Enabler::Own`], only PU `i`'s round [`Enabler::Pu`]`(i)`.
    #[inline(always)]
    pub(crate) fn advance_by(&self, by: Enabler, pi: u32) -> bool {
        match by {
            Enabler::Own => self.advance_own(pi).is_some(),
            Enabler::Pu(pu) => self.advance_from_pu(pi, pu),
            Enabler::Other => self.advance_shared(pi),
        }
    }

    /// [`Self::advance_by`] for PU `pu` of the queue's softnic, which is not the queue's
    /// own: the only writer of its word. A PU without a word ([`Enabler::of`] gives none
    /// such) moves the shared part.
    #[inline(always)]
    fn advance_from_pu(&self, pi: u32, pu: usize) -> bool {
        let Some(word) = self.by_pu.get(pu) else {
            return self.advance_shared(pi);
        };
        let Some(target) = forward(self.get(), pi) else {
            return false;
        };
        // At least the word's own value: `get` read it.
        word.store(target, Ordering::Release);
        if !self.any_by_pu.load(Ordering::Relaxed) {
            // After the word: whoever sees the flag sees the word.
            self.any_by_pu.store(true, Ordering::Release);
        }
        true
    }

    /// An enable from an enabler with no word of its own: a locked update of `shared`.
    fn advance_shared(&self, pi: u32) -> bool {
        QpShared::advance_from(&self.shared, self.get(), pi)
    }

    /// `advance_by(Enabler::Own, pi)`, for the PU thread that runs the queue: the index it
    /// moved to, or
    /// None if `pi` was not ahead. That index is one [`Self::get`] returned at the time, so a
    /// later `get` returns at least it (the index only moves forward).
    #[inline(always)]
    pub(crate) fn advance_own(&self, pi: u32) -> Option<u64> {
        let target = forward(self.get(), pi)?;
        self.own.store(target, Ordering::Release);
        Some(target)
    }
}

/// Who runs a SEND_EN, as the enabled queue's index sees it: which of its parts the enable
/// moves ([`EnabledIndex::advance_by`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Enabler {
    /// The PU that runs the queue: `own`.
    Own,
    /// PU `i` of the queue's softnic, `i` below [`PU_SLOTS`] and not the queue's: `by_pu[i]`.
    Pu(usize),
    /// Anyone else (a PU of another softnic, or one past the words): `shared`, locked.
    Other,
}

impl Enabler {
    /// The enabler a SEND_EN run by PU `pu` is for a queue on PU `queue_pu`; `same_softnic`:
    /// the two PUs are of one softnic (one PU set), so their indices compare.
    #[inline(always)]
    pub(crate) fn of(same_softnic: bool, queue_pu: usize, pu: usize) -> Self {
        if !same_softnic {
            Self::Other
        } else if pu == queue_pu {
            Self::Own
        } else if pu < PU_SLOTS {
            Self::Pu(pu)
        } else {
            Self::Other
        }
    }
}

/// Bits of a work-queue index that SEND_EN and RECV_EN compare: ConnectX compares queue
/// indices modulo 2^16 (DPDK's `MLX5_WQ_INDEX_WIDTH`, which its packet-pacing rearm queue
/// relies on: its SEN targets wrap at 16 bits and are never rewritten).
pub(crate) const WQ_INDEX_BITS: u32 = 16;

/// Where a 64-bit index at `cur` moves for the absolute `pi`, read modulo 2^16
/// ([`WQ_INDEX_BITS`]) as a point up to 2^15 - 1 ahead of it; None if `pi` is not ahead
/// (indices on the wire wrap at 16 bits, whatever the field's width; ours are 64 bits and
/// never do). So an enable may move a queue at most 2^15 - 1 WQE BBs at once.
#[inline(always)]
fn forward(cur: u64, pi: u32) -> Option<u64> {
    let mask = (1u32 << WQ_INDEX_BITS) - 1;
    let delta = pi.wrapping_sub(low32(cur)) & mask;
    (delta != 0 && delta <= mask >> 1).then(|| cur + u64::from(delta))
}

pub(crate) struct QpShared {
    pub(crate) qpn: Qpn,
    pub(crate) pd: Pdn,
    pub(crate) pu: usize,
    pub(crate) pus: Arc<PuSet>,
    pub(crate) managed_send: bool,
    pub(crate) managed_recv: bool,
    /// `QpConfig::atomic_be_reply`: atomic replies land big-endian (MLNX_OFED only).
    pub(crate) atomic_be_reply: bool,
    /// The softnic's asynchronous event queue, where a responder error is reported.
    pub(crate) events: Arc<AsyncEvents>,
    state: AtomicU8,
    pub(crate) destroyed: AtomicBool,
    pub(crate) sq: Ring,
    pub(crate) sq_wr_ids: Box<[AtomicU64]>,
    /// Unmanaged queues: the last doorbell's producer index.
    pub(crate) doorbell: AtomicU64,
    /// Managed queues: WQEs below this index may be fetched and run.
    pub(crate) enabled: EnabledIndex,
    /// Host producer index (what was posted, for flushing and space checks).
    pub(crate) posted: AtomicU64,
    /// WQEs consumed, published by the PU after each burst.
    /// On a line of its own: written by the PU as it runs, while other PUs read the
    /// queue's identity on every SEND_EN of it.
    pub(crate) consumed: CacheLine<AtomicU64>,
    /// Serialises posts (send and receive), and holds the send post's encoding buffer:
    /// reused, not zeroed 1 KiB at a time (the encoder writes every byte of a WQE's blocks).
    pub(crate) post: Mutex<Box<[u8; crate::wqe::MAX_WQE_BYTES]>>,
    pub(crate) rq: RecvQueue,
    pub(crate) send_cq: Arc<CqShared>,
    pub(crate) recv_cq: Arc<CqShared>,
    /// How our requests reach the peer; taken away on destroy to break the reference cycle.
    pub(crate) peer: Mutex<Option<Arc<dyn Transport>>>,
    /// The QP connected to us (to wake its PU when we post a receive it may be waiting for).
    pub(crate) requester: OnceLock<Weak<QpShared>>,
    pub(crate) rate: Mutex<RateLimit>,
    pub(crate) rate_generation: AtomicU64,
    pub(crate) counters: SharedCounters,
}

impl QpShared {
    /// Count `n` send WQEs of `opcode` run (by the queue's PU: the counters' only writer).
    #[inline(always)]
    pub(crate) fn count_wqes(&self, opcode: u8, n: u64) {
        bump(&self.counters.wqes[usize::from(opcode & 31)], n);
    }

    /// Publish that the send ring is consumed up to `next` and push the send CQE of the WQE
    /// at `ci`, in that order: a host that sees the completion may reuse the slots at once.
    /// The wr_id is read first, before the host can overwrite it. Called by the queue's PU.
    #[inline(always)]
    pub(crate) fn retire(
        &self,
        ci: u64,
        next: u64,
        opcode: CqeOpcode,
        send_opcode: u8,
        byte_cnt: u32,
        syndrome: u8,
    ) {
        // One wr_id per ring entry, a power of two: masking by the array's own length
        // needs no other load.
        let ids = &self.sq_wr_ids;
        let wr_id = ids[idx(ci) & (ids.len() - 1)].load(Ordering::Relaxed);
        self.consumed.store(next, Ordering::Release);
        self.send_cq.push_from(
            Cqe {
                opcode,
                qpn: self.qpn,
                send_opcode,
                wqe_counter: wqe_index(ci),
                byte_cnt,
                imm: 0,
                syndrome,
                vendor_syndrome: 0,
                timestamp: 0,
                owner: false,
            },
            wr_id,
            Some((&self.pus, &self.pu)),
        );
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        qpn: Qpn,
        pd: Pdn,
        pu: usize,
        pus: Arc<PuSet>,
        managed_send: bool,
        managed_recv: bool,
        atomic_be_reply: bool,
        events: Arc<AsyncEvents>,
        sq: Ring,
        rq: Ring,
        send_cq: Arc<CqShared>,
        recv_cq: Arc<CqShared>,
    ) -> QpShared {
        let atomics = |n: u64| (0..n).map(|_| AtomicU64::new(0)).collect();
        QpShared {
            qpn,
            pd,
            pu,
            pus,
            managed_send,
            managed_recv,
            atomic_be_reply,
            events,
            state: AtomicU8::new(QpState::Init as u8),
            destroyed: AtomicBool::new(false),
            sq_wr_ids: atomics(sq.entries),
            sq,
            doorbell: AtomicU64::new(0),
            enabled: EnabledIndex::default(),
            posted: AtomicU64::new(0),
            consumed: CacheLine(AtomicU64::new(0)),
            post: Mutex::new(Box::new([0; crate::wqe::MAX_WQE_BYTES])),
            rq: RecvQueue {
                wr_ids: atomics(rq.entries),
                ring: rq,
                posted: AtomicU64::new(0),
                enabled: AtomicU64::new(0),
                consumer: Mutex::new(0),
            },
            send_cq,
            recv_cq,
            peer: Mutex::new(None),
            requester: OnceLock::new(),
            rate: Mutex::new(RateLimit::default()),
            rate_generation: AtomicU64::new(0),
            counters: SharedCounters::default(),
        }
    }

    #[inline]
    pub(crate) fn state(&self) -> QpState {
        QpState::from_u8(self.state.load(Ordering::Acquire))
    }

    pub(crate) fn set_ready(&self) {
        let _ = self.state.compare_exchange(
            QpState::Init as u8,
            QpState::ReadyToSend as u8,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    /// Move to the error state (once): flush the receive queue here, and wake the PU, which
    /// flushes the send queue (it owns the send queue's consumer index).
    /// True if this call moved it (it was not in error already).
    pub(crate) fn enter_error(&self) -> bool {
        if self.state.swap(QpState::Error as u8, Ordering::AcqRel) == QpState::Error as u8 {
            return false;
        }
        self.flush_recv();
        self.pus.notify(self.pu);
        true
    }

    /// Complete every posted, unconsumed receive with a flush error.
    pub(crate) fn flush_recv(&self) {
        let mut consumed = self.rq.consumer.lock().unwrap_or_else(|e| e.into_inner());
        let posted = self
            .rq
            .posted
            .load(Ordering::Acquire)
            .max(self.rq.enabled.load(Ordering::Acquire))
            .min(*consumed + self.rq.ring.entries);
        while *consumed < posted {
            let idx = *consumed;
            self.recv_cq.push(
                Cqe {
                    opcode: CqeOpcode::RespErr,
                    qpn: self.qpn,
                    send_opcode: 0,
                    wqe_counter: wqe_index(idx),
                    byte_cnt: 0,
                    imm: 0,
                    syndrome: Syndrome::WrFlush as u8,
                    vendor_syndrome: 0,
                    timestamp: 0,
                    owner: false,
                },
                self.rq.wr_ids[conv::idx(idx & (self.rq.ring.entries - 1))].load(Ordering::Relaxed),
            );
            *consumed += 1;
        }
    }

    /// Advance a managed index to the absolute `pi` (read modulo 2^16, see [`forward`]) if
    /// that moves it forward.
    pub(crate) fn advance(index: &AtomicU64, pi: u32) -> bool {
        Self::advance_from(index, 0, pi)
    }

    /// As [`Self::advance`], where the index is at least `floor` (the rest of a send
    /// queue's enabled index): `pi` is read relative to the larger.
    fn advance_from(index: &AtomicU64, floor: u64, pi: u32) -> bool {
        let cur = index.load(Ordering::Acquire).max(floor);
        let Some(target) = forward(cur, pi) else {
            return false;
        };
        // One exchange nearly always does it (a queue is seldom enabled from two PUs at the
        // same moment); if another enable moved the index meanwhile, the larger one stays.
        if let Err(now) = index.compare_exchange(cur, target, Ordering::AcqRel, Ordering::Acquire) {
            if now < target {
                index.fetch_max(target, Ordering::AcqRel);
            }
        }
        true
    }

    /// Wake the PU of the queue pair that sends to us (it may be waiting for a receive).
    pub(crate) fn wake_requester(&self) {
        if let Some(r) = self.requester.get().and_then(Weak::upgrade) {
            r.pus.notify(r.pu);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{EnabledIndex, Enabler, QpShared, PU_SLOTS};
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn the_enabled_index_is_the_larger_half_and_only_moves_forward() {
        let e = EnabledIndex::default();
        assert_eq!(e.get(), 0);
        assert!(e.advance_by(Enabler::Own, 3));
        assert!(
            !e.advance_by(Enabler::Other, 2),
            "behind the own half: no move"
        );
        assert_eq!(e.get(), 3);
        assert!(e.advance_by(Enabler::Other, 7));
        assert_eq!(e.get(), 7);
        assert!(
            !e.advance_by(Enabler::Own, 5),
            "behind the shared half: no move"
        );
        assert!(e.advance_by(Enabler::Own, 8));
        assert_eq!(e.get(), 8);
        // Indices on the wire are compared modulo 2^16 and wrap; ours keep counting.
        let e = EnabledIndex::default();
        assert!(e.advance_by(Enabler::Own, 0x7ff0));
        assert!(e.advance_by(Enabler::Other, 0xffe0));
        assert!(
            !e.advance_by(Enabler::Own, 0x7fe0),
            "half the range ahead is behind"
        );
        assert!(e.advance_by(Enabler::Own, 0x10));
        assert_eq!(e.get(), 0x1_0010);
        assert!(
            !e.advance_by(Enabler::Other, 0xfff8),
            "a wrapped index behind is behind"
        );
        assert_eq!(e.get(), 0x1_0010);
        // Only the low 16 bits count, whatever the 32-bit field holds.
        assert!(e.advance_by(Enabler::Own, 0xabcd_0020));
        assert_eq!(e.get(), 0x1_0020);
        assert!(
            !e.advance_by(Enabler::Other, 0x0001_0020),
            "the same index, other high bits"
        );
        assert!(e.advance_by(Enabler::Other, 0x8000), "0x7fe0 ahead");
        assert_eq!(e.get(), 0x1_8000);
    }

    #[test]
    fn only_the_queues_own_pu_writes_the_own_half() {
        // `own` is written with a plain load and store, safe only because one thread (the
        // queue's PU) writes it; an enable from anywhere else must move `shared` alone.
        let e = EnabledIndex::default();
        assert!(e.advance_by(Enabler::Other, 7));
        assert_eq!(
            e.own.load(Ordering::Relaxed),
            0,
            "another PU wrote the own half"
        );
        assert_eq!(e.shared.load(Ordering::Relaxed), 7);
        assert!(e.advance_by(Enabler::Own, 9));
        assert_eq!(e.own.load(Ordering::Relaxed), 9);
        assert_eq!(
            e.shared.load(Ordering::Relaxed),
            7,
            "the own PU wrote the shared half"
        );
        assert_eq!(e.get(), 9);
    }

    #[test]
    fn an_enabler_is_the_queue_s_pu_a_pu_with_a_word_of_its_softnic_or_other() {
        assert_eq!(Enabler::of(true, 2, 2), Enabler::Own);
        assert_eq!(
            Enabler::of(true, PU_SLOTS, PU_SLOTS),
            Enabler::Own,
            "no word needed"
        );
        assert_eq!(Enabler::of(true, 2, 0), Enabler::Pu(0));
        assert_eq!(Enabler::of(true, 0, 2), Enabler::Pu(2));
        let last = PU_SLOTS - 1;
        assert_eq!(Enabler::of(true, 0, last), Enabler::Pu(last));
        assert_eq!(
            Enabler::of(true, 0, PU_SLOTS),
            Enabler::Other,
            "past the words"
        );
        assert_eq!(
            Enabler::of(false, 2, 2),
            Enabler::Other,
            "another softnic's PU 2"
        );
        assert_eq!(Enabler::of(false, 2, 0), Enabler::Other);
    }

    /// The parts of `e`: (shared, own, by_pu).
    fn parts(e: &EnabledIndex) -> (u64, u64, [u64; PU_SLOTS]) {
        (
            e.shared.load(Ordering::Relaxed),
            e.own.load(Ordering::Relaxed),
            std::array::from_fn(|i| e.by_pu[i].load(Ordering::Relaxed)),
        )
    }

    #[test]
    fn each_enabler_moves_its_own_part_and_the_index_is_the_largest() {
        let mut word = [0; PU_SLOTS];
        word[PU_SLOTS - 1] = 5;
        for (by, moved) in [
            (Enabler::Own, (0, 5, [0; PU_SLOTS])),
            (Enabler::Pu(PU_SLOTS - 1), (0, 0, word)),
            (Enabler::Other, (5, 0, [0; PU_SLOTS])),
        ] {
            let e = EnabledIndex::default();
            assert!(e.advance_by(by, 5), "{by:?}");
            assert_eq!(parts(&e), moved, "{by:?}");
            assert_eq!(e.get(), 5, "{by:?}");
            assert!(!e.advance_by(by, 5), "{by:?}: not ahead");
            // Each of the others, behind it, moves nothing; ahead, moves its own part.
            for other in [Enabler::Own, Enabler::Pu(0), Enabler::Other] {
                assert!(!e.advance_by(other, 4) || other == by, "{by:?} {other:?}");
            }
            assert_eq!(parts(&e), moved, "{by:?}");
            assert!(e.advance_by(Enabler::Pu(0), 6));
            assert_eq!(e.by_pu[0].load(Ordering::Relaxed), 6, "{by:?}");
            assert_eq!(e.get(), 6, "{by:?}");
        }
    }

    #[test]
    fn another_pu_of_the_softnic_moves_its_own_word_and_the_index_is_the_largest() {
        let e = EnabledIndex::default();
        assert!(e.advance_by(Enabler::Pu(1), 4));
        assert_eq!(e.by_pu[1].load(Ordering::Relaxed), 4);
        assert_eq!(e.own.load(Ordering::Relaxed), 0, "PU 1 wrote the own half");
        assert_eq!(
            e.shared.load(Ordering::Relaxed),
            0,
            "PU 1 wrote the shared part"
        );
        assert_eq!(e.get(), 4);
        assert!(
            !e.advance_by(Enabler::Pu(2), 3),
            "behind PU 1's word: no move"
        );
        assert_eq!(e.by_pu[2].load(Ordering::Relaxed), 0);
        assert!(e.advance_by(Enabler::Own, 6));
        assert!(e.advance_by(Enabler::Pu(2), 9));
        assert!(!e.advance_by(Enabler::Other, 8), "behind PU 2's word");
        assert!(e.advance_by(Enabler::Other, 10));
        assert_eq!(e.get(), 10);
        // A PU without a word moves the shared part.
        assert!(e.advance_by(Enabler::Pu(PU_SLOTS), 12));
        assert_eq!(e.shared.load(Ordering::Relaxed), 12);
        assert_eq!(e.get(), 12);
        // Modulo 2^16, relative to the largest part.
        let e = EnabledIndex::default();
        assert!(e.advance_by(Enabler::Pu(0), 0x7ff0));
        assert!(e.advance_by(Enabler::Pu(3), 0xffe0));
        assert!(
            !e.advance_by(Enabler::Own, 0x7fe0),
            "half the range ahead is behind"
        );
        assert!(e.advance_by(Enabler::Pu(0), 0x10));
        assert_eq!(e.get(), 0x1_0010);
    }

    #[test]
    fn enables_racing_from_several_pus_keep_the_largest() {
        use std::sync::Arc;
        let e = Arc::new(EnabledIndex::default());
        let last: u32 = if cfg!(miri) { 50 } else { 20_000 };
        let threads: Vec<_> = (0..4)
            .map(|pu| {
                let e = Arc::clone(&e);
                std::thread::spawn(move || {
                    for pi in 1..=last {
                        // Each PU enables the same indices, as two PUs racing to enable a
                        // queue do; the words are each written by their own PU alone.
                        e.advance_by(Enabler::Pu(pu), pi);
                        assert!(e.get() >= u64::from(pi), "an enable went backwards");
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("enabler");
        }
        assert_eq!(e.get(), u64::from(last));
    }

    #[test]
    fn an_enable_moves_at_most_half_the_16_bit_range() {
        let e = EnabledIndex::default();
        assert!(e.advance_by(Enabler::Own, 0x7fff), "2^15 - 1 ahead");
        let e = EnabledIndex::default();
        assert!(
            !e.advance_by(Enabler::Own, 0x8000),
            "2^15 ahead reads as behind"
        );
        assert!(
            !e.advance_by(Enabler::Other, 0x1_0000),
            "2^16 ahead is where it is"
        );
        assert_eq!(e.get(), 0);
    }

    #[test]
    fn an_enable_to_where_the_index_already_is_moves_nothing() {
        // A zero advance is no advance, from the queue's own PU or any other, in either half
        // and across the 32-bit wrap: it reports false (no wake-up, no hand-over).
        let e = EnabledIndex::default();
        assert!(!e.advance_by(Enabler::Own, 0));
        assert!(!e.advance_by(Enabler::Other, 0));
        assert_eq!(e.advance_own(0), None);
        assert!(e.advance_by(Enabler::Own, 5));
        assert!(!e.advance_by(Enabler::Own, 5));
        assert!(!e.advance_by(Enabler::Other, 5));
        assert_eq!(e.advance_own(5), None);
        assert!(e.advance_by(Enabler::Other, 9));
        assert!(!e.advance_by(Enabler::Other, 9));
        assert!(!e.advance_by(Enabler::Own, 9));
        assert_eq!(e.advance_own(9), None);
        assert_eq!(e.get(), 9);
        let e = EnabledIndex::default();
        assert!(e.advance_by(Enabler::Own, 0x7ff0));
        assert!(e.advance_by(Enabler::Other, 0xffe0));
        assert!(e.advance_by(Enabler::Own, 0x10));
        assert_eq!(e.get(), 0x1_0010);
        assert!(!e.advance_by(Enabler::Own, 0x10));
        assert!(!e.advance_by(Enabler::Other, 0x10));
        assert_eq!(e.get(), 0x1_0010);
        // A receive queue's index (RECV_EN) likewise.
        let r = AtomicU64::new(0);
        assert!(!QpShared::advance(&r, 0));
        assert!(QpShared::advance(&r, 3));
        assert!(!QpShared::advance(&r, 3));
        assert_eq!(r.load(Ordering::Relaxed), 3);
    }
}
