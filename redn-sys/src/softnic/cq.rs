//! Completion queues: a ring of mlx5 CQE64 entries plus the running count WAIT compares with.

use super::cache_line::{prefetch_line, CacheLine};
use super::events::AsyncEvents;
use super::handoff_trace::{stamp, HandoffEvent};
use super::spin::SpinLock;
use super::wake::PuSet;
use crate::conv::idx;
use crate::nic::{AsyncEvent, CompChannel, Completion, CqConfig};
use crate::types::Cqn;
use crate::wqe::{Cqe, CqeOpcode, Syndrome, CQE_SIZE};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// How many entries ahead of the one it writes a push hints the entry a later push will
/// write (see `push_from`): a doorbell chain pushes one a step, so this is some steps'
/// time for the line to arrive.
pub(crate) const WARM_CQES: u64 = 16;

/// The softnic's completion clock, what it writes into a CQE's timestamp: nanoseconds of
/// the host's `CLOCK_MONOTONIC` (the clock `Instant` reads). A ConnectX writes its own
/// free-running clock in ticks; a clock shared by every softnic on a host instead lets a
/// benchmark compare stamps from two processes' softnics, and nanoseconds need no
/// conversion (`mlx5dv_get_clock_info`'s role on hardware).
#[inline]
pub fn completion_clock_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call's duration; CLOCK_MONOTONIC
    // exists on every Linux, so the call cannot fail (and a failure would leave zeros).
    let _ = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    // Both fields are non-negative for CLOCK_MONOTONIC.
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

/// What a CQ's producer lock guards.
struct Producer {
    /// Entries written into the ring (lost ones excluded).
    produced: u64,
    /// The consumer index as last read (`CqShared::consumed`): the ring has room while
    /// `produced` is less than a ring ahead of it, and only then is it read again.
    consumed_seen: u64,
    /// Armed by `req_notify`: the next push signals this channel and disarms.
    notify: Option<CompChannel>,
    /// The CQ overran and is in error: no completion is written or counted any more.
    failed: bool,
}

/// One CQE64 in the ring, as eight words: the producer writes the word that holds the
/// owner bit last (release), so a poller that sees an entry valid for its index (owner bit
/// and opcode, [`entry_valid`]) sees all of it. One line each. The entry's wr_id is kept in
/// its first eight bytes ([`WR_ID_WORD`]), reserved in a requester CQE64 (mlx5 puts
/// inline-scattered data there only with scatter-to-CQE, which the softnic does not do)
/// and not read by `Cqe::decode`: a poller then reads one line an entry, where an array
/// of wr_ids beside the ring put eight entries' on one line that the producer went on
/// writing after the poller had read it.
#[repr(C, align(64))]
struct CqeSlot {
    words: [AtomicU64; CQE_SIZE / 8],
}

/// The byte of a CQE64 that holds the opcode (high nibble) and the owner bit (bit 0), and
/// the word it is in.
const OP_OWN: usize = CQE_SIZE - 1;
const OP_OWN_WORD: usize = OP_OWN / 8;
/// The word of a slot that holds its wr_id (see [`CqeSlot`]).
const WR_ID_WORD: usize = 0;

/// A slot nobody has written: an invalid opcode (mlx5's 0xf), and an owner bit that is not
/// the first pass's.
const OP_OWN_EMPTY: u8 = 0xf1;

/// True if `op_own` (byte [`OP_OWN`] of a slot) holds the entry of the pass over a ring of
/// `depth` entries that index `at` belongs to: its owner bit is that pass's (it flips each
/// pass, as mlx5's does) and its opcode is a valid one.
#[inline(always)]
fn entry_valid(op_own: u8, at: u64, depth: u64) -> bool {
    (op_own & 1 == 1) == (at & depth != 0) && CqeOpcode::from_nibble(op_own >> 4).is_some()
}

