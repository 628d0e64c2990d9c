//! Timing the native baselines: the CPU doing what the softnic does, on the same buffers.

use crate::stats::{ns, stats, Stats};
use redn_sys::conv::idx;
use redn_sys::mem::SharedBuffer;
use redn_sys::softnic::{allowed_cpus, pin_calling_thread};
use std::hint::black_box;
use std::sync::Barrier;
use std::time::Instant;

/// Per-call ns of `f`, each sample the mean over a batch of `batch` calls; `warm` calls first,
/// untimed.
pub fn mean_ns_samples<T>(
    samples: usize,
    batch: usize,
    warm: usize,
    mut f: impl FnMut() -> T,
) -> Vec<f64> {
    for _ in 0..warm {
        black_box(f());
    }
    let mut v = Vec::with_capacity(samples);
    for _ in 0..samples {
        let t0 = Instant::now();
        for _ in 0..batch {
            black_box(f());
        }
        v.push(ns(t0.elapsed()) / batch as f64);
    }
    v
}

/// `f(0)`, ..., `f(threads - 1)`, each on a thread of its own, released together by a
/// barrier; the results in order (`Err` where the thread panicked). Thread `i` runs on the
/// `i`-th CPU this process may use (taken again from the first past the last): a baseline is
/// what the machine does with its threads well placed. Unpinned, threads started together
/// often share one CPU for the first milliseconds while another idles, and a two-thread
/// run of a few milliseconds then measured 0.7-2.2× a one-thread run.
pub fn on_threads<R: Send>(
    threads: usize,
    f: impl Fn(usize) -> R + Sync,
) -> Vec<std::thread::Result<R>> {
    let cpus = allowed_cpus().unwrap_or_default();
    let barrier = Barrier::new(threads);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|i| {
                let (b, f, cpus) = (&barrier, &f, &cpus);
                s.spawn(move || {
                    if let Some(&cpu) = cpus.get(i % cpus.len().max(1)) {
                        // A CPU the process may use: pinning only fails if it went offline,
                        // and then the thread runs where the kernel puts it.
                        let _ = pin_calling_thread(cpu);
                    }
                    b.wait();
                    f(i)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join()).collect()
    })
}

/// Round trip of one 8-byte message between two CPU threads through a SharedBuffer: the floor
/// for any "post, let another thread execute, see the completion" latency.
pub fn cross_thread_rtt(samples: usize) -> Stats {
    let buf = SharedBuffer::new(256);
    let mut v = Vec::with_capacity(samples);
    std::thread::scope(|s| {
        let b = &buf;
        s.spawn(move || {
            let mut last = 0;
            loop {
                let x = b.load_u64(0);
                if x == u64::MAX {
                    return;
                }
                if x != last {
                    b.store_u64(128, x);
                    last = x;
                }
                std::hint::spin_loop();
            }
        });
        for i in 1..=(samples + samples / 10) as u64 {
            let t0 = Instant::now();
            buf.store_u64(0, i);
            while buf.load_u64(128) != i {
                std::hint::spin_loop();
            }
            let d = ns(t0.elapsed());
            if idx(i) > samples / 10 {
                v.push(d);
            }
        }
        buf.store_u64(0, u64::MAX);
    });
    stats(&v)
}
