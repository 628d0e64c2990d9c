//! The hot path: `run_hot` re-runs slots whose bytes are unchanged since the fast path ran
//! them as an unsignaled NOP, or as an unsignaled one-segment WRITE or READ whose windows it
//! resolved (recycled rings, re-posted requests), without decoding or checking them again.
//!
//! Invariants: a slot is hot only with WQE checks off and only while its snapshot holds the
//! bytes it was derived from (`fetch`); a resolved move is replayed only while both key
//! caches' epochs and the target's liveness are what they were when it was resolved (a
//! region's PD, bounds and rights cannot change while it stays registered).

use super::*;

/// Prefetch slot `index` for [`run_hot`]: if its snapshot is hot and the ring still holds the
/// same WQE, keep the snapshot as it is; otherwise fetch it as [`fetch_into`] does. The same
/// WQE means the same bytes (but the index, as `decisive0` says) in the words its segments
/// occupy: two for a NOP (its segments, if any, do nothing), six for a WRITE or READ (three
/// segments); ConnectX reads a WQE's `ds` segments, nothing past them, so bytes past them
/// cannot change what runs.
#[inline(always)]
pub(super) fn prefetch_hot(ring: &[AtomicU64], geo: Geometry, snap: &mut Snaps, index: u64) {
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
pub(super) fn same_words<const N: usize>(
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

pub(super) const HOT_NONE: u8 = 0;
pub(super) const HOT_NOP: u8 = 1;
pub(super) const HOT_WRITE: u8 = 2;
pub(super) const HOT_READ: u8 = 3;

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
pub(super) fn run_hot(
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
                if !e.mv.holds(local_epoch, remote_epoch)
                    || !local.is_current(table)
                    || !peer.still_current(remote)
                {
                    break;
                }
                let Some((l, r)) = e.mv.buffers(local, remote) else {
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
                n[3] += e.mv.len as u64;
            }
            _ => break,
        }
        ci += 1;
    }
    *fetched = at;
    (ci, n)
}

impl Core {
    /// Count what `run_hot` ran: NOPs, WRITEs, READs and payload bytes.
    #[inline]
    pub(super) fn add_fast_counts(&mut self, n: [u64; 4]) {
        for (op, n) in [OP_NOP, OP_WRITE, OP_READ].into_iter().zip(n) {
            if n != 0 {
                self.qp.count_wqes(op, n);
            }
        }
        if n[3] != 0 {
            bump(&self.qp.counters.bytes, n[3]);
        }
    }
}