/// One completion queue. Any processing unit (or a peer's) may produce into it; hosts poll.
///
/// Producers and pollers share no lock and no written line but the entries themselves:
/// producers push under `producer`, pollers take entries under `consumer` and publish how
/// far they got in `consumed`, which producers read only when the ring looks full. Why: a
/// verbs host polls each completion as it comes, and with one lock for both, every poll
/// took the lock's line (and the consumer index's) from the PU, whose next push then
/// waited for it: a doorbell-ordered chain polled that way took 200+ ns a step instead
/// of ~60 (`softnic_bench`, poll detection).
pub(crate) struct CqShared {
    pub(crate) cqn: Cqn,
    depth: u64,
    ignore_overrun: bool,
    /// Taken for a few instructions per push (see `spin`). On a line of its own, as is
    /// each of the pollers' lock, `consumed`, `produced` and `lapped`: what a poll reads or
    /// writes shares no line with what a push writes, but the entries. (With the two locks
    /// on one line, each poll took the PU's line away, and a doorbell-ordered chain polled
    /// by its host took 140-680 ns a step instead of 60-80, `softnic_bench --detect poll`.)
    producer: CacheLine<SpinLock<Producer>>,
    /// Serializes pollers (several host threads may poll one CQ); on a line of its own, as
    /// the pollers' lock should not share one with anything a producer writes.
    consumer: CacheLine<SpinLock<()>>,
    /// The entries, written under the producer lock.
    cqes: Box<[CqeSlot]>,
    /// Entries taken by pollers (written under `consumer`).
    consumed: CacheLine<AtomicU64>,
    /// Completions produced since creation: what WAIT counts. Written under `producer`; on
    /// its own cache line, since waiters on other threads read it constantly. Every
    /// completion writes it, so a host that spins on it takes the line from the producing
    /// PU each time: hosts poll the entries instead.
    produced: CacheLine<AtomicU64>,
    overrun: AtomicBool,
    /// Set by a producer that overwrote an entry no poller had taken (only an
    /// only-waited-on CQ does): the next poll skips to what is left. Written only then.
    lapped: CacheLine<AtomicBool>,
    /// Bit i set: a queue on PU i has waited on this CQ, so PU i is told of new completions.
    waiters: AtomicU64,
    pus: Arc<PuSet>,
    /// The softnic's asynchronous event queue, where an overrun is reported.
    events: Arc<AsyncEvents>,
    /// Queue pairs using this CQ (destroy refuses while nonzero).
    pub(crate) users: AtomicU64,
    /// Success CQEs get the completion clock's stamp (`CqConfig::timestamps`).
    timestamps: bool,
}

impl CqShared {
    pub(crate) fn new(
        cqn: Cqn,
        cfg: CqConfig,
        pus: Arc<PuSet>,
        events: Arc<AsyncEvents>,
    ) -> CqShared {
        let depth = u64::from(cfg.depth.max(1).next_power_of_two());
        CqShared {
            cqn,
            depth,
            ignore_overrun: cfg.ignore_overrun,
            timestamps: cfg.timestamps,
            producer: CacheLine(SpinLock::new(Producer {
                produced: 0,
                consumed_seen: 0,
                notify: None,
                failed: false,
            })),
            consumer: CacheLine(SpinLock::new(())),
            cqes: (0..depth)
                .map(|_| CqeSlot {
                    words: std::array::from_fn(|i| {
                        let mut w = [0u8; 8];
                        if i == OP_OWN_WORD {
                            w[OP_OWN % 8] = OP_OWN_EMPTY;
                        }
                        AtomicU64::new(u64::from_ne_bytes(w))
                    }),
                })
                .collect(),
            consumed: CacheLine(AtomicU64::new(0)),
            produced: CacheLine(AtomicU64::new(0)),
            overrun: AtomicBool::new(false),
            lapped: CacheLine(AtomicBool::new(false)),
            waiters: AtomicU64::new(0),
            pus,
            events,
            users: AtomicU64::new(0),
        }
    }

    /// Completions produced so far.
    #[inline]
    pub(crate) fn produced(&self) -> u64 {
        self.produced.0.load(Ordering::Acquire)
    }

    /// Remember that a queue on `pu` waits for this CQ. The caller re-reads `produced()`
    /// afterwards. No wake-up is lost: a PU's bit is set once, under the producer lock, and
    /// then stays, so every push either ran its critical section before the bit was set (and
    /// the caller's re-read, which follows the lock, sees its count) or after (and its
    /// `wake`, which follows the lock, sees the bit). That is why `push` needs no
    /// sequentially consistent store.
    #[inline]
    pub(crate) fn add_waiter(&self, pu: usize) {
        let bit = 1u64 << pu;
        if self.waiters.load(Ordering::Relaxed) & bit == 0 {
            let _producer = self.producer.0.lock();
            self.waiters.fetch_or(bit, Ordering::Relaxed);
        }
    }

