//! The header's environment and timing floors: what `Instant::now()` costs, and what a
//! cross-PU hand-off adds to the cross-thread round trip ([`handoff_anatomy`]).

use redn_bench::stats::{ns, stats, Stats};
use std::hint::black_box;
use std::time::Instant;

pub(crate) fn instant_overhead_ns() -> f64 {
    let n = 100_000;
    let t0 = Instant::now();
    for _ in 0..n {
        black_box(Instant::now());
    }
    ns(t0.elapsed()) / f64::from(n)
}

/// How one side of a hand-off tells the other, in [`handoff_anatomy`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum Notice {
    /// Nothing: the other side finds the work by reading the word that carries it (the floor).
    None,
    /// The softnic's wake-up before this session: a locked add on the target's event word,
    /// which the target loads every round, and a read of its park flag; both sides' words
    /// on one cache line, as two PUs' were.
    EventWord,
    /// Now: a fence, and a read of the target's park flag, on a line of its own that an awake
    /// target never writes.
    ParkFlag,
}

/// A cache line of its own, for [`handoff_anatomy`]'s words.
#[repr(align(64))]
#[derive(Default)]
struct Line<T>(T);

/// Round trips between two spinning threads, with each hand-off also giving one of the
/// [`Notice`]s; the three interleaved in blocks, so the machine's phases hit them alike.
/// What a cross-PU hand-off adds to the cross-thread floor, without the rest of the softnic.
pub(crate) fn handoff_anatomy(samples: usize) -> [Stats; 3] {
    use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering::*};
    let kinds = [Notice::None, Notice::EventWord, Notice::ParkFlag];
    let mut v: [Vec<f64>; 3] = Default::default();
    let blocks = 10;
    for b in 0..blocks * kinds.len() {
        let (k, kind) = (b % kinds.len(), kinds[b % kinds.len()]);
        let ping = Line(AtomicU64::new(0));
        let pong = Line(AtomicU64::new(0));
        // Event words of the two sides, side by side, as two PUs' were.
        let events = Line([AtomicU64::new(0), AtomicU64::new(0)]);
        let sleeping: [Line<AtomicBool>; 2] = Default::default();
        // The notifier's half; the target's is its load of its event word each round.
        let notice = |to: usize| match kind {
            Notice::None => {}
            Notice::EventWord => {
                events.0[to].fetch_add(1, SeqCst);
                black_box(sleeping[to].0.load(SeqCst));
            }
            Notice::ParkFlag => {
                fence(SeqCst);
                black_box(sleeping[to].0.load(Relaxed));
            }
        };
        let round = |me: usize| {
            if kind == Notice::EventWord {
                black_box(events.0[me].load(SeqCst));
            }
            std::hint::spin_loop();
        };
        let n = samples.div_ceil(blocks) + 20;
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut last = 0;
                loop {
                    let x = ping.0.load(Acquire);
                    if x == u64::MAX {
                        return;
                    }
                    if x != last {
                        pong.0.store(x, Release);
                        notice(0);
                        last = x;
                    }
                    round(1);
                }
            });
            for i in 1..=n as u64 {
                let t0 = Instant::now();
                ping.0.store(i, Release);
                notice(1);
                while pong.0.load(Acquire) != i {
                    round(0);
                }
                if i > 20 {
                    v[k].push(ns(t0.elapsed()));
                }
            }
            ping.0.store(u64::MAX, Release);
        });
    }
    v.map(|x| stats(&x))
}
