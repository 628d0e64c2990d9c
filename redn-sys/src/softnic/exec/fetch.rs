//! Fetch and prefetch: reading WQE basic blocks out of the send ring into per-slot
//! snapshots, which are what runs (the prefetch model: a WQE patched after it was fetched runs
//! as it was fetched). Owns the ring reader (`Fetcher`), its `Geometry`, the `Snapshot`s and
//! their flags (`Snaps`), and the fetch helpers the fast paths share.
//!
//! Two kinds of prefetch live here, and only the first is the NIC's. *Fetching ahead*
//! (`fetch_ahead`, `prefetch_behind`) copies BBs into snapshots before they run: that is
//! the prefetch model, and decides which bytes a WQE runs with. *Warming* (`warm`,
//! `warm_published`) only asks the CPU to bring cache lines closer (a hint: nothing is read
//! or copied, so what runs is unchanged): the ring lines the host wrote on another core and
//! the snapshot lines a fetch will write, some BBs before the fetch. Why: a ConnectX reads
//! WQEs by DMA ahead of execution, but the softnic's fetch is a load that the PU waits for
//! when the line is not in its cache, and each step of a chain reads its next WQE only
//! after the previous one ran, so without hints the misses come one after another. At a
//! chain's start everything it touches is cold (the host just wrote the ring on its core;
//! an idle PU's core may have lost its caches), and `chain_profile`'s completion-to-
//! completion gaps showed a same-PU doorbell step's first steps costing about twice its
//! later ones until the hints below covered the snapshots and CQ entries as well as the
//! ring (see docs/softnic-performance.md, "Warming what a step will touch").
//!
//! Invariants: nothing at or past the doorbell (unmanaged) or enabled index (managed) is
//! fetched; BBs fetched and not yet run never share a snapshot (`SNAPSHOT_SLOTS` is at least
//! the deepest prefetch plus the largest WQE); and what was derived from a snapshot (a
//! resolved move, a hot kind) is dropped when a fetch finds any byte but the WQE index
//! changed, so it is only ever used for the bytes it was derived from.

use super::*;

/// Reads WQEs out of the send ring into prefetch snapshots: the ring's words, where its slot 0
/// starts, the snapshots and how far fetching has got. Kept apart from the rest of
/// [`Core`] so the fast path can hold it while it calls the executor's other methods.
pub(super) struct Fetcher {
    pub(super) ring: Arc<SharedBuffer>,
    /// Snapshots by ring slot (slot modulo `snap.len()` for rings longer than
    /// [`SNAPSHOT_SLOTS`]).
    pub(super) snap: Snaps,
    pub(super) geo: Geometry,
    /// BBs below this have been fetched into `snap`.
    pub(super) fetched: u64,
    /// BBs below this have had their ring line and snapshot warmed ([`warm_published`]).
    pub(super) warmed: u64,
    /// The peer when it is in this process, for the fast path to reach without a dynamic
    /// call. Kept here, beside the snapshots, so the fast path can hold it while it calls
    /// the `Core`'s methods.
    pub(super) direct: Option<Arc<InProcess>>,
}

/// Where the ring's slots and their snapshots are, and how far to prefetch: fixed for the
/// queue's life, copied into registers by the loops that fetch.
#[derive(Clone, Copy)]
pub(super) struct Geometry {
    /// Word index of slot 0 in the ring's buffer; a slot is one BB (8 words).
    pub(super) base: usize,
    /// Words the ring occupies (8 per entry).
    pub(super) ring_words: usize,
    /// Ring entries - 1 (entries are at most `SoftNic::MAX_SQ_BBS`, so this fits 32 bits).
    pub(super) ring_mask: u32,
    /// How many BBs past the current WQE may be fetched early.
    pub(super) depth: u64,
    /// Fetched before a one-BB WQE runs: 1 + `depth`, but never so far that two BBs in flight
    /// share a snapshot (possible only with a prefetch as deep as the ring).
    pub(super) reach: u64,
    /// The bits of a BB's first word that decide what it does: all but the WQE index, unless
    /// WQE checks are on. A fetch that finds only the index changed (a host re-posting the
    /// same request) keeps what was derived from the snapshot.
    pub(super) decisive0: u64,
}

