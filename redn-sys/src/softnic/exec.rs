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

use super::config::Prefetch;
use super::cq::CqShared;
use super::in_process::InProcess;
use super::qp::{bump, QpShared, Ring};
use super::rate::Limiter;
use super::shared::Shared;
use super::transport::{AtomicOp, Nak, Transport};
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

/// Reads WQEs out of the send ring into prefetch snapshots: the ring's words, where its slot 0
/// starts, the snapshots and how far fetching has got. Kept apart from the rest of
/// [`Core`] so the fast path can hold it while it calls the executor's other methods.
struct Fetcher {
    ring: Arc<SharedBuffer>,
    /// Snapshots by ring slot (slot modulo `snap.len()` for rings longer than
    /// [`SNAPSHOT_SLOTS`]).
    snap: Snaps,
    geo: Geometry,
    /// BBs below this have been fetched into `snap`.
    fetched: u64,
    /// The peer when it is in this process, for the fast path to reach without a dynamic
    /// call. Kept here, beside the snapshots, so the fast path can hold it while it calls
    /// the `Core`'s methods.
    direct: Option<Arc<InProcess>>,
}

/// Where the ring's slots and their snapshots are, and how far to prefetch: fixed for the
/// queue's life, copied into registers by the loops that fetch.
#[derive(Clone, Copy)]
struct Geometry {
    /// Word index of slot 0 in the ring's buffer; a slot is one BB (8 words).
    base: usize,
    /// Words the ring occupies (8 per entry).
    ring_words: usize,
    /// Ring entries - 1 (entries are at most `SoftNic::MAX_SQ_BBS`, so this fits 32 bits).
    ring_mask: u32,
    /// How many BBs past the current WQE may be fetched early.
    depth: u64,
    /// Fetched before a one-BB WQE runs: 1 + `depth`, but never so far that two BBs in flight
    /// share a snapshot (possible only with a prefetch as deep as the ring).
    reach: u64,
    /// The bits of a BB's first word that decide what it does: all but the WQE index, unless
    /// WQE checks are on. A fetch that finds only the index changed (a host re-posting the
    /// same request) keeps what was derived from the snapshot.
    decisive0: u64,
}

impl Geometry {
    /// The ring's own words in `words`, its buffer's (sliced once per run, so that finding a
    /// slot in it is a mask, a shift and one bound check).
    #[inline(always)]
    fn ring<'w>(&self, words: &'w [AtomicU64]) -> &'w [AtomicU64] {
        &words[self.base..self.base + self.ring_words]
    }

    /// Ring slot `index` (absolute) in `ring`, from [`Geometry::ring`].
    #[inline(always)]
    fn slot<'w>(&self, ring: &'w [AtomicU64], index: u64) -> &'w [AtomicU64; 8] {
        let at = self.slot_word(index);
        ring[at..at + 8].try_into().expect("eight words")
    }

    /// Where in the ring's words slot `index` (absolute) starts. Masked in 32 bits: the
    /// offset cannot overflow, so [`Geometry::slot`] checks only the end.
    #[inline(always)]
    fn slot_word(&self, index: u64) -> usize {
        (low32(index) & self.ring_mask) as usize * 8
    }
}

/// Most snapshots a queue keeps (128 bytes each): rings up to this many BBs have one per slot.
/// At least the deepest prefetch plus the largest WQE, so BBs fetched and not yet run never
/// share a snapshot.
const SNAPSHOT_SLOTS: u64 = 16 << 10;
const _: () = assert!(SNAPSHOT_SLOTS >= Prefetch::MAX_DEPTH + crate::wqe::MAX_WQE_BBS as u64);

/// One ring slot as the executor last fetched it: the BB's bytes, which are what runs however
/// the ring changes after the fetch (the prefetch model), and, once the fast path has run them
/// as a one-BB RDMA WRITE or READ, where its two windows turned out to be.
///
/// Why keep the latter: RedN's loops, recycled rings and hosts re-posting a request run the
/// same bytes from the same slot again and again, and decoding them and checking keys, PD,
/// bounds and rights is most of a WRITE's cost. A resolved move is kept only while the
/// bytes stay the same (a fetch into a snapshot something was derived from compares; any
/// difference but the WQE index drops it), neither key cache has dropped or replaced a
/// region since (their epochs) and the target is live; a region's PD, bounds and rights
/// cannot change while it stays registered, so the checks would decide exactly as they did.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Snapshot {
    bytes: [u8; BB_SIZE],
    /// `KeyCache::current_epoch` of each side when resolved (0 if nothing was: a NOP, or
    /// never; never `KeyCache::STALE`).
    local_epoch: u64,
    remote_epoch: u64,
    /// Index of each side's region in its key cache.
    local_region: u32,
    remote_region: u32,
    /// Byte offset of each window in its region's buffer.
    local_off: usize,
    remote_off: usize,
    len: usize,
    /// The move is one 8-byte-aligned 64-byte line on both sides (`SharedBuffer::copy_line`).
    line: bool,
}

impl Snapshot {
    /// The buffers of the move resolved in this snapshot: its regions' entries in the two
    /// key caches (there while the epochs the caller checked hold).
    #[inline(always)]
    fn move_buffers<'k>(
        &self,
        local: &'k KeyCache,
        remote: &'k KeyCache,
    ) -> Option<(&'k SharedBuffer, &'k SharedBuffer)> {
        let l = local.region_at(self.local_region as usize)?;
        let r = remote.region_at(self.remote_region as usize)?;
        Some((l.buffer(), r.buffer()))
    }

    /// Run the move resolved in this snapshot between buffers `l` (local) and `r` (remote),
    /// from [`Snapshot::move_buffers`]: as one line if it is one.
    #[inline(always)]
    fn replay_move(&self, l: &SharedBuffer, r: &SharedBuffer, write: bool) {
        if self.line {
            let (lw, rw) = (self.local_off / 8, self.remote_off / 8);
            if write {
                r.copy_line(rw, l, lw);
            } else {
                l.copy_line(lw, r, rw);
            }
        } else {
            let local = Span {
                buffer: l,
                off: self.local_off,
                len: self.len,
            };
            let far = Span {
                buffer: r,
                off: self.remote_off,
                len: self.len,
            };
            if write {
                far.copy_from(&local);
            } else {
                local.copy_from(&far);
            }
        }
    }

    const EMPTY: Snapshot = Snapshot {
        bytes: [0; BB_SIZE],
        local_epoch: 0,
        remote_epoch: 0,
        local_region: 0,
        remote_region: 0,
        local_off: 0,
        remote_off: 0,
        len: 0,
        line: false,
    };
}