    /// Arm the CQ: its next completion signals `channel`. Under the producer lock, as `push`
    /// checks it, so a completion either comes after the arming (and signals) or before it
    /// (and whoever armed sees it when they poll or read the count next).
    pub(crate) fn req_notify(&self, channel: &CompChannel) {
        let old = self.producer.0.lock().notify.replace(channel.clone());
        // Dropped after the lock (it may be the last reference).
        drop(old);
    }

    /// Add a completion.
    pub(crate) fn push(&self, cqe: Cqe, wr_id: u64) {
        self.push_from(cqe, wr_id, None);
    }

    /// Add a completion from PU `from.1` of the set `from.0`, if the caller is a PU that
    /// knows which it is: waking the PUs that wait on this CQ then skips the caller's own
    /// without a thread-local lookup (`PuSet::notify_from`). Both by reference: the caller
    /// passes where they are (a queue's fields) and only a push that wakes someone reads
    /// them, which most do not.
    // Inlined: the executor's completion path builds `cqe` from a few registers, and inline
    // it encodes them straight into the ring instead of through a struct in memory.
    #[inline(always)]
    pub(crate) fn push_from(&self, mut cqe: Cqe, wr_id: u64, from: Option<(&PuSet, &usize)>) {
        let notify = 'push: {
            let mut p = self.producer.0.lock();
            if p.failed {
                // In error after an overrun: nothing more is written or counted.
                break 'push None;
            }
            let mut full = p.produced - p.consumed_seen >= self.depth;
            // An only-waited-on CQ that has already lapped its poller overwrites without
            // asking how far the poller got (it has not polled since, or the flag would be
            // down): a CQ nobody polls (a doorbell chain's, watched by its WAITs alone) is
            // full at every push.
            if full && !(self.ignore_overrun && self.lapped.0.load(Ordering::Relaxed)) {
                // Pairs with the poller's release: its reads of the entries it took come
                // before this push overwrites them.
                p.consumed_seen = self.consumed.0.load(Ordering::Acquire);
                full = p.produced - p.consumed_seen >= self.depth;
            }
            if full && !self.ignore_overrun {
                // The CQ goes to error, as on hardware (`ibv_get_async_event(3)`,
                // IBV_EVENT_CQ_ERR): this entry and every later one are lost and not
                // counted; the poller learns of it once, the owner by the event.
                p.failed = true;
                self.overrun.store(true, Ordering::Release);
                self.events.raise(AsyncEvent::CqError(self.cqn));
                break 'push None;
            } else {
                if full && !self.lapped.0.load(Ordering::Relaxed) {
                    // Only waited on: the oldest entry gives way, and the poller is told.
                    self.lapped.0.store(true, Ordering::Relaxed);
                }
                // The owner bit flips each pass over the ring (depth is a power of two, so
                // this is bit log2(depth) of the count: no division on the hot path).
                cqe.owner = p.produced & self.depth != 0;
                // Stamped under the producer lock, so a CQ's stamps never go back in ring
                // order; error CQEs have no timestamp field (see `Cqe::timestamp`), and a CQ
                // created without timestamps (a counted one, by default) pays no clock read.
                if self.timestamps && !cqe.opcode.is_error() {
                    cqe.timestamp = completion_clock_ns();
                }
                let mut b = [0u8; CQE_SIZE];
                cqe.encode_into(&mut b);
                let slot = self.slot(p.produced);
                for (i, (w, v)) in slot.words.iter().zip(b.chunks_exact(8)).enumerate() {
                    if i == WR_ID_WORD {
                        w.store(wr_id, Ordering::Relaxed);
                    } else if i != OP_OWN_WORD {
                        w.store(word(v), Ordering::Relaxed);
                    }
                }
                // Last, so a poller that sees it valid sees the rest (see `poll`).
                slot.words[OP_OWN_WORD].store(word(&b[OP_OWN_WORD * 8..]), Ordering::Release);
                // The entry a later push will write, hinted now: a write to a line that is
                // not in the cache waits for it (the ring's lines are the PU's own only
                // while it keeps them; a poller, or an idle core's lost caches, takes them).
                self.warm_entry(p.produced + WARM_CQES);
                p.produced += 1;
            }
            // Every completion written counts for WAIT (an only-waited-on CQ writes every
            // one, over the oldest). Counted after its entry (or the overrun) is published, so whoever sees the
            // count can poll what it counts; a poller that takes the entry may see the
            // count reach it a moment later.
            let total = self.produced.0.load(Ordering::Relaxed) + 1;
            // Before the store: a waiter on another PU may see it before this one returns.
            stamp(HandoffEvent::Completed);
            self.produced.0.store(total, Ordering::Release);
            p.notify.take()
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
    /// after the producer lock is released: see `add_waiter` for why a relaxed load sees
    /// every bit it must.
    #[inline(never)]
    fn wake(&self, notify: Option<CompChannel>, from: Option<(&PuSet, &usize)>) {
        if let Some(channel) = notify {
            channel.signal(self.cqn);
        }
        let mut m = self.waiters.load(Ordering::Relaxed);
        while m != 0 {
            let pu = m.trailing_zeros() as usize;
            match from {
                Some((set, &me)) => {
                    self.pus.notify_from(pu, set, me);
                }
                None => self.pus.notify(pu),
            }
            m &= m - 1;
        }
    }

    /// Take up to `max` completions. `Err` once if completions were lost to overrun.
    ///
    /// A poll that finds nothing takes no lock and writes nothing: it reads the consumer
    /// index and the next entry's owner byte, as a verbs consumer reads the next CQE.
    pub(crate) fn poll(&self, max: usize, out: &mut Vec<Completion>) -> Result<usize, ()> {
        if self.overrun.load(Ordering::Relaxed) && self.overrun.swap(false, Ordering::AcqRel) {
            return Err(());
        }
        if max == 0
            || !(self.lapped.0.load(Ordering::Relaxed)
                || self.holds(self.consumed.0.load(Ordering::Relaxed)))
        {
            return Ok(0);
        }
        // Room first, so the loop below never allocates while it holds the lock.
        out.reserve(max.min(idx(self.depth)));
        let _consumer = self.consumer.0.lock();
        let mut c = self.consumed.0.load(Ordering::Relaxed);
        // Only an only-waited-on CQ overwrites entries nobody took; this poller then takes
        // what is left, the last ring's worth (such a CQ writes an entry for every
        // completion, so its count is its producer index).
        let resync = |c: u64| c.max(self.produced().saturating_sub(self.depth));
        if self.lapped.0.swap(false, Ordering::Relaxed) {
            c = resync(c);
        }
        let mut n = 0;
        while n < max && self.holds(c) {
            let mut b = [0u8; CQE_SIZE];
            for (d, w) in b.chunks_exact_mut(8).zip(&self.slot(c).words) {
                d.copy_from_slice(&w.load(Ordering::Relaxed).to_ne_bytes());
            }
            let wr_id = word(&b[WR_ID_WORD * 8..]);
            if self.ignore_overrun && !self.holds(c) {
                // Overwritten while it was read (a pass later; a poller stalled for two
                // passes of an only-waited-on CQ may take a later entry for this one, as
                // polling such a CQ on hardware is undefined): start again from what is
                // left.
                c = resync(c);
                continue;
            }
            if let Some(cqe) = Cqe::decode(&b) {
                out.push(completion_of(cqe, wr_id));
                n += 1;
            }
            c += 1;
        }
        // Release: a producer that reads this index (acquire) reuses the entries after the
        // reads above.
        self.consumed.0.store(c, Ordering::Release);
        Ok(n)
    }

    /// True if the entry at index `at` has been written (its owner byte, read with acquire:
    /// the producer stores it last).
    #[inline]
    fn holds(&self, at: u64) -> bool {
        let w = self.slot(at).words[OP_OWN_WORD].load(Ordering::Acquire);
        entry_valid(w.to_ne_bytes()[OP_OWN % 8], at, self.depth)
    }

    /// Hint the entries of the next `n` completions into this core's caches
    /// ([`prefetch_line`]): a producer about to push a run of them (a doorbell chain's
    /// hand-over loop when it starts) has them in its cache when it writes them. Each push
    /// hints the entry [`WARM_CQES`] ahead of its own; this covers the first ones.
    #[inline(always)]
    pub(crate) fn warm_entries(&self, n: u64) {
        let at = self.produced.0.load(Ordering::Relaxed);
        for i in 0..n {
            self.warm_entry(at + i);
        }
    }

    /// Hint the entry of completion `at` ([`prefetch_line`]). Its address is computed as
    /// [`Self::slot`] computes it, without the bound check: a hint needs an address, and
    /// the mask keeps it inside the ring.
    #[inline(always)]
    fn warm_entry(&self, at: u64) {
        prefetch_line(self.cqes.as_ptr().wrapping_add(idx(at & (self.depth - 1))));
    }

    /// The ring slot of entry index `at` (depth is a power of two).
    #[inline(always)]
    fn slot(&self, at: u64) -> &CqeSlot {
        &self.cqes[idx(at & (self.depth - 1))]
    }
}

/// Eight bytes of an encoded CQE as the word they make in memory.
#[inline(always)]
fn word(b: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[..8]);
    u64::from_ne_bytes(w)
}