impl Geometry {
    /// The ring's own words in `words`, its buffer's (sliced once per run, so that finding a
    /// slot in it is a mask, a shift and one bound check).
    #[inline(always)]
    pub(super) fn ring<'w>(&self, words: &'w [AtomicU64]) -> &'w [AtomicU64] {
        &words[self.base..self.base + self.ring_words]
    }

    /// Ring slot `index` (absolute) in `ring`, from [`Geometry::ring`].
    #[inline(always)]
    pub(super) fn slot<'w>(&self, ring: &'w [AtomicU64], index: u64) -> &'w [AtomicU64; 8] {
        let at = self.slot_word(index);
        ring[at..at + 8].try_into().expect("eight words")
    }

    /// Where in the ring's words slot `index` (absolute) starts. Masked in 32 bits: the
    /// offset cannot overflow, so [`Geometry::slot`] checks only the end.
    #[inline(always)]
    pub(super) fn slot_word(&self, index: u64) -> usize {
        (low32(index) & self.ring_mask) as usize * 8
    }
}

/// Most snapshots a queue keeps (128 bytes each): rings up to this many BBs have one per slot.
/// At least the deepest prefetch plus the largest WQE, so BBs fetched and not yet run never
/// share a snapshot.
pub(super) const SNAPSHOT_SLOTS: u64 = 16 << 10;
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
pub(super) struct Snapshot {
    pub(super) bytes: [u8; BB_SIZE],
    /// Where the one-BB move these bytes describe turned out to be (nothing for a NOP, or
    /// before the fast path resolved it).
    pub(super) mv: ResolvedMove,
    /// The move is one 8-byte-aligned 64-byte line on both sides (`SharedBuffer::copy_line`).
    pub(super) line: bool,
}

/// Where a WRITE's or READ's two windows turned out to be when its keys were checked: good
/// for the same bytes while [`ResolvedMove::holds`] (a region's PD, bounds and rights cannot
/// change while it stays registered, so the checks would decide exactly as they did).
#[derive(Clone, Copy)]
pub(super) struct ResolvedMove {
    /// `KeyCache::current_epoch` of each side when resolved (0 if nothing was: a NOP, or
    /// never; never `KeyCache::STALE`).
    pub(super) local_epoch: u64,
    pub(super) remote_epoch: u64,
    /// Index of each side's region in its key cache.
    pub(super) local_region: u32,
    pub(super) remote_region: u32,
    /// Byte offset of each window in its region's buffer.
    pub(super) local_off: usize,
    pub(super) remote_off: usize,
    pub(super) len: usize,
}

impl ResolvedMove {
    pub(super) const NONE: ResolvedMove = ResolvedMove {
        local_epoch: 0,
        remote_epoch: 0,
        local_region: 0,
        remote_region: 0,
        local_off: 0,
        remote_off: 0,
        len: 0,
    };

    /// True if the key caches are still at the epochs this was resolved under
    /// (`KeyCache::current_epoch` of the local cache, `InProcess::live_epoch` of the remote
    /// one, read now): no region dropped or replaced since, and the target live.
    #[inline(always)]
    pub(super) fn holds(&self, local_epoch: u64, remote_epoch: u64) -> bool {
        self.local_epoch == local_epoch && self.remote_epoch == remote_epoch
    }

    /// The move's two windows in `l` (local) and `r` (remote), from [`Self::buffers`].
    #[inline(always)]
    pub(super) fn spans<'b>(
        &self,
        l: &'b SharedBuffer,
        r: &'b SharedBuffer,
    ) -> (Span<'b>, Span<'b>) {
        let span = |buffer, off| Span {
            buffer,
            off,
            len: self.len,
        };
        (span(l, self.local_off), span(r, self.remote_off))
    }

    /// The buffers of the move: its regions' entries in the two key caches (there while
    /// [`Self::holds`]).
    #[inline(always)]
    pub(super) fn buffers<'k>(
        &self,
        local: &'k KeyCache,
        remote: &'k KeyCache,
    ) -> Option<(&'k SharedBuffer, &'k SharedBuffer)> {
        let l = local.region_at(self.local_region as usize)?;
        let r = remote.region_at(self.remote_region as usize)?;
        Some((l.buffer(), r.buffer()))
    }
}

impl Snapshot {
    /// Run the move resolved in this snapshot between buffers `l` (local) and `r` (remote),
    /// from [`ResolvedMove::buffers`]: as one line if it is one.
    #[inline(always)]
    pub(super) fn replay_move(&self, l: &SharedBuffer, r: &SharedBuffer, write: bool) {
        let mv = &self.mv;
        if self.line {
            let (lw, rw) = (mv.local_off / 8, mv.remote_off / 8);
            if write {
                r.copy_line(rw, l, lw);
            } else {
                l.copy_line(lw, r, rw);
            }
        } else {
            let (local, far) = mv.spans(l, r);
            if write {
                far.copy_from(&local);
            } else {
                local.copy_from(&far);
            }
        }
    }

    const EMPTY: Snapshot = Snapshot {
        bytes: [0; BB_SIZE],
        mv: ResolvedMove::NONE,
        line: false,
    };
}