/// A queue's snapshots, and beside them a byte of flags for each: what a fetch looks at
/// before it copies a BB, in an array of its own (64 slots a cache line) rather than in the
/// snapshot's second line, which a doorbell step's three fetches then each touched for one
/// byte (measured: 1-2 ns off a doorbell step in interleaved runs of `softnic_bench
/// --detect flag`, with ~11 more instructions; a build that skipped the look altogether,
/// unsound, took 5-10 ns off).
struct Snaps {
    slots: Box<[Snapshot]>,
    /// Per slot: [`DERIVED`] if something was derived from its bytes (a resolved move, or a
    /// hot kind), so a fetch must compare before it overwrites them (the move's fields are
    /// valid while this and the epochs hold); and, shifted by [`HOT_SHIFT`], `HOT_NOP`,
    /// `HOT_WRITE` or `HOT_READ` once the fast path has run the bytes as an unsignaled NOP,
    /// or as an unsignaled WRITE or READ it resolved, with WQE checks off: then [`run_hot`]
    /// may run them again (a move only while its epochs hold).
    flags: Box<[u8]>,
}

/// See [`Snaps::flags`].
const DERIVED: u8 = 1;
const HOT_SHIFT: u32 = 1;

/// A slot's flags once something was derived from its bytes, of hot kind `hot`.
#[inline(always)]
fn derived_flags(hot: u8) -> u8 {
    hot << HOT_SHIFT | DERIVED
}

impl Snaps {
    fn new(n: usize) -> Snaps {
        Snaps {
            slots: vec![Snapshot::EMPTY; n].into_boxed_slice(),
            flags: vec![0; n].into_boxed_slice(),
        }
    }

    #[inline(always)]
    fn len(&self) -> usize {
        self.slots.len()
    }

    /// Something was derived from slot `i`'s bytes.
    #[inline(always)]
    fn derived(&self, i: usize) -> bool {
        self.flags[i] & DERIVED != 0
    }

    /// Slot `i`'s hot kind (`HOT_NONE` if none).
    #[inline(always)]
    fn hot(&self, i: usize) -> u8 {
        self.flags[i] >> HOT_SHIFT
    }

    /// Mark slot `i` derived, of hot kind `hot`.
    #[inline(always)]
    fn set_derived(&mut self, i: usize, hot: u8) {
        self.flags[i] = derived_flags(hot);
    }

    /// Slot `i`'s snapshot and its flags, borrowed together.
    #[inline(always)]
    fn parts(&mut self, i: usize) -> (&mut Snapshot, &mut u8) {
        (&mut self.slots[i], &mut self.flags[i])
    }
}

impl std::ops::Index<usize> for Snaps {
    type Output = Snapshot;

    #[inline(always)]
    fn index(&self, i: usize) -> &Snapshot {
        &self.slots[i]
    }
}

impl std::ops::IndexMut<usize> for Snaps {
    #[inline(always)]
    fn index_mut(&mut self, i: usize) -> &mut Snapshot {
        &mut self.slots[i]
    }
}

impl Fetcher {
    fn new(ring: &Ring, depth: u64, wqe_checks: bool) -> Fetcher {
        // `SoftNic::alloc_ring` places send rings on a BB boundary inside their buffer, with
        // one BB per slot; fetching relies on both.
        debug_assert!(ring.stride == BB_SIZE && ring.offset % BB_SIZE == 0);
        let cap = ring.entries.min(SNAPSHOT_SLOTS);
        let mut index = [0u8; 8];
        index[off::WQE_INDEX..off::WQE_INDEX + 2].fill(0xff);
        Fetcher {
            ring: Arc::clone(&ring.buffer),
            snap: Snaps::new(cap as usize),
            geo: Geometry {
                base: ring.offset / 8,
                ring_words: idx(ring.entries) * 8,
                ring_mask: u32::try_from(ring.entries - 1).expect("ring entries fit 32 bits"),
                depth,
                reach: 1 + depth.min(cap - 1),
                decisive0: if wqe_checks {
                    !0
                } else {
                    !u64::from_ne_bytes(index)
                },
            },
            fetched: 0,
            direct: None,
        }
    }

    #[inline(always)]
    fn fetch(&mut self, index: u64) {
        fetch_into(
            self.geo.ring(self.ring.words()),
            self.geo,
            &mut self.snap,
            index,
        );
    }

    /// Fetch the BB at `ci` if it is not yet.
    #[inline(always)]
    fn fetch_current(&mut self, ci: u64) {
        if self.fetched <= ci {
            self.fetch(ci);
            self.fetched = ci + 1;
        }
    }

    /// Fetch through `end` and prefetch up to `depth` BBs past it, not past `limit` and not
    /// so far that two BBs in flight share a snapshot (possible only with a prefetch as
    /// deep as the ring).
    #[inline(always)]
    fn fetch_ahead(&mut self, ci: u64, end: u64, limit: u64) {
        let ahead = (end + self.geo.depth)
            .min(limit)
            .min(ci + self.snap.len() as u64)
            .max(end);
        while self.fetched < ahead {
            self.fetch(self.fetched);
            self.fetched += 1;
        }
    }

    #[inline(always)]
    fn block(&self, index: u64) -> &[u8; BB_SIZE] {
        &self.snap[idx(index) & (self.snap.len() - 1)].bytes
    }
}