fn completion_of(cqe: Cqe, wr_id: u64) -> Completion {
    use crate::wqe::CqeOpcode::*;
    let status = if cqe.opcode.is_error() {
        Err(Syndrome::of_error_cqe(cqe.syndrome))
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

#[cfg(test)]
mod tests {
    use super::{AsyncEvent, AsyncEvents, CqShared, PuSet};
    use crate::nic::CqConfig;
    use crate::types::{Cqn, Qpn};
    use crate::wqe::{Cqe, CqeOpcode};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    fn cq(depth: u32, ignore_overrun: bool) -> CqShared {
        let cfg = if ignore_overrun {
            CqConfig::counted(depth)
        } else {
            CqConfig::new(depth)
        };
        CqShared::new(Cqn(1), cfg, Arc::new(PuSet::new(1)), Arc::default())
    }

    fn push(cq: &CqShared, i: u64) {
        let cqe = Cqe {
            opcode: CqeOpcode::Req,
            qpn: Qpn(7),
            send_opcode: 0,
            wqe_counter: crate::wqe::wqe_index(i),
            byte_cnt: u32::try_from(i).unwrap(),
            imm: 0,
            syndrome: 0,
            vendor_syndrome: 0,
            timestamp: 0,
            owner: false,
        };
        cq.push(cqe, i);
    }

    /// Push entries `ids` in order.
    fn push_all(cq: &CqShared, ids: std::ops::Range<u64>) {
        for i in ids {
            push(cq, i);
        }
    }

    fn poll(cq: &CqShared, max: usize) -> Result<Vec<u64>, ()> {
        let mut out = Vec::new();
        cq.poll(max, &mut out)?;
        for c in &out {
            // Each entry read back whole: its fields belong to the same completion.
            assert_eq!(u64::from(c.cqe.wqe_counter), c.wr_id & 0xffff);
            assert_eq!(u64::from(c.byte_len), c.wr_id);
        }
        Ok(out.iter().map(|c| c.wr_id).collect())
    }

    /// Two producers at once: the stamps never go back in the order the CQ holds its
    /// entries, lie between clock readings taken around the pushes, and an error CQE
    /// carries none (its syndrome is intact).
    #[test]
    fn timestamps_rise_in_ring_order_and_error_cqes_have_none() {
        let q = Arc::new(cq(2048, false));
        let before = super::completion_clock_ns();
        let producers: Vec<_> = (0..2u64)
            .map(|t| {
                let q = Arc::clone(&q);
                std::thread::spawn(move || push_all(&q, t * 500..t * 500 + 500))
            })
            .collect();
        for p in producers {
            p.join().unwrap();
        }
        let err = Cqe {
            opcode: CqeOpcode::ReqErr,
            qpn: Qpn(7),
            send_opcode: 0,
            wqe_counter: 0,
            byte_cnt: 0,
            imm: 0,
            syndrome: crate::wqe::Syndrome::RemoteAccess as u8,
            vendor_syndrome: 0x88,
            timestamp: 0,
            owner: false,
        };
        q.push(err, 9999);
        let after = super::completion_clock_ns();
        let mut out = Vec::new();
        q.poll(2048, &mut out).unwrap();
        assert_eq!(out.len(), 1001);
        let (ok, failed) = out.split_at(1000);
        let stamps: Vec<u64> = ok.iter().map(|c| c.cqe.timestamp).collect();
        assert!(stamps.windows(2).all(|w| w[0] <= w[1]), "stamps go back");
        assert!(stamps[0] >= before && stamps[999] <= after);
        assert_eq!(failed[0].cqe.timestamp, 0);
        // A counted CQ stamps nothing unless asked (its config says why).
        let counted = cq(4, true);
        push(&counted, 1);
        let mut unstamped = Vec::new();
        counted.poll(4, &mut unstamped).unwrap();
        assert_eq!(unstamped[0].cqe.timestamp, 0);
        assert_eq!(failed[0].vendor_err(), 0x88);
        assert_eq!(failed[0].status, Err(crate::wqe::Syndrome::RemoteAccess));
    }

    /// Entries come back in order over several passes of a small ring (the owner bit flips
    /// each pass), and a poll of an empty ring, new or drained, finds nothing.
    #[test]
    fn polls_in_order_across_passes() {
        let q = cq(4, false);
        assert_eq!(poll(&q, 8), Ok(vec![]));
        let mut next = 0;
        for round in 0..5u64 {
            for _ in 0..=round % 4 {
                push(&q, next);
                next += 1;
            }
            let want: Vec<u64> = (next - 1 - round % 4..next).collect();
            // Taken in two polls when there are several: the second goes on where the first
            // stopped.
            let mut got = poll(&q, 1).expect("no overrun");
            got.extend(poll(&q, 8).expect("no overrun"));
            assert_eq!(got, want, "round {round}");
            assert_eq!(poll(&q, 8), Ok(vec![]));
        }
        assert_eq!(q.produced(), next);
    }

    /// A ring that fills goes to error: it loses what does not fit and everything after,
    /// counts none of it, says so once, raises one event and keeps what it had.
    #[test]
    fn overrun_is_reported_once_and_keeps_the_entries() {
        let events = Arc::new(AsyncEvents::default());
        let q = CqShared::new(
            Cqn(1),
            CqConfig::new(4),
            Arc::new(PuSet::new(1)),
            Arc::clone(&events),
        );
        push_all(&q, 0..6);
        assert_eq!(q.produced(), 4, "the overrun and what follows do not count");
        assert_eq!(events.take(), Some(AsyncEvent::CqError(Cqn(1))));
        assert_eq!(poll(&q, 8), Err(()));
        assert_eq!(poll(&q, 8), Ok(vec![0, 1, 2, 3]));
        push(&q, 6);
        assert_eq!(poll(&q, 8), Ok(vec![]), "in error");
        assert_eq!(q.produced(), 4);
        assert_eq!(events.take(), None);
    }

    /// A CQ that is only waited on overwrites its oldest entries; a poll then takes the
    /// last ring's worth, in order.
    #[test]
    fn an_overwritten_ring_is_polled_from_what_is_left() {
        let q = cq(4, true);
        push_all(&q, 0..11);
        assert_eq!(poll(&q, 16), Ok(vec![7, 8, 9, 10]));
        assert_eq!(poll(&q, 16), Ok(vec![]));
        push(&q, 11);
        assert_eq!(poll(&q, 16), Ok(vec![11]));
    }

    /// Pushes into a ring that has lapped its poller overwrite without reading the consumer
    /// index; a poller that then takes part of what is left still gets the rest, and what
    /// comes after, with nothing skipped or repeated.
    #[test]
    fn a_lapped_ring_polled_in_parts_loses_nothing_after() {
        let q = cq(4, true);
        push_all(&q, 0..11);
        assert_eq!(poll(&q, 2), Ok(vec![7, 8]));
        push(&q, 11);
        assert_eq!(poll(&q, 16), Ok(vec![9, 10, 11]));
        push_all(&q, 12..15);
        assert_eq!(poll(&q, 16), Ok(vec![12, 13, 14]));
    }

    /// A producer and a poller on two threads, the producer never more than a ring ahead:
    /// every entry arrives once, whole and in order, across many passes, and whatever the
    /// count says was produced can be polled at once.
    ///
    /// How many: 200,000 entries (12,500 passes of the 16-entry ring) where that takes at
    /// most a second, else as many as a second gives, but 3,200 (200 passes) at least. Why
    /// not always 200,000: on a busy machine each hand-over between the two threads costs a
    /// scheduler slice, and 200,000 took over a minute beside two CPU hogs.
    #[test]
    fn a_concurrent_poller_sees_every_entry_in_order() {
        use std::time::{Duration, Instant};
        let (least, most) = if cfg!(miri) {
            (300, 300)
        } else {
            (3_200, 200_000)
        };
        let budget = Duration::from_secs(1);
        // Each side waits for the other: neither waits past this (minutes under Miri).
        let deadline = Instant::now() + Duration::from_secs(if cfg!(miri) { 3600 } else { 30 });
        let q = Arc::new(cq(16, false));
        let taken = Arc::new(AtomicU64::new(0));
        // How many the producer pushed, once it has stopped.
        let total = Arc::new(AtomicU64::new(u64::MAX));
        let producer = {
            let (q, taken, total) = (Arc::clone(&q), Arc::clone(&taken), Arc::clone(&total));
            std::thread::spawn(move || {
                let start = Instant::now();
                let mut i = 0;
                while i < most && (i < least || start.elapsed() < budget) {
                    while i - taken.load(Ordering::Acquire) >= 16 {
                        assert!(Instant::now() < deadline, "the poller stopped");
                        std::thread::yield_now();
                    }
                    push(&q, i);
                    i += 1;
                }
                total.store(i, Ordering::Release);
            })
        };
        let mut next = 0;
        while next != total.load(Ordering::Acquire) {
            assert!(Instant::now() < deadline, "the producer stopped at {next}");
            let counted = q.produced();
            let got = poll(&q, 16).expect("never more than a ring ahead");
            assert!(
                next + got.len() as u64 >= counted,
                "the count said {counted}, but only {} were there to poll",
                next + got.len() as u64
            );
            for id in got {
                assert_eq!(id, next);
                next += 1;
            }
            taken.store(next, Ordering::Release);
            std::thread::yield_now();
        }
        producer.join().expect("producer");
        assert!(next >= least, "{next} entries");
        assert_eq!(q.produced(), next);
    }

    /// An error CQE whose syndrome byte `mlx5dv.h` does not define completes with
    /// `IBV_WC_GENERAL_ERR`, as rdma-core's `mlx5_handle_error_cqe` reports it (its default
    /// case); a defined byte keeps its own status. Either way the CQE keeps the byte and
    /// the vendor syndrome.
    #[test]
    fn an_unknown_syndrome_completes_as_a_general_error() {
        use crate::wqe::{Syndrome, CQE_SIZE};
        let q = cq(4, false);
        let cases = [
            (0x13, Syndrome::RemoteAccess),
            (0x22, Syndrome::RemoteAborted),
            (0x30, Syndrome::General),
            (0x00, Syndrome::General),
        ];
        for (i, (byte, want)) in (0u64..).zip(cases) {
            // An mlx5_err_cqe as a NIC writes it: vendor syndrome at byte 54, syndrome at
            // 55, QPN at 56..60, REQ_ERR (0xd) in the high nibble of byte 63.
            let mut b = [0u8; CQE_SIZE];
            b[54] = 0x5a;
            b[55] = byte;
            b[59] = 7;
            b[63] = 0xd0;
            q.push(Cqe::decode(&b).expect("an error CQE"), i);
            let mut out = Vec::new();
            assert_eq!(q.poll(4, &mut out), Ok(1));
            assert_eq!(out[0].status, Err(want), "syndrome {byte:#04x}");
            assert_eq!(out[0].cqe.syndrome, byte);
            assert_eq!(out[0].vendor_err(), 0x5a);
            assert_eq!(out[0].qpn, Qpn(7));
        }
    }
}