/// A queue's snapshots, and beside them a byte of flags for each: what a fetch looks at
/// before it copies a BB, in an array of its own (64 slots a cache line) rather than in the
/// snapshot's second line, which a doorbell step's three fetches then each touched for one
/// byte (measured: 1-2 ns off a doorbell step in interleaved runs of `softnic_bench
/// --detect flag`, with ~11 more instructions; a build that skipped the look altogether,
/// unsound, took 5-10 ns off).
pub(super) struct Snaps {
    pub(super) slots: Box<[Snapshot]>,
    /// Per slot: [`DERIVED`] if something was derived from its bytes (a resolved move, or a
    /// hot kind), so a fetch must compare before it overwrites them (the move's fields are
    /// valid while this and the epochs hold); and, shifted by [`HOT_SHIFT`], `HOT_NOP`,
    /// `HOT_WRITE` or `HOT_READ` once the fast path has run the bytes as an unsignaled NOP,
    /// or as an unsignaled WRITE or READ it resolved, with WQE checks off: then [`run_hot`]
    /// may run them again (a move only while its epochs hold).
    pub(super) flags: Box<[u8]>,
}

/// See [`Snaps::flags`].
pub(super) const DERIVED: u8 = 1;
pub(super) const HOT_SHIFT: u32 = 1;

/// A slot's flags once something was derived from its bytes, of hot kind `hot`.
#[inline(always)]
pub(super) fn derived_flags(hot: u8) -> u8 {
    hot << HOT_SHIFT | DERIVED
}

impl Snaps {
    pub(super) fn new(n: usize) -> Snaps {
        Snaps {
            slots: vec![Snapshot::EMPTY; n].into_boxed_slice(),
            flags: vec![0; n].into_boxed_slice(),
        }
    }

    #[inline(always)]
    pub(super) fn len(&self) -> usize {
        self.slots.len()
    }

    /// Something was derived from slot `i`'s bytes.
    #[inline(always)]
    pub(super) fn derived(&self, i: usize) -> bool {
        self.flags[i] & DERIVED != 0
    }

    /// Slot `i`'s hot kind (`HOT_NONE` if none).
    #[inline(always)]
    pub(super) fn hot(&self, i: usize) -> u8 {
        self.flags[i] >> HOT_SHIFT
    }

    /// Mark slot `i` derived, of hot kind `hot`.
    #[inline(always)]
    pub(super) fn set_derived(&mut self, i: usize, hot: u8) {
        self.flags[i] = derived_flags(hot);
    }

    /// Slot `i`'s snapshot and its flags, borrowed together.
    #[inline(always)]
    pub(super) fn parts(&mut self, i: usize) -> (&mut Snapshot, &mut u8) {
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
    pub(super) fn new(ring: &Ring, depth: u64, wqe_checks: bool) -> Fetcher {
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
            warmed: 0,
            direct: None,
        }
    }

    #[inline(always)]
    pub(super) fn fetch(&mut self, index: u64) {
        fetch_into(
            self.geo.ring(self.ring.words()),
            self.geo,
            &mut self.snap,
            index,
        );
    }

    /// Warm the published BBs from `ci` up to [`WARM_AHEAD`] past it (not past `limit`) that
    /// are not warm yet ([`warm_published`]): at the start of a visit, so that the lines the
    /// visit will read and write are on their way before its fetches wait for them.
    #[inline(always)]
    pub(super) fn warm_ahead(&mut self, ci: u64, limit: u64) {
        let words = self.geo.ring(self.ring.words());
        let to = limit.min(ci + WARM_AHEAD);
        warm_published(words, &self.geo, &self.snap, &mut self.warmed, ci, to);
    }

    /// Fetch the BB at `ci` if it is not yet.
    #[inline(always)]
    pub(super) fn fetch_current(&mut self, ci: u64) {
        if self.fetched <= ci {
            self.fetch(ci);
            self.fetched = ci + 1;
        }
    }