/// Snapshot slot `index` of `ring` (the ring's words, [`Geometry::ring`]) into its place in
/// `snap`: eight atomic loads (the host and RDMA operations may write the ring meanwhile),
/// eight stores. If something was derived from the old snapshot, each word is also compared
/// with it, and what was derived is dropped if they differ in more than `decisive0` masks.
#[inline(always)]
fn fetch_into(ring: &[AtomicU64], geo: Geometry, snap: &mut Snaps, index: u64) {
    let src = geo.slot(ring, index);
    let at = idx(index) & (snap.len() - 1);
    let (dst, flags) = snap.parts(at);
    if *flags & DERIVED == 0 {
        // Nothing was derived from the old bytes: a plain copy.
        for (d, w) in dst.bytes.chunks_exact_mut(8).zip(src) {
            d.copy_from_slice(&w.load(Ordering::Relaxed).to_ne_bytes());
        }
        return;
    }
    // Word by word: load, compare with the old snapshot, store (the new bytes are kept even
    // when only masked bits changed, so the snapshot is always what was fetched).
    let mut diff = 0;
    for (i, (d, w)) in dst.bytes.chunks_exact_mut(8).zip(src).enumerate() {
        let d: &mut [u8; 8] = d.try_into().expect("eight bytes");
        let now = w.load(Ordering::Relaxed);
        let x = now ^ u64::from_ne_bytes(*d);
        diff |= if i == 0 { x & geo.decisive0 } else { x };
        *d = now.to_ne_bytes();
    }
    if diff != 0 {
        *flags = 0;
    }
}

/// Ask the CPU to bring a ring slot's cache line closer (a hint: nothing is read, so what
/// runs is unchanged, and a slot past the doorbell or enabled index may be hinted). Why: a
/// chain's ring lines were just written by the host or another PU, on another core, and a
/// doorbell step reads three of them; hinted a few steps ahead, the transfer overlaps the
/// steps before instead of stalling the one that needs it.
///
/// Slot `index` of `ring` ([`Geometry::ring`]) is found as [`Geometry::slot`] finds it, but
/// without its bound check: a hint needs an address, not a reference, and one that was out
/// of bounds would still be harmless (it cannot be: the mask keeps it inside the ring).
#[inline(always)]
fn warm(ring: &[AtomicU64], geo: &Geometry, index: u64) {
    let line = ring.as_ptr().wrapping_add(geo.slot_word(index));
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: PREFETCHT0 is only a cache hint: it cannot fault, whatever the address, and
    // reads nothing the program sees.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(line.cast())
    };
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    let _ = line;
}

/// How many BBs ahead a doorbell step hints the master's ring (see [`warm`]), and the
/// enabled queue's.
const WARM_MASTER: u64 = 16;
const WARM_ENABLED: u64 = 8;

/// The fast path's fetch of the WQE at `ci`: the BB there if it is not fetched yet, then
/// prefetched up to `geo.reach` past it but not past `limit`, exactly as
/// `Fetcher::fetch_ahead` does for `step`. Returns the BB's snapshot slot, or None if the
/// WQE there takes more than one BB (left to `step`, having fetched only its first BB).
#[inline(always)]
fn fetch_one_bb(
    words: &[AtomicU64],
    geo: &Geometry,
    snap: &mut Snaps,
    fetched: &mut u64,
    ci: u64,
    limit: u64,
) -> Option<usize> {
    let slot = fetch_at(words, geo, snap, fetched, ci);
    if usize::from(snap[slot].bytes[off::DS] & MAX_DS) * SEG_SIZE > BB_SIZE {
        return None;
    }
    prefetch_behind(words, geo, snap, fetched, ci, limit);
    Some(slot)
}

/// [`fetch_one_bb`]'s first half: fetch the BB at `ci` if it is not yet, and return its
/// snapshot slot.
#[inline(always)]
fn fetch_at(
    words: &[AtomicU64],
    geo: &Geometry,
    snap: &mut Snaps,
    fetched: &mut u64,
    ci: u64,
) -> usize {
    if *fetched <= ci {
        fetch_into(words, *geo, snap, ci);
        *fetched = ci + 1;
    }
    idx(ci) & (snap.len() - 1)
}

/// [`fetch_one_bb`]'s second half, once the WQE at `ci` is known to be one BB: prefetch up
/// to `geo.reach` past it, not past `limit`.
#[inline(always)]
fn prefetch_behind(
    words: &[AtomicU64],
    geo: &Geometry,
    snap: &mut Snaps,
    fetched: &mut u64,
    ci: u64,
    limit: u64,
) {
    let ahead = (ci + geo.reach).min(limit);
    while *fetched < ahead {
        fetch_into(words, *geo, snap, *fetched);
        *fetched += 1;
    }
}

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
fn fetch_signaled_nop(
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

/// Count and complete the signaled one-BB NOP at `ci` of queue `qp`, fetched by
/// [`fetch_signaled_nop`]. Inline (not `Core::complete`): this is a doorbell step's one
/// completion.
#[inline(always)]
fn run_signaled_nop(qp: &QpShared, ci: u64) {
    qp.count_wqes(OP_NOP, 1);
    qp.retire(ci, ci + 1, CqeOpcode::Req, OP_NOP, 0, 0);
}

/// Prefetch slot `index` for [`run_hot`]: if its snapshot is hot and the ring still holds the
/// same WQE, keep the snapshot as it is; otherwise fetch it as [`fetch_into`] does. The same
/// WQE means the same bytes (but the index, as `decisive0` says) in the words its segments
/// occupy: two for a NOP (its segments, if any, do nothing), six for a WRITE or READ (three
/// segments); ConnectX reads a WQE's `ds` segments, nothing past them, so bytes past them
/// cannot change what runs.
#[inline(always)]
fn prefetch_hot(ring: &[AtomicU64], geo: Geometry, snap: &mut Snaps, index: u64) {
    let src = geo.slot(ring, index);
    let at = idx(index) & (snap.len() - 1);
    let dst = &snap[at];
    let same = match snap.hot(at) {
        HOT_NOP => same_words::<2>(src, &dst.bytes, geo.decisive0),
        HOT_WRITE | HOT_READ => same_words::<6>(src, &dst.bytes, geo.decisive0),
        _ => false,
    };
    if !same {
        fetch_into(ring, geo, snap, index);
    }
}

/// True if the first `N` words of `ring` hold `bytes` (word 0 compared under `decisive0`).
#[inline(always)]
fn same_words<const N: usize>(
    ring: &[AtomicU64; 8],
    bytes: &[u8; BB_SIZE],
    decisive0: u64,
) -> bool {
    let mut diff = 0;
    for i in 0..N {
        let old = u64::from_ne_bytes(bytes[i * 8..i * 8 + 8].try_into().expect("eight bytes"));
        let x = ring[i].load(Ordering::Relaxed) ^ old;
        diff |= if i == 0 { x & decisive0 } else { x };
    }
    diff == 0
}

const HOT_NONE: u8 = 0;
const HOT_NOP: u8 = 1;
const HOT_WRITE: u8 = 2;
const HOT_READ: u8 = 3;

/// Run the hot BBs (see [`Snaps::flags`]) from `ci` on, up to `end`: fetching and
/// prefetching as the fast path does, and stopping at the first BB that is not hot or whose
/// resolved windows no longer hold (a key cache moved on, the target went down). Returns the
/// next index and the counts of NOPs, WRITEs, READs and payload bytes that ran.
///
/// Why a function of its own: this is the loop a recycled ring or a re-posted request spends
/// its time in, and kept small, the compiler keeps most of its state in registers (inside the
/// fast path's loop it spilled most of it: ~230 instructions a resolved WRITE there, ~150
/// here).
#[allow(clippy::too_many_arguments)]
#[inline(never)]
fn run_hot(
    words: &[AtomicU64],
    geo: Geometry,
    snap: &mut Snaps,
    fetched: &mut u64,
    peer: &InProcess,
    keys: (&KeyCache, &KeyTable, &KeyCache),
    mut ci: u64,
    end: u64,
    limit: u64,
) -> (u64, [u64; 4]) {
    let (local, table, remote) = keys;
    let mut n = [0u64; 4];
    // What a resolved move's epochs must be now; each move re-checks that no region has been
    // deregistered since and that the target is still live.
    let (local_epoch, remote_epoch) = (local.current_epoch(table), peer.live_epoch(remote));
    // Fetched before a BB runs: through it and up to `depth` past it, not past `limit` (as
    // `Fetcher::fetch_ahead`). Caught up here (`end` <= `limit`, so at least through `ci`);
    // after that, each BB run lets one more in.
    let reach = geo.reach;
    let mut at = *fetched;
    while at < (ci + reach).min(limit) {
        prefetch_hot(words, geo, snap, at);
        at += 1;
    }
    while ci < end {
        if at < limit && at < ci + reach {
            prefetch_hot(words, geo, snap, at);
            at += 1;
        }
        let slot = idx(ci) & (snap.len() - 1);
        let (e, hot) = (&snap[slot], snap.hot(slot));
        match hot {
            HOT_NOP => n[0] += 1,
            HOT_WRITE | HOT_READ => {
                if e.local_epoch != local_epoch
                    || e.remote_epoch != remote_epoch
                    || !local.is_current(table)
                    || !peer.still_current(remote)
                {
                    break;
                }
                let Some((l, r)) = e.move_buffers(local, remote) else {
                    break;
                };
                // Each direction with its own call and count, so neither is a select.
                if hot == HOT_WRITE {
                    e.replay_move(l, r, true);
                    n[1] += 1;
                } else {
                    e.replay_move(l, r, false);
                    n[2] += 1;
                }
                n[3] += e.len as u64;
            }
            _ => break,
        }
        ci += 1;
    }
    *fetched = at;
    (ci, n)
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

/// Small caches of the queues and CQs that WAIT / SEND_EN / RECV_EN name, invalidated when
/// the NIC's object generation moves. Numbers are kept beside the objects so a hit compares
/// plain integers without following pointers.
#[derive(Default)]
struct ObjCache {
    generation: u64,
    qps: Vec<(u32, Arc<QpShared>)>,
    cqs: Vec<(u32, Arc<CqShared>)>,
}

/// Entries each of [`ObjCache`]'s lists keeps (programs name few queues and CQs).
const OBJ_CACHE_SIZE: usize = 8;

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
        let (_, qp) = find_or_remember(&mut self.qps, qpn.0, || nic.qp(qpn).ok())?;
        Some(qp)
    }

    /// The CQ numbered `cqn`, and its index in the cache (see [`ObjCache::cq_at`]).
    #[inline(always)]
    fn cq(&mut self, nic: &Shared, cqn: Cqn) -> Option<(usize, &Arc<CqShared>)> {
        self.sync(nic);
        find_or_remember(&mut self.cqs, cqn.0, || nic.cq(cqn).ok())
    }

    /// The CQ at index `i` if it is still `cqn` and no object has been destroyed since the
    /// cache last synced (cheaper than [`ObjCache::cq`]: no search).
    #[inline(always)]
    fn cq_at(&self, nic: &Shared, i: usize, cqn: Cqn) -> Option<&CqShared> {
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
fn find_or_remember<T>(
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
fn remember<T>(list: &mut Vec<(u32, Arc<T>)>, n: u32, obj: Arc<T>) -> usize {
    if list.len() >= OBJ_CACHE_SIZE {
        list.remove(0);
    }
    list.push((n, obj));
    list.len() - 1
}

pub(crate) struct SqExec {
    core: Core,
    fetcher: Fetcher,
    /// The last visit did nothing.
    quiet: bool,
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
        let outcome = self.core.run(&mut self.fetcher, budget, siblings);
        self.core.land_at_visit_end();
        self.quiet = matches!(outcome, RunOutcome::Idle);
        outcome
    }

    /// Run up to `budget` WQEs of a queue another on its PU hands over to (see
    /// [`Siblings`]): straight into the executor's lean visit, without the quiet check (the
    /// queue was just enabled, so that would only find that it has work).
    #[inline(always)]
    fn run_handed_over(&mut self, budget: usize) -> RunOutcome {
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
    fn run_enabled_nop(
        &mut self,
        qp: &QpShared,
        words: &[AtomicU64],
        geo: &Geometry,
        limit: u64,
    ) -> bool {
        let c = &mut self.core;
        let ci = c.ci;
        debug_assert!(std::ptr::eq(qp, &*c.qp));
        debug_assert!(qp.managed_send && limit <= c.limit() && c.plain_config());
        if ci >= limit || qp.state() != QpState::ReadyToSend {
            return false;
        }
        warm(words, geo, ci + WARM_ENABLED);
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

    /// Run what a queue on this PU was just enabled for, in a doorbell-ordered chain's step
    /// (see [`Core::run_doorbell_steps`]): its one-BB NOPs here, in a loop that does only
    /// that, and whatever else through the handed-over visit. Why: such a step runs one
    /// WQE of this queue, and the handed-over visit's set-up (checks, the fast path's loop
    /// state, its tear-down) was most of a step's cost. The NOPs run as the fast path runs
    /// them: fetched and prefetched alike, counted, completed if signaled, marked hot if not.
    #[inline(always)]
    fn run_enabled(&mut self) {
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
            c.qp.count_wqes(OP_NOP, 1);
            if signaled(&e.bytes) {
                // Inline (not `complete`): this is the one completion of a doorbell step.
                c.qp.retire(ci, ci + 1, CqeOpcode::Req, OP_NOP, 0, 0);
            } else if snap.hot(slot) == HOT_NONE {
                snap.set_derived(slot, HOT_NOP);
            }
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

    pub(crate) fn qpn(&self) -> Qpn {
        self.core.qp.qpn
    }
}

/// WQEs a queue runs when another on its PU hands over to it (see [`Siblings`]).
const HANDOFF_BUDGET: usize = 64;

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
    fn find(&self, qpn: Qpn, hint: usize) -> Option<usize> {
        match self.queues.get(hint) {
            Some(Some(q)) if q.qpn() == qpn => Some(hint),
            _ => self
                .queues
                .iter()
                .position(|q| q.as_ref().is_some_and(|q| q.qpn() == qpn)),
        }
    }
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
            objs: ObjCache::default(),
            limiter: Limiter::default(),
            rate_generation: 0,
            stalled_at: u64::MAX,
            parked: None,
            enabled_here: None,
            handoff_hint: 0,
            delayed_at: u64::MAX,
            scratch: Vec::new(),
            wqe: [0u8; MAX_WQE_BYTES],
            wqe_checks,
            late_landing,
            late: Vec::new(),
            fast_paths,
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
            && !self.limiter.is_active()
            && self.qp.rate_generation.load(Ordering::Acquire) == self.rate_generation
    }

    /// True if a visit has nothing to do: nothing posted (or enabled) past what has run and
    /// no error to flush, or parked on a WAIT still short of its count. Most of a manager's
    /// queues, most of the time: checked in a small function of its own, before the
    /// executor's set-up (`run` is out of line).
    #[inline(always)]
    fn nothing_to_do(&mut self) -> bool {
        let state = self.qp.state();
        (self.ci >= self.limit() && state != QpState::Error) || self.still_parked(state)
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
            return RunOutcome::Idle;
        }
        self.refresh(f);
        // A rate-limited queue takes the general path, which admits each WQE; so does every
        // queue with the fast paths off.
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
            f.direct = self
                .peer
                .clone()
                .and_then(|p| p.into_any().downcast::<InProcess>().ok());
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

    /// The rest of a visit that has run `done` WQEs: WQE by WQE through [`Self::step`] (multi-BB
    /// WQEs, and every WQE of a rate-limited queue, which `step` admits one by one), and
    /// through the fast path again between them.
    #[inline(never)]
    fn run_general(
        &mut self,
        f: &mut Fetcher,
        budget: usize,
        mut done: usize,
        mut siblings: Option<&mut Siblings>,
    ) -> RunOutcome {
        let mut limit = self.limit();
        let mut outcome = RunOutcome::Idle;
        let fast = self.fast_paths && !self.limiter.is_active();
        while done < budget {
            if self.ci >= limit {
                limit = self.limit();
                if self.ci >= limit {
                    break;
                }
            }
            match self.step(f, limit) {
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
                    self.fault(f, syndrome, bbs);
                    done += 1;
                    break;
                }
            }
            if fast && done < budget && self.ci < limit {
                let (n, blocked) =
                    self.run_fast::<false>(f, limit, budget - done, siblings.as_deref_mut());
                done += n;
                if blocked {
                    break;
                }
            }
        }
        self.ran(done, outcome)
    }

    /// True if the control segment names this queue and this index (the check ConnectX makes
    /// unless told otherwise; RedN's chains need it off, see `SoftNicConfig::wqe_checks`).
    #[inline]
    fn wqe_is_ours(&self, w: &[u8], ci: u64) -> bool {
        Be32::read(w, off::QPN).get() >> 8 == self.qp.qpn.0
            && Be16::read(w, off::WQE_INDEX).get() == wqe_index(ci)
    }

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
    fn run_fast<const LEAN: bool>(
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
                        self.qp.count_wqes(OP_NOP, 1);
                        if signaled {
                            self.complete(ci, 1, opcode, 0);
                        } else if snap.hot(slot) != HOT_NONE {
                            hot_next = true;
                        } else if !wqe_checks {
                            snap.set_derived(slot, HOT_NOP);
                        }
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
                                let (f, at) = (&mut fetched, (ci, end, limit));
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
    fn fast_move(
        &mut self,
        peer: &InProcess,
        e: &mut Snapshot,
        flags: &mut u8,
        write: bool,
        signaled: bool,
    ) -> Option<u64> {
        let keys = &self.nic.keys;
        if *flags & DERIVED != 0
            && e.local_epoch == self.local_keys.current_epoch(keys)
            && e.remote_epoch == peer.live_epoch(&self.remote_keys)
        {
            if let Some((l, r)) = e.move_buffers(&self.local_keys, &self.remote_keys) {
                e.replay_move(l, r, write);
                self.count_move(write, e.len as u64);
                return Some(e.len as u64);
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
        let remote = remote_of(w);
        let (local_need, remote_need) = if write {
            (Access::NONE, Access::REMOTE_WRITE)
        } else {
            (Access::LOCAL_WRITE, Access::REMOTE_READ)
        };
        let local_region = self.local_keys.find(keys, lkey).ok()?;
        let local = self
            .local_keys
            .region_at(local_region)?
            .window(self.qp.pd, addr, len, local_need)?;
        let (remote_region, far) =
            peer.remote_window(&mut self.remote_keys, remote, len, remote_need)?;
        if write {
            far.copy_from(&local);
        } else {
            local.copy_from(&far);
        }
        let (local_off, remote_off) = (local.off, far.off);
        let local_epoch = self.local_keys.current_epoch(keys);
        let remote_epoch = peer.live_epoch(&self.remote_keys);
        // Resolved under caches that were current: keep it for next time.
        if local_epoch != KeyCache::STALE && remote_epoch != KeyCache::STALE {
            let hot = match (signaled || self.wqe_checks, write) {
                (true, _) => HOT_NONE,
                (false, true) => HOT_WRITE,
                (false, false) => HOT_READ,
            };
            *flags = derived_flags(hot);
            *e = Snapshot {
                bytes: e.bytes,
                local_epoch,
                remote_epoch,
                // Entries of key caches, which hold 8.
                local_region: small32(local_region),
                remote_region: small32(remote_region),
                local_off,
                remote_off,
                len: idx(len),
                line: len == 64 && (local_off | remote_off) % 8 == 0,
            };
        }
        self.count_move(write, len);
        Some(len)
    }

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
    /// they are on one softnic), a constant so that a step does not look at it. `at`: the
    /// fast path's `ci`, `end` and `limit`.
    ///
    /// Only a reconfiguration by the host (a rate set, WQE checks are fixed) changes whether
    /// the enabled queue may run plain ([`Core::plain_config`]): that is looked at when the
    /// loop starts and after the enabled queue ran anything but its step's NOP, so a rate
    /// set meanwhile applies from the master's next visit: at most 128 steps later, as a
    /// visit runs at most 256 of the master's WQEs (`tests/rate_limit.rs`). The enabled
    /// queue's state (an error to flush) and whether it was destroyed are looked at every
    /// step, as the fast path does.
    #[inline(never)]
    fn run_doorbell_steps<const CHECKS: bool>(
        &mut self,
        siblings: &mut Siblings,
        words: &[AtomicU64],
        geo: &Geometry,
        snap: &mut Snaps,
        fetched: &mut u64,
        at: (u64, u64, u64),
    ) -> Option<u64> {
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
            warm(words, geo, ci + WARM_MASTER);
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
    fn count_controls(&self, start: u64, counted: &mut u64, to: u64) {
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
    fn next_control<const CHECKS: bool>(
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

    /// The fast path's one-BB atomic to an in-process peer, counted; None if `execute` must
    /// run it (nothing was asked of the peer), `Some(Err)` with the syndrome of the
    /// responder's refusal.
    #[inline(never)]
    fn fast_atomic(
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

    /// The fast path's WAIT, SEND_EN or RECV_EN at `ci`, counted if it ran.
    #[inline(always)]
    fn fast_control(&mut self, w: &[u8; BB_SIZE], ci: u64) -> Control {
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

    /// Count what `run_hot` ran: NOPs, WRITEs, READs and payload bytes.
    #[inline]
    fn add_fast_counts(&mut self, n: [u64; 4]) {
        for (op, n) in [OP_NOP, OP_WRITE, OP_READ].into_iter().zip(n) {
            if n != 0 {
                self.qp.count_wqes(op, n);
            }
        }
        if n[3] != 0 {
            bump(&self.qp.counters.bytes, n[3]);
        }
    }

    /// Count a WRITE (`write`) or READ of `len` bytes.
    #[inline(always)]
    fn count_move(&mut self, write: bool, len: u64) {
        self.qp
            .count_wqes(if write { OP_WRITE } else { OP_READ }, 1);
        bump(&self.qp.counters.bytes, len);
    }

    /// Fetch (as far as allowed) and run the WQE at `ci`.
    // Out of line: inlined into `run` it costs every call the set-up of its copy loop.
    #[inline(never)]
    fn step(&mut self, f: &mut Fetcher, limit: u64) -> Step {
        let ci = self.ci;
        f.fetch_current(ci);
        let bbs = bbs_for_ds(f.block(ci)[off::DS]) as u64;
        if ci + bbs > limit {
            return Step::Blocked;
        }
        f.fetch_ahead(ci, ci + bbs, limit);
        for i in 0..bbs {
            let at = idx(i) * BB_SIZE;
            self.wqe[at..at + BB_SIZE].copy_from_slice(f.block(ci + i));
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
        if !self.late.is_empty() && (fenced(w) || opcode == Opcode::Wait) {
            self.land();
        }
        let w = &self.wqe;
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
            if let Err(t) = self.limiter.admit(bytes, SystemClock) {
                if self.delayed_at != ci {
                    self.delayed_at = ci;
                    bump(&self.qp.counters.rate_limit_delays, 1);
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
                self.qp.count_wqes(opcode_byte, 1);
                if bytes != 0 {
                    bump(&self.qp.counters.bytes, bytes);
                }
                if WqeFlags(flags).signaled() {
                    let byte_cnt = match opcode {
                        // At most MAX_MESSAGE (16 MiB).
                        Opcode::RdmaRead => small32(idx(bytes)),
                        o if o.is_atomic() => 8,
                        _ => 0,
                    };
                    self.complete(ci, bbs, opcode_byte, byte_cnt);
                }
                Step::Done(bbs)
            }
            Err(Fail::NotReady) => {
                bump(&self.qp.counters.rnr_waits, 1);
                if !self.late.is_empty() {
                    // Stopped until a receive is posted (see `late`).
                    self.land();
                }
                Step::Blocked
            }
            Err(Fail::Syndrome(s)) => Step::Fault(s, bbs),
        }
    }

    /// Completion for the WQE of `bbs` BBs at `ci`.
    // Out of line: the fast path completes in four places, and one call keeps its loop small.
    #[inline(never)]
    fn complete(&mut self, ci: u64, bbs: u64, opcode: u8, byte_cnt: u32) {
        if !self.late.is_empty() {
            self.land();
        }
        self.complete_landed(ci, bbs, opcode, byte_cnt);
    }

    /// [`Self::complete`] where nothing can be late (`late` is empty).
    #[inline(always)]
    fn complete_landed(&self, ci: u64, bbs: u64, opcode: u8, byte_cnt: u32) {
        debug_assert!(self.late.is_empty());
        // WQEs are counted as they run, so whoever sees the completion sees the WQE counted;
        // `retire` frees its ring space first (a host reuses completed WQEs' slots at once).
        self.qp
            .retire(ci, ci + bbs, CqeOpcode::Req, opcode, byte_cnt, 0);
    }

    /// Land every late response (see [`Core::late`]), oldest first.
    #[cold]
    #[inline(never)]
    fn land(&mut self) {
        let mut late = std::mem::take(&mut self.late);
        for (lkey, addr, data) in late.drain(..) {
            self.write_local_at(lkey, addr, &data);
        }
        self.late = late;
    }

    /// At the end of a visit: land what is late if the queue stopped with nothing more
    /// enabled or posted (a visit that ended on its budget goes on in the next one).
    #[inline(always)]
    fn land_at_visit_end(&mut self) {
        if !self.late.is_empty() && self.ci >= self.limit() {
            self.land();
        }
    }

    /// Land late responses before a WQE whose control segment is `w` runs, if it is fenced
    /// or a WAIT (see [`Core::late`]).
    #[inline(always)]
    fn land_before(&mut self, w: &[u8]) {
        if !self.late.is_empty() && (fenced(w) || w[off::OPCODE] == OP_WAIT) {
            self.land();
        }
    }

    /// Gather the payload described by data (or inline) segments `from..ds` into `scratch`.
    fn gather(&mut self, from: usize, ds: usize) -> Result<usize, Fail> {
        let w = &self.wqe;
        if from < ds && Be32::read(w, from * SEG_SIZE).get() & INLINE_FLAG != 0 {
            let len = (Be32::read(w, from * SEG_SIZE).get() & !INLINE_FLAG) as usize;
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
        if self.scratch.len() < idx(total) {
            self.scratch.resize(idx(total), 0);
        }
        let mut at = 0usize;
        for s in from..ds {
            let seg = s * SEG_SIZE;
            let len = Be32::read(w, seg + off::SEG_BYTE_COUNT).get() as usize;
            if len == 0 {
                continue;
            }
            let lkey = Be32::read(w, seg + off::SEG_LKEY).get();
            let addr = VirtAddr(Be64::read(w, seg + off::SEG_ADDR).get());
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
        let imm = (opcode == Opcode::RdmaWriteImm).then(|| Be32::read(&self.wqe, off::IMM).get());
        if ds == 3 && Be32::read(&self.wqe, 2 * SEG_SIZE).get() & INLINE_FLAG == 0 {
            // One data segment: copy region to region, no staging.
            let seg = 2 * SEG_SIZE;
            let len = u64::from(Be32::read(&self.wqe, seg + off::SEG_BYTE_COUNT).get());
            let lkey = Be32::read(&self.wqe, seg + off::SEG_LKEY).get();
            let addr = VirtAddr(Be64::read(&self.wqe, seg + off::SEG_ADDR).get());
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
        let imm = (opcode == Opcode::SendImm).then(|| Be32::read(&self.wqe, off::IMM).get());
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
        let lkey = Be32::read(w, seg + off::SEG_LKEY).get();
        let addr = VirtAddr(Be64::read(w, seg + off::SEG_ADDR).get());
        self.local_keys
            .get(&self.nic.keys, lkey)
            .and_then(|r| r.check(self.qp.pd, addr, len, Access::LOCAL_WRITE))
            .map(|_| ())
            .map_err(|_| Fail::Syndrome(Syndrome::LocalProtection))
    }

    fn write_local(&mut self, seg: usize, data: &[u8]) {
        let w = &self.wqe;
        let lkey = Be32::read(w, seg + off::SEG_LKEY).get();
        let addr = VirtAddr(Be64::read(w, seg + off::SEG_ADDR).get());
        self.write_local_at(lkey, addr, data);
    }

    /// Write `data` at `addr` through `lkey` (already checked for local write).
    fn write_local_at(&mut self, lkey: u32, addr: VirtAddr, data: &[u8]) {
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
        if ds == 3 && !self.late_landing {
            // One scatter entry: copy region to region, no staging.
            let seg = 2 * SEG_SIZE;
            let lkey = Be32::read(&self.wqe, seg + off::SEG_LKEY).get();
            let addr = VirtAddr(Be64::read(&self.wqe, seg + off::SEG_ADDR).get());
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
            let len = u64::from(Be32::read(&self.wqe, s * SEG_SIZE).get());
            if len != 0 {
                self.check_local_write(s * SEG_SIZE, len)?;
            }
        }
        let total = idx(total);
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
        if self.late_landing {
            // Lands later (see `Core::late`), entry by entry as checked above.
            for s in 2..ds {
                let seg = s * SEG_SIZE;
                let len = Be32::read(&self.wqe, seg).get() as usize;
                if len != 0 {
                    let lkey = Be32::read(&self.wqe, seg + off::SEG_LKEY).get();
                    let addr = VirtAddr(Be64::read(&self.wqe, seg + off::SEG_ADDR).get());
                    self.late
                        .push((lkey, addr, self.scratch[at..at + len].to_vec()));
                    at += len;
                }
            }
            return Ok(total as u64);
        }
        let data = std::mem::take(&mut self.scratch);
        let mut s = 2;
        while s < ds {
            let seg = s * SEG_SIZE;
            let len = Be32::read(&self.wqe, seg).get() as usize;
            let run = if len == 1 {
                self.reversed_run(s, ds)
            } else {
                1
            };
            if run > 1 {
                // One-byte entries at descending addresses under one key (RedN's
                // byte-reversing READ, `Builder::advance_count`): each byte was checked
                // above, so the window they cover together is inside the same region; one
                // write of the reversed bytes instead of a read-modify-write per byte.
                let mut rev = [0u8; MAX_DS as usize];
                for (k, b) in data[at..at + run].iter().enumerate() {
                    rev[run - 1 - k] = *b;
                }
                let lkey = Be32::read(&self.wqe, seg + off::SEG_LKEY).get();
                let last = Be64::read(&self.wqe, seg + off::SEG_ADDR).get() - (run as u64 - 1);
                self.write_local_at(lkey, VirtAddr(last), &rev[..run]);
            } else if len != 0 {
                self.write_local(seg, &data[at..at + len]);
            }
            at += if run > 1 { run } else { len };
            s += run;
        }
        self.scratch = data;
        Ok(total as u64)
    }

    /// How many data segments from `s` on (of `ds`) are one-byte entries under the same key
    /// at descending consecutive addresses (at least 1: the one at `s`, itself one byte).
    fn reversed_run(&self, s: usize, ds: usize) -> usize {
        let w = &self.wqe;
        let seg = |i: usize| {
            let at = i * SEG_SIZE;
            (
                Be32::read(w, at).get(),
                Be32::read(w, at + off::SEG_LKEY).get(),
                Be64::read(w, at + off::SEG_ADDR).get(),
            )
        };
        let (_, lkey, addr) = seg(s);
        let mut n = 1;
        while s + n < ds && seg(s + n) == (1, lkey, addr.wrapping_sub(n as u64)) && addr >= n as u64
        {
            n += 1;
        }
        n
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
            let reply = atomic_reply(&self.qp, old);
            if self.late_landing {
                // Lands later (see `Core::late`).
                let lkey = Be32::read(&self.wqe, seg + off::SEG_LKEY).get();
                let addr = VirtAddr(Be64::read(&self.wqe, seg + off::SEG_ADDR).get());
                self.late.push((lkey, addr, reply.to_vec()));
            } else {
                self.write_local(seg, &reply);
            }
        }
        Ok(8)
    }

    /// True if the WAIT is satisfied.
    fn op_wait(&mut self, ci: u64) -> Result<bool, Fail> {
        let cqn = Cqn(Be32::read(&self.wqe, off::WAIT_OBJ).get());
        let pi = Be32::read(&self.wqe, off::WAIT_PI).get();
        self.wait(ci, cqn, pi)
    }

    /// WAIT(cqn, pi) at `ci`: true if the CQ has produced more than `pi` completions; if not,
    /// registers this PU to be told of the next one and counts the stall (once per WQE).
    #[inline(always)]
    fn wait(&mut self, ci: u64, cqn: Cqn, pi: u32) -> Result<bool, Fail> {
        let pu = self.qp.pu;
        let (cq_index, cq) = self
            .objs
            .cq(&self.nic, cqn)
            .ok_or(Fail::Syndrome(Syndrome::LocalQpOperation))?;
        if wait_passed(cq.produced(), pi) {
            return Ok(true);
        }
        cq.add_waiter(pu);
        if wait_passed(cq.produced(), pi) {
            return Ok(true);
        }
        if self.stalled_at != ci {
            self.stalled_at = ci;
            bump(&self.qp.counters.wait_stalls, 1);
        } else {
            // Found blocked here a second time: likely to stay so (an idle client, not a
            // chain step that the next round finds done), so park on it.
            self.parked = Some(Parked {
                ci,
                cq_index,
                cqn,
                count: pi,
            });
        }
        Ok(false)
    }

    fn op_enable(&mut self, opcode: Opcode) -> Result<u64, Fail> {
        let target = Qpn(Be32::read(&self.wqe, off::WAIT_OBJ).get() & MAX_QPN);
        let pi = Be32::read(&self.wqe, off::WAIT_PI).get();
        let r = self.enable(opcode == Opcode::SendEn, target, pi);
        // The general path does not hand over: the queue runs in the PU's next round.
        self.enabled_here = None;
        r
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
            let here = t.pu == self.qp.pu && Arc::ptr_eq(&t.pus, &self.qp.pus);
            if t.enabled.advance(pi, here) {
                if here {
                    // This PU: no notice needed, and the fast path may hand over to it.
                    self.enabled_here = Some((t.qpn, t.send_cq.cqn));
                } else {
                    t.pus.notify_from(t.pu, &self.qp.pus, self.qp.pu);
                }
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
    fn fault(&mut self, f: &mut Fetcher, syndrome: Syndrome, bbs: u64) {
        if !self.late.is_empty() {
            self.land();
        }
        let ci = self.ci;
        // Counted first: whoever sees the error completion or state sees the error counted.
        bump(&self.qp.counters.errors, 1);
        self.qp.retire(
            ci,
            ci + bbs,
            CqeOpcode::ReqErr,
            self.wqe[off::OPCODE],
            0,
            syndrome as u8,
        );
        self.ci += bbs;
        self.qp.enter_error();
        self.flush(f);
    }

    /// In the error state: complete every outstanding WQE with a flush error. True if any.
    fn flush(&mut self, f: &mut Fetcher) -> bool {
        if !self.late.is_empty() {
            self.land();
        }
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
            self.qp.retire(
                ci,
                self.ci,
                CqeOpcode::ReqErr,
                ctrl[off::OPCODE],
                0,
                Syndrome::WrFlush as u8,
            );
            any = true;
        }
        f.fetched = self.ci;
        any
    }
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
        addr: VirtAddr(Be64::read(w, off::RADDR).get()),
        rkey: Rkey(Be32::read(w, off::RKEY).get()),
    }
}

/// The atomic a WQE asks for (operands big-endian at mlx5's offsets) and the data segment
/// that receives the old value, if `ds` reaches it.
#[inline]
fn atomic_of(w: &[u8], opcode: Opcode) -> (AtomicOp, usize) {
    match opcode {
        Opcode::AtomicCs => (
            AtomicOp::CompareSwap {
                swap: Be64::read(w, off::SWAP_ADD).get(),
                compare: Be64::read(w, off::COMPARE).get(),
            },
            3,
        ),
        Opcode::AtomicFa => (
            AtomicOp::FetchAdd {
                add: Be64::read(w, off::SWAP_ADD).get(),
            },
            3,
        ),
        Opcode::AtomicMaskedCs => (
            AtomicOp::MaskedCompareSwap {
                swap: Be64::read(w, 32).get(),
                compare: Be64::read(w, 40).get(),
                swap_mask: Be64::read(w, 48).get(),
                compare_mask: Be64::read(w, 56).get(),
            },
            4,
        ),
        _ => (
            AtomicOp::MaskedFetchAdd {
                add: Be64::read(w, 32).get(),
                field_boundary: Be64::read(w, 40).get(),
            },
            3,
        ),
    }
}

/// The bytes an atomic's old value lands as on queue `qp`: host order (little-endian), as
/// upstream Linux configures ConnectX, or big-endian on a QP created with
/// `QpConfig::atomic_be_reply` (MLNX_OFED's per-QP option).
#[inline(always)]
fn atomic_reply(qp: &QpShared, old: u64) -> [u8; 8] {
    if qp.atomic_be_reply {
        old.to_be_bytes()
    } else {
        old.to_le_bytes()
    }
}

/// Sum of the byte counts of data segments `from..ds` (or the inline length).
fn payload_len(w: &[u8], from: usize, ds: usize) -> u64 {
    if from < ds && Be32::read(w, from * SEG_SIZE).get() & INLINE_FLAG != 0 {
        return u64::from(Be32::read(w, from * SEG_SIZE).get() & !INLINE_FLAG);
    }
    (from..ds)
        .map(|s| u64::from(Be32::read(w, s * SEG_SIZE).get()))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

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