    /// Fetch through `end` and prefetch up to `depth` BBs past it, not past `limit` and not
    /// so far that two BBs in flight share a snapshot (possible only with a prefetch as
    /// deep as the ring).
    #[inline(always)]
    pub(super) fn fetch_ahead(&mut self, ci: u64, end: u64, limit: u64) {
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
    pub(super) fn block(&self, index: u64) -> &[u8; BB_SIZE] {
        &self.snap[idx(index) & (self.snap.len() - 1)].bytes
    }
}

/// Snapshot slot `index` of `ring` (the ring's words, [`Geometry::ring`]) into its place in
/// `snap`: eight atomic loads (the host and RDMA operations may write the ring meanwhile),
/// eight stores. If something was derived from the old snapshot, each word is also compared
/// with it, and what was derived is dropped if they differ in more than `decisive0` masks.
#[inline(always)]
pub(super) fn fetch_into(ring: &[AtomicU64], geo: Geometry, snap: &mut Snaps, index: u64) {
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

/// Ask the CPU to bring a ring slot's cache line closer (see the module comment: a hint,
/// so a slot past the doorbell or enabled index may be hinted). A managed queue's next
/// WQEs are past its enabled index until a SEND_EN reaches them, so they are hinted this
/// way, some BBs ahead of where the queue stopped: in a chain they were written by the host
/// before anything enabled them.
///
/// Slot `index` of `ring` ([`Geometry::ring`]) is found as [`Geometry::slot`] finds it, but
/// without its bound check: a hint needs an address, not a reference, and one that was out
/// of bounds would still be harmless (it cannot be: the mask keeps it inside the ring).
#[inline(always)]
pub(super) fn warm(ring: &[AtomicU64], geo: &Geometry, index: u64) {
    prefetch_line(ring.as_ptr().wrapping_add(geo.slot_word(index)));
}

/// Warm ring slots `from..to` that are not warm yet (`warmed` is how far warming got;
/// moved to where this stopped), each with the snapshot its fetch will write (a write to a line that is
/// not in the cache waits for it as a read does, once the store buffer is full). For
/// published BBs only (the caller's `to` is at most the doorbell or enabled index), so a
/// slot is warmed once the host has written it, not before: a hint taken before the host
/// writes the line would bring in a copy that the write then takes away again.
#[inline(always)]
pub(super) fn warm_published(
    ring: &[AtomicU64],
    geo: &Geometry,
    snap: &Snaps,
    warmed: &mut u64,
    from: u64,
    to: u64,
) {
    let mask = snap.len() - 1;
    let mut i = from.max(*warmed);
    while i < to {
        warm(ring, geo, i);
        prefetch_line(snap.slots.as_ptr().wrapping_add(idx(i) & mask));
        i += 1;
    }
    *warmed = i;
}

/// What a managed queue's next enable will have it touch, hinted some BBs ahead of where it
/// stopped ([`WARM_ENABLED`]): the ring slot of BB `index` ([`warm`]), the snapshot its fetch
/// will write, and its wr_id, which the completion reads (`QpShared::retire`; the host
/// wrote it, eight to a line, when it posted). For a queue another PU enables: each
/// enable's visit then finds these lines in its cache instead of waiting for each in turn
/// inside the hand-off, where the snapshot's store held up the CQ lock's locked
/// instruction that follows it (see docs/softnic-performance.md, "Counting a hand-off's
/// line transfers").
#[inline(always)]
pub(super) fn warm_enabled(
    ring: &[AtomicU64],
    geo: &Geometry,
    snap: &Snaps,
    wr_ids: &[AtomicU64],
    index: u64,
) {
    warm_enabled_nop(ring, geo, wr_ids, index);
    prefetch_line(
        snap.slots
            .as_ptr()
            .wrapping_add(idx(index) & (snap.len() - 1)),
    );
}

/// [`warm_enabled`] for a queue whose enabled WQEs are run by the signaled-NOP step
/// (`SqExec::run_enabled_nop`, `SqExec::run_lone_nop`), which writes no snapshot: the
/// ring slot and the wr_id only.
#[inline(always)]
pub(super) fn warm_enabled_nop(
    ring: &[AtomicU64],
    geo: &Geometry,
    wr_ids: &[AtomicU64],
    index: u64,
) {
    warm(ring, geo, index);
    prefetch_line(
        wr_ids
            .as_ptr()
            .wrapping_add(idx(index) & (wr_ids.len() - 1)),
    );
}

/// How many BBs past the running WQE a queue's published ring slots and their snapshots
/// are warmed ([`warm_published`]): when a visit starts, and by a doorbell step's master
/// as it goes.
pub(super) const WARM_AHEAD: u64 = 32;
/// How many BBs past where a managed queue stopped its next ring slots are hinted
/// ([`warm`]): when it stops, and by a doorbell step before it runs the queue.
pub(super) const WARM_ENABLED: u64 = 8;

/// The fast path's fetch of the WQE at `ci`: the BB there if it is not fetched yet, then
/// prefetched up to `geo.reach` past it but not past `limit`, exactly as
/// `Fetcher::fetch_ahead` does for `step`. Returns the BB's snapshot slot, or None if the
/// WQE there takes more than one BB (left to `step`, having fetched only its first BB).
#[inline(always)]
pub(super) fn fetch_one_bb(
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
pub(super) fn fetch_at(
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
pub(super) fn prefetch_behind(
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
